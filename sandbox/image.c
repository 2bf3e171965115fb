/* A job's process from its image: argv from the image's entrypoint and cmd
 * (Docker's rules), and the environment with the job's entries over the
 * image's. */
#include "sandbox_int.h"

#define STRV_MAX 4096u

static size_t strv_len(const char *const *v) {
  size_t n = 0;
  while (v && v[n])
    n++;
  return n;
}

static int strv_push(char **v, size_t *n, const char *s) {
  if (!(v[*n] = strdup(s)))
    return GN_ENOMEM;
  (*n)++;
  return 0;
}

int gn_image_argv(const gn_image *img, const char *const *cmd, char ***ret_argv) {
  if (!img || !ret_argv)
    return GN_EINVAL;
  const char *const *ep = (const char *const *)img->entrypoint;
  /* A job's command replaces the image's cmd, never its entrypoint. */
  const char *const *args = strv_len(cmd) ? cmd : (const char *const *)img->cmd;
  size_t total = strv_len(ep) + strv_len(args);
  if (total == 0)
    return GN_EINVAL;
  if (total > STRV_MAX)
    return GN_ETOOBIG;
  char **v = calloc(total + 1, sizeof(char *));
  if (!v)
    return GN_ENOMEM;
  size_t n = 0;
  int r = 0;
  for (size_t i = 0; r == 0 && ep && ep[i]; i++)
    r = strv_push(v, &n, ep[i]);
  for (size_t i = 0; r == 0 && args && args[i]; i++)
    r = strv_push(v, &n, args[i]);
  if (r < 0) {
    gn__strv_free(v);
    return r;
  }
  *ret_argv = v;
  return 0;
}

static bool same_name(const char *a, const char *b) {
  size_t la = strcspn(a, "="), lb = strcspn(b, "=");
  return la == lb && strncmp(a, b, la) == 0;
}

int gn_image_env(const gn_image *img, const char *const *env, char ***ret_env) {
  if (!img || !ret_env)
    return GN_EINVAL;
  const char *const *base = (const char *const *)img->env;
  size_t nb = strv_len(base), nj = strv_len(env);
  if (nb + nj > STRV_MAX)
    return GN_ETOOBIG;
  for (size_t i = 0; i < nj; i++)
    if (!strchr(env[i], '=') || env[i][0] == '=')
      return GN_EINVAL;
  char **v = calloc(nb + nj + 1, sizeof(char *));
  if (!v)
    return GN_ENOMEM;
  size_t n = 0;
  int r = 0;
  for (size_t i = 0; r == 0 && i < nb; i++) {
    const char *pick = base[i];
    for (size_t j = 0; j < nj; j++)
      if (same_name(base[i], env[j]))
        pick = env[j]; /* the last job entry of that name wins */
    r = strv_push(v, &n, pick);
  }
  for (size_t j = 0; r == 0 && j < nj; j++) {
    bool seen = false;
    for (size_t i = 0; i < nb && !seen; i++)
      seen = same_name(base[i], env[j]);
    for (size_t k = j + 1; k < nj && !seen; k++)
      seen = same_name(env[k], env[j]); /* a later entry of the same name wins */
    if (!seen)
      r = strv_push(v, &n, env[j]);
  }
  if (r < 0) {
    gn__strv_free(v);
    return r;
  }
  *ret_env = v;
  return 0;
}
