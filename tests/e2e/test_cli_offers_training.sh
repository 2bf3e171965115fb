#!/usr/bin/env bash
# gpunet offers and gpunet status say which providers take ranks of training
# jobs, from real daemons: a provider with --training (its own job network
# ports) and one with --no-training, seen by a requester through a bootstrap
# node. The offers table's TRAINING column says yes with the ports or no, the
# filter training=true|false keeps one each (gpunetd matches it), a bad
# value is a usage error that reaches no daemon, and each provider's status
# says on (with its ports) or off. No jobs run: no runc needed.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

command -v jq >/dev/null || {
  echo "SKIP: needs jq"
  exit 77
}
gn_e2e_setup offers-training requester provider provider2 bootstrap
P2=$nodes/provider2
gn_e2e_compat_flags
gn_e2e_start_bootstrap
gn_e2e_start_provider --training --jobnet-ports 51900-51909 "${gn_e2e_compat[@]}"
p_prov2=$(gn_free_port)
gn_node_start "$P2" provider2 --listen "127.0.0.1:$p_prov2" --bootstrap "127.0.0.1:$p_boot" --provide --price 0.60 \
  --simulate-gpu "RTX 3090" --no-training "${gn_e2e_compat[@]}"
gn_e2e_start_requester

id_p=$(gn_cli "$P" id)
id_p2=$(gn_cli "$P2" id)
two_offers() { [ "$(gn_cli "$R" --json offers | jq '.offers | length')" -ge 2 ]; }
gn_wait_until 60 "both providers' offers at the requester" two_offers || fail "the requester does not see both offers"
ok "the requester sees both providers' offers"

offers=$(gn_cli "$R" --json offers)
[ "$(jq -r --arg p "$id_p" '.offers[] | select(.provider==$p) | "\(.training) \(.jobnet_ports)"' <<<"$offers" |
  tr -d ' \n')" = 'true[51900,51909]' ] || fail "the training provider's offer: $offers"
[ "$(jq -r --arg p "$id_p2" '.offers[] | select(.provider==$p) | "\(.training) \(.jobnet_ports)"' <<<"$offers")" = \
  'false null' ] || fail "the --no-training provider's offer: $offers"
ok "gpunetd's offer JSON: training and jobnet_ports as each provider signed them"

table=$(gn_cli "$R" offers)
grep -q TRAINING <<<"$table" || fail "no TRAINING column: $table"
grep "RTX 4090" <<<"$table" | grep -q " yes 51900-51909 " || fail "the training provider's row: $table"
grep "RTX 3090" <<<"$table" | grep -q " no " || fail "the --no-training provider's row: $table"
grep "RTX 3090" <<<"$table" | grep -q "yes" && fail "the --no-training provider's row says yes: $table"
ok "gpunet offers: TRAINING yes 51900-51909 for one, no for the other"

only=$(gn_cli "$R" --json offers training=true | jq -r '[.offers[].provider] | join(" ")')
[ "$only" = "$id_p" ] || fail "training=true kept '$only', want the training provider only"
only=$(gn_cli "$R" --json offers 'training=false gpu=rtx' | jq -r '[.offers[].provider] | join(" ")')
[ "$only" = "$id_p2" ] || fail "training=false kept '$only', want the --no-training provider only"
gn_cli "$R" offers training=true | grep -q "RTX 4090" || fail "the table with training=true"
gn_cli "$R" offers training=true | grep -q "RTX 3090" && fail "training=true shows the --no-training provider"
ok "the filter training=true|false keeps one provider each"

set +e
out=$(gn_cli "$R" offers training=maybe 2>&1)
rc=$?
set -e
[ $rc = 2 ] || fail "training=maybe exited $rc, want 2: $out"
grep -q "training must be true or false, not 'maybe'" <<<"$out" || fail "training=maybe said: $out"
ok "training=maybe is a usage error (exit 2)"

gn_cli "$P" status | grep -qx "training   on, job network UDP ports 51900-51909, 0 ranks running" ||
  fail "the training provider's status: $(gn_cli "$P" status)"
gn_cli "$P2" status | grep -qx "training   off: this provider takes no ranks of training jobs" ||
  fail "the --no-training provider's status: $(gn_cli "$P2" status)"
gn_cli "$R" status | grep -q "^training" && fail "a requester's status has a training line: $(gn_cli "$R" status)"
ok "gpunet status: training on with its ports, off, and no line on a node that does not provide"
echo "all $pass checks passed"
