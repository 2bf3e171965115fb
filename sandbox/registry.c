/* The OCI distribution client on libcurl: manifest and blob GETs with
 * anonymous Bearer token auth, bounded bodies, bounded redirects for blobs,
 * resumable blob downloads hashed while they stream, and
 * gn_registry_resolve. */
#include "sandbox_int.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <sodium.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_S 10L
#define LOW_SPEED_BYTES 1024L /* below this many bytes/s ... */
#define LOW_SPEED_TIME_S 30L  /* ... for this long, a transfer is aborted */
#define MANIFEST_TIMEOUT_S 120L
#define ERRBODY_MAX 2048u
#define CHALLENGE_MAX 2048u

struct gn__registry {
  CURL *curl;
  char base[800]; /* "http(s)://host/v2/" */
  char repository[256];
  bool plain_http;
  char *token; /* the Bearer token once fetched; wiped on free */
};

/* What one HTTP exchange collected. Headers are reset at every status line,
 * so after redirects they describe the final response only. */
typedef struct exchange {
  long status;
  char content_type[128];
  char header_digest[GN_DIGEST_STRLEN];
  char challenge[CHALLENGE_MAX];
  uint64_t content_length;
  bool has_content_length;
  /* the body: into buf (bounded by buf_max), or into a blob sink */
  gn_buf *buf;
  size_t buf_max;
  gn__blob_sink *sink;
  gn_buf errbody;  /* the body of a non-2xx answer, truncated */
  int write_error; /* why the write callback stopped the transfer */
} exchange;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static int curl_init_result;

static void curl_init_once(void) {
  curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : GN_EIO;
  if (sodium_init() < 0)
    curl_init_result = GN_EIO;
}

int gn__registry_new(const gn_imageref *ref, gn__registry **ret) {
  pthread_once(&curl_once, curl_init_once);
  if (curl_init_result < 0)
    return curl_init_result;
  if (!ref || !ref->registry[0] || !ref->repository[0])
    return GN_EINVAL;
  gn__registry *r = calloc(1, sizeof(*r));
  if (!r)
    return GN_ENOMEM;
  r->curl = curl_easy_init();
  if (!r->curl) {
    free(r);
    return GN_ENOMEM;
  }
  r->plain_http = ref->plain_http;
  snprintf(r->base, sizeof(r->base), "%s://%s/v2/", ref->plain_http ? "http" : "https", ref->registry);
  snprintf(r->repository, sizeof(r->repository), "%s", ref->repository);
  *ret = r;
  return 0;
}

gn__registry *gn__registry_free(gn__registry *r) {
  if (!r)
    return NULL;
  if (r->token) {
    sodium_memzero(r->token, strlen(r->token));
    free(r->token);
  }
  curl_easy_cleanup(r->curl);
  free(r);
  return NULL;
}

static size_t header_cb(char *p, size_t size, size_t nmemb, void *ud) {
  exchange *x = ud;
  size_t n = size * nmemb;
  if (n >= 5 && memcmp(p, "HTTP/", 5) == 0) {
    x->content_type[0] = x->header_digest[0] = x->challenge[0] = '\0';
    x->has_content_length = false;
    return n;
  }
  const char *colon = memchr(p, ':', n);
  if (!colon)
    return n;
  size_t klen = (size_t)(colon - p);
  const char *v = colon + 1;
  size_t vlen = n - klen - 1;
  while (vlen && (*v == ' ' || *v == '\t'))
    v++, vlen--;
  while (vlen && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' '))
    vlen--;
  char *dst = NULL;
  size_t cap = 0;
  if (klen == 12 && strncasecmp(p, "Content-Type", 12) == 0) {
    /* "application/json; charset=utf-8": keep only the type */
    const char *semi = memchr(v, ';', vlen);
    if (semi)
      vlen = (size_t)(semi - v);
    while (vlen && v[vlen - 1] == ' ')
      vlen--;
    dst = x->content_type, cap = sizeof(x->content_type);
  } else if (klen == 21 && strncasecmp(p, "Docker-Content-Digest", 21) == 0) {
    dst = x->header_digest, cap = sizeof(x->header_digest);
  } else if (klen == 16 && strncasecmp(p, "WWW-Authenticate", 16) == 0) {
    dst = x->challenge, cap = sizeof(x->challenge);
  } else if (klen == 14 && strncasecmp(p, "Content-Length", 14) == 0) {
    char tmp[32];
    if (vlen && vlen < sizeof(tmp)) {
      memcpy(tmp, v, vlen);
      tmp[vlen] = '\0';
      char *end;
      unsigned long long cl = strtoull(tmp, &end, 10);
      if (*end == '\0') {
        x->content_length = cl;
        x->has_content_length = true;
      }
    }
    return n;
  }
  if (dst) {
    if (vlen >= cap)
      vlen = cap - 1; /* an over-long value stays invalid after truncation */
    memcpy(dst, v, vlen);
    dst[vlen] = '\0';
  }
  return n;
}

static size_t write_cb(char *p, size_t size, size_t nmemb, void *ud) {
  exchange *x = ud;
  size_t n = size * nmemb;
  long status = x->status; /* kept current by header_status_cb */
  if (status < 200 || status >= 300) {
    size_t room = ERRBODY_MAX - x->errbody.len;
    if (room)
      gn_buf_append(&x->errbody, p, n < room ? n : room);
    return n;
  }
  if (x->buf) {
    if (n > x->buf_max - x->buf->len) {
      x->write_error = GN_ETOOBIG;
      return 0;
    }
    if (gn_buf_append(x->buf, p, n) < 0) {
      x->write_error = GN_ENOMEM;
      return 0;
    }
    return n;
  }
  gn__blob_sink *s = x->sink;
  if (!s)
    return n;
  if (status == 200 && s->offset > 0) {
    /* We asked for a range and got the whole blob: start over. */
    s->restarted = true;
    x->write_error = GN_ESTATE;
    return 0;
  }
  if (s->offset + s->fetched > s->expected_size || n > s->expected_size - s->offset - s->fetched) {
    x->write_error = GN_ETOOBIG;
    return 0;
  }
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(s->fd, p + off, n - off);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      x->write_error = -errno;
      return 0;
    }
    off += (size_t)w;
  }
  gn__sha256_update(s->hash_state, p, n);
  s->fetched += n;
  if (s->progress)
    s->progress(s->progress_ud, s->what, s->offset + s->fetched, s->expected_size);
  return n;
}

/* curl tells the final status only after the headers; this callback runs
 * once the header block of each response is complete, keeping x->status in
 * step for write_cb. */
static size_t header_status_cb(char *p, size_t size, size_t nmemb, void *ud);

typedef struct hdr_ctx {
  exchange *x;
  CURL *curl;
} hdr_ctx;

static size_t header_status_cb(char *p, size_t size, size_t nmemb, void *ud) {
  hdr_ctx *h = ud;
  size_t n = size * nmemb;
  if (n <= 2 && (p[0] == '\r' || p[0] == '\n')) {
    long code = 0;
    curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &code);
    h->x->status = code;
  }
  return header_cb(p, size, nmemb, h->x);
}

/* Performs one GET. follow: whether to follow redirects (bounded). Returns
 * 0 with x->status set, or a negative code for transport failures. */
static int perform(gn__registry *r, const char *url, const char *accept, const char *range, bool follow, bool auth,
                   long timeout_s, exchange *x, char *err, size_t err_cap) {
  CURL *c = r->curl;
  struct curl_slist *h = NULL;
  char *authz = NULL;
  int ret = 0;
  char curl_err[CURL_ERROR_SIZE] = "";
  hdr_ctx hc = {x, c};

  curl_easy_reset(c);
  x->status = 0;
  if (accept) {
    char line[512];
    snprintf(line, sizeof(line), "Accept: %s", accept);
    h = curl_slist_append(h, line);
  }
  if (auth && r->token) {
    size_t len = strlen(r->token) + 32;
    authz = malloc(len);
    if (!authz) {
      ret = GN_ENOMEM;
      goto out;
    }
    snprintf(authz, len, "Authorization: Bearer %s", r->token);
    h = curl_slist_append(h, authz);
  }
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "gpunet/0.1");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, LOW_SPEED_BYTES);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, LOW_SPEED_TIME_S);
  if (timeout_s)
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
  /* Plain HTTP only ever for loopback registries; blob storage they
   * redirect to may be anywhere, so redirects from a TLS registry stay TLS. */
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, r->plain_http ? "http,https" : "https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, GN__REDIRECTS_MAX);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_status_cb);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &hc);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_cb);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
  if (range)
    curl_easy_setopt(c, CURLOPT_RANGE, range);
  CURLcode cc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  x->status = code;
  if (cc != CURLE_OK) {
    if (x->write_error) {
      ret = x->write_error;
      if (ret == GN_ETOOBIG)
        gn__err(err, err_cap, ret, "%s: the registry sent more bytes than allowed", url);
      else if (ret != GN_ESTATE)
        gn__err(err, err_cap, ret, "%s: cannot store the body: %s", url, gn_strerror(ret));
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
      ret = gn__err(err, err_cap, GN_ETIMEDOUT, "%s: timed out: %s", url, curl_err);
    } else if (cc == CURLE_TOO_MANY_REDIRECTS) {
      ret = gn__err(err, err_cap, GN_EPROTO, "%s: more than %ld redirects", url, GN__REDIRECTS_MAX);
    } else {
      ret = gn__err(err, err_cap, GN_EIO, "%s: %s", url, curl_err[0] ? curl_err : curl_easy_strerror(cc));
    }
  }
out:
  curl_slist_free_all(h);
  if (authz) {
    sodium_memzero(authz, strlen(authz));
    free(authz);
  }
  return ret;
}

/* Reads key="value" (or key=value) from a Bearer challenge. */
static bool challenge_param(const char *ch, const char *key, char *out, size_t cap) {
  size_t klen = strlen(key);
  const char *p = ch;
  while ((p = strstr(p, key)) != NULL) {
    bool at_start = p == ch || p[-1] == ' ' || p[-1] == ',';
    if (!at_start || p[klen] != '=') {
      p += klen;
      continue;
    }
    p += klen + 1;
    size_t n = 0;
    if (*p == '"') {
      p++;
      while (*p && *p != '"') {
        if (*p == '\\' && p[1])
          p++;
        if (n + 1 >= cap)
          return false;
        out[n++] = *p++;
      }
      if (*p != '"')
        return false;
    } else {
      while (*p && *p != ',' && *p != ' ') {
        if (n + 1 >= cap)
          return false;
        out[n++] = *p++;
      }
    }
    out[n] = '\0';
    return true;
  }
  return false;
}

/* Answers a 401 Bearer challenge: GET realm?service=…&scope=… and keep the
 * token. Only anonymous pull tokens: gpunet pulls public images. */
static int fetch_token(gn__registry *r, const char *challenge, char *err, size_t err_cap) {
  char realm[1024], service[256] = "", scope[512] = "";
  char *esc_service = NULL, *esc_scope = NULL, *url = NULL;
  gn_buf body = {0};
  json_t *j = NULL;
  int ret;
  if (strncasecmp(challenge, "Bearer ", 7) != 0)
    return gn__err(err, err_cap, GN_EPERM, "registry %s asks for credentials (%.40s); only public images can be pulled",
                   r->base, challenge);
  const char *params = challenge + 7;
  if (!challenge_param(params, "realm", realm, sizeof(realm)))
    return gn__err(err, err_cap, GN_EPROTO, "registry %s: Bearer challenge without a realm", r->base);
  challenge_param(params, "service", service, sizeof(service));
  if (!challenge_param(params, "scope", scope, sizeof(scope)))
    snprintf(scope, sizeof(scope), "repository:%s:pull", r->repository);
  bool https = strncmp(realm, "https://", 8) == 0;
  if (!https && !(r->plain_http && strncmp(realm, "http://", 7) == 0))
    return gn__err(err, err_cap, GN_EPROTO, "registry %s: token realm %s is not https", r->base, realm);

  esc_service = curl_easy_escape(r->curl, service, 0);
  esc_scope = curl_easy_escape(r->curl, scope, 0);
  size_t len = strlen(realm) + strlen(esc_service ? esc_service : "") + strlen(esc_scope ? esc_scope : "") + 32;
  url = malloc(len);
  if (!esc_service || !esc_scope || !url) {
    ret = GN_ENOMEM;
    goto out;
  }
  snprintf(url, len, "%s%cservice=%s&scope=%s", realm, strchr(realm, '?') ? '&' : '?', esc_service, esc_scope);
  exchange x = {0};
  x.buf = &body;
  x.buf_max = GN__TOKEN_MAX;
  if ((ret = perform(r, url, "application/json", NULL, true, false, MANIFEST_TIMEOUT_S, &x, err, err_cap)) < 0) {
    gn_buf_done(&x.errbody);
    goto out;
  }
  gn_buf_done(&x.errbody);
  if (x.status != 200) {
    ret = gn__err(err, err_cap, GN_EPERM, "token server %s refused a pull token for %s (HTTP %ld)", realm, scope,
                  x.status);
    goto out;
  }
  json_error_t je;
  j = json_loadb((const char *)body.data, body.len, 0, &je);
  json_t *t = j ? json_object_get(j, "token") : NULL;
  if (!json_is_string(t) || json_string_length(t) == 0)
    t = j ? json_object_get(j, "access_token") : NULL;
  if (!json_is_string(t) || json_string_length(t) == 0) {
    ret = gn__err(err, err_cap, GN_EPROTO, "token server %s sent no token", realm);
    goto out;
  }
  const char *tok = json_string_value(t);
  /* The token goes into a header line: refuse anything that could end it. */
  for (const char *q = tok; *q; q++) {
    if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7e) {
      ret = gn__err(err, err_cap, GN_EPROTO, "token server %s sent a malformed token", realm);
      goto out;
    }
  }
  char *copy = strdup(tok);
  if (!copy) {
    ret = GN_ENOMEM;
    goto out;
  }
  if (r->token) {
    sodium_memzero(r->token, strlen(r->token));
    free(r->token);
  }
  r->token = copy;
  ret = 0;
out:
  if (j) {
    /* The token string inside the JSON tree cannot be wiped through the
     * const API; wipe the raw body it was parsed from. */
    json_decref(j);
  }
  if (body.data)
    sodium_memzero(body.data, body.len);
  gn_buf_done(&body);
  curl_free(esc_service);
  curl_free(esc_scope);
  free(url);
  return ret;
}

/* GET with one retry after a Bearer challenge. */
static int get_with_auth(gn__registry *r, const char *url, const char *accept, const char *range, bool follow,
                         long timeout_s, exchange *x, char *err, size_t err_cap) {
  int ret = perform(r, url, accept, range, follow, true, timeout_s, x, err, err_cap);
  if (ret < 0 || x->status != 401)
    return ret;
  char challenge[CHALLENGE_MAX];
  snprintf(challenge, sizeof(challenge), "%s", x->challenge);
  if (!challenge[0])
    return gn__err(err, err_cap, GN_EPERM, "%s: HTTP 401 without a challenge", url);
  if ((ret = fetch_token(r, challenge, err, err_cap)) < 0)
    return ret;
  gn_buf_done(&x->errbody);
  if (x->buf)
    x->buf->len = 0;
  return perform(r, url, accept, range, follow, true, timeout_s, x, err, err_cap);
}

static int status_error(const char *url, const exchange *x, char *err, size_t err_cap) {
  char snippet[160] = "";
  if (x->errbody.len) {
    size_t n = x->errbody.len < sizeof(snippet) - 1 ? x->errbody.len : sizeof(snippet) - 1;
    for (size_t i = 0; i < n; i++) {
      unsigned char ch = x->errbody.data[i];
      snippet[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : ' ';
    }
    snippet[n] = '\0';
  }
  int code = x->status == 404 ? GN_ENOTFOUND : (x->status == 401 || x->status == 403) ? GN_EPERM : GN_EREMOTE;
  return gn__err(err, err_cap, code, "%s: HTTP %ld %s", url, x->status, snippet);
}

int gn__registry_get_manifest(gn__registry *r, const char *reference, gn_buf *body, char ret_content_type[128],
                              char ret_header_digest[GN_DIGEST_STRLEN], char *err, size_t err_cap) {
  static const char accept[] =
      GN__MT_OCI_INDEX ", " GN__MT_OCI_MANIFEST ", " GN__MT_DOCKER_LIST ", " GN__MT_DOCKER_MANIFEST;
  char url[1400];
  gn_buf tmp = {0};
  exchange x = {0};
  int ret;
  snprintf(url, sizeof(url), "%s%s/manifests/%s", r->base, r->repository, reference);
  x.buf = &tmp;
  x.buf_max = GN__MANIFEST_MAX;
  /* Manifests may be redirected too (some mirrors do); bounded like blobs. */
  if ((ret = get_with_auth(r, url, accept, NULL, true, MANIFEST_TIMEOUT_S, &x, err, err_cap)) < 0)
    goto out;
  if (x.status != 200) {
    ret = status_error(url, &x, err, err_cap);
    goto out;
  }
  if (x.header_digest[0] && !gn__digest_valid(x.header_digest) && strncmp(x.header_digest, "sha256:", 7) == 0) {
    ret = gn__err(err, err_cap, GN_EPROTO, "%s: malformed Docker-Content-Digest", url);
    goto out;
  }
  if (ret_content_type)
    snprintf(ret_content_type, 128, "%s", x.content_type);
  if (ret_header_digest)
    snprintf(ret_header_digest, GN_DIGEST_STRLEN, "%s", gn__digest_valid(x.header_digest) ? x.header_digest : "");
  gn_buf_done(body);
  *body = tmp;
  tmp = (gn_buf){0};
  ret = 0;
out:
  gn_buf_done(&tmp);
  gn_buf_done(&x.errbody);
  return ret;
}

int gn__registry_get_blob(gn__registry *r, const char *digest, gn__blob_sink *sink, char *err, size_t err_cap) {
  char url[1400], range[64];
  exchange x = {0};
  int ret;
  if (!gn__digest_valid(digest))
    return GN_EINVAL;
  snprintf(url, sizeof(url), "%s%s/blobs/%s", r->base, r->repository, digest);
  if (sink->offset > 0)
    snprintf(range, sizeof(range), "%llu-", (unsigned long long)sink->offset);
  sink->fetched = 0;
  sink->restarted = false;
  x.sink = sink;
  ret = get_with_auth(r, url, NULL, sink->offset > 0 ? range : NULL, true, 0, &x, err, err_cap);
  if (ret == GN_ESTATE && sink->restarted) {
    ret = 0;
    goto out;
  }
  if (ret < 0)
    goto out;
  if (sink->offset > 0 && x.status == 416) {
    /* Our partial file is no prefix the server knows: start over. */
    sink->restarted = true;
    goto out;
  }
  if (x.status == 200 && sink->offset > 0) {
    sink->restarted = true; /* an empty 200 body never reached write_cb */
    goto out;
  }
  if (x.status != 200 && x.status != 206) {
    ret = status_error(url, &x, err, err_cap);
    goto out;
  }
out:
  gn_buf_done(&x.errbody);
  return ret;
}

int gn_registry_resolve(const gn_imageref *ref, char ret_digest[GN_DIGEST_STRLEN], char *err, size_t err_cap) {
  gn__registry *r = NULL;
  gn_buf body = {0};
  char header_digest[GN_DIGEST_STRLEN], digest[GN_DIGEST_STRLEN];
  int ret;
  if (!ref || !ret_digest)
    return GN_EINVAL;
  if ((ret = gn__registry_new(ref, &r)) < 0)
    goto out;
  const char *reference = ref->digest[0] ? ref->digest : ref->tag;
  if ((ret = gn__registry_get_manifest(r, reference, &body, NULL, header_digest, err, err_cap)) < 0)
    goto out;
  gn__digest_of(body.data, body.len, digest);
  if (header_digest[0] && strcmp(header_digest, digest) != 0) {
    char a[32], b[32];
    ret =
        gn__err(err, err_cap, GN_EDIGEST, "%s/%s:%s: the registry says %s but the manifest hashes to %s", ref->registry,
                ref->repository, reference, gn__digest_short(header_digest, a), gn__digest_short(digest, b));
    goto out;
  }
  if (ref->digest[0] && strcmp(ref->digest, digest) != 0) {
    char a[32], b[32];
    ret = gn__err(err, err_cap, GN_EDIGEST, "manifest %s does not match its digest (got %s)",
                  gn__digest_short(ref->digest, a), gn__digest_short(digest, b));
    goto out;
  }
  memcpy(ret_digest, digest, GN_DIGEST_STRLEN);
  ret = 0;
out:
  gn_buf_done(&body);
  gn__registry_free(r);
  return ret;
}
