#!/usr/bin/env bash
# Multi-host end to end (issue 8): five network-namespace hosts on one
# bridge (scripts/lib/hosts.sh): "hub" (bootstrap node and registry), three
# providers p1..p3 (each its own gpunetd, one simulated RTX 4090, the hub's
# registry allowlisted) and the requester "req".
#
# Part 1, the marketplace across hosts: every provider's offer reaches the
# requester through the bootstrap node with the provider's own host address;
# one GPU rented from each provider; a busybox job on each lease pulls from
# the hub's registry and reports the provider's host; each lease released, invoiced and countersigned.
#
# Part 2, distributed training (gpunet train; exits 77 saying what is
# missing while the command or the provider side is not in the build): the
# training image (scripts/image/train-image, cached) pushed to the hub, a
# 3-rank DDP run (gloo) over the job network, one rank per provider, every
# rank ending with the same final parameter hash; from inside a rank neither
# the provider host's addresses, the requester's, the hub, the "internet"
# (198.51.100.1, routed from every host) nor a second training job's network
# are reachable, while a host reaches all of them.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/hosts.sh"

gn_e2e_need_root_runc
hosts_need
command -v docker-registry >/dev/null || {
  echo "SKIP: needs docker-registry"
  exit 77
}
t0=$(now_ms)
gn_e2e_setup train-mh requester p1 p2 p3 bootstrap
hosts_init
for h in hub p1 p2 p3 req; do hosts_add "$h"; done
hub=${hosts_ip[hub]}
port=7946 # every host has its own address: the same port everywhere
reg_port=5000

hosts_registry_start hub "$work/registry" "$reg_port"
digest=$(hosts_exec hub "$src/scripts/registry" build-busybox "$work/image" e2e/busybox:1 "$reg_port") ||
  fail "cannot push the busybox image to the hub's registry"
# By digest: a requester resolves a tag itself, over TLS unless the registry
# is on loopback (gn_imageref: plain_http only for loopback), and the hub is
# not its loopback. A digest needs no resolving; providers pull over plain
# HTTP from an allowlisted private address.
[[ $digest == sha256:* ]] || fail "build-busybox printed no digest: $digest"
image=$hub:$reg_port/e2e/busybox:1@$digest

gn_e2e_compat_flags
compat=()
for f in "${gn_e2e_compat[@]}"; do [ "$f" = 127.0.0.1 ] || [ "$f" = --registry-allow ] || compat+=("$f"); done
hosts_node_start hub "$nodes/bootstrap" bootstrap --listen "$hub:$port"
for p in p1 p2 p3; do
  hosts_node_start "$p" "$nodes/$p" "$p" --listen "${hosts_ip[$p]}:$port" --bootstrap "$hub:$port" \
    --provide --price 0.50 --simulate-gpu "RTX 4090" --registry-allow "$hub" "${compat[@]}"
done
R=$nodes/requester
hosts_node_start req "$R" requester --listen "${hosts_ip[req]}:$port" --bootstrap "$hub:$port"

# Plain host networking first: hosts reach each other's addresses and the
# "internet" (a refused connection is an answer: the address is reachable).
hosts_tcp_open req "${hosts_ip[p1]}" "$port" || fail "the requester's host cannot reach p1's gpunetd"
hosts_tcp_open p1 198.51.100.1 9 || fail "p1 cannot reach the internet stand-in 198.51.100.1"
ok "hosts: each its own address on the bridge, the internet stand-in routed"

three_offers() { [ "$(gn_cli "$R" --json offers | jq '[.offers[].provider] | unique | length')" = 3 ]; }
gn_wait_until 40 "offers from three providers" three_offers ||
  fail "the requester sees offers from $(gn_cli "$R" --json offers | jq '[.offers[].provider] | unique | length') providers, want 3"
offers=$(gn_cli "$R" --json offers)
for p in p1 p2 p3; do
  id=$(gn_cli "$nodes/$p" id)
  n=$(jq --arg p "$id" --arg a "${hosts_ip[$p]}:$port" \
    '[.offers[] | select(.provider == $p and .addr == $a)] | length' <<<"$offers")
  [ "$n" = 1 ] || fail "no offer of $p ($id) at ${hosts_ip[$p]}:$port: $offers"
done
ok "each provider's offer reached the requester through the bootstrap node, with its own host address"

declare -A lease_of=()
for p in p1 p2 p3; do
  id=$(gn_cli "$nodes/$p" id)
  offer=$(jq -r --arg p "$id" '.offers[] | select(.provider == $p) | .id' <<<"$offers" | head -n 1)
  l=$(gn_cli "$R" --json rent "$offer" --hours 1 --allow-simulated | jq -r .lease.id)
  [[ $l == l-* ]] || fail "rent of $p's offer $offer gave no lease: $l"
  [ "$(gn_cli "$nodes/$p" --json leases | jq -r --arg l "$l" '.leases[] | select(.id==$l) | .state')" = active ] ||
    fail "$p does not show lease $l active"
  lease_of[$p]=$l
done
ok "rented one GPU from each of p1, p2, p3: ${lease_of[*]}"

# One job per lease, all three at once: each pulls from the hub's registry
# and prints its provider host's interfaces as the job sees them (lo only).
for p in p1 p2 p3; do
  gn_cli "$R" run "${lease_of[$p]}" --image "$image" --env WHO="$p" -f -- \
    sh -c 'echo "hello from $WHO"; echo ifaces=$(tail -n +3 /proc/net/dev | wc -l)' >"$work/job-$p.out" 2>&1 &
  eval "job_pid_$p=$!"
done
for p in p1 p2 p3; do
  pid_var=job_pid_$p
  wait "${!pid_var}" || fail "the job on $p failed: $(cat "$work/job-$p.out")"
  grep -q "^hello from $p" "$work/job-$p.out" || fail "job on $p: $(cat "$work/job-$p.out")"
  grep -q "^ifaces=1" "$work/job-$p.out" || fail "job on $p sees interfaces beyond lo: $(cat "$work/job-$p.out")"
  n=$(gn_cli "$nodes/$p" --json jobs | jq --arg l "${lease_of[$p]}" '[.jobs[] | select(.lease==$l and .exit_code==0)] | length')
  [ "$n" = 1 ] || fail "$p records $n finished jobs on its lease, want 1: $(gn_cli "$nodes/$p" --json jobs)"
done
ok "a busybox job ran on each provider host at once, pulled from the hub's registry, output streamed back"

for p in p1 p2 p3; do
  l=${lease_of[$p]}
  gn_cli "$R" release "$l" >/dev/null || fail "cannot release $l ($p)"
  inv=$(gn_cli "$R" --json invoices | jq -c --arg l "$l" '.invoices[] | select(.lease==$l)')
  [ "$(jq -r .status <<<"$inv")" = accepted ] || fail "invoice of $l ($p): $inv"
  [ "$(gn_cli "$nodes/$p" --json invoices | jq -r --arg l "$l" '.invoices[] | select(.lease==$l) | .status')" = accepted ] ||
    fail "$p does not hold the countersigned invoice of $l"
done
ok "three leases released, each invoiced and countersigned across hosts"
echo "part 1 (marketplace across hosts): $(($(now_ms) - t0)) ms"

# --- Part 2: distributed training -------------------------------------------
echo "SKIP: gpunet train across hosts: not written yet ($pass checks of the marketplace part passed)"
exit 77
