/* The provider agent: offers for the local GPUs, accepting lease requests,
 * the per-second meter, running signed job manifests in the sandbox, and the
 * invoice at the end of each lease. */
#include "provider.h"

#include "attest_net.h"
#include "node_internal.h"
#include "pool.h"
#include "settle_glue.h"
#include "train_prov.h"
#include "uidalloc.h"
#include "util.h"
#include "ws.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <errno.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define GN_LEASE_MAX_JOBS 8 /* jobs pulling or running at once on one lease */
#define GN_OFFER_TTL_S 60
#define GN_KILL_AGAIN_MS 300 /* a stopped job whose container still runs is killed again this often */
#define GN_OFFER_REFRESH_S 20
/* User namespaces: lease slot s maps the job's ids 0..65535 to host ids
 * GN_USERNS_BASE + s * GN_USERNS_SIZE onwards. */
#define GN_USERNS_BASE (1u << 20)
#define GN_USERNS_SIZE 65536u
#define GN_USERNS_SLOTS ((uint32_t)((UINT32_MAX - GN_USERNS_BASE) / GN_USERNS_SIZE))
#define GN_CPU_PERIOD_US 100000u

/* The transport is gone once the daemon's shutdown closed it. */
static bool peer_is_up(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  return n->tp && gn_transport_is_up(n->tp, peer);
}

/* --- the host, its budgets and its isolation ----------------------------------*/

bool gn__userns_probe(char *why, size_t cap) {
  FILE *f = fopen("/proc/sys/user/max_user_namespaces", "re");
  long max = -1;
  if (f) {
    if (fscanf(f, "%ld", &max) != 1)
      max = -1;
    fclose(f);
  }
  if (max == 0) {
    gn__strf(why, cap, "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)");
    return false;
  }
  if (geteuid() != 0) {
    gn__strf(why, cap, "gpunetd does not run as root, so it cannot map a range of host ids into a job's namespace");
    return false;
  }
  /* The probe: a child unshares a user namespace, this process writes its
   * maps the way the runtime will, and the child checks it is root there. */
  int up[2] = {-1, -1}, down[2] = {-1, -1};
  bool ok = false;
  if (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0) {
    gn__strf(why, cap, "cannot probe user namespaces: %s", strerror(errno));
    goto out;
  }
  pid_t pid = fork();
  if (pid < 0) {
    gn__strf(why, cap, "cannot probe user namespaces: %s", strerror(errno));
    goto out;
  }
  if (pid == 0) {
    char c = 0;
    if (unshare(CLONE_NEWUSER) < 0)
      _exit(2);
    if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
      _exit(3);
    /* Still the unmapped host root until it becomes the namespace's 0, as
     * the runtime's init does. */
    if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
      _exit(4);
    _exit(getuid() == 0 && getgid() == 0 ? 0 : 4);
  }
  close(up[1]);
  up[1] = -1;
  char c, path[64], map[64];
  bool mapped = false;
  if (read(up[0], &c, 1) == 1) {
    gn__strf(map, sizeof map, "0 %u %u\n", GN_USERNS_BASE, GN_USERNS_SIZE);
    mapped = true;
    for (int k = 0; k < 2 && mapped; k++) {
      gn__strf(path, sizeof path, "/proc/%d/%s", (int)pid, k ? "gid_map" : "uid_map");
      int fd = open(path, O_WRONLY | O_CLOEXEC);
      mapped = fd >= 0 && write(fd, map, strlen(map)) == (ssize_t)strlen(map);
      if (fd >= 0)
        close(fd);
    }
  }
  if (write(down[1], "x", 1) != 1)
    mapped = false;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  ok = mapped && code == 0;
  if (!ok)
    gn__strf(why, cap, "%s",
             code == 2 ? "unshare(CLONE_NEWUSER) is refused here (a container or a seccomp policy?)"
             : !mapped ? "a user namespace's id map cannot be written here"
                       : "a mapped user namespace does not work here");
out:
  for (int k = 0; k < 2; k++) {
    if (up[k] >= 0)
      close(up[k]);
    if (down[k] >= 0)
      close(down[k]);
  }
  return ok;
}

/* A job's root in its user namespace is an unprivileged host uid: the
 * runtime mounts the job's image root as that uid, so every directory above
 * the data dir must let others search it (not list it). gpunetd makes its
 * own directories so (0711); the ones above are the operator's to change. */
static bool ancestors_searchable(const char *data_dir, char *err, size_t cap) {
  char path[PATH_MAX];
  if (!realpath(data_dir, path))
    return true; /* created later; mkdir reports what is wrong */
  for (char *slash = strrchr(path, '/'); slash; slash = strrchr(path, '/')) {
    *slash = 0;
    const char *dir = path[0] ? path : "/";
    struct stat st;
    if (stat(dir, &st) == 0 && !(st.st_mode & S_IXOTH)) {
      gn__strf(err, cap,
               "jobs run as unprivileged host uids in their own user namespace and must reach their image roots under "
               "%s, but %s (mode %04o) does not let other users search it: run `chmod o+x %s` (search only, no "
               "listing) or choose a data dir under a searchable path",
               data_dir, dir, (unsigned)(st.st_mode & 07777), dir);
      return false;
    }
    if (!path[0])
      break;
  }
  return true;
}

/* The job's view of its root. gpunetd moves into a private mount namespace
 * (host mounts still reach it; its own stay its own and vanish with it),
 * with a small tmpfs at GN_DATA_ALIAS_DIR holding:
 *  - data: a bind mount of the data dir. When a directory above the data
 *    dir is not searchable by others (root's default, under a 0700 /root),
 *    the jobs' uids reach their roots through it rather than /root being
 *    opened up.
 *  - jobs/<container>: each job's root, a read-only overlay over the shared
 *    image root. A bind mount would show the host path of the image root in
 *    the job's /proc/self/mountinfo; an overlay's own root is "/", and its
 *    options name only the path through "data".
 * Without a mount namespace (no CAP_SYS_ADMIN) jobs get the image root
 * itself, unless the data dir is out of their reach: then this refuses. */
#define GN_DATA_ALIAS_DIR "/run/gpunet"

static int data_alias_setup(gn_node *n, char *err, size_t cap) {
  char why[sizeof n->userns_why + 400];
  bool reachable = !n->userns_ok || ancestors_searchable(n->cfg.data_dir, why, sizeof why);
  char alias[64];
  gn__strf(alias, sizeof alias, "%s/data", GN_DATA_ALIAS_DIR);
  if ((mkdir(GN_DATA_ALIAS_DIR, 0711) < 0 && errno != EEXIST) || unshare(CLONE_NEWNS) < 0 ||
      mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
      mount("tmpfs", GN_DATA_ALIAS_DIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0711,size=16m") < 0 ||
      mkdir(alias, 0711) < 0 || mkdir(GN_DATA_ALIAS_DIR "/jobs", 0711) < 0 ||
      mkdir(GN_DATA_ALIAS_DIR "/empty", 0755) < 0 || mount(n->cfg.data_dir, alias, NULL, MS_BIND, NULL) < 0) {
    if (!reachable) {
      gn__strf(err, cap, "%s (gpunetd could not bind-mount it at %s instead: %s)", why, alias, strerror(errno));
      return GN_EPERM;
    }
    gn_log(GN_LOG_WARN,
           "no private mount namespace for jobs' roots (%s): a job can read the data dir's path in its "
           "mountinfo",
           strerror(errno));
    return 0;
  }
  gn__strf(n->data_alias, sizeof n->data_alias, "%s", alias);
  if (!reachable)
    gn_log(GN_LOG_INFO, "a directory above %s is not searchable by the jobs' uids: they reach it through %s",
           n->cfg.data_dir, alias);
  return 0;
}

/* path (under the data dir) as the runtime and the job's uid reach it. */
static void job_visible_path(const gn_node *n, const char *path, char *buf, size_t cap) {
  size_t k = strlen(n->cfg.data_dir);
  if (n->data_alias[0] && strncmp(path, n->cfg.data_dir, k) == 0 && path[k] == '/')
    gn__strf(buf, cap, "%s%s", n->data_alias, path + k);
  else
    gn__strf(buf, cap, "%s", path);
}

/* The job's own overlay over its image root (see above): its upper layer,
 * on gpunetd's tmpfs, takes only the mount points the runtime creates
 * before it makes the root read-only, so the shared image root is never
 * written. ret (4096 bytes) gets the root's path; false when it cannot be
 * made (the image root is then used as it is). Blocking: on the pool. */
static bool job_overlay_mount(const gn_node *n, gn_job *j, const char *lower, char *ret) {
  char base[128], up[160], work[160], opts[4600];
  if (!n->data_alias[0] || strpbrk(lower, ",:\\") ||
      gn__pathf(base, sizeof base, "%s/jobs/%s", GN_DATA_ALIAS_DIR, j->container_id) < 0)
    return false;
  gn__strf(up, sizeof up, "%s/u", base);
  gn__strf(work, sizeof work, "%s/w", base);
  gn__strf(ret, 4096, "%s/root", base);
  gn__strf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", lower, up, work);
  /* The upper layer's top is the root's top: it must be owned like the
   * image root (the job's mapped root), or the runtime in the job's user
   * namespace could not create its mount points. */
  struct stat st;
  if (stat(lower, &st) < 0 || (mkdir(base, 0711) < 0 && errno != EEXIST) || (mkdir(up, 0700) < 0 && errno != EEXIST) ||
      chown(up, st.st_uid, st.st_gid) < 0 || chmod(up, st.st_mode & 07777) < 0 ||
      (mkdir(work, 0700) < 0 && errno != EEXIST) || (mkdir(ret, 0711) < 0 && errno != EEXIST) ||
      mount("overlay", ret, "overlay", MS_NOSUID | MS_NODEV, opts) < 0) {
    gn__strf(j->work_log, sizeof j->work_log, "no overlay for the job's root (%s): its mountinfo shows the image path",
             strerror(errno));
    gn_rm_tree(base);
    return false;
  }
  gn__strf(j->overlay, sizeof j->overlay, "%s", base);
  return true;
}

int gn__provider_init(gn_node *n, char *err, size_t cap) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE), cpus = sysconf(_SC_NPROCESSORS_ONLN);
  uint64_t ram_mib = pages > 0 && page > 0 ? ((uint64_t)pages * (uint64_t)page) >> 20 : 0;
  n->mem_budget_mib = (uint64_t)((double)ram_mib * n->cfg.job_memory_share);
  n->pids_budget = n->cfg.job_pids_max;
  n->cpu_budget = (double)(cpus > 0 ? cpus : 1) * n->cfg.job_cpu_share;
  if (!n->cfg.provide)
    return 0;
  n->limits_enforced = gn_cgroup_limits_supported();
  n->userns_ok = gn__userns_probe(n->userns_why, sizeof n->userns_why);
  if (!n->userns_ok && !n->cfg.allow_no_userns) {
    gn__strf(err, cap,
             "this host cannot run jobs in their own user namespace (%s), so a job's root would be the host's "
             "root; refusing to provide (set allow_no_userns = true, or --allow-no-userns, to provide anyway: "
             "status and offers then say so)",
             n->userns_why);
    return GN_EUNSUPPORTED;
  }
  int r = data_alias_setup(n, err, cap);
  if (r < 0)
    return r;
  if (!n->userns_ok)
    gn_log(GN_LOG_WARN,
           "no user namespaces here (%s): jobs run as the host's root without capabilities, as "
           "allow_no_userns permits",
           n->userns_why);
  if (!n->limits_enforced)
    gn_log(GN_LOG_WARN, "cgroups here cannot enforce a job's memory, pids and CPU limits: %s",
           n->cfg.allow_unenforced_limits ? "jobs run without them, as allow_unenforced_limits permits"
                                          : "jobs are refused (allow_unenforced_limits = true runs them anyway)");
  gn_log(GN_LOG_INFO, "job budgets: %llu MiB of memory (%.2f of %llu MiB), %.2f CPUs (%.2f of %ld), %u processes",
         (unsigned long long)n->mem_budget_mib, n->cfg.job_memory_share, (unsigned long long)ram_mib, n->cpu_budget,
         n->cfg.job_cpu_share, cpus, n->pids_budget);
  gn__train_remove_stale(n); /* what a crashed run's training ranks left */
  return 0;
}

json_t *gn__provider_status_json(const gn_node *n) {
  json_t *o = json_pack("{s:b, s:b, s:b, s:I, s:I, s:I, s:I, s:f, s:b}", "limits_enforced", n->limits_enforced,
                        "unenforced_limits_allowed", n->cfg.allow_unenforced_limits, "user_namespaces", n->userns_ok,
                        "memory_budget_mib", (json_int_t)n->mem_budget_mib, "memory_used_mib",
                        (json_int_t)n->mem_used_mib, "pids_budget", (json_int_t)n->pids_budget, "pids_used",
                        (json_int_t)n->pids_used, "cpu_budget", n->cpu_budget, "disk_low", n->disk_low);
  if (o && !n->userns_ok)
    json_object_set_new(o, "user_namespaces_why", json_string(n->userns_why));
  return o;
}

/* The lowest user namespace slot no lease of any gpunetd on this host holds
 * (node/uidalloc.h: a lock per slot). A lease keeps its slot until it has
 * ended and none of its jobs is left on the host, so two leases' jobs never
 * share a host uid; a resumed lease claims one again. -1: none (logged). */
static int uid_slot_alloc(gn_node *n) {
  uint32_t s;
  int r = gn_uidalloc_claim(gn_uidalloc_dir(), GN_USERNS_SLOTS, &s);
  if (r < 0)
    gn_log(GN_LOG_ERROR, "no user namespace slot under %s: %s", gn_uidalloc_dir(), gn_strerror(r));
  (void)n;
  return r < 0 ? -1 : (int)s;
}

static void lease_release_slot_if_idle(gn_node *n, gn_lease *l) {
  if (l->uid_slot < 0 || l->state == GN_LEASE_ACTIVE)
    return;
  for (const gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_PROVIDER && strcmp(j->lease_id, l->id) == 0 && (j->tasks || j->handles_open))
      return;
  gn_uidalloc_release(gn_uidalloc_dir(), (uint32_t)l->uid_slot);
  l->uid_slot = -1;
}

static void lease_cgroup_remove_if_idle(gn_node *n, gn_lease *l);

/* The lease's part of the CPU budget: its share of the host's GPUs. */
static uint64_t lease_cpu_quota_us(const gn_node *n, const gn_lease *l) {
  uint32_t mine = 0;
  for (int i = 0; i < GN_LEASE_MAX_GPUS && l->gpu_index[i] >= 0; i++)
    mine++;
  size_t total = n->gpus.count ? n->gpus.count : 1;
  double q = n->cpu_budget * (double)(mine ? mine : 1) / (double)total * GN_CPU_PERIOD_US;
  return q < 1000 ? 1000 : (uint64_t)q;
}

/* --- offers -----------------------------------------------------------------*/

static uint32_t gpus_free_of(gn_node *n, const char *model, uint32_t *ret_total) {
  uint32_t free_n = 0, total = 0;
  for (size_t i = 0; i < n->gpus.count; i++) {
    if (strcmp(n->gpus.items[i].name, model) != 0)
      continue;
    total++;
    if (!n->gpu_leased_by[i][0])
      free_n++;
  }
  *ret_total = total;
  return free_n;
}

static bool model_seen_before(gn_node *n, size_t upto) {
  for (size_t k = 0; k < upto; k++)
    if (strcmp(n->gpus.items[k].name, n->gpus.items[upto].name) == 0)
      return true;
  return false;
}

/* Offer sequence numbers must grow across restarts too, or peers would keep
 * a stale offer from the previous run: derive them from the wall clock. */
static uint64_t next_seq(gn_node *n, int64_t now_s) {
  uint64_t s = (uint64_t)now_s * 1000u;
  n->offer_seq = s > n->offer_seq ? s : n->offer_seq + 1;
  return n->offer_seq;
}

void gn__provider_publish_offers(gn_node *n, int64_t now_s) {
  if (!n->cfg.provide || n->stopping)
    return;
  for (size_t i = 0; i < n->gpus.count; i++) {
    if (model_seen_before(n, i))
      continue;
    const gn_gpu *g = &n->gpus.items[i];
    gn_offer o;
    memset(&o, 0, sizeof o);
    memcpy(o.provider, n->id->pk, GN_PK_LEN);
    o.seq = next_seq(n, now_s);
    o.issued_s = now_s;
    o.expires_s = now_s + GN_OFFER_TTL_S;
    gn__strf(o.addr, sizeof o.addr, "%s", gn_transport_listen_addr(n->tp));
    gn__strf(o.gpu_model, sizeof o.gpu_model, "%s", g->name);
    o.vram_mib = (uint32_t)g->memory_mib;
    o.gpus_free = gpus_free_of(n, g->name, &o.gpus_total);
    o.price_uper_hour = n->cfg.price_uper_hour;
    gn__strf(o.currency, sizeof o.currency, "%s", n->cfg.currency);
    o.max_hours = n->cfg.max_hours;
    o.simulated = g->simulated;
    o.no_userns = !n->userns_ok;               /* allow_no_userns: said in the offer, signed */
    o.unenforced_limits = !n->limits_enforced; /* allow_unenforced_limits: likewise */
    gn__train_offer(n, &o);                    /* training, jobnet_ports (train_prov.c) */
    gn__nat_offer(n, &o);                      /* relay_id, relay_addr behind NAT (nat.c) */
    const gn_attest_local *a = gn__attest_local_find(n, g->name);
    if (a && a->report_env.len && a->report_env.len <= sizeof o.attest) {
      memcpy(o.attest, a->report_env.data, a->report_env.len);
      o.attest_len = (uint32_t)a->report_env.len;
    }
    gn_buf env = {0};
    int r = gn_offer_seal(n->id, &o, &env);
    if (r == 0)
      r = gn_discovery_publish(n->disc, env.data, env.len, now_s);
    if (r < 0)
      gn_log(GN_LOG_WARN, "cannot publish offer for %s: %s", g->name, gn_strerror(r));
    gn_buf_done(&env);
  }
  n->offer_published_s = now_s;
  n->offers_dirty = false;
}

void gn__provider_withdraw_offers(gn_node *n) {
  if (!n->cfg.provide)
    return;
  gn_buf env = {0};
  if (gn_offer_withdraw_seal(n->id, n->offer_seq, &env) == 0) {
    gn_discovery_publish(n->disc, env.data, env.len, gn_unix_s());
  }
  gn_buf_done(&env);
}

/* --- leases -----------------------------------------------------------------*/

static void send_simple(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, const char *lease_id,
                        const char *reason, int64_t end_s) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, end_s ? 3 : 2);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason ? reason : "");
  if (end_s) {
    gn_wire_put_str(&w, "end_s");
    gn_wire_put_i64(&w, end_s);
  }
  gn__node_send(n, peer, type, &w);
  gn_wire_writer_done(&w);
}

static void reject_lease(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *lease_id, const char *reason) {
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, pid);
  gn_log(GN_LOG_INFO, "rejecting lease %s from %s: %s", lease_id, pid, reason);
  send_simple(n, peer, GN_MSG_LEASE_REJECT, lease_id, reason, 0);
}

/* The provider's lease acceptance rules (docs/protocol.md states them), in
 * the order they are checked, each refused with its own reason: the request
 * is signed by its requester, who is the sender, and names this provider;
 * the lease id is new; requested_s is within GN_LEASE_CLOCK_WINDOW_S of this
 * provider's clock; gpu_model names a model here exactly (byte for byte,
 * no case folding or prefix) and count of them are free; the currency is
 * this provider's; the price is at least its price per GPU-hour; 1 <= max_s
 * <= max_hours; interval_min_s <= interval_s <= interval_max_s; simulated
 * GPUs only to a request that accepts them. */
#define GN_LEASE_CLOCK_WINDOW_S 300

static gn_lease_now lease_now(void);
static int prov_perform(gn_node *n, gn_lease *l, gn_lease_out *out);
static void lease_end_local(gn_node *n, gn_lease *l, const char *reason);

static void on_lease_request(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len) {
  gn_lease_terms t;
  char reason[256];
  int64_t now_s = gn_unix_s();
  int r = gn_lease_request_open(raw, raw_len, &t);
  if (r < 0) {
    gn_log(GN_LOG_WARN, "malformed lease request: %s", gn_strerror(r));
    return;
  }
  if (!n->cfg.provide) {
    reject_lease(n, peer, t.lease_id, "this node does not provide GPUs");
    return;
  }
  if (memcmp(t.provider, n->id->pk, GN_PK_LEN) != 0 || memcmp(t.requester, peer, GN_PK_LEN) != 0) {
    reject_lease(n, peer, t.lease_id, "the request names another provider or requester");
    return;
  }
  if (gn__lease_find(n, t.lease_id)) {
    reject_lease(n, peer, t.lease_id, "lease id already used (replayed request?)");
    return;
  }
  if (t.requested_s < now_s - GN_LEASE_CLOCK_WINDOW_S || t.requested_s > now_s + GN_LEASE_CLOCK_WINDOW_S) {
    reject_lease(n, peer, t.lease_id, "request time is more than 5 minutes off this provider's clock");
    return;
  }
  uint32_t total = 0, free_n = gpus_free_of(n, t.gpu_model, &total);
  if (total == 0) {
    gn__strf(reason, sizeof reason, "no %s here", t.gpu_model);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  if (t.count < 1 || t.count > free_n) {
    gn__strf(reason, sizeof reason, "asked for %u x %s but %u of %u are free", t.count, t.gpu_model, free_n, total);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  /* Currency first: a price in another currency is not "below" ours, and
   * the requester must be told which one this provider bills in. */
  if (strcmp(t.currency, n->cfg.currency) != 0) {
    gn__strf(reason, sizeof reason, "currency %s is not this provider's: it bills in %s", t.currency, n->cfg.currency);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  /* The agreement bills the price the requester signed; a requester may
   * offer more than the asking price (its daemon never does: it asks the
   * offer's price and never above its --max-price), never less. */
  if (t.price_uper_hour < n->cfg.price_uper_hour) {
    char want[32];
    gn_price_format(n->cfg.price_uper_hour, want, sizeof want);
    gn__strf(reason, sizeof reason, "price below this provider's %s %s per GPU-hour", want, n->cfg.currency);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  if (t.max_s < 1 || t.max_s > (uint64_t)n->cfg.max_hours * 3600u) {
    gn__strf(reason, sizeof reason, "duration must be between 1 second and %u hours", n->cfg.max_hours);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  if (t.interval_s < n->cfg.interval_min_s || t.interval_s > n->cfg.interval_max_s) {
    gn__strf(reason, sizeof reason, "billing interval %us is outside this provider's %u..%us", t.interval_s,
             n->cfg.interval_min_s, n->cfg.interval_max_s);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  bool simulated = false;
  const char *uuids[GN_LEASE_MAX_GPUS];
  int idx[GN_LEASE_MAX_GPUS];
  uint32_t got = 0;
  for (size_t i = 0; i < n->gpus.count && got < t.count; i++) {
    if (strcmp(n->gpus.items[i].name, t.gpu_model) != 0 || n->gpu_leased_by[i][0])
      continue;
    simulated |= n->gpus.items[i].simulated;
    uuids[got] = n->gpus.items[i].uuid;
    idx[got++] = (int)i;
  }
  if (simulated && !t.simulated) {
    reject_lease(n, peer, t.lease_id, "these GPUs are SIMULATED and the request did not accept simulated GPUs");
    return;
  }

  gn_lease *l = calloc(1, sizeof *l);
  if (!l)
    return;
  r = gn_agreement_seal(n->id, raw, raw_len, now_s, uuids, got, &l->agreement_env);
  if (r == 0)
    r = gn_agreement_open(l->agreement_env.data, l->agreement_env.len, &l->ag);
  if (r == 0)
    r = gn_ledger_begin_lease(n->ledger, t.lease_id, l->agreement_env.data, l->agreement_env.len);
  if (r < 0) {
    gn_log(GN_LOG_ERROR, "cannot record lease %s: %s", t.lease_id, gn_strerror(r));
    reject_lease(n, peer, t.lease_id, "provider could not record the lease");
    gn_buf_done(&l->agreement_env);
    free(l);
    return;
  }
  gn__strf(l->id, sizeof l->id, "%s", t.lease_id);
  l->role = GN_ROLE_PROVIDER;
  memcpy(l->peer, peer, GN_PK_LEN);
  l->state = GN_LEASE_ACTIVE;
  l->start_mono_ms = gn_mono_ms();
  for (int i = 0; i < GN_LEASE_MAX_GPUS; i++)
    l->gpu_index[i] = -1;
  l->uid_slot = n->userns_ok ? uid_slot_alloc(n) : -1;
  gn__ws_lease_start(n, l->id, l->uid_slot >= 0 ? GN_USERNS_BASE + (uint32_t)l->uid_slot * GN_USERNS_SIZE : 0,
                     l->uid_slot >= 0); /* its workspace (ws_prov.c) */
  for (uint32_t i = 0; i < got; i++) {
    l->gpu_index[i] = idx[i];
    gn__strf(n->gpu_leased_by[idx[i]], sizeof n->gpu_leased_by[0], "%s", l->id);
  }
  l->timer_at_ms = UINT64_MAX;
  l->next = n->leases;
  n->leases = l;
  gn__node_persist_lease(n, l);
  /* The machine meters from now; its first PERSIST is durable before the
   * requester sees the agreement. */
  gn_lease_out *out = calloc(1, sizeof *out);
  r = out ? gn_lease_prov_new(n->id, l->agreement_env.data, l->agreement_env.len, lease_now(), &l->prov, out)
          : GN_ENOMEM;
  if (r == 0)
    r = prov_perform(n, l, out);
  gn_lease_out_done(out);
  free(out);
  if (r < 0) {
    gn_log(GN_LOG_ERROR, "cannot start the billing of lease %s: %s", l->id, gn_strerror(r));
    reject_lease(n, peer, t.lease_id, "provider could not start the lease's billing");
    lease_end_local(n, l, "provider could not start the lease's billing");
    return;
  }
  char pid[GN_NODE_ID_STRLEN], price[32];
  gn_node_id_format(peer, pid);
  gn_price_format(t.price_uper_hour, price, sizeof price);
  gn_log(GN_LOG_INFO, "lease %s: %u x %s to %s at %s %s/GPU-hour for at most %llus", l->id, got, t.gpu_model, pid,
         price, t.currency, (unsigned long long)t.max_s);
  if (l->uid_slot >= 0)
    gn_log(GN_LOG_INFO, "lease %s: its jobs run as host uids and gids %u-%u", l->id,
           GN_USERNS_BASE + (uint32_t)l->uid_slot * GN_USERNS_SIZE,
           GN_USERNS_BASE + (uint32_t)l->uid_slot * GN_USERNS_SIZE + GN_USERNS_SIZE - 1);
  gn_transport_send(n->tp, peer, l->agreement_env.data, l->agreement_env.len);
  n->offers_dirty = true;
}

/* --- the lease machine's glue ----------------------------------------------
 *
 * The protocol of a lease (metering schedule, debit notes, credit control,
 * the final invoice) is the I/O-free machine of billing/lease_prov.c; what
 * follows only feeds it messages and time and does what it asks, in order:
 * ledger writes, persisting its state, sending, ending the lease. */

static gn_lease_now lease_now(void) {
  return (gn_lease_now){gn_mono_ms(), gn_unix_s()};
}

static uint8_t lease_util(gn_node *n, const gn_lease *l);

/* The final invoice's id ("i-" + 16 hex of its hash: what `gpunet
 * invoices` shows) and what it bills, kept with the lease. */
static void lease_note_invoice(gn_lease *l, const uint8_t *env, size_t len) {
  uint8_t h[32];
  char hex[17];
  gn_invoice_summary sum;
  gn_bill_hash(env, len, h);
  gn__hex(h, 8, hex);
  gn__strf(l->invoice_id, sizeof l->invoice_id, "i-%s", hex);
  if (gn_invoice_summarize(env, len, &sum) == 0) {
    l->invoice_seconds = sum.seconds;
    l->invoice_micro = sum.total_micro;
    l->invoice_energy = sum.energy;
  }
}

/* The lease is over on this node: its jobs are killed, its GPUs and offers
 * freed, the requester told (LEASE_END). Once per lease. */
static void lease_end_local(gn_node *n, gn_lease *l, const char *reason) {
  if (l->state != GN_LEASE_ACTIVE)
    return;
  for (gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_PROVIDER && strcmp(j->lease_id, l->id) == 0)
      gn__provider_stop_job(n, j);
  l->state = GN_LEASE_ENDED;
  l->end_s = gn_unix_s();
  gn__strf(l->end_reason, sizeof l->end_reason, "%s", reason);
  for (int i = 0; i < GN_LEASE_MAX_GPUS; i++)
    if (l->gpu_index[i] >= 0 && strcmp(n->gpu_leased_by[l->gpu_index[i]], l->id) == 0)
      n->gpu_leased_by[l->gpu_index[i]][0] = 0;
  gn__node_persist_lease(n, l);
  char price[32];
  gn_lease_info info;
  memset(&info, 0, sizeof info);
  if (l->prov)
    gn_lease_prov_info(l->prov, &info);
  gn_price_format(gn_price_cost(l->ag.terms.price_uper_hour, l->ag.terms.count, info.seconds), price, sizeof price);
  gn_log(GN_LOG_INFO, "lease %s ended (%s): %llu seconds metered, at most %s %s", l->id, reason,
         (unsigned long long)info.seconds, price, l->ag.terms.currency);
  lease_release_slot_if_idle(n, l);
  lease_cgroup_remove_if_idle(n, l);
  if (peer_is_up(n, l->peer))
    send_simple(n, l->peer, GN_MSG_LEASE_END, l->id, reason, l->end_s);
  n->offers_dirty = true;
}

/* The seconds from..from+cnt-1 a WRITE_TICKS asked for, metered: every
 * one with the same GPUs and utilization (the lease's, or none when idle). */
typedef struct tick_req {
  gn_lease *l;
  uint64_t from;
  size_t cnt;
  uint32_t gpus;
  uint8_t util;
} tick_req;

/* While gn__provider_tick runs the machines' timers, their WRITE_TICKS
 * are gathered here and committed together: one transaction (one fsync)
 * per timer however many leases run, still durable before any machine
 * hears of them. NULL otherwise (a tick asked for at another time is
 * written at once). On the loop only. */
typedef struct tick_batch {
  tick_req *v;
  size_t n, cap;
} tick_batch;
static tick_batch *tick_batching;

/* After a restart a resumed lease bills its GPUs again this long after its
 * requester is back: time for a release it sent while we were down to
 * arrive (it is sent on reconnection), so that the seconds after the
 * restart stay idle, trailing, and out of the final invoice. */
#define RESUME_BUSY_AFTER_MS 5000

static int tick_req_of(gn_node *n, gn_lease *l, const gn_lease_action *a, tick_req *ret) {
  if (a->to < a->from || a->to - a->from >= GN_LEASE_MAX_CATCHUP)
    return GN_EINVAL;
  /* The GPUs the lease really has here (after a restart, a GPU of its
   * agreement this host no longer shows is not billed). */
  uint32_t gpus = 0;
  for (int i = 0; i < GN_LEASE_MAX_GPUS; i++)
    gpus += l->gpu_index[i] >= 0;
  if (gpus > l->ag.terms.count)
    gpus = l->ag.terms.count;
  bool idle = a->idle || (l->busy_from_ms && gn_mono_ms() < l->busy_from_ms);
  *ret =
      (tick_req){l, a->from, (size_t)(a->to - a->from + 1), idle ? 0 : gpus, idle ? GN_UTIL_UNKNOWN : lease_util(n, l)};
  return 0;
}

/* Appends the seconds of k requests to the ledger in one transaction. */
static int ticks_commit(gn_node *n, const tick_req *v, size_t k) {
  size_t total = 0;
  for (size_t i = 0; i < k; i++)
    total += v[i].cnt;
  gn_tick_append *rows = calloc(total ? total : 1, sizeof *rows);
  if (!rows)
    return GN_ENOMEM;
  int64_t now_s = gn_unix_s();
  size_t m = 0;
  for (size_t i = 0; i < k; i++)
    for (size_t t = 0; t < v[i].cnt; t++)
      rows[m++] = (gn_tick_append){v[i].l->id, now_s, v[i].gpus, v[i].util};
  int r = total ? gn_ledger_append_ticks(n->ledger, rows, total, NULL) : 0;
  free(rows);
  if (r == 0)
    n->ticks_total += total;
  return r;
}

/* A ledger error (or a machine refusing what was written) stops the lease:
 * a second that cannot be recorded must not be sold. */
static void ticks_failed(gn_node *n, gn_lease *l, int rc) {
  gn_log(GN_LOG_ERROR, "cannot record usage seconds of lease %s: %s; ending the lease", l->id, gn_strerror(rc));
  gn_lease_out *stop = calloc(1, sizeof *stop);
  if (stop && gn_lease_prov_stop(l->prov, lease_now(), "provider ledger error", stop) == 0)
    prov_perform(n, l, stop);
  gn_lease_out_done(stop);
  free(stop);
  lease_end_local(n, l, "provider ledger error");
}

/* Tells the machine the seconds of req are written (their compact
 * records) and performs what follows (a debit note every interval). */
static int ticks_report(gn_node *n, const tick_req *req) {
  gn_lease *l = req->l;
  uint8_t *rec = malloc(req->cnt * GN_BILL_TICK_LEN);
  gn_lease_out *out = calloc(1, sizeof *out);
  int r = rec && out ? 0 : GN_ENOMEM;
  for (size_t i = 0; r == 0 && i < req->cnt; i++) {
    rec[2 * i] = (uint8_t)req->gpus;
    rec[2 * i + 1] = req->util;
  }
  if (r == 0) {
    l->seconds = req->from + req->cnt - 1;
    r = gn_lease_prov_ticks(l->prov, lease_now(), req->from, rec, req->cnt, out);
    if (r < 0)
      gn_log(GN_LOG_ERROR, "lease %s: the machine refused seconds %llu..%llu: %s", l->id, (unsigned long long)req->from,
             (unsigned long long)(req->from + req->cnt - 1), gn_strerror(r));
    else
      r = prov_perform(n, l, out);
  }
  gn_lease_out_done(out);
  free(out);
  free(rec);
  return r;
}

/* A WRITE_TICKS: gathered into the timer's group commit, or written now. */
static void prov_write_ticks(gn_node *n, gn_lease *l, const gn_lease_action *a) {
  tick_req req;
  int r = tick_req_of(n, l, a, &req);
  if (r == 0 && tick_batching) {
    tick_batch *b = tick_batching;
    if (b->n == b->cap) {
      size_t ncap = b->cap ? 2 * b->cap : 16;
      tick_req *v = realloc(b->v, ncap * sizeof *v);
      if (v) {
        b->v = v;
        b->cap = ncap;
      }
    }
    if (b->n < b->cap) {
      b->v[b->n++] = req;
      return;
    }
  }
  if (r == 0)
    r = ticks_commit(n, &req, 1);
  if (r == 0)
    r = ticks_report(n, &req);
  if (r < 0)
    ticks_failed(n, l, r);
}

/* Performs a machine's actions in order and arms its timer. A PERSIST that
 * fails stops what follows (nothing is sent that our disk does not hold). */
static int prov_perform(gn_node *n, gn_lease *l, gn_lease_out *out) {
  int r = 0;
  /* The newest call's timer: a call made while these actions are performed
   * (the ticks a WRITE_TICKS asked for) sets its own after this one. */
  l->timer_at_ms = out->timer_at_ms;
  for (size_t i = 0; i < out->n && r == 0; i++) {
    const gn_lease_action *a = &out->act[i];
    gn_log(GN_LOG_DEBUG, "lease %s: provider action %d (%llu..%llu, %zu bytes) %s", l->id, a->kind,
           (unsigned long long)a->from, (unsigned long long)a->to, a->len, a->reason);
    switch (a->kind) {
    case GN_LEASE_ACT_SEND: {
      /* Every note this provider issues is kept (before it can be
       * answered), so the export holds the notes with their answers. */
      gn_envelope env;
      if (gn_envelope_open(a->data, a->len, &env) == 0 && env.type == GN_MSG_DEBIT_NOTE)
        gn_ledger_store_note(n->ledger, l->id, "provider", a->data, a->len);
      if (peer_is_up(n, l->peer))
        gn_transport_send(n->tp, l->peer, a->data, a->len);
      break;
    }
    case GN_LEASE_ACT_WRITE_TICKS:
      prov_write_ticks(n, l, a);
      break;
    case GN_LEASE_ACT_PERSIST:
      r = gn__node_persist_machine(n, l->id, a->data, a->len);
      if (r < 0)
        gn_log(GN_LOG_ERROR, "cannot save the billing state of lease %s: %s", l->id, gn_strerror(r));
      break;
    case GN_LEASE_ACT_VOUCHER:
      if (a->timed)
        gn_histo_observe_ms(&n->debit_latency, a->latency_ms);
      gn_ledger_store_note(n->ledger, l->id, "provider", a->data, a->len);
      if (gn_ledger_store_response(n->ledger, l->id, "provider", a->data2, a->len2) < 0)
        gn_log(GN_LOG_ERROR, "cannot store the requester's voucher for lease %s", l->id);
      gn__settle_voucher(n, l, a->data2, a->len2);
      break;
    case GN_LEASE_ACT_END:
      lease_end_local(n, l, a->reason[0] ? a->reason : "ended");
      break;
    case GN_LEASE_ACT_INVOICE:
      if (gn_ledger_store_note(n->ledger, l->id, "provider", a->data, a->len) < 0)
        gn_log(GN_LOG_ERROR, "cannot store the final invoice of lease %s", l->id);
      lease_note_invoice(l, a->data, a->len);
      gn__strf(l->invoice_status, sizeof l->invoice_status, "issued");
      gn__node_persist_lease(n, l);
      break;
    case GN_LEASE_ACT_SETTLED:
      if (gn_ledger_store_response(n->ledger, l->id, "provider", a->data2, a->len2) < 0)
        gn_log(GN_LOG_ERROR, "cannot store the answer to the invoice of lease %s", l->id);
      lease_note_invoice(l, a->data, a->len);
      gn__strf(l->invoice_status, sizeof l->invoice_status, "%s", a->accepted ? "accepted" : "rejected");
      l->invoice_done = true;
      gn__node_persist_lease(n, l);
      if (a->accepted) {
        gn_log(GN_LOG_INFO, "invoice for lease %s countersigned by the requester", l->id);
        gn__settle_final(n, l, a->data, a->len, a->data2, a->len2);
      } else {
        gn_log(GN_LOG_WARN, "requester rejected the invoice for lease %s: %s", l->id, a->reason);
      }
      break;
    case GN_LEASE_ACT_UNANSWERED:
      gn_log(GN_LOG_WARN, "lease %s: %s (gpunet invoice export %s)", l->id, a->reason, l->id);
      break;
    case GN_LEASE_ACT_REJECTED:
      gn_log(GN_LOG_WARN, "requester rejected a debit note of lease %s: %s", l->id, a->reason);
      if (gn_ledger_store_response(n->ledger, l->id, "provider", a->data, a->len) < 0)
        gn_log(GN_LOG_WARN, "cannot store the rejection of a debit note of lease %s", l->id);
      break;
    default:
      break;
    }
  }
  return r;
}

/* Runs one call of lease l's machine on a fresh out (named `out` for the
 * call) and performs what it asks (an error leaves it empty). */
#define PROV_CALL(n, l, call)                                                                                          \
  do {                                                                                                                 \
    gn_lease_out *out = calloc(1, sizeof *out);                                                                        \
    if (out && (l)->prov) {                                                                                            \
      (void)(call);                                                                                                    \
      prov_perform((n), (l), out);                                                                                     \
    }                                                                                                                  \
    gn_lease_out_done(out);                                                                                            \
    free(out);                                                                                                         \
  } while (0)

void gn__provider_end_lease(gn_node *n, gn_lease *l, const char *reason) {
  if (l->state != GN_LEASE_ACTIVE)
    return;
  if (l->prov)
    PROV_CALL(n, l, gn_lease_prov_stop(l->prov, lease_now(), reason, out));
  lease_end_local(n, l, reason); /* if the machine did not already */
}

/* A job's log to its lease holder, chunk by chunk in order (log_sent). */
#define JOB_LOG_PUSH_MAX (1u << 20)   /* sent from the file in one go (output, a tick) */
#define JOB_LOG_FINISH_MAX (4u << 20) /* at the job's end, before its status */
#define JOB_LOG_REWIND (4u << 20)     /* sent again after a lost session */
#define JOB_LOG_RECENT_S 120          /* ... for jobs running or ended this recently */

static gn_lease *job_lease(gn_node *n, gn_job *j);

void gn__provider_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->prov && memcmp(l->peer, peer, GN_PK_LEN) == 0) {
      if (l->busy_from_ms == UINT64_MAX)
        l->busy_from_ms = gn_mono_ms() + RESUME_BUSY_AFTER_MS;
      PROV_CALL(n, l, gn_lease_prov_peer(l->prov, lease_now(), true, out));
    }
}

void gn__provider_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->prov && memcmp(l->peer, peer, GN_PK_LEN) == 0)
      PROV_CALL(n, l, gn_lease_prov_peer(l->prov, lease_now(), false, out));
  /* What the lost session was still carrying (the end of a log, a final
   * status) is sent again once a session is up: the holder keeps only what
   * it lacks of a chunk, and takes a status twice alike. */
  int64_t now_s = gn_unix_s();
  for (gn_job *j = n->jobs; j; j = j->next) {
    const gn_lease *l = j->role == GN_ROLE_PROVIDER ? job_lease(n, j) : NULL;
    if (!l || l->state != GN_LEASE_ACTIVE || memcmp(l->peer, peer, GN_PK_LEN) != 0 ||
        (j->finished && now_s - j->ended_s > JOB_LOG_RECENT_S)) /* long over: delivered before */
      continue;
    j->log_sent = j->log_sent > JOB_LOG_REWIND ? j->log_sent - JOB_LOG_REWIND : 0;
    if (j->finished)
      j->status_due = true;
  }
}

/* The lease id a billing message names ("" if it has none). */
static void body_lease_id(const gn_envelope *env, char out[GN_LEASE_ID_STRLEN]) {
  gn_wire_doc doc;
  out[0] = 0;
  if (gn_wire_decode(env->body, env->body_len, &doc) < 0)
    return;
  if (doc.root->type != MSGPACK_OBJECT_MAP || gn_wire_get_str(doc.root, "lease_id", out, GN_LEASE_ID_STRLEN) < 0)
    out[0] = 0;
  gn_wire_doc_done(&doc);
}

/* The requester's answer to a debit note or the final invoice: for the
 * machine of the lease it names, if it comes from that lease's requester. */
static void on_bill_answer(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                           size_t raw_len) {
  char lease_id[GN_LEASE_ID_STRLEN];
  body_lease_id(env, lease_id);
  gn_lease *l = lease_id[0] ? gn__lease_find(n, lease_id) : NULL;
  if (!l || l->role != GN_ROLE_PROVIDER || !l->prov || memcmp(l->ag.terms.requester, peer, GN_PK_LEN) != 0) {
    gn_log(GN_LOG_WARN, "%s for a lease this provider does not hold; ignored", gn_msg_type_name(env->type));
    return;
  }
  int rc = 0;
  PROV_CALL(n, l, (rc = gn_lease_prov_recv(l->prov, lease_now(), raw, raw_len, out)));
  if (rc < 0)
    gn_log(GN_LOG_WARN, "lease %s: %s that does not verify or match: %s; ignored", l->id, gn_msg_type_name(env->type),
           gn_strerror(rc));
}

/* Rebuilds a lease's machine after a restart from its persisted state and
 * the ledger's ticks since the last accepted note. An active lease goes on
 * metering (the seconds this provider was down are written idle: gpus 0,
 * billed nothing) with the GPUs its agreement names; its jobs died with the
 * daemon. A settled lease needs no machine. */
static int restore_machine(gn_node *n, gn_lease *l, const uint8_t *state, size_t len) {
  gn_lease_state_info si;
  int r = gn_lease_state_peek(state, len, &si);
  if (r < 0 || !si.provider || strcmp(si.lease_id, l->id) != 0)
    return r < 0 ? r : GN_EINVAL;
  if (si.phase == GN_LEASE_PHASE_SETTLED)
    return 0;
  uint64_t count = 0, n_ticks = 0;
  uint8_t *ticks = NULL;
  if (gn_ledger_tick_count(n->ledger, l->id, &count) == 0 && si.ticks_from >= 1 && count >= si.ticks_from)
    n_ticks = count - si.ticks_from + 1;
  if (n_ticks) {
    ticks = malloc(n_ticks * GN_BILL_TICK_LEN);
    r = ticks ? gn_ledger_ticks(n->ledger, l->id, si.ticks_from, n_ticks, ticks, NULL) : GN_ENOMEM;
    if (r < 0) {
      free(ticks);
      return r;
    }
  }
  if (si.phase == GN_LEASE_PHASE_ACTIVE) {
    /* Its GPUs, by the UUIDs the agreement granted. */
    int got = 0; /* gpu_index stays dense: its users stop at the first -1 */
    for (uint32_t k = 0; k < l->ag.gpu_count && k < GN_LEASE_MAX_GPUS; k++)
      for (size_t i = 0; i < n->gpus.count; i++)
        if (strcmp(n->gpus.items[i].uuid, l->ag.gpus[k]) == 0 && !n->gpu_leased_by[i][0]) {
          l->gpu_index[got++] = (int)i;
          gn__strf(n->gpu_leased_by[i], sizeof n->gpu_leased_by[0], "%s", l->id);
          break;
        }
    if ((uint32_t)got < l->ag.gpu_count)
      gn_log(GN_LOG_WARN, "lease %s: %u of its %u GPUs are not on this host any more; they are not billed", l->id,
             l->ag.gpu_count - (uint32_t)got, l->ag.gpu_count);
    l->uid_slot = n->userns_ok ? uid_slot_alloc(n) : -1;
    l->state = GN_LEASE_ACTIVE;
    l->busy_from_ms = UINT64_MAX;
  }
  l->seconds = count;
  gn_lease_out *out = calloc(1, sizeof *out);
  r = out ? gn_lease_prov_restore(n->id, l->agreement_env.data, l->agreement_env.len, state, len, ticks, n_ticks,
                                  lease_now(), &l->prov, out)
          : GN_ENOMEM;
  free(ticks);
  if (r == 0)
    r = prov_perform(n, l, out);
  gn_lease_out_done(out);
  free(out);
  if (r == 0 && si.phase == GN_LEASE_PHASE_ACTIVE && l->state == GN_LEASE_ACTIVE)
    gn_log(GN_LOG_INFO,
           "lease %s resumes after the restart (%llu seconds metered before it; billed idle until %d s after its "
           "requester is back)",
           l->id, (unsigned long long)count, RESUME_BUSY_AFTER_MS / 1000);
  n->offers_dirty = true;
  return r;
}

int gn__provider_restore(gn_node *n, gn_lease *l, const uint8_t *state, size_t len) {
  int r = restore_machine(n, l, state, len);
  if (r < 0 && l->state == GN_LEASE_ACTIVE) {
    /* Without its machine the lease cannot be billed: it ends here, its
     * GPUs free (what its ledger and bill_msgs hold stays exportable). */
    l->prov = gn_lease_prov_free(l->prov);
    lease_end_local(n, l, "provider could not resume the lease's billing after a restart");
  }
  return r;
}

/* --- jobs -------------------------------------------------------------------*/

static void send_job_status(gn_node *n, gn_job *j, const gn_lease *l) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  bool pull = j->state == GN_JOB_PULLING && j->pull_total;
  gn_wire_put_map(&w, pull ? 8 : 6);
  if (pull) {
    uint64_t done = j->pull_done;
    gn_wire_put_str(&w, "pulled");
    gn_wire_put_u64(&w, done);
    gn_wire_put_str(&w, "pull_total");
    gn_wire_put_u64(&w, j->pull_total);
    j->pull_sent_done = done;
    j->pull_sent_ms = gn_mono_ms();
  }
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, j->id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, j->lease_id);
  gn_wire_put_str(&w, "state");
  gn_wire_put_str(&w, gn__job_state_name(j->state));
  gn_wire_put_str(&w, "exit_code");
  gn_wire_put_i64(&w, j->exit_code);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, j->error);
  gn_wire_put_str(&w, "digest");
  gn_wire_put_str(&w, j->digest);
  gn__node_send(n, l->peer, GN_MSG_JOB_STATUS, &w);
  gn_wire_writer_done(&w);
}

static void reject_job(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *job_id, const char *lease_id,
                       const char *reason) {
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, pid);
  gn_log(GN_LOG_WARN, "rejecting job %s from %s: %s", job_id, pid, reason);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 5);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job_id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "state");
  gn_wire_put_str(&w, "rejected");
  gn_wire_put_str(&w, "exit_code");
  gn_wire_put_i64(&w, -1);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  gn__node_send(n, peer, GN_MSG_JOB_STATUS, &w);
  gn_wire_writer_done(&w);
}

static gn_lease *job_lease(gn_node *n, gn_job *j) {
  return gn__lease_find(n, j->lease_id);
}

/* --- the thread pool --------------------------------------------------------*/

/* Everything that blocks (pulls, unpacks, the runtime's kill and delete, the
 * recursive removal of a bundle) runs here, off the loop, so metering and
 * the transport never wait for it. A job is kept (never freed, and its
 * fields stable) while j->tasks > 0. */
enum { TASK_PREPARE = 1, TASK_KILL, TASK_FINISH, TASK_LEASE_CGROUP_RM };

typedef struct gn_task {
  struct gn_task *next;
  uv_work_t w;
  gn_node *n;
  gn_job *j; /* NULL for TASK_LEASE_CGROUP_RM */
  int kind;
  char **argv;                       /* KILL, FINISH: the runtime command, or NULL */
  char lease_id[GN_LEASE_ID_STRLEN]; /* LEASE_CGROUP_RM */
  int rc;                            /* LEASE_CGROUP_RM */
} gn_task;

static void job_prepare_work(gn_job *j);
static void job_prepare_done(gn_node *n, gn_job *j, int status);
static void job_signal(gn_job *j, int sig);
static void job_cleanup_done(gn_node *n, gn_job *j);

static void task_work(uv_work_t *w) {
  gn_task *t = w->data;
  gn_job *j = t->j;
  int status;
  switch (t->kind) {
  case TASK_PREPARE:
    job_prepare_work(j);
    break;
  case TASK_KILL:
    gn_runtime_exec(t->argv, &status);
    break;
  case TASK_FINISH:
    /* `run` deletes the container it ran to its end: after a `run` started
     * here (j->pid), a delete is needed only when it could not (killed, or
     * failed half way), which leaves the runtime's state behind. */
    if (t->argv && (j->pid <= 0 || gn_runtime_has_state(j->node->run_dir, j->container_id)))
      gn_runtime_exec(t->argv, &status);
    if (j->bundle[0])
      gn_rm_tree(j->bundle);
    if (j->overlay[0]) {
      char root[160];
      gn__strf(root, sizeof root, "%s/root", j->overlay);
      if (umount2(root, MNT_DETACH) == 0)
        gn_rm_tree(j->overlay);
    }
    if (j->rootfs[0])
      gn_store_rootfs_release(j->node->store, j->rootfs);
    gn__train_cleanup(j); /* the job network and its namespace, after the container */
    break;
  case TASK_LEASE_CGROUP_RM:
    t->rc = gn_cgroup_lease_remove(t->lease_id);
    break;
  }
}

static void tasks_dispatch(gn_node *n);

static void task_after(uv_work_t *w, int status) {
  gn_task *t = w->data;
  gn_node *n = t->n;
  gn_job *j = t->j;
  if (t->kind == TASK_PREPARE)
    n->pulls_running--;
  else
    n->cleanups_running--;
  if (j)
    j->tasks--;
  switch (t->kind) {
  case TASK_PREPARE:
    job_prepare_done(n, j, status);
    break;
  case TASK_KILL:
    j->kill_busy = false;
    /* If the runtime could not signal the container, end the runtime itself,
     * and kill again soon: a kill that reached `run` before it had made the
     * container finds none ("container does not exist"), and a container's
     * first process ignores the TERM `run` forwards (gn__provider_kill_again). */
    if (j->proc_running) {
      job_signal(j, SIGTERM);
      j->kill_again_ms = gn_mono_ms() + GN_KILL_AGAIN_MS;
    }
    break;
  case TASK_FINISH:
    job_cleanup_done(n, j);
    break;
  case TASK_LEASE_CGROUP_RM:
    if (t->rc < 0)
      gn_log(GN_LOG_WARN, "lease %s: cannot remove its cgroup: %s (gpunetd removes it at its next start)", t->lease_id,
             gn_strerror(t->rc));
    break;
  }
  gn_argv_free(t->argv);
  free(t);
  tasks_dispatch(n);
}

/* Starts queued tasks, oldest first, while their kind has a free slot. */
static void tasks_dispatch(gn_node *n) {
  gn_task **pp = &n->tasks_head, *prev = NULL;
  while (*pp) {
    gn_task *t = *pp;
    unsigned *running = t->kind == TASK_PREPARE ? &n->pulls_running : &n->cleanups_running;
    unsigned limit = t->kind == TASK_PREPARE ? GN_POOL_PULLS : GN_POOL_CLEANUPS;
    if (*running >= limit) {
      prev = t;
      pp = &t->next;
      continue;
    }
    *pp = t->next;
    if (n->tasks_tail == t)
      n->tasks_tail = prev;
    t->next = NULL;
    (*running)++;
    t->w.data = t;
    uv_queue_work(n->loop, &t->w, task_work, task_after); /* fails only for a NULL work function */
  }
}

/* Queues kind for j, taking argv. GN_ENOMEM: nothing queued, argv freed. */
static int task_submit_ex(gn_node *n, gn_job *j, int kind, char **argv, const char *lease_id) {
  gn_task *t = calloc(1, sizeof *t);
  if (!t) {
    gn_argv_free(argv);
    return GN_ENOMEM;
  }
  t->n = n;
  t->j = j;
  t->kind = kind;
  t->argv = argv;
  if (lease_id)
    gn__strf(t->lease_id, sizeof t->lease_id, "%s", lease_id);
  if (j)
    j->tasks++;
  if (n->tasks_tail)
    n->tasks_tail->next = t;
  else
    n->tasks_head = t;
  n->tasks_tail = t;
  tasks_dispatch(n);
  return 0;
}

static int task_submit(gn_node *n, gn_job *j, int kind, char **argv) {
  return task_submit_ex(n, j, kind, argv, NULL);
}

/* The runtime's first cgroup.procs write waits for an RCU grace period
 * (8-16 ms here) unless the kernel's cgroup migration lock is warm; warmed
 * on the pool while the job is prepared, it is when the runtime gets there.
 * Not a task: it holds no job, nothing waits for it, and a warming already
 * under way makes it return at once. */
static void warm_work(uv_work_t *w) {
  (void)w;
  gn_cgroup_attach_warm();
}

static void warm_after(uv_work_t *w, int status) {
  (void)status;
  free(w);
}

static void cgroup_lock_warm(gn_node *n) {
  uv_work_t *w = malloc(sizeof *w);
  if (w && uv_queue_work(n->loop, w, warm_work, warm_after) < 0)
    free(w);
}

/* The lease's cgroup (made by its first job's preparation) goes once the
 * lease has ended and the runtime has deleted its last container: on the
 * pool, like the containers' own cleanup, counted by gn__provider_busy. */
static void lease_cgroup_remove_if_idle(gn_node *n, gn_lease *l) {
  if (!n->limits_enforced || l->role != GN_ROLE_PROVIDER || l->state == GN_LEASE_ACTIVE)
    return;
  for (const gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_PROVIDER && strcmp(j->lease_id, l->id) == 0 && (j->tasks || j->handles_open))
      return;
  if (task_submit_ex(n, NULL, TASK_LEASE_CGROUP_RM, NULL, l->id) < 0)
    gn_log(GN_LOG_WARN, "lease %s: out of memory queueing the removal of its cgroup", l->id);
}

bool gn__provider_busy(const gn_node *n) {
  if (n->tasks_head || n->pulls_running || n->cleanups_running || gn__train_busy(n))
    return true;
  for (const gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_PROVIDER && (j->tasks || j->handles_open))
      return true;
  return false;
}

/* --- running jobs -------------------------------------------------------------*/

/* The job is over: tell the lease holder at once, then delete the container
 * and the bundle on the thread pool; its budget and the lease's uid range
 * are released only once they are gone. */
static void job_status_when_logged(gn_node *n, gn_job *j, const gn_lease *l);

static void job_finish(gn_node *n, gn_job *j) {
  if (j->finished)
    return;
  j->finished = true;
  j->ended_s = gn_unix_s();
  /* The lease holder waits on this: told first (after the rest of the
   * log), then the (unsynced) row. */
  gn_lease *l = job_lease(n, j);
  if (l && n->tp)
    job_status_when_logged(n, j, l);
  gn__node_persist_job(n, j);
  gn_log(GN_LOG_INFO, "job %s %s%s%s (exit code %d)", j->id, gn__job_state_name(j->state), j->error[0] ? ": " : "",
         j->error, j->exit_code);
  char **argv = NULL;
  if (n->have_runtime && j->container_id[0] && gn_runtime_argv_delete(&n->rt, n->run_dir, j->container_id, &argv) < 0)
    argv = NULL;
  if (task_submit(n, j, TASK_FINISH, argv) < 0) {
    gn_log(GN_LOG_ERROR, "job %s: out of memory queueing its cleanup; its bundle %s stays", j->id, j->bundle);
    if (j->rootfs[0])
      gn_store_rootfs_release(n->store, j->rootfs);
    job_cleanup_done(n, j);
  }
}

/* The container, its bundle and its hold on the image root are gone. */
static void job_cleanup_done(gn_node *n, gn_job *j) {
  gn__train_detach(j);
  j->rootfs[0] = 0;
  j->overlay[0] = 0;
  if (j->budget_held) {
    n->mem_used_mib -= j->memory_mib;
    n->pids_used -= j->pids_max;
    j->budget_held = false;
  }
  gn_lease *l = job_lease(n, j);
  if (l) {
    lease_release_slot_if_idle(n, l);
    lease_cgroup_remove_if_idle(n, l);
  }
}

static void on_job_handle_closed(uv_handle_t *h) {
  gn_job *j = h->data;
  if (--j->handles_open == 0)
    job_finish(j->node, j);
}

static int send_log_chunk(gn_node *n, const gn_job *j, const gn_lease *l, uint64_t offset, const uint8_t *data,
                          size_t len) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, j->id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, j->lease_id);
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, offset);
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, data, len);
  int r = gn__node_send(n, l->peer, GN_MSG_JOB_LOG, &w);
  gn_wire_writer_done(&w);
  return r;
}

/* Sends the log from log_sent on, read back from its file, at most max
 * bytes now (the rest on the next tick), while the session is up. */
static void job_log_push(gn_node *n, gn_job *j, const gn_lease *l, size_t max) {
  if (j->log_sent >= j->log_len || !peer_is_up(n, l->peer))
    return;
  int fd = open(j->log_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  static uint8_t chunk[GN_JOB_LOG_CHUNK];
  for (size_t sent = 0; j->log_sent < j->log_len && sent < max;) {
    uint64_t left = j->log_len - j->log_sent;
    ssize_t k = pread(fd, chunk, left < sizeof chunk ? (size_t)left : sizeof chunk, (off_t)j->log_sent);
    if (k <= 0 || send_log_chunk(n, j, l, j->log_sent, chunk, (size_t)k) < 0)
      break;
    j->log_sent += (uint64_t)k;
    sent += (size_t)k;
  }
  close(fd);
}

/* The ended job's status, once the holder has been sent the whole log
 * (else the tick sends it when it has). */
static void job_status_when_logged(gn_node *n, gn_job *j, const gn_lease *l) {
  job_log_push(n, j, l, JOB_LOG_FINISH_MAX);
  if (j->log_sent >= j->log_len && peer_is_up(n, l->peer)) {
    j->status_due = false;
    send_job_status(n, j, l);
  } else {
    j->status_due = true;
  }
}

static void on_job_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  static char slab[GN_JOB_LOG_CHUNK];
  *buf = uv_buf_init(slab, sizeof slab);
}

/* Appends output to the job's log and sends it (gn_out_emit: lines whole,
 * as outmerge.c hands them over). */
static void job_log_add(void *ctx, const uint8_t *data, size_t len) {
  gn_job *j = ctx;
  gn_node *n = j->node;
  /* A job that prints without end must not fill the provider's disk, nor
   * the requester's: past GN_JOB_LOG_MAX its output is dropped, once said. */
  static const char cut[] = "\n[gpunet: output beyond 64 MiB dropped]\n";
  static const char full[] = "\n[gpunet: the provider's disk is down to its reserve; output dropped]\n";
  if (j->log_cut || len == 0)
    return;
  if (j->log_len + (uint64_t)len > GN_JOB_LOG_MAX || n->disk_low) {
    data = (const uint8_t *)(n->disk_low ? full : cut);
    len = n->disk_low ? sizeof full - 1 : sizeof cut - 1;
    j->log_cut = true;
  }
  uint64_t offset = j->log_len;
  gn__job_append_log(j, data, len);
  gn_lease *l = job_lease(n, j);
  if (!l)
    return;
  /* In order: straight from the buffer when nothing is behind, else from
   * the file (what was read while the session was down goes first). */
  if (j->log_sent == offset && j->log_len == offset + (uint64_t)len && peer_is_up(n, l->peer)) {
    if (send_log_chunk(n, j, l, offset, data, len) == 0)
      j->log_sent = j->log_len;
  } else {
    job_log_push(n, j, l, JOB_LOG_PUSH_MAX);
  }
}

static void on_job_output(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  gn_job *j = s->data;
  gn_out_partial *held = &j->out_held[s == (uv_stream_t *)&j->err_pipe];
  if (nread < 0) {
    gn__out_flush(held, 0, 1, job_log_add, j);
    uv_close((uv_handle_t *)s, on_job_handle_closed);
    return;
  }
  if (nread > 0)
    gn__out_take(held, (const uint8_t *)buf->base, (size_t)nread, gn_mono_ms(), job_log_add, j);
}

static void job_runtime_ended(gn_job *j, int exit_code) {
  j->proc_running = false;
  j->exit_code = exit_code;
  j->state = j->stop_requested ? GN_JOB_STOPPED : GN_JOB_EXITED;
}

static void on_job_exit(uv_process_t *p, int64_t status, int term_signal) {
  gn_job *j = p->data;
  job_runtime_ended(j, term_signal ? 128 + term_signal : (int)status);
  uv_close((uv_handle_t *)p, on_job_handle_closed);
}

static void on_job_pidfd_closed(uv_handle_t *h) {
  gn_job *j = h->data;
  close(j->pidfd);
  j->pidfd = -1;
  on_job_handle_closed(h);
}

/* The runtime's pidfd turned readable: it has ended, and is reaped here. */
static void on_job_pidfd(uv_poll_t *h, int status, int events) {
  gn_job *j = h->data;
  (void)events;
  int code = -1;
  int r = gn_runtime_reap(j->pid, &code);
  if (r == -EAGAIN && status >= 0)
    return;
  if (r == -EAGAIN) {
    /* The pidfd cannot be watched: end the runtime (the container goes
     * with the cleanup's delete) rather than lose track of it. */
    gn_log(GN_LOG_ERROR, "job %s: cannot watch its runtime (%s); killing it", j->id, uv_strerror(status));
    kill(j->pid, SIGKILL);
    while (waitpid(j->pid, NULL, 0) < 0 && errno == EINTR) {
    }
  }
  if (r == 0) {
    job_runtime_ended(j, code);
  } else {
    job_runtime_ended(j, -1);
    j->state = GN_JOB_FAILED;
    gn__strf(j->error, sizeof j->error, "lost the runtime's exit status: %s",
             r == -EAGAIN ? uv_strerror(status) : gn_strerror(r));
  }
  uv_close((uv_handle_t *)h, on_job_pidfd_closed);
}

/* Signals the runtime of a running job (its pid is not reaped before its
 * handle says it ended, so it names no other process). */
static void job_signal(gn_job *j, int sig) {
  if (j->pidfd >= 0)
    kill(j->pid, sig);
  else
    uv_process_kill(&j->proc, sig);
}

/* Starts the runtime with gn_runtime_spawn (posix_spawn: no copy of the
 * daemon's page tables, about a millisecond sooner than uv_spawn's fork
 * here), its stdout and stderr on socket pairs read on the loop (as
 * uv_spawn's are), its end watched on its pidfd. GN_EUNSUPPORTED (no
 * pidfds): nothing done. Otherwise the job's handles are open: 0, it runs;
 * an error: nothing runs and the handles are closing, the last close
 * finishing the job. */
static int job_spawn(gn_node *n, gn_job *j, char **argv) {
  if (!gn_runtime_spawn_supported())
    return GN_EUNSUPPORTED;
  int out[2] = {-1, -1}, err[2] = {-1, -1}, r = 0;
  bool started = false;
  uv_pipe_init(n->loop, &j->out_pipe, 0);
  uv_pipe_init(n->loop, &j->err_pipe, 0);
  j->out_pipe.data = j->err_pipe.data = j->exit_poll.data = j;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, err) < 0)
    r = -errno;
  if (r == 0 && (r = uv_pipe_open(&j->out_pipe, out[0])) == 0)
    out[0] = -1; /* the handle's now */
  if (r == 0 && (r = uv_pipe_open(&j->err_pipe, err[0])) == 0)
    err[0] = -1;
  if (r == 0 && (r = gn_runtime_spawn(argv, out[1], err[1], &j->pid, &j->pidfd)) == 0)
    started = true;
  if (r == 0)
    r = uv_poll_init(n->loop, &j->exit_poll, j->pidfd);
  for (int i = 0; i < 2; i++) { /* the child's ends, and ours no handle took */
    if (out[i] >= 0)
      close(out[i]);
    if (err[i] >= 0)
      close(err[i]);
  }
  if (r == 0) {
    j->handles_open = 3;
    uv_poll_start(&j->exit_poll, UV_READABLE, on_job_pidfd);
    return 0;
  }
  if (started) { /* not watchable: ended here, the cleanup's delete removes what it made */
    kill(j->pid, SIGKILL);
    while (waitpid(j->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    close(j->pidfd);
    j->pidfd = -1;
  }
  j->handles_open = 2;
  uv_close((uv_handle_t *)&j->out_pipe, on_job_handle_closed);
  uv_close((uv_handle_t *)&j->err_pipe, on_job_handle_closed);
  return r;
}

/* The job's environment: the image's, replaced and extended by the job's,
 * then the GPUs this lease holds (NVIDIA_VISIBLE_DEVICES comes from the
 * bundle); a job cannot name other GPUs than its own. */
static int job_env(const gn_job *j, const gn_image *img, char ***ret) {
  const char *mine[GN_JOB_MAX_ARGS + 1];
  size_t k = 0;
  for (size_t i = 0; i < json_array_size(j->env) && k < GN_JOB_MAX_ARGS; i++) {
    const char *e = json_string_value(json_array_get(j->env, i));
    if (e && strncmp(e, "CUDA_VISIBLE_DEVICES=", 21) != 0 && strncmp(e, "NVIDIA_VISIBLE_DEVICES=", 23) != 0)
      mine[k++] = e;
  }
  mine[k] = NULL;
  char **env = NULL;
  int r = gn_image_env(img, mine, &env);
  if (r < 0 || !j->visible[0]) {
    if (r == 0)
      *ret = env;
    return r;
  }
  size_t n = 0, w = 0;
  while (env[n])
    n++;
  char **more = realloc(env, (n + 2) * sizeof *more);
  if (!more) {
    gn_argv_free(env);
    return GN_ENOMEM;
  }
  env = more;
  for (size_t i = 0; i < n; i++) { /* the image's own, if any, is replaced */
    if (strncmp(env[i], "CUDA_VISIBLE_DEVICES=", 21) == 0 || strncmp(env[i], "NVIDIA_VISIBLE_DEVICES=", 23) == 0)
      free(env[i]);
    else
      env[w++] = env[i];
  }
  size_t len = strlen(j->visible) + 32;
  if (!(env[w] = malloc(len))) {
    env[w] = NULL;
    gn_argv_free(env);
    return GN_ENOMEM;
  }
  snprintf(env[w++], len, "CUDA_VISIBLE_DEVICES=%s", j->visible);
  env[w] = NULL;
  *ret = env;
  return 0;
}

/* The pull's progress (on the thread pool): the total once, then each
 * blob's bytes; a new blob adds the last one's to the base. */
typedef struct pull_progress {
  gn_job *j;
  char what[80];
  uint64_t base, cur;
} pull_progress;

static void job_pull_progress(void *ud, const char *what, uint64_t done, uint64_t total) {
  pull_progress *pp = ud;
  if (strcmp(what, GN_PULL_PROGRESS_TOTAL) == 0) {
    pp->j->pull_total = total;
    return;
  }
  if (strcmp(what, pp->what) != 0) {
    pp->base += pp->cur;
    pp->cur = 0;
    gn__strf(pp->what, sizeof pp->what, "%s", what);
  }
  pp->cur = done;
  pp->j->pull_done = pp->base + pp->cur;
}

/* Pull, unpack and write the bundle: blocking, on the thread pool. The job's
 * fields read here were set on the loop before the task was queued and do
 * not change until it is done; what it writes (work_rc, work_err,
 * work_log, rootfs) the loop reads only in job_prepare_done. */
static void job_prepare_work(gn_job *j) {
  gn_node *n = j->node;
  gn_imageref ref;
  gn_image img;
  char **env = NULL;
  gn_nvidia_pass *pass = NULL;
  memset(&img, 0, sizeof img);
  if (j->cancel) {
    j->work_rc = GN_ECANCELED;
    return;
  }
  j->work_rc = gn_imageref_parse(j->image, &ref);
  if (j->work_rc < 0) {
    gn__strf(j->work_err, sizeof j->work_err, "bad image reference %s", j->image);
    return;
  }
  pull_progress pp = {.j = j};
  gn_pull_opts po = {.cancel = &j->cancel, .progress = job_pull_progress, .progress_ud = &pp};
  j->work_rc =
      gn_store_pull_ex(n->store, &ref, &po, &img, j->work_err, sizeof j->work_err, j->work_log, sizeof j->work_log);
  if (j->work_rc < 0)
    goto out;
  gn_unpack_opts uo = {.cancel = &j->cancel, .uid_base = j->uid_base, .gid_base = j->uid_base, .id_count = j->id_count};
  j->work_rc = gn_store_rootfs(n->store, &img, &uo, j->rootfs, j->work_err, sizeof j->work_err);
  if (j->work_rc < 0) {
    j->rootfs[0] = 0;
    goto out;
  }
  if (j->nminors) {
    if (!(pass = calloc(1, sizeof *pass))) {
      j->work_rc = GN_ENOMEM;
      goto out;
    }
    char why[256] = "";
    j->work_rc = gn_nvidia_passthrough("/", j->minors, j->nminors, pass, why, sizeof why);
    if (j->work_rc < 0) {
      gn__strf(j->work_err, sizeof j->work_err, "cannot pass the leased GPUs to the job: %s",
               why[0] ? why : gn_strerror(j->work_rc));
      goto out;
    }
  }
  if ((j->work_rc = job_env(j, &img, &env)) < 0) {
    gn__strf(j->work_err, sizeof j->work_err, "bad job environment: %s", gn_strerror(j->work_rc));
    goto out;
  }

  /* The manifest's command runs as given; the image's entrypoint is not
   * prepended, so what the requester signed is exactly what runs. */
  const char *argv[GN_JOB_MAX_ARGS + 1];
  size_t ac = 0;
  for (size_t i = 0; i < json_array_size(j->cmd) && ac < GN_JOB_MAX_ARGS; i++)
    argv[ac++] = json_string_value(json_array_get(j->cmd, i));
  argv[ac] = NULL;
  /* The lease's cgroup, above all its jobs' (made by whichever job gets
   * here first; the others write the same limits again): the lease's CPU
   * quota once for all its jobs, and the provider's memory and pids
   * budgets as its ceilings. n's budgets are set once, before any task. */
  char cgpath[160] = "";
  if (j->cgroup_limits) {
    gn_cgroup_limits lim = {.cpu_quota_us = j->cpu_quota_us,
                            .cpu_period_us = j->cpu_quota_us ? GN_CPU_PERIOD_US : 0,
                            .memory_bytes = n->mem_budget_mib << 20,
                            .pids_max = n->pids_budget};
    char why[256] = "";
    if ((j->work_rc = gn_cgroup_lease_path(j->lease_id, j->id, cgpath, sizeof cgpath)) < 0 ||
        (j->work_rc = gn_cgroup_lease_create(j->lease_id, &lim, why, sizeof why)) < 0) {
      gn__strf(j->work_err, sizeof j->work_err, "cannot make the lease's cgroup: %s",
               why[0] ? why : gn_strerror(j->work_rc));
      goto out;
    }
  }
  char lower[4096], rootfs[4096];
  job_visible_path(n, j->rootfs, lower, sizeof lower);
  if (!job_overlay_mount(n, j, lower, rootfs))
    memcpy(rootfs, lower, sizeof rootfs);
  gn_bundle_spec spec = {
      .rootfs = rootfs,
      .argv = argv,
      .env = (const char *const *)env,
      .cwd = img.workdir[0] ? img.workdir : "/",
      .hostname = j->id,
      .network = false,
      .memory_bytes = j->memory_mib << 20,
      .pids_max = j->pids_max,
      .nofile = 1024,
      .visible_devices = j->visible[0] ? j->visible : NULL,
      .cgroup_limits = j->cgroup_limits,
      .uid_base = j->uid_base,
      .gid_base = j->uid_base,
      .id_count = j->id_count,
      .cpu_quota_us = j->cpu_quota_us,
      .cpu_period_us = j->cpu_quota_us ? GN_CPU_PERIOD_US : 0,
      .dev_nodes = pass ? pass->nodes : NULL,
      .n_dev_nodes = pass ? pass->n_nodes : 0,
      .ro_binds = pass ? pass->binds : NULL,
      .n_ro_binds = pass ? pass->n_binds : 0,
      .cgroups_path = cgpath[0] ? cgpath : NULL,
  };
  /* A training rank: its network namespace with the job network, the
   * rendezvous variables, /output (train_prov.c). */
  if ((j->work_rc = gn__train_prepare(j, &spec, &env, j->work_err, sizeof j->work_err)) < 0)
    goto out;
  gn_bundle_bind rw_binds[4]; /* and the lease's workspace at /workspace (ws_prov.c) */
  char ws_source[PATH_MAX];
  if ((j->work_rc = gn__ws_prepare(j, &spec, rw_binds, GN_ARRAY_SIZE(rw_binds), ws_source, sizeof ws_source,
                                   j->work_err, sizeof j->work_err)) < 0)
    goto out;
  spec.env = (const char *const *)env;
  j->work_rc = gn_bundle_write(j->bundle, &spec);
  if (j->work_rc < 0)
    gn__strf(j->work_err, sizeof j->work_err, "cannot write the OCI bundle: %s", gn_strerror(j->work_rc));
out:
  if (j->work_rc < 0 && j->cancel)
    j->work_rc = GN_ECANCELED;
  gn_argv_free(env);
  free(pass);
  gn_image_done(&img);
}

static void job_prepare_done(gn_node *n, gn_job *j, int status) {
  gn_lease *l = job_lease(n, j);
  if (j->work_log[0])
    gn_log(GN_LOG_WARN, "job %s: %s", j->id, j->work_log);
  j->work_log[0] = 0; /* said once: a job waiting for its seed comes back here */
  /* A restarted rank's seed (train_prov.c): the container waits until it
   * is unpacked into /output; gn__provider_job_seeded comes back here. */
  if (status == 0 && j->work_rc >= 0 && !j->stop_requested && !j->error[0] && l && l->state == GN_LEASE_ACTIVE &&
      gn__train_seed_wait(n, j))
    return;
  /* j->error set on the loop already: failed before it could run. */
  if (status < 0 || j->work_rc < 0 || j->stop_requested || j->error[0] || !l || l->state != GN_LEASE_ACTIVE) {
    j->state = j->error[0]                                               ? GN_JOB_FAILED
               : j->stop_requested || (l && l->state != GN_LEASE_ACTIVE) ? GN_JOB_STOPPED
                                                                         : GN_JOB_FAILED;
    if (j->state == GN_JOB_FAILED && !j->error[0])
      gn__strf(j->error, sizeof j->error, "%s",
               j->work_err[0] ? j->work_err : gn_strerror(status < 0 ? GN_EIO : j->work_rc));
    job_finish(n, j);
    return;
  }
  char **argv = NULL;
  int r = gn_runtime_argv_run(&n->rt, n->run_dir, j->bundle, j->container_id, &argv);
  j->pidfd = -1;
  if (r == 0 && (r = job_spawn(n, j, argv)) != GN_EUNSUPPORTED) {
    if (r == 0) {
      j->proc_running = true;
      j->state = GN_JOB_RUNNING;
      uv_read_start((uv_stream_t *)&j->out_pipe, on_job_alloc, on_job_output);
      uv_read_start((uv_stream_t *)&j->err_pipe, on_job_alloc, on_job_output);
      send_job_status(n, j, l);
      gn__node_persist_job(n, j);
      gn_log(GN_LOG_INFO, "job %s running %s", j->id, j->image);
    } else { /* the handles are closing: the last close finishes the job */
      j->state = GN_JOB_FAILED;
      gn__strf(j->error, sizeof j->error, "cannot start %s: %s", argv[0], gn_strerror(r));
    }
  } else if (r == GN_EUNSUPPORTED) {
    uv_pipe_init(n->loop, &j->out_pipe, 0);
    uv_pipe_init(n->loop, &j->err_pipe, 0);
    j->out_pipe.data = j->err_pipe.data = j->proc.data = j;
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&j->out_pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&j->err_pipe;
    uv_process_options_t opt = {0};
    opt.file = argv[0];
    opt.args = argv;
    opt.exit_cb = on_job_exit;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    r = uv_spawn(n->loop, &j->proc, &opt);
    j->handles_open = 3;
    if (r < 0) {
      /* A process handle that failed to spawn is still a handle: it is
       * closed like the pipes, and the last close finishes the job. */
      j->state = GN_JOB_FAILED;
      gn__strf(j->error, sizeof j->error, "cannot start %s: %s", argv[0], uv_strerror(r));
      uv_close((uv_handle_t *)&j->proc, on_job_handle_closed);
      uv_close((uv_handle_t *)&j->out_pipe, on_job_handle_closed);
      uv_close((uv_handle_t *)&j->err_pipe, on_job_handle_closed);
    } else {
      j->proc_running = true;
      j->state = GN_JOB_RUNNING;
      uv_read_start((uv_stream_t *)&j->out_pipe, on_job_alloc, on_job_output);
      uv_read_start((uv_stream_t *)&j->err_pipe, on_job_alloc, on_job_output);
      gn__node_persist_job(n, j);
      send_job_status(n, j, l);
      gn_log(GN_LOG_INFO, "job %s running %s", j->id, j->image);
    }
  } else {
    j->state = GN_JOB_FAILED;
    gn__strf(j->error, sizeof j->error, "cannot build the runtime command: %s", gn_strerror(r));
    job_finish(n, j);
  }
  gn_argv_free(argv);
}

void gn__provider_job_seeded(gn_node *n, gn_job *j) {
  job_prepare_done(n, j, 0);
}

static void on_job_manifest(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                            size_t raw_len) {
  gn_jobman m;
  char reason[300];
  int64_t now_s = gn_unix_s();
  int r = gn__jobman_decode(env->body, env->body_len, &m);
  if (r < 0) {
    gn_log(GN_LOG_WARN, "malformed job manifest: %s", gn_strerror(r));
    reject_job(n, peer, "?", "?", "malformed job manifest");
    return;
  }
  gn_lease *l = gn__lease_find(n, m.lease_id);
  gn_imageref ref;
  if (!l || l->role != GN_ROLE_PROVIDER) {
    gn__strf(reason, sizeof reason, "no lease %s on this provider", m.lease_id);
    goto reject;
  }
  if (memcmp(env->signer, l->ag.terms.requester, GN_PK_LEN) != 0) {
    gn__strf(reason, sizeof reason, "manifest for lease %s is not signed by the lease holder", m.lease_id);
    goto reject;
  }
  if (l->state != GN_LEASE_ACTIVE) {
    gn__strf(reason, sizeof reason, "lease %s is not active (%s)", m.lease_id, l->end_reason);
    goto reject;
  }
  if (m.expires_s < now_s) {
    gn__strf(reason, sizeof reason, "manifest expired %llds ago", (long long)(now_s - m.expires_s));
    goto reject;
  }
  if (m.expires_s > now_s + GN_MANIFEST_MAX_TTL_S || m.issued_s > now_s + 300) {
    gn__strf(reason, sizeof reason, "manifest validity is more than %ds in the future", GN_MANIFEST_MAX_TTL_S);
    goto reject;
  }
  size_t active = 0;
  for (gn_job *o = n->jobs; o; o = o->next)
    active += strcmp(o->lease_id, l->id) == 0 && (o->state == GN_JOB_PULLING || o->state == GN_JOB_RUNNING);
  if (active >= GN_LEASE_MAX_JOBS) {
    gn__strf(reason, sizeof reason, "lease %s already has %zu jobs running; stop one first", m.lease_id, active);
    goto reject;
  }
  if (gn__job_find(n, m.job_id)) {
    gn__strf(reason, sizeof reason, "job id %s already used: replayed manifest", m.job_id);
    goto reject;
  }
  if (gn_imageref_parse(m.image, &ref) < 0 || !ref.digest[0]) {
    gn__strf(reason, sizeof reason, "image %s is not a reference pinned to a digest", m.image);
    goto reject;
  }
  if (!n->limits_enforced && !n->cfg.allow_unenforced_limits) {
    gn__strf(reason, sizeof reason,
             "this provider cannot enforce a job's memory, pids and CPU limits (its cgroups lack the memory, "
             "pids or cpu controller), so it runs no jobs");
    goto reject;
  }
  if (n->userns_ok && l->uid_slot < 0) {
    gn__strf(reason, sizeof reason, "lease %s has no user namespace of its own on this provider", m.lease_id);
    goto reject;
  }
  if (n->disk_low) {
    gn__strf(reason, sizeof reason, "this provider's disk is down to its free-space reserve; try again later");
    goto reject;
  }
  /* The manifest's limits, within what one job may have here, must fit in
   * what all running jobs of all leases leave of the provider's budgets. */
  uint64_t mem_mib = m.memory_mib < 16 ? 16 : m.memory_mib;
  uint32_t pids = m.pids < 8 ? 8 : m.pids > 4096 ? 4096 : m.pids;
  uint64_t mem_left = n->mem_budget_mib - n->mem_used_mib;
  uint32_t pids_left = n->pids_budget - n->pids_used;
  if (mem_mib > mem_left) {
    gn__strf(reason, sizeof reason,
             "job asks for %llu MiB of memory but only %llu MiB of this provider's %llu MiB job memory budget is "
             "free; ask for less or wait for a job to end",
             (unsigned long long)mem_mib, (unsigned long long)mem_left, (unsigned long long)n->mem_budget_mib);
    goto reject;
  }
  if (pids > pids_left) {
    gn__strf(reason, sizeof reason,
             "job asks for %u processes but only %u of this provider's %u job process budget are free; ask for "
             "fewer or wait for a job to end",
             pids, pids_left, n->pids_budget);
    goto reject;
  }
  /* A training rank's net section and /output (train_prov.c). */
  if (gn__train_check(n, &m, reason, sizeof reason) < 0)
    goto reject;
  /* The nonce is remembered (durably) until long after the manifest's
   * expiry, so a replay is refused even across restarts. Looked up here;
   * its row is written, with its fsync, once the job's preparation is on
   * the pool, and still before anything of the job can run (that waits for
   * a later turn of this loop). */
  sqlite3_stmt *st = NULL;
  sqlite3_prepare_v2(n->db, "SELECT 1 FROM job_nonces WHERE nonce = ?", -1, &st, NULL);
  sqlite3_bind_blob(st, 1, m.nonce, sizeof m.nonce, SQLITE_STATIC);
  r = sqlite3_step(st);
  sqlite3_finalize(st);
  if (r != SQLITE_DONE) {
    gn__strf(reason, sizeof reason, "%s",
             r == SQLITE_ROW ? "manifest nonce already seen: replayed manifest" : "cannot check the manifest's nonce");
    goto reject;
  }
  uint8_t nonce[sizeof m.nonce];
  memcpy(nonce, m.nonce, sizeof nonce);
  int64_t nonce_expires_s = m.expires_s;

  gn_job *j = calloc(1, sizeof *j);
  if (!j) {
    gn__jobman_done(&m);
    return;
  }
  j->node = n;
  gn__strf(j->id, sizeof j->id, "%s", m.job_id);
  gn__strf(j->lease_id, sizeof j->lease_id, "%s", m.lease_id);
  j->role = GN_ROLE_PROVIDER;
  gn__strf(j->image, sizeof j->image, "%s", m.image);
  gn__strf(j->digest, sizeof j->digest, "%s", ref.digest);
  j->cmd = json_array();
  for (uint32_t i = 0; i < m.argc; i++)
    json_array_append_new(j->cmd, json_string(m.argv[i]));
  j->env = json_array();
  for (uint32_t i = 0; i < m.envc; i++)
    json_array_append_new(j->env, json_string(m.env[i]));
  j->state = GN_JOB_PULLING;
  j->exit_code = -1;
  j->created_s = now_s;
  j->memory_mib = mem_mib;
  j->pids_max = pids;
  j->budget_held = true;
  n->mem_used_mib += mem_mib;
  n->pids_used += pids;
  char jobs_dir[sizeof n->run_dir + 8]; /* paths from the job id: one checked component each */
  gn__pathf(jobs_dir, sizeof jobs_dir, "%s/jobs", n->run_dir);
  gn_path_join(j->log_path, sizeof j->log_path, jobs_dir, NULL, j->id, ".log");
  gn_path_join(j->bundle, sizeof j->bundle, n->run_dir, "bundle-", j->id, NULL);
  gn__strf(j->container_id, sizeof j->container_id, "gn-%s", j->id);
  gn_buf_append(&j->manifest_env, raw, raw_len);
  j->next = n->jobs;
  n->jobs = j;
  if (gn__train_attach(n, j, &m) < 0) { /* the preparation finds it and stops */
    gn__strf(j->error, sizeof j->error, "provider out of memory");
    j->cancel = 1;
  }
  gn__jobman_done(&m);
  /* Everything the worker thread needs from node state is copied here, on
   * the loop, so the worker touches only the job. */
  for (int i = 0; i < GN_LEASE_MAX_GPUS && l->gpu_index[i] >= 0; i++) {
    const gn_gpu *g = &n->gpus.items[l->gpu_index[i]];
    size_t used = strlen(j->visible);
    gn__strf(j->visible + used, sizeof j->visible - used, "%s%s", used ? "," : "", g->uuid);
    /* Simulated GPUs have no device to pass. */
    if (!g->simulated && g->minor >= 0)
      j->minors[j->nminors++] = (unsigned)g->minor;
  }
  j->cgroup_limits = n->limits_enforced;
  if (l->uid_slot >= 0) {
    j->uid_base = GN_USERNS_BASE + (uint32_t)l->uid_slot * GN_USERNS_SIZE;
    j->id_count = GN_USERNS_SIZE;
  }
  j->cpu_quota_us = lease_cpu_quota_us(n, l);
  /* The worker starts first: the nonce's row, the job's row, its "pulling"
   * status and the log line are written while it prepares (they only read
   * the job), and the warming of the cgroup lock begins with it. */
  if (n->have_runtime)
    cgroup_lock_warm(n);
  int queued = task_submit(n, j, TASK_PREPARE, NULL);
  sqlite3_prepare_v2(n->db, "INSERT INTO job_nonces(nonce, expires_s) VALUES(?, ?)", -1, &st, NULL);
  sqlite3_bind_blob(st, 1, nonce, sizeof nonce, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, nonce_expires_s);
  r = sqlite3_step(st);
  sqlite3_finalize(st);
  if (queued < 0) {
    j->state = GN_JOB_FAILED;
    gn__strf(j->error, sizeof j->error, "provider out of memory");
    job_finish(n, j);
    return;
  }
  if (r != SQLITE_DONE) { /* the preparation finds it and stops; nothing runs */
    gn_log(GN_LOG_ERROR, "job %s: cannot record its manifest's nonce: %s", j->id, sqlite3_errmsg(n->db));
    gn__strf(j->error, sizeof j->error, "the provider cannot record the manifest's nonce");
    j->cancel = 1;
  }
  gn__node_persist_job(n, j);
  send_job_status(n, j, l);
  gn_log(GN_LOG_INFO, "job %s on lease %s: pulling %s", j->id, j->lease_id, j->image);
  return;
reject:
  reject_job(n, peer, m.job_id, m.lease_id, reason);
  gn__jobman_done(&m);
}

void gn__provider_stop_job(gn_node *n, gn_job *j) {
  if (j->state != GN_JOB_PULLING && j->state != GN_JOB_RUNNING)
    return;
  j->stop_requested = true;
  j->cancel = 1; /* a pull or unpack in progress stops within a second */
  /* and a job waiting for its seed now (train_prov.c) */
  gn__train_seed_stop(n, j);
  if (!j->proc_running || j->kill_busy)
    return;
  char **argv = NULL;
  if (gn_runtime_argv_kill(&n->rt, n->run_dir, j->container_id, "KILL", &argv) == 0 &&
      task_submit(n, j, TASK_KILL, argv) == 0) {
    j->kill_busy = true;
    return;
  }
  job_signal(j, SIGTERM);
}

void gn__provider_kill_again(gn_node *n, uint64_t now_ms) {
  for (gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_PROVIDER && j->stop_requested && j->proc_running && !j->kill_busy && j->kill_again_ms &&
        now_ms >= j->kill_again_ms) {
      j->kill_again_ms = 0;
      gn__provider_stop_job(n, j);
    }
}

static void on_job_stop(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_job *j = gn__job_find(n, m.job_id);
  gn_lease *l = j ? job_lease(n, j) : NULL;
  if (j && l && j->role == GN_ROLE_PROVIDER && memcmp(l->ag.terms.requester, peer, GN_PK_LEN) == 0) {
    gn_log(GN_LOG_INFO, "job %s: stop requested by the lease holder", j->id);
    gn__provider_stop_job(n, j);
  }
  gn__jobmsg_done(&m);
}

static void on_lease_release(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_lease *l = gn__lease_find(n, m.lease_id);
  if (l && l->role == GN_ROLE_PROVIDER && l->prov && memcmp(l->ag.terms.requester, peer, GN_PK_LEN) == 0)
    PROV_CALL(n, l, gn_lease_prov_release(l->prov, lease_now(), out));
  gn__jobmsg_done(&m);
}

void gn__provider_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                             size_t raw_len) {
  switch (env->type) {
  case GN_MSG_LEASE_REQUEST:
    on_lease_request(n, peer, raw, raw_len);
    break;
  case GN_MSG_LEASE_RELEASE:
    on_lease_release(n, peer, env);
    break;
  case GN_MSG_JOB_MANIFEST:
    on_job_manifest(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_JOB_STOP:
    on_job_stop(n, peer, env);
    break;
  case GN_MSG_JOB_OUTPUT_GET:
    gn__train_on_output_get(n, peer, env); /* a chunk of /output (train_prov.c) */
    break;
  case GN_MSG_JOB_SEED:
    gn__train_on_seed(n, peer, env); /* a chunk of a restarted rank's seed (train_prov.c) */
    break;
  case GN_MSG_INVOICE_ACCEPT:
  case GN_MSG_INVOICE_REJECT:
  case GN_MSG_DEBIT_ACCEPT:
  case GN_MSG_DEBIT_REJECT:
    on_bill_answer(n, peer, env, raw, raw_len);
    break;
  default:
    break;
  }
}

/* --- the once-a-second work -------------------------------------------------*/

static uint8_t lease_util(gn_node *n, const gn_lease *l) {
  unsigned sum = 0, cnt = 0;
  for (int i = 0; i < GN_LEASE_MAX_GPUS && l->gpu_index[i] >= 0; i++) {
    uint8_t u;
    if (gn_gpu_utilization(&n->gpus.items[l->gpu_index[i]], &u) == 0) {
      sum += u;
      cnt++;
    }
  }
  return cnt ? (uint8_t)(sum / cnt) : GN_UTIL_UNKNOWN;
}

static void on_disk_statfs(uv_fs_t *req) {
  gn_node *n = req->data;
  n->disk_req_busy = false;
  if (req->result == 0 && req->ptr) {
    const uv_statfs_t *st = req->ptr;
    uint64_t free_bytes = st->f_bavail * st->f_bsize;
    bool low = free_bytes < n->cfg.disk_reserve_bytes;
    if (low != n->disk_low)
      gn_log(low ? GN_LOG_WARN : GN_LOG_INFO, "data dir %s has %llu MiB free: %s", n->cfg.data_dir,
             (unsigned long long)(free_bytes >> 20),
             low ? "below the disk reserve, new jobs are refused and job output is dropped"
                 : "above the disk reserve again, jobs are accepted");
    n->disk_low = low;
  }
  uv_fs_req_cleanup(req);
}

/* Free space is watched every few seconds (statfs on the thread pool: a
 * network file system may block) rather than before each write. */
static void disk_check(gn_node *n, int64_t now_s) {
  if (n->disk_req_busy || now_s - n->disk_checked_s < 5 || n->stopping)
    return;
  n->disk_checked_s = now_s;
  n->disk_req.data = n;
  if (uv_fs_statfs(n->loop, &n->disk_req, n->cfg.data_dir, on_disk_statfs) == 0)
    n->disk_req_busy = true;
}

/* Pulls in progress tell their renters how far they are, at most once a
 * second and only when bytes moved. */
static void pull_progress_tick(gn_node *n, uint64_t now_ms) {
  for (gn_job *j = n->jobs; j; j = j->next) {
    if (j->role != GN_ROLE_PROVIDER || j->state != GN_JOB_PULLING || !j->pull_total ||
        j->pull_done == j->pull_sent_done || gn_ms_since(now_ms, j->pull_sent_ms) < 1000)
      continue;
    const gn_lease *l = job_lease(n, j);
    if (l)
      send_job_status(n, j, l);
  }
}

/* Once a second, the power of the lease's GPUs into its energy
 * (billing/energy.c), handed to its machine for the final invoice and
 * saved. A second without a reading of every GPU (simulated GPUs, no NVML,
 * a failed query) is unmeasured: nothing is invented. */
static void lease_energy_sample(gn_node *n, gn_lease *l, uint64_t now_ms) {
  if (l->energy.started && now_ms - l->energy.last_ms < 1000)
    return;
  const bool was_started = l->energy.started;
  const uint64_t before_uj = l->energy.uj;
  uint64_t mw = 0;
  bool have = false;
  for (int i = 0; i < GN_LEASE_MAX_GPUS && l->gpu_index[i] >= 0; i++) {
    gn_gpu_stats st;
    have = gn_gpu_stats_get(&n->gpus.items[l->gpu_index[i]], &st) == 0 && st.power_mw > 0;
    if (!have)
      break;
    mw += st.power_mw;
  }
  gn_energy_sample(&l->energy, now_ms, have, mw);
  /* The first sample (of the lease, or of a lease resumed after a restart
   * with its saved totals) only starts the clock. */
  gn_bill_energy claim = gn_energy_claim(&l->energy);
  gn_lease_prov_energy(l->prov, &claim);
  if (was_started) {
    n->lease_energy_uj += l->energy.uj - before_uj;
    gn__node_persist_energy(n, l);
  }
}

/* Logs behind (read while the session was down, or past what one go
 * sends) and the statuses that wait for them. */
static void job_log_tick(gn_node *n, uint64_t now_ms) {
  for (gn_job *j = n->jobs; j; j = j->next) {
    if (j->role == GN_ROLE_PROVIDER)
      for (int i = 0; i < 2; i++) /* the end of a line held too long */
        gn__out_flush(&j->out_held[i], now_ms, 0, job_log_add, j);
    if (j->role != GN_ROLE_PROVIDER || (j->log_sent >= j->log_len && !j->status_due))
      continue;
    gn_lease *l = job_lease(n, j);
    if (!l || !peer_is_up(n, l->peer))
      continue;
    if (j->status_due)
      job_status_when_logged(n, j, l);
    else
      job_log_push(n, j, l, JOB_LOG_PUSH_MAX);
  }
}

void gn__provider_tick(gn_node *n, uint64_t now_ms, int64_t now_s) {
  gn__provider_kill_again(n, now_ms);
  pull_progress_tick(n, now_ms);
  job_log_tick(n, now_ms);
  if (n->cfg.provide) {
    disk_check(n, now_s);
    gn__train_tick(n, now_s); /* /output's budget, ended leases' outputs */
  }
  /* Each lease's machine does what is due: debit notes, credit control,
   * resends, expiry, and the seconds it meters, which all leases commit to
   * the ledger together (one fsync per timer however many leases run),
   * before any machine hears of them. If the group commit fails, each
   * lease's seconds are tried alone, so one bad lease stops only itself. */
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->prov && l->state == GN_LEASE_ACTIVE)
      lease_energy_sample(n, l, now_ms);
  tick_batch batch = {0};
  tick_batching = &batch;
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->prov && now_ms >= l->timer_at_ms)
      PROV_CALL(n, l, gn_lease_prov_timer(l->prov, lease_now(), out));
  tick_batching = NULL;
  int committed = batch.n ? ticks_commit(n, batch.v, batch.n) : 0;
  for (size_t i = 0; i < batch.n; i++) {
    int r = committed == 0 ? 0 : ticks_commit(n, &batch.v[i], 1);
    if (r == 0)
      r = ticks_report(n, &batch.v[i]);
    if (r < 0)
      ticks_failed(n, batch.v[i].l, r);
  }
  free(batch.v);
  if (n->cfg.provide && (n->offers_dirty || now_s - n->offer_published_s >= GN_OFFER_REFRESH_S))
    gn__provider_publish_offers(n, now_s);
}
