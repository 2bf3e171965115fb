/* The gpunet command's HTTP client (cli/http.c) against a raw Unix socket
 * server that writes scripted answers byte for byte: answers in pieces,
 * chunked bodies, errors with and without a JSON message, truncated and
 * malformed answers, a daemon that closes without answering. The built
 * gpunet binary is run as a user runs it; skipped if it is not built. */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "node/helpers.h"

/* One scripted answer: the pieces are written in order, a pause between
 * them, then the connection is closed. */
#define MAX_PIECES 8
typedef struct script {
  const char *pieces[MAX_PIECES];
  int pause_ms;
  int conns; /* connections served with this answer (0: one) */
} script;

typedef struct fixture {
  char dir[64];
  char sock[128];
  char gpunet[512];
  int lfd;
  pthread_t thread;
  const script *answer;
  char request[8192]; /* what the client sent, head and body */
} fixture;

static void pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Reads the request: its head, and its body when it has a Content-Length. */
static void read_request(int fd, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (;;) {
    ssize_t got = recv(fd, buf + n, cap - 1 - n, 0);
    if (got <= 0)
      return;
    n += (size_t)got;
    buf[n] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (!end)
      continue;
    const char *cl = strstr(buf, "Content-Length: ");
    size_t want = cl && cl < end ? (size_t)strtoul(cl + 16, NULL, 10) : 0;
    if (n >= (size_t)(end + 4 - buf) + want || n + 1 >= cap)
      return;
  }
}

/* Serves one connection (or the script's count) with f->answer; the last
 * request is kept. */
static void *serve_one(void *arg) {
  fixture *f = arg;
  int conns = f->answer->conns > 0 ? f->answer->conns : 1;
  for (int c = 0; c < conns; c++) {
    struct pollfd pfd = {.fd = f->lfd, .events = POLLIN};
    if (poll(&pfd, 1, 10000) != 1) /* the command never came: its test fails on what it printed */
      return NULL;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
      return NULL;
    read_request(fd, f->request, sizeof f->request);
    for (size_t i = 0; i < MAX_PIECES && f->answer->pieces[i]; i++) {
      if (i)
        pause_ms(f->answer->pause_ms);
      const char *p = f->answer->pieces[i];
      if (send(fd, p, strlen(p), MSG_NOSIGNAL) < 0)
        break;
    }
    close(fd);
  }
  return NULL;
}

static int setup(void **state) {
  const char *build = getenv("GN_BUILD_DIR");
  char bin[512];
  snprintf(bin, sizeof bin, "%s/gpunet", build ? build : ".");
  if (!build || access(bin, X_OK) != 0) {
    *state = NULL;
    return 0;
  }
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  snprintf(f->gpunet, sizeof f->gpunet, "%s", bin);
  snprintf(f->dir, sizeof f->dir, "/tmp/gn-cli-http-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->sock, sizeof f->sock, "%s/gpunetd.sock", f->dir);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  assert_true(strlen(f->sock) < sizeof sa.sun_path);
  memcpy(sa.sun_path, f->sock, strlen(f->sock) + 1);
  f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(f->lfd >= 0);
  assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(f->lfd, 4), 0);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  if (!f)
    return 0;
  close(f->lfd);
  assert_int_equal(tn_rm_rf(f->dir), 0);
  free(f);
  return 0;
}

typedef tn_run run_result;

/* Serves one answer from s while gpunet --data-dir DIR ARGS runs. */
static run_result *run(fixture *f, const script *s, const char *args) {
  static run_result rr;
  char line[2048];
  f->answer = s;
  f->request[0] = '\0';
  assert_int_equal(pthread_create(&f->thread, NULL, serve_one, f), 0);
  snprintf(line, sizeof line, "--data-dir '%s' %s", f->dir, args);
  tn_cli_run(f->gpunet, f->dir, line, &rr);
  pthread_join(f->thread, NULL);
  if (getenv("GN_TEST_VERBOSE"))
    print_message("$ gpunet %s -> %d\n%s%s", args, rr.code, rr.out, rr.err);
  return &rr;
}

#define SKIP_IF_NO_BINARY()                                                                                            \
  do {                                                                                                                 \
    if (!*state) {                                                                                                     \
      print_message("gpunet not built (GN_BUILD_DIR): skipped\n");                                                     \
      skip();                                                                                                          \
    }                                                                                                                  \
  } while (0)

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle))
    fail_msg("'%s' not found in:\n%s", needle, hay);
}

#define STATUS_BODY "{\"node_id\":\"gn-test-node\",\"version\":\"9.9.9\",\"provider\":false}"

/* The request is HTTP/1.1 on one connection that the daemon may close. */
static void test_request_form(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {
      .pieces = {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 61\r\n\r\n" STATUS_BODY, NULL}};
  run_result *r = run(f, &s, "--json status");
  assert_int_equal(r->code, 0);
  assert_contains(f->request, "GET /v1/status HTTP/1.1\r\n");
  assert_contains(f->request, "\r\nHost: gpunetd\r\n");
  assert_contains(r->out, "\"gn-test-node\"");
}

/* A POST carries its JSON body with a Content-Length that matches it. */
static void test_post_body(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {
      .pieces = {"HTTP/1.1 201 Created\r\nContent-Length: 37\r\n\r\n{\"job\":{\"id\":\"j-0123456789ab\",\"a\":1}}",
                 NULL}};
  run_result *r = run(f, &s, "run l-0011223344556677 --image 127.0.0.1:5000/x:1 -- echo hi");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "j-0123456789ab");
  assert_contains(f->request, "POST /v1/jobs HTTP/1.1\r\n");
  assert_contains(f->request, "Content-Type: application/json\r\n");
  const char *body = strstr(f->request, "\r\n\r\n");
  const char *cl = strstr(f->request, "Content-Length: ");
  assert_non_null(body);
  assert_non_null(cl);
  body += 4;
  assert_int_equal(strtoul(cl + 16, NULL, 10), strlen(body));
  assert_contains(body, "\"image\":\"127.0.0.1:5000/x:1\"");
  assert_contains(body, "\"cmd\":[\"echo\",\"hi\"]");
}

/* An answer that arrives in pieces, split inside the head and the body. */
static void test_answer_in_pieces(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {.pieces = {"HTTP/1.1 200 OK\r\nContent-Le", "ngth: 61\r\n\r",
                                      "\n{\"node_id\":\"gn-test-node\",", "\"version\":\"9.9.9\",\"provider\":false}",
                                      NULL},
                           .pause_ms = 20};
  run_result *r = run(f, &s, "--json status");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"version\": \"9.9.9\"");
}

/* A chunked answer (gpunetd sends Content-Length, a proxy might not). */
static void test_chunked_answer(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {
      .pieces = {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1a\r\n{\"node_id\":\"gn-test-node\",\r\n",
                 "23\r\n\"version\":\"9.9.9\",\"provider\":false}\r\n", "0\r\n\r\n", NULL},
      .pause_ms = 20};
  run_result *r = run(f, &s, "--json status");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"node_id\": \"gn-test-node\"");
  assert_contains(r->out, "\"version\": \"9.9.9\"");
}

/* A body without Content-Length runs to the end of the connection. */
static void test_answer_to_eof(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {.pieces = {"HTTP/1.1 200 OK\r\n\r\n" STATUS_BODY, NULL}};
  run_result *r = run(f, &s, "--json status");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"gn-test-node\"");
}

/* An error answer: its JSON message is what the user reads. */
static void test_error_message(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  /* logs asks first whether the id is a training job, then for the job's
   * log: both answered 404. */
  static const script s = {
      .pieces = {"HTTP/1.1 404 Not Found\r\nContent-Length: 29\r\n\r\n{\"error\":\"no job j-deadbeef\"}", NULL},
      .conns = 2};
  run_result *r = run(f, &s, "logs j-deadbeef");
  assert_int_equal(r->code, 1);
  assert_contains(r->err, "gpunet: no job j-deadbeef");
}

/* An error without a message names the status. */
static void test_error_without_message(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {.pieces = {"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", NULL}};
  run_result *r = run(f, &s, "status");
  assert_int_equal(r->code, 1);
  assert_contains(r->err, "gpunetd answered GET /v1/status with HTTP 503");
}

/* A body cut short of its Content-Length is an error, not a short answer. */
static void test_truncated_body(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {.pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n" STATUS_BODY, NULL}};
  run_result *r = run(f, &s, "--json status");
  assert_int_equal(r->code, 1);
  assert_contains(r->err, "malformed HTTP answer to GET /v1/status");
  assert_true(strstr(r->out, "gn-test-node") == NULL);
}

/* A chunked body without its last chunk is an error too. */
static void test_truncated_chunks(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {
      .pieces = {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n" STATUS_BODY "\r\n", NULL}};
  run_result *r = run(f, &s, "--json status");
  assert_int_equal(r->code, 1);
  assert_contains(r->err, "malformed HTTP answer");
}

/* What is not HTTP, and a close without a word. */
static void test_not_http_and_silence(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script junk = {.pieces = {"SSH-2.0-OpenSSH_9.6\r\n\r\n", NULL}};
  run_result *r = run(f, &junk, "status");
  assert_int_equal(r->code, 1);
  assert_contains(r->err, "malformed HTTP answer");
  static const script silence = {.pieces = {NULL}};
  r = run(f, &silence, "status");
  assert_int_equal(r->code, 1);
  assert_contains(r->err, "closed the connection without answering GET /v1/status");
}

/* A query value is percent-encoded, byte for byte (RFC 3986). */
static void test_query_escaped(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script s = {.pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"offers\":[]}", NULL}};
  run_result *r = run(f, &s, "offers gpu=rtx4090 'vram>=24'");
  assert_int_equal(r->code, 0);
  assert_contains(f->request, "filter=gpu%3Drtx4090%20vram%3E%3D24");
}

/* A provider with training off says so in gpunet status; a gpunetd whose
 * offers do not say whether they take training jobs shows "-" there. */
static void test_training_off_and_unsaid(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const script st = {
      .pieces = {"HTTP/1.1 200 OK\r\n\r\n{\"node_id\":\"gn-test-node\",\"provider\":true,\"training\":"
                 "{\"enabled\":false,\"jobnet_ports\":\"51820-51899\",\"ranks\":0}}",
                 NULL}};
  run_result *r = run(f, &st, "status");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "training   off: this provider takes no ranks of training jobs\n");
  assert_null(strstr(r->out, "51820"));
  static const script of = {
      .pieces = {"HTTP/1.1 200 OK\r\n\r\n{\"offers\":[{\"id\":\"o-cccccccccccc\",\"gpu_model\":\"RTX 4090\"}]}", NULL}};
  r = run(f, &of, "offers");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "TRAINING");
  const char *row = strstr(r->out, "o-cccccccccccc");
  assert_non_null(row);
  assert_non_null(strstr(row, " full       -         expired")); /* ISOLATION, TRAINING, EXPIRES */
  assert_null(strstr(row, "yes"));
}

/* No daemon at all: the message says how to start one. */
static void test_not_running(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  char cmd[1024], err[128];
  snprintf(err, sizeof err, "%s/err", f->dir);
  snprintf(cmd, sizeof cmd, "'%s' --data-dir '%s/none' status 2>'%s'", f->gpunet, f->dir, err);
  int st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  char buf[1024];
  tn_slurp(err, buf, sizeof buf);
  assert_contains(buf, "cannot reach gpunetd at ");
  assert_contains(buf, "is it running?");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_request_form, setup, teardown),
      cmocka_unit_test_setup_teardown(test_post_body, setup, teardown),
      cmocka_unit_test_setup_teardown(test_answer_in_pieces, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chunked_answer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_answer_to_eof, setup, teardown),
      cmocka_unit_test_setup_teardown(test_error_message, setup, teardown),
      cmocka_unit_test_setup_teardown(test_error_without_message, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_body, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_chunks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_not_http_and_silence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_query_escaped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_training_off_and_unsaid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_not_running, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
