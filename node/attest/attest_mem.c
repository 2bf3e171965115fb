/* The memory challenge: a card shows it holds its claimed memory at its
 * claimed bandwidth by walking a large nonce-derived table with dependent
 * reads, fast. CPU reference prover, verifier and messages.
 *
 * Why a card with less memory cannot answer in time. The table has
 * N = table_mib * 2^14 entries of 64 bytes; entry i is the last of a chain of
 * `cost` ChaCha20 blocks, each keyed by the previous one, so an entry that is
 * not stored costs `cost` sequential blocks to regenerate, with no shortcut
 * (ChaCha20 is a PRF; knowing other entries does not help). A block is about
 * 1,000 32-bit integer operations (80 quarter-rounds of 12 ops, plus the
 * feed-forward). Take an RTX 4090: ~20.6 T int32 op/s (128 SMs x 64 INT32
 * lanes x 2.52 GHz), so it regenerates at most 20.6e12 / (1000 * cost)
 * entries/s, i.e. 0.64 G entries/s at cost 32; it reads random 64-byte
 * entries at about 0.6 * 1008 GB/s / 64 B = 9.4 G entries/s. Regenerating is
 * therefore R = 9.4 / 0.64 ~ 15 times slower than reading (R ~ 0.46 * cost on
 * this card; other cards have similar int-op/bandwidth ratios, within 2x).
 * A walk step cannot begin before the previous read returns (the address is
 * a function of the data), but 2^18 walkers run at once, so the honest walk
 * is bandwidth-bound, not latency-bound.
 *
 * A prover that holds a fraction phi of the table (the rest regenerated, or
 * fetched from host memory over PCIe at ~25-60 GB/s, no better than R ~ 15-40)
 * needs phi + (1 - phi) * R times the honest time: a 16 GB card posing as a
 * 24 GB one (table = 7/8 of 24 GB = 21 GB, phi = 16/21 = 0.76) takes
 * 0.76 + 0.24 * 15 = 4.4x as long; a card short by 5% of the table takes
 * 1.7x. With the acceptance threshold at 30% of the class's nominal
 * bandwidth and an honest random-read efficiency around 50-60%, the margin is
 * ~2x, so any card missing more than ~7% of the table fails, and one that
 * regenerates everything (phi = 0) is 15x too slow. Skipping work instead
 * (walkers left out) is caught by the sampled recomputation: a prover that
 * ran a fraction f of walkers passes with probability <= f^samples.
 *
 * Measured on an H200 (scripts/bench/gpu_check, 2026-12-04), the premise
 * holds with a smaller margin than the datasheets suggested: the honest walk
 * over a 123 GiB table reached 163-182 GB/s (3.4-3.8% of nominal: random
 * reads over that much memory are bound by address translation), and
 * regenerating at the fill's measured ChaCha rate gives ~50 GB/s, so R ~ 3.5
 * there, not 15. The threshold is therefore per class (mem_min_fraction in
 * attest_classes.c: 2.2% for Hopper, measured; 30% elsewhere, not yet).
 *
 * What it does not show: that the memory is on one card (two cards with
 * fast peer access could share a table). The fill phase is not timed
 * (it is compute work); only the walk is, from the WALK message. */
#include "attest_int.h"

#include <gpunet/wire.h>
#include <sodium.h>
#include <stdio.h>

#define MEM_DOMAIN "gpunet-attest-mem-v1"

int gn_attest_mem_params_check(const gn_attest_mem_params *p) {
  if (!p || p->table_mib < 1 || p->table_mib > GN_ATTEST_MEM_TABLE_MIB_MAX || p->cost < 1 ||
      p->cost > GN_ATTEST_MEM_COST_MAX || p->walkers < 1 || p->walkers > GN_ATTEST_MEM_WALKERS_MAX || p->steps < 1 ||
      p->steps > GN_ATTEST_MEM_STEPS_MAX || p->samples < 1 || p->samples > 64 || p->samples > p->walkers)
    return GN_EINVAL;
  return 0;
}

int gn_attest_mem_params_for_class(const gn_attest_class *c, uint32_t target_ms, gn_attest_mem_params *ret) {
  gn_attest_mem_params p = {.table_mib = 0, .cost = 32, .walkers = GN_ATTEST_MEM_WALKERS_MAX, .steps = 1, .samples = 8};
  if (!c || target_ms == 0)
    return GN_EINVAL;
  /* 7/8 leaves room for the driver, the context and the walk's own state. */
  p.table_mib = c->memory_mib / 8u * 7u;
  double reads = c->bandwidth_gbs * 1e9 * c->mem_min_fraction * (double)target_ms / 1000.0 / 64.0;
  double steps = reads / p.walkers;
  p.steps = steps < 1 ? 1 : steps > GN_ATTEST_MEM_STEPS_MAX ? GN_ATTEST_MEM_STEPS_MAX : (uint32_t)steps;
  int r = gn_attest_mem_params_check(&p);
  if (r < 0)
    return r;
  *ret = p;
  return 0;
}

int gn_attest_mem_grade(const gn_attest_mem_params *p, const char *claimed_class, uint64_t elapsed_ms, bool simulated,
                        gn_attest_result *ret) {
  const gn_attest_class *c = gn_attest_class_find(claimed_class);
  if (!p)
    return GN_EINVAL;
  if (!c && !simulated)
    return GN_ENOTFOUND;
  double s = (elapsed_ms ? (double)elapsed_ms : 1.0) / 1000.0;
  double measured = (double)p->walkers * p->steps * 64.0 / s / 1e9;
  double expected = c ? c->bandwidth_gbs * c->mem_min_fraction : 0.0;
  ret->measured_tops = measured;
  ret->expected_tops = expected;
  ret->elapsed_ms = elapsed_ms;
  ret->simulated = simulated;
  if (simulated) {
    ret->outcome = GN_ATTEST_SIMULATED;
    snprintf(ret->verdict, sizeof(ret->verdict), "simulated");
  } else if (p->table_mib < c->memory_mib / 8u * 7u) {
    /* A table smaller than the class's memory proves nothing about it. */
    ret->outcome = GN_ATTEST_TOO_SLOW;
    snprintf(ret->verdict, sizeof(ret->verdict), "memory challenge too small for %s (%u MiB table, needs %u MiB)",
             c->name, p->table_mib, c->memory_mib / 8u * 7u);
  } else if (measured >= expected) {
    ret->outcome = GN_ATTEST_VERIFIED;
    snprintf(ret->verdict, sizeof(ret->verdict), "memory verified %s (%.0f GB/s)", c->name, measured);
  } else {
    ret->outcome = GN_ATTEST_TOO_SLOW;
    snprintf(ret->verdict, sizeof(ret->verdict),
             "memory too slow for %s (measured %.1f GB/s, expected at least %.1f GB/s)", c->name, measured, expected);
  }
  return 0;
}

/* --- the math ----------------------------------------------------------------------*/

static void le32_put(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t le64_get(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

void gn__attest_mem_key(const gn_attest_mem_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint8_t ret_key[32]) {
  uint8_t msg[sizeof(MEM_DOMAIN) - 1 + GN_ATTEST_NONCE_LEN + 8];
  memcpy(msg, MEM_DOMAIN, sizeof(MEM_DOMAIN) - 1);
  memcpy(msg + sizeof(MEM_DOMAIN) - 1, nonce, GN_ATTEST_NONCE_LEN);
  le32_put(msg + sizeof(MEM_DOMAIN) - 1 + GN_ATTEST_NONCE_LEN, p->table_mib);
  le32_put(msg + sizeof(MEM_DOMAIN) - 1 + GN_ATTEST_NONCE_LEN + 4, p->cost);
  crypto_generichash(ret_key, 32, msg, sizeof(msg), NULL, 0);
}

static void chacha_block(const uint8_t key[32], uint32_t counter, uint8_t out[64]) {
  static const uint8_t zero_nonce[crypto_stream_chacha20_ietf_NONCEBYTES];
  memset(out, 0, 64);
  crypto_stream_chacha20_ietf_xor_ic(out, out, 64, zero_nonce, counter, key);
}

void gn__attest_mem_entry(const uint8_t key[32], uint32_t index, uint32_t cost, uint8_t ret[64]) {
  uint8_t block[64], k[32];
  chacha_block(key, index, block);
  for (uint32_t j = 1; j < cost; j++) {
    memcpy(k, block, 32);
    chacha_block(k, 0, block);
  }
  memcpy(ret, block, 64);
}

uint64_t gn__attest_mem_entries(const gn_attest_mem_params *p) {
  return (uint64_t)p->table_mib * (1024u * 1024u / 64u);
}

uint64_t gn__attest_mem_walk(const gn_attest_mem_params *p, const uint8_t seed[32], uint32_t walker,
                             void (*get)(void *ctx, uint32_t index, uint8_t ret[64]), void *ctx) {
  uint64_t entries = gn__attest_mem_entries(p);
  uint8_t e[64];
  chacha_block(seed, walker, e);
  uint64_t acc = le64_get(e);
  for (uint32_t s = 0; s < p->steps; s++) {
    /* The address is the accumulator scaled into [0, entries): the next
     * read cannot start before this one's data is known. */
    uint32_t idx = (uint32_t)(((acc >> 32) * entries) >> 32);
    get(ctx, idx, e);
    uint64_t w = 0;
    for (int i = 0; i < 8; i++)
      w ^= le64_get(e + 8 * i); /* all 64 bytes matter */
    acc ^= w;
    acc = ((acc << 23) | (acc >> 41)) * 0x9e3779b97f4a7c15ull + s;
  }
  return acc;
}

/* --- messages ----------------------------------------------------------------------*/

static void put_head(gn_wire_writer *w, uint32_t keys, const uint8_t nonce[GN_ATTEST_NONCE_LEN]) {
  gn_wire_put_map(w, keys);
  gn_wire_put_str(w, "v");
  gn_wire_put_u64(w, GN_ATTEST_VERSION);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, nonce, GN_ATTEST_NONCE_LEN);
}

/* --- verifier ----------------------------------------------------------------------*/

enum { V_AWAIT_READY, V_AWAIT_RESULT, V_DONE };

struct gn_attest_mem_verifier {
  gn_attest_mem_params p;
  char claimed[GN_ATTEST_CLASS_STRLEN];
  gn_attest_rng_fn rng;
  void *rng_ctx;
  int state;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t key[32];
  uint8_t seed[32];
};

static void rng_fill(gn_attest_rng_fn rng, void *ctx, uint8_t *buf, size_t len) {
  if (rng)
    rng(ctx, buf, len);
  else
    randombytes_buf(buf, len);
}

int gn_attest_mem_verifier_new(const gn_attest_mem_params *p, const char *claimed_class, gn_attest_rng_fn rng,
                               void *rng_ctx, gn_buf *ret_challenge, gn_attest_mem_verifier **ret_v) {
  gn_wire_writer w;
  int r;
  if ((r = gn_attest_mem_params_check(p)) < 0)
    return r;
  if (!claimed_class || strlen(claimed_class) >= GN_ATTEST_CLASS_STRLEN)
    return GN_EINVAL;
  gn_attest_mem_verifier *v = calloc(1, sizeof(*v));
  if (!v)
    return GN_ENOMEM;
  v->p = *p;
  snprintf(v->claimed, sizeof(v->claimed), "%s", claimed_class);
  v->rng = rng;
  v->rng_ctx = rng_ctx;
  rng_fill(rng, rng_ctx, v->nonce, sizeof(v->nonce));
  gn__attest_mem_key(p, v->nonce, v->key);
  gn_wire_writer_init(&w);
  put_head(&w, 7, v->nonce);
  gn_wire_put_str(&w, "table_mib");
  gn_wire_put_u64(&w, p->table_mib);
  gn_wire_put_str(&w, "cost");
  gn_wire_put_u64(&w, p->cost);
  gn_wire_put_str(&w, "walkers");
  gn_wire_put_u64(&w, p->walkers);
  gn_wire_put_str(&w, "steps");
  gn_wire_put_u64(&w, p->steps);
  gn_wire_put_str(&w, "samples");
  gn_wire_put_u64(&w, p->samples);
  r = gn_wire_writer_take(&w, ret_challenge);
  gn_wire_writer_done(&w);
  if (r < 0) {
    gn_attest_mem_verifier_free(v);
    return r;
  }
  *ret_v = v;
  return 0;
}

gn_attest_mem_verifier *gn_attest_mem_verifier_free(gn_attest_mem_verifier *v) {
  if (v) {
    sodium_memzero(v, sizeof(*v));
    free(v);
  }
  return NULL;
}

int gn_attest_mem_verifier_on_ready(gn_attest_mem_verifier *v, const uint8_t *msg, size_t len, gn_buf *ret_walk) {
  gn_wire_doc doc;
  gn_wire_writer w;
  uint8_t nonce[GN_ATTEST_NONCE_LEN], seed[32];
  int r;
  if (v->state != V_AWAIT_READY)
    return GN_ESTATE;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  gn_wire_doc_done(&doc);
  if (sodium_memcmp(nonce, v->nonce, sizeof(nonce)) != 0)
    return GN_EREPLAY;
  /* The walk's seed is drawn only now: nothing about the walk can be
   * computed while the table is being filled. */
  rng_fill(v->rng, v->rng_ctx, seed, sizeof(seed));
  gn_wire_writer_init(&w);
  put_head(&w, 3, v->nonce);
  gn_wire_put_str(&w, "seed");
  gn_wire_put_bin(&w, seed, sizeof(seed));
  r = gn_wire_writer_take(&w, ret_walk);
  gn_wire_writer_done(&w);
  if (r < 0)
    return r;
  memcpy(v->seed, seed, sizeof(seed));
  v->state = V_AWAIT_RESULT;
  return 0;
}

typedef struct regen {
  const uint8_t *key;
  uint32_t cost;
} regen;

static void regen_get(void *ctx, uint32_t index, uint8_t ret[64]) {
  regen *g = ctx;
  gn__attest_mem_entry(g->key, index, g->cost, ret);
}

/* Distinct walkers to recompute, from fresh randomness (drawn after the
 * results arrived). */
static void draw_walkers(gn_attest_mem_verifier *v, uint32_t *out) {
  uint8_t seed[32], block[64];
  uint32_t counter = 0;
  rng_fill(v->rng, v->rng_ctx, seed, sizeof(seed));
  for (uint32_t i = 0; i < v->p.samples;) {
    chacha_block(seed, counter++, block);
    uint64_t x = le64_get(block);
    uint64_t limit = UINT64_MAX - UINT64_MAX % v->p.walkers;
    if (x >= limit)
      continue;
    uint32_t w = (uint32_t)(x % v->p.walkers);
    bool dup = false;
    for (uint32_t j = 0; j < i; j++)
      dup = dup || out[j] == w;
    if (!dup)
      out[i++] = w;
  }
}

int gn_attest_mem_verifier_on_result(gn_attest_mem_verifier *v, const uint8_t *msg, size_t len, uint64_t elapsed_ms,
                                     gn_attest_result *ret) {
  gn_wire_doc doc;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  const uint8_t *finals;
  size_t finals_len;
  gn_attest_result res;
  bool simulated;
  uint32_t picks[64];
  int r;
  if (v->state != V_AWAIT_RESULT)
    return GN_ESTATE;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  if ((r = gn_wire_get_bin_ref(doc.root, "finals", (size_t)v->p.walkers * 8u, &finals, &finals_len)) < 0 ||
      (r = gn_wire_get_bool(doc.root, "simulated", &simulated)) < 0)
    goto out;
  if (finals_len != (size_t)v->p.walkers * 8u) {
    r = GN_EINVAL;
    goto out;
  }
  if (sodium_memcmp(nonce, v->nonce, sizeof(nonce)) != 0) {
    r = GN_EREPLAY;
    goto out;
  }
  memset(&res, 0, sizeof(res));
  draw_walkers(v, picks);
  regen g = {v->key, v->p.cost};
  bool ok = true;
  for (uint32_t i = 0; i < v->p.samples && ok; i++) {
    uint64_t want = gn__attest_mem_walk(&v->p, v->seed, picks[i], regen_get, &g);
    if (le64_get(finals + (size_t)picks[i] * 8u) != want) {
      res.outcome = GN_ATTEST_FAILED;
      snprintf(res.verdict, sizeof(res.verdict), "failed: memory walker %u does not match the table", picks[i]);
      ok = false;
    }
  }
  if (ok && (r = gn_attest_mem_grade(&v->p, v->claimed, elapsed_ms, simulated, &res)) < 0)
    goto out;
  snprintf(res.claimed_class, sizeof(res.claimed_class), "%s", v->claimed);
  res.elapsed_ms = elapsed_ms;
  res.simulated = simulated;
  memcpy(res.nonce, v->nonce, sizeof(res.nonce));
  crypto_generichash(res.final_root, sizeof(res.final_root), finals, finals_len, NULL, 0);
  memcpy(res.roots_hash, res.final_root, sizeof(res.roots_hash));
  v->state = V_DONE;
  *ret = res;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

/* --- the CPU prover ----------------------------------------------------------------*/

enum { P_AWAIT_CHALLENGE, P_AWAIT_WALK, P_DONE };

struct gn_attest_mem_prover {
  const gn_attest_backend *cuda; /* NULL: the CPU prover */
  void *handle;                  /* the CUDA library's table */
  uint32_t max_table_mib;
  int state;
  gn_attest_mem_params p;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t *table;
};

int gn_attest_mem_prover_new(uint32_t max_table_mib, gn_attest_mem_prover **ret) {
  gn_attest_mem_prover *pr = calloc(1, sizeof(*pr));
  if (!pr)
    return GN_ENOMEM;
  pr->max_table_mib = max_table_mib;
  *ret = pr;
  return 0;
}

int gn_attest_mem_prover_new_cuda(const gn_attest_backend *cuda, uint32_t max_table_mib, gn_attest_mem_prover **ret) {
  gn_attest_mem_prover *pr;
  if (!cuda || strcmp(cuda->name, "cuda") != 0)
    return GN_EINVAL;
  int r = gn_attest_mem_prover_new(max_table_mib, &pr);
  if (r < 0)
    return r;
  pr->cuda = cuda;
  *ret = pr;
  return 0;
}

gn_attest_mem_prover *gn_attest_mem_prover_free(gn_attest_mem_prover *pr) {
  if (pr) {
    gn__attest_cuda_mem_free(pr->cuda, pr->handle);
    free(pr->table);
    free(pr);
  }
  return NULL;
}

int gn_attest_mem_prover_on_challenge(gn_attest_mem_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_ready) {
  gn_wire_doc doc;
  gn_attest_mem_params p;
  uint8_t nonce[GN_ATTEST_NONCE_LEN], key[32];
  uint8_t *table = NULL;
  gn_wire_writer w;
  int r;
  if (pr->state != P_AWAIT_CHALLENGE)
    return GN_ESTATE;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  r = gn_wire_get_u32(doc.root, "table_mib", &p.table_mib);
  if (r == 0)
    r = gn_wire_get_u32(doc.root, "cost", &p.cost);
  if (r == 0)
    r = gn_wire_get_u32(doc.root, "walkers", &p.walkers);
  if (r == 0)
    r = gn_wire_get_u32(doc.root, "steps", &p.steps);
  if (r == 0)
    r = gn_wire_get_u32(doc.root, "samples", &p.samples);
  gn_wire_doc_done(&doc);
  if (r < 0 || (r = gn_attest_mem_params_check(&p)) < 0)
    return r;
  if (p.table_mib > pr->max_table_mib)
    return GN_ETOOBIG;
  uint64_t entries = gn__attest_mem_entries(&p);
  void *handle = NULL;
  gn__attest_mem_key(&p, nonce, key);
  if (pr->cuda) {
    if ((r = gn__attest_cuda_mem_fill(pr->cuda, &p, key, &handle)) < 0)
      return r;
  } else {
    if (!(table = malloc((size_t)entries * 64u)))
      return GN_ENOMEM;
    for (uint64_t i = 0; i < entries; i++)
      gn__attest_mem_entry(key, (uint32_t)i, p.cost, table + i * 64u);
  }
  sodium_memzero(key, sizeof(key));
  gn_wire_writer_init(&w);
  put_head(&w, 2, nonce);
  r = gn_wire_writer_take(&w, ret_ready);
  gn_wire_writer_done(&w);
  if (r < 0) {
    free(table);
    gn__attest_cuda_mem_free(pr->cuda, handle);
    return r;
  }
  pr->p = p;
  memcpy(pr->nonce, nonce, sizeof(nonce));
  pr->table = table;
  pr->handle = handle;
  pr->state = P_AWAIT_WALK;
  return 0;
}

static void table_get(void *ctx, uint32_t index, uint8_t ret[64]) {
  memcpy(ret, (const uint8_t *)ctx + (size_t)index * 64u, 64);
}

int gn_attest_mem_prover_on_walk(gn_attest_mem_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_result) {
  gn_wire_doc doc;
  gn_wire_writer w;
  uint8_t nonce[GN_ATTEST_NONCE_LEN], seed[32];
  uint8_t *finals = NULL;
  int r;
  if (pr->state != P_AWAIT_WALK)
    return GN_ESTATE;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  r = gn_wire_get_bin_exact(doc.root, "seed", seed, sizeof(seed));
  gn_wire_doc_done(&doc);
  if (r < 0)
    return r;
  if (sodium_memcmp(nonce, pr->nonce, sizeof(nonce)) != 0)
    return GN_EREPLAY;
  if (!(finals = malloc((size_t)pr->p.walkers * 8u)))
    return GN_ENOMEM;
  if (pr->cuda) {
    if ((r = gn__attest_cuda_mem_walk(pr->cuda, pr->handle, seed, &pr->p, finals)) < 0) {
      free(finals);
      return r;
    }
  } else {
    for (uint32_t wk = 0; wk < pr->p.walkers; wk++) {
      uint64_t acc = gn__attest_mem_walk(&pr->p, seed, wk, table_get, pr->table);
      for (int i = 0; i < 8; i++)
        finals[(size_t)wk * 8u + (size_t)i] = (uint8_t)(acc >> (8 * i));
    }
  }
  gn_wire_writer_init(&w);
  put_head(&w, 4, nonce);
  gn_wire_put_str(&w, "finals");
  gn_wire_put_bin(&w, finals, (size_t)pr->p.walkers * 8u);
  gn_wire_put_str(&w, "simulated");
  gn_wire_put_bool(&w, pr->cuda == NULL);
  r = gn_wire_writer_take(&w, ret_result);
  gn_wire_writer_done(&w);
  free(finals);
  if (r < 0)
    return r;
  free(pr->table);
  pr->table = NULL;
  gn__attest_cuda_mem_free(pr->cuda, pr->handle);
  pr->handle = NULL;
  pr->state = P_DONE;
  return 0;
}
