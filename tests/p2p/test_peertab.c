/* Tests for the one peer table: its bound and eviction policy, dial
 * back-off, and which sessions it says nobody needs, all with injected
 * time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/peertab.h>

#include <stdio.h>
#include <string.h>

static void id_of(uint32_t k, uint8_t id[GN_PK_LEN]) {
  memset(id, 0, GN_PK_LEN);
  memcpy(id, &k, sizeof(k));
  id[31] = 0xA5;
}

static void addr_of(uint32_t k, char *out, size_t cap) {
  snprintf(out, cap, "10.%u.%u.%u:7946", (k >> 16) & 255, (k >> 8) & 255, k & 255);
}

static gn_peertab *make(size_t cap) {
  gn_peertab_config c;
  gn_peertab_config_default(&c);
  c.cap = cap;
  gn_peertab *pt = NULL;
  assert_int_equal(gn_peertab_new(&c, &pt), 0);
  return pt;
}

static void verified(gn_peertab *pt, uint32_t k, uint64_t now) {
  uint8_t id[GN_PK_LEN];
  char a[64];
  id_of(k, id);
  addr_of(k, a, sizeof(a));
  assert_int_equal(gn_peertab_session_up(pt, id, a, false, now), 0);
  gn_peertab_session_down(pt, id, now);
}

static int heard(gn_peertab *pt, uint32_t k, uint64_t now) {
  uint8_t id[GN_PK_LEN];
  char a[64];
  id_of(k, id);
  addr_of(k, a, sizeof(a));
  return gn_peertab_heard(pt, id, a, GN_PEER_HEARSAY, now);
}

static bool has(const gn_peertab *pt, uint32_t k) {
  uint8_t id[GN_PK_LEN];
  id_of(k, id);
  return gn_peertab_find(pt, id) != NULL;
}

static void test_peertab_config_checked(void **state) {
  (void)state;
  gn_peertab_config c;
  gn_peertab *pt = NULL;
  gn_peertab_config_default(&c);
  c.cap = 0;
  assert_int_equal(gn_peertab_new(&c, &pt), GN_EINVAL);
  c.cap = GN_PEERTAB_CAP_MAX + 1;
  assert_int_equal(gn_peertab_new(&c, &pt), GN_EINVAL);
  gn_peertab_config_default(&c);
  c.grace_ms = 0;
  assert_int_equal(gn_peertab_new(&c, &pt), GN_EINVAL);
  assert_null(pt);
  assert_int_equal(gn_peertab_new(NULL, &pt), 0);
  uint8_t id[GN_PK_LEN];
  id_of(1, id);
  char longaddr[100];
  memset(longaddr, '1', sizeof(longaddr) - 1);
  longaddr[99] = 0;
  assert_int_equal(gn_peertab_heard(pt, id, longaddr, GN_PEER_HEARSAY, 0), GN_EINVAL);
  assert_int_equal(gn_peertab_heard(pt, id, "1.2.3.4:5", GN_PEER_INBOUND, 0), GN_EINVAL);
  assert_int_equal(gn_peertab_count(pt), 0);
  gn_peertab_free(pt);
}

/* A flood of names from strangers fills only the places hearsay may take:
 * every peer we had a verified session with stays. */
static void test_peertab_hearsay_never_evicts_verified(void **state) {
  (void)state;
  gn_peertab *pt = make(64);
  for (uint32_t k = 0; k < 16; k++)
    verified(pt, k, 1000 + k);
  int refused = 0;
  for (uint32_t k = 1000; k < 11000; k++)
    refused += heard(pt, k, 5000 + k) == GN_EBUSY;
  assert_int_equal(gn_peertab_count(pt), 64);
  assert_int_equal(refused, 0); /* hearsay made room among hearsay */
  for (uint32_t k = 0; k < 16; k++)
    assert_true(has(pt, k));
  /* The newest hearsay survives, the oldest was pushed out. */
  assert_true(has(pt, 10999));
  assert_false(has(pt, 1000));
  /* A table of verified peers only refuses hearsay outright. */
  gn_peertab *full = make(8);
  for (uint32_t k = 0; k < 8; k++)
    verified(full, k, k);
  assert_int_equal(heard(full, 99, 100), GN_EBUSY);
  for (uint32_t k = 0; k < 8; k++)
    assert_true(has(full, k));
  gn_peertab_free(full);
  gn_peertab_free(pt);
}

/* A session always gets a place (its key is proven): it evicts the least
 * recently seen entry without a session, hearsay first. */
static void test_peertab_session_takes_place_by_policy(void **state) {
  (void)state;
  gn_peertab *pt = make(4);
  verified(pt, 1, 10);
  verified(pt, 2, 20);
  assert_int_equal(heard(pt, 3, 30), 1);
  assert_int_equal(heard(pt, 4, 40), 1);
  uint8_t id[GN_PK_LEN];
  id_of(5, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "10.0.0.5:7946", true, 50), 0);
  assert_false(has(pt, 3)); /* the oldest hearsay */
  id_of(6, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "", true, 60), 0);
  assert_false(has(pt, 4));
  id_of(7, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "", false, 70), 0);
  assert_false(has(pt, 1)); /* no hearsay left: the least recently seen verified */
  assert_true(has(pt, 2));
  /* Every place holds a session now: nothing is evicted for a newcomer. */
  id_of(2, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "", false, 80), 0);
  id_of(8, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "", false, 90), GN_EBUSY);
  assert_int_equal(gn_peertab_up_count(pt), 4);
  gn_peertab_free(pt);
}

/* A name heard from someone never moves a known peer to another address. */
static void test_peertab_hearsay_does_not_move_known_peer(void **state) {
  (void)state;
  gn_peertab *pt = make(8);
  verified(pt, 1, 10);
  uint8_t id[GN_PK_LEN];
  id_of(1, id);
  assert_int_equal(gn_peertab_heard(pt, id, "6.6.6.6:1", GN_PEER_HEARSAY, 20), 0);
  const gn_peertab_entry *e = gn_peertab_find(pt, id);
  assert_string_equal(e->addr, "10.0.0.1:7946");
  assert_true(e->verified);
  assert_int_equal(e->source, GN_PEER_DIALLED);
  gn_peertab_free(pt);
}

static size_t closable(const gn_peertab *pt, uint64_t now) {
  uint8_t ids[8][GN_PK_LEN];
  return gn_peertab_to_close(pt, now, ids, 8);
}

/* A session the views dropped is closed once it was unwanted for the
 * grace (30 s), not before. */
static void test_peertab_unwanted_session_closed_after_grace(void **state) {
  (void)state;
  gn_peertab *pt = make(8);
  uint8_t id[GN_PK_LEN];
  id_of(1, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "10.0.0.1:7946", false, 0), 0);
  gn_peertab_set_wanted(pt, id, true, 1000);
  assert_int_equal(closable(pt, 100000), 0); /* wanted: never */
  gn_peertab_set_wanted(pt, id, false, 100000);
  assert_int_equal(closable(pt, 129999), 0);
  uint8_t ids[1][GN_PK_LEN];
  assert_int_equal(gn_peertab_to_close(pt, 130000, ids, 1), 1);
  assert_memory_equal(ids[0], id, GN_PK_LEN);
  /* Wanted again within the grace: kept, and a later drop starts anew. */
  gn_peertab_set_wanted(pt, id, true, 130001);
  gn_peertab_set_wanted(pt, id, false, 140000);
  assert_int_equal(closable(pt, 169999), 0);
  assert_int_equal(closable(pt, 170000), 1);
  gn_peertab_free(pt);
}

/* A session the views released (DISCONNECT, a SHUFFLE_REPLY dial) closes
 * after release_ms, unless it is wanted again or in use; a release with no
 * session up is ignored. */
static void test_peertab_released_session_closes_sooner(void **state) {
  (void)state;
  gn_peertab *pt = make(8);
  uint8_t a[GN_PK_LEN], b[GN_PK_LEN], c[GN_PK_LEN];
  id_of(1, a);
  id_of(2, b);
  id_of(3, c);
  assert_int_equal(gn_peertab_session_up(pt, a, "", false, 0), 0);
  assert_int_equal(gn_peertab_session_up(pt, b, "", false, 0), 0);
  assert_int_equal(gn_peertab_session_up(pt, c, "", false, 0), 0);
  gn_peertab_set_wanted(pt, a, true, 0);
  gn_peertab_release(pt, a, 1000);
  gn_peertab_release(pt, b, 1000);
  gn_peertab_release(pt, c, 1000);
  gn_peertab_mark_busy(pt, b, 1000);        /* b carries a lease */
  gn_peertab_set_wanted(pt, c, true, 3000); /* c wanted again */
  assert_int_equal(closable(pt, 5999), 0);
  uint8_t ids[4][GN_PK_LEN];
  assert_int_equal(gn_peertab_to_close(pt, 6000, ids, 4), 1);
  assert_memory_equal(ids[0], a, GN_PK_LEN);
  gn_peertab_session_down(pt, a, 6000);
  gn_peertab_release(pt, a, 6000); /* no session: nothing */
  assert_int_equal(gn_peertab_session_up(pt, a, "", true, 7000), 0);
  assert_int_equal(closable(pt, 12000), 0); /* a new session starts with the full grace */
  gn_peertab_free(pt);
}

/* A session that carries a lease is found busy every second by the daemon:
 * it is never closed while that lasts, and only a grace after it ends. */
static void test_peertab_busy_session_never_closed_mid_lease(void **state) {
  (void)state;
  gn_peertab *pt = make(8);
  uint8_t id[GN_PK_LEN];
  id_of(1, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "", true, 0), 0);
  for (uint64_t t = 0; t <= 3600000; t += 1000) {
    gn_peertab_mark_busy(pt, id, t);
    assert_int_equal(closable(pt, t), 0);
  }
  assert_int_equal(closable(pt, 3629999), 0);
  assert_int_equal(closable(pt, 3630000), 1);
  gn_peertab_free(pt);
}

/* A stranger that dialled us (joining, or about to lease) has the grace to
 * say why; idle and unwanted after it, it is closed. */
static void test_peertab_inbound_stranger_kept_through_grace(void **state) {
  (void)state;
  gn_peertab *pt = make(8);
  uint8_t id[GN_PK_LEN];
  id_of(1, id);
  assert_int_equal(gn_peertab_session_up(pt, id, "", true, 5000), 0);
  assert_int_equal(closable(pt, 34999), 0);
  assert_int_equal(closable(pt, 35000), 1);
  gn_peertab_free(pt);
}

/* A peer that dials again each time it is dropped gets one grace per
 * session, holds one entry, and is closed again each time. */
static void test_peertab_reconnecting_peer_gets_one_grace_per_session(void **state) {
  (void)state;
  gn_peertab *pt = make(8);
  uint8_t id[GN_PK_LEN];
  id_of(1, id);
  uint64_t t = 0;
  for (int round = 0; round < 100; round++) {
    assert_int_equal(gn_peertab_session_up(pt, id, "", true, t), 0);
    assert_int_equal(closable(pt, t + 29999), 0);
    assert_int_equal(closable(pt, t + 30000), 1);
    gn_peertab_session_down(pt, id, t + 30000);
    assert_int_equal(closable(pt, t + 30000), 0);
    t += 30100;
  }
  assert_int_equal(gn_peertab_count(pt), 1);
  gn_peertab_free(pt);
}

static void test_peertab_dial_backoff_doubles_and_caps(void **state) {
  (void)state;
  gn_peertab *pt = make(8);
  uint8_t id[GN_PK_LEN];
  id_of(1, id);
  assert_int_equal(heard(pt, 1, 0), 1);
  assert_false(gn_peertab_backed_off(pt, id, 0));
  gn_peertab_dial_failed(pt, id, 0);
  assert_true(gn_peertab_backed_off(pt, id, 1999));
  assert_false(gn_peertab_backed_off(pt, id, 2000));
  gn_peertab_dial_failed(pt, id, 2000);
  assert_true(gn_peertab_backed_off(pt, id, 5999));
  assert_false(gn_peertab_backed_off(pt, id, 6000));
  for (int i = 0; i < 40; i++)
    gn_peertab_dial_failed(pt, id, 10000);
  assert_true(gn_peertab_backed_off(pt, id, 309999));
  assert_false(gn_peertab_backed_off(pt, id, 310000));
  /* A session clears it. */
  assert_int_equal(gn_peertab_session_up(pt, id, "", false, 20000), 0);
  assert_false(gn_peertab_backed_off(pt, id, 20000));
  gn_peertab_free(pt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_peertab_config_checked),
      cmocka_unit_test(test_peertab_hearsay_never_evicts_verified),
      cmocka_unit_test(test_peertab_session_takes_place_by_policy),
      cmocka_unit_test(test_peertab_hearsay_does_not_move_known_peer),
      cmocka_unit_test(test_peertab_unwanted_session_closed_after_grace),
      cmocka_unit_test(test_peertab_released_session_closes_sooner),
      cmocka_unit_test(test_peertab_busy_session_never_closed_mid_lease),
      cmocka_unit_test(test_peertab_inbound_stranger_kept_through_grace),
      cmocka_unit_test(test_peertab_reconnecting_peer_gets_one_grace_per_session),
      cmocka_unit_test(test_peertab_dial_backoff_doubles_and_caps),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
