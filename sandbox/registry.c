/* The OCI distribution client on libcurl: manifest and blob GETs with
 * anonymous Bearer token auth, bounded bodies, bounded redirects for blobs,
 * resumable blob downloads hashed while they stream, and
 * gn_registry_resolve. For a provider's pulls it also keeps the renter's
 * registry off the provider's own network: the host is resolved once and
 * pinned, every connection is checked against the address policy, and
 * deadlines and cancellation bound every transfer. */
#include "sandbox_int.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_S 10L
#define LOW_SPEED_BYTES 1024L /* below this many bytes/s ... */
#define LOW_SPEED_TIME_S 30L  /* ... for this long, a transfer is aborted */
#define MANIFEST_TIMEOUT_S 120L
#define ERRBODY_MAX 2048u
#define ERRLOG_EXCERPT_MAX 512u /* bytes of an error body kept for the provider's log */
#define CHALLENGE_MAX 2048u
#define ADDRS_MAX 16u                /* addresses of the registry host kept and pinned */
#define IFADDRS_MAX 64u              /* this host's own addresses checked against */
#define SPACE_CHECK_BYTES (4u << 20) /* statvfs at least this often while streaming */

/* An IPv4 (len 4) or IPv6 (len 16) address; v4-mapped IPv6 is stored as v4. */
typedef struct ipaddr {
  unsigned len;
  uint8_t b[16];
} ipaddr;

struct gn__registry {
  CURL *curl;
  char base[800]; /* "http(s)://host/v2/" */
  char name[256]; /* the registry as the reference names it, for messages */
  char repository[256];
  bool plain_http;
  char *token; /* the Bearer token once fetched; wiped on free */
  /* the address policy (enforce) */
  bool enforce;
  const char *const *allow;
  bool name_allowed; /* the allow list names the host or host:port */
  ipaddr pinned[ADDRS_MAX];
  size_t n_pinned;
  ipaddr own[IFADDRS_MAX];
  size_t n_own;
  char resolve_line[1024]; /* "host:port:addr,addr" for CURLOPT_RESOLVE; "" for IP literals */
  char refused[384];       /* why opensocket_cb refused the last connection */
  const volatile int *cancel;
  uint64_t deadline_ms;
  char *err_log;
  size_t err_log_cap;
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

uint64_t gn__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool ipaddr_from_sockaddr(const struct sockaddr *sa, ipaddr *ret) {
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  memset(ret, 0, sizeof(*ret));
  if (sa->sa_family == AF_INET) {
    ret->len = 4;
    memcpy(ret->b, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    if (memcmp(b, v4mapped, 12) == 0) {
      ret->len = 4;
      memcpy(ret->b, b + 12, 4);
    } else {
      ret->len = 16;
      memcpy(ret->b, b, 16);
    }
    return true;
  }
  return false;
}

static void ipaddr_str(const ipaddr *a, char *buf, size_t cap) {
  if (!inet_ntop(a->len == 4 ? AF_INET : AF_INET6, a->b, buf, (socklen_t)cap))
    snprintf(buf, cap, "?");
}

static const char *class_v4(const uint8_t *b) {
  uint32_t x = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
  if ((x >> 24) == 0)
    return "an unspecified";
  if ((x >> 24) == 127)
    return "a loopback";
  if ((x & 0xffff0000u) == 0xa9fe0000u)
    return "a link-local";
  if ((x >> 24) == 10 || (x & 0xfff00000u) == 0xac100000u || (x & 0xffff0000u) == 0xc0a80000u ||
      (x & 0xffc00000u) == 0x64400000u || (x & 0xfffe0000u) == 0xc6120000u || (x & 0xffffff00u) == 0xc0000000u)
    return "a private";
  if ((x >> 28) == 0xe)
    return "a multicast";
  if ((x >> 28) == 0xf)
    return "a broadcast or reserved";
  return NULL;
}

/* NULL for a public address, else what it is ("a loopback", ...). */
static const char *addr_class(const gn__registry *r, const ipaddr *a) {
  const char *c = NULL;
  if (a->len == 4) {
    c = class_v4(a->b);
  } else {
    static const uint8_t zero[16] = {0};
    static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t *b = a->b;
    if (memcmp(b, zero, 16) == 0)
      c = "an unspecified";
    else if (memcmp(b, zero, 15) == 0 && b[15] == 1)
      c = "a loopback";
    else if (memcmp(b, zero, 12) == 0)
      c = "a reserved (IPv4-compatible)";
    else if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80)
      c = "a link-local";
    else if ((b[0] & 0xfe) == 0xfc || (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0))
      c = "a private";
    else if (b[0] == 0xff)
      c = "a multicast";
    else if (memcmp(b, nat64, 12) == 0)
      c = class_v4(b + 12); /* NAT64 reaches the IPv4 address inside */
    else if (b[0] == 0x20 && b[1] == 0x02)
      c = class_v4(b + 2); /* 6to4 likewise */
  }
  if (c)
    return c;
  for (size_t i = 0; i < r->n_own; i++)
    if (r->own[i].len == a->len && memcmp(r->own[i].b, a->b, a->len) == 0)
      return "this host's own";
  return NULL;
}

/* An allow-list entry as an address or CIDR ("10.0.0.0/8", "fd00::/8",
 * "[::1]"). false for host names. */
static bool allow_entry_cidr(const char *e, ipaddr *ret, unsigned *ret_prefix) {
  char buf[128];
  size_t n = strlen(e);
  if (n == 0 || n >= sizeof(buf))
    return false;
  memcpy(buf, e, n + 1);
  char *slash = strchr(buf, '/');
  long prefix = -1;
  if (slash) {
    char *end;
    *slash = '\0';
    prefix = strtol(slash + 1, &end, 10);
    if (slash[1] == '\0' || *end != '\0' || prefix < 0)
      return false;
  }
  char *h = buf;
  size_t hl = strlen(h);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h[hl - 1] = '\0';
    h++;
  }
  struct sockaddr_in6 s6 = {.sin6_family = AF_INET6};
  struct sockaddr_in s4 = {.sin_family = AF_INET};
  if (inet_pton(AF_INET, h, &s4.sin_addr) == 1)
    ipaddr_from_sockaddr((struct sockaddr *)&s4, ret);
  else if (inet_pton(AF_INET6, h, &s6.sin6_addr) == 1)
    ipaddr_from_sockaddr((struct sockaddr *)&s6, ret);
  else
    return false;
  unsigned max = ret->len * 8;
  if (prefix > (long)max)
    return false;
  *ret_prefix = prefix < 0 ? max : (unsigned)prefix;
  return true;
}

static bool allow_has_addr(const char *const *allow, const ipaddr *a) {
  for (size_t i = 0; allow && allow[i]; i++) {
    ipaddr net;
    unsigned prefix;
    if (!allow_entry_cidr(allow[i], &net, &prefix) || net.len != a->len)
      continue;
    unsigned full = prefix / 8, rest = prefix % 8;
    if (memcmp(net.b, a->b, full) != 0)
      continue;
    if (rest && ((net.b[full] ^ a->b[full]) & (uint8_t)(0xff << (8 - rest))) != 0)
      continue;
    return true;
  }
  return false;
}

static bool allow_has_name(const char *const *allow, const char *registry, const char *host) {
  for (size_t i = 0; allow && allow[i]; i++)
    if (strcasecmp(allow[i], registry) == 0 || strcasecmp(allow[i], host) == 0)
      return true;
  return false;
}

/* Whether a connection to a may go ahead: public addresses always, others
 * only when allow-listed by CIDR or as the pinned addresses of a registry
 * the allow list names. */
static const char *addr_refused(const gn__registry *r, const ipaddr *a) {
  const char *c = addr_class(r, a);
  if (!c || allow_has_addr(r->allow, a))
    return NULL;
  if (r->name_allowed)
    for (size_t i = 0; i < r->n_pinned; i++)
      if (r->pinned[i].len == a->len && memcmp(r->pinned[i].b, a->b, a->len) == 0)
        return NULL;
  return c;
}

static void own_addresses(gn__registry *r) {
  struct ifaddrs *ifa = NULL;
  if (getifaddrs(&ifa) < 0)
    return;
  for (struct ifaddrs *i = ifa; i && r->n_own < IFADDRS_MAX; i = i->ifa_next)
    if (i->ifa_addr && ipaddr_from_sockaddr(i->ifa_addr, &r->own[r->n_own]))
      r->n_own++;
  freeifaddrs(ifa);
}

static int refuse(const gn__registry *r, const char *what_addr, const char *cls, char *err, size_t err_cap) {
  return gn__err(err, err_cap, GN_EPERM,
                 "registry %s: %s is %s address; this provider does not pull from its own or private networks "
                 "(a provider that trusts it lists it in registry_allow in its config: host, host:port or CIDR)",
                 r->name, what_addr, cls);
}

/* Resolves the registry's host once, refuses it by the policy, and keeps
 * the addresses curl will be pinned to. */
static int resolve_and_check(gn__registry *r, const gn_imageref *ref, char *err, size_t err_cap) {
  char host[256], port[8] = "";
  const char *reg = ref->registry;
  if (reg[0] == '[') {
    const char *close = strchr(reg, ']');
    if (!close || (size_t)(close - reg - 1) >= sizeof(host))
      return GN_EINVAL;
    memcpy(host, reg + 1, (size_t)(close - reg - 1));
    host[close - reg - 1] = '\0';
    if (close[1] == ':')
      snprintf(port, sizeof(port), "%.5s", close + 2);
  } else {
    const char *colon = strchr(reg, ':');
    size_t hl = colon ? (size_t)(colon - reg) : strlen(reg);
    if (hl == 0 || hl >= sizeof(host))
      return GN_EINVAL;
    memcpy(host, reg, hl);
    host[hl] = '\0';
    if (colon)
      snprintf(port, sizeof(port), "%.5s", colon + 1);
  }
  own_addresses(r);
  r->name_allowed = allow_has_name(r->allow, reg, host);

  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int g = getaddrinfo(host, NULL, &hints, &res);
  if (g != 0)
    return gn__err(err, err_cap, GN_ENOTFOUND, "registry %s: cannot resolve %s: %s", r->name, host, gai_strerror(g));
  size_t nonpublic = 0;
  int ret = 0;
  for (struct addrinfo *ai = res; ai && r->n_pinned < ADDRS_MAX; ai = ai->ai_next) {
    ipaddr a;
    if (!ipaddr_from_sockaddr(ai->ai_addr, &a))
      continue;
    bool dup = false;
    for (size_t i = 0; i < r->n_pinned && !dup; i++)
      dup = r->pinned[i].len == a.len && memcmp(r->pinned[i].b, a.b, a.len) == 0;
    if (dup)
      continue;
    const char *cls = addr_class(r, &a);
    char as[INET6_ADDRSTRLEN + 16], what[INET6_ADDRSTRLEN + 300];
    ipaddr_str(&a, as, sizeof(as));
    if (cls && !r->name_allowed && !allow_has_addr(r->allow, &a)) {
      if (strcmp(as, host) == 0)
        snprintf(what, sizeof(what), "%s", as);
      else
        snprintf(what, sizeof(what), "%s (%s resolves to it)", as, host);
      ret = refuse(r, what, cls, err, err_cap);
      goto out;
    }
    if (cls)
      nonpublic++;
    r->pinned[r->n_pinned++] = a;
  }
  if (r->n_pinned == 0) {
    ret = gn__err(err, err_cap, GN_ENOTFOUND, "registry %s: %s has no IPv4 or IPv6 address", r->name, host);
    goto out;
  }
  /* Plain HTTP only for allow-listed registries on the provider's own
   * networks (as Docker's insecure registries); the public internet gets
   * TLS. */
  r->plain_http = nonpublic == r->n_pinned;
  struct in6_addr tmp;
  if (inet_pton(AF_INET, host, &tmp) != 1 && inet_pton(AF_INET6, host, &tmp) != 1) {
    /* Pin the name to what was checked, so a second lookup (DNS
     * rebinding) cannot hand curl another address. */
    size_t off = (size_t)snprintf(r->resolve_line, sizeof(r->resolve_line), "%s:%s:", host,
                                  port[0] ? port : (r->plain_http ? "80" : "443"));
    for (size_t i = 0; i < r->n_pinned && off < sizeof(r->resolve_line); i++) {
      char as[INET6_ADDRSTRLEN];
      ipaddr_str(&r->pinned[i], as, sizeof(as));
      off += (size_t)snprintf(r->resolve_line + off, sizeof(r->resolve_line) - off,
                              r->pinned[i].len == 16 ? "%s[%s]" : "%s%s", i ? "," : "", as);
    }
    if (off >= sizeof(r->resolve_line)) {
      ret = gn__err(err, err_cap, GN_ETOOBIG, "registry %s: too many addresses", r->name);
      goto out;
    }
  }
out:
  freeaddrinfo(res);
  return ret;
}

int gn__registry_open(const gn_imageref *ref, const gn__registry_opts *o, gn__registry **ret, char *err,
                      size_t err_cap) {
  pthread_once(&curl_once, curl_init_once);
  if (curl_init_result < 0)
    return curl_init_result;
  if (!ref || !ref->registry[0] || !ref->repository[0] || !ret)
    return GN_EINVAL;
  gn__registry *r = calloc(1, sizeof(*r));
  if (!r)
    return GN_ENOMEM;
  r->curl = curl_easy_init();
  if (!r->curl) {
    free(r);
    return GN_ENOMEM;
  }
  snprintf(r->name, sizeof(r->name), "%s", ref->registry);
  snprintf(r->repository, sizeof(r->repository), "%s", ref->repository);
  r->plain_http = ref->plain_http;
  if (o) {
    r->cancel = o->cancel;
    r->deadline_ms = o->deadline_ms;
    r->err_log = o->err_log;
    r->err_log_cap = o->err_log_cap;
    if (o->enforce) {
      r->enforce = true;
      r->allow = o->allow;
      int rc = resolve_and_check(r, ref, err, err_cap);
      if (rc < 0) {
        gn__registry_free(r);
        return rc;
      }
    }
  }
  snprintf(r->base, sizeof(r->base), "%s://%s/v2/", r->plain_http ? "http" : "https", ref->registry);
  *ret = r;
  return 0;
}

int gn__registry_new(const gn_imageref *ref, gn__registry **ret) {
  return gn__registry_open(ref, NULL, ret, NULL, 0);
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
  if (s->space_path && (s->since_space_check += n) >= SPACE_CHECK_BYTES) {
    /* Other writers (jobs' outputs, the ledger) share the filesystem:
     * look again while streaming, not only before. */
    struct statvfs sv;
    s->since_space_check = 0;
    if (statvfs(s->space_path, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < s->reserve_bytes) {
      x->write_error = GN_ENOSPACE;
      return 0;
    }
  }
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

/* Checks every connection curl opens (the registry, its redirects, token
 * realms) against the address policy: curl has resolved the name by now,
 * so this sees the address it will really connect to. */
static curl_socket_t opensocket_cb(void *ud, curlsocktype purpose, struct curl_sockaddr *a) {
  gn__registry *r = ud;
  ipaddr ip;
  (void)purpose;
  if (!ipaddr_from_sockaddr(&a->addr, &ip)) {
    snprintf(r->refused, sizeof(r->refused), "registry %s: a connection of address family %d refused", r->name,
             a->family);
    return CURL_SOCKET_BAD;
  }
  const char *cls = addr_refused(r, &ip);
  if (cls) {
    char as[INET6_ADDRSTRLEN];
    ipaddr_str(&ip, as, sizeof(as));
    refuse(r, as, cls, r->refused, sizeof(r->refused));
    return CURL_SOCKET_BAD;
  }
  return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* curl calls this about once a second even when no byte moves, so a cancel
 * is seen within a second of being asked for. */
static int xferinfo_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
  const gn__registry *r = ud;
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  return r->cancel && *r->cancel ? 1 : 0;
}

/* Performs one GET. follow: whether to follow redirects (bounded). Returns
 * 0 with x->status set, or a negative code for transport failures. */
static int perform(gn__registry *r, const char *url, const char *what, const char *accept, const char *range,
                   bool follow, bool auth, long timeout_s, exchange *x, char *err, size_t err_cap) {
  CURL *c = r->curl;
  struct curl_slist *h = NULL;
  struct curl_slist *resolve = NULL;
  char *authz = NULL;
  int ret = 0;
  char curl_err[CURL_ERROR_SIZE] = "";
  hdr_ctx hc = {x, c};

  curl_easy_reset(c);
  x->status = 0;
  r->refused[0] = '\0';
  if (r->cancel && *r->cancel)
    return gn__err(err, err_cap, GN_ECANCELED, "registry %s: pull canceled", r->name);
  /* The tightest of the request's own timeout, the blob's deadline and the
   * pull's deadline. */
  uint64_t now = gn__now_ms(), timeout_ms = timeout_s > 0 ? (uint64_t)timeout_s * 1000u : 0;
  uint64_t deadlines[2] = {r->deadline_ms, x->sink ? x->sink->deadline_ms : 0};
  for (size_t i = 0; i < 2; i++) {
    if (!deadlines[i])
      continue;
    if (deadlines[i] <= now)
      return gn__err(err, err_cap, GN_ETIMEDOUT, "registry %s: past the %s deadline", r->name,
                     i == 0 ? "pull's" : "blob's");
    if (!timeout_ms || deadlines[i] - now < timeout_ms)
      timeout_ms = deadlines[i] - now;
  }
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
  if (timeout_ms)
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  if (r->enforce) {
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, opensocket_cb);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, r);
    /* A proxy would resolve and connect for us, past the checks. */
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    if (r->resolve_line[0]) {
      if (!(resolve = curl_slist_append(NULL, r->resolve_line))) {
        ret = GN_ENOMEM;
        goto out;
      }
      curl_easy_setopt(c, CURLOPT_RESOLVE, resolve);
    }
  }
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, xferinfo_cb);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, r);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  /* Plain HTTP only ever for loopback (or allow-listed) registries; blob
   * storage they redirect to may be anywhere, so redirects from a TLS
   * registry stay TLS. */
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
  if (x->sink) /* big reads: fewer callbacks and writes per blob */
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024L);
  CURLcode cc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  x->status = code;
  if (cc != CURLE_OK) {
    if (x->write_error) {
      ret = x->write_error;
      if (ret == GN_ETOOBIG)
        gn__err(err, err_cap, ret, "registry %s: %s: more bytes than allowed", r->name, what);
      else if (ret == GN_ENOSPACE)
        gn__err(err, err_cap, ret, "registry %s: %s: the image store's filesystem is down to its free-space reserve",
                r->name, what);
      else if (ret != GN_ESTATE)
        gn__err(err, err_cap, ret, "registry %s: %s: cannot store it: %s", r->name, what, gn_strerror(ret));
    } else if (r->refused[0]) {
      ret = gn__err(err, err_cap, GN_EPERM, "%s", r->refused);
    } else if (cc == CURLE_ABORTED_BY_CALLBACK) {
      ret = gn__err(err, err_cap, GN_ECANCELED, "registry %s: pull canceled", r->name);
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
      ret = gn__err(err, err_cap, GN_ETIMEDOUT, "registry %s: %s: timed out: %s", r->name, what, curl_err);
    } else if (cc == CURLE_TOO_MANY_REDIRECTS) {
      ret = gn__err(err, err_cap, GN_EPROTO, "registry %s: %s: more than %ld redirects", r->name, what,
                    GN__REDIRECTS_MAX);
    } else {
      ret = gn__err(err, err_cap, GN_EIO, "registry %s: %s: %s", r->name, what,
                    curl_err[0] ? curl_err : curl_easy_strerror(cc));
    }
  }
out:
  curl_slist_free_all(h);
  curl_slist_free_all(resolve);
  if (authz) {
    sodium_memzero(authz, strlen(authz));
    free(authz);
  }
  return ret;
}

/* Copies registry-sent text (a challenge, a realm) into err_log, printable
 * ASCII only. */
static void log_remote(gn__registry *r, const char *prefix, const char *text) {
  if (!r->err_log || !r->err_log_cap)
    return;
  char clean[ERRLOG_EXCERPT_MAX + 1];
  size_t n = 0;
  for (; text[n] && n < ERRLOG_EXCERPT_MAX; n++)
    clean[n] = ((unsigned char)text[n] >= 0x20 && (unsigned char)text[n] < 0x7f) ? text[n] : ' ';
  clean[n] = '\0';
  snprintf(r->err_log, r->err_log_cap, "registry %s: %s: %s", r->name, prefix, clean);
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
  if (strncasecmp(challenge, "Bearer ", 7) != 0) {
    log_remote(r, "challenge", challenge);
    return gn__err(err, err_cap, GN_EPERM, "registry %s asks for credentials; only public images can be pulled",
                   r->name);
  }
  const char *params = challenge + 7;
  if (!challenge_param(params, "realm", realm, sizeof(realm)))
    return gn__err(err, err_cap, GN_EPROTO, "registry %s: Bearer challenge without a realm", r->name);
  challenge_param(params, "service", service, sizeof(service));
  if (!challenge_param(params, "scope", scope, sizeof(scope)))
    snprintf(scope, sizeof(scope), "repository:%s:pull", r->repository);
  bool https = strncmp(realm, "https://", 8) == 0;
  if (!https && !(r->plain_http && strncmp(realm, "http://", 7) == 0)) {
    log_remote(r, "token realm", realm);
    return gn__err(err, err_cap, GN_EPROTO, "registry %s: its token realm is not https", r->name);
  }

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
  if ((ret = perform(r, url, "token request", "application/json", NULL, true, false, MANIFEST_TIMEOUT_S, &x, err,
                     err_cap)) < 0) {
    gn_buf_done(&x.errbody);
    goto out;
  }
  gn_buf_done(&x.errbody);
  if (x.status != 200) {
    log_remote(r, "token realm", realm);
    ret = gn__err(err, err_cap, GN_EPERM, "registry %s: its token server refused a pull token for %s (HTTP %ld)",
                  r->name, r->repository, x.status);
    goto out;
  }
  json_error_t je;
  j = json_loadb((const char *)body.data, body.len, 0, &je);
  json_t *t = j ? json_object_get(j, "token") : NULL;
  if (!json_is_string(t) || json_string_length(t) == 0)
    t = j ? json_object_get(j, "access_token") : NULL;
  if (!json_is_string(t) || json_string_length(t) == 0) {
    ret = gn__err(err, err_cap, GN_EPROTO, "registry %s: its token server sent no token", r->name);
    goto out;
  }
  const char *tok = json_string_value(t);
  /* The token goes into a header line: refuse anything that could end it. */
  for (const char *q = tok; *q; q++) {
    if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7e) {
      ret = gn__err(err, err_cap, GN_EPROTO, "registry %s: its token server sent a malformed token", r->name);
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
static int get_with_auth(gn__registry *r, const char *url, const char *what, const char *accept, const char *range,
                         bool follow, long timeout_s, exchange *x, char *err, size_t err_cap) {
  int ret = perform(r, url, what, accept, range, follow, true, timeout_s, x, err, err_cap);
  if (ret < 0 || x->status != 401)
    return ret;
  char challenge[CHALLENGE_MAX];
  snprintf(challenge, sizeof(challenge), "%s", x->challenge);
  if (!challenge[0])
    return gn__err(err, err_cap, GN_EPERM, "registry %s: %s: HTTP 401 without a challenge", r->name, what);
  if ((ret = fetch_token(r, challenge, err, err_cap)) < 0)
    return ret;
  gn_buf_done(&x->errbody);
  if (x->buf)
    x->buf->len = 0;
  return perform(r, url, what, accept, range, follow, true, timeout_s, x, err, err_cap);
}

/* A non-2xx answer. err (which the renter may see) says only who answered
 * what to which request; the body the registry sent goes to err_log, the
 * provider's log, as printable ASCII and bounded. */
static int status_error(gn__registry *r, const char *what, const exchange *x, char *err, size_t err_cap) {
  int code = x->status == 404 ? GN_ENOTFOUND : (x->status == 401 || x->status == 403) ? GN_EPERM : GN_EREMOTE;
  if (r->err_log && r->err_log_cap) {
    char snippet[ERRLOG_EXCERPT_MAX + 1];
    size_t n = x->errbody.len < ERRLOG_EXCERPT_MAX ? x->errbody.len : ERRLOG_EXCERPT_MAX;
    for (size_t i = 0; i < n; i++) {
      unsigned char ch = x->errbody.data[i];
      snippet[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : ' ';
    }
    snippet[n] = '\0';
    gn__err(r->err_log, r->err_log_cap, code, "registry %s answered HTTP %ld for %s %s: %s", r->name, x->status,
            r->repository, what, snippet);
  }
  return gn__err(err, err_cap, code, "registry %s answered HTTP %ld for %s", r->name, x->status, what);
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
  char what[200], sd[32];
  snprintf(what, sizeof(what), "manifest %s",
           gn__digest_valid(reference) ? gn__digest_short(reference, sd) : reference);
  x.buf = &tmp;
  x.buf_max = GN__MANIFEST_MAX;
  /* Manifests may be redirected too (some mirrors do); bounded like blobs. */
  if ((ret = get_with_auth(r, url, what, accept, NULL, true, MANIFEST_TIMEOUT_S, &x, err, err_cap)) < 0)
    goto out;
  if (x.status != 200) {
    ret = status_error(r, what, &x, err, err_cap);
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
  char what[64], sd[32];
  snprintf(what, sizeof(what), "blob %s", gn__digest_short(digest, sd));
  ret = get_with_auth(r, url, what, NULL, sink->offset > 0 ? range : NULL, true, 0, &x, err, err_cap);
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
    ret = status_error(r, what, &x, err, err_cap);
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
