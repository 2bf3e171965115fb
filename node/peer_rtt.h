/* Round trips measured between providers (issue 8, docs/protocol.md §2.14):
 * a requester asks each candidate provider for its RTT to the others
 * (RTT_ASK), the provider pings each over the overlay (RTT_PING/RTT_PONG) and
 * answers with what it measured (RTT_REPORT). Both roles are here: the
 * provider's answer, bounded against being used to dial or ping strangers,
 * and the requester's matrix for the planner. */
#ifndef GPUNET_NODE_PEER_RTT_H
#define GPUNET_NODE_PEER_RTT_H

#include <gpunet/identity.h>
#include <gpunet/wire.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gn_node gn_node;

#define GN_RTT_NONCE_LEN 16
#define GN_RTT_MAX_TARGETS 16        /* per RTT_ASK; more: the ask is refused */
#define GN_RTT_MAX_ASKS 4            /* asks a provider measures at once, all askers */
#define GN_RTT_ASK_INTERVAL_MS 2000u /* per asker: one ask started per this */
#define GN_RTT_TARGET_MS 2000u       /* a target's measurement, dial included */
#define GN_RTT_PINGS 3               /* per target, one after the other; the least is reported */
#define GN_RTT_RESEND_MS 700u        /* a PING unanswered this long is sent again, under a new nonce */
#define GN_RTT_MAX_US 10000000u      /* a reported RTT above 10 s is absurd: dropped */
#define GN_RTT_PONG_BURST 20u        /* PINGs answered per peer: a burst of 20, */
#define GN_RTT_PONG_PER_S 20u        /* then 20 a second; more are dropped */
#define GN_RTT_MAX_CANDIDATES 64     /* per matrix (GN_PLAN_MAX_CANDIDATES) */
#define GN_RTT_MAX_MATRICES 8        /* matrices a requester builds at once */
#define GN_RTT_ERR_LEN 24            /* an error code, with its NUL */

/* --- the codec (pure; tests/fuzz/fuzz_rtt.c) ------------------------------ */

typedef struct gn_rtt_ask {
  uint8_t nonce[GN_RTT_NONCE_LEN];
  size_t count;
  uint8_t targets[GN_RTT_MAX_TARGETS][GN_PK_LEN];
} gn_rtt_ask;

typedef struct gn_rtt_result {
  uint8_t id[GN_PK_LEN];
  uint32_t rtt_us;            /* 0: not measured (see error) */
  char error[GN_RTT_ERR_LEN]; /* "" when measured */
} gn_rtt_result;

typedef struct gn_rtt_report {
  uint8_t nonce[GN_RTT_NONCE_LEN];
  char error[GN_RTT_ERR_LEN]; /* the whole ask refused ("" if not); then count is 0 */
  size_t count;
  gn_rtt_result results[GN_RTT_MAX_TARGETS];
} gn_rtt_report;

/* RTT_ASK: {nonce: bin 16, targets: [bin 32, ...]}. Decoding: GN_ETOOBIG
 * with ret->nonce set (so the refusal can name it) when there are more than
 * GN_RTT_MAX_TARGETS targets; GN_EINVAL when malformed. */
int gn__rtt_ask_encode(const gn_rtt_ask *a, gn_wire_writer *w);
int gn__rtt_ask_decode(const uint8_t *body, size_t len, gn_rtt_ask *ret);
/* RTT_REPORT: {nonce: bin 16, results: [{id: bin 32, rtt_us: uint} or
 * {id: bin 32, error: str}, ...], error?: str}. At most GN_RTT_MAX_TARGETS
 * results; an rtt_us of 0 or above GN_RTT_MAX_US is malformed. */
int gn__rtt_report_encode(const gn_rtt_report *r, gn_wire_writer *w);
int gn__rtt_report_decode(const uint8_t *body, size_t len, gn_rtt_report *ret);
/* RTT_PING and RTT_PONG: {nonce: bin 16}. */
int gn__rtt_ping_encode(const uint8_t nonce[GN_RTT_NONCE_LEN], gn_wire_writer *w);
int gn__rtt_ping_decode(const uint8_t *body, size_t len, uint8_t ret_nonce[GN_RTT_NONCE_LEN]);

/* The combining rule of the matrix (pure): dir is k*k, dir[i*k+j] what
 * candidate i reported for j (0: nothing). ret (k*k) gets, for every pair,
 * the larger of both directions when both are known, the one known
 * otherwise, 0 when neither; the diagonal is 0. Symmetric. */
void gn__rtt_combine(size_t k, const uint32_t *dir, uint32_t *ret);

/* The matrix in the planner's units (billing/plan.c, gn_plan_choose's
 * rtt_ms): k*k milliseconds, rounded up (a measure under 1 ms is 1 ms, not
 * 0); 0 (unknown) becomes GN_RTT_UNKNOWN; the diagonal is 0. */
void gn__rtt_to_plan_ms(size_t k, const uint32_t *rtt_us, uint32_t *ret_ms);

/* --- the daemon ------------------------------------------------------------ */

/* RTT_ASK, RTT_REPORT, RTT_PING and RTT_PONG from peer (the signer, checked
 * by the caller). */
void gn__rtt_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                        size_t raw_len);
/* Deadlines, dials and pings are driven by the module's own 20 ms timer,
 * which runs only while an ask or a matrix is in progress and closes itself
 * when the daemon stops (no tick or shutdown hook is needed). */

/* The requester's matrix: asks each of cands[0..k-1] (2 <= k <=
 * GN_RTT_MAX_CANDIDATES, distinct providers) for its RTT to the others, in
 * parallel, dialling each at its offer's address if no session is up. When
 * k - 1 <= GN_RTT_MAX_TARGETS every candidate is asked about every other
 * (each pair measured from both ends); beyond, pair (i, j) is asked of one
 * end only, spread evenly (each candidate gets at most GN_RTT_MAX_TARGETS),
 * and pairs past that stay unknown. done is called exactly once, from the
 * loop (never from within this call), when every candidate has answered or
 * timeout_ms (100..60000) has passed, with rtt_us k*k as gn__rtt_combine
 * makes it (0: unknown; valid only during the call). Returns a handle > 0,
 * or a negative GN_E* code, and then done is never called (GN_EINVAL bad
 * arguments, GN_EBUSY GN_RTT_MAX_MATRICES already running, GN_ENOMEM). */
typedef void (*gn_rtt_done_fn)(gn_node *n, void *ud, const uint32_t *rtt_us);
int gn__rtt_matrix_begin(gn_node *n, const uint8_t (*cands)[GN_PK_LEN], size_t k, uint32_t timeout_ms,
                         gn_rtt_done_fn done, void *ud);
/* Forgets a matrix: its done is not called. Harmless for a handle already
 * done or unknown. */
void gn__rtt_matrix_cancel(gn_node *n, int handle);

#endif
