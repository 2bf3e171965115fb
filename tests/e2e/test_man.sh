#!/usr/bin/env bash
# scripts/docs/man (cmake target man): help2man writes gpunet.1 and gpunetd.8
# from the programs' own --help; both render without roff warnings, gpunet.1
# lists every command of `gpunet help` and has each command's own --help
# (its Usage line) under COMMAND DETAILS, gpunetd.8 names every option of
# gpunetd --help. Skips without help2man or the built programs.
set -euo pipefail
B=${GN_BUILD_DIR:?}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
command -v help2man >/dev/null || { echo "skip: help2man not installed"; exit 77; }
if [ ! -x "$B/gpunet" ] || [ ! -x "$B/gpunetd" ]; then
  echo "skip: gpunet or gpunetd not built in $B"
  exit 77
fi
tmp=$(mktemp -d /tmp/gn-man.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$SRC/scripts/docs/man" "$B" "$tmp" >/dev/null || fail "scripts/docs/man exited $?"
if [ ! -s "$tmp/gpunet.1" ] || [ ! -s "$tmp/gpunetd.8" ]; then fail "no man pages written"; fi
export LC_ALL=C.UTF-8 MANWIDTH=200
# Renders $1 as text (man -l, else groff), roff warnings into $2.
render() {
  if command -v man >/dev/null; then
    man --warnings -l "$1" 2>"$2"
  elif command -v groff >/dev/null; then
    groff -man -Tutf8 -ww "$1" 2>"$2"
  else
    echo "skip: neither man nor groff, pages checked as source only" >&2
    cat "$1"
    : >"$2"
  fi
}
render "$tmp/gpunet.1" "$tmp/w1" >"$tmp/gpunet.txt"
render "$tmp/gpunetd.8" "$tmp/w8" >"$tmp/gpunetd.txt"
[ ! -s "$tmp/w1" ] || fail "gpunet.1 renders with warnings: $(cat "$tmp/w1")"
[ ! -s "$tmp/w8" ] || fail "gpunetd.8 renders with warnings: $(cat "$tmp/w8")"
grep -q '^GPUNET(1)' "$tmp/gpunet.txt" || fail "gpunet.1 has no GPUNET(1) header"
grep -q '^GPUNETD(8)' "$tmp/gpunetd.txt" || fail "gpunetd.8 has no GPUNETD(8) header"

# Pipes into grep -q or grep -m1 are avoided: under pipefail the writer's
# SIGPIPE, when grep stops reading first, fails the test (it did in CI).
page=$(tr -s ' ' <"$tmp/gpunet.txt")
cmds=$("$B/gpunet" help | sed -n '/^Commands:/,/^$/p' | awk 'NF && !/^Commands:/ {print $1}')
[ "$(wc -l <<<"$cmds")" -ge 15 ] || fail "gpunet help lists only: $cmds"
for c in $cmds; do
  # In the command list: the name as a tag of its own (help2man's tagged
  # paragraphs, 7 columns in), then under COMMAND DETAILS its heading and usage.
  grep -Eq "^ {7}$c( |$)" "$tmp/gpunet.txt" || fail "command $c missing from the command list"
  grep -Eq "^ +gpunet $c\$" "$tmp/gpunet.txt" || fail "no COMMAND DETAILS heading for $c"
  usage=$("$B/gpunet" "$c" --help 2>&1 | awk '/^Usage:/ && !done { print; done = 1 }' | tr -s ' ')
  [ -n "$usage" ] || fail "gpunet $c --help has no Usage line"
  grep -qF -- "$usage" <<<"$page" || fail "gpunet.1 lacks '$usage'"
done
grep -q 'init --systemd' "$tmp/gpunet.txt" || fail "init --systemd is not in gpunet.1"

opts=$("$B/gpunetd" --help | grep -Eo '^ +--[a-z-]+' | tr -d ' ' | sort -u)
[ "$(wc -l <<<"$opts")" -ge 5 ] || fail "gpunetd --help lists only: $opts"
for o in $opts; do
  grep -Eq -- "^ +$o( |$)" "$tmp/gpunetd.txt" || fail "gpunetd.8 lacks option $o"
done
echo "ok: man pages ($(wc -l <<<"$cmds") commands, $(wc -l <<<"$opts") gpunetd options)"
