/* Encoding and bounded decoding of the exec messages (an interactive process
 * in a lease's sandbox, docs/protocol.md §3.3), and the provider's admission
 * rules for EXEC_OPEN. */
#include "execmsg.h"

#include <gpunet/billing.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gn__execopen_done(gn_execopen *o) {
  gn__jobmsg_strv_free(o->argv, o->argc);
  gn__jobmsg_strv_free(o->env, o->envc);
  o->argc = o->envc = 0;
}

static bool strv_ok(char *const *v, uint32_t n, uint32_t min) {
  if (n < min || n > GN_EXEC_MAX_ARGS)
    return false;
  for (uint32_t i = 0; i < n; i++)
    if (!v[i] || strlen(v[i]) > GN_EXEC_MAX_ARG_LEN)
      return false;
  return true;
}

int gn__execopen_encode(const gn_execopen *o, gn_wire_writer *w) {
  if (!gn_id_valid(o->lease_id) || !gn_id_valid(o->job_id) || !strv_ok(o->argv, o->argc, 1) ||
      !strv_ok(o->env, o->envc, 0) || !gn__jobmsg_env_valid(o->env, o->envc) ||
      (o->tty && (o->rows < 1 || o->cols < 1 || o->rows > GN_EXEC_MAX_DIM || o->cols > GN_EXEC_MAX_DIM)))
    return GN_EINVAL;
  gn_wire_put_map(w, 12);
  gn_wire_put_str(w, "v");
  gn_wire_put_u64(w, GN_PROTO_VERSION);
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, o->sid);
  gn_wire_put_str(w, "lease_id");
  gn_wire_put_str(w, o->lease_id);
  gn_wire_put_str(w, "job_id");
  gn_wire_put_str(w, o->job_id);
  gn__jobmsg_strv_put(w, "cmd", o->argv, o->argc);
  gn__jobmsg_strv_put(w, "env", o->env, o->envc);
  gn_wire_put_str(w, "tty");
  gn_wire_put_bool(w, o->tty);
  gn_wire_put_str(w, "rows");
  gn_wire_put_u64(w, o->tty ? o->rows : 0);
  gn_wire_put_str(w, "cols");
  gn_wire_put_u64(w, o->tty ? o->cols : 0);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, o->nonce, sizeof o->nonce);
  gn_wire_put_str(w, "issued_s");
  gn_wire_put_i64(w, o->issued_s);
  gn_wire_put_str(w, "expires_s");
  gn_wire_put_i64(w, o->expires_s);
  return 0;
}

int gn__execopen_decode(const uint8_t *body, size_t len, gn_execopen *ret) {
  gn_wire_doc doc;
  gn_execopen o;
  uint64_t rows = 0, cols = 0;
  memset(&o, 0, sizeof o);
  int r = gn__jobmsg_decode_versioned(body, len, &doc);
  if (r < 0)
    return r;
  const msgpack_object *m = doc.root;
  if ((r = gn_wire_get_u32(m, "sid", &o.sid)) < 0 ||
      (r = gn_wire_get_str(m, "lease_id", o.lease_id, sizeof o.lease_id)) < 0 ||
      (r = gn_wire_get_str(m, "job_id", o.job_id, sizeof o.job_id)) < 0 ||
      (r = gn_wire_get_bool(m, "tty", &o.tty)) < 0 || (r = gn_wire_get_u64(m, "rows", &rows)) < 0 ||
      (r = gn_wire_get_u64(m, "cols", &cols)) < 0 ||
      (r = gn_wire_get_bin_exact(m, "nonce", o.nonce, sizeof o.nonce)) < 0 ||
      (r = gn_wire_get_i64(m, "issued_s", &o.issued_s)) < 0 || (r = gn_wire_get_i64(m, "expires_s", &o.expires_s)) < 0)
    goto out;
  if (!gn_id_valid(o.lease_id) || !gn_id_valid(o.job_id) ||
      (o.tty && (rows < 1 || cols < 1 || rows > GN_EXEC_MAX_DIM || cols > GN_EXEC_MAX_DIM))) {
    r = GN_EINVAL;
    goto out;
  }
  o.rows = o.tty ? (uint16_t)rows : 0;
  o.cols = o.tty ? (uint16_t)cols : 0;
  /* An entry over GN_EXEC_MAX_ARG_LEN is GN_ETOOBIG here, as EXEC_OPEN has
   * always answered; the manifest's decoder keeps GN_EINVAL. */
  if ((r = gn__jobmsg_strv_get(m, "cmd", GN_EXEC_MAX_ARGS, GN_EXEC_MAX_ARG_LEN, GN_ETOOBIG, o.argv, &o.argc)) < 0)
    goto out;
  if ((r = gn__jobmsg_strv_get(m, "env", GN_EXEC_MAX_ARGS, GN_EXEC_MAX_ARG_LEN, GN_ETOOBIG, o.env, &o.envc)) < 0) {
    gn__execopen_done(&o);
    goto out;
  }
  if (o.argc == 0 || !gn__jobmsg_env_valid(o.env, o.envc)) {
    gn__execopen_done(&o);
    r = GN_EINVAL;
    goto out;
  }
  *ret = o;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn__execmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_execmsg *ret) {
  gn_execmsg m;
  memset(&m, 0, sizeof m);
  int r = gn_wire_decode(body, len, &m.doc);
  if (r < 0)
    return r;
  const msgpack_object *o = m.doc.root;
  uint64_t u = 0;
  int64_t i = 0;
  char sig[8];
  if (o->type != MSGPACK_OBJECT_MAP || (r = gn_wire_get_u32(o, "sid", &m.sid)) < 0)
    goto bad;
  if (gn_wire_get(o, "reason") && (r = gn_wire_get_str(o, "reason", m.reason, sizeof m.reason)) < 0)
    goto bad;
  switch (type) {
  case GN_MSG_EXEC_DATA:
    if ((r = gn_wire_get_bin_ref(o, "data", GN_EXEC_CHUNK, &m.data, &m.data_len)) < 0)
      goto bad;
    if (gn_wire_get(o, "fd")) {
      if ((r = gn_wire_get_u64(o, "fd", &u)) < 0 || (u != 1 && u != 2))
        goto bad;
      m.fd = (uint8_t)u;
      m.from_provider = true;
    }
    if (gn_wire_get(o, "eof") && (r = gn_wire_get_bool(o, "eof", &m.eof)) < 0)
      goto bad;
    break;
  case GN_MSG_EXEC_WINDOW:
    if ((r = gn_wire_get_u32(o, "ack", &m.ack)) < 0 || m.ack > GN_EXEC_WINDOW)
      goto bad;
    if (gn_wire_get(o, "p") && (r = gn_wire_get_bool(o, "p", &m.from_provider)) < 0)
      goto bad;
    if (gn_wire_get(o, "rows") || gn_wire_get(o, "cols")) {
      uint64_t rows = 0, cols = 0;
      if ((r = gn_wire_get_u64(o, "rows", &rows)) < 0 || (r = gn_wire_get_u64(o, "cols", &cols)) < 0 || rows < 1 ||
          cols < 1 || rows > GN_EXEC_MAX_DIM || cols > GN_EXEC_MAX_DIM)
        goto bad;
      m.rows = (uint16_t)rows;
      m.cols = (uint16_t)cols;
    }
    break;
  case GN_MSG_EXEC_SIGNAL:
    if ((r = gn_wire_get_str(o, "sig", sig, sizeof sig)) < 0)
      goto bad;
    m.sig = strcmp(sig, "INT") == 0    ? SIGINT
            : strcmp(sig, "TERM") == 0 ? SIGTERM
            : strcmp(sig, "KILL") == 0 ? SIGKILL
                                       : 0;
    if (!m.sig)
      goto bad;
    break;
  case GN_MSG_EXEC_EXIT:
    if ((r = gn_wire_get_i64(o, "code", &i)) < 0 || i < -1 || i > 255)
      goto bad;
    m.code = (int32_t)i;
    break;
  case GN_MSG_EXEC_CLOSE:
    break;
  default:
    r = GN_EPROTO;
    goto fail;
  }
  *ret = m;
  return 0;
bad:
  r = r < 0 ? r : GN_EINVAL;
fail:
  gn_wire_doc_done(&m.doc);
  return r;
}

void gn__execmsg_done(gn_execmsg *m) {
  gn_wire_doc_done(&m->doc);
}

void gn__execdata_encode(gn_wire_writer *w, uint32_t sid, uint8_t fd, const uint8_t *data, size_t len, bool eof) {
  bool with_fd = fd == 1 || fd == 2;
  gn_wire_put_map(w, 2 + (with_fd ? 1 : 0) + (eof ? 1 : 0));
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, sid);
  gn_wire_put_str(w, "data");
  gn_wire_put_bin(w, data, len > GN_EXEC_CHUNK ? GN_EXEC_CHUNK : len);
  if (with_fd) {
    gn_wire_put_str(w, "fd");
    gn_wire_put_u64(w, fd);
  }
  if (eof) {
    gn_wire_put_str(w, "eof");
    gn_wire_put_bool(w, true);
  }
}

void gn__execwindow_encode(gn_wire_writer *w, uint32_t sid, bool from_provider, uint32_t ack, uint16_t rows,
                           uint16_t cols) {
  bool size = rows && cols;
  gn_wire_put_map(w, 2 + (size ? 2 : 0) + (from_provider ? 1 : 0));
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, sid);
  if (from_provider) {
    gn_wire_put_str(w, "p");
    gn_wire_put_bool(w, true);
  }
  gn_wire_put_str(w, "ack");
  gn_wire_put_u64(w, ack);
  if (size) {
    gn_wire_put_str(w, "rows");
    gn_wire_put_u64(w, rows);
    gn_wire_put_str(w, "cols");
    gn_wire_put_u64(w, cols);
  }
}

void gn__execsignal_encode(gn_wire_writer *w, uint32_t sid, int sig) {
  gn_wire_put_map(w, 2);
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, sid);
  gn_wire_put_str(w, "sig");
  gn_wire_put_str(w, sig == SIGKILL ? "KILL" : sig == SIGTERM ? "TERM" : "INT");
}

void gn__execexit_encode(gn_wire_writer *w, uint32_t sid, int32_t code, const char *reason) {
  bool why = reason && reason[0];
  gn_wire_put_map(w, 2 + (why ? 1 : 0));
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, sid);
  gn_wire_put_str(w, "code");
  gn_wire_put_i64(w, code);
  if (why) {
    gn_wire_put_str(w, "reason");
    gn_wire_put_str(w, reason);
  }
}

void gn__execclose_encode(gn_wire_writer *w, uint32_t sid, const char *reason) {
  bool why = reason && reason[0];
  gn_wire_put_map(w, 1 + (why ? 1 : 0));
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, sid);
  if (why) {
    gn_wire_put_str(w, "reason");
    gn_wire_put_str(w, reason);
  }
}

int gn__exec_admit(const gn_execopen *o, const gn_exec_ctx *c, char *reason, size_t cap) {
  if (!c->lease_found) {
    snprintf(reason, cap, "no lease %s on this provider", o->lease_id);
    return GN_ENOTFOUND;
  }
  if (memcmp(c->signer, c->lease_holder, GN_PK_LEN) != 0) {
    snprintf(reason, cap, "exec on lease %s is not signed by the lease holder", o->lease_id);
    return GN_EPERM;
  }
  if (!c->lease_active) {
    snprintf(reason, cap, "lease %s is not active", o->lease_id);
    return GN_ESTATE;
  }
  if (!c->job_found) {
    snprintf(reason, cap, "no job %s on this provider", o->job_id);
    return GN_ENOTFOUND;
  }
  if (!c->job_lease_id || strcmp(c->job_lease_id, o->lease_id) != 0) {
    snprintf(reason, cap, "job %s does not run on lease %s", o->job_id, o->lease_id);
    return GN_EPERM;
  }
  if (!c->job_running) {
    snprintf(reason, cap, "job %s is not running", o->job_id);
    return GN_ESTATE;
  }
  if (o->expires_s < c->now_s) {
    snprintf(reason, cap, "exec request expired %llds ago", (long long)(c->now_s - o->expires_s));
    return GN_EEXPIRED;
  }
  if (o->expires_s > c->now_s + GN_EXEC_MAX_TTL_S || o->issued_s > c->now_s + 300 || o->issued_s > o->expires_s) {
    snprintf(reason, cap, "exec request validity is more than %ds in the future", GN_EXEC_MAX_TTL_S);
    return GN_EEXPIRED;
  }
  if (c->sid_in_use) {
    snprintf(reason, cap, "exec stream %u is already open", o->sid);
    return GN_EBUSY;
  }
  if (c->lease_streams >= GN_EXEC_PER_LEASE) {
    snprintf(reason, cap, "lease %s already has %u exec sessions open; close one first", o->lease_id, c->lease_streams);
    return GN_EBUSY;
  }
  if (c->total_streams >= GN_EXEC_TOTAL) {
    snprintf(reason, cap, "this provider has %u exec sessions open, its most; try again later", c->total_streams);
    return GN_EBUSY;
  }
  if (c->nonce_seen) {
    snprintf(reason, cap, "exec request nonce already seen: replayed request");
    return GN_EREPLAY;
  }
  return 0;
}
