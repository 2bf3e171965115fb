#!/usr/bin/env bash
# Failures of multi-host training (issue 8 items 2, 6, 8), on network-
# namespace hosts (scripts/lib/hosts.sh): "hub" (bootstrap node, registry),
# providers p1..p4 (one simulated RTX 4090 each at 0.50/h; p3 takes leases
# of at most 1 hour; p4 costs 0.60/h and takes billing intervals of at most
# 30 s, which its offer does not say, so it refuses a training lease's 60 s
# when asked) and the requester "req". Groups other than p4's own use
# --max-price 0.50, which leaves p4 out.
#
# Part 1 (today's marketplace): a lease p3 cannot give (2 hours) is refused
# before anything is signed, saying why; nothing is leased or billed on
# either side.
#
# Part 2 (gpunet train; exits 77 saying what is missing while the command or
# the provider side is not in the build):
#  - a 3-GPU group that needs p3 for 2 hours is refused whole by the
#    planner: no lease anywhere, nothing billed;
#  - a 4-GPU gang where p4 refuses its lease: the three leases agreed are
#    released, each billed only the seconds metered before (at most the
#    gang's whole run), nothing stays active;
#  - a gang where p3 does not answer (stopped with SIGSTOP) fails: every
#    lease agreed meanwhile is released, each billed only the seconds it was
#    metered (at most the gang's wait), p3 resumed holds nothing active;
#  - a 3-rank DDP run whose provider p2 is killed (SIGKILL) mid-run: gpunet
#    train ends non-zero, the ranks on p1 and p3 are stopped, their leases
#    end and are countersigned; p2, restarted, settles its lease too and
#    leaves no job network (wireguard-go, namespace) behind.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"
. "$src/scripts/lib/hosts.sh"

gn_e2e_need_root_runc
hosts_need docker-registry
t0=$(now_ms)
gn_e2e_setup train-fail requester p1 p2 p3 p4 bootstrap
hosts_init
prov_extra_p3=(--max-hours 1)
prov_extra_p4=(--price 0.60 --interval-max-s 30)
hosts_market 4 1

four_offers() { [ "$(gn_cli "$R" --json offers | jq '[.offers[].provider] | unique | length')" = 4 ]; }
gn_wait_until 40 "offers from four providers" four_offers || fail "offers from fewer than four providers reached the requester"
[ "$(gn_cli "$R" --json offers | jq -r --arg p "$(gn_cli "$nodes/p4" id)" '.offers[] | select(.provider == $p) | .price_uper_hour')" = 600000 ] ||
  fail "p4's offer does not ask 0.60/h: $(gn_cli "$R" --json offers)"
id_p3=$(gn_cli "$nodes/p3" id)
offer_p3=$(gn_cli "$R" --json offers | jq -r --arg p "$id_p3" '.offers[] | select(.provider == $p) | .id' | head -n 1)

# all_settled MAX_S: every lease the requester holds or held, but those an
# earlier call passed, has an accepted invoice of at most MAX_S seconds,
# countersigned on the provider's side.
settled_ok=" "
all_settled() {
  local max=$1 leases l inv p
  leases=$(gn_cli "$R" --json leases | jq -r '.leases[].id')
  for l in $leases; do
    [[ $settled_ok != *" $l "* ]] || continue
    inv=$(gn_cli "$R" --json invoices | jq -c --arg l "$l" '.invoices[] | select(.lease == $l)')
    [ "$(jq -r .status <<<"$inv")" = accepted ] || return 1
    [ "$(jq -r .seconds <<<"$inv")" -le "$max" ] || return 1
    for p in p1 p2 p3 p4; do
      if gn_cli "$nodes/$p" --json leases | jq -e --arg l "$l" '.leases[] | select(.id == $l)' >/dev/null; then
        [ "$(gn_cli "$nodes/$p" --json invoices | jq -r --arg l "$l" '.invoices[] | select(.lease == $l) | .status')" = accepted ] ||
          return 1
      fi
    done
    settled_ok+="$l "
  done
}
# settled_report: the requester's leases and invoices, for a failure message.
settled_report() {
  gn_cli "$R" --json leases | jq -c '[.leases[] | {id, state}]'
  gn_cli "$R" --json invoices | jq -c '[.invoices[] | {lease, status, seconds}]'
}

set +e
out=$(gn_cli "$R" rent "$offer_p3" --hours 2 --allow-simulated 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] || fail "a 2-hour lease of p3 (--max-hours 1) was given: $out"
grep -qi "hour" <<<"$out" || fail "the refusal does not say why: $out"
hosts_no_lease_active || fail "a refused rent left an active lease: $(settled_report)"
[ "$(gn_cli "$R" --json invoices | jq '.invoices | length')" = 0 ] || fail "a refused rent was invoiced: $(settled_report)"
ok "a lease longer than p3's --max-hours is refused ($(tail -n 1 <<<"$out")); nothing leased or billed anywhere"
echo "part 1 (refusal across hosts): $(($(now_ms) - t0)) ms"

# --- Part 2: failures of gpunet train ----------------------------------------
train_missing() {
  if ! "$GN_BIN/gpunet" train --help >/dev/null 2>&1; then
    echo "gpunet train not available yet (the gpunet CLI has no train command: the requester side of issue 8 is not in this build)"
  elif [ "$(gn_cli "$R" --json offers | jq '[.offers[] | select(.training == true) | .provider] | unique | length')" != 4 ]; then
    echo "the providers do not take training jobs yet (no offer says training=true: the provider side of issue 8 is not in this build)"
  fi
}
missing=$(train_missing)
if [ -n "$missing" ]; then
  echo "SKIP: part 2 (failures of gpunet train): $missing; part 1 passed ($pass checks)"
  exit 77
fi
t2=$(now_ms)
hosts_train_image
train() { gn_cli "$R" train --per-node 1 --image "$timage" --allow-simulated --max-price 0.50 "$@"; }

# A group that needs p3 for longer than it leases: refused whole.
set +e
out=$(timeout 120 "$GN_BIN/gpunet" --data-dir "$R" train --gpus 3 --per-node 1 --image "$timage" --allow-simulated \
  --max-price 0.50 --hours 2 -- true 2>&1)
rc=$?
set -e
[ $rc = 1 ] || fail "a 3-GPU group for 2 hours (p3 leases 1 hour at most) exited $rc: $out"
hosts_no_lease_active || fail "a refused group left an active lease: $(settled_report)"
all_settled 0 || fail "a refused group was billed: $(settled_report)"
ok "a group p3 cannot join for 2 hours is refused whole (exit $rc: $(tail -n 1 <<<"$out")); no lease active, nothing billed"

# leases_count: how many leases the requester has made so far.
leases_count() { gn_cli "$R" --json leases | jq '.leases | length'; }

# A gang where p4 refuses its lease (billing interval): the agreed ones are
# released.
n0=$(leases_count)
t_gang=$(now_ms)
set +e
out=$(timeout 120 "$GN_BIN/gpunet" --data-dir "$R" train --gpus 4 --per-node 1 --image "$timage" --allow-simulated \
  --hours 1 -- true 2>&1)
rc=$?
set -e
gang_s=$((($(now_ms) - t_gang + 999) / 1000))
[ $rc = 1 ] || fail "a gang p4 refuses exited $rc: $out"
grep -q "billing interval" <<<"$out" || fail "gpunet train does not say why p4 refused: $out"
gn_wait_until 30 "every lease of the refused gang to end" hosts_no_lease_active ||
  fail "the refused gang left active leases: $(settled_report)"
gn_wait_until 30 "the refused gang's leases to settle" all_settled "$gang_s" ||
  fail "the refused gang's leases were not settled within ${gang_s} s each: $(settled_report)"
n=$(($(leases_count) - n0))
[ "$n" -ge 1 ] && [ "$n" -le 4 ] || fail "the 4-GPU gang made $n leases"
ok "a gang p4 refuses fails in ${gang_s} s saying why; its $n lease(s) released, each billed at most ${gang_s} s, countersigned"

# A gang whose third member does not answer: p3 stopped (SIGSTOP) right
# before; the gang fails, what was agreed is released. --no-attest: with
# attestation (the default) the frozen p3 would be dropped before any lease
# is asked for, and the gang's no-answer path would not run.
p3_pid=$(cat "$nodes/p3/gpunetd.pid")
n0=$(leases_count)
kill -STOP "$p3_pid"
t_gang=$(now_ms)
set +e
out=$(timeout 150 "$GN_BIN/gpunet" --data-dir "$R" train --gpus 3 --per-node 1 --image "$timage" --allow-simulated \
  --no-attest --max-price 0.50 --hours 1 -- true 2>&1)
rc=$?
set -e
gang_s=$((($(now_ms) - t_gang + 999) / 1000))
kill -CONT "$p3_pid"
[ $rc = 1 ] || fail "a gang with an unanswering member exited $rc: $out"
gn_wait_until 30 "every lease of the failed gang to end" hosts_no_lease_active ||
  fail "the failed gang left active leases: $(settled_report)"
gn_wait_until 30 "the failed gang's leases to settle" all_settled "$gang_s" ||
  fail "the failed gang's leases were not settled within ${gang_s} s each: $(settled_report)"
n=$(($(leases_count) - n0))
ok "a gang whose p3 does not answer fails after ${gang_s} s (exit $rc: $(tail -n 1 <<<"$out")); its $n lease(s) released (p3's agreed late), billed at most ${gang_s} s each, countersigned; p3 resumed holds nothing"

# A provider killed mid-run.
base_leases=$(leases_count)
train --gpus 3 --hours 1 -f -- python3 /opt/gpunet/train/ddp.py --steps 100000 --ckpt-every 0 --timeout 30 \
  --log-every 20 >"$work/run.out" 2>&1 &
train_pid=$!
for ((i = 0; i < 600; i++)); do
  grep -q "step [0-9]* loss" "$work/run.out" && break
  kill -0 "$train_pid" 2>/dev/null || break
  sleep 0.2
done
grep -q "step [0-9]* loss" "$work/run.out" ||
  fail "the group never trained$(hosts_image_hint "$work/run.out"): $(tail -n 20 "$work/run.out")"
kill -9 "$(cat "$nodes/p2/gpunetd.pid")"
t_kill=$(now_ms)
set +e
# gpunet train must notice and stop the group: bounded by the wait below.
for _ in $(seq 600); do kill -0 "$train_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$train_pid" 2>/dev/null && {
  kill "$train_pid"
  fail "gpunet train still runs 60 s after p2 was killed: $(tail -n 20 "$work/run.out")"
}
wait "$train_pid"
rc=$?
set -e
stop_s=$((($(now_ms) - t_kill) / 1000))
[ $rc -ne 0 ] || fail "gpunet train exited 0 although p2 was killed mid-run: $(tail -n 20 "$work/run.out")"
# Stopped because p2 was lost, not because a rank gave up by itself.
grep -q "unreachable" "$work/run.out" || fail "gpunet train does not say p2's provider was lost: $(grep -v step "$work/run.out" | tail -n 10)"
for p in p1 p3; do
  running=$(gn_cli "$nodes/$p" --json jobs | jq '[.jobs[] | select(.state == "running")] | length')
  [ "$running" = 0 ] || fail "$p still runs $running job(s) after the group stopped"
  [ "$(hosts_leases_active "$nodes/$p")" = 0 ] || fail "$p still holds an active lease after the group stopped"
done
ok "p2 killed mid-run: gpunet train ended (exit $rc) within $stop_s s, the ranks on p1 and p3 stopped and their leases ended"

# p2 comes back: its lease is settled, its crashed run's job network is gone.
hosts_provider_start p2
gn_wait_until 60 "every lease to end" hosts_no_lease_active || fail "leases still active after p2 restarted: $(settled_report)"
gn_wait_until 60 "every lease to settle" all_settled 3600 || fail "leases not settled after p2 restarted: $(settled_report)"
[ "$(leases_count)" = $((base_leases + 3)) ] || fail "the run made $(($(leases_count) - base_leases)) leases, want 3"
left=$(hosts_exec p2 ps -o comm= -p "$(ip netns pids "${hosts_ns[p2]}" | paste -sd, -)" 2>/dev/null | grep -c wireguard || true)
[ "$left" = 0 ] || fail "p2 restarted still has $left wireguard-go process(es) of the crashed run"
[ -z "$(ls -A "$nodes/p2/run/netns" 2>/dev/null)" ] || fail "p2 restarted keeps job namespaces: $(ls "$nodes/p2/run/netns")"
ok "p2 restarted: every lease of the run settled and countersigned; no wireguard-go or job namespace of the crashed run left"
echo "part 2 (failures of gpunet train): $(($(now_ms) - t2)) ms"
echo "$pass passed, 0 failed ($(($(now_ms) - t0)) ms)"
