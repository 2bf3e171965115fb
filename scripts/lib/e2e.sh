# Shell helpers shared by the e2e tests (tests/e2e/test_*.sh): the skip
# check, the work folder and its cleanup, ok/fail reporting, a registry on
# loopback with a busybox image, the bootstrap/provider/requester daemons,
# waiting for an offer and renting. Source it (it sources common.sh and
# nodes.sh beside it); it defines functions only. The variables they set are
# the tests' own vocabulary: work, nodes, R, P, pass, keep, reg_port, image,
# p_boot, p_prov, p_req, prov_args, lease.

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
. "$(dirname "${BASH_SOURCE[0]}")/nodes.sh"

# The registry script, found beside this file (scripts/lib/../registry).
gn_e2e_registry_cmd() {
  "$(dirname "${BASH_SOURCE[0]}")/../registry" "$@"
}

# gn_e2e_need_root_runc: exits 77 (skip, saying why) unless this runs as
# root with runc on PATH: the provider runs its jobs with runc.
gn_e2e_need_root_runc() {
  if [ "$(id -u)" -ne 0 ] || ! command -v runc >/dev/null; then
    echo "SKIP: needs root and runc"
    exit 77
  fi
}

# gn_e2e_need_tools CMD...: exits 77 (skip, naming them: "needs curl and
# jq") unless every CMD is on PATH.
gn_e2e_need_tools() {
  local c list=$1 i
  for c in "$@"; do
    command -v "$c" >/dev/null && continue
    for ((i = 2; i < $#; i++)); do list+=", ${!i}"; done
    [ $# -gt 1 ] && list+=" and ${!#}"
    echo "SKIP: needs $list"
    exit 77
  done
}

# gn_e2e_need_promtool: exits 77 unless promtool (the metrics tests' format
# check) is on PATH.
gn_e2e_need_promtool() {
  command -v promtool >/dev/null || {
    echo "SKIP: needs promtool (Debian package prometheus; scripts/deps installs it)"
    exit 77
  }
}

# gn_e2e_setup TAG NODE...: makes the work folder $work
# (/tmp/gn-e2e-TAG-XXXXXX, mode 711: jobs run as unprivileged uids and must
# reach their roots below), the nodes' data dirs go under $nodes (R and P
# name the requester's and the provider's), pass=0. On exit it stops each
# NODE (in that order) and the registry if one was started, and removes
# $work unless keep=1 (fail sets it). fail prints the NODEs' logs.
gn_e2e_setup() {
  local tag=$1
  shift
  gn_e2e_nodes=("$@")
  work=$(mktemp -d "/tmp/gn-e2e-$tag-XXXXXX")
  chmod 711 "$work"
  nodes=$work/nodes
  R=$nodes/requester
  P=$nodes/provider
  pass=0
  keep=0
  trap gn_e2e_cleanup EXIT
}

gn_e2e_cleanup() {
  set +e
  local n
  for n in "${gn_e2e_nodes[@]}"; do gn_node_stop "$nodes/$n"; done
  [ -d "$work/registry" ] && gn_e2e_registry_cmd stop "$work/registry"
  if [ "${keep:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}

# fail WHAT: the test fails: keeps $work, prints the nodes' last log lines.
fail() {
  keep=1
  echo "FAIL: $*" >&2
  local n
  for n in "${gn_e2e_nodes[@]}"; do
    echo "--- $n log" >&2
    tail -n 30 "$nodes/$n/gpunetd.log" >&2 || true
  done
  exit 1
}

# ok WHAT: one more check passed.
ok() {
  pass=$((pass + 1))
  echo "ok $pass - $*"
}

# now_ms: the wall clock in milliseconds.
now_ms() { date +%s%3N; }

# wait_for LIMIT_S WHAT CMD...: polls CMD every 0.2 s until it succeeds;
# fails the test saying WHAT when LIMIT_S pass first.
wait_for() {
  local end=$(($(now_ms) + $1 * 1000)) what=$2
  shift 2
  while [ "$(now_ms)" -lt "$end" ]; do
    "$@" && return 0
    sleep 0.2
  done
  "$@" || fail "$what (after $1 s)"
}

# gn_e2e_registry_start: a registry on a free loopback port, its data in
# $work/registry; sets reg_port. Returns non-zero when it did not start.
gn_e2e_registry_start() {
  reg_port=$(gn_free_port)
  gn_e2e_registry_cmd start "$work/registry" "$reg_port" >/dev/null
}

# gn_e2e_registry NAME:TAG: gn_e2e_registry_start, then a busybox image
# pushed as NAME:TAG; sets image to its reference.
gn_e2e_registry() {
  gn_e2e_registry_start || fail "the registry did not start"
  gn_e2e_registry_cmd build-busybox "$work/image" "$1" "$reg_port" >/dev/null || fail "cannot push $1"
  image=127.0.0.1:$reg_port/$1
}

# gn_e2e_start_bootstrap: a bootstrap node on a free port (p_boot); the
# provider and requester started after it find each other through it.
gn_e2e_start_bootstrap() {
  p_boot=$(gn_free_port)
  gn_node_start "$nodes/bootstrap" bootstrap --listen "127.0.0.1:$p_boot"
}

# gn_e2e_start_provider ARGS...: the provider in $P on a free port
# (p_prov), one simulated RTX 4090 at 0.50/h, bootstrapped from p_boot if
# a bootstrap node was started, with ARGS added. Its flags stay in
# prov_args, to start it again.
gn_e2e_start_provider() {
  p_prov=$(gn_free_port)
  prov_args=(--listen "127.0.0.1:$p_prov")
  [ -z "${p_boot:-}" ] || prov_args+=(--bootstrap "127.0.0.1:$p_boot")
  prov_args+=(--provide --price 0.50 --simulate-gpu "RTX 4090" "$@")
  gn_node_start "$P" provider "${prov_args[@]}"
}

# gn_e2e_compat_flags: sets gn_e2e_compat to the options of newer builds
# that a test passes where the build has them: registries on loopback are
# refused unless the provider allowlists them, and a host without working
# user namespaces provides only when told to.
gn_e2e_compat_flags() {
  local help
  help=$("$GN_BIN/gpunetd" --help)
  gn_e2e_compat=()
  if grep -q -- --registry-allow <<<"$help"; then gn_e2e_compat+=(--registry-allow 127.0.0.1); fi
  if grep -q -- --allow-no-userns <<<"$help"; then gn_e2e_compat+=(--allow-no-userns); fi
}

# gn_e2e_start_requester: the requester in $R on a free port (p_req),
# bootstrapped from the bootstrap node, else from the provider.
gn_e2e_start_requester() {
  p_req=$(gn_free_port)
  gn_node_start "$R" requester --listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:${p_boot:-$p_prov}"
}

# gn_e2e_wait_offer TIMEOUT_S: fails unless an offer reaches the requester
# in time.
gn_e2e_wait_offer() {
  gn_wait_until "$1" "offer relayed to the requester" gn_has_offer "$R" || fail "no offer reached the requester"
}

# gn_e2e_rent ARGS...: the requester rents one simulated RTX 4090 for an
# hour (ARGS added, e.g. --no-attest); sets lease, fails without one.
gn_e2e_rent() {
  lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated "$@" | jq -r .lease.id)
  [[ $lease == l-* ]] || fail "rent gave no lease id: $lease"
}
