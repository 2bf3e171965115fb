/* Signed attestation reports: the provider's report (GN_MSG_ATTEST_REPORT)
 * and the verifier's verdict (GN_MSG_ATTEST_VERDICT) it may carry, both
 * msgpack bodies in signed envelopes, decoded with explicit bounds. */
#include "attest_int.h"

#include <gpunet/wire.h>
#include <sodium.h>
#include <stdio.h>

/* A verdict envelope nested in a report: small, but bounded anyway. */
#define VERDICT_ENV_MAX 4096u

/* The fields a verdict and a report must agree on. */
typedef struct exchange {
  gn_attest_params params;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t final_root[GN_ATTEST_HASH_LEN];
  uint8_t roots_hash[GN_ATTEST_HASH_LEN];
  uint64_t elapsed_ms;
  char claimed_class[GN_ATTEST_CLASS_STRLEN];
  char verdict[GN_ATTEST_VERDICT_STRLEN];
  bool simulated;
  int64_t issued_s;
} exchange;

#define EXCHANGE_KEYS 14

static void put_exchange(gn_wire_writer *w, const exchange *x) {
  gn_wire_put_str(w, "n");
  gn_wire_put_u64(w, x->params.n);
  gn_wire_put_str(w, "depth");
  gn_wire_put_u64(w, x->params.depth);
  gn_wire_put_str(w, "rounds");
  gn_wire_put_u64(w, x->params.rounds);
  gn_wire_put_str(w, "open_rounds");
  gn_wire_put_u64(w, x->params.open_rounds);
  gn_wire_put_str(w, "open_rows");
  gn_wire_put_u64(w, x->params.open_rows);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, x->nonce, sizeof(x->nonce));
  gn_wire_put_str(w, "final_root");
  gn_wire_put_bin(w, x->final_root, sizeof(x->final_root));
  gn_wire_put_str(w, "roots_hash");
  gn_wire_put_bin(w, x->roots_hash, sizeof(x->roots_hash));
  gn_wire_put_str(w, "elapsed_ms");
  gn_wire_put_u64(w, x->elapsed_ms);
  gn_wire_put_str(w, "class");
  gn_wire_put_str(w, x->claimed_class);
  gn_wire_put_str(w, "verdict");
  gn_wire_put_str(w, x->verdict);
  gn_wire_put_str(w, "simulated");
  gn_wire_put_bool(w, x->simulated);
  gn_wire_put_str(w, "issued_s");
  gn_wire_put_i64(w, x->issued_s);
  gn_wire_put_str(w, "v");
  gn_wire_put_u64(w, GN_ATTEST_VERSION);
}

static int get_exchange(const msgpack_object *m, exchange *ret) {
  exchange x;
  uint64_t v;
  int r;
  if (m->type != MSGPACK_OBJECT_MAP)
    return GN_EINVAL;
  if ((r = gn_wire_get_u64(m, "v", &v)) < 0)
    return r;
  if (v != GN_ATTEST_VERSION)
    return GN_EVERSION;
  if ((r = gn_wire_get_u32(m, "n", &x.params.n)) < 0 || (r = gn_wire_get_u32(m, "depth", &x.params.depth)) < 0 ||
      (r = gn_wire_get_u32(m, "rounds", &x.params.rounds)) < 0 ||
      (r = gn_wire_get_u32(m, "open_rounds", &x.params.open_rounds)) < 0 ||
      (r = gn_wire_get_u32(m, "open_rows", &x.params.open_rows)) < 0 ||
      (r = gn_wire_get_bin_exact(m, "nonce", x.nonce, sizeof(x.nonce))) < 0 ||
      (r = gn_wire_get_bin_exact(m, "final_root", x.final_root, sizeof(x.final_root))) < 0 ||
      (r = gn_wire_get_bin_exact(m, "roots_hash", x.roots_hash, sizeof(x.roots_hash))) < 0 ||
      (r = gn_wire_get_u64(m, "elapsed_ms", &x.elapsed_ms)) < 0 ||
      (r = gn_wire_get_str(m, "class", x.claimed_class, sizeof(x.claimed_class))) < 0 ||
      (r = gn_wire_get_str(m, "verdict", x.verdict, sizeof(x.verdict))) < 0 ||
      (r = gn_wire_get_bool(m, "simulated", &x.simulated)) < 0 || (r = gn_wire_get_i64(m, "issued_s", &x.issued_s)) < 0)
    return r;
  if ((r = gn_attest_params_check(&x.params)) < 0)
    return r;
  *ret = x;
  return 0;
}

static bool exchange_same(const exchange *a, const exchange *b) {
  return memcmp(&a->params, &b->params, sizeof(a->params)) == 0 && memcmp(a->nonce, b->nonce, sizeof(a->nonce)) == 0 &&
         memcmp(a->final_root, b->final_root, sizeof(a->final_root)) == 0 &&
         memcmp(a->roots_hash, b->roots_hash, sizeof(a->roots_hash)) == 0 && a->elapsed_ms == b->elapsed_ms &&
         strcmp(a->claimed_class, b->claimed_class) == 0 && strcmp(a->verdict, b->verdict) == 0 &&
         a->simulated == b->simulated;
}

static void exchange_from_report(const gn_attest_report *r, exchange *x) {
  memset(x, 0, sizeof(*x));
  x->params = r->params;
  memcpy(x->nonce, r->nonce, sizeof(x->nonce));
  memcpy(x->final_root, r->final_root, sizeof(x->final_root));
  memcpy(x->roots_hash, r->roots_hash, sizeof(x->roots_hash));
  x->elapsed_ms = r->elapsed_ms;
  snprintf(x->claimed_class, sizeof(x->claimed_class), "%s", r->claimed_class);
  snprintf(x->verdict, sizeof(x->verdict), "%s", r->verdict);
  x->simulated = r->simulated;
  x->issued_s = r->issued_s;
}

void gn_attest_report_done(gn_attest_report *r) {
  if (!r)
    return;
  free(r->verdict_env);
  r->verdict_env = NULL;
  r->verdict_env_len = 0;
  r->has_verifier = false;
  free(r->lease_env);
  r->lease_env = NULL;
  r->lease_env_len = 0;
}

int gn_attest_report_set_lease(gn_attest_report *r, const uint8_t *env, size_t len) {
  if (!env || !len)
    return GN_EINVAL;
  if (len > GN_ATTEST_LEASE_ENV_MAX)
    return GN_ETOOBIG;
  uint8_t *copy = malloc(len);
  if (!copy)
    return GN_ENOMEM;
  memcpy(copy, env, len);
  free(r->lease_env);
  r->lease_env = copy;
  r->lease_env_len = len;
  return 0;
}

void gn_attest_report_from_result(gn_attest_report *r, const gn_attest_gpu *gpu, const gn_attest_params *p,
                                  const gn_attest_result *res, int64_t issued_s) {
  memset(r, 0, sizeof(*r));
  if (gpu)
    r->gpu = *gpu;
  r->params = *p;
  memcpy(r->nonce, res->nonce, sizeof(r->nonce));
  memcpy(r->final_root, res->final_root, sizeof(r->final_root));
  memcpy(r->roots_hash, res->roots_hash, sizeof(r->roots_hash));
  r->prover_ms = res->prover_ms;
  r->elapsed_ms = res->elapsed_ms;
  snprintf(r->claimed_class, sizeof(r->claimed_class), "%s", res->claimed_class);
  snprintf(r->verdict, sizeof(r->verdict), "%s", res->verdict);
  r->simulated = res->simulated;
  r->issued_s = issued_s;
}

int gn_attest_verdict_seal(const gn_identity *verifier, const uint8_t provider[GN_PK_LEN], const gn_attest_params *p,
                           const gn_attest_result *res, int64_t issued_s, gn_buf *ret) {
  gn_attest_report tmp;
  exchange x;
  gn_wire_writer w;
  gn_buf body = {0};
  int r;
  gn_attest_report_from_result(&tmp, NULL, p, res, issued_s);
  exchange_from_report(&tmp, &x);
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, EXCHANGE_KEYS + 1);
  put_exchange(&w, &x);
  gn_wire_put_str(&w, "provider");
  gn_wire_put_bin(&w, provider, GN_PK_LEN);
  if ((r = gn_wire_writer_take(&w, &body)) == 0)
    r = gn_envelope_seal(verifier, GN_MSG_ATTEST_VERDICT, body.data, body.len, ret);
  gn_wire_writer_done(&w);
  gn_buf_done(&body);
  return r;
}

/* Opens a verdict envelope and returns its exchange, signer and subject. */
static int verdict_open(const uint8_t *env, size_t len, exchange *ret_x, uint8_t ret_signer[GN_PK_LEN],
                        uint8_t ret_provider[GN_PK_LEN]) {
  gn_envelope e;
  gn_wire_doc doc;
  exchange x;
  uint8_t provider[GN_PK_LEN];
  int r;
  if (len > VERDICT_ENV_MAX)
    return GN_ETOOBIG;
  if ((r = gn_envelope_open(env, len, &e)) < 0)
    return r;
  if (e.type != GN_MSG_ATTEST_VERDICT)
    return GN_EPROTO;
  if ((r = gn_wire_decode(e.body, e.body_len, &doc)) < 0)
    return r;
  if ((r = get_exchange(doc.root, &x)) == 0)
    r = gn_wire_get_bin_exact(doc.root, "provider", provider, sizeof(provider));
  gn_wire_doc_done(&doc);
  if (r < 0)
    return r;
  *ret_x = x;
  memcpy(ret_signer, e.signer, GN_PK_LEN);
  memcpy(ret_provider, provider, GN_PK_LEN);
  return 0;
}

int gn_attest_report_attach_verdict(gn_attest_report *r, const uint8_t provider[GN_PK_LEN], const uint8_t *env,
                                    size_t len) {
  exchange x, mine;
  uint8_t signer[GN_PK_LEN], subject[GN_PK_LEN];
  uint8_t *copy;
  int rc;
  if ((rc = verdict_open(env, len, &x, signer, subject)) < 0)
    return rc;
  exchange_from_report(r, &mine);
  /* The verdict is about this exchange (nonce, roots, parameters) and this
   * provider; its timing and verdict replace the report's own. */
  if (memcmp(subject, provider, GN_PK_LEN) != 0 || memcmp(&x.params, &mine.params, sizeof(x.params)) != 0 ||
      memcmp(x.nonce, mine.nonce, sizeof(x.nonce)) != 0 || memcmp(x.final_root, mine.final_root, 32) != 0 ||
      memcmp(x.roots_hash, mine.roots_hash, 32) != 0)
    return GN_EPROTO;
  if (!(copy = malloc(len)))
    return GN_ENOMEM;
  memcpy(copy, env, len);
  free(r->verdict_env);
  r->verdict_env = copy;
  r->verdict_env_len = len;
  r->has_verifier = true;
  memcpy(r->verifier, signer, GN_PK_LEN);
  r->verdict_issued_s = x.issued_s;
  r->elapsed_ms = x.elapsed_ms;
  memcpy(r->claimed_class, x.claimed_class, sizeof(r->claimed_class));
  memcpy(r->verdict, x.verdict, sizeof(r->verdict));
  r->simulated = x.simulated;
  return 0;
}

int gn_attest_report_from_verdict(gn_attest_report *r, const gn_attest_gpu *gpu, const uint8_t provider[GN_PK_LEN],
                                  const uint8_t *env, size_t len, uint64_t prover_ms, int64_t issued_s) {
  exchange x;
  uint8_t signer[GN_PK_LEN], subject[GN_PK_LEN];
  gn_attest_report tmp;
  int rc;
  if ((rc = verdict_open(env, len, &x, signer, subject)) < 0)
    return rc;
  if (memcmp(subject, provider, GN_PK_LEN) != 0)
    return GN_EPERM;
  memset(&tmp, 0, sizeof(tmp));
  tmp.gpu = *gpu;
  tmp.params = x.params;
  memcpy(tmp.nonce, x.nonce, sizeof(tmp.nonce));
  memcpy(tmp.final_root, x.final_root, sizeof(tmp.final_root));
  memcpy(tmp.roots_hash, x.roots_hash, sizeof(tmp.roots_hash));
  tmp.prover_ms = prover_ms;
  tmp.issued_s = issued_s;
  if ((rc = gn_attest_report_attach_verdict(&tmp, provider, env, len)) < 0) {
    gn_attest_report_done(&tmp);
    return rc;
  }
  gn_attest_report_done(r);
  *r = tmp;
  return 0;
}

int gn_attest_report_seal(const gn_identity *provider, const gn_attest_report *r, gn_buf *ret) {
  exchange x;
  gn_wire_writer w;
  gn_buf body = {0};
  int rc;
  exchange_from_report(r, &x);
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, EXCHANGE_KEYS + 7 + (r->lease_env ? 1 : 0));
  put_exchange(&w, &x);
  gn_wire_put_str(&w, "gpu_uuid");
  gn_wire_put_str(&w, r->gpu.uuid);
  gn_wire_put_str(&w, "gpu_name");
  gn_wire_put_str(&w, r->gpu.name);
  gn_wire_put_str(&w, "memory_mib");
  gn_wire_put_u64(&w, r->gpu.memory_mib);
  gn_wire_put_str(&w, "pci_bus_id");
  gn_wire_put_str(&w, r->gpu.pci_bus_id);
  gn_wire_put_str(&w, "driver");
  gn_wire_put_str(&w, r->gpu.driver);
  gn_wire_put_str(&w, "prover_ms");
  gn_wire_put_u64(&w, r->prover_ms);
  gn_wire_put_str(&w, "verdict_env");
  if (r->has_verifier && r->verdict_env)
    gn_wire_put_bin(&w, r->verdict_env, r->verdict_env_len);
  else
    gn_wire_put_nil(&w);
  if (r->lease_env) {
    gn_wire_put_str(&w, "lease");
    gn_wire_put_bin(&w, r->lease_env, r->lease_env_len);
  }
  if ((rc = gn_wire_writer_take(&w, &body)) == 0)
    rc = gn_envelope_seal(provider, GN_MSG_ATTEST_REPORT, body.data, body.len, ret);
  gn_wire_writer_done(&w);
  gn_buf_done(&body);
  return rc;
}

int gn_attest_report_open(const uint8_t *env, size_t len, gn_attest_report *ret, uint8_t ret_provider[GN_PK_LEN]) {
  gn_envelope e;
  gn_wire_doc doc;
  gn_attest_report rep;
  exchange x;
  const msgpack_object *venv, *lease;
  int r;
  memset(&rep, 0, sizeof(rep));
  if ((r = gn_envelope_open(env, len, &e)) < 0)
    return r;
  if (e.type != GN_MSG_ATTEST_REPORT)
    return GN_EPROTO;
  if ((r = gn_wire_decode(e.body, e.body_len, &doc)) < 0)
    return r;
  uint32_t mem;
  if ((r = get_exchange(doc.root, &x)) < 0 ||
      (r = gn_wire_get_str(doc.root, "gpu_uuid", rep.gpu.uuid, sizeof(rep.gpu.uuid))) < 0 ||
      (r = gn_wire_get_str(doc.root, "gpu_name", rep.gpu.name, sizeof(rep.gpu.name))) < 0 ||
      (r = gn_wire_get_u32(doc.root, "memory_mib", &mem)) < 0 ||
      (r = gn_wire_get_str(doc.root, "pci_bus_id", rep.gpu.pci_bus_id, sizeof(rep.gpu.pci_bus_id))) < 0 ||
      (r = gn_wire_get_str(doc.root, "driver", rep.gpu.driver, sizeof(rep.gpu.driver))) < 0 ||
      (r = gn_wire_get_u64(doc.root, "prover_ms", &rep.prover_ms)) < 0)
    goto out;
  rep.gpu.memory_mib = mem;
  rep.params = x.params;
  memcpy(rep.nonce, x.nonce, sizeof(rep.nonce));
  memcpy(rep.final_root, x.final_root, sizeof(rep.final_root));
  memcpy(rep.roots_hash, x.roots_hash, sizeof(rep.roots_hash));
  rep.elapsed_ms = x.elapsed_ms;
  memcpy(rep.claimed_class, x.claimed_class, sizeof(rep.claimed_class));
  memcpy(rep.verdict, x.verdict, sizeof(rep.verdict));
  rep.simulated = x.simulated;
  rep.issued_s = x.issued_s;
  if (!(venv = gn_wire_get(doc.root, "verdict_env"))) {
    r = GN_EINVAL;
    goto out;
  }
  if (venv->type == MSGPACK_OBJECT_BIN) {
    exchange vx;
    uint8_t signer[GN_PK_LEN], subject[GN_PK_LEN];
    if ((r = verdict_open((const uint8_t *)venv->via.bin.ptr, venv->via.bin.size, &vx, signer, subject)) < 0)
      goto out;
    /* The provider may not restate what its verifier said. */
    int64_t vx_issued_s = vx.issued_s;
    vx.issued_s = x.issued_s;
    if (memcmp(subject, e.signer, GN_PK_LEN) != 0 || !exchange_same(&vx, &x)) {
      r = GN_EPROTO;
      goto out;
    }
    if (!(rep.verdict_env = malloc(venv->via.bin.size))) {
      r = GN_ENOMEM;
      goto out;
    }
    memcpy(rep.verdict_env, venv->via.bin.ptr, venv->via.bin.size);
    rep.verdict_env_len = venv->via.bin.size;
    rep.has_verifier = true;
    memcpy(rep.verifier, signer, GN_PK_LEN);
    rep.verdict_issued_s = vx_issued_s;
  } else if (venv->type != MSGPACK_OBJECT_NIL) {
    r = GN_EINVAL;
    goto out;
  }
  /* The lease agreement is opaque here: whoever counts the verdict opens
   * it (the billing module), and only a peer-checked report carries one. */
  if ((lease = gn_wire_get(doc.root, "lease"))) {
    if (lease->type != MSGPACK_OBJECT_BIN || !rep.has_verifier || !lease->via.bin.size) {
      r = GN_EINVAL;
      goto out;
    }
    if ((r = gn_attest_report_set_lease(&rep, (const uint8_t *)lease->via.bin.ptr, lease->via.bin.size)) < 0)
      goto out;
  }
  memcpy(ret_provider, e.signer, GN_PK_LEN);
  *ret = rep;
  rep.verdict_env = NULL;
  rep.lease_env = NULL;
  r = 0;
out:
  free(rep.verdict_env);
  free(rep.lease_env);
  gn_wire_doc_done(&doc);
  return r;
}
