/* One forwarded stream, the same at both ends: a TCP socket (the renter's
 * local connection, or the socket inside the sandbox) joined to FWD_DATA,
 * FWD_CREDIT and FWD_CLOSE on the lease's session. The socket is read only
 * while the peer has room (the window) and the pace allows; received bytes
 * are credited back only once the socket took them, so neither end holds
 * more than a window of one stream. */
#include "fwd.h"
#include "node_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct wreq {
  uv_write_t req;
  gn__fwd_stream *s;
  size_t len;
  uint8_t data[];
} wreq;

static uint64_t now_ms(const gn__fwd *f) {
  return uv_now(f->n->loop);
}

int gn__fwd_send(gn__fwd *f, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *w) {
  /* Charged whether or not a token is left: the pace is what makes a
   * stream stop reading, and a credit or close is never held back. */
  (void)gn_token_bucket_take(&f->pace, GN_FWD_PACE, 1, now_ms(f));
  return gn__node_send(f->n, peer, type, w);
}

static bool pace_ok(gn__fwd *f) {
  return gn_token_bucket_level(&f->pace, GN_FWD_PACE, now_ms(f)) >= 1;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Reads when there is somewhere to put the bytes: connected, not at EOF,
 * window left and the pace allowing. */
static void update_reading(gn__fwd_stream *s) {
  if (s->closing)
    return;
  bool room = s->connected && !s->local_eof && s->win.send_left > 0;
  bool pace = room && pace_ok(s->f);
  if (room && !pace && !s->paced) {
    s->paced = true;
    s->f->paced++;
    gn__fwd_pace_wait(s->f);
  } else if ((!room || pace) && s->paced) {
    s->paced = false;
    s->f->paced--;
  }
  bool want = room && pace;
  if (want && !s->reading) {
    if (uv_read_start((uv_stream_t *)&s->tcp, on_alloc, on_read) == 0)
      s->reading = true;
  } else if (!want && s->reading) {
    uv_read_stop((uv_stream_t *)&s->tcp);
    s->reading = false;
  }
}

void gn__fwd_handle_closed(uv_handle_t *h) {
  gn__fwd_stream *s = h->data;
  if (--s->handles == 0)
    free(s);
}

static void unlink_stream(gn__fwd_stream *s) {
  gn__fwd *f = s->f;
  for (gn__fwd_stream **p = &f->streams; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      f->nstreams--;
      break;
    }
  if (s->paced) {
    s->paced = false;
    f->paced--;
  }
}

/* Off the list and its handles closing; freed when the last one is closed. */
static void stream_end(gn__fwd_stream *s) {
  if (s->closing)
    return;
  s->closing = true;
  unlink_stream(s);
  if (s->timer_open) {
    s->timer_open = false;
    uv_close((uv_handle_t *)&s->connect_timer, gn__fwd_handle_closed);
  }
  if (!uv_is_closing((uv_handle_t *)&s->tcp))
    uv_close((uv_handle_t *)&s->tcp, gn__fwd_handle_closed);
}

static void send_close(gn__fwd_stream *s, bool reset, const char *reason) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__fwd_close_encode(&w, s->id, s->opener, reset, reason);
  gn__fwd_send(s->f, s->peer, GN_MSG_FWD_CLOSE, &w);
  gn_wire_writer_done(&w);
}

void gn__fwd_stream_reset(gn__fwd_stream *s, bool tell, const char *reason) {
  if (s->closing)
    return;
  if (tell)
    send_close(s, true, reason);
  stream_end(s);
}

/* Both ways are shut: the stream is over without a reset. */
static void maybe_done(gn__fwd_stream *s) {
  if (!s->closing && s->local_eof && s->peer_fin && s->shut && s->writes == 0)
    stream_end(s);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  gn__fwd_stream *s = req->data;
  free(req);
  maybe_done(s);
}

static void shut_if_written(gn__fwd_stream *s) {
  if (s->closing || !s->peer_fin || s->shut || s->writes > 0 || !s->connected)
    return;
  s->shut = true;
  uv_shutdown_t *req = malloc(sizeof *req);
  if (!req) {
    gn__fwd_stream_reset(s, true, "out of memory");
    return;
  }
  req->data = s;
  if (uv_shutdown(req, (uv_stream_t *)&s->tcp, on_shutdown) < 0) {
    free(req);
    maybe_done(s);
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  gn__fwd_stream *s = h->data;
  size_t n = s->win.send_left < GN_FWD_CHUNK ? (size_t)s->win.send_left : GN_FWD_CHUNK;
  buf->base = n ? malloc(n) : NULL;
  buf->len = buf->base ? n : 0;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  gn__fwd_stream *s = st->data;
  if (nread > 0 && !s->closing && gn__fwd_win_sent(&s->win, (size_t)nread) == 0) {
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn__fwd_data_encode(&w, s->id, s->opener, (const uint8_t *)buf->base, (size_t)nread);
    gn__fwd_send(s->f, s->peer, GN_MSG_FWD_DATA, &w);
    gn_wire_writer_done(&w);
    if (s->opener) {
      s->f->bytes_out += (uint64_t)nread;
      gn__fwd_req_count(s, 0, (uint64_t)nread);
    } else {
      s->f->bytes_in += (uint64_t)nread;
    }
    update_reading(s);
  } else if (nread == UV_EOF) {
    uv_read_stop(st);
    s->reading = false;
    s->local_eof = true;
    send_close(s, false, "");
    update_reading(s);
    maybe_done(s);
  } else if (nread == UV_ENOBUFS) {
    update_reading(s); /* no window left: it waits for a credit */
  } else if (nread < 0) {
    char why[96];
    gn__strf(why, sizeof why, "the connection failed: %s", uv_strerror((int)nread));
    gn__fwd_stream_reset(s, true, why);
  }
  free(buf->base);
}

static void on_written(uv_write_t *req, int status) {
  wreq *wr = (wreq *)req;
  gn__fwd_stream *s = wr->s;
  size_t len = wr->len;
  free(wr);
  s->writes--;
  s->write_bytes -= len;
  if (s->closing) {
    return;
  }
  if (status < 0) {
    char why[96];
    gn__strf(why, sizeof why, "cannot write to the connection: %s", uv_strerror(status));
    gn__fwd_stream_reset(s, true, why);
    return;
  }
  uint32_t credit = gn__fwd_win_delivered(&s->win, len);
  if (credit) {
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn__fwd_credit_encode(&w, s->id, s->opener, credit);
    gn__fwd_send(s->f, s->peer, GN_MSG_FWD_CREDIT, &w);
    gn_wire_writer_done(&w);
  }
  shut_if_written(s);
  maybe_done(s);
}

static void on_data(gn__fwd_stream *s, const uint8_t *data, size_t len) {
  if (s->peer_fin) {
    gn__fwd_stream_reset(s, true, "data after the end of the stream");
    return;
  }
  if (gn__fwd_win_recv(&s->win, len) < 0) {
    gn__fwd_stream_reset(s, true, "data past the window");
    return;
  }
  wreq *wr = malloc(sizeof *wr + len);
  if (!wr) {
    gn__fwd_stream_reset(s, true, "out of memory");
    return;
  }
  wr->s = s;
  wr->len = len;
  memcpy(wr->data, data, len);
  uv_buf_t b = uv_buf_init((char *)wr->data, (unsigned)len);
  /* A socket still connecting queues the write until it is up. */
  if (uv_write(&wr->req, (uv_stream_t *)&s->tcp, &b, 1, on_written) < 0) {
    free(wr);
    gn__fwd_stream_reset(s, true, "cannot write to the connection");
    return;
  }
  s->writes++;
  s->write_bytes += len;
  if (s->opener)
    gn__fwd_req_count(s, len, 0);
  if (s->opener)
    s->f->bytes_in += len;
  else
    s->f->bytes_out += len;
}

void gn__fwd_stream_on_msg(gn__fwd_stream *s, uint32_t type, const gn_fwdmsg *m) {
  switch (type) {
  case GN_MSG_FWD_DATA:
    on_data(s, m->data, m->data_len);
    break;
  case GN_MSG_FWD_CREDIT:
    if (gn__fwd_win_credit(&s->win, m->credit) < 0)
      gn__fwd_stream_reset(s, true, "credit past the window");
    else
      update_reading(s);
    break;
  case GN_MSG_FWD_CLOSE:
    if (m->reset) {
      if (s->opener)
        gn__fwd_req_on_open_refused(s, m->reason);
      gn__fwd_stream_reset(s, false, m->reason);
    } else {
      s->peer_fin = true;
      shut_if_written(s);
      maybe_done(s);
    }
    break;
  default:
    break;
  }
}

gn__fwd_stream *gn__fwd_stream_new(gn__fwd *f, const uint8_t peer[GN_PK_LEN], uint32_t id, bool opener) {
  gn__fwd_stream *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->f = f;
  memcpy(s->peer, peer, GN_PK_LEN);
  s->id = id;
  s->opener = opener;
  gn__fwd_win_init(&s->win);
  if (uv_tcp_init(f->n->loop, &s->tcp) < 0) {
    free(s);
    return NULL;
  }
  s->tcp.data = s;
  s->handles = 1;
  s->next = f->streams;
  f->streams = s;
  f->nstreams++;
  return s;
}

gn__fwd_stream *gn__fwd_stream_find(gn__fwd *f, const uint8_t peer[GN_PK_LEN], uint32_t id, bool opener) {
  for (gn__fwd_stream *s = f->streams; s; s = s->next)
    if (s->id == id && s->opener == opener && memcmp(s->peer, peer, GN_PK_LEN) == 0)
      return s;
  return NULL;
}

void gn__fwd_stream_connected(gn__fwd_stream *s) {
  s->connected = true;
  update_reading(s);
  shut_if_written(s);
}

void gn__fwd_stream_unpace(gn__fwd *f) {
  if (!f->paced)
    return;
  for (gn__fwd_stream *s = f->streams; s; s = s->next)
    if (s->paced)
      update_reading(s);
}

size_t gn__fwd_streams_of_lease(const gn__fwd *f, const char *lease_id) {
  size_t k = 0;
  for (const gn__fwd_stream *s = f->streams; s; s = s->next)
    if (strcmp(s->lease_id, lease_id) == 0)
      k++;
  return k;
}
