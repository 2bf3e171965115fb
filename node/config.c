/* gpunetd's configuration: defaults, the `key = value` config file and the
 * command-line flags, applied in that order. */
#include <gpunet/billing.h>
#include <gpunet/node.h>
#include <gpunet/paths.h>
#include <gpunet/settle.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <strings.h>
#include <unistd.h>

#define CFG_MAX_LINE 4096
#define CFG_MAX_LINES 10000

/* Option ids for getopt_long: the keys that only flags have. */
enum { OPT_CONFIG = 256, OPT_VERSION, OPT_KEY_BASE = 512 };

/* One entry per config key; flag is its gpunetd option name. */
typedef enum {
  KEY_DATA_DIR,
  KEY_LISTEN,
  KEY_BOOTSTRAP,
  KEY_PROVIDE,
  KEY_PRICE,
  KEY_CURRENCY,
  KEY_SIMULATE_GPU,
  KEY_RUNTIME,
  KEY_MAX_HOURS,
  KEY_ALLOW_SIMULATED,
  KEY_LOG_LEVEL,
  KEY_JOB_MEMORY_SHARE,
  KEY_JOB_CPU_SHARE,
  KEY_JOB_PIDS_MAX,
  KEY_STORE_MAX,
  KEY_DISK_RESERVE,
  KEY_WORKSPACE_MAX,
  KEY_WORKSPACE_FS,
  KEY_REGISTRY_ALLOW,
  KEY_ALLOW_UNENFORCED_LIMITS,
  KEY_ALLOW_NO_USERNS,
  KEY_INTERVAL_MIN,
  KEY_INTERVAL_MAX,
  KEY_SETTLE_DRIVER,
  KEY_SETTLE_URL,
  KEY_RELAY,
  KEY_RELAY_SESSIONS,
  KEY_RELAY_PAIR_RATE,
  KEY_RELAY_TOTAL_RATE,
  KEY_TRAINING,
  KEY_NO_TRAINING,
  KEY_JOBNET_PORTS,
  KEY_OVERLAY,
  KEY_METRICS_LISTEN,
  KEY_DASHBOARD_LISTEN,
  /* The hostile-peer limits (gn_config_limits), one table below. */
  KEY_MAX_CONNECTIONS,
  KEY_DIAL_RESERVE,
  KEY_MAX_INBOUND_PER_IP,
  KEY_MAX_INBOUND_PER_NET,
  KEY_MAX_HANDSHAKING,
  KEY_TRANSPORT_MEMORY,
  KEY_HANDSHAKE_TIMEOUT,
  KEY_IDLE_TIMEOUT,
  KEY_PROGRESS_TIMEOUT,
  KEY_SEND_STALL,
  KEY_OVERLAY_SOURCE_RATE,
  KEY_OVERLAY_RATE,
  KEY_OFFER_TABLE_SIZE,
  KEY_OFFERS_PER_PROVIDER,
  KEY_GOSSIP_PEER_DIGESTS,
  KEY_GOSSIP_PEER_WANTS,
  KEY_GOSSIP_PEER_BYTES,
  KEY_COUNT
} cfg_key;

static const struct {
  const char *name;
  const char *flag;
  bool boolean; /* a flag without argument; "true"/"false" in the file */
} cfg_keys[KEY_COUNT] = {
    [KEY_DATA_DIR] = {"data_dir", "data-dir", false},
    [KEY_LISTEN] = {"listen", "listen", false},
    [KEY_BOOTSTRAP] = {"bootstrap", "bootstrap", false},
    [KEY_PROVIDE] = {"provide", "provide", true},
    [KEY_PRICE] = {"price", "price", false},
    [KEY_CURRENCY] = {"currency", "currency", false},
    [KEY_SIMULATE_GPU] = {"simulate_gpu", "simulate-gpu", false},
    [KEY_RUNTIME] = {"runtime", "runtime", false},
    [KEY_MAX_HOURS] = {"max_hours", "max-hours", false},
    [KEY_ALLOW_SIMULATED] = {"allow_simulated", "allow-simulated", true},
    [KEY_LOG_LEVEL] = {"log_level", "log-level", false},
    [KEY_JOB_MEMORY_SHARE] = {"job_memory_share", "job-memory-share", false},
    [KEY_JOB_CPU_SHARE] = {"job_cpu_share", "job-cpu-share", false},
    [KEY_JOB_PIDS_MAX] = {"job_pids_max", "job-pids-max", false},
    [KEY_STORE_MAX] = {"store_max", "store-max", false},
    [KEY_DISK_RESERVE] = {"disk_reserve", "disk-reserve", false},
    [KEY_WORKSPACE_MAX] = {"workspace_max", "workspace-max", false},
    [KEY_WORKSPACE_FS] = {"workspace_fs", "workspace-fs", false},
    [KEY_REGISTRY_ALLOW] = {"registry_allow", "registry-allow", false},
    [KEY_ALLOW_UNENFORCED_LIMITS] = {"allow_unenforced_limits", "allow-unenforced-limits", true},
    [KEY_ALLOW_NO_USERNS] = {"allow_no_userns", "allow-no-userns", true},
    [KEY_INTERVAL_MIN] = {"interval_min_s", "interval-min-s", false},
    [KEY_INTERVAL_MAX] = {"interval_max_s", "interval-max-s", false},
    [KEY_SETTLE_DRIVER] = {"settle_driver", "settle-driver", false},
    [KEY_SETTLE_URL] = {"settle_url", "settle-url", false},
    [KEY_RELAY] = {"relay", "relay", false},
    [KEY_RELAY_SESSIONS] = {"relay_sessions", "relay-sessions", false},
    [KEY_RELAY_PAIR_RATE] = {"relay_pair_rate", "relay-pair-rate", false},
    [KEY_RELAY_TOTAL_RATE] = {"relay_total_rate", "relay-total-rate", false},
    [KEY_TRAINING] = {"training", "training", true},
    [KEY_NO_TRAINING] = {"no_training", "no-training", true},
    [KEY_JOBNET_PORTS] = {"jobnet_ports", "jobnet-ports", false},
    [KEY_OVERLAY] = {"overlay", "overlay", false},
    [KEY_METRICS_LISTEN] = {"metrics_listen", "metrics-listen", false},
    [KEY_DASHBOARD_LISTEN] = {"dashboard_listen", "dashboard-listen", false},
    [KEY_MAX_CONNECTIONS] = {"max_connections", "max-connections", false},
    [KEY_DIAL_RESERVE] = {"dial_reserve", "dial-reserve", false},
    [KEY_MAX_INBOUND_PER_IP] = {"max_inbound_per_ip", "max-inbound-per-ip", false},
    [KEY_MAX_INBOUND_PER_NET] = {"max_inbound_per_net", "max-inbound-per-net", false},
    [KEY_MAX_HANDSHAKING] = {"max_handshaking", "max-handshaking", false},
    [KEY_TRANSPORT_MEMORY] = {"transport_memory", "transport-memory", false},
    [KEY_HANDSHAKE_TIMEOUT] = {"handshake_timeout_s", "handshake-timeout-s", false},
    [KEY_IDLE_TIMEOUT] = {"idle_timeout_s", "idle-timeout-s", false},
    [KEY_PROGRESS_TIMEOUT] = {"progress_timeout_s", "progress-timeout-s", false},
    [KEY_SEND_STALL] = {"send_stall_s", "send-stall-s", false},
    [KEY_OVERLAY_SOURCE_RATE] = {"overlay_source_rate", "overlay-source-rate", false},
    [KEY_OVERLAY_RATE] = {"overlay_rate", "overlay-rate", false},
    [KEY_OFFER_TABLE_SIZE] = {"offer_table_size", "offer-table-size", false},
    [KEY_OFFERS_PER_PROVIDER] = {"offers_per_provider", "offers-per-provider", false},
    [KEY_GOSSIP_PEER_DIGESTS] = {"gossip_peer_digests", "gossip-peer-digests", false},
    [KEY_GOSSIP_PEER_WANTS] = {"gossip_peer_wants", "gossip-peer-wants", false},
    [KEY_GOSSIP_PEER_BYTES] = {"gossip_peer_bytes", "gossip-peer-bytes", false},
};

/* The limit keys: where each lives in gn_config_limits, its default (what
 * was compiled in before it was a key), its range, and what it counts (said
 * in the error for a value out of range). */
#define LIM(key, field, dflt, lo, hi, size, what) [key] = {offsetof(gn_config_limits, field), dflt, lo, hi, size, what}
static const struct {
  size_t off;
  uint64_t dflt, min, max;
  bool size; /* bytes, with an optional K, M, G or T */
  const char *what;
} cfg_limits[KEY_COUNT] = {
    LIM(KEY_MAX_CONNECTIONS, max_connections, 512, 16, 65536, false, "sessions in all"),
    LIM(KEY_DIAL_RESERVE, dial_reserve, 64, 0, 65535, false, "places kept for this node's own dials"),
    LIM(KEY_MAX_INBOUND_PER_IP, max_inbound_per_ip, 8, 1, 65536, false, "connections accepted from one IP address"),
    LIM(KEY_MAX_INBOUND_PER_NET, max_inbound_per_net, 64, 1, 65536, false,
        "connections accepted from one /24 (IPv6: /64)"),
    LIM(KEY_MAX_HANDSHAKING, max_handshaking, 128, 1, 65536, false, "accepted connections still in their handshake"),
    LIM(KEY_TRANSPORT_MEMORY, transport_memory, 256ull << 20, 16ull << 20, 64ull << 30, true,
        "bytes of all peers' receive buffers and send queues"),
    LIM(KEY_HANDSHAKE_TIMEOUT, handshake_timeout_s, 10, 1, 600, false, "seconds to finish a handshake"),
    LIM(KEY_IDLE_TIMEOUT, idle_timeout_s, 180, 90, 86400, false,
        "seconds a session may bring nothing; peers send a keepalive after 60 s of quiet"),
    LIM(KEY_PROGRESS_TIMEOUT, progress_timeout_s, 60, 5, 3600, false, "seconds for a started message to arrive"),
    LIM(KEY_SEND_STALL, send_stall_s, 30, 5, 3600, false, "seconds a peer may take none of our queued bytes"),
    LIM(KEY_OVERLAY_SOURCE_RATE, overlay_source_rate, 100, 1, 100000, false,
        "membership datagrams a second from one host"),
    LIM(KEY_OVERLAY_RATE, overlay_rate, 2000, 1, 1000000, false, "membership datagrams a second from all hosts"),
    LIM(KEY_OFFER_TABLE_SIZE, offer_table_size, 4096, 64, 1048576, false, "offers held"),
    LIM(KEY_OFFERS_PER_PROVIDER, offers_per_provider, 16, 1, 1024, false, "offers of one provider held"),
    LIM(KEY_GOSSIP_PEER_DIGESTS, gossip_peer_digests, 12, 1, 1000, false, "digests taken from one peer per 5 s"),
    LIM(KEY_GOSSIP_PEER_WANTS, gossip_peer_wants, 12, 1, 1000, false, "wants answered for one peer per 5 s"),
    LIM(KEY_GOSSIP_PEER_BYTES, gossip_peer_bytes, 2ull << 20, 64ull << 10, 1ull << 30, true,
        "bytes sent to one peer per 5 s in answer to its wants"),
};
#undef LIM

static bool is_limit_key(cfg_key key) {
  return cfg_limits[key].what != NULL;
}

static uint64_t *limit_field(gn_config *cfg, cfg_key key) {
  return (uint64_t *)((char *)&cfg->limits + cfg_limits[key].off);
}

static const char usage_text[] = "Usage: gpunetd [OPTIONS]\n"
                                 "Runs the gpunet node: joins the overlay, serves the control API for the\n"
                                 "gpunet command and, with --provide, rents out this machine's GPUs.\n"
                                 "\n"
                                 "  --data-dir DIR          state directory (default $XDG_DATA_HOME/gpunet,\n"
                                 "                          else ~/.local/share/gpunet)\n"
                                 "  --config FILE           config file (default DATA_DIR/gpunet.conf if it\n"
                                 "                          exists, else ~/.config/gpunet/gpunet.conf)\n"
                                 "  --listen ADDR:PORT      peer address to listen on (default 127.0.0.1:7946)\n"
                                 "  --bootstrap ADDR:PORT   peer to join through (repeatable)\n"
                                 "  --provide               offer this machine's GPUs for rent\n"
                                 "  --price AMOUNT          price per GPU-hour in currency units (default 0.40)\n"
                                 "  --currency CODE         currency of prices (default EUR)\n"
                                 "  --simulate-gpu MODEL    add a simulated GPU, e.g. \"RTX 4090\" (repeatable)\n"
                                 "  --runtime runc|crun|PATH  OCI runtime (default: detect)\n"
                                 "  --max-hours N           longest lease this node accepts (default 24)\n"
                                 "  --interval-min-s N      shortest billing interval (debit notes) a lease may\n"
                                 "                          ask for, in seconds (default 10)\n"
                                 "  --interval-max-s N      longest billing interval, in seconds (default 3600)\n"
                                 "  --settle-driver ledger|webhook  how countersigned final invoices are\n"
                                 "                          settled (default ledger: this node's own book)\n"
                                 "  --settle-url URL        http(s) endpoint the webhook driver POSTs each\n"
                                 "                          final voucher and invoice to\n"
                                 "  --allow-simulated       as a requester, accept simulated GPUs\n"
                                 "  --relay on|off          relay sessions for peers behind NAT (docs/nat.md;\n"
                                 "                          default off)\n"
                                 "  --relay-sessions N      relayed pairs at once (16)\n"
                                 "  --relay-pair-rate SIZE  bytes a second through one relayed pair (1M)\n"
                                 "  --relay-total-rate SIZE bytes a second through all of them (8M)\n"
                                 "  --log-level LEVEL       debug, info, warn or error (default info)\n"
                                 "  --overlay on|off        membership (SWIM) over UDP on the listen address and\n"
                                 "                          port (default on; off for a node alone)\n"
                                 "  --metrics-listen [IP:]PORT  also serve GET /metrics (Prometheus) over TCP\n"
                                 "                          (default off; a bare port binds 127.0.0.1)\n"
                                 "  --dashboard-listen [IP:]PORT  serve the provider dashboard (docs/dashboard.md)\n"
                                 "                          on a loopback address (default off; a bare port\n"
                                 "                          binds 127.0.0.1)\n"
                                 "\n"
                                 "What peers may make this node hold (docs/overlay/limits.md; the defaults):\n"
                                 "  --max-connections N     sessions in all, dialled and accepted (512)\n"
                                 "  --dial-reserve N        of those, kept for this node's own dials (64)\n"
                                 "  --max-inbound-per-ip N  connections accepted from one IP address (8)\n"
                                 "  --max-inbound-per-net N ... from one IPv4 /24 or IPv6 /64 (64)\n"
                                 "  --max-handshaking N     accepted connections still in their handshake (128)\n"
                                 "  --transport-memory SIZE receive buffers and send queues of all peers (256M)\n"
                                 "  --handshake-timeout-s N seconds to finish a handshake (10)\n"
                                 "  --idle-timeout-s N      seconds a session may bring nothing (180)\n"
                                 "  --progress-timeout-s N  seconds for a started message to arrive (60)\n"
                                 "  --send-stall-s N        seconds a peer may take none of our bytes (30)\n"
                                 "  --overlay-source-rate N membership datagrams a second from one host (100)\n"
                                 "  --overlay-rate N        ... from all hosts together (2000)\n"
                                 "  --offer-table-size N    offers held (4096)\n"
                                 "  --offers-per-provider N offers of one provider held (16)\n"
                                 "  --gossip-peer-digests N digests taken from one peer per 5 s (12)\n"
                                 "  --gossip-peer-wants N   wants answered for one peer per 5 s (12)\n"
                                 "  --gossip-peer-bytes SIZE  bytes answered to one peer per 5 s (2M)\n"
                                 "\n"
                                 "A provider's budgets, shared by all jobs of all leases (a job that does not\n"
                                 "fit in what is left is refused, saying why):\n"
                                 "  --job-memory-share F    share of the host's RAM for jobs (default 0.5)\n"
                                 "  --job-cpu-share F       share of the online CPUs for jobs (default 0.75); a\n"
                                 "                          lease gets its GPUs' part of it\n"
                                 "  --job-pids-max N        processes of all jobs together (default 16384)\n"
                                 "  --store-max SIZE        disk for images, e.g. 64G (default 64G)\n"
                                 "  --disk-reserve SIZE     free space kept on the data dir's disk (default 1G)\n"
                                 "  --workspace-max SIZE    a lease's workspace (gpunet cp), e.g. 10G (default 10G)\n"
                                 "  --registry-allow HOST[:PORT]|CIDR  a loopback, private or own-address\n"
                                 "                          registry jobs may pull from (repeatable; default none)\n"
                                 "  --allow-unenforced-limits  run jobs even where cgroups cannot enforce their\n"
                                 "                          memory, pids and CPU limits (offers and status say so)\n"
                                 "  --allow-no-userns       provide on a host without user namespaces: jobs' root\n"
                                 "                          is then the host's root (offers and status say so)\n"
                                 "  --training / --no-training  take ranks of training jobs or not (default:\n"
                                 "                          when jobs get user namespaces)\n"
                                 "  --jobnet-ports LO-HI    UDP ports for training jobs' WireGuard sockets\n"
                                 "                          (default 51820-51899)\n"
                                 "\n"
                                 "  -h, --help              show this help\n"
                                 "  --version               show the version\n"
                                 "\n"
                                 "Every option can also be set in the config file as `key = value`, with\n"
                                 "dashes written as underscores (simulate_gpu = RTX 4090).\n";

const char *gn_config_usage(void) {
  return usage_text;
}

/* --- paths -------------------------------------------------------------------*/

static int path_fmt(char *buf, size_t cap, const char *a, const char *b) {
  int n = snprintf(buf, cap, "%s%s", a, b);
  return n < 0 || (size_t)n >= cap ? GN_ETOOBIG : 0;
}

int gn_config_default_path(const char *data_dir, char *buf, size_t cap) {
  char p[PATH_MAX];
  if (data_dir && data_dir[0] && path_fmt(p, sizeof(p), data_dir, "/gpunet.conf") == 0 && access(p, F_OK) == 0)
    return path_fmt(buf, cap, p, "");
  const char *x = getenv("XDG_CONFIG_HOME");
  if (x && x[0] == '/')
    return path_fmt(buf, cap, x, "/gpunet/gpunet.conf");
  const char *home = getenv("HOME");
  if (!home || !home[0])
    return GN_ENOTFOUND;
  return path_fmt(buf, cap, home, "/.config/gpunet/gpunet.conf");
}

/* --- values ------------------------------------------------------------------*/

void gn_config_defaults(gn_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  if (gn_data_dir_default(cfg->data_dir, sizeof(cfg->data_dir)) < 0)
    cfg->data_dir[0] = '\0';
  snprintf(cfg->listen, sizeof(cfg->listen), "127.0.0.1:7946");
  cfg->price_uper_hour = 400000;
  snprintf(cfg->currency, sizeof(cfg->currency), "EUR");
  cfg->max_hours = 24;
  cfg->relay_sessions = 16;
  cfg->relay_pair_rate = 1u << 20;
  cfg->relay_total_rate = 8u << 20;
  cfg->interval_min_s = GN_CONFIG_INTERVAL_MIN_S;
  cfg->interval_max_s = GN_CONFIG_INTERVAL_MAX_S;
  snprintf(cfg->settle_driver, sizeof(cfg->settle_driver), "ledger");
  snprintf(cfg->log_level, sizeof(cfg->log_level), "info");
  cfg->job_memory_share = 0.5;
  cfg->job_cpu_share = 0.75;
  cfg->job_pids_max = 16384;
  cfg->store_max_bytes = 64ull << 30;
  cfg->disk_reserve_bytes = 1ull << 30;
  cfg->workspace_max_bytes = 10ull << 30;
  cfg->training = -1;
  cfg->overlay = true;
  cfg->jobnet_port_lo = 51820;
  cfg->jobnet_port_hi = 51899;
  for (int k = 0; k < KEY_COUNT; k++)
    if (is_limit_key((cfg_key)k))
      *limit_field(cfg, (cfg_key)k) = cfg_limits[k].dflt;
}

void gn_config_done(gn_config *cfg) {
  if (!cfg)
    return;
  for (size_t i = 0; i < cfg->bootstrap_count; i++)
    free(cfg->bootstrap[i]);
  for (size_t i = 0; i < cfg->simulate_count; i++)
    free(cfg->simulate_gpu[i]);
  for (size_t i = 0; i < cfg->registry_allow_count; i++) {
    free(cfg->registry_allow[i]);
    cfg->registry_allow[i] = NULL; /* the list stays NULL-terminated */
  }
  cfg->bootstrap_count = cfg->simulate_count = cfg->registry_allow_count = 0;
}

/* Deep copy, so a failed load can be thrown away without touching cfg. */
static int cfg_copy(gn_config *dst, const gn_config *src) {
  *dst = *src;
  dst->bootstrap_count = dst->simulate_count = dst->registry_allow_count = 0;
  memset(dst->registry_allow, 0, sizeof(dst->registry_allow));
  for (size_t i = 0; i < src->bootstrap_count; i++) {
    if (!(dst->bootstrap[i] = strdup(src->bootstrap[i])))
      goto oom;
    dst->bootstrap_count++;
  }
  for (size_t i = 0; i < src->simulate_count; i++) {
    if (!(dst->simulate_gpu[i] = strdup(src->simulate_gpu[i])))
      goto oom;
    dst->simulate_count++;
  }
  for (size_t i = 0; i < src->registry_allow_count; i++) {
    if (!(dst->registry_allow[i] = strdup(src->registry_allow[i])))
      goto oom;
    dst->registry_allow_count++;
  }
  return 0;
oom:
  gn_config_done(dst);
  return GN_ENOMEM;
}

static bool parse_bool(const char *v, bool *ret) {
  static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(yes); i++) {
    if (strcasecmp(v, yes[i]) == 0) {
      *ret = true;
      return true;
    }
    if (strcasecmp(v, no[i]) == 0) {
      *ret = false;
      return true;
    }
  }
  return false;
}

/* host:port with a port in 1..65535; the host is resolved later. */
static bool valid_hostport(const char *v) {
  const char *colon = strrchr(v, ':');
  if (!colon || colon == v || strlen(v) >= 64)
    return false;
  char *end;
  errno = 0;
  unsigned long port = strtoul(colon + 1, &end, 10);
  return errno == 0 && end != colon + 1 && *end == '\0' && port >= 1 && port <= 65535;
}

/* "9464" -> "127.0.0.1:9464" (the port is checked by the caller). */
static int metrics_loopback(char *buf, const char *port) {
  int n = snprintf(buf, 64, "127.0.0.1:%s", port);
  return n < 0 || n >= 64 ? -1 : 0;
}

static bool copy_str(char *dst, size_t cap, const char *v) {
  size_t n = strlen(v);
  if (n >= cap)
    return false;
  memcpy(dst, v, n + 1);
  return true;
}

/* A share like 0.5: more than 0, at most 1. */
static bool parse_share(const char *v, double *ret) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || end == v || *end || !(d > 0.0 && d <= 1.0))
    return false;
  *ret = d;
  return true;
}

/* A size in bytes with an optional binary suffix: 1073741824, 512M, 64G,
 * 64GiB, 1T (K, M, G, T: powers of 1024). */
static bool parse_size(const char *v, uint64_t *ret) {
  if (!isdigit((unsigned char)v[0]))
    return false;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno)
    return false;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K':
    shift = 10;
    break;
  case 'M':
    shift = 20;
    break;
  case 'G':
    shift = 30;
    break;
  case 'T':
    shift = 40;
    break;
  case 'B':
  case '\0':
    break;
  default:
    return false;
  }
  if (shift) {
    end++;
    if (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0)
      end += strlen(end);
  } else if (*end) {
    end++; /* "B" */
  }
  if (*end || (shift && n > (UINT64_MAX >> shift)))
    return false;
  *ret = (uint64_t)n << shift;
  return true;
}

/* One registry_allow entry: a host name or address with an optional port,
 * "[v6]:port", or a CIDR block like 10.0.0.0/8 or fd00::/8. Only the
 * grammar is checked here; the store matches it against addresses. */
static bool valid_registry_allow(const char *v) {
  size_t n = strlen(v);
  if (n == 0 || n > 255)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)v[i]) && !strchr(".-:/[]", v[i]))
      return false;
  const char *slash = strchr(v, '/');
  if (slash) {
    char *end;
    errno = 0;
    unsigned long bits = strtoul(slash + 1, &end, 10);
    bool v6 = memchr(v, ':', (size_t)(slash - v)) != NULL;
    if (errno || end == slash + 1 || *end || bits > (v6 ? 128u : 32u) || slash == v)
      return false;
  }
  return v[0] != '-' && v[0] != '.';
}

/* registry_allow takes one entry or several separated by commas. */
static int add_registry_allow(gn_config *cfg, const char *v, char *err, size_t cap) {
  char item[300];
  const char *p = v;
  while (*p) {
    size_t len = strcspn(p, ", \t");
    if (len) {
      if (len >= sizeof(item)) {
        snprintf(err, cap, "bad registry_allow entry '%.60s...': too long", p);
        return GN_EINVAL;
      }
      memcpy(item, p, len);
      item[len] = '\0';
      if (!valid_registry_allow(item)) {
        snprintf(err, cap, "bad registry_allow entry '%.120s': want HOST, HOST:PORT or a CIDR block like 10.0.0.0/8",
                 item);
        return GN_EINVAL;
      }
      if (cfg->registry_allow_count == GN_CONFIG_MAX_REGISTRY_ALLOW) {
        snprintf(err, cap, "too many registry_allow entries (at most %d)", GN_CONFIG_MAX_REGISTRY_ALLOW);
        return GN_ETOOBIG;
      }
      if (!(cfg->registry_allow[cfg->registry_allow_count] = strdup(item)))
        return GN_ENOMEM;
      cfg->registry_allow_count++;
    }
    p += len;
    p += strspn(p, ", \t");
  }
  return 0;
}

/* "256M" for a size that is a whole number of KiB, MiB..., else the bytes. */
static void fmt_size(uint64_t v, char *buf, size_t cap) {
  static const char suffix[] = "TGMK";
  for (int i = 0; i < 4; i++) {
    unsigned shift = 10u * (unsigned)(4 - i);
    if (v && (v & ((1ull << shift) - 1)) == 0) {
      snprintf(buf, cap, "%llu%c", (unsigned long long)(v >> shift), suffix[i]);
      return;
    }
  }
  snprintf(buf, cap, "%llu", (unsigned long long)v);
}

/* A limit key's value: a whole number (a size for size keys) in its range. */
static int set_limit(gn_config *cfg, cfg_key key, const char *v, char *err, size_t cap) {
  uint64_t n = 0;
  bool ok;
  if (cfg_limits[key].size) {
    ok = parse_size(v, &n);
  } else {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    ok = !errno && end != v && !*end && isdigit((unsigned char)v[0]);
    n = x;
  }
  if (!ok || n < cfg_limits[key].min || n > cfg_limits[key].max) {
    char lo[32], hi[32];
    if (cfg_limits[key].size) {
      fmt_size(cfg_limits[key].min, lo, sizeof(lo));
      fmt_size(cfg_limits[key].max, hi, sizeof(hi));
    } else {
      snprintf(lo, sizeof(lo), "%llu", (unsigned long long)cfg_limits[key].min);
      snprintf(hi, sizeof(hi), "%llu", (unsigned long long)cfg_limits[key].max);
    }
    snprintf(err, cap, "%s %s '%.60s': want %s from %s to %s (%s)", ok ? "out of range" : "bad", cfg_keys[key].name, v,
             cfg_limits[key].size ? "a size (K, M, G or T)" : "a whole number", lo, hi, cfg_limits[key].what);
    return GN_EINVAL;
  }
  *limit_field(cfg, key) = n;
  return 0;
}

json_t *gn_config_limits_json(const gn_config *cfg) {
  json_t *o = json_object(), *ranges = json_object();
  for (int k = 0; o && ranges && k < KEY_COUNT; k++) {
    if (!is_limit_key((cfg_key)k))
      continue;
    uint64_t v = *limit_field((gn_config *)cfg, (cfg_key)k);
    json_object_set_new(o, cfg_keys[k].name, json_integer((json_int_t)v));
    json_object_set_new(ranges, cfg_keys[k].name,
                        json_pack("[I, I]", (json_int_t)cfg_limits[k].min, (json_int_t)cfg_limits[k].max));
  }
  if (o && ranges)
    json_object_set(o, "ranges", ranges);
  json_decref(ranges);
  return o;
}

/* Sets one key from its text value; err says what is wrong with the value. */
static int cfg_set(gn_config *cfg, cfg_key key, const char *v, char *err, size_t cap) {
  const char *name = cfg_keys[key].name;
  bool b;
  switch (key) {
  case KEY_DATA_DIR:
    if (!v[0] || !copy_str(cfg->data_dir, sizeof(cfg->data_dir), v))
      goto bad;
    return 0;
  case KEY_LISTEN:
    if (!valid_hostport(v) || !copy_str(cfg->listen, sizeof(cfg->listen), v))
      goto bad_addr;
    return 0;
  case KEY_BOOTSTRAP:
    if (!valid_hostport(v))
      goto bad_addr;
    if (cfg->bootstrap_count == GN_CONFIG_MAX_BOOTSTRAP) {
      snprintf(err, cap, "too many bootstrap peers (at most %d)", GN_CONFIG_MAX_BOOTSTRAP);
      return GN_ETOOBIG;
    }
    if (!(cfg->bootstrap[cfg->bootstrap_count] = strdup(v)))
      return GN_ENOMEM;
    cfg->bootstrap_count++;
    return 0;
  case KEY_PROVIDE:
  case KEY_ALLOW_SIMULATED:
  case KEY_ALLOW_UNENFORCED_LIMITS:
  case KEY_ALLOW_NO_USERNS:
    if (!parse_bool(v, &b)) {
      snprintf(err, cap, "%s must be true or false, not '%.60s'", name, v);
      return GN_EINVAL;
    }
    *(key == KEY_PROVIDE                   ? &cfg->provide
      : key == KEY_ALLOW_SIMULATED         ? &cfg->allow_simulated
      : key == KEY_ALLOW_UNENFORCED_LIMITS ? &cfg->allow_unenforced_limits
                                           : &cfg->allow_no_userns) = b;
    return 0;
  case KEY_JOB_MEMORY_SHARE:
  case KEY_JOB_CPU_SHARE:
    if (!parse_share(v, key == KEY_JOB_MEMORY_SHARE ? &cfg->job_memory_share : &cfg->job_cpu_share)) {
      snprintf(err, cap, "bad %s '%.60s': want a share of the host above 0 and at most 1, like 0.5", name, v);
      return GN_EINVAL;
    }
    return 0;
  case KEY_JOB_PIDS_MAX: {
    char *end;
    errno = 0;
    unsigned long p = strtoul(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || p < 8 || p > 4194304) {
      snprintf(err, cap, "bad job_pids_max '%.60s': want a whole number of processes from 8 to 4194304", v);
      return GN_EINVAL;
    }
    cfg->job_pids_max = (uint32_t)p;
    return 0;
  }
  case KEY_STORE_MAX:
  case KEY_DISK_RESERVE:
  case KEY_WORKSPACE_MAX: {
    uint64_t bytes;
    bool ok = parse_size(v, &bytes);
    if (ok && key == KEY_STORE_MAX && bytes < (64ull << 20)) {
      snprintf(err, cap, "store_max '%.60s' is too small: images need at least 64M", v);
      return GN_EINVAL;
    }
    if (!ok) {
      snprintf(err, cap, "bad %s '%.60s': want a size like 64G, 512M or a number of bytes", name, v);
      return GN_EINVAL;
    }
    *(key == KEY_STORE_MAX       ? &cfg->store_max_bytes
      : key == KEY_WORKSPACE_MAX ? &cfg->workspace_max_bytes
                                 : &cfg->disk_reserve_bytes) = bytes;
    return 0;
  }
  case KEY_WORKSPACE_FS:
    if (strcmp(v, "auto") && strcmp(v, "dir")) {
      snprintf(err, cap, "bad workspace_fs '%.60s' (known: auto, an ext4 image per lease where the host can; dir)", v);
      return GN_EINVAL;
    }
    cfg->workspace_fs_dir = strcmp(v, "dir") == 0;
    return 0;
  case KEY_REGISTRY_ALLOW:
    return add_registry_allow(cfg, v, err, cap);
  case KEY_PRICE:
    if (gn_price_parse(v, &cfg->price_uper_hour) < 0) {
      snprintf(err, cap, "bad price '%s': want an amount per GPU-hour like 0.40 (at most 6 decimals)", v);
      return GN_EINVAL;
    }
    return 0;
  case KEY_CURRENCY: {
    size_t n = strlen(v);
    bool ok = n >= 1 && n < sizeof(cfg->currency);
    for (size_t i = 0; ok && i < n; i++)
      ok = isupper((unsigned char)v[i]);
    if (!ok) {
      snprintf(err, cap, "bad currency '%s': want an upper-case code like EUR", v);
      return GN_EINVAL;
    }
    memcpy(cfg->currency, v, n + 1);
    return 0;
  }
  case KEY_SIMULATE_GPU:
    if (!gn_gpu_sim_known(v)) {
      snprintf(err, cap, "unknown simulated GPU '%.60s' (known: %s)", v, gn_gpu_sim_models());
      return GN_EINVAL;
    }
    if (cfg->simulate_count == GN_CONFIG_MAX_SIMULATE) {
      snprintf(err, cap, "too many simulated GPUs (at most %d)", GN_CONFIG_MAX_SIMULATE);
      return GN_ETOOBIG;
    }
    if (!(cfg->simulate_gpu[cfg->simulate_count] = strdup(v)))
      return GN_ENOMEM;
    cfg->simulate_count++;
    return 0;
  case KEY_RUNTIME:
    if (!copy_str(cfg->runtime, sizeof(cfg->runtime), v))
      goto bad;
    return 0;
  case KEY_MAX_HOURS: {
    char *end;
    errno = 0;
    unsigned long h = strtoul(v, &end, 10);
    /* An agreement holds at most GN_INVOICE_MAX_S (960 h): a longer offer
     * could never be signed. */
    if (errno || end == v || *end || v[0] == '-' || h < 1 || h > GN_INVOICE_MAX_S / 3600u) {
      snprintf(err, cap,
               "bad max_hours '%s': want a whole number of hours from 1 to %u (the longest lease an agreement holds)",
               v, GN_INVOICE_MAX_S / 3600u);
      return GN_EINVAL;
    }
    cfg->max_hours = (uint32_t)h;
    return 0;
  }
  case KEY_INTERVAL_MIN:
  case KEY_INTERVAL_MAX: {
    char *end;
    errno = 0;
    unsigned long s = strtoul(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || s < 1 || s > GN_CONFIG_INTERVAL_LIMIT_S) {
      snprintf(err, cap, "bad %s '%.60s': want a whole number of seconds from 1 to %u", name, v,
               GN_CONFIG_INTERVAL_LIMIT_S);
      return GN_EINVAL;
    }
    *(key == KEY_INTERVAL_MIN ? &cfg->interval_min_s : &cfg->interval_max_s) = (uint32_t)s;
    return 0;
  }
  case KEY_SETTLE_DRIVER:
    if (strcmp(v, "ledger") && strcmp(v, "webhook")) {
      snprintf(err, cap, "bad settle_driver '%.60s' (known: ledger, webhook)", v);
      return GN_EINVAL;
    }
    copy_str(cfg->settle_driver, sizeof(cfg->settle_driver), v);
    return 0;
  case KEY_SETTLE_URL:
    if (gn_settle_url_check(v) < 0 || !copy_str(cfg->settle_url, sizeof(cfg->settle_url), v)) {
      snprintf(err, cap, "bad settle_url '%.100s': want an http:// or https:// URL with a host, at most 1023 bytes", v);
      return GN_EINVAL;
    }
    return 0;
  case KEY_RELAY:
    if (!parse_bool(v, &b)) {
      snprintf(err, cap, "relay must be on or off, not '%.60s'", v);
      return GN_EINVAL;
    }
    cfg->relay = b;
    return 0;
  case KEY_RELAY_SESSIONS: {
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, 10);
    if (errno || end == v || *end || !isdigit((unsigned char)v[0]) || n < 1 || n > 4096) {
      snprintf(err, cap, "relay_sessions must be a number from 1 to 4096, not '%.60s'", v);
      return GN_EINVAL;
    }
    cfg->relay_sessions = (uint32_t)n;
    return 0;
  }
  case KEY_RELAY_PAIR_RATE:
  case KEY_RELAY_TOTAL_RATE: {
    uint64_t n = 0;
    if (!parse_size(v, &n) || n < 1024 || n > (1ull << 40)) {
      snprintf(err, cap, "%s must be a size in bytes a second from 1K to 1T, not '%.60s'", name, v);
      return GN_EINVAL;
    }
    *(key == KEY_RELAY_PAIR_RATE ? &cfg->relay_pair_rate : &cfg->relay_total_rate) = n;
    return 0;
  }
  case KEY_TRAINING:
  case KEY_NO_TRAINING:
    if (!parse_bool(v, &b)) {
      snprintf(err, cap, "%s must be true or false, not '%.60s'", name, v);
      return GN_EINVAL;
    }
    cfg->training = (key == KEY_TRAINING) == b ? 1 : 0;
    return 0;
  case KEY_OVERLAY:
    if (!parse_bool(v, &b)) {
      snprintf(err, cap, "overlay must be on or off, not '%.60s'", v);
      return GN_EINVAL;
    }
    cfg->overlay = b;
    return 0;
  case KEY_METRICS_LISTEN:
  case KEY_DASHBOARD_LISTEN: {
    /* A bare port is loopback; an address must be a numeric IPv4 or
     * [IPv6] one, the port 1-65535. The dashboard's must be loopback. */
    char buf[64];
    if (strchr(v, ':') || strchr(v, '.') ? !copy_str(buf, sizeof(buf), v) : metrics_loopback(buf, v) < 0)
      goto bad_metrics;
    char *colon = strrchr(buf, ':');
    if (!colon || !valid_hostport(buf))
      goto bad_metrics;
    *colon = '\0';
    struct in6_addr a6;
    struct in_addr a4;
    size_t hl = strlen(buf);
    bool ok = inet_pton(AF_INET, buf, &a4) == 1;
    if (!ok && hl > 2 && buf[0] == '[' && buf[hl - 1] == ']') {
      buf[hl - 1] = '\0';
      ok = inet_pton(AF_INET6, buf + 1, &a6) == 1;
      buf[hl - 1] = ']';
    }
    *colon = ':';
    if (!ok)
      goto bad_metrics;
    if (key == KEY_DASHBOARD_LISTEN && !(buf[0] == '[' ? IN6_IS_ADDR_LOOPBACK(&a6) : (ntohl(a4.s_addr) >> 24) == 127)) {
      snprintf(err, cap,
               "dashboard_listen must be a loopback address (127.0.0.0/8 or [::1]), not '%.60s': to open the "
               "dashboard from another machine, use an SSH tunnel (docs/dashboard.md)",
               v);
      return GN_EINVAL;
    }
    memcpy(key == KEY_METRICS_LISTEN ? cfg->metrics_listen : cfg->dashboard_listen, buf, strlen(buf) + 1);
    return 0;
  bad_metrics:
    snprintf(err, cap, "%s must be PORT or IP:PORT (IPv6 as [IP]:PORT), not '%.60s'", name, v);
    return GN_EINVAL;
  }
  case KEY_JOBNET_PORTS: {
    char *end, *end2 = (char *)"";
    errno = 0;
    unsigned long lo = strtoul(v, &end, 10), hi = 0;
    if (!errno && end != v && *end == '-' && isdigit((unsigned char)end[1]))
      hi = strtoul(end + 1, &end2, 10);
    if (errno || !isdigit((unsigned char)v[0]) || *end != '-' || !hi || *end2 || lo < 1 || lo > hi || hi > 65535) {
      snprintf(err, cap, "bad jobnet_ports '%.60s': want LO-HI, UDP ports with 1 <= LO <= HI <= 65535", v);
      return GN_EINVAL;
    }
    cfg->jobnet_port_lo = (uint16_t)lo;
    cfg->jobnet_port_hi = (uint16_t)hi;
    return 0;
  }
  case KEY_LOG_LEVEL:
    if (strcmp(v, "debug") && strcmp(v, "info") && strcmp(v, "warn") && strcmp(v, "error")) {
      snprintf(err, cap, "bad log_level '%s' (known: debug, info, warn, error)", v);
      return GN_EINVAL;
    }
    copy_str(cfg->log_level, sizeof(cfg->log_level), v);
    return 0;
  case KEY_MAX_CONNECTIONS:
  case KEY_DIAL_RESERVE:
  case KEY_MAX_INBOUND_PER_IP:
  case KEY_MAX_INBOUND_PER_NET:
  case KEY_MAX_HANDSHAKING:
  case KEY_TRANSPORT_MEMORY:
  case KEY_HANDSHAKE_TIMEOUT:
  case KEY_IDLE_TIMEOUT:
  case KEY_PROGRESS_TIMEOUT:
  case KEY_SEND_STALL:
  case KEY_OVERLAY_SOURCE_RATE:
  case KEY_OVERLAY_RATE:
  case KEY_OFFER_TABLE_SIZE:
  case KEY_OFFERS_PER_PROVIDER:
  case KEY_GOSSIP_PEER_DIGESTS:
  case KEY_GOSSIP_PEER_WANTS:
  case KEY_GOSSIP_PEER_BYTES:
    return set_limit(cfg, key, v, err, cap);
  case KEY_COUNT:
    break;
  }
bad:
  snprintf(err, cap, "bad value for %s: '%.200s'", name, v);
  return GN_EINVAL;
bad_addr:
  snprintf(err, cap, "bad %s address '%.200s': want HOST:PORT", name, v);
  return GN_EINVAL;
}

/* Drops the list a repeatable key had, so the first flag replaces what the
 * file said rather than adding to it. */
static void cfg_clear_list(gn_config *cfg, cfg_key key) {
  if (key == KEY_BOOTSTRAP) {
    for (size_t i = 0; i < cfg->bootstrap_count; i++)
      free(cfg->bootstrap[i]);
    cfg->bootstrap_count = 0;
  } else if (key == KEY_SIMULATE_GPU) {
    for (size_t i = 0; i < cfg->simulate_count; i++)
      free(cfg->simulate_gpu[i]);
    cfg->simulate_count = 0;
  } else if (key == KEY_REGISTRY_ALLOW) {
    for (size_t i = 0; i < cfg->registry_allow_count; i++) {
      free(cfg->registry_allow[i]);
      cfg->registry_allow[i] = NULL;
    }
    cfg->registry_allow_count = 0;
  }
}

/* --- the file ----------------------------------------------------------------*/

static char *trim(char *s) {
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1]))
    s[--n] = '\0';
  return s;
}

int gn_config_load_file(gn_config *cfg, const char *path, bool missing_ok, char *err, size_t cap) {
  FILE *f = fopen(path, "re");
  if (!f) {
    int e = errno;
    if (e == ENOENT && missing_ok)
      return 0;
    snprintf(err, cap, "cannot read config file %s: %s", path, strerror(e));
    return -e;
  }
  gn_config tmp;
  int r = cfg_copy(&tmp, cfg);
  if (r < 0) {
    fclose(f);
    snprintf(err, cap, "out of memory");
    return r;
  }
  char line[CFG_MAX_LINE + 2];
  char msg[256];
  unsigned lineno = 0;
  while (fgets(line, sizeof(line), f)) {
    lineno++;
    if (lineno > CFG_MAX_LINES) {
      snprintf(err, cap, "%s: more than %d lines", path, CFG_MAX_LINES);
      r = GN_ETOOBIG;
      goto out;
    }
    size_t n = strlen(line);
    if (n == sizeof(line) - 1 && line[n - 1] != '\n') {
      snprintf(err, cap, "%s:%u: line longer than %d bytes", path, lineno, CFG_MAX_LINE);
      r = GN_ETOOBIG;
      goto out;
    }
    /* '#' starts a comment anywhere: no value needs one. */
    char *hash = strchr(line, '#');
    if (hash)
      *hash = '\0';
    char *s = trim(line);
    if (!*s)
      continue;
    char *eq = strchr(s, '=');
    if (!eq) {
      snprintf(err, cap, "%s:%u: expected `key = value`, got '%.100s'", path, lineno, s);
      r = GN_EINVAL;
      goto out;
    }
    *eq = '\0';
    char *k = trim(s), *v = trim(eq + 1);
    cfg_key key = KEY_COUNT;
    for (int i = 0; i < KEY_COUNT; i++)
      if (strcmp(k, cfg_keys[i].name) == 0)
        key = (cfg_key)i;
    if (key == KEY_COUNT) {
      snprintf(err, cap, "%s:%u: unknown key '%.100s'", path, lineno, k);
      r = GN_EINVAL;
      goto out;
    }
    r = cfg_set(&tmp, key, v, msg, sizeof(msg));
    if (r < 0) {
      snprintf(err, cap, "%s:%u: %s", path, lineno, r == GN_ENOMEM ? "out of memory" : msg);
      goto out;
    }
  }
  if (ferror(f)) {
    snprintf(err, cap, "cannot read config file %s: %s", path, strerror(errno));
    r = GN_EIO;
    goto out;
  }
  copy_str(tmp.config_path, sizeof(tmp.config_path), path);
  gn_config_done(cfg);
  *cfg = tmp;
  r = 0;
out:
  if (r < 0)
    gn_config_done(&tmp);
  fclose(f);
  return r;
}

/* --- the flags ---------------------------------------------------------------*/

static void build_longopts(struct option *o) {
  size_t n = 0;
  for (int i = 0; i < KEY_COUNT; i++)
    o[n++] = (struct option){cfg_keys[i].flag, cfg_keys[i].boolean ? no_argument : required_argument, NULL,
                             OPT_KEY_BASE + i};
  o[n++] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
  o[n++] = (struct option){"help", no_argument, NULL, 'h'};
  o[n++] = (struct option){"version", no_argument, NULL, OPT_VERSION};
  o[n] = (struct option){0};
}

/* One getopt pass. With early, applies only --data-dir and remembers
 * --config (the flags that decide which file to read). */
static int parse_pass(gn_config *cfg, int argc, char *const *argv, bool early, const char **ret_config, char *err,
                      size_t cap) {
  struct option longopts[KEY_COUNT + 4];
  build_longopts(longopts);
  bool cleared[KEY_COUNT] = {false};
  char msg[256];
  int c, r = 0;
  opterr = 0;
  optind = 0; /* GNU: full re-initialisation, so passes can repeat */
  /* '+': stop at the first non-option instead of permuting argv. */
  while ((c = getopt_long(argc, argv, "+:h", longopts, NULL)) != -1) {
    const char *opt = argv[optind - 1];
    if (c == 'h')
      return GN_CONFIG_HELP;
    if (c == OPT_VERSION)
      return GN_CONFIG_VERSION;
    if (c == '?') {
      snprintf(err, cap, "unknown option '%s' (see gpunetd --help)", opt);
      return GN_EINVAL;
    }
    if (c == ':') {
      snprintf(err, cap, "option '%s' needs a value", opt);
      return GN_EINVAL;
    }
    if (c == OPT_CONFIG) {
      if (ret_config)
        *ret_config = optarg;
      continue;
    }
    cfg_key key = (cfg_key)(c - OPT_KEY_BASE);
    if (early && key != KEY_DATA_DIR)
      continue;
    if (!cleared[key]) {
      cfg_clear_list(cfg, key);
      cleared[key] = true;
    }
    r = cfg_set(cfg, key, cfg_keys[key].boolean ? "true" : optarg, msg, sizeof(msg));
    if (r < 0) {
      snprintf(err, cap, "--%s: %s", cfg_keys[key].flag, r == GN_ENOMEM ? "out of memory" : msg);
      return r;
    }
  }
  if (optind < argc) {
    snprintf(err, cap, "unexpected argument '%s' (see gpunetd --help)", argv[optind]);
    return GN_EINVAL;
  }
  return 0;
}

int gn_config_parse_args(gn_config *cfg, int argc, char *const *argv, char *err, size_t cap) {
  return parse_pass(cfg, argc, argv, false, NULL, err, cap);
}

int gn_config_load(gn_config *cfg, int argc, char *const *argv, char *err, size_t cap) {
  gn_config_defaults(cfg);
  const char *explicit_path = NULL;
  int r = parse_pass(cfg, argc, argv, true, &explicit_path, err, cap);
  if (r != 0)
    return r;
  if (explicit_path) {
    r = gn_config_load_file(cfg, explicit_path, false, err, cap);
  } else {
    char path[PATH_MAX];
    if (gn_config_default_path(cfg->data_dir, path, sizeof(path)) == 0)
      r = gn_config_load_file(cfg, path, true, err, cap);
  }
  if (r < 0)
    return r;
  if (!cfg->data_dir[0]) {
    snprintf(err, cap, "no data directory: set HOME or XDG_DATA_HOME, or pass --data-dir");
    return GN_EINVAL;
  }
  r = gn_config_parse_args(cfg, argc, argv, err, cap);
  if (r == 0 && cfg->interval_min_s > cfg->interval_max_s) {
    snprintf(err, cap, "interval_min_s (%u) is above interval_max_s (%u)", cfg->interval_min_s, cfg->interval_max_s);
    return GN_EINVAL;
  }
  const gn_config_limits *l = &cfg->limits;
  if (r == 0 && l->dial_reserve >= l->max_connections) {
    snprintf(err, cap, "dial_reserve (%llu) must be below max_connections (%llu): accepted peers need room too",
             (unsigned long long)l->dial_reserve, (unsigned long long)l->max_connections);
    return GN_EINVAL;
  }
  if (r == 0 && l->max_inbound_per_net < l->max_inbound_per_ip) {
    snprintf(err, cap, "max_inbound_per_net (%llu) is below max_inbound_per_ip (%llu): a network holds its hosts",
             (unsigned long long)l->max_inbound_per_net, (unsigned long long)l->max_inbound_per_ip);
    return GN_EINVAL;
  }
  if (r == 0 && l->offer_table_size < l->offers_per_provider) {
    snprintf(err, cap, "offer_table_size (%llu) is below offers_per_provider (%llu)",
             (unsigned long long)l->offer_table_size, (unsigned long long)l->offers_per_provider);
    return GN_EINVAL;
  }
  if (r == 0 && strcmp(cfg->settle_driver, "webhook") == 0 && !cfg->settle_url[0]) {
    snprintf(err, cap, "settle_driver webhook needs settle_url (the endpoint settlements are POSTed to)");
    return GN_EINVAL;
  }
  return r;
}
