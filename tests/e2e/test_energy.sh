#!/usr/bin/env bash
# Energy of real leases between two daemons. The provider sees "real" GPUs
# through the NVML test shim (tests/node/nvml_shim.c, GN_NVML_LIB) that
# reports 250 W each (GN_NVML_SHIM_POWER_MW), plus one simulated H100. A
# lease of the shim's RTX 4090 shows its energy so far in GET
# /v1/leases/:id and gpunet_lease_energy_joules_total, and its countersigned
# final invoice states energy_mj close to 250 W x the seconds measured, which
# are close to the seconds billed. A lease of the simulated GPU (no power
# reading) has an invoice with no energy at all (null, "not measured"), not 0.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
gn_e2e_need_tools curl jq
gn_e2e_need_promtool
shim=$GN_BUILD_DIR/tests/libnvml_shim.so
[ -f "$shim" ] || {
  echo "SKIP: the NVML test shim is not built ($shim)"
  exit 77
}
gn_e2e_setup energy requester provider old
gn_e2e_compat_flags
export GN_RENT_TIMEOUT_MS=3000

# The provider alone sees the shim: its two "real" GPUs draw 250 W each.
mp=$(gn_free_port)
p_prov=$(gn_free_port)
GN_NVML_LIB=$shim GN_NVML_SHIM_POWER_MW=250000 gn_node_start "$P" provider --listen "127.0.0.1:$p_prov" --provide \
  --price 0.50 --simulate-gpu "H100" --interval-min-s 2 --metrics-listen "$mp" "${gn_e2e_compat[@]}"
p_req=$(gn_free_port)
gn_node_start "$R" requester --listen "127.0.0.1:$p_req" --bootstrap "127.0.0.1:$p_prov"
has_offers() {
  local o
  o=$(gn_cli "$R" --json offers 2>/dev/null) || return 1
  jq -e '[.offers[] | .gpu_model] | (any(test("4090")) and any(test("H100")))' <<<"$o" >/dev/null
}
gn_wait_until 30 "offers of both GPUs" has_offers || fail "no offers: $(gn_cli "$R" --json offers)"

# lease_field LEASE FIELD: FIELD of the provider's GET /v1/leases/LEASE.
lease_get() { curl -sf --unix-socket "$P/gpunetd.sock" "http://gpunetd/v1/leases/$1"; }
lease_field() { lease_get "$1" | jq -r "(.lease // .).$2"; }
live_energy() { [ "$(lease_field "$lease" energy_mj)" != null ] && [ "$(lease_field "$lease" energy_mj)" -gt 0 ]; }

lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --no-attest --interval 2 | jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent of the shim's GPU gave no lease: $lease"
gn_wait_until 30 "live energy above 0" live_energy ||
  fail "GET /v1/leases/$lease: $(lease_get "$lease")"
ok "GET /v1/leases/$lease shows the energy so far: $(lease_field "$lease" energy_mj) mJ"
metric() { curl -sf "http://127.0.0.1:$mp/metrics" | awk '$1 == "gpunet_lease_energy_joules_total" { print $2 }'; }
metric_above0() { awk -v v="$(metric)" 'BEGIN { exit !(v + 0 > 0) }'; }
gn_wait_until 10 "energy counter above 0" metric_above0 || fail "gpunet_lease_energy_joules_total: '$(metric)'"
curl -sf "http://127.0.0.1:$mp/metrics" >"$work/p.txt" || fail "GET /metrics"
promtool check metrics <"$work/p.txt" >"$work/promtool.txt" 2>&1 || fail "promtool: $(cat "$work/promtool.txt")"
# NVML's per-GPU gauges, a line only where the shim gives the figure: power
# on both of its GPUs; utilisation 37 % and 61 degrees on GPU 0 only (GPU 1
# reports 101 % and a failing sensor); no clock (the shim has none); nothing
# for the simulated H100 (GPU 2).
[ "$(grep -c '^gpunet_gpu_power_watts{gpu="[01]",uuid="[^"]*"} 250.000$' "$work/p.txt")" = 2 ] ||
  fail "power gauges: $(grep gpunet_gpu_power_watts "$work/p.txt")"
[ "$(grep '^gpunet_gpu_utilization_ratio{' "$work/p.txt" | sed 's/uuid="[^"]*"/U/')" = 'gpunet_gpu_utilization_ratio{gpu="0",U} 0.37' ] ||
  fail "utilisation gauges: $(grep gpunet_gpu_utilization_ratio "$work/p.txt")"
[ "$(grep '^gpunet_gpu_temperature_celsius{' "$work/p.txt" | sed 's/uuid="[^"]*"/U/')" = 'gpunet_gpu_temperature_celsius{gpu="0",U} 61' ] ||
  fail "temperature gauges: $(grep gpunet_gpu_temperature_celsius "$work/p.txt")"
if grep -q '^gpunet_gpu_sm_clock_hertz{' "$work/p.txt"; then fail "a clock gauge the shim cannot give"; fi
[ -z "$(grep '^gpunet_gpu_[a-z_]*{gpu="2"' "$work/p.txt" | grep -v '^gpunet_gpu_info\|^gpunet_gpu_leased')" ] ||
  fail "NVML gauges for the simulated GPU: $(grep '{gpu="2"' "$work/p.txt")"
ok "gpunet_lease_energy_joules_total $(metric) J, promtool passes, NVML gauges only where NVML gave them"

billed() { [ "$(lease_field "$lease" seconds)" -ge 5 ]; }
gn_wait_until 30 "five seconds metered" billed || fail "the lease did not meter: $(lease_get "$lease")"
gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
accepted() { [ "$(gn_cli "$P" --json invoice show "$lease" | jq -r .invoice.status)" = accepted ]; }
gn_wait_until 30 "the final invoice countersigned" accepted || fail "no countersigned invoice: $(gn_cli "$P" --json invoice show "$lease")"
inv=$(gn_cli "$P" --json invoice show "$lease")
mj=$(jq -r .invoice.energy_mj <<<"$inv")
ms=$(jq -r .invoice.energy_measured_s <<<"$inv")
secs=$(jq -r .invoice.seconds <<<"$inv")
[ "$mj" != null ] && [ "$mj" -gt 0 ] || fail "the invoice states no energy: $inv"
# 250 W for each second measured (whole seconds rounded down: at most one
# second's worth more), and the seconds measured within 2 s of those billed.
[ "$mj" -ge $((250000 * ms)) ] && [ "$mj" -lt $((250000 * (ms + 1))) ] ||
  fail "energy $mj mJ is not 250 W x $ms s"
[ "$ms" -ge $((secs - 2)) ] && [ "$ms" -le $((secs + 2)) ] || fail "$ms s measured but $secs s billed"
[ "$(jq -r .invoice.energy_plausible <<<"$inv")" = true ] || fail "honest energy flagged: $inv"
ok "countersigned invoice: $mj mJ over $ms s measured ($secs s billed; 250 W x $ms s = $((250000 * ms)) mJ)"
# The requester's copy (what it countersigned) says the same.
rinv=$(gn_cli "$R" --json invoice show "$lease")
[ "$(jq -r .invoice.energy_mj <<<"$rinv")" = "$mj" ] || fail "the requester's invoice: $rinv"
human=$(gn_cli "$R" invoice show "$lease")
grep -q "^energy: *[0-9]*\.[0-9]\{3\} kWh ([0-9,]* kJ) over $ms GPU-seconds$" <<<"$human" || fail "invoice show: $human"
ok "the requester's invoice states the same energy: $(grep energy <<<"$human" | head -n 1 | tr -s ' ')"
# The export carries it in its summary and audits.
gn_cli "$R" invoice export "$lease" --out "$work/energy.json" >/dev/null || fail "export"
[ "$(jq -r .summary.energy_mj "$work/energy.json")" = "$mj" ] || fail "export summary: $(jq .summary "$work/energy.json")"
gn_cli "$R" invoice audit "$work/energy.json" >/dev/null || fail "the export does not audit"
ok "the export's summary states $mj mJ and audits"

# A simulated GPU has no power reading: no energy, not 0.
lease2=$(gn_cli "$R" --json rent --gpu "H100" --hours 1 --allow-simulated --no-attest --interval 2 | jq -r .lease.id)
[[ $lease2 == l-* ]] || fail "rent of the simulated GPU gave no lease: $lease2"
billed2() { [ "$(lease_field "$lease2" seconds)" -ge 3 ]; }
gn_wait_until 30 "three seconds metered" billed2 || fail "the lease did not meter"
[ "$(lease_field "$lease2" energy_mj)" = null ] || fail "simulated lease shows energy: $(lease_get "$lease2")"
gn_cli "$R" release "$lease2" >/dev/null || fail "cannot release $lease2"
accepted2() { [ "$(gn_cli "$P" --json invoice show "$lease2" | jq -r .invoice.status)" = accepted ]; }
gn_wait_until 30 "the second invoice countersigned" accepted2 || fail "no countersigned invoice"
inv2=$(gn_cli "$R" --json invoice show "$lease2")
[ "$(jq -r .invoice.energy_mj <<<"$inv2")" = null ] || fail "simulated lease's invoice states energy: $inv2"
gn_cli "$R" invoice show "$lease2" | grep -q "not measured (no power reading)" ||
  fail "invoice show: $(gn_cli "$R" invoice show "$lease2")"
ok "the simulated GPU's invoice states no energy: not measured (no power reading)"

# A provider killed mid-lease keeps the energy measured before (saved each
# second), counts none for the time it was down, and goes on measuring.
lease3=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --no-attest --interval 10 | jq -r .lease.id)
[[ $lease3 == l-* ]] || fail "rent of the shim's GPU gave no lease: $lease3"
three_s() { [ "$(lease_field "$lease3" energy_measured_s)" != null ] && [ "$(lease_field "$lease3" energy_measured_s)" -ge 3 ]; }
gn_wait_until 30 "three seconds measured" three_s || fail "no energy measured: $(lease_get "$lease3")"
gn_node_kill "$P"
before=$(sqlite3 "$P/gpunet.db" "SELECT energy_uj / 1000 FROM node_leases WHERE id = '$lease3'" 2>/dev/null || echo 0)
GN_NVML_LIB=$shim GN_NVML_SHIM_POWER_MW=250000 gn_node_start "$P" provider --listen "127.0.0.1:$p_prov" --provide \
  --price 0.50 --simulate-gpu "H100" --interval-min-s 2 --metrics-listen "$mp" "${gn_e2e_compat[@]}"
[ "$(lease_field "$lease3" energy_mj)" -ge "$before" ] || fail "energy lost in the restart: $(lease_get "$lease3")"
# The first lease's invoice, read back from the database after the restart.
[ "$(gn_cli "$P" --json invoice show "$lease" | jq -r .invoice.energy_mj)" = "$mj" ] ||
  fail "the first invoice after the restart: $(gn_cli "$P" --json invoice show "$lease")"
more() { [ "$(lease_field "$lease3" energy_mj)" -ge $((before + 500000)) ]; }
gn_wait_until 30 "energy measured after the restart" more || fail "no energy after the restart: $(lease_get "$lease3")"
gn_cli "$R" release "$lease3" >/dev/null || fail "cannot release $lease3"
invoiced3() { [ "$(gn_cli "$P" --json invoice show "$lease3" | jq -r .invoice.status)" = accepted ]; }
gn_wait_until 30 "the third invoice countersigned" invoiced3 || fail "no countersigned invoice: $(gn_cli "$P" --json invoice show "$lease3")"
inv3=$(gn_cli "$P" --json invoice show "$lease3")
mj3=$(jq -r .invoice.energy_mj <<<"$inv3")
ms3=$(jq -r .invoice.energy_measured_s <<<"$inv3")
secs3=$(jq -r .invoice.seconds <<<"$inv3")
[ "$mj3" -ge $((before + 500000)) ] && [ "$mj3" -ge $((250000 * ms3)) ] && [ "$mj3" -lt $((250000 * (ms3 + 1))) ] ||
  fail "invoice after the restart: $inv3 ($before mJ saved before)"
# After a restart the seconds until the requester is back are billed idle
# and trailing idle seconds are left out of the bill, but the GPUs stayed
# the lease's and drew power: measured seconds may pass the billed ones,
# never the lease's window.
window3=$(jq -r '.invoice.end_s - .invoice.start_s' <<<"$inv3")
[ "$ms3" -le "$window3" ] || fail "$ms3 s measured, more than the lease's $window3 s"
ok "restart mid-lease: $before mJ saved at the kill, the invoice states $mj3 mJ over $ms3 s measured ($secs3 s billed, window $window3 s)"

# A database of an older release (node_leases without the energy columns)
# is migrated at start: the daemon starts and the columns are there.
if command -v sqlite3 >/dev/null; then
  mkdir -p "$nodes/old"
  sqlite3 "$nodes/old/gpunet.db" "CREATE TABLE node_leases(id TEXT PRIMARY KEY, role INTEGER NOT NULL,
    peer BLOB NOT NULL, agreement BLOB NOT NULL, state INTEGER NOT NULL, seconds INTEGER NOT NULL, end_s INTEGER,
    end_reason TEXT, invoice_done INTEGER NOT NULL DEFAULT 0);" || fail "cannot write an old database"
  gn_node_start "$nodes/old" old --listen "127.0.0.1:$(gn_free_port)"
  cols=$(sqlite3 "$nodes/old/gpunet.db" "SELECT group_concat(name) FROM pragma_table_info('node_leases')")
  for c in energy_uj energy_measured_ms energy_unmeasured_ms invoice_energy_mj invoice_energy_s; do
    grep -q "\b$c\b" <<<"$cols" || fail "an old database lacks $c after the start: $cols"
  done
  ok "an older database gains the energy columns at start"
fi

echo "PASS ($pass checks)"
