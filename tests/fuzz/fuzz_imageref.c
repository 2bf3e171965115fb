/* libFuzzer target: image reference parsing on arbitrary bytes. Whatever
 * parses must format and parse back to the same reference. */
#include <gpunet/sandbox.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s)
    return 0;
  memcpy(s, data, size);
  s[size] = '\0';
  gn_imageref r, again;
  if (gn_imageref_parse(s, &r) == 0) {
    char buf[1024];
    if (gn_imageref_format(&r, buf, sizeof(buf)) != 0)
      abort();
    if (gn_imageref_parse(buf, &again) != 0 || memcmp(&r, &again, sizeof(r)) != 0)
      abort();
    if (!r.registry[0] || !r.repository[0] || (!r.tag[0] && !r.digest[0]))
      abort();
  }
  free(s);
  return 0;
}
