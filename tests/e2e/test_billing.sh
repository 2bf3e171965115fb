#!/usr/bin/env bash
# shellcheck disable=SC2317 # the wait conditions are called through gn_wait_until
# Billing strangers can trust (issue 7), end to end with real daemons over
# real sockets: debit notes every interval, credit control stopping a lease
# whose requester stops answering (and what the provider then holds), a late
# acceptance that is no lease, and a requester killed and restarted mid-lease
# settling with a provider whose wall clock is minutes off (libfaketime).
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
gn_e2e_setup billing requester provider
gn_e2e_compat_flags

interval=3 # seconds between debit notes: the provider allows 2..3600 here
# The requester's rent gives up after 3 s (instead of 15), for the late
# acceptance below.
export GN_RENT_TIMEOUT_MS=3000

# lease_field FIELD NODE LEASE: a field of a lease as NODE shows it.
lease_field() {
  gn_cli "$2" --json leases | jq -r --arg l "$3" --arg f "$1" '.leases[] | select(.id==$l) | .[$f]'
}
# audit_rc FILE: the exit code of `gpunet invoice audit FILE` (its output in $audit_out).
audit_rc() {
  set +e
  audit_out=$("$GN_BIN/gpunet" invoice audit "$1" 2>&1)
  local rc=$?
  set -e
  return $rc
}
export_bill() { # NODE LEASE FILE
  gn_cli "$1" invoice export "$2" --out "$3" >/dev/null || fail "cannot export the bill of $2 from $1"
}

gn_e2e_start_provider --interval-min-s 2 "${gn_e2e_compat[@]}"
gn_e2e_start_requester
gn_e2e_wait_offer 30

# --- 1. a requester that stops answering debit notes -------------------------
lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --interval $interval |
  jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent gave no lease: $lease"
[ "$(lease_field interval_s "$P" "$lease")" = $interval ] || fail "the agreement does not say interval $interval"
accepted() { [ "$(lease_field notes_accepted "$P" "$lease")" -ge "$1" ]; }
gn_wait_until 15 "two debit notes accepted" accepted 2 || fail "the requester did not accept two debit notes"
[ "$(lease_field state "$R" "$lease")" = active ] || fail "the requester took a debit note for the end of the lease"
[ "$(gn_cli "$R" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .status')" = open ] ||
  fail "the requester lists a debit note as a final invoice"
ok "debit notes every ${interval}s, countersigned by the requester; the lease goes on (a note is no final invoice)"

kill -STOP "$(cat "$R/gpunetd.pid")"
t0=$(now_ms)
ended() { [ "$(lease_field state "$P" "$lease")" = ended ]; }
gn_wait_until 30 "the provider to stop the unpaid lease" ended || fail "the provider metered on for an unpaid lease"
took=$(($(now_ms) - t0))
# The next note is due within one interval, and the lease stops once it has
# stayed unaccepted for two: at most three intervals after the requester
# went silent, plus the timer's granularity.
[ $took -le $((3 * interval * 1000 + 1500)) ] || fail "the unpaid lease stopped only after ${took} ms"
ok "requester silent: the provider stopped the lease after ${took} ms (interval ${interval}s, payment timeout $((2 * interval))s): $(lease_field ended_reason "$P" "$lease")"
ticks=$(sqlite3 "$P/gpunet.db" "SELECT count(*) FROM ticks WHERE lease_id='$lease'")
sleep 2
[ "$(sqlite3 "$P/gpunet.db" "SELECT count(*) FROM ticks WHERE lease_id='$lease'")" = "$ticks" ] ||
  fail "the provider meters a stopped lease"
ok "a stopped lease stops billing ($ticks seconds metered)"

export_bill "$P" "$lease" "$work/unpaid.json"
jq -e '.format == "gpunet-invoice/2" and .invoice != null' "$work/unpaid.json" >/dev/null ||
  fail "the provider's export has no final invoice"
vouchers=$(jq '[.notes[] | select(.response != null)] | length' "$work/unpaid.json")
[ "$vouchers" -ge 2 ] || fail "the provider's export holds $vouchers vouchers"
rc=0
audit_rc "$work/unpaid.json" || rc=$?
[ $rc = 3 ] || fail "audit of a provider-only claim exited $rc: $audit_out"
ok "the provider holds a signed, exportable invoice and $vouchers vouchers; audit exit 3 (provider-only claim)"

kill -CONT "$(cat "$R/gpunetd.pid")"
settled() { [ "$(lease_field invoice_status "$P" "$lease")" = "$1" ]; }
gn_wait_until 30 "the woken requester to answer the invoice" settled accepted ||
  fail "the requester did not countersign the invoice once it woke: $(gn_cli "$P" --json leases)"
export_bill "$P" "$lease" "$work/paid.json"
audit_rc "$work/paid.json" || fail "audit of the countersigned bill: $audit_out"
ok "woken, the requester countersigns the final invoice: audit exit 0"

# --- 2. the requester's limits: --max-price and --max-spend -----------------
for bad in "--max-price 0" "--max-price 1.2345678" "--max-spend -1" "--max-spend lots" "--interval 0"; do
  set +e
  # shellcheck disable=SC2086 # the option and its value are two words
  out=$(gn_cli "$R" rent --gpu "RTX 4090" --hours 1 $bad 2>&1)
  rc=$?
  set -e
  if [ $rc != 2 ] || ! grep -q -- "${bad%% *}" <<<"$out"; then fail "rent $bad: rc $rc: $out"; fi
done
ok "rent refuses a bad --max-price, --max-spend or --interval before asking gpunetd (exit 2, naming the option)"
# The longest lease an agreement holds is 960 h (GN_INVOICE_MAX_S): rent
# says so at once instead of failing at signing.
set +e
out=$(gn_cli "$R" rent --gpu "RTX 4090" --hours 961 --allow-simulated --no-attest 2>&1)
rc=$?
set -e
if [ $rc != 2 ] || ! grep -q -- "--hours: at most 960" <<<"$out"; then fail "rent --hours 961: rc $rc: $out"; fi
ok "rent --hours 961 is refused before asking gpunetd: ${out%%$'\n'*}"
set +e
out=$(gn_cli "$R" rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --max-price 0.40 2>&1)
rc=$?
set -e
if [ $rc = 0 ] || ! grep -q -- "--max-price" <<<"$out"; then fail "rent above --max-price: rc $rc: $out"; fi
ok "rent --max-price 0.40 refuses a 0.50 offer: ${out##*$'\n'}"
# A cap of 0.001 EUR at 0.50 EUR/h is 7.2 s of one GPU: the requester
# releases the lease itself once its observation (plus the tolerance) would
# reach the cap, so the provider's honest final invoice stays within it and
# is paid in full; nothing beyond the cap is ever vouched.
lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --interval $interval \
  --max-spend 0.001 | jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent with --max-spend gave no lease: $lease"
[ "$(lease_field max_spend_micro "$R" "$lease")" = 1000 ] || fail "the lease does not keep its spending cap"
gn_wait_until 30 "the capped lease to stop" ended || fail "a lease at its spending cap goes on"
lease_field ended_reason "$R" "$lease" | grep -q "spending cap" ||
  fail "the requester does not say the spending cap ended the lease: $(lease_field ended_reason "$R" "$lease")"
gn_wait_until 20 "the capped lease's invoice to be answered" settled accepted ||
  fail "the final invoice within the cap was not countersigned: $(lease_field invoice_status "$P" "$lease")"
billed=$(gn_cli "$R" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .total_micro')
[ "$billed" -le 1000 ] || fail "the requester paid $billed micro-EUR past its cap of 1000"
export_bill "$P" "$lease" "$work/capped.json"
audit_rc "$work/capped.json" || fail "audit of the capped lease's bill: $audit_out"
ok "--max-spend: the requester releases the lease at its cap ($(lease_field ended_reason "$R" "$lease")); billed $billed of 1000 micro-EUR, countersigned, audit exit 0"

# --- 3. a late acceptance is no lease ----------------------------------------
free_offer() { gn_cli "$R" --json offers | jq -e '.offers[] | select(.gpus_free > 0)' >/dev/null; }
gn_wait_until 30 "an offer with a free GPU" free_offer || fail "no free GPU offered after the capped lease ended"
before=$(gn_cli "$P" --json leases | jq -c '[.leases[].id]')
kill -STOP "$(cat "$P/gpunetd.pid")"
set +e
out=$(gn_cli "$R" rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --interval $interval 2>&1)
rc=$?
set -e
kill -CONT "$(cat "$P/gpunetd.pid")"
[ $rc -ne 0 ] || fail "rent succeeded with a stopped provider: $out"
new_leases() { gn_cli "$P" --json leases | jq -r --argjson old "$before" '.leases[].id | select(. as $i | $old | index($i) | not)'; }
late() { [ -n "$(new_leases)" ]; }
gn_wait_until 10 "the provider's late acceptance" late || fail "the provider never answered the old request"
late_lease=$(new_leases | head -n 1)
late_ended() { [ "$(lease_field state "$P" "$late_lease")" = ended ]; }
gn_wait_until 10 "the late lease to end" late_ended || fail "the provider's late lease $late_lease goes on"
[ -z "$(lease_field id "$R" "$late_lease")" ] || fail "the requester took a late acceptance as lease $late_lease"
export_bill "$P" "$late_lease" "$work/late.json"
rc=0
audit_rc "$work/late.json" || rc=$?
[ $rc = 3 ] || fail "a late lease's bill audits with exit $rc: $audit_out"
ok "a late acceptance is no lease: the requester releases it, the provider's bill is a provider-only claim (exit 3)"

# --- 4. requester kill -9 and restart, provider's clock minutes off ----------
gn_node_stop "$P"
rm -rf "$P"
interval=5 # grace for the requester's restart: two intervals
# The provider's wall clock runs 4 minutes fast (libfaketime; its monotonic
# clock stays the real one, as on a host whose NTP is off). Ahead, not
# behind: a provider 4 minutes slow would have its 60 s offers dropped as
# expired by every requester before a lease could start. It joins through
# the requester.
# Under AddressSanitizer (the suite's second pass) libfaketime is preloaded
# ahead of the ASan runtime, which ASan refuses unless told not to check.
(
  export LD_PRELOAD=$faketime_lib FAKETIME="+4m" FAKETIME_DONT_FAKE_MONOTONIC=1
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
  gn_e2e_start_provider --interval-min-s 2 --bootstrap "127.0.0.1:$p_req" "${gn_e2e_compat[@]}"
  echo "$p_prov" >"$work/p_prov"
) || fail "the provider with a fast clock did not start"
p_prov=$(cat "$work/p_prov")
pid_p=$(gn_cli "$P" --json status | jq -r .node_id)
has_p_offer() { gn_cli "$R" --json offers | jq -e --arg p "$pid_p" '.offers[] | select(.provider==$p)' >/dev/null; }
gn_wait_until 40 "the fast-clock provider's offer" has_p_offer || fail "the fast-clock provider's offer never arrived"
offer=$(gn_cli "$R" --json offers | jq -r --arg p "$pid_p" '[.offers[] | select(.provider==$p)][0].id')
t_rent=$(date +%s)
lease=$(gn_cli "$R" --json rent "$offer" --hours 1 --allow-simulated --no-attest --interval $interval | jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent from the fast-clock provider gave no lease: $lease"
start_s=$(lease_field start_s "$R" "$lease")
[ $((start_s - t_rent)) -ge 200 ] || fail "the provider's clock is not ahead (start_s $start_s, rent at $t_rent)"
ok "lease from a provider whose clock is $((start_s - t_rent)) s ahead"
accepted() { [ "$(lease_field notes_accepted "$R" "$lease")" -ge "$1" ]; }
gn_wait_until 15 "a debit note accepted" accepted 1 || fail "no debit note accepted from the fast-clock provider"
pid_r=$(cat "$R/gpunetd.pid")
kill -9 "$pid_r"
wait "$pid_r" 2>/dev/null || true # reaped here, quietly (it is this shell's child)
sleep 1
gn_node_start "$R" requester --listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:$p_prov"
[ "$(lease_field state "$R" "$lease")" = active ] || fail "the restarted requester lost lease $lease"
n0=$(lease_field notes_accepted "$R" "$lease")
gn_wait_until 20 "a debit note accepted after the restart" accepted $((n0 + 1)) ||
  fail "the restarted requester accepts no debit note: $(tail -n 5 "$R/gpunetd.log")"
ok "after kill -9 and restart the requester observes from its own receipt time and accepts the next note"
sleep 2
gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
t_end=$(date +%s)
[ "$(lease_field invoice_status "$R" "$lease")" = accepted ] || fail "the final invoice was not countersigned"
wall=$((t_end - t_rent))
export_bill "$R" "$lease" "$work/restart.json"
audit_rc "$work/restart.json" || fail "audit of the settled lease: $audit_out"
export_bill "$P" "$lease" "$work/restart-p.json"
audit_rc "$work/restart-p.json" || fail "audit of the provider's copy: $audit_out"
# The settled figures are the countersigned invoice's: both daemons' vouched
# seconds and amount (accepted_s, accepted_micro) are what it bills, not the
# last debit note before it.
secs=$(jq -r .summary.seconds "$work/restart.json")
micro=$(jq -r .summary.total_micro "$work/restart.json")
[ "$(jq -r .summary.seconds "$work/restart-p.json")" = "$secs" ] || fail "the two copies bill different seconds"
for node in "$R" "$P"; do
  [ "$(lease_field accepted_s "$node" "$lease")" = "$secs" ] ||
    fail "$(basename "$node") shows accepted_s $(lease_field accepted_s "$node" "$lease"), the countersigned invoice bills $secs s"
  [ "$(lease_field accepted_micro "$node" "$lease")" = "$micro" ] ||
    fail "$(basename "$node") shows accepted_micro $(lease_field accepted_micro "$node" "$lease"), the invoice bills $micro"
  [ "$(lease_field seconds "$node" "$lease")" = "$secs" ] || fail "$(basename "$node") shows other seconds than its invoice"
done
if [ "$secs" -lt $((wall - 4)) ] || [ "$secs" -gt $((wall + 2)) ]; then fail "billed $secs s for a lease of ${wall} s"; fi
ok "settled for $secs s of a ${wall} s lease across the restart; both copies audit exit 0"

echo "all $pass billing checks passed"
