/* Tests for signed envelopes: sealing, opening, and every kind of tampering. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/wire.h>

#include <sodium.h>

static gn_identity *id;

static int setup(void **state) {
  (void)state;
  return gn_identity_generate(&id);
}

static int teardown(void **state) {
  (void)state;
  id = gn_identity_free(id);
  return 0;
}

static void seal(uint32_t type, const char *body, gn_buf *out) {
  assert_int_equal(gn_envelope_seal(id, type, (const uint8_t *)body, strlen(body), out), 0);
}

static void test_envelope_seal_open_roundtrip(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_envelope env;
  seal(GN_MSG_OFFER, "the body", &b);
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  assert_int_equal(env.version, GN_PROTO_VERSION);
  assert_int_equal(env.type, GN_MSG_OFFER);
  assert_memory_equal(env.signer, id->pk, GN_PK_LEN);
  assert_int_equal(env.body_len, 8);
  assert_memory_equal(env.body, "the body", 8);
  assert_true(env.body >= b.data && env.body + env.body_len <= b.data + b.len);
  gn_buf_done(&b);
}

static void test_envelope_signature_covers_prefix_type_and_body(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_envelope env;
  seal(7777, "xyz", &b);
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  /* Recompute the documented signed bytes independently. */
  uint8_t msg[sizeof(GN_ENVELOPE_PREFIX) + 4 + 3];
  memcpy(msg, GN_ENVELOPE_PREFIX, sizeof(GN_ENVELOPE_PREFIX));
  memcpy(msg + sizeof(GN_ENVELOPE_PREFIX), "\x00\x00\x1e\x61xyz", 7);
  assert_int_equal(crypto_sign_verify_detached(env.sig, msg, sizeof(msg), id->pk), 0);
  gn_buf_done(&b);
}

static void test_envelope_open_empty_body(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_envelope env;
  assert_int_equal(gn_envelope_seal(id, GN_MSG_JOB_STOP, NULL, 0, &b), 0);
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  assert_int_equal(env.body_len, 0);
  assert_non_null(env.body);
  gn_buf_done(&b);
}

/* Finds needle in the encoded envelope so a test can flip a byte in one
 * field. */
static size_t find(const gn_buf *b, const void *needle, size_t n) {
  for (size_t i = 0; i + n <= b->len; i++)
    if (memcmp(b->data + i, needle, n) == 0)
      return i;
  fail_msg("needle not found");
  return 0;
}

static void test_envelope_open_rejects_tampering(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_envelope env;
  seal(GN_MSG_OFFER, "price=100", &b);
  size_t body_at = find(&b, "price=100", 9);
  size_t signer_at = find(&b, id->pk, GN_PK_LEN);
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  size_t sig_at = (size_t)(env.sig[0] == b.data[b.len - 64] ? b.len - 64 : 0);
  assert_int_equal(sig_at, b.len - 64);
  const struct {
    const char *what;
    size_t at;
    uint8_t xor ;
    int want;
  } cases[] = {
      {"body", body_at + 6, 0x01, GN_ESIG},        {"sig first byte", sig_at, 0x01, GN_ESIG},
      {"sig last byte", b.len - 1, 0x80, GN_ESIG}, {"signer", signer_at + 5, 0x01, GN_ESIG},
      {"type 2 -> 3", 2, 0x01, GN_ESIG},           {"version 1 -> 2", 1, 0x03, GN_EVERSION},
      {"array header", 0, 0x01, GN_EINVAL},
  };
  for (size_t k = 0; k < GN_ARRAY_SIZE(cases); k++) {
    b.data[cases[k].at] ^= cases[k].xor ;
    int r = gn_envelope_open(b.data, b.len, &env);
    b.data[cases[k].at] ^= cases[k].xor ;
    if (r != cases[k].want)
      fail_msg("case '%s': got %d want %d", cases[k].what, r, cases[k].want);
  }
  /* untouched it still opens */
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  gn_buf_done(&b);
}

static void encode_raw(uint64_t version, uint64_t type, size_t signer_len, const char *body, size_t sig_len, int extra,
                       gn_buf *out) {
  uint8_t zero[64] = {0};
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_array(&w, 5 + (extra ? 1 : 0));
  gn_wire_put_u64(&w, version);
  gn_wire_put_u64(&w, type);
  gn_wire_put_bin(&w, zero, signer_len);
  gn_wire_put_bin(&w, body, strlen(body));
  gn_wire_put_bin(&w, zero, sig_len);
  if (extra)
    gn_wire_put_nil(&w);
  assert_int_equal(gn_wire_writer_take(&w, out), 0);
  gn_wire_writer_done(&w);
}

static void test_envelope_open_rejects_bad_shapes(void **state) {
  (void)state;
  const struct {
    const char *what;
    uint64_t version, type;
    size_t signer_len, sig_len;
    int extra, want;
  } cases[] = {
      {"version 2 checked before shape", 2, 1, 31, 3, 0, GN_EVERSION},
      {"version 0", 0, 1, 32, 64, 0, GN_EVERSION},
      {"short signer", 1, 1, 31, 64, 0, GN_EINVAL},
      {"short sig", 1, 1, 32, 63, 0, GN_EINVAL},
      {"type over u32", 1, (uint64_t)UINT32_MAX + 1, 32, 64, 0, GN_EINVAL},
      {"six fields", 1, 1, 32, 64, 1, GN_EINVAL},
      {"well formed but unsigned", 1, 1, 32, 64, 0, GN_ESIG},
  };
  for (size_t k = 0; k < GN_ARRAY_SIZE(cases); k++) {
    gn_buf b = {0};
    gn_envelope env;
    encode_raw(cases[k].version, cases[k].type, cases[k].signer_len, "body", cases[k].sig_len, cases[k].extra, &b);
    int r = gn_envelope_open(b.data, b.len, &env);
    if (r != cases[k].want)
      fail_msg("case '%s': got %d want %d", cases[k].what, r, cases[k].want);
    gn_buf_done(&b);
  }
  gn_envelope env;
  assert_int_equal(gn_envelope_open((const uint8_t *)"\x93\x01\x01\x01", 4, &env), GN_EINVAL);
  assert_int_equal(gn_envelope_open((const uint8_t *)"\x01", 1, &env), GN_EINVAL);
}

/* The signature is over the body bytes as carried: a body that is not
 * canonical msgpack (here a u8 encoded in 9 bytes) still verifies, which it
 * would not if open re-encoded anything. */
static void test_envelope_open_never_reencodes(void **state) {
  (void)state;
  const uint8_t body[] = {0x81, 0xa1, 'n', 0xcf, 0, 0, 0, 0, 0, 0, 0, 5};
  gn_buf b = {0};
  gn_envelope env;
  assert_int_equal(gn_envelope_seal(id, GN_MSG_PEERS, body, sizeof(body), &b), 0);
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  assert_int_equal(env.body_len, sizeof(body));
  assert_memory_equal(env.body, body, sizeof(body));
  gn_buf_done(&b);
}

static void test_envelope_seal_rejects_oversized_body(void **state) {
  (void)state;
  gn_buf b = {0};
  size_t n = GN_MSG_MAX;
  uint8_t *body = calloc(1, n);
  assert_int_equal(gn_envelope_seal(id, GN_MSG_JOB_LOG, body, n, &b), GN_ETOOBIG);
  assert_int_equal(b.len, 0);
  /* The largest allowed body makes an envelope within GN_MSG_MAX. */
  n = GN_MSG_MAX - 128;
  assert_int_equal(gn_envelope_seal(id, GN_MSG_JOB_LOG, body, n, &b), 0);
  assert_true(b.len <= GN_MSG_MAX);
  gn_envelope env;
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  assert_int_equal(env.body_len, n);
  gn_buf_done(&b);
  free(body);
}

/* Session-bound envelopes (docs/protocol.md §1.5): the bulk data types may
 * go unsigned over the session of their signer, and nowhere else. */
static void test_bound_envelope_opens_only_from_its_signers_session(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_envelope env;
  assert_int_equal(gn_envelope_seal_bound(id, GN_MSG_FWD_DATA, (const uint8_t *)"bytes", 5, &b), 0);
  assert_int_equal(gn_envelope_open_from(b.data, b.len, id->pk, &env), 0);
  assert_int_equal(env.type, GN_MSG_FWD_DATA);
  assert_memory_equal(env.signer, id->pk, GN_PK_LEN);
  assert_int_equal(env.body_len, 5);
  assert_memory_equal(env.body, "bytes", 5);
  static const uint8_t zero[GN_SIG_LEN];
  assert_memory_equal(env.sig, zero, GN_SIG_LEN);
  /* Not from a session: kept, embedded or relayed, it is a bad signature. */
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), GN_ESIG);
  /* Over another node's session: the signer is not the peer. */
  gn_identity *other = NULL;
  assert_int_equal(gn_identity_generate(&other), 0);
  assert_int_equal(gn_envelope_open_from(b.data, b.len, other->pk, &env), GN_ESIG);
  gn_identity_free(other);
  assert_int_equal(gn_envelope_open_from(b.data, b.len, NULL, &env), GN_EINVAL);
  gn_buf_done(&b);
}

static void test_bound_types_are_the_bulk_data_alone(void **state) {
  (void)state;
  const uint32_t bound[] = {GN_MSG_EXEC_DATA, GN_MSG_FWD_DATA, GN_MSG_WS_PUT, GN_MSG_WS_DATA};
  for (size_t i = 0; i < sizeof bound / sizeof bound[0]; i++)
    assert_true(gn_msg_type_session_bound(bound[i]));
  /* What opens a stream, grants or ends one, and everything else is signed. */
  const uint32_t signed_only[] = {GN_MSG_OFFER,     GN_MSG_JOB_MANIFEST, GN_MSG_EXEC_OPEN, GN_MSG_EXEC_SIGNAL,
                                  GN_MSG_EXEC_EXIT, GN_MSG_FWD_OPEN,     GN_MSG_FWD_CLOSE, GN_MSG_WS_GET,
                                  GN_MSG_WS_STAT,   GN_MSG_DEBIT_NOTE,   GN_MSG_ERROR,     0};
  gn_buf b = {0};
  gn_envelope env;
  /* what a node sends over a session: bound types unsigned, others signed */
  assert_int_equal(gn_envelope_seal_for_session(id, GN_MSG_FWD_DATA, (const uint8_t *)"x", 1, &b), 0);
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), GN_ESIG);
  assert_int_equal(gn_envelope_open_from(b.data, b.len, id->pk, &env), 0);
  gn_buf_done(&b);
  assert_int_equal(gn_envelope_seal_for_session(id, GN_MSG_JOB_MANIFEST, (const uint8_t *)"x", 1, &b), 0);
  assert_int_equal(gn_envelope_open(b.data, b.len, &env), 0);
  gn_buf_done(&b);
  for (size_t i = 0; i < sizeof signed_only / sizeof signed_only[0]; i++) {
    assert_false(gn_msg_type_session_bound(signed_only[i]));
    assert_int_equal(gn_envelope_seal_bound(id, signed_only[i], (const uint8_t *)"x", 1, &b), GN_EINVAL);
    assert_int_equal(b.len, 0);
  }
}

/* An envelope of a signed type with its signature zeroed (a hostile peer
 * trying the unsigned form for a manifest) is refused even from its own
 * session; a bound type may still come signed (and must then verify). */
static void test_unsigned_form_of_a_signed_type_is_refused(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_envelope env;
  seal(GN_MSG_JOB_MANIFEST, "run me", &b);
  /* The signature is the last 64 bytes of the encoding. */
  memset(b.data + b.len - GN_SIG_LEN, 0, GN_SIG_LEN);
  assert_int_equal(gn_envelope_open_from(b.data, b.len, id->pk, &env), GN_ESIG);
  gn_buf_done(&b);

  seal(GN_MSG_WS_PUT, "chunk", &b);
  assert_int_equal(gn_envelope_open_from(b.data, b.len, id->pk, &env), 0);
  b.data[b.len - 1] ^= 1; /* a bad signature on a bound type is still bad */
  assert_int_equal(gn_envelope_open_from(b.data, b.len, id->pk, &env), GN_ESIG);
  gn_buf_done(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_envelope_seal_open_roundtrip),
      cmocka_unit_test(test_envelope_signature_covers_prefix_type_and_body),
      cmocka_unit_test(test_envelope_open_empty_body),
      cmocka_unit_test(test_envelope_open_rejects_tampering),
      cmocka_unit_test(test_envelope_open_rejects_bad_shapes),
      cmocka_unit_test(test_envelope_open_never_reencodes),
      cmocka_unit_test(test_envelope_seal_rejects_oversized_body),
      cmocka_unit_test(test_bound_envelope_opens_only_from_its_signers_session),
      cmocka_unit_test(test_bound_types_are_the_bulk_data_alone),
      cmocka_unit_test(test_unsigned_form_of_a_signed_type_is_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
