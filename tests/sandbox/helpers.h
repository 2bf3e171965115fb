/* Test helpers for the sandbox tests: temp dirs, running scripts/registry on
 * a free loopback port, reading and writing files. Header-only: each test
 * program includes it once. */
#ifndef GN_TEST_SANDBOX_HELPERS_H
#define GN_TEST_SANDBOX_HELPERS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "free_port.h"

/* The repository root: GN_SOURCE_DIR from ctest, else derived from this
 * file's path. */
static inline const char *th_source_dir(void) {
  static char dir[4096];
  const char *env = getenv("GN_SOURCE_DIR");
  if (env && env[0])
    return env;
  snprintf(dir, sizeof(dir), "%s", __FILE__);
  char *p = strstr(dir, "/tests/sandbox/");
  if (p)
    *p = '\0';
  return dir;
}

static inline int th_free_port(void) {
  return gn_test_free_port(); /* free_port.h: below the ephemeral range */
}

/* Runs a shell command, captures up to cap-1 bytes of its stdout (trailing
 * newline stripped). Returns the exit status, or -1. */
static inline int th_run(const char *cmd, char *out, size_t cap) {
  FILE *f = popen(cmd, "r");
  if (!f)
    return -1;
  size_t n = 0;
  if (out && cap) {
    n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    while (n && (out[n - 1] == '\n' || out[n - 1] == '\r'))
      out[--n] = '\0';
  } else {
    char sink[4096];
    while (fread(sink, 1, sizeof(sink), f) > 0) {
    }
  }
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline char *th_mkdtemp(const char *tag) {
  char *p = malloc(256);
  snprintf(p, 256, "/tmp/gn-%s-XXXXXX", tag);
  if (!mkdtemp(p)) {
    free(p);
    return NULL;
  }
  return p;
}

static inline void th_rm_rf(const char *path) {
  char cmd[4200];
  if (!path || strlen(path) < 8 || strncmp(path, "/tmp/", 5) != 0)
    return; /* only ever our own temp dirs */
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
  th_run(cmd, NULL, 0);
}

static inline int th_write_file(const char *path, const void *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return -1;
  ssize_t w = write(fd, p, n);
  close(fd);
  return w == (ssize_t)n ? 0 : -1;
}

/* Reads a whole file (NUL-terminated for convenience); NULL on error. */
static inline char *th_read_file(const char *path, size_t *ret_len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0;
  char *b = malloc(cap);
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap *= 2;
      b = realloc(b, cap);
    }
    size_t r = fread(b + n, 1, 4096, f);
    n += r;
    if (r == 0)
      break;
  }
  fclose(f);
  b[n] = '\0';
  if (ret_len)
    *ret_len = n;
  return b;
}

static inline bool th_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* Counts directory entries other than . and .. (-1 if it cannot open). */
static inline int th_count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

/* A running test registry with a busybox image pushed as bb:latest. */
typedef struct th_registry {
  char *dir;
  int port;
  char host[64];   /* "127.0.0.1:PORT" */
  char digest[80]; /* of bb:latest */
} th_registry;

static inline int th_registry_start(th_registry *r) {
  char cmd[8192], out[80];
  memset(r, 0, sizeof(*r));
  r->dir = th_mkdtemp("reg");
  if (!r->dir)
    return -1;
  for (int tries = 0; tries < 3; tries++) {
    r->port = th_free_port();
    snprintf(cmd, sizeof(cmd), "'%s/scripts/registry' start '%s' %d >&2", th_source_dir(), r->dir, r->port);
    if (th_run(cmd, NULL, 0) == 0)
      break;
    r->port = -1;
  }
  if (r->port < 0)
    return -1;
  snprintf(r->host, sizeof(r->host), "127.0.0.1:%d", r->port);
  snprintf(cmd, sizeof(cmd), "'%s/scripts/registry' build-busybox '%s/img' bb:latest %d", th_source_dir(), r->dir,
           r->port);
  if (th_run(cmd, out, sizeof(out)) != 0 || strncmp(out, "sha256:", 7) != 0)
    return -1;
  snprintf(r->digest, sizeof(r->digest), "%s", out);
  return 0;
}

static inline void th_registry_stop(th_registry *r) {
  char cmd[4200];
  if (!r->dir)
    return;
  snprintf(cmd, sizeof(cmd), "'%s/scripts/registry' stop '%s' >&2", th_source_dir(), r->dir);
  th_run(cmd, NULL, 0);
  th_rm_rf(r->dir);
  free(r->dir);
  r->dir = NULL;
}

/* Starts r for a test program's group setup: 0, or -1 (said on stderr,
 * whatever had started stopped again). */
static inline int th_registry_setup(th_registry *r) {
  if (th_registry_start(r) < 0) {
    fprintf(stderr, "cannot start a test registry with scripts/registry\n");
    th_registry_stop(r);
    return -1;
  }
  return 0;
}

/* Where docker-registry keeps a blob's bytes. */
static inline void th_registry_blob_path(const th_registry *r, const char *digest, char *out, size_t cap) {
  snprintf(out, cap, "%s/data/docker/registry/v2/blobs/sha256/%.2s/%s/data", r->dir, digest + 7, digest + 7);
}

#ifdef GPUNET_SANDBOX_H
/* The provider's store as the tests run it: the test registries listen on
 * 127.0.0.1, which only an allow list admits. */
static inline int th_store_open_loopback(const char *dir, gn_store **ret) {
  static const char *const allow[] = {"127.0.0.1", NULL};
  gn_store_limits lim = {.registry_allow = allow};
  int rc = gn_store_open(dir, ret);
  if (rc == 0 && (rc = gn_store_set_limits(*ret, &lim)) < 0)
    *ret = gn_store_free(*ret);
  return rc;
}
#endif

#if defined(GPUNET_SANDBOX_H) && defined(CMOCKA_H_)
/* Why the container tests cannot run here, or NULL when they can: they
 * need root (need_root says what for) and an OCI runtime (runtime names
 * one, NULL takes what is there), which goes to rt. */
static inline const char *th_containers_skip(const char *need_root, const char *runtime, gn_runtime *rt) {
  char err[512] = "";
  if (geteuid() != 0)
    return need_root;
  if (gn_runtime_detect(runtime, rt, err, sizeof(err)) < 0)
    return "no OCI runtime (runc or crun) here";
  return NULL;
}

/* Skips the running test when reason is not NULL, saying why. */
#define TH_SKIP_IF(reason)                                                                                             \
  do {                                                                                                                 \
    if (reason) {                                                                                                      \
      fprintf(stderr, "skipped: %s\n", reason);                                                                        \
      skip();                                                                                                          \
    }                                                                                                                  \
  } while (0)

/* What a container run to its end left: exit status, output, run time. */
typedef struct th_job_result {
  int status;
  char out[4096];
  char errout[4096];
  uint64_t ms;
} th_job_result;

/* Runs the bundle in `bundle` (already written) as container id with rt,
 * its state under state_dir, stdin /dev/null, stdout and stderr kept in
 * bundle/stdout and bundle/stderr and copied into res. */
static inline void th_run_bundle(const gn_runtime *rt, const char *state_dir, const char *bundle, const char *id,
                                 th_job_result *res) {
  char outp[600], errp[600];
  char **argv = NULL;
  assert_int_equal(gn_runtime_argv_run(rt, state_dir, bundle, id, &argv), 0);
  snprintf(outp, sizeof(outp), "%s/stdout", bundle);
  snprintf(errp, sizeof(errp), "%s/stderr", bundle);
  int in = open("/dev/null", O_RDONLY);
  int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  int errfd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(in >= 0 && out >= 0 && errfd >= 0);
  uint64_t t0 = gn_mono_ms();
  assert_int_equal(gn_runtime_exec_io(argv, in, out, errfd, &res->status), 0);
  res->ms = gn_mono_ms() - t0;
  close(in);
  close(out);
  close(errfd);
  gn_argv_free(argv);
  char *o = th_read_file(outp, NULL), *e = th_read_file(errp, NULL);
  snprintf(res->out, sizeof(res->out), "%s", o ? o : "");
  snprintf(res->errout, sizeof(res->errout), "%s", e ? e : "");
  free(o);
  free(e);
}
#endif

#ifdef JANSSON_H
/* The first object of array a whose string `key` is value, or NULL. */
static inline json_t *th_json_find_by(json_t *a, const char *key, const char *value) {
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    json_t *k = json_object_get(v, key);
    if (json_is_string(k) && strcmp(json_string_value(k), value) == 0)
      return v;
  }
  return NULL;
}

/* Whether array a holds the string s. */
static inline bool th_json_has_string(json_t *a, const char *s) {
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    if (json_is_string(v) && strcmp(json_string_value(v), s) == 0)
      return true;
  }
  return false;
}
#endif

#endif
