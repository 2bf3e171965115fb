/* The requester agent: renting from an offer, sending signed job manifests,
 * following job status and logs, releasing leases, and checking and
 * countersigning the provider's invoice against our own observation. */
#include "requester.h"

#include "attest_net.h"
#include "node_internal.h"
#include "settle_glue.h"
#include "train_req.h"
#include "util.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>

#define GN_RENT_TIMEOUT_MS 15000 /* GN_RENT_TIMEOUT_MS in the environment overrides it (tests) */
#define GN_RENT_INTERVAL_S 60    /* debit notes every minute unless rent asks otherwise */
#define GN_JOB_TIMEOUT_MS 20000
#define GN_RELEASE_TIMEOUT_MS 20000

/* Sends now if the peer is up; otherwise connects and leaves the envelope on
 * the pending entry for gn__requester_peer_up. The dial holds the session to
 * peer's key: a node answering at addr under another key is refused
 * (gn__requester_dial_refused), GN_EPERM at once when addr is already up
 * under another key. */
static int send_or_connect(gn_node *n, gn_pending *p, const uint8_t peer[GN_PK_LEN], const char *addr,
                           const uint8_t *env, size_t len) {
  memcpy(p->peer, peer, GN_PK_LEN);
  if (gn_transport_is_up(n->tp, peer))
    return gn_transport_send(n->tp, peer, env, len);
  int r = gn_buf_append(&p->msg, env, len);
  if (r == 0)
    r = addr && addr[0] ? gn__nat_connect_peer(n, addr, peer) : GN_ENOTFOUND;
  return r;
}

void gn__requester_dial_refused(gn_node *n, const char *addr, const uint8_t expected[GN_PK_LEN],
                                const uint8_t got[GN_PK_LEN]) {
  char want[GN_NODE_ID_STRLEN], is[GN_NODE_ID_STRLEN];
  gn_node_id_format(expected, want);
  gn_node_id_format(got, is);
  for (gn_pending **pp = &n->pending; *pp;) {
    gn_pending *p = *pp;
    if (p->kind != GN_PENDING_RENT || !p->msg.len || memcmp(p->peer, expected, GN_PK_LEN) != 0) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    gn_log(GN_LOG_WARN, "lease request %s not sent: the node at %s is %s, not provider %s", p->key, addr, is, want);
    gn_ctl_reply_error(p->req, 502,
                       "cannot reach provider %s: the node at %s is %s, not the provider its offer names; not renting",
                       want, addr, is);
    gn__pending_free(p);
  }
}

static gn_lease_now lease_now(void) {
  return (gn_lease_now){gn_mono_ms(), gn_unix_s()};
}

static int req_perform(gn_node *n, gn_lease *l, gn_lease_out *out);
static void lease_mark_ended(gn_lease *l, const char *reason, int64_t end_s);

/* Runs one call of lease l's machine on a fresh out (named `out` for the
 * call) and performs what it asks, also when the call returned an error:
 * a rejected note is answered by the actions that come with GN_EAUDIT. */
#define REQ_CALL(n, l, call)                                                                                           \
  do {                                                                                                                 \
    gn_lease_out *out = calloc(1, sizeof *out);                                                                        \
    if (out && (l)->req) {                                                                                             \
      (void)(call);                                                                                                    \
      req_perform((n), (l), out);                                                                                      \
    }                                                                                                                  \
    gn_lease_out_done(out);                                                                                            \
    free(out);                                                                                                         \
  } while (0)

void gn__requester_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (gn_pending *p = n->pending; p; p = p->next) {
    if (p->msg.len && memcmp(p->peer, peer, GN_PK_LEN) == 0) {
      gn_transport_send(n->tp, peer, p->msg.data, p->msg.len);
      gn_buf_done(&p->msg);
    }
  }
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_REQUESTER && l->req && memcmp(l->peer, peer, GN_PK_LEN) == 0)
      REQ_CALL(n, l, gn_lease_req_peer(l->req, lease_now(), true, out));
  gn__trainreq_peer_up(n, peer);
}

static const char *lease_provider_addr(gn_node *n, const gn_lease *l) {
  for (size_t i = 0; i < gn_offer_table_count(n->offers); i++) {
    const gn_offer_entry *e = gn_offer_table_at(n->offers, i);
    if (memcmp(e->offer.provider, l->peer, GN_PK_LEN) == 0)
      return e->offer.addr;
  }
  return NULL;
}

/* The signed GN_MSG_LEASE_RELEASE of lease_id. */
static int release_seal(gn_node *n, const char *lease_id, const char *reason, gn_buf *ret_env) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  gn_buf b = {0};
  int r = gn_wire_writer_take(&w, &b);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(n->id, GN_MSG_LEASE_RELEASE, b.data, b.len, ret_env);
  gn_buf_done(&b);
  return r;
}

static void send_release(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *lease_id, const char *reason) {
  gn_buf env = {0};
  if (release_seal(n, lease_id, reason, &env) == 0 && n->tp)
    gn_transport_send(n->tp, peer, env.data, env.len);
  gn_buf_done(&env);
}

/* --- rent -------------------------------------------------------------------*/

static uint64_t rent_timeout_ms(void) {
  const char *e = getenv("GN_RENT_TIMEOUT_MS");
  char *end;
  unsigned long long v = e ? strtoull(e, &end, 10) : 0;
  return e && *end == 0 && v >= 100 && v <= 600000 ? v : GN_RENT_TIMEOUT_MS;
}

/* What rent asked for, kept on the pending rent until the provider answers:
 * the agreement must embed exactly this request. */
typedef struct rent_terms {
  gn_lease_terms t;
  uint64_t max_spend_micro, max_price_uper_hour;
} rent_terms;

static const gn_offer_entry *pick_offer(gn_node *n, const char *model, uint32_t count, bool allow_sim,
                                        uint64_t max_price, bool *ret_only_sim) {
  gn_filter f;
  char spec[160], err[128];
  const gn_offer_entry *best = NULL;
  *ret_only_sim = false;
  gn__strf(spec, sizeof spec, "gpu=%s", model);
  if (gn_filter_parse(spec, &f, err, sizeof err) < 0)
    return NULL;
  for (size_t i = 0; i < gn_offer_table_count(n->offers); i++) {
    const gn_offer_entry *e = gn_offer_table_at(n->offers, i);
    if (!gn_filter_match(&f, &e->offer) || e->offer.gpus_free < count ||
        memcmp(e->offer.provider, n->id->pk, GN_PK_LEN) == 0 || (max_price && e->offer.price_uper_hour > max_price))
      continue;
    if (e->offer.simulated && !allow_sim) {
      *ret_only_sim = true;
      continue;
    }
    if (!best || e->offer.price_uper_hour < best->offer.price_uper_hour)
      best = e;
  }
  if (best)
    *ret_only_sim = false;
  return best;
}

/* Signs the lease request for offer e and sends it; the API request is
 * answered when the provider accepts or rejects (or does not answer). */
static void rent_send(gn_node *n, gn_ctl_req *req, const gn_offer_entry *e, const rent_terms *want) {
  uint32_t count = want->t.count;
  uint64_t max_s = want->t.max_s;
  /* The offer may have changed while its provider was attested. */
  if (want->max_price_uper_hour && e->offer.price_uper_hour > want->max_price_uper_hour) {
    char have[32], cap[32];
    gn_price_format(e->offer.price_uper_hour, have, sizeof have);
    gn_price_format(want->max_price_uper_hour, cap, sizeof cap);
    gn_ctl_reply_error(req, 409, "offer %s asks %s %s per GPU-hour, above --max-price %s; not renting", e->id, have,
                       e->offer.currency, cap);
    return;
  }
  gn_lease_terms t;
  gn_lease_terms_init(&t);
  memcpy(t.provider, e->offer.provider, GN_PK_LEN);
  memcpy(t.requester, n->id->pk, GN_PK_LEN);
  gn__strf(t.offer_id, sizeof t.offer_id, "%s", e->id);
  gn__strf(t.gpu_model, sizeof t.gpu_model, "%s", e->offer.gpu_model);
  t.count = count;
  /* The price asked is the offer's, which is never above max_price: the
   * agreement (and every note) bills the price in this signed request. */
  t.price_uper_hour = e->offer.price_uper_hour;
  gn__strf(t.currency, sizeof t.currency, "%s", e->offer.currency);
  t.max_s = max_s;
  t.interval_s = want->t.interval_s;
  t.requested_s = gn_unix_s();
  t.simulated = e->offer.simulated;
  gn_buf env = {0};
  int r = gn_lease_request_seal(n->id, &t, &env);
  if (r < 0) {
    gn_ctl_reply_error(req, 500, "cannot sign the lease request: %s", gn_strerror(r));
    return;
  }
  rent_terms *keep = malloc(sizeof *keep);
  gn_pending *p = keep ? gn__pending_add(n, req, GN_PENDING_RENT, t.lease_id, rent_timeout_ms()) : NULL;
  if (!p) {
    free(keep);
    gn_buf_done(&env);
    gn_ctl_reply_error(req, 500, "out of memory");
    return;
  }
  *keep = *want;
  keep->t = t;
  p->data = keep;
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(t.provider, pid);
  gn_log(GN_LOG_INFO, "requesting lease %s: %u x %s from %s", t.lease_id, t.count, t.gpu_model, pid);
  r = send_or_connect(n, p, t.provider, e->offer.addr, env.data, env.len);
  gn_buf_done(&env);
  if (r == GN_EPERM) {
    gn__pending_free(gn__pending_take(n, GN_PENDING_RENT, t.lease_id));
    gn_ctl_reply_error(req, 502,
                       "cannot reach provider %s: the node at %s is another one, not the provider its offer names; not "
                       "renting",
                       pid, e->offer.addr);
  } else if (r < 0) {
    gn__pending_free(gn__pending_take(n, GN_PENDING_RENT, t.lease_id));
    gn_ctl_reply_error(req, 502, "cannot reach provider %s at %s: %s", pid, e->offer.addr, gn_strerror(r));
  }
}

typedef struct rent_ctx {
  gn_ctl_req *req;
  char offer_id[GN_OFFER_ID_STRLEN];
  rent_terms want;
  bool allow_sim;
} rent_ctx;

/* The attestation verdict decides whether we sign: a provider whose proof
 * fails or is too slow for the GPU it advertises is refused. */
static void rent_after_attest(gn_node *n, void *ud, int rc, const gn_attest_result *res, const char *err) {
  rent_ctx *c = ud;
  const gn_offer_entry *e = gn_offer_table_find(n->offers, c->offer_id);
  if (rc < 0)
    gn_ctl_reply_error(c->req, 502, "cannot attest the provider of %s: %s; not renting (--no-attest skips the check)",
                       c->offer_id, err ? err : gn_strerror(rc));
  else if (res->outcome == GN_ATTEST_FAILED || res->outcome == GN_ATTEST_TOO_SLOW)
    gn_ctl_reply_error(c->req, 409, "provider of %s failed attestation: %s; not renting", c->offer_id, res->verdict);
  else if (res->outcome == GN_ATTEST_SIMULATED && !c->allow_sim)
    gn_ctl_reply_error(c->req, 409, "the provider of %s proved only a simulated GPU; pass --allow-simulated",
                       c->offer_id);
  else if (!e)
    gn_ctl_reply_error(c->req, 409, "offer %s disappeared while its provider was being attested", c->offer_id);
  else {
    gn_log(GN_LOG_INFO, "attestation of %s: %s", c->offer_id, res->verdict);
    rent_send(n, c->req, e, &c->want);
  }
  free(c);
}

static void api_rent(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const json_t *b = gn_ctl_req_body(req);
  const char *offer_id = json_string_value(json_object_get(b, "offer"));
  const char *model = json_string_value(json_object_get(b, "gpu"));
  double hours = json_number_value(json_object_get(b, "hours"));
  json_int_t count = json_object_get(b, "count") ? json_integer_value(json_object_get(b, "count")) : 1;
  bool allow_sim = json_is_true(json_object_get(b, "allow_simulated")) || n->cfg.allow_simulated;
  const gn_offer_entry *e = NULL;
  const json_t *jp = json_object_get(b, "max_price_uper_hour"), *js = json_object_get(b, "max_spend_micro"),
               *ji = json_object_get(b, "interval_s");
  rent_terms want;
  memset(&want, 0, sizeof want);
  if (jp && (!json_is_integer(jp) || json_integer_value(jp) < 1))
    return gn_ctl_reply_error(req, 400, "max_price_uper_hour (--max-price) must be a positive amount");
  if (js && (!json_is_integer(js) || json_integer_value(js) < 1))
    return gn_ctl_reply_error(req, 400, "max_spend_micro (--max-spend) must be a positive amount");
  if (ji && (!json_is_integer(ji) || json_integer_value(ji) < 1 || json_integer_value(ji) > 86400))
    return gn_ctl_reply_error(req, 400, "interval_s (--interval) must be 1 to 86400 seconds");
  want.max_price_uper_hour = jp ? (uint64_t)json_integer_value(jp) : 0;
  want.max_spend_micro = js ? (uint64_t)json_integer_value(js) : 0;
  want.t.interval_s = ji ? (uint32_t)json_integer_value(ji) : GN_RENT_INTERVAL_S;

  if (!offer_id && !model)
    return gn_ctl_reply_error(req, 400, "name an offer id, or a GPU model with --gpu");
  if (!(hours > 0) || hours > 24 * 365)
    return gn_ctl_reply_error(req, 400, "--hours must be a positive number of hours");
  if (count < 1 || count > GN_LEASE_MAX_GPUS)
    return gn_ctl_reply_error(req, 400, "--count must be between 1 and %d", GN_LEASE_MAX_GPUS);
  if (offer_id) {
    e = gn_offer_table_find(n->offers, offer_id);
    if (!e)
      return gn_ctl_reply_error(req, 404, "no offer %s in the offer table (list offers with: gpunet offers)", offer_id);
    if (e->offer.simulated && !allow_sim)
      return gn_ctl_reply_error(req, 409,
                                "offer %s is a SIMULATED %s, not real hardware; pass --allow-simulated to rent it "
                                "anyway",
                                offer_id, e->offer.gpu_model);
    if (want.max_price_uper_hour && e->offer.price_uper_hour > want.max_price_uper_hour) {
      char have[32], cap[32];
      gn_price_format(e->offer.price_uper_hour, have, sizeof have);
      gn_price_format(want.max_price_uper_hour, cap, sizeof cap);
      return gn_ctl_reply_error(req, 409, "offer %s asks %s %s per GPU-hour, above --max-price %s; not renting",
                                offer_id, have, e->offer.currency, cap);
    }
  } else {
    bool only_sim;
    e = pick_offer(n, model, (uint32_t)count, allow_sim, want.max_price_uper_hour, &only_sim);
    if (!e && want.max_price_uper_hour && pick_offer(n, model, (uint32_t)count, allow_sim, 0, &only_sim)) {
      char cap[32];
      gn_price_format(want.max_price_uper_hour, cap, sizeof cap);
      return gn_ctl_reply_error(req, 409,
                                "every %s offer with %lld free GPUs asks more than --max-price %s per GPU-hour", model,
                                (long long)count, cap);
    }
    if (!e && only_sim)
      return gn_ctl_reply_error(req, 409,
                                "the only %s offers with %lld free GPUs are SIMULATED; pass --allow-simulated to rent "
                                "one anyway",
                                model, (long long)count);
    if (!e)
      return gn_ctl_reply_error(req, 404, "no offer for %s with %lld free GPUs (list offers with: gpunet offers)",
                                model, (long long)count);
  }
  if (memcmp(e->offer.provider, n->id->pk, GN_PK_LEN) == 0)
    return gn_ctl_reply_error(req, 400, "offer %s is this node's own", e->id);
  if ((uint32_t)count > e->offer.gpus_free)
    return gn_ctl_reply_error(req, 409, "offer %s has %u free GPUs, asked for %lld", e->id, e->offer.gpus_free,
                              (long long)count);
  uint64_t max_s = (uint64_t)llround(hours * 3600.0);
  if (max_s < 1 || max_s > (uint64_t)e->offer.max_hours * 3600u)
    return gn_ctl_reply_error(req, 400, "offer %s allows leases of at most %u hours", e->id, e->offer.max_hours);
  want.t.count = (uint32_t)count;
  want.t.max_s = max_s;

  if (!json_is_false(json_object_get(b, "attest"))) {
    /* Challenge the provider's GPU before signing anything. */
    rent_ctx *c = calloc(1, sizeof *c);
    if (!c)
      return gn_ctl_reply_error(req, 500, "out of memory");
    c->req = req;
    gn__strf(c->offer_id, sizeof c->offer_id, "%s", e->id);
    c->want = want;
    c->allow_sim = allow_sim;
    int r = gn__attest_begin(n, e, rent_after_attest, c);
    if (r == GN_EPERM) {
      free(c);
      char pid[GN_NODE_ID_STRLEN];
      gn_node_id_format(e->offer.provider, pid);
      return gn_ctl_reply_error(req, 502,
                                "cannot reach provider %s: the node at %s is another one, not the provider its offer "
                                "names; not renting",
                                pid, e->offer.addr);
    }
    if (r < 0) {
      free(c);
      return gn_ctl_reply_error(
          req, 409, "cannot attest the %s of offer %s (%s); rent with --no-attest to skip the check",
          e->offer.gpu_model, e->id, r == GN_ENOTFOUND ? "no attestation class for this model" : gn_strerror(r));
    }
    return;
  }
  rent_send(n, req, e, &want);
}

static bool terms_equal(const gn_lease_terms *a, const gn_lease_terms *b) {
  return strcmp(a->lease_id, b->lease_id) == 0 && memcmp(a->provider, b->provider, GN_PK_LEN) == 0 &&
         memcmp(a->requester, b->requester, GN_PK_LEN) == 0 && strcmp(a->offer_id, b->offer_id) == 0 &&
         strcmp(a->gpu_model, b->gpu_model) == 0 && a->count == b->count && a->price_uper_hour == b->price_uper_hour &&
         strcmp(a->currency, b->currency) == 0 && a->max_s == b->max_s && a->interval_s == b->interval_s &&
         a->requested_s == b->requested_s && memcmp(a->nonce, b->nonce, sizeof a->nonce) == 0 &&
         a->simulated == b->simulated;
}

/* Takes an agreement that passed the caller's checks as a requester lease:
 * its record, its billing machine (our observation starts now) and the
 * ledger's copy. GN_ENOMEM with *ret NULL, or an error after which the lease
 * is recorded ended and released. */
static int lease_adopt(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len,
                       const gn_agreement *ag, uint64_t max_spend_micro, uint64_t max_price_uper_hour, gn_lease **ret) {
  *ret = NULL;
  gn_lease *l = calloc(1, sizeof *l);
  if (!l)
    return GN_ENOMEM;
  gn__strf(l->id, sizeof l->id, "%s", ag->terms.lease_id);
  l->role = GN_ROLE_REQUESTER;
  memcpy(l->peer, peer, GN_PK_LEN);
  l->ag = *ag;
  gn_buf_append(&l->agreement_env, raw, raw_len);
  l->state = GN_LEASE_ACTIVE;
  l->start_mono_ms = gn_mono_ms();
  l->received_s = gn_unix_s();
  l->max_spend_micro = max_spend_micro;
  l->max_price_uper_hour = max_price_uper_hour;
  for (int i = 0; i < GN_LEASE_MAX_GPUS; i++)
    l->gpu_index[i] = -1;
  l->timer_at_ms = UINT64_MAX;
  /* Our observation starts now, on our clock; the machine persists our UTC
   * of receipt before anything else happens. The ledger keeps the
   * agreement so the notes we answer can be stored against it. */
  gn_lease_out *out = calloc(1, sizeof *out);
  int r = out ? gn_lease_req_new(n->id, raw, raw_len, l->max_spend_micro, lease_now(), &l->req, out) : GN_ENOMEM;
  if (r == 0) {
    int lr = gn_ledger_begin_lease(n->ledger, l->id, raw, raw_len);
    if (lr < 0)
      gn_log(GN_LOG_WARN, "lease %s: cannot keep its agreement in the ledger: %s", l->id, gn_strerror(lr));
  }
  l->next = n->leases;
  n->leases = l;
  *ret = l;
  gn__node_persist_lease(n, l);
  if (r == 0)
    r = req_perform(n, l, out);
  gn_lease_out_done(out);
  free(out);
  if (r < 0) {
    gn_log(GN_LOG_ERROR, "lease %s: cannot start checking its bills: %s; releasing it", l->id, gn_strerror(r));
    lease_mark_ended(l, "the requester could not start checking its bills", 0);
    gn__node_persist_lease(n, l);
    send_release(n, peer, l->id, "the requester could not start checking its bills");
  }
  return r;
}

static void on_lease_accept(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len) {
  gn_agreement ag;
  int r = gn_agreement_open(raw, raw_len, &ag);
  if (r < 0) {
    gn_log(GN_LOG_WARN, "lease acceptance does not verify: %s", gn_strerror(r));
    return;
  }
  gn_pending *p = gn__pending_take(n, GN_PENDING_RENT, ag.terms.lease_id);
  if (!p && gn__trainreq_on_accept(n, peer, raw, raw_len, &ag))
    return; /* a gang member's (train_req.c) */
  if (!p) {
    /* A late acceptance (our rent timed out, or we never asked): it is no
     * lease of ours, and we say so, so that an honest provider stops
     * metering at once. Whatever it bills for it is refused: we hold no
     * such lease (and the audit needs our countersignature). */
    gn_log(GN_LOG_WARN, "acceptance for lease %s that nobody is waiting for: not a lease of this node; releasing it",
           ag.terms.lease_id);
    if (memcmp(ag.terms.provider, peer, GN_PK_LEN) == 0 && memcmp(ag.terms.requester, n->id->pk, GN_PK_LEN) == 0 &&
        !gn__lease_find(n, ag.terms.lease_id))
      send_release(n, peer, ag.terms.lease_id, "not a lease of this requester (its rent had timed out)");
    return;
  }
  if (memcmp(ag.terms.provider, peer, GN_PK_LEN) != 0 || memcmp(ag.terms.requester, n->id->pk, GN_PK_LEN) != 0) {
    gn_ctl_reply_error(p->req, 502, "the provider's acceptance names other parties; refusing it");
    gn__pending_free(p);
    return;
  }
  /* The agreement must embed the very request we signed (its nonce and
   * every term), grant exactly the GPUs asked for and bill no more than we
   * agreed to pay. */
  const rent_terms *want = p->data;
  char why[160] = "";
  if (want && !terms_equal(&ag.terms, &want->t))
    gn__strf(why, sizeof why, "it does not embed the request this node signed");
  else if (ag.gpu_count != ag.terms.count)
    gn__strf(why, sizeof why, "it grants %u GPUs, not the %u asked for", ag.gpu_count, ag.terms.count);
  else if (want && want->max_price_uper_hour && ag.terms.price_uper_hour > want->max_price_uper_hour)
    gn__strf(why, sizeof why, "its price is above --max-price");
  if (why[0]) {
    gn_log(GN_LOG_WARN, "refusing the provider's acceptance of lease %s: %s", ag.terms.lease_id, why);
    gn_ctl_reply_error(p->req, 502, "the provider's acceptance of lease %s is refused: %s", ag.terms.lease_id, why);
    send_release(n, peer, ag.terms.lease_id, "agreement refused by the requester");
    gn__pending_free(p);
    return;
  }
  gn_lease *l = NULL;
  r = lease_adopt(n, peer, raw, raw_len, &ag, want ? want->max_spend_micro : 0, want ? want->max_price_uper_hour : 0,
                  &l);
  if (r == GN_ENOMEM && !l) {
    gn_ctl_reply_error(p->req, 500, "out of memory");
    gn__pending_free(p);
    return;
  }
  if (r < 0) {
    gn_ctl_reply_error(p->req, 500, "cannot start checking the bills of lease %s: %s; released it", l->id,
                       gn_strerror(r));
    gn__pending_free(p);
    return;
  }
  gn_log(GN_LOG_INFO, "lease %s active: %u x %s", l->id, ag.gpu_count, ag.terms.gpu_model);
  json_t *o = json_object();
  json_object_set_new(o, "lease", gn__lease_json(n, l));
  gn_ctl_reply_json(p->req, 201, o);
  gn__pending_free(p);
}

/* --- the lease machine's glue: release, debit notes, invoices --------------
 *
 * Every bill of a lease is checked by the requester's machine
 * (billing/lease_req.c) against our own observation and spending cap; what
 * follows only feeds it messages and time and does what it asks. */

static json_t *bill_json(const gn_lease *l, const gn_lease_info *info) {
  char total[32], price[32];
  uint64_t seconds = l->invoice_id[0] ? l->invoice_seconds : info->accepted_s;
  uint64_t micro = l->invoice_id[0] ? l->invoice_micro : info->accepted_micro;
  gn_price_format(micro, total, sizeof total);
  gn_price_format(l->ag.terms.price_uper_hour, price, sizeof price);
  return json_pack("{s:s, s:s, s:s, s:I, s:I, s:s, s:s, s:s}", "id", l->invoice_id[0] ? l->invoice_id : "", "lease",
                   l->id, "status", l->invoice_status[0] ? l->invoice_status : "open", "seconds", (json_int_t)seconds,
                   "total_micro", (json_int_t)micro, "total", total, "price", price, "currency", l->ag.terms.currency);
}

static void lease_mark_ended(gn_lease *l, const char *reason, int64_t end_s) {
  if (l->state == GN_LEASE_ENDED)
    return;
  l->state = GN_LEASE_ENDED;
  l->end_mono_ms = gn_mono_ms();
  l->seconds = (l->end_mono_ms - l->start_mono_ms) / 1000;
  if (l->req) { /* our observation, as the machine keeps it (also across a restart) */
    gn_lease_info info;
    gn_lease_req_info(l->req, lease_now(), &info);
    l->seconds = info.seconds;
  }
  l->end_s = end_s ? end_s : gn_unix_s();
  gn__strf(l->end_reason, sizeof l->end_reason, "%s", reason);
}

/* The final invoice's id ("i-" + 16 hex of its hash: what `gpunet
 * invoices` shows) and what it bills, kept with the lease. */
static void lease_note_invoice(gn_lease *l, const uint8_t *env, size_t len) {
  uint8_t h[32];
  char hex[17];
  gn_invoice_summary sum;
  gn_bill_hash(env, len, h);
  gn__hex(h, 8, hex);
  gn__strf(l->invoice_id, sizeof l->invoice_id, "i-%s", hex);
  if (gn_invoice_summarize(env, len, &sum) == 0) {
    l->invoice_seconds = sum.seconds;
    l->invoice_micro = sum.total_micro;
    l->invoice_energy = sum.energy;
  }
}

/* The release waiting for the final invoice gets its answer. */
static void release_answer(gn_node *n, gn_lease *l) {
  gn_pending *p = gn__pending_take(n, GN_PENDING_RELEASE, l->id);
  if (!p)
    return;
  gn_lease_info info;
  gn_lease_req_info(l->req, lease_now(), &info);
  json_t *o = json_object();
  json_object_set_new(o, "lease", gn__lease_json(n, l));
  json_object_set_new(o, "invoice", bill_json(l, &info));
  gn_ctl_reply_json(p->req, 200, o);
  gn__pending_free(p);
}

/* Performs the requester machine's actions in order and arms its timer. A
 * PERSIST that fails stops what follows: nothing we sign leaves before our
 * record of it is durable. */
static int req_perform(gn_node *n, gn_lease *l, gn_lease_out *out) {
  int r = 0;
  /* The newest call's timer: a call made while these actions are performed
   * (the ticks a WRITE_TICKS asked for) sets its own after this one. */
  l->timer_at_ms = out->timer_at_ms;
  for (size_t i = 0; i < out->n && r == 0; i++) {
    const gn_lease_action *a = &out->act[i];
    gn_log(GN_LOG_DEBUG, "lease %s: requester action %d (%zu bytes) %s", l->id, a->kind, a->len, a->reason);
    switch (a->kind) {
    case GN_LEASE_ACT_SEND:
      if (n->tp && gn_transport_is_up(n->tp, l->peer))
        gn_transport_send(n->tp, l->peer, a->data, a->len);
      break;
    case GN_LEASE_ACT_PERSIST:
      r = gn__node_persist_machine(n, l->id, a->data, a->len);
      if (r < 0)
        gn_log(GN_LOG_ERROR, "cannot save the billing state of lease %s: %s", l->id, gn_strerror(r));
      break;
    case GN_LEASE_ACT_VOUCHER: /* a debit note we accepted, and our voucher */
      gn_ledger_store_note(n->ledger, l->id, "requester", a->data, a->len);
      gn_ledger_store_response(n->ledger, l->id, "requester", a->data2, a->len2);
      gn__settle_voucher(n, l, a->data2, a->len2);
      break;
    case GN_LEASE_ACT_REJECTED: /* a debit note or invoice we rejected, and our rejection */
      gn_log(GN_LOG_WARN, "lease %s: rejected a bill from the provider: %s", l->id, a->reason);
      if (gn_ledger_store_note(n->ledger, l->id, "requester", a->data, a->len) == 0)
        gn_ledger_store_response(n->ledger, l->id, "requester", a->data2, a->len2);
      break;
    case GN_LEASE_ACT_END:
      if (l->state == GN_LEASE_ACTIVE) {
        lease_mark_ended(l, a->reason[0] ? a->reason : "ended", 0);
        gn__node_persist_lease(n, l);
        gn_log(GN_LOG_INFO, "lease %s ended: %s", l->id, l->end_reason);
      }
      break;
    case GN_LEASE_ACT_SETTLED: /* the one final invoice we answered */
      gn_ledger_store_note(n->ledger, l->id, "requester", a->data, a->len);
      gn_ledger_store_response(n->ledger, l->id, "requester", a->data2, a->len2);
      lease_note_invoice(l, a->data, a->len);
      gn__strf(l->invoice_status, sizeof l->invoice_status, "%s", a->accepted ? "accepted" : "rejected");
      l->invoice_done = true;
      if (l->state == GN_LEASE_ACTIVE)
        lease_mark_ended(l, "ended by the provider", 0);
      gn__node_persist_lease(n, l);
      if (a->accepted) {
        gn_log(GN_LOG_INFO, "final invoice of lease %s checks out; countersigned", l->id);
        gn__settle_voucher(n, l, a->data2, a->len2);
        gn__settle_final(n, l, a->data, a->len, a->data2, a->len2);
      } else {
        gn_log(GN_LOG_WARN, "final invoice of lease %s rejected: %s", l->id, a->reason);
      }
      release_answer(n, l);
      break;
    case GN_LEASE_ACT_RELEASE: {
      gn_buf env = {0};
      if (release_seal(n, l->id, "released by the requester", &env) == 0 && n->tp) {
        if (gn_transport_is_up(n->tp, l->peer))
          gn_transport_send(n->tp, l->peer, env.data, env.len);
        else if (lease_provider_addr(n, l))
          gn__nat_connect_peer(n, lease_provider_addr(n, l), l->peer);
      }
      gn_buf_done(&env);
      break;
    }
    default:
      break;
    }
  }
  return r;
}

static void api_release(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *id = gn_ctl_req_param(req, "id");
  gn_lease *l = gn__lease_find(n, id);
  if (!l)
    return gn_ctl_reply_error(req, 404, "no lease %s", id);
  if (l->role != GN_ROLE_REQUESTER)
    return gn_ctl_reply_error(req, 409, "lease %s is one this node provides; only its requester can release it", id);
  if (l->invoice_done || !l->req) {
    gn_lease_info info;
    memset(&info, 0, sizeof info);
    if (l->req)
      gn_lease_req_info(l->req, lease_now(), &info);
    json_t *o = json_object();
    json_object_set_new(o, "lease", gn__lease_json(n, l));
    json_object_set_new(o, "invoice", l->invoice_id[0] ? bill_json(l, &info) : json_null());
    return gn_ctl_reply_json(req, 200, o);
  }
  for (const gn_pending *q = n->pending; q; q = q->next)
    if (q->kind == GN_PENDING_RELEASE && strcmp(q->key, l->id) == 0)
      return gn_ctl_reply_error(req, 409, "lease %s is being released already; wait for that answer", id);
  gn_pending *p = gn__pending_add(n, req, GN_PENDING_RELEASE, l->id, GN_RELEASE_TIMEOUT_MS);
  if (!p)
    return gn_ctl_reply_error(req, 500, "out of memory");
  memcpy(p->peer, l->peer, GN_PK_LEN);
  if (l->state == GN_LEASE_ACTIVE) {
    lease_mark_ended(l, "released by the requester", 0);
    gn__node_persist_lease(n, l);
  }
  REQ_CALL(n, l, gn_lease_req_release(l->req, lease_now(), out));
}

/* A debit note or the final invoice from a provider: for the machine of the
 * lease it names, only if we hold that lease with that provider. Bills for
 * leases we do not hold are refused (never answered: we sign nothing about
 * a lease that is not ours). */
static void on_bill(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                    size_t raw_len) {
  gn_wire_doc doc;
  char lease_id[GN_LEASE_ID_STRLEN] = "";
  if (gn_wire_decode(env->body, env->body_len, &doc) < 0)
    return;
  if (doc.root->type != MSGPACK_OBJECT_MAP || gn_wire_get_str(doc.root, "lease_id", lease_id, sizeof lease_id) < 0)
    lease_id[0] = 0;
  gn_wire_doc_done(&doc);
  gn_lease *l = lease_id[0] ? gn__lease_find(n, lease_id) : NULL;
  if (!l || l->role != GN_ROLE_REQUESTER || !l->req || memcmp(l->peer, peer, GN_PK_LEN) != 0) {
    gn_log(GN_LOG_WARN, "%s for lease %s, which this node does not hold with that provider; refused",
           gn_msg_type_name(env->type), lease_id[0] ? lease_id : "?");
    return;
  }
  int rc = 0;
  REQ_CALL(n, l, (rc = gn_lease_req_recv(l->req, lease_now(), raw, raw_len, out)));
  if (rc < 0 && rc != GN_EAUDIT)
    gn_log(GN_LOG_WARN, "lease %s: %s ignored: %s", l->id, gn_msg_type_name(env->type), gn_strerror(rc));
}

void gn__requester_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_REQUESTER && l->req && memcmp(l->peer, peer, GN_PK_LEN) == 0)
      REQ_CALL(n, l, gn_lease_req_peer(l->req, lease_now(), false, out));
  gn__trainreq_peer_down(n, peer);
}

/* Rebuilds a lease's machine after a restart: its observation restarts
 * from our own persisted UTC of receipt (the machine's state holds it),
 * never from the provider's start_s. */
int gn__requester_restore(gn_node *n, gn_lease *l, const uint8_t *state, size_t len) {
  gn_lease_state_info si;
  gn_lease_out *out = NULL;
  int r = gn_lease_state_peek(state, len, &si);
  if (r == 0 && (si.provider || strcmp(si.lease_id, l->id) != 0))
    r = GN_EINVAL;
  if (r == 0 && si.phase == GN_LEASE_PHASE_SETTLED)
    return 0;
  if (r == 0)
    out = calloc(1, sizeof *out);
  if (r == 0)
    r = out ? gn_lease_req_restore(n->id, l->agreement_env.data, l->agreement_env.len, state, len, lease_now(), &l->req,
                                   out)
            : GN_ENOMEM;
  if (r == 0)
    r = req_perform(n, l, out);
  gn_lease_out_done(out);
  free(out);
  if (r < 0 && l->state == GN_LEASE_ACTIVE) {
    /* Without its machine no bill of this lease can be checked, so none is
     * countersigned: the lease is over for us. */
    l->req = gn_lease_req_free(l->req);
    lease_mark_ended(l, "the requester could not resume checking the lease's bills after a restart", 0);
    gn__node_persist_lease(n, l);
  }
  return r;
}

/* --- jobs -------------------------------------------------------------------*/

typedef struct run_work {
  uv_work_t work;
  gn_node *n;
  gn_ctl_req *req;
  char lease_id[GN_LEASE_ID_STRLEN];
  gn_imageref ref;
  json_t *cmd, *env;
  uint64_t memory_mib;
  uint32_t pids;
  char err[512];
  int rc;
  uint64_t asked_ms; /* loop time when the tag's lookup was asked for */
} run_work;

/* Tags this node resolved in the last RUN_TAG_TTL_MS: a burst of jobs on one
 * image asks the registry once, not once per job (a round trip of 2-5 ms on
 * every job's start). The digest still comes only from this node's own
 * lookup at the registry, a few seconds old at most, and is what the
 * manifest pins and the requester signs; the provider checks the image
 * against it as before. A tag moved in those seconds runs the image it named
 * when it was looked up, as if the job had been sent that much earlier. On
 * the loop only. */
#define RUN_TAG_CACHE 8
#define RUN_TAG_TTL_MS 3000
#define RUN_TAG_REF_MAX 768 /* registry, name and tag (gn_imageref's fields) */
typedef struct run_tag {
  const gn_node *n;
  char ref[RUN_TAG_REF_MAX];
  char digest[GN_DIGEST_STRLEN];
  uint64_t asked_ms;
} run_tag;
static run_tag run_tags[RUN_TAG_CACHE];

/* The cache's key: the reference without digest (registry, name, tag). */
static bool run_tag_key(const gn_imageref *ref, char key[RUN_TAG_REF_MAX]) {
  gn_imageref r = *ref;
  r.digest[0] = 0;
  return gn_imageref_format(&r, key, RUN_TAG_REF_MAX) == 0;
}

static bool run_tag_get(gn_node *n, gn_imageref *ref) {
  char key[RUN_TAG_REF_MAX];
  uint64_t now = uv_now(n->loop);
  if (!run_tag_key(ref, key))
    return false;
  for (size_t i = 0; i < RUN_TAG_CACHE; i++) {
    const run_tag *t = &run_tags[i];
    if (t->n == n && gn_ms_since(now, t->asked_ms) < RUN_TAG_TTL_MS && strcmp(t->ref, key) == 0) {
      memcpy(ref->digest, t->digest, sizeof ref->digest);
      return true;
    }
  }
  return false;
}

static void run_tag_put(gn_node *n, const gn_imageref *ref, uint64_t asked_ms) {
  char key[RUN_TAG_REF_MAX];
  if (!run_tag_key(ref, key))
    return;
  run_tag *slot = &run_tags[0];
  for (size_t i = 0; i < RUN_TAG_CACHE; i++) { /* the same tag's entry, or the oldest */
    run_tag *t = &run_tags[i];
    if (t->n == n && strcmp(t->ref, key) == 0) {
      slot = t;
      break;
    }
    if (t->asked_ms < slot->asked_ms)
      slot = t;
  }
  slot->n = n;
  memcpy(slot->ref, key, sizeof key);
  memcpy(slot->digest, ref->digest, sizeof slot->digest);
  slot->asked_ms = asked_ms;
}

/* A job's limits when the run body names none. The provider's budgets are
 * shared by all its jobs (half its RAM by default), so a modest default
 * lets several jobs run side by side; a job that needs more asks for it. */
#define RUN_MEMORY_MIB_DEFAULT 1024
#define RUN_PIDS_DEFAULT 1024
/* What a run body may ask for. The provider clamps to at least 16 MiB and
 * to 8..4096 processes; asking outside that is refused here, by name, rather
 * than quietly changed there. */
#define RUN_MEMORY_MIB_MIN 16u
#define RUN_MEMORY_MIB_MAX (1u << 20) /* 1 TiB */
#define RUN_PIDS_MIN 8u
#define RUN_PIDS_MAX 4096u

/* An optional whole number in [min, max] under key; *ret keeps its default
 * when the key is absent or null. False when it is there but not such a number. */
static bool body_limit(const json_t *b, const char *key, json_int_t min, json_int_t max, json_int_t *ret) {
  const json_t *v = json_object_get(b, key);
  if (!v || json_is_null(v))
    return true;
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
    return false;
  *ret = json_integer_value(v);
  return true;
}

static void run_resolve_work(uv_work_t *w) {
  run_work *rw = w->data;
  char digest[GN_DIGEST_STRLEN];
  rw->rc = gn_registry_resolve(&rw->ref, digest, rw->err, sizeof rw->err);
  if (rw->rc == 0)
    memcpy(rw->ref.digest, digest, sizeof digest);
}

static void run_send(run_work *rw) {
  gn_node *n = rw->n;
  gn_ctl_req *req = rw->req;
  gn_lease *l = gn__lease_find(n, rw->lease_id);
  gn_jobman m;
  gn_buf body = {0}, env = {0};
  int r;
  if (!l || l->state != GN_LEASE_ACTIVE) {
    gn_ctl_reply_error(req, 409, "lease %s is no longer active", rw->lease_id);
    return;
  }
  memset(&m, 0, sizeof m);
  uint8_t rnd[6];
  randombytes_buf(rnd, sizeof rnd);
  char hex[13];
  gn__hex(rnd, sizeof rnd, hex);
  gn__strf(m.job_id, sizeof m.job_id, "j-%s", hex);
  gn__strf(m.lease_id, sizeof m.lease_id, "%s", l->id);
  gn_imageref_format(&rw->ref, m.image, sizeof m.image);
  m.argc = (uint32_t)json_array_size(rw->cmd);
  for (uint32_t i = 0; i < m.argc; i++)
    m.argv[i] = (char *)json_string_value(json_array_get(rw->cmd, i));
  m.envc = (uint32_t)json_array_size(rw->env);
  for (uint32_t i = 0; i < m.envc; i++)
    m.env[i] = (char *)json_string_value(json_array_get(rw->env, i));
  m.memory_mib = rw->memory_mib;
  m.pids = rw->pids;
  randombytes_buf(m.nonce, sizeof m.nonce);
  m.issued_s = gn_unix_s();
  m.expires_s = m.issued_s + 300;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__jobman_encode(&m, &w);
  r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(n->id, GN_MSG_JOB_MANIFEST, body.data, body.len, &env);
  gn_buf_done(&body);
  if (r < 0) {
    gn_buf_done(&env);
    gn_ctl_reply_error(req, 500, "cannot sign the job manifest: %s", gn_strerror(r));
    return;
  }
  gn_job *j = calloc(1, sizeof *j);
  gn_pending *p = j ? gn__pending_add(n, req, GN_PENDING_JOB, m.job_id, GN_JOB_TIMEOUT_MS) : NULL;
  if (!p) {
    free(j);
    gn_buf_done(&env);
    gn_ctl_reply_error(req, 500, "out of memory");
    return;
  }
  j->node = n;
  gn__strf(j->id, sizeof j->id, "%s", m.job_id);
  gn__strf(j->lease_id, sizeof j->lease_id, "%s", l->id);
  j->role = GN_ROLE_REQUESTER;
  gn__strf(j->image, sizeof j->image, "%s", m.image);
  gn__strf(j->digest, sizeof j->digest, "%s", rw->ref.digest);
  j->cmd = json_incref(rw->cmd);
  j->env = json_incref(rw->env);
  j->state = GN_JOB_PENDING;
  j->exit_code = -1;
  j->created_s = m.issued_s;
  char jobs_dir[sizeof n->run_dir + 8];
  gn__pathf(jobs_dir, sizeof jobs_dir, "%s/jobs", n->run_dir);
  gn_path_join(j->log_path, sizeof j->log_path, jobs_dir, NULL, j->id, ".log");
  j->next = n->jobs;
  n->jobs = j;
  /* Sent first, then the (unsynced) row: the provider prepares meanwhile. */
  r = send_or_connect(n, p, l->peer, lease_provider_addr(n, l), env.data, env.len);
  gn__node_persist_job(n, j);
  gn_buf_done(&env);
  if (r < 0)
    gn_log(GN_LOG_WARN, "job %s waits for provider connection: %s", j->id, gn_strerror(r));
}

static void run_resolve_done(uv_work_t *w, int status) {
  run_work *rw = w->data;
  if (status < 0 || rw->rc < 0)
    gn_ctl_reply_error(rw->req, 502, "cannot resolve image %s: %s", rw->ref.repository,
                       rw->err[0] ? rw->err : gn_strerror(rw->rc));
  else {
    run_tag_put(rw->n, &rw->ref, rw->asked_ms);
    run_send(rw);
  }
  json_decref(rw->cmd);
  json_decref(rw->env);
  free(rw);
}

static void api_run(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const json_t *b = gn_ctl_req_body(req);
  const char *lease_id = json_string_value(json_object_get(b, "lease"));
  const char *image = json_string_value(json_object_get(b, "image"));
  json_t *cmd = json_object_get(b, "cmd"), *env = json_object_get(b, "env");
  if (!lease_id || !image)
    return gn_ctl_reply_error(req, 400, "a job needs a lease and an --image");
  gn_lease *l = gn__lease_find(n, lease_id);
  if (!l)
    return gn_ctl_reply_error(req, 404, "no lease %s", lease_id);
  if (l->role != GN_ROLE_REQUESTER)
    return gn_ctl_reply_error(req, 409, "lease %s is provided by this node; run jobs from the renter's node", lease_id);
  if (l->state != GN_LEASE_ACTIVE)
    return gn_ctl_reply_error(req, 409, "lease %s has ended (%s)", lease_id, l->end_reason);
  if (!json_is_array(cmd) || json_array_size(cmd) == 0 || json_array_size(cmd) > GN_JOB_MAX_ARGS)
    return gn_ctl_reply_error(req, 400, "give the command after --, at most %d arguments", GN_JOB_MAX_ARGS);
  if (env && (!json_is_array(env) || json_array_size(env) > GN_JOB_MAX_ARGS))
    return gn_ctl_reply_error(req, 400, "at most %d --env values", GN_JOB_MAX_ARGS);
  for (size_t i = 0; i < json_array_size(cmd); i++) {
    const char *s = json_string_value(json_array_get(cmd, i));
    if (!s || strlen(s) > GN_JOB_MAX_ARG_LEN)
      return gn_ctl_reply_error(req, 400, "command argument %zu is not a string of at most %d bytes", i,
                                GN_JOB_MAX_ARG_LEN);
  }
  for (size_t i = 0; env && i < json_array_size(env); i++) {
    const char *s = json_string_value(json_array_get(env, i));
    if (!s || !strchr(s, '=') || s[0] == '=' || strlen(s) > GN_JOB_MAX_ARG_LEN)
      return gn_ctl_reply_error(req, 400, "--env value %zu is not of the form KEY=VALUE", i);
  }
  json_int_t memory_mib = RUN_MEMORY_MIB_DEFAULT, pids = RUN_PIDS_DEFAULT;
  if (!body_limit(b, "memory_mib", RUN_MEMORY_MIB_MIN, RUN_MEMORY_MIB_MAX, &memory_mib))
    return gn_ctl_reply_error(req, 400, "memory_mib (--memory) must be a whole number of MiB from %u to %u",
                              RUN_MEMORY_MIB_MIN, RUN_MEMORY_MIB_MAX);
  if (!body_limit(b, "pids", RUN_PIDS_MIN, RUN_PIDS_MAX, &pids))
    return gn_ctl_reply_error(req, 400, "pids (--pids) must be a whole number of processes from %u to %u", RUN_PIDS_MIN,
                              RUN_PIDS_MAX);
  run_work *rw = calloc(1, sizeof *rw);
  if (!rw)
    return gn_ctl_reply_error(req, 500, "out of memory");
  if (gn_imageref_parse(image, &rw->ref) < 0) {
    free(rw);
    return gn_ctl_reply_error(req, 400, "bad image reference %s (expected host[:port]/name[:tag][@sha256:...])", image);
  }
  rw->n = n;
  rw->req = req;
  rw->memory_mib = (uint64_t)memory_mib;
  rw->pids = (uint32_t)pids;
  gn__strf(rw->lease_id, sizeof rw->lease_id, "%s", lease_id);
  rw->cmd = json_deep_copy(cmd);
  rw->env = env ? json_deep_copy(env) : json_array();
  if (rw->ref.digest[0] || run_tag_get(n, &rw->ref)) {
    run_send(rw);
    json_decref(rw->cmd);
    json_decref(rw->env);
    free(rw);
    return;
  }
  /* The tag is resolved here, by the requester, so the manifest it signs
   * pins the exact image that will run. */
  rw->work.data = rw;
  rw->asked_ms = uv_now(n->loop);
  uv_queue_work(n->loop, &rw->work, run_resolve_work, run_resolve_done);
}

static void api_stop(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *id = gn_ctl_req_param(req, "id");
  gn_job *j = gn__job_find(n, id);
  if (!j)
    return gn_ctl_reply_error(req, 404, "no job %s", id);
  if (j->role == GN_ROLE_PROVIDER) {
    if (n->stop_provided_job)
      n->stop_provided_job(n, j);
  } else {
    gn_lease *l = gn__lease_find(n, j->lease_id);
    if (!l)
      return gn_ctl_reply_error(req, 404, "job %s has no lease", id);
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "job_id");
    gn_wire_put_str(&w, j->id);
    gn_wire_put_str(&w, "lease_id");
    gn_wire_put_str(&w, j->lease_id);
    int r = gn__node_send(n, l->peer, GN_MSG_JOB_STOP, &w);
    gn_wire_writer_done(&w);
    if (r < 0)
      return gn_ctl_reply_error(req, 502, "cannot reach the provider of job %s: %s", id, gn_strerror(r));
  }
  json_t *o = json_object();
  json_object_set_new(o, "job", gn__job_json(j));
  gn_ctl_reply_json(req, 200, o);
}

static gn_job_state state_from_name(const char *s) {
  for (int i = GN_JOB_PENDING; i <= GN_JOB_REJECTED; i++)
    if (strcmp(gn__job_state_name((gn_job_state)i), s) == 0)
      return (gn_job_state)i;
  return GN_JOB_FAILED;
}

static void on_job_status(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_job *j = gn__job_find(n, m.job_id);
  gn_lease *l = j ? gn__lease_find(n, j->lease_id) : NULL;
  if (!j || !l || j->role != GN_ROLE_REQUESTER || memcmp(l->peer, peer, GN_PK_LEN) != 0)
    goto out;
  gn_job_state st = state_from_name(m.state);
  if (m.has_pull && st == GN_JOB_PULLING) {
    /* Progress only, shown and never trusted: done is kept within total. */
    j->pull_total = m.pull_total;
    j->pull_done = m.pulled < m.pull_total ? m.pulled : m.pull_total;
    if (j->state == GN_JOB_PULLING) { /* nothing else changed: wake the long polls, persist nothing */
      if (n->job_changed)
        n->job_changed(n, j);
      goto out;
    }
  }
  bool was_over = j->state >= GN_JOB_EXITED; /* a status sent again after a lost session */
  j->state = st;
  j->exit_code = (int)m.exit_code;
  gn__strf(j->error, sizeof j->error, "%s", m.reason);
  if (m.digest[0])
    gn__strf(j->digest, sizeof j->digest, "%s", m.digest);
  if (j->state >= GN_JOB_EXITED && !(was_over && j->ended_s))
    j->ended_s = gn_unix_s();
  gn__node_persist_job(n, j);
  gn_pending *p = gn__pending_take(n, GN_PENDING_JOB, j->id);
  if (p) {
    if (j->state == GN_JOB_REJECTED) {
      gn_ctl_reply_error(p->req, 409, "provider rejected job %s: %s", j->id, j->error);
    } else {
      json_t *o = json_object();
      json_object_set_new(o, "job", gn__job_json(j));
      gn_ctl_reply_json(p->req, 201, o);
    }
    gn__pending_free(p);
  }
out:
  gn__jobmsg_done(&m);
}

static void on_job_log(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_job *j = gn__job_find(n, m.job_id);
  gn_lease *l = j ? gn__lease_find(n, j->lease_id) : NULL;
  if (!j || !l || j->role != GN_ROLE_REQUESTER || memcmp(l->peer, peer, GN_PK_LEN) != 0)
    goto out;
  /* Chunks arrive in order on one session; a resent chunk overlaps what we
   * already hold and only its new tail is kept. */
  if (j->log_len >= GN_JOB_LOG_MAX + 4096) /* the provider's cut notice may overshoot a little */
    goto out;
  if (m.offset + m.data_len > j->log_len) {
    size_t skip = m.offset < j->log_len ? (size_t)(j->log_len - m.offset) : 0;
    gn__job_append_log(j, m.data + skip, m.data_len - skip);
  }
out:
  gn__jobmsg_done(&m);
}

static void on_lease_reject_or_end(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  if (env->type == GN_MSG_LEASE_REJECT) {
    gn_pending *p = gn__pending_take(n, GN_PENDING_RENT, m.lease_id);
    if (p && memcmp(p->peer, peer, GN_PK_LEN) == 0)
      gn_ctl_reply_error(p->req, 409, "provider rejected lease %s: %s", m.lease_id, m.reason);
    if (!p)
      gn__trainreq_on_reject(n, peer, m.lease_id, m.reason); /* a gang member's? */
    gn__pending_free(p);
  } else {
    gn_lease *l = gn__lease_find(n, m.lease_id);
    if (l && l->role == GN_ROLE_REQUESTER && memcmp(l->peer, peer, GN_PK_LEN) == 0 && l->state == GN_LEASE_ACTIVE) {
      /* Our observation stops now (on our clock, whatever end_s says). */
      lease_mark_ended(l, m.reason[0] ? m.reason : "ended by the provider", 0);
      gn__node_persist_lease(n, l);
      gn_log(GN_LOG_INFO, "lease %s ended by the provider: %s", l->id, l->end_reason);
      REQ_CALL(n, l, gn_lease_req_ended(l->req, lease_now(), l->end_reason, out));
    }
  }
  gn__jobmsg_done(&m);
}

void gn__requester_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                              size_t raw_len) {
  switch (env->type) {
  case GN_MSG_LEASE_ACCEPT:
    on_lease_accept(n, peer, raw, raw_len);
    break;
  case GN_MSG_LEASE_REJECT:
  case GN_MSG_LEASE_END:
    on_lease_reject_or_end(n, peer, env);
    break;
  case GN_MSG_JOB_STATUS:
    on_job_status(n, peer, env);
    break;
  case GN_MSG_JOB_LOG:
    on_job_log(n, peer, env);
    break;
  case GN_MSG_INVOICE:
  case GN_MSG_DEBIT_NOTE:
    on_bill(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_JOB_OUTPUT: /* a training rank's /output (train_req.c) */
    gn__trainreq_on_output(n, peer, env);
    break;
  case GN_MSG_JOB_SEED_GET: /* a restarted rank's seed (train_req.c) */
    gn__trainreq_on_seed_get(n, peer, env);
    break;
  default:
    break;
  }
}

void gn__requester_tick(gn_node *n, uint64_t now_ms, int64_t now_s) {
  (void)now_s;
  /* Each machine does what is due: resending a release, re-sending our
   * acceptance, ending our observation at the lease's maximum. */
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_REQUESTER && l->req && now_ms >= l->timer_at_ms)
      REQ_CALL(n, l, gn_lease_req_timer(l->req, lease_now(), out));
  gn__trainreq_tick(n, now_ms);
}

/* --- control routes ----------------------------------------------------------*/

static void route_rent(gn_ctl_req *req, void *ud) {
  if (gn__body_id_ok(req, "offer", "offer"))
    api_rent(req, ud);
}

static void route_run(gn_ctl_req *req, void *ud) {
  if (!gn__body_id_ok(req, "lease", "lease"))
    return;
  const json_t *env = json_object_get(gn_ctl_req_body(req), "env");
  for (size_t i = 0; json_is_array(env) && i < json_array_size(env); i++) {
    const char *e = json_string_value(json_array_get(env, i));
    if (e && !gn_env_entry_valid(e))
      return gn_ctl_reply_error(
          req, 400, "--env value %zu does not start with a variable name ([A-Za-z_][A-Za-z0-9_]*) and '='", i);
  }
  api_run(req, ud);
}

/* train_req.c's release of a gang member's lease: as DELETE /v1/leases/ID
 * with no API request waiting for the invoice. */
static void train_release(gn_node *n, const char *lease_id, const char *reason) {
  gn_lease *l = gn__lease_find(n, lease_id);
  if (!l || l->role != GN_ROLE_REQUESTER || l->invoice_done || !l->req)
    return;
  if (l->state == GN_LEASE_ACTIVE) {
    lease_mark_ended(l, reason, 0);
    gn__node_persist_lease(n, l);
  }
  REQ_CALL(n, l, gn_lease_req_release(l->req, lease_now(), out));
  /* The machine sends the release once the provider's session is up (after
   * a restart nothing else dials it). */
  const char *addr = lease_provider_addr(n, l);
  if (n->tp && !gn_transport_is_up(n->tp, l->peer) && addr)
    gn__nat_connect_peer(n, addr, l->peer);
}

void gn__requester_register(gn_node *n) {
  static const gn_train_ops train_ops = {lease_adopt, train_release};
  gn__trainreq_register(n, &train_ops);
  gn_ctl_route(n->ctl, "POST", "/v1/leases", route_rent, n);
  gn_ctl_route(n->ctl, "DELETE", "/v1/leases/:id", api_release, n);
  gn_ctl_route(n->ctl, "POST", "/v1/jobs", route_run, n);
  gn_ctl_route(n->ctl, "POST", "/v1/jobs/:id/stop", api_stop, n);
}
