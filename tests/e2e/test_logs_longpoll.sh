#!/usr/bin/env bash
# The logs endpoint long-polls: GET /v1/jobs/:id/logs?wait_ms=M holds the
# request until the job prints or changes state, or M passes, and
# `gpunet logs -f` relies on it. A real registry, a provider (simulated GPU)
# and a requester over real sockets, real runc containers.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/common.sh"
. "$src/scripts/lib/nodes.sh"

if [ "$(id -u)" -ne 0 ] || ! command -v runc >/dev/null; then
  echo "SKIP: needs root and runc"
  exit 77
fi

work=$(mktemp -d /tmp/gn-e2e-XXXXXX)
chmod 711 "$work" # jobs run as unprivileged uids and must reach their roots below
nodes=$work/nodes
R=$nodes/requester
P=$nodes/provider
pass=0
cleanup() {
  set +e
  for n in requester provider; do gn_node_stop "$nodes/$n"; done
  "$src/scripts/registry" stop "$work/registry"
  if [ "${keep:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
fail() {
  keep=1
  echo "FAIL: $*" >&2
  for n in provider requester; do
    echo "--- $n log" >&2
    tail -n 30 "$nodes/$n/gpunetd.log" >&2 || true
  done
  exit 1
}
ok() {
  pass=$((pass + 1))
  echo "ok $pass - $*"
}
now_ms() { date +%s%3N; }
# api PATH: GET on the requester's control socket, the JSON answer on stdout.
api() { curl -sS --max-time 60 --unix-socket "$R/gpunetd.sock" "http://gpunetd$1"; }

reg_port=$(gn_free_port)
"$src/scripts/registry" start "$work/registry" "$reg_port" >/dev/null
"$src/scripts/registry" build-busybox "$work/image" e2e/busybox:1 "$reg_port" >/dev/null
image=127.0.0.1:$reg_port/e2e/busybox:1

p_prov=$(gn_free_port)
p_req=$(gn_free_port)
prov_args=(--listen "127.0.0.1:$p_prov" --provide --price 0.50 --simulate-gpu "RTX 4090")
# (Options of newer builds, passed where the build has them.) Registries on
# loopback are refused unless the provider allowlists them; a host without
# working user namespaces provides only when told to.
help=$("$GN_BIN/gpunetd" --help)
if grep -q -- --registry-allow <<<"$help"; then prov_args+=(--registry-allow 127.0.0.1); fi
if grep -q -- --allow-no-userns <<<"$help"; then prov_args+=(--allow-no-userns); fi
gn_node_start "$P" provider "${prov_args[@]}"
gn_node_start "$R" requester --listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:$p_prov"
has_offer() { [ "$(gn_cli "$R" --json offers | jq '.offers | length')" -gt 0 ]; }
gn_wait_until 30 "offer relayed to the requester" has_offer || fail "no offer reached the requester"
lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest | jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent gave no lease id: $lease"
# Pull the image once, so the jobs below start from the cache.
gn_cli "$R" run "$lease" --image "$image" -f -- true >/dev/null || fail "first job on $image"

job=$(gn_cli "$R" --json run "$lease" --image "$image" -- sh -c 'sleep 2; echo hello; sleep 4' | jq -r .job.id)
state() { gn_cli "$R" --json jobs | jq -r --arg j "$job" '.jobs[] | select(.id==$j) | .state'; }
running() { [ "$(state)" = running ]; }
gn_wait_until 20 "job $job to run" running || fail "job $job never ran"

out=$(api "/v1/jobs/$job/logs?wait_ms=abc" || true)
grep -q "wait_ms must be a number" <<<"$out" || fail "wait_ms=abc: $out"
ok "a malformed wait_ms is refused"

t0=$(now_ms)
out=$(api "/v1/jobs/$job/logs?offset=0&wait_ms=10000")
t1=$(now_ms)
[ "$(jq -r .data <<<"$out")" = hello ] || fail "long poll answered without the job's line: $out"
[ $((t1 - t0)) -lt 5000 ] || fail "long poll with wait_ms=10000 took $((t1 - t0)) ms though the line came after ~2 s"
ok "a long poll (wait_ms=10000) returns as soon as the line arrives ($((t1 - t0)) ms)"

off=$(jq -r .offset <<<"$out")
t0=$(now_ms)
out=$(api "/v1/jobs/$job/logs?offset=$off&wait_ms=1500")
t1=$(now_ms)
[ "$(jq -r .data <<<"$out")" = "" ] && [ "$(jq -r .done <<<"$out")" = false ] || fail "idle long poll: $out"
[ $((t1 - t0)) -ge 1000 ] || fail "a long poll with nothing new was answered after $((t1 - t0)) ms, not held"
ok "a long poll with nothing new is held until wait_ms ($((t1 - t0)) ms for 1500)"

t0=$(now_ms)
out=$(api "/v1/jobs/$job/logs?offset=$off&wait_ms=20000")
t1=$(now_ms)
[ "$(jq -r .done <<<"$out")" = true ] && [ "$(jq -r .exit_code <<<"$out")" = 0 ] || fail "end of job: $out"
[ $((t1 - t0)) -lt 15000 ] || fail "the end of the job took $((t1 - t0)) ms to answer a long poll"
ok "a long poll returns when the job ends ($((t1 - t0)) ms)"

# `gpunet logs -f`: how long after the job writes a line the CLI prints it,
# by the host's uptime clock (10 ms steps), which the job shares. Measured
# and shown, asserted only loosely (the machine may be loaded).
job=$(gn_cli "$R" --json run "$lease" --image "$image" -- \
  sh -c 'sleep 1; for i in 1 2 3 4 5; do read -r up _ </proc/uptime; echo "t $up"; sleep 0.3; done' |
  jq -r .job.id)
lat=$(gn_cli "$R" logs -f "$job" | while read -r _ at; do
  read -r up _ </proc/uptime
  awk -v a="$at" -v b="$up" 'BEGIN { printf "%d\n", (b - a) * 1000 }'
done | sort -n | tr '\n' ' ')
[ "$(wc -w <<<"$lat")" = 5 ] || fail "logs -f printed $(wc -w <<<"$lat") lines, want 5"
max=$(awk '{print $NF}' <<<"$lat")
[ "$max" -lt 3000 ] || fail "logs -f printed a line $max ms after it was written"
ok "gpunet logs -f prints each line shortly after it is written (ms, sorted: $lat)"

echo "$pass passed, 0 failed"
