/* Writing a file so that a crash leaves the old one or the new one, never
 * a part: the bytes go to a new temporary file beside it (mkstemp: a name
 * nobody else holds, never a link followed), are flushed to disk, then the
 * file is renamed over the old. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_write_atomic(const char *path, const void *data, size_t len, unsigned mode) {
  char dir_buf[PATH_MAX], tmp[PATH_MAX + 32];
  if (!path || !path[0] || (size_t)snprintf(dir_buf, sizeof dir_buf, "%s", path) >= sizeof dir_buf)
    return -ENAMETOOLONG;
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if ((size_t)snprintf(tmp, sizeof tmp, "%s/.%.64s.tmp-XXXXXX", dirname(dir_buf), base) >= sizeof tmp)
    return -ENAMETOOLONG;
  int fd = mkstemp(tmp);
  if (fd < 0)
    return -errno;
  int r = 0;
  for (size_t off = 0; off < len && r == 0;) {
    ssize_t n = write(fd, (const char *)data + off, len - off);
    if (n < 0 && errno != EINTR)
      r = -errno;
    else if (n > 0)
      off += (size_t)n;
  }
  if (r == 0 && fchmod(fd, (mode_t)mode) < 0)
    r = -errno;
  if (r == 0 && fsync(fd) < 0)
    r = -errno;
  if (close(fd) < 0 && r == 0)
    r = -errno;
  if (r == 0 && rename(tmp, path) < 0)
    r = -errno;
  if (r < 0)
    unlink(tmp);
  return r;
}
