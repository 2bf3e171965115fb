#!/usr/bin/env bash
# The two layouts of a lease's workspace on a real provider (runc jobs, a
# busybox image on a loopback registry):
#  - workspace_fs = auto (the default): a file system of workspace_max per
#    lease, an ext4 image on a loop device mounted in gpunetd's namespace
#    only. A job sees its size in df; its writes stop at the budget as they
#    are made, however many files it spreads them over; a provider restart
#    mounts it again with the files in it, leaving no loop device behind;
#    the release detaches it and removes the image.
#  - workspace_fs = dir: a directory, what jobs write measured every 10 s;
#    a job that writes past the budget is stopped by that survey.
# (e2e_test_cp runs the copies themselves, on the default layout.)
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
for t in jq nsenter losetup mkfs.ext4; do
  command -v $t >/dev/null || {
    echo "SKIP: needs $t (scripts/deps installs it)"
    exit 77
  }
done
gn_e2e_setup wsfs requester provider
gn_e2e_registry e2e/busybox:1
gn_e2e_compat_flags
gn_e2e_start_provider --workspace-max 64M "${gn_e2e_compat[@]}"
gn_e2e_start_requester
gn_e2e_wait_offer 30
gn_e2e_rent --no-attest
ws=$P/workspace/$lease
alias_img=/run/gpunet/data/workspace/$lease/fs.img
loops() { losetup -a | grep -c -- "$alias_img" || true; }
inws() { nsenter -t "$(cat "$P/gpunetd.pid")" -m -- "$@"; }

# --- the default: a file system of its own ------------------------------------
[ -f "$ws/fs.img" ] && [ ! -e "$ws/upper" ] || fail "the lease's workspace is not an image: $(ls -la "$ws")"
[ "$(stat -c %s "$ws/fs.img")" = $((64 << 20)) ] || fail "the image is not 64 MiB: $(stat -c %s "$ws/fs.img")"
[ "$(loops)" = 1 ] || fail "$(loops) loop devices hold the lease's image: $(losetup -a)"
out=$(gn_cli "$R" run "$lease" --image "$image" -f -- sh -c 'df -k /workspace | tail -1') || fail "df job: $out"
size_k=$(awk 'NF >= 2 {print $2}' <<<"$out" | tail -1)
[ "$size_k" -gt $((60 << 10)) ] && [ "$size_k" -le $((64 << 10)) ] || fail "df in the job: $out"
ok "the lease's workspace is a 64 MiB file system on one loop device (df in a job: $size_k KiB)"

# Past the budget in one file, then in 2,000 small ones: each write refused
# as it is made (ENOSPC), the job running on, the usage within the budget.
out=$(gn_cli "$R" run "$lease" --image "$image" -f -- sh -c '
  head -c 100000000 /dev/zero >/workspace/big 2>/dev/null || echo BIG-REFUSED
  rm /workspace/big
  mkdir /workspace/many
  i=0; refused=0
  while [ $i -lt 2000 ]; do
    head -c 65536 /dev/zero >/workspace/many/f$i 2>/dev/null || refused=$((refused+1))
    i=$((i+1))
  done
  echo refused=$refused
  df -k /workspace | tail -1' 2>&1) || fail "the filling job failed: $out"
grep -q "^BIG-REFUSED" <<<"$out" || fail "100 MB into a 64 MiB workspace was not refused: $out"
refused=$(sed -n 's/^refused=//p' <<<"$out")
[ -n "$refused" ] && [ "$refused" -ge 500 ] || fail "2,000 files of 64 KiB in 64 MiB: only ${refused:-?} refused: $out"
used=$(inws du -sk "/run/gpunet/data/workspace/$lease/fs/upper" | cut -f1)
[ "$used" -le $((64 << 10)) ] || fail "the workspace holds $used KiB, past its 64 MiB"
ok "writes past the budget are refused as they are made: 100 MB in one file, $refused of 2,000 small files ($used KiB used)"

# A copy into the full workspace is refused with the reason.
head -c 1000000 /dev/urandom >"$work/one.bin"
gn_cli "$R" cp "$work/one.bin" "$lease:one.bin" 2>"$work/full.err" && fail "a copy into the full workspace was accepted"
grep -q "workspace is full (64 MiB)" "$work/full.err" || fail "copy into the full workspace: $(cat "$work/full.err")"
gn_cli "$R" run "$lease" --image "$image" -f -- rm -rf /workspace/many >/dev/null || fail "cannot empty the workspace"
gn_cli "$R" cp "$work/one.bin" "$lease:one.bin" 2>/dev/null || fail "a copy after emptying the workspace failed"
ok "a copy into the full workspace is refused (\"$(grep -o "the lease's workspace is full ([0-9]* MiB)" "$work/full.err")\"), and goes in once it is emptied"

# A provider that crashes (a clean stop ends its leases) and restarts: the
# image is mounted again on first need, the files in it; the dead daemon's
# loop device went with its mount namespace.
gn_node_kill "$P"
gone_loop() { [ "$(loops)" = 0 ]; }
gn_wait_until 10 "the stopped provider's loop device let go" gone_loop || fail "a loop device outlived the provider: $(losetup -a)"
gn_node_start "$P" provider "${prov_args[@]}"
back() { gn_cli "$R" cp "$lease:one.bin" "$work/one.back" 2>/dev/null; }
gn_wait_until 30 "the file read back after the restart" back || fail "the workspace's file after a provider restart: $(gn_cli "$R" cp "$lease:one.bin" "$work/one.back" 2>&1)"
cmp -s "$work/one.bin" "$work/one.back" || fail "the file read back after the restart differs"
[ "$(loops)" = 1 ] || fail "$(loops) loop devices hold the image after the restart: $(losetup -a)"
ok "after a provider crash and restart the workspace is mounted again with its file (one loop device)"

# The release: the file system detached, the image removed.
gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
removed() { [ ! -e "$ws" ] && [ "$(loops)" = 0 ]; }
gn_wait_until 30 "the workspace removed" removed || fail "after the release: $(ls -la "$ws" 2>&1); $(losetup -a)"
ok "after the release the image is removed and its loop device let go"

# --- workspace_fs = dir: the survey -------------------------------------------
gn_node_stop "$P"
gn_node_start "$P" provider "${prov_args[@]}" --workspace-fs dir
rented() { lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest 2>/dev/null | jq -r .lease.id) && [[ $lease == l-* ]]; }
gn_wait_until 30 "a lease of the restarted provider" rented || fail "no lease of the provider restarted with --workspace-fs dir"
ws=$P/workspace/$lease
[ -d "$ws/upper" ] && [ ! -e "$ws/fs.img" ] || fail "workspace_fs = dir made: $(ls -la "$ws")"
job=$(gn_cli "$R" --json run "$lease" --image "$image" -- sh -c 'head -c 100000000 /dev/zero >/workspace/fill; sleep 120' |
  jq -r .job.id)
stopped() { gn_cli "$R" --json jobs | jq -e --arg j "$job" '.jobs[] | select(.id==$j) | select(.error // "" | test("workspace passed its budget"))' >/dev/null; }
gn_wait_until 40 "the job filling the workspace stopped" stopped ||
  fail "a job filling the workspace past its budget ran on: $(gn_cli "$R" --json jobs | jq -c --arg j "$job" '.jobs[] | select(.id==$j)')"
ok "workspace_fs = dir: a directory, and a job that writes past its budget is stopped by the survey"

out=$("$GN_BIN/gpunetd" --data-dir "$work/bad" --workspace-fs ext9 2>&1) && fail "gpunetd took --workspace-fs ext9"
grep -q "bad workspace_fs 'ext9'" <<<"$out" && [ ! -e "$work/bad" ] || fail "--workspace-fs ext9 said: $out"
ok "a bad workspace_fs is refused, nothing made: $(head -1 <<<"$out")"
