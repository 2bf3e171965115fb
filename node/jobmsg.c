/* Encoding and bounded decoding of the lease-control and job messages the
 * daemon exchanges: job manifests, job status, log chunks, stop, and the
 * small lease reject/release/end notices. */
#include "jobmsg.h"

#include <gpunet/billing.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

void gn__jobmsg_strv_free(char **v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    free(v[i]);
}

void gn__jobmsg_strv_put(gn_wire_writer *w, const char *key, char *const *v, uint32_t n) {
  gn_wire_put_str(w, key);
  gn_wire_put_array(w, n);
  for (uint32_t i = 0; i < n; i++)
    gn_wire_put_str(w, v[i]);
}

int gn__jobmsg_strv_get(const msgpack_object *map, const char *key, uint32_t max_n, size_t max_len, int too_long,
                        char **out, uint32_t *ret_n) {
  const msgpack_object_array *a;
  int r = gn_wire_get_array(map, key, max_n, &a);
  if (r < 0)
    return r;
  uint32_t n = 0;
  for (; n < a->size; n++) {
    const msgpack_object *o = &a->ptr[n];
    if (o->type != MSGPACK_OBJECT_STR) {
      r = GN_EINVAL;
      goto fail;
    }
    if (o->via.str.size > max_len) {
      r = too_long;
      goto fail;
    }
    if (o->via.str.size && memchr(o->via.str.ptr, 0, o->via.str.size)) {
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
  gn__jobmsg_strv_free(out, n);
  return r;
}

bool gn__jobmsg_env_valid(char *const *env, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (!gn_env_entry_valid(env[i]))
      return false;
  return true;
}

int gn__jobmsg_decode_versioned(const uint8_t *body, size_t len, gn_wire_doc *ret_doc) {
  gn_wire_doc doc;
  uint64_t v = 0;
  int r = gn_wire_decode(body, len, &doc);
  if (r < 0)
    return r;
  if (doc.root->type != MSGPACK_OBJECT_MAP)
    r = GN_EINVAL;
  else if ((r = gn_wire_get_u64(doc.root, "v", &v)) == 0 && v != GN_PROTO_VERSION)
    r = GN_EVERSION;
  if (r < 0) {
    gn_wire_doc_done(&doc);
    return r;
  }
  *ret_doc = doc;
  return 0;
}

void gn__jobman_done(gn_jobman *m) {
  gn__jobmsg_strv_free(m->argv, m->argc);
  gn__jobmsg_strv_free(m->env, m->envc);
  m->argc = m->envc = 0;
  sodium_memzero(m->net.private_key, sizeof m->net.private_key);
}

int gn__jobman_encode(const gn_jobman *m, gn_wire_writer *w) {
  if (m->has_seed && (!m->output || m->seed_size == 0 || m->seed_size > GN_JOB_SEED_MAX))
    return GN_EINVAL;
  gn_wire_put_map(w, 12 + (m->output ? 1 : 0) + (m->has_net ? 1 : 0) + (m->has_seed ? 1 : 0));
  gn_wire_put_str(w, "job_id");
  gn_wire_put_str(w, m->job_id);
  gn_wire_put_str(w, "lease_id");
  gn_wire_put_str(w, m->lease_id);
  gn_wire_put_str(w, "image");
  gn_wire_put_str(w, m->image);
  gn__jobmsg_strv_put(w, "cmd", m->argv, m->argc);
  gn__jobmsg_strv_put(w, "env", m->env, m->envc);
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
  /* Absent unless used: an ordinary job's manifest is what it always was. */
  if (m->output) {
    gn_wire_put_str(w, "output");
    gn_wire_put_bool(w, true);
  }
  if (m->has_net) {
    const gn_jobman_net *t = &m->net;
    uint32_t np = t->npeers > GN_JOBMAN_MAX_PEERS ? GN_JOBMAN_MAX_PEERS : t->npeers;
    gn_wire_put_str(w, "net");
    gn_wire_put_map(w, 10);
    gn_wire_put_str(w, "group");
    gn_wire_put_str(w, t->group);
    gn_wire_put_str(w, "rank");
    gn_wire_put_u64(w, t->rank);
    gn_wire_put_str(w, "world");
    gn_wire_put_u64(w, t->world);
    gn_wire_put_str(w, "local_rank");
    gn_wire_put_u64(w, t->local_rank);
    gn_wire_put_str(w, "local_world");
    gn_wire_put_u64(w, t->local_world);
    gn_wire_put_str(w, "key");
    gn_wire_put_bin(w, t->private_key, sizeof t->private_key);
    gn_wire_put_str(w, "port");
    gn_wire_put_u64(w, t->listen_port);
    gn_wire_put_str(w, "master_port");
    gn_wire_put_u64(w, t->master_port);
    gn_wire_put_str(w, "subnet");
    gn_wire_put_u64(w, t->subnet_host);
    gn_wire_put_str(w, "peers");
    gn_wire_put_array(w, np);
    for (uint32_t i = 0; i < np; i++) {
      gn_wire_put_map(w, 3);
      gn_wire_put_str(w, "key");
      gn_wire_put_bin(w, t->peers[i].public_key, sizeof t->peers[i].public_key);
      gn_wire_put_str(w, "endpoint");
      gn_wire_put_str(w, t->peers[i].endpoint);
      gn_wire_put_str(w, "rank");
      gn_wire_put_u64(w, t->peers[i].rank);
    }
  }
  if (m->has_seed) {
    gn_wire_put_str(w, "seed");
    gn_wire_put_map(w, 2);
    gn_wire_put_str(w, "sha256");
    gn_wire_put_bin(w, m->seed_sha256, sizeof m->seed_sha256);
    gn_wire_put_str(w, "size");
    gn_wire_put_u64(w, m->seed_size);
  }
  return 0;
}

/* "net": every field required, each bounded; structure checked here (ranks
 * below world, peers distinct and not this rank, non-zero ports), the rest
 * (keys, endpoints, the provider's port range) by the provider. */
static int get_net(const msgpack_object *o, gn_jobman_net *t) {
  uint64_t port = 0, mport = 0;
  int r;
  if ((r = gn_wire_get_str(o, "group", t->group, sizeof t->group)) < 0 ||
      (r = gn_wire_get_u32(o, "rank", &t->rank)) < 0 || (r = gn_wire_get_u32(o, "world", &t->world)) < 0 ||
      (r = gn_wire_get_u32(o, "local_rank", &t->local_rank)) < 0 ||
      (r = gn_wire_get_u32(o, "local_world", &t->local_world)) < 0 ||
      (r = gn_wire_get_bin_exact(o, "key", t->private_key, sizeof t->private_key)) < 0 ||
      (r = gn_wire_get_u64(o, "port", &port)) < 0 || (r = gn_wire_get_u64(o, "master_port", &mport)) < 0 ||
      (r = gn_wire_get_u32(o, "subnet", &t->subnet_host)) < 0)
    return r;
  if (!gn_id_valid(t->group) || port == 0 || port > 65535 || mport == 0 || mport > 65535 || t->subnet_host > 255 ||
      t->world == 0 || t->world > GN_JOBMAN_MAX_PEERS + 1 || t->rank >= t->world || t->local_world == 0 ||
      t->local_world > t->world || t->local_rank >= t->local_world)
    return GN_EINVAL;
  t->listen_port = (uint16_t)port;
  t->master_port = (uint16_t)mport;
  const msgpack_object_array *a;
  if ((r = gn_wire_get_array(o, "peers", GN_JOBMAN_MAX_PEERS, &a)) < 0)
    return r;
  uint64_t seen[2] = {0, 0}; /* ranks < 64 */
  seen[t->rank / 64] |= 1ull << (t->rank % 64);
  for (uint32_t i = 0; i < a->size; i++) {
    const msgpack_object *p = &a->ptr[i];
    gn_jobman_peer *q = &t->peers[i];
    if (p->type != MSGPACK_OBJECT_MAP)
      return GN_EINVAL;
    if ((r = gn_wire_get_bin_exact(p, "key", q->public_key, sizeof q->public_key)) < 0 ||
        (r = gn_wire_get_str(p, "endpoint", q->endpoint, sizeof q->endpoint)) < 0 ||
        (r = gn_wire_get_u32(p, "rank", &q->rank)) < 0)
      return r;
    if (q->rank >= t->world || (seen[q->rank / 64] >> (q->rank % 64)) & 1)
      return GN_EINVAL;
    seen[q->rank / 64] |= 1ull << (q->rank % 64);
  }
  t->npeers = a->size;
  return 0;
}

int gn__jobman_decode(const uint8_t *body, size_t len, gn_jobman *ret) {
  gn_wire_doc doc;
  gn_jobman m;
  uint64_t pids = 0;
  memset(&m, 0, sizeof m);
  int r = gn__jobmsg_decode_versioned(body, len, &doc);
  if (r < 0)
    return r;
  const msgpack_object *o = doc.root;
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
  if ((r = gn__jobmsg_strv_get(o, "cmd", GN_JOB_MAX_ARGS, GN_JOB_MAX_ARG_LEN, GN_EINVAL, m.argv, &m.argc)) < 0)
    goto out;
  if ((r = gn__jobmsg_strv_get(o, "env", GN_JOB_MAX_ARGS, GN_JOB_MAX_ARG_LEN, GN_EINVAL, m.env, &m.envc)) < 0) {
    gn__jobman_done(&m);
    goto out;
  }
  if ((gn_wire_get(o, "output") && (r = gn_wire_get_bool(o, "output", &m.output)) < 0)) {
    gn__jobman_done(&m);
    goto out;
  }
  const msgpack_object *net = gn_wire_get(o, "net");
  if (net) {
    m.has_net = true;
    if (net->type != MSGPACK_OBJECT_MAP) {
      r = GN_EINVAL;
    } else {
      r = get_net(net, &m.net);
    }
    if (r < 0) {
      gn__jobman_done(&m);
      goto out;
    }
  }
  /* "seed": a tar /output starts as; only with output, bounded. */
  const msgpack_object *seed = gn_wire_get(o, "seed");
  if (seed) {
    m.has_seed = true;
    if (seed->type != MSGPACK_OBJECT_MAP ||
        (r = gn_wire_get_bin_exact(seed, "sha256", m.seed_sha256, sizeof m.seed_sha256)) < 0 ||
        (r = gn_wire_get_u64(seed, "size", &m.seed_size)) < 0 || !m.output || m.seed_size == 0 ||
        m.seed_size > GN_JOB_SEED_MAX) {
      r = r < 0 ? r : GN_EINVAL;
      gn__jobman_done(&m);
      goto out;
    }
  }
  if (m.argc == 0 || !gn__jobmsg_env_valid(m.env, m.envc)) {
    gn__jobman_done(&m);
    r = GN_EINVAL;
    goto out;
  }
  *ret = m;
out:
  sodium_memzero(m.net.private_key, sizeof m.net.private_key); /* *ret holds it now */
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
    if (gn_wire_get(o, "pulled")) {
      if ((r = gn_wire_get_u64(o, "pulled", &m.pulled)) < 0 ||
          (r = gn_wire_get_u64(o, "pull_total", &m.pull_total)) < 0)
        goto bad;
      m.has_pull = true;
    }
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
  case GN_MSG_JOB_OUTPUT_GET:
  case GN_MSG_JOB_SEED_GET:
    if (!m.job_id[0] || !m.lease_id[0] || (r = gn_wire_get_u64(o, "offset", &m.offset)) < 0)
      goto bad;
    break;
  case GN_MSG_JOB_OUTPUT:
  case GN_MSG_JOB_SEED:
    if (!m.job_id[0] || (r = gn_wire_get_u64(o, "offset", &m.offset)) < 0 ||
        (r = gn_wire_get_bin_ref(o, "data", GN_JOB_OUTPUT_CHUNK, &m.data, &m.data_len)) < 0 ||
        (r = gn_wire_get_bool(o, "eof", &m.eof)) < 0)
      goto bad;
    if (gn_wire_get(o, "size") && (r = gn_wire_get_u64(o, "size", &m.size)) < 0)
      goto fail;
    if (m.offset > UINT64_MAX - m.data_len)
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

void gn__joboutput_get_encode(gn_wire_writer *w, const char *job_id, const char *lease_id, uint64_t offset) {
  gn_wire_put_map(w, 3);
  gn_wire_put_str(w, "job_id");
  gn_wire_put_str(w, job_id);
  gn_wire_put_str(w, "lease_id");
  gn_wire_put_str(w, lease_id);
  gn_wire_put_str(w, "offset");
  gn_wire_put_u64(w, offset);
}

void gn__joboutput_encode(gn_wire_writer *w, const char *job_id, uint64_t offset, const uint8_t *data, size_t len,
                          bool eof, uint64_t size, const char *reason) {
  bool why = reason && reason[0];
  gn_wire_put_map(w, 5 + (why ? 1 : 0));
  gn_wire_put_str(w, "job_id");
  gn_wire_put_str(w, job_id);
  gn_wire_put_str(w, "offset");
  gn_wire_put_u64(w, offset);
  gn_wire_put_str(w, "data");
  gn_wire_put_bin(w, data, len > GN_JOB_OUTPUT_CHUNK ? GN_JOB_OUTPUT_CHUNK : len);
  gn_wire_put_str(w, "eof");
  gn_wire_put_bool(w, eof);
  gn_wire_put_str(w, "size");
  gn_wire_put_u64(w, size);
  if (why) {
    gn_wire_put_str(w, "reason");
    gn_wire_put_str(w, reason);
  }
}
