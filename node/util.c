/* node/util.h: hex and the two snprintf wrappers. */
#include "util.h"

#include <gpunet/base.h>

#include <stdarg.h>
#include <stdio.h>

void gn__hex(const uint8_t *p, size_t n, char *out) {
  static const char hx[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hx[p[i] >> 4];
    out[2 * i + 1] = hx[p[i] & 15];
  }
  out[2 * n] = 0;
}

int gn__pathf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  if (r < 0 || (size_t)r >= cap) {
    if (cap)
      buf[0] = 0;
    return GN_ETOOBIG;
  }
  return 0;
}

void gn__strf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
}
