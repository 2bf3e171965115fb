/* The `ledger` settlement driver: settles a final voucher by writing it into
 * the node's own book (table settle_book), from which an operator's
 * bookkeeping can take it; the balances per counterparty come from the
 * vouchers themselves (gn_settle_balances). */
#include "settle_int.h"

#include <stdlib.h>

typedef struct ledger_driver {
  gn_settle_driver base; /* first: the driver is freed through it */
  gn_settle *s;
} ledger_driver;

static int ledger_submit(gn_settle_driver *d, const gn_settle_item *it, gn_settle_outcome *ret) {
  ledger_driver *ld = (ledger_driver *)d;
  sqlite3 *db = gn__settle_db(ld->s);
  sqlite3_stmt *st = NULL;
  int r = GN_EDB;
  /* Idempotent on the key, like a webhook server is asked to be: an item
   * written here whose outcome the outbox did not record (a crash between
   * the two) is simply written again. */
  if (sqlite3_prepare_v2(db,
                         "INSERT OR IGNORE INTO settle_book(key, lease_id, role, peer, currency, amount_micro,"
                         " settled_ms) VALUES(?,?,?,?,?,?,?)",
                         -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_text(st, 1, it->key, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, it->lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 3, (int)it->role);
  sqlite3_bind_blob(st, 4, it->peer, GN_PK_LEN, SQLITE_STATIC);
  sqlite3_bind_text(st, 5, it->currency, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)it->amount_micro);
  sqlite3_bind_int64(st, 7, gn__settle_now_ms());
  if (sqlite3_step(st) == SQLITE_DONE)
    r = 0;
out:
  if (r < 0) {
    /* The database is ours: a failure (disk full, busy) is transient. */
    ret->retry = true;
    gn__settle_printable(ret->reason, sizeof ret->reason, sqlite3_errmsg(db), sizeof ret->reason);
  }
  sqlite3_finalize(st);
  return r;
}

static void ledger_free(gn_settle_driver *d) {
  free(d);
}

int gn_settle_ledger_driver_new(gn_settle *s, gn_settle_driver **ret) {
  if (!s || !ret)
    return GN_EINVAL;
  ledger_driver *ld = calloc(1, sizeof(*ld));
  if (!ld)
    return GN_ENOMEM;
  ld->base = (gn_settle_driver){.name = "ledger", .off_loop = false, .submit = ledger_submit, .free = ledger_free};
  ld->s = s;
  *ret = &ld->base;
  return 0;
}
