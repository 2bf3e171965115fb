/* The daemon's side of settlement: records the vouchers of its leases,
 * queues final settlements, and drains the outbox through the configured
 * driver (the webhook's requests on the libuv thread pool, one at a time),
 * with a timer for the retries; also the control API's balance route. */
#include "settle_glue.h"

#include "node_internal.h"
#include "util.h"

#include <gpunet/settle.h>
#include <stdlib.h>
#include <string.h>

/* The timer re-checks the outbox at least this often even when nothing is
 * due (an item queued by another path, a clock step). */
#define SETTLE_RECHECK_MS 60000
/* Items an inline driver (ledger) settles per timer callback before it
 * yields the loop. */
#define SETTLE_INLINE_BATCH 16

struct gn__settle_glue {
  gn_node *n;
  gn_settle *s;
  gn_settle_driver *drv;
  uv_timer_t timer;
  bool timer_open;
  bool closing;
  bool busy; /* an item is being submitted on the thread pool */
  uv_work_t work;
  gn_settle_item item;
  gn_settle_outcome out;
  int rc;
};

static int64_t now_ms(void) {
  return gn_unix_s() * 1000;
}

static gn_settle_role role_of(const gn_lease *l) {
  return l->role == GN_ROLE_PROVIDER ? GN_SETTLE_PROVIDER : GN_SETTLE_REQUESTER;
}

static void schedule(struct gn__settle_glue *g, uint64_t delay_ms);

static void log_outcome(const struct gn__settle_glue *g, const gn_settle_item *it, int rc, const gn_settle_outcome *o) {
  char amount[32];
  gn_price_format(it->amount_micro, amount, sizeof amount);
  if (rc == 0)
    gn_log(GN_LOG_INFO, "lease %s settled (%s %s, %s driver, key %s)", it->lease_id, amount, it->currency, g->drv->name,
           it->key);
  else if (o->retry)
    gn_log(GN_LOG_WARN, "settling lease %s failed (attempt %u, will retry): %s", it->lease_id, it->attempts + 1,
           o->reason[0] ? o->reason : gn_strerror(rc));
  else
    gn_log(GN_LOG_ERROR, "settling lease %s failed for good: %s (fix the endpoint, then retry it)", it->lease_id,
           o->reason[0] ? o->reason : gn_strerror(rc));
}

static void finish(struct gn__settle_glue *g, gn_settle_item *it, int rc, gn_settle_outcome *o) {
  log_outcome(g, it, rc, o);
  int r = gn_settle_outbox_finish(g->s, it->id, rc, o, g->drv->name, now_ms());
  if (r < 0)
    gn_log(GN_LOG_ERROR, "cannot record the settlement of lease %s: %s", it->lease_id, gn_strerror(r));
  gn_settle_item_done(it);
}

static void work_submit(uv_work_t *w) {
  struct gn__settle_glue *g = w->data;
  memset(&g->out, 0, sizeof g->out);
  g->rc = g->drv->submit(g->drv, &g->item, &g->out);
}

static void work_done(uv_work_t *w, int status) {
  struct gn__settle_glue *g = w->data;
  if (status == UV_ECANCELED) {
    g->rc = GN_ECANCELED;
    g->out.retry = true;
  }
  g->busy = false;
  finish(g, &g->item, g->rc, &g->out);
  if (!g->closing)
    schedule(g, 0);
}

/* Hands out due items: one to the thread pool, or a batch inline. */
static void drain(struct gn__settle_glue *g) {
  for (int i = 0; i < SETTLE_INLINE_BATCH && !g->busy && !g->closing; i++) {
    gn_settle_item it;
    int r = gn_settle_outbox_next(g->s, now_ms(), &it);
    if (r == GN_ENOTFOUND)
      break;
    if (r < 0) {
      gn_log(GN_LOG_ERROR, "cannot read the settlement outbox: %s", gn_strerror(r));
      schedule(g, SETTLE_RECHECK_MS);
      return;
    }
    if (g->drv->off_loop) {
      g->item = it;
      g->busy = true;
      g->work.data = g;
      if ((r = uv_queue_work(g->n->loop, &g->work, work_submit, work_done)) < 0) {
        g->busy = false;
        gn_settle_outcome o = {.retry = true};
        gn__strf(o.reason, sizeof o.reason, "cannot queue the request: %s", uv_strerror(r));
        finish(g, &g->item, GN_EIO, &o);
        break;
      }
      return; /* work_done schedules the next */
    }
    gn_settle_outcome o;
    memset(&o, 0, sizeof o);
    int rc = g->drv->submit(g->drv, &it, &o);
    finish(g, &it, rc, &o);
  }
  if (!g->busy)
    schedule(g, SETTLE_RECHECK_MS);
}

static void on_timer(uv_timer_t *t) {
  drain(t->data);
}

/* Arms the timer for the next due item (at most delay_ms away). */
static void schedule(struct gn__settle_glue *g, uint64_t delay_ms) {
  if (g->closing || !g->timer_open || g->busy)
    return;
  int64_t due = 0;
  if (gn_settle_outbox_next_due(g->s, &due) == 0) {
    int64_t wait = due - now_ms();
    if (wait < 0)
      wait = 0;
    if ((uint64_t)wait < delay_ms)
      delay_ms = (uint64_t)wait;
  }
  uv_timer_start(&g->timer, on_timer, delay_ms, 0);
}

int gn__settle_start(gn_node *n, char *err, size_t cap) {
  struct gn__settle_glue *g = calloc(1, sizeof(*g));
  int r = GN_ENOMEM;
  if (!g) {
    gn__strf(err, cap, "out of memory");
    return r;
  }
  g->n = n;
  if ((r = gn_settle_open(n->db, n->id->pk, &g->s)) < 0) {
    gn__strf(err, cap, "cannot open the settlement tables: %s", gn_strerror(r));
    goto fail;
  }
  if (strcmp(n->cfg.settle_driver, "webhook") == 0)
    r = gn_settle_webhook_new(n->cfg.settle_url, 0, &g->drv);
  else
    r = gn_settle_ledger_driver_new(g->s, &g->drv);
  if (r < 0) {
    gn__strf(err, cap, "cannot start the %s settlement driver: %s", n->cfg.settle_driver, gn_strerror(r));
    goto fail;
  }
  uv_timer_init(n->loop, &g->timer);
  g->timer.data = g;
  g->timer_open = true;
  /* The timer alone does not keep the daemon running. */
  uv_unref((uv_handle_t *)&g->timer);
  n->settle = g;
  uint64_t pending = 0, failed = 0;
  gn_settle_outbox_counts(g->s, &pending, &failed);
  gn_log(GN_LOG_INFO, "settlement: %s driver, %llu item(s) to settle, %llu failed", g->drv->name,
         (unsigned long long)pending, (unsigned long long)failed);
  schedule(g, 0);
  return 0;
fail:
  gn_settle_driver_free(g->drv);
  gn_settle_free(g->s);
  free(g);
  return r;
}

void gn__settle_stop(gn_node *n) {
  struct gn__settle_glue *g = n->settle;
  if (!g || g->closing)
    return;
  g->closing = true;
  if (g->timer_open) {
    uv_timer_stop(&g->timer);
    uv_close((uv_handle_t *)&g->timer, NULL);
  }
  /* A request on the pool stops within a second (its outcome, canceled, is
   * recorded as a transient failure: the item stays queued); an item
   * interrupted by a crash instead is sent again with the same idempotency
   * key. */
  if (g->busy) {
    uv_cancel((uv_req_t *)&g->work);
    if (g->drv->cancel)
      g->drv->cancel(g->drv);
  }
}

void gn__settle_free(gn_node *n) {
  struct gn__settle_glue *g = n->settle;
  if (!g)
    return;
  if (g->busy)
    return; /* cannot happen once the loop has run dry; leak rather than race */
  gn_settle_driver_free(g->drv);
  gn_settle_free(g->s);
  free(g);
  n->settle = NULL;
}

int gn__settle_voucher(gn_node *n, const gn_lease *l, const uint8_t *env, size_t len) {
  struct gn__settle_glue *g = n->settle;
  if (!g)
    return GN_ESTATE;
  int r =
      gn_settle_record_voucher(g->s, role_of(l), l->agreement_env.data, l->agreement_env.len, env, len, gn_unix_s());
  if (r < 0)
    gn_log(GN_LOG_WARN, "lease %s: voucher not recorded: %s", l->id, gn_strerror(r));
  return r;
}

int gn__settle_final(gn_node *n, const gn_lease *l, const uint8_t *invoice_env, size_t invoice_len,
                     const uint8_t *accept_env, size_t accept_len) {
  struct gn__settle_glue *g = n->settle;
  if (!g)
    return GN_ESTATE;
  json_t *doc = NULL;
  /* The export as this side holds it (agreement, notes, vouchers, the final
   * invoice): without it the settlement still goes, with "export": null. */
  int r = gn_ledger_export(n->ledger, l->id, l->role == GN_ROLE_PROVIDER ? "provider" : "requester", &doc);
  if (r < 0)
    gn_log(GN_LOG_WARN, "lease %s: no export for its settlement: %s", l->id, gn_strerror(r));
  gn_settle_final f = {
      .role = role_of(l),
      .agreement_env = l->agreement_env.data,
      .agreement_len = l->agreement_env.len,
      .invoice_env = invoice_env,
      .invoice_len = invoice_len,
      .accept_env = accept_env,
      .accept_len = accept_len,
      .export_doc = doc,
  };
  r = gn_settle_enqueue_final(g->s, &f, now_ms());
  json_decref(doc);
  if (r < 0) {
    gn_log(GN_LOG_ERROR, "lease %s: final settlement not queued: %s", l->id, gn_strerror(r));
    return r;
  }
  schedule(g, 0);
  return 0;
}

const char *gn__settle_state(gn_node *n, const char *lease_id, const char *role) {
  struct gn__settle_glue *g = n->settle;
  gn_settle_status st;
  if (!g || !role)
    return "none";
  gn_settle_role sr = strcmp(role, "provider") == 0 ? GN_SETTLE_PROVIDER : GN_SETTLE_REQUESTER;
  if (gn_settle_status_get(g->s, lease_id, sr, &st) < 0)
    return "unknown";
  return gn_settle_state_name(st.state);
}

static void api_settle_retry(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  struct gn__settle_glue *g = n->settle;
  if (!g)
    return gn_ctl_reply_error(req, 503, "settlement is not running");
  uint64_t again = 0;
  int r = gn_settle_outbox_retry(g->s, NULL, GN_SETTLE_PROVIDER, now_ms(), &again);
  if (r < 0)
    return gn_ctl_reply_error(req, 500, "cannot retry settlements: %s", gn_strerror(r));
  if (again)
    gn_log(GN_LOG_INFO, "settlement: %llu failed item(s) queued again", (unsigned long long)again);
  schedule(g, 0);
  gn_ctl_reply_json(req, 200, json_pack("{s:I, s:s}", "retried", (json_int_t)again, "driver", g->drv->name));
}

static json_t *balance_json(const gn_settle_balance *b) {
  char peer[GN_NODE_ID_STRLEN], vouched[32], settled[32], outstanding[32];
  gn_node_id_format(b->peer, peer);
  uint64_t out = b->vouched_micro - b->settled_micro; /* settled is a part of vouched */
  gn_price_format(b->vouched_micro, vouched, sizeof vouched);
  gn_price_format(b->settled_micro, settled, sizeof settled);
  gn_price_format(out, outstanding, sizeof outstanding);
  return json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:s}", "direction",
                   b->role == GN_SETTLE_PROVIDER ? "owed_to_us" : "we_owe", "role", gn_settle_role_name(b->role),
                   "peer", peer, "currency", b->currency, "leases", (json_int_t)b->leases, "vouched_micro",
                   (json_int_t)b->vouched_micro, "final_micro", (json_int_t)b->final_micro, "settled_micro",
                   (json_int_t)b->settled_micro, "outstanding_micro", (json_int_t)out, "vouched", vouched, "settled",
                   settled, "outstanding", outstanding);
}

static void api_balance(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  struct gn__settle_glue *g = n->settle;
  if (!g)
    return gn_ctl_reply_error(req, 503, "settlement is not running");
  gn_settle_balance *bs = NULL;
  size_t cnt = 0;
  uint64_t pending = 0, failed = 0;
  int r = gn_settle_balances(g->s, &bs, &cnt);
  if (r == GN_ETOOBIG)
    return gn_ctl_reply_error(req, 500, "a balance does not fit in 64 bits: the vouchers recorded are not credible");
  if (r < 0 || (r = gn_settle_outbox_counts(g->s, &pending, &failed)) < 0) {
    free(bs);
    return gn_ctl_reply_error(req, 500, "cannot read balances: %s", gn_strerror(r));
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < cnt; i++)
    json_array_append_new(arr, balance_json(&bs[i]));
  free(bs);
  gn_ctl_reply_json(req, 200,
                    json_pack("{s:o, s:s, s:I, s:I}", "balances", arr, "driver", g->drv->name, "pending",
                              (json_int_t)pending, "failed", (json_int_t)failed));
}

void gn__settle_register(gn_node *n) {
  gn_ctl_route(n->ctl, "GET", "/v1/balance", api_balance, n);
  gn_ctl_route(n->ctl, "POST", "/v1/balance/retry", api_settle_retry, n);
}
