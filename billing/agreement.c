/* Lease agreements: the requester's signed lease request, and the provider's
 * acceptance that embeds the request's exact bytes, so the agreement carries
 * both signatures over the same terms. */
#include "billing_int.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>

#define REQUEST_MAX 4096 /* an encoded request is a few hundred bytes */
/* start_s is chosen by the provider alone; bounding it keeps every later
 * t_s - start_s and start_s + offset far from int64 overflow (2^40 s is
 * some 35000 years). */
#define START_S_MAX ((int64_t)1 << 40)

void gn_lease_terms_init(gn_lease_terms *t) {
  uint8_t r[8];
  char hex[17];
  randombytes_buf(r, sizeof(r));
  sodium_bin2hex(hex, sizeof(hex), r, sizeof(r));
  snprintf(t->lease_id, sizeof(t->lease_id), "l-%s", hex);
  randombytes_buf(t->nonce, sizeof(t->nonce));
}

static bool printable(const char *s, size_t min) {
  size_t n = strlen(s);
  if (n < min)
    return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
      return false;
  return true;
}

static bool currency_ok(const char *s) {
  size_t n = strnlen(s, 8);
  if (n == 0 || n >= 8)
    return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < 'A' || s[i] > 'Z')
      return false;
  return true;
}

/* The lease id names ledger rows and files on both sides, the offer id is
 * looked up: both follow the id grammar (an offer id may be empty). */
static bool terms_ok(const gn_lease_terms *t) {
  return gn__lease_id_ok(t->lease_id) && gn_id_valid(t->lease_id) && memchr(t->offer_id, 0, sizeof(t->offer_id)) &&
         (!t->offer_id[0] || gn_id_valid(t->offer_id)) && memchr(t->gpu_model, 0, sizeof(t->gpu_model)) &&
         printable(t->gpu_model, 1) && t->count >= 1 && t->count <= GN_LEASE_MAX_GPUS && currency_ok(t->currency) &&
         t->max_s >= 1 && t->max_s <= GN_INVOICE_MAX_S;
}

int gn_lease_request_seal(const gn_identity *requester, const gn_lease_terms *t, gn_buf *ret_env) {
  gn_wire_writer w;
  gn_buf body = {0};
  int r;
  if (!requester || !t || !ret_env || !terms_ok(t))
    return GN_EINVAL;
  if (memcmp(requester->pk, t->requester, GN_PK_LEN) != 0)
    return GN_EPERM;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 13);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, t->lease_id);
  gn_wire_put_str(&w, "provider");
  gn_wire_put_bin(&w, t->provider, GN_PK_LEN);
  gn_wire_put_str(&w, "requester");
  gn_wire_put_bin(&w, t->requester, GN_PK_LEN);
  gn_wire_put_str(&w, "offer_id");
  gn_wire_put_str(&w, t->offer_id);
  gn_wire_put_str(&w, "gpu_model");
  gn_wire_put_str(&w, t->gpu_model);
  gn_wire_put_str(&w, "count");
  gn_wire_put_u64(&w, t->count);
  gn_wire_put_str(&w, "price_uper_hour");
  gn_wire_put_u64(&w, t->price_uper_hour);
  gn_wire_put_str(&w, "currency");
  gn_wire_put_str(&w, t->currency);
  gn_wire_put_str(&w, "max_s");
  gn_wire_put_u64(&w, t->max_s);
  gn_wire_put_str(&w, "interval_s");
  gn_wire_put_u64(&w, t->interval_s);
  gn_wire_put_str(&w, "requested_s");
  gn_wire_put_i64(&w, t->requested_s);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, t->nonce, sizeof(t->nonce));
  gn_wire_put_str(&w, "simulated");
  gn_wire_put_bool(&w, t->simulated);
  r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(requester, GN_MSG_LEASE_REQUEST, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

static int terms_decode(const uint8_t *body, size_t len, gn_lease_terms *ret) {
  gn_wire_doc doc;
  gn_lease_terms t;
  uint64_t count = 0, interval = 0;
  int r;
  memset(&t, 0, sizeof(t));
  if ((r = gn_wire_decode(body, len, &doc)) < 0)
    return r;
  const msgpack_object *m = doc.root;
  r = GN_EINVAL;
  if (m->type != MSGPACK_OBJECT_MAP)
    goto out;
  if (gn_wire_get_str(m, "lease_id", t.lease_id, sizeof(t.lease_id)) < 0 ||
      gn_wire_get_bin_exact(m, "provider", t.provider, GN_PK_LEN) < 0 ||
      gn_wire_get_bin_exact(m, "requester", t.requester, GN_PK_LEN) < 0 ||
      gn_wire_get_str(m, "offer_id", t.offer_id, sizeof(t.offer_id)) < 0 ||
      gn_wire_get_str(m, "gpu_model", t.gpu_model, sizeof(t.gpu_model)) < 0 ||
      gn_wire_get_u64(m, "count", &count) < 0 || gn_wire_get_u64(m, "price_uper_hour", &t.price_uper_hour) < 0 ||
      gn_wire_get_str(m, "currency", t.currency, sizeof(t.currency)) < 0 || gn_wire_get_u64(m, "max_s", &t.max_s) < 0 ||
      gn_wire_get_u64(m, "interval_s", &interval) < 0 || gn_wire_get_i64(m, "requested_s", &t.requested_s) < 0 ||
      gn_wire_get_bin_exact(m, "nonce", t.nonce, sizeof(t.nonce)) < 0 ||
      gn_wire_get_bool(m, "simulated", &t.simulated) < 0)
    goto out;
  if (count > GN_LEASE_MAX_GPUS || interval > UINT32_MAX)
    goto out;
  t.count = (uint32_t)count;
  t.interval_s = (uint32_t)interval;
  if (!terms_ok(&t))
    goto out;
  *ret = t;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn_lease_request_open(const uint8_t *env, size_t len, gn_lease_terms *ret) {
  gn_envelope e;
  gn_lease_terms t;
  int r;
  if (!env || !ret)
    return GN_EINVAL;
  if ((r = gn_envelope_open(env, len, &e)) < 0)
    return r;
  if (e.type != GN_MSG_LEASE_REQUEST)
    return GN_EPROTO;
  if ((r = terms_decode(e.body, e.body_len, &t)) < 0)
    return r;
  if (memcmp(e.signer, t.requester, GN_PK_LEN) != 0)
    return GN_EPERM;
  *ret = t;
  return 0;
}

int gn_agreement_seal(const gn_identity *provider, const uint8_t *request_env, size_t request_len, int64_t start_s,
                      const char *const *gpus, uint32_t gpu_count, gn_buf *ret_env) {
  gn_lease_terms t;
  gn_wire_writer w;
  gn_buf body = {0};
  int r;
  if (!provider || !request_env || !ret_env || (gpu_count && !gpus) || request_len > REQUEST_MAX)
    return GN_EINVAL;
  if ((r = gn_lease_request_open(request_env, request_len, &t)) < 0)
    return r;
  if (memcmp(provider->pk, t.provider, GN_PK_LEN) != 0)
    return GN_EPERM;
  if (gpu_count != t.count || start_s < 0 || start_s > START_S_MAX)
    return GN_EINVAL;
  for (uint32_t i = 0; i < gpu_count; i++)
    if (!gpus[i] || strlen(gpus[i]) >= 64 || !printable(gpus[i], 1))
      return GN_EINVAL;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "request");
  gn_wire_put_bin(&w, request_env, request_len);
  gn_wire_put_str(&w, "start_s");
  gn_wire_put_i64(&w, start_s);
  gn_wire_put_str(&w, "gpus");
  gn_wire_put_array(&w, gpu_count);
  for (uint32_t i = 0; i < gpu_count; i++)
    gn_wire_put_str(&w, gpus[i]);
  r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(provider, GN_MSG_LEASE_ACCEPT, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

/* Names a key's signer for a message: "gn...". */
static void node_id(const uint8_t pk[GN_PK_LEN], char out[GN_NODE_ID_STRLEN]) {
  gn_node_id_format(pk, out);
}

static int fail_code(int code, char *reason, size_t cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail_code(int code, char *reason, size_t cap, const char *fmt, ...) {
  if (reason && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, cap, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* Decodes the agreement body {request, start_s, gpus} into ret->start_s and
 * ret->gpus, and hands back the embedded request by reference into doc. On
 * success the caller releases doc; on failure nothing is held. */
static int agreement_body_decode(const uint8_t *body, size_t len, gn_wire_doc *doc, gn_agreement *ret,
                                 const uint8_t **ret_req, size_t *ret_req_len) {
  const msgpack_object_array *arr;
  int r;
  if ((r = gn_wire_decode(body, len, doc)) < 0)
    return r;
  const msgpack_object *m = doc->root;
  r = GN_EINVAL;
  if (m->type != MSGPACK_OBJECT_MAP)
    goto fail;
  if ((r = gn_wire_get_bin_ref(m, "request", REQUEST_MAX, ret_req, ret_req_len)) < 0 ||
      (r = gn_wire_get_i64(m, "start_s", &ret->start_s)) < 0 ||
      (r = gn_wire_get_array(m, "gpus", GN_LEASE_MAX_GPUS, &arr)) < 0)
    goto fail;
  r = GN_EINVAL;
  ret->gpu_count = arr->size;
  for (uint32_t i = 0; i < arr->size; i++) {
    const msgpack_object *o = &arr->ptr[i];
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size >= sizeof(ret->gpus[i]))
      goto fail;
    memcpy(ret->gpus[i], o->via.str.ptr, o->via.str.size);
    ret->gpus[i][o->via.str.size] = 0;
    if (!printable(ret->gpus[i], 1) || strlen(ret->gpus[i]) != o->via.str.size)
      goto fail;
  }
  return 0;
fail:
  gn_wire_doc_done(doc);
  return r;
}

int gn__agreement_open(const uint8_t *env, size_t len, gn_agreement *ret, char *reason, size_t cap) {
  gn_envelope e;
  gn_agreement ag;
  gn_wire_doc doc;
  bool have_doc = false;
  const uint8_t *req = NULL;
  size_t req_len = 0;
  char a[GN_NODE_ID_STRLEN], b[GN_NODE_ID_STRLEN];
  int r;
  if (!env || !ret)
    return GN_EINVAL;
  memset(&ag, 0, sizeof(ag));
  r = gn_envelope_open(env, len, &e);
  if (r == GN_ESIG) {
    /* Name the provider the agreement claims, if it can be read at all. */
    uint8_t *body = NULL;
    size_t blen = 0;
    uint32_t type;
    uint8_t signer[GN_PK_LEN];
    gn_lease_terms t;
    bool named = false;
    if (gn__envelope_peek(env, len, &type, signer, &body, &blen) == 0) {
      if (agreement_body_decode(body, blen, &doc, &ag, &req, &req_len) == 0) {
        if (gn_lease_request_open(req, req_len, &t) == 0) {
          node_id(t.provider, a);
          named = true;
        }
        gn_wire_doc_done(&doc);
      }
      free(body);
    }
    if (named)
      return fail_code(GN_ESIG, reason, cap, "agreement signature does not verify against provider %s", a);
    return fail_code(GN_ESIG, reason, cap, "agreement signature does not verify");
  }
  if (r < 0)
    return fail_code(r, reason, cap, "agreement envelope is malformed (%s)", gn_strerror(r));
  if (e.type != GN_MSG_LEASE_ACCEPT)
    return fail_code(GN_EPROTO, reason, cap, "agreement envelope has type %u, not lease_accept", e.type);
  if ((r = agreement_body_decode(e.body, e.body_len, &doc, &ag, &req, &req_len)) < 0)
    return fail_code(r, reason, cap, "agreement body is malformed (%s)", gn_strerror(r));
  have_doc = true;
  if ((r = gn_lease_request_open(req, req_len, &ag.terms)) < 0) {
    gn_lease_terms t;
    uint8_t *body = NULL;
    size_t blen = 0;
    uint32_t type;
    uint8_t signer[GN_PK_LEN];
    if (r == GN_ESIG && gn__envelope_peek(req, req_len, &type, signer, &body, &blen) == 0 &&
        terms_decode(body, blen, &t) == 0) {
      node_id(t.requester, a);
      fail_code(r, reason, cap, "lease request signature does not verify against requester %s", a);
    } else if (r == GN_EPERM) {
      fail_code(r, reason, cap, "lease request is not signed by the requester named in its terms");
    } else {
      fail_code(r, reason, cap, "lease request inside the agreement does not verify (%s)", gn_strerror(r));
    }
    free(body);
    goto out;
  }
  if (memcmp(e.signer, ag.terms.provider, GN_PK_LEN) != 0) {
    node_id(e.signer, a);
    node_id(ag.terms.provider, b);
    r = fail_code(GN_EPERM, reason, cap, "agreement is signed by %s, not by the provider named in the terms %s", a, b);
    goto out;
  }
  if (ag.start_s < 0 || ag.start_s > START_S_MAX) {
    r = fail_code(GN_EINVAL, reason, cap, "agreement start_s %" PRId64 " is out of range", ag.start_s);
    goto out;
  }
  if (ag.gpu_count != ag.terms.count) {
    r = fail_code(GN_EINVAL, reason, cap, "agreement grants %u GPUs but the request asked for %u", ag.gpu_count,
                  ag.terms.count);
    goto out;
  }
  *ret = ag;
  r = 0;
out:
  if (have_doc)
    gn_wire_doc_done(&doc);
  return r;
}

int gn_agreement_open(const uint8_t *env, size_t len, gn_agreement *ret) {
  return gn__agreement_open(env, len, ret, NULL, 0);
}

int gn__envelope_peek(const uint8_t *buf, size_t len, uint32_t *ret_type, uint8_t ret_signer[GN_PK_LEN],
                      uint8_t **ret_body, size_t *ret_body_len) {
  gn_wire_doc doc;
  int r;
  if ((r = gn_wire_decode(buf, len, &doc)) < 0)
    return r;
  const msgpack_object *o = doc.root;
  r = GN_EINVAL;
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 5)
    goto out;
  const msgpack_object *a = o->via.array.ptr;
  if (a[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[1].via.u64 > UINT32_MAX || a[2].type != MSGPACK_OBJECT_BIN ||
      a[2].via.bin.size != GN_PK_LEN || a[3].type != MSGPACK_OBJECT_BIN)
    goto out;
  uint8_t *body = malloc(a[3].via.bin.size ? a[3].via.bin.size : 1);
  if (!body) {
    r = GN_ENOMEM;
    goto out;
  }
  if (a[3].via.bin.size) /* an empty bin has a NULL ptr in msgpack-c */
    memcpy(body, a[3].via.bin.ptr, a[3].via.bin.size);
  *ret_type = (uint32_t)a[1].via.u64;
  memcpy(ret_signer, a[2].via.bin.ptr, GN_PK_LEN);
  *ret_body = body;
  *ret_body_len = a[3].via.bin.size;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}
