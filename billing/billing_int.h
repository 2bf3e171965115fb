/* Internal interfaces shared by the billing module's files (and its tests):
 * the tick hash, the compact tick record of an invoice, invoice body coding
 * and the verifier that gn_invoice_check and gn_invoice_audit_json share. */
#ifndef GPUNET_BILLING_INT_H
#define GPUNET_BILLING_INT_H

#include <gpunet/billing.h>
#include <stdarg.h>

#define GN__TICK_DOMAIN "gpunet-tick-v1" /* hashed with its NUL */
#define GN__HASH_LEN 32

/* tick hash = BLAKE2b-256("gpunet-tick-v1\0" || prev(32) || lease_id ||
 * u64be idx || i64be t_s || u32be gpus || u8 util). lease_id is the only
 * variable-length field and everything after it has a fixed length, so the
 * concatenation is unambiguous. */
void gn__tick_hash(const uint8_t prev[GN__HASH_LEN], const char *lease_id, uint64_t idx, int64_t t_s, uint32_t gpus,
                   uint8_t util, uint8_t ret_hash[GN__HASH_LEN]);
/* The chain's genesis: BLAKE2b-256 of the agreement envelope bytes. */
void gn__genesis(const uint8_t *agreement_env, size_t len, uint8_t ret_hash[GN__HASH_LEN]);
/* BLAKE2b-256 of an invoice envelope; invoice_id is "i-" + hex of its first
 * 8 bytes. */
void gn__invoice_hash(const uint8_t *env, size_t len, uint8_t ret_hash[GN__HASH_LEN]);
void gn__invoice_id(const uint8_t hash[GN__HASH_LEN], char ret_id[GN_LEASE_ID_STRLEN]);

/* One tick inside an invoice: a fixed 12-byte record, big-endian:
 * u32 idx, u32 t_off (t_s - invoice start_s), u8 gpus, u8 util, u16 tag
 * (the first two bytes of that tick's chain hash, so a changed tick is named
 * by its second, not only detected at the chain head). */
#define GN__TICKREC_LEN 12
/* An invoice carries at most 7 days of ticks: 604800 * 12 bytes = 7.3 MB,
 * under GN_MSG_MAX with room for the agreement. */
#define GN__INVOICE_MAX_TICKS GN_INVOICE_MAX_S

typedef struct gn__tickrec {
  uint32_t idx;
  uint32_t t_off;
  uint8_t gpus;
  uint8_t util;
  uint16_t tag;
} gn__tickrec;

void gn__tickrec_get(const uint8_t *p, gn__tickrec *ret);
void gn__tickrec_put(uint8_t *p, const gn__tickrec *r);

/* The fields of a GN_MSG_INVOICE body. Pointer fields refer to memory the
 * caller keeps alive (the decoded document, or the builder's buffers). */
typedef struct gn__invoice_body {
  char lease_id[GN_LEASE_ID_STRLEN];
  const uint8_t *agreement;
  size_t agreement_len;
  int64_t start_s;
  int64_t end_s;
  char end_reason[64];
  const uint8_t *ticks; /* n * GN__TICKREC_LEN bytes */
  size_t ticks_len;
  uint8_t chain_head[GN__HASH_LEN];
  uint64_t seconds;
  uint64_t price_uper_hour;
  char currency[8];
  uint64_t total_micro;
} gn__invoice_body;

int gn__invoice_body_encode(const gn__invoice_body *b, gn_buf *ret);
/* Decodes into b, whose pointers refer into doc (the caller calls
 * gn_wire_doc_done when finished). Names the bad field in reason. */
int gn__invoice_body_decode(const uint8_t *body, size_t len, gn_wire_doc *doc, gn__invoice_body *ret, char *reason,
                            size_t cap);

/* A fully verified invoice: signatures, agreement, chain, prices, totals. */
typedef struct gn__invoice_view {
  gn_envelope env;
  gn_agreement agreement;
  gn__invoice_body body;
  gn_wire_doc doc; /* body's pointers refer into it */
  uint8_t hash[GN__HASH_LEN];
  uint64_t gpu_seconds;
} gn__invoice_view;

/* Verifies everything that can be verified from the invoice alone, plus (if
 * expect_agreement is not NULL) that it embeds exactly those agreement bytes.
 * 0 on success (call gn__invoice_view_done later); GN_EAUDIT with a reason
 * naming the first failure otherwise (nothing to release then). */
int gn__invoice_verify(const uint8_t *env, size_t len, const uint8_t *expect_agreement, size_t expect_len,
                       gn__invoice_view *ret, char *reason, size_t cap);
void gn__invoice_view_done(gn__invoice_view *v);
void gn__invoice_summary_fill(const gn__invoice_view *v, gn_invoice_summary *ret);

/* Opens an agreement like gn_agreement_open, writing a reason on failure. */
int gn__agreement_open(const uint8_t *env, size_t len, gn_agreement *ret, char *reason, size_t cap);

/* Parses an envelope's outer array without verifying it, for error messages
 * and rejections only (to name who should have signed). The body is copied
 * into *ret_body, which the caller frees. */
int gn__envelope_peek(const uint8_t *buf, size_t len, uint32_t *ret_type, uint8_t ret_signer[GN_PK_LEN],
                      uint8_t **ret_body, size_t *ret_body_len);

/* Appends a tick; with commit false the caller holds a transaction (used by
 * the benchmark's batched reference only: such a tick is not durable when
 * this returns). */
int gn__ledger_append(gn_ledger *l, const char *lease_id, int64_t t_s, uint32_t gpus, uint8_t util, bool commit,
                      gn_tick *ret_tick);

/* A lease id: 1..23 bytes of [A-Za-z0-9._-] (safe in file names and JSON). */
bool gn__lease_id_ok(const char *s);

/* snprintf into reason if reason is not NULL; returns GN_EAUDIT. */
int gn__fail(char *reason, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
