/* A real HTTP server for the settlement tests: libmicrohttpd on 127.0.0.1
 * on an ephemeral port, one thread per connection. It records every request
 * (method, path, Idempotency-Key, Content-Type, body) and answers from a
 * script: an HTTP status per request (the last repeats), or 0 for a stall of
 * stall_ms before a 200. */
#ifndef GPUNET_TESTS_BILLING_SETTLE_SERVER_H
#define GPUNET_TESTS_BILLING_SETTLE_SERVER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <arpa/inet.h>
#include <gpunet/settle.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SS_MAX_REQS 16
#define SS_MAX_BODY (1 << 20)

typedef struct recorded {
  char method[8];
  char url[128];
  char key[GN_SETTLE_KEY_STRLEN + 8];
  char content_type[64];
  char *body;
  size_t body_len;
} recorded;

typedef struct server {
  struct MHD_Daemon *d;
  uint16_t port;
  pthread_mutex_t mu;
  recorded reqs[SS_MAX_REQS];
  int nreqs;
  /* The answers, in order (the last repeats): an HTTP status, or 0 for a
   * stall of stall_ms before answering 200. */
  unsigned script[8];
  int nscript;
  unsigned stall_ms;
  volatile int stopping; /* ends stalls early at server_stop */
  const char *answer_body;
} server;

typedef struct upload {
  char *buf;
  size_t len;
  bool too_big;
} upload;

static inline enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                         const char *version, const char *data, size_t *data_size, void **con_cls) {
  server *s = cls;
  (void)version;
  upload *up = *con_cls;
  if (!up) {
    *con_cls = up = calloc(1, sizeof(*up));
    return up ? MHD_YES : MHD_NO;
  }
  if (*data_size) {
    if (up->len + *data_size > SS_MAX_BODY) {
      up->too_big = true;
    } else {
      char *nb = realloc(up->buf, up->len + *data_size + 1);
      if (!nb)
        return MHD_NO;
      up->buf = nb;
      memcpy(up->buf + up->len, data, *data_size);
      up->len += *data_size;
      up->buf[up->len] = '\0';
    }
    *data_size = 0;
    return MHD_YES;
  }
  /* The whole request is in: record it and answer from the script. */
  pthread_mutex_lock(&s->mu);
  int i = s->nreqs < SS_MAX_REQS ? s->nreqs++ : -1;
  unsigned status = s->script[(i < 0 || i >= s->nscript) ? s->nscript - 1 : i];
  if (i >= 0) {
    recorded *r = &s->reqs[i];
    const char *key = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Idempotency-Key");
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->url, sizeof r->url, "%s", url);
    snprintf(r->key, sizeof r->key, "%s", key ? key : "");
    snprintf(r->content_type, sizeof r->content_type, "%s", ct ? ct : "");
    r->body = up->buf;
    r->body_len = up->len;
    up->buf = NULL;
  }
  unsigned stall = s->stall_ms;
  const char *text = s->answer_body ? s->answer_body : "{}";
  pthread_mutex_unlock(&s->mu);
  if (status == 0) {
    for (unsigned t = 0; t < stall && !s->stopping; t += 20)
      usleep(20 * 1000);
    status = 200;
  }
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ret = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static inline void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                                enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)conn;
  (void)toe;
  upload *up = *con_cls;
  if (up) {
    free(up->buf);
    free(up);
  }
  *con_cls = NULL;
}

static inline void server_start(server *s, const unsigned *script, int n) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  memcpy(s->script, script, (size_t)n * sizeof *script);
  s->nscript = n;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, s,
                          MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                          MHD_OPTION_END);
  assert_non_null(s->d);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  assert_non_null(info);
  s->port = info->port;
  assert_true(s->port != 0);
}

static inline void server_stop(server *s) {
  s->stopping = 1;
  MHD_stop_daemon(s->d);
  for (int i = 0; i < s->nreqs && i < SS_MAX_REQS; i++)
    free(s->reqs[i].body);
  pthread_mutex_destroy(&s->mu);
}

static inline int server_count(server *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->nreqs;
  pthread_mutex_unlock(&s->mu);
  return n;
}

#endif
