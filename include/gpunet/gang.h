/* Gang leases for `gpunet train` (issue 8, items 2 and 3): the requester's
 * I/O-free machine that leases N GPUs across several providers all or
 * nothing (billing/gang.c), and the planner that chooses which providers
 * (billing/plan.c). docs/protocol.md §2.13 states the protocol.
 *
 * Protocol: SIGN THEN RELEASE. Each member of a gang is an ordinary lease
 * (§2.2-§2.9): the machine asks the glue to send one LEASE_REQUEST per
 * member, every provider signs or refuses it as it would any lease, and the
 * group is ready only once every member agreed before its deadline. If one
 * refuses, does not answer in time, or its lease ends before the group is
 * ready, every lease already agreed is released at once (LEASE_RELEASE), a
 * request still unanswered gets a release too (so an acceptance already on
 * its way stops metering when it reaches the provider), and an agreement
 * that arrives after the group failed is released on arrival. No job starts
 * unless the group is ready. Each member is billed through its own lease
 * only: the seconds its provider metered between its agreement and the
 * release, checked by the requester's lease machine like any lease. No new
 * message and nothing new on the provider: a "hold" phase would need one
 * (and a provider that held could still refuse to commit, so the requester
 * would need the release path anyway).
 *
 * How the glue drives the machine (the same rules as <gpunet/lease.h>):
 * every entry point takes the monotonic time in ms and a gn_gang_out that it
 * empties first and fills with actions; the caller performs them IN ORDER,
 * then arms one timer at out.timer_at_ms (UINT64_MAX: none) that calls
 * gn_gang_timer. Inputs about a member name its lease id (the glue finds the
 * gang of an incoming LEASE_ACCEPT / LEASE_REJECT / LEASE_END with
 * gn_gang_lookup). An event for a lease id the gang never issued returns
 * GN_ENOTFOUND, one from another provider GN_EPERM; neither changes
 * anything. A duplicate returns 0 and does nothing.
 *
 * Restarts (--restarts K): when an agreed member is lost while the group
 * runs (its lease ended, its provider disappeared), every rank's job is
 * stopped; if restarts are left, the lost member is replaced by the next
 * spare offer (same GPU count, a provider not in the group, the group's
 * total price still within its maximum) and the group is ready again once
 * the replacement agreed (the other members keep their leases meanwhile); a
 * spare that refuses or does not answer is followed by the next one; with
 * no restart or spare left the group fails and every lease is released. A
 * rank whose job failed while its lease lives restarts the group on the same
 * leases (one restart used). */
#ifndef GPUNET_GANG_H
#define GPUNET_GANG_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* At most this many members (providers) in one gang, and spare offers. */
#define GN_GANG_MAX_MEMBERS 64u
#define GN_GANG_MAX_SPARES 64u
/* Every lease id a gang issues is kept (to release a late agreement): one
 * per member and one per spare, since each spare is asked at most once. */
#define GN_GANG_MAX_ATTEMPTS (GN_GANG_MAX_MEMBERS + GN_GANG_MAX_SPARES)
/* One call returns at most this many actions (a failure releases every
 * member after a round of replacement requests). */
#define GN_GANG_MAX_ACTIONS (2u * GN_GANG_MAX_MEMBERS + 4u)
/* The time a member has to answer its request. */
#define GN_GANG_TIMEOUT_MIN_MS 100u
#define GN_GANG_TIMEOUT_MAX_MS 600000u

/* One offer a member leases from: gpus GPUs of provider's offer_id at
 * price_uper_hour per GPU-hour (the price its LEASE_REQUEST asks). */
typedef struct gn_gang_offer {
  uint8_t provider[GN_PK_LEN];
  char offer_id[24];
  uint32_t gpus; /* 1..GN_LEASE_MAX_GPUS (16) */
  uint64_t price_uper_hour;
} gn_gang_offer;

typedef struct gn_gang_opts {
  /* Each request must be answered within this (GN_GANG_TIMEOUT_MIN_MS..MAX). */
  uint64_t answer_timeout_ms;
  /* --restarts K: how often the group may restart after a lost member or a
   * failed rank. Spares are only used by restarts. */
  uint32_t restarts;
  /* The group's total price per hour (sum of gpus * price) may not exceed
   * this; 0 = no maximum. The members' total must already be within it; a
   * replacement that would pass it is not asked. */
  uint64_t max_total_uper_hour;
} gn_gang_opts;

enum gn_gang_act_kind {
  /* Send a LEASE_REQUEST with lease id lease_id for offer to its provider.
   * member is the slot it fills (the group's node index: ranks
   * member*gpus..). If the request cannot be sent, report
   * gn_gang_no_answer. */
  GN_GANG_ACT_REQUEST = 1,
  /* Release lease_id. agreed: we hold its agreement (the glue started a
   * requester lease machine for it: gn_lease_req_release, which repeats
   * the release until the final invoice arrives and checks that invoice).
   * !agreed: the request is unanswered: send one bare LEASE_RELEASE so that
   * an acceptance already made stops metering when it arrives (a provider
   * ignores a release of a lease it does not have); an agreement that still
   * comes is released again, as agreed. */
  GN_GANG_ACT_RELEASE,
  /* Every member agreed: start (restart > 0: restart from the last
   * checkpoint) the ranks on every member. Never emitted unless every
   * member's current lease is agreed and not lost. */
  GN_GANG_ACT_READY,
  /* The group left READY: stop every rank's job now (before any REQUEST or
   * RELEASE that follows in the same call). */
  GN_GANG_ACT_STOP_JOBS,
  /* The group failed; reason names the first cause. Per member reasons:
   * gn_gang_member. The RELEASE actions come before it in the same call. */
  GN_GANG_ACT_FAILED,
};

typedef struct gn_gang_action {
  int kind;   /* enum gn_gang_act_kind */
  int member; /* REQUEST, RELEASE: the slot; -1 for group actions */
  char lease_id[24];
  gn_gang_offer offer; /* REQUEST, RELEASE */
  bool agreed;         /* RELEASE */
  uint32_t restart;    /* READY: 0 the first time, then the restart's number */
  char reason[160];    /* RELEASE, STOP_JOBS, FAILED: printable */
} gn_gang_action;

typedef struct gn_gang_out {
  gn_gang_action act[GN_GANG_MAX_ACTIONS];
  size_t n;
  /* Call gn_gang_timer when the monotonic clock reaches this (earlier or
   * more often does no harm). UINT64_MAX: nothing is due. */
  uint64_t timer_at_ms;
} gn_gang_out;

enum gn_gang_phase {
  GN_GANG_FORMING = 1, /* requests out, not every member agreed */
  GN_GANG_READY,       /* every member agreed: the ranks run */
  GN_GANG_RESTARTING,  /* a member was lost; its replacement is asked */
  GN_GANG_FAILED,      /* all released; no job */
  GN_GANG_ENDED,       /* released by the user (gn_gang_release) */
};

enum gn_gang_member_state {
  GN_GANG_M_REQUESTED = 1, /* asked, no answer yet */
  GN_GANG_M_AGREED,        /* its agreement arrived in time */
  GN_GANG_M_REFUSED,       /* its provider refused */
  GN_GANG_M_NO_ANSWER,     /* no answer in time, or unreachable */
  GN_GANG_M_LOST,          /* agreed, then its lease ended or its provider went */
  GN_GANG_M_RELEASED,      /* agreed (maybe late), then released by us */
  GN_GANG_M_ABANDONED,     /* unanswered when the group failed or ended */
};

typedef struct gn_gang gn_gang;

/* Starts a gang: members[0..n-1] (1..GN_GANG_MAX_MEMBERS, each provider at
 * most once among members and spares), spares[0..n_spares-1] in the order
 * they are to be tried. seed: 32 random bytes from which the lease ids are
 * derived ("l-" + 16 hex digits, distinct), so a simulator replays them.
 * Emits one REQUEST per member and the timer. GN_EINVAL for a bad offer,
 * option or a duplicate provider, GN_ETOOBIG over a bound (nothing emitted,
 * *ret untouched). */
int gn_gang_new(const gn_gang_offer *members, size_t n, const gn_gang_offer *spares, size_t n_spares,
                const gn_gang_opts *opts, const uint8_t seed[32], uint64_t now_ms, gn_gang **ret, gn_gang_out *out);
gn_gang *gn_gang_free(gn_gang *g);

/* The agreement of lease_id arrived from provider and passed the glue's
 * checks (it embeds our request; the glue holds a requester lease machine
 * for it from now on). In time: the member agreed; the last one makes the
 * group READY. Late (the member refused or timed out, the group failed or
 * ended, the slot was given to a replacement): RELEASE (agreed) at once. */
int gn_gang_accepted(gn_gang *g, uint64_t now_ms, const char *lease_id, const uint8_t provider[GN_PK_LEN],
                     gn_gang_out *out);
/* provider refused lease_id (LEASE_REJECT) with reason. Forming: the group
 * fails (all released). Restarting: the next spare is asked. GN_ESTATE if
 * the member had already agreed (a refusal does not undo an agreement;
 * report a LEASE_END with gn_gang_lost). */
int gn_gang_refused(gn_gang *g, uint64_t now_ms, const char *lease_id, const uint8_t provider[GN_PK_LEN],
                    const char *reason, gn_gang_out *out);
/* lease_id's request cannot be answered (the provider cannot be reached,
 * the request could not be sent): as a timeout, now. */
int gn_gang_no_answer(gn_gang *g, uint64_t now_ms, const char *lease_id, const char *reason, gn_gang_out *out);
/* lease_id's lease ended (LEASE_END, the provider gone past its grace) or
 * its provider went before answering. Agreed member: lost (RELEASE of its
 * lease, harmless if it already ended); forming: the group fails; ready:
 * STOP_JOBS, then a replacement (restarts and spares left) or failure. An
 * unanswered member: as gn_gang_no_answer. */
int gn_gang_lost(gn_gang *g, uint64_t now_ms, const char *lease_id, const char *reason, gn_gang_out *out);
/* A rank of member failed while its lease lives (READY only, else
 * GN_ESTATE): STOP_JOBS, then READY again on the same leases if a restart
 * is left, else the group fails. */
int gn_gang_job_failed(gn_gang *g, uint64_t now_ms, size_t member, const char *reason, gn_gang_out *out);
/* The user ends the group (gpunet stop, the job finished): STOP_JOBS if it
 * ran, every agreed lease released, unanswered requests abandoned (a bare
 * release); ENDED. 0 and nothing if it already failed or ended. */
int gn_gang_release(gn_gang *g, uint64_t now_ms, const char *reason, gn_gang_out *out);
/* Does what is due at now: requests past their deadline are timeouts. */
int gn_gang_timer(gn_gang *g, uint64_t now_ms, gn_gang_out *out);

typedef struct gn_gang_info {
  int phase; /* enum gn_gang_phase */
  uint32_t members;
  uint32_t agreed; /* members whose current lease is agreed */
  uint32_t restarts_used;
  uint32_t spares_left;
  uint64_t total_uper_hour; /* the current members' sum of gpus * price */
  char reason[160];         /* FAILED/ENDED: why */
} gn_gang_info;
void gn_gang_info_get(const gn_gang *g, gn_gang_info *ret);

typedef struct gn_gang_member_info {
  gn_gang_offer offer; /* of its current lease */
  char lease_id[24];
  int state;                               /* enum gn_gang_member_state */
  bool agreed;                             /* its current lease's agreement arrived (even if since released or lost) */
  uint64_t accepted_at_ms, released_at_ms; /* 0 if none */
  uint32_t attempts;                       /* leases asked for this slot (1 + replacements) */
  char reason[160];                        /* refused/no answer/lost/released: why */
} gn_gang_member_info;
/* Member i (0..members-1): its current lease. GN_EINVAL if out of range. */
int gn_gang_member(const gn_gang *g, size_t i, gn_gang_member_info *ret);
/* Whether lease_id was issued by this gang (current or earlier lease of a
 * slot): 0 and *ret_member set, else GN_ENOTFOUND. */
int gn_gang_lookup(const gn_gang *g, const char *lease_id, size_t *ret_member);

/* Persistence: the glue stores gn_gang_save's bytes (at most a few tens of
 * KiB) after every call that changed the gang, before it performs that
 * call's actions (so no lease id is sent that a crash could forget), and
 * rebuilds the gang with gn_gang_restore after a restart. A gang restored
 * while FORMING or RESTARTING fails at once ("the requester restarted before
 * every member agreed": RELEASE of every agreed lease, a bare one of every
 * unanswered request, FAILED): deadlines do not survive the process and no
 * rank runs. A READY one stays READY; a FAILED or ENDED one still releases
 * late agreements. GN_EINVAL for bytes that are not a gang state (nothing
 * built). */
int gn_gang_save(const gn_gang *g, gn_buf *ret);
int gn_gang_restore(const uint8_t *state, size_t len, uint64_t now_ms, gn_gang **ret, gn_gang_out *out);

/* --- the planner -------------------------------------------------------------
 *
 * Chooses the providers of a gang: N GPUs as N/K nodes of K GPUs each, one
 * offer per provider, minimising the worst round-trip time between two
 * chosen nodes among the sets whose total price per hour is acceptable,
 * then the total price, then the candidates' order. A pure function with
 * bounded work: at most GN_PLAN_MAX_CANDIDATES candidates; a greedy pass
 * from every start gives a first set, then a branch-and-bound search over
 * the candidates (cheapest first) proves it optimal or improves it within
 * max_steps (plan.exact says whether it finished). */

#define GN_PLAN_MAX_CANDIDATES 64u
#define GN_PLAN_MAX_NODES GN_GANG_MAX_MEMBERS
#define GN_PLAN_DEFAULT_STEPS 2000000u
/* An RTT not measured. */
#define GN_RTT_UNKNOWN UINT32_MAX

typedef struct gn_plan_candidate {
  uint8_t provider[GN_PK_LEN];
  char offer_id[24];
  uint32_t gpus_free;       /* GPUs the offer has free */
  uint64_t price_uper_hour; /* per GPU-hour */
  uint32_t rtt_ms;          /* requester -> candidate, or GN_RTT_UNKNOWN */
} gn_plan_candidate;

typedef struct gn_plan_request {
  uint32_t gpus;                /* --gpus N, >= 1 */
  uint32_t per_node;            /* --per-node K (1..16, divides N); 0: the planner tries every K that divides N */
  uint64_t max_total_uper_hour; /* the group's price per hour at most; 0 = none */
  uint64_t max_steps;           /* search budget; 0 = GN_PLAN_DEFAULT_STEPS */
} gn_plan_request;

/* How the RTT of a pair is known. */
enum gn_rtt_kind {
  GN_RTT_MEASURED = 0, /* measured between the two (the larger of both directions) */
  GN_RTT_ESTIMATED,    /* not measured: the sum of both RTTs to the requester (a path through it) */
  GN_RTT_NONE,         /* unknown: ranked worse than any known RTT */
};

typedef struct gn_plan {
  uint32_t n;                       /* nodes chosen */
  uint32_t per_node;                /* GPUs leased from each */
  uint32_t gpus;                    /* n * per_node */
  uint16_t cand[GN_PLAN_MAX_NODES]; /* chosen candidates (indices), in plan order */
  uint64_t total_uper_hour;         /* sum of per_node * price */
  uint32_t worst_rtt_ms;            /* worst pair (GN_RTT_UNKNOWN: a pair is unknown); 0 for one node */
  int worst_kind;                   /* enum gn_rtt_kind of that pair */
  uint16_t worst_a, worst_b;        /* its plan positions */
  /* The pairs among the chosen (plan positions), as ranked: rtt_ms[i][i] = 0. */
  uint32_t rtt_ms[GN_PLAN_MAX_NODES][GN_PLAN_MAX_NODES];
  uint8_t rtt_kind[GN_PLAN_MAX_NODES][GN_PLAN_MAX_NODES];
  bool exact;     /* the search finished: no acceptable set has a smaller (worst, price) */
  uint64_t steps; /* search steps used */
  /* Other candidates with per_node GPUs free, providers not in the plan,
   * best first (their worst RTT to the chosen, then price): the gang's
   * spares for --restarts. */
  uint32_t n_spares;
  uint16_t spares[GN_PLAN_MAX_CANDIDATES];
} gn_plan;

/* Chooses a plan from c[0..n-1] and rtt_ms (n*n, row i = from candidate i,
 * GN_RTT_UNKNOWN entries allowed, the diagonal ignored; NULL = none
 * measured). 0 and *ret written. Otherwise why (if not NULL) says what does
 * not fit, for a user: GN_EINVAL (bad request: N = 0, K does not divide N,
 * K > 16), GN_ETOOBIG (over GN_PLAN_MAX_CANDIDATES candidates, or N/K over
 * GN_PLAN_MAX_NODES nodes), GN_ENOTFOUND (not enough providers with K free
 * GPUs, or none within the price). */
int gn_plan_choose(const gn_plan_candidate *c, size_t n, const uint32_t *rtt_ms, const gn_plan_request *req,
                   gn_plan *ret, char *why, size_t why_cap);
/* The plan's members and spares as gang offers (ret_members: plan->n,
 * ret_spares: plan->n_spares entries; either may be NULL). */
void gn_plan_gang_offers(const gn_plan *p, const gn_plan_candidate *c, gn_gang_offer *ret_members,
                         gn_gang_offer *ret_spares);

#endif
