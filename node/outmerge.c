#include "outmerge.h"

#include <gpunet/base.h>
#include <string.h>

static void out_emit_held(gn_out_partial *p, gn_out_emit emit, void *ctx) {
  if (p->len) {
    size_t len = p->len;
    p->len = 0; /* before the call: emit may not come back here, but a flush from it must find nothing */
    emit(ctx, p->buf, len);
  }
}

void gn__out_take(gn_out_partial *p, const uint8_t *data, size_t len, uint64_t now_ms, gn_out_emit emit, void *ctx) {
  if (len == 0)
    return;
  size_t whole = len; /* data[0..whole) ends a line */
  while (whole > 0 && data[whole - 1] != '\n' && data[whole - 1] != '\r')
    whole--;
  if (whole > 0) {
    out_emit_held(p, emit, ctx);
    emit(ctx, data, whole);
  }
  size_t rest = len - whole;
  if (rest == 0)
    return;
  if (p->len + rest > sizeof p->buf) {
    /* A line longer than the hold: it goes as it is (the other stream may
     * come in between, as it could before). */
    out_emit_held(p, emit, ctx);
    if (rest > sizeof p->buf) {
      emit(ctx, data + whole, rest);
      return;
    }
  }
  if (p->len == 0)
    p->since_ms = now_ms;
  memcpy(p->buf + p->len, data + whole, rest);
  p->len += rest;
}

void gn__out_flush(gn_out_partial *p, uint64_t now_ms, int force, gn_out_emit emit, void *ctx) {
  if (p->len && (force || gn_ms_since(now_ms, p->since_ms) >= GN_OUT_HOLD_MS))
    out_emit_held(p, emit, ctx);
}
