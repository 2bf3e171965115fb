/* The config file `gpunet init` writes: every gpunetd key with its default,
 * commented out. gpunetd reads it (node/config.c); the CLI writes it here,
 * with no daemon and without the node library. tests/node/test_cli_init.c
 * checks that gpunetd loads it and reads every commented example in it. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char default_conf[] = "# gpunet configuration. One `key = value` per line; '#' starts a comment.\n"
                                   "# Every key can be overridden by the gpunetd flag of the same name, with\n"
                                   "# underscores written as dashes (max_hours = 8 is --max-hours 8).\n"
                                   "# The values shown commented out are the defaults.\n"
                                   "\n"
                                   "# Peer address this node listens on (HOST:PORT).\n"
                                   "#listen = 127.0.0.1:7946\n"
                                   "\n"
                                   "# Peers to join the overlay through; repeat the key for several.\n"
                                   "#bootstrap = 192.0.2.10:7946\n"
                                   "\n"
                                   "# Membership (SWIM) over UDP on the listen address and port: on or off\n"
                                   "# (off for a node alone, or where UDP to that port cannot pass).\n"
                                   "#overlay = on\n"
                                   "\n"
                                   "# Offer this machine's GPUs for rent.\n"
                                   "#provide = false\n"
                                   "\n"
                                   "# Price per GPU-hour, in currency units, and the currency.\n"
                                   "#price = 0.40\n"
                                   "#currency = EUR\n"
                                   "\n"
                                   "# Longest lease this node accepts, in hours.\n"
                                   "#max_hours = 24\n"
                                   "\n"
                                   "# Billing intervals a provider agrees to (seconds): a lease's requester gets\n"
                                   "# a debit note to countersign every interval, and a lease whose note stays\n"
                                   "# unanswered for two intervals is stopped.\n"
                                   "#interval_min_s = 10\n"
                                   "#interval_max_s = 3600\n"
                                   "\n"
                                   "# Settlement of countersigned final invoices: ledger (this node's own\n"
                                   "# book, see gpunet balance) or webhook (each final voucher and invoice is\n"
                                   "# POSTed to settle_url with an Idempotency-Key, retried until answered 2xx).\n"
                                   "#settle_driver = ledger\n"
                                   "#settle_url = https://billing.example/gpunet\n"
                                   "\n"
                                   "# Training jobs (gpunet train): take ranks of renters' training jobs, each\n"
                                   "# in its own WireGuard job network (default: yes when jobs get user\n"
                                   "# namespaces), and the UDP ports for their WireGuard sockets.\n"
                                   "#training = true\n"
                                   "#jobnet_ports = 51820-51899\n"
                                   "\n"
                                   "# For development without an NVIDIA GPU: offer a simulated one. Offers and\n"
                                   "# attestations say so, and requesters refuse them unless allow_simulated.\n"
                                   "#simulate_gpu = RTX 4090\n"
                                   "#allow_simulated = false\n"
                                   "\n"
                                   "# OCI runtime: runc, crun or a path; empty means detect.\n"
                                   "#runtime =\n"
                                   "\n"
                                   "# debug, info, warn or error.\n"
                                   "#log_level = info\n"
                                   "\n"
                                   "# What a provider lets all jobs of all leases use together. A job that does\n"
                                   "# not fit in what is left is refused, saying why. A lease's CPU share is its\n"
                                   "# GPUs' part of job_cpu_share (1 of 2 GPUs: half of it).\n"
                                   "#job_memory_share = 0.5\n"
                                   "#job_cpu_share = 0.75\n"
                                   "#job_pids_max = 16384\n"
                                   "\n"
                                   "# Disk for images (pulled layers and unpacked roots; older unused ones are\n"
                                   "# removed past it), and the free space kept for the ledger.\n"
                                   "#store_max = 64G\n"
                                   "#disk_reserve = 1G\n"
                                   "\n"
                                   "# A lease's workspace (/workspace in its jobs, gpunet cp): the most the\n"
                                   "# renter's copies and jobs may fill. auto: a file system of that size per\n"
                                   "# lease (an ext4 image on a loop device) where the host can make one;\n"
                                   "# dir: a directory, what jobs write measured every 10 s.\n"
                                   "#workspace_max = 10G\n"
                                   "#workspace_fs = auto\n"
                                   "\n"
                                   "# Registries on loopback, link-local, private or this host's own addresses\n"
                                   "# are refused unless named here (repeat the key, or separate by commas).\n"
                                   "#registry_allow = 127.0.0.1\n"
                                   "\n"
                                   "# Where cgroups cannot enforce a job's memory, pids and CPU limits, or the\n"
                                   "# host has no user namespaces, a provider refuses jobs (or to provide at\n"
                                   "# all) unless allowed here; its offers (ISOLATION in `gpunet offers`) and\n"
                                   "# `gpunet status` then say so.\n"
                                   "#allow_unenforced_limits = false\n"
                                   "#allow_no_userns = false\n"
                                   "\n"
                                   "# What peers may make this node hold, and how long it waits for them\n"
                                   "# (docs/overlay/limits.md). Out of range, gpunetd refuses to start.\n"
                                   "#max_connections = 512\n"
                                   "#dial_reserve = 64\n"
                                   "#max_inbound_per_ip = 8\n"
                                   "#max_inbound_per_net = 64\n"
                                   "#max_handshaking = 128\n"
                                   "#transport_memory = 256M\n"
                                   "#handshake_timeout_s = 10\n"
                                   "#idle_timeout_s = 180\n"
                                   "#progress_timeout_s = 60\n"
                                   "#send_stall_s = 30\n"
                                   "#overlay_source_rate = 100\n"
                                   "#overlay_rate = 2000\n"
                                   "#offer_table_size = 4096\n"
                                   "#offers_per_provider = 16\n"
                                   "#gossip_peer_digests = 12\n"
                                   "#gossip_peer_wants = 12\n"
                                   "#gossip_peer_bytes = 2M\n";

/* mkdir -p, 0700 for what it creates. */
int cli_mkdirs(const char *dir) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof(p), "%s", dir) >= (int)sizeof(p))
    return -ENAMETOOLONG;
  for (char *s = p + 1; *s; s++) {
    if (*s != '/')
      continue;
    *s = '\0';
    if (mkdir(p, 0700) < 0 && errno != EEXIST)
      return -errno;
    *s = '/';
  }
  if (mkdir(p, 0700) < 0 && errno != EEXIST)
    return -errno;
  return 0;
}

int cli_write_default_config(const char *path) {
  char dir[PATH_MAX];
  if (!path || !path[0] || snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
    return -ENAMETOOLONG;
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    int r = cli_mkdirs(dir);
    if (r < 0)
      return r;
  }
  return cli_write_atomic(path, default_conf, sizeof(default_conf) - 1, 0600);
}
