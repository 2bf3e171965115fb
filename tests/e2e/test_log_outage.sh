#!/usr/bin/env bash
# A job's output survives a lost session (a real provider and requester,
# a runc job on a busybox image from a loopback registry): the job prints
# 300 numbered lines over about 8 s; part way the TCP connections between
# the two daemons are destroyed (ss -K), so the provider reads output while
# it has no session to the renter. Once the daemons have a session again
# the provider sends what the renter missed from its log, and the job's end
# only after it: the renter's `gpunet logs` has every line once, in order,
# and `gpunet run -f` on a job that ends during an outage prints it whole.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
for t in jq ss; do
  command -v $t >/dev/null || {
    echo "SKIP: needs $t (scripts/deps installs it)"
    exit 77
  }
done
gn_e2e_setup logout requester provider
gn_e2e_registry e2e/busybox:1
gn_e2e_compat_flags
gn_e2e_start_provider "${gn_e2e_compat[@]}"
gn_e2e_start_requester
gn_e2e_wait_offer 30
gn_e2e_rent --no-attest

# Every TCP connection to or from either daemon's listen port.
cut_sessions() {
  local p
  for p in "$p_prov" "$p_req"; do
    ss -K dst "127.0.0.1:$p" >/dev/null 2>&1 || true
    ss -K src "127.0.0.1:$p" >/dev/null 2>&1 || true
  done
}
downs() { grep -c "peer down" "$P/gpunetd.log" || true; }
lines() { gn_cli "$R" logs "$1" 2>/dev/null | grep -c '^line-' || true; }
want=$(seq 0 299 | sed 's/^/line-/')

job=$(gn_cli "$R" --json run "$lease" --image "$image" -- \
  sh -c 'i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); sleep 0.025; done' | jq -r .job.id)
some() { [ "$(lines "$job")" -ge 20 ]; }
gn_wait_until 30 "the first lines at the renter" some || fail "no output of $job reached the renter"
before=$(downs)
cut_sessions
down() { [ "$(downs)" -gt "$before" ]; }
gn_wait_until 10 "the provider losing its session" down || fail "the session did not go down"
at_cut=$(lines "$job")
over() { [ "$(gn_cli "$R" --json jobs | jq -r --arg j "$job" '.jobs[] | select(.id==$j) | .state')" = exited ]; }
gn_wait_until 60 "job $job over at the renter" over || fail "the renter never heard job $job end"
got=$(gn_cli "$R" logs "$job")
[ "$got" = "$want" ] || fail "the renter's log of $job after the outage: $(grep -c '^line-' <<<"$got") lines of 300, first difference: $(diff <(echo "$want") <(echo "$got") | head -3 | tr '\n' ' ')"
[ "$at_cut" -lt 300 ] || fail "the job had printed everything before the cut ($at_cut lines): nothing was tested"
ok "the job's 300 lines reached the renter once each and in order across a lost session (cut after $at_cut)"

# A job that ends while the session is down: `gpunet run -f` gets its whole
# output and its exit code once a session is back.
out=$work/follow.out
(
  set +e
  gn_cli "$R" run "$lease" --image "$image" -f -- sh -c 'sleep 1; seq 1 2000; exit 3' >"$out" 2>"$work/follow.err"
  echo $? >"$work/follow.rc"
) &
follower=$!
started() { grep -q "running" "$P/gpunetd.log" && [ "$(grep -c " running " "$P/gpunetd.log")" -ge 2 ]; }
gn_wait_until 30 "the second job running" started || fail "the second job did not start"
before=$(downs)
cut_sessions
gn_wait_until 10 "the provider losing its session" down || fail "the session did not go down the second time"
wait "$follower" || true
[ "$(cat "$work/follow.rc")" = 3 ] || fail "gpunet run -f ended $(cat "$work/follow.rc") (want 3): $(cat "$work/follow.err")"
# (its first line is the job's id)
[[ $(head -1 "$out") == j-* ]] && tail -n +2 "$out" | cmp -s - <(seq 1 2000) ||
  fail "gpunet run -f printed $(($(wc -l <"$out") - 1)) lines of 2000 across the outage"
ok "gpunet run -f of a job that ends during an outage prints all 2,000 lines and exits 3"
