/* libFuzzer target: the partial views' message handling (types 76-82) on
 * arbitrary bodies. The first byte picks the message type and whether the
 * sender is an active member first (so FORWARD_JOIN and SHUFFLE reach their
 * decoders); the rest is the body. A SHUFFLE is started first, so a
 * SHUFFLE_REPLY can match it when the fuzzer finds the nonce. The io checks
 * that the views never hand out an unbounded body or a bad address. */
#include <gpunet/views.h>
#include <gpunet/wire.h>

static int io_send(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  (void)ud;
  (void)peer;
  if (type < GN_MSG_VIEW_JOIN || type > GN_MSG_VIEW_SHUFFLE_REPLY || len > GN_VIEWS_BODY_MAX || (len && !body))
    __builtin_trap();
  return 0;
}

static void io_connect(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr) {
  (void)ud;
  (void)peer;
  if (!gn_views_addr_valid(addr))
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t self[GN_PK_LEN], peer[GN_PK_LEN], other[GN_PK_LEN];
  memset(self, 1, sizeof(self));
  memset(peer, 2, sizeof(peer));
  memset(other, 3, sizeof(other));
  gn_views_io io = {io_send, io_connect, NULL, NULL, NULL};
  gn_views *v = NULL;
  if (gn_views_new(self, "10.0.0.1:7000", NULL, &io, 7, 1000, &v) < 0)
    __builtin_trap();
  uint32_t type = GN_MSG_VIEW_JOIN + (data[0] & 7) % 7;
  if (data[0] & 8) {
    /* peer and other become active members through NEIGHBOR. */
    static const uint8_t nb2[] = {0x82, 0xa4, 'h', 'i', 'g', 'h', 0xc2, 0xa4, 'a', 'd', 'd', 'r', 0xad,
                                  '1',  '0',  '.', '0', '.', '0', '.',  '2',  ':', '7', '0', '0', '0'};
    static const uint8_t nb3[] = {0x82, 0xa4, 'h', 'i', 'g', 'h', 0xc2, 0xa4, 'a', 'd', 'd', 'r', 0xad,
                                  '1',  '0',  '.', '0', '.', '0', '.',  '3',  ':', '7', '0', '0', '0'};
    if (gn_views_on_message(v, peer, GN_MSG_VIEW_NEIGHBOR, nb2, sizeof(nb2), 1000) < 0 ||
        gn_views_on_message(v, other, GN_MSG_VIEW_NEIGHBOR, nb3, sizeof(nb3), 1000) < 0)
      __builtin_trap();
  }
  if (data[0] & 16)
    gn_views_tick(v, 20000); /* starts a SHUFFLE (needs an active member) */
  gn_views_on_message(v, peer, type, data + 1, size - 1, 20001);
  gn_views_tick(v, 40000);
  if (gn_views_active_count(v) > 6 || gn_views_passive_count(v) > 48 ||
      gn_views_pending_count(v) > GN_VIEWS_PENDING_MAX)
    __builtin_trap();
  gn_views_free(v);
  return 0;
}
