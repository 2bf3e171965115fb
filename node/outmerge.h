/* A job's stdout and stderr come on two streams and go into one log. Read
 * as they come, a line on one stream can be cut in two by what the other
 * printed in between ("...No space left on devicerefused=1034"). Each stream
 * here holds the unfinished end of its last read until its line ends (a
 * '\n' or a '\r', the latter for progress bars), the stream ends, it has
 * waited GN_OUT_HOLD_MS (the daemon's tick flushes it), or it reaches
 * GN_OUT_PARTIAL_MAX bytes: lines of the two streams go into the log whole.
 * Depends on nothing of the node. */
#ifndef GPUNET_NODE_OUTMERGE_H
#define GPUNET_NODE_OUTMERGE_H

#include <stddef.h>
#include <stdint.h>

#define GN_OUT_PARTIAL_MAX 4096
#define GN_OUT_HOLD_MS 200

typedef struct {
  uint8_t buf[GN_OUT_PARTIAL_MAX];
  size_t len;
  uint64_t since_ms; /* when the oldest held byte arrived */
} gn_out_partial;

/* Receives bytes for the log, in order; may be called more than once per
 * take. */
typedef void (*gn_out_emit)(void *ctx, const uint8_t *data, size_t len);

/* Takes len bytes read from one stream: what ends a line goes to emit
 * (the held bytes first), the rest is held. */
void gn__out_take(gn_out_partial *p, const uint8_t *data, size_t len, uint64_t now_ms, gn_out_emit emit, void *ctx);

/* Emits what is held if it has waited GN_OUT_HOLD_MS by now_ms, or always
 * when force (the stream ended). */
void gn__out_flush(gn_out_partial *p, uint64_t now_ms, int force, gn_out_emit emit, void *ctx);

#endif
