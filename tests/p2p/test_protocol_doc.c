/* docs/protocol.md checked against the code: the handshake example is
 * recomputed from the keys the document gives and compared byte for byte,
 * the discovery examples are re-signed from their stated contents, the
 * type table lists every type the code names, and every section reference
 * points at a section that exists. With GN_DOC_PRINT=1 in the environment it
 * also prints the section 1 examples as the document shows them, so a
 * deliberate change is pasted rather than typed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/offer.h>

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <unistd.h>

#include "session.h"

static char *doc;
static size_t doc_len;

/* --- reading the document ---------------------------------------------------*/

static char *read_doc(void) {
  char path[4096];
  const char *src = getenv("GN_SOURCE_DIR");
  if (src) {
    snprintf(path, sizeof(path), "%s/docs/protocol.md", src);
  } else {
    /* __FILE__ is tests/p2p/test_protocol_doc.c under the source tree. */
    snprintf(path, sizeof(path), "%s", __FILE__);
    char *cut = strstr(path, "tests/p2p/test_protocol_doc.c");
    if (!cut)
      return NULL;
    snprintf(cut, sizeof(path) - (size_t)(cut - path), "docs/protocol.md");
  }
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  gn_buf b = {0};
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
    if (gn_buf_append(&b, chunk, n) < 0)
      break;
  fclose(f);
  if (gn_buf_append(&b, "", 1) < 0) {
    gn_buf_done(&b);
    return NULL;
  }
  doc_len = b.len - 1;
  return (char *)b.data;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

static bool hex_line(const char *p, const char *end) {
  if (p == end)
    return false;
  for (; p < end; p++)
    if (hexval(*p) < 0)
      return false;
  return true;
}

/* The hex block under the line that starts with label (the first such line
 * after `from`, if given): every following line made only of lowercase hex,
 * concatenated. Fails the test when the label or the block is missing. */
static void doc_hex_block(const char *from, const char *label, gn_buf *ret) {
  char at_line[96];
  snprintf(at_line, sizeof(at_line), "\n%s", label); /* a label starts its line */
  const char *p = strstr(from ? from : doc, at_line);
  if (!p)
    fail_msg("docs/protocol.md has no line starting \"%s\"", label);
  p++;
  p = strchr(p, '\n');
  assert_non_null(p);
  p++;
  ret->len = 0;
  for (;;) {
    const char *e = strchr(p, '\n');
    if (!e)
      e = p + strlen(p);
    if (!hex_line(p, e) || (e - p) % 2)
      break;
    for (const char *q = p; q < e; q += 2) {
      uint8_t byte = (uint8_t)(hexval(q[0]) << 4 | hexval(q[1]));
      assert_int_equal(gn_buf_append(ret, &byte, 1), 0);
    }
    if (!*e)
      break;
    p = e + 1;
  }
  if (ret->len == 0)
    fail_msg("no hex under \"%s\" in docs/protocol.md", label);
}

/* A line "name = <64 hex digits>" of the document. */
static void doc_key(const char *name, uint8_t out[32]) {
  char pat[80];
  snprintf(pat, sizeof(pat), "\n%s ", name);
  const char *p = strstr(doc, pat);
  if (!p)
    fail_msg("docs/protocol.md does not give %s", name);
  p = strchr(p + 1, '=');
  assert_non_null(p);
  p++;
  while (*p == ' ')
    p++;
  for (int i = 0; i < 32; i++) {
    int hi = hexval(p[2 * i]), lo = hexval(p[2 * i + 1]);
    if (hi < 0 || lo < 0)
      fail_msg("%s in docs/protocol.md is not 64 hex digits", name);
    out[i] = (uint8_t)(hi << 4 | lo);
  }
}

static bool printing(void) {
  const char *v = getenv("GN_DOC_PRINT");
  return v && *v == '1';
}

static void print_hex(const char *title, const uint8_t *p, size_t n) {
  if (!printing())
    return;
  /* A label like "frame 1 (" is printed as the document shows it. */
  size_t tl = strlen(title);
  while (tl && (title[tl - 1] == '(' || title[tl - 1] == ' '))
    tl--;
  printf("%.*s (%zu bytes):\n", (int)tl, title, n);
  for (size_t i = 0; i < n; i++)
    printf("%02x%s", p[i], (i + 1) % 32 == 0 || i + 1 == n ? "\n" : "");
}

static void expect_block(const char *from, const char *label, const uint8_t *p, size_t n) {
  gn_buf b = {0};
  if (printing())
    return; /* printing a new example: the document may not have it yet */
  doc_hex_block(from, label, &b);
  if (b.len != n || memcmp(b.data, p, n) != 0) {
    print_hex(label, p, n);
    gn_buf_done(&b);
    fail_msg("docs/protocol.md: \"%s\" is not what the code produces (GN_DOC_PRINT=1 prints it)", label);
  }
  gn_buf_done(&b);
}

/* --- keys -------------------------------------------------------------------*/

static gn_identity *identity_from_seed(const uint8_t seed[32]) {
  gn_identity *id = calloc(1, sizeof(*id));
  assert_non_null(id);
  id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES);
  assert_non_null(id->sk);
  crypto_sign_seed_keypair(id->pk, id->sk, seed);
  return id;
}

static gn_identity *doc_identity(const char *name) {
  uint8_t seed[32];
  doc_key(name, seed);
  return identity_from_seed(seed);
}

/* Hands a session its Noise keys in the order it draws them: the static key
 * when it is created, then the ephemeral key for its first handshake
 * message. */
typedef struct keyfeed {
  const uint8_t *keys[2];
  int next;
} keyfeed;

static void feed_rng(void *ud, uint8_t *out, size_t len) {
  keyfeed *k = ud;
  assert_int_equal(len, 32);
  assert_true(k->next < 2);
  memcpy(out, k->keys[k->next++], 32);
}

/* --- section 1 examples -------------------------------------------------------*/

static void withdraw_example(const gn_identity *a, gn_buf *env) {
  assert_int_equal(gn_offer_withdraw_seal(a, 3, env), 0);
}

static void test_doc_node_id_example(void **state) {
  (void)state;
  gn_identity *a = doc_identity("A.ed25519_seed");
  char id[GN_NODE_ID_STRLEN], want[GN_NODE_ID_STRLEN + 4];
  gn_node_id_format(a->pk, id);
  snprintf(want, sizeof(want), "`%s`", id);
  if (!strstr(doc, want))
    fail_msg("the node id of key A (%s) is not in docs/protocol.md", id);
  gn_identity_free(a);
}

static void test_doc_handshake_example_recomputes(void **state) {
  (void)state;
  uint8_t as[32], ae[32], bs[32], be[32], pub[32];
  gn_identity *a = doc_identity("A.ed25519_seed"), *b = doc_identity("B.ed25519_seed");
  doc_key("A.noise_static_priv", as);
  doc_key("A.noise_ephemeral_priv", ae);
  doc_key("B.noise_static_priv", bs);
  doc_key("B.noise_ephemeral_priv", be);
  const char *sec = strstr(doc, "### 1.3 ");
  assert_non_null(sec);

  /* The public halves the document states beside them. */
  uint8_t want[32];
  const struct {
    const char *name;
    const uint8_t *priv;
  } pubs[] = {{"A.noise_static_pub", as},
              {"A.noise_ephemeral_pub", ae},
              {"B.noise_static_pub", bs},
              {"B.noise_ephemeral_pub", be}};
  for (size_t i = 0; i < GN_ARRAY_SIZE(pubs); i++) {
    assert_int_equal(crypto_scalarmult_base(pub, pubs[i].priv), 0);
    doc_key(pubs[i].name, want);
    if (memcmp(pub, want, 32) != 0)
      fail_msg("%s in docs/protocol.md is not the X25519 public key of its private key", pubs[i].name);
  }

  /* A listens at 192.0.2.1:7400 and answers; B dials and advertises none. */
  keyfeed ka = {{as, ae}, 0}, kb = {{bs, be}, 0};
  gn_session_cfg ca = {.initiator = false, .id = a, .listen_addr = "192.0.2.1:7400", .rng = feed_rng, .rng_ud = &ka};
  gn_session_cfg cb = {.initiator = true, .id = b, .listen_addr = "", .rng = feed_rng, .rng_ud = &kb};
  gn_session *sa, *sb;
  assert_int_equal(gn__session_new(&ca, &sa), 0);
  assert_int_equal(gn__session_new(&cb, &sb), 0);
  assert_int_equal(gn__session_start(sb), 0);
  static const char *labels[] = {"frame 1 (", "frame 2 (", "frame 3 ("};
  gn_session *from = sb, *to = sa;
  for (int i = 0; i < 3; i++) {
    gn_buf out = {0};
    assert_int_equal(gn__session_take_output(from, &out), 0);
    print_hex(labels[i], out.data, out.len);
    expect_block(sec, labels[i], out.data, out.len);
    size_t used;
    gn_session_event ev;
    int r = gn__session_feed(to, out.data, out.len, &used, &ev);
    assert_int_equal(r, i == 0 ? 0 : 1);
    gn_buf_done(&out);
    gn_session *t = from;
    from = to;
    to = t;
  }
  assert_true(gn__session_is_up(sa) && gn__session_is_up(sb));
  assert_int_equal(ka.next, 2);
  assert_int_equal(kb.next, 2);
  assert_memory_equal(gn__session_peer(sa), b->pk, GN_PK_LEN);
  assert_memory_equal(gn__session_peer(sb), a->pk, GN_PK_LEN);
  assert_string_equal(gn__session_peer_addr(sb), "192.0.2.1:7400");

  /* The identity payload inside frame 2: A's, over A's Noise static key. */
  uint8_t sigmsg[sizeof(GN_SESSION_STATIC_PREFIX) + 32], sig[GN_SIG_LEN];
  assert_int_equal(crypto_scalarmult_base(pub, as), 0);
  memcpy(sigmsg, GN_SESSION_STATIC_PREFIX, sizeof(GN_SESSION_STATIC_PREFIX));
  memcpy(sigmsg + sizeof(GN_SESSION_STATIC_PREFIX), pub, 32);
  gn_identity_sign(a, sigmsg, sizeof(sigmsg), sig);
  gn_wire_writer w;
  gn_buf payload = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, a->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "sig");
  gn_wire_put_bin(&w, sig, GN_SIG_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "192.0.2.1:7400");
  assert_int_equal(gn_wire_writer_take(&w, &payload), 0);
  gn_wire_writer_done(&w);
  print_hex("payload of frame 2 (", payload.data, payload.len);
  expect_block(sec, "payload of frame 2 (", payload.data, payload.len);

  /* B's first transport frame: the OFFER_WITHDRAW envelope of §1.6. */
  gn_buf env = {0}, out = {0};
  withdraw_example(a, &env);
  assert_int_equal(gn__session_send(sb, env.data, env.len), 0);
  assert_int_equal(gn__session_take_output(sb, &out), 0);
  print_hex("transport frame 1 from B (", out.data, out.len);
  expect_block(NULL, "transport frame 1 from B (", out.data, out.len);

  gn_buf_done(&out);
  gn_buf_done(&env);
  gn_buf_done(&payload);
  gn__session_free(sa);
  gn__session_free(sb);
  gn_identity_free(a);
  gn_identity_free(b);
}

static void test_doc_discovery_examples_verify(void **state) {
  (void)state;
  gn_identity *a = doc_identity("A.ed25519_seed"), *b = doc_identity("B.ed25519_seed");
  const char *sec = strstr(doc, "### 1.6 ");
  assert_non_null(sec);
  gn_wire_writer w;
  gn_buf body = {0}, env = {0};

  /* PEERS from A naming B at 192.0.2.7:7400 */
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, 1);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, b->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "192.0.2.7:7400");
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(a, GN_MSG_PEERS, body.data, body.len, &env), 0);
  const char *peers = strstr(sec, "#### PEERS");
  assert_non_null(peers);
  print_hex("PEERS body", body.data, body.len);
  print_hex("PEERS envelope", env.data, env.len);
  expect_block(peers, "body:", body.data, body.len);
  expect_block(peers, "envelope:", env.data, env.len);

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
  memcpy(o.provider, a->pk, GN_PK_LEN);
  body.len = env.len = 0;
  assert_int_equal(gn_offer_encode(&o, &body), 0);
  assert_int_equal(gn_offer_seal(a, &o, &env), 0);
  const char *offer = strstr(sec, "#### OFFER (type 2)");
  assert_non_null(offer);
  print_hex("OFFER body", body.data, body.len);
  print_hex("OFFER envelope", env.data, env.len);
  expect_block(offer, "body:", body.data, body.len);
  expect_block(offer, "envelope:", env.data, env.len);
  /* and its id, as the document computes it */
  char oid[GN_OFFER_ID_STRLEN], want[64];
  gn_offer_id(&o, oid);
  snprintf(want, sizeof(want), "`%s`", oid);
  if (!strstr(offer, want))
    fail_msg("the example offer's id %s is not in §1.6", oid);

  /* OFFER_WITHDRAW from A */
  env.len = 0;
  withdraw_example(a, &env);
  const char *wd = strstr(sec, "#### OFFER_WITHDRAW");
  assert_non_null(wd);
  print_hex("OFFER_WITHDRAW envelope", env.data, env.len);
  expect_block(wd, "envelope:", env.data, env.len);

  gn_buf_done(&body);
  gn_buf_done(&env);
  gn_identity_free(a);
  gn_identity_free(b);
}

/* --- section 2 examples: the billing formulas ----------------------------------*/

/* The §2.12 examples are made by the billing code (scripts/docs/billing_
 * examples); here they are checked against what §2 says, with nothing but
 * the document's formulas, msgpack and BLAKE2b: an implementation written
 * from the document computes these same values. */

typedef struct bill_msg {
  gn_buf raw;
  gn_envelope env;
  gn_wire_doc doc;
  const msgpack_object *m;
  uint8_t hash[32]; /* BLAKE2b-256 of the envelope */
} bill_msg;

static void bill_msg_load(const char *sec, const char *label, uint32_t type, const uint8_t signer[GN_PK_LEN],
                          uint32_t keys, bill_msg *ret) {
  memset(ret, 0, sizeof(*ret));
  doc_hex_block(sec, label, &ret->raw);
  if (gn_envelope_open(ret->raw.data, ret->raw.len, &ret->env) < 0)
    fail_msg("§2.12 %s: the envelope does not verify", label);
  assert_int_equal(ret->env.type, type);
  assert_memory_equal(ret->env.signer, signer, GN_PK_LEN);
  assert_int_equal(gn_wire_decode(ret->env.body, ret->env.body_len, &ret->doc), 0);
  ret->m = ret->doc.root;
  assert_int_equal(ret->m->type, MSGPACK_OBJECT_MAP);
  if (keys && ret->m->via.map.size != keys)
    fail_msg("§2.12 %s has %u keys, not the %u of its table", label, ret->m->via.map.size, keys);
  crypto_generichash(ret->hash, 32, ret->raw.data, ret->raw.len, NULL, 0);
}

static void bill_msg_done(bill_msg *b) {
  gn_wire_doc_done(&b->doc);
  gn_buf_done(&b->raw);
}

static uint64_t get_u64(const bill_msg *b, const char *key) {
  uint64_t v = 0;
  if (gn_wire_get_u64(b->m, key, &v) < 0)
    fail_msg("no uint %s", key);
  return v;
}

static int64_t get_i64(const bill_msg *b, const char *key) {
  int64_t v = 0;
  if (gn_wire_get_i64(b->m, key, &v) < 0)
    fail_msg("no int %s", key);
  return v;
}

static void get_bin32(const bill_msg *b, const char *key, uint8_t out[32]) {
  if (gn_wire_get_bin_exact(b->m, key, out, 32) < 0)
    fail_msg("no bin 32 %s", key);
}

/* §2.5: the chain through n compact records from second `from`. */
static void chain_walk(uint8_t chain[32], const char *lease_id, uint64_t from, const uint8_t *ticks, size_t n,
                       uint64_t *gpu_sum) {
  for (size_t k = 0; k < n; k++) {
    uint8_t in[15 + 32 + 24 + 13];
    size_t len = 0, idl = strlen(lease_id);
    memcpy(in, "gpunet-tick-v2", 15); /* with its NUL */
    len = 15;
    memcpy(in + len, chain, 32);
    len += 32;
    memcpy(in + len, lease_id, idl);
    len += idl;
    uint64_t idx = from + k;
    for (int i = 7; i >= 0; i--)
      in[len++] = (uint8_t)(idx >> (8 * i));
    uint32_t gpus = ticks[2 * k];
    for (int i = 3; i >= 0; i--)
      in[len++] = (uint8_t)(gpus >> (8 * i));
    in[len++] = ticks[2 * k + 1];
    crypto_generichash(chain, 32, in, len, NULL, 0);
    *gpu_sum += gpus;
  }
}

static uint64_t cost(uint64_t price, uint64_t gpu_seconds) {
  return (uint64_t)((unsigned __int128)price * gpu_seconds / 3600);
}

/* The note or invoice continues (seq, hash, seconds, gpu_seconds, chain) and
 * its cumulative fields follow the rules; returns the new head values. */
static void check_bill(const bill_msg *b, const char *lease_id, uint64_t price, uint64_t want_seq,
                       const uint8_t want_prev[32], uint64_t *seconds, uint64_t *gpu_seconds, uint8_t chain[32]) {
  uint8_t prev[32], head[32];
  const uint8_t *ticks;
  size_t tlen;
  assert_int_equal(get_u64(b, "seq"), want_seq);
  get_bin32(b, "prev", prev);
  assert_memory_equal(prev, want_prev, 32);
  assert_int_equal(get_u64(b, "from"), *seconds + 1);
  assert_int_equal(gn_wire_get_bin_ref(b->m, "ticks", 1u << 23, &ticks, &tlen), 0);
  assert_int_equal(tlen % 2, 0);
  chain_walk(chain, lease_id, *seconds + 1, ticks, tlen / 2, gpu_seconds);
  *seconds += tlen / 2;
  get_bin32(b, "chain_head", head);
  if (memcmp(head, chain, 32) != 0)
    fail_msg("§2.12: chain_head is not the §2.5 chain through the carried ticks");
  assert_int_equal(get_u64(b, "seconds"), *seconds);
  assert_int_equal(get_u64(b, "gpu_seconds"), *gpu_seconds);
  assert_int_equal(get_u64(b, "total_micro"), cost(price, *gpu_seconds));
}

static void b64_equal(const json_t *j, const gn_buf *want, const char *what) {
  const char *s = json_string_value(j);
  if (!s)
    fail_msg("export: %s is not a string", what);
  size_t n = strlen(s), got = 0;
  uint8_t *out = malloc(n + 1);
  assert_non_null(out);
  if (sodium_base642bin(out, n + 1, s, n, NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL) != 0)
    fail_msg("export: %s is not base64 (original variant)", what);
  if (got != want->len || memcmp(out, want->data, got) != 0)
    fail_msg("export: %s is not the example envelope", what);
  free(out);
}

static void test_doc_billing_examples_follow_the_rules(void **state) {
  (void)state;
  gn_identity *a = doc_identity("A.ed25519_seed"), *b = doc_identity("B.ed25519_seed");
  const char *sec = strstr(doc, "### 2.12 ");
  assert_non_null(sec);
  bill_msg req, ag, note, nacc, nrej, inv, iacc, irej;
  bill_msg_load(sec, "lease_request (", GN_MSG_LEASE_REQUEST, b->pk, 0, &req);
  bill_msg_load(sec, "lease_accept (", GN_MSG_LEASE_ACCEPT, a->pk, 0, &ag);
  bill_msg_load(sec, "debit_note (", GN_MSG_DEBIT_NOTE, a->pk, 11, &note);
  bill_msg_load(sec, "debit_accept (", GN_MSG_DEBIT_ACCEPT, b->pk, 7, &nacc);
  bill_msg_load(sec, "debit_reject (", GN_MSG_DEBIT_REJECT, b->pk, 4, &nrej);
  bill_msg_load(sec, "invoice (", GN_MSG_INVOICE, a->pk, 15, &inv);
  bill_msg_load(sec, "invoice_accept (", GN_MSG_INVOICE_ACCEPT, b->pk, 6, &iacc);
  bill_msg_load(sec, "invoice_reject (", GN_MSG_INVOICE_REJECT, b->pk, 3, &irej);

  /* §2.2: the request's offer_id is the §1.6 id of its provider and model */
  gn_offer o;
  char lease_id[24], offer_id[24], want_id[GN_OFFER_ID_STRLEN], cur[8];
  memset(&o, 0, sizeof(o));
  get_bin32(&req, "provider", o.provider);
  assert_int_equal(gn_wire_get_str(req.m, "gpu_model", o.gpu_model, sizeof(o.gpu_model)), 0);
  assert_int_equal(gn_wire_get_str(req.m, "offer_id", offer_id, sizeof(offer_id)), 0);
  assert_int_equal(gn_wire_get_str(req.m, "lease_id", lease_id, sizeof(lease_id)), 0);
  gn_offer_id(&o, want_id);
  if (strcmp(offer_id, want_id) != 0)
    fail_msg("§2.12: the request's offer_id %s is not %s, the id of its provider and model", offer_id, want_id);
  assert_memory_equal(o.provider, a->pk, GN_PK_LEN);
  const uint64_t price = get_u64(&req, "price_uper_hour");

  /* §2.4: the agreement embeds the request byte for byte */
  const uint8_t *inner;
  size_t inner_len;
  assert_int_equal(gn_wire_get_bin_ref(ag.m, "request", 4096, &inner, &inner_len), 0);
  assert_int_equal(inner_len, req.raw.len);
  assert_memory_equal(inner, req.raw.data, inner_len);
  const int64_t start_s = get_i64(&ag, "start_s");

  /* §2.6: note 1 continues the fresh head (seq 0, zeros, genesis) */
  uint8_t chain[32], zeros[32] = {0}, h[32];
  uint64_t seconds = 0, gpu_seconds = 0;
  crypto_generichash(chain, 32, ag.raw.data, ag.raw.len, NULL, 0); /* genesis */
  get_bin32(&note, "agreement_hash", h);
  assert_memory_equal(h, chain, 32);
  check_bill(&note, lease_id, price, 1, zeros, &seconds, &gpu_seconds, chain);
  const uint64_t note_seconds = seconds, note_total = cost(price, gpu_seconds);

  /* its acceptance names it by hash and is the cumulative voucher */
  get_bin32(&nacc, "note_hash", h);
  assert_memory_equal(h, note.hash, 32);
  assert_int_equal(get_u64(&nacc, "seq"), 1);
  assert_int_equal(get_u64(&nacc, "seconds"), note_seconds);
  assert_int_equal(get_u64(&nacc, "total_micro"), note_total);
  assert_int_equal(gn_wire_get_str(nacc.m, "currency", cur, sizeof(cur)), 0);
  assert_string_equal(cur, "EUR");
  get_bin32(&nacc, "provider", h);
  assert_memory_equal(h, a->pk, 32);
  get_bin32(&nrej, "note_hash", h);
  assert_memory_equal(h, note.hash, 32);
  assert_int_equal(get_u64(&nrej, "seq"), 1);

  /* §2.9: the final invoice continues the accepted note */
  const uint8_t *emb;
  size_t emb_len;
  assert_int_equal(gn_wire_get_bin_ref(inv.m, "agreement", 16384, &emb, &emb_len), 0);
  assert_int_equal(emb_len, ag.raw.len);
  assert_memory_equal(emb, ag.raw.data, emb_len);
  check_bill(&inv, lease_id, price, 1, note.hash, &seconds, &gpu_seconds, chain);
  assert_int_equal(get_u64(&inv, "price_uper_hour"), price);
  assert_int_equal(get_i64(&inv, "start_s"), start_s);
  assert_true(get_i64(&inv, "end_s") >= start_s + (int64_t)seconds);
  get_bin32(&iacc, "invoice_hash", h);
  assert_memory_equal(h, inv.hash, 32);
  assert_int_equal(get_u64(&iacc, "seconds"), seconds);
  assert_int_equal(get_u64(&iacc, "total_micro"), cost(price, gpu_seconds));
  get_bin32(&irej, "invoice_hash", h);
  assert_memory_equal(h, inv.hash, 32);

  /* §2.11: the export carries exactly these envelopes */
  const char *js = strstr(sec, "```json\n");
  assert_non_null(js);
  js += 8;
  const char *je = strstr(js, "\n```");
  assert_non_null(je);
  json_error_t jerr;
  json_t *ex = json_loadb(js, (size_t)(je - js), 0, &jerr);
  if (!ex)
    fail_msg("§2.12: the export is not JSON (line %d: %s)", jerr.line, jerr.text);
  assert_string_equal(json_string_value(json_object_get(ex, "format")), "gpunet-invoice/2");
  b64_equal(json_object_get(ex, "agreement"), &ag.raw, "agreement");
  const json_t *notes = json_object_get(ex, "notes");
  assert_int_equal(json_array_size(notes), 1);
  b64_equal(json_object_get(json_array_get(notes, 0), "note"), &note.raw, "notes[0].note");
  b64_equal(json_object_get(json_array_get(notes, 0), "response"), &nacc.raw, "notes[0].response");
  b64_equal(json_object_get(ex, "invoice"), &inv.raw, "invoice");
  b64_equal(json_object_get(ex, "response"), &iacc.raw, "response");
  const json_t *sum = json_object_get(ex, "summary");
  assert_int_equal(json_integer_value(json_object_get(sum, "seconds")), (json_int_t)seconds);
  assert_int_equal(json_integer_value(json_object_get(sum, "total_micro")), (json_int_t)cost(price, gpu_seconds));
  json_decref(ex);

  bill_msg *all[] = {&req, &ag, &note, &nacc, &nrej, &inv, &iacc, &irej};
  for (size_t i = 0; i < GN_ARRAY_SIZE(all); i++)
    bill_msg_done(all[i]);
  gn_identity_free(a);
  gn_identity_free(b);
}

/* The §2.12 examples are what the billing code makes today: the test runs
 * scripts/docs/billing_examples against the build's libraries and compares
 * every block. (It skips, saying why, when the build directory or a C
 * compiler is not at hand.) */
static void test_doc_billing_examples_are_the_codes(void **state) {
  (void)state;
  const char *src = getenv("GN_SOURCE_DIR"), *build = getenv("GN_BUILD_DIR");
  char cmd[8192], path[4096];
  if (!src || !build) {
    printf("skipped: GN_SOURCE_DIR and GN_BUILD_DIR are not set (ctest sets them)\n");
    skip();
  }
  snprintf(path, sizeof(path), "%s/libgpunet_billing.a", build);
  if (access(path, R_OK) != 0) {
    printf("skipped: %s is not built\n", path);
    skip();
  }
  snprintf(cmd, sizeof(cmd), "'%s/scripts/docs/billing_examples' '%s' 2>&1", src, build);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  gn_buf out = {0};
  char chunk[65536];
  size_t n;
  assert_int_equal(gn_buf_append(&out, "\n", 1), 0); /* every label then starts a line */
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
    assert_int_equal(gn_buf_append(&out, chunk, n), 0);
  int rc = pclose(f);
  assert_int_equal(gn_buf_append(&out, "", 1), 0);
  const char *text = (const char *)out.data;
  if (rc != 0)
    fail_msg("scripts/docs/billing_examples failed:\n%.2000s", text);
  const char *sec = strstr(doc, "### 2.12 ");
  assert_non_null(sec);
  static const char *const labels[] = {"lease_request (", "lease_accept (", "debit_note (",     "debit_accept (",
                                       "debit_reject (",  "invoice (",      "invoice_accept (", "invoice_reject ("};
  for (size_t i = 0; i < GN_ARRAY_SIZE(labels); i++) {
    gn_buf want = {0}, have = {0};
    doc_hex_block(text, labels[i], &want);
    doc_hex_block(sec, labels[i], &have);
    if (want.len != have.len || memcmp(want.data, have.data, want.len) != 0)
      fail_msg("§2.12 %s is not what the billing code makes now: rerun scripts/docs/billing_examples", labels[i]);
    gn_buf_done(&want);
    gn_buf_done(&have);
  }
  const char *ej = strstr(text, "\nexport:\n"), *ee = ej ? strstr(ej, "\naudit: ") : NULL;
  const char *dj = strstr(sec, "```json\n"), *de = dj ? strstr(dj + 8, "\n```") : NULL;
  assert_non_null(ee);
  assert_non_null(de);
  ej += 9;
  dj += 8;
  if (ee - ej != de - dj || memcmp(ej, dj, (size_t)(ee - ej)) != 0)
    fail_msg("the §2.12 export is not what the billing code makes now: rerun scripts/docs/billing_examples");
  if (!strstr(ee, "\naudit: 0 verdict 0"))
    fail_msg("the billing code no longer audits its own example clean: %.300s", ee);
  gn_buf_done(&out);
}

/* --- tables and references ----------------------------------------------------*/

/* Every type the code has a name for is a row of the type table at the top. */
static void test_doc_type_table_lists_every_type(void **state) {
  (void)state;
  const char *table = strstr(doc, "| type | name |");
  assert_non_null(table);
  const char *end = strstr(table, "\n\n");
  assert_non_null(end);
  for (uint32_t t = 0; t < 256; t++) {
    const char *name = gn_msg_type_name(t);
    if (!name)
      continue;
    char row[96], upper[64];
    size_t k = 0;
    for (; name[k] && k + 1 < sizeof(upper); k++)
      upper[k] = (char)(name[k] >= 'a' && name[k] <= 'z' ? name[k] - 32 : name[k]);
    upper[k] = '\0';
    if (t >= 50 && t <= 59) {
      snprintf(row, sizeof(row), "\n| 50–59 | ATTEST_* |");
    } else {
      snprintf(row, sizeof(row), "\n| %u | %s", t, upper);
    }
    const char *hit = strstr(table, row);
    if (!hit || hit > end)
      fail_msg("type %u (%s) is not in the type table of docs/protocol.md", t, upper);
  }
}

/* "§2.4" and "section 2.4" name a heading "## 2." / "### 2.4 " that exists. */
static void test_doc_section_references_resolve(void **state) {
  (void)state;
  static const char *const forms[] = {"§", "section "};
  for (size_t f = 0; f < GN_ARRAY_SIZE(forms); f++) {
    for (const char *p = strstr(doc, forms[f]); p; p = strstr(p + 1, forms[f])) {
      const char *q = p + strlen(forms[f]);
      char ref[16];
      size_t n = 0;
      while (n + 1 < sizeof(ref) && ((*q >= '0' && *q <= '9') || (*q == '.' && q[1] >= '0' && q[1] <= '9')))
        ref[n++] = *q++;
      ref[n] = '\0';
      if (n == 0)
        continue; /* "section" as a plain word */
      char h2[32], h3[32], h4[32];
      snprintf(h2, sizeof(h2), "\n## %s. ", ref);
      snprintf(h3, sizeof(h3), "\n### %s ", ref);
      snprintf(h4, sizeof(h4), "\n#### %s ", ref);
      if (!strstr(doc, h2) && !strstr(doc, h3) && !strstr(doc, h4)) {
        char ctx[60];
        snprintf(ctx, sizeof(ctx), "%.50s", p > doc + 20 ? p - 20 : doc);
        fail_msg("docs/protocol.md refers to %s%s, which is no heading (\"...%s...\")", forms[f], ref, ctx);
      }
    }
  }
}

static int setup(void **state) {
  (void)state;
  if (sodium_init() < 0)
    return -1;
  doc = read_doc();
  return doc ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  free(doc);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_doc_node_id_example),
      cmocka_unit_test(test_doc_handshake_example_recomputes),
      cmocka_unit_test(test_doc_discovery_examples_verify),
      cmocka_unit_test(test_doc_billing_examples_follow_the_rules),
      cmocka_unit_test(test_doc_billing_examples_are_the_codes),
      cmocka_unit_test(test_doc_type_table_lists_every_type),
      cmocka_unit_test(test_doc_section_references_resolve),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
