#!/usr/bin/env bash
# gpunet init --systemd: writes gpunetd.service into --unit-dir from
# packaging/gpunetd.service.in with this build's gpunetd and the (made
# absolute) data directory, passes systemd-analyze verify where installed,
# rewrites an identical unit quietly, refuses a different one without --force
# (leaving it as it was), refuses paths systemd would split or expand, and
# touches no identity or config. Needs no daemon and no systemd running.
set -euo pipefail
G=${GN_BUILD_DIR:?}/gpunet
D=$(cd "$GN_BUILD_DIR" && pwd)/gpunetd
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ -x "$D" ] || { echo "skip: gpunetd not built in $GN_BUILD_DIR"; exit 77; }
tmp=$(mktemp -d /tmp/gn-systemd.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir "$tmp/units"
U=$tmp/units/gpunetd.service

out=$(cd "$tmp" && "$G" --data-dir rel/data init --systemd --unit-dir "$tmp/units" 2>"$tmp/err") ||
  fail "init --systemd exited $?: $(cat "$tmp/err")"
[ "$out" = "$U" ] || fail "printed '$out', want $U"
grep -qx "ExecStart=$D --data-dir $tmp/rel/data" "$U" || fail "ExecStart: $(grep ExecStart "$U")"
grep -q '@' "$U" && fail "a placeholder is left: $(grep '@' "$U")"
[ "$(stat -c %a "$U")" = 644 ] || fail "unit mode $(stat -c %a "$U")"
# Everything else is the template, line for line.
diff <(grep -v '^ExecStart=' "$U") <(grep -v '^ExecStart=' "$SRC/packaging/gpunetd.service.in") >/dev/null ||
  fail "the unit differs from packaging/gpunetd.service.in"
grep -q 'systemctl daemon-reload && systemctl enable --now gpunetd' "$tmp/err" || fail "no next step: $(cat "$tmp/err")"
grep -q "gpunet --data-dir $tmp/rel/data init" "$tmp/err" || fail "no hint to create the identity first"
[ ! -e "$tmp/rel" ] || fail "init --systemd created the data directory"
if command -v systemd-analyze >/dev/null; then
  # --man=no: gpunet(1) is not installed on this machine.
  systemd-analyze verify --man=no "$U" || fail "systemd-analyze verify rejects the unit"
else
  echo "skip: systemd-analyze not installed, unit not verified"
fi

# The same unit again: fine, unchanged.
"$G" --json --data-dir "$tmp/rel/data" init --systemd --unit-dir "$tmp/units" >"$tmp/j" 2>/dev/null ||
  fail "rewriting the same unit failed"
grep -q '"changed": false' "$tmp/j" || fail "same unit reported changed: $(cat "$tmp/j")"

# A different unit (another data dir) is refused and left alone, --force replaces it.
cp "$U" "$tmp/before"
if "$G" --data-dir "$tmp/other" init --systemd --unit-dir "$tmp/units" 2>"$tmp/err"; then
  fail "overwrote a different unit without --force"
fi
grep -q 'refusing to overwrite' "$tmp/err" || fail "refusal says: $(cat "$tmp/err")"
cmp -s "$U" "$tmp/before" || fail "a refused init changed the unit"
"$G" --data-dir "$tmp/other" init --systemd --force --unit-dir "$tmp/units" 2>/dev/null || fail "--force failed"
grep -qx "ExecStart=$D --data-dir $tmp/other" "$U" || fail "--force did not replace the unit"

# Paths systemd would split or expand, a missing unit dir, a gpunetd that is not there.
for dir in "$tmp/a b" "$tmp/a%n" "$tmp/\$HOME"; do
  if "$G" --data-dir "$dir" init --systemd --force --unit-dir "$tmp/units" 2>/dev/null; then
    fail "accepted data dir '$dir'"
  fi
done
grep -qx "ExecStart=$D --data-dir $tmp/other" "$U" || fail "a refused init changed the unit"
if "$G" --data-dir "$tmp/d" init --systemd --unit-dir "$tmp/nope" 2>/dev/null; then fail "missing unit dir accepted"; fi
if "$G" --data-dir "$tmp/d" init --systemd --unit-dir "$tmp/units" --gpunetd "$tmp/none" --force 2>/dev/null; then
  fail "missing gpunetd accepted"
fi
"$G" --data-dir "$tmp/d" init --unit-dir "$tmp/units" 2>/dev/null && fail "--unit-dir without --systemd accepted"
[ ! -e "$tmp/d" ] || fail "a refused init created the data directory"
echo "ok: init --systemd"
