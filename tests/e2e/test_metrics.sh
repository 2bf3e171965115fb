#!/usr/bin/env bash
# Metrics over TCP (--metrics-listen), against real daemons on loopback:
# GET /metrics answers there in Prometheus text format that `promtool check
# metrics` accepts, with the metric names docs/metrics.md lists, the same
# families as /metrics on the control socket; nothing else is served there
# (control paths get 404, POST 404/405, and the node is unchanged after
# them); a bare port binds 127.0.0.1; a non-loopback address is logged as a
# warning; a bad value or a port in use keeps the daemon from starting.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_tools curl jq
gn_e2e_need_promtool

gn_e2e_setup metrics m bare wide
M=$nodes/m
pm=$(gn_free_port)
gn_node_start "$M" m --listen "127.0.0.1:$(gn_free_port)" --simulate-gpu "RTX 4090" --metrics-listen "127.0.0.1:$pm"
url="http://127.0.0.1:$pm"

code=$(curl -s -o "$work/m.txt" -w '%{http_code}' "$url/metrics") || fail "curl $url/metrics failed"
[ "$code" = 200 ] || fail "GET /metrics over TCP: HTTP $code"
for name in gpunet_peers gpunet_overlay_members gpunet_offers gpunet_leases_active gpunet_leases_ended gpunet_jobs \
  gpunet_ticks_total gpunet_earnings_total gpunet_spent_total gpunet_gpus gpunet_gpu_info gpunet_gpu_leased; do
  grep -q "^# TYPE $name " "$work/m.txt" || fail "no metric $name in: $(cat "$work/m.txt")"
done
grep -q '^gpunet_gpu_info{gpu="0",uuid="GPU-SIM-[0-9a-f]*",name="NVIDIA GeForce RTX 4090",simulated="true"} 1$' \
  "$work/m.txt" || fail "the simulated GPU is not labelled as such: $(grep gpu_info "$work/m.txt")"
! grep -q '^gpunet_gpu_temperature_celsius{' "$work/m.txt" ||
  fail "a simulated GPU got an invented temperature: $(grep temperature "$work/m.txt")"
grep -q '^gpunet_earnings_total{currency="EUR"} 0.000000$' "$work/m.txt" || fail "earnings: $(grep earn "$work/m.txt")"
ok "GET /metrics over TCP answers with every metric family"

# The dashboard and the doc name only metrics the daemon has: each name in
# docs/grafana-gpunet.json is in docs/metrics.md, and exported here unless it
# is one of NVML's (no real GPU in this test).
for name in $(grep -o 'gpunet_[a-z_]*' "$src/docs/grafana-gpunet.json" | sed 's/_bucket$//' | sort -u); do
  grep -q "\`$name\`" "$src/docs/metrics.md" || fail "docs/metrics.md lacks $name (used by the dashboard)"
  case $name in gpunet_gpu_utilization_ratio | gpunet_gpu_power_watts | gpunet_gpu_sm_clock_hertz | gpunet_gpu_temperature_celsius) continue ;; esac
  grep -q "^# TYPE $name " "$work/m.txt" || fail "the dashboard uses $name, which the daemon does not export"
done
jq -e '.panels | length > 0' "$src/docs/grafana-gpunet.json" >/dev/null || fail "docs/grafana-gpunet.json is not a dashboard"
ok "the Grafana dashboard uses only documented metrics the daemon exports"

promtool check metrics <"$work/m.txt" >"$work/promtool.txt" 2>&1 || fail "promtool check metrics: $(cat "$work/promtool.txt")"
ok "promtool check metrics accepts it"

curl -s --unix-socket "$M/gpunetd.sock" http://x/metrics >"$work/unix.txt" || fail "/metrics on the control socket"
diff <(grep '^# TYPE' "$work/m.txt") <(grep '^# TYPE' "$work/unix.txt") >/dev/null ||
  fail "TCP and control-socket metrics differ: $(diff <(grep '^# TYPE' "$work/m.txt") <(grep '^# TYPE' "$work/unix.txt"))"
ok "the control socket serves the same families"

# Only /metrics: every control path is unknown over TCP, whatever the method.
before=$(gn_cli "$M" --json status | jq -c '{leases, jobs, offers}')
check_code() { # METHOD PATH WANT [BODY]
  local got
  got=$(curl -s -o /dev/null -w '%{http_code}' -X "$1" -H 'Content-Type: application/json' ${4:+--data "$4"} "$url$2")
  [ "$got" = "$3" ] || fail "$1 $2 over TCP: HTTP $got, want $3"
}
check_code GET /v1/status 404
check_code GET /v1/leases 404
check_code GET /v1/invoices 404
check_code GET /v1/jobs 404
check_code POST /v1/leases 404 '{"gpu":"RTX 4090","hours":1}'
check_code POST /v1/jobs 404 '{"lease":"l-x","image":"busybox"}'
check_code POST /v1/attest 404 '{}'
check_code POST /v1/balance/retry 404 '{}'
check_code POST /v1/nat/relay 404 '{}'
check_code DELETE /v1/leases/abc 404
check_code POST /metrics 405 '{}'
check_code GET / 404
after=$(gn_cli "$M" --json status | jq -c '{leases, jobs, offers}')
[ "$before" = "$after" ] || fail "the node changed after control requests over TCP: $before -> $after"
ok "over TCP every control path is 404 (POST /metrics 405) and the node is unchanged"

# A bare port is loopback; a non-loopback address is served with a warning.
pb=$(gn_free_port)
gn_node_start "$nodes/bare" bare --listen "127.0.0.1:$(gn_free_port)" --overlay off --metrics-listen "$pb"
grep -q "metrics on http://127.0.0.1:$pb/metrics" "$nodes/bare/gpunetd.log" || fail "bare port: $(cat "$nodes/bare/gpunetd.log")"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pb/metrics")" = 200 ] || fail "bare port not served"
ok "--metrics-listen PORT binds 127.0.0.1"
pw=$(gn_free_port)
gn_node_start "$nodes/wide" wide --listen "127.0.0.1:$(gn_free_port)" --overlay off --metrics-listen "0.0.0.0:$pw"
grep -q "warn.*metrics on http://0.0.0.0:$pw/metrics: not loopback" "$nodes/wide/gpunetd.log" ||
  fail "no warning for 0.0.0.0: $(cat "$nodes/wide/gpunetd.log")"
ok "a non-loopback metrics address is logged as a warning"

# Refusals: a bad value, and a port already taken (the first daemon's).
mkdir -p "$nodes/bad"
gn_cli "$nodes/bad" init >/dev/null
rc=0
err=$(timeout 20 "$GN_BIN/gpunetd" --data-dir "$nodes/bad" --overlay off --metrics-listen localhost:9464 2>&1) || rc=$?
[ $rc != 0 ] && grep -q "metrics_listen must be PORT or IP:PORT" <<<"$err" || fail "bad address: rc $rc: $err"
rc=0
err=$(timeout 20 "$GN_BIN/gpunetd" --data-dir "$nodes/bad" --listen "127.0.0.1:$(gn_free_port)" --overlay off \
  --metrics-listen "127.0.0.1:$pm" 2>&1) || rc=$?
[ $rc != 0 ] && grep -q "cannot serve metrics on 127.0.0.1:$pm" <<<"$err" || fail "port in use: rc $rc: $err"
ok "a bad metrics address or a port in use keeps the daemon from starting"

echo "PASS ($pass checks)"
