/* Shared pieces of the gpunet command: the command table entry, the HTTP
 * client for gpunetd's control socket and the output helpers. */
#ifndef GN_CLI_H
#define GN_CLI_H

#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_CLI_VERSION "0.1.0"

/* Exit codes. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

typedef struct cli {
  char data_dir[PATH_MAX];
  char sock[PATH_MAX + 16];
  bool json;  /* print the daemon's JSON instead of tables */
  bool quiet; /* cli_call failures return CLI_FAIL without a message */
} cli;

/* A command's getopt_long options, which it parses with. main.c reads from
 * them which options take a value, so that a value (`--image --json`) is
 * never taken for a global option. */
typedef struct cli_opts {
  const char *shorts;
  const struct option *longs;
} cli_opts;

typedef struct cli_cmd {
  const char *name;
  int (*fn)(cli *c, int argc, char **argv); /* argv[0] is the command name */
  const char *help;                         /* one line for `gpunet help` */
  const char *usage;                        /* full text for COMMAND --help */
  const cli_opts *opts;                     /* NULL: only --help (cli_simple_args) */
} cli_cmd;

/* --- errors (cli/output.c) --------------------------------------------------*/

/* "gpunet: <message>" on stderr; returns CLI_FAIL. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "gpunet CMD: <message>" and a pointer to --help on stderr; returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints cmd's usage to stdout; returns CLI_OK. */
int cli_print_usage(const cli_cmd *cmd);
/* The getopt_long error for option character o (':' or '?'); CLI_USAGE. */
int cli_bad_option(const char *cmd, int o, char **argv);
/* Prints an object as aligned "key: value" lines (times and durations made
 * readable, micro-unit fields skipped when a readable twin exists). */
void cli_print_fields(const json_t *o);
const cli_cmd *cli_find_cmd(const char *name);

/* --- talking to gpunetd (cli/http.c) -----------------------------------------*/

/* Sends a request (body stolen, may be NULL) and returns the parsed JSON
 * answer of a 2xx response in *ret. On any failure prints the reason
 * ("cannot reach gpunetd...", the daemon's {"error"} message) and returns
 * CLI_FAIL. */
int cli_call(cli *c, const char *method, const char *path, json_t *body, json_t **ret);
typedef struct cli_progress cli_progress;
/* cli_call showing p's progress (cli/progress.h; may be NULL) while the
 * daemon has not answered: for requests that wait on peers. */
int cli_call_waiting(cli *c, const char *method, const char *path, json_t *body, json_t **ret, cli_progress *p);
/* The same, returning the raw bytes of the answer (NUL-terminated; *ret_len
 * excludes the NUL). Caller frees. */
int cli_call_raw(cli *c, const char *method, const char *path, json_t *body, char **ret, size_t *ret_len);
/* Sends len bytes as an application/octet-stream body (gpunet cp's
 * chunks) and returns the raw answer like cli_call_raw. */
int cli_call_bytes(cli *c, const char *method, const char *path, const void *body, size_t len, char **ret,
                   size_t *ret_len);
/* Percent-encodes s for a URL query or path segment. Caller frees. */
char *cli_urlencode(const char *s);

/* --- output (cli/output.c) ---------------------------------------------------*/

/* Pretty-prints j to stdout. Returns CLI_OK. */
int cli_print_json(const json_t *j);
/* The same for a value built to be printed: drops the reference to j. */
int cli_print_json_new(json_t *j);

typedef struct cli_table cli_table;
cli_table *cli_table_new(size_t ncols, const char *const *headers);
/* Adds a row of ncols strings (copied; NULL prints "-"). */
void cli_table_row(cli_table *t, const char *const *cells);
/* Prints with aligned columns and frees the table. */
void cli_table_print(cli_table *t);

/* Accessors that tolerate missing or mistyped fields (a newer daemon). */
const char *cli_str(const json_t *o, const char *key); /* NULL if absent */
int64_t cli_int(const json_t *o, const char *key, int64_t dflt);
bool cli_has_int(const json_t *o, const char *key);
bool cli_bool(const json_t *o, const char *key);

/* 400000 micro, "EUR" -> "0.40 EUR" (at least two decimals, no trailing
 * zeros after them). */
void cli_fmt_money(uint64_t micro, const char *currency, char *buf, size_t cap);
/* A measured figure for people: four significant digits (0.016799999 ->
 * "0.0168", 3.14159 -> "3.142"), whole numbers from 10000 up ("123457"). */
void cli_fmt_real(double v, char *buf, size_t cap);
/* -> "0.40 EUR/h". */
void cli_fmt_price(uint64_t micro, const char *currency, char *buf, size_t cap);
/* 3725 -> "1h02m"; 45 -> "45s"; 200 -> "3m20s"; 90000 -> "1d01h". */
void cli_fmt_duration(int64_t seconds, char *buf, size_t cap);
/* The monotonic clock in milliseconds, for waits and rates. */
uint64_t cli_mono_ms(void);
/* UTC Unix seconds -> local "YYYY-MM-DD HH:MM:SS" ("-" for 0). */
void cli_fmt_time(int64_t unix_s, char *buf, size_t cap);
/* A node id shortened for tables: "gnabcdefghij…". */
void cli_fmt_node(const char *node_id, char *buf, size_t cap);

/* --- files (cli/fileio.c) ----------------------------------------------------*/

/* Writes len bytes to path with mode, atomically: a new temporary file
 * beside it (mkstemp), fsync, rename over path. 0 or -errno (nothing left
 * behind on failure). */
int cli_write_atomic(const char *path, const void *data, size_t len, unsigned mode);

/* --- the common command skeleton (cli/list.c) --------------------------------*/

/* Parses a command that takes only --help and exactly nargs positionals
 * (what names the missing ones); returns -1 to go on or an exit code. */
int cli_simple_args(int argc, char **argv, int nargs, const char *what);
/* After getopt: checks that exactly nargs positionals follow optind (the
 * same messages); returns -1 to go on or CLI_USAGE. */
int cli_want_args(int argc, char **argv, int nargs, const char *what);
/* Checks an id the user typed (a job, lease, offer or invoice, named by
 * what) against the id grammar of gn_id_valid before any request: returns -1
 * to go on, or prints a usage error and returns CLI_USAGE. */
int cli_check_id(const char *cmd, const char *what, const char *id);
/* The same for a --env entry: NAME=VALUE with NAME [A-Za-z_][A-Za-z0-9_]*. */
int cli_check_env(const char *cmd, const char *entry);
/* A memory size for --memory (run, train): digits and an optional K, M, G or
 * T (powers of 1024, optionally followed by "iB" or "B"); plain digits are
 * MiB. It must be a whole number of MiB. Returns false on anything else. A
 * huge number is not an error here: it saturates, and the range check
 * (CLI_MEMORY_MIB_MIN..MAX, what gpunetd accepts) names it. In cmd_jobs.c. */
#define CLI_MEMORY_MIB_MIN 16u
#define CLI_MEMORY_MIB_MAX (1u << 20) /* 1 TiB */
bool cli_parse_memory_mib(const char *v, uint64_t *ret);
/* prefix + "/" + urlencoded id + suffix ("/v1/jobs", id, "/logs"). Caller
 * frees; NULL when out of memory. */
char *cli_path(const char *prefix, const char *id, const char *suffix);

/* Prints the answer j of a request for humans; ctx as passed to cli_show. */
typedef void (*cli_show_fn)(const json_t *j, const void *ctx);
/* cli_call (body stolen), then the answer as JSON with --json, else show(j,
 * ctx). Returns CLI_OK or cli_call's failure. */
int cli_show(cli *c, const char *method, const char *path, json_t *body, cli_show_fn show, const void *ctx);
/* cli_show for a request that waits on peers: progress named what ("lease",
 * "attest"), shown to people as label, while the daemon has not answered. */
int cli_show_waiting(cli *c, const char *method, const char *path, json_t *body, cli_show_fn show, const void *ctx,
                     const char *what, const char *label);

/* What differs between the list commands (jobs, leases, offers...). */
typedef struct cli_list_spec {
  const char *key;   /* the array in the answer: "jobs" */
  const char *empty; /* the line printed when it is empty */
  size_t ncols;
  const char *const *headers;
  /* Adds the row of item (the i-th) to t. */
  void (*row)(cli_table *t, const json_t *item, size_t i);
} cli_list_spec;
/* GETs path and prints the answer as JSON with --json, else spec's empty
 * line or a table of the array under spec->key. */
int cli_list(cli *c, const char *path, const cli_list_spec *spec);

/* --- commands (one file per group) --------------------------------------------*/

int cmd_init(cli *c, int argc, char **argv);
int cmd_id(cli *c, int argc, char **argv);
int cmd_status(cli *c, int argc, char **argv);
int cmd_gpus(cli *c, int argc, char **argv);
int cmd_peers(cli *c, int argc, char **argv);
int cmd_attest(cli *c, int argc, char **argv);
int cmd_offers(cli *c, int argc, char **argv);
int cmd_rent(cli *c, int argc, char **argv);
int cmd_leases(cli *c, int argc, char **argv);
int cmd_release(cli *c, int argc, char **argv);
int cmd_run(cli *c, int argc, char **argv);
int cmd_jobs(cli *c, int argc, char **argv);
int cmd_logs(cli *c, int argc, char **argv);
int cmd_stop(cli *c, int argc, char **argv);
int cmd_exec(cli *c, int argc, char **argv);
int cmd_shell(cli *c, int argc, char **argv);
extern const cli_opts cli_exec_opts, cli_shell_opts;
int cmd_invoices(cli *c, int argc, char **argv);
int cmd_invoice(cli *c, int argc, char **argv);
int cmd_balance(cli *c, int argc, char **argv);
int cmd_members(cli *c, int argc, char **argv);
/* The options of the commands that take more than --help. */
extern const cli_opts cli_init_opts, cli_offers_opts, cli_rent_opts, cli_run_opts, cli_train_opts, cli_output_opts,
    cli_logs_opts, cli_invoice_opts, cli_balance_opts, cli_members_opts;

/* cli/conf.c: mkdir -p (0700 for what it creates), and the default config
 * file of `gpunet init`, written atomically with mode 0600. -errno on error. */
int cli_mkdirs(const char *dir);
int cli_write_default_config(const char *path);
/* cli/systemd.c: `gpunet init --systemd`, gpunetd's unit in unit_dir (gpunetd:
 * NULL for the one next to this gpunet; force: replace a different unit). */
int cli_init_systemd(cli *c, const char *unit_dir, const char *gpunetd, bool force);

/* Shared by `run -f` and `logs -f`: streams a job's output from offset 0 and
 * returns the job's exit code (or CLI_FAIL). */
int cli_follow_logs(cli *c, const char *job_id, bool follow);

#endif
