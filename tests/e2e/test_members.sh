#!/usr/bin/env bash
# gpunet members as a user runs it, against real daemons on loopback: three
# nodes joined through one see each other alive (table, summary, --state,
# --json); a node killed with SIGKILL is shown dead; a bad flag or state is
# a usage error (exit 2) saying what is wrong; a daemon with overlay = off
# and a daemon that is not running are exit 1 with a clear reason.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

command -v jq >/dev/null || {
  echo "SKIP: needs jq"
  exit 77
}

gn_e2e_setup members a b c solo
A=$nodes/a B=$nodes/b C=$nodes/c S=$nodes/solo
pa=$(gn_free_port)
gn_node_start "$A" a --listen "127.0.0.1:$pa"
gn_node_start "$B" b --listen "127.0.0.1:$(gn_free_port)" --bootstrap "127.0.0.1:$pa"
gn_node_start "$C" c --listen "127.0.0.1:$(gn_free_port)" --bootstrap "127.0.0.1:$pa"
id_b=$(gn_cli "$B" id)
id_c=$(gn_cli "$C" id)

# state_of DIR ID: the member's state as DIR's node sees it ("" if unknown).
state_of() { gn_cli "$1" --json members | jq -r --arg id "$2" '.members[] | select(.node_id == $id) | .state'; }
both_alive() { [ "$(state_of "$A" "$id_b")" = alive ] && [ "$(state_of "$A" "$id_c")" = alive ]; }
gn_wait_until 60 "b and c alive at a" both_alive || fail "b and c not both alive at a: $(gn_cli "$A" members 2>&1)"
ok "a sees b and c alive"

out=$(gn_cli "$A" members)
grep -q '^NODE  *ADDRESS  *STATE  *INCARNATION  *SINCE' <<<"$out" || fail "no table header: $out"
grep -Eq "^$id_c  *127\.0\.0\.1:[0-9]*  *alive  *[0-9]*  *([0-9hms]* ago|just now)$" <<<"$out" || fail "no row for c: $out"
grep -Eq '^2 members besides this node: 2 alive, 0 suspect, 0 dead, 0 left; local health [0-8] ' <<<"$out" ||
  fail "summary line: $out"
ok "table rows and summary"

j=$(gn_cli "$A" --json members)
[ "$(jq '.counts.alive' <<<"$j")" = 2 ] && [ "$(jq '.total' <<<"$j")" = 2 ] &&
  [ "$(jq '.members | length' <<<"$j")" = 2 ] && jq -e '.health | type == "number"' <<<"$j" >/dev/null &&
  jq -e 'all(.members[]; (.for_ms | type == "number") and (.incarnation | type == "number"))' <<<"$j" >/dev/null ||
  fail "--json: $j"
# --json after the command works as well.
[ "$(gn_cli "$A" members --json --state dead | jq '.members | length')" = 0 ] || fail "--state dead listed someone"
ok "--json and --state"

kill -9 "$(cat "$C/gpunetd.pid")"
rm -f "$C/gpunetd.pid"
c_dead() { [ "$(state_of "$A" "$id_c")" = dead ]; }
# At n = 3 a suspicion lasts 5 to 30 s; the deadline is generous (ASan).
gn_wait_until 120 "c dead at a" c_dead || fail "c not dead at a: $(gn_cli "$A" members 2>&1)"
out=$(gn_cli "$A" members --state dead)
grep -q "^$id_c  *127\.0\.0\.1:[0-9]*  *dead " <<<"$out" || fail "--state dead does not list c: $out"
! grep -q "^$id_b" <<<"$out" || fail "--state dead lists b: $out"
grep -Eq '^2 members besides this node: 1 alive, 0 suspect, 1 dead, 0 left;' <<<"$out" || fail "summary after kill: $out"
ok "the killed node is shown dead"

set +e
err=$(gn_cli "$A" members --frob 2>&1 >/dev/null)
rc=$?
set -e
[ $rc = 2 ] && [[ $err == *"unknown option '--frob'"*"gpunet members --help"* ]] || fail "bad flag: rc $rc: $err"
set +e
err=$(gn_cli "$A" members --state zombie 2>&1 >/dev/null)
rc=$?
set -e
[ $rc = 2 ] && [[ $err == *"unknown state 'zombie'"*"alive, suspect, dead or left"* ]] ||
  fail "bad state: rc $rc: $err"
set +e
err=$(gn_cli "$A" members extra 2>&1 >/dev/null)
rc=$?
set -e
[ $rc = 2 ] || fail "stray argument: rc $rc: $err"
gn_cli "$A" members --help | grep -q "^Usage: gpunet members" || fail "members --help"
ok "usage errors exit 2 and say why"

gn_node_start "$S" solo --listen "127.0.0.1:$(gn_free_port)" --overlay off
set +e
err=$(gn_cli "$S" members 2>&1 >/dev/null)
rc=$?
set -e
[ $rc = 1 ] && [[ $err == *"overlay = off"*"--overlay on"* ]] || fail "overlay off: rc $rc: $err"
gn_node_stop "$S"
set +e
err=$(gn_cli "$S" members 2>&1 >/dev/null)
rc=$?
set -e
[ $rc = 1 ] && [[ $err == *"is it running?"* ]] || fail "no daemon: rc $rc: $err"
ok "overlay off and no daemon: exit 1 with the reason"

echo "PASS ($pass checks)"
