/* Node identity: Ed25519 key pairs kept in sodium_malloc memory, the
 * identity.key file, and the printable node id with its checksum. */
#include <gpunet/identity.h>

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

/* identity.key is binary: this 8-byte magic, then the 64-byte libsodium
 * secret key (seed || public key). Nothing else, so any other size is
 * malformed. */
#define KEY_MAGIC "GNIDKEY1"
#define KEY_MAGIC_LEN 8
#define KEY_FILE_LEN (KEY_MAGIC_LEN + crypto_sign_SECRETKEYBYTES)

/* The node id encodes pk || checksum(2) || version(1): 35 bytes, which is
 * exactly 56 base32 characters (the same shape as Tor v3 onion names), so no
 * padding bits exist and every id has one spelling. */
#define NODE_ID_VERSION 1
#define NODE_ID_RAW_LEN (GN_PK_LEN + 3)
#define NODE_ID_B32_LEN 56
#define NODE_ID_CHECK_PREFIX "gpunet-node-id"

static const char b32_alphabet[] = "abcdefghijklmnopqrstuvwxyz234567";

static int sodium_ready(void) {
  /* sodium_init is idempotent and thread-safe; it returns 1 when already
   * initialised. */
  return sodium_init() < 0 ? GN_EIO : 0;
}

static int identity_alloc(gn_identity **ret_id) {
  int r = sodium_ready();
  if (r < 0)
    return r;
  gn_identity *id = calloc(1, sizeof(*id));
  if (!id)
    return GN_ENOMEM;
  id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES);
  if (!id->sk) {
    free(id);
    return GN_ENOMEM;
  }
  *ret_id = id;
  return 0;
}

int gn_identity_generate(gn_identity **ret_id) {
  gn_identity *id = NULL;
  int r = identity_alloc(&id);
  if (r < 0)
    return r;
  crypto_sign_keypair(id->pk, id->sk);
  *ret_id = id;
  return 0;
}

gn_identity *gn_identity_free(gn_identity *id) {
  if (!id)
    return NULL;
  sodium_free(id->sk); /* wipes the memory before releasing it */
  free(id);
  return NULL;
}

static int read_full(int fd, uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = read(fd, p, n);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (k == 0)
      return GN_EINVAL;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int write_full(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

int gn_identity_load(const char *path, gn_identity **ret_id) {
  gn_identity *id = NULL;
  uint8_t *buf = NULL;
  int r, fd = -1;
  uint8_t pk[crypto_sign_PUBLICKEYBYTES];

  if (!path || !ret_id)
    return GN_EINVAL;
  if ((r = sodium_ready()) < 0)
    return r;
  /* O_NONBLOCK: a FIFO planted at the path must not hang us (it then fails
   * the regular-file check). */
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return errno == ELOOP ? GN_EPERM : -errno;
  struct stat st;
  if (fstat(fd, &st) < 0) {
    r = -errno;
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    r = GN_EINVAL;
    goto out;
  }
  if (st.st_mode & 077) {
    r = GN_EPERM;
    goto out;
  }
  if (st.st_size != KEY_FILE_LEN) {
    r = GN_EINVAL;
    goto out;
  }
  /* One extra byte detects a file that grew after fstat. */
  buf = sodium_malloc(KEY_FILE_LEN + 1);
  if (!buf) {
    r = GN_ENOMEM;
    goto out;
  }
  if ((r = read_full(fd, buf, KEY_FILE_LEN)) < 0)
    goto out;
  if (read(fd, buf + KEY_FILE_LEN, 1) != 0) {
    r = GN_EINVAL;
    goto out;
  }
  if (memcmp(buf, KEY_MAGIC, KEY_MAGIC_LEN) != 0) {
    r = GN_EINVAL;
    goto out;
  }
  /* The stored public half must be the one the seed derives, or the file is
   * corrupt and every signature would fail far from here. */
  if (crypto_sign_ed25519_sk_to_pk(pk, buf + KEY_MAGIC_LEN) != 0) {
    r = GN_EINVAL;
    goto out;
  }
  if ((r = identity_alloc(&id)) < 0)
    goto out;
  if (crypto_sign_seed_keypair(id->pk, id->sk, buf + KEY_MAGIC_LEN) != 0 || sodium_memcmp(id->pk, pk, GN_PK_LEN) != 0) {
    r = GN_EINVAL;
    goto out;
  }
  *ret_id = id;
  id = NULL;
  r = 0;
out:
  gn_identity_free(id);
  sodium_free(buf);
  if (fd >= 0)
    close(fd);
  return r;
}

int gn_identity_save(const gn_identity *id, const char *path) {
  uint8_t *buf = NULL;
  int r, fd;

  if (!id || !path)
    return GN_EINVAL;
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return errno == EEXIST ? GN_EEXIST : -errno;
  /* The umask can only remove bits, but be explicit in case the file system
   * applied default ACLs. */
  if (fchmod(fd, 0600) < 0) {
    r = -errno;
    goto out;
  }
  buf = sodium_malloc(KEY_FILE_LEN);
  if (!buf) {
    r = GN_ENOMEM;
    goto out;
  }
  memcpy(buf, KEY_MAGIC, KEY_MAGIC_LEN);
  memcpy(buf + KEY_MAGIC_LEN, id->sk, crypto_sign_SECRETKEYBYTES);
  if ((r = write_full(fd, buf, KEY_FILE_LEN)) < 0)
    goto out;
  if (fsync(fd) < 0) {
    r = -errno;
    goto out;
  }
  r = 0;
out:
  sodium_free(buf);
  close(fd);
  if (r < 0)
    unlink(path); /* never leave a half-written key behind */
  return r;
}

void gn_identity_sign(const gn_identity *id, const uint8_t *msg, size_t len, uint8_t ret_sig[GN_SIG_LEN]) {
  crypto_sign_detached(ret_sig, NULL, msg, len, id->sk);
}

int gn_sig_verify(const uint8_t pk[GN_PK_LEN], const uint8_t *msg, size_t len, const uint8_t sig[GN_SIG_LEN]) {
  if (sodium_ready() < 0)
    return GN_EIO;
  return crypto_sign_verify_detached(sig, msg, len, pk) == 0 ? 0 : GN_ESIG;
}

static void node_id_checksum(const uint8_t pk[GN_PK_LEN], uint8_t version, uint8_t ret[2]) {
  crypto_generichash_state st;
  uint8_t h[32];
  crypto_generichash_init(&st, NULL, 0, sizeof(h));
  crypto_generichash_update(&st, (const uint8_t *)NODE_ID_CHECK_PREFIX, sizeof(NODE_ID_CHECK_PREFIX) - 1);
  crypto_generichash_update(&st, pk, GN_PK_LEN);
  crypto_generichash_update(&st, &version, 1);
  crypto_generichash_final(&st, h, sizeof(h));
  ret[0] = h[0];
  ret[1] = h[1];
}

void gn_node_id_format(const uint8_t pk[GN_PK_LEN], char ret_str[GN_NODE_ID_STRLEN]) {
  uint8_t raw[NODE_ID_RAW_LEN];
  memcpy(raw, pk, GN_PK_LEN);
  node_id_checksum(pk, NODE_ID_VERSION, raw + GN_PK_LEN);
  raw[GN_PK_LEN + 2] = NODE_ID_VERSION;

  char *o = ret_str;
  *o++ = 'g';
  *o++ = 'n';
  /* 35 bytes = 7 groups of 5 bytes = 7 groups of 8 characters. */
  for (size_t i = 0; i < NODE_ID_RAW_LEN; i += 5) {
    uint64_t v = 0;
    for (size_t j = 0; j < 5; j++)
      v = (v << 8) | raw[i + j];
    for (int k = 7; k >= 0; k--)
      *o++ = b32_alphabet[(v >> (k * 5)) & 31];
  }
  *o = '\0';
}

static int b32_value(char c) {
  if (c >= 'a' && c <= 'z')
    return c - 'a';
  if (c >= '2' && c <= '7')
    return c - '2' + 26;
  return -1;
}

int gn_node_id_parse(const char *str, uint8_t ret_pk[GN_PK_LEN]) {
  uint8_t raw[NODE_ID_RAW_LEN], check[2];
  if (!str || strnlen(str, GN_NODE_ID_STRLEN) != GN_NODE_ID_STRLEN - 1)
    return GN_EINVAL;
  if (str[0] != 'g' || str[1] != 'n')
    return GN_EINVAL;
  const char *s = str + 2;
  for (size_t i = 0; i < NODE_ID_RAW_LEN; i += 5) {
    uint64_t v = 0;
    for (size_t k = 0; k < 8; k++) {
      int d = b32_value(*s++);
      if (d < 0)
        return GN_EINVAL;
      v = (v << 5) | (uint64_t)d;
    }
    for (int j = 4; j >= 0; j--) {
      raw[i + (size_t)j] = (uint8_t)v;
      v >>= 8;
    }
  }
  if (raw[GN_PK_LEN + 2] != NODE_ID_VERSION)
    return GN_EINVAL;
  node_id_checksum(raw, NODE_ID_VERSION, check);
  if (check[0] != raw[GN_PK_LEN] || check[1] != raw[GN_PK_LEN + 1])
    return GN_EINVAL;
  memcpy(ret_pk, raw, GN_PK_LEN);
  return 0;
}
