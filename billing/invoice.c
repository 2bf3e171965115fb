/* What remains of the invoice API from before the debit notes, on the billing
 * v2 format (billing/note.c): the display summary of a final invoice (node/
 * and the ledger's records), the check of a final invoice that continues no
 * debit note (seq 0, from 1), and the open of an answer to one (the ledger's
 * records of the invoices table). The lease machines (billing/lease_*.c)
 * make and take every bill now. */
#include "billing_int.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>

/* Opens the agreement an invoice embeds (its own signatures verified). */
static int embedded_ctx(const uint8_t *inv, size_t len, gn_buf *ag, gn__bill_ctx *ctx, char *reason, size_t cap) {
  int r = gn__invoice_agreement(inv, len, ag);
  if (r == GN_ENOMEM)
    return r;
  if (r < 0)
    return gn__fail(reason, cap, "not an invoice, or its body is malformed");
  return gn__bill_ctx_open(ag->data, ag->len, ctx, reason, cap);
}

static void summary_fill(const gn__bill_ctx *ctx, const gn_bill_note *no, gn_invoice_summary *ret) {
  gn_invoice_summary s;
  memset(&s, 0, sizeof(s));
  memcpy(s.lease_id, ctx->ag.terms.lease_id, sizeof(s.lease_id));
  gn__invoice_id(no->hash, s.invoice_id);
  memcpy(s.provider, ctx->ag.terms.provider, GN_PK_LEN);
  memcpy(s.requester, ctx->ag.terms.requester, GN_PK_LEN);
  memcpy(s.gpu_model, ctx->ag.terms.gpu_model, sizeof(s.gpu_model));
  s.gpus = ctx->ag.terms.count;
  s.price_uper_hour = ctx->ag.terms.price_uper_hour;
  memcpy(s.currency, ctx->ag.terms.currency, sizeof(s.currency));
  s.seconds = no->seconds;
  s.total_micro = no->total_micro;
  s.start_s = ctx->ag.start_s;
  s.end_s = no->final ? no->end_s : ctx->ag.start_s + (int64_t)no->seconds;
  memcpy(s.chain_head, no->chain_head, sizeof(s.chain_head));
  s.energy = no->final ? no->energy : (gn_bill_energy){false, 0, 0};
  /* end_s >= start_s in any invoice that verifies; a summary of one that
   * does not is judged on an empty window. */
  s.energy_plausible =
      gn_energy_plausible(s.gpus, s.end_s > s.start_s ? (uint64_t)(s.end_s - s.start_s) : 0, &s.energy);
  *ret = s;
}

void gn__bill_summary_fill(const gn__bill_ctx *ctx, const gn_bill_note *no, gn_invoice_summary *ret) {
  summary_fill(ctx, no, ret);
}

int gn_invoice_summarize(const uint8_t *invoice_env, size_t len, gn_invoice_summary *ret) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  gn_bill_note no;
  int r;
  gn_envelope e;
  if (!invoice_env || !ret)
    return GN_EINVAL;
  if ((r = gn_envelope_open(invoice_env, len, &e)) < 0)
    return r;
  if ((r = gn__invoice_agreement(invoice_env, len, &ag)) < 0)
    goto out;
  if ((r = gn_agreement_open(ag.data, ag.len, &ctx.ag)) < 0)
    goto out;
  ctx.env = ag.data;
  ctx.len = ag.len;
  gn__genesis(ag.data, ag.len, ctx.hash);
  r = GN_EINVAL;
  if (gn__bill_peek(invoice_env, len, &ctx, &no, NULL, 0) < 0 || !no.final)
    goto out;
  summary_fill(&ctx, &no, ret);
  r = 0;
out:
  gn_buf_done(&ag);
  return r;
}

int gn_invoice_check(const uint8_t *invoice_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                     uint64_t observed_s, uint64_t tolerance_s, gn_invoice_summary *ret, char *reason, size_t cap) {
  gn__bill_ctx ctx;
  gn_bill_head head;
  gn__bill_view v;
  gn__bill_limits lim = {true, observed_s, tolerance_s, 0, false};
  int r;
  if (reason && cap)
    reason[0] = 0;
  if (!agreement_env)
    return gn__fail(reason, cap, "no agreement to check the invoice against");
  if ((r = gn__bill_ctx_open(agreement_env, agreement_len, &ctx, reason, cap)) < 0)
    return r;
  gn__bill_head_genesis(&ctx, &head);
  if ((r = gn__bill_verify(invoice_env, len, true, &ctx, &head, &lim, &v, reason, cap)) < 0)
    return r;
  if (ret)
    summary_fill(&ctx, &v.note, ret);
  gn__bill_view_done(&v);
  return 0;
}

int gn_invoice_response_open(const uint8_t *env, size_t len, const uint8_t *invoice_env, size_t invoice_len,
                             gn_invoice_response *ret) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  gn_bill_response resp;
  gn_invoice_response out;
  uint8_t hash[GN__HASH_LEN];
  int r;
  if (!env || !invoice_env || !ret)
    return GN_EINVAL;
  if ((r = embedded_ctx(invoice_env, invoice_len, &ag, &ctx, NULL, 0)) < 0) {
    r = r == GN_ENOMEM ? r : GN_EINVAL;
    goto out;
  }
  if ((r = gn__bill_response_open(env, len, &ctx, &resp, NULL, 0)) < 0)
    goto out;
  r = GN_EPROTO;
  if (!resp.final)
    goto out;
  gn_bill_hash(invoice_env, invoice_len, hash);
  r = GN_EDIGEST;
  if (sodium_memcmp(hash, resp.hash, GN__HASH_LEN) != 0)
    goto out;
  if (resp.accepted) {
    /* A voucher must say what the invoice says (a rejection may answer an
     * invoice whose own signature is broken, so only acceptances). */
    gn_bill_note no;
    if (gn__bill_peek(invoice_env, invoice_len, &ctx, &no, NULL, 0) < 0 || gn_bill_response_matches(&resp, &no) < 0)
      goto out;
  }
  memset(&out, 0, sizeof(out));
  out.accepted = resp.accepted;
  memcpy(out.lease_id, resp.lease_id, sizeof(out.lease_id));
  memcpy(out.invoice_hash, resp.hash, GN__HASH_LEN);
  out.at_s = resp.accepted_s;
  memcpy(out.reason, resp.reason, sizeof(out.reason));
  *ret = out;
  r = 0;
out:
  gn_buf_done(&ag);
  return r;
}
