/* `gpunet train`'s requester side (node/train_req.c, cli/cmd_train.c)
 * against a real requester gpunetd: this test plays three providers over
 * real Noise sessions (each publishes a signed offer that takes training
 * jobs, answers lease requests as told, and reads the manifests it gets),
 * and runs the real gpunet command.
 *   - one provider refuses: the group fails, every lease already agreed is
 *     released at once, no rank starts, the command exits 1 with each
 *     member's reason and nothing was billed (no note was accepted);
 *   - all agree: the plan for 3 providers is printed (table, total price,
 *     RTT matrix), every provider gets one rank's manifest with the job
 *     network (ranks 0..2, world 3, one group, peers' keys and endpoints
 *     consistent), the ranks' exits end the group and release every lease;
 *   - bad command lines exit 2 before anything is sent (the daemon holds no
 *     training job afterwards);
 *   - --restarts 1 and a rank that fails: the requester fetches every old
 *     rank's /output, the restarted ranks' manifests name a seed whose
 *     sha256 and size are those of what was served, each provider fetches
 *     its seed back byte for byte with JOB_SEED_GET; a JOB_SEED_GET from
 *     another provider, for an unknown or an old job gets nothing, one past
 *     the end a refusal; the seed files (0600) are gone once the group
 *     ends, and at the next start those of ended or unknown groups; with
 *     no /output to fetch the restart says it starts from scratch and
 *     names no seed;
 *   - attestation before the leases: every provider attested once; one
 *     answering garbage and one silent are dropped (the plan says why),
 *     the group forms on the others; "attest": false skips it. */
#include <gpunet/attest.h>
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/jobnet.h>
#include <gpunet/offer.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <sodium.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jobmsg.h"
#include "node/helpers.h"

#define NPROV 3
#define OUT_BYTES 40000u

static uint8_t out_byte(uint32_t rank, uint64_t i) {
  return (uint8_t)(rank * 7u + i * 13u + (i >> 8));
}

enum { ACCEPT = 0, REFUSE, HOLD, SILENT };      /* HOLD: agrees, its rank runs until told otherwise */
enum { ATT_HONEST = 0, ATT_GARBAGE, ATT_MUTE }; /* how a provider answers the requester's attestation */

typedef struct fake_prov {
  gn_identity *id;
  gn_transport *tp;
  char addr[64];
  int up;
  int mode;
  int requests, accepted, rejected;
  char lease[GN_LEASE_ID_STRLEN];
  int released;         /* LEASE_RELEASEs of lease */
  uint64_t released_at; /* first one */
  int manifests;
  gn_jobman man; /* the last manifest */
  bool have_man;
  int bills; /* debit notes accepted by the requester (we send none) */
  int stops; /* JOB_STOPs */
  int output_gets;
  uint64_t out_size;  /* its rank's /output: this many bytes (0: OUT_BYTES + rank) */
  bool refuse_output; /* answers JOB_OUTPUT_GET with a refusal */
  bool mute_output;   /* does not answer JOB_OUTPUT_GET */
  char first_job[GN_JOB_ID_STRLEN], first_lease[GN_LEASE_ID_STRLEN];
  uint32_t first_rank; /* of its first manifest */
  int seed_replies;    /* JOB_SEEDs received, the last one: */
  gn_jobmsg seed;
  bool have_seed;
  int attest_mode;
  int challenges; /* ATTEST_CHALLENGEs received */
  gn_attest_prover *pr;
  gn_attest_mem_prover *mpr;
} fake_prov;

static struct {
  char dir[PATH_MAX];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  fake_prov p[NPROV];
  uint64_t refused_at;
  uint8_t req_pk[GN_PK_LEN]; /* the daemon's */
  void (*during)(void);      /* called while a gpunet command runs */
} W;

static fake_prov *prov_of(void *ud) {
  return &W.p[(intptr_t)ud];
}

/* up: a session with gpunetd (the requester), not with anyone else. */
static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)t;
  (void)addr;
  if (memcmp(peer, W.req_pk, GN_PK_LEN) == 0)
    prov_of(ud)->up = 1;
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t;
  if (memcmp(peer, W.req_pk, GN_PK_LEN) == 0)
    prov_of(ud)->up = 0;
}

static void send_body(fake_prov *f, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *w) {
  gn_buf b = {0}, env = {0};
  assert_int_equal(gn_wire_writer_take(w, &b), 0);
  gn_wire_writer_done(w);
  assert_int_equal(gn_envelope_seal(f->id, type, b.data, b.len, &env), 0);
  gn_transport_send(f->tp, peer, env.data, env.len);
  gn_buf_done(&b);
  gn_buf_done(&env);
}

static void job_status(fake_prov *f, const uint8_t peer[GN_PK_LEN], const char *job, const char *lease,
                       const char *state, int64_t code) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 5);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease);
  gn_wire_put_str(&w, "state");
  gn_wire_put_str(&w, state);
  gn_wire_put_str(&w, "exit_code");
  gn_wire_put_i64(&w, code);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, "");
  send_body(f, peer, GN_MSG_JOB_STATUS, &w);
}

/* The requester's attestation of this provider's (simulated) GPU: answered
 * honestly by the CPU prover, with garbage, or not at all. */
static void on_attest(fake_prov *f, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_wire_doc doc;
  char sid[32] = "";
  const uint8_t *d = NULL;
  size_t dl = 0;
  if (gn_wire_decode(env->body, env->body_len, &doc) < 0)
    return;
  gn_wire_get_str(doc.root, "sid", sid, sizeof sid);
  gn_wire_get_bin_ref(doc.root, "data", GN_MSG_MAX, &d, &dl);
  gn_buf out = {0};
  uint32_t reply = 0;
  int r = -1;
  if (env->type == GN_MSG_ATTEST_CHALLENGE)
    f->challenges++;
  if (f->attest_mode == ATT_MUTE) {
    gn_wire_doc_done(&doc);
    return;
  }
  if (f->attest_mode == ATT_GARBAGE && env->type == GN_MSG_ATTEST_CHALLENGE) {
    static const uint8_t junk[64] = {1, 2, 3};
    r = gn_buf_append(&out, junk, sizeof junk);
    reply = GN_MSG_ATTEST_RESPONSE;
  } else if (env->type == GN_MSG_ATTEST_CHALLENGE) {
    f->pr = gn_attest_prover_free(f->pr);
    if (gn_attest_prover_new(gn_attest_backend_cpu(), &f->pr) == 0)
      r = gn_attest_prover_on_challenge(f->pr, d, dl, &out);
    reply = GN_MSG_ATTEST_RESPONSE;
  } else if (env->type == GN_MSG_ATTEST_OPEN && f->pr) {
    r = gn_attest_prover_on_open(f->pr, d, dl, &out);
    reply = GN_MSG_ATTEST_PROOF;
  } else if (env->type == GN_MSG_ATTEST_MEM_CHALLENGE) {
    f->mpr = gn_attest_mem_prover_free(f->mpr);
    if (gn_attest_mem_prover_new(64, &f->mpr) == 0)
      r = gn_attest_mem_prover_on_challenge(f->mpr, d, dl, &out);
    reply = GN_MSG_ATTEST_MEM_READY;
  } else if (env->type == GN_MSG_ATTEST_MEM_WALK && f->mpr) {
    r = gn_attest_mem_prover_on_walk(f->mpr, d, dl, &out);
    reply = GN_MSG_ATTEST_MEM_RESULT;
  }
  gn_wire_doc_done(&doc);
  if (r >= 0 && reply) {
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "sid");
    gn_wire_put_str(&w, sid);
    gn_wire_put_str(&w, "data");
    gn_wire_put_bin(&w, out.data, out.len);
    send_body(f, peer, reply, &w);
  }
  gn_buf_done(&out);
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t len, void *ud) {
  (void)t;
  fake_prov *f = prov_of(ud);
  if (env->type >= GN_MSG_ATTEST_CHALLENGE && env->type <= GN_MSG_ATTEST_MEM_RESULT &&
      env->type != GN_MSG_ATTEST_VERDICT) {
    on_attest(f, peer, env);
    return;
  }
  if (env->type == GN_MSG_LEASE_REQUEST) {
    gn_lease_terms lt;
    assert_int_equal(gn_lease_request_open(raw, len, &lt), 0);
    f->requests++;
    snprintf(f->lease, sizeof f->lease, "%s", lt.lease_id);
    if (f->mode == SILENT)
      return;
    if (f->mode == REFUSE) {
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn_wire_put_map(&w, 2);
      gn_wire_put_str(&w, "lease_id");
      gn_wire_put_str(&w, lt.lease_id);
      gn_wire_put_str(&w, "reason");
      gn_wire_put_str(&w, "the offer's price changed: 0.90 EUR per GPU-hour now");
      send_body(f, peer, GN_MSG_LEASE_REJECT, &w);
      f->rejected++;
      W.refused_at = gn_mono_ms();
      return;
    }
    static const char *const gpus[] = {"GPU-sim-0"};
    gn_buf ag = {0};
    assert_int_equal(gn_agreement_seal(f->id, raw, len, gn_unix_s(), gpus, 1, &ag), 0);
    gn_transport_send(f->tp, peer, ag.data, ag.len);
    gn_buf_done(&ag);
    f->accepted++;
  } else if (env->type == GN_MSG_LEASE_RELEASE) {
    char lease[GN_LEASE_ID_STRLEN] = "";
    gn_wire_doc doc;
    if (gn_wire_decode(env->body, env->body_len, &doc) == 0) {
      gn_wire_get_str(doc.root, "lease_id", lease, sizeof lease);
      gn_wire_doc_done(&doc);
    }
    if (strcmp(lease, f->lease) == 0 && f->released++ == 0)
      f->released_at = gn_mono_ms();
  } else if (env->type == GN_MSG_JOB_MANIFEST) {
    if (f->have_man)
      gn__jobman_done(&f->man);
    assert_int_equal(gn__jobman_decode(env->body, env->body_len, &f->man), 0);
    f->have_man = true;
    if (f->manifests++ == 0) {
      memcpy(f->first_job, f->man.job_id, sizeof f->first_job); /* (snprintf: -Wrestrict within W) */
      memcpy(f->first_lease, f->man.lease_id, sizeof f->first_lease);
      f->first_rank = f->man.net.rank;
    }
    job_status(f, peer, f->man.job_id, f->man.lease_id, "running", -1);
    char line[64];
    int len = snprintf(line, sizeof line, "hello from rank %u\nstep 1 of rank %u\n", f->man.net.rank, f->man.net.rank);
    gn_wire_writer lw;
    gn_wire_writer_init(&lw);
    gn_wire_put_map(&lw, 4);
    gn_wire_put_str(&lw, "job_id");
    gn_wire_put_str(&lw, f->man.job_id);
    gn_wire_put_str(&lw, "lease_id");
    gn_wire_put_str(&lw, f->man.lease_id);
    gn_wire_put_str(&lw, "offset");
    gn_wire_put_u64(&lw, 0);
    gn_wire_put_str(&lw, "data");
    gn_wire_put_bin(&lw, line, (size_t)len);
    send_body(f, peer, GN_MSG_JOB_LOG, &lw);
    if (f->mode != HOLD)
      job_status(f, peer, f->man.job_id, f->man.lease_id, "exited", 0);
  } else if (env->type == GN_MSG_JOB_STOP) {
    f->stops++;
    if (f->have_man)
      job_status(f, peer, f->man.job_id, f->man.lease_id, "stopped", 137);
  } else if (env->type == GN_MSG_JOB_OUTPUT_GET) {
    /* The rank's /output: OUT_BYTES + rank bytes, served in chunks. */
    gn_jobmsg q;
    assert_int_equal(gn__jobmsg_decode(env->type, env->body, env->body_len, &q), 0);
    uint32_t rank = f->have_man ? f->man.net.rank : 0;
    uint64_t size = f->out_size ? f->out_size : OUT_BYTES + rank, n = q.offset < size ? size - q.offset : 0;
    if (f->mute_output) {
      f->output_gets++;
      gn__jobmsg_done(&q);
      return;
    }
    if (f->refuse_output) {
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn__joboutput_encode(&w, q.job_id, q.offset, NULL, 0, true, 0, "this job has no /output");
      send_body(f, peer, GN_MSG_JOB_OUTPUT, &w);
      f->output_gets++;
      gn__jobmsg_done(&q);
      return;
    }
    if (n > GN_JOB_OUTPUT_CHUNK)
      n = GN_JOB_OUTPUT_CHUNK;
    static uint8_t chunk[GN_JOB_OUTPUT_CHUNK];
    for (uint64_t i = 0; i < n; i++)
      chunk[i] = out_byte(rank, q.offset + i);
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn__joboutput_encode(&w, q.job_id, q.offset, chunk, (size_t)n, q.offset + n >= size, size, NULL);
    send_body(f, peer, GN_MSG_JOB_OUTPUT, &w);
    f->output_gets++;
    gn__jobmsg_done(&q);
  } else if (env->type == GN_MSG_DEBIT_ACCEPT) {
    f->bills++;
  } else if (env->type == GN_MSG_JOB_SEED) {
    if (f->have_seed)
      gn__jobmsg_done(&f->seed);
    assert_int_equal(gn__jobmsg_decode(env->type, env->body, env->body_len, &f->seed), 0);
    f->have_seed = true;
    f->seed_replies++;
  }
}

static void start_daemon(void) {
  char bin[PATH_MAX];
  tn_gpunetd_path(bin, sizeof bin);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = fork();
  assert_true(W.daemon >= 0);
  if (W.daemon == 0) {
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/gpunetd.log", W.dir);
    if (!freopen(log, "w", stderr))
      _exit(127);
    setenv("GN_RENT_TIMEOUT_MS", "3000", 1);
    setenv("GN_ATTEST_TIMEOUT_MS", "5000", 1);
    execl(bin, bin, "--data-dir", W.dir, "--listen", W.addr, (char *)NULL);
    _exit(127);
  }
}

/* Runs `gpunet --data-dir DIR ARGS...` with stdout/stderr to DIR/out.N and
 * DIR/err.N, the loop turning meanwhile (the providers answer). */
static int run_cli(int n, char *const *args, char *out, size_t out_cap, char *err, size_t err_cap) {
  char bin[PATH_MAX], o[PATH_MAX + 16], e[PATH_MAX + 16];
  snprintf(bin, sizeof bin, "%s/gpunet", getenv("GN_BUILD_DIR"));
  snprintf(o, sizeof o, "%s/out.%d", W.dir, n);
  snprintf(e, sizeof e, "%s/err.%d", W.dir, n);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char *argv[40];
    int k = 0;
    argv[k++] = bin;
    argv[k++] = "--data-dir";
    argv[k++] = W.dir;
    for (int i = 0; args[i] && k < 39; i++)
      argv[k++] = args[i];
    argv[k] = NULL;
    if (!freopen(o, "w", stdout) || !freopen(e, "w", stderr))
      _exit(127);
    execv(bin, argv);
    _exit(127);
  }
  int status = 0;
  uint64_t end = gn_mono_ms() + 60000;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (gn_mono_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fail_msg("gpunet %s did not end within 60 s", args[0]);
    }
    tn_run_until_flag(&W.loop, &(int){0}, 20);
    if (W.during)
      W.during();
  }
  FILE *fo = fopen(o, "r"), *fe = fopen(e, "r");
  size_t lo = fo ? fread(out, 1, out_cap - 1, fo) : 0, le = fe ? fread(err, 1, err_cap - 1, fe) : 0;
  out[lo] = 0;
  err[le] = 0;
  if (fo)
    fclose(fo);
  if (fe)
    fclose(fe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int offers_seen(void) {
  char out[65536], err[4096];
  char *args[] = {"--json", "offers", NULL};
  if (run_cli(99, args, out, sizeof out, err, sizeof err) != 0)
    return -1;
  json_t *j = json_loads(out, 0, NULL);
  int n = (int)json_array_size(json_object_get(j, "offers"));
  json_decref(j);
  return n;
}

static int setup(void **state) {
  (void)state;
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-trainreq-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  gn_identity *req_id;
  tn_identity_for(W.dir, &req_id);
  memcpy(W.req_pk, req_id->pk, GN_PK_LEN);
  start_daemon();
  uv_loop_init(&W.loop);
  gn_transport_cbs cbs = {.on_peer_up = on_up, .on_peer_down = on_down, .on_message = on_msg};
  for (int k = 0; k < NPROV; k++) {
    fake_prov *f = &W.p[k];
    assert_int_equal(gn_identity_generate(&f->id), 0);
    assert_int_equal(gn_transport_new(&W.loop, f->id, &cbs, (void *)(intptr_t)k, &f->tp), 0);
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", tn_free_port());
    assert_int_equal(gn_transport_listen(f->tp, f->addr), 0);
    gn_transport_set_advertised_addr(f->tp, f->addr);
  }
  /* Each provider's offer goes to the daemon over its session; a session
   * can still be replaced or dropped just after it came up (two dials
   * crossing), so until the daemon lists every offer, a provider without a
   * session dials again and every offer is sent again each second (the same
   * seq: the daemon keeps one). */
  gn_buf env[NPROV];
  memset(env, 0, sizeof env);
  for (int k = 0; k < NPROV; k++) {
    fake_prov *f = &W.p[k];
    gn_offer o;
    memset(&o, 0, sizeof o);
    memcpy(o.provider, f->id->pk, GN_PK_LEN);
    o.seq = 1;
    o.issued_s = gn_unix_s();
    o.expires_s = o.issued_s + 600;
    snprintf(o.addr, sizeof o.addr, "%s", f->addr);
    snprintf(o.gpu_model, sizeof o.gpu_model, "NVIDIA GeForce RTX 4090");
    o.vram_mib = 24576;
    o.gpus_free = o.gpus_total = 1;
    o.price_uper_hour = 400000 + (uint64_t)k * 10000;
    snprintf(o.currency, sizeof o.currency, "EUR");
    o.max_hours = 2;
    o.simulated = true;
    o.training = true;
    o.jobnet_port_lo = 51820;
    o.jobnet_port_hi = 51899;
    assert_int_equal(gn_offer_seal(f->id, &o, &env[k]), 0);
  }
  int seen = 0;
  for (int round = 0; round < 30 && seen < NPROV; round++) {
    for (int k = 0; k < NPROV; k++) {
      fake_prov *f = &W.p[k];
      for (int i = 0; i < 50 && !f->up; i++) {
        usleep(100000);
        gn_transport_connect(f->tp, W.addr);
        tn_run_until_flag(&W.loop, &f->up, 300);
      }
      assert_true(f->up);
      if (gn_transport_send(f->tp, req_id->pk, env[k].data, env[k].len) == GN_ENOTFOUND)
        f->up = 0; /* no session after all: dial again next round */
    }
    for (int i = 0; i < 10 && (seen = offers_seen()) < NPROV; i++)
      tn_run_until_flag(&W.loop, &(int){0}, 100);
  }
  for (int k = 0; k < NPROV; k++)
    gn_buf_done(&env[k]);
  gn_identity_free(req_id);
  assert_int_equal(seen, NPROV);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  gn_transport *tps[NPROV];
  size_t ntp = 0;
  for (int k = 0; k < NPROV; k++) {
    if (W.p[k].tp)
      tps[ntp++] = W.p[k].tp;
    if (W.p[k].have_man)
      gn__jobman_done(&W.p[k].man);
    if (W.p[k].have_seed)
      gn__jobmsg_done(&W.p[k].seed);
    W.p[k].pr = gn_attest_prover_free(W.p[k].pr);
    W.p[k].mpr = gn_attest_mem_prover_free(W.p[k].mpr);
  }
  tn_inbox in = {0};
  int rc = tn_world_end(&W.loop, tps, ntp, W.daemon, &in, W.dir);
  for (int k = 0; k < NPROV; k++)
    W.p[k].id = gn_identity_free(W.p[k].id);
  return rc;
}

#define IMAGE "127.0.0.1:5000/test/train@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void wait_releases(int want_agreed) {
  uint64_t end = gn_mono_ms() + 5000;
  for (;;) {
    int got = 0;
    for (int k = 0; k < NPROV; k++)
      got += W.p[k].accepted && W.p[k].released;
    if (got >= want_agreed || gn_mono_ms() > end)
      break;
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  }
}

/* One provider refuses: all or nothing. */
static void test_one_refuses(void **state) {
  (void)state;
  W.p[1].mode = REFUSE;
  char out[65536], err[16384];
  char *args[] = {"train",   "--gpus", "3",  "--per-node", "1",        "--image", IMAGE, "--allow-simulated",
                  "--hours", "1",      "--", "python3",    "train.py", NULL};
  int rc = run_cli(1, args, out, sizeof out, err, sizeof err);
  wait_releases(2);
  print_message("stdout:\n%s\nstderr:\n%s\n", out, err);
  assert_int_equal(rc, 1);
  for (int k = 0; k < NPROV; k++)
    assert_int_equal(W.p[k].requests, 1); /* every member asked once, at once */
  assert_int_equal(W.p[1].rejected, 1);
  /* Every agreement that came is released, and soon after the refusal. */
  for (int k = 0; k < NPROV; k++) {
    if (!W.p[k].accepted)
      continue;
    assert_true(W.p[k].released >= 1);
    assert_true(W.p[k].released_at - W.refused_at < 2000 || W.p[k].released_at < W.refused_at + 2000);
  }
  assert_int_equal(W.p[0].accepted + W.p[2].accepted, 2);
  /* No rank started, nothing billed. */
  for (int k = 0; k < NPROV; k++) {
    assert_int_equal(W.p[k].manifests, 0);
    assert_int_equal(W.p[k].bills, 0);
  }
  assert_non_null(strstr(err, "refused"));
  assert_non_null(strstr(err, "price changed"));
  assert_non_null(strstr(out, "3 GPUs on 3 providers"));
  /* The daemon's view: failed, every lease ended, no cost. */
  char *largs[] = {"--json", "leases", NULL};
  assert_int_equal(run_cli(2, largs, out, sizeof out, err, sizeof err), 0);
  json_t *j = json_loads(out, 0, NULL);
  size_t i;
  json_t *l;
  int active = 0, n = 0;
  json_array_foreach(json_object_get(j, "leases"), i, l) {
    n++;
    const char *st = json_string_value(json_object_get(l, "state"));
    if (st && strcmp(st, "active") == 0)
      active++;
  }
  json_decref(j);
  assert_int_equal(n, 2);
  assert_int_equal(active, 0);
}

/* Everyone agrees: the plan, the manifests with the job network, the end. */
static void test_all_agree(void **state) {
  (void)state;
  char out[65536], err[16384];
  char *args[] = {"train", "--gpus",   "3",  "--image", IMAGE,      "--allow-simulated",
                  "--env", "EPOCHS=2", "--", "python3", "train.py", NULL};
  int rc = run_cli(3, args, out, sizeof out, err, sizeof err);
  print_message("stdout:\n%s\nstderr:\n%s\n", out, err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "3 GPUs on 3 providers (1 per node)"));
  assert_non_null(strstr(out, "1.23 EUR/h in total"));
  assert_non_null(strstr(out, "RTT matrix"));
  assert_non_null(strstr(out, "worst pair RTT"));
  for (int k = 0; k < NPROV; k++) {
    assert_int_equal(W.p[k].challenges, 1); /* each provider attested once, before its lease */
    char shortid[GN_NODE_ID_STRLEN];
    gn_node_id_format(W.p[k].id->pk, shortid);
    shortid[12] = 0;
    assert_non_null(strstr(out, shortid)); /* each provider in the table */
    assert_non_null(strstr(out, W.p[k].addr));
  }
  /* One manifest per provider, one rank each, one network. */
  uint64_t end = gn_mono_ms() + 5000;
  while ((W.p[0].manifests + W.p[1].manifests + W.p[2].manifests) < 3 && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  bool rank_seen[NPROV] = {false};
  uint8_t pub[NPROV][32];
  char endpoint[NPROV][64];
  for (int k = 0; k < NPROV; k++) {
    fake_prov *f = &W.p[k];
    assert_int_equal(f->manifests, 1);
    assert_true(f->man.has_net);
    assert_string_equal(f->man.lease_id, f->lease);
    assert_int_equal(f->man.net.world, 3);
    assert_true(f->man.net.rank < 3);
    assert_false(rank_seen[f->man.net.rank]);
    rank_seen[f->man.net.rank] = true;
    assert_int_equal(f->man.net.local_rank, 0);
    assert_int_equal(f->man.net.local_world, 1);
    assert_int_equal(f->man.net.npeers, 2);
    assert_string_equal(f->man.net.group, W.p[0].man.net.group);
    assert_int_equal(f->man.net.subnet_host, W.p[0].man.net.subnet_host);
    assert_true(f->man.net.listen_port >= 51820 && f->man.net.listen_port <= 51899);
    assert_int_equal(f->man.envc, 1);
    assert_string_equal(f->man.env[0], "EPOCHS=2");
    assert_int_equal(gn_jobnet_public_key(f->man.net.private_key, pub[f->man.net.rank]), 0);
    snprintf(endpoint[f->man.net.rank], sizeof endpoint[0], "127.0.0.1:%u", f->man.net.listen_port);
  }
  for (int k = 0; k < NPROV; k++) {
    const gn_jobman_net *net = &W.p[k].man.net;
    for (uint32_t q = 0; q < net->npeers; q++) {
      const gn_jobman_peer *p = &net->peers[q];
      assert_true(p->rank < 3 && p->rank != net->rank);
      assert_memory_equal(p->public_key, pub[p->rank], 32);
      assert_string_equal(p->endpoint, endpoint[p->rank]);
    }
  }
  /* The ranks exited 0: the group is done and every lease released. */
  end = gn_mono_ms() + 8000;
  for (;;) {
    int rel = 0;
    for (int k = 0; k < NPROV; k++)
      rel += W.p[k].released > 0;
    if (rel == NPROV || gn_mono_ms() > end)
      break;
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  }
  for (int k = 0; k < NPROV; k++)
    assert_true(W.p[k].released >= 1);
  char *jargs[] = {"jobs", NULL};
  assert_int_equal(run_cli(4, jargs, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(out, "TRAINING"));
  assert_non_null(strstr(out, W.p[0].man.net.group));
  assert_non_null(strstr(out, "done"));
}

/* Provider 2 disappears while the ranks run (its rank never reports). */
static uint64_t gone_at;
static void kill_p2_when_running(void) {
  if (!gone_at && W.p[0].manifests && W.p[1].manifests && W.p[2].manifests) {
    gone_at = gn_mono_ms();
    gn_transport_close(W.p[2].tp, tn__closed, NULL);
    W.p[2].tp = NULL;
  }
}

/* A provider gone mid-run: the other ranks are stopped, every lease ends,
 * gpunet train -f exits 1 naming the lost member. */
static void test_provider_gone(void **state) {
  (void)state;
  for (int k = 0; k < NPROV; k++)
    W.p[k].mode = HOLD;
  gone_at = 0;
  W.during = kill_p2_when_running;
  char out[65536], err[16384];
  char *args[] = {"train", "--gpus", "3",       "--per-node", "1", "--image", IMAGE, "--allow-simulated",
                  "-f",    "--",     "python3", "train.py",   NULL};
  int rc = run_cli(5, args, out, sizeof out, err, sizeof err);
  W.during = NULL;
  uint64_t ended = gn_mono_ms();
  print_message("stdout:\n%s\nstderr:\n%s\n", out, err);
  assert_true(gone_at > 0);
  assert_int_equal(rc, 1);
  /* Noticed within the grace (20 s) and a few ticks, not the lease's; the
   * command then waits at most 10 s for final invoices (none come here). */
  assert_true(ended - gone_at < 45000);
  for (int k = 0; k < 2; k++)
    assert_true(W.p[k].released_at - gone_at < 25000);
  assert_non_null(strstr(err, "unreachable"));
  for (int k = 0; k < 2; k++) {
    assert_true(W.p[k].stops >= 1);
    assert_true(W.p[k].released >= 1);
  }
}

/* --output DIR: the leases are held until every rank's /output is copied
 * to DIR/rank-R.tar, then released; the command waits for that. */
static void test_outputs(void **state) {
  (void)state;
  char out[65536], err[16384], dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/results", W.dir);
  char *args[] = {"train",    "--gpus", "3",  "--image", IMAGE,      "--allow-simulated",
                  "--output", dir,      "--", "python3", "train.py", NULL};
  int rc = run_cli(6, args, out, sizeof out, err, sizeof err);
  print_message("stdout:\n%s\nstderr:\n%s\n", out, err);
  assert_int_equal(rc, 0);
  for (int k = 0; k < NPROV; k++) {
    assert_true(W.p[k].man.output);
    assert_true(W.p[k].output_gets >= 2); /* 40000 bytes: two chunks */
    assert_true(W.p[k].released >= 1);
  }
  for (uint32_t r = 0; r < NPROV; r++) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/rank-%u.tar", dir, r);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static uint8_t buf[OUT_BYTES + 64];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(n, OUT_BYTES + r);
    for (size_t i = 0; i < n; i++)
      if (buf[i] != out_byte(r, i))
        fail_msg("rank %u's output differs at byte %zu", r, i);
  }
  assert_non_null(strstr(out, "outputs copied; leases released"));
}

/* The requester restarts while the gang forms (provider 1 has not
 * answered): restored, the gang fails and every agreed lease is released,
 * the unanswered request too. */
static void stop_daemon_when_two_agreed(void) {
  if (W.daemon > 0 && W.p[0].accepted && W.p[2].accepted && W.p[1].requests) {
    tn_daemon_stop(W.daemon);
    W.daemon = 0;
  }
}

static void test_restart_while_forming(void **state) {
  (void)state;
  W.p[1].mode = SILENT;
  W.during = stop_daemon_when_two_agreed;
  char out[65536], err[16384];
  char *args[] = {"train", "--gpus",  "3",        "--per-node", "1", "--image", IMAGE, "--allow-simulated",
                  "--",    "python3", "train.py", NULL};
  int rc = run_cli(7, args, out, sizeof out, err, sizeof err);
  W.during = NULL;
  print_message("stdout:\n%s\nstderr:\n%s\n", out, err);
  assert_int_equal(W.daemon, 0); /* stopped while forming */
  assert_int_not_equal(rc, 0);
  for (int k = 0; k < NPROV; k++)
    assert_int_equal(W.p[k].released, 0);
  start_daemon();
  uint64_t end = gn_mono_ms() + 20000;
  while ((!W.p[0].released || !W.p[1].released || !W.p[2].released) && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  for (int k = 0; k < NPROV; k++)
    if (!W.p[k].released) {
      char cmd[PATH_MAX + 64];
      snprintf(cmd, sizeof cmd, "grep -i 'train\\|lease\\|peer' %s/gpunetd.log | tail -n 30", W.dir);
      (void)system(cmd);
      fail_msg("provider %d's lease was not released after the restart", k);
    }
  assert_int_equal(W.p[0].manifests + W.p[1].manifests + W.p[2].manifests, 0);
  /* The daemon says so. */
  char *jargs[] = {"jobs", NULL};
  assert_int_equal(run_cli(8, jargs, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(out, "failed"));
}

/* gpunet train without -f returns once the ranks run; logs TRAINID shows
 * every rank's output with its prefix, --rank R only R's; stop TRAINID
 * stops every rank and releases every lease. */
static void test_logs_and_stop(void **state) {
  (void)state;
  for (int k = 0; k < NPROV; k++)
    W.p[k].mode = HOLD;
  char out[65536], err[16384], id[32] = "";
  char *args[] = {"--json", "train",   "--gpus", "3", "--image", IMAGE, "--allow-simulated",
                  "--",     "python3", "t.py",   NULL};
  assert_int_equal(run_cli(20, args, out, sizeof out, err, sizeof err), 0);
  json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL); /* the first line: id, state, plan */
  assert_non_null(j);
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "plan"), "nodes")), 3);
  json_decref(j);
  assert_true(id[0]);
  char *largs[] = {"logs", id, NULL};
  uint64_t end = gn_mono_ms() + 5000;
  do
    assert_int_equal(run_cli(21, largs, out, sizeof out, err, sizeof err), 0);
  while (!strstr(out, "[rank 2] step 1 of rank 2") && gn_mono_ms() < end);
  for (int r = 0; r < NPROV; r++) {
    char want[64];
    snprintf(want, sizeof want, "[rank %d] hello from rank %d\n", r, r);
    assert_non_null(strstr(out, want));
  }
  char *rargs[] = {"logs", id, "--rank", "1", NULL};
  assert_int_equal(run_cli(22, rargs, out, sizeof out, err, sizeof err), 0);
  assert_string_equal(out, "hello from rank 1\nstep 1 of rank 1\n");
  char *bargs[] = {"logs", id, "--rank", "3", NULL};
  assert_int_equal(run_cli(23, bargs, out, sizeof out, err, sizeof err), 2);
  char *sargs[] = {"stop", id, NULL};
  assert_int_equal(run_cli(24, sargs, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(out, "ended"));
  end = gn_mono_ms() + 5000;
  while ((!W.p[0].released || !W.p[1].released || !W.p[2].released) && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  for (int k = 0; k < NPROV; k++) {
    assert_int_equal(W.p[k].stops, 1);
    assert_true(W.p[k].released >= 1);
  }
}

/* Bad command lines: exit 2, nothing sent. */
static void test_bad_cli(void **state) {
  (void)state;
  char out[8192], err[8192];
  char *bad[][16] = {
      {"train", "--gpus", "0", "--image", IMAGE, "--", "x", NULL},
      {"train", "--gpus", "3", "--per-node", "2", "--image", IMAGE, "--", "x", NULL},
      {"train", "--gpus", "3", "--", "x", NULL},
      {"train", "--gpus", "3", "--image", IMAGE, NULL},
      {"train", "--gpus", "3", "--image", IMAGE, "--max-price", "cheap", "--", "x", NULL},
      {"train", "--gpus", "3", "--image", IMAGE, "--hours", "0", "--", "x", NULL},
      {"train", "--gpus", "3", "--image", IMAGE, "--env", "=x", "--", "x", NULL},
      {"train", "--gpus", "3", "--image", IMAGE, "--restarts", "-1", "--", "x", NULL},
      {"train", "--gpus", "65", "--image", IMAGE, "--", "x", NULL},
      {"logs", "j-0123", "--rank", "x", NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(run_cli(10 + (int)i, bad[i], out, sizeof out, err, sizeof err), 2);
    assert_non_null(strstr(err, "see gpunet"));
  }
  for (int k = 0; k < NPROV; k++)
    assert_int_equal(W.p[k].requests, 0);
  char *jargs[] = {"jobs", NULL};
  assert_int_equal(run_cli(30, jargs, out, sizeof out, err, sizeof err), 0);
  assert_null(strstr(out, "TRAINING"));
}

/* GET PATH on the daemon's control socket: the JSON body (NULL if none). */
static json_t *ctl_get(const char *path) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  char sock[PATH_MAX + 16];
  snprintf(sock, sizeof sock, "%s/gpunetd.sock", W.dir);
  assert_true(strlen(sock) < sizeof a.sun_path);
  memcpy(a.sun_path, sock, strlen(sock) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char req[512];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: gpunetd\r\nConnection: close\r\n\r\n", path);
  assert_int_equal(write(fd, req, (size_t)n), n);
  static char buf[1 << 20];
  size_t len = 0;
  ssize_t k;
  while (len < sizeof buf - 1 && (k = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
    len += (size_t)k;
  close(fd);
  buf[len] = 0;
  char *body = strstr(buf, "\r\n\r\n");
  return body ? json_loads(body + 4, 0, NULL) : NULL;
}

static json_t *train_status(const char *id) {
  char path[96];
  snprintf(path, sizeof path, "/v1/train/%s", id);
  json_t *j = ctl_get(path);
  json_t *t = json_incref(json_object_get(j, "train"));
  json_decref(j);
  return t;
}

/* Provider k sends a JOB_SEED_GET; true if a JOB_SEED came within ms. */
static bool seed_get(int k, const char *job, const char *lease, uint64_t offset, uint64_t ms) {
  fake_prov *f = &W.p[k];
  int before = f->seed_replies;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease);
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, offset);
  send_body(f, W.req_pk, GN_MSG_JOB_SEED_GET, &w);
  uint64_t end = gn_mono_ms() + ms;
  while (f->seed_replies == before && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  return f->seed_replies > before;
}

static uint64_t out_size_of(int k, uint32_t rank) {
  return W.p[k].out_size ? W.p[k].out_size : OUT_BYTES + rank;
}

static bool seed_file_exists(const char *id, uint32_t rank, mode_t *mode) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/train/%s/seed/rank-%u.tar", W.dir, id, rank);
  struct stat st;
  if (stat(path, &st) < 0)
    return false;
  if (mode)
    *mode = st.st_mode & 0777;
  return true;
}

/* Starts a 3-rank group with --restarts 1 (every provider holds its rank)
 * and fails provider 1's rank once all run: the group's id in id. */
static void start_and_fail_rank(char *id, size_t cap) {
  for (int k = 0; k < NPROV; k++)
    W.p[k].mode = HOLD;
  char out[65536], err[16384];
  char *args[] = {"--json", "train",   "--gpus", "3", "--restarts", "1", "--image", IMAGE, "--allow-simulated",
                  "--",     "python3", "t.py",   NULL};
  assert_int_equal(run_cli(40, args, out, sizeof out, err, sizeof err), 0);
  json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
  assert_non_null(j);
  snprintf(id, cap, "%s", json_string_value(json_object_get(j, "id")));
  json_decref(j);
  assert_true(id[0]);
  uint64_t end = gn_mono_ms() + 5000;
  while ((!W.p[0].manifests || !W.p[1].manifests || !W.p[2].manifests) && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  for (int k = 0; k < NPROV; k++) {
    assert_int_equal(W.p[k].manifests, 1);
    assert_false(W.p[k].man.has_seed); /* the first start has none */
  }
  job_status(&W.p[1], W.req_pk, W.p[1].man.job_id, W.p[1].man.lease_id, "exited", 1);
  end = gn_mono_ms() + 20000;
  while ((W.p[0].manifests < 2 || W.p[1].manifests < 2 || W.p[2].manifests < 2) && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  for (int k = 0; k < NPROV; k++)
    if (W.p[k].manifests != 2) {
      char cmd[PATH_MAX + 64];
      snprintf(cmd, sizeof cmd, "grep -i 'train' %s/gpunetd.log | tail -n 30", W.dir);
      (void)system(cmd);
      fail_msg("provider %d got %d manifests, not the restart's", k, W.p[k].manifests);
    }
}

/* --restarts 1: a failed rank restarts the group from the old ranks'
 * /output; the seeds are served to their providers only, then removed. */
static void test_restart_seed(void **state) {
  (void)state;
  W.p[0].out_size = 5 * 32768 + 1234; /* six chunks: more than the window */
  char id[32] = "";
  start_and_fail_rank(id, sizeof id);
  for (int k = 0; k < NPROV; k++) {
    fake_prov *f = &W.p[k];
    assert_true(f->output_gets >= 1);
    assert_string_equal(f->man.lease_id, f->first_lease); /* a failed rank restarts on the same leases */
    assert_string_not_equal(f->man.job_id, f->first_job);
    assert_true(f->man.output);
    assert_true(f->man.has_seed);
    /* The seed is the old rank's /output: same rank here (same member). */
    assert_int_equal(f->man.net.rank, f->first_rank);
    uint64_t size = out_size_of(k, f->first_rank);
    assert_int_equal(f->man.seed_size, size);
    uint8_t *want = malloc(size), sha[32];
    for (uint64_t i = 0; i < size; i++)
      want[i] = out_byte(f->first_rank, i);
    crypto_hash_sha256(sha, want, size);
    assert_memory_equal(f->man.seed_sha256, sha, 32);
    mode_t mode = 0;
    assert_true(seed_file_exists(id, f->first_rank, &mode));
    assert_int_equal(mode, 0600);
    /* Its provider fetches it back, byte for byte. */
    uint8_t *got = malloc(size + 1);
    uint64_t off = 0;
    for (int guard = 0; guard < 64; guard++) {
      assert_true(seed_get(k, f->man.job_id, f->man.lease_id, off, 3000));
      assert_string_equal(f->seed.reason, "");
      assert_int_equal(f->seed.offset, off);
      assert_int_equal(f->seed.size, size);
      assert_true(f->seed.data_len <= GN_JOB_OUTPUT_CHUNK && off + f->seed.data_len <= size);
      memcpy(got + off, f->seed.data, f->seed.data_len);
      off += f->seed.data_len;
      assert_int_equal(f->seed.eof, off == size);
      if (f->seed.eof)
        break;
    }
    assert_int_equal(off, size);
    assert_memory_equal(got, want, size);
    free(got);
    free(want);
  }
  assert_true(W.p[0].output_gets >= 6);
  /* Attacks: another rank's provider asks for rank 1's seed with its
   * lease; an unknown job; the old job of the same lease; nothing is sent. */
  assert_false(seed_get(0, W.p[1].man.job_id, W.p[1].man.lease_id, 0, 700));
  assert_false(seed_get(0, "j-0123456789ab", W.p[0].man.lease_id, 0, 700));
  assert_false(seed_get(0, W.p[0].first_job, W.p[0].first_lease, 0, 700));
  assert_false(seed_get(0, W.p[0].man.job_id, W.p[1].man.lease_id, 0, 700)); /* not its lease */
  /* Past the end: a refusal, nothing else. */
  assert_true(seed_get(2, W.p[2].man.job_id, W.p[2].man.lease_id, out_size_of(2, W.p[2].first_rank) + 1, 3000));
  assert_non_null(strstr(W.p[2].seed.reason, "past"));
  assert_true(W.p[2].seed.eof);
  assert_int_equal(W.p[2].seed.data_len, 0);
  /* A flood is answered one chunk each, and the daemon lives on. */
  int replies = W.p[2].seed_replies;
  for (int i = 0; i < 200; i++) {
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 3);
    gn_wire_put_str(&w, "job_id");
    gn_wire_put_str(&w, W.p[2].man.job_id);
    gn_wire_put_str(&w, "lease_id");
    gn_wire_put_str(&w, W.p[2].man.lease_id);
    gn_wire_put_str(&w, "offset");
    gn_wire_put_u64(&w, 0);
    send_body(&W.p[2], W.req_pk, GN_MSG_JOB_SEED_GET, &w);
  }
  uint64_t end = gn_mono_ms() + 5000;
  while (W.p[2].seed_replies < replies + 200 && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  assert_int_equal(W.p[2].seed_replies, replies + 200);
  /* The status says where the restart starts from. */
  json_t *t = train_status(id);
  assert_non_null(t);
  assert_string_equal(json_string_value(json_object_get(t, "state")), "running");
  const char *note = json_string_value(json_object_get(t, "restart_note"));
  assert_non_null(note);
  assert_non_null(strstr(note, "restarting from the last checkpoint: /output of 3 of 3 ranks"));
  assert_int_equal(json_array_size(json_object_get(t, "seeds")), 3);
  json_decref(t);
  /* The group ends: every seed file goes, nothing is served any more. */
  char out[65536], err[16384];
  char *sargs[] = {"stop", id, NULL};
  assert_int_equal(run_cli(41, sargs, out, sizeof out, err, sizeof err), 0);
  for (uint32_t r = 0; r < NPROV; r++)
    assert_false(seed_file_exists(id, r, NULL));
  char dir[PATH_MAX + 64];
  snprintf(dir, sizeof dir, "%s/train/%s", W.dir, id);
  assert_int_not_equal(access(dir, F_OK), 0);
  /* At startup, seeds of groups that ended (this one) or that the node
   * does not know are removed. */
  tn_daemon_stop(W.daemon);
  W.daemon = 0;
  const char *ids[] = {id, "j-0123456789ab"};
  for (int i = 0; i < 2; i++) {
    char path[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/train", W.dir);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/train/%s", W.dir, ids[i]);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/train/%s/seed", W.dir, ids[i]);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/train/%s/seed/rank-%d.tar%s", W.dir, ids[i], i, i ? ".part" : "");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("stale", f);
    fclose(f);
  }
  start_daemon();
  char d2[PATH_MAX + 64];
  snprintf(d2, sizeof d2, "%s/train/j-0123456789ab", W.dir);
  uint64_t end2 = gn_mono_ms() + 10000;
  while ((access(dir, F_OK) == 0 || access(d2, F_OK) == 0) && gn_mono_ms() < end2)
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  assert_int_not_equal(access(dir, F_OK), 0);
  assert_int_not_equal(access(d2, F_OK), 0);
}

/* --restarts 1 where no /output can be fetched: the restart says it starts
 * from scratch, and its manifests name no seed. */
static void test_restart_scratch(void **state) {
  (void)state;
  for (int k = 0; k < NPROV; k++)
    W.p[k].refuse_output = true;
  char id[32] = "";
  start_and_fail_rank(id, sizeof id);
  for (int k = 0; k < NPROV; k++) {
    assert_true(W.p[k].output_gets >= 1);
    assert_false(W.p[k].man.has_seed);
    assert_false(seed_file_exists(id, (uint32_t)k, NULL));
    assert_false(seed_get(k, W.p[k].man.job_id, W.p[k].man.lease_id, 0, 3000) && !W.p[k].seed.reason[0]);
  }
  json_t *t = train_status(id);
  assert_non_null(t);
  const char *note = json_string_value(json_object_get(t, "restart_note"));
  assert_non_null(note);
  print_message("restart note: %s\n", note);
  assert_non_null(strstr(note, "restarting from scratch: no checkpoint could be fetched ("));
  assert_non_null(strstr(note, "no /output"));
  json_decref(t);
  char out[65536], err[16384];
  char *sargs[] = {"stop", id, NULL};
  assert_int_equal(run_cli(42, sargs, out, sizeof out, err, sizeof err), 0);
}

/* The requester stops while a restart's seeds are being fetched (the
 * providers do not answer): restored, the group fails saying why and every
 * lease is released; no rank is started again. */
static void test_restart_stopped_while_seeding(void **state) {
  (void)state;
  for (int k = 0; k < NPROV; k++) {
    W.p[k].mode = HOLD;
    W.p[k].mute_output = true;
  }
  char out[65536], err[16384], id[32] = "";
  char *args[] = {"--json", "train",   "--gpus", "3", "--restarts", "1", "--image", IMAGE, "--allow-simulated",
                  "--",     "python3", "t.py",   NULL};
  assert_int_equal(run_cli(60, args, out, sizeof out, err, sizeof err), 0);
  json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
  json_decref(j);
  uint64_t end = gn_mono_ms() + 5000;
  while ((!W.p[0].manifests || !W.p[1].manifests || !W.p[2].manifests) && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  job_status(&W.p[1], W.req_pk, W.p[1].man.job_id, W.p[1].man.lease_id, "exited", 1);
  end = gn_mono_ms() + 10000;
  while ((!W.p[0].output_gets || !W.p[1].output_gets || !W.p[2].output_gets) && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  for (int k = 0; k < NPROV; k++)
    assert_true(W.p[k].output_gets >= 1); /* the fetch is under way */
  json_t *t = train_status(id);
  assert_string_equal(json_string_value(json_object_get(t, "state")), "restarting");
  json_decref(t);
  tn_daemon_stop(W.daemon);
  W.daemon = 0;
  start_daemon();
  end = gn_mono_ms() + 20000;
  while ((!W.p[0].released || !W.p[1].released || !W.p[2].released) && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  for (int k = 0; k < NPROV; k++) {
    assert_true(W.p[k].released >= 1);
    assert_int_equal(W.p[k].manifests, 1);
  }
  t = train_status(id);
  assert_non_null(t);
  assert_string_equal(json_string_value(json_object_get(t, "state")), "failed");
  assert_non_null(strstr(json_string_value(json_object_get(t, "reason")), "restarted while the group was restarting"));
  json_decref(t);
  char dir[PATH_MAX + 64];
  snprintf(dir, sizeof dir, "%s/train/%s", W.dir, id);
  assert_int_not_equal(access(dir, F_OK), 0);
}

/* POST PATH with a JSON body on the control socket: the status, *ret the
 * JSON answer. */
static int ctl_post(const char *path, const char *body, json_t **ret) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  char sock[PATH_MAX + 16];
  snprintf(sock, sizeof sock, "%s/gpunetd.sock", W.dir);
  assert_true(strlen(sock) < sizeof a.sun_path);
  memcpy(a.sun_path, sock, strlen(sock) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char req[4096];
  int n = snprintf(req, sizeof req,
                   "POST %s HTTP/1.0\r\nHost: gpunetd\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n%s",
                   path, strlen(body), body);
  assert_int_equal(write(fd, req, (size_t)n), n);
  static char buf[1 << 20];
  size_t len = 0;
  ssize_t k;
  /* The answer may wait for the providers: the loop turns meanwhile. */
  uint64_t end = gn_mono_ms() + 30000;
  for (;;) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 10) == 1) {
      k = read(fd, buf + len, sizeof buf - 1 - len);
      if (k <= 0)
        break;
      len += (size_t)k;
    }
    tn_run_until_flag(&W.loop, &(int){0}, 10);
    if (gn_mono_ms() > end)
      fail_msg("POST %s: no answer within 30 s", path);
  }
  close(fd);
  buf[len] = 0;
  int status = 0;
  sscanf(buf, "HTTP/1.%*d %d", &status);
  char *b = strstr(buf, "\r\n\r\n");
  *ret = b ? json_loads(b + 4, 0, NULL) : NULL;
  return status;
}

/* Attestation before the leases, one GPU: the cheapest provider answers
 * the challenge with garbage, the next one not at all (the daemon's
 * attestation timeout, 5 s here); both are dropped (the plan says why) and
 * the group forms on the third; nothing was asked of the dropped ones. */
static void test_attest_drops_provider(void **state) {
  (void)state;
  W.p[0].attest_mode = ATT_GARBAGE;
  W.p[1].attest_mode = ATT_MUTE;
  char out[65536], err[16384];
  char *args[] = {"--json", "train",   "--gpus", "1", "--per-node", "1", "--image", IMAGE, "--allow-simulated",
                  "--",     "python3", "t.py",   NULL};
  uint64_t t0 = gn_mono_ms();
  int rc = run_cli(50, args, out, sizeof out, err, sizeof err);
  print_message("stdout:\n%s\nstderr:\n%s\n", out, err);
  assert_int_equal(rc, 0);
  json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
  assert_non_null(j);
  const json_t *plan = json_object_get(j, "plan");
  assert_true(json_is_true(json_object_get(plan, "attested")));
  const json_t *dropped = json_object_get(plan, "dropped");
  print_message("answered after %llu ms\n", (unsigned long long)(gn_mono_ms() - t0));
  assert_int_equal(json_array_size(dropped), 2);
  char pid[NPROV][GN_NODE_ID_STRLEN];
  for (int k = 0; k < NPROV; k++)
    gn_node_id_format(W.p[k].id->pk, pid[k]);
  assert_string_equal(json_string_value(json_object_get(json_array_get(dropped, 0), "provider")), pid[0]);
  assert_non_null(
      strstr(json_string_value(json_object_get(json_array_get(dropped, 0), "reason")), "failed attestation"));
  assert_string_equal(json_string_value(json_object_get(json_array_get(dropped, 1), "provider")), pid[1]);
  assert_non_null(strstr(json_string_value(json_object_get(json_array_get(dropped, 1), "reason")), "attest"));
  assert_int_equal(json_array_size(json_object_get(plan, "providers")), 1);
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(json_object_get(plan, "providers"), 0), "provider")), pid[2]);
  json_decref(j);
  for (int k = 0; k < NPROV; k++)
    assert_int_equal(W.p[k].challenges, 1);
  assert_int_equal(W.p[0].requests, 0); /* nothing signed for the dropped */
  assert_int_equal(W.p[1].requests, 0);
  uint64_t end = gn_mono_ms() + 5000;
  while (!W.p[2].manifests && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  assert_int_equal(W.p[2].requests, 1);
  assert_int_equal(W.p[2].manifests, 1);
}

/* With --restarts the spares are attested with the members: a spare that
 * answers garbage is dropped (the plan says why) and never stands in; the
 * group forms on the member with the honest spare left. */
static void test_attest_spares(void **state) {
  (void)state;
  W.p[2].attest_mode = ATT_GARBAGE;
  char out[65536], err[16384];
  char *args[] = {"--json",     "train", "--gpus", "1",       "--per-node", "1", "--image", IMAGE, "--allow-simulated",
                  "--restarts", "1",     "--",     "python3", "t.py",       NULL};
  int rc = run_cli(50, args, out, sizeof out, err, sizeof err);
  print_message("stdout:\n%s\nstderr:\n%s\n", out, err);
  assert_int_equal(rc, 0);
  json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
  assert_non_null(j);
  const json_t *plan = json_object_get(j, "plan");
  char pid[NPROV][GN_NODE_ID_STRLEN];
  for (int k = 0; k < NPROV; k++)
    gn_node_id_format(W.p[k].id->pk, pid[k]);
  const json_t *dropped = json_object_get(plan, "dropped");
  assert_int_equal(json_array_size(dropped), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(dropped, 0), "provider")), pid[2]);
  assert_non_null(
      strstr(json_string_value(json_object_get(json_array_get(dropped, 0), "reason")), "failed attestation"));
  assert_int_equal(json_integer_value(json_object_get(plan, "spares")), 1);
  assert_int_equal(json_array_size(json_object_get(plan, "providers")), 1);
  json_decref(j);
  for (int k = 0; k < NPROV; k++)
    assert_int_equal(W.p[k].challenges, 1); /* the member and both spares, before any lease */
  assert_int_equal(W.p[2].requests, 0);
}

/* Two of three providers fail their attestation for a 2-GPU group: no
 * plan (at once: the third's attestation cannot make one), nothing asked,
 * the answer names each dropped provider. "attest": false skips the check
 * (nothing challenged); a non-boolean "attest" is refused. */
static void test_attest_all_fail_and_opt_out(void **state) {
  (void)state;
  for (int k = 0; k < NPROV; k++)
    W.p[k].attest_mode = ATT_GARBAGE;
  W.p[2].attest_mode = ATT_MUTE; /* the daemon's attestation timeout (5 s here) */
  char body[1024];
  snprintf(body, sizeof body,
           "{\"gpus\": 2, \"per_node\": 1, \"image\": \"%s\", \"allow_simulated\": true, \"argv\": [\"python3\", "
           "\"t.py\"]%%s}",
           IMAGE);
  char b1[1100];
  snprintf(b1, sizeof b1, body, "");
  json_t *j = NULL;
  uint64_t t0 = gn_mono_ms();
  int st = ctl_post("/v1/train", b1, &j);
  print_message("answer after %llu ms: %s\n", (unsigned long long)(gn_mono_ms() - t0),
                json_string_value(json_object_get(j, "error")));
  assert_int_equal(st, 409);
  const char *e = json_string_value(json_object_get(j, "error"));
  assert_non_null(e);
  assert_non_null(strstr(e, "no plan for 2 GPUs"));
  assert_non_null(strstr(e, "2 providers dropped for failing attestation"));
  json_decref(j);
  for (int k = 0; k < NPROV; k++) {
    assert_int_equal(W.p[k].challenges, 1);
    assert_int_equal(W.p[k].requests, 0);
  }
  snprintf(b1, sizeof b1, body, ", \"attest\": \"no\"");
  assert_int_equal(ctl_post("/v1/train", b1, &j), 400);
  json_decref(j);
  snprintf(b1, sizeof b1, body, ", \"attest\": false");
  st = ctl_post("/v1/train", b1, &j);
  assert_int_equal(st, 202);
  assert_true(json_is_false(json_object_get(json_object_get(j, "plan"), "attested")));
  json_decref(j);
  uint64_t end = gn_mono_ms() + 5000;
  while (W.p[0].requests + W.p[1].requests + W.p[2].requests < 2 && gn_mono_ms() < end)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  assert_int_equal(W.p[0].requests + W.p[1].requests + W.p[2].requests, 2);
  for (int k = 0; k < NPROV; k++)
    assert_int_equal(W.p[k].challenges, 1); /* none more */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_bad_cli, setup, teardown),
      cmocka_unit_test_setup_teardown(test_one_refuses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_all_agree, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_gone, setup, teardown),
      cmocka_unit_test_setup_teardown(test_logs_and_stop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_outputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restart_while_forming, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restart_seed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restart_scratch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restart_stopped_while_seeding, setup, teardown),
      cmocka_unit_test_setup_teardown(test_attest_drops_provider, setup, teardown),
      cmocka_unit_test_setup_teardown(test_attest_spares, setup, teardown),
      cmocka_unit_test_setup_teardown(test_attest_all_fail_and_opt_out, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
