/* The job's seccomp profile ("linux.seccomp" in config.json): an allow list
 * in the shape of the container engines' default profile. Whatever is not
 * listed fails with EPERM.
 *
 * Left out on purpose, so a job gets EPERM for them: the keyring calls
 * (add_key, request_key, keyctl: keyrings are per host uid and outlive the
 * job, a channel between leases), io_uring_* (a large kernel attack surface
 * that also escapes seccomp for the operations it runs), perf_event_open,
 * userfaultfd (both widen kernel exploits), bpf, every mount call (mount,
 * umount2, pivot_root, move_mount, open_tree, fsopen, fsconfig, fsmount,
 * fspick, mount_setattr), setns, ptrace, process_vm_readv/writev, kcmp,
 * pidfd_getfd, process_madvise, kexec_load, kexec_file_load, init_module,
 * finit_module, delete_module, reboot, swapon, swapoff, acct, settimeofday,
 * stime, clock_settime, sethostname, setdomainname, syslog, quotactl,
 * lookup_dcookie, open_by_handle_at, fanotify_init, iopl, ioperm,
 * modify_ldt, chroot, vhangup, uselib, personality except the harmless
 * values, and socket(AF_VSOCK).
 *
 * New namespaces: unshare and clone are allowed only without namespace flags
 * (threads and fork need clone; unshare(CLONE_FILES) and friends are
 * legitimate), and clone3, whose flags live in memory a filter cannot read,
 * fails with ENOSYS so that libc falls back to clone, as the engines do.
 *
 * Kept for GPU jobs: ioctl (every CUDA driver call), mmap/mremap/mprotect,
 * futex and futex_waitv, the sched_* family, the NUMA memory policy calls
 * (get_mempolicy, set_mempolicy, mbind: NCCL and hwloc use them; the engines
 * gate them on CAP_SYS_NICE, but they only move the job's own pages within
 * its cpuset), memfd_create, eventfd, epoll, shared memory and semaphores. */
#include "sandbox_int.h"

#include <jansson.h>

/* The namespace bits of clone and unshare flags: CLONE_NEWNS, NEWUTS,
 * NEWIPC, NEWUSER, NEWPID, NEWNET, NEWCGROUP. unshare also refuses
 * CLONE_NEWTIME (0x80), which for clone is part of the exit signal. */
#define CLONE_NS_FLAGS 0x7E020000u
#define UNSHARE_NS_FLAGS (CLONE_NS_FLAGS | 0x80u)
#define AF_VSOCK_FAMILY 40
#define ERRNO_EPERM 1
#define ERRNO_ENOSYS 38

static const char *const allow[] = {
    /* files and descriptors */
    "access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range", "creat", "dup", "dup2",
    "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fchdir", "fchmod", "fchmodat",
    "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr", "flock",
    "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate",
    "ftruncate64", "futimesat", "getcwd", "getdents", "getdents64", "getxattr", "inotify_add_watch", "inotify_init",
    "inotify_init1", "inotify_rm_watch", "lchown", "lchown32", "lgetxattr", "link", "linkat", "listxattr", "llistxattr",
    "_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "mkdir", "mkdirat", "mknod", "mknodat",
    "name_to_handle_at", "newfstatat", "open", "openat", "openat2", "pipe", "pipe2", "pread64", "preadv", "preadv2",
    "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "removexattr", "rename",
    "renameat", "renameat2", "rmdir", "sendfile", "sendfile64", "setxattr", "splice", "stat", "stat64", "statfs",
    "statfs64", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate", "truncate64",
    "umask", "unlink", "unlinkat", "utime", "utimensat", "utimensat_time64", "utimes", "vmsplice", "write", "writev",
    "fanotify_mark", "cachestat",
    /* polling, events, timers, clocks */
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait",
    "epoll_wait_old", "eventfd", "eventfd2", "poll", "ppoll", "ppoll_time64", "pselect6", "pselect6_time64", "select",
    "_newselect", "signalfd", "signalfd4", "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
    "timerfd_settime64", "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64",
    "timer_settime", "timer_settime64", "alarm", "getitimer", "setitimer", "clock_getres", "clock_getres_time64",
    "clock_gettime", "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "clock_adjtime", "clock_adjtime64",
    "adjtimex", "gettimeofday", "nanosleep", "time", "times", "pause",
    /* asynchronous I/O (the old interface; io_uring is refused) */
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "io_setup", "io_submit",
    "ioprio_get", "ioprio_set",
    /* memory */
    "brk", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mlock", "mlock2", "mlockall", "mmap",
    "mmap2", "mprotect", "mremap", "msync", "munlock", "munlockall", "munmap", "remap_file_pages", "pkey_alloc",
    "pkey_free", "pkey_mprotect", "get_mempolicy", "set_mempolicy", "set_mempolicy_home_node", "mbind",
    "map_shadow_stack",
    /* processes, threads, signals */
    "execve", "execveat", "exit", "exit_group", "fork", "vfork", "wait4", "waitid", "waitpid", "kill", "tkill",
    "tgkill", "pidfd_open", "pidfd_send_signal", "process_mrelease", "restart_syscall", "rseq", "set_robust_list",
    "get_robust_list", "set_tid_address", "get_thread_area", "set_thread_area", "gettid", "getpid", "getppid",
    "getpgid", "getpgrp", "setpgid", "getsid", "setsid", "prctl", "seccomp", "capget", "capset", "getrlimit",
    "setrlimit", "ugetrlimit", "prlimit64", "getrusage", "getpriority", "setpriority", "getcpu", "getrandom", "sysinfo",
    "uname", "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sigaltstack", "sigprocmask", "sigreturn",
    "futex", "futex_time64", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue", "landlock_add_rule",
    "landlock_create_ruleset", "landlock_restrict_self",
    /* scheduling */
    "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max", "sched_get_priority_min",
    "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr",
    "sched_setparam", "sched_setscheduler", "sched_yield",
    /* credentials (inside the job's own user namespace) */
    "getuid", "getuid32", "geteuid", "geteuid32", "getgid", "getgid32", "getegid", "getegid32", "getgroups",
    "getgroups32", "getresuid", "getresuid32", "getresgid", "getresgid32", "setuid", "setuid32", "setgid", "setgid32",
    "setreuid", "setreuid32", "setregid", "setregid32", "setresuid", "setresuid32", "setresgid", "setresgid32",
    "setgroups", "setgroups32", "setfsuid", "setfsuid32", "setfsgid", "setfsgid32",
    /* System V and POSIX IPC (inside the job's own IPC namespace) */
    "ipc", "msgctl", "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop", "semtimedop_time64",
    "shmat", "shmctl", "shmdt", "shmget", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink",
    /* sockets (socket itself has its own rule) */
    "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen", "recv", "recvfrom",
    "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg", "sendmsg", "sendto", "setsockopt", "shutdown",
    "socketcall", "socketpair",
    /* devices: every CUDA driver call is an ioctl on /dev/nvidia* */
    "ioctl", NULL};

#if defined(__x86_64__)
static const char *const arches[] = {"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", NULL};
static const char *const allow_arch[] = {"arch_prctl", NULL};
#elif defined(__aarch64__)
static const char *const arches[] = {"SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM", NULL};
static const char *const allow_arch[] = {
    "arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush", "set_tls", NULL};
#else
static const char *const arches[] = {NULL}; /* the runtime's native architecture only */
static const char *const allow_arch[] = {NULL};
#endif

/* personality(2) values that change nothing that matters: PER_LINUX,
 * PER_LINUX32, UNAME26, PER_LINUX32|UNAME26 and the 0xffffffff query. */
static const json_int_t personalities[] = {0x0, 0x8, 0x20000, 0x20008, 0xffffffff};

static json_t *names_json(const char *const *v) {
  json_t *a = json_array();
  for (size_t i = 0; a && v[i]; i++)
    if (json_array_append_new(a, json_string(v[i])) < 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

/* One rule: names, action, and at most one argument comparison (op NULL:
 * none). For SCMP_CMP_MASKED_EQ, value is the mask and value_two the
 * datum, as in the runtime spec. */
static json_t *rule(json_t *names, const char *action, int errno_ret, const char *op, unsigned index, json_int_t value,
                    json_int_t value_two) {
  json_t *r = json_pack("{s:o, s:s}", "names", names, "action", action);
  if (!r)
    return NULL;
  if (errno_ret && json_object_set_new(r, "errnoRet", json_integer(errno_ret)) < 0)
    goto fail;
  if (op && json_object_set_new(r, "args",
                                json_pack("[{s:I, s:I, s:I, s:s}]", "index", (json_int_t)index, "value", value,
                                          "valueTwo", value_two, "op", op)) < 0)
    goto fail;
  return r;
fail:
  json_decref(r);
  return NULL;
}

static int add(json_t *syscalls, json_t *r) {
  return r ? json_array_append_new(syscalls, r) : -1;
}

static json_t *one(const char *name) {
  return json_pack("[s]", name);
}

json_t *gn__seccomp_profile(void) {
  json_t *syscalls = json_array();
  json_t *profile = NULL;
  if (!syscalls)
    return NULL;
  if (add(syscalls, rule(names_json(allow), "SCMP_ACT_ALLOW", 0, NULL, 0, 0, 0)) < 0)
    goto fail;
  if (allow_arch[0] && add(syscalls, rule(names_json(allow_arch), "SCMP_ACT_ALLOW", 0, NULL, 0, 0, 0)) < 0)
    goto fail;
  /* clone and unshare without namespace flags: (flags & mask) == 0. */
  if (add(syscalls, rule(one("clone"), "SCMP_ACT_ALLOW", 0, "SCMP_CMP_MASKED_EQ", 0, CLONE_NS_FLAGS, 0)) < 0 ||
      add(syscalls, rule(one("unshare"), "SCMP_ACT_ALLOW", 0, "SCMP_CMP_MASKED_EQ", 0, UNSHARE_NS_FLAGS, 0)) < 0 ||
      add(syscalls, rule(one("clone3"), "SCMP_ACT_ERRNO", ERRNO_ENOSYS, NULL, 0, 0, 0)) < 0 ||
      add(syscalls, rule(one("socket"), "SCMP_ACT_ALLOW", 0, "SCMP_CMP_NE", 0, AF_VSOCK_FAMILY, 0)) < 0)
    goto fail;
  for (size_t i = 0; i < sizeof(personalities) / sizeof(personalities[0]); i++)
    if (add(syscalls, rule(one("personality"), "SCMP_ACT_ALLOW", 0, "SCMP_CMP_EQ", 0, personalities[i], 0)) < 0)
      goto fail;

  profile = json_pack("{s:s, s:i, s:o, s:o}", "defaultAction", "SCMP_ACT_ERRNO", "defaultErrnoRet", ERRNO_EPERM,
                      "architectures", names_json(arches), "syscalls", syscalls);
  return profile; /* json_pack took syscalls, or freed it on failure */
fail:
  json_decref(syscalls);
  return NULL;
}
