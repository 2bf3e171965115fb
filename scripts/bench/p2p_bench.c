/* p2p benchmarks: Ed25519 sign+verify, envelope seal+open, and Noise stream
 * throughput over TCP loopback against plain TCP in the same run. Each
 * figure runs for about two seconds. */
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../p2p/session.h"

#define RUN_MS 2000
#define CHUNK (1u << 20)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void bench_sign_verify(const gn_identity *id) {
  uint8_t msg[64] = {1}, sig[GN_SIG_LEN];
  unsigned long n = 0;
  double t0 = now_s(), t;
  do {
    for (int i = 0; i < 64; i++) {
      msg[0] = (uint8_t)n;
      gn_identity_sign(id, msg, sizeof(msg), sig);
      if (gn_sig_verify(id->pk, msg, sizeof(msg), sig) != 0)
        abort();
      n++;
    }
    t = now_s() - t0;
  } while (t * 1000 < RUN_MS);
  printf("ed25519 sign+verify (64-byte msg):     %10.0f /s\n", n / t);
}

static void bench_envelope(const gn_identity *id, size_t body_len) {
  uint8_t *body = calloc(1, body_len);
  gn_buf b = {0};
  gn_envelope env;
  unsigned long n = 0;
  double t0 = now_s(), t;
  do {
    for (int i = 0; i < 16; i++) {
      b.len = 0;
      body[0] = (uint8_t)n;
      if (gn_envelope_seal(id, GN_MSG_OFFER, body, body_len, &b) != 0 || gn_envelope_open(b.data, b.len, &env) != 0)
        abort();
      n++;
    }
    t = now_s() - t0;
  } while (t * 1000 < RUN_MS);
  printf("envelope seal+open (%5zu-byte body):   %10.0f /s\n", body_len, n / t);
  gn_buf_done(&b);
  free(body);
}

static void tcp_pair(int fds[2]) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  int l = socket(AF_INET, SOCK_STREAM, 0);
  if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 1) < 0 ||
      getsockname(l, (struct sockaddr *)&a, &al) < 0)
    abort();
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fds[0], (struct sockaddr *)&a, sizeof(a)) < 0)
    abort();
  fds[1] = accept(l, NULL, NULL);
  close(l);
  int one = 1;
  setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k <= 0)
      abort();
    p += k;
    n -= (size_t)k;
  }
}

typedef struct writer {
  int fd;
  gn_session *s; /* NULL: plain TCP */
} writer;

static void *writer_main(void *arg) {
  writer *w = arg;
  uint8_t *buf = malloc(CHUNK);
  memset(buf, 0x5a, CHUNK);
  gn_buf out = {0};
  double t0 = now_s();
  while ((now_s() - t0) * 1000 < RUN_MS) {
    if (!w->s) {
      write_all(w->fd, buf, CHUNK);
      continue;
    }
    if (gn__session_send(w->s, buf, CHUNK) != 0)
      abort();
    out.len = 0;
    gn__session_take_output(w->s, &out);
    write_all(w->fd, out.data, out.len);
  }
  shutdown(w->fd, SHUT_WR);
  gn_buf_done(&out);
  free(buf);
  return NULL;
}

/* Returns MiB/s of application bytes delivered. */
static double stream(gn_session *tx, gn_session *rx) {
  int fds[2];
  tcp_pair(fds);
  writer w = {fds[0], tx};
  pthread_t th;
  pthread_create(&th, NULL, writer_main, &w);
  static uint8_t rbuf[256 * 1024];
  uint64_t bytes = 0;
  double t0 = now_s();
  for (;;) {
    ssize_t k = read(fds[1], rbuf, sizeof(rbuf));
    if (k < 0)
      abort();
    if (k == 0)
      break;
    if (!rx) {
      bytes += (uint64_t)k;
      continue;
    }
    size_t pos = 0;
    while (pos < (size_t)k) {
      size_t used;
      gn_session_event ev;
      int r = gn__session_feed(rx, rbuf + pos, (size_t)k - pos, &used, &ev);
      if (r < 0)
        abort();
      pos += used;
      if (r == 1 && ev.kind == GN_SESSION_EV_MESSAGE)
        bytes += ev.msg_len;
    }
  }
  double t = now_s() - t0;
  pthread_join(th, NULL);
  close(fds[0]);
  close(fds[1]);
  return (double)bytes / t / (1024.0 * 1024.0);
}

static void handshake(gn_session *a, gn_session *b) {
  gn__session_start(a);
  for (int i = 0; i < 4; i++) {
    gn_session *from = i % 2 ? b : a, *to = i % 2 ? a : b;
    gn_buf out = {0};
    gn__session_take_output(from, &out);
    size_t pos = 0;
    while (pos < out.len) {
      size_t used;
      gn_session_event ev;
      if (gn__session_feed(to, out.data + pos, out.len - pos, &used, &ev) < 0)
        abort();
      pos += used;
    }
    gn_buf_done(&out);
  }
  if (!gn__session_is_up(a) || !gn__session_is_up(b))
    abort();
}

int main(void) {
  gn_identity *a, *b;
  if (gn_identity_generate(&a) < 0 || gn_identity_generate(&b) < 0)
    return 1;
  bench_sign_verify(a);
  bench_envelope(a, 1024);
  bench_envelope(a, 64 * 1024);

  double plain = stream(NULL, NULL);
  gn_session_cfg ca = {.initiator = true, .id = a}, cb = {.initiator = false, .id = b};
  gn_session *sa, *sb;
  if (gn__session_new(&ca, &sa) < 0 || gn__session_new(&cb, &sb) < 0)
    return 1;
  handshake(sa, sb);
  double noise = stream(sa, sb);
  printf("plain TCP loopback (1 MiB writes):     %10.0f MiB/s\n", plain);
  printf("Noise session over TCP loopback:       %10.0f MiB/s\n", noise);
  printf("noise / plain:                         %10.2f\n", noise / plain);
  gn__session_free(sa);
  gn__session_free(sb);
  gn_identity_free(a);
  gn_identity_free(b);
  return 0;
}
