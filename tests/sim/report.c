/* Prints a scenario's figures beside the analytic Serf/memberlist model at
 * the same number of nodes and loss, with the ratio and whether the issue's
 * goals are met. */
#include "scenario.h"

#include <math.h>

#define MODEL_INTERVAL_S 0.2
#define MODEL_FANOUT 3
#define MODEL_PACKET 1400.0
/* Serf's simulator: fanout packets of 1400 B every interval, sent and as
 * many received: 3 * 1400 * 5 * 2 = 42,000 B/s = 336 kbit/s. */
#define MODEL_BYTES_S (MODEL_PACKET * MODEL_FANOUT / MODEL_INTERVAL_S * 2.0)

static double model_s(uint32_t n, double loss, double fail) {
  double r = gn_sim_model_rounds(n, loss, fail, MODEL_FANOUT, 0.9999);
  return r < 0 ? -1 : r * MODEL_INTERVAL_S;
}

static double push_s(uint32_t n, double loss) {
  double r = gn_sim_model_push_rounds(n, loss, MODEL_FANOUT, 0.9999);
  return r < 0 ? -1 : r * MODEL_INTERVAL_S;
}

static const char *ms_str(char *buf, size_t cap, int64_t ms) {
  if (ms < 0)
    snprintf(buf, cap, "never");
  else
    snprintf(buf, cap, "%.2f s", ms / 1000.0);
  return buf;
}

static void row_time(FILE *f, const char *what, int64_t ms, double model) {
  char b[32], m[32], ratio[32];
  snprintf(m, sizeof(m), "%.1f s", model);
  if (ms >= 0 && model > 0)
    snprintf(ratio, sizeof(ratio), "%.2fx", ms / 1000.0 / model);
  else
    snprintf(ratio, sizeof(ratio), "-");
  fprintf(f, "  %-52s %12s %10s %8s\n", what, ms_str(b, sizeof(b), ms), model > 0 ? m : "-", ratio);
}

static const char *yes(bool b) {
  return b ? "MET" : "NOT MET";
}

void gn_sim_report_print(FILE *f, const gn_sim_report *r, const gn_sim_params *p, bool host) {
  char b1[32], b2[32];
  const gn_swim_config *c = &p->swim;
  uint32_t n = r->nodes;
  fprintf(f, "gpunet overlay simulator: %u nodes, seed %llu\n", n, (unsigned long long)r->seed);
  fprintf(f,
          "swim: probe %u ms, probe timeout %u ms, k=%u, suspicion alpha %u beta %u, lambda %u, "
          "max_members %u, max_datagram %u B\n",
          c->probe_interval_ms, c->probe_timeout_ms, c->indirect_k, c->suspicion_alpha, c->suspicion_beta,
          c->retransmit_mult, c->max_members, c->max_datagram);
  fprintf(f, "network: one-way delay %u-%u ms uniform + exponential jitter of mean %u ms (capped at 8x)\n",
          p->net.delay_min_ms, p->net.delay_max_ms, p->net.jitter_mean_ms);
  fprintf(f,
          "bytes: each body plus the %zu B (bodies < 256 B) or %zu B envelope the daemon adds, measured on a real\n"
          "  gn_envelope_seal. The simulator does not sign each datagram: it runs the same state machine, and the\n"
          "  daemon's glue checks signatures (CPU, no bytes beyond the overhead counted). IPv4+UDP headers (28 B)\n"
          "  are not in the main figure (nor in the model's 1400-byte packets); shown separately.\n",
          r->overhead_small, r->overhead_mid);
  fprintf(f, "model: serf's convergence simulator at the same n and loss: 3 random nodes every 0.2 s, 1400-byte\n"
             "  packets, 336 kbit/s per node in+out (push recursion for reference in brackets)\n");
  fprintf(f,
          "warm-up: %s at t=%.1f s (%u nodes joined over %.0f s through %u seeds each), members per node: "
          "mean %.1f, min %u\n\n",
          r->converged ? "converged" : "NOT converged", r->converged_ms / 1000.0, n, p->join_window_ms / 1000.0,
          p->join_seeds, r->members_mean, r->members_min);

  fprintf(f, "  %-52s %12s %10s %8s\n", "figure", "measured", "model", "ratio");
  double m0 = model_s(n, 0, 0);
  fprintf(f,
          "(a) one node crashed; of the %u live nodes holding it, %u declared it DEAD, %u dropped it without\n"
          "    a DEAD (both count as detected), %u still held it alive when the phase ended:\n",
          r->crash_knowers, r->crash_detected, r->crash_dropped, r->crash_alive_end);
  row_time(f, "first DEAD anywhere (probe + suspicion timeout)", r->crash_first_ms, -1);
  row_time(f, "detected at 99.99% (from the crash)", r->crash_9999_ms, m0);
  row_time(f, "detected at 100% (from the crash)", r->crash_100_ms, m0);
  int64_t diss = r->crash_9999_ms >= 0 && r->crash_first_ms >= 0 ? r->crash_9999_ms - r->crash_first_ms : -1;
  row_time(f, "dissemination only: first DEAD -> 99.99% detected", diss, m0);
  fprintf(f, "  %-52s %12s\n", "bound asserted by the CI test", ms_str(b1, sizeof(b1), r->crash_bound_ms));
  if (p->join_phase) {
    fprintf(f,
            "(b) a new member's JOIN/alive update reaching the %u live nodes (stands in for the dissemination\n"
            "    of an offer announcement through the same gossip; the offers themselves travel over the\n"
            "    partial views). Heard: a body carrying its id arrived (%u nodes); stored: the node's table\n"
            "    took it in, its JOIN event (%u nodes):\n",
            r->join_denominator, r->join_heard, r->join_reached);
    row_time(f, "heard at 99.99%", r->heard_9999_ms, m0);
    row_time(f, "heard at 100%", r->heard_100_ms, m0);
    row_time(f, "stored at 99.99%", r->join_9999_ms, m0);
    row_time(f, "stored at 100%", r->join_100_ms, m0);
  } else {
    fprintf(f, "(b) not run here (scripts/bench/overlay runs it)\n");
  }
  double model_bits = MODEL_BYTES_S * 8 / 1000.0, bits = r->bytes_node_s * 8 / 1000.0;
  fprintf(f, "(c) steady state, per node, in+out:\n");
  fprintf(f, "  %-52s %7.1f kbit/s %6.0f kbit/s %7.3fx\n", "bandwidth (envelopes included)", bits, model_bits,
          bits / model_bits);
  fprintf(f, "  %-52s %7.1f kbit/s\n", "  with IPv4+UDP headers", r->bytes_node_s_ip * 8 / 1000.0);
  fprintf(f, "  %-52s %7.1f kbit/s\n", "  busiest node", r->bytes_node_s_max * 8 / 1000.0);
  fprintf(f, "  %-52s %7.2f /s\n", "  datagrams", r->msgs_node_s);
  fprintf(f, "(d) live nodes declared DEAD (events anywhere / distinct nodes / by own timeout; suspicions):\n");
  for (int i = 0; i < GN_SIM_PH_COUNT; i++)
    fprintf(f, "  %-52s %6llu / %u / %llu; %llu\n", gn_sim_phase_names[i], (unsigned long long)r->false_dead[i],
            r->false_dead_nodes[i], (unsigned long long)r->false_dead_local[i], (unsigned long long)r->suspect_live[i]);
  fprintf(f, "  (loss phase: %.0f%% of datagrams lost for %.0f s; partition: %.0f%% of nodes cut off for %.1f s)\n",
          p->loss_phase * 100, p->loss_ms / 1000.0, p->partition_fraction * 100, p->partition_ms / 1000.0);
  fprintf(f, "  model at %.0f%% loss: %.1f s to 99.99%% [push %.1f s]\n", p->loss_phase * 100,
          model_s(n, p->loss_phase, 0), push_s(n, p->loss_phase));
  fprintf(f,
          "(e) %u nodes (%.0f%%) killed at once; %llu (live holder, victim) pairs, %llu detected (%llu\n"
          "    of them dropped without a DEAD),"
          " %llu still held alive at the end (%llu of them SUSPECT):\n",
          r->killed, p->kill_fraction * 100, (unsigned long long)r->kill_pairs, (unsigned long long)r->kill_detected,
          (unsigned long long)r->kill_dropped, (unsigned long long)r->kill_alive_end,
          (unsigned long long)r->kill_suspect_end);
  double mk = model_s(n, 0, p->kill_fraction);
  row_time(f, "first detected (DEAD, or dropped: looked at every 10 s)", r->kill_first_ms, -1);
  row_time(f, "detected at 99.99% of pairs", r->kill_9999_ms, mk);
  row_time(f, "detected at 100% of pairs", r->kill_100_ms, mk);
  fprintf(f, "  %-52s %.2f%% (%llu s)\n", "detected within the bound",
          r->kill_pairs ? 100.0 * (double)r->kill_at_bound / (double)r->kill_pairs : 0.0,
          (unsigned long long)(r->kill_bound_ms / 1000));
  fprintf(f, "  %-52s %llu (%u nodes)\n", "live nodes declared DEAD meanwhile",
          (unsigned long long)r->false_dead[GN_SIM_PH_KILL], r->false_dead_nodes[GN_SIM_PH_KILL]);
  fprintf(f, "  model [push] at 0%% loss: %.1f s [%.1f s], with %.0f%% failed: %.1f s\n\n", m0, push_s(n, 0),
          p->kill_fraction * 100, mk);

  uint64_t false_all = 0;
  for (int i = 0; i < GN_SIM_PH_COUNT; i++)
    false_all += r->false_dead[i];
  bool conv = diss >= 0 && r->heard_9999_ms >= 0 && diss / 1000.0 <= m0 && r->heard_9999_ms / 1000.0 <= m0;
  fprintf(f, "goals (issue 9):\n");
  fprintf(f, "  same convergence as the model (DEAD dissemination and JOIN heard by 99.99%% <= %.1f s): %s\n", m0,
          yes(conv));
  fprintf(f, "  a third of the model's bandwidth (<= %.0f kbit/s): %.1f kbit/s: %s\n", model_bits / 3, bits,
          yes(bits <= model_bits / 3));
  fprintf(f, "  no live node declared dead (all phases): %llu: %s\n", (unsigned long long)false_all,
          yes(false_all == 0));
  fprintf(f,
          "\ntotals: %llu datagrams sent, %llu delivered, %llu lost, %llu cut by the partition, %llu to\n"
          "  crashed nodes, %llu rejected by gn_swim_on_datagram; %llu events about unknown ids;\n"
          "  %llu crashed nodes seen alive again; simulated %s\n",
          (unsigned long long)r->totals.sent, (unsigned long long)r->totals.delivered,
          (unsigned long long)r->totals.lost, (unsigned long long)r->totals.cut, (unsigned long long)r->totals.to_down,
          (unsigned long long)r->totals.rejected, (unsigned long long)r->unknown_events,
          (unsigned long long)r->resurrections, ms_str(b2, sizeof(b2), (int64_t)r->end_ms));
  fprintf(f, "digest: %016llx (same seed, same digest)\n", (unsigned long long)r->digest);
  if (host)
    fprintf(f, "host (not part of the result): %.1f s wall, peak RSS %.1f MiB\n", r->wall_s, r->rss_kib / 1024.0);
}
