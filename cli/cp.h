/* gpunet cp (cli/cmd_cp.c): files into and out of a lease's workspace. */
#ifndef GN_CLI_CP_H
#define GN_CLI_CP_H

#include "cli.h"

int cmd_cp(cli *c, int argc, char **argv);
extern const cli_opts cli_cp_opts;

#endif
