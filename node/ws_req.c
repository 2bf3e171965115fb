/* The requester's side of a lease's workspace: the control routes `gpunet
 * cp` calls (one chunk of up to GN_WS_API_CHUNK bytes per call), each
 * split into WS_PUT/WS_GET requests of GN_WS_CHUNK bytes sent at once to
 * the lease's provider, and answered when every reply is in. */
#include "node_internal.h"
#include "ws.h"

#include <limits.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define GN_WS_API_CHUNK (512u * 1024u) /* bytes of one control call: 16 requests in flight */
#define WS_WAITS_PER_LEASE 4           /* control calls waiting on one lease */
#define WS_WAITS_MAX 64                /* ... on all leases */
#define WS_WAIT_MS 60000
/* A plain WS_STAT is what a copy asks first, alone: a provider of a version
 * without workspaces never answers it (and would count a flood of unknown
 * types against the session), so the copy learns that soon. */
#define WS_STAT_WAIT_MS 15000
#define WS_HASH_WAIT_MS 280000 /* a hash of a large file takes a while (the CLI waits 300 s) */
#define WS_CHUNKS (GN_WS_API_CHUNK / GN_WS_CHUNK)

typedef struct ws_wait {
  struct ws_wait *next;
  gn_ctl_req *req;
  gn_node *n;
  uint32_t type; /* the request: WS_PUT, WS_GET or WS_STAT */
  char lease_id[GN_LEASE_ID_STRLEN];
  char path[GN_WS_PATH_MAX];
  uint8_t peer[GN_PK_LEN];
  uint64_t seq0, offset;
  unsigned nchunks, got;
  bool answered[WS_CHUNKS];
  size_t lens[WS_CHUNKS];
  uint8_t *buf; /* WS_GET: the chunks, each at its place */
  uint64_t size;
  bool exists, has_sha256, failed;
  uint8_t sha256[32];
  char reason[GN_WS_REASON_MAX];
  uint64_t deadline_ms;
} ws_wait;

static ws_wait *waits;
static uint64_t next_seq = 1;

static void wait_unlink(ws_wait *w) {
  for (ws_wait **pp = &waits; *pp; pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      return;
    }
}

static void wait_free(ws_wait *w) {
  free(w->buf);
  free(w);
}

/* The lease of a route, held by this node as requester and active; or an
 * answer already given. */
static gn_lease *route_lease(gn_ctl_req *req, gn_node *n) {
  const char *id = gn_ctl_req_param(req, "id");
  gn_lease *l = id ? gn__lease_find(n, id) : NULL;
  if (!l || l->role != GN_ROLE_REQUESTER) {
    gn_ctl_reply_error(req, 404, "no lease %s rented by this node", id ? id : "");
    return NULL;
  }
  if (l->state != GN_LEASE_ACTIVE) {
    gn_ctl_reply_error(req, 409, "lease %s has ended: its workspace is gone", l->id);
    return NULL;
  }
  unsigned on_lease = 0, all = 0;
  for (ws_wait *w = waits; w; w = w->next) {
    all++;
    on_lease += w->n == n && strcmp(w->lease_id, l->id) == 0;
  }
  if (on_lease >= WS_WAITS_PER_LEASE || all >= WS_WAITS_MAX) {
    gn_ctl_reply_error(req, 503, "too many copies into lease %s at once (at most %d); try again", l->id,
                       WS_WAITS_PER_LEASE);
    return NULL;
  }
  return l;
}

static bool path_ok(gn_ctl_req *req, const char *raw, char *out, size_t cap) {
  if (raw && gn__ws_path_norm(raw, out, cap) == 0)
    return true;
  char shown[128];
  gn_printable_copy(raw ? raw : "", shown, sizeof shown);
  gn_ctl_reply_error(req, 400,
                     "'%s' is not a path in the workspace: relative, without '..', at most %d levels and %d bytes",
                     shown, GN_WS_DEPTH_MAX, GN_WS_PATH_MAX - 1);
  return false;
}

static bool number_ok(const char *s, uint64_t max, uint64_t *ret) {
  char *end;
  if (!s || !s[0] || s[0] == '-' || s[0] == '+')
    return false;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || v > max)
    return false;
  *ret = v;
  return true;
}

static ws_wait *wait_new(gn_ctl_req *req, gn_node *n, gn_lease *l, uint32_t type, const char *path, uint64_t offset,
                         unsigned nchunks) {
  ws_wait *w = calloc(1, sizeof *w);
  if (!w || (type == GN_MSG_WS_GET && !(w->buf = malloc((size_t)nchunks * GN_WS_CHUNK)))) {
    free(w);
    gn_ctl_reply_error(req, 500, "out of memory");
    return NULL;
  }
  w->req = req;
  w->n = n;
  w->type = type;
  gn__strf(w->lease_id, sizeof w->lease_id, "%s", l->id);
  gn__strf(w->path, sizeof w->path, "%s", path);
  memcpy(w->peer, l->peer, GN_PK_LEN);
  w->seq0 = next_seq;
  next_seq += nchunks;
  w->offset = offset;
  w->nchunks = nchunks;
  w->deadline_ms = gn_mono_ms() + WS_WAIT_MS;
  return w;
}

/* Sends request i of w (data for WS_PUT); a failure fails the call. */
static int wait_send(gn_node *n, ws_wait *w, unsigned i, const uint8_t *data, size_t len, bool hash) {
  gn_wsmsg m;
  memset(&m, 0, sizeof m);
  gn__strf(m.lease_id, sizeof m.lease_id, "%s", w->lease_id);
  gn__strf(m.path, sizeof m.path, "%s", w->path);
  m.seq = w->seq0 + i;
  m.offset = w->offset + (uint64_t)i * GN_WS_CHUNK;
  m.data = data;
  m.data_len = len;
  m.hash = hash;
  gn_wire_writer wr;
  gn_wire_writer_init(&wr);
  int r = gn__wsmsg_encode(w->type, &m, &wr);
  if (r == 0)
    r = gn__node_send(n, w->peer, w->type, &wr);
  gn_wire_writer_done(&wr);
  return r;
}

/* GET /v1/leases/:id/files/stat?path=P[&hash=1]: {path, exists, size,
 * sha256 (hex, with hash)}. */
static void api_stat(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  char path[GN_WS_PATH_MAX];
  if (!path_ok(req, gn_ctl_req_query(req, "path"), path, sizeof path))
    return;
  const char *h = gn_ctl_req_query(req, "hash");
  if (h && strcmp(h, "0") != 0 && strcmp(h, "1") != 0)
    return gn_ctl_reply_error(req, 400, "hash is 0 or 1");
  gn_lease *l = route_lease(req, n);
  if (!l)
    return;
  ws_wait *w = wait_new(req, n, l, GN_MSG_WS_STAT, path, 0, 1);
  if (!w)
    return;
  bool hash = h && strcmp(h, "1") == 0;
  w->deadline_ms = gn_mono_ms() + (hash ? WS_HASH_WAIT_MS : WS_STAT_WAIT_MS);
  int r = wait_send(n, w, 0, NULL, 0, hash);
  if (r < 0) {
    wait_free(w);
    return gn_ctl_reply_error(req, 502, "cannot reach the provider of lease %s: %s", l->id, gn_strerror(r));
  }
  w->next = waits;
  waits = w;
}

/* GET /v1/leases/:id/files?path=P&offset=N[&length=M]: the bytes from N
 * (application/octet-stream), at most M (and GN_WS_API_CHUNK, M's
 * default); fewer where the file ends. */
static void api_get(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  char path[GN_WS_PATH_MAX];
  uint64_t offset = 0, length = GN_WS_API_CHUNK;
  if (!path_ok(req, gn_ctl_req_query(req, "path"), path, sizeof path))
    return;
  const char *qo = gn_ctl_req_query(req, "offset"), *ql = gn_ctl_req_query(req, "length");
  if ((qo && !number_ok(qo, GN_WS_OFFSET_MAX, &offset)) || (ql && !number_ok(ql, GN_WS_API_CHUNK, &length)) ||
      length == 0)
    return gn_ctl_reply_error(req, 400, "offset is a number of bytes, length 1..%u", GN_WS_API_CHUNK);
  gn_lease *l = route_lease(req, n);
  if (!l)
    return;
  unsigned k = (unsigned)((length + GN_WS_CHUNK - 1) / GN_WS_CHUNK);
  ws_wait *w = wait_new(req, n, l, GN_MSG_WS_GET, path, offset, k);
  if (!w)
    return;
  for (unsigned i = 0; i < k; i++) {
    int r = wait_send(n, w, i, NULL, 0, false);
    if (r < 0) {
      /* replies to what was sent find no wait and are dropped */
      wait_free(w);
      return gn_ctl_reply_error(req, 502, "cannot reach the provider of lease %s: %s", l->id, gn_strerror(r));
    }
  }
  w->next = waits;
  waits = w;
}

/* POST /v1/leases/:id/files?path=P&offset=N with the bytes (at most
 * GN_WS_API_CHUNK) as an application/octet-stream body: written at offset,
 * the file then ends after them; {offset, length, size}. */
static void api_put(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  char path[GN_WS_PATH_MAX];
  uint64_t offset = 0;
  size_t len = 0;
  const uint8_t *data = gn_ctl_req_raw_body(req, &len);
  if (!path_ok(req, gn_ctl_req_query(req, "path"), path, sizeof path))
    return;
  const char *qo = gn_ctl_req_query(req, "offset");
  if (!qo || !number_ok(qo, GN_WS_OFFSET_MAX, &offset))
    return gn_ctl_reply_error(req, 400, "offset is a number of bytes");
  if (len > GN_WS_API_CHUNK)
    return gn_ctl_reply_error(req, 413, "at most %u bytes a call", GN_WS_API_CHUNK);
  gn_lease *l = route_lease(req, n);
  if (!l)
    return;
  /* An empty write (an empty file) is one request too. */
  unsigned k = len ? (unsigned)((len + GN_WS_CHUNK - 1) / GN_WS_CHUNK) : 1;
  ws_wait *w = wait_new(req, n, l, GN_MSG_WS_PUT, path, offset, k);
  if (!w)
    return;
  for (unsigned i = 0; i < k; i++) {
    size_t off = (size_t)i * GN_WS_CHUNK, part = len - off < GN_WS_CHUNK ? len - off : GN_WS_CHUNK;
    w->lens[i] = part;
    int r = wait_send(n, w, i, part ? data + off : NULL, part, false);
    if (r < 0) {
      wait_free(w);
      return gn_ctl_reply_error(req, 502, "cannot reach the provider of lease %s: %s", l->id, gn_strerror(r));
    }
  }
  w->next = waits;
  waits = w;
}

static void wait_answer(ws_wait *w) {
  char shown[GN_WS_REASON_MAX];
  if (w->failed) {
    gn_printable_copy(w->reason, shown, sizeof shown);
    gn_ctl_reply_error(w->req, 409, "the provider refused: %s", shown);
    return;
  }
  if (w->type == GN_MSG_WS_STAT) {
    char hex[65];
    if (w->has_sha256)
      sodium_bin2hex(hex, sizeof hex, w->sha256, sizeof w->sha256);
    json_t *o = json_pack("{s:s, s:b, s:I}", "path", w->path, "exists", w->exists, "size", (json_int_t)w->size);
    if (o)
      json_object_set_new(o, "sha256", w->has_sha256 ? json_string(hex) : json_null());
    gn_ctl_reply_json(w->req, 200, o);
    return;
  }
  if (w->type == GN_MSG_WS_PUT) {
    uint64_t len = 0;
    for (unsigned i = 0; i < w->nchunks; i++)
      len += w->lens[i];
    gn_ctl_reply_json(w->req, 200,
                      json_pack("{s:I, s:I, s:I}", "offset", (json_int_t)w->offset, "length", (json_int_t)len, "size",
                                (json_int_t)w->size));
    return;
  }
  /* WS_GET: the bytes up to the first short chunk */
  size_t len = 0;
  for (unsigned i = 0; i < w->nchunks; i++) {
    len += w->lens[i];
    if (w->lens[i] < GN_WS_CHUNK)
      break;
  }
  gn_ctl_reply_bytes(w->req, 200, w->buf, len);
}

void gn__ws_req_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  uint32_t want = env->type == GN_MSG_WS_PUT_ACK      ? GN_MSG_WS_PUT
                  : env->type == GN_MSG_WS_DATA       ? GN_MSG_WS_GET
                  : env->type == GN_MSG_WS_STAT_REPLY ? GN_MSG_WS_STAT
                                                      : 0;
  gn_wsmsg m;
  if (!want || gn__wsmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  for (ws_wait *w = waits; w; w = w->next) {
    if (w->n != n || w->type != want || memcmp(w->peer, peer, GN_PK_LEN) != 0 || strcmp(w->lease_id, m.lease_id) != 0 ||
        m.seq < w->seq0 || m.seq - w->seq0 >= w->nchunks)
      continue;
    unsigned i = (unsigned)(m.seq - w->seq0);
    if (w->answered[i] || m.offset != w->offset + (uint64_t)i * GN_WS_CHUNK)
      break; /* a second answer, or one about another offset: ignored */
    w->answered[i] = true;
    w->got++;
    if (m.reason[0]) {
      if (!w->failed)
        gn__strf(w->reason, sizeof w->reason, "%s", m.reason);
      w->failed = true;
    } else if (want == GN_MSG_WS_GET) {
      memcpy(w->buf + (size_t)i * GN_WS_CHUNK, m.data, m.data_len);
      w->lens[i] = m.data_len;
      w->size = m.size;
    } else {
      w->size = m.size > w->size ? m.size : w->size;
      w->exists = m.exists;
      w->has_sha256 = m.has_sha256;
      memcpy(w->sha256, m.sha256, sizeof w->sha256);
    }
    if (w->got == w->nchunks) {
      wait_unlink(w);
      wait_answer(w);
      wait_free(w);
    }
    break;
  }
  gn__wsmsg_done(&m);
}

void gn__ws_req_tick(gn_node *n, uint64_t now_ms) {
  for (ws_wait **pp = &waits; *pp;) {
    ws_wait *w = *pp;
    gn_transport_peer_info in;
    bool down = w->n == n && n->tp && gn_transport_get_peer_info(n->tp, w->peer, &in) < 0;
    if (w->n != n || (now_ms < w->deadline_ms && !down)) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    if (down) /* the answers went with the session: run the copy again to resume */
      gn_ctl_reply_error(w->req, 502, "the session to the provider of lease %s went down (%u of %u parts answered)",
                         w->lease_id, w->got, w->nchunks);
    else if (w->type == GN_MSG_WS_STAT)
      gn_ctl_reply_error(w->req, 504,
                         "the provider of lease %s did not answer in time (a provider of a gpunet version without "
                         "workspaces never does)",
                         w->lease_id);
    else
      gn_ctl_reply_error(w->req, 504, "the provider of lease %s did not answer in time (%u of %u parts)", w->lease_id,
                         w->got, w->nchunks);
    wait_free(w);
  }
}

void gn__ws_req_shutdown(gn_node *n) {
  for (ws_wait **pp = &waits; *pp;) {
    ws_wait *w = *pp;
    if (w->n != n) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    gn_ctl_reply_error(w->req, 503, "gpunetd is shutting down");
    wait_free(w);
  }
}

void gn__ws_register(gn_node *n) {
  gn_ctl_route(n->ctl, "GET", "/v1/leases/:id/files/stat", api_stat, n);
  gn_ctl_route(n->ctl, "GET", "/v1/leases/:id/files", api_get, n);
  gn_ctl_route(n->ctl, "POST", "/v1/leases/:id/files", api_put, n);
}
