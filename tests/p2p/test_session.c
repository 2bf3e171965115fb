/* Tests for the I/O-free session: two sessions wired in memory complete the
 * XX handshake, exchange large messages, and fail closed on bad input. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sodium.h>

#include "session.h"

typedef struct side {
  gn_session *s;
  int ups;
  int msgs;
  int keepalives;
  gn_buf last; /* copy of the last message */
  int err;
} side;

static gn_identity *ida, *idb;

static int setup(void **state) {
  (void)state;
  return gn_identity_generate(&ida) || gn_identity_generate(&idb);
}

static int teardown(void **state) {
  (void)state;
  ida = gn_identity_free(ida);
  idb = gn_identity_free(idb);
  return 0;
}

/* xorshift: deterministic randomness for the sessions. */
static void test_rng(void *ud, uint8_t *out, size_t len) {
  uint64_t *st = ud;
  for (size_t i = 0; i < len; i++) {
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    out[i] = (uint8_t)*st;
  }
}

static void new_side(side *x, bool initiator, const gn_identity *id, const char *addr, gn_noise_rng rng, void *ud) {
  memset(x, 0, sizeof(*x));
  gn_session_cfg cfg = {
      .initiator = initiator, .id = id, .listen_addr = addr, .now_ms = 1000, .rng = rng, .rng_ud = ud};
  assert_int_equal(gn__session_new(&cfg, &x->s), 0);
}

static void free_side(side *x) {
  x->s = gn__session_free(x->s);
  gn_buf_done(&x->last);
}

/* Moves everything from one side's output into the other, in chunks of
 * `chunk` bytes (0: all at once), handling events. */
static bool deliver(side *from, side *to, size_t chunk) {
  gn_buf b = {0};
  assert_int_equal(gn__session_take_output(from->s, &b), 0);
  bool any = b.len > 0;
  size_t off = 0;
  while (off < b.len && !to->err) {
    size_t n = chunk && chunk < b.len - off ? chunk : b.len - off;
    size_t pos = 0;
    while (pos < n) {
      size_t used = 0;
      gn_session_event ev;
      int r = gn__session_feed(to->s, b.data + off + pos, n - pos, &used, &ev);
      if (r < 0) {
        to->err = r;
        break;
      }
      pos += used;
      if (r == 1 && ev.kind == GN_SESSION_EV_UP)
        to->ups++;
      if (r == 1 && ev.kind == GN_SESSION_EV_KEEPALIVE)
        to->keepalives++;
      if (r == 1 && ev.kind == GN_SESSION_EV_MESSAGE) {
        to->msgs++;
        to->last.len = 0;
        assert_int_equal(gn_buf_append(&to->last, ev.msg, ev.msg_len), 0);
      }
    }
    off += n;
  }
  gn_buf_done(&b);
  return any;
}

static void pump(side *a, side *b, size_t chunk) {
  for (int i = 0; i < 100; i++) {
    bool x = deliver(a, b, chunk);
    bool y = deliver(b, a, chunk);
    if (!x && !y)
      return;
  }
  fail_msg("sessions never went quiet");
}

static void handshake(side *a, side *b, size_t chunk) {
  new_side(a, true, ida, "127.0.0.1:7000", NULL, NULL);
  new_side(b, false, idb, "", NULL, NULL);
  assert_int_equal(gn__session_start(a->s), 0);
  pump(a, b, chunk);
}

static void test_session_handshake_binds_node_ids(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  assert_int_equal(a.err, 0);
  assert_int_equal(b.err, 0);
  assert_int_equal(a.ups, 1);
  assert_int_equal(b.ups, 1);
  assert_true(gn__session_is_up(a.s) && gn__session_is_up(b.s));
  assert_memory_equal(gn__session_peer(a.s), idb->pk, GN_PK_LEN);
  assert_memory_equal(gn__session_peer(b.s), ida->pk, GN_PK_LEN);
  assert_string_equal(gn__session_peer_addr(b.s), "127.0.0.1:7000");
  assert_string_equal(gn__session_peer_addr(a.s), "");
  free_side(&a);
  free_side(&b);
}

static void test_session_handshake_byte_by_byte(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 1);
  assert_int_equal(a.ups + b.ups, 2);
  assert_int_equal(gn__session_send(a.s, (const uint8_t *)"ping", 4), 0);
  pump(&a, &b, 1);
  assert_int_equal(b.msgs, 1);
  assert_memory_equal(b.last.data, "ping", 4);
  free_side(&a);
  free_side(&b);
}

static void test_session_exchanges_5mib_messages(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  size_t n = 5u << 20;
  uint8_t *big = malloc(n);
  randombytes_buf(big, n);
  assert_int_equal(gn__session_send(a.s, big, n), 0);
  assert_int_equal(gn__session_send(a.s, (const uint8_t *)"after", 5), 0);
  /* odd chunk size: frames split across feeds */
  assert_true(deliver(&a, &b, 7777));
  assert_int_equal(b.err, 0);
  assert_int_equal(b.msgs, 2);
  assert_memory_equal(b.last.data, "after", 5);
  /* and the other way, checking content */
  assert_int_equal(gn__session_send(b.s, big, n), 0);
  deliver(&b, &a, 0);
  assert_int_equal(a.msgs, 1);
  assert_int_equal(a.last.len, n);
  assert_memory_equal(a.last.data, big, n);
  free(big);
  free_side(&a);
  free_side(&b);
}

static void test_session_bad_frame_closes(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  assert_int_equal(gn__session_send(a.s, (const uint8_t *)"hello", 5), 0);
  gn_buf out = {0};
  assert_int_equal(gn__session_take_output(a.s, &out), 0);
  out.data[out.len - 1] ^= 1; /* the tag */
  size_t used;
  gn_session_event ev;
  assert_int_equal(gn__session_feed(b.s, out.data, out.len, &used, &ev), GN_EPROTO);
  assert_true(gn__session_is_closed(b.s));
  assert_int_equal(gn__session_error(b.s), GN_EPROTO);
  assert_int_equal(gn__session_feed(b.s, out.data, out.len, &used, &ev), GN_ECLOSED);
  assert_int_equal(gn__session_send(b.s, (const uint8_t *)"x", 1), GN_ECLOSED);
  gn_buf_done(&out);
  free_side(&a);
  free_side(&b);
}

static void test_session_rejects_garbage_and_empty_frames(void **state) {
  (void)state;
  const struct {
    const char *what;
    const uint8_t *bytes;
    size_t len;
  } cases[] = {
      {"empty frame", (const uint8_t *)"\x00\x00", 2},
      {"short first message", (const uint8_t *)"\x00\x03\x01\x02\x03", 5},
      {"payload in first message",
       (const uint8_t *)"\x00\x21"
                        "0123456789abcdef0123456789abcdefX",
       35},
  };
  for (size_t k = 0; k < GN_ARRAY_SIZE(cases); k++) {
    side b;
    new_side(&b, false, idb, "", NULL, NULL);
    size_t used;
    gn_session_event ev;
    int r = gn__session_feed(b.s, cases[k].bytes, cases[k].len, &used, &ev);
    if (r != GN_EPROTO)
      fail_msg("case '%s': got %d", cases[k].what, r);
    assert_true(gn__session_is_closed(b.s));
    free_side(&b);
  }
}

static void test_session_rejects_wrong_identity_signature(void **state) {
  (void)state;
  /* An impostor claims ida's public key but signs with idb's secret key. */
  gn_identity fake = {0};
  memcpy(fake.pk, ida->pk, GN_PK_LEN);
  fake.sk = idb->sk;
  side a, b;
  new_side(&a, true, &fake, "", NULL, NULL);
  new_side(&b, false, idb, "", NULL, NULL);
  assert_int_equal(gn__session_start(a.s), 0);
  pump(&a, &b, 0);
  assert_int_equal(b.err, GN_ESIG);
  assert_int_equal(b.ups, 0);
  assert_true(gn__session_is_closed(b.s));
  free_side(&a);
  free_side(&b);
  /* and the same for a responder impostor, caught by the initiator */
  new_side(&a, true, ida, "", NULL, NULL);
  memcpy(fake.pk, idb->pk, GN_PK_LEN);
  fake.sk = ida->sk;
  new_side(&b, false, &fake, "", NULL, NULL);
  assert_int_equal(gn__session_start(a.s), 0);
  pump(&a, &b, 0);
  assert_int_equal(a.err, GN_ESIG);
  assert_int_equal(a.ups, 0);
  free_side(&a);
  free_side(&b);
}

static void test_session_oversized_message_closes_receiver(void **state) {
  (void)state;
  side a, b;
  new_side(&a, true, ida, "", NULL, NULL);
  memset(&b, 0, sizeof(b));
  gn_session_cfg cfg = {.initiator = false, .id = idb, .now_ms = 0, .max_msg = 1000};
  assert_int_equal(gn__session_new(&cfg, &b.s), 0);
  assert_int_equal(gn__session_start(a.s), 0);
  pump(&a, &b, 0);
  assert_int_equal(gn__session_send(b.s, (const uint8_t *)"x", 1), 0);
  uint8_t big[1001] = {0};
  assert_int_equal(gn__session_send(b.s, big, sizeof(big)), GN_ETOOBIG);
  assert_int_equal(gn__session_send(a.s, big, sizeof(big)), 0);
  deliver(&a, &b, 0);
  assert_int_equal(b.err, GN_ETOOBIG);
  free_side(&a);
  free_side(&b);
}

static void test_session_handshake_times_out(void **state) {
  (void)state;
  side a;
  new_side(&a, true, ida, "", NULL, NULL); /* created at 1000 ms */
  assert_int_equal(gn__session_start(a.s), 0);
  assert_int_equal(gn__session_tick(a.s, 1000 + GN_SESSION_HANDSHAKE_TIMEOUT_MS - 1), 0);
  assert_int_equal(gn__session_tick(a.s, 1000 + GN_SESSION_HANDSHAKE_TIMEOUT_MS), GN_ETIMEDOUT);
  assert_true(gn__session_is_closed(a.s));
  free_side(&a);
}

static void test_session_send_before_up_is_refused(void **state) {
  (void)state;
  side a;
  new_side(&a, true, ida, "", NULL, NULL);
  assert_int_equal(gn__session_send(a.s, (const uint8_t *)"x", 1), GN_ESTATE);
  free_side(&a);
}

static void test_session_is_deterministic_with_injected_rng(void **state) {
  (void)state;
  gn_buf out[2] = {{0}, {0}};
  for (int run = 0; run < 2; run++) {
    uint64_t sa = 42, sb = 4242;
    side a, b;
    new_side(&a, true, ida, "", test_rng, &sa);
    new_side(&b, false, idb, "", test_rng, &sb);
    assert_int_equal(gn__session_start(a.s), 0);
    pump(&a, &b, 0);
    assert_int_equal(gn__session_send(a.s, (const uint8_t *)"same", 4), 0);
    assert_int_equal(gn__session_take_output(a.s, &out[run]), 0);
    free_side(&a);
    free_side(&b);
  }
  assert_int_equal(out[0].len, out[1].len);
  assert_memory_equal(out[0].data, out[1].data, out[0].len);
  gn_buf_done(&out[0]);
  gn_buf_done(&out[1]);
}

/* Plays the initiator by hand with the Noise engine, so the third message
 * can carry any payload. */
static int handshake_with_payload(const gn_buf *payload3, const uint8_t s_priv[32]) {
  side b;
  new_side(&b, false, idb, "", NULL, NULL);
  gn_noise_handshake hi;
  assert_int_equal(gn__noise_handshake_init(&hi, GN_SESSION_PROTOCOL, true, (const uint8_t *)GN_SESSION_PROLOGUE,
                                            strlen(GN_SESSION_PROLOGUE), s_priv, NULL, NULL, NULL),
                   0);
  uint8_t m[1024], p[1024];
  size_t n, pn, used;
  gn_session_event ev;
  assert_int_equal(gn__noise_handshake_write(&hi, NULL, 0, m + 2, sizeof(m) - 2, &n), 0);
  m[0] = (uint8_t)(n >> 8), m[1] = (uint8_t)n;
  assert_int_equal(gn__session_feed(b.s, m, n + 2, &used, &ev), 0);
  gn_buf out = {0};
  assert_int_equal(gn__session_take_output(b.s, &out), 0);
  assert_int_equal(gn__noise_handshake_read(&hi, out.data + 2, out.len - 2, p, sizeof(p), &pn), 0);
  gn_buf_done(&out);
  assert_int_equal(gn__noise_handshake_write(&hi, payload3->data, payload3->len, m + 2, sizeof(m) - 2, &n), 0);
  m[0] = (uint8_t)(n >> 8), m[1] = (uint8_t)n;
  int r = gn__session_feed(b.s, m, n + 2, &used, &ev);
  gn__noise_handshake_wipe(&hi);
  free_side(&b);
  return r;
}

static void payload_for(uint64_t v, const gn_identity *id, const uint8_t s_priv[32], gn_buf *out) {
  uint8_t s_pub[32], msg[sizeof(GN_SESSION_STATIC_PREFIX) + 32], sig[GN_SIG_LEN];
  crypto_scalarmult_base(s_pub, s_priv);
  memcpy(msg, GN_SESSION_STATIC_PREFIX, sizeof(GN_SESSION_STATIC_PREFIX));
  memcpy(msg + sizeof(GN_SESSION_STATIC_PREFIX), s_pub, 32);
  gn_identity_sign(id, msg, sizeof(msg), sig);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, v);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, id->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "sig");
  gn_wire_put_bin(&w, sig, GN_SIG_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "");
  out->len = 0;
  assert_int_equal(gn_wire_writer_take(&w, out), 0);
  gn_wire_writer_done(&w);
}

static void test_session_checks_handshake_payload(void **state) {
  (void)state;
  uint8_t s_priv[32], other_priv[32];
  randombytes_buf(s_priv, sizeof(s_priv));
  randombytes_buf(other_priv, sizeof(other_priv));
  gn_buf pl = {0};
  /* the hand-made initiator is accepted when its payload is right */
  payload_for(GN_PROTO_VERSION, ida, s_priv, &pl);
  assert_int_equal(handshake_with_payload(&pl, s_priv), 1);
  /* another protocol version */
  payload_for(GN_PROTO_VERSION + 1, ida, s_priv, &pl);
  assert_int_equal(handshake_with_payload(&pl, s_priv), GN_EVERSION);
  /* a signature over a different Noise static key (a replayed payload) */
  payload_for(GN_PROTO_VERSION, ida, other_priv, &pl);
  assert_int_equal(handshake_with_payload(&pl, s_priv), GN_ESIG);
  /* not a map, missing fields */
  pl.len = 0;
  gn_buf_append(&pl, "\x90", 1);
  assert_int_equal(handshake_with_payload(&pl, s_priv), GN_EPROTO);
  pl.len = 0;
  gn_buf_append(&pl, "\x81\xa1v\x01", 4);
  assert_int_equal(handshake_with_payload(&pl, s_priv), GN_EPROTO);
  gn_buf_done(&pl);
}

/* A responder that reads an initiator's payload of another version finishes
 * the handshake and sends one ERROR (signed by its node key, naming both
 * versions) before it closes, instead of closing without a word. */
static void test_session_other_version_gets_error_before_close(void **state) {
  (void)state;
  uint8_t s_priv[32];
  randombytes_buf(s_priv, sizeof(s_priv));
  gn_buf pl = {0}, out = {0};
  payload_for(7, ida, s_priv, &pl);
  side b;
  new_side(&b, false, idb, "", NULL, NULL);
  gn_noise_handshake hi;
  assert_int_equal(gn__noise_handshake_init(&hi, GN_SESSION_PROTOCOL, true, (const uint8_t *)GN_SESSION_PROLOGUE,
                                            strlen(GN_SESSION_PROLOGUE), s_priv, NULL, NULL, NULL),
                   0);
  uint8_t m[1024], p[1024];
  size_t n, pn, used;
  gn_session_event ev;
  assert_int_equal(gn__noise_handshake_write(&hi, NULL, 0, m + 2, sizeof(m) - 2, &n), 0);
  m[0] = (uint8_t)(n >> 8), m[1] = (uint8_t)n;
  assert_int_equal(gn__session_feed(b.s, m, n + 2, &used, &ev), 0);
  assert_int_equal(gn__session_take_output(b.s, &out), 0);
  assert_int_equal(gn__noise_handshake_read(&hi, out.data + 2, out.len - 2, p, sizeof(p), &pn), 0);
  out.len = 0;
  assert_int_equal(gn__noise_handshake_write(&hi, pl.data, pl.len, m + 2, sizeof(m) - 2, &n), 0);
  m[0] = (uint8_t)(n >> 8), m[1] = (uint8_t)n;
  assert_int_equal(gn__session_feed(b.s, m, n + 2, &used, &ev), GN_EVERSION);
  assert_true(gn__session_is_closed(b.s));
  assert_int_equal(gn__session_peer_version(b.s), 7);
  /* its last words: one transport frame with one whole message */
  assert_int_equal(gn__session_take_output(b.s, &out), 0);
  gn_noise_cipher send, recv;
  assert_int_equal(gn__noise_handshake_split(&hi, &send, &recv, NULL), 0);
  assert_true(out.len > 2 + 4 + GN_NOISE_TAGLEN);
  size_t flen = (size_t)out.data[0] << 8 | out.data[1];
  assert_int_equal(flen + 2, out.len);
  uint8_t *plain = malloc(flen);
  assert_int_equal(gn__noise_cipher_decrypt(&recv, NULL, 0, out.data + 2, flen, plain), 0);
  size_t total = (size_t)plain[0] << 24 | (size_t)plain[1] << 16 | (size_t)plain[2] << 8 | plain[3];
  assert_int_equal(total, flen - GN_NOISE_TAGLEN - 4);
  gn_envelope env;
  assert_int_equal(gn_envelope_open(plain + 4, total, &env), 0);
  assert_int_equal(env.type, GN_MSG_ERROR);
  assert_memory_equal(env.signer, idb->pk, GN_PK_LEN);
  gn_wire_doc doc;
  char reason[256];
  assert_int_equal(gn_wire_decode(env.body, env.body_len, &doc), 0);
  assert_int_equal(gn_wire_get_str(doc.root, "reason", reason, sizeof(reason)), 0);
  gn_wire_doc_done(&doc);
  assert_string_equal(reason, "unsupported protocol version 7; this node speaks version 1");
  free(plain);
  gn__noise_cipher_wipe(&send);
  gn__noise_cipher_wipe(&recv);
  gn_buf_done(&pl);
  gn_buf_done(&out);
  free_side(&b);
}

/* The initiator side: a responder whose payload speaks another version gets
 * the initiator's message 3 and then one ERROR, after which the initiator's
 * session is closed. */
static void test_session_initiator_answers_other_version_with_error(void **state) {
  (void)state;
  uint8_t r_priv[32];
  randombytes_buf(r_priv, sizeof(r_priv));
  gn_buf pl = {0}, out = {0};
  payload_for(9, idb, r_priv, &pl);
  side a;
  new_side(&a, true, ida, "", NULL, NULL);
  assert_int_equal(gn__session_start(a.s), 0);
  gn_noise_handshake hr;
  assert_int_equal(gn__noise_handshake_init(&hr, GN_SESSION_PROTOCOL, false, (const uint8_t *)GN_SESSION_PROLOGUE,
                                            strlen(GN_SESSION_PROLOGUE), r_priv, NULL, NULL, NULL),
                   0);
  uint8_t m[1024], p[1024];
  size_t n, pn, used;
  gn_session_event ev;
  assert_int_equal(gn__session_take_output(a.s, &out), 0);
  assert_int_equal(gn__noise_handshake_read(&hr, out.data + 2, out.len - 2, p, sizeof(p), &pn), 0);
  out.len = 0;
  assert_int_equal(gn__noise_handshake_write(&hr, pl.data, pl.len, m + 2, sizeof(m) - 2, &n), 0);
  m[0] = (uint8_t)(n >> 8), m[1] = (uint8_t)n;
  assert_int_equal(gn__session_feed(a.s, m, n + 2, &used, &ev), GN_EVERSION);
  assert_true(gn__session_is_closed(a.s));
  assert_int_equal(gn__session_peer_version(a.s), 9);
  /* message 3 (with the initiator's own, version 1, identity), then the ERROR */
  assert_int_equal(gn__session_take_output(a.s, &out), 0);
  size_t f3 = (size_t)out.data[0] << 8 | out.data[1];
  assert_true(out.len > f3 + 2);
  assert_int_equal(gn__noise_handshake_read(&hr, out.data + 2, f3, p, sizeof(p), &pn), 0);
  gn_noise_cipher send, recv;
  assert_int_equal(gn__noise_handshake_split(&hr, &send, &recv, NULL), 0);
  const uint8_t *t = out.data + 2 + f3;
  size_t tlen = (size_t)t[0] << 8 | t[1];
  assert_int_equal(out.len, 2 + f3 + 2 + tlen);
  uint8_t *plain = malloc(tlen);
  /* the hand-made responder reads it with its receiving cipher, nonce 0 */
  assert_int_equal(gn__noise_cipher_decrypt(&recv, NULL, 0, t + 2, tlen, plain), 0);
  size_t total = (size_t)plain[0] << 24 | (size_t)plain[1] << 16 | (size_t)plain[2] << 8 | plain[3];
  gn_envelope env;
  assert_int_equal(gn_envelope_open(plain + 4, total, &env), 0);
  assert_int_equal(env.type, GN_MSG_ERROR);
  assert_memory_equal(env.signer, ida->pk, GN_PK_LEN);
  free(plain);
  gn__noise_cipher_wipe(&send);
  gn__noise_cipher_wipe(&recv);
  gn_buf_done(&pl);
  gn_buf_done(&out);
  free_side(&a);
}

/* --- timeouts, keepalives and receive buffers (issue 9) ---------------------*/

/* a and b up at 1000 ms, b with the given limits. */
static void handshake_limited(side *a, side *b, uint64_t idle_ms, uint64_t msg_ms, uint64_t rate_bps) {
  new_side(a, true, ida, "", NULL, NULL);
  memset(b, 0, sizeof(*b));
  gn_session_cfg cfg = {.initiator = false,
                        .id = idb,
                        .now_ms = 1000,
                        .idle_timeout_ms = idle_ms,
                        .msg_timeout_ms = msg_ms,
                        .msg_min_rate_bps = rate_bps};
  assert_int_equal(gn__session_new(&cfg, &b->s), 0);
  assert_int_equal(gn__session_start(a->s), 0);
  pump(a, b, 0);
  assert_true(gn__session_is_up(a->s) && gn__session_is_up(b->s));
}

/* Feeds the first n bytes of from's output to `to` and drops the rest. */
static void deliver_first(side *from, side *to, size_t n) {
  gn_buf out = {0};
  assert_int_equal(gn__session_take_output(from->s, &out), 0);
  assert_true(n <= out.len);
  size_t pos = 0;
  while (pos < n) {
    size_t used = 0;
    gn_session_event ev;
    int r = gn__session_feed(to->s, out.data + pos, n - pos, &used, &ev);
    assert_true(r >= 0);
    pos += used;
    if (r == 1 && ev.kind == GN_SESSION_EV_MESSAGE)
      to->msgs++;
  }
  gn_buf_done(&out);
}

static void test_session_idle_timeout_and_keepalive(void **state) {
  (void)state;
  side a, b;
  handshake_limited(&a, &b, 1000, 0, 0);
  assert_int_equal(gn__session_tick(b.s, 1999), 0);
  /* a keepalive at 1999 counts as the peer being there */
  assert_int_equal(gn__session_keepalive(a.s), 0);
  deliver(&a, &b, 0);
  assert_int_equal(b.keepalives, 1);
  assert_int_equal(b.msgs, 0);
  assert_int_equal(gn__session_tick(b.s, 2998), 0);
  assert_int_equal(gn__session_tick(b.s, 2999), GN_ETIMEDOUT);
  assert_true(gn__session_is_closed(b.s));
  /* a, without an idle timeout, never times out */
  assert_int_equal(gn__session_tick(a.s, 1000000), 0);
  free_side(&a);
  free_side(&b);
}

static void test_session_keepalive_needs_a_session(void **state) {
  (void)state;
  side a;
  new_side(&a, true, ida, "", NULL, NULL);
  assert_int_equal(gn__session_keepalive(a.s), GN_ESTATE);
  free_side(&a);
}

/* A 70,000-byte message at a minimum of 1000 B/s may take 70 s (more than
 * the 5 s floor); its first frame alone, then nothing, times out then. */
static void test_session_stalled_message_times_out(void **state) {
  (void)state;
  side a, b;
  handshake_limited(&a, &b, 0, 5000, 1000);
  static uint8_t m[70000];
  assert_int_equal(gn__session_send(a.s, m, sizeof(m)), 0);
  gn__session_set_time(b.s, 2000);
  deliver_first(&a, &b, 2 + GN_NOISE_MAX_MSG); /* the first frame */
  assert_true(gn__session_receiving(b.s));
  assert_int_equal(gn__session_tick(b.s, 2000 + 69999), 0);
  assert_int_equal(gn__session_tick(b.s, 2000 + 70000), GN_ETIMEDOUT);
  free_side(&a);
  free_side(&b);
}

/* The same message whole within its time: no timeout, however long after. */
static void test_session_message_in_time_is_kept(void **state) {
  (void)state;
  side a, b;
  handshake_limited(&a, &b, 0, 5000, 1000);
  static uint8_t m[70000];
  assert_int_equal(gn__session_send(a.s, m, sizeof(m)), 0);
  gn__session_set_time(b.s, 2000);
  deliver(&a, &b, 0);
  assert_int_equal(b.msgs, 1);
  assert_false(gn__session_receiving(b.s));
  assert_int_equal(gn__session_tick(b.s, 1000000), 0);
  free_side(&a);
  free_side(&b);
}

/* An 8 MiB message announced in its first frame takes memory as its bytes
 * arrive, not at once; once handed over, the large buffer is freed. */
static void test_session_receive_buffer_grows_with_bytes(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  size_t n = GN_MSG_MAX;
  uint8_t *m = calloc(1, n);
  assert_non_null(m);
  assert_int_equal(gn__session_send(a.s, m, n), 0);
  gn_buf out = {0};
  assert_int_equal(gn__session_take_output(a.s, &out), 0);
  size_t used = 0, pos = 0;
  gn_session_event ev;
  /* two frames: about 128 KiB arrived */
  size_t two = 2 * (2 + GN_NOISE_MAX_MSG);
  while (pos < two) {
    assert_int_equal(gn__session_feed(b.s, out.data + pos, two - pos, &used, &ev), 0);
    pos += used;
  }
  assert_true(gn__session_mem(b.s) <= 256 * 1024);
  /* a quarter */
  size_t quarter = out.len / 4;
  while (pos < quarter) {
    assert_int_equal(gn__session_feed(b.s, out.data + pos, quarter - pos, &used, &ev), 0);
    pos += used;
  }
  assert_true(gn__session_mem(b.s) <= n / 4 + (1u << 20) + 65536);
  int r = 0;
  while (pos < out.len && r == 0) {
    r = gn__session_feed(b.s, out.data + pos, out.len - pos, &used, &ev);
    pos += used;
  }
  assert_int_equal(r, 1);
  assert_int_equal(ev.msg_len, n);
  /* the message, its 4-byte size prefix and the last frame's tag */
  assert_true(gn__session_mem(b.s) <= n + 4 + GN_NOISE_TAGLEN);
  /* handed over: trimmed at once */
  gn__session_trim(b.s);
  assert_true(gn__session_mem(b.s) <= GN_SESSION_KEEP_MAX);
  /* the next small message: the 8 MiB buffer is gone */
  assert_int_equal(gn__session_send(a.s, (const uint8_t *)"x", 1), 0);
  gn_buf_done(&out);
  deliver(&a, &b, 0);
  assert_int_equal(b.msgs, 1);
  assert_true(gn__session_mem(b.s) <= GN_SESSION_KEEP_MAX);
  free(m);
  free_side(&a);
  free_side(&b);
}

/* --- the receive path without copies (issue 10) -----------------------------*/

/* Feeds data[0..len) to `to` as two calls split at k, recording events. */
static void feed_split(side *to, const uint8_t *data, size_t len, size_t k) {
  size_t cuts[3] = {0, k, len};
  for (int part = 0; part < 2; part++) {
    size_t pos = cuts[part], end = cuts[part + 1];
    while (pos < end) {
      size_t used = 0;
      gn_session_event ev;
      int r = gn__session_feed(to->s, data + pos, end - pos, &used, &ev);
      assert_int_equal(r >= 0 ? 0 : r, 0);
      pos += used;
      if (r == 1 && ev.kind == GN_SESSION_EV_KEEPALIVE)
        to->keepalives++;
      if (r == 1 && ev.kind == GN_SESSION_EV_MESSAGE) {
        to->msgs++;
        to->last.len = 0;
        assert_int_equal(gn_buf_append(&to->last, ev.msg, ev.msg_len), 0);
      }
    }
  }
}

static void fill(uint8_t *p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(i * 31 + seed + (i >> 8));
}

/* A stream of a message, a keepalive and another message, cut in two at
 * every byte offset (the frame prefixes, bodies and tags included), gives
 * the same two messages and keepalive every time. */
static void test_session_stream_split_at_every_byte_decodes_identically(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  uint8_t m1[300], m2[41];
  fill(m1, sizeof(m1), 1);
  fill(m2, sizeof(m2), 2);
  size_t len = 0;
  for (size_t k = 0; k == 0 || k <= len; k++) {
    assert_int_equal(gn__session_send(a.s, m1, sizeof(m1)), 0);
    assert_int_equal(gn__session_keepalive(a.s), 0);
    assert_int_equal(gn__session_send(a.s, m2, sizeof(m2)), 0);
    gn_buf out = {0};
    assert_int_equal(gn__session_take_output(a.s, &out), 0);
    len = out.len;
    b.msgs = b.keepalives = 0;
    /* the first message is checked when the second has not yet replaced it */
    size_t first_end = 2 + 4 + sizeof(m1) + GN_NOISE_TAGLEN;
    feed_split(&b, out.data, first_end, k < first_end ? k : first_end);
    assert_int_equal(b.msgs, 1);
    assert_memory_equal(b.last.data, m1, sizeof(m1));
    feed_split(&b, out.data + first_end, len - first_end, k > first_end ? k - first_end : 0);
    assert_int_equal(b.msgs, 2);
    assert_int_equal(b.keepalives, 1);
    assert_int_equal(b.last.len, sizeof(m2));
    assert_memory_equal(b.last.data, m2, sizeof(m2));
    gn_buf_done(&out);
  }
  assert_true(len > 300);
  free_side(&a);
  free_side(&b);
}

/* A message of two frames cut in two at every byte offset near where the
 * frames begin and end (and at a stride elsewhere), so each frame is both
 * decrypted straight from the fed bytes and gathered in the buffer first. */
static void test_session_two_frame_message_split_near_frame_edges(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  size_t n = GN_NOISE_MAX_PAYLOAD - 4 + 700; /* 700 bytes in the second frame */
  uint8_t *m = malloc(n);
  assert_non_null(m);
  fill(m, n, 3);
  size_t edge = 2 + GN_NOISE_MAX_MSG; /* where the second frame starts */
  size_t len = edge + 2 + 700 + GN_NOISE_TAGLEN, tried = 0;
  for (size_t k = 0; k <= len; k++) {
    bool near = k < 40 || (k + 40 > edge && k < edge + 40) || k + 40 > len;
    if (!near && k % 4099 != 0)
      continue;
    assert_int_equal(gn__session_send(a.s, m, n), 0);
    gn_buf out = {0};
    assert_int_equal(gn__session_take_output(a.s, &out), 0);
    assert_int_equal(out.len, len);
    b.msgs = 0;
    feed_split(&b, out.data, out.len, k);
    assert_int_equal(b.msgs, 1);
    assert_int_equal(b.last.len, n);
    assert_memory_equal(b.last.data, m, n);
    gn_buf_done(&out);
    tried++;
  }
  assert_true(tried > 150);
  free(m);
  free_side(&a);
  free_side(&b);
}

/* After one 4 MiB message has grown the receive buffer, more 4 MiB
 * messages and small ones between them use it as it is: no allocation. */
static void test_session_large_messages_reuse_receive_buffer(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  size_t n = 4u << 20;
  uint8_t *m = malloc(n);
  assert_non_null(m);
  fill(m, n, 4);
  assert_int_equal(gn__session_send(a.s, m, n), 0);
  deliver(&a, &b, 70000);
  assert_int_equal(b.msgs, 1);
  size_t grows = gn__session_rx_grows(b.s), mem = gn__session_mem(b.s);
  assert_true(grows > 0);
  assert_true(mem >= n && mem <= GN_SESSION_KEEP_MAX);
  for (int i = 0; i < 3; i++) {
    m[0] = (uint8_t)i;
    assert_int_equal(gn__session_send(a.s, m, n), 0);
    deliver(&a, &b, i == 1 ? 0 : 65536);
    assert_int_equal(b.last.len, n);
    assert_memory_equal(b.last.data, m, n);
    assert_int_equal(gn__session_send(a.s, (const uint8_t *)"small", 5), 0);
    deliver(&a, &b, 0);
    assert_int_equal(b.last.len, 5);
  }
  assert_int_equal(b.msgs, 7);
  assert_int_equal(gn__session_rx_grows(b.s), grows);
  assert_int_equal(gn__session_mem(b.s), mem);
  free(m);
  free_side(&a);
  free_side(&b);
}

/* The buffer a 4 MiB message left is let go at the first tick after
 * GN_SESSION_KEEP_IDLE_MS without another large message (small ones do not
 * hold it), and the next messages still arrive. */
static void test_session_idle_large_receive_buffer_is_released(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  size_t n = 4u << 20;
  uint8_t *m = calloc(1, n);
  assert_non_null(m);
  gn__session_set_time(b.s, 5000);
  assert_int_equal(gn__session_send(a.s, m, n), 0);
  deliver(&a, &b, 0);
  assert_int_equal(b.msgs, 1);
  assert_true(gn__session_mem(b.s) >= n);
  gn__session_set_time(b.s, 6000);
  assert_int_equal(gn__session_send(a.s, (const uint8_t *)"small", 5), 0);
  deliver(&a, &b, 0);
  assert_int_equal(gn__session_tick(b.s, 5000 + GN_SESSION_KEEP_IDLE_MS - 1), 0);
  assert_true(gn__session_mem(b.s) >= n);
  assert_int_equal(gn__session_tick(b.s, 5000 + GN_SESSION_KEEP_IDLE_MS), 0);
  assert_true(gn__session_mem(b.s) <= GN_SESSION_KEEP_SMALL);
  assert_int_equal(gn__session_send(a.s, (const uint8_t *)"after", 5), 0);
  deliver(&a, &b, 0);
  assert_int_equal(b.msgs, 3);
  assert_memory_equal(b.last.data, "after", 5);
  free(m);
  free_side(&a);
  free_side(&b);
}

/* Half a frame is in the buffer when the idle time passes: the tick keeps
 * it, and the frame completes. */
static void test_session_idle_release_waits_for_a_half_read_frame(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  size_t n = 4u << 20;
  uint8_t *m = calloc(1, n);
  assert_non_null(m);
  gn__session_set_time(b.s, 5000);
  assert_int_equal(gn__session_send(a.s, m, n), 0);
  deliver(&a, &b, 0);
  m[0] = 9;
  assert_int_equal(gn__session_send(a.s, m, 1000), 0);
  gn_buf out = {0};
  assert_int_equal(gn__session_take_output(a.s, &out), 0);
  size_t used;
  gn_session_event ev;
  assert_int_equal(gn__session_feed(b.s, out.data, 500, &used, &ev), 0);
  assert_int_equal(gn__session_tick(b.s, 5000 + GN_SESSION_KEEP_IDLE_MS), 0);
  assert_true(gn__session_mem(b.s) >= n);
  assert_int_equal(gn__session_feed(b.s, out.data + 500, out.len - 500, &used, &ev), 1);
  assert_int_equal(ev.msg_len, 1000);
  assert_memory_equal(ev.msg, m, 1000);
  assert_int_equal(gn__session_tick(b.s, 5000 + GN_SESSION_KEEP_IDLE_MS + 1), 0);
  assert_true(gn__session_mem(b.s) <= GN_SESSION_KEEP_SMALL);
  gn_buf_done(&out);
  free(m);
  free_side(&a);
  free_side(&b);
}

/* One flipped bit in the second frame of a message closes the session with
 * no message, whether the frame is decrypted straight from the fed bytes or
 * gathered in the buffer and decrypted in place. */
static void test_session_flipped_bit_in_later_frame_closes(void **state) {
  (void)state;
  size_t n = GN_NOISE_MAX_PAYLOAD + 100;
  uint8_t *m = calloc(1, n);
  assert_non_null(m);
  for (int split = 0; split < 2; split++) {
    side a, b;
    handshake(&a, &b, 0);
    assert_int_equal(gn__session_send(a.s, m, n), 0);
    gn_buf out = {0};
    assert_int_equal(gn__session_take_output(a.s, &out), 0);
    out.data[2 + GN_NOISE_MAX_MSG + 2 + 50] ^= 0x10; /* second frame's body */
    feed_split(&b, out.data, 2 + GN_NOISE_MAX_MSG, split ? 1000 : 0);
    size_t pos = 2 + GN_NOISE_MAX_MSG, used;
    gn_session_event ev;
    int r = 0;
    while (r == 0 && pos < out.len) {
      size_t chunk = split ? 60 : out.len - pos;
      r = gn__session_feed(b.s, out.data + pos, chunk < out.len - pos ? chunk : out.len - pos, &used, &ev);
      pos += used;
    }
    assert_int_equal(r, GN_EPROTO);
    assert_int_equal(b.msgs, 0);
    assert_true(gn__session_is_closed(b.s));
    gn_buf_done(&out);
    free_side(&a);
    free_side(&b);
  }
  free(m);
}

/* A later frame whose length prefix is more than the message still has to
 * come is refused on its two prefix bytes, before any room is made for it. */
static void test_session_later_frame_longer_than_due_is_refused_at_prefix(void **state) {
  (void)state;
  side a, b;
  handshake(&a, &b, 0);
  size_t n = GN_NOISE_MAX_PAYLOAD - 4 + 100; /* 100 bytes due after frame 1 */
  uint8_t *m = calloc(1, n);
  assert_non_null(m);
  assert_int_equal(gn__session_send(a.s, m, n), 0);
  gn_buf out = {0};
  assert_int_equal(gn__session_take_output(a.s, &out), 0);
  size_t used;
  gn_session_event ev;
  assert_int_equal(gn__session_feed(b.s, out.data, 2 + GN_NOISE_MAX_MSG, &used, &ev), 0);
  assert_true(gn__session_receiving(b.s));
  size_t mem = gn__session_mem(b.s), grows = gn__session_rx_grows(b.s);
  uint8_t prefix[2] = {0, 100 + GN_NOISE_TAGLEN + 1};
  assert_int_equal(gn__session_feed(b.s, prefix, 2, &used, &ev), GN_EPROTO);
  assert_int_equal(used, 2);
  assert_true(gn__session_is_closed(b.s));
  assert_int_equal(gn__session_mem(b.s), mem);
  assert_int_equal(gn__session_rx_grows(b.s), grows);
  gn_buf_done(&out);
  free(m);
  free_side(&a);
  free_side(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_session_handshake_binds_node_ids),
      cmocka_unit_test(test_session_handshake_byte_by_byte),
      cmocka_unit_test(test_session_exchanges_5mib_messages),
      cmocka_unit_test(test_session_bad_frame_closes),
      cmocka_unit_test(test_session_rejects_garbage_and_empty_frames),
      cmocka_unit_test(test_session_rejects_wrong_identity_signature),
      cmocka_unit_test(test_session_oversized_message_closes_receiver),
      cmocka_unit_test(test_session_handshake_times_out),
      cmocka_unit_test(test_session_stream_split_at_every_byte_decodes_identically),
      cmocka_unit_test(test_session_two_frame_message_split_near_frame_edges),
      cmocka_unit_test(test_session_large_messages_reuse_receive_buffer),
      cmocka_unit_test(test_session_idle_large_receive_buffer_is_released),
      cmocka_unit_test(test_session_idle_release_waits_for_a_half_read_frame),
      cmocka_unit_test(test_session_flipped_bit_in_later_frame_closes),
      cmocka_unit_test(test_session_later_frame_longer_than_due_is_refused_at_prefix),
      cmocka_unit_test(test_session_send_before_up_is_refused),
      cmocka_unit_test(test_session_is_deterministic_with_injected_rng),
      cmocka_unit_test(test_session_checks_handshake_payload),
      cmocka_unit_test(test_session_other_version_gets_error_before_close),
      cmocka_unit_test(test_session_initiator_answers_other_version_with_error),
      cmocka_unit_test(test_session_idle_timeout_and_keepalive),
      cmocka_unit_test(test_session_keepalive_needs_a_session),
      cmocka_unit_test(test_session_stalled_message_times_out),
      cmocka_unit_test(test_session_message_in_time_is_kept),
      cmocka_unit_test(test_session_receive_buffer_grows_with_bytes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
