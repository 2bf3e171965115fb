/* The simulator's core: nodes, the event queue, the network model and the
 * byte accounting. Everything random comes from the one seed, and events due
 * at the same millisecond run in the order they were queued, so a run
 * replays exactly. */
#include "sim.h"

#include <gpunet/wire.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK UINT32_MAX /* sim_ev.from of a timer tick */

typedef struct sim_ev {
  uint64_t at_ms;
  uint64_t seq;
  uint32_t node; /* who receives the datagram, or whose timer it is */
  uint32_t from; /* sender, TICK for a timer */
  uint32_t type;
  uint32_t len;
  uint8_t *body;
} sim_ev;

typedef struct sim_node {
  gn_sim *sim;
  gn_swim *swim; /* NULL until joined, and again once crashed */
  uint32_t idx;
  uint8_t id[GN_PK_LEN];
  char addr[24];
  uint64_t tick_at; /* the earliest tick queued for it, UINT64_MAX if none */
  uint64_t bytes_in, bytes_out;
  bool crashed;
  bool side; /* in the partitioned set */
} sim_node;

struct gn_sim {
  uint32_t cap, up;
  uint64_t seed;
  uint64_t now_ms;
  uint64_t seq;
  uint64_t net_rng[4], scen_rng[4];
  gn_swim_config cfg;
  gn_sim_net net;
  sim_node *nodes;
  uint32_t *up_list, *up_pos; /* the nodes up, in any order, and where each sits */
  sim_ev *heap;
  size_t heap_len, heap_cap;
  uint64_t part_end_ms; /* partition active while now < this */
  gn_sim_event_fn on_event;
  void *on_event_ud;
  gn_sim_deliver_fn on_deliver;
  void *on_deliver_ud;
  gn_sim_totals tot;
  uint64_t digest;
  size_t ov_small, ov_mid, ov_big; /* envelope bytes around bodies of < 256, < 65536, more */
};

/* --- randomness: splitmix64 seeds xoshiro256** streams ---------------------*/

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void rng_seed(uint64_t s[4], uint64_t seed) {
  for (int i = 0; i < 4; i++)
    s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4]) {
  uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}

/* Uniform in [0, 1). */
static double rng_unit(uint64_t s[4]) {
  return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

static uint64_t rng_below(uint64_t s[4], uint64_t n) {
  return n ? rng_next(s) % n : 0;
}

static void mix(gn_sim *sim, uint64_t v) {
  sim->digest = (sim->digest ^ v) * 0x100000001b3ull;
  sim->digest ^= sim->digest >> 29;
}

/* --- the queue: a binary heap ordered by (time, sequence) -----------------*/

static bool ev_before(const sim_ev *a, const sim_ev *b) {
  return a->at_ms < b->at_ms || (a->at_ms == b->at_ms && a->seq < b->seq);
}

static int heap_push(gn_sim *sim, sim_ev ev) {
  if (sim->heap_len == sim->heap_cap) {
    size_t cap = sim->heap_cap ? sim->heap_cap * 2 : 4096;
    sim_ev *h = realloc(sim->heap, cap * sizeof(*h));
    if (!h)
      return GN_ENOMEM;
    sim->heap = h;
    sim->heap_cap = cap;
  }
  ev.seq = sim->seq++;
  size_t i = sim->heap_len++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!ev_before(&ev, &sim->heap[p]))
      break;
    sim->heap[i] = sim->heap[p];
    i = p;
  }
  sim->heap[i] = ev;
  return 0;
}

static sim_ev heap_pop(gn_sim *sim) {
  sim_ev top = sim->heap[0], last = sim->heap[--sim->heap_len];
  size_t i = 0, n = sim->heap_len;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n)
      break;
    if (c + 1 < n && ev_before(&sim->heap[c + 1], &sim->heap[c]))
      c++;
    if (!ev_before(&sim->heap[c], &last))
      break;
    sim->heap[i] = sim->heap[c];
    i = c;
  }
  if (n)
    sim->heap[i] = last;
  return top;
}

/* --- addresses: node i lives at 10.(i>>16).(i>>8).(i&255):7946 ------------*/

static uint32_t addr_index(const gn_sim *sim, const char *addr) {
  unsigned a, b, c, d, port;
  char tail;
  if (sscanf(addr, "%u.%u.%u.%u:%u%c", &a, &b, &c, &d, &port, &tail) != 5 || a != 10 || b > 255 || c > 255 || d > 255 ||
      port != 7946)
    return GN_SIM_NONE;
  uint32_t idx = (b << 16) | (c << 8) | d;
  return idx < sim->cap ? idx : GN_SIM_NONE;
}

/* --- the node's I/O -------------------------------------------------------*/

static void node_reschedule(sim_node *n, bool after_tick) {
  gn_sim *sim = n->sim;
  if (!n->swim)
    return;
  uint64_t d = gn_swim_next_deadline_ms(n->swim);
  if (d == UINT64_MAX)
    return;
  /* A deadline already past after a tick would run the same instant
   * forever; one millisecond later is the earliest the loop could do. */
  uint64_t floor_ms = after_tick ? sim->now_ms + 1 : sim->now_ms;
  if (d < floor_ms)
    d = floor_ms;
  if (d >= n->tick_at)
    return;
  sim_ev ev = {.at_ms = d, .node = n->idx, .from = TICK};
  if (heap_push(sim, ev) == 0)
    n->tick_at = d;
}

static void node_send(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  sim_node *n = ud;
  gn_sim *sim = n->sim;
  size_t wire = len + gn_sim_overhead(sim, len);
  n->bytes_out += wire;
  sim->tot.sent++;
  sim->tot.bytes += wire;
  uint32_t to = addr_index(sim, addr);
  if (to == GN_SIM_NONE) {
    sim->tot.to_down++;
    return;
  }
  /* Both draws are taken for every datagram, so that changing the loss
   * rate does not shift the delays of the others. */
  double u = rng_unit(sim->net_rng);
  double delay = sim->net.delay_min_ms + rng_unit(sim->net_rng) * (sim->net.delay_max_ms - sim->net.delay_min_ms);
  if (sim->net.jitter_mean_ms) {
    double j = -log(1.0 - rng_unit(sim->net_rng)) * sim->net.jitter_mean_ms;
    delay += j < 8.0 * sim->net.jitter_mean_ms ? j : 8.0 * sim->net.jitter_mean_ms;
  }
  if (u < sim->net.loss) {
    sim->tot.lost++;
    return;
  }
  if (sim->now_ms < sim->part_end_ms && n->side != sim->nodes[to].side) {
    sim->tot.cut++;
    return;
  }
  sim_ev ev = {
      .at_ms = sim->now_ms + (uint64_t)(delay + 0.5), .node = to, .from = n->idx, .type = type, .len = (uint32_t)len};
  ev.body = malloc(len ? len : 1);
  if (!ev.body)
    return;
  memcpy(ev.body, body, len);
  if (heap_push(sim, ev) < 0)
    free(ev.body);
}

static void node_event(void *ud, const gn_swim_event *ev) {
  sim_node *n = ud;
  gn_sim *sim = n->sim;
  uint32_t target = gn_sim_index_of(sim, ev->member.id);
  mix(sim, sim->now_ms);
  mix(sim, ((uint64_t)n->idx << 32) | target);
  mix(sim, ((uint64_t)ev->kind << 40) | ((uint64_t)ev->local << 32) | ev->member.incarnation);
  if (sim->on_event)
    sim->on_event(sim->on_event_ud, sim, n->idx, target, ev);
}

/* --- the simulation -------------------------------------------------------*/

static int measure_overhead(gn_sim *sim) {
  gn_identity *id = NULL;
  gn_buf b = {0};
  uint8_t *body = calloc(1, 65536);
  int r = body ? gn_identity_generate(&id) : GN_ENOMEM;
  if (r < 0)
    goto out;
  const size_t lens[3] = {0, 256, 65536};
  size_t *ovs[3] = {&sim->ov_small, &sim->ov_mid, &sim->ov_big};
  for (int i = 0; i < 3; i++) {
    b.len = 0;
    if ((r = gn_envelope_seal(id, GN_MSG_SWIM_PING, body, lens[i], &b)) < 0)
      goto out;
    *ovs[i] = b.len - lens[i];
  }
out:
  gn_buf_done(&b);
  gn_identity_free(id);
  free(body);
  return r;
}

int gn_sim_new(uint32_t capacity, uint64_t seed, const gn_swim_config *cfg, const gn_sim_net *net, gn_sim **ret) {
  if (!capacity || capacity > (1u << 24) || !net || net->delay_max_ms < net->delay_min_ms || !ret)
    return GN_EINVAL;
  gn_sim *sim = calloc(1, sizeof(*sim));
  if (!sim)
    return GN_ENOMEM;
  sim->nodes = calloc(capacity, sizeof(*sim->nodes));
  sim->up_list = calloc(capacity, sizeof(*sim->up_list));
  sim->up_pos = calloc(capacity, sizeof(*sim->up_pos));
  int r = sim->nodes && sim->up_list && sim->up_pos ? measure_overhead(sim) : GN_ENOMEM;
  if (r < 0) {
    free(sim->nodes);
    free(sim->up_list);
    free(sim->up_pos);
    free(sim);
    return r;
  }
  sim->cap = capacity;
  sim->seed = seed;
  if (cfg)
    sim->cfg = *cfg;
  else
    gn_swim_config_default(&sim->cfg);
  sim->net = *net;
  sim->digest = 0xcbf29ce484222325ull;
  rng_seed(sim->net_rng, seed ^ 0x6e6574776f726b00ull);
  rng_seed(sim->scen_rng, seed ^ 0x7363656e6172696full);
  uint64_t ids = seed ^ 0x6964656e74697479ull;
  for (uint32_t i = 0; i < capacity; i++) {
    sim_node *n = &sim->nodes[i];
    n->sim = sim;
    n->idx = i;
    n->tick_at = UINT64_MAX;
    /* The index in the first four bytes makes id -> node O(1); the rest
     * is random so the ids look like keys to whatever hashes them. */
    n->id[0] = (uint8_t)(i >> 24);
    n->id[1] = (uint8_t)(i >> 16);
    n->id[2] = (uint8_t)(i >> 8);
    n->id[3] = (uint8_t)i;
    for (int k = 4; k < GN_PK_LEN; k += 8) {
      uint64_t v = splitmix64(&ids);
      memcpy(n->id + k, &v, GN_PK_LEN - k < 8 ? (size_t)(GN_PK_LEN - k) : 8);
    }
    snprintf(n->addr, sizeof(n->addr), "10.%u.%u.%u:7946", (i >> 16) & 255, (i >> 8) & 255, i & 255);
  }
  *ret = sim;
  return 0;
}

gn_sim *gn_sim_free(gn_sim *sim) {
  if (!sim)
    return NULL;
  for (uint32_t i = 0; i < sim->cap; i++)
    gn_swim_free(sim->nodes[i].swim);
  for (size_t i = 0; i < sim->heap_len; i++)
    free(sim->heap[i].body);
  free(sim->heap);
  free(sim->nodes);
  free(sim->up_list);
  free(sim->up_pos);
  free(sim);
  return NULL;
}

void gn_sim_set_net(gn_sim *sim, const gn_sim_net *net) {
  sim->net = *net;
}

void gn_sim_on_event(gn_sim *sim, gn_sim_event_fn fn, void *ud) {
  sim->on_event = fn;
  sim->on_event_ud = ud;
}

void gn_sim_on_deliver(gn_sim *sim, gn_sim_deliver_fn fn, void *ud) {
  sim->on_deliver = fn;
  sim->on_deliver_ud = ud;
}

int gn_sim_join(gn_sim *sim, uint32_t idx, uint32_t seeds) {
  if (idx >= sim->cap || sim->nodes[idx].swim || sim->nodes[idx].crashed)
    return GN_EINVAL;
  sim_node *n = &sim->nodes[idx];
  gn_swim_io io = {.send = node_send, .event = node_event, .ud = n};
  uint64_t s = sim->seed ^ ((uint64_t)idx * 0xd1b54a32d192ed03ull);
  int r = gn_swim_new(n->id, n->addr, &sim->cfg, &io, splitmix64(&s), sim->now_ms, &n->swim);
  if (r < 0)
    return r;
  mix(sim, 0x6a6f696eull ^ idx);
  /* Seeds are drawn among the nodes already up; with few of them up,
   * every one is taken. */
  uint32_t want = seeds < sim->up ? seeds : sim->up, got = 0;
  uint32_t chosen[16];
  if (want > GN_ARRAY_SIZE(chosen))
    want = GN_ARRAY_SIZE(chosen);
  while (got < want) {
    uint32_t c = sim->up_list[rng_below(sim->scen_rng, sim->up)];
    bool dup = false;
    for (uint32_t k = 0; k < got; k++)
      dup |= chosen[k] == c;
    if (!dup)
      chosen[got++] = c;
  }
  sim->up_pos[idx] = sim->up;
  sim->up_list[sim->up++] = idx;
  for (uint32_t k = 0; k < got; k++) {
    sim_node *seed = &sim->nodes[chosen[k]];
    gn_swim_add(n->swim, seed->id, seed->addr, sim->now_ms);
    gn_swim_add(seed->swim, n->id, n->addr, sim->now_ms);
    node_reschedule(seed, false);
  }
  node_reschedule(n, false);
  return 0;
}

void gn_sim_crash(gn_sim *sim, uint32_t idx) {
  if (idx >= sim->cap || !sim->nodes[idx].swim)
    return;
  sim_node *n = &sim->nodes[idx];
  n->swim = gn_swim_free(n->swim);
  n->crashed = true;
  n->tick_at = UINT64_MAX;
  uint32_t pos = sim->up_pos[idx], last = sim->up_list[--sim->up];
  sim->up_list[pos] = last;
  sim->up_pos[last] = pos;
  mix(sim, 0x6372617368ull ^ idx);
}

int gn_sim_partition(gn_sim *sim, const uint32_t *side, uint32_t count, uint64_t end_ms) {
  for (uint32_t i = 0; i < count; i++)
    if (side[i] >= sim->cap)
      return GN_EINVAL;
  for (uint32_t i = 0; i < sim->cap; i++)
    sim->nodes[i].side = false;
  for (uint32_t i = 0; i < count; i++)
    sim->nodes[side[i]].side = true;
  sim->part_end_ms = end_ms;
  return 0;
}

static void run_event(gn_sim *sim, sim_ev *ev) {
  sim_node *n = &sim->nodes[ev->node];
  if (ev->from == TICK) {
    if (!n->swim || n->tick_at != ev->at_ms)
      return; /* superseded by an earlier tick, or the node is gone */
    n->tick_at = UINT64_MAX;
    mix(sim, (ev->at_ms << 20) ^ ev->node);
    gn_swim_tick(n->swim, sim->now_ms);
    node_reschedule(n, true);
    return;
  }
  if (!n->swim) {
    sim->tot.to_down++;
    return;
  }
  const sim_node *from = &sim->nodes[ev->from];
  n->bytes_in += ev->len + gn_sim_overhead(sim, ev->len);
  sim->tot.delivered++;
  mix(sim, (ev->at_ms << 20) ^ ((uint64_t)ev->from << 40) ^ ev->node ^ ((uint64_t)ev->type << 32) ^ ev->len);
  if (sim->on_deliver)
    sim->on_deliver(sim->on_deliver_ud, sim, ev->from, ev->node, ev->type, ev->body, ev->len);
  if (gn_swim_on_datagram(n->swim, from->addr, from->id, ev->type, ev->body, ev->len, sim->now_ms) < 0)
    sim->tot.rejected++;
  node_reschedule(n, false);
}

void gn_sim_run_until(gn_sim *sim, uint64_t t_ms) {
  while (sim->heap_len && sim->heap[0].at_ms <= t_ms) {
    sim_ev ev = heap_pop(sim);
    sim->now_ms = ev.at_ms;
    run_event(sim, &ev);
    free(ev.body);
  }
  if (t_ms > sim->now_ms)
    sim->now_ms = t_ms;
}

uint64_t gn_sim_now(const gn_sim *sim) {
  return sim->now_ms;
}

uint32_t gn_sim_capacity(const gn_sim *sim) {
  return sim->cap;
}

bool gn_sim_up(const gn_sim *sim, uint32_t idx) {
  return idx < sim->cap && sim->nodes[idx].swim;
}

uint32_t gn_sim_up_count(const gn_sim *sim) {
  return sim->up;
}

const gn_swim *gn_sim_swim(const gn_sim *sim, uint32_t idx) {
  return idx < sim->cap ? sim->nodes[idx].swim : NULL;
}

const uint8_t *gn_sim_id(const gn_sim *sim, uint32_t idx) {
  return sim->nodes[idx].id;
}

uint32_t gn_sim_index_of(const gn_sim *sim, const uint8_t id[GN_PK_LEN]) {
  uint32_t i = ((uint32_t)id[0] << 24) | ((uint32_t)id[1] << 16) | ((uint32_t)id[2] << 8) | id[3];
  if (i >= sim->cap || memcmp(sim->nodes[i].id, id, GN_PK_LEN) != 0)
    return GN_SIM_NONE;
  return i;
}

void gn_sim_node_bytes(const gn_sim *sim, uint32_t idx, uint64_t *ret_in, uint64_t *ret_out) {
  *ret_in = sim->nodes[idx].bytes_in;
  *ret_out = sim->nodes[idx].bytes_out;
}

void gn_sim_totals_get(const gn_sim *sim, gn_sim_totals *ret) {
  *ret = sim->tot;
}

uint64_t gn_sim_digest(const gn_sim *sim) {
  return sim->digest;
}

size_t gn_sim_overhead(const gn_sim *sim, size_t len) {
  return len < 256 ? sim->ov_small : len < 65536 ? sim->ov_mid : sim->ov_big;
}

uint64_t gn_sim_rand(gn_sim *sim) {
  return rng_next(sim->scen_rng);
}

uint32_t gn_sim_random_up(gn_sim *sim) {
  return sim->up ? sim->up_list[rng_below(sim->scen_rng, sim->up)] : GN_SIM_NONE;
}

/* --- the analytic model ---------------------------------------------------*/

double gn_sim_model_rounds(uint32_t n, double loss, double fail, uint32_t fanout, double target) {
  /* Serf's website simulator (website/source/assets/javascripts/
   * _simulator.js): a logistic curve with contact rate
   * fanout/n * (1-loss) * (1-fail) * 0.5, sampled once per round; the time shown is
   * the first whole round at or past the target. That reproduces the
   * issue's 2.2 s at 1k nodes and 2.8 s at 100k (interval 0.2 s). */
  if (n < 2 || fanout == 0 || loss >= 1.0 || fail >= 1.0)
    return -1;
  double contact = (double)fanout / n * (1.0 - loss) * (1.0 - fail) * 0.5;
  for (int round = 0; round < 10000; round++) {
    double x = 1.0 / (1.0 + (n + 1.0) * exp(-contact * n * round));
    if (x >= target)
      return round;
  }
  return -1;
}

double gn_sim_model_push_rounds(uint32_t n, double loss, uint32_t fanout, double target) {
  if (n < 2 || fanout == 0 || loss >= 1.0)
    return -1;
  double x = 1.0 / n, miss = 1.0 - (double)fanout * (1.0 - loss) / n;
  if (miss < 0)
    miss = 0;
  for (int round = 0; round < 10000; round++) {
    if (x >= target)
      return round;
    x = 1.0 - (1.0 - x) * pow(miss, n * x);
  }
  return -1;
}
