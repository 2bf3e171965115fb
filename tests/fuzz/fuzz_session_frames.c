/* libFuzzer target: two sessions up in memory; the input is a program of
 * operations on them (messages of any size, keepalives, partial and
 * corrupted deliveries, time passing and ticks), so the receiver's framing,
 * message reassembly, buffer growth and trimming, keepalives and its idle and
 * message deadlines all run on valid ciphertext as well as broken. Checks
 * what the receiver holds never passes its message limit plus a small slack,
 * that every message it hands over is byte for byte a prefix of what was
 * sent (all sends take the start of one patterned body), and that a closed
 * session stays closed. */
#include <gpunet/identity.h>

#include <stdlib.h>

#include "../../p2p/session.h"

#define MAX_MSG (1u << 20)

static uint8_t *body;

static void fixed_rng(void *ud, uint8_t *out, size_t len) {
  uint64_t *s = ud;
  for (size_t i = 0; i < len; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = (uint8_t)(*s >> 56);
  }
}

/* Feeds n bytes to s; false once it failed. */
static bool feed(gn_session *s, const uint8_t *p, size_t n) {
  size_t pos = 0;
  while (pos < n) {
    size_t used = 0;
    gn_session_event ev;
    int r = gn__session_feed(s, p + pos, n - pos, &used, &ev);
    if (r < 0)
      return false;
    pos += used;
    if (r == 1 && ev.kind == GN_SESSION_EV_MESSAGE &&
        (ev.msg_len == 0 || ev.msg_len > MAX_MSG || memcmp(ev.msg, body, ev.msg_len) != 0))
      abort();
    if (r == 1)
      gn__session_trim(s);
  }
  return true;
}

static bool pump(gn_session *from, gn_session *to) {
  gn_buf out = {0};
  bool ok = gn__session_take_output(from, &out) == 0 && feed(to, out.data, out.len);
  gn_buf_done(&out);
  return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static gn_identity *ia, *ib;
  if ((!ia && gn_identity_generate(&ia) < 0) || (!ib && gn_identity_generate(&ib) < 0))
    return 0;
  if (!body) {
    if (!(body = malloc(2 * MAX_MSG))) /* sends go up to 1.1 MB */
      return 0;
    for (size_t k = 0; k < 2 * MAX_MSG; k++)
      body[k] = (uint8_t)(k * 31 + (k >> 9));
  }
  uint64_t sa = 1, sb = 2, now = 1000;
  gn_session_cfg ca = {.initiator = true, .id = ia, .rng = fixed_rng, .rng_ud = &sa, .now_ms = now};
  gn_session_cfg cb = {.initiator = false,
                       .id = ib,
                       .rng = fixed_rng,
                       .rng_ud = &sb,
                       .now_ms = now,
                       .max_msg = MAX_MSG,
                       .idle_timeout_ms = 5000,
                       .msg_timeout_ms = 2000,
                       .msg_min_rate_bps = 100000};
  gn_session *a = NULL, *b = NULL;
  gn_buf pending = {0};
  if (gn__session_new(&ca, &a) < 0 || gn__session_new(&cb, &b) < 0 || gn__session_start(a) < 0)
    goto out;
  for (int i = 0; i < 4 && !gn__session_is_up(b); i++)
    if (!pump(a, b) || !pump(b, a))
      goto out;
  if (!gn__session_is_up(a) || !gn__session_is_up(b))
    abort(); /* an honest handshake in memory always completes */
  size_t i = 0;
  while (i + 3 <= size) {
    uint8_t op = data[i] % 6;
    size_t arg = (size_t)data[i + 1] << 8 | data[i + 2];
    i += 3;
    switch (op) {
    case 0: /* a message of arg * 17 bytes (up to about 1.1 MB: some too big) */
      (void)gn__session_send(a, body, arg * 17 ? arg * 17 : 1);
      break;
    case 1:
      (void)gn__session_keepalive(a);
      break;
    case 2: /* deliver arg bytes of a's output */
      if (gn__session_take_output(a, &pending) < 0)
        goto out;
      if (arg > pending.len)
        arg = pending.len;
      if (!feed(b, pending.data, arg))
        goto closed;
      if (arg) {
        memmove(pending.data, pending.data + arg, pending.len - arg);
        pending.len -= arg;
      }
      break;
    case 3: /* corrupt one pending byte */
      if (pending.len)
        pending.data[arg % pending.len] ^= 0x5a;
      break;
    case 4: /* time passes */
      now += arg;
      if (gn__session_tick(b, now) < 0)
        goto closed;
      break;
    case 5: /* drop what is pending (a lost tail: the stream is broken after it) */
      pending.len = 0;
      break;
    }
    if (gn__session_mem(b) > MAX_MSG + 65536)
      abort();
  }
  goto out;
closed:
  if (!gn__session_is_closed(b) || gn__session_tick(b, now + 1) != GN_ECLOSED)
    abort();
out:
  gn_buf_done(&pending);
  gn__session_free(a);
  gn__session_free(b);
  return 0;
}
