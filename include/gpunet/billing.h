/* Billing: money arithmetic, lease agreements, the per-second meter, the
 * hash-chained tick ledger in SQLite, debit notes, final invoices, their
 * answers (the payment vouchers), and the export and its audit.
 *
 * The flow (notes/billing2.md, docs/protocol.md section 2 for the wire):
 *  requester: gn_lease_terms_init, fill the terms, gn_lease_request_seal;
 *  provider:  gn_lease_request_open, decide, gn_agreement_seal; both sides
 *             keep the agreement envelope bytes;
 *  provider:  gn_ledger_begin_lease, gn_meter_start; on each timer
 *             gn_meter_due -> gn_ledger_append_ticks -> gn_meter_advance;
 *  then the lease machines (include/gpunet/lease.h) drive the "Billing v2"
 *  functions below: every interval_s a debit note from gn_ledger_ticks,
 *  checked and answered by the requester, and at the end the final invoice
 *  continuing the last accepted note; both sides keep what they sent and got
 *  (gn_ledger_store_note / _response) and gn_ledger_export writes the file
 *  that gn_invoice_audit_json (`gpunet invoice audit`) verifies alone.
 *  What remains from before the debit notes reads a final invoice that
 *  continues no note, in the same v2 format: gn_invoice_summarize,
 *  gn_invoice_check, gn_invoice_response_open, the invoices table of older
 *  nodes (gn_ledger_get_invoice / _list_invoices) and gn_invoice_export. */
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
/* The same rule for billing: GN_ETOOBIG when the cost does not fit 64 bits
 * (gn_price_cost saturates at UINT64_MAX, which is only fit for display;
 * every bill, check and audit uses this one). */
int gn_price_cost_checked(uint64_t price_uper_hour, uint32_t gpus, uint64_t seconds, uint64_t *ret_micro);
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

/* --- energy (billing/energy.c) --------------------------------------------*/

/* The energy a lease's GPUs used, integrated once a second from their power
 * readings (NVML, milliwatts) on the caller's monotonic clock. Each sample
 * counts the time since the previous one at the power read now (NVML's
 * reading is itself an average over about the last second), at most
 * GN_ENERGY_CAP_MS of it: a late timer or a stopped process never turns
 * one reading into minutes of energy; the rest of a gap, and every interval
 * without a reading of every GPU, is counted as unmeasured. No I/O. */
#define GN_ENERGY_CAP_MS 2000u
/* Most power one GPU is taken to draw when judging a claim (a 1000 W
 * accelerator with room to spare). */
#define GN_ENERGY_MAX_GPU_W 2000u

typedef struct gn_energy {
  uint64_t uj;            /* microjoules integrated (mW x ms) */
  uint64_t measured_ms;   /* time counted with a reading of every GPU */
  uint64_t unmeasured_ms; /* time without one, and gaps past the cap */
  uint64_t last_ms;       /* monotonic time of the previous sample */
  bool started;
} gn_energy;

/* Starts (or, after a restart, resumes with the totals in e kept) at now:
 * the time before now is never counted. */
void gn_energy_start(gn_energy *e, uint64_t now_mono_ms);
/* One sample: have says whether every GPU of the lease gave a reading and
 * power_mw is their sum. Saturates instead of overflowing. */
void gn_energy_sample(gn_energy *e, uint64_t now_mono_ms, bool have, uint64_t power_mw);
/* Whole millijoules and whole seconds measured. */
uint64_t gn_energy_mj(const gn_energy *e);
uint64_t gn_energy_measured_s(const gn_energy *e);

/* What a final invoice states about energy (docs/protocol.md 2.9): present
 * only when at least one second was measured, never 0 for "unknown". */
typedef struct gn_bill_energy {
  bool present;
  uint64_t mj;         /* energy_mj */
  uint64_t measured_s; /* energy_measured_s, >= 1 when present */
} gn_bill_energy;
/* The claim of e: present iff it measured at least one whole second. */
gn_bill_energy gn_energy_claim(const gn_energy *e);
/* Whether a claim is physically possible for a lease of gpus GPUs whose
 * invoice window is window_s: measured_s <= window_s plus the tolerance of
 * GN_BILL_TOLERANCE_S, and mj <= gpus * GN_ENERGY_MAX_GPU_W * (measured_s +
 * 1) * 1000 (128-bit arithmetic: any uint64 values). A requester cannot
 * measure a provider's power, so an implausible claim does not make an
 * invoice invalid: it is shown as implausible. An absent claim is
 * plausible. */
bool gn_energy_plausible(uint32_t gpus, uint64_t window_s, const gn_bill_energy *claim);

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
/* One tick to append with gn_ledger_append_ticks. */
typedef struct gn_tick_append {
  const char *lease_id;
  int64_t t_s;
  uint32_t gpus;
  uint8_t util;
} gn_tick_append;

/* Group commit: appends n ticks (of any leases, several of the same lease in
 * order) in one transaction, committed before it returns: once this returns
 * 0 they are durable. All or nothing: on any error none is appended and the
 * error of the first bad one is returned. For a node metering many leases,
 * or catching up several due seconds, one fsync per timer instead of one per
 * tick; a crash still loses only the batch being written, which is the
 * current second. Each tick is the next second of its lease (begun first:
 * GN_ENOTFOUND); gpus must not exceed the agreement's count (GN_EINVAL),
 * util is 0..100 or GN_UTIL_UNKNOWN; GN_ETOOBIG once max_s ticks exist. A
 * t_s earlier than the previous tick's (wall clock stepped back) is recorded
 * as the previous tick's t_s. GN_ESTATE if the connection is inside a
 * transaction (the commit would not be ours), GN_EBUSY if another connection
 * holds the write lock (the caller's busy_timeout applies first). ret_ticks
 * (NULL, or n entries) receives what was stored. */
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

/* The longest lease (max_s): 40 days. With 2 bytes per second even a final
 * invoice that carries every second from 1 (no debit note was ever
 * accepted) is 6.9 MB, under GN_MSG_MAX; with debit notes each message
 * carries only the seconds since the last accepted note. */
#define GN_INVOICE_MAX_S 3456000u

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
  /* The invoice's optional energy claim and whether it is plausible
   * (gn_energy_plausible); energy.present is false when it has none. */
  gn_bill_energy energy;
  bool energy_plausible;
} gn_invoice_summary;

/* Decodes a stored or received invoice for display: verifies the invoice
 * signature and the agreement's, but not the tick chain (use
 * gn_invoice_check for that). */
int gn_invoice_summarize(const uint8_t *invoice_env, size_t len, gn_invoice_summary *ret);

/* The requester's check of a final invoice that continues no debit note
 * (seq 0, from 1: gn_bill_invoice_check at the genesis head, with the
 * display summary): the agreement must be the one it holds (same bytes),
 * signatures, chain, prices and totals must verify, and the billed seconds
 * must not exceed what it observed (observed_s, plus tolerance_s). On
 * failure returns GN_EAUDIT and writes a one-line reason naming the first
 * problem. */
int gn_invoice_check(const uint8_t *invoice_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                     uint64_t observed_s, uint64_t tolerance_s, gn_invoice_summary *ret, char *reason, size_t cap);

/* An opened answer to such an invoice (gn_invoice_response_open). */
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
 * there are none. Rows of the pre-v2 format (which no longer decode) are
 * left out. Free with gn_invoice_records_free. */
int gn_ledger_list_invoices(gn_ledger *l, const char *role, gn_invoice_record **ret, size_t *ret_n);

/* OLD API (until node/ moves to gn_ledger_export): the gpunet-invoice/2
 * export of a final invoice with no debit notes. accept_env (NULL/0 for
 * none) is the requester's acceptance OR rejection of it: a rejection is
 * exported (and audits as rejected). GN_EAUDIT if the invoice or the
 * response does not verify. Caller decrefs *ret_json. */
struct json_t;
int gn_invoice_export(const uint8_t *invoice_env, size_t invoice_len, const uint8_t *accept_env, size_t accept_len,
                      struct json_t **ret_json);

/* === Billing v2 (notes/billing2.md): pure functions on byte arrays =======
 *
 * No SQLite, no clock, no I/O: the lease state machines (billing/lease_*.c)
 * call these with the envelopes they hold and the time they are given.
 *
 * Ticks carry their own time: tick i of a lease IS lease second i. The tick
 * hash v2 is BLAKE2b-256("gpunet-tick-v2\0" || prev(32) || lease_id ||
 * u64be idx || u32be gpus || u8 util), genesis = BLAKE2b-256(agreement
 * envelope). In messages and exports ticks travel as the compact record
 * GN_BILL_TICK_LEN = 2 bytes per second: u8 gpus, u8 util (0..100 or
 * GN_UTIL_UNKNOWN); second from+k at offset 2k.
 *
 * Flow of one lease:
 *   both:      gn_bill_head_init(agreement) -> head (seq 0, chain = genesis)
 *   provider:  gn_bill_note_seal(head, ticks since head) -> DEBIT_NOTE + next
 *   requester: gn_bill_note_check(note, agreement, head, observed...) -> next
 *              (or GN_EAUDIT + reason -> gn_bill_note_reject_seal; or
 *              GN_ESTATE for a stale note -> re-send gn_bill_note_accept_seal
 *              of its head, which is deterministic);
 *              gn_bill_note_accept_seal(next) -> DEBIT_ACCEPT (= voucher)
 *   provider:  gn_bill_response_open(answer, agreement) -> which note,
 *              accepted or not; on acceptance head = that note's next head
 *   end:       the same with gn_bill_invoice_seal / _check /
 *              _accept_seal (final voucher) / _reject_seal.
 * All arithmetic is checked: an overflow is an error (GN_EAUDIT for what a
 * peer sent, GN_EINVAL for what the caller passed), never a saturated value. */

#define GN_BILL_TICK_LEN 2
/* A lease second is billed only if the requester observed it, within
 * gn_bill_tolerance_s(observed_s) = GN_BILL_TOLERANCE_S + observed_s / 1000:
 * 5 s for message latency and the two clocks' phase, plus 1 ms per second
 * (0.1 %) for the drift between the provider's and the requester's monotonic
 * clocks over a long lease. docs/protocol.md states the same rule. */
#define GN_BILL_TOLERANCE_S 5u
uint64_t gn_bill_tolerance_s(uint64_t observed_s);
/* Most seconds one debit note or final invoice may carry (the seconds since
 * the last accepted note): keeps every message far under GN_MSG_MAX. */
#define GN_BILL_MAX_TICKS GN_INVOICE_MAX_S

/* The state of a lease's bill after the last ACCEPTED note (both sides keep
 * one; the requester persists it). A plain value: copy it freely;
 * gn_bill_head_encode/decode give a fixed GN_BILL_HEAD_LEN-byte form. */
typedef struct gn_bill_head {
  uint64_t seq;           /* seq of the last accepted note, 0 = none yet */
  uint8_t note_hash[32];  /* its hash (BLAKE2b-256 of its envelope), zeros if none;
                           * after an invoice: the invoice's hash */
  uint64_t seconds;       /* cumulative seconds billed */
  uint64_t gpu_seconds;   /* cumulative sum of the ticks' gpus */
  uint64_t total_micro;   /* = gn_price_cost(price, 1, gpu_seconds) */
  uint8_t chain_head[32]; /* tick chain after second `seconds` (genesis at 0) */
} gn_bill_head;

#define GN_BILL_HEAD_LEN 96
/* Head for a fresh lease: seq 0, zeros, chain_head = genesis. Verifies the
 * agreement (GN_ESIG/GN_EINVAL...). */
int gn_bill_head_init(const uint8_t *agreement_env, size_t agreement_len, gn_bill_head *ret);
void gn_bill_head_encode(const gn_bill_head *h, uint8_t out[GN_BILL_HEAD_LEN]);
int gn_bill_head_decode(const uint8_t *p, size_t len, gn_bill_head *ret); /* GN_EINVAL if len is wrong */
/* BLAKE2b-256 of an envelope (a note's, an invoice's, an agreement's hash). */
void gn_bill_hash(const uint8_t *env, size_t len, uint8_t ret_hash[32]);

/* What a verified DEBIT_NOTE or final INVOICE says. */
typedef struct gn_bill_note {
  bool final; /* GN_MSG_INVOICE (true) or GN_MSG_DEBIT_NOTE */
  char lease_id[GN_LEASE_ID_STRLEN];
  uint8_t hash[32];                           /* BLAKE2b-256 of the whole envelope */
  uint64_t seq;                               /* note: its seq; invoice: the seq of the note it continues */
  uint8_t prev[32];                           /* hash of the accepted note it continues (zeros: none) */
  uint64_t from;                              /* first second carried */
  uint64_t n;                                 /* seconds carried (ticks / GN_BILL_TICK_LEN) */
  uint64_t seconds, gpu_seconds, total_micro; /* cumulative from second 1 */
  uint8_t chain_head[32];
  int64_t issued_s;       /* note only: provider's UTC, information */
  int64_t start_s, end_s; /* invoice only */
  char end_reason[64];    /* invoice only */
  gn_bill_energy energy;  /* invoice only: its energy claim, if any */
} gn_bill_note;

/* Provider: seals the DEBIT_NOTE continuing `head` with the n seconds
 * head->seconds+1 .. head->seconds+n (ticks: n * GN_BILL_TICK_LEN bytes).
 * ret_next is the head the requester reaches by accepting it (seq+1, this
 * note's hash, totals). GN_EPERM if provider is not the agreement's, GN_EINVAL
 * for a bad tick (gpus above the lease's count, util not a percentage), n = 0
 * or n > GN_BILL_MAX_TICKS, seconds beyond max_s, or an overflow. */
int gn_bill_note_seal(const gn_identity *provider, const uint8_t *agreement_env, size_t agreement_len,
                      const gn_bill_head *head, const uint8_t *ticks, uint64_t n, int64_t issued_s, gn_buf *ret_env,
                      gn_bill_head *ret_next);
/* Requester: checks a DEBIT_NOTE against the agreement it holds (byte for
 * byte, via agreement_hash) and its head: signed by the agreement's
 * provider; seq == head->seq + 1, prev == head->note_hash, from ==
 * head->seconds + 1; every tick valid; chain recomputed from
 * head->chain_head; gpu_seconds/total exact; seconds <= max_s; seconds <=
 * observed_s + tolerance_s; total_micro <= max_spend_micro (0 = no cap;
 * "spending cap ..."). 0 and ret_next (and ret_note, may be NULL) if it is to
 * be accepted. GN_ESTATE (reason says so) for a well-signed note of this
 * lease with seq <= head->seq: the provider missed our acceptance; re-send
 * gn_bill_note_accept_seal(head) instead of rejecting. GN_EAUDIT and a
 * one-line reason for anything else. */
int gn_bill_note_check(const uint8_t *note_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                       const gn_bill_head *head, uint64_t observed_s, uint64_t tolerance_s, uint64_t max_spend_micro,
                       gn_bill_head *ret_next, gn_bill_note *ret_note, char *reason, size_t cap);
/* Requester: DEBIT_ACCEPT of the note that led to `accepted` (the head
 * gn_bill_note_check returned): lease_id, note_hash, seq, seconds,
 * total_micro, currency, provider. It is the countersignature and the
 * cumulative voucher. Deterministic (same head -> same bytes). GN_EPERM if
 * requester is not the agreement's; GN_EINVAL if accepted->seq is 0. */
int gn_bill_note_accept_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                             const gn_bill_head *accepted, gn_buf *ret_env);
/* Requester: DEBIT_REJECT naming the note (its hash; seq if it decodes, else
 * 0); reason 1..255 printable bytes (longer is cut). Works for a note whose
 * signature or body is broken. */
int gn_bill_note_reject_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                             const uint8_t *note_env, size_t note_len, const char *reason, gn_buf *ret_env);

/* Provider: seals the final INVOICE continuing `head` (prev = head->note_hash,
 * seq = head->seq, from = head->seconds + 1) with the n (may be 0) seconds
 * since, embedding the whole agreement. end_s >= the agreement's start_s and
 * the billed seconds must fit the window end_s - start_s (GN_EINVAL);
 * end_reason 1..63 printable bytes ("released", "expired", "unpaid"...).
 * ret_next: the final head (note_hash = the invoice's hash, seq unchanged). */
int gn_bill_invoice_seal(const gn_identity *provider, const uint8_t *agreement_env, size_t agreement_len,
                         const gn_bill_head *head, const uint8_t *ticks, uint64_t n, int64_t end_s,
                         const char *end_reason, gn_buf *ret_env, gn_bill_head *ret_next);
/* The same with an energy claim (NULL or !present: the invoice has none;
 * present needs measured_s >= 1, GN_EINVAL otherwise). */
int gn_bill_invoice_seal_energy(const gn_identity *provider, const uint8_t *agreement_env, size_t agreement_len,
                                const gn_bill_head *head, const uint8_t *ticks, uint64_t n, int64_t end_s,
                                const char *end_reason, const gn_bill_energy *energy, gn_buf *ret_env,
                                gn_bill_head *ret_next);
/* Requester: gn_bill_note_check for a final invoice (same rules, plus: the
 * embedded agreement is the one held byte for byte, start_s is the
 * agreement's, seconds <= end_s - start_s). Never GN_ESTATE: a final invoice
 * that does not continue the head is rejected. The caller countersigns at
 * most one final invoice per lease. */
int gn_bill_invoice_check(const uint8_t *invoice_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                          const gn_bill_head *head, uint64_t observed_s, uint64_t tolerance_s, uint64_t max_spend_micro,
                          gn_bill_head *ret_next, gn_bill_note *ret_note, char *reason, size_t cap);
/* Requester: INVOICE_ACCEPT (the final voucher): lease_id, invoice_hash
 * (= final->note_hash), accepted_s, seconds, total_micro, currency. */
int gn_bill_invoice_accept_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                                const gn_bill_head *final, int64_t accepted_s, gn_buf *ret_env);
/* Requester: INVOICE_REJECT (lease_id, invoice_hash, reason). */
int gn_bill_invoice_reject_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                                const uint8_t *invoice_env, size_t invoice_len, const char *reason, gn_buf *ret_env);

/* An opened DEBIT_ACCEPT / DEBIT_REJECT / INVOICE_ACCEPT / INVOICE_REJECT. */
typedef struct gn_bill_response {
  uint32_t type; /* GN_MSG_DEBIT_ACCEPT ... GN_MSG_INVOICE_REJECT */
  bool accepted; /* *_ACCEPT */
  bool final;    /* INVOICE_* */
  char lease_id[GN_LEASE_ID_STRLEN];
  uint8_t hash[32];              /* note_hash or invoice_hash it answers */
  uint64_t seq;                  /* DEBIT_*: the note's seq (0 if a reject could not read it) */
  uint64_t seconds, total_micro; /* *_ACCEPT: what the voucher covers */
  int64_t accepted_s;            /* INVOICE_ACCEPT */
  char reason[256];              /* *_REJECT */
} gn_bill_response;

/* Provider (and the audit): opens a response and verifies it is signed by the
 * agreement's requester (GN_ESIG / GN_EPERM), for this lease (GN_EINVAL), and
 * a DEBIT_ACCEPT names this provider and the agreement's currency
 * (GN_EINVAL). The caller matches ret->hash against the notes it issued (or
 * use gn_bill_response_matches). */
int gn_bill_response_open(const uint8_t *env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                          gn_bill_response *ret);
/* 0 if an opened response answers exactly this note/invoice: its hash, and
 * for an acceptance its seq, seconds and total; GN_EDIGEST otherwise. */
int gn_bill_response_matches(const gn_bill_response *resp, const gn_bill_note *note);
/* Decodes and verifies a note or invoice the provider sealed itself (or for
 * display): signature, agreement hash/bytes, ticks, chain from `head` and
 * totals, but not the requester's limits. Same as the checks above with no
 * observation or spending limit, ignoring nothing else. */
int gn_bill_note_open(const uint8_t *env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                      const gn_bill_head *head, gn_bill_head *ret_next, gn_bill_note *ret_note, char *reason,
                      size_t cap);

/* --- ledger v2 ----------------------------------------------------------- */

/* Reads seconds from .. from+n-1 of a lease as compact ticks (n *
 * GN_BILL_TICK_LEN bytes into ret_ticks), re-verifying each row's stored
 * hash against the chain from the stored hash of second from-1 (the genesis
 * for from = 1). GN_ENOTFOUND for an unknown lease, GN_EINVAL if fewer than
 * from+n-1 seconds exist, GN_EAUDIT if a row does not link. ret_chain_head
 * (may be NULL) receives the hash after second from+n-1. */
int gn_ledger_ticks(gn_ledger *l, const char *lease_id, uint64_t from, uint64_t n, uint8_t *ret_ticks,
                    uint8_t ret_chain_head[32]);

/* Notes, invoices and answers kept per lease and role (table bill_msgs:
 * lease_id, role, hash, kind, seq, envelope, response, created_s,
 * updated_s; one row per note or invoice). role is "provider" or
 * "requester". Storing a message already kept is a no-op (0); a response
 * is attached to the row whose hash it names (GN_ENOTFOUND if none), and
 * replaces an earlier one only if that was not an acceptance (an accepted
 * note stays accepted). Both verify what they store against the lease's
 * agreement (gn_ledger_begin_lease first on the requester side too). */
int gn_ledger_store_note(gn_ledger *l, const char *lease_id, const char *role, const uint8_t *env, size_t len);
int gn_ledger_store_response(gn_ledger *l, const char *lease_id, const char *role, const uint8_t *resp_env,
                             size_t resp_len);
/* The export of a lease as one side holds it (format gpunet-invoice/2, below),
 * from the agreement, the notes and their responses, and the final invoice
 * and its response (from bill_msgs, or the older invoices table). For the
 * daemon's control route: it only calls this. GN_ENOTFOUND if the lease has
 * no agreement in the ledger. */
struct json_t;
int gn_ledger_export(gn_ledger *l, const char *lease_id, const char *role, struct json_t **ret_json);

/* --- export and audit (gpunet-invoice/2) ---------------------------------- */

/* {"format":"gpunet-invoice/2", "agreement": b64, "notes": [{"note": b64,
 * "response": b64|null}...], "invoice": b64|null, "response": b64|null,
 * "summary": {...}} (base64: sodium's original variant, with padding).
 * Builds it from envelopes; notes in any order (the export sorts by seq).
 * It must audit (gn_invoice_audit_json, the default linked audit) to a
 * verdict other than invalid (GN_EAUDIT otherwise). */
int gn_bill_export(const uint8_t *agreement_env, size_t agreement_len, const gn_buf *notes,
                   const gn_buf *note_responses, size_t n_notes, const uint8_t *invoice_env, size_t invoice_len,
                   const uint8_t *response_env, size_t response_len, struct json_t **ret_json);

typedef enum gn_bill_verdict {
  GN_BILL_COUNTERSIGNED = 0, /* final invoice countersigned, all verifies: exit 0 */
  GN_BILL_PROVIDER_ONLY = 3, /* no final invoice, or not countersigned: exit 3 */
  GN_BILL_REJECTED = 4,      /* the requester rejected the final invoice: exit 4 */
  GN_BILL_INVALID = 1,       /* does not verify: exit 1 */
} gn_bill_verdict;

typedef struct gn_bill_audit {
  gn_bill_verdict verdict;
  char reason[512];           /* why (INVALID, REJECTED, PROVIDER_ONLY); "" when countersigned */
  gn_invoice_summary summary; /* parties, price, seconds/total billed (the invoice's, or the last note's) */
  bool has_invoice;
  uint64_t notes, notes_accepted;
  uint64_t voucher_seconds; /* what the requester's vouchers cover */
  uint64_t voucher_total_micro;
  char end_reason[64];
} gn_bill_audit;

/* Audits an export with no daemon (what `gpunet invoice audit` runs): the
 * tick chain of every second (accepted notes' ticks then the invoice's),
 * totals with checked arithmetic, the window (seconds <= max_s and <=
 * end_s - start_s), that "summary" says what the signed data says, and the
 * signatures that bind the bill. By default (linked) the accepted notes
 * before the last accepted one, and their vouchers, are checked by their
 * hash links instead of one signature at a time: each accepted note's bytes,
 * signature included, are hashed into the next one's prev, up to the last
 * note and the final invoice whose signatures are checked, as are the
 * requester's cumulative voucher and countersignature over them. A changed
 * superseded note breaks the links, and a superseded voucher is covered by
 * the later cumulative ones: every second is bound to checked signatures of
 * both parties, and a forged superseded signature cannot change a second, a
 * total or the verdict; unanswered and rejected notes and their
 * answers are checked one by one. A 30-day lease with a note a minute has
 * 86,400 signatures (~3 s of Ed25519 on one core); linked, a handful.
 * GN_BILL_AUDIT_FULL also checks each superseded signature (forensics: a
 * broken one makes the bill invalid). Both use all CPUs for the signatures
 * and the chain and give the same verdict and reason whatever the threads
 * did.
 * Returns 0 only for GN_BILL_COUNTERSIGNED; GN_EAUDIT with ret->verdict
 * PROVIDER_ONLY, REJECTED or INVALID and ret->reason; GN_EINVAL if doc is not
 * a gpunet-invoice/2 export, or for unknown flags (ret->reason says so);
 * GN_ENOMEM. */
int gn_invoice_audit_json(const struct json_t *doc, gn_bill_audit *ret);
#define GN_BILL_AUDIT_FULL 2u
int gn_invoice_audit_json_flags(const struct json_t *doc, unsigned flags, gn_bill_audit *ret);

#endif
