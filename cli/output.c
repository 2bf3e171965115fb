/* Output helpers of the gpunet command: error lines, aligned tables, and the
 * human formats for money, durations, times and node ids. */
#include "cli.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cli_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gpunet: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return CLI_FAIL;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "gpunet %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see gpunet %s --help)\n", cmd);
  va_end(ap);
  return CLI_USAGE;
}

int cli_print_usage(const cli_cmd *cmd) {
  fputs(cmd->usage, stdout);
  return CLI_OK;
}

int cli_bad_option(const char *cmd, int o, char **argv) {
  extern int optind, optopt;
  const char *arg = argv[optind - 1];
  if (o == ':')
    return cli_usage_error(cmd, "option '%s' needs a value", arg);
  if (optopt && strncmp(arg, "--", 2) != 0)
    return cli_usage_error(cmd, "unknown option '-%c'", optopt);
  return cli_usage_error(cmd, "unknown option '%s'", arg);
}

/* Appends v to f as compact JSON, with its reals as cli_fmt_real writes them. */
static void human_value(FILE *f, const json_t *v) {
  if (json_is_real(v)) {
    char buf[64];
    cli_fmt_real(json_real_value(v), buf, sizeof(buf));
    fputs(buf, f);
  } else if (json_is_object(v)) {
    const char *key;
    const json_t *e;
    bool first = true;
    fputc('{', f);
    json_object_foreach((json_t *)v, key, e) {
      json_t *ks = json_string(key);
      char *k = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
      json_decref(ks);
      fprintf(f, "%s%s:", first ? "" : ",", k ? k : "?");
      free(k);
      human_value(f, e);
      first = false;
    }
    fputc('}', f);
  } else if (json_is_array(v)) {
    fputc('[', f);
    for (size_t i = 0; i < json_array_size(v); i++) {
      if (i)
        fputc(',', f);
      human_value(f, json_array_get(v, i));
    }
    fputc(']', f);
  } else {
    char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    fputs(d ? d : "?", f);
    free(d);
  }
}

/* v as compact JSON for people (reals rounded). Caller frees. */
static char *human_dump(const json_t *v) {
  char *s = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&s, &n);
  if (!f)
    return NULL;
  human_value(f, v);
  fclose(f);
  return s;
}

void cli_print_fields(const json_t *o) {
  const char *key;
  const json_t *v;
  size_t w = 0;
  json_object_foreach((json_t *)o, key, v) {
    if (strlen(key) > w)
      w = strlen(key);
  }
  json_object_foreach((json_t *)o, key, v) {
    size_t kl = strlen(key);
    char buf[128];
    const char *text = buf;
    char *dumped = NULL;
    /* "total_micro" next to "total", "price_uper_hour" next to "price". */
    if (kl > 6 && kl - 6 < sizeof(buf) && strcmp(key + kl - 6, "_micro") == 0) {
      memcpy(buf, key, kl - 6);
      buf[kl - 6] = '\0';
      if (json_object_get(o, buf))
        continue;
    }
    if (strcmp(key, "price_uper_hour") == 0 && json_object_get(o, "price"))
      continue;
    if (json_is_string(v)) {
      text = json_string_value(v);
    } else if (json_is_null(v)) {
      text = "-";
    } else if (json_is_boolean(v)) {
      text = json_is_true(v) ? "yes" : "no";
    } else if (json_is_integer(v) && kl > 2 && strcmp(key + kl - 2, "_s") == 0 && json_integer_value(v) > 1000000000) {
      cli_fmt_time(json_integer_value(v), buf, sizeof(buf));
    } else if (json_is_integer(v) && strcmp(key, "seconds") == 0) {
      char d[32];
      cli_fmt_duration(json_integer_value(v), d, sizeof(d));
      snprintf(buf, sizeof(buf), "%lld (%s)", (long long)json_integer_value(v), d);
    } else if (json_is_real(v)) {
      cli_fmt_real(json_real_value(v), buf, sizeof(buf));
    } else {
      dumped = human_dump(v);
      text = dumped ? dumped : "?";
    }
    printf("%s:%*s %s\n", key, (int)(w - kl), "", text);
    free(dumped);
  }
}

int cli_print_json(const json_t *j) {
  json_dumpf(j, stdout, JSON_INDENT(2) | JSON_ENCODE_ANY);
  fputc('\n', stdout);
  return CLI_OK;
}

int cli_print_json_new(json_t *j) {
  cli_print_json(j);
  json_decref(j);
  return CLI_OK;
}

/* --- tables ------------------------------------------------------------------*/

struct cli_table {
  size_t ncols, nrows, cap;
  char **cells; /* header row first, row-major */
};

cli_table *cli_table_new(size_t ncols, const char *const *headers) {
  cli_table *t = calloc(1, sizeof(*t));
  if (!t)
    return NULL;
  t->ncols = ncols;
  cli_table_row(t, headers);
  return t;
}

void cli_table_row(cli_table *t, const char *const *cells) {
  if (!t)
    return;
  if (t->nrows == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    char **p = realloc(t->cells, cap * t->ncols * sizeof(*p));
    if (!p)
      return;
    t->cells = p;
    t->cap = cap;
  }
  for (size_t i = 0; i < t->ncols; i++)
    t->cells[t->nrows * t->ncols + i] = strdup(cells[i] ? cells[i] : "-");
  t->nrows++;
}

/* Display width in terminal columns: UTF-8 continuation bytes take none. */
static size_t text_width(const char *s) {
  size_t w = 0;
  for (; s && *s; s++)
    if (((unsigned char)*s & 0xc0) != 0x80)
      w++;
  return w;
}

void cli_table_print(cli_table *t) {
  if (!t)
    return;
  size_t *width = calloc(t->ncols, sizeof(*width));
  for (size_t r = 0; width && r < t->nrows; r++)
    for (size_t i = 0; i < t->ncols; i++) {
      size_t w = text_width(t->cells[r * t->ncols + i]);
      if (w > width[i])
        width[i] = w;
    }
  for (size_t r = 0; width && r < t->nrows; r++) {
    for (size_t i = 0; i < t->ncols; i++) {
      const char *s = t->cells[r * t->ncols + i];
      fputs(s ? s : "", stdout);
      if (i + 1 < t->ncols)
        for (size_t pad = text_width(s); pad < width[i] + 2; pad++)
          fputc(' ', stdout);
    }
    fputc('\n', stdout);
  }
  for (size_t k = 0; k < t->nrows * t->ncols; k++)
    free(t->cells[k]);
  free(t->cells);
  free(width);
  free(t);
}

/* --- JSON fields -------------------------------------------------------------*/

const char *cli_str(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

int64_t cli_int(const json_t *o, const char *key, int64_t dflt) {
  const json_t *v = json_object_get(o, key);
  if (json_is_integer(v))
    return json_integer_value(v);
  if (json_is_real(v))
    return (int64_t)json_real_value(v);
  return dflt;
}

bool cli_has_int(const json_t *o, const char *key) {
  return json_is_number(json_object_get(o, key));
}

bool cli_bool(const json_t *o, const char *key) {
  return json_is_true(json_object_get(o, key));
}

/* --- formats -----------------------------------------------------------------*/

void cli_fmt_money(uint64_t micro, const char *currency, char *buf, size_t cap) {
  char frac[8];
  snprintf(frac, sizeof(frac), "%06llu", (unsigned long long)(micro % 1000000u));
  size_t n = strlen(frac);
  while (n > 2 && frac[n - 1] == '0')
    frac[--n] = '\0';
  snprintf(buf, cap, "%llu.%s %s", (unsigned long long)(micro / 1000000u), frac,
           currency && currency[0] ? currency : "EUR");
}

void cli_fmt_real(double v, char *buf, size_t cap) {
  if (v != v || v - v != 0) /* NaN or infinite */
    snprintf(buf, cap, "%s", v != v ? "nan" : v > 0 ? "inf" : "-inf");
  else if (fabs(v) >= 1e4 && fabs(v) < 1e15)
    snprintf(buf, cap, "%.0f", v);
  else
    snprintf(buf, cap, "%.4g", v);
}

void cli_fmt_price(uint64_t micro, const char *currency, char *buf, size_t cap) {
  char m[64];
  cli_fmt_money(micro, currency, m, sizeof(m));
  snprintf(buf, cap, "%s/h", m);
}

void cli_fmt_duration(int64_t s, char *buf, size_t cap) {
  if (s < 0)
    s = 0;
  if (s < 60)
    snprintf(buf, cap, "%llds", (long long)s);
  else if (s < 3600)
    snprintf(buf, cap, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else if (s < 86400)
    snprintf(buf, cap, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else
    snprintf(buf, cap, "%lldd%02lldh", (long long)(s / 86400), (long long)(s % 86400 / 3600));
}

void cli_fmt_time(int64_t unix_s, char *buf, size_t cap) {
  if (unix_s <= 0) {
    snprintf(buf, cap, "-");
    return;
  }
  time_t t = (time_t)unix_s;
  struct tm tm;
  if (!localtime_r(&t, &tm) || strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm) == 0)
    snprintf(buf, cap, "%lld", (long long)unix_s);
}

void cli_fmt_node(const char *node_id, char *buf, size_t cap) {
  if (!node_id) {
    snprintf(buf, cap, "-");
    return;
  }
  if (strlen(node_id) <= 14)
    snprintf(buf, cap, "%s", node_id);
  else
    snprintf(buf, cap, "%.12s\xe2\x80\xa6", node_id); /* "…" */
}

uint64_t cli_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
