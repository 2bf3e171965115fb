/* The self-contained export of a lease's bill (format gpunet-invoice/2) and
 * its daemon-free audit. The signed envelopes (base64) are authoritative: the
 * agreement, every debit note with the requester's answer, the final invoice
 * and its answer. The audit re-verifies every signature and voucher and
 * recomputes the tick chain of every second (the accepted notes' ticks, then
 * the invoice's), and the readable "summary" must say exactly what the signed
 * data says. */
#include "billing_int.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <unistd.h>
#include <sodium.h>
#include <stdio.h>

#define EXPORT_FORMAT "gpunet-invoice/2"
/* A lease of GN_INVOICE_MAX_S seconds with notes every 10 s has 345600
 * notes; more than this is not an export of ours. */
#define EXPORT_MAX_NOTES 400000

typedef struct bill_item {
  const uint8_t *env;
  size_t len;
  const uint8_t *resp; /* NULL: no answer */
  size_t resp_len;
} bill_item;

static const char *verdict_word(gn_bill_verdict v) {
  switch (v) {
  case GN_BILL_COUNTERSIGNED:
    return "countersigned";
  case GN_BILL_PROVIDER_ONLY:
    return "provider-only";
  case GN_BILL_REJECTED:
    return "rejected";
  default:
    return "invalid";
  }
}

static void invalid(gn_bill_audit *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void invalid(gn_bill_audit *a, const char *fmt, ...) {
  va_list ap;
  a->verdict = GN_BILL_INVALID;
  va_start(ap, fmt);
  vsnprintf(a->reason, sizeof(a->reason), fmt, ap);
  va_end(ap);
}

static void money(uint64_t micro, const char *currency, char *buf, size_t cap) {
  char p[32];
  gn_price_format(micro, p, sizeof(p));
  snprintf(buf, cap, "%s %s", p, currency);
}

/* --- signatures, checked in parallel ------------------------------------*/

/* Every note and voucher signature of a long lease (a 30-day lease with a
 * note a minute has 86,400) is an Ed25519 verification of ~36 us: most of
 * an audit's time. They are independent, so a pre-pass checks them on all
 * CPUs and the sequential walk (order, chain, totals) uses the results. */
typedef struct sig_pass {
  const bill_item *items;
  size_t n;
  int *note_rc, *resp_rc;
  const bool *linked; /* NULL, or per note: its signatures are not checked (see audit_items) */
  size_t next;        /* atomic */
} sig_pass;

static int sig_check(const uint8_t *p, size_t len) {
  gn_envelope e;
  int r = gn_envelope_open(p, len, &e);
  return r == GN__SIG_UNCHECKED ? GN_EINVAL : r;
}

static void *sig_worker(void *arg) {
  sig_pass *sp = arg;
  for (;;) {
    size_t i = __atomic_fetch_add(&sp->next, 1, __ATOMIC_RELAXED);
    if (i >= sp->n)
      break;
    if (sp->linked && sp->linked[i]) {
      sp->note_rc[i] = sp->resp_rc[i] = 0;
      continue;
    }
    sp->note_rc[i] = sig_check(sp->items[i].env, sp->items[i].len);
    sp->resp_rc[i] = sp->items[i].resp ? sig_check(sp->items[i].resp, sp->items[i].resp_len) : 0;
  }
  return NULL;
}

#define SIG_MAX_THREADS 16
#define SIG_PARALLEL_MIN 256 /* below this, threads cost more than they save */

static void sig_pass_run(sig_pass *sp) {
  pthread_t th[SIG_MAX_THREADS];
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  size_t nt = 0, want = cpus > 1 ? (size_t)cpus : 1;
  if (want > SIG_MAX_THREADS)
    want = SIG_MAX_THREADS;
  if (sp->n >= SIG_PARALLEL_MIN)
    for (; nt + 1 < want; nt++)
      if (pthread_create(&th[nt], NULL, sig_worker, sp) != 0)
        break; /* fewer threads: the calling one does the rest */
  sig_worker(sp);
  for (size_t i = 0; i < nt; i++)
    pthread_join(th[i], NULL);
}

static int audit_walk(const gn__bill_ctx *ctxp, const bill_item *notes, size_t n, const int *rcs, const uint8_t *inv,
                      size_t inv_len, const uint8_t *resp, size_t resp_len, gn_bill_audit *a);

/* The verdict on a bill given as envelopes. Returns GN_ENOMEM or 0 (the
 * verdict, INVALID included, is in *a).
 *
 * With GN_BILL_AUDIT_LINKED, the signatures of the accepted notes before the
 * last accepted one, and of their vouchers, are not checked: the walk still
 * requires every accepted note to continue the one before it by hash (prev
 * is BLAKE2b-256 of the whole earlier envelope, signature bytes included),
 * and the last accepted note, its voucher, every unaccepted note and
 * answer, the final invoice and its answer are checked, so each accepted
 * note is bound, byte for byte, to a checked signature of the provider and
 * of the requester. What goes unchecked is only whether each intermediate
 * voucher's own signature bytes are valid: they are superseded by the later
 * cumulative voucher and change nothing in the bill. */
static int audit_items(const uint8_t *ag, size_t ag_len, const bill_item *notes, size_t n, const uint8_t *inv,
                       size_t inv_len, const uint8_t *resp, size_t resp_len, unsigned flags, gn_bill_audit *a) {
  gn__bill_ctx ctx;
  char why[400];
  int *rcs = NULL;
  bool *linked = NULL;
  memset(a, 0, sizeof(*a));
  a->verdict = GN_BILL_INVALID;
  if (gn__bill_ctx_open(ag, ag_len, &ctx, why, sizeof(why)) < 0) {
    invalid(a, "%s", why);
    return 0;
  }
  if (n) {
    if (!(rcs = calloc(2 * n, sizeof(*rcs))))
      return GN_ENOMEM;
    if (flags & GN_BILL_AUDIT_LINKED) {
      if (!(linked = calloc(n, sizeof(*linked)))) {
        free(rcs);
        return GN_ENOMEM;
      }
      /* Which notes answer as accepted (read unchecked here: the walk
       * checks the last one, and links the others to it). */
      size_t last = n;
      for (size_t i = 0; i < n; i++) {
        gn_bill_response r;
        if (notes[i].resp && gn__bill_response_open_sig(notes[i].resp, notes[i].resp_len, 0, &ctx, &r, NULL, 0) == 0 &&
            r.accepted && !r.final) {
          linked[i] = true;
          last = i;
        }
      }
      if (last < n)
        linked[last] = false;
    }
    sig_pass sp = {notes, n, rcs, rcs + n, linked, 0};
    sig_pass_run(&sp);
  }
  int r = audit_walk(&ctx, notes, n, rcs, inv, inv_len, resp, resp_len, a);
  free(rcs);
  free(linked);
  return r;
}

/* The sequential part of the audit: rcs[i] / rcs[n + i] are the signature
 * checks of note i and its response. */
static int audit_walk(const gn__bill_ctx *ctxp, const bill_item *notes, size_t n, const int *rcs, const uint8_t *inv,
                      size_t inv_len, const uint8_t *resp, size_t resp_len, gn_bill_audit *a) {
  const gn__bill_ctx ctx = *ctxp;
  gn_bill_head head;
  gn_bill_note last;
  char why[400], vt[64];
  gn__bill_head_genesis(&ctx, &head);
  memset(&last, 0, sizeof(last));
  last.start_s = ctx.ag.start_s;
  memcpy(last.chain_head, head.chain_head, GN__HASH_LEN);
  a->notes = n;
  for (size_t i = 0; i < n; i++) {
    gn_bill_response r;
    gn_bill_note no;
    bool accepted = false;
    if (notes[i].resp) {
      if (gn__bill_response_open_sig(notes[i].resp, notes[i].resp_len, rcs[n + i], &ctx, &r, why, sizeof(why)) < 0) {
        invalid(a, "notes[%zu].response: %s", i, why);
        return 0;
      }
      if (r.final) {
        invalid(a, "notes[%zu].response answers a final invoice, not a debit note", i);
        return 0;
      }
      accepted = r.accepted;
    }
    if (accepted) {
      gn__bill_view v;
      if (gn__bill_verify_sig(notes[i].env, notes[i].len, rcs[i], false, &ctx, &head, NULL, &v, why, sizeof(why)) < 0) {
        invalid(a, "notes[%zu] (accepted by the requester): %s", i, why);
        return 0;
      }
      no = v.note;
      head = v.next;
      gn__bill_view_done(&v);
      if (gn_bill_response_matches(&r, &no) < 0) {
        invalid(a, "notes[%zu].response is not an acceptance of that note (hash, seq, seconds or total differ)", i);
        return 0;
      }
      last = no;
      a->notes_accepted++;
      a->voucher_seconds = r.seconds;
      a->voucher_total_micro = r.total_micro;
    } else {
      /* Unanswered or rejected: evidence, not part of the bill; it must
       * still be a note of this lease signed by its provider. */
      if (gn__bill_peek_sig(notes[i].env, notes[i].len, rcs[i], &ctx, &no, why, sizeof(why)) < 0) {
        invalid(a, "notes[%zu]: %s", i, why);
        return 0;
      }
      if (no.final) {
        invalid(a, "notes[%zu]: a final invoice listed among the notes", i);
        return 0;
      }
      if (notes[i].resp && gn_bill_response_matches(&r, &no) < 0) {
        invalid(a, "notes[%zu].response is a rejection of another note", i);
        return 0;
      }
    }
  }
  const char *cur = ctx.ag.terms.currency;
  if (!inv) {
    if (resp) {
      invalid(a, "the export has a response but no final invoice");
      return 0;
    }
    gn__bill_summary_fill(&ctx, &last, &a->summary);
    a->verdict = GN_BILL_PROVIDER_ONLY;
    money(a->voucher_total_micro, cur, vt, sizeof(vt));
    snprintf(a->reason, sizeof(a->reason),
             "provider-only claim: there is no final invoice; the requester's vouchers cover %" PRIu64
             " s, %s (%" PRIu64 " accepted debit note%s)",
             a->voucher_seconds, vt, a->notes_accepted, a->notes_accepted == 1 ? "" : "s");
    return 0;
  }
  gn__bill_view v;
  if (gn__bill_verify(inv, inv_len, true, &ctx, &head, NULL, &v, why, sizeof(why)) < 0) {
    invalid(a, "final invoice: %s", why);
    return 0;
  }
  gn_bill_note final = v.note;
  gn__bill_view_done(&v);
  a->has_invoice = true;
  memcpy(a->end_reason, final.end_reason, sizeof(a->end_reason));
  gn__bill_summary_fill(&ctx, &final, &a->summary);
  if (!resp) {
    a->verdict = GN_BILL_PROVIDER_ONLY;
    money(a->voucher_total_micro, cur, vt, sizeof(vt));
    snprintf(a->reason, sizeof(a->reason),
             "provider-only claim: the final invoice is signed by the provider only, not countersigned by the "
             "requester; the requester's vouchers cover %" PRIu64 " s, %s",
             a->voucher_seconds, vt);
    return 0;
  }
  gn_bill_response r;
  if (gn__bill_response_open(resp, resp_len, &ctx, &r, why, sizeof(why)) < 0) {
    invalid(a, "response: %s", why);
    return 0;
  }
  if (!r.final || gn_bill_response_matches(&r, &final) < 0) {
    invalid(a, "response does not answer this final invoice (hash, seconds or total differ)");
    return 0;
  }
  if (!r.accepted) {
    a->verdict = GN_BILL_REJECTED;
    snprintf(a->reason, sizeof(a->reason), "the requester rejected the final invoice: %s", r.reason);
    return 0;
  }
  a->verdict = GN_BILL_COUNTERSIGNED;
  a->voucher_seconds = r.seconds;
  a->voucher_total_micro = r.total_micro;
  a->summary.countersigned = true;
  a->summary.accepted_s = r.accepted_s;
  a->reason[0] = 0;
  return 0;
}

/* --- JSON ------------------------------------------------------------------*/

static json_t *b64_json(const uint8_t *p, size_t n) {
  if (!p)
    return json_null();
  size_t cap = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
  char *s = malloc(cap);
  if (!s)
    return NULL;
  sodium_bin2base64(s, cap, p, n, sodium_base64_VARIANT_ORIGINAL);
  json_t *j = json_stringn(s, cap - 1);
  free(s);
  return j;
}

/* json_object_set_new that remembers the first failure (out of memory). */
static void set(json_t *o, const char *key, json_t *v, bool *ok) {
  if (!v || json_object_set_new(o, key, v) < 0)
    *ok = false;
}

/* The readable summary: generated from the audit alone, so the audit can
 * regenerate it and compare. NULL on out of memory or a figure beyond JSON
 * integers. */
static json_t *summary_json(const gn_bill_audit *a) {
  const gn_invoice_summary *s = &a->summary;
  char id[GN_NODE_ID_STRLEN], text[96], p[32];
  bool ok = true;
  if (s->price_uper_hour > INT64_MAX || s->total_micro > INT64_MAX || s->seconds > INT64_MAX ||
      a->voucher_total_micro > INT64_MAX || a->voucher_seconds > INT64_MAX)
    return NULL;
  json_t *o = json_object();
  if (!o)
    return NULL;
  set(o, "status", json_string(verdict_word(a->verdict)), &ok);
  set(o, "lease_id", json_string(s->lease_id), &ok);
  set(o, "invoice_id", a->has_invoice ? json_string(s->invoice_id) : json_null(), &ok);
  gn_node_id_format(s->provider, id);
  set(o, "provider", json_string(id), &ok);
  gn_node_id_format(s->requester, id);
  set(o, "requester", json_string(id), &ok);
  set(o, "gpu_model", json_string(s->gpu_model), &ok);
  set(o, "gpus", json_integer(s->gpus), &ok);
  set(o, "price_uper_hour", json_integer((json_int_t)s->price_uper_hour), &ok);
  gn_price_format(s->price_uper_hour, p, sizeof(p));
  snprintf(text, sizeof(text), "%s %s/GPU-hour", p, s->currency);
  set(o, "price", json_string(text), &ok);
  set(o, "currency", json_string(s->currency), &ok);
  set(o, "start_s", json_integer(s->start_s), &ok);
  set(o, "end_s", a->has_invoice ? json_integer(s->end_s) : json_null(), &ok);
  set(o, "end_reason", a->has_invoice ? json_string(a->end_reason) : json_null(), &ok);
  set(o, "seconds", json_integer((json_int_t)s->seconds), &ok);
  set(o, "total_micro", json_integer((json_int_t)s->total_micro), &ok);
  money(s->total_micro, s->currency, text, sizeof(text));
  set(o, "total", json_string(text), &ok);
  set(o, "notes", json_integer((json_int_t)a->notes), &ok);
  set(o, "notes_accepted", json_integer((json_int_t)a->notes_accepted), &ok);
  set(o, "voucher_seconds", json_integer((json_int_t)a->voucher_seconds), &ok);
  set(o, "voucher_total_micro", json_integer((json_int_t)a->voucher_total_micro), &ok);
  if (!ok) {
    json_decref(o);
    return NULL;
  }
  return o;
}

typedef struct sort_item {
  uint64_t key;
  size_t pos;
  bill_item item;
} sort_item;

static int sort_cmp(const void *a, const void *b) {
  const sort_item *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

int gn_bill_export(const uint8_t *agreement_env, size_t agreement_len, const gn_buf *notes,
                   const gn_buf *note_responses, size_t n_notes, const uint8_t *invoice_env, size_t invoice_len,
                   const uint8_t *response_env, size_t response_len, struct json_t **ret_json) {
  bill_item *items = NULL;
  gn_bill_audit *a = NULL;
  json_t *o = NULL, *arr = NULL;
  bool ok = true;
  int r;
  if (!agreement_env || !ret_json || (n_notes && !notes) || n_notes > EXPORT_MAX_NOTES)
    return GN_EINVAL;
  r = GN_ENOMEM;
  if (!(a = calloc(1, sizeof(*a))) || (n_notes && !(items = calloc(n_notes, sizeof(*items)))))
    goto out;
  for (size_t i = 0; i < n_notes; i++) {
    items[i].env = notes[i].data;
    items[i].len = notes[i].len;
    if (note_responses && note_responses[i].len) {
      items[i].resp = note_responses[i].data;
      items[i].resp_len = note_responses[i].len;
    }
  }
  /* Sort by seq, an accepted note before others of its seq, then by the
   * given order (a stable sort): the audit walks accepted notes in order. */
  sort_item *keys = calloc(n_notes ? n_notes : 1, sizeof(*keys));
  if (!keys)
    goto out;
  gn__bill_ctx ctx;
  const bool have_ctx = gn__bill_ctx_open(agreement_env, agreement_len, &ctx, NULL, 0) == 0;
  for (size_t i = 0; i < n_notes; i++) {
    gn_bill_note no;
    gn_bill_response rr;
    uint64_t seq = UINT64_MAX / 2;
    bool acc = false;
    /* Ordering only: signatures are checked by the audit just after. */
    if (have_ctx && gn__bill_peek_sig(items[i].env, items[i].len, 0, &ctx, &no, NULL, 0) == 0) {
      seq = no.seq < UINT64_MAX / 2 ? no.seq : UINT64_MAX / 2;
      acc = items[i].resp && gn__bill_response_open_sig(items[i].resp, items[i].resp_len, 0, &ctx, &rr, NULL, 0) == 0 &&
            rr.accepted;
    }
    keys[i].key = seq * 2 + (acc ? 0 : 1);
    keys[i].pos = i;
    keys[i].item = items[i];
  }
  qsort(keys, n_notes, sizeof(*keys), sort_cmp);
  for (size_t i = 0; i < n_notes; i++)
    items[i] = keys[i].item;
  free(keys);
  /* The exporter's own check of what it is about to write (the daemon's
   * loop waits for it): linked, which still binds every second to checked
   * signatures; the reader's audit checks every signature. */
  if ((r = audit_items(agreement_env, agreement_len, items, n_notes, invoice_env, invoice_len, response_env,
                       response_len, GN_BILL_AUDIT_LINKED, a)) < 0)
    goto out;
  r = GN_EAUDIT;
  if (a->verdict == GN_BILL_INVALID)
    goto out;
  r = GN_ENOMEM;
  if (!(o = json_object()) || !(arr = json_array()))
    goto out;
  set(o, "format", json_string(EXPORT_FORMAT), &ok);
  set(o, "agreement", b64_json(agreement_env, agreement_len), &ok);
  for (size_t i = 0; ok && i < n_notes; i++) {
    json_t *e = json_object();
    if (!e) {
      ok = false;
      break;
    }
    set(e, "note", b64_json(items[i].env, items[i].len), &ok);
    set(e, "response", b64_json(items[i].resp, items[i].resp_len), &ok);
    if (json_array_append_new(arr, e) < 0)
      ok = false;
  }
  set(o, "notes", arr, &ok);
  arr = NULL;
  set(o, "invoice", b64_json(invoice_env, invoice_len), &ok);
  set(o, "response", b64_json(response_env, response_len), &ok);
  json_t *sum = summary_json(a);
  if (!sum) {
    r = a->summary.total_micro > INT64_MAX || a->summary.price_uper_hour > INT64_MAX ? GN_ETOOBIG : GN_ENOMEM;
    goto out;
  }
  set(o, "summary", sum, &ok);
  if (!ok)
    goto out;
  *ret_json = o;
  o = NULL;
  r = 0;
out:
  json_decref(o);
  json_decref(arr);
  free(items);
  free(a);
  return r;
}

int gn_invoice_export(const uint8_t *invoice_env, size_t invoice_len, const uint8_t *accept_env, size_t accept_len,
                      struct json_t **ret_json) {
  gn_buf ag = {0};
  int r;
  if (!invoice_env || !ret_json || (accept_len && !accept_env))
    return GN_EINVAL;
  if ((r = gn__invoice_agreement(invoice_env, invoice_len, &ag)) < 0) {
    r = r == GN_ENOMEM ? r : GN_EAUDIT;
    goto out;
  }
  r = gn_bill_export(ag.data, ag.len, NULL, NULL, 0, invoice_env, invoice_len, accept_len ? accept_env : NULL,
                     accept_len, ret_json);
out:
  gn_buf_done(&ag);
  return r;
}

/* --- audit of a file ------------------------------------------------------------*/

/* Decodes a base64 member. GN_ENOTFOUND if absent or null, GN_EINVAL if not
 * base64 of at most GN_MSG_MAX bytes. *ret is malloc'd. */
static int b64_decode(const json_t *j, uint8_t **ret, size_t *ret_len) {
  if (!j || json_is_null(j))
    return GN_ENOTFOUND;
  if (!json_is_string(j))
    return GN_EINVAL;
  const char *s = json_string_value(j);
  size_t n = json_string_length(j);
  if (n > (size_t)GN_MSG_MAX / 3 * 4 + 8)
    return GN_EINVAL;
  size_t cap = n / 4 * 3 + 3;
  uint8_t *bin = malloc(cap ? cap : 1);
  size_t bin_len = 0;
  const char *end = NULL;
  if (!bin)
    return GN_ENOMEM;
  if (sodium_base642bin(bin, cap, s, n, NULL, &bin_len, &end, sodium_base64_VARIANT_ORIGINAL) != 0 || end != s + n) {
    free(bin);
    return GN_EINVAL;
  }
  *ret = bin;
  *ret_len = bin_len;
  return 0;
}

static void file_value(const json_t *j, char *buf, size_t cap) {
  if (!j)
    snprintf(buf, cap, "nothing (the field is missing)");
  else if (json_is_string(j))
    snprintf(buf, cap, "\"%.80s%s\"", json_string_value(j), json_string_length(j) > 80 ? "..." : "");
  else if (json_is_integer(j))
    snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
  else if (json_is_null(j))
    snprintf(buf, cap, "null");
  else
    snprintf(buf, cap, "a %s", json_is_object(j) ? "object" : json_is_array(j) ? "array" : "non-integer value");
}

/* The file's summary must be exactly the one the signed data gives. */
static void check_summary(const json_t *doc, gn_bill_audit *a) {
  const json_t *have = json_object_get(doc, "summary");
  json_t *want = summary_json(a);
  const char *key;
  json_t *wv;
  char got[128], exp[128];
  if (!want) {
    invalid(a, "a figure of the bill does not fit a JSON integer");
    return;
  }
  if (!json_is_object(have)) {
    invalid(a, "summary is missing or not an object");
    goto out;
  }
  json_object_foreach(want, key, wv) {
    const json_t *hv = json_object_get(have, key);
    if (!hv || !json_equal(hv, wv)) {
      file_value(hv, got, sizeof(got));
      file_value(wv, exp, sizeof(exp));
      invalid(a, "summary.%s in the file says %s but the signed data says %s", key, got, exp);
      goto out;
    }
  }
  if (json_object_size(have) != json_object_size(want))
    invalid(a, "summary has fields the signed data does not give");
out:
  json_decref(want);
}

static int not_export(gn_bill_audit *a, const char *what) {
  a->verdict = GN_BILL_INVALID;
  snprintf(a->reason, sizeof(a->reason), "not a gpunet invoice export (format " EXPORT_FORMAT "): %s", what);
  return GN_EINVAL;
}

int gn_invoice_audit_json(const struct json_t *doc, gn_bill_audit *ret) {
  return gn_invoice_audit_json_flags(doc, 0, ret);
}

int gn_invoice_audit_json_flags(const struct json_t *doc, unsigned flags, gn_bill_audit *ret) {
  uint8_t *ag = NULL, *inv = NULL, *resp = NULL;
  size_t ag_len = 0, inv_len = 0, resp_len = 0, n = 0;
  bill_item *items = NULL;
  int r;
  if (!ret)
    return GN_EINVAL;
  memset(ret, 0, sizeof(*ret));
  const json_t *fmt = json_is_object(doc) ? json_object_get(doc, "format") : NULL;
  if (!fmt || !json_is_string(fmt) || strcmp(json_string_value(fmt), EXPORT_FORMAT) != 0)
    return not_export(ret, "no \"format\": \"" EXPORT_FORMAT "\"");
  const json_t *notes = json_object_get(doc, "notes");
  if (!json_is_array(notes) || json_array_size(notes) > EXPORT_MAX_NOTES)
    return not_export(ret, "\"notes\" is not an array (of at most 400000)");
  if ((r = b64_decode(json_object_get(doc, "agreement"), &ag, &ag_len)) < 0) {
    r = r == GN_ENOMEM ? r : not_export(ret, "\"agreement\" is not base64");
    goto out;
  }
  n = json_array_size(notes);
  r = GN_ENOMEM;
  if (n && !(items = calloc(n, sizeof(*items))))
    goto out;
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(notes, i);
    uint8_t *p = NULL;
    size_t len = 0;
    if (!json_is_object(e)) {
      r = 0;
      invalid(ret, "notes[%zu] is not an object", i);
      goto out;
    }
    r = b64_decode(json_object_get(e, "note"), &p, &len);
    if (r == GN_ENOMEM)
      goto out;
    if (r < 0) {
      r = 0;
      invalid(ret, "notes[%zu].note is missing or not base64", i);
      goto out;
    }
    items[i].env = p;
    items[i].len = len;
    r = b64_decode(json_object_get(e, "response"), &p, &len);
    if (r == GN_ENOMEM)
      goto out;
    if (r == GN_EINVAL) {
      r = 0;
      invalid(ret, "notes[%zu].response is neither null nor base64", i);
      goto out;
    }
    if (r == 0) {
      items[i].resp = p;
      items[i].resp_len = len;
    }
  }
  r = b64_decode(json_object_get(doc, "invoice"), &inv, &inv_len);
  if (r == GN_ENOMEM)
    goto out;
  if (r == GN_EINVAL) {
    r = 0;
    invalid(ret, "invoice is neither null nor base64");
    goto out;
  }
  r = b64_decode(json_object_get(doc, "response"), &resp, &resp_len);
  if (r == GN_ENOMEM)
    goto out;
  if (r == GN_EINVAL) {
    r = 0;
    invalid(ret, "response is neither null nor base64");
    goto out;
  }
  if ((r = audit_items(ag, ag_len, items, n, inv, inv_len, resp, resp_len, flags, ret)) < 0)
    goto out;
  if (ret->verdict != GN_BILL_INVALID)
    check_summary(doc, ret);
  r = 0;
out:
  if (r == 0)
    r = ret->verdict == GN_BILL_COUNTERSIGNED ? 0 : GN_EAUDIT;
  for (size_t i = 0; i < n && items; i++) {
    free((void *)items[i].env);
    free((void *)items[i].resp);
  }
  free(items);
  free(ag);
  free(inv);
  free(resp);
  return r;
}
