/* libFuzzer target: the round-trip messages' decoders (node/peer_rtt.c,
 * docs/protocol.md §2.14) on arbitrary bytes. The first byte picks the
 * message: RTT_ASK, RTT_REPORT, or RTT_PING/RTT_PONG (one body). What
 * decodes is bounded, and encodes and decodes again to the same. */
#include "node_internal.h"
#include "peer_rtt.h"

static void take(gn_wire_writer *w, gn_buf *b) {
  if (gn_wire_writer_take(w, b) != 0)
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t which = data[0] % 3;
  data++;
  size--;
  gn_wire_writer w;
  gn_buf b = {0};
  gn_wire_writer_init(&w);
  if (which == 0) {
    gn_rtt_ask a, a2;
    int r = gn__rtt_ask_decode(data, size, &a);
    if (r == 0) {
      if (a.count > GN_RTT_MAX_TARGETS)
        __builtin_trap();
      if (gn__rtt_ask_encode(&a, &w) != 0)
        __builtin_trap();
      take(&w, &b);
      if (gn__rtt_ask_decode(b.data, b.len, &a2) != 0 || a2.count != a.count ||
          memcmp(a2.nonce, a.nonce, sizeof a.nonce) != 0 ||
          memcmp(a2.targets, a.targets, a.count * sizeof a.targets[0]) != 0)
        __builtin_trap();
    } else if (r == GN_ETOOBIG && a.count != 0) {
      __builtin_trap(); /* refused by nonce, nothing else */
    }
  } else if (which == 1) {
    gn_rtt_report rep, rep2;
    if (gn__rtt_report_decode(data, size, &rep) == 0) {
      if (rep.count > GN_RTT_MAX_TARGETS || (rep.error[0] && rep.count) || !memchr(rep.error, 0, sizeof rep.error))
        __builtin_trap();
      for (size_t i = 0; i < rep.count; i++) {
        const gn_rtt_result *res = &rep.results[i];
        /* measured within bounds, or an error; never both, never neither */
        if (res->rtt_us > GN_RTT_MAX_US || (res->rtt_us != 0) == (res->error[0] != 0) ||
            !memchr(res->error, 0, sizeof res->error))
          __builtin_trap();
      }
      if (gn__rtt_report_encode(&rep, &w) != 0)
        __builtin_trap();
      take(&w, &b);
      if (gn__rtt_report_decode(b.data, b.len, &rep2) != 0 || rep2.count != rep.count ||
          strcmp(rep2.error, rep.error) != 0)
        __builtin_trap();
      for (size_t i = 0; i < rep.count; i++)
        if (rep2.results[i].rtt_us != rep.results[i].rtt_us ||
            strcmp(rep2.results[i].error, rep.results[i].error) != 0 ||
            memcmp(rep2.results[i].id, rep.results[i].id, GN_PK_LEN) != 0)
          __builtin_trap();
    }
  } else {
    uint8_t nonce[GN_RTT_NONCE_LEN], again[GN_RTT_NONCE_LEN];
    if (gn__rtt_ping_decode(data, size, nonce) == 0) {
      if (gn__rtt_ping_encode(nonce, &w) != 0)
        __builtin_trap();
      take(&w, &b);
      if (gn__rtt_ping_decode(b.data, b.len, again) != 0 || memcmp(nonce, again, sizeof nonce) != 0)
        __builtin_trap();
    }
  }
  gn_buf_done(&b);
  gn_wire_writer_done(&w);
  return 0;
}
