/* Test helpers for the node tests that speak the wire protocol to a real
 * gpunetd over real Noise sessions: an inbox of protocol messages, running
 * the loop until something happens, free ports, starting and stopping the
 * daemon, reading a field of a message, lease terms and job manifests.
 * Header-only (static functions): each test program includes it once, after
 * cmocka.h. */
#ifndef GN_TEST_NODE_HELPERS_H
#define GN_TEST_NODE_HELPERS_H

#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
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

/* A port the kernel just handed out on 127.0.0.1, so tests running side by
 * side do not pick the same one. */
static inline int tn_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
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
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
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

#endif
