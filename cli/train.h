/* gpunet train (cli/cmd_train.c) and what jobs/logs/stop use of it. */
#ifndef GN_CLI_TRAIN_H
#define GN_CLI_TRAIN_H

#include "cli.h"

int cmd_train(cli *c, int argc, char **argv);
/* gpunet output TRAINID DIR [--rank R]: every rank's /output now. */
int cmd_output(cli *c, int argc, char **argv);
/* GET /v1/train/ID without a message when there is none: the training job's
 * JSON ("train" of the answer, a new reference) or NULL. */
json_t *cli_train_get(cli *c, const char *id);
/* Prints the logs of a training job's ranks, each line prefixed "[rank R] "
 * (only rank `rank` when >= 0, unprefixed), following them until the group
 * ends when follow. Returns CLI_OK when the group finished, else CLI_FAIL
 * (follow) or CLI_OK (a snapshot). */
int cli_train_logs(cli *c, const char *id, long rank, bool follow);

#endif
