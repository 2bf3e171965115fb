/* The per-second meter of one lease: pure arithmetic on the caller's
 * monotonic clock, so it runs the same on the real loop and in a simulator. */
#include "billing_int.h"

void gn_meter_start(gn_meter *m, uint64_t now_mono_ms, uint64_t max_s) {
  m->start_mono_ms = now_mono_ms;
  m->ticks_done = 0;
  m->max_s = max_s;
}

/* Whole seconds elapsed since the start, capped at max_s: the number of ticks
 * that should exist by now. Computed from the start rather than by counting
 * timer firings, so late or coalesced timers never lose or add a second. */
static uint64_t meter_target(const gn_meter *m, uint64_t now_mono_ms) {
  if (now_mono_ms <= m->start_mono_ms)
    return 0;
  uint64_t s = (now_mono_ms - m->start_mono_ms) / 1000u;
  return s < m->max_s ? s : m->max_s;
}

uint64_t gn_meter_due(const gn_meter *m, uint64_t now_mono_ms) {
  uint64_t target = meter_target(m, now_mono_ms);
  return target > m->ticks_done ? target - m->ticks_done : 0;
}

void gn_meter_advance(gn_meter *m, uint64_t n) {
  /* Never count past the cap, whatever the caller claims to have written. */
  uint64_t room = m->max_s > m->ticks_done ? m->max_s - m->ticks_done : 0;
  m->ticks_done += n < room ? n : room;
}

uint64_t gn_meter_next_ms(const gn_meter *m, uint64_t now_mono_ms) {
  if (gn_meter_finished(m))
    return UINT64_MAX; /* nothing more will ever be due */
  if (gn_meter_due(m, now_mono_ms) > 0)
    return 0;
  /* The next tick is ticks_done + 1 seconds after the start. */
  uint64_t at = m->start_mono_ms + (m->ticks_done + 1) * 1000u;
  return at > now_mono_ms ? at - now_mono_ms : 0;
}

bool gn_meter_finished(const gn_meter *m) {
  return m->ticks_done >= m->max_s;
}
