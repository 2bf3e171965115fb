/* gpunet balance: what each counterparty owes this node and what this node
 * owes, per currency, from the requesters' signed payment vouchers, and how
 * much of it is settled (gpunetd's GET /v1/balance). */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void balance_row(cli_table *t, const json_t *b, size_t i) {
  (void)i;
  char peer[32], leases[24], vouched[64], settled[64], outstanding[64];
  const char *cur = cli_str(b, "currency");
  cli_fmt_node(cli_str(b, "peer") ? cli_str(b, "peer") : "-", peer, sizeof peer);
  snprintf(leases, sizeof leases, "%lld", (long long)cli_int(b, "leases", 0));
  cli_fmt_money((uint64_t)cli_int(b, "vouched_micro", 0), cur, vouched, sizeof vouched);
  cli_fmt_money((uint64_t)cli_int(b, "settled_micro", 0), cur, settled, sizeof settled);
  cli_fmt_money((uint64_t)cli_int(b, "outstanding_micro", 0), cur, outstanding, sizeof outstanding);
  const char *dir = cli_str(b, "direction");
  const char *row[] = {
      dir && strcmp(dir, "owed_to_us") == 0 ? "owes us" : "we owe", peer, leases, vouched, settled, outstanding};
  cli_table_row(t, row);
}

static void show_balance(const json_t *j, const void *ctx) {
  (void)ctx;
  static const char *const hdr[] = {"DIRECTION", "PEER", "LEASES", "VOUCHED", "SETTLED", "OUTSTANDING"};
  const json_t *items = json_object_get(j, "balances");
  if (!json_array_size(items)) {
    printf("no vouchers yet (a requester signs one with each debit note it accepts)\n");
  } else {
    cli_table *t = cli_table_new(6, hdr);
    size_t i;
    const json_t *b;
    json_array_foreach(items, i, b) balance_row(t, b, i);
    cli_table_print(t);
  }
  const char *driver = cli_str(j, "driver");
  long long pending = (long long)cli_int(j, "pending", 0), failed = (long long)cli_int(j, "failed", 0);
  printf("\nsettlement: %s driver, %lld pending, %lld failed%s\n", driver ? driver : "?", pending, failed,
         failed ? " (see gpunetd's log for why)" : "");
}

static void show_retried(const json_t *j, const void *ctx) {
  (void)ctx;
  long long n = (long long)cli_int(j, "retried", 0);
  printf("%lld failed settlement%s queued again (%s driver)\n", n, n == 1 ? "" : "s",
         cli_str(j, "driver") ? cli_str(j, "driver") : "?");
}

static const struct option balance_longs[] = {{"retry", no_argument, NULL, 'r'}, {"help", no_argument, NULL, 'h'}, {0}};
const cli_opts cli_balance_opts = {":h", balance_longs};

int cmd_balance(cli *c, int argc, char **argv) {
  bool retry = false;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_balance_opts.shorts, cli_balance_opts.longs, NULL)) != -1) {
    if (o == 'r')
      retry = true;
    else if (o == 'h')
      return cli_print_usage(cli_find_cmd("balance"));
    else
      return cli_bad_option("balance", o, argv);
  }
  int r = cli_want_args(argc, argv, 0, "");
  if (r >= 0)
    return r;
  if (retry)
    return cli_show(c, "POST", "/v1/balance/retry", NULL, show_retried, NULL);
  return cli_show(c, "GET", "/v1/balance", NULL, show_balance, NULL);
}
