#!/usr/bin/env bash
# The hostile-job suite: a renter attacks the provider through the real
# product (a real registry on 127.0.0.1, real gpunetd providers with
# simulated GPUs and a real requester, real runc containers), one case per
# attack of issue 6, each asserting that it is blocked. The attack binaries
# run inside the jobs: gn_probe (tests/probe/gn_probe.c, built by CMake) and
# gn_hostile (tests/e2e/hostile/gn_hostile.c: keyring puts and gets, and a
# tar of many entries; built here). Prints one line per case ("ok NAME" or "FAIL NAME: what got
# through") and ends with "N passed, M failed".
#   GN_HOSTILE_CASES="keyrings fork-bomb"   run only these cases
#   GN_HOSTILE_ENTRY_BOMB=1   also 600,000 empty files against the default
#                 500,000-entry layer limit (no config key makes it smaller,
#                 and creating 500,000 files takes the provider over a minute)
set -uo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/hostile.sh"

gn_e2e_need_root_runc

work=$(mktemp -d /tmp/gn-e2e-hostile-XXXXXX)
nodes=$work/nodes
R=$nodes/requester
P1=$nodes/p1 # RTX 4090 x3: most cases, two leases (A and B)
P2=$nodes/p2 # RTX 3090: does not allowlist the loopback registry
P3=$nodes/p3 # A100: default image limits: bombs against them, one to stop, SIGTERM
P4=$nodes/p4 # H100: a small memory budget
tag=$$-$RANDOM
# A number of this run's own, in every job command the suite finds on the
# host by its command line (gn_hostile_pid): another run of the suite at the
# same time would otherwise run the same commands, and its processes would be
# taken for this run's.
u=$((10000 + ($$ * 7919 + RANDOM) % 90000))
pass=0
failed=0
keep=0
cleanup() {
  set +e
  local n
  for n in "$nodes"/*/; do gn_node_stop "$n"; done
  "$src/scripts/registry" stop "$work/registry"
  if [ -x "$work/gn_hostile" ]; then
    "$work/gn_hostile" key-del u "gn-hostile-secret-$tag" >/dev/null
    "$work/gn_hostile" key-del p "gn-hostile-secret-$tag" >/dev/null
    "$work/gn_hostile" key-del u "gn-hostile-w-$tag" >/dev/null
    "$work/gn_hostile" key-del p "gn-hostile-w-$tag" >/dev/null
  fi
  if [ "${GN_HOSTILE_KEEP:-0}" = 1 ]; then
    echo "kept $work"
    return
  fi
  if [ "$keep" = 1 ]; then # the daemons' logs only: the rest holds bombs
    for n in "$nodes"/*/; do
      mkdir -p "$work.logs/$(basename "$n")"
      cp "$n"/gpunetd.log "$work.logs/$(basename "$n")/" 2>/dev/null
    done
    echo "kept the daemons' logs in $work.logs"
  fi
  rm -rf "$work"
}
trap cleanup EXIT
die() {
  keep=1
  echo "FAIL setup: $*"
  for n in "$nodes"/*/; do
    [ -f "$n/gpunetd.log" ] || continue
    echo "--- $n log"
    tail -n 20 "$n/gpunetd.log"
  done
  exit 1
}

# --- cases: each sets why (what got through) and returns non-zero ----------

why=""
miss() { why+="${why:+; }$*"; }
one() { # one LINE: a line of output, shortened for a failure message
  tr '\n' ' ' <<<"$1" | cut -c1-300
}
run_case() {
  local name=$1 fn=$2
  if [ -n "${GN_HOSTILE_CASES:-}" ] && ! grep -qw -- "$name" <<<"$GN_HOSTILE_CASES"; then
    return 0
  fi
  why=""
  "$fn"
  if [ -z "$why" ]; then
    pass=$((pass + 1))
    echo "ok $name"
  else
    failed=$((failed + 1))
    keep=1
    echo "FAIL $name: $why"
  fi
}

# jrun LEASE SCRIPT [IMAGE]: runs `sh -c SCRIPT` on LEASE in IMAGE (default:
# the probe image) and waits for it; its output in out, the CLI's exit
# status in rc.
jrun() {
  out=$(timeout 120 "$GN_BIN/gpunet" --data-dir "$R" run "$1" --image "${3:-$img}" "${run_args[@]}" -f -- \
    sh -c "echo gn-job-ran; $2" 2>&1)
  rc=$?
}
# ran: the last jrun's job ran at all (else says why, for the case to stop:
# `ran || return`).
ran() {
  grep -q "^gn-job-ran" <<<"$out" && return 0
  miss "the job did not run: $(one "$out")"
  return 1
}
# jstart LEASE CMD...: starts a job, prints its id.
jstart() {
  local lease=$1
  shift
  gn_cli "$R" --json run "$lease" --image "$img" "${run_args[@]}" -- "$@" 2>&1 | jq -r '.job.id // empty' 2>/dev/null
}
# Extra `gpunet run` options for the next jobs (--memory where the CLI has it).
run_args=()
# mem4g: the options that make a job ask for 4096 MiB (the requester's
# default before `gpunet run --memory` existed).
mem4g=()
jjson() { gn_cli "$R" --json jobs | jq -c --arg j "$1" '.jobs[] | select(.id==$j)'; }
jstate() { gn_cli "$R" --json jobs | jq -r --arg j "$1" '.jobs[] | select(.id==$j) | .state'; }
jended() { case $(jstate "$1") in running | pulling | "") return 1 ;; *) return 0 ;; esac }
jrunning() { [ "$(jstate "$1")" = running ]; }
# expect_blocked ATTACK...: every `gn_probe ATTACK` line in out says BLOCKED.
expect_blocked() {
  local a l
  for a in "$@"; do
    l=$(grep -m1 "^$a: " <<<"$out")
    case $l in
    "$a: BLOCKED"*) ;;
    "") miss "$a: no answer from the probe ($(one "$out"))" ;;
    *) miss "$l" ;;
    esac
  done
}
probe_script() { # probe_script ATTACK...: a job script printing "ATTACK: result" per attack
  local a s=""
  for a in "$@"; do s+="echo \"$a: \$(gn_probe $a 2>&1)\"; "; done
  echo "$s"
}

case_keyrings() {
  local secret=s3cret-$tag
  # The host root plants a secret in its user and persistent keyrings.
  "$work/gn_hostile" key-put u "gn-hostile-secret-$tag" "$secret" >/dev/null || miss "host: cannot add to root's user keyring"
  "$work/gn_hostile" key-put p "gn-hostile-secret-$tag" "$secret" >/dev/null || miss "host: cannot add to root's persistent keyring"
  jrun "$leaseA" "gn_hostile key-get u gn-hostile-secret-$tag; gn_hostile key-get p gn-hostile-secret-$tag;
    gn_hostile key-put u gn-hostile-w-$tag from-job; gn_hostile key-put p gn-hostile-w-$tag from-job;
    gn_hostile key-put n:gn-hostile-chan gn-hostile-c-$tag chan-$tag; gn_hostile key-put s gn-hostile-c-$tag chan-$tag;
    $(probe_script keyctl-read keyctl-persistent add-key keyctl-join request-key)"
  ran || return
  grep -q "$secret" <<<"$out" && miss "a job read the host root's keyring: $(grep -m1 "$secret" <<<"$out")"
  local r
  for r in u p; do
    if "$work/gn_hostile" key-get "$r" "gn-hostile-w-$tag" | grep -q from-job; then
      miss "a job wrote into the host root's $([ $r = u ] && echo user || echo persistent) keyring"
    fi
  done
  expect_blocked keyctl-read keyctl-persistent add-key keyctl-join request-key
  # A second lease's job looks for what the first one left.
  jrun "$leaseB" "gn_hostile key-get u gn-hostile-w-$tag; gn_hostile key-get p gn-hostile-w-$tag;
    gn_hostile key-get n:gn-hostile-chan gn-hostile-c-$tag; gn_hostile key-get s gn-hostile-c-$tag"
  ran || return
  grep -qE "from-job|chan-$tag" <<<"$out" && miss "keyring channel between two leases: $(grep -m1 -E "from-job|chan-$tag" <<<"$out")"
  "$work/gn_hostile" key-del u "gn-hostile-secret-$tag" >/dev/null
  "$work/gn_hostile" key-del p "gn-hostile-secret-$tag" >/dev/null
  "$work/gn_hostile" key-del u "gn-hostile-w-$tag" >/dev/null
  "$work/gn_hostile" key-del p "gn-hostile-w-$tag" >/dev/null
}

case_userns() {
  jrun "$leaseA" "$(probe_script userns clone-userns clone3-userns)
    unshare -U -r sh -c 'echo in-new-userns; grep CapEff /proc/self/status' 2>&1; echo unshare-rc=\$?"
  ran || return
  expect_blocked userns clone-userns clone3-userns
  grep -q "in-new-userns" <<<"$out" && miss "busybox unshare -U -r made a user namespace: $(grep -m1 CapEff <<<"$out")"
}

syscall_attacks=(io_uring perf userfaultfd bpf mount fsopen umount ptrace process-vm kexec module)
case_syscalls() {
  jrun "$leaseA" "$(probe_script "${syscall_attacks[@]}")"
  ran || return
  expect_blocked "${syscall_attacks[@]}"
}

privileged_attacks=(swapon acct settime mknod raw-socket chown-root-file)
case_privileged() {
  jrun "$leaseA" "$(probe_script "${privileged_attacks[@]}")"
  ran || return
  expect_blocked "${privileged_attacks[@]}"
}

# uid_map "0 BASE COUNT" of a job on LEASE; sets base, count.
job_idmap() {
  jrun "$1" "cat /proc/self/uid_map; echo \"whoami: \$(gn_probe whoami | tr '\n' ' ')\""
  local line
  base=""
  ran || return
  line=$(awk '$1 == "0" {print $2, $3; exit}' <<<"$out")
  [ -n "$line" ] || { miss "no uid_map line for uid 0: $(one "$out")"; return; }
  base=${line% *}
  count=${line#* }
}
case_uids() {
  local a_base a_count b_base b_count
  job_idmap "$leaseA"
  a_base=$base a_count=$count
  [ "$a_base" = 0 ] && miss "uid 0 in the job is host uid 0 (uid_map: $(one "$out"))"
  job_idmap "$leaseB"
  b_base=$base b_count=$count
  [ "$b_base" = 0 ] && miss "lease B's uid 0 is host uid 0"
  if [ -n "$a_base" ] && [ -n "$b_base" ] && [ "$a_base" != 0 ]; then
    if [ "$a_base" = "$b_base" ] ||
      { [ "$a_base" -lt $((b_base + b_count)) ] && [ "$b_base" -lt $((a_base + a_count)) ]; }; then
      miss "leases A and B share host uids ($a_base+$a_count and $b_base+$b_count)"
    fi
  fi
}

# lease_procs LEASE: how many host processes are in LEASE's cgroups (its
# jobs' pids cgroups below gpunet/LEASE, v1 or v2), counted from every
# process's /proc/PID/cgroup: lease ids are this run's own, so a parallel run
# of the suite (or anything else on the host) does not count.
lease_procs() {
  grep -l -E "^[0-9]+:([^:]*,)?pids(,[^:]*)?:/gpunet/$1/|^0::/gpunet/$1/" /proc/[0-9]*/cgroup 2>/dev/null | wc -l
}
case_forkbomb() {
  local job pid pmax pcur before peak n quota u0 u1 used limit
  before=$(lease_procs "$leaseA")
  # Four spinning shells for the CPU limit, then a process bomb (each child
  # sleeps, so it costs pids rather than CPU).
  # A failed fork ends busybox sh, so the bomb runs in a subshell and the
  # job's shell says when it is over.
  job=$(jstart "$leaseA" sh -c "sleep 303$u & for k in 1 2 3 4; do sh -c 'while :; do :; done' & done;
    (i=0; while [ \$i -lt 3000 ]; do sleep 302$u & i=\$((i+1)); done) 2>/dev/null; echo bombed; wait")
  [ -n "$job" ] || { miss "could not start the job"; return; }
  bombed() { gn_cli "$R" logs "$1" | grep -q bombed; }
  bombed_or_ended() { bombed "$1" || jended "$1"; }
  gn_wait_until 60 "the fork bomb to go off" bombed_or_ended "$job"
  bombed "$job" || { miss "the bomb did not go off: $(jjson "$job")"; gn_cli "$R" stop "$job" >/dev/null; return; }
  pid=$(gn_hostile_pid "sleep 303$u") || { miss "cannot find the job's process on the host"; gn_cli "$R" stop "$job" >/dev/null; return; }
  peak=$(lease_procs "$leaseA")
  pmax=$(gn_hostile_cg "$pid" pids-max)
  pcur=$(gn_hostile_cg "$pid" pids-current)
  n=$((peak - before))
  if [ -z "$pmax" ] || [ "$pmax" = max ]; then
    miss "no pids limit on the job (pids.max=${pmax:-?}, $n new processes in the lease's cgroups)"
  elif [ "$pcur" -gt "$pmax" ] || [ "$n" -gt $((pmax + 64)) ]; then
    miss "pids limit $pmax did not hold: $pcur in the cgroup, $n new processes in the lease's cgroups"
  fi
  quota=$(gn_hostile_cg "$pid" cpu-quota)
  if [ -z "$quota" ] || [ "$quota" = max ]; then
    miss "no CPU limit on the job (quota=${quota:-?})"
  else
    u0=$(gn_hostile_cg "$pid" cpu-usage-us)
    sleep 2
    u1=$(gn_hostile_cg "$pid" cpu-usage-us)
    used=$(awk -v a="$u0" -v b="$u1" 'BEGIN{printf "%.2f", (b-a)/2e6}')
    limit=$(awk -v q="$quota" 'BEGIN{printf "%.2f", q*1.25+0.05}')
    awk -v u="$used" -v l="$limit" 'BEGIN{exit !(u > l)}' && miss "4 spinning shells used $used CPUs, quota $quota"
  fi
  echo "   fork-bomb: pids.max=$pmax current=$pcur new-in-lease-cgroups=$n cpu-quota=$quota used=${used:-?} CPUs"
  gn_cli "$R" stop "$job" >/dev/null
  gn_wait_until 20 "the fork bomb to stop" jended "$job" || miss "gpunet stop did not end the fork bomb"
  local left
  for _ in $(seq 50); do
    left=$(($(lease_procs "$leaseA") - before))
    [ "$left" -le 0 ] && break
    sleep 0.2
  done
  [ "$left" -le 0 ] || miss "$left processes left in the lease's cgroups after the bomb was stopped"
}

case_memory_sum() {
  # Eight concurrent jobs of one lease each ask for 4096 MiB, 32 GiB in all;
  # what runs must fit in the host's RAM (the provider's budget is a share
  # of it); what does not fit is refused, saying why.
  local jobs=() j k o pid lim sum=0 running=0 refused=0 total
  total=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024))
  for k in 1 2 3 4 5 6 7 8; do
    o=$(gn_cli "$R" --json run "$leaseA" --image "$img" "${mem4g[@]}" -- sleep "31$k$u" 2>&1)
    j=$(jq -r '.job.id // empty' <<<"$o" 2>/dev/null)
    if [ -n "$j" ]; then
      jobs+=("$j")
    else
      refused=$((refused + 1))
      grep -qi memory <<<"$o" || miss "job $k refused without naming memory: $(one "$o")"
    fi
  done
  all_started() {
    local x
    for x in "${jobs[@]}"; do [ "$(jstate "$x")" != pulling ] || return 1; done
  }
  gn_wait_until 60 "the jobs to start" all_started || miss "jobs still pulling after 60 s"
  for j in "${jobs[@]}"; do
    case $(jstate "$j") in
    running) ;;
    *)
      refused=$((refused + 1))
      jjson "$j" | grep -qi memory || miss "job $j ended without naming memory: $(jjson "$j")"
      ;;
    esac
  done
  for k in 1 2 3 4 5 6 7 8; do
    pid=$(gn_hostile_pid "sleep 31$k$u") || continue
    lim=$(gn_hostile_cg "$pid" memory-max)
    running=$((running + 1))
    if [ "$lim" = max ] || [ -z "$lim" ]; then
      miss "job 'sleep 31$k$u' runs with no memory limit"
      lim=$total
    fi
    sum=$((sum + lim))
  done
  echo "   memory-sum: $running jobs run, $refused refused, limits sum to $((sum >> 20)) MiB of $((total >> 20)) MiB RAM"
  [ "$sum" -le "$total" ] || miss "8 jobs of one lease hold memory limits of $((sum >> 20)) MiB, the host has $((total >> 20)) MiB"
  for j in "${jobs[@]}"; do gn_cli "$R" stop "$j" >/dev/null 2>&1; done
  for j in "${jobs[@]}"; do gn_wait_until 20 "job $j to stop" jended "$j"; done
}

case_memory_budget() {
  # A provider whose jobs' memory budget (10% of RAM) is below what the job
  # asks for (4096 MiB): refused or clamped, and said so.
  local budget job pid lim j
  budget=$(awk '/^MemTotal:/ {printf "%d", $2 * 1024 * 0.1}' /proc/meminfo)
  [ -n "$leaseP4" ] || { miss "no lease on the provider with a small memory budget (${p4_note:-})"; return; }
  out=$(gn_cli "$R" --json run "$leaseP4" --image "$img" "${mem4g[@]}" -- sleep "321$u" 2>&1)
  job=$(jq -r '.job.id // empty' <<<"$out" 2>/dev/null)
  if [ -z "$job" ]; then
    grep -qi memory <<<"$out" || miss "refused without naming memory: $(one "$out")"
    return
  fi
  gn_wait_until 30 "the job to run or be refused" jended_or_running "$job"
  j=$(jjson "$job")
  if [ "$(jstate "$job")" != running ]; then
    grep -qi memory <<<"$j" || miss "job ended without naming memory: $j"
    return
  fi
  pid=$(gn_hostile_pid "sleep 321$u")
  lim=$(gn_hostile_cg "$pid" memory-max)
  echo "   memory-budget: job runs with memory limit $lim, budget $budget"
  if [ "$lim" = max ] || [ -z "$lim" ] || [ "$lim" -gt "$budget" ]; then
    miss "job asked for 4096 MiB and runs with limit ${lim:-?} over the provider's budget $budget"
  fi
  { jjson "$job"; gn_cli "$R" logs "$job"; } 2>&1 | grep -qiE "memory.*(clamp|limit|budget)|(clamp|limit|budget).*memory" ||
    miss "the job was clamped silently: $j"
  gn_cli "$R" stop "$job" >/dev/null
  gn_wait_until 20 "job to stop" jended "$job"
}

case_memory_bomb() {
  # A job that touches more memory than its limit (2 GiB, or the requester's
  # old fixed 4096 MiB) is killed by the kernel instead of taking the host's
  # RAM.
  # busybox dd fills a buffer of bs bytes (fullblock: one read() stops at
  # 2 GiB). First 1000 MiB, well under the limit, which must work (else this
  # case proves nothing), then 5000 MiB.
  local saved=("${run_args[@]}")
  [ ${#mem4g[@]} -gt 0 ] && run_args=(--memory 2G)
  jrun "$leaseA" "dd if=/dev/zero of=/dev/null bs=1000M count=1 iflag=fullblock 2>/dev/null && echo small=ok;
    dd if=/dev/zero of=/dev/null bs=5000M count=1 iflag=fullblock 2>/dev/null && echo big=ok; echo big-rc=\$?"
  run_args=("${saved[@]}")
  ran || return
  echo "   memory-bomb: $(grep -E '^(small|big)' <<<"$out" | tr '\n' ' ')"
  grep -q "^small=ok" <<<"$out" || miss "the 1000 MiB control did not work: $(one "$out")"
  grep -q "^big=ok" <<<"$out" && miss "a job filled 5000 MiB, over its memory limit"
}

jended_or_running() { [ "$(jstate "$1")" != pulling ]; }

# bomb_run NAME DIR LEASE IMAGE BOMB_MIB CAP_MIB: runs a bomb image on the
# provider in DIR whose image limit is CAP_MIB: the job fails saying a limit
# was hit, and the provider's disk use (sampled while it unpacks) grows by
# no more than the limit.
bomb_run() {
  local name=$1 dir=$2 lease=$3 image=$4 mib=$5 cap=$6 job base du peak=0 j t0
  base=$(du -sxm "$dir" | cut -f1)
  t0=$(date +%s)
  job=$(gn_cli "$R" --json run "$lease" --image "$image" -- /bomb 2>&1 | jq -r '.job.id // empty')
  [ -n "$job" ] || { miss "could not submit the bomb job"; return; }
  for _ in $(seq 900); do
    du=$(($(du -sxm "$dir" 2>/dev/null | cut -f1) - base))
    [ "$du" -gt "$peak" ] && peak=$du
    jended "$job" && break
    if [ "$peak" -gt $((cap + 256)) ]; then # the limit did not hold: stop filling the disk
      gn_cli "$R" stop "$job" >/dev/null
      gn_wait_until 20 "the bomb to stop" jended "$job"
      break
    fi
    sleep 0.2
  done
  j=$(jjson "$job")
  bomb_json=$j
  echo "   $name: ${mib} MiB of zeros, disk cap $cap MiB, disk grew at most $peak MiB, $(($(date +%s) - t0)) s; $(jq -r '.state + ": " + (.error // "")' <<<"$j")"
  jended "$job" || miss "bomb job still $(jstate "$job") after 3 minutes"
  [ "$(jstate "$job")" = failed ] || miss "bomb job ended $(jstate "$job"), not failed"
  jq -r '.error // ""' <<<"$j" | grep -qiE "limit|too (big|large)|exceed|larger|more than|cap|budget|space" ||
    miss "the reason does not say a limit was hit: $(jq -r '.error // "none"' <<<"$j")"
  [ "$peak" -le $((cap + 64)) ] || miss "the provider's disk grew by $peak MiB during the bomb (limit $cap MiB)"
}

case_bomb_capped() {
  # A layer of 1 GiB of zeros in a 1 MB gzip, on a provider whose image
  # limit (a config key) is 256 MiB.
  [ -n "$bomb_cap_mib" ] || { miss "gpunetd has no config key for an image limit (layer_max, image_max or store_max)"; return; }
  bomb_run bomb-capped "$P1" "$leaseA" "$bomb1" "$bomb1_mib" "$bomb_cap_mib"
}

case_bomb_default_cap() {
  # 9 GiB of zeros in a 9 MB gzip against the default 8 GiB layer limit.
  # The tar header declares the size, so an unpacker refuses it before
  # inflating; one that counts while writing would write up to 8 GiB here.
  bomb_run bomb-default-cap "$P3" "$leaseP3" "$bomb3" 9216 8192
}

case_bomb_entries() {
  # 600,000 empty files in a 6 MB gzip against the default limit of 500,000
  # entries per layer: refused, naming the entries.
  bomb_run bomb-entries "$P3" "$leaseP3" "$bomb4" 0 64
  jq -r '.error // ""' <<<"$bomb_json" | grep -qi "entr" || miss "the reason does not name the entry count"
}

# ticks DIR: the metered seconds the node in DIR has written since it started.
ticks() {
  curl -s --max-time 5 --unix-socket "$1/gpunetd.sock" http://gpunetd/metrics | awk '/^gpunet_ticks_total/ {print $2}'
}
# cpu_s PID: CPU seconds (user+system) PID has used, all threads.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }
case_bomb_stop() {
  # A bomb under the provider's limits unpacks for many seconds: gpunet stop
  # must cancel the unpack within two seconds (no thread still inflating:
  # the provider's CPU time stops growing), and SIGTERM must stop the
  # provider within three seconds even while another unpack is in progress.
  [ -n "$leaseP3" ] || { miss "no lease on the bomb provider"; return; }
  local job ppid t0 t1 ms c0 c1 hz state
  hz=$(getconf CLK_TCK)
  ppid=$(cat "$P3/gpunetd.pid")
  local k0 k1
  job=$(gn_cli "$R" --json run "$leaseP3" --image "$bomb2" -- /bomb 2>&1 | jq -r '.job.id // empty')
  [ -n "$job" ] || { miss "could not submit the bomb job"; return; }
  sleep 0.5
  k0=$(ticks "$P3")
  sleep 2
  k1=$(ticks "$P3")
  state=$(jstate "$job")
  # The lease goes on being metered every second while its bomb unpacks.
  if [ "$state" = pulling ] && ! [ "$((${k1:-0} - ${k0:-0}))" -ge 1 ]; then
    miss "metering stalled while the bomb unpacked: ticks ${k0:-?} -> ${k1:-?} in 2 s"
  fi
  if [ "$state" != pulling ]; then
    miss "the ${bomb2_mib} MiB bomb was not still unpacking after 2 s ($state: $(jjson "$job")); cannot time the stop"
  else
    t0=$(date +%s%N)
    gn_cli "$R" stop "$job" >/dev/null
    gn_wait_until 10 "the bomb job to stop" jended "$job"
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    sleep 0.5
    c0=$(cpu_ticks "$ppid")
    sleep 1
    c1=$(cpu_ticks "$ppid")
    echo "   bomb-stop: metered $((k1 - k0)) s in 2 s of unpacking; job $(jstate "$job") ${ms} ms after gpunet stop; provider CPU afterwards $(((c1 - c0) * 1000 / hz)) ms/s"
    [ "$ms" -le 2500 ] || miss "gpunet stop took ${ms} ms to end the unpacking job ($(jstate "$job"))"
    [ $((c1 - c0)) -le $((hz / 5)) ] || miss "the provider still burns $(((c1 - c0) * 1000 / hz)) ms/s of CPU after the stop: the unpack goes on"
  fi
  # SIGTERM during another unpack.
  job=$(gn_cli "$R" --json run "$leaseP3" --image "$bomb2" -- /bomb 2>&1 | jq -r '.job.id // empty')
  sleep 2
  state=$(jstate "$job")
  [ "$state" = pulling ] || miss "the second bomb was not unpacking when SIGTERM came ($state: $(jjson "$job"))"
  t0=$(date +%s%N)
  kill -TERM "$ppid"
  for _ in $(seq 150); do
    kill -0 "$ppid" 2>/dev/null || break
    sleep 0.1
  done
  t1=$(date +%s%N)
  ms=$(((t1 - t0) / 1000000))
  if kill -0 "$ppid" 2>/dev/null; then
    miss "the provider ignored SIGTERM for 15 s during an unpack"
    kill -9 "$ppid"
  else
    echo "   bomb-stop: provider exited ${ms} ms after SIGTERM during an unpack"
    [ "$ms" -le 3000 ] || miss "the provider took ${ms} ms to exit on SIGTERM during an unpack"
  fi
  rm -f "$P3/gpunetd.pid"
}

case_registry_allow() {
  # A provider that does not allowlist 127.0.0.1 refuses the loopback
  # registry, with a reason that carries nothing of the registry's answers.
  [ -n "$leaseP2" ] || { miss "no lease on the provider without an allowlist"; return; }
  jrun "$leaseP2" "echo pulled-from-loopback"
  grep -q "pulled-from-loopback" <<<"$out" && miss "a provider with no allowlist pulled from 127.0.0.1 and ran the job"
  grep -qiE "loopback|allow|private|refus|not permitted" <<<"$out" || miss "the refusal does not say why: $(one "$out")"
  grep -qE 'MANIFEST_UNKNOWN|BLOB_UNKNOWN|"errors"|\{"' <<<"$out" && miss "registry error body relayed: $(one "$out")"
  # On an allowlisted provider, a registry error's body stays in the
  # provider's log: pin the probe image's name to a digest the registry lacks.
  local ghost=127.0.0.1:$reg_port/e2e/probe@sha256:$(printf 'ghost %s' "$tag" | sha256sum | cut -c1-64)
  jrun "$leaseA" "true" "$ghost"
  [ "$rc" -ne 0 ] || miss "a job on a missing manifest succeeded"
  grep -qiE "loopback|registry_allow" <<<"$out" && miss "the allowlisted provider refused its registry: $(one "$out")"
  grep -qE 'MANIFEST_UNKNOWN|manifest unknown|"errors"|\{"' <<<"$out" &&
    miss "the registry's error body reached the renter: $(one "$out")"
}

case_traversal_id() {
  # The CLI makes job ids itself, so a manifest naming its job '../..' needs
  # a hostile requester: tests/node/test_ids_provider.c sends those to a
  # real provider. Here the entry points a renter reaches through the CLI:
  # each must refuse the id as one that breaks the id grammar (a usage
  # error, before any request), not merely find no such job.
  local id what
  echo "   traversal-id: NOTE the CLI's entry points only; hostile manifests: tests/node/test_ids_provider.c"
  for id in '../..' '..' '../../etc' 'a/../../b'; do
    for what in stop logs run; do
      case $what in
      run) out=$(gn_cli "$R" run "$id" --image "$img" -- true 2>&1) ;;
      *) out=$(gn_cli "$R" "$what" "$id" 2>&1) ;;
      esac
      rc=$?
      if [ "$rc" -ne 2 ] || ! grep -q "is not a .*id" <<<"$out"; then
        miss "$what '$id' was not refused as a bad id (exit $rc): $(one "$out")"
      fi
    done
  done
  [ -f "$R/identity.key" ] && [ -f "$P1/identity.key" ] || miss "a data dir was damaged"
}

case_signals() {
  # Lease B runs a sleeper; lease A's job tries to see it and kill it.
  local jb pid hu
  jb=$(jstart "$leaseB" sleep "304$u")
  [ -n "$jb" ] || { miss "could not start lease B's job"; return; }
  gn_wait_until 30 "lease B's job to run" jended_or_running "$jb"
  jrunning "$jb" || { miss "lease B's job never ran: $(jjson "$jb")"; return; }
  for _ in $(seq 50); do pid=$(gn_hostile_pid "sleep 304$u") && break; sleep 0.2; done
  [ -n "$pid" ] || { miss "cannot find lease B's process on the host"; return; }
  hu=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
  [ "$hu" = 0 ] && miss "lease B's job runs as host uid 0"
  jrun "$leaseA" "echo seen=\$(ps | grep -c 'sleep 30[4]$u'); kill -9 $pid; echo kill-rc=\$?; kill -9 -1; sleep 1"
  ran || { gn_cli "$R" stop "$jb" >/dev/null; return; }
  sleep 0.5
  grep -q "^seen=0$" <<<"$out" || miss "lease A's job sees lease B's process: $(one "$out")"
  kill -0 "$pid" 2>/dev/null || miss "lease A's job killed lease B's process (kill: $(grep kill-rc <<<"$out"))"
  jrunning "$jb" || miss "lease B's job is $(jstate "$jb") after lease A's kill attempts"
  gn_cli "$R" stop "$jb" >/dev/null
  gn_wait_until 20 "lease B's job to stop" jended "$jb"
}

case_earlier_probes() {
  jrun "$leaseA" "touch /x 2>/dev/null && echo root-rw || echo root-ro; touch /tmp/y && echo tmp-rw;
    echo ifaces=\$(tail -n +3 /proc/net/dev | awk -F: '{print \$1}' | tr -d ' ' | tr '\n' ,);
    grep CapEff /proc/self/status; grep CapPrm /proc/self/status; echo keys=\$(cat /proc/keys 2>/dev/null | wc -l)"
  ran || return
  grep -q root-ro <<<"$out" || miss "root filesystem is writable: $(one "$out")"
  grep -q tmp-rw <<<"$out" || miss "/tmp is not writable: $(one "$out")"
  grep -q "^ifaces=lo,$" <<<"$out" || miss "interfaces beyond lo: $(grep ifaces <<<"$out")"
  grep -qE "CapEff:\s+0000000000000000" <<<"$out" || miss "job has capabilities: $(grep CapEff <<<"$out")"
  grep -q "^keys=0$" <<<"$out" || miss "/proc/keys is readable: $(grep keys= <<<"$out")"
}

case_host_paths() {
  # What the job can learn about the host: the provider's data dir in
  # mountinfo, the NVIDIA driver's /proc entries, powercap counters.
  jrun "$leaseA" "cat /proc/self/mountinfo; echo nvidia=\$(ls /proc/driver/nvidia 2>/dev/null | wc -l);
    echo powercap=\$(cat /sys/class/powercap/*/energy_uj 2>/dev/null | wc -l); echo cgroup=\$(cat /proc/self/cgroup | tr '\n' ' ')"
  ran || return
  grep -q "$work" <<<"$out" && miss "mountinfo shows the provider's data dir: $(grep -m1 "$work" <<<"$out" | cut -c1-200)"
  grep -q "^nvidia=0$" <<<"$out" || miss "/proc/driver/nvidia is visible"
  grep -q "^powercap=0$" <<<"$out" || miss "powercap energy counters are readable"
  grep "^cgroup=" <<<"$out" | grep -qE "gn-|gpunet|/[0-9a-f]{16,}" && miss "the job sees its host cgroup path: $(grep ^cgroup= <<<"$out")"
}

case_clean_exit() {
  # Every daemon stops on SIGTERM within 10 s, and under the sanitizer build
  # reports no leak or undefined behaviour after all the above.
  local n t0
  for n in "$nodes"/*/; do
    [ -f "$n/gpunetd.pid" ] || continue
    t0=$(date +%s)
    gn_node_stop "$n"
    [ $(($(date +%s) - t0)) -lt 10 ] || miss "$(basename "$n") needed SIGKILL"
  done
  if grep -l -E "Sanitizer|runtime error:" "$nodes"/*/gpunetd.log >/dev/null 2>&1; then
    miss "sanitizer report: $(grep -h -m3 -E "Sanitizer|runtime error:" "$nodes"/*/gpunetd.log | tr '\n' ' ' | cut -c1-300)"
  fi
}

# --- setup ---------------------------------------------------------------------

t_start=$(date +%s)
probe=$GN_BIN/tests/gn_probe
[ -x "$probe" ] || die "gn_probe is not built ($probe): cmake --build ... --target gn_probe"
${CC:-cc} -static -O1 -o "$work/gn_hostile" "$src/tests/e2e/hostile/gn_hostile.c" || die "cannot build gn_hostile (static)"

gn_e2e_registry_start || die "registry did not start"
d=$(gn_hostile_probe_image "$work/probe" e2e/probe:1 "$reg_port" "$probe" "$work/gn_hostile") || die "cannot build the probe image"
img=127.0.0.1:$reg_port/e2e/probe@$d

# The provider's image limits: a config key where the daemon has one (the
# layer cap first, then the whole store), so the bomb can be small.
help=$("$GN_BIN/gpunetd" --help 2>&1)
has_flag() { grep -q -- "--$1\b" <<<"$help"; }
p1_limits=()
bomb_cap_mib=""
for k in layer-max image-max store-max; do
  if has_flag "$k"; then
    p1_limits=(--"$k" 256M)
    bomb_cap_mib=256
    break
  fi
done
bomb1_mib=1024
bomb2_mib=${GN_HOSTILE_SLOW_BOMB_MIB:-4096}
d=$(gn_hostile_bomb_image "$work/bomb1" e2e/bomb:1 "$reg_port" "$bomb1_mib") || die "cannot build the bomb image"
bomb1=127.0.0.1:$reg_port/e2e/bomb@$d
d=$(gn_hostile_bomb_image "$work/bomb2" e2e/bomb:2 "$reg_port" "$bomb2_mib") || die "cannot build the slow bomb image"
bomb2=127.0.0.1:$reg_port/e2e/bomb@$d
d=$(gn_hostile_bomb_image "$work/bomb3" e2e/bomb:3 "$reg_port" 9216) || die "cannot build the 9 GiB bomb image"
bomb3=127.0.0.1:$reg_port/e2e/bomb@$d
if [ "${GN_HOSTILE_ENTRY_BOMB:-0}" = 1 ]; then
  mkdir -p "$work/bomb4"
  "$work/gn_hostile" tar-entries 600000 | gzip -1 -n >"$work/bomb4/layer.gz" || die "cannot make the entry bomb"
  d=$(gn_hostile_layer_image "$work/bomb4" e2e/bomb:4 "$reg_port" "$work/bomb4/layer.gz") || die "cannot build the entry bomb image"
  bomb4=127.0.0.1:$reg_port/e2e/bomb@$d
fi
allow=()
has_flag registry-allow && allow=(--registry-allow 127.0.0.1)
# (Captured first: with pipefail, grep -q closing the pipe early would make
# gpunet die of SIGPIPE and the test think --memory is missing.)
help_run=$("$GN_BIN/gpunet" run --help 2>&1 || true)
grep -q -- --memory <<<"$help_run" && mem4g=(--memory 4G)

gn_e2e_start_bootstrap
prov() { # prov DIR MODEL ARGS...
  local dir=$1 model=$2
  shift 2
  gn_node_start "$dir" "$(basename "$dir")" --listen "127.0.0.1:$(gn_free_port)" --bootstrap "127.0.0.1:$p_boot" \
    --provide --price 0.50 --simulate-gpu "$model" "$@"
}
prov "$P1" "RTX 4090" --simulate-gpu "RTX 4090" --simulate-gpu "RTX 4090" "${allow[@]}" "${p1_limits[@]}"
prov "$P2" "RTX 3090"
prov "$P3" "A100" "${allow[@]}"
p4_note=""
if has_flag job-memory-share; then
  prov "$P4" "H100" "${allow[@]}" --job-memory-share 0.1
else
  p4_note="gpunetd has no --job-memory-share"
fi
gn_e2e_start_requester

want_models=3
[ -z "$p4_note" ] && want_models=4
offers_in() { [ "$(gn_cli "$R" --json offers | jq '[.offers[].gpu_model] | unique | length')" -ge "$want_models" ]; }
gn_wait_until 40 "offers of all providers" offers_in || die "offers missing: $(gn_cli "$R" --json offers | jq -c '[.offers[] | .gpu_model]')"
rent() { # rent MODEL: a lease on the offer of MODEL (each provider has its own model)
  local offer
  offer=$(gn_cli "$R" --json offers | jq -r --arg m "$1" '[.offers[] | select(.gpu_model | contains($m))][0].id // empty')
  [ -n "$offer" ] || return 1
  gn_cli "$R" --json rent "$offer" --hours 1 --allow-simulated --no-attest | jq -r '.lease.id // empty'
}
leaseA=$(rent "RTX 4090")
leaseB=$(rent "RTX 4090")
leaseP2=$(rent "RTX 3090")
leaseP3=$(rent "A100")
leaseP4=""
[ -z "$p4_note" ] && leaseP4=$(rent "H100")
[ -n "$leaseA" ] && [ -n "$leaseB" ] || die "cannot rent two leases on the main provider"
echo "   setup: $(($(date +%s) - t_start)) s (registry, images, 4-5 daemons, leases A=$leaseA B=$leaseB)"

# --- the attacks -------------------------------------------------------------

run_case earlier-probes case_earlier_probes
run_case keyrings case_keyrings
run_case userns case_userns
run_case syscalls case_syscalls
run_case privileged case_privileged
run_case uids case_uids
run_case signals case_signals
run_case host-paths case_host_paths
run_case fork-bomb case_forkbomb
run_case memory-sum case_memory_sum
run_case memory-budget case_memory_budget
run_case memory-bomb case_memory_bomb
run_case registry-allow case_registry_allow
run_case traversal-id case_traversal_id
run_case bomb-capped case_bomb_capped
run_case bomb-default-cap case_bomb_default_cap
[ "${GN_HOSTILE_ENTRY_BOMB:-0}" = 1 ] && run_case bomb-entries case_bomb_entries
run_case bomb-stop case_bomb_stop
run_case clean-exit case_clean_exit

echo "   total: $(($(date +%s) - t_start)) s"
echo "$pass passed, $failed failed"
[ "$failed" -eq 0 ]
