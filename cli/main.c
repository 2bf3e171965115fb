/* gpunet: the user's command. Parses the global options and dispatches to one
 * command from a table, as WireGuard's wg does; the commands talk to the local
 * gpunetd through its control socket. */
#include "cli.h"
#include "cp.h"
#include "train.h"

#include <curl/curl.h>
#include <gpunet/paths.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmd_completion(cli *c, int argc, char **argv);
/* cli/cmd_forward.c */
int cmd_forward(cli *c, int argc, char **argv);
extern const cli_opts cli_forward_opts;

static const cli_cmd commands[] = {
    {"init", cmd_init, "create this node's identity and config",
     "Usage: gpunet init [--force]\n"
     "       gpunet init --systemd [--unit-dir DIR] [--gpunetd PATH] [--force]\n"
     "Creates the data directory (0700), a fresh node identity (identity.key,\n"
     "0600) and a commented gpunet.conf, then prints the node id. Never\n"
     "overwrites an existing identity; --force only rewrites the config.\n"
     "With --systemd, writes gpunetd.service instead into DIR (default\n"
     "/etc/systemd/system), running PATH (default: the gpunetd next to this\n"
     "gpunet) on this data directory; a different existing unit is only\n"
     "replaced with --force. Then: systemctl daemon-reload && systemctl enable\n"
     "--now gpunetd.\n",
     &cli_init_opts},
    {"id", cmd_id, "print this node's id",
     "Usage: gpunet id\n"
     "Prints the node id from DATA_DIR/identity.key (no daemon needed).\n",
     NULL},
    {"status", cmd_status, "show the daemon's state",
     "Usage: gpunet status\n"
     "Shows the node id, version, addresses and counts of peers, offers,\n"
     "leases and jobs of the running gpunetd.\n",
     NULL},
    {"gpus", cmd_gpus, "list this node's GPUs",
     "Usage: gpunet gpus\n"
     "Lists the local GPUs gpunetd found (real and simulated), whether they are\n"
     "leased, their utilization and attestation.\n",
     NULL},
    {"peers", cmd_peers, "list known peers",
     "Usage: gpunet peers\n"
     "Lists the peers in the overlay membership.\n",
     NULL},
    {"members", cmd_members, "list the overlay's members",
     "Usage: gpunet members [--state alive|suspect|dead|left] [--json]\n"
     "Lists the members of the overlay's membership (SWIM) that this node\n"
     "knows, itself not included: each member's node id, its address (host:port,\n"
     "UDP and TCP), its state (alive; suspect: a probe failed and it has not\n"
     "refuted yet; dead: declared failed; left: said goodbye), its incarnation\n"
     "(raised by the member each time it refutes a suspicion) and how long it\n"
     "has been in that state here. Ends with the counts by state and this\n"
     "node's local health (Lifeguard: 0 is healthy, up to 8 when its own probes\n"
     "go unanswered, which makes it slower to suspect others).\n"
     "  --state S   only the members in state S (the summary still counts all)\n"
     "  --json      {\"members\": [{node_id, addr, state, incarnation, for_ms}],\n"
     "              \"health\", \"counts\": {alive, suspect, dead, left},\n"
     "              \"total\"} (and \"state\" with --state)\n"
     "Exits 1 when gpunetd is not running or runs with overlay = off, 2 for a\n"
     "usage error.\n",
     &cli_members_opts},
    {"offers", cmd_offers, "search GPU offers",
     "Usage: gpunet offers [FILTER...] [--sort price|vram|count]\n"
     "Lists offers from the local offer table. FILTER terms (all must hold):\n"
     "  gpu=MODEL gpu!=MODEL   model substring: rtx4090, 4090, \"RTX 4090\"\n"
     "  vram>=24               GiB of memory per GPU\n"
     "  price<=0.50            currency units per GPU-hour\n"
     "  count>=2               GPUs free\n"
     "  simulated=false        hide simulated GPUs\n"
     "  confined=true          hide providers whose offers say they run jobs\n"
     "                         without a user namespace or without enforced\n"
     "                         memory and pids limits (ISOLATION column)\n"
     "  training=true          only providers that take ranks of gpunet train\n"
     "                         jobs (TRAINING column: yes and their job network's\n"
     "                         UDP ports, or no)\n"
     "Operators: = != < <= > >=. Example:\n"
     "  gpunet offers 'gpu=rtx4090 vram>=24 price<=0.50' --sort price\n",
     &cli_offers_opts},
    {"rent", cmd_rent, "lease GPUs from a provider",
     "Usage: gpunet rent (OFFER | --gpu MODEL) --hours H [--count N]\n"
     "                   [--max-price P] [--max-spend AMOUNT] [--interval S]\n"
     "                   [--allow-simulated] [--no-attest] [--wait S]\n"
     "Negotiates a signed lease for N GPUs (default 1) of an offer, or of the\n"
     "cheapest offer of MODEL, for at most H hours. Before signing, the\n"
     "provider's GPU is challenged unless --no-attest. Simulated GPUs are\n"
     "refused unless --allow-simulated.\n"
     "  --max-price P       never pay more than P per GPU-hour (in the offer's\n"
     "                      currency): dearer offers are refused, and the lease\n"
     "                      asks the offer's price, never more\n"
     "  --max-spend AMOUNT  spending cap for the whole lease: this node releases\n"
     "                      the lease itself while an honest final bill still\n"
     "                      fits under the cap, and refuses any debit note or\n"
     "                      invoice beyond it\n"
     "  --interval S        seconds between debit notes, 1..86400 (default 60;\n"
     "                      the provider refuses one outside its own bounds,\n"
     "                      10..3600 unless configured otherwise)\n"
     "  --wait S            with --gpu: wait up to S seconds (1..3600) for an\n"
     "                      offer of MODEL with N free GPUs to reach this node\n"
     "                      before renting (a node just started knows none)\n",
     &cli_rent_opts},
    {"leases", cmd_leases, "list leases",
     "Usage: gpunet leases\n"
     "Lists leases, as requester or provider, with elapsed time and cost.\n",
     NULL},
    {"release", cmd_release, "end a lease and settle it",
     "Usage: gpunet release LEASE\n"
     "Ends the lease now and prints the final bill.\n",
     NULL},
    {"run", cmd_run, "run a container job on a lease",
     "Usage: gpunet run LEASE --image REF [--env K=V]... [--memory SIZE] [--pids N]\n"
     "                  [-f|--follow] -- CMD [ARGS...]\n"
     "Sends a signed job manifest to the lease's provider, which pulls REF and\n"
     "runs CMD with the leased GPUs. Prints the job id; with -f streams the\n"
     "job's output and exits with its exit code.\n"
     "  --memory SIZE  the job's memory limit, e.g. 512M or 2G (K, M, G, T; plain\n"
     "                 numbers are MiB; 16M..1024G; default 1024M). The provider\n"
     "                 refuses a job its memory budget cannot hold.\n"
     "  --pids N       the most processes the job may have (8..4096, default 1024)\n",
     &cli_run_opts},
    {"cp", cmd_cp, "copy a file into or out of a lease's workspace",
     "Usage: gpunet cp [--json] SRC DST\n"
     "Copies one file between this machine and the workspace of a lease you\n"
     "rent: exactly one of SRC and DST is LEASE:PATH, a path inside the lease's\n"
     "workspace, which its jobs see at /workspace (it lives as long as the lease).\n"
     "  gpunet cp data.bin L:data.bin         upload (L: or L:dir/ keeps the name)\n"
     "  gpunet cp L:results/model.pt .        download into a file or directory\n"
     "Shows progress (bytes and rate) on stderr. An interrupted copy run again\n"
     "resumes where it stopped (a download is kept as DST.part until verified);\n"
     "at the end the SHA-256 of both sides must match, or the copy fails (and a\n"
     "download's partial file is removed). Directories are not copied yet: copy\n"
     "a tar of them. The provider refuses writes past the workspace's budget.\n"
     "  --json   {direction, lease, path, bytes, sha256, seconds, resumed_from}\n",
     &cli_cp_opts},
    {"train", cmd_train, "run one training job on GPUs from several providers",
     "Usage: gpunet train --gpus N [--per-node K] --image REF [--max-price P]\n"
     "                    [--max-spend AMOUNT] [--hours H] [--memory SIZE]\n"
     "                    [--output DIR] [--env K=V]... [--restarts K] [--no-attest]\n"
     "                    [--allow-simulated] [--json] [-f|--follow] -- CMD [ARGS...]\n"
     "Plans N GPUs as N/K providers of K GPUs each (every K that divides N when\n"
     "--per-node is not given) from the offer table: the set with the smallest\n"
     "worst round-trip time between two of its providers among those within\n"
     "--max-price, then the cheapest. Prints the plan (providers, GPUs, price per\n"
     "hour in total, the worst pair and the RTT matrix), leases every provider's\n"
     "GPUs all or nothing (one refusal or silence releases every lease already\n"
     "agreed: each is billed only the seconds its provider metered), then runs\n"
     "CMD on every rank, joined by a private WireGuard network, with MASTER_ADDR,\n"
     "MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set for\n"
     "PyTorch's env:// rendezvous. Without -f it returns once the ranks run and\n"
     "prints the training id (gpunet logs ID -f, gpunet stop ID).\n"
     "  --gpus N           GPUs in all, 1..64 (the world size)\n"
     "  --per-node K       GPUs per provider, 1..16, dividing N\n"
     "  --max-price P      most to pay per GPU-hour, like 0.50\n"
     "  --max-spend AMOUNT spending cap for the whole group, like 20.00, shared\n"
     "                     over the leases by their GPUs: each lease is capped as\n"
     "                     with rent --max-spend\n"
     "  --hours H          each lease's length (default 1)\n"
     "  --memory SIZE      each rank's memory limit, like 512M or 4G (K, M, G, T;\n"
     "                     plain numbers are MiB; 16M..1024G; default 2048M)\n"
     "  --output DIR       copy every rank's /output back into DIR/rank-R.tar at the end\n"
     "  --env K=V          set a variable on every rank (repeatable)\n"
     "  --restarts K       restart the group from its checkpoints up to K times\n"
     "                     when a rank fails or a provider goes (on a spare\n"
     "                     provider when needed; default 0: stop all)\n"
     "  --no-attest        do not challenge the providers' GPUs before the\n"
     "                     leases are signed (as rent --no-attest)\n"
     "  --allow-simulated  accept simulated GPUs\n"
     "  -f, --follow       follow the ranks' output, prefixed [rank R], the\n"
     "                     running cost and the total\n"
     "  --json             print the plan, and the result at the end, as JSON\n"
     "Exits 0 when every rank exited 0 (-f) or the ranks run; 1 when the group\n"
     "failed (each member's and rank's reason on stderr); 2 for a usage error.\n",
     &cli_train_opts},
    {"output", cmd_output, "copy a training job's /output now",
     "Usage: gpunet output TRAINID DIR [--rank R]\n"
     "Copies every rank's /output (or only rank R's), as its provider has it\n"
     "now, into DIR/rank-R.tar: while the ranks run (a checkpoint so far) or\n"
     "after they ended, while the group still holds its leases (state\n"
     "collecting: gpunet train --output DIR holds them 5 minutes after the\n"
     "ranks end, for this when it was not given -f). With --json, one\n"
     "object: the files and their sizes.\n"
     "Exits 0 when every rank's tar came whole, 1 otherwise, 2 for a usage error.\n",
     &cli_output_opts},
    {"jobs", cmd_jobs, "list jobs",
     "Usage: gpunet jobs\n"
     "Lists jobs and their states, and the ranks of training jobs. With\n"
     "--json: {\"jobs\": [...], \"trains\": [...]}, each training job as\n"
     "GET /v1/train/ID has it (its plan, members, ranks, cost).\n",
     NULL},
    {"logs", cmd_logs, "print a job's output",
     "Usage: gpunet logs JOB [-f|--follow]\n"
     "       gpunet logs TRAINID [--rank R] [-f|--follow]\n"
     "Prints the job's output so far; with -f keeps following it until the job\n"
     "ends, then exits with the job's exit code. For a training job, every\n"
     "rank's output with a [rank R] prefix, or only rank R's.\n",
     &cli_logs_opts},
    {"exec", cmd_exec, "run a command in a lease's sandbox, with a terminal if asked",
     "Usage: gpunet exec LEASE [-i] [-t] [--job JOB] [--env K=V]... -- CMD [ARGS...]\n"
     "Runs CMD inside a running job's sandbox on the lease (the newest running\n"
     "job of the lease, or JOB), as the job's user with its limits, its stdio\n"
     "carried over the lease's encrypted session. Signed by this node as the\n"
     "lease holder; billed as the lease is (it runs only while the lease does).\n"
     "  -i, --interactive  send stdin (without it the command's stdin is empty)\n"
     "  -t, --tty          a terminal for CMD; with a terminal here it is put in\n"
     "                     raw mode, its size follows, Ctrl-C goes to CMD\n"
     "  --job JOB          the job to run in\n"
     "  --env K=V          set a variable for CMD (repeatable)\n"
     "Without -t, SIGINT and SIGTERM are passed on to CMD. Exits with CMD's exit\n"
     "code (128+N when a signal N ended it); 125 when gpunet could not run it.\n",
     &cli_exec_opts},
    {"shell", cmd_shell, "an interactive shell in a lease's sandbox",
     "Usage: gpunet shell LEASE [--job JOB] [--image REF]\n"
     "Opens a login shell (bash if the image has it, else sh) with a terminal\n"
     "in the lease's newest running job, or JOB. With no running job (or with\n"
     "--image) it first starts a job on REF (default: the image of the lease's\n"
     "last job) that only keeps the sandbox up, and stops it when the shell\n"
     "ends. Exits with the shell's exit code; 125 when gpunet could not run it.\n",
     &cli_shell_opts},
    {"stop", cmd_stop, "stop a job",
     "Usage: gpunet stop JOB|TRAINID\n"
     "Stops a running job; for a training job, every rank, and releases its\n"
     "leases.\n",
     NULL},
    {"forward", cmd_forward, "reach a port inside a lease's sandbox from here",
     "Usage: gpunet forward LEASE [LOCAL_ADDR:]LOCAL_PORT:PORT [--job JOB]\n"
     "Listens on LOCAL_ADDR:LOCAL_PORT (default address 127.0.0.1; port 0 picks\n"
     "one) and carries each connection over the lease's session to 127.0.0.1:PORT\n"
     "inside the job's sandbox (Jupyter, TensorBoard, an inference server).\n"
     "Nothing is opened on the provider's host. Runs until Ctrl-C or the end of\n"
     "the lease. A non-loopback LOCAL_ADDR lets anyone who reaches it in.\n"
     "  --job JOB  the job to reach, when several run on the lease\n"
     "--json: the forward as POST /v1/forwards made it.\n",
     &cli_forward_opts},
    {"invoices", cmd_invoices, "list invoices",
     "Usage: gpunet invoices\n"
     "Lists the bills of this node's leases, as provider or requester: the\n"
     "final invoice, or the running bill of a lease not yet invoiced (its\n"
     "STATUS), its duration and total, and whether it is SETTLED (settled,\n"
     "pending, failed, or no: no final voucher went to the settlement driver).\n",
     NULL},
    {"invoice", cmd_invoice, "show, export or audit an invoice",
     "Usage: gpunet invoice show ID\n"
     "       gpunet invoice export ID --out FILE\n"
     "       gpunet invoice audit FILE [--full]\n"
     "show prints an invoice's summary (ID: an invoice or its lease); export\n"
     "writes the self-contained, signed invoice document (the agreement, every\n"
     "debit note and voucher, the final invoice and its answer) to FILE; audit\n"
     "re-verifies such a file with no daemon: every second's tick and the hash\n"
     "chain, every total, and the signatures that bind them (accepted debit\n"
     "notes before the last one are checked through their hash links; --full\n"
     "also verifies each of their signatures and vouchers one by one).\n"
     "audit exits 0: countersigned by the requester, and it all verifies;\n"
     "3: a provider-only claim (no countersigned final invoice; says what the\n"
     "requester's vouchers cover); 4: rejected by the requester (prints why);\n"
     "1: does not verify; 2: usage error, or FILE is not an invoice export.\n"
     "`gpunet invoice audit --help` says what each check covers.\n",
     &cli_invoice_opts},
    {"balance", cmd_balance, "show what peers owe this node and what it owes",
     "Usage: gpunet balance [--json] [--retry]\n"
     "Shows, per counterparty and currency, the sum of the highest payment\n"
     "voucher of each lease (signed by the requester with every debit note and\n"
     "final invoice it accepts): what a peer owes this node as provider, what\n"
     "this node owes as requester, how much is settled (the final voucher was\n"
     "taken by the settlement driver: settle_driver ledger or webhook) and how\n"
     "much is outstanding.\n"
     "--retry queues the settlements the driver refused for good (a webhook\n"
     "that answered 4xx) again, e.g. after the endpoint was fixed.\n",
     &cli_balance_opts},
    {"attest", cmd_attest, "challenge a provider's GPU",
     "Usage: gpunet attest OFFER|NODE\n"
     "Asks gpunetd to run the GPU attestation challenge against the provider\n"
     "of an offer, or a node, and prints the verdict.\n",
     NULL},
    {"completion", cmd_completion, "print a shell completion script",
     "Usage: gpunet completion bash\n"
     "Prints a bash completion script for gpunet, made from its own table of\n"
     "commands and options: it completes the commands, each command's\n"
     "options after --, invoice's subcommands, and the lease, job or invoice\n"
     "a command names first, asked of gpunetd as you press TAB. Load it in\n"
     "the running shell with\n"
     "  source <(gpunet completion bash)\n"
     "or install it for every shell:\n"
     "  gpunet completion bash > ~/.local/share/bash-completion/completions/gpunet\n",
     NULL},
};

const cli_cmd *cli_find_cmd(const char *name) {
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* Prints " --name" for each of cmd's long options (all of them, or only
 * those that take a value), --help left out. */
static void print_longs(const cli_cmd *cmd, bool values_only) {
  for (const struct option *l = cmd->opts ? cmd->opts->longs : NULL; l && l->name; l++)
    if (strcmp(l->name, "help") != 0 && (!values_only || l->has_arg == required_argument))
      printf(" --%s", l->name);
}

/* The bash completion function, written from the command table above and
 * each command's getopt_long options, so that it cannot fall behind them. */
/* `gpunet completion ids leases|jobs|invoices`, for the script's own use:
 * the ids to offer (the leases this node rents and are active, its jobs,
 * its invoices), one a line; nothing, and exit 0, when gpunetd does not
 * answer. */
static int completion_ids(cli *c, const char *kind) {
  const char *path = strcmp(kind, "leases") == 0     ? "/v1/leases"
                     : strcmp(kind, "jobs") == 0     ? "/v1/jobs"
                     : strcmp(kind, "invoices") == 0 ? "/v1/invoices"
                                                     : NULL;
  if (!path)
    return cli_usage_error("completion", "ids of leases, jobs or invoices, not '%.40s'", kind);
  json_t *j = NULL;
  c->quiet = true;
  if (cli_call(c, "GET", path, NULL, &j) != CLI_OK)
    return CLI_OK;
  size_t i, shown = 0;
  const json_t *o;
  json_array_foreach(json_object_get(j, kind), i, o) {
    const char *id = cli_str(o, "id"), *role = cli_str(o, "role"), *state = cli_str(o, "state");
    if (!id || (role && strcmp(role, "requester") != 0) ||
        (strcmp(kind, "leases") == 0 && state && strcmp(state, "active") != 0))
      continue;
    if (++shown > 500)
      break;
    printf("%s\n", id);
  }
  json_decref(j);
  return CLI_OK;
}

static int cmd_completion(cli *c, int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "ids") == 0)
    return completion_ids(c, argv[2]);
  int r = cli_simple_args(argc, argv, 1, "shell (bash)");
  if (r >= 0)
    return r;
  if (strcmp(argv[optind], "bash") != 0)
    return cli_usage_error(argv[0], "no completion for shell '%.40s' (only bash)", argv[optind]);
  printf("# bash completion for gpunet %s, written by `gpunet completion bash`\n"
         "# from its own command table.\n"
         "_gpunet() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd='' ci=0 i\n"
         "  local dd=()\n"
         "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
         "    case ${COMP_WORDS[i]} in\n"
         "    --) [[ -n $cmd ]] && return 0 ;; # the job's command follows\n"
         "    --data-dir)\n"
         "      [[ -z $cmd ]] && dd=(--data-dir \"${COMP_WORDS[i + 1]}\")\n"
         "      ((i++))\n"
         "      ;;\n"
         "    -*) ;;\n"
         "    *) [[ -z $cmd ]] && cmd=${COMP_WORDS[i]} && ci=$i ;;\n"
         "    esac\n"
         "  done\n"
         "  if [[ $prev == --data-dir ]]; then\n"
         "    COMPREPLY=($(compgen -d -- \"$cur\"))\n"
         "    return 0\n"
         "  fi\n"
         "  local commands=\"help",
         GN_CLI_VERSION);
  for (size_t i = 0; i < NCOMMANDS; i++)
    printf(" %s", commands[i].name);
  printf("\"\n"
         "  if [[ -z $cmd ]]; then\n"
         "    if [[ $cur == -* ]]; then\n"
         "      COMPREPLY=($(compgen -W \"--data-dir --json --version --help\" -- \"$cur\"))\n"
         "    else\n"
         "      COMPREPLY=($(compgen -W \"$commands\" -- \"$cur\"))\n"
         "    fi\n"
         "    return 0\n"
         "  fi\n"
         "  local flags='' values=''\n"
         "  case $cmd in\n"
         "  help)\n"
         "    COMPREPLY=($(compgen -W \"$commands\" -- \"$cur\"))\n"
         "    return 0\n"
         "    ;;\n");
  for (size_t i = 0; i < NCOMMANDS; i++) {
    if (!commands[i].opts)
      continue;
    printf("  %s)\n    flags=\"", commands[i].name);
    print_longs(&commands[i], false);
    printf("\"\n    values=\"");
    print_longs(&commands[i], true);
    printf("\"\n    ;;\n");
  }
  printf("  esac\n"
         "  # A value of an option: files (or nothing) by bash's default.\n"
         "  [[ -n $prev && \" $values \" == *\" $prev \"* ]] && return 0\n"
         "  # The first word after the command: ids from gpunetd, or a subcommand.\n"
         "  if [[ $cur != -* ]] && ((COMP_CWORD == ci + 1)); then\n"
         "    local kind=''\n"
         "    case $cmd in\n"
         "    exec | shell | forward | run | release) kind='leases' ;;\n"
         "    logs | stop) kind='jobs' ;;\n"
         "    invoice)\n"
         "      COMPREPLY=($(compgen -W \"show export audit\" -- \"$cur\"))\n"
         "      return 0\n"
         "      ;;\n"
         "    esac\n"
         "    if [[ -n $kind ]]; then\n"
         "      COMPREPLY=($(compgen -W \"$(\"${COMP_WORDS[0]}\" \"${dd[@]}\" completion ids \"$kind\" 2>/dev/null)\" "
         "-- \"$cur\"))\n"
         "      return 0\n"
         "    fi\n"
         "  fi\n"
         "  if [[ $cmd == invoice && $cur != -* ]] && ((COMP_CWORD == ci + 2)) &&\n"
         "    [[ ${COMP_WORDS[ci + 1]} == show || ${COMP_WORDS[ci + 1]} == export ]]; then\n"
         "    COMPREPLY=($(compgen -W \"$(\"${COMP_WORDS[0]}\" \"${dd[@]}\" completion ids invoices 2>/dev/null)\" -- "
         "\"$cur\"))\n"
         "    return 0\n"
         "  fi\n"
         "  if [[ $cur == -* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"$flags --help --json --data-dir\" -- \"$cur\"))\n"
         "  fi\n"
         "  return 0\n"
         "}\n"
         "complete -o default -F _gpunet gpunet\n");
  return CLI_OK;
}

static void print_help(FILE *out) {
  fprintf(out, "Usage: gpunet [--data-dir DIR] [--json] COMMAND [ARGS...]\n"
               "The gpunet command: find, rent and use GPUs on the gpunet marketplace\n"
               "through the local gpunetd.\n\n"
               "Commands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].help);
  fprintf(out, "\nOptions:\n"
               "  --data-dir DIR  gpunetd's data directory (default $XDG_DATA_HOME/gpunet,\n"
               "                  else ~/.local/share/gpunet); its socket is DIR/gpunetd.sock\n"
               "  --json          print JSON for scripts instead of tables\n"
               "  --version       print the version\n"
               "  (--data-dir, --json and --version may come before or after COMMAND,\n"
               "   but not after the \"--\" that starts a job's command)\n"
               "  -h, --help      this help; `gpunet COMMAND --help` for a command\n"
               "\nExit status: 0 done, 1 failed, 2 usage error (run -f and logs -f: the\n"
               "job's exit code); invoice audit: 0 countersigned and verified, 3 a\n"
               "provider-only claim, 4 rejected by the requester, 1 does not verify.\n");
}

static int usage_global(const char *fmt, const char *arg) {
  fputs("gpunet: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs(" (see gpunet help)\n", stderr);
  return CLI_USAGE;
}

enum { GLOBAL_NO = -1, GLOBAL_TAKEN = -2 };

/* Handles argv[*i] if it is a global option (advancing *i past its value):
 * GLOBAL_TAKEN, GLOBAL_NO if it is not one, or an exit code (--version, a
 * bad value). */
static int global_option(cli *c, int argc, char **argv, int *i, bool *have_dir) {
  const char *a = argv[*i];
  if (strcmp(a, "--json") == 0) {
    c->json = true;
    return GLOBAL_TAKEN;
  }
  if (strcmp(a, "--data-dir") == 0 || strncmp(a, "--data-dir=", 11) == 0) {
    const char *v = a[10] == '=' ? a + 11 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (!v || !v[0])
      return usage_global("option '%s' needs a directory", "--data-dir");
    if (strlen(v) >= sizeof(c->data_dir))
      return usage_global("data directory '%.80s' is too long", v);
    snprintf(c->data_dir, sizeof(c->data_dir), "%s", v);
    *have_dir = true;
    return GLOBAL_TAKEN;
  }
  if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
    printf("gpunet %s\n", GN_CLI_VERSION);
    return CLI_OK;
  }
  return GLOBAL_NO;
}

/* Whether argument a, an option of cmd, takes the next argument as its
 * value (so that value is never read as a global option: `--image --json`
 * names an image), read from cmd's getopt_long table the way getopt_long
 * reads it: a long option by its exact name or an unambiguous prefix, a
 * cluster of short ones (-fe) up to the first that takes a value. */
static bool value_follows(const cli_cmd *cmd, const char *a) {
  const cli_opts *o = cmd->opts;
  if (!o || a[0] != '-' || !a[1])
    return false;
  if (a[1] == '-') {
    const char *name = a + 2;
    size_t len = strlen(name);
    if (!len || strchr(name, '=')) /* "--" itself, or --name=value */
      return false;
    const struct option *hit = NULL;
    bool ambiguous = false;
    for (const struct option *l = o->longs; l->name; l++) {
      if (strcmp(l->name, name) == 0)
        return l->has_arg == required_argument;
      if (strncmp(l->name, name, len) != 0)
        continue;
      if (hit && (hit->has_arg != l->has_arg || hit->flag != l->flag || hit->val != l->val))
        ambiguous = true; /* getopt_long refuses it: no value is taken */
      if (!hit)
        hit = l;
    }
    return hit && !ambiguous && hit->has_arg == required_argument;
  }
  /* The first value option of a cluster takes the rest of the word, or the
   * next argument when it ends the word. */
  for (const char *p = a + 1; *p; p++) {
    const char *s = *p == ':' ? NULL : strchr(o->shorts, *p);
    if (s && s[1] == ':')
      return p[1] == 0;
  }
  return false;
}

int main(int argc, char **argv) {
  cli c;
  memset(&c, 0, sizeof(c));
  bool have_dir = false;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    int r = global_option(&c, argc, argv, &i, &have_dir);
    if (r == GLOBAL_TAKEN)
      continue;
    if (r >= 0)
      return r;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      print_help(stdout);
      return CLI_OK;
    }
    return usage_global("unknown option '%s'", a);
  }
  if (i == argc) {
    print_help(stderr);
    return CLI_USAGE;
  }
  const char *name = argv[i];
  if (strcmp(name, "help") == 0) {
    if (i + 1 < argc) {
      const cli_cmd *cmd = cli_find_cmd(argv[i + 1]);
      if (!cmd)
        return usage_global("unknown command '%s'", argv[i + 1]);
      return cli_print_usage(cmd);
    }
    print_help(stdout);
    return CLI_OK;
  }
  const cli_cmd *cmd = cli_find_cmd(name);
  if (!cmd)
    return usage_global("unknown command '%s'", name);
  /* Global options may follow the command too (`gpunet init --data-dir D`):
   * they are taken out here, up to a "--" after which everything is the
   * job's; the command parses what is left. */
  char **args = calloc((size_t)(argc - i + 1), sizeof(*args));
  if (!args)
    return cli_fail("out of memory");
  int nargs = 0;
  args[nargs++] = argv[i];
  for (int k = i + 1; k < argc; k++) {
    if (strcmp(argv[k], "--") == 0) {
      while (k < argc)
        args[nargs++] = argv[k++];
      break;
    }
    int r = global_option(&c, argc, argv, &k, &have_dir);
    if (r == GLOBAL_TAKEN)
      continue;
    if (r >= 0) {
      free(args);
      return r;
    }
    args[nargs++] = argv[k];
    /* A "--" is never taken as a value: the job's command follows it. */
    if (value_follows(cmd, argv[k]) && k + 1 < argc && strcmp(argv[k + 1], "--") != 0)
      args[nargs++] = argv[++k];
  }
  args[nargs] = NULL;
  int r = CLI_FAIL;
  if (!have_dir && gn_data_dir_default(c.data_dir, sizeof(c.data_dir)) < 0) {
    r = cli_fail("no data directory: set HOME or XDG_DATA_HOME, or pass --data-dir DIR");
  } else {
    snprintf(c.sock, sizeof(c.sock), "%s/gpunetd.sock", c.data_dir);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    r = cmd->fn(&c, nargs, args);
    curl_global_cleanup();
  }
  free(args);
  return r;
}
