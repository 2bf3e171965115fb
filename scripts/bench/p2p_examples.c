/* Prints the hex examples of docs/protocol.md section 1 (PEERS, OFFER,
 * OFFER_WITHDRAW, the Noise handshake and the first transport frame) and,
 * given a directory, writes the fuzzers' seed corpus. Deterministic: the
 * node keys A and B and the Noise keys are the ones the document gives, so
 * every block printed is, byte for byte, the document's (which
 * tests/p2p/test_protocol_doc.c checks; GN_DOC_PRINT=1 makes that test print
 * them as well). Build against a build dir's p2p library, e.g.:
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Ip2p scripts/bench/p2p_examples.c \
 *     build/libgpunet_p2p.a $(pkg-config --cflags --libs libsodium libuv msgpack sqlite3) \
 *     -o build/p2p_examples && build/p2p_examples [CORPUS_DIR] */
#include <gpunet/offer.h>

#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>

#include "../../p2p/session.h"

static gn_identity *fixed_identity(uint8_t fill) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  memset(seed, fill, sizeof(seed));
  gn_identity *id = calloc(1, sizeof(*id));
  id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES);
  crypto_sign_seed_keypair(id->pk, id->sk, seed);
  return id;
}

static void hex(const char *title, const uint8_t *p, size_t n) {
  printf("%s (%zu bytes):\n", title, n);
  for (size_t i = 0; i < n; i++)
    printf("%02x%s", p[i], (i + 1) % 32 == 0 || i + 1 == n ? "\n" : "");
  printf("\n");
}

static void save(const char *dir, const char *sub, const char *name, const uint8_t *p, size_t n) {
  if (!dir)
    return;
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", dir, sub);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/%s/%s", dir, sub, name);
  FILE *f = fopen(path, "wb");
  if (!f)
    return;
  fwrite(p, 1, n, f);
  fclose(f);
}

/* Hands a session its Noise keys in the order it draws them: the static key
 * when it is created, then the ephemeral key for its first handshake
 * message (as tests/p2p/test_protocol_doc.c does). */
typedef struct keyfeed {
  uint8_t keys[2][32];
  int next;
} keyfeed;

static void feed_rng(void *ud, uint8_t *out, size_t len) {
  keyfeed *k = ud;
  if (len != 32 || k->next >= 2) {
    fprintf(stderr, "p2p_examples: the session drew %zu random bytes, not a key of the document\n", len);
    exit(1);
  }
  memcpy(out, k->keys[k->next++], 32);
}

static void key_line(const char *name, const uint8_t k[32]) {
  printf("%-22s = ", name);
  for (int i = 0; i < 32; i++)
    printf("%02x", k[i]);
  printf("\n");
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : NULL;
  if (sodium_init() < 0)
    return 1;
  gn_identity *a = fixed_identity(1), *b = fixed_identity(2);
  char ida[GN_NODE_ID_STRLEN];
  gn_node_id_format(a->pk, ida);
  printf("node id of the example key A: %s\n\n", ida);

  /* PEERS from A: one peer, B */
  gn_wire_writer w;
  gn_buf body = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, 1);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, b->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "192.0.2.7:7400");
  gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  gn_envelope_seal(a, GN_MSG_PEERS, body.data, body.len, &env);
  hex("PEERS body", body.data, body.len);
  hex("PEERS envelope", env.data, env.len);
  save(dir, "fuzz_wire", "peers_body", body.data, body.len);
  save(dir, "fuzz_envelope", "peers", env.data, env.len);

  /* OFFER from A */
  gn_offer o;
  memset(&o, 0, sizeof(o));
  o.seq = 3;
  o.issued_s = 1767225600; /* 2026-01-01 */
  o.expires_s = o.issued_s + 600;
  snprintf(o.addr, sizeof(o.addr), "192.0.2.1:7400");
  snprintf(o.gpu_model, sizeof(o.gpu_model), "NVIDIA GeForce RTX 4090");
  o.vram_mib = 24564;
  o.gpus_free = 1;
  o.gpus_total = 2;
  o.price_uper_hour = 450000;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  o.max_hours = 24;
  o.simulated = false;
  memcpy(o.provider, a->pk, GN_PK_LEN);
  body.len = env.len = 0;
  gn_offer_encode(&o, &body);
  gn_offer_seal(a, &o, &env);
  hex("OFFER body", body.data, body.len);
  hex("OFFER envelope", env.data, env.len);
  save(dir, "fuzz_wire", "offer_body", body.data, body.len);
  save(dir, "fuzz_offer", "offer_body", body.data, body.len);
  save(dir, "fuzz_offer", "offer_envelope", env.data, env.len);
  save(dir, "fuzz_envelope", "offer", env.data, env.len);

  /* OFFER_WITHDRAW from A */
  body.len = env.len = 0;
  gn_offer_withdraw_seal(a, 3, &env);
  hex("OFFER_WITHDRAW envelope", env.data, env.len);
  save(dir, "fuzz_envelope", "withdraw", env.data, env.len);
  save(dir, "fuzz_offer", "withdraw_envelope", env.data, env.len);

  /* The handshake of section 1.3: B dials A, which listens at 192.0.2.1:7400;
   * each side's Noise static and ephemeral keys are the document's. */
  keyfeed ka = {{{0}}, 0}, kb = {{{0}}, 0};
  memset(ka.keys[0], 0xa1, 32);
  memset(ka.keys[1], 0xa2, 32);
  memset(kb.keys[0], 0xb1, 32);
  memset(kb.keys[1], 0xb2, 32);
  const struct {
    const char *name;
    const uint8_t *priv;
  } keys[] = {{"A.noise_static", ka.keys[0]},
              {"A.noise_ephemeral", ka.keys[1]},
              {"B.noise_static", kb.keys[0]},
              {"B.noise_ephemeral", kb.keys[1]}};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    uint8_t pub[32];
    char name[32];
    crypto_scalarmult_base(pub, keys[i].priv);
    snprintf(name, sizeof(name), "%s_priv", keys[i].name);
    key_line(name, keys[i].priv);
    snprintf(name, sizeof(name), "%s_pub", keys[i].name);
    key_line(name, pub);
  }
  printf("\n");
  gn_session_cfg ca = {.initiator = false, .id = a, .listen_addr = "192.0.2.1:7400", .rng = feed_rng, .rng_ud = &ka};
  gn_session_cfg cb = {.initiator = true, .id = b, .listen_addr = "", .rng = feed_rng, .rng_ud = &kb};
  gn_session *sa, *sb;
  if (gn__session_new(&ca, &sa) < 0 || gn__session_new(&cb, &sb) < 0 || gn__session_start(sb) < 0) {
    fprintf(stderr, "p2p_examples: cannot start the example sessions\n");
    return 1;
  }
  const char *names[] = {"frame 1", "frame 2", "frame 3"};
  gn_session *from = sb, *to = sa;
  for (int i = 0; i < 3; i++) {
    gn_buf out = {0};
    size_t used;
    gn_session_event ev;
    if (gn__session_take_output(from, &out) < 0 || gn__session_feed(to, out.data, out.len, &used, &ev) < 0) {
      fprintf(stderr, "p2p_examples: %s of the handshake failed\n", names[i]);
      return 1;
    }
    hex(names[i], out.data, out.len);
    if (i == 0)
      save(dir, "fuzz_noise_session", "msg1", out.data, out.len);
    gn_buf_done(&out);
    gn_session *t = from;
    from = to;
    to = t;
  }

  /* A's identity payload inside frame 2: its sig is over A's Noise static
   * public key (Ed25519 signatures are deterministic). */
  uint8_t s_pub[32], sigmsg[sizeof(GN_SESSION_STATIC_PREFIX) + 32], sig[GN_SIG_LEN];
  crypto_scalarmult_base(s_pub, ka.keys[0]);
  memcpy(sigmsg, GN_SESSION_STATIC_PREFIX, sizeof(GN_SESSION_STATIC_PREFIX));
  memcpy(sigmsg + sizeof(GN_SESSION_STATIC_PREFIX), s_pub, 32);
  gn_identity_sign(a, sigmsg, sizeof(sigmsg), sig);
  body.len = 0;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, a->pk, 32);
  gn_wire_put_str(&w, "sig");
  gn_wire_put_bin(&w, sig, 64);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "192.0.2.1:7400");
  gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  hex("payload of frame 2", body.data, body.len);
  save(dir, "fuzz_wire", "handshake_payload", body.data, body.len);

  /* B's first transport frame (section 1.4): the OFFER_WITHDRAW envelope. */
  gn_buf out = {0};
  if (gn__session_send(sb, env.data, env.len) < 0 || gn__session_take_output(sb, &out) < 0) {
    fprintf(stderr, "p2p_examples: the transport frame failed\n");
    return 1;
  }
  hex("transport frame 1 from B", out.data, out.len);
  gn_buf_done(&out);
  gn__session_free(sa);
  gn__session_free(sb);

  gn_buf_done(&body);
  gn_buf_done(&env);
  gn_identity_free(a);
  gn_identity_free(b);
  return 0;
}
