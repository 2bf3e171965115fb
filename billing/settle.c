/* Settlement: the payment vouchers of each lease (the requester's DEBIT_ACCEPT
 * and INVOICE_ACCEPT envelopes), the durable outbox of final settlements and
 * the balances per counterparty, all in the node's SQLite database. */
#include "settle_int.h"

#include <gpunet/wire.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OUT_PENDING = 1, OUT_SETTLED = 2, OUT_FAILED = 3 };

static const char *const schema_sql =
    /* The highest voucher of each lease, per role (a node renting from
     * itself holds both). agreement is BLAKE2b-256 of the agreement
     * envelope: a lease id never changes agreement. */
    "CREATE TABLE IF NOT EXISTS settle_vouchers(lease_id TEXT NOT NULL, role INTEGER NOT NULL,"
    " peer BLOB NOT NULL, currency TEXT NOT NULL, agreement BLOB NOT NULL, final INTEGER NOT NULL,"
    " seq INTEGER NOT NULL, seconds INTEGER NOT NULL, amount_micro INTEGER NOT NULL, hash BLOB NOT NULL,"
    " voucher_hash BLOB NOT NULL, envelope BLOB NOT NULL, updated_s INTEGER NOT NULL,"
    " PRIMARY KEY(lease_id, role));"
    /* Final settlements waiting for (or done by) a driver. */
    "CREATE TABLE IF NOT EXISTS settle_outbox(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE,"
    " lease_id TEXT NOT NULL, role INTEGER NOT NULL, peer BLOB NOT NULL, currency TEXT NOT NULL,"
    " amount_micro INTEGER NOT NULL, body BLOB NOT NULL, state INTEGER NOT NULL, attempts INTEGER NOT NULL,"
    " next_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, done_ms INTEGER NOT NULL DEFAULT 0,"
    " driver TEXT NOT NULL DEFAULT '', http_status INTEGER NOT NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS settle_outbox_due ON settle_outbox(state, next_ms);"
    "CREATE INDEX IF NOT EXISTS settle_outbox_lease ON settle_outbox(lease_id, role);"
    /* The ledger driver's book: one row per settled final voucher. */
    "CREATE TABLE IF NOT EXISTS settle_book(key TEXT PRIMARY KEY, lease_id TEXT NOT NULL, role INTEGER NOT NULL,"
    " peer BLOB NOT NULL, currency TEXT NOT NULL, amount_micro INTEGER NOT NULL, settled_ms INTEGER NOT NULL);";

struct gn_settle {
  sqlite3 *db;
  uint8_t self[GN_PK_LEN];
  uint32_t backoff_base_ms, backoff_max_ms;
};

sqlite3 *gn__settle_db(gn_settle *s) {
  return s->db;
}

int64_t gn__settle_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void gn__settle_printable(char *dst, size_t cap, const char *src, size_t len) {
  if (!cap)
    return;
  size_t n = 0;
  for (size_t i = 0; i < len && src[i] && n + 1 < cap; i++)
    dst[n++] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
  dst[n] = '\0';
}

const char *gn_settle_role_name(gn_settle_role role) {
  return role == GN_SETTLE_PROVIDER ? "provider" : role == GN_SETTLE_REQUESTER ? "requester" : NULL;
}

const char *gn_settle_state_name(gn_settle_state st) {
  switch (st) {
  case GN_SETTLE_PENDING:
    return "pending";
  case GN_SETTLE_SETTLED:
    return "settled";
  case GN_SETTLE_FAILED:
    return "failed";
  default:
    return "none";
  }
}

int gn_settle_open(sqlite3 *db, const uint8_t self_pk[GN_PK_LEN], gn_settle **ret) {
  if (!db || !self_pk || !ret)
    return GN_EINVAL;
  if (sqlite3_exec(db, schema_sql, NULL, NULL, NULL) != SQLITE_OK)
    return GN_EDB;
  gn_settle *s = calloc(1, sizeof(*s));
  if (!s)
    return GN_ENOMEM;
  s->db = db;
  memcpy(s->self, self_pk, GN_PK_LEN);
  s->backoff_base_ms = GN_SETTLE_BACKOFF_BASE_MS;
  s->backoff_max_ms = GN_SETTLE_BACKOFF_MAX_MS;
  *ret = s;
  return 0;
}

gn_settle *gn_settle_free(gn_settle *s) {
  free(s);
  return NULL;
}

void gn_settle_set_backoff(gn_settle *s, uint32_t base_ms, uint32_t max_ms) {
  s->backoff_base_ms = base_ms ? base_ms : 1;
  s->backoff_max_ms = max_ms < s->backoff_base_ms ? s->backoff_base_ms : max_ms;
}

/* --- small SQLite helpers ---------------------------------------------------*/

/* A savepoint works inside or outside the caller's transaction; released
 * outside one, it commits. *ret_outer says whether we began the transaction,
 * so that a failed commit never leaves one open on the caller's connection
 * (the ledger refuses to append inside a transaction it did not begin). */
static int tx_begin(gn_settle *s, bool *ret_outer) {
  *ret_outer = sqlite3_get_autocommit(s->db) != 0;
  return sqlite3_exec(s->db, "SAVEPOINT gn_settle", NULL, NULL, NULL) == SQLITE_OK ? 0 : GN_EDB;
}

static int tx_end(gn_settle *s, bool outer, int r) {
  if (r >= 0 && sqlite3_exec(s->db, "RELEASE gn_settle", NULL, NULL, NULL) != SQLITE_OK)
    r = GN_EDB;
  if (r < 0) {
    sqlite3_exec(s->db, "ROLLBACK TO gn_settle", NULL, NULL, NULL);
    sqlite3_exec(s->db, "RELEASE gn_settle", NULL, NULL, NULL);
    if (outer && !sqlite3_get_autocommit(s->db))
      sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
  }
  return r;
}

static int prep(gn_settle *s, const char *sql, sqlite3_stmt **st) {
  return sqlite3_prepare_v2(s->db, sql, -1, st, NULL) == SQLITE_OK ? 0 : GN_EDB;
}

static void col_text(sqlite3_stmt *st, int i, char *buf, size_t cap) {
  const unsigned char *t = sqlite3_column_text(st, i);
  snprintf(buf, cap, "%s", t ? (const char *)t : "");
}

static bool col_blob(sqlite3_stmt *st, int i, uint8_t *out, size_t len) {
  if ((size_t)sqlite3_column_bytes(st, i) != len)
    return false;
  memcpy(out, sqlite3_column_blob(st, i), len);
  return true;
}

/* --- vouchers ---------------------------------------------------------------*/

static void blake2b(const uint8_t *p, size_t n, uint8_t out[32]) {
  crypto_generichash(out, 32, p, n, NULL, 0);
}

int gn_settle_voucher_open(const uint8_t *agreement_env, size_t agreement_len, const uint8_t *voucher_env,
                           size_t voucher_len, gn_settle_voucher *ret) {
  if (!agreement_env || !voucher_env || !ret)
    return GN_EINVAL;
  gn_agreement ag;
  int r = gn_agreement_open(agreement_env, agreement_len, &ag);
  if (r < 0)
    return r;
  /* The codec's opener checks the signer (the agreement's requester), the
   * lease, the currency and, for a DEBIT_ACCEPT, the provider it names. */
  gn_bill_response resp;
  if ((r = gn_bill_response_open(voucher_env, voucher_len, agreement_env, agreement_len, &resp)) < 0)
    return r;
  if (!resp.accepted)
    return GN_EINVAL; /* a rejection promises nothing */
  if (strcmp(resp.lease_id, ag.terms.lease_id) != 0)
    return GN_EPERM;
  /* SQLite integers are signed 64-bit; no honest lease comes near. */
  if (resp.total_micro > INT64_MAX || resp.seconds > INT64_MAX || resp.seq > INT64_MAX)
    return GN_ETOOBIG;
  gn_settle_voucher v;
  memset(&v, 0, sizeof v);
  snprintf(v.lease_id, sizeof v.lease_id, "%s", ag.terms.lease_id);
  memcpy(v.provider, ag.terms.provider, GN_PK_LEN);
  memcpy(v.requester, ag.terms.requester, GN_PK_LEN);
  snprintf(v.currency, sizeof v.currency, "%s", ag.terms.currency);
  v.type = resp.type;
  v.final = resp.final;
  v.seq = resp.final ? 0 : resp.seq;
  v.seconds = resp.seconds;
  v.amount_micro = resp.total_micro;
  memcpy(v.hash, resp.hash, 32);
  blake2b(voucher_env, voucher_len, v.voucher_hash);
  *ret = v;
  return 0;
}

typedef struct stored_voucher {
  bool found;
  uint8_t agreement[32];
  bool final;
  uint64_t seq, seconds, amount;
  uint8_t hash[32], voucher_hash[32];
} stored_voucher;

static int voucher_load(gn_settle *s, const char *lease_id, gn_settle_role role, stored_voucher *ret) {
  sqlite3_stmt *st = NULL;
  memset(ret, 0, sizeof *ret);
  int r = prep(s,
               "SELECT agreement, final, seq, seconds, amount_micro, hash, voucher_hash FROM settle_vouchers"
               " WHERE lease_id = ? AND role = ?",
               &st);
  if (r < 0)
    return r;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 2, (int)role);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    ret->found = true;
    ret->final = sqlite3_column_int(st, 1) != 0;
    ret->seq = (uint64_t)sqlite3_column_int64(st, 2);
    ret->seconds = (uint64_t)sqlite3_column_int64(st, 3);
    ret->amount = (uint64_t)sqlite3_column_int64(st, 4);
    if (!col_blob(st, 0, ret->agreement, 32) || !col_blob(st, 5, ret->hash, 32) ||
        !col_blob(st, 6, ret->voucher_hash, 32))
      r = GN_EDB;
  } else if (rc != SQLITE_DONE) {
    r = GN_EDB;
  }
  sqlite3_finalize(st);
  return r;
}

/* Whether v replaces the stored voucher e: 1 replace, 0 keep e (v is the same
 * or an older one that arrived late), negative when v contradicts e. */
static int voucher_compare(const stored_voucher *e, const gn_settle_voucher *v) {
  bool not_less = v->amount_micro >= e->amount && v->seconds >= e->seconds;
  bool not_more = v->amount_micro <= e->amount && v->seconds <= e->seconds;
  if (sodium_memcmp(e->voucher_hash, v->voucher_hash, 32) == 0)
    return 0;
  if (e->final) {
    if (v->final)
      return GN_ESTATE;              /* a second, different final voucher */
    return not_more ? 0 : GN_ESTATE; /* nothing is billed after the final invoice */
  }
  if (v->final)
    return not_less ? 1 : GN_EAUDIT;
  if (v->seq > e->seq)
    return not_less ? 1 : GN_EAUDIT; /* a newer voucher for less */
  if (v->seq == e->seq)
    return (v->amount_micro == e->amount && v->seconds == e->seconds && sodium_memcmp(v->hash, e->hash, 32) == 0)
               ? 0
               : GN_EAUDIT;        /* two different vouchers for the same note */
  return not_more ? 0 : GN_EAUDIT; /* an older voucher for more */
}

/* Checks and stores v inside the caller's savepoint. */
static int voucher_store(gn_settle *s, gn_settle_role role, const uint8_t ag_hash[32], const gn_settle_voucher *v,
                         const uint8_t *env, size_t env_len, int64_t now_s) {
  stored_voucher e;
  int r = voucher_load(s, v->lease_id, role, &e);
  if (r < 0)
    return r;
  if (e.found) {
    if (sodium_memcmp(e.agreement, ag_hash, 32) != 0)
      return GN_EPERM;
    if ((r = voucher_compare(&e, v)) <= 0)
      return r;
  }
  sqlite3_stmt *st = NULL;
  if ((r = prep(s,
                "INSERT OR REPLACE INTO settle_vouchers(lease_id, role, peer, currency, agreement, final, seq,"
                " seconds, amount_micro, hash, voucher_hash, envelope, updated_s) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                &st)) < 0)
    return r;
  const uint8_t *peer = role == GN_SETTLE_PROVIDER ? v->requester : v->provider;
  sqlite3_bind_text(st, 1, v->lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 2, (int)role);
  sqlite3_bind_blob(st, 3, peer, GN_PK_LEN, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, v->currency, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 5, ag_hash, 32, SQLITE_STATIC);
  sqlite3_bind_int(st, 6, v->final);
  sqlite3_bind_int64(st, 7, (sqlite3_int64)v->seq);
  sqlite3_bind_int64(st, 8, (sqlite3_int64)v->seconds);
  sqlite3_bind_int64(st, 9, (sqlite3_int64)v->amount_micro);
  sqlite3_bind_blob(st, 10, v->hash, 32, SQLITE_STATIC);
  sqlite3_bind_blob(st, 11, v->voucher_hash, 32, SQLITE_STATIC);
  sqlite3_bind_blob(st, 12, env, (int)env_len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 13, now_s);
  r = sqlite3_step(st) == SQLITE_DONE ? 0 : GN_EDB;
  sqlite3_finalize(st);
  return r;
}

/* Opens the voucher and checks that we are its party of that role. */
static int voucher_open_as(gn_settle *s, gn_settle_role role, const uint8_t *ag_env, size_t ag_len, const uint8_t *env,
                           size_t len, gn_settle_voucher *v) {
  if (role != GN_SETTLE_PROVIDER && role != GN_SETTLE_REQUESTER)
    return GN_EINVAL;
  if (len > GN_MSG_MAX || ag_len > GN_MSG_MAX)
    return GN_ETOOBIG;
  int r = gn_settle_voucher_open(ag_env, ag_len, env, len, v);
  if (r < 0)
    return r;
  const uint8_t *party = role == GN_SETTLE_PROVIDER ? v->provider : v->requester;
  return sodium_memcmp(party, s->self, GN_PK_LEN) == 0 ? 0 : GN_EPERM;
}

int gn_settle_record_voucher(gn_settle *s, gn_settle_role role, const uint8_t *agreement_env, size_t agreement_len,
                             const uint8_t *voucher_env, size_t voucher_len, int64_t now_s) {
  if (!s)
    return GN_EINVAL;
  gn_settle_voucher v;
  int r = voucher_open_as(s, role, agreement_env, agreement_len, voucher_env, voucher_len, &v);
  if (r < 0)
    return r;
  uint8_t ag_hash[32];
  blake2b(agreement_env, agreement_len, ag_hash);
  bool outer;
  if ((r = tx_begin(s, &outer)) < 0)
    return r;
  r = voucher_store(s, role, ag_hash, &v, voucher_env, voucher_len, now_s);
  return tx_end(s, outer, r);
}

int gn_settle_get_voucher(gn_settle *s, const char *lease_id, gn_settle_role role, gn_settle_voucher *ret,
                          gn_buf *ret_env) {
  if (!s || !lease_id || !ret)
    return GN_EINVAL;
  sqlite3_stmt *st = NULL;
  int r = prep(s,
               "SELECT peer, currency, final, seq, seconds, amount_micro, hash, voucher_hash, envelope"
               " FROM settle_vouchers WHERE lease_id = ? AND role = ?",
               &st);
  if (r < 0)
    return r;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 2, (int)role);
  int rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    r = rc == SQLITE_DONE ? GN_ENOTFOUND : GN_EDB;
    goto out;
  }
  gn_settle_voucher v;
  memset(&v, 0, sizeof v);
  snprintf(v.lease_id, sizeof v.lease_id, "%s", lease_id);
  uint8_t *peer = role == GN_SETTLE_PROVIDER ? v.requester : v.provider;
  memcpy(role == GN_SETTLE_PROVIDER ? v.provider : v.requester, s->self, GN_PK_LEN);
  col_text(st, 1, v.currency, sizeof v.currency);
  v.final = sqlite3_column_int(st, 2) != 0;
  v.type = v.final ? GN_MSG_INVOICE_ACCEPT : GN_MSG_DEBIT_ACCEPT;
  v.seq = (uint64_t)sqlite3_column_int64(st, 3);
  v.seconds = (uint64_t)sqlite3_column_int64(st, 4);
  v.amount_micro = (uint64_t)sqlite3_column_int64(st, 5);
  if (!col_blob(st, 0, peer, GN_PK_LEN) || !col_blob(st, 6, v.hash, 32) || !col_blob(st, 7, v.voucher_hash, 32)) {
    r = GN_EDB;
    goto out;
  }
  if (ret_env && (r = gn_buf_append(ret_env, sqlite3_column_blob(st, 8), (size_t)sqlite3_column_bytes(st, 8))) < 0)
    goto out;
  *ret = v;
out:
  sqlite3_finalize(st);
  return r;
}

/* --- the outbox -------------------------------------------------------------*/

static int b64_set(json_t *o, const char *key, const uint8_t *p, size_t n) {
  size_t cap = sodium_base64_encoded_len(n, sodium_base64_VARIANT_ORIGINAL);
  char *b = malloc(cap);
  if (!b)
    return GN_ENOMEM;
  sodium_bin2base64(b, cap, p, n, sodium_base64_VARIANT_ORIGINAL);
  int r = json_object_set_new(o, key, json_string(b)) == 0 ? 0 : GN_ENOMEM;
  free(b);
  return r;
}

/* The webhook's body (gpunet-settlement/1, described in settle.h). */
static int final_body(const gn_settle_final *f, const gn_settle_voucher *v, const char *key, gn_buf *ret) {
  char provider[GN_NODE_ID_STRLEN], requester[GN_NODE_ID_STRLEN], hash[65];
  gn_node_id_format(v->provider, provider);
  gn_node_id_format(v->requester, requester);
  sodium_bin2hex(hash, sizeof hash, v->hash, 32);
  int r = GN_ENOMEM;
  char *text = NULL;
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:s}", "format", "gpunet-settlement/1", "key",
                        key, "lease", v->lease_id, "role", gn_settle_role_name(f->role), "provider", provider,
                        "requester", requester, "currency", v->currency, "amount_micro", (json_int_t)v->amount_micro,
                        "seconds", (json_int_t)v->seconds, "invoice_hash", hash);
  if (!o)
    goto out;
  if ((r = b64_set(o, "voucher", f->accept_env, f->accept_len)) < 0 ||
      (r = b64_set(o, "invoice", f->invoice_env, f->invoice_len)) < 0)
    goto out;
  /* Not modified: the reference only lives while the body is written. */
  r = GN_ENOMEM;
  if (json_object_set(o, "export", f->export_doc ? (json_t *)f->export_doc : json_null()) < 0)
    goto out;
  if (!(text = json_dumps(o, JSON_COMPACT)))
    goto out;
  size_t len = strlen(text);
  r = len > GN_SETTLE_BODY_MAX ? GN_ETOOBIG : gn_buf_append(ret, text, len);
out:
  free(text);
  json_decref(o);
  return r;
}

static int outbox_waiting(gn_settle *s, uint64_t *ret) {
  sqlite3_stmt *st = NULL;
  int r = prep(s, "SELECT count(*) FROM settle_outbox WHERE state = 1", &st);
  if (r < 0)
    return r;
  if (sqlite3_step(st) == SQLITE_ROW)
    *ret = (uint64_t)sqlite3_column_int64(st, 0);
  else
    r = GN_EDB;
  sqlite3_finalize(st);
  return r;
}

static bool outbox_has_key(gn_settle *s, const char *key, int *ret_r) {
  sqlite3_stmt *st = NULL;
  bool found = false;
  if ((*ret_r = prep(s, "SELECT 1 FROM settle_outbox WHERE key = ?", &st)) < 0)
    return false;
  sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st);
  found = rc == SQLITE_ROW;
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    *ret_r = GN_EDB;
  sqlite3_finalize(st);
  return found;
}

int gn_settle_enqueue_final(gn_settle *s, const gn_settle_final *f, int64_t now_ms) {
  if (!s || !f || !f->invoice_env)
    return GN_EINVAL;
  gn_settle_voucher v;
  int r = voucher_open_as(s, f->role, f->agreement_env, f->agreement_len, f->accept_env, f->accept_len, &v);
  if (r < 0)
    return r;
  if (!v.final)
    return GN_EINVAL; /* a debit voucher settles nothing by itself */
  uint8_t inv_hash[32], ag_hash[32];
  blake2b(f->invoice_env, f->invoice_len, inv_hash);
  if (sodium_memcmp(inv_hash, v.hash, 32) != 0)
    return GN_EDIGEST;
  blake2b(f->agreement_env, f->agreement_len, ag_hash);
  char key[GN_SETTLE_KEY_STRLEN], hex[65];
  sodium_bin2hex(hex, sizeof hex, inv_hash, 32);
  snprintf(key, sizeof key, "%s-%s", v.lease_id, hex);

  gn_buf body = {0};
  sqlite3_stmt *st = NULL;
  bool outer;
  if ((r = tx_begin(s, &outer)) < 0)
    return r;
  if ((r = voucher_store(s, f->role, ag_hash, &v, f->accept_env, f->accept_len, now_ms / 1000)) < 0)
    goto out;
  if (outbox_has_key(s, key, &r) || r < 0)
    goto out; /* queued already: one item per final voucher */
  uint64_t waiting = 0;
  if ((r = outbox_waiting(s, &waiting)) < 0)
    goto out;
  if (waiting >= GN_SETTLE_OUTBOX_MAX) {
    r = GN_ETOOBIG;
    goto out;
  }
  if ((r = final_body(f, &v, key, &body)) < 0)
    goto out;
  if ((r = prep(s,
                "INSERT INTO settle_outbox(key, lease_id, role, peer, currency, amount_micro, body, state, attempts,"
                " next_ms, created_ms) VALUES(?,?,?,?,?,?,?,1,0,?,?)",
                &st)) < 0)
    goto out;
  sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, v.lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 3, (int)f->role);
  sqlite3_bind_blob(st, 4, f->role == GN_SETTLE_PROVIDER ? v.requester : v.provider, GN_PK_LEN, SQLITE_STATIC);
  sqlite3_bind_text(st, 5, v.currency, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)v.amount_micro);
  sqlite3_bind_blob64(st, 7, body.data, body.len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 8, now_ms);
  sqlite3_bind_int64(st, 9, now_ms);
  r = sqlite3_step(st) == SQLITE_DONE ? 0 : GN_EDB;
out:
  sqlite3_finalize(st);
  gn_buf_done(&body);
  return tx_end(s, outer, r);
}

void gn_settle_item_done(gn_settle_item *it) {
  if (it)
    gn_buf_done(&it->body);
}

int gn_settle_outbox_next(gn_settle *s, int64_t now_ms, gn_settle_item *ret) {
  if (!s || !ret)
    return GN_EINVAL;
  sqlite3_stmt *st = NULL;
  int r = prep(s,
               "SELECT id, key, lease_id, role, peer, amount_micro, currency, attempts, body FROM settle_outbox"
               " WHERE state = 1 AND next_ms <= ? ORDER BY next_ms, id LIMIT 1",
               &st);
  if (r < 0)
    return r;
  sqlite3_bind_int64(st, 1, now_ms);
  int rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    r = rc == SQLITE_DONE ? GN_ENOTFOUND : GN_EDB;
    goto out;
  }
  gn_settle_item it;
  memset(&it, 0, sizeof it);
  it.id = sqlite3_column_int64(st, 0);
  col_text(st, 1, it.key, sizeof it.key);
  col_text(st, 2, it.lease_id, sizeof it.lease_id);
  it.role = (gn_settle_role)sqlite3_column_int(st, 3);
  if (!col_blob(st, 4, it.peer, GN_PK_LEN)) {
    r = GN_EDB;
    goto out;
  }
  it.amount_micro = (uint64_t)sqlite3_column_int64(st, 5);
  col_text(st, 6, it.currency, sizeof it.currency);
  it.attempts = (uint32_t)sqlite3_column_int64(st, 7);
  if ((r = gn_buf_append(&it.body, sqlite3_column_blob(st, 8), (size_t)sqlite3_column_bytes(st, 8))) < 0)
    goto out;
  *ret = it;
out:
  sqlite3_finalize(st);
  return r;
}

int gn_settle_outbox_next_due(gn_settle *s, int64_t *ret_ms) {
  sqlite3_stmt *st = NULL;
  int r = prep(s, "SELECT min(next_ms) FROM settle_outbox WHERE state = 1", &st);
  if (r < 0)
    return r;
  if (sqlite3_step(st) != SQLITE_ROW)
    r = GN_EDB;
  else if (sqlite3_column_type(st, 0) == SQLITE_NULL)
    r = GN_ENOTFOUND;
  else
    *ret_ms = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return r;
}

/* base * 2^(attempts-1), capped, without overflow. */
static int64_t backoff_ms(const gn_settle *s, uint32_t attempts) {
  uint64_t d = s->backoff_base_ms;
  for (uint32_t i = 1; i < attempts && d < s->backoff_max_ms; i++)
    d *= 2;
  return (int64_t)(d < s->backoff_max_ms ? d : s->backoff_max_ms);
}

int gn_settle_outbox_finish(gn_settle *s, int64_t id, int rc, const gn_settle_outcome *o, const char *driver_name,
                            int64_t now_ms) {
  if (!s)
    return GN_EINVAL;
  sqlite3_stmt *st = NULL;
  int r = prep(s, "SELECT attempts FROM settle_outbox WHERE id = ? AND state = 1", &st);
  if (r < 0)
    return r;
  sqlite3_bind_int64(st, 1, id);
  int step = sqlite3_step(st);
  uint32_t attempts = step == SQLITE_ROW ? (uint32_t)sqlite3_column_int64(st, 0) : 0;
  sqlite3_finalize(st);
  st = NULL;
  if (step != SQLITE_ROW)
    return step == SQLITE_DONE ? GN_ENOTFOUND : GN_EDB;
  if (attempts < UINT32_MAX)
    attempts++;
  int state = rc == 0 ? OUT_SETTLED : (o && o->retry) ? OUT_PENDING : OUT_FAILED;
  char reason[256] = "";
  if (rc < 0)
    gn__settle_printable(reason, sizeof reason, o && o->reason[0] ? o->reason : gn_strerror(rc), sizeof reason);
  if ((r = prep(s,
                /* A settled item's body (the export: megabytes for a long
                 * lease) is dropped: the ledger holds all it was made of. */
                "UPDATE settle_outbox SET state = ?1, attempts = ?2, next_ms = ?3, done_ms = ?4, driver = ?5,"
                " http_status = ?6, reason = ?7, body = CASE WHEN ?1 = 2 THEN X'' ELSE body END"
                " WHERE id = ?8 AND state = 1",
                &st)) < 0)
    return r;
  sqlite3_bind_int(st, 1, state);
  sqlite3_bind_int64(st, 2, attempts);
  sqlite3_bind_int64(st, 3, state == OUT_PENDING ? now_ms + backoff_ms(s, attempts) : now_ms);
  sqlite3_bind_int64(st, 4, state == OUT_PENDING ? 0 : now_ms);
  sqlite3_bind_text(st, 5, driver_name ? driver_name : "", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 6, o ? o->http_status : 0);
  sqlite3_bind_text(st, 7, reason, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 8, id);
  r = sqlite3_step(st) == SQLITE_DONE ? 0 : GN_EDB;
  if (r == 0 && sqlite3_changes(s->db) != 1)
    r = GN_ENOTFOUND;
  sqlite3_finalize(st);
  return r;
}

int gn_settle_drain(gn_settle *s, gn_settle_driver *d, int64_t now_ms, size_t max, size_t *ret_n) {
  if (!s || !d)
    return GN_EINVAL;
  size_t n = 0;
  int r = 0;
  while (n < max) {
    gn_settle_item it;
    r = gn_settle_outbox_next(s, now_ms, &it);
    if (r == GN_ENOTFOUND) {
      r = 0;
      break;
    }
    if (r < 0)
      break;
    gn_settle_outcome o;
    memset(&o, 0, sizeof o);
    int rc = d->submit(d, &it, &o);
    r = gn_settle_outbox_finish(s, it.id, rc, &o, d->name, now_ms);
    gn_settle_item_done(&it);
    n++;
    if (r < 0)
      break;
  }
  if (ret_n)
    *ret_n = n;
  return r;
}

int gn_settle_outbox_retry(gn_settle *s, const char *lease_id, gn_settle_role role, int64_t now_ms, uint64_t *ret_n) {
  if (!s)
    return GN_EINVAL;
  sqlite3_stmt *st = NULL;
  int r = prep(s,
               "UPDATE settle_outbox SET state = 1, next_ms = ?1, attempts = 0 WHERE state = 3"
               " AND (?2 IS NULL OR (lease_id = ?2 AND role = ?3))",
               &st);
  if (r < 0)
    return r;
  sqlite3_bind_int64(st, 1, now_ms);
  if (lease_id)
    sqlite3_bind_text(st, 2, lease_id, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 2);
  sqlite3_bind_int(st, 3, (int)role);
  r = sqlite3_step(st) == SQLITE_DONE ? 0 : GN_EDB;
  uint64_t n = r == 0 ? (uint64_t)sqlite3_changes(s->db) : 0;
  if (r == 0 && lease_id && n == 0)
    r = GN_ENOTFOUND;
  sqlite3_finalize(st);
  if (r == 0 && ret_n)
    *ret_n = n;
  return r;
}

int gn_settle_status_get(gn_settle *s, const char *lease_id, gn_settle_role role, gn_settle_status *ret) {
  if (!s || !lease_id || !ret)
    return GN_EINVAL;
  sqlite3_stmt *st = NULL;
  int r = prep(s,
               "SELECT state, key, attempts, next_ms, done_ms, driver, reason FROM settle_outbox"
               " WHERE lease_id = ? AND role = ? ORDER BY id DESC LIMIT 1",
               &st);
  if (r < 0)
    return r;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 2, (int)role);
  gn_settle_status out;
  memset(&out, 0, sizeof out);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    int state = sqlite3_column_int(st, 0);
    out.state = state == OUT_SETTLED ? GN_SETTLE_SETTLED : state == OUT_FAILED ? GN_SETTLE_FAILED : GN_SETTLE_PENDING;
    col_text(st, 1, out.key, sizeof out.key);
    out.attempts = (uint32_t)sqlite3_column_int64(st, 2);
    out.next_ms = state == OUT_PENDING ? sqlite3_column_int64(st, 3) : 0;
    out.done_ms = sqlite3_column_int64(st, 4);
    col_text(st, 5, out.driver, sizeof out.driver);
    col_text(st, 6, out.reason, sizeof out.reason);
  } else if (rc != SQLITE_DONE) {
    r = GN_EDB;
  }
  sqlite3_finalize(st);
  if (r == 0)
    *ret = out;
  return r;
}

int gn_settle_outbox_counts(gn_settle *s, uint64_t *ret_pending, uint64_t *ret_failed) {
  sqlite3_stmt *st = NULL;
  int r = prep(s, "SELECT coalesce(sum(state = 1), 0), coalesce(sum(state = 3), 0) FROM settle_outbox", &st);
  if (r < 0)
    return r;
  if (sqlite3_step(st) == SQLITE_ROW) {
    if (ret_pending)
      *ret_pending = (uint64_t)sqlite3_column_int64(st, 0);
    if (ret_failed)
      *ret_failed = (uint64_t)sqlite3_column_int64(st, 1);
  } else {
    r = GN_EDB;
  }
  sqlite3_finalize(st);
  return r;
}

/* --- balances ---------------------------------------------------------------*/

int gn_settle_balance_add(gn_settle_balance *b, uint64_t amount_micro, bool final, bool settled) {
  if (!b || (settled && !final))
    return GN_EINVAL;
  gn_settle_balance n = *b;
  if (__builtin_add_overflow(n.leases, 1, &n.leases) ||
      __builtin_add_overflow(n.vouched_micro, amount_micro, &n.vouched_micro) ||
      (final && __builtin_add_overflow(n.final_micro, amount_micro, &n.final_micro)) ||
      (settled && __builtin_add_overflow(n.settled_micro, amount_micro, &n.settled_micro)))
    return GN_ETOOBIG;
  *b = n;
  return 0;
}

int gn_settle_balances(gn_settle *s, gn_settle_balance **ret, size_t *ret_n) {
  if (!s || !ret || !ret_n)
    return GN_EINVAL;
  sqlite3_stmt *st = NULL;
  gn_settle_balance *arr = NULL;
  size_t n = 0, cap = 0;
  /* A lease's final voucher is settled when its outbox item is. */
  int r = prep(s,
               "SELECT v.role, v.peer, v.currency, v.amount_micro, v.final,"
               " EXISTS(SELECT 1 FROM settle_outbox o WHERE o.lease_id = v.lease_id AND o.role = v.role"
               " AND o.state = 2)"
               " FROM settle_vouchers v ORDER BY v.role, v.peer, v.currency",
               &st);
  if (r < 0)
    return r;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    gn_settle_role role = (gn_settle_role)sqlite3_column_int(st, 0);
    uint8_t peer[GN_PK_LEN];
    char currency[8];
    if (!col_blob(st, 1, peer, GN_PK_LEN)) {
      r = GN_EDB;
      goto out;
    }
    col_text(st, 2, currency, sizeof currency);
    gn_settle_balance *b = n ? &arr[n - 1] : NULL;
    if (!b || b->role != role || memcmp(b->peer, peer, GN_PK_LEN) != 0 || strcmp(b->currency, currency) != 0) {
      if (n == cap) {
        size_t ncap = cap ? cap * 2 : 8;
        gn_settle_balance *na = realloc(arr, ncap * sizeof *na);
        if (!na) {
          r = GN_ENOMEM;
          goto out;
        }
        arr = na;
        cap = ncap;
      }
      b = &arr[n++];
      memset(b, 0, sizeof *b);
      b->role = role;
      memcpy(b->peer, peer, GN_PK_LEN);
      memcpy(b->currency, currency, sizeof currency);
    }
    bool final = sqlite3_column_int(st, 4) != 0;
    if ((r = gn_settle_balance_add(b, (uint64_t)sqlite3_column_int64(st, 3), final,
                                   final && sqlite3_column_int(st, 5) != 0)) < 0)
      goto out;
  }
  if (rc != SQLITE_DONE)
    r = GN_EDB;
out:
  sqlite3_finalize(st);
  if (r < 0) {
    free(arr);
    return r;
  }
  *ret = n ? arr : NULL;
  if (!n)
    free(arr);
  *ret_n = n;
  return 0;
}

gn_settle_driver *gn_settle_driver_free(gn_settle_driver *d) {
  if (d && d->free)
    d->free(d);
  return NULL;
}
