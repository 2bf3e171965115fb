#!/usr/bin/env bash
# Home networks (issue 9 item 5; docs/nat.md) on namespace hosts
# (scripts/lib/nat.sh): three public nodes in three /24s (pub1 the
# bootstrap and rendezvous, pub2 a volunteer relay, pub3), two nodes behind
# cone NATs (c1, c2: MASQUERADE keeps the port) and two behind symmetric
# NATs (s1, s2: MASQUERADE --random-fully), each NATed node bootstrapped
# from the three public ones. Checked:
#  - every node classifies its NAT right from where the public nodes see
#    it (public, cone, symmetric), and a cone node advertises its router's
#    address with its own port;
#  - the public nodes hold the symmetric nodes alive without suspecting
#    them over and over (they probe them where their datagrams came from);
#  - every NATed node holds a slot at the relay (and only there: the others
#    say they do not relay);
#  - every pair of NATed nodes connects: a hole punched through pub1 where
#    it can be (cone-cone must be: both sides see the other's endpoint),
#    else a session relayed by pub2 (any pair with a symmetric side must
#    be): the session's handshake through the splice proves the key asked
#    for, both sides count the other as a peer, and the relay carried bytes;
#  - the relay never saw more pairs than it allows.
# Prints the fraction of pairs that connect directly and relayed. Polls
# with generous deadlines (one 10 s observation window); about 35 s. Skipped (77) saying
# why without root, namespaces, iptables' nat table, jq or curl.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/nat.sh"

nat_need_relay_e2e
t0=$(now_ms)
gn_e2e_setup nat
nat_init
nat_add_public pub1 1
nat_add_public pub2 2
nat_add_public pub3 3
nat_add_private c1 1 cone
nat_add_private c2 2 cone
nat_add_private s1 3 symmetric
nat_add_private s2 4 symmetric
declare -A dir=() id=()
boot=(--bootstrap "${nat_ip[pub1]}:7946" --bootstrap "${nat_ip[pub2]}:7946" --bootstrap "${nat_ip[pub3]}:7946")
start() { # NAME ARGS...
  local name=$1
  shift
  dir[$name]=$nodes/$name
  nat_node_start "$name" "${dir[$name]}" --no-training "$@"
  id[$name]=$(gn_cli "${dir[$name]}" id)
}
start pub1
start pub2 --relay on --bootstrap "${nat_ip[pub1]}:7946"
start pub3 --bootstrap "${nat_ip[pub1]}:7946" --bootstrap "${nat_ip[pub2]}:7946"
for h in c1 c2 s1 s2; do start "$h" "${boot[@]}"; done
gn_e2e_nodes=(pub1 pub2 pub3 c1 c2 s1 s2) # fail prints their logs
ok "7 daemons on 7 hosts behind 4 NAT routers in $((($(now_ms) - t0) / 1000)) s"

nat_of() { nat_api "${dir[$1]}" GET /v1/nat; }
declare -A want=([pub1]=public [pub2]=public [pub3]=public [c1]=cone [c2]=cone [s1]=symmetric [s2]=symmetric)
classified() {
  local h
  for h in "${!want[@]}"; do
    [ "$(nat_of "$h" | jq -r .type)" = "${want[$h]}" ] || return 1
  done
}
wait_for 45 "not every node classified its NAT right: $(for h in "${!want[@]}"; do echo -n "$h=$(nat_of "$h" | jq -r .type) "; done)" classified
for h in c1 c2; do
  adv=$(nat_of "$h" | jq -r .advertised)
  [ "$adv" = "${nat_outside[$h]}:7946" ] || fail "$h advertises $adv, not its router's ${nat_outside[$h]}:7946"
done
for h in s1 s2; do
  [ "$(nat_of "$h" | jq -r .outside_host)" = "${nat_outside[$h]}" ] || fail "$h does not see its router's address"
  [ "$(nat_of "$h" | jq -r .advertised)" = null ] || fail "$h advertises an address though its NAT is symmetric"
done
ok "NATs classified: pub1-3 public, c1 c2 cone (advertising their routers' address, port kept), s1 s2 symmetric"

# The membership follows: the public nodes hold each cone node alive at its
# router's address (they probe it there, not at its private address).
cone_members() {
  local p h
  for p in pub1 pub3; do
    for h in c1 c2; do
      nat_api "${dir[$p]}" GET /v1/members | jq -e --arg i "${id[$h]}" --arg a "${nat_outside[$h]}:7946" \
        '[.members[] | select(.node_id == $i and .addr == $a and .state == "alive")] | length == 1' >/dev/null ||
        return 1
    done
  done
}
wait_for 45 "the public nodes do not hold the cone nodes alive at their routers' addresses" cone_members
ok "membership: pub1 and pub3 hold c1 and c2 alive at their routers' addresses"

slots_held() {
  local h
  for h in c1 c2 s1 s2; do
    nat_of "$h" | jq -e --arg r "${id[pub2]}" '[.reservations[] | select(.relay == $r and .state == "held")] | length == 1' >/dev/null || return 1
  done
}
wait_for 30 "not every NATed node holds a slot at the relay: $(nat_of s1 | jq -c .reservations)" slots_held
nat_of c1 | jq -e --arg r "${id[pub1]}" '[.reservations[] | select(.relay == $r and .state == "held")] | length == 0' >/dev/null ||
  fail "c1 holds a slot at pub1, which does not relay"
ok "every NATed node holds a slot at the relay pub2 ($(nat_of pub2 | jq .relay.reservations) reservations there)"

# A symmetric node cannot be probed at any address it could advertise; the
# members probe it where its own datagrams came from (node/overlay.c), so
# it is not suspected and refuted over and over: over 10 s its incarnation
# at pub1 and pub3 (one more per refutation) rises by at most 2 (before:
# about one a second) and it ends alive.
sym_inc() { # AT NODE
  nat_api "${dir[$1]}" GET /v1/members | jq -r --arg i "${id[$2]}" \
    '[.members[] | select(.node_id == $i) | "\(.incarnation) \(.state)"][0] // "-1 none"'
}
declare -A inc0=()
for p in pub1 pub3; do for h in s1 s2; do read -r inc0[$p$h] _ <<<"$(sym_inc $p $h)"; done; done
sleep 10
for p in pub1 pub3; do
  for h in s1 s2; do
    read -r inc st <<<"$(sym_inc $p $h)"
    [ "${inc0[$p$h]}" -ge 0 ] && [ "$inc" -le $((${inc0[$p$h]} + 2)) ] && [ "$st" = alive ] ||
      fail "$p holds the symmetric node $h $st at incarnation $inc, ${inc0[$p$h]} 10 s before (suspected and refuted over and over)"
  done
done
ok "membership: pub1 and pub3 hold s1 and s2 alive without suspecting them (incarnations $(for p in pub1 pub3; do for h in s1 s2; do echo -n "${inc0[$p$h]}->$(sym_inc $p $h | cut -d' ' -f1) "; done; done))"

pairs=("c1 c2" "c1 s1" "c1 s2" "c2 s1" "c2 s2" "s1 s2")
for p in "${pairs[@]}"; do
  read -r x y <<<"$p"
  r=$(nat_api "${dir[$x]}" POST /v1/nat/punch "{\"peer\":\"${id[$y]}\",\"via\":\"${id[pub1]}\"}")
  jq -e '.state == "punching" or .state == "open"' <<<"$r" >/dev/null || fail "$x cannot start a punch to $y: $r"
done
punch_state() { nat_of "$1" | jq -r --arg p "${id[$2]}" '[.punches[] | select(.peer == $p) | .state][0] // "none"'; }
punches_ended() {
  local p x y
  for p in "${pairs[@]}"; do
    read -r x y <<<"$p"
    case $(punch_state "$x" "$y") in open | failed) ;; *) return 1 ;; esac
  done
}
wait_for 30 "not every punch ended" punches_ended
direct=0 relayed=0 relay_pairs=()
for p in "${pairs[@]}"; do
  read -r x y <<<"$p"
  if [ "$(punch_state "$x" "$y")" = open ]; then
    [ "$(punch_state "$y" "$x")" = open ] || fail "$x punched a hole to $y but $y has none to $x"
    direct=$((direct + 1))
  else
    relay_pairs+=("$p")
  fi
done
[ "$(punch_state c1 c2)" = open ] || fail "the cone-cone pair c1 c2 did not punch a hole"
[ "$(punch_state s1 s2)" = failed ] || fail "the symmetric pair s1 s2 punched a hole (it cannot)"
addr=$(nat_of c1 | jq -r --arg p "${id[c2]}" '.punches[] | select(.peer == $p) | .addr')
[ "$addr" = "${nat_outside[c2]}:7946" ] || fail "c1's hole to c2 is at $addr, not c2's router ${nat_outside[c2]}:7946"
ok "hole punching through pub1: $direct of ${#pairs[@]} pairs direct (c1-c2 at $addr), the rest need the relay"

for p in "${relay_pairs[@]}"; do
  read -r x y <<<"$p"
  r=$(nat_api "${dir[$x]}" POST /v1/nat/relay "{\"peer\":\"${id[$y]}\",\"via\":\"${id[pub2]}\"}")
  jq -e '.state == "calling"' <<<"$r" >/dev/null || fail "$x cannot call $y through the relay: $r"
done
call_state() { nat_of "$1" | jq -r --arg p "${id[$2]}" '[.calls[] | select(.peer == $p) | .state][0] // "none"'; }
peer_of() { gn_cli "${dir[$1]}" --json peers | jq -e --arg p "${id[$2]}" '[.. | objects | select(.node_id? == $p or .id? == $p)] | length > 0' >/dev/null; }
relayed_up() {
  local p x y
  for p in "${relay_pairs[@]}"; do
    read -r x y <<<"$p"
    [ "$(call_state "$x" "$y")" = up ] || return 1
  done
}
wait_for 30 "not every relayed call came up: $(for p in "${relay_pairs[@]}"; do read -r x y <<<"$p"; echo -n "$x-$y=$(call_state "$x" "$y") "; done)" relayed_up
for p in "${relay_pairs[@]}"; do
  read -r x y <<<"$p"
  wait_for 10 "$y does not count $x as a peer after the relayed handshake" peer_of "$y" "$x"
  relayed=$((relayed + 1))
done
rel=$(nat_of pub2 | jq -c .relay)
[ "$(jq .bytes <<<"$rel")" -gt 0 ] || fail "the relay carried no bytes: $rel"
[ "$(jq .sessions <<<"$rel")" -le 16 ] || fail "the relay holds more pairs than it allows: $rel"
ok "$relayed pairs connected through the relay pub2: an authenticated session each, both sides up ($(jq .bytes <<<"$rel") bytes spliced, $(jq .sessions <<<"$rel") pairs)"

[ $((direct + relayed)) = ${#pairs[@]} ] || fail "only $((direct + relayed)) of ${#pairs[@]} pairs connected"
echo "# nat: ${#pairs[@]} NATed pairs (2 cone, 2 symmetric): $direct direct ($((100 * direct / ${#pairs[@]})) %), $relayed relayed ($((100 * relayed / ${#pairs[@]})) %); $pass checks in $((($(now_ms) - t0) / 1000)) s"
