/* Bodies of the port-forwarding messages (docs/protocol.md §3.4, FWD_OPEN,
 * FWD_DATA, FWD_CREDIT, FWD_CLOSE) with their limits, and the per-stream
 * flow-control window both ends keep. No I/O: node/fwd_*.c drive it. */
#ifndef GPUNET_NODE_FWDMSG_H
#define GPUNET_NODE_FWDMSG_H

#include "jobmsg.h"

#include <gpunet/wire.h>
#include <stdbool.h>
#include <stdint.h>

/* Bytes of one FWD_DATA: an envelope of it stays under 64 KiB, one token of
 * the transport's bulk rate class and one transport frame. */
#define GN_FWD_CHUNK 61440
/* What either end may send on a stream before the other credits it. */
#define GN_FWD_WINDOW (256u * 1024u)
#define GN_FWD_REASON_LEN 200
#define GN_FWD_STREAMS_PER_LEASE 16
#define GN_FWD_STREAMS_MAX 256 /* on one provider, all leases together */

typedef struct gn_fwdopen {
  uint32_t stream; /* chosen by the lease holder, >= 1 */
  char lease_id[GN_LEASE_ID_STRLEN];
  char job_id[GN_JOB_ID_STRLEN]; /* "" when absent: the lease's running job */
  uint32_t port;                 /* 1..65535 */
  uint8_t nonce[16];
  int64_t issued_s;
} gn_fwdopen;

int gn__fwdopen_encode(const gn_fwdopen *m, gn_wire_writer *w);
/* GN_EINVAL for anything malformed or out of bounds (stream 0, port 0 or
 * over 65535, an id outside the grammar); nothing is written then. */
int gn__fwdopen_decode(const uint8_t *body, size_t len, gn_fwdopen *ret);

typedef struct gn_fwdmsg {
  uint32_t stream;
  bool opener;         /* "o": sent by the end that opened the stream */
  const uint8_t *data; /* FWD_DATA: 1..GN_FWD_CHUNK bytes, into the document */
  size_t data_len;
  uint32_t credit;                    /* FWD_CREDIT: 1..GN_FWD_WINDOW */
  bool reset;                         /* FWD_CLOSE: "rst" (both ways, at once) rather than "fin" */
  char reason[GN_FWD_REASON_LEN + 1]; /* FWD_CLOSE: "" when none */
  gn_wire_doc doc;
} gn_fwdmsg;

/* FWD_DATA, FWD_CREDIT or FWD_CLOSE (type says which). On success the
 * caller ends it with gn__fwdmsg_done. */
int gn__fwdmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_fwdmsg *ret);
void gn__fwdmsg_done(gn_fwdmsg *m);
void gn__fwd_data_encode(gn_wire_writer *w, uint32_t stream, bool opener, const uint8_t *data, size_t len);
void gn__fwd_credit_encode(gn_wire_writer *w, uint32_t stream, bool opener, uint32_t credit);
void gn__fwd_close_encode(gn_wire_writer *w, uint32_t stream, bool opener, bool reset, const char *reason);

/* One stream's window, at each end: what we may still send, what the peer
 * may still send us, and what we delivered but have not credited yet. */
typedef struct gn_fwd_win {
  uint64_t send_left;
  uint64_t recv_left;
  uint64_t to_credit;
} gn_fwd_win;

void gn__fwd_win_init(gn_fwd_win *w);
/* We send n bytes: GN_EINVAL (nothing counted) when over send_left. */
int gn__fwd_win_sent(gn_fwd_win *w, size_t n);
/* The peer credits n bytes: GN_EPROTO (nothing counted) when that would
 * give us more than a window. */
int gn__fwd_win_credit(gn_fwd_win *w, uint64_t n);
/* n bytes arrive: GN_EPROTO (nothing counted) when the peer had no room. */
int gn__fwd_win_recv(gn_fwd_win *w, size_t n);
/* n received bytes were handed on (written to the local socket). Returns
 * the credit to send now: 0 until a quarter window has gathered. */
uint32_t gn__fwd_win_delivered(gn_fwd_win *w, size_t n);

#endif
