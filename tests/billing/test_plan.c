/* The gang planner (billing/plan.c): the worst pair RTT first, then the
 * price, within the group's maximum price; --per-node; unknown and
 * one-way RTTs; one offer per provider; clear refusals; the search checked
 * against brute force on random instances and bounded on the largest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <gpunet/base.h>
#include <gpunet/gang.h>

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#define U GN_RTT_UNKNOWN
#define MAXN GN_PLAN_MAX_CANDIDATES

static gn_plan_candidate cand(uint32_t provider, uint32_t free, uint64_t price, uint32_t rtt) {
  gn_plan_candidate c;
  memset(&c, 0, sizeof(c));
  c.provider[0] = (uint8_t)(provider + 1);
  c.provider[1] = (uint8_t)((provider + 1) >> 8);
  snprintf(c.offer_id, sizeof(c.offer_id), "o-%012x", provider);
  c.gpus_free = free;
  c.price_uper_hour = price;
  c.rtt_ms = rtt;
  return c;
}

/* A symmetric matrix of n from its upper triangle, row by row. */
static void sym(uint32_t *m, size_t n, const uint32_t *upper) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    m[i * n + i] = 0;
    for (size_t j = i + 1; j < n; j++) {
      m[i * n + j] = m[j * n + i] = upper[k++];
    }
  }
}

static gn_plan *plan_new(void) {
  gn_plan *p = malloc(sizeof(*p));
  assert_non_null(p);
  memset(p, 0xab, sizeof(*p));
  return p;
}

static bool chose(const gn_plan *p, uint16_t c) {
  for (uint32_t i = 0; i < p->n; i++)
    if (p->cand[i] == c)
      return true;
  return false;
}

static void test_plan_prefers_a_low_rtt_set_within_the_price(void **st) {
  (void)st;
  /* A and B are cheap and 200 ms apart; C and D cost more and are 10 ms
   * apart; every other pair is 150 ms. */
  gn_plan_candidate c[4] = {cand(0, 1, 200000, 20), cand(1, 1, 200000, 20), cand(2, 1, 300000, 30),
                            cand(3, 1, 300000, 30)};
  uint32_t m[16];
  sym(m, 4, (const uint32_t[]){200, 150, 150, 150, 150, 10});
  gn_plan_request req = {.gpus = 2, .per_node = 1, .max_total_uper_hour = 1000000};
  gn_plan *p = plan_new();
  char why[256];
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), 0);
  assert_string_equal(why, "");
  assert_int_equal(p->n, 2);
  assert_true(chose(p, 2) && chose(p, 3));
  assert_int_equal(p->worst_rtt_ms, 10);
  assert_int_equal(p->worst_kind, GN_RTT_MEASURED);
  assert_int_equal(p->total_uper_hour, 600000);
  assert_int_equal(p->gpus, 2);
  assert_true(p->exact);
  assert_int_equal(p->rtt_ms[0][1], 10);
  assert_int_equal(p->rtt_ms[1][0], 10);
  assert_int_equal(p->rtt_ms[0][0], 0);
  /* Under a maximum of 0.50/h only A+B (0.40) fits, however far apart:
   * a cheaper mixed pair would be 150 ms but costs 0.50. */
  req.max_total_uper_hour = 500000;
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), 0);
  assert_int_equal(p->worst_rtt_ms, 150);
  assert_int_equal(p->total_uper_hour, 500000);
  req.max_total_uper_hour = 400000;
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), 0);
  assert_true(chose(p, 0) && chose(p, 1));
  assert_int_equal(p->worst_rtt_ms, 200);
  /* No maximum: the fastest set. */
  req.max_total_uper_hour = 0;
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), 0);
  assert_true(chose(p, 2) && chose(p, 3));
  free(p);
}

static void test_plan_breaks_ties_by_price(void **st) {
  (void)st;
  /* Every pair 50 ms: the cheapest three win, whatever their order. */
  gn_plan_candidate c[5] = {cand(0, 1, 500000, U), cand(1, 1, 100000, U), cand(2, 1, 400000, U), cand(3, 1, 200000, U),
                            cand(4, 1, 300000, U)};
  uint32_t m[25];
  sym(m, 5, (const uint32_t[]){50, 50, 50, 50, 50, 50, 50, 50, 50, 50});
  gn_plan_request req = {.gpus = 3, .per_node = 1};
  gn_plan *p = plan_new();
  assert_int_equal(gn_plan_choose(c, 5, m, &req, p, NULL, 0), 0);
  assert_true(chose(p, 1) && chose(p, 3) && chose(p, 4));
  assert_int_equal(p->total_uper_hour, 600000);
  assert_int_equal(p->worst_rtt_ms, 50);
  free(p);
}

static void test_plan_respects_per_node(void **st) {
  (void)st;
  /* Candidate 0 is close to everyone but has one GPU free. */
  gn_plan_candidate c[4] = {cand(0, 1, 100000, 5), cand(1, 2, 400000, 5), cand(2, 4, 400000, 5), cand(3, 2, 400000, 5)};
  uint32_t m[16];
  sym(m, 4, (const uint32_t[]){1, 1, 1, 80, 30, 60});
  gn_plan_request req = {.gpus = 4, .per_node = 2};
  gn_plan *p = plan_new();
  char why[256];
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), 0);
  assert_false(chose(p, 0));
  assert_int_equal(p->n, 2);
  assert_int_equal(p->per_node, 2);
  assert_int_equal(p->gpus, 4);
  assert_true(chose(p, 1) && chose(p, 3)); /* 30 ms, the closest pair with 2 free each */
  assert_int_equal(p->worst_rtt_ms, 30);
  assert_int_equal(p->total_uper_hour, 2 * 400000 * 2);
  gn_gang_offer mem[2];
  gn_plan_gang_offers(p, c, mem, NULL);
  for (int i = 0; i < 2; i++)
    assert_int_equal(mem[i].gpus, 2);
  /* --per-node 4: only candidate 2 has four free; 8 GPUs need two. */
  req.gpus = 8;
  req.per_node = 4;
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), GN_ENOTFOUND);
  assert_non_null(strstr(why, "need 2 providers with 4 free GPUs each; only 1 of the 4 offers have that"));
  /* No --per-node: one node with all four GPUs has no pair at all. */
  req.gpus = 4;
  req.per_node = 0;
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), 0);
  assert_int_equal(p->n, 1);
  assert_int_equal(p->cand[0], 2);
  assert_int_equal(p->per_node, 4);
  assert_int_equal(p->worst_rtt_ms, 0);
  /* No --per-node and 6 GPUs: 6 or 3 per node do not fit, 1 per node
   * needs 6 providers: three nodes of two (80 ms). */
  req.gpus = 6;
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, why, sizeof(why)), 0);
  assert_int_equal(p->per_node, 2);
  assert_int_equal(p->n, 3);
  assert_int_equal(p->worst_rtt_ms, 80);
  assert_true(chose(p, 1) && chose(p, 2) && chose(p, 3));
  free(p);
}

static void test_plan_handles_unknown_rtts(void **st) {
  (void)st;
  /* 0-1 not measured but both are 10 ms from the requester: estimated 20,
   * better than the measured 100 of 2-3. 0-2, 0-3, 1-2, 1-3 unknown with
   * 2 and 3 not measured from the requester: ranked worst. */
  gn_plan_candidate c[4] = {cand(0, 1, 500000, 10), cand(1, 1, 500000, 10), cand(2, 1, 100000, U),
                            cand(3, 1, 100000, U)};
  uint32_t m[16];
  sym(m, 4, (const uint32_t[]){U, U, U, U, U, 100});
  gn_plan_request req = {.gpus = 2, .per_node = 1};
  gn_plan *p = plan_new();
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, NULL, 0), 0);
  assert_true(chose(p, 0) && chose(p, 1));
  assert_int_equal(p->worst_rtt_ms, 20);
  assert_int_equal(p->worst_kind, GN_RTT_ESTIMATED);
  assert_int_equal(p->rtt_kind[0][1], GN_RTT_ESTIMATED);
  /* Three nodes: every set has an unknown pair; the cheapest wins and the
   * plan says the worst pair is unknown. */
  req.gpus = 3;
  assert_int_equal(gn_plan_choose(c, 4, m, &req, p, NULL, 0), 0);
  assert_int_equal(p->worst_rtt_ms, U);
  assert_int_equal(p->worst_kind, GN_RTT_NONE);
  assert_true(chose(p, 2) && chose(p, 3));
  assert_int_equal(p->total_uper_hour, 700000);
  /* No matrix at all: still a plan. */
  assert_int_equal(gn_plan_choose(c, 4, NULL, &req, p, NULL, 0), 0);
  assert_int_equal(p->n, 3);
  /* One direction measured: it is used; both: the larger. */
  uint32_t a[9] = {0, 40, U, U, 0, 7, 90, 9, 0};
  gn_plan_candidate c3[3] = {cand(0, 1, 1, U), cand(1, 1, 1, U), cand(2, 1, 1, U)};
  assert_int_equal(gn_plan_choose(c3, 3, a, &req, p, NULL, 0), 0);
  for (uint32_t i = 0; i < 3; i++)
    for (uint32_t j = 0; j < 3; j++)
      if (i != j) {
        uint32_t x = p->cand[i], y = p->cand[j];
        uint32_t want = (x + y == 1) ? 40 : (x + y == 3) ? 9 : 90; /* 0-1: 40; 1-2: max(7, 9); 0-2: 90 */
        assert_int_equal(p->rtt_ms[i][j], want);
        assert_int_equal(p->rtt_kind[i][j], GN_RTT_MEASURED);
      }
  assert_int_equal(p->worst_rtt_ms, 90);
  /* Rank 0 is the most central: candidate 1 (at most 40 ms from the others). */
  assert_int_equal(p->cand[0], 1);
  free(p);
}

static void test_plan_takes_one_offer_per_provider(void **st) {
  (void)st;
  /* Offers 0 and 1 are the same provider (1 ms apart, cheapest). */
  gn_plan_candidate c[3] = {cand(0, 1, 100000, 5), cand(0, 1, 100000, 5), cand(2, 1, 300000, 5)};
  snprintf(c[1].offer_id, sizeof(c[1].offer_id), "o-other");
  uint32_t m[9];
  sym(m, 3, (const uint32_t[]){1, 50, 60});
  gn_plan_request req = {.gpus = 2, .per_node = 1};
  gn_plan *p = plan_new();
  assert_int_equal(gn_plan_choose(c, 3, m, &req, p, NULL, 0), 0);
  assert_true(chose(p, 2));
  assert_int_equal(p->worst_rtt_ms, 50);
  /* The other offer of the chosen provider is no spare either. */
  assert_int_equal(p->n_spares, 0);
  req.gpus = 3;
  char why[256];
  assert_int_equal(gn_plan_choose(c, 3, m, &req, p, why, sizeof(why)), GN_ENOTFOUND);
  assert_non_null(strstr(why, "only 2 of the 3 offers"));
  free(p);
}

static void test_plan_refuses_what_does_not_fit(void **st) {
  (void)st;
  gn_plan_candidate c[MAXN + 1];
  for (uint32_t i = 0; i <= MAXN; i++)
    c[i] = cand(i, 2, 400000, 10);
  gn_plan *p = plan_new(), *before = plan_new();
  char why[512];
  struct {
    gn_plan_request req;
    size_t n;
    int code;
    const char *says;
  } cases[] = {
      {{.gpus = 0}, 4, GN_EINVAL, "--gpus must be at least 1"},
      {{.gpus = 3, .per_node = 2}, 4, GN_EINVAL, "--per-node 2 must be 1..16 and divide --gpus 3"},
      {{.gpus = 34, .per_node = 17}, 4, GN_EINVAL, "--per-node 17"},
      {{.gpus = 2}, MAXN + 1, GN_ETOOBIG, "65 candidate offers; the planner takes at most 64"},
      {{.gpus = 65, .per_node = 1}, 4, GN_ETOOBIG, "more than 64 nodes"},
      {{.gpus = 2000}, 4, GN_ETOOBIG, "more than 64 nodes"},
      {{.gpus = 10, .per_node = 2}, 4, GN_ENOTFOUND, "need 5 providers with 2 free GPUs each; only 4 of the 4"},
      {{.gpus = 4, .per_node = 2, .max_total_uper_hour = 1599999},
       4,
       GN_ENOTFOUND,
       "the cheapest 2 providers with 2 GPUs each cost 1.600000 per hour in total, above the maximum of 1.599999"},
      /* No --per-node: each split says why. */
      {{.gpus = 4, .max_total_uper_hour = 1000}, 4, GN_ENOTFOUND, "with 2 GPUs each cost"},
      {{.gpus = 4, .max_total_uper_hour = 1000}, 4, GN_ENOTFOUND, "with 1 GPUs each cost"},
      {{.gpus = 4, .max_total_uper_hour = 1000}, 4, GN_ENOTFOUND, "need 1 providers with 4 free GPUs each"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    memcpy(before, p, sizeof(*p));
    why[0] = 0;
    int r = gn_plan_choose(c, cases[i].n, NULL, &cases[i].req, p, why, sizeof(why));
    if (r != cases[i].code || !strstr(why, cases[i].says))
      fail_msg("case %zu: %d '%s'", i, r, why);
    assert_memory_equal(p, before, sizeof(*p)); /* written only on success */
  }
  /* A reason longer than the caller's buffer is cut, terminated. */
  gn_plan_request req = {.gpus = 4, .max_total_uper_hour = 1000};
  char small[20];
  assert_int_equal(gn_plan_choose(c, 4, NULL, &req, p, small, sizeof(small)), GN_ENOTFOUND);
  assert_int_equal(strlen(small), sizeof(small) - 1);
  /* A price whose total cannot be held is not a candidate. */
  c[0].price_uper_hour = UINT64_MAX / 2;
  req = (gn_plan_request){.gpus = 2, .per_node = 2};
  assert_int_equal(gn_plan_choose(c, 1, NULL, &req, p, why, sizeof(why)), GN_ENOTFOUND);
  assert_int_equal(gn_plan_choose(NULL, 0, NULL, &req, p, why, sizeof(why)), GN_ENOTFOUND);
  assert_int_equal(gn_plan_choose(c, 4, NULL, NULL, p, why, sizeof(why)), GN_EINVAL);
  free(p);
  free(before);
}

/* --- against brute force ----------------------------------------------------*/

static uint64_t rng_state;
static uint32_t rn(uint32_t n) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) % n);
}

static uint32_t eff(const gn_plan_candidate *c, const uint32_t *m, size_t n, size_t i, size_t j) {
  uint32_t a = m[i * n + j], b = m[j * n + i];
  if (a != U || b != U)
    return a == U ? b : b == U ? a : (a > b ? a : b);
  if (c[i].rtt_ms != U && c[j].rtt_ms != U)
    return c[i].rtt_ms + c[j].rtt_ms;
  return U;
}

/* The best (worst, price) over every set of m distinct providers with k GPUs free. */
static bool brute(const gn_plan_candidate *c, const uint32_t *mat, size_t n, uint32_t m, uint32_t k, uint64_t cap,
                  uint32_t *ret_w, uint64_t *ret_p) {
  bool have = false;
  for (uint32_t mask = 0; mask < (1u << n); mask++) {
    if ((uint32_t)__builtin_popcount(mask) != m)
      continue;
    uint32_t w = 0;
    uint64_t p = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
      if (!(mask >> i & 1))
        continue;
      ok = c[i].gpus_free >= k;
      p += c[i].price_uper_hour * k;
      for (size_t j = i + 1; j < n && ok; j++)
        if (mask >> j & 1) {
          ok = memcmp(c[i].provider, c[j].provider, GN_PK_LEN) != 0;
          uint32_t e = eff(c, mat, n, i, j);
          w = e > w ? e : w;
        }
    }
    if (!ok || (cap && p > cap))
      continue;
    if (!have || w < *ret_w || (w == *ret_w && p < *ret_p)) {
      have = true;
      *ret_w = w;
      *ret_p = p;
    }
  }
  return have;
}

static void test_plan_matches_brute_force(void **st) {
  (void)st;
  gn_plan *p = plan_new();
  unsigned found = 0, none = 0;
  for (uint64_t seed = 1; seed <= 3000; seed++) {
    rng_state = seed;
    size_t n = 1 + rn(12);
    gn_plan_candidate c[12];
    uint32_t mat[144];
    for (size_t i = 0; i < n; i++) {
      /* A few providers with two offers. */
      c[i] = cand(rn(4) == 0 && i ? (uint32_t)rn((uint32_t)i) : (uint32_t)i, 1 + rn(4), 100000 * (1 + rn(9)),
                  rn(5) == 0 ? U : 5 + rn(100));
      for (size_t j = 0; j < n; j++)
        mat[i * n + j] = rn(6) == 0 ? U : 1 + rn(200);
    }
    uint32_t k = 1 + rn(2);
    uint32_t m = 1 + rn(4);
    gn_plan_request req = {.gpus = m * k, .per_node = k, .max_total_uper_hour = rn(3) ? 0 : 100000ull * k * rn(25)};
    uint32_t bw = 0;
    uint64_t bp = 0;
    bool want = brute(c, mat, n, m, k, req.max_total_uper_hour, &bw, &bp);
    char why[256];
    int r = gn_plan_choose(c, n, mat, &req, p, why, sizeof(why));
    if (want != (r == 0))
      fail_msg("seed %" PRIu64 ": brute force %s, planner %d (%s)", seed, want ? "found one" : "none", r, why);
    if (!want) {
      none++;
      assert_true(why[0] != 0);
      continue;
    }
    found++;
    if (p->worst_rtt_ms != bw || p->total_uper_hour != bp || !p->exact)
      fail_msg("seed %" PRIu64 ": planner worst %u price %" PRIu64 ", brute force %u %" PRIu64, seed, p->worst_rtt_ms,
               p->total_uper_hour, bw, bp);
    /* The plan is what it says. */
    uint64_t total = 0;
    for (uint32_t i = 0; i < p->n; i++) {
      total += c[p->cand[i]].price_uper_hour * k;
      assert_true(c[p->cand[i]].gpus_free >= k);
      for (uint32_t j = 0; j < p->n; j++)
        if (i != j) {
          assert_int_equal(p->rtt_ms[i][j], eff(c, mat, n, p->cand[i], p->cand[j]));
          assert_true(p->rtt_ms[i][j] <= p->worst_rtt_ms);
        }
    }
    assert_int_equal(total, p->total_uper_hour);
    /* Spares: other providers, k free, best first, usable by a gang. */
    uint32_t last = 0;
    for (uint32_t s = 0; s < p->n_spares; s++) {
      const gn_plan_candidate *x = &c[p->spares[s]];
      assert_true(x->gpus_free >= k);
      uint32_t w = 0;
      for (uint32_t i = 0; i < p->n; i++) {
        assert_memory_not_equal(x->provider, c[p->cand[i]].provider, GN_PK_LEN);
        uint32_t e = eff(c, mat, n, p->cand[i], p->spares[s]);
        w = e > w ? e : w;
      }
      assert_true(w >= last);
      last = w;
    }
    gn_gang_offer mem[4], sp[12];
    gn_plan_gang_offers(p, c, mem, sp);
    gn_gang_opts o = {.answer_timeout_ms = 1000, .restarts = 1};
    gn_gang *g = NULL;
    gn_gang_out *out = calloc(1, sizeof(*out));
    assert_non_null(out);
    uint8_t seed32[32] = {1};
    assert_int_equal(gn_gang_new(mem, p->n, sp, p->n_spares, &o, seed32, 0, &g, out), 0);
    assert_int_equal(out->n, p->n);
    gn_gang_free(g);
    free(out);
  }
  fprintf(stderr, "plan vs brute force: %u instances with a plan, %u without\n", found, none);
  assert_true(found > 1000 && none > 100);
  free(p);
}

static void test_plan_work_is_bounded(void **st) {
  (void)st;
  /* The largest input: 64 candidates, 16 nodes, random RTTs. */
  gn_plan_candidate c[MAXN];
  static uint32_t mat[MAXN * MAXN];
  rng_state = 42;
  for (uint32_t i = 0; i < MAXN; i++) {
    c[i] = cand(i, 8, 100000 * (1 + rn(20)), 5 + rn(100));
    for (uint32_t j = 0; j < MAXN; j++)
      mat[i * MAXN + j] = 1 + rn(300);
  }
  gn_plan *p = plan_new();
  gn_plan_request req = {.gpus = 16, .per_node = 1, .max_total_uper_hour = 20000000};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(gn_plan_choose(c, MAXN, mat, &req, p, NULL, 0), 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  fprintf(stderr, "plan: 64 candidates, 16 nodes: worst %u ms, %" PRIu64 " steps, %s, %.1f ms\n", p->worst_rtt_ms,
          p->steps, p->exact ? "exact" : "budget reached", ms);
  assert_true(p->steps <= GN_PLAN_DEFAULT_STEPS);
  assert_true(p->total_uper_hour <= req.max_total_uper_hour);
  uint32_t greedy_budget = p->worst_rtt_ms;
  /* A tiny budget still gives an acceptable plan (the greedy one), no better. */
  req.max_steps = 10;
  assert_int_equal(gn_plan_choose(c, MAXN, mat, &req, p, NULL, 0), 0);
  assert_false(p->exact);
  assert_int_equal(p->steps, 10);
  assert_true(p->total_uper_hour <= req.max_total_uper_hour);
  assert_true(p->worst_rtt_ms >= greedy_budget);
  /* Every split of 64 GPUs with no --per-node, at the default budget each. */
  req = (gn_plan_request){.gpus = 64};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(gn_plan_choose(c, MAXN, mat, &req, p, NULL, 0), 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  fprintf(stderr, "plan: 64 GPUs, any split: %u nodes of %u, worst %u ms, %.1f ms\n", p->n, p->per_node,
          p->worst_rtt_ms, ms);
  assert_int_equal(p->gpus, 64);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_prefers_a_low_rtt_set_within_the_price),
      cmocka_unit_test(test_plan_breaks_ties_by_price),
      cmocka_unit_test(test_plan_respects_per_node),
      cmocka_unit_test(test_plan_handles_unknown_rtts),
      cmocka_unit_test(test_plan_takes_one_offer_per_provider),
      cmocka_unit_test(test_plan_refuses_what_does_not_fit),
      cmocka_unit_test(test_plan_matches_brute_force),
      cmocka_unit_test(test_plan_work_is_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
