/* Logging for the daemon: one timestamped line per message on stderr (library
 * code never logs; it returns codes and gpunetd decides what to say).
 *
 * Under systemd, stderr is a stream to the journal, which stamps each line
 * itself and reads a leading "<N>" as its syslog priority (sd-daemon.h's
 * SD_ERR... prefixes). systemd says so in JOURNAL_STREAM, "DEVICE:INODE" of
 * that stream (systemd.exec(5)): when the output's fd is still that stream
 * (not redirected by a child or a wrapper), lines are "<3>message" with no
 * timestamp; otherwise they are unchanged. Decided again on each
 * gn_log_set_output, and on the first line. */
#include <gpunet/node.h>
#include <gpunet/ratelimit.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

static enum gn_log_level g_level = GN_LOG_INFO;
static FILE *g_out;
static int g_journal = -1; /* -1: not decided yet */

static const char *const level_names[] = {"debug", "info", "warn", "error"};
/* LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR */
static const char *const level_prio[] = {"<7>", "<6>", "<4>", "<3>"};

static bool is_journal_stream(FILE *f) {
  const char *env = getenv("JOURNAL_STREAM");
  uintmax_t dev, ino;
  char end;
  struct stat st;
  if (!env || !f || sscanf(env, "%ju:%ju%c", &dev, &ino, &end) != 2)
    return false;
  int fd = fileno(f);
  return fd >= 0 && fstat(fd, &st) == 0 && (uintmax_t)st.st_dev == dev && (uintmax_t)st.st_ino == ino;
}

int gn_log_set_level(const char *name) {
  for (size_t i = 0; name && i < GN_ARRAY_SIZE(level_names); i++) {
    if (strcasecmp(name, level_names[i]) == 0) {
      g_level = (enum gn_log_level)i;
      return 0;
    }
  }
  return GN_EINVAL;
}

void gn_log_set_output(FILE *f) {
  g_out = f;
  g_journal = is_journal_stream(f ? f : stderr);
}

void gn_logv(enum gn_log_level level, const char *fmt, va_list ap) {
  if (level < g_level || level > GN_LOG_ERROR)
    return;
  FILE *out = g_out ? g_out : stderr;
  if (g_journal < 0)
    g_journal = is_journal_stream(out);
  /* Format the whole line first so concurrent writers do not interleave. */
  char line[2048];
  int n;
  if (g_journal) {
    n = snprintf(line, sizeof(line), "%s", level_prio[level]);
  } else {
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
    n = snprintf(line, sizeof(line), "%s %-5s ", ts, level_names[level]);
  }
  if (n < 0)
    return;
  vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
  fprintf(out, "%s\n", line);
  fflush(out);
}

void gn_log(enum gn_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gn_logv(level, fmt, ap);
  va_end(ap);
}

/* --- lines a peer can trigger ----------------------------------------------
 * One bucket per key (the call site's own string), GN_LOG_RL_KEYS keys at
 * most: a key beyond them shares the last slot. A line over its key's rate
 * is counted, not written; the next one written for that key says how many
 * were left out. */

#define GN_LOG_RL_KEYS 64

typedef struct rl_key {
  char key[48];
  gn_token_bucket b;
  uint64_t suppressed;
} rl_key;

static rl_key g_rl[GN_LOG_RL_KEYS];
static size_t g_nrl;
static const gn_rate g_rl_rate = GN_RATE_EVERY_S(6, GN_LOG_RL_BURST);

static rl_key *rl_find(const char *key, uint64_t now_ms) {
  for (size_t i = 0; i < g_nrl; i++)
    if (strncmp(g_rl[i].key, key, sizeof(g_rl[i].key) - 1) == 0)
      return &g_rl[i];
  if (g_nrl == GN_LOG_RL_KEYS)
    return &g_rl[GN_LOG_RL_KEYS - 1];
  rl_key *k = &g_rl[g_nrl++];
  snprintf(k->key, sizeof(k->key), "%s", key);
  gn_token_bucket_init(&k->b, g_rl_rate, now_ms);
  k->suppressed = 0;
  return k;
}

void gn_log_ratelimited_at(uint64_t now_ms, const char *key, enum gn_log_level level, const char *fmt, ...) {
  if (level < g_level || level > GN_LOG_ERROR || !key)
    return;
  rl_key *k = rl_find(key, now_ms);
  if (!gn_token_bucket_take(&k->b, g_rl_rate, 1, now_ms)) {
    k->suppressed++;
    return;
  }
  char msg[1800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (k->suppressed)
    gn_log(level, "%s (%llu similar lines suppressed)", msg, (unsigned long long)k->suppressed);
  else
    gn_log(level, "%s", msg);
  k->suppressed = 0;
}

void gn_log_ratelimited(const char *key, enum gn_log_level level, const char *fmt, ...) {
  char msg[1800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  gn_log_ratelimited_at(gn_mono_ms(), key, level, "%s", msg);
}
