/* Integration test of the daemon's membership (node/overlay.c): real gpunetd
 * daemons on their own loopback addresses (127.0.0.x) join through one
 * bootstrap node and find each other over UDP; hostile datagrams (a forged
 * sender, garbage, oversized, a flood from one source, many sources) change
 * nothing and the daemon keeps answering; a killed daemon is declared dead
 * and a stopped one is seen leaving; the partial views hold the sessions;
 * overlay = off runs without a UDP socket.
 * Timing: SWIM probes one member a second (500 ms direct wait); a suspicion
 * lasts between alpha x max(1, log10 n) x 1 s and beta times that: at n = 3,
 * 5 s to 30 s, 17.5 s with the other survivor's confirmation, so a killed
 * member is dead everywhere within about 32 s; every wait below polls for
 * its condition up to DEADLINE_MS (60 s) so that a slow run (ASan,
 * two busy cores) passes as a fast one does. */
#include <gpunet/identity.h>
#include <gpunet/node.h>
#include <gpunet/offer.h>
#include <gpunet/swim.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "node/helpers.h"
#include "overlay.h"

#define DEADLINE_MS 60000
#define NODES 3

typedef struct daemon_t {
  char dir[PATH_MAX];
  char addr[64]; /* listen address: TCP and UDP */
  char ip[16];
  int port;
  pid_t pid;
  gn_identity *id;
} daemon_t;

static struct {
  char root[PATH_MAX];
  daemon_t d[NODES];
  /* The attacker's address: 127.0.0.9 (one source for all its datagrams). */
  struct sockaddr_in attacker;
} W;

static void sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* --- daemons ----------------------------------------------------------------*/

static void daemon_start(daemon_t *d, const char *root, const char *name, const char *ip, const char *bootstrap,
                         const char *overlay) {
  snprintf(d->dir, sizeof d->dir, "%s/%s", root, name);
  assert_int_equal(mkdir(d->dir, 0700), 0);
  tn_identity_for(d->dir, &d->id);
  snprintf(d->ip, sizeof d->ip, "%s", ip);
  d->port = tn_free_port();
  snprintf(d->addr, sizeof d->addr, "%s:%d", ip, d->port);
  const char *args[16];
  size_t n = 0;
  args[n++] = "--data-dir";
  args[n++] = d->dir;
  args[n++] = "--listen";
  args[n++] = d->addr;
  args[n++] = "--overlay";
  args[n++] = overlay;
  if (bootstrap) {
    args[n++] = "--bootstrap";
    args[n++] = bootstrap;
  }
  args[n] = NULL;
  d->pid = tn_daemon_spawnv(d->dir, "w", NULL, args);
  uint64_t end = gn_mono_ms() + DEADLINE_MS;
  json_t *j = NULL;
  while (!(j = tn_api_try_get(d->dir, "/v1/status")) && gn_mono_ms() < end)
    sleep_ms(100);
  if (!j) {
    tn_print_log(d->dir, 30);
    fail_msg("gpunetd %s did not answer on its control socket", name);
  }
  json_decref(j);
}

static void daemon_done(daemon_t *d) {
  if (d->pid > 0)
    tn_daemon_stop(d->pid);
  d->pid = 0;
  d->id = gn_identity_free(d->id);
}

/* The daemon's membership counts and datagram figures, from its status. */
typedef struct view_t {
  long long alive, suspect, dead, left, health;
  long long in, oversized, rate_limited, verified, bad_sig, malformed, rejected, not_swim, sources;
} view_t;

static long long jint(const json_t *o, const char *k) {
  return (long long)json_integer_value(json_object_get(o, k));
}

static void view_get(const daemon_t *d, view_t *v) {
  json_t *j = tn_api_get(d->dir, "/v1/status");
  const json_t *m = json_object_get(j, "members"), *g = json_object_get(j, "datagrams");
  if (!json_is_object(m) || !json_is_object(g))
    fail_msg("GET /v1/status of %s has no members or datagrams: overlay %s", d->addr,
             json_string_value(json_object_get(j, "overlay")));
  *v = (view_t){jint(m, "alive"),          jint(m, "suspect"),      jint(m, "dead"),
                jint(m, "left"),           jint(j, "health"),       jint(g, "in"),
                jint(g, "oversized"),      jint(g, "rate_limited"), jint(g, "verified"),
                jint(g, "bad_signature"),  jint(g, "malformed"),    jint(g, "rejected"),
                jint(g, "not_membership"), jint(g, "sources")};
  json_decref(j);
}

/* Polls daemon d until its members by state are as given (-1: any), up to
 * DEADLINE_MS; fails saying what it saw last. */
static void wait_members(const daemon_t *d, long long alive, long long suspect, long long dead, long long left) {
  uint64_t end = gn_mono_ms() + DEADLINE_MS;
  view_t v;
  for (;;) {
    view_get(d, &v);
    if ((alive < 0 || v.alive == alive) && (suspect < 0 || v.suspect == suspect) && (dead < 0 || v.dead == dead) &&
        (left < 0 || v.left == left))
      return;
    if (gn_mono_ms() > end)
      break;
    sleep_ms(200);
  }
  tn_print_log(d->dir, 30);
  fail_msg("%s: members alive %lld suspect %lld dead %lld left %lld after %d s; wanted %lld/%lld/%lld/%lld", d->addr,
           v.alive, v.suspect, v.dead, v.left, DEADLINE_MS / 1000, alive, suspect, dead, left);
}

/* --- the attacker -------------------------------------------------------------*/

/* A UDP socket bound to ip (port picked by the kernel). */
static int udp_from(const char *ip) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  assert_true(fd >= 0);
  assert_int_equal(inet_pton(AF_INET, ip, &a.sin_addr), 1);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

static void send_to(int fd, const daemon_t *d, const void *p, size_t len) {
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->port)};
  assert_int_equal(inet_pton(AF_INET, d->ip, &to.sin_addr), 1);
  assert_int_equal(sendto(fd, p, len, 0, (struct sockaddr *)&to, sizeof to), (ssize_t)len);
}

/* Polls until pred(v) holds for d's figures, up to DEADLINE_MS. */
static bool wait_view(const daemon_t *d, bool (*pred)(const view_t *v, const view_t *before), const view_t *before,
                      view_t *ret) {
  uint64_t end = gn_mono_ms() + DEADLINE_MS;
  do {
    view_get(d, ret);
    if (pred(ret, before))
      return true;
    sleep_ms(100);
  } while (gn_mono_ms() < end);
  return false;
}

/* --- the cluster ----------------------------------------------------------------*/

static int group_setup(void **state) {
  (void)state;
  snprintf(W.root, sizeof W.root, "/tmp/gn-test-overlay-XXXXXX");
  assert_non_null(mkdtemp(W.root));
  static const char *const ips[NODES] = {"127.0.0.2", "127.0.0.3", "127.0.0.4"};
  static const char *const names[NODES] = {"a", "b", "c"};
  for (int i = 0; i < NODES; i++)
    daemon_start(&W.d[i], W.root, names[i], ips[i], i ? W.d[0].addr : NULL, "on");
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = 0; i < NODES; i++)
    daemon_done(&W.d[i]);
  tn_rm_rf(W.root);
  return 0;
}

/* Three daemons that only know the bootstrap node each count all three
 * (themselves too) alive, and list their peers' membership. */
static void test_three_join_through_one_bootstrap(void **state) {
  (void)state;
  for (int i = 0; i < NODES; i++)
    wait_members(&W.d[i], NODES, 0, 0, 0);
  json_t *j = tn_api_get(W.d[1].dir, "/v1/peers");
  const json_t *peers = json_object_get(j, "peers"), *p;
  size_t i, alive = 0;
  json_array_foreach(peers, i, p) alive +=
      strcmp(json_string_value(json_object_get(p, "membership")) ?: "", "alive") == 0;
  assert_true(alive >= 1); /* at least the bootstrap node, over its session */
  json_decref(j);
}

/* The partial views run over the sessions: every daemon has the others in
 * its active view within the deadline (3 nodes, active size 6), and its
 * peers list says so. */
static void test_views_hold_the_bootstrap_session(void **state) {
  (void)state;
  for (int i = 0; i < NODES; i++) {
    uint64_t end = gn_mono_ms() + DEADLINE_MS;
    long long active = -1;
    for (;;) {
      json_t *j = tn_api_get(W.d[i].dir, "/v1/status");
      active = jint(json_object_get(j, "views"), "active");
      json_decref(j);
      if (active >= 1 || gn_mono_ms() > end)
        break;
      sleep_ms(200);
    }
    if (active < 1) {
      tn_print_log(W.d[i].dir, 30);
      fail_msg("%s: no active view member after %d s", W.d[i].addr, DEADLINE_MS / 1000);
    }
  }
  /* b joined through a: a is in b's active view. */
  char aid[GN_NODE_ID_STRLEN];
  gn_node_id_format(W.d[0].id->pk, aid);
  json_t *j = tn_api_get(W.d[1].dir, "/v1/peers");
  const json_t *p;
  size_t i;
  bool seen = false;
  json_array_foreach(json_object_get(j, "peers"), i, p) {
    if (strcmp(json_string_value(json_object_get(p, "node_id")) ?: "", aid) == 0) {
      assert_string_equal(json_string_value(json_object_get(p, "view")) ?: "?", "active");
      seen = true;
    }
  }
  assert_true(seen);
  json_decref(j);
}

static bool grew_malformed(const view_t *v, const view_t *b) {
  return v->malformed > b->malformed;
}

/* Garbage is read, admitted, fails to open as an envelope: counted, and
 * nothing else changes. */
static void test_garbage_datagram_changes_nothing(void **state) {
  (void)state;
  view_t before, after;
  view_get(&W.d[0], &before);
  int fd = udp_from("127.0.0.9");
  uint8_t junk[300];
  randombytes_buf(junk, sizeof junk);
  send_to(fd, &W.d[0], junk, sizeof junk);
  send_to(fd, &W.d[0], "\x95\x01", 2); /* an envelope's start, cut */
  close(fd);
  assert_true(wait_view(&W.d[0], grew_malformed, &before, &after));
  assert_int_equal(after.bad_sig, before.bad_sig);
  wait_members(&W.d[0], NODES, 0, 0, 0);
}

static bool grew_oversized(const view_t *v, const view_t *b) {
  return v->oversized > b->oversized;
}

/* A datagram over 1400 bytes is dropped before anything reads it, even a
 * validly signed one. */
static void test_oversized_datagram_dropped(void **state) {
  (void)state;
  view_t before, after;
  view_get(&W.d[0], &before);
  gn_identity *stranger;
  assert_int_equal(gn_identity_generate(&stranger), 0);
  uint8_t body[1500];
  memset(body, 0xa5, sizeof body);
  gn_buf env = {0};
  assert_int_equal(gn_envelope_seal(stranger, GN_MSG_SWIM_PING, body, sizeof body, &env), 0);
  assert_true(env.len > GN_OVERLAY_DGRAM_MAX);
  int fd = udp_from("127.0.0.9");
  send_to(fd, &W.d[0], env.data, env.len);
  close(fd);
  assert_true(wait_view(&W.d[0], grew_oversized, &before, &after));
  assert_int_equal(after.oversized, before.oversized + 1);
  assert_int_equal(after.malformed, before.malformed);
  assert_int_equal(after.bad_sig, before.bad_sig);
  gn_buf_done(&env);
  stranger = gn_identity_free(stranger);
  wait_members(&W.d[0], NODES, 0, 0, 0);
}

static bool grew_bad_sig(const view_t *v, const view_t *b) {
  return v->bad_sig > b->bad_sig;
}

/* An envelope whose signature does not verify (a byte of its body
 * changed) is counted and dropped. */
static void test_bad_signature_dropped(void **state) {
  (void)state;
  view_t before, after;
  view_get(&W.d[0], &before);
  uint8_t body[64] = {0x80}; /* an empty map, then padding */
  gn_buf env = {0};
  assert_int_equal(gn_envelope_seal(W.d[2].id, GN_MSG_SWIM_PING, body, sizeof body, &env), 0);
  env.data[env.len - GN_SIG_LEN - 10] ^= 1; /* inside the body */
  int fd = udp_from("127.0.0.9");
  send_to(fd, &W.d[0], env.data, env.len);
  close(fd);
  assert_true(wait_view(&W.d[0], grew_bad_sig, &before, &after));
  gn_buf_done(&env);
  wait_members(&W.d[0], NODES, 0, 0, 0);
}

/* --- a forged sender: another node's words under the attacker's key ----------*/

typedef struct capture {
  const char *only; /* the address whose datagrams are kept */
  gn_buf bodies[16];
  uint32_t types[16];
  size_t n;
} capture;

static void cap_send(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  capture *c = ud;
  if (strcmp(addr, c->only) == 0 && c->n < GN_ARRAY_SIZE(c->bodies)) {
    c->types[c->n] = type;
    memset(&c->bodies[c->n], 0, sizeof c->bodies[0]);
    gn_buf_append(&c->bodies[c->n++], body, len);
  }
}

static bool grew_rejected(const view_t *v, const view_t *b) {
  return v->rejected > b->rejected;
}

/* The pings a SWIM machine speaking as node c (c's id in every body) sends
 * to a, carrying news of a member d nobody else knows, sealed by a
 * stranger's key: a refuses them (the body's sender is not the signer) and
 * neither learns d nor changes what it knows of c. */
static void test_forged_sender_changes_nothing(void **state) {
  (void)state;
  daemon_t *a = &W.d[0], *c = &W.d[2];
  capture cap = {.only = a->addr};
  gn_swim_io io = {cap_send, NULL, &cap};
  gn_swim *fake;
  gn_identity *stranger, *d;
  assert_int_equal(gn_identity_generate(&stranger), 0);
  assert_int_equal(gn_identity_generate(&d), 0);
  uint64_t now = gn_mono_ms();
  assert_int_equal(gn_swim_new(c->id->pk, c->addr, NULL, &io, 7, now, &fake), 0);
  assert_int_equal(gn_swim_add(fake, a->id->pk, a->addr, now), 0);
  assert_int_equal(gn_swim_add(fake, d->pk, "127.0.0.10:9", now), 0);
  for (int i = 0; i < 20 && cap.n == 0; i++)
    gn_swim_tick(fake, now + 1000u * (uint64_t)i);
  fake = gn_swim_free(fake);
  assert_true(cap.n > 0);

  view_t before, after;
  view_get(a, &before);
  int fd = udp_from("127.0.0.9");
  for (size_t i = 0; i < cap.n; i++) {
    gn_buf env = {0};
    assert_int_equal(gn_envelope_seal(stranger, cap.types[i], cap.bodies[i].data, cap.bodies[i].len, &env), 0);
    send_to(fd, a, env.data, env.len);
    gn_buf_done(&env);
    gn_buf_done(&cap.bodies[i]);
  }
  close(fd);
  assert_true(wait_view(a, grew_rejected, &before, &after));
  assert_int_equal(after.alive, NODES);
  char did[GN_NODE_ID_STRLEN];
  gn_node_id_format(d->pk, did);
  json_t *j = tn_api_get(a->dir, "/v1/members");
  const json_t *m;
  size_t i;
  json_array_foreach(json_object_get(j, "members"), i, m) {
    assert_string_not_equal(json_string_value(json_object_get(m, "node_id")) ?: "", did);
    assert_string_equal(json_string_value(json_object_get(m, "state")) ?: "?", "alive");
  }
  assert_int_equal(json_array_size(json_object_get(j, "members")), NODES - 1);
  json_decref(j);
  stranger = gn_identity_free(stranger);
  d = gn_identity_free(d);
  wait_members(a, NODES, 0, 0, 0);
}

/* --- floods ----------------------------------------------------------------------*/

/* 10,000 validly signed datagrams from one source, paced (10 every 5 ms,
 * about 5 s) so that the kernel's socket buffer does not drop them before
 * the daemon sees them: at most the source's burst plus its rate over the
 * flood reach signature verification; the rest are refused by their
 * token; the other members stay alive and the control API answers. */
static void test_flood_from_one_source_is_rate_limited(void **state) {
  (void)state;
  daemon_t *a = &W.d[0];
  view_t before, after, base;
  /* The members' own traffic (probes, gossip, acks) goes on meanwhile:
   * measure its rate first, so that it is neither taken for the flood's
   * backlog nor counted against the limiter. */
  view_get(a, &base);
  uint64_t tb = gn_mono_ms();
  sleep_ms(2000);
  view_get(a, &before);
  double own_per_ms = (double)(before.in - base.in) / (double)(gn_mono_ms() - tb);
  gn_identity *stranger;
  assert_int_equal(gn_identity_generate(&stranger), 0);
  uint8_t body[100];
  memset(body, 0x80, sizeof body);
  gn_buf env = {0};
  assert_int_equal(gn_envelope_seal(stranger, GN_MSG_SWIM_PING, body, sizeof body, &env), 0);
  int fd = udp_from("127.0.0.9");
  uint64_t t0 = gn_mono_ms();
  for (int i = 0; i < 10000; i++) {
    send_to(fd, a, env.data, env.len);
    if (i % 10 == 9)
      sleep_ms(5);
  }
  uint64_t flood_ms = gn_mono_ms() - t0;
  close(fd);
  gn_buf_done(&env);
  stranger = gn_identity_free(stranger);
  /* Everything sent has been read once the count grows no faster than the
   * members' own traffic (with room for its bursts). */
  view_get(a, &after);
  uint64_t end = gn_mono_ms() + DEADLINE_MS;
  for (long long last = -1; gn_mono_ms() < end;) {
    last = after.in;
    sleep_ms(500);
    view_get(a, &after);
    if ((double)(after.in - last) <= own_per_ms * 500.0 * 2.0 + 20.0)
      break;
  }
  uint64_t total_ms = gn_mono_ms() - t0;
  long long in = after.in - before.in, verified = after.verified - before.verified;
  long long limited = after.rate_limited - before.rate_limited;
  long long own = (long long)(own_per_ms * (double)total_ms * 1.5) + 50;
  /* The flood's share of verifications: burst + rate x its duration (plus
   * one second), and the members' own traffic besides. */
  long long bound = GN_OVERLAY_SRC_BURST + GN_OVERLAY_SRC_RATE_PER_S * (long long)(flood_ms / 1000 + 1) + own;
  print_message("flood: %lld read in %llu ms, %lld verified, %lld refused by the source's bucket (bound %lld, "
                "members' own %.1f/s)\n",
                in, (unsigned long long)flood_ms, verified, limited, bound, own_per_ms * 1000.0);
  assert_true(in >= 2000); /* enough of the flood arrived: the test measures the limiter, not the kernel */
  assert_true(verified <= bound);
  assert_true(limited >= in - bound);
  wait_members(a, NODES, 0, 0, 0);
}

/* One datagram from each of 1,100 source addresses (127.1.x.y), in
 * batches of 100 that the daemon has read before the next is sent: the
 * table of sources holds at most GN_OVERLAY_SRC_MAX of them. */
static void test_many_sources_table_is_bounded(void **state) {
  (void)state;
  daemon_t *a = &W.d[0];
  view_t before, after;
  view_get(a, &before);
  for (int i = 0; i < 1100; i++) {
    char ip[32];
    snprintf(ip, sizeof ip, "127.1.%d.%d", i / 250, i % 250 + 1);
    int fd = udp_from(ip);
    send_to(fd, a, "x", 1);
    close(fd);
    if (i % 100 == 99) {
      uint64_t end = gn_mono_ms() + DEADLINE_MS;
      do {
        view_get(a, &after);
        if (after.malformed - before.malformed >= i + 1)
          break;
        sleep_ms(50);
      } while (gn_mono_ms() < end);
    }
  }
  view_get(a, &after);
  print_message("sources: %lld remembered after 1100 (%lld read)\n", after.sources, after.malformed - before.malformed);
  assert_true(after.malformed - before.malformed >= 1050); /* more sources than the table holds */
  assert_true(after.sources <= GN_OVERLAY_SRC_MAX);
  wait_members(a, NODES, 0, 0, 0);
}

/* --- failures ------------------------------------------------------------------*/

/* d's state for member id in GET /v1/members ("" when not a member). */
static void member_state(const daemon_t *d, const uint8_t id[GN_PK_LEN], char *out, size_t cap) {
  char want[GN_NODE_ID_STRLEN];
  gn_node_id_format(id, want);
  json_t *j = tn_api_get(d->dir, "/v1/members");
  const json_t *m;
  size_t i;
  snprintf(out, cap, "%s", "");
  json_array_foreach(json_object_get(j, "members"), i, m) {
    if (strcmp(json_string_value(json_object_get(m, "node_id")) ?: "", want) == 0)
      snprintf(out, cap, "%s", json_string_value(json_object_get(m, "state")) ?: "");
  }
  json_decref(j);
}

/* Polls until d holds member id in state, up to DEADLINE_MS; the played
 * peers' loop runs meanwhile (loop may be NULL). */
static void wait_member_state(uv_loop_t *loop, const daemon_t *d, const uint8_t id[GN_PK_LEN], const char *state) {
  uint64_t end = gn_mono_ms() + DEADLINE_MS;
  char st[16] = "";
  for (;;) {
    member_state(d, id, st, sizeof st);
    if (strcmp(st, state) == 0)
      return;
    if (gn_mono_ms() > end)
      break;
    if (loop) {
      static int never;
      tn_run_until_flag(loop, &never, 200);
    } else {
      sleep_ms(200);
    }
  }
  tn_print_log(d->dir, 30);
  fail_msg("%s: member is '%s' after %d s, wanted %s", d->addr, st, DEADLINE_MS / 1000, state);
}

/* Whether d's offer table holds an offer of provider pk. */
static bool has_offer_of(const daemon_t *d, const uint8_t pk[GN_PK_LEN]) {
  char want[GN_NODE_ID_STRLEN];
  gn_node_id_format(pk, want);
  json_t *j = tn_api_get(d->dir, "/v1/offers");
  const json_t *o;
  size_t i;
  bool found = false;
  json_array_foreach(json_object_get(j, "offers"), i, o) found =
      found || strcmp(json_string_value(json_object_get(o, "provider")) ?: "", want) == 0;
  json_decref(j);
  return found;
}

typedef struct offer_wait {
  const daemon_t *d;
  const uint8_t *pk;
  bool present;
  uint64_t next_ms;
} offer_wait;

static bool offer_is(void *ud) {
  offer_wait *w = ud;
  if (gn_mono_ms() < w->next_ms)
    return false;
  w->next_ms = gn_mono_ms() + 200;
  return has_offer_of(w->d, w->pk) == w->present;
}

/* Two played peers that never answer over UDP, so that the daemons
 * declare them dead (their probes fail: at n = 5, within 30 s): p, whose
 * session to a stays up, and q, whose session was closed and whose offer
 * p relays afterwards. a keeps p's offer (a session vouches for p: its
 * death is only the membership's word) and drops q's (nothing vouches for
 * q any more). */
static void test_dead_member_loses_offers_only_without_session(void **state) {
  (void)state;
  daemon_t *a = &W.d[0];
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  int p_up = 0, q_up = 0;
  tn_inbox in = {0};
  tn_link pl = {&p_up, &in, a->id->pk}, ql = {&q_up, &in, a->id->pk};
  gn_identity *p_id = NULL, *q_id = NULL;
  gn_transport *p_tp, *q_tp;
  tn_peer_new(&loop, &pl, &p_id, &p_tp);
  tn_peer_new(&loop, &ql, &q_id, &q_tp);
  /* Listening addresses that no UDP socket answers on. */
  assert_int_equal(gn_transport_listen(p_tp, "127.0.0.11:0"), 0);
  assert_int_equal(gn_transport_listen(q_tp, "127.0.0.12:0"), 0);
  tn_dial(&loop, q_tp, a->addr, &q_up, a->dir);
  wait_member_state(&loop, a, q_id->pk, "alive");
  gn_transport_close(q_tp, NULL, NULL);
  q_tp = NULL;
  tn_run_until(&loop, tn__flag_set, &(int){0}, 300);
  tn_dial(&loop, p_tp, a->addr, &p_up, a->dir);
  gn_offer o;
  gn_buf env = {0};
  tn_offer(&o, p_id->pk, gn_transport_listen_addr(p_tp), 1, 600, true);
  assert_int_equal(gn_offer_seal(p_id, &o, &env), 0);
  assert_int_equal(gn_transport_send(p_tp, a->id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  tn_offer(&o, q_id->pk, "127.0.0.12:9", 1, 600, true);
  assert_int_equal(gn_offer_seal(q_id, &o, &env), 0);
  assert_int_equal(gn_transport_send(p_tp, a->id->pk, env.data, env.len), 0); /* relayed by p */
  gn_buf_done(&env);
  offer_wait w = {a, q_id->pk, true, 0};
  assert_true(tn_run_until(&loop, offer_is, &w, DEADLINE_MS));
  w = (offer_wait){a, p_id->pk, true, 0};
  assert_true(tn_run_until(&loop, offer_is, &w, DEADLINE_MS));

  wait_member_state(&loop, a, q_id->pk, "dead");
  wait_member_state(&loop, a, p_id->pk, "dead");
  assert_true(p_up);
  w = (offer_wait){a, q_id->pk, false, 0};
  assert_true(tn_run_until(&loop, offer_is, &w, DEADLINE_MS));
  assert_true(has_offer_of(a, p_id->pk));
  assert_true(tn_log_has(a->dir, "its session is up: its offers stay"));

  gn_transport_close(p_tp, NULL, NULL);
  tn_run_until(&loop, tn__flag_set, &(int){0}, 300);
  tn_inbox_done(&in);
  assert_int_equal(uv_loop_close(&loop), 0);
  p_id = gn_identity_free(p_id);
  q_id = gn_identity_free(q_id);
}

/* SIGKILL of c: a and b declare it dead (suspicion at n = 3: 5 to 30 s,
 * after a probe of 1 s; polled up to 60 s). */
static void test_killed_daemon_is_declared_dead(void **state) {
  (void)state;
  daemon_t *c = &W.d[2];
  kill(c->pid, SIGKILL);
  waitpid(c->pid, NULL, 0);
  c->pid = 0;
  wait_member_state(NULL, &W.d[0], c->id->pk, "dead");
  wait_member_state(NULL, &W.d[1], c->id->pk, "dead");
  char cid[GN_NODE_ID_STRLEN], line[128];
  gn_node_id_format(c->id->pk, cid);
  snprintf(line, sizeof line, "overlay: %s is dead", cid);
  assert_true(tn_log_has(W.d[0].dir, line));
}

/* SIGTERM of b: its leave reaches a, which counts it left (not dead). */
static void test_stopped_daemon_is_seen_leaving(void **state) {
  (void)state;
  daemon_t *b = &W.d[1];
  tn_daemon_stop(b->pid);
  b->pid = 0;
  wait_member_state(NULL, &W.d[0], b->id->pk, "left");
}

/* --- overlay = off -------------------------------------------------------------*/

/* Two daemons with overlay = off: no membership in their status, no UDP
 * socket on their port (the test binds it), and they still connect. */
static void test_overlay_off_runs_without_membership(void **state) {
  (void)state;
  char root[PATH_MAX];
  snprintf(root, sizeof root, "/tmp/gn-test-overlay-off-XXXXXX");
  assert_non_null(mkdtemp(root));
  daemon_t d[2];
  memset(d, 0, sizeof d);
  daemon_start(&d[0], root, "x", "127.0.0.5", NULL, "off");
  daemon_start(&d[1], root, "y", "127.0.0.6", d[0].addr, "off");
  uint64_t end = gn_mono_ms() + DEADLINE_MS;
  long long peers = 0;
  json_t *j = NULL;
  while (gn_mono_ms() < end) {
    j = tn_api_get(d[1].dir, "/v1/status");
    peers = jint(j, "peers");
    if (peers >= 1)
      break;
    json_decref(j);
    j = NULL;
    sleep_ms(200);
  }
  assert_non_null(j);
  assert_true(peers >= 1);
  assert_string_equal(json_string_value(json_object_get(j, "overlay")), "off");
  assert_null(json_object_get(j, "members"));
  json_decref(j);
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d[0].port)};
  inet_pton(AF_INET, d[0].ip, &a.sin_addr);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  close(fd);
  daemon_done(&d[0]);
  daemon_done(&d[1]);
  tn_rm_rf(root);
}

/* The config key: on/off (and the other booleans' words), default on,
 * anything else refused saying what it wants. */
static void test_config_overlay_key(void **state) {
  (void)state;
  gn_config cfg;
  char err[256] = "";
  gn_config_defaults(&cfg);
  assert_true(cfg.overlay);
  char *off[] = {"gpunetd", "--overlay", "off", NULL};
  assert_int_equal(gn_config_parse_args(&cfg, 3, off, err, sizeof err), 0);
  assert_false(cfg.overlay);
  char *bad[] = {"gpunetd", "--overlay", "maybe", NULL};
  assert_int_equal(gn_config_parse_args(&cfg, 3, bad, err, sizeof err), GN_EINVAL);
  assert_non_null(strstr(err, "overlay must be on or off"));
  assert_false(cfg.overlay);
  gn_config_done(&cfg);
}

int main(void) {
  const struct CMUnitTest cluster[] = {
      cmocka_unit_test(test_three_join_through_one_bootstrap),
      cmocka_unit_test(test_views_hold_the_bootstrap_session),
      cmocka_unit_test(test_garbage_datagram_changes_nothing),
      cmocka_unit_test(test_oversized_datagram_dropped),
      cmocka_unit_test(test_bad_signature_dropped),
      cmocka_unit_test(test_forged_sender_changes_nothing),
      cmocka_unit_test(test_flood_from_one_source_is_rate_limited),
      cmocka_unit_test(test_many_sources_table_is_bounded),
      cmocka_unit_test(test_dead_member_loses_offers_only_without_session),
      cmocka_unit_test(test_killed_daemon_is_declared_dead),
      cmocka_unit_test(test_stopped_daemon_is_seen_leaving),
  };
  const struct CMUnitTest alone[] = {
      cmocka_unit_test(test_overlay_off_runs_without_membership),
      cmocka_unit_test(test_config_overlay_key),
  };
  curl_global_init(CURL_GLOBAL_DEFAULT);
  int r = cmocka_run_group_tests_name("overlay off", alone, NULL, NULL);
  r += cmocka_run_group_tests_name("overlay cluster", cluster, group_setup, group_teardown);
  curl_global_cleanup();
  return r;
}
