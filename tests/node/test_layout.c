/* The daemon's files stay out of a circle: reads every node/ .c and .h file
 * (GN_SOURCE_DIR) and checks, from their `#include "x.h"` lines, that
 *   - the modules' graph (A -> B when a file of A includes B's header) has no
 *     cycle: a module's header declares what it offers, so an include is a
 *     call, and a cycle would be two modules each reaching into the other;
 *   - only daemon.c (the composition root) and the module itself include
 *     the agents' and the API's headers (requester.h, api.h), so the API
 *     never reaches into the requester nor the requester into the provider;
 *   - node_internal.h (struct gn_node) is not included by the files that
 *     need no node: jobmsg.c, util.c, main.c, config.c, control.c, gpu.c,
 *     log.c.
 * The headers named here must exist, so a rename is seen rather than
 * silently passing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 64
#define MAX_INCLUDES 32

typedef struct src {
  char name[64]; /* "api.c" */
  char mod[64];  /* "api" */
  char inc[MAX_INCLUDES][64];
  size_t ninc;
} src;

static src files[MAX_FILES];
static size_t nfiles;

/* A header's module: settle_glue.h is settle.c's, node_internal.h is the
 * shared struct (no module), the others their own name. */
static void module_of(const char *file, char *out, size_t cap) {
  snprintf(out, cap, "%s", file);
  char *dot = strrchr(out, '.');
  if (dot)
    *dot = '\0';
  if (strcmp(out, "settle_glue") == 0)
    snprintf(out, cap, "settle");
}

static void read_tree(void) {
  const char *root = getenv("GN_SOURCE_DIR");
  assert_non_null(root);
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/node", root);
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 3 || len >= 64 || e->d_name[len - 2] != '.' || (e->d_name[len - 1] != 'c' && e->d_name[len - 1] != 'h'))
      continue;
    assert_true(nfiles < MAX_FILES);
    src *s = &files[nfiles++];
    memset(s, 0, sizeof *s);
    memcpy(s->name, e->d_name, len + 1); /* len < 64 */
    module_of(s->name, s->mod, sizeof s->mod);
    char path[PATH_MAX + 64], line[1024];
    snprintf(path, sizeof path, "%s/%s", dir, s->name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
      char h[64];
      if (sscanf(line, "#include \"%63[^\"]\"", h) == 1) {
        assert_true(s->ninc < MAX_INCLUDES);
        snprintf(s->inc[s->ninc++], sizeof s->inc[0], "%s", h);
      }
    }
    fclose(f);
  }
  closedir(d);
}

static const src *find(const char *name) {
  for (size_t i = 0; i < nfiles; i++)
    if (strcmp(files[i].name, name) == 0)
      return &files[i];
  return NULL;
}

static bool includes(const src *s, const char *h) {
  for (size_t i = 0; i < s->ninc; i++)
    if (strcmp(s->inc[i], h) == 0)
      return true;
  return false;
}

static int setup(void **state) {
  (void)state;
  nfiles = 0;
  read_tree();
  return 0;
}

/* --- the module graph ----------------------------------------------------------*/

#define MAX_MODS MAX_FILES
static char mods[MAX_MODS][64];
static size_t nmods;
static bool edge[MAX_MODS][MAX_MODS];

static size_t mod_index(const char *m) {
  for (size_t i = 0; i < nmods; i++)
    if (strcmp(mods[i], m) == 0)
      return i;
  assert_true(nmods < MAX_MODS);
  snprintf(mods[nmods], sizeof mods[0], "%s", m);
  return nmods++;
}

/* 0 unvisited, 1 on the path, 2 done; stack: the path being walked; the
 * circle found is written to path. */
static int mark[MAX_MODS];
static size_t stack[MAX_MODS], depth;
static char path[1024];

static bool cycle_from(size_t a) {
  mark[a] = 1;
  stack[depth++] = a;
  for (size_t b = 0; b < nmods; b++) {
    if (!edge[a][b])
      continue;
    if (mark[b] == 1) {
      size_t k = 0;
      while (stack[k] != b)
        k++;
      for (; k < depth; k++) {
        size_t len = strlen(path);
        snprintf(path + len, sizeof path - len, "%s -> ", mods[stack[k]]);
      }
      size_t len = strlen(path);
      snprintf(path + len, sizeof path - len, "%s", mods[b]);
      return true;
    }
    if (mark[b] == 0 && cycle_from(b))
      return true;
  }
  mark[a] = 2;
  depth--;
  return false;
}

static void test_node_modules_form_no_cycle(void **state) {
  (void)state;
  nmods = 0;
  memset(edge, 0, sizeof edge);
  memset(mark, 0, sizeof mark);
  depth = 0;
  path[0] = '\0';
  for (size_t i = 0; i < nfiles; i++) {
    size_t a = mod_index(files[i].mod);
    for (size_t k = 0; k < files[i].ninc; k++) {
      char m[64];
      module_of(files[i].inc[k], m, sizeof m);
      size_t b = mod_index(m);
      /* node_internal.h is data, not a module's offer; a module's own
       * header is no edge. */
      if (strcmp(m, "node_internal") != 0 && a != b)
        edge[a][b] = true;
    }
  }
  for (size_t a = 0; a < nmods; a++)
    if (mark[a] == 0 && cycle_from(a))
      fail_msg("node/ modules include each other in a circle: %s", path);
  /* The check looked at something: daemon.c reaches the agents. */
  assert_true(edge[mod_index("daemon")][mod_index("requester")]);
  assert_true(edge[mod_index("daemon")][mod_index("provider")]);
}

/* --- who may include what -------------------------------------------------------*/

static void only_these_include(const char *h, const char *const *allowed, size_t n) {
  assert_non_null(find(h)); /* renamed? update this test */
  for (size_t i = 0; i < nfiles; i++) {
    if (!includes(&files[i], h))
      continue;
    bool ok = false;
    for (size_t k = 0; k < n && !ok; k++)
      ok = strcmp(files[i].name, allowed[k]) == 0;
    if (!ok) {
      char who[256] = "";
      for (size_t k = 0; k < n; k++)
        snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s", k ? ", " : "", allowed[k]);
      fail_msg("node/%s includes %s: only %s may", files[i].name, h, who);
    }
  }
}

static void test_agents_headers_are_the_daemons_only(void **state) {
  (void)state;
  static const char *const req[] = {"requester.c", "daemon.c"};
  /* The dashboard is a view of the node like the API: it reads the
   * earnings the way the metrics count them. */
  static const char *const api[] = {"api.c", "daemon.c", "dashboard.c"};
  only_these_include("requester.h", req, 2);
  only_these_include("api.h", api, 3);
  /* The requester does not reach into the provider. */
  assert_false(includes(find("requester.c"), "provider.h"));
}

static void test_files_without_a_node_do_not_see_it(void **state) {
  (void)state;
  static const char *const plain[] = {"jobmsg.c", "util.c", "main.c", "config.c", "control.c", "gpu.c", "log.c"};
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
    const src *s = find(plain[i]);
    assert_non_null(s);
    if (includes(s, "node_internal.h"))
      fail_msg("node/%s includes node_internal.h but uses no gn_node", plain[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_node_modules_form_no_cycle, setup),
      cmocka_unit_test_setup(test_agents_headers_are_the_daemons_only, setup),
      cmocka_unit_test_setup(test_files_without_a_node_do_not_see_it, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
