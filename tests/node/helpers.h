/* Test helpers for the node tests that speak the wire protocol to a real
 * gpunetd over real Noise sessions: an inbox of protocol messages, running
 * the loop until something happens, free ports, starting and stopping the
 * daemon, a played peer's transport, reading a field of a message, lease
 * terms, renting, job manifests and statuses, calls to the control API,
 * and running the gpunet CLI.
 * Header-only (static functions): each test program includes it once, after
 * cmocka.h. */
#ifndef GN_TEST_NODE_HELPERS_H
#define GN_TEST_NODE_HELPERS_H

#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include "free_port.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

/* One protocol message a test received: its type, sender and bytes. */
typedef struct tn_msg {
  uint32_t type;
  uint8_t peer[GN_PK_LEN];
  gn_buf raw;
} tn_msg;

typedef struct tn_inbox {
  tn_msg m[64];
  size_t n;
} tn_inbox;

/* Keeps a copy of a received message. Discovery traffic (peers, offers:
 * types below 10) is not what these tests look at; a full inbox drops. */
static inline void tn_inbox_add(tn_inbox *in, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                                size_t len) {
  if (env->type < 10 || in->n >= GN_ARRAY_SIZE(in->m))
    return;
  tn_msg *m = &in->m[in->n++];
  memset(m, 0, sizeof *m);
  m->type = env->type;
  memcpy(m->peer, peer, GN_PK_LEN);
  gn_buf_append(&m->raw, raw, len);
}

/* Moves message i out of the inbox into ret (the caller frees ret->raw). */
static inline void tn_inbox_remove(tn_inbox *in, size_t i, tn_msg *ret) {
  *ret = in->m[i];
  memmove(&in->m[i], &in->m[i + 1], (in->n - i - 1) * sizeof in->m[0]);
  in->n--;
}

/* Takes the first message of `type` out of the inbox: 1 if there was one. */
static inline int tn_inbox_take(tn_inbox *in, uint32_t type, tn_msg *ret) {
  for (size_t i = 0; i < in->n; i++) {
    if (in->m[i].type == type) {
      tn_inbox_remove(in, i, ret);
      return 1;
    }
  }
  return 0;
}

static inline bool tn_inbox_has(const tn_inbox *in, uint32_t type) {
  for (size_t i = 0; i < in->n; i++)
    if (in->m[i].type == type)
      return true;
  return false;
}

static inline void tn_inbox_done(tn_inbox *in) {
  for (size_t i = 0; i < in->n; i++)
    gn_buf_done(&in->m[i].raw);
  in->n = 0;
}

static void tn_on_timer(uv_timer_t *t) {
  (void)t;
}

/* Runs the loop until done(ud) is true or timeout_ms passes; a 20 ms timer
 * keeps each turn of the loop short. Returns done(ud). */
static inline bool tn_run_until(uv_loop_t *loop, bool (*done)(void *ud), void *ud, uint64_t timeout_ms) {
  uv_timer_t t;
  uv_timer_init(loop, &t);
  uv_timer_start(&t, tn_on_timer, 20, 20);
  uint64_t end = gn_mono_ms() + timeout_ms;
  bool ok;
  while (!(ok = done(ud)) && gn_mono_ms() < end)
    uv_run(loop, UV_RUN_ONCE);
  uv_timer_stop(&t);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  return ok;
}

static inline bool tn__flag_set(void *ud) {
  return *(int *)ud != 0;
}

/* Runs the loop until *flag is non-zero (a connection up) or timeout_ms. */
static inline void tn_run_until_flag(uv_loop_t *loop, int *flag, uint64_t timeout_ms) {
  tn_run_until(loop, tn__flag_set, flag, timeout_ms);
}

typedef struct tn__wait {
  tn_inbox *in;
  uint32_t type;
  tn_msg *ret;
  int found;
  bool (*stop)(void *ud);
  void *stop_ud;
} tn__wait;

static inline bool tn__wait_done(void *ud) {
  tn__wait *w = ud;
  if (!w->found)
    w->found = tn_inbox_take(w->in, w->type, w->ret);
  return w->found || (w->stop && w->stop(w->stop_ud));
}

/* Runs the loop until a message of `type` is in the inbox (returned, removed
 * from the inbox; the caller frees raw), stop(stop_ud) is true (when stop is
 * not NULL) or timeout_ms passes. Returns 1 when the message came. */
static inline int tn_wait_msg(uv_loop_t *loop, tn_inbox *in, uint32_t type, bool (*stop)(void *), void *stop_ud,
                              uint64_t timeout_ms, tn_msg *ret) {
  tn__wait w = {in, type, ret, 0, stop, stop_ud};
  memset(ret, 0, sizeof *ret); /* defined even when nothing comes */
  tn_run_until(loop, tn__wait_done, &w, timeout_ms);
  return w.found;
}

/* A free port on 127.0.0.1 for a daemon the test starts (free_port.h:
 * below the ephemeral range, so no outgoing connection takes it first). */
static inline int tn_free_port(void) {
  int port = gn_test_free_port();
  assert_true(port > 0);
  return port;
}

/* The gpunetd built beside the tests (GN_BUILD_DIR, set by ctest). */
static inline void tn_gpunetd_path(char *out, size_t cap) {
  const char *bd = getenv("GN_BUILD_DIR");
  assert_non_null(bd);
  snprintf(out, cap, "%s/gpunetd", bd);
}

/* Makes a provider or requester identity and saves it as the daemon's
 * DIR/identity.key, so the test knows the daemon's public key. */
static inline void tn_identity_for(const char *dir, gn_identity **ret) {
  char key[PATH_MAX + 32];
  snprintf(key, sizeof key, "%s/identity.key", dir);
  assert_int_equal(gn_identity_generate(ret), 0);
  assert_int_equal(gn_identity_save(*ret, key), 0);
}

/* Forks gpunetd (tn_gpunetd_path) with args (NULL-terminated, after the
 * program's name; at most 62), its stderr to LOG_DIR/gpunetd.log opened
 * with log_mode ("w" or "a") and env (NAME=VALUE strings, NULL-terminated,
 * or NULL) set in the child only. Returns its pid. */
static inline pid_t tn_daemon_spawnv(const char *log_dir, const char *log_mode, const char *const *env,
                                     const char *const *args) {
  char bin[PATH_MAX], log[PATH_MAX + 32];
  const char *argv[64];
  size_t n = 0;
  tn_gpunetd_path(bin, sizeof bin);
  snprintf(log, sizeof log, "%s/gpunetd.log", log_dir);
  argv[n++] = bin;
  for (size_t i = 0; args[i]; i++) {
    if (n + 1 >= GN_ARRAY_SIZE(argv))
      fail_msg("tn_daemon_spawnv: more than %zu arguments for gpunetd", GN_ARRAY_SIZE(argv) - 2);
    argv[n++] = args[i];
  }
  argv[n] = NULL;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    for (size_t i = 0; env && env[i]; i++)
      if (putenv((char *)env[i]) != 0)
        _exit(127);
    if (!freopen(log, log_mode, stderr))
      _exit(127);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* tn_daemon_spawnv with the arguments as a NULL-terminated list. */
static inline pid_t tn_daemon_spawn(const char *log_dir, const char *log_mode, ...) {
  const char *args[64];
  size_t n = 0;
  va_list ap;
  va_start(ap, log_mode);
  while (n + 1 < GN_ARRAY_SIZE(args) && (args[n] = va_arg(ap, const char *)) != NULL)
    n++;
  va_end(ap);
  args[n] = NULL;
  return tn_daemon_spawnv(log_dir, log_mode, NULL, args);
}

/* Prints the last `lines` lines of LOG_DIR/gpunetd.log to stderr. */
static inline void tn_print_log(const char *log_dir, int lines) {
  char cmd[PATH_MAX + 64];
  snprintf(cmd, sizeof cmd, "tail -n %d %s/gpunetd.log >&2", lines, log_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "(no daemon log)\n");
}

/* Whether LOG_DIR/gpunetd.log has a line with part (lines up to 2 KiB). */
static inline bool tn_log_has(const char *log_dir, const char *part) {
  char path[PATH_MAX + 32], line[2048];
  snprintf(path, sizeof path, "%s/gpunetd.log", log_dir);
  FILE *f = fopen(path, "r");
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f))
    found = strstr(line, part) != NULL;
  if (f)
    fclose(f);
  return found;
}

/* What a played peer's transport reports to: *up is 1 while a session is
 * up (with a peer whose key is `only`, when not NULL), and its messages go
 * to in. Must outlive the transport. */
typedef struct tn_link {
  int *up;
  tn_inbox *in;
  const uint8_t *only; /* GN_PK_LEN bytes, or NULL: any peer */
} tn_link;

static inline void tn__link_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  tn_link *l = ud;
  (void)t, (void)addr;
  if (!l->only || memcmp(peer, l->only, GN_PK_LEN) == 0)
    *l->up = 1;
}

static inline void tn__link_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  tn_link *l = ud;
  (void)t;
  if (!l->only || memcmp(peer, l->only, GN_PK_LEN) == 0)
    *l->up = 0;
}

static inline void tn__link_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env,
                                const uint8_t *raw, size_t len, void *ud) {
  tn_link *l = ud;
  (void)t;
  tn_inbox_add(l->in, peer, env, raw, len);
}

/* A played peer on loop: a new identity to *ret_id (unless *ret_id is
 * already one) and a transport to *ret_tp whose sessions and messages are
 * reported to link. */
static inline void tn_peer_new(uv_loop_t *loop, tn_link *link, gn_identity **ret_id, gn_transport **ret_tp) {
  static const gn_transport_cbs cbs = {tn__link_up, tn__link_down, tn__link_msg};
  if (!*ret_id)
    assert_int_equal(gn_identity_generate(ret_id), 0);
  assert_int_equal(gn_transport_new(loop, *ret_id, &cbs, link, ret_tp), 0);
}

/* Dials addr from tp until *up (set by the transport's on_peer_up), as a
 * daemon just started needs a moment to listen: 50 tries 100 ms apart, each
 * waiting up to 300 ms. When it never comes up the test fails, after the
 * tail of LOG_DIR/gpunetd.log (log_dir not NULL) went to stderr. */
static inline void tn_dial(uv_loop_t *loop, gn_transport *tp, const char *addr, int *up, const char *log_dir) {
  for (int i = 0; i < 50 && !*up; i++) {
    usleep(100000);
    gn_transport_connect(tp, addr);
    tn_run_until_flag(loop, up, 300);
  }
  if (!*up) {
    if (log_dir)
      tn_print_log(log_dir, 40);
    fail_msg("no session with gpunetd at %s after 50 tries", addr);
  }
}

/* An offer by pk at addr: `gpus` free of `gpus` RTX 4090s (simulated or
 * not) at 0.40 EUR an hour for up to 2 hours, seq 1, issued now and valid
 * for ttl_s. */
static inline void tn_offer(gn_offer *o, const uint8_t pk[GN_PK_LEN], const char *addr, uint32_t gpus, int64_t ttl_s,
                            bool simulated) {
  memset(o, 0, sizeof *o);
  memcpy(o->provider, pk, GN_PK_LEN);
  o->seq = 1;
  o->issued_s = gn_unix_s();
  o->expires_s = o->issued_s + ttl_s;
  snprintf(o->addr, sizeof o->addr, "%s", addr);
  snprintf(o->gpu_model, sizeof o->gpu_model, "NVIDIA GeForce RTX 4090");
  o->vram_mib = 24564;
  o->gpus_free = gpus;
  o->gpus_total = gpus;
  o->price_uper_hour = 400000;
  snprintf(o->currency, sizeof o->currency, "EUR");
  o->max_hours = 2;
  o->simulated = simulated;
}

/* SIGTERM to the daemon, and waits for it (nothing when pid <= 0). */
static inline void tn_daemon_stop(pid_t pid) {
  int status = 0;
  if (pid <= 0)
    return;
  kill(pid, SIGTERM);
  waitpid(pid, &status, 0);
}

/* Removes a test's temporary directory: 0, or -1 when rm failed. */
static inline int tn_rm_rf(const char *dir) {
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void tn__closed(void *ud) {
  (void)ud;
}

/* Ends a test's world: closes its transports, runs the loop until they are
 * gone and closes it, stops the daemon, frees what the inbox holds and
 * removes dir. Returns 0, or -1 when dir could not be removed. */
static inline int tn_world_end(uv_loop_t *loop, gn_transport *const *tps, size_t n_tps, pid_t daemon, tn_inbox *in,
                               const char *dir) {
  for (size_t i = 0; i < n_tps; i++)
    gn_transport_close(tps[i], tn__closed, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  tn_daemon_stop(daemon);
  tn_inbox_done(in);
  return tn_rm_rf(dir);
}

/* The string `key` of a message's body ("" when it has none). */
static inline void tn_msg_str(const tn_msg *m, const char *key, char *out, size_t cap) {
  gn_envelope env;
  gn_wire_doc doc;
  out[0] = 0;
  if (gn_envelope_open(m->raw.data, m->raw.len, &env) == 0 && gn_wire_decode(env.body, env.body_len, &doc) == 0) {
    gn_wire_get_str(doc.root, key, out, cap);
    gn_wire_doc_done(&doc);
  }
}

/* The terms of a lease on offer "o-test": `count` simulated or real RTX
 * 4090s at 0.40 EUR an hour for at most an hour, ticks every minute. */
static inline void tn_lease_terms(gn_lease_terms *t, const gn_identity *prov, const gn_identity *req, uint32_t count,
                                  bool simulated) {
  gn_lease_terms_init(t);
  memcpy(t->provider, prov->pk, GN_PK_LEN);
  memcpy(t->requester, req->pk, GN_PK_LEN);
  snprintf(t->offer_id, sizeof t->offer_id, "o-test");
  snprintf(t->gpu_model, sizeof t->gpu_model, "NVIDIA GeForce RTX 4090");
  t->count = count;
  t->price_uper_hour = 400000;
  snprintf(t->currency, sizeof t->currency, "EUR");
  t->max_s = 3600;
  t->interval_s = 60;
  t->requested_s = gn_unix_s();
  t->simulated = simulated;
}

/* A JOB_STOP for job on lease, sealed by signer (the lease holder). */
static inline void tn_job_stop_seal(const gn_identity *signer, const char *lease_id, const char *job_id, gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job_id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(signer, GN_MSG_JOB_STOP, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

/* Seals body as a message of type by signer and sends it over tp to the
 * peer whose key is to. */
static inline void tn_send(gn_transport *tp, const gn_identity *signer, uint32_t type, const gn_buf *body,
                           const uint8_t to[GN_PK_LEN]) {
  gn_buf env = {0};
  assert_int_equal(gn_envelope_seal(signer, type, body->data, body->len, &env), 0);
  assert_int_equal(gn_transport_send(tp, to, env.data, env.len), 0);
  gn_buf_done(&env);
}

/* A LEASE_REJECT or LEASE_RELEASE (type) of lease_id saying reason, sealed
 * by signer and sent over tp to the peer whose key is to. */
static inline void tn_send_lease_end(gn_transport *tp, const gn_identity *signer, uint32_t type, const char *lease_id,
                                     const char *reason, const uint8_t to[GN_PK_LEN]) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  tn_send(tp, signer, type, &body, to);
  gn_buf_done(&body);
}

/* A JOB_OUTPUT_GET or JOB_SEED_GET (type) for job on lease from offset,
 * sealed by signer and sent over tp to the peer whose key is to. */
static inline void tn_send_chunk_get(gn_transport *tp, const gn_identity *signer, uint32_t type, const char *job,
                                     const char *lease, uint64_t offset, const uint8_t to[GN_PK_LEN]) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease);
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, offset);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  tn_send(tp, signer, type, &body, to);
  gn_buf_done(&body);
}

/* Rents t as its requester req over tp from prov: sends the lease request
 * and waits up to 5 s for the LEASE_ACCEPT, whose agreement (for t's lease)
 * goes to ret_ag and, when ret_env is not NULL, its envelope is appended
 * to ret_env. The test fails when none comes or it does not open. */
static inline void tn_rent(uv_loop_t *loop, tn_inbox *in, gn_transport *tp, const gn_identity *req,
                           const gn_identity *prov, const gn_lease_terms *t, gn_agreement *ret_ag, gn_buf *ret_env) {
  gn_buf env = {0};
  tn_msg m;
  assert_int_equal(gn_lease_request_seal(req, t, &env), 0);
  assert_int_equal(gn_transport_send(tp, prov->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  if (!tn_wait_msg(loop, in, GN_MSG_LEASE_ACCEPT, NULL, NULL, 5000, &m))
    fail_msg("no LEASE_ACCEPT for lease %s within 5 s", t->lease_id);
  assert_int_equal(gn_agreement_open(m.raw.data, m.raw.len, ret_ag), 0);
  assert_string_equal(ret_ag->terms.lease_id, t->lease_id);
  if (ret_env)
    gn_buf_append(ret_env, m.raw.data, m.raw.len);
  gn_buf_done(&m.raw);
}

/* A fresh job id, "j-" and 12 hex digits, to ret (cap bytes, 15 at least). */
static inline void tn_job_id(char *ret, size_t cap) {
  uint8_t rnd[6];
  char hex[13];
  assert_true(cap >= 15);
  randombytes_buf(rnd, sizeof rnd);
  sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
  snprintf(ret, cap, "j-%s", hex);
}

/* Runs the loop until the inbox holds a JOB_STATUS of job in state (any
 * state when NULL), which leaves the inbox (others stay), or timeout_ms
 * passes. Its state to ret_state (32 bytes) and reason to ret_reason (256)
 * when not NULL. Returns whether it came. */
static inline bool tn_wait_job_status(uv_loop_t *loop, tn_inbox *in, const char *job, const char *state,
                                      uint64_t timeout_ms, char *ret_state, char *ret_reason) {
  uint64_t end = gn_mono_ms() + timeout_ms;
  for (;;) {
    for (size_t i = 0; i < in->n; i++) {
      char id[64], st[32];
      if (in->m[i].type != GN_MSG_JOB_STATUS)
        continue;
      tn_msg_str(&in->m[i], "job_id", id, sizeof id);
      tn_msg_str(&in->m[i], "state", st, sizeof st);
      if (strcmp(id, job) != 0 || (state && strcmp(st, state) != 0))
        continue;
      if (ret_state)
        snprintf(ret_state, 32, "%s", st);
      if (ret_reason)
        tn_msg_str(&in->m[i], "reason", ret_reason, 256);
      tn_msg taken;
      tn_inbox_remove(in, i, &taken);
      gn_buf_done(&taken.raw);
      return true;
    }
    if (gn_mono_ms() >= end)
      return false;
    tn_run_until_flag(loop, &(int){0}, 50);
  }
}

/* What a job manifest says; any field a hostile requester can choose. */
typedef struct tn_manifest {
  const char *job_id;
  const char *lease_id;
  const char *image;
  const char *const *cmd; /* NULL-terminated; NULL: "true" */
  const char *env;        /* one env entry, or NULL for none */
  uint64_t memory_mib;
  uint64_t pids;
  const uint8_t *nonce; /* 16 bytes; NULL: random ones */
  int64_t issued_s;
  int64_t expires_s;
} tn_manifest;

/* The manifest's body, as a requester sends it (unsigned). */
static inline void tn_manifest_body(const tn_manifest *m, gn_buf *ret) {
  uint8_t nonce[16];
  static const char *const just_true[] = {"true", NULL};
  const char *const *cmd = m->cmd ? m->cmd : just_true;
  uint32_t argc = 0;
  while (cmd[argc])
    argc++;
  if (m->nonce)
    memcpy(nonce, m->nonce, sizeof nonce);
  else
    randombytes_buf(nonce, sizeof nonce);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 12);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, m->job_id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, m->lease_id);
  gn_wire_put_str(&w, "image");
  gn_wire_put_str(&w, m->image);
  gn_wire_put_str(&w, "cmd");
  gn_wire_put_array(&w, argc);
  for (uint32_t i = 0; i < argc; i++)
    gn_wire_put_str(&w, cmd[i]);
  gn_wire_put_str(&w, "env");
  gn_wire_put_array(&w, m->env ? 1 : 0);
  if (m->env)
    gn_wire_put_str(&w, m->env);
  gn_wire_put_str(&w, "memory_mib");
  gn_wire_put_u64(&w, m->memory_mib);
  gn_wire_put_str(&w, "pids");
  gn_wire_put_u64(&w, m->pids);
  gn_wire_put_str(&w, "network");
  gn_wire_put_bool(&w, false);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, nonce, sizeof nonce);
  gn_wire_put_str(&w, "issued_s");
  gn_wire_put_i64(&w, m->issued_s);
  gn_wire_put_str(&w, "expires_s");
  gn_wire_put_i64(&w, m->expires_s);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  assert_int_equal(gn_wire_writer_take(&w, ret), 0);
  gn_wire_writer_done(&w);
}

/* Sends the manifest m, sealed by signer (the lease holder, or anyone a
 * test plays), over tp to the peer whose key is to. */
static inline void tn_manifest_send(gn_transport *tp, const gn_identity *signer, const tn_manifest *m,
                                    const uint8_t to[GN_PK_LEN]) {
  gn_buf body = {0};
  tn_manifest_body(m, &body);
  tn_send(tp, signer, GN_MSG_JOB_MANIFEST, &body, to);
  gn_buf_done(&body);
}

/* One control API call to a daemon, run on its own thread (curl blocks)
 * while the test's loop keeps its played peers going. */
typedef struct tn_call {
  char sock[PATH_MAX + 16]; /* the daemon's control socket */
  char path[64];
  char body[512];
  bool get; /* a GET; else a POST of body */
  pthread_t thread;
  atomic_int done;
  long status; /* 0 when no answer came (30 s at most) */
  gn_buf out;  /* the answer's body, NUL-terminated (the caller frees) */
} tn_call;

static inline size_t tn__call_data(char *p, size_t size, size_t nmemb, void *ud) {
  gn_buf_append(ud, (const uint8_t *)p, size * nmemb);
  return size * nmemb;
}

static inline void *tn__call_main(void *ud) {
  tn_call *c = ud;
  char url[128];
  snprintf(url, sizeof url, "http://x%s", c->path);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, c->sock);
  curl_easy_setopt(h, CURLOPT_URL, url);
  if (!c->get)
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, tn__call_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &c->out);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  if (curl_easy_perform(h) == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
  curl_easy_cleanup(h);
  gn_buf_append(&c->out, (const uint8_t *)"", 1);
  atomic_store(&c->done, 1);
  return NULL;
}

/* Starts a call of path on the daemon at control socket sock: a POST of
 * body, or a GET when body is NULL. tn_call_finish must follow. */
static inline void tn_call_start(tn_call *c, const char *sock, const char *path, const char *body) {
  memset(c, 0, sizeof *c);
  snprintf(c->sock, sizeof c->sock, "%s", sock);
  snprintf(c->path, sizeof c->path, "%s", path);
  snprintf(c->body, sizeof c->body, "%s", body ? body : "");
  c->get = body == NULL;
  assert_int_equal(pthread_create(&c->thread, NULL, tn__call_main, c), 0);
}

/* Whether the call ud (a tn_call, or NULL: no call) has its answer. */
static inline bool tn_call_done(void *ud) {
  const tn_call *c = ud;
  return c && atomic_load(&c->done);
}

/* Runs loop until the call has its answer or timeout_ms passes, then joins
 * its thread (which curl ends within its own 30 s). */
static inline void tn_call_finish(uv_loop_t *loop, tn_call *c, uint64_t timeout_ms) {
  tn_run_until(loop, tn_call_done, c, timeout_ms);
  pthread_join(c->thread, NULL);
}

/* The call ended with status and an answer that mentions part, or the
 * test fails saying what came (GN_TEST_VERBOSE: printed either way). */
static inline void tn_call_expect(const tn_call *c, long status, const char *part) {
  const char *body = (const char *)c->out.data;
  if (getenv("GN_TEST_VERBOSE"))
    printf("%ld %s\n", c->status, body);
  if (c->status != status || !strstr(body, part))
    fail_msg("expected %ld mentioning '%s', got %ld: %s", status, part, c->status, body);
}

/* GET path on the control socket (DIR/gpunetd.sock) of the daemon on dir
 * (10 s at most): its answer parsed, or NULL when none came (curl's code
 * to *ret_rc) or it is not JSON. Blocks: the test's loop does not run. */
static inline json_t *tn__api_get(const char *dir, const char *path, CURLcode *ret_rc) {
  char sock[PATH_MAX + 32], url[256];
  gn_buf body = {0};
  snprintf(sock, sizeof sock, "%s/gpunetd.sock", dir);
  snprintf(url, sizeof url, "http://gpunetd%s", path);
  CURL *c = curl_easy_init();
  assert_non_null(c);
  curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, sock);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, tn__call_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
  *ret_rc = curl_easy_perform(c);
  curl_easy_cleanup(c);
  json_t *j = *ret_rc == CURLE_OK ? json_loadb((const char *)body.data, body.len, 0, NULL) : NULL;
  gn_buf_done(&body);
  return j;
}

/* tn__api_get for a daemon that may not answer yet: NULL then. */
static inline json_t *tn_api_try_get(const char *dir, const char *path) {
  CURLcode rc;
  return tn__api_get(dir, path, &rc);
}

/* tn__api_get for a daemon that must answer: the test fails when no answer
 * comes or it is not JSON. The caller decrefs. */
static inline json_t *tn_api_get(const char *dir, const char *path) {
  CURLcode rc;
  json_t *j = tn__api_get(dir, path, &rc);
  if (rc != CURLE_OK)
    fail_msg("GET %s: %s", path, curl_easy_strerror(rc));
  if (!j)
    fail_msg("GET %s: the answer is not JSON", path);
  return j;
}

/* Reads the file at path into buf (cap bytes, NUL-terminated; cut when
 * longer): "" when it cannot be read. */
static inline void tn_slurp(const char *path, char *buf, size_t cap) {
  FILE *fp = fopen(path, "r");
  size_t n = fp ? fread(buf, 1, cap - 1, fp) : 0;
  buf[n] = '\0';
  if (fp)
    fclose(fp);
}

/* What a run of the gpunet CLI gave: its exit code (-1 when it did not
 * exit) and its stdout and stderr, cut to these buffers. */
typedef struct tn_run {
  int code;
  char out[8192];
  char err[4096];
} tn_run;

/* Runs `'gpunet' LINE` through sh, its stdout and stderr to DIR/out and
 * DIR/err, and reads what it gave into ret. LINE is shell words: quote what
 * needs it. */
static inline void tn_cli_run(const char *gpunet, const char *dir, const char *line, tn_run *ret) {
  char cmd[4096], out[PATH_MAX + 8], err[PATH_MAX + 8];
  snprintf(out, sizeof out, "%s/out", dir);
  snprintf(err, sizeof err, "%s/err", dir);
  if ((size_t)snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", gpunet, line, out, err) >= sizeof cmd)
    fail_msg("tn_cli_run: the command line is longer than %zu bytes", sizeof cmd);
  int st = system(cmd);
  ret->code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  tn_slurp(out, ret->out, sizeof ret->out);
  tn_slurp(err, ret->err, sizeof ret->err);
}

#endif
