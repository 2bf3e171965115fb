/* The ledger: hash-chained, append-only usage ticks per lease in SQLite, and
 * the invoices a node keeps. The database handle belongs to the caller. */
#include "billing_int.h"

#include <inttypes.h>
#include <stdio.h>

/* Durability: gn_ledger_append_ticks commits its ticks in one transaction
 * before it returns. With the caller's journal_mode=WAL and synchronous=FULL,
 * SQLite fsyncs the WAL at every commit, so a committed tick survives a crash
 * or power loss, and a crash can only lose the tick whose transaction had not
 * yet committed: the second being written. With synchronous=NORMAL a WAL
 * commit is not fsynced and a power loss could silently drop seconds that
 * were already reported (and billed to the requester's observation), so
 * gn_ledger_open refuses such a connection instead of changing it: the
 * connection is shared with other tables whose owners chose its pragmas, and
 * setting them behind their back would hide the decision. */

static const char *const schema_sql =
    "CREATE TABLE IF NOT EXISTS ledger_leases("
    " lease_id TEXT PRIMARY KEY NOT NULL,"
    " genesis BLOB NOT NULL,"
    " agreement BLOB NOT NULL,"
    " gpus_max INTEGER NOT NULL,"
    " max_s INTEGER NOT NULL,"
    " start_s INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS ticks("
    " lease_id TEXT NOT NULL,"
    " idx INTEGER NOT NULL,"
    " t_s INTEGER NOT NULL,"
    " gpus INTEGER NOT NULL,"
    " util INTEGER NOT NULL,"
    " hash BLOB NOT NULL,"
    " PRIMARY KEY(lease_id, idx)) WITHOUT ROWID;"
    /* Append-only, enforced by the database itself so that no code path (ours
     * or a careless future one) can rewrite a billed second. */
    "CREATE TRIGGER IF NOT EXISTS ticks_no_update BEFORE UPDATE ON ticks"
    " BEGIN SELECT RAISE(ABORT, 'ticks are append-only'); END;"
    "CREATE TRIGGER IF NOT EXISTS ticks_no_delete BEFORE DELETE ON ticks"
    " BEGIN SELECT RAISE(ABORT, 'ticks are append-only'); END;"
    "CREATE TRIGGER IF NOT EXISTS ledger_leases_no_update BEFORE UPDATE ON ledger_leases"
    " BEGIN SELECT RAISE(ABORT, 'ledger leases are append-only'); END;"
    "CREATE TRIGGER IF NOT EXISTS ledger_leases_no_delete BEFORE DELETE ON ledger_leases"
    " BEGIN SELECT RAISE(ABORT, 'ledger leases are append-only'); END;"
    "CREATE TABLE IF NOT EXISTS invoices("
    " lease_id TEXT NOT NULL,"
    " role TEXT NOT NULL,"
    " invoice_id TEXT NOT NULL,"
    " invoice BLOB NOT NULL,"
    " accept BLOB,"
    " status TEXT NOT NULL,"
    " created_s INTEGER NOT NULL,"
    " updated_s INTEGER NOT NULL,"
    " PRIMARY KEY(lease_id, role));"
    "CREATE INDEX IF NOT EXISTS invoices_by_id ON invoices(invoice_id);"
    /* Billing v2: every debit note and final invoice a node issued
     * (provider) or accepted or rejected (requester), with the requester's
     * answer. answer: 0 none yet, 1 accepted, -1 rejected. */
    "CREATE TABLE IF NOT EXISTS bill_msgs("
    " lease_id TEXT NOT NULL,"
    " role TEXT NOT NULL,"
    " hash BLOB NOT NULL,"
    " final INTEGER NOT NULL,"
    " seq INTEGER NOT NULL,"
    " seconds INTEGER NOT NULL,"
    " env BLOB NOT NULL,"
    " response BLOB,"
    " answer INTEGER NOT NULL DEFAULT 0,"
    " created_s INTEGER NOT NULL,"
    " updated_s INTEGER NOT NULL,"
    " PRIMARY KEY(lease_id, role, hash)) WITHOUT ROWID;";

struct gn_ledger {
  sqlite3 *db;
  sqlite3_stmt *begin, *commit, *rollback;
  sqlite3_stmt *lease, *last, *insert, *count;
};

static int prep(sqlite3 *db, const char *sql, sqlite3_stmt **ret) {
  return sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, ret, NULL) == SQLITE_OK ? 0 : GN_EDB;
}

static int step_done(sqlite3_stmt *st) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? 0 : GN_EDB;
}

static int pragma_int(sqlite3 *db, const char *sql, int *ret) {
  sqlite3_stmt *st = NULL;
  int r = GN_EDB;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    goto out;
  if (sqlite3_step(st) != SQLITE_ROW)
    goto out;
  *ret = sqlite3_column_int(st, 0);
  r = 0;
out:
  sqlite3_finalize(st);
  return r;
}

gn_ledger *gn_ledger_free(gn_ledger *l) {
  if (!l)
    return NULL;
  sqlite3_finalize(l->begin);
  sqlite3_finalize(l->commit);
  sqlite3_finalize(l->rollback);
  sqlite3_finalize(l->lease);
  sqlite3_finalize(l->last);
  sqlite3_finalize(l->insert);
  sqlite3_finalize(l->count);
  free(l);
  return NULL;
}

int gn_ledger_open(sqlite3 *db, gn_ledger **ret) {
  gn_ledger *l = NULL;
  int sync = 0, r;
  if (!db || !ret)
    return GN_EINVAL;
  if ((r = pragma_int(db, "PRAGMA synchronous", &sync)) < 0)
    return r;
  if (sync < 2) /* 2 = FULL, 3 = EXTRA; see the durability note above */
    return GN_EINVAL;
  if (sqlite3_exec(db, "SAVEPOINT gn_ledger_schema", NULL, NULL, NULL) != SQLITE_OK)
    return GN_EDB;
  if (sqlite3_exec(db, schema_sql, NULL, NULL, NULL) != SQLITE_OK) {
    sqlite3_exec(db, "ROLLBACK TO gn_ledger_schema; RELEASE gn_ledger_schema", NULL, NULL, NULL);
    return GN_EDB;
  }
  if (sqlite3_exec(db, "RELEASE gn_ledger_schema", NULL, NULL, NULL) != SQLITE_OK)
    return GN_EDB;
  l = calloc(1, sizeof(*l));
  if (!l)
    return GN_ENOMEM;
  l->db = db;
  if ((r = prep(db, "BEGIN IMMEDIATE", &l->begin)) < 0 || (r = prep(db, "COMMIT", &l->commit)) < 0 ||
      (r = prep(db, "ROLLBACK", &l->rollback)) < 0 ||
      (r = prep(db, "SELECT genesis, gpus_max, max_s, start_s FROM ledger_leases WHERE lease_id = ?1", &l->lease)) <
          0 ||
      (r = prep(db, "SELECT idx, t_s, hash FROM ticks WHERE lease_id = ?1 ORDER BY idx DESC LIMIT 1", &l->last)) < 0 ||
      (r = prep(db, "INSERT INTO ticks(lease_id, idx, t_s, gpus, util, hash) VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
                &l->insert)) < 0 ||
      (r = prep(db, "SELECT count(*) FROM ticks WHERE lease_id = ?1", &l->count)) < 0)
    goto out;
  *ret = l;
  l = NULL;
out:
  gn_ledger_free(l);
  return r;
}

int gn_ledger_begin_lease(gn_ledger *l, const char *lease_id, const uint8_t *agreement_env, size_t len) {
  gn_agreement ag;
  uint8_t genesis[GN__HASH_LEN];
  sqlite3_stmt *st = NULL;
  int r;
  if (!l || !gn__lease_id_ok(lease_id) || !agreement_env)
    return GN_EINVAL;
  if ((r = gn_agreement_open(agreement_env, len, &ag)) < 0)
    return r;
  if (strcmp(ag.terms.lease_id, lease_id) != 0)
    return GN_EINVAL;
  gn__genesis(agreement_env, len, genesis);
  /* Beginning the same lease again with the same agreement is a no-op, so a
   * restarted node can replay its lease table; another agreement under a
   * lease id already in use is refused. */
  if (sqlite3_prepare_v2(l->db,
                         "INSERT INTO ledger_leases(lease_id, genesis, agreement, gpus_max, max_s, start_s)"
                         " VALUES(?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(lease_id) DO NOTHING",
                         -1, &st, NULL) != SQLITE_OK)
    return GN_EDB;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, genesis, sizeof(genesis), SQLITE_STATIC);
  sqlite3_bind_blob(st, 3, agreement_env, (int)len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 4, ag.terms.count);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)ag.terms.max_s);
  sqlite3_bind_int64(st, 6, ag.start_s);
  r = sqlite3_step(st) == SQLITE_DONE ? 0 : GN_EDB;
  sqlite3_finalize(st);
  st = NULL;
  if (r < 0 || sqlite3_changes(l->db) == 1)
    return r;
  r = GN_EEXIST;
  sqlite3_bind_text(l->lease, 1, lease_id, -1, SQLITE_STATIC);
  if (sqlite3_step(l->lease) == SQLITE_ROW) {
    const void *g = sqlite3_column_blob(l->lease, 0);
    if (g && sqlite3_column_bytes(l->lease, 0) == GN__HASH_LEN && memcmp(g, genesis, GN__HASH_LEN) == 0)
      r = 0;
  }
  sqlite3_reset(l->lease);
  return r;
}

typedef struct lease_row {
  uint8_t genesis[GN__HASH_LEN];
  uint32_t gpus_max;
  uint64_t max_s;
  int64_t start_s;
} lease_row;

static int lease_get(gn_ledger *l, const char *lease_id, lease_row *ret) {
  int r = GN_ENOTFOUND;
  if (!gn__lease_id_ok(lease_id))
    return GN_EINVAL; /* every reader passes here: no id off-grammar reaches SQL */
  sqlite3_bind_text(l->lease, 1, lease_id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(l->lease);
  if (rc == SQLITE_ROW) {
    const void *g = sqlite3_column_blob(l->lease, 0);
    if (!g || sqlite3_column_bytes(l->lease, 0) != GN__HASH_LEN) {
      r = GN_EDB;
    } else {
      memcpy(ret->genesis, g, GN__HASH_LEN);
      ret->gpus_max = (uint32_t)sqlite3_column_int64(l->lease, 1);
      ret->max_s = (uint64_t)sqlite3_column_int64(l->lease, 2);
      ret->start_s = sqlite3_column_int64(l->lease, 3);
      r = 0;
    }
  } else if (rc != SQLITE_DONE) {
    r = GN_EDB;
  }
  sqlite3_reset(l->lease);
  return r;
}

/* The last tick of a lease: idx 0 with the genesis hash if it has none. */
static int last_get(gn_ledger *l, const char *lease_id, const lease_row *lr, gn_tick *ret) {
  int r = 0;
  memset(ret, 0, sizeof(*ret));
  memcpy(ret->hash, lr->genesis, GN__HASH_LEN);
  ret->t_s = lr->start_s;
  sqlite3_bind_text(l->last, 1, lease_id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(l->last);
  if (rc == SQLITE_ROW) {
    const void *h = sqlite3_column_blob(l->last, 2);
    if (!h || sqlite3_column_bytes(l->last, 2) != GN__HASH_LEN) {
      r = GN_EDB;
    } else {
      ret->idx = (uint64_t)sqlite3_column_int64(l->last, 0);
      ret->t_s = sqlite3_column_int64(l->last, 1);
      memcpy(ret->hash, h, GN__HASH_LEN);
    }
  } else if (rc != SQLITE_DONE) {
    r = GN_EDB;
  }
  sqlite3_reset(l->last);
  return r;
}

int gn__ledger_append(gn_ledger *l, const char *lease_id, int64_t t_s, uint32_t gpus, uint8_t util, bool commit,
                      gn_tick *ret_tick) {
  lease_row lr;
  gn_tick last, t;
  int r;
  if (!l || !gn__lease_id_ok(lease_id) || (util > 100 && util != GN_UTIL_UNKNOWN))
    return GN_EINVAL;
  if (commit) {
    /* Our own transaction is what makes "committed before it returns" true;
     * inside someone else's it would not be, so refuse rather than lie. */
    if (!sqlite3_get_autocommit(l->db))
      return GN_ESTATE;
    int rc = sqlite3_step(l->begin);
    sqlite3_reset(l->begin);
    if (rc != SQLITE_DONE) /* BUSY: another connection holds the write lock */
      return rc == SQLITE_BUSY ? GN_EBUSY : GN_EDB;
  }
  if ((r = lease_get(l, lease_id, &lr)) < 0 || (r = last_get(l, lease_id, &lr, &last)) < 0)
    goto out;
  if (gpus > lr.gpus_max) {
    r = GN_EINVAL;
    goto out;
  }
  if (last.idx >= lr.max_s || last.idx >= GN_INVOICE_MAX_S) {
    r = GN_ETOOBIG; /* the lease has run its maximum duration */
    goto out;
  }
  memset(&t, 0, sizeof(t));
  t.idx = last.idx + 1;
  /* The index is the time (tick hash v2 holds no wall clock); t_s is kept
   * beside it as information only, non-decreasing for readers. */
  t.t_s = t_s < last.t_s ? last.t_s : t_s;
  t.gpus = gpus;
  t.util = util;
  gn__tick_hash(last.hash, lease_id, t.idx, t.gpus, t.util, t.hash);
  sqlite3_bind_text(l->insert, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(l->insert, 2, (sqlite3_int64)t.idx);
  sqlite3_bind_int64(l->insert, 3, t.t_s);
  sqlite3_bind_int64(l->insert, 4, t.gpus);
  sqlite3_bind_int64(l->insert, 5, t.util);
  sqlite3_bind_blob(l->insert, 6, t.hash, GN__HASH_LEN, SQLITE_STATIC);
  if ((r = step_done(l->insert)) < 0)
    goto out;
  if (commit && (r = step_done(l->commit)) < 0)
    goto out;
  commit = false;
  if (ret_tick)
    *ret_tick = t;
out:
  if (commit)
    step_done(l->rollback);
  return r;
}

int gn_ledger_append_ticks(gn_ledger *l, const gn_tick_append *ticks, size_t n, gn_tick *ret_ticks) {
  gn_tick *out = NULL;
  int r = 0, rc;
  if (!l || (n && !ticks))
    return GN_EINVAL;
  if (n == 0)
    return 0;
  if (!sqlite3_get_autocommit(l->db))
    return GN_ESTATE;
  if (ret_ticks && !(out = calloc(n, sizeof(*out))))
    return GN_ENOMEM;
  rc = sqlite3_step(l->begin);
  sqlite3_reset(l->begin);
  if (rc != SQLITE_DONE) {
    r = rc == SQLITE_BUSY ? GN_EBUSY : GN_EDB;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    if ((r = gn__ledger_append(l, ticks[i].lease_id, ticks[i].t_s, ticks[i].gpus, ticks[i].util, false,
                               out ? &out[i] : NULL)) < 0) {
      step_done(l->rollback);
      goto out;
    }
  }
  if ((r = step_done(l->commit)) < 0) {
    step_done(l->rollback);
    goto out;
  }
  if (ret_ticks)
    memcpy(ret_ticks, out, n * sizeof(*out));
out:
  free(out);
  return r;
}

int gn_ledger_tick_count(gn_ledger *l, const char *lease_id, uint64_t *ret) {
  lease_row lr;
  int r;
  if (!l || !lease_id || !ret)
    return GN_EINVAL;
  if ((r = lease_get(l, lease_id, &lr)) < 0)
    return r;
  sqlite3_bind_text(l->count, 1, lease_id, -1, SQLITE_STATIC);
  r = GN_EDB;
  if (sqlite3_step(l->count) == SQLITE_ROW) {
    *ret = (uint64_t)sqlite3_column_int64(l->count, 0);
    r = 0;
  }
  sqlite3_reset(l->count);
  return r;
}

int gn_ledger_last_tick(gn_ledger *l, const char *lease_id, gn_tick *ret) {
  lease_row lr;
  gn_tick t;
  int r;
  if (!l || !lease_id || !ret)
    return GN_EINVAL;
  if ((r = lease_get(l, lease_id, &lr)) < 0 || (r = last_get(l, lease_id, &lr, &t)) < 0)
    return r;
  if (t.idx == 0)
    return GN_ENOTFOUND;
  /* gpus and util of the last tick are not needed by last_get's callers;
   * fetch them for this public accessor. */
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(l->db, "SELECT gpus, util FROM ticks WHERE lease_id = ?1 AND idx = ?2", -1, &st, NULL) !=
      SQLITE_OK)
    return GN_EDB;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)t.idx);
  r = GN_EDB;
  if (sqlite3_step(st) == SQLITE_ROW) {
    t.gpus = (uint32_t)sqlite3_column_int64(st, 0);
    t.util = (uint8_t)sqlite3_column_int(st, 1);
    *ret = t;
    r = 0;
  }
  sqlite3_finalize(st);
  return r;
}

int gn_ledger_agreement(gn_ledger *l, const char *lease_id, gn_buf *ret_env) {
  sqlite3_stmt *st = NULL;
  int r = GN_ENOTFOUND;
  if (!l || !lease_id || !ret_env)
    return GN_EINVAL;
  if (sqlite3_prepare_v2(l->db, "SELECT agreement FROM ledger_leases WHERE lease_id = ?1", -1, &st, NULL) != SQLITE_OK)
    return GN_EDB;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW)
    r = gn_buf_append(ret_env, sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0));
  else if (rc != SQLITE_DONE)
    r = GN_EDB;
  sqlite3_finalize(st);
  return r;
}

int gn_ledger_each_tick(gn_ledger *l, const char *lease_id, int (*fn)(const gn_tick *t, void *arg), void *arg,
                        char *reason, size_t cap) {
  lease_row lr;
  sqlite3_stmt *st = NULL;
  uint8_t prev[GN__HASH_LEN];
  uint64_t want = 1;
  int r, rc;
  if (!l || !lease_id)
    return GN_EINVAL;
  if ((r = lease_get(l, lease_id, &lr)) < 0)
    return r;
  memcpy(prev, lr.genesis, GN__HASH_LEN);
  if (sqlite3_prepare_v2(l->db, "SELECT idx, t_s, gpus, util, hash FROM ticks WHERE lease_id = ?1 ORDER BY idx", -1,
                         &st, NULL) != SQLITE_OK)
    return GN_EDB;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    gn_tick t;
    uint8_t h[GN__HASH_LEN];
    const void *hp = sqlite3_column_blob(st, 4);
    t.idx = (uint64_t)sqlite3_column_int64(st, 0);
    t.t_s = sqlite3_column_int64(st, 1);
    t.gpus = (uint32_t)sqlite3_column_int64(st, 2);
    t.util = (uint8_t)sqlite3_column_int(st, 3);
    /* The stored chain is re-verified on every read: rows written around the
     * triggers (by hand, or by a tool that dropped them) are caught here,
     * before they could be signed into an invoice. */
    if (t.idx != want) {
      r = gn__fail(reason, cap, "ledger of lease %s: second %" PRIu64 " is missing", lease_id, want);
      goto out;
    }
    gn__tick_hash(prev, lease_id, t.idx, t.gpus, t.util, h);
    if (!hp || sqlite3_column_bytes(st, 4) != GN__HASH_LEN || memcmp(hp, h, GN__HASH_LEN) != 0) {
      r = gn__fail(reason, cap,
                   "ledger of lease %s: second %" PRIu64 ": hash chain broken (tick fields or order changed)", lease_id,
                   t.idx);
      goto out;
    }
    memcpy(t.hash, h, GN__HASH_LEN);
    memcpy(prev, h, GN__HASH_LEN);
    want++;
    if (fn && (r = fn(&t, arg)) < 0)
      goto out;
  }
  r = rc == SQLITE_DONE ? 0 : GN_EDB;
out:
  sqlite3_finalize(st);
  return r;
}

int gn_ledger_verify_chain(gn_ledger *l, const char *lease_id, char *reason, size_t cap) {
  return gn_ledger_each_tick(l, lease_id, NULL, NULL, reason, cap);
}

/* --- invoices kept by the node ------------------------------------------*/

static bool role_ok(const char *role) {
  return role && (strcmp(role, "provider") == 0 || strcmp(role, "requester") == 0);
}

void gn_invoice_record_done(gn_invoice_record *r) {
  if (!r)
    return;
  gn_buf_done(&r->invoice);
  gn_buf_done(&r->accept);
}

gn_invoice_record *gn_invoice_records_free(gn_invoice_record *recs, size_t n) {
  if (!recs)
    return NULL;
  for (size_t i = 0; i < n; i++)
    gn_invoice_record_done(&recs[i]);
  free(recs);
  return NULL;
}

#define INVOICE_COLS "lease_id, role, invoice_id, invoice, accept, status, created_s, updated_s"

static void copy_text(char *dst, size_t cap, const unsigned char *src) {
  snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

/* Fills *ret from the current row; on failure ret holds nothing to free. */
static int record_from_row(sqlite3_stmt *st, gn_invoice_record *ret) {
  gn_invoice_record rec;
  int r;
  memset(&rec, 0, sizeof(rec));
  copy_text(rec.lease_id, sizeof(rec.lease_id), sqlite3_column_text(st, 0));
  copy_text(rec.role, sizeof(rec.role), sqlite3_column_text(st, 1));
  copy_text(rec.invoice_id, sizeof(rec.invoice_id), sqlite3_column_text(st, 2));
  copy_text(rec.status, sizeof(rec.status), sqlite3_column_text(st, 5));
  rec.created_s = sqlite3_column_int64(st, 6);
  rec.updated_s = sqlite3_column_int64(st, 7);
  if ((r = gn_buf_append(&rec.invoice, sqlite3_column_blob(st, 3), (size_t)sqlite3_column_bytes(st, 3))) < 0 ||
      (r = gn_buf_append(&rec.accept, sqlite3_column_blob(st, 4), (size_t)sqlite3_column_bytes(st, 4))) < 0)
    goto out;
  if ((r = gn_invoice_summarize(rec.invoice.data, rec.invoice.len, &rec.summary)) < 0)
    goto out;
  rec.summary.countersigned = false;
  if (rec.accept.len) {
    gn_invoice_response resp;
    if (gn_invoice_response_open(rec.accept.data, rec.accept.len, rec.invoice.data, rec.invoice.len, &resp) == 0 &&
        resp.accepted) {
      rec.summary.countersigned = true;
      rec.summary.accepted_s = resp.at_s;
    }
  }
  *ret = rec;
  return 0;
out:
  gn_invoice_record_done(&rec);
  return r;
}

int gn_ledger_get_invoice(gn_ledger *l, const char *id, const char *role, gn_invoice_record *ret) {
  sqlite3_stmt *st = NULL;
  int r = GN_ENOTFOUND, rc;
  if (!l || !id || !ret || (role && !role_ok(role)))
    return GN_EINVAL;
  if (sqlite3_prepare_v2(l->db,
                         "SELECT " INVOICE_COLS " FROM invoices WHERE (lease_id = ?1 OR invoice_id = ?1)"
                         " AND (?2 IS NULL OR role = ?2) ORDER BY role = 'requester', updated_s DESC LIMIT 1",
                         -1, &st, NULL) != SQLITE_OK)
    return GN_EDB;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (role)
    sqlite3_bind_text(st, 2, role, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 2);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW)
    r = record_from_row(st, ret);
  else if (rc != SQLITE_DONE)
    r = GN_EDB;
  sqlite3_finalize(st);
  return r;
}

int gn_ledger_list_invoices(gn_ledger *l, const char *role, gn_invoice_record **ret, size_t *ret_n) {
  sqlite3_stmt *st = NULL;
  gn_invoice_record *recs = NULL;
  size_t n = 0, cap = 0;
  int r = 0, rc;
  if (!l || !ret || !ret_n || (role && !role_ok(role)))
    return GN_EINVAL;
  if (sqlite3_prepare_v2(l->db,
                         "SELECT " INVOICE_COLS " FROM invoices WHERE (?1 IS NULL OR role = ?1)"
                         " ORDER BY created_s, lease_id, role",
                         -1, &st, NULL) != SQLITE_OK)
    return GN_EDB;
  if (role)
    sqlite3_bind_text(st, 1, role, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 1);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 8;
      gn_invoice_record *p = realloc(recs, ncap * sizeof(*recs));
      if (!p) {
        r = GN_ENOMEM;
        goto out;
      }
      recs = p;
      cap = ncap;
    }
    if ((r = record_from_row(st, &recs[n])) < 0) {
      /* A row of the older invoice format (tick hash v1, 12-byte records)
       * no longer decodes: listed no more, but not failing the list. */
      if (r == GN_ENOMEM || r == GN_EDB)
        goto out;
      r = 0;
      continue;
    }
    n++;
  }
  if (rc != SQLITE_DONE) {
    r = GN_EDB;
    goto out;
  }
  *ret = recs;
  *ret_n = n;
  recs = NULL;
  n = 0;
out:
  sqlite3_finalize(st);
  gn_invoice_records_free(recs, n);
  return r;
}

/* --- billing v2: compact ticks, notes and answers, the export ----------------*/

int gn_ledger_ticks(gn_ledger *l, const char *lease_id, uint64_t from, uint64_t n, uint8_t *ret_ticks,
                    uint8_t ret_chain_head[32]) {
  lease_row lr;
  sqlite3_stmt *st = NULL;
  gn__tick_hasher th;
  uint8_t chain[GN__HASH_LEN];
  uint64_t want, last;
  uint8_t *out = NULL;
  int r, rc;
  if (!l || !lease_id || from == 0 || (n && !ret_ticks) || n > GN_INVOICE_MAX_S || from > GN_INVOICE_MAX_S)
    return GN_EINVAL;
  if ((r = lease_get(l, lease_id, &lr)) < 0)
    return r;
  last = from + n - 1; /* from, n <= GN_INVOICE_MAX_S: no overflow */
  if (n && !(out = malloc((size_t)n * GN_BILL_TICK_LEN)))
    return GN_ENOMEM;
  memcpy(chain, lr.genesis, GN__HASH_LEN);
  gn__tick_hasher_init(&th, lease_id);
  if (sqlite3_prepare_v2(l->db,
                         "SELECT idx, gpus, util, hash FROM ticks WHERE lease_id = ?1 AND idx >= ?2 AND idx <= ?3"
                         " ORDER BY idx",
                         -1, &st, NULL) != SQLITE_OK) {
    r = GN_EDB;
    goto out;
  }
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)(from - 1));
  sqlite3_bind_int64(st, 3, (sqlite3_int64)last);
  /* The walk starts from the stored hash of second from-1 (the genesis for
   * from = 1): every earlier second was read, and signed into a note, from
   * the same rows, so the chain of what was already billed is what links
   * here; a row changed since (around the triggers) breaks the link. */
  want = from == 1 ? 1 : from - 1;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const uint64_t idx = (uint64_t)sqlite3_column_int64(st, 0);
    const sqlite3_int64 gpus = sqlite3_column_int64(st, 1);
    const int util = sqlite3_column_int(st, 2);
    const void *hp = sqlite3_column_blob(st, 3);
    if (idx != want || !hp || sqlite3_column_bytes(st, 3) != GN__HASH_LEN) {
      r = idx != want ? GN_EINVAL : GN_EAUDIT; /* a missing second: fewer than asked exist */
      goto out;
    }
    if (idx == from - 1) { /* the link before the range */
      memcpy(chain, hp, GN__HASH_LEN);
    } else {
      if (gpus < 0 || gpus > (sqlite3_int64)lr.gpus_max || util < 0 || (util > 100 && util != GN_UTIL_UNKNOWN)) {
        r = GN_EAUDIT;
        goto out;
      }
      gn__tick_hasher_step(&th, chain, idx, (uint32_t)gpus, (uint8_t)util);
      if (memcmp(chain, hp, GN__HASH_LEN) != 0) {
        r = GN_EAUDIT;
        goto out;
      }
      out[2 * (idx - from)] = (uint8_t)gpus;
      out[2 * (idx - from) + 1] = (uint8_t)util;
    }
    want++;
  }
  if (rc != SQLITE_DONE) {
    r = GN_EDB;
    goto out;
  }
  if (want != last + 1) {
    r = GN_EINVAL; /* fewer seconds than asked */
    goto out;
  }
  if (n)
    memcpy(ret_ticks, out, (size_t)n * GN_BILL_TICK_LEN);
  if (ret_chain_head)
    memcpy(ret_chain_head, chain, GN__HASH_LEN);
  r = 0;
out:
  sqlite3_finalize(st);
  free(out);
  return r;
}

/* Opens the lease's agreement for the checks below. */
static int ledger_ctx(gn_ledger *l, const char *lease_id, gn_buf *ag_env, gn__bill_ctx *ctx) {
  int r;
  if ((r = gn_ledger_agreement(l, lease_id, ag_env)) < 0)
    return r;
  if (gn__bill_ctx_open(ag_env->data, ag_env->len, ctx, NULL, 0) < 0)
    return GN_EINVAL;
  return 0;
}

int gn_ledger_store_note(gn_ledger *l, const char *lease_id, const char *role, const uint8_t *env, size_t len) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  gn_bill_note no;
  sqlite3_stmt *st = NULL;
  int r;
  if (!l || !gn__lease_id_ok(lease_id) || !role_ok(role) || !env)
    return GN_EINVAL;
  if ((r = ledger_ctx(l, lease_id, &ag, &ctx)) < 0)
    goto out;
  if (gn__bill_peek(env, len, &ctx, &no, NULL, 0) < 0) {
    r = GN_EAUDIT;
    goto out;
  }
  r = GN_EDB;
  if (sqlite3_prepare_v2(l->db,
                         "INSERT INTO bill_msgs(lease_id, role, hash, final, seq, seconds, env, created_s, updated_s)"
                         " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8) ON CONFLICT DO NOTHING",
                         -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, role, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 3, no.hash, GN__HASH_LEN, SQLITE_STATIC);
  sqlite3_bind_int(st, 4, no.final);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)no.seq);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)no.seconds);
  sqlite3_bind_blob(st, 7, env, (int)len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 8, gn_unix_s());
  r = sqlite3_step(st) == SQLITE_DONE ? 0 : GN_EDB;
out:
  sqlite3_finalize(st);
  gn_buf_done(&ag);
  return r;
}

int gn_ledger_store_response(gn_ledger *l, const char *lease_id, const char *role, const uint8_t *resp_env,
                             size_t resp_len) {
  gn_buf ag = {0};
  gn__bill_ctx ctx;
  gn_bill_response resp;
  sqlite3_stmt *st = NULL;
  int r;
  if (!l || !gn__lease_id_ok(lease_id) || !role_ok(role) || !resp_env)
    return GN_EINVAL;
  if ((r = ledger_ctx(l, lease_id, &ag, &ctx)) < 0)
    goto out;
  if ((r = gn__bill_response_open(resp_env, resp_len, &ctx, &resp, NULL, 0)) < 0)
    goto out;
  r = GN_EDB;
  /* An acceptance is never replaced: once a note is accepted it stays so. */
  if (sqlite3_prepare_v2(l->db,
                         "UPDATE bill_msgs SET response = ?4, answer = ?5, updated_s = ?6"
                         " WHERE lease_id = ?1 AND role = ?2 AND hash = ?3 AND final = ?7 AND answer <> 1",
                         -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, role, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 3, resp.hash, GN__HASH_LEN, SQLITE_STATIC);
  sqlite3_bind_blob(st, 4, resp_env, (int)resp_len, SQLITE_STATIC);
  sqlite3_bind_int(st, 5, resp.accepted ? 1 : -1);
  sqlite3_bind_int64(st, 6, gn_unix_s());
  sqlite3_bind_int(st, 7, resp.final);
  if (sqlite3_step(st) != SQLITE_DONE)
    goto out;
  r = 0;
  if (sqlite3_changes(l->db) == 0) {
    /* Nothing updated: either already accepted (fine, idempotent) or no
     * such note. */
    sqlite3_finalize(st);
    st = NULL;
    r = GN_EDB;
    if (sqlite3_prepare_v2(l->db, "SELECT answer FROM bill_msgs WHERE lease_id = ?1 AND role = ?2 AND hash = ?3", -1,
                           &st, NULL) != SQLITE_OK)
      goto out;
    sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, role, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, resp.hash, GN__HASH_LEN, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    r = rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? GN_ENOTFOUND : GN_EDB;
  }
out:
  sqlite3_finalize(st);
  gn_buf_done(&ag);
  return r;
}

static int buf_from_col(sqlite3_stmt *st, int col, gn_buf *ret) {
  if (sqlite3_column_type(st, col) == SQLITE_NULL)
    return 0;
  return gn_buf_append(ret, sqlite3_column_blob(st, col), (size_t)sqlite3_column_bytes(st, col));
}

int gn_ledger_export(gn_ledger *l, const char *lease_id, const char *role, struct json_t **ret_json) {
  gn_buf ag = {0}, inv = {0}, inv_resp = {0};
  gn_buf *notes = NULL, *resps = NULL;
  size_t n = 0, cap = 0;
  sqlite3_stmt *st = NULL;
  bool have_inv = false;
  int r, rc;
  if (!l || !gn__lease_id_ok(lease_id) || !role_ok(role) || !ret_json)
    return GN_EINVAL;
  if ((r = gn_ledger_agreement(l, lease_id, &ag)) < 0)
    goto out;
  r = GN_EDB;
  /* Notes by seq; of several with one seq (a lost note superseded by the
   * next, which shares its prev) the accepted one first. Of final invoices
   * (normally one) the answered one, then the latest. */
  if (sqlite3_prepare_v2(l->db,
                         "SELECT final, env, response FROM bill_msgs WHERE lease_id = ?1 AND role = ?2"
                         " ORDER BY final, CASE WHEN final THEN answer = 0 END, CASE WHEN final THEN -answer END,"
                         " CASE WHEN final THEN -seq END, seq, answer DESC, created_s",
                         -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, role, -1, SQLITE_STATIC);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (sqlite3_column_int(st, 0)) {
      if (!have_inv) {
        have_inv = true;
        if ((r = buf_from_col(st, 1, &inv)) < 0 || (r = buf_from_col(st, 2, &inv_resp)) < 0)
          goto out;
      }
      continue;
    }
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      gn_buf *a = realloc(notes, ncap * sizeof(*a)), *b;
      if (!a) {
        r = GN_ENOMEM;
        goto out;
      }
      notes = a;
      if (!(b = realloc(resps, ncap * sizeof(*b)))) {
        r = GN_ENOMEM;
        goto out;
      }
      resps = b;
      cap = ncap;
    }
    memset(&notes[n], 0, sizeof(notes[n]));
    memset(&resps[n], 0, sizeof(resps[n]));
    n++;
    if ((r = buf_from_col(st, 1, &notes[n - 1])) < 0 || (r = buf_from_col(st, 2, &resps[n - 1])) < 0)
      goto out;
  }
  if (rc != SQLITE_DONE) {
    r = GN_EDB;
    goto out;
  }
  sqlite3_finalize(st);
  st = NULL;
  if (!have_inv) {
    /* A final invoice kept in the invoices table of older nodes. */
    gn_invoice_record rec;
    r = gn_ledger_get_invoice(l, lease_id, role, &rec);
    if (r == 0) {
      if (strcmp(rec.lease_id, lease_id) == 0) {
        gn_buf t = inv;
        inv = rec.invoice;
        rec.invoice = t;
        t = inv_resp;
        inv_resp = rec.accept;
        rec.accept = t;
        have_inv = true;
      }
      gn_invoice_record_done(&rec);
    } else if (r != GN_ENOTFOUND) {
      goto out;
    }
  }
  r = gn_bill_export(ag.data, ag.len, notes, resps, n, have_inv ? inv.data : NULL, have_inv ? inv.len : 0,
                     inv_resp.len ? inv_resp.data : NULL, inv_resp.len, ret_json);
out:
  sqlite3_finalize(st);
  for (size_t i = 0; i < n; i++) {
    gn_buf_done(&notes[i]);
    gn_buf_done(&resps[i]);
  }
  free(notes);
  free(resps);
  gn_buf_done(&ag);
  gn_buf_done(&inv);
  gn_buf_done(&inv_resp);
  return r;
}
