#!/usr/bin/env bash
# Job rows are committed without their own fsync (node/daemon.c,
# gn__node_persist_job: synchronous=NORMAL for that statement only), so:
#  - a job's last state survives gpunetd being killed (-9) right after it:
#    the commit is in the WAL, only a power loss could drop it;
#  - the connection is FULL again after every job row: the provider's
#    ledger ticks (one commit a second while a lease runs) still fsync.
# A real registry, a provider (simulated GPU) and a requester over real
# sockets, real runc; the fsyncs are counted with strace on the loop thread.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/common.sh"
. "$src/scripts/lib/nodes.sh"

if [ "$(id -u)" -ne 0 ] || ! command -v runc >/dev/null; then
  echo "SKIP: needs root and runc"
  exit 77
fi
if ! command -v strace >/dev/null; then
  echo "SKIP: needs strace (to count the provider's fsyncs)"
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

reg_port=$(gn_free_port)
"$src/scripts/registry" start "$work/registry" "$reg_port" >/dev/null
"$src/scripts/registry" build-busybox "$work/image" e2e/busybox:1 "$reg_port" >/dev/null
image=127.0.0.1:$reg_port/e2e/busybox:1

p_prov=$(gn_free_port)
p_req=$(gn_free_port)
prov_args=(--listen "127.0.0.1:$p_prov" --provide --price 0.50 --simulate-gpu "RTX 4090")
help=$("$GN_BIN/gpunetd" --help)
if grep -q -- --registry-allow <<<"$help"; then prov_args+=(--registry-allow 127.0.0.1); fi
if grep -q -- --allow-no-userns <<<"$help"; then prov_args+=(--allow-no-userns); fi
req_args=(--listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:$p_prov")
gn_node_start "$P" provider "${prov_args[@]}"
gn_node_start "$R" requester "${req_args[@]}"
has_offer() { [ "$(gn_cli "$R" --json offers | jq '.offers | length')" -gt 0 ]; }
gn_wait_until 30 "offer relayed to the requester" has_offer || fail "no offer reached the requester"
lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest | jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent gave no lease id: $lease"

gn_cli "$R" run "$lease" --image "$image" -f -- true >/dev/null || fail "first job on $image"
job=$(gn_cli "$R" run "$lease" --image "$image" -f -- sh -c 'exit 7' | head -n 1) && fail "exit 7 reported as success"
[[ $job == j-* ]] || fail "no job id from gpunet run: $job"

# The provider's loop thread, while its lease ticks: every tick commits.
pp=$(cat "$P/gpunetd.pid")
strace -q -e trace=fdatasync,fsync -o "$work/fsyncs" -p "$pp" &
st=$!
sleep 3.5
kill "$st" 2>/dev/null || true
wait "$st" 2>/dev/null || true
n=$(grep -c 'sync(' "$work/fsyncs" || true)
[ "$n" -ge 2 ] || fail "the provider fsynced $n times in 3.5 s of a running lease after its jobs: the ledger's ticks must"
ok "after job rows, the provider's ledger ticks still fsync ($n fsyncs in 3.5 s)"

# Killed, not stopped: nothing gets a chance to flush or to checkpoint.
gn_node_kill "$R"
rm -f "$R/gpunetd.sock"
gn_node_start "$R" requester "${req_args[@]}"
row=$(gn_cli "$R" --json jobs | jq -c --arg j "$job" '.jobs[] | select(.id==$j) | {state, exit_code}')
[ "$row" = '{"state":"exited","exit_code":7}' ] || fail "job $job after kill -9 of the requester: '$row'"
ok "a job's last state survives kill -9 of gpunetd ($row)"

echo "PASS: $pass checks"
