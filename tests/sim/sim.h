/* The deterministic overlay simulator: N gn_swim state machines (the same
 * code as the daemon's) in one process, driven from ONE seed by a priority
 * queue of datagram deliveries and timer ticks over a modelled network with
 * loss, delay, jitter, partitions and crashes. docs/overlay/simulator.md. */
#ifndef GN_SIM_H
#define GN_SIM_H

#include <gpunet/swim.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gn_sim gn_sim;

/* The network: every datagram is lost with probability loss, else delivered
 * after a delay uniform in [delay_min_ms, delay_max_ms] plus an exponential
 * jitter of mean jitter_mean_ms (capped at 8 times the mean). */
typedef struct gn_sim_net {
  double loss;
  uint32_t delay_min_ms;
  uint32_t delay_max_ms;
  uint32_t jitter_mean_ms;
} gn_sim_net;

/* A membership event seen by node `observer` about node `target`
 * (GN_SIM_NONE when the id is no node of the simulation). */
typedef void (*gn_sim_event_fn)(void *ud, gn_sim *sim, uint32_t observer, uint32_t target, const gn_swim_event *ev);

#define GN_SIM_NONE UINT32_MAX

/* A datagram about to be handed to node `to` (after loss and partitions). */
typedef void (*gn_sim_deliver_fn)(void *ud, gn_sim *sim, uint32_t from, uint32_t to, uint32_t type, const uint8_t *body,
                                  size_t len);

typedef struct gn_sim_totals {
  uint64_t sent, delivered, lost, cut, to_down, rejected, bytes;
} gn_sim_totals;

/* Room for `capacity` nodes (joined later with gn_sim_join); every node's
 * gn_swim gets cfg and a seed derived from seed and its index. */
int gn_sim_new(uint32_t capacity, uint64_t seed, const gn_swim_config *cfg, const gn_sim_net *net, gn_sim **ret);
gn_sim *gn_sim_free(gn_sim *sim);

void gn_sim_set_net(gn_sim *sim, const gn_sim_net *net);
void gn_sim_on_event(gn_sim *sim, gn_sim_event_fn fn, void *ud);
/* fn NULL removes it. */
void gn_sim_on_deliver(gn_sim *sim, gn_sim_deliver_fn fn, void *ud);

/* Starts node idx now and gn_swim_adds up to `seeds` distinct random nodes
 * that are up; each seed also learns the joiner, as both ends of the daemon's
 * bootstrap handshake do. */
int gn_sim_join(gn_sim *sim, uint32_t idx, uint32_t seeds);
/* Node idx stops sending and receiving now, for good (its state is freed). */
void gn_sim_crash(gn_sim *sim, uint32_t idx);
/* Until end_ms, datagrams between a node in `side` (count of them) and one
 * outside it are dropped. One partition at a time; a new one replaces it. */
int gn_sim_partition(gn_sim *sim, const uint32_t *side, uint32_t count, uint64_t end_ms);

/* Runs every event due at or before t_ms; the clock then reads t_ms. */
void gn_sim_run_until(gn_sim *sim, uint64_t t_ms);

uint64_t gn_sim_now(const gn_sim *sim);
uint32_t gn_sim_capacity(const gn_sim *sim);
bool gn_sim_up(const gn_sim *sim, uint32_t idx);
uint32_t gn_sim_up_count(const gn_sim *sim);
/* NULL when the node is not up. */
const gn_swim *gn_sim_swim(const gn_sim *sim, uint32_t idx);
const uint8_t *gn_sim_id(const gn_sim *sim, uint32_t idx);
/* The node an id belongs to, GN_SIM_NONE if none. */
uint32_t gn_sim_index_of(const gn_sim *sim, const uint8_t id[GN_PK_LEN]);
/* Bytes node idx received and sent, envelope overhead included. */
void gn_sim_node_bytes(const gn_sim *sim, uint32_t idx, uint64_t *ret_in, uint64_t *ret_out);
void gn_sim_totals_get(const gn_sim *sim, gn_sim_totals *ret);
/* A running hash of everything that happened (each delivery, tick and
 * membership event with its time): equal digests, equal runs. */
uint64_t gn_sim_digest(const gn_sim *sim);
/* Envelope bytes the daemon adds to a body of len bytes (version, type,
 * signer, bin headers, signature), measured on a real gn_envelope_seal. */
size_t gn_sim_overhead(const gn_sim *sim, size_t len);
/* A deterministic random number from the simulation's scenario stream. */
uint64_t gn_sim_rand(gn_sim *sim);
/* A random node that is up (from the same stream), GN_SIM_NONE if none. */
uint32_t gn_sim_random_up(gn_sim *sim);

/* The analytic Serf/memberlist convergence model, as serf's website
 * simulator computes it (website/source/assets/javascripts/_simulator.js):
 * every node gossips every interval to fanout random nodes; the fraction
 * reached after r rounds is 1 / (1 + (n+1) e^(-c n r)) with contact rate
 * c = fanout/n (1-loss) (1-fail) / 2 (fail: the fraction of nodes
 * failed). Returns the first whole round at or past
 * target (0.9999), -1 if none within 10,000. At 0.2 s a round this is the
 * issue's 2.2 s at 1k nodes and 2.8 s at 100k. */
double gn_sim_model_rounds(uint32_t n, double loss, double fail, uint32_t fanout, double target);
/* The plain push recursion x_{t+1} = 1 - (1-x_t)(1 - fanout(1-loss)/n)^(n x_t)
 * from x_0 = 1/n, whole rounds to target (faster than serf's curve: 1.8 s at
 * 1k nodes); printed beside it for reference. */
double gn_sim_model_push_rounds(uint32_t n, double loss, uint32_t fanout, double target);

#endif
