# Shell helpers for running local gpunet networks (the demo and the e2e
# tests): free ports, starting and stopping daemons, waiting on conditions.
# Source it after common.sh; it defines functions only. Needs GN_BIN (the
# folder holding gpunetd and gpunet).

# gn_free_port: prints a TCP port on 127.0.0.1 that nothing listens on.
gn_free_port() {
  local p lo=32768 base=10000 span
  # Below the kernel's ephemeral range, so that no outgoing connection's
  # source port (any process's) takes it between this check and the bind.
  read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
  span=$((lo - base))
  if [ "$span" -lt 2000 ]; then # an unusual range: the old choice
    base=20000
    span=30000
  fi
  for _ in $(seq 200); do
    p=$((base + RANDOM % span))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# gn_cli DIR ARGS...: runs the gpunet CLI against the node in DIR.
gn_cli() {
  local dir=$1
  shift
  "$GN_BIN/gpunet" --data-dir "$dir" "$@"
}

# gn_node_start DIR NAME ARGS...: creates the node's identity if needed and
# starts gpunetd in the background, logging to DIR/gpunetd.log; waits for its
# control socket. The pid goes to DIR/gpunetd.pid.
gn_node_start() {
  local dir=$1 name=$2
  shift 2
  mkdir -p "$dir"
  [ -f "$dir/identity.key" ] || gn_cli "$dir" init >/dev/null || gn_die "cannot create the identity of $name"
  "$GN_BIN/gpunetd" --data-dir "$dir" "$@" >"$dir/gpunetd.log" 2>&1 &
  echo $! >"$dir/gpunetd.pid"
  for _ in $(seq 100); do
    if gn_cli "$dir" status >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$(cat "$dir/gpunetd.pid")" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 20 "$dir/gpunetd.log" >&2
  gn_die "$name did not start (log: $dir/gpunetd.log)"
}

# gn_node_stop DIR: SIGTERM, then SIGKILL after 10 s.
gn_node_stop() {
  local dir=$1 pid
  [ -f "$dir/gpunetd.pid" ] || return 0
  pid=$(cat "$dir/gpunetd.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/gpunetd.pid"
}

# gn_node_kill DIR: kills gpunetd in DIR with SIGKILL (a crash: nothing
# flushed, nothing ended) and returns once the process is gone, reaped when
# it is this shell's child. Until then its listening socket may still hold
# the port a restart binds: the kernel closes a dead process's files after
# it tears down its namespaces (a test that waited for its mounts to go
# restarted into "Address already in use").
gn_node_kill() {
  local dir=$1 pid
  [ -f "$dir/gpunetd.pid" ] || return 0
  pid=$(cat "$dir/gpunetd.pid")
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for _ in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  rm -f "$dir/gpunetd.pid"
}

# gn_wait_until TIMEOUT_S WHAT CMD...: runs CMD every 0.2 s until it succeeds.
gn_wait_until() {
  local limit=$1 what=$2
  shift 2
  for ((i = 0; i < limit * 5; i++)); do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  gn_note "timed out after ${limit}s waiting for $what"
  return 1
}

# gn_has_offer DIR: the node in DIR knows at least one offer.
gn_has_offer() {
  [ "$(gn_cli "$1" --json offers | jq '.offers | length')" -gt 0 ]
}
