/* The gang planner (include/gpunet/gang.h): which providers a training job
 * leases from, given their offers, prices and measured round-trip times.
 * Pure and bounded: at most GN_PLAN_MAX_CANDIDATES candidates, a greedy
 * first answer, then a branch-and-bound search within a step budget. */
#include <gpunet/base.h>
#include <gpunet/billing.h>
#include <gpunet/gang.h>

#include <stdio.h>

#define MAXC GN_PLAN_MAX_CANDIDATES

typedef struct plan_ctx {
  const gn_plan_candidate *c;
  size_t n;
  uint32_t eff[MAXC][MAXC]; /* effective RTT of each pair */
  uint8_t kind[MAXC][MAXC];
  uint8_t prov[MAXC]; /* provider class: equal for offers of one provider */
} plan_ctx;

/* One search for a given per-node count. */
typedef struct search {
  const plan_ctx *x;
  uint32_t m;   /* nodes */
  uint64_t cap; /* UINT64_MAX: none */
  uint16_t order[MAXC];
  uint64_t cost[MAXC];       /* per order position */
  uint64_t prefix[MAXC + 1]; /* prefix sums of cost */
  size_t ne;
  uint16_t cur[MAXC];
  uint32_t depth;
  bool have;
  uint32_t best_w;
  uint64_t best_p;
  uint16_t best[MAXC]; /* candidate indices */
  uint64_t steps, max_steps;
  bool aborted;
} search;

static uint32_t max32(uint32_t a, uint32_t b) {
  return a > b ? a : b;
}

static void ctx_init(plan_ctx *x, const gn_plan_candidate *c, size_t n, const uint32_t *rtt) {
  x->c = c;
  x->n = n;
  for (size_t i = 0; i < n; i++) {
    x->prov[i] = (uint8_t)i;
    for (size_t j = 0; j < i; j++)
      if (memcmp(c[i].provider, c[j].provider, GN_PK_LEN) == 0) {
        x->prov[i] = x->prov[j];
        break;
      }
  }
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) {
      uint32_t a = rtt ? rtt[i * n + j] : GN_RTT_UNKNOWN, b = rtt ? rtt[j * n + i] : GN_RTT_UNKNOWN;
      if (i == j) {
        x->eff[i][j] = 0;
        x->kind[i][j] = GN_RTT_MEASURED;
      } else if (a != GN_RTT_UNKNOWN || b != GN_RTT_UNKNOWN) {
        /* Both directions measured: the larger (ranks talk both ways). */
        x->eff[i][j] = a == GN_RTT_UNKNOWN ? b : b == GN_RTT_UNKNOWN ? a : max32(a, b);
        x->kind[i][j] = GN_RTT_MEASURED;
      } else if (c[i].rtt_ms != GN_RTT_UNKNOWN && c[j].rtt_ms != GN_RTT_UNKNOWN &&
                 (uint64_t)c[i].rtt_ms + c[j].rtt_ms < GN_RTT_UNKNOWN) {
        /* Through the requester: a path that exists, so an upper bound. */
        x->eff[i][j] = c[i].rtt_ms + c[j].rtt_ms;
        x->kind[i][j] = GN_RTT_ESTIMATED;
      } else {
        x->eff[i][j] = GN_RTT_UNKNOWN;
        x->kind[i][j] = GN_RTT_NONE;
      }
    }
}

static bool better(uint32_t w, uint64_t p, const search *s) {
  return !s->have || w < s->best_w || (w == s->best_w && p < s->best_p);
}

static void record(search *s, const uint16_t *set, uint32_t w, uint64_t p) {
  s->have = true;
  s->best_w = w;
  s->best_p = p;
  memcpy(s->best, set, s->m * sizeof(*set));
}

static bool dup_provider(const search *s, const uint16_t *set, uint32_t k, uint16_t j) {
  for (uint32_t i = 0; i < k; i++)
    if (s->x->prov[set[i]] == s->x->prov[j])
      return true;
  return false;
}

/* The cheapest set of m distinct providers: acceptable whenever any set is. */
static void seed_cheapest(search *s) {
  uint16_t set[MAXC];
  uint32_t k = 0, w = 0;
  uint64_t p = 0;
  for (size_t i = 0; i < s->ne && k < s->m; i++) {
    uint16_t j = s->order[i];
    if (dup_provider(s, set, k, j))
      continue;
    for (uint32_t a = 0; a < k; a++)
      w = max32(w, s->x->eff[set[a]][j]);
    set[k++] = j;
    p += s->cost[i];
  }
  if (k == s->m && p <= s->cap && better(w, p, s))
    record(s, set, w, p);
}

/* From every start, add the candidate that raises the worst pair least
 * (then the cheapest) while the rest can still be paid for. */
static void greedy(search *s) {
  for (size_t st = 0; st < s->ne; st++) {
    uint16_t set[MAXC];
    bool in[MAXC] = {0};
    uint32_t maxr[MAXC];
    uint32_t k = 0, w = 0;
    uint64_t p = 0;
    uint16_t j0 = s->order[st];
    set[k++] = j0;
    in[st] = true;
    p = s->cost[st];
    for (size_t i = 0; i < s->ne; i++)
      maxr[i] = s->x->eff[j0][s->order[i]];
    while (k < s->m) {
      uint32_t need = s->m - k;
      /* The cheapest need-1 and need not-chosen costs (providers aside:
       * an optimistic bound, the set is checked in full at the end). */
      uint64_t c1 = 0, c2 = 0;
      uint32_t got = 0;
      for (size_t i = 0; i < s->ne && got < need; i++)
        if (!in[i]) {
          if (got < need - 1)
            c1 += s->cost[i];
          c2 += s->cost[i];
          got++;
        }
      size_t pick = SIZE_MAX;
      for (size_t i = 0; i < s->ne; i++) {
        if (in[i] || dup_provider(s, set, k, s->order[i]))
          continue;
        uint64_t rest = c1 + s->cost[i] > c2 ? c1 + s->cost[i] : c2;
        if (s->cap != UINT64_MAX && p + rest > s->cap)
          continue;
        if (pick == SIZE_MAX || maxr[i] < maxr[pick])
          pick = i; /* ties keep the earlier, cheaper one */
      }
      if (pick == SIZE_MAX)
        break;
      in[pick] = true;
      uint16_t j = s->order[pick];
      set[k++] = j;
      p += s->cost[pick];
      w = max32(w, maxr[pick]);
      for (size_t i = 0; i < s->ne; i++)
        maxr[i] = max32(maxr[i], s->x->eff[j][s->order[i]]);
    }
    if (k == s->m && p <= s->cap && better(w, p, s))
      record(s, set, w, p);
  }
}

static void dfs(search *s, size_t start, uint32_t w, uint64_t p) {
  if (s->depth == s->m) {
    if (better(w, p, s))
      record(s, s->cur, w, p);
    return;
  }
  uint32_t need = s->m - s->depth;
  for (size_t i = start; i + need <= s->ne; i++) {
    if (s->steps >= s->max_steps) {
      s->aborted = true;
      return;
    }
    s->steps++;
    /* Candidates are sorted by cost, so the cheapest completion from i
     * costs at least its contiguous run: past the cap or the best price
     * at the best worst, no later i does better. */
    uint64_t lb = p + (s->prefix[i + need] - s->prefix[i]);
    if (lb > s->cap || (s->have && w == s->best_w && lb >= s->best_p))
      break;
    if (s->have && w > s->best_w)
      return;
    uint16_t j = s->order[i];
    if (dup_provider(s, s->cur, s->depth, j))
      continue;
    uint32_t nw = w;
    for (uint32_t a = 0; a < s->depth; a++)
      nw = max32(nw, s->x->eff[s->cur[a]][j]);
    if (s->have && (nw > s->best_w || (nw == s->best_w && lb >= s->best_p)))
      continue;
    s->cur[s->depth++] = j;
    dfs(s, i + 1, nw, p + s->cost[i]);
    s->depth--;
    if (s->aborted)
      return;
  }
}

static void fmt_price(uint64_t v, char *buf, size_t cap) {
  gn_price_format(v, buf, cap);
}

/* One per-node count. 0 and s->best filled, or an error and why. */
static int plan_k(const plan_ctx *x, const gn_plan_request *req, uint32_t k, search *s, char *why, size_t cap) {
  memset(s, 0, sizeof(*s));
  s->x = x;
  s->m = req->gpus / k;
  s->cap = req->max_total_uper_hour ? req->max_total_uper_hour : UINT64_MAX;
  s->max_steps = req->max_steps ? req->max_steps : GN_PLAN_DEFAULT_STEPS;
  /* A cost over this would let a sum of MAXC overflow: such an offer is not
   * one anybody pays. */
  const uint64_t cost_max = UINT64_MAX / (MAXC + 1);
  for (size_t i = 0; i < x->n; i++) {
    uint64_t c;
    if (x->c[i].gpus_free < k || __builtin_mul_overflow((uint64_t)k, x->c[i].price_uper_hour, &c) || c > cost_max)
      continue;
    size_t at = s->ne++;
    while (at > 0 && s->cost[at - 1] > c) { /* insertion sort: stable, n <= 64 */
      s->cost[at] = s->cost[at - 1];
      s->order[at] = s->order[at - 1];
      at--;
    }
    s->cost[at] = c;
    s->order[at] = (uint16_t)i;
  }
  for (size_t i = 0; i < s->ne; i++)
    s->prefix[i + 1] = s->prefix[i] + s->cost[i];
  /* Distinct providers with k free GPUs, and the cheapest m of them. */
  uint16_t set[MAXC];
  uint32_t distinct = 0;
  uint64_t cheapest = 0;
  for (size_t i = 0; i < s->ne; i++)
    if (!dup_provider(s, set, distinct, s->order[i])) {
      if (distinct < s->m)
        cheapest += s->cost[i];
      set[distinct++] = s->order[i];
    }
  if (distinct < s->m) {
    snprintf(why, cap,
             "%u GPUs as %u nodes of %u need %u providers with %u free GPUs each; only %u of the %zu offers "
             "have that",
             req->gpus, s->m, k, s->m, k, distinct, x->n);
    return GN_ENOTFOUND;
  }
  if (cheapest > s->cap) {
    char a[32], b[32];
    fmt_price(cheapest, a, sizeof(a));
    fmt_price(s->cap, b, sizeof(b));
    snprintf(why, cap, "the cheapest %u providers with %u GPUs each cost %s per hour in total, above the maximum of %s",
             s->m, k, a, b);
    return GN_ENOTFOUND;
  }
  seed_cheapest(s);
  greedy(s);
  dfs(s, 0, 0, 0);
  return 0;
}

static void fill(const plan_ctx *x, const search *s, uint32_t k, gn_plan *p) {
  memset(p, 0, sizeof(*p));
  p->n = s->m;
  p->per_node = k;
  p->gpus = s->m * k;
  p->total_uper_hour = s->best_p;
  p->exact = !s->aborted;
  p->steps = s->steps;
  /* Plan order (rank order): the most central first (smallest worst RTT to
   * the others), then the candidates' order; rank 0 is the rendezvous. */
  uint32_t central[MAXC];
  uint16_t ord[MAXC];
  for (uint32_t i = 0; i < s->m; i++) {
    central[i] = 0;
    for (uint32_t j = 0; j < s->m; j++)
      central[i] = max32(central[i], x->eff[s->best[i]][s->best[j]]);
    uint32_t at = i;
    while (at > 0 && (central[ord[at - 1]] > central[i] ||
                      (central[ord[at - 1]] == central[i] && s->best[ord[at - 1]] > s->best[i]))) {
      ord[at] = ord[at - 1];
      at--;
    }
    ord[at] = (uint16_t)i;
  }
  for (uint32_t i = 0; i < s->m; i++)
    p->cand[i] = s->best[ord[i]];
  for (uint32_t i = 0; i < s->m; i++)
    for (uint32_t j = 0; j < s->m; j++) {
      p->rtt_ms[i][j] = x->eff[p->cand[i]][p->cand[j]];
      p->rtt_kind[i][j] = x->kind[p->cand[i]][p->cand[j]];
      if (i < j && (p->worst_a == p->worst_b || p->rtt_ms[i][j] > p->worst_rtt_ms)) {
        p->worst_rtt_ms = p->rtt_ms[i][j];
        p->worst_kind = p->rtt_kind[i][j];
        p->worst_a = (uint16_t)i;
        p->worst_b = (uint16_t)j;
      }
    }
  /* Spares: the best offer of every other provider with k GPUs free. */
  uint32_t spw[MAXC];
  for (size_t i = 0; i < s->ne; i++) {
    uint16_t j = s->order[i];
    bool skip = dup_provider(s, p->cand, p->n, j);
    for (uint32_t a = 0; a < p->n_spares && !skip; a++)
      skip = x->prov[p->spares[a]] == x->prov[j];
    if (skip)
      continue;
    uint32_t w = 0;
    for (uint32_t a = 0; a < p->n; a++)
      w = max32(w, x->eff[p->cand[a]][j]);
    /* Sorted by (worst to the chosen, cost): order[] is already by cost. */
    uint32_t at = p->n_spares++;
    while (at > 0 && spw[at - 1] > w) {
      spw[at] = spw[at - 1];
      p->spares[at] = p->spares[at - 1];
      at--;
    }
    spw[at] = w;
    p->spares[at] = j;
  }
}

int gn_plan_choose(const gn_plan_candidate *c, size_t n, const uint32_t *rtt_ms, const gn_plan_request *req,
                   gn_plan *ret, char *why, size_t why_cap) {
  char dummy[8];
  if (!why || why_cap == 0) {
    why = dummy;
    why_cap = sizeof(dummy);
  }
  why[0] = 0;
  if (!req || !ret || (n && !c)) {
    snprintf(why, why_cap, "no request");
    return GN_EINVAL;
  }
  if (req->gpus == 0) {
    snprintf(why, why_cap, "--gpus must be at least 1");
    return GN_EINVAL;
  }
  if (req->per_node > GN_LEASE_MAX_GPUS || (req->per_node && req->gpus % req->per_node)) {
    snprintf(why, why_cap, "--per-node %u must be 1..%u and divide --gpus %u", req->per_node, GN_LEASE_MAX_GPUS,
             req->gpus);
    return GN_EINVAL;
  }
  if (n > MAXC) {
    snprintf(why, why_cap, "%zu candidate offers; the planner takes at most %u (filter the offers first)", n, MAXC);
    return GN_ETOOBIG;
  }
  for (size_t i = 0; i < n; i++)
    if (strnlen(c[i].offer_id, sizeof(c[i].offer_id)) == sizeof(c[i].offer_id)) {
      snprintf(why, why_cap, "candidate %zu: offer id not terminated", i);
      return GN_EINVAL;
    }
  plan_ctx *x = malloc(sizeof(*x));
  search *s = malloc(sizeof(*s)), *best = malloc(sizeof(*best));
  int r = GN_ENOMEM;
  if (!x || !s || !best)
    goto out;
  ctx_init(x, c, n, rtt_ms);
  uint32_t best_k = 0, tried = 0;
  bool all_exact = true;
  size_t used = 0;
  r = GN_ENOTFOUND;
  /* Every per-node count that divides N into at most GN_PLAN_MAX_NODES
   * nodes (largest first: on a tie, fewer nodes), or just the one asked. */
  for (uint32_t k = req->per_node ? req->per_node : GN_LEASE_MAX_GPUS; k >= 1; k--) {
    if (req->gpus % k || (req->per_node && k != req->per_node) || req->gpus / k > GN_PLAN_MAX_NODES)
      continue;
    tried++;
    char w1[192];
    int rk = plan_k(x, req, k, s, w1, sizeof(w1));
    if (rk < 0) {
      /* Say why each split failed, as far as there is room. */
      int len = snprintf(why + used, why_cap - used, "%s%s", used ? "; " : "", w1);
      if (len > 0)
        used = used + (size_t)len < why_cap ? used + (size_t)len : why_cap - 1;
      continue;
    }
    all_exact = all_exact && !s->aborted;
    if (!best_k || s->best_w < best->best_w || (s->best_w == best->best_w && s->best_p < best->best_p)) {
      search *t = best;
      best = s;
      s = t;
      best_k = k;
    }
  }
  if (!tried) {
    uint32_t k = req->per_node ? req->per_node : GN_LEASE_MAX_GPUS;
    snprintf(why, why_cap, "%u GPUs as nodes of at most %u GPUs is more than %u nodes, the most a gang has", req->gpus,
             k, GN_PLAN_MAX_NODES);
    r = GN_ETOOBIG;
  }
  if (best_k) {
    why[0] = 0;
    fill(x, best, best_k, ret);
    ret->exact = all_exact;
    r = 0;
  }
out:
  free(x);
  free(s);
  free(best);
  return r;
}

void gn_plan_gang_offers(const gn_plan *p, const gn_plan_candidate *c, gn_gang_offer *ret_members,
                         gn_gang_offer *ret_spares) {
  for (uint32_t pass = 0; pass < 2; pass++) {
    gn_gang_offer *o = pass ? ret_spares : ret_members;
    uint32_t cnt = pass ? p->n_spares : p->n;
    for (uint32_t i = 0; o && i < cnt; i++) {
      const gn_plan_candidate *x = &c[pass ? p->spares[i] : p->cand[i]];
      memset(&o[i], 0, sizeof(o[i]));
      memcpy(o[i].provider, x->provider, GN_PK_LEN);
      memcpy(o[i].offer_id, x->offer_id, sizeof(o[i].offer_id));
      o[i].gpus = p->per_node;
      o[i].price_uper_hour = x->price_uper_hour;
    }
  }
}
