/* The provider's lease machine (include/gpunet/lease.h): the metering
 * schedule, a debit note every interval_s metered seconds, credit control
 * (payment timeout, an unreachable requester, a rejection), the end and the
 * final invoice continuing the last accepted note, and restarts. Also the
 * action list and persisted-state helpers both machines share. */
#include "lease_int.h"

#include <stdio.h>

/* --- shared helpers ---------------------------------------------------------*/

void gn_lease_out_init(gn_lease_out *out) {
  memset(out, 0, sizeof(*out));
  out->timer_at_ms = UINT64_MAX;
}

void gn_lease_out_done(gn_lease_out *out) {
  if (!out)
    return;
  for (size_t i = 0; i < GN_ARRAY_SIZE(out->bufs); i++)
    gn_buf_done(&out->bufs[i]);
  gn_lease_out_init(out);
}

void gn__lease_out_reset(gn_lease_out *out) {
  for (size_t i = 0; i < GN_ARRAY_SIZE(out->bufs); i++)
    out->bufs[i].len = 0;
  memset(out->act, 0, sizeof(out->act));
  out->n = 0;
  out->timer_at_ms = UINT64_MAX;
}

gn_lease_action *gn__lease_act(gn_lease_out *out, int kind) {
  if (out->n >= GN_LEASE_MAX_ACTIONS)
    return NULL;
  gn_lease_action *a = &out->act[out->n++];
  memset(a, 0, sizeof(*a));
  a->kind = kind;
  return a;
}

int gn__lease_act_bytes(gn_lease_out *out, gn_lease_action *a, bool second, const uint8_t *p, size_t n) {
  size_t i = (size_t)(a - out->act) * 2 + (second ? 1 : 0);
  gn_buf *b = &out->bufs[i];
  b->len = 0;
  int r = gn_buf_append(b, p, n);
  if (r < 0)
    return r;
  if (second) {
    a->data2 = b->data;
    a->len2 = n;
  } else {
    a->data = b->data;
    a->len = n;
  }
  return 0;
}

uint64_t gn__lease_resend_ms(uint32_t interval_s) {
  uint64_t ms = (uint64_t)interval_s * 250u;
  if (ms < GN_LEASE_RESEND_MIN_MS)
    ms = GN_LEASE_RESEND_MIN_MS;
  if (ms > GN_LEASE_RESEND_MAX_MS)
    ms = GN_LEASE_RESEND_MAX_MS;
  return ms;
}

void gn__lease_reason(char *dst, size_t cap, const char *s) {
  size_t n = 0;
  if (!cap)
    return;
  for (; s && s[n] && n + 1 < cap; n++)
    dst[n] = (unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e ? '?' : s[n];
  dst[n] = 0;
}

void gn__lease_put_head(gn_wire_writer *w, const char *key, const gn_bill_head *h) {
  uint8_t b[GN_BILL_HEAD_LEN];
  gn_bill_head_encode(h, b);
  gn_wire_put_str(w, key);
  gn_wire_put_bin(w, b, sizeof(b));
}

int gn__lease_get_head(const msgpack_object *map, const char *key, gn_bill_head *ret) {
  const uint8_t *p;
  size_t n;
  int r = gn_wire_get_bin_ref(map, key, GN_BILL_HEAD_LEN, &p, &n);
  return r < 0 ? r : gn_bill_head_decode(p, n, ret);
}

int gn_lease_state_peek(const uint8_t *state, size_t len, gn_lease_state_info *ret) {
  gn_wire_doc doc;
  gn_lease_state_info info;
  char role[16];
  uint64_t v, phase;
  gn_bill_head head;
  memset(&info, 0, sizeof(info));
  if (!state || len > GN_LEASE_STATE_MAX)
    return GN_EINVAL;
  int r = gn_wire_decode(state, len, &doc);
  if (r < 0)
    return GN_EINVAL;
  if (doc.root->type != MSGPACK_OBJECT_MAP || gn_wire_get_u64(doc.root, "v", &v) < 0 || v != GN__LEASE_STATE_VERSION ||
      gn_wire_get_str(doc.root, "role", role, sizeof(role)) < 0 ||
      gn_wire_get_str(doc.root, "lease_id", info.lease_id, sizeof(info.lease_id)) < 0 ||
      gn_wire_get_u64(doc.root, "phase", &phase) < 0 || phase < GN_LEASE_PHASE_ACTIVE ||
      phase > GN_LEASE_PHASE_SETTLED || gn__lease_get_head(doc.root, "head", &head) < 0 ||
      (strcmp(role, "provider") != 0 && strcmp(role, "requester") != 0)) {
    r = GN_EINVAL;
    goto out;
  }
  info.provider = strcmp(role, "provider") == 0;
  info.phase = (int)phase;
  info.ticks_from = head.seconds + 1;
  *ret = info;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

/* --- the provider -----------------------------------------------------------*/

/* A debit note issued after the last accepted one. */
typedef struct prov_pend {
  gn_buf env;
  gn_bill_head next; /* the head its acceptance leads to */
  int64_t issued_s;
  /* When it first went to the requester (monotonic), for the latency of its
   * acceptance; not persisted: a restored note's acceptance is not timed. */
  bool sent;
  uint64_t sent_ms;
} prov_pend;

struct gn_lease_prov {
  const gn_identity *id;
  gn_buf ag;
  gn_agreement agr;
  uint32_t interval_s;
  uint64_t max_s;
  int phase;

  /* Metering: second i is due when the monotonic clock reaches
   * anchor_ms + (i - anchor_tick) * 1000 (anchor_tick = 0 at the start, the
   * seconds accounted for at a restart). */
  uint64_t anchor_ms, anchor_tick;
  uint64_t metered;  /* seconds written and reported */
  uint64_t asked_to; /* a WRITE_TICKS up to this is outstanding (== metered: none) */
  uint64_t idle_to;  /* seconds up to this are written idle (a restart's gap) */
  bool asked_idle;
  gn_buf ticks; /* records of seconds head.seconds+1 .. metered */

  gn_bill_head head;         /* after the last accepted note */
  gn_buf acc_note, acc_resp; /* that note and its acceptance (re-emitted after a restart) */
  prov_pend pend[GN_LEASE_MAX_PENDING];
  size_t n_pend;
  bool unacc; /* a note issued after the last acceptance is unanswered */
  uint64_t unacc_since_ms;
  uint64_t resend_at_ms;

  bool peer_up;
  uint64_t down_since_ms;

  gn_bill_energy energy; /* the glue's figure (gn_lease_prov_energy), frozen at the end */

  int64_t end_s;
  char end_reason[64];
  gn_buf invoice;     /* the final invoice (ENDED, SETTLED) */
  gn_bill_head final; /* its head */
  uint64_t inv_resend_at_ms, inv_backoff_ms;
  uint64_t inv_sends;  /* times this invoice was sent (GN_LEASE_INVOICE_SENDS_MIN) */
  bool inv_unanswered; /* sent that often, unanswered: not sent again */
  bool inv_accepted;
  gn_buf inv_resp;
  char settle_reason[256];
};

static int prov_emit_settled(gn_lease_prov *m, gn_lease_out *out);
static int prov_emit_voucher(gn_lease_prov *m, gn_lease_out *out, uint64_t latency_ms);

static uint64_t prov_timeout_ms(const gn_lease_prov *m) {
  return (uint64_t)m->interval_s * 2u * 1000u; /* payment_timeout_s = grace_s = 2 * interval_s */
}

static void pend_clear(gn_lease_prov *m) {
  for (size_t i = 0; i < m->n_pend; i++)
    gn_buf_done(&m->pend[i].env);
  m->n_pend = 0;
  m->unacc = false;
}

gn_lease_prov *gn_lease_prov_free(gn_lease_prov *m) {
  if (!m)
    return NULL;
  pend_clear(m);
  gn_buf_done(&m->ag);
  gn_buf_done(&m->ticks);
  gn_buf_done(&m->acc_note);
  gn_buf_done(&m->acc_resp);
  gn_buf_done(&m->invoice);
  gn_buf_done(&m->inv_resp);
  free(m);
  return NULL;
}

static int prov_open(const gn_identity *id, const uint8_t *ag, size_t ag_len, gn_lease_prov **ret) {
  gn_lease_prov *m = NULL;
  int r;
  if (!id || !ag || !ret)
    return GN_EINVAL;
  m = calloc(1, sizeof(*m));
  if (!m)
    return GN_ENOMEM;
  m->id = id;
  if ((r = gn_buf_append(&m->ag, ag, ag_len)) < 0 || (r = gn_agreement_open(ag, ag_len, &m->agr)) < 0 ||
      (r = gn_bill_head_init(ag, ag_len, &m->head)) < 0)
    goto fail;
  if (memcmp(m->agr.terms.provider, id->pk, GN_PK_LEN) != 0) {
    r = GN_EPERM;
    goto fail;
  }
  if (m->agr.terms.interval_s == 0 || m->agr.terms.max_s == 0 || m->agr.terms.max_s > GN_BILL_MAX_TICKS) {
    r = GN_EINVAL;
    goto fail;
  }
  m->interval_s = m->agr.terms.interval_s;
  m->max_s = m->agr.terms.max_s;
  m->phase = GN_LEASE_PHASE_ACTIVE;
  *ret = m;
  return 0;
fail:
  gn_lease_prov_free(m);
  return r;
}

static int prov_persist(gn_lease_prov *m, gn_lease_out *out) {
  gn_wire_writer w;
  gn_buf b = {0};
  bool ended = m->phase != GN_LEASE_PHASE_ACTIVE;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, (ended ? 16 : 9) + (m->energy.present ? 2 : 0));
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN__LEASE_STATE_VERSION);
  gn_wire_put_str(&w, "role");
  gn_wire_put_str(&w, "provider");
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, m->agr.terms.lease_id);
  gn_wire_put_str(&w, "phase");
  gn_wire_put_u64(&w, (uint64_t)m->phase);
  gn__lease_put_head(&w, "head", &m->head);
  gn_wire_put_str(&w, "metered");
  gn_wire_put_u64(&w, m->metered);
  gn_wire_put_str(&w, "acc_note");
  gn_wire_put_bin(&w, m->acc_note.data, m->acc_note.len);
  gn_wire_put_str(&w, "acc_resp");
  gn_wire_put_bin(&w, m->acc_resp.data, m->acc_resp.len);
  gn_wire_put_str(&w, "pend");
  gn_wire_put_array(&w, (uint32_t)m->n_pend);
  for (size_t i = 0; i < m->n_pend; i++) {
    gn_wire_put_map(&w, 3);
    gn_wire_put_str(&w, "env");
    gn_wire_put_bin(&w, m->pend[i].env.data, m->pend[i].env.len);
    gn__lease_put_head(&w, "next", &m->pend[i].next);
    gn_wire_put_str(&w, "issued_s");
    gn_wire_put_i64(&w, m->pend[i].issued_s);
  }
  if (ended) {
    gn_wire_put_str(&w, "end_s");
    gn_wire_put_i64(&w, m->end_s);
    gn_wire_put_str(&w, "end_reason");
    gn_wire_put_str(&w, m->end_reason);
    gn_wire_put_str(&w, "resp");
    gn_wire_put_bin(&w, m->inv_resp.data, m->inv_resp.len);
    gn_wire_put_str(&w, "accepted");
    gn_wire_put_bool(&w, m->inv_accepted);
    gn_wire_put_str(&w, "settle_reason");
    gn_wire_put_str(&w, m->settle_reason);
    gn_wire_put_str(&w, "inv_sends");
    gn_wire_put_u64(&w, m->inv_sends);
    gn_wire_put_str(&w, "inv_unanswered");
    gn_wire_put_bool(&w, m->inv_unanswered);
  }
  if (m->energy.present) {
    gn_wire_put_str(&w, "energy_mj");
    gn_wire_put_u64(&w, m->energy.mj);
    gn_wire_put_str(&w, "energy_s");
    gn_wire_put_u64(&w, m->energy.measured_s);
  }
  int r = gn_wire_writer_take(&w, &b);
  gn_wire_writer_done(&w);
  if (r == 0 && b.len > GN_LEASE_STATE_MAX)
    r = GN_ETOOBIG;
  gn_lease_action *a = r == 0 ? gn__lease_act(out, GN_LEASE_ACT_PERSIST) : NULL;
  if (r == 0 && !a)
    r = GN_ENOMEM;
  if (r == 0)
    r = gn__lease_act_bytes(out, a, false, b.data, b.len);
  gn_buf_done(&b);
  return r;
}

static int prov_send(gn_lease_out *out, const gn_buf *env) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_SEND);
  return a ? gn__lease_act_bytes(out, a, false, env->data, env->len) : GN_ENOMEM;
}

/* Seals the final invoice continuing the head with the seconds since it.
 * Trailing seconds of no GPU (the idle gap a restart wrote, when the lease
 * ended right after it) cost nothing and are left out: the requester's
 * observation may have stopped (its release) while this provider was down,
 * and seconds it did not observe would get the whole invoice rejected. */
static int prov_seal_invoice(gn_lease_prov *m) {
  uint64_t n = m->metered - m->head.seconds;
  while (n > 0 && m->ticks.data[(n - 1) * GN_BILL_TICK_LEN] == 0)
    n--;
  gn_buf_done(&m->invoice);
  return gn_bill_invoice_seal_energy(m->id, m->ag.data, m->ag.len, &m->head, m->ticks.data, n, m->end_s, m->end_reason,
                                     &m->energy, &m->invoice, &m->final);
}

/* Sends the final invoice, counting the sends. */
static int prov_send_invoice(gn_lease_prov *m, gn_lease_out *out) {
  m->inv_sends++;
  return prov_send(out, &m->invoice);
}

/* Issues the final invoice that was (re)sealed: store it, send it. A
 * re-sealed invoice is new: its sends count from 0. */
static int prov_issue_invoice(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_INVOICE);
  int r = a ? gn__lease_act_bytes(out, a, false, m->invoice.data, m->invoice.len) : GN_ENOMEM;
  m->inv_backoff_ms = gn__lease_resend_ms(m->interval_s);
  m->inv_resend_at_ms = now.mono_ms + m->inv_backoff_ms;
  m->inv_sends = 0;
  m->inv_unanswered = false;
  if (r == 0 && m->peer_up)
    r = prov_send_invoice(m, out);
  return r;
}

static int prov_end(gn_lease_prov *m, gn_lease_now now, const char *reason, gn_lease_out *out) {
  if (m->phase != GN_LEASE_PHASE_ACTIVE)
    return 0;
  m->phase = GN_LEASE_PHASE_ENDED;
  gn__lease_reason(m->end_reason, sizeof(m->end_reason), reason);
  /* A write still outstanding is not billed: the lease stops at what was
   * reported. The invoice's window must hold its seconds even if the UTC
   * clock stepped back while the monotonic one metered. */
  m->asked_to = m->idle_to = m->metered;
  int64_t min_end = m->agr.start_s + (int64_t)m->metered;
  m->end_s = now.utc_s > min_end ? now.utc_s : min_end;
  /* Persisted before END: a crash in between restarts an ended lease (its
   * jobs are not restarted), never an active one whose jobs were killed. */
  int r = prov_seal_invoice(m);
  if (r == 0)
    r = prov_persist(m, out);
  if (r < 0)
    return r;
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_END);
  if (!a)
    return GN_ENOMEM;
  gn__lease_reason(a->reason, sizeof(a->reason), m->end_reason);
  return prov_issue_invoice(m, now, out);
}

/* The seconds the newest note (or the head) covers. */
static uint64_t prov_covered(const gn_lease_prov *m) {
  return m->n_pend ? m->pend[m->n_pend - 1].next.seconds : m->head.seconds;
}

static int prov_issue_note(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out) {
  uint64_t n = m->metered - m->head.seconds;
  if (n == 0)
    return 0;
  if (m->n_pend == GN_LEASE_MAX_PENDING)
    return prov_end(m, now, "unpaid: too many debit notes unanswered", out);
  prov_pend *p = &m->pend[m->n_pend];
  memset(p, 0, sizeof(*p));
  int r = gn_bill_note_seal(m->id, m->ag.data, m->ag.len, &m->head, m->ticks.data, n, now.utc_s, &p->env, &p->next);
  if (r < 0) {
    gn_buf_done(&p->env);
    return prov_end(m, now, "provider could not seal a debit note", out);
  }
  p->issued_s = now.utc_s;
  m->n_pend++;
  if (!m->unacc) {
    m->unacc = true;
    m->unacc_since_ms = now.mono_ms;
  }
  m->resend_at_ms = now.mono_ms + gn__lease_resend_ms(m->interval_s);
  r = prov_persist(m, out);
  if (r == 0 && m->peer_up && (r = prov_send(out, &p->env)) == 0) {
    p->sent = true;
    p->sent_ms = now.mono_ms;
  }
  return r;
}

/* Why an active lease must end at now, or NULL. */
static const char *prov_end_due(const gn_lease_prov *m, gn_lease_now now, char *reason, size_t cap) {
  uint64_t to_ms = prov_timeout_ms(m);
  if (m->metered >= m->max_s && m->asked_to == m->metered)
    return "expired";
  if (m->unacc && now.mono_ms - m->unacc_since_ms > to_ms) {
    snprintf(reason, cap, "unpaid: a debit note unanswered for %u s", 2 * m->interval_s);
    return reason;
  }
  if (!m->peer_up && now.mono_ms - m->down_since_ms > to_ms) {
    snprintf(reason, cap, "requester unreachable for %u s", 2 * m->interval_s);
    return reason;
  }
  return NULL;
}

/* Asks for the seconds due at now (a restart's idle gap first). */
static int prov_meter(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out) {
  uint64_t due = m->anchor_tick + (now.mono_ms >= m->anchor_ms ? (now.mono_ms - m->anchor_ms) / 1000u : 0);
  bool idle = m->idle_to > m->metered;
  uint64_t to = idle ? m->idle_to : due;
  if (to > m->max_s)
    to = m->max_s;
  if (to > m->metered + GN_LEASE_MAX_CATCHUP)
    to = m->metered + GN_LEASE_MAX_CATCHUP;
  if (to > m->metered) {
    gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_WRITE_TICKS);
    if (!a)
      return GN_ENOMEM;
    a->from = m->metered + 1;
    a->to = to;
    a->idle = idle;
    m->asked_to = to;
    m->asked_idle = idle;
  } else if (m->metered < m->max_s) {
    gn__lease_timer(out, m->anchor_ms + (m->metered + 1 - m->anchor_tick) * 1000u);
  }
  return 0;
}

/* Does what is due at now and sets the next timer. */
static int prov_step(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out) {
  int r = 0;
  uint64_t to_ms = prov_timeout_ms(m);
  char buf[64];
  if (m->phase == GN_LEASE_PHASE_ACTIVE) {
    const char *why = prov_end_due(m, now, buf, sizeof(buf));
    if (why) {
      if ((r = prov_end(m, now, why, out)) < 0)
        return r;
    } else {
      if (m->asked_to == m->metered && (r = prov_meter(m, now, out)) < 0)
        return r;
      if (m->n_pend && m->peer_up) {
        if (now.mono_ms >= m->resend_at_ms) {
          prov_pend *p = &m->pend[m->n_pend - 1];
          if ((r = prov_send(out, &p->env)) < 0)
            return r;
          if (!p->sent) {
            p->sent = true;
            p->sent_ms = now.mono_ms;
          }
          m->resend_at_ms = now.mono_ms + gn__lease_resend_ms(m->interval_s);
        }
        gn__lease_timer(out, m->resend_at_ms);
      }
      if (m->unacc)
        gn__lease_timer(out, m->unacc_since_ms + to_ms + 1);
      if (!m->peer_up)
        gn__lease_timer(out, m->down_since_ms + to_ms + 1);
    }
  }
  if (m->phase == GN_LEASE_PHASE_ENDED && m->peer_up && !m->inv_unanswered) {
    if (now.mono_ms >= m->inv_resend_at_ms && m->inv_sends >= GN_LEASE_INVOICE_SENDS_MIN &&
        now.utc_s - m->end_s >= GN_LEASE_INVOICE_GIVEUP_S) {
      /* The last send had its backoff to be answered: give up sending. */
      m->inv_unanswered = true;
      if ((r = prov_persist(m, out)) < 0)
        return r;
      gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_UNANSWERED);
      if (!a)
        return GN_ENOMEM;
      snprintf(a->reason, sizeof(a->reason),
               "final invoice sent %llu times in %lld s, never answered: not sent again; a provider-only claim",
               (unsigned long long)m->inv_sends, (long long)(now.utc_s - m->end_s));
      return 0;
    }
    if (now.mono_ms >= m->inv_resend_at_ms) {
      if ((r = prov_send_invoice(m, out)) < 0)
        return r;
      m->inv_backoff_ms *= 2;
      if (m->inv_backoff_ms > GN_LEASE_INVOICE_RESEND_MAX_MS)
        m->inv_backoff_ms = GN_LEASE_INVOICE_RESEND_MAX_MS;
      m->inv_resend_at_ms = now.mono_ms + m->inv_backoff_ms;
    }
    gn__lease_timer(out, m->inv_resend_at_ms);
  }
  return r;
}

int gn_lease_prov_new(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len, gn_lease_now now,
                      gn_lease_prov **ret, gn_lease_out *out) {
  gn_lease_prov *m = NULL;
  if (!out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  int r = prov_open(id, agreement_env, agreement_len, &m);
  if (r < 0)
    return r;
  m->anchor_ms = now.mono_ms;
  m->peer_up = true;
  if ((r = prov_persist(m, out)) < 0 || (r = prov_step(m, now, out)) < 0) {
    gn_lease_prov_free(m);
    gn__lease_out_reset(out);
    return r;
  }
  *ret = m;
  return 0;
}

static int ticks_valid(const gn_lease_prov *m, const uint8_t *t, size_t n, bool idle) {
  for (size_t i = 0; i < n; i++) {
    uint8_t gpus = t[2 * i], util = t[2 * i + 1];
    if (gpus > m->agr.terms.count || (util > 100 && util != GN_UTIL_UNKNOWN) || (idle && gpus != 0))
      return GN_EINVAL;
  }
  return 0;
}

static int prov_restore_state(gn_lease_prov *m, const uint8_t *state, size_t len, uint64_t *ret_metered) {
  gn_wire_doc doc;
  char role[16], lease_id[GN_LEASE_ID_STRLEN];
  uint64_t v, phase, metered;
  const msgpack_object_array *pend;
  int r = gn_wire_decode(state, len, &doc);
  if (r < 0)
    return GN_EINVAL;
  r = GN_EINVAL;
  if (doc.root->type != MSGPACK_OBJECT_MAP || gn_wire_get_u64(doc.root, "v", &v) < 0 || v != GN__LEASE_STATE_VERSION ||
      gn_wire_get_str(doc.root, "role", role, sizeof(role)) < 0 || strcmp(role, "provider") != 0 ||
      gn_wire_get_str(doc.root, "lease_id", lease_id, sizeof(lease_id)) < 0 ||
      strcmp(lease_id, m->agr.terms.lease_id) != 0 || gn_wire_get_u64(doc.root, "phase", &phase) < 0 ||
      phase < GN_LEASE_PHASE_ACTIVE || phase > GN_LEASE_PHASE_SETTLED ||
      gn__lease_get_head(doc.root, "head", &m->head) < 0 || gn_wire_get_u64(doc.root, "metered", &metered) < 0 ||
      gn_wire_get_array(doc.root, "pend", GN_LEASE_MAX_PENDING, &pend) < 0)
    goto out;
  m->phase = (int)phase;
  {
    const uint8_t *an, *ar;
    size_t anl, arl;
    if (gn_wire_get_bin_ref(doc.root, "acc_note", GN_MSG_MAX, &an, &anl) < 0 ||
        gn_wire_get_bin_ref(doc.root, "acc_resp", GN_MSG_MAX, &ar, &arl) < 0)
      goto out;
    if (gn_buf_append(&m->acc_note, an, anl) < 0 || gn_buf_append(&m->acc_resp, ar, arl) < 0) {
      r = GN_ENOMEM;
      goto out;
    }
  }
  for (uint32_t i = 0; i < pend->size; i++) {
    const msgpack_object *o = &pend->ptr[i];
    const uint8_t *p;
    size_t n;
    prov_pend *pp = &m->pend[m->n_pend];
    memset(pp, 0, sizeof(*pp));
    if (o->type != MSGPACK_OBJECT_MAP || gn_wire_get_bin_ref(o, "env", GN_MSG_MAX, &p, &n) < 0 ||
        gn__lease_get_head(o, "next", &pp->next) < 0 || gn_wire_get_i64(o, "issued_s", &pp->issued_s) < 0)
      goto out;
    if (gn_buf_append(&pp->env, p, n) < 0) {
      r = GN_ENOMEM;
      goto out;
    }
    m->n_pend++;
  }
  if (phase != GN_LEASE_PHASE_ACTIVE) {
    const uint8_t *p;
    size_t n;
    if (gn_wire_get_i64(doc.root, "end_s", &m->end_s) < 0 ||
        gn_wire_get_str(doc.root, "end_reason", m->end_reason, sizeof(m->end_reason)) < 0 ||
        gn_wire_get_bin_ref(doc.root, "resp", GN_MSG_MAX, &p, &n) < 0 ||
        gn_wire_get_bool(doc.root, "accepted", &m->inv_accepted) < 0 ||
        gn_wire_get_str(doc.root, "settle_reason", m->settle_reason, sizeof(m->settle_reason)) < 0)
      goto out;
    if (gn_buf_append(&m->inv_resp, p, n) < 0) {
      r = GN_ENOMEM;
      goto out;
    }
    /* Absent from states persisted before the sends were bounded: 0. */
    if (gn_wire_get_u64(doc.root, "inv_sends", &m->inv_sends) < 0)
      m->inv_sends = 0;
    if (gn_wire_get_bool(doc.root, "inv_unanswered", &m->inv_unanswered) < 0)
      m->inv_unanswered = false;
  }
  /* Absent from states of leases with no energy reading, and from states
   * persisted before energy was metered: no claim. */
  gn_bill_energy en = {false, 0, 0};
  if (gn_wire_get_u64(doc.root, "energy_mj", &en.mj) == 0 &&
      gn_wire_get_u64(doc.root, "energy_s", &en.measured_s) == 0 && en.measured_s >= 1 && en.mj <= INT64_MAX &&
      en.measured_s <= INT64_MAX)
    en.present = true;
  m->energy = en;
  *ret_metered = metered;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn_lease_prov_restore(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len,
                          const uint8_t *state, size_t state_len, const uint8_t *ticks, size_t n, gn_lease_now now,
                          gn_lease_prov **ret, gn_lease_out *out) {
  gn_lease_prov *m = NULL;
  uint64_t metered = 0;
  char down[64] = "";
  if (!out || !state || state_len > GN_LEASE_STATE_MAX || (n && !ticks))
    return GN_EINVAL;
  gn__lease_out_reset(out);
  int r = prov_open(id, agreement_env, agreement_len, &m);
  if (r < 0)
    return r;
  if ((r = prov_restore_state(m, state, state_len, &metered)) < 0)
    goto fail;
  /* The ledger holds every second that was reported (it is written before
   * it is reported), maybe more: a crash between the write and the report,
   * or, once the lease ended, ticks the end cancelled. */
  uint64_t have = n, want = n;
  if (m->head.seconds > m->max_s || have > m->max_s - m->head.seconds || metered < m->head.seconds ||
      metered - m->head.seconds > have) {
    r = GN_EAUDIT;
    goto fail;
  }
  if (m->phase != GN_LEASE_PHASE_ACTIVE)
    want = metered - m->head.seconds; /* an ended lease bills what it billed */
  if (ticks_valid(m, ticks, want, false) < 0) {
    r = GN_EAUDIT;
    goto fail;
  }
  if ((r = gn_buf_append(&m->ticks, ticks, want * GN_BILL_TICK_LEN)) < 0)
    goto fail;
  m->metered = m->asked_to = m->idle_to = m->head.seconds + want;
  m->peer_up = false;
  m->down_since_ms = now.mono_ms;
  if (m->phase == GN_LEASE_PHASE_ACTIVE) {
    /* The seconds the provider's own UTC says passed since the start but that
     * no tick records were not given (it was down): billed idle. */
    int64_t e = now.utc_s - m->agr.start_s;
    uint64_t elapsed = e < 0 ? 0 : (uint64_t)e;
    if (elapsed > m->max_s)
      elapsed = m->max_s;
    if (elapsed > m->metered)
      m->idle_to = elapsed;
    /* Down for longer than the grace an unreachable requester gets: the
     * lease is over (its jobs died with the provider, and a release sent
     * meanwhile could not arrive); nothing after the last tick is billed. */
    if (elapsed > m->metered && elapsed - m->metered > prov_timeout_ms(m) / 1000u)
      snprintf(down, sizeof(down), "provider down for %llu s", (unsigned long long)(elapsed - m->metered));
    m->anchor_tick = m->idle_to;
    m->anchor_ms = now.mono_ms;
    m->unacc = m->n_pend > 0;
    m->unacc_since_ms = now.mono_ms;
    m->resend_at_ms = now.mono_ms;
  } else if (m->phase == GN_LEASE_PHASE_ENDED) {
    /* Sealing is deterministic: the same invoice bytes as before the crash. */
    if ((r = prov_seal_invoice(m)) < 0)
      goto fail;
    m->inv_backoff_ms = gn__lease_resend_ms(m->interval_s);
    m->inv_resend_at_ms = now.mono_ms;
  } else {
    if ((r = prov_seal_invoice(m)) < 0)
      goto fail;
    pend_clear(m);
  }
  /* What the glue records is emitted again: a crash may have fallen between
   * the PERSIST and these. */
  if (m->head.seq > 0 && m->acc_note.len && (r = prov_emit_voucher(m, out, UINT64_MAX)) < 0)
    goto fail;
  if (m->phase == GN_LEASE_PHASE_ENDED) {
    gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_INVOICE);
    if (!a) {
      r = GN_ENOMEM;
      goto fail;
    }
    if ((r = gn__lease_act_bytes(out, a, false, m->invoice.data, m->invoice.len)) < 0)
      goto fail;
  }
  if (m->phase == GN_LEASE_PHASE_SETTLED && (r = prov_emit_settled(m, out)) < 0)
    goto fail;
  if (down[0] && (r = prov_end(m, now, down, out)) < 0)
    goto fail;
  if ((r = prov_step(m, now, out)) < 0)
    goto fail;
  *ret = m;
  return 0;
fail:
  gn_lease_prov_free(m);
  gn__lease_out_reset(out);
  return r;
}

int gn_lease_prov_ticks(gn_lease_prov *m, gn_lease_now now, uint64_t from, const uint8_t *ticks, size_t n,
                        gn_lease_out *out) {
  if (!m || !out || (n && !ticks))
    return GN_EINVAL;
  gn__lease_out_reset(out);
  if (m->phase != GN_LEASE_PHASE_ACTIVE || m->asked_to == m->metered || from != m->metered + 1 ||
      n != m->asked_to - m->metered) {
    prov_step(m, now, out);
    return GN_ESTATE;
  }
  if (ticks_valid(m, ticks, n, m->asked_idle) < 0) {
    prov_step(m, now, out);
    return GN_EINVAL;
  }
  int r = gn_buf_append(&m->ticks, ticks, n * GN_BILL_TICK_LEN);
  if (r < 0)
    return r;
  m->metered = m->asked_to;
  uint64_t next_note = (prov_covered(m) / m->interval_s + 1) * m->interval_s;
  if (m->metered >= next_note && m->metered < m->max_s && (r = prov_issue_note(m, now, out)) < 0)
    return r;
  return prov_step(m, now, out);
}

/* Emits the voucher of the head: after an acceptance, and again after a
 * restart (the glue stores it idempotently). latency_ms: from the note's
 * first send to its acceptance, UINT64_MAX when not timed. */
static int prov_emit_voucher(gn_lease_prov *m, gn_lease_out *out, uint64_t latency_ms) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_VOUCHER);
  if (!a)
    return GN_ENOMEM;
  a->timed = latency_ms != UINT64_MAX;
  a->latency_ms = a->timed ? latency_ms : 0;
  int r = gn__lease_act_bytes(out, a, false, m->acc_note.data, m->acc_note.len);
  return r < 0 ? r : gn__lease_act_bytes(out, a, true, m->acc_resp.data, m->acc_resp.len);
}

/* The requester accepted pending note i: it is the new head. */
static int prov_accepted(gn_lease_prov *m, gn_lease_now now, size_t i, const uint8_t *resp, size_t resp_len,
                         gn_lease_out *out) {
  int r;
  m->acc_note.len = m->acc_resp.len = 0;
  if ((r = gn_buf_append(&m->acc_note, m->pend[i].env.data, m->pend[i].env.len)) < 0 ||
      (r = gn_buf_append(&m->acc_resp, resp, resp_len)) < 0)
    return r;
  const prov_pend *p = &m->pend[i];
  uint64_t latency_ms = p->sent && now.mono_ms >= p->sent_ms ? now.mono_ms - p->sent_ms : UINT64_MAX;
  uint64_t drop = m->pend[i].next.seconds - m->head.seconds;
  memmove(m->ticks.data, m->ticks.data + drop * GN_BILL_TICK_LEN, m->ticks.len - drop * GN_BILL_TICK_LEN);
  m->ticks.len -= drop * GN_BILL_TICK_LEN;
  m->head = m->pend[i].next;
  /* Every other pending note continues the old head: void now. */
  pend_clear(m);
  /* An ended lease's final invoice must continue the note just accepted. */
  if (m->phase == GN_LEASE_PHASE_ENDED && (r = prov_seal_invoice(m)) < 0)
    return r;
  if ((r = prov_persist(m, out)) < 0 || (r = prov_emit_voucher(m, out, latency_ms)) < 0)
    return r;
  return m->phase == GN_LEASE_PHASE_ENDED ? prov_issue_invoice(m, now, out) : 0;
}

/* Emits SETTLED: on the answer, and again after a restart. */
static int prov_emit_settled(gn_lease_prov *m, gn_lease_out *out) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_SETTLED);
  if (!a)
    return GN_ENOMEM;
  a->accepted = m->inv_accepted;
  gn__lease_reason(a->reason, sizeof(a->reason), m->settle_reason);
  int r = gn__lease_act_bytes(out, a, false, m->invoice.data, m->invoice.len);
  return r < 0 ? r : gn__lease_act_bytes(out, a, true, m->inv_resp.data, m->inv_resp.len);
}

int gn_lease_prov_recv(gn_lease_prov *m, gn_lease_now now, const uint8_t *env, size_t len, gn_lease_out *out) {
  gn_bill_response resp;
  gn_bill_note note;
  int r;
  if (!m || !out || !env)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  if ((r = gn_bill_response_open(env, len, m->ag.data, m->ag.len, &resp)) < 0)
    goto out;
  memset(&note, 0, sizeof(note));
  memcpy(note.lease_id, m->agr.terms.lease_id, sizeof(note.lease_id));
  if (!resp.final) {
    size_t i = 0;
    while (i < m->n_pend && memcmp(m->pend[i].next.note_hash, resp.hash, 32) != 0)
      i++;
    if (i == m->n_pend) {
      /* An answer repeated, or to a note already superseded. */
      r = resp.accepted && memcmp(resp.hash, m->head.note_hash, 32) == 0 ? 0 : GN_EDIGEST;
      goto out;
    }
    const gn_bill_head *nx = &m->pend[i].next;
    memcpy(note.hash, nx->note_hash, 32);
    note.seq = nx->seq;
    note.seconds = nx->seconds;
    note.gpu_seconds = nx->gpu_seconds;
    note.total_micro = nx->total_micro;
    if ((r = gn_bill_response_matches(&resp, &note)) < 0)
      goto out;
    if (resp.accepted) {
      r = prov_accepted(m, now, i, env, len, out);
      goto out;
    }
    gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_REJECTED);
    if (!a || (r = gn__lease_act_bytes(out, a, false, env, len)) < 0) {
      r = GN_ENOMEM;
      goto out;
    }
    gn__lease_reason(a->reason, sizeof(a->reason), resp.reason);
    r = prov_end(m, now, "debit note rejected", out);
    goto out;
  }
  if (m->phase == GN_LEASE_PHASE_ACTIVE || memcmp(resp.hash, m->final.note_hash, 32) != 0) {
    r = GN_EDIGEST;
    goto out;
  }
  if (m->phase == GN_LEASE_PHASE_SETTLED) {
    r = 0; /* a repeated answer */
    goto out;
  }
  note.final = true;
  memcpy(note.hash, m->final.note_hash, 32);
  note.seq = m->final.seq;
  note.seconds = m->final.seconds;
  note.gpu_seconds = m->final.gpu_seconds;
  note.total_micro = m->final.total_micro;
  if ((r = gn_bill_response_matches(&resp, &note)) < 0)
    goto out;
  m->phase = GN_LEASE_PHASE_SETTLED;
  m->inv_accepted = resp.accepted;
  gn__lease_reason(m->settle_reason, sizeof(m->settle_reason), resp.reason);
  m->inv_resp.len = 0;
  if ((r = gn_buf_append(&m->inv_resp, env, len)) < 0)
    goto out;
  pend_clear(m);
  if ((r = prov_persist(m, out)) == 0)
    r = prov_emit_settled(m, out);
out:
  if (r >= 0)
    r = prov_step(m, now, out);
  else
    prov_step(m, now, out);
  return r;
}

int gn_lease_prov_peer(gn_lease_prov *m, gn_lease_now now, bool up, gn_lease_out *out) {
  if (!m || !out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  if (up && !m->peer_up) {
    m->peer_up = true;
    m->resend_at_ms = now.mono_ms; /* the newest note goes out now */
    m->inv_backoff_ms = gn__lease_resend_ms(m->interval_s) / 2;
    m->inv_resend_at_ms = now.mono_ms;
  } else if (!up && m->peer_up) {
    m->peer_up = false;
    m->down_since_ms = now.mono_ms;
  }
  return prov_step(m, now, out);
}

int gn_lease_prov_release(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out) {
  if (!m || !out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  int r = prov_end(m, now, "released", out);
  return r < 0 ? r : prov_step(m, now, out);
}

int gn_lease_prov_stop(gn_lease_prov *m, gn_lease_now now, const char *reason, gn_lease_out *out) {
  if (!m || !out || !reason || !reason[0] || strlen(reason) > 63)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  int r = prov_end(m, now, reason, out);
  return r < 0 ? r : prov_step(m, now, out);
}

int gn_lease_prov_timer(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out) {
  if (!m || !out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  return prov_step(m, now, out);
}

void gn_lease_prov_energy(gn_lease_prov *m, const gn_bill_energy *energy) {
  if (!m || m->phase != GN_LEASE_PHASE_ACTIVE)
    return;
  m->energy =
      energy && energy->present && energy->measured_s >= 1 && energy->mj <= INT64_MAX && energy->measured_s <= INT64_MAX
          ? *energy
          : (gn_bill_energy){false, 0, 0};
}

void gn_lease_prov_info(const gn_lease_prov *m, gn_lease_info *ret) {
  memset(ret, 0, sizeof(*ret));
  memcpy(ret->lease_id, m->agr.terms.lease_id, sizeof(ret->lease_id));
  ret->phase = m->phase;
  ret->interval_s = m->interval_s;
  ret->seconds = m->metered;
  ret->accepted_s = m->head.seconds;
  ret->accepted_seq = m->head.seq;
  ret->accepted_micro = m->head.total_micro;
  ret->pending = m->n_pend;
  ret->invoice_accepted = m->inv_accepted;
  ret->invoice_unanswered = m->phase == GN_LEASE_PHASE_ENDED && m->inv_unanswered;
  memcpy(ret->end_reason, m->end_reason, sizeof(ret->end_reason));
}
