/* `gpunet init --systemd`: writes gpunetd's systemd unit (the template is
 * packaging/gpunetd.service.in, compiled in as gn_unit_template) with the
 * paths of this gpunetd and this node's data directory. */
#include "cli.h"
#include "gn_unit.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A path that goes into ExecStart= as one word: absolute, printable, and
 * nothing systemd would split, unquote or expand (space, quotes, backslash,
 * %specifiers, $VARIABLES, ;). */
static bool unit_word_ok(const char *p) {
  if (p[0] != '/')
    return false;
  for (const unsigned char *s = (const unsigned char *)p; *s; s++)
    if (*s <= ' ' || *s >= 0x7f || strchr("\\\"'%$;", *s))
      return false;
  return true;
}

/* The gpunetd installed next to this gpunet. */
static int sibling_gpunetd(char *buf, size_t cap) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0)
    return -errno;
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (!slash)
    return -ENOENT;
  *slash = '\0';
  if ((size_t)snprintf(buf, cap, "%s/gpunetd", self) >= cap)
    return -ENAMETOOLONG;
  return 0;
}

/* The template with @GPUNETD@ and @DATA_DIR@ replaced; malloc'd. */
static char *unit_text(const char *gpunetd, const char *data_dir) {
  size_t cap = sizeof(gn_unit_template) + 4 * (strlen(gpunetd) + strlen(data_dir)) + 1;
  char *out = malloc(cap), *o = out;
  if (!out)
    return NULL;
  for (const char *s = gn_unit_template; *s;) {
    const char *v = NULL;
    size_t skip = 0;
    if (strncmp(s, "@GPUNETD@", 9) == 0)
      v = gpunetd, skip = 9;
    else if (strncmp(s, "@DATA_DIR@", 10) == 0)
      v = data_dir, skip = 10;
    if (v) {
      size_t l = strlen(v);
      memcpy(o, v, l);
      o += l;
      s += skip;
    } else {
      *o++ = *s++;
    }
  }
  *o = '\0';
  return out;
}

/* The whole file at path (NUL-terminated, at most 1 MiB); NULL if absent. */
static char *read_small(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return NULL;
  char *buf = malloc(1 << 20);
  size_t n = buf ? fread(buf, 1, (1 << 20) - 1, fp) : 0;
  fclose(fp);
  if (buf)
    buf[n] = '\0';
  return buf;
}

int cli_init_systemd(cli *c, const char *unit_dir, const char *gpunetd, bool force) {
  char exe[PATH_MAX], dir[PATH_MAX], unit[PATH_MAX + 32];
  int r;
  if (gpunetd) {
    if ((size_t)snprintf(exe, sizeof(exe), "%s", gpunetd) >= sizeof(exe))
      return cli_fail("--gpunetd path too long");
  } else if ((r = sibling_gpunetd(exe, sizeof(exe))) < 0) {
    return cli_fail("cannot find gpunetd next to gpunet: %s (name it with --gpunetd PATH)", strerror(-r));
  }
  if (!unit_word_ok(exe))
    return cli_fail("gpunetd path %s must be absolute, without spaces, quotes, \\, %%, $ or ;", exe);
  if (access(exe, X_OK) != 0)
    return cli_fail("%s is not an executable gpunetd: %s (name it with --gpunetd PATH)", exe, strerror(errno));
  /* The unit runs from /, so a relative data directory is made absolute. */
  if (c->data_dir[0] == '/') {
    snprintf(dir, sizeof(dir), "%s", c->data_dir);
  } else {
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof(cwd)) || (size_t)snprintf(dir, sizeof(dir), "%s/%s", cwd, c->data_dir) >= sizeof(dir))
      return cli_fail("cannot make the data directory %s absolute", c->data_dir);
  }
  if (!unit_word_ok(dir))
    return cli_fail("data directory %s must not contain spaces, quotes, \\, %%, $ or ; in a systemd unit", dir);
  struct stat st;
  if (stat(unit_dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return cli_fail("unit directory %s does not exist (is this a systemd machine? pass --unit-dir DIR)", unit_dir);
  if ((size_t)snprintf(unit, sizeof(unit), "%s/gpunetd.service", unit_dir) >= sizeof(unit))
    return cli_fail("unit directory path too long");
  char *text = unit_text(exe, dir);
  if (!text)
    return cli_fail("out of memory");
  char *old = read_small(unit);
  bool same = old && strcmp(old, text) == 0;
  if (old && !same && !force) {
    free(old);
    free(text);
    return cli_fail("%s exists and differs from the unit gpunet would write; refusing to overwrite it (--force "
                    "replaces it)",
                    unit);
  }
  free(old);
  r = same ? 0 : cli_write_atomic(unit, text, strlen(text), 0644);
  free(text);
  if (r < 0)
    return cli_fail("cannot write %s: %s", unit, strerror(-r));
  char key[PATH_MAX + 32];
  snprintf(key, sizeof(key), "%s/identity.key", dir);
  bool have_id = access(key, F_OK) == 0;
  if (c->json)
    return cli_print_json_new(json_pack("{s:s, s:s, s:s, s:b, s:b}", "unit", unit, "gpunetd", exe, "data_dir", dir,
                                        "changed", !same, "have_identity", have_id));
  fprintf(stderr, "%s %s (gpunetd %s, data directory %s)\n", same ? "unchanged" : "wrote", unit, exe, dir);
  if (!have_id)
    fprintf(stderr, "no node identity yet: create it first with gpunet --data-dir %s init\n", dir);
  fprintf(stderr, "then run: systemctl daemon-reload && systemctl enable --now gpunetd\n");
  printf("%s\n", unit);
  return CLI_OK;
}
