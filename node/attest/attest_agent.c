/* Attestation between nodes (gpunet/attest.h, "exchanges with peers"): a
 * provider's self-check of each local GPU model at start (its signed report
 * rides on its offers), the challenge exchange over the network (provider
 * answers, requester verifies with its own clock: compute, then the memory
 * challenge on the same sid), and the peer's signed verdict, which the
 * provider carries in its report once that peer has leased from it. Who may
 * challenge, how often, and which verdicts are published are decided here.
 * The math and the message bodies are the other attest_*.c; this file keeps
 * the sessions and moves the bodies, through gn_attest_io: it knows nothing
 * of the daemon around it. */
#include "attest_int.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Simulated GPUs are proven by the CPU reference: a tiny challenge, enough
 * to exercise every message, graded "simulated" whatever its timing. */
static const gn_attest_params sim_params = {.n = 256, .depth = 1, .rounds = 2, .open_rounds = 2, .open_rows = 4};
#define SIM_MAX_OPS 1e10
/* A simulated GPU's table is a few MiB in host memory, graded "simulated". */
static const gn_attest_mem_params sim_mem_params = {
    .table_mib = 8, .cost = 4, .walkers = 1024, .steps = 64, .samples = 8};
#define SIM_MEM_MAX_MIB 64
#define ATTEST_TIMEOUT_MS 120000 /* default; env GN_ATTEST_TIMEOUT_MS overrides */
#define ATTEST_DATA_MAX (GN_ATTEST_PROOF_ROW_BYTES_MAX + 1024 * 1024)
#define SID_LEN 32
#define MODEL_LEN 96
#define HOUR_MS 3600000u

enum { TASK_LOCAL = 1, TASK_PROVE, TASK_MEM_CHECK };

struct gn_attest_task {
  gn_attest_agent *a;
  int kind;
  void *obj; /* the slot or session it works for */
};

/* One local GPU model (provider). */
typedef struct local_slot {
  gn_attest_task task;
  gn_attest_gpu gpu; /* gpu.name is the model */
  int cuda_device;
  bool simulated, running, done;
  char verdict[GN_ATTEST_VERDICT_STRLEN];
  gn_attest_report report;
  gn_buf report_env; /* sealed GN_MSG_ATTEST_REPORT, attached to offers */
  gn_attest_backend *cuda;
  gn_attest_params params;
  gn_attest_result result;
  int rc;
} local_slot;

/* The provider's side of one exchange, compute then memory challenge. */
typedef struct prove_sess {
  struct prove_sess *next;
  gn_attest_task task;
  uint8_t peer[GN_PK_LEN];
  char sid[SID_LEN];
  size_t slot;
  gn_attest_prover *pr;
  gn_attest_mem_prover *mem; /* from the memory challenge on */
  gn_buf in, out;
  uint32_t stage; /* the message being worked (CHALLENGE, OPEN, MEM_CHALLENGE, MEM_WALK), 0 when idle */
  int rc;
  bool working;
  uint64_t prover_ms, deadline_ms;
} prove_sess;

/* ...and the requester's. */
typedef struct verify_sess {
  struct verify_sess *next;
  gn_attest_task task;
  char sid[SID_LEN];
  uint8_t peer[GN_PK_LEN];
  char model[MODEL_LEN];
  gn_attest_params params;
  bool offer_sim; /* the offer says simulated: small challenges */
  gn_attest_verifier *v;
  uint64_t t_sent_ms, elapsed_ms, deadline_ms;
  gn_buf pending; /* the challenge, until the provider is connected */
  gn_attest_verified_fn done;
  void *ud;
  gn_attest_result compute, mem; /* the memory challenge, once the compute proof holds */
  gn_buf verdict_env;            /* our signed compute verdict, sent when all is done */
  gn_attest_mem_params mem_params;
  gn_attest_mem_verifier *mv;
  uint64_t t_walk_ms;
  gn_buf in; /* the MEM_RESULT being checked on a worker */
  bool working, orphan, has_mem;
  int rc;
} verify_sess;

/* A challenger's recent challenges, for the hourly limit: the times of the
 * last GN_ATTEST_PEER_HOURLY accepted, oldest at `next` once full. */
typedef struct peer_rate {
  uint8_t peer[GN_PK_LEN];
  bool used;
  uint32_t count; /* times held, up to GN_ATTEST_PEER_HOURLY */
  uint32_t next;
  uint64_t at_ms[GN_ATTEST_PEER_HOURLY];
  uint64_t seen_ms; /* the latest, for forgetting the least recent peer */
} peer_rate;

/* A verifier's verdict held until it leases (provider). */
typedef struct held_verdict {
  bool used;
  uint8_t peer[GN_PK_LEN];
  size_t slot;
  gn_attest_report rep; /* built from the verdict, verified */
  uint64_t at_ms;       /* received, io clock */
  int64_t at_s;         /* received, UTC */
} held_verdict;

struct gn_attest_agent {
  const gn_identity *id;
  const gn_attest_io *io;
  void *ctx; /* the io functions' first argument */
  bool provide;
  local_slot local[GN_ATTEST_LOCAL_MAX];
  size_t local_n;
  prove_sess *provers;
  verify_sess *verifiers;
  bool prover_busy; /* one proof at a time */
  size_t nprovers;  /* prove sessions alive */
  peer_rate rates[GN_ATTEST_PEERS_MAX];
  held_verdict held[GN_ATTEST_HELD_MAX];
  unsigned tasks; /* queued or running on a worker */
  bool closing;   /* shut down: freed when tasks reaches 0 */
};

/* A decoded {sid, gpu_model?, reason?, data} wrapper. */
typedef struct wrapped {
  gn_wire_doc doc;
  char sid[SID_LEN];
  char model[MODEL_LEN];
  char offer[GN_OFFER_ID_STRLEN];
  char reason[256];
  const uint8_t *data;
  size_t data_len;
} wrapped;

static void strf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void strf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
}

static void logf_(gn_attest_agent *a, bool warn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void logf_(gn_attest_agent *a, bool warn, const char *fmt, ...) {
  if (!a->io->log)
    return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  a->io->log(a->ctx, warn, line);
}

uint64_t gn_attest_timeout_ms(void) {
  const char *e = getenv("GN_ATTEST_TIMEOUT_MS");
  char *end;
  unsigned long long v = e ? strtoull(e, &end, 10) : 0;
  return e && *e && !*end && v >= 100 && v <= 3600000 ? v : ATTEST_TIMEOUT_MS;
}

static uint64_t now_of(const gn_attest_agent *a) {
  return a->io->now_ms ? a->io->now_ms(a->ctx) : gn_mono_ms();
}

static void agent_free(gn_attest_agent *a) {
  for (size_t i = 0; i < GN_ATTEST_HELD_MAX; i++)
    gn_attest_report_done(&a->held[i].rep);
  for (size_t i = 0; i < a->local_n; i++) {
    gn_attest_report_done(&a->local[i].report);
    gn_buf_done(&a->local[i].report_env);
    gn_attest_cuda_close(a->local[i].cuda);
  }
  free(a);
}

/* Hands t to the workers; false (and nothing queued) when it cannot. */
static bool task_queue(gn_attest_agent *a, gn_attest_task *t, int kind, void *obj) {
  t->a = a;
  t->kind = kind;
  t->obj = obj;
  a->tasks++;
  if (a->io->queue(a->ctx, t) < 0) {
    a->tasks--;
    return false;
  }
  return true;
}

static const gn_attest_backend *slot_backend(local_slot *s) {
  if (s->simulated)
    return gn_attest_backend_cpu();
  if (!s->cuda && gn_attest_cuda_open(s->cuda_device, &s->cuda) < 0)
    return NULL;
  return s->cuda;
}

static int params_for(const char *model, bool simulated, gn_attest_params *ret, const char **ret_class) {
  const gn_attest_class *c = gn_attest_class_find(model);
  *ret_class = c ? c->name : model;
  if (simulated) {
    *ret = sim_params;
    return 0;
  }
  if (!c)
    return GN_ENOTFOUND;
  return gn_attest_params_for_class(c, GN_ATTEST_TARGET_MS, ret);
}

/* --- the wire wrapper: {sid, gpu_model?, offer?, data} ------------------------*/

static int seal_send(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *w,
                     gn_buf *ret_env) {
  gn_buf body = {0}, env = {0};
  int r = gn_wire_writer_take(w, &body);
  if (r == 0)
    r = gn_envelope_seal(a->id, type, body.data, body.len, &env);
  gn_buf_done(&body);
  if (r == 0 && ret_env)
    r = gn_buf_append(ret_env, env.data, env.len);
  else if (r == 0)
    r = a->io->send(a->ctx, peer, env.data, env.len);
  gn_buf_done(&env);
  return r;
}

/* Seals the wrapper and sends it, or appends it to ret_env when given. The
 * challenge names the GPU model and the offer its sender means to lease. */
static int send_wrapped(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], uint32_t type, const char *sid,
                        const char *model, const char *offer, const gn_buf *data, gn_buf *ret_env) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2 + (model ? 1 : 0) + (offer ? 1 : 0));
  gn_wire_put_str(&w, "sid");
  gn_wire_put_str(&w, sid);
  if (model) {
    gn_wire_put_str(&w, "gpu_model");
    gn_wire_put_str(&w, model);
  }
  if (offer) {
    gn_wire_put_str(&w, "offer");
    gn_wire_put_str(&w, offer);
  }
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, data->data, data->len);
  int r = seal_send(a, peer, type, &w, ret_env);
  gn_wire_writer_done(&w);
  return r;
}

static void send_error(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const char *sid, const char *reason) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "sid");
  gn_wire_put_str(&w, sid);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  seal_send(a, peer, GN_MSG_ERROR, &w, NULL);
  gn_wire_writer_done(&w);
}

static int unwrap(const gn_envelope *env, wrapped *ret) {
  memset(ret, 0, sizeof *ret);
  int r = gn_wire_decode(env->body, env->body_len, &ret->doc);
  if (r < 0)
    return r;
  const msgpack_object *o = ret->doc.root;
  if (o->type != MSGPACK_OBJECT_MAP || (r = gn_wire_get_str(o, "sid", ret->sid, sizeof ret->sid)) < 0 ||
      (gn_wire_get(o, "gpu_model") && (r = gn_wire_get_str(o, "gpu_model", ret->model, sizeof ret->model)) < 0) ||
      (gn_wire_get(o, "offer") && (r = gn_wire_get_str(o, "offer", ret->offer, sizeof ret->offer)) < 0) ||
      (gn_wire_get(o, "reason") && (r = gn_wire_get_str(o, "reason", ret->reason, sizeof ret->reason)) < 0) ||
      (env->type != GN_MSG_ERROR &&
       (r = gn_wire_get_bin_ref(o, "data", ATTEST_DATA_MAX, &ret->data, &ret->data_len)) < 0)) {
    gn_wire_doc_done(&ret->doc);
    return r < 0 ? r : GN_EINVAL;
  }
  return 0;
}

/* --- the agent and its local GPUs ------------------------------------------------*/

int gn_attest_agent_new(const gn_identity *id, const gn_attest_io *io, void *ctx, bool provide, gn_attest_agent **ret) {
  if (!id || !io || !io->send || !io->is_up || !io->connect || !io->queue || !ret)
    return GN_EINVAL;
  gn_attest_agent *a = calloc(1, sizeof *a);
  if (!a)
    return GN_ENOMEM;
  a->id = id;
  a->io = io;
  a->ctx = ctx;
  a->provide = provide;
  *ret = a;
  return 0;
}

size_t gn_attest_agent_local_count(const gn_attest_agent *a) {
  return a->local_n;
}

int gn_attest_agent_local(const gn_attest_agent *a, size_t slot, gn_attest_local_view *ret) {
  if (slot >= a->local_n)
    return GN_ENOTFOUND;
  const local_slot *s = &a->local[slot];
  ret->model = s->gpu.name;
  ret->verdict = s->verdict;
  ret->report = s->report_env.len ? s->report_env.data : NULL;
  ret->report_len = s->report_env.len;
  ret->done = s->done;
  return 0;
}

static void changed(gn_attest_agent *a, const local_slot *s) {
  if (a->io->changed)
    a->io->changed(a->ctx, (size_t)(s - a->local));
}

static void local_work(local_slot *s) {
  const char *cls;
  s->rc = params_for(s->gpu.name, s->simulated, &s->params, &cls);
  if (s->rc == 0)
    s->rc = gn_attest_run_local(s->simulated ? gn_attest_backend_cpu() : s->cuda, &s->params, cls, &s->result);
}

static void local_done(gn_attest_agent *a, local_slot *s, int status) {
  s->running = false;
  s->done = true;
  if (a->closing)
    return;
  if (status < 0 || s->rc < 0) {
    int rc = status < 0 ? status : s->rc;
    strf(s->verdict, sizeof s->verdict, "not attested: %s", gn_strerror(rc));
    logf_(a, true, "attestation of %s failed to run: %s", s->gpu.name, gn_strerror(rc));
    changed(a, s);
    return;
  }
  gn_attest_report_done(&s->report);
  gn_attest_report_from_result(&s->report, &s->gpu, &s->params, &s->result, gn_unix_s());
  gn_buf_done(&s->report_env);
  if (gn_attest_report_seal(a->id, &s->report, &s->report_env) < 0)
    gn_buf_done(&s->report_env);
  strf(s->verdict, sizeof s->verdict, "%s (self-check)", s->result.verdict);
  logf_(a, false, "attestation of %s: %s (%llu ms)", s->gpu.name, s->result.verdict,
        (unsigned long long)s->result.elapsed_ms);
  changed(a, s);
}

int gn_attest_agent_add_local(gn_attest_agent *a, const gn_attest_gpu *gpu, int cuda_device, bool simulated) {
  for (size_t i = 0; i < a->local_n; i++)
    if (strcmp(a->local[i].gpu.name, gpu->name) == 0)
      return GN_EEXIST;
  if (a->local_n >= GN_ATTEST_LOCAL_MAX)
    return GN_ETOOBIG;
  local_slot *s = &a->local[a->local_n++];
  s->gpu = *gpu;
  s->gpu.name[sizeof s->gpu.name - 1] = '\0';
  s->cuda_device = cuda_device;
  s->simulated = simulated;
  if (!slot_backend(s)) {
    strf(s->verdict, sizeof s->verdict, "not attested: the CUDA attestation kernel is not available here");
    s->done = true;
  } else {
    strf(s->verdict, sizeof s->verdict, "pending");
    s->running = true;
    if (!task_queue(a, &s->task, TASK_LOCAL, s)) {
      s->running = false;
      strf(s->verdict, sizeof s->verdict, "not attested: %s", gn_strerror(GN_ENOMEM));
      s->done = true;
    }
  }
  changed(a, s);
  return (int)(s - a->local);
}

/* --- the provider answers a challenge --------------------------------------------*/

static void prove_free(gn_attest_agent *a, prove_sess *s) {
  for (prove_sess **pp = &a->provers; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      a->nprovers--;
      break;
    }
  gn_attest_prover_free(s->pr);
  gn_attest_mem_prover_free(s->mem);
  gn_buf_done(&s->in);
  gn_buf_done(&s->out);
  free(s);
}

static void prove_work(prove_sess *s) {
  uint64_t t0 = gn_mono_ms();
  switch (s->stage) {
  case GN_MSG_ATTEST_CHALLENGE:
    s->rc = gn_attest_prover_on_challenge(s->pr, s->in.data, s->in.len, &s->out);
    s->prover_ms = gn_mono_ms() - t0;
    break;
  case GN_MSG_ATTEST_OPEN:
    s->rc = gn_attest_prover_on_open(s->pr, s->in.data, s->in.len, &s->out);
    break;
  case GN_MSG_ATTEST_MEM_CHALLENGE:
    s->rc = gn_attest_mem_prover_on_challenge(s->mem, s->in.data, s->in.len, &s->out);
    break;
  default:
    s->rc = gn_attest_mem_prover_on_walk(s->mem, s->in.data, s->in.len, &s->out);
    break;
  }
}

/* What the provider answers to the message it just worked. */
static uint32_t answer_type(uint32_t stage) {
  switch (stage) {
  case GN_MSG_ATTEST_CHALLENGE:
    return GN_MSG_ATTEST_RESPONSE;
  case GN_MSG_ATTEST_OPEN:
    return GN_MSG_ATTEST_PROOF;
  case GN_MSG_ATTEST_MEM_CHALLENGE:
    return GN_MSG_ATTEST_MEM_READY;
  default:
    return GN_MSG_ATTEST_MEM_RESULT;
  }
}

static void prove_done(gn_attest_agent *a, prove_sess *s, int status) {
  s->working = false;
  a->prover_busy = false;
  if (a->closing)
    return prove_free(a, s);
  if (status < 0 || s->rc < 0) {
    int rc = status < 0 ? status : s->rc;
    send_error(a, s->peer, s->sid, rc == GN_ETOOBIG ? "challenge too large for this provider" : gn_strerror(rc));
    prove_free(a, s);
    return;
  }
  uint32_t type = answer_type(s->stage);
  send_wrapped(a, s->peer, type, s->sid, NULL, NULL, &s->out, NULL);
  gn_buf_done(&s->out);
  gn_buf_done(&s->in);
  if (type == GN_MSG_ATTEST_PROOF || type == GN_MSG_ATTEST_MEM_RESULT) {
    /* Kept until the verifier's memory challenge or verdict arrives (or the
     * session expires), for the prover's own timing in the report. */
    s->stage = 0;
  }
}

/* Works message `stage` on a worker and answers it. */
static void prove_start(gn_attest_agent *a, prove_sess *s, uint32_t stage, const uint8_t *data, size_t len) {
  s->stage = stage;
  gn_buf_done(&s->in);
  s->working = true;
  a->prover_busy = true;
  if (gn_buf_append(&s->in, data, len) < 0 || !task_queue(a, &s->task, TASK_PROVE, s)) {
    s->working = false;
    a->prover_busy = false;
    send_error(a, s->peer, s->sid, "out of memory");
    return prove_free(a, s);
  }
}

static prove_sess *prove_find(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const char *sid) {
  for (prove_sess *s = a->provers; s; s = s->next)
    if (memcmp(s->peer, peer, GN_PK_LEN) == 0 && strcmp(s->sid, sid) == 0)
      return s;
  return NULL;
}

static peer_rate *rate_find(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN]) {
  for (size_t i = 0; i < GN_ATTEST_PEERS_MAX; i++)
    if (a->rates[i].used && memcmp(a->rates[i].peer, peer, GN_PK_LEN) == 0)
      return &a->rates[i];
  return NULL;
}

/* The challenger's entry for the hourly count, made when its first
 * challenge is accepted (a refused one keeps nothing): a free entry, or the
 * least recently seen peer's. */
static peer_rate *rate_of(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN]) {
  peer_rate *lru = rate_find(a, peer);
  if (lru)
    return lru;
  lru = &a->rates[0];
  for (size_t i = 1; i < GN_ATTEST_PEERS_MAX && lru->used; i++) {
    peer_rate *p = &a->rates[i];
    if (!p->used || p->seen_ms < lru->seen_ms)
      lru = p;
  }
  memset(lru, 0, sizeof *lru);
  lru->used = true;
  memcpy(lru->peer, peer, GN_PK_LEN);
  return lru;
}

/* Minutes until p (NULL: a peer not seen) may challenge again; 0 when it
 * may now. */
static uint64_t rate_wait_min(const peer_rate *p, uint64_t now) {
  if (!p || p->count < GN_ATTEST_PEER_HOURLY)
    return 0;
  uint64_t oldest = p->at_ms[p->next];
  if (now - oldest >= HOUR_MS)
    return 0;
  return (HOUR_MS - (now - oldest) + 59999) / 60000;
}

static void rate_count(peer_rate *p, uint64_t now) {
  p->at_ms[p->next] = now;
  p->next = (p->next + 1) % GN_ATTEST_PEER_HOURLY;
  if (p->count < GN_ATTEST_PEER_HOURLY)
    p->count++;
  p->seen_ms = now;
}

static prove_sess *prove_of_peer(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN]) {
  for (prove_sess *s = a->provers; s; s = s->next)
    if (memcmp(s->peer, peer, GN_PK_LEN) == 0)
      return s;
  return NULL;
}

/* Who may make this GPU work (gpunet/attest.h): only a peer negotiating a
 * lease, which names this provider's offer for the model while one of it is
 * free, one exchange at a time per peer, a few an hour per peer, a few in
 * flight in all. Everything is checked before anything is kept or run. */
static void on_challenge(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  local_slot *slot = NULL;
  char reason[256];
  for (size_t i = 0; i < a->local_n; i++)
    if (strcmp(a->local[i].gpu.name, m->model) == 0)
      slot = &a->local[i];
  if (!a->provide || !slot)
    return send_error(a, peer, m->sid, "no such GPU model on this provider");
  gn_offer mine;
  char mine_id[GN_OFFER_ID_STRLEN];
  memset(&mine, 0, sizeof mine);
  memcpy(mine.provider, a->id->pk, GN_PK_LEN);
  strf(mine.gpu_model, sizeof mine.gpu_model, "%s", slot->gpu.name);
  gn_offer_id(&mine, mine_id);
  if (strcmp(m->offer, mine_id) != 0) {
    strf(reason, sizeof reason,
         "attestation is for peers about to lease: name this provider's offer for %s (%s) in the challenge",
         slot->gpu.name, mine_id);
    return send_error(a, peer, m->sid, reason);
  }
  if (a->io->leasable && !a->io->leasable(a->ctx, peer, slot->gpu.name)) {
    strf(reason, sizeof reason, "no %s is free to lease here now, so there is nothing to attest for a lease",
         slot->gpu.name);
    return send_error(a, peer, m->sid, reason);
  }
  const gn_attest_backend *b = slot_backend(slot);
  if (!b)
    return send_error(a, peer, m->sid, "this provider cannot run the attestation kernel");
  prove_sess *old = prove_of_peer(a, peer);
  if (old && old->working)
    return send_error(a, peer, m->sid, "one attestation at a time per peer: the previous one is still running");
  uint64_t now = now_of(a);
  uint64_t wait = rate_wait_min(rate_find(a, peer), now);
  if (wait) {
    strf(reason, sizeof reason, "at most %u attestation challenges an hour from one peer; try again in %llu minutes",
         (unsigned)GN_ATTEST_PEER_HOURLY, (unsigned long long)wait);
    return send_error(a, peer, m->sid, reason);
  }
  /* One proof at a time: the GPU (or CPU) is the resource being measured,
   * and a second one would only slow both down. A few sessions in all: each
   * may hold a memory table until its verdict or deadline. */
  if (a->prover_busy || a->nprovers - (old ? 1 : 0) >= GN_ATTEST_SESSIONS_MAX)
    return send_error(a, peer, m->sid, "busy with another attestation; try again shortly");
  prove_sess *s = calloc(1, sizeof *s);
  if (!s || gn_attest_prover_new(b, &s->pr) < 0) {
    free(s);
    return send_error(a, peer, m->sid, "out of memory");
  }
  /* A peer's new challenge replaces its idle session (one per peer). */
  if (old)
    prove_free(a, old);
  rate_count(rate_of(a, peer), now);
  if (slot->simulated)
    gn_attest_prover_set_max_ops(s->pr, SIM_MAX_OPS);
  memcpy(s->peer, peer, GN_PK_LEN);
  strf(s->sid, sizeof s->sid, "%s", m->sid);
  s->slot = (size_t)(slot - a->local);
  s->deadline_ms = gn_mono_ms() + gn_attest_timeout_ms();
  s->next = a->provers;
  a->provers = s;
  a->nprovers++;
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, pid);
  logf_(a, false, "attestation challenge for %s from %s", slot->gpu.name, pid);
  prove_start(a, s, GN_MSG_ATTEST_CHALLENGE, m->data, m->data_len);
}

static void on_open(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  prove_sess *s = prove_find(a, peer, m->sid);
  if (!s || s->working || s->stage != GN_MSG_ATTEST_CHALLENGE)
    return send_error(a, peer, m->sid, "no attestation challenge awaiting its opening");
  if (a->prover_busy)
    return send_error(a, peer, m->sid, "busy with another attestation; try again shortly");
  prove_start(a, s, GN_MSG_ATTEST_OPEN, m->data, m->data_len);
}

/* The memory challenge comes on the session of a compute proof just given:
 * same sid, same GPU model. A simulated GPU fills a small table in host
 * memory; a real one in its own memory. */
static void on_mem_challenge(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  prove_sess *s = prove_find(a, peer, m->sid);
  if (!s || s->working || s->stage != 0 || s->mem)
    return send_error(a, peer, m->sid, "no attestation session awaiting a memory challenge");
  if (a->prover_busy)
    return send_error(a, peer, m->sid, "busy with another attestation; try again shortly");
  local_slot *slot = &a->local[s->slot];
  int r = slot->simulated ? gn_attest_mem_prover_new(SIM_MEM_MAX_MIB, &s->mem)
                          : gn_attest_mem_prover_new_cuda(slot->cuda, slot->gpu.memory_mib, &s->mem);
  if (r < 0)
    return send_error(a, peer, m->sid, "this provider cannot run the memory challenge");
  s->deadline_ms = gn_mono_ms() + gn_attest_timeout_ms();
  prove_start(a, s, GN_MSG_ATTEST_MEM_CHALLENGE, m->data, m->data_len);
}

static void on_mem_walk(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  prove_sess *s = prove_find(a, peer, m->sid);
  if (!s || s->working || s->stage != GN_MSG_ATTEST_MEM_CHALLENGE)
    return send_error(a, peer, m->sid, "no memory challenge awaiting its walk");
  if (a->prover_busy)
    return send_error(a, peer, m->sid, "busy with another attestation; try again shortly");
  prove_start(a, s, GN_MSG_ATTEST_MEM_WALK, m->data, m->data_len);
}

/* A verifier's signed verdict on our exchange: held until that verifier
 * leases from us (gn_attest_agent_lease_agreed), and only then our report.
 * A verdict alone is anyone's word: a second identity of ours could vouch
 * for us; one followed by a lease was given by a peer that then agreed to
 * pay for the GPU it checked. */
static void hold_verdict(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], size_t slot, gn_attest_report *rep) {
  held_verdict *h = NULL;
  for (size_t i = 0; i < GN_ATTEST_HELD_MAX && !h; i++)
    if (a->held[i].used && memcmp(a->held[i].peer, peer, GN_PK_LEN) == 0)
      h = &a->held[i];
  for (size_t i = 0; i < GN_ATTEST_HELD_MAX && !h; i++)
    if (!a->held[i].used)
      h = &a->held[i];
  if (!h) { /* full: the oldest goes */
    h = &a->held[0];
    for (size_t i = 1; i < GN_ATTEST_HELD_MAX; i++)
      if (a->held[i].at_ms < h->at_ms)
        h = &a->held[i];
  }
  gn_attest_report_done(&h->rep);
  h->used = true;
  memcpy(h->peer, peer, GN_PK_LEN);
  h->slot = slot;
  h->rep = *rep;
  memset(rep, 0, sizeof *rep);
  h->at_ms = now_of(a);
  h->at_s = gn_unix_s();
}

static void held_drop(held_verdict *h) {
  gn_attest_report_done(&h->rep);
  memset(h, 0, sizeof *h);
}

static void on_verdict(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len) {
  for (prove_sess *s = a->provers; s; s = s->next) {
    if (memcmp(s->peer, peer, GN_PK_LEN) != 0 || s->working || s->stage != 0)
      continue;
    local_slot *slot = &a->local[s->slot];
    gn_attest_report rep;
    memset(&rep, 0, sizeof rep);
    int r = gn_attest_report_from_verdict(&rep, &slot->gpu, a->id->pk, raw, raw_len, s->prover_ms, gn_unix_s());
    if (r == 0) {
      char vid[GN_NODE_ID_STRLEN];
      gn_node_id_format(peer, vid);
      logf_(a, false, "attestation of %s checked by %s: %s; published if %.14s… leases it within %u s", slot->gpu.name,
            vid, rep.verdict, vid, (unsigned)GN_ATTEST_LEASE_WINDOW_S);
      hold_verdict(a, peer, s->slot, &rep);
      prove_free(a, s);
      return;
    }
    gn_attest_report_done(&rep);
  }
}

size_t gn_attest_agent_held(const gn_attest_agent *a) {
  size_t n = 0;
  for (size_t i = 0; i < GN_ATTEST_HELD_MAX; i++)
    n += a->held[i].used;
  return n;
}

/* Seals h's report, with the lease agreement when one is given and the
 * whole still fits an offer, else without it. */
static int seal_held(gn_attest_agent *a, held_verdict *h, const uint8_t *agreement, size_t agreement_len, gn_buf *ret) {
  int r;
  if (agreement && agreement_len && gn_attest_report_set_lease(&h->rep, agreement, agreement_len) == 0) {
    if ((r = gn_attest_report_seal(a->id, &h->rep, ret)) < 0)
      return r;
    if (ret->len <= GN_OFFER_ATTEST_MAX)
      return 0;
    gn_buf_done(ret);
    free(h->rep.lease_env);
    h->rep.lease_env = NULL;
    h->rep.lease_env_len = 0;
  }
  if ((r = gn_attest_report_seal(a->id, &h->rep, ret)) < 0)
    return r;
  if (ret->len > GN_OFFER_ATTEST_MAX) {
    gn_buf_done(ret);
    return GN_ETOOBIG;
  }
  return 0;
}

int gn_attest_agent_lease_agreed(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const char *model, int64_t agreed_s,
                                 const uint8_t *agreement, size_t agreement_len) {
  if (!a || !peer || !model)
    return GN_EINVAL;
  for (size_t i = 0; i < GN_ATTEST_HELD_MAX; i++) {
    held_verdict *h = &a->held[i];
    if (!h->used || memcmp(h->peer, peer, GN_PK_LEN) != 0)
      continue;
    local_slot *slot = &a->local[h->slot];
    /* A lease of another model, or agreed before the verdict came, says
     * nothing of it; one too late, neither. */
    if (strcmp(slot->gpu.name, model) != 0 || agreed_s < h->at_s ||
        agreed_s - h->at_s > (int64_t)GN_ATTEST_LEASE_WINDOW_S)
      return 0;
    gn_buf env = {0};
    int r = seal_held(a, h, agreement, agreement_len, &env);
    if (r < 0) {
      held_drop(h);
      return r;
    }
    gn_buf_done(&slot->report_env);
    slot->report_env = env;
    gn_attest_report_done(&slot->report);
    slot->report = h->rep;
    memset(&h->rep, 0, sizeof h->rep);
    char vid[GN_NODE_ID_STRLEN];
    gn_node_id_format(peer, vid);
    strf(slot->verdict, sizeof slot->verdict, "%s (checked by %.14s…)", slot->report.verdict, vid);
    logf_(a, false, "attestation of %s checked by %s, who leased it: %s", slot->gpu.name, vid, slot->report.verdict);
    held_drop(h);
    changed(a, slot);
    return 1;
  }
  return 0;
}

/* --- the requester verifies ----------------------------------------------------------*/

static void verify_free(verify_sess *s) {
  gn_attest_verifier_free(s->v);
  gn_attest_mem_verifier_free(s->mv);
  gn_buf_done(&s->pending);
  gn_buf_done(&s->verdict_env);
  gn_buf_done(&s->in);
  free(s);
}

/* Unlinks s, frees it (or leaves that to its task) and calls done. */
static void verify_finish(gn_attest_agent *a, verify_sess *s, int rc, const gn_attest_result *res, const char *err) {
  for (verify_sess **pp = &a->verifiers; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  gn_attest_verified_fn done = s->done;
  void *ud = s->ud;
  gn_attest_result mem = s->mem;
  bool has_mem = s->has_mem;
  if (s->working)
    s->orphan = true; /* its task is still on a worker: freed when it returns */
  else
    verify_free(s);
  done(ud, rc, res, has_mem ? &mem : NULL, err);
}

static verify_sess *verify_find(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const char *sid) {
  for (verify_sess *s = a->verifiers; s; s = s->next)
    if (memcmp(s->peer, peer, GN_PK_LEN) == 0 && strcmp(s->sid, sid) == 0)
      return s;
  return NULL;
}

int gn_attest_agent_verify(gn_attest_agent *a, const gn_offer *o, gn_attest_verified_fn done, void *ud) {
  const char *cls;
  verify_sess *s = calloc(1, sizeof *s);
  gn_buf challenge = {0};
  if (!s)
    return GN_ENOMEM;
  int r = params_for(o->gpu_model, o->simulated, &s->params, &cls);
  if (r == 0)
    r = gn_attest_verifier_new(&s->params, cls, NULL, NULL, &challenge, &s->v);
  if (r < 0) {
    free(s);
    return r;
  }
  uint8_t rnd[8];
  char hex[2 * sizeof rnd + 1];
  randombytes_buf(rnd, sizeof rnd);
  sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
  strf(s->sid, sizeof s->sid, "a-%s", hex);
  memcpy(s->peer, o->provider, GN_PK_LEN);
  strf(s->model, sizeof s->model, "%s", o->gpu_model);
  s->done = done;
  s->ud = ud;
  s->offer_sim = o->simulated;
  s->deadline_ms = gn_mono_ms() + gn_attest_timeout_ms();
  char offer_id[GN_OFFER_ID_STRLEN];
  gn_offer_id(o, offer_id);
  r = send_wrapped(a, s->peer, GN_MSG_ATTEST_CHALLENGE, s->sid, s->model, offer_id, &challenge, &s->pending);
  gn_buf_done(&challenge);
  if (r < 0) {
    verify_free(s);
    return r;
  }
  s->next = a->verifiers;
  a->verifiers = s;
  /* The clock starts when the challenge leaves, not before: a provider we
   * still have to dial is not charged for the connection time. */
  if (a->io->is_up(a->ctx, s->peer))
    gn_attest_agent_peer_up(a, s->peer);
  else
    a->io->connect(a->ctx, o->addr);
  return 0;
}

void gn_attest_agent_peer_up(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN]) {
  for (verify_sess *s = a->verifiers; s; s = s->next) {
    if (!s->pending.len || memcmp(s->peer, peer, GN_PK_LEN) != 0)
      continue;
    s->t_sent_ms = gn_mono_ms();
    a->io->send(a->ctx, peer, s->pending.data, s->pending.len);
    gn_buf_done(&s->pending);
  }
}

static void mem_begin(gn_attest_agent *a, verify_sess *s) {
  gn_buf challenge = {0};
  const gn_attest_class *c = gn_attest_class_find(s->compute.claimed_class);
  int r = 0;
  if (s->offer_sim)
    s->mem_params = sim_mem_params;
  else if (!c || (r = gn_attest_mem_params_for_class(c, GN_ATTEST_TARGET_MS, &s->mem_params)) < 0)
    r = r < 0 ? r : GN_ENOTFOUND;
  if (r == 0)
    r = gn_attest_mem_verifier_new(&s->mem_params, s->compute.claimed_class, NULL, NULL, &challenge, &s->mv);
  if (r == 0)
    r = send_wrapped(a, s->peer, GN_MSG_ATTEST_MEM_CHALLENGE, s->sid, NULL, NULL, &challenge, NULL);
  gn_buf_done(&challenge);
  if (r < 0) {
    char err[200];
    strf(err, sizeof err, "cannot send the memory challenge: %s", gn_strerror(r));
    return verify_finish(a, s, r, NULL, err);
  }
  /* Filling the table is not timed, but it must end: a fresh deadline. */
  s->deadline_ms = gn_mono_ms() + gn_attest_timeout_ms();
}

static void on_response(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  verify_sess *s = verify_find(a, peer, m->sid);
  if (!s || s->elapsed_ms)
    return;
  s->elapsed_ms = gn_mono_ms() - s->t_sent_ms;
  if (s->elapsed_ms == 0)
    s->elapsed_ms = 1;
  gn_buf open = {0};
  int r = gn_attest_verifier_on_response(s->v, m->data, m->data_len, &open);
  if (r < 0) {
    gn_attest_result res;
    memset(&res, 0, sizeof res);
    res.outcome = GN_ATTEST_FAILED;
    strf(res.verdict, sizeof res.verdict, "failed: the provider's response is invalid (%s)", gn_strerror(r));
    gn_buf_done(&open);
    return verify_finish(a, s, 0, &res, NULL);
  }
  send_wrapped(a, peer, GN_MSG_ATTEST_OPEN, s->sid, NULL, NULL, &open, NULL);
  gn_buf_done(&open);
}

static void on_proof(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  verify_sess *s = verify_find(a, peer, m->sid);
  if (!s || !s->elapsed_ms || s->mv)
    return;
  gn_attest_result res;
  memset(&res, 0, sizeof res);
  int r = gn_attest_verifier_on_proof(s->v, m->data, m->data_len, s->elapsed_ms, &res);
  if (r < 0) {
    res.outcome = GN_ATTEST_FAILED;
    strf(res.verdict, sizeof res.verdict, "failed: the provider's proof is malformed (%s)", gn_strerror(r));
  }
  if (res.outcome == GN_ATTEST_FAILED)
    return verify_finish(a, s, 0, &res, NULL);
  /* Our signed verdict on the compute proof goes back to the provider, who
   * may carry it, once the memory challenge is passed too. */
  s->compute = res;
  if (gn_attest_verdict_seal(a->id, peer, &s->params, &res, gn_unix_s(), &s->verdict_env) < 0)
    gn_buf_done(&s->verdict_env);
  mem_begin(a, s);
}

static void on_mem_ready(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  verify_sess *s = verify_find(a, peer, m->sid);
  if (!s || !s->mv || s->t_walk_ms)
    return;
  gn_buf walk = {0};
  int r = gn_attest_mem_verifier_on_ready(s->mv, m->data, m->data_len, &walk);
  if (r < 0) {
    gn_attest_result res = s->compute;
    res.outcome = GN_ATTEST_FAILED;
    strf(res.verdict, sizeof res.verdict, "failed: the provider's memory table answers another challenge (%s)",
         gn_strerror(r));
    gn_buf_done(&walk);
    return verify_finish(a, s, 0, &res, NULL);
  }
  send_wrapped(a, peer, GN_MSG_ATTEST_MEM_WALK, s->sid, NULL, NULL, &walk, NULL);
  gn_buf_done(&walk);
  /* The walk is what is timed: from now to its result. */
  s->t_walk_ms = gn_mono_ms();
}

static void mem_check_work(verify_sess *s) {
  /* Recomputing the sampled walkers takes a while for a big class. */
  s->rc = gn_attest_mem_verifier_on_result(s->mv, s->in.data, s->in.len, s->mem.elapsed_ms, &s->mem);
}

static int outcome_rank(gn_attest_outcome o) {
  return o == GN_ATTEST_VERIFIED ? 0 : o == GN_ATTEST_SIMULATED ? 1 : o == GN_ATTEST_TOO_SLOW ? 2 : 3;
}

static void mem_check_done(gn_attest_agent *a, verify_sess *s, int status) {
  s->working = false;
  if (s->orphan)
    return verify_free(s);
  if (status < 0 || s->rc < 0) {
    int rc = status < 0 ? status : s->rc;
    memset(&s->mem, 0, sizeof s->mem);
    s->mem.outcome = GN_ATTEST_FAILED;
    strf(s->mem.verdict, sizeof s->mem.verdict, "failed: the provider's memory result is malformed (%s)",
         gn_strerror(rc));
  }
  s->has_mem = true;
  /* Both must hold: the worse of the two stands. */
  gn_attest_result res = s->compute;
  if (outcome_rank(s->mem.outcome) > outcome_rank(res.outcome)) {
    res.outcome = s->mem.outcome;
    strf(res.verdict, sizeof res.verdict, "%s", s->mem.verdict);
  } else if (s->verdict_env.len) {
    a->io->send(a->ctx, s->peer, s->verdict_env.data, s->verdict_env.len);
  }
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(s->peer, pid);
  logf_(a, false, "attestation of %s at %.14s…: compute %s; memory %s (%.1f GB/s in %llu ms)", s->model, pid,
        s->compute.verdict, s->mem.verdict, s->mem.measured_tops, (unsigned long long)s->mem.elapsed_ms);
  verify_finish(a, s, 0, &res, NULL);
}

static void on_mem_result(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  verify_sess *s = verify_find(a, peer, m->sid);
  if (!s || !s->t_walk_ms || s->working || s->in.len)
    return;
  memset(&s->mem, 0, sizeof s->mem);
  s->mem.elapsed_ms = gn_mono_ms() - s->t_walk_ms;
  if (s->mem.elapsed_ms == 0)
    s->mem.elapsed_ms = 1;
  if (gn_buf_append(&s->in, m->data, m->data_len) < 0)
    return verify_finish(a, s, GN_ENOMEM, NULL, "out of memory");
  s->working = true;
  if (!task_queue(a, &s->task, TASK_MEM_CHECK, s)) {
    s->working = false;
    return verify_finish(a, s, GN_ENOMEM, NULL, "out of memory");
  }
}

static void on_error(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const wrapped *m) {
  verify_sess *s = verify_find(a, peer, m->sid);
  if (s) {
    char err[300];
    strf(err, sizeof err, "provider refused the attestation challenge: %s", m->reason);
    verify_finish(a, s, GN_EREMOTE, NULL, err);
  }
}

/* --- the workers, messages, time, shutdown ----------------------------------------------*/

void gn_attest_task_run(gn_attest_task *t) {
  switch (t->kind) {
  case TASK_LOCAL:
    local_work(t->obj);
    break;
  case TASK_PROVE:
    prove_work(t->obj);
    break;
  default:
    mem_check_work(t->obj);
    break;
  }
}

void gn_attest_task_done(gn_attest_task *t, int status) {
  gn_attest_agent *a = t->a;
  switch (t->kind) {
  case TASK_LOCAL:
    local_done(a, t->obj, status);
    break;
  case TASK_PROVE:
    prove_done(a, t->obj, status);
    break;
  default:
    mem_check_done(a, t->obj, status);
    break;
  }
  if (--a->tasks == 0 && a->closing)
    agent_free(a);
}

void gn_attest_agent_on_message(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const gn_envelope *env,
                                const uint8_t *raw, size_t raw_len) {
  if (a->closing)
    return;
  if (env->type == GN_MSG_ATTEST_VERDICT)
    return on_verdict(a, peer, raw, raw_len);
  wrapped m;
  if (unwrap(env, &m) < 0)
    return;
  switch (env->type) {
  case GN_MSG_ATTEST_CHALLENGE:
    on_challenge(a, peer, &m);
    break;
  case GN_MSG_ATTEST_OPEN:
    on_open(a, peer, &m);
    break;
  case GN_MSG_ATTEST_RESPONSE:
    on_response(a, peer, &m);
    break;
  case GN_MSG_ATTEST_PROOF:
    on_proof(a, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_CHALLENGE:
    on_mem_challenge(a, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_READY:
    on_mem_ready(a, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_WALK:
    on_mem_walk(a, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_RESULT:
    on_mem_result(a, peer, &m);
    break;
  case GN_MSG_ERROR:
    on_error(a, peer, &m);
    break;
  default:
    break;
  }
  gn_wire_doc_done(&m.doc);
}

void gn_attest_agent_tick(gn_attest_agent *a, uint64_t now_ms) {
  for (verify_sess *s = a->verifiers, *next; s; s = next) {
    next = s->next;
    if (now_ms >= s->deadline_ms)
      verify_finish(a, s, GN_ETIMEDOUT, NULL, "the provider did not finish the attestation challenge in time");
  }
  for (prove_sess *s = a->provers, *next; s; s = next) {
    next = s->next;
    if (!s->working && now_ms >= s->deadline_ms)
      prove_free(a, s);
  }
  uint64_t now = now_of(a);
  for (size_t i = 0; i < GN_ATTEST_HELD_MAX; i++)
    if (a->held[i].used && now - a->held[i].at_ms > GN_ATTEST_LEASE_WINDOW_S * 1000ull)
      held_drop(&a->held[i]);
}

void gn_attest_agent_shutdown(gn_attest_agent *a) {
  if (!a)
    return;
  while (a->verifiers)
    verify_finish(a, a->verifiers, GN_ECLOSED, NULL, "gpunetd is shutting down");
  for (prove_sess *s = a->provers, *next; s; s = next) {
    next = s->next;
    if (!s->working) /* a working one is freed when its task returns */
      prove_free(a, s);
  }
  a->closing = true;
  if (a->tasks == 0)
    agent_free(a);
}

/* --- views ------------------------------------------------------------------------------*/

void gn_attest_offer_verdict(const gn_offer *o, char *buf, size_t cap) {
  buf[0] = 0;
  if (!o->attest_len)
    return;
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  if (gn_attest_report_open(o->attest, o->attest_len, &rep, signer) < 0) {
    strf(buf, cap, "invalid report");
    return;
  }
  if (memcmp(signer, o->provider, GN_PK_LEN) != 0)
    strf(buf, cap, "invalid report");
  else if (rep.has_verifier) {
    char vid[GN_NODE_ID_STRLEN];
    gn_node_id_format(rep.verifier, vid);
    strf(buf, cap, "%s (checked by %.14s…)", rep.verdict, vid);
  } else {
    strf(buf, cap, "%s (self-reported)", rep.verdict);
  }
  gn_attest_report_done(&rep);
}
