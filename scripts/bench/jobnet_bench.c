/* Job network bench (scripts/bench/jobnet builds and runs it): iperf3 TCP
 * throughput between two job namespaces over the job network (each rank's
 * WireGuard interface made by gn_jobnet_up in its own "provider host"
 * namespace, the hosts joined by a veth pair) against the same two job
 * namespaces joined directly by a plain veth pair, interleaved, medians and
 * their ratio side by side.
 * Usage: jobnet_bench PREFIX [ROUNDS] [SECONDS]; needs root, ip, iperf3 and
 * wireguard-go (or kernel WireGuard). PREFIX names its namespaces. */
#include <gpunet/jobnet.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { HA, HB, JA, JB, NS };
static const char *suffix[NS] = {"hA", "hB", "jA", "jB"};
static char ns[NS][40], nspath[NS][80];
static gn_jobnet *net[2];
static gn_jobnet_config *cfg[2];
static pid_t server;
static int root_fd = -1;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int st = system(cmd);
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : 255;
  if (code)
    fprintf(stderr, "jobnet bench: (status %d) %s\n", code, cmd);
  return code;
}

static void cleanup(void) {
  for (int i = 0; i < 2; i++) {
    net[i] = gn_jobnet_down(net[i]);
    cfg[i] = gn_jobnet_config_free(cfg[i]);
  }
  if (server > 0) {
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    server = 0;
  }
  for (int i = 0; i < NS; i++)
    if (ns[i][0])
      sh("ip netns del %s 2>/dev/null; true", ns[i]);
}

static void die(const char *msg) {
  fprintf(stderr, "jobnet bench: %s\n", msg);
  cleanup();
  exit(1);
}

static int enter(int i) {
  int fd = open(nspath[i], O_RDONLY | O_CLOEXEC);
  int r = fd < 0 ? -1 : setns(fd, CLONE_NEWNET);
  if (fd >= 0)
    close(fd);
  return r;
}

/* iperf3 -c ADDR in jA: received bits per second, or -1. */
static double iperf(const char *addr, int seconds) {
  char cmd[512], buf[1 << 16];
  snprintf(cmd, sizeof cmd, "ip netns exec %s iperf3 -c %s -t %d -J 2>/dev/null", ns[JA], addr, seconds);
  FILE *f = popen(cmd, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  pclose(f);
  char *p = strstr(buf, "\"sum_received\"");
  p = p ? strstr(p, "\"bits_per_second\"") : NULL;
  p = p ? strchr(p, ':') : NULL;
  return p ? strtod(p + 1, NULL) : -1;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 2 || strlen(argv[1]) > 20) {
    fprintf(stderr, "usage: jobnet_bench PREFIX [ROUNDS] [SECONDS]\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 3, seconds = argc > 3 ? atoi(argv[3]) : 5;
  if (rounds < 1 || rounds > 20 || seconds < 1 || seconds > 60) {
    fprintf(stderr, "jobnet bench: ROUNDS 1..20, SECONDS 1..60\n");
    return 2;
  }
  root_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  for (int i = 0; i < NS; i++) {
    snprintf(ns[i], sizeof ns[i], "%s%s", argv[1], suffix[i]);
    snprintf(nspath[i], sizeof nspath[i], "/run/netns/%s", ns[i]);
    if (sh("ip netns add %s", ns[i])) {
      ns[i][0] = '\0';
      die("cannot create network namespaces");
    }
  }
  const char *p = argv[1];
  /* The underlay between the hosts and the plain veth between the jobs:
   * both veth pairs, both MTU 1500. */
  if (sh("ip link add %su type veth peer name %sv", p, p) || sh("ip link set %su netns %s", p, ns[HA]) ||
      sh("ip link set %sv netns %s", p, ns[HB]) || sh("ip -n %s address add 192.168.77.1/24 dev %su", ns[HA], p) ||
      sh("ip -n %s address add 192.168.77.2/24 dev %sv", ns[HB], p) || sh("ip -n %s link set %su up", ns[HA], p) ||
      sh("ip -n %s link set %sv up", ns[HB], p) || sh("ip link add %sa type veth peer name %sb", p, p) ||
      sh("ip link set %sa netns %s", p, ns[JA]) || sh("ip link set %sb netns %s", p, ns[JB]) ||
      sh("ip -n %s address add 10.99.0.1/24 dev %sa", ns[JA], p) ||
      sh("ip -n %s address add 10.99.0.2/24 dev %sb", ns[JB], p) || sh("ip -n %s link set %sa up", ns[JA], p) ||
      sh("ip -n %s link set %sb up", ns[JB], p) || sh("ip -n %s link set lo up", ns[JA]) ||
      sh("ip -n %s link set lo up", ns[JB]))
    die("cannot build the bench network");

  char job[64];
  snprintf(job, sizeof job, "bench-%s", p);
  struct in_addr subnet;
  uint8_t plen;
  if (gn_jobnet_subnet_for_job(job, &subnet, &plen) < 0)
    die("no subnet");
  for (int r = 0; r < 2; r++) {
    uint8_t pub[32];
    if (!(cfg[r] = gn_jobnet_config_new()) || gn_jobnet_ifname(job, (uint32_t)r, cfg[r]->ifname) < 0 ||
        gn_jobnet_keypair(cfg[r]->private_key, pub) < 0 ||
        gn_jobnet_rank_address(subnet, plen, (uint32_t)r, &cfg[r]->address) < 0)
      die("config");
    cfg[r]->prefix_len = plen;
    cfg[r]->listen_port = (uint16_t)(51820 + r);
    cfg[r]->allow_private_endpoints = true;
  }
  for (int r = 0; r < 2; r++) {
    gn_jobnet_peer *peer = &cfg[r]->peers[0];
    cfg[r]->peer_count = 1;
    gn_jobnet_public_key(cfg[1 - r]->private_key, peer->public_key);
    snprintf(peer->endpoint, sizeof peer->endpoint, "192.168.77.%d:%d", 2 - r, 51820 + 1 - r);
    peer->address = cfg[1 - r]->address;
  }
  uint64_t up_ms[2];
  for (int r = 0; r < 2; r++) {
    char err[512];
    uint64_t t0 = gn_mono_ms();
    if (enter(r == 0 ? HA : HB) < 0)
      die("setns");
    int rc = gn_jobnet_up(cfg[r], nspath[r == 0 ? JA : JB], &net[r], err, sizeof err);
    if (setns(root_fd, CLONE_NEWNET) < 0)
      die("setns back");
    if (rc < 0)
      die(err);
    up_ms[r] = gn_mono_ms() - t0;
  }
  server = fork();
  if (server == 0) {
    if (enter(JB) < 0)
      _exit(99);
    int fd = open("/dev/null", O_RDWR);
    dup2(fd, 1);
    dup2(fd, 2);
    execlp("iperf3", "iperf3", "-s", (char *)NULL);
    _exit(127);
  }
  sleep(1);
  char wg_addr[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &cfg[1]->address, wg_addr, sizeof wg_addr);
  double wg[20], veth[20];
  for (int i = 0; i < rounds; i++) {
    wg[i] = iperf(wg_addr, seconds);
    veth[i] = iperf("10.99.0.2", seconds);
    if (wg[i] < 0 || veth[i] < 0)
      die("iperf3 gave no result");
    fprintf(stderr, "round %d: job network %.0f Mbit/s, plain veth %.0f Mbit/s\n", i + 1, wg[i] / 1e6, veth[i] / 1e6);
  }
  qsort(wg, (size_t)rounds, sizeof wg[0], cmp);
  qsort(veth, (size_t)rounds, sizeof veth[0], cmp);
  double mw = wg[rounds / 2], mv = veth[rounds / 2];
  printf("job network bench: iperf3 TCP jA -> jB, %d rounds of %d s, medians (backend %s, MTU %u)\n", rounds, seconds,
         gn_jobnet_backend_of(net[0]) == GN_JOBNET_KERNEL ? "kernel" : "wireguard-go", (unsigned)gn_jobnet_mtu(net[0]));
  printf("%-22s %-22s %s\n", "job network (WireGuard)", "plain veth", "ratio");
  printf("%-22.0f %-22.0f %.3f\n", mw / 1e6, mv / 1e6, mw / mv);
  printf("(Mbit/s)\ngn_jobnet_up took %llu ms (rank 0) and %llu ms (rank 1)\n", (unsigned long long)up_ms[0],
         (unsigned long long)up_ms[1]);
  cleanup();
  return 0;
}
