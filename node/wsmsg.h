/* Bodies of the workspace messages (WS_PUT .. WS_STAT_REPLY, types 100-105;
 * docs/protocol.md §3.2) and the grammar of a path inside a lease's
 * workspace. Bounded decoding, no I/O; depends on nothing of the node. */
#ifndef GPUNET_NODE_WSMSG_H
#define GPUNET_NODE_WSMSG_H

#include <gpunet/billing.h>
#include <gpunet/wire.h>
#include <stdbool.h>
#include <stdint.h>

#define GN_WS_CHUNK 32768   /* data bytes in one WS_PUT or WS_DATA */
#define GN_WS_PATH_MAX 1024 /* bytes of a workspace path, with its NUL */
#define GN_WS_NAME_MAX 255  /* bytes of one component */
#define GN_WS_DEPTH_MAX 32  /* components of a path */
#define GN_WS_OFFSET_MAX (1ull << 50)
#define GN_WS_REASON_MAX 256

/* One decoded workspace message. Which fields a type carries:
 *   WS_PUT        lease_id, path, seq, offset, data (<= GN_WS_CHUNK)
 *   WS_PUT_ACK    lease_id, seq, offset, size, reason ("" when written)
 *   WS_GET        lease_id, path, seq, offset
 *   WS_DATA       lease_id, seq, offset, data, eof, size, reason
 *   WS_STAT       lease_id, path, seq, hash
 *   WS_STAT_REPLY lease_id, seq, exists, size, sha256 (when has_sha256), reason
 * A request's path is normalized by the decoder (gn__ws_path_norm): a
 * message with a path outside the grammar is malformed. */
typedef struct gn_wsmsg {
  char lease_id[GN_LEASE_ID_STRLEN];
  char path[GN_WS_PATH_MAX];
  uint64_t seq;
  uint64_t offset;
  uint64_t size;
  const uint8_t *data; /* into the decoded document (or the caller's bytes when encoding) */
  size_t data_len;
  bool eof;
  bool hash;
  bool exists;
  bool has_sha256;
  uint8_t sha256[32];
  char reason[GN_WS_REASON_MAX];
  gn_wire_doc doc;
} gn_wsmsg;

/* A path a renter names inside the workspace, made canonical into out
 * (cap bytes): relative, components separated by one '/', "." components
 * and repeated or trailing slashes dropped. Refused (GN_EINVAL, out
 * emptied): empty or only ".", absolute, a ".." component, a control byte
 * or NUL, a component over GN_WS_NAME_MAX bytes, more than GN_WS_DEPTH_MAX
 * components, or a result that does not fit. */
int gn__ws_path_norm(const char *in, char *out, size_t cap);

/* Encodes m as the body of type (one of the six). GN_EINVAL for another
 * type, data over GN_WS_CHUNK, or a request whose path or lease id is
 * outside the grammar (nothing written). */
int gn__wsmsg_encode(uint32_t type, const gn_wsmsg *m, gn_wire_writer *w);
/* Decodes and checks a body of type into ret (ret->data points into body,
 * which must outlive gn__wsmsg_done). GN_EINVAL/GN_ETOOBIG when malformed:
 * nothing to free then. */
int gn__wsmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_wsmsg *ret);
void gn__wsmsg_done(gn_wsmsg *m);

#endif
