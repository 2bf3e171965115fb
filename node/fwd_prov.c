/* The provider's end of forwarded ports: FWD_OPEN admitted only from the
 * lease's holder for a job of that lease that runs, and a TCP connection to
 * 127.0.0.1:PORT made from a socket created inside the job's network
 * namespace, so nothing is opened or reached on the provider's host. */
#include "fwd.h"
#include "node_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* A FWD_OPEN stamped further than this from our clock is refused. */
#define FWD_OPEN_SKEW_S 300

int gn__fwd_admit(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_fwdopen *m, gn_job **ret_job, char *why,
                  size_t cap) {
  gn_lease *l = gn__lease_find(n, m->lease_id);
  if (!l || l->role != GN_ROLE_PROVIDER) {
    gn__strf(why, cap, "no lease %s here", m->lease_id);
    return GN_ENOTFOUND;
  }
  if (memcmp(l->peer, peer, GN_PK_LEN) != 0) {
    gn__strf(why, cap, "lease %s is held by another node", m->lease_id);
    return GN_EPERM;
  }
  if (l->state != GN_LEASE_ACTIVE) {
    gn__strf(why, cap, "lease %s has ended", m->lease_id);
    return GN_EPERM;
  }
  int64_t now = gn_unix_s();
  if (m->issued_s > now + FWD_OPEN_SKEW_S || m->issued_s < now - FWD_OPEN_SKEW_S) {
    gn__strf(why, cap, "the open is stamped %llds from this provider's clock", (long long)(m->issued_s - now));
    return GN_EPERM;
  }
  gn_job *job = NULL;
  size_t running = 0;
  for (gn_job *j = n->jobs; j; j = j->next) {
    if (j->role != GN_ROLE_PROVIDER || strcmp(j->lease_id, m->lease_id) != 0)
      continue;
    if (m->job_id[0] ? strcmp(j->id, m->job_id) == 0 : j->state == GN_JOB_RUNNING) {
      job = j;
      running++;
    }
  }
  if (!job) {
    if (m->job_id[0])
      gn__strf(why, cap, "no job %s on lease %s", m->job_id, m->lease_id);
    else
      gn__strf(why, cap, "no job runs on lease %s", m->lease_id);
    return GN_ENOTFOUND;
  }
  if (running > 1) {
    gn__strf(why, cap, "%zu jobs run on lease %s: name one", running, m->lease_id);
    return GN_EINVAL;
  }
  if (job->state != GN_JOB_RUNNING) {
    gn__strf(why, cap, "job %s is not running", job->id);
    return GN_EPERM;
  }
  gn__fwd *f = n->fwd;
  if (f && gn__fwd_streams_of_lease(f, m->lease_id) >= GN_FWD_STREAMS_PER_LEASE) {
    gn__strf(why, cap, "lease %s has %d streams open already", m->lease_id, GN_FWD_STREAMS_PER_LEASE);
    return GN_EBUSY;
  }
  if (f && f->nstreams >= GN_FWD_STREAMS_MAX) {
    gn__strf(why, cap, "this provider has %d forwarded streams open already", GN_FWD_STREAMS_MAX);
    return GN_EBUSY;
  }
  *ret_job = job;
  return 0;
}

/* A TCP socket made inside pid's network namespace: the loop thread enters
 * it for the socket() call alone and comes straight back. A socket stays in
 * the namespace it was made in, so its connect reaches the sandbox's
 * loopback, never the host's. Refuses a job that shares our namespace. */
static int socket_in_netns(gn__fwd *f, pid_t pid, int *ret_fd) {
  char path[64];
  struct stat ours, theirs;
  if (f->self_ns < 0 || fstat(f->self_ns, &ours) < 0)
    return GN_EIO;
  gn__strf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0)
    return -errno;
  int r = 0, fd = -1;
  if (fstat(ns, &theirs) < 0) {
    r = -errno;
  } else if (theirs.st_ino == ours.st_ino && theirs.st_dev == ours.st_dev) {
    r = GN_EPERM; /* never the host's network */
  } else if (setns(ns, CLONE_NEWNET) < 0) {
    r = -errno;
  } else {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      r = -errno;
    if (setns(f->self_ns, CLONE_NEWNET) < 0) {
      /* Every later socket of the daemon would be made in the job's
       * namespace: stopping is the only safe answer. */
      gn_log(GN_LOG_ERROR, "cannot return to the provider's network namespace: %s", strerror(errno));
      abort();
    }
  }
  close(ns);
  if (r == 0)
    *ret_fd = fd;
  return r;
}

static void send_refusal(gn__fwd *f, const uint8_t peer[GN_PK_LEN], uint32_t stream, const char *why) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__fwd_close_encode(&w, stream, false, true, why);
  gn__fwd_send(f, peer, GN_MSG_FWD_CLOSE, &w);
  gn_wire_writer_done(&w);
}

static void on_connect_timeout(uv_timer_t *t) {
  gn__fwd_stream *s = t->data;
  char why[96];
  gn__strf(why, sizeof why, "port %u in the sandbox did not answer within %d s", s->port,
           GN_FWD_CONNECT_TIMEOUT_MS / 1000);
  gn__fwd_stream_reset(s, true, why);
}

static void on_connect(uv_connect_t *req, int status) {
  gn__fwd_stream *s = req->data;
  if (s->closing)
    return;
  if (s->timer_open) {
    s->timer_open = false;
    uv_close((uv_handle_t *)&s->connect_timer, gn__fwd_handle_closed);
  }
  if (status == 0) {
    gn__fwd_stream_connected(s);
    return;
  }
  char why[128];
  if (status == UV_ECONNREFUSED)
    gn__strf(why, sizeof why, "nothing listens on port %u in the sandbox", s->port);
  else
    gn__strf(why, sizeof why, "cannot connect to port %u in the sandbox: %s", s->port, uv_strerror(status));
  gn__fwd_stream_reset(s, true, why);
}

void gn__fwd_prov_on_open(gn__fwd *f, const uint8_t peer[GN_PK_LEN], const gn_fwdopen *m) {
  gn_node *n = f->n;
  char why[GN_FWD_REASON_LEN];
  gn_job *j = NULL;
  gn__fwd_stream *old = gn__fwd_stream_find(f, peer, m->stream, false);
  if (old) { /* a stream id is never reused while it is open: both end */
    gn__fwd_stream_reset(old, true, "stream id reused");
    f->refused++;
    return;
  }
  int r = gn__fwd_admit(n, peer, m, &j, why, sizeof why);
  pid_t pid = 0;
  int fd = -1;
  if (r == 0 && gn__job_container_pid(n, j, &pid) < 0) {
    gn__strf(why, sizeof why, "job %s has no running container yet", j->id);
    r = GN_ENOTFOUND;
  }
  if (r == 0 && (r = socket_in_netns(f, pid, &fd)) < 0)
    gn__strf(why, sizeof why, "cannot reach job %s's network: %s", j->id, gn_strerror(r));
  if (r < 0) {
    f->refused++;
    char pid_s[GN_NODE_ID_STRLEN];
    gn_node_id_format(peer, pid_s);
    gn_log_ratelimited("fwd-refused", GN_LOG_INFO, "refused a forwarded stream from %s: %s", pid_s, why);
    send_refusal(f, peer, m->stream, why);
    return;
  }
  gn__fwd_stream *s = gn__fwd_stream_new(f, peer, m->stream, false);
  if (!s) {
    close(fd);
    send_refusal(f, peer, m->stream, "out of memory");
    return;
  }
  snprintf(s->lease_id, sizeof s->lease_id, "%s", m->lease_id);
  snprintf(s->job_id, sizeof s->job_id, "%s", j->id);
  s->port = (uint16_t)m->port;
  struct sockaddr_in sa;
  uv_ip4_addr("127.0.0.1", (int)m->port, &sa);
  s->connect_req.data = s;
  if ((r = uv_tcp_open(&s->tcp, fd)) < 0)
    close(fd); /* not adopted by the handle */
  if (r < 0 || (r = uv_tcp_connect(&s->connect_req, &s->tcp, (const struct sockaddr *)&sa, on_connect)) < 0) {
    gn__strf(why, sizeof why, "cannot connect to port %u in the sandbox: %s", s->port, uv_strerror(r));
    gn__fwd_stream_reset(s, true, why);
    return;
  }
  uv_timer_init(n->loop, &s->connect_timer);
  s->connect_timer.data = s;
  s->timer_open = true;
  s->handles++;
  uv_timer_start(&s->connect_timer, on_connect_timeout, GN_FWD_CONNECT_TIMEOUT_MS, 0);
  f->opened++;
}

/* Streams whose lease ended, whose job stopped or whose session went down
 * end with it. */
void gn__fwd_prov_check(gn__fwd *f) {
  gn_node *n = f->n;
  for (gn__fwd_stream *s = f->streams, *next; s; s = next) {
    next = s->next;
    if (s->opener)
      continue;
    gn_lease *l = gn__lease_find(n, s->lease_id);
    gn_job *j = gn__job_find(n, s->job_id);
    bool up = n->tp && gn_transport_is_up(n->tp, s->peer);
    if (!l || l->state != GN_LEASE_ACTIVE)
      gn__fwd_stream_reset(s, up, "the lease ended");
    else if (!j || j->state != GN_JOB_RUNNING)
      gn__fwd_stream_reset(s, up, "the job ended");
    else if (!up)
      gn__fwd_stream_reset(s, false, "");
  }
}
