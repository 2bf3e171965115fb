/* Billing: money arithmetic, lease agreements, the per-second meter, the
 * hash-chained tick ledger in SQLite, invoices and their audit. */
#ifndef GPUNET_BILLING_H
#define GPUNET_BILLING_H

#include <gpunet/identity.h>
#include <gpunet/wire.h>
#include <sqlite3.h>
#include <stdbool.h>

/* --- money ----------------------------------------------------------------*/

/* Cost of `seconds` seconds at price_uper_hour micro-units per GPU-hour for
 * `gpus` GPUs: floor(price * gpus * seconds / 3600), computed without
 * overflow on the cumulative count (DESIGN.md: money is integers). */
uint64_t gn_price_cost(uint64_t price_uper_hour, uint32_t gpus, uint64_t seconds);
/* "0.40" or "0.4" or "1" (currency units per hour) -> 400000. At most 6
 * decimals; GN_EINVAL on anything else. */
int gn_price_parse(const char *s, uint64_t *ret_uper_hour);
/* 400000 -> "0.400000" (buf of at least 32). */
void gn_price_format(uint64_t micro, char *buf, size_t cap);

/* --- agreements -----------------------------------------------------------*/

#define GN_LEASE_ID_STRLEN 24 /* "l-" + 16 hex + NUL, padded */
#define GN_LEASE_MAX_GPUS 16

typedef struct gn_lease_terms {
  char lease_id[GN_LEASE_ID_STRLEN];
  uint8_t provider[GN_PK_LEN];
  uint8_t requester[GN_PK_LEN];
  char offer_id[24];
  char gpu_model[64];
  uint32_t count;
  uint64_t price_uper_hour;
  char currency[8];
  uint64_t max_s;      /* the lease ends by itself after this many seconds */
  uint32_t interval_s; /* billing interval */
  int64_t requested_s; /* UTC when the requester signed */
  uint8_t nonce[16];
  bool simulated; /* the requester knowingly rents simulated GPUs */
} gn_lease_terms;

typedef struct gn_agreement {
  gn_lease_terms terms;
  int64_t start_s; /* UTC, set by the provider */
  uint32_t gpu_count;
  char gpus[GN_LEASE_MAX_GPUS][64]; /* GPU UUIDs granted */
} gn_agreement;

/* Fresh lease id ("l-" + 16 random hex digits) and nonce. */
void gn_lease_terms_init(gn_lease_terms *t);
/* The requester's signed GN_MSG_LEASE_REQUEST envelope. */
int gn_lease_request_seal(const gn_identity *requester, const gn_lease_terms *t, gn_buf *ret_env);
/* Verifies a request envelope (signature, signer == terms.requester). */
int gn_lease_request_open(const uint8_t *env, size_t len, gn_lease_terms *ret);
/* The provider's GN_MSG_LEASE_ACCEPT envelope embedding the request
 * envelope: this is the agreement both sides signed. */
int gn_agreement_seal(const gn_identity *provider, const uint8_t *request_env, size_t request_len, int64_t start_s,
                      const char *const *gpus, uint32_t gpu_count, gn_buf *ret_env);
/* Verifies both signatures and that the signers are the provider and
 * requester named in the terms. */
int gn_agreement_open(const uint8_t *env, size_t len, gn_agreement *ret);

/* --- meter ----------------------------------------------------------------*/

/* The per-second meter of one lease: no I/O, driven by the caller's
 * monotonic clock. */
typedef struct gn_meter {
  uint64_t start_mono_ms;
  uint64_t ticks_done;
  uint64_t max_s;
} gn_meter;

void gn_meter_start(gn_meter *m, uint64_t now_mono_ms, uint64_t max_s);
/* How many ticks are due at now (each tick is one whole second elapsed,
 * capped at max_s in total). The caller writes them, then calls
 * gn_meter_advance with the number written. */
uint64_t gn_meter_due(const gn_meter *m, uint64_t now_mono_ms);
void gn_meter_advance(gn_meter *m, uint64_t n);
/* Milliseconds until the next tick is due (0 if one is due now). */
uint64_t gn_meter_next_ms(const gn_meter *m, uint64_t now_mono_ms);
bool gn_meter_finished(const gn_meter *m);

/* --- ledger ---------------------------------------------------------------*/

#define GN_UTIL_UNKNOWN 255

typedef struct gn_tick {
  uint64_t idx;    /* 1-based second of the lease */
  int64_t t_s;     /* UTC when the second was metered */
  uint32_t gpus;   /* GPUs billed in this second */
  uint8_t util;    /* GPU utilization percent, GN_UTIL_UNKNOWN if none */
  uint8_t hash[32];
} gn_tick;

typedef struct gn_ledger gn_ledger;

/* Uses (does not own) db, which the caller opened in WAL mode; creates the
 * ledger's tables if missing. */
int gn_ledger_open(sqlite3 *db, gn_ledger **ret);
gn_ledger *gn_ledger_free(gn_ledger *l);
/* Begins a lease's chain; its genesis is BLAKE2b of the agreement envelope. */
int gn_ledger_begin_lease(gn_ledger *l, const char *lease_id, const uint8_t *agreement_env, size_t len);
/* Appends the next tick (idx must be last+1) and commits it before
 * returning: once this returns 0 the second is durable. */
int gn_ledger_append_tick(gn_ledger *l, const char *lease_id, int64_t t_s, uint32_t gpus, uint8_t util,
                          gn_tick *ret_tick);
int gn_ledger_tick_count(gn_ledger *l, const char *lease_id, uint64_t *ret);

/* --- invoices -------------------------------------------------------------*/

/* Builds and signs the provider's GN_MSG_INVOICE for a lease from its ledger
 * ticks. */
int gn_invoice_seal(gn_ledger *l, const gn_identity *provider, const char *lease_id, int64_t end_s,
                    const char *end_reason, gn_buf *ret_env);

typedef struct gn_invoice_summary {
  char lease_id[GN_LEASE_ID_STRLEN];
  char invoice_id[GN_LEASE_ID_STRLEN];
  uint8_t provider[GN_PK_LEN];
  uint8_t requester[GN_PK_LEN];
  char gpu_model[64];
  uint32_t gpus;
  uint64_t price_uper_hour;
  char currency[8];
  uint64_t seconds;
  uint64_t total_micro;
  int64_t start_s, end_s;
  uint8_t chain_head[32];
} gn_invoice_summary;

/* The requester's check of an invoice against its own record: the agreement
 * must be the one it holds (same bytes), signatures, chain, prices and
 * totals must verify, and the billed seconds must not exceed what it observed
 * (observed_s, plus tolerance_s). On failure returns GN_EAUDIT and writes a
 * one-line reason naming the first problem. */
int gn_invoice_check(const uint8_t *invoice_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                     uint64_t observed_s, uint64_t tolerance_s, gn_invoice_summary *ret, char *reason, size_t cap);
/* The requester's countersignature (GN_MSG_INVOICE_ACCEPT) or rejection. */
int gn_invoice_accept_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len, gn_buf *ret_env);
int gn_invoice_reject_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len,
                           const char *reason, gn_buf *ret_env);

/* Invoices kept by a node (table "invoices"), as provider or requester. */
int gn_ledger_store_invoice(gn_ledger *l, const char *lease_id, const char *role, const uint8_t *invoice_env,
                            size_t invoice_len, const uint8_t *accept_env, size_t accept_len, const char *status);

/* Writes the self-contained JSON export (all envelopes in hex plus a
 * readable summary). Returns a jansson json_t* through ret (caller decrefs). */
struct json_t;
int gn_invoice_export(const uint8_t *invoice_env, size_t invoice_len, const uint8_t *accept_env, size_t accept_len,
                      struct json_t **ret_json);
/* Audits an exported invoice with no daemon: every signature, chain link,
 * per-second price and total, and that the readable fields match the signed
 * ones. 0 and a summary when all checks out; GN_EAUDIT and a reason naming the
 * first failure (which second, which field) otherwise; GN_EINVAL if the file
 * is not an invoice export. */
int gn_invoice_audit_json(const struct json_t *doc, gn_invoice_summary *ret, char *reason, size_t cap);

#endif
