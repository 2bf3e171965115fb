/* The gpunet command's only way to the daemon: HTTP/JSON over gpunetd's Unix
 * control socket with libcurl. */
#include "cli.h"
#include "progress.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Big enough for an exported invoice of a long lease (one JSON tick per
 * second), small enough that a confused peer cannot exhaust memory. */
#define CLI_MAX_ANSWER (512u * 1024 * 1024)
/* Lease negotiation and attestation may take a while; nothing takes longer. */
#define CLI_TIMEOUT_S 300L

typedef struct answer {
  char *data;
  size_t len, cap;
  bool too_big;
} answer;

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
  answer *a = ud;
  size_t add = size * n;
  if (a->len + add + 1 > CLI_MAX_ANSWER) {
    a->too_big = true;
    return 0; /* makes curl fail the transfer */
  }
  if (a->len + add + 1 > a->cap) {
    size_t cap = a->cap ? a->cap : 4096;
    while (cap < a->len + add + 1)
      cap *= 2;
    char *d = realloc(a->data, cap);
    if (!d)
      return 0;
    a->data = d;
    a->cap = cap;
  }
  memcpy(a->data + a->len, p, add);
  a->len += add;
  a->data[a->len] = '\0';
  return add;
}

char *cli_urlencode(const char *s) {
  CURL *h = curl_easy_init();
  char *e = h ? curl_easy_escape(h, s, 0) : NULL;
  char *copy = e ? strdup(e) : NULL;
  curl_free(e);
  if (h)
    curl_easy_cleanup(h);
  return copy;
}

/* cli_fail unless the caller asked for silence. */
#define fail(c, ...) ((c)->quiet ? CLI_FAIL : cli_fail(__VA_ARGS__))

static int not_running(cli *c) {
  return fail(c, "cannot reach gpunetd at %s: is it running? (start it with: gpunetd --data-dir %s)", c->sock,
              c->data_dir);
}

/* libcurl calls this about once a second, and sooner while bytes move,
 * even while the daemon has not answered yet: the wait's progress. */
static int on_xfer(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  cli_progress_update(ud, 0, 0, NULL);
  return 0;
}

/* Performs the request; on success *ret holds the answer of a 2xx response.
 * p (may be NULL) is updated while it waits. bytes (nbytes of them), when
 * not NULL, are the body instead, sent as application/octet-stream. */
static int call(cli *c, const char *method, const char *path, json_t *body, const void *bytes, size_t nbytes,
                answer *ret, cli_progress *p) {
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
  answer a = {0};
  int rc = CLI_FAIL;
  char url[2048];
  snprintf(url, sizeof(url), "http://gpunetd%s", path);
  CURL *h = curl_easy_init();
  struct curl_slist *hdrs =
      curl_slist_append(NULL, bytes ? "Content-Type: application/octet-stream" : "Content-Type: application/json");
  hdrs = curl_slist_append(hdrs, "Accept: application/json");
  if (!h || !hdrs) {
    rc = fail(c, "out of memory");
    goto out;
  }
  curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, c->sock);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &a);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, CLI_TIMEOUT_S);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "gpunet/" GN_CLI_VERSION);
  if (p) {
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_xfer);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, p);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  }
  if (bytes) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, bytes);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)nbytes);
  } else if (payload) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(payload));
  } else if (strcmp(method, "POST") == 0) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
  }
  CURLcode cr = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (cr == CURLE_COULDNT_CONNECT) {
    rc = not_running(c);
    goto out;
  }
  if (cr != CURLE_OK) {
    if (a.too_big)
      rc = fail(c, "gpunetd's answer to %s %s is over %u MiB", method, path, CLI_MAX_ANSWER >> 20);
    else if (cr == CURLE_GOT_NOTHING)
      rc = fail(c, "gpunetd at %s closed the connection without answering %s %s", c->sock, method, path);
    else if (cr == CURLE_PARTIAL_FILE || cr == CURLE_WEIRD_SERVER_REPLY || cr == CURLE_UNSUPPORTED_PROTOCOL ||
             cr == CURLE_RECV_ERROR || cr == CURLE_BAD_CONTENT_ENCODING)
      rc = fail(c, "malformed HTTP answer to %s %s from %s (%s): is that gpunetd?", method, path, c->sock,
                curl_easy_strerror(cr));
    else
      rc = fail(c, "talking to gpunetd at %s failed: %s", c->sock, curl_easy_strerror(cr));
    goto out;
  }
  if (status < 200 || status > 299) {
    json_t *err = a.data ? json_loadb(a.data, a.len, 0, NULL) : NULL;
    const char *msg = cli_str(err, "error");
    if (msg)
      rc = fail(c, "%s", msg);
    else
      rc = fail(c, "gpunetd answered %s %s with HTTP %ld", method, path, status);
    json_decref(err);
    goto out;
  }
  if (!a.data) {
    a.data = strdup("");
    if (!a.data) {
      rc = fail(c, "out of memory");
      goto out;
    }
  }
  *ret = a;
  a.data = NULL;
  rc = CLI_OK;
out:
  free(a.data);
  curl_slist_free_all(hdrs);
  if (h)
    curl_easy_cleanup(h);
  free(payload);
  return rc;
}

int cli_call_raw(cli *c, const char *method, const char *path, json_t *body, char **ret, size_t *ret_len) {
  answer a;
  int rc = call(c, method, path, body, NULL, 0, &a, NULL);
  if (rc != CLI_OK)
    return rc;
  *ret = a.data;
  *ret_len = a.len;
  return CLI_OK;
}

int cli_call(cli *c, const char *method, const char *path, json_t *body, json_t **ret) {
  return cli_call_waiting(c, method, path, body, ret, NULL);
}

int cli_call_bytes(cli *c, const char *method, const char *path, const void *body, size_t len, char **ret,
                   size_t *ret_len) {
  answer a;
  int rc = call(c, method, path, NULL, body ? body : "", len, &a, NULL);
  if (rc != CLI_OK)
    return rc;
  *ret = a.data;
  *ret_len = a.len;
  return CLI_OK;
}

int cli_call_waiting(cli *c, const char *method, const char *path, json_t *body, json_t **ret, cli_progress *p) {
  answer a;
  int rc = call(c, method, path, body, NULL, 0, &a, p);
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
