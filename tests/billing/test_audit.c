/* Tests of the gpunet-invoice/2 export built from the ledger
 * (gn_ledger_export) and its daemon-free audit (gn_invoice_audit_json, and
 * `gpunet invoice audit` exit codes 0/3/4/1/2, --full, --help): the four
 * verdicts, a table of tampered exports that must each be invalid with a
 * reason (by default and with --full: only a superseded voucher's own
 * signature is --full's alone), and the parallel pass. */
#include "billing/fixture.h"

#include <jansson.h>
#include <sys/wait.h>

/* The bill of one lease, as the provider holds it: notes 1 (1..60) and 2
 * (61..120) accepted, a note 3 (121..150) the requester rejected, then the
 * final invoice continuing note 2 with 121..150, answered as `answer` says. */
enum answer { ANSWER_NONE, ANSWER_ACCEPT, ANSWER_REJECT, NO_INVOICE };

typedef struct bill {
  gn_buf notes[3], resps[3], inv, inv_resp;
} bill;

static int setup(void **state) {
  return fx_setup_with(state, 2, 400000, 3600);
}

static void bill_done(bill *b) {
  for (int i = 0; i < 3; i++) {
    gn_buf_done(&b->notes[i]);
    gn_buf_done(&b->resps[i]);
  }
  gn_buf_done(&b->inv);
  gn_buf_done(&b->inv_resp);
}

static void make_bill(fixture *f, enum answer answer, bill *b) {
  const gn_buf *ag = &f->agreement;
  const char *id = f->terms.lease_id;
  gn_bill_head h, next;
  uint8_t ticks[2 * 60];
  char reason[512];
  memset(b, 0, sizeof(*b));
  fx_ticks(f, 150, 2);
  assert_int_equal(gn_bill_head_init(ag->data, ag->len, &h), 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(gn_ledger_ticks(f->ledger, id, h.seconds + 1, 60, ticks, NULL), 0);
    assert_int_equal(
        gn_bill_note_seal(f->provider, ag->data, ag->len, &h, ticks, 60, FX_START_S + 60 * (i + 1), &b->notes[i], NULL),
        0);
    assert_int_equal(gn_ledger_store_note(f->ledger, id, "provider", b->notes[i].data, b->notes[i].len), 0);
    assert_int_equal(gn_bill_note_check(b->notes[i].data, b->notes[i].len, ag->data, ag->len, &h, h.seconds + 60, 5, 0,
                                        &next, NULL, reason, sizeof(reason)),
                     0);
    assert_int_equal(gn_bill_note_accept_seal(f->requester, ag->data, ag->len, &next, &b->resps[i]), 0);
    assert_int_equal(gn_ledger_store_response(f->ledger, id, "provider", b->resps[i].data, b->resps[i].len), 0);
    h = next;
  }
  assert_int_equal(gn_ledger_ticks(f->ledger, id, 121, 30, ticks, NULL), 0);
  assert_int_equal(
      gn_bill_note_seal(f->provider, ag->data, ag->len, &h, ticks, 30, FX_START_S + 150, &b->notes[2], NULL), 0);
  assert_int_equal(gn_ledger_store_note(f->ledger, id, "provider", b->notes[2].data, b->notes[2].len), 0);
  assert_int_equal(gn_bill_note_reject_seal(f->requester, ag->data, ag->len, b->notes[2].data, b->notes[2].len,
                                            "spending cap reached", &b->resps[2]),
                   0);
  assert_int_equal(gn_ledger_store_response(f->ledger, id, "provider", b->resps[2].data, b->resps[2].len), 0);
  if (answer == NO_INVOICE)
    return;
  assert_int_equal(
      gn_bill_invoice_seal(f->provider, ag->data, ag->len, &h, ticks, 30, FX_START_S + 151, "unpaid", &b->inv, &next),
      0);
  assert_int_equal(gn_ledger_store_note(f->ledger, id, "provider", b->inv.data, b->inv.len), 0);
  if (answer == ANSWER_ACCEPT)
    assert_int_equal(
        gn_bill_invoice_accept_seal(f->requester, ag->data, ag->len, &next, FX_START_S + 160, &b->inv_resp), 0);
  else if (answer == ANSWER_REJECT)
    assert_int_equal(gn_bill_invoice_reject_seal(f->requester, ag->data, ag->len, b->inv.data, b->inv.len,
                                                 "seconds 121..150 were never given", &b->inv_resp),
                     0);
  if (b->inv_resp.len)
    assert_int_equal(gn_ledger_store_response(f->ledger, id, "provider", b->inv_resp.data, b->inv_resp.len), 0);
}

/* The export as a file would carry it: through text and back. */
static json_t *export_of(fixture *f) {
  json_t *j = NULL;
  assert_int_equal(gn_ledger_export(f->ledger, f->terms.lease_id, "provider", &j), 0);
  char *text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  json_error_t err;
  j = json_loads(text, 0, &err);
  free(text);
  assert_non_null(j);
  return j;
}

static void test_audit_countersigned_bill(void **state) {
  fixture *f = *state;
  bill b;
  gn_bill_audit a;
  make_bill(f, ANSWER_ACCEPT, &b);
  json_t *j = export_of(f);
  assert_string_equal(json_string_value(json_object_get(j, "format")), "gpunet-invoice/2");
  assert_int_equal(json_array_size(json_object_get(j, "notes")), 3);
  assert_int_equal(gn_invoice_audit_json(j, &a), 0);
  assert_int_equal(a.verdict, GN_BILL_COUNTERSIGNED);
  assert_string_equal(a.reason, "");
  assert_true(a.has_invoice);
  assert_int_equal(a.notes, 3);
  assert_int_equal(a.notes_accepted, 2);
  assert_int_equal(a.summary.seconds, 150);
  assert_int_equal(a.summary.total_micro, 33333); /* 300 GPU-s at 0.40 */
  assert_int_equal(a.voucher_seconds, 150);
  assert_true(a.summary.countersigned);
  json_t *s = json_object_get(j, "summary");
  assert_string_equal(json_string_value(json_object_get(s, "status")), "countersigned");
  assert_string_equal(json_string_value(json_object_get(s, "total")), "0.033333 EUR");
  json_decref(j);
  bill_done(&b);
}

/* The old audit said "audit OK" (exit 0) for an invoice the requester never
 * countersigned: now a provider-only claim, saying what the vouchers cover. */
static void test_audit_uncountersigned_invoice_is_a_provider_only_claim(void **state) {
  fixture *f = *state;
  bill b;
  gn_bill_audit a;
  make_bill(f, ANSWER_NONE, &b);
  json_t *j = export_of(f);
  assert_int_equal(gn_invoice_audit_json(j, &a), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_PROVIDER_ONLY);
  assert_non_null(strstr(a.reason, "provider-only claim"));
  assert_non_null(strstr(a.reason, "not countersigned"));
  assert_non_null(strstr(a.reason, "vouchers cover 120 s, 0.026666 EUR"));
  assert_false(a.summary.countersigned);
  json_decref(j);
  bill_done(&b);
}

static void test_audit_no_final_invoice_is_a_provider_only_claim(void **state) {
  fixture *f = *state;
  bill b;
  gn_bill_audit a;
  make_bill(f, NO_INVOICE, &b);
  json_t *j = export_of(f);
  assert_true(json_is_null(json_object_get(j, "invoice")));
  assert_int_equal(gn_invoice_audit_json(j, &a), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_PROVIDER_ONLY);
  assert_non_null(strstr(a.reason, "there is no final invoice"));
  assert_int_equal(a.summary.seconds, 120);
  json_decref(j);
  bill_done(&b);
}

/* The provider's export of a rejected invoice carries the rejection. */
static void test_audit_rejected_invoice(void **state) {
  fixture *f = *state;
  bill b;
  gn_bill_audit a;
  make_bill(f, ANSWER_REJECT, &b);
  json_t *j = export_of(f);
  assert_false(json_is_null(json_object_get(j, "response")));
  assert_int_equal(gn_invoice_audit_json(j, &a), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_REJECTED);
  assert_non_null(strstr(a.reason, "the requester rejected the final invoice: seconds 121..150 were never given"));
  json_decref(j);
  bill_done(&b);
}

/* The requester's own ledger gives the same verdict from what it kept. */
static void test_audit_requester_side_export(void **state) {
  fixture *f = *state;
  bill b;
  gn_bill_audit a;
  json_t *j = NULL;
  make_bill(f, ANSWER_ACCEPT, &b);
  const char *id = f->terms.lease_id;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(gn_ledger_store_note(f->ledger, id, "requester", b.notes[i].data, b.notes[i].len), 0);
    assert_int_equal(gn_ledger_store_response(f->ledger, id, "requester", b.resps[i].data, b.resps[i].len), 0);
  }
  assert_int_equal(gn_ledger_store_note(f->ledger, id, "requester", b.inv.data, b.inv.len), 0);
  assert_int_equal(gn_ledger_store_response(f->ledger, id, "requester", b.inv_resp.data, b.inv_resp.len), 0);
  /* Storing again is a no-op; an acceptance is never replaced by a rejection. */
  assert_int_equal(gn_ledger_store_note(f->ledger, id, "requester", b.inv.data, b.inv.len), 0);
  gn_buf rej = {0};
  assert_int_equal(gn_bill_note_reject_seal(f->requester, f->agreement.data, f->agreement.len, b.notes[0].data,
                                            b.notes[0].len, "changed my mind", &rej),
                   0);
  assert_int_equal(gn_ledger_store_response(f->ledger, id, "requester", rej.data, rej.len), 0);
  /* A response to a note never stored. */
  assert_int_equal(gn_ledger_store_response(f->ledger, id, "requester", b.resps[2].data, b.resps[2].len), GN_ENOTFOUND);
  assert_int_equal(gn_ledger_export(f->ledger, id, "requester", &j), 0);
  assert_int_equal(gn_invoice_audit_json(j, &a), 0);
  assert_int_equal(a.notes, 2);
  assert_int_equal(a.summary.seconds, 150);
  json_decref(j);
  assert_int_equal(gn_ledger_export(f->ledger, "l-none", "requester", &j), GN_ENOTFOUND);
  gn_buf_done(&rej);
  bill_done(&b);
}

/* Notes given in any order are exported in seq order (the accepted one of a
 * seq first) and audit the same. */
static void test_audit_export_sorts_the_notes(void **state) {
  fixture *f = *state;
  bill b;
  gn_bill_audit a;
  json_t *j = NULL;
  make_bill(f, ANSWER_ACCEPT, &b);
  gn_buf notes[3] = {b.notes[2], b.notes[1], b.notes[0]}, resps[3] = {b.resps[2], b.resps[1], b.resps[0]};
  assert_int_equal(gn_bill_export(f->agreement.data, f->agreement.len, notes, resps, 3, b.inv.data, b.inv.len,
                                  b.inv_resp.data, b.inv_resp.len, &j),
                   0);
  assert_int_equal(gn_invoice_audit_json(j, &a), 0);
  assert_int_equal(a.notes_accepted, 2);
  json_decref(j);
  bill_done(&b);
}

/* --- tampered exports --------------------------------------------------------*/

static void set_b64(json_t *o, const char *key, const gn_buf *b) {
  size_t cap = sodium_base64_ENCODED_LEN(b->len, sodium_base64_VARIANT_ORIGINAL);
  char *s = malloc(cap);
  sodium_bin2base64(s, cap, b->data, b->len, sodium_base64_VARIANT_ORIGINAL);
  json_object_set_new(o, key, json_string(s));
  free(s);
}

static json_t *note_at(json_t *d, size_t i) {
  return json_array_get(json_object_get(d, "notes"), i);
}

static void m_tick(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  t[2 * 10] = 1;
}
static void m_window(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->end_s = b->start_s + 100;
}

typedef void (*edit_fn)(json_t *d, fixture *f, bill *b);

static void e_summary_seconds(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_object_set_new(json_object_get(d, "summary"), "seconds", json_integer(1));
}
static void e_summary_status(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_object_set_new(json_object_get(d, "summary"), "status", json_string("rejected"));
}
static void e_summary_extra(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_object_set_new(json_object_get(d, "summary"), "paid", json_true());
}
static void e_note_tick(json_t *d, fixture *f, bill *b) {
  gn_buf bad = {0};
  fx_tamper(&b->notes[1], m_tick, f->provider, &bad);
  set_b64(note_at(d, 1), "note", &bad);
  gn_buf_done(&bad);
}
static void e_notes_swapped(json_t *d, fixture *f, bill *b) {
  (void)f;
  set_b64(note_at(d, 0), "note", &b->notes[1]);
  set_b64(note_at(d, 0), "response", &b->resps[1]);
  set_b64(note_at(d, 1), "note", &b->notes[0]);
  set_b64(note_at(d, 1), "response", &b->resps[0]);
}
static void e_note_removed(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_array_remove(json_object_get(d, "notes"), 0);
}
static void e_note_response_sig(json_t *d, fixture *f, bill *b) {
  (void)f;
  gn_buf r = {0};
  gn_buf_append(&r, b->resps[0].data, b->resps[0].len);
  r.data[r.len - 2] ^= 1;
  set_b64(note_at(d, 0), "response", &r);
  gn_buf_done(&r);
}
static void e_response_of_other_note(json_t *d, fixture *f, bill *b) {
  (void)f;
  set_b64(note_at(d, 0), "response", &b->resps[1]);
}
static void e_invoice_window(json_t *d, fixture *f, bill *b) {
  gn_buf bad = {0};
  fx_tamper(&b->inv, m_window, f->provider, &bad);
  set_b64(d, "invoice", &bad);
  gn_buf_done(&bad);
}
static void e_invoice_response_is_a_note_voucher(json_t *d, fixture *f, bill *b) {
  (void)f;
  set_b64(d, "response", &b->resps[1]);
}
static void e_agreement(json_t *d, fixture *f, bill *b) {
  (void)b;
  gn_buf req = {0}, ag = {0};
  gn_lease_terms t;
  fx_terms(f, &t, 2, 400000, 3600);
  fx_agree(f, &t, &req, &ag);
  set_b64(d, "agreement", &ag);
  gn_buf_done(&req);
  gn_buf_done(&ag);
}
static void e_response_by_provider(json_t *d, fixture *f, bill *b) {
  gn_buf forged = {0};
  gn_envelope e;
  assert_int_equal(gn_envelope_open(b->inv_resp.data, b->inv_resp.len, &e), 0);
  assert_int_equal(gn_envelope_seal(f->provider, GN_MSG_INVOICE_ACCEPT, e.body, e.body_len, &forged), 0);
  set_b64(d, "response", &forged);
  gn_buf_done(&forged);
}
static void e_not_base64(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_object_set_new(note_at(d, 2), "note", json_string("!!"));
}
static void e_note_garbage(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_object_set_new(note_at(d, 2), "note", json_string("AAAA"));
  json_object_set_new(note_at(d, 2), "response", json_null());
}
static void e_invoice_among_notes(json_t *d, fixture *f, bill *b) {
  (void)f;
  set_b64(note_at(d, 2), "note", &b->inv);
  json_object_set_new(note_at(d, 2), "response", json_null());
}
static void e_format(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_object_set_new(d, "format", json_string("gpunet-invoice/1"));
}
static void e_no_notes(json_t *d, fixture *f, bill *b) {
  (void)f, (void)b;
  json_object_del(d, "notes");
}

typedef struct audit_case {
  const char *name;
  edit_fn edit;
  const char *want;
  int rc;
  /* Only --full (GN_BILL_AUDIT_FULL) finds it: a superseded voucher's own
   * signature bytes, bound by the later cumulative voucher; the default
   * audit's verdict on the bill is unchanged (countersigned). */
  bool full_only;
} audit_case;

static const audit_case cases[] = {
    {"summary seconds edited", e_summary_seconds, "summary.seconds in the file says 1 but the signed data says 150",
     GN_EAUDIT, false},
    {"summary status edited", e_summary_status, "summary.status in the file says \"rejected\"", GN_EAUDIT, false},
    {"summary field added", e_summary_extra, "summary has fields the signed data does not give", GN_EAUDIT, false},
    {"accepted note re-signed with a changed tick", e_note_tick, "notes[1] (accepted by the requester)", GN_EAUDIT,
     false},
    {"accepted notes swapped", e_notes_swapped, "notes[0] (accepted by the requester): debit note has seq 2", GN_EAUDIT,
     false},
    {"accepted note removed", e_note_removed, "seq 2 but the last accepted note is 0", GN_EAUDIT, false},
    {"voucher signature", e_note_response_sig, "notes[0].response: response signature does not verify", GN_EAUDIT,
     true},
    {"voucher of another note", e_response_of_other_note, "notes[0].response is not an acceptance of that note",
     GN_EAUDIT, false},
    {"invoice window too short", e_invoice_window, "its window end_s - start_s holds only 100", GN_EAUDIT, false},
    {"note voucher as the final voucher", e_invoice_response_is_a_note_voucher,
     "response does not answer this final invoice", GN_EAUDIT, false},
    {"another agreement", e_agreement, "response is for lease", GN_EAUDIT, false},
    {"final voucher signed by the provider", e_response_by_provider, "not by the lease's requester", GN_EAUDIT, false},
    {"note not base64", e_not_base64, "notes[2].note is missing or not base64", GN_EAUDIT, false},
    {"unanswered note that is not an envelope", e_note_garbage, "notes[2]: note envelope does not verify", GN_EAUDIT,
     false},
    {"final invoice among the notes", e_invoice_among_notes, "notes[2]: a final invoice listed among the notes",
     GN_EAUDIT, false},
    {"old format", e_format, "not a gpunet invoice export", GN_EINVAL, false},
    {"no notes array", e_no_notes, "not a gpunet invoice export", GN_EINVAL, false},
};

static void test_audit_rejects_tampered_exports(void **state) {
  fixture *f = *state;
  bill b;
  make_bill(f, ANSWER_ACCEPT, &b);
  json_t *clean = export_of(f);
  gn_bill_audit a;
  assert_int_equal(gn_invoice_audit_json(clean, &a), 0);
  assert_int_equal(gn_invoice_audit_json_flags(clean, GN_BILL_AUDIT_FULL, &a), 0);
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    json_t *doc = json_deep_copy(clean);
    cases[i].edit(doc, f, &b);
    /* --full finds every case; the default (linked) audit every one but a
     * superseded voucher's own signature, with the same reason. */
    int rc = gn_invoice_audit_json_flags(doc, GN_BILL_AUDIT_FULL, &a);
    if (rc != cases[i].rc || a.verdict != GN_BILL_INVALID || !strstr(a.reason, cases[i].want))
      fail_msg("%s (full): rc %d, verdict %d, reason \"%s\", want %d \"%s\"", cases[i].name, rc, a.verdict, a.reason,
               cases[i].rc, cases[i].want);
    rc = gn_invoice_audit_json(doc, &a);
    if (cases[i].full_only ? rc != 0 || a.verdict != GN_BILL_COUNTERSIGNED || a.summary.seconds != 150
                           : rc != cases[i].rc || a.verdict != GN_BILL_INVALID || !strstr(a.reason, cases[i].want))
      fail_msg("%s (default): rc %d, verdict %d, reason \"%s\"", cases[i].name, rc, a.verdict, a.reason);
    json_decref(doc);
  }
  json_t *arr = json_array();
  assert_int_equal(gn_invoice_audit_json(arr, &a), GN_EINVAL);
  assert_int_equal(gn_invoice_audit_json(NULL, &a), GN_EINVAL);
  /* Flags it does not know (1 was the earlier LINKED, now the default). */
  assert_int_equal(gn_invoice_audit_json_flags(clean, 1u, &a), GN_EINVAL);
  assert_non_null(strstr(a.reason, "unknown audit flags"));
  json_decref(clean);
  json_decref(arr);
  bill_done(&b);
}

/* A bill of 300 one-second notes: the signatures are checked on several
 * threads; one bad voucher signature deep inside is still found, and named. */
static void test_audit_many_notes_every_signature_checked(void **state) {
  fixture *f = *state;
  const gn_buf *ag = &f->agreement;
  enum { N = 300 };
  gn_buf notes[N], resps[N], inv = {0}, acc = {0};
  gn_bill_head h, next;
  gn_bill_audit a;
  json_t *j = NULL;
  memset(notes, 0, sizeof(notes));
  memset(resps, 0, sizeof(resps));
  uint8_t *t = fx_compact(1, N + 1, 2);
  assert_int_equal(gn_bill_head_init(ag->data, ag->len, &h), 0);
  for (int i = 0; i < N; i++) {
    assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &h, t + 2 * i, 1, 0, &notes[i], &next), 0);
    assert_int_equal(gn_bill_note_accept_seal(f->requester, ag->data, ag->len, &next, &resps[i]), 0);
    h = next;
  }
  assert_int_equal(gn_bill_invoice_seal(f->provider, ag->data, ag->len, &h, t + 2 * N, 1, FX_START_S + N + 1,
                                        "released", &inv, &next),
                   0);
  assert_int_equal(gn_bill_invoice_accept_seal(f->requester, ag->data, ag->len, &next, FX_START_S + N + 2, &acc), 0);
  assert_int_equal(gn_bill_export(ag->data, ag->len, notes, resps, N, inv.data, inv.len, acc.data, acc.len, &j), 0);
  assert_int_equal(gn_invoice_audit_json(j, &a), 0);
  assert_int_equal(a.notes_accepted, N);
  assert_int_equal(a.summary.seconds, N + 1);
  assert_int_equal(gn_invoice_audit_json_flags(j, GN_BILL_AUDIT_FULL, &a), 0);
  assert_int_equal(a.notes_accepted, N);
  assert_int_equal(a.summary.seconds, N + 1);
  json_decref(j);
  j = NULL;
  /* A voucher whose signature is bad deep inside: the exporter's own check
   * and the default audit (linked) let it through, --full names it... */
  resps[271].data[resps[271].len - 5] ^= 1;
  assert_int_equal(gn_bill_export(ag->data, ag->len, notes, resps, N, inv.data, inv.len, acc.data, acc.len, &j), 0);
  assert_int_equal(gn_invoice_audit_json_flags(j, GN_BILL_AUDIT_FULL, &a), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_INVALID);
  assert_non_null(strstr(a.reason, "notes[271].response: response signature does not verify"));
  /* ...because the default audit does not check that superseded voucher's
   * own signature (the bill is bound by the later ones)... */
  assert_int_equal(gn_invoice_audit_json(j, &a), 0);
  assert_int_equal(a.summary.seconds, N + 1);
  json_t *e;
  const char *b64;
  char *bad;
  size_t len;
  /* ...but any byte of an accepted note, its signature included, is. */
  e = json_array_get(json_object_get(j, "notes"), 150);
  b64 = json_string_value(json_object_get(e, "note"));
  bad = strdup(b64);
  len = strlen(bad);
  bad[len - 8] = bad[len - 8] == 'A' ? 'B' : 'A';
  json_object_set_new(e, "note", json_string(bad));
  free(bad);
  assert_int_equal(gn_invoice_audit_json(j, &a), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_INVALID);
  assert_non_null(strstr(a.reason, "notes[150].response is not an acceptance of that note"));
  json_decref(j);
  j = NULL;
  /* A provider that rewrites note 150 (re-signed) and forges its voucher to
   * match (the requester's key named, the signature bytes broken): the
   * linked audit does not check that voucher's signature, but note 151 no
   * longer continues note 150. */
  gn_buf n150 = {0}, v150 = {0};
  gn_bill_head h149, h150;
  gn_bill_note no150;
  char why[512];
  assert_int_equal(gn_bill_head_init(ag->data, ag->len, &h149), 0);
  for (int i = 0; i < 150; i++)
    assert_int_equal(
        gn_bill_note_open(notes[i].data, notes[i].len, ag->data, ag->len, &h149, &h149, NULL, why, sizeof(why)), 0);
  uint8_t zero_tick[2] = {0, 0};
  assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &h149, zero_tick, 1, 0, &n150, &h150), 0);
  assert_int_equal(gn_bill_note_accept_seal(f->requester, ag->data, ag->len, &h150, &v150), 0);
  v150.data[v150.len - 3] ^= 1;
  gn_buf keep_n = notes[150], keep_v = resps[150];
  notes[150] = n150;
  resps[150] = v150;
  assert_int_equal(gn_bill_export(ag->data, ag->len, notes, resps, N, inv.data, inv.len, acc.data, acc.len, &j),
                   GN_EAUDIT);
  assert_int_equal(gn_bill_note_open(n150.data, n150.len, ag->data, ag->len, &h149, NULL, &no150, why, sizeof(why)), 0);
  notes[150] = keep_n;
  resps[150] = keep_v;
  gn_buf_done(&n150);
  gn_buf_done(&v150);
  for (int i = 0; i < N; i++) {
    gn_buf_done(&notes[i]);
    gn_buf_done(&resps[i]);
  }
  gn_buf_done(&inv);
  gn_buf_done(&acc);
  free(t);
}

/* The parallel pass verifies each accepted note against the head its
 * predecessor claims; the walk uses that only where it is the head it
 * reached. A note replaced by another valid one (re-signed, its voucher
 * too) in a bill of 200: both audits name the next note, with the reason of
 * a one-thread walk, and the bill before it is what the audits counted. */
static void test_audit_parallel_pass_same_reason(void **state) {
  fixture *f = *state;
  const gn_buf *ag = &f->agreement;
  enum { N = 200, BAD = 120 };
  gn_buf notes[N], resps[N], inv = {0}, acc = {0};
  gn_bill_head h, next, h_bad;
  gn_bill_audit a, b;
  json_t *j = NULL;
  memset(notes, 0, sizeof(notes));
  memset(resps, 0, sizeof(resps));
  uint8_t *t = fx_compact(1, N + 1, 2);
  assert_int_equal(gn_bill_head_init(ag->data, ag->len, &h), 0);
  for (int i = 0; i < N; i++) {
    if (i == BAD)
      h_bad = h;
    assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &h, t + 2 * i, 1, 0, &notes[i], &next), 0);
    assert_int_equal(gn_bill_note_accept_seal(f->requester, ag->data, ag->len, &next, &resps[i]), 0);
    h = next;
  }
  assert_int_equal(gn_bill_invoice_seal(f->provider, ag->data, ag->len, &h, t + 2 * N, 1, FX_START_S + N + 1,
                                        "released", &inv, &next),
                   0);
  assert_int_equal(gn_bill_invoice_accept_seal(f->requester, ag->data, ag->len, &next, FX_START_S + N + 2, &acc), 0);
  assert_int_equal(gn_bill_export(ag->data, ag->len, notes, resps, N, inv.data, inv.len, acc.data, acc.len, &j), 0);
  assert_int_equal(gn_invoice_audit_json(j, &a), 0);
  assert_int_equal(gn_invoice_audit_json_flags(j, GN_BILL_AUDIT_FULL, &b), 0);
  assert_memory_equal(a.summary.chain_head, b.summary.chain_head, 32);
  assert_int_equal(a.summary.total_micro, b.summary.total_micro);
  /* Note BAD replaced: a GPU idle in its second, signed and accepted. */
  gn_buf nb = {0}, vb = {0};
  uint8_t idle[2] = {0, 0};
  assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &h_bad, idle, 1, 0, &nb, &next), 0);
  assert_int_equal(gn_bill_note_accept_seal(f->requester, ag->data, ag->len, &next, &vb), 0);
  set_b64(note_at(j, BAD), "note", &nb);
  set_b64(note_at(j, BAD), "response", &vb);
  assert_int_equal(gn_invoice_audit_json(j, &a), GN_EAUDIT);
  assert_int_equal(gn_invoice_audit_json_flags(j, GN_BILL_AUDIT_FULL, &b), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_INVALID);
  assert_int_equal(b.verdict, GN_BILL_INVALID);
  assert_string_equal(a.reason, b.reason);
  assert_non_null(strstr(a.reason, "notes[121] (accepted by the requester): debit note does not continue the last "
                                   "accepted note"));
  assert_int_equal(a.notes_accepted, BAD + 1);
  /* The same audit again: the same reason (whatever the threads did). */
  for (int k = 0; k < 5; k++) {
    assert_int_equal(gn_invoice_audit_json(j, &b), GN_EAUDIT);
    assert_string_equal(a.reason, b.reason);
  }
  json_decref(j);
  gn_buf_done(&nb);
  gn_buf_done(&vb);
  for (int i = 0; i < N; i++) {
    gn_buf_done(&notes[i]);
    gn_buf_done(&resps[i]);
  }
  gn_buf_done(&inv);
  gn_buf_done(&acc);
  free(t);
}

/* The export's base64 decoder takes exactly what sodium_base642bin takes
 * (original variant, padding, no whitespace, unused bits zero), and gives
 * the same bytes: random strings over the alphabet, '=' and a few others. */
static void test_audit_base64_as_sodium(void **state) {
  (void)state;
  static const char chars[] = "AQgwBaz09+/=-_ \n=AP";
  uint32_t x = 12345;
  char s[24];
  uint8_t mine[24], theirs[24];
  size_t accepted = 0;
  for (int it = 0; it < 200000; it++) {
    x = x * 1103515245u + 12345u;
    size_t n = (x >> 16) % 13;
    for (size_t i = 0; i < n; i++) {
      x = x * 1103515245u + 12345u;
      s[i] = chars[(x >> 16) % (sizeof(chars) - 1)];
    }
    size_t ml = 0, tl = 0;
    const char *end = NULL;
    int m = gn__b64_decode(s, n, mine, sizeof(mine), &ml);
    int r = sodium_base642bin(theirs, sizeof(theirs), s, n, NULL, &tl, &end, sodium_base64_VARIANT_ORIGINAL);
    bool ok = r == 0 && end == s + n;
    if ((m == 0) != ok || (ok && (ml != tl || memcmp(mine, theirs, tl) != 0)))
      fail_msg("\"%.*s\": ours %d (%zu bytes), sodium's %d (%zu bytes)", (int)n, s, m, ml, r, tl);
    accepted += ok;
  }
  assert_true(accepted > 1000); /* the strings do reach valid base64 */
  /* Too small a buffer is refused, not overrun. */
  size_t ml = 0;
  assert_int_equal(gn__b64_decode("QUJD", 4, mine, 2, &ml), GN_EINVAL);
  assert_int_equal(gn__b64_decode("QUJD", 4, mine, 3, &ml), 0);
  assert_int_equal(ml, 3);
  assert_memory_equal(mine, "ABC", 3);
}

/* `gpunet invoice audit FILE` exit codes: 0 countersigned, 3 provider-only,
 * 4 rejected, 1 does not verify, 2 not an export. */
static int run_audit_with(const char *gpunet, const char *args, const char *file, char *out, size_t cap) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "'%s' invoice audit %s '%s' 2>&1", gpunet, args, file);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_audit(const char *gpunet, const char *file, char *out, size_t cap) {
  return run_audit_with(gpunet, "", file, out, cap);
}

static void write_export(fixture *f, const char *name, char *path, size_t cap) {
  json_t *j = export_of(f);
  snprintf(path, cap, "%s/%s", f->dir, name);
  assert_int_equal(json_dump_file(j, path, JSON_COMPACT), 0);
  json_decref(j);
}

static void test_audit_cli_exit_codes(void **state) {
  fixture *f = *state;
  char gpunet[512], path[256], out[4096];
  const char *bd = getenv("GN_BUILD_DIR");
  snprintf(gpunet, sizeof(gpunet), "%s/gpunet", bd ? bd : ".");
  if (access(gpunet, X_OK) != 0) {
    printf("skipping: %s is not built (cmake --build ... --target gpunet)\n", gpunet);
    skip();
  }
  bill b;
  make_bill(f, ANSWER_NONE, &b);
  write_export(f, "none.json", path, sizeof(path));
  assert_int_equal(run_audit(gpunet, path, out, sizeof(out)), 3);
  assert_non_null(strstr(out, "PROVIDER-ONLY CLAIM"));
  /* The provider's head after the two accepted notes, and the final one. */
  gn_bill_head h;
  gn_bill_note no;
  assert_int_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &h), 0);
  for (int i = 0; i < 2; i++)
    assert_int_equal(
        gn_bill_note_open(b.notes[i].data, b.notes[i].len, f->agreement.data, f->agreement.len, &h, &h, NULL, NULL, 0),
        0);
  gn_bill_head fin;
  assert_int_equal(
      gn_bill_note_open(b.inv.data, b.inv.len, f->agreement.data, f->agreement.len, &h, &fin, &no, NULL, 0), 0);
  gn_buf acc = {0}, rej = {0};
  assert_int_equal(gn_bill_invoice_reject_seal(f->requester, f->agreement.data, f->agreement.len, b.inv.data, b.inv.len,
                                               "not mine", &rej),
                   0);
  assert_int_equal(gn_ledger_store_response(f->ledger, f->terms.lease_id, "provider", rej.data, rej.len), 0);
  write_export(f, "rejected.json", path, sizeof(path));
  assert_int_equal(run_audit(gpunet, path, out, sizeof(out)), 4);
  assert_non_null(strstr(out, "REJECTED by the requester"));
  assert_non_null(strstr(out, "not mine"));
  assert_int_equal(gn_bill_invoice_accept_seal(f->requester, f->agreement.data, f->agreement.len, &fin, 1, &acc), 0);
  assert_int_equal(gn_ledger_store_response(f->ledger, f->terms.lease_id, "provider", acc.data, acc.len), 0);
  write_export(f, "ok.json", path, sizeof(path));
  assert_int_equal(run_audit(gpunet, path, out, sizeof(out)), 0);
  assert_non_null(strstr(out, "audit OK"));
  assert_int_equal(run_audit_with(gpunet, "--full", path, out, sizeof(out)), 0);
  assert_non_null(strstr(out, "audit OK"));
  assert_int_equal(run_audit_with(gpunet, "--linked", path, out, sizeof(out)), 0); /* the default, still accepted */
  assert_int_equal(run_audit_with(gpunet, "--json", path, out, sizeof(out)), 0);
  assert_non_null(strstr(out, "\"verdict\": \"countersigned\""));
  assert_int_equal(run_audit_with(gpunet, "--full --linked", path, out, sizeof(out)), 2);
  assert_non_null(strstr(out, "exclude each other"));
  /* --help lists the options and every exit code. */
  assert_int_equal(run_audit_with(gpunet, "--help", path, out, sizeof(out)), 0);
  static const char *const help[] = {"--full",
                                     "--json",
                                     "Exit status",
                                     "  0  a final invoice countersigned",
                                     "  3  a provider-only claim",
                                     "  4  the requester rejected",
                                     "  1  the file does not verify",
                                     "  2  usage error"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(help); i++)
    if (!strstr(out, help[i]))
      fail_msg("invoice audit --help does not say \"%s\":\n%s", help[i], out);
  /* A superseded voucher's own signature broken: bound by the later
   * voucher, so the default audit's verdict stands; --full names it (1). */
  json_t *j = export_of(f);
  gn_buf broken = {0};
  assert_int_equal(gn_buf_append(&broken, b.resps[0].data, b.resps[0].len), 0);
  broken.data[broken.len - 2] ^= 1;
  set_b64(note_at(j, 0), "response", &broken);
  gn_buf_done(&broken);
  snprintf(path, sizeof(path), "%s/superseded.json", f->dir);
  assert_int_equal(json_dump_file(j, path, JSON_COMPACT), 0);
  json_decref(j);
  assert_int_equal(run_audit(gpunet, path, out, sizeof(out)), 0);
  assert_int_equal(run_audit_with(gpunet, "--full", path, out, sizeof(out)), 1);
  assert_non_null(strstr(out, "notes[0].response: response signature does not verify"));
  /* Tampered: 1; not an export, or no file: 2. */
  j = export_of(f);
  json_object_set_new(json_object_get(j, "summary"), "total_micro", json_integer(1));
  snprintf(path, sizeof(path), "%s/bad.json", f->dir);
  assert_int_equal(json_dump_file(j, path, JSON_COMPACT), 0);
  json_decref(j);
  assert_int_equal(run_audit(gpunet, path, out, sizeof(out)), 1);
  assert_non_null(strstr(out, "audit FAILED"));
  snprintf(path, sizeof(path), "%s/gpunet.db", f->dir);
  assert_int_equal(run_audit(gpunet, path, out, sizeof(out)), 2);
  snprintf(path, sizeof(path), "%s/no-such-file.json", f->dir);
  assert_int_equal(run_audit(gpunet, path, out, sizeof(out)), 2);
  assert_non_null(strstr(out, "cannot read"));
  gn_buf_done(&acc);
  gn_buf_done(&rej);
  bill_done(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_audit_countersigned_bill, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_uncountersigned_invoice_is_a_provider_only_claim, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_no_final_invoice_is_a_provider_only_claim, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_rejected_invoice, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_requester_side_export, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_export_sorts_the_notes, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_rejects_tampered_exports, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_many_notes_every_signature_checked, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_audit_parallel_pass_same_reason, setup, fx_teardown),
      cmocka_unit_test(test_audit_base64_as_sodium),
      cmocka_unit_test_setup_teardown(test_audit_cli_exit_codes, setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
