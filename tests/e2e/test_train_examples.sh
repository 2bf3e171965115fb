#!/usr/bin/env bash
# The training examples (examples/train/ddp.py, diloco.py), 3 ranks each on
# loopback, started as plain processes with the env:// variables a training
# job gets (torchrun is broken on Debian's Python 3.11): every rank exits 0
# and prints the same final parameter hash; DiLoCo sends fewer bytes per step
# than DDP; DDP's count is the ring all-reduce share of its parameters and
# the loopback saw at least what all ranks counted; a group stopped after a
# checkpoint and started again resumes from that checkpoint (not from
# scratch) and ends with the same hash as an uninterrupted run, also when one
# rank lost its checkpoints (a replacement); bad flags are refused with a
# clear error before anything is written.
set -euo pipefail
src=${GN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$src/scripts/lib/e2e.sh"

py=${GN_TRAIN_PYTHON:-/usr/bin/python3} # the tests use Debian's python3-torch
if ! [ -x "$py" ] || ! "$py" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  echo "SKIP: $py with PyTorch (gloo) is not installed (apt-get install python3-torch; scripts/deps)"
  exit 77
fi

gn_e2e_setup train
ex=$src/examples/train
W=3
# Small and quick: 30 steps of a 77k-parameter MLP, checkpoints every 10.
steps=30
common=(--steps "$steps" --ckpt-every 10 --timeout 60 --log-every 10)

# group NAME SCRIPT ARGS...: runs W ranks of SCRIPT, each with output folder
# $work/NAME/rN and log $work/NAME/rN.log, waits for all; the ranks' exit
# codes go to $work/NAME/rc (one line).
group() {
  local name=$1 script=$2 port r pids=() rcs=()
  shift 2
  port=$(gn_free_port) || fail "no free port"
  mkdir -p "$work/$name"
  for ((r = 0; r < W; r++)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$W LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
      timeout 150 "$py" "$script" --output "$work/$name/r$r" "$@" >"$work/$name/r$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do
    if wait "$r"; then rcs+=(0); else rcs+=($?); fi
  done
  echo "${rcs[*]}" >"$work/$name/rc"
}

# expect_rc NAME "0 0 0"
expect_rc() {
  local got
  got=$(cat "$work/$1/rc")
  if [ "$got" != "$2" ]; then
    for ((r = 0; r < W; r++)); do
      echo "--- $1 rank $r" >&2
      tail -n 15 "$work/$1/r$r.log" >&2
    done
    fail "$1: exit codes '$got', want '$2'"
  fi
}

# hash NAME: the final hash all ranks of NAME agree on (fails if they differ
# or one is missing).
hash() {
  local h r all=()
  for ((r = 0; r < W; r++)); do
    h=$(sed -n "s/^rank $r final_params_sha256 \([0-9a-f]\{64\}\)$/\1/p" "$work/$1/r$r.log")
    [ -n "$h" ] || fail "$1: rank $r printed no final hash"
    all+=("$h")
  done
  for h in "${all[@]}"; do [ "$h" = "${all[0]}" ] || fail "$1: ranks disagree: ${all[*]}"; done
  echo "${all[0]}"
}

# field NAME RANK KEY: the value after KEY on rank RANK's summary line.
field() {
  local v
  v=$(sed -n "s/^rank $2 summary .*\b$3 \([0-9.]*\).*/\1/p" "$work/$1/r$2.log")
  [ -n "$v" ] || fail "$1: rank $2 has no $3 in its summary"
  echo "$v"
}

t0=$(now_ms)
for algo in ddp diloco; do
  group "$algo-full" "$ex/$algo.py" "${common[@]}"
  expect_rc "$algo-full" "0 0 0"
  full=$(hash "$algo-full")
  ok "$algo: $W ranks exit 0 with the same final hash ${full:0:16}…"

  # Stopped after step 15: the checkpoint of step 10 is there, none later.
  group "$algo-cut" "$ex/$algo.py" "${common[@]}" --exit-after 15
  expect_rc "$algo-cut" "75 75 75"
  for ((r = 0; r < W; r++)); do
    [ -f "$work/$algo-cut/r$r/ckpt-r$r-00000010.pt" ] || fail "$algo: rank $r wrote no checkpoint of step 10"
    [ ! -e "$work/$algo-cut/r$r/ckpt-r$r-00000020.pt" ] || fail "$algo: rank $r checkpointed beyond --exit-after"
  done
  cp -a "$work/$algo-cut" "$work/$algo-repl"
  group "$algo-cut" "$ex/$algo.py" "${common[@]}"
  expect_rc "$algo-cut" "0 0 0"
  grep -q "^$algo: .* start 10 " "$work/$algo-cut/r0.log" || fail "$algo: the restart did not resume from step 10: $(head -n 1 "$work/$algo-cut/r0.log")"
  [ "$(field "$algo-cut" 0 steps)" = 20 ] || fail "$algo: the restart ran $(field "$algo-cut" 0 steps) steps, want 20"
  [ "$(hash "$algo-cut")" = "$full" ] || fail "$algo: resumed run ends with $(hash "$algo-cut"), uninterrupted with $full"
  ok "$algo: stopped after step 15, restarted from the checkpoint of step 10, same final hash"
done

# DDP's whole state is shared, so a rank that lost its checkpoints (a
# replacement provider) gets it from another and the result is still exact.
rm -f "$work/ddp-repl/r2/"ckpt-*
group ddp-repl "$ex/ddp.py" "${common[@]}"
expect_rc ddp-repl "0 0 0"
grep -q "^ddp: .* start 10 " "$work/ddp-repl/r0.log" || fail "ddp: replacement run did not resume from step 10"
[ "$(hash ddp-repl)" = "$(hash ddp-full)" ] || fail "ddp: with a replaced rank the run ends with $(hash ddp-repl), want $(hash ddp-full)"
ok "ddp: a rank without checkpoints gets step 10 from the others, same final hash"
# DiLoCo's inner optimizer state is each rank's own: the replacement starts
# it afresh, so only agreement is required.
rm -f "$work/diloco-repl/r1/"ckpt-*
group diloco-repl "$ex/diloco.py" "${common[@]}"
expect_rc diloco-repl "0 0 0"
grep -q "^rank 1: no checkpoint of step 10 here" "$work/diloco-repl/r1.log" || fail "diloco: the replacement rank did not say it took the state from another"
hash diloco-repl >/dev/null
ok "diloco: a rank without checkpoints joins from step 10, ranks agree"

# Bytes per step: DDP all-reduces every parameter each step; DiLoCo every
# 10th step (its default H).
nparam=$(sed -n 's/^ddp: .* params \([0-9]*\) .*/\1/p' "$work/ddp-full/r0.log")
ddp_b=$(field ddp-full 0 sent_bytes_per_step)
dil_b=$(field diloco-full 0 sent_bytes_per_step)
want=$((nparam * 4 * 2 * (W - 1) / W))
[ "$ddp_b" = "$want" ] || fail "ddp: $ddp_b bytes per step counted, want $want (params $nparam x 4 x 2(W-1)/W)"
[ "$dil_b" -lt "$ddp_b" ] || fail "diloco sends $dil_b bytes per step, not fewer than ddp's $ddp_b"
[ $((dil_b * 10)) -le $((ddp_b + 10)) ] || fail "diloco sends $dil_b bytes per step, more than a tenth of ddp's $ddp_b"
ok "bytes per step: ddp $ddp_b (= ring share of $nparam float32), diloco $dil_b"
tx=$(field ddp-full 0 iface_tx_bytes_per_step)
[ "$tx" -ge $((W * ddp_b)) ] || fail "ddp: loopback sent $tx bytes per step, fewer than the $W ranks counted ($((W * ddp_b)))"
ok "ddp: loopback tx per step $tx >= $W x counted"

# Bad flags: a clear error (argparse, exit 2), nothing written.
set +e
out=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=1 RANK=0 WORLD_SIZE=1 "$py" "$ex/diloco.py" --output "$work/bad" --inner-steps 10 --ckpt-every 15 2>&1)
rc=$?
out2=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=1 RANK=0 WORLD_SIZE=1 "$py" "$ex/ddp.py" --output "$work/bad" --steps 0 2>&1)
rc2=$?
set -e
[ $rc = 2 ] && grep -q "ckpt-every must be 0 or a multiple of --inner-steps" <<<"$out" || fail "diloco --ckpt-every 15 with H 10: exit $rc: $out"
[ $rc2 = 2 ] && grep -q -- "--steps.* must be >= 1" <<<"$out2" || fail "ddp --steps 0: exit $rc2: $out2"
[ ! -e "$work/bad" ] || fail "a refused run made its output folder"
ok "bad flags refused (exit 2, clear message), nothing written"

echo "# $pass checks in $((($(now_ms) - t0) / 1000)) s"
