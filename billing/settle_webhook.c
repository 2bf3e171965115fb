/* The `webhook` settlement driver: POSTs each final settlement to the
 * operator's billing endpoint (settle_url) with libcurl, one blocking request
 * per attempt (the daemon runs it on the thread pool), and says whether a
 * failure is worth another attempt. */
#include "settle_int.h"

#include <curl/curl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define URL_MAX 1023
#define EXCERPT_MAX 160 /* of a refusing server's answer, kept in the reason */
#define CONNECT_TIMEOUT_MS 10000u

typedef struct webhook_driver {
  gn_settle_driver base; /* first: the driver is freed through it */
  char url[URL_MAX + 1];
  uint32_t timeout_ms;
  atomic_int canceled; /* set by webhook_cancel from any thread */
} webhook_driver;

int gn_settle_url_check(const char *url) {
  if (!url)
    return GN_EINVAL;
  size_t len = strlen(url);
  if (len == 0 || len > URL_MAX)
    return GN_EINVAL;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)url[i] <= 0x20 || (unsigned char)url[i] >= 0x7f)
      return GN_EINVAL; /* no whitespace, control or non-ASCII bytes */
  if (strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0)
    return GN_EINVAL;
  /* An authority must follow: libcurl reads "http:///x" as host "x". */
  const char *auth = strstr(url, "://") + 3;
  if (!*auth || *auth == '/' || *auth == '?' || *auth == '#')
    return GN_EINVAL;
  CURLU *h = curl_url();
  if (!h)
    return GN_ENOMEM;
  char *host = NULL, *scheme = NULL;
  int r = GN_EINVAL;
  if (curl_url_set(h, CURLUPART_URL, url, 0) != CURLUE_OK)
    goto out;
  if (curl_url_get(h, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      curl_url_get(h, CURLUPART_HOST, &host, 0) != CURLUE_OK)
    goto out;
  if ((strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0) && host[0])
    r = 0;
out:
  curl_free(host);
  curl_free(scheme);
  curl_url_cleanup(h);
  return r;
}

/* The answer's first bytes, for the reason of a refusal; the rest is read
 * and dropped. */
typedef struct answer {
  char excerpt[EXCERPT_MAX + 1];
  size_t len;
} answer;

static size_t on_data(char *p, size_t size, size_t nmemb, void *ud) {
  answer *a = ud;
  size_t n = size * nmemb;
  size_t take = EXCERPT_MAX - a->len < n ? EXCERPT_MAX - a->len : n;
  memcpy(a->excerpt + a->len, p, take);
  a->len += take;
  a->excerpt[a->len] = '\0';
  return n;
}

/* libcurl calls this at least once a second during a transfer. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal;
  (void)dlnow;
  (void)ultotal;
  (void)ulnow;
  return atomic_load(&((webhook_driver *)ud)->canceled) ? 1 : 0;
}

static void webhook_cancel(gn_settle_driver *d) {
  atomic_store(&((webhook_driver *)d)->canceled, 1);
}

static bool status_retryable(long status) {
  return status >= 500 || status == 408 || status == 429;
}

static int webhook_submit(gn_settle_driver *d, const gn_settle_item *it, gn_settle_outcome *ret) {
  webhook_driver *w = (webhook_driver *)d;
  char key_hdr[sizeof "Idempotency-Key: " + GN_SETTLE_KEY_STRLEN];
  struct curl_slist *hdrs = NULL, *h;
  answer ans = {.len = 0};
  int r = GN_ENOMEM;
  ret->retry = true; /* until the server says otherwise */
  ret->http_status = 0;
  ret->reason[0] = '\0';
  CURL *c = curl_easy_init();
  if (!c)
    goto out;
  snprintf(key_hdr, sizeof key_hdr, "Idempotency-Key: %s", it->key);
  /* "Expect:" off: a large body goes at once instead of after a 1 s wait
   * for "100 Continue" that many servers never send. */
  static const char *const fixed[] = {"Content-Type: application/json", "Expect:"};
  for (size_t i = 0; i < 2; i++) {
    if (!(h = curl_slist_append(hdrs, fixed[i])))
      goto out;
    hdrs = h;
  }
  if (!(h = curl_slist_append(hdrs, key_hdr)))
    goto out;
  hdrs = h;
  curl_easy_setopt(c, CURLOPT_URL, w->url);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)w->timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(w->timeout_ms < CONNECT_TIMEOUT_MS ? w->timeout_ms : CONNECT_TIMEOUT_MS));
  curl_easy_setopt(c, CURLOPT_USERAGENT, "gpunetd-settle/1");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)it->body.data);
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)it->body.len);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &ans);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, w);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  if (atomic_load(&w->canceled)) {
    r = GN_ECANCELED;
    snprintf(ret->reason, sizeof ret->reason, "webhook: canceled (shutting down)");
    goto out;
  }
  CURLcode cr = curl_easy_perform(c);
  if (cr != CURLE_OK) {
    r = cr == CURLE_OPERATION_TIMEDOUT ? GN_ETIMEDOUT : cr == CURLE_ABORTED_BY_CALLBACK ? GN_ECANCELED : GN_EIO;
    /* The URL stays out of reasons: it may hold credentials. */
    snprintf(ret->reason, sizeof ret->reason, "webhook: %s", curl_easy_strerror(cr));
    goto out;
  }
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  ret->http_status = status;
  if (status >= 200 && status < 300) {
    r = 0;
    ret->retry = false;
    goto out;
  }
  r = GN_EREMOTE;
  ret->retry = status_retryable(status);
  char excerpt[EXCERPT_MAX + 1];
  gn__settle_printable(excerpt, sizeof excerpt, ans.excerpt, ans.len);
  snprintf(ret->reason, sizeof ret->reason, "webhook answered %ld%s%s", status, excerpt[0] ? ": " : "", excerpt);
out:
  if (r == GN_ENOMEM)
    snprintf(ret->reason, sizeof ret->reason, "out of memory");
  curl_slist_free_all(hdrs);
  if (c)
    curl_easy_cleanup(c);
  return r;
}

static void webhook_free(gn_settle_driver *d) {
  free(d);
  curl_global_cleanup();
}

int gn_settle_webhook_new(const char *url, uint32_t timeout_ms, gn_settle_driver **ret) {
  if (!ret || gn_settle_url_check(url) < 0)
    return GN_EINVAL;
  /* Reference-counted by libcurl; paired with the cleanup in webhook_free. */
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return GN_EIO;
  webhook_driver *w = calloc(1, sizeof(*w));
  if (!w) {
    curl_global_cleanup();
    return GN_ENOMEM;
  }
  w->base = (gn_settle_driver){
      .name = "webhook", .off_loop = true, .submit = webhook_submit, .cancel = webhook_cancel, .free = webhook_free};
  atomic_init(&w->canceled, 0);
  snprintf(w->url, sizeof w->url, "%s", url);
  w->timeout_ms = timeout_ms ? timeout_ms : GN_SETTLE_WEBHOOK_TIMEOUT_MS;
  *ret = &w->base;
  return 0;
}
