/* Encoding and bounded decoding of the port-forwarding messages, and the
 * flow-control window of one stream (fwdmsg.h). */
#include "fwdmsg.h"

#include <stdio.h>
#include <string.h>

int gn__fwdopen_encode(const gn_fwdopen *m, gn_wire_writer *w) {
  if (!m || m->stream == 0 || m->port == 0 || m->port > 65535 || !gn_id_valid(m->lease_id) ||
      (m->job_id[0] && !gn_id_valid(m->job_id)))
    return GN_EINVAL;
  gn_wire_put_map(w, m->job_id[0] ? 7 : 6);
  gn_wire_put_str(w, "v");
  gn_wire_put_u64(w, GN_PROTO_VERSION);
  gn_wire_put_str(w, "s");
  gn_wire_put_u64(w, m->stream);
  gn_wire_put_str(w, "lease_id");
  gn_wire_put_str(w, m->lease_id);
  if (m->job_id[0]) {
    gn_wire_put_str(w, "job_id");
    gn_wire_put_str(w, m->job_id);
  }
  gn_wire_put_str(w, "port");
  gn_wire_put_u64(w, m->port);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, m->nonce, sizeof m->nonce);
  gn_wire_put_str(w, "issued_s");
  gn_wire_put_i64(w, m->issued_s);
  return 0;
}

int gn__fwdopen_decode(const uint8_t *body, size_t len, gn_fwdopen *ret) {
  gn_fwdopen m;
  gn_wire_doc doc;
  uint32_t v = 0;
  memset(&m, 0, sizeof m);
  int r = gn_wire_decode(body, len, &doc);
  if (r < 0)
    return r;
  const msgpack_object *o = doc.root;
  if (o->type != MSGPACK_OBJECT_MAP || gn_wire_get_u32(o, "v", &v) < 0 || v != GN_PROTO_VERSION ||
      gn_wire_get_u32(o, "s", &m.stream) < 0 || m.stream == 0 ||
      gn_wire_get_str(o, "lease_id", m.lease_id, sizeof m.lease_id) < 0 || !gn_id_valid(m.lease_id) ||
      (gn_wire_get(o, "job_id") &&
       (gn_wire_get_str(o, "job_id", m.job_id, sizeof m.job_id) < 0 || !gn_id_valid(m.job_id))) ||
      gn_wire_get_u32(o, "port", &m.port) < 0 || m.port == 0 || m.port > 65535 ||
      gn_wire_get_bin_exact(o, "nonce", m.nonce, sizeof m.nonce) < 0 || gn_wire_get_i64(o, "issued_s", &m.issued_s) < 0)
    r = GN_EINVAL;
  gn_wire_doc_done(&doc);
  if (r == 0)
    *ret = m;
  return r;
}

int gn__fwdmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_fwdmsg *ret) {
  gn_fwdmsg m;
  memset(&m, 0, sizeof m);
  int r = gn_wire_decode(body, len, &m.doc);
  if (r < 0)
    return r;
  const msgpack_object *o = m.doc.root;
  char how[8] = "";
  if (o->type != MSGPACK_OBJECT_MAP || gn_wire_get_u32(o, "s", &m.stream) < 0 || m.stream == 0 ||
      gn_wire_get_bool(o, "o", &m.opener) < 0) {
    r = GN_EINVAL;
    goto fail;
  }
  switch (type) {
  case GN_MSG_FWD_DATA:
    if (gn_wire_get_bin_ref(o, "d", GN_FWD_CHUNK, &m.data, &m.data_len) < 0 || m.data_len == 0)
      r = GN_EINVAL;
    break;
  case GN_MSG_FWD_CREDIT:
    if (gn_wire_get_u32(o, "n", &m.credit) < 0 || m.credit == 0 || m.credit > GN_FWD_WINDOW)
      r = GN_EINVAL;
    break;
  case GN_MSG_FWD_CLOSE:
    if (gn_wire_get_str(o, "how", how, sizeof how) < 0 || (strcmp(how, "fin") != 0 && strcmp(how, "rst") != 0) ||
        (gn_wire_get(o, "reason") && gn_wire_get_str(o, "reason", m.reason, sizeof m.reason) < 0))
      r = GN_EINVAL;
    m.reset = strcmp(how, "rst") == 0;
    break;
  default:
    r = GN_EINVAL;
  }
  if (r < 0)
    goto fail;
  *ret = m;
  return 0;
fail:
  gn_wire_doc_done(&m.doc);
  return r;
}

void gn__fwdmsg_done(gn_fwdmsg *m) {
  if (m)
    gn_wire_doc_done(&m->doc);
}

static void put_head(gn_wire_writer *w, uint32_t n, uint32_t stream, bool opener) {
  gn_wire_put_map(w, n);
  gn_wire_put_str(w, "s");
  gn_wire_put_u64(w, stream);
  gn_wire_put_str(w, "o");
  gn_wire_put_bool(w, opener);
}

void gn__fwd_data_encode(gn_wire_writer *w, uint32_t stream, bool opener, const uint8_t *data, size_t len) {
  put_head(w, 3, stream, opener);
  gn_wire_put_str(w, "d");
  gn_wire_put_bin(w, data, len);
}

void gn__fwd_credit_encode(gn_wire_writer *w, uint32_t stream, bool opener, uint32_t credit) {
  put_head(w, 3, stream, opener);
  gn_wire_put_str(w, "n");
  gn_wire_put_u64(w, credit);
}

void gn__fwd_close_encode(gn_wire_writer *w, uint32_t stream, bool opener, bool reset, const char *reason) {
  char buf[GN_FWD_REASON_LEN + 1];
  snprintf(buf, sizeof buf, "%s", reason ? reason : "");
  put_head(w, 4, stream, opener);
  gn_wire_put_str(w, "how");
  gn_wire_put_str(w, reset ? "rst" : "fin");
  gn_wire_put_str(w, "reason");
  gn_wire_put_str(w, buf);
}

void gn__fwd_win_init(gn_fwd_win *w) {
  w->send_left = GN_FWD_WINDOW;
  w->recv_left = GN_FWD_WINDOW;
  w->to_credit = 0;
}

int gn__fwd_win_sent(gn_fwd_win *w, size_t n) {
  if (n > w->send_left)
    return GN_EINVAL;
  w->send_left -= n;
  return 0;
}

int gn__fwd_win_credit(gn_fwd_win *w, uint64_t n) {
  if (n > GN_FWD_WINDOW || w->send_left + n > GN_FWD_WINDOW)
    return GN_EPROTO;
  w->send_left += n;
  return 0;
}

int gn__fwd_win_recv(gn_fwd_win *w, size_t n) {
  if (n > w->recv_left)
    return GN_EPROTO;
  w->recv_left -= n;
  return 0;
}

uint32_t gn__fwd_win_delivered(gn_fwd_win *w, size_t n) {
  w->to_credit += n;
  if (w->to_credit < GN_FWD_WINDOW / 4)
    return 0;
  uint32_t c = (uint32_t)w->to_credit;
  w->to_credit = 0;
  w->recv_left += c;
  return c;
}
