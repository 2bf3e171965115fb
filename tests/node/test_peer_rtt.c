/* Round trips between providers (node/peer_rtt.c, docs/protocol.md §2.14),
 * against a real provider gpunetd P with a simulated GPU. This test plays:
 * R, a requester with a session to P; T, a peer with a session to P that
 * answers PING after 60 ms (or never, or with a forged nonce); D, a node
 * P knows only from an offer R relays (P must dial it); and U, a key
 * nobody knows. Checked: a measure of T of at least its delay, D dialled
 * and measured, a silent target reported unreachable within the bound, 17
 * targets refused, an unknown target reported without a dial, a second ask
 * refused while one runs and within the rate window, a PING flood answered
 * at the capped rate, a forged PONG ignored. Then the requester's side in
 * this process: a gn_node on R's transport builds a matrix of P and T, T
 * lying (a closer RTT, ids not asked, an absurd value), and a matrix with a
 * candidate that never answers ends at its timeout, done called once. And
 * the codec and the combining rule on their own. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/helpers.h"
#include "node_internal.h"
#include "peer_rtt.h"

#include <gpunet/gang.h>

#define T_DELAY_MS 60
#define RTT_LOOSE_US 1500000u       /* a 60 ms answer on loopback, even under load and ASan */
#define UNREACHABLE_WITHIN_MS 3500u /* GN_RTT_TARGET_MS plus the timer and a loaded machine */

enum { T_DELAY, T_SILENT, T_FORGE };

typedef struct delayed {
  uv_timer_t t;
  uint8_t nonce[GN_RTT_NONCE_LEN];
  bool busy; /* until its timer is closed */
} delayed;

/* The transports' ud: which of the test's nodes a callback is for. */
static char TAG_R, TAG_T, TAG_D, TAG_A;

#define N_ASKERS GN_RTT_MAX_ASKS /* other requesters, for the global cap */

static struct {
  char dir[PATH_MAX];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *r_id, *t_id, *d_id;
  uint8_t u_pk[GN_PK_LEN]; /* a key nobody knows */
  gn_transport *r_tp, *t_tp, *d_tp;
  gn_identity *a_id[N_ASKERS];
  gn_transport *a_tp[N_ASKERS];
  int r_up, t_up, d_up, a_up;
  int t_mode;
  int t_pings, d_pings, r_pongs;
  delayed pend[8];
  tn_inbox r_in, t_in, a_in;
  gn_node node; /* the requester of the matrix tests, on R's transport */
  bool node_on;
  int done_calls;
  uint32_t done_rtt[4];
  uint64_t done_at;
} W;

/* ud: 'r', 't' or 'd' */
static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)t, (void)addr;
  if (memcmp(peer, W.prov_id->pk, GN_PK_LEN) != 0)
    return;
  int *flag = ud == &TAG_R ? &W.r_up : ud == &TAG_T ? &W.t_up : ud == &TAG_A ? &W.a_up : &W.d_up;
  (*flag)++;
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t, (void)peer, (void)ud;
}

static void send_body(gn_transport *tp, const gn_identity *by, const uint8_t to[GN_PK_LEN], uint32_t type,
                      gn_wire_writer *w) {
  gn_buf body = {0};
  assert_int_equal(gn_wire_writer_take(w, &body), 0);
  tn_send(tp, by, type, &body, to);
  gn_buf_done(&body);
}

static void send_pong(gn_transport *tp, const gn_identity *by, const uint8_t to[GN_PK_LEN],
                      const uint8_t nonce[GN_RTT_NONCE_LEN]) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  assert_int_equal(gn__rtt_ping_encode(nonce, &w), 0);
  send_body(tp, by, to, GN_MSG_RTT_PONG, &w);
  gn_wire_writer_done(&w);
}

static void on_delayed_closed(uv_handle_t *h) {
  ((delayed *)h->data)->busy = false;
}

static void on_delayed(uv_timer_t *t) {
  delayed *d = t->data;
  send_pong(W.t_tp, W.t_id, W.prov_id->pk, d->nonce);
  uv_close((uv_handle_t *)t, on_delayed_closed);
}

static void t_on_ping(const gn_envelope *env) {
  uint8_t nonce[GN_RTT_NONCE_LEN];
  W.t_pings++;
  assert_int_equal(gn__rtt_ping_decode(env->body, env->body_len, nonce), 0);
  if (W.t_mode == T_FORGE) {
    randombytes_buf(nonce, sizeof nonce);
    send_pong(W.t_tp, W.t_id, W.prov_id->pk, nonce);
  } else if (W.t_mode == T_DELAY) {
    for (size_t i = 0; i < GN_ARRAY_SIZE(W.pend); i++)
      if (!W.pend[i].busy) {
        delayed *d = &W.pend[i];
        d->busy = true;
        memcpy(d->nonce, nonce, sizeof nonce);
        uv_timer_init(&W.loop, &d->t);
        d->t.data = d;
        /* The loop's clock is the turn's start and counts whole ms: a fresh
         * one, and a ms more, so that the PONG leaves T_DELAY_MS after the
         * PING came at least. */
        uv_update_time(&W.loop);
        uv_timer_start(&d->t, on_delayed, T_DELAY_MS + 1, 0);
        return;
      }
    fail_msg("T has more than %zu PINGs waiting: P does not ping one after the other", GN_ARRAY_SIZE(W.pend));
  }
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t len, void *ud) {
  (void)t;
  if (ud == &TAG_T) {
    if (env->type == GN_MSG_RTT_PING)
      t_on_ping(env);
    else
      tn_inbox_add(&W.t_in, peer, env, raw, len);
  } else if (ud == &TAG_A) {
    tn_inbox_add(&W.a_in, peer, env, raw, len);
  } else if (ud == &TAG_D) {
    uint8_t nonce[GN_RTT_NONCE_LEN];
    if (env->type == GN_MSG_RTT_PING && gn__rtt_ping_decode(env->body, env->body_len, nonce) == 0) {
      W.d_pings++;
      send_pong(W.d_tp, W.d_id, peer, nonce);
    }
  } else if (env->type == GN_MSG_RTT_PONG) {
    W.r_pongs++;
  } else if (W.node_on && env->type >= GN_MSG_RTT_ASK && env->type <= GN_MSG_RTT_PONG) {
    gn__rtt_on_message(&W.node, peer, env, raw, len);
  } else {
    tn_inbox_add(&W.r_in, peer, env, raw, len);
  }
}

static bool never(void *ud) {
  (void)ud;
  return false;
}

static void spin(uint64_t ms) {
  tn_run_until(&W.loop, never, NULL, ms);
}

/* --- R's asks ---------------------------------------------------------------*/

static void ask_from(gn_transport *tp, const gn_identity *by, const uint8_t nonce[GN_RTT_NONCE_LEN],
                     const uint8_t (*targets)[GN_PK_LEN], size_t count) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, nonce, GN_RTT_NONCE_LEN);
  gn_wire_put_str(&w, "targets");
  gn_wire_put_array(&w, (uint32_t)count);
  for (size_t i = 0; i < count; i++)
    gn_wire_put_bin(&w, targets[i], GN_PK_LEN);
  send_body(tp, by, W.prov_id->pk, GN_MSG_RTT_ASK, &w);
  gn_wire_writer_done(&w);
}

static void ask_raw(const uint8_t nonce[GN_RTT_NONCE_LEN], const uint8_t (*targets)[GN_PK_LEN], size_t count) {
  ask_from(W.r_tp, W.r_id, nonce, targets, count);
}

/* R asks P about targets; returns the nonce in ret_nonce. */
static void ask(const uint8_t (*targets)[GN_PK_LEN], size_t count, uint8_t ret_nonce[GN_RTT_NONCE_LEN]) {
  randombytes_buf(ret_nonce, GN_RTT_NONCE_LEN);
  ask_raw(ret_nonce, targets, count);
}

/* The report answering nonce, within timeout_ms: 1 when it came. */
static int wait_report(const uint8_t nonce[GN_RTT_NONCE_LEN], uint64_t timeout_ms, gn_rtt_report *ret) {
  uint64_t end = gn_mono_ms() + timeout_ms;
  for (;;) {
    tn_msg m;
    uint64_t now = gn_mono_ms();
    if (now >= end || !tn_wait_msg(&W.loop, &W.r_in, GN_MSG_RTT_REPORT, NULL, NULL, end - now, &m))
      return 0;
    gn_envelope env;
    assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &env), 0);
    assert_memory_equal(env.signer, W.prov_id->pk, GN_PK_LEN);
    assert_int_equal(gn__rtt_report_decode(env.body, env.body_len, ret), 0);
    gn_buf_done(&m.raw);
    if (memcmp(ret->nonce, nonce, GN_RTT_NONCE_LEN) == 0)
      return 1;
  }
}

static const gn_rtt_result *result_for(const gn_rtt_report *rep, const uint8_t id[GN_PK_LEN]) {
  for (size_t i = 0; i < rep->count; i++)
    if (memcmp(rep->results[i].id, id, GN_PK_LEN) == 0)
      return &rep->results[i];
  fail_msg("the report has no result for a target asked");
  return NULL;
}

static bool log_has(const char *part) {
  return tn_log_has(W.dir, part);
}

static void print_log(void) {
  tn_print_log(W.dir, 40);
}

/* An offer signed by D naming D's listen address, relayed by R: P learns D
 * only this way. Waits until P has taken it (P's log). */
static void relay_d_offer(void) {
  gn_offer o;
  gn_buf env = {0};
  tn_offer(&o, W.d_id->pk, gn_transport_listen_addr(W.d_tp), 1, 60, true);
  assert_int_equal(gn_offer_seal(W.d_id, &o, &env), 0);
  assert_int_equal(gn_transport_send(W.r_tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  spin(300); /* P takes it in on receipt */
}

/* --- setup ------------------------------------------------------------------*/

static int setup(void **state) {
  (void)state;
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-peer-rtt-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon =
      tn_daemon_spawn(W.dir, "w", "--data-dir", W.dir, "--listen", W.addr, "--provide", "--simulate-gpu", "RTX 4090",
                      "--price", "0.40", "--max-hours", "2", "--allow-no-userns", "--log-level", "debug", (char *)NULL);
  uv_loop_init(&W.loop);
  gn_transport_cbs cbs = {.on_peer_up = on_up, .on_peer_down = on_down, .on_message = on_msg};
  assert_int_equal(gn_identity_generate(&W.r_id), 0);
  assert_int_equal(gn_identity_generate(&W.t_id), 0);
  assert_int_equal(gn_identity_generate(&W.d_id), 0);
  randombytes_buf(W.u_pk, sizeof W.u_pk);
  assert_int_equal(gn_transport_new(&W.loop, W.r_id, &cbs, &TAG_R, &W.r_tp), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.t_id, &cbs, &TAG_T, &W.t_tp), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.d_id, &cbs, &TAG_D, &W.d_tp), 0);
  assert_int_equal(gn_transport_listen(W.r_tp, "127.0.0.1:0"), 0);
  assert_int_equal(gn_transport_listen(W.t_tp, "127.0.0.1:0"), 0);
  assert_int_equal(gn_transport_listen(W.d_tp, "127.0.0.1:0"), 0);
  tn_dial(&W.loop, W.r_tp, W.addr, &W.r_up, W.dir);
  gn_transport_connect(W.t_tp, W.addr);
  tn_run_until_flag(&W.loop, &W.t_up, 5000);
  assert_true(W.t_up);
  /* The in-process requester node of the matrix tests. */
  W.node.loop = &W.loop;
  W.node.id = W.r_id;
  W.node.tp = W.r_tp;
  W.node.offers = gn_offer_table_new(16);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  gn_transport *tps[3 + N_ASKERS] = {W.r_tp, W.t_tp, W.d_tp};
  size_t ntps = 3;
  for (size_t i = 0; i < N_ASKERS; i++)
    if (W.a_tp[i])
      tps[ntps++] = W.a_tp[i];
  for (size_t i = 0; i < GN_ARRAY_SIZE(W.pend); i++) /* no PONG after T's transport is gone */
    if (W.pend[i].busy && !uv_is_closing((uv_handle_t *)&W.pend[i].t))
      uv_close((uv_handle_t *)&W.pend[i].t, on_delayed_closed);
  tn_inbox_done(&W.t_in);
  /* The daemon first: it must stop cleanly (no sanitizer report, exit 0). */
  int status = -1;
  kill(W.daemon, SIGTERM);
  waitpid(W.daemon, &status, 0);
  W.daemon = 0;
  bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0 && !log_has("Sanitizer");
  if (!clean) {
    fprintf(stderr, "gpunetd did not stop cleanly (status 0x%x)\n", (unsigned)status);
    print_log();
  }
  W.node.stopping = true; /* ends what the in-process node has running and closes its timer */
  spin(100);
  W.node_on = false;
  tn_inbox_done(&W.a_in);
  int rc = tn_world_end(&W.loop, tps, ntps, W.daemon, &W.r_in, W.dir);
  for (size_t i = 0; i < N_ASKERS; i++)
    W.a_id[i] = gn_identity_free(W.a_id[i]);
  W.node.offers = gn_offer_table_free(W.node.offers);
  W.prov_id = gn_identity_free(W.prov_id);
  W.r_id = gn_identity_free(W.r_id);
  W.t_id = gn_identity_free(W.t_id);
  W.d_id = gn_identity_free(W.d_id);
  return clean ? rc : -1;
}

/* --- the provider's answer -------------------------------------------------*/

/* T answers after 60 ms: at least that is reported, and not much more. D,
 * known to P only by its offer, is dialled and measured. */
static void test_measures_a_slow_peer_and_dials_an_offer(void **state) {
  (void)state;
  uint8_t nonce[GN_RTT_NONCE_LEN], targets[2][GN_PK_LEN];
  gn_rtt_report rep;
  relay_d_offer();
  memcpy(targets[0], W.t_id->pk, GN_PK_LEN);
  memcpy(targets[1], W.d_id->pk, GN_PK_LEN);
  ask((const uint8_t(*)[GN_PK_LEN])targets, 2, nonce);
  if (!wait_report(nonce, 5000, &rep))
    print_log();
  assert_string_equal(rep.error, "");
  assert_int_equal(rep.count, 2);
  const gn_rtt_result *t = result_for(&rep, W.t_id->pk), *d = result_for(&rep, W.d_id->pk);
  print_message("T (answers after %d ms): %u us; D (dialled): %u us %s\n", T_DELAY_MS, t->rtt_us, d->rtt_us, d->error);
  assert_string_equal(t->error, "");
  assert_true(t->rtt_us >= T_DELAY_MS * 1000u);
  assert_true(t->rtt_us < RTT_LOOSE_US);
  assert_int_equal(W.t_pings, GN_RTT_PINGS); /* one after the other, all answered */
  assert_string_equal(d->error, "");
  assert_true(d->rtt_us > 0 && d->rtt_us < t->rtt_us);
  assert_true(W.d_up > 0);
  assert_true(W.d_pings >= 1);
}

/* T never answers: reported unreachable, within the bound. */
static void test_silent_target_is_unreachable_in_time(void **state) {
  (void)state;
  uint8_t nonce[GN_RTT_NONCE_LEN];
  gn_rtt_report rep;
  W.t_mode = T_SILENT;
  uint64_t t0 = gn_mono_ms();
  ask((const uint8_t(*)[GN_PK_LEN])W.t_id->pk, 1, nonce);
  assert_true(wait_report(nonce, UNREACHABLE_WITHIN_MS + 2000, &rep));
  uint64_t took = gn_mono_ms() - t0;
  print_message("a silent target reported after %llu ms\n", (unsigned long long)took);
  assert_int_equal(rep.count, 1);
  assert_int_equal(rep.results[0].rtt_us, 0);
  assert_string_equal(rep.results[0].error, "unreachable");
  assert_true(took >= GN_RTT_TARGET_MS - 100);
  assert_true(took < UNREACHABLE_WITHIN_MS);
  /* an unanswered PING is sent again every GN_RTT_RESEND_MS, no faster */
  assert_true(W.t_pings >= 2);
  assert_true(W.t_pings <= 1 + (int)(GN_RTT_TARGET_MS / GN_RTT_RESEND_MS));
}

/* 17 targets: refused as a whole, nobody pinged. 16: answered, one each. */
static void test_seventeen_targets_refused(void **state) {
  (void)state;
  uint8_t nonce[GN_RTT_NONCE_LEN], targets[GN_RTT_MAX_TARGETS + 1][GN_PK_LEN];
  gn_rtt_report rep;
  memcpy(targets[0], W.t_id->pk, GN_PK_LEN);
  for (size_t i = 1; i < GN_ARRAY_SIZE(targets); i++)
    randombytes_buf(targets[i], GN_PK_LEN);
  ask((const uint8_t(*)[GN_PK_LEN])targets, GN_RTT_MAX_TARGETS + 1, nonce);
  assert_true(wait_report(nonce, 3000, &rep));
  assert_string_equal(rep.error, "too_many_targets");
  assert_int_equal(rep.count, 0);
  spin(200);
  assert_int_equal(W.t_pings, 0);
  assert_true(log_has("refused an RTT ask from"));

  /* The refusal took no ask (no rate spent): 16 are measured at once. */
  ask((const uint8_t(*)[GN_PK_LEN])targets, GN_RTT_MAX_TARGETS, nonce);
  assert_true(wait_report(nonce, 5000, &rep));
  assert_string_equal(rep.error, "");
  assert_int_equal(rep.count, GN_RTT_MAX_TARGETS);
  const gn_rtt_result *t = result_for(&rep, W.t_id->pk);
  if (t->rtt_us < T_DELAY_MS * 1000u)
    fail_msg("T among 16 targets: %u us (%s)", t->rtt_us, t->error);
  for (size_t i = 1; i < GN_RTT_MAX_TARGETS; i++)
    assert_string_equal(result_for(&rep, targets[i])->error, "unknown");
}

/* A key P does not know: "unknown" at once, nothing dialled; P itself is
 * "self" and a repeated target "duplicate". */
static void test_unknown_target_is_not_dialled(void **state) {
  (void)state;
  uint8_t nonce[GN_RTT_NONCE_LEN], targets[3][GN_PK_LEN];
  gn_rtt_report rep;
  memcpy(targets[0], W.u_pk, GN_PK_LEN);
  memcpy(targets[1], W.prov_id->pk, GN_PK_LEN);
  memcpy(targets[2], W.u_pk, GN_PK_LEN);
  uint64_t t0 = gn_mono_ms();
  ask((const uint8_t(*)[GN_PK_LEN])targets, 3, nonce);
  assert_true(wait_report(nonce, 3000, &rep));
  assert_true(gn_mono_ms() - t0 < 1000); /* nothing to wait for */
  assert_int_equal(rep.count, 3);
  assert_string_equal(rep.results[0].error, "unknown");
  assert_string_equal(rep.results[1].error, "self");
  assert_string_equal(rep.results[2].error, "duplicate");
  assert_true(log_has("3 targets, 0 dialled"));
}

/* One ask per asker at a time, and one started per GN_RTT_ASK_INTERVAL_MS. */
static void test_second_ask_refused(void **state) {
  (void)state;
  uint8_t n1[GN_RTT_NONCE_LEN], n2[GN_RTT_NONCE_LEN], n3[GN_RTT_NONCE_LEN];
  gn_rtt_report rep;
  W.t_mode = T_SILENT;
  ask((const uint8_t(*)[GN_PK_LEN])W.t_id->pk, 1, n1);
  ask((const uint8_t(*)[GN_PK_LEN])W.u_pk, 1, n2);
  assert_true(wait_report(n2, 3000, &rep));
  assert_string_equal(rep.error, "in_progress");
  assert_true(wait_report(n1, UNREACHABLE_WITHIN_MS + 2000, &rep));
  assert_string_equal(rep.error, "");
  assert_string_equal(rep.results[0].error, "unreachable");

  /* An ask answered at once, then another within the interval. */
  spin(GN_RTT_ASK_INTERVAL_MS);
  ask((const uint8_t(*)[GN_PK_LEN])W.u_pk, 1, n1);
  assert_true(wait_report(n1, 3000, &rep));
  assert_string_equal(rep.error, "");
  uint64_t t1 = gn_mono_ms();
  ask((const uint8_t(*)[GN_PK_LEN])W.u_pk, 1, n2);
  assert_true(wait_report(n2, 3000, &rep));
  if (gn_mono_ms() - t1 < GN_RTT_ASK_INTERVAL_MS - 200)
    assert_string_equal(rep.error, "rate");
  /* Past the interval, asked again. */
  spin(GN_RTT_ASK_INTERVAL_MS + 100);
  ask((const uint8_t(*)[GN_PK_LEN])W.u_pk, 1, n3);
  assert_true(wait_report(n3, 3000, &rep));
  assert_string_equal(rep.error, "");
  assert_string_equal(rep.results[0].error, "unknown");
}

/* A PING of a fresh nonce from R to P. */
static void r_ping(void) {
  uint8_t nonce[GN_RTT_NONCE_LEN];
  gn_wire_writer w;
  randombytes_buf(nonce, sizeof nonce);
  gn_wire_writer_init(&w);
  assert_int_equal(gn__rtt_ping_encode(nonce, &w), 0);
  send_body(W.r_tp, W.r_id, W.prov_id->pk, GN_MSG_RTT_PING, &w);
  gn_wire_writer_done(&w);
}

/* 200 PINGs at once: answered up to the burst and the rate, the rest
 * dropped; the session stays up and answers again later. */
static void test_ping_flood_is_capped(void **state) {
  (void)state;
  const int flood = 200;
  uint64_t t0 = gn_mono_ms();
  for (int i = 0; i < flood; i++) {
    r_ping();
  }
  spin(500);
  double elapsed_s = (double)(gn_mono_ms() - t0) / 1000.0;
  int cap = (int)GN_RTT_PONG_BURST + (int)(GN_RTT_PONG_PER_S * elapsed_s) + 1;
  print_message("%d PINGs in %.2f s: %d PONGs (cap %d)\n", flood, elapsed_s, W.r_pongs, cap);
  assert_true(W.r_pongs >= (int)GN_RTT_PONG_BURST);
  assert_true(W.r_pongs <= cap);
  /* A second later the bucket has refilled. */
  int before = W.r_pongs;
  spin(1000);
  r_ping();
  spin(300);
  assert_int_equal(W.r_pongs, before + 1);
}

/* T answers every PING with a PONG of another nonce, and R sends P PONGs of
 * its own: none counts, T is unreachable. */
static void test_forged_pong_is_ignored(void **state) {
  (void)state;
  uint8_t nonce[GN_RTT_NONCE_LEN];
  gn_rtt_report rep;
  W.t_mode = T_FORGE;
  ask((const uint8_t(*)[GN_PK_LEN])W.t_id->pk, 1, nonce);
  for (int i = 0; i < 5; i++) {
    uint8_t n[GN_RTT_NONCE_LEN];
    randombytes_buf(n, sizeof n);
    send_pong(W.r_tp, W.r_id, W.prov_id->pk, n);
  }
  assert_true(wait_report(nonce, UNREACHABLE_WITHIN_MS + 2000, &rep));
  assert_int_equal(rep.count, 1);
  assert_int_equal(rep.results[0].rtt_us, 0);
  assert_string_equal(rep.results[0].error, "unreachable");
  assert_true(W.t_pings >= 1 && W.t_pings <= 1 + (int)(GN_RTT_TARGET_MS / GN_RTT_RESEND_MS));
  assert_true(log_has("answers no ping in flight"));
}

/* GN_RTT_MAX_ASKS askers each with an ask in flight: a fifth asker is
 * refused "busy", and that refusal spends none of its rate. */
static void test_global_cap_refuses_busy(void **state) {
  (void)state;
  uint8_t nonces[N_ASKERS][GN_RTT_NONCE_LEN], nonce[GN_RTT_NONCE_LEN];
  gn_rtt_report rep;
  gn_transport_cbs cbs = {.on_peer_up = on_up, .on_peer_down = on_down, .on_message = on_msg};
  W.t_mode = T_SILENT;
  for (size_t i = 0; i < N_ASKERS; i++) {
    assert_int_equal(gn_identity_generate(&W.a_id[i]), 0);
    assert_int_equal(gn_transport_new(&W.loop, W.a_id[i], &cbs, &TAG_A, &W.a_tp[i]), 0);
    gn_transport_connect(W.a_tp[i], W.addr);
  }
  for (int i = 0; i < 250 && W.a_up < N_ASKERS; i++)
    spin(20);
  assert_int_equal(W.a_up, N_ASKERS);
  for (size_t i = 0; i < N_ASKERS; i++) {
    randombytes_buf(nonces[i], GN_RTT_NONCE_LEN);
    ask_from(W.a_tp[i], W.a_id[i], nonces[i], (const uint8_t(*)[GN_PK_LEN])W.t_id->pk, 1);
  }
  spin(200); /* all taken before R's */
  ask((const uint8_t(*)[GN_PK_LEN])W.u_pk, 1, nonce);
  assert_true(wait_report(nonce, 3000, &rep));
  assert_string_equal(rep.error, "busy");
  /* The four are measured (T is silent: unreachable), each answered. */
  size_t got = 0;
  for (size_t i = 0; i < N_ASKERS; i++) {
    tn_msg m;
    if (!tn_wait_msg(&W.loop, &W.a_in, GN_MSG_RTT_REPORT, NULL, NULL, UNREACHABLE_WITHIN_MS + 2000, &m))
      break;
    gn_envelope env;
    assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &env), 0);
    assert_int_equal(gn__rtt_report_decode(env.body, env.body_len, &rep), 0);
    for (size_t k = 0; k < N_ASKERS; k++)
      if (memcmp(rep.nonce, nonces[k], GN_RTT_NONCE_LEN) == 0) {
        assert_string_equal(rep.error, "");
        assert_string_equal(rep.results[0].error, "unreachable");
        got++;
      }
    gn_buf_done(&m.raw);
  }
  assert_int_equal(got, N_ASKERS);
  ask((const uint8_t(*)[GN_PK_LEN])W.u_pk, 1, nonce);
  assert_true(wait_report(nonce, 3000, &rep));
  assert_string_equal(rep.error, "");
  assert_string_equal(rep.results[0].error, "unknown");
}

/* --- the requester's matrix -------------------------------------------------*/

/* T dials R (the in-process node's transport) and waits for the session. */
static void t_dials_r(void) {
  gn_transport_connect(W.t_tp, gn_transport_listen_addr(W.r_tp));
  for (int i = 0; i < 100 && !gn_transport_is_up(W.r_tp, W.t_id->pk); i++)
    spin(20);
  assert_true(gn_transport_is_up(W.r_tp, W.t_id->pk));
}

/* A node that does not provide refuses an ask: "not_provider". */
static void test_requester_refuses_asks(void **state) {
  (void)state;
  t_dials_r();
  W.node_on = true;
  uint8_t nonce[GN_RTT_NONCE_LEN];
  gn_rtt_ask a;
  gn_wire_writer w;
  memset(&a, 0, sizeof a);
  randombytes_buf(a.nonce, sizeof a.nonce);
  memcpy(nonce, a.nonce, sizeof nonce);
  a.count = 1;
  memcpy(a.targets[0], W.prov_id->pk, GN_PK_LEN);
  gn_wire_writer_init(&w);
  assert_int_equal(gn__rtt_ask_encode(&a, &w), 0);
  send_body(W.t_tp, W.t_id, W.r_id->pk, GN_MSG_RTT_ASK, &w);
  gn_wire_writer_done(&w);
  tn_msg m;
  assert_true(tn_wait_msg(&W.loop, &W.t_in, GN_MSG_RTT_REPORT, NULL, NULL, 3000, &m));
  gn_envelope env;
  gn_rtt_report rep;
  assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &env), 0);
  assert_int_equal(gn__rtt_report_decode(env.body, env.body_len, &rep), 0);
  assert_memory_equal(rep.nonce, nonce, GN_RTT_NONCE_LEN);
  assert_string_equal(rep.error, "not_provider");
  assert_int_equal(rep.count, 0);
  gn_buf_done(&m.raw);
}

static void on_done(gn_node *n, void *ud, const uint32_t *rtt_us) {
  assert_ptr_equal(n, &W.node);
  assert_ptr_equal(ud, &W);
  W.done_calls++;
  W.done_at = gn_mono_ms();
  memcpy(W.done_rtt, rtt_us, sizeof W.done_rtt);
}

static bool done_called(void *ud) {
  (void)ud;
  return W.done_calls > 0;
}

/* T's answer to R's ask, as a liar: P at 5 us, an id not asked, P again. */
static void t_answers_lying(void) {
  tn_msg m;
  assert_true(tn_wait_msg(&W.loop, &W.t_in, GN_MSG_RTT_ASK, NULL, NULL, 5000, &m));
  gn_envelope env;
  gn_rtt_ask a;
  assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &env), 0);
  assert_int_equal(gn__rtt_ask_decode(env.body, env.body_len, &a), 0);
  assert_int_equal(a.count, 1);
  assert_memory_equal(a.targets[0], W.prov_id->pk, GN_PK_LEN);
  gn_rtt_report rep;
  memset(&rep, 0, sizeof rep);
  memcpy(rep.nonce, a.nonce, GN_RTT_NONCE_LEN);
  rep.count = 3;
  memcpy(rep.results[0].id, W.u_pk, GN_PK_LEN); /* not asked */
  rep.results[0].rtt_us = 1;
  memcpy(rep.results[1].id, W.prov_id->pk, GN_PK_LEN);
  rep.results[1].rtt_us = 5;
  memcpy(rep.results[2].id, W.prov_id->pk, GN_PK_LEN); /* a second answer for P: ignored */
  rep.results[2].rtt_us = 9000000;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  assert_int_equal(gn__rtt_report_encode(&rep, &w), 0);
  send_body(W.t_tp, W.t_id, W.r_id->pk, GN_MSG_RTT_REPORT, &w);
  gn_wire_writer_done(&w);
  gn_buf_done(&m.raw);
}

/* P measures T (60 ms) honestly, T claims 5 us to P: the pair is the larger,
 * both ways; done once. */
static void test_matrix_takes_the_larger_end(void **state) {
  (void)state;
  uint8_t cands[2][GN_PK_LEN];
  memcpy(cands[0], W.prov_id->pk, GN_PK_LEN);
  memcpy(cands[1], W.t_id->pk, GN_PK_LEN);
  t_dials_r(); /* T needs a session with R for R's ask */
  W.node_on = true;
  uint64_t t0 = gn_mono_ms();
  int h = gn__rtt_matrix_begin(&W.node, (const uint8_t(*)[GN_PK_LEN])cands, 2, 8000, on_done, &W);
  assert_true(h > 0);
  assert_int_equal(W.done_calls, 0); /* never from within begin */
  t_answers_lying();
  assert_true(tn_run_until(&W.loop, done_called, NULL, 8000));
  print_message("matrix of P and T: %u us (after %llu ms)\n", W.done_rtt[1], (unsigned long long)(W.done_at - t0));
  assert_int_equal(W.done_rtt[0], 0);
  assert_int_equal(W.done_rtt[3], 0);
  assert_int_equal(W.done_rtt[1], W.done_rtt[2]);
  assert_true(W.done_rtt[1] >= T_DELAY_MS * 1000u && W.done_rtt[1] < RTT_LOOSE_US);
  assert_true(W.done_at - t0 < 5000); /* both answered: not held to the timeout */
  spin(300);
  assert_int_equal(W.done_calls, 1);
  gn__rtt_matrix_cancel(&W.node, h); /* done already: harmless */
}

/* U never answers (R cannot even reach it): done at the timeout, once, with
 * what P said of U ("unknown": nothing). A cancelled matrix is never done. */
static void test_matrix_ends_at_its_timeout(void **state) {
  (void)state;
  uint8_t cands[2][GN_PK_LEN];
  memcpy(cands[0], W.prov_id->pk, GN_PK_LEN);
  memcpy(cands[1], W.u_pk, GN_PK_LEN);
  W.node_on = true;
  assert_int_equal(gn__rtt_matrix_begin(&W.node, (const uint8_t(*)[GN_PK_LEN])cands, 1, 1000, on_done, &W), GN_EINVAL);
  uint8_t dup[2][GN_PK_LEN];
  memcpy(dup[0], W.u_pk, GN_PK_LEN);
  memcpy(dup[1], W.u_pk, GN_PK_LEN);
  assert_int_equal(gn__rtt_matrix_begin(&W.node, (const uint8_t(*)[GN_PK_LEN])dup, 2, 1000, on_done, &W), GN_EINVAL);
  uint64_t t0 = gn_mono_ms();
  int h = gn__rtt_matrix_begin(&W.node, (const uint8_t(*)[GN_PK_LEN])cands, 2, 1000, on_done, &W);
  assert_true(h > 0);
  assert_true(tn_run_until(&W.loop, done_called, NULL, 5000));
  uint64_t took = W.done_at - t0;
  print_message("matrix with a silent candidate done after %llu ms (timeout 1000)\n", (unsigned long long)took);
  assert_true(took >= 1000 && took < 2000);
  assert_int_equal(W.done_rtt[1], 0);
  assert_int_equal(W.done_rtt[2], 0);
  spin(300);
  assert_int_equal(W.done_calls, 1);

  /* Cancelled: never called. */
  h = gn__rtt_matrix_begin(&W.node, (const uint8_t(*)[GN_PK_LEN])cands, 2, 200, on_done, &W);
  assert_true(h > 0);
  gn__rtt_matrix_cancel(&W.node, h);
  spin(600);
  assert_int_equal(W.done_calls, 1);
}

/* --- pure ---------------------------------------------------------------------*/

static void test_combine(void **state) {
  (void)state;
  /* 3 candidates: 0->1 100, 1->0 300 (both: the larger), 0->2 50 only,
   * 1<->2 nothing, the diagonal whatever was put there. */
  const uint32_t dir[9] = {7, 100, 50, 300, 7, 0, 0, 0, 7};
  uint32_t out[9];
  gn__rtt_combine(3, dir, out);
  const uint32_t want[9] = {0, 300, 50, 300, 0, 0, 50, 0, 0};
  assert_memory_equal(out, want, sizeof want);
}

static void test_plan_ms(void **state) {
  (void)state;
  const uint32_t us[9] = {0, 1, 1000, 1, 0, 0, 1000, 0, 0};
  uint32_t ms[9];
  gn__rtt_to_plan_ms(3, us, ms);
  const uint32_t want[9] = {0, 1, 1, 1, 0, GN_RTT_UNKNOWN, 1, GN_RTT_UNKNOWN, 0};
  assert_memory_equal(ms, want, sizeof want);
  const uint32_t us2[4] = {0, 60001, 60001, 0};
  gn__rtt_to_plan_ms(2, us2, ms);
  assert_int_equal(ms[1], 61);
  assert_int_equal(ms[0], 0);
}

static void test_codec(void **state) {
  (void)state;
  gn_wire_writer w;
  gn_buf b = {0};
  gn_rtt_report rep, back;
  memset(&rep, 0, sizeof rep);
  randombytes_buf(rep.nonce, sizeof rep.nonce);
  rep.count = 2;
  rep.results[0].rtt_us = 1234;
  gn__strf(rep.results[1].error, sizeof rep.results[1].error, "unknown");
  gn_wire_writer_init(&w);
  assert_int_equal(gn__rtt_report_encode(&rep, &w), 0);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__rtt_report_decode(b.data, b.len, &back), 0);
  assert_int_equal(back.count, 2);
  assert_int_equal(back.results[0].rtt_us, 1234);
  assert_string_equal(back.results[1].error, "unknown");
  gn_buf_done(&b);

  /* An absurd value is kept as not measured; 17 results are malformed. */
  rep.results[0].rtt_us = GN_RTT_MAX_US + 1;
  assert_int_equal(gn__rtt_report_encode(&rep, &w), 0);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__rtt_report_decode(b.data, b.len, &back), 0);
  assert_int_equal(back.results[0].rtt_us, 0);
  assert_string_equal(back.results[0].error, "absurd");
  gn_buf_done(&b);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, rep.nonce, GN_RTT_NONCE_LEN);
  gn_wire_put_str(&w, "results");
  gn_wire_put_array(&w, GN_RTT_MAX_TARGETS + 1);
  for (int i = 0; i < GN_RTT_MAX_TARGETS + 1; i++) {
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "id");
    gn_wire_put_bin(&w, rep.nonce, GN_RTT_NONCE_LEN); /* and a short id */
    gn_wire_put_str(&w, "rtt_us");
    gn_wire_put_u64(&w, 5);
  }
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  memset(&back, 0x5a, sizeof back);
  assert_int_equal(gn__rtt_report_decode(b.data, b.len, &back), GN_ETOOBIG);
  assert_int_equal(back.count, (size_t)0x5a5a5a5a5a5a5a5aull); /* untouched */
  gn_buf_done(&b);

  /* An ask of 17: GN_ETOOBIG with its nonce, so it can be refused by name;
   * a target that is not 32 bytes: malformed. */
  gn_rtt_ask a;
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, rep.nonce, GN_RTT_NONCE_LEN);
  gn_wire_put_str(&w, "targets");
  gn_wire_put_array(&w, GN_RTT_MAX_TARGETS + 1);
  for (int i = 0; i < GN_RTT_MAX_TARGETS + 1; i++)
    gn_wire_put_bin(&w, W.u_pk, GN_PK_LEN);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__rtt_ask_decode(b.data, b.len, &a), GN_ETOOBIG);
  assert_memory_equal(a.nonce, rep.nonce, GN_RTT_NONCE_LEN);
  assert_int_equal(a.count, 0);
  gn_buf_done(&b);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, rep.nonce, GN_RTT_NONCE_LEN);
  gn_wire_put_str(&w, "targets");
  gn_wire_put_array(&w, 1);
  gn_wire_put_bin(&w, W.u_pk, GN_PK_LEN - 1);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__rtt_ask_decode(b.data, b.len, &a), GN_EINVAL);
  gn_buf_done(&b);
  gn_wire_writer_done(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_combine),
      cmocka_unit_test(test_codec),
      cmocka_unit_test(test_plan_ms),
      cmocka_unit_test_setup_teardown(test_measures_a_slow_peer_and_dials_an_offer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_silent_target_is_unreachable_in_time, setup, teardown),
      cmocka_unit_test_setup_teardown(test_seventeen_targets_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_target_is_not_dialled, setup, teardown),
      cmocka_unit_test_setup_teardown(test_second_ask_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ping_flood_is_capped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_forged_pong_is_ignored, setup, teardown),
      cmocka_unit_test_setup_teardown(test_global_cap_refuses_busy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_requester_refuses_asks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_matrix_takes_the_larger_end, setup, teardown),
      cmocka_unit_test_setup_teardown(test_matrix_ends_at_its_timeout, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
