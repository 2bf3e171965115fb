#!/usr/bin/env bash
# Settlement end to end (issue 7 item 7), with real daemons over real sockets:
# while a lease runs the provider holds the requester's signed vouchers (its
# balance grows, nothing settled yet); after the release the requester's
# ledger driver and the provider's webhook driver settle the final voucher.
# The webhook goes to a real HTTP server on loopback (python3's http.server)
# that answers 503 first: the daemon retries with the same Idempotency-Key,
# the body carries the voucher and an export that audits exit 0, and
# `gpunet balance` / `gpunet invoices` on both sides agree.
set -euo pipefail
src=${GN_SOURCE_DIR:?}
export GN_BIN=${GN_BUILD_DIR:?}
. "$src/scripts/lib/e2e.sh"

gn_e2e_need_root_runc
if ! command -v python3 >/dev/null; then
  echo "SKIP: needs python3 for the webhook receiver"
  exit 77
fi
gn_e2e_setup settle requester provider
gn_e2e_compat_flags

# The webhook receiver: each POST saved as hook/N.json with its headers in
# hook/N.hdr; the first answered 503, the rest 200.
hook=$work/hook
mkdir -p "$hook"
p_hook=$(gn_free_port)
cat >"$work/hook.py" <<'EOF'
import http.server, os, sys
d, port = sys.argv[1], int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = len([f for f in os.listdir(d) if f.endswith(".json")])
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with open(os.path.join(d, "%d.hdr" % n), "w") as f:
            f.write("path: %s\n%s" % (self.path, self.headers))
        with open(os.path.join(d, "%d.json" % n), "wb") as f:
            f.write(body)
        code = 503 if n == 0 else 200
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
EOF
python3 "$work/hook.py" "$hook" "$p_hook" &
hook_pid=$!
trap 'kill $hook_pid 2>/dev/null; gn_e2e_cleanup' EXIT
for _ in $(seq 50); do
  (echo >"/dev/tcp/127.0.0.1/$p_hook") 2>/dev/null && break
  sleep 0.1
done

lease_field() { # FIELD NODE LEASE
  gn_cli "$2" --json leases | jq -r --arg l "$3" --arg f "$1" '.leases[] | select(.id==$l) | .[$f]'
}
bal() { # NODE JQ: a query on NODE's balance
  gn_cli "$1" --json balance | jq -r "$2"
}

gn_e2e_start_provider --interval-min-s 2 --settle-driver webhook --settle-url "http://127.0.0.1:$p_hook/gpunet/settle" \
  "${gn_e2e_compat[@]}"
gn_e2e_start_requester
gn_e2e_wait_offer 30
pid_p=$(gn_cli "$P" --json status | jq -r .node_id)
pid_r=$(gn_cli "$R" --json status | jq -r .node_id)

lease=$(gn_cli "$R" --json rent --gpu "RTX 4090" --hours 1 --allow-simulated --no-attest --interval 2 | jq -r .lease.id)
[[ $lease == l-* ]] || fail "rent gave no lease: $lease"
accepted() { [ "$(lease_field notes_accepted "$P" "$lease")" -ge "$1" ]; }
gn_wait_until 15 "two debit notes accepted" accepted 2 || fail "the requester did not accept two debit notes"

# --- 1. while the lease runs: vouchers, nothing settled ----------------------
vouched=$(bal "$P" '.balances[0].vouched_micro')
[ "$(bal "$P" '.balances | length')" = 1 ] || fail "the provider's balance is not one line: $(gn_cli "$P" --json balance)"
[ "$(bal "$P" '.balances[0].direction')" = owed_to_us ] || fail "the provider is not owed"
[ "$(bal "$P" '.balances[0].peer')" = "$pid_r" ] || fail "the provider's balance names another peer"
[ "$vouched" -gt 0 ] || fail "the provider holds no voucher after two accepted notes"
[ "$(bal "$P" '.balances[0].settled_micro')" = 0 ] || fail "a running lease is settled"
[ "$(bal "$R" '.balances[0].direction')" = we_owe ] || fail "the requester does not owe"
[ "$(bal "$R" '.balances[0].peer')" = "$pid_p" ] || fail "the requester's balance names another peer"
ok "while the lease runs the provider holds the requester's vouchers ($vouched micro EUR), nothing settled"

# --- 2. release: the final voucher settles on both sides ---------------------
gn_cli "$R" release "$lease" >/dev/null || fail "cannot release $lease"
[ "$(lease_field invoice_status "$R" "$lease")" = accepted ] || fail "the final invoice was not countersigned"
total=$(gn_cli "$R" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .total_micro')
[ "$total" -ge "$vouched" ] || fail "the final total $total is below the vouchers $vouched"
settled() { [ "$(bal "$1" '.balances[0].settled_micro')" = "$total" ]; }
gn_wait_until 10 "the requester's ledger settlement" settled "$R" || fail "the requester did not settle: $(gn_cli "$R" --json balance)"
[ "$(bal "$R" .driver)" = ledger ] || fail "the requester's driver is not the ledger"
# The webhook answered 503 first: the retry comes 2 s later.
gn_wait_until 20 "the provider's webhook settlement" settled "$P" || fail "the provider did not settle: $(gn_cli "$P" --json balance)"
[ "$(bal "$P" .driver)" = webhook ] || fail "the provider's driver is not the webhook"
if [ "$(bal "$P" .pending)" != 0 ] || [ "$(bal "$P" .failed)" != 0 ]; then
  fail "items left: $(gn_cli "$P" --json balance)"
fi
[ "$(bal "$P" '.balances[0].outstanding_micro')" = 0 ] || fail "the provider has an outstanding amount"
ok "both sides settled $total micro EUR (requester: ledger driver; provider: webhook)"

for n in "$R" "$P"; do
  s=$(gn_cli "$n" --json invoices | jq -r --arg l "$lease" '.invoices[] | select(.lease==$l) | .settled')
  [ "$s" = settled ] || fail "gpunet invoices on $n says settled=$s"
  gn_cli "$n" invoices | grep -q "settled" || fail "gpunet invoices on $n has no SETTLED column value"
done
gn_cli "$R" balance | grep -q "we owe" || fail "gpunet balance (table) on the requester"
ok "gpunet invoices shows the lease settled on both sides"

# --- 3. what the webhook received ---------------------------------------------
reqs=("$hook"/*.json)
[ ${#reqs[@]} = 2 ] || fail "the webhook got ${#reqs[@]} request(s), want 2 (503, then 200)"
key0=$(sed -n 's/^Idempotency-Key: //Ip' "$hook/0.hdr" | tr -d '\r')
key1=$(sed -n 's/^Idempotency-Key: //Ip' "$hook/1.hdr" | tr -d '\r')
inv_hash=$(jq -r .invoice_hash "$hook/1.json")
[ "$key0" = "$lease-$inv_hash" ] || fail "idempotency key '$key0', want $lease-$inv_hash"
[ "$key1" = "$key0" ] || fail "the retry changed the idempotency key: $key0 then $key1"
cmp -s "$hook/0.json" "$hook/1.json" || fail "the retry sent another body"
grep -q "^path: /gpunet/settle" "$hook/1.hdr" || fail "posted to another path"
[ "$(jq -r .lease "$hook/1.json")" = "$lease" ] || fail "body names another lease"
[ "$(jq -r .amount_micro "$hook/1.json")" = "$total" ] || fail "body amount $(jq -r .amount_micro "$hook/1.json"), want $total"
if [ "$(jq -r .provider "$hook/1.json")" != "$pid_p" ] || [ "$(jq -r .requester "$hook/1.json")" != "$pid_r" ]; then
  fail "body names other parties"
fi
jq -r .voucher "$hook/1.json" | base64 -d >"$work/voucher.bin" || fail "the voucher is not base64"
[ -s "$work/voucher.bin" ] || fail "empty voucher"
jq .export "$hook/1.json" >"$work/export.json"
set +e
audit_out=$("$GN_BIN/gpunet" invoice audit "$work/export.json" 2>&1)
rc=$?
set -e
[ $rc = 0 ] || fail "the export the webhook received audits with exit $rc: $audit_out"
ok "webhook: 503 then 200 under one Idempotency-Key ($key0), same body, voucher and an export that audits exit 0"

echo "all $pass settlement checks passed"
