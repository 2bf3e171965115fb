/* Image references ("host:port/repo:tag@sha256:…"): strict parsing after the
 * OCI distribution reference grammar, Docker Hub defaults, and formatting. */
#include "sandbox_int.h"

#include <arpa/inet.h>
#include <ctype.h>

#define REF_MAX 1024 /* longer input is refused before any parsing */
#define NAME_MAX_LEN 255

static bool is_lower_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* path-component := [a-z0-9]+ (separator [a-z0-9]+)*,
 * separator := [_.] | "__" | [-]+ */
static bool path_component_valid(const char *s, size_t n) {
  size_t i = 0;
  if (n == 0 || !is_lower_alnum(s[0]) || !is_lower_alnum(s[n - 1]))
    return false;
  while (i < n) {
    if (is_lower_alnum(s[i])) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < n && !is_lower_alnum(s[j]))
      j++;
    size_t len = j - i;
    bool ok = (len == 1 && (s[i] == '_' || s[i] == '.')) || (len == 2 && s[i] == '_' && s[i + 1] == '_');
    if (!ok) {
      ok = true;
      for (size_t k = i; k < j; k++)
        ok = ok && s[k] == '-';
    }
    if (!ok)
      return false;
    i = j;
  }
  return true;
}

/* repository := path-component ("/" path-component)* */
static bool repository_valid(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > NAME_MAX_LEN)
    return false;
  const char *p = s;
  for (;;) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    if (!path_component_valid(p, len))
      return false;
    if (!slash)
      return true;
    p = slash + 1;
  }
}

/* tag := [\w][\w.-]{0,127}; gn_imageref keeps 127 of those 128 characters
 * (its tag field has room for the NUL), so a 128-character tag is refused. */
static bool tag_valid(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 128)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    bool word = isascii(c) && (isalnum(c) || c == '_');
    if (!(word || (i > 0 && (c == '.' || c == '-'))))
      return false;
  }
  return true;
}

/* domain := (host | "[" ipv6 "]") [":" port], host := label ("." label)*,
 * label := [A-Za-z0-9] | [A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]. */
static bool domain_valid(const char *s, char *host, size_t host_cap) {
  const char *port = NULL;
  size_t hlen;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close)
      return false;
    hlen = (size_t)(close - s) + 1;
    if (close[1] == ':')
      port = close + 2;
    else if (close[1] != '\0')
      return false;
    char v6[64];
    size_t inner = hlen - 2;
    if (inner == 0 || inner >= sizeof(v6))
      return false;
    memcpy(v6, s + 1, inner);
    v6[inner] = '\0';
    struct in6_addr a;
    if (inet_pton(AF_INET6, v6, &a) != 1)
      return false;
  } else {
    const char *colon = strchr(s, ':');
    hlen = colon ? (size_t)(colon - s) : strlen(s);
    if (colon)
      port = colon + 1;
    if (hlen == 0)
      return false;
    size_t label = 0;
    for (size_t i = 0; i < hlen; i++) {
      char c = s[i];
      if (c == '.') {
        if (label == 0 || s[i - 1] == '-')
          return false;
        label = 0;
        continue;
      }
      if (!(isascii((unsigned char)c) && (isalnum((unsigned char)c) || c == '-')))
        return false;
      if (label == 0 && c == '-')
        return false;
      if (++label > 63)
        return false;
    }
    if (label == 0 || s[hlen - 1] == '-')
      return false;
  }
  if (port) {
    size_t plen = strlen(port);
    if (plen == 0 || plen > 5)
      return false;
    unsigned long v = 0;
    for (size_t i = 0; i < plen; i++) {
      if (port[i] < '0' || port[i] > '9')
        return false;
      v = v * 10 + (unsigned long)(port[i] - '0');
    }
    if (v == 0 || v > 65535)
      return false;
  }
  size_t all = strlen(s);
  if (all >= host_cap)
    return false;
  memcpy(host, s, all + 1);
  return true;
}

/* Loopback registries are reached over plain HTTP, as Docker does: there is
 * nothing on the path to protect, and a local test registry has no cert.
 * This is only the hint a renter's own gn_registry_resolve follows; a
 * provider's pull (gn_store_pull_ex) ignores it and decides by its address
 * policy: plain HTTP only for allow-listed registries on non-public
 * addresses, and loopback refused unless allow-listed. */
static bool host_is_loopback(const char *host) {
  if (strcmp(host, "localhost") == 0 || strcmp(host, "[::1]") == 0)
    return true;
  struct in_addr a;
  if (inet_pton(AF_INET, host, &a) == 1)
    return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

int gn_imageref_parse(const char *s, gn_imageref *ret) {
  gn_imageref r;
  char buf[REF_MAX + 1];
  if (!s || !ret)
    return GN_EINVAL;
  size_t n = strnlen(s, REF_MAX + 1);
  if (n == 0 || n > REF_MAX)
    return GN_EINVAL;
  memset(&r, 0, sizeof(r));
  memcpy(buf, s, n + 1);

  /* "@digest" is last and cannot contain '@' or '/'. */
  char *at = strchr(buf, '@');
  if (at) {
    *at = '\0';
    if (!gn__digest_valid(at + 1))
      return GN_EINVAL;
    memcpy(r.digest, at + 1, GN_DIGEST_STRLEN - 1);
    r.digest[GN_DIGEST_STRLEN - 1] = '\0';
  }

  /* The tag follows the last ':' after the last '/', so "host:5000/repo"
   * keeps its port. */
  char *slash = strrchr(buf, '/');
  char *colon = strrchr(slash ? slash : buf, ':');
  if (colon) {
    *colon = '\0';
    size_t tlen = strlen(colon + 1);
    if (!tag_valid(colon + 1) || tlen >= sizeof(r.tag))
      return GN_EINVAL;
    memcpy(r.tag, colon + 1, tlen + 1);
  }

  /* The first component is a registry host when it looks like one. */
  char *name = buf;
  char *first_slash = strchr(buf, '/');
  if (first_slash) {
    size_t flen = (size_t)(first_slash - buf);
    bool domain = memchr(buf, '.', flen) || memchr(buf, ':', flen) || buf[0] == '[' ||
                  (flen == 9 && memcmp(buf, "localhost", 9) == 0);
    if (domain) {
      *first_slash = '\0';
      if (!domain_valid(buf, r.registry, sizeof(r.registry)))
        return GN_EINVAL;
      name = first_slash + 1;
    }
  }
  if (!r.registry[0] || strcmp(r.registry, "docker.io") == 0 || strcmp(r.registry, "index.docker.io") == 0) {
    snprintf(r.registry, sizeof(r.registry), "registry-1.docker.io");
    if (!strchr(name, '/')) {
      size_t nlen = strlen(name);
      if (nlen + 8 >= sizeof(r.repository))
        return GN_EINVAL;
      memcpy(r.repository, "library/", 8);
      memcpy(r.repository + 8, name, nlen + 1);
    }
  }
  if (!r.repository[0]) {
    size_t nlen = strlen(name);
    if (nlen >= sizeof(r.repository))
      return GN_EINVAL;
    memcpy(r.repository, name, nlen + 1);
  }
  if (!repository_valid(r.repository))
    return GN_EINVAL;
  if (!r.tag[0] && !r.digest[0])
    snprintf(r.tag, sizeof(r.tag), "latest");
  /* Loopback decides plain HTTP, with or without a port. */
  char host[sizeof(r.registry)];
  memcpy(host, r.registry, sizeof(host));
  char *port = host[0] == '[' ? strstr(host, "]:") : strchr(host, ':');
  if (port)
    port[host[0] == '[' ? 1 : 0] = '\0';
  r.plain_http = host_is_loopback(host);
  *ret = r;
  return 0;
}

int gn_imageref_format(const gn_imageref *r, char *buf, size_t cap) {
  if (!r || !buf || cap == 0)
    return GN_EINVAL;
  int n = snprintf(buf, cap, "%s/%s%s%s%s%s", r->registry, r->repository, r->tag[0] ? ":" : "", r->tag,
                   r->digest[0] ? "@" : "", r->digest);
  if (n < 0 || (size_t)n >= cap)
    return GN_ETOOBIG;
  return 0;
}
