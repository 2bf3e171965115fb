/* gpunetd's infrastructure pieces (the node library): the control server
 * (HTTP/JSON on a Unix socket), configuration, the GPU inventory (NVML via
 * dlopen) and logging. The gpunet CLI links none of it (DESIGN.md): what it
 * shares with the daemon lives lower, the data directory in gpunet/paths.h
 * and the offer filter in gpunet/filter.h (billing), included here for the
 * daemon's files. */
#ifndef GPUNET_NODE_H
#define GPUNET_NODE_H

#include <gpunet/base.h>
#include <gpunet/filter.h>
#include <gpunet/offer.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* gpunetd's version (GET /v1/status, the startup line). */
#define GN_VERSION "0.1.0"
#include <stdio.h>
#include <uv.h>

/* --- control server (node/control.c) --------------------------------------
 *
 * HTTP/JSON over an owner-only Unix socket, served by libmicrohttpd and driven
 * from the libuv loop (no extra thread: every callback runs on the loop).
 *
 * Request lifetime: a gn_ctl_req handed to a handler must be answered exactly
 * once with one of the gn_ctl_reply_* functions, either before the handler
 * returns or later from any loop callback (the connection is suspended
 * meanwhile). Until that reply the req stays alive whatever happens: if the
 * client hangs up or gn_ctl_close runs (which answers the client 503), the
 * req is detached from its connection and the handler's later reply simply
 * frees it. A req must not be used after its reply. */

typedef struct gn_ctl gn_ctl;
typedef struct gn_ctl_req gn_ctl_req;
typedef void (*gn_ctl_handler)(gn_ctl_req *req, void *ud);

#define GN_CTL_MAX_BODY (1024 * 1024) /* request bodies above this get 413 */

/* Binds sock_path (mode 0600, set before listen), and serves it on loop.
 * A stale socket file is replaced only if nobody answers on it: GN_EBUSY when
 * another daemon is listening there, GN_EEXIST if the path is not a socket,
 * GN_EINVAL if it is too long for a Unix socket address. Changes the process
 * umask briefly around bind(): call it from the main thread at start-up. */
int gn_ctl_new(uv_loop_t *loop, const char *sock_path, gn_ctl **ret);
/* The same server on a TCP socket bound to ip:port (for GET /metrics only:
 * the caller adds just the routes it means to expose there); at most 16
 * clients at once, each dropped after 10 s idle. */
int gn_ctl_new_tcp(uv_loop_t *loop, const char *ip, int port, gn_ctl **ret);
/* The TCP port a gn_ctl_new_tcp server listens on (port 0 asked the kernel);
 * GN_EINVAL for a Unix-socket server. */
int gn_ctl_tcp_port(const gn_ctl *c);
/* Adds a route. pattern is a path whose segments may be ":name" parameters,
 * e.g. "/v1/jobs/:id/logs". The first matching route wins. Unknown paths get
 * 404, known paths with another method 405. Copies method and pattern. */
int gn_ctl_route(gn_ctl *c, const char *method, const char *pattern, gn_ctl_handler fn, void *ud);
/* The handler and ud of the route with exactly this method and pattern (as
 * given to gn_ctl_route), to serve it on another server too; GN_ENOTFOUND. */
int gn_ctl_route_find(const gn_ctl *c, const char *method, const char *pattern, gn_ctl_handler *ret_fn, void **ret_ud);
/* A guard sees every request of its server as soon as its headers are in,
 * before any route (and before the body is read): it returns 0 to let the
 * request through, or the HTTP status to refuse it with, the reason written
 * into msg. One per server; called on the loop. */
typedef unsigned (*gn_ctl_guard)(const gn_ctl_req *r, void *ud, char *msg, size_t cap);
void gn_ctl_set_guard(gn_ctl *c, gn_ctl_guard fn, void *ud);
/* A header sent with every response of the server (at most 8; copied):
 * GN_ETOOBIG past that. */
int gn_ctl_add_header(gn_ctl *c, const char *name, const char *value);
/* Answers pending requests 503, stops serving, unlinks the socket and frees
 * the server (its uv handles close asynchronously: run the loop afterwards).
 * Accepts NULL. */
void gn_ctl_close(gn_ctl *c);

const char *gn_ctl_req_method(const gn_ctl_req *r);
const char *gn_ctl_req_path(const gn_ctl_req *r);
/* A request header (case-insensitive name), or NULL; valid while the
 * request's connection is (in the guard, and in a handler until it returns). */
const char *gn_ctl_req_header(const gn_ctl_req *r, const char *name);
/* A ":name" segment of the matched pattern (URL-decoded), or NULL. */
const char *gn_ctl_req_param(const gn_ctl_req *r, const char *name);
/* A query-string argument (URL-decoded), or NULL. Copied when the request
 * arrives, so it stays valid until the reply. */
const char *gn_ctl_req_query(const gn_ctl_req *r, const char *name);
/* The parsed JSON body, or NULL when the request had none. Bodies over
 * GN_CTL_MAX_BODY are answered 413 and invalid JSON 400 before any handler
 * runs. Owned by the req. */
const json_t *gn_ctl_req_body(const gn_ctl_req *r);
/* A body sent as Content-Type: application/octet-stream is not parsed: its
 * bytes (at most GN_CTL_MAX_BODY; *ret_len 0 and NULL for any other body,
 * or none). Owned by the req. */
const uint8_t *gn_ctl_req_raw_body(const gn_ctl_req *r, size_t *ret_len);

/* Replies. Each one ends the req (see "Request lifetime" above). */
void gn_ctl_reply_json(gn_ctl_req *r, unsigned status, json_t *body /* reference stolen */);
/* Body {"error": "<formatted message>"}. */
void gn_ctl_reply_error(gn_ctl_req *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void gn_ctl_reply_text(gn_ctl_req *r, unsigned status, const char *content_type, const char *text);
/* len bytes as application/octet-stream (copied). */
void gn_ctl_reply_bytes(gn_ctl_req *r, unsigned status, const void *data, size_t len);

/* --- configuration (node/config.c) ----------------------------------------
 *
 * Precedence: defaults < config file < command-line flags. The config file is
 * DATA_DIR/gpunet.conf if present, else $XDG_CONFIG_HOME/gpunet/gpunet.conf
 * (default ~/.config/gpunet/gpunet.conf), or the one named by --config. */

#define GN_CONFIG_MAX_BOOTSTRAP 16
#define GN_CONFIG_MAX_SIMULATE 8
#define GN_CONFIG_MAX_REGISTRY_ALLOW 32
#define GN_CONFIG_INTERVAL_MIN_S 10      /* default interval_min_s */
#define GN_CONFIG_INTERVAL_MAX_S 3600    /* default interval_max_s */
#define GN_CONFIG_INTERVAL_LIMIT_S 86400 /* either may be at most a day */

/* The hostile-peer limits among the config keys: each a whole number
 * (sizes in bytes; with a K, M, G or T suffix in the file and flags). The
 * comment gives the default; gn_config_limits_json lists them with their
 * ranges. */
typedef struct gn_config_limits {
  uint64_t max_connections;     /* sessions in all, dialled and accepted: 512 */
  uint64_t dial_reserve;        /* of those, never taken by accepted ones (our own dials): 64 */
  uint64_t max_inbound_per_ip;  /* accepted connections from one IP address: 8 */
  uint64_t max_inbound_per_net; /* ... from one IPv4 /24 or IPv6 /64: 64 */
  uint64_t max_handshaking;     /* accepted connections still in their handshake: 128 */
  uint64_t transport_memory;    /* bytes of receive buffers and send queues, all peers: 256 MiB */
  uint64_t handshake_timeout_s; /* to finish the handshake: 10 */
  uint64_t idle_timeout_s;      /* without a message or keepalive: 180 */
  uint64_t progress_timeout_s;  /* for a started message to arrive whole (or its size at 64 KiB/s): 60 */
  uint64_t send_stall_s;        /* queued bytes and none taken by the peer: 30 */
  uint64_t overlay_source_rate; /* membership datagrams a second from one host (bursts of twice): 100 */
  uint64_t overlay_rate;        /* ... from all hosts together (bursts of twice): 2000 */
  uint64_t offer_table_size;    /* offers held: 4096 */
  uint64_t offers_per_provider; /* offers of one provider held: 16 */
  uint64_t gossip_peer_digests; /* digests taken from one peer per 5 s: 12 */
  uint64_t gossip_peer_wants;   /* wants answered for one peer per 5 s: 12 */
  uint64_t gossip_peer_bytes;   /* bytes sent to one peer per 5 s in answer to wants: 2 MiB */
} gn_config_limits;

typedef struct gn_config {
  char data_dir[PATH_MAX];
  char config_path[PATH_MAX]; /* the file that was read, "" if none */
  char listen[64];            /* host:port, default "127.0.0.1:7946" */
  char metrics_listen[64];    /* IP:PORT serving GET /metrics over TCP; "" (default): off */
  char dashboard_listen[64];  /* loopback IP:PORT serving the dashboard (docs/dashboard.md); "" (default): off */
  char *bootstrap[GN_CONFIG_MAX_BOOTSTRAP];
  size_t bootstrap_count;
  bool provide;
  uint64_t price_uper_hour; /* default 400000 (0.40 per GPU-hour) */
  char currency[8];         /* default "EUR" */
  char *simulate_gpu[GN_CONFIG_MAX_SIMULATE];
  size_t simulate_count;
  char runtime[64];   /* "runc", "crun", a path, or "" for auto-detection */
  uint32_t max_hours; /* default 24 */
  /* Billing intervals (debit notes) a provider agrees to, in seconds:
   * default 10..3600; a lease request outside is refused. */
  uint32_t interval_min_s, interval_max_s;
  bool allow_simulated;
  char log_level[16]; /* default "info" */
  /* The provider's budgets, shared by every job of every lease. */
  double job_memory_share;     /* of the host's RAM, default 0.5 */
  double job_cpu_share;        /* of the online CPUs, default 0.75 */
  uint32_t job_pids_max;       /* processes of all jobs together, default 16384 */
  uint64_t store_max_bytes;    /* images: blobs and unpacked roots, default 64 GiB */
  uint64_t disk_reserve_bytes; /* free space kept on the data dir's disk (the ledger's room), default 1 GiB */
  /* One lease's workspace (gpunet cp, /workspace; node/ws_prov.c): default 10 GiB. */
  uint64_t workspace_max_bytes;
  /* workspace_fs = dir: a plain directory per lease, its jobs' writes
   * measured every 10 s; auto (default): an ext4 image of workspace_max per
   * lease, mounted through a loop device, where the host can make one. */
  bool workspace_fs_dir;
  /* Loopback or private registries jobs may pull from ("127.0.0.1", "10.0.0.0/8"), NULL-terminated. */
  char *registry_allow[GN_CONFIG_MAX_REGISTRY_ALLOW + 1];
  size_t registry_allow_count;
  bool allow_unenforced_limits; /* run jobs where cgroups cannot enforce their limits (said in status) */
  bool allow_no_userns;         /* provide on a host without user namespaces (jobs' root is host root) */
  /* Settlement of countersigned final invoices (node/settle.c): "ledger"
   * (default: this node's own book) or "webhook" (POSTed to settle_url, an
   * http(s) URL, which that driver needs). */
  char settle_driver[16];
  char settle_url[1024];
  /* Training jobs (issue 8; node/train_prov.c): training -1 (default) takes
   * them when jobs get user namespaces, 1 always, 0 never (--no-training);
   * their WireGuard sockets use UDP ports jobnet_port_lo..jobnet_port_hi
   * (jobnet_ports = 51820-51899). */
  int training;
  uint16_t jobnet_port_lo, jobnet_port_hi;
  /* Membership over UDP on the listen address (node/overlay.c): default
   * on; off for a node alone or where UDP cannot pass (`overlay = off`). */
  bool overlay;
  /* A volunteer relay for peers behind NAT (node/nat.c, docs/nat.md):
   * `relay = on` (default off); pairs relayed at once, and bytes a second
   * through one pair and through all of them. */
  bool relay;
  uint32_t relay_sessions;
  uint64_t relay_pair_rate, relay_total_rate;
  /* What peers may make this node hold, and how long it waits for them
   * (docs/overlay/limits.md): one key each (the field's name; flags with
   * dashes), defaults as gn_config_defaults sets them. */
  gn_config_limits limits;
} gn_config;

/* Positive results of gn_config_parse_args / gn_config_load: the caller
 * should print gn_config_usage() or its version and exit 0. */
enum { GN_CONFIG_HELP = 1, GN_CONFIG_VERSION = 2 };

/* Where the config file is looked for when --config is not given. */
int gn_config_default_path(const char *data_dir, char *buf, size_t cap);
/* The data directory defaults to gn_data_dir_default (gpunet/paths.h),
 * empty when it has none. (The commented default file is the CLI's: `gpunet
 * init`, cli/conf.c.) */
void gn_config_defaults(gn_config *cfg);
/* Reads `key = value` lines. A missing file is an error unless missing_ok.
 * On error writes a message naming the file and line to err and leaves cfg
 * as it was. */
int gn_config_load_file(gn_config *cfg, const char *path, bool missing_ok, char *err, size_t cap);
/* Applies gpunetd's flags (getopt_long; argv is not modified). Never prints.
 * Returns 0, GN_CONFIG_HELP, GN_CONFIG_VERSION or GN_EINVAL with err set. */
int gn_config_parse_args(gn_config *cfg, int argc, char *const *argv, char *err, size_t cap);
/* All of the above in order: defaults, the --data-dir/--config flags, the
 * config file, then every flag. cfg must be fresh (not yet holding strings). */
int gn_config_load(gn_config *cfg, int argc, char *const *argv, char *err, size_t cap);
const char *gn_config_usage(void);
/* {key: value} of every limit in cfg->limits, and under "ranges" {key:
 * [min, max]}, for GET /v1/status. */
json_t *gn_config_limits_json(const gn_config *cfg);
/* Frees what cfg holds; cfg may be reused after gn_config_defaults. */
void gn_config_done(gn_config *cfg);

/* --- GPU inventory (node/gpu.c) -------------------------------------------
 *
 * NVML is loaded at run time (dlopen "libnvidia-ml.so.1", or the path in the
 * environment variable GN_NVML_LIB), so one binary runs with or without a GPU.
 * A missing NVML function or a failing query leaves that field unknown (0 or
 * empty; minor -1); no library means no real GPUs. */

typedef struct gn_gpu {
  int index;
  char uuid[96];
  char name[96];
  uint64_t memory_mib;
  char driver[32];
  char pci_bus_id[32];
  int minor;         /* -1 if unknown */
  char dev_path[32]; /* "/dev/nvidia0", "" if unknown or simulated */
  bool simulated;
  uint32_t max_sm_clock_mhz; /* 0 if unknown */
} gn_gpu;

/* What changes while a GPU runs; each field -1 or 0 when NVML cannot tell. */
typedef struct gn_gpu_stats {
  int utilization_pct; /* -1 if unknown */
  uint32_t sm_clock_mhz;
  uint32_t power_mw;
  int temperature_c; /* core temperature in Celsius, -1 if unknown */
} gn_gpu_stats;
/* Readings above this are treated as broken, not as a temperature. */
#define GN_GPU_TEMPERATURE_MAX_C 200

typedef struct gn_gpu_list {
  gn_gpu *items;
  size_t count;
} gn_gpu_list;

/* Real GPUs first, then one simulated GPU per entry of simulate ("RTX 4090",
 * "rtx4090" and "4090" name the same model). GN_EINVAL for an unknown
 * simulated model (gn_gpu_sim_models lists the known ones). */
int gn_gpu_discover(const char *const *simulate, size_t simulate_count, gn_gpu_list *ret);
/* Current utilization in percent. GN_EUNSUPPORTED for simulated GPUs or
 * when NVML cannot tell. */
int gn_gpu_utilization(const gn_gpu *g, uint8_t *ret_pct);
/* Utilization, SM clock, power and temperature in one call. GN_EUNSUPPORTED for simulated
 * GPUs or without NVML; GN_ENOTFOUND if the GPU at g->index is another one. */
int gn_gpu_stats_get(const gn_gpu *g, gn_gpu_stats *ret);
void gn_gpu_list_done(gn_gpu_list *l);
/* "RTX 3090, RTX 4090, ...": the models --simulate-gpu accepts. */
const char *gn_gpu_sim_models(void);
/* Whether name is one of those models (in any of the accepted spellings). */
bool gn_gpu_sim_known(const char *name);
/* Releases the NVML library kept loaded for gn_gpu_utilization. */
void gn_gpu_shutdown(void);

/* --- logging (node/log.c) --------------------------------------------------
 *
 * For the daemon only (library code never logs): one line per message,
 * "2026-12-02T11:00:00Z info  message", to stderr by default. */

enum gn_log_level { GN_LOG_DEBUG, GN_LOG_INFO, GN_LOG_WARN, GN_LOG_ERROR };

void gn_log(enum gn_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gn_logv(enum gn_log_level level, const char *fmt, va_list ap);
/* "debug", "info", "warn" or "error"; GN_EINVAL otherwise. */
int gn_log_set_level(const char *name);
/* Where lines go (stderr if NULL). */
void gn_log_set_output(FILE *f);
/* Like gn_log, for lines a peer can trigger (a session refused, a message
 * dropped): per key (a fixed string naming the call site), a burst of
 * GN_LOG_RL_BURST lines, then one every 6 s; lines over that are counted,
 * and the next line written for the key ends "(N similar lines suppressed)".
 * _at takes the monotonic time in ms (for tests); the other reads the clock. */
#define GN_LOG_RL_BURST 10
void gn_log_ratelimited(const char *key, enum gn_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void gn_log_ratelimited_at(uint64_t now_ms, const char *key, enum gn_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
