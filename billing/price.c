/* Money arithmetic: the cost rule, and parsing and formatting prices held as
 * integer micro-units of a currency per GPU-hour. */
#include "billing_int.h"

#include <inttypes.h>
#include <stdio.h>

uint64_t gn_price_cost(uint64_t price_uper_hour, uint32_t gpus, uint64_t seconds) {
  /* The product of a u64, a u32 and a u64 can need 160 bits; a 128-bit
   * intermediate covers every realistic input, and anything that still
   * overflows it (or whose quotient exceeds 64 bits) saturates rather than
   * wrapping into a small bill. */
  unsigned __int128 pg = (unsigned __int128)price_uper_hour * gpus;
  if (seconds && pg > ((~(unsigned __int128)0) / seconds))
    return UINT64_MAX;
  unsigned __int128 q = pg * seconds / 3600u;
  if (q > UINT64_MAX)
    return UINT64_MAX;
  return (uint64_t)q;
}

int gn_price_cost_checked(uint64_t price_uper_hour, uint32_t gpus, uint64_t seconds, uint64_t *ret_micro) {
  /* price * gpus fits 96 bits; times seconds it may not fit 128: check. */
  unsigned __int128 pg = (unsigned __int128)price_uper_hour * gpus;
  if (!ret_micro)
    return GN_EINVAL;
  if (seconds && pg > ((~(unsigned __int128)0) / seconds))
    return GN_ETOOBIG;
  unsigned __int128 q = pg * seconds / 3600u;
  if (q > UINT64_MAX)
    return GN_ETOOBIG;
  *ret_micro = (uint64_t)q;
  return 0;
}

int gn_price_parse(const char *s, uint64_t *ret_uper_hour) {
  if (!s || !*s)
    return GN_EINVAL;
  uint64_t units = 0;
  const char *p = s;
  if (*p < '0' || *p > '9')
    return GN_EINVAL; /* no sign, no leading dot, no spaces */
  for (; *p >= '0' && *p <= '9'; p++) {
    uint64_t d = (uint64_t)(*p - '0');
    if (units > (UINT64_MAX - d) / 10)
      return GN_EINVAL;
    units = units * 10 + d;
  }
  uint64_t frac = 0;
  int decimals = 0;
  if (*p == '.') {
    p++;
    if (*p < '0' || *p > '9')
      return GN_EINVAL; /* "1." is a typo, not a price */
    for (; *p >= '0' && *p <= '9'; p++) {
      if (++decimals > 6)
        return GN_EINVAL; /* finer than a micro-unit cannot be represented */
      frac = frac * 10 + (uint64_t)(*p - '0');
    }
  }
  if (*p)
    return GN_EINVAL;
  for (int i = decimals; i < 6; i++)
    frac *= 10;
  if (units > (UINT64_MAX - frac) / 1000000u)
    return GN_EINVAL;
  *ret_uper_hour = units * 1000000u + frac;
  return 0;
}

void gn_price_format(uint64_t micro, char *buf, size_t cap) {
  if (!buf || !cap)
    return;
  snprintf(buf, cap, "%" PRIu64 ".%06" PRIu64, micro / 1000000u, micro % 1000000u);
}
