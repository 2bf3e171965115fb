/* Encoding and bounded decoding of the workspace messages (WS_PUT ..
 * WS_STAT_REPLY), and the one check every workspace path passes before it
 * names anything on the provider's disk. */
#include "wsmsg.h"

#include <string.h>

int gn__ws_path_norm(const char *in, char *out, size_t cap) {
  size_t o = 0, depth = 0;
  if (!out || cap == 0)
    return GN_EINVAL;
  out[0] = 0;
  if (!in || !in[0] || in[0] == '/')
    return GN_EINVAL;
  const char *p = in;
  while (*p) {
    while (*p == '/')
      p++;
    if (!*p)
      break;
    const char *start = p;
    while (*p && *p != '/') {
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        goto bad;
      p++;
    }
    size_t k = (size_t)(p - start);
    if (k == 1 && start[0] == '.')
      continue;
    if ((k == 2 && start[0] == '.' && start[1] == '.') || k > GN_WS_NAME_MAX || ++depth > GN_WS_DEPTH_MAX)
      goto bad;
    if (o + (o ? 1 : 0) + k + 1 > cap)
      goto bad;
    if (o)
      out[o++] = '/';
    memcpy(out + o, start, k);
    o += k;
    out[o] = 0;
  }
  if (o == 0)
    goto bad;
  return 0;
bad:
  out[0] = 0;
  return GN_EINVAL;
}

static bool is_request(uint32_t type) {
  return type == GN_MSG_WS_PUT || type == GN_MSG_WS_GET || type == GN_MSG_WS_STAT;
}

int gn__wsmsg_encode(uint32_t type, const gn_wsmsg *m, gn_wire_writer *w) {
  char norm[GN_WS_PATH_MAX];
  bool why = m->reason[0] != 0;
  if (type < GN_MSG_WS_PUT || type > GN_MSG_WS_STAT_REPLY || m->data_len > GN_WS_CHUNK || !gn_id_valid(m->lease_id) ||
      (m->data_len && !m->data))
    return GN_EINVAL;
  if (is_request(type) && (gn__ws_path_norm(m->path, norm, sizeof norm) < 0 || strcmp(norm, m->path) != 0))
    return GN_EINVAL;
  switch (type) {
  case GN_MSG_WS_PUT:
    gn_wire_put_map(w, 5);
    break;
  case GN_MSG_WS_PUT_ACK:
    gn_wire_put_map(w, 4 + (why ? 1 : 0));
    break;
  case GN_MSG_WS_GET:
    gn_wire_put_map(w, 4);
    break;
  case GN_MSG_WS_DATA:
    gn_wire_put_map(w, 6 + (why ? 1 : 0));
    break;
  case GN_MSG_WS_STAT:
    gn_wire_put_map(w, 4);
    break;
  default: /* GN_MSG_WS_STAT_REPLY */
    gn_wire_put_map(w, 4 + (m->has_sha256 ? 1 : 0) + (why ? 1 : 0));
    break;
  }
  gn_wire_put_str(w, "lease_id");
  gn_wire_put_str(w, m->lease_id);
  gn_wire_put_str(w, "seq");
  gn_wire_put_u64(w, m->seq);
  if (is_request(type)) {
    gn_wire_put_str(w, "path");
    gn_wire_put_str(w, m->path);
  }
  if (type != GN_MSG_WS_STAT && type != GN_MSG_WS_STAT_REPLY) {
    gn_wire_put_str(w, "offset");
    gn_wire_put_u64(w, m->offset);
  }
  if (type == GN_MSG_WS_PUT || type == GN_MSG_WS_DATA) {
    gn_wire_put_str(w, "data");
    gn_wire_put_bin(w, m->data_len ? m->data : (const uint8_t *)"", m->data_len);
  }
  if (type == GN_MSG_WS_DATA) {
    gn_wire_put_str(w, "eof");
    gn_wire_put_bool(w, m->eof);
  }
  if (type == GN_MSG_WS_PUT_ACK || type == GN_MSG_WS_DATA || type == GN_MSG_WS_STAT_REPLY) {
    gn_wire_put_str(w, "size");
    gn_wire_put_u64(w, m->size);
  }
  if (type == GN_MSG_WS_STAT) {
    gn_wire_put_str(w, "hash");
    gn_wire_put_bool(w, m->hash);
  }
  if (type == GN_MSG_WS_STAT_REPLY) {
    gn_wire_put_str(w, "exists");
    gn_wire_put_bool(w, m->exists);
    if (m->has_sha256) {
      gn_wire_put_str(w, "sha256");
      gn_wire_put_bin(w, m->sha256, sizeof m->sha256);
    }
  }
  if (why && (type == GN_MSG_WS_PUT_ACK || type == GN_MSG_WS_DATA || type == GN_MSG_WS_STAT_REPLY)) {
    gn_wire_put_str(w, "reason");
    gn_wire_put_str(w, m->reason);
  }
  return w->failed ? GN_ENOMEM : 0;
}

int gn__wsmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_wsmsg *ret) {
  gn_wsmsg m;
  memset(&m, 0, sizeof m);
  if (type < GN_MSG_WS_PUT || type > GN_MSG_WS_STAT_REPLY)
    return GN_EPROTO;
  int r = gn_wire_decode(body, len, &m.doc);
  if (r < 0)
    return r;
  const msgpack_object *o = m.doc.root;
  char raw[GN_WS_PATH_MAX];
  if (o->type != MSGPACK_OBJECT_MAP || (r = gn_wire_get_str(o, "lease_id", m.lease_id, sizeof m.lease_id)) < 0 ||
      !gn_id_valid(m.lease_id) || (r = gn_wire_get_u64(o, "seq", &m.seq)) < 0)
    goto bad;
  if (is_request(type) &&
      ((r = gn_wire_get_str(o, "path", raw, sizeof raw)) < 0 || (r = gn__ws_path_norm(raw, m.path, sizeof m.path)) < 0))
    goto bad;
  if (type != GN_MSG_WS_STAT && type != GN_MSG_WS_STAT_REPLY &&
      ((r = gn_wire_get_u64(o, "offset", &m.offset)) < 0 || m.offset > GN_WS_OFFSET_MAX))
    goto bad;
  if ((type == GN_MSG_WS_PUT || type == GN_MSG_WS_DATA) &&
      (r = gn_wire_get_bin_ref(o, "data", GN_WS_CHUNK, &m.data, &m.data_len)) < 0)
    goto bad;
  if (type == GN_MSG_WS_DATA && (r = gn_wire_get_bool(o, "eof", &m.eof)) < 0)
    goto bad;
  if ((type == GN_MSG_WS_PUT_ACK || type == GN_MSG_WS_DATA || type == GN_MSG_WS_STAT_REPLY) &&
      ((r = gn_wire_get_u64(o, "size", &m.size)) < 0 || m.size > GN_WS_OFFSET_MAX))
    goto bad;
  if (type == GN_MSG_WS_STAT && (r = gn_wire_get_bool(o, "hash", &m.hash)) < 0)
    goto bad;
  if (type == GN_MSG_WS_STAT_REPLY) {
    if ((r = gn_wire_get_bool(o, "exists", &m.exists)) < 0)
      goto bad;
    if (gn_wire_get(o, "sha256")) {
      if ((r = gn_wire_get_bin_exact(o, "sha256", m.sha256, sizeof m.sha256)) < 0)
        goto bad;
      m.has_sha256 = true;
    }
  }
  if ((type == GN_MSG_WS_PUT_ACK || type == GN_MSG_WS_DATA || type == GN_MSG_WS_STAT_REPLY) &&
      gn_wire_get(o, "reason") && (r = gn_wire_get_str(o, "reason", m.reason, sizeof m.reason)) < 0)
    goto bad;
  /* A chunk whose end does not fit the bounds, or data past what the
   * answer says the file holds (a refusal says 0), is not an answer anyone
   * honest sends. */
  if (m.offset + m.data_len > GN_WS_OFFSET_MAX ||
      (type == GN_MSG_WS_DATA && !m.reason[0] && m.offset + m.data_len > m.size))
    goto bad;
  *ret = m;
  return 0;
bad:
  r = r < 0 ? r : GN_EINVAL;
  gn_wire_doc_done(&m.doc);
  return r;
}

void gn__wsmsg_done(gn_wsmsg *m) {
  gn_wire_doc_done(&m->doc);
}
