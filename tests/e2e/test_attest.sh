#!/usr/bin/env bash
# End to end on one machine: the attestation exchange between a real
# requester and a real provider with a simulated RTX 4090, compute challenge
# then memory challenge, over real sockets (no containers).
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/common.sh"
. "$src/scripts/lib/nodes.sh"

work=$(mktemp -d /tmp/gn-e2e-attest-XXXXXX)
nodes=$work/nodes
R=$nodes/requester
P=$nodes/provider
pass=0
cleanup() {
  set +e
  for n in requester provider bootstrap; do gn_node_stop "$nodes/$n"; done
  if [ "${keep:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
fail() {
  keep=1
  echo "FAIL: $*" >&2
  for n in bootstrap provider requester; do
    echo "--- $n log" >&2
    tail -n 30 "$nodes/$n/gpunetd.log" >&2 || true
  done
  exit 1
}
ok() {
  pass=$((pass + 1))
  echo "ok $pass - $*"
}

p_boot=$(gn_free_port)
p_prov=$(gn_free_port)
p_req=$(gn_free_port)
gn_node_start "$nodes/bootstrap" bootstrap --listen "127.0.0.1:$p_boot"
gn_node_start "$P" provider --listen "127.0.0.1:$p_prov" --bootstrap "127.0.0.1:$p_boot" --provide --price 0.50 \
  --simulate-gpu "RTX 4090" --registry-allow 127.0.0.1
gn_node_start "$R" requester --listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:$p_boot"

has_offer() { [ "$(gn_cli "$R" --json offers | jq '.offers | length')" -gt 0 ]; }
gn_wait_until 20 "offer relayed to the requester" has_offer || fail "no offer reached the requester"
offer=$(gn_cli "$R" --json offers | jq -r '.offers[0].id')

t0=$(date +%s%N)
att=$(gn_cli "$R" --json attest "$offer") || fail "attest: $att"
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$(jq -r .outcome <<<"$att")" = simulated ] || fail "attest outcome: $att"
jq -e '.memory | type == "object"' <<<"$att" >/dev/null || fail "no memory figures: $att"
[ "$(jq -r .memory.verdict <<<"$att")" = simulated ] || fail "memory verdict: $att"
jq -e '.memory.measured_gbs > 0 and .memory.elapsed_ms >= 1' <<<"$att" >/dev/null || fail "memory figures: $att"
ok "attest runs the compute then the memory challenge against a simulated GPU (${ms} ms, memory $(jq -c .memory <<<"$att"))"

grep -q "memory simulated" "$R/gpunetd.log" || fail "the requester's log does not mention the memory verdict"
ok "the requester logs both verdicts"

checked() { gn_cli "$R" --json offers | jq -e '.offers[0].attestation | test("checked by")' >/dev/null; }
gn_wait_until 30 "the provider carries the signed verdict" checked || fail "offer does not carry the peer's verdict"
ok "after both challenges the provider carries the requester's signed verdict"

# A second exchange on the same provider works too (sessions are cleaned up).
att=$(gn_cli "$R" --json attest "$offer") || fail "second attest: $att"
[ "$(jq -r .memory.verdict <<<"$att")" = simulated ] || fail "second attest: $att"
ok "a second attestation of the same provider succeeds"
echo "$pass passed, 0 failed"
