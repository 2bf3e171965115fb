/* Tests of the control server: a real Unix socket in a temporary directory,
 * the libuv loop on its own thread, and libcurl as the client. */
#include <gpunet/node.h>

#include <curl/curl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

/* Commands the test thread sends to the loop thread. */
enum { CMD_NONE, CMD_CLOSE_CTL, CMD_REPLY_HELD, CMD_STOP };

typedef struct fixture {
  char dir[64];
  char sock[128];
  uv_loop_t loop;
  uv_async_t async;
  gn_ctl *ctl;
  pthread_t thread;
  atomic_int cmd;
  atomic_int handler_calls;
  gn_ctl_req *_Atomic held; /* a request a handler keeps without replying */
  uv_timer_t slow_timer;
  gn_ctl_req *slow_req;
} fixture;

/* --- handlers (run on the loop thread) ---------------------------------------*/

static void on_echo(gn_ctl_req *r, void *ud) {
  fixture *f = ud;
  atomic_fetch_add(&f->handler_calls, 1);
  const char *q = gn_ctl_req_query(r, "offset");
  gn_ctl_reply_json(
      r, 200,
      json_pack("{s:s, s:s, s:s?}", "method", gn_ctl_req_method(r), "id", gn_ctl_req_param(r, "id"), "offset", q));
}

static void on_body(gn_ctl_req *r, void *ud) {
  fixture *f = ud;
  atomic_fetch_add(&f->handler_calls, 1);
  const json_t *b = gn_ctl_req_body(r);
  if (!b) {
    gn_ctl_reply_error(r, 400, "no body");
    return;
  }
  gn_ctl_reply_json(r, 201, json_pack("{s:O}", "got", (json_t *)b));
}

/* Echoes an application/octet-stream body back as bytes; 400 without one. */
static void on_bytes(gn_ctl_req *r, void *ud) {
  fixture *f = ud;
  size_t len = 0;
  const uint8_t *b = gn_ctl_req_raw_body(r, &len);
  atomic_fetch_add(&f->handler_calls, 1);
  if (!b) {
    gn_ctl_reply_error(r, 400, "no bytes");
    return;
  }
  gn_ctl_reply_bytes(r, 200, b, len);
}

static void on_slow_timer(uv_timer_t *t) {
  fixture *f = t->data;
  gn_ctl_reply_json(f->slow_req, 202, json_pack("{s:b}", "late", 1));
  f->slow_req = NULL;
}

/* Replies only after a uv timer fired, i.e. after the handler returned. */
static void on_slow(gn_ctl_req *r, void *ud) {
  fixture *f = ud;
  atomic_fetch_add(&f->handler_calls, 1);
  f->slow_req = r;
  uv_timer_start(&f->slow_timer, on_slow_timer, 50, 0);
}

static void on_hold(gn_ctl_req *r, void *ud) {
  fixture *f = ud;
  atomic_fetch_add(&f->handler_calls, 1);
  atomic_store(&f->held, r);
}

static void on_text(gn_ctl_req *r, void *ud) {
  (void)ud;
  gn_ctl_reply_text(r, 200, "text/plain", "hello\n");
}

/* --- the loop thread ---------------------------------------------------------*/

static void on_async(uv_async_t *a) {
  fixture *f = a->data;
  int cmd = atomic_exchange(&f->cmd, CMD_NONE);
  if (cmd == CMD_CLOSE_CTL || cmd == CMD_STOP) {
    gn_ctl_close(f->ctl);
    f->ctl = NULL;
  }
  if (cmd == CMD_REPLY_HELD || cmd == CMD_STOP) {
    gn_ctl_req *r = atomic_exchange(&f->held, NULL);
    if (r)
      gn_ctl_reply_error(r, 500, "late reply");
  }
  if (cmd == CMD_STOP) {
    uv_close((uv_handle_t *)&f->async, NULL);
    uv_close((uv_handle_t *)&f->slow_timer, NULL);
  }
}

static void *loop_main(void *arg) {
  fixture *f = arg;
  uv_run(&f->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* Sends cmd to the loop thread and waits until it was taken. */
static void loop_do(fixture *f, int cmd) {
  atomic_store(&f->cmd, cmd);
  uv_async_send(&f->async);
  while (atomic_load(&f->cmd) != CMD_NONE)
    usleep(1000);
  usleep(20000); /* let the loop finish what the command started */
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  snprintf(f->dir, sizeof(f->dir), "/tmp/gn-ctl-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->sock, sizeof(f->sock), "%s/gpunetd.sock", f->dir);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  assert_int_equal(uv_async_init(&f->loop, &f->async, on_async), 0);
  f->async.data = f;
  uv_timer_init(&f->loop, &f->slow_timer);
  f->slow_timer.data = f;
  assert_int_equal(gn_ctl_new(&f->loop, f->sock, &f->ctl), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "GET", "/v1/echo/:id/logs", on_echo, f), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "POST", "/v1/body", on_body, f), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "POST", "/v1/bytes", on_bytes, f), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "GET", "/v1/slow", on_slow, f), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "GET", "/v1/hold", on_hold, f), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "GET", "/v1/text", on_text, f), 0);
  assert_int_equal(pthread_create(&f->thread, NULL, loop_main, f), 0);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  loop_do(f, CMD_STOP);
  pthread_join(f->thread, NULL);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  unlink(f->sock);
  rmdir(f->dir);
  free(f);
  return 0;
}

/* --- the client --------------------------------------------------------------*/

typedef struct reply {
  long status;
  gn_buf body;
  CURLcode rc;
} reply;

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
  reply *r = ud;
  gn_buf_append(&r->body, p, size * n);
  return size * n;
}

static reply request_as(fixture *f, const char *method, const char *path, const char *body, size_t body_len,
                        long timeout_ms, const char *content_type) {
  reply r = {0};
  CURL *c = curl_easy_init();
  char ct[128];
  struct curl_slist *hdrs = NULL;
  if (content_type) {
    snprintf(ct, sizeof ct, "Content-Type: %s", content_type);
    hdrs = curl_slist_append(NULL, ct);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  }
  char url[512];
  snprintf(url, sizeof(url), "http://gpunetd%s", path);
  curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, f->sock);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms ? timeout_ms : 10000L);
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  r.rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_easy_cleanup(c);
  curl_slist_free_all(hdrs);
  gn_buf_append(&r.body, "", 1);
  return r;
}

static reply request(fixture *f, const char *method, const char *path, const char *body, size_t body_len,
                     long timeout_ms) {
  return request_as(f, method, path, body, body_len, timeout_ms, NULL);
}

static json_t *reply_json(reply *r) {
  json_t *j = json_loads((const char *)r->body.data, 0, NULL);
  assert_non_null(j);
  return j;
}

static const char *jstr(json_t *j, const char *key) {
  return json_string_value(json_object_get(j, key));
}

/* --- tests -------------------------------------------------------------------*/

static void test_ctl_get_passes_params_and_query(void **state) {
  fixture *f = *state;
  reply r = request(f, "GET", "/v1/echo/j-42/logs?offset=17&wait_ms=1000", NULL, 0, 0);
  assert_int_equal(r.rc, CURLE_OK);
  assert_int_equal(r.status, 200);
  json_t *j = reply_json(&r);
  assert_string_equal(jstr(j, "method"), "GET");
  assert_string_equal(jstr(j, "id"), "j-42");
  assert_string_equal(jstr(j, "offset"), "17");
  json_decref(j);
  gn_buf_done(&r.body);
}

static void test_ctl_missing_query_is_null(void **state) {
  fixture *f = *state;
  reply r = request(f, "GET", "/v1/echo/x/logs", NULL, 0, 0);
  assert_int_equal(r.status, 200);
  json_t *j = reply_json(&r);
  assert_true(json_is_null(json_object_get(j, "offset")));
  json_decref(j);
  gn_buf_done(&r.body);
}

static void test_ctl_post_body_reaches_handler(void **state) {
  fixture *f = *state;
  const char *body = "{\"hours\": 2, \"gpu\": \"rtx4090\"}";
  reply r = request(f, "POST", "/v1/body", body, strlen(body), 0);
  assert_int_equal(r.status, 201);
  json_t *j = reply_json(&r);
  json_t *got = json_object_get(j, "got");
  assert_int_equal(json_integer_value(json_object_get(got, "hours")), 2);
  assert_string_equal(jstr(got, "gpu"), "rtx4090");
  json_decref(j);
  gn_buf_done(&r.body);
}

/* A body sent as application/octet-stream reaches the handler as bytes (NULs
 * and all, not parsed as JSON) and gn_ctl_reply_bytes answers bytes; the
 * same bytes as any other type are still refused as invalid JSON. */
static void test_ctl_octet_stream_body_and_bytes_reply(void **state) {
  fixture *f = *state;
  static const char bin[] = {'\x00', '{', '\xff', 'x', '\x00', '\n'};
  reply r = request_as(f, "POST", "/v1/bytes", bin, sizeof bin, 0, "application/octet-stream");
  assert_int_equal(r.status, 200);
  assert_int_equal(r.body.len, sizeof bin + 1); /* request() appends a NUL */
  assert_memory_equal(r.body.data, bin, sizeof bin);
  gn_buf_done(&r.body);
  r = request_as(f, "POST", "/v1/bytes", bin, sizeof bin, 0, "application/json");
  assert_int_equal(r.status, 400);
  gn_buf_done(&r.body);
  r = request_as(f, "POST", "/v1/bytes", "{}", 2, 0, "application/json");
  assert_int_equal(r.status, 400); /* a JSON body is no raw body */
  gn_buf_done(&r.body);
}

static void test_ctl_unknown_path_is_404(void **state) {
  fixture *f = *state;
  reply r = request(f, "GET", "/v1/x", NULL, 0, 0);
  assert_int_equal(r.status, 404);
  json_t *j = reply_json(&r);
  assert_string_equal(jstr(j, "error"), "no such endpoint: GET /v1/x");
  json_decref(j);
  gn_buf_done(&r.body);
}

static void test_ctl_wrong_method_is_405(void **state) {
  fixture *f = *state;
  reply r = request(f, "DELETE", "/v1/body", NULL, 0, 0);
  assert_int_equal(r.status, 405);
  json_t *j = reply_json(&r);
  assert_non_null(jstr(j, "error"));
  json_decref(j);
  gn_buf_done(&r.body);
}

static void test_ctl_body_over_limit_is_413(void **state) {
  fixture *f = *state;
  size_t n = GN_CTL_MAX_BODY + 1;
  char *big = malloc(n);
  memset(big, ' ', n);
  reply r = request(f, "POST", "/v1/body", big, n, 0);
  assert_int_equal(r.status, 413);
  assert_int_equal(atomic_load(&f->handler_calls), 0);
  free(big);
  gn_buf_done(&r.body);
}

typedef struct chunk_src {
  size_t left;
} chunk_src;

static size_t on_read(char *buf, size_t size, size_t n, void *ud) {
  chunk_src *src = ud;
  size_t k = size * n < src->left ? size * n : src->left;
  memset(buf, ' ', k);
  src->left -= k;
  return k;
}

/* Without a Content-Length the limit is enforced while reading. */
static void test_ctl_chunked_body_over_limit_is_413(void **state) {
  fixture *f = *state;
  chunk_src src = {.left = GN_CTL_MAX_BODY + 4096};
  reply r = {0};
  CURL *c = curl_easy_init();
  struct curl_slist *h = curl_slist_append(NULL, "Transfer-Encoding: chunked");
  curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, f->sock);
  curl_easy_setopt(c, CURLOPT_URL, "http://gpunetd/v1/body");
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
  curl_easy_setopt(c, CURLOPT_READDATA, &src);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
  assert_int_equal(curl_easy_perform(c), CURLE_OK);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_easy_cleanup(c);
  curl_slist_free_all(h);
  assert_int_equal(r.status, 413);
  assert_int_equal(atomic_load(&f->handler_calls), 0);
  gn_buf_done(&r.body);
}

static void test_ctl_body_at_limit_is_accepted(void **state) {
  fixture *f = *state;
  size_t n = GN_CTL_MAX_BODY;
  char *big = malloc(n);
  memset(big, ' ', n);
  memcpy(big, "{\"a\":1}", 7);
  reply r = request(f, "POST", "/v1/body", big, n, 0);
  assert_int_equal(r.status, 201);
  free(big);
  gn_buf_done(&r.body);
}

static void test_ctl_invalid_json_is_400_before_handler(void **state) {
  fixture *f = *state;
  reply r = request(f, "POST", "/v1/body", "{\"a\":", 5, 0);
  assert_int_equal(r.status, 400);
  json_t *j = reply_json(&r);
  assert_non_null(strstr(jstr(j, "error"), "invalid JSON"));
  assert_int_equal(atomic_load(&f->handler_calls), 0);
  json_decref(j);
  gn_buf_done(&r.body);
}

static void test_ctl_async_reply_after_timer(void **state) {
  fixture *f = *state;
  uint64_t t0 = gn_mono_ms();
  reply r = request(f, "GET", "/v1/slow", NULL, 0, 0);
  assert_int_equal(r.status, 202);
  assert_true(gn_mono_ms() - t0 >= 45);
  json_t *j = reply_json(&r);
  assert_true(json_is_true(json_object_get(j, "late")));
  json_decref(j);
  gn_buf_done(&r.body);
  /* And the server still serves after a suspend/resume cycle. */
  r = request(f, "GET", "/v1/text", NULL, 0, 0);
  assert_int_equal(r.status, 200);
  assert_string_equal((const char *)r.body.data, "hello\n");
  gn_buf_done(&r.body);
}

static void test_ctl_socket_mode_is_0600(void **state) {
  fixture *f = *state;
  struct stat st;
  assert_int_equal(stat(f->sock, &st), 0);
  assert_true(S_ISSOCK(st.st_mode));
  assert_int_equal(st.st_mode & 0777, 0600);
}

static void test_ctl_second_server_on_same_path_is_busy(void **state) {
  fixture *f = *state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  gn_ctl *c = NULL;
  assert_int_equal(gn_ctl_new(&loop, f->sock, &c), GN_EBUSY);
  assert_null(c);
  uv_loop_close(&loop);
  /* The first server is untouched. */
  reply r = request(f, "GET", "/v1/text", NULL, 0, 0);
  assert_int_equal(r.status, 200);
  gn_buf_done(&r.body);
}

static void test_ctl_stale_socket_is_replaced(void **state) {
  (void)state;
  char dir[] = "/tmp/gn-ctl-stale-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof(path), "%s/s.sock", dir);
  /* A socket file left by a daemon that died. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1); /* short: a mkdtemp path */
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  close(fd);
  uv_loop_t loop;
  uv_loop_init(&loop);
  gn_ctl *c = NULL;
  assert_int_equal(gn_ctl_new(&loop, path, &c), 0);
  gn_ctl_close(c);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  assert_int_equal(access(path, F_OK), -1); /* close unlinks it */
  rmdir(dir);
}

static void test_ctl_refuses_to_replace_a_regular_file(void **state) {
  (void)state;
  char dir[] = "/tmp/gn-ctl-file-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof(path), "%s/s.sock", dir);
  FILE *fp = fopen(path, "w");
  fputs("precious", fp);
  fclose(fp);
  uv_loop_t loop;
  uv_loop_init(&loop);
  gn_ctl *c = NULL;
  assert_int_equal(gn_ctl_new(&loop, path, &c), GN_EEXIST);
  uv_loop_close(&loop);
  assert_int_equal(access(path, F_OK), 0);
  unlink(path);
  rmdir(dir);
}

typedef struct client_arg {
  fixture *f;
  reply r;
  long timeout_ms;
} client_arg;

static void *client_main(void *arg) {
  client_arg *a = arg;
  a->r = request(a->f, "GET", "/v1/hold", NULL, 0, a->timeout_ms);
  return NULL;
}

static void wait_held(fixture *f) {
  for (int i = 0; i < 5000 && !atomic_load(&f->held); i++)
    usleep(1000);
  assert_non_null(atomic_load(&f->held));
}

static void test_ctl_close_answers_pending_503(void **state) {
  fixture *f = *state;
  client_arg a = {.f = f};
  pthread_t t;
  pthread_create(&t, NULL, client_main, &a);
  wait_held(f);
  loop_do(f, CMD_CLOSE_CTL);
  pthread_join(t, NULL);
  assert_int_equal(a.r.status, 503);
  assert_non_null(strstr((const char *)a.r.body.data, "shutting down"));
  gn_buf_done(&a.r.body);
  /* The handler's late reply only frees the detached request. */
  loop_do(f, CMD_REPLY_HELD);
  assert_null(atomic_load(&f->held));
}

static void test_ctl_reply_after_client_left_is_safe(void **state) {
  fixture *f = *state;
  client_arg a = {.f = f, .timeout_ms = 100};
  pthread_t t;
  pthread_create(&t, NULL, client_main, &a);
  wait_held(f);
  pthread_join(t, NULL);
  assert_int_equal(a.r.rc, CURLE_OPERATION_TIMEDOUT);
  gn_buf_done(&a.r.body);
  loop_do(f, CMD_REPLY_HELD);
  /* Still serving. */
  reply r = request(f, "GET", "/v1/text", NULL, 0, 0);
  assert_int_equal(r.status, 200);
  gn_buf_done(&r.body);
}

static void test_ctl_many_sequential_requests(void **state) {
  fixture *f = *state;
  for (int i = 0; i < 200; i++) {
    reply r = request(f, "GET", i % 2 ? "/v1/text" : "/v1/slow-not-there", NULL, 0, 0);
    assert_int_equal(r.status, i % 2 ? 200 : 404);
    gn_buf_done(&r.body);
  }
}

/* --- over TCP (gn_ctl_new_tcp) ------------------------------------------------*/

typedef struct tcp_fixture {
  uv_loop_t loop;
  uv_async_t async;
  gn_ctl *ctl;
  pthread_t thread;
} tcp_fixture;

static void tcp_on_async(uv_async_t *a) {
  tcp_fixture *t = a->data;
  gn_ctl_close(t->ctl);
  t->ctl = NULL;
  uv_close((uv_handle_t *)&t->async, NULL);
}

static void *tcp_loop_main(void *arg) {
  tcp_fixture *t = arg;
  uv_run(&t->loop, UV_RUN_DEFAULT);
  return NULL;
}

static long tcp_request(int port, const char *method, const char *path, gn_buf *body) {
  CURL *c = curl_easy_init();
  char url[256];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
  reply r = {0};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
  if (strcmp(method, "POST") == 0)
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  gn_buf_append(&r.body, "", 1);
  if (body)
    *body = r.body;
  else
    gn_buf_done(&r.body);
  return rc == CURLE_OK ? status : -1;
}

/* A TCP server answers the routes it was given and nothing else: the
 * metrics listener's guarantee that no control path is reachable. */
static void test_ctl_tcp_serves_only_its_routes(void **state) {
  (void)state;
  tcp_fixture t = {0};
  assert_int_equal(uv_loop_init(&t.loop), 0);
  assert_int_equal(uv_async_init(&t.loop, &t.async, tcp_on_async), 0);
  t.async.data = &t;
  assert_int_equal(gn_ctl_new_tcp(&t.loop, "127.0.0.1", 0, &t.ctl), 0);
  assert_int_equal(gn_ctl_route(t.ctl, "GET", "/metrics", on_text, NULL), 0);
  int port = gn_ctl_tcp_port(t.ctl);
  assert_true(port > 0);
  assert_int_equal(pthread_create(&t.thread, NULL, tcp_loop_main, &t), 0);
  gn_buf body = {0};
  assert_int_equal(tcp_request(port, "GET", "/metrics", &body), 200);
  assert_string_equal((const char *)body.data, "hello\n");
  gn_buf_done(&body);
  assert_int_equal(tcp_request(port, "GET", "/v1/status", NULL), 404);
  assert_int_equal(tcp_request(port, "POST", "/v1/leases", NULL), 404);
  assert_int_equal(tcp_request(port, "POST", "/metrics", NULL), 405);
  uv_async_send(&t.async);
  pthread_join(t.thread, NULL);
  assert_int_equal(uv_loop_close(&t.loop), 0);
}

static void test_ctl_tcp_bad_address_and_taken_port(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  gn_ctl *a = NULL, *b = NULL;
  assert_int_equal(gn_ctl_new_tcp(&loop, "localhost", 0, &b), GN_EINVAL);
  assert_int_equal(gn_ctl_new_tcp(&loop, "127.0.0.1", 70000, &b), GN_EINVAL);
  assert_int_equal(gn_ctl_new_tcp(&loop, "127.0.0.1", 0, &a), 0);
  assert_int_equal(gn_ctl_new_tcp(&loop, "127.0.0.1", gn_ctl_tcp_port(a), &b), -EADDRINUSE);
  assert_null(b);
  gn_ctl_close(a);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ctl_get_passes_params_and_query, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_missing_query_is_null, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_post_body_reaches_handler, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_octet_stream_body_and_bytes_reply, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_unknown_path_is_404, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_wrong_method_is_405, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_body_over_limit_is_413, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_chunked_body_over_limit_is_413, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_body_at_limit_is_accepted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_invalid_json_is_400_before_handler, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_async_reply_after_timer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_socket_mode_is_0600, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_second_server_on_same_path_is_busy, setup, teardown),
      cmocka_unit_test(test_ctl_stale_socket_is_replaced),
      cmocka_unit_test(test_ctl_refuses_to_replace_a_regular_file),
      cmocka_unit_test_setup_teardown(test_ctl_close_answers_pending_503, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_reply_after_client_left_is_safe, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ctl_many_sequential_requests, setup, teardown),
      cmocka_unit_test(test_ctl_tcp_serves_only_its_routes),
      cmocka_unit_test(test_ctl_tcp_bad_address_and_taken_port),
  };
  int r = cmocka_run_group_tests_name("epoll", tests, NULL, NULL);
  /* Again without epoll: MHD polled from a timer, the portable fallback. */
  setenv("GN_CTL_NO_EPOLL", "1", 1);
  r += cmocka_run_group_tests_name("fallback", tests, NULL, NULL);
  curl_global_cleanup();
  return r;
}
