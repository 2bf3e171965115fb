#!/usr/bin/env bash
# scripts/bench/gpu_inventory (the GPU check's inventory and energy program,
# run on machines with a GPU by scripts/bench/gpu_check) against the NVML
# TEST FAKE (tests/node/nvml_shim.c), so that the energy check cannot rot
# where no GPU is: a steady 250 W integrated for 3 s as for a lease matches
# the shim's energy counter; a GPU with no power reading fails the check.
# Usage: test_gpu_check_shim.sh GPU_INVENTORY NVML_SHIM
set -euo pipefail
inv=${1:?gpu_inventory binary}
shim=${2:?nvml shim library}
fail() {
  echo "FAIL: $*"
  exit 1
}

out=$(GN_NVML_LIB=$shim GN_NVML_SHIM_POWER_MW=250000 GN_ENERGY_CHECK_S=3 "$inv" || true)
echo "$out"
for g in 0 1; do
  line=$(grep "^energy gpu $g:" <<<"$out") || fail "no energy line for shim GPU $g"
  [[ $line =~ ^energy\ gpu\ $g:\ ([0-9.]+)\ J\ over\ 3\ s\ measured\;\ NVML\ counter\ ([0-9.]+)\ J\;\ ratio\ ([0-9.]+)$ ]] ||
    fail "unexpected energy line: $line"
  mine=${BASH_REMATCH[1]} nvml=${BASH_REMATCH[2]} ratio=${BASH_REMATCH[3]}
  # 250 W x 3 s = 750 J (plus the few ms each sleep overran).
  awk -v m="$mine" -v c="$nvml" -v r="$ratio" 'BEGIN { exit !(m >= 750 && m <= 790 && c >= 750 && c <= 800 && r >= 0.95 && r <= 1.05) }' ||
    fail "gpu $g: $mine J integrated, $nvml J counted, ratio $ratio (want about 750 J each, ratio 1)"
done
! grep -q "energy check FAILED" <<<"$out" || fail "the energy check failed on a steady 250 W"
echo "ok 1 - 250 W for 3 s integrated as for a lease matches NVML's energy counter (ratio 1)"

rc=0
out=$(GN_NVML_LIB=$shim GN_NVML_SHIM_POWER_MW= GN_ENERGY_CHECK_S=1 "$inv") || rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "a GPU with no power reading passed the energy check"
grep -q "^energy gpu 0: 0.0 J over 0 s measured (no power reading" <<<"$out" || fail "no 'no power reading' line"
grep -q "energy check FAILED" <<<"$out" || fail "the failed energy check was not said"
echo "ok 2 - a GPU without a power reading states no energy and fails the check"
