/* Tests for the bounded msgpack codec: round trips, hostile inputs and the
 * typed accessors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/wire.h>

static void encode_sample(gn_buf *out) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 8);
  gn_wire_put_str(&w, "u");
  gn_wire_put_u64(&w, UINT64_MAX);
  gn_wire_put_str(&w, "i");
  gn_wire_put_i64(&w, INT64_MIN);
  gn_wire_put_str(&w, "b");
  gn_wire_put_bool(&w, true);
  gn_wire_put_str(&w, "s");
  gn_wire_put_str(&w, "hello");
  gn_wire_put_str(&w, "bin");
  gn_wire_put_bin(&w, "\x01\x02\x03", 3);
  gn_wire_put_str(&w, "a");
  gn_wire_put_array(&w, 2);
  gn_wire_put_u64(&w, 1);
  gn_wire_put_nil(&w);
  gn_wire_put_str(&w, "ipos");
  gn_wire_put_i64(&w, 42);
  gn_wire_put_str(&w, "e");
  gn_wire_put_str(&w, "");
  assert_int_equal(gn_wire_writer_take(&w, out), 0);
  gn_wire_writer_done(&w);
}

static void test_wire_roundtrip_scalars(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_wire_doc doc;
  encode_sample(&b);
  assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
  uint64_t u;
  int64_t i;
  bool bo;
  char s[16];
  uint8_t bin[3];
  const uint8_t *ref;
  size_t rlen;
  const msgpack_object_array *arr;
  assert_int_equal(gn_wire_get_u64(doc.root, "u", &u), 0);
  assert_true(u == UINT64_MAX);
  assert_int_equal(gn_wire_get_i64(doc.root, "i", &i), 0);
  assert_true(i == INT64_MIN);
  assert_int_equal(gn_wire_get_i64(doc.root, "ipos", &i), 0);
  assert_int_equal(i, 42);
  assert_int_equal(gn_wire_get_bool(doc.root, "b", &bo), 0);
  assert_true(bo);
  assert_int_equal(gn_wire_get_str(doc.root, "s", s, sizeof(s)), 0);
  assert_string_equal(s, "hello");
  assert_int_equal(gn_wire_get_str(doc.root, "e", s, sizeof(s)), 0);
  assert_string_equal(s, "");
  assert_int_equal(gn_wire_get_bin_exact(doc.root, "bin", bin, 3), 0);
  assert_memory_equal(bin, "\x01\x02\x03", 3);
  assert_int_equal(gn_wire_get_bin_ref(doc.root, "bin", 3, &ref, &rlen), 0);
  assert_int_equal(rlen, 3);
  /* by reference: into the input buffer */
  assert_true(ref > b.data && ref + rlen <= b.data + b.len);
  assert_int_equal(gn_wire_get_array(doc.root, "a", 2, &arr), 0);
  assert_int_equal(arr->size, 2);
  gn_wire_doc_done(&doc);
  gn_buf_done(&b);
}

/* Round trips over a table of values through each width msgpack uses. */
static void test_wire_roundtrip_integer_widths(void **state) {
  (void)state;
  const uint64_t us[] = {0, 1, 127, 128, 255, 256, 65535, 65536, UINT32_MAX, (uint64_t)UINT32_MAX + 1, UINT64_MAX};
  const int64_t is[] = {-1, -32, -33, -128, -129, -32768, -32769, INT32_MIN, (int64_t)INT32_MIN - 1, INT64_MIN};
  for (size_t k = 0; k < GN_ARRAY_SIZE(us); k++) {
    gn_wire_writer w;
    gn_buf b = {0};
    gn_wire_doc doc;
    uint64_t v;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 1);
    gn_wire_put_str(&w, "v");
    gn_wire_put_u64(&w, us[k]);
    assert_int_equal(gn_wire_writer_take(&w, &b), 0);
    gn_wire_writer_done(&w);
    assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
    assert_int_equal(gn_wire_get_u64(doc.root, "v", &v), 0);
    assert_true(v == us[k]);
    gn_wire_doc_done(&doc);
    gn_buf_done(&b);
  }
  for (size_t k = 0; k < GN_ARRAY_SIZE(is); k++) {
    gn_wire_writer w;
    gn_buf b = {0};
    gn_wire_doc doc;
    int64_t v;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 1);
    gn_wire_put_str(&w, "v");
    gn_wire_put_i64(&w, is[k]);
    assert_int_equal(gn_wire_writer_take(&w, &b), 0);
    gn_wire_writer_done(&w);
    assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
    assert_int_equal(gn_wire_get_i64(doc.root, "v", &v), 0);
    assert_true(v == is[k]);
    gn_wire_doc_done(&doc);
    gn_buf_done(&b);
  }
}

static void test_wire_roundtrip_string_and_bin_widths(void **state) {
  (void)state;
  const size_t lens[] = {0, 31, 32, 255, 256, 65535, 65536, 100000};
  for (size_t k = 0; k < GN_ARRAY_SIZE(lens); k++) {
    size_t n = lens[k];
    char *s = malloc(n + 1);
    memset(s, 'x', n);
    s[n] = '\0';
    gn_wire_writer w;
    gn_buf b = {0};
    gn_wire_doc doc;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "s");
    gn_wire_put_str(&w, s);
    gn_wire_put_str(&w, "b");
    gn_wire_put_bin(&w, s, n);
    assert_int_equal(gn_wire_writer_take(&w, &b), 0);
    gn_wire_writer_done(&w);
    assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
    char *t = malloc(n + 1);
    assert_int_equal(gn_wire_get_str(doc.root, "s", t, n + 1), 0);
    assert_string_equal(t, s);
    if (n > 0)
      assert_int_equal(gn_wire_get_str(doc.root, "s", t, n), GN_ETOOBIG);
    const uint8_t *ref;
    size_t rlen;
    assert_int_equal(gn_wire_get_bin_ref(doc.root, "b", n, &ref, &rlen), 0);
    assert_int_equal(rlen, n);
    if (n > 0)
      assert_int_equal(gn_wire_get_bin_ref(doc.root, "b", n - 1, &ref, &rlen), GN_ETOOBIG);
    gn_wire_doc_done(&doc);
    gn_buf_done(&b);
    free(s);
    free(t);
  }
}

typedef struct bad_case {
  const char *what;
  const uint8_t *bytes;
  size_t len;
  int want;
} bad_case;

#define B(...) (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__})

static void test_wire_decode_rejects_malformed(void **state) {
  (void)state;
  const bad_case cases[] = {
      {"empty", (const uint8_t[]){0}, 0, GN_EINVAL},
      {"truncated str", B(0xa5, 'a', 'b'), GN_EINVAL},
      {"truncated u32", B(0xce, 0, 0), GN_EINVAL},
      {"truncated map", B(0x81, 0xa1, 'k'), GN_EINVAL},
      {"truncated str32 header", B(0xdb, 0, 0), GN_EINVAL},
      {"str32 beyond buffer", B(0xdb, 0xff, 0xff, 0xff, 0xff, 'a'), GN_EINVAL},
      {"bin32 beyond buffer", B(0xc6, 0x7f, 0xff, 0xff, 0xff, 0), GN_EINVAL},
      {"huge array32 header", B(0xdd, 0xff, 0xff, 0xff, 0xff, 0x01), GN_ETOOBIG},
      {"huge map32 header", B(0xdf, 0x10, 0x00, 0x00, 0x00, 0x01), GN_ETOOBIG},
      {"array more than bytes", B(0xdc, 0x00, 0x10, 0x01, 0x02), GN_EINVAL},
      {"map more than bytes", B(0x82, 0xa1, 'k', 0x01), GN_EINVAL},
      {"trailing bytes", B(0x01, 0x02), GN_EINVAL},
      {"trailing after map", B(0x80, 0xc0), GN_EINVAL},
      {"ext8", B(0xc7, 0x01, 0x05, 0x00), GN_EINVAL},
      {"fixext1", B(0xd4, 0x05, 0x00), GN_EINVAL},
      {"ext32", B(0xc9, 0, 0, 0, 1, 5, 0), GN_EINVAL},
      {"never-used 0xc1", B(0xc1), GN_EINVAL},
  };
  for (size_t k = 0; k < GN_ARRAY_SIZE(cases); k++) {
    gn_wire_doc doc;
    int r = gn_wire_decode(cases[k].bytes, cases[k].len, &doc);
    if (r != cases[k].want)
      fail_msg("case '%s': got %d want %d", cases[k].what, r, cases[k].want);
  }
}

static void test_wire_decode_rejects_deep_nesting(void **state) {
  (void)state;
  uint8_t buf[64];
  gn_wire_doc doc;
  /* GN_WIRE_MAX_DEPTH nested arrays are fine, one more is not. */
  for (size_t d = GN_WIRE_MAX_DEPTH; d <= GN_WIRE_MAX_DEPTH + 1; d++) {
    for (size_t i = 0; i < d - 1; i++)
      buf[i] = 0x91;
    buf[d - 1] = 0x90;
    int r = gn_wire_decode(buf, d, &doc);
    if (d == GN_WIRE_MAX_DEPTH) {
      assert_int_equal(r, 0);
      gn_wire_doc_done(&doc);
    } else {
      assert_int_equal(r, GN_ETOOBIG);
    }
  }
  /* Far deeper than any stack: 1 MiB of nested fixarray headers. */
  size_t n = 1 << 20;
  uint8_t *deep = malloc(n);
  memset(deep, 0x91, n);
  assert_int_equal(gn_wire_decode(deep, n, &doc), GN_ETOOBIG);
  free(deep);
}

static void test_wire_decode_rejects_oversized_message(void **state) {
  (void)state;
  size_t n = GN_MSG_MAX + 1;
  uint8_t *buf = calloc(1, n);
  buf[0] = 0xc6; /* bin32 of n-5 bytes */
  uint32_t bl = (uint32_t)(n - 5);
  buf[1] = (uint8_t)(bl >> 24);
  buf[2] = (uint8_t)(bl >> 16);
  buf[3] = (uint8_t)(bl >> 8);
  buf[4] = (uint8_t)bl;
  gn_wire_doc doc;
  assert_int_equal(gn_wire_decode(buf, n, &doc), GN_ETOOBIG);
  /* one byte less fits */
  bl--;
  buf[4] = (uint8_t)bl;
  buf[3] = (uint8_t)(bl >> 8);
  assert_int_equal(gn_wire_decode(buf, n - 1, &doc), 0);
  gn_wire_doc_done(&doc);
  free(buf);
}

static void test_wire_decode_accepts_max_items_array(void **state) {
  (void)state;
  size_t n = 5 + GN_WIRE_MAX_ITEMS + 1;
  uint8_t *buf = calloc(1, n);
  uint32_t c = GN_WIRE_MAX_ITEMS;
  buf[0] = 0xdd;
  buf[1] = (uint8_t)(c >> 24);
  buf[2] = (uint8_t)(c >> 16);
  buf[3] = (uint8_t)(c >> 8);
  buf[4] = (uint8_t)c;
  gn_wire_doc doc;
  assert_int_equal(gn_wire_decode(buf, n - 1, &doc), 0);
  assert_int_equal(doc.root->via.array.size, GN_WIRE_MAX_ITEMS);
  gn_wire_doc_done(&doc);
  c++;
  buf[1] = (uint8_t)(c >> 24);
  buf[2] = (uint8_t)(c >> 16);
  buf[3] = (uint8_t)(c >> 8);
  buf[4] = (uint8_t)c;
  assert_int_equal(gn_wire_decode(buf, n, &doc), GN_ETOOBIG);
  free(buf);
}

static void test_wire_decode_bounds_total_objects(void **state) {
  (void)state;
  /* Many maximal arrays of nil: each within the per-array limit, but far more
   * objects in total than the document bound allows. */
  size_t arrays = 8, per = GN_WIRE_MAX_ITEMS;
  size_t n = 5 + arrays * (5 + per);
  uint8_t *buf = malloc(n), *p = buf;
  *p++ = 0xdd;
  *p++ = 0, *p++ = 0, *p++ = 0, *p++ = (uint8_t)arrays;
  for (size_t a = 0; a < arrays; a++) {
    *p++ = 0xdd;
    *p++ = (uint8_t)(per >> 24), *p++ = (uint8_t)(per >> 16), *p++ = (uint8_t)(per >> 8), *p++ = (uint8_t)per;
    memset(p, 0xc0, per);
    p += per;
  }
  gn_wire_doc doc;
  assert_int_equal(gn_wire_decode(buf, n, &doc), GN_ETOOBIG);
  free(buf);
}

static void test_wire_accessors_reject_wrong_types(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_wire_doc doc;
  encode_sample(&b);
  assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
  uint64_t u;
  int64_t i;
  bool bo;
  char s[16];
  uint8_t bin[4];
  const uint8_t *ref;
  size_t rlen;
  const msgpack_object_array *arr;
  const struct {
    const char *what;
    int got;
  } cases[] = {
      {"u64 of str", gn_wire_get_u64(doc.root, "s", &u)},
      {"u64 of negative", gn_wire_get_u64(doc.root, "i", &u)},
      {"i64 of too big", gn_wire_get_i64(doc.root, "u", &i) == GN_ETOOBIG ? GN_EINVAL : 0},
      {"bool of int", gn_wire_get_bool(doc.root, "u", &bo)},
      {"str of bin", gn_wire_get_str(doc.root, "bin", s, sizeof(s))},
      {"bin of str", gn_wire_get_bin_exact(doc.root, "s", bin, 5)},
      {"bin wrong len", gn_wire_get_bin_exact(doc.root, "bin", bin, 4)},
      {"bin ref of str", gn_wire_get_bin_ref(doc.root, "s", 10, &ref, &rlen)},
      {"array of map", gn_wire_get_array(doc.root, "s", 10, &arr)},
      {"missing key", gn_wire_get_u64(doc.root, "nope", &u)},
      {"not a map", gn_wire_get_u64(&doc.root->via.map.ptr[0].val, "u", &u)},
  };
  for (size_t k = 0; k < GN_ARRAY_SIZE(cases); k++)
    if (cases[k].got != GN_EINVAL)
      fail_msg("case '%s': got %d", cases[k].what, cases[k].got);
  assert_int_equal(gn_wire_get_array(doc.root, "a", 1, &arr), GN_ETOOBIG);
  gn_wire_doc_done(&doc);
  gn_buf_done(&b);
}

static void test_wire_get_rejects_duplicate_keys_and_nul_in_str(void **state) {
  (void)state;
  gn_wire_doc doc;
  uint64_t u;
  char s[8];
  const uint8_t dup[] = {0x82, 0xa1, 'k', 0x01, 0xa1, 'k', 0x02};
  assert_int_equal(gn_wire_decode(dup, sizeof(dup), &doc), 0);
  assert_int_equal(gn_wire_get_u64(doc.root, "k", &u), GN_EINVAL);
  gn_wire_doc_done(&doc);
  const uint8_t nul[] = {0x81, 0xa1, 's', 0xa3, 'a', 0, 'b'};
  assert_int_equal(gn_wire_decode(nul, sizeof(nul), &doc), 0);
  assert_int_equal(gn_wire_get_str(doc.root, "s", s, sizeof(s)), GN_EINVAL);
  gn_wire_doc_done(&doc);
}

/* Found by fuzz_wire: msgpack-c gives an empty string a NULL pointer, which
 * the key comparison once handed to memcmp (UBSan: null argument). */
static void test_wire_get_handles_empty_keys_and_values(void **state) {
  (void)state;
  gn_wire_doc doc;
  uint64_t u = 0;
  char s[8] = "x";
  const uint8_t m[] = {0x83, 0xa0, 0x01, 0xa1, 's', 0xa0, 0xa1, 'k', 0x07};
  assert_int_equal(gn_wire_decode(m, sizeof(m), &doc), 0);
  assert_int_equal(gn_wire_get_u64(doc.root, "k", &u), 0);
  assert_int_equal(u, 7);
  assert_int_equal(gn_wire_get_u64(doc.root, "", &u), 0);
  assert_int_equal(u, 1);
  assert_int_equal(gn_wire_get_str(doc.root, "s", s, sizeof(s)), 0);
  assert_string_equal(s, "");
  gn_wire_doc_done(&doc);
}

static void test_msg_type_names(void **state) {
  (void)state;
  assert_string_equal(gn_msg_type_name(GN_MSG_OFFER), "offer");
  assert_string_equal(gn_msg_type_name(GN_MSG_LEASE_REQUEST), "lease_request");
  assert_string_equal(gn_msg_type_name(GN_MSG_ATTEST_PROOF), "attest_proof");
  assert_string_equal(gn_msg_type_name(GN_MSG_DEBIT_NOTE), "debit_note");
  assert_string_equal(gn_msg_type_name(GN_MSG_DEBIT_REJECT), "debit_reject");
  assert_null(gn_msg_type_name(0));
  assert_null(gn_msg_type_name(9999));
  /* Every type the overlay, NAT traversal and relays send has a name (log
   * lines print it; one without printed "(null)"). */
  for (uint32_t t = GN_MSG_SWIM_PING; t <= GN_MSG_SWIM_NACK; t++)
    assert_non_null(gn_msg_type_name(t));
  for (uint32_t t = GN_MSG_VIEW_JOIN; t <= GN_MSG_VIEW_SHUFFLE_REPLY; t++)
    assert_non_null(gn_msg_type_name(t));
  for (uint32_t t = GN_MSG_NAT_OBSERVED; t <= GN_MSG_RELAY_CALL; t++)
    assert_non_null(gn_msg_type_name(t));
  assert_string_equal(gn_msg_type_name(GN_MSG_RELAY_CALL), "relay_call");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wire_roundtrip_scalars),
      cmocka_unit_test(test_wire_roundtrip_integer_widths),
      cmocka_unit_test(test_wire_roundtrip_string_and_bin_widths),
      cmocka_unit_test(test_wire_decode_rejects_malformed),
      cmocka_unit_test(test_wire_decode_rejects_deep_nesting),
      cmocka_unit_test(test_wire_decode_rejects_oversized_message),
      cmocka_unit_test(test_wire_decode_accepts_max_items_array),
      cmocka_unit_test(test_wire_decode_bounds_total_objects),
      cmocka_unit_test(test_wire_accessors_reject_wrong_types),
      cmocka_unit_test(test_wire_get_rejects_duplicate_keys_and_nul_in_str),
      cmocka_unit_test(test_wire_get_handles_empty_keys_and_values),
      cmocka_unit_test(test_msg_type_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
