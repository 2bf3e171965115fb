#!/usr/bin/env bash
# End to end on one machine: the attestation exchange between a real
# requester and a real provider with a simulated RTX 4090, compute challenge
# then memory challenge, over real sockets (no containers).
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_setup attest requester provider bootstrap
gn_e2e_start_bootstrap
gn_e2e_start_provider --registry-allow 127.0.0.1
gn_e2e_start_requester
gn_e2e_wait_offer 20
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

# A verdict is published only once its verifier leases (issue 9): the
# provider holds this one, and its offer still carries its self-check.
checked() { gn_cli "$R" --json offers | jq -e '.offers[0].attestation | test("checked by")' >/dev/null; }
held() { grep -q "published if" "$P/gpunetd.log"; }
gn_wait_until 20 "the provider holds the verdict" held || fail "the provider did not take the requester's verdict"
sleep 2
! checked || fail "the offer carries the verdict of a requester that did not lease: $(gn_cli "$R" --json offers)"
gn_cli "$R" --json offers | jq -e '.offers[0].attestation | test("self-reported")' >/dev/null ||
  fail "the offer lost its self-check: $(gn_cli "$R" --json offers)"
ok "the verdict of a requester that has not leased is held, not published"

# A second exchange on the same provider works too (sessions are cleaned up),
# this time by gpunet rent, which attests and then leases.
lease=$(gn_cli "$R" --json rent "$offer" --hours 1 --allow-simulated | jq -r '.lease.id // empty')
[[ $lease == l-* ]] || fail "rent (with attestation) gave no lease"
grep -c "memory simulated" "$R/gpunetd.log" | grep -qx 2 || fail "the rent did not attest again"
gn_wait_until 30 "the provider carries the signed verdict" checked || fail "offer does not carry the lessee's verdict"
ok "after a second attestation and a lease the provider carries the lessee's signed verdict"
gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
echo "$pass passed, 0 failed"
