/* The memory challenge over the network, run after the compute proof holds
 * on the same session (sid): the requester sends MEM_CHALLENGE, the provider
 * fills its table and answers MEM_READY, the requester sends MEM_WALK and
 * times it until MEM_RESULT. The math is attest_mem.c; the sessions, the
 * wrapper and the timeouts are attest_net.c's. */
#include "node_internal.h"

/* A simulated GPU's table is a few MiB in host memory, graded "simulated". */
static const gn_attest_mem_params sim_mem_params = {
    .table_mib = 8, .cost = 4, .walkers = 1024, .steps = 64, .samples = 8};
#define SIM_MEM_MAX_MIB 64

/* --- the provider ---------------------------------------------------------------*/

/* The memory challenge comes on the session of a compute proof just given:
 * same sid, same GPU model. A simulated GPU fills a small table in host
 * memory; a real one in its own memory. */
void gn__attest_mem_on_challenge(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_prove_sess *s = gn__attest_prove_find(n, peer, m->sid);
  if (!s || s->working || s->stage != 0 || s->mem)
    return gn__attest_send_error(n, peer, m->sid, "no attestation session awaiting a memory challenge");
  if (n->prover_busy)
    return gn__attest_send_error(n, peer, m->sid, "busy with another attestation; try again shortly");
  gn_attest_local *a = &n->attest[s->slot];
  int r = a->simulated
              ? gn_attest_mem_prover_new(SIM_MEM_MAX_MIB, &s->mem)
              : gn_attest_mem_prover_new_cuda(a->cuda, (uint32_t)n->gpus.items[a->gpu_index].memory_mib, &s->mem);
  if (r < 0)
    return gn__attest_send_error(n, peer, m->sid, "this provider cannot run the memory challenge");
  s->deadline_ms = gn_mono_ms() + gn__attest_timeout_ms();
  gn__attest_prove_start(n, s, GN_MSG_ATTEST_MEM_CHALLENGE, m->data, m->data_len);
}

void gn__attest_mem_on_walk(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_prove_sess *s = gn__attest_prove_find(n, peer, m->sid);
  if (!s || s->working || s->stage != GN_MSG_ATTEST_MEM_CHALLENGE)
    return gn__attest_send_error(n, peer, m->sid, "no memory challenge awaiting its walk");
  if (n->prover_busy)
    return gn__attest_send_error(n, peer, m->sid, "busy with another attestation; try again shortly");
  gn__attest_prove_start(n, s, GN_MSG_ATTEST_MEM_WALK, m->data, m->data_len);
}

/* --- the requester ----------------------------------------------------------------*/

void gn__attest_mem_begin(gn_node *n, gn_verify_sess *s) {
  gn_buf challenge = {0};
  const gn_attest_class *c = gn_attest_class_find(s->compute.claimed_class);
  int r = 0;
  if (s->offer_sim)
    s->mem_params = sim_mem_params;
  else if (!c || (r = gn_attest_mem_params_for_class(c, GN__ATTEST_TARGET_MS, &s->mem_params)) < 0)
    r = r < 0 ? r : GN_ENOTFOUND;
  if (r == 0)
    r = gn_attest_mem_verifier_new(&s->mem_params, s->compute.claimed_class, NULL, NULL, &challenge, &s->mv);
  if (r == 0)
    r = gn__attest_send_wrapped(n, s->peer, GN_MSG_ATTEST_MEM_CHALLENGE, s->sid, NULL, &challenge, NULL);
  gn_buf_done(&challenge);
  if (r < 0) {
    char err[200];
    gn__strf(err, sizeof err, "cannot send the memory challenge: %s", gn_strerror(r));
    return gn__attest_verify_finish(n, s, r, NULL, err);
  }
  /* Filling the table is not timed, but it must end: a fresh deadline. */
  s->deadline_ms = gn_mono_ms() + gn__attest_timeout_ms();
}

void gn__attest_mem_on_ready(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_verify_sess *s = gn__attest_verify_find(n, peer, m->sid);
  if (!s || !s->mv || s->t_walk_ms)
    return;
  gn_buf walk = {0};
  int r = gn_attest_mem_verifier_on_ready(s->mv, m->data, m->data_len, &walk);
  if (r < 0) {
    gn_attest_result res = s->compute;
    res.outcome = GN_ATTEST_FAILED;
    gn__strf(res.verdict, sizeof res.verdict, "failed: the provider's memory table answers another challenge (%s)",
             gn_strerror(r));
    gn_buf_done(&walk);
    return gn__attest_verify_finish(n, s, 0, &res, NULL);
  }
  gn__attest_send_wrapped(n, peer, GN_MSG_ATTEST_MEM_WALK, s->sid, NULL, &walk, NULL);
  gn_buf_done(&walk);
  /* The walk is what is timed: from now to its result. */
  s->t_walk_ms = gn_mono_ms();
}

static void mem_work(uv_work_t *w) {
  gn_verify_sess *s = w->data;
  /* Recomputing the sampled walkers takes a while for a big class. */
  s->rc = gn_attest_mem_verifier_on_result(s->mv, s->in.data, s->in.len, s->mem.elapsed_ms, &s->mem);
}

static int outcome_rank(gn_attest_outcome o) {
  return o == GN_ATTEST_VERIFIED ? 0 : o == GN_ATTEST_SIMULATED ? 1 : o == GN_ATTEST_TOO_SLOW ? 2 : 3;
}

static void mem_done(uv_work_t *w, int status) {
  gn_verify_sess *s = w->data;
  s->working = false;
  if (s->orphan)
    return gn__attest_verify_free(s);
  gn_node *n = s->n;
  if (status < 0 || s->rc < 0) {
    int rc = status < 0 ? status : s->rc;
    memset(&s->mem, 0, sizeof s->mem);
    s->mem.outcome = GN_ATTEST_FAILED;
    gn__strf(s->mem.verdict, sizeof s->mem.verdict, "failed: the provider's memory result is malformed (%s)",
             gn_strerror(rc));
  }
  /* Both must hold: the worse of the two stands. */
  gn_attest_result res = s->compute;
  if (outcome_rank(s->mem.outcome) > outcome_rank(res.outcome)) {
    res.outcome = s->mem.outcome;
    gn__strf(res.verdict, sizeof res.verdict, "%s", s->mem.verdict);
  } else if (s->verdict_env.len) {
    gn_transport_send(n->tp, s->peer, s->verdict_env.data, s->verdict_env.len);
  }
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(s->peer, pid);
  gn_log(GN_LOG_INFO, "attestation of %s at %.14s…: compute %s; memory %s (%.1f GB/s in %llu ms)", s->model, pid,
         s->compute.verdict, s->mem.verdict, s->mem.measured_tops, (unsigned long long)s->mem.elapsed_ms);
  if (s->mem_out) {
    *s->mem_out = s->mem;
    *s->mem_set = true;
  }
  gn__attest_verify_finish(n, s, 0, &res, NULL);
}

void gn__attest_mem_on_result(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_verify_sess *s = gn__attest_verify_find(n, peer, m->sid);
  if (!s || !s->t_walk_ms || s->working || s->in.len)
    return;
  memset(&s->mem, 0, sizeof s->mem);
  s->mem.elapsed_ms = gn_mono_ms() - s->t_walk_ms;
  if (s->mem.elapsed_ms == 0)
    s->mem.elapsed_ms = 1;
  if (gn_buf_append(&s->in, m->data, m->data_len) < 0)
    return gn__attest_verify_finish(n, s, GN_ENOMEM, NULL, "out of memory");
  s->n = n;
  s->working = true;
  s->work.data = s;
  uv_queue_work(n->loop, &s->work, mem_work, mem_done);
}
