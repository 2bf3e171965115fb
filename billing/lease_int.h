/* Internal helpers shared by the two lease machines (billing/lease_prov.c,
 * billing/lease_req.c): building the action list and the persisted state. */
#ifndef GPUNET_LEASE_INT_H
#define GPUNET_LEASE_INT_H

#include <gpunet/billing.h>
#include <gpunet/lease.h>
#include <gpunet/wire.h>

#define GN__LEASE_STATE_VERSION 1

/* Appends an action (kind) to out and returns it, or NULL when out is full
 * (a programming error: no call emits more than GN_LEASE_MAX_ACTIONS). */
gn_lease_action *gn__lease_act(gn_lease_out *out, int kind);
/* Copies bytes into out's storage and points the action's data (second:
 * false) or data2 (true) at them. GN_ENOMEM. */
int gn__lease_act_bytes(gn_lease_out *out, gn_lease_action *a, bool second, const uint8_t *p, size_t n);
/* Resets out for a new call (keeps its buffers' memory). */
void gn__lease_out_reset(gn_lease_out *out);
/* Lowers out->timer_at_ms to at if it is earlier. */
static inline void gn__lease_timer(gn_lease_out *out, uint64_t at) {
  if (at < out->timer_at_ms)
    out->timer_at_ms = at;
}

/* The resend interval of a lease: interval_s / 4 in ms, clamped to
 * [GN_LEASE_RESEND_MIN_MS, GN_LEASE_RESEND_MAX_MS]. */
uint64_t gn__lease_resend_ms(uint32_t interval_s);

/* Copies s into a reason buffer of 256 (or cap) bytes, replacing bytes
 * outside printable ASCII so that a peer's text is safe to log. */
void gn__lease_reason(char *dst, size_t cap, const char *s);

/* Head encoding in the persisted state: bin of GN_BILL_HEAD_LEN bytes. */
void gn__lease_put_head(gn_wire_writer *w, const char *key, const gn_bill_head *h);
int gn__lease_get_head(const msgpack_object *map, const char *key, gn_bill_head *ret);

#endif
