/* libFuzzer target: discovery's message handling (PEERS, OFFER,
 * OFFER_WITHDRAW bodies) on arbitrary bytes. The bytes are signed with a
 * fixed key first, so the fuzzer reaches the body decoders instead of stopping
 * at the signature. The first byte picks the message type. */
#include <gpunet/discovery.h>

#include <sodium.h>

static int io_send(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  (void)ud;
  (void)peer;
  (void)env;
  (void)len;
  return 0;
}

static int io_connect(void *ud, const char *addr) {
  (void)ud;
  if (!addr || strlen(addr) >= 256) /* discovery must never hand out an unbounded address */
    __builtin_trap();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static gn_identity *self, *peer;
  static const uint32_t types[] = {GN_MSG_PEERS, GN_MSG_OFFER, GN_MSG_OFFER_WITHDRAW};
  if (!self) {
    if (sodium_init() < 0 || gn_identity_generate(&self) < 0 || gn_identity_generate(&peer) < 0)
      __builtin_trap();
  }
  if (size < 1)
    return 0;
  uint32_t type = types[data[0] % GN_ARRAY_SIZE(types)];
  gn_buf env = {0};
  if (gn_envelope_seal(peer, type, data + 1, size - 1, &env) < 0)
    return 0;
  gn_envelope e;
  gn_offer_table *table = gn_offer_table_new(64);
  gn_discovery *d = NULL;
  gn_discovery_io io = {io_send, io_connect, NULL};
  if (table && gn_envelope_open(env.data, env.len, &e) == 0 && gn_discovery_new(self, &io, table, &d) == 0) {
    gn_discovery_peer_up(d, peer->pk, "127.0.0.1:1", 1000);
    gn_discovery_on_message(d, peer->pk, &e, env.data, env.len, 1000);
    gn_discovery_tick(d, 2000);
  }
  gn_discovery_free(d);
  gn_offer_table_free(table);
  gn_buf_done(&env);
  return 0;
}
