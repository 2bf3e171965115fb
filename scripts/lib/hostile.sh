# Shell helpers for the hostile-job e2e suite (tests/e2e/test_hostile.sh):
# building its images (busybox with attack probes; decompression bombs),
# finding a job's processes on the host and reading their cgroup limits.
# Source it after common.sh; it defines functions only.

# gn_hostile_probe_image DIR NAME:TAG PORT FILE...: builds an image of
# busybox-static plus each FILE in /bin (static binaries: the probes) with
# umoci, pushes it to the registry on 127.0.0.1:PORT and prints its digest.
gn_hostile_probe_image() {
  local dir=$1 ref=$2 port=$3
  shift 3
  local name=${ref%%:*} tag=${ref#*:} root=$dir/root oci=$dir/oci f c
  mkdir -p "$root/bin" "$root/tmp" "$root/etc" "$root/root" "$root/proc" "$root/sys" "$root/dev"
  cp /bin/busybox "$root/bin/busybox"
  for c in $(/bin/busybox --list); do
    [ "$c" = busybox ] || ln -sf busybox "$root/bin/$c"
  done
  for f in "$@"; do cp "$f" "$root/bin/"; done
  echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
  echo "root:x:0:" >"$root/etc/group"
  umoci init --layout "$oci"
  umoci new --image "$oci:$tag"
  umoci insert --image "$oci:$tag" "$root" / >/dev/null
  umoci config --image "$oci:$tag" --os linux --architecture amd64 --clear=config.entrypoint \
    --config.cmd /bin/sh --config.env PATH=/bin --config.workingdir / >/dev/null
  skopeo copy -q --dest-tls-verify=false --digestfile "$dir/digest" "oci:$oci:$tag" \
    "docker://127.0.0.1:$port/$name:$tag" >&2
  cat "$dir/digest"
  echo
}

# gn_hostile_bomb_image DIR NAME:TAG PORT SIZE_MIB: a decompression bomb: an
# image whose one layer is a tar holding a single file of SIZE_MIB MiB of
# zeros (a multiple of 64), gzip-compressed about 1000:1. The layer is made
# of concatenated gzip members (valid gzip, as `zcat` and libarchive read
# it): one compressed 64 MiB chunk of zeros repeated, so making a 9 GiB bomb
# takes a second. Pushes it and prints its digest.
gn_hostile_bomb_image() {
  local dir=$1 ref=$2 port=$3 mib=$4 k
  [ $((mib % 64)) -eq 0 ] || gn_die "bomb size $mib MiB is not a multiple of 64"
  mkdir -p "$dir/src"
  # The tar header of a SIZE_MIB file, taken from GNU tar run on a sparse
  # file of that size (it stops at the header: head closes the pipe).
  truncate -s "${mib}M" "$dir/src/bomb"
  (tar --format=gnu --owner=0 --group=0 --mtime=@0 -cf - -C "$dir/src" bomb 2>/dev/null || true) |
    head -c 512 >"$dir/hdr"
  rm -f "$dir/src/bomb"
  [ "$(stat -c %s "$dir/hdr")" = 512 ] || gn_die "could not make the bomb's tar header"
  head -c 64M /dev/zero | gzip -9 -n >"$dir/chunk.gz" # 64 KiB: deflate's best ratio
  {
    gzip -1 -n <"$dir/hdr"
    for ((k = 0; k < mib / 64; k++)); do cat "$dir/chunk.gz"; done
    head -c 1024 /dev/zero | gzip -1 -n # the end-of-archive blocks
  } >"$dir/layer.gz"
  gn_hostile_layer_image "$dir" "$ref" "$port" "$dir/layer.gz"
}

# gn_hostile_layer_image DIR NAME:TAG PORT LAYER.GZ: an image of that one
# gzip layer (moved into DIR/oci), config command /bomb, pushed; prints its
# digest. The config's diff_id is not the layer's real one (hashing the
# uncompressed bytes of a bomb would take longer than the test): a hostile
# image can say anything there, and an unpacker must stop before it could
# check.
gn_hostile_layer_image() {
  local dir=$1 ref=$2 port=$3 layer=$4
  local name=${ref%%:*} tag=${ref#*:} oci=$dir/oci
  local ldig lsize cdig csize mdig msize fake
  mkdir -p "$oci/blobs/sha256"
  ldig=$(sha256sum "$layer" | cut -c1-64)
  lsize=$(stat -c %s "$layer")
  mv "$layer" "$oci/blobs/sha256/$ldig"
  fake=$(printf 'gpunet hostile layer %s' "$ldig" | sha256sum | cut -c1-64)
  printf '{"architecture":"amd64","os":"linux","config":{"Cmd":["/bomb"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$fake" >"$dir/config.json"
  cdig=$(sha256sum "$dir/config.json" | cut -c1-64)
  csize=$(stat -c %s "$dir/config.json")
  mv "$dir/config.json" "$oci/blobs/sha256/$cdig"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$cdig" "$csize" "$ldig" "$lsize" >"$dir/manifest.json"
  mdig=$(sha256sum "$dir/manifest.json" | cut -c1-64)
  msize=$(stat -c %s "$dir/manifest.json")
  mv "$dir/manifest.json" "$oci/blobs/sha256/$mdig"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
    "$mdig" "$msize" "$tag" >"$oci/index.json"
  skopeo copy -q --dest-tls-verify=false --digestfile "$dir/digest" "oci:$oci:$tag" \
    "docker://127.0.0.1:$port/$name:$tag" >&2
  cat "$dir/digest"
  echo
}

# gn_hostile_pid PATTERN: the host pid of the process whose command line
# (arguments joined by spaces) is exactly PATTERN, e.g. "sleep 301"; the
# suite gives each job a unique command so it can be found this way
# whatever the runtime's state directory.
gn_hostile_pid() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    if [ "${cmd% }" = "$1" ]; then
      echo "${p#/proc/}"
      return 0
    fi
  done
  return 1
}

# gn_hostile_cgdir PID CONTROLLER: the host directory of PID's cgroup for
# CONTROLLER (memory, pids, cpu, cpuacct): the v1 hierarchy where one is
# mounted, else the unified (v2) one.
gn_hostile_cgdir() {
  local pid=$1 ctl=$2 line path
  if [ "$(stat -fc %T "/sys/fs/cgroup/$ctl" 2>/dev/null)" = cgroupfs ]; then
    line=$(grep -E "^[0-9]+:([^:]*,)?$ctl(,[^:]*)?:" "/proc/$pid/cgroup") || return 1
    path=${line#*:}
    path=${path#*:}
    echo "/sys/fs/cgroup/$ctl$path"
    return 0
  fi
  line=$(grep -E '^0::' "/proc/$pid/cgroup") || return 1
  path=${line#0::}
  if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    echo "/sys/fs/cgroup$path"
  else
    echo "/sys/fs/cgroup/unified$path"
  fi
}

# gn_hostile_cg PID WHAT: one of PID's cgroup limits or counters, the same
# on v1 and v2: memory-max (bytes, "max" for none), pids-max, pids-current,
# cpu-quota (a fraction of one CPU, "max" for none), cpu-usage-us.
gn_hostile_cg() {
  local pid=$1 what=$2 d v q p
  case $what in
  memory-max)
    d=$(gn_hostile_cgdir "$pid" memory) || return 1
    if [ -f "$d/memory.max" ]; then cat "$d/memory.max"; else
      v=$(cat "$d/memory.limit_in_bytes") || return 1
      # v1 says "no limit" with a huge page-rounded number.
      if [ "$v" -ge $((1 << 62)) ]; then echo max; else echo "$v"; fi
    fi
    ;;
  pids-max | pids-current)
    d=$(gn_hostile_cgdir "$pid" pids) || return 1
    cat "$d/pids.${what#pids-}"
    ;;
  cpu-quota)
    d=$(gn_hostile_cgdir "$pid" cpu) || return 1
    if [ -f "$d/cpu.max" ]; then
      read -r q p <"$d/cpu.max"
    else
      q=$(cat "$d/cpu.cfs_quota_us") && p=$(cat "$d/cpu.cfs_period_us") || return 1
    fi
    if [ "$q" = max ] || [ "$q" -lt 0 ]; then echo max; else awk -v q="$q" -v p="$p" 'BEGIN{printf "%.3f\n", q/p}'; fi
    ;;
  cpu-usage-us)
    d=$(gn_hostile_cgdir "$pid" cpuacct 2>/dev/null) && [ -f "$d/cpuacct.usage" ] &&
      { echo $(($(cat "$d/cpuacct.usage") / 1000)); return 0; }
    d=$(gn_hostile_cgdir "$pid" cpu) || return 1
    awk '$1 == "usage_usec" {print $2}' "$d/cpu.stat"
    ;;
  *) return 2 ;;
  esac
}
