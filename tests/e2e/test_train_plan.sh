#!/usr/bin/env bash
# The training planner uses round trips measured between the providers
# (issue 8 item 3; node/peer_rtt.c, docs/protocol.md §2.14), on network-
# namespace hosts (scripts/lib/hosts.sh): "hub" (bootstrap node, registry),
# providers p1..p3 (one simulated RTX 4090 each at 0.50/h) and the requester
# "req". Each host's way out is delayed (tc netem), so RTT(a, b) is about
# delay(a) + delay(b): req 25 ms, p1 and p2 none, p3 40 ms. Through the
# requester p1-p2 would be estimated at >= 50 ms; measured it is ~0.
#
#  - gpunet train --gpus 2 --per-node 1 --json: the plan is p1 and p2, their
#    pair "measured" below 10 ms (worst pair the same); the requester logs
#    that all 3 candidate pairs were measured between the providers;
#  - --gpus 3: the plan holds p3 too, its pairs "measured" at 40..85 ms
#    (an estimate through the requester would be >= 90), p1-p2 still < 10.
# Each group runs `true` on busybox (-f: to its end) and releases its leases.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/hosts.sh"

gn_e2e_need_root_runc
hosts_need docker-registry
command -v tc >/dev/null || {
  echo "SKIP: needs tc (iproute2) to delay the hosts' links"
  exit 77
}
"$GN_BIN/gpunet" train --help >/dev/null 2>&1 || {
  echo "SKIP: gpunet train is not in this build"
  exit 77
}
t0=$(now_ms)
gn_e2e_setup train-plan requester p1 p2 p3 bootstrap
hosts_init 10.250.3
hosts_shape[req]=1gbit:25ms
hosts_shape[p3]=1gbit:40ms
hosts_market 3 1

three_offers() {
  [ "$(gn_cli "$R" --json offers | jq '[.offers[] | select(.training == true) | .provider] | unique | length')" = 3 ]
}
gn_wait_until 40 "training offers from three providers" three_offers ||
  fail "training offers from fewer than three providers reached the requester: $(gn_cli "$R" --json offers)"
declare -A id=() who=()
for p in p1 p2 p3; do
  id[$p]=$(gn_cli "$nodes/$p" id)
  who[${id[$p]}]=$p
done

# plan GPUS: runs a group of GPUS ranks to its end; sets $plan (the plan's
# JSON), $names (its providers as p1..p3, sorted) and $log_line (the
# requester's line about the pairs measured for that group).
plan=""
names=""
log_line=""
plan() {
  local out rc tid
  set +e
  out=$(timeout 120 "$GN_BIN/gpunet" --data-dir "$R" train --gpus "$1" --per-node 1 --image "$image" \
    --allow-simulated --no-attest --hours 1 --json -f -- true 2>"$work/train-$1.err")
  rc=$?
  set -e
  [ $rc = 0 ] || fail "gpunet train --gpus $1 exited $rc: $out $(tail -n 20 "$work/train-$1.err")"
  plan=$(head -n 1 <<<"$out" | jq -c .plan)
  tid=$(head -n 1 <<<"$out" | jq -r .id)
  [ "$(jq -r .nodes <<<"$plan")" = "$1" ] || fail "the plan for $1 GPUs is not on $1 nodes: $plan"
  names=$(jq -r '.providers[].provider' <<<"$plan" | while read -r p; do echo "${who[$p]:-?}"; done | sort | paste -sd ' ')
  log_line=$(grep -o "training $tid: .* candidate pairs measured between the providers" "$R/gpunetd.log" || true)
  gn_wait_until 30 "the leases of the $1-GPU group to end" hosts_no_lease_active ||
    fail "the $1-GPU group left active leases"
}
# pair P Q: "KIND MS" of the pair of providers P and Q in $plan.
pair() {
  jq -r --arg a "${id[$1]}" --arg b "${id[$2]}" '
    ([.providers[].provider] | index($a)) as $i | ([.providers[].provider] | index($b)) as $k |
    "\(.rtt_kind[$i][$k]) \(.rtt_ms[$i][$k])"' <<<"$plan"
}

plan 2
[ "$names" = "p1 p2" ] || fail "a 2-GPU plan took $names, want p1 p2 (the pair with ~0 ms between them): $plan"
read -r kind ms <<<"$(pair p1 p2)"
[ "$kind" = measured ] || fail "the p1-p2 pair is '$kind', want measured: $plan"
[[ $ms =~ ^[0-9]+$ ]] && [ "$ms" -lt 10 ] ||
  fail "the p1-p2 pair is $ms ms, want < 10 (measured between them; through the requester it is >= 50): $plan"
[ "$(jq -r '"\(.worst_kind) \(.worst_rtt_ms)"' <<<"$plan")" = "measured $ms" ] ||
  fail "the worst pair does not say measured $ms ms: $plan"
[[ $log_line == *": 3 of 3 candidate pairs measured between the providers" ]] ||
  fail "the requester does not log 3 of 3 pairs measured: '$log_line'"
p12=$ms
ok "2 GPUs: plan p1 p2, their pair measured at $p12 ms (worst pair the same); requester: '${log_line#training * }'"

# A provider takes one RTT ask per asker per 2 s (docs/protocol.md §2.14,
# refusal "rate"): asked sooner, every pair would be estimated.
sleep 2
plan 3
[ "$names" = "p1 p2 p3" ] || fail "a 3-GPU plan took $names, want p1 p2 p3: $plan"
figs=""
for q in p1 p2; do
  read -r kind ms <<<"$(pair "$q" p3)"
  [ "$kind" = measured ] || fail "the $q-p3 pair is '$kind', want measured: $plan"
  [[ $ms =~ ^[0-9]+$ ]] && [ "$ms" -ge 40 ] && [ "$ms" -lt 85 ] ||
    fail "the $q-p3 pair is $ms ms, want 40..84 (p3's 40 ms delay, measured; through the requester it is >= 90): $plan"
  figs+=" $q-p3 $ms ms"
done
read -r kind ms <<<"$(pair p1 p2)"
[ "$kind" = measured ] && [ "$ms" -lt 10 ] || fail "in the 3-GPU plan the p1-p2 pair is $kind $ms ms: $plan"
[ "$(jq -r .worst_kind <<<"$plan")" = measured ] && [ "$(jq -r .worst_rtt_ms <<<"$plan")" -ge 40 ] ||
  fail "the 3-GPU plan's worst pair is not a measured one with p3: $plan"
[[ $log_line == *": 3 of 3 candidate pairs measured between the providers" ]] ||
  fail "the requester does not log 3 of 3 pairs measured for the 3-GPU group: '$log_line'"
ok "3 GPUs: plan p1 p2 p3, measured:$figs, p1-p2 $ms ms; worst pair $(jq -r .worst_rtt_ms <<<"$plan") ms"
echo "$pass passed, 0 failed ($(($(now_ms) - t0)) ms)"
