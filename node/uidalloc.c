/* Host-wide user namespace slots: an flock(2) per slot file (uidalloc.h). */
#include "uidalloc.h"

#include <gpunet/base.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct held {
  char dir[PATH_MAX];
  uint32_t slot;
  int fd; /* holds the lock */
} held;

/* What this process holds (the daemon's loop thread, and tests). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static held *tab;
static size_t n_tab, cap_tab;

const char *gn_uidalloc_dir(void) {
  const char *e = getenv(GN_UIDALLOC_DIR_ENV);
  return e && e[0] ? e : GN_UIDALLOC_DIR;
}

/* Makes dir (and its parents) when missing; checks it is safe to lock in. */
static int dir_ready(const char *dir) {
  char p[PATH_MAX];
  size_t len = strlen(dir);
  if (len == 0 || len >= sizeof(p) || dir[0] != '/')
    return GN_EINVAL;
  memcpy(p, dir, len + 1);
  for (char *s = p + 1;; s++) {
    bool last = *s == 0;
    if (*s != '/' && !last)
      continue;
    *s = 0;
    if (mkdir(p, last ? 0700 : 0755) < 0 && errno != EEXIST)
      return -errno;
    if (last)
      break;
    *s = '/';
  }
  struct stat st;
  if (lstat(dir, &st) < 0)
    return -errno;
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)))
    return GN_EPERM;
  return 0;
}

static bool held_here(const char *dir, uint32_t slot) {
  for (size_t i = 0; i < n_tab; i++)
    if (tab[i].slot == slot && strcmp(tab[i].dir, dir) == 0)
      return true;
  return false;
}

/* Tries to lock slot s: 1 taken (fd in *ret_fd), 0 held by another, < 0 error. */
static int try_slot(const char *dir, uint32_t s, int *ret_fd) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof(path), "%s/slot-%u", dir, s) >= (int)sizeof(path))
    return GN_EINVAL;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
  if (fd < 0)
    return -errno;
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    close(fd);
    return e == EWOULDBLOCK ? 0 : -e;
  }
  *ret_fd = fd;
  return 1;
}

int gn_uidalloc_claim(const char *dir, uint32_t nslots, uint32_t *ret_slot) {
  if (!dir || !ret_slot || nslots == 0 || strlen(dir) >= PATH_MAX)
    return GN_EINVAL;
  pthread_mutex_lock(&mu);
  int r = dir_ready(dir);
  if (r < 0)
    goto out;
  if (n_tab == cap_tab) {
    size_t cap = cap_tab ? 2 * cap_tab : 16;
    held *t = realloc(tab, cap * sizeof(*t));
    if (!t) {
      r = GN_ENOMEM;
      goto out;
    }
    tab = t;
    cap_tab = cap;
  }
  r = GN_EBUSY;
  for (uint32_t s = 0; s < nslots; s++) {
    int fd = -1;
    if (held_here(dir, s))
      continue;
    int t = try_slot(dir, s, &fd);
    if (t < 0) {
      r = t;
      break;
    }
    if (t == 1) {
      held *h = &tab[n_tab++];
      snprintf(h->dir, sizeof(h->dir), "%s", dir);
      h->slot = s;
      h->fd = fd;
      *ret_slot = s;
      r = 0;
      break;
    }
  }
out:
  pthread_mutex_unlock(&mu);
  return r;
}

int gn_uidalloc_release(const char *dir, uint32_t slot) {
  if (!dir)
    return GN_EINVAL;
  int r = GN_ENOTFOUND;
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < n_tab; i++) {
    if (tab[i].slot == slot && strcmp(tab[i].dir, dir) == 0) {
      close(tab[i].fd); /* drops the lock */
      tab[i] = tab[--n_tab];
      r = 0;
      break;
    }
  }
  pthread_mutex_unlock(&mu);
  return r;
}

uint32_t gn_uidalloc_held(void) {
  pthread_mutex_lock(&mu);
  uint32_t n = (uint32_t)n_tab;
  pthread_mutex_unlock(&mu);
  return n;
}
