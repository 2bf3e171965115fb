#!/usr/bin/env bash
# Limits as config keys, against real daemons on loopback: a daemon started
# with --max-inbound-per-ip 2 holds two connections from 127.0.0.1 and
# refuses the third at once (a daemon with the default 8 holds all three);
# --handshake-timeout-s 5 closes a connection that never handshakes; the
# values show in `gpunet --json status` under "limits"; an out-of-range
# value, as a flag or in gpunet.conf, keeps the daemon from starting with a
# message naming the key and its range.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

command -v jq >/dev/null && command -v timeout >/dev/null || {
  echo "SKIP: needs jq and timeout"
  exit 77
}

gn_e2e_setup limits capped plain
A=$nodes/capped B=$nodes/plain
pa=$(gn_free_port)
pb=$(gn_free_port)
gn_node_start "$A" capped --listen "127.0.0.1:$pa" --overlay off --max-inbound-per-ip 2 --handshake-timeout-s 5
gn_node_start "$B" plain --listen "127.0.0.1:$pb" --overlay off

st=$(gn_cli "$A" --json status)
[ "$(jq '.limits.max_inbound_per_ip' <<<"$st")" = 2 ] && [ "$(jq '.limits.handshake_timeout_s' <<<"$st")" = 5 ] &&
  [ "$(jq '.limits.max_inbound_per_net' <<<"$st")" = 64 ] &&
  [ "$(jq '.limits.transport_memory' <<<"$st")" = $((256 << 20)) ] &&
  [ "$(jq -c '.limits.ranges.max_inbound_per_ip' <<<"$st")" = '[1,65536]' ] || fail "status limits: $(jq -c .limits <<<"$st")"
[ "$(gn_cli "$B" --json status | jq '.limits.max_inbound_per_ip')" = 8 ] || fail "default max_inbound_per_ip"
ok "gpunet --json status shows the limits"

# open_three PORT: fds 3, 4, 5 connected to PORT in that order (none sends).
open_three() {
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  exec 4<>"/dev/tcp/127.0.0.1/$1"
  exec 5<>"/dev/tcp/127.0.0.1/$1"
}
close_three() { exec 3<&- 4<&- 5<&-; }
# closed_within S FD: the daemon closed the connection on FD within S s
# (cat sees end of file or a reset; 124 means it stayed open).
closed_within() {
  local rc=0
  timeout "$1" cat <&"$2" >/dev/null 2>&1 || rc=$?
  [ $rc != 124 ]
}

open_three "$pa"
t0=$(now_ms)
# The first is held (it has 5 s for its handshake); the third was refused
# when it was accepted, so its end of file waits to be read.
closed_within 1 3 && fail "the first connection was closed at once"
closed_within 10 5 || fail "the third connection from 127.0.0.1 was not refused"
ok "max_inbound_per_ip 2: the third connection is refused at once, the first held"
# The first two never handshake: handshake_timeout_s 5 closes them.
closed_within 15 3 || fail "a connection that never handshakes was not closed within 15 s"
closed_within 3 4 || fail "the second connection outlived its handshake timeout"
echo "  closed by the 5 s handshake timeout after $(($(now_ms) - t0)) ms"
close_three
grep -q "at 127.0.0.1:[0-9]* refused: too many connections from its address" "$A/gpunetd.log" ||
  fail "no refusal logged: $(tail -5 "$A/gpunetd.log")"
ok "handshake_timeout_s 5 closes a silent connection"

open_three "$pb"
closed_within 2 5 && fail "the default daemon refused the third connection"
close_three
ok "with the default (8) the third connection is held"

set +e
err=$("$GN_BIN/gpunetd" --data-dir "$nodes/bad" --max-inbound-per-ip 0 2>&1)
rc=$?
set -e
[ $rc != 0 ] && [[ $err == *"--max-inbound-per-ip: out of range max_inbound_per_ip '0': want a whole number from 1 to 65536"* ]] ||
  fail "flag out of range: rc $rc: $err"
mkdir -p "$nodes/bad"
printf 'listen = 127.0.0.1:%s\ntransport_memory = 8M\n' "$(gn_free_port)" >"$nodes/bad/gpunet.conf"
set +e
err=$("$GN_BIN/gpunetd" --data-dir "$nodes/bad" 2>&1)
rc=$?
set -e
[ $rc != 0 ] && [[ $err == *"gpunet.conf:2: out of range transport_memory '8M'"*"from 16M to 64G"* ]] ||
  fail "file value out of range: rc $rc: $err"
[ ! -S "$nodes/bad/gpunetd.sock" ] || fail "a daemon with a bad limit made its control socket"
ok "out-of-range limits keep the daemon from starting, naming the key and range"

echo "PASS ($pass checks)"
