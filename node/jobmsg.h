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
#define GN_MANIFEST_MAX_TTL_S 600 /* a manifest may live at most this long */

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
} gn_jobman;

void gn__jobman_done(gn_jobman *m);
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
  const uint8_t *data; /* JOB_LOG: into the decoded document */
  size_t data_len;
  gn_wire_doc doc;
} gn_jobmsg;

/* JOB_STATUS, JOB_LOG, JOB_STOP, LEASE_REJECT/RELEASE/END and ERROR all use
 * small maps; one decoder fills what each carries. */
int gn__jobmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_jobmsg *ret);
void gn__jobmsg_done(gn_jobmsg *m);

#endif
