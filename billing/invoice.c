/* The older invoice API that node/ still calls, reimplemented on the billing
 * v2 format (billing/note.c): a final invoice built from the ledger that
 * continues no debit note (seq 0, from 1), its check, countersignature or
 * rejection, and the provider's open of the answer. It goes away once node/
 * drives the lease state machines (see the report of issue 7). */
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
  *ret = s;
}

void gn__bill_summary_fill(const gn__bill_ctx *ctx, const gn_bill_note *no, gn_invoice_summary *ret) {
  summary_fill(ctx, no, ret);
}

int gn_invoice_seal(gn_ledger *l, const gn_identity *provider, const char *lease_id, int64_t end_s,
                    const char *end_reason, gn_buf *ret_env) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  gn_bill_head head;
  uint8_t *ticks = NULL, chain[GN__HASH_LEN];
  uint64_t count = 0;
  int r;
  if (!l || !provider || !lease_id || !end_reason || !ret_env)
    return GN_EINVAL;
  if ((r = gn_ledger_agreement(l, lease_id, &ag)) < 0)
    goto out;
  if ((r = gn__bill_ctx_open(ag.data, ag.len, &ctx, NULL, 0)) < 0) {
    r = GN_EINVAL;
    goto out;
  }
  r = GN_EPERM;
  if (memcmp(provider->pk, ctx.ag.terms.provider, GN_PK_LEN) != 0)
    goto out;
  if ((r = gn_ledger_tick_count(l, lease_id, &count)) < 0)
    goto out;
  r = GN_EAUDIT;
  if (count > ctx.ag.terms.max_s)
    goto out;
  r = GN_ENOMEM;
  if (!(ticks = malloc(count ? count * GN_BILL_TICK_LEN : 1)))
    goto out;
  /* Reads every second from 1, re-verifying the whole stored chain. */
  if ((r = gn_ledger_ticks(l, lease_id, 1, count, ticks, chain)) < 0)
    goto out;
  gn__bill_head_genesis(&ctx, &head);
  r = gn_bill_invoice_seal(provider, ag.data, ag.len, &head, ticks, count, end_s, end_reason, ret_env, NULL);
out:
  free(ticks);
  gn_buf_done(&ag);
  return r;
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

int gn_invoice_check_continues(const uint8_t *invoice_env, size_t len, const uint8_t *earlier_env, size_t earlier_len,
                               char *reason, size_t cap) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  gn_bill_head head;
  gn__bill_view now, before;
  char why[384];
  int r;
  if (reason && cap)
    reason[0] = 0;
  if ((r = embedded_ctx(earlier_env, earlier_len, &ag, &ctx, why, sizeof(why))) < 0) {
    r = gn__fail(reason, cap, "the earlier invoice does not verify: %s", why);
    goto out_ag;
  }
  gn__bill_head_genesis(&ctx, &head);
  if ((r = gn__bill_verify(earlier_env, earlier_len, true, &ctx, &head, NULL, &before, why, sizeof(why))) < 0) {
    r = gn__fail(reason, cap, "the earlier invoice does not verify: %s", why);
    goto out_ag;
  }
  if ((r = gn__bill_verify(invoice_env, len, true, &ctx, &head, NULL, &now, reason, cap)) < 0)
    goto out_before;
  const uint64_t n = before.note.n;
  if (now.note.n < n) {
    r = gn__fail(reason, cap,
                 "invoice bills %" PRIu64 " seconds, fewer than the %" PRIu64 " of the invoice accepted earlier",
                 now.note.seconds, before.note.seconds);
    goto out;
  }
  /* Both start from the same genesis: the first differing record is the
   * second to name. */
  for (uint64_t i = 0; i < n; i++) {
    if (memcmp(now.body.ticks + i * GN_BILL_TICK_LEN, before.body.ticks + i * GN_BILL_TICK_LEN, GN_BILL_TICK_LEN)) {
      r = gn__fail(reason, cap, "second %" PRIu64 " differs from the invoice accepted earlier", i + 1);
      goto out;
    }
  }
  r = 0;
out:
  gn__bill_view_done(&now);
out_before:
  gn__bill_view_done(&before);
out_ag:
  gn_buf_done(&ag);
  return r;
}

int gn_invoice_accept_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len, gn_buf *ret_env) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  gn_bill_head head;
  gn__bill_view v;
  int r;
  if (!requester || !invoice_env || !ret_env)
    return GN_EINVAL;
  if ((r = embedded_ctx(invoice_env, len, &ag, &ctx, NULL, 0)) < 0)
    goto out;
  r = GN_EPERM;
  if (memcmp(requester->pk, ctx.ag.terms.requester, GN_PK_LEN) != 0)
    goto out;
  gn__bill_head_genesis(&ctx, &head);
  /* Never countersign what does not verify. */
  if ((r = gn__bill_verify(invoice_env, len, true, &ctx, &head, NULL, &v, NULL, 0)) < 0)
    goto out;
  r = gn_bill_invoice_accept_seal(requester, ag.data, ag.len, &v.next, gn_unix_s(), ret_env);
  gn__bill_view_done(&v);
out:
  gn_buf_done(&ag);
  return r;
}

int gn_invoice_reject_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len, const char *reason,
                           gn_buf *ret_env) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  int r;
  if (!requester || !invoice_env || !ret_env || !reason || strlen(reason) >= 256)
    return GN_EINVAL;
  /* A rejection must work for an invoice whose own signature is broken, so
   * only the embedded agreement (signed by both parties) is trusted here. */
  if ((r = embedded_ctx(invoice_env, len, &ag, &ctx, NULL, 0)) < 0) {
    r = r == GN_ENOMEM ? r : GN_EINVAL;
    goto out;
  }
  r = gn_bill_invoice_reject_seal(requester, ag.data, ag.len, invoice_env, len, reason, ret_env);
out:
  gn_buf_done(&ag);
  return r;
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
