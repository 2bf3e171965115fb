/* The measured scenario: one timeline from one seed, each phase's figures
 * taken from the membership events the gn_swim instances report. */
#include "scenario.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

const char *const gn_sim_phase_names[GN_SIM_PH_COUNT] = {"warm-up", "steady (0% loss)", "loss", "partition",
                                                         "30% killed"};

#define STEP_MS 1000u /* how often the stop conditions are looked at */

typedef struct track {
  uint64_t total, done, need;
  uint64_t start_ms;
  int64_t *first_ms, *need_ms, *all_ms;
} track;

typedef struct scen {
  gn_sim_report *rep;
  int phase;
  uint8_t *crashed;    /* per node */
  uint8_t *false_seen; /* per node: bit per phase, declared DEAD while live */
  /* (a) */
  uint32_t crash_node;
  uint8_t *crash_knower; /* 1 pending, 2 done */
  track crash;
  /* (b) */
  uint32_t join_node;
  uint8_t *join_seen;  /* it stored the newcomer (JOIN event) */
  uint8_t *join_heard; /* a body carrying the newcomer's id reached it */
  uint32_t *heard_ms;  /* when (ms after the join), for the trace */
  uint8_t *heard_type; /* by which message type */
  bool join_open;      /* (b) is being measured */
  uint64_t join_at_ms;
  track join, heard;
  /* (e): per observer, the sorted killed nodes it held alive (CSR) */
  uint64_t *kill_off;
  uint32_t *kill_tgt;
  uint8_t *kill_done;
  track kill;
} scen;

void gn_sim_params_default(gn_sim_params *p, uint32_t nodes) {
  memset(p, 0, sizeof(*p));
  p->nodes = nodes;
  p->seed = 1;
  gn_swim_config_default(&p->swim);
  p->swim.max_members = 512;
  p->net.delay_min_ms = 10;
  p->net.delay_max_ms = 100;
  p->net.jitter_mean_ms = 5;
  p->join_seeds = 3;
  p->join_window_ms = 10000;
  p->warmup_max_ms = 600000;
  p->settle_ms = 10000;
  p->steady_ms = 20000;
  p->wait_factor = 2.0;
  p->join_phase = true;
  p->join_wait_ms = 60000;
  p->loss_phase = 0.10;
  p->loss_ms = 60000;
  p->partition_fraction = 0.10;
  p->partition_ms = 5000;
  p->kill_fraction = 0.30;
}

void gn_sim_params_ci(gn_sim_params *p) {
  p->settle_ms = 10000;
  p->steady_ms = 10000;
  p->wait_factor = 1.0;
  p->join_wait_ms = 10000;
  p->partition_fraction = 0;
  p->loss_ms = 30000;
}

static uint64_t need_of(uint64_t total) {
  return (total * 9999 + 9999) / 10000; /* ceil(99.99%) */
}

static void track_start(track *t, uint64_t total, uint64_t now, int64_t *first, int64_t *need, int64_t *all) {
  t->total = total;
  t->done = 0;
  t->need = need_of(total);
  t->start_ms = now;
  t->first_ms = first;
  t->need_ms = need;
  t->all_ms = all;
  *first = *need = *all = GN_SIM_NEVER;
  if (total == 0)
    *need = *all = 0;
}

static void track_hit(track *t, uint64_t now) {
  int64_t dt = (int64_t)(now - t->start_ms);
  if (t->done++ == 0)
    *t->first_ms = dt;
  if (t->done == t->need)
    *t->need_ms = dt;
  if (t->done == t->total)
    *t->all_ms = dt;
}

static bool track_complete(const track *t) {
  return t->done >= t->total;
}

static bool kill_lookup(const scen *sc, uint32_t obs, uint32_t tgt, uint64_t *ret_pos) {
  uint64_t lo = sc->kill_off[obs], hi = sc->kill_off[obs + 1];
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (sc->kill_tgt[mid] < tgt)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < sc->kill_off[obs + 1] && sc->kill_tgt[lo] == tgt) {
    *ret_pos = lo;
    return true;
  }
  return false;
}

static void on_event(void *ud, gn_sim *sim, uint32_t obs, uint32_t tgt, const gn_swim_event *ev) {
  scen *sc = ud;
  gn_sim_report *r = sc->rep;
  uint64_t now = gn_sim_now(sim);
  if (tgt == GN_SIM_NONE) {
    r->unknown_events++;
    return;
  }
  switch (ev->kind) {
  case GN_SWIM_EV_DEAD:
    if (!sc->crashed[tgt]) {
      if (getenv("GN_SIM_TRACE") && r->false_dead[sc->phase] < 40)
        fprintf(stderr, "false DEAD t=%.3f phase %d obs %u tgt %u inc %u local %d (tgt inc now %u)\n", now / 1000.0,
                sc->phase, obs, tgt, ev->member.incarnation, ev->local,
                gn_sim_swim(sim, tgt) ? gn_swim_incarnation(gn_sim_swim(sim, tgt)) : 0);
      r->false_dead[sc->phase]++;
      r->false_dead_local[sc->phase] += ev->local;
      if (!(sc->false_seen[tgt] & (1u << sc->phase))) {
        sc->false_seen[tgt] |= (uint8_t)(1u << sc->phase);
        r->false_dead_nodes[sc->phase]++;
      }
      break;
    }
    if (tgt == sc->crash_node && sc->crash_knower && sc->crash_knower[obs] == 1) {
      sc->crash_knower[obs] = 2;
      track_hit(&sc->crash, now);
    }
    uint64_t pos;
    if (sc->kill_off && kill_lookup(sc, obs, tgt, &pos) && !sc->kill_done[pos]) {
      sc->kill_done[pos] = 1;
      r->kill_detected++;
      track_hit(&sc->kill, now);
    }
    break;
  case GN_SWIM_EV_SUSPECT:
    if (!sc->crashed[tgt])
      r->suspect_live[sc->phase]++;
    break;
  case GN_SWIM_EV_ALIVE:
    if (sc->crashed[tgt])
      r->resurrections++;
    break;
  case GN_SWIM_EV_JOIN:
    if (tgt == sc->join_node && sc->join_open && obs != tgt && !sc->join_seen[obs]) {
      sc->join_seen[obs] = 1;
      r->join_reached++;
      track_hit(&sc->join, now);
    }
    break;
  case GN_SWIM_EV_LEFT:
    break;
  }
}

static void on_deliver(void *ud, gn_sim *sim, uint32_t from, uint32_t to, uint32_t type, const uint8_t *body,
                       size_t len) {
  scen *sc = ud;
  if (sc->join_heard[to] || to == sc->join_node)
    return;
  if (from == sc->join_node || memmem(body, len, gn_sim_id(sim, sc->join_node), GN_PK_LEN)) {
    sc->join_heard[to] = 1;
    sc->heard_ms[to] = (uint32_t)(gn_sim_now(sim) - sc->join_at_ms);
    sc->heard_type[to] = (uint8_t)type;
    sc->rep->join_heard++;
    track_hit(&sc->heard, gn_sim_now(sim));
  }
}

static bool holds_alive(const gn_sim *sim, uint32_t obs, uint32_t tgt) {
  gn_swim_member m;
  if (gn_swim_get(gn_sim_swim(sim, obs), gn_sim_id(sim, tgt), &m) < 0)
    return false;
  return m.state == GN_SWIM_ALIVE || m.state == GN_SWIM_SUSPECT;
}

static bool holds_suspect(const gn_sim *sim, uint32_t obs, uint32_t tgt) {
  gn_swim_member m;
  return gn_swim_get(gn_sim_swim(sim, obs), gn_sim_id(sim, tgt), &m) == 0 && m.state == GN_SWIM_SUSPECT;
}

/* Every node up holds as many ALIVE members as gossip alone can give it
 * and suspects nobody. Gossip (hearsay) may fill at most three quarters of a
 * table (docs/overlay/membership.md); the rest is taken by members heard from
 * directly, which comes much slower and is not waited for. */
static bool converged(const gn_sim *sim, const gn_sim_params *p, double *ret_mean, uint32_t *ret_min,
                      uint64_t *ret_suspects) {
  uint32_t up = gn_sim_up_count(sim), cap = gn_sim_capacity(sim);
  uint64_t want = up - 1, sum = 0;
  if (want > p->swim.max_members - p->swim.max_members / 4)
    want = p->swim.max_members - p->swim.max_members / 4;
  uint32_t mn = UINT32_MAX;
  uint64_t susp = 0;
  bool ok = true;
  for (uint32_t i = 0; i < cap; i++) {
    const gn_swim *s = gn_sim_swim(sim, i);
    if (!s)
      continue;
    size_t a = gn_swim_count(s, GN_SWIM_ALIVE);
    sum += a;
    if (a < mn)
      mn = (uint32_t)a;
    size_t su = gn_swim_count(s, GN_SWIM_SUSPECT);
    susp += su;
    if (a < want || su != 0)
      ok = false;
  }
  *ret_suspects = susp;
  *ret_mean = up ? (double)sum / up : 0;
  *ret_min = mn == UINT32_MAX ? 0 : mn;
  return ok;
}

static void bytes_total(const gn_sim *sim, uint64_t *ret_sum, uint64_t *per_node) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < gn_sim_capacity(sim); i++) {
    uint64_t in, out;
    gn_sim_node_bytes(sim, i, &in, &out);
    sum += in + out;
    if (per_node)
      per_node[i] = in + out;
  }
  *ret_sum = sum;
}

static uint64_t max_suspicion_ms(const gn_swim_config *cfg, uint32_t n) {
  double lg = log10(n > 10 ? (double)n : 10.0);
  return (uint64_t)ceil((double)cfg->suspicion_beta * cfg->suspicion_alpha * lg * cfg->probe_interval_ms);
}

int64_t gn_sim_detection_bound_ms(const gn_swim_config *cfg, uint32_t n) {
  /* Someone probes the crashed node within a few intervals (each of its
   * holders probes one member per interval); its probe and ping-req fail
   * within the interval; the suspicion then lasts at most
   * beta * alpha * log10(n) intervals (Lifeguard's upper bound, reached
   * when no other node confirms it); the DEAD update then rides
   * retransmit_mult * log10(n+1) messages per node, one round each at
   * worst. Each term is the worst case, so the bound is loose on purpose. */
  double rounds = 5.0 + (double)cfg->retransmit_mult * log10((double)n + 1.0) * 2.0;
  return (int64_t)(max_suspicion_ms(cfg, n) + (uint64_t)ceil(rounds * cfg->probe_interval_ms));
}

static uint64_t suspects(const gn_sim *sim) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < gn_sim_capacity(sim); i++)
    if (gn_sim_swim(sim, i))
      n += gn_swim_count(gn_sim_swim(sim, i), GN_SWIM_SUSPECT);
  return n;
}

/* Runs until no node suspects anyone (each suspicion refuted or turned into
 * a death), at most cap_ms: what a phase started is counted in that phase. */
static void run_until_quiet(gn_sim *sim, uint64_t cap_ms) {
  uint64_t end = gn_sim_now(sim) + cap_ms;
  do
    gn_sim_run_until(sim, gn_sim_now(sim) + STEP_MS);
  while (gn_sim_now(sim) < end && suspects(sim) > 0);
}

static void say(const gn_sim_params *p, const gn_sim *sim, const char *what) {
  if (!p->progress)
    return;
  fprintf(p->progress, "[sim t=%.1fs] %s\n", gn_sim_now(sim) / 1000.0, what);
  fflush(p->progress);
}

/* Kills kill_fraction of the nodes up at once; first records, for every
 * survivor, the victims it holds alive, so that each (survivor, victim) pair
 * is one detection to wait for. */
static int kill_phase(gn_sim *sim, const gn_sim_params *p, scen *sc) {
  gn_sim_report *r = sc->rep;
  uint32_t cap = gn_sim_capacity(sim), up = gn_sim_up_count(sim);
  uint32_t k = (uint32_t)(p->kill_fraction * up);
  uint8_t *victim = calloc(cap, 1);
  gn_swim_member *mem = calloc(p->swim.max_members ? p->swim.max_members : 1, sizeof(*mem));
  sc->kill_off = calloc((size_t)cap + 1, sizeof(*sc->kill_off));
  if (!victim || !mem || !sc->kill_off) {
    free(victim);
    free(mem);
    return GN_ENOMEM;
  }
  for (uint32_t got = 0; got < k;) {
    uint32_t v = gn_sim_random_up(sim);
    if (!victim[v]) {
      victim[v] = 1;
      got++;
    }
  }
  size_t cap_pairs = 0, n_pairs = 0;
  for (uint32_t o = 0; o < cap; o++) {
    sc->kill_off[o] = n_pairs;
    const gn_swim *s = gn_sim_swim(sim, o);
    if (!s || victim[o])
      continue;
    size_t m = gn_swim_members(s, mem, p->swim.max_members);
    if (m > p->swim.max_members)
      m = p->swim.max_members;
    size_t first = n_pairs;
    for (size_t j = 0; j < m; j++) {
      uint32_t t = gn_sim_index_of(sim, mem[j].id);
      if (t == GN_SIM_NONE || !victim[t] || (mem[j].state != GN_SWIM_ALIVE && mem[j].state != GN_SWIM_SUSPECT))
        continue;
      if (n_pairs == cap_pairs) {
        cap_pairs = cap_pairs ? cap_pairs * 2 : 1 << 16;
        uint32_t *t2 = realloc(sc->kill_tgt, cap_pairs * sizeof(*t2));
        if (!t2) {
          free(victim);
          free(mem);
          return GN_ENOMEM;
        }
        sc->kill_tgt = t2;
      }
      sc->kill_tgt[n_pairs++] = t;
    }
    /* insertion sort: a node holds at most max_members */
    for (size_t a = first + 1; a < n_pairs; a++) {
      uint32_t v = sc->kill_tgt[a];
      size_t b = a;
      for (; b > first && sc->kill_tgt[b - 1] > v; b--)
        sc->kill_tgt[b] = sc->kill_tgt[b - 1];
      sc->kill_tgt[b] = v;
    }
  }
  sc->kill_off[cap] = n_pairs;
  free(mem);
  sc->kill_done = calloc(n_pairs ? n_pairs : 1, 1);
  if (!sc->kill_done) {
    free(victim);
    return GN_ENOMEM;
  }
  r->killed = k;
  r->kill_pairs = n_pairs;
  sc->phase = GN_SIM_PH_KILL;
  for (uint32_t v = 0; v < cap; v++)
    if (victim[v]) {
      sc->crashed[v] = 1;
      gn_sim_crash(sim, v);
    }
  free(victim);
  track_start(&sc->kill, n_pairs, gn_sim_now(sim), &r->kill_first_ms, &r->kill_9999_ms, &r->kill_100_ms);
  r->kill_bound_ms = gn_sim_detection_bound_ms(&p->swim, up - k);
  uint64_t t0 = gn_sim_now(sim);
  bool at_bound = false;
  for (uint32_t step = 1;
       !track_complete(&sc->kill) && gn_sim_now(sim) < t0 + (uint64_t)(p->wait_factor * r->kill_bound_ms); step++) {
    gn_sim_run_until(sim, gn_sim_now(sim) + STEP_MS);
    if (!at_bound && gn_sim_now(sim) >= t0 + (uint64_t)r->kill_bound_ms) {
      r->kill_at_bound = sc->kill.done;
      at_bound = true;
    }
    if (p->progress && getenv("GN_SIM_TRACE")) {
      uint64_t susp = 0;
      for (uint32_t o = 0; o < cap; o++)
        for (uint64_t i = sc->kill_off[o]; gn_sim_up(sim, o) && i < sc->kill_off[o + 1]; i++)
          susp += !sc->kill_done[i] && holds_suspect(sim, o, sc->kill_tgt[i]);
      fprintf(p->progress, "[sim t=%.1fs] kill: %llu of %llu pairs detected, %llu suspect\n", gn_sim_now(sim) / 1000.0,
              (unsigned long long)sc->kill.done, (unsigned long long)n_pairs, (unsigned long long)susp);
    }
    /* Pairs whose holder dropped the victim without a DEAD, looked at every
     * 10 s (a million pairs at 10,000 nodes). */
    if (step % 10)
      continue;
    for (uint32_t o = 0; o < cap; o++)
      for (uint64_t i = sc->kill_off[o]; i < sc->kill_off[o + 1]; i++)
        if (!sc->kill_done[i] && !holds_alive(sim, o, sc->kill_tgt[i])) {
          sc->kill_done[i] = 1;
          r->kill_dropped++;
          r->kill_detected++;
          track_hit(&sc->kill, gn_sim_now(sim));
        }
  }
  if (!at_bound)
    r->kill_at_bound = sc->kill.done;
  /* Until the suspicions the kill started are settled, for late false
   * detections; then what is still believed alive (a holder may also have
   * dropped a victim silently). */
  run_until_quiet(sim, max_suspicion_ms(&p->swim, up - k));
  for (uint32_t o = 0; o < cap; o++)
    for (uint64_t i = sc->kill_off[o]; gn_sim_up(sim, o) && i < sc->kill_off[o + 1]; i++)
      if (!sc->kill_done[i] && holds_alive(sim, o, sc->kill_tgt[i])) {
        r->kill_alive_end++;
        r->kill_suspect_end += holds_suspect(sim, o, sc->kill_tgt[i]);
      }
  return 0;
}

int gn_sim_scenario_run(const gn_sim_params *p, gn_sim_report *ret) {
  if (!p || !ret || p->nodes < 2 || p->swim.max_members < 2)
    return GN_EINVAL;
  struct timespec w0, w1;
  clock_gettime(CLOCK_MONOTONIC, &w0);
  gn_sim_report *r = calloc(1, sizeof(*r));
  scen sc = {.rep = r, .crash_node = GN_SIM_NONE, .join_node = GN_SIM_NONE};
  uint32_t cap = p->nodes + 1; /* the last one joins in phase (b) */
  gn_sim *sim = NULL;
  uint64_t *bytes0 = NULL, *bytes1 = NULL;
  uint32_t *side = NULL;
  int rc = r ? 0 : GN_ENOMEM;
  if (rc < 0)
    goto out;
  sc.crashed = calloc(cap, 1);
  sc.false_seen = calloc(cap, 1);
  sc.crash_knower = calloc(cap, 1);
  sc.join_seen = calloc(cap, 1);
  sc.join_heard = calloc(cap, 1);
  sc.heard_ms = calloc(cap, sizeof(uint32_t));
  sc.heard_type = calloc(cap, 1);
  bytes0 = calloc(cap, sizeof(*bytes0));
  bytes1 = calloc(cap, sizeof(*bytes1));
  if (!sc.crashed || !sc.false_seen || !sc.crash_knower || !sc.join_seen || !sc.join_heard || !sc.heard_ms ||
      !sc.heard_type || !bytes0 || !bytes1) {
    rc = GN_ENOMEM;
    goto out;
  }
  if ((rc = gn_sim_new(cap, p->seed, &p->swim, &p->net, &sim)) < 0)
    goto out;
  gn_sim_on_event(sim, on_event, &sc);
  r->nodes = p->nodes;
  r->max_members = p->swim.max_members;
  r->seed = p->seed;
  r->overhead_small = gn_sim_overhead(sim, 0);
  r->overhead_mid = gn_sim_overhead(sim, 256);

  /* Bootstrap: node i joins at i * window / n through join_seeds random
   * nodes already up; then wait until every table is full. */
  sc.phase = GN_SIM_PH_WARMUP;
  for (uint32_t i = 0; i < p->nodes; i++) {
    gn_sim_run_until(sim, (uint64_t)p->join_window_ms * i / p->nodes);
    if ((rc = gn_sim_join(sim, i, p->join_seeds)) < 0)
      goto out;
  }
  say(p, sim, "all nodes joined");
  for (uint32_t step = 1; gn_sim_now(sim) < p->warmup_max_ms; step++) {
    gn_sim_run_until(sim, gn_sim_now(sim) + STEP_MS);
    uint64_t susp;
    if (converged(sim, p, &r->members_mean, &r->members_min, &susp)) {
      r->converged = true;
      break;
    }
    if (p->progress && step % 10 == 0)
      fprintf(p->progress, "[sim t=%.1fs] warming up: members per node mean %.1f min %u, %llu suspicions\n",
              gn_sim_now(sim) / 1000.0, r->members_mean, r->members_min, (unsigned long long)susp);
  }
  r->converged_ms = gn_sim_now(sim);
  say(p, sim, r->converged ? "converged" : "did not converge");
  if (p->progress) {
    /* Figures as they come, for runs too long to wait for the report. */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(p->progress, "  members per node mean %.1f min %u (max_members %u); peak RSS %.2f GB\n", r->members_mean,
            r->members_min, p->swim.max_members, ru.ru_maxrss / 1048576.0);
  }

  /* (c) steady state: settle, then count every node's bytes over a window. */
  sc.phase = GN_SIM_PH_STEADY;
  gn_sim_run_until(sim, gn_sim_now(sim) + p->settle_ms);
  gn_sim_totals t0, t1;
  uint64_t sum0, sum1;
  gn_sim_totals_get(sim, &t0);
  bytes_total(sim, &sum0, bytes0);
  gn_sim_run_until(sim, gn_sim_now(sim) + p->steady_ms);
  gn_sim_totals_get(sim, &t1);
  bytes_total(sim, &sum1, bytes1);
  double secs = p->steady_ms / 1000.0, up = gn_sim_up_count(sim);
  /* Each datagram is counted twice, once out and once in (if delivered). */
  uint64_t dgrams = (t1.sent - t0.sent) + (t1.delivered - t0.delivered);
  r->bytes_node_s = (double)(sum1 - sum0) / up / secs;
  r->bytes_node_s_ip = ((double)(sum1 - sum0) + 28.0 * dgrams) / up / secs;
  r->msgs_node_s = dgrams / up / secs;
  for (uint32_t i = 0; i < cap; i++)
    if ((bytes1[i] - bytes0[i]) / secs > r->bytes_node_s_max)
      r->bytes_node_s_max = (bytes1[i] - bytes0[i]) / secs;
  say(p, sim, "steady-state bandwidth measured");
  if (p->progress)
    fprintf(p->progress, "  %.1f kbit/s per node in+out (envelopes included), busiest %.1f\n",
            r->bytes_node_s * 8 / 1000, r->bytes_node_s_max * 8 / 1000);

  /* (a) one node crashes; its holders must declare it DEAD. */
  sc.crash_node = gn_sim_random_up(sim);
  r->crash_node = sc.crash_node;
  for (uint32_t o = 0; o < cap; o++)
    if (o != sc.crash_node && gn_sim_up(sim, o) && holds_alive(sim, o, sc.crash_node)) {
      sc.crash_knower[o] = 1;
      r->crash_knowers++;
    }
  sc.crashed[sc.crash_node] = 1;
  gn_sim_crash(sim, sc.crash_node);
  track_start(&sc.crash, r->crash_knowers, gn_sim_now(sim), &r->crash_first_ms, &r->crash_9999_ms, &r->crash_100_ms);
  r->crash_bound_ms = gn_sim_detection_bound_ms(&p->swim, p->nodes);
  uint64_t tc = gn_sim_now(sim);
  while (!track_complete(&sc.crash) && gn_sim_now(sim) < tc + (uint64_t)(p->wait_factor * r->crash_bound_ms)) {
    gn_sim_run_until(sim, gn_sim_now(sim) + STEP_MS);
    /* A holder may also drop it without a DEAD (a bounded table evicts
     * hearsay): it no longer believes it alive, which is what counts. */
    for (uint32_t o = 0; o < cap; o++)
      if (sc.crash_knower[o] == 1 && !holds_alive(sim, o, sc.crash_node)) {
        sc.crash_knower[o] = 2;
        r->crash_dropped++;
        track_hit(&sc.crash, gn_sim_now(sim));
      }
    if (p->progress && getenv("GN_SIM_TRACE")) {
      uint32_t susp = 0, hist[4][4] = {{0}};
      for (uint32_t o = 0; o < cap; o++) {
        susp += sc.crash_knower[o] == 1 && gn_sim_up(sim, o) && holds_suspect(sim, o, sc.crash_node);
        gn_swim_member m;
        if (sc.crash_knower[o] && gn_sim_up(sim, o) &&
            gn_swim_get(gn_sim_swim(sim, o), gn_sim_id(sim, sc.crash_node), &m) == 0)
          hist[m.state][m.incarnation < 3 ? m.incarnation : 3]++;
      }
      for (int a = 0; a < 4; a++)
        fprintf(p->progress, "  st%d: %u %u %u %u\n", a, hist[a][0], hist[a][1], hist[a][2], hist[a][3]);
      fprintf(p->progress, "[sim t=%.1fs] crash: %llu of %u holders detected, %u suspect\n", gn_sim_now(sim) / 1000.0,
              (unsigned long long)sc.crash.done, r->crash_knowers, susp);
    }
  }
  r->crash_detected = sc.crash.done - r->crash_dropped;
  for (uint32_t o = 0; o < cap; o++)
    if (sc.crash_knower[o] == 1 && gn_sim_up(sim, o) && holds_alive(sim, o, sc.crash_node))
      r->crash_alive_end++;
  say(p, sim, "crash phase done");

  /* (b) a new node joins through join_seeds nodes; every node up is to hear. */
  if (p->join_phase) {
    sc.join_node = p->nodes;
    r->join_node = sc.join_node;
    r->join_denominator = gn_sim_up_count(sim);
    track_start(&sc.join, r->join_denominator, gn_sim_now(sim), &r->join_first_ms, &r->join_9999_ms, &r->join_100_ms);
    track_start(&sc.heard, r->join_denominator, gn_sim_now(sim), &r->heard_first_ms, &r->heard_9999_ms,
                &r->heard_100_ms);
    gn_sim_on_deliver(sim, on_deliver, &sc);
    sc.join_open = true;
    sc.join_at_ms = gn_sim_now(sim);
    if ((rc = gn_sim_join(sim, sc.join_node, p->join_seeds)) < 0)
      goto out;
    uint64_t tj = gn_sim_now(sim);
    while ((!track_complete(&sc.join) || !track_complete(&sc.heard)) && gn_sim_now(sim) < tj + p->join_wait_ms)
      gn_sim_run_until(sim, gn_sim_now(sim) + STEP_MS);
    gn_sim_on_deliver(sim, NULL, NULL);
    sc.join_open = false;
    if (p->progress && getenv("GN_SIM_TRACE")) {
      /* How many heard it by each 200 ms, and the last ten to hear it: when,
       * by which message type, held by how many. */
      uint32_t hist[64] = {0}, last[10], nl = 0;
      for (uint32_t o = 0; o < cap; o++) {
        if (!gn_sim_up(sim, o) || o == sc.join_node || !sc.join_heard[o])
          continue;
        uint32_t b = sc.heard_ms[o] / 200;
        hist[b < 63 ? b : 63]++;
        if (nl == 10 && sc.heard_ms[last[9]] >= sc.heard_ms[o])
          continue;
        uint32_t at = nl < 10 ? nl++ : 9;
        last[at] = o;
        for (uint32_t i = at; i > 0 && sc.heard_ms[last[i]] > sc.heard_ms[last[i - 1]]; i--) {
          uint32_t t = last[i];
          last[i] = last[i - 1];
          last[i - 1] = t;
        }
      }
      uint32_t cum = 0;
      for (uint32_t b = 0; b < 64; b++)
        if (hist[b]) {
          cum += hist[b];
          fprintf(p->progress, "  heard by %.1f s: %u\n", (b + 1) * 0.2, cum);
        }
      for (uint32_t i = 0; i < nl; i++) {
        uint32_t o = last[i], indeg = 0;
        for (uint32_t h = 0; h < cap; h++)
          indeg += h != o && gn_sim_up(sim, h) && holds_alive(sim, h, o);
        fprintf(p->progress, "  late: node %u heard at %u ms by type %u, held by %u\n", o, sc.heard_ms[o],
                sc.heard_type[o], indeg);
      }
      /* The nodes that never heard it, with how many live nodes hold each. */
      uint32_t shown = 0;
      for (uint32_t o = 0; o < cap && shown < 20; o++) {
        if (!gn_sim_up(sim, o) || o == sc.join_node || sc.join_heard[o])
          continue;
        uint32_t indeg = 0;
        for (uint32_t h = 0; h < cap; h++)
          indeg += h != o && gn_sim_up(sim, h) && holds_alive(sim, h, o);
        fprintf(p->progress, "  not heard: node %u, held by %u, holds %zu\n", o, indeg,
                gn_swim_count(gn_sim_swim(sim, o), GN_SWIM_ALIVE));
        shown++;
      }
    }
    say(p, sim, "join phase done");
  }

  /* (d) every datagram lost with probability loss_phase, then the loss
   * stops and the suspicions it started get time to end either way. */
  sc.phase = GN_SIM_PH_LOSS;
  gn_sim_net lossy = p->net;
  lossy.loss = p->loss_phase;
  gn_sim_set_net(sim, &lossy);
  gn_sim_run_until(sim, gn_sim_now(sim) + p->loss_ms);
  gn_sim_set_net(sim, &p->net);
  run_until_quiet(sim, max_suspicion_ms(&p->swim, p->nodes));
  say(p, sim, "loss phase done");

  /* A partition shorter than the shortest suspicion timeout: nobody may die. */
  sc.phase = GN_SIM_PH_PARTITION;
  uint32_t n_side = (uint32_t)(p->partition_fraction * gn_sim_up_count(sim));
  if (n_side && p->partition_ms) {
    side = calloc(n_side, sizeof(*side));
    if (!side) {
      rc = GN_ENOMEM;
      goto out;
    }
    for (uint32_t i = 0; i < n_side; i++)
      side[i] = gn_sim_random_up(sim);
    if ((rc = gn_sim_partition(sim, side, n_side, gn_sim_now(sim) + p->partition_ms)) < 0)
      goto out;
    gn_sim_run_until(sim, gn_sim_now(sim) + p->partition_ms);
    run_until_quiet(sim, max_suspicion_ms(&p->swim, p->nodes));
    say(p, sim, "partition phase done");
  }

  /* (e) */
  if (p->kill_fraction > 0) {
    if ((rc = kill_phase(sim, p, &sc)) < 0)
      goto out;
    say(p, sim, "kill phase done");
  }

  gn_sim_totals_get(sim, &r->totals);
  r->end_ms = gn_sim_now(sim);
  r->digest = gn_sim_digest(sim);
  clock_gettime(CLOCK_MONOTONIC, &w1);
  r->wall_s = (w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) / 1e9;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  r->rss_kib = ru.ru_maxrss;
  *ret = *r;
out:
  gn_sim_free(sim);
  free(side);
  free(bytes0);
  free(bytes1);
  free(sc.crashed);
  free(sc.false_seen);
  free(sc.crash_knower);
  free(sc.join_seen);
  free(sc.join_heard);
  free(sc.heard_ms);
  free(sc.heard_type);
  free(sc.kill_off);
  free(sc.kill_tgt);
  free(sc.kill_done);
  free(r);
  return rc;
}

bool gn_sim_report_same(const gn_sim_report *a, const gn_sim_report *b) {
  /* Field by field: padding bytes are not part of a struct's value. */
  bool same =
      a->nodes == b->nodes && a->max_members == b->max_members && a->seed == b->seed && a->converged == b->converged &&
      a->converged_ms == b->converged_ms && a->members_mean == b->members_mean && a->members_min == b->members_min &&
      a->bytes_node_s == b->bytes_node_s && a->bytes_node_s_max == b->bytes_node_s_max &&
      a->msgs_node_s == b->msgs_node_s && a->crash_node == b->crash_node && a->crash_knowers == b->crash_knowers &&
      a->crash_detected == b->crash_detected && a->crash_alive_end == b->crash_alive_end &&
      a->crash_first_ms == b->crash_first_ms && a->crash_9999_ms == b->crash_9999_ms &&
      a->crash_100_ms == b->crash_100_ms && a->join_reached == b->join_reached && a->join_9999_ms == b->join_9999_ms &&
      a->join_100_ms == b->join_100_ms && a->join_heard == b->join_heard && a->heard_9999_ms == b->heard_9999_ms &&
      a->heard_100_ms == b->heard_100_ms && a->resurrections == b->resurrections && a->killed == b->killed &&
      a->kill_pairs == b->kill_pairs && a->kill_dropped == b->kill_dropped && a->crash_dropped == b->crash_dropped &&
      a->kill_detected == b->kill_detected && a->kill_alive_end == b->kill_alive_end &&
      a->kill_suspect_end == b->kill_suspect_end && a->kill_at_bound == b->kill_at_bound &&
      a->kill_9999_ms == b->kill_9999_ms && a->kill_100_ms == b->kill_100_ms &&
      a->unknown_events == b->unknown_events && a->totals.sent == b->totals.sent &&
      a->totals.delivered == b->totals.delivered && a->totals.lost == b->totals.lost &&
      a->totals.cut == b->totals.cut && a->totals.rejected == b->totals.rejected &&
      a->totals.bytes == b->totals.bytes && a->end_ms == b->end_ms && a->digest == b->digest;
  for (int i = 0; i < GN_SIM_PH_COUNT; i++)
    same = same && a->false_dead[i] == b->false_dead[i] && a->false_dead_nodes[i] == b->false_dead_nodes[i] &&
           a->suspect_live[i] == b->suspect_live[i];
  return same;
}
