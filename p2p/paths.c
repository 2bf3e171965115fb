/* Where a node keeps its state (gpunet/paths.h). */
#include <gpunet/base.h>
#include <gpunet/paths.h>

#include <stdio.h>
#include <stdlib.h>

static int path_join(char *buf, size_t cap, const char *a, const char *b) {
  int n = snprintf(buf, cap, "%s%s", a, b);
  if (n < 0 || (size_t)n >= cap) {
    if (cap)
      buf[0] = '\0';
    return GN_ETOOBIG;
  }
  return 0;
}

int gn_data_dir_default(char *buf, size_t cap) {
  const char *x = getenv("XDG_DATA_HOME");
  if (x && x[0] == '/')
    return path_join(buf, cap, x, "/gpunet");
  const char *home = getenv("HOME");
  if (!home || !home[0])
    return GN_ENOTFOUND;
  return path_join(buf, cap, home, "/.local/share/gpunet");
}
