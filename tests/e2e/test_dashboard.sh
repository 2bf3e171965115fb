#!/usr/bin/env bash
# The provider dashboard (docs/dashboard.md) of a real provider during a
# real lease: the token file and the logged address; curl: no token or a
# wrong one 401, a foreign Host 421, POST/DELETE 405 (the lease unchanged),
# the token 200 with the lease, security headers and no CORS, only the
# read-only routes; headless Chromium (Debian's chromium): the page shows
# the live lease, its earnings plot has a polyline of 2 points or more, a
# wrong token shows the error and no data, a screenshot has the plot's
# colour; after the release the invoice and its settlement are on the page.
# Then a node with GPUs through the NVML test shim plots utilisation, reuses
# its token after a restart, and the refusals: a non-loopback address, a
# taken port.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
gn_e2e_need_tools curl jq python3
command -v chromium >/dev/null || {
  echo "SKIP: needs headless Chromium (Debian package chromium; scripts/deps installs it)"
  exit 77
}
gn_e2e_setup dashboard requester provider gpu
gn_e2e_compat_flags
export GN_RENT_TIMEOUT_MS=3000

pd=$(gn_free_port)
base=http://127.0.0.1:$pd
gn_e2e_start_provider --interval-min-s 2 --dashboard-listen "$pd" "${gn_e2e_compat[@]}"
tok=$(cat "$P/dashboard.token")
[[ $tok =~ ^[0-9a-f]{64}$ ]] || fail "token file: '$tok'"
[ "$(stat -c %a "$P/dashboard.token")" = 600 ] || fail "token mode $(stat -c %a "$P/dashboard.token")"
[ "$(grep -c "dashboard on http://127.0.0.1:$pd/#token=$tok" "$P/gpunetd.log")" = 1 ] ||
  fail "the address is not logged once: $(grep dashboard "$P/gpunetd.log")"
ok "a new 64-digit token in dashboard.token (0600), its address logged once"

gn_e2e_start_requester
gn_e2e_wait_offer 30
lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --interval 2 |
  jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent gave no lease: $lease"

# code ARGS...: the HTTP status of a curl request; the body in $work/body.
code() { curl -s -o "$work/body" -w '%{http_code}' "$@"; }
auth="Authorization: Bearer $tok"
wrong="Authorization: Bearer ${tok:0:63}$([ "${tok:63}" = 0 ] && echo 1 || echo 0)"
[ "$(code "$base/v1/leases")" = 401 ] || fail "no token: $(cat "$work/body")"
[ "$(code -H "$wrong" "$base/v1/leases")" = 401 ] || fail "wrong token: $(cat "$work/body")"
[ "$(code -H "Authorization: $tok" "$base/v1/leases")" = 401 ] || fail "token without Bearer"
ok "no token, a wrong one, or one without 'Bearer': 401"
[ "$(code -H "Host: evil.example:$pd" -H "$auth" "$base/v1/leases")" = 421 ] || fail "foreign Host: $(cat "$work/body")"
[ "$(code -H "Host: evil.example:$pd" "$base/")" = 421 ] || fail "foreign Host on the page"
ok "a foreign Host header (DNS rebinding) is refused, with the token too"
[ "$(code -X POST -H "$auth" -H 'Content-Type: application/json' -d '{}' "$base/v1/leases")" = 405 ] ||
  fail "POST: $(cat "$work/body")"
[ "$(code -X DELETE -H "$auth" "$base/v1/leases/$lease")" = 405 ] || fail "DELETE: $(cat "$work/body")"
[ "$(gn_cli "$P" --json leases | jq -r --arg l "$lease" '.leases[] | select(.id==$l) | .state')" = active ] ||
  fail "the lease changed after the refused DELETE"
ok "POST and DELETE: 405, the lease still active"
[ "$(code "$base/v1/offers" -H "$auth")" = 404 ] || fail "offers served: $(cat "$work/body")"
[ "$(code "$base/metrics" -H "$auth")" = 404 ] || fail "metrics served"
ok "control routes beyond the dashboard's read-only set are not there (404)"

[ "$(code -H "$auth" "$base/v1/leases")" = 200 ] || fail "with the token: $(cat "$work/body")"
[ "$(jq -r --arg l "$lease" '.leases[] | select(.id==$l and .role=="provider") | .state' "$work/body")" = active ] ||
  fail "the lease is not in /v1/leases: $(cat "$work/body")"
for r in status gpus invoices balance attestation history; do
  [ "$(code -H "$auth" "$base/v1/$r")" = 200 ] || fail "/v1/$r: $(cat "$work/body")"
  jq -e . "$work/body" >/dev/null || fail "/v1/$r is not JSON"
done
code -H "$auth" "$base/v1/history" >/dev/null
[ "$(jq '.t_s | length' "$work/body")" -ge 2 ] || fail "history: $(cat "$work/body")"
[ "$(jq '.gpu_info[0].simulated' "$work/body")" = true ] || fail "history gpu_info: $(cat "$work/body")"
[ "$(jq '.gpus[0].util_pct | map(select(. != null)) | length' "$work/body")" = 0 ] ||
  fail "a simulated GPU has readings: $(cat "$work/body")"
code -H "$auth" "$base/v1/attestation" >/dev/null
jq -e '.attestation[0].verdict | test("simulated")' "$work/body" >/dev/null || fail "attestation: $(cat "$work/body")"
ok "with the token: 200 JSON; the lease, history (2+ points, simulated GPU without readings), attestation"

curl -s -D "$work/headers" -o "$work/page" "$base/" || fail "GET /"
grep -qi "^content-type: text/html" "$work/headers" || fail "page type: $(cat "$work/headers")"
grep -qi "^content-security-policy: default-src 'self'" "$work/headers" || fail "no CSP: $(cat "$work/headers")"
grep -qi "^x-content-type-options: nosniff" "$work/headers" || fail "no nosniff"
if grep -qi "^access-control-" "$work/headers"; then fail "CORS headers: $(cat "$work/headers")"; fi
grep -q '<script src="/app.js"' "$work/page" || fail "page: $(head -c 300 "$work/page")"
[ "$(code "$base/app.js")" = 200 ] && [ "$(code "$base/style.css")" = 200 ] || fail "assets"
# (Each text is read whole first: no pipe into grep -q under pipefail.)
refs=$(grep -Eo '(src|href)="[^"]*"' "$work/page")
css=$(curl -s "$base/style.css")
js=$(curl -s "$base/app.js")
if grep -qv '="/' <<<"$refs"; then fail "the page loads from elsewhere: $refs"; fi
if grep -Eqi '@import|url\(' <<<"$css"; then fail "the style loads from elsewhere"; fi
if grep -Eq "(fetch|import)\(['\"]https?:" <<<"$js"; then fail "the script fetches from elsewhere"; fi
ok "the page and its files need no token, carry CSP and nosniff, no CORS, and load nothing from elsewhere"

# Earnings above 0 before the browser looks, so its plot climbs.
earned() { [ "$(curl -s -H "$auth" "$base/v1/history" | jq '.earned_micro[-1]')" -gt 0 ]; }
gn_wait_until 30 "earnings above 0" earned || fail "earnings stayed 0"

# browse OUT ARGS...: headless Chromium on the page with ARGS, in a
# throwaway profile; what it prints into OUT.
browse() {
  local out=$1
  shift
  timeout 90 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --user-data-dir="$(mktemp -d "$work/chromium-XXXXXX")" --virtual-time-budget=8000 "$@" \
    >"$out" 2>>"$work/chromium.log" || fail "chromium failed: $(tail -5 "$work/chromium.log")"
}
browse "$work/dom.html" --dump-dom "$base/#token=$tok"
grep -q 'data-loaded="true"' "$work/dom.html" || fail "the page did not load its data: $(head -c 2000 "$work/dom.html")"
grep -q ">$lease<" "$work/dom.html" || fail "lease $lease not on the page"
# polylines FILE ID: the most points of a polyline in the plot with that id.
polylines() {
  python3 - "$1" "$2" <<'EOF'
import re, sys
dom = open(sys.argv[1]).read()
m = re.search(r'<svg id="%s".*?</svg>' % re.escape(sys.argv[2]), dom, re.S)
pts = [len(p.split()) for p in re.findall(r'<polyline points="([^"]*)"', m.group(0))] if m else []
print(max(pts) if pts else 0)
EOF
}
[ "$(polylines "$work/dom.html" plot-earnings)" -ge 2 ] || fail "earnings plot: $(grep -o '<svg id="plot-earnings".*</svg>' "$work/dom.html" | head -c 600)"
grep -q 'simulated GPUs: no utilisation readings' "$work/dom.html" || fail "simulated GPU not labelled"
ok "Chromium: the page shows live lease $lease, the earnings plot has $(polylines "$work/dom.html" plot-earnings) points, the simulated GPU is labelled"

browse "$work/dom-wrong.html" --dump-dom "$base/#token=$(printf '0%.0s' {1..64})"
grep -q 'token is missing or wrong' "$work/dom-wrong.html" || fail "no error with a wrong token"
if grep -q "$lease" "$work/dom-wrong.html"; then fail "data shown with a wrong token"; fi
ok "Chromium with a wrong token: the error, and no lease"

# The screenshot: pixels of the earnings line's colour (#e4572e), counted in
# the PNG with python3's zlib alone.
browse "$work/shot.log" --hide-scrollbars --window-size=1200,900 --screenshot="$work/shot.png" "$base/#token=$tok"
[ -s "$work/shot.png" ] || fail "no screenshot"
px=$(python3 - "$work/shot.png" <<'EOF'
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat, w = 8, b'', 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
        assert depth == 8 and ctype in (2, 6), 'unexpected PNG format'
        bpp = 3 if ctype == 2 else 4
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
raw, stride, prev, count, off = zlib.decompress(idat), w * bpp, bytearray(w * bpp), 0, 0
for _ in range(h):
    f, line = raw[off], bytearray(raw[off + 1:off + 1 + stride])
    off += 1 + stride
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        r, g, bl = line[x], line[x + 1], line[x + 2]
        if abs(r - 0xe4) < 24 and abs(g - 0x57) < 24 and abs(bl - 0x2e) < 24:
            count += 1
    prev = line
print(count)
EOF
) || fail "cannot read the screenshot"
[ "$px" -gt 500 ] || fail "the earnings line is not in the screenshot: $px pixels of its colour"
ok "the screenshot shows the earnings line ($px pixels of its colour)"

gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
status() { [ "$(gn_cli "$P" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .status')" = accepted ]; }
gn_wait_until 30 "the final invoice countersigned" status || fail "no countersigned invoice"
inv=$(gn_cli "$P" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .id')
settled=$(gn_cli "$P" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .settled')
browse "$work/dom2.html" --dump-dom "$base/#token=$tok"
grep -q ">$inv<" "$work/dom2.html" || fail "invoice $inv not on the page"
grep -q ">$settled<" "$work/dom2.html" || fail "settlement '$settled' not on the page"
grep -q 'No active leases' "$work/dom2.html" || fail "the ended lease is still shown active"
ok "after the release: invoice $inv (accepted, settlement '$settled') on the page, no active lease"

# A node whose GPUs NVML reports (the test shim): utilisation is plotted.
shim=$GN_BIN/tests/libnvml_shim.so
[ -f "$shim" ] || fail "the NVML test shim $shim is not built"
pg=$(gn_free_port)
# The shim's device 0 is 37 % busy; every device draws GN_NVML_SHIM_POWER_MW.
export GN_NVML_LIB=$shim GN_NVML_SHIM_POWER_MW=250000
gn_node_start "$nodes/gpu" gpu --listen "127.0.0.1:$(gn_free_port)" --overlay off --dashboard-listen "$pg"
gtok=$(cat "$nodes/gpu/dashboard.token")
[ "$(code -H "Authorization: Bearer $gtok" "http://127.0.0.1:$pg/v1/history")" = 200 ] || fail "gpu node history"
[ "$(jq -c '[.gpus[0].util_pct[-1], .gpus[0].power_w[-1], .gpu_info[0].simulated]' "$work/body")" = '[37,250,false]' ] ||
  fail "NVML figures in the history: $(cat "$work/body")"
browse "$work/dom3.html" --dump-dom "http://127.0.0.1:$pg/#token=$gtok"
[ "$(polylines "$work/dom3.html" plot-util)" -ge 2 ] || fail "utilisation plot: $(grep -o '<svg id="plot-util".*</svg>' "$work/dom3.html" | head -c 600)"
[ "$(polylines "$work/dom3.html" plot-power)" -ge 2 ] || fail "power plot: $(grep -o '<svg id="plot-power".*</svg>' "$work/dom3.html" | head -c 600)"
ok "NVML GPUs: 37 % and 250 W in the history; utilisation and power plots of $(polylines "$work/dom3.html" plot-util) and $(polylines "$work/dom3.html" plot-power) points"
gn_node_stop "$nodes/gpu"
gn_node_start "$nodes/gpu" gpu --listen "127.0.0.1:$(gn_free_port)" --overlay off --dashboard-listen "$pg"
unset GN_NVML_LIB GN_NVML_SHIM_POWER_MW
[ "$(cat "$nodes/gpu/dashboard.token")" = "$gtok" ] || fail "a new token after the restart"
[ "$(code -H "Authorization: Bearer $gtok" "http://127.0.0.1:$pg/v1/status")" = 200 ] || fail "old token refused"
ok "after a restart the same token still opens it"

mkdir -p "$nodes/bad"
gn_cli "$nodes/bad" init >/dev/null
rc=0
err=$(timeout 20 "$GN_BIN/gpunetd" --data-dir "$nodes/bad" --overlay off --dashboard-listen "0.0.0.0:$(gn_free_port)" 2>&1) ||
  rc=$?
[ $rc != 0 ] && grep -q "dashboard_listen must be a loopback address" <<<"$err" && grep -q "SSH tunnel" <<<"$err" ||
  fail "non-loopback: rc $rc: $err"
rc=0
err=$(timeout 20 "$GN_BIN/gpunetd" --data-dir "$nodes/bad" --listen "127.0.0.1:$(gn_free_port)" --overlay off \
  --dashboard-listen "$pd" 2>&1) || rc=$?
[ $rc != 0 ] && grep -q "cannot serve the dashboard on 127.0.0.1:$pd" <<<"$err" || fail "port in use: rc $rc: $err"
ok "a non-loopback address (pointing to an SSH tunnel) or a taken port keeps the daemon from starting"

echo "PASS ($pass checks)"
