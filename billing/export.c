/* The self-contained export of a lease's bill (format gpunet-invoice/2) and
 * its daemon-free audit. The signed envelopes (base64) are authoritative: the
 * agreement, every debit note with the requester's answer, the final invoice
 * and its answer. The audit recomputes the tick chain of every second (the
 * accepted notes' ticks, then the invoice's) and verifies the signatures that
 * bind them (by default the superseded accepted notes and vouchers through
 * their hash links, see audit_items; GN_BILL_AUDIT_FULL each one too), and
 * the readable "summary" must say exactly what the signed data says. */
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

/* --- the parallel pass ------------------------------------------------------*/

/* An audit's time goes to the note and voucher signatures (a 30-day lease
 * with a note a minute has 86,400 Ed25519 checks of ~36 us: ~3 s on one
 * core) and to the tick chain (2,592,000 BLAKE2b steps: ~0.5 s). Both split
 * by note: a pass on all CPUs checks the signatures and verifies each
 * accepted note against the head that the accepted note before it claims
 * (its seq, hash, totals and chain_head, read from its body), and the
 * sequential walk that follows uses a note's result only if that head is the
 * one the walk actually reached; otherwise it verifies the note again
 * itself. gn__bill_verify_sig is a pure function of the bytes, the
 * signature result and the head, so the verdict and its reason are those of
 * a one-thread walk, whatever the threads did. */

#define NOT_ACCEPTED SIZE_MAX /* prev_acc[i] of a note not answered with an acceptance */

/* An accepted note verified against the head the accepted note before it
 * claims (one per note, ~0.5 KB: 20 MB for 30 days at a note a minute,
 * beside the decoded document). */
typedef struct spec_result {
  int rc;            /* 0: verified against head; < 0: the walk verifies it again */
  gn_bill_head head; /* the head it was verified against */
  gn_bill_note note;
  gn_bill_head next;
} spec_result;

typedef struct audit_pass {
  const gn__bill_ctx *ctx;
  const bill_item *items;
  size_t n;
  bool *accepted;         /* phase 1 writes: the note's response reads as an acceptance (signature unchecked) */
  int *note_rc, *resp_rc; /* phase 2: signature checks (0 where skipped: linked) */
  const bool *linked;     /* NULL, or per note: its signatures are not checked (see audit_items) */
  const size_t *prev_acc; /* per note: the accepted note before it (n: none), NOT_ACCEPTED */
  spec_result *spec;      /* per note, for accepted notes */
  size_t next;            /* atomic */
} audit_pass;

static int sig_check(const uint8_t *p, size_t len) {
  gn_envelope e;
  int r = gn_envelope_open(p, len, &e);
  return r == GN__SIG_UNCHECKED ? GN_EINVAL : r;
}

/* Phase 1: which notes are answered with an acceptance (read unchecked:
 * only to choose what phase 2 does; the walk checks every response it
 * relies on). */
static void pass_accepted(audit_pass *ap, size_t i) {
  gn_bill_response r;
  const bill_item *it = &ap->items[i];
  ap->spec[i].rc = GN_EAUDIT; /* nothing the walk may use until phase 2 verifies it */
  ap->accepted[i] = it->resp && gn__bill_response_open_sig(it->resp, it->resp_len, 0, ap->ctx, &r, NULL, 0) == 0 &&
                    r.accepted && !r.final;
}

static void head_of(const gn_bill_note *no, gn_bill_head *ret) {
  memset(ret, 0, sizeof(*ret));
  ret->seq = no->seq;
  memcpy(ret->note_hash, no->hash, GN__HASH_LEN);
  ret->seconds = no->seconds;
  ret->gpu_seconds = no->gpu_seconds;
  ret->total_micro = no->total_micro;
  memcpy(ret->chain_head, no->chain_head, GN__HASH_LEN);
}

static bool head_equal(const gn_bill_head *a, const gn_bill_head *b) {
  return a->seq == b->seq && a->seconds == b->seconds && a->gpu_seconds == b->gpu_seconds &&
         a->total_micro == b->total_micro && memcmp(a->note_hash, b->note_hash, GN__HASH_LEN) == 0 &&
         memcmp(a->chain_head, b->chain_head, GN__HASH_LEN) == 0;
}

/* Phase 2: the signatures of note i and its response, and for an accepted
 * note its verification against the head its predecessor claims. */
static void pass_verify(audit_pass *ap, size_t i) {
  const bill_item *it = &ap->items[i];
  if (ap->linked && ap->linked[i]) {
    ap->note_rc[i] = ap->resp_rc[i] = 0;
  } else {
    ap->note_rc[i] = sig_check(it->env, it->len);
    ap->resp_rc[i] = it->resp ? sig_check(it->resp, it->resp_len) : 0;
  }
  const size_t prev = ap->prev_acc[i];
  if (prev == NOT_ACCEPTED)
    return;
  spec_result *s = &ap->spec[i];
  gn__bill_view v;
  s->rc = GN_EAUDIT;
  if (prev == ap->n) {
    gn__bill_head_genesis(ap->ctx, &s->head);
  } else {
    gn_bill_note p;
    if (gn__bill_peek_sig(ap->items[prev].env, ap->items[prev].len, 0, ap->ctx, &p, NULL, 0) < 0)
      return;
    head_of(&p, &s->head);
  }
  if (gn__bill_verify_sig(it->env, it->len, ap->note_rc[i], false, ap->ctx, &s->head, NULL, &v, NULL, 0) < 0)
    return;
  s->note = v.note;
  s->next = v.next;
  gn__bill_view_done(&v);
  s->rc = 0;
}

typedef struct pass_run {
  audit_pass *ap;
  void (*fn)(audit_pass *ap, size_t i);
} pass_run;

static void *pass_worker(void *arg) {
  pass_run *pr = arg;
  for (;;) {
    size_t i = __atomic_fetch_add(&pr->ap->next, 1, __ATOMIC_RELAXED);
    if (i >= pr->ap->n)
      break;
    pr->fn(pr->ap, i);
  }
  return NULL;
}

#define PASS_MAX_THREADS 16
#define PASS_PARALLEL_MIN 64 /* notes; below this, threads cost more than they save */

/* fn(ap, i) for every note, on all CPUs (at most PASS_MAX_THREADS). Each i
 * writes only its own slots; pthread_join orders those writes before the
 * caller reads them. */
static void pass_run_all(audit_pass *ap, void (*fn)(audit_pass *ap, size_t i)) {
  pthread_t th[PASS_MAX_THREADS];
  pass_run pr = {ap, fn};
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  size_t nt = 0, want = cpus > 1 ? (size_t)cpus : 1;
  if (want > PASS_MAX_THREADS)
    want = PASS_MAX_THREADS;
  ap->next = 0;
  if (ap->n >= PASS_PARALLEL_MIN)
    for (; nt + 1 < want; nt++)
      if (pthread_create(&th[nt], NULL, pass_worker, &pr) != 0)
        break; /* fewer threads: the calling one does the rest */
  pass_worker(&pr);
  for (size_t i = 0; i < nt; i++)
    pthread_join(th[i], NULL);
}

static int audit_walk(const gn__bill_ctx *ctxp, const bill_item *notes, size_t n, const int *rcs,
                      const spec_result *spec, const uint8_t *inv, size_t inv_len, const uint8_t *resp, size_t resp_len,
                      gn_bill_audit *a);

/* The verdict on a bill given as envelopes. Returns GN_ENOMEM or 0 (the
 * verdict, INVALID included, is in *a).
 *
 * By default (linked) the signatures of the accepted notes before the last
 * accepted one, and of their vouchers, are not checked one by one: the walk
 * requires every accepted note to continue the one before it by hash (prev
 * is BLAKE2b-256 of the whole earlier envelope, signature bytes included),
 * and checks the signatures of the last accepted note and its voucher, of
 * every unaccepted note and answer, of the final invoice and its answer.
 * So each superseded note is bound, byte for byte, into the chain that ends
 * in a checked signature of the provider (the last note, the invoice) and
 * of the requester (its cumulative voucher, the countersignature): a
 * superseded note cannot be changed without breaking the links, and a
 * superseded voucher is covered by the later cumulative ones, so a forged
 * superseded signature cannot change a second, a total or the verdict. What
 * goes unchecked is only
 * whether each superseded signature's own bytes are valid; with
 * GN_BILL_AUDIT_FULL they are checked too (forensics: who sent broken
 * bytes), and a bad one makes the bill invalid. */
static int audit_items(const uint8_t *ag, size_t ag_len, const bill_item *notes, size_t n, const uint8_t *inv,
                       size_t inv_len, const uint8_t *resp, size_t resp_len, unsigned flags, gn_bill_audit *a) {
  gn__bill_ctx ctx;
  char why[400];
  int *rcs = NULL;
  bool *accepted = NULL, *linked = NULL;
  size_t *prev_acc = NULL;
  spec_result *spec = NULL;
  int r = GN_ENOMEM;
  memset(a, 0, sizeof(*a));
  a->verdict = GN_BILL_INVALID;
  if (gn__bill_ctx_open(ag, ag_len, &ctx, why, sizeof(why)) < 0) {
    invalid(a, "%s", why);
    return 0;
  }
  if (n) {
    if (!(rcs = calloc(2 * n, sizeof(*rcs))) || !(accepted = calloc(n, sizeof(*accepted))) ||
        !(prev_acc = calloc(n, sizeof(*prev_acc))) || !(spec = calloc(n, sizeof(*spec))))
      goto out;
    audit_pass ap = {&ctx, notes, n, accepted, rcs, rcs + n, NULL, prev_acc, spec, 0};
    pass_run_all(&ap, pass_accepted);
    size_t last = n;
    for (size_t i = 0; i < n; i++) {
      prev_acc[i] = accepted[i] ? last : NOT_ACCEPTED;
      if (accepted[i])
        last = i;
    }
    if (!(flags & GN_BILL_AUDIT_FULL)) {
      /* Linked: accepted notes before the last accepted one, and their
       * vouchers, are bound by their hash links (see above). */
      if (!(linked = calloc(n, sizeof(*linked))))
        goto out;
      for (size_t i = 0; i < n; i++)
        linked[i] = accepted[i] && i != last;
      ap.linked = linked;
    }
    pass_run_all(&ap, pass_verify);
  }
  r = audit_walk(&ctx, notes, n, rcs, spec, inv, inv_len, resp, resp_len, a);
out:
  free(rcs);
  free(accepted);
  free(linked);
  free(prev_acc);
  free(spec);
  return r;
}

/* The sequential part of the audit: rcs[i] / rcs[n + i] are the signature
 * checks of note i and its response. */
static int audit_walk(const gn__bill_ctx *ctxp, const bill_item *notes, size_t n, const int *rcs,
                      const spec_result *spec, const uint8_t *inv, size_t inv_len, const uint8_t *resp, size_t resp_len,
                      gn_bill_audit *a) {
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
    if (accepted && spec[i].rc == 0 && head_equal(&spec[i].head, &head)) {
      no = spec[i].note; /* verified by the parallel pass against this very head */
      head = spec[i].next;
    } else if (accepted) {
      gn__bill_view v;
      if (gn__bill_verify_sig(notes[i].env, notes[i].len, rcs[i], false, &ctx, &head, NULL, &v, why, sizeof(why)) < 0) {
        invalid(a, "notes[%zu] (accepted by the requester): %s", i, why);
        return 0;
      }
      no = v.note;
      head = v.next;
      gn__bill_view_done(&v);
    }
    if (accepted) {
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
  if (s->energy.present) { /* both at most INT64_MAX (the invoice decoder's bound) */
    set(o, "energy_mj", json_integer((json_int_t)s->energy.mj), &ok);
    set(o, "energy_measured_s", json_integer((json_int_t)s->energy.measured_s), &ok);
    set(o, "energy_plausible", json_boolean(s->energy_plausible), &ok);
  }
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
   * loop waits for it): the default (linked) audit, the reader's. */
  if ((r = audit_items(agreement_env, agreement_len, items, n_notes, invoice_env, invoice_len, response_env,
                       response_len, 0, a)) < 0)
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

/* The value of each base64 character of the original alphabet, -1 for any
 * other byte ('=' included). */
static const int8_t b64_values[256] = {
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 62, -1, -1, -1, 63, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61,
    -1, -1, -1, -1, -1, -1, -1, 0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, -1, -1, -1, -1, -1, -1, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
    45, 46, 47, 48, 49, 50, 51, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
};

static int b64_val(unsigned char c) {
  return b64_values[c];
}

int gn__b64_decode(const char *s, size_t n, uint8_t *out, size_t cap, size_t *ret_len) {
  const unsigned char *u = (const unsigned char *)s;
  if (n % 4)
    return GN_EINVAL;
  const size_t pad = n && u[n - 1] == '=' ? (u[n - 2] == '=' ? 2 : 1) : 0;
  const size_t full = n / 4 - (pad ? 1 : 0), len = n / 4 * 3 - pad;
  if (len > cap)
    return GN_EINVAL;
  uint8_t *o = out;
  for (size_t g = 0; g < full; g++, u += 4, o += 3) {
    const int a = b64_val(u[0]), b = b64_val(u[1]), c = b64_val(u[2]), d = b64_val(u[3]);
    if ((a | b | c | d) < 0)
      return GN_EINVAL;
    const uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
    o[0] = (uint8_t)(v >> 16);
    o[1] = (uint8_t)(v >> 8);
    o[2] = (uint8_t)v;
  }
  if (pad) {
    /* "xx==" (one byte) or "xxx=" (two), the bits after them zero. */
    const int a = b64_val(u[0]), b = b64_val(u[1]), c = pad == 1 ? b64_val(u[2]) : 0;
    if ((a | b | c) < 0 || (pad == 2 ? (b & 0x0f) : (c & 0x03)) != 0)
      return GN_EINVAL;
    o[0] = (uint8_t)(a << 2 | b >> 4);
    if (pad == 1)
      o[1] = (uint8_t)((b & 0x0f) << 4 | c >> 2);
  }
  *ret_len = len;
  return 0;
}

/* Decodes a base64 member (gn__b64_decode: sodium's original variant, as
 * written, decoded at table speed). GN_ENOTFOUND if absent or null,
 * GN_EINVAL if not base64 of at most GN_MSG_MAX bytes. *ret is malloc'd. */
static int b64_decode(const json_t *j, uint8_t **ret, size_t *ret_len) {
  if (!j || json_is_null(j))
    return GN_ENOTFOUND;
  if (!json_is_string(j))
    return GN_EINVAL;
  const char *s = json_string_value(j);
  size_t n = json_string_length(j);
  if (n > (size_t)GN_MSG_MAX / 3 * 4 + 8)
    return GN_EINVAL;
  size_t cap = n / 4 * 3;
  uint8_t *bin = malloc(cap ? cap : 1);
  size_t bin_len = 0;
  if (!bin)
    return GN_ENOMEM;
  if (gn__b64_decode(s, n, bin, cap, &bin_len) < 0) {
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
  if (flags & ~GN_BILL_AUDIT_FULL) {
    ret->verdict = GN_BILL_INVALID;
    snprintf(ret->reason, sizeof(ret->reason), "unknown audit flags 0x%x", flags & ~GN_BILL_AUDIT_FULL);
    return GN_EINVAL;
  }
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
