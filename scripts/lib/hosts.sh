# shellcheck shell=bash disable=SC2034
# Network-namespace "hosts" for the multi-host e2e tests (tests/e2e/
# test_train*.sh): each host is a network namespace with lo and one veth
# (eth0) to a bridge that lives in a parent namespace, the "net". All hosts
# share one /24 (default 10.250.0.0/24, host N at .N); the net itself holds
# .254 on the bridge (every host's default route, the way "out") and
# 198.51.100.1/32, a stand-in for the internet that every host reaches
# through that route. Optional tc shaping per host (RATE on both directions
# of its link, DELAY on its way out: netem, or where the kernel has none a
# user-space relay, hosts_delay_user). Nothing is added to the caller's own
# namespace: deleting the namespaces removes every interface.
#
# Processes are started inside a host with nsenter --net (not `ip netns
# exec`, which also remounts /sys in a new mount namespace and so hides the
# cgroup tree a provider limits its jobs with). Unix sockets are not
# namespaced: `gpunet --data-dir DIR` reaches a daemon in any host.
#
# Source it after e2e.sh (it uses gn_cli and gn_die); it defines functions
# only. Needs root, ip (iproute2), nsenter (util-linux), tc for shaping.
#   hosts_need                  exit 77 saying why unless the above are here
#   hosts_init [NET]            the net (NET = first three octets, default
#                               10.250.0); chains hosts_cleanup onto the EXIT trap
#   hosts_add NAME [RATE[:DELAY]]   a host at NET.<next>; sets hosts_ip[NAME]
#   hosts_exec NAME CMD...      runs CMD in NAME's network namespace
#   hosts_bg NAME LOG CMD...    the same in the background (setsid), pid in $!
#                               and remembered, killed by hosts_cleanup
#   hosts_node_start NAME DIR LABEL ARGS...  gpunetd in host NAME (like gn_node_start)
#   hosts_registry_start NAME DIR PORT       docker-registry on NAME's 0.0.0.0:PORT
#   hosts_tcp_open NAME ADDR PORT           from NAME, a TCP connect to ADDR:PORT
#                               succeeds (or is refused: the address answered)
#   hosts_listen NAME PORT      a TCP listener in NAME on 0.0.0.0:PORT (for probes)
#   hosts_market N [GPUS]       the marketplace on hosts: "hub" (registry with
#                               busybox, bootstrap node), providers p1..pN
#                               (GPUS simulated RTX 4090s each, default 1, 0.50/h,
#                               the hub allowlisted; extra flags from the array
#                               prov_extra_pK if set), requester "req"; needs
#                               gn_e2e_setup's $work/$nodes; sets hub, port,
#                               reg_port, image (busybox by digest), R; a host
#                               named in hosts_shape (e.g. hosts_shape[p3]=
#                               1gbit:40ms) is shaped as by hosts_add
#   hosts_provider_start pK     starts provider pK again, same flags
#   hosts_leases_active DIR     how many leases the node in DIR holds active
#   hosts_no_lease_active       no node of hosts_market (requester, providers)
#                               holds an active lease
#   hosts_train_image           the training image (scripts/image/train-image,
#                               cached) pushed to the hub; sets timage
#   hosts_cleanup               stops what was started, kills what is left in
#                               the namespaces, deletes them
# The EXIT trap runs, in order: hosts_reap (every container still in the
# runtime state of a provider started here, e.g. the jobs of a provider
# killed with SIGKILL, killed and deleted), the trap set before hosts_init
# (gn_e2e_cleanup: stops the daemons, removes the work folder), hosts_cleanup.

declare -gA hosts_ip=() hosts_ns=() hosts_prov_args=() hosts_shape=()
hosts_list=()
hosts_pids=()
hosts_provider_dirs=()
hosts_net=""
hosts_prefix=""
hosts_parent=""

# hosts_need [COMMAND...]: exits 77 saying why unless this host can make
# namespace hosts and has every COMMAND named (e.g. docker-registry).
hosts_need() {
  local why="" cmd
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null || why="needs $cmd"
  done
  if [ -n "$why" ]; then
    :
  elif [ "$(id -u)" -ne 0 ]; then
    why="needs root (network namespaces)"
  elif ! command -v ip >/dev/null; then
    why="needs ip (iproute2)"
  elif ! command -v nsenter >/dev/null; then
    why="needs nsenter (util-linux)"
  elif ! ip netns add "gnh-probe-$$" 2>/dev/null; then
    why="cannot create network namespaces (ip netns add failed)"
  else
    ip netns del "gnh-probe-$$"
  fi
  if [ -n "$why" ]; then
    echo "SKIP: multi-host e2e: $why"
    exit 77
  fi
}

hosts_init() {
  hosts_net=${1:-10.250.0}
  [[ $hosts_net =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || gn_die "hosts_init: NET is three octets, e.g. 10.250.0"
  hosts_prefix="gnh$$"
  hosts_parent="$hosts_prefix-net"
  # Run hosts_cleanup after whatever the EXIT trap did already (stopping
  # the daemons first, so nothing respawns into a namespace being deleted).
  local prev
  prev=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
  # shellcheck disable=SC2064
  trap "hosts_reap; ${prev:+$prev; }hosts_cleanup" EXIT
  # A test stopped by a signal (a timeout, ^C) cleans up too: bash runs the
  # EXIT trap only when it exits, not when a signal kills it.
  trap 'exit 143' TERM
  trap 'exit 130' INT
  ip netns add "$hosts_parent" || gn_die "cannot create namespace $hosts_parent"
  ip -n "$hosts_parent" link set lo up
  ip -n "$hosts_parent" link add br0 type bridge
  ip -n "$hosts_parent" link set br0 up
  ip -n "$hosts_parent" address add "$hosts_net.254/24" dev br0
  ip -n "$hosts_parent" address add 198.51.100.1/32 dev lo
}

hosts_add() {
  local name=$1 shape=${2:-} n ns port rate delay
  [ -n "$hosts_parent" ] || gn_die "hosts_add before hosts_init"
  [[ $name =~ ^[a-z][a-z0-9]{0,7}$ ]] || gn_die "hosts_add: bad host name '$name'"
  [ -z "${hosts_ns[$name]:-}" ] || gn_die "hosts_add: host $name exists"
  n=$((${#hosts_list[@]} + 1))
  [ "$n" -le 200 ] || gn_die "hosts_add: too many hosts"
  ns="$hosts_prefix-$name"
  port="h$n-$$"
  port=${port:0:15}
  ip netns add "$ns" || gn_die "cannot create namespace $ns"
  hosts_list+=("$name")
  hosts_ns[$name]=$ns
  hosts_ip[$name]="$hosts_net.$n"
  ip -n "$ns" link set lo up
  ip -n "$hosts_parent" link add "$port" type veth peer name eth0 netns "$ns"
  ip -n "$hosts_parent" link set "$port" master br0 up
  ip -n "$ns" address add "$hosts_net.$n/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via "$hosts_net.254"
  if [ -n "$shape" ]; then
    command -v tc >/dev/null || gn_die "shaping needs tc (iproute2)"
    rate=${shape%%:*}
    delay=""
    [ "$rate" = "$shape" ] || delay=${shape#*:}
    if [ -z "$delay" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 1s
    elif ! ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "$delay" rate "$rate" limit 100000 2>/dev/null; then
      # No netem in this kernel (CONFIG_NET_SCH_NETEM off): the rate by
      # tbf, the delay in user space (hosts_delay_user).
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 1s
      hosts_delay_user "$name" "$delay"
    fi
    ip netns exec "$hosts_parent" tc qdisc add dev "$port" root tbf rate "$rate" burst 64kb latency 1s
  fi
}

# hosts_delay_user NAME DELAY: every packet host NAME sends to another host
# or out waits DELAY (like 40ms) first, without netem: its routes lead into
# a tun device (dly0) read by a small relay that holds each packet DELAY,
# then sends it on through a raw socket whose mark (1) routes by eth0
# (table 100). Addresses, ARP and local delivery are as before; routes a
# process adds later (a job network's) still win, being more specific.
hosts_delay_user() {
  local name=$1 delay=$2 ns=${hosts_ns[$1]} ip=${hosts_ip[$1]} ms i
  [[ $delay =~ ^([0-9]{1,4})ms$ ]] || gn_die "hosts_add: delay '$delay' is not whole milliseconds (like 40ms), which the netem-less fallback needs"
  ms=${BASH_REMATCH[1]}
  [ -c /dev/net/tun ] || gn_die "cannot delay host $name's link: no netem qdisc and no /dev/net/tun"
  ip -n "$ns" tuntap add dev dly0 mode tun || gn_die "cannot add a tun device to host $name"
  hosts_bg "$name" "${work:-/tmp}/delay-$name.log" python3 -c '
import collections, fcntl, os, select, socket, struct, sys, time
delay = int(sys.argv[1]) / 1000.0
fd = os.open("/dev/net/tun", os.O_RDWR)
fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", b"dly0", 0x0001 | 0x1000))  # TUNSETIFF, IFF_TUN | IFF_NO_PI
out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)  # the header as read
out.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 1)
q = collections.deque()
while True:
    wait = max(0.0, q[0][0] - time.monotonic()) if q else None
    if select.select([fd], [], [], wait)[0]:
        p = os.read(fd, 65536)
        if len(p) >= 20 and p[0] >> 4 == 4 and len(q) < 100000:
            q.append((time.monotonic() + delay, p))
    now = time.monotonic()
    while q and q[0][0] <= now:
        p = q.popleft()[1]
        try:
            out.sendto(p, (socket.inet_ntoa(p[16:20]), 0))
        except OSError:
            pass' "$ms"
  for ((i = 0; i < 50; i++)); do
    ip -n "$ns" link show dly0 | grep -q NO-CARRIER || break
    sleep 0.1
  done
  [ "$i" -lt 50 ] || gn_die "the delay relay of host $name did not attach to its tun device"
  hosts_exec "$name" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0
  ip -n "$ns" link set dly0 up
  ip -n "$ns" route add "$hosts_net.0/24" dev eth0 table 100
  ip -n "$ns" route add default via "$hosts_net.254" dev eth0 table 100
  ip -n "$ns" rule add fwmark 1 lookup 100 pref 100
  ip -n "$ns" route del default
  ip -n "$ns" route del "$hosts_net.0/24" dev eth0
  ip -n "$ns" route add "$hosts_net.0/24" dev dly0 src "$ip"
  ip -n "$ns" route add default dev dly0 src "$ip"
}

hosts_exec() {
  local name=$1
  shift
  [ -n "${hosts_ns[$name]:-}" ] || gn_die "no host $name"
  nsenter --net="/run/netns/${hosts_ns[$name]}" -- "$@"
}

hosts_bg() {
  local name=$1 log=$2
  shift 2
  [ -n "${hosts_ns[$name]:-}" ] || gn_die "no host $name"
  setsid nsenter --net="/run/netns/${hosts_ns[$name]}" -- "$@" >"$log" 2>&1 </dev/null &
  hosts_pids+=($!)
}

hosts_node_start() {
  local name=$1 dir=$2 label=$3
  shift 3
  [ -n "${hosts_ns[$name]:-}" ] || gn_die "no host $name"
  mkdir -p "$dir"
  [ -f "$dir/identity.key" ] || gn_cli "$dir" init >/dev/null || gn_die "cannot create the identity of $label"
  case " $* " in *" --provide "*) hosts_provider_dirs+=("$dir") ;; esac
  nsenter --net="/run/netns/${hosts_ns[$name]}" -- "$GN_BIN/gpunetd" --data-dir "$dir" "$@" >"$dir/gpunetd.log" 2>&1 &
  echo $! >"$dir/gpunetd.pid"
  for _ in $(seq 100); do
    if gn_cli "$dir" status >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$(cat "$dir/gpunetd.pid")" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 20 "$dir/gpunetd.log" >&2
  gn_die "$label did not start in host $name (log: $dir/gpunetd.log)"
}

hosts_registry_start() {
  local name=$1 dir=$2 port=$3
  command -v docker-registry >/dev/null || gn_die "docker-registry is not installed (apt-get install docker-registry)"
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  cat >"$dir/config.yml" <<YML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
  cache:
    blobdescriptor: ""
http:
  addr: 0.0.0.0:$port
YML
  hosts_bg "$name" "$dir/registry.log" docker-registry serve "$dir/config.yml"
  local i
  for ((i = 0; i < 150; i++)); do
    hosts_exec "$name" curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$port/v2/" && return 0
    sleep 0.1
  done
  tail -n 20 "$dir/registry.log" >&2 || true
  gn_die "registry did not answer in host $name on port $port"
}

hosts_tcp_open() {
  local name=$1 addr=$2 port=$3 out
  out=$(hosts_exec "$name" timeout 3 bash -c "exec 3<>/dev/tcp/$addr/$port" 2>&1) && return 0
  grep -q "Connection refused" <<<"$out"
}

hosts_listen() {
  local name=$1 port=$2
  hosts_bg "$name" /dev/null python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(64)
while True:
    c, _ = s.accept(); c.close()' "$port"
}

hosts_market() {
  local np=$1 ng=${2:-1} i p digest gpus=() compat=() f
  local src
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  hosts_add hub "${hosts_shape[hub]:-}"
  for ((i = 1; i <= np; i++)); do hosts_add "p$i" "${hosts_shape[p$i]:-}"; done
  hosts_add req "${hosts_shape[req]:-}"
  hub=${hosts_ip[hub]}
  port=7946 # every host has its own address: the same port everywhere
  reg_port=5000
  hosts_registry_start hub "$work/registry" "$reg_port"
  digest=$(hosts_exec hub "$src/scripts/registry" build-busybox "$work/image" e2e/busybox:1 "$reg_port") ||
    fail "cannot push the busybox image to the hub's registry"
  # By digest: a requester resolves a tag itself, over TLS unless the
  # registry is on its loopback (gn_imageref: plain_http only there), and the
  # hub is not. A digest needs no resolving; providers pull over plain HTTP
  # from an allowlisted private address.
  [[ $digest == sha256:* ]] || fail "build-busybox printed no digest: $digest"
  image=$hub:$reg_port/e2e/busybox:1@$digest
  gn_e2e_compat_flags
  for f in "${gn_e2e_compat[@]}"; do [ "$f" = 127.0.0.1 ] || [ "$f" = --registry-allow ] || compat+=("$f"); done
  for ((i = 0; i < ng; i++)); do gpus+=(--simulate-gpu "RTX 4090"); done
  hosts_node_start hub "$nodes/bootstrap" bootstrap --listen "$hub:$port"
  for ((i = 1; i <= np; i++)); do
    p=p$i
    local -n extra="prov_extra_$p"
    hosts_prov_args[$p]=$(printf '%q ' --listen "${hosts_ip[$p]}:$port" --bootstrap "$hub:$port" \
      --provide --price 0.50 "${gpus[@]}" --registry-allow "$hub" ${compat[@]+"${compat[@]}"} ${extra[@]+"${extra[@]}"})
    unset -n extra
    hosts_provider_start "$p"
  done
  R=$nodes/requester
  hosts_node_start req "$R" requester --listen "${hosts_ip[req]}:$port" --bootstrap "$hub:$port"
}

hosts_provider_start() {
  local p=$1
  [ -n "${hosts_prov_args[$p]:-}" ] || gn_die "no provider $p"
  eval "hosts_node_start $p \"\$nodes/$p\" $p ${hosts_prov_args[$p]}"
}

hosts_leases_active() {
  gn_cli "$1" --json leases | jq '[.leases[] | select(.state == "active")] | length'
}

hosts_no_lease_active() {
  local d
  for d in "$R" "${hosts_provider_dirs[@]}"; do [ "$(hosts_leases_active "$d")" = 0 ] || return 1; done
}

hosts_train_image() {
  local src tdigest
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  # Built (or found in the cache) here, where the Debian mirror is
  # reachable, then pushed from inside the hub to its registry.
  "$src/scripts/image/train-image" build >"$work/train-image.log" 2>&1 ||
    fail "scripts/image/train-image build: $(tail -n 5 "$work/train-image.log")"
  tdigest=$(hosts_exec hub "$src/scripts/image/train-image" push "127.0.0.1:$reg_port" gpunet/train:1 \
    2>>"$work/train-image.log") || fail "cannot push the training image: $(tail -n 5 "$work/train-image.log")"
  [[ $tdigest == sha256:* ]] || fail "train-image push printed no digest: $tdigest"
  timage=$hub:$reg_port/gpunet/train:1@$tdigest
}

# hosts_image_hint FILE: what a failed start (its output in FILE) says about
# the training image, or nothing.
hosts_image_hint() {
  ! grep -q "is a device node; refusing the image" "$1" ||
    echo " (the training image holds device nodes that providers refuse: scripts/image/train-image must build with mmdebstrap --skip=output/dev)"
}

hosts_reap() {
  local dir id rt
  rt=$(command -v runc || command -v crun) || return 0
  for dir in "${hosts_provider_dirs[@]}"; do
    [ -d "$dir/run" ] || continue
    for id in $("$rt" --root "$dir/run" list -q 2>/dev/null); do
      "$rt" --root "$dir/run" kill "$id" KILL >/dev/null 2>&1
      "$rt" --root "$dir/run" delete -f "$id" >/dev/null 2>&1
    done
  done
  return 0
}

hosts_cleanup() {
  set +e
  local p ns name
  for p in "${hosts_pids[@]}"; do
    kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null
  done
  # Whatever still runs in a host (a job's leftovers, a wireguard-go a
  # provider did not reap) is killed by pid before its namespace goes.
  for name in "${hosts_list[@]}"; do
    ns=${hosts_ns[$name]}
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for name in "${hosts_list[@]}"; do ip netns del "${hosts_ns[$name]}" 2>/dev/null; done
  [ -z "$hosts_parent" ] || ip netns del "$hosts_parent" 2>/dev/null
  hosts_list=()
  hosts_parent=""
  return 0
}
