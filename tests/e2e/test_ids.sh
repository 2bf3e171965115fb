#!/usr/bin/env bash
# Hostile identifiers against a real gpunetd: the gpunet command refuses them
# with a clear usage error before any request, the control API answers 400
# (or 404 where no route matches) with a clear error whatever a client sends,
# the daemon stays up, and nothing outside the data directory changes (a
# canary file and a victim directory beside it are checked byte for byte).
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

if ! curl --help all 2>/dev/null | grep -q -- --unix-socket; then
  echo "SKIP: this curl has no --unix-socket"
  exit 77
fi

# tmp holds the data dir, a canary and a victim beside it, nothing else.
gn_e2e_setup ids data
tmp=$nodes
d=$nodes/data
mkdir -p "$tmp"

# Beside the data dir: what a traversal would reach first.
echo "canary $$" >"$tmp/canary"
mkdir -p "$tmp/victim/x" "$tmp/jobs"
echo "keep me" >"$tmp/victim/x/file"
echo "keep me too" >"$tmp/jobs/x.log"
# The data dir exists before the snapshot (its creation would change the
# parent's mtime); new names beside it still show in the list.
mkdir -p "$d"
snapshot() { (cd "$tmp" && find . -mindepth 1 -path ./data -prune -o -print0 | sort -z | xargs -0 stat -c '%n %s %a %Y' && cat canary victim/x/file jobs/x.log); }
before=$(snapshot)

gn_node_start "$d" node --listen "127.0.0.1:$(gn_free_port)"
sock=$d/gpunetd.sock

# expect_cli WHAT CMD...: the gpunet command must exit 2 (usage) and say the
# id is not one, without a request (so also without a daemon answer).
expect_cli() {
  local what=$1 out rc
  shift
  set +e
  out=$("$GN_BIN/gpunet" "$@" 2>&1)
  rc=$?
  set -e
  [ $rc = 2 ] || fail "$what: exit $rc, want 2: $out"
  grep -q "is not a .* id: ids are 1 to 64 letters, digits" <<<"$out" || fail "$what: unclear error: $out"
  if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' <<<"$out"; then fail "$what: control byte echoed: $out"; fi
  ok "$what"
}
expect_cli "gpunet logs '../../x'" --data-dir "$d" logs '../../x'
expect_cli "gpunet stop '../x'" --data-dir "$d" stop '../x'
expect_cli "gpunet invoice show '..'" --data-dir "$d" invoice show '..'
expect_cli "gpunet invoice export '..'" --data-dir "$d" invoice export '..' --out "$tmp/out.json"
expect_cli "gpunet release '../..' (--data-dir after the command)" release '../..' --data-dir "$d"
expect_cli "gpunet run '.' --image ..." --data-dir "$d" run '.' --image 127.0.0.1:1/x:1 -- true
expect_cli "gpunet rent 'o-1/../x'" --data-dir "$d" rent 'o-1/../x' --hours 1
expect_cli "gpunet attest '-x'" --data-dir "$d" attest -- '-x'
expect_cli "gpunet logs with a newline and escape" --data-dir "$d" logs $'a\n\e[2J'
expect_cli "gpunet stop with a 65-byte id" --data-dir "$d" stop "$(printf 'a%.0s' $(seq 65))"
[ ! -e "$tmp/out.json" ] || fail "invoice export wrote a file for a refused id"

set +e
out=$("$GN_BIN/gpunet" --data-dir "$d" run l-1 --image 127.0.0.1:1/x:1 --env '../x=1' -- true 2>&1)
rc=$?
set -e
[ $rc = 2 ] && grep -q -- "--env wants NAME=VALUE" <<<"$out" || fail "run --env '../x=1': rc $rc: $out"
ok "gpunet run --env with a bad name"

# api METHOD PATH [BODY]: prints "STATUS BODY" of a raw request, the path
# sent as is (no client-side dot-segment removal).
api() {
  local args=(-s --path-as-is --unix-socket "$sock" -X "$1" -w ' %{http_code}' "http://gpunetd$2")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' --data-binary "$3")
  curl "${args[@]}"
}
# expect_api WANT PATTERN METHOD PATH [BODY]
expect_api() {
  local want=$1 pat=$2 out
  shift 2
  out=$(api "$@") || fail "$1 $2: curl failed"
  [ "${out##* }" = "$want" ] || fail "$1 $2: status ${out##* }, want $want: $out"
  grep -q -- "$pat" <<<"$out" || fail "$1 $2: answer lacks '$pat': $out"
  ok "API $1 $2 ${3:-} -> $want"
}
bad_id="is not a valid id"
expect_api 400 "$bad_id" GET '/v1/jobs/../logs'
expect_api 400 "$bad_id" GET '/v1/jobs/%2e%2e/logs?offset=0'
expect_api 400 "$bad_id" POST '/v1/jobs/../stop'
expect_api 400 "$bad_id" GET '/v1/jobs/.'
expect_api 400 "$bad_id" DELETE '/v1/leases/..'
expect_api 400 "$bad_id" GET '/v1/leases/a%0ab'
expect_api 400 "$bad_id" GET '/v1/invoices/..'
expect_api 400 "$bad_id" GET '/v1/invoices/a.b/export'
expect_api 400 "$bad_id" GET '/v1/invoices/-x'
expect_api 404 "no such endpoint" GET '/v1/jobs/..%2f..%2fx/logs'
expect_api 404 "no such endpoint" POST '/v1/jobs/a%2fb/stop'
expect_api 400 "role must be provider or requester" GET '/v1/invoices/i-1?role=x%27%20OR%201'
expect_api 400 "lease is not a valid lease id" POST /v1/jobs '{"lease": "../..", "image": "127.0.0.1:1/x:1", "cmd": ["true"]}'
expect_api 400 "does not start with a variable name" POST /v1/jobs \
  '{"lease": "l-1", "image": "127.0.0.1:1/x:1", "cmd": ["true"], "env": ["1X=2"]}'
expect_api 400 "offer is not a valid offer id" POST /v1/leases '{"offer": "../x", "hours": 1}'
expect_api 400 "target is not a valid" POST /v1/attest '{"target": ".."}'
# Valid ids still get through to the handlers (which find nothing here), and
# an id given as null is an id not given (what `rent --gpu` sends).
expect_api 404 "no offer for RTX 4090" POST /v1/leases '{"offer": null, "gpu": "RTX 4090", "hours": 1}'
set +e
out=$("$GN_BIN/gpunet" --data-dir "$d" rent --gpu "RTX 4090" --hours 1 2>&1)
rc=$?
set -e
[ $rc = 1 ] && grep -q "no offer for RTX 4090" <<<"$out" || fail "rent --gpu: rc $rc: $out"
ok "gpunet rent --gpu reaches the daemon (no offer id given is not a bad one)"
expect_api 404 "no job j-0123456789ab" GET '/v1/jobs/j-0123456789ab/logs'
expect_api 404 "no lease l-00c0ffee00c0ffee" GET '/v1/leases/l-00c0ffee00c0ffee'
expect_api 404 "no invoice i-0011" GET '/v1/invoices/i-0011'

"$GN_BIN/gpunet" status --data-dir "$d" >/dev/null || fail "gpunetd is not answering after the hostile requests"
ok "gpunetd still answers"
gn_node_stop "$d"
after=$(snapshot)
[ "$before" = "$after" ] || fail "something outside the data dir changed: $(diff <(echo "$before") <(echo "$after"))"
ok "nothing outside the data dir changed (canary, victim dir, a jobs/x.log beside it)"
echo "$pass passed, 0 failed"
