#!/usr/bin/env bash
# shellcheck disable=SC2317 # the wait conditions are called through gn_wait_until
# Billing disputes end to end (issue 7), with real daemons over real
# sockets, for the two findings test_billing.sh leaves to unit tests:
#  1. a renter that disconnects (kill -9, not restarted) stops being
#     metered within the grace period and its running job is killed; its
#     provider holds a provider-only claim (audit exit 3) and, once the
#     renter is back, the countersigned bill (exit 0);
#  2. a provider that bills more seconds than it gives (its whole process
#     runs at twice the speed under libfaketime, monotonic clock included)
#     has its debit note rejected, the lease stops, the requester rejects
#     the final invoice, and the provider's own export carries that
#     rejection: audit exit 4 (REJECTED), never 0.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
faketime_lib=
for f in /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 /usr/lib/*/faketime/libfaketime.so.1; do
  [ -e "$f" ] && faketime_lib=$f && break
done
if [ -z "$faketime_lib" ]; then
  echo "SKIP: needs libfaketime (Debian package faketime: scripts/deps installs it)"
  exit 77
fi
gn_e2e_setup billing-disputes requester provider
gn_e2e_compat_flags

interval=3 # seconds between debit notes: the provider allows 2..3600 here

lease_field() { # FIELD NODE LEASE
  gn_cli "$2" --json leases | jq -r --arg l "$3" --arg f "$1" '.leases[] | select(.id==$l) | .[$f]'
}
audit_rc() { # FILE: exit code of `gpunet invoice audit FILE`, its output in $audit_out
  set +e
  audit_out=$("$GN_BIN/gpunet" invoice audit "$1" 2>&1)
  local rc=$?
  set -e
  return $rc
}
export_bill() { # NODE LEASE FILE
  gn_cli "$1" invoice export "$2" --out "$3" >/dev/null || fail "cannot export the bill of $2 from $1"
}
no_sanitizer_report() { # NODE: fails if its log holds an ASan/UBSan report (suite's second pass)
  if grep -qE 'AddressSanitizer|LeakSanitizer|runtime error' "$1/gpunetd.log"; then
    fail "sanitizer report in $1/gpunetd.log: $(grep -m 3 -E 'Sanitizer|runtime error' "$1/gpunetd.log")"
  fi
}
ticks_of() { # NODE LEASE: seconds metered in NODE's ledger
  sqlite3 "$1/gpunet.db" "SELECT count(*) FROM ticks WHERE lease_id='$2'"
}

gn_e2e_registry e2e/busybox:1
gn_e2e_start_provider --interval-min-s 2 "${gn_e2e_compat[@]}"
gn_e2e_start_requester
gn_e2e_wait_offer 30

# --- 1. a renter that disconnects stops being metered ------------------------
lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --interval $interval |
  jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent gave no lease: $lease"
accepted() { [ "$(lease_field notes_accepted "$P" "$lease")" -ge "$1" ]; }
gn_wait_until 15 "a debit note accepted" accepted 1 || fail "the requester accepted no debit note"
# A job that would run for an hour (its sleep is this test's own mark).
mark=$((3000 + RANDOM % 600))
job=$(gn_cli "$R" --json run "$lease" --image "$image" -- sleep "$mark" | jq -r .job.id)
job_state() { gn_cli "$P" --json jobs | jq -r --arg j "$job" '.jobs[] | select(.id==$j) | .state'; }
running() { [ "$(job_state)" = running ]; }
gn_wait_until 20 "job $job to run" running || fail "job $job never ran: $(job_state)"
# "running" may come before runc's init has exec'd the job's command.
on_host() { pgrep -fx "sleep $mark" >/dev/null; }
gn_wait_until 10 "the job's process on the host" on_host || fail "the job's process is not on the host"
pid_r=$(cat "$R/gpunetd.pid")
# Killed and reaped in one quiet block (it is this shell's child: bash
# would otherwise report the kill on stderr).
{ kill -9 "$pid_r" && wait "$pid_r"; } 2>/dev/null || true
t0=$(now_ms)
ended() { [ "$(lease_field state "$P" "$lease")" = ended ]; }
gn_wait_until 30 "the provider to stop the lease of a vanished renter" ended ||
  fail "the provider meters on for a renter that is gone"
took=$(($(now_ms) - t0))
# Grace and payment timeout are both two intervals; the 250 ms tick and
# the session's close detection on top.
[ $took -le $((2 * interval * 1000 + 2000)) ] || fail "the vanished renter's lease stopped only after ${took} ms"
reason=$(lease_field ended_reason "$P" "$lease")
ticks=$(ticks_of "$P" "$lease")
sleep 2
[ "$(ticks_of "$P" "$lease")" = "$ticks" ] || fail "the provider meters a lease it stopped"
ok "renter killed: the provider stopped the lease after ${took} ms (grace $((2 * interval)) s): $reason; $ticks seconds metered, none after"
gone() { [ "$(job_state)" != running ] && ! pgrep -fx "sleep $mark" >/dev/null; }
gn_wait_until 10 "the job of the stopped lease to be killed" gone ||
  fail "the job of a stopped lease still runs: $(job_state)"
ok "the stopped lease's job is killed ($(job_state))"
export_bill "$P" "$lease" "$work/gone.json"
rc=0
audit_rc "$work/gone.json" || rc=$?
[ $rc = 3 ] || fail "the bill of a renter that never answered audits with exit $rc: $audit_out"
ok "the provider's bill of the vanished renter is a provider-only claim (audit exit 3)"

gn_node_start "$R" requester --listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:$p_prov"
settled() { [ "$(lease_field invoice_status "$1" "$lease")" = "$2" ]; }
gn_wait_until 30 "the renter back to answer the final invoice" settled "$P" accepted ||
  fail "the restarted renter did not countersign: $(lease_field invoice_status "$P" "$lease")"
export_bill "$P" "$lease" "$work/back.json"
audit_rc "$work/back.json" || fail "audit of the bill countersigned after the restart: $audit_out"
billed=$(jq -r .summary.seconds "$work/back.json")
[ "$billed" = "$ticks" ] || fail "the countersigned bill says $billed seconds, the provider metered $ticks"
ok "back, the renter countersigns the $billed metered seconds: audit exit 0"

# --- 2. a provider that bills more than it gives -----------------------------
gn_node_stop "$P"
no_sanitizer_report "$P"
rm -rf "$P"
# The provider's whole process runs twice as fast (wall and monotonic
# clocks, its timers): it meters two seconds for each one it gives. Only
# gpunetd runs under libfaketime, through a wrapper in GN_BIN's place; the
# shell and the CLI keep the real clock. Under AddressSanitizer libfaketime
# is preloaded ahead of the ASan runtime, which ASan refuses unless told.
fast=$work/fastbin
mkdir -p "$fast"
ln -s "$GN_BIN/gpunet" "$fast/gpunet"
cat >"$fast/gpunetd" <<EOF
#!/bin/sh
export LD_PRELOAD=$faketime_lib FAKETIME="+0 x2"
export ASAN_OPTIONS="\${ASAN_OPTIONS:+\$ASAN_OPTIONS:}verify_asan_link_order=0"
exec "$GN_BIN/gpunetd" "\$@"
EOF
chmod +x "$fast/gpunetd"
GN_BIN=$fast gn_e2e_start_provider --interval-min-s 2 --bootstrap "127.0.0.1:$p_req" "${gn_e2e_compat[@]}"
pid_p=$(gn_cli "$P" --json status | jq -r .node_id)
has_p_offer() { gn_cli "$R" --json offers | jq -e --arg p "$pid_p" '.offers[] | select(.provider==$p)' >/dev/null; }
gn_wait_until 40 "the fast provider's offer" has_p_offer || fail "the fast provider's offer never arrived"
offer=$(gn_cli "$R" --json offers | jq -r --arg p "$pid_p" '[.offers[] | select(.provider==$p)][0].id')
# interval 4 on the provider's clock: a note every 2 real seconds.
lease=$(gn_cli "$R" --json rent "$offer" --hours 1 --allow-simulated --no-attest --interval 4 | jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent from the fast provider gave no lease: $lease"
gn_wait_until 40 "the over-billing provider's lease to stop" ended ||
  fail "the over-billing provider's lease goes on: $(lease_field seconds "$P" "$lease") s metered"
reason=$(lease_field ended_reason "$P" "$lease")
grep -qi "reject" <<<"$reason" || fail "the lease stopped, but not for the rejection: $reason"
ok "the requester rejected a debit note beyond its observation; the provider stopped: $reason"
gn_wait_until 30 "the final invoice to be answered" settled "$P" rejected ||
  fail "the over-billing final invoice was not rejected: $(lease_field invoice_status "$P" "$lease")"
settled "$R" rejected || fail "the requester lists the final invoice as $(lease_field invoice_status "$R" "$lease")"
export_bill "$P" "$lease" "$work/over.json"
rc=0
audit_rc "$work/over.json" || rc=$?
[ $rc = 4 ] || fail "the provider's export of a rejected invoice audits with exit $rc: $audit_out"
grep -q "REJECTED" <<<"$audit_out" || fail "the audit does not say the invoice was rejected: $audit_out"
# The requester's reason, as the audit prints it: "... only N were observed".
observed=$(sed -n 's/.*only \([0-9]*\) were observed.*/\1/p' <<<"$audit_out" | head -n 1)
[ -n "$observed" ] || fail "the audit does not carry the requester's observation: $audit_out"
claimed=$(jq -r .summary.seconds "$work/over.json")
[ "$claimed" -gt $((observed + 5)) ] || fail "the fast provider claims $claimed s, the requester observed $observed s"
vouched=$(lease_field accepted_s "$R" "$lease")
[ "$vouched" -le $((observed + 5)) ] ||
  fail "the requester vouched for $vouched s having observed $observed s (tolerance 5 s)"
ok "the provider claims $claimed s, the requester observed $observed s and vouched for $vouched s; the provider's own export audits exit 4: ${audit_out%%$'\n'*}"
export_bill "$R" "$lease" "$work/over-r.json"
rc=0
audit_rc "$work/over-r.json" || rc=$?
[ $rc = 4 ] || fail "the requester's export of the rejected invoice audits with exit $rc: $audit_out"
ok "the requester's export of the same bill audits exit 4 too"
# The requester's own view of the disputed lease: its observation is what it
# shows as the lease's seconds and cost, the provider's rejected claim only
# apart (claimed_s), and the lease is marked disputed.
r_secs=$(lease_field seconds "$R" "$lease")
r_cost=$(lease_field cost_micro "$R" "$lease")
[ "$(lease_field disputed "$R" "$lease")" = true ] || fail "the requester does not mark the rejected lease disputed"
[ "$(lease_field claimed_s "$R" "$lease")" = "$claimed" ] ||
  fail "the requester's claimed_s $(lease_field claimed_s "$R" "$lease") is not the invoice's $claimed"
[ "$(lease_field claimed_micro "$R" "$lease")" = "$(jq -r .summary.total_micro "$work/over.json")" ] ||
  fail "the requester's claimed_micro is not the invoice's total"
if [ "$r_secs" -lt "$observed" ] || [ "$r_secs" -gt $((observed + 2)) ]; then
  fail "the requester shows $r_secs s for a lease it observed for $observed s (the provider claims $claimed)"
fi
[ "$r_cost" -lt "$(jq -r .summary.total_micro "$work/over.json")" ] ||
  fail "the requester shows the provider's rejected claim as its cost ($r_cost micro)"
gn_cli "$R" leases | grep -F "$lease" | grep -qw disputed || fail "gpunet leases does not show the lease disputed: $(gn_cli "$R" leases)"
[ "$(lease_field disputed "$P" "$lease")" = true ] || fail "the provider does not mark the rejected lease disputed"
ok "the requester shows its own $r_secs s ($r_cost micro) for the disputed lease, the provider's $claimed s as claimed_s; both mark it disputed"
gn_node_stop "$R"
gn_node_stop "$P"
no_sanitizer_report "$R"
no_sanitizer_report "$P"

echo "all $pass billing dispute checks passed"
