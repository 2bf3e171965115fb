/* p2p benchmarks: Ed25519 sign+verify, envelope seal+open, the Noise
 * session's own cost in one process (send, then feed and decrypt) against
 * libsodium's ChaCha20-Poly1305 alone on one core, and the session over TCP
 * loopback against plain TCP in the same run. Each figure runs for about
 * two seconds (the in-process ones one). */
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
  size_t msg_len;
} writer;

static void *writer_main(void *arg) {
  writer *w = arg;
  uint8_t *buf = malloc(w->msg_len);
  memset(buf, 0x5a, w->msg_len);
  double t0 = now_s();
  while ((now_s() - t0) * 1000 < RUN_MS) {
    if (!w->s) {
      write_all(w->fd, buf, w->msg_len);
      continue;
    }
    if (gn__session_send(w->s, buf, w->msg_len) != 0)
      abort();
    /* As the transport does: take the output buffer itself, write it, free
     * it. */
    gn_buf out = {0};
    gn__session_take_output(w->s, &out);
    write_all(w->fd, out.data, out.len);
    gn_buf_done(&out);
  }
  shutdown(w->fd, SHUT_WR);
  free(buf);
  return NULL;
}

/* Returns MiB/s of application bytes delivered. */
static double stream(gn_session *tx, gn_session *rx, size_t msg_len) {
  int fds[2];
  tcp_pair(fds);
  writer w = {fds[0], tx, msg_len};
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
      if (r == 1 && ev.kind == GN_SESSION_EV_MESSAGE) {
        if (ev.msg_len != msg_len || ev.msg[0] != 0x5a || ev.msg[msg_len - 1] != 0x5a)
          abort();
        bytes += ev.msg_len;
      }
    }
  }
  double t = now_s() - t0;
  pthread_join(th, NULL);
  close(fds[0]);
  close(fds[1]);
  return (double)bytes / t / (1024.0 * 1024.0);
}

#define ROUND_MS 250
#define ROUNDS 4

/* libsodium's ChaCha20-Poly1305 (IETF, the Noise ChaChaPoly cipher): one
 * message of len bytes sealed and (unless seal_only) opened per round, for
 * ROUND_MS, in MiB/s of message. */
static double bench_raw_aead(size_t len, bool seal_only) {
  uint8_t *m = malloc(len), *c = malloc(len + crypto_aead_chacha20poly1305_ietf_ABYTES), *d = malloc(len);
  uint8_t k[crypto_aead_chacha20poly1305_ietf_KEYBYTES], nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES] = {0};
  if (!m || !c || !d)
    abort();
  memset(m, 0x5a, len);
  randombytes_buf(k, sizeof(k));
  uint64_t bytes = 0, n = 0;
  double t0 = now_s(), t;
  do {
    unsigned long long clen, dlen;
    memcpy(nonce + 4, &n, sizeof(n));
    n++;
    crypto_aead_chacha20poly1305_ietf_encrypt(c, &clen, m, len, NULL, 0, NULL, nonce, k);
    if (!seal_only &&
        (crypto_aead_chacha20poly1305_ietf_decrypt(d, &dlen, NULL, c, clen, NULL, 0, nonce, k) != 0 || dlen != len))
      abort();
    bytes += len;
    t = now_s() - t0;
  } while (t * 1000 < ROUND_MS);
  free(m);
  free(c);
  free(d);
  return (double)bytes / t / (1024.0 * 1024.0);
}

/* The session's own cost: gn__session_send, the output taken as the
 * transport takes it, and all of it fed to the peer session until the
 * message event, in one thread with no socket. MiB/s of message. */
static double bench_session_inproc(gn_session *tx, gn_session *rx, size_t len) {
  uint8_t *m = malloc(len);
  if (!m)
    abort();
  memset(m, 0x5a, len);
  uint64_t bytes = 0;
  double t0 = now_s(), t;
  do {
    if (gn__session_send(tx, m, len) != 0)
      abort();
    gn_buf out = {0};
    gn__session_take_output(tx, &out);
    size_t pos = 0;
    bool got = false;
    while (pos < out.len) {
      size_t used;
      gn_session_event ev;
      int r = gn__session_feed(rx, out.data + pos, out.len - pos, &used, &ev);
      if (r < 0)
        abort();
      pos += used;
      if (r == 1 && ev.kind == GN_SESSION_EV_MESSAGE) {
        if (ev.msg_len != len || ev.msg[0] != 0x5a || ev.msg[len - 1] != 0x5a)
          abort();
        got = true;
      }
    }
    gn_buf_done(&out);
    if (!got)
      abort();
    bytes += len;
    t = now_s() - t0;
  } while (t * 1000 < ROUND_MS);
  free(m);
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

  gn_session_cfg ca = {.initiator = true, .id = a}, cb = {.initiator = false, .id = b};
  gn_session *sa, *sb;
  if (gn__session_new(&ca, &sa) < 0 || gn__session_new(&cb, &sb) < 0)
    return 1;
  handshake(sa, sb);

  /* In one process, one core: the ratio is what the session adds to the
   * AEAD itself (framing, copies, allocation). The two alternate in short
   * rounds and each keeps its best, so that load from elsewhere on a shared
   * machine weighs on both alike. */
  static const size_t sizes[] = {64u << 10, 1u << 20, 4u << 20};
  printf("in-process, one core (MiB/s of messages; seal+open each; best of %d rounds of %d ms):\n", ROUNDS, ROUND_MS);
  printf("  %-9s %16s %16s %8s\n", "message", "libsodium AEAD", "Noise session", "ratio");
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    double raw = 0, ses = 0;
    for (int k = 0; k < ROUNDS; k++) {
      double x = bench_raw_aead(sizes[i], false), y = bench_session_inproc(sa, sb, sizes[i]);
      raw = x > raw ? x : raw;
      ses = y > ses ? y : ses;
    }
    printf("  %5zu KiB %16.0f %16.0f %8.2f\n", sizes[i] >> 10, raw, ses, ses / raw);
  }
  /* Over TCP each side does one direction on its own thread: the bound is
   * libsodium sealing alone (opening is no faster). */
  double seal = 0;
  for (int k = 0; k < ROUNDS; k++) {
    double x = bench_raw_aead(64u << 10, true);
    seal = x > seal ? x : seal;
  }
  printf("libsodium seal only, 64 KiB, one core:  %6.0f MiB/s\n", seal);

  /* Over TCP loopback, writer and reader on two threads. */
  static const size_t tcp_sizes[] = {64u << 10, 1u << 20};
  for (size_t i = 0; i < sizeof(tcp_sizes) / sizeof(tcp_sizes[0]); i++) {
    double plain = stream(NULL, NULL, tcp_sizes[i]);
    double noise = stream(sa, sb, tcp_sizes[i]);
    printf("TCP loopback, %4zu KiB messages: plain %6.0f MiB/s, Noise session %6.0f MiB/s, noise / plain %.2f, "
           "noise / seal only %.2f\n",
           tcp_sizes[i] >> 10, plain, noise, noise / plain, noise / seal);
  }
  gn__session_free(sa);
  gn__session_free(sb);
  gn_identity_free(a);
  gn_identity_free(b);
  return 0;
}
