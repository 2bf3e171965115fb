/* The overlay scenario the simulator measures (docs/overlay/simulator.md):
 * bootstrap and warm-up, steady-state bandwidth, one crash, one join, a
 * phase of 10% loss, a short partition, then 30% of the nodes killed at
 * once; and its printed report beside the Serf/memberlist model. */
#ifndef GN_SIM_SCENARIO_H
#define GN_SIM_SCENARIO_H

#include "sim.h"

#include <stdio.h>

enum {
  GN_SIM_PH_WARMUP,    /* bootstrap and warm-up, no loss */
  GN_SIM_PH_STEADY,    /* steady state, one crash, one join, no loss */
  GN_SIM_PH_LOSS,      /* loss_phase of every datagram lost */
  GN_SIM_PH_PARTITION, /* a partition shorter than the suspicion timeout */
  GN_SIM_PH_KILL,      /* kill_fraction of the nodes killed at once */
  GN_SIM_PH_COUNT,
};

extern const char *const gn_sim_phase_names[GN_SIM_PH_COUNT];

typedef struct gn_sim_params {
  uint32_t nodes;
  uint64_t seed;
  gn_swim_config swim;
  gn_sim_net net;            /* the network outside the loss phase (loss 0) */
  uint32_t join_seeds;       /* gn_swim_add of this many random joined nodes (3) */
  uint32_t join_window_ms;   /* the nodes join evenly spread over this */
  uint32_t warmup_max_ms;    /* give up converging after this */
  uint32_t settle_ms;        /* after convergence, before measuring */
  uint32_t steady_ms;        /* the bandwidth window */
  double wait_factor;        /* (a) and (e) wait this many times their bound at most */
  bool join_phase;           /* run (b) */
  uint32_t join_wait_ms;     /* how long (b) waits for every node to hear */
  double loss_phase;         /* 0.10 */
  uint32_t loss_ms;          /* how long the loss lasts */
  double partition_fraction; /* of the nodes cut off from the rest (0 skips) */
  uint32_t partition_ms;     /* how long */
  double kill_fraction;      /* 0.30 */
  FILE *progress;            /* a line per phase, or NULL */
} gn_sim_params;

/* The defaults for n nodes: seed 1, gn_swim's defaults with max_members
 * 512, delay 10-100 ms uniform plus 5 ms mean jitter. */
void gn_sim_params_default(gn_sim_params *p, uint32_t nodes);

/* The ctests' shorter timeline over p (what the assertions need, and no
 * more: CI has 2 busy cores): 10 s of settling and of bandwidth, phases
 * waiting at most their bound, a 10 s join phase, 30 s of loss, no
 * partition. The bench (scripts/bench/overlay) runs the whole scenario. */
void gn_sim_params_ci(gn_sim_params *p);

#define GN_SIM_NEVER (-1)

typedef struct gn_sim_report {
  uint32_t nodes, max_members;
  uint64_t seed;
  size_t overhead_small, overhead_mid;
  /* warm-up */
  bool converged;
  uint64_t converged_ms; /* sim time when every node held its full table */
  double members_mean;   /* ALIVE members per node then */
  uint32_t members_min;
  /* (c) steady state */
  double bytes_node_s;     /* in+out per node per second, envelopes included */
  double bytes_node_s_ip;  /* the same with 28 B of IPv4+UDP per datagram */
  double msgs_node_s;      /* datagrams in+out per node per second */
  double bytes_node_s_max; /* the busiest node's */
  /* (a) one crash; times from the crash, GN_SIM_NEVER if not reached */
  uint32_t crash_node, crash_knowers;
  uint32_t crash_detected;  /* holders that declared it DEAD */
  uint32_t crash_dropped;   /* holders that dropped it from their table without a DEAD */
  uint32_t crash_alive_end; /* holders still holding it ALIVE or SUSPECT when the phase ended */
  int64_t crash_first_ms, crash_9999_ms, crash_100_ms;
  int64_t crash_bound_ms;
  /* (b) one join; times from the join. Heard: a datagram body carrying
   * the newcomer's id reached the node (whether or not its table took it
   * in); reached: the node stored it as a member (its JOIN event). */
  uint32_t join_node, join_denominator, join_reached, join_heard;
  int64_t join_first_ms, join_9999_ms, join_100_ms;
  int64_t heard_first_ms, heard_9999_ms, heard_100_ms;
  /* (d) live nodes declared DEAD (events anywhere, distinct nodes), per phase */
  uint64_t false_dead[GN_SIM_PH_COUNT];
  uint32_t false_dead_nodes[GN_SIM_PH_COUNT];
  uint64_t false_dead_local[GN_SIM_PH_COUNT];
  uint64_t suspect_live[GN_SIM_PH_COUNT];
  uint64_t resurrections; /* a crashed node seen ALIVE again after it was declared DEAD */
  /* (e) kill_fraction at once; times from the kill */
  uint32_t killed;
  uint64_t kill_pairs;       /* (live observer, killed node it held alive) */
  uint64_t kill_detected;    /* of those, declared DEAD or dropped by the holder */
  uint64_t kill_dropped;     /* of those, dropped by the holder without a DEAD */
  uint64_t kill_alive_end;   /* still held ALIVE or SUSPECT when the phase ended */
  uint64_t kill_suspect_end; /* of those, SUSPECT */
  uint64_t kill_at_bound;    /* pairs detected by kill_bound_ms after the kill */
  int64_t kill_first_ms, kill_9999_ms, kill_100_ms, kill_bound_ms;
  uint64_t unknown_events; /* about ids that are no node: a bug if not 0 */
  gn_sim_totals totals;
  uint64_t end_ms;
  uint64_t digest;
  /* Host-dependent, not part of the result (excluded from comparisons). */
  double wall_s;
  long rss_kib;
} gn_sim_report;

int gn_sim_scenario_run(const gn_sim_params *p, gn_sim_report *ret);
/* True when two reports of the same parameters are identical (host figures aside). */
bool gn_sim_report_same(const gn_sim_report *a, const gn_sim_report *b);
/* The bound for a crash to be declared DEAD everywhere: the longest
 * suspicion timeout plus the probe rounds before it and the dissemination
 * rounds after it. docs/overlay/simulator.md. */
int64_t gn_sim_detection_bound_ms(const gn_swim_config *cfg, uint32_t n);
/* Prints the figures and the model side by side; host figures only if host. */
void gn_sim_report_print(FILE *f, const gn_sim_report *r, const gn_sim_params *p, bool host);

#endif
