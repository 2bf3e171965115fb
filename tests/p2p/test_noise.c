/* Tests for the Noise engine: every cacophony vector for the
 * 25519_ChaChaPoly_BLAKE2b suite, byte for byte, plus failure behaviour. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/base.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>

#include "noise.h"

#define MAX_BYTES 70000

typedef struct hexbuf {
  uint8_t b[MAX_BYTES];
  size_t len;
  bool present;
} hexbuf;

static void hex_field(json_t *obj, const char *key, hexbuf *out) {
  json_t *v = json_object_get(obj, key);
  out->present = false;
  out->len = 0;
  if (!v)
    return;
  assert_true(json_is_string(v));
  const char *s = json_string_value(v);
  size_t n = strlen(s);
  assert_true(n % 2 == 0 && n / 2 <= MAX_BYTES);
  assert_int_equal(sodium_hex2bin(out->b, MAX_BYTES, s, n, NULL, &out->len, NULL), 0);
  out->present = true;
}

static json_t *load_vectors(void) {
  /* The vectors are a fixed copy in the repository (tests/vectors/noise/,
   * see its README.md for their origin), so a fresh clone tests itself. */
  const char *dir = getenv("GN_VECTORS_DIR");
  char path[1024];
  if (!dir)
    fail_msg("GN_VECTORS_DIR is not set: cannot find the Noise vectors (run the test through ctest)");
  snprintf(path, sizeof(path), "%s/noise/cacophony_25519_ChaChaPoly_BLAKE2b.json", dir);
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  if (!root)
    fail_msg("cannot load %s: %s", path, err.text);
  return root;
}

typedef struct count {
  char pattern[16];
  int ran;
} count;

/* Runs one vector; returns false (without failing) if the pattern is not
 * one this engine knows. */
static bool run_vector(json_t *vec, char *ret_pattern, size_t cap) {
  static hexbuf is, irs, ie, ip, rsk, rrs, re, rp, hh, payload, ct;
  static uint8_t out[MAX_BYTES], got[MAX_BYTES];
  const char *name = json_string_value(json_object_get(vec, "protocol_name"));
  assert_non_null(name);
  const char *suffix = "_25519_ChaChaPoly_BLAKE2b";
  assert_true(strncmp(name, "Noise_", 6) == 0);
  size_t plen = strlen(name) - 6 - strlen(suffix);
  assert_true(plen < cap);
  memcpy(ret_pattern, name + 6, plen);
  ret_pattern[plen] = '\0';
  if (!gn__noise_pattern_find(ret_pattern))
    return false;
  /* PSK vectors would need psk tokens, which nothing here implements. */
  assert_null(json_object_get(vec, "init_psks"));

  hex_field(vec, "init_static", &is);
  hex_field(vec, "init_remote_static", &irs);
  hex_field(vec, "init_ephemeral", &ie);
  hex_field(vec, "init_prologue", &ip);
  hex_field(vec, "resp_static", &rsk);
  hex_field(vec, "resp_remote_static", &rrs);
  hex_field(vec, "resp_ephemeral", &re);
  hex_field(vec, "resp_prologue", &rp);
  hex_field(vec, "handshake_hash", &hh);

  gn_noise_handshake hi, hr;
  assert_int_equal(gn__noise_handshake_init(&hi, name, true, ip.b, ip.len, is.present ? is.b : NULL,
                                            irs.present ? irs.b : NULL, NULL, NULL),
                   0);
  assert_int_equal(gn__noise_handshake_init(&hr, name, false, rp.b, rp.len, rsk.present ? rsk.b : NULL,
                                            rrs.present ? rrs.b : NULL, NULL, NULL),
                   0);
  if (ie.present)
    gn__noise_handshake_set_ephemeral(&hi, ie.b);
  if (re.present)
    gn__noise_handshake_set_ephemeral(&hr, re.b);

  json_t *msgs = json_object_get(vec, "messages");
  assert_true(json_is_array(msgs));
  gn_noise_cipher is_send = {0}, is_recv = {0}, rs_send = {0}, rs_recv = {0};
  bool split = false, one_way = false;
  size_t hs_msgs = 0;
  for (size_t i = 0; i < json_array_size(msgs); i++) {
    json_t *m = json_array_get(msgs, i);
    hex_field(m, "payload", &payload);
    hex_field(m, "ciphertext", &ct);
    size_t n = 0, pn = 0;
    if (!split) {
      bool init_sends = gn__noise_handshake_my_turn(&hi);
      gn_noise_handshake *w = init_sends ? &hi : &hr, *r = init_sends ? &hr : &hi;
      assert_true(gn__noise_handshake_my_turn(w));
      assert_int_equal(gn__noise_handshake_write(w, payload.b, payload.len, out, sizeof(out), &n), 0);
      if (n != ct.len || memcmp(out, ct.b, n) != 0)
        fail_msg("%s: handshake message %zu differs", name, i);
      assert_int_equal(gn__noise_handshake_read(r, out, n, got, sizeof(got), &pn), 0);
      assert_int_equal(pn, payload.len);
      assert_memory_equal(got, payload.b, pn);
      hs_msgs++;
      if (gn__noise_handshake_finished(&hi)) {
        assert_true(gn__noise_handshake_finished(&hr));
        uint8_t h1[GN_NOISE_HASHLEN], h2[GN_NOISE_HASHLEN];
        one_way = hs_msgs == 1;
        assert_int_equal(gn__noise_handshake_split(&hi, &is_send, &is_recv, h1), 0);
        assert_int_equal(gn__noise_handshake_split(&hr, &rs_send, &rs_recv, h2), 0);
        assert_memory_equal(h1, h2, sizeof(h1));
        if (hh.present) {
          assert_int_equal(hh.len, GN_NOISE_HASHLEN);
          assert_memory_equal(h1, hh.b, hh.len);
        }
        split = true;
      }
      continue;
    }
    /* Transport messages alternate on from where the handshake stopped;
     * one-way patterns only ever send from the initiator. */
    bool init_sends = one_way || (i % 2 == 0);
    gn_noise_cipher *sc = init_sends ? &is_send : &rs_send, *rc = init_sends ? &rs_recv : &is_recv;
    assert_int_equal(gn__noise_cipher_encrypt(sc, NULL, 0, payload.b, payload.len, out), 0);
    n = payload.len + GN_NOISE_TAGLEN;
    if (n != ct.len || memcmp(out, ct.b, n) != 0)
      fail_msg("%s: transport message %zu differs", name, i);
    assert_int_equal(gn__noise_cipher_decrypt(rc, NULL, 0, out, n, got), 0);
    assert_memory_equal(got, payload.b, payload.len);
  }
  assert_true(split);
  return true;
}

static void test_noise_cacophony_vectors(void **state) {
  (void)state;
  json_t *root = load_vectors();
  json_t *vecs = json_object_get(root, "vectors");
  assert_true(json_is_array(vecs));
  count counts[64];
  size_t ncounts = 0;
  int ran = 0, skipped = 0, xx = 0;
  for (size_t i = 0; i < json_array_size(vecs); i++) {
    char pat[16];
    json_t *v = json_array_get(vecs, i);
    if (!run_vector(v, pat, sizeof(pat))) {
      printf("# skipped vector %s (pattern unsupported here)\n", pat);
      skipped++;
      continue;
    }
    ran++;
    if (strcmp(pat, "XX") == 0)
      xx++;
    size_t k;
    for (k = 0; k < ncounts && strcmp(counts[k].pattern, pat) != 0; k++)
      ;
    if (k == ncounts) {
      assert_true(ncounts < GN_ARRAY_SIZE(counts));
      snprintf(counts[ncounts].pattern, sizeof(counts[ncounts].pattern), "%s", pat);
      counts[ncounts++].ran = 0;
    }
    counts[k].ran++;
  }
  for (size_t k = 0; k < ncounts; k++)
    printf("# %-5s %d vector(s) ran\n", counts[k].pattern, counts[k].ran);
  printf("# total: %d ran, %d skipped\n", ran, skipped);
  assert_true(xx >= 1);
  /* Every fundamental pattern is in the file and must have run. */
  const char *fundamental[] = {"N", "K", "X", "NN", "NK", "NX", "XN", "XK", "XX", "KN", "KK", "KX", "IN", "IK", "IX"};
  for (size_t f = 0; f < GN_ARRAY_SIZE(fundamental); f++) {
    size_t k;
    for (k = 0; k < ncounts && strcmp(counts[k].pattern, fundamental[f]) != 0; k++)
      ;
    if (k == ncounts)
      fail_msg("no vector ran for pattern %s", fundamental[f]);
  }
  json_decref(root);
}

static void xx_pair(gn_noise_handshake *hi, gn_noise_handshake *hr) {
  uint8_t si[32], sr[32];
  randombytes_buf(si, sizeof(si));
  randombytes_buf(sr, sizeof(sr));
  assert_int_equal(
      gn__noise_handshake_init(hi, "Noise_XX_25519_ChaChaPoly_BLAKE2b", true, NULL, 0, si, NULL, NULL, NULL), 0);
  assert_int_equal(
      gn__noise_handshake_init(hr, "Noise_XX_25519_ChaChaPoly_BLAKE2b", false, NULL, 0, sr, NULL, NULL, NULL), 0);
}

static void test_noise_handshake_fails_on_tampered_message(void **state) {
  (void)state;
  gn_noise_handshake hi, hr;
  uint8_t m[256], p[256];
  size_t n, pn;
  xx_pair(&hi, &hr);
  assert_int_equal(gn__noise_handshake_write(&hi, NULL, 0, m, sizeof(m), &n), 0);
  assert_int_equal(gn__noise_handshake_read(&hr, m, n, p, sizeof(p), &pn), 0);
  assert_int_equal(gn__noise_handshake_write(&hr, (const uint8_t *)"hi", 2, m, sizeof(m), &n), 0);
  m[40] ^= 1; /* inside the encrypted static key */
  assert_int_equal(gn__noise_handshake_read(&hi, m, n, p, sizeof(p), &pn), GN_EPROTO);
  /* A failed handshake stays failed. */
  m[40] ^= 1;
  assert_int_equal(gn__noise_handshake_read(&hi, m, n, p, sizeof(p), &pn), GN_ESTATE);
  gn__noise_handshake_wipe(&hi);
  gn__noise_handshake_wipe(&hr);
}

static void test_noise_handshake_rejects_truncated_and_out_of_turn(void **state) {
  (void)state;
  gn_noise_handshake hi, hr;
  uint8_t m[256], p[256];
  size_t n, pn;
  xx_pair(&hi, &hr);
  assert_int_equal(gn__noise_handshake_read(&hi, m, 32, p, sizeof(p), &pn), GN_ESTATE);
  assert_int_equal(gn__noise_handshake_write(&hr, NULL, 0, m, sizeof(m), &n), GN_ESTATE);
  assert_int_equal(gn__noise_handshake_write(&hi, NULL, 0, m, sizeof(m), &n), 0);
  assert_int_equal(gn__noise_handshake_read(&hr, m, 31, p, sizeof(p), &pn), GN_EPROTO);
  gn__noise_handshake_wipe(&hi);
  gn__noise_handshake_wipe(&hr);
}

static void test_noise_rejects_low_order_ephemeral(void **state) {
  (void)state;
  gn_noise_handshake hi, hr;
  uint8_t m[256] = {0}, p[256];
  size_t n, pn;
  xx_pair(&hi, &hr);
  assert_int_equal(gn__noise_handshake_write(&hi, NULL, 0, m, sizeof(m), &n), 0);
  assert_int_equal(gn__noise_handshake_read(&hr, m, n, p, sizeof(p), &pn), 0);
  assert_int_equal(gn__noise_handshake_write(&hr, NULL, 0, m, sizeof(m), &n), 0);
  memset(m, 0, 32); /* the zero point: ee would be all zeros */
  assert_int_equal(gn__noise_handshake_read(&hi, m, n, p, sizeof(p), &pn), GN_EPROTO);
  gn__noise_handshake_wipe(&hi);
  gn__noise_handshake_wipe(&hr);
}

static void test_noise_unknown_suite_unsupported(void **state) {
  (void)state;
  gn_noise_handshake h;
  uint8_t s[32] = {1};
  assert_int_equal(gn__noise_handshake_init(&h, "Noise_XX_448_ChaChaPoly_BLAKE2b", true, NULL, 0, s, NULL, NULL, NULL),
                   GN_EUNSUPPORTED);
  assert_int_equal(
      gn__noise_handshake_init(&h, "Noise_ZZ_25519_ChaChaPoly_BLAKE2b", true, NULL, 0, s, NULL, NULL, NULL),
      GN_EUNSUPPORTED);
  /* XX needs a static key on both sides. */
  assert_int_equal(
      gn__noise_handshake_init(&h, "Noise_XX_25519_ChaChaPoly_BLAKE2b", true, NULL, 0, NULL, NULL, NULL, NULL),
      GN_EINVAL);
}

static void test_noise_cipher_nonce_encoding_and_replay(void **state) {
  (void)state;
  gn_noise_cipher a = {.has_key = true}, b = {.has_key = true};
  memset(a.k, 7, 32);
  memset(b.k, 7, 32);
  uint8_t c1[32], c2[32], p[16];
  assert_int_equal(gn__noise_cipher_encrypt(&a, NULL, 0, (const uint8_t *)"abc", 3, c1), 0);
  assert_int_equal(gn__noise_cipher_encrypt(&a, NULL, 0, (const uint8_t *)"abc", 3, c2), 0);
  assert_memory_not_equal(c1, c2, 19);
  /* Same key and nonce as libsodium's raw AEAD with 4 zero bytes + LE 1. */
  uint8_t nonce[12] = {0, 0, 0, 0, 1}, ref[19];
  unsigned long long rl;
  crypto_aead_chacha20poly1305_ietf_encrypt(ref, &rl, (const uint8_t *)"abc", 3, NULL, 0, NULL, nonce, a.k);
  assert_memory_equal(ref, c2, 19);
  assert_int_equal(gn__noise_cipher_decrypt(&b, NULL, 0, c1, 19, p), 0);
  /* Replaying c1 fails: b expects nonce 1 now. */
  assert_int_equal(gn__noise_cipher_decrypt(&b, NULL, 0, c1, 19, p), GN_EPROTO);
  assert_int_equal(gn__noise_cipher_decrypt(&b, NULL, 0, c2, 19, p), 0);
  a.n = UINT64_MAX;
  assert_int_equal(gn__noise_cipher_encrypt(&a, NULL, 0, (const uint8_t *)"abc", 3, c1), GN_ETOOBIG);
}

/* Sealing a head and a body given apart gives, byte for byte, libsodium's
 * AEAD over head || body at the same nonce, for lengths on each side of the
 * 64-byte ChaCha20 block and Poly1305's 16-byte padding; the nonce advances
 * the same, and the last nonce is refused as by the plain encrypt. */
static void test_noise_cipher_encrypt_head_matches_joined_aead(void **state) {
  (void)state;
  static const size_t heads[] = {0, 1, 4, 15, 16, 63, 64};
  static const size_t bodies[] = {0, 1, 11, 12, 44, 59, 60, 61, 123, 124, 125, 1000, GN_NOISE_MAX_PAYLOAD - 4};
  size_t cap = GN_NOISE_MAX_MSG + 64 + GN_NOISE_TAGLEN;
  uint8_t *pt = malloc(cap), *joined = malloc(cap), *got = malloc(cap), *want = malloc(cap);
  uint8_t head[64];
  assert_true(pt && joined && got && want);
  for (size_t i = 0; i < cap; i++)
    pt[i] = (uint8_t)(i * 7 + 3);
  for (size_t i = 0; i < sizeof(head); i++)
    head[i] = (uint8_t)(0xa0 + i);
  gn_noise_cipher c = {.has_key = true, .n = 5};
  memset(c.k, 0x42, sizeof(c.k));
  for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
    for (size_t b = 0; b < sizeof(bodies) / sizeof(bodies[0]); b++) {
      size_t hl = heads[h], bl = bodies[b], n = hl + bl;
      uint8_t nonce[12] = {0};
      for (int k = 0; k < 8; k++)
        nonce[4 + k] = (uint8_t)(c.n >> (8 * k));
      memcpy(joined, head, hl);
      memcpy(joined + hl, pt, bl);
      unsigned long long wl;
      crypto_aead_chacha20poly1305_ietf_encrypt(want, &wl, joined, n, NULL, 0, NULL, nonce, c.k);
      uint64_t before = c.n;
      assert_int_equal(gn__noise_cipher_encrypt_head(&c, head, hl, pt, bl, got), 0);
      assert_int_equal(c.n, before + 1);
      assert_int_equal(wl, n + GN_NOISE_TAGLEN);
      if (memcmp(got, want, wl) != 0)
        fail_msg("head %zu body %zu: differs from the joined AEAD", hl, bl);
    }
  }
  c.n = UINT64_MAX;
  assert_int_equal(gn__noise_cipher_encrypt_head(&c, head, 4, pt, 10, got), GN_ETOOBIG);
  assert_int_equal(gn__noise_cipher_encrypt_head(&c, head, 65, pt, 10, got), GN_EINVAL);
  free(pt);
  free(joined);
  free(got);
  free(want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_noise_cacophony_vectors),
      cmocka_unit_test(test_noise_handshake_fails_on_tampered_message),
      cmocka_unit_test(test_noise_handshake_rejects_truncated_and_out_of_turn),
      cmocka_unit_test(test_noise_rejects_low_order_ephemeral),
      cmocka_unit_test(test_noise_unknown_suite_unsupported),
      cmocka_unit_test(test_noise_cipher_nonce_encoding_and_replay),
      cmocka_unit_test(test_noise_cipher_encrypt_head_matches_joined_aead),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
