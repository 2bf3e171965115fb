/* Encoding and bounded decoding of the lease-control and job messages the
 * daemon exchanges: job manifests, job status, log chunks, stop, and the
 * small lease reject/release/end notices. */
#include "jobmsg.h"

#include <gpunet/billing.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

void gn__jobman_done(gn_jobman *m) {
  for (uint32_t i = 0; i < m->argc; i++)
    free(m->argv[i]);
  for (uint32_t i = 0; i < m->envc; i++)
    free(m->env[i]);
  m->argc = m->envc = 0;
}

int gn__jobman_encode(const gn_jobman *m, gn_wire_writer *w) {
  gn_wire_put_map(w, 12);
  gn_wire_put_str(w, "job_id");
  gn_wire_put_str(w, m->job_id);
  gn_wire_put_str(w, "lease_id");
  gn_wire_put_str(w, m->lease_id);
  gn_wire_put_str(w, "image");
  gn_wire_put_str(w, m->image);
  gn_wire_put_str(w, "cmd");
  gn_wire_put_array(w, m->argc);
  for (uint32_t i = 0; i < m->argc; i++)
    gn_wire_put_str(w, m->argv[i]);
  gn_wire_put_str(w, "env");
  gn_wire_put_array(w, m->envc);
  for (uint32_t i = 0; i < m->envc; i++)
    gn_wire_put_str(w, m->env[i]);
  gn_wire_put_str(w, "memory_mib");
  gn_wire_put_u64(w, m->memory_mib);
  gn_wire_put_str(w, "pids");
  gn_wire_put_u64(w, m->pids);
  gn_wire_put_str(w, "network");
  gn_wire_put_bool(w, m->network);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, m->nonce, sizeof m->nonce);
  gn_wire_put_str(w, "issued_s");
  gn_wire_put_i64(w, m->issued_s);
  gn_wire_put_str(w, "expires_s");
  gn_wire_put_i64(w, m->expires_s);
  gn_wire_put_str(w, "v");
  gn_wire_put_u64(w, GN_PROTO_VERSION);
  return 0;
}

/* Copies an array of strings out of the document, bounded in count and
 * length; on failure frees what it copied. */
static int get_strv(const msgpack_object *map, const char *key, char **out, uint32_t *ret_n) {
  const msgpack_object_array *a;
  int r = gn_wire_get_array(map, key, GN_JOB_MAX_ARGS, &a);
  if (r < 0)
    return r;
  uint32_t n = 0;
  for (; n < a->size; n++) {
    const msgpack_object *o = &a->ptr[n];
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > GN_JOB_MAX_ARG_LEN ||
        (o->via.str.size && memchr(o->via.str.ptr, 0, o->via.str.size))) {
      r = GN_EINVAL;
      goto fail;
    }
    out[n] = o->via.str.size ? strndup(o->via.str.ptr, o->via.str.size) : strdup("");
    if (!out[n]) {
      r = GN_ENOMEM;
      goto fail;
    }
  }
  out[n] = NULL;
  *ret_n = n;
  return 0;
fail:
  for (uint32_t i = 0; i < n; i++)
    free(out[i]);
  return r;
}

int gn__jobman_decode(const uint8_t *body, size_t len, gn_jobman *ret) {
  gn_wire_doc doc;
  gn_jobman m;
  uint64_t v = 0, pids = 0;
  memset(&m, 0, sizeof m);
  int r = gn_wire_decode(body, len, &doc);
  if (r < 0)
    return r;
  const msgpack_object *o = doc.root;
  if (o->type != MSGPACK_OBJECT_MAP) {
    r = GN_EINVAL;
    goto out;
  }
  if ((r = gn_wire_get_u64(o, "v", &v)) < 0)
    goto out;
  if (v != GN_PROTO_VERSION) {
    r = GN_EVERSION;
    goto out;
  }
  if ((r = gn_wire_get_str(o, "job_id", m.job_id, sizeof m.job_id)) < 0 ||
      (r = gn_wire_get_str(o, "lease_id", m.lease_id, sizeof m.lease_id)) < 0 ||
      (r = gn_wire_get_str(o, "image", m.image, sizeof m.image)) < 0 ||
      (r = gn_wire_get_u64(o, "memory_mib", &m.memory_mib)) < 0 || (r = gn_wire_get_u64(o, "pids", &pids)) < 0 ||
      (r = gn_wire_get_bool(o, "network", &m.network)) < 0 ||
      (r = gn_wire_get_bin_exact(o, "nonce", m.nonce, sizeof m.nonce)) < 0 ||
      (r = gn_wire_get_i64(o, "issued_s", &m.issued_s)) < 0 || (r = gn_wire_get_i64(o, "expires_s", &m.expires_s)) < 0)
    goto out;
  if (pids > UINT32_MAX || m.memory_mib > (1u << 30)) {
    r = GN_ETOOBIG;
    goto out;
  }
  /* The ids name files and containers on the provider: strict grammar. */
  if (!gn_id_valid(m.job_id) || !gn_id_valid(m.lease_id)) {
    r = GN_EINVAL;
    goto out;
  }
  m.pids = (uint32_t)pids;
  if ((r = get_strv(o, "cmd", m.argv, &m.argc)) < 0)
    goto out;
  if ((r = get_strv(o, "env", m.env, &m.envc)) < 0) {
    gn__jobman_done(&m);
    goto out;
  }
  bool env_ok = true;
  for (uint32_t i = 0; i < m.envc; i++)
    env_ok = env_ok && gn_env_entry_valid(m.env[i]);
  if (m.argc == 0 || !env_ok) {
    gn__jobman_done(&m);
    r = GN_EINVAL;
    goto out;
  }
  *ret = m;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn__jobmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_jobmsg *ret) {
  gn_jobmsg m;
  memset(&m, 0, sizeof m);
  m.exit_code = -1;
  int r = gn_wire_decode(body, len, &m.doc);
  if (r < 0)
    return r;
  const msgpack_object *o = m.doc.root;
  if (o->type != MSGPACK_OBJECT_MAP) {
    r = GN_EINVAL;
    goto fail;
  }
  /* Optional fields are read when present; required ones per type below. */
  if (gn_wire_get(o, "job_id") && (r = gn_wire_get_str(o, "job_id", m.job_id, sizeof m.job_id)) < 0)
    goto fail;
  if (gn_wire_get(o, "lease_id") && (r = gn_wire_get_str(o, "lease_id", m.lease_id, sizeof m.lease_id)) < 0)
    goto fail;
  if (gn_wire_get(o, "reason") && (r = gn_wire_get_str(o, "reason", m.reason, sizeof m.reason)) < 0)
    goto fail;
  /* An id that is present must be one; "" stays "absent" for the checks
   * per type below. */
  if ((m.job_id[0] && !gn_id_valid(m.job_id)) || (m.lease_id[0] && !gn_id_valid(m.lease_id))) {
    r = GN_EINVAL;
    goto fail;
  }
  switch (type) {
  case GN_MSG_JOB_STATUS:
    if (!m.job_id[0] || (r = gn_wire_get_str(o, "state", m.state, sizeof m.state)) < 0 ||
        (r = gn_wire_get_i64(o, "exit_code", &m.exit_code)) < 0)
      goto bad;
    if (gn_wire_get(o, "digest") && (r = gn_wire_get_str(o, "digest", m.digest, sizeof m.digest)) < 0)
      goto fail;
    break;
  case GN_MSG_JOB_LOG:
    if (!m.job_id[0] || (r = gn_wire_get_u64(o, "offset", &m.offset)) < 0 ||
        (r = gn_wire_get_bin_ref(o, "data", GN_JOB_LOG_CHUNK, &m.data, &m.data_len)) < 0)
      goto bad;
    break;
  case GN_MSG_JOB_STOP:
    if (!m.job_id[0] || !m.lease_id[0])
      goto bad;
    break;
  case GN_MSG_LEASE_END:
    if ((r = gn_wire_get_i64(o, "end_s", &m.end_s)) < 0)
      goto bad;
    /* fall through */
  case GN_MSG_LEASE_REJECT:
  case GN_MSG_LEASE_RELEASE:
    if (!m.lease_id[0])
      goto bad;
    break;
  case GN_MSG_ERROR:
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

void gn__jobmsg_done(gn_jobmsg *m) {
  gn_wire_doc_done(&m->doc);
}
