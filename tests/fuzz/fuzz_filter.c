/* libFuzzer target for the offer filter parser and matcher: any input must be
 * rejected cleanly or parse into terms that match without fault. */
#include <gpunet/filter.h>

#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char s[GN_FILTER_MAX_LEN + 64];
  size_t n = size < sizeof(s) - 1 ? size : sizeof(s) - 1;
  memcpy(s, data, n);
  s[n] = '\0';
  gn_filter f;
  char err[256];
  if (gn_filter_parse(s, &f, err, sizeof(err)) != 0) {
    if (!memchr(err, '\0', sizeof(err)))
      __builtin_trap();
    return 0;
  }
  if (f.count > GN_FILTER_MAX_TERMS)
    __builtin_trap();
  /* Match against an offer built from the same bytes, hostile fields included. */
  gn_offer o;
  memset(&o, 0, sizeof(o));
  memcpy(&o, data, size < sizeof(o) ? size : sizeof(o));
  /* A decoded offer's bools are 0 or 1 (the decoder reads msgpack bools);
   * raw bytes in them would be the harness's undefined behaviour, not the
   * filter's. */
  o.simulated = size & 1;
  o.no_userns = (size >> 1) & 1;
  o.unenforced_limits = (size >> 2) & 1;
  o.training = (size >> 3) & 1;
  (void)gn_filter_match(&f, &o);
  return 0;
}
