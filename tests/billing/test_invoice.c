/* Tests of invoices: building from the ledger, the requester's check, the
 * countersignature, the JSON export and its audit, and a table of tampered
 * invoices and exports that must each fail with a reason naming the problem. */
#include "billing/fixture.h"

#include <jansson.h>

#define N_TICKS 20

static int setup20(void **state) {
  return fx_setup_with(state, 1, 400000, N_TICKS);
}

static void seal20(fixture *f, gn_buf *inv) {
  fx_ticks(f, N_TICKS, 1);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + N_TICKS, "expired", inv), 0);
}

/* A malicious provider's edit: decode the invoice body, change it, encode and
 * sign it again with `signer` so that the envelope signature is valid. */
typedef void (*mutate_fn)(gn__invoice_body *b, uint8_t *ticks, size_t *ticks_len);

static void tamper(const gn_buf *inv, mutate_fn fn, const gn_identity *signer, gn_buf *out) {
  gn_envelope e;
  gn_wire_doc doc;
  gn__invoice_body b;
  gn_buf body = {0};
  assert_int_equal(gn_envelope_open(inv->data, inv->len, &e), 0);
  assert_int_equal(gn__invoice_body_decode(e.body, e.body_len, &doc, &b, NULL, 0), 0);
  uint8_t *ticks = calloc(1, b.ticks_len + GN__TICKREC_LEN);
  assert_non_null(ticks);
  memcpy(ticks, b.ticks, b.ticks_len);
  size_t ticks_len = b.ticks_len;
  fn(&b, ticks, &ticks_len);
  b.ticks = ticks;
  b.ticks_len = ticks_len;
  assert_int_equal(gn__invoice_body_encode(&b, &body), 0);
  assert_int_equal(gn_envelope_seal(signer, GN_MSG_INVOICE, body.data, body.len, out), 0);
  gn_wire_doc_done(&doc);
  gn_buf_done(&body);
  free(ticks);
}

static void rec_edit(uint8_t *ticks, uint32_t second, void (*edit)(gn__tickrec *r)) {
  gn__tickrec r;
  gn__tickrec_get(ticks + (second - 1) * GN__TICKREC_LEN, &r);
  edit(&r);
  gn__tickrec_put(ticks + (second - 1) * GN__TICKREC_LEN, &r);
}

static void e_gpus0(gn__tickrec *r) {
  r->gpus = 0;
}
static void e_gpus2(gn__tickrec *r) {
  r->gpus = 2;
}
static void e_late(gn__tickrec *r) {
  r->t_off += 1000;
}
static void e_early(gn__tickrec *r) {
  r->t_off = 0;
}

static void m_tick17(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  rec_edit(t, 17, e_gpus0); /* the tag from the honest chain is kept */
}
static void m_remove17(gn__invoice_body *b, uint8_t *t, size_t *n) {
  memmove(t + 16 * GN__TICKREC_LEN, t + 17 * GN__TICKREC_LEN, *n - 17 * GN__TICKREC_LEN);
  *n -= GN__TICKREC_LEN;
  b->seconds--;
  b->total_micro = gn_price_cost(b->price_uper_hour, 1, b->seconds);
}
static void m_swap5_6(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  uint8_t tmp[GN__TICKREC_LEN];
  memcpy(tmp, t + 4 * GN__TICKREC_LEN, GN__TICKREC_LEN);
  memcpy(t + 4 * GN__TICKREC_LEN, t + 5 * GN__TICKREC_LEN, GN__TICKREC_LEN);
  memcpy(t + 5 * GN__TICKREC_LEN, tmp, GN__TICKREC_LEN);
}
static void m_extra(gn__invoice_body *b, uint8_t *t, size_t *n) {
  gn__tickrec r;
  gn__tickrec_get(t + *n - GN__TICKREC_LEN, &r);
  r.idx++;
  gn__tickrec_put(t + *n, &r);
  *n += GN__TICKREC_LEN;
  b->seconds++;
}
static void m_seconds(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->seconds = 19;
}
static void m_price(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->price_uper_hour = 500000;
  b->total_micro = gn_price_cost(500000, 1, b->seconds);
}
static void m_currency(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  snprintf(b->currency, sizeof(b->currency), "USD");
}
static void m_total(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->total_micro = 4455;
}
static void m_head(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->chain_head[31] ^= 1;
}
static void m_gpus_over(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  rec_edit(t, 3, e_gpus2);
}
static void m_after_end(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  rec_edit(t, 20, e_late);
}
static void m_backwards(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  rec_edit(t, 9, e_early);
}
static void m_lease_id(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  snprintf(b->lease_id, sizeof(b->lease_id), "l-0000000000000000");
}
static void m_start(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->start_s -= 3600;
}
static void m_ragged(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)t;
  *n -= 5;
}
static void m_nothing(gn__invoice_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)t, (void)n;
}

typedef struct tamper_case {
  const char *name;
  mutate_fn fn;
  const char *want; /* substring of the reason */
} tamper_case;

static const tamper_case tamper_cases[] = {
    {"changed tick", m_tick17, "second 17: hash chain broken (tick fields or order changed)"},
    {"removed second", m_remove17, "second 17 is missing"},
    {"swapped seconds", m_swap5_6, "second 5 is missing"},
    {"more seconds than the lease allows", m_extra, "invoice bills 21 seconds but the lease allows at most 20"},
    {"seconds field", m_seconds, "seconds is 19 but the invoice lists 20 ticks"},
    {"changed price", m_price, "price_uper_hour is 500000 (0.500000 EUR/GPU-hour) but the agreement says 400000"},
    {"changed currency", m_currency, "currency is USD but the agreement says EUR"},
    {"changed total", m_total, "total_micro is 4455 but 20 seconds at 0.400000 EUR/GPU-hour for 1 GPU cost 2222"},
    {"changed chain head", m_head, "chain_head does not match the hash chain"},
    {"more GPUs than leased", m_gpus_over, "second 3: gpus is 2 but the lease has 1 GPUs"},
    {"tick after the end", m_after_end, "second 20: t_s"},
    {"time going backwards", m_backwards, "second 9: t_s"},
    {"other lease id", m_lease_id, "lease_id is l-0000000000000000 but the agreement is for lease"},
    {"moved start", m_start, "start_s is"},
    {"ragged ticks", m_ragged, "not a whole number of 12-byte records"},
};

static void test_invoice_check_accepts_honest_invoice(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_invoice_summary s;
  char reason[256] = "x";
  seal20(f, &inv);
  assert_int_equal(
      gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, &s, reason, sizeof(reason)),
      0);
  assert_string_equal(reason, "");
  assert_int_equal(s.seconds, N_TICKS);
  assert_int_equal(s.total_micro, 2222); /* floor(400000 * 20 / 3600) */
  assert_int_equal(s.price_uper_hour, 400000);
  assert_string_equal(s.currency, "EUR");
  assert_string_equal(s.lease_id, f->terms.lease_id);
  assert_memory_equal(s.provider, f->provider->pk, 32);
  assert_memory_equal(s.requester, f->requester->pk, 32);
  assert_int_equal(s.start_s, FX_START_S);
  assert_int_equal(s.end_s, FX_START_S + N_TICKS);
  assert_int_equal(s.gpus, 1);
  assert_memory_equal(s.invoice_id, "i-", 2);
  gn_tick last;
  assert_int_equal(gn_ledger_last_tick(f->ledger, f->terms.lease_id, &last), 0);
  assert_memory_equal(s.chain_head, last.hash, 32);
  gn_buf_done(&inv);
}

static void test_invoice_total_uses_gpu_seconds(void **state) {
  fixture *f = *state;
  gn_buf req = {0}, ag = {0}, inv = {0};
  gn_lease_terms t;
  gn_invoice_summary s;
  char reason[256];
  fx_terms(f, &t, 2, 400000, 100);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, t.lease_id, ag.data, ag.len), 0);
  static const uint32_t gpus[] = {2, 2, 1, 0, 2};
  for (size_t i = 0; i < GN_ARRAY_SIZE(gpus); i++)
    assert_int_equal(gn_ledger_append_tick(f->ledger, t.lease_id, FX_START_S + 1 + (int64_t)i, gpus[i], 90, NULL), 0);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, t.lease_id, FX_START_S + 5, "released", &inv), 0);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, ag.data, ag.len, 5, 0, &s, reason, sizeof(reason)), 0);
  assert_int_equal(s.seconds, 5);
  assert_int_equal(s.total_micro, 777); /* 7 GPU-seconds: floor(400000 * 7 / 3600) */
  gn_buf_done(&req);
  gn_buf_done(&ag);
  gn_buf_done(&inv);
}

static void test_invoice_of_empty_lease(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_invoice_summary s;
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S - 5, "released", &inv), 0);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, 0, 0, &s, NULL, 0), 0);
  assert_int_equal(s.seconds, 0);
  assert_int_equal(s.total_micro, 0);
  assert_int_equal(s.end_s, FX_START_S); /* raised to the start */
  gn_buf_done(&inv);
}

static void test_invoice_seal_requires_the_provider(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  fx_ticks(f, 3, 1);
  assert_int_equal(gn_invoice_seal(f->ledger, f->requester, f->terms.lease_id, FX_START_S + 3, "x", &inv), GN_EPERM);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, "l-unknown", FX_START_S + 3, "x", &inv), GN_ENOTFOUND);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 3, "bad\nreason", &inv),
                   GN_EINVAL);
  gn_buf_done(&inv);
}

static void test_invoice_check_rejects_tampering(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  seal20(f, &inv);
  /* The untouched re-encoding must pass, or the table proves nothing. */
  gn_buf same = {0};
  tamper(&inv, m_nothing, f->provider, &same);
  assert_int_equal(
      gn_invoice_check(same.data, same.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL, NULL, 0), 0);
  gn_buf_done(&same);
  for (size_t i = 0; i < GN_ARRAY_SIZE(tamper_cases); i++) {
    gn_buf bad = {0};
    char reason[512] = "";
    gn_invoice_summary s;
    memset(&s, 0x5a, sizeof(s));
    tamper(&inv, tamper_cases[i].fn, f->provider, &bad);
    int rc =
        gn_invoice_check(bad.data, bad.len, f->agreement.data, f->agreement.len, 100, 0, &s, reason, sizeof(reason));
    if (rc != GN_EAUDIT || !strstr(reason, tamper_cases[i].want))
      fail_msg("%s: rc %d, reason \"%s\", want \"%s\"", tamper_cases[i].name, rc, reason, tamper_cases[i].want);
    assert_int_equal(s.seconds, 0x5a5a5a5a5a5a5a5aull); /* untouched on failure */
    gn_buf buf = {0};
    assert_int_equal(gn_invoice_accept_seal(f->requester, bad.data, bad.len, &buf), GN_EAUDIT);
    gn_buf_done(&buf);
    gn_buf_done(&bad);
  }
  gn_buf_done(&inv);
}

static void test_invoice_check_names_broken_signature(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, other = {0};
  char reason[256], id[GN_NODE_ID_STRLEN];
  seal20(f, &inv);
  inv.data[inv.len - 10] ^= 0x08;
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL, reason,
                                    sizeof(reason)),
                   GN_EAUDIT);
  gn_node_id_format(f->provider->pk, id);
  assert_non_null(strstr(reason, "invoice signature does not verify against provider gn"));
  assert_non_null(strstr(reason, id));
  /* Validly signed, but by someone who is not the lease's provider. */
  inv.data[inv.len - 10] ^= 0x08;
  tamper(&inv, m_nothing, f->other, &other);
  assert_int_equal(gn_invoice_check(other.data, other.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL,
                                    reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "not by the lease's provider"));
  gn_buf_done(&inv);
  gn_buf_done(&other);
}

static void test_invoice_check_rejects_more_than_observed(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  char reason[256];
  seal20(f, &inv);
  assert_int_equal(
      gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, 15, 4, NULL, reason, sizeof(reason)),
      GN_EAUDIT);
  assert_non_null(strstr(reason, "invoice bills 20 seconds but only 15 were observed (tolerance 4 s)"));
  assert_int_equal(
      gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, 15, 5, NULL, reason, sizeof(reason)), 0);
  gn_buf_done(&inv);
}

static void test_invoice_check_rejects_wrong_agreement(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, req = {0}, ag = {0};
  gn_lease_terms t;
  char reason[256];
  seal20(f, &inv);
  fx_terms(f, &t, 1, 400000, 20);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, ag.data, ag.len, N_TICKS, 0, NULL, reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "is for another agreement than the one held"));
  gn_buf_done(&inv);
  gn_buf_done(&req);
  gn_buf_done(&ag);
}

static void test_invoice_check_rejects_garbage(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  char reason[256];
  seal20(f, &inv);
  for (size_t n = 0; n < inv.len; n += 13)
    assert_int_equal(
        gn_invoice_check(inv.data, n, f->agreement.data, f->agreement.len, 100, 0, NULL, reason, sizeof(reason)),
        GN_EAUDIT);
  /* An agreement is not an invoice. */
  assert_int_equal(gn_invoice_check(f->agreement.data, f->agreement.len, f->agreement.data, f->agreement.len, 100, 0,
                                    NULL, reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "not an invoice"));
  gn_buf_done(&inv);
}

static void test_invoice_accept_and_reject(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, acc = {0}, rej = {0};
  gn_invoice_response resp;
  seal20(f, &inv);
  assert_int_equal(gn_invoice_accept_seal(f->other, inv.data, inv.len, &acc), GN_EPERM);
  assert_int_equal(gn_invoice_accept_seal(f->provider, inv.data, inv.len, &acc), GN_EPERM);
  assert_int_equal(gn_invoice_accept_seal(f->requester, inv.data, inv.len, &acc), 0);
  assert_int_equal(gn_invoice_response_open(acc.data, acc.len, inv.data, inv.len, &resp), 0);
  assert_true(resp.accepted);
  assert_string_equal(resp.lease_id, f->terms.lease_id);
  uint8_t h[32];
  gn__invoice_hash(inv.data, inv.len, h);
  assert_memory_equal(resp.invoice_hash, h, 32);
  assert_true(resp.at_s > 0);
  /* A rejection works even for an invoice whose signature is broken. */
  inv.data[inv.len - 3] ^= 1;
  assert_int_equal(gn_invoice_reject_seal(f->requester, inv.data, inv.len, "second 17 is missing", &rej), 0);
  assert_int_equal(gn_invoice_response_open(rej.data, rej.len, inv.data, inv.len, &resp), 0);
  assert_false(resp.accepted);
  assert_string_equal(resp.reason, "second 17 is missing");
  /* The acceptance names the original invoice, not the changed one. */
  assert_int_equal(gn_invoice_response_open(acc.data, acc.len, inv.data, inv.len, &resp), GN_EDIGEST);
  inv.data[inv.len - 3] ^= 1;
  /* Signed by someone other than the requester. */
  gn_buf forged = {0};
  gn_envelope e;
  assert_int_equal(gn_envelope_open(acc.data, acc.len, &e), 0);
  assert_int_equal(gn_envelope_seal(f->other, GN_MSG_INVOICE_ACCEPT, e.body, e.body_len, &forged), 0);
  assert_int_equal(gn_invoice_response_open(forged.data, forged.len, inv.data, inv.len, &resp), GN_EPERM);
  acc.data[acc.len - 1] ^= 1;
  assert_int_equal(gn_invoice_response_open(acc.data, acc.len, inv.data, inv.len, &resp), GN_ESIG);
  gn_buf_done(&forged);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
  gn_buf_done(&rej);
}

/* A self-consistent rewrite (every tag and the head recomputed) verifies on
 * its own; only the earlier, countersigned note exposes it. */
static void rehash(gn__invoice_body *b, uint8_t *t, size_t *n) {
  uint8_t h[32];
  uint64_t gs = 0;
  gn__genesis(b->agreement, b->agreement_len, h);
  for (size_t i = 0; i < *n / GN__TICKREC_LEN; i++) {
    gn__tickrec r;
    gn__tickrec_get(t + i * GN__TICKREC_LEN, &r);
    gn__tick_hash(h, b->lease_id, r.idx, b->start_s + r.t_off, r.gpus, r.util, h);
    r.tag = (uint16_t)((h[0] << 8) | h[1]);
    gn__tickrec_put(t + i * GN__TICKREC_LEN, &r);
    gs += r.gpus;
  }
  memcpy(b->chain_head, h, 32);
  b->total_micro = gn_price_cost(b->price_uper_hour, 1, gs);
}
static void m_rewrite3(gn__invoice_body *b, uint8_t *t, size_t *n) {
  rec_edit(t, 3, e_gpus0);
  rehash(b, t, n);
}

static void test_invoice_continues_accepted_note(void **state) {
  fixture *f = *state;
  gn_buf note = {0}, fin = {0}, forged = {0}, other = {0};
  char reason[256];
  fx_ticks(f, 10, 1);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 10, "interval", &note), 0);
  fx_ticks(f, 10, 1);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 20, "expired", &fin), 0);
  assert_int_equal(gn_invoice_check_continues(fin.data, fin.len, note.data, note.len, reason, sizeof(reason)), 0);
  assert_int_equal(gn_invoice_check_continues(note.data, note.len, note.data, note.len, reason, sizeof(reason)), 0);
  /* Going backwards is not a continuation. */
  assert_int_equal(gn_invoice_check_continues(note.data, note.len, fin.data, fin.len, reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "invoice bills 10 seconds, fewer than the 20"));
  /* The rewrite passes the stand-alone check... */
  tamper(&fin, m_rewrite3, f->provider, &forged);
  assert_int_equal(gn_invoice_check(forged.data, forged.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL,
                                    reason, sizeof(reason)),
                   0);
  /* ...but not against the note the requester accepted. */
  assert_int_equal(gn_invoice_check_continues(forged.data, forged.len, note.data, note.len, reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_string_equal(reason, "second 3 differs from the invoice accepted earlier");
  /* An invoice of another lease never continues this one. */
  gn_buf req = {0}, ag = {0};
  gn_lease_terms t;
  fx_terms(f, &t, 1, 400000, 20);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, t.lease_id, ag.data, ag.len), 0);
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, t.lease_id, FX_START_S, "released", &other), 0);
  assert_int_equal(gn_invoice_check_continues(other.data, other.len, note.data, note.len, reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "another agreement"));
  gn_buf_done(&req);
  gn_buf_done(&ag);
  gn_buf_done(&note);
  gn_buf_done(&fin);
  gn_buf_done(&forged);
  gn_buf_done(&other);
}

/* A 7-day invoice (the most one may carry) fits in one message. */
static void test_invoice_max_size_fits_a_message(void **state) {
  fixture *f = *state;
  gn__invoice_body b;
  gn_buf body = {0}, env = {0};
  gn_envelope e;
  memset(&b, 0, sizeof(b));
  snprintf(b.lease_id, sizeof(b.lease_id), "%s", f->terms.lease_id);
  b.agreement = f->agreement.data;
  b.agreement_len = f->agreement.len;
  snprintf(b.end_reason, sizeof(b.end_reason), "%063d", 0);
  uint8_t *ticks = calloc(GN_INVOICE_MAX_S, GN__TICKREC_LEN);
  assert_non_null(ticks);
  b.ticks = ticks;
  b.ticks_len = (size_t)GN_INVOICE_MAX_S * GN__TICKREC_LEN;
  b.seconds = b.price_uper_hour = b.total_micro = UINT64_MAX;
  b.start_s = b.end_s = INT64_MIN;
  snprintf(b.currency, sizeof(b.currency), "EURABCD");
  assert_int_equal(gn__invoice_body_encode(&b, &body), 0);
  assert_int_equal(gn_envelope_seal(f->provider, GN_MSG_INVOICE, body.data, body.len, &env), 0);
  assert_true(env.len <= GN_MSG_MAX);
  assert_int_equal(gn_envelope_open(env.data, env.len, &e), 0);
  free(ticks);
  gn_buf_done(&body);
  gn_buf_done(&env);
}

/* --- export and audit ----------------------------------------------------*/

static json_t *export_of(fixture *f, const gn_buf *inv, const gn_buf *acc) {
  json_t *j = NULL;
  assert_int_equal(gn_invoice_export(inv->data, inv->len, acc ? acc->data : NULL, acc ? acc->len : 0, &j), 0);
  (void)f;
  /* Round trip through text, as a file would. */
  char *text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  json_error_t err;
  j = json_loads(text, 0, &err);
  free(text);
  assert_non_null(j);
  return j;
}

static void test_invoice_export_audits_clean(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, acc = {0};
  gn_invoice_summary s;
  char reason[256] = "x";
  seal20(f, &inv);
  assert_int_equal(gn_invoice_accept_seal(f->requester, inv.data, inv.len, &acc), 0);
  json_t *j = export_of(f, &inv, &acc);
  assert_string_equal(json_string_value(json_object_get(j, "format")), "gpunet-invoice/1");
  assert_string_equal(json_string_value(json_object_get(j, "price")), "0.400000 EUR/GPU-hour");
  assert_string_equal(json_string_value(json_object_get(j, "total")), "0.002222 EUR");
  assert_int_equal(json_array_size(json_object_get(j, "ticks")), N_TICKS);
  json_t *t0 = json_array_get(json_object_get(j, "ticks"), 0);
  assert_int_equal(json_integer_value(json_object_get(t0, "second")), 1);
  assert_int_equal(json_integer_value(json_object_get(t0, "t")), FX_START_S);
  assert_int_equal(gn_invoice_audit_json(j, &s, reason, sizeof(reason)), 0);
  assert_string_equal(reason, "");
  assert_true(s.countersigned);
  assert_int_equal(s.total_micro, 2222);
  json_decref(j);

  /* Without the acceptance: still verifies, but says it is one-sided. */
  j = export_of(f, &inv, NULL);
  assert_true(json_is_null(json_object_get(json_object_get(j, "envelopes"), "acceptance")));
  assert_int_equal(gn_invoice_audit_json(j, &s, reason, sizeof(reason)), 0);
  assert_false(s.countersigned);
  assert_non_null(strstr(reason, "signed by the provider only"));
  json_decref(j);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_invoice_export_refuses_bad_inputs(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, rej = {0}, bad = {0};
  json_t *j = NULL;
  seal20(f, &inv);
  assert_int_equal(gn_invoice_reject_seal(f->requester, inv.data, inv.len, "no", &rej), 0);
  assert_int_equal(gn_invoice_export(inv.data, inv.len, rej.data, rej.len, &j), GN_EINVAL);
  tamper(&inv, m_total, f->provider, &bad);
  assert_int_equal(gn_invoice_export(bad.data, bad.len, NULL, 0, &j), GN_EAUDIT);
  assert_null(j);
  gn_buf_done(&inv);
  gn_buf_done(&rej);
  gn_buf_done(&bad);
}

/* Edits to an export, each applied to a fresh copy of a clean one. */
typedef struct audit_case {
  const char *name;
  void (*edit)(json_t *doc, fixture *f, const gn_buf *inv);
  const char *want;
  int rc;
} audit_case;

static json_t *tick(json_t *doc, size_t i) {
  return json_array_get(json_object_get(doc, "ticks"), i);
}
static json_t *envs(json_t *doc) {
  return json_object_get(doc, "envelopes");
}

static void set_hex(json_t *o, const char *key, const gn_buf *b) {
  char *hex = malloc(b->len * 2 + 1);
  sodium_bin2hex(hex, b->len * 2 + 1, b->data, b->len);
  json_object_set_new(o, key, json_string(hex));
  free(hex);
}

static void flip_hex(json_t *o, const char *key, size_t from_end) {
  char *s = strdup(json_string_value(json_object_get(o, key)));
  size_t n = strlen(s);
  s[n - from_end] = s[n - from_end] == '0' ? '1' : '0';
  json_object_set_new(o, key, json_string(s));
  free(s);
}

static void a_tick_gpus(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_set_new(tick(d, 3), "gpus", json_integer(2));
}
static void a_tick_util(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_set_new(tick(d, 4), "util", json_integer(100));
}
static void a_tick_hash(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  flip_hex(tick(d, 16), "hash", 1);
}
static void a_tick_removed(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_array_remove(json_object_get(d, "ticks"), 16);
}
static void a_total(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_set_new(d, "total_micro", json_integer(1));
}
static void a_total_text(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_set_new(d, "total", json_string("0.000001 EUR"));
}
static void a_price(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_set_new(d, "price_uper_hour", json_integer(100000));
}
static void a_provider(json_t *d, fixture *f, const gn_buf *i) {
  (void)i;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(f->other->pk, id);
  json_object_set_new(d, "provider", json_string(id));
}
static void a_seconds_missing(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_del(d, "seconds");
}
static void a_acc_sig(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  flip_hex(envs(d), "acceptance", 3);
}
static void a_inv_sig(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  flip_hex(envs(d), "invoice", 3);
}
static void a_inv_tampered(json_t *d, fixture *f, const gn_buf *i) {
  gn_buf bad = {0};
  tamper(i, m_tick17, f->provider, &bad);
  set_hex(envs(d), "invoice", &bad);
  gn_buf_done(&bad);
}
static void a_acc_other_invoice(json_t *d, fixture *f, const gn_buf *i) {
  gn_buf same = {0}, acc = {0};
  (void)i;
  /* An acceptance of a different (but valid) invoice for the same lease: the
   * same ticks, another end_reason. */
  assert_int_equal(gn_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + N_TICKS, "interval", &same),
                   0);
  assert_int_equal(gn_invoice_accept_seal(f->requester, same.data, same.len, &acc), 0);
  set_hex(envs(d), "acceptance", &acc);
  gn_buf_done(&same);
  gn_buf_done(&acc);
}
static void a_acc_by_other(json_t *d, fixture *f, const gn_buf *i) {
  gn_buf acc = {0}, forged = {0};
  gn_envelope e;
  assert_int_equal(gn_invoice_accept_seal(f->requester, i->data, i->len, &acc), 0);
  assert_int_equal(gn_envelope_open(acc.data, acc.len, &e), 0);
  assert_int_equal(gn_envelope_seal(f->other, GN_MSG_INVOICE_ACCEPT, e.body, e.body_len, &forged), 0);
  set_hex(envs(d), "acceptance", &forged);
  gn_buf_done(&acc);
  gn_buf_done(&forged);
}
static void a_acc_reject(json_t *d, fixture *f, const gn_buf *i) {
  gn_buf rej = {0};
  assert_int_equal(gn_invoice_reject_seal(f->requester, i->data, i->len, "gpus wrong in second 3", &rej), 0);
  set_hex(envs(d), "acceptance", &rej);
  gn_buf_done(&rej);
}
static void a_agreement(json_t *d, fixture *f, const gn_buf *i) {
  (void)i;
  gn_buf req = {0}, ag = {0};
  gn_lease_terms t;
  fx_terms(f, &t, 1, 400000, 20);
  fx_agree(f, &t, &req, &ag);
  set_hex(envs(d), "agreement", &ag);
  gn_buf_done(&req);
  gn_buf_done(&ag);
}
static void a_format(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_set_new(d, "format", json_string("gpunet-invoice/2"));
}
static void a_no_invoice(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_del(envs(d), "invoice");
}
static void a_odd_hex(json_t *d, fixture *f, const gn_buf *i) {
  (void)f, (void)i;
  json_object_set_new(envs(d), "invoice", json_string("abc"));
}

static const audit_case audit_cases[] = {
    {"tick gpus edited", a_tick_gpus, "ticks[3].gpus in the file says 2 but the signed invoice says 1", GN_EAUDIT},
    {"tick util edited", a_tick_util, "ticks[4].util in the file says 100 but the signed invoice says 4", GN_EAUDIT},
    {"tick hash edited", a_tick_hash, "ticks[16].hash in the file says", GN_EAUDIT},
    {"tick removed", a_tick_removed, "ticks in the file lists 19 seconds but the signed invoice has 20", GN_EAUDIT},
    {"total edited", a_total, "total_micro in the file says 1 but the signed invoice says 2222", GN_EAUDIT},
    {"total text edited", a_total_text,
     "total in the file says \"0.000001 EUR\" but the signed invoice says \"0.002222 EUR\"", GN_EAUDIT},
    {"price edited", a_price, "price_uper_hour in the file says 100000 but the signed invoice says 400000", GN_EAUDIT},
    {"provider edited", a_provider, "provider in the file says", GN_EAUDIT},
    {"seconds removed", a_seconds_missing, "seconds in the file says nothing (the field is missing)", GN_EAUDIT},
    {"acceptance signature", a_acc_sig, "acceptance signature does not verify against requester gn", GN_EAUDIT},
    {"invoice signature", a_inv_sig, "invoice signature does not verify against provider gn", GN_EAUDIT},
    {"invoice re-signed with a changed tick", a_inv_tampered, "second 17: hash chain broken", GN_EAUDIT},
    {"acceptance of another invoice", a_acc_other_invoice, "acceptance is for another invoice", GN_EAUDIT},
    {"acceptance by someone else", a_acc_by_other, "acceptance is signed by gn", GN_EAUDIT},
    {"rejection instead of acceptance", a_acc_reject, "the requester rejected this invoice: gpus wrong in second 3",
     GN_EAUDIT},
    {"other agreement", a_agreement, "envelopes.agreement is not the agreement signed into the invoice", GN_EAUDIT},
    {"other format", a_format, "not a gpunet invoice export", GN_EINVAL},
    {"no invoice envelope", a_no_invoice, "not a gpunet invoice export", GN_EINVAL},
    {"odd-length hex", a_odd_hex, "envelopes.invoice is not an envelope in hex", GN_EAUDIT},
};

static void test_invoice_audit_rejects_tampered_exports(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, acc = {0};
  seal20(f, &inv);
  assert_int_equal(gn_invoice_accept_seal(f->requester, inv.data, inv.len, &acc), 0);
  json_t *clean = export_of(f, &inv, &acc);
  for (size_t i = 0; i < GN_ARRAY_SIZE(audit_cases); i++) {
    json_t *doc = json_deep_copy(clean);
    char reason[512] = "";
    audit_cases[i].edit(doc, f, &inv);
    int rc = gn_invoice_audit_json(doc, NULL, reason, sizeof(reason));
    if (rc != audit_cases[i].rc || !strstr(reason, audit_cases[i].want))
      fail_msg("%s: rc %d, reason \"%s\", want %d \"%s\"", audit_cases[i].name, rc, reason, audit_cases[i].rc,
               audit_cases[i].want);
    json_decref(doc);
  }
  json_decref(clean);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_invoice_audit_rejects_non_objects(void **state) {
  (void)state;
  char reason[128];
  json_t *a = json_array();
  assert_int_equal(gn_invoice_audit_json(a, NULL, reason, sizeof(reason)), GN_EINVAL);
  assert_int_equal(gn_invoice_audit_json(NULL, NULL, reason, sizeof(reason)), GN_EINVAL);
  json_decref(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_invoice_check_accepts_honest_invoice, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_total_uses_gpu_seconds, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_of_empty_lease, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_seal_requires_the_provider, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_tampering, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_names_broken_signature, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_more_than_observed, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_wrong_agreement, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_garbage, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_accept_and_reject, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_continues_accepted_note, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_max_size_fits_a_message, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_export_audits_clean, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_export_refuses_bad_inputs, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_audit_rejects_tampered_exports, setup20, fx_teardown),
      cmocka_unit_test(test_invoice_audit_rejects_non_objects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
