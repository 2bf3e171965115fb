#!/usr/bin/env bash
# Metrics of a real lease, scraped over TCP (--metrics-listen) from a
# provider and a requester: while the lease runs the provider shows it
# active, its GPU leased and earnings above 0, the requester spending above
# 0; after the release both counters equal the countersigned final
# invoice's total; the provider's debit-note latency histogram has counted
# acceptances; promtool accepts every scrape.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
gn_e2e_need_tools curl jq
gn_e2e_need_promtool
gn_e2e_setup metrics-lease requester provider
gn_e2e_compat_flags
export GN_RENT_TIMEOUT_MS=3000

mp=$(gn_free_port)
gn_e2e_start_provider --interval-min-s 2 --metrics-listen "$mp" "${gn_e2e_compat[@]}"
p_req=$(gn_free_port)
mr=$(gn_free_port)
gn_node_start "$R" requester --listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:$p_prov" --metrics-listen "$mr"
gn_e2e_wait_offer 30

# scrape PORT FILE: GET /metrics into FILE, checked by promtool.
scrape() {
  curl -sf "http://127.0.0.1:$1/metrics" >"$2" || fail "GET /metrics on port $1"
  promtool check metrics <"$2" >"$work/promtool.txt" 2>&1 || fail "promtool: $(cat "$work/promtool.txt")"
}
# value PORT SERIES: the sample of SERIES (a name with its labels, as written).
value() {
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v s="$2" '$1 == s { print $2 }'
}
above0() { awk -v v="$(value "$1" "$2")" 'BEGIN { exit !(v + 0 > 0) }'; }

lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --interval 2 |
  jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent gave no lease: $lease"
gn_wait_until 30 "provider earnings above 0" above0 "$mp" 'gpunet_earnings_total{currency="EUR"}' ||
  fail "provider earnings stayed 0: $(value "$mp" 'gpunet_earnings_total{currency="EUR"}')"
gn_wait_until 30 "requester spending above 0" above0 "$mr" 'gpunet_spent_total{currency="EUR"}' ||
  fail "requester spending stayed 0"
scrape "$mp" "$work/p.txt"
scrape "$mr" "$work/r.txt"
grep -q '^gpunet_leases_active{role="provider"} 1$' "$work/p.txt" || fail "provider: $(grep leases "$work/p.txt")"
grep -q '^gpunet_leases_active{role="requester"} 1$' "$work/r.txt" || fail "requester: $(grep leases "$work/r.txt")"
grep -q '^gpunet_gpu_leased{gpu="0",uuid="GPU-SIM-[0-9a-f]*"} 1$' "$work/p.txt" || fail "GPU not shown leased"
ok "during the lease: active on both sides, the GPU leased, earnings and spending above 0"

# The provider timed the acceptance of the debit notes behind those earnings;
# the requester sends none, so its histogram stays empty.
lat_count=$(awk '$1 == "gpunet_debit_note_latency_seconds_count" { print $2 }' "$work/p.txt")
lat_inf=$(awk '$1 == "gpunet_debit_note_latency_seconds_bucket{le=\"+Inf\"}" { print $2 }' "$work/p.txt")
[ -n "$lat_count" ] && [ "$lat_count" -gt 0 ] || fail "provider debit-note latency count: '$lat_count'"
[ "$lat_inf" = "$lat_count" ] || fail "le=+Inf bucket $lat_inf, count $lat_count"
grep -q '^gpunet_debit_note_latency_seconds_count 0$' "$work/r.txt" ||
  fail "requester: $(grep debit_note_latency "$work/r.txt")"
ok "the provider's debit-note latency histogram counts $lat_count acceptance(s); the requester's is empty"

gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
status() { [ "$(gn_cli "$P" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .status')" = accepted ]; }
gn_wait_until 30 "the final invoice countersigned" status || fail "no countersigned invoice: $(gn_cli "$P" --json invoices)"
total=$(gn_cli "$P" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .total_micro')
want=$(awk -v m="$total" 'BEGIN { printf "%d.%06d", m / 1000000, m % 1000000 }')
earned() { [ "$(value "$mp" 'gpunet_earnings_total{currency="EUR"}')" = "$want" ]; }
gn_wait_until 10 "provider earnings = invoice" earned ||
  fail "provider earnings $(value "$mp" 'gpunet_earnings_total{currency="EUR"}'), invoice $want"
spent() { [ "$(value "$mr" 'gpunet_spent_total{currency="EUR"}')" = "$want" ]; }
gn_wait_until 10 "requester spending = invoice" spent ||
  fail "requester spent $(value "$mr" 'gpunet_spent_total{currency="EUR"}'), invoice $want"
scrape "$mp" "$work/p2.txt"
grep -q '^gpunet_leases_active{role="provider"} 0$' "$work/p2.txt" || fail "still active: $(grep leases "$work/p2.txt")"
ok "after the release: earnings and spending equal the final invoice's $want EUR"

echo "PASS ($pass checks)"
