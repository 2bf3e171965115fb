/* Bodies of the exec messages (EXEC_OPEN .. EXEC_CLOSE, docs/protocol.md
 * §3.3) with their limits, and the provider's admission rules for an
 * EXEC_OPEN as a pure function of what it knows, so that every refusal is
 * tested without a daemon. Depends on nothing of the node. */
#ifndef GPUNET_NODE_EXECMSG_H
#define GPUNET_NODE_EXECMSG_H

#include "jobmsg.h"

#include <gpunet/wire.h>
#include <stdbool.h>
#include <stdint.h>

#define GN_EXEC_MAX_ARGS 64         /* argv and env entries of one EXEC_OPEN */
#define GN_EXEC_MAX_ARG_LEN 4096    /* bytes of one entry */
#define GN_EXEC_CHUNK 32768         /* bytes of one EXEC_DATA */
#define GN_EXEC_WINDOW (256 * 1024) /* bytes a side may send unacknowledged */
#define GN_EXEC_PER_LEASE 4         /* exec streams open at once on one lease */
#define GN_EXEC_TOTAL 64            /* on one provider */
#define GN_EXEC_MAX_TTL_S 600       /* an EXEC_OPEN may live at most this long */
#define GN_EXEC_MAX_DIM 1000        /* rows and columns of a terminal */

/* EXEC_OPEN (90), signed by the lease holder. */
typedef struct gn_execopen {
  uint32_t sid; /* the stream, chosen by the requester, unique on its session */
  char lease_id[GN_LEASE_ID_STRLEN];
  char job_id[GN_JOB_ID_STRLEN]; /* the running job to exec into */
  uint32_t argc;
  char *argv[GN_EXEC_MAX_ARGS + 1];
  uint32_t envc;
  char *env[GN_EXEC_MAX_ARGS + 1];
  bool tty;
  uint16_t rows, cols; /* with tty: the terminal's size (1..GN_EXEC_MAX_DIM) */
  uint8_t nonce[16];
  int64_t issued_s, expires_s;
} gn_execopen;

/* Frees the strings (not the struct). Accepts a zeroed struct. */
void gn__execopen_done(gn_execopen *o);
/* GN_EINVAL (nothing written) for what the decoder would refuse. */
int gn__execopen_encode(const gn_execopen *o, gn_wire_writer *w);
/* Bounded: argv 1..64 and env 0..64 entries of at most 4096 bytes (no NUL,
 * env as KEY=VALUE), ids by the id grammar, rows/cols 1..1000 with tty.
 * GN_EVERSION for another protocol version; nothing kept on failure. */
int gn__execopen_decode(const uint8_t *body, size_t len, gn_execopen *ret);

/* EXEC_DATA (91), EXEC_WINDOW (92), EXEC_SIGNAL (93), EXEC_EXIT (94) and
 * EXEC_CLOSE (95): small maps keyed by the stream id. */
typedef struct gn_execmsg {
  uint32_t sid;
  const uint8_t *data; /* EXEC_DATA: into the decoded document */
  size_t data_len;
  uint8_t fd;          /* EXEC_DATA from the provider: 1 stdout, 2 stderr (0: from the requester) */
  bool from_provider;  /* EXEC_DATA with fd, EXEC_WINDOW with p: the provider sent it */
  bool eof;            /* EXEC_DATA from the requester: stdin ends after data */
  uint32_t ack;        /* EXEC_WINDOW: bytes the sender consumed (credit returned) */
  uint16_t rows, cols; /* EXEC_WINDOW: a new terminal size (0: none) */
  int sig;             /* EXEC_SIGNAL: SIGINT, SIGTERM or SIGKILL only */
  int32_t code;        /* EXEC_EXIT: the exit status (128+N for signal N), -1 when it never ran */
  char reason[256];    /* EXEC_EXIT, EXEC_CLOSE: why, "" when none */
  gn_wire_doc doc;
} gn_execmsg;

int gn__execmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_execmsg *ret);
void gn__execmsg_done(gn_execmsg *m);
/* fd 1 or 2 from the provider, 0 from the requester: EXEC_DATA and
 * EXEC_WINDOW go both ways, and two nodes may each rent from the other, so
 * the direction is said in the message. */
void gn__execdata_encode(gn_wire_writer *w, uint32_t sid, uint8_t fd, const uint8_t *data, size_t len, bool eof);
void gn__execwindow_encode(gn_wire_writer *w, uint32_t sid, bool from_provider, uint32_t ack, uint16_t rows,
                           uint16_t cols);
void gn__execsignal_encode(gn_wire_writer *w, uint32_t sid, int sig);
void gn__execexit_encode(gn_wire_writer *w, uint32_t sid, int32_t code, const char *reason);
void gn__execclose_encode(gn_wire_writer *w, uint32_t sid, const char *reason);

/* What the provider knows when an EXEC_OPEN arrives, for gn__exec_admit. */
typedef struct gn_exec_ctx {
  const uint8_t *signer;       /* the envelope's signer (also the session's peer) */
  bool lease_found;            /* a lease of that id that this node provides */
  const uint8_t *lease_holder; /* its requester */
  bool lease_active;
  bool job_found;           /* a job of that id provided by this node */
  const char *job_lease_id; /* the lease that job runs on */
  bool job_running;
  bool sid_in_use; /* a stream of that id is open on this session */
  uint32_t lease_streams, total_streams;
  bool nonce_seen; /* the nonce of an earlier EXEC_OPEN or manifest */
  int64_t now_s;
} gn_exec_ctx;

/* 0 when the provider may start the exec, else GN_ENOTFOUND (no such lease
 * or job here), GN_EPERM (not signed by the lease holder, or the job is
 * another lease's), GN_ESTATE (lease not active, job not running),
 * GN_EEXPIRED (outside its validity), GN_EBUSY (too many streams, or the
 * stream id in use) or GN_EREPLAY (nonce seen), with a sentence for the
 * requester in reason. Checks in that order: who before what. */
int gn__exec_admit(const gn_execopen *o, const gn_exec_ctx *ctx, char *reason, size_t cap);

#endif
