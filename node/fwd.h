/* Forwarded ports (`gpunet forward`, docs/protocol.md §3.4): a TCP port on
 * the renter's machine that reaches a port inside a lease's sandbox over the
 * lease's session. fwd_req.c is the lease holder's end (the local listener,
 * the /v1/forwards routes), fwd_prov.c the provider's (a socket made inside
 * the job's network namespace), fwd_stream.c the stream both ends share
 * (window, pacing, half-close). daemon.c calls the gn__fwd_* entry points. */
#ifndef GPUNET_NODE_FWD_H
#define GPUNET_NODE_FWD_H

#include "fwdmsg.h"
#include "records.h"

#include <gpunet/ratelimit.h>
#include <uv.h>

/* Forwards one requester keeps, all leases together. */
#define GN_FWD_MAX_FORWARDS 64
/* A provider's connect inside the sandbox gives up after this. */
#define GN_FWD_CONNECT_TIMEOUT_MS 5000
/* What this node sends on all streams together, paced under the receiver's
 * bulk rate class (2000 a second, bursts of 20000; p2p/ratelimit.c) so that
 * a fast stream never gets the session closed for its rate. */
#define GN_FWD_PACE GN_RATE(1500, 15000)

typedef struct gn__fwd_stream gn__fwd_stream;
typedef struct gn__fwd_forward gn__fwd_forward;

/* The module's state, n->fwd. */
typedef struct gn__fwd {
  gn_node *n;
  gn__fwd_stream *streams; /* both ends' streams */
  size_t nstreams;
  gn__fwd_forward *forwards; /* requester: the local listeners */
  size_t nforwards;
  uint32_t next_stream; /* requester: the id of the next stream opened */
  uint64_t next_forward;
  gn_token_bucket pace;
  size_t paced; /* streams that stopped reading for the pace */
  uv_timer_t timer;
  uint64_t checked_ms;
  int self_ns; /* requester end unused; provider: our own network namespace (fd) */
  bool closing;
  /* Counters, for tests and GET /v1/forwards. */
  uint64_t opened, refused, bytes_in, bytes_out;
} gn__fwd;

struct gn__fwd_stream {
  gn__fwd_stream *next;
  gn__fwd *f;
  gn__fwd_forward *fw; /* requester: the forward it came in on; provider: NULL */
  uint8_t peer[GN_PK_LEN];
  uint32_t id;
  bool opener; /* this end opened it (the lease holder) */
  char lease_id[GN_LEASE_ID_STRLEN];
  char job_id[GN_JOB_ID_STRLEN];
  uint16_t port;
  uv_tcp_t tcp;
  uv_connect_t connect_req;
  uv_timer_t connect_timer;
  bool timer_open;
  gn_fwd_win win;
  bool connected;     /* the socket carries bytes (provider: connect succeeded) */
  bool reading;       /* uv_read_start is on */
  bool paced;         /* counted in f->paced */
  bool local_eof;     /* the socket said EOF: FIN sent */
  bool peer_fin;      /* FIN received: shut the socket for writing once written */
  bool shut;          /* uv_shutdown issued */
  bool closing;       /* its handles are closing; it is off the list */
  size_t writes;      /* uv_write requests in flight */
  size_t write_bytes; /* their bytes: at most a window */
  int handles;        /* handles still to close */
};

/* Starts the module (its timer; the provider's own network namespace). */
int gn__fwd_start(gn_node *n);
/* POST/GET /v1/forwards, DELETE /v1/forwards/:id. */
void gn__fwd_register(gn_node *n);
/* FWD_OPEN, FWD_DATA, FWD_CREDIT and FWD_CLOSE from peer (signer checked). */
void gn__fwd_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* At shutdown: resets every stream and closes every listener. */
void gn__fwd_close(gn_node *n);
/* After the loop ended. */
void gn__fwd_free(gn_node *n);

/* The provider's admission of FWD_OPEN m from peer, without I/O: the lease
 * exists here as provider, peer holds it, it is active, the job (named, or
 * the lease's one running job) belongs to it and runs, and the caps hold.
 * 0 and *ret_job, or GN_EPERM/GN_ENOTFOUND/GN_EBUSY with why filled. */
int gn__fwd_admit(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_fwdopen *m, gn_job **ret_job, char *why,
                  size_t cap);

/* fwd_stream.c, shared by both ends. */
gn__fwd_stream *gn__fwd_stream_new(gn__fwd *f, const uint8_t peer[GN_PK_LEN], uint32_t id, bool opener);
gn__fwd_stream *gn__fwd_stream_find(gn__fwd *f, const uint8_t peer[GN_PK_LEN], uint32_t id, bool opener);
/* The socket is connected: reading starts (within window and pace). */
void gn__fwd_stream_connected(gn__fwd_stream *s);
/* Ends the stream now: tells the peer (FWD_CLOSE rst with reason) unless
 * tell is false, closes the socket, frees it once its handles are closed. */
void gn__fwd_stream_reset(gn__fwd_stream *s, bool tell, const char *reason);
/* FWD_DATA, FWD_CREDIT, FWD_CLOSE for s. */
void gn__fwd_stream_on_msg(gn__fwd_stream *s, uint32_t type, const gn_fwdmsg *m);
/* Close callback of a stream's handles: frees it after the last. */
void gn__fwd_handle_closed(uv_handle_t *h);
/* A stream stopped reading for the pace: the timer looks again soon. */
void gn__fwd_pace_wait(gn__fwd *f);
/* The timer's turn: streams held back by the pace read again. */
void gn__fwd_stream_unpace(gn__fwd *f);
size_t gn__fwd_streams_of_lease(const gn__fwd *f, const char *lease_id);
/* Sends one message of a stream, charged to the pace. */
int gn__fwd_send(gn__fwd *f, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *w);

/* fwd_req.c and fwd_prov.c. */
void gn__fwd_req_on_open_refused(gn__fwd_stream *s, const char *reason);
/* Bytes of a requester's stream: in from the sandbox, out to it. */
void gn__fwd_req_count(gn__fwd_stream *s, uint64_t in, uint64_t out);
void gn__fwd_req_check(gn__fwd *f);
void gn__fwd_prov_check(gn__fwd *f);
void gn__fwd_prov_on_open(gn__fwd *f, const uint8_t peer[GN_PK_LEN], const gn_fwdopen *m);
void gn__fwd_req_register(gn_node *n);
void gn__fwd_req_close(gn__fwd *f);

#endif
