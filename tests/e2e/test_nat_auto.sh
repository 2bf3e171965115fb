#!/usr/bin/env bash
# Automatic relay fallback (issue 9 item 5; docs/nat.md, "Reaching a NATed
# peer") on namespace hosts (scripts/lib/nat.sh): pub1 (bootstrap, a
# requester on the public side), pub2 (a volunteer relay), pub3 (a public
# provider), pub4 (a public requester bootstrapped from pub2 only), c1 (a requester behind a cone NAT), c2 (a provider behind a
# cone NAT) and s1 (a provider behind a symmetric NAT). Checked, with no
# call to POST /v1/nat/relay anywhere:
#  - each NATed provider holds a slot at pub2 and names it in its signed
#    offer, which reaches the requesters with the relay in it;
#  - c1 rents from c2 (both behind cone NATs) with no session before: the
#    session is a TCP hole punched through pub2 as rendezvous (both ends
#    show the TCP punch "connected", c1's session with c2 is at c2's
#    router's address, no call to the relay);
#  - c1 rents from s1 (symmetric) with no session before: no TCP punch is
#    tried, the lease is made over a session c1 got by asking pub2 to call
#    s1 (its call shows up "up", the relay counted the calls and carried
#    bytes);
#  - pub4 (public, taking no connection from c2's router) rents from c2
#    through the relay; pub1 (public) rents from s1 through the relay or
#    over the session s1 dialled out to its bootstrap (reported which);
#  - c1 rents from pub3 directly (its offer names no relay: no call).
# Prints the leases made directly and through the relay. Polls with
# generous deadlines; about 40 s. Skipped (77) saying why without root,
# namespaces, iptables' nat table, jq or curl.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/nat.sh"

nat_need_relay_e2e
t0=$(now_ms)
gn_e2e_setup natauto
nat_init
nat_add_public pub1 1
nat_add_public pub2 2
nat_add_public pub3 3
nat_add_public pub4 4
nat_add_private c1 1 cone
nat_add_private c2 2 cone
nat_add_private s1 3 symmetric
gn_e2e_compat_flags
compat=()
for f in "${gn_e2e_compat[@]}"; do [ "$f" = 127.0.0.1 ] || [ "$f" = --registry-allow ] || compat+=("$f"); done
prov=(--provide --price 0.50 --simulate-gpu "RTX 4090" ${compat[@]+"${compat[@]}"})
boot=(--bootstrap "${nat_ip[pub1]}:7946" --bootstrap "${nat_ip[pub2]}:7946" --bootstrap "${nat_ip[pub3]}:7946")
declare -A dir=() id=()
start() { # NAME ARGS...
  local name=$1
  shift
  dir[$name]=$nodes/$name
  nat_node_start "$name" "${dir[$name]}" --no-training "$@"
  id[$name]=$(gn_cli "${dir[$name]}" id)
}
start pub1
start pub2 --relay on --bootstrap "${nat_ip[pub1]}:7946"
start pub3 --bootstrap "${nat_ip[pub1]}:7946" --bootstrap "${nat_ip[pub2]}:7946" "${prov[@]}"
start c1 "${boot[@]}"
start c2 "${boot[@]}" "${prov[@]}"
start s1 "${boot[@]}" "${prov[@]}"
# pub4 takes no connection from c2's router: c2 cannot dial out to it (as
# a NATed provider that never met it would not have), so a session between
# them can only come from pub4's side, and pub4 cannot dial c2.
nat_exec pub4 iptables -A INPUT -p tcp --syn -s "${nat_outside[c2]}" -j DROP
start pub4 --bootstrap "${nat_ip[pub2]}:7946"
gn_e2e_nodes=(pub1 pub2 pub3 pub4 c1 c2 s1) # fail prints their logs
ok "7 daemons on 7 hosts behind 3 NAT routers in $((($(now_ms) - t0) / 1000)) s"

nat_of() { nat_api "${dir[$1]}" GET /v1/nat; }
# Each NATed provider holds a slot at pub2 and its offers name it.
names_relay() { nat_of "$1" | jq -e --arg r "${id[pub2]}" '.offer_relay.relay == $r' >/dev/null; }
wait_for 60 "c2 does not name the relay pub2 in its offers: $(nat_of c2 | jq -c '{type, reservations, offer_relay}')" names_relay c2
wait_for 30 "s1 does not name the relay pub2 in its offers: $(nat_of s1 | jq -c '{type, reservations, offer_relay}')" names_relay s1
nat_of pub3 | jq -e '.offer_relay == null' >/dev/null || fail "the public pub3 names a relay"
ok "c2 ($(nat_of c2 | jq -r .type)) and s1 ($(nat_of s1 | jq -r .type)) hold slots at pub2 and name it in their offers"

offer_of() { # REQUESTER PROVIDER: the offer id, once it names the relay the provider names (or none)
  local want
  want=$(nat_of "$2" | jq -c '.offer_relay.relay // null')
  gn_cli "${dir[$1]}" --json offers | jq -r --arg p "${id[$2]}" --argjson r "$want" \
    '[.offers[] | select(.provider == $p and (.relay.id // null) == $r) | .id][0] // empty'
}
has_offer() { [ -n "$(offer_of "$1" "$2")" ]; }
for pair in "pub1 s1" "pub4 c2" "c1 c2" "c1 pub3"; do
  read -r x y <<<"$pair"
  wait_for 60 "$x has no offer of $y (naming its relay): $(gn_cli "${dir[$x]}" --json offers | jq -c '[.offers[] | {provider, relay}]')" has_offer "$x" "$y"
done
ok "the offers reached the requesters, the NATed providers' naming relay pub2"

calls0=$(nat_of pub2 | jq .relay.calls)
declare -A lease=()
free_gpu() { # REQUESTER PROVIDER: its offer there shows a free GPU
  gn_cli "${dir[$1]}" --json offers | jq -e --arg o "$(offer_of "$1" "$2")" '[.offers[] | select(.id == $o and .gpus_free > 0)] | length > 0' >/dev/null
}
rent() { # REQUESTER PROVIDER
  local out l
  wait_for 60 "$1 sees no free GPU in $2's offer" free_gpu "$1" "$2"
  # stderr apart: with --json it carries progress events (one JSON object a line)
  out=$(gn_cli "${dir[$1]}" --json rent "$(offer_of "$1" "$2")" --hours 1 --allow-simulated --no-attest \
    2>"$work/rent-$1-$2.err") || fail "$1 cannot rent from $2: $out $(cat "$work/rent-$1-$2.err")"
  l=$(jq -r .lease.id <<<"$out")
  [[ $l == l-* ]] || fail "$1 cannot rent from $2: $out"
  lease[$1-$2]=$l
}
release() { # REQUESTER PROVIDER
  gn_cli "${dir[$1]}" release "${lease[$1-$2]}" >/dev/null 2>&1 || fail "$1 cannot release ${lease[$1-$2]}"
  unset "lease[$1-$2]"
}
call_state() { nat_of "$1" | jq -r --arg p "${id[$2]}" --arg r "${id[pub2]}" '[.calls[] | select(.peer == $p and .relay == $r) | .state][0] // "none"'; }
session_up() { gn_cli "${dir[$1]}" --json peers | jq -e --arg p "${id[$2]}" '[.peers[] | select(.node_id == $p)] | length > 0' >/dev/null; }
direct=0 relayed=0
tcp_state() { nat_of "$1" | jq -r --arg p "${id[$2]}" '[.tcp_punches[] | select(.peer == $p) | .state][0] // "none"'; }
peer_addr() { nat_of "$1" | jq -r --arg p "${id[$2]}" '[.tcp_punches[] | select(.peer == $p) | .session][0] // ""'; }
is_cone() { [ "$(nat_of "$1" | jq -r .type)" = cone ]; }
wait_for 30 "c1 is not classified cone: $(nat_of c1 | jq -c '{type, observations}')" is_cone c1
wait_for 30 "c2 is not classified cone: $(nat_of c2 | jq -c '{type, observations}')" is_cone c2
# c1 punches only to a provider whose signed offer names an outside
# address (c2's router's, once c2 knew its NAT; s1's names its private one).
offer_at() { # REQUESTER PROVIDER ADDR
  gn_cli "${dir[$1]}" --json offers | jq -e --arg p "${id[$2]}" --arg a "$3" \
    '[.offers[] | select(.provider == $p and .addr == $a)] | length > 0' >/dev/null
}
wait_for 45 "c1 has no offer of c2 naming its router's address: $(gn_cli "${dir[c1]}" --json offers | jq -c '[.offers[] | {provider, addr}]')" offer_at c1 c2 "${nat_outside[c2]}:7946"
# Behind cone NATs on both sides: neither can dial the other, but a TCP
# hole punched through pub2 (the relay c2's offer names, as rendezvous)
# joins them directly, with no call to the relay.
! session_up c1 c2 || fail "c1 had a session with c2 before renting"
# The rendezvous is the relay c2's offer names, over c1's session with it.
wait_for 30 "c1 has no session with pub2" session_up c1 pub2
rent c1 c2
state=$(call_state c1 c2)
[ "$state" = none ] || fail "c1 leased from c2 through the relay (call $state), not over a punched TCP hole: $(nat_of c1 | jq -c '{tcp_punches, tcp_stats, reach, reach_stats}') c2: $(nat_of c2 | jq -c '{tcp_punches, tcp_stats}')"
[ "$(tcp_state c1 c2)" = connected ] || fail "c1's TCP punch to c2 is $(tcp_state c1 c2)"
[ "$(tcp_state c2 c1)" = connected ] || fail "c2's TCP punch to c1 is $(tcp_state c2 c1)"
a=$(peer_addr c1 c2)
[ "$a" = "${nat_outside[c2]}:7946" ] || fail "c1's session with c2 is with $a, not c2's router ${nat_outside[c2]}:7946"
[ "$(nat_of c1 | jq .reach_stats.direct)" -ge 1 ] || fail "c1 counts no direct session: $(nat_of c1 | jq -c .reach_stats)"
direct=$((direct + 1))
ok "c1 (cone) leased from c2 (cone) over a TCP hole punched through pub2, no relay (${lease[c1-c2]}, session at $a)"
# With a symmetric side only the relay joins them (no TCP punch tried:
# s1's offer names no outside address).
! session_up c1 s1 || fail "c1 had a session with s1 before renting"
rent c1 s1
state=$(call_state c1 s1)
[ "$state" = up ] || fail "c1 leased from s1 but not through the relay: call $state, $(nat_of c1 | jq -c '{reach, reach_stats}')"
[ "$(tcp_state c1 s1)" = none ] || fail "c1 tried a TCP punch to the symmetric s1: $(tcp_state c1 s1)"
relayed=$((relayed + 1))
ok "c1 (cone) leased from s1 ($(nat_of s1 | jq -r .type)) through the relay pub2 with no manual call (${lease[c1-s1]})"
[ "$(nat_of c1 | jq .reach_stats.relayed)" -ge 1 ] || fail "c1 counts no relayed session: $(nat_of c1 | jq -c .reach_stats)"
release c1 s1
# The public side: pub4 reaches c2 through the relay (nothing else joins
# them); pub1 reaches s1 through the relay or over the session s1 dialled
# out to its bootstrap pub1 (reported which). No manual call either way.
release c1 c2
! session_up pub4 c2 || fail "pub4 had a session with c2 before renting"
rent pub4 c2
state=$(call_state pub4 c2)
[ "$state" = up ] || fail "pub4 leased from c2 but not through the relay: call $state, $(nat_of pub4 | jq -c '{reach, reach_stats}')"
relayed=$((relayed + 1))
ok "pub4 (public) leased from c2 (cone) through the relay pub2 with no manual call (${lease[pub4-c2]})"
had=no
session_up pub1 s1 && had=yes
rent pub1 s1
state=$(call_state pub1 s1)
if [ "$state" = up ]; then
  relayed=$((relayed + 1))
  ok "pub1 (public) leased from s1 through the relay pub2 with no manual call (${lease[pub1-s1]})"
else
  [ "$had" = yes ] || fail "pub1 leased from s1 with neither a session s1 made nor the relay: call $state"
  direct=$((direct + 1))
  ok "pub1 (public) leased from s1 over the session s1 had dialled out to it (${lease[pub1-s1]})"
fi
# A public provider: its offer names no relay, nothing is called.
rent c1 pub3
[ "$(call_state c1 pub3)" = none ] || fail "c1 called pub3 through the relay though its offer names none"
direct=$((direct + 1))
ok "c1 leased from the public pub3 directly (${lease[c1-pub3]})"
rel=$(nat_of pub2 | jq -c .relay)
[ "$(jq .calls <<<"$rel")" -ge $((calls0 + relayed)) ] || fail "the relay saw fewer than $relayed calls: $rel"
[ "$(jq .bytes <<<"$rel")" -gt 0 ] || fail "the relay carried no bytes: $rel"
ok "the relay pub2 put $(($(jq .calls <<<"$rel") - calls0)) calls through and spliced $(jq .bytes <<<"$rel") bytes"
for k in "${!lease[@]}"; do
  release "${k%%-*}" "${k#*-}"
done
ok "the leases released"
n=$((direct + relayed))
echo "# nat_auto: $n leases with no manual relay call: $direct direct, $relayed through the relay ($((100 * relayed / n)) %); $pass checks in $((($(now_ms) - t0) / 1000)) s"
