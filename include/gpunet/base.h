/* Shared basics for every module: error codes, clocks and a growable byte
 * buffer. Header-only because the sandbox module depends on no other module,
 * yet every module needs these. */
#ifndef GPUNET_BASE_H
#define GPUNET_BASE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Functions that can fail return 0 or a negative code: one of these, or
 * -errno from the system. */
enum {
  GN_OK = 0,
  GN_EINVAL = -10000, /* bad argument or malformed input */
  GN_EPROTO,          /* protocol violation by a peer */
  GN_ESIG,            /* signature does not verify */
  GN_ENOMEM,
  GN_ETOOBIG,      /* over a size, length or count limit */
  GN_EVERSION,     /* protocol version we do not speak */
  GN_EEXPIRED,     /* past its expiry */
  GN_EREPLAY,      /* nonce already seen */
  GN_ENOTFOUND,    /* no such object */
  GN_EEXIST,       /* already exists */
  GN_EPERM,        /* not allowed (wrong signer, unsafe file mode...) */
  GN_EDIGEST,      /* content does not match its digest */
  GN_ESTATE,       /* not valid in the object's current state */
  GN_EBUSY,        /* resource in use (a GPU already leased...) */
  GN_EIO,          /* I/O error not described by errno */
  GN_EDB,          /* SQLite error */
  GN_ETIMEDOUT,    /* a peer or a server did not answer in time */
  GN_ECLOSED,      /* the session or handle is closed */
  GN_EUNSUPPORTED, /* not supported here (no runtime, no GPU...) */
  GN_EAUDIT,       /* an invoice or ledger check failed */
  GN_EREMOTE,      /* a remote server (registry, peer) reported an error */
  GN_ECANCELED,    /* stopped because the caller asked (gpunet stop, lease end, shutdown) */
  GN_ENOSPACE,     /* over a disk budget or into the free-space reserve */
  GN_ELAST
};

static inline const char *gn_strerror(int code) {
  switch (code) {
  case GN_OK:
    return "success";
  case GN_EINVAL:
    return "invalid argument or malformed input";
  case GN_EPROTO:
    return "protocol error";
  case GN_ESIG:
    return "bad signature";
  case GN_ENOMEM:
    return "out of memory";
  case GN_ETOOBIG:
    return "over a size limit";
  case GN_EVERSION:
    return "unsupported protocol version";
  case GN_EEXPIRED:
    return "expired";
  case GN_EREPLAY:
    return "replayed";
  case GN_ENOTFOUND:
    return "not found";
  case GN_EEXIST:
    return "already exists";
  case GN_EPERM:
    return "not permitted";
  case GN_EDIGEST:
    return "digest mismatch";
  case GN_ESTATE:
    return "invalid state";
  case GN_EBUSY:
    return "busy";
  case GN_EIO:
    return "I/O error";
  case GN_EDB:
    return "database error";
  case GN_ETIMEDOUT:
    return "timed out";
  case GN_ECLOSED:
    return "closed";
  case GN_EUNSUPPORTED:
    return "not supported";
  case GN_EAUDIT:
    return "audit failed";
  case GN_EREMOTE:
    return "remote error";
  case GN_ECANCELED:
    return "canceled";
  case GN_ENOSPACE:
    return "over the disk budget";
  default:
    break;
  }
  if (code < 0 && code > -4096)
    return strerror(-code);
  return "unknown error";
}

/* Monotonic milliseconds: for metering and timeouts, never for records. */
static inline uint64_t gn_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Milliseconds from THEN to NOW, 0 when THEN is later: a stamp taken during
 * a tick is later than the tick's own NOW, and unsigned subtraction would
 * make it look ages old. */
static inline uint64_t gn_ms_since(uint64_t now, uint64_t then) {
  return now > then ? now - then : 0;
}

/* UTC Unix seconds: what records carry. */
static inline int64_t gn_unix_s(void) {
  return (int64_t)time(NULL);
}

/* A growable byte buffer. Zero-initialise it; gn_buf_done frees what it holds. */
typedef struct gn_buf {
  uint8_t *data;
  size_t len;
  size_t cap;
} gn_buf;

static inline int gn_buf_reserve(gn_buf *b, size_t extra) {
  if (extra > SIZE_MAX / 2 - b->len)
    return GN_ETOOBIG;
  if (b->len + extra <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra)
    cap *= 2;
  uint8_t *p = realloc(b->data, cap);
  if (!p)
    return GN_ENOMEM;
  b->data = p;
  b->cap = cap;
  return 0;
}

static inline int gn_buf_append(gn_buf *b, const void *p, size_t n) {
  int r = gn_buf_reserve(b, n);
  if (r < 0)
    return r;
  if (n)
    memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

static inline void gn_buf_done(gn_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

#define GN_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* --- identifiers and paths -------------------------------------------------*/

#include <stdbool.h>

/* Names that come from outside (job, lease, offer and invoice ids off the
 * wire or from the control API) pass this grammar before they touch a path,
 * SQL or a command line: 1..GN_ID_MAX bytes, the first a letter or digit,
 * the rest letters, digits, '-' or '_'. So never "", ".", "..", a '/', a
 * leading '-' (an option to a tool) or a control byte. Every id this
 * project generates ("j-", "l-", "o-", "i-" + hex, node ids) passes. */
#define GN_ID_MAX 64

static inline bool gn__id_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static inline bool gn_id_valid(const char *s) {
  if (!s || !gn__id_alnum(s[0]))
    return false;
  for (size_t i = 1; i <= GN_ID_MAX; i++) {
    char c = s[i];
    if (c == 0)
      return true;
    if (i == GN_ID_MAX || !(gn__id_alnum(c) || c == '-' || c == '_'))
      return false;
  }
  return false;
}

/* Copies s (an id or name that failed its grammar) for an error message:
 * bytes outside printable ASCII become '?', and an s longer than cap - 1
 * is cut with "..." (cap >= 1). */
static inline void gn_printable_copy(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (; s[n] && n + 1 < cap; n++)
    out[n] = (unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e ? '?' : s[n];
  out[n] = 0;
  if (s[n] && cap > 4)
    memcpy(out + cap - 4, "...", 4);
}

/* An environment entry "NAME=value" whose NAME is [A-Za-z_][A-Za-z0-9_]*
 * (at most 256 bytes); the value is anything. */
static inline bool gn_env_entry_valid(const char *s) {
  if (!s || !(gn__id_alnum(s[0]) || s[0] == '_') || (s[0] >= '0' && s[0] <= '9'))
    return false;
  for (size_t i = 1; i <= 256; i++) {
    if (s[i] == '=')
      return true;
    if (!(gn__id_alnum(s[i]) || s[i] == '_'))
      return false;
  }
  return false;
}

/* The one way a path is built from an outside name: buf = dir + "/" +
 * prefix + component + suffix, where component must pass gn_id_valid and
 * prefix and suffix (constants of the caller, may be NULL) hold no '/' and
 * no control byte, so the result names exactly one entry directly inside
 * dir. Returns 0, GN_EINVAL (a bad component, prefix, suffix or empty dir:
 * nothing is joined) or GN_ETOOBIG (over cap). On failure buf is set to ""
 * when cap > 0, so a caller that ignores the code holds no path at all. */
static inline int gn_path_join(char *buf, size_t cap, const char *dir, const char *prefix, const char *component,
                               const char *suffix) {
  const char *parts[3] = {prefix ? prefix : "", component, suffix ? suffix : ""};
  size_t lens[3], dlen = dir ? strlen(dir) : 0, total;
  int r = GN_EINVAL;
  if (!buf || !dlen || !gn_id_valid(component))
    goto fail;
  total = dlen + 1;
  for (int i = 0; i < 3; i++) {
    lens[i] = strlen(parts[i]);
    for (size_t k = 0; k < lens[i]; k++)
      if (parts[i][k] == '/' || (unsigned char)parts[i][k] < 0x20 || parts[i][k] == 0x7f)
        goto fail;
    total += lens[i];
  }
  if (total >= cap) {
    r = GN_ETOOBIG;
    goto fail;
  }
  memcpy(buf, dir, dlen);
  buf[dlen] = '/';
  total = dlen + 1;
  for (int i = 0; i < 3; i++) {
    memcpy(buf + total, parts[i], lens[i]);
    total += lens[i];
  }
  buf[total] = 0;
  return 0;
fail:
  if (buf && cap)
    buf[0] = 0;
  return r;
}

#endif
