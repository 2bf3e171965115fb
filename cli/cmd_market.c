/* gpunet commands of the market: offers, rent, leases and release. */
#include "cli.h"
#include "progress.h"

#include <getopt.h>
#include <gpunet/billing.h>
#include <gpunet/filter.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void offer_row(cli_table *t, const json_t *of, size_t i) {
  (void)i;
  char prov[64], vram[32], freec[32], price[64], maxh[32], exp[32], training[32];
  cli_fmt_node(cli_str(of, "provider"), prov, sizeof(prov));
  snprintf(vram, sizeof(vram), "%lld GiB", (long long)llround((double)cli_int(of, "vram_mib", 0) / 1024.0));
  snprintf(freec, sizeof(freec), "%lld/%lld", (long long)cli_int(of, "gpus_free", 0),
           (long long)cli_int(of, "gpus_total", 0));
  cli_fmt_price((uint64_t)cli_int(of, "price_uper_hour", 0), cli_str(of, "currency"), price, sizeof(price));
  snprintf(maxh, sizeof(maxh), "%lldh", (long long)cli_int(of, "max_hours", 0));
  int64_t left = cli_int(of, "expires_s", 0) - (int64_t)time(NULL);
  if (left > 0) {
    char d[24];
    cli_fmt_duration(left, d, sizeof(d));
    snprintf(exp, sizeof(exp), "in %s", d);
  } else {
    snprintf(exp, sizeof(exp), "expired");
  }
  /* What the provider's signed offer says its jobs go without. */
  bool no_userns = cli_bool(of, "no_userns"), no_limits = cli_bool(of, "unenforced_limits");
  const char *isolation = no_userns && no_limits ? "NO-USERNS,NO-LIMITS"
                          : no_userns            ? "NO-USERNS"
                          : no_limits            ? "NO-LIMITS"
                                                 : "full";
  /* Whether it takes ranks of gpunet train jobs, and their UDP ports ("-":
   * a gpunetd that does not say). */
  const json_t *tr = json_object_get(of, "training"), *ports = json_object_get(of, "jobnet_ports");
  if (!json_is_boolean(tr))
    snprintf(training, sizeof(training), "-");
  else if (!json_is_true(tr))
    snprintf(training, sizeof(training), "no");
  else if (json_is_integer(json_array_get(ports, 0)) && json_is_integer(json_array_get(ports, 1)))
    snprintf(training, sizeof(training), "yes %lld-%lld", (long long)json_integer_value(json_array_get(ports, 0)),
             (long long)json_integer_value(json_array_get(ports, 1)));
  else
    snprintf(training, sizeof(training), "yes");
  const char *row[] = {cli_str(of, "id"),
                       prov,
                       cli_str(of, "gpu_model"),
                       vram,
                       freec,
                       price,
                       maxh,
                       cli_bool(of, "simulated") ? "SIMULATED" : "real",
                       isolation,
                       training,
                       exp};
  cli_table_row(t, row);
}

static const struct option offers_longs[] = {
    {"sort", required_argument, NULL, 's'}, {"help", no_argument, NULL, 'h'}, {0}};
const cli_opts cli_offers_opts = {":h", offers_longs};

int cmd_offers(cli *c, int argc, char **argv) {
  const char *sort = NULL;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_offers_opts.shorts, cli_offers_opts.longs, NULL)) != -1) {
    if (o == 's')
      sort = optarg;
    else if (o == 'h')
      return cli_print_usage(cli_find_cmd("offers"));
    else
      return cli_bad_option("offers", o, argv);
  }
  if (sort && strcmp(sort, "price") && strcmp(sort, "vram") && strcmp(sort, "count"))
    return cli_usage_error("offers", "cannot sort by '%s' (price, vram or count)", sort);
  /* The filter may come as one quoted argument or as several words. */
  char filter[GN_FILTER_MAX_LEN + 1] = "";
  for (int i = optind; i < argc; i++) {
    size_t have = strlen(filter);
    if (have + strlen(argv[i]) + 2 > sizeof(filter))
      return cli_usage_error("offers", "filter longer than %d bytes", GN_FILTER_MAX_LEN);
    if (have)
      filter[have++] = ' ';
    memcpy(filter + have, argv[i], strlen(argv[i]) + 1); /* fits: checked above */
  }
  gn_filter f;
  char err[256];
  if (gn_filter_parse(filter, &f, err, sizeof(err)) < 0)
    return cli_usage_error("offers", "%s", err);
  char path[4096] = "/v1/offers";
  char *ef = filter[0] ? cli_urlencode(filter) : NULL;
  if (filter[0] && !ef)
    return cli_fail("out of memory");
  snprintf(path, sizeof(path), "/v1/offers%s%s%s%s", ef || sort ? "?" : "", ef ? "filter=" : "", ef ? ef : "",
           sort ? (ef ? "&sort=" : "sort=") : "");
  if (sort)
    strncat(path, sort, sizeof(path) - strlen(path) - 1);
  free(ef);
  char empty[sizeof(filter) + 64];
  if (filter[0])
    snprintf(empty, sizeof(empty), "no offers match '%s'", filter);
  else
    snprintf(empty, sizeof(empty), "no offers known yet (is this node connected? see gpunet peers)");
  static const char *const hdr[] = {"OFFER", "PROVIDER", "GPU",       "VRAM",     "FREE",   "PRICE",
                                    "MAX",   "KIND",     "ISOLATION", "TRAINING", "EXPIRES"};
  const cli_list_spec spec = {"offers", empty, GN_ARRAY_SIZE(hdr), hdr, offer_row};
  return cli_list(c, path, &spec);
}

/* One line about a lease, as rent and release print it. */
static void print_lease_line(const json_t *l, const char *verb) {
  char peer[64], price[64], ends[32], cost[64], dur[24];
  cli_fmt_node(cli_str(l, "peer"), peer, sizeof(peer));
  cli_fmt_price((uint64_t)cli_int(l, "price_uper_hour", 0), cli_str(l, "currency"), price, sizeof(price));
  cli_fmt_time(cli_int(l, "ends_s", 0), ends, sizeof(ends));
  cli_fmt_money((uint64_t)cli_int(l, "cost_micro", 0), cli_str(l, "currency"), cost, sizeof(cost));
  cli_fmt_duration(cli_int(l, "seconds", 0), dur, sizeof(dur));
  const char *model = cli_str(l, "gpu_model");
  printf("lease %s %s: %lldx %s %s %s at %s\n", cli_str(l, "id") ? cli_str(l, "id") : "?", verb,
         (long long)cli_int(l, "count", 1), model ? model : "GPU",
         strcmp(cli_str(l, "role") ? cli_str(l, "role") : "", "provider") == 0 ? "to" : "from", peer, price);
  if (cli_bool(l, "simulated"))
    printf("  SIMULATED GPU: no real hardware behind this lease\n");
  if (strcmp(verb, "active") == 0) {
    printf("  ends by %s unless released earlier (gpunet release %s)\n", ends,
           cli_str(l, "id") ? cli_str(l, "id") : "");
    if (cli_int(l, "interval_s", 0) > 0)
      printf("  a debit note to countersign every %llds\n", (long long)cli_int(l, "interval_s", 0));
    if (cli_int(l, "max_spend_micro", 0) > 0) {
      char cap[64];
      cli_fmt_money((uint64_t)cli_int(l, "max_spend_micro", 0), cli_str(l, "currency"), cap, sizeof(cap));
      printf("  spending cap %s: the lease is released before its bill can pass it\n", cap);
    }
  } else
    printf("  ran %s, cost %s%s%s\n", dur, cost, cli_str(l, "ended_reason") ? ", ended: " : "",
           cli_str(l, "ended_reason") ? cli_str(l, "ended_reason") : "");
}

static void show_rented(const json_t *j, const void *ctx) {
  (void)ctx;
  print_lease_line(json_object_get(j, "lease"), "active");
}

static const struct option rent_longs[] = {{"gpu", required_argument, NULL, 'g'},
                                           {"hours", required_argument, NULL, 'H'},
                                           {"count", required_argument, NULL, 'n'},
                                           {"allow-simulated", no_argument, NULL, 'S'},
                                           {"no-attest", no_argument, NULL, 'A'},
                                           {"max-price", required_argument, NULL, 'P'},
                                           {"max-spend", required_argument, NULL, 'M'},
                                           {"interval", required_argument, NULL, 'I'},
                                           {"wait", required_argument, NULL, 'W'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
const cli_opts cli_rent_opts = {":hn:", rent_longs};

/* rent --wait: polls the offer table (the daemon matches MODEL with the
 * same filter as the rent) until an offer that the rent would take is
 * there, with progress, or wait_s pass. */
static int wait_for_offer(cli *c, const char *model, uint64_t count, bool allow_sim, uint64_t max_price, long wait_s) {
  char spec[GN_FILTER_MAX_LEN + 1], err[256];
  gn_filter f;
  snprintf(spec, sizeof spec, "gpu=%s", model);
  if (gn_filter_parse(spec, &f, err, sizeof err) < 0)
    return cli_usage_error("rent", "--gpu: %s", err);
  char *ef = cli_urlencode(spec), path[GN_FILTER_MAX_LEN * 3 + 32];
  if (!ef)
    return cli_fail("out of memory");
  snprintf(path, sizeof path, "/v1/offers?filter=%s", ef);
  free(ef);
  char label[160];
  snprintf(label, sizeof label, "Waiting for an offer of %s", model);
  cli_progress *p =
      cli_progress_start(cli_progress_mode_for(c->json), "offers", label, CLI_PROGRESS_NONE, 0, NULL, NULL);
  uint64_t end = cli_mono_ms() + (uint64_t)wait_s * 1000u;
  size_t seen = 0;
  for (;;) {
    json_t *j;
    int r = cli_call(c, "GET", path, NULL, &j);
    if (r != CLI_OK) {
      cli_progress_end(p, false, "cannot read the offer table");
      return r;
    }
    size_t i, fit = 0;
    const json_t *of;
    seen = json_array_size(json_object_get(j, "offers"));
    json_array_foreach(json_object_get(j, "offers"), i, of) {
      if (!cli_bool(of, "own") && (uint64_t)cli_int(of, "gpus_free", 0) >= count &&
          (allow_sim || !cli_bool(of, "simulated")) &&
          (!max_price || (uint64_t)cli_int(of, "price_uper_hour", 0) <= max_price))
        fit++;
    }
    json_decref(j);
    char detail[96];
    snprintf(detail, sizeof detail, "%zu offer%s of %s, %zu that fit%s", seen, seen == 1 ? "" : "s", model, fit,
             fit == 1 ? "s" : "");
    if (fit) {
      cli_progress_end(p, true, detail);
      return CLI_OK;
    }
    if (cli_mono_ms() >= end) {
      cli_progress_end(p, false, detail);
      return cli_fail("no offer of %s (%llu free GPU%s%s%s) reached this node within %ld s (%zu offer%s of it seen)",
                      model, (unsigned long long)count, count == 1 ? "" : "s", allow_sim ? "" : ", not simulated",
                      max_price ? ", within --max-price" : "", wait_s, seen, seen == 1 ? "" : "s");
    }
    cli_progress_update(p, 0, 0, detail);
    usleep(500 * 1000);
  }
}

int cmd_rent(cli *c, int argc, char **argv) {
  const char *gpu = NULL, *hours_s = NULL;
  long count = 1, interval_s = 0, wait_s = 0;
  uint64_t max_price = 0, max_spend = 0;
  bool allow_sim = false, attest = true;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_rent_opts.shorts, cli_rent_opts.longs, NULL)) != -1) {
    char *end;
    switch (o) {
    case 'g':
      gpu = optarg;
      break;
    case 'H':
      hours_s = optarg;
      break;
    case 'n':
      count = strtol(optarg, &end, 10);
      if (*end || end == optarg || count < 1 || count > 16)
        return cli_usage_error("rent", "--count wants a number of GPUs from 1 to 16, not '%s'", optarg);
      break;
    case 'S':
      allow_sim = true;
      break;
    case 'A':
      attest = false;
      break;
    case 'P':
      if (gn_price_parse(optarg, &max_price) < 0 || max_price == 0)
        return cli_usage_error("rent",
                               "--max-price wants the most to pay per GPU-hour, like 0.50 (at most 6 decimals), "
                               "not '%s'",
                               optarg);
      break;
    case 'M':
      if (gn_price_parse(optarg, &max_spend) < 0 || max_spend == 0)
        return cli_usage_error("rent",
                               "--max-spend wants the most to pay for the whole lease, like 2.50 (at most 6 "
                               "decimals), not '%s'",
                               optarg);
      break;
    case 'I':
      interval_s = strtol(optarg, &end, 10);
      if (*end || end == optarg || interval_s < 1 || interval_s > 86400)
        return cli_usage_error("rent", "--interval wants the seconds between debit notes, 1 to 86400, not '%s'",
                               optarg);
      break;
    case 'W':
      wait_s = strtol(optarg, &end, 10);
      if (*end || end == optarg || wait_s < 1 || wait_s > 3600)
        return cli_usage_error("rent", "--wait wants the seconds to wait for an offer, 1 to 3600, not '%s'", optarg);
      break;
    case 'h':
      return cli_print_usage(cli_find_cmd("rent"));
    default:
      return cli_bad_option("rent", o, argv);
    }
  }
  const char *offer = optind < argc ? argv[optind] : NULL;
  if (optind + 1 < argc)
    return cli_usage_error("rent", "unexpected argument '%s'", argv[optind + 1]);
  if (!offer == !gpu)
    return cli_usage_error("rent", "name an OFFER or --gpu MODEL (one of the two)");
  int ir = offer ? cli_check_id("rent", "offer", offer) : -1;
  if (ir >= 0)
    return ir;
  if (!hours_s)
    return cli_usage_error("rent", "missing --hours H");
  if (wait_s && !gpu)
    return cli_usage_error("rent", "--wait goes with --gpu MODEL (an OFFER is either known or not)");
  char *end;
  double hours = strtod(hours_s, &end);
  if (*end || end == hours_s || !(hours > 0))
    return cli_usage_error("rent", "--hours wants a positive number of hours, not '%s'", hours_s);
  /* An agreement holds at most GN_INVOICE_MAX_S (960 h). */
  if (hours > GN_INVOICE_MAX_S / 3600.0)
    return cli_usage_error("rent", "--hours: at most %u (the longest lease an agreement holds), not '%s'",
                           GN_INVOICE_MAX_S / 3600u, hours_s);
  json_t *jh = hours == floor(hours) ? json_integer((json_int_t)hours) : json_real(hours);
  json_t *body = json_pack("{s:s?, s:s?, s:o, s:i, s:b, s:b}", "offer", offer, "gpu", gpu, "hours", jh, "count",
                           (int)count, "allow_simulated", allow_sim, "attest", attest);
  if (!body)
    return cli_fail("out of memory");
  if (max_price)
    json_object_set_new(body, "max_price_uper_hour", json_integer((json_int_t)max_price));
  if (max_spend)
    json_object_set_new(body, "max_spend_micro", json_integer((json_int_t)max_spend));
  if (interval_s)
    json_object_set_new(body, "interval_s", json_integer((json_int_t)interval_s));
  if (wait_s) {
    int wr = wait_for_offer(c, gpu, (uint64_t)count, allow_sim, max_price, wait_s);
    if (wr != CLI_OK) {
      json_decref(body);
      return wr;
    }
  }
  /* Name who we negotiate with: for an offer, its provider (best effort:
   * if the lookup fails, the daemon's answer to the rent says why). */
  char who[128];
  snprintf(who, sizeof(who), "a provider of %s", gpu ? gpu : "");
  if (offer && !c->json) {
    snprintf(who, sizeof(who), "the provider of %s", offer);
    json_t *all = NULL;
    c->quiet = true;
    if (cli_call(c, "GET", "/v1/offers", NULL, &all) == CLI_OK) {
      size_t i;
      const json_t *of;
      json_array_foreach(json_object_get(all, "offers"), i, of) {
        if (cli_str(of, "id") && strcmp(cli_str(of, "id"), offer) == 0 && cli_str(of, "provider"))
          snprintf(who, sizeof(who), "%s", cli_str(of, "provider"));
      }
    }
    c->quiet = false;
    json_decref(all);
  }
  if (!c->json)
    fprintf(stderr, "negotiating lease with %s\xe2\x80\xa6\n", who);
  char label[192];
  snprintf(label, sizeof label, "Negotiating a lease%s", attest ? " (with attestation)" : "");
  return cli_show_waiting(c, "POST", "/v1/leases", body, show_rented, NULL, "lease", label);
}

static void lease_row(cli_table *t, const json_t *l, size_t i) {
  (void)i;
  char peer[64], gpus[96], price[64], elapsed[24], cost[64], ends[32];
  cli_fmt_node(cli_str(l, "peer"), peer, sizeof(peer));
  snprintf(gpus, sizeof(gpus), "%lldx %s", (long long)cli_int(l, "count", 1),
           cli_str(l, "gpu_model") ? cli_str(l, "gpu_model") : "?");
  cli_fmt_price((uint64_t)cli_int(l, "price_uper_hour", 0), cli_str(l, "currency"), price, sizeof(price));
  cli_fmt_duration(cli_int(l, "seconds", 0), elapsed, sizeof(elapsed));
  cli_fmt_money((uint64_t)cli_int(l, "cost_micro", 0), cli_str(l, "currency"), cost, sizeof(cost));
  cli_fmt_time(cli_int(l, "ends_s", 0), ends, sizeof(ends));
  const char *row[] = {cli_str(l, "id"),
                       cli_str(l, "role"),
                       peer,
                       gpus,
                       price,
                       cli_bool(l, "disputed") ? "disputed" : cli_str(l, "state"),
                       elapsed,
                       cost,
                       ends,
                       cli_bool(l, "simulated") ? "SIMULATED" : "real"};
  cli_table_row(t, row);
}

int cmd_leases(cli *c, int argc, char **argv) {
  static const char *const hdr[] = {"LEASE", "ROLE",    "PEER", "GPUS", "PRICE",
                                    "STATE", "ELAPSED", "COST", "ENDS", "KIND"};
  static const cli_list_spec spec = {"leases", "no leases (rent GPUs with: gpunet rent --gpu MODEL --hours H)", 10, hdr,
                                     lease_row};
  int r = cli_simple_args(argc, argv, 0, "");
  return r >= 0 ? r : cli_list(c, "/v1/leases", &spec);
}

static void show_released(const json_t *j, const void *ctx) {
  (void)ctx;
  const json_t *l = json_object_get(j, "lease");
  const json_t *inv = json_object_get(j, "invoice");
  print_lease_line(l, "ended");
  if (json_is_object(inv)) {
    char total[64], dur[24];
    if (cli_str(inv, "total") && cli_str(inv, "currency") && !strstr(cli_str(inv, "total"), cli_str(inv, "currency")))
      snprintf(total, sizeof(total), "%s %s", cli_str(inv, "total"), cli_str(inv, "currency"));
    else if (cli_str(inv, "total"))
      snprintf(total, sizeof(total), "%s", cli_str(inv, "total"));
    else
      cli_fmt_money((uint64_t)cli_int(inv, "total_micro", 0), cli_str(inv, "currency"), total, sizeof(total));
    cli_fmt_duration(cli_int(inv, "seconds", 0), dur, sizeof(dur));
    printf("invoice %s: %s for %s (%lld s), %s\n", cli_str(inv, "id") ? cli_str(inv, "id") : "?", total, dur,
           (long long)cli_int(inv, "seconds", 0), cli_str(inv, "status") ? cli_str(inv, "status") : "");
  } else {
    printf("no invoice yet: the provider has not settled this lease (see gpunet invoices later)\n");
  }
}

int cmd_release(cli *c, int argc, char **argv) {
  int r = cli_simple_args(argc, argv, 1, "LEASE");
  if (r < 0)
    r = cli_check_id("release", "lease", argv[optind]);
  if (r >= 0)
    return r;
  char *path = cli_path("/v1/leases", argv[optind], "");
  if (!path)
    return cli_fail("out of memory");
  r = cli_show(c, "DELETE", path, NULL, show_released, NULL);
  free(path);
  return r;
}
