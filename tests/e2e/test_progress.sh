#!/usr/bin/env bash
# Progress on long waits (issue 10 item 4), the image pull: a hub whose link
# is shaped to 2 Mbit/s (scripts/lib/hosts.sh) holds the registry, so a
# provider's pull of the busybox image takes seconds. The provider sends the
# pull's bytes in JOB_STATUS at most once a second; `gpunet run -f` shows
# them on stderr while the job waits:
# - stderr not a terminal: plain lines "Pulling image:  NN% X of Y, R/s" and a
#   final "Pulling image: done after ...", no terminal control characters,
#   the job's own output alone on stdout;
# - --json (on a second provider, whose store is empty): every stderr line a
#   JSON event, "pull" progress events with done <= total, bytes, the last a
#   "done" event with done == total; stdout keeps the logs' JSON.
# Other waits: `gpunet rent --gpu MODEL --wait S` for an offer nobody makes
# shows "Waiting for an offer" lines and fails after S seconds with a clear
# error (JSON: a "failed" event); with an offer there it rents. p2's way out
# is delayed 400 ms, so negotiating a lease with it (with attestation) takes
# over a second: `gpunet --json rent` reports "lease" progress events, the
# last "done", and prints the lease on stdout.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/hosts.sh"

gn_e2e_need_root_runc
hosts_need docker-registry
t0=$(now_ms)
gn_e2e_setup progress requester p1 p2 bootstrap
hosts_init
hosts_shape[hub]=2mbit
hosts_shape[p2]=1gbit:400ms
prov_extra_p1=(--price 0.40) # the cheapest: rent --gpu takes p1
hosts_market 2 2

two_offers() { [ "$(gn_cli "$R" --json offers | jq '[.offers[].provider] | unique | length')" = 2 ]; }
gn_wait_until 60 "offers from two providers" two_offers || fail "the requester does not see both providers' offers"
offers=$(gn_cli "$R" --json offers)
# Waiting for an offer nobody makes: plain lines, then a clear failure.
t_w=$(now_ms)
if env -u GN_PROGRESS "$GN_BIN/gpunet" --data-dir "$R" rent --gpu "RTX 9999" --hours 1 --wait 3 \
  >"$work/wait.out" 2>"$work/wait.err"; then
  fail "rent --wait of a model nobody offers succeeded: $(cat "$work/wait.out")"
fi
waited=$(($(now_ms) - t_w))
[ "$waited" -ge 3000 ] || fail "rent --wait 3 gave up after $waited ms"
grep -q '^Waiting for an offer of RTX 9999: ' "$work/wait.err" || fail "no waiting line: $(cat "$work/wait.err")"
grep -q 'no offer of RTX 9999 (1 free GPU, not simulated) reached this node within 3 s' "$work/wait.err" ||
  fail "no clear error: $(cat "$work/wait.err")"
"$GN_BIN/gpunet" --data-dir "$R" --json rent --gpu "RTX 9999" --hours 1 --wait 2 >"$work/waitj.out" 2>"$work/waitj.err" &&
  fail "rent --wait (JSON) of a model nobody offers succeeded"
grep -q '^gpunet: no offer of RTX 9999' "$work/waitj.err" || fail "no error after the events: $(cat "$work/waitj.err")"
grep '^{' "$work/waitj.err" |
  jq -se 'map(select(.what == "offers")) | last | .event == "failed" and (.detail | test("0 that fit"))' >/dev/null ||
  fail "no failed offers event: $(cat "$work/waitj.err")"
ok "rent --wait for an offer nobody makes: progress, gave up after $waited ms with a clear error, JSON failed event"

declare -A lease_of=()
id1=$(gn_cli "$nodes/p1" id)
lease_of[p1]=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --wait 30 2>/dev/null | jq -r .lease.id)
[[ ${lease_of[p1]} == l-* ]] || fail "rent --gpu --wait with offers there gave no lease: ${lease_of[p1]}"
[ "$(gn_cli "$R" --json leases | jq -r --arg l "${lease_of[p1]}" '.leases[] | select(.id == $l) | .peer')" = "$id1" ] ||
  fail "rent --gpu did not take the cheapest offer, p1's"
id2=$(gn_cli "$nodes/p2" id)
offer=$(jq -r --arg p "$id2" '.offers[] | select(.provider == $p) | .id' <<<"$offers" | head -n 1)
"$GN_BIN/gpunet" --data-dir "$R" --json rent "$offer" --hours 1 --allow-simulated >"$work/rent.out" 2>"$work/rent.err" ||
  fail "rent of p2's offer failed: $(cat "$work/rent.err")"
lease_of[p2]=$(jq -r .lease.id "$work/rent.out")
[[ ${lease_of[p2]} == l-* ]] || fail "rent of p2's offer gave no lease: $(cat "$work/rent.out")"
ok "a lease on each provider: p1 ${lease_of[p1]} (rent --gpu --wait, offers there), p2 ${lease_of[p2]}"
# Tab completion's ids (gpunet completion ids): both active leases.
[ "$("$GN_BIN/gpunet" --data-dir "$R" completion ids leases | sort)" = "$(printf '%s\n' "${lease_of[@]}" | sort)" ] ||
  fail "completion ids leases: $("$GN_BIN/gpunet" --data-dir "$R" completion ids leases)"
jq -se 'map(select(.what == "lease")) | (length > 0) and (last | .event == "done" and .elapsed_s >= 1)' \
  "$work/rent.err" >/dev/null || fail "no lease progress events from the slow provider: $(cat "$work/rent.err")"
ok "negotiating with the delayed provider: $(jq -sc 'map(select(.what == "lease")) | last' "$work/rent.err")"

# Plain lines: stderr is a file here, not a terminal.
env -u GN_PROGRESS "$GN_BIN/gpunet" --data-dir "$R" run "${lease_of[p1]}" --image "$image" -f -- echo hello-plain \
  >"$work/plain.out" 2>"$work/plain.err" || fail "the job failed: $(cat "$work/plain.out" "$work/plain.err")"
[ "$(tail -n 1 "$work/plain.out")" = hello-plain ] || fail "the job's output is not on stdout: $(cat "$work/plain.out")"
if grep -q Pulling "$work/plain.out"; then fail "progress on stdout: $(cat "$work/plain.out")"; fi
grep -Eq '^Pulling image: +[0-9]+% [0-9.]+ [KM]iB of [0-9.]+ [KM]iB' "$work/plain.err" ||
  fail "no pull progress line with bytes on stderr: $(cat "$work/plain.err")"
grep -q '^Pulling image: done after ' "$work/plain.err" || fail "no final pull line: $(cat "$work/plain.err")"
if grep -q $'\r\|\033' "$work/plain.err"; then fail "terminal control characters in plain progress"; fi
ok "plain progress: $(grep -c '^Pulling image' "$work/plain.err") lines, e.g. '$(head -n 1 "$work/plain.err")'"

# JSON events, on p2 (its store does not hold the image yet).
"$GN_BIN/gpunet" --data-dir "$R" --json run "${lease_of[p2]}" --image "$image" -f -- echo hello-json \
  >"$work/json.out" 2>"$work/json.err" || fail "the job failed: $(cat "$work/json.out" "$work/json.err")"
jq -e . "$work/json.err" >/dev/null || fail "stderr is not JSON events: $(cat "$work/json.err")"
pulls=$(jq -c 'select(.what == "pull")' "$work/json.err")
[ -n "$pulls" ] || fail "no pull events: $(cat "$work/json.err")"
jq -se 'map(select(.event == "progress" and .unit == "bytes" and .total > 0 and .done <= .total)) | length > 0' \
  <<<"$pulls" >/dev/null || fail "no progress event with bytes: $pulls"
jq -se 'last | .event == "done" and .done == .total' <<<"$pulls" >/dev/null || fail "the last pull event is not done: $pulls"
jq -se 'map(.data // "") | join("") | contains("hello-json")' "$work/json.out" >/dev/null ||
  fail "stdout lacks the logs' JSON: $(cat "$work/json.out")"
ok "JSON progress: $(wc -l <<<"$pulls") pull events, last $(tail -n 1 <<<"$pulls")"
# A gang of leases (gpunet train over p1 and the delayed p2): "Leasing the
# training group" with leases agreed of asked, ended before the ranks run.
if "$GN_BIN/gpunet" train --help >/dev/null 2>&1; then
  timeout 180 "$GN_BIN/gpunet" --data-dir "$R" train --gpus 2 --per-node 1 --image "$image" --allow-simulated \
    --max-price 0.50 --hours 1 -f -- sh -c 'echo "rank $RANK up"' >"$work/train.out" 2>"$work/train.err" ||
    fail "gpunet train failed: $(tail -n 20 "$work/train.out" "$work/train.err")"
  grep -Eq '^Leasing the training group: ([0-9.]+s, planning: measuring round trips|[0-2]/2, (forming|attesting): [0-2] of 2 leases agreed)$' \
    "$work/train.err" || fail "no gang progress line: $(cat "$work/train.err")"
  grep -Eq '^Leasing the training group: done after .* \(2/2\): (running|done)$' "$work/train.err" ||
    fail "the gang progress did not end with 2/2: $(cat "$work/train.err")"
  ok "gang lease progress: $(grep -c '^Leasing the training group' "$work/train.err") lines, ending '$(grep '^Leasing the training group: done' "$work/train.err")'"
else
  echo "SKIP: gang progress (this build has no gpunet train)"
fi
echo "$pass passed, 0 failed"
