/* The provider dashboard (docs/dashboard.md): gpunetd serves a page and a few
 * read-only JSON routes on a loopback TCP port, and samples its earnings and
 * GPU figures every 10 s into a fixed-size ring the page plots. The page's
 * files are compiled in (CMakeLists.txt makes gn_dashboard_assets.h from
 * node/dashboard/), so nothing is read or fetched at run time. */
#include "dashboard.h"

#include "api.h"
#include "attest_net.h"
#include "node_internal.h"
#include "util.h"

#include <gn_dashboard_assets.h>
#include <gpunet/uvutil.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

struct gn__dash {
  gn_ctl *ctl;
  uv_timer_t *timer;
  char token[GN_DASH_TOKEN_HEX + 1];
  gn__dash_ring ring;
};

/* --- the history ring ------------------------------------------------------*/

int gn__dash_ring_init(gn__dash_ring *r, size_t cap, size_t ngpus) {
  memset(r, 0, sizeof *r);
  if (cap == 0)
    return GN_EINVAL;
  r->cap = cap;
  r->ngpus = ngpus;
  r->t_s = calloc(cap, sizeof *r->t_s);
  r->earned_micro = calloc(cap, sizeof *r->earned_micro);
  r->util_pct = calloc(cap * (ngpus ? ngpus : 1), sizeof *r->util_pct);
  r->power_mw = calloc(cap * (ngpus ? ngpus : 1), sizeof *r->power_mw);
  if (!r->t_s || !r->earned_micro || !r->util_pct || !r->power_mw) {
    gn__dash_ring_done(r);
    return GN_ENOMEM;
  }
  return 0;
}

void gn__dash_ring_done(gn__dash_ring *r) {
  free(r->t_s);
  free(r->earned_micro);
  free(r->util_pct);
  free(r->power_mw);
  memset(r, 0, sizeof *r);
}

void gn__dash_ring_push(gn__dash_ring *r, int64_t t_s, uint64_t earned_micro, const int16_t *util_pct,
                        const int32_t *power_mw) {
  size_t i = r->head;
  r->t_s[i] = t_s;
  r->earned_micro[i] = earned_micro;
  for (size_t g = 0; g < r->ngpus; g++) {
    r->util_pct[i * r->ngpus + g] = util_pct[g];
    r->power_mw[i * r->ngpus + g] = power_mw[g];
  }
  r->head = (r->head + 1) % r->cap;
  if (r->count < r->cap)
    r->count++;
}

size_t gn__dash_ring_index(const gn__dash_ring *r, size_t i) {
  return (r->head + r->cap - r->count + i) % r->cap;
}

/* One point onto the columns of o (as gn__dash_ring_json makes them). */
static void point_append(json_t *o, int64_t t_s, uint64_t earned_micro, size_t ngpus, const int16_t *util_pct,
                         const int32_t *power_mw) {
  json_array_append_new(json_object_get(o, "t_s"), json_integer(t_s));
  json_array_append_new(json_object_get(o, "earned_micro"), json_integer((json_int_t)earned_micro));
  json_t *gpus = json_object_get(o, "gpus");
  for (size_t g = 0; g < ngpus; g++) {
    json_t *col = json_array_get(gpus, g);
    json_array_append_new(json_object_get(col, "util_pct"), util_pct[g] >= 0 ? json_integer(util_pct[g]) : json_null());
    json_array_append_new(json_object_get(col, "power_w"),
                          power_mw[g] >= 0 ? json_real(power_mw[g] / 1000.0) : json_null());
  }
}

json_t *gn__dash_ring_json(const gn__dash_ring *r, int64_t since_s, size_t max_points) {
  json_t *o = json_pack("{s:[], s:[], s:[]}", "t_s", "earned_micro", "gpus");
  if (!o)
    return NULL;
  for (size_t g = 0; g < r->ngpus; g++)
    json_array_append_new(json_object_get(o, "gpus"), json_pack("{s:[], s:[]}", "util_pct", "power_w"));
  size_t first = 0;
  while (first < r->count && r->t_s[gn__dash_ring_index(r, first)] <= since_s)
    first++;
  size_t n = r->count - first;
  if (n == 0 || max_points == 0)
    return o;
  /* Every stride-th sample counted back from the newest, so the newest is
   * always there and at most max_points are. */
  size_t stride = (n + max_points - 1) / max_points;
  for (size_t k = 0; k < n; k++) {
    if ((n - 1 - k) % stride != 0)
      continue;
    size_t i = gn__dash_ring_index(r, first + k);
    point_append(o, r->t_s[i], r->earned_micro[i], r->ngpus, r->util_pct + i * r->ngpus, r->power_mw + i * r->ngpus);
  }
  return o;
}

/* --- request checks ----------------------------------------------------------*/

static bool port_ok(const char *p) {
  size_t n = strspn(p, "0123456789");
  return p[n] == '\0' && n <= 5;
}

bool gn__dash_host_ok(const char *host) {
  if (!host || strlen(host) > 64)
    return false;
  if (host[0] == '[') {
    if (strncmp(host, "[::1]", 5) != 0)
      return false;
    return host[5] == '\0' || (host[5] == ':' && host[6] && port_ok(host + 6));
  }
  char name[65];
  memcpy(name, host, strlen(host) + 1);
  char *colon = strchr(name, ':');
  if (colon) {
    if (!colon[1] || !port_ok(colon + 1))
      return false;
    *colon = '\0';
  }
  if (strcasecmp(name, "localhost") == 0)
    return true;
  struct in_addr a4;
  return inet_pton(AF_INET, name, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
}

bool gn__dash_token_ok(const char *auth, const char *token) {
  static const char scheme[] = "Bearer ";
  if (!auth || !token || strncasecmp(auth, scheme, sizeof scheme - 1) != 0)
    return false;
  const char *given = auth + sizeof scheme - 1;
  /* The lengths are no secret; the digits are compared in constant time. */
  if (strlen(given) != GN_DASH_TOKEN_HEX || strlen(token) != GN_DASH_TOKEN_HEX)
    return false;
  return sodium_memcmp(given, token, GN_DASH_TOKEN_HEX) == 0;
}

unsigned gn__dash_check(const char *method, const char *path, const char *host, const char *auth, const char *token,
                        char *msg, size_t cap) {
  if (!gn__dash_host_ok(host)) {
    char shown[72];
    gn_printable_copy(host ? host : "", shown, sizeof shown);
    gn__strf(msg, cap,
             "the dashboard answers only requests for localhost, 127.0.0.1 or [::1], not for '%s' (open it through "
             "those names, e.g. over an SSH tunnel)",
             shown);
    return 421;
  }
  if (!method || strcmp(method, "GET") != 0) {
    gn__strf(msg, cap, "the dashboard is read-only: only GET");
    return 405;
  }
  if (path && strncmp(path, "/v1/", 4) == 0 && !gn__dash_token_ok(auth, token)) {
    gn__strf(msg, cap,
             "missing or wrong token: send 'Authorization: Bearer' and the token of DATA_DIR/dashboard.token");
    return 401;
  }
  return 0;
}

static unsigned dash_guard(const gn_ctl_req *r, void *ud, char *msg, size_t cap) {
  struct gn__dash *d = ud;
  return gn__dash_check(gn_ctl_req_method(r), gn_ctl_req_path(r), gn_ctl_req_header(r, "Host"),
                        gn_ctl_req_header(r, "Authorization"), d->token, msg, cap);
}

/* --- the token ---------------------------------------------------------------*/

static bool is_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return true;
}

static int token_read(int fd, char ret_hex[GN_DASH_TOKEN_HEX + 1]) {
  char buf[GN_DASH_TOKEN_HEX + 4];
  ssize_t got = read(fd, buf, sizeof buf);
  if (got < 0)
    return -errno;
  size_t n = (size_t)got;
  if (n && buf[n - 1] == '\n')
    n--;
  if (n != GN_DASH_TOKEN_HEX || !is_hex(buf, n))
    return GN_EPROTO;
  memcpy(ret_hex, buf, GN_DASH_TOKEN_HEX);
  ret_hex[GN_DASH_TOKEN_HEX] = '\0';
  sodium_memzero(buf, sizeof buf);
  return 0;
}

static int token_write(const char *data_dir, const char *path, char hex[GN_DASH_TOKEN_HEX + 1]) {
  char tmp[4096];
  int r = gn__pathf(tmp, sizeof tmp, "%s/dashboard.token.tmp", data_dir);
  if (r < 0)
    return r;
  uint8_t raw[GN_DASH_TOKEN_HEX / 2];
  randombytes_buf(raw, sizeof raw);
  gn__hex(raw, sizeof raw, hex);
  sodium_memzero(raw, sizeof raw);
  char line[GN_DASH_TOKEN_HEX + 1];
  memcpy(line, hex, GN_DASH_TOKEN_HEX);
  line[GN_DASH_TOKEN_HEX] = '\n';
  if (unlink(tmp) < 0 && errno != ENOENT)
    return -errno;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return -errno;
  r = write(fd, line, sizeof line) == (ssize_t)sizeof line && fsync(fd) == 0 ? 0 : (errno ? -errno : GN_EIO);
  sodium_memzero(line, sizeof line);
  close(fd);
  if (r == 0 && rename(tmp, path) < 0)
    r = -errno;
  if (r < 0) {
    unlink(tmp);
    return r;
  }
  int dfd = open(data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return 0;
}

int gn__dash_token_load(const char *data_dir, char ret_hex[GN_DASH_TOKEN_HEX + 1], bool *ret_created) {
  char path[4096], hex[GN_DASH_TOKEN_HEX + 1];
  int r = gn__pathf(path, sizeof path, "%s/dashboard.token", data_dir);
  if (r < 0)
    return r;
  bool created = false;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    struct stat st;
    r = fstat(fd, &st) < 0 ? -errno : !S_ISREG(st.st_mode) ? GN_EPROTO : token_read(fd, hex);
    /* A token others can read is no secret: keep it the owner's alone. */
    if (r == 0 && (st.st_mode & 077) && fchmod(fd, 0600) < 0)
      r = -errno;
    close(fd);
  } else if (errno == ENOENT) {
    r = token_write(data_dir, path, hex);
    created = true;
  } else {
    r = -errno;
  }
  if (r == 0) {
    memcpy(ret_hex, hex, sizeof hex);
    *ret_created = created;
  }
  sodium_memzero(hex, sizeof hex);
  return r;
}

/* --- routes ------------------------------------------------------------------*/

static void dash_index(gn_ctl_req *req, void *ud) {
  (void)ud;
  gn_ctl_reply_text(req, 200, "text/html; charset=utf-8", (const char *)gn_dash_index_html);
}

static void dash_app_js(gn_ctl_req *req, void *ud) {
  (void)ud;
  gn_ctl_reply_text(req, 200, "text/javascript; charset=utf-8", (const char *)gn_dash_app_js);
}

static void dash_style_css(gn_ctl_req *req, void *ud) {
  (void)ud;
  gn_ctl_reply_text(req, 200, "text/css; charset=utf-8", (const char *)gn_dash_style_css);
}

/* The figures of this moment: earnings, and per GPU what NVML reports
 * (nothing for simulated GPUs). util and power hold n->gpus.count values. */
static void sample_now(gn_node *n, uint64_t *earned_micro, int16_t *util_pct, int32_t *power_mw) {
  *earned_micro = gn__api_earned_micro(n);
  for (size_t g = 0; g < n->gpus.count; g++) {
    gn_gpu_stats st;
    util_pct[g] = -1;
    power_mw[g] = -1;
    if (n->gpus.items[g].simulated || gn_gpu_stats_get(&n->gpus.items[g], &st) < 0)
      continue;
    if (st.utilization_pct >= 0 && st.utilization_pct <= 100)
      util_pct[g] = (int16_t)st.utilization_pct;
    if (st.power_mw && st.power_mw <= INT32_MAX)
      power_mw[g] = (int32_t)st.power_mw;
  }
}

static int sample_into_ring(gn_node *n) {
  struct gn__dash *d = n->dash;
  size_t ng = n->gpus.count ? n->gpus.count : 1;
  int16_t *util = calloc(ng, sizeof *util);
  int32_t *power = calloc(ng, sizeof *power);
  uint64_t earned = 0;
  if (!util || !power) {
    free(util);
    free(power);
    return GN_ENOMEM;
  }
  sample_now(n, &earned, util, power);
  gn__dash_ring_push(&d->ring, gn_unix_s(), earned, util, power);
  free(util);
  free(power);
  return 0;
}

static void on_sample(uv_timer_t *t) {
  gn_node *n = t->data;
  if (sample_into_ring(n) < 0)
    gn_log(GN_LOG_WARN, "dashboard: out of memory taking a sample of the history");
}

/* GET /v1/history[?since_s=T]: the ring after T, then the figures of now. */
static void dash_history(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  struct gn__dash *d = n->dash;
  const char *since = gn_ctl_req_query(req, "since_s");
  char *end = NULL;
  long long since_s = since ? strtoll(since, &end, 10) : 0;
  if (since && (end == since || *end))
    return gn_ctl_reply_error(req, 400, "since_s must be a Unix time in seconds");
  json_t *o = gn__dash_ring_json(&d->ring, since_s, GN_DASH_MAX_POINTS_OUT - 1);
  size_t ng = n->gpus.count ? n->gpus.count : 1;
  int16_t *util = calloc(ng, sizeof *util);
  int32_t *power = calloc(ng, sizeof *power);
  json_t *gpus = json_array();
  if (!o || !util || !power || !gpus) {
    free(util);
    free(power);
    json_decref(o);
    json_decref(gpus);
    return gn_ctl_reply_error(req, 500, "out of memory");
  }
  uint64_t earned = 0;
  sample_now(n, &earned, util, power);
  point_append(o, gn_unix_s(), earned, n->gpus.count, util, power);
  free(util);
  free(power);
  for (size_t g = 0; g < n->gpus.count; g++) {
    const gn_gpu *gp = &n->gpus.items[g];
    json_array_append_new(
        gpus, json_pack("{s:i, s:s, s:b}", "index", gp->index, "name", gp->name, "simulated", gp->simulated));
  }
  json_object_set_new(o, "gpu_info", gpus);
  json_object_set_new(o, "interval_s", json_integer(GN_DASH_SAMPLE_MS / 1000));
  json_object_set_new(o, "currency", json_string(n->cfg.currency));
  gn_ctl_reply_json(req, 200, o);
}

/* GET /v1/attestation: the verdict of each local GPU model's self-check. */
static void dash_attestation(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  json_t *arr = json_array();
  for (size_t g = 0; g < n->gpus.count; g++) {
    const gn_gpu *gp = &n->gpus.items[g];
    json_t *row = NULL;
    for (size_t i = 0; i < json_array_size(arr) && !row; i++)
      if (strcmp(json_string_value(json_object_get(json_array_get(arr, i), "model")), gp->name) == 0)
        row = json_array_get(arr, i);
    if (!row) {
      const gn_attest_local *a = gn__attest_local_find(n, gp->name);
      row = json_pack("{s:s, s:[], s:b}", "model", gp->name, "gpus", "simulated", gp->simulated);
      json_object_set_new(row, "verdict", a && a->verdict[0] ? json_string(a->verdict) : json_null());
      json_array_append_new(arr, row);
    }
    json_array_append_new(json_object_get(row, "gpus"), json_integer(gp->index));
  }
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "attestation", arr));
}

/* --- start and stop ------------------------------------------------------------*/

static int dash_routes(gn_node *n, struct gn__dash *d) {
  /* The control API's own answers, read-only ones only. */
  static const char *const reused[] = {"/v1/status", "/v1/gpus", "/v1/leases", "/v1/invoices", "/v1/balance"};
  int r = 0;
  for (size_t i = 0; i < GN_ARRAY_SIZE(reused) && r == 0; i++) {
    gn_ctl_handler fn;
    void *ud;
    r = gn_ctl_route_find(n->ctl, "GET", reused[i], &fn, &ud);
    if (r == 0)
      r = gn_ctl_route(d->ctl, "GET", reused[i], fn, ud);
  }
  static const struct {
    const char *path;
    gn_ctl_handler fn;
  } own[] = {
      {"/", dash_index},
      {"/app.js", dash_app_js},
      {"/style.css", dash_style_css},
      {"/v1/history", dash_history},
      {"/v1/attestation", dash_attestation},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(own) && r == 0; i++)
    r = gn_ctl_route(d->ctl, "GET", own[i].path, own[i].fn, n);
  /* The page runs its own script and style and nothing else, and is not to
   * be framed; no CORS header: other origins may not read the answers. */
  static const char *const headers[][2] = {
      {"Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                  "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"},
      {"Referrer-Policy", "no-referrer"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(headers) && r == 0; i++)
    r = gn_ctl_add_header(d->ctl, headers[i][0], headers[i][1]);
  gn_ctl_set_guard(d->ctl, dash_guard, d);
  return r;
}

int gn__dash_start(gn_node *n, char *err, size_t cap) {
  const char *listen = n->cfg.dashboard_listen;
  char host[64];
  const char *ip;
  int port;
  if (gn__api_listen_split(listen, host, sizeof host, &ip, &port) < 0) {
    gn__strf(err, cap, "dashboard_listen must be PORT or IP:PORT, not '%s'", listen);
    return GN_EINVAL;
  }
  struct gn__dash *d = calloc(1, sizeof *d);
  if (!d) {
    gn__strf(err, cap, "out of memory");
    return GN_ENOMEM;
  }
  n->dash = d;
  bool created = false;
  int r = gn__dash_token_load(n->cfg.data_dir, d->token, &created);
  if (r < 0) {
    gn__strf(err, cap, "cannot %s the dashboard's token %s/dashboard.token: %s%s", r == GN_EPROTO ? "read" : "make",
             n->cfg.data_dir, gn_strerror(r),
             r == GN_EPROTO ? " (it must hold 64 hex digits; delete it to have a new one made)" : "");
    return r;
  }
  if ((r = gn__dash_ring_init(&d->ring, GN_DASH_HISTORY_POINTS, n->gpus.count)) < 0) {
    gn__strf(err, cap, "cannot keep the dashboard's history: %s", gn_strerror(r));
    return r;
  }
  if ((r = gn_ctl_new_tcp(n->loop, ip, port, &d->ctl)) < 0) {
    gn__strf(err, cap, "cannot serve the dashboard on %s: %s%s", listen, gn_strerror(r),
             r == -EADDRINUSE ? " (another program listens on that port: pick another with --dashboard-listen)" : "");
    return r;
  }
  if ((r = dash_routes(n, d)) < 0) {
    gn__strf(err, cap, "cannot set up the dashboard's routes: %s", gn_strerror(r));
    return r;
  }
  d->timer = gn_uv_handle_alloc(sizeof *d->timer);
  if (!d->timer || sample_into_ring(n) < 0) {
    gn_uv_handle_free_unused(d->timer);
    d->timer = NULL;
    gn__strf(err, cap, "out of memory");
    return GN_ENOMEM;
  }
  uv_timer_init(n->loop, d->timer);
  d->timer->data = n;
  uv_timer_start(d->timer, on_sample, GN_DASH_SAMPLE_MS, GN_DASH_SAMPLE_MS);
  gn_log(GN_LOG_INFO, "dashboard on http://%s/#token=%s (token %s %s/dashboard.token)", listen, d->token,
         created ? "new in" : "from", n->cfg.data_dir);
  return 0;
}

void gn__dash_stop(gn_node *n) {
  struct gn__dash *d = n->dash;
  if (!d)
    return;
  gn_ctl_close(d->ctl);
  d->ctl = NULL;
  if (d->timer)
    gn_uv_close_free((uv_handle_t *)d->timer, NULL, NULL);
  d->timer = NULL;
}

void gn__dash_free(gn_node *n) {
  struct gn__dash *d = n->dash;
  if (!d)
    return;
  gn__dash_stop(n);
  gn__dash_ring_done(&d->ring);
  sodium_memzero(d->token, sizeof d->token);
  free(d);
  n->dash = NULL;
}
