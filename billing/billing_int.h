/* Internal interfaces shared by the billing module's files (and its tests):
 * the tick hash v2, the compact tick record, the note/invoice body codec and
 * the one verifier that the requester's checks, the provider's open and the
 * audit share. */
#ifndef GPUNET_BILLING_INT_H
#define GPUNET_BILLING_INT_H

#include <gpunet/billing.h>
#include <stdarg.h>

#define GN__TICK_DOMAIN "gpunet-tick-v2" /* hashed with its NUL */
#define GN__HASH_LEN 32

/* tick hash v2 = BLAKE2b-256("gpunet-tick-v2\0" || prev(32) || lease_id ||
 * u64be idx || u32be gpus || u8 util). No wall-clock time: the index is the
 * time (second idx of the lease). lease_id is the only variable-length field
 * and everything after it has a fixed length, so the concatenation is
 * unambiguous. */
void gn__tick_hash(const uint8_t prev[GN__HASH_LEN], const char *lease_id, uint64_t idx, uint32_t gpus, uint8_t util,
                   uint8_t ret_hash[GN__HASH_LEN]);
/* The same, with the constant prefix (domain, lease id) hashed once: for the
 * long walks (sealing, checking, auditing 2.6 million seconds). */
typedef struct gn__tick_hasher {
  uint8_t prefix[sizeof(GN__TICK_DOMAIN) + GN_LEASE_ID_STRLEN];
  size_t prefix_len;
} gn__tick_hasher;
void gn__tick_hasher_init(gn__tick_hasher *h, const char *lease_id);
void gn__tick_hasher_step(const gn__tick_hasher *h, uint8_t chain[GN__HASH_LEN], uint64_t idx, uint32_t gpus,
                          uint8_t util);

/* The chain's genesis: BLAKE2b-256 of the agreement envelope bytes (also the
 * agreement_hash of a debit note). */
void gn__genesis(const uint8_t *agreement_env, size_t len, uint8_t ret_hash[GN__HASH_LEN]);
/* BLAKE2b-256 of an invoice envelope; invoice_id is "i-" + hex of its first
 * 8 bytes. */
void gn__invoice_hash(const uint8_t *env, size_t len, uint8_t ret_hash[GN__HASH_LEN]);
void gn__invoice_id(const uint8_t hash[GN__HASH_LEN], char ret_id[GN_LEASE_ID_STRLEN]);

/* Overflow-checked arithmetic: false on overflow (the result is not written). */
static inline bool gn__add_u64(uint64_t a, uint64_t b, uint64_t *ret) {
  return !__builtin_add_overflow(a, b, ret);
}

/* An opened agreement with its bytes and hash: what every check is against. */
typedef struct gn__bill_ctx {
  const uint8_t *env;
  size_t len;
  gn_agreement ag;
  uint8_t hash[GN__HASH_LEN]; /* = genesis = agreement_hash */
} gn__bill_ctx;

int gn__bill_ctx_open(const uint8_t *env, size_t len, gn__bill_ctx *ret, char *reason, size_t cap);

/* The fields of a DEBIT_NOTE or final INVOICE body. Pointer fields refer to
 * memory the caller keeps alive (the decoded document, or the sealer's
 * buffers). */
typedef struct gn__bill_body {
  bool final;
  char lease_id[GN_LEASE_ID_STRLEN];
  const uint8_t *agreement; /* invoice */
  size_t agreement_len;
  uint8_t agreement_hash[GN__HASH_LEN]; /* note */
  uint64_t seq;
  uint8_t prev[GN__HASH_LEN];
  uint64_t from;
  const uint8_t *ticks;
  size_t ticks_len;
  uint64_t seconds, gpu_seconds, total_micro;
  uint8_t chain_head[GN__HASH_LEN];
  int64_t issued_s;         /* note */
  uint64_t price_uper_hour; /* invoice */
  char currency[8];         /* invoice */
  int64_t start_s, end_s;   /* invoice */
  char end_reason[64];      /* invoice */
  gn_bill_energy energy;    /* invoice, optional: energy_mj and energy_measured_s */
} gn__bill_body;

int gn__bill_body_encode(const gn__bill_body *b, gn_buf *ret);
/* Decodes into ret, whose pointers refer into doc (the caller calls
 * gn_wire_doc_done when finished, only on success). Names the bad field in
 * reason. */
int gn__bill_body_decode(bool final, const uint8_t *body, size_t len, gn_wire_doc *doc, gn__bill_body *ret,
                         char *reason, size_t cap);

/* What a verification is allowed: the requester's limits. */
typedef struct gn__bill_limits {
  bool check_observed;
  uint64_t observed_s, tolerance_s;
  uint64_t max_spend_micro; /* 0 = no cap */
  bool stale_ok;            /* notes: GN_ESTATE for seq <= head.seq instead of GN_EAUDIT */
} gn__bill_limits;

/* A fully verified note or invoice. */
typedef struct gn__bill_view {
  gn_envelope env;
  gn_wire_doc doc; /* body's pointers refer into it */
  gn__bill_body body;
  gn_bill_note note;
  gn_bill_head next;
} gn__bill_view;

/* Verifies env as a note (final false) or invoice (final true) of ctx's
 * lease continuing head, within limits (NULL: none). 0 and *ret (release with
 * gn__bill_view_done) or GN_EAUDIT/GN_ESTATE and a reason (nothing to
 * release). */
int gn__bill_verify(const uint8_t *env, size_t len, bool final, const gn__bill_ctx *ctx, const gn_bill_head *head,
                    const gn__bill_limits *lim, gn__bill_view *ret, char *reason, size_t cap);
void gn__bill_view_done(gn__bill_view *v);

/* The _sig variants take the result of a signature check done before (by
 * the audit's parallel pre-pass): GN__SIG_UNCHECKED to verify now, 0 for
 * verified, a negative code for a failed check. */
#define GN__SIG_UNCHECKED 1
int gn__bill_verify_sig(const uint8_t *env, size_t len, int sig_rc, bool final, const gn__bill_ctx *ctx,
                        const gn_bill_head *head, const gn__bill_limits *lim, gn__bill_view *ret, char *reason,
                        size_t cap);
int gn__bill_response_open_sig(const uint8_t *env, size_t len, int sig_rc, const gn__bill_ctx *ctx,
                               gn_bill_response *ret, char *reason, size_t cap);
int gn__bill_peek_sig(const uint8_t *env, size_t len, int sig_rc, const gn__bill_ctx *ctx, gn_bill_note *ret,
                      char *reason, size_t cap);

/* Opens a note or invoice of ctx's lease (signature, signer, body, lease and
 * agreement) without walking its ticks or checking it continues anything:
 * for storing and listing. */
int gn__bill_peek(const uint8_t *env, size_t len, const gn__bill_ctx *ctx, gn_bill_note *ret, char *reason, size_t cap);

/* Appends the agreement envelope an invoice embeds, without verifying
 * anything (the caller verifies the agreement, then the invoice against it). */
int gn__invoice_agreement(const uint8_t *env, size_t len, gn_buf *ret_ag);

/* The older display summary of a note or invoice of ctx's lease. */
void gn__bill_summary_fill(const gn__bill_ctx *ctx, const gn_bill_note *no, gn_invoice_summary *ret);

/* The head of a fresh lease from an opened context. */
void gn__bill_head_genesis(const gn__bill_ctx *ctx, gn_bill_head *ret);

/* Opens a response against ctx (see gn_bill_response_open). */
int gn__bill_response_open(const uint8_t *env, size_t len, const gn__bill_ctx *ctx, gn_bill_response *ret, char *reason,
                           size_t cap);

/* Opens an agreement like gn_agreement_open, writing a reason on failure. */
int gn__agreement_open(const uint8_t *env, size_t len, gn_agreement *ret, char *reason, size_t cap);

/* Parses an envelope's outer array without verifying it, for error messages
 * and rejections only (to name who should have signed). The body is copied
 * into *ret_body, which the caller frees. */
int gn__envelope_peek(const uint8_t *buf, size_t len, uint32_t *ret_type, uint8_t ret_signer[GN_PK_LEN],
                      uint8_t **ret_body, size_t *ret_body_len);

/* Appends a tick; with commit false the caller holds a transaction (used by
 * the benchmark and tests: such a tick is not durable when this returns). */
int gn__ledger_append(gn_ledger *l, const char *lease_id, int64_t t_s, uint32_t gpus, uint8_t util, bool commit,
                      gn_tick *ret_tick);

/* A lease id: 1..23 bytes of [A-Za-z0-9._-] (safe in file names and JSON). */
bool gn__lease_id_ok(const char *s);
/* 1..cap-1 bytes of printable ASCII (0x20..0x7e). */
bool gn__printable(const char *s);

/* Strict base64 (RFC 4648 alphabet, '=' padding to a multiple of 4, no
 * whitespace, unused bits zero): exactly what sodium_base642bin accepts with
 * sodium_base64_VARIANT_ORIGINAL and no ignored characters, decoded by
 * table (an export is public: no need for constant time). GN_EINVAL for
 * anything else or more than cap bytes. */
int gn__b64_decode(const char *s, size_t n, uint8_t *out, size_t cap, size_t *ret_len);

/* snprintf into reason if reason is not NULL; returns GN_EAUDIT. */
int gn__fail(char *reason, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
