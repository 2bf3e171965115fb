/* Progress on long waits: a bar, plain lines or JSON events (progress.h). */
#include "progress.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define SHOW_AFTER_MS 1000u  /* a wait shorter than this shows nothing */
#define BAR_EVERY_MS 100u    /* the bar is redrawn at most this often */
#define PLAIN_EVERY_MS 5000u /* a plain line at most this often (and on a new detail) */
#define JSON_EVERY_MS 1000u
#define RATE_WINDOW_MS 3000u /* the rate is measured over about this long */
#define BAR_CELLS 24

struct cli_progress {
  cli_progress_mode mode;
  cli_progress_unit unit;
  FILE *out;
  uint64_t (*now_ms)(void);
  char what[32];
  char label[96];
  char detail[160];
  uint64_t done, total;
  uint64_t start_ms, last_ms;
  bool shown;
  bool detail_changed;
  /* the rate: bytes between the window's start and now */
  uint64_t win_ms, win_done, prev_win_ms, prev_win_done;
  unsigned spin;
};

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

cli_progress_mode cli_progress_mode_for(bool json) {
  if (json)
    return CLI_PROGRESS_JSON;
  const char *e = getenv("GN_PROGRESS");
  if (!e || !*e)
    return CLI_PROGRESS_AUTO;
  if (strcmp(e, "bar") == 0)
    return CLI_PROGRESS_BAR;
  if (strcmp(e, "plain") == 0)
    return CLI_PROGRESS_PLAIN;
  if (strcmp(e, "json") == 0)
    return CLI_PROGRESS_JSON;
  if (strcmp(e, "off") == 0)
    return CLI_PROGRESS_OFF;
  return CLI_PROGRESS_AUTO;
}

static void copy_str(char *dst, size_t cap, const char *src) {
  snprintf(dst, cap, "%s", src ? src : "");
}

cli_progress *cli_progress_start(cli_progress_mode mode, const char *what, const char *label, cli_progress_unit unit,
                                 uint64_t total, FILE *out, uint64_t (*now_ms)(void)) {
  cli_progress *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->out = out ? out : stderr;
  if (mode == CLI_PROGRESS_AUTO)
    mode = isatty(fileno(p->out)) ? CLI_PROGRESS_BAR : CLI_PROGRESS_PLAIN;
  p->mode = mode;
  p->unit = unit;
  p->now_ms = now_ms ? now_ms : mono_ms;
  copy_str(p->what, sizeof p->what, what);
  copy_str(p->label, sizeof p->label, label ? label : what);
  p->total = total;
  p->start_ms = p->now_ms();
  p->win_ms = p->prev_win_ms = p->start_ms;
  return p;
}

void cli_progress_fmt_bytes(uint64_t n, char *buf, size_t cap) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (n < 1024) {
    snprintf(buf, cap, "%llu B", (unsigned long long)n);
    return;
  }
  double v = (double)n;
  unsigned u = 0;
  while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, cap, v < 10.0 ? "%.2f %s" : v < 100.0 ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void fmt_count(const cli_progress *p, uint64_t n, char *buf, size_t cap) {
  if (p->unit == CLI_PROGRESS_BYTES)
    cli_progress_fmt_bytes(n, buf, cap);
  else
    snprintf(buf, cap, "%llu", (unsigned long long)n);
}

static void fmt_secs(uint64_t ms, char *buf, size_t cap) {
  uint64_t s = ms / 1000u;
  if (s < 60)
    snprintf(buf, cap, "%.1fs", (double)ms / 1000.0);
  else if (s < 3600)
    snprintf(buf, cap, "%llum%02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
  else
    snprintf(buf, cap, "%lluh%02llum", (unsigned long long)(s / 3600), (unsigned long long)(s / 60 % 60));
}

/* Units a second over the last few seconds (from the start until then);
 * negative when not known yet. */
static double rate_of(const cli_progress *p, uint64_t now) {
  uint64_t from_ms = p->prev_win_ms, from_done = p->prev_win_done;
  if (now <= from_ms + 200u || p->done < from_done)
    return -1.0;
  return (double)(p->done - from_done) * 1000.0 / (double)(now - from_ms);
}

static void roll_window(cli_progress *p, uint64_t now) {
  if (now - p->win_ms >= RATE_WINDOW_MS) {
    p->prev_win_ms = p->win_ms;
    p->prev_win_done = p->win_done;
    p->win_ms = now;
    p->win_done = p->done;
  }
}

/* "45% 12.3 MiB of 27.0 MiB, 4.50 MiB/s, 3.2s left" or the parts known. */
static void fmt_status(const cli_progress *p, uint64_t now, bool with_eta, char *buf, size_t cap) {
  char a[32], b[32], r[48] = "", eta[48] = "";
  size_t len = 0;
  buf[0] = '\0';
  if (p->unit == CLI_PROGRESS_NONE || (p->unit == CLI_PROGRESS_ITEMS && !p->total)) {
    fmt_secs(now - p->start_ms, a, sizeof a);
    snprintf(buf, cap, "%s", a);
    return;
  }
  fmt_count(p, p->done, a, sizeof a);
  double rate = rate_of(p, now);
  if (rate >= 0 && p->unit == CLI_PROGRESS_BYTES) {
    char rb[32];
    cli_progress_fmt_bytes((uint64_t)rate, rb, sizeof rb);
    snprintf(r, sizeof r, ", %s/s", rb);
  }
  if (p->total) {
    fmt_count(p, p->total, b, sizeof b);
    unsigned pct = p->done >= p->total ? 100u : (unsigned)(p->done * 100u / p->total);
    if (with_eta && p->unit == CLI_PROGRESS_BYTES && rate > 0 && p->done < p->total) {
      char t[24];
      fmt_secs((uint64_t)((double)(p->total - p->done) / rate * 1000.0), t, sizeof t);
      snprintf(eta, sizeof eta, ", %s left", t);
    }
    if (p->unit == CLI_PROGRESS_ITEMS)
      len = (size_t)snprintf(buf, cap, "%s/%s", a, b);
    else
      len = (size_t)snprintf(buf, cap, "%3u%% %s of %s", pct, a, b);
  } else {
    len = (size_t)snprintf(buf, cap, "%s", a);
  }
  if (len < cap)
    snprintf(buf + len, cap - len, "%s%s", r, eta);
}

static unsigned term_width(FILE *out) {
  struct winsize ws;
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
    return ws.ws_col;
  return 80;
}

static void draw_bar(cli_progress *p, uint64_t now) {
  static const char spin[] = "|/-\\";
  char st[160], bar[BAR_CELLS + 3], line[512];
  fmt_status(p, now, true, st, sizeof st);
  if (p->total && p->unit != CLI_PROGRESS_NONE) {
    unsigned fill = p->done >= p->total ? BAR_CELLS : (unsigned)(p->done * BAR_CELLS / p->total);
    bar[0] = '[';
    for (unsigned i = 0; i < BAR_CELLS; i++)
      bar[1 + i] = i < fill ? '#' : '-';
    bar[BAR_CELLS + 1] = ']';
    bar[BAR_CELLS + 2] = '\0';
  } else {
    bar[0] = spin[p->spin++ % 4];
    bar[1] = '\0';
  }
  int n = snprintf(line, sizeof line, "%s %s %s%s%s", p->label, bar, st, p->detail[0] ? "  " : "", p->detail);
  unsigned w = term_width(p->out) - 1;
  if (n > 0 && (unsigned)n > w)
    line[w] = '\0';
  fprintf(p->out, "\r\033[K%s", line);
  fflush(p->out);
}

static void emit_json(cli_progress *p, const char *event, uint64_t now) {
  /* while it runs, the rate of the last few seconds; at the end, the
   * average of the whole wait */
  double rate = strcmp(event, "progress") == 0 ? rate_of(p, now)
                : now > p->start_ms            ? (double)p->done * 1000.0 / (double)(now - p->start_ms)
                                               : -1.0;
  json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:f}", "event", event, "what", p->what, "label", p->label, "done",
                        (json_int_t)p->done, "elapsed_s", (double)(now - p->start_ms) / 1000.0);
  if (!o)
    return;
  json_object_set_new(o, "total", p->total ? json_integer((json_int_t)p->total) : json_null());
  json_object_set_new(o, "unit",
                      p->unit == CLI_PROGRESS_BYTES   ? json_string("bytes")
                      : p->unit == CLI_PROGRESS_ITEMS ? json_string("items")
                                                      : json_null());
  json_object_set_new(o, "rate", rate >= 0 && p->unit != CLI_PROGRESS_NONE ? json_real(rate) : json_null());
  json_object_set_new(o, "detail", p->detail[0] ? json_string(p->detail) : json_null());
  char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(7));
  json_decref(o);
  if (s) {
    fprintf(p->out, "%s\n", s);
    fflush(p->out);
    free(s);
  }
}

static void emit_plain(cli_progress *p, uint64_t now) {
  char st[160];
  fmt_status(p, now, false, st, sizeof st);
  fprintf(p->out, "%s: %s%s%s\n", p->label, st, p->detail[0] ? ", " : "", p->detail);
  fflush(p->out);
}

void cli_progress_update(cli_progress *p, uint64_t done, uint64_t total, const char *detail) {
  if (!p)
    return;
  uint64_t now = p->now_ms();
  p->done = done;
  if (total)
    p->total = total;
  if (detail && strncmp(detail, p->detail, sizeof p->detail - 1) != 0) {
    copy_str(p->detail, sizeof p->detail, detail);
    p->detail_changed = true;
  }
  roll_window(p, now);
  if (p->mode == CLI_PROGRESS_OFF || now - p->start_ms < SHOW_AFTER_MS)
    return;
  uint64_t every = p->mode == CLI_PROGRESS_BAR     ? BAR_EVERY_MS
                   : p->mode == CLI_PROGRESS_PLAIN ? PLAIN_EVERY_MS
                                                   : JSON_EVERY_MS;
  bool due = !p->shown || now - p->last_ms >= every || (p->mode != CLI_PROGRESS_BAR && p->detail_changed);
  if (!due)
    return;
  if (p->mode == CLI_PROGRESS_BAR)
    draw_bar(p, now);
  else if (p->mode == CLI_PROGRESS_PLAIN)
    emit_plain(p, now);
  else
    emit_json(p, "progress", now);
  p->shown = true;
  p->last_ms = now;
  p->detail_changed = false;
}

void cli_progress_clear(cli_progress *p) {
  if (!p || p->mode != CLI_PROGRESS_BAR || !p->shown)
    return;
  fputs("\r\033[K", p->out);
  fflush(p->out);
  p->last_ms = 0; /* drawn again at the next update */
}

void cli_progress_end(cli_progress *p, bool ok, const char *detail) {
  if (!p)
    return;
  uint64_t now = p->now_ms();
  if (detail)
    copy_str(p->detail, sizeof p->detail, detail);
  if (ok && p->total && p->unit != CLI_PROGRESS_NONE)
    p->done = p->total; /* a wait that ended well did all it had to */
  if (p->mode == CLI_PROGRESS_JSON && (p->shown || !ok)) {
    emit_json(p, ok ? "done" : "failed", now);
  } else if (p->shown && (p->mode == CLI_PROGRESS_BAR || p->mode == CLI_PROGRESS_PLAIN)) {
    char t[24], a[32] = "", r[48] = "";
    fmt_secs(now - p->start_ms, t, sizeof t);
    if (p->unit != CLI_PROGRESS_NONE) {
      fmt_count(p, p->done, a, sizeof a);
      if (p->unit == CLI_PROGRESS_ITEMS && p->total) {
        size_t l = strlen(a);
        snprintf(a + l, sizeof a - l, "/%llu", (unsigned long long)p->total);
      }
      if (p->unit == CLI_PROGRESS_BYTES && now > p->start_ms) {
        char rb[32];
        cli_progress_fmt_bytes((uint64_t)((double)p->done * 1000.0 / (double)(now - p->start_ms)), rb, sizeof rb);
        snprintf(r, sizeof r, ", %s/s", rb);
      }
    }
    fprintf(p->out, "%s%s: %s after %s%s%s%s%s%s%s\n", p->mode == CLI_PROGRESS_BAR ? "\r\033[K" : "", p->label,
            ok ? "done" : "failed", t, a[0] ? " (" : "", a, r, a[0] ? ")" : "", p->detail[0] ? ": " : "", p->detail);
    fflush(p->out);
  }
  free(p);
}
