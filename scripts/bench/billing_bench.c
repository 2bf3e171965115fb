/* Billing benchmarks and example generator. `billing_bench` measures the
 * tick append rate (one committed transaction per tick, WAL + synchronous
 * FULL, against one batched transaction) and the cost of auditing a 24-hour
 * invoice against building and signing it. `billing_bench examples DIR`
 * prints one deterministic hex example of each billing envelope (for
 * docs/protocol.md (section 2)) and writes fuzzing seeds under DIR. */
#include "billing_int.h"

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

/* A fixed identity from a one-byte seed, so examples and seeds are stable. */
static gn_identity *identity_from(uint8_t b) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  gn_identity *id = calloc(1, sizeof(*id));
  if (!id || !(id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES)))
    exit(1);
  memset(seed, b, sizeof(seed));
  crypto_sign_seed_keypair(id->pk, id->sk, seed);
  return id;
}

static sqlite3 *db_open(const char *path) {
  sqlite3 *db = NULL;
  if (sqlite3_open(path, &db) != SQLITE_OK ||
      sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", NULL, NULL, NULL) != SQLITE_OK)
    exit(1);
  return db;
}

static void make_agreement(const gn_identity *prov, const gn_identity *req, uint32_t count, uint64_t max_s,
                           const char *lease_id, gn_buf *ret_req, gn_buf *ret_ag) {
  gn_lease_terms t;
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
  memset(&t, 0, sizeof(t));
  gn_lease_terms_init(&t);
  if (lease_id) {
    snprintf(t.lease_id, sizeof(t.lease_id), "%s", lease_id);
    memset(t.nonce, 0x5a, sizeof(t.nonce));
  }
  memcpy(t.provider, prov->pk, GN_PK_LEN);
  memcpy(t.requester, req->pk, GN_PK_LEN);
  snprintf(t.offer_id, sizeof(t.offer_id), "o-3f2a9c1d7e4b");
  snprintf(t.gpu_model, sizeof(t.gpu_model), "NVIDIA GeForce RTX 4090");
  t.count = count;
  t.price_uper_hour = 400000;
  snprintf(t.currency, sizeof(t.currency), "EUR");
  t.max_s = max_s;
  t.interval_s = 60;
  t.requested_s = 1764670000;
  t.simulated = false;
  CHECK(gn_lease_request_seal(req, &t, ret_req));
  CHECK(gn_agreement_seal(prov, ret_req->data, ret_req->len, 1764670001, gpus, count, ret_ag));
}

static char *hex_of(const gn_buf *b) {
  char *h = malloc(b->len * 2 + 1);
  if (!h)
    exit(1);
  sodium_bin2hex(h, b->len * 2 + 1, b->data, b->len);
  return h;
}

static void write_file(const char *dir, const char *name, uint8_t mode, const void *p, size_t n) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f)
    exit(1);
  fputc(mode, f);
  fwrite(p, 1, n, f);
  fclose(f);
}

static int examples(const char *outdir) {
  char tmp[] = "/tmp/gn-billing-ex-XXXXXX";
  char path[256], dir_inv[512], dir_ag[512];
  gn_identity *prov = identity_from(1), *req = identity_from(2);
  gn_buf rq = {0}, ag = {0}, inv = {0}, acc = {0}, rej = {0};
  gn_ledger *l = NULL;
  const char *lease = "l-00c0ffee00c0ffee";
  if (!mkdtemp(tmp))
    return 1;
  snprintf(path, sizeof(path), "%s/ex.db", tmp);
  sqlite3 *db = db_open(path);
  CHECK(gn_ledger_open(db, &l));
  make_agreement(prov, req, 1, 3600, lease, &rq, &ag);
  CHECK(gn_ledger_begin_lease(l, lease, ag.data, ag.len));
  static const uint8_t util[] = {37, 88, 91, GN_UTIL_UNKNOWN, 90};
  for (int i = 0; i < 5; i++)
    CHECK(gn_ledger_append_tick(l, lease, 1764670001 + i, 1, util[i], NULL));
  CHECK(gn_invoice_seal(l, prov, lease, 1764670006, "released", &inv));
  CHECK(gn_invoice_accept_seal(req, inv.data, inv.len, &acc));
  CHECK(gn_invoice_reject_seal(req, inv.data, inv.len, "second 3 was not observed", &rej));
  char pid[GN_NODE_ID_STRLEN], rid[GN_NODE_ID_STRLEN];
  gn_node_id_format(prov->pk, pid);
  gn_node_id_format(req->pk, rid);
  printf("provider %s (Ed25519 seed 32 x 0x01)\nrequester %s (Ed25519 seed 32 x 0x02)\n", pid, rid);
  struct {
    const char *name;
    gn_buf *b;
  } envs[] = {{"lease_request", &rq},
              {"lease_accept", &ag},
              {"invoice", &inv},
              {"invoice_accept", &acc},
              {"invoice_reject", &rej}};
  for (size_t i = 0; i < GN_ARRAY_SIZE(envs); i++) {
    char *h = hex_of(envs[i].b);
    printf("%s (%zu bytes):\n%s\n", envs[i].name, envs[i].b->len, h);
    free(h);
  }
  json_t *j = NULL;
  CHECK(gn_invoice_export(inv.data, inv.len, acc.data, acc.len, &j));
  char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  printf("export:\n%s\n", text);

  /* Seeds: the fuzz targets' first byte picks what the rest is fed to. */
  snprintf(dir_inv, sizeof(dir_inv), "%s/fuzz_invoice", outdir);
  snprintf(dir_ag, sizeof(dir_ag), "%s/fuzz_agreement", outdir);
  mkdir(outdir, 0755);
  mkdir(dir_inv, 0755);
  mkdir(dir_ag, 0755);
  gn_envelope e;
  write_file(dir_inv, "invoice_env", 0, inv.data, inv.len);
  CHECK(gn_envelope_open(inv.data, inv.len, &e));
  write_file(dir_inv, "invoice_body", 1, e.body, e.body_len);
  write_file(dir_inv, "export_json", 2, text, strlen(text));
  write_file(dir_inv, "accept_env", 3, acc.data, acc.len);
  write_file(dir_inv, "reject_env", 3, rej.data, rej.len);
  write_file(dir_ag, "agreement_env", 0, ag.data, ag.len);
  write_file(dir_ag, "request_env", 1, rq.data, rq.len);
  CHECK(gn_envelope_open(ag.data, ag.len, &e));
  write_file(dir_ag, "agreement_body", 2, e.body, e.body_len);
  CHECK(gn_envelope_open(rq.data, rq.len, &e));
  write_file(dir_ag, "request_body", 3, e.body, e.body_len);
  free(text);
  json_decref(j);
  gn_ledger_free(l);
  sqlite3_close(db);
  gn_buf_done(&rq);
  gn_buf_done(&ag);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
  gn_buf_done(&rej);
  gn_identity_free(prov);
  gn_identity_free(req);
  snprintf(path, sizeof(path), "rm -rf '%s'", tmp);
  return system(path) == 0 ? 0 : 1;
}

static int bench(uint64_t n_committed, uint64_t n_batched) {
  char path[256];
  gn_identity *prov = NULL, *req = NULL;
  gn_buf rq = {0}, ag = {0}, rq2 = {0}, ag2 = {0}, rq3 = {0}, ag3 = {0}, inv = {0};
  gn_ledger *l = NULL;
  double t0, t1;
  /* Benchmark on the current directory's file system (a tmpfs /tmp would
   * make fsync free and the numbers meaningless). */
  const char *base = getenv("GN_BENCH_DIR") ? getenv("GN_BENCH_DIR") : ".";
  snprintf(path, sizeof(path), "%s/gn-billing-bench-XXXXXX", base);
  char *dir = strdup(path);
  if (!dir || !mkdtemp(dir))
    return 1;
  snprintf(path, sizeof(path), "%s/bench.db", dir);
  sqlite3 *db = db_open(path);
  CHECK(gn_ledger_open(db, &l));
  CHECK(gn_identity_generate(&prov));
  CHECK(gn_identity_generate(&req));

  /* 1. Tick append rate. */
  make_agreement(prov, req, 1, GN_INVOICE_MAX_S, NULL, &rq, &ag);
  gn_agreement a;
  CHECK(gn_agreement_open(ag.data, ag.len, &a));
  CHECK(gn_ledger_begin_lease(l, a.terms.lease_id, ag.data, ag.len));
  t0 = now_s();
  for (uint64_t i = 0; i < n_committed; i++)
    CHECK(gn_ledger_append_tick(l, a.terms.lease_id, a.start_s + (int64_t)i, 1, 50, NULL));
  t1 = now_s();
  double committed_rate = (double)n_committed / (t1 - t0);
  make_agreement(prov, req, 1, GN_INVOICE_MAX_S, NULL, &rq2, &ag2);
  gn_agreement a2;
  CHECK(gn_agreement_open(ag2.data, ag2.len, &a2));
  CHECK(gn_ledger_begin_lease(l, a2.terms.lease_id, ag2.data, ag2.len));
  t0 = now_s();
  sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  for (uint64_t i = 0; i < n_batched; i++)
    CHECK(gn__ledger_append(l, a2.terms.lease_id, a2.start_s + (int64_t)i, 1, 50, false, NULL));
  sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  t1 = now_s();
  double batched_rate = (double)n_batched / (t1 - t0);
  /* Group commit: 100 leases, each second's ticks for all of them in one
   * gn_ledger_append_ticks call (one fsync per second of metering). */
  enum { LEASES = 100 };
  gn_buf grq[LEASES], gag[LEASES];
  gn_agreement ga[LEASES];
  gn_tick_append batch[LEASES];
  memset(grq, 0, sizeof(grq));
  memset(gag, 0, sizeof(gag));
  for (int i = 0; i < LEASES; i++) {
    make_agreement(prov, req, 1, GN_INVOICE_MAX_S, NULL, &grq[i], &gag[i]);
    CHECK(gn_agreement_open(gag[i].data, gag[i].len, &ga[i]));
    CHECK(gn_ledger_begin_lease(l, ga[i].terms.lease_id, gag[i].data, gag[i].len));
  }
  uint64_t rounds = n_committed / 10 ? n_committed / 10 : 1;
  t0 = now_s();
  for (uint64_t s = 0; s < rounds; s++) {
    for (int i = 0; i < LEASES; i++)
      batch[i] = (gn_tick_append){ga[i].terms.lease_id, ga[i].start_s + (int64_t)s, 1, 50};
    CHECK(gn_ledger_append_ticks(l, batch, LEASES, NULL));
  }
  t1 = now_s();
  double group_rate = (double)(rounds * LEASES) / (t1 - t0);
  for (int i = 0; i < LEASES; i++) {
    gn_buf_done(&grq[i]);
    gn_buf_done(&gag[i]);
  }
  printf("tick append, one commit per tick (WAL, synchronous=FULL): %8.0f ticks/s  (%" PRIu64 " ticks, %.3f ms/tick)\n",
         committed_rate, n_committed, 1000.0 / committed_rate);
  printf("tick append, one batched transaction (reference):        %8.0f ticks/s  (%" PRIu64 " ticks)\n", batched_rate,
         n_batched);
  printf("tick append, group commit of %d leases per second:       %8.0f ticks/s  (%" PRIu64 " commits)\n", LEASES,
         group_rate, rounds);
  printf("  ratio batched/committed: %.1fx. A lease needs 1 tick/s: one commit per tick keeps up with ~%.0f\n"
         "  leases, group commit (100 leases per commit) with ~%.0f\n",
         batched_rate / committed_rate, committed_rate, group_rate);

  /* 2. A 24-hour invoice: build+sign against check and JSON audit. */
  const uint64_t day = 86400;
  make_agreement(prov, req, 4, day, NULL, &rq3, &ag3);
  gn_agreement a3;
  CHECK(gn_agreement_open(ag3.data, ag3.len, &a3));
  CHECK(gn_ledger_begin_lease(l, a3.terms.lease_id, ag3.data, ag3.len));
  sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  for (uint64_t i = 0; i < day; i++)
    CHECK(gn__ledger_append(l, a3.terms.lease_id, a3.start_s + (int64_t)i, i % 97 ? 4 : 3, (uint8_t)(i % 101), false,
                            NULL));
  sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  t0 = now_s();
  CHECK(gn_invoice_seal(l, prov, a3.terms.lease_id, a3.start_s + (int64_t)day, "expired", &inv));
  t1 = now_s();
  double build_s = t1 - t0;
  gn_invoice_summary s;
  char reason[512];
  t0 = now_s();
  CHECK(gn_invoice_check(inv.data, inv.len, ag3.data, ag3.len, day, 0, &s, reason, sizeof(reason)));
  t1 = now_s();
  double check_s = t1 - t0;
  gn_buf acc = {0};
  CHECK(gn_invoice_accept_seal(req, inv.data, inv.len, &acc));
  json_t *j = NULL;
  t0 = now_s();
  CHECK(gn_invoice_export(inv.data, inv.len, acc.data, acc.len, &j));
  char *text = json_dumps(j, JSON_COMPACT);
  t1 = now_s();
  double export_s = t1 - t0;
  json_decref(j);
  size_t text_len = strlen(text);
  t0 = now_s();
  json_error_t err;
  j = json_loads(text, 0, &err);
  if (!j)
    return 1;
  CHECK(gn_invoice_audit_json(j, &s, reason, sizeof(reason)));
  t1 = now_s();
  double audit_s = t1 - t0;
  json_decref(j);
  free(text);
  printf("24-hour invoice (86400 ticks, 4 GPUs): envelope %zu bytes (%.1f bytes/tick), JSON export %.1f MB\n", inv.len,
         (double)inv.len / (double)day, (double)text_len / 1e6);
  printf("  build+sign from the ledger: %7.1f ms\n", build_s * 1e3);
  printf("  check (gn_invoice_check):   %7.1f ms  (%.2fx build+sign)\n", check_s * 1e3, check_s / build_s);
  printf("  export to JSON text:        %7.1f ms\n", export_s * 1e3);
  printf("  audit of the JSON file:     %7.1f ms  (%.2fx build+sign; parse + every signature, chain link, field)\n",
         audit_s * 1e3, audit_s / build_s);
  printf("  total %" PRIu64 " micro-EUR for %" PRIu64 " seconds\n", s.total_micro, s.seconds);

  gn_buf_done(&acc);
  gn_ledger_free(l);
  sqlite3_close(db);
  gn_buf_done(&rq);
  gn_buf_done(&ag);
  gn_buf_done(&rq2);
  gn_buf_done(&ag2);
  gn_buf_done(&rq3);
  gn_buf_done(&ag3);
  gn_buf_done(&inv);
  gn_identity_free(prov);
  gn_identity_free(req);
  snprintf(path, sizeof(path), "rm -rf '%s'", dir);
  free(dir);
  return system(path) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (sodium_init() < 0)
    return 1;
  if (argc >= 2 && strcmp(argv[1], "examples") == 0)
    return examples(argc >= 3 ? argv[2] : "corpus");
  uint64_t n = argc >= 2 ? strtoull(argv[1], NULL, 10) : 2000;
  uint64_t nb = argc >= 3 ? strtoull(argv[2], NULL, 10) : 100000;
  return bench(n ? n : 2000, nb ? nb : 100000);
}
