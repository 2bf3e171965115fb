/* The lease holder's end of forwarded ports: POST /v1/forwards makes a TCP
 * listener on a local address; each connection accepted there opens a
 * stream (FWD_OPEN) to the lease's provider. GET /v1/forwards lists them,
 * DELETE /v1/forwards/:id removes one; a forward ends with its lease. */
#include "fwd.h"
#include "node_internal.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

struct gn__fwd_forward {
  gn__fwd_forward *next;
  gn__fwd *f;
  char id[GN_JOB_ID_STRLEN]; /* "f-" + 12 hex */
  char lease_id[GN_LEASE_ID_STRLEN];
  char job_id[GN_JOB_ID_STRLEN]; /* "" when none was named */
  char local[80];                /* the address bound, "127.0.0.1:18000" */
  uint16_t port;
  uint8_t peer[GN_PK_LEN];
  bool loopback;
  int64_t created_s;
  uint64_t streams_total, refused;
  uint64_t bytes_in, bytes_out; /* received from the sandbox, sent to it */
  char last_error[GN_FWD_REASON_LEN];
  uv_tcp_t listener;
  bool closing;
};

static void free_forward_cb(uv_handle_t *h) {
  free(h->data);
}

static json_t *forward_json(const gn__fwd_forward *fw) {
  const gn__fwd *f = fw->f;
  size_t open = 0;
  for (const gn__fwd_stream *s = f->streams; s; s = s->next)
    open += s->fw == fw;
  json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:b, s:I, s:I, s:I, s:I}", "id", fw->id, "lease", fw->lease_id, "local",
                        fw->local, "port", (int)fw->port, "loopback", fw->loopback, "created_s",
                        (json_int_t)fw->created_s, "streams_open", (json_int_t)open, "streams_total",
                        (json_int_t)fw->streams_total, "refused", (json_int_t)fw->refused);
  if (o) {
    json_object_set_new(o, "bytes_in", json_integer((json_int_t)fw->bytes_in));
    json_object_set_new(o, "bytes_out", json_integer((json_int_t)fw->bytes_out));
  }
  if (o && fw->job_id[0])
    json_object_set_new(o, "job", json_string(fw->job_id));
  if (o && fw->last_error[0])
    json_object_set_new(o, "last_error", json_string(fw->last_error));
  return o;
}

/* Ends a forward: its streams are reset, its listener closed. */
static void forward_remove(gn__fwd_forward *fw, const char *why) {
  gn__fwd *f = fw->f;
  for (gn__fwd_forward **p = &f->forwards; *p; p = &(*p)->next)
    if (*p == fw) {
      *p = fw->next;
      f->nforwards--;
      break;
    }
  for (gn__fwd_stream *s = f->streams, *next; s; s = next) {
    next = s->next;
    if (s->fw == fw)
      gn__fwd_stream_reset(s, f->n->tp && gn_transport_is_up(f->n->tp, s->peer), why);
  }
  fw->closing = true;
  fw->listener.data = fw;
  uv_close((uv_handle_t *)&fw->listener, free_forward_cb);
}

/* Takes the pending connection and closes it at once. */
static void refuse_local(gn__fwd_forward *fw, uv_stream_t *server, const char *why) {
  fw->refused++;
  gn__strf(fw->last_error, sizeof fw->last_error, "%s", why);
  gn_log_ratelimited("fwd-local", GN_LOG_WARN, "forward %s: refused a connection: %s", fw->id, why);
  uv_tcp_t *c = malloc(sizeof *c);
  if (!c || uv_tcp_init(fw->f->n->loop, c) < 0) {
    free(c);
    return;
  }
  c->data = c;
  (void)uv_accept(server, (uv_stream_t *)c);
  uv_close((uv_handle_t *)c, free_forward_cb);
}

static void on_connection(uv_stream_t *server, int status) {
  gn__fwd_forward *fw = server->data;
  gn__fwd *f = fw->f;
  gn_node *n = f->n;
  if (status < 0 || fw->closing)
    return;
  gn_lease *l = gn__lease_find(n, fw->lease_id);
  char why[160];
  if (!l || l->state != GN_LEASE_ACTIVE) {
    refuse_local(fw, server, "the lease has ended");
    return;
  }
  if (!n->tp || !gn_transport_is_up(n->tp, fw->peer)) {
    refuse_local(fw, server, "no session with the lease's provider now");
    return;
  }
  if (gn__fwd_streams_of_lease(f, fw->lease_id) >= GN_FWD_STREAMS_PER_LEASE) {
    gn__strf(why, sizeof why, "lease %s has %d streams open already", fw->lease_id, GN_FWD_STREAMS_PER_LEASE);
    refuse_local(fw, server, why);
    return;
  }
  gn__fwd_stream *s = gn__fwd_stream_new(f, fw->peer, f->next_stream, true);
  if (!s) {
    refuse_local(fw, server, "out of memory");
    return;
  }
  f->next_stream = f->next_stream == UINT32_MAX ? 1 : f->next_stream + 1;
  if (uv_accept(server, (uv_stream_t *)&s->tcp) < 0) {
    gn__fwd_stream_reset(s, false, "");
    return;
  }
  s->fw = fw;
  snprintf(s->lease_id, sizeof s->lease_id, "%s", fw->lease_id);
  snprintf(s->job_id, sizeof s->job_id, "%s", fw->job_id);
  s->port = fw->port;
  gn_fwdopen m;
  memset(&m, 0, sizeof m);
  m.stream = s->id;
  snprintf(m.lease_id, sizeof m.lease_id, "%s", fw->lease_id);
  snprintf(m.job_id, sizeof m.job_id, "%s", fw->job_id);
  m.port = fw->port;
  randombytes_buf(m.nonce, sizeof m.nonce);
  m.issued_s = gn_unix_s();
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  int r = gn__fwdopen_encode(&m, &w);
  if (r == 0)
    r = gn__fwd_send(f, fw->peer, GN_MSG_FWD_OPEN, &w);
  gn_wire_writer_done(&w);
  if (r < 0) {
    gn__fwd_stream_reset(s, false, "");
    return;
  }
  fw->streams_total++;
  f->opened++;
  /* Bytes the renter sends before the provider connected wait there,
   * within the window; a refusal resets the stream. */
  gn__fwd_stream_connected(s);
}

void gn__fwd_req_count(gn__fwd_stream *s, uint64_t in, uint64_t out) {
  if (s->fw) {
    s->fw->bytes_in += in;
    s->fw->bytes_out += out;
  }
}

void gn__fwd_req_on_open_refused(gn__fwd_stream *s, const char *reason) {
  if (s->fw && reason && reason[0])
    gn__strf(s->fw->last_error, sizeof s->fw->last_error, "%s", reason);
}

void gn__fwd_req_check(gn__fwd *f) {
  gn_node *n = f->n;
  for (gn__fwd_forward *fw = f->forwards, *next; fw; fw = next) {
    next = fw->next;
    gn_lease *l = gn__lease_find(n, fw->lease_id);
    if (!l || l->state != GN_LEASE_ACTIVE) {
      gn_log(GN_LOG_INFO, "forward %s ends: lease %s ended", fw->id, fw->lease_id);
      forward_remove(fw, "the lease ended");
    }
  }
  for (gn__fwd_stream *s = f->streams, *next; s; s = next) {
    next = s->next;
    if (s->opener && !(n->tp && gn_transport_is_up(n->tp, s->peer)))
      gn__fwd_stream_reset(s, false, "");
  }
}

void gn__fwd_req_close(gn__fwd *f) {
  while (f->forwards)
    forward_remove(f->forwards, "the node shuts down");
}

static gn__fwd_forward *forward_find(gn__fwd *f, const char *id) {
  for (gn__fwd_forward *fw = f->forwards; fw; fw = fw->next)
    if (strcmp(fw->id, id) == 0)
      return fw;
  return NULL;
}

/* "PORT", "ADDR:PORT" or "[V6]:PORT" (port 0: the system picks one). */
static int parse_local(const char *s, struct sockaddr_storage *ret) {
  char host[64];
  const char *colon = strrchr(s, ':');
  const char *port_s = colon ? colon + 1 : s;
  size_t hl = colon ? (size_t)(colon - s) : 0;
  if (!colon)
    snprintf(host, sizeof host, "127.0.0.1");
  else if (hl >= sizeof host)
    return GN_EINVAL;
  else if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']')
    snprintf(host, sizeof host, "%.*s", (int)(hl - 2), s + 1);
  else
    snprintf(host, sizeof host, "%.*s", (int)hl, s);
  char *end;
  if (!*port_s || strlen(port_s) > 5)
    return GN_EINVAL;
  unsigned long p = strtoul(port_s, &end, 10);
  if (*end || p > 65535)
    return GN_EINVAL;
  memset(ret, 0, sizeof *ret);
  if (uv_ip4_addr(host, (int)p, (struct sockaddr_in *)ret) == 0)
    return 0;
  if (uv_ip6_addr(host, (int)p, (struct sockaddr_in6 *)ret) == 0)
    return 0;
  return GN_EINVAL;
}

static bool is_loopback(const struct sockaddr_storage *sa) {
  if (sa->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(a);
}

static void api_create(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  gn__fwd *f = n->fwd;
  const json_t *b = gn_ctl_req_body(req);
  const char *lease_id = json_string_value(json_object_get(b, "lease"));
  const char *job_id = json_string_value(json_object_get(b, "job"));
  const json_t *lj = json_object_get(b, "local");
  json_int_t port = json_integer_value(json_object_get(b, "port"));
  char local_in[80];
  if (!f || f->closing) {
    gn_ctl_reply_error(req, 503, "gpunetd is shutting down");
    return;
  }
  if (!lease_id || !gn_id_valid(lease_id)) {
    gn_ctl_reply_error(req, 400, "lease: a lease id is required");
    return;
  }
  if (!gn__body_id_ok(req, "job", "job"))
    return;
  if (!json_is_integer(json_object_get(b, "port")) || port < 1 || port > 65535) {
    gn_ctl_reply_error(req, 400, "port: the port in the sandbox must be 1..65535");
    return;
  }
  if (json_is_integer(lj))
    gn__strf(local_in, sizeof local_in, "%lld", (long long)json_integer_value(lj));
  else if (json_is_string(lj) && strlen(json_string_value(lj)) < sizeof local_in)
    gn__strf(local_in, sizeof local_in, "%s", json_string_value(lj));
  else {
    gn_ctl_reply_error(req, 400, "local: [ADDR:]PORT is required");
    return;
  }
  struct sockaddr_storage sa;
  if (parse_local(local_in, &sa) < 0) {
    gn_ctl_reply_error(req, 400, "local: %s is not [ADDR:]PORT with a literal IP address and a port 0..65535",
                       local_in);
    return;
  }
  gn_lease *l = gn__lease_find(n, lease_id);
  if (!l || l->role != GN_ROLE_REQUESTER) {
    gn_ctl_reply_error(req, 404, "no lease %s held by this node", lease_id);
    return;
  }
  if (l->state != GN_LEASE_ACTIVE) {
    gn_ctl_reply_error(req, 409, "lease %s has ended", lease_id);
    return;
  }
  if (job_id) {
    gn_job *j = gn__job_find(n, job_id);
    if (!j || j->role != GN_ROLE_REQUESTER || strcmp(j->lease_id, lease_id) != 0) {
      gn_ctl_reply_error(req, 404, "no job %s on lease %s", job_id, lease_id);
      return;
    }
  }
  if (f->nforwards >= GN_FWD_MAX_FORWARDS) {
    gn_ctl_reply_error(req, 429, "this node has %d forwards already", GN_FWD_MAX_FORWARDS);
    return;
  }
  gn__fwd_forward *fw = calloc(1, sizeof *fw);
  if (!fw) {
    gn_ctl_reply_error(req, 500, "out of memory");
    return;
  }
  fw->f = f;
  int r = uv_tcp_init(n->loop, &fw->listener);
  if (r < 0) {
    free(fw);
    gn_ctl_reply_error(req, 500, "cannot make a socket: %s", uv_strerror(r));
    return;
  }
  fw->listener.data = fw;
  if ((r = uv_tcp_bind(&fw->listener, (const struct sockaddr *)&sa, 0)) == 0)
    r = uv_listen((uv_stream_t *)&fw->listener, 64, on_connection);
  if (r < 0) {
    uv_close((uv_handle_t *)&fw->listener, free_forward_cb);
    gn_ctl_reply_error(req, r == UV_EADDRINUSE ? 409 : 400, "cannot listen on %s: %s", local_in, uv_strerror(r));
    return;
  }
  struct sockaddr_storage got;
  int glen = sizeof got;
  char ip[INET6_ADDRSTRLEN] = "?";
  int gport = 0;
  if (uv_tcp_getsockname(&fw->listener, (struct sockaddr *)&got, &glen) == 0) {
    if (got.ss_family == AF_INET) {
      uv_ip4_name((struct sockaddr_in *)&got, ip, sizeof ip);
      gport = ntohs(((struct sockaddr_in *)&got)->sin_port);
    } else {
      uv_ip6_name((struct sockaddr_in6 *)&got, ip, sizeof ip);
      gport = ntohs(((struct sockaddr_in6 *)&got)->sin6_port);
    }
  }
  gn__strf(fw->local, sizeof fw->local, got.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, gport);
  uint8_t rnd[6];
  randombytes_buf(rnd, sizeof rnd);
  gn__strf(fw->id, sizeof fw->id, "f-%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
  snprintf(fw->lease_id, sizeof fw->lease_id, "%s", lease_id);
  snprintf(fw->job_id, sizeof fw->job_id, "%s", job_id ? job_id : "");
  fw->port = (uint16_t)port;
  memcpy(fw->peer, l->peer, GN_PK_LEN);
  fw->loopback = is_loopback(&sa);
  fw->created_s = gn_unix_s();
  fw->next = f->forwards;
  f->forwards = fw;
  f->nforwards++;
  json_t *o = forward_json(fw);
  if (!fw->loopback) {
    gn_log(GN_LOG_WARN,
           "forward %s listens on %s, not a loopback address: anyone who reaches it reaches port %d "
           "in lease %s's sandbox",
           fw->id, fw->local, fw->port, fw->lease_id);
    json_object_set_new(o, "warning",
                        json_string("the local address is not loopback: anyone who can reach it reaches the "
                                    "sandbox's port"));
  }
  gn_log(GN_LOG_INFO, "forward %s: %s -> lease %s port %d", fw->id, fw->local, fw->lease_id, fw->port);
  gn_ctl_reply_json(req, 201, json_pack("{s:o}", "forward", o));
}

static void api_list(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  json_t *a = json_array();
  for (gn__fwd_forward *fw = n->fwd ? n->fwd->forwards : NULL; fw; fw = fw->next)
    json_array_append_new(a, forward_json(fw));
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "forwards", a));
}

static void api_get(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *id = gn_ctl_req_param(req, "id");
  gn__fwd_forward *fw = n->fwd && id ? forward_find(n->fwd, id) : NULL;
  if (!fw) {
    gn_ctl_reply_error(req, 404, "no forward %s (it was removed, or its lease ended)", id ? id : "");
    return;
  }
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "forward", forward_json(fw)));
}

static void api_delete(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *id = gn_ctl_req_param(req, "id");
  gn__fwd_forward *fw = n->fwd && id ? forward_find(n->fwd, id) : NULL;
  if (!fw) {
    gn_ctl_reply_error(req, 404, "no forward %s", id ? id : "");
    return;
  }
  json_t *o = forward_json(fw);
  gn_log(GN_LOG_INFO, "forward %s removed", fw->id);
  forward_remove(fw, "the forward was removed");
  gn_ctl_reply_json(req, 200, json_pack("{s:o, s:b}", "forward", o, "removed", 1));
}

void gn__fwd_req_register(gn_node *n) {
  gn_ctl_route(n->ctl, "POST", "/v1/forwards", api_create, n);
  gn_ctl_route(n->ctl, "GET", "/v1/forwards", api_list, n);
  gn_ctl_route(n->ctl, "GET", "/v1/forwards/:id", api_get, n);
  gn_ctl_route(n->ctl, "DELETE", "/v1/forwards/:id", api_delete, n);
}
