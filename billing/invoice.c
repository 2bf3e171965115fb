/* Invoices: the provider's signed, cumulative bill built from the ledger, the
 * requester's check of it, and the requester's countersignature or
 * rejection. */
#include "billing_int.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>

#define AGREEMENT_MAX 16384 /* request (<= 4 KiB) + 16 GPU ids + signatures */

int gn__invoice_body_encode(const gn__invoice_body *b, gn_buf *ret) {
  gn_wire_writer w;
  int r;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 11);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, b->lease_id);
  gn_wire_put_str(&w, "agreement");
  gn_wire_put_bin(&w, b->agreement, b->agreement_len);
  gn_wire_put_str(&w, "start_s");
  gn_wire_put_i64(&w, b->start_s);
  gn_wire_put_str(&w, "end_s");
  gn_wire_put_i64(&w, b->end_s);
  gn_wire_put_str(&w, "end_reason");
  gn_wire_put_str(&w, b->end_reason);
  gn_wire_put_str(&w, "ticks");
  gn_wire_put_bin(&w, b->ticks, b->ticks_len);
  gn_wire_put_str(&w, "chain_head");
  gn_wire_put_bin(&w, b->chain_head, GN__HASH_LEN);
  gn_wire_put_str(&w, "seconds");
  gn_wire_put_u64(&w, b->seconds);
  gn_wire_put_str(&w, "price_uper_hour");
  gn_wire_put_u64(&w, b->price_uper_hour);
  gn_wire_put_str(&w, "currency");
  gn_wire_put_str(&w, b->currency);
  gn_wire_put_str(&w, "total_micro");
  gn_wire_put_u64(&w, b->total_micro);
  r = gn_wire_writer_take(&w, ret);
  gn_wire_writer_done(&w);
  return r;
}

static bool printable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
      return false;
  return true;
}

int gn__invoice_body_decode(const uint8_t *body, size_t len, gn_wire_doc *doc, gn__invoice_body *ret, char *reason,
                            size_t cap) {
  gn__invoice_body b;
  const char *field = NULL;
  int r;
  memset(&b, 0, sizeof(b));
  if ((r = gn_wire_decode(body, len, doc)) < 0)
    return gn__fail(reason, cap, "invoice body is not valid msgpack (%s)", gn_strerror(r));
  const msgpack_object *m = doc->root;
  /* Each accessor is tried in turn so the reason can name the bad field. */
  if (m->type != MSGPACK_OBJECT_MAP)
    field = "(body is not a map)";
  else if (gn_wire_get_str(m, "lease_id", b.lease_id, sizeof(b.lease_id)) < 0 || !gn_id_valid(b.lease_id))
    field = "lease_id";
  else if (gn_wire_get_bin_ref(m, "agreement", AGREEMENT_MAX, &b.agreement, &b.agreement_len) < 0)
    field = "agreement";
  else if (gn_wire_get_i64(m, "start_s", &b.start_s) < 0)
    field = "start_s";
  else if (gn_wire_get_i64(m, "end_s", &b.end_s) < 0)
    field = "end_s";
  else if (gn_wire_get_str(m, "end_reason", b.end_reason, sizeof(b.end_reason)) < 0 || !printable(b.end_reason))
    field = "end_reason";
  else if (gn_wire_get_bin_ref(m, "ticks", (size_t)GN__INVOICE_MAX_TICKS * GN__TICKREC_LEN, &b.ticks, &b.ticks_len) < 0)
    field = "ticks";
  else if (gn_wire_get_bin_exact(m, "chain_head", b.chain_head, GN__HASH_LEN) < 0)
    field = "chain_head";
  else if (gn_wire_get_u64(m, "seconds", &b.seconds) < 0)
    field = "seconds";
  else if (gn_wire_get_u64(m, "price_uper_hour", &b.price_uper_hour) < 0)
    field = "price_uper_hour";
  else if (gn_wire_get_str(m, "currency", b.currency, sizeof(b.currency)) < 0)
    field = "currency";
  else if (gn_wire_get_u64(m, "total_micro", &b.total_micro) < 0)
    field = "total_micro";
  if (field) {
    gn_wire_doc_done(doc);
    return gn__fail(reason, cap, "invoice body is malformed: field %s is missing, of the wrong type or too long",
                    field);
  }
  *ret = b;
  return 0;
}

void gn__invoice_view_done(gn__invoice_view *v) {
  if (v)
    gn_wire_doc_done(&v->doc);
}

/* Reads the agreement an invoice embeds without trusting the invoice's own
 * signature (the agreement carries both parties' signatures by itself): for
 * naming the expected signer in messages, and for rejecting an invoice whose
 * signature is broken. */
static int invoice_agreement_peek(const uint8_t *env, size_t len, gn_agreement *ret_ag, char *ret_lease_id) {
  uint8_t *body = NULL;
  size_t blen = 0;
  uint32_t type;
  uint8_t signer[GN_PK_LEN];
  gn_wire_doc doc;
  gn__invoice_body b;
  int r;
  if ((r = gn__envelope_peek(env, len, &type, signer, &body, &blen)) < 0)
    return r;
  if (type != GN_MSG_INVOICE) {
    r = GN_EPROTO;
    goto out;
  }
  if ((r = gn__invoice_body_decode(body, blen, &doc, &b, NULL, 0)) < 0)
    goto out;
  r = gn_agreement_open(b.agreement, b.agreement_len, ret_ag);
  if (r == 0 && ret_lease_id)
    memcpy(ret_lease_id, b.lease_id, GN_LEASE_ID_STRLEN);
  gn_wire_doc_done(&doc);
out:
  free(body);
  return r;
}

/* Checks the invoice body against its agreement and walks the tick chain.
 * v->env, v->body and v->agreement are set. */
static int verify_body(gn__invoice_view *v, char *reason, size_t cap) {
  const gn__invoice_body *b = &v->body;
  const gn_lease_terms *t = &v->agreement.terms;
  char pa[32], pb[32];
  if (strcmp(b->lease_id, t->lease_id) != 0)
    return gn__fail(reason, cap, "lease_id is %s but the agreement is for lease %s", b->lease_id, t->lease_id);
  if (b->start_s != v->agreement.start_s)
    return gn__fail(reason, cap, "start_s is %" PRId64 " but the agreement started at %" PRId64, b->start_s,
                    v->agreement.start_s);
  if (b->end_s < b->start_s)
    return gn__fail(reason, cap, "end_s %" PRId64 " is before start_s %" PRId64, b->end_s, b->start_s);
  if (b->price_uper_hour != t->price_uper_hour) {
    gn_price_format(b->price_uper_hour, pa, sizeof(pa));
    gn_price_format(t->price_uper_hour, pb, sizeof(pb));
    return gn__fail(reason, cap,
                    "price_uper_hour is %" PRIu64 " (%s %s/GPU-hour) but the agreement says %" PRIu64
                    " (%s %s/GPU-hour)",
                    b->price_uper_hour, pa, b->currency, t->price_uper_hour, pb, t->currency);
  }
  if (strcmp(b->currency, t->currency) != 0)
    return gn__fail(reason, cap, "currency is %s but the agreement says %s", b->currency, t->currency);
  if (b->ticks_len % GN__TICKREC_LEN)
    return gn__fail(reason, cap, "ticks is %zu bytes, not a whole number of %d-byte records", b->ticks_len,
                    GN__TICKREC_LEN);
  uint64_t n = b->ticks_len / GN__TICKREC_LEN;
  if (n > t->max_s)
    return gn__fail(reason, cap, "invoice bills %" PRIu64 " seconds but the lease allows at most %" PRIu64, n,
                    t->max_s);
  if (b->seconds != n)
    return gn__fail(reason, cap, "seconds is %" PRIu64 " but the invoice lists %" PRIu64 " ticks", b->seconds, n);

  uint8_t h[GN__HASH_LEN];
  int64_t prev_t = b->start_s;
  uint64_t gpu_seconds = 0;
  gn__genesis(b->agreement, b->agreement_len, h);
  for (uint64_t i = 0; i < n; i++) {
    gn__tickrec rec;
    uint64_t want = i + 1;
    gn__tickrec_get(b->ticks + i * GN__TICKREC_LEN, &rec);
    if (rec.idx > want)
      return gn__fail(reason, cap, "second %" PRIu64 " is missing (the next tick listed is second %" PRIu32 ")", want,
                      rec.idx);
    if (rec.idx < want)
      return gn__fail(reason, cap, "second %" PRIu32 " appears again after second %" PRIu64 " (ticks out of order)",
                      rec.idx, want - 1);
    int64_t ts = b->start_s + (int64_t)rec.t_off;
    if (ts < prev_t)
      return gn__fail(reason, cap, "second %" PRIu64 ": t_s %" PRId64 " is before the previous second's %" PRId64, want,
                      ts, prev_t);
    if (ts > b->end_s)
      return gn__fail(reason, cap, "second %" PRIu64 ": t_s %" PRId64 " is after end_s %" PRId64, want, ts, b->end_s);
    if (rec.gpus > t->count)
      return gn__fail(reason, cap, "second %" PRIu64 ": gpus is %u but the lease has %" PRIu32 " GPUs", want, rec.gpus,
                      t->count);
    if (rec.util > 100 && rec.util != GN_UTIL_UNKNOWN)
      return gn__fail(reason, cap, "second %" PRIu64 ": util %u is not a percentage", want, rec.util);
    gn__tick_hash(h, b->lease_id, want, ts, rec.gpus, rec.util, h);
    if (rec.tag != (uint16_t)((h[0] << 8) | h[1]))
      return gn__fail(reason, cap, "second %" PRIu64 ": hash chain broken (tick fields or order changed)", want);
    prev_t = ts;
    gpu_seconds += rec.gpus;
  }
  if (memcmp(h, b->chain_head, GN__HASH_LEN) != 0)
    return gn__fail(reason, cap,
                    "chain_head does not match the hash chain recomputed from the %" PRIu64 " ticks (a tick was "
                    "changed, added or removed)",
                    n);
  uint64_t want_total = gn_price_cost(b->price_uper_hour, 1, gpu_seconds);
  if (b->total_micro != want_total) {
    gn_price_format(b->price_uper_hour, pa, sizeof(pa));
    if (gpu_seconds == n * t->count)
      return gn__fail(reason, cap,
                      "total_micro is %" PRIu64 " but %" PRIu64 " seconds at %s %s/GPU-hour for %" PRIu32
                      " GPU%s cost %" PRIu64,
                      b->total_micro, n, pa, b->currency, t->count, t->count == 1 ? "" : "s", want_total);
    return gn__fail(reason, cap,
                    "total_micro is %" PRIu64 " but %" PRIu64 " seconds (%" PRIu64
                    " GPU-seconds) at %s %s/GPU-hour cost %" PRIu64,
                    b->total_micro, n, gpu_seconds, pa, b->currency, want_total);
  }
  v->gpu_seconds = gpu_seconds;
  return 0;
}

int gn__invoice_verify(const uint8_t *env, size_t len, const uint8_t *expect_agreement, size_t expect_len,
                       gn__invoice_view *ret, char *reason, size_t cap) {
  gn__invoice_view v;
  char a[GN_NODE_ID_STRLEN], b[GN_NODE_ID_STRLEN], why[256];
  int r;
  if (!env || !ret)
    return gn__fail(reason, cap, "no invoice given");
  memset(&v, 0, sizeof(v));
  r = gn_envelope_open(env, len, &v.env);
  if (r == GN_ESIG) {
    gn_agreement ag;
    if (invoice_agreement_peek(env, len, &ag, NULL) == 0) {
      gn_node_id_format(ag.terms.provider, a);
      return gn__fail(reason, cap, "invoice signature does not verify against provider %s", a);
    }
    return gn__fail(reason, cap, "invoice signature does not verify");
  }
  if (r < 0)
    return gn__fail(reason, cap, "invoice envelope is malformed (%s)", gn_strerror(r));
  if (v.env.type != GN_MSG_INVOICE) {
    const char *name = gn_msg_type_name(v.env.type);
    return gn__fail(reason, cap, "envelope is a %s message, not an invoice", name ? name : "unknown");
  }
  if ((r = gn__invoice_body_decode(v.env.body, v.env.body_len, &v.doc, &v.body, reason, cap)) < 0)
    return r;
  if (expect_agreement &&
      (v.body.agreement_len != expect_len || memcmp(v.body.agreement, expect_agreement, expect_len) != 0)) {
    r = gn__fail(reason, cap, "the invoice (lease %s) is for another agreement than the one held", v.body.lease_id);
    goto out;
  }
  if ((r = gn__agreement_open(v.body.agreement, v.body.agreement_len, &v.agreement, why, sizeof(why))) < 0) {
    r = gn__fail(reason, cap, "the invoice's agreement does not verify: %s", why);
    goto out;
  }
  if (memcmp(v.env.signer, v.agreement.terms.provider, GN_PK_LEN) != 0) {
    gn_node_id_format(v.env.signer, a);
    gn_node_id_format(v.agreement.terms.provider, b);
    r = gn__fail(reason, cap, "invoice is signed by %s, not by the lease's provider %s", a, b);
    goto out;
  }
  if ((r = verify_body(&v, reason, cap)) < 0)
    goto out;
  gn__invoice_hash(env, len, v.hash);
  *ret = v;
  return 0;
out:
  gn_wire_doc_done(&v.doc);
  return r;
}

static void summary_fill(const gn_agreement *ag, const gn__invoice_body *b, const uint8_t hash[GN__HASH_LEN],
                         gn_invoice_summary *ret) {
  gn_invoice_summary s;
  memset(&s, 0, sizeof(s));
  memcpy(s.lease_id, b->lease_id, sizeof(s.lease_id));
  gn__invoice_id(hash, s.invoice_id);
  memcpy(s.provider, ag->terms.provider, GN_PK_LEN);
  memcpy(s.requester, ag->terms.requester, GN_PK_LEN);
  memcpy(s.gpu_model, ag->terms.gpu_model, sizeof(s.gpu_model));
  s.gpus = ag->terms.count;
  s.price_uper_hour = b->price_uper_hour;
  memcpy(s.currency, b->currency, sizeof(s.currency));
  s.seconds = b->seconds;
  s.total_micro = b->total_micro;
  s.start_s = b->start_s;
  s.end_s = b->end_s;
  memcpy(s.chain_head, b->chain_head, sizeof(s.chain_head));
  *ret = s;
}

void gn__invoice_summary_fill(const gn__invoice_view *v, gn_invoice_summary *ret) {
  summary_fill(&v->agreement, &v->body, v->hash, ret);
}

int gn_invoice_summarize(const uint8_t *invoice_env, size_t len, gn_invoice_summary *ret) {
  gn_envelope e;
  gn_wire_doc doc;
  gn__invoice_body b;
  gn_agreement ag;
  uint8_t hash[GN__HASH_LEN];
  int r;
  if (!invoice_env || !ret)
    return GN_EINVAL;
  if ((r = gn_envelope_open(invoice_env, len, &e)) < 0)
    return r;
  if (e.type != GN_MSG_INVOICE)
    return GN_EPROTO;
  if (gn__invoice_body_decode(e.body, e.body_len, &doc, &b, NULL, 0) < 0)
    return GN_EINVAL;
  if ((r = gn_agreement_open(b.agreement, b.agreement_len, &ag)) < 0)
    goto out;
  r = GN_EPERM;
  if (memcmp(e.signer, ag.terms.provider, GN_PK_LEN) != 0)
    goto out;
  r = GN_EINVAL;
  if (strcmp(b.lease_id, ag.terms.lease_id) != 0)
    goto out;
  gn__invoice_hash(invoice_env, len, hash);
  summary_fill(&ag, &b, hash, ret);
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn_invoice_check(const uint8_t *invoice_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                     uint64_t observed_s, uint64_t tolerance_s, gn_invoice_summary *ret, char *reason, size_t cap) {
  gn__invoice_view v;
  int r;
  if (reason && cap)
    reason[0] = 0;
  if (!agreement_env)
    return gn__fail(reason, cap, "no agreement to check the invoice against");
  if ((r = gn__invoice_verify(invoice_env, len, agreement_env, agreement_len, &v, reason, cap)) < 0)
    return r;
  uint64_t allowed = observed_s > UINT64_MAX - tolerance_s ? UINT64_MAX : observed_s + tolerance_s;
  if (v.body.seconds > allowed) {
    r = gn__fail(reason, cap,
                 "invoice bills %" PRIu64 " seconds but only %" PRIu64 " were observed (tolerance %" PRIu64 " s)",
                 v.body.seconds, observed_s, tolerance_s);
    goto out;
  }
  if (ret)
    gn__invoice_summary_fill(&v, ret);
  r = 0;
out:
  gn__invoice_view_done(&v);
  return r;
}

int gn_invoice_check_continues(const uint8_t *invoice_env, size_t len, const uint8_t *earlier_env, size_t earlier_len,
                               char *reason, size_t cap) {
  gn__invoice_view now, before;
  char why[384];
  int r;
  if (reason && cap)
    reason[0] = 0;
  if ((r = gn__invoice_verify(earlier_env, earlier_len, NULL, 0, &before, why, sizeof(why))) < 0)
    return gn__fail(reason, cap, "the earlier invoice does not verify: %s", why);
  if ((r = gn__invoice_verify(invoice_env, len, before.body.agreement, before.body.agreement_len, &now, reason, cap)) <
      0)
    goto out_before;
  const uint64_t n = before.body.seconds;
  if (now.body.seconds < n) {
    r = gn__fail(reason, cap,
                 "invoice bills %" PRIu64 " seconds, fewer than the %" PRIu64 " of the invoice accepted earlier",
                 now.body.seconds, n);
    goto out;
  }
  /* Same agreement, so the same genesis and start: identical records give an
   * identical chain, and the first differing record is the second to name. */
  for (uint64_t i = 0; i < n; i++) {
    if (memcmp(now.body.ticks + i * GN__TICKREC_LEN, before.body.ticks + i * GN__TICKREC_LEN, GN__TICKREC_LEN) != 0) {
      r = gn__fail(reason, cap, "second %" PRIu64 " differs from the invoice accepted earlier", i + 1);
      goto out;
    }
  }
  r = 0;
out:
  gn__invoice_view_done(&now);
out_before:
  gn__invoice_view_done(&before);
  return r;
}

/* --- building ------------------------------------------------------------*/

typedef struct seal_ctx {
  uint8_t *recs;
  uint64_t n, cap;
  int64_t start_s;
  int64_t last_t;
  uint64_t gpu_seconds;
  uint8_t head[GN__HASH_LEN];
} seal_ctx;

static int seal_tick(const gn_tick *t, void *arg) {
  seal_ctx *c = arg;
  gn__tickrec rec;
  if (c->n >= c->cap || t->t_s < c->start_s || t->t_s - c->start_s > (int64_t)UINT32_MAX || t->gpus > 255)
    return GN_EAUDIT; /* the ledger never stores such rows */
  rec.idx = (uint32_t)t->idx;
  rec.t_off = (uint32_t)(t->t_s - c->start_s);
  rec.gpus = (uint8_t)t->gpus;
  rec.util = t->util;
  rec.tag = (uint16_t)((t->hash[0] << 8) | t->hash[1]);
  gn__tickrec_put(c->recs + c->n * GN__TICKREC_LEN, &rec);
  c->n++;
  c->last_t = t->t_s;
  c->gpu_seconds += t->gpus;
  memcpy(c->head, t->hash, GN__HASH_LEN);
  return 0;
}

int gn_invoice_seal(gn_ledger *l, const gn_identity *provider, const char *lease_id, int64_t end_s,
                    const char *end_reason, gn_buf *ret_env) {
  gn_buf ag_env = {0}, body = {0};
  gn_agreement ag;
  gn__invoice_body b;
  seal_ctx c;
  uint64_t count = 0;
  int r;
  memset(&c, 0, sizeof(c));
  if (!l || !provider || !lease_id || !end_reason || !ret_env || strlen(end_reason) >= sizeof(b.end_reason) ||
      !printable(end_reason))
    return GN_EINVAL;
  if ((r = gn_ledger_agreement(l, lease_id, &ag_env)) < 0)
    goto out;
  if ((r = gn_agreement_open(ag_env.data, ag_env.len, &ag)) < 0)
    goto out;
  r = GN_EPERM;
  if (memcmp(provider->pk, ag.terms.provider, GN_PK_LEN) != 0)
    goto out;
  if ((r = gn_ledger_tick_count(l, lease_id, &count)) < 0)
    goto out;
  r = GN_EAUDIT;
  if (count > ag.terms.max_s)
    goto out;
  c.cap = count;
  c.start_s = ag.start_s;
  c.last_t = ag.start_s;
  gn__genesis(ag_env.data, ag_env.len, c.head);
  r = GN_ENOMEM;
  if (!(c.recs = malloc(count ? count * GN__TICKREC_LEN : 1)))
    goto out;
  if ((r = gn_ledger_each_tick(l, lease_id, seal_tick, &c, NULL, 0)) < 0)
    goto out;
  memset(&b, 0, sizeof(b));
  snprintf(b.lease_id, sizeof(b.lease_id), "%s", ag.terms.lease_id);
  b.agreement = ag_env.data;
  b.agreement_len = ag_env.len;
  b.start_s = ag.start_s;
  b.end_s = end_s;
  if (b.end_s < c.last_t) /* the wall clock stepped back since the last tick */
    b.end_s = c.last_t;
  snprintf(b.end_reason, sizeof(b.end_reason), "%s", end_reason);
  b.ticks = c.recs;
  b.ticks_len = c.n * GN__TICKREC_LEN;
  memcpy(b.chain_head, c.head, GN__HASH_LEN);
  b.seconds = c.n;
  b.price_uper_hour = ag.terms.price_uper_hour;
  memcpy(b.currency, ag.terms.currency, sizeof(b.currency));
  b.total_micro = gn_price_cost(ag.terms.price_uper_hour, 1, c.gpu_seconds);
  if ((r = gn__invoice_body_encode(&b, &body)) < 0)
    goto out;
  r = GN_ETOOBIG;
  if (body.len > GN_MSG_MAX - 256) /* room for the envelope around it */
    goto out;
  r = gn_envelope_seal(provider, GN_MSG_INVOICE, body.data, body.len, ret_env);
out:
  free(c.recs);
  gn_buf_done(&body);
  gn_buf_done(&ag_env);
  return r;
}

/* --- the requester's answer ----------------------------------------------*/

static int response_seal(const gn_identity *requester, uint32_t type, const char *lease_id,
                         const uint8_t hash[GN__HASH_LEN], const char *reason, gn_buf *ret_env) {
  gn_wire_writer w;
  gn_buf body = {0};
  int r;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "invoice_hash");
  gn_wire_put_bin(&w, hash, GN__HASH_LEN);
  if (type == GN_MSG_INVOICE_ACCEPT) {
    gn_wire_put_str(&w, "accepted_s");
    gn_wire_put_i64(&w, gn_unix_s());
  } else {
    gn_wire_put_str(&w, "reason");
    gn_wire_put_str(&w, reason);
  }
  r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(requester, type, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

int gn_invoice_accept_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len, gn_buf *ret_env) {
  gn__invoice_view v;
  int r;
  if (!requester || !invoice_env || !ret_env)
    return GN_EINVAL;
  /* Never countersign what does not verify. */
  if ((r = gn__invoice_verify(invoice_env, len, NULL, 0, &v, NULL, 0)) < 0)
    return r;
  r = GN_EPERM;
  if (memcmp(requester->pk, v.agreement.terms.requester, GN_PK_LEN) == 0)
    r = response_seal(requester, GN_MSG_INVOICE_ACCEPT, v.body.lease_id, v.hash, NULL, ret_env);
  gn__invoice_view_done(&v);
  return r;
}

int gn_invoice_reject_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len, const char *reason,
                           gn_buf *ret_env) {
  gn_agreement ag;
  char lease_id[GN_LEASE_ID_STRLEN];
  uint8_t hash[GN__HASH_LEN];
  int r;
  if (!requester || !invoice_env || !ret_env || !reason || strlen(reason) >= sizeof(((gn_invoice_response *)0)->reason))
    return GN_EINVAL;
  /* A rejection must work for an invoice whose own signature is broken, so
   * only the embedded agreement (signed by both parties) is trusted here. */
  if ((r = invoice_agreement_peek(invoice_env, len, &ag, lease_id)) < 0)
    return r;
  if (memcmp(requester->pk, ag.terms.requester, GN_PK_LEN) != 0)
    return GN_EPERM;
  if (strcmp(lease_id, ag.terms.lease_id) != 0)
    return GN_EINVAL;
  gn__invoice_hash(invoice_env, len, hash);
  return response_seal(requester, GN_MSG_INVOICE_REJECT, lease_id, hash, reason, ret_env);
}

int gn_invoice_response_open(const uint8_t *env, size_t len, const uint8_t *invoice_env, size_t invoice_len,
                             gn_invoice_response *ret) {
  gn_envelope e;
  gn_wire_doc doc;
  gn_invoice_response resp;
  gn_agreement ag;
  char inv_lease[GN_LEASE_ID_STRLEN];
  uint8_t hash[GN__HASH_LEN];
  int r;
  if (!env || !invoice_env || !ret)
    return GN_EINVAL;
  memset(&resp, 0, sizeof(resp));
  if ((r = gn_envelope_open(env, len, &e)) < 0)
    return r;
  if (e.type != GN_MSG_INVOICE_ACCEPT && e.type != GN_MSG_INVOICE_REJECT)
    return GN_EPROTO;
  resp.accepted = e.type == GN_MSG_INVOICE_ACCEPT;
  if ((r = gn_wire_decode(e.body, e.body_len, &doc)) < 0)
    return r;
  r = GN_EINVAL;
  if (doc.root->type != MSGPACK_OBJECT_MAP ||
      gn_wire_get_str(doc.root, "lease_id", resp.lease_id, sizeof(resp.lease_id)) < 0 || !gn_id_valid(resp.lease_id) ||
      gn_wire_get_bin_exact(doc.root, "invoice_hash", resp.invoice_hash, GN__HASH_LEN) < 0)
    goto out;
  if (resp.accepted ? gn_wire_get_i64(doc.root, "accepted_s", &resp.at_s) < 0
                    : gn_wire_get_str(doc.root, "reason", resp.reason, sizeof(resp.reason)) < 0)
    goto out;
  if ((r = invoice_agreement_peek(invoice_env, invoice_len, &ag, inv_lease)) < 0)
    goto out;
  r = GN_EPERM;
  if (memcmp(e.signer, ag.terms.requester, GN_PK_LEN) != 0)
    goto out;
  gn__invoice_hash(invoice_env, invoice_len, hash);
  r = GN_EDIGEST;
  if (sodium_memcmp(hash, resp.invoice_hash, GN__HASH_LEN) != 0)
    goto out;
  r = GN_EINVAL;
  if (strcmp(resp.lease_id, inv_lease) != 0)
    goto out;
  *ret = resp;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}
