/* Billing: money arithmetic, lease agreements, the per-second meter, the
 * hash-chained tick ledger in SQLite, invoices and their audit.
 *
 * The flow (docs/protocol.md (section 2) has the wire details):
 *  requester: gn_lease_terms_init, fill the terms, gn_lease_request_seal;
 *  provider:  gn_lease_request_open, decide, gn_agreement_seal; both sides
 *             keep the agreement envelope bytes;
 *  provider:  gn_ledger_begin_lease, gn_meter_start; on each timer
 *             gn_meter_due -> gn_ledger_append_tick x n -> gn_meter_advance,
 *             then re-arm with gn_meter_next_ms; every interval_s
 *             gn_invoice_seal(..., "interval") (a cumulative debit note);
 *  requester: gn_invoice_check (against its agreement and observed seconds)
 *             and gn_invoice_check_continues (against the last note it
 *             accepted), then gn_invoice_accept_seal or gn_invoice_reject_seal;
 *  provider:  gn_invoice_response_open; both: gn_ledger_store_invoice;
 *  at the end the same with the final invoice; gn_invoice_export writes the
 *  JSON that gn_invoice_audit_json (`gpunet invoice audit`) verifies alone. */
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
/* Verifies a request envelope (signature, signer == terms.requester) and the
 * terms: lease_id 1..23 of [A-Za-z0-9._-], count 1..GN_LEASE_MAX_GPUS,
 * currency 1..7 of [A-Z], gpu_model non-empty, 1 <= max_s <=
 * GN_INVOICE_MAX_S. */
int gn_lease_request_open(const uint8_t *env, size_t len, gn_lease_terms *ret);
/* The provider's GN_MSG_LEASE_ACCEPT envelope embedding the request
 * envelope: this is the agreement both sides signed. The provider must be
 * the one named in the request (GN_EPERM) and grant exactly terms.count GPUs
 * (ids of 1..63 printable bytes); 0 <= start_s <= 2^40. */
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
void gn_meter_advance(gn_meter *m, uint64_t n); /* never counts past max_s */
/* Milliseconds until the next tick is due (0 if one is due now; UINT64_MAX
 * once finished: no timer is needed). */
uint64_t gn_meter_next_ms(const gn_meter *m, uint64_t now_mono_ms);
bool gn_meter_finished(const gn_meter *m);

/* --- ledger ---------------------------------------------------------------*/

#define GN_UTIL_UNKNOWN 255

typedef struct gn_tick {
  uint64_t idx;  /* 1-based second of the lease */
  int64_t t_s;   /* UTC when the second was metered */
  uint32_t gpus; /* GPUs billed in this second */
  uint8_t util;  /* GPU utilization percent, GN_UTIL_UNKNOWN if none */
  uint8_t hash[32];
} gn_tick;

typedef struct gn_ledger gn_ledger;

/* Uses (does not own) db, which the caller opened in WAL mode; creates the
 * ledger's tables if missing. The connection must have PRAGMA
 * synchronous=FULL (or EXTRA): every tick is reported durable once its commit
 * returns, which WAL only guarantees when each commit is fsynced. Returns
 * GN_EINVAL on a connection with a weaker setting (it does not change the
 * caller's pragmas). */
int gn_ledger_open(sqlite3 *db, gn_ledger **ret);
/* Finalizes the ledger's prepared statements: call it before sqlite3_close. */
gn_ledger *gn_ledger_free(gn_ledger *l);
/* Begins a lease's chain; its genesis is BLAKE2b of the agreement envelope. */
int gn_ledger_begin_lease(gn_ledger *l, const char *lease_id, const uint8_t *agreement_env, size_t len);
/* Appends the next tick (idx must be last+1) and commits it before
 * returning: once this returns 0 the second is durable. The lease must have
 * been begun. gpus must not exceed the agreement's count (GN_EINVAL), util is
 * 0..100 or GN_UTIL_UNKNOWN; GN_ETOOBIG once max_s ticks exist. A t_s
 * earlier than the previous tick's (wall clock stepped back) is recorded as
 * the previous tick's t_s; ret_tick shows what was stored. GN_ESTATE if the
 * connection is inside a transaction (the commit would not be ours), GN_EBUSY
 * if another connection holds the write lock (the caller's busy_timeout
 * applies first). */
int gn_ledger_append_tick(gn_ledger *l, const char *lease_id, int64_t t_s, uint32_t gpus, uint8_t util,
                          gn_tick *ret_tick);
/* One tick to append with gn_ledger_append_ticks. */
typedef struct gn_tick_append {
  const char *lease_id;
  int64_t t_s;
  uint32_t gpus;
  uint8_t util;
} gn_tick_append;

/* Group commit: appends n ticks (of any leases, several of the same lease in
 * order) in one transaction, committed before it returns. All or nothing: on
 * any error none is appended and the error of the first bad one is returned.
 * For a node metering many leases, or catching up several due seconds, one
 * fsync per timer instead of one per tick; a crash still loses only the
 * batch being written, which is the current second. ret_ticks (NULL, or n
 * entries) receives what was stored. */
int gn_ledger_append_ticks(gn_ledger *l, const gn_tick_append *ticks, size_t n, gn_tick *ret_ticks);
/* GN_ENOTFOUND for a lease never begun. */
int gn_ledger_tick_count(gn_ledger *l, const char *lease_id, uint64_t *ret);
/* The last tick of a lease (for a restarted node resuming its meter);
 * GN_ENOTFOUND if the lease is unknown or has no tick yet. */
int gn_ledger_last_tick(gn_ledger *l, const char *lease_id, gn_tick *ret);
/* Appends the agreement envelope the lease was begun with to ret_env. */
int gn_ledger_agreement(gn_ledger *l, const char *lease_id, gn_buf *ret_env);
/* Calls fn for every tick of a lease in order, re-verifying the stored hash
 * chain from the genesis as it goes. GN_EAUDIT with a reason ("second 17 is
 * missing", "second 17: hash chain broken ...") if the stored rows do not
 * form the chain; a negative return from fn stops the walk and is returned. */
int gn_ledger_each_tick(gn_ledger *l, const char *lease_id, int (*fn)(const gn_tick *t, void *arg), void *arg,
                        char *reason, size_t cap);
/* gn_ledger_each_tick without a callback: 0 if the lease's chain is intact. */
int gn_ledger_verify_chain(gn_ledger *l, const char *lease_id, char *reason, size_t cap);

/* --- invoices -------------------------------------------------------------*/

/* An invoice carries at most 7 days of ticks, and a lease's max_s may not
 * exceed it (the final invoice covers the whole lease). */
#define GN_INVOICE_MAX_S 604800u

/* Builds and signs the provider's GN_MSG_INVOICE for a lease from its ledger
 * ticks: cumulative from second 1, so the same call also makes the interval
 * debit notes (end_reason "interval"). The provider must be the agreement's
 * (GN_EPERM); the stored chain is re-verified first (GN_EAUDIT if broken).
 * end_s earlier than the last tick is raised to it. end_reason: at most 63
 * bytes, e.g. "released", "expired", "interval", "job-exited". */
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
  /* Set by gn_invoice_audit_json and the ledger's records: the requester's
   * countersignature is present and verifies. */
  bool countersigned;
  int64_t accepted_s;
} gn_invoice_summary;

/* Decodes a stored or received invoice for display: verifies the invoice
 * signature and the agreement's, but not the tick chain (use
 * gn_invoice_check for that). */
int gn_invoice_summarize(const uint8_t *invoice_env, size_t len, gn_invoice_summary *ret);

/* The requester's check of an invoice against its own record: the agreement
 * must be the one it holds (same bytes), signatures, chain, prices and
 * totals must verify, and the billed seconds must not exceed what it observed
 * (observed_s, plus tolerance_s). On failure returns GN_EAUDIT and writes a
 * one-line reason naming the first problem. */
int gn_invoice_check(const uint8_t *invoice_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                     uint64_t observed_s, uint64_t tolerance_s, gn_invoice_summary *ret, char *reason, size_t cap);
/* The requester's check that a new cumulative invoice (a later debit note or
 * the final invoice) continues one it accepted earlier: both must verify, be
 * for the same agreement, and the new one must bill the same seconds 1..n of
 * the earlier one unchanged (so its chain passes through the earlier
 * chain_head). This is what stops a provider from rewriting history that was
 * already countersigned, even with a self-consistent re-hashed chain.
 * GN_EAUDIT and a reason ("second 3 differs from the invoice accepted
 * earlier") otherwise. */
int gn_invoice_check_continues(const uint8_t *invoice_env, size_t len, const uint8_t *earlier_env, size_t earlier_len,
                               char *reason, size_t cap);

/* The requester's countersignature (GN_MSG_INVOICE_ACCEPT) or rejection
 * (GN_MSG_INVOICE_REJECT, reason at most 255 bytes). Accepting verifies the
 * invoice fully first (GN_EAUDIT if it does not verify); both return
 * GN_EPERM if requester is not the agreement's requester. */
int gn_invoice_accept_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len, gn_buf *ret_env);
int gn_invoice_reject_seal(const gn_identity *requester, const uint8_t *invoice_env, size_t len, const char *reason,
                           gn_buf *ret_env);

typedef struct gn_invoice_response {
  bool accepted; /* GN_MSG_INVOICE_ACCEPT; false for GN_MSG_INVOICE_REJECT */
  char lease_id[GN_LEASE_ID_STRLEN];
  uint8_t invoice_hash[32];
  int64_t at_s;     /* accepted_s (0 for a rejection) */
  char reason[256]; /* the rejection's reason ("" for an acceptance) */
} gn_invoice_response;

/* The provider's check of an accept or reject envelope for invoice_env:
 * GN_ESIG if its signature fails, GN_EPERM if not signed by the agreement's
 * requester, GN_EDIGEST if it names another invoice, GN_EINVAL if malformed. */
int gn_invoice_response_open(const uint8_t *env, size_t len, const uint8_t *invoice_env, size_t invoice_len,
                             gn_invoice_response *ret);

/* Invoices kept by a node (table "invoices"), as provider or requester: one
 * row per (lease_id, role), so storing again replaces it (a newer cumulative
 * debit note, the final invoice, or the same invoice with its acceptance and
 * a new status). role is "provider" or "requester"; status a short lowercase
 * word ("issued", "accepted", "rejected", "disputed"; at most 15 bytes);
 * accept_env (NULL/0 for none) is the requester's accept or reject envelope.
 * The invoice must verify (gn_invoice_summarize) and be for lease_id, and the
 * response must verify against it (gn_invoice_response_open). */
int gn_ledger_store_invoice(gn_ledger *l, const char *lease_id, const char *role, const uint8_t *invoice_env,
                            size_t invoice_len, const uint8_t *accept_env, size_t accept_len, const char *status);

typedef struct gn_invoice_record {
  char lease_id[GN_LEASE_ID_STRLEN];
  char invoice_id[GN_LEASE_ID_STRLEN]; /* "i-" + 16 hex of BLAKE2b(invoice) */
  char role[16];
  char status[16];
  int64_t created_s, updated_s;
  gn_invoice_summary summary; /* countersigned says if accept holds an acceptance */
  gn_buf invoice;             /* the signed invoice envelope */
  gn_buf accept;              /* the accept or reject envelope, len 0 if none */
} gn_invoice_record;

void gn_invoice_record_done(gn_invoice_record *r);
gn_invoice_record *gn_invoice_records_free(gn_invoice_record *recs, size_t n);
/* Finds an invoice by lease id or invoice id; role NULL for either (the
 * provider's row first when a node holds both). GN_ENOTFOUND if none. */
int gn_ledger_get_invoice(gn_ledger *l, const char *id, const char *role, gn_invoice_record *ret);
/* All invoices (role NULL) or one role's, oldest first; *ret is NULL when
 * there are none. Free with gn_invoice_records_free. */
int gn_ledger_list_invoices(gn_ledger *l, const char *role, gn_invoice_record **ret, size_t *ret_n);

/* Writes the self-contained JSON export (all envelopes in hex plus a
 * readable summary). Returns a jansson json_t* through ret (caller decrefs).
 * The invoice must verify (GN_EAUDIT otherwise); accept_env (NULL/0 for
 * none) must be the requester's acceptance of it. */
struct json_t;
int gn_invoice_export(const uint8_t *invoice_env, size_t invoice_len, const uint8_t *accept_env, size_t accept_len,
                      struct json_t **ret_json);
/* Audits an exported invoice with no daemon: every signature, chain link,
 * per-second price and total, and that the readable fields match the signed
 * ones. 0 and a summary when all checks out; GN_EAUDIT and a reason naming the
 * first failure (which second, which field) otherwise; GN_EINVAL if the file
 * is not an invoice export. On success reason holds "" when the requester's
 * countersignature verifies, or a note that the invoice is not countersigned
 * ("signed by the provider only: ..."; summary.countersigned is false). */
int gn_invoice_audit_json(const struct json_t *doc, gn_invoice_summary *ret, char *reason, size_t cap);

#endif
