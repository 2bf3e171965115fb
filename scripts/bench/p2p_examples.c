/* Prints real hex examples of the p2p messages for docs/protocol.md (section 1) and,
 * given a directory, writes the fuzzers' seed corpus. Deterministic: keys
 * come from fixed seeds, so the output is the same on every run. */
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

static void det_rng(void *ud, uint8_t *out, size_t len) {
  uint8_t *ctr = ud;
  randombytes_buf_deterministic(out, len, ctr);
  ctr[0]++;
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

  /* The handshake: B dials A; deterministic keys so the bytes repeat. */
  uint8_t seed_a[randombytes_SEEDBYTES] = {0xa}, seed_b[randombytes_SEEDBYTES] = {0xb};
  gn_session_cfg ca = {.initiator = false, .id = a, .listen_addr = "192.0.2.1:7400", .rng = det_rng, .rng_ud = seed_a};
  gn_session_cfg cb = {.initiator = true, .id = b, .listen_addr = "", .rng = det_rng, .rng_ud = seed_b};
  gn_session *sa, *sb;
  gn__session_new(&ca, &sa);
  gn__session_new(&cb, &sb);
  gn__session_start(sb);
  const char *names[] = {"handshake frame 1 (initiator -> responder: e)",
                         "handshake frame 2 (responder -> initiator: e, ee, s, es + payload)",
                         "handshake frame 3 (initiator -> responder: s, se + payload)"};
  gn_session *from = sb, *to = sa;
  for (int i = 0; i < 3; i++) {
    gn_buf out = {0};
    gn__session_take_output(from, &out);
    hex(names[i], out.data, out.len);
    if (i == 0)
      save(dir, "fuzz_noise_session", "msg1", out.data, out.len);
    size_t used;
    gn_session_event ev;
    gn__session_feed(to, out.data, out.len, &used, &ev);
    gn_buf_done(&out);
    gn_session *t = from;
    from = to;
    to = t;
  }
  gn__session_send(sb, env.data, env.len);
  gn_buf out = {0};
  gn__session_take_output(sb, &out);
  hex("transport frame carrying the OFFER_WITHDRAW envelope", out.data, out.len);
  gn_buf_done(&out);
  gn__session_free(sa);
  gn__session_free(sb);

  /* A handshake payload as a session builds it, for a Noise static key of
   * 32 bytes of 0x33 (sessions draw a fresh one each time). */
  uint8_t s_priv[32], s_pub[32], sigmsg[sizeof(GN_SESSION_STATIC_PREFIX) + 32], sig[GN_SIG_LEN];
  memset(s_priv, 0x33, sizeof(s_priv));
  crypto_scalarmult_base(s_pub, s_priv);
  memcpy(sigmsg, GN_SESSION_STATIC_PREFIX, sizeof(GN_SESSION_STATIC_PREFIX));
  memcpy(sigmsg + sizeof(GN_SESSION_STATIC_PREFIX), s_pub, 32);
  gn_identity_sign(a, sigmsg, sizeof(sigmsg), sig);
  hex("Noise static public key of the payload example", s_pub, 32);
  body.len = 0;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, 1);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, a->pk, 32);
  gn_wire_put_str(&w, "sig");
  gn_wire_put_bin(&w, sig, 64);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "192.0.2.1:7400");
  gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  hex("handshake payload (plaintext, before Noise encryption)", body.data, body.len);
  save(dir, "fuzz_wire", "handshake_payload", body.data, body.len);

  gn_buf_done(&body);
  gn_buf_done(&env);
  gn_identity_free(a);
  gn_identity_free(b);
  return 0;
}
