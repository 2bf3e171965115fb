/* Private to p2p: the Noise protocol framework (revision 34) for the one
 * suite gpunet speaks, 25519_ChaChaPoly_BLAKE2b, with a generic handshake
 * pattern engine. I/O-free: callers hand in and take out whole messages. */
#ifndef GPUNET_P2P_NOISE_H
#define GPUNET_P2P_NOISE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_NOISE_DHLEN 32
#define GN_NOISE_HASHLEN 64
#define GN_NOISE_KEYLEN 32
#define GN_NOISE_TAGLEN 16
#define GN_NOISE_MAX_MSG 65535
#define GN_NOISE_MAX_PAYLOAD (GN_NOISE_MAX_MSG - GN_NOISE_TAGLEN)

/* Randomness is injected so tests and simulators are deterministic; NULL
 * means libsodium's randombytes_buf. */
typedef void (*gn_noise_rng)(void *ud, uint8_t *out, size_t len);

typedef struct gn_noise_cipher {
  uint8_t k[GN_NOISE_KEYLEN];
  uint64_t n;
  bool has_key;
} gn_noise_cipher;

/* EncryptWithAd: out gets len + GN_NOISE_TAGLEN bytes (just len without a
 * key). GN_ETOOBIG when the nonce space is exhausted. */
int gn__noise_cipher_encrypt(gn_noise_cipher *c, const uint8_t *ad, size_t ad_len, const uint8_t *pt, size_t len,
                             uint8_t *out);
/* EncryptWithAd with an empty ad of head || pt without joining them first
 * (head_len at most 64, GN_EINVAL past it): out gets head_len + len +
 * GN_NOISE_TAGLEN bytes, the same as gn__noise_cipher_encrypt of the joined
 * bytes. out must not overlap pt. Saves a copy of a large pt behind a small
 * header. */
int gn__noise_cipher_encrypt_head(gn_noise_cipher *c, const uint8_t *head, size_t head_len, const uint8_t *pt,
                                  size_t len, uint8_t *out);
/* DecryptWithAd: out gets len - GN_NOISE_TAGLEN bytes; GN_EPROTO on a bad tag
 * (the nonce then does not advance). */
int gn__noise_cipher_decrypt(gn_noise_cipher *c, const uint8_t *ad, size_t ad_len, const uint8_t *ct, size_t len,
                             uint8_t *out);
void gn__noise_cipher_wipe(gn_noise_cipher *c);

typedef struct gn_noise_symmetric {
  gn_noise_cipher cs;
  uint8_t ck[GN_NOISE_HASHLEN];
  uint8_t h[GN_NOISE_HASHLEN];
} gn_noise_symmetric;

void gn__noise_symmetric_init(gn_noise_symmetric *ss, const char *protocol_name);
void gn__noise_symmetric_mix_hash(gn_noise_symmetric *ss, const uint8_t *data, size_t len);
void gn__noise_symmetric_mix_key(gn_noise_symmetric *ss, const uint8_t *ikm, size_t len);
/* HMAC-BLAKE2b-based HKDF of the Noise spec, 2 or 3 outputs of HASHLEN. */
void gn__noise_hkdf(const uint8_t ck[GN_NOISE_HASHLEN], const uint8_t *ikm, size_t ikm_len, uint8_t *out1,
                    uint8_t *out2, uint8_t *out3);

typedef struct gn_noise_pattern gn_noise_pattern;

/* Looks up a pattern by name ("XX", "IK", "XX1"...). NULL if unknown. */
const gn_noise_pattern *gn__noise_pattern_find(const char *name);

typedef struct gn_noise_handshake {
  const gn_noise_pattern *pat;
  bool initiator;
  gn_noise_symmetric ss;
  uint8_t s_priv[GN_NOISE_DHLEN], s_pub[GN_NOISE_DHLEN];
  uint8_t e_priv[GN_NOISE_DHLEN], e_pub[GN_NOISE_DHLEN];
  uint8_t rs[GN_NOISE_DHLEN], re[GN_NOISE_DHLEN];
  bool has_s, has_e, has_rs, has_re, e_injected;
  size_t msg_index;
  bool failed;
  gn_noise_rng rng;
  void *rng_ud;
} gn_noise_handshake;

/* Starts a handshake for the full protocol name
 * ("Noise_XX_25519_ChaChaPoly_BLAKE2b"). s_priv: our static private key, or
 * NULL; rs: the peer's static public key when the pattern pre-shares it, or
 * NULL. GN_EUNSUPPORTED for another suite or pattern, GN_EINVAL when a key
 * the pattern needs is missing. */
int gn__noise_handshake_init(gn_noise_handshake *hs, const char *protocol_name, bool initiator, const uint8_t *prologue,
                             size_t prologue_len, const uint8_t *s_priv, const uint8_t *rs, gn_noise_rng rng,
                             void *rng_ud);
/* Uses this ephemeral private key instead of a random one (test vectors). */
void gn__noise_handshake_set_ephemeral(gn_noise_handshake *hs, const uint8_t e_priv[GN_NOISE_DHLEN]);
/* True when the next handshake message is ours to write. */
bool gn__noise_handshake_my_turn(const gn_noise_handshake *hs);
bool gn__noise_handshake_finished(const gn_noise_handshake *hs);
/* Writes the next message (payload included) into out (cap bytes). */
int gn__noise_handshake_write(gn_noise_handshake *hs, const uint8_t *payload, size_t payload_len, uint8_t *out,
                              size_t cap, size_t *ret_len);
/* Reads the next message; the payload goes to out (cap bytes). Any error
 * fails the handshake for good. */
int gn__noise_handshake_read(gn_noise_handshake *hs, const uint8_t *msg, size_t len, uint8_t *out, size_t cap,
                             size_t *ret_len);
/* After the last message: the cipher states for our sending and receiving
 * directions, and the handshake hash. Wipes the handshake. */
int gn__noise_handshake_split(gn_noise_handshake *hs, gn_noise_cipher *ret_send, gn_noise_cipher *ret_recv,
                              uint8_t ret_hash[GN_NOISE_HASHLEN]);
void gn__noise_handshake_wipe(gn_noise_handshake *hs);

#endif
