/* The one reply p2p itself sends before it closes a session: an ERROR that
 * names the protocol version the peer spoke and the one this node speaks, so
 * a node of another version learns why it was cut off (docs/protocol.md §1.5). */
#include <stdio.h>

#include "session.h"

int gn__proto_peek_version(const uint8_t *msg, size_t len, uint64_t *ret_v) {
  gn_wire_doc doc;
  int r;
  if (!msg || !ret_v)
    return GN_EINVAL;
  if ((r = gn_wire_decode(msg, len, &doc)) < 0)
    return r;
  const msgpack_object *root = doc.root;
  if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size < 1 ||
      root->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
    r = GN_EINVAL;
  } else {
    *ret_v = root->via.array.ptr[0].via.u64;
    r = 0;
  }
  gn_wire_doc_done(&doc);
  return r;
}

int gn__proto_version_error(const gn_identity *id, uint64_t their_v, gn_buf *ret) {
  char reason[128];
  gn_wire_writer w;
  gn_buf body = {0};
  if (!id || !ret)
    return GN_EINVAL;
  snprintf(reason, sizeof(reason), "unsupported protocol version %llu; this node speaks version %u",
           (unsigned long long)their_v, (unsigned)GN_PROTO_VERSION);
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  int r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(id, GN_MSG_ERROR, body.data, body.len, ret);
  gn_buf_done(&body);
  return r;
}
