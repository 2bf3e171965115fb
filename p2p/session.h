/* Private to p2p: one peer connection as an I/O-free state machine. Bytes
 * from the socket go in, bytes for the socket and events come out; time and
 * randomness are injected, so a simulator drives it as well as libuv. */
#ifndef GPUNET_P2P_SESSION_H
#define GPUNET_P2P_SESSION_H

#include <gpunet/identity.h>
#include <gpunet/wire.h>

#include "noise.h"

#define GN_SESSION_PROTOCOL "Noise_XX_25519_ChaChaPoly_BLAKE2b"
#define GN_SESSION_PROLOGUE "gpunet-p2p-v1"
/* Signed by the node key to bind it to the session's Noise static key. */
#define GN_SESSION_STATIC_PREFIX "gpunet-noise-static-v1"
#define GN_SESSION_ADDR_MAX 64 /* with its NUL, like gn_offer.addr */
#define GN_SESSION_HANDSHAKE_TIMEOUT_MS 10000
/* A receive buffer up to GN_SESSION_KEEP_MAX (one 4 MiB message and its
 * framing) is kept for the next message, so a stream of large messages
 * does not allocate for each; a larger one is freed once its message has
 * been handed over. One above GN_SESSION_KEEP_SMALL (a 64 KiB message) is
 * freed at a tick once no message that needed it came for
 * GN_SESSION_KEEP_IDLE_MS. */
#define GN_SESSION_KEEP_MAX ((4u << 20) + 65536u)
#define GN_SESSION_KEEP_SMALL (128u * 1024u)
#define GN_SESSION_KEEP_IDLE_MS 2000

typedef struct gn_session gn_session;

typedef struct gn_session_cfg {
  bool initiator;
  const gn_identity *id;
  const char *listen_addr;       /* advertised to the peer; NULL or "" if none */
  uint64_t now_ms;               /* creation time, for the handshake deadline */
  uint64_t handshake_timeout_ms; /* 0: GN_SESSION_HANDSHAKE_TIMEOUT_MS */
  size_t max_msg;                /* 0: GN_MSG_MAX */
  /* Once up: closed (GN_ETIMEDOUT at a tick) when no message and no
   * keepalive came for idle_timeout_ms, or when a started message is not
   * whole msg_timeout_ms after its first frame, or, if longer, after the
   * time its announced size takes at msg_min_rate_bps. 0: no such limit. */
  uint64_t idle_timeout_ms;
  uint64_t msg_timeout_ms;
  uint64_t msg_min_rate_bps;
  gn_noise_rng rng; /* NULL: libsodium */
  void *rng_ud;
} gn_session_cfg;

typedef enum gn_session_event_kind {
  GN_SESSION_EV_UP = 1,  /* handshake done: peer and peer_addr are set */
  GN_SESSION_EV_MESSAGE, /* one application message: msg, msg_len */
  /* The peer's keepalive: an empty transport frame (docs/protocol.md §1.4),
   * which says the peer is there and carries nothing. */
  GN_SESSION_EV_KEEPALIVE,
} gn_session_event_kind;

typedef struct gn_session_event {
  gn_session_event_kind kind;
  /* Point into the session; valid until the next call on it. */
  const uint8_t *msg;
  size_t msg_len;
} gn_session_event;

int gn__session_new(const gn_session_cfg *cfg, gn_session **ret_s);
gn_session *gn__session_free(gn_session *s);
/* The initiator writes its first handshake message into the output. */
int gn__session_start(gn_session *s);
/* Consumes bytes from data until it has an event (returns 1 and fills
 * ret_ev), or all are consumed (returns 0). *ret_used says how many bytes
 * were taken either way. A negative return closes the session for good.
 * A message event's msg points into the session's receive buffer (no copy
 * is made): valid until the next feed, trim or tick; send leaves it be. */
int gn__session_feed(gn_session *s, const uint8_t *data, size_t len, size_t *ret_used, gn_session_event *ret_ev);
/* Encrypts one application message (1..max_msg bytes) into the output. */
int gn__session_send(gn_session *s, const uint8_t *msg, size_t len);
/* Moves the bytes waiting for the socket to the end of ret. */
int gn__session_take_output(gn_session *s, gn_buf *ret);
size_t gn__session_output_len(const gn_session *s);
/* Queues a keepalive (an empty frame) once up; GN_ESTATE before. */
int gn__session_keepalive(gn_session *s);
/* GN_ETIMEDOUT (and the session closes) when the handshake is not done by
 * its deadline, or once up past the idle or message deadline above. Also
 * frees a large idle receive buffer (GN_SESSION_KEEP_IDLE_MS). */
int gn__session_tick(gn_session *s, uint64_t now_ms);
/* The time feed and send take as now (gn__session_tick sets it too). */
void gn__session_set_time(gn_session *s, uint64_t now_ms);
/* Done with the last message event: a receive buffer over
 * GN_SESSION_KEEP_MAX is freed now rather than at the next feed (which does
 * the same). */
void gn__session_trim(gn_session *s);
/* Bytes the session holds allocated for the message being received and for
 * output not yet taken: what a peer can make it keep. */
size_t gn__session_mem(const gn_session *s);
/* How many times the receive buffer was allocated or grown: for tests. */
size_t gn__session_rx_grows(const gn_session *s);
/* Whether part of a message has arrived and the rest has not. */
bool gn__session_receiving(const gn_session *s);

bool gn__session_is_up(const gn_session *s);
bool gn__session_is_closed(const gn_session *s);
bool gn__session_is_initiator(const gn_session *s);
/* The peer's Ed25519 key and advertised address: valid once up. */
const uint8_t *gn__session_peer(const gn_session *s);
const char *gn__session_peer_addr(const gn_session *s);
/* The Noise handshake hash (GN_NOISE_HASHLEN bytes): the same at both ends
 * of one session, and different for every session. Valid once up (zeros
 * before); not secret, so it may be compared and shown. */
const uint8_t *gn__session_handshake_hash(const gn_session *s);
/* Why the session closed (a GN_E* code), 0 while open. */
int gn__session_error(const gn_session *s);
/* The peer's handshake or envelope version, when the session closed with
 * GN_EVERSION over a handshake payload. The session then still has output:
 * the rest of the handshake and one ERROR message (gn__proto_version_error)
 * that the caller should write out before closing the connection. */
uint64_t gn__session_peer_version(const gn_session *s);

/* proto_error.c. The version (the first element) of an encoded envelope,
 * without checking anything else; GN_EINVAL if there is none. */
int gn__proto_peek_version(const uint8_t *msg, size_t len, uint64_t *ret_v);
/* Seals the ERROR (type 40) that answers a peer speaking version their_v:
 * {reason: "unsupported protocol version N; this node speaks version 1",
 *  v: 1}, signed by id. Appends the envelope to ret. */
int gn__proto_version_error(const gn_identity *id, uint64_t their_v, gn_buf *ret);

#endif
