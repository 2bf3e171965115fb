#!/usr/bin/env bash
# gpunet train --restarts across hosts (issue 8 items 6 and 7): a group
# restarted after a provider is lost resumes from its last checkpoint on a
# spare provider. Network-namespace hosts (scripts/lib/hosts.sh): "hub"
# (bootstrap node, registry), providers p1..p3 (one simulated RTX 4090
# each, same price) and the requester "req". `gpunet train --gpus 2
# --restarts 1 --output DIR -f` runs examples/train/ddp.py through a small
# wrapper: a rank whose /output holds no checkpoint (the first run) trains
# to step 20, checkpointing at 10 and 20, then holds (sleeps); a rank whose
# /output holds one (the restart, seeded by the requester) runs ddp.py to
# step 40, which resumes from the latest checkpoint. Once both ranks hold,
# one member's provider gpunetd is killed (SIGKILL, with every process of its
# host namespace): the requester loses it
# after its 20 s grace, fetches the surviving rank's /output, leases the
# spare, and starts both ranks again with that seed. Checked: the group
# went through "restarting" to the spare, rank 0 of the restart printed
# "start 20" (not 0) and trained 20 steps, both ranks end with the same
# final parameters (and, where the host has PyTorch, the same as an
# uninterrupted local 2-rank run), gpunet train exits 0 and --output holds
# each rank's checkpoint of step 40; the requester keeps no seed file after
# the end. Skipped (77) with the reason where root, namespaces, runc, the
# registry or the training image are missing.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/hosts.sh"

gn_e2e_need_root_runc
hosts_need docker-registry
"$GN_BIN/gpunet" train --help >/dev/null 2>&1 || {
  echo "SKIP: gpunet train is not in this build"
  exit 77
}
t0=$(now_ms)
gn_e2e_setup train-restart requester p1 p2 p3 bootstrap
hosts_init
hosts_market 3 1
# The image first, outside hosts_train_image, so that one that cannot be
# built skips the test instead of failing it.
if ! "$src/scripts/image/train-image" build >"$work/train-image-build.log" 2>&1; then
  echo "SKIP: the training image cannot be built here: $(tail -n 3 "$work/train-image-build.log")"
  exit 77
fi
three_offers() { [ "$(gn_cli "$R" --json offers | jq '[.offers[] | select(.training == true) | .provider] | unique | length')" = 3 ]; }
gn_wait_until 40 "training offers from three providers" three_offers ||
  fail "training offers from fewer than three providers reached the requester: $(gn_cli "$R" --json offers)"
hosts_train_image
t1=$(now_ms)

# The wrapper: first run to step 20 and hold; a seeded run to the end.
wrap='if ls /output/ckpt-r*.pt >/dev/null 2>&1; then
  echo "rank $RANK: seeded with $(ls /output | tr "\n" " ")"
  exec python3 /opt/gpunet/train/ddp.py --steps 40 --ckpt-every 10 --timeout 120 --log-every 5
fi
python3 /opt/gpunet/train/ddp.py --steps 40 --ckpt-every 10 --timeout 120 --log-every 5 --exit-after 20 || true
echo "rank $RANK holds after step 20"
exec sleep 600'
set +e
timeout 240 "$GN_BIN/gpunet" --data-dir "$R" train --gpus 2 --per-node 1 --restarts 1 --image "$timage" \
  --allow-simulated --hours 1 --output "$work/out" -f -- sh -c "$wrap" >"$work/run.out" 2>&1 &
train_pid=$!
set -e
for ((i = 0; i < 900; i++)); do
  [ "$(grep -c "rank [01] holds after step 20" "$work/run.out")" = 2 ] && break
  kill -0 "$train_pid" 2>/dev/null || break
  sleep 0.2
done
[ "$(grep -c "rank [01] holds after step 20" "$work/run.out")" = 2 ] ||
  fail "the first run did not reach step 20 on both ranks$(hosts_image_hint "$work/run.out"): $(tail -n 30 "$work/run.out")"
id=$(grep -o "training j-[0-9a-f]*" "$work/run.out" | head -n 1 | awk '{print $2}')
[ -n "$id" ] || fail "gpunet train printed no training id: $(head -n 20 "$work/run.out")"
ok "first run: both ranks trained to step 20 (checkpoints at 10 and 20) and hold"

# The members: the providers running a rank now; the spare is the third.
members=()
for p in p1 p2 p3; do
  n=$(gn_cli "$nodes/$p" --json jobs | jq '[.jobs[] | select(.state == "running")] | length')
  [ "$n" = 0 ] || members+=("$p")
done
[ "${#members[@]}" = 2 ] || fail "want ranks on two providers, found them on: ${members[*]}"
for p in p1 p2 p3; do [[ " ${members[*]} " == *" $p "* ]] || spare=$p; done
victim=${members[1]}
# The host goes down: its gpunetd and whatever else runs in its namespace
# (the rank's wireguard-go too, as when a real machine goes off; its
# interface is named after its job, so the rank on the spare never meets it).
kill -9 "$(cat "$nodes/$victim/gpunetd.pid")"
for pid in $(ip netns pids "${hosts_ns[$victim]}"); do kill -9 "$pid" 2>/dev/null || true; done
t_kill=$(now_ms)

set +e
for _ in $(seq 1500); do kill -0 "$train_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$train_pid" 2>/dev/null && {
  kill "$train_pid"
  fail "gpunet train still runs 150 s after $victim was killed: $(tail -n 30 "$work/run.out")"
}
wait "$train_pid"
rc=$?
set -e
run_s=$((($(now_ms) - t_kill) / 1000))
[ $rc = 0 ] || fail "gpunet train exited $rc after $victim was killed: $(tail -n 40 "$work/run.out")"
grep -q "training $id: restarting" "$work/run.out" || fail "the group never said it was restarting: $(grep -v step "$work/run.out" | tail -n 20)"
spare_id=$(gn_cli "$nodes/$spare" id)
gn_cli "$nodes/$spare" --json jobs | jq -e '[.jobs[] | select(.state == "exited" and .exit_code == 0)] | length == 1' >/dev/null ||
  fail "the spare $spare ran no rank to the end: $(gn_cli "$nodes/$spare" --json jobs)"
ok "$victim killed (SIGKILL): the group restarted on the spare $spare (${spare_id:0:12}…) and gpunet train exited 0 after $run_s s"

# The restart resumed from step 20: rank 0's log of the last run.
log0=$(gn_cli "$R" logs "$id" --rank 0)
log1=$(gn_cli "$R" logs "$id" --rank 1)
grep -q "^rank 0: seeded with .*ckpt-r" <<<"$log0" || fail "rank 0 of the restart had no checkpoint in /output: $(head -n 5 <<<"$log0")"
start=$(sed -n 's/^ddp: .* start \([0-9]*\) .*/\1/p' <<<"$log0")
[ "$start" = 20 ] || fail "the restart started from step '${start}', not 20: $(head -n 5 <<<"$log0")"
steps=$(sed -n 's/^rank 0 summary steps \([0-9]*\) .*/\1/p' <<<"$log0")
[ "$steps" = 20 ] || fail "the restart ran '$steps' steps, want 20"
ok "the restarted ranks resumed from the checkpoint of step 20 (rank 0: start $start, $steps steps)"
h0=$(sed -n 's/^rank 0 final_params_sha256 \([0-9a-f]\{64\}\)$/\1/p' <<<"$log0")
h1=$(sed -n 's/^rank 1 final_params_sha256 \([0-9a-f]\{64\}\)$/\1/p' <<<"$log1")
[ -n "$h0" ] && [ "$h0" = "$h1" ] || fail "final hashes differ or are missing: rank 0 '$h0', rank 1 '$h1'"
ok "both ranks end with the same parameters ${h0:0:16}…"

# The same as an uninterrupted run, where the host has PyTorch.
py=${GN_TRAIN_PYTHON:-/usr/bin/python3}
if [ -x "$py" ] && "$py" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  mport=$(gn_free_port)
  lpids=()
  for r in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$mport RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GLOO_SOCKET_IFNAME=lo \
      OMP_NUM_THREADS=1 timeout 120 "$py" "$src/examples/train/ddp.py" --output "$work/local/r$r" --steps 40 \
      --ckpt-every 10 --timeout 60 --log-every 40 >"$work/local-r$r.log" 2>&1 &
    lpids+=($!)
  done
  wait "${lpids[@]}" || true # (not a bare wait: the daemons are this shell's children too)
  href=$(sed -n 's/^rank 0 final_params_sha256 \([0-9a-f]\{64\}\)$/\1/p' "$work/local-r0.log")
  [ -n "$href" ] || fail "the local uninterrupted run printed no hash: $(tail -n 5 "$work/local-r0.log")"
  [ "$href" = "$h0" ] || fail "the restarted run ends with $h0, an uninterrupted one with $href"
  ok "the restarted run ends exactly where an uninterrupted local run does"
else
  echo "note: no PyTorch on this host: the comparison with an uninterrupted run is left out"
fi

for r in 0 1; do
  f=$work/out/rank-$r.tar
  [ -s "$f" ] || fail "no $f: $(ls -la "$work/out" 2>&1)"
  list=$(tar -tf "$f") || fail "cannot list $f"
  grep -q "ckpt-r$r-00000040.pt\$" <<<"$list" || fail "rank $r's /output lacks its checkpoint of step 40: $(head <<<"$list")"
done
ok "--output: each rank's checkpoint of step 40 copied back"
[ ! -e "$R/train/$id" ] || fail "the requester keeps seed files after the end: $(ls -laR "$R/train/$id")"
ok "no seed file left on the requester"
echo "$pass passed, 0 failed (restart part $(($(now_ms) - t1)) ms, all $(($(now_ms) - t0)) ms)"
