/* The node's records: leases, jobs and API requests waiting for a peer
 * (records.h), their SQLite tables and JSON views, and sending a message to
 * a peer. */
#include "records.h"

#include "node_internal.h"
#include "util.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- SQLite state ---------------------------------------------------------*/

static const char *const schema_sql =
    "CREATE TABLE IF NOT EXISTS node_leases(id TEXT PRIMARY KEY, role INTEGER NOT NULL, peer BLOB NOT NULL,"
    " agreement BLOB NOT NULL, state INTEGER NOT NULL, seconds INTEGER NOT NULL, end_s INTEGER,"
    " end_reason TEXT, invoice_done INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS node_jobs(id TEXT PRIMARY KEY, lease_id TEXT NOT NULL, role INTEGER NOT NULL,"
    " image TEXT NOT NULL, digest TEXT, cmd TEXT, env TEXT, state INTEGER NOT NULL, exit_code INTEGER,"
    " error TEXT, created_s INTEGER, ended_s INTEGER, log_len INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS job_nonces(nonce BLOB PRIMARY KEY, expires_s INTEGER NOT NULL);"
    /* Each lease's state machine (include/gpunet/lease.h), the newest
     * PERSIST: what a restart resumes from. */
    "CREATE TABLE IF NOT EXISTS lease_machines(id TEXT PRIMARY KEY, state BLOB NOT NULL);";

/* Columns node_leases gained after its first release, added to an older
 * database at start (an existing column is left as it is). received_s is
 * the requester's own UTC of the agreement's arrival (0 on rows older than
 * it; the requester's machine keeps its own copy, this one is for display);
 * invoice_id and invoice_status say where the final invoice stands, for
 * `gpunet invoices`. */
static const char *const lease_columns[] = {
    "received_s INTEGER NOT NULL DEFAULT 0",
    "max_spend_micro INTEGER NOT NULL DEFAULT 0",
    "max_price INTEGER NOT NULL DEFAULT 0",
    "invoice_id TEXT",
    "invoice_status TEXT",
    "invoice_seconds INTEGER NOT NULL DEFAULT 0",
    "invoice_micro INTEGER NOT NULL DEFAULT 0",
    /* A provider's energy so far (gn_energy), and the final invoice's
     * claim (NULL: it states none). */
    "energy_uj INTEGER NOT NULL DEFAULT 0",
    "energy_measured_ms INTEGER NOT NULL DEFAULT 0",
    "energy_unmeasured_ms INTEGER NOT NULL DEFAULT 0",
    "invoice_energy_mj INTEGER",
    "invoice_energy_s INTEGER",
};

static int db_migrate(gn_node *n) {
  for (size_t i = 0; i < GN_ARRAY_SIZE(lease_columns); i++) {
    char sql[200], *err = NULL;
    gn__strf(sql, sizeof sql, "ALTER TABLE node_leases ADD COLUMN %s", lease_columns[i]);
    if (sqlite3_exec(n->db, sql, NULL, NULL, &err) != SQLITE_OK && !(err && strstr(err, "duplicate column"))) {
      gn_log(GN_LOG_ERROR, "cannot add a column to node_leases: %s", err ? err : "?");
      sqlite3_free(err);
      return GN_EDB;
    }
    sqlite3_free(err);
  }
  return 0;
}

int gn__records_open_db(gn_node *n) {
  char path[PATH_MAX];
  gn__pathf(path, sizeof path, "%s/gpunet.db", n->cfg.data_dir);
  if (sqlite3_open_v2(path, &n->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
    gn_log(GN_LOG_ERROR, "cannot open database %s: %s", path, sqlite3_errmsg(n->db));
    return GN_EDB;
  }
  chmod(path, 0600);
  sqlite3_busy_timeout(n->db, 5000);
  /* WAL with synchronous=FULL: every committed tick survives a crash of the
   * process or of the machine (the ledger's durability promise rests on it). */
  char *err = NULL;
  if (sqlite3_exec(n->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;", NULL, NULL,
                   &err) != SQLITE_OK ||
      sqlite3_exec(n->db, schema_sql, NULL, NULL, &err) != SQLITE_OK) {
    gn_log(GN_LOG_ERROR, "cannot prepare database %s: %s", path, err ? err : "?");
    sqlite3_free(err);
    return GN_EDB;
  }
  return db_migrate(n);
}

void gn__node_persist_lease(gn_node *n, const gn_lease *l) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(n->db,
                         "INSERT OR REPLACE INTO node_leases(id, role, peer, agreement, state, seconds, end_s,"
                         " end_reason, invoice_done, received_s, max_spend_micro, max_price, invoice_id,"
                         " invoice_status, invoice_seconds, invoice_micro, energy_uj, energy_measured_ms,"
                         " energy_unmeasured_ms, invoice_energy_mj, invoice_energy_s)"
                         " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_int64(st, 10, l->received_s);
  sqlite3_bind_int64(st, 11, (sqlite3_int64)l->max_spend_micro);
  sqlite3_bind_int64(st, 12, (sqlite3_int64)l->max_price_uper_hour);
  sqlite3_bind_text(st, 13, l->invoice_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 14, l->invoice_status, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 15, (sqlite3_int64)l->invoice_seconds);
  sqlite3_bind_int64(st, 16, (sqlite3_int64)l->invoice_micro);
  /* SQLite integers are signed: the totals saturate at INT64_MAX (the
   * invoice's claim is bounded to it by its decoder). */
  sqlite3_bind_int64(st, 17, (sqlite3_int64)(l->energy.uj > INT64_MAX ? INT64_MAX : l->energy.uj));
  sqlite3_bind_int64(st, 18, (sqlite3_int64)(l->energy.measured_ms > INT64_MAX ? INT64_MAX : l->energy.measured_ms));
  sqlite3_bind_int64(st, 19,
                     (sqlite3_int64)(l->energy.unmeasured_ms > INT64_MAX ? INT64_MAX : l->energy.unmeasured_ms));
  if (l->invoice_energy.present) {
    sqlite3_bind_int64(st, 20, (sqlite3_int64)l->invoice_energy.mj);
    sqlite3_bind_int64(st, 21, (sqlite3_int64)l->invoice_energy.measured_s);
  }
  sqlite3_bind_text(st, 1, l->id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 2, l->role);
  sqlite3_bind_blob(st, 3, l->peer, GN_PK_LEN, SQLITE_STATIC);
  sqlite3_bind_blob(st, 4, l->agreement_env.data, (int)l->agreement_env.len, SQLITE_STATIC);
  sqlite3_bind_int(st, 5, l->state);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)l->seconds);
  sqlite3_bind_int64(st, 7, l->end_s);
  sqlite3_bind_text(st, 8, l->end_reason, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 9, l->invoice_done);
  if (sqlite3_step(st) != SQLITE_DONE)
    gn_log(GN_LOG_ERROR, "cannot save lease %s: %s", l->id, sqlite3_errmsg(n->db));
out:
  sqlite3_finalize(st);
}

static void persist_unsynced(gn_node *n, bool on);

void gn__node_persist_energy(gn_node *n, const gn_lease *l) {
  sqlite3_stmt *st = NULL;
  persist_unsynced(n, true);
  if (sqlite3_prepare_v2(n->db,
                         "UPDATE node_leases SET energy_uj = ?, energy_measured_ms = ?, energy_unmeasured_ms = ?"
                         " WHERE id = ?",
                         -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)(l->energy.uj > INT64_MAX ? INT64_MAX : l->energy.uj));
  sqlite3_bind_int64(st, 2, (sqlite3_int64)(l->energy.measured_ms > INT64_MAX ? INT64_MAX : l->energy.measured_ms));
  sqlite3_bind_int64(st, 3, (sqlite3_int64)(l->energy.unmeasured_ms > INT64_MAX ? INT64_MAX : l->energy.unmeasured_ms));
  sqlite3_bind_text(st, 4, l->id, -1, SQLITE_STATIC);
  if (sqlite3_step(st) != SQLITE_DONE)
    gn_log(GN_LOG_ERROR, "cannot save the energy of lease %s: %s", l->id, sqlite3_errmsg(n->db));
out:
  sqlite3_finalize(st);
  persist_unsynced(n, false);
}

void gn__lease_energy_json(const gn_lease *l, json_t *o) {
  gn_bill_energy c = l->invoice_id[0] ? l->invoice_energy : gn_energy_claim(&l->energy);
  int64_t end = l->end_s ? l->end_s : gn_unix_s();
  uint64_t window = end > l->ag.start_s ? (uint64_t)(end - l->ag.start_s) : 0;
  json_object_set_new(o, "energy_mj", c.present ? json_integer((json_int_t)c.mj) : json_null());
  json_object_set_new(o, "energy_measured_s", c.present ? json_integer((json_int_t)c.measured_s) : json_null());
  json_object_set_new(o, "energy_plausible",
                      c.present ? json_boolean(gn_energy_plausible(l->ag.terms.count, window, &c)) : json_null());
}

int gn__node_persist_machine(gn_node *n, const char *lease_id, const uint8_t *state, size_t len) {
  sqlite3_stmt *st = NULL;
  int r = GN_EDB;
  if (len > INT_MAX || sqlite3_prepare_v2(n->db, "INSERT OR REPLACE INTO lease_machines(id, state) VALUES(?, ?)", -1,
                                          &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, state, (int)len, SQLITE_STATIC);
  if (sqlite3_step(st) == SQLITE_DONE)
    r = 0;
out:
  sqlite3_finalize(st);
  return r;
}

int gn__records_load_machine(gn_node *n, const char *lease_id, gn_buf *ret) {
  sqlite3_stmt *st = NULL;
  int r = GN_EDB;
  if (sqlite3_prepare_v2(n->db, "SELECT state FROM lease_machines WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  int s = sqlite3_step(st);
  if (s == SQLITE_ROW)
    r = gn_buf_append(ret, sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0));
  else
    r = s == SQLITE_DONE ? GN_ENOTFOUND : GN_EDB;
out:
  sqlite3_finalize(st);
  return r;
}

/* A job's row is committed without its own fsync (synchronous=NORMAL for
 * that one statement, FULL again at once): each job changes state 3 or 4
 * times on each side, and an fsync of the WAL (0.3-5 ms here) on the loop
 * delayed every job's start and its exit code. In WAL mode such a commit is
 * still atomic and ordered, survives a crash of gpunetd, and becomes durable
 * with the next FULL commit (the ledger's tick each second, a nonce, a
 * lease) or checkpoint; only a power loss in between can lose a job's latest
 * state, which a restart already treats as unknown (see load_state). The
 * ledger, leases and the replay nonces keep an fsync per commit. */
static void persist_unsynced(gn_node *n, bool on) {
  sqlite3_exec(n->db, on ? "PRAGMA synchronous=NORMAL" : "PRAGMA synchronous=FULL", NULL, NULL, NULL);
}

void gn__node_persist_job(gn_node *n, const gn_job *j) {
  sqlite3_stmt *st = NULL;
  persist_unsynced(n, true);
  char *cmd = j->cmd ? json_dumps(j->cmd, JSON_COMPACT) : NULL;
  char *env = j->env ? json_dumps(j->env, JSON_COMPACT) : NULL;
  if (sqlite3_prepare_v2(n->db,
                         "INSERT OR REPLACE INTO node_jobs(id, lease_id, role, image, digest, cmd, env, state,"
                         " exit_code, error, created_s, ended_s, log_len) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_text(st, 1, j->id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, j->lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 3, j->role);
  sqlite3_bind_text(st, 4, j->image, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 5, j->digest, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 6, cmd, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 7, env, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 8, j->state);
  sqlite3_bind_int(st, 9, j->exit_code);
  sqlite3_bind_text(st, 10, j->error, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 11, j->created_s);
  sqlite3_bind_int64(st, 12, j->ended_s);
  sqlite3_bind_int64(st, 13, (sqlite3_int64)j->log_len);
  if (sqlite3_step(st) != SQLITE_DONE)
    gn_log(GN_LOG_ERROR, "cannot save job %s: %s", j->id, sqlite3_errmsg(n->db));
out:
  sqlite3_finalize(st);
  persist_unsynced(n, false);
  free(cmd);
  free(env);
  /* Every state change is persisted: answer the long polls that wait on it. */
  if (n->job_changed)
    n->job_changed(n, j);
}

/* --- lookups and JSON views ----------------------------------------------*/

gn_lease *gn__lease_find(gn_node *n, const char *id) {
  for (gn_lease *l = n->leases; l; l = l->next)
    if (strcmp(l->id, id) == 0)
      return l;
  return NULL;
}

gn_job *gn__job_find(gn_node *n, const char *id) {
  for (gn_job *j = n->jobs; j; j = j->next)
    if (strcmp(j->id, id) == 0)
      return j;
  return NULL;
}

const char *gn__job_state_name(gn_job_state s) {
  static const char *const names[] = {"pending", "pulling", "running", "exited", "failed", "stopped", "rejected"};
  return (unsigned)s < GN_ARRAY_SIZE(names) ? names[s] : "unknown";
}

json_t *gn__lease_json(gn_node *n, const gn_lease *l) {
  (void)n;
  char peer[GN_NODE_ID_STRLEN], price[32];
  gn_node_id_format(l->peer, peer);
  gn_price_format(l->ag.terms.price_uper_hour, price, sizeof price);
  json_t *gpus = json_array();
  for (uint32_t i = 0; i < l->ag.gpu_count; i++)
    json_array_append_new(gpus, json_string(l->ag.gpus[i]));
  /* Seconds: metered (provider) or observed on our own clock (requester),
   * as the lease's machine counts them. */
  uint64_t seconds = l->seconds;
  gn_lease_info info;
  memset(&info, 0, sizeof info);
  if (l->prov)
    gn_lease_prov_info(l->prov, &info);
  else if (l->req)
    gn_lease_req_info(l->req, (gn_lease_now){gn_mono_ms(), gn_unix_s()}, &info);
  if (l->prov || l->req)
    seconds = info.seconds;
  else if (l->role == GN_ROLE_REQUESTER && l->state == GN_LEASE_ACTIVE)
    seconds = (gn_mono_ms() - l->start_mono_ms) / 1000;
  if (seconds > l->ag.terms.max_s)
    seconds = l->ag.terms.max_s;
  uint64_t cost = gn_price_cost(l->ag.terms.price_uper_hour, l->ag.terms.count, seconds);
  /* Once invoiced: what the final invoice bills, except on the requester's
   * side of a rejected invoice: there the provider's claim is not what we
   * owe, our own observation stays the figure and the claim is shown apart
   * (claimed_s, claimed_micro). */
  bool countersigned = l->invoice_id[0] && strcmp(l->invoice_status, "accepted") == 0;
  bool disputed = l->invoice_id[0] && strcmp(l->invoice_status, "rejected") == 0;
  if (l->invoice_id[0] && !(disputed && l->role == GN_ROLE_REQUESTER)) {
    seconds = l->invoice_seconds;
    cost = l->invoice_micro;
  }
  /* What the requester's vouchers cover: the last accepted note, or once it
   * is countersigned the final invoice (which continues that note). */
  uint64_t accepted_s = countersigned ? l->invoice_seconds : info.accepted_s;
  uint64_t accepted_micro = countersigned ? l->invoice_micro : info.accepted_micro;
  json_t *o = json_pack(
      "{s:s, s:s, s:s, s:s, s:i, s:o, s:I, s:s, s:s, s:I, s:I, s:I, s:s, s:s?, s:I, s:I, s:b}", "id", l->id, "role",
      l->role == GN_ROLE_PROVIDER ? "provider" : "requester", "peer", peer, "gpu_model", l->ag.terms.gpu_model, "count",
      (int)l->ag.terms.count, "gpus", gpus, "price_uper_hour", (json_int_t)l->ag.terms.price_uper_hour, "price", price,
      "currency", l->ag.terms.currency, "start_s", (json_int_t)l->ag.start_s, "max_s", (json_int_t)l->ag.terms.max_s,
      "ends_s", (json_int_t)(l->ag.start_s + (int64_t)l->ag.terms.max_s), "state",
      l->state == GN_LEASE_ACTIVE ? "active" : "ended", "ended_reason",
      l->state == GN_LEASE_ACTIVE ? NULL : l->end_reason, "seconds", (json_int_t)seconds, "cost_micro",
      (json_int_t)cost, "simulated", l->ag.terms.simulated);
  if (o) {
    json_object_set_new(o, "interval_s", json_integer(l->ag.terms.interval_s));
    json_object_set_new(o, "accepted_s", json_integer((json_int_t)accepted_s));
    json_object_set_new(o, "accepted_micro", json_integer((json_int_t)accepted_micro));
    json_object_set_new(o, "notes_accepted", json_integer((json_int_t)info.accepted_seq));
    if (l->invoice_id[0]) {
      json_object_set_new(o, "invoice", json_string(l->invoice_id));
      json_object_set_new(o, "invoice_status", json_string(l->invoice_status));
    }
    json_object_set_new(o, "disputed", json_boolean(disputed));
    /* Provider: the final invoice went unanswered for a day after the end
     * (GN_LEASE_INVOICE_GIVEUP_S) and is not sent again (a provider-only
     * claim). */
    if (l->role == GN_ROLE_PROVIDER)
      json_object_set_new(o, "invoice_unanswered", json_boolean(info.invoice_unanswered));
    if (disputed) { /* the provider's rejected claim */
      json_object_set_new(o, "claimed_s", json_integer((json_int_t)l->invoice_seconds));
      json_object_set_new(o, "claimed_micro", json_integer((json_int_t)l->invoice_micro));
    }
    gn__lease_energy_json(l, o);
    if (l->role == GN_ROLE_REQUESTER) {
      json_object_set_new(o, "max_spend_micro", json_integer((json_int_t)l->max_spend_micro));
      json_object_set_new(o, "max_price_uper_hour", json_integer((json_int_t)l->max_price_uper_hour));
      json_object_set_new(o, "received_s", json_integer(l->received_s));
    }
  }
  return o;
}

json_t *gn__job_json(const gn_job *j) {
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:s?, s:I}", "id", j->id, "lease", j->lease_id, "image",
                        j->image, "digest", j->digest, "cmd", j->cmd ? json_incref(j->cmd) : json_array(), "state",
                        gn__job_state_name(j->state), "error", j->error[0] ? j->error : NULL, "created_s",
                        (json_int_t)j->created_s);
  json_object_set_new(o, "exit_code",
                      j->exit_code >= 0 && (j->state == GN_JOB_EXITED || j->state == GN_JOB_STOPPED)
                          ? json_integer(j->exit_code)
                          : json_null());
  json_object_set_new(o, "ended_s", j->ended_s ? json_integer(j->ended_s) : json_null());
  json_object_set_new(o, "role", json_string(j->role == GN_ROLE_PROVIDER ? "provider" : "requester"));
  gn__job_pull_json(j, o);
  return o;
}

int gn__job_container_pid(const gn_node *n, const gn_job *j, pid_t *ret) {
  static const char *const files[][2] = {{"state.json", "init_process_pid"}, {"status", "pid"}};
  if (!j->container_id[0] || !gn_id_valid(j->container_id))
    return GN_ENOTFOUND;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[sizeof n->run_dir + 160];
    gn__strf(path, sizeof path, "%s/%s/%s", n->run_dir, j->container_id, files[i][0]);
    json_t *o = json_load_file(path, 0, NULL);
    json_t *v = o ? json_object_get(o, files[i][1]) : NULL;
    json_int_t pid = json_is_integer(v) ? json_integer_value(v) : 0;
    json_decref(o);
    if (pid > 1 && pid < (1 << 22)) {
      *ret = (pid_t)pid;
      return 0;
    }
  }
  return GN_ENOTFOUND;
}

void gn__job_pull_json(const gn_job *j, json_t *o) {
  uint64_t total = j->pull_total, done = j->pull_done;
  if (j->state != GN_JOB_PULLING || !total)
    return;
  json_object_set_new(
      o, "pull",
      json_pack("{s:I, s:I}", "done", (json_int_t)(done < total ? done : total), "total", (json_int_t)total));
}

void gn__job_append_log(gn_job *j, const uint8_t *data, size_t len) {
  int fd = open(j->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, data + off, len - off);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  close(fd);
  j->log_len += off;
  if (off && j->node->job_changed)
    j->node->job_changed(j->node, j);
}

/* --- pending API requests -------------------------------------------------*/

gn_pending *gn__pending_add(gn_node *n, gn_ctl_req *req, int kind, const char *key, uint64_t timeout_ms) {
  gn_pending *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->node = n;
  p->req = req;
  p->kind = kind;
  gn__strf(p->key, sizeof p->key, "%s", key);
  p->deadline_ms = gn_mono_ms() + timeout_ms;
  p->next = n->pending;
  n->pending = p;
  return p;
}

gn_pending *gn__pending_take(gn_node *n, int kind, const char *key) {
  for (gn_pending **pp = &n->pending; *pp; pp = &(*pp)->next) {
    gn_pending *p = *pp;
    if (p->kind == kind && strcmp(p->key, key) == 0) {
      *pp = p->next;
      p->next = NULL;
      return p;
    }
  }
  return NULL;
}

void gn__pending_free(gn_pending *p) {
  if (!p)
    return;
  gn_buf_done(&p->msg);
  free(p->data);
  free(p);
}

/* Ids and env names in request bodies pass the same grammar as route
 * parameters before the handlers look them up or put them in a manifest. */
bool gn__body_id_ok(gn_ctl_req *req, const char *key, const char *what) {
  const json_t *v = json_object_get(gn_ctl_req_body(req), key);
  if (!v || json_is_null(v) || gn_id_valid(json_string_value(v)))
    return true; /* absent or null: the handler picks or refuses */
  gn_ctl_reply_error(req, 400, "%s is not a valid %s id: ids are 1 to %d letters, digits, '-' or '_'", key, what,
                     GN_ID_MAX);
  return false;
}

/* --- messaging --------------------------------------------------------------*/

int gn__node_send(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *body) {
  gn_buf b = {0}, env = {0};
  if (!n->tp) /* closed at the end of a shutdown */
    return GN_ECLOSED;
  int r = gn_wire_writer_take(body, &b);
  if (r == 0)
    r = gn_envelope_seal_for_session(n->id, type, b.data, b.len, &env);
  if (r == 0)
    r = gn_transport_send(n->tp, peer, env.data, env.len);
  if (r < 0) {
    char pid[GN_NODE_ID_STRLEN];
    gn_node_id_format(peer, pid);
    gn_log(GN_LOG_WARN, "cannot send %s to %s: %s", gn_msg_type_name(type), pid, gn_strerror(r));
  }
  gn_buf_done(&b);
  gn_buf_done(&env);
  return r;
}
