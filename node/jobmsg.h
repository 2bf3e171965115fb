/* Bodies of the lease and job messages the daemon owns (jobmsg.c): the job
 * manifest (JOB_MANIFEST) and the small maps of JOB_STATUS, JOB_LOG,
 * JOB_STOP, LEASE_REJECT/RELEASE/END and ERROR, with their limits. Depends
 * on nothing of the node. */
#ifndef GPUNET_NODE_JOBMSG_H
#define GPUNET_NODE_JOBMSG_H

#include <gpunet/billing.h>
#include <gpunet/sandbox.h>
#include <gpunet/wire.h>
#include <stdbool.h>
#include <stdint.h>

#define GN_JOB_ID_STRLEN 24
#define GN_JOB_MAX_ARGS 64
#define GN_JOB_MAX_ARG_LEN 4096
#define GN_JOB_LOG_CHUNK 32768
#define GN_JOB_OUTPUT_CHUNK 32768    /* bytes of /output's tar in one JOB_OUTPUT */
#define GN_MANIFEST_MAX_TTL_S 600    /* a manifest may live at most this long */
#define GN_JOBMAN_MAX_PEERS 63       /* peer ranks in a manifest's net: world <= 64 */
#define GN_JOBMAN_ENDPOINT_LEN 64    /* "ip:port" of a peer rank's provider, with the NUL */
#define GN_JOBMAN_KEY_LEN 32         /* WireGuard (X25519) keys */
#define GN_JOB_SEED_MAX (4ull << 30) /* bytes of a seed (a restarted rank's /output tar) */

/* The training part of a manifest (docs/protocol.md §3, "net"): this rank's
 * place in the training job and its WireGuard key and peers. The decoder
 * checks bounds and structure (ranks below world, peers distinct and not this
 * rank, ports non-zero, subnet host <= 255); the provider checks the rest. */
typedef struct gn_jobman_peer {
  uint8_t public_key[GN_JOBMAN_KEY_LEN];
  char endpoint[GN_JOBMAN_ENDPOINT_LEN];
  uint32_t rank;
} gn_jobman_peer;

typedef struct gn_jobman_net {
  char group[GN_JOB_ID_STRLEN]; /* the training job's id, the same on every rank */
  uint32_t rank, world, local_rank, local_world;
  uint8_t private_key[GN_JOBMAN_KEY_LEN]; /* wiped by gn__jobman_done */
  uint16_t listen_port;                   /* the provider's UDP port for this rank */
  uint16_t master_port;
  uint32_t subnet_host; /* H of 10.77.H.0/24 */
  uint32_t npeers;
  gn_jobman_peer peers[GN_JOBMAN_MAX_PEERS];
} gn_jobman_net;

typedef struct gn_jobman {
  char job_id[GN_JOB_ID_STRLEN];
  char lease_id[GN_LEASE_ID_STRLEN];
  char image[600];
  uint32_t argc;
  char *argv[GN_JOB_MAX_ARGS + 1];
  uint32_t envc;
  char *env[GN_JOB_MAX_ARGS + 1];
  uint64_t memory_mib;
  uint32_t pids;
  bool network;
  uint8_t nonce[16];
  int64_t issued_s;
  int64_t expires_s;
  bool output;  /* a writable /output for the job ("output"; absent: false) */
  bool has_net; /* "net" present: a rank of a training job */
  gn_jobman_net net;
  /* "seed" {sha256, size}: /output starts as this tar, which the provider
   * fetches from the lease holder (JOB_SEED_GET/JOB_SEED) before the
   * container starts; only with output, 0 < size <= GN_JOB_SEED_MAX. */
  bool has_seed;
  uint8_t seed_sha256[32];
  uint64_t seed_size;
} gn_jobman;

/* An argv or env list as the manifest and EXEC_OPEN carry it: n strings,
 * each malloc'd, then a NULL. gn__jobmsg_strv_free frees the n strings of v
 * (not v itself). */
void gn__jobmsg_strv_free(char **v, uint32_t n);
/* Writes key and then v as an array of n strings. */
void gn__jobmsg_strv_put(gn_wire_writer *w, const char *key, char *const *v, uint32_t n);
/* Copies the array of strings at key out of the document into out (max_n + 1
 * slots, NULL-terminated): at most max_n entries of at most max_len bytes,
 * none holding a NUL. An entry too long is too_long (GN_EINVAL or
 * GN_ETOOBIG, as the message's tests say), any other bad entry GN_EINVAL;
 * on failure what was copied is freed and *ret_n is not written. */
int gn__jobmsg_strv_get(const msgpack_object *map, const char *key, uint32_t max_n, size_t max_len, int too_long,
                        char **out, uint32_t *ret_n);
/* Whether every one of the n entries is a valid KEY=VALUE (gn_env_entry_valid). */
bool gn__jobmsg_env_valid(char *const *env, uint32_t n);

/* Decodes a body that carries the protocol version (a manifest, an
 * EXEC_OPEN): GN_EINVAL when its root is not a map, gn_wire_get_u64's error
 * when "v" is missing or no number, GN_EVERSION when it is not
 * GN_PROTO_VERSION; on failure nothing is kept. The caller owns *ret_doc
 * (gn_wire_doc_done). */
int gn__jobmsg_decode_versioned(const uint8_t *body, size_t len, gn_wire_doc *ret_doc);

/* Frees the strings and wipes the net section's private key. */
void gn__jobman_done(gn_jobman *m);
/* GN_EINVAL (nothing written) for what the decoder would refuse of the
 * seed (a seed without output, size 0 or over GN_JOB_SEED_MAX). */
int gn__jobman_encode(const gn_jobman *m, gn_wire_writer *w);
int gn__jobman_decode(const uint8_t *body, size_t len, gn_jobman *ret);

typedef struct gn_jobmsg {
  char job_id[GN_JOB_ID_STRLEN];
  char lease_id[GN_LEASE_ID_STRLEN];
  char state[16];
  int64_t exit_code; /* JOB_STATUS: -1 while none */
  int64_t end_s;     /* LEASE_END */
  char reason[256];  /* the error or reason, "" if none */
  char digest[GN_DIGEST_STRLEN];
  uint64_t offset;
  const uint8_t *data; /* JOB_LOG, JOB_OUTPUT: into the decoded document */
  size_t data_len;
  bool eof;      /* JOB_OUTPUT, JOB_SEED: the last chunk */
  uint64_t size; /* JOB_OUTPUT, JOB_SEED: the tar's bytes in all (0 when unknown) */
  /* JOB_STATUS while the image is pulled (optional "pulled", "pull_total"):
   * bytes fetched so far and to fetch in all (0: not known yet). What the
   * provider says, shown to the renter as progress and never trusted. */
  bool has_pull;
  uint64_t pulled, pull_total;
  gn_wire_doc doc;
} gn_jobmsg;

/* JOB_STATUS, JOB_LOG, JOB_STOP, JOB_OUTPUT_GET, JOB_OUTPUT, JOB_SEED_GET,
 * JOB_SEED, LEASE_REJECT/RELEASE/END and ERROR all use small maps; one
 * decoder fills what each carries. JOB_OUTPUT_GET and JOB_SEED_GET {job_id,
 * lease_id, offset}; JOB_OUTPUT and JOB_SEED {job_id, offset, data (<=
 * GN_JOB_OUTPUT_CHUNK), eof, size, reason (when refused: no data, eof
 * true)}. */
int gn__jobmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_jobmsg *ret);
void gn__jobmsg_done(gn_jobmsg *m);
/* The body of a JOB_OUTPUT_GET or JOB_SEED_GET. */
void gn__joboutput_get_encode(gn_wire_writer *w, const char *job_id, const char *lease_id, uint64_t offset);
/* The body of a JOB_OUTPUT or JOB_SEED (reason NULL or "" when none). */
void gn__joboutput_encode(gn_wire_writer *w, const char *job_id, uint64_t offset, const uint8_t *data, size_t len,
                          bool eof, uint64_t size, const char *reason);

#endif
