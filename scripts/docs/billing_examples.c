/* Prints the billing examples of docs/protocol.md §2.12 from the billing
 * code itself: a lease request, its agreement, a debit note and its
 * acceptance, the final invoice continuing it and its acceptance, the two
 * rejections, and the gpunet-invoice/2 export. Deterministic: keys come from
 * fixed seeds (A = 32 bytes 0x01 is the provider, B = 0x02 the requester, as
 * in §1) and every time is fixed. tests/p2p/test_protocol_doc.c checks the
 * printed examples against the document's formulas.
 * Build and run: scripts/docs/billing_examples [BUILD_DIR]. */
#include <gpunet/billing.h>
#include <gpunet/offer.h>

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>

static gn_identity *fixed_identity(uint8_t fill) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  memset(seed, fill, sizeof(seed));
  gn_identity *id = calloc(1, sizeof(*id));
  if (!id)
    return NULL;
  id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES);
  if (!id->sk) {
    free(id);
    return NULL;
  }
  crypto_sign_seed_keypair(id->pk, id->sk, seed);
  return id;
}

static void hex(const char *title, const gn_buf *b) {
  printf("%s (%zu bytes):\n", title, b->len);
  for (size_t i = 0; i < b->len; i++)
    printf("%02x%s", b->data[i], (i + 1) % 32 == 0 || i + 1 == b->len ? "\n" : "");
  printf("\n");
}

static int fail(const char *what, int r) {
  fprintf(stderr, "billing_examples: %s: %s\n", what, gn_strerror(r));
  return 1;
}

int main(void) {
  if (sodium_init() < 0)
    return 1;
  gn_identity *prov = fixed_identity(1), *req = fixed_identity(2);
  if (!prov || !req)
    return 1;
  gn_buf request = {0}, agreement = {0}, note = {0}, note_accept = {0}, note_reject = {0}, invoice = {0},
         invoice_accept = {0}, invoice_reject = {0};
  int r;

  /* The terms: one RTX 4090 of A's offer at 0.40 EUR/GPU-hour, at most an
   * hour, a debit note every 60 s. */
  gn_lease_terms t;
  memset(&t, 0, sizeof(t));
  snprintf(t.lease_id, sizeof(t.lease_id), "l-00c0ffee00c0ffee");
  memcpy(t.provider, prov->pk, GN_PK_LEN);
  memcpy(t.requester, req->pk, GN_PK_LEN);
  gn_offer o;
  memset(&o, 0, sizeof(o));
  memcpy(o.provider, prov->pk, GN_PK_LEN);
  snprintf(o.gpu_model, sizeof(o.gpu_model), "NVIDIA GeForce RTX 4090");
  gn_offer_id(&o, t.offer_id);
  snprintf(t.gpu_model, sizeof(t.gpu_model), "%s", o.gpu_model);
  t.count = 1;
  t.price_uper_hour = 400000;
  snprintf(t.currency, sizeof(t.currency), "EUR");
  t.max_s = 3600;
  t.interval_s = 60;
  t.requested_s = 1764670000;
  memset(t.nonce, 0x5a, sizeof(t.nonce));
  if ((r = gn_lease_request_seal(req, &t, &request)) < 0)
    return fail("lease request", r);
  const char *gpus[] = {"GPU-8f1c2a3b-5d6e-4f70-8192-a3b4c5d6e7f8"};
  if ((r = gn_agreement_seal(prov, request.data, request.len, 1764670001, gpus, 1, &agreement)) < 0)
    return fail("agreement", r);

  /* Seconds 1..5 at utilization 37, 88, 91, unknown, 90. Note 1 carries
   * seconds 1..3; the final invoice (released after 5 s) the other two. */
  static const uint8_t ticks[] = {1, 37, 1, 88, 1, 91, 1, GN_UTIL_UNKNOWN, 1, 90};
  gn_bill_head head, after_note, final;
  if ((r = gn_bill_head_init(agreement.data, agreement.len, &head)) < 0)
    return fail("head", r);
  if ((r = gn_bill_note_seal(prov, agreement.data, agreement.len, &head, ticks, 3, 1764670004, &note, &after_note)) < 0)
    return fail("debit note", r);
  if ((r = gn_bill_note_accept_seal(req, agreement.data, agreement.len, &after_note, &note_accept)) < 0)
    return fail("debit accept", r);
  if ((r = gn_bill_note_reject_seal(req, agreement.data, agreement.len, note.data, note.len,
                                    "debit note bills 3 seconds but only 1 were observed (tolerance 5 s)",
                                    &note_reject)) < 0)
    return fail("debit reject", r);
  if ((r = gn_bill_invoice_seal(prov, agreement.data, agreement.len, &after_note, ticks + 6, 2, 1764670006, "released",
                                &invoice, &final)) < 0)
    return fail("invoice", r);
  if ((r = gn_bill_invoice_accept_seal(req, agreement.data, agreement.len, &final, 1764670010, &invoice_accept)) < 0)
    return fail("invoice accept", r);
  if ((r = gn_bill_invoice_reject_seal(req, agreement.data, agreement.len, invoice.data, invoice.len,
                                       "spending cap: invoice bills 0.000555 EUR, over the cap of 0.000500 EUR",
                                       &invoice_reject)) < 0)
    return fail("invoice reject", r);

  hex("lease_request", &request);
  hex("lease_accept", &agreement);
  hex("debit_note", &note);
  hex("debit_accept", &note_accept);
  hex("debit_reject", &note_reject);
  hex("invoice", &invoice);
  hex("invoice_accept", &invoice_accept);
  hex("invoice_reject", &invoice_reject);

  json_t *doc = NULL;
  if ((r = gn_bill_export(agreement.data, agreement.len, &note, &note_accept, 1, invoice.data, invoice.len,
                          invoice_accept.data, invoice_accept.len, &doc)) < 0)
    return fail("export", r);
  char *text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (!text)
    return 1;
  printf("export:\n%s\n", text);
  free(text);
  gn_bill_audit audit;
  r = gn_invoice_audit_json(doc, &audit);
  printf("audit: %d verdict %d%s%s\n", r, (int)audit.verdict, audit.reason[0] ? ": " : "", audit.reason);
  json_decref(doc);

  gn_buf_done(&request);
  gn_buf_done(&agreement);
  gn_buf_done(&note);
  gn_buf_done(&note_accept);
  gn_buf_done(&note_reject);
  gn_buf_done(&invoice);
  gn_buf_done(&invoice_accept);
  gn_buf_done(&invoice_reject);
  gn_identity_free(prov);
  gn_identity_free(req);
  return 0;
}
