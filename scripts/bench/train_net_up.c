/* Helper of scripts/bench/train_net: brings up one job network (gpunet's,
 * sandbox/jobnet.c) for W ranks, rank r's WireGuard interface made by
 * gn_jobnet_up from inside its "provider host" namespace HOST_r (so the UDP
 * socket lives there, port 51820) and moved into its job namespace JOB_r,
 * every rank a peer of every other at HOSTIP_r:51820 (a full mesh, as
 * gpunet train makes it). Prints one line per rank, "rank R ADDRESS IFNAME
 * MTU", then "up", and keeps the network until SIGTERM or SIGINT, then takes
 * it down (wireguard-go stopped and reaped, interfaces gone).
 * Usage: train_net_up JOB_ID W HOST_0 JOB_0 HOSTIP_0 ... (namespaces by name
 * under /run/netns); needs root and wireguard-go (or kernel WireGuard). */
#include <gpunet/jobnet.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define W_MAX 16

static gn_jobnet *net[W_MAX];
static gn_jobnet_config *cfg[W_MAX];
static int world;

static void down(void) {
  for (int r = 0; r < world; r++) {
    net[r] = gn_jobnet_down(net[r]);
    cfg[r] = gn_jobnet_config_free(cfg[r]);
  }
}

static int die(const char *what) {
  fprintf(stderr, "train_net_up: %s\n", what);
  down();
  return 1;
}

static int enter(const char *name) {
  char path[128];
  snprintf(path, sizeof path, "/run/netns/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  int r = fd < 0 ? -1 : setns(fd, CLONE_NEWNET);
  if (fd >= 0)
    close(fd);
  return r;
}

int main(int argc, char **argv) {
  if (argc < 3 || (world = atoi(argv[2])) < 2 || world > W_MAX || argc != 3 + 3 * world) {
    fprintf(stderr, "usage: train_net_up JOB_ID W HOST_0 JOB_0 HOSTIP_0 ... (2 <= W <= %d)\n", W_MAX);
    return 2;
  }
  const char *job = argv[1];
  int root_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (root_fd < 0)
    return die("cannot open this process's network namespace");
  /* SIGTERM/SIGINT wait for sigwait below, also while wireguard-go starts. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_BLOCK, &set, NULL);

  struct in_addr subnet;
  uint8_t plen;
  if (gn_jobnet_subnet_for_job(job, &subnet, &plen) < 0)
    return die("no subnet for the job id");
  uint8_t pub[W_MAX][GN_JOBNET_KEY_LEN];
  for (int r = 0; r < world; r++) {
    if (!(cfg[r] = gn_jobnet_config_new()) || gn_jobnet_ifname(job, (uint32_t)r, cfg[r]->ifname) < 0 ||
        gn_jobnet_keypair(cfg[r]->private_key, pub[r]) < 0 ||
        gn_jobnet_rank_address(subnet, plen, (uint32_t)r, &cfg[r]->address) < 0)
      return die("cannot make a rank's config");
    cfg[r]->prefix_len = plen;
    cfg[r]->listen_port = 51820;
    cfg[r]->allow_private_endpoints = true;
  }
  for (int r = 0; r < world; r++) {
    for (int q = 0; q < world; q++) {
      if (q == r)
        continue;
      gn_jobnet_peer *p = &cfg[r]->peers[cfg[r]->peer_count++];
      memcpy(p->public_key, pub[q], sizeof pub[q]);
      snprintf(p->endpoint, sizeof p->endpoint, "%s:51820", argv[3 + 3 * q + 2]);
      p->address = cfg[q]->address;
    }
  }
  for (int r = 0; r < world; r++) {
    char err[512], path[128];
    snprintf(path, sizeof path, "/run/netns/%s", argv[3 + 3 * r + 1]);
    if (enter(argv[3 + 3 * r]) < 0)
      return die("cannot enter a host namespace");
    int rc = gn_jobnet_up(cfg[r], path, &net[r], err, sizeof err);
    if (setns(root_fd, CLONE_NEWNET) < 0)
      return die("cannot return to this process's namespace");
    if (rc < 0)
      return die(err);
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &cfg[r]->address, a, sizeof a);
    printf("rank %d %s %s %u\n", r, a, cfg[r]->ifname, (unsigned)gn_jobnet_mtu(net[r]));
  }
  printf("up\n");
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  down();
  close(root_fd);
  return 0;
}
