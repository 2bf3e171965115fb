/* The requester's glue of `gpunet train` (issue 8): POST /v1/train plans a
 * training job over the offer table (RTTs measured by a TCP connect to each
 * candidate's listen address; billing/plan.c chooses), leases the plan's
 * providers all or nothing (billing/gang.c: sign then release, driven by the
 * requester's lease events and this node's tick), and on READY sends every
 * rank's manifest with its job network (notes/train-iface.md). A rank that
 * fails restarts the group (--restarts) or stops it; the leases are released
 * and billed each on its own. The group's state is saved (table
 * train_groups) before the actions of each change are performed. */
#include "train_req.h"

#include "attest_net.h"
#include "node_internal.h"
#include "peer_rtt.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <gpunet/gang.h>
#include <gpunet/jobnet.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define TRAIN_MAX_RANKS 64u
#define TRAIN_MAX 64u            /* training jobs kept in memory per node */
#define TRAIN_ANSWER_MS 15000u   /* a member's answer timeout (GN_RENT_TIMEOUT_MS overrides) */
#define TRAIN_RTT_PROBE_MS 1000  /* the connect probes' budget, all together */
#define TRAIN_MASTER_PORT 29500u /* MASTER_PORT */
#define TRAIN_PORT_BASE 51820u   /* jobnet_ports default: 51820-51899 */
#define TRAIN_PORT_SPAN 80u
#define TRAIN_ATTEST_SPARES 8u  /* spares attested with the members when --restarts is given */
#define TRAIN_PEER_RTT_MS 3000u /* the candidates' round trips to each other: each answers within ~2 s */
#define TRAIN_MEMORY_MIB 2048u  /* per rank (body: memory_mib); torch with gloo needs more than 1 GiB */
#define TRAIN_PIDS 1024u
#define TRAIN_INTERVAL_S 60u
#define TRAIN_COLLECT_MS 300000u    /* leases held this long after the ranks finished, for their /output */
#define TRAIN_OUTPUT_WAIT_MS 20000u /* a provider's answer to JOB_OUTPUT_GET */
#define TRAIN_PEER_GRACE_MS 20000u  /* an agreed member's provider unreachable this long is lost */
/* A restart's seeds: the old ranks' /output, fetched from their providers
 * into DATA_DIR/train/ID/seed/rank-R.tar and named in the new manifests. */
#define TRAIN_SEED_FETCH_MS 60000u        /* the whole fetch, all ranks together */
#define TRAIN_SEED_STOP_WAIT_MS 10000u    /* a rank's job is waited on to stop this long, then asked anyway */
#define TRAIN_SEED_IDLE_MS 15000u         /* a provider that sends nothing this long is given up */
#define TRAIN_SEED_WINDOW 4u              /* chunks asked at once per rank, after the first */
#define TRAIN_SEED_RETRIES 8u             /* "busy" answers asked again, 500 ms later */
#define TRAIN_SEED_TOTAL_MAX (8ull << 30) /* all of one group's seeds */
#define TRAIN_ATTEST_MS 30000u            /* a provider's attestation before the leases are signed, at most */
#define TRAIN_ATTEST_AT_ONCE 8u           /* attestations of one group in flight */

typedef struct train_issued {
  char lease_id[GN_LEASE_ID_STRLEN];
  uint8_t provider[GN_PK_LEN];
  gn_lease_terms t; /* what we signed (this run only) */
  bool have_terms;
} train_issued;

typedef struct train_msg {
  struct train_msg *next;
  uint8_t peer[GN_PK_LEN];
  bool release; /* a LEASE_RELEASE: kept when the group fails */
  gn_buf env;
} train_msg;

typedef struct train_rank {
  char job_id[GN_JOB_ID_STRLEN];
  uint32_t member;
  uint8_t provider[GN_PK_LEN]; /* where it runs, and its WireGuard port there */
  uint16_t port;
  bool has_seed;      /* its manifest names a seed: */
  uint32_t seed_rank; /* the old rank whose /output it is (seeds[seed_rank]) */
} train_rank;

/* A stored seed: DATA_DIR/train/ID/seed/rank-R.tar, hashed as written. */
typedef struct train_seed {
  bool have;
  uint8_t sha256[32];
  uint64_t size;
} train_seed;

enum { SEED_WAIT = 1, SEED_FIRST, SEED_MORE, SEED_DONE, SEED_FAILED };

/* The fetch of one old rank's /output (JOB_OUTPUT_GET/JOB_OUTPUT): offset 0
 * first (the provider makes its snapshot then), then up to
 * TRAIN_SEED_WINDOW chunks at once, written and hashed in order. */
typedef struct seed_fetch {
  int st;
  char job_id[GN_JOB_ID_STRLEN];
  uint8_t peer[GN_PK_LEN];
  char lease_id[GN_LEASE_ID_STRLEN];
  int fd;
  uint64_t size, next_ask, written, last_heard_ms, retry_at_ms;
  uint32_t retries;
  crypto_hash_sha256_state h;
  struct {
    uint64_t offset;
    size_t len;
    bool used, got;
  } slot[TRAIN_SEED_WINDOW];
  uint8_t *buf; /* TRAIN_SEED_WINDOW chunks */
  char why[160];
} seed_fetch;

typedef struct train {
  struct train *next;
  gn_node *n;
  char id[GN_JOB_ID_STRLEN];
  char state[16]; /* planning, forming, running, restarting, failed, ended, done */
  char reason[200];
  int64_t created_s, ended_s;
  /* the request */
  uint32_t gpus, per_node, restarts;
  uint64_t max_price, max_s, max_spend, memory_mib;
  bool output, allow_sim;
  json_t *argv, *env;
  char image[600];
  gn_imageref ref;
  /* the plan */
  gn_plan_candidate cand[GN_PLAN_MAX_CANDIDATES];
  char cand_addr[GN_PLAN_MAX_CANDIDATES][64];
  uint16_t cand_ports[GN_PLAN_MAX_CANDIDATES][2];
  char currency[8];
  size_t ncand;
  uint32_t *rtt;  /* ncand x ncand, ms between candidates as they measured them (peer_rtt.c), or NULL */
  int rtt_handle; /* the matrix being measured (gn__rtt_matrix_begin), 0 when none */
  json_t *plan;   /* what GET shows */
  uint32_t per_member;
  /* the gang */
  gn_gang *g;
  uint64_t timer_at_ms;
  train_issued issued[GN_GANG_MAX_ATTEMPTS];
  size_t nissued;
  train_rank ranks[TRAIN_MAX_RANKS];
  uint32_t world;
  bool job_failed_reported;                 /* for the current set of ranks */
  uint64_t down_since[GN_GANG_MAX_MEMBERS]; /* a member's provider went down then (0: up) */
  bool finished;                            /* every rank exited 0 */
  uint64_t collect_until;                   /* "collecting": the leases are released then (or on DELETE) */
  /* restarts from the last checkpoint */
  train_seed seeds[TRAIN_MAX_RANKS]; /* by old rank */
  seed_fetch *sf;                    /* while seeding: one per old rank */
  uint32_t nsf;
  bool seeding;
  uint64_t seed_start_ms, seed_reserved;
  uint32_t pending_ready; /* a READY (restart number) held until the seeds are in */
  char seed_note[400];    /* what the last restart starts from */
  /* attestation of the chosen providers before anything is signed */
  bool attest;                             /* body "attest" (default true) */
  uint8_t att[GN_PLAN_MAX_CANDIDATES];     /* by candidate: ATT_* */
  uint64_t att_at[GN_PLAN_MAX_CANDIDATES]; /* asked then */
  bool att_wait;                           /* "attesting": waiting for the plan's members: */
  uint8_t att_members[GN_PLAN_MAX_NODES][GN_PK_LEN];
  uint32_t att_nmembers;
  json_t *dropped; /* [{provider, offer, reason}]: failed attestation */
  /* planning */
  gn_ctl_req *req;
  uv_work_t work;
  char err[512];
  int rc;
  train_msg *queue;
} train;

/* A GET /v1/train/ID/output waiting for the provider's JOB_OUTPUT. */
typedef struct out_wait {
  struct out_wait *next;
  gn_ctl_req *req;
  char job_id[GN_JOB_ID_STRLEN];
  uint8_t peer[GN_PK_LEN];
  uint64_t offset, deadline_ms;
} out_wait;

typedef struct train_glue {
  gn_node *n;
  out_wait *waits;
  gn_train_ops ops;
  train *list;
  size_t count;
  bool restored;
} train_glue;

enum { ATT_NONE = 0, ATT_QUEUED, ATT_ASKING, ATT_OK };

static train_glue glues[4];

static train_glue *glue_of(gn_node *n) {
  for (size_t i = 0; i < GN_ARRAY_SIZE(glues); i++)
    if (glues[i].n == n)
      return &glues[i];
  return NULL;
}

static train *train_find(gn_node *n, const char *id) {
  train_glue *gl = glue_of(n);
  for (train *t = gl ? gl->list : NULL; t; t = t->next)
    if (strcmp(t->id, id) == 0)
      return t;
  return NULL;
}

static const char *jstr(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

static bool state_final(const train *t) {
  return strcmp(t->state, "failed") == 0 || strcmp(t->state, "ended") == 0 || strcmp(t->state, "done") == 0;
}

/* --- persistence --------------------------------------------------------------*/

static void db_init(gn_node *n) {
  char *err = NULL;
  if (sqlite3_exec(n->db,
                   "CREATE TABLE IF NOT EXISTS train_groups(id TEXT PRIMARY KEY, doc TEXT NOT NULL, gang BLOB, "
                   "updated_s INTEGER NOT NULL)",
                   NULL, NULL, &err) != SQLITE_OK)
    gn_log(GN_LOG_ERROR, "cannot create the training table: %s", err ? err : "?");
  sqlite3_free(err);
}

static json_t *train_doc(const train *t) {
  json_t *ranks = json_array(), *issued = json_array();
  json_t *seeds = json_array();
  for (uint32_t r = 0; r < t->world; r++)
    json_array_append_new(ranks, json_pack("{s:s, s:I, s:o}", "job", t->ranks[r].job_id, "member",
                                           (json_int_t)t->ranks[r].member, "seed",
                                           t->ranks[r].has_seed ? json_integer(t->ranks[r].seed_rank) : json_null()));
  for (uint32_t r = 0; r < TRAIN_MAX_RANKS; r++)
    if (t->seeds[r].have) {
      char hex[65];
      gn__hex(t->seeds[r].sha256, sizeof t->seeds[r].sha256, hex);
      json_array_append_new(seeds, json_pack("{s:I, s:s, s:I}", "rank", (json_int_t)r, "sha256", hex, "size",
                                             (json_int_t)t->seeds[r].size));
    }
  for (size_t i = 0; i < t->nissued; i++) {
    char pid[GN_NODE_ID_STRLEN];
    gn_node_id_format(t->issued[i].provider, pid);
    json_array_append_new(issued, json_pack("{s:s, s:s}", "lease", t->issued[i].lease_id, "provider", pid));
  }
  return json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:O, s:O, s:s, s:O, s:o, s:o, s:s, s:o, s:s?}", "id",
                   t->id, "state", t->state, "reason", t->reason, "created_s", (json_int_t)t->created_s, "ended_s",
                   (json_int_t)t->ended_s, "gpus", (json_int_t)t->gpus, "per_node", (json_int_t)t->per_member,
                   "restarts", (json_int_t)t->restarts, "world", (json_int_t)t->world, "argv", t->argv, "env", t->env,
                   "image", t->image, "plan", t->plan ? t->plan : json_null(), "ranks", ranks, "issued", issued,
                   "currency", t->currency, "seeds", seeds, "restart_note", t->seed_note[0] ? t->seed_note : NULL);
}

/* Saves t (and its gang): GN_EDB when it could not be, then nothing the
 * caller was about to do is done. */
static int train_save(train *t) {
  gn_node *n = t->n;
  json_t *doc = train_doc(t);
  char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
  json_decref(doc);
  gn_buf g = {0};
  if (t->g && gn_gang_save(t->g, &g) < 0) {
    free(text);
    return GN_EINVAL;
  }
  sqlite3_stmt *st = NULL;
  int rc =
      text ? sqlite3_prepare_v2(n->db, "INSERT OR REPLACE INTO train_groups(id, doc, gang, updated_s) VALUES(?,?,?,?)",
                                -1, &st, NULL)
           : SQLITE_NOMEM;
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(st, 1, t->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, text, -1, SQLITE_STATIC);
    if (g.len)
      sqlite3_bind_blob(st, 3, g.data, (int)g.len, SQLITE_STATIC);
    else
      sqlite3_bind_null(st, 3);
    sqlite3_bind_int64(st, 4, gn_unix_s());
    rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
  }
  sqlite3_finalize(st);
  free(text);
  gn_buf_done(&g);
  if (rc != SQLITE_OK) {
    gn_log(GN_LOG_ERROR, "training %s: cannot save its state: %s", t->id, sqlite3_errmsg(n->db));
    return GN_EDB;
  }
  return 0;
}

/* --- sending ------------------------------------------------------------------*/

static const char *provider_addr(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (size_t i = 0; i < gn_offer_table_count(n->offers); i++) {
    const gn_offer_entry *e = gn_offer_table_at(n->offers, i);
    if (memcmp(e->offer.provider, peer, GN_PK_LEN) == 0)
      return e->offer.addr;
  }
  return NULL;
}

/* Sends env to peer now, or queues it and dials the provider. */
static int train_send_kind(train *t, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len, bool release) {
  gn_node *n = t->n;
  if (!n->tp)
    return GN_ESTATE;
  if (gn_transport_is_up(n->tp, peer))
    return gn_transport_send(n->tp, peer, env, len);
  train_msg *m = calloc(1, sizeof *m);
  if (!m || gn_buf_append(&m->env, env, len) < 0) {
    free(m);
    return GN_ENOMEM;
  }
  memcpy(m->peer, peer, GN_PK_LEN);
  m->release = release;
  train_msg **tail = &t->queue;
  while (*tail)
    tail = &(*tail)->next;
  *tail = m;
  const char *addr = provider_addr(n, peer);
  return addr ? gn__nat_connect_peer(n, addr, peer) : GN_ENOTFOUND;
}

static int train_send(train *t, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  return train_send_kind(t, peer, env, len, false);
}

/* Drops what waits for a session (all, or all but the releases). */
static void queue_drop(train *t, bool keep_releases) {
  for (train_msg **pp = &t->queue; *pp;) {
    train_msg *m = *pp;
    if (keep_releases && m->release) {
      pp = &m->next;
      continue;
    }
    *pp = m->next;
    gn_buf_done(&m->env);
    free(m);
  }
}

static void send_bare_release(train *t, const uint8_t peer[GN_PK_LEN], const char *lease_id, const char *reason) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  gn_buf b = {0}, env = {0};
  if (gn_wire_writer_take(&w, &b) == 0 && gn_envelope_seal(t->n->id, GN_MSG_LEASE_RELEASE, b.data, b.len, &env) == 0)
    train_send_kind(t, peer, env.data, env.len, true);
  gn_wire_writer_done(&w);
  gn_buf_done(&b);
  gn_buf_done(&env);
}

/* --- the gang's actions ---------------------------------------------------------*/

static void perform(train *t, gn_gang_out *out);
static void set_state(train *t, const char *state);

static train_issued *issued_find(train *t, const char *lease_id) {
  for (size_t i = 0; i < t->nissued; i++)
    if (strcmp(t->issued[i].lease_id, lease_id) == 0)
      return &t->issued[i];
  return NULL;
}

static size_t cand_of_offer(const train *t, const gn_gang_offer *o) {
  for (size_t i = 0; i < t->ncand; i++)
    if (memcmp(t->cand[i].provider, o->provider, GN_PK_LEN) == 0 && strcmp(t->cand[i].offer_id, o->offer_id) == 0)
      return i;
  return SIZE_MAX;
}

/* A LEASE_REQUEST for one member: 0, or why it could not be sent. */
static int request_member(train *t, const gn_gang_action *a, char *why, size_t cap) {
  gn_node *n = t->n;
  const gn_offer_entry *e = gn_offer_table_find(n->offers, a->offer.offer_id);
  if (!e || memcmp(e->offer.provider, a->offer.provider, GN_PK_LEN) != 0) {
    gn__strf(why, cap, "offer %s is no longer in the offer table", a->offer.offer_id);
    return GN_ENOTFOUND;
  }
  if (e->offer.price_uper_hour != a->offer.price_uper_hour) {
    gn__strf(why, cap, "offer %s changed its price since the plan", a->offer.offer_id);
    return GN_ESTATE;
  }
  if (t->nissued >= GN_ARRAY_SIZE(t->issued)) {
    gn__strf(why, cap, "too many lease requests");
    return GN_ETOOBIG;
  }
  gn_lease_terms lt;
  gn_lease_terms_init(&lt);
  gn__strf(lt.lease_id, sizeof lt.lease_id, "%s", a->lease_id);
  memcpy(lt.provider, a->offer.provider, GN_PK_LEN);
  memcpy(lt.requester, n->id->pk, GN_PK_LEN);
  gn__strf(lt.offer_id, sizeof lt.offer_id, "%s", e->id);
  gn__strf(lt.gpu_model, sizeof lt.gpu_model, "%s", e->offer.gpu_model);
  lt.count = a->offer.gpus;
  lt.price_uper_hour = a->offer.price_uper_hour;
  gn__strf(lt.currency, sizeof lt.currency, "%s", e->offer.currency);
  lt.max_s = t->max_s;
  lt.interval_s = TRAIN_INTERVAL_S;
  lt.requested_s = gn_unix_s();
  lt.simulated = e->offer.simulated;
  gn_buf env = {0};
  int r = gn_lease_request_seal(n->id, &lt, &env);
  if (r < 0) {
    gn__strf(why, cap, "cannot sign the lease request: %s", gn_strerror(r));
    return r;
  }
  train_issued *is = &t->issued[t->nissued++];
  memset(is, 0, sizeof *is);
  gn__strf(is->lease_id, sizeof is->lease_id, "%s", lt.lease_id);
  memcpy(is->provider, lt.provider, GN_PK_LEN);
  is->t = lt;
  is->have_terms = true;
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(lt.provider, pid);
  gn_log(GN_LOG_INFO, "training %s: requesting lease %s (member %d): %u x %s from %s", t->id, lt.lease_id, a->member,
         lt.count, lt.gpu_model, pid);
  r = train_send(t, lt.provider, env.data, env.len);
  gn_buf_done(&env);
  if (r < 0)
    gn__strf(why, cap, "cannot reach provider %s: %s", pid, gn_strerror(r));
  return r;
}

static void release_member(train *t, const gn_gang_action *a) {
  train_glue *gl = glue_of(t->n);
  gn_lease *l = gn__lease_find(t->n, a->lease_id);
  gn_log(GN_LOG_INFO, "training %s: releasing lease %s (%s): %s", t->id, a->lease_id,
         a->agreed ? "agreed" : "unanswered", a->reason);
  if (l && l->role == GN_ROLE_REQUESTER && gl && gl->ops.release)
    gl->ops.release(t->n, a->lease_id, a->reason[0] ? a->reason : "released by the training group");
  else
    send_bare_release(t, a->offer.provider, a->lease_id, a->reason[0] ? a->reason : "released by the training group");
}

static gn_job *rank_job(train *t, uint32_t r) {
  return t->ranks[r].job_id[0] ? gn__job_find(t->n, t->ranks[r].job_id) : NULL;
}

static void stop_jobs(train *t) {
  for (uint32_t r = 0; r < t->world; r++) {
    gn_job *j = rank_job(t, r);
    if (!j || j->state >= GN_JOB_EXITED)
      continue;
    gn_lease *l = gn__lease_find(t->n, j->lease_id);
    if (!l)
      continue;
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "job_id");
    gn_wire_put_str(&w, j->id);
    gn_wire_put_str(&w, "lease_id");
    gn_wire_put_str(&w, j->lease_id);
    gn__node_send(t->n, l->peer, GN_MSG_JOB_STOP, &w);
    gn_wire_writer_done(&w);
  }
}

/* FNV-1a of the group id: the ranks' port offsets. */
static uint32_t group_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* "ip:port" of a rank's WireGuard socket on the provider at addr ("host:port"). */
static int rank_endpoint(const char *addr, uint16_t port, char *out, size_t cap) {
  char host[64];
  const char *colon = strrchr(addr, ':');
  if (!colon || (size_t)(colon - addr) >= sizeof host)
    return GN_EINVAL;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  if (host[0] == '[')
    return snprintf(out, cap, "%s:%u", host, port) < (int)cap ? 0 : GN_EINVAL;
  return snprintf(out, cap, "%s:%u", host, port) < (int)cap ? 0 : GN_EINVAL;
}

/* Whether a live training group of this node (or the ranks of t laid out
 * so far, below rank `below`) uses port on provider. */
static bool port_taken(const train *t, uint32_t below, const uint8_t provider[GN_PK_LEN], uint16_t port) {
  train_glue *gl = glue_of(t->n);
  for (const train *o = gl ? gl->list : NULL; o; o = o->next) {
    if (o == t || state_final(o))
      continue;
    for (uint32_t r = 0; r < o->world; r++)
      if (o->ranks[r].port == port && memcmp(o->ranks[r].provider, provider, GN_PK_LEN) == 0)
        return true;
  }
  for (uint32_t r = 0; r < below; r++)
    if (t->ranks[r].port == port && memcmp(t->ranks[r].provider, provider, GN_PK_LEN) == 0)
      return true;
  return false;
}

/* Rank r's port on its provider: lo + (hash(group) + local index) mod the
 * offer's range, moved on past ports this node's other live training jobs
 * use there (the provider refuses a busy one). */
static uint16_t rank_port(const train *t, size_t cand, uint32_t r, uint32_t local) {
  uint32_t lo = t->cand_ports[cand][0], hi = t->cand_ports[cand][1];
  if (!lo || hi < lo) {
    lo = TRAIN_PORT_BASE;
    hi = TRAIN_PORT_BASE + TRAIN_PORT_SPAN - 1;
  }
  uint32_t span = hi - lo + 1, start = (group_hash(t->id) + local) % span;
  for (uint32_t k = 0; k < span; k++) {
    uint16_t port = (uint16_t)(lo + (start + k) % span);
    if (!port_taken(t, r, t->cand[cand].provider, port))
      return port;
  }
  return (uint16_t)(lo + start);
}

/* Every member agreed: one manifest per rank, with the job network. */
static void start_ranks(train *t, uint32_t restart) {
  gn_node *n = t->n;
  gn_gang_info gi;
  gn_gang_info_get(t->g, &gi);
  uint32_t per = t->per_member, world = gi.members * per;
  struct in_addr subnet;
  uint8_t prefix;
  static uint8_t priv[TRAIN_MAX_RANKS][GN_JOBMAN_KEY_LEN], pub[TRAIN_MAX_RANKS][GN_JOBMAN_KEY_LEN];
  char endpoint[TRAIN_MAX_RANKS][GN_JOBMAN_ENDPOINT_LEN];
  uint16_t port[TRAIN_MAX_RANKS];
  char lease[TRAIN_MAX_RANKS][GN_LEASE_ID_STRLEN];
  uint8_t peer[TRAIN_MAX_RANKS][GN_PK_LEN];
  char why[200] = "";
  if (world == 0 || world > TRAIN_MAX_RANKS || gn_jobnet_subnet_for_job(t->id, &subnet, &prefix) < 0)
    gn__strf(why, sizeof why, "cannot lay out %u ranks", world);
  for (uint32_t m = 0; !why[0] && m < gi.members; m++) {
    gn_gang_member_info mi;
    gn_gang_member(t->g, m, &mi);
    size_t c = cand_of_offer(t, &mi.offer);
    if (c == SIZE_MAX) {
      gn__strf(why, sizeof why, "member %u's offer is not in the plan", m);
      break;
    }
    for (uint32_t k = 0; k < per; k++) {
      uint32_t r = m * per + k;
      memcpy(t->ranks[r].provider, mi.offer.provider, GN_PK_LEN);
      t->ranks[r].port = port[r] = rank_port(t, c, r, k);
      if (gn_jobnet_keypair(priv[r], pub[r]) < 0 ||
          rank_endpoint(t->cand_addr[c], port[r], endpoint[r], sizeof endpoint[r]) < 0) {
        gn__strf(why, sizeof why, "cannot make rank %u's key or endpoint", r);
        break;
      }
      gn__strf(lease[r], sizeof lease[r], "%s", mi.lease_id);
      memcpy(peer[r], mi.offer.provider, GN_PK_LEN);
      t->ranks[r].member = m;
    }
  }
  if (why[0]) {
    gn_log(GN_LOG_ERROR, "training %s: %s", t->id, why);
    gn_gang_out *out = calloc(1, sizeof *out);
    if (out && gn_gang_job_failed(t->g, gn_mono_ms(), 0, why, out) == 0)
      perform(t, out);
    free(out);
    return;
  }
  t->world = world;
  t->job_failed_reported = false;
  /* A restart's ranks start from the seeds fetched: each its own old
   * rank's /output, else the lowest rank's that came. */
  int first_seed = -1;
  for (uint32_t r = 0; restart && r < TRAIN_MAX_RANKS && first_seed < 0; r++)
    if (t->seeds[r].have)
      first_seed = (int)r;
  uint32_t seeded = 0;
  uint32_t host = (ntohl(subnet.s_addr) >> 8) & 0xffu;
  char jobs_dir[sizeof n->run_dir + 8];
  gn__pathf(jobs_dir, sizeof jobs_dir, "%s/jobs", n->run_dir);
  for (uint32_t r = 0; r < world; r++) {
    gn_jobman m;
    memset(&m, 0, sizeof m);
    uint8_t rnd[6];
    char hex[13];
    randombytes_buf(rnd, sizeof rnd);
    gn__hex(rnd, sizeof rnd, hex);
    gn__strf(m.job_id, sizeof m.job_id, "j-%s", hex);
    gn__strf(m.lease_id, sizeof m.lease_id, "%s", lease[r]);
    gn__strf(m.image, sizeof m.image, "%s", t->image);
    m.argc = (uint32_t)json_array_size(t->argv);
    for (uint32_t i = 0; i < m.argc; i++)
      m.argv[i] = (char *)json_string_value(json_array_get(t->argv, i));
    m.envc = (uint32_t)json_array_size(t->env);
    for (uint32_t i = 0; i < m.envc; i++)
      m.env[i] = (char *)json_string_value(json_array_get(t->env, i));
    m.memory_mib = t->memory_mib ? t->memory_mib : TRAIN_MEMORY_MIB;
    m.pids = TRAIN_PIDS;
    randombytes_buf(m.nonce, sizeof m.nonce);
    m.issued_s = gn_unix_s();
    m.expires_s = m.issued_s + 300;
    /* Every rank gets a writable /output for its checkpoints (issue 8 item 7);
     * --output only decides whether they are copied back at the end. */
    m.output = true;
    t->ranks[r].has_seed = first_seed >= 0;
    t->ranks[r].seed_rank = t->seeds[r].have ? r : (uint32_t)(first_seed >= 0 ? first_seed : 0);
    if (t->ranks[r].has_seed) {
      const train_seed *s = &t->seeds[t->ranks[r].seed_rank];
      m.has_seed = true;
      memcpy(m.seed_sha256, s->sha256, sizeof m.seed_sha256);
      m.seed_size = s->size;
      seeded++;
    }
    m.has_net = true;
    gn__strf(m.net.group, sizeof m.net.group, "%s", t->id);
    m.net.rank = r;
    m.net.world = world;
    m.net.local_rank = r % per;
    m.net.local_world = per;
    memcpy(m.net.private_key, priv[r], GN_JOBMAN_KEY_LEN);
    m.net.listen_port = port[r];
    m.net.master_port = TRAIN_MASTER_PORT;
    m.net.subnet_host = host;
    for (uint32_t q = 0; q < world; q++) {
      if (q == r)
        continue;
      gn_jobman_peer *p = &m.net.peers[m.net.npeers++];
      memcpy(p->public_key, pub[q], GN_JOBMAN_KEY_LEN);
      gn__strf(p->endpoint, sizeof p->endpoint, "%s", endpoint[q]);
      p->rank = q;
    }
    gn_wire_writer w;
    gn_buf body = {0}, env = {0};
    gn_wire_writer_init(&w);
    int rc = gn__jobman_encode(&m, &w);
    if (rc == 0)
      rc = gn_wire_writer_take(&w, &body);
    gn_wire_writer_done(&w);
    sodium_memzero(m.net.private_key, sizeof m.net.private_key);
    if (rc == 0)
      rc = gn_envelope_seal(n->id, GN_MSG_JOB_MANIFEST, body.data, body.len, &env);
    sodium_memzero(body.data, body.len);
    gn_buf_done(&body);
    gn_job *j = rc == 0 ? calloc(1, sizeof *j) : NULL;
    if (!j) {
      gn_buf_done(&env);
      gn_log(GN_LOG_ERROR, "training %s: cannot make rank %u's manifest", t->id, r);
      t->ranks[r].job_id[0] = 0;
      continue;
    }
    j->node = n;
    gn__strf(j->id, sizeof j->id, "%s", m.job_id);
    gn__strf(j->lease_id, sizeof j->lease_id, "%s", lease[r]);
    j->role = GN_ROLE_REQUESTER;
    gn__strf(j->image, sizeof j->image, "%s", t->image);
    gn__strf(j->digest, sizeof j->digest, "%s", t->ref.digest);
    j->cmd = json_incref(t->argv);
    j->env = json_incref(t->env);
    j->state = GN_JOB_PENDING;
    j->exit_code = -1;
    j->created_s = m.issued_s;
    gn_path_join(j->log_path, sizeof j->log_path, jobs_dir, NULL, j->id, ".log");
    j->next = n->jobs;
    n->jobs = j;
    gn__strf(t->ranks[r].job_id, sizeof t->ranks[r].job_id, "%s", j->id);
    gn__node_persist_job(n, j);
    gn_log(GN_LOG_INFO, "training %s: rank %u/%u is job %s on lease %s (restart %u%s)", t->id, r, world, j->id,
           lease[r], restart, m.has_seed ? ", with a seed" : "");
    if (train_send(t, peer[r], env.data, env.len) < 0)
      gn_log(GN_LOG_WARN, "training %s: rank %u waits for its provider's connection", t->id, r);
    sodium_memzero(env.data, env.len);
    gn_buf_done(&env);
  }
  sodium_memzero(priv, sizeof priv);
  if (restart && !seeded && !t->seed_note[0])
    gn__strf(t->seed_note, sizeof t->seed_note, "restarting from scratch: no checkpoint could be fetched");
  if (!state_final(t) && !t->finished)
    set_state(t, "running"); /* (a restart held for its seeds said "restarting") */
  train_save(t);
}

static void seed_drop(train *t);

static void set_state(train *t, const char *state) {
  gn__strf(t->state, sizeof t->state, "%s", state);
  if (state_final(t) && !t->ended_s)
    t->ended_s = gn_unix_s();
  if (state_final(t))
    seed_drop(t);
}

/* --- seeds: a restart starts from the last checkpoint -------------------------------
 *
 * When the group stops its ranks and a restart follows, each old rank's
 * /output (a tar the provider makes, JOB_OUTPUT_GET/JOB_OUTPUT as for
 * --output) is fetched into DATA_DIR/train/ID/seed/rank-R.tar (0600), within
 * TRAIN_SEED_FETCH_MS in all, only from ranks whose lease lives and whose
 * provider is connected, each at most GN_JOB_SEED_MAX and all together at
 * most TRAIN_SEED_TOTAL_MAX. The SHA-256 is ours, of the bytes written.
 * The restarted ranks' manifests name a seed (their own old rank's, else
 * the lowest rank's that came); their providers fetch it with JOB_SEED_GET
 * (answered by gn__trainreq_on_seed_get). The files go when the group
 * ends, and at startup for groups that ended. */

static int seed_dir(const gn_node *n, const char *id, char *buf, size_t cap) {
  return gn__pathf(buf, cap, "%s/train/%s/seed", n->cfg.data_dir, id);
}

static int seed_path(const gn_node *n, const char *id, uint32_t rank, bool part, char *buf, size_t cap) {
  return gn__pathf(buf, cap, "%s/train/%s/seed/rank-%u.tar%s", n->cfg.data_dir, id, rank, part ? ".part" : "");
}

/* Removes DATA_DIR/train/ID (its seed files; nothing below is ours but them). */
static void seed_remove_dir(const gn_node *n, const char *id) {
  char dir[PATH_MAX], path[PATH_MAX + 300];
  if (seed_dir(n, id, dir, sizeof dir) < 0)
    return;
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)))
      if (e->d_name[0] != '.' && gn__pathf(path, sizeof path, "%s/%s", dir, e->d_name) == 0)
        unlink(path);
    closedir(d);
  }
  rmdir(dir);
  if (gn__pathf(dir, sizeof dir, "%s/train/%s", n->cfg.data_dir, id) == 0)
    rmdir(dir);
}

static int seed_mkdirs(const gn_node *n, const char *id) {
  char dir[PATH_MAX];
  const char *fmts[] = {"%s/train", "%s/train/%s", "%s/train/%s/seed"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(fmts); i++) {
    int r = i == 0   ? gn__pathf(dir, sizeof dir, "%s/train", n->cfg.data_dir)
            : i == 1 ? gn__pathf(dir, sizeof dir, "%s/train/%s", n->cfg.data_dir, id)
                     : seed_dir(n, id, dir, sizeof dir);
    if (r < 0)
      return r;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
      return -errno;
  }
  return 0;
}

static void seed_fetch_close(train *t, uint32_t r, bool unlink_part) {
  seed_fetch *f = &t->sf[r];
  if (f->fd >= 0)
    close(f->fd);
  f->fd = -1;
  free(f->buf);
  f->buf = NULL;
  char path[PATH_MAX];
  if (unlink_part && seed_path(t->n, t->id, r, true, path, sizeof path) == 0)
    unlink(path);
}

static void seed_fail(train *t, uint32_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seed_fail(train *t, uint32_t r, const char *fmt, ...) {
  seed_fetch *f = &t->sf[r];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->why, sizeof f->why, fmt, ap);
  va_end(ap);
  f->st = SEED_FAILED;
  seed_fetch_close(t, r, true);
  gn_log(GN_LOG_INFO, "training %s: no checkpoint from rank %u: %s", t->id, r, f->why);
}

/* Ends a fetch in progress (the files made so far are removed). */
static void seed_abort(train *t) {
  for (uint32_t r = 0; t->sf && r < t->nsf; r++)
    seed_fetch_close(t, r, true);
  free(t->sf);
  t->sf = NULL;
  t->nsf = 0;
  t->seeding = false;
  t->pending_ready = 0;
}

/* The group ended: no seed is needed any more. */
static void seed_drop(train *t) {
  seed_abort(t);
  for (uint32_t r = 0; r < TRAIN_MAX_RANKS; r++)
    t->seeds[r].have = false;
  for (uint32_t r = 0; r < t->world; r++)
    t->ranks[r].has_seed = false;
  seed_remove_dir(t->n, t->id);
}

static int seed_ask(train *t, seed_fetch *f, uint64_t offset) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, f->job_id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, f->lease_id);
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, offset);
  int r = gn__node_send(t->n, f->peer, GN_MSG_JOB_OUTPUT_GET, &w);
  gn_wire_writer_done(&w);
  return r;
}

static void start_ranks(train *t, uint32_t restart);

/* Every fetch is done or given up: the note, then the held READY. */
static void seed_finish(train *t) {
  uint32_t got = 0;
  uint64_t bytes = 0;
  char fails[300] = "";
  size_t fl = 0;
  for (uint32_t r = 0; r < t->nsf; r++) {
    if (t->seeds[r].have) {
      got++;
      bytes += t->seeds[r].size;
      continue;
    }
    char path[PATH_MAX];
    if (seed_path(t->n, t->id, r, false, path, sizeof path) == 0)
      unlink(path); /* an earlier restart's */
    if (fl < sizeof fails - 1) {
      int k = snprintf(fails + fl, sizeof fails - fl, "%srank %u: %s", fl ? "; " : "", r,
                       t->sf[r].why[0] ? t->sf[r].why : "not fetched");
      fl = k > 0 ? fl + (size_t)k : fl;
      if (fl >= sizeof fails)
        fl = sizeof fails - 1;
    }
  }
  for (uint32_t r = 0; r < t->nsf; r++)
    seed_fetch_close(t, r, true);
  free(t->sf);
  t->sf = NULL;
  uint32_t old = t->nsf;
  t->nsf = 0;
  t->seeding = false;
  if (!got)
    gn__strf(t->seed_note, sizeof t->seed_note, "restarting from scratch: no checkpoint could be fetched (%s)",
             fails[0] ? fails : "no rank ran");
  else
    gn__strf(t->seed_note, sizeof t->seed_note,
             "restarting from the last checkpoint: /output of %u of %u ranks (%llu bytes)%s%s", got, old,
             (unsigned long long)bytes, fails[0] ? "; none from " : "", fails);
  gn_log(got ? GN_LOG_INFO : GN_LOG_WARN, "training %s: %s", t->id, t->seed_note);
  gn__strf(t->reason, sizeof t->reason, "%s", t->seed_note);
  train_save(t);
  uint32_t restart = t->pending_ready;
  t->pending_ready = 0;
  gn_gang_info gi;
  if (restart && t->g && (gn_gang_info_get(t->g, &gi), gi.phase == GN_GANG_READY) && !state_final(t))
    start_ranks(t, restart);
}

/* Does what is due: asks the ranks whose jobs stopped, gives up the late
 * ones; finishes when nothing is pending. */
static void seed_step(train *t, uint64_t now) {
  if (!t->seeding)
    return;
  bool pending = false, over = gn_ms_since(now, t->seed_start_ms) >= TRAIN_SEED_FETCH_MS;
  for (uint32_t r = 0; r < t->nsf; r++) {
    seed_fetch *f = &t->sf[r];
    if (f->st == SEED_DONE || f->st == SEED_FAILED)
      continue;
    if (over) {
      seed_fail(t, r, "no whole /output within %u s", TRAIN_SEED_FETCH_MS / 1000);
      continue;
    }
    if (f->st == SEED_WAIT) {
      gn_job *j = gn__job_find(t->n, f->job_id);
      if (j && j->state < GN_JOB_EXITED && gn_ms_since(now, t->seed_start_ms) < TRAIN_SEED_STOP_WAIT_MS) {
        pending = true;
        continue;
      }
      char path[PATH_MAX];
      if (seed_path(t->n, t->id, r, true, path, sizeof path) < 0 ||
          (f->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
        seed_fail(t, r, "cannot write %s: %s", path, strerror(errno));
        continue;
      }
      f->buf = malloc((size_t)TRAIN_SEED_WINDOW * GN_JOB_OUTPUT_CHUNK);
      if (!f->buf) {
        seed_fail(t, r, "out of memory");
        continue;
      }
      crypto_hash_sha256_init(&f->h);
      f->st = SEED_FIRST;
      f->slot[0].offset = 0;
      f->slot[0].used = true;
      f->next_ask = GN_JOB_OUTPUT_CHUNK;
      f->last_heard_ms = now;
      int rc = seed_ask(t, f, 0);
      if (rc < 0) {
        seed_fail(t, r, "cannot reach its provider: %s", gn_strerror(rc));
        continue;
      }
    } else if (gn_ms_since(now, f->last_heard_ms) >= TRAIN_SEED_IDLE_MS) {
      seed_fail(t, r, "its provider sent nothing for %u s", TRAIN_SEED_IDLE_MS / 1000);
      continue;
    } else if (f->retry_at_ms && now >= f->retry_at_ms) {
      f->retry_at_ms = 0;
      for (uint32_t k = 0; k < TRAIN_SEED_WINDOW; k++)
        if (f->slot[k].used && !f->slot[k].got)
          seed_ask(t, f, f->slot[k].offset);
    }
    pending = true;
  }
  if (!pending)
    seed_finish(t);
}

/* The group stopped its ranks and a restart follows: fetch their /output. */
static void seed_begin(train *t) {
  if (t->seeding || !t->world)
    return;
  for (uint32_t r = 0; r < TRAIN_MAX_RANKS; r++)
    t->seeds[r].have = false;
  t->seed_reserved = 0;
  t->pending_ready = 0;
  t->seed_note[0] = 0;
  t->sf = calloc(t->world, sizeof *t->sf);
  if (!t->sf) {
    gn__strf(t->seed_note, sizeof t->seed_note,
             "restarting from scratch: no checkpoint could be fetched (out of memory)");
    return;
  }
  t->nsf = t->world;
  t->seeding = true;
  t->seed_start_ms = gn_mono_ms();
  int mk = seed_mkdirs(t->n, t->id);
  for (uint32_t r = 0; r < t->nsf; r++) {
    seed_fetch *f = &t->sf[r];
    f->fd = -1;
    gn_job *j = rank_job(t, r);
    gn_lease *l = j ? gn__lease_find(t->n, j->lease_id) : NULL;
    if (mk < 0)
      seed_fail(t, r, "cannot make the seed directory: %s", gn_strerror(mk));
    else if (!j)
      seed_fail(t, r, "it has no job");
    else if (!l || l->role != GN_ROLE_REQUESTER || l->state != GN_LEASE_ACTIVE)
      seed_fail(t, r, "its lease has ended");
    else if (!t->n->tp || !gn_transport_is_up(t->n->tp, l->peer))
      seed_fail(t, r, "its provider is not connected");
    else {
      f->st = SEED_WAIT;
      gn__strf(f->job_id, sizeof f->job_id, "%s", j->id);
      gn__strf(f->lease_id, sizeof f->lease_id, "%s", j->lease_id);
      memcpy(f->peer, l->peer, GN_PK_LEN);
    }
  }
  gn_log(GN_LOG_INFO, "training %s: fetching the ranks' /output for the restart (at most %u s)", t->id,
         TRAIN_SEED_FETCH_MS / 1000);
  set_state(t, "restarting");
  gn__strf(t->seed_note, sizeof t->seed_note, "fetching the ranks' checkpoints for the restart");
  train_save(t);
  seed_step(t, gn_mono_ms());
}

/* Writes what arrived in order: DONE when it is whole. */
static void seed_progress(train *t, uint32_t r, uint64_t now) {
  seed_fetch *f = &t->sf[r];
  for (;;) {
    uint32_t k = 0;
    while (k < TRAIN_SEED_WINDOW && !(f->slot[k].used && f->slot[k].got && f->slot[k].offset == f->written))
      k++;
    if (k == TRAIN_SEED_WINDOW)
      break;
    const uint8_t *p = f->buf + (size_t)k * GN_JOB_OUTPUT_CHUNK;
    size_t left = f->slot[k].len;
    while (left) {
      ssize_t w = write(f->fd, p, left);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0) {
        seed_fail(t, r, "cannot write its seed: %s", w < 0 ? strerror(errno) : "short write");
        return;
      }
      crypto_hash_sha256_update(&f->h, p, (size_t)w);
      p += w;
      left -= (size_t)w;
    }
    f->written += f->slot[k].len;
    f->slot[k].used = f->slot[k].got = false;
  }
  if (f->written == f->size) {
    char part[PATH_MAX], path[PATH_MAX];
    train_seed *s = &t->seeds[r];
    crypto_hash_sha256_final(&f->h, s->sha256);
    if (fsync(f->fd) < 0 || seed_path(t->n, t->id, r, true, part, sizeof part) < 0 ||
        seed_path(t->n, t->id, r, false, path, sizeof path) < 0 || rename(part, path) < 0) {
      seed_fail(t, r, "cannot keep its seed: %s", strerror(errno));
      return;
    }
    s->size = f->size;
    s->have = true;
    f->st = SEED_DONE;
    seed_fetch_close(t, r, false);
    gn_log(GN_LOG_INFO, "training %s: rank %u's /output fetched for the restart (%llu bytes)", t->id, r,
           (unsigned long long)s->size);
    return;
  }
  for (uint32_t k = 0; k < TRAIN_SEED_WINDOW && f->next_ask < f->size; k++) {
    if (f->slot[k].used)
      continue;
    f->slot[k].offset = f->next_ask;
    f->slot[k].used = true;
    f->slot[k].got = false;
    f->next_ask += GN_JOB_OUTPUT_CHUNK;
    int rc = seed_ask(t, f, f->slot[k].offset);
    if (rc < 0) {
      seed_fail(t, r, "cannot reach its provider: %s", gn_strerror(rc));
      return;
    }
  }
  (void)now;
}

/* A JOB_OUTPUT that answers a seed fetch: true when it was one. */
static bool seed_on_output(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_jobmsg *m) {
  train_glue *gl = glue_of(n);
  uint64_t now = gn_mono_ms();
  for (train *t = gl ? gl->list : NULL; t; t = t->next) {
    if (!t->seeding)
      continue;
    for (uint32_t r = 0; r < t->nsf; r++) {
      seed_fetch *f = &t->sf[r];
      if ((f->st != SEED_FIRST && f->st != SEED_MORE) || strcmp(f->job_id, m->job_id) != 0 ||
          memcmp(f->peer, peer, GN_PK_LEN) != 0)
        continue;
      uint32_t k = 0;
      while (k < TRAIN_SEED_WINDOW && !(f->slot[k].used && !f->slot[k].got && f->slot[k].offset == m->offset))
        k++;
      if (k == TRAIN_SEED_WINDOW)
        return false; /* not asked by the fetch (an API request's, or a repeat) */
      f->last_heard_ms = now;
      if (m->reason[0] && !m->data_len) {
        if (strstr(m->reason, "busy") && f->retries < TRAIN_SEED_RETRIES) {
          f->retries++;
          f->retry_at_ms = now + 500;
        } else
          seed_fail(t, r, "its provider refused: %s", m->reason);
      } else if (f->st == SEED_FIRST && (m->size == 0 || m->size > GN_JOB_SEED_MAX)) {
        if (m->size == 0)
          seed_fail(t, r, "its provider sent an empty /output");
        else
          seed_fail(t, r, "its /output (%llu bytes) is larger than a seed may be (%llu bytes)",
                    (unsigned long long)m->size, (unsigned long long)GN_JOB_SEED_MAX);
      } else if (f->st == SEED_FIRST && t->seed_reserved + m->size > TRAIN_SEED_TOTAL_MAX) {
        seed_fail(t, r, "the group's seeds would pass %llu bytes in all", (unsigned long long)TRAIN_SEED_TOTAL_MAX);
      } else {
        if (f->st == SEED_FIRST) {
          f->size = m->size;
          t->seed_reserved += m->size;
          f->st = SEED_MORE;
        }
        uint64_t due = f->size - m->offset < GN_JOB_OUTPUT_CHUNK ? f->size - m->offset : GN_JOB_OUTPUT_CHUNK;
        if (m->size != f->size)
          seed_fail(t, r, "its /output's snapshot changed while it was read");
        else if (m->data_len != due)
          seed_fail(t, r, "a chunk of %zu bytes at %llu where %llu were due", m->data_len,
                    (unsigned long long)m->offset, (unsigned long long)due);
        else {
          memcpy(f->buf + (size_t)k * GN_JOB_OUTPUT_CHUNK, m->data, m->data_len);
          f->slot[k].len = m->data_len;
          f->slot[k].got = true;
          seed_progress(t, r, now);
        }
      }
      seed_step(t, now);
      return true;
    }
  }
  return false;
}

/* JOB_SEED_GET: one chunk of the seed a rank's manifest names, to the
 * provider of that rank's lease only (anyone else hears nothing, not even
 * that the job exists). One pread per request, nothing queued. */
void gn__trainreq_on_seed_get(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_job *j = gn__job_find(n, m.job_id);
  gn_lease *l = j ? gn__lease_find(n, j->lease_id) : NULL;
  train *t = NULL;
  uint32_t r = 0;
  if (j && l && j->role == GN_ROLE_REQUESTER && l->role == GN_ROLE_REQUESTER && l->state == GN_LEASE_ACTIVE &&
      strcmp(j->lease_id, m.lease_id) == 0 && memcmp(l->peer, peer, GN_PK_LEN) == 0) {
    train_glue *gl = glue_of(n);
    for (t = gl ? gl->list : NULL; t; t = t->next) {
      for (r = 0; r < t->world && strcmp(t->ranks[r].job_id, m.job_id) != 0; r++)
        ;
      if (r < t->world)
        break;
    }
  }
  if (!t) {
    gn__jobmsg_done(&m);
    return;
  }
  static uint8_t chunk[GN_JOB_OUTPUT_CHUNK];
  size_t len = 0;
  uint64_t size = 0;
  char why[160] = "";
  const train_rank *tr = &t->ranks[r];
  const train_seed *s = tr->has_seed && tr->seed_rank < TRAIN_MAX_RANKS ? &t->seeds[tr->seed_rank] : NULL;
  if (!s || !s->have || state_final(t))
    gn__strf(why, sizeof why, "job %s has no seed", m.job_id);
  else if (m.offset > s->size)
    gn__strf(why, sizeof why, "offset %llu is past the seed's %llu bytes", (unsigned long long)m.offset,
             (unsigned long long)s->size);
  else {
    char path[PATH_MAX];
    struct stat st;
    int fd = seed_path(n, t->id, tr->seed_rank, false, path, sizeof path) == 0
                 ? open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
                 : -1;
    if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size != s->size)
      gn__strf(why, sizeof why, "the seed of job %s is gone", m.job_id);
    else {
      ssize_t k = pread(fd, chunk, sizeof chunk, (off_t)m.offset);
      uint64_t due = s->size - m.offset < sizeof chunk ? s->size - m.offset : sizeof chunk;
      if (k < 0 || (uint64_t)k != due)
        gn__strf(why, sizeof why, "cannot read the seed of job %s", m.job_id);
      else {
        len = (size_t)k;
        size = s->size;
      }
    }
    if (fd >= 0)
      close(fd);
  }
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__joboutput_encode(&w, m.job_id, m.offset, why[0] ? NULL : chunk, len, why[0] || m.offset + len >= size,
                       why[0] ? 0 : size, why);
  gn__node_send(n, peer, GN_MSG_JOB_SEED, &w);
  gn_wire_writer_done(&w);
  gn__jobmsg_done(&m);
}

/* At startup: seed directories of groups that ended or are gone, and the
 * parts of fetches the stop cut short. */
static void seed_sweep(gn_node *n) {
  char dir[PATH_MAX];
  if (gn__pathf(dir, sizeof dir, "%s/train", n->cfg.data_dir) < 0)
    return;
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  unsigned removed = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || !gn_id_valid(e->d_name))
      continue;
    train *t = train_find(n, e->d_name);
    if (!t || state_final(t)) {
      seed_remove_dir(n, e->d_name);
      removed++;
      continue;
    }
    for (uint32_t r = 0; r < TRAIN_MAX_RANKS; r++) {
      char path[PATH_MAX];
      if (seed_path(n, t->id, r, true, path, sizeof path) == 0)
        unlink(path);
      if (t->seeds[r].have && seed_path(n, t->id, r, false, path, sizeof path) == 0 && access(path, R_OK) != 0)
        t->seeds[r].have = false;
    }
  }
  closedir(d);
  if (removed)
    gn_log(GN_LOG_INFO, "removed the restart seeds of %u training jobs that ended", removed);
}

/* Saves the gang, then performs out's actions in order and arms the timer. */
static void perform(train *t, gn_gang_out *out) {
  gn_gang_info gi;
  gn_gang_info_get(t->g, &gi);
  if (!state_final(t)) {
    if (gi.phase == GN_GANG_FORMING)
      set_state(t, "forming");
    else if (gi.phase == GN_GANG_READY && !t->finished)
      set_state(t, t->seeding ? "restarting" : "running");
    else if (gi.phase == GN_GANG_RESTARTING)
      set_state(t, "restarting");
    else if (gi.phase == GN_GANG_FAILED)
      set_state(t, "failed");
    else if (gi.phase == GN_GANG_ENDED && strcmp(t->state, "done") != 0)
      set_state(t, "ended");
  }
  if (train_save(t) < 0)
    return; /* nothing leaves that a crash could forget */
  t->timer_at_ms = out->timer_at_ms;
  /* Copied: an action may call the gang again (a request that cannot be sent). */
  size_t nact = out->n;
  gn_gang_action *acts = malloc(nact * sizeof *acts + 1);
  if (!acts)
    return;
  memcpy(acts, out->act, nact * sizeof *acts);
  /* A stop that a restart follows: in this call (a failed rank restarts on
   * the same leases) or once a replacement agreed. */
  bool restart_follows = gi.phase == GN_GANG_RESTARTING;
  for (size_t i = 0; i < nact; i++)
    if (acts[i].kind == GN_GANG_ACT_READY && acts[i].restart)
      restart_follows = true;
  for (size_t i = 0; i < nact; i++) {
    const gn_gang_action *a = &acts[i];
    switch (a->kind) {
    case GN_GANG_ACT_REQUEST: {
      char why[200] = "";
      gn_gang_info now_gi; /* an earlier request of this call that could not be sent may have failed the group */
      gn_gang_info_get(t->g, &now_gi);
      if (now_gi.phase == GN_GANG_FAILED || now_gi.phase == GN_GANG_ENDED)
        break;
      if (request_member(t, a, why, sizeof why) < 0) { /* as no answer, now */
        gn_gang_out *o2 = calloc(1, sizeof *o2);
        if (o2 && gn_gang_no_answer(t->g, gn_mono_ms(), a->lease_id, why, o2) == 0)
          perform(t, o2);
        free(o2);
      }
      break;
    }
    case GN_GANG_ACT_RELEASE:
      release_member(t, a);
      break;
    case GN_GANG_ACT_READY:
      if (a->restart && t->seeding) { /* started once the old ranks' checkpoints are in */
        gn_log(GN_LOG_INFO, "training %s: every member agreed: the ranks start again once the checkpoints are in",
               t->id);
        t->pending_ready = a->restart;
        break;
      }
      gn_log(GN_LOG_INFO, "training %s: every member agreed: starting the ranks%s", t->id, a->restart ? " again" : "");
      start_ranks(t, a->restart);
      break;
    case GN_GANG_ACT_STOP_JOBS:
      gn_log(GN_LOG_INFO, "training %s: stopping every rank: %s", t->id, a->reason);
      stop_jobs(t);
      t->job_failed_reported = true;
      t->pending_ready = 0; /* the group left READY: a READY held for the seeds is void */
      if (restart_follows)
        seed_begin(t);
      break;
    case GN_GANG_ACT_FAILED:
      gn_log(GN_LOG_WARN, "training %s failed: %s", t->id, a->reason);
      gn__strf(t->reason, sizeof t->reason, "%s", a->reason);
      set_state(t, "failed");
      queue_drop(t, true);
      train_save(t);
      break;
    default:
      break;
    }
  }
  free(acts);
}

/* Runs one gang call on a fresh out and performs it. */
#define GANG_CALL(t, call)                                                                                             \
  do {                                                                                                                 \
    gn_gang_out *out = calloc(1, sizeof *out);                                                                         \
    if (out && (call) == 0)                                                                                            \
      perform((t), out);                                                                                               \
    free(out);                                                                                                         \
  } while (0)

/* --- hooks from the requester -----------------------------------------------*/

static train *train_of_lease(gn_node *n, const char *lease_id, size_t *ret_member) {
  train_glue *gl = glue_of(n);
  for (train *t = gl ? gl->list : NULL; t; t = t->next)
    if (t->g && gn_gang_lookup(t->g, lease_id, ret_member) == 0)
      return t;
  return NULL;
}

bool gn__trainreq_on_accept(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len,
                            const gn_agreement *ag) {
  size_t member;
  train *t = train_of_lease(n, ag->terms.lease_id, &member);
  if (!t)
    return false;
  train_glue *gl = glue_of(n);
  train_issued *is = issued_find(t, ag->terms.lease_id);
  const char *why = NULL;
  if (memcmp(ag->terms.provider, peer, GN_PK_LEN) != 0 || memcmp(ag->terms.requester, n->id->pk, GN_PK_LEN) != 0)
    why = "the acceptance names other parties";
  else if (!is || !is->have_terms || memcmp(is->provider, peer, GN_PK_LEN) != 0)
    why = "no request of this run matches it";
  else if (memcmp(is->t.nonce, ag->terms.nonce, sizeof is->t.nonce) != 0 || is->t.count != ag->terms.count ||
           is->t.price_uper_hour != ag->terms.price_uper_hour || is->t.max_s != ag->terms.max_s ||
           strcmp(is->t.offer_id, ag->terms.offer_id) != 0 || is->t.requested_s != ag->terms.requested_s)
    why = "it does not embed the request this node signed";
  else if (ag->gpu_count != ag->terms.count)
    why = "it grants another number of GPUs than asked for";
  if (why) {
    gn_log(GN_LOG_WARN, "training %s: refusing the acceptance of lease %s: %s", t->id, ag->terms.lease_id, why);
    if (memcmp(ag->terms.provider, peer, GN_PK_LEN) == 0)
      send_bare_release(t, peer, ag->terms.lease_id, "agreement refused by the requester");
    GANG_CALL(t, gn_gang_no_answer(t->g, gn_mono_ms(), ag->terms.lease_id, why, out));
    return true;
  }
  gn_lease *l = NULL;
  uint64_t spend = t->max_spend && t->gpus ? t->max_spend * ag->terms.count / t->gpus : 0;
  int r = gl && gl->ops.adopt ? gl->ops.adopt(n, peer, raw, raw_len, ag, spend, t->max_price, &l) : GN_ESTATE;
  if (r < 0) {
    char reason[160];
    gn__strf(reason, sizeof reason, "cannot start checking the bills of lease %s: %s", ag->terms.lease_id,
             gn_strerror(r));
    GANG_CALL(t, gn_gang_lost(t->g, gn_mono_ms(), ag->terms.lease_id, reason, out));
    return true;
  }
  gn_log(GN_LOG_INFO, "training %s: member %zu agreed (lease %s)", t->id, member, ag->terms.lease_id);
  GANG_CALL(t, gn_gang_accepted(t->g, gn_mono_ms(), ag->terms.lease_id, peer, out));
  return true;
}

void gn__trainreq_on_reject(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *lease_id, const char *reason) {
  size_t member;
  train *t = train_of_lease(n, lease_id, &member);
  if (!t)
    return;
  gn_log(GN_LOG_INFO, "training %s: member %zu's provider refused lease %s: %s", t->id, member, lease_id, reason);
  GANG_CALL(t, gn_gang_refused(t->g, gn_mono_ms(), lease_id, peer, reason[0] ? reason : "refused", out));
}

/* Sets (when) or clears the down time of t's members on provider peer. */
static void mark_down(train *t, const uint8_t peer[GN_PK_LEN], uint64_t when) {
  if (!t->g)
    return;
  gn_gang_info gi;
  gn_gang_info_get(t->g, &gi);
  for (uint32_t m = 0; m < gi.members && m < GN_GANG_MAX_MEMBERS; m++) {
    gn_gang_member_info mi;
    if (gn_gang_member(t->g, m, &mi) == 0 && memcmp(mi.offer.provider, peer, GN_PK_LEN) == 0)
      t->down_since[m] = when && t->down_since[m] ? t->down_since[m] : when;
  }
}

void gn__trainreq_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  train_glue *gl = glue_of(n);
  for (train *t = gl ? gl->list : NULL; t; t = t->next)
    mark_down(t, peer, 0);
  for (train *t = gl ? gl->list : NULL; t; t = t->next)
    for (train_msg **pp = &t->queue; *pp;) {
      train_msg *m = *pp;
      if (memcmp(m->peer, peer, GN_PK_LEN) != 0) {
        pp = &m->next;
        continue;
      }
      gn_transport_send(n->tp, peer, m->env.data, m->env.len);
      *pp = m->next;
      gn_buf_done(&m->env);
      free(m);
    }
}

void gn__trainreq_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  /* An unanswered member's provider went: as no answer, now. Agreed
   * members are the lease machines' to judge (their end is seen in tick). */
  train_glue *gl = glue_of(n);
  for (train *t = gl ? gl->list : NULL; t; t = t->next) {
    if (!t->g || state_final(t))
      continue;
    mark_down(t, peer, gn_mono_ms());
    const char *addr = provider_addr(n, peer); /* a session that dropped may come back at once */
    if (addr && n->tp && !n->stopping)
      gn__nat_connect_peer(n, addr, peer);
    gn_gang_info gi;
    gn_gang_info_get(t->g, &gi);
    for (uint32_t m = 0; m < gi.members; m++) {
      gn_gang_member_info mi;
      if (gn_gang_member(t->g, m, &mi) == 0 && mi.state == GN_GANG_M_REQUESTED &&
          memcmp(mi.offer.provider, peer, GN_PK_LEN) == 0 && !gn__lease_find(n, mi.lease_id))
        GANG_CALL(t,
                  gn_gang_no_answer(t->g, gn_mono_ms(), mi.lease_id, "its provider went away before answering", out));
    }
  }
}

/* Member leases that ended, ranks that failed or all finished. */
static void watch(train *t, uint64_t now_ms) {
  gn_gang_info gi;
  gn_gang_info_get(t->g, &gi);
  if (t->finished) { /* collecting the ranks' /output: the leases go at its end */
    if (strcmp(t->state, "collecting") == 0 && now_ms >= t->collect_until) {
      set_state(t, "done");
      GANG_CALL(t, gn_gang_release(t->g, now_ms, "the training job finished (outputs not collected in time)", out));
    }
    return;
  }
  if (gi.phase != GN_GANG_READY && gi.phase != GN_GANG_RESTARTING && gi.phase != GN_GANG_FORMING)
    return;
  for (uint32_t m = 0; m < gi.members; m++) {
    gn_gang_member_info mi;
    if (gn_gang_member(t->g, m, &mi) < 0 || mi.state != GN_GANG_M_AGREED)
      continue;
    gn_lease *l = gn__lease_find(t->n, mi.lease_id);
    if (l && l->state == GN_LEASE_ENDED) {
      char reason[160];
      gn__strf(reason, sizeof reason, "lease %s ended: %s", l->id, l->end_reason);
      GANG_CALL(t, gn_gang_lost(t->g, now_ms, mi.lease_id, reason, out));
      return;
    }
    if (m < GN_GANG_MAX_MEMBERS && t->down_since[m] && gn_ms_since(now_ms, t->down_since[m]) >= TRAIN_PEER_GRACE_MS &&
        !gn_transport_is_up(t->n->tp, mi.offer.provider)) {
      char reason[160];
      gn__strf(reason, sizeof reason, "its provider has been unreachable for %u s", TRAIN_PEER_GRACE_MS / 1000);
      t->down_since[m] = 0;
      GANG_CALL(t, gn_gang_lost(t->g, now_ms, mi.lease_id, reason, out));
      return;
    }
  }
  if (gi.phase != GN_GANG_READY || t->job_failed_reported || !t->world)
    return;
  uint32_t done = 0;
  for (uint32_t r = 0; r < t->world; r++) {
    gn_job *j = rank_job(t, r);
    if (!j)
      continue;
    if (j->state == GN_JOB_EXITED && j->exit_code == 0) {
      done++;
      continue;
    }
    if (j->state == GN_JOB_FAILED || j->state == GN_JOB_REJECTED || j->state == GN_JOB_STOPPED ||
        (j->state == GN_JOB_EXITED && j->exit_code != 0)) {
      char reason[160];
      if (j->state == GN_JOB_EXITED)
        gn__strf(reason, sizeof reason, "rank %u (job %s) exited with %d", r, j->id, j->exit_code);
      else
        gn__strf(reason, sizeof reason, "rank %u (job %s) %s%s%s", r, j->id, gn__job_state_name(j->state),
                 j->error[0] ? ": " : "", j->error);
      t->job_failed_reported = true;
      GANG_CALL(t, gn_gang_job_failed(t->g, now_ms, t->ranks[r].member, reason, out));
      return;
    }
  }
  if (done == t->world && t->output) { /* hold the leases until the outputs are copied */
    t->job_failed_reported = true;
    t->finished = true;
    t->collect_until = now_ms + TRAIN_COLLECT_MS;
    set_state(t, "collecting");
    gn__strf(t->reason, sizeof t->reason, "every rank exited with 0");
    train_save(t);
    return;
  }
  if (done == t->world) {
    t->job_failed_reported = true;
    t->finished = true;
    set_state(t, "done");
    gn__strf(t->reason, sizeof t->reason, "every rank exited with 0");
    GANG_CALL(t, gn_gang_release(t->g, now_ms, "the training job finished", out));
  }
}

static void restore_all(gn_node *n);
static bool attesting(const train *t);
static void attest_step(train *t);
static void waits_expire(train_glue *gl, uint64_t now_ms);

void gn__trainreq_tick(gn_node *n, uint64_t now_ms) {
  train_glue *gl = glue_of(n);
  if (!gl)
    return;
  if (!gl->restored) {
    gl->restored = true;
    restore_all(n);
  }
  waits_expire(gl, now_ms);
  for (train *t = gl->list, *next; t; t = next) {
    next = t->next;
    if (attesting(t))
      attest_step(t); /* may forget t */
  }
  for (train *t = gl->list; t; t = t->next) {
    if (!t->g)
      continue;
    if (now_ms >= t->timer_at_ms)
      GANG_CALL(t, gn_gang_timer(t->g, now_ms, out));
    seed_step(t, now_ms);
    watch(t, now_ms);
  }
}

/* --- JSON views -------------------------------------------------------------------*/

static json_t *rtt_json(uint32_t v) {
  return v == GN_RTT_UNKNOWN ? json_null() : json_integer(v);
}

static json_t *plan_json(const train *t, const gn_plan *p) {
  static const char *const kinds[] = {"measured", "estimated", "unknown"};
  json_t *prov = json_array(), *mat = json_array(), *kmat = json_array();
  for (uint32_t i = 0; i < p->n; i++) {
    const gn_plan_candidate *c = &t->cand[p->cand[i]];
    char pid[GN_NODE_ID_STRLEN], price[32];
    gn_node_id_format(c->provider, pid);
    gn_price_format(c->price_uper_hour, price, sizeof price);
    json_array_append_new(prov,
                          json_pack("{s:I, s:s, s:s, s:s, s:I, s:I, s:s, s:o, s:I}", "node", (json_int_t)i, "provider",
                                    pid, "offer", c->offer_id, "addr", t->cand_addr[p->cand[i]], "gpus",
                                    (json_int_t)p->per_node, "price_uper_hour", (json_int_t)c->price_uper_hour, "price",
                                    price, "rtt_ms", rtt_json(c->rtt_ms), "first_rank", (json_int_t)(i * p->per_node)));
    json_t *row = json_array(), *krow = json_array();
    for (uint32_t k = 0; k < p->n; k++) {
      json_array_append_new(row, rtt_json(p->rtt_ms[i][k]));
      json_array_append_new(krow, json_string(kinds[p->rtt_kind[i][k] <= 2 ? p->rtt_kind[i][k] : 2]));
    }
    json_array_append_new(mat, row);
    json_array_append_new(kmat, krow);
  }
  char total[32];
  gn_price_format(p->total_uper_hour, total, sizeof total);
  return json_pack("{s:I, s:I, s:I, s:I, s:s, s:s, s:o, s:s, s:b, s:I, s:o, s:o, s:o}", "nodes", (json_int_t)p->n,
                   "per_node", (json_int_t)p->per_node, "gpus", (json_int_t)p->gpus, "total_uper_hour",
                   (json_int_t)p->total_uper_hour, "total_per_hour", total, "currency", t->currency, "worst_rtt_ms",
                   p->n > 1 ? rtt_json(p->worst_rtt_ms) : json_integer(0), "worst_kind",
                   kinds[p->worst_kind <= 2 ? p->worst_kind : 2], "exact", p->exact, "spares", (json_int_t)p->n_spares,
                   "providers", prov, "rtt_ms", mat, "rtt_kind", kmat);
}

static uint64_t lease_cost(const gn_lease *l) {
  if (l->invoice_id[0])
    return l->invoice_micro;
  if (!l->req)
    return 0;
  gn_lease_info info;
  gn_lease_now now = {gn_mono_ms(), gn_unix_s()};
  gn_lease_req_info(l->req, now, &info);
  return info.accepted_micro;
}

static json_t *train_json(train *t) {
  static const char *const mstate[] = {"?",         "requested", "agreed",   "refused",
                                       "no answer", "lost",      "released", "abandoned"};
  json_t *o = train_doc(t);
  json_t *members = json_array(), *ranks = json_array();
  uint64_t cost = 0;
  bool settled = true;
  for (size_t i = 0; i < t->nissued; i++) {
    gn_lease *l = gn__lease_find(t->n, t->issued[i].lease_id);
    if (!l)
      continue;
    cost += lease_cost(l);
    if (!l->invoice_done)
      settled = false;
  }
  if (t->g) {
    gn_gang_info gi;
    gn_gang_info_get(t->g, &gi);
    /* How many restarts the group has made: a follower polling the state
     * can miss a short "restarting" between two reads, never this. */
    json_object_set_new(o, "restarted", json_integer((json_int_t)gi.restarts_used));
    for (uint32_t m = 0; m < gi.members; m++) {
      gn_gang_member_info mi;
      if (gn_gang_member(t->g, m, &mi) < 0)
        continue;
      char pid[GN_NODE_ID_STRLEN];
      gn_node_id_format(mi.offer.provider, pid);
      gn_lease *l = gn__lease_find(t->n, mi.lease_id);
      json_array_append_new(
          members, json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:s?}", "member", (json_int_t)m, "provider",
                             pid, "offer", mi.offer.offer_id, "lease", mi.lease_id, "state",
                             mstate[mi.state >= 0 && mi.state <= 7 ? mi.state : 0], "reason", mi.reason, "gpus",
                             (json_int_t)mi.offer.gpus, "price_uper_hour", (json_int_t)mi.offer.price_uper_hour,
                             "cost_micro", (json_int_t)(l ? lease_cost(l) : 0), "lease_state",
                             l ? (l->state == GN_LEASE_ACTIVE ? "active" : "ended") : NULL));
    }
  }
  for (uint32_t r = 0; r < t->world; r++) {
    gn_job *j = rank_job(t, r);
    json_t *jr = json_pack("{s:I, s:s, s:I, s:o}", "rank", (json_int_t)r, "job", t->ranks[r].job_id, "member",
                           (json_int_t)t->ranks[r].member, "seed",
                           t->ranks[r].has_seed ? json_integer(t->ranks[r].seed_rank) : json_null());
    if (j) {
      gn_lease *l = gn__lease_find(t->n, j->lease_id);
      char pid[GN_NODE_ID_STRLEN] = "";
      if (l)
        gn_node_id_format(l->peer, pid);
      json_object_set_new(jr, "lease", json_string(j->lease_id));
      json_object_set_new(jr, "provider", json_string(pid));
      json_object_set_new(jr, "state", json_string(gn__job_state_name(j->state)));
      json_object_set_new(jr, "exit_code", j->state == GN_JOB_EXITED ? json_integer(j->exit_code) : json_null());
      if (j->error[0])
        json_object_set_new(jr, "error", json_string(j->error));
    }
    json_array_append_new(ranks, jr);
  }
  char c[32];
  gn_price_format(cost, c, sizeof c);
  json_object_set_new(o, "members", members);
  json_object_set_new(o, "ranks", ranks);
  json_object_set_new(o, "cost_micro", json_integer((json_int_t)cost));
  json_object_set_new(o, "cost", json_string(c));
  json_object_set_new(o, "settled", json_boolean(state_final(t) && settled));
  if (state_final(t) && settled)
    json_object_set_new(o, "total_micro", json_integer((json_int_t)cost));
  return o;
}

/* --- planning -------------------------------------------------------------------------*/

/* Time to connect to each candidate's listen address, in parallel, within
 * TRAIN_RTT_PROBE_MS (a TCP handshake is one round trip): GN_RTT_UNKNOWN
 * where it did not connect. On the thread pool. */
static void probe_rtts(train *t) {
  int fd[GN_PLAN_MAX_CANDIDATES];
  uint64_t start = gn_mono_ms();
  for (size_t i = 0; i < t->ncand; i++) {
    fd[i] = -1;
    t->cand[i].rtt_ms = GN_RTT_UNKNOWN;
    char host[64], port[8];
    const char *colon = strrchr(t->cand_addr[i], ':');
    if (!colon || (size_t)(colon - t->cand_addr[i]) >= sizeof host || strlen(colon + 1) >= sizeof port)
      continue;
    memcpy(host, t->cand_addr[i], (size_t)(colon - t->cand_addr[i]));
    host[colon - t->cand_addr[i]] = 0;
    snprintf(port, sizeof port, "%s", colon + 1);
    char *h = host;
    if (h[0] == '[') {
      h++;
      h[strlen(h) - 1] = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai = NULL;
    if (getaddrinfo(h, port, &hints, &ai) != 0 || !ai)
      continue;
    int s = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s >= 0 && connect(s, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
      close(s);
      s = -1;
    }
    freeaddrinfo(ai);
    fd[i] = s;
  }
  for (;;) {
    struct pollfd pf[GN_PLAN_MAX_CANDIDATES];
    size_t idx[GN_PLAN_MAX_CANDIDATES], np = 0;
    for (size_t i = 0; i < t->ncand; i++)
      if (fd[i] >= 0) {
        pf[np] = (struct pollfd){.fd = fd[i], .events = POLLOUT};
        idx[np++] = i;
      }
    uint64_t now = gn_mono_ms();
    if (!np || now - start >= TRAIN_RTT_PROBE_MS)
      break;
    if (poll(pf, np, (int)(TRAIN_RTT_PROBE_MS - (now - start))) <= 0)
      break;
    now = gn_mono_ms();
    for (size_t k = 0; k < np; k++) {
      if (!pf[k].revents)
        continue;
      size_t i = idx[k];
      int err = 0;
      socklen_t el = sizeof err;
      if (getsockopt(fd[i], SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)
        t->cand[i].rtt_ms = (uint32_t)(now - start) ? (uint32_t)(now - start) : 1;
      close(fd[i]);
      fd[i] = -1;
    }
  }
  for (size_t i = 0; i < t->ncand; i++)
    if (fd[i] >= 0)
      close(fd[i]);
}

static void plan_work(uv_work_t *w) {
  train *t = w->data;
  t->rc = 0;
  if (!t->ref.digest[0]) {
    char digest[GN_DIGEST_STRLEN];
    t->rc = gn_registry_resolve(&t->ref, digest, t->err, sizeof t->err);
    if (t->rc == 0)
      memcpy(t->ref.digest, digest, sizeof digest);
  }
  if (t->rc == 0)
    probe_rtts(t);
}

static void train_free(train *t) {
  if (t->rtt_handle)
    gn__rtt_matrix_cancel(t->n, t->rtt_handle);
  seed_abort(t);
  json_decref(t->dropped);
  queue_drop(t, false);
  gn_gang_free(t->g);
  json_decref(t->argv);
  json_decref(t->env);
  json_decref(t->plan);
  free(t->rtt);
  free(t);
}

static void train_unlink(train *t) {
  train_glue *gl = glue_of(t->n);
  for (train **pp = &gl->list; *pp; pp = &(*pp)->next)
    if (*pp == t) {
      *pp = t->next;
      gl->count--;
      break;
    }
}

/* Answers the POST with an error and forgets t. */
static void plan_fail(train *t, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void plan_fail(train *t, int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  gn_ctl_req *req = t->req;
  t->req = NULL;
  gn_log(GN_LOG_INFO, "training %s: %s", t->id, msg);
  gn_ctl_reply_error(req, status, "%s", msg);
  train_unlink(t);
  train_free(t);
}

/* The plan's gang: the leases are asked for; answers the POST (202). */
static void form_gang(train *t, gn_plan *p) {
  t->per_member = p->per_node;
  json_decref(t->plan);
  t->plan = plan_json(t, p);
  json_object_set_new(t->plan, "attested", json_boolean(t->attest));
  json_object_set(t->plan, "dropped", t->dropped ? t->dropped : json_array());
  gn_gang_offer members[GN_PLAN_MAX_NODES], spares[GN_PLAN_MAX_CANDIDATES];
  gn_plan_gang_offers(p, t->cand, members, spares);
  if (t->attest) { /* only attested spares stand in for a member */
    uint32_t kept = 0;
    for (uint32_t i = 0; i < p->n_spares; i++)
      if (t->att[p->spares[i]] == ATT_OK)
        spares[kept++] = spares[i];
    p->n_spares = kept;
    json_object_set_new(t->plan, "spares", json_integer(kept));
  }
  uint64_t timeout = TRAIN_ANSWER_MS;
  const char *e = getenv("GN_RENT_TIMEOUT_MS");
  if (e && atoll(e) >= (long long)GN_GANG_TIMEOUT_MIN_MS && atoll(e) <= (long long)GN_GANG_TIMEOUT_MAX_MS)
    timeout = (uint64_t)atoll(e);
  gn_gang_opts go = {.answer_timeout_ms = timeout,
                     .restarts = t->restarts,
                     .max_total_uper_hour = t->max_price ? t->max_price * t->gpus : 0};
  uint8_t seed[32];
  randombytes_buf(seed, sizeof seed);
  gn_gang_out *out = calloc(1, sizeof *out);
  int r = out ? gn_gang_new(members, p->n, spares, t->restarts ? p->n_spares : 0, &go, seed, gn_mono_ms(), &t->g, out)
              : GN_ENOMEM;
  if (r < 0) {
    free(out);
    free(p);
    plan_fail(t, 500, "cannot start the gang lease: %s", gn_strerror(r));
    return;
  }
  gn_ctl_req *req = t->req;
  t->req = NULL;
  set_state(t, "forming");
  json_t *o = json_pack("{s:s, s:s, s:O}", "id", t->id, "state", t->state, "plan", t->plan);
  gn_log(GN_LOG_INFO, "training %s: %u GPUs on %u providers, worst pair RTT %d ms: asking for the leases", t->id,
         p->gpus, p->n, p->worst_rtt_ms == GN_RTT_UNKNOWN ? -1 : (int)p->worst_rtt_ms);
  free(p);
  perform(t, out);
  free(out);
  gn_ctl_reply_json(req, 202, o);
}

/* "; N providers dropped after attestation: P (why), ..." for messages. */
static void dropped_summary(const train *t, char *buf, size_t cap) {
  buf[0] = 0;
  size_t n = json_array_size(t->dropped), len = 0;
  if (!n)
    return;
  int k = snprintf(buf, cap, "; %zu provider%s dropped for failing attestation:", n, n == 1 ? "" : "s");
  len = k > 0 && (size_t)k < cap ? (size_t)k : cap - 1;
  for (size_t i = 0; i < n && len < cap - 1; i++) {
    const json_t *d = json_array_get(t->dropped, i);
    k = snprintf(buf + len, cap - len, "%s %.16s… (%s)", i ? "," : "", jstr(d, "provider"), jstr(d, "reason"));
    len = k > 0 && len + (size_t)k < cap ? len + (size_t)k : cap - 1;
  }
}

/* Chooses a plan among the candidates left; its members not yet attested
 * are attested first (unless the body said "attest": false). */
static void plan_next(train *t) {
  gn_plan *p = calloc(1, sizeof *p);
  gn_plan_request pr = {
      .gpus = t->gpus, .per_node = t->per_node, .max_total_uper_hour = t->max_price ? t->max_price * t->gpus : 0};
  char why[256] = "", drop[600];
  int r = p ? gn_plan_choose(t->cand, t->ncand, t->rtt, &pr, p, why, sizeof why) : GN_ENOMEM;
  if (r < 0) {
    free(p);
    dropped_summary(t, drop, sizeof drop);
    plan_fail(t, r == GN_EINVAL ? 400 : 409, "no plan for %u GPUs from %zu candidate offers: %s%s", t->gpus, t->ncand,
              why[0] ? why : gn_strerror(r), drop);
    return;
  }
  /* The members, and with --restarts the first spares too (a restart
   * leases them without another round): all attested before any lease. */
  uint32_t need[GN_PLAN_MAX_NODES], nneed = 0;
  for (uint32_t i = 0; i < p->n && nneed < GN_PLAN_MAX_NODES; i++)
    need[nneed++] = p->cand[i];
  for (uint32_t i = 0; t->restarts && i < p->n_spares && i < TRAIN_ATTEST_SPARES && nneed < GN_PLAN_MAX_NODES; i++)
    need[nneed++] = p->spares[i];
  bool all_ok = true;
  for (uint32_t i = 0; t->attest && i < nneed; i++) {
    uint32_t c = need[i];
    if (t->att[c] != ATT_OK)
      all_ok = false;
    if (t->att[c] == ATT_NONE)
      t->att[c] = ATT_QUEUED;
  }
  if (all_ok) {
    t->att_wait = false;
    form_gang(t, p);
    return;
  }
  t->att_wait = true;
  t->att_nmembers = nneed;
  for (uint32_t i = 0; i < nneed; i++)
    memcpy(t->att_members[i], t->cand[need[i]].provider, GN_PK_LEN);
  free(p);
  set_state(t, "attesting");
  attest_step(t);
}

/* Candidate c failed its attestation: out of the candidates, and said so. */
static void drop_cand(train *t, size_t c, const char *why) {
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(t->cand[c].provider, pid);
  gn_log(GN_LOG_WARN, "training %s: provider %s (offer %s) dropped: %s", t->id, pid, t->cand[c].offer_id, why);
  if (!t->dropped)
    t->dropped = json_array();
  json_array_append_new(t->dropped,
                        json_pack("{s:s, s:s, s:s}", "provider", pid, "offer", t->cand[c].offer_id, "reason", why));
  size_t rest = t->ncand - c - 1;
  memmove(&t->cand[c], &t->cand[c + 1], rest * sizeof t->cand[0]);
  memmove(&t->cand_addr[c], &t->cand_addr[c + 1], rest * sizeof t->cand_addr[0]);
  memmove(&t->cand_ports[c], &t->cand_ports[c + 1], rest * sizeof t->cand_ports[0]);
  memmove(&t->att[c], &t->att[c + 1], rest * sizeof t->att[0]);
  memmove(&t->att_at[c], &t->att_at[c + 1], rest * sizeof t->att_at[0]);
  if (t->rtt) { /* row c and column c out of the matrix */
    size_t k = t->ncand, o = 0;
    for (size_t i = 0; i < k; i++)
      for (size_t j = 0; j < k; j++)
        if (i != c && j != c)
          t->rtt[o++] = t->rtt[i * k + j];
  }
  t->ncand--;
}

static size_t cand_of_provider(const train *t, const uint8_t provider[GN_PK_LEN]) {
  for (size_t i = 0; i < t->ncand; i++)
    if (memcmp(t->cand[i].provider, provider, GN_PK_LEN) == 0)
      return i;
  return SIZE_MAX;
}

typedef struct train_att {
  char id[GN_JOB_ID_STRLEN];
  uint8_t provider[GN_PK_LEN];
} train_att;

static bool attesting(const train *t) {
  return t->att_wait && strcmp(t->state, "attesting") == 0;
}

/* An attestation's end: passed (verified, or simulated where allowed) or
 * the provider is dropped; t is found again by id (it may be gone). */
static void train_attest_done(gn_node *n, void *ud, int rc, const gn_attest_result *res, const char *err) {
  train_att *a = ud;
  train *t = train_find(n, a->id);
  size_t c = t ? cand_of_provider(t, a->provider) : SIZE_MAX;
  if (t && attesting(t) && c != SIZE_MAX && t->att[c] == ATT_ASKING) {
    char why[200] = "";
    if (rc < 0)
      gn__strf(why, sizeof why, "cannot attest it: %s", err ? err : gn_strerror(rc));
    else if (res->outcome == GN_ATTEST_FAILED || res->outcome == GN_ATTEST_TOO_SLOW)
      gn__strf(why, sizeof why, "failed attestation: %s", res->verdict);
    else if (res->outcome == GN_ATTEST_SIMULATED && !t->allow_sim)
      gn__strf(why, sizeof why, "it proved only a simulated GPU (pass --allow-simulated)");
    if (why[0])
      drop_cand(t, c, why);
    else {
      gn_log(GN_LOG_INFO, "training %s: attestation of offer %s: %s", t->id, t->cand[c].offer_id, res->verdict);
      t->att[c] = ATT_OK;
    }
    attest_step(t);
  }
  free(a);
}

/* Starts queued attestations (TRAIN_ATTEST_AT_ONCE in flight), gives up
 * the late ones, then plans again without the dropped providers or forms
 * the gang once every member passed. */
static void attest_step(train *t) {
  if (!attesting(t))
    return;
  gn_node *n = t->n;
  uint64_t now = gn_mono_ms();
  for (size_t c = 0; c < t->ncand;) {
    if (t->att[c] == ATT_ASKING && gn_ms_since(now, t->att_at[c]) >= TRAIN_ATTEST_MS) {
      char why[96];
      gn__strf(why, sizeof why, "its attestation did not finish within %u s", TRAIN_ATTEST_MS / 1000);
      drop_cand(t, c, why);
    } else
      c++;
  }
  uint32_t running = 0;
  for (size_t c = 0; c < t->ncand; c++)
    running += t->att[c] == ATT_ASKING;
  for (size_t c = 0; c < t->ncand && running < TRAIN_ATTEST_AT_ONCE;) {
    if (t->att[c] != ATT_QUEUED) {
      c++;
      continue;
    }
    const gn_offer_entry *e = gn_offer_table_find(n->offers, t->cand[c].offer_id);
    train_att *a = e ? calloc(1, sizeof *a) : NULL;
    int r = !e ? GN_ENOTFOUND : !a ? GN_ENOMEM : 0;
    if (a) {
      gn__strf(a->id, sizeof a->id, "%s", t->id);
      memcpy(a->provider, t->cand[c].provider, GN_PK_LEN);
      r = gn__attest_begin(n, e, train_attest_done, a);
    }
    if (r < 0) {
      free(a);
      char why[200];
      if (!e)
        gn__strf(why, sizeof why, "its offer left the offer table");
      else if (r == GN_EPERM)
        gn__strf(why, sizeof why, "the node at %s is another one than the provider its offer names", e->offer.addr);
      else if (r == GN_ENOTFOUND)
        gn__strf(why, sizeof why, "no attestation class for its GPU model (%s)", e->offer.gpu_model);
      else
        gn__strf(why, sizeof why, "cannot attest it: %s", gn_strerror(r));
      drop_cand(t, c, why);
      continue;
    }
    t->att[c] = ATT_ASKING;
    t->att_at[c] = now;
    running++;
    c++;
  }
  /* The plan's members: one was dropped, or all passed: plan again (the
   * same plan when all passed; indexes move as candidates are dropped). */
  bool pending = false, lost = false;
  for (uint32_t i = 0; i < t->att_nmembers; i++) {
    size_t c = cand_of_provider(t, t->att_members[i]);
    if (c == SIZE_MAX)
      lost = true;
    else if (t->att[c] != ATT_OK)
      pending = true;
  }
  if (lost || !pending) {
    t->att_wait = false;
    plan_next(t);
  }
}

/* The candidates' round trips to each other are in (or timed out): the
 * planner uses them; a pair nobody measured is estimated from each end's
 * round trip to us. */
static void on_peer_rtts(gn_node *n, void *ud, const uint32_t *rtt_us) {
  train *t = ud;
  t->rtt_handle = 0;
  if (n->stopping) {
    plan_fail(t, 503, "gpunetd is shutting down");
    return;
  }
  uint32_t *ms = malloc(t->ncand * t->ncand * sizeof *ms);
  if (ms) {
    gn__rtt_to_plan_ms(t->ncand, rtt_us, ms);
    size_t measured = 0;
    for (size_t i = 0; i < t->ncand * t->ncand; i++)
      measured += ms[i] != GN_RTT_UNKNOWN && i % (t->ncand + 1) != 0;
    gn_log(GN_LOG_INFO, "training %s: %zu of %zu candidate pairs measured between the providers", t->id, measured / 2,
           t->ncand * (t->ncand - 1) / 2);
    free(t->rtt);
    t->rtt = ms;
  }
  plan_next(t);
}

static void plan_done(uv_work_t *w, int status) {
  train *t = w->data;
  if (status < 0 || t->rc < 0) {
    plan_fail(t, 502, "cannot resolve image %s: %s", t->ref.repository, t->err[0] ? t->err : gn_strerror(t->rc));
    return;
  }
  gn_imageref_format(&t->ref, t->image, sizeof t->image);
  if (t->ncand >= 2) { /* the candidates measure their round trips to each other first */
    uint8_t ids[GN_PLAN_MAX_CANDIDATES][GN_PK_LEN];
    for (size_t i = 0; i < t->ncand; i++)
      memcpy(ids[i], t->cand[i].provider, GN_PK_LEN);
    int h = gn__rtt_matrix_begin(t->n, (const uint8_t(*)[GN_PK_LEN])ids, t->ncand, TRAIN_PEER_RTT_MS, on_peer_rtts, t);
    if (h > 0) {
      t->rtt_handle = h;
      return; /* planning goes on in on_peer_rtts */
    }
    gn_log(GN_LOG_WARN, "training %s: cannot ask the candidates for their round trips: %s; pairs are estimated", t->id,
           gn_strerror(h));
  }
  plan_next(t);
}

/* --- routes ----------------------------------------------------------------------------*/

static bool str_array_ok(const json_t *a, size_t max, bool env) {
  if (!json_is_array(a) || json_array_size(a) > max)
    return false;
  for (size_t i = 0; i < json_array_size(a); i++) {
    const char *s = json_string_value(json_array_get(a, i));
    if (!s || strlen(s) > GN_JOB_MAX_ARG_LEN || (env && !gn_env_entry_valid(s)))
      return false;
  }
  return true;
}

static bool uint_field(const json_t *b, const char *key, json_int_t lo, json_int_t hi, json_int_t *ret) {
  const json_t *v = json_object_get(b, key);
  if (!v || json_is_null(v))
    return true;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return false;
  *ret = json_integer_value(v);
  return true;
}

static void api_train(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  train_glue *gl = glue_of(n);
  const json_t *b = gn_ctl_req_body(req);
  json_int_t gpus = 0, per_node = 0, max_price = 0, restarts = 0, max_spend = 0;
  if (!json_is_object(b))
    return gn_ctl_reply_error(req, 400, "the body must be a JSON object");
  if (!json_is_integer(json_object_get(b, "gpus")) || !uint_field(b, "gpus", 1, TRAIN_MAX_RANKS, &gpus))
    return gn_ctl_reply_error(req, 400, "gpus (--gpus) must be a whole number from 1 to %u", TRAIN_MAX_RANKS);
  if (!uint_field(b, "per_node", 0, GN_LEASE_MAX_GPUS, &per_node) || (per_node && gpus % per_node))
    return gn_ctl_reply_error(req, 400, "per_node (--per-node) must divide --gpus and be at most %d",
                              GN_LEASE_MAX_GPUS);
  if (!uint_field(b, "max_price", 1, INT64_MAX / 1024, &max_price))
    return gn_ctl_reply_error(req, 400, "max_price (--max-price) must be a positive amount per GPU-hour");
  if (!uint_field(b, "max_spend", 1, INT64_MAX / 1024, &max_spend))
    return gn_ctl_reply_error(req, 400, "max_spend must be a positive amount");
  json_int_t memory_mib = 0;
  if (!uint_field(b, "memory_mib", 16, 1 << 20, &memory_mib))
    return gn_ctl_reply_error(req, 400, "memory_mib must be a whole number of MiB from 16 to %u", 1u << 20);
  if (!uint_field(b, "restarts", 0, 100, &restarts))
    return gn_ctl_reply_error(req, 400, "restarts (--restarts) must be from 0 to 100");
  const json_t *jh = json_object_get(b, "hours");
  double hours = jh ? json_number_value(jh) : 1.0;
  if ((jh && !json_is_number(jh)) || !(hours > 0) || hours > 24 * 365)
    return gn_ctl_reply_error(req, 400, "hours (--hours) must be a positive number of hours");
  const char *image = json_string_value(json_object_get(b, "image"));
  if (!image)
    return gn_ctl_reply_error(req, 400, "a training job needs an --image");
  const json_t *argv = json_object_get(b, "argv"), *env = json_object_get(b, "env");
  if (!str_array_ok(argv, GN_JOB_MAX_ARGS, false) || json_array_size(argv) == 0)
    return gn_ctl_reply_error(req, 400, "give the command after --, at most %d arguments of at most %d bytes",
                              GN_JOB_MAX_ARGS, GN_JOB_MAX_ARG_LEN);
  if (env && !json_is_null(env) && !str_array_ok(env, GN_JOB_MAX_ARGS, true))
    return gn_ctl_reply_error(req, 400, "env (--env) must be at most %d entries NAME=VALUE", GN_JOB_MAX_ARGS);
  const json_t *jo = json_object_get(b, "output"), *js = json_object_get(b, "allow_simulated"),
               *ja = json_object_get(b, "attest");
  if ((jo && !json_is_boolean(jo) && !json_is_null(jo)) || (js && !json_is_boolean(js) && !json_is_null(js)) ||
      (ja && !json_is_boolean(ja) && !json_is_null(ja)))
    return gn_ctl_reply_error(req, 400, "output, allow_simulated and attest are true or false");
  if (!gl)
    return gn_ctl_reply_error(req, 503, "training is not available on this node");
  if (gl->count >= TRAIN_MAX) { /* forget the oldest finished one (its row stays in the database) */
    train *old = NULL;
    for (train *o = gl->list; o; o = o->next)
      if (state_final(o) && !o->req)
        old = o; /* the list is newest first */
    if (!old)
      return gn_ctl_reply_error(req, 409, "this node runs at most %u training jobs at once", TRAIN_MAX);
    train_unlink(old);
    train_free(old);
  }
  train *t = calloc(1, sizeof *t);
  if (!t)
    return gn_ctl_reply_error(req, 500, "out of memory");
  if (gn_imageref_parse(image, &t->ref) < 0) {
    free(t);
    return gn_ctl_reply_error(req, 400, "bad image reference %s (expected host[:port]/name[:tag][@sha256:...])", image);
  }
  t->n = n;
  t->gpus = (uint32_t)gpus;
  t->per_node = (uint32_t)per_node;
  t->restarts = (uint32_t)restarts;
  t->max_price = (uint64_t)max_price;
  t->max_spend = (uint64_t)max_spend;
  t->memory_mib = (uint64_t)memory_mib;
  t->max_s = (uint64_t)llround(hours * 3600.0);
  if (t->max_s < 1)
    t->max_s = 1;
  t->output = json_is_true(jo);
  t->attest = !json_is_false(ja); /* attest the chosen providers first (--no-attest: "attest": false) */
  t->allow_sim = json_is_true(js) || n->cfg.allow_simulated;
  t->argv = json_deep_copy(argv);
  t->env = env && !json_is_null(env) ? json_deep_copy(env) : json_array();
  t->created_s = gn_unix_s();
  t->timer_at_ms = UINT64_MAX;
  set_state(t, "planning");
  uint8_t rnd[6];
  char hex[13];
  randombytes_buf(rnd, sizeof rnd);
  gn__hex(rnd, sizeof rnd, hex);
  gn__strf(t->id, sizeof t->id, "j-%s", hex);
  /* Candidates: offers that fit, like rent's: not ours, within the price,
   * simulated only when allowed, taking training jobs, long enough. */
  size_t sim = 0, price = 0, notrain = 0, short_ = 0, small = 0;
  uint32_t need = t->per_node ? t->per_node : 1;
  for (size_t i = 0; i < gn_offer_table_count(n->offers) && t->ncand < GN_PLAN_MAX_CANDIDATES; i++) {
    const gn_offer_entry *e = gn_offer_table_at(n->offers, i);
    if (memcmp(e->offer.provider, n->id->pk, GN_PK_LEN) == 0)
      continue;
    if (e->offer.gpus_free < need) {
      small++;
      continue;
    }
    if (e->offer.simulated && !t->allow_sim) {
      sim++;
      continue;
    }
    if (t->max_price && e->offer.price_uper_hour > t->max_price) {
      price++;
      continue;
    }
    if (!e->offer.training) {
      notrain++;
      continue;
    }
    if ((uint64_t)e->offer.max_hours * 3600u < t->max_s) {
      short_++;
      continue;
    }
    if (t->ncand && strcmp(t->currency, e->offer.currency) != 0)
      continue;       /* one currency per group: the first one's */
    bool dup = false; /* one offer per provider: its cheapest */
    for (size_t k = 0; k < t->ncand; k++)
      if (memcmp(t->cand[k].provider, e->offer.provider, GN_PK_LEN) == 0) {
        dup = true;
        if (e->offer.price_uper_hour < t->cand[k].price_uper_hour) {
          gn__strf(t->cand[k].offer_id, sizeof t->cand[k].offer_id, "%s", e->id);
          t->cand[k].gpus_free = e->offer.gpus_free;
          t->cand[k].price_uper_hour = e->offer.price_uper_hour;
          gn__strf(t->cand_addr[k], sizeof t->cand_addr[k], "%s", e->offer.addr);
        }
      }
    if (dup)
      continue;
    gn_plan_candidate *c = &t->cand[t->ncand];
    memcpy(c->provider, e->offer.provider, GN_PK_LEN);
    gn__strf(c->offer_id, sizeof c->offer_id, "%s", e->id);
    c->gpus_free = e->offer.gpus_free;
    c->price_uper_hour = e->offer.price_uper_hour;
    c->rtt_ms = GN_RTT_UNKNOWN;
    gn__strf(t->cand_addr[t->ncand], sizeof t->cand_addr[0], "%s", e->offer.addr);
    t->cand_ports[t->ncand][0] = e->offer.jobnet_port_lo;
    t->cand_ports[t->ncand][1] = e->offer.jobnet_port_hi;
    gn__strf(t->currency, sizeof t->currency, "%s", e->offer.currency);
    t->ncand++;
  }
  if (!t->ncand) {
    train_free(t);
    return gn_ctl_reply_error(req, 409,
                              "no offer fits a training job (%zu simulated without --allow-simulated, %zu above "
                              "--max-price, %zu not taking training jobs, %zu allowing fewer than the hours asked, %zu "
                              "with fewer than %u GPUs free; list offers with: gpunet offers)",
                              sim, price, notrain, short_, small, need);
  }
  t->req = req;
  t->next = gl->list;
  gl->list = t;
  gl->count++;
  t->work.data = t;
  if (uv_queue_work(n->loop, &t->work, plan_work, plan_done) < 0) {
    t->req = NULL;
    train_unlink(t);
    train_free(t);
    gn_ctl_reply_error(req, 500, "cannot queue the plan");
  }
}

static void api_train_get(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *id = gn_ctl_req_param(req, "id");
  if (!id || !gn_id_valid(id))
    return gn_ctl_reply_error(req, 400, "not a training job id");
  train *t = train_find(n, id);
  if (!t)
    return gn_ctl_reply_error(req, 404, "no training job %s", id);
  json_t *o = json_object();
  json_object_set_new(o, "train", train_json(t));
  gn_ctl_reply_json(req, 200, o);
}

static void api_train_list(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  train_glue *gl = glue_of(n);
  json_t *a = json_array();
  for (train *t = gl ? gl->list : NULL; t; t = t->next)
    json_array_append_new(a, train_json(t));
  json_t *o = json_object();
  json_object_set_new(o, "trains", a);
  gn_ctl_reply_json(req, 200, o);
}

static void api_train_delete(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *id = gn_ctl_req_param(req, "id");
  if (!id || !gn_id_valid(id))
    return gn_ctl_reply_error(req, 400, "not a training job id");
  train *t = train_find(n, id);
  if (!t)
    return gn_ctl_reply_error(req, 404, "no training job %s", id);
  if (!t->g)
    return gn_ctl_reply_error(req, 409, "training job %s is still being planned; try again in a moment", t->id);
  if (!state_final(t)) {
    if (!t->finished)
      gn__strf(t->reason, sizeof t->reason, "stopped by the user");
    set_state(t, t->finished ? "done" : "ended");
    GANG_CALL(
        t, gn_gang_release(t->g, gn_mono_ms(), t->finished ? "the training job finished" : "stopped by the user", out));
  }
  json_t *o = json_object();
  json_object_set_new(o, "train", train_json(t));
  gn_ctl_reply_json(req, 200, o);
}

/* GET /v1/train/:id/output?rank=R&offset=N: one chunk of rank R's /output
 * (a tar stream made by the provider) from byte N, asked from its provider:
 * {job, offset, data (base64), eof, size, reason}. */
static void api_train_output(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  train_glue *gl = glue_of(n);
  const char *id = gn_ctl_req_param(req, "id"), *qr = gn_ctl_req_query(req, "rank"),
             *qo = gn_ctl_req_query(req, "offset");
  if (!id || !gn_id_valid(id))
    return gn_ctl_reply_error(req, 400, "not a training job id");
  train *t = train_find(n, id);
  if (!t)
    return gn_ctl_reply_error(req, 404, "no training job %s", id);
  char *end;
  unsigned long long rank = qr ? strtoull(qr, &end, 10) : ULLONG_MAX;
  if (!qr || *end || !qr[0] || rank >= t->world)
    return gn_ctl_reply_error(req, 400, "rank must be a rank of training job %s (0..%u)", id,
                              t->world ? t->world - 1 : 0);
  unsigned long long offset = qo ? strtoull(qo, &end, 10) : 0;
  if (qo && (*end || !qo[0] || offset > (1ull << 50)))
    return gn_ctl_reply_error(req, 400, "offset must be a number of bytes");
  gn_job *j = rank_job(t, (uint32_t)rank);
  gn_lease *l = j ? gn__lease_find(n, j->lease_id) : NULL;
  if (!j || !l)
    return gn_ctl_reply_error(req, 404, "rank %llu of %s has no job", rank, id);
  if (l->state != GN_LEASE_ACTIVE)
    return gn_ctl_reply_error(req, 409, "rank %llu's lease %s has ended: its provider keeps no /output after it", rank,
                              l->id);
  size_t waiting = 0;
  for (out_wait *w = gl->waits; w; w = w->next)
    waiting++;
  if (waiting >= 64)
    return gn_ctl_reply_error(req, 503, "too many output requests at once; try again");
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, j->id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, j->lease_id);
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, offset);
  int r = gn__node_send(n, l->peer, GN_MSG_JOB_OUTPUT_GET, &w);
  gn_wire_writer_done(&w);
  if (r < 0)
    return gn_ctl_reply_error(req, 502, "cannot reach the provider of rank %llu: %s", rank, gn_strerror(r));
  out_wait *ow = calloc(1, sizeof *ow);
  if (!ow)
    return gn_ctl_reply_error(req, 500, "out of memory");
  ow->req = req;
  gn__strf(ow->job_id, sizeof ow->job_id, "%s", j->id);
  memcpy(ow->peer, l->peer, GN_PK_LEN);
  ow->offset = offset;
  ow->deadline_ms = gn_mono_ms() + TRAIN_OUTPUT_WAIT_MS;
  ow->next = gl->waits;
  gl->waits = ow;
}

void gn__trainreq_on_output(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  train_glue *gl = glue_of(n);
  gn_jobmsg m;
  if (!gl || gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  if (seed_on_output(n, peer, &m)) {
    gn__jobmsg_done(&m);
    return;
  }
  for (out_wait **pp = &gl->waits; *pp; pp = &(*pp)->next) {
    out_wait *w = *pp;
    if (strcmp(w->job_id, m.job_id) != 0 || memcmp(w->peer, peer, GN_PK_LEN) != 0 || w->offset != m.offset)
      continue;
    *pp = w->next;
    { /* (a req lives until answered, even after its client left) */
      size_t cap = sodium_base64_ENCODED_LEN(m.data_len, sodium_base64_VARIANT_ORIGINAL);
      char *b64 = malloc(cap);
      if (b64)
        sodium_bin2base64(b64, cap, m.data ? m.data : (const uint8_t *)"", m.data_len, sodium_base64_VARIANT_ORIGINAL);
      if (!b64)
        gn_ctl_reply_error(w->req, 500, "out of memory");
      else if (m.reason[0] && !m.data_len)
        gn_ctl_reply_error(w->req, 409, "the provider refused the output of job %s: %s", m.job_id, m.reason);
      else
        gn_ctl_reply_json(w->req, 200,
                          json_pack("{s:s, s:I, s:s, s:I, s:b, s:I}", "job", m.job_id, "offset", (json_int_t)m.offset,
                                    "data", b64, "length", (json_int_t)m.data_len, "eof", m.eof, "size",
                                    (json_int_t)m.size));
      free(b64);
    }
    free(w);
    break;
  }
  gn__jobmsg_done(&m);
}

static void waits_expire(train_glue *gl, uint64_t now_ms) {
  for (out_wait **pp = &gl->waits; *pp;) {
    out_wait *w = *pp;
    if (now_ms < w->deadline_ms) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    gn_ctl_reply_error(w->req, 504, "the provider did not send job %s's output in time", w->job_id);
    free(w);
  }
}

/* --- restore ----------------------------------------------------------------------------*/

static void restore_all(gn_node *n) {
  train_glue *gl = glue_of(n);
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(n->db, "SELECT id, doc, gang FROM train_groups ORDER BY updated_s DESC LIMIT 64", -1, &st,
                         NULL) != SQLITE_OK)
    return;
  while (sqlite3_step(st) == SQLITE_ROW) {
    const char *doc = (const char *)sqlite3_column_text(st, 1);
    json_t *d = doc ? json_loads(doc, 0, NULL) : NULL;
    const char *id = jstr(d, "id");
    train *t = d && id && gn_id_valid(id) && !train_find(n, id) ? calloc(1, sizeof *t) : NULL;
    if (!t) {
      json_decref(d);
      continue;
    }
    t->n = n;
    gn__strf(t->id, sizeof t->id, "%s", id);
    gn__strf(t->state, sizeof t->state, "%s", jstr(d, "state") ? jstr(d, "state") : "failed");
    gn__strf(t->reason, sizeof t->reason, "%s", jstr(d, "reason") ? jstr(d, "reason") : "");
    gn__strf(t->image, sizeof t->image, "%s", jstr(d, "image") ? jstr(d, "image") : "");
    gn__strf(t->currency, sizeof t->currency, "%s", jstr(d, "currency") ? jstr(d, "currency") : "");
    t->created_s = json_integer_value(json_object_get(d, "created_s"));
    t->ended_s = json_integer_value(json_object_get(d, "ended_s"));
    t->gpus = (uint32_t)json_integer_value(json_object_get(d, "gpus"));
    t->per_member = (uint32_t)json_integer_value(json_object_get(d, "per_node"));
    t->restarts = (uint32_t)json_integer_value(json_object_get(d, "restarts"));
    t->argv = json_incref(json_object_get(d, "argv"));
    t->env = json_incref(json_object_get(d, "env"));
    if (!t->argv)
      t->argv = json_array();
    if (!t->env)
      t->env = json_array();
    json_t *plan = json_object_get(d, "plan");
    t->plan = json_is_object(plan) ? json_incref(plan) : NULL;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(d, "ranks"), i, v) {
      if (i >= TRAIN_MAX_RANKS)
        break;
      const char *job = jstr(v, "job");
      gn__strf(t->ranks[i].job_id, sizeof t->ranks[i].job_id, "%s", job ? job : "");
      t->ranks[i].member = (uint32_t)json_integer_value(json_object_get(v, "member"));
      json_t *sr = json_object_get(v, "seed");
      t->ranks[i].has_seed =
          json_is_integer(sr) && json_integer_value(sr) >= 0 && json_integer_value(sr) < TRAIN_MAX_RANKS;
      t->ranks[i].seed_rank = t->ranks[i].has_seed ? (uint32_t)json_integer_value(sr) : 0;
      t->world = (uint32_t)i + 1;
    }
    json_array_foreach(json_object_get(d, "issued"), i, v) {
      const char *lid = jstr(v, "lease"), *pid = jstr(v, "provider");
      if (i >= GN_ARRAY_SIZE(t->issued) || !lid || !pid)
        break;
      gn__strf(t->issued[i].lease_id, sizeof t->issued[i].lease_id, "%s", lid);
      gn_node_id_parse(pid, t->issued[i].provider);
      t->nissued = i + 1;
    }
    json_array_foreach(json_object_get(d, "seeds"), i, v) {
      json_int_t sr = json_integer_value(json_object_get(v, "rank"));
      json_int_t size = json_integer_value(json_object_get(v, "size"));
      const char *hex = jstr(v, "sha256");
      size_t bl = 0;
      if (sr < 0 || sr >= TRAIN_MAX_RANKS || size <= 0 || (uint64_t)size > GN_JOB_SEED_MAX || !hex ||
          strlen(hex) != 64 ||
          sodium_hex2bin(t->seeds[sr].sha256, sizeof t->seeds[sr].sha256, hex, 64, NULL, &bl, NULL) != 0 || bl != 32)
        continue;
      t->seeds[sr].size = (uint64_t)size;
      t->seeds[sr].have = true;
    }
    gn__strf(t->seed_note, sizeof t->seed_note, "%s", jstr(d, "restart_note") ? jstr(d, "restart_note") : "");
    json_decref(d);
    t->timer_at_ms = UINT64_MAX;
    /* A group that was running is watched again (its ranks' jobs came back
     * with the node's records); a restart of its ranks fails without the
     * plan's candidates, which are not kept. */
    t->job_failed_reported = strcmp(t->state, "running") != 0 || !t->world;
    bool was_restarting = strcmp(t->state, "restarting") == 0;
    if (strcmp(t->state, "collecting") == 0) { /* the outputs get a fresh while */
      t->finished = true;
      t->collect_until = gn_mono_ms() + TRAIN_COLLECT_MS;
    }
    t->next = gl->list;
    gl->list = t;
    gl->count++;
    const void *blob = sqlite3_column_blob(st, 2);
    int len = sqlite3_column_bytes(st, 2);
    if (blob && len > 0) {
      gn_gang_out *out = calloc(1, sizeof *out);
      if (out && gn_gang_restore(blob, (size_t)len, gn_mono_ms(), &t->g, out) == 0) {
        gn_log(GN_LOG_INFO, "training %s restored (%s)", t->id, t->state);
        perform(t, out);
        gn_gang_info gi;
        gn_gang_info_get(t->g, &gi);
        if (was_restarting && gi.phase == GN_GANG_READY && !state_final(t)) {
          /* Stopped while its seeds were fetched: the fetch does not
           * resume, and its old ranks are stopped; end it, leases released. */
          gn__strf(t->reason, sizeof t->reason, "the requester restarted while the group was restarting");
          set_state(t, "failed");
          GANG_CALL(t, gn_gang_release(t->g, gn_mono_ms(), t->reason, out));
        }
      } else if (!state_final(t)) {
        set_state(t, "failed");
        gn__strf(t->reason, sizeof t->reason, "its saved state could not be restored");
      }
      free(out);
    } else if (!state_final(t)) {
      set_state(t, "failed");
      gn__strf(t->reason, sizeof t->reason, "the requester restarted while it was being planned");
    }
  }
  sqlite3_finalize(st);
  seed_sweep(n);
}

void gn__trainreq_register(gn_node *n, const gn_train_ops *ops) {
  train_glue *gl = glue_of(n);
  for (size_t i = 0; !gl && i < GN_ARRAY_SIZE(glues); i++)
    if (!glues[i].n) {
      gl = &glues[i];
      gl->n = n;
    }
  if (!gl)
    return;
  gl->ops = *ops;
  db_init(n);
  gn_ctl_route(n->ctl, "POST", "/v1/train", api_train, n);
  gn_ctl_route(n->ctl, "GET", "/v1/train", api_train_list, n);
  gn_ctl_route(n->ctl, "GET", "/v1/train/:id", api_train_get, n);
  gn_ctl_route(n->ctl, "DELETE", "/v1/train/:id", api_train_delete, n);
  gn_ctl_route(n->ctl, "GET", "/v1/train/:id/output", api_train_output, n);
}
