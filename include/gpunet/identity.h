/* Node identity: an Ed25519 key pair kept in identity.key, and the printable
 * node id derived from its public key. */
#ifndef GPUNET_IDENTITY_H
#define GPUNET_IDENTITY_H

#include <gpunet/base.h>
#include <stddef.h>
#include <stdint.h>

#define GN_PK_LEN 32
#define GN_SIG_LEN 64
/* Printable node id: "gn" + lowercase base32 (RFC 4648, no padding) of the
 * public key followed by a 2-byte BLAKE2b checksum and a version byte (1):
 * 35 bytes, i.e. 2 + 56 chars + NUL. The checksum is the first two bytes of
 * BLAKE2b-256("gpunet-node-id" || pk || version). */
#define GN_NODE_ID_STRLEN 59

typedef struct gn_identity {
  uint8_t pk[GN_PK_LEN];
  uint8_t *sk; /* 64 bytes in sodium_malloc memory */
} gn_identity;

/* Creates a fresh random identity. */
int gn_identity_generate(gn_identity **ret_id);
/* Loads identity.key; GN_EPERM if the file is readable or writable by group
 * or others, GN_EINVAL if it is malformed. */
int gn_identity_load(const char *path, gn_identity **ret_id);
/* Writes the identity with mode 0600; GN_EEXIST if the file already exists. */
int gn_identity_save(const gn_identity *id, const char *path);
gn_identity *gn_identity_free(gn_identity *id);

/* Signs msg with the identity's key. */
void gn_identity_sign(const gn_identity *id, const uint8_t *msg, size_t len, uint8_t ret_sig[GN_SIG_LEN]);
/* 0 if sig is a valid signature of msg by pk, GN_ESIG otherwise. */
int gn_sig_verify(const uint8_t pk[GN_PK_LEN], const uint8_t *msg, size_t len, const uint8_t sig[GN_SIG_LEN]);

void gn_node_id_format(const uint8_t pk[GN_PK_LEN], char ret_str[GN_NODE_ID_STRLEN]);
/* GN_EINVAL on a bad length, alphabet or checksum. */
int gn_node_id_parse(const char *str, uint8_t ret_pk[GN_PK_LEN]);

#endif
