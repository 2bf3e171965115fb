/* The control server: HTTP/JSON on an owner-only Unix socket, served by
 * libmicrohttpd without a thread of its own and driven from the libuv loop. */
#include <gpunet/node.h>
#include <gpunet/uvutil.h>

#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CTL_MAX_QUERY 32       /* query arguments kept per request */
#define CTL_MAX_SEGMENTS 16    /* path segments in a route pattern */
#define CTL_MAX_PATH 2048      /* longer request paths get 414 */
#define CTL_CONN_LIMIT 128     /* concurrent client connections */
#define CTL_CONN_TIMEOUT_S 120 /* idle connections are dropped after this */
#define CTL_TCP_CONN_LIMIT 16  /* the same over TCP (gn_ctl_new_tcp) */
#define CTL_TCP_CONN_TIMEOUT_S 10
/* Without epoll, libuv cannot safely watch MHD's connection sockets (MHD
 * closes and reuses them inside MHD_run), so the fallback watches only the
 * listen socket and runs MHD this often while a connection is active. */
#define CTL_FALLBACK_ACTIVE_MS 1
#define CTL_FALLBACK_IDLE_MS 1000
#define CTL_MAX_HEADERS 8 /* gn_ctl_add_header */

typedef struct ctl_kv {
  char *key;
  char *val;
} ctl_kv;

typedef struct ctl_route {
  char *method;
  char *pattern;
  char *segs[CTL_MAX_SEGMENTS];
  size_t nsegs;
  gn_ctl_handler fn;
  void *ud;
} ctl_route;

struct gn_ctl_req {
  gn_ctl *ctl;                 /* NULL once detached from the server */
  struct MHD_Connection *conn; /* NULL once the connection is finished */
  gn_ctl_req *prev, *next;     /* in ctl->suspended while suspended */
  char method[16];
  char *path;
  ctl_kv params[CTL_MAX_SEGMENTS];
  size_t nparams;
  ctl_kv query[CTL_MAX_QUERY];
  size_t nquery;
  gn_buf body;
  json_t *json;
  bool too_big;
  bool raw;       /* an application/octet-stream body, kept as bytes (gn_ctl_req_raw_body) */
  bool owed;      /* a handler holds the req and has not replied yet */
  bool answered;  /* a response (r->resp, or NULL if none could be made) is set */
  bool suspended; /* the connection waits for that reply */
  bool queued;    /* a response was handed to MHD */
  unsigned status;
  struct MHD_Response *resp; /* made, not yet queued */
};

struct gn_ctl {
  uv_loop_t *loop;
  struct MHD_Daemon *mhd;
  char *path;
  uv_poll_t *poll; /* MHD's epoll fd, or the listen socket in fallback mode */
  bool epoll;
  size_t nsuspended;
  uv_timer_t *timer; /* MHD's timeouts, and runs after a resume */
  int handles_open;  /* the struct is freed when the last handle closed */
  bool closing;
  ctl_route *routes;
  size_t nroutes;
  gn_ctl_req *suspended;
  gn_ctl_guard guard;
  void *guard_ud;
  ctl_kv headers[CTL_MAX_HEADERS]; /* sent with every response */
  size_t nheaders;
};

static void ctl_rearm(gn_ctl *c);
static void ctl_on_timer(uv_timer_t *t);

/* --- handle lifetime -------------------------------------------------------*/

static void ctl_free(gn_ctl *c) {
  for (size_t i = 0; i < c->nroutes; i++) {
    free(c->routes[i].method);
    free(c->routes[i].pattern);
    for (size_t j = 0; j < c->routes[i].nsegs; j++)
      free(c->routes[i].segs[j]);
  }
  free(c->routes);
  for (size_t i = 0; i < c->nheaders; i++) {
    free(c->headers[i].key);
    free(c->headers[i].val);
  }
  free(c->path);
  free(c);
}

/* The uv handles are freed by gn_uv_close_free; the server itself goes with
 * the last of them. */
static void ctl_on_handle_closed(void *arg) {
  gn_ctl *c = arg;
  if (--c->handles_open == 0)
    ctl_free(c);
}

/* --- requests ----------------------------------------------------------------*/

static void req_free(gn_ctl_req *r) {
  free(r->path);
  for (size_t i = 0; i < r->nparams; i++) {
    free(r->params[i].key);
    free(r->params[i].val);
  }
  for (size_t i = 0; i < r->nquery; i++) {
    free(r->query[i].key);
    free(r->query[i].val);
  }
  gn_buf_done(&r->body);
  json_decref(r->json);
  if (r->resp)
    MHD_destroy_response(r->resp);
  free(r);
}

static void req_unlink(gn_ctl_req *r) {
  if (!r->suspended)
    return;
  if (r->ctl)
    r->ctl->nsuspended--;
  if (r->prev)
    r->prev->next = r->next;
  else if (r->ctl)
    r->ctl->suspended = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
  r->suspended = false;
}

static struct MHD_Response *resp_from(const char *content_type, const char *data, size_t len) {
  /* MHD frees a MUST_FREE buffer with free(), so hand it our own copy. */
  char *copy = malloc(len ? len : 1);
  if (!copy)
    return NULL;
  memcpy(copy, data, len);
  struct MHD_Response *resp = MHD_create_response_from_buffer(len, copy, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(copy);
    return NULL;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  return resp;
}

static struct MHD_Response *resp_json(json_t *body) {
  char *s = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  json_decref(body);
  if (!s)
    return NULL;
  size_t n = strlen(s);
  struct MHD_Response *resp = NULL;
  char *line = malloc(n + 2);
  if (line) {
    memcpy(line, s, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    resp = resp_from("application/json", line, n + 1);
    free(line);
  }
  free(s);
  return resp;
}

static struct MHD_Response *resp_errorv(const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  return resp_json(json_pack("{s:s}", "error", msg));
}

static struct MHD_Response *resp_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static struct MHD_Response *resp_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  struct MHD_Response *resp = resp_errorv(fmt, ap);
  va_end(ap);
  return resp;
}

/* Schedules an MHD_run soon: needed after a resume, which MHD only acts on
 * during its next run. */
static void ctl_kick(gn_ctl *c) {
  if (c && !c->closing)
    uv_timer_start(c->timer, ctl_on_timer, 0, 0);
}

/* Attaches the answer for the connection; the access handler queues it when
 * MHD calls it next (directly, or after a resume). A response that could not
 * be built becomes a 500, and if even that fails the connection is dropped. */
static void req_answer(gn_ctl_req *r, unsigned status, struct MHD_Response *resp) {
  if (!resp) {
    status = MHD_HTTP_INTERNAL_SERVER_ERROR;
    resp = resp_error("gpunetd could not encode its answer");
  }
  if (r->answered) {
    if (resp)
      MHD_destroy_response(resp);
    return;
  }
  r->answered = true;
  r->status = status;
  r->resp = resp;
}

/* A handler's reply: the one way a req that was handed out ends. */
static void req_respond(gn_ctl_req *r, unsigned status, struct MHD_Response *resp) {
  if (!r->owed) {
    /* A second reply is a programming error; keep the first one. */
    if (resp)
      MHD_destroy_response(resp);
    return;
  }
  r->owed = false;
  if (!r->conn) {
    /* The client went away or the server closed: nobody to answer. */
    if (resp)
      MHD_destroy_response(resp);
    req_free(r);
    return;
  }
  req_answer(r, status, resp); /* a no-op if close() already answered 503 */
  if (r->suspended) {
    gn_ctl *c = r->ctl;
    req_unlink(r);
    MHD_resume_connection(r->conn);
    ctl_kick(c);
  }
}

void gn_ctl_reply_json(gn_ctl_req *r, unsigned status, json_t *body) {
  req_respond(r, status, resp_json(body));
}

void gn_ctl_reply_error(gn_ctl_req *r, unsigned status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  struct MHD_Response *resp = resp_errorv(fmt, ap);
  va_end(ap);
  req_respond(r, status, resp);
}

void gn_ctl_reply_bytes(gn_ctl_req *r, unsigned status, const void *data, size_t len) {
  req_respond(r, status, resp_from("application/octet-stream", data ? data : "", data ? len : 0));
}

const uint8_t *gn_ctl_req_raw_body(const gn_ctl_req *r, size_t *ret_len) {
  *ret_len = r->raw ? r->body.len : 0;
  return r->raw ? r->body.data : NULL;
}

void gn_ctl_reply_text(gn_ctl_req *r, unsigned status, const char *content_type, const char *text) {
  req_respond(
      r, status,
      resp_from(content_type ? content_type : "text/plain; charset=utf-8", text ? text : "", text ? strlen(text) : 0));
}

const char *gn_ctl_req_method(const gn_ctl_req *r) {
  return r->method;
}

const char *gn_ctl_req_path(const gn_ctl_req *r) {
  return r->path;
}

static const char *kv_find(const ctl_kv *kv, size_t n, const char *key) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(kv[i].key, key) == 0)
      return kv[i].val;
  return NULL;
}

const char *gn_ctl_req_header(const gn_ctl_req *r, const char *name) {
  return r->conn ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name) : NULL;
}

const char *gn_ctl_req_param(const gn_ctl_req *r, const char *name) {
  return kv_find(r->params, r->nparams, name);
}

const char *gn_ctl_req_query(const gn_ctl_req *r, const char *name) {
  return kv_find(r->query, r->nquery, name);
}

const json_t *gn_ctl_req_body(const gn_ctl_req *r) {
  return r->json;
}

/* --- routing -----------------------------------------------------------------*/

/* Splits a path into at most max segments (empty segments dropped); returns
 * the count, or -1 when there are more. Modifies s. */
static int path_split(char *s, char **segs, size_t max) {
  size_t n = 0;
  for (char *save = NULL, *tok = strtok_r(s, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
    if (n == max)
      return -1;
    segs[n++] = tok;
  }
  return (int)n;
}

static bool route_matches(const ctl_route *rt, char **segs, size_t n) {
  if (rt->nsegs != n)
    return false;
  for (size_t i = 0; i < n; i++)
    if (rt->segs[i][0] != ':' && strcmp(rt->segs[i], segs[i]) != 0)
      return false;
  return true;
}

int gn_ctl_route(gn_ctl *c, const char *method, const char *pattern, gn_ctl_handler fn, void *ud) {
  if (!c || !method || !pattern || !fn || strlen(method) >= sizeof(((gn_ctl_req *)0)->method))
    return GN_EINVAL;
  char *tmp = strdup(pattern);
  char *segs[CTL_MAX_SEGMENTS];
  int n = tmp ? path_split(tmp, segs, CTL_MAX_SEGMENTS) : 0;
  if (!tmp || n < 0) {
    free(tmp);
    return tmp ? GN_ETOOBIG : GN_ENOMEM;
  }
  ctl_route *routes = realloc(c->routes, (c->nroutes + 1) * sizeof(*routes));
  if (!routes) {
    free(tmp);
    return GN_ENOMEM;
  }
  c->routes = routes;
  ctl_route *rt = &routes[c->nroutes];
  memset(rt, 0, sizeof(*rt));
  rt->method = strdup(method);
  rt->pattern = strdup(pattern);
  bool ok = rt->method && rt->pattern;
  for (int i = 0; i < n; i++) {
    rt->segs[i] = strdup(segs[i]);
    ok = ok && rt->segs[i];
  }
  rt->nsegs = (size_t)n;
  rt->fn = fn;
  rt->ud = ud;
  free(tmp);
  if (!ok) {
    free(rt->method);
    free(rt->pattern);
    for (int i = 0; i < n; i++)
      free(rt->segs[i]);
    return GN_ENOMEM;
  }
  c->nroutes++;
  return 0;
}

int gn_ctl_route_find(const gn_ctl *c, const char *method, const char *pattern, gn_ctl_handler *ret_fn, void **ret_ud) {
  for (size_t i = 0; c && method && pattern && i < c->nroutes; i++)
    if (strcmp(c->routes[i].method, method) == 0 && strcmp(c->routes[i].pattern, pattern) == 0) {
      *ret_fn = c->routes[i].fn;
      *ret_ud = c->routes[i].ud;
      return 0;
    }
  return GN_ENOTFOUND;
}

void gn_ctl_set_guard(gn_ctl *c, gn_ctl_guard fn, void *ud) {
  c->guard = fn;
  c->guard_ud = ud;
}

int gn_ctl_add_header(gn_ctl *c, const char *name, const char *value) {
  if (!c || !name || !value)
    return GN_EINVAL;
  if (c->nheaders == CTL_MAX_HEADERS)
    return GN_ETOOBIG;
  char *k = strdup(name), *v = strdup(value);
  if (!k || !v) {
    free(k);
    free(v);
    return GN_ENOMEM;
  }
  c->headers[c->nheaders].key = k;
  c->headers[c->nheaders].val = v;
  c->nheaders++;
  return 0;
}

static enum MHD_Result req_collect_query(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  gn_ctl_req *r = cls;
  if (r->nquery == CTL_MAX_QUERY)
    return MHD_NO; /* stop iterating: the rest is ignored */
  char *k = strdup(key);
  char *v = strdup(value ? value : "");
  if (!k || !v) {
    free(k);
    free(v);
    return MHD_NO;
  }
  r->query[r->nquery].key = k;
  r->query[r->nquery].val = v;
  r->nquery++;
  return MHD_YES;
}

/* Finds the route, records its parameters and calls its handler; or answers
 * 404/405 itself. */
static void req_dispatch(gn_ctl *c, gn_ctl_req *r) {
  char *tmp = strdup(r->path);
  char *segs[CTL_MAX_SEGMENTS];
  int n = tmp ? path_split(tmp, segs, CTL_MAX_SEGMENTS) : -1;
  const ctl_route *found = NULL;
  bool other_method = false;
  for (size_t i = 0; n >= 0 && i < c->nroutes && !found; i++) {
    if (!route_matches(&c->routes[i], segs, (size_t)n))
      continue;
    if (strcmp(c->routes[i].method, r->method) == 0)
      found = &c->routes[i];
    else
      other_method = true;
  }
  if (!found) {
    free(tmp);
    if (other_method)
      req_answer(r, MHD_HTTP_METHOD_NOT_ALLOWED, resp_error("method %s not allowed on %s", r->method, r->path));
    else
      req_answer(r, MHD_HTTP_NOT_FOUND, resp_error("no such endpoint: %s %s", r->method, r->path));
    return;
  }
  /* Route parameters name objects (jobs, leases, invoices) and end up in
   * lookups, SQL and paths: they must be ids, whoever asks. */
  for (size_t i = 0; i < found->nsegs; i++) {
    if (found->segs[i][0] != ':' || gn_id_valid(segs[i]))
      continue;
    char shown[GN_ID_MAX + 4];
    gn_printable_copy(segs[i], shown, sizeof(shown));
    req_answer(r, MHD_HTTP_BAD_REQUEST,
               resp_error("'%s' is not a valid %s: ids are 1 to %d letters, digits, '-' or '_', starting with a "
                          "letter or digit",
                          shown, found->segs[i] + 1, GN_ID_MAX));
    free(tmp);
    return;
  }
  bool ok = true;
  for (size_t i = 0; i < found->nsegs; i++) {
    if (found->segs[i][0] != ':')
      continue;
    r->params[r->nparams].key = strdup(found->segs[i] + 1);
    r->params[r->nparams].val = strdup(segs[i]);
    r->nparams++;
    ok = ok && r->params[r->nparams - 1].key && r->params[r->nparams - 1].val;
  }
  free(tmp);
  MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, req_collect_query, r);
  if (!ok) {
    req_answer(r, MHD_HTTP_INTERNAL_SERVER_ERROR, resp_error("out of memory"));
    return;
  }
  r->owed = true; /* from here only the handler's reply ends the req */
  found->fn(r, found->ud);
}

/* --- MHD callbacks -----------------------------------------------------------*/

static enum MHD_Result req_queue(gn_ctl_req *r) {
  struct MHD_Response *resp = r->resp;
  r->resp = NULL;
  r->queued = true;
  if (!resp)
    return MHD_NO; /* could not build one: drop the connection */
  for (size_t i = 0; r->ctl && i < r->ctl->nheaders; i++)
    MHD_add_response_header(resp, r->ctl->headers[i].key, r->ctl->headers[i].val);
  enum MHD_Result ret = MHD_queue_response(r->conn, r->status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static enum MHD_Result ctl_on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                     const char *version, const char *upload_data, size_t *upload_data_size,
                                     void **con_cls) {
  (void)version;
  gn_ctl *c = cls;
  gn_ctl_req *r = *con_cls;
  if (!r) {
    r = calloc(1, sizeof(*r));
    if (!r)
      return MHD_NO;
    r->ctl = c;
    r->conn = conn;
    *con_cls = r;
    snprintf(r->method, sizeof(r->method), "%s", method);
    if (strlen(url) > CTL_MAX_PATH) {
      r->path = strdup("/");
      req_answer(r, MHD_HTTP_URI_TOO_LONG, resp_error("request path longer than %d bytes", CTL_MAX_PATH));
      return req_queue(r);
    }
    r->path = strdup(url);
    if (!r->path)
      return MHD_NO;
    char why[256] = "";
    unsigned refused = c->guard ? c->guard(r, c->guard_ud, why, sizeof why) : 0;
    if (refused) {
      req_answer(r, refused, resp_error("%s", why[0] ? why : "refused"));
      return req_queue(r);
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > GN_CTL_MAX_BODY) {
      /* Answer before the body is sent (curl waits for 100-continue). */
      req_answer(r, MHD_HTTP_CONTENT_TOO_LARGE, resp_error("request body over %d bytes", GN_CTL_MAX_BODY));
      return req_queue(r);
    }
    return MHD_YES;
  }
  if (r->queued) {
    *upload_data_size = 0; /* the answer is out: discard the rest */
    return MHD_YES;
  }
  if (r->answered) /* resumed after an asynchronous reply */
    return req_queue(r);
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (r->too_big || r->body.len + n > GN_CTL_MAX_BODY) {
      /* Keep reading (and dropping) so the 413 goes out cleanly. */
      r->too_big = true;
      gn_buf_done(&r->body);
      return MHD_YES;
    }
    return gn_buf_append(&r->body, upload_data, n) == 0 ? MHD_YES : MHD_NO;
  }
  /* The whole request is in. */
  if (r->too_big) {
    req_answer(r, MHD_HTTP_CONTENT_TOO_LARGE, resp_error("request body over %d bytes", GN_CTL_MAX_BODY));
    return req_queue(r);
  }
  const char *ct =
      r->body.len ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE) : NULL;
  if (ct && strncmp(ct, "application/octet-stream", 24) == 0) {
    r->raw = true;
  } else if (r->body.len) {
    json_error_t jerr;
    r->json = json_loadb((const char *)r->body.data, r->body.len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!r->json) {
      req_answer(r, MHD_HTTP_BAD_REQUEST,
                 resp_error("invalid JSON body: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column));
      return req_queue(r);
    }
    gn_buf_done(&r->body);
  }
  req_dispatch(c, r);
  if (r->answered)
    return req_queue(r);
  /* The handler will reply later: park the connection until then. */
  MHD_suspend_connection(conn);
  r->suspended = true;
  c->nsuspended++;
  r->next = c->suspended;
  if (r->next)
    r->next->prev = r;
  c->suspended = r;
  return MHD_YES;
}

static void ctl_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                             enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)conn;
  (void)toe;
  gn_ctl_req *r = *con_cls;
  if (!r)
    return;
  *con_cls = NULL;
  req_unlink(r);
  r->conn = NULL;
  r->ctl = NULL;
  if (!r->owed)
    req_free(r);
  /* else the handler still holds it; its reply frees it. */
}

/* --- driving MHD from libuv --------------------------------------------------*/

static void ctl_run(gn_ctl *c) {
  if (c->closing)
    return;
  MHD_run(c->mhd);
  ctl_rearm(c);
}

static void ctl_on_timer(uv_timer_t *t) {
  ctl_run(t->data);
}

static void ctl_on_poll(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  ctl_run(p->data);
}

static void ctl_rearm(gn_ctl *c) {
  MHD_UNSIGNED_LONG_LONG to = 0;
  uint64_t ms;
  if (MHD_get_timeout(c->mhd, &to) == MHD_YES)
    ms = to;
  else
    ms = 60000; /* nothing due: the poll wakes us for anything new */
  if (!c->epoll) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(c->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    size_t active = info && info->num_connections > c->nsuspended ? info->num_connections - c->nsuspended : 0;
    uint64_t cap = active ? CTL_FALLBACK_ACTIVE_MS : CTL_FALLBACK_IDLE_MS;
    if (ms > cap)
      ms = cap;
  }
  uv_timer_start(c->timer, ctl_on_timer, ms, 0);
}

/* --- socket ------------------------------------------------------------------*/

/* Binds the Unix socket with mode 0600 from the start: the umask covers the
 * window between bind() and chmod(). */
static int ctl_bind(const char *path, int *ret_fd) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(sa.sun_path))
    return GN_EINVAL;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -errno;
  int r = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    mode_t old = umask(077);
    r = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 0 : -errno;
    umask(old);
    if (r != -EADDRINUSE || attempt == 1)
      break;
    /* Something is there. Replace it only if it is a socket nobody serves. */
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
      r = GN_EEXIST;
      break;
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
      r = -errno;
      break;
    }
    int cr = connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 0 : -errno;
    close(probe);
    if (cr == 0 || cr == -EAGAIN) {
      r = GN_EBUSY; /* another daemon answers there */
      break;
    }
    if (unlink(path) < 0 && errno != ENOENT) {
      r = -errno;
      break;
    }
  }
  if (r == 0 && chmod(path, 0600) < 0)
    r = -errno;
  if (r == 0 && listen(fd, 64) < 0)
    r = -errno;
  if (r < 0) {
    close(fd);
    return r;
  }
  *ret_fd = fd;
  return 0;
}

/* Binds a TCP listen socket on ip:port (port 0: the kernel picks one). */
static int ctl_bind_tcp(const char *ip, int port, int *ret_fd) {
  struct sockaddr_storage ss;
  socklen_t len;
  struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
  memset(&ss, 0, sizeof(ss));
  if (uv_ip4_addr(ip, port, a4) == 0)
    len = sizeof(*a4);
  else if (uv_ip6_addr(ip, port, a6) == 0)
    len = sizeof(*a6);
  else
    return GN_EINVAL;
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -errno;
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 16) < 0) {
    int r = -errno;
    close(fd);
    return r;
  }
  *ret_fd = fd;
  return 0;
}

static int ctl_start(uv_loop_t *loop, const char *sock_path, const char *ip, int port, gn_ctl **ret) {
  int fd = -1, r;
  gn_ctl *c = calloc(1, sizeof(*c));
  if (!c)
    return GN_ENOMEM;
  c->loop = loop;
  c->path = strdup(sock_path ? sock_path : "");
  c->timer = gn_uv_handle_alloc(sizeof(*c->timer));
  /* GN_CTL_NO_EPOLL=1 forces the portable fallback, so tests cover it too. */
  const char *no_epoll = getenv("GN_CTL_NO_EPOLL");
  bool epoll = MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES && !(no_epoll && no_epoll[0] == '1');
  c->epoll = epoll;
  c->poll = gn_uv_handle_alloc(sizeof(*c->poll));
  if (!c->path || !c->timer || !c->poll) {
    r = GN_ENOMEM;
    goto fail;
  }
  r = sock_path ? ctl_bind(sock_path, &fd) : ctl_bind_tcp(ip, port, &fd);
  if (r < 0)
    goto fail;
  /* Over TCP (metrics only) fewer clients, and a shorter idle time. */
  unsigned conn_limit = sock_path ? CTL_CONN_LIMIT : CTL_TCP_CONN_LIMIT;
  unsigned conn_timeout = sock_path ? CTL_CONN_TIMEOUT_S : CTL_TCP_CONN_TIMEOUT_S;
  unsigned flags = MHD_ALLOW_SUSPEND_RESUME | (epoll ? MHD_USE_EPOLL : 0);
  c->mhd = MHD_start_daemon(flags, 0, NULL, NULL, ctl_on_access, c, MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_NOTIFY_COMPLETED, ctl_on_completed, c, MHD_OPTION_CONNECTION_LIMIT, conn_limit,
                            MHD_OPTION_CONNECTION_TIMEOUT, conn_timeout, MHD_OPTION_END);
  if (!c->mhd) {
    close(fd);
    if (sock_path)
      unlink(sock_path);
    r = GN_EIO;
    goto fail;
  }
  /* From here MHD owns fd and closes it in MHD_stop_daemon. */
  uv_timer_init(loop, c->timer);
  c->timer->data = c;
  c->handles_open++;
  const union MHD_DaemonInfo *info = epoll ? MHD_get_daemon_info(c->mhd, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
  r = epoll && !info ? GN_EIO : uv_poll_init(loop, c->poll, epoll ? info->epoll_fd : fd);
  if (r < 0) {
    gn_uv_handle_free_unused(c->poll);
    c->poll = NULL;
    gn_ctl_close(c);
    return r;
  }
  c->poll->data = c;
  c->handles_open++;
  uv_poll_start(c->poll, UV_READABLE, ctl_on_poll);
  ctl_rearm(c);
  *ret = c;
  return 0;
fail:
  gn_uv_handle_free_unused(c->poll);
  gn_uv_handle_free_unused(c->timer);
  free(c->path);
  free(c);
  return r;
}

int gn_ctl_new(uv_loop_t *loop, const char *sock_path, gn_ctl **ret) {
  if (!loop || !sock_path || !ret)
    return GN_EINVAL;
  return ctl_start(loop, sock_path, NULL, 0, ret);
}

int gn_ctl_new_tcp(uv_loop_t *loop, const char *ip, int port, gn_ctl **ret) {
  if (!loop || !ip || port < 0 || port > 65535 || !ret)
    return GN_EINVAL;
  return ctl_start(loop, NULL, ip, port, ret);
}

int gn_ctl_tcp_port(const gn_ctl *c) {
  const union MHD_DaemonInfo *info = c && c->mhd ? MHD_get_daemon_info(c->mhd, MHD_DAEMON_INFO_LISTEN_FD) : NULL;
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (!info || getsockname(info->listen_fd, (struct sockaddr *)&ss, &len) < 0)
    return GN_EINVAL;
  if (ss.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return GN_EINVAL;
}

void gn_ctl_close(gn_ctl *c) {
  if (!c || c->closing)
    return;
  /* Answer what is still waiting, and give MHD a few runs to send it. */
  while (c->suspended) {
    gn_ctl_req *r = c->suspended;
    req_unlink(r);
    req_answer(r, MHD_HTTP_SERVICE_UNAVAILABLE, resp_error("gpunetd is shutting down"));
    MHD_resume_connection(r->conn);
  }
  for (int i = 0; i < 4; i++)
    MHD_run(c->mhd);
  c->closing = true;
  if (c->poll)
    gn_uv_close_free((uv_handle_t *)c->poll, ctl_on_handle_closed, c);
  gn_uv_close_free((uv_handle_t *)c->timer, ctl_on_handle_closed, c);
  MHD_stop_daemon(c->mhd); /* detaches every remaining req, closes the fd */
  c->mhd = NULL;
  if (c->path[0])
    unlink(c->path);
}
