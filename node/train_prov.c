/* The provider's side of training jobs: policy, the checks of a manifest's
 * net section, and per rank a persistent network namespace (a bind mount of
 * a namespace under RUN_DIR/netns, like `ip netns add`) holding lo and the
 * rank's WireGuard interface (gn_jobnet_up, its UDP socket in the host's
 * namespace), which the job's runtime joins; the rendezvous environment; a
 * writable /output under DATA_DIR/output. Each rank leaves a record
 * (RUN_DIR/netns/JOB.wg: interface and wireguard-go pid) so a restart after
 * a crash removes what it left. */
#include "train_prov.h"

#include "du.h"
#include "node_internal.h"
#include "util.h"

#include <archive.h>
#include <archive_entry.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <gpunet/jobnet.h>
#include <limits.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define ENV_NAMES 8

typedef struct train_rank {
  struct train_rank *next;
  const gn_job *j;
  bool has_net, output;
  gn_jobnet_config *cfg; /* guarded: holds the private key */
  char group[GN_JOB_ID_STRLEN];
  uint32_t rank, world, local_rank, local_world;
  uint16_t master_port;
  struct in_addr master;
  /* worker-owned while its task runs */
  char netns_path[PATH_MAX];
  bool netns_made;
  gn_jobnet *net;
  char record[PATH_MAX];
  char output_dir[PATH_MAX];
  char output_visible[PATH_MAX];
  gn_bundle_bind rw;
  /* The seed (a restarted rank's /output, fetched from the lease holder):
   * loop-owned; the unpack's work item has its own copies. */
  int seed_state;    /* SEED_* */
  bool seed_waiting; /* prepared: the container waits for the seed */
  uint8_t seed_sha256[32];
  uint64_t seed_size, seed_off, seed_last_ms;
  uint8_t seed_from[GN_PK_LEN]; /* the lease holder: the only one heard */
  int seed_fd;
  char seed_path[PATH_MAX];
  crypto_hash_sha256_state seed_hash;
} train_rank;

enum { SEED_NONE, SEED_FETCHING, SEED_FETCHED, SEED_UNPACKING, SEED_DONE, SEED_FAILED };

static pthread_mutex_t ranks_lock = PTHREAD_MUTEX_INITIALIZER;
static train_rank *ranks;

static uint64_t output_budget(const gn_node *n);
static void seed_start(gn_node *n, gn_job *j, train_rank *t, const gn_jobman *m);
static void seed_close(train_rank *t);

static train_rank *rank_find(const gn_job *j) {
  pthread_mutex_lock(&ranks_lock);
  train_rank *t = ranks;
  while (t && t->j != j)
    t = t->next;
  pthread_mutex_unlock(&ranks_lock);
  return t;
}

bool gn__train_enabled(const gn_node *n) {
  return n->cfg.training > 0 || (n->cfg.training < 0 && n->userns_ok);
}

void gn__train_offer(const gn_node *n, gn_offer *o) {
  o->training = gn__train_enabled(n);
  o->jobnet_port_lo = o->training ? n->cfg.jobnet_port_lo : 0;
  o->jobnet_port_hi = o->training ? n->cfg.jobnet_port_hi : 0;
}

json_t *gn__train_status_json(const gn_node *n) {
  char ports[16];
  size_t count = 0;
  pthread_mutex_lock(&ranks_lock);
  for (train_rank *t = ranks; t; t = t->next)
    count += t->has_net;
  pthread_mutex_unlock(&ranks_lock);
  gn__strf(ports, sizeof ports, "%u-%u", n->cfg.jobnet_port_lo, n->cfg.jobnet_port_hi);
  return json_pack("{s:b, s:s, s:I}", "enabled", gn__train_enabled(n), "jobnet_ports", ports, "ranks",
                   (json_int_t)count);
}

/* Whether a UDP port can be bound in the daemon's namespace now (IPv4 and
 * IPv6: wireguard-go takes both). */
static bool udp_port_free(uint16_t port) {
  int s4 = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(port)};
  bool ok = s4 >= 0 && bind(s4, (struct sockaddr *)&a4, sizeof a4) == 0;
  if (s4 >= 0)
    close(s4);
  int s6 = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (ok && s6 >= 0) {
    int on = 1;
    setsockopt(s6, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = IN6ADDR_ANY_INIT};
    ok = bind(s6, (struct sockaddr *)&a6, sizeof a6) == 0 || errno == EADDRNOTAVAIL || errno == EAFNOSUPPORT;
  }
  if (s6 >= 0)
    close(s6);
  return ok;
}

/* Peers' endpoints may be private addresses only when this provider itself
 * listens on a private or loopback address (a LAN cluster, a test): a home
 * provider on a public address never has its socket sent at its LAN. */
static bool private_endpoints_allowed(const gn_node *n) {
  char host[64];
  gn__strf(host, sizeof host, "%s", n->cfg.listen);
  char *colon = strrchr(host, ':');
  if (colon)
    *colon = 0;
  struct in_addr a;
  if (inet_pton(AF_INET, host, &a) != 1)
    return false;
  uint32_t h = ntohl(a.s_addr);
  return (h >> 24) == 10 || (h >> 24) == 127 || (h >> 20) == (172u << 4 | 1) || (h >> 16) == (192u << 8 | 168) ||
         (h >> 22) == (100u << 2 | 1);
}

/* The jobnet config of a manifest's net (validated by jobnet). The
 * interface (and wireguard-go's socket, named after it in a directory all
 * namespaces share) is named after the job, not the group: a restarted rank,
 * or the same rank's old interface that a crashed provider on this host left
 * behind, never takes its name. */
static int net_config(const gn_node *n, const char *job_id, const gn_jobman_net *t, gn_jobnet_config *c,
                      struct in_addr *ret_master, char *err, size_t cap) {
  struct in_addr subnet = {.s_addr = htonl(10u << 24 | 77u << 16 | t->subnet_host << 8)};
  int r;
  if ((r = gn_jobnet_ifname(job_id, t->rank, c->ifname)) < 0 ||
      (r = gn_jobnet_rank_address(subnet, 24, t->rank, &c->address)) < 0 ||
      (r = gn_jobnet_rank_address(subnet, 24, 0, ret_master)) < 0) {
    gn__strf(err, cap, "bad job network: %s", gn_strerror(r));
    return r;
  }
  memcpy(c->private_key, t->private_key, sizeof c->private_key);
  c->listen_port = t->listen_port;
  c->prefix_len = 24;
  c->mtu = 0;
  c->allow_private_endpoints = private_endpoints_allowed(n);
  c->backend = GN_JOBNET_AUTO;
  c->peer_count = t->npeers;
  for (uint32_t i = 0; i < t->npeers; i++) {
    gn_jobnet_peer *p = &c->peers[i];
    memcpy(p->public_key, t->peers[i].public_key, sizeof p->public_key);
    if (strlen(t->peers[i].endpoint) >= sizeof p->endpoint) {
      gn__strf(err, cap, "peer rank %u's endpoint is too long", t->peers[i].rank);
      return GN_EINVAL;
    }
    gn__strf(p->endpoint, sizeof p->endpoint, "%s", t->peers[i].endpoint);
    p->keepalive_s = 25;
    if ((r = gn_jobnet_rank_address(subnet, 24, t->peers[i].rank, &p->address)) < 0) {
      gn__strf(err, cap, "bad job network: %s", gn_strerror(r));
      return r;
    }
  }
  char why[256] = "";
  if ((r = gn_jobnet_config_validate(c, why, sizeof why)) < 0) {
    gn__strf(err, cap, "bad job network: %s", why[0] ? why : gn_strerror(r));
    return r;
  }
  return 0;
}

int gn__train_check(gn_node *n, const gn_jobman *m, char *reason, size_t cap) {
  if (m->output && !n->userns_ok) {
    gn__strf(reason, cap, "this provider gives no /output: its jobs have no user namespace of their own");
    return GN_EPERM;
  }
  /* A seed is kept whole (its tar) while /output is unpacked from it:
   * within the output budget, and twice over in the disk's free space
   * above its reserve. Nothing of the job exists yet. */
  if (m->has_seed) {
    struct statvfs vfs;
    uint64_t avail = statvfs(n->cfg.data_dir, &vfs) == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize : 0;
    if (m->seed_size > output_budget(n)) {
      gn__strf(reason, cap, "the seed of %llu MiB is larger than this provider's /output budget (%llu MiB)",
               (unsigned long long)((m->seed_size + (1 << 20) - 1) >> 20),
               (unsigned long long)(output_budget(n) >> 20));
      return GN_ETOOBIG;
    }
    if (avail < n->cfg.disk_reserve_bytes || (avail - n->cfg.disk_reserve_bytes) / 2 < m->seed_size) {
      gn__strf(reason, cap, "this provider has not the free disk for the seed of %llu MiB",
               (unsigned long long)((m->seed_size + (1 << 20) - 1) >> 20));
      return GN_ETOOBIG;
    }
  }
  if (!m->has_net)
    return 0;
  const gn_jobman_net *t = &m->net;
  if (!gn__train_enabled(n)) {
    gn__strf(reason, cap, "this provider does not take training jobs (training = false%s)",
             n->userns_ok ? "" : ": its jobs have no user namespace of their own");
    return GN_EPERM;
  }
  if (t->listen_port < n->cfg.jobnet_port_lo || t->listen_port > n->cfg.jobnet_port_hi) {
    gn__strf(reason, cap, "job network port %u is outside this provider's range %u-%u", t->listen_port,
             n->cfg.jobnet_port_lo, n->cfg.jobnet_port_hi);
    return GN_EINVAL;
  }
  if (t->npeers != t->world - 1) {
    gn__strf(reason, cap, "training job %s: rank %u of %u lists %u peers, not %u", t->group, t->rank, t->world,
             t->npeers, t->world - 1);
    return GN_EINVAL;
  }
  if (t->local_world > t->world || t->local_rank >= t->local_world || t->rank >= t->world) {
    gn__strf(reason, cap, "training job %s: inconsistent ranks", t->group);
    return GN_EINVAL;
  }
  pthread_mutex_lock(&ranks_lock);
  bool taken = false, same = false;
  for (train_rank *o = ranks; o; o = o->next) {
    taken = taken || (o->has_net && o->cfg->listen_port == t->listen_port);
    same = same || (o->has_net && strcmp(o->group, t->group) == 0 && o->rank == t->rank);
  }
  pthread_mutex_unlock(&ranks_lock);
  if (same) {
    gn__strf(reason, cap, "rank %u of training job %s already runs here", t->rank, t->group);
    return GN_EBUSY;
  }
  if (taken || !udp_port_free(t->listen_port)) {
    gn__strf(reason, cap, "job network port %u is busy on this provider", t->listen_port);
    return GN_EBUSY;
  }
  gn_jobnet_config *c = gn_jobnet_config_new();
  if (!c) {
    gn__strf(reason, cap, "provider out of memory");
    return GN_ENOMEM;
  }
  struct in_addr master;
  int r = net_config(n, m->job_id, t, c, &master, reason, cap);
  gn_jobnet_config_free(c);
  return r;
}

int gn__train_attach(gn_node *n, gn_job *j, const gn_jobman *m) {
  if (!m->has_net && !m->output)
    return 0;
  train_rank *t = calloc(1, sizeof *t);
  if (!t)
    return GN_ENOMEM;
  t->j = j;
  t->output = m->output;
  t->seed_fd = -1;
  if (m->has_net) {
    char why[256];
    if (!(t->cfg = gn_jobnet_config_new()) ||
        net_config(n, m->job_id, &m->net, t->cfg, &t->master, why, sizeof why) < 0) {
      gn_jobnet_config_free(t->cfg);
      free(t);
      return GN_ENOMEM;
    }
    t->has_net = true;
    gn__strf(t->group, sizeof t->group, "%s", m->net.group);
    t->rank = m->net.rank;
    t->world = m->net.world;
    t->local_rank = m->net.local_rank;
    t->local_world = m->net.local_world;
    t->master_port = m->net.master_port;
    if (gn__pathf(t->netns_path, sizeof t->netns_path, "%s/netns/%s", n->run_dir, j->id) < 0 ||
        gn__pathf(t->record, sizeof t->record, "%s/netns/%s.wg", n->run_dir, j->id) < 0) {
      gn_jobnet_config_free(t->cfg);
      free(t);
      return GN_ETOOBIG;
    }
  }
  if (m->output) {
    size_t k = strlen(n->cfg.data_dir);
    if (gn__pathf(t->output_dir, sizeof t->output_dir, "%s/output/%s", n->cfg.data_dir, j->id) < 0 ||
        gn__pathf(t->output_visible, sizeof t->output_visible, "%s%s",
                  n->data_alias[0] ? n->data_alias : n->cfg.data_dir, t->output_dir + k) < 0) {
      gn_jobnet_config_free(t->cfg);
      free(t);
      return GN_ETOOBIG;
    }
  }
  pthread_mutex_lock(&ranks_lock);
  t->next = ranks;
  ranks = t;
  pthread_mutex_unlock(&ranks_lock);
  if (m->has_seed)
    seed_start(n, j, t, m); /* a failure fails the job (j->error) */
  return 0;
}

bool gn__train_has(const gn_job *j) {
  return rank_find(j) != NULL;
}

/* A persistent network namespace at path, with lo up: a child unshares one
 * and bind-mounts it there (a forked child of a threaded process: only
 * system calls until _exit). */
static int netns_make(const char *path, char *err, size_t cap) {
  int fd = open(path, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    gn__strf(err, cap, "cannot create %s: %s", path, strerror(errno));
    return -errno;
  }
  close(fd);
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    unlink(path);
    gn__strf(err, cap, "cannot fork: %s", strerror(e));
    return -e;
  }
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) < 0)
      _exit(1);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
      _exit(2);
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
      _exit(3);
    if (mount("/proc/self/ns/net", path, NULL, MS_BIND, NULL) < 0)
      _exit(4);
    _exit(0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    unlink(path);
    gn__strf(err, cap, "cannot make the job's network namespace (step %d failed)",
             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return GN_EIO;
  }
  return 0;
}

static void netns_remove(const char *path) {
  umount2(path, MNT_DETACH);
  unlink(path);
}

/* Replaces or appends NAME=value in a NULL-terminated, malloc'd env. */
static int env_set(char ***env, const char *name, const char *value) {
  size_t k = strlen(name), n = 0;
  char *e = NULL;
  size_t len = k + strlen(value) + 2;
  if (!(e = malloc(len)))
    return GN_ENOMEM;
  snprintf(e, len, "%s=%s", name, value);
  for (; (*env)[n]; n++) {
    if (strncmp((*env)[n], name, k) == 0 && (*env)[n][k] == '=') {
      free((*env)[n]);
      (*env)[n] = e;
      return 0;
    }
  }
  char **more = realloc(*env, (n + 2) * sizeof *more);
  if (!more) {
    free(e);
    return GN_ENOMEM;
  }
  more[n] = e;
  more[n + 1] = NULL;
  *env = more;
  return 0;
}

/* The rank's record: "IFNAME PID", PID 0 while the network comes up (a
 * crash then leaves a wireguard-go the next start finds by its name). */
static void record_write(const train_rank *t, const char *ifname, pid_t pid) {
  char text[128];
  int len = snprintf(text, sizeof text, "%s %d\n", ifname, (int)pid);
  int fd = open(t->record, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    if (write(fd, text, (size_t)len) != len)
      gn_log(GN_LOG_WARN, "cannot write %s", t->record);
    close(fd);
  }
}

int gn__train_prepare(gn_job *j, gn_bundle_spec *spec, char ***env, char *err, size_t cap) {
  train_rank *t = rank_find(j);
  if (!t)
    return 0;
  gn_node *n = j->node;
  int r;
  if (t->output) {
    char dir[PATH_MAX];
    gn__strf(dir, sizeof dir, "%s/output", n->cfg.data_dir);
    if ((mkdir(dir, 0711) < 0 && errno != EEXIST) || (mkdir(t->output_dir, 0700) < 0 && errno != EEXIST) ||
        (j->id_count && chown(t->output_dir, j->uid_base, j->uid_base) < 0) || chmod(t->output_dir, 0755) < 0) {
      r = -errno;
      gn__strf(err, cap, "cannot make the job's /output: %s", strerror(errno));
      return r;
    }
    t->rw.source = t->output_visible;
    t->rw.dest = "/output";
    spec->rw_binds = &t->rw;
    spec->n_rw_binds = 1;
  }
  if (!t->has_net)
    return 0;
  char dir[PATH_MAX];
  gn__strf(dir, sizeof dir, "%s/netns", n->run_dir);
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    r = -errno;
    gn__strf(err, cap, "cannot make %s: %s", dir, strerror(errno));
    return r;
  }
  if ((r = netns_make(t->netns_path, err, cap)) < 0)
    return r;
  t->netns_made = true;
  char why[512] = "";
  record_write(t, t->cfg->ifname, 0);
  if ((r = gn_jobnet_up(t->cfg, t->netns_path, &t->net, why, sizeof why)) < 0) {
    gn__strf(err, cap, "cannot bring the job network up: %s", why[0] ? why : gn_strerror(r));
    return r;
  }
  record_write(t, gn_jobnet_ifname_of(t->net), gn_jobnet_pid(t->net));
  spec->netns_path = t->netns_path;
  char num[16], master[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &t->master, master, sizeof master);
  const char *ifname = gn_jobnet_ifname_of(t->net);
  if ((r = env_set(env, "MASTER_ADDR", master)) < 0)
    goto oom;
  snprintf(num, sizeof num, "%u", t->master_port);
  if ((r = env_set(env, "MASTER_PORT", num)) < 0)
    goto oom;
  snprintf(num, sizeof num, "%u", t->rank);
  if ((r = env_set(env, "RANK", num)) < 0)
    goto oom;
  snprintf(num, sizeof num, "%u", t->world);
  if ((r = env_set(env, "WORLD_SIZE", num)) < 0)
    goto oom;
  snprintf(num, sizeof num, "%u", t->local_rank);
  if ((r = env_set(env, "LOCAL_RANK", num)) < 0)
    goto oom;
  snprintf(num, sizeof num, "%u", t->local_world);
  if ((r = env_set(env, "LOCAL_WORLD_SIZE", num)) < 0 || (r = env_set(env, "GLOO_SOCKET_IFNAME", ifname)) < 0 ||
      (r = env_set(env, "NCCL_SOCKET_IFNAME", ifname)) < 0)
    goto oom;
  return 0;
oom:
  gn__strf(err, cap, "provider out of memory");
  return r;
}

void gn__train_cleanup(gn_job *j) {
  train_rank *t = rank_find(j);
  if (!t)
    return;
  t->net = gn_jobnet_down(t->net);
  if (t->netns_made) {
    netns_remove(t->netns_path);
    t->netns_made = false;
  }
  if (t->record[0])
    unlink(t->record);
}

void gn__train_detach(gn_job *j) {
  pthread_mutex_lock(&ranks_lock);
  train_rank **pp = &ranks;
  while (*pp && (*pp)->j != j)
    pp = &(*pp)->next;
  train_rank *t = *pp;
  if (t)
    *pp = t->next;
  pthread_mutex_unlock(&ranks_lock);
  if (!t)
    return;
  seed_close(t);                   /* the seed's tar, if any is left */
  t->net = gn_jobnet_down(t->net); /* a cleanup that never ran */
  if (t->netns_made)
    netns_remove(t->netns_path);
  gn_jobnet_config_free(t->cfg);
  free(t);
}

/* Whether pid is a wireguard-go serving ifname (its command line is
 * "wireguard-go -f IFNAME"), so a recycled pid is never signalled. */
static bool is_our_wg(pid_t pid, const char *ifname) {
  char path[64], cmd[256];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  ssize_t len = read(fd, cmd, sizeof cmd - 1);
  close(fd);
  if (len <= 0)
    return false;
  cmd[len] = 0;
  const char *base = strrchr(cmd, '/');
  base = base ? base + 1 : cmd;
  if (strcmp(base, "wireguard-go") != 0)
    return false;
  /* the arguments follow NUL-separated */
  for (ssize_t i = 0; i < len; i++)
    if (cmd[i] == 0 && i + 1 < len && strcmp(cmd + i + 1, ifname) == 0)
      return true;
  return false;
}

/* Removes everything in DATA_DIR/SUB (the folder stays); how many entries. */
static unsigned empty_dir(const char *data_dir, const char *sub) {
  char dir[PATH_MAX];
  DIR *d;
  unsigned removed = 0;
  if (gn__pathf(dir, sizeof dir, "%s/%s", data_dir, sub) < 0 || !(d = opendir(dir)))
    return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[PATH_MAX];
    if (e->d_name[0] == '.' || gn__pathf(path, sizeof path, "%s/%s", dir, e->d_name) < 0)
      continue;
    gn_rm_tree(path);
    removed++;
  }
  closedir(d);
  return removed;
}

void gn__train_remove_stale(gn_node *n) {
  char dir[PATH_MAX];
  if (gn__pathf(dir, sizeof dir, "%s/netns", n->run_dir) < 0)
    return;
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  unsigned removed = 0;
  while ((e = readdir(d))) {
    char path[PATH_MAX];
    size_t k = strlen(e->d_name);
    if (e->d_name[0] == '.' || gn__pathf(path, sizeof path, "%s/%s", dir, e->d_name) < 0)
      continue;
    if (k > 3 && strcmp(e->d_name + k - 3, ".wg") == 0) {
      char text[128] = "", ifname[GN_JOBNET_IFNAME_MAX + 1] = "";
      int pid = 0;
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        ssize_t len = read(fd, text, sizeof text - 1);
        close(fd);
        text[len > 0 ? len : 0] = 0;
      }
      if (sscanf(text, "%16s %d", ifname, &pid) == 2 && gn_jobnet_ifname_valid(ifname)) {
        /* PID 0: a crash while it came up. Unlinking its socket below
         * stops a wireguard-go all the same (it watches the socket file). */
        if (pid > 0 && is_our_wg(pid, ifname)) {
          kill(pid, SIGTERM);
          for (int i = 0; i < 20 && kill(pid, 0) == 0; i++)
            usleep(50000);
          kill(pid, SIGKILL);
          waitpid(pid, NULL, WNOHANG);
        }
        char sock[PATH_MAX];
        gn__strf(sock, sizeof sock, "/var/run/wireguard/%s.sock", ifname);
        unlink(sock);
        /* a kernel interface not yet moved would still be in the host's namespace */
        if (if_nametoindex(ifname)) {
          pid_t c = fork();
          if (c == 0) {
            execl("/usr/sbin/ip", "ip", "link", "del", "dev", ifname, (char *)NULL);
            execlp("ip", "ip", "link", "del", "dev", ifname, (char *)NULL);
            _exit(127);
          }
          if (c > 0)
            waitpid(c, NULL, 0);
        }
      }
      unlink(path);
      removed++;
    } else {
      netns_remove(path);
      removed++;
    }
  }
  closedir(d);
  /* /output of an earlier run's jobs (their leases ended with it), and the
   * seeds it was fetching or had not unpacked yet. */
  removed += empty_dir(n->cfg.data_dir, "output");
  removed += empty_dir(n->cfg.data_dir, "seed");
  if (removed)
    gn_log(GN_LOG_INFO, "removed %u job network, /output and seed leftovers of an earlier run", removed);
}

/* --- /output: snapshots, chunks, budget -------------------------------------*/

#define OUTPUT_MAX_ENTRIES 100000 /* files and directories in one snapshot */
#define OUTPUT_MAX_DEPTH 64
#define OUTPUT_WORK_MAX 16 /* requests on the pool at once; more are refused "busy" */
#define OUTPUT_TICK_S 10   /* the budget and the removal of ended leases' outputs */

/* Requests and snapshots are serialized: one snapshot is built or read at
 * a time (a build can take a while; the loop never waits for it). */
static pthread_mutex_t output_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned output_work; /* loop-only: pool items of this file queued or running */
static int64_t output_tick_s;

static void output_paths(const gn_node *n, const char *job_id, char *dir, char *tar, size_t cap) {
  gn__strf(dir, cap, "%s/output/%s", n->cfg.data_dir, job_id);
  gn__strf(tar, cap, "%s/output/%s.tar", n->cfg.data_dir, job_id);
}

typedef struct tar_walk {
  struct archive *a;
  uint64_t entries, bytes, cap, skipped;
  char err[256];
} tar_walk;

/* Adds the tree under dirfd (its path in the archive: prefix) without ever
 * following a link: every name is opened relative to its parent with
 * O_NOFOLLOW, so a job that swaps a directory for a symlink mid-walk makes
 * the open fail, not the daemon read the host. Only directories and
 * regular files go in (links, devices, fifos, sockets are skipped). */
static int tar_dir(tar_walk *t, int dirfd, const char *prefix, int depth) {
  if (depth > OUTPUT_MAX_DEPTH) {
    gn__strf(t->err, sizeof t->err, "/output is nested deeper than %d directories", OUTPUT_MAX_DEPTH);
    return GN_ETOOBIG;
  }
  DIR *d = fdopendir(dirfd);
  if (!d) {
    close(dirfd);
    return GN_EIO;
  }
  struct dirent *e;
  int r = 0;
  while (r == 0 && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    char name[PATH_MAX];
    if (gn__pathf(name, sizeof name, "%s%s%s", prefix, prefix[0] ? "/" : "", e->d_name) < 0) {
      t->skipped++;
      continue;
    }
    int fd = openat(dirfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      t->skipped++; /* a symlink (ELOOP), gone, or not readable */
      continue;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
      close(fd);
      t->skipped++;
      continue;
    }
    if (++t->entries > OUTPUT_MAX_ENTRIES) {
      close(fd);
      gn__strf(t->err, sizeof t->err, "/output has more than %d entries", OUTPUT_MAX_ENTRIES);
      r = GN_ETOOBIG;
      break;
    }
    uint64_t size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    if (size > t->cap || t->bytes > t->cap - size) {
      close(fd);
      gn__strf(t->err, sizeof t->err, "/output holds more than the provider's output budget (%llu MiB)",
               (unsigned long long)(t->cap >> 20));
      r = GN_ETOOBIG;
      break;
    }
    t->bytes += size;
    struct archive_entry *ae = archive_entry_new();
    archive_entry_set_pathname(ae, name);
    archive_entry_set_filetype(ae, S_ISDIR(st.st_mode) ? AE_IFDIR : AE_IFREG);
    archive_entry_set_perm(ae, st.st_mode & 0755);
    archive_entry_set_size(ae, (la_int64_t)size);
    archive_entry_set_mtime(ae, st.st_mtime, 0);
    if (archive_write_header(t->a, ae) != ARCHIVE_OK) {
      gn__strf(t->err, sizeof t->err, "cannot write the snapshot: %s", archive_error_string(t->a));
      r = GN_EIO;
    }
    archive_entry_free(ae);
    if (r == 0 && S_ISDIR(st.st_mode)) {
      r = tar_dir(t, fd, name, depth + 1); /* takes fd */
      continue;
    }
    /* Exactly size bytes: a file that shrank meanwhile is padded with
     * zeros, one that grew is cut, so the header stays true. */
    char buf[65536];
    uint64_t left = size;
    while (r == 0 && left) {
      ssize_t k = read(fd, buf, left < sizeof buf ? left : sizeof buf);
      if (k < 0 && errno == EINTR)
        continue;
      if (k <= 0) {
        memset(buf, 0, sizeof buf);
        k = (ssize_t)(left < sizeof buf ? left : sizeof buf);
      }
      if (archive_write_data(t->a, buf, (size_t)k) != k) {
        gn__strf(t->err, sizeof t->err, "cannot write the snapshot: %s", archive_error_string(t->a));
        r = GN_EIO;
      }
      left -= (uint64_t)k;
    }
    close(fd);
  }
  closedir(d);
  return r;
}

/* Builds DIR's snapshot at tar (through tar.tmp, renamed when whole). */
static int tar_build(const char *dir, const char *tar, uint64_t cap, char *err, size_t err_cap) {
  char tmp[PATH_MAX + 8];
  gn__strf(tmp, sizeof tmp, "%s.tmp", tar);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    gn__strf(err, err_cap, "this job has no /output");
    return GN_ENOTFOUND;
  }
  tar_walk t = {.cap = cap};
  t.a = archive_write_new();
  int r = 0;
  if (!t.a || archive_write_set_format_pax_restricted(t.a) != ARCHIVE_OK ||
      archive_write_open_filename(t.a, tmp) != ARCHIVE_OK) {
    gn__strf(err, err_cap, "cannot write the snapshot");
    close(dfd);
    r = GN_EIO;
  } else {
    r = tar_dir(&t, dfd, "", 0);
    if (archive_write_close(t.a) != ARCHIVE_OK && r == 0) {
      gn__strf(t.err, sizeof t.err, "cannot write the snapshot: %s", archive_error_string(t.a));
      r = GN_EIO;
    }
  }
  if (t.a)
    archive_write_free(t.a);
  if (r == 0 && rename(tmp, tar) < 0)
    r = -errno;
  if (r < 0) {
    unlink(tmp);
    if (t.err[0])
      gn__strf(err, err_cap, "%s", t.err);
    else if (!err[0])
      gn__strf(err, err_cap, "cannot make the snapshot: %s", gn_strerror(r));
  }
  return r;
}

typedef struct out_req {
  uv_work_t w;
  gn_node *n;
  uint8_t peer[GN_PK_LEN];
  char job_id[GN_JOB_ID_STRLEN];
  char dir[PATH_MAX], tar[PATH_MAX];
  uint64_t offset, cap, size;
  uint8_t data[GN_JOB_OUTPUT_CHUNK];
  size_t len;
  bool eof;
  char reason[256];
} out_req;

static void output_get_work(uv_work_t *w) {
  out_req *q = w->data;
  pthread_mutex_lock(&output_lock);
  struct stat st;
  /* offset 0 asks for a new snapshot; later offsets read the one made */
  if (q->offset == 0 || stat(q->tar, &st) < 0) {
    if (tar_build(q->dir, q->tar, q->cap, q->reason, sizeof q->reason) < 0) {
      pthread_mutex_unlock(&output_lock);
      q->eof = true;
      return;
    }
  }
  int fd = open(q->tar, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 || fstat(fd, &st) < 0) {
    gn__strf(q->reason, sizeof q->reason, "the snapshot of /output is gone; ask from offset 0");
    q->eof = true;
  } else if (q->offset > (uint64_t)st.st_size) {
    gn__strf(q->reason, sizeof q->reason, "offset %llu is past the snapshot's %llu bytes",
             (unsigned long long)q->offset, (unsigned long long)st.st_size);
    q->eof = true;
  } else {
    ssize_t k = pread(fd, q->data, sizeof q->data, (off_t)q->offset);
    q->len = k > 0 ? (size_t)k : 0;
    q->size = (uint64_t)st.st_size;
    q->eof = q->offset + q->len >= q->size;
  }
  if (fd >= 0)
    close(fd);
  pthread_mutex_unlock(&output_lock);
}

static void output_reply(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *job_id, uint64_t offset,
                         const uint8_t *data, size_t len, bool eof, uint64_t size, const char *reason) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__joboutput_encode(&w, job_id, offset, data, len, eof, size, reason);
  gn__node_send(n, peer, GN_MSG_JOB_OUTPUT, &w);
  gn_wire_writer_done(&w);
}

static void output_get_after(uv_work_t *w, int status) {
  out_req *q = w->data;
  output_work--;
  if (status == 0 && q->n->tp)
    output_reply(q->n, q->peer, q->job_id, q->offset, q->data, q->len, q->eof, q->size, q->reason);
  free(q);
}

/* The provider's output budget: all jobs' /output together (snapshots
 * included) within store_max, and nothing once the disk is into its
 * reserve. */
static uint64_t output_budget(const gn_node *n) {
  return n->cfg.store_max_bytes;
}

void gn__train_on_output_get(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_job *j = gn__job_find(n, m.job_id);
  gn_lease *l = j ? gn__lease_find(n, j->lease_id) : NULL;
  /* Only the lease holder hears anything, even that the job exists. */
  if (!j || !l || j->role != GN_ROLE_PROVIDER || l->role != GN_ROLE_PROVIDER || strcmp(j->lease_id, m.lease_id) != 0 ||
      memcmp(l->ag.terms.requester, peer, GN_PK_LEN) != 0) {
    gn__jobmsg_done(&m);
    return;
  }
  out_req *q = output_work < OUTPUT_WORK_MAX ? calloc(1, sizeof *q) : NULL;
  if (!q) {
    output_reply(n, peer, m.job_id, m.offset, NULL, 0, true, 0, "the provider is busy; ask again shortly");
    gn__jobmsg_done(&m);
    return;
  }
  q->n = n;
  memcpy(q->peer, peer, GN_PK_LEN);
  gn__strf(q->job_id, sizeof q->job_id, "%s", m.job_id);
  output_paths(n, m.job_id, q->dir, q->tar, sizeof q->dir);
  q->offset = m.offset;
  q->cap = output_budget(n);
  q->w.data = q;
  gn__jobmsg_done(&m);
  if (uv_queue_work(n->loop, &q->w, output_get_work, output_get_after) < 0) {
    free(q);
    return;
  }
  output_work++;
}

/* The tick's survey: bytes under each running output job's /output (the
 * walk bounded like a snapshot's), and the removal of outputs whose lease
 * has ended. */
typedef struct out_survey {
  uv_work_t w;
  gn_node *n;
  size_t count;
  struct {
    char job_id[GN_JOB_ID_STRLEN];
    char dir[PATH_MAX], tar[PATH_MAX];
    bool remove; /* the lease ended and the job is gone: delete */
    uint64_t bytes;
  } e[64];
} out_survey;

static void survey_work(uv_work_t *w) {
  out_survey *s = w->data;
  pthread_mutex_lock(&output_lock);
  for (size_t i = 0; i < s->count; i++) {
    if (s->e[i].remove) {
      gn_rm_tree(s->e[i].dir);
      unlink(s->e[i].tar);
      continue;
    }
    int fd = open(s->e[i].dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    s->e[i].bytes = fd >= 0 ? gn__du_tree(fd, OUTPUT_MAX_DEPTH, OUTPUT_MAX_ENTRIES * 4) : 0;
    struct stat st;
    if (stat(s->e[i].tar, &st) == 0)
      s->e[i].bytes += (uint64_t)st.st_size;
  }
  pthread_mutex_unlock(&output_lock);
}

static void survey_after(uv_work_t *w, int status) {
  out_survey *s = w->data;
  gn_node *n = s->n;
  output_work--;
  uint64_t total = 0;
  for (size_t i = 0; i < s->count; i++)
    total += s->e[i].remove ? 0 : s->e[i].bytes;
  bool over = total > output_budget(n) || n->disk_low;
  for (size_t i = 0; status == 0 && over && i < s->count; i++) {
    gn_job *j = s->e[i].remove ? NULL : gn__job_find(n, s->e[i].job_id);
    if (!j || (j->state != GN_JOB_PULLING && j->state != GN_JOB_RUNNING) || !n->stop_provided_job)
      continue;
    gn__strf(j->error, sizeof j->error, "%s",
             n->disk_low ? "the provider's disk is down to its reserve: jobs writing /output are stopped"
                         : "the jobs' /output passed the provider's output budget");
    gn_log(GN_LOG_WARN, "job %s: %s (%llu MiB of %llu MiB)", j->id, j->error, (unsigned long long)(total >> 20),
           (unsigned long long)(output_budget(n) >> 20));
    n->stop_provided_job(n, j);
  }
  free(s);
}

static void seed_tick(gn_node *n);

void gn__train_tick(gn_node *n, int64_t now_s) {
  seed_tick(n);
  if (now_s - output_tick_s < OUTPUT_TICK_S || n->stopping || output_work >= OUTPUT_WORK_MAX)
    return;
  output_tick_s = now_s;
  out_survey *s = NULL;
  for (gn_job *j = n->jobs; j; j = j->next) {
    if (j->role != GN_ROLE_PROVIDER)
      continue;
    char dir[PATH_MAX], tar[PATH_MAX];
    output_paths(n, j->id, dir, tar, sizeof dir);
    bool live = j->state == GN_JOB_PULLING || j->state == GN_JOB_RUNNING || j->tasks || j->handles_open;
    gn_lease *l = gn__lease_find(n, j->lease_id);
    bool remove = !live && (!l || l->state != GN_LEASE_ACTIVE);
    struct stat st;
    if ((!live && !remove) || stat(dir, &st) < 0) /* cheap: the data dir is local */
      continue;
    if (!s && !(s = calloc(1, sizeof *s)))
      return;
    if (s->count == GN_ARRAY_SIZE(s->e))
      break;
    gn__strf(s->e[s->count].job_id, sizeof s->e[s->count].job_id, "%s", j->id);
    gn__strf(s->e[s->count].dir, sizeof s->e[s->count].dir, "%s", dir);
    gn__strf(s->e[s->count].tar, sizeof s->e[s->count].tar, "%s", tar);
    s->e[s->count].remove = remove;
    s->count++;
  }
  if (!s)
    return;
  s->n = n;
  s->w.data = s;
  if (uv_queue_work(n->loop, &s->w, survey_work, survey_after) < 0) {
    free(s);
    return;
  }
  output_work++;
}

bool gn__train_busy(const gn_node *n) {
  (void)n;
  return output_work > 0;
}

/* --- the seed: a restarted rank's /output --------------------------------------*/

#define SEED_WAIT_MS 120000u /* without a chunk this long, the job fails */

/* GN_SEED_WAIT_MS (100..600000) shortens the wait for tests. */
static uint64_t seed_wait_ms(void) {
  const char *e = getenv("GN_SEED_WAIT_MS");
  char *end;
  unsigned long long v = e ? strtoull(e, &end, 10) : 0;
  return e && *end == 0 && v >= 100 && v <= 600000 ? v : SEED_WAIT_MS;
}

static void seed_close(train_rank *t) {
  if (t->seed_fd >= 0)
    close(t->seed_fd);
  t->seed_fd = -1;
  if (t->seed_path[0])
    unlink(t->seed_path);
  t->seed_path[0] = 0;
}

static int seed_ask(gn_node *n, const train_rank *t) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__joboutput_get_encode(&w, t->j->id, t->j->lease_id, t->seed_off);
  int r = gn__node_send(n, t->seed_from, GN_MSG_JOB_SEED_GET, &w);
  gn_wire_writer_done(&w);
  return r;
}

static void seed_unpack_start(gn_node *n, gn_job *j, train_rank *t);

/* The seed failed (why) or the job stops (why NULL): its tar removed; a
 * job waiting for it goes on to fail or stop (provider.c). */
static void seed_end(gn_node *n, gn_job *j, train_rank *t, const char *why) {
  seed_close(t);
  t->seed_state = SEED_FAILED;
  if (why) {
    gn_log(GN_LOG_WARN, "job %s: %s", j->id, why);
    if (!j->error[0])
      gn__strf(j->error, sizeof j->error, "%s", why);
    j->cancel = 1; /* a pull still running stops */
  }
  if (t->seed_waiting) {
    t->seed_waiting = false;
    gn__provider_job_seeded(n, j);
  }
}

static void seed_start(gn_node *n, gn_job *j, train_rank *t, const gn_jobman *m) {
  gn_lease *l = gn__lease_find(n, j->lease_id);
  char dir[PATH_MAX], why[300] = "";
  t->seed_state = SEED_FETCHING;
  t->seed_size = m->seed_size;
  memcpy(t->seed_sha256, m->seed_sha256, sizeof t->seed_sha256);
  crypto_hash_sha256_init(&t->seed_hash);
  t->seed_last_ms = gn_mono_ms();
  if (!l) {
    seed_end(n, j, t, "no lease for the seed");
    return;
  }
  memcpy(t->seed_from, l->ag.terms.requester, GN_PK_LEN);
  if (gn__pathf(dir, sizeof dir, "%s/seed", n->cfg.data_dir) < 0 ||
      gn__pathf(t->seed_path, sizeof t->seed_path, "%s/%s.tar", dir, j->id) < 0) {
    t->seed_path[0] = 0;
    seed_end(n, j, t, "cannot keep the seed: its path is too long");
    return;
  }
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    gn__strf(why, sizeof why, "cannot keep the seed: %s: %s", dir, strerror(errno));
    t->seed_path[0] = 0;
    seed_end(n, j, t, why);
    return;
  }
  /* A job id is used once: a file there is no one's, never followed. */
  t->seed_fd = open(t->seed_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (t->seed_fd < 0) {
    gn__strf(why, sizeof why, "cannot keep the seed: %s: %s", t->seed_path, strerror(errno));
    t->seed_path[0] = 0; /* not ours to remove */
    seed_end(n, j, t, why);
    return;
  }
  int r = seed_ask(n, t);
  if (r < 0) {
    gn__strf(why, sizeof why, "cannot ask the lease holder for the seed: %s", gn_strerror(r));
    seed_end(n, j, t, why);
  }
}

void gn__train_on_seed(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_job *j = gn__job_find(n, m.job_id);
  train_rank *t = j && j->role == GN_ROLE_PROVIDER ? rank_find(j) : NULL;
  /* Only the lease holder's chunks of a seed being fetched count; any
   * other is dropped unread. */
  if (!t || t->seed_state != SEED_FETCHING || memcmp(peer, t->seed_from, GN_PK_LEN) != 0) {
    gn__jobmsg_done(&m);
    return;
  }
  char why[300] = "";
  if (j->finished || j->state != GN_JOB_PULLING) {
    seed_end(n, j, t, NULL);
  } else if (m.reason[0]) {
    gn__strf(why, sizeof why, "the lease holder has no seed for this job: %s", m.reason);
  } else if (m.offset != t->seed_off) {
    gn__strf(why, sizeof why, "bad seed: a chunk at offset %llu, not %llu", (unsigned long long)m.offset,
             (unsigned long long)t->seed_off);
  } else if (m.size && m.size != t->seed_size) {
    gn__strf(why, sizeof why, "bad seed: the lease holder's has %llu bytes, the manifest says %llu",
             (unsigned long long)m.size, (unsigned long long)t->seed_size);
  } else if (m.data_len > t->seed_size - t->seed_off) {
    gn__strf(why, sizeof why, "bad seed: more bytes than the manifest's %llu", (unsigned long long)t->seed_size);
  } else if (m.data_len == 0 && !m.eof) {
    gn__strf(why, sizeof why, "bad seed: an empty chunk at offset %llu", (unsigned long long)m.offset);
  } else {
    /* One chunk of GN_JOB_OUTPUT_CHUNK at most, to a local file. */
    size_t done = 0;
    while (done < m.data_len) {
      ssize_t k = pwrite(t->seed_fd, m.data + done, m.data_len - done, (off_t)(t->seed_off + done));
      if (k < 0 && errno == EINTR)
        continue;
      if (k <= 0) {
        gn__strf(why, sizeof why, "cannot keep the seed: %s", k < 0 ? strerror(errno) : "short write");
        break;
      }
      done += (size_t)k;
    }
    if (!why[0]) {
      crypto_hash_sha256_update(&t->seed_hash, m.data, m.data_len);
      t->seed_off += m.data_len;
      t->seed_last_ms = gn_mono_ms();
      if (m.eof) {
        uint8_t h[32];
        crypto_hash_sha256_final(&t->seed_hash, h);
        if (t->seed_off != t->seed_size)
          gn__strf(why, sizeof why, "bad seed: it ended at %llu of the manifest's %llu bytes",
                   (unsigned long long)t->seed_off, (unsigned long long)t->seed_size);
        else if (sodium_memcmp(h, t->seed_sha256, sizeof h) != 0)
          gn__strf(why, sizeof why, "bad seed: its sha256 is not the manifest's");
        else {
          close(t->seed_fd);
          t->seed_fd = -1;
          t->seed_state = SEED_FETCHED;
          gn_log(GN_LOG_INFO, "job %s: seed of %llu bytes fetched", j->id, (unsigned long long)t->seed_size);
          if (t->seed_waiting)
            seed_unpack_start(n, j, t);
        }
      } else {
        int r = seed_ask(n, t);
        if (r < 0)
          gn__strf(why, sizeof why, "cannot ask the lease holder for the seed: %s", gn_strerror(r));
      }
    }
  }
  gn__jobmsg_done(&m);
  if (why[0])
    seed_end(n, j, t, why);
}

bool gn__train_seed_wait(gn_node *n, gn_job *j) {
  train_rank *t = rank_find(j);
  if (!t || t->seed_state == SEED_NONE || t->seed_state == SEED_DONE)
    return false;
  if (t->seed_state == SEED_FAILED) { /* j->error says why; never started */
    if (!j->error[0])
      gn__strf(j->error, sizeof j->error, "the seed failed");
    return false;
  }
  t->seed_waiting = true;
  if (t->seed_state == SEED_FETCHED)
    seed_unpack_start(n, j, t);
  return true;
}

void gn__train_seed_stop(gn_node *n, gn_job *j) {
  train_rank *t = rank_find(j);
  if (!t || (t->seed_state != SEED_FETCHING && t->seed_state != SEED_FETCHED))
    return; /* an unpack in progress sees j->cancel and ends */
  seed_end(n, j, t, NULL);
}

/* --- unpacking, on the thread pool --- */

typedef struct seed_work {
  uv_work_t w;
  gn_node *n;
  gn_job *j;
  char tar[PATH_MAX], dir[PATH_MAX];
  uint32_t uid;
  bool own; /* chown to the job's mapped root */
  uint64_t cap, bytes, entries;
  int rc;
  char err[300];
} seed_work;

/* The parent directory of name's last component under dirfd, made (0755)
 * where missing, never through a link; the last component to *ret_last.
 * GN_EINVAL for a name that is absolute, climbs (".."), too deep or long.
 * A name of only "." components gives ret_last "" (the root). */
static int seed_parent(seed_work *s, int dirfd, const char *name, char *buf, size_t cap, const char **ret_last) {
  if (name[0] == '/' || strlen(name) >= cap)
    return GN_EINVAL;
  memcpy(buf, name, strlen(name) + 1);
  const char *comps[OUTPUT_MAX_DEPTH + 2];
  size_t k = 0;
  char *save = NULL;
  for (char *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (strcmp(c, ".") == 0)
      continue;
    if (strcmp(c, "..") == 0 || strlen(c) > NAME_MAX || k == GN_ARRAY_SIZE(comps))
      return GN_EINVAL;
    comps[k++] = c;
  }
  if (k > OUTPUT_MAX_DEPTH + 1)
    return GN_EINVAL;
  *ret_last = k ? comps[k - 1] : "";
  int fd = dup(dirfd);
  for (size_t i = 0; fd >= 0 && i + 1 < k; i++) {
    if (mkdirat(fd, comps[i], 0755) == 0) {
      if (s->own && fchownat(fd, comps[i], s->uid, s->uid, AT_SYMLINK_NOFOLLOW) < 0) {
        close(fd);
        return -errno;
      }
    } else if (errno != EEXIST) {
      int e = -errno;
      close(fd);
      return e;
    }
    int next = openat(fd, comps[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int e = -errno;
    close(fd);
    if (next < 0)
      return e == -ELOOP || e == -ENOTDIR ? GN_EINVAL : e;
    fd = next;
  }
  return fd < 0 ? -errno : fd;
}

/* One entry: a directory or a regular file (its data), nothing else. */
static int seed_entry(seed_work *s, struct archive *a, struct archive_entry *ae, int dirfd) {
  const char *name = archive_entry_pathname(ae);
  char shown[96];
  gn__strf(shown, sizeof shown, "%s", name ? name : "(no name)");
  mode_t type = archive_entry_filetype(ae);
  if (!name || archive_entry_hardlink(ae) || archive_entry_symlink(ae) || (type != AE_IFREG && type != AE_IFDIR)) {
    gn__strf(s->err, sizeof s->err,
             "bad seed: '%s' is a link, device, fifo or socket; a seed holds only files and directories", shown);
    return GN_EINVAL;
  }
  if (++s->entries > OUTPUT_MAX_ENTRIES) {
    gn__strf(s->err, sizeof s->err, "bad seed: more than %d entries", OUTPUT_MAX_ENTRIES);
    return GN_ETOOBIG;
  }
  char buf[PATH_MAX];
  const char *last = NULL;
  int pfd = seed_parent(s, dirfd, name, buf, sizeof buf, &last);
  if (pfd < 0) {
    if (pfd == GN_EINVAL)
      gn__strf(s->err, sizeof s->err, "bad seed: '%s' is not a path inside /output", shown);
    else
      gn__strf(s->err, sizeof s->err, "cannot unpack the seed's '%s': %s", shown, gn_strerror(pfd));
    return pfd;
  }
  int r = 0;
  if (!last[0]) { /* "." or "./": /output itself */
    if (type != AE_IFDIR) {
      gn__strf(s->err, sizeof s->err, "bad seed: '%s' is not a path inside /output", shown);
      r = GN_EINVAL;
    }
    close(pfd);
    return r;
  }
  if (type == AE_IFDIR) {
    struct stat st;
    if (mkdirat(pfd, last, 0755) < 0 &&
        (errno != EEXIST || fstatat(pfd, last, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))) {
      gn__strf(s->err, sizeof s->err, "bad seed: cannot make the directory '%s'", shown);
      r = GN_EINVAL;
    } else if (s->own && fchownat(pfd, last, s->uid, s->uid, AT_SYMLINK_NOFOLLOW) < 0) {
      r = -errno;
      gn__strf(s->err, sizeof s->err, "cannot unpack the seed's '%s': %s", shown, strerror(errno));
    }
    close(pfd);
    return r;
  }
  la_int64_t size = archive_entry_size_is_set(ae) ? archive_entry_size(ae) : 0;
  if (size < 0 || (uint64_t)size > s->cap - s->bytes) {
    gn__strf(s->err, sizeof s->err, "bad seed: it unpacks to more than the provider's /output budget (%llu MiB)",
             (unsigned long long)(s->cap >> 20));
    close(pfd);
    return GN_ETOOBIG;
  }
  /* Setuid, setgid and sticky bits never come out; the execute bit does. */
  mode_t mode = (archive_entry_perm(ae) & 0111) ? 0755 : 0644;
  int fd = openat(pfd, last, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  close(pfd);
  if (fd < 0) {
    gn__strf(s->err, sizeof s->err, "bad seed: cannot make the file '%s': %s", shown, strerror(errno));
    return GN_EINVAL;
  }
  if ((s->own && fchown(fd, s->uid, s->uid) < 0) || fchmod(fd, mode) < 0) {
    r = -errno;
    gn__strf(s->err, sizeof s->err, "cannot unpack the seed's '%s': %s", shown, strerror(errno));
  }
  char data[65536];
  while (r == 0) {
    if (s->j->cancel) {
      r = GN_ECANCELED;
      break;
    }
    la_ssize_t k = archive_read_data(a, data, sizeof data);
    if (k == 0)
      break;
    if (k < 0) {
      gn__strf(s->err, sizeof s->err, "bad seed: '%s': %s", shown, archive_error_string(a));
      r = GN_EINVAL;
      break;
    }
    /* What comes out is counted, whatever the header said (sparse holes
     * included). */
    if ((uint64_t)k > s->cap - s->bytes) {
      gn__strf(s->err, sizeof s->err, "bad seed: it unpacks to more than the provider's /output budget (%llu MiB)",
               (unsigned long long)(s->cap >> 20));
      r = GN_ETOOBIG;
      break;
    }
    s->bytes += (uint64_t)k;
    for (la_ssize_t done = 0; r == 0 && done < k;) {
      ssize_t w = write(fd, data + done, (size_t)(k - done));
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0) {
        r = w < 0 ? -errno : GN_EIO;
        gn__strf(s->err, sizeof s->err, "cannot unpack the seed's '%s': %s", shown,
                 w < 0 ? strerror(errno) : "short write");
      }
      done += w > 0 ? w : 0;
    }
  }
  close(fd);
  return r;
}

static void seed_unpack_work(uv_work_t *w) {
  seed_work *s = w->data;
  int dfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int tfd = open(s->tar, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct archive *a = archive_read_new();
  if (dfd < 0 || tfd < 0 || !a) {
    s->rc = dfd < 0 || tfd < 0 ? GN_EIO : GN_ENOMEM;
    gn__strf(s->err, sizeof s->err, "cannot unpack the seed: %s", dfd < 0 ? "no /output" : "its tar is gone");
    goto out;
  }
  /* tar only, uncompressed: no filter, so nothing inflates. */
  archive_read_support_format_tar(a);
  if (archive_read_open_fd(a, tfd, 65536) != ARCHIVE_OK) {
    gn__strf(s->err, sizeof s->err, "bad seed: not a tar: %s", archive_error_string(a));
    s->rc = GN_EINVAL;
    goto out;
  }
  struct archive_entry *ae;
  for (;;) {
    if (s->j->cancel) { /* stopped meanwhile */
      s->rc = GN_ECANCELED;
      break;
    }
    int r = archive_read_next_header(a, &ae);
    if (r == ARCHIVE_EOF)
      break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      gn__strf(s->err, sizeof s->err, "bad seed: not a tar: %s", archive_error_string(a));
      s->rc = GN_EINVAL;
      break;
    }
    if ((s->rc = seed_entry(s, a, ae, dfd)) < 0)
      break;
  }
out:
  if (a)
    archive_read_free(a);
  if (tfd >= 0)
    close(tfd);
  if (dfd >= 0)
    close(dfd);
  unlink(s->tar); /* unpacked or refused: not needed any more */
}

static void seed_unpack_after(uv_work_t *w, int status) {
  seed_work *s = w->data;
  gn_node *n = s->n;
  gn_job *j = s->j;
  output_work--;
  j->tasks--;
  train_rank *t = rank_find(j);
  if (t) {
    t->seed_path[0] = 0; /* removed by the work */
    if (status == 0 && s->rc == 0) {
      t->seed_state = SEED_DONE;
      gn_log(GN_LOG_INFO, "job %s: seed unpacked into /output (%llu entries, %llu bytes)", j->id,
             (unsigned long long)s->entries, (unsigned long long)s->bytes);
      t->seed_waiting = false;
      gn__provider_job_seeded(n, j);
    } else {
      seed_end(n, j, t,
               s->rc == GN_ECANCELED && j->stop_requested ? NULL
               : s->err[0]                                ? s->err
                                                          : "cannot unpack the seed");
    }
  }
  free(s);
}

static void seed_unpack_start(gn_node *n, gn_job *j, train_rank *t) {
  seed_work *s = calloc(1, sizeof *s);
  if (!s) {
    seed_end(n, j, t, "provider out of memory");
    return;
  }
  s->n = n;
  s->j = j;
  gn__strf(s->tar, sizeof s->tar, "%s", t->seed_path);
  gn__strf(s->dir, sizeof s->dir, "%s", t->output_dir);
  s->uid = j->uid_base;
  s->own = j->id_count > 0;
  s->cap = output_budget(n);
  s->w.data = s;
  t->seed_state = SEED_UNPACKING;
  if (uv_queue_work(n->loop, &s->w, seed_unpack_work, seed_unpack_after) < 0) {
    free(s);
    seed_end(n, j, t, "cannot unpack the seed");
    return;
  }
  output_work++;
  j->tasks++;
}

/* The lease holders that went quiet: called each tick (once a second). */
static void seed_tick(gn_node *n) {
  uint64_t now = gn_mono_ms(), wait = seed_wait_ms();
  for (int i = 0; i < 64; i++) {
    train_rank *late = NULL;
    pthread_mutex_lock(&ranks_lock);
    for (train_rank *t = ranks; t && !late; t = t->next)
      if (t->seed_state == SEED_FETCHING && gn_ms_since(now, t->seed_last_ms) > wait)
        late = t;
    pthread_mutex_unlock(&ranks_lock);
    if (!late)
      return;
    char why[200];
    gn__strf(why, sizeof why, "the lease holder sent no part of the seed for %.1f s (%llu of %llu bytes in)",
             (double)wait / 1000, (unsigned long long)late->seed_off, (unsigned long long)late->seed_size);
    seed_end(n, gn__job_find(n, late->j->id), late, why);
  }
}
