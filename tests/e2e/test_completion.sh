#!/usr/bin/env bash
# gpunet completion bash: the script it prints loads in bash, and its
# completion function offers the commands for `gpunet <TAB>`, each command's
# own options for `gpunet rent --<TAB>` (read from the command's getopt table,
# so checked here against `gpunet rent --help`), directories after
# --data-dir, nothing of gpunet's after a job's "--"; other shells are a
# usage error. Needs no daemon.
set -euo pipefail
G=${GN_BUILD_DIR:?}/gpunet
tmp=$(mktemp -d /tmp/gn-completion.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$G" --data-dir "$tmp/d" completion bash >"$tmp/gpunet.bash" || fail "completion bash exited $?"
bash -n "$tmp/gpunet.bash" || fail "the script is not valid bash"
# SC2207 (COMPREPLY=($(compgen ...))) is the completion idiom: the words have no spaces.
if command -v shellcheck >/dev/null; then
  shellcheck -s bash -e SC2207 "$tmp/gpunet.bash" || fail "shellcheck finds fault with the script"
fi
# shellcheck disable=SC1091
source "$tmp/gpunet.bash"
complete -p gpunet | grep -q -- '-F _gpunet' || fail "no completion registered for gpunet"

# Completes the words of $1 (the last one being completed); prints the
# offered words sorted, one a line.
offer() {
  read -r -a COMP_WORDS <<<"$1"
  [[ $1 == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _gpunet
  printf '%s\n' "${COMPREPLY[@]}" | sort
}

# gpunet <TAB>: every command of `gpunet help`, and help.
want=$( (echo help; "$G" help | sed -n '/^Commands:/,/^$/p' | awk 'NF && !/^Commands:/ {print $1}') | sort)
[ "$(offer "gpunet ")" = "$want" ] || fail "gpunet <TAB> offered: $(offer "gpunet " | tr '\n' ' ') want $want"
for c in rent offers attest completion train invoice; do
  grep -qx "$c" <<<"$want" || fail "gpunet help does not list $c"
done
[ "$(offer "gpunet re")" = "$(printf 'release\nrent')" ] || fail "gpunet re<TAB>: $(offer "gpunet re")"
[ "$(offer "gpunet --json --data-dir /tmp i")" = "$(printf 'id\ninit\ninvoice\ninvoices')" ] ||
  fail "global options before the command: $(offer "gpunet --json --data-dir /tmp i")"
echo "ok: gpunet <TAB> offers the $(wc -l <<<"$want") commands of gpunet help"

# gpunet rent --<TAB>: rent's long options (those its --help names), --help
# and the global ones, and none of another command's.
got=$(offer "gpunet rent --")
want=$( (echo --help; echo --json; echo --data-dir
  "$G" rent --help | grep -o -- '--[a-z][a-z-]*' | grep -v -- '--help') | sort -u)
[ "$got" = "$want" ] || fail "gpunet rent --<TAB> offered: $(tr '\n' ' ' <<<"$got") want $(tr '\n' ' ' <<<"$want")"
grep -qx -- --max-spend <<<"$got" && grep -qx -- --allow-simulated <<<"$got" || fail "rent lacks its options"
grep -qx -- --image <<<"$got" && fail "rent offered run's --image"
[ "$(offer "gpunet rent o-aaaaaaaaaaaa --max-")" = "$(printf -- '--max-price\n--max-spend')" ] ||
  fail "gpunet rent --max-<TAB>: $(offer "gpunet rent o-aaaaaaaaaaaa --max-")"
[ "$(offer "gpunet train --gpus 2 --f")" = "--follow" ] || fail "train --f<TAB>: $(offer "gpunet train --gpus 2 --f")"
echo "ok: gpunet rent --<TAB> offers rent's $(wc -l <<<"$got") options"

# A value: nothing of gpunet's (bash's default completion), directories
# after --data-dir; after a job's "--", nothing of gpunet's either.
[ -z "$(offer "gpunet rent --gpu ")" ] || fail "offered words as --gpu's value"
mkdir "$tmp/dirA" "$tmp/dirB" && touch "$tmp/fileC"
[ "$(offer "gpunet --data-dir $tmp/")" = "$(printf '%s\n' "$tmp/dirA" "$tmp/dirB")" ] ||
  fail "--data-dir <TAB>: $(offer "gpunet --data-dir $tmp/")"
[ -z "$(offer "gpunet run l-1 --image busybox -- --")" ] || fail "completed gpunet options inside the job's command"
echo "ok: option values, --data-dir and a job's command"

# The first word after a command that names a lease or job: ids asked of
# the gpunetd of the --data-dir given before the command (a stand-in
# `gpunet` on PATH answers here, logging how it was asked; the real answer
# is checked in e2e_test_progress); invoice's subcommands, then invoice ids.
mkdir "$tmp/bin"
cat >"$tmp/bin/gpunet" <<EOS
#!/bin/sh
echo "\$*" >>"$tmp/asked"
case "\$*" in
*"completion ids leases") printf 'l-0123456789abcdef\nl-fedcba9876543210\n' ;;
*"completion ids jobs") echo j-0123456789ab ;;
*"completion ids invoices") echo i-0123456789abcdef ;;
esac
EOS
chmod +x "$tmp/bin/gpunet"
PATH=$tmp/bin:$PATH
[ "$(offer "gpunet --data-dir /srv/gn exec l-0")" = l-0123456789abcdef ] ||
  fail "gpunet exec l-0<TAB>: $(offer "gpunet --data-dir /srv/gn exec l-0")"
grep -qx -- '--data-dir /srv/gn completion ids leases' "$tmp/asked" || fail "asked: $(cat "$tmp/asked")"
for c in shell forward run release; do
  [ "$(offer "gpunet $c " | wc -l)" = 2 ] || fail "gpunet $c <TAB>: $(offer "gpunet $c ")"
done
[ "$(offer "gpunet logs ")" = j-0123456789ab ] || fail "gpunet logs <TAB>: $(offer "gpunet logs ")"
[ "$(offer "gpunet invoice ")" = "$(printf 'audit\nexport\nshow')" ] || fail "gpunet invoice <TAB>: $(offer "gpunet invoice ")"
[ "$(offer "gpunet invoice show ")" = i-0123456789abcdef ] || fail "invoice show <TAB>: $(offer "gpunet invoice show ")"
: >"$tmp/asked"
[ -z "$(offer "gpunet exec l-0123456789abcdef ")" ] && [ ! -s "$tmp/asked" ] ||
  fail "ids offered past the first word: $(offer "gpunet exec l-0123456789abcdef ")"
echo "ok: lease, job and invoice ids from the node of --data-dir, invoice's subcommands"
# The real `gpunet completion ids` with no daemon: nothing, exit 0; a kind
# it does not know: a usage error.
[ -z "$("$G" --data-dir "$tmp/d" completion ids leases)" ] || fail "ids without a daemon printed something"
set +e
"$G" --data-dir "$tmp/d" completion ids peers >/dev/null 2>&1; rc=$?
set -e
[ $rc = 2 ] || fail "completion ids peers: rc $rc"

set +e
"$G" --data-dir "$tmp/d" completion zsh >"$tmp/out" 2>"$tmp/err"; rc=$?
set -e
[ $rc = 2 ] && grep -q "only bash" "$tmp/err" || fail "completion zsh: rc $rc, $(cat "$tmp/err")"
echo "ok: completion for another shell is a usage error"
