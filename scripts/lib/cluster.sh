# shellcheck shell=bash disable=SC2034
# A cluster of gpunetd processes for the overlay's tests and benchmarks
# (docs/overlay/daemon.md): N network-namespace hosts c1..cN made by
# scripts/lib/hosts.sh, one gpunetd each on HOSTIP:7946 (TCP sessions and
# the membership's UDP datagrams), c1 the bootstrap node of all the others,
# the next NPROV providers of one simulated RTX 4090 each (they only publish
# offers: no job runs). Every link delays and loses packets: with the
# kernel's netem, each host's eth0 delays its packets out by DELAY and loses
# LOSS percent of them; without netem (CONFIG_NET_SCH_NETEM off), the delay
# is hosts.sh's user-space relay (hosts_delay_user, through hosts_add's
# shaping; needs python3 and /dev/net/tun) and the loss an iptables rule
# dropping LOSS percent of what comes into each host (the statistic match);
# what is missing is left out and said (cluster_netem names what is used).
#
# Source it after e2e.sh and hosts.sh (it uses gn_cli, gn_die, hosts_*);
# call hosts_need and hosts_init first. Needs $work (a folder for the data
# dirs), curl and jq. Functions:
#   cluster_start N NPROV [DELAY] [LOSS]   the hosts and daemons (DELAY like
#                      20ms, default 20ms; LOSS a percentage, default 2);
#                      sets cluster_names (c1..cN), cluster_providers,
#                      cluster_netem (netem, relay+iptables, relay, iptables,
#                      none), and the
#                      maps cluster_dirs[NAME], cluster_ids[NAME]
#   cluster_pid NAME   the gpunetd pid of NAME
#   cluster_kill NAME...   SIGKILL to those daemons (their hosts stay)
#   cluster_members NAME   GET /v1/members of NAME's daemon (JSON)
#   cluster_view_ok NAME ALIVE_NAMES DEAD_NAMES   NAME's membership counts
#                      every node of ALIVE_NAMES alive and every node of
#                      DEAD_NAMES dead (space-separated host names)
#   cluster_converged ALIVE_NAMES DEAD_NAMES   cluster_view_ok for every
#                      name of ALIVE_NAMES (one pass); the first that is
#                      not goes to cluster_lagging
#   cluster_offers_ok NAME PROVIDER_NAMES   NAME's offer table (gpunet
#                      --json offers) holds an offer of each of them

declare -gA cluster_dirs=() cluster_ids=()
cluster_names=()
cluster_providers=()
cluster_netem=""
cluster_lagging=""
cluster_port=7946

cluster_start() {
  local n=$1 nprov=$2 delay=${3:-20ms} loss=${4:-2} i name shape args compat=() f
  [[ $n =~ ^[0-9]+$ && $n -ge 2 && $n -le 200 ]] || gn_die "cluster_start: N is 2..200"
  [[ $nprov =~ ^[0-9]+$ && $nprov -lt $n ]] || gn_die "cluster_start: NPROV is below N"
  [[ $loss =~ ^[0-9]+$ && $loss -le 50 ]] || gn_die "cluster_start: LOSS is a whole percentage up to 50"
  gn_e2e_compat_flags
  for f in "${gn_e2e_compat[@]}"; do [ "$f" = 127.0.0.1 ] || [ "$f" = --registry-allow ] || compat+=("$f"); done
  # netem, probed on a scratch host: hosts_add shapes with it where it can.
  hosts_add c1
  if hosts_exec c1 tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    hosts_exec c1 tc qdisc del dev lo root
    cluster_netem=netem
  else
    # The relay needs python3 and a tun device; the loss rule iptables.
    cluster_netem=""
    if command -v python3 >/dev/null && [ -c /dev/net/tun ]; then cluster_netem=relay; fi
    if command -v iptables >/dev/null && hosts_exec c1 iptables -L INPUT -n >/dev/null 2>&1; then
      cluster_netem=${cluster_netem:+$cluster_netem+}iptables
    fi
    cluster_netem=${cluster_netem:-none}
  fi
  for ((i = 1; i <= n; i++)); do
    name=c$i
    cluster_names+=("$name")
    if [ "$cluster_netem" = netem ]; then
      [ "$i" = 1 ] || hosts_add "$name"
      hosts_exec "$name" tc qdisc add dev eth0 root netem delay "$delay" loss "$loss%" limit 100000 ||
        gn_die "cannot add netem to host $name"
    else
      if [ "$i" != 1 ] && [[ $cluster_netem != relay* ]]; then
        hosts_add "$name"
      elif [ "$i" = 1 ] && [[ $cluster_netem == relay* ]]; then
        # c1 exists already: its delay relay as hosts_add would have made it.
        hosts_delay_user c1 "$delay"
      elif [ "$i" != 1 ]; then
        hosts_add "$name" "10gbit:$delay"
      fi
      if [[ $cluster_netem == *iptables ]] && [ "$loss" -gt 0 ]; then
        hosts_exec "$name" iptables -A INPUT -i eth0 -m statistic --mode random \
          --probability "$(awk -v l="$loss" 'BEGIN { printf "%.4f", l / 100 }')" -j DROP ||
          gn_die "cannot add the loss rule to host $name"
      fi
    fi
  done
  case $cluster_netem in
  relay) gn_note "cluster: no netem and no iptables here: links are delayed but lose nothing" ;;
  iptables) gn_note "cluster: no netem, python3 or /dev/net/tun here: links lose packets but are not delayed" ;;
  none) gn_note "cluster: no netem, delay relay or iptables here: links neither delay nor lose" ;;
  esac
  for ((i = 1; i <= n; i++)); do
    name=c$i
    cluster_dirs[$name]=$work/nodes/$name
    args=(--listen "${hosts_ip[$name]}:$cluster_port" --no-training)
    [ "$i" = 1 ] || args+=(--bootstrap "${hosts_ip[c1]}:$cluster_port")
    if [ "$i" -ge 2 ] && [ "$i" -le $((nprov + 1)) ]; then
      args+=(--provide --price 0.50 --simulate-gpu "RTX 4090" ${compat[@]+"${compat[@]}"})
      cluster_providers+=("$name")
    fi
    hosts_node_start "$name" "${cluster_dirs[$name]}" "$name" "${args[@]}"
    cluster_ids[$name]=$(gn_cli "${cluster_dirs[$name]}" id) || gn_die "no node id for $name"
  done
}

cluster_pid() {
  cat "${cluster_dirs[$1]}/gpunetd.pid"
}

cluster_kill() {
  local name pid
  for name in "$@"; do
    pid=$(cluster_pid "$name")
    kill -9 "$pid" 2>/dev/null || true
    # Reaped here (it is this shell's child), without bash's "Killed" line.
    wait "$pid" 2>/dev/null || true
  done
}

cluster_members() {
  curl -s --max-time 5 --unix-socket "${cluster_dirs[$1]}/gpunetd.sock" http://gpunetd/v1/members
}

cluster_view_ok() {
  local name=$1 alive=$2 dead=$3 m want ids=() x
  m=$(cluster_members "$name") || return 1
  # One jq pass: the state each listed id has in this member list.
  for x in $alive; do ids+=("${cluster_ids[$x]}=alive"); done
  for x in $dead; do ids+=("${cluster_ids[$x]}=dead"); done
  want=$(printf '%s\n' "${ids[@]}" | jq -R -s 'split("\n") | map(select(length > 0) | split("=") | {(.[0]): .[1]}) | add')
  # A node counts itself alive whether or not its list names it.
  jq -e --argjson want "$want" --arg self "${cluster_ids[$name]}" '
    (([.members[] | {(.node_id): .state}] | add // {}) + {($self): "alive"}) as $have
    | $want | to_entries | all(.value == $have[.key])' <<<"$m" >/dev/null
}

cluster_converged() {
  local alive=$1 dead=$2 name
  for name in $alive; do
    if ! cluster_view_ok "$name" "$alive" "$dead"; then
      cluster_lagging=$name
      return 1
    fi
  done
  cluster_lagging=""
}

cluster_offers_ok() {
  local name=$1 provs=$2 have p
  have=$(gn_cli "${cluster_dirs[$name]}" --json offers | jq -r '.offers[].provider' | sort -u) || return 1
  for p in $provs; do
    grep -qx "${cluster_ids[$p]}" <<<"$have" || return 1
  done
}
