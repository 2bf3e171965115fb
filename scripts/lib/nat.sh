# shellcheck shell=bash disable=SC2034
# Home-network topologies in network namespaces for the NAT tests and
# benchmark (docs/nat.md): an "inet" namespace routes between public hosts
# and NAT routers. A public host NAME (nat_add_public NAME K) sits at
# 198.18.K.2/24 behind the inet's 198.18.K.1, so every public host is in its
# own /24 (a NAT's classification wants reports from distinct /24s). A
# private host NAME (nat_add_private NAME K TYPE) sits at 10.K.0.2/24
# behind its own router namespace (10.K.0.1 on its lan, 198.18.(100+K).2
# on its wan) that masquerades what leaves by the wan:
#   cone       MASQUERADE: the source port is kept (when free) whatever the
#              destination: an address-and-port-independent mapping
#   symmetric  MASQUERADE --random-fully: every new destination gets a new
#              random port: an address-and-port-dependent mapping
# Both routers filter like home routers: a datagram or connection from the
# wan that no conntrack entry expects is dropped (so it leaves no entry
# that would take a port a later mapping needs). Namespace names carry
# this shell's pid (gnn<pid>-NAME), so tests running at once do not meet,
# and nat_cleanup (on the EXIT trap from nat_init) deletes them with every
# interface and rule inside: nothing is added to the caller's namespace.
#
# Source it after e2e.sh (gn_cli, gn_die); functions:
#   nat_need               exit 77 saying why unless root, ip, nsenter, iptables
#                          (nat table, conntrack match) and network namespaces work
#   nat_init               the inet namespace; chains nat_cleanup onto EXIT
#   nat_add_public NAME K  a public host (K 1..99); sets nat_ip[NAME]
#   nat_add_private NAME K cone|symmetric   a host behind its own NAT router
#                          (K 1..99); sets nat_ip[NAME], nat_outside[NAME]
#   nat_exec NAME CMD...   CMD in NAME's network namespace
#   nat_node_start NAME DIR ARGS...   gpunetd in NAME on nat_ip:7946 (data dir
#                          DIR, created with an identity), waits for its API
#   nat_api DIR METHOD PATH [JSON]   the daemon's control API, JSON out
#   nat_cleanup            stops the daemons, deletes the namespaces

declare -gA nat_ip=() nat_ns=() nat_outside=()
nat_prefix=""
nat__made=""
nat_inet=""
nat_dirs=()
nat_spaces=()

nat_need() {
  local why=""
  if [ "$(id -u)" -ne 0 ]; then
    why="needs root (network namespaces, iptables)"
  elif ! command -v ip >/dev/null || ! command -v nsenter >/dev/null || ! command -v iptables >/dev/null; then
    why="needs ip (iproute2), nsenter (util-linux) and iptables"
  elif ! ip netns add "gnn-probe-$$" 2>/dev/null; then
    why="cannot create network namespaces"
  else
    if ! ip netns exec "gnn-probe-$$" iptables -t nat -A POSTROUTING -o lo -j MASQUERADE --random-fully 2>/dev/null ||
      ! ip netns exec "gnn-probe-$$" iptables -A INPUT -m conntrack --ctstate NEW -j DROP 2>/dev/null; then
      why="iptables here has no nat table, MASQUERADE --random-fully or conntrack match"
    fi
    ip netns del "gnn-probe-$$"
  fi
  if [ -n "$why" ]; then
    echo "SKIP: NAT topologies: $why"
    exit 77
  fi
}

# nat_need_relay_e2e: nat_need, and jq, curl and a gpunetd with relays
# (GN_BIN); else the test is skipped (77) saying why.
nat_need_relay_e2e() {
  local cmd
  for cmd in jq curl; do
    command -v "$cmd" >/dev/null || {
      echo "SKIP: needs $cmd"
      exit 77
    }
  done
  nat_need
  "$GN_BIN/gpunetd" --help | grep -q -- --relay || {
    echo "SKIP: this gpunetd has no relay"
    exit 77
  }
}

nat_init() {
  nat_prefix="gnn$$"
  nat_inet="$nat_prefix-inet"
  local prev
  prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
  # shellcheck disable=SC2064
  trap "${prev:+$prev; }nat_cleanup" EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  ip netns add "$nat_inet" || gn_die "cannot create namespace $nat_inet"
  nat_spaces+=("$nat_inet")
  ip -n "$nat_inet" link set lo up
  ip netns exec "$nat_inet" sysctl -qw net.ipv4.ip_forward=1
}

# nat__ns NAME: a new namespace for NAME, lo up, remembered for the
# cleanup; its name in nat__made (not echoed: a command substitution's
# subshell would forget it).
nat__ns() {
  nat__made="$nat_prefix-$1"
  ip netns add "$nat__made" || gn_die "cannot create namespace $nat__made"
  nat_spaces+=("$nat__made")
  ip -n "$nat__made" link set lo up
}

# nat__link NS_A IF_A ADDR_A NS_B IF_B ADDR_B: a veth pair between them.
nat__link() {
  ip link add "$2" netns "$1" type veth peer name "$5" netns "$4" || gn_die "cannot link $1 and $4"
  ip -n "$1" address add "$3" dev "$2"
  ip -n "$4" address add "$6" dev "$5"
  ip -n "$1" link set "$2" up
  ip -n "$4" link set "$5" up
}

nat_add_public() {
  local name=$1 k=$2 ns
  [[ $name =~ ^[a-z][a-z0-9]{0,7}$ && $k =~ ^[0-9]+$ && $k -ge 1 && $k -le 99 ]] || gn_die "nat_add_public NAME K"
  nat__ns "$name"
  ns=$nat__made
  nat_ns[$name]=$ns
  nat__link "$ns" eth0 "198.18.$k.2/24" "$nat_inet" "p$k" "198.18.$k.1/24"
  ip -n "$ns" route add default via "198.18.$k.1"
  nat_ip[$name]=198.18.$k.2
  nat_outside[$name]=198.18.$k.2
}

nat_add_private() {
  local name=$1 k=$2 type=$3 ns rns masq=(-j MASQUERADE)
  [[ $name =~ ^[a-z][a-z0-9]{0,7}$ && $k =~ ^[0-9]+$ && $k -ge 1 && $k -le 99 ]] || gn_die "nat_add_private NAME K TYPE"
  case $type in
  cone) ;;
  symmetric) masq+=(--random-fully) ;;
  *) gn_die "nat_add_private: TYPE is cone or symmetric, not $type" ;;
  esac
  nat__ns "r$name"
  rns=$nat__made
  nat__ns "$name"
  ns=$nat__made
  nat_ns[$name]=$ns
  nat__link "$rns" wan "198.18.$((100 + k)).2/24" "$nat_inet" "r$k" "198.18.$((100 + k)).1/24"
  nat__link "$rns" lan "10.$k.0.1/24" "$ns" eth0 "10.$k.0.2/24"
  ip -n "$rns" route add default via "198.18.$((100 + k)).1"
  ip -n "$ns" route add default via "10.$k.0.1"
  ip netns exec "$rns" sysctl -qw net.ipv4.ip_forward=1
  ip netns exec "$rns" iptables -t nat -A POSTROUTING -o wan "${masq[@]}" || gn_die "cannot masquerade in $rns"
  ip netns exec "$rns" iptables -A INPUT -i wan -m conntrack --ctstate NEW -j DROP
  ip netns exec "$rns" iptables -A FORWARD -i wan -m conntrack --ctstate NEW -j DROP
  nat_ip[$name]=10.$k.0.2
  nat_outside[$name]=198.18.$((100 + k)).2
}

nat_exec() {
  local name=$1
  shift
  nsenter --net="/run/netns/${nat_ns[$name]}" -- "$@"
}

nat_node_start() {
  local name=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  [ -f "$dir/identity.key" ] || gn_cli "$dir" init >/dev/null || gn_die "cannot create the identity of $name"
  nat_dirs+=("$dir")
  nsenter --net="/run/netns/${nat_ns[$name]}" -- "$GN_BIN/gpunetd" --data-dir "$dir" \
    --listen "${nat_ip[$name]}:7946" "$@" >"$dir/gpunetd.log" 2>&1 &
  echo $! >"$dir/gpunetd.pid"
  for _ in $(seq 200); do
    if gn_cli "$dir" status >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$(cat "$dir/gpunetd.pid")" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 20 "$dir/gpunetd.log" >&2
  gn_die "gpunetd did not start in host $name (log: $dir/gpunetd.log)"
}

nat_api() {
  local dir=$1 method=$2 path=$3 body=${4:-}
  if [ -n "$body" ]; then
    curl -s --max-time 5 --unix-socket "$dir/gpunetd.sock" -X "$method" -H 'Content-Type: application/json' \
      -d "$body" "http://gpunetd$path"
  else
    curl -s --max-time 5 --unix-socket "$dir/gpunetd.sock" -X "$method" "http://gpunetd$path"
  fi
}

nat_cleanup() {
  set +e
  local d pid ns
  for d in "${nat_dirs[@]}"; do
    [ -f "$d/gpunetd.pid" ] || continue
    pid=$(cat "$d/gpunetd.pid")
    kill "$pid" 2>/dev/null
  done
  for d in "${nat_dirs[@]}"; do
    [ -f "$d/gpunetd.pid" ] || continue
    pid=$(cat "$d/gpunetd.pid")
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  for ns in "${nat_spaces[@]}"; do
    # Anything still inside (a stray process) goes with its namespace.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  nat_spaces=()
  nat_dirs=()
}
