#!/usr/bin/env bash
# gpunet exec and gpunet shell against a real provider and requester (runc
# containers, a busybox image on a loopback registry): an interactive shell
# driven through tmux (typing, a resize, Ctrl-C, the exit code, the keeper
# job it started and stopped), non-tty exec from a script (stdout, stderr,
# exit code, stdin through -i, a megabyte both ways under flow control,
# SIGINT passed on), a node that does not hold the lease refused, and the
# end of the lease ending an exec.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
gn_e2e_setup exec requester provider other
gn_e2e_registry e2e/busybox:1
gn_e2e_compat_flags
gn_e2e_start_provider "${gn_e2e_compat[@]}"
gn_e2e_start_requester
gn_e2e_wait_offer 30
gn_e2e_rent --no-attest
# The image's pull, once; its job is the lease's last, whose image the
# shell's keeper job takes.
gn_cli "$R" run "$lease" --image "$image" -f -- true >/dev/null || fail "first job on $image"

running_jobs() { gn_cli "$R" --json jobs | jq '[.jobs[] | select(.state=="running")] | length'; }

# --- an exec as soon as the job is said to run -----------------------------
# The provider says "running" once it started the runtime, a moment before
# the runtime has made the container: an exec that arrives in between waits
# for the container (at most 10 s) instead of failing. Five times, each exec
# sent the moment the job shows running.
for i in 1 2 3 4 5; do
  job=$(gn_cli "$R" --json run "$lease" --image "$image" -- sleep 60 | jq -r .job.id)
  job_running() { [ "$(gn_cli "$R" --json jobs | jq -r --arg j "$job" '.jobs[] | select(.id == $j) | .state')" = running ]; }
  for _ in $(seq 600); do job_running && break; sleep 0.05; done
  out=$(gn_cli "$R" exec "$lease" --job "$job" -- echo "ready-$i" 2>&1) || fail "exec right after job $job ran (try $i): $out"
  [ "$out" = "ready-$i" ] || fail "exec right after the job ran printed: $out"
  gn_cli "$R" stop "$job" >/dev/null
  job_stopped() { ! job_running; }
  gn_wait_until 20 "job $job stopped" job_stopped || fail "job $job did not stop"
done
ok "an exec sent the moment a job shows running ran, 5 times of 5"

# The same wait made certain: the container's runtime state is hidden while
# an exec (with and without a terminal) arrives, and shown again 1.5 s later.
# The exec is held, opened by the provider's tick once the state is back,
# and then runs to its end (a stream opened during a tick once looked 30
# minutes idle to that tick's older clock reading and was killed at once).
for tty in "" -t; do
  job=$(gn_cli "$R" --json run "$lease" --image "$image" -- sleep 60 | jq -r .job.id)
  gn_wait_until 30 "job $job running" job_running || fail "job $job did not run"
  # (The runtime writes its state a moment after the job shows running.)
  have_state() { compgen -G "$P/run/*/state.json" >/dev/null; }
  gn_wait_until 10 "the runtime's state of job $job" have_state || fail "no runtime state for job $job under $P/run"
  state=$(ls -t "$P"/run/*/state.json | head -1)
  mv "$state" "$state.hidden"
  t0=$(date +%s%N)
  (sleep 1.5 && mv "$state.hidden" "$state") &
  hider=$!
  out=$(gn_cli "$R" exec $tty "$lease" --job "$job" -- sh -c 'sleep 0.3; echo held-exec' </dev/null 2>&1) ||
    fail "an exec held for the container (${tty:-no tty}) failed: $out"
  wait "$hider"
  t1=$(date +%s%N)
  [ "$(printf '%s' "$out" | tr -d '\r')" = held-exec ] || fail "the held exec (${tty:-no tty}) printed: $out"
  [ $(((t1 - t0) / 1000000)) -ge 1500 ] || fail "the exec did not wait for the container (${tty:-no tty})"
  ! grep -q "idle for 30 minutes" "$P/gpunetd.log" || fail "a held exec was killed as idle: $(grep idle "$P/gpunetd.log")"
  gn_cli "$R" stop "$job" >/dev/null
  gn_wait_until 20 "job $job stopped" job_stopped || fail "job $job did not stop"
done
ok "an exec that arrives before the container exists waits for it and runs (with and without a terminal)"

# --- an interactive shell in tmux ------------------------------------------
# (Without tmux these checks are left out, said so, and the rest runs.)
if ! command -v tmux >/dev/null; then
  echo "# skipped the tmux session: no tmux (scripts/deps installs it)"
else
  tm="tmux -L gn-exec-$$"
  cleanup_tmux() { $tm kill-server 2>/dev/null || true; }
  trap 'cleanup_tmux; gn_e2e_cleanup' EXIT
  $tm new-session -d -s s -x 100 -y 30 \
    "sh -c '$GN_BIN/gpunet --data-dir $R shell $lease; echo rc=\$? > $work/shell.rc'"
  pane() { $tm capture-pane -p -t s; }
  has() { pane | grep -q -- "$1"; }
  # A prompt (busybox sh: '# ' or '$ ') once the keeper job runs and the shell starts.
  prompt() { pane | grep -qE '[#$] ?$'; }
  gn_wait_until 60 "the shell's prompt" prompt || fail "no prompt in the shell: $(pane)"
  [ "$(running_jobs)" = 1 ] || fail "the shell did not start one keeper job: $(gn_cli "$R" --json jobs)"
  ok "gpunet shell with no running job started a keeper job and a shell in it"

  $tm send-keys -t s 'echo $((6*7))' Enter
  gn_wait_until 10 "42" has '^42' || fail "typed arithmetic did not print 42: $(pane)"
  ok "typing into the shell: echo \$((6*7)) prints 42"

  $tm send-keys -t s 'stty size' Enter
  gn_wait_until 10 "30 100" has '^30 100' || fail "the first size is not 30 100: $(pane)"
  $tm resize-window -t s -x 120 -y 40
  # The new size travels to the container's terminal while we type: asked
  # again until it shows (or 20 s pass).
  resized() {
    $tm send-keys -t s 'clear; stty size' Enter
    sleep 1
    has '^40 120'
  }
  gn_wait_until 20 "40 120" resized || fail "the size after resize-window is not 40 120: $(pane)"
  ok "the terminal's size follows: 30 100, then 40 120 after tmux resize-window"

  $tm send-keys -t s 'clear; sleep 100' Enter
  sleep 1
  t0=$(now_ms)
  $tm send-keys -t s C-c
  $tm send-keys -t s 'echo ok$((1+1))' Enter
  gn_wait_until 10 "ok2" has '^ok2' || fail "Ctrl-C did not give the shell back: $(pane)"
  ok "Ctrl-C interrupts sleep 100 and the shell answers again ($(($(now_ms) - t0)) ms)"

  $tm send-keys -t s 'exit 5' Enter
  gn_wait_until 15 "the shell's exit" test -s "$work/shell.rc" || fail "gpunet shell did not end: $(pane)"
  [ "$(cat "$work/shell.rc")" = rc=5 ] || fail "gpunet shell's status: $(cat "$work/shell.rc"), not 5"
  ok "exit 5 in the shell: gpunet shell exits 5"
  gn_wait_until 20 "the keeper job to stop" test "$(running_jobs)" = 0 ||
    fail "the keeper job still runs: $(gn_cli "$R" --json jobs)"
  ok "the keeper job is stopped when the shell ends"
fi

# --- exec from scripts, into a running job ----------------------------------
# execs_of CMD: how many exec streams of argv[0] CMD the provider started.
execs_of() { grep -c "^.* exec [0-9]* on job .*: $1\$" "$P/gpunetd.log" || true; }
exec_started() { [ "$(execs_of "$1")" -ge "$2" ]; }
job=$(gn_cli "$R" --json run "$lease" --image "$image" -- sh -c 'trap "exit 0" TERM; while :; do sleep 1; done' |
  jq -r .job.id)
running() { [ "$(running_jobs)" = 1 ]; }
gn_wait_until 30 "job $job to run" running || fail "job $job never ran"

set +e
out=$(gn_cli "$R" exec "$lease" -- sh -c 'echo hi; echo oops >&2; exit 3' 2>"$work/err")
rc=$?
set -e
[ "$out" = hi ] && [ $rc = 3 ] && [ "$(cat "$work/err")" = oops ] ||
  fail "exec sh -c 'echo hi; exit 3': out '$out', err '$(cat "$work/err")', rc $rc"
ok "exec without a tty: stdout hi, stderr oops, exit code 3"

out=$(echo abc | gn_cli "$R" exec -i "$lease" --job "$job" -- cat)
[ "$out" = abc ] || fail "exec -i cat: '$out'"
out=$(echo abc | gn_cli "$R" exec "$lease" -- cat)
[ "$out" = "" ] || fail "exec without -i read stdin: '$out'"
ok "stdin reaches the command with -i (cat echoes abc), and only with -i"

head -c 1048576 /dev/urandom >"$work/big"
gn_cli "$R" exec -i "$lease" -- cat <"$work/big" >"$work/big.out" || fail "exec -i cat of 1 MiB"
cmp -s "$work/big" "$work/big.out" || fail "1 MiB through exec -i cat came back different ($(stat -c %s "$work/big.out") bytes)"
ok "1 MiB through exec -i cat comes back byte for byte (flow control both ways)"

# A renter that stops reading stops the process, not a buffer: its stdout
# is a fifo nobody reads (held open here so that opening it does not
# block), the command writes 32 KiB blocks and counts them in a file.
mkfifo "$work/stuck"
exec 3<>"$work/stuck"
"$GN_BIN/gpunet" --data-dir "$R" exec "$lease" -- \
  sh -c 'i=0; while :; do i=$((i+1)); echo $i >/tmp/blocks; dd if=/dev/zero bs=32k count=1 2>/dev/null; done' \
  >"$work/stuck" &
stuck_pid=$!
blocks() { gn_cli "$R" exec "$lease" -- cat /tmp/blocks; }
started() { [ -n "$(blocks)" ]; }
gn_wait_until 30 "the writer to start" started
sleep 3
b1=$(blocks)
sleep 2
b2=$(blocks)
[ "$b1" = "$b2" ] || fail "the writer went on while nobody read: $b1 then $b2 blocks of 32 KiB"
[ "$b1" -le 128 ] || fail "the writer got $b1 blocks of 32 KiB (over 4 MiB) out before it was stopped"
# SIGTERM ends a gpunet stuck writing its stdout (it cannot pass it on).
kill $stuck_pid
set +e
wait $stuck_pid
rc=$?
set -e
exec 3<&-
[ $rc = 143 ] || fail "gpunet exec stuck on its stdout exited $rc after SIGTERM, not 143"
ok "a renter that stops reading stops the process after $b1 blocks of 32 KiB (the window plus socket buffers); SIGTERM ends it (143)"

set +e
"$GN_BIN/gpunet" --data-dir "$R" exec "$lease" -- sleep 100 & # not gn_cli: $! must be gpunet itself
pid=$!
gn_wait_until 30 "the provider to start sleep" exec_started sleep 1
sleep 0.5 # runc's signal handlers
kill -INT $pid
t0=$(now_ms)
wait $pid
rc=$?
set -e
[ $rc = 130 ] || fail "exec sleep 100 after SIGINT exited $rc, not 130"
ok "SIGINT to gpunet exec is passed on: sleep ends, exit 130 ($(($(now_ms) - t0)) ms)"

# --- refusals ----------------------------------------------------------------
p_other=$(gn_free_port)
gn_node_start "$nodes/other" other --listen "127.0.0.1:$p_other" --bootstrap "127.0.0.1:$p_prov"
set +e
out=$(gn_cli "$nodes/other" exec "$lease" --job "$job" -- touch /tmp/pwned 2>&1)
rc=$?
set -e
[ $rc = 125 ] && grep -q "no lease $lease" <<<"$out" || fail "another node's exec: rc $rc, '$out'"
out=$(gn_cli "$R" exec "$lease" -- sh -c 'test -e /tmp/pwned && echo yes || echo no')
[ "$out" = no ] || fail "another node's exec ran something"
ok "a node that does not hold the lease is refused (125) and nothing runs"

set +e
out=$(gn_cli "$R" exec "$lease" --job j-000000000000 -- true 2>&1)
rc=$?
set -e
[ $rc = 125 ] && grep -q "no job j-000000000000" <<<"$out" || fail "unknown job: rc $rc, '$out'"
ok "an unknown job is refused with a reason (125)"

# --- the end of the lease ends its exec streams --------------------------------
set +e
gn_cli "$R" exec "$lease" -- sleep 100 2>"$work/lease-end.err" &
pid=$!
gn_wait_until 30 "the provider to start sleep" exec_started sleep 2
gn_cli "$R" release "$lease" >/dev/null
t0=$(now_ms)
wait $pid
rc=$?
set -e
[ $rc != 0 ] || fail "exec survived the lease's release"
[ $(($(now_ms) - t0)) -lt 10000 ] || fail "exec took $(($(now_ms) - t0)) ms to end after the release"
ok "releasing the lease ends a running exec (rc $rc: $(head -c 100 "$work/lease-end.err"))"

echo "PASS ($pass checks)"
