#!/usr/bin/env bash
# The gpunet commands that need no daemon: init creates a private identity,
# id is stable, init never overwrites a key, audit rejects a non-invoice,
# usage errors exit 2 while an unreachable daemon exits 1 with a hint, and the
# global options work after the command as well as before it.
set -euo pipefail
G=${GN_BUILD_DIR:?}/gpunet
tmp=$(mktemp -d /tmp/gn-cli-offline.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
d=$tmp/data
fail() { echo "FAIL: $*" >&2; exit 1; }

id1=$("$G" --data-dir "$d" init 2>"$tmp/init.err") || fail "init exited $?"
[[ $id1 =~ ^gn[a-z2-7]{56}$ ]] || fail "init printed '$id1', not a node id"
[ "$(stat -c %a "$d")" = 700 ] || fail "data dir mode $(stat -c %a "$d")"
[ "$(stat -c %a "$d/identity.key")" = 600 ] || fail "identity.key mode $(stat -c %a "$d/identity.key")"
[ "$(stat -c %a "$d/gpunet.conf")" = 600 ] || fail "gpunet.conf mode"
grep -q "^#price = 0.40" "$d/gpunet.conf" || fail "config lacks the commented defaults"

[ "$("$G" --data-dir "$d" id)" = "$id1" ] || fail "id differs from init's"
[ "$("$G" --data-dir "$d" id)" = "$id1" ] || fail "id differs the second time"
"$G" --data-dir "$d" --json id | grep -q "\"node_id\": \"$id1\"" || fail "--json id"

key_before=$(sha256sum "$d/identity.key")
set +e
"$G" --data-dir "$d" init >"$tmp/out" 2>"$tmp/err"; rc=$?
set -e
[ $rc = 1 ] || fail "second init exited $rc, want 1"
grep -q "refusing to overwrite" "$tmp/err" || fail "second init said: $(cat "$tmp/err")"
echo "junk = 1" >"$d/gpunet.conf"
[ "$("$G" --data-dir "$d" init --force 2>/dev/null)" = "$id1" ] || fail "init --force changed the id"
[ "$(sha256sum "$d/identity.key")" = "$key_before" ] || fail "init --force touched the key"
grep -q "^#listen" "$d/gpunet.conf" || fail "init --force did not rewrite the config"

chmod 644 "$d/identity.key"
set +e
"$G" --data-dir "$d" id >/dev/null 2>"$tmp/err"; rc=$?
set -e
[ $rc = 1 ] && grep -q "chmod 600" "$tmp/err" || fail "a world-readable key was used (rc $rc: $(cat "$tmp/err"))"
chmod 600 "$d/identity.key"

echo '{"hello": "world"}' >"$tmp/not-invoice.json"
set +e
out=$("$G" invoice audit "$tmp/not-invoice.json" 2>&1); rc=$?
set -e
[ $rc = 2 ] || fail "audit of a non-invoice exited $rc, want 2 (not an export)"
[[ $out == "audit FAILED: "*"not a gpunet invoice export"* ]] || fail "audit said: $out"
echo 'not json at all' >"$tmp/garbage"
set +e
out=$("$G" --json invoice audit "$tmp/garbage"); rc=$?
set -e
[ $rc = 2 ] && [[ $out == *'"ok": false'* ]] || fail "--json audit of garbage: rc $rc: $out"

set +e
"$G" frobnicate >/dev/null 2>&1; rc=$?
[ $rc = 2 ] || fail "unknown command exited $rc, want 2"
"$G" offers 'vrm>=24' >/dev/null 2>&1; rc=$?
[ $rc = 2 ] || fail "bad filter exited $rc, want 2"
"$G" rent --hours 2 >/dev/null 2>&1; rc=$?
[ $rc = 2 ] || fail "rent without offer exited $rc, want 2"
"$G" --data-dir "$d" status >/dev/null 2>"$tmp/err"; rc=$?
set -e
[ $rc = 1 ] || fail "status without daemon exited $rc, want 1"
grep -q "cannot reach gpunetd at $d/gpunetd.sock: is it running? (start it with: gpunetd --data-dir $d)" "$tmp/err" ||
  fail "status without daemon said: $(cat "$tmp/err")"
# Global options after the command (and both orders) mean the same.
d2=$tmp/data2
id2=$("$G" init --data-dir "$d2" 2>/dev/null) || fail "init --data-dir D exited $?"
[[ $id2 =~ ^gn[a-z2-7]{56}$ ]] && [ -f "$d2/identity.key" ] || fail "init --data-dir D made no identity in D"
[ "$("$G" id --data-dir "$d2")" = "$id2" ] || fail "id --data-dir D"
[ "$("$G" --data-dir "$d2" id)" = "$id2" ] || fail "--data-dir D id"
"$G" id --json --data-dir="$d2" | grep -q "\"node_id\": \"$id2\"" || fail "id --json --data-dir=D"
"$G" --json id --data-dir "$d2" | grep -q "\"node_id\": \"$id2\"" || fail "--json id --data-dir D"
set +e
"$G" status --json --data-dir "$d2" >/dev/null 2>"$tmp/err"; rc=$?
set -e
[ $rc = 1 ] && grep -q "cannot reach gpunetd at $d2/gpunetd.sock" "$tmp/err" ||
  fail "status --json --data-dir D: rc $rc: $(cat "$tmp/err")"
set +e
"$G" status --bogus --data-dir "$d2" >/dev/null 2>"$tmp/err"; rc=$?
set -e
[ $rc = 2 ] && grep -q "gpunet status: unknown option '--bogus'" "$tmp/err" ||
  fail "status --bogus: rc $rc: $(cat "$tmp/err")"
set +e
"$G" init --data-dir >/dev/null 2>"$tmp/err"; rc=$?
set -e
[ $rc = 2 ] && grep -q "option '--data-dir' needs a directory" "$tmp/err" ||
  fail "init --data-dir without a value: rc $rc: $(cat "$tmp/err")"
"$G" status --version | grep -q "^gpunet " || fail "status --version"

"$G" --version | grep -q "^gpunet " || fail "--version"
"$G" help rent | grep -q -- "--hours" || fail "help rent"
echo "ok"
