/* The requester's lease machine (include/gpunet/lease.h): its own
 * observation of the lease, the check of every debit note and of the final
 * invoice against it (through gn_bill_note_check / gn_bill_invoice_check),
 * acceptance (the cumulative voucher) or rejection, the spending cap, at most
 * one final invoice answered per lease, the release, and restarts. */
#include "lease_int.h"

#include <stdio.h>

struct gn_lease_req {
  const gn_identity *id;
  gn_buf ag;
  gn_agreement agr;
  uint32_t interval_s;
  uint64_t max_spend_micro;
  uint64_t cap_s; /* observed seconds at which the spending cap releases the lease (UINT64_MAX: never) */
  int phase;

  /* Observation on our own clocks: observed_s = base_obs + whole seconds of
   * the monotonic clock since anchor_ms. base_obs is 0 at receipt and, after
   * a restart, our UTC now minus our UTC at receipt (recv_s). */
  int64_t recv_s;
  uint64_t anchor_ms, base_obs;
  bool stopped; /* the lease ended for us: observation frozen at stop_obs */
  uint64_t stop_obs;

  gn_bill_head head;      /* after the last note we accepted */
  gn_buf acc_note;        /* that note (its voucher is re-emitted after a restart) */
  gn_bill_head prev_head; /* the head before it (has_prev) */
  bool has_prev;

  bool released;
  uint64_t rel_resend_at_ms, rel_backoff_ms;
  bool peer_up;
  char end_reason[64];

  /* The final invoice we answered (SETTLED). */
  uint8_t final_hash[32];
  bool final_accepted;
  char final_reason[256]; /* our rejection's reason */
  gn_buf final_inv, final_resp;
};

gn_lease_req *gn_lease_req_free(gn_lease_req *m) {
  if (!m)
    return NULL;
  gn_buf_done(&m->ag);
  gn_buf_done(&m->acc_note);
  gn_buf_done(&m->final_inv);
  gn_buf_done(&m->final_resp);
  free(m);
  return NULL;
}

static uint64_t req_observed(const gn_lease_req *m, gn_lease_now now) {
  if (m->stopped)
    return m->stop_obs;
  return m->base_obs + (now.mono_ms >= m->anchor_ms ? (now.mono_ms - m->anchor_ms) / 1000u : 0);
}

static int req_open(const gn_identity *id, const uint8_t *ag, size_t ag_len, gn_lease_req **ret) {
  gn_lease_req *m = NULL;
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
  if (memcmp(m->agr.terms.requester, id->pk, GN_PK_LEN) != 0) {
    r = GN_EPERM;
    goto fail;
  }
  if (m->agr.terms.interval_s == 0) {
    r = GN_EINVAL;
    goto fail;
  }
  m->interval_s = m->agr.terms.interval_s;
  m->phase = GN_LEASE_PHASE_ACTIVE;
  *ret = m;
  return 0;
fail:
  gn_lease_req_free(m);
  return r;
}

static int req_persist(gn_lease_req *m, gn_lease_out *out) {
  gn_wire_writer w;
  gn_buf b = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 19);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN__LEASE_STATE_VERSION);
  gn_wire_put_str(&w, "role");
  gn_wire_put_str(&w, "requester");
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, m->agr.terms.lease_id);
  gn_wire_put_str(&w, "phase");
  gn_wire_put_u64(&w, (uint64_t)m->phase);
  gn__lease_put_head(&w, "head", &m->head);
  gn__lease_put_head(&w, "prev_head", &m->prev_head);
  gn_wire_put_str(&w, "has_prev");
  gn_wire_put_bool(&w, m->has_prev);
  gn_wire_put_str(&w, "recv_s");
  gn_wire_put_i64(&w, m->recv_s);
  gn_wire_put_str(&w, "max_spend");
  gn_wire_put_u64(&w, m->max_spend_micro);
  gn_wire_put_str(&w, "released");
  gn_wire_put_bool(&w, m->released);
  gn_wire_put_str(&w, "stopped");
  gn_wire_put_bool(&w, m->stopped);
  gn_wire_put_str(&w, "stop_obs");
  gn_wire_put_u64(&w, m->stop_obs);
  gn_wire_put_str(&w, "end_reason");
  gn_wire_put_str(&w, m->end_reason);
  gn_wire_put_str(&w, "final_hash");
  gn_wire_put_bin(&w, m->final_hash, sizeof(m->final_hash));
  gn_wire_put_str(&w, "final_accepted");
  gn_wire_put_bool(&w, m->final_accepted);
  gn_wire_put_str(&w, "final_resp");
  gn_wire_put_bin(&w, m->final_resp.data, m->final_resp.len);
  /* The answered invoice is kept only for re-emitting SETTLED; one so big
   * that it would not fit beside the rest (a hostile provider's) is left
   * out: its hash and our answer are what matter. */
  bool keep_inv = m->final_inv.len + m->acc_note.len + m->final_resp.len <= GN_LEASE_STATE_MAX - 65536u;
  gn_wire_put_str(&w, "final_inv");
  gn_wire_put_bin(&w, m->final_inv.data, keep_inv ? m->final_inv.len : 0);
  gn_wire_put_str(&w, "acc_note");
  gn_wire_put_bin(&w, m->acc_note.data, m->acc_note.len);
  gn_wire_put_str(&w, "final_reason");
  gn_wire_put_str(&w, m->final_reason);
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

static int req_send(gn_lease_out *out, const uint8_t *p, size_t n) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_SEND);
  return a ? gn__lease_act_bytes(out, a, false, p, n) : GN_ENOMEM;
}

/* The lease is over for us (released, the provider said so, or its final
 * invoice came): observation stops at now. True if it just ended: the caller
 * persists, then emits END (req_emit_end), so that a crash in between
 * restarts an ended lease. */
static bool req_end(gn_lease_req *m, gn_lease_now now, const char *reason) {
  if (!m->stopped) {
    m->stop_obs = req_observed(m, now);
    m->stopped = true;
  }
  if (m->phase != GN_LEASE_PHASE_ACTIVE)
    return false;
  m->phase = GN_LEASE_PHASE_ENDED;
  gn__lease_reason(m->end_reason, sizeof(m->end_reason), reason);
  return true;
}

static int req_emit_end(gn_lease_req *m, gn_lease_out *out) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_END);
  if (!a)
    return GN_ENOMEM;
  gn__lease_reason(a->reason, sizeof(a->reason), m->end_reason);
  return 0;
}

/* With a spending cap, the lease is released once the observation reaches
 * the last second s at which even the most an honest provider may bill (s
 * plus the tolerance) stays within the cap: the final invoice is then paid
 * in full instead of rejected for crossing the cap. */
static uint64_t req_cap_s(const gn_lease_req *m) {
  const gn_lease_terms *t = &m->agr.terms;
  uint64_t lo = 0, hi = t->max_s;
  if (m->max_spend_micro == 0)
    return UINT64_MAX;
  if (gn_price_cost(t->price_uper_hour, t->count, hi + gn_bill_tolerance_s(hi)) <= m->max_spend_micro)
    return UINT64_MAX; /* the whole lease fits */
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo + 1) / 2;
    if (gn_price_cost(t->price_uper_hour, t->count, mid + gn_bill_tolerance_s(mid)) <= m->max_spend_micro)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

static int req_do_release(gn_lease_req *m, gn_lease_now now, const char *reason, gn_lease_out *out) {
  m->released = true;
  m->rel_backoff_ms = gn__lease_resend_ms(m->interval_s);
  m->rel_resend_at_ms = now.mono_ms;
  bool ended = req_end(m, now, reason);
  int r = req_persist(m, out);
  if (r == 0 && ended)
    r = req_emit_end(m, out);
  return r;
}

static int req_step(gn_lease_req *m, gn_lease_now now, gn_lease_out *out) {
  if (m->cap_s != UINT64_MAX && !m->released && !m->stopped && m->phase == GN_LEASE_PHASE_ACTIVE) {
    if (req_observed(m, now) >= m->cap_s) {
      int r = req_do_release(m, now, "spending cap reached", out);
      if (r < 0)
        return r;
    } else {
      gn__lease_timer(out, m->anchor_ms + (m->cap_s - m->base_obs) * 1000u);
    }
  }
  if (!m->released || m->phase == GN_LEASE_PHASE_SETTLED || !m->peer_up)
    return 0;
  if (now.mono_ms >= m->rel_resend_at_ms) {
    if (!gn__lease_act(out, GN_LEASE_ACT_RELEASE))
      return GN_ENOMEM;
    m->rel_resend_at_ms = now.mono_ms + m->rel_backoff_ms;
    m->rel_backoff_ms *= 2;
    if (m->rel_backoff_ms > GN_LEASE_INVOICE_RESEND_MAX_MS)
      m->rel_backoff_ms = GN_LEASE_INVOICE_RESEND_MAX_MS;
  }
  gn__lease_timer(out, m->rel_resend_at_ms);
  return 0;
}

/* The voucher of the head (after an acceptance, and again after a restart:
 * the glue stores it idempotently; the acceptance is deterministic). */
static int req_emit_voucher(gn_lease_req *m, const gn_buf *acc, gn_lease_out *out) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_VOUCHER);
  if (!a)
    return GN_ENOMEM;
  int r = gn__lease_act_bytes(out, a, false, m->acc_note.data, m->acc_note.len);
  return r < 0 ? r : gn__lease_act_bytes(out, a, true, acc->data, acc->len);
}

static int req_emit_settled(gn_lease_req *m, const char *reason, gn_lease_out *out) {
  gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_SETTLED);
  if (!a)
    return GN_ENOMEM;
  a->accepted = m->final_accepted;
  gn__lease_reason(a->reason, sizeof(a->reason), reason);
  int r = gn__lease_act_bytes(out, a, false, m->final_inv.data, m->final_inv.len);
  return r < 0 ? r : gn__lease_act_bytes(out, a, true, m->final_resp.data, m->final_resp.len);
}

int gn_lease_req_new(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len,
                     uint64_t max_spend_micro, gn_lease_now now, gn_lease_req **ret, gn_lease_out *out) {
  gn_lease_req *m = NULL;
  if (!out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  int r = req_open(id, agreement_env, agreement_len, &m);
  if (r < 0)
    return r;
  m->max_spend_micro = max_spend_micro;
  m->cap_s = req_cap_s(m);
  m->recv_s = now.utc_s;
  m->anchor_ms = now.mono_ms;
  m->peer_up = true;
  if ((r = req_persist(m, out)) < 0 || (r = req_step(m, now, out)) < 0) {
    gn_lease_req_free(m);
    gn__lease_out_reset(out);
    return r;
  }
  *ret = m;
  return 0;
}

static int req_restore_state(gn_lease_req *m, const uint8_t *state, size_t len) {
  gn_wire_doc doc;
  char role[16], lease_id[GN_LEASE_ID_STRLEN];
  uint64_t v, phase;
  const uint8_t *p;
  size_t n;
  int r = gn_wire_decode(state, len, &doc);
  if (r < 0)
    return GN_EINVAL;
  r = GN_EINVAL;
  if (doc.root->type != MSGPACK_OBJECT_MAP || gn_wire_get_u64(doc.root, "v", &v) < 0 || v != GN__LEASE_STATE_VERSION ||
      gn_wire_get_str(doc.root, "role", role, sizeof(role)) < 0 || strcmp(role, "requester") != 0 ||
      gn_wire_get_str(doc.root, "lease_id", lease_id, sizeof(lease_id)) < 0 ||
      strcmp(lease_id, m->agr.terms.lease_id) != 0 || gn_wire_get_u64(doc.root, "phase", &phase) < 0 ||
      phase < GN_LEASE_PHASE_ACTIVE || phase > GN_LEASE_PHASE_SETTLED ||
      gn__lease_get_head(doc.root, "head", &m->head) < 0 ||
      gn__lease_get_head(doc.root, "prev_head", &m->prev_head) < 0 ||
      gn_wire_get_bool(doc.root, "has_prev", &m->has_prev) < 0 || gn_wire_get_i64(doc.root, "recv_s", &m->recv_s) < 0 ||
      gn_wire_get_u64(doc.root, "max_spend", &m->max_spend_micro) < 0 ||
      gn_wire_get_bool(doc.root, "released", &m->released) < 0 ||
      gn_wire_get_bool(doc.root, "stopped", &m->stopped) < 0 ||
      gn_wire_get_u64(doc.root, "stop_obs", &m->stop_obs) < 0 ||
      gn_wire_get_str(doc.root, "end_reason", m->end_reason, sizeof(m->end_reason)) < 0 ||
      gn_wire_get_bin_exact(doc.root, "final_hash", m->final_hash, sizeof(m->final_hash)) < 0 ||
      gn_wire_get_bool(doc.root, "final_accepted", &m->final_accepted) < 0 ||
      gn_wire_get_bin_ref(doc.root, "final_resp", GN_MSG_MAX, &p, &n) < 0)
    goto out;
  m->phase = (int)phase;
  if (gn_buf_append(&m->final_resp, p, n) < 0) {
    r = GN_ENOMEM;
    goto out;
  }
  if (gn_wire_get_bin_ref(doc.root, "final_inv", GN_MSG_MAX, &p, &n) < 0)
    goto out;
  if (gn_buf_append(&m->final_inv, p, n) < 0) {
    r = GN_ENOMEM;
    goto out;
  }
  if (gn_wire_get_bin_ref(doc.root, "acc_note", GN_MSG_MAX, &p, &n) < 0 ||
      gn_wire_get_str(doc.root, "final_reason", m->final_reason, sizeof(m->final_reason)) < 0)
    goto out;
  if (gn_buf_append(&m->acc_note, p, n) < 0) {
    r = GN_ENOMEM;
    goto out;
  }
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn_lease_req_restore(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len,
                         const uint8_t *state, size_t state_len, gn_lease_now now, gn_lease_req **ret,
                         gn_lease_out *out) {
  gn_lease_req *m = NULL;
  if (!out || !state || state_len > GN_LEASE_STATE_MAX)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  int r = req_open(id, agreement_env, agreement_len, &m);
  if (r < 0)
    return r;
  if ((r = req_restore_state(m, state, state_len)) < 0) {
    gn_lease_req_free(m);
    return r;
  }
  /* Our own clock since our own receipt: never the provider's start_s. A
   * UTC that went back counts as no time at all. */
  m->base_obs = now.utc_s > m->recv_s ? (uint64_t)(now.utc_s - m->recv_s) : 0;
  m->anchor_ms = now.mono_ms;
  m->cap_s = req_cap_s(m);
  m->peer_up = false;
  m->rel_backoff_ms = gn__lease_resend_ms(m->interval_s);
  m->rel_resend_at_ms = now.mono_ms;
  /* What the glue records is emitted again: a crash may have fallen between
   * the PERSIST and these. */
  if (m->head.seq > 0 && m->acc_note.len) {
    gn_buf acc = {0};
    r = gn_bill_note_accept_seal(m->id, m->ag.data, m->ag.len, &m->head, &acc);
    if (r == 0)
      r = req_emit_voucher(m, &acc, out);
    gn_buf_done(&acc);
  }
  if (r == 0 && m->phase == GN_LEASE_PHASE_SETTLED)
    r = req_emit_settled(m, m->final_reason, out);
  if (r == 0)
    r = req_step(m, now, out);
  if (r < 0) {
    gn_lease_req_free(m);
    gn__lease_out_reset(out);
    return r;
  }
  *ret = m;
  return 0;
}

/* Re-sends our acceptance of the head (deterministic: the same bytes). */
static int req_resend_accept(gn_lease_req *m, gn_lease_out *out) {
  gn_buf acc = {0};
  if (m->head.seq == 0)
    return 0;
  int r = gn_bill_note_accept_seal(m->id, m->ag.data, m->ag.len, &m->head, &acc);
  if (r == 0)
    r = req_send(out, acc.data, acc.len);
  gn_buf_done(&acc);
  return r;
}

static int req_note(gn_lease_req *m, gn_lease_now now, const uint8_t *env, size_t len, gn_lease_out *out) {
  gn_bill_head next;
  gn_bill_note note;
  gn_buf resp = {0};
  char reason[256] = "";
  uint64_t obs = req_observed(m, now);
  /* Once the final invoice is answered no note is: one still in flight from
   * before the end is obsolete, and nothing is owed for one sent after. */
  if (m->phase == GN_LEASE_PHASE_SETTLED)
    return GN_ESTATE;
  int r = gn_bill_note_check(env, len, m->ag.data, m->ag.len, &m->head, obs, gn_bill_tolerance_s(obs),
                             m->max_spend_micro, &next, &note, reason, sizeof(reason));
  if (r == GN_ESTATE) {
    /* The provider missed our acceptance (or repeats a note): ours again. */
    return m->phase == GN_LEASE_PHASE_SETTLED ? 0 : req_resend_accept(m, out);
  }
  if (r == 0) {
    if ((r = gn_bill_note_accept_seal(m->id, m->ag.data, m->ag.len, &next, &resp)) < 0)
      goto out;
    m->prev_head = m->head;
    m->has_prev = true;
    m->head = next;
    m->acc_note.len = 0;
    if ((r = gn_buf_append(&m->acc_note, env, len)) < 0 || (r = req_persist(m, out)) < 0 ||
        (r = req_emit_voucher(m, &resp, out)) < 0)
      goto out;
    r = req_send(out, resp.data, resp.len);
    goto out;
  }
  if (r != GN_EAUDIT)
    goto out;
  /* Rejected: tell the provider why (it ends the lease). */
  if ((r = gn_bill_note_reject_seal(m->id, m->ag.data, m->ag.len, env, len, reason, &resp)) == 0) {
    gn_lease_action *a = gn__lease_act(out, GN_LEASE_ACT_REJECTED);
    if (!a) {
      r = GN_ENOMEM;
      goto out;
    }
    gn__lease_reason(a->reason, sizeof(a->reason), reason);
    if ((r = gn__lease_act_bytes(out, a, false, env, len)) < 0 ||
        (r = gn__lease_act_bytes(out, a, true, resp.data, resp.len)) < 0 ||
        (r = req_send(out, resp.data, resp.len)) < 0)
      goto out;
    r = GN_EAUDIT;
  }
out:
  gn_buf_done(&resp);
  return r;
}

/* Answers a final invoice: settles the lease for us either way. */
static int req_settle(gn_lease_req *m, gn_lease_now now, const uint8_t *env, size_t len, const gn_buf *resp,
                      bool accepted, const char *reason, const char *note_end_reason, gn_lease_out *out) {
  gn_bill_hash(env, len, m->final_hash);
  m->final_accepted = accepted;
  gn__lease_reason(m->final_reason, sizeof(m->final_reason), reason);
  m->final_resp.len = m->final_inv.len = 0;
  int r = gn_buf_append(&m->final_resp, resp->data, resp->len);
  if (r == 0)
    r = gn_buf_append(&m->final_inv, env, len);
  char why[64];
  snprintf(why, sizeof(why), "%s", accepted ? "the provider ended the lease" : "final invoice rejected");
  if (accepted && note_end_reason && note_end_reason[0])
    snprintf(why, sizeof(why), "provider: %.50s", note_end_reason);
  bool ended = req_end(m, now, why);
  m->phase = GN_LEASE_PHASE_SETTLED;
  if (r == 0)
    r = req_persist(m, out);
  if (r == 0 && ended)
    r = req_emit_end(m, out);
  if (r == 0)
    r = req_emit_settled(m, reason, out);
  if (r == 0)
    r = req_send(out, resp->data, resp->len);
  return r;
}

static int req_invoice(gn_lease_req *m, gn_lease_now now, const uint8_t *env, size_t len, gn_lease_out *out) {
  gn_bill_head fin, ignored;
  gn_bill_note note;
  gn_buf resp = {0};
  char reason[256] = "";
  uint8_t hash[32];
  int r;
  if (m->phase == GN_LEASE_PHASE_SETTLED) {
    gn_bill_hash(env, len, hash);
    if (memcmp(hash, m->final_hash, 32) == 0)
      return req_send(out, m->final_resp.data, m->final_resp.len); /* the same answer again */
    /* At most one final invoice per lease is answered. */
    r = gn_bill_invoice_reject_seal(m->id, m->ag.data, m->ag.len, env, len,
                                    m->final_accepted ? "a final invoice of this lease was already countersigned"
                                                      : "the final invoice of this lease was already rejected",
                                    &resp);
    if (r == 0)
      r = req_send(out, resp.data, resp.len);
    gn_buf_done(&resp);
    return r < 0 ? r : GN_EAUDIT;
  }
  /* The end is known now: the observation stops here. */
  if (!m->stopped) {
    m->stop_obs = req_observed(m, now);
    m->stopped = true;
  }
  uint64_t obs = m->stop_obs;
  r = gn_bill_invoice_check(env, len, m->ag.data, m->ag.len, &m->head, obs, gn_bill_tolerance_s(obs),
                            m->max_spend_micro, &fin, &note, reason, sizeof(reason));
  if (r == 0) {
    if ((r = gn_bill_invoice_accept_seal(m->id, m->ag.data, m->ag.len, &fin, now.utc_s, &resp)) == 0)
      r = req_settle(m, now, env, len, &resp, true, "", note.end_reason, out);
    gn_buf_done(&resp);
    return r;
  }
  if (r != GN_EAUDIT)
    return r;
  /* An invoice continuing the note before our head: the provider missed our
   * last acceptance. It gets that acceptance again, not a rejection. */
  if (m->has_prev && gn_bill_note_open(env, len, m->ag.data, m->ag.len, &m->prev_head, &ignored, &note, NULL, 0) == 0 &&
      note.final)
    return req_resend_accept(m, out);
  /* Our one answer goes to the final invoice of this lease that continues
   * our head and fails only our limits (observation, spending cap): that is
   * the dispute. Anything else (another lease's, a broken chain) is
   * rejected without using it up. */
  bool dispute =
      gn_bill_note_open(env, len, m->ag.data, m->ag.len, &m->head, &ignored, &note, NULL, 0) == 0 && note.final;
  if ((r = gn_bill_invoice_reject_seal(m->id, m->ag.data, m->ag.len, env, len, reason, &resp)) == 0)
    r = dispute ? req_settle(m, now, env, len, &resp, false, reason, NULL, out) : req_send(out, resp.data, resp.len);
  gn_buf_done(&resp);
  return r < 0 ? r : GN_EAUDIT;
}

int gn_lease_req_recv(gn_lease_req *m, gn_lease_now now, const uint8_t *env, size_t len, gn_lease_out *out) {
  gn_envelope e;
  int r;
  if (!m || !out || !env)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  /* Only what the agreement's provider signed can change anything. */
  if ((r = gn_envelope_open(env, len, &e)) < 0)
    goto out;
  if (memcmp(e.signer, m->agr.terms.provider, GN_PK_LEN) != 0) {
    r = GN_EPERM;
    goto out;
  }
  if (e.type == GN_MSG_DEBIT_NOTE)
    r = req_note(m, now, env, len, out);
  else if (e.type == GN_MSG_INVOICE)
    r = req_invoice(m, now, env, len, out);
  else
    r = GN_EPROTO;
out:;
  int s = req_step(m, now, out);
  return r < 0 ? r : s;
}

int gn_lease_req_release(gn_lease_req *m, gn_lease_now now, gn_lease_out *out) {
  if (!m || !out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  if (m->released || m->phase == GN_LEASE_PHASE_SETTLED)
    return req_step(m, now, out);
  int r = req_do_release(m, now, "released", out);
  return r < 0 ? r : req_step(m, now, out);
}

int gn_lease_req_ended(gn_lease_req *m, gn_lease_now now, const char *reason, gn_lease_out *out) {
  if (!m || !out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  char why[64];
  snprintf(why, sizeof(why), "provider: %s", reason ? reason : "ended");
  bool was = m->stopped;
  bool ended = req_end(m, now, why);
  int r = 0;
  if (!was || ended)
    r = req_persist(m, out);
  if (r == 0 && ended)
    r = req_emit_end(m, out);
  return r < 0 ? r : req_step(m, now, out);
}

int gn_lease_req_peer(gn_lease_req *m, gn_lease_now now, bool up, gn_lease_out *out) {
  if (!m || !out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  if (up && !m->peer_up) {
    m->rel_resend_at_ms = now.mono_ms;
    m->rel_backoff_ms = gn__lease_resend_ms(m->interval_s);
  }
  m->peer_up = up;
  return req_step(m, now, out);
}

int gn_lease_req_timer(gn_lease_req *m, gn_lease_now now, gn_lease_out *out) {
  if (!m || !out)
    return GN_EINVAL;
  gn__lease_out_reset(out);
  return req_step(m, now, out);
}

void gn_lease_req_info(const gn_lease_req *m, gn_lease_now now, gn_lease_info *ret) {
  memset(ret, 0, sizeof(*ret));
  memcpy(ret->lease_id, m->agr.terms.lease_id, sizeof(ret->lease_id));
  ret->phase = m->phase;
  ret->interval_s = m->interval_s;
  ret->seconds = req_observed(m, now);
  ret->accepted_s = m->head.seconds;
  ret->accepted_seq = m->head.seq;
  ret->accepted_micro = m->head.total_micro;
  ret->released = m->released;
  ret->invoice_accepted = m->final_accepted;
  memcpy(ret->end_reason, m->end_reason, sizeof(ret->end_reason));
}
