/* The attestation exchange as two I/O-free state machines: the verifier
 * (challenge -> open request -> verdict) and the prover (response -> proof),
 * with bounded msgpack encoders and decoders for the four messages. */
#include "attest_int.h"

#include <gpunet/wire.h>
#include <sodium.h>
#include <stdio.h>

/* --- randomness ----------------------------------------------------------------*/

static void rng_fill(gn_attest_rng_fn rng, void *ctx, uint8_t *buf, size_t len) {
  if (rng)
    rng(ctx, buf, len);
  else
    randombytes_buf(buf, len);
}

/* A small deterministic stream from a 32-byte seed, for drawing the opened
 * rows: one seed from the injected rng, then ChaCha20 blocks. */
typedef struct draw {
  uint8_t seed[32];
  uint8_t block[64];
  uint32_t counter;
  size_t used;
} draw;

static uint64_t draw_u64(draw *d) {
  static const uint8_t zero_nonce[crypto_stream_chacha20_ietf_NONCEBYTES];
  if (d->used == 0 || d->used + 8 > sizeof(d->block)) {
    crypto_stream_chacha20_ietf(d->block, sizeof(d->block), zero_nonce, d->seed);
    /* Next block: re-key from the block's tail so the stream never repeats. */
    memcpy(d->seed, d->block + 32, 32);
    d->counter++;
    d->used = 0;
  }
  uint64_t v;
  memcpy(&v, d->block + d->used, 8);
  d->used += 8;
  return v;
}

/* Uniform in [0, bound), without modulo bias. */
static uint32_t draw_below(draw *d, uint32_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t v;
  do
    v = draw_u64(d);
  while (v >= limit);
  return (uint32_t)(v % bound);
}

/* count distinct values below bound, by rejection (count <= 64). */
static void draw_distinct(draw *d, uint32_t bound, uint32_t count, uint32_t *out) {
  for (uint32_t i = 0; i < count; i++) {
    uint32_t v;
    bool dup;
    do {
      v = draw_below(d, bound);
      dup = false;
      for (uint32_t j = 0; j < i; j++)
        dup = dup || out[j] == v;
    } while (dup);
    out[i] = v;
  }
}

/* --- messages ------------------------------------------------------------------*/

static void put_params(gn_wire_writer *w, const gn_attest_params *p) {
  gn_wire_put_str(w, "n");
  gn_wire_put_u64(w, p->n);
  gn_wire_put_str(w, "depth");
  gn_wire_put_u64(w, p->depth);
  gn_wire_put_str(w, "rounds");
  gn_wire_put_u64(w, p->rounds);
  gn_wire_put_str(w, "open_rounds");
  gn_wire_put_u64(w, p->open_rounds);
  gn_wire_put_str(w, "open_rows");
  gn_wire_put_u64(w, p->open_rows);
}

static int get_params(const msgpack_object *m, gn_attest_params *ret) {
  gn_attest_params p;
  int r;
  if ((r = gn_wire_get_u32(m, "n", &p.n)) < 0 || (r = gn_wire_get_u32(m, "depth", &p.depth)) < 0 ||
      (r = gn_wire_get_u32(m, "rounds", &p.rounds)) < 0 ||
      (r = gn_wire_get_u32(m, "open_rounds", &p.open_rounds)) < 0 ||
      (r = gn_wire_get_u32(m, "open_rows", &p.open_rows)) < 0)
    return r;
  if ((r = gn_attest_params_check(&p)) < 0)
    return r;
  *ret = p;
  return 0;
}

static int get_u32_array(const msgpack_object *m, const char *key, uint32_t count, uint32_t bound, uint32_t *out) {
  const msgpack_object_array *a;
  int r = gn_wire_get_array(m, key, count, &a);
  if (r < 0)
    return r;
  if (a->size != count)
    return GN_EINVAL;
  for (uint32_t i = 0; i < count; i++) {
    if (a->ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a->ptr[i].via.u64 >= bound)
      return GN_EINVAL;
    out[i] = (uint32_t)a->ptr[i].via.u64;
  }
  return 0;
}

/* Opened positions must be distinct rounds, each with distinct rows: a
 * repeated row would let a prover answer fewer rows than the math assumes. */
static int check_distinct(const uint32_t *v, uint32_t count) {
  for (uint32_t i = 0; i < count; i++)
    for (uint32_t j = 0; j < i; j++)
      if (v[i] == v[j])
        return GN_EINVAL;
  return 0;
}

static void put_open(gn_wire_writer *w, const uint8_t nonce[GN_ATTEST_NONCE_LEN], const gn_attest_params *p,
                     const uint32_t *rounds, const uint32_t *rows) {
  gn_wire_put_map(w, 4);
  gn_wire_put_str(w, "v");
  gn_wire_put_u64(w, GN_ATTEST_VERSION);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, nonce, GN_ATTEST_NONCE_LEN);
  gn_wire_put_str(w, "rounds");
  gn_wire_put_array(w, p->open_rounds);
  for (uint32_t i = 0; i < p->open_rounds; i++)
    gn_wire_put_u64(w, rounds[i]);
  gn_wire_put_str(w, "rows");
  gn_wire_put_array(w, p->open_rounds * p->open_rows);
  for (uint32_t i = 0; i < p->open_rounds * p->open_rows; i++)
    gn_wire_put_u64(w, rows[i]);
}

static void row_to_le(const int32_t *row, uint32_t n, uint8_t *out) {
  for (uint32_t j = 0; j < n; j++) {
    uint32_t u = (uint32_t)row[j];
    out[4 * j] = (uint8_t)u;
    out[4 * j + 1] = (uint8_t)(u >> 8);
    out[4 * j + 2] = (uint8_t)(u >> 16);
    out[4 * j + 3] = (uint8_t)(u >> 24);
  }
}

/* --- verifier ------------------------------------------------------------------*/

enum { V_AWAIT_RESPONSE, V_AWAIT_PROOF, V_DONE };

struct gn_attest_verifier {
  gn_attest_params p;
  char claimed[GN_ATTEST_CLASS_STRLEN];
  gn_attest_rng_fn rng;
  void *rng_ctx;
  int state;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t *roots; /* rounds * 32 */
  bool simulated;
  uint64_t prover_ms;
  uint32_t open_rounds[GN_ATTEST_OPEN_ROUNDS_MAX];
  uint32_t open_rows[GN_ATTEST_OPEN_ROUNDS_MAX * GN_ATTEST_OPEN_ROWS_MAX];
};

int gn_attest_verifier_new(const gn_attest_params *p, const char *claimed_class, gn_attest_rng_fn rng, void *rng_ctx,
                           gn_buf *ret_challenge, gn_attest_verifier **ret_v) {
  gn_wire_writer w;
  int r;
  if ((r = gn_attest_params_check(p)) < 0)
    return r;
  if (!claimed_class || strlen(claimed_class) >= GN_ATTEST_CLASS_STRLEN)
    return GN_EINVAL;
  gn_attest_verifier *v = calloc(1, sizeof(*v));
  if (!v)
    return GN_ENOMEM;
  v->p = *p;
  snprintf(v->claimed, sizeof(v->claimed), "%s", claimed_class);
  v->rng = rng;
  v->rng_ctx = rng_ctx;
  rng_fill(rng, rng_ctx, v->nonce, sizeof(v->nonce));
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 7);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_ATTEST_VERSION);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, v->nonce, sizeof(v->nonce));
  put_params(&w, p);
  r = gn_wire_writer_take(&w, ret_challenge);
  gn_wire_writer_done(&w);
  if (r < 0) {
    gn_attest_verifier_free(v);
    return r;
  }
  *ret_v = v;
  return 0;
}

gn_attest_verifier *gn_attest_verifier_free(gn_attest_verifier *v) {
  if (v) {
    free(v->roots);
    free(v);
  }
  return NULL;
}

int gn_attest_verifier_on_response(gn_attest_verifier *v, const uint8_t *msg, size_t len, gn_buf *ret_open) {
  gn_wire_doc doc;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  const uint8_t *roots;
  size_t roots_len;
  uint64_t prover_ms;
  bool simulated;
  uint8_t *copy = NULL;
  draw d = {0};
  int r;
  if (v->state != V_AWAIT_RESPONSE)
    return GN_ESTATE;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  if ((r = gn_wire_get_bin_ref(doc.root, "roots", (size_t)v->p.rounds * GN_ATTEST_HASH_LEN, &roots, &roots_len)) < 0 ||
      (r = gn_wire_get_u64(doc.root, "prover_ms", &prover_ms)) < 0 ||
      (r = gn_wire_get_bool(doc.root, "simulated", &simulated)) < 0)
    goto out;
  if (roots_len != (size_t)v->p.rounds * GN_ATTEST_HASH_LEN) {
    r = GN_EINVAL;
    goto out;
  }
  /* A response to any other challenge (an old one replayed, or one meant for
   * another verifier) is refused before anything else is looked at. */
  if (sodium_memcmp(nonce, v->nonce, sizeof(nonce)) != 0) {
    r = GN_EREPLAY;
    goto out;
  }
  if (!(copy = malloc(roots_len))) {
    r = GN_ENOMEM;
    goto out;
  }
  memcpy(copy, roots, roots_len);
  /* The rows to open are drawn only now, from fresh randomness, so the prover
   * could not know them while it committed to the roots. */
  rng_fill(v->rng, v->rng_ctx, d.seed, sizeof(d.seed));
  uint32_t open_rounds[GN_ATTEST_OPEN_ROUNDS_MAX];
  uint32_t open_rows[GN_ATTEST_OPEN_ROUNDS_MAX * GN_ATTEST_OPEN_ROWS_MAX];
  draw_distinct(&d, v->p.rounds, v->p.open_rounds, open_rounds);
  for (uint32_t i = 0; i < v->p.open_rounds; i++)
    draw_distinct(&d, v->p.n, v->p.open_rows, open_rows + i * v->p.open_rows);
  sodium_memzero(&d, sizeof(d));
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  put_open(&w, v->nonce, &v->p, open_rounds, open_rows);
  r = gn_wire_writer_take(&w, ret_open);
  gn_wire_writer_done(&w);
  if (r < 0)
    goto out;
  v->roots = copy;
  copy = NULL;
  v->prover_ms = prover_ms;
  v->simulated = simulated;
  memcpy(v->open_rounds, open_rounds, sizeof(open_rounds[0]) * v->p.open_rounds);
  memcpy(v->open_rows, open_rows, sizeof(open_rows[0]) * v->p.open_rounds * v->p.open_rows);
  v->state = V_AWAIT_PROOF;
out:
  free(copy);
  gn_wire_doc_done(&doc);
  return r;
}

static void fail(gn_attest_result *res, const char *fmt, uint32_t round, uint32_t row) {
  res->outcome = GN_ATTEST_FAILED;
  snprintf(res->verdict, sizeof(res->verdict), fmt, round, row);
}

/* Checks every opened row: recomputes it from the nonce and the previous
 * round's claimed root, compares it with the prover's bytes, and walks its
 * Merkle path to the claimed root. Fills res on failure; returns < 0 only
 * for a malformed message or no memory. */
static int check_proof(gn_attest_verifier *v, const msgpack_object_array *rows, const msgpack_object_array *paths,
                       gn_attest_result *res, bool *ret_ok) {
  static const uint8_t zero[GN_ATTEST_HASH_LEN];
  const gn_attest_params *p = &v->p;
  uint32_t n = p->n, levels = gn__attest_log2(n);
  uint32_t total = p->open_rounds * p->open_rows;
  int r = GN_ENOMEM;
  bool ok = true;
  int8_t *b = malloc((size_t)n * n);
  int8_t *a = malloc(n), *scratch = malloc(n);
  int32_t *row = malloc((size_t)n * sizeof(*row));
  uint8_t *le = malloc((size_t)n * 4u);
  if (!b || !a || !scratch || !row || !le)
    goto out;
  /* Shapes first, so that a malformed proof is an error whatever the rows. */
  for (uint32_t q = 0; q < total; q++) {
    if (rows->ptr[q].type != MSGPACK_OBJECT_BIN || rows->ptr[q].via.bin.size != (size_t)n * 4u ||
        paths->ptr[q].type != MSGPACK_OBJECT_BIN || paths->ptr[q].via.bin.size != (size_t)levels * GN_ATTEST_HASH_LEN) {
      r = GN_EINVAL;
      goto out;
    }
  }
  for (uint32_t i = 0; i < p->open_rounds && ok; i++) {
    uint32_t rd = v->open_rounds[i];
    const uint8_t *prev = rd ? v->roots + (size_t)(rd - 1) * GN_ATTEST_HASH_LEN : zero;
    uint8_t key_a[32], key_b[32];
    gn__attest_round_key(p, v->nonce, rd, prev, 'A', key_a);
    gn__attest_round_key(p, v->nonce, rd, prev, 'B', key_b);
    gn__attest_matrix_rows(key_b, n, 0, n, b);
    for (uint32_t j = 0; j < p->open_rows && ok; j++) {
      uint32_t q = i * p->open_rows + j, ri = v->open_rows[q];
      uint8_t leaf[GN_ATTEST_HASH_LEN];
      gn__attest_matrix_rows(key_a, n, ri, 1, a);
      gn__attest_round_rows(p, a, b, row, 1, scratch);
      row_to_le(row, n, le);
      if (memcmp(le, rows->ptr[q].via.bin.ptr, (size_t)n * 4u) != 0) {
        fail(res, "failed: round %u row %u is not the product the challenge asks for", rd, ri);
        ok = false;
        break;
      }
      gn__attest_leaf_hash(row, n, leaf);
      if (gn__attest_merkle_check(leaf, n, ri, (const uint8_t *)paths->ptr[q].via.bin.ptr,
                                  v->roots + (size_t)rd * GN_ATTEST_HASH_LEN) < 0) {
        fail(res, "failed: round %u row %u is not under the committed root", rd, ri);
        ok = false;
      }
    }
  }
  *ret_ok = ok;
  r = 0;
out:
  free(b);
  free(a);
  free(scratch);
  free(row);
  free(le);
  return r;
}

int gn_attest_verifier_on_proof(gn_attest_verifier *v, const uint8_t *msg, size_t len, uint64_t elapsed_ms,
                                gn_attest_result *ret) {
  gn_wire_doc doc;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  const msgpack_object_array *rows, *paths;
  gn_attest_result res;
  uint32_t total = v->p.open_rounds * v->p.open_rows;
  bool ok = false;
  int r;
  if (v->state != V_AWAIT_PROOF)
    return GN_ESTATE;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  if ((r = gn_wire_get_array(doc.root, "rows", total, &rows)) < 0 ||
      (r = gn_wire_get_array(doc.root, "paths", total, &paths)) < 0)
    goto out;
  if (rows->size != total || paths->size != total) {
    r = GN_EINVAL;
    goto out;
  }
  if (sodium_memcmp(nonce, v->nonce, sizeof(nonce)) != 0) {
    r = GN_EREPLAY;
    goto out;
  }
  memset(&res, 0, sizeof(res));
  if ((r = check_proof(v, rows, paths, &res, &ok)) < 0)
    goto out;
  if (ok && (r = gn_attest_grade(&v->p, v->claimed, elapsed_ms, v->simulated, &res)) < 0)
    goto out;
  snprintf(res.claimed_class, sizeof(res.claimed_class), "%s", v->claimed);
  res.elapsed_ms = elapsed_ms;
  res.prover_ms = v->prover_ms;
  res.simulated = v->simulated;
  memcpy(res.nonce, v->nonce, sizeof(res.nonce));
  memcpy(res.final_root, v->roots + (size_t)(v->p.rounds - 1) * GN_ATTEST_HASH_LEN, GN_ATTEST_HASH_LEN);
  gn__attest_roots_hash(v->roots, v->p.rounds, res.roots_hash);
  v->state = V_DONE;
  *ret = res;
out:
  gn_wire_doc_done(&doc);
  return r;
}

/* --- prover --------------------------------------------------------------------*/

enum { P_AWAIT_CHALLENGE, P_AWAIT_OPEN, P_DONE };

struct gn_attest_prover {
  const gn_attest_backend *b;
  double max_ops;
  int state;
  gn_attest_params p;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t *roots;
};

int gn_attest_prover_new(const gn_attest_backend *b, gn_attest_prover **ret) {
  if (!b || !b->chain || !b->round_output)
    return GN_EINVAL;
  gn_attest_prover *pr = calloc(1, sizeof(*pr));
  if (!pr)
    return GN_ENOMEM;
  pr->b = b;
  pr->max_ops = GN_ATTEST_PROVER_MAX_OPS;
  *ret = pr;
  return 0;
}

gn_attest_prover *gn_attest_prover_free(gn_attest_prover *pr) {
  if (pr) {
    free(pr->roots);
    free(pr);
  }
  return NULL;
}

void gn_attest_prover_set_max_ops(gn_attest_prover *pr, double max_ops) {
  pr->max_ops = max_ops;
}

int gn_attest_prover_on_challenge(gn_attest_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_response) {
  gn_wire_doc doc;
  gn_attest_params p;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t *roots = NULL;
  int r;
  if (pr->state != P_AWAIT_CHALLENGE)
    return GN_ESTATE;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  if ((r = get_params(doc.root, &p)) < 0)
    goto out;
  if (gn_attest_params_ops(&p) > pr->max_ops) {
    r = GN_ETOOBIG;
    goto out;
  }
  if (!(roots = malloc((size_t)p.rounds * GN_ATTEST_HASH_LEN))) {
    r = GN_ENOMEM;
    goto out;
  }
  uint64_t t0 = gn_mono_ms();
  if ((r = pr->b->chain(pr->b->ctx, &p, nonce, roots)) < 0)
    goto out;
  uint64_t prover_ms = gn_mono_ms() - t0;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 6);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_ATTEST_VERSION);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, nonce, sizeof(nonce));
  gn_wire_put_str(&w, "roots");
  gn_wire_put_bin(&w, roots, (size_t)p.rounds * GN_ATTEST_HASH_LEN);
  gn_wire_put_str(&w, "prover_ms");
  gn_wire_put_u64(&w, prover_ms);
  gn_wire_put_str(&w, "simulated");
  gn_wire_put_bool(&w, pr->b->simulated);
  gn_wire_put_str(&w, "backend");
  gn_wire_put_str(&w, pr->b->name);
  r = gn_wire_writer_take(&w, ret_response);
  gn_wire_writer_done(&w);
  if (r < 0)
    goto out;
  pr->p = p;
  memcpy(pr->nonce, nonce, sizeof(nonce));
  pr->roots = roots;
  roots = NULL;
  pr->state = P_AWAIT_OPEN;
out:
  free(roots);
  gn_wire_doc_done(&doc);
  return r;
}

int gn_attest_prover_on_open(gn_attest_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_proof) {
  static const uint8_t zero[GN_ATTEST_HASH_LEN];
  gn_wire_doc doc;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  const gn_attest_params *p = &pr->p;
  uint32_t open_rounds[GN_ATTEST_OPEN_ROUNDS_MAX];
  uint32_t open_rows[GN_ATTEST_OPEN_ROUNDS_MAX * GN_ATTEST_OPEN_ROWS_MAX];
  uint32_t levels, total;
  int32_t *c = NULL;
  uint8_t *paths = NULL, *le = NULL;
  gn_wire_writer w;
  int r;
  if (pr->state != P_AWAIT_OPEN)
    return GN_ESTATE;
  levels = gn__attest_log2(p->n);
  total = p->open_rounds * p->open_rows;
  if ((r = gn__attest_open_doc(msg, len, &doc, nonce)) < 0)
    return r;
  gn_wire_writer_init(&w);
  if (sodium_memcmp(nonce, pr->nonce, sizeof(nonce)) != 0) {
    r = GN_EREPLAY;
    goto out;
  }
  if ((r = get_u32_array(doc.root, "rounds", p->open_rounds, p->rounds, open_rounds)) < 0 ||
      (r = get_u32_array(doc.root, "rows", total, p->n, open_rows)) < 0 ||
      (r = check_distinct(open_rounds, p->open_rounds)) < 0)
    goto out;
  for (uint32_t i = 0; i < p->open_rounds; i++)
    if ((r = check_distinct(open_rows + i * p->open_rows, p->open_rows)) < 0)
      goto out;
  c = malloc((size_t)p->n * p->n * sizeof(*c));
  paths = malloc((size_t)total * levels * GN_ATTEST_HASH_LEN);
  le = malloc((size_t)p->n * 4u);
  if (!c || !paths || !le) {
    r = GN_ENOMEM;
    goto out;
  }
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_ATTEST_VERSION);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, nonce, sizeof(nonce));
  gn_wire_put_str(&w, "rows");
  gn_wire_put_array(&w, total);
  /* Opening recomputes each opened round from its predecessor's root rather
   * than keeping every round's output (rounds * n^2 * 4 bytes). */
  for (uint32_t i = 0; i < p->open_rounds; i++) {
    uint32_t rd = open_rounds[i];
    uint8_t root[GN_ATTEST_HASH_LEN];
    const uint8_t *prev = rd ? pr->roots + (size_t)(rd - 1) * GN_ATTEST_HASH_LEN : zero;
    if ((r = pr->b->round_output(pr->b->ctx, p, pr->nonce, rd, prev, c)) < 0)
      goto out;
    if ((r = gn__attest_merkle(c, p->n, open_rows + i * p->open_rows, p->open_rows,
                               paths + (size_t)i * p->open_rows * levels * GN_ATTEST_HASH_LEN, root)) < 0)
      goto out;
    for (uint32_t j = 0; j < p->open_rows; j++) {
      row_to_le(c + (size_t)open_rows[i * p->open_rows + j] * p->n, p->n, le);
      gn_wire_put_bin(&w, le, (size_t)p->n * 4u);
    }
  }
  gn_wire_put_str(&w, "paths");
  gn_wire_put_array(&w, total);
  for (uint32_t q = 0; q < total; q++)
    gn_wire_put_bin(&w, paths + (size_t)q * levels * GN_ATTEST_HASH_LEN, (size_t)levels * GN_ATTEST_HASH_LEN);
  if ((r = gn_wire_writer_take(&w, ret_proof)) < 0)
    goto out;
  pr->state = P_DONE;
out:
  gn_wire_writer_done(&w);
  free(c);
  free(paths);
  free(le);
  gn_wire_doc_done(&doc);
  return r;
}

int gn_attest_run_local(const gn_attest_backend *b, const gn_attest_params *p, const char *claimed_class,
                        gn_attest_result *ret) {
  gn_buf ch = {0}, resp = {0}, open = {0}, proof = {0};
  gn_attest_verifier *v = NULL;
  gn_attest_prover *pr = NULL;
  int r;
  if ((r = gn_attest_verifier_new(p, claimed_class, NULL, NULL, &ch, &v)) < 0 || (r = gn_attest_prover_new(b, &pr)) < 0)
    goto out;
  uint64_t t0 = gn_mono_ms();
  if ((r = gn_attest_prover_on_challenge(pr, ch.data, ch.len, &resp)) < 0)
    goto out;
  uint64_t elapsed_ms = gn_mono_ms() - t0;
  if ((r = gn_attest_verifier_on_response(v, resp.data, resp.len, &open)) < 0 ||
      (r = gn_attest_prover_on_open(pr, open.data, open.len, &proof)) < 0 ||
      (r = gn_attest_verifier_on_proof(v, proof.data, proof.len, elapsed_ms, ret)) < 0)
    goto out;
out:
  gn_attest_prover_free(pr);
  gn_attest_verifier_free(v);
  gn_buf_done(&ch);
  gn_buf_done(&resp);
  gn_buf_done(&open);
  gn_buf_done(&proof);
  return r;
}
