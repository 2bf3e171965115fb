/* gn_probe: a static attack probe run INSIDE a job's container by the
 * isolation tests and the hostile-job e2e suite. `gn_probe ATTACK` tries one
 * thing a hostile job would try and prints one line:
 *
 *   BLOCKED <errno name>   exit 0: the kernel (seccomp, missing capability,
 *                          user namespace) refused it
 *   ALLOWED <detail>       exit 1: the attack worked
 *   ERROR <detail>         exit 2: the probe itself could not run the test
 *
 * `gn_probe list` prints the attacks. Every attack is harmless if it does
 * work, even run by mistake as root on a host: whatever it opens it closes,
 * and calls that would change the host (kexec, modules, swap, acct) are made
 * with arguments that cannot succeed (a bad fd, a missing path), so getting
 * past the permission check (EBADF, ENOENT) is what counts as ALLOWED.
 * Linked statically so it runs in any rootfs (busybox, scratch). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/sched.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

static const char *errno_name(int e) {
  switch (e) {
  case EPERM:
    return "EPERM";
  case EACCES:
    return "EACCES";
  case ENOSYS:
    return "ENOSYS";
  case EINVAL:
    return "EINVAL";
  case EROFS:
    return "EROFS";
  case ENOENT:
    return "ENOENT";
  case EBADF:
    return "EBADF";
  case EFAULT:
    return "EFAULT";
  case EOPNOTSUPP:
    return "EOPNOTSUPP";
  case ENOKEY:
    return "ENOKEY";
  case EKEYREVOKED:
    return "EKEYREVOKED";
  case EDQUOT:
    return "EDQUOT";
  case ENOSPC:
    return "ENOSPC";
  case EUSERS:
    return "EUSERS";
  case ENOMEM:
    return "ENOMEM";
  case ESRCH:
    return "ESRCH";
  case EAFNOSUPPORT:
    return "EAFNOSUPPORT";
  default:
    return "errno";
  }
}

static int blocked(int e) {
  printf("BLOCKED %s (%d: %s)\n", errno_name(e), e, strerror(e));
  return 0;
}

static int allowed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int allowed(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("ALLOWED ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  return 1;
}
static int probe_error(const char *what, int e) {
  printf("ERROR %s: %s\n", what, strerror(e));
  return 2;
}

/* For calls made with arguments that cannot succeed: a permission error
 * means the call was refused, anything else means it reached the part of
 * the kernel that only a privileged caller reaches. */
static int refused_or_reached(long rc, const char *what) {
  if (rc == 0)
    return allowed("%s", what);
  if (errno == EPERM || errno == EACCES || errno == ENOSYS)
    return blocked(errno);
  return allowed("%s reached the kernel past the permission check (%s)", what, errno_name(errno));
}

static int a_keyctl_read(void) {
  /* The user keyring of this uid: with no user namespace that is the host
   * root's, shared with every other job. */
  long id = syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 1);
  if (id < 0)
    return blocked(errno);
  char buf[4096];
  long n = syscall(SYS_keyctl, KEYCTL_READ, id, buf, sizeof(buf));
  if (n < 0)
    return blocked(errno);
  return allowed("read the user keyring (%ld bytes)", n);
}

static int a_add_key(void) {
  long id = syscall(SYS_add_key, "user", "gn-probe", "x", (size_t)1, KEY_SPEC_SESSION_KEYRING);
  if (id < 0)
    return blocked(errno);
  syscall(SYS_keyctl, KEYCTL_INVALIDATE, id);
  return allowed("added key %ld to the session keyring", id);
}

static int a_keyctl_persistent(void) {
  /* The persistent keyring of this uid outlives every process: with no user
   * namespace, host root's, shared by all jobs and the provider. */
  long id = syscall(SYS_keyctl, KEYCTL_GET_PERSISTENT, -1L, KEY_SPEC_SESSION_KEYRING);
  if (id < 0)
    return blocked(errno);
  return allowed("linked the persistent keyring (%ld)", id);
}

static int a_keyctl_join(void) {
  /* A named session keyring is how two jobs of one uid would share keys. */
  long id = syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "gn-probe-shared");
  if (id < 0)
    return blocked(errno);
  return allowed("joined a named session keyring (%ld)", id);
}

static int a_request_key(void) {
  long id = syscall(SYS_request_key, "user", "gn-probe-none", NULL, KEY_SPEC_SESSION_KEYRING);
  if (id >= 0)
    return allowed("request_key returned %ld", id);
  if (errno == ENOKEY)
    return allowed("request_key searched the keyrings (ENOKEY)");
  return blocked(errno);
}

static int a_userns(void) {
  if (unshare(CLONE_NEWUSER) < 0)
    return blocked(errno);
  return allowed("unshare(CLONE_NEWUSER) gave a new user namespace");
}

static int a_clone_userns(void) {
  long pid = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), NULL, NULL, NULL, 0L);
  if (pid < 0)
    return blocked(errno);
  if (pid == 0)
    _exit(0);
  waitpid((pid_t)pid, NULL, 0);
  return allowed("clone(CLONE_NEWUSER) made child %ld", pid);
}

static int a_clone3_userns(void) {
  struct clone_args ca;
  memset(&ca, 0, sizeof(ca));
  ca.flags = CLONE_NEWUSER;
  ca.exit_signal = SIGCHLD;
  long pid = syscall(SYS_clone3, &ca, sizeof(ca));
  if (pid < 0)
    return blocked(errno);
  if (pid == 0)
    _exit(0);
  waitpid((pid_t)pid, NULL, 0);
  return allowed("clone3(CLONE_NEWUSER) made child %ld", pid);
}

static int a_io_uring(void) {
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  long fd = syscall(SYS_io_uring_setup, 4, &p);
  if (fd < 0)
    return blocked(errno);
  close((int)fd);
  return allowed("io_uring_setup gave fd %ld", fd);
}

static int a_perf(void) {
  struct perf_event_attr a;
  memset(&a, 0, sizeof(a));
  a.size = sizeof(a);
  a.type = PERF_TYPE_SOFTWARE;
  a.config = PERF_COUNT_SW_TASK_CLOCK;
  a.disabled = 1;
  a.exclude_kernel = 1;
  a.exclude_hv = 1;
  long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0UL);
  if (fd < 0)
    return blocked(errno);
  close((int)fd);
  return allowed("perf_event_open gave fd %ld", fd);
}

static int a_userfaultfd(void) {
  long fd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
  if (fd < 0 && errno == EINVAL)
    fd = syscall(SYS_userfaultfd, O_CLOEXEC); /* kernels before 5.11 */
  if (fd < 0)
    return blocked(errno);
  close((int)fd);
  return allowed("userfaultfd gave fd %ld", fd);
}

static int a_bpf(void) {
  union bpf_attr a;
  memset(&a, 0, sizeof(a));
  a.map_type = BPF_MAP_TYPE_ARRAY;
  a.key_size = 4;
  a.value_size = 4;
  a.max_entries = 1;
  long fd = syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof(a));
  if (fd < 0)
    return blocked(errno);
  close((int)fd);
  return allowed("bpf(BPF_MAP_CREATE) gave fd %ld", fd);
}

static int a_mount(void) {
  char dir[] = "/tmp/gn-probe-XXXXXX";
  if (!mkdtemp(dir))
    return probe_error("mkdtemp in /tmp", errno);
  int rc = mount("gn-probe", dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k");
  int e = errno;
  if (rc == 0)
    umount2(dir, MNT_DETACH);
  rmdir(dir);
  if (rc < 0)
    return blocked(e);
  return allowed("mounted a tmpfs");
}

static int a_fsopen(void) {
  long fd = syscall(SYS_fsopen, "tmpfs", 0U);
  if (fd < 0)
    return blocked(errno);
  close((int)fd);
  return allowed("fsopen gave fd %ld", fd);
}

static int a_umount(void) {
  /* A fresh directory that is no mount point: the kernel checks the
   * capability first (EPERM), then the mount (EINVAL), so EINVAL means the
   * call got past the check without unmounting anything. */
  char dir[] = "/tmp/gn-probe-XXXXXX";
  if (!mkdtemp(dir))
    return probe_error("mkdtemp in /tmp", errno);
  long rc = syscall(SYS_umount2, dir, 0);
  int e = errno;
  rmdir(dir);
  errno = e;
  return refused_or_reached(rc, "umount2");
}

static pid_t spawn_sleeper(void) {
  pid_t pid = fork();
  if (pid == 0) {
    for (;;)
      pause();
  }
  return pid;
}

static void reap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static int a_ptrace(void) {
  pid_t pid = spawn_sleeper();
  if (pid < 0)
    return probe_error("fork", errno);
  long rc = ptrace(PTRACE_SEIZE, pid, NULL, NULL);
  int e = errno;
  reap(pid);
  if (rc < 0)
    return blocked(e);
  return allowed("ptrace attached to pid %ld", (long)pid);
}

static volatile long secret = 0x5ec2e7;

static int a_process_vm(void) {
  pid_t pid = spawn_sleeper();
  if (pid < 0)
    return probe_error("fork", errno);
  long v = 0;
  struct iovec local = {&v, sizeof(v)}, remote = {(void *)&secret, sizeof(secret)};
  ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  int e = errno;
  reap(pid);
  if (n < 0)
    return blocked(e);
  return allowed("process_vm_readv read another process (%lx)", v);
}

static int a_kexec(void) {
  return refused_or_reached(syscall(SYS_kexec_file_load, -1, -1, 0UL, "", 0UL), "kexec_file_load");
}

static int a_module(void) {
  return refused_or_reached(syscall(SYS_finit_module, -1, "", 0), "finit_module");
}

static int a_swapon(void) {
  return refused_or_reached(syscall(SYS_swapon, "/gn-probe-no-such-swap", 0), "swapon");
}

static int a_acct(void) {
  return refused_or_reached(syscall(SYS_acct, "/gn-probe-no-such-file"), "acct");
}

static int a_settime(void) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return refused_or_reached(syscall(SYS_clock_settime, CLOCK_REALTIME, &now), "clock_settime");
}

static int a_mknod(void) {
  const char *path = "/tmp/gn-probe-sda";
  if (mknod(path, S_IFCHR | 0600, makedev(8, 0)) < 0)
    return blocked(errno);
  unlink(path);
  return allowed("made a block-disk character node");
}

static int a_raw_socket(void) {
  int fd = socket(AF_PACKET, SOCK_RAW, 0);
  if (fd < 0)
    return blocked(errno);
  close(fd);
  return allowed("opened an AF_PACKET socket (%ld)", (long)fd);
}

static int a_chown_root_file(void) {
  /* Giving a file to another uid needs CAP_CHOWN. */
  char path[] = "/tmp/gn-probe-chown-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0)
    return probe_error("mkstemp in /tmp", errno);
  int rc = fchown(fd, 12345, 12345);
  int e = errno;
  close(fd);
  unlink(path);
  if (rc < 0)
    return blocked(e);
  return allowed("gave a file to uid 12345");
}

/* The host id that id maps to, from /proc/self/{uid,gid}_map. */
static int host_id(const char *map, unsigned long id, unsigned long *ret) {
  FILE *f = fopen(map, "r");
  if (!f)
    return -1;
  unsigned long in, out, count;
  int found = -1;
  while (fscanf(f, "%lu %lu %lu", &in, &out, &count) == 3) {
    if (id >= in && id - in < count) {
      *ret = out + (id - in);
      found = 0;
      break;
    }
  }
  fclose(f);
  return found;
}

static int a_whoami(void) {
  unsigned long hu, hg;
  uid_t u = getuid();
  gid_t g = getgid();
  if (host_id("/proc/self/uid_map", u, &hu) < 0 || host_id("/proc/self/gid_map", g, &hg) < 0)
    return probe_error("reading /proc/self/uid_map", errno);
  printf("uid=%lu gid=%lu host_uid=%lu host_gid=%lu\n", (unsigned long)u, (unsigned long)g, hu, hg);
  if (hu == 0 || hg == 0)
    return allowed("the job runs as host root");
  printf("BLOCKED host_uid=%lu\n", hu);
  return 0;
}

static const struct {
  const char *name;
  int (*fn)(void);
  const char *help;
} attacks[] = {
    {"keyctl-read", a_keyctl_read, "read the user keyring (keyctl)"},
    {"add-key", a_add_key, "add a key to the session keyring (add_key)"},
    {"keyctl-persistent", a_keyctl_persistent, "link the uid's persistent keyring (keyctl)"},
    {"keyctl-join", a_keyctl_join, "join a named session keyring, a channel between jobs"},
    {"request-key", a_request_key, "search the keyrings (request_key)"},
    {"userns", a_userns, "unshare(CLONE_NEWUSER)"},
    {"clone-userns", a_clone_userns, "clone(CLONE_NEWUSER)"},
    {"clone3-userns", a_clone3_userns, "clone3(CLONE_NEWUSER)"},
    {"io_uring", a_io_uring, "io_uring_setup"},
    {"perf", a_perf, "perf_event_open on itself"},
    {"userfaultfd", a_userfaultfd, "userfaultfd"},
    {"bpf", a_bpf, "bpf(BPF_MAP_CREATE)"},
    {"mount", a_mount, "mount a tmpfs"},
    {"fsopen", a_fsopen, "fsopen(\"tmpfs\")"},
    {"umount", a_umount, "umount2 past the capability check"},
    {"ptrace", a_ptrace, "ptrace(PTRACE_SEIZE) its own child"},
    {"process-vm", a_process_vm, "process_vm_readv from its own child"},
    {"kexec", a_kexec, "kexec_file_load past the capability check"},
    {"module", a_module, "finit_module past the capability check"},
    {"swapon", a_swapon, "swapon past the capability check"},
    {"acct", a_acct, "acct past the capability check"},
    {"settime", a_settime, "clock_settime(CLOCK_REALTIME, now)"},
    {"mknod", a_mknod, "mknod a disk's character node in /tmp"},
    {"raw-socket", a_raw_socket, "socket(AF_PACKET, SOCK_RAW)"},
    {"chown-root-file", a_chown_root_file, "give a file to another uid (CAP_CHOWN)"},
    {"whoami", a_whoami, "uid inside and on the host; host root is ALLOWED"},
};

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 2 && strcmp(argv[1], "list") == 0) {
    for (size_t i = 0; i < sizeof(attacks) / sizeof(attacks[0]); i++)
      printf("%-16s %s\n", attacks[i].name, attacks[i].help);
    return 0;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: gn_probe ATTACK | list\n");
    return 2;
  }
  for (size_t i = 0; i < sizeof(attacks) / sizeof(attacks[0]); i++)
    if (strcmp(argv[1], attacks[i].name) == 0)
      return attacks[i].fn();
  fprintf(stderr, "gn_probe: unknown attack %s (try: gn_probe list)\n", argv[1]);
  return 2;
}
