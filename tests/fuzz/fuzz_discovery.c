/* libFuzzer target: discovery's message handling (PEERS, OFFER,
 * OFFER_WITHDRAW, OFFER_DIGEST and OFFER_WANT bodies) on arbitrary bytes.
 * The bytes are signed with a fixed key first, so the fuzzer reaches the body
 * decoders instead of stopping at the signature. The first byte picks the
 * message type. The table holds one offer of the peer's, and before a digest
 * the peer's summary has made the node ask it for details, so detail digests
 * are decoded and compared too. */
#include <gpunet/discovery.h>

#include <sodium.h>
#include <stdio.h>

static size_t sent_bytes;

static int io_send(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  (void)ud;
  (void)peer;
  gn_envelope e;
  /* whatever discovery sends must be a valid envelope of bounded size */
  if (!env || len > GN_MSG_MAX || gn_envelope_open(env, len, &e) < 0)
    __builtin_trap();
  sent_bytes += len;
  return 0;
}

static int io_connect(void *ud, const char *addr) {
  (void)ud;
  if (!addr || strlen(addr) >= 256) /* discovery must never hand out an unbounded address */
    __builtin_trap();
  return 0;
}

/* The peer's summary {salt, b: 1, h: 8 x 0xff}: differs from any table. */
static void summary(const gn_identity *peer, gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  uint8_t salt[16] = {0}, h[8];
  memset(h, 0xff, sizeof(h));
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "salt");
  gn_wire_put_bin(&w, salt, sizeof(salt));
  gn_wire_put_str(&w, "b");
  gn_wire_put_u64(&w, 1);
  gn_wire_put_str(&w, "h");
  gn_wire_put_bin(&w, h, sizeof(h));
  if (gn_wire_writer_take(&w, &body) < 0 || gn_envelope_seal(peer, GN_MSG_OFFER_DIGEST, body.data, body.len, ret) < 0)
    __builtin_trap();
  gn_wire_writer_done(&w);
  gn_buf_done(&body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static gn_identity *self, *peer;
  static gn_buf offer_env, summary_env;
  static const uint32_t types[] = {GN_MSG_PEERS, GN_MSG_OFFER, GN_MSG_OFFER_WITHDRAW, GN_MSG_OFFER_DIGEST,
                                   GN_MSG_OFFER_WANT};
  if (!self) {
    if (sodium_init() < 0 || gn_identity_generate(&self) < 0 || gn_identity_generate(&peer) < 0)
      __builtin_trap();
    gn_offer o;
    memset(&o, 0, sizeof(o));
    o.seq = 5;
    o.issued_s = 900;
    o.expires_s = 1500;
    snprintf(o.gpu_model, sizeof(o.gpu_model), "RTX 4090");
    snprintf(o.currency, sizeof(o.currency), "EUR");
    if (gn_offer_seal(peer, &o, &offer_env) < 0)
      __builtin_trap();
    summary(peer, &summary_env);
  }
  if (size < 1)
    return 0;
  uint32_t type = types[data[0] % GN_ARRAY_SIZE(types)];
  gn_buf env = {0};
  if (gn_envelope_seal(peer, type, data + 1, size - 1, &env) < 0)
    return 0;
  gn_envelope e, s;
  gn_offer_table *table = gn_offer_table_new(64);
  gn_discovery *d = NULL;
  gn_discovery_io io = {io_send, io_connect, NULL};
  if (table && gn_envelope_open(env.data, env.len, &e) == 0 && gn_discovery_new(self, &io, table, &d) == 0) {
    gn_discovery_seed(d, 1);
    gn_offer_table_put(table, offer_env.data, offer_env.len, 1000);
    gn_discovery_peer_up(d, peer->pk, "127.0.0.1:1", 1000);
    if (type == GN_MSG_OFFER_DIGEST && gn_envelope_open(summary_env.data, summary_env.len, &s) == 0 &&
        gn_discovery_on_message(d, peer->pk, &s, summary_env.data, summary_env.len, 1000) != 0)
      __builtin_trap(); /* a valid summary is taken */
    size_t before = gn_offer_table_count(table);
    sent_bytes = 0;
    int r = gn_discovery_on_message(d, peer->pk, &e, env.data, env.len, 1000);
    /* a refused digest or want changes nothing and sends nothing */
    if (r < 0 && (type == GN_MSG_OFFER_DIGEST || type == GN_MSG_OFFER_WANT) &&
        (sent_bytes || gn_offer_table_count(table) != before))
      __builtin_trap();
    if (sent_bytes > GN_DISCOVERY_PEER_SYNC_BYTES + (1u << 16))
      __builtin_trap(); /* answers stay within the peer's budget (plus a digest or want) */
    gn_discovery_tick(d, 2000);
  }
  gn_discovery_free(d);
  gn_offer_table_free(table);
  gn_buf_done(&env);
  return 0;
}
