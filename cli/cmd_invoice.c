/* gpunet commands for invoices: list, show and export through gpunetd, and the
 * daemon-free audit of an exported invoice file. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Exports of very long leases are large, but not this large. */
#define CLI_MAX_INVOICE_FILE (1024ll * 1024 * 1024)

static void invoice_row(cli_table *t, const json_t *inv, size_t i) {
  (void)i;
  char dur[24], total[64], created[32];
  cli_fmt_duration(cli_int(inv, "seconds", 0), dur, sizeof(dur));
  cli_fmt_money((uint64_t)cli_int(inv, "total_micro", 0), cli_str(inv, "currency"), total, sizeof(total));
  cli_fmt_time(cli_int(inv, "created_s", 0), created, sizeof(created));
  /* settle: "settled", "pending", "failed" or "no" (no final voucher queued). */
  const char *settled = cli_str(inv, "settled");
  if (settled && strcmp(settled, "none") == 0)
    settled = "no";
  const char *row[] = {cli_str(inv, "id"),
                       cli_str(inv, "lease"),
                       cli_str(inv, "role"),
                       cli_str(inv, "status"),
                       dur,
                       total,
                       settled,
                       created};
  cli_table_row(t, row);
}

int cmd_invoices(cli *c, int argc, char **argv) {
  static const char *const hdr[] = {"INVOICE", "LEASE", "ROLE", "STATUS", "DURATION", "TOTAL", "SETTLED", "CREATED"};
  static const cli_list_spec spec = {"invoices", "no invoices yet (a lease is invoiced when it ends)", 8, hdr,
                                     invoice_row};
  int r = cli_simple_args(argc, argv, 0, "");
  return r >= 0 ? r : cli_list(c, "/v1/invoices", &spec);
}

/* n with thousands separators: 4442 -> "4,442". */
static void fmt_grouped(uint64_t n, char *buf, size_t cap) {
  char digits[24];
  size_t len = (size_t)snprintf(digits, sizeof(digits), "%llu", (unsigned long long)n), o = 0;
  for (size_t i = 0; i < len && o + 2 < cap; i++) {
    if (i && (len - i) % 3 == 0)
      buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = '\0';
}

/* The invoice's energy claim in words: "1.234 kWh (4,442 kJ) over 3600
 * GPU-seconds", flagged when no GPU could have drawn it; "not measured (no
 * power reading)" when the invoice states none (simulated GPUs, no NVML),
 * which is not 0. --json keeps the exact integers (energy_mj,
 * energy_measured_s, energy_plausible). */
static void fmt_energy(const json_t *inv, char *buf, size_t cap) {
  const json_t *mj = json_object_get(inv, "energy_mj"), *s = json_object_get(inv, "energy_measured_s");
  if (!json_is_integer(mj) || !json_is_integer(s) || json_integer_value(mj) < 0 || json_integer_value(s) < 1) {
    snprintf(buf, cap, "not measured (no power reading)");
    return;
  }
  const uint64_t e = (uint64_t)json_integer_value(mj);
  const uint64_t gpus = json_integer_value(json_object_get(inv, "gpus")) > 0
                            ? (uint64_t)json_integer_value(json_object_get(inv, "gpus"))
                            : 1;
  const uint64_t mkwh = e / 3600000u; /* 1 kWh = 3.6e9 mJ: thousandths of a kWh */
  char kj[32];
  fmt_grouped(e / 1000000u, kj, sizeof(kj));
  snprintf(buf, cap, "%llu.%03llu kWh (%s kJ) over %llu GPU-seconds%s", (unsigned long long)(mkwh / 1000),
           (unsigned long long)(mkwh % 1000), kj, (unsigned long long)json_integer_value(s) * gpus,
           json_is_false(json_object_get(inv, "energy_plausible"))
               ? " (IMPLAUSIBLE: more than 2000 W per GPU, or more seconds than the lease)"
               : "");
}

static void show_invoice(const json_t *j, const void *ctx) {
  (void)ctx;
  const json_t *inv = json_is_object(json_object_get(j, "invoice")) ? json_object_get(j, "invoice") : j;
  json_t *o = json_deep_copy(inv);
  if (!o) {
    cli_print_fields(inv);
    return;
  }
  char energy[160];
  fmt_energy(inv, energy, sizeof(energy));
  json_object_del(o, "energy_mj");
  json_object_del(o, "energy_measured_s");
  json_object_del(o, "energy_plausible");
  json_object_set_new(o, "energy", json_string(energy));
  cli_print_fields(o);
  json_decref(o);
}

static int invoice_show(cli *c, const char *id) {
  char *path = cli_path("/v1/invoices", id, "");
  if (!path)
    return cli_fail("out of memory");
  int r = cli_show(c, "GET", path, NULL, show_invoice, NULL);
  free(path);
  return r;
}

static int invoice_export(cli *c, const char *id, const char *out) {
  char *path = cli_path("/v1/invoices", id, "/export");
  if (!path)
    return cli_fail("out of memory");
  char *data = NULL;
  size_t len = 0;
  int r = cli_call_raw(c, "GET", path, NULL, &data, &len);
  free(path);
  if (r != CLI_OK)
    return r;
  /* Written as received: the document is the daemon's, byte for byte. */
  int w = cli_write_atomic(out, data, len, 0644);
  free(data);
  if (w < 0)
    return cli_fail("cannot write %s: %s", out, strerror(-w));
  if (c->json) {
    cli_print_json_new(json_pack("{s:s, s:s, s:I}", "invoice", id, "path", out, "bytes", (json_int_t)len));
  } else {
    printf("%s\n", out);
  }
  return CLI_OK;
}

/* The verdicts of notes/billing2.md and their exit codes (audit_usage lists
 * them): 0 countersigned, 3 a provider-only claim, 4 rejected by the
 * requester, 1 (CLI_FAIL) does not verify, 2 (CLI_USAGE) not an export,
 * unreadable, or a usage error. */
static const char *verdict_name(gn_bill_verdict v) {
  switch (v) {
  case GN_BILL_COUNTERSIGNED:
    return "countersigned";
  case GN_BILL_PROVIDER_ONLY:
    return "provider-only";
  case GN_BILL_REJECTED:
    return "rejected";
  default:
    return "invalid";
  }
}

static int audit_exit(gn_bill_verdict v) {
  switch (v) {
  case GN_BILL_COUNTERSIGNED:
    return 0;
  case GN_BILL_PROVIDER_ONLY:
    return 3;
  case GN_BILL_REJECTED:
    return 4;
  default:
    return CLI_FAIL;
  }
}

static int audit_unreadable(cli *c, const char *reason) {
  if (c->json)
    cli_print_json_new(json_pack("{s:b, s:s, s:s}", "ok", 0, "verdict", "not-an-export", "reason", reason));
  else
    printf("audit FAILED: %s\n", reason);
  return CLI_USAGE;
}

/* Reads a whole regular file of at most CLI_MAX_INVOICE_FILE bytes (one
 * read into memory, then json_loadb: jansson's file reader takes a byte at a
 * time, a third of the audit of a 44 MB export). NULL and a reason if not. */
static char *read_export(const char *file, size_t *ret_len, char *reason, size_t cap) {
  struct stat st;
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(reason, cap, "cannot read %s: %s", file, strerror(errno));
    return NULL;
  }
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > CLI_MAX_INVOICE_FILE) {
    snprintf(reason, cap, "%s is not a regular file of at most 1 GiB", file);
    close(fd);
    return NULL;
  }
  size_t len = (size_t)st.st_size, off = 0;
  char *buf = malloc(len ? len : 1);
  if (!buf) {
    snprintf(reason, cap, "%s: out of memory for %zu bytes", file, len);
    close(fd);
    return NULL;
  }
  while (off < len) {
    ssize_t n = read(fd, buf + off, len - off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      snprintf(reason, cap, "cannot read %s: %s", file, n < 0 ? strerror(errno) : "it shrank while being read");
      free(buf);
      close(fd);
      return NULL;
    }
    off += (size_t)n;
  }
  close(fd);
  *ret_len = len;
  return buf;
}

static int invoice_audit(cli *c, const char *file, unsigned flags) {
  char reason[512] = "";
  size_t len = 0;
  char *text = read_export(file, &len, reason, sizeof(reason));
  if (!text)
    return audit_unreadable(c, reason);
  json_error_t jerr;
  json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (!doc) {
    snprintf(reason, sizeof(reason), "%s is not a gpunet invoice export: not JSON (line %d: %s)", file, jerr.line,
             jerr.text);
    return audit_unreadable(c, reason);
  }
  gn_bill_audit *a = calloc(1, sizeof(*a));
  if (!a) {
    json_decref(doc);
    return cli_fail("out of memory");
  }
  int r = gn_invoice_audit_json_flags(doc, flags, a);
  json_decref(doc);
  if (r == GN_EINVAL || r == GN_ENOMEM) {
    int ret = r == GN_ENOMEM ? cli_fail("out of memory") : audit_unreadable(c, a->reason[0] ? a->reason : file);
    free(a);
    return ret;
  }
  const gn_invoice_summary *s = &a->summary;
  char prov[GN_NODE_ID_STRLEN], req[GN_NODE_ID_STRLEN], price[64], total[64], vtotal[64], start[32], end[32], dur[24];
  gn_node_id_format(s->provider, prov);
  gn_node_id_format(s->requester, req);
  cli_fmt_price(s->price_uper_hour, s->currency, price, sizeof(price));
  cli_fmt_money(s->total_micro, s->currency, total, sizeof(total));
  cli_fmt_money(a->voucher_total_micro, s->currency, vtotal, sizeof(vtotal));
  cli_fmt_time(s->start_s, start, sizeof(start));
  cli_fmt_time(s->end_s, end, sizeof(end));
  cli_fmt_duration((int64_t)s->seconds, dur, sizeof(dur));
  int code = audit_exit(a->verdict);
  if (c->json) {
    cli_print_json_new(json_pack(
        "{s:b, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:s, s:I, s:I, s:I, s:I, s:b, s:I, "
        "s:I, s:I, s:I, s:b}",
        "ok", a->verdict == GN_BILL_COUNTERSIGNED, "verdict", verdict_name(a->verdict), "reason", a->reason, "lease_id",
        s->lease_id, "provider", prov, "requester", req, "gpu_model", s->gpu_model, "gpus", (int)s->gpus,
        "price_uper_hour", (json_int_t)s->price_uper_hour, "currency", s->currency, "seconds", (json_int_t)s->seconds,
        "total_micro", (json_int_t)s->total_micro, "start_s", (json_int_t)s->start_s, "end_s", (json_int_t)s->end_s,
        "countersigned", a->verdict == GN_BILL_COUNTERSIGNED, "notes", (json_int_t)a->notes, "notes_accepted",
        (json_int_t)a->notes_accepted, "voucher_seconds", (json_int_t)a->voucher_seconds, "voucher_total_micro",
        (json_int_t)a->voucher_total_micro, "has_invoice", a->has_invoice));
    free(a);
    return code;
  }
  switch (a->verdict) {
  case GN_BILL_COUNTERSIGNED:
    printf("audit OK: invoice %s for lease %s, countersigned by the requester\n", s->invoice_id, s->lease_id);
    break;
  case GN_BILL_PROVIDER_ONLY:
    printf("audit: PROVIDER-ONLY CLAIM for lease %s: %s\n", s->lease_id, a->reason);
    break;
  case GN_BILL_REJECTED:
    printf("audit: REJECTED by the requester: invoice %s for lease %s: %s\n", s->invoice_id, s->lease_id, a->reason);
    break;
  default:
    printf("audit FAILED: %s\n", a->reason);
    free(a);
    return code;
  }
  printf("  provider   %s\n", prov);
  printf("  requester  %s\n", req);
  printf("  gpus       %ux %s\n", s->gpus, s->gpu_model);
  if (a->has_invoice)
    printf("  period     %s .. %s (%s)\n", start, end, a->end_reason);
  printf("  seconds    %llu (%s)\n", (unsigned long long)s->seconds, dur);
  printf("  price      %s per GPU\n", price);
  printf("  total      %s%s\n", total, a->has_invoice ? "" : " (last debit note)");
  printf("  notes      %llu, %llu accepted\n", (unsigned long long)a->notes, (unsigned long long)a->notes_accepted);
  printf("  vouchers   the requester's signed vouchers cover %llu s, %s\n", (unsigned long long)a->voucher_seconds,
         vtotal);
  free(a);
  return code;
}

static const char audit_usage[] = "Usage: gpunet invoice audit FILE [--full] [--json]\n"
                                  "Verifies an invoice file written by `gpunet invoice export`, with no\n"
                                  "daemon: the hash chain of every billed second, every total (an overflow is\n"
                                  "an error), the lease's window and limits, the summary, and the signatures\n"
                                  "that bind them.\n"
                                  "By default the accepted debit notes before the last one, and their\n"
                                  "vouchers, are checked through their hash links: each note's bytes, its\n"
                                  "signature included, are hashed into the next note, up to the last note and\n"
                                  "the final invoice, whose signatures are checked, as are the requester's\n"
                                  "cumulative voucher and countersignature over them. A changed superseded\n"
                                  "note breaks the links and a superseded voucher is covered by the later\n"
                                  "ones: every second is bound to checked signatures of both parties, and a\n"
                                  "forged superseded signature cannot change a second, a total or the verdict.\n"
                                  "  --full    also check each superseded note's and voucher's own signature\n"
                                  "            (forensics: a broken one makes the file invalid; a 30-day lease\n"
                                  "            billed every minute has 86,400 signatures)\n"
                                  "  --json    print the verdict and the figures as JSON\n"
                                  "  --linked  the default (accepted for compatibility)\n"
                                  "Exit status:\n"
                                  "  0  a final invoice countersigned by the requester, and it all verifies\n"
                                  "  3  a provider-only claim: no final invoice, or not countersigned (says\n"
                                  "     what the requester's signed vouchers cover)\n"
                                  "  4  the requester rejected the final invoice (prints why)\n"
                                  "  1  the file does not verify (names the first problem)\n"
                                  "  2  usage error, or FILE is unreadable or not an invoice export\n";

static const struct option invoice_longs[] = {{"out", required_argument, NULL, 'o'},
                                              {"full", no_argument, NULL, 'f'},
                                              {"linked", no_argument, NULL, 'l'},
                                              {"help", no_argument, NULL, 'h'},
                                              {0}};
const cli_opts cli_invoice_opts = {":ho:", invoice_longs};

int cmd_invoice(cli *c, int argc, char **argv) {
  const char *out = NULL;
  bool full = false, linked = false, help = false;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_invoice_opts.shorts, cli_invoice_opts.longs, NULL)) != -1) {
    if (o == 'o')
      out = optarg;
    else if (o == 'f')
      full = true;
    else if (o == 'l')
      linked = true; /* the default since the linked audit became it */
    else if (o == 'h')
      help = true;
    else
      return cli_bad_option("invoice", o, argv);
  }
  if (help) {
    if (optind < argc && strcmp(argv[optind], "audit") == 0) {
      fputs(audit_usage, stdout);
      return CLI_OK;
    }
    return cli_print_usage(cli_find_cmd("invoice"));
  }
  if (optind >= argc)
    return cli_usage_error("invoice", "missing a subcommand: show, export or audit");
  const char *sub = argv[optind];
  const char *what = strcmp(sub, "audit") == 0 ? "FILE" : "invoice ID";
  if (strcmp(sub, "show") && strcmp(sub, "export") && strcmp(sub, "audit"))
    return cli_usage_error("invoice", "unknown subcommand '%s' (show, export or audit)", sub);
  if (optind + 1 >= argc)
    return cli_usage_error("invoice", "%s: missing %s", sub, what);
  if (optind + 2 < argc)
    return cli_usage_error("invoice", "%s: unexpected argument '%s'", sub, argv[optind + 2]);
  const char *arg = argv[optind + 1];
  if (out && strcmp(sub, "export") != 0)
    return cli_usage_error("invoice", "--out only applies to export");
  if ((full || linked) && strcmp(sub, "audit") != 0)
    return cli_usage_error("invoice", "--%s only applies to audit", full ? "full" : "linked");
  if (full && linked)
    return cli_usage_error("invoice", "audit: --full and --linked exclude each other (linked is the default)");
  int ir = strcmp(sub, "audit") != 0 ? cli_check_id("invoice", "invoice or lease", arg) : -1;
  if (ir >= 0)
    return ir;
  if (strcmp(sub, "show") == 0)
    return invoice_show(c, arg);
  if (strcmp(sub, "export") == 0) {
    if (!out)
      return cli_usage_error("invoice", "export: missing --out FILE");
    return invoice_export(c, arg, out);
  }
  return invoice_audit(c, arg, full ? GN_BILL_AUDIT_FULL : 0);
}
