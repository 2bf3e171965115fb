/* Billing v2 benchmark (issue 7, item 8). For leases of 1 hour, 24 hours and
 * 30 days (2,592,000 s) billed with debit notes every interval_s, it builds
 * the whole bill with the real code (notes, vouchers, final invoice and its
 * acceptance), exports it (gpunet-invoice/2), and times the audit of the
 * export text (parse + gn_invoice_audit_json, what `gpunet invoice audit`
 * does: the default linked audit, and the full one) against references in
 * the same run: parsing the text alone and recomputing the bare tick hash
 * chain of the same seconds. Then the debit-note round trip (seal, check,
 * accept, open) per second. `billing_bench seeds DIR` writes the fuzz seed
 * corpora of fuzz_invoice and fuzz_note instead. */
#include "billing_int.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define CHECK(x)                                                                                                       \
  do {                                                                                                                 \
    int rc_ = (x);                                                                                                     \
    if (rc_ != 0) {                                                                                                    \
      fprintf(stderr, "%s:%d: %s failed: %d (%s)\n", __FILE__, __LINE__, #x, rc_, gn_strerror(rc_));                   \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

/* A fixed identity from a one-byte seed, so seeds are stable. */
static gn_identity *identity_from(uint8_t b) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  gn_identity *id = calloc(1, sizeof(*id));
  if (!id || !(id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES)))
    exit(1);
  memset(seed, b, sizeof(seed));
  crypto_sign_seed_keypair(id->pk, id->sk, seed);
  return id;
}

/* The lease of the fuzz targets: fixed keys, id, nonce and times. */
static void make_agreement(const gn_identity *prov, const gn_identity *req, uint32_t count, uint64_t max_s,
                           uint32_t interval_s, gn_buf *ret_ag) {
  static const char *const gpus[GN_LEASE_MAX_GPUS] = {"GPU-8f1c2a3b-5d6e-4f70-8192-a3b4c5d6e7f8",
                                                      "GPU-1",
                                                      "GPU-2",
                                                      "GPU-3",
                                                      "GPU-4",
                                                      "GPU-5",
                                                      "GPU-6",
                                                      "GPU-7",
                                                      "GPU-8",
                                                      "GPU-9",
                                                      "GPU-10",
                                                      "GPU-11",
                                                      "GPU-12",
                                                      "GPU-13",
                                                      "GPU-14",
                                                      "GPU-15"};
  gn_lease_terms t;
  gn_buf rq = {0};
  memset(&t, 0, sizeof(t));
  snprintf(t.lease_id, sizeof(t.lease_id), "l-00c0ffee00c0ffee");
  memset(t.nonce, 0x5a, sizeof(t.nonce));
  memcpy(t.provider, prov->pk, GN_PK_LEN);
  memcpy(t.requester, req->pk, GN_PK_LEN);
  snprintf(t.offer_id, sizeof(t.offer_id), "o-3f2a9c1d7e4b");
  snprintf(t.gpu_model, sizeof(t.gpu_model), "NVIDIA GeForce RTX 4090");
  t.count = count;
  t.price_uper_hour = 400000;
  snprintf(t.currency, sizeof(t.currency), "EUR");
  t.max_s = max_s;
  t.interval_s = interval_s;
  t.requested_s = 1764670000;
  CHECK(gn_lease_request_seal(req, &t, &rq));
  CHECK(gn_agreement_seal(prov, rq.data, rq.len, 1764670001, gpus, count, ret_ag));
  gn_buf_done(&rq);
}

static uint8_t *ticks_for(uint64_t n) {
  uint8_t *t = malloc(n * GN_BILL_TICK_LEN);
  if (!t)
    exit(1);
  for (uint64_t i = 0; i < n; i++) {
    t[2 * i] = 1;
    t[2 * i + 1] = (uint8_t)(i % 101);
  }
  return t;
}

/* The whole bill of a lease of `seconds` with a note every interval_s; the
 * last interval goes into the final invoice. */
typedef struct bill {
  gn_buf ag;
  gn_buf *notes, *resps;
  size_t n;
  gn_buf inv, inv_resp;
} bill;

static void bill_build(const gn_identity *prov, const gn_identity *req, uint64_t seconds, uint32_t interval_s,
                       const uint8_t *ticks, bill *b) {
  gn_bill_head h, next;
  memset(b, 0, sizeof(*b));
  make_agreement(prov, req, 1, seconds, interval_s, &b->ag);
  CHECK(gn_bill_head_init(b->ag.data, b->ag.len, &h));
  size_t cap = seconds / interval_s + 1;
  b->notes = calloc(cap, sizeof(gn_buf));
  b->resps = calloc(cap, sizeof(gn_buf));
  if (!b->notes || !b->resps)
    exit(1);
  while (seconds - h.seconds > interval_s) {
    gn_buf *nt = &b->notes[b->n], *rs = &b->resps[b->n];
    CHECK(gn_bill_note_seal(prov, b->ag.data, b->ag.len, &h, ticks + 2 * h.seconds, interval_s,
                            1764670001 + (int64_t)(h.seconds + interval_s), nt, &next));
    CHECK(gn_bill_note_accept_seal(req, b->ag.data, b->ag.len, &next, rs));
    h = next;
    b->n++;
  }
  CHECK(gn_bill_invoice_seal(prov, b->ag.data, b->ag.len, &h, ticks + 2 * h.seconds, seconds - h.seconds,
                             1764670001 + (int64_t)seconds, "expired", &b->inv, &next));
  CHECK(
      gn_bill_invoice_accept_seal(req, b->ag.data, b->ag.len, &next, 1764670001 + (int64_t)seconds + 5, &b->inv_resp));
}

static void bill_done(bill *b) {
  for (size_t i = 0; i < b->n; i++) {
    gn_buf_done(&b->notes[i]);
    gn_buf_done(&b->resps[i]);
  }
  free(b->notes);
  free(b->resps);
  gn_buf_done(&b->ag);
  gn_buf_done(&b->inv);
  gn_buf_done(&b->inv_resp);
}

/* The bare chain: the same per-second hash, nothing else. */
static double bare_chain_s(const bill *b, const uint8_t *ticks, uint64_t seconds, uint8_t out[32]) {
  gn__tick_hasher th;
  double t0 = now_s();
  gn__genesis(b->ag.data, b->ag.len, out);
  gn__tick_hasher_init(&th, "l-00c0ffee00c0ffee");
  for (uint64_t i = 0; i < seconds; i++)
    gn__tick_hasher_step(&th, out, i + 1, ticks[2 * i], ticks[2 * i + 1]);
  return now_s() - t0;
}

static double worst_30d_s = -1; /* the default audit of 30 days at a note a minute */

static void bench_lease(const char *label, uint64_t seconds, uint32_t interval_s, const gn_identity *prov,
                        const gn_identity *req) {
  bill b;
  uint8_t *ticks = ticks_for(seconds), chain[32];
  double t0 = now_s();
  bill_build(prov, req, seconds, interval_s, ticks, &b);
  double build_s = now_s() - t0;
  json_t *doc = NULL;
  t0 = now_s();
  CHECK(gn_bill_export(b.ag.data, b.ag.len, b.notes, b.resps, b.n, b.inv.data, b.inv.len, b.inv_resp.data,
                       b.inv_resp.len, &doc));
  char *text = json_dumps(doc, JSON_COMPACT);
  double export_s = now_s() - t0;
  json_decref(doc);
  if (!text)
    exit(1);
  size_t size = strlen(text);
  /* The audit as `gpunet invoice audit` runs it: parse the text, audit; by
   * default (linked) and with --full (GN_BILL_AUDIT_FULL). References in
   * the same run: parsing the text alone, and recomputing the bare tick
   * chain on one core. Each the best of three, interleaved. */
  double audit_s = 1e9, full_s = 1e9, parse_s = 1e9, chain_s = 1e9;
  for (int k = 0; k < 3; k++) {
    gn_bill_audit a;
    json_error_t err;
    for (int full = 0; full < 2; full++) {
      t0 = now_s();
      json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &err);
      if (!j)
        exit(1);
      int r = gn_invoice_audit_json_flags(j, full ? GN_BILL_AUDIT_FULL : 0, &a);
      double dt = now_s() - t0;
      json_decref(j);
      if (r != 0 || a.summary.seconds != seconds) {
        fprintf(stderr, "%s audit of the %s export failed: %s\n", full ? "full" : "default", label, a.reason);
        exit(1);
      }
      double *best = full ? &full_s : &audit_s;
      *best = dt < *best ? dt : *best;
    }
    t0 = now_s();
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    double p = now_s() - t0;
    if (!j)
      exit(1);
    json_decref(j);
    parse_s = p < parse_s ? p : parse_s;
    double c = bare_chain_s(&b, ticks, seconds, chain);
    chain_s = c < chain_s ? c : chain_s;
    if (memcmp(chain, a.summary.chain_head, 32) != 0) {
      fprintf(stderr, "the bare chain and the audited chain differ\n");
      exit(1);
    }
  }
  const double ref_s = parse_s + chain_s;
  printf("%-5s %8" PRIu64 " %5" PRIu32 " %6zu %9.2f %8.3f %8.3f %8.3f %8.3f %8.3f %6.2fx %6.2fx %8.2f %8.2f\n", label,
         seconds, interval_s, b.n, (double)size / 1e6, audit_s, full_s, parse_s, chain_s, ref_s, audit_s / ref_s,
         full_s / ref_s, build_s, export_s);
  if (seconds == 2592000 && interval_s == 60)
    worst_30d_s = audit_s;
  const char *dir = getenv("GN_BENCH_EXPORT_DIR"); /* keep the files, e.g. for `gpunet invoice audit` */
  if (dir) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s-%" PRIu32 "s.json", dir, label, interval_s);
    FILE *f = fopen(path, "w");
    if (!f || fwrite(text, 1, size, f) != size || fclose(f) != 0)
      fprintf(stderr, "cannot write %s\n", path);
  }
  free(text);
  free(ticks);
  bill_done(&b);
}

/* seal (provider) -> check (requester) -> accept (requester) -> open
 * (provider), for notes of interval_s seconds, for about a second. */
static void bench_round_trip(const gn_identity *prov, const gn_identity *req, uint32_t interval_s) {
  gn_buf ag = {0};
  gn_bill_head h, hp, next;
  uint64_t max_s = GN_INVOICE_MAX_S;
  make_agreement(prov, req, 1, max_s, interval_s, &ag);
  CHECK(gn_bill_head_init(ag.data, ag.len, &h));
  uint8_t *ticks = ticks_for(interval_s);
  uint64_t n = 0;
  char reason[512];
  double t0 = now_s(), dt;
  do {
    gn_buf note = {0}, acc = {0};
    gn_bill_response resp;
    gn_bill_note no;
    if (h.seconds + interval_s > max_s)
      CHECK(gn_bill_head_init(ag.data, ag.len, &h));
    CHECK(gn_bill_note_seal(prov, ag.data, ag.len, &h, ticks, interval_s, 1764670001, &note, &hp));
    int r = gn_bill_note_check(note.data, note.len, ag.data, ag.len, &h, h.seconds + interval_s,
                               gn_bill_tolerance_s(h.seconds + interval_s), 0, &next, &no, reason, sizeof(reason));
    if (r != 0) {
      fprintf(stderr, "round trip: %s\n", reason);
      exit(1);
    }
    CHECK(gn_bill_note_accept_seal(req, ag.data, ag.len, &next, &acc));
    CHECK(gn_bill_response_open(acc.data, acc.len, ag.data, ag.len, &resp));
    CHECK(gn_bill_response_matches(&resp, &no));
    h = hp;
    gn_buf_done(&note);
    gn_buf_done(&acc);
    n++;
    dt = now_s() - t0;
  } while (dt < 1.0);
  printf("debit-note round trip (seal, check, accept, open), %" PRIu32 " s notes: %.0f per second (%.1f us each)\n",
         interval_s, (double)n / dt, dt / (double)n * 1e6);
  free(ticks);
  gn_buf_done(&ag);
}

/* --- fuzz seeds ------------------------------------------------------------*/

static void write_file(const char *dir, const char *name, uint8_t mode, const uint8_t *p, size_t n) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(&mode, 1, 1, f) != 1 || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

static void body_of(const gn_buf *env, gn_buf *ret) {
  gn_envelope e;
  CHECK(gn_envelope_open(env->data, env->len, &e));
  CHECK(gn_buf_append(ret, e.body, e.body_len));
}

/* The fuzz targets build the same lease (fixed keys, 1 GPU, max_s 3600,
 * ticks of 1 GPU at util i % 101): a note of seconds 1..5 (accepted), a note
 * of 6..10, an invoice continuing note 1 with 6..8. */
static void seeds(const char *dir) {
  gn_identity *prov = identity_from(1), *req = identity_from(2);
  gn_buf ag = {0}, n1 = {0}, n2 = {0}, a1 = {0}, r2 = {0}, inv = {0}, ia = {0}, ir = {0}, body = {0};
  gn_bill_head h0, h1, h2, hf;
  char sub[900];
  uint8_t *t = ticks_for(10);
  make_agreement(prov, req, 1, 3600, 60, &ag);
  CHECK(gn_bill_head_init(ag.data, ag.len, &h0));
  CHECK(gn_bill_note_seal(prov, ag.data, ag.len, &h0, t, 5, 1764670006, &n1, &h1));
  CHECK(gn_bill_note_accept_seal(req, ag.data, ag.len, &h1, &a1));
  CHECK(gn_bill_note_seal(prov, ag.data, ag.len, &h1, t + 10, 5, 1764670011, &n2, &h2));
  CHECK(gn_bill_note_reject_seal(req, ag.data, ag.len, n2.data, n2.len, "spending cap", &r2));
  CHECK(gn_bill_invoice_seal(prov, ag.data, ag.len, &h1, t + 10, 3, 1764670009, "released", &inv, &hf));
  CHECK(gn_bill_invoice_accept_seal(req, ag.data, ag.len, &hf, 1764670010, &ia));
  CHECK(gn_bill_invoice_reject_seal(req, ag.data, ag.len, inv.data, inv.len, "second 7 not given", &ir));
  gn_buf notes[2] = {n1, n2}, resps[2] = {a1, r2};
  json_t *doc = NULL;
  CHECK(gn_bill_export(ag.data, ag.len, notes, resps, 2, inv.data, inv.len, ia.data, ia.len, &doc));
  char *text = json_dumps(doc, JSON_COMPACT);
  json_decref(doc);
  /* fuzz_note: 0 note env at h0, 1 note body signed here, 2 invoice body at
   * h1, 3 response env, 4 note env at h1. */
  snprintf(sub, sizeof(sub), "%s/fuzz_note", dir);
  mkdir(sub, 0755);
  write_file(sub, "note1_env", 0, n1.data, n1.len);
  body_of(&n1, &body);
  write_file(sub, "note1_body", 1, body.data, body.len);
  body.len = 0;
  body_of(&inv, &body);
  write_file(sub, "invoice_body", 2, body.data, body.len);
  write_file(sub, "debit_accept", 3, a1.data, a1.len);
  write_file(sub, "debit_reject", 3, r2.data, r2.len);
  write_file(sub, "invoice_accept", 3, ia.data, ia.len);
  write_file(sub, "invoice_reject", 3, ir.data, ir.len);
  write_file(sub, "note2_env", 4, n2.data, n2.len);
  /* fuzz_invoice: 0 invoice env (old API: continues no note; the same bytes
   * as the target's fixed invoice), 1 its body, 2 export JSON, 3 response
   * envs for the fixed invoice. */
  gn_buf inv0 = {0}, ia0 = {0}, ir0 = {0};
  CHECK(gn_bill_invoice_seal(prov, ag.data, ag.len, &h0, t, 5, 1764670006, "released", &inv0, &hf));
  CHECK(gn_bill_invoice_accept_seal(req, ag.data, ag.len, &hf, 1764670007, &ia0));
  CHECK(gn_bill_invoice_reject_seal(req, ag.data, ag.len, inv0.data, inv0.len, "second 3 not given", &ir0));
  snprintf(sub, sizeof(sub), "%s/fuzz_invoice", dir);
  mkdir(sub, 0755);
  write_file(sub, "invoice_env", 0, inv0.data, inv0.len);
  body.len = 0;
  body_of(&inv0, &body);
  write_file(sub, "invoice_body", 1, body.data, body.len);
  write_file(sub, "export_json", 2, (const uint8_t *)text, strlen(text));
  write_file(sub, "accept_env", 3, ia0.data, ia0.len);
  write_file(sub, "reject_env", 3, ir0.data, ir0.len);
  gn_buf_done(&inv0);
  gn_buf_done(&ia0);
  gn_buf_done(&ir0);
  printf("seeds written under %s/fuzz_note and %s/fuzz_invoice\n", dir, dir);
  free(text);
  free(t);
  gn_buf_done(&ag);
  gn_buf_done(&n1);
  gn_buf_done(&n2);
  gn_buf_done(&a1);
  gn_buf_done(&r2);
  gn_buf_done(&inv);
  gn_buf_done(&ia);
  gn_buf_done(&ir);
  gn_buf_done(&body);
}

int main(int argc, char **argv) {
  if (sodium_init() < 0)
    return 1;
  if (argc >= 2 && strcmp(argv[1], "seeds") == 0) {
    seeds(argc >= 3 ? argv[2] : "tests/fuzz/corpus");
    return 0;
  }
  uint32_t interval_s = 60;
  const char *env = getenv("GN_BENCH_INTERVAL_S");
  if (env && atoi(env) > 0)
    interval_s = (uint32_t)atoi(env);
  gn_identity *prov = identity_from(1), *req = identity_from(2);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  printf("billing v2: export (gpunet-invoice/2) of a whole lease, a debit note every interval_s, the final\n"
         "invoice and its acceptance; each time the best of 3 in the same run, on %ld CPUs.\n"
         "  audit_s  parse + gn_invoice_audit_json: `gpunet invoice audit`, the default (linked) audit: every\n"
         "           second's chain and total; superseded notes and vouchers checked by hash links\n"
         "  full_s   the same with GN_BILL_AUDIT_FULL (`--full`): every signature one by one as well\n"
         "  parse_s  reference: json_loads of the text alone\n"
         "  chain_s  reference: recomputing the bare tick hash chain of the same seconds on one core\n"
         "  ref_s    parse_s + chain_s; the ratios are audit_s / ref_s and full_s / ref_s\n",
         cpus);
  printf("%-5s %8s %5s %6s %9s %8s %8s %8s %8s %8s %7s %7s %8s %8s\n", "lease", "seconds", "intvl", "notes",
         "export_MB", "audit_s", "full_s", "parse_s", "chain_s", "ref_s", "audit/", "full/", "build_s", "export_s");
  bench_lease("1h", 3600, interval_s, prov, req);
  bench_lease("24h", 86400, interval_s, prov, req);
  bench_lease("30d", 2592000, interval_s, prov, req);
  if (interval_s != 3600)
    bench_lease("30d", 2592000, 3600, prov, req);
  if (worst_30d_s >= 0)
    printf("goal (issue 7): the default audit of 30 days at a note a minute in <= 2 s: %.3f s, %s\n", worst_30d_s,
           worst_30d_s <= 2.0 ? "met" : "NOT met");
  bench_round_trip(prov, req, interval_s);
  return 0;
}
