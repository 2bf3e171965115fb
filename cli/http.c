/* The gpunet command's only way to the daemon: HTTP/1.1 with JSON bodies over
 * gpunetd's Unix control socket. One request per connection ("Connection:
 * close"), written and read here with plain sockets: the command starts once
 * per job, and loading libcurl with its TLS, LDAP and Kerberos libraries cost
 * more than the whole exchange with the daemon. */
#include "cli.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Big enough for an exported invoice of a long lease (one JSON tick per
 * second), small enough that a confused peer cannot exhaust memory. */
#define CLI_MAX_ANSWER (512u * 1024 * 1024)
/* The status line and headers of an answer: gpunetd sends a few hundred bytes. */
#define CLI_MAX_HEAD (64u * 1024)
/* Lease negotiation and attestation may take a while; nothing takes longer. */
#define CLI_TIMEOUT_S 300

typedef struct answer {
  char *data;
  size_t len, cap;
} answer;

/* Appends n bytes (and keeps a NUL after them). False: out of memory. */
static bool answer_add(answer *a, const char *p, size_t n) {
  if (a->len + n + 1 > a->cap) {
    size_t cap = a->cap ? a->cap : 4096;
    while (cap < a->len + n + 1)
      cap *= 2;
    char *d = realloc(a->data, cap);
    if (!d)
      return false;
    a->data = d;
    a->cap = cap;
  }
  memcpy(a->data + a->len, p, n);
  a->len += n;
  a->data[a->len] = '\0';
  return true;
}

char *cli_urlencode(const char *s) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = strlen(s);
  char *e = malloc(3 * n + 1), *o = e;
  if (!e)
    return NULL;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    /* RFC 3986's unreserved characters, in ASCII whatever the locale. */
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' ||
        *p == '_' || *p == '~') {
      *o++ = (char)*p;
    } else {
      *o++ = '%';
      *o++ = hex[*p >> 4];
      *o++ = hex[*p & 15];
    }
  }
  *o = '\0';
  return e;
}

/* cli_fail unless the caller asked for silence. */
#define fail(c, ...) ((c)->quiet ? CLI_FAIL : cli_fail(__VA_ARGS__))

static int not_running(cli *c) {
  return fail(c, "cannot reach gpunetd at %s: is it running? (start it with: gpunetd --data-dir %s)", c->sock,
              c->data_dir);
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for events or the deadline passes. 0, or -1 with
 * errno (ETIMEDOUT at the deadline). */
static int wait_fd(int fd, short events, int64_t deadline_ms) {
  for (;;) {
    int64_t left = deadline_ms - mono_ms();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct pollfd pfd = {.fd = fd, .events = events};
    int r = poll(&pfd, 1, left > INT32_MAX ? INT32_MAX : (int)left);
    if (r > 0)
      return 0;
    if (r < 0 && errno != EINTR)
      return -1;
  }
}

static int send_all(int fd, const char *p, size_t n, int64_t deadline_ms) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_fd(fd, POLLOUT, deadline_ms) < 0)
        return -1;
    } else if (w < 0 && errno != EINTR) {
      return -1;
    }
  }
  return 0;
}

/* The value of header name (NUL-terminated copy into buf) in the head
 * (status line and headers, lines ended by CRLF); false if absent. */
static bool head_value(const char *head, size_t head_len, const char *name, char *buf, size_t cap) {
  size_t k = strlen(name);
  const char *p = memchr(head, '\n', head_len), *end = head + head_len;
  while (p && ++p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol)
      eol = end;
    if ((size_t)(eol - p) > k && strncasecmp(p, name, k) == 0 && p[k] == ':') {
      const char *v = p + k + 1, *ve = eol;
      while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
      snprintf(buf, cap, "%.*s", (int)(ve - v), v);
      return true;
    }
    p = eol;
  }
  return false;
}

/* Decodes a chunked body in place. 1: complete (*len is the body's), 0: more
 * bytes are needed, -1: malformed. */
static int dechunk(char *b, size_t n, size_t *len) {
  size_t in = 0, out = 0;
  for (;;) {
    const char *eol = memchr(b + in, '\n', n - in);
    if (!eol)
      return n - in > 64 ? -1 : 0;
    char *end;
    errno = 0;
    unsigned long long size = strtoull(b + in, &end, 16);
    if (end == b + in || errno || (*end != '\r' && *end != ';' && *end != '\n') || size > CLI_MAX_ANSWER)
      return -1;
    size_t data = (size_t)(eol - b) + 1;
    if (size == 0) {
      /* Trailers (gpunetd sends none) end with an empty line. */
      const char *t = b + data;
      for (;;) {
        const char *te = memchr(t, '\n', (size_t)(b + n - t));
        if (!te)
          return 0;
        if (te == t || (te == t + 1 && *t == '\r'))
          break;
        t = te + 1;
      }
      *len = out;
      return 1;
    }
    if (n - data < size + 2)
      return 0;
    memmove(b + out, b + data, (size_t)size);
    out += (size_t)size;
    in = data + (size_t)size;
    if (b[in] == '\r')
      in++;
    if (b[in] != '\n')
      return -1;
    in++;
  }
}

/* What was read so far, looked at: 1 when the whole answer is there (status,
 * and body moved to the front of a->data, NUL-terminated), 0 when more is
 * needed, -1 when it is not HTTP. eof: the daemon closed the connection. */
static int parse_answer(answer *a, bool eof, long *status) {
  char *sep = a->data ? memmem(a->data, a->len, "\r\n\r\n", 4) : NULL;
  if (!sep)
    return eof || a->len > CLI_MAX_HEAD ? -1 : 0;
  size_t head_len = (size_t)(sep - a->data) + 2, body = head_len + 2;
  int major, minor;
  if (sscanf(a->data, "HTTP/%d.%d %ld", &major, &minor, status) != 3 || *status < 100 || *status > 999)
    return -1;
  char v[64];
  size_t n = a->len - body, len;
  if (head_value(a->data, head_len, "Transfer-Encoding", v, sizeof v) && strcasecmp(v, "chunked") == 0) {
    /* The last chunk ends the answer: decode only when it may be there. */
    if (!eof && (n < 5 || memcmp(a->data + a->len - 5, "0\r\n\r\n", 5) != 0))
      return 0;
    /* Decode a copy: a partial answer stays as it was read. */
    char *copy = malloc(n + 1);
    if (!copy)
      return -1;
    memcpy(copy, a->data + body, n);
    copy[n] = '\0';
    int r = dechunk(copy, n, &len);
    if (r == 1) {
      memcpy(a->data, copy, len);
      a->data[len] = '\0';
      a->len = len;
    }
    free(copy);
    return r == 0 && eof ? -1 : r;
  }
  if (head_value(a->data, head_len, "Content-Length", v, sizeof v)) {
    char *end;
    errno = 0;
    unsigned long long want = strtoull(v, &end, 10);
    if (end == v || *end || errno || want > CLI_MAX_ANSWER)
      return -1;
    if (n < want)
      return eof ? -1 : 0;
    len = (size_t)want;
  } else if (!eof) {
    return 0; /* the body runs to the end of the connection */
  } else {
    len = n;
  }
  memmove(a->data, a->data + body, len);
  a->data[len] = '\0';
  a->len = len;
  return 1;
}

/* Performs the request; on success *ret holds the answer of a 2xx response. */
static int call(cli *c, const char *method, const char *path, json_t *body, answer *ret) {
  char *payload = NULL;
  if (body) {
    payload = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!payload)
      return fail(c, "out of memory");
  }
  struct stat st;
  if (stat(c->sock, &st) < 0) {
    free(payload);
    return errno == EACCES
               ? fail(c, "cannot access %s: permission denied (run gpunet as the user running gpunetd)", c->sock)
               : not_running(c);
  }
  answer a = {0}, req = {0};
  int rc = CLI_FAIL, fd = -1;
  int64_t deadline = mono_ms() + CLI_TIMEOUT_S * 1000;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(c->sock) >= sizeof sa.sun_path) {
    rc = fail(c, "the control socket's path %s is too long for a Unix socket", c->sock);
    goto out;
  }
  memcpy(sa.sun_path, c->sock, strlen(c->sock) + 1);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    rc = fail(c, "cannot open a socket: %s", strerror(errno));
    goto out;
  }
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    rc = errno == EACCES
             ? fail(c, "cannot access %s: permission denied (run gpunet as the user running gpunetd)", c->sock)
             : not_running(c);
    goto out;
  }
  size_t plen = payload ? strlen(payload) : 0;
  char head[2400];
  int hn = snprintf(head, sizeof head,
                    "%s %s HTTP/1.1\r\nHost: gpunetd\r\nUser-Agent: gpunet/" GN_CLI_VERSION
                    "\r\nAccept: application/json\r\nConnection: close\r\n",
                    method, path);
  if (hn < 0 || (size_t)hn >= sizeof head || strpbrk(path, " \r\n")) {
    rc = fail(c, "bad request path %s", path);
    goto out;
  }
  if (!answer_add(&req, head, (size_t)hn)) {
    rc = fail(c, "out of memory");
    goto out;
  }
  if (payload || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
    hn = snprintf(head, sizeof head, "Content-Type: application/json\r\nContent-Length: %zu\r\n", plen);
    if (!answer_add(&req, head, (size_t)hn)) {
      rc = fail(c, "out of memory");
      goto out;
    }
  }
  if (!answer_add(&req, "\r\n", 2) || (plen && !answer_add(&req, payload, plen))) {
    rc = fail(c, "out of memory");
    goto out;
  }
  if (send_all(fd, req.data, req.len, deadline) < 0) {
    rc = errno == ETIMEDOUT
             ? fail(c, "gpunetd at %s did not take %s %s within %d s", c->sock, method, path, CLI_TIMEOUT_S)
             : fail(c, "talking to gpunetd at %s failed: %s", c->sock, strerror(errno));
    goto out;
  }
  long status = 0;
  for (;;) {
    char buf[16384];
    ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_fd(fd, POLLIN, deadline) < 0) {
        rc = errno == ETIMEDOUT ? fail(c, "gpunetd did not answer %s %s within %d s", method, path, CLI_TIMEOUT_S)
                                : fail(c, "talking to gpunetd at %s failed: %s", c->sock, strerror(errno));
        goto out;
      }
      continue;
    }
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      rc = fail(c, "talking to gpunetd at %s failed: %s", c->sock, strerror(errno));
      goto out;
    }
    if (a.len + (size_t)got > CLI_MAX_ANSWER + CLI_MAX_HEAD) {
      rc = fail(c, "gpunetd's answer to %s %s is over %u MiB", method, path, CLI_MAX_ANSWER >> 20);
      goto out;
    }
    if (got && !answer_add(&a, buf, (size_t)got)) {
      rc = fail(c, "out of memory");
      goto out;
    }
    int p = parse_answer(&a, got == 0, &status);
    if (p < 0) {
      rc = a.len ? fail(c, "gpunetd sent a malformed HTTP answer to %s %s", method, path)
                 : fail(c, "gpunetd at %s closed the connection without answering %s %s", c->sock, method, path);
      goto out;
    }
    if (p == 1)
      break;
  }
  if (status < 200 || status > 299) {
    json_t *err = a.len ? json_loadb(a.data, a.len, 0, NULL) : NULL;
    const char *msg = cli_str(err, "error");
    if (msg)
      rc = fail(c, "%s", msg);
    else
      rc = fail(c, "gpunetd answered %s %s with HTTP %ld", method, path, status);
    json_decref(err);
    goto out;
  }
  *ret = a;
  a.data = NULL;
  rc = CLI_OK;
out:
  if (fd >= 0)
    close(fd);
  free(a.data);
  free(req.data);
  free(payload);
  return rc;
}

int cli_call_raw(cli *c, const char *method, const char *path, json_t *body, char **ret, size_t *ret_len) {
  answer a;
  int rc = call(c, method, path, body, &a);
  if (rc != CLI_OK)
    return rc;
  *ret = a.data;
  *ret_len = a.len;
  return CLI_OK;
}

int cli_call(cli *c, const char *method, const char *path, json_t *body, json_t **ret) {
  answer a;
  int rc = call(c, method, path, body, &a);
  if (rc != CLI_OK)
    return rc;
  json_error_t jerr;
  json_t *j = json_loadb(a.data, a.len, 0, &jerr);
  free(a.data);
  if (!j)
    return fail(c, "gpunetd sent an invalid answer to %s %s: %s", method, path, jerr.text);
  *ret = j;
  return CLI_OK;
}
