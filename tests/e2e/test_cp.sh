#!/usr/bin/env bash
# gpunet cp (issue 10 item 3): a 100 MB file of random bytes copied into a
# lease's workspace, read by a job at /workspace (its SHA-256 printed by
# the job equals the local one), a file the job writes copied back down and
# verified; an upload interrupted half way (GN_CP_STOP_AFTER) and a
# download interrupted likewise resume (resumed_from > 0) and verify; plain
# progress lines on stderr when it is not a terminal; bad paths refused;
# a job's mountinfo does not show the provider's data dir (the workspace is
# an overlay view, not a bind of the directory); two jobs of the lease
# running at once see each other's files, cp reads a running job's file and
# a running job sees a cp upload; after the release the workspace is gone
# on the provider. A real registry,
# a provider (simulated GPU) and a requester over real sockets, real runc.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
command -v jq >/dev/null || {
  echo "SKIP: needs jq"
  exit 77
}
gn_e2e_setup cp requester provider
gn_e2e_registry e2e/busybox:1
gn_e2e_compat_flags
# a workspace budget of 280 MiB: the copies below take 250 MB of it
gn_e2e_start_provider --workspace-max 280M "${gn_e2e_compat[@]}"
gn_e2e_start_requester
gn_e2e_wait_offer 30
gn_e2e_rent --no-attest
ws=$P/workspace/$lease
# The workspace is a file system of its own (an ext4 image of the budget,
# mounted in gpunetd's mount namespace only): its files are read here
# through that namespace (read only; the provider writes them).
[ -f "$ws/fs.img" ] || fail "the lease's workspace $ws has no file system image at its start"
[ "$(stat -c %s "$ws/fs.img")" = $((280 << 20)) ] || fail "the image is not the budget's size: $(stat -c %s "$ws/fs.img")"
inws() { nsenter -t "$(cat "$P/gpunetd.pid")" -m -- "$@"; }
wsf=/run/gpunet/data/workspace/$lease/fs/upper
inws test -d "$wsf" || fail "the lease's workspace is not mounted in the provider's namespace"
[ -z "$(ls -A "$ws/fs")" ] || fail "the lease's files show on the host's path: $(ls -A "$ws/fs")"
ok "the lease's workspace is a 280 MiB file system of its own, mounted for the provider alone"
ok "the lease's workspace exists on the provider from the lease's start"

head -c 100000000 /dev/urandom >"$work/big.bin"
want=$(sha256sum "$work/big.bin" | cut -d' ' -f1)

# Upload, interrupted after ~30 MB, then resumed.
GN_CP_STOP_AFTER=30000000 gn_cli "$R" cp "$work/big.bin" "$lease:in/big.bin" 2>"$work/stop.err" &&
  fail "GN_CP_STOP_AFTER did not stop the upload"
grep -q "stopped after" "$work/stop.err" || fail "no stop message: $(cat "$work/stop.err")"
part=$(inws stat -c %s "$wsf/in/big.bin")
[ "$part" -ge 30000000 ] && [ "$part" -lt 100000000 ] || fail "the interrupted upload left $part bytes"
ok "an upload stopped after $part bytes"

t0=$(now_ms)
out=$(gn_cli "$R" --json cp "$work/big.bin" "$lease:in/big.bin" 2>"$work/up.err") || fail "resumed upload: $(cat "$work/up.err")"
t1=$(now_ms)
[ "$(jq -r .sha256 <<<"$out")" = "$want" ] || fail "upload sha256: $out"
[ "$(jq -r .resumed_from <<<"$out")" = "$part" ] || fail "the upload did not resume from $part: $out"
[ "$(jq -r .bytes <<<"$out")" = 100000000 ] || fail "bytes: $out"
# (progress stays quiet for a wait's first second: looked for only when slower)
if [ $((t1 - t0)) -ge 2000 ]; then
  grep -q '"event"' "$work/up.err" || fail "no JSON progress events on stderr: $(head -c 600 "$work/up.err")"
fi
ok "the upload resumed from $part and verified ($((t1 - t0)) ms for the rest)"

# A whole upload, timed, with plain progress lines (stderr is a file).
t0=$(now_ms)
gn_cli "$R" cp "$work/big.bin" "$lease:big.bin" >"$work/up2.out" 2>"$work/up2.err" ||
  fail "upload: $(cat "$work/up2.err")"
t1=$(now_ms)
grep -q "verified" "$work/up2.out" || fail "upload summary: $(cat "$work/up2.out")"
[ "$(inws sha256sum "$wsf/big.bin" | cut -d' ' -f1)" = "$want" ] || fail "the provider's copy differs"
up_ms=$((t1 - t0))
lines=$(grep -c . "$work/up2.err" || true)
[ "$lines" -ge 1 ] || [ $((t1 - t0)) -lt 2000 ] || fail "no plain progress lines on stderr in $((t1 - t0)) ms"
ok "100 MB uploaded in $up_ms ms ($((100000 / (up_ms > 0 ? up_ms : 1))) MB/s), verified; $lines plain progress line(s)"

# The job sees it at /workspace and writes a file back.
out=$(gn_cli "$R" run "$lease" --image "$image" -f -- sh -c \
  'sha256sum /workspace/big.bin; head -c 50000000 /workspace/big.bin >/workspace/out.bin; echo made') ||
  fail "the job failed: $out"
grep -q "^$want " <<<"$out" || fail "the job read another file: $out"
ok "a job on the lease reads /workspace/big.bin with the same SHA-256"
want_out=$(head -c 50000000 "$work/big.bin" | sha256sum | cut -d' ' -f1)

# What a job learns of the host through /workspace: not the data dir's path.
out=$(gn_cli "$R" run "$lease" --image "$image" -f -- sh -c 'cat /proc/self/mountinfo; cat /sys/block/loop*/loop/backing_file 2>/dev/null') ||
  fail "mountinfo job: $out"
grep -q " /workspace " <<<"$out" || fail "no /workspace in the job's mountinfo: $out"
grep -q "$work" <<<"$out" && fail "the job's mountinfo or a loop device's backing file shows the provider's data dir: $(grep -m1 "$work" <<<"$out" | cut -c1-200)"
ok "a job's mountinfo has /workspace without the provider's data dir: $(grep -m1 " /workspace " <<<"$out" | cut -d' ' -f4-9)"

# Two jobs of the lease at once share /workspace both ways, a cp download
# reads what a running job wrote, and a running job sees a cp upload.
waitfor='i=0; while [ ! -s "$1" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done'
ja=$(gn_cli "$R" --json run "$lease" --image "$image" -- sh -c "f() { $waitfor; }; echo from-a >/workspace/a.txt;
  f /workspace/b.txt; cat /workspace/b.txt >/workspace/a-saw-b.txt; f /workspace/up.txt;
  cat /workspace/up.txt >/workspace/a-saw-up.txt; sleep 300" | jq -r .job.id)
jb=$(gn_cli "$R" --json run "$lease" --image "$image" -- sh -c "f() { $waitfor; }; echo from-b >/workspace/b.txt;
  f /workspace/a.txt; cat /workspace/a.txt >/workspace/b-saw-a.txt; sleep 300" | jq -r .job.id)
[ -n "$ja" ] && [ "$ja" != null ] && [ -n "$jb" ] && [ "$jb" != null ] || fail "the two jobs did not start: $ja $jb"
got() { rm -f "$work/got"; gn_cli "$R" cp "$lease:$1" "$work/got" >/dev/null 2>&1 && [ "$(cat "$work/got")" = "$2" ]; }
gn_wait_until 60 "job A's a-saw-b.txt" got a-saw-b.txt from-b || fail "job A did not see job B's file"
gn_wait_until 60 "job B's b-saw-a.txt" got b-saw-a.txt from-a || fail "job B did not see job A's file"
got a.txt from-a || fail "cp of a running job's a.txt: $(cat "$work/got" 2>&1)"
ok "two running jobs of the lease see each other's files; cp reads a running job's file"
echo up-bytes >"$work/up.txt"
gn_cli "$R" cp "$work/up.txt" "$lease:up.txt" >/dev/null 2>&1 || fail "upload of up.txt"
gn_wait_until 60 "job A's a-saw-up.txt" got a-saw-up.txt up-bytes || fail "the running job did not see the cp upload"
gn_cli "$R" stop "$ja" >/dev/null
gn_cli "$R" stop "$jb" >/dev/null
ok "a running job sees a file uploaded with cp"

# Download, interrupted, resumed, verified.
GN_CP_STOP_AFTER=20000000 gn_cli "$R" cp "$lease:out.bin" "$work/out.bin" 2>/dev/null &&
  fail "GN_CP_STOP_AFTER did not stop the download"
[ -f "$work/out.bin.part" ] && [ ! -e "$work/out.bin" ] || fail "no partial download kept as out.bin.part"
t0=$(now_ms)
out=$(gn_cli "$R" --json cp "$lease:out.bin" "$work/out.bin" 2>/dev/null) || fail "resumed download"
t1=$(now_ms)
[ "$(jq -r .resumed_from <<<"$out")" -gt 0 ] || fail "the download did not resume: $out"
[ "$(sha256sum "$work/out.bin" | cut -d' ' -f1)" = "$want_out" ] || fail "downloaded out.bin differs"
[ ! -e "$work/out.bin.part" ] || fail "the partial file was left"
ok "the job's out.bin downloaded, resumed from $(jq -r .resumed_from <<<"$out"), verified"

mkdir "$work/dl"
t0=$(now_ms)
gn_cli "$R" cp "$lease:big.bin" "$work/dl/" >/dev/null 2>&1 || fail "download of big.bin"
t1=$(now_ms)
down_ms=$((t1 - t0))
cmp -s "$work/big.bin" "$work/dl/big.bin" || fail "the downloaded big.bin differs"
ok "100 MB downloaded in $down_ms ms ($((100000 / (down_ms > 0 ? down_ms : 1))) MB/s), verified"

# A resume onto a partial copy of another file: the hashes differ, the copy
# starts over once from 0 and verifies; the same for a stale download part.
head -c 20000000 /dev/urandom >"$work/other.bin"
head -c 20000000 "$work/big.bin" >"$work/small.bin"
GN_CP_STOP_AFTER=5000000 gn_cli "$R" cp "$work/other.bin" "$lease:mix.bin" 2>/dev/null && fail "other.bin was not stopped"
out=$(gn_cli "$R" --json cp "$work/small.bin" "$lease:mix.bin" 2>"$work/mix.err") || fail "mix: $(cat "$work/mix.err")"
[ "$(jq -r .resumed_from <<<"$out")" -gt 0 ] || fail "the copy onto another file's part did not resume: $out"
[ "$(jq -r .sha256 <<<"$out")" = "$(sha256sum "$work/small.bin" | cut -d' ' -f1)" ] || fail "mix sha256: $out"
grep -q "does not match; copying" "$work/mix.err" || fail "no restart said: $(grep -v event "$work/mix.err")"
inws cat "$wsf/mix.bin" | cmp -s "$work/small.bin" - || fail "the provider's mix.bin differs from small.bin"
head -c 1000000 /dev/urandom >"$work/stale.bin.part"
out=$(gn_cli "$R" --json cp "$lease:mix.bin" "$work/stale.bin" 2>"$work/stale.err") || fail "stale part: $(cat "$work/stale.err")"
cmp -s "$work/small.bin" "$work/stale.bin" || fail "a stale partial download was kept"
grep -q "does not match; copying" "$work/stale.err" || fail "no restart said for the stale part"
ok "a resume onto another file's partial copy (up and down) fails its hash check, starts over once and verifies"

: >"$work/empty"
gn_cli "$R" cp "$work/empty" "$lease:sub/dir/empty" >/dev/null 2>&1 || fail "upload of an empty file"
inws test -f "$wsf/sub/dir/empty" && ! inws test -s "$wsf/sub/dir/empty" || fail "the empty file is not there, empty"
gn_cli "$R" cp "$lease:sub/dir/empty" "$work/empty2" >/dev/null 2>&1 || fail "download of an empty file"
[ -f "$work/empty2" ] && [ ! -s "$work/empty2" ] || fail "the downloaded empty file"
gn_cli "$R" cp "$lease:sub" "$work/sub" 2>"$work/dir.err" && fail "a directory was copied"
grep -q "directories are not copied" "$work/dir.err" || fail "directory: $(cat "$work/dir.err")"
gn_cli "$R" cp "$work/dl" "$lease:dl" 2>"$work/dir.err" && fail "a local directory was copied"
grep -q "directories are not copied" "$work/dir.err" || fail "local directory: $(cat "$work/dir.err")"
ok "an empty file goes both ways (its directories made); a directory is refused saying to use tar"

# Refusals: paths outside the workspace, a symbolic link the job planted.
for bad in ../x /etc/passwd a/../../b; do
  gn_cli "$R" cp "$work/big.bin" "$lease:$bad" 2>"$work/bad.err" && fail "cp to $bad was accepted"
  grep -q "not a path in the workspace" "$work/bad.err" || fail "cp to $bad: $(cat "$work/bad.err")"
done
# (busybox's sh runs its applets itself: the image links only some of them)
out=$(gn_cli "$R" run "$lease" --image "$image" -f -- sh -c 'ln -s /etc/shadow /workspace/evil' 2>&1) ||
  fail "ln -s job: $out"
gn_cli "$R" cp "$lease:evil" "$work/evil" 2>"$work/evil.err" && fail "a symlink was followed on download"
grep -q "symbolic link" "$work/evil.err" || fail "symlink download: $(cat "$work/evil.err")"
echo hi >"$work/hi.txt"
before=$(sha256sum /etc/shadow)
gn_cli "$R" cp "$work/hi.txt" "$lease:evil" 2>"$work/evil.err" && fail "a symlink was followed on upload"
[ "$(sha256sum /etc/shadow)" = "$before" ] || fail "/etc/shadow changed"
[ ! -e "$work/evil" ] && [ ! -e "$work/evil.part" ] || fail "something was downloaded through the link"
ok "traversal paths and a planted symbolic link are refused; /etc/shadow untouched"

# A provider that does not answer (stopped here; one of an older version
# without workspaces never does): the copy fails after 15 s, not 60.
ppid=$(cat "$P/gpunetd.pid")
kill -STOP "$ppid"
t0=$(now_ms)
gn_cli "$R" cp "$work/hi.txt" "$lease:hi.txt" 2>"$work/mute.err" && { kill -CONT "$ppid"; fail "cp to a stopped provider succeeded"; }
t1=$(now_ms)
kill -CONT "$ppid"
grep -q "did not answer in time" "$work/mute.err" || fail "cp to a stopped provider: $(cat "$work/mute.err")"
[ $((t1 - t0)) -lt 30000 ] || fail "cp to a stopped provider took $((t1 - t0)) ms"
ok "a provider that does not answer: the copy fails after $((t1 - t0)) ms saying so"

# The budget: a copy that would pass it is refused part way, and a job that
# writes past it itself is refused by its file system as it writes (the
# directory layout's survey, which stops such a job instead, is
# e2e_test_workspace_fs's).
gn_cli "$R" cp "$work/big.bin" "$lease:third.bin" 2>"$work/full.err" && fail "a copy past the budget was accepted"
grep -q "workspace is full (280 MiB)" "$work/full.err" || fail "copy past the budget: $(cat "$work/full.err")"
ok "a copy past the workspace budget is refused: $(grep -m1 "workspace is full" "$work/full.err")"
out=$(gn_cli "$R" run "$lease" --image "$image" -f -- sh -c \
  'head -c 60000000 /dev/zero >/workspace/fill || echo FILL-REFUSED; echo size=$(wc -c </workspace/fill); df -k /workspace | tail -1' 2>&1) ||
  fail "the filling job failed: $out"
grep -q "^FILL-REFUSED" <<<"$out" ||
  fail "a job writing past the workspace's budget was not refused: $out"
size=$(sed -n 's/^size=//p' <<<"$out")
[ -n "$size" ] && [ "$size" -lt 60000000 ] || fail "the refused write left $size bytes"
used=$(inws du -sk "$wsf" | cut -f1)
[ "$used" -le $((280 << 10)) ] || fail "the workspace holds $used KiB, past its 280 MiB"
ok "a job writing past the budget is refused by the lease's file system ($((size >> 20)) MiB of 57 written, $((used >> 10)) MiB used)"

gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
gone() { [ ! -e "$ws" ]; }
gn_wait_until 30 "the workspace removed" gone || fail "the workspace $ws is still there after the release"
gn_cli "$R" cp "$work/hi.txt" "$lease:hi.txt" 2>"$work/ended.err" && fail "cp after the release was accepted"
grep -q "ended" "$work/ended.err" || fail "cp after the release: $(cat "$work/ended.err")"
ok "after the release the workspace is gone and cp is refused"

echo "$pass passed, 0 failed"
echo "figures: up ${up_ms} ms, down ${down_ms} ms for 100 MB"
