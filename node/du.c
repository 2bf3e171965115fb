/* A directory tree's size on disk by a bounded walk that follows no link
 * (du.h). */
#include "du.h"

#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t walk(int dirfd, int depth, int max_depth, uint64_t max_entries, uint64_t *entries) {
  DIR *d = fdopendir(dirfd);
  if (!d) {
    close(dirfd);
    return 0;
  }
  uint64_t sum = 0;
  struct dirent *e;
  while ((e = readdir(d)) && *entries < max_entries) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    (*entries)++;
    struct stat st;
    if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
      continue;
    sum += (uint64_t)st.st_blocks * 512;
    if (S_ISDIR(st.st_mode) && depth < max_depth) {
      int fd = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0)
        sum += walk(fd, depth + 1, max_depth, max_entries, entries);
    }
  }
  closedir(d);
  return sum;
}

uint64_t gn__du_tree(int dirfd, int max_depth, uint64_t max_entries) {
  uint64_t entries = 0;
  return walk(dirfd, 0, max_depth, max_entries, &entries);
}
