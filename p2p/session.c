/* One peer connection as an I/O-free state machine: length-prefixed Noise
 * frames, the XX handshake that binds each side's node key, and application
 * messages chunked across transport frames. */
#include "session.h"

#include <sodium.h>

enum { ST_HANDSHAKE, ST_UP, ST_CLOSED };

#define FRAME_HDR 2
#define MSG_HDR 4
#define PAYLOAD_MAX 256 /* handshake payload: a small map */

struct gn_session {
  int state;
  int error;
  bool initiator;
  const gn_identity *id;
  char addr[GN_SESSION_ADDR_MAX];
  uint64_t deadline_ms;
  size_t max_msg;
  uint64_t now_ms;
  uint64_t idle_timeout_ms, msg_timeout_ms, msg_min_rate_bps;
  uint64_t last_rx_ms;      /* the last whole message or keepalive, once up */
  uint64_t msg_deadline_ms; /* for the message being received */
  gn_noise_rng rng;
  void *rng_ud;

  gn_noise_handshake hs;
  uint8_t s_priv[GN_NOISE_DHLEN];
  gn_noise_cipher send, recv;

  uint8_t peer[GN_PK_LEN];
  char peer_addr[GN_SESSION_ADDR_MAX];
  uint8_t hash[GN_NOISE_HASHLEN]; /* the handshake hash, once up */
  uint64_t peer_version;          /* set when the payload's version was not ours */

  /* The frame being read: its length prefix, then its body, which goes
   * straight to where its plaintext belongs in rx (at body_at) and is
   * decrypted there in place. */
  uint8_t fhdr[FRAME_HDR];
  size_t fhdr_have;
  size_t flen, body_at, body_have;
  /* The receive buffer: a handshake frame, or the message being reassembled
   * as its frames' plaintext, the MSG_HDR size prefix first and each later
   * frame's after the last. Its capacity is kept across messages (up to
   * GN_SESSION_KEEP_MAX) so that a stream of large ones does not allocate. */
  uint8_t *rx;
  size_t rx_cap;
  size_t msg_len, msg_total;
  bool msg_delivered;
  uint64_t rx_big_ms; /* when a message last needed more than KEEP_SMALL */
  size_t rx_grows;    /* times rx was (re)allocated: for tests */

  uint8_t plain[PAYLOAD_MAX];
  gn_buf out;
};

static void random_bytes(gn_session *s, uint8_t *p, size_t n) {
  if (s->rng)
    s->rng(s->rng_ud, p, n);
  else
    randombytes_buf(p, n);
}

int gn__session_new(const gn_session_cfg *cfg, gn_session **ret_s) {
  if (!cfg || !cfg->id || !ret_s)
    return GN_EINVAL;
  if (cfg->listen_addr && strlen(cfg->listen_addr) >= GN_SESSION_ADDR_MAX)
    return GN_ETOOBIG;
  if (sodium_init() < 0)
    return GN_EIO;
  gn_session *s = calloc(1, sizeof(*s));
  if (!s)
    return GN_ENOMEM;
  s->state = ST_HANDSHAKE;
  s->initiator = cfg->initiator;
  s->id = cfg->id;
  if (cfg->listen_addr)
    snprintf(s->addr, sizeof(s->addr), "%s", cfg->listen_addr);
  s->deadline_ms =
      cfg->now_ms + (cfg->handshake_timeout_ms ? cfg->handshake_timeout_ms : GN_SESSION_HANDSHAKE_TIMEOUT_MS);
  s->max_msg = cfg->max_msg ? cfg->max_msg : GN_MSG_MAX;
  s->now_ms = cfg->now_ms;
  s->idle_timeout_ms = cfg->idle_timeout_ms;
  s->msg_timeout_ms = cfg->msg_timeout_ms;
  s->msg_min_rate_bps = cfg->msg_min_rate_bps;
  s->rng = cfg->rng;
  s->rng_ud = cfg->rng_ud;
  /* A fresh Noise static key per session: the node key signs it, so it needs
   * no life beyond the connection. */
  random_bytes(s, s->s_priv, sizeof(s->s_priv));
  int r = gn__noise_handshake_init(&s->hs, GN_SESSION_PROTOCOL, s->initiator, (const uint8_t *)GN_SESSION_PROLOGUE,
                                   strlen(GN_SESSION_PROLOGUE), s->s_priv, NULL, cfg->rng, cfg->rng_ud);
  if (r < 0) {
    gn__session_free(s);
    return r;
  }
  *ret_s = s;
  return 0;
}

gn_session *gn__session_free(gn_session *s) {
  if (!s)
    return NULL;
  free(s->rx);
  gn_buf_done(&s->out);
  /* Keys, the handshake and any plaintext left in the buffers. */
  sodium_memzero(s, sizeof(*s));
  free(s);
  return NULL;
}

static int session_fail(gn_session *s, int err) {
  if (s->state != ST_CLOSED) {
    s->state = ST_CLOSED;
    s->error = err;
    gn__noise_handshake_wipe(&s->hs);
    gn__noise_cipher_wipe(&s->send);
    gn__noise_cipher_wipe(&s->recv);
    sodium_memzero(s->s_priv, sizeof(s->s_priv));
  }
  return err;
}

/* Makes rx hold at least need bytes, and never more than limit. It grows
 * as frames arrive, never from a message's announced size alone: doubling
 * while small, then by at most 1 MiB a step, so what a peer makes us
 * allocate stays within a step of what it sent. */
static int rx_reserve(gn_session *s, size_t need, size_t limit) {
  if (need <= s->rx_cap)
    return 0;
  size_t step = s->rx_cap < (1u << 20) ? s->rx_cap : (1u << 20);
  size_t cap = s->rx_cap + (step < 4096 ? 4096 : step);
  if (cap > limit)
    cap = limit;
  if (cap < need)
    cap = need;
  uint8_t *p = realloc(s->rx, cap);
  if (!p)
    return GN_ENOMEM;
  s->rx = p;
  s->rx_cap = cap;
  s->rx_grows++;
  return 0;
}

static void rx_release(gn_session *s) {
  free(s->rx);
  s->rx = NULL;
  s->rx_cap = 0;
}

/* Makes room for n more bytes of output: exactly what is asked for once
 * large (an 8 MiB message takes 8 MiB, not the 16 a doubling would), by
 * doubling while small so that many small messages do not copy much. */
static int out_grow(gn_session *s, size_t n) {
  if (n > SIZE_MAX / 2 - s->out.len)
    return GN_ETOOBIG;
  size_t need = s->out.len + n;
  if (need <= s->out.cap)
    return 0;
  size_t cap = s->out.cap ? s->out.cap * 2 : 256;
  if (cap < need || cap - need > (1u << 20))
    cap = need;
  uint8_t *p = realloc(s->out.data, cap);
  if (!p)
    return GN_ENOMEM;
  s->out.data = p;
  s->out.cap = cap;
  return 0;
}

/* Appends a 2-byte length and a reserved body of n bytes to the output. */
static int out_frame(gn_session *s, size_t n, uint8_t **ret_body) {
  if (n > GN_NOISE_MAX_MSG)
    return GN_ETOOBIG;
  int r = out_grow(s, FRAME_HDR + n);
  if (r < 0)
    return r;
  uint8_t *p = s->out.data + s->out.len;
  p[0] = (uint8_t)(n >> 8);
  p[1] = (uint8_t)n;
  s->out.len += FRAME_HDR + n;
  *ret_body = p + FRAME_HDR;
  return 0;
}

/* {v, id, sig, addr}: sig binds our node key to our Noise static key. */
static int handshake_payload(gn_session *s, gn_buf *ret) {
  uint8_t msg[sizeof(GN_SESSION_STATIC_PREFIX) + GN_NOISE_DHLEN], sig[GN_SIG_LEN];
  memcpy(msg, GN_SESSION_STATIC_PREFIX, sizeof(GN_SESSION_STATIC_PREFIX));
  memcpy(msg + sizeof(GN_SESSION_STATIC_PREFIX), s->hs.s_pub, GN_NOISE_DHLEN);
  gn_identity_sign(s->id, msg, sizeof(msg), sig);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, s->id->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "sig");
  gn_wire_put_bin(&w, sig, GN_SIG_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, s->addr);
  int r = gn_wire_writer_take(&w, ret);
  gn_wire_writer_done(&w);
  return r;
}

static int verify_payload(gn_session *s, const uint8_t *p, size_t n) {
  gn_wire_doc doc;
  uint64_t v;
  uint8_t id[GN_PK_LEN], sig[GN_SIG_LEN], msg[sizeof(GN_SESSION_STATIC_PREFIX) + GN_NOISE_DHLEN];
  char addr[GN_SESSION_ADDR_MAX];
  int r = gn_wire_decode(p, n, &doc);
  if (r < 0)
    return GN_EPROTO;
  if (gn_wire_get_u64(doc.root, "v", &v) < 0) {
    r = GN_EPROTO;
    goto out;
  }
  if (v != GN_PROTO_VERSION) {
    s->peer_version = v;
    r = GN_EVERSION;
    goto out;
  }
  if (gn_wire_get_bin_exact(doc.root, "id", id, GN_PK_LEN) < 0 ||
      gn_wire_get_bin_exact(doc.root, "sig", sig, GN_SIG_LEN) < 0 ||
      gn_wire_get_str(doc.root, "addr", addr, sizeof(addr)) < 0 || !s->hs.has_rs) {
    r = GN_EPROTO;
    goto out;
  }
  memcpy(msg, GN_SESSION_STATIC_PREFIX, sizeof(GN_SESSION_STATIC_PREFIX));
  memcpy(msg + sizeof(GN_SESSION_STATIC_PREFIX), s->hs.rs, GN_NOISE_DHLEN);
  if ((r = gn_sig_verify(id, msg, sizeof(msg), sig)) < 0)
    goto out;
  memcpy(s->peer, id, GN_PK_LEN);
  memcpy(s->peer_addr, addr, sizeof(addr));
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

/* Writes our next handshake message (with the identity payload unless it is
 * the first, anonymous one) as a frame. */
static int handshake_send(gn_session *s) {
  gn_buf payload = {0};
  uint8_t *body;
  size_t n;
  int r = 0;
  if (s->hs.msg_index > 0 && (r = handshake_payload(s, &payload)) < 0)
    goto out;
  uint8_t msg[GN_NOISE_DHLEN * 2 + GN_NOISE_TAGLEN * 2 + PAYLOAD_MAX];
  if ((r = gn__noise_handshake_write(&s->hs, payload.data, payload.len, msg, sizeof(msg), &n)) < 0)
    goto out;
  if ((r = out_frame(s, n, &body)) < 0)
    goto out;
  memcpy(body, msg, n);
out:
  gn_buf_done(&payload);
  return r;
}

static int handshake_finish(gn_session *s) {
  int r = gn__noise_handshake_split(&s->hs, &s->send, &s->recv, s->hash);
  if (r < 0)
    return r;
  sodium_memzero(s->s_priv, sizeof(s->s_priv));
  s->state = ST_UP;
  s->last_rx_ms = s->now_ms;
  return 1;
}

int gn__session_start(gn_session *s) {
  if (s->state != ST_HANDSHAKE || !s->initiator || s->hs.msg_index != 0)
    return GN_ESTATE;
  int r = handshake_send(s);
  return r < 0 ? session_fail(s, r) : 0;
}

/* The peer's payload spoke another version. Rather than cut the connection
 * without a word, finish the handshake (our last message when it is ours to
 * send), then queue one ERROR saying which version we speak; the caller
 * writes the output and closes. The peer's identity is never taken up. */
static int version_refusal(gn_session *s, bool send_last) {
  gn_buf err = {0};
  int r = 0;
  if (send_last && (r = handshake_send(s)) < 0)
    return r;
  if ((r = handshake_finish(s)) < 0)
    return r;
  if ((r = gn__proto_version_error(s->id, s->peer_version, &err)) == 0)
    r = gn__session_send(s, err.data, err.len);
  gn_buf_done(&err);
  return r < 0 ? r : GN_EVERSION;
}

static int on_handshake_frame(gn_session *s, const uint8_t *f, size_t n, gn_session_event *ev) {
  size_t pn;
  int r = gn__noise_handshake_read(&s->hs, f, n, s->plain, PAYLOAD_MAX, &pn);
  if (r < 0)
    return r == GN_ESTATE ? GN_EPROTO : r;
  switch (s->hs.msg_index) {
  case 1: /* responder read the anonymous first message */
    if (pn != 0)
      return GN_EPROTO;
    return handshake_send(s);
  case 2: /* initiator read the responder's identity */
    if ((r = verify_payload(s, s->plain, pn)) == GN_EVERSION)
      return version_refusal(s, true);
    if (r < 0)
      return r;
    if ((r = handshake_send(s)) < 0)
      return r;
    break;
  case 3: /* responder read the initiator's identity */
    if ((r = verify_payload(s, s->plain, pn)) == GN_EVERSION)
      return version_refusal(s, false);
    if (r < 0)
      return r;
    break;
  default:
    return GN_EPROTO;
  }
  ev->kind = GN_SESSION_EV_UP;
  ev->msg = NULL;
  ev->msg_len = 0;
  return handshake_finish(s);
}

/* A frame's length prefix is in: checks it against what may come now and
 * makes room in rx for its body where its plaintext belongs. A later frame
 * of a message is checked before a byte of it is taken, so a peer never
 * makes rx grow past the message it announced. */
static int frame_begin(gn_session *s) {
  size_t at = 0, limit = GN_NOISE_MAX_MSG;
  if (s->flen == 0)
    return GN_EPROTO; /* no Noise message is empty */
  if (s->state == ST_UP) {
    if (s->flen < GN_NOISE_TAGLEN)
      return GN_EPROTO;
    if (s->msg_total) {
      size_t pn = s->flen - GN_NOISE_TAGLEN;
      /* A later frame of a message: some bytes, and no more than are due. */
      if (pn == 0 || pn > s->msg_total - s->msg_len)
        return GN_EPROTO;
      at = MSG_HDR + s->msg_len;
      limit = MSG_HDR + s->msg_total + GN_NOISE_TAGLEN;
    }
  }
  s->body_at = at;
  s->body_have = 0;
  return rx_reserve(s, at + s->flen, limit);
}

/* f is the frame's ciphertext: in rx at body_at already, or still in the
 * caller's bytes; either way its plaintext ends up in rx at body_at, which
 * for a later frame of a message is right after the bytes before it. */
static int on_transport_frame(gn_session *s, const uint8_t *f, size_t n, gn_session_event *ev) {
  uint8_t *p = s->rx + s->body_at;
  /* In place when f is p: the AEAD checks the tag before it decrypts. */
  int r = gn__noise_cipher_decrypt(&s->recv, NULL, 0, f, n, p);
  if (r < 0)
    return r;
  size_t pn = n - GN_NOISE_TAGLEN;
  if (s->msg_total == 0) {
    if (pn == 0) {
      /* A keepalive, between messages only. */
      s->last_rx_ms = s->now_ms;
      ev->kind = GN_SESSION_EV_KEEPALIVE;
      ev->msg = NULL;
      ev->msg_len = 0;
      return 1;
    }
    if (pn < MSG_HDR + 1)
      return GN_EPROTO;
    size_t total = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
    if (total == 0)
      return GN_EPROTO;
    if (total > s->max_msg)
      return GN_ETOOBIG;
    pn -= MSG_HDR;
    if (pn > total)
      return GN_EPROTO;
    s->msg_total = total;
    s->msg_len = 0;
    s->msg_deadline_ms = 0;
    if (s->msg_timeout_ms) {
      uint64_t need_ms = s->msg_min_rate_bps ? (uint64_t)total * 1000u / s->msg_min_rate_bps : 0;
      s->msg_deadline_ms = s->now_ms + (need_ms > s->msg_timeout_ms ? need_ms : s->msg_timeout_ms);
    }
  }
  s->msg_len += pn;
  if (s->msg_len < s->msg_total)
    return 0;
  s->last_rx_ms = s->now_ms;
  if (MSG_HDR + s->msg_total + GN_NOISE_TAGLEN > GN_SESSION_KEEP_SMALL)
    s->rx_big_ms = s->now_ms;
  ev->kind = GN_SESSION_EV_MESSAGE;
  ev->msg = s->rx + MSG_HDR;
  ev->msg_len = s->msg_total;
  s->msg_total = 0;
  s->msg_delivered = true;
  return 1;
}

int gn__session_feed(gn_session *s, const uint8_t *data, size_t len, size_t *ret_used, gn_session_event *ret_ev) {
  size_t used = 0;
  int r = 0;
  if (s->state == ST_CLOSED)
    return GN_ECLOSED;
  gn__session_trim(s);
  while (used < len) {
    if (s->fhdr_have < FRAME_HDR) {
      size_t take = FRAME_HDR - s->fhdr_have < len - used ? FRAME_HDR - s->fhdr_have : len - used;
      memcpy(s->fhdr + s->fhdr_have, data + used, take);
      s->fhdr_have += take;
      used += take;
      if (s->fhdr_have < FRAME_HDR)
        continue;
      s->flen = (size_t)s->fhdr[0] << 8 | s->fhdr[1];
      if ((r = frame_begin(s)) < 0)
        goto fail;
      continue;
    }
    size_t want = s->flen - s->body_have;
    const uint8_t *f;
    if (s->body_have == 0 && len - used >= want) {
      /* The whole frame is in the caller's bytes: decrypted from there. */
      f = data + used;
      used += want;
    } else {
      size_t take = want < len - used ? want : len - used;
      memcpy(s->rx + s->body_at + s->body_have, data + used, take);
      s->body_have += take;
      used += take;
      if (s->body_have < s->flen)
        continue;
      f = s->rx + s->body_at;
    }
    s->fhdr_have = 0;
    s->body_have = 0;
    if (s->state == ST_HANDSHAKE)
      r = on_handshake_frame(s, f, s->flen, ret_ev);
    else
      r = on_transport_frame(s, f, s->flen, ret_ev);
    if (r < 0)
      goto fail;
    if (r == 1) {
      *ret_used = used;
      return 1;
    }
  }
  *ret_used = used;
  return 0;
fail:
  *ret_used = used;
  return session_fail(s, r);
}

int gn__session_send(gn_session *s, const uint8_t *msg, size_t len) {
  if (s->state != ST_UP)
    return s->state == ST_CLOSED ? GN_ECLOSED : GN_ESTATE;
  if (len == 0 || !msg)
    return GN_EINVAL;
  if (len > s->max_msg || len > UINT32_MAX)
    return GN_ETOOBIG;
  size_t frames = (len + MSG_HDR + GN_NOISE_MAX_PAYLOAD - 1) / GN_NOISE_MAX_PAYLOAD;
  int r = out_grow(s, len + MSG_HDR + frames * (FRAME_HDR + GN_NOISE_TAGLEN));
  if (r < 0)
    return r;
  size_t off = 0;
  bool first = true;
  while (off < len) {
    size_t room = GN_NOISE_MAX_PAYLOAD - (first ? MSG_HDR : 0);
    size_t chunk = len - off < room ? len - off : room;
    size_t pn = chunk + (first ? MSG_HDR : 0);
    uint8_t *body;
    if ((r = out_frame(s, pn + GN_NOISE_TAGLEN, &body)) < 0)
      return session_fail(s, r);
    /* Sealed straight from the caller's bytes into the output, the first
     * frame's size prefix with them without a copy of the message. */
    if (first) {
      uint8_t hdr[MSG_HDR] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
      r = gn__noise_cipher_encrypt_head(&s->send, hdr, MSG_HDR, msg + off, chunk, body);
    } else {
      r = gn__noise_cipher_encrypt(&s->send, NULL, 0, msg + off, pn, body);
    }
    if (r < 0)
      return session_fail(s, r);
    off += chunk;
    first = false;
  }
  return 0;
}

int gn__session_take_output(gn_session *s, gn_buf *ret) {
  if (s->out.len == 0)
    return 0;
  int r;
  if (ret->len == 0 && ret->data == NULL) {
    /* Hand over the buffer itself: no copy for the common case. */
    *ret = s->out;
    memset(&s->out, 0, sizeof(s->out));
    return 0;
  }
  if ((r = gn_buf_append(ret, s->out.data, s->out.len)) < 0)
    return r;
  s->out.len = 0;
  return 0;
}

size_t gn__session_output_len(const gn_session *s) {
  return s->out.len;
}

int gn__session_keepalive(gn_session *s) {
  if (s->state != ST_UP)
    return s->state == ST_CLOSED ? GN_ECLOSED : GN_ESTATE;
  uint8_t *body;
  int r = out_frame(s, GN_NOISE_TAGLEN, &body);
  if (r < 0)
    return r;
  if ((r = gn__noise_cipher_encrypt(&s->send, NULL, 0, body, 0, body)) < 0)
    return session_fail(s, r);
  return 0;
}

int gn__session_tick(gn_session *s, uint64_t now_ms) {
  gn__session_set_time(s, now_ms);
  now_ms = s->now_ms;
  if (s->state == ST_HANDSHAKE && now_ms >= s->deadline_ms)
    return session_fail(s, GN_ETIMEDOUT);
  if (s->state == ST_UP) {
    if (s->idle_timeout_ms && now_ms - s->last_rx_ms >= s->idle_timeout_ms)
      return session_fail(s, GN_ETIMEDOUT);
    if (s->msg_total && s->msg_deadline_ms && now_ms >= s->msg_deadline_ms)
      return session_fail(s, GN_ETIMEDOUT);
    /* A large receive buffer kept for the next large message goes once none
     * has come for a while, when no frame is half read: a peer's burst of
     * big messages does not leave its memory held for good. */
    if (s->rx_cap > GN_SESSION_KEEP_SMALL && s->fhdr_have == 0 && s->msg_total == 0 &&
        now_ms - s->rx_big_ms >= GN_SESSION_KEEP_IDLE_MS) {
      s->msg_delivered = false;
      s->msg_len = 0;
      rx_release(s);
    }
  }
  return s->state == ST_CLOSED ? GN_ECLOSED : 0;
}

void gn__session_set_time(gn_session *s, uint64_t now_ms) {
  /* A clock read twice never goes back here; a caller's that does is held. */
  if (now_ms > s->now_ms)
    s->now_ms = now_ms;
}

void gn__session_trim(gn_session *s) {
  if (!s->msg_delivered)
    return;
  /* The last event's message has been seen; keep the allocation for the
   * next one unless it is very large (a peer's one 8 MiB message must not
   * stay held); gn__session_tick lets a large one go once idle. */
  s->msg_delivered = false;
  s->msg_len = 0;
  if (s->rx_cap > GN_SESSION_KEEP_MAX)
    rx_release(s);
}

size_t gn__session_mem(const gn_session *s) {
  return s->rx_cap + s->out.cap;
}

size_t gn__session_rx_grows(const gn_session *s) {
  return s->rx_grows;
}

bool gn__session_receiving(const gn_session *s) {
  return s->msg_total != 0;
}

bool gn__session_is_up(const gn_session *s) {
  return s->state == ST_UP;
}
bool gn__session_is_closed(const gn_session *s) {
  return s->state == ST_CLOSED;
}
bool gn__session_is_initiator(const gn_session *s) {
  return s->initiator;
}
const uint8_t *gn__session_peer(const gn_session *s) {
  return s->peer;
}
const char *gn__session_peer_addr(const gn_session *s) {
  return s->peer_addr;
}
const uint8_t *gn__session_handshake_hash(const gn_session *s) {
  return s->hash;
}
int gn__session_error(const gn_session *s) {
  return s->error;
}
uint64_t gn__session_peer_version(const gn_session *s) {
  return s->peer_version;
}
