/* Settlement without a central server: the requester's payment vouchers
 * (every DEBIT_ACCEPT and INVOICE_ACCEPT is one), a durable outbox of final
 * settlements, and the drivers that settle them (a local `ledger` book, or a
 * `webhook` POSTed to a billing system of the operator's choice).
 *
 * How the daemon uses it (node/settle.c is the glue):
 *  - a provider, for every voucher it receives, and a requester, for every
 *    voucher it signs, calls gn_settle_record_voucher: the voucher is checked
 *    (signed by the agreement's requester, for this lease, currency and
 *    provider, amount never decreasing) and kept as the lease's highest;
 *  - when a final invoice is countersigned (the requester signs, or the
 *    provider receives, INVOICE_ACCEPT), the glue calls
 *    gn_settle_enqueue_final: the final voucher is recorded and one outbox
 *    item (its idempotency key is "<lease_id>-<invoice hash hex>") is kept in
 *    SQLite until a driver acknowledges it, across crashes and restarts;
 *  - the glue drains the outbox: gn_settle_outbox_next hands out the item
 *    that is due, the driver's submit runs (on the thread pool when the
 *    driver says off_loop), gn_settle_outbox_finish records the outcome and,
 *    for a transient failure, the next attempt (exponential backoff).
 *
 * All functions taking a gn_settle run on the thread that owns its SQLite
 * connection (the loop). A driver's submit touches no gn_settle state unless
 * the driver says so (the ledger driver writes its book, so it runs on the
 * loop). Times are UTC (the outbox outlives the process, so it cannot use a
 * monotonic clock) and injected, so tests drive them. */
#ifndef GPUNET_SETTLE_H
#define GPUNET_SETTLE_H

#include <gpunet/base.h>
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

/* Outbox items not yet acknowledged or failed: an enqueue beyond this is
 * refused (GN_ETOOBIG) instead of growing the table without bound. */
#define GN_SETTLE_OUTBOX_MAX 4096
/* One item's body (the webhook's JSON: the export of a 30-day lease with its
 * ticks is about 7 MB in base64). */
#define GN_SETTLE_BODY_MAX (64u * 1024u * 1024u)
/* "<lease_id>-<64 hex>" and its NUL. */
#define GN_SETTLE_KEY_STRLEN (GN_LEASE_ID_STRLEN + 1 + 64 + 1)
/* Default retry schedule: 2 s, 4 s, 8 s... at most an hour apart. */
#define GN_SETTLE_BACKOFF_BASE_MS 2000u
#define GN_SETTLE_BACKOFF_MAX_MS 3600000u
/* Default per-request timeout of the webhook driver. */
#define GN_SETTLE_WEBHOOK_TIMEOUT_MS 30000u

typedef enum gn_settle_role {
  GN_SETTLE_PROVIDER = 1,  /* we gave the GPUs: the peer (requester) owes us */
  GN_SETTLE_REQUESTER = 2, /* we rented: we owe the peer (provider) */
} gn_settle_role;

/* "provider" / "requester" (NULL for anything else). */
const char *gn_settle_role_name(gn_settle_role role);

typedef struct gn_settle gn_settle;

/* Uses (does not own) db, opened by the caller (WAL, synchronous=FULL as the
 * ledger wants); creates the tables settle_vouchers, settle_outbox and
 * settle_book if missing. self_pk is this node's identity: a voucher is
 * recorded only by the party it concerns (the provider or the requester it
 * names), as the role given. */
int gn_settle_open(sqlite3 *db, const uint8_t self_pk[GN_PK_LEN], gn_settle **ret);
/* Finalizes prepared statements (call before sqlite3_close). NULL-safe;
 * returns NULL. */
gn_settle *gn_settle_free(gn_settle *s);
/* Changes the retry schedule (tests use milliseconds): attempt k (1-based)
 * that fails transiently is retried base_ms * 2^(k-1) later, at most max_ms. */
void gn_settle_set_backoff(gn_settle *s, uint32_t base_ms, uint32_t max_ms);

/* --- vouchers ---------------------------------------------------------------*/

/* A voucher, opened and checked against its agreement. */
typedef struct gn_settle_voucher {
  char lease_id[GN_LEASE_ID_STRLEN];
  uint8_t provider[GN_PK_LEN];
  uint8_t requester[GN_PK_LEN]; /* the signer */
  char currency[8];
  uint32_t type; /* GN_MSG_DEBIT_ACCEPT or GN_MSG_INVOICE_ACCEPT */
  bool final;    /* type == GN_MSG_INVOICE_ACCEPT */
  uint64_t seq;  /* the accepted debit note's seq; 0 for a final voucher */
  uint64_t seconds;
  uint64_t amount_micro;    /* cumulative for the lease (total_micro) */
  uint8_t hash[32];         /* the note or invoice hash it countersigns */
  uint8_t voucher_hash[32]; /* BLAKE2b-256 of the voucher envelope */
} gn_settle_voucher;

/* Opens a voucher envelope against the agreement envelope of its lease, with
 * no state: the agreement must verify; the voucher must be a DEBIT_ACCEPT or
 * INVOICE_ACCEPT (GN_EINVAL for a rejection or another message) that
 * gn_bill_response_open accepts: signed by the agreement's requester
 * (GN_ESIG on a bad signature, GN_EPERM for another signer), for the
 * agreement's lease and currency and, for a DEBIT_ACCEPT, its provider
 * (GN_EINVAL or GN_EPERM otherwise); an amount, seconds or seq that does not
 * fit in an SQLite integer is GN_ETOOBIG. */
int gn_settle_voucher_open(const uint8_t *agreement_env, size_t agreement_len, const uint8_t *voucher_env,
                           size_t voucher_len, gn_settle_voucher *ret);

/* Records a voucher we received (role PROVIDER) or signed (role REQUESTER)
 * as the lease's highest, committed before it returns. self_pk must be the
 * agreement's party of that role (GN_EPERM). Against the voucher recorded for
 * the lease (if any), refused and changing nothing:
 *  - anything gn_settle_voucher_open refuses;
 *  - a newer voucher (a debit voucher of a higher seq, or the final one)
 *    whose amount or seconds are lower (GN_EAUDIT: vouchers only increase);
 *  - a different voucher for the same note, or an older note's voucher for
 *    more (GN_EAUDIT: the requester signed two stories);
 *  - after the final voucher, a second final voucher or a debit voucher for
 *    more (GN_ESTATE);
 *  - a voucher of a lease id recorded under another agreement (GN_EPERM).
 * The same voucher again, an older note's voucher for no more (a duplicate
 * that arrived late) and, after the final voucher, a debit voucher for no
 * more return 0 and keep the recorded one. */
int gn_settle_record_voucher(gn_settle *s, gn_settle_role role, const uint8_t *agreement_env, size_t agreement_len,
                             const uint8_t *voucher_env, size_t voucher_len, int64_t now_s);
/* The recorded (highest) voucher of a lease; GN_ENOTFOUND if none.
 * ret_env (may be NULL) receives the envelope (appended). */
int gn_settle_get_voucher(gn_settle *s, const char *lease_id, gn_settle_role role, gn_settle_voucher *ret,
                          gn_buf *ret_env);

/* --- final settlement: the outbox -------------------------------------------*/

typedef struct gn_settle_final {
  gn_settle_role role;
  const uint8_t *agreement_env;
  size_t agreement_len;
  const uint8_t *invoice_env; /* the final INVOICE the voucher countersigns */
  size_t invoice_len;
  const uint8_t *accept_env; /* the requester's INVOICE_ACCEPT: the final voucher */
  size_t accept_len;
  /* The gpunet-invoice/2 export of the lease (gn_invoice_export), put in the
   * webhook body as is; NULL to send none. Not stolen. */
  const struct json_t *export_doc;
} gn_settle_final;

/* Records the final voucher (as gn_settle_record_voucher; it must be an
 * INVOICE_ACCEPT naming BLAKE2b-256 of invoice_env, else GN_EDIGEST) and
 * queues one settlement item keyed "<lease_id>-<invoice hash hex>", due now
 * (its body is dropped once it is settled: the ledger holds its parts).
 * Both in one transaction, committed before it returns: nothing is lost on a
 * crash. Enqueueing the same final voucher again returns 0 and queues
 * nothing (the key is unique); GN_ETOOBIG when GN_SETTLE_OUTBOX_MAX items
 * wait or the body would exceed GN_SETTLE_BODY_MAX. The body is the webhook's
 * JSON: {"format": "gpunet-settlement/1", "key", "lease", "role", "provider",
 * "requester" (node ids), "currency", "amount_micro", "seconds",
 * "invoice_hash" (hex), "voucher" (base64 of the INVOICE_ACCEPT envelope),
 * "invoice" (base64 of the INVOICE envelope), "export" (the export document,
 * or null)}. */
int gn_settle_enqueue_final(gn_settle *s, const gn_settle_final *f, int64_t now_ms);

/* One item handed to a driver. */
typedef struct gn_settle_item {
  int64_t id;
  char key[GN_SETTLE_KEY_STRLEN];
  char lease_id[GN_LEASE_ID_STRLEN];
  gn_settle_role role;
  uint8_t peer[GN_PK_LEN]; /* the counterparty */
  uint64_t amount_micro;
  char currency[8];
  uint32_t attempts; /* attempts made before this one */
  gn_buf body;       /* the JSON body, owned */
} gn_settle_item;

void gn_settle_item_done(gn_settle_item *it);

/* What a driver's submit says about one attempt. */
typedef struct gn_settle_outcome {
  bool retry;       /* transient (connection, timeout, 5xx, 408, 429): try again later */
  long http_status; /* the server's status, 0 when none */
  char reason[256]; /* why it failed, printable, "" on success */
} gn_settle_outcome;

typedef struct gn_settle_driver gn_settle_driver;
struct gn_settle_driver {
  const char *name; /* "ledger", "webhook" */
  /* submit may block (network): the glue runs it on a worker thread. */
  bool off_loop;
  /* 0 when the item is acknowledged (settled); a negative GN_E* otherwise,
   * with ret saying whether to retry and why. Called for one item at a time. */
  int (*submit)(gn_settle_driver *d, const gn_settle_item *item, gn_settle_outcome *ret);
  /* May be NULL. Callable from any thread (the daemon's shutdown): a submit
   * running now or later returns soon with GN_ECANCELED and retry set; the
   * item stays queued for the next start. */
  void (*cancel)(gn_settle_driver *d);
  void (*free)(gn_settle_driver *d);
};

/* NULL-safe; returns NULL. */
gn_settle_driver *gn_settle_driver_free(gn_settle_driver *d);

/* The `ledger` driver: settles an item by writing it into the node's own
 * book (table settle_book: lease, role, peer, currency, amount, key, when).
 * Uses s's connection, so it runs on the loop (off_loop false); s must
 * outlive it. */
int gn_settle_ledger_driver_new(gn_settle *s, gn_settle_driver **ret);

/* 0 if url is an absolute http:// or https:// URL with a host (at most
 * 1023 bytes, no whitespace or control bytes), GN_EINVAL otherwise. */
int gn_settle_url_check(const char *url);
/* The `webhook` driver: POSTs each item's body to url (Content-Type
 * application/json, Idempotency-Key: the item's key), within timeout_ms per
 * request (0: GN_SETTLE_WEBHOOK_TIMEOUT_MS), following no redirects. 2xx is
 * acknowledged; a connection error, a timeout, 5xx, 408 and 429 are retried;
 * any other status fails the item for good with the status and the start of
 * the answer as the reason (never the URL: it may hold credentials). Calls
 * curl_global_init (and the free its cleanup): create it before threads that
 * use libcurl start, as libcurl asks. GN_EINVAL for a URL gn_settle_url_check refuses. */
int gn_settle_webhook_new(const char *url, uint32_t timeout_ms, gn_settle_driver **ret);

/* Hands out the next pending item due at now_ms (oldest due first);
 * GN_ENOTFOUND when none is due. The item stays pending until finished. */
int gn_settle_outbox_next(gn_settle *s, int64_t now_ms, gn_settle_item *ret);
/* When the next pending item is due (ms); GN_ENOTFOUND if nothing waits. */
int gn_settle_outbox_next_due(gn_settle *s, int64_t *ret_ms);
/* Records an attempt's result: rc 0 marks the item settled by driver_name;
 * rc < 0 with o->retry schedules the next attempt (backoff), otherwise marks
 * it failed with o->reason. GN_ENOTFOUND for an unknown id or one no longer
 * pending (nothing changes). */
int gn_settle_outbox_finish(gn_settle *s, int64_t id, int rc, const gn_settle_outcome *o, const char *driver_name,
                            int64_t now_ms);
/* Runs due items through d in the calling thread, up to max of them, and
 * records each outcome; *ret_n (may be NULL) counts the attempts made.
 * For tests and tools: the daemon drains off the loop. */
int gn_settle_drain(gn_settle *s, gn_settle_driver *d, int64_t now_ms, size_t max, size_t *ret_n);
/* Puts a lease's failed item (lease_id NULL: every failed item) back to
 * pending, due now, its attempts counted from 0 again (an operator fixed the
 * endpoint). GN_ENOTFOUND if the lease has no failed item; *ret_n (may be
 * NULL) counts the items. */
int gn_settle_outbox_retry(gn_settle *s, const char *lease_id, gn_settle_role role, int64_t now_ms, uint64_t *ret_n);

typedef enum gn_settle_state {
  GN_SETTLE_NONE = 0, /* no final voucher queued */
  GN_SETTLE_PENDING,  /* queued or being retried */
  GN_SETTLE_SETTLED,  /* acknowledged by a driver */
  GN_SETTLE_FAILED,   /* refused for good (see reason) */
} gn_settle_state;

/* "none", "pending", "settled", "failed". */
const char *gn_settle_state_name(gn_settle_state st);

typedef struct gn_settle_status {
  gn_settle_state state;
  char key[GN_SETTLE_KEY_STRLEN];
  uint32_t attempts;
  int64_t next_ms;  /* when pending */
  int64_t done_ms;  /* when settled or failed */
  char driver[16];  /* which driver settled it */
  char reason[256]; /* the last failure, "" if none */
} gn_settle_status;

/* The settlement of a lease's final voucher; state NONE (and 0) when none is
 * queued. */
int gn_settle_status_get(gn_settle *s, const char *lease_id, gn_settle_role role, gn_settle_status *ret);
/* Items pending and failed. */
int gn_settle_outbox_counts(gn_settle *s, uint64_t *ret_pending, uint64_t *ret_failed);

/* --- balances ---------------------------------------------------------------*/

/* What one counterparty owes us (role PROVIDER) or we owe it (REQUESTER) in
 * one currency, from the highest voucher of each lease. */
typedef struct gn_settle_balance {
  gn_settle_role role;
  uint8_t peer[GN_PK_LEN];
  char currency[8];
  uint64_t leases;
  uint64_t vouched_micro; /* sum of each lease's highest voucher */
  uint64_t final_micro;   /* of which: leases with a final voucher */
  uint64_t settled_micro; /* of which: final and settled by a driver */
} gn_settle_balance;

/* Adds one lease's voucher to b with checked arithmetic: GN_ETOOBIG on
 * overflow of any sum (b is then unchanged), GN_EINVAL if settled without
 * final. */
int gn_settle_balance_add(gn_settle_balance *b, uint64_t amount_micro, bool final, bool settled);
/* All balances, ordered by role, peer, currency; *ret is NULL when there are
 * none (free it with free()). GN_ETOOBIG if a sum overflows. */
int gn_settle_balances(gn_settle *s, gn_settle_balance **ret, size_t *ret_n);

#endif
