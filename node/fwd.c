/* The forwarded-port module's glue (fwd.h): its state, the messages routed
 * to either end, the timer that paces streams and checks leases, shutdown. */
#include "fwd.h"
#include "node_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* While a stream waits for the pace the timer runs every FWD_PACE_MS;
 * otherwise every FWD_CHECK_MS, to end streams and forwards whose lease,
 * job or session ended. */
#define FWD_PACE_MS 20
#define FWD_CHECK_MS 500

static void on_timer(uv_timer_t *t) {
  gn__fwd *f = t->data;
  uint64_t now = uv_now(f->n->loop);
  gn__fwd_stream_unpace(f);
  if (now - f->checked_ms >= FWD_CHECK_MS) {
    f->checked_ms = now;
    gn__fwd_prov_check(f);
    gn__fwd_req_check(f);
  }
  if (!f->paced && uv_timer_get_repeat(t) != FWD_CHECK_MS)
    uv_timer_start(t, on_timer, FWD_CHECK_MS, FWD_CHECK_MS);
}

void gn__fwd_pace_wait(gn__fwd *f) {
  if (!f->closing && uv_timer_get_repeat(&f->timer) != FWD_PACE_MS)
    uv_timer_start(&f->timer, on_timer, FWD_PACE_MS, FWD_PACE_MS);
}

int gn__fwd_start(gn_node *n) {
  gn__fwd *f = calloc(1, sizeof *f);
  if (!f)
    return GN_ENOMEM;
  f->n = n;
  f->next_stream = 1;
  f->self_ns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  gn_token_bucket_init(&f->pace, GN_FWD_PACE, uv_now(n->loop));
  uv_timer_init(n->loop, &f->timer);
  f->timer.data = f;
  uv_timer_start(&f->timer, on_timer, FWD_CHECK_MS, FWD_CHECK_MS);
  n->fwd = f;
  return 0;
}

void gn__fwd_register(gn_node *n) {
  gn__fwd_req_register(n);
}

void gn__fwd_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn__fwd *f = n->fwd;
  if (!f || f->closing)
    return;
  if (env->type == GN_MSG_FWD_OPEN) {
    gn_fwdopen m;
    if (gn__fwdopen_decode(env->body, env->body_len, &m) < 0) {
      gn_log_ratelimited("fwd-bad", GN_LOG_DEBUG, "dropped a malformed fwd_open");
      return;
    }
    gn__fwd_prov_on_open(f, peer, &m);
    return;
  }
  gn_fwdmsg m;
  if (gn__fwdmsg_decode(env->type, env->body, env->body_len, &m) < 0) {
    gn_log_ratelimited("fwd-bad", GN_LOG_DEBUG, "dropped a malformed %s", gn_msg_type_name(env->type));
    return;
  }
  /* The opener's messages reach the other end's copy of the stream. */
  gn__fwd_stream *s = gn__fwd_stream_find(f, peer, m.stream, !m.opener);
  if (s)
    gn__fwd_stream_on_msg(s, env->type, &m);
  else
    gn_log_ratelimited("fwd-unknown", GN_LOG_DEBUG, "dropped %s for unknown stream %u", gn_msg_type_name(env->type),
                       m.stream);
  gn__fwdmsg_done(&m);
}

void gn__fwd_close(gn_node *n) {
  gn__fwd *f = n->fwd;
  if (!f || f->closing)
    return;
  f->closing = true;
  while (f->streams)
    gn__fwd_stream_reset(f->streams, true, "the node shuts down");
  gn__fwd_req_close(f);
  uv_timer_stop(&f->timer);
  uv_close((uv_handle_t *)&f->timer, NULL);
}

void gn__fwd_free(gn_node *n) {
  gn__fwd *f = n->fwd;
  if (!f)
    return;
  if (f->self_ns >= 0)
    close(f->self_ns);
  free(f);
  n->fwd = NULL;
}
