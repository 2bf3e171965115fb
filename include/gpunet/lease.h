/* The lease protocol as two I/O-free state machines, one for the provider
 * and one for the requester (issue 7, notes/billing2.md): metering schedule,
 * debit notes, credit control, the final invoice and restarts. They take
 * messages (bytes), the time and the peer's reachability in, and hand back a
 * list of actions for the caller (node/provider.c, node/requester.c, or the
 * simulator in tests/billing/test_lease_sim.c) to perform. No clock, socket,
 * file or SQLite call happens inside; signing and checking use the pure
 * billing functions of <gpunet/billing.h>.
 *
 * How the glue drives a machine:
 *  - every entry point takes the current time (gn_lease_now) and a
 *    gn_lease_out, which it empties first and fills with actions;
 *  - the caller performs the actions IN ORDER (a PERSIST before the SEND
 *    that follows it: the state must be durable before the peer can act on
 *    the message; an END comes after the PERSIST that records it), then
 *    arms one timer at out.timer_at_ms (monotonic ms, UINT64_MAX = none)
 *    that calls gn_lease_*_timer. The timer of the latest call replaces the
 *    previous one: a call made while performing another call's actions
 *    (gn_lease_prov_ticks for its WRITE_TICKS) is the latest;
 *  - bytes in actions belong to the gn_lease_out and stay valid until the
 *    next call that takes the same out, or gn_lease_out_done.
 *
 * Ticks (provider): the machine decides WHICH seconds are due (tick i only
 * once its monotonic clock says i whole seconds passed since the lease
 * started; a stall's catch-up asks for several seconds at once, each standing
 * for its own second). The glue measures gpus/util, appends the ticks to the
 * ledger (durably), then hands the same seconds back as compact records
 * (2 bytes per second: u8 gpus, u8 util) with gn_lease_prov_ticks. The
 * machine keeps the records since the last ACCEPTED debit note in memory
 * (that is all a note or the final invoice carries) and never asks for them
 * again; after a restart the glue gives them back once, to
 * gn_lease_prov_restore (gn_lease_state_peek says from which second).
 * The glue must report a WRITE_TICKS before it delivers any other input to
 * the same machine (the real glue writes synchronously on the loop).
 *
 * Persistence: each machine emits GN_LEASE_ACT_PERSIST with an opaque blob
 * (msgpack, at most GN_LEASE_STATE_MAX bytes) that replaces the previous one
 * for that lease; restore takes the newest blob back. The provider's blob
 * holds its head (after the last accepted note), that note and its
 * acceptance, the notes still unanswered (so a late acceptance still matches
 * after a crash) and the end; the requester's holds the UTC at which IT
 * received the agreement (its observation restarts from that, never from the
 * provider's start_s), its head and the note that led to it (its acceptance
 * is deterministic: re-sealed when the provider missed it), the spending cap,
 * and the final invoice it answered with its answer. A restored machine
 * emits its last VOUCHER, its final INVOICE (provider, ended) and SETTLED
 * again: a crash may have fallen between a PERSIST and those records, so the
 * glue stores them idempotently.
 *
 * Rules worth knowing (the simulator checks them): the final invoice
 * continues the last ACCEPTED note and leaves out trailing seconds of no GPU
 * (they cost nothing); a provider restored after being down longer than
 * grace_s ends the lease at once; a requester answers at most one final
 * invoice per lease and no note after it. */
#ifndef GPUNET_LEASE_H
#define GPUNET_LEASE_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* At most this many debit notes issued after the last accepted one are kept
 * (to match a late acceptance): with payment_timeout_s = 2 * interval_s
 * no more than three are outstanding before the lease stops, restarts
 * included; a provider that would issue one more ends the lease as unpaid
 * rather than forget a note the requester may still accept. */
#define GN_LEASE_MAX_PENDING 8
/* At most this many seconds in one WRITE_TICKS action (a catch-up after a
 * long stall comes as several actions, the timer fires again at once). */
#define GN_LEASE_MAX_CATCHUP 3600u
/* One call returns at most this many actions. */
#define GN_LEASE_MAX_ACTIONS 16
/* A persisted machine state is at most this big (pending notes included). */
#define GN_LEASE_STATE_MAX (8u * 1024u * 1024u)
/* Grace before a second delivery of the same message (a pending debit note,
 * the final invoice, a release): the resend interval is interval_s / 4,
 * clamped to [GN_LEASE_RESEND_MIN_MS, GN_LEASE_RESEND_MAX_MS]; the final
 * invoice backs off doubling up to GN_LEASE_INVOICE_RESEND_MAX_MS. */
#define GN_LEASE_RESEND_MIN_MS 1000u
#define GN_LEASE_RESEND_MAX_MS 30000u
#define GN_LEASE_INVOICE_RESEND_MAX_MS 600000u
/* An unanswered final invoice is not sent forever: once
 * GN_LEASE_INVOICE_GIVEUP_S have passed since the lease ended (its end_s, on
 * the provider's UTC clock, so restarts count) and it was sent at least
 * GN_LEASE_INVOICE_SENDS_MIN times (the first send, resends backing off to
 * GN_LEASE_INVOICE_RESEND_MAX_MS, a peer coming back and restarts all count;
 * a re-sealed invoice counts from 0), it is not sent again. A reachable
 * requester that never answers (one that holds no such lease: a late
 * acceptance after its rent timed out) gets about 150 sends in the day. The
 * invoice stays a provider-only claim in the ledger (exportable; the audit
 * exits 3) and the machine says so once: GN_LEASE_ACT_UNANSWERED. An answer
 * that still arrives later is taken. Both conditions: a link that comes and
 * goes does not use up the sends within minutes, and a requester that comes
 * back after a day away still gets the invoice a few times. */
#define GN_LEASE_INVOICE_GIVEUP_S 86400
#define GN_LEASE_INVOICE_SENDS_MIN 20u

/* The current time, as the caller's clocks read it. mono_ms (gn_mono_ms) runs
 * the schedule and every timeout; utc_s (gn_unix_s) only stamps records
 * (issued_s, end_s, the requester's time of receipt) and bridges a restart. */
typedef struct gn_lease_now {
  uint64_t mono_ms;
  int64_t utc_s;
} gn_lease_now;

enum gn_lease_act_kind {
  /* Send data (a signed envelope) to the peer of the lease. The machine only
   * asks while it believes the peer is up (gn_lease_*_peer); a send that
   * fails is simply lost (the machine re-sends what matters). */
  GN_LEASE_ACT_SEND = 1,
  /* Provider: meter seconds from..to (inclusive), append them to the ledger
   * durably, then report them with gn_lease_prov_ticks. idle: seconds the
   * provider did not give (it was down): write them with gpus 0 and util
   * GN_UTIL_UNKNOWN. Otherwise gpus is the number of GPUs the lease really
   * had in that second (at most the agreement's count). */
  GN_LEASE_ACT_WRITE_TICKS,
  /* Store data as this lease's machine state (replacing the previous one)
   * durably before performing the actions after it. */
  GN_LEASE_ACT_PERSIST,
  /* A countersigned debit note: data = the note, data2 = the requester's
   * DEBIT_ACCEPT (the cumulative payment voucher). Store it (settlement),
   * idempotently: a restored machine emits its last one again (a crash may
   * have fallen between the PERSIST before it and the store). */
  GN_LEASE_ACT_VOUCHER,
  /* The lease ended, reason says why (provider: kill its jobs, stop
   * metering, free its GPUs, send LEASE_END with the reason; requester: the
   * lease is over for it, stop sending jobs). Emitted once per lease, after
   * the PERSIST that records the end; a crash in between leaves no END: a
   * glue restoring a machine whose phase (gn_lease_*_info) is not ACTIVE
   * treats the lease as ended (no jobs restarted). */
  GN_LEASE_ACT_END,
  /* Provider: the final invoice was sealed (data): store it as "issued"
   * (it is re-sealed, and emitted again, if a late acceptance moves the
   * head it continues before the requester answered; a restored machine
   * whose lease ended emits it again: store it idempotently). */
  GN_LEASE_ACT_INVOICE,
  /* The final invoice was answered: data = the invoice, data2 = the
   * INVOICE_ACCEPT or INVOICE_REJECT, accepted says which, reason holds the
   * rejection's reason. Provider: on receipt; requester: when it answered.
   * Emitted again by a restored machine (store it idempotently). */
  GN_LEASE_ACT_SETTLED,
  /* A debit note was rejected (requester: by us, with data = the note and
   * data2 = our DEBIT_REJECT; provider: by the requester, data = the
   * rejection). reason names the problem. Information for logs and
   * records; the machine already did what follows from it. */
  GN_LEASE_ACT_REJECTED,
  /* Requester: send (again) a LEASE_RELEASE for this lease. */
  GN_LEASE_ACT_RELEASE,
  /* Provider: the final invoice went unanswered for GN_LEASE_INVOICE_GIVEUP_S
   * after the end and GN_LEASE_INVOICE_SENDS_MIN sends: it is not sent again
   * and stays as stored (a provider-only claim). Information for logs;
   * emitted once per lease. */
  GN_LEASE_ACT_UNANSWERED,
};

typedef struct gn_lease_action {
  int kind;          /* enum gn_lease_act_kind */
  uint64_t from, to; /* WRITE_TICKS */
  bool idle;         /* WRITE_TICKS */
  bool accepted;     /* SETTLED */
  /* VOUCHER, provider: timed is true when the note's acceptance came back
   * latency_ms after the note first went out (not after a restart). */
  bool timed;
  uint64_t latency_ms;
  const uint8_t *data, *data2;
  size_t len, len2;
  char reason[256]; /* END, SETTLED, REJECTED: printable, "" if none */
} gn_lease_action;

typedef struct gn_lease_out {
  gn_lease_action act[GN_LEASE_MAX_ACTIONS];
  size_t n;
  /* Call gn_lease_*_timer when the monotonic clock reaches this (it may be
   * called earlier or more often: it does only what is due). UINT64_MAX:
   * nothing will become due without another input. */
  uint64_t timer_at_ms;
  gn_buf bufs[2 * GN_LEASE_MAX_ACTIONS]; /* owns the actions' bytes */
} gn_lease_out;

/* Zero-initialising a gn_lease_out is the same as gn_lease_out_init. */
void gn_lease_out_init(gn_lease_out *out);
void gn_lease_out_done(gn_lease_out *out);

/* Where a lease's machine stands. */
enum gn_lease_phase {
  GN_LEASE_PHASE_ACTIVE = 1, /* metering (provider) / observing (requester) */
  GN_LEASE_PHASE_ENDED,      /* ended; the final invoice is not answered yet */
  GN_LEASE_PHASE_SETTLED,    /* the final invoice was countersigned or rejected */
};

typedef struct gn_lease_info {
  char lease_id[24];
  int phase;           /* enum gn_lease_phase */
  uint32_t interval_s; /* agreed */
  uint64_t seconds;    /* provider: metered; requester: observed (gn_lease_req_info's now) */
  uint64_t accepted_s; /* seconds covered by the last accepted debit note */
  uint64_t accepted_seq;
  uint64_t accepted_micro;
  uint64_t pending;        /* provider: notes issued and not answered */
  bool released;           /* requester asked to end it */
  bool invoice_accepted;   /* SETTLED: countersigned (false: rejected) */
  bool invoice_unanswered; /* provider, ENDED: the final invoice is no longer sent (GN_LEASE_ACT_UNANSWERED) */
  char end_reason[64];
} gn_lease_info;

/* What a persisted blob says without a machine: role (true = provider), the
 * lease id and, for the provider, the first second whose tick
 * gn_lease_prov_restore needs (the one after the last accepted note).
 * GN_EINVAL if it is not a machine state. */
typedef struct gn_lease_state_info {
  bool provider;
  char lease_id[24];
  uint64_t ticks_from;
  int phase;
} gn_lease_state_info;
int gn_lease_state_peek(const uint8_t *state, size_t len, gn_lease_state_info *ret);

/* --- provider ----------------------------------------------------------------*/

typedef struct gn_lease_prov gn_lease_prov;

/* Starts a lease the provider just agreed to: agreement_env is the signed
 * GN_MSG_LEASE_ACCEPT envelope (copied), id the provider's identity
 * (borrowed: it must outlive the machine, and must be the agreement's
 * provider: GN_EPERM otherwise). Metering starts at now.mono_ms; the peer is
 * taken as up. Emits the first PERSIST and the timer. */
int gn_lease_prov_new(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len, gn_lease_now now,
                      gn_lease_prov **ret, gn_lease_out *out);
/* Rebuilds a machine after a restart from its newest persisted state and the
 * ledger's ticks of seconds info.ticks_from, ticks_from+1, ... (n records,
 * 2 bytes each, as written). The seconds between the last one and what the
 * provider's own UTC says elapsed since start_s (capped at max_s) were not
 * given: the machine asks to write them idle. An ACTIVE lease goes on
 * metering (the peer is taken as down until gn_lease_prov_peer says up),
 * unless the provider was down longer than grace_s: then it ends at once
 * ("provider down for N s"; the final invoice bills up to the last tick). An
 * ENDED one re-sends its final invoice once the peer is up. GN_EINVAL if the
 * state does not belong to this agreement, GN_EAUDIT if the ticks do not
 * fit it. */
int gn_lease_prov_restore(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len,
                          const uint8_t *state, size_t state_len, const uint8_t *ticks, size_t n, gn_lease_now now,
                          gn_lease_prov **ret, gn_lease_out *out);
gn_lease_prov *gn_lease_prov_free(gn_lease_prov *m);

/* The seconds from..from+n-1 asked for by a WRITE_TICKS were written: their
 * compact records (u8 gpus, u8 util each). GN_ESTATE if they are not the
 * seconds asked for (nothing changes), GN_EINVAL if a record is out of range.
 * Every interval_s metered seconds this seals and sends a debit note. */
int gn_lease_prov_ticks(gn_lease_prov *m, gn_lease_now now, uint64_t from, const uint8_t *ticks, size_t n,
                        gn_lease_out *out);
/* A message from the lease's requester: GN_MSG_DEBIT_ACCEPT, DEBIT_REJECT,
 * INVOICE_ACCEPT or INVOICE_REJECT. An acceptance of a note still pending
 * moves the head (PERSIST, VOUCHER; after the end the final invoice is
 * sealed again to continue it: INVOICE, SEND); a rejection ends the lease;
 * an answer to the final invoice settles it (PERSIST, SETTLED). Returns GN_EPROTO/GN_ESIG/GN_EPERM/
 * GN_EDIGEST for what does not verify or match (nothing changes: the caller
 * may log it), 0 for a duplicate it ignored. */
int gn_lease_prov_recv(gn_lease_prov *m, gn_lease_now now, const uint8_t *env, size_t len, gn_lease_out *out);
/* The requester's session came up or went down. Up: re-sends the newest
 * pending note or the final invoice. Down for more than grace_s (=
 * payment_timeout_s = 2 * interval_s) ends the lease. */
int gn_lease_prov_peer(gn_lease_prov *m, gn_lease_now now, bool up, gn_lease_out *out);
/* The requester released the lease (a verified LEASE_RELEASE): it ends now
 * ("released"). 0 and nothing to do if it already ended. */
int gn_lease_prov_release(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out);
/* The provider ends the lease itself (shutdown, a ledger error, an
 * operator): reason at most 63 printable bytes. */
int gn_lease_prov_stop(gn_lease_prov *m, gn_lease_now now, const char *reason, gn_lease_out *out);
/* The lease's energy so far (the glue's integration of its GPUs' power,
 * gn_energy_claim), stated by the final invoice when it is sealed and kept
 * in the persisted state from then on. Ignored once the lease ended: the
 * invoice, re-sealed after a restart or a late acceptance, keeps the
 * figure it was first sealed with. NULL or !present: no claim. */
void gn_lease_prov_energy(gn_lease_prov *m, const gn_bill_energy *energy);
/* Does what is due at now: ticks, payment timeout, grace, resends, expiry. */
int gn_lease_prov_timer(gn_lease_prov *m, gn_lease_now now, gn_lease_out *out);
void gn_lease_prov_info(const gn_lease_prov *m, gn_lease_info *ret);

/* --- requester ---------------------------------------------------------------*/

typedef struct gn_lease_req gn_lease_req;

/* Starts observing a lease whose agreement (the provider's LEASE_ACCEPT
 * envelope, which embeds our signed request) just arrived: now.utc_s is
 * persisted as the time of receipt and observed_s counts from now.mono_ms.
 * id is the requester's identity (borrowed; must be the agreement's
 * requester: GN_EPERM). max_spend_micro: the most it will ever accept in
 * total for this lease (0 = no cap): the machine releases the lease itself
 * ("spending cap reached": PERSIST, END, RELEASE) once its observation
 * reaches the last second s at which s + gn_bill_tolerance_s(s) seconds of
 * all its GPUs still cost at most the cap, so that an honest final invoice
 * is paid in full; a note or invoice beyond the cap is rejected ("spending
 * cap ..."). Emits PERSIST. */
int gn_lease_req_new(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len,
                     uint64_t max_spend_micro, gn_lease_now now, gn_lease_req **ret, gn_lease_out *out);
/* Rebuilds a requester machine from its newest persisted state: observed_s
 * restarts at now.utc_s - (our UTC of receipt), on our clock. */
int gn_lease_req_restore(const gn_identity *id, const uint8_t *agreement_env, size_t agreement_len,
                         const uint8_t *state, size_t state_len, gn_lease_now now, gn_lease_req **ret,
                         gn_lease_out *out);
gn_lease_req *gn_lease_req_free(gn_lease_req *m);

/* A message from the lease's provider: GN_MSG_DEBIT_NOTE or GN_MSG_INVOICE.
 * A note that continues our head and passes the check is accepted (PERSIST,
 * VOUCHER, SEND of the DEBIT_ACCEPT); one that continues the note before
 * our head (the provider missed our acceptance), or is the head itself, gets
 * our acceptance again; anything else is rejected with a reason (REJECTED,
 * SEND of the DEBIT_REJECT). The first final invoice that continues our
 * head is answered, once: countersigned if it passes, rejected if it fails
 * our observation or spending cap (PERSIST, END, SETTLED, SEND); one that
 * continues the note before our head gets our acceptance of the head again
 * (the provider seals it anew); any other (another lease's, a broken chain)
 * gets a rejection (SEND) that does not use up the one answer; the same
 * invoice again gets the same answer, another one a rejection; once the
 * final invoice is answered a note gets no answer (GN_ESTATE). Returns GN_EAUDIT when it rejected,
 * GN_EPROTO for what is not such a message for this lease, GN_EPERM for one
 * not signed by the agreement's provider (nothing sent for these). */
int gn_lease_req_recv(gn_lease_req *m, gn_lease_now now, const uint8_t *env, size_t len, gn_lease_out *out);
/* The user releases the lease: observation stops now, RELEASE is emitted and
 * repeated (resend interval) until the final invoice arrives. */
int gn_lease_req_release(gn_lease_req *m, gn_lease_now now, gn_lease_out *out);
/* The provider said the lease ended (a verified LEASE_END): observation
 * stops now; the final invoice is awaited. */
int gn_lease_req_ended(gn_lease_req *m, gn_lease_now now, const char *reason, gn_lease_out *out);
int gn_lease_req_peer(gn_lease_req *m, gn_lease_now now, bool up, gn_lease_out *out);
int gn_lease_req_timer(gn_lease_req *m, gn_lease_now now, gn_lease_out *out);
/* info.seconds is the observation at now. */
void gn_lease_req_info(const gn_lease_req *m, gn_lease_now now, gn_lease_info *ret);

#endif
