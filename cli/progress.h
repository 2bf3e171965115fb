/* Progress on long waits (issue 10 item 4): a bar on a terminal, plain lines
 * when stderr is not a terminal, JSON events (one object a line) in --json
 * mode. Everything goes to stderr, so stdout keeps only a command's result
 * (in --json mode the one JSON document a script parses). Nothing is shown
 * for a wait that ends within its first second.
 *
 * The JSON events: {"event":"progress","what":W,"label":L,"done":N,
 * "total":N|null,"unit":"bytes"|"items"|null,"rate":N|null,"elapsed_s":N,
 * "detail":S|null} while it runs (at most once a second, and whenever the
 * detail changes), then one {"event":"done"|"failed",...} with the same
 * fields. Depends on nothing but libc and jansson, so tests build it alone. */
#ifndef GN_CLI_PROGRESS_H
#define GN_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum cli_progress_mode {
  CLI_PROGRESS_AUTO = 0, /* bar if the stream is a terminal, else plain */
  CLI_PROGRESS_BAR,
  CLI_PROGRESS_PLAIN,
  CLI_PROGRESS_JSON,
  CLI_PROGRESS_OFF,
} cli_progress_mode;

typedef enum cli_progress_unit {
  CLI_PROGRESS_NONE = 0, /* a state that moves on ("waiting for offers"): no counts */
  CLI_PROGRESS_BYTES,    /* shown as KiB/MiB/GiB with a rate */
  CLI_PROGRESS_ITEMS,    /* shown as "3/8" */
} cli_progress_unit;

typedef struct cli_progress cli_progress;

/* The mode a command uses: --json -> JSON; otherwise GN_PROGRESS
 * (bar|plain|json|off) when set, else AUTO. */
cli_progress_mode cli_progress_mode_for(bool json);

/* Starts a wait named what ("pull", "attest", "offers", "gang", "cp"...),
 * shown to people as label. total 0: not known. Output goes to out (NULL:
 * stderr); now_ms NULL: the monotonic clock (tests pass their own). Returns
 * NULL only when out of memory; every function accepts NULL. */
cli_progress *cli_progress_start(cli_progress_mode mode, const char *what, const char *label, cli_progress_unit unit,
                                 uint64_t total, FILE *out, uint64_t (*now_ms)(void));
/* Where the wait stands: done out of total (total 0: unknown), detail a
 * short state for people ("waiting for 2 of 4 providers", may be NULL). */
void cli_progress_update(cli_progress *p, uint64_t done, uint64_t total, const char *detail);
/* Erases the bar (terminal mode) before other lines are printed on the
 * same terminal; the next update draws it again. */
void cli_progress_clear(cli_progress *p);
/* Ends the wait (ok: done, and done counts as total when one is known;
 * else failed) and frees p. The bar is replaced by
 * a final line; nothing is printed if nothing was shown yet, unless failed
 * in JSON mode (a script learns why a wait ended). */
void cli_progress_end(cli_progress *p, bool ok, const char *detail);

/* 1536 -> "1.5 KiB"; for the bar and for commands' own summaries. */
void cli_progress_fmt_bytes(uint64_t n, char *buf, size_t cap);

#endif
