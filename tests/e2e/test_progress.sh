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
hosts_market 2

two_offers() { [ "$(gn_cli "$R" --json offers | jq '[.offers[].provider] | unique | length')" = 2 ]; }
gn_wait_until 60 "offers from two providers" two_offers || fail "the requester does not see both providers' offers"
offers=$(gn_cli "$R" --json offers)
declare -A lease_of=()
for p in p1 p2; do
  id=$(gn_cli "$nodes/$p" id)
  offer=$(jq -r --arg p "$id" '.offers[] | select(.provider == $p) | .id' <<<"$offers" | head -n 1)
  l=$(gn_cli "$R" --json rent "$offer" --hours 1 --allow-simulated | jq -r .lease.id)
  [[ $l == l-* ]] || fail "rent of $p's offer gave no lease: $l"
  lease_of[$p]=$l
done
ok "a lease on each provider: ${lease_of[*]}"

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
echo "$pass passed, 0 failed"
