/* The skeleton shared by the gpunet commands: argument checks of commands
 * without options, request paths naming one object, and the list commands
 * (GET, then JSON, an empty hint or a table). */
#include "cli.h"
#include "progress.h"

#include <getopt.h>
#include <gpunet/base.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_simple_args(int argc, char **argv, int nargs, const char *what) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {0}};
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    if (o == 'h')
      return cli_print_usage(cli_find_cmd(argv[0]));
    return cli_bad_option(argv[0], o, argv);
  }
  return cli_want_args(argc, argv, nargs, what);
}

int cli_want_args(int argc, char **argv, int nargs, const char *what) {
  if (argc - optind < nargs)
    return cli_usage_error(argv[0], "missing %s", what);
  if (argc - optind > nargs)
    return cli_usage_error(argv[0], "unexpected argument '%s'", argv[optind + nargs]);
  return -1;
}

int cli_check_id(const char *cmd, const char *what, const char *id) {
  if (gn_id_valid(id))
    return -1;
  char shown[GN_ID_MAX + 4];
  gn_printable_copy(id, shown, sizeof(shown));
  return cli_usage_error(
      cmd, "'%s' is not a %s id: ids are 1 to %d letters, digits, '-' or '_', starting with a letter or digit", shown,
      what, GN_ID_MAX);
}

int cli_check_env(const char *cmd, const char *entry) {
  if (gn_env_entry_valid(entry))
    return -1;
  char shown[80];
  gn_printable_copy(entry, shown, sizeof(shown));
  return cli_usage_error(cmd,
                         "--env wants NAME=VALUE with NAME of letters, digits and '_' (not starting with a digit), "
                         "not '%s'",
                         shown);
}

char *cli_path(const char *prefix, const char *id, const char *suffix) {
  char *e = cli_urlencode(id);
  if (!e)
    return NULL;
  size_t n = strlen(prefix) + strlen(e) + strlen(suffix) + 2;
  char *p = malloc(n);
  if (p)
    snprintf(p, n, "%s/%s%s", prefix, e, suffix);
  free(e);
  return p;
}

int cli_show(cli *c, const char *method, const char *path, json_t *body, cli_show_fn show, const void *ctx) {
  return cli_show_waiting(c, method, path, body, show, ctx, NULL, NULL);
}

int cli_show_waiting(cli *c, const char *method, const char *path, json_t *body, cli_show_fn show, const void *ctx,
                     const char *what, const char *label) {
  json_t *j;
  cli_progress *p =
      what ? cli_progress_start(cli_progress_mode_for(c->json), what, label, CLI_PROGRESS_NONE, 0, NULL, NULL) : NULL;
  int r = cli_call_waiting(c, method, path, body, &j, p);
  cli_progress_end(p, r == CLI_OK, NULL);
  if (r != CLI_OK)
    return r;
  if (c->json)
    cli_print_json(j);
  else
    show(j, ctx);
  json_decref(j);
  return CLI_OK;
}

int cli_list(cli *c, const char *path, const cli_list_spec *spec) {
  json_t *j;
  int r = cli_call(c, "GET", path, NULL, &j);
  if (r != CLI_OK)
    return r;
  const json_t *items = json_object_get(j, spec->key);
  if (c->json) {
    cli_print_json(j);
  } else if (!json_array_size(items)) {
    printf("%s\n", spec->empty);
  } else {
    cli_table *t = cli_table_new(spec->ncols, spec->headers);
    size_t i;
    const json_t *item;
    json_array_foreach(items, i, item) spec->row(t, item, i);
    cli_table_print(t);
  }
  json_decref(j);
  return CLI_OK;
}
