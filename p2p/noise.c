/* The Noise protocol framework for Noise_*_25519_ChaChaPoly_BLAKE2b on
 * libsodium primitives: cipher state, symmetric state, and a handshake
 * engine driven by token tables, so every interactive and one-way pattern
 * (fundamental and deferred) shares one implementation. */
#include "noise.h"

#include <gpunet/base.h>
#include <sodium.h>

#define BLAKE2B_BLOCKLEN 128
#define SUITE_SUFFIX "_25519_ChaChaPoly_BLAKE2b"
#define NAME_PREFIX "Noise_"

/* --- cipher state ---------------------------------------------------------*/

/* The ChaChaPoly nonce of the Noise spec: 32 zero bits then the 64-bit
 * counter little-endian. */
static void nonce_bytes(uint64_t n, uint8_t out[crypto_aead_chacha20poly1305_ietf_NPUBBYTES]) {
  memset(out, 0, 4);
  for (int i = 0; i < 8; i++)
    out[4 + i] = (uint8_t)(n >> (8 * i));
}

int gn__noise_cipher_encrypt(gn_noise_cipher *c, const uint8_t *ad, size_t ad_len, const uint8_t *pt, size_t len,
                             uint8_t *out) {
  if (!c->has_key) {
    if (len)
      memmove(out, pt, len);
    return 0;
  }
  /* 2^64-1 is reserved by the spec; refusing it also stops wrap-around. */
  if (c->n == UINT64_MAX)
    return GN_ETOOBIG;
  uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
  nonce_bytes(c->n, nonce);
  unsigned long long clen = 0;
  crypto_aead_chacha20poly1305_ietf_encrypt(out, &clen, pt, len, ad, ad_len, NULL, nonce, c->k);
  c->n++;
  return 0;
}

/* The ChaCha20-Poly1305 of RFC 8439 section 2.8 (what libsodium's _ietf
 * AEAD computes) from libsodium's primitives, so that the plaintext may come
 * in two pieces: the Poly1305 key from block 0 of the key stream, the
 * plaintext XORed from block 1 on, then Poly1305 over the ciphertext, its
 * padding to 16 bytes and the two lengths (the ad's is 0). The head and the
 * start of pt share block 1, put together in a 64-byte scratch; the rest of
 * pt goes from block 2 straight into out. */
int gn__noise_cipher_encrypt_head(gn_noise_cipher *c, const uint8_t *head, size_t head_len, const uint8_t *pt,
                                  size_t len, uint8_t *out) {
  enum { BLOCK = 64 };
  if (head_len > BLOCK || len > SIZE_MAX - BLOCK)
    return GN_EINVAL;
  size_t total = head_len + len;
  if (!c->has_key) {
    memmove(out + head_len, pt, len);
    memmove(out, head, head_len);
    return 0;
  }
  if (c->n == UINT64_MAX)
    return GN_ETOOBIG;
  uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
  nonce_bytes(c->n, nonce);
  uint8_t block0[BLOCK], first[BLOCK];
  crypto_stream_chacha20_ietf(block0, sizeof(block0), nonce, c->k);
  size_t from_pt = BLOCK - head_len < len ? BLOCK - head_len : len;
  memcpy(first, head, head_len);
  memcpy(first + head_len, pt, from_pt);
  crypto_stream_chacha20_ietf_xor_ic(out, first, head_len + from_pt, nonce, 1, c->k);
  if (len > from_pt)
    crypto_stream_chacha20_ietf_xor_ic(out + BLOCK, pt + from_pt, len - from_pt, nonce, 2, c->k);
  static const uint8_t zeros[16] = {0};
  uint8_t lens[16];
  memset(lens, 0, 8); /* the ad's length */
  for (int i = 0; i < 8; i++)
    lens[8 + i] = (uint8_t)((uint64_t)total >> (8 * i));
  crypto_onetimeauth_poly1305_state st;
  crypto_onetimeauth_poly1305_init(&st, block0);
  crypto_onetimeauth_poly1305_update(&st, out, total);
  crypto_onetimeauth_poly1305_update(&st, zeros, (16 - total % 16) % 16);
  crypto_onetimeauth_poly1305_update(&st, lens, sizeof(lens));
  crypto_onetimeauth_poly1305_final(&st, out + total);
  sodium_memzero(&st, sizeof(st));
  sodium_memzero(block0, sizeof(block0));
  sodium_memzero(first, sizeof(first));
  c->n++;
  return 0;
}

int gn__noise_cipher_decrypt(gn_noise_cipher *c, const uint8_t *ad, size_t ad_len, const uint8_t *ct, size_t len,
                             uint8_t *out) {
  if (!c->has_key) {
    if (len)
      memmove(out, ct, len);
    return 0;
  }
  if (c->n == UINT64_MAX)
    return GN_ETOOBIG;
  if (len < GN_NOISE_TAGLEN)
    return GN_EPROTO;
  uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
  nonce_bytes(c->n, nonce);
  unsigned long long plen = 0;
  if (crypto_aead_chacha20poly1305_ietf_decrypt(out, &plen, NULL, ct, len, ad, ad_len, nonce, c->k) != 0)
    return GN_EPROTO;
  c->n++;
  return 0;
}

void gn__noise_cipher_wipe(gn_noise_cipher *c) {
  sodium_memzero(c, sizeof(*c));
}

static void cipher_init_key(gn_noise_cipher *c, const uint8_t *k) {
  memcpy(c->k, k, GN_NOISE_KEYLEN);
  c->n = 0;
  c->has_key = true;
}

/* --- hashing --------------------------------------------------------------*/

/* HMAC per RFC 2104 over BLAKE2b-512, as the Noise spec defines it (rather
 * than BLAKE2b's own keyed mode). */
static void hmac_blake2b(const uint8_t key[GN_NOISE_HASHLEN], const uint8_t *d1, size_t l1, const uint8_t *d2,
                         size_t l2, uint8_t out[GN_NOISE_HASHLEN]) {
  uint8_t pad[BLAKE2B_BLOCKLEN], inner[GN_NOISE_HASHLEN];
  crypto_generichash_blake2b_state st;

  memset(pad, 0x36, sizeof(pad));
  for (size_t i = 0; i < GN_NOISE_HASHLEN; i++)
    pad[i] ^= key[i];
  crypto_generichash_blake2b_init(&st, NULL, 0, GN_NOISE_HASHLEN);
  crypto_generichash_blake2b_update(&st, pad, sizeof(pad));
  if (l1)
    crypto_generichash_blake2b_update(&st, d1, l1);
  if (l2)
    crypto_generichash_blake2b_update(&st, d2, l2);
  crypto_generichash_blake2b_final(&st, inner, sizeof(inner));

  memset(pad, 0x5c, sizeof(pad));
  for (size_t i = 0; i < GN_NOISE_HASHLEN; i++)
    pad[i] ^= key[i];
  crypto_generichash_blake2b_init(&st, NULL, 0, GN_NOISE_HASHLEN);
  crypto_generichash_blake2b_update(&st, pad, sizeof(pad));
  crypto_generichash_blake2b_update(&st, inner, sizeof(inner));
  crypto_generichash_blake2b_final(&st, out, GN_NOISE_HASHLEN);

  sodium_memzero(pad, sizeof(pad));
  sodium_memzero(inner, sizeof(inner));
  sodium_memzero(&st, sizeof(st));
}

void gn__noise_hkdf(const uint8_t ck[GN_NOISE_HASHLEN], const uint8_t *ikm, size_t ikm_len, uint8_t *out1,
                    uint8_t *out2, uint8_t *out3) {
  uint8_t temp[GN_NOISE_HASHLEN], o1[GN_NOISE_HASHLEN], o2[GN_NOISE_HASHLEN];
  const uint8_t one = 1, two = 2, three = 3;
  hmac_blake2b(ck, ikm, ikm_len, NULL, 0, temp);
  hmac_blake2b(temp, &one, 1, NULL, 0, o1);
  hmac_blake2b(temp, o1, sizeof(o1), &two, 1, o2);
  if (out3)
    hmac_blake2b(temp, o2, sizeof(o2), &three, 1, out3);
  memcpy(out1, o1, sizeof(o1));
  memcpy(out2, o2, sizeof(o2));
  sodium_memzero(temp, sizeof(temp));
  sodium_memzero(o1, sizeof(o1));
  sodium_memzero(o2, sizeof(o2));
}

/* --- symmetric state ------------------------------------------------------*/

void gn__noise_symmetric_init(gn_noise_symmetric *ss, const char *protocol_name) {
  size_t n = strlen(protocol_name);
  memset(ss, 0, sizeof(*ss));
  if (n <= GN_NOISE_HASHLEN)
    memcpy(ss->h, protocol_name, n);
  else
    crypto_generichash_blake2b(ss->h, GN_NOISE_HASHLEN, (const uint8_t *)protocol_name, n, NULL, 0);
  memcpy(ss->ck, ss->h, GN_NOISE_HASHLEN);
}

void gn__noise_symmetric_mix_hash(gn_noise_symmetric *ss, const uint8_t *data, size_t len) {
  crypto_generichash_blake2b_state st;
  crypto_generichash_blake2b_init(&st, NULL, 0, GN_NOISE_HASHLEN);
  crypto_generichash_blake2b_update(&st, ss->h, GN_NOISE_HASHLEN);
  if (len)
    crypto_generichash_blake2b_update(&st, data, len);
  crypto_generichash_blake2b_final(&st, ss->h, GN_NOISE_HASHLEN);
}

void gn__noise_symmetric_mix_key(gn_noise_symmetric *ss, const uint8_t *ikm, size_t len) {
  uint8_t ck[GN_NOISE_HASHLEN], k[GN_NOISE_HASHLEN];
  gn__noise_hkdf(ss->ck, ikm, len, ck, k, NULL);
  memcpy(ss->ck, ck, sizeof(ck));
  cipher_init_key(&ss->cs, k); /* truncated to 32 bytes: HASHLEN is 64 */
  sodium_memzero(ck, sizeof(ck));
  sodium_memzero(k, sizeof(k));
}

/* out must hold len (+ TAGLEN once keyed); pt and out may alias. */
static int encrypt_and_hash(gn_noise_symmetric *ss, const uint8_t *pt, size_t len, uint8_t *out, size_t *ret_len) {
  int r = gn__noise_cipher_encrypt(&ss->cs, ss->h, GN_NOISE_HASHLEN, pt, len, out);
  if (r < 0)
    return r;
  size_t n = len + (ss->cs.has_key ? GN_NOISE_TAGLEN : 0);
  gn__noise_symmetric_mix_hash(ss, out, n);
  *ret_len = n;
  return 0;
}

static int decrypt_and_hash(gn_noise_symmetric *ss, const uint8_t *ct, size_t len, uint8_t *out) {
  /* The hash must cover the ciphertext, so take it before decrypting. */
  uint8_t h_next[GN_NOISE_HASHLEN];
  gn_noise_symmetric tmp = *ss;
  gn__noise_symmetric_mix_hash(&tmp, ct, len);
  memcpy(h_next, tmp.h, sizeof(h_next));
  sodium_memzero(&tmp, sizeof(tmp));
  int r = gn__noise_cipher_decrypt(&ss->cs, ss->h, GN_NOISE_HASHLEN, ct, len, out);
  if (r < 0)
    return r;
  memcpy(ss->h, h_next, sizeof(h_next));
  return 0;
}

/* --- patterns -------------------------------------------------------------*/

enum { T_END = 0, T_E, T_S, T_EE, T_ES, T_SE, T_SS };

#define MAX_MSGS 4
#define MAX_TOKENS 6

struct gn_noise_pattern {
  const char *name;
  bool pre_i;                           /* "-> s": the responder knows the initiator's static */
  bool pre_r;                           /* "<- s": the initiator knows the responder's static */
  uint8_t tokens[MAX_MSGS][MAX_TOKENS]; /* messages alternate, initiator first */
};

/* Section 7 of the Noise spec: one-way, fundamental interactive, and
 * deferred patterns. */
static const gn_noise_pattern patterns[] = {
    {"N", false, true, {{T_E, T_ES}}},
    {"K", true, true, {{T_E, T_ES, T_SS}}},
    {"X", false, true, {{T_E, T_ES, T_S, T_SS}}},
    {"NN", false, false, {{T_E}, {T_E, T_EE}}},
    {"NK", false, true, {{T_E, T_ES}, {T_E, T_EE}}},
    {"NX", false, false, {{T_E}, {T_E, T_EE, T_S, T_ES}}},
    {"XN", false, false, {{T_E}, {T_E, T_EE}, {T_S, T_SE}}},
    {"XK", false, true, {{T_E, T_ES}, {T_E, T_EE}, {T_S, T_SE}}},
    {"XX", false, false, {{T_E}, {T_E, T_EE, T_S, T_ES}, {T_S, T_SE}}},
    {"KN", true, false, {{T_E}, {T_E, T_EE, T_SE}}},
    {"KK", true, true, {{T_E, T_ES, T_SS}, {T_E, T_EE, T_SE}}},
    {"KX", true, false, {{T_E}, {T_E, T_EE, T_SE, T_S, T_ES}}},
    {"IN", false, false, {{T_E, T_S}, {T_E, T_EE, T_SE}}},
    {"IK", false, true, {{T_E, T_ES, T_S, T_SS}, {T_E, T_EE, T_SE}}},
    {"IX", false, false, {{T_E, T_S}, {T_E, T_EE, T_SE, T_S, T_ES}}},
    {"NK1", false, true, {{T_E}, {T_E, T_EE, T_ES}}},
    {"NX1", false, false, {{T_E}, {T_E, T_EE, T_S}, {T_ES}}},
    {"X1N", false, false, {{T_E}, {T_E, T_EE}, {T_S}, {T_SE}}},
    {"X1K", false, true, {{T_E, T_ES}, {T_E, T_EE}, {T_S}, {T_SE}}},
    {"XK1", false, true, {{T_E}, {T_E, T_EE, T_ES}, {T_S, T_SE}}},
    {"X1K1", false, true, {{T_E}, {T_E, T_EE, T_ES}, {T_S}, {T_SE}}},
    {"X1X", false, false, {{T_E}, {T_E, T_EE, T_S, T_ES}, {T_S}, {T_SE}}},
    {"XX1", false, false, {{T_E}, {T_E, T_EE, T_S}, {T_ES, T_S, T_SE}}},
    {"X1X1", false, false, {{T_E}, {T_E, T_EE, T_S}, {T_ES, T_S}, {T_SE}}},
    {"K1N", true, false, {{T_E}, {T_E, T_EE}, {T_SE}}},
    {"K1K", true, true, {{T_E, T_ES}, {T_E, T_EE}, {T_SE}}},
    {"KK1", true, true, {{T_E}, {T_E, T_EE, T_SE, T_ES}}},
    {"K1K1", true, true, {{T_E}, {T_E, T_EE, T_ES}, {T_SE}}},
    {"K1X", true, false, {{T_E}, {T_E, T_EE, T_S, T_ES}, {T_SE}}},
    {"KX1", true, false, {{T_E}, {T_E, T_EE, T_SE, T_S}, {T_ES}}},
    {"K1X1", true, false, {{T_E}, {T_E, T_EE, T_S}, {T_SE, T_ES}}},
    {"I1N", false, false, {{T_E, T_S}, {T_E, T_EE}, {T_SE}}},
    {"I1K", false, true, {{T_E, T_ES, T_S}, {T_E, T_EE}, {T_SE}}},
    {"IK1", false, true, {{T_E, T_S}, {T_E, T_EE, T_SE, T_ES}}},
    {"I1K1", false, true, {{T_E, T_S}, {T_E, T_EE, T_ES}, {T_SE}}},
    {"I1X", false, false, {{T_E, T_S}, {T_E, T_EE, T_S, T_ES}, {T_SE}}},
    {"IX1", false, false, {{T_E, T_S}, {T_E, T_EE, T_SE, T_S}, {T_ES}}},
    {"I1X1", false, false, {{T_E, T_S}, {T_E, T_EE, T_S}, {T_SE, T_ES}}},
};

const gn_noise_pattern *gn__noise_pattern_find(const char *name) {
  for (size_t i = 0; i < GN_ARRAY_SIZE(patterns); i++)
    if (strcmp(patterns[i].name, name) == 0)
      return &patterns[i];
  return NULL;
}

static size_t pattern_msgs(const gn_noise_pattern *p) {
  size_t n = 0;
  while (n < MAX_MSGS && p->tokens[n][0] != T_END)
    n++;
  return n;
}

/* Whether the given side ever sends its static key (or pre-shares it). */
static bool pattern_side_has_static(const gn_noise_pattern *p, bool initiator) {
  if (initiator ? p->pre_i : p->pre_r)
    return true;
  for (size_t m = initiator ? 0 : 1; m < MAX_MSGS; m += 2)
    for (size_t t = 0; t < MAX_TOKENS && p->tokens[m][t]; t++)
      if (p->tokens[m][t] == T_S)
        return true;
  /* A side also needs its static for DH tokens naming it. */
  for (size_t m = 0; m < MAX_MSGS; m++)
    for (size_t t = 0; t < MAX_TOKENS && p->tokens[m][t]; t++) {
      uint8_t k = p->tokens[m][t];
      if (k == T_SS || (initiator && k == T_SE) || (!initiator && k == T_ES))
        return true;
    }
  return false;
}

/* --- handshake state ------------------------------------------------------*/

int gn__noise_handshake_init(gn_noise_handshake *hs, const char *protocol_name, bool initiator, const uint8_t *prologue,
                             size_t prologue_len, const uint8_t *s_priv, const uint8_t *rs, gn_noise_rng rng,
                             void *rng_ud) {
  char pat_name[8];
  size_t n = strlen(protocol_name), pl = strlen(NAME_PREFIX), sl = strlen(SUITE_SUFFIX);

  if (sodium_init() < 0)
    return GN_EIO;
  if (n <= pl + sl || memcmp(protocol_name, NAME_PREFIX, pl) != 0 ||
      strcmp(protocol_name + n - sl, SUITE_SUFFIX) != 0 || n - pl - sl >= sizeof(pat_name))
    return GN_EUNSUPPORTED;
  memcpy(pat_name, protocol_name + pl, n - pl - sl);
  pat_name[n - pl - sl] = '\0';
  const gn_noise_pattern *pat = gn__noise_pattern_find(pat_name);
  if (!pat)
    return GN_EUNSUPPORTED;
  if (pattern_side_has_static(pat, initiator) && !s_priv)
    return GN_EINVAL;
  if ((initiator ? pat->pre_r : pat->pre_i) && !rs)
    return GN_EINVAL;

  memset(hs, 0, sizeof(*hs));
  hs->pat = pat;
  hs->initiator = initiator;
  hs->rng = rng;
  hs->rng_ud = rng_ud;
  if (s_priv) {
    memcpy(hs->s_priv, s_priv, GN_NOISE_DHLEN);
    crypto_scalarmult_base(hs->s_pub, hs->s_priv);
    hs->has_s = true;
  }
  if (rs) {
    memcpy(hs->rs, rs, GN_NOISE_DHLEN);
    hs->has_rs = true;
  }
  gn__noise_symmetric_init(&hs->ss, protocol_name);
  gn__noise_symmetric_mix_hash(&hs->ss, prologue, prologue_len);
  /* Pre-messages: the initiator's first, then the responder's. */
  if (pat->pre_i)
    gn__noise_symmetric_mix_hash(&hs->ss, initiator ? hs->s_pub : hs->rs, GN_NOISE_DHLEN);
  if (pat->pre_r)
    gn__noise_symmetric_mix_hash(&hs->ss, initiator ? hs->rs : hs->s_pub, GN_NOISE_DHLEN);
  return 0;
}

void gn__noise_handshake_set_ephemeral(gn_noise_handshake *hs, const uint8_t e_priv[GN_NOISE_DHLEN]) {
  memcpy(hs->e_priv, e_priv, GN_NOISE_DHLEN);
  hs->e_injected = true;
}

bool gn__noise_handshake_finished(const gn_noise_handshake *hs) {
  return hs->pat && hs->msg_index >= pattern_msgs(hs->pat);
}

bool gn__noise_handshake_my_turn(const gn_noise_handshake *hs) {
  return hs->pat && !hs->failed && !gn__noise_handshake_finished(hs) && ((hs->msg_index % 2 == 0) == hs->initiator);
}

static int dh_mix(gn_noise_handshake *hs, const uint8_t *priv, bool have_priv, const uint8_t *pub, bool have_pub) {
  uint8_t shared[GN_NOISE_DHLEN];
  if (!have_priv || !have_pub)
    return GN_EPROTO;
  /* libsodium refuses low-order points (an all-zero result): a peer that
   * sends one is not trying to agree on a key. */
  if (crypto_scalarmult(shared, priv, pub) != 0)
    return GN_EPROTO;
  gn__noise_symmetric_mix_key(&hs->ss, shared, sizeof(shared));
  sodium_memzero(shared, sizeof(shared));
  return 0;
}

static int dh_token(gn_noise_handshake *hs, uint8_t tok) {
  bool i = hs->initiator;
  switch (tok) {
  case T_EE:
    return dh_mix(hs, hs->e_priv, hs->has_e, hs->re, hs->has_re);
  case T_SS:
    return dh_mix(hs, hs->s_priv, hs->has_s, hs->rs, hs->has_rs);
  case T_ES:
    return i ? dh_mix(hs, hs->e_priv, hs->has_e, hs->rs, hs->has_rs)
             : dh_mix(hs, hs->s_priv, hs->has_s, hs->re, hs->has_re);
  case T_SE:
    return i ? dh_mix(hs, hs->s_priv, hs->has_s, hs->re, hs->has_re)
             : dh_mix(hs, hs->e_priv, hs->has_e, hs->rs, hs->has_rs);
  default:
    return GN_EINVAL;
  }
}

int gn__noise_handshake_write(gn_noise_handshake *hs, const uint8_t *payload, size_t payload_len, uint8_t *out,
                              size_t cap, size_t *ret_len) {
  size_t pos = 0, n;
  int r;
  if (!gn__noise_handshake_my_turn(hs))
    return GN_ESTATE;
  const uint8_t *toks = hs->pat->tokens[hs->msg_index];
  for (size_t t = 0; t < MAX_TOKENS && toks[t]; t++) {
    switch (toks[t]) {
    case T_E:
      if (hs->has_e || cap - pos < GN_NOISE_DHLEN) {
        r = hs->has_e ? GN_EPROTO : GN_ETOOBIG;
        goto fail;
      }
      if (!hs->e_injected) {
        if (hs->rng)
          hs->rng(hs->rng_ud, hs->e_priv, GN_NOISE_DHLEN);
        else
          randombytes_buf(hs->e_priv, GN_NOISE_DHLEN);
      }
      crypto_scalarmult_base(hs->e_pub, hs->e_priv);
      hs->has_e = true;
      memcpy(out + pos, hs->e_pub, GN_NOISE_DHLEN);
      pos += GN_NOISE_DHLEN;
      gn__noise_symmetric_mix_hash(&hs->ss, hs->e_pub, GN_NOISE_DHLEN);
      break;
    case T_S:
      if (!hs->has_s || cap - pos < GN_NOISE_DHLEN + GN_NOISE_TAGLEN) {
        r = hs->has_s ? GN_ETOOBIG : GN_EPROTO;
        goto fail;
      }
      if ((r = encrypt_and_hash(&hs->ss, hs->s_pub, GN_NOISE_DHLEN, out + pos, &n)) < 0)
        goto fail;
      pos += n;
      break;
    default:
      if ((r = dh_token(hs, toks[t])) < 0)
        goto fail;
      break;
    }
  }
  size_t need = pos + (hs->ss.cs.has_key ? GN_NOISE_TAGLEN : 0);
  if (payload_len > GN_NOISE_MAX_MSG || need + payload_len > cap || need + payload_len > GN_NOISE_MAX_MSG) {
    r = GN_ETOOBIG;
    goto fail;
  }
  if ((r = encrypt_and_hash(&hs->ss, payload, payload_len, out + pos, &n)) < 0)
    goto fail;
  pos += n;
  hs->msg_index++;
  *ret_len = pos;
  return 0;
fail:
  hs->failed = true;
  return r;
}

int gn__noise_handshake_read(gn_noise_handshake *hs, const uint8_t *msg, size_t len, uint8_t *out, size_t cap,
                             size_t *ret_len) {
  size_t pos = 0;
  int r;
  if (hs->failed || !hs->pat || gn__noise_handshake_finished(hs) || gn__noise_handshake_my_turn(hs))
    return GN_ESTATE;
  if (len > GN_NOISE_MAX_MSG) {
    r = GN_ETOOBIG;
    goto fail;
  }
  const uint8_t *toks = hs->pat->tokens[hs->msg_index];
  for (size_t t = 0; t < MAX_TOKENS && toks[t]; t++) {
    switch (toks[t]) {
    case T_E:
      if (hs->has_re || len - pos < GN_NOISE_DHLEN) {
        r = GN_EPROTO;
        goto fail;
      }
      memcpy(hs->re, msg + pos, GN_NOISE_DHLEN);
      hs->has_re = true;
      pos += GN_NOISE_DHLEN;
      gn__noise_symmetric_mix_hash(&hs->ss, hs->re, GN_NOISE_DHLEN);
      break;
    case T_S: {
      size_t n = GN_NOISE_DHLEN + (hs->ss.cs.has_key ? GN_NOISE_TAGLEN : 0);
      if (hs->has_rs || len - pos < n) {
        r = GN_EPROTO;
        goto fail;
      }
      if ((r = decrypt_and_hash(&hs->ss, msg + pos, n, hs->rs)) < 0)
        goto fail;
      hs->has_rs = true;
      pos += n;
      break;
    }
    default:
      if ((r = dh_token(hs, toks[t])) < 0)
        goto fail;
      break;
    }
  }
  size_t clen = len - pos;
  size_t tag = hs->ss.cs.has_key ? GN_NOISE_TAGLEN : 0;
  if (clen < tag || clen - tag > cap) {
    r = clen < tag ? GN_EPROTO : GN_ETOOBIG;
    goto fail;
  }
  /* Decrypt into a scratch copy: out may be smaller than the ciphertext. */
  uint8_t *scratch = malloc(clen ? clen : 1);
  if (!scratch) {
    r = GN_ENOMEM;
    goto fail;
  }
  r = decrypt_and_hash(&hs->ss, msg + pos, clen, scratch);
  if (r == 0 && clen - tag)
    memcpy(out, scratch, clen - tag);
  sodium_memzero(scratch, clen ? clen : 1);
  free(scratch);
  if (r < 0)
    goto fail;
  hs->msg_index++;
  *ret_len = clen - tag;
  return 0;
fail:
  hs->failed = true;
  return r;
}

int gn__noise_handshake_split(gn_noise_handshake *hs, gn_noise_cipher *ret_send, gn_noise_cipher *ret_recv,
                              uint8_t ret_hash[GN_NOISE_HASHLEN]) {
  uint8_t k1[GN_NOISE_HASHLEN], k2[GN_NOISE_HASHLEN];
  if (hs->failed || !gn__noise_handshake_finished(hs))
    return GN_ESTATE;
  gn__noise_hkdf(hs->ss.ck, NULL, 0, k1, k2, NULL);
  gn_noise_cipher c1 = {0}, c2 = {0};
  cipher_init_key(&c1, k1);
  cipher_init_key(&c2, k2);
  if (ret_hash)
    memcpy(ret_hash, hs->ss.h, GN_NOISE_HASHLEN);
  *ret_send = hs->initiator ? c1 : c2;
  *ret_recv = hs->initiator ? c2 : c1;
  sodium_memzero(k1, sizeof(k1));
  sodium_memzero(k2, sizeof(k2));
  sodium_memzero(&c1, sizeof(c1));
  sodium_memzero(&c2, sizeof(c2));
  gn__noise_handshake_wipe(hs);
  return 0;
}

void gn__noise_handshake_wipe(gn_noise_handshake *hs) {
  if (hs)
    sodium_memzero(hs, sizeof(*hs));
}
