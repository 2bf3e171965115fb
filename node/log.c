/* Logging for the daemon: one timestamped line per message on stderr (library
 * code never logs; it returns codes and gpunetd decides what to say). */
#include <gpunet/node.h>

#include <stdio.h>
#include <strings.h>
#include <time.h>

static enum gn_log_level g_level = GN_LOG_INFO;
static FILE *g_out;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

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
}

void gn_logv(enum gn_log_level level, const char *fmt, va_list ap) {
  if (level < g_level || level > GN_LOG_ERROR)
    return;
  char ts[32];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
  /* Format the whole line first so concurrent writers do not interleave. */
  char line[2048];
  int n = snprintf(line, sizeof(line), "%s %-5s ", ts, level_names[level]);
  if (n < 0)
    return;
  vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
  FILE *out = g_out ? g_out : stderr;
  fprintf(out, "%s\n", line);
  fflush(out);
}

void gn_log(enum gn_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gn_logv(level, fmt, ap);
  va_end(ap);
}
