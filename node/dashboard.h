/* The provider dashboard (dashboard.c, docs/dashboard.md): a page and its
 * read-only JSON served on a loopback TCP port, guarded by a token kept in
 * the data dir, and the bounded history of earnings and GPU figures it plots. */
#ifndef GPUNET_NODE_DASHBOARD_H
#define GPUNET_NODE_DASHBOARD_H

#include "records.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_DASH_TOKEN_HEX 64        /* 32 random bytes as hex */
#define GN_DASH_HISTORY_POINTS 8640 /* 24 h at one point every 10 s */
#define GN_DASH_SAMPLE_MS 10000
#define GN_DASH_MAX_POINTS_OUT 720 /* points one GET /v1/history answers with */

/* A ring of the last cap samples: time, earnings, and per GPU utilisation
 * (percent, -1 unknown) and power (mW, -1 unknown). Its memory is fixed at
 * init; a push past cap overwrites the oldest sample. */
typedef struct gn__dash_ring {
  size_t cap, ngpus;
  size_t head;  /* where the next sample goes */
  size_t count; /* samples held, at most cap */
  int64_t *t_s;
  uint64_t *earned_micro;
  int16_t *util_pct; /* cap rows of ngpus */
  int32_t *power_mw; /* cap rows of ngpus */
} gn__dash_ring;

/* GN_EINVAL for cap 0, GN_ENOMEM. */
int gn__dash_ring_init(gn__dash_ring *r, size_t cap, size_t ngpus);
void gn__dash_ring_done(gn__dash_ring *r);
/* util_pct and power_mw hold ngpus values each (NULL when ngpus is 0). */
void gn__dash_ring_push(gn__dash_ring *r, int64_t t_s, uint64_t earned_micro, const int16_t *util_pct,
                        const int32_t *power_mw);
/* The i-th sample from the oldest (i < count): its row of GPU values. */
size_t gn__dash_ring_index(const gn__dash_ring *r, size_t i);
/* The samples after since_s, at most max_points of them (evenly thinned,
 * the newest always kept), as columns: {"t_s": [...], "earned_micro": [...],
 * "gpus": [{"util_pct": [...|null], "power_w": [...|null]}, ...]}. */
json_t *gn__dash_ring_json(const gn__dash_ring *r, int64_t since_s, size_t max_points);

/* The request checks of the dashboard server, in this order: a Host header
 * that is not a loopback name (DNS rebinding) is 421; a method other than
 * GET 405; a path under /v1/ without "Authorization: Bearer TOKEN" 401.
 * 0 lets the request through; msg says why not. token is GN_DASH_TOKEN_HEX
 * hex digits. */
unsigned gn__dash_check(const char *method, const char *path, const char *host, const char *auth, const char *token,
                        char *msg, size_t cap);
/* Whether host is "localhost", "127.x.y.z" or "[::1]", with an optional
 * ":PORT" (any port: an SSH tunnel may forward another local port). */
bool gn__dash_host_ok(const char *host);
/* Whether auth is "Bearer " and the token (compared in constant time). */
bool gn__dash_token_ok(const char *auth, const char *token);
/* Reads DATA_DIR/dashboard.token, or on first use writes 32 random bytes as
 * hex there (mode 0600, through a temporary file and rename). ret_hex gets
 * GN_DASH_TOKEN_HEX digits and a NUL; *ret_created whether it was made now.
 * GN_EPROTO when the file holds anything but one token; -errno. */
int gn__dash_token_load(const char *data_dir, char ret_hex[GN_DASH_TOKEN_HEX + 1], bool *ret_created);

/* Starts serving the dashboard on n->cfg.dashboard_listen (after the control
 * API's routes are registered: it serves some of them too) and its sampling
 * timer; err says what failed. _stop closes both (at shutdown); _free frees
 * what is left once the loop has ended. Both accept a node without one. */
int gn__dash_start(gn_node *n, char *err, size_t cap);
void gn__dash_stop(gn_node *n);
void gn__dash_free(gn_node *n);

#endif
