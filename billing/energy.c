/* The energy of a lease: its GPUs' power readings integrated once a second
 * on the caller's monotonic clock, the claim a final invoice states, and
 * the bound a reader judges such a claim by. Pure arithmetic, no I/O. */
#include "billing_int.h"

static uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

void gn_energy_start(gn_energy *e, uint64_t now_mono_ms) {
  e->last_ms = now_mono_ms;
  e->started = true;
}

void gn_energy_sample(gn_energy *e, uint64_t now_mono_ms, bool have, uint64_t power_mw) {
  if (!e->started) {
    gn_energy_start(e, now_mono_ms);
    return;
  }
  /* A clock that did not move (or, by a caller's mistake, went back)
   * counts nothing and keeps the later time. */
  if (now_mono_ms <= e->last_ms)
    return;
  const uint64_t dt = now_mono_ms - e->last_ms;
  e->last_ms = now_mono_ms;
  const uint64_t counted = dt < GN_ENERGY_CAP_MS ? dt : GN_ENERGY_CAP_MS;
  if (!have) {
    e->unmeasured_ms = sat_add(e->unmeasured_ms, dt);
    return;
  }
  /* mW x ms = uJ. power_mw is a sum of 32-bit readings over at most
   * GN_LEASE_MAX_GPUS GPUs, counted at most 2000: the product fits, but a
   * caller passing more is saturated rather than wrapped. */
  const unsigned __int128 uj = (unsigned __int128)power_mw * counted;
  e->uj = uj > UINT64_MAX ? UINT64_MAX : sat_add(e->uj, (uint64_t)uj);
  e->measured_ms = sat_add(e->measured_ms, counted);
  e->unmeasured_ms = sat_add(e->unmeasured_ms, dt - counted);
}

uint64_t gn_energy_mj(const gn_energy *e) {
  return e->uj / 1000u;
}

uint64_t gn_energy_measured_s(const gn_energy *e) {
  return e->measured_ms / 1000u;
}

gn_bill_energy gn_energy_claim(const gn_energy *e) {
  gn_bill_energy c = {false, 0, 0};
  if (e && gn_energy_measured_s(e) >= 1) {
    c.present = true;
    c.mj = gn_energy_mj(e);
    c.measured_s = gn_energy_measured_s(e);
  }
  return c;
}

bool gn_energy_plausible(uint32_t gpus, uint64_t window_s, const gn_bill_energy *claim) {
  if (!claim || !claim->present)
    return true;
  const unsigned __int128 window = (unsigned __int128)window_s + gn_bill_tolerance_s(window_s);
  if (claim->measured_s == 0 || claim->measured_s > window)
    return false;
  /* The measured seconds are whole seconds rounded down: one more is the
   * slack for the fraction left out. */
  const unsigned __int128 max_mj =
      (unsigned __int128)gpus * GN_ENERGY_MAX_GPU_W * 1000u * ((unsigned __int128)claim->measured_s + 1u);
  return claim->mj <= max_mj;
}
