/* Private declarations shared by the sandbox module's files: limits, error
 * text, digests, the manifest/index/config parsers and the registry client. */
#ifndef GPUNET_SANDBOX_INT_H
#define GPUNET_SANDBOX_INT_H

#include <gpunet/sandbox.h>
#include <stdarg.h>
#include <stdio.h>

/* Limits on what a registry may hand us. */
#define GN__MANIFEST_MAX (4u * 1024u * 1024u) /* manifests and indexes */
#define GN__CONFIG_MAX (4u * 1024u * 1024u)   /* image config blobs */
#define GN__TOKEN_MAX (64u * 1024u)           /* token endpoint replies */
#define GN__LAYERS_MAX 128u
#define GN__INDEX_MAX 1024u                 /* entries in an image index */
#define GN__LAYER_MAX_BYTES (64ull << 30)   /* 64 GiB compressed per layer */
#define GN__CONFIG_STRINGS_MAX 4096u        /* entries in cmd/entrypoint/env */
#define GN__CONFIG_STRING_MAX (64u * 1024u) /* bytes in one of those entries */
#define GN__REDIRECTS_MAX 5L

#define GN__MT_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define GN__MT_OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define GN__MT_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define GN__MT_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"

/* Writes a formatted message into err (may be NULL) and returns code. */
int gn__err(char *err, size_t err_cap, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* True when s is "sha256:" followed by exactly 64 lowercase hex digits. */
bool gn__digest_valid(const char *s);
/* "sha256:" + hex of a 32-byte hash. */
void gn__digest_from_hash(const uint8_t hash[32], char out[GN_DIGEST_STRLEN]);
/* sha256 digest string of a byte range. */
void gn__digest_of(const void *p, size_t n, char out[GN_DIGEST_STRLEN]);
/* "sha256:ab12cd34…" for messages: the algorithm and 8 hex digits. */
const char *gn__digest_short(const char *digest, char buf[32]);

/* Streaming SHA-256 on OpenSSL's libcrypto (several times libsodium's speed
 * here), used for every blob and layer digest. A zeroed gn__sha256 is
 * "not started"; gn__sha256_init (re)starts it, gn__sha256_final writes the
 * hash and leaves the state ready for another init, gn__sha256_done frees
 * what it holds (safe on a zeroed or finished state). */
typedef struct gn__sha256 {
  void *ctx; /* EVP_MD_CTX, opaque outside digest.c */
} gn__sha256;

int gn__sha256_init(gn__sha256 *h); /* GN_ENOMEM or GN_EIO */
void gn__sha256_update(gn__sha256 *h, const void *p, size_t n);
/* The 32-byte hash, or its "sha256:<hex>" string. GN_EIO on a state that
 * was never initialised. */
int gn__sha256_final(gn__sha256 *h, uint8_t out[32]);
int gn__sha256_final_digest(gn__sha256 *h, char out[GN_DIGEST_STRLEN]);
void gn__sha256_done(gn__sha256 *h);

/* --- manifest, index and config parsing (manifest.c) ---------------------*/

typedef struct gn__descriptor {
  char media_type[128];
  char digest[GN_DIGEST_STRLEN];
  uint64_t size;
} gn__descriptor;

typedef enum gn__manifest_kind { GN__KIND_MANIFEST = 1, GN__KIND_INDEX = 2 } gn__manifest_kind;

/* Tells a manifest from an index: by its mediaType field, else by the
 * Content-Type the registry sent (may be NULL), else by shape. */
int gn__manifest_kind_of(const uint8_t *p, size_t n, const char *content_type, gn__manifest_kind *ret);

typedef struct gn__manifest {
  gn__descriptor config;
  size_t layer_count;
  gn__descriptor *layers; /* layer_count entries, bottom first */
} gn__manifest;

/* Parses an image manifest (OCI or Docker schema 2), validating every
 * descriptor. gn__manifest_done frees what it holds. */
int gn__manifest_parse(const uint8_t *p, size_t n, gn__manifest *ret);
void gn__manifest_done(gn__manifest *m);

/* Picks the manifest for os/arch from an image index or Docker manifest
 * list. GN_ENOTFOUND when the index has none for that platform. */
int gn__index_pick(const uint8_t *p, size_t n, const char *os, const char *arch, gn__descriptor *ret);

typedef struct gn__config {
  char **entrypoint; /* NULL-terminated or NULL */
  char **cmd;
  char **env;
  char workdir[256];
  char os[32];
  char arch[32];
} gn__config;

/* Parses an image config blob; the process fields are all optional. */
int gn__config_parse(const uint8_t *p, size_t n, gn__config *ret);
void gn__config_done(gn__config *c);
char **gn__strv_free(char **v);

/* --- registry client (registry.c) ----------------------------------------*/

typedef struct gn__registry gn__registry;

/* How a registry may be reached. With enforce, the registry's host is
 * resolved once and pinned, and every connection (redirects, token realms
 * included) is checked: loopback, link-local, private, unspecified,
 * multicast, broadcast and this host's own addresses are refused unless the
 * allow list names the host, host:port or a CIDR holding the address; plain
 * HTTP only for allow-listed registries on such addresses. Without enforce
 * (a renter resolving its own reference) plain HTTP follows
 * gn_imageref.plain_http and no address is refused. */
typedef struct gn__registry_opts {
  bool enforce;
  const char *const *allow;   /* NULL-terminated or NULL; borrowed for the registry's life */
  const volatile int *cancel; /* non-zero: transfers stop with GN_ECANCELED */
  uint64_t deadline_ms;       /* gn__now_ms() deadline for everything; 0: none */
  char *err_log;              /* registry-sent text (error bodies) for the provider's log; may be NULL */
  size_t err_log_cap;
} gn__registry_opts;

int gn__registry_new(const gn_imageref *ref, gn__registry **ret);
/* GN_EPERM (naming the registry, the address and the registry_allow config
 * key in err) when the policy refuses it. */
int gn__registry_open(const gn_imageref *ref, const gn__registry_opts *o, gn__registry **ret, char *err,
                      size_t err_cap);
/* CLOCK_MONOTONIC in milliseconds. */
uint64_t gn__now_ms(void);
gn__registry *gn__registry_free(gn__registry *r);

/* GET /v2/<name>/manifests/<reference> into body (at most GN__MANIFEST_MAX
 * bytes). ret_content_type and ret_header_digest (the Docker-Content-Digest
 * header, "" when absent) are optional. */
int gn__registry_get_manifest(gn__registry *r, const char *reference, gn_buf *body, char ret_content_type[128],
                              char ret_header_digest[GN_DIGEST_STRLEN], char *err, size_t err_cap);

typedef struct gn__blob_sink {
  int fd;                 /* appended to */
  uint64_t offset;        /* bytes already in fd (a resumed download) */
  uint64_t expected_size; /* the descriptor's size: more is refused */
  gn__sha256 *hash_state; /* fed with every byte written to fd */
  gn_pull_progress_fn progress;
  void *progress_ud;
  const char *what;
  uint64_t fetched;           /* bytes this call received */
  bool restarted;             /* the server ignored Range: the caller must start over */
  uint64_t deadline_ms;       /* gn__now_ms() deadline for this blob; 0: none */
  const char *space_path;     /* statvfs'd while streaming; NULL: no check */
  uint64_t reserve_bytes;     /* free space that must stay free on it */
  uint64_t since_space_check; /* bytes written since the last statvfs */
} gn__blob_sink;

/* GET /v2/<name>/blobs/<digest>, following redirects, appending to sink->fd
 * and hashing while streaming. With sink->offset > 0 it asks for the rest
 * with Range; a server that answers 200 instead sets sink->restarted and
 * writes nothing, so the caller can truncate and call again. */
int gn__registry_get_blob(gn__registry *r, const char *digest, gn__blob_sink *sink, char *err, size_t err_cap);

/* --- store internals (store.c) --------------------------------------------*/

const char *gn__store_dir(const gn_store *s);
/* dir/blobs/sha256/<hex> for a valid digest. */
void gn__store_blob_path(const gn_store *s, const char *digest, char out[4096]);
/* GN_ENOSPACE (with a message) when writing need_bytes more into the store
 * would leave less than reserve_bytes free on its filesystem. */
int gn__store_space_check(gn_store *s, uint64_t need_bytes, char *err, size_t err_cap);
/* The limits set by gn_store_set_limits (never NULL; all zero before it is
 * called). A zero field means its GN_STORE_DEFAULT_* value. */
const gn_store_limits *gn__store_limits(const gn_store *s);

/* --- unpacking (unpack.c) ------------------------------------------------*/

/* Unpacks n layer files (bottom first), each checked against its digest,
 * into rootfs, which must not exist yet, under lim (NULL or zero fields:
 * the defaults) and opts (may be NULL); on failure rootfs is removed. */
int gn__unpack_layer_files(const char *const *paths, const char *const *digests, size_t n, const char *rootfs,
                           const gn_store_limits *lim, const gn_unpack_opts *opts, char *err, size_t err_cap);

/* --- seccomp profile (seccomp.c) ----------------------------------------*/

struct json_t;
/* The job's "linux.seccomp" object: a default-EPERM allow list that refuses
 * the keyring calls, new user namespaces, io_uring, perf_event_open,
 * userfaultfd, bpf, mount, ptrace, kexec and module loading. NULL on
 * ENOMEM. The caller owns the reference. */
struct json_t *gn__seccomp_profile(void);

#endif
