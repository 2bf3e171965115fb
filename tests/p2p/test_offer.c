/* Tests for offers: the body codec, ids, the table's rules (newer replaces,
 * expiry, withdraw, bounds, signer checks) and the SQLite cache. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/offer.h>

#include <stdio.h>
#include <unistd.h>

#define NOW 1700000000

static gn_identity *prov, *other;

static int setup(void **state) {
  (void)state;
  return gn_identity_generate(&prov) || gn_identity_generate(&other);
}

static int teardown(void **state) {
  (void)state;
  prov = gn_identity_free(prov);
  other = gn_identity_free(other);
  return 0;
}

static gn_offer sample(uint64_t seq, const char *model) {
  gn_offer o;
  memset(&o, 0, sizeof(o));
  memcpy(o.provider, prov->pk, GN_PK_LEN);
  o.seq = seq;
  o.issued_s = NOW - 10;
  o.expires_s = NOW + 600;
  snprintf(o.addr, sizeof(o.addr), "10.0.0.1:7400");
  snprintf(o.gpu_model, sizeof(o.gpu_model), "%s", model);
  o.vram_mib = 24564;
  o.gpus_free = 1;
  o.gpus_total = 2;
  o.price_uper_hour = 450000;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  o.max_hours = 48;
  o.simulated = true;
  return o;
}

static void seal(const gn_identity *id, const gn_offer *o, gn_buf *env) {
  env->len = 0;
  assert_int_equal(gn_offer_seal(id, o, env), 0);
}

static void test_offer_encode_decode_roundtrip(void **state) {
  (void)state;
  gn_offer o = sample(7, "NVIDIA GeForce RTX 4090"), d;
  gn_buf b = {0};
  assert_int_equal(gn_offer_encode(&o, &b), 0);
  assert_int_equal(gn_offer_decode(b.data, b.len, &d), 0);
  assert_memory_equal(&o, &d, sizeof(o));
  gn_buf_done(&b);
}

static void test_offer_decode_rejects_bad_fields(void **state) {
  (void)state;
  gn_offer o;
  gn_buf b = {0};
  gn_offer d;
  /* inconsistent values: more free GPUs than exist, no lifetime, no model */
  o = sample(1, "m");
  o.gpus_free = 3;
  assert_int_equal(gn_offer_encode(&o, &b), 0);
  assert_int_equal(gn_offer_decode(b.data, b.len, &d), GN_EINVAL);
  b.len = 0;
  o = sample(1, "m");
  o.expires_s = o.issued_s;
  assert_int_equal(gn_offer_encode(&o, &b), 0);
  assert_int_equal(gn_offer_decode(b.data, b.len, &d), GN_EINVAL);
  b.len = 0;
  o = sample(1, "");
  assert_int_equal(gn_offer_encode(&o, &b), 0);
  assert_int_equal(gn_offer_decode(b.data, b.len, &d), GN_EINVAL);
  b.len = 0;

  /* wrong types and oversized strings, written directly */
  const struct {
    const char *what;
    const char *key;
    int kind; /* 0: str of n 'x', 1: u64 v, 2: bin n */
    size_t n;
    uint64_t v;
    int want;
  } bad[] = {
      {"model too long", "gpu_model", 0, 64, 0, GN_ETOOBIG},
      {"currency too long", "currency", 0, 8, 0, GN_ETOOBIG},
      {"addr too long", "addr", 0, 64, 0, GN_ETOOBIG},
      {"vram over u32", "vram_mib", 1, 0, (uint64_t)UINT32_MAX + 1, GN_ETOOBIG},
      {"provider short", "provider", 2, 31, 0, GN_EINVAL},
      {"seq as str", "seq", 0, 3, 0, GN_EINVAL},
      {"simulated as int", "simulated", 1, 0, 1, GN_EINVAL},
      {"no_userns as int", "no_userns", 1, 0, 1, GN_EINVAL},
      {"no_userns as str", "no_userns", 0, 4, 0, GN_EINVAL},
      {"unenforced_limits as int", "unenforced_limits", 1, 0, 0, GN_EINVAL},
      {"unenforced_limits as bin", "unenforced_limits", 2, 1, 0, GN_EINVAL},
  };
  for (size_t k = 0; k < GN_ARRAY_SIZE(bad); k++) {
    /* encode a good offer (with the optional flags, so they can be
     * replaced too), then re-encode with one field replaced */
    o = sample(1, "m");
    o.no_userns = o.unenforced_limits = true;
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn_buf good = {0};
    assert_int_equal(gn_offer_encode(&o, &good), 0);
    gn_wire_doc doc;
    assert_int_equal(gn_wire_decode(good.data, good.len, &doc), 0);
    const msgpack_object_map *m = &doc.root->via.map;
    gn_wire_put_map(&w, m->size);
    for (uint32_t i = 0; i < m->size; i++) {
      msgpack_pack_object(&w.pk, m->ptr[i].key);
      if (m->ptr[i].key.via.str.size == strlen(bad[k].key) &&
          memcmp(m->ptr[i].key.via.str.ptr, bad[k].key, strlen(bad[k].key)) == 0) {
        char s[100];
        memset(s, 'x', bad[k].n);
        s[bad[k].n] = '\0';
        if (bad[k].kind == 0)
          gn_wire_put_str(&w, s);
        else if (bad[k].kind == 1)
          gn_wire_put_u64(&w, bad[k].v);
        else
          gn_wire_put_bin(&w, s, bad[k].n);
      } else {
        msgpack_pack_object(&w.pk, m->ptr[i].val);
      }
    }
    b.len = 0;
    assert_int_equal(gn_wire_writer_take(&w, &b), 0);
    gn_wire_writer_done(&w);
    gn_wire_doc_done(&doc);
    gn_buf_done(&good);
    int r = gn_offer_decode(b.data, b.len, &d);
    if (r != bad[k].want)
      fail_msg("case '%s': got %d want %d", bad[k].what, r, bad[k].want);
  }
  assert_int_equal(gn_offer_decode((const uint8_t *)"\x90", 1, &d), GN_EINVAL);
  gn_buf_done(&b);
}

/* The confinement flags: absent when false (an offer of a confining
 * provider is what it was before the keys existed), signed, and carried
 * through the table. */
static void test_offer_confinement_flags(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_offer o = sample(3, "NVIDIA GeForce RTX 4090"), d;
  assert_int_equal(gn_offer_encode(&o, &b), 0);
  gn_wire_doc doc;
  assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
  assert_int_equal(doc.root->via.map.size, 13);
  assert_null(gn_wire_get(doc.root, "no_userns"));
  assert_null(gn_wire_get(doc.root, "unenforced_limits"));
  gn_wire_doc_done(&doc);
  assert_int_equal(gn_offer_decode(b.data, b.len, &d), 0);
  assert_false(d.no_userns);
  assert_false(d.unenforced_limits);

  for (int k = 1; k < 4; k++) {
    o = sample(3, "NVIDIA GeForce RTX 4090");
    o.no_userns = (k & 1) != 0;
    o.unenforced_limits = (k & 2) != 0;
    b.len = 0;
    assert_int_equal(gn_offer_encode(&o, &b), 0);
    assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
    assert_int_equal(doc.root->via.map.size, 13 + (k & 1) + (k >> 1));
    bool v = false;
    assert_int_equal(gn_wire_get_bool(doc.root, "no_userns", &v) == 0, o.no_userns);
    assert_int_equal(gn_wire_get_bool(doc.root, "unenforced_limits", &v) == 0, o.unenforced_limits);
    gn_wire_doc_done(&doc);
    memset(&d, 0xa5, sizeof(d));
    assert_int_equal(gn_offer_decode(b.data, b.len, &d), 0);
    assert_memory_equal(&o, &d, sizeof(o));
  }

  /* Another implementation may write false: it reads as false. */
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  assert_int_equal(gn_wire_decode(b.data, b.len, &doc), 0);
  const msgpack_object_map *m = &doc.root->via.map;
  gn_wire_put_map(&w, m->size);
  for (uint32_t i = 0; i < m->size; i++) {
    msgpack_pack_object(&w.pk, m->ptr[i].key);
    if (m->ptr[i].key.via.str.size == strlen("no_userns") &&
        memcmp(m->ptr[i].key.via.str.ptr, "no_userns", strlen("no_userns")) == 0)
      gn_wire_put_bool(&w, false);
    else
      msgpack_pack_object(&w.pk, m->ptr[i].val);
  }
  gn_wire_doc_done(&doc);
  gn_buf f = {0};
  assert_int_equal(gn_wire_writer_take(&w, &f), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_offer_decode(f.data, f.len, &d), 0);
  assert_false(d.no_userns);
  assert_true(d.unenforced_limits);
  gn_buf_done(&f);

  /* Sealed and put in a table, the flags are what the provider signed; the
   * same offer without them is a different body, so a relay cannot drop
   * them without breaking the signature. */
  o = sample(4, "NVIDIA GeForce RTX 4090");
  o.no_userns = o.unenforced_limits = true;
  gn_buf env = {0};
  seal(prov, &o, &env);
  gn_offer_table *t = gn_offer_table_new(8);
  assert_int_equal(gn_offer_table_put(t, env.data, env.len, NOW), 1);
  assert_true(gn_offer_table_at(t, 0)->offer.no_userns);
  assert_true(gn_offer_table_at(t, 0)->offer.unenforced_limits);
  gn_envelope e;
  assert_int_equal(gn_envelope_open(env.data, env.len, &e), 0);
  gn_offer plain = o;
  plain.no_userns = plain.unenforced_limits = false;
  b.len = 0;
  assert_int_equal(gn_offer_encode(&plain, &b), 0);
  assert_true(b.len != e.body_len || memcmp(b.data, e.body, b.len) != 0);
  gn_offer_table_free(t);
  gn_buf_done(&env);
  gn_buf_done(&b);
}

static void test_offer_id_depends_on_provider_and_model_only(void **state) {
  (void)state;
  gn_offer a = sample(1, "RTX 4090"), b = sample(9, "RTX 4090"), c = sample(1, "A100");
  char ia[GN_OFFER_ID_STRLEN], ib[GN_OFFER_ID_STRLEN], ic[GN_OFFER_ID_STRLEN];
  gn_offer_id(&a, ia);
  gn_offer_id(&b, ib);
  gn_offer_id(&c, ic);
  assert_int_equal(strlen(ia), 14);
  assert_memory_equal(ia, "o-", 2);
  assert_string_equal(ia, ib);
  assert_string_not_equal(ia, ic);
}

static void test_offer_table_newer_seq_replaces(void **state) {
  (void)state;
  gn_offer_table *t = gn_offer_table_new(10);
  gn_buf e = {0};
  gn_offer o = sample(5, "RTX 4090");
  seal(prov, &o, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 0); /* duplicate */
  o.seq = 4;
  seal(prov, &o, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 0); /* older */
  o.seq = 6;
  o.price_uper_hour = 1;
  seal(prov, &o, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  assert_int_equal(gn_offer_table_count(t), 1);
  const gn_offer_entry *x = gn_offer_table_at(t, 0);
  assert_int_equal(x->offer.seq, 6);
  assert_int_equal(x->offer.price_uper_hour, 1);
  assert_int_equal(x->raw_len, e.len);
  assert_memory_equal(x->raw, e.data, e.len);
  assert_ptr_equal(gn_offer_table_find(t, x->id), x);
  assert_null(gn_offer_table_find(t, "o-000000000000"));
  gn_buf_done(&e);
  gn_offer_table_free(t);
}

static void test_offer_table_rejects_wrong_signer_and_bad_sig(void **state) {
  (void)state;
  gn_offer_table *t = gn_offer_table_new(10);
  gn_buf body = {0}, e = {0};
  gn_offer o = sample(1, "RTX 4090");
  /* other signs an offer naming prov as provider */
  assert_int_equal(gn_offer_encode(&o, &body), 0);
  assert_int_equal(gn_envelope_seal(other, GN_MSG_OFFER, body.data, body.len, &e), 0);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), GN_EPERM);
  /* forged signature */
  e.len = 0;
  seal(prov, &o, &e);
  e.data[e.len - 1] ^= 1;
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), GN_ESIG);
  /* right signer, wrong message type */
  e.len = 0;
  assert_int_equal(gn_envelope_seal(prov, GN_MSG_PEERS, body.data, body.len, &e), 0);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), GN_EPROTO);
  assert_int_equal(gn_offer_table_count(t), 0);
  gn_buf_done(&body);
  gn_buf_done(&e);
  gn_offer_table_free(t);
}

static void test_offer_table_expiry(void **state) {
  (void)state;
  gn_offer_table *t = gn_offer_table_new(10);
  gn_buf e = {0};
  gn_offer o = sample(1, "RTX 4090");
  seal(prov, &o, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, o.expires_s), GN_EEXPIRED);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  assert_int_equal(gn_offer_table_expire(t, o.expires_s - 1), 0);
  assert_int_equal(gn_offer_table_expire(t, o.expires_s), 1);
  assert_int_equal(gn_offer_table_count(t), 0);
  gn_buf_done(&e);
  gn_offer_table_free(t);
}

static void test_offer_table_withdraw_and_tombstone(void **state) {
  (void)state;
  gn_offer_table *t = gn_offer_table_new(10);
  gn_buf e1 = {0}, e2 = {0}, w = {0}, other_o = {0};
  gn_offer a = sample(3, "RTX 4090"), b = sample(9, "A100"), c = sample(1, "RTX 4090");
  seal(prov, &a, &e1);
  seal(prov, &b, &e2);
  memcpy(c.provider, other->pk, GN_PK_LEN);
  seal(other, &c, &other_o);
  assert_int_equal(gn_offer_table_put(t, e1.data, e1.len, NOW), 1);
  assert_int_equal(gn_offer_table_put(t, e2.data, e2.len, NOW), 1);
  assert_int_equal(gn_offer_table_put(t, other_o.data, other_o.len, NOW), 1);
  /* withdraw up to seq 5: drops a (3) but not b (9), nor other's offer */
  assert_int_equal(gn_offer_withdraw_seal(prov, 5, &w), 0);
  assert_int_equal(gn_offer_table_withdraw(t, w.data, w.len), 1);
  assert_int_equal(gn_offer_table_count(t), 2);
  /* a replayed old offer does not come back */
  assert_int_equal(gn_offer_table_put(t, e1.data, e1.len, NOW), 0);
  assert_int_equal(gn_offer_table_count(t), 2);
  /* nobody else may withdraw prov's offers */
  gn_buf body = {0}, forged = {0};
  gn_wire_writer wr;
  gn_wire_writer_init(&wr);
  gn_wire_put_map(&wr, 2);
  gn_wire_put_str(&wr, "provider");
  gn_wire_put_bin(&wr, prov->pk, GN_PK_LEN);
  gn_wire_put_str(&wr, "seq");
  gn_wire_put_u64(&wr, 100);
  assert_int_equal(gn_wire_writer_take(&wr, &body), 0);
  gn_wire_writer_done(&wr);
  assert_int_equal(gn_envelope_seal(other, GN_MSG_OFFER_WITHDRAW, body.data, body.len, &forged), 0);
  assert_int_equal(gn_offer_table_withdraw(t, forged.data, forged.len), GN_EPERM);
  assert_int_equal(gn_offer_table_count(t), 2);
  /* the provider leaving drops everything it issued */
  assert_int_equal(gn_offer_table_remove_provider(t, prov->pk), 1);
  assert_int_equal(gn_offer_table_count(t), 1);
  assert_memory_equal(gn_offer_table_at(t, 0)->offer.provider, other->pk, GN_PK_LEN);
  gn_buf_done(&e1);
  gn_buf_done(&e2);
  gn_buf_done(&w);
  gn_buf_done(&other_o);
  gn_buf_done(&body);
  gn_buf_done(&forged);
  gn_offer_table_free(t);
}

static void test_offer_table_is_bounded(void **state) {
  (void)state;
  gn_offer_table *t = gn_offer_table_new(4);
  gn_buf e = {0};
  char model[32];
  /* one provider may hold at most 16 models; the table holds 4 in all */
  for (int i = 0; i < 4; i++) {
    gn_offer o = sample(1, "x");
    snprintf(model, sizeof(model), "gpu-%d", i);
    snprintf(o.gpu_model, sizeof(o.gpu_model), "%s", model);
    seal(prov, &o, &e);
    assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  }
  gn_offer o = sample(1, "gpu-late");
  seal(prov, &o, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), GN_ETOOBIG);
  /* outliving the others earns nothing: the provider holds the table */
  o.expires_s += 100;
  seal(prov, &o, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), GN_ETOOBIG);
  assert_int_equal(gn_offer_table_count(t), 4);
  /* another provider's offer evicts one of prov's, the one expiring first */
  gn_offer q = sample(1, "gpu-other");
  memcpy(q.provider, other->pk, GN_PK_LEN);
  seal(other, &q, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  assert_int_equal(gn_offer_table_count(t), 4);
  /* a second takes another (2 each); a third would leave other the
   * larger: refused */
  snprintf(q.gpu_model, sizeof(q.gpu_model), "gpu-other-2");
  seal(other, &q, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  snprintf(q.gpu_model, sizeof(q.gpu_model), "gpu-other-3");
  seal(other, &q, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), GN_ETOOBIG);
  size_t of_prov = 0;
  for (size_t i = 0; i < gn_offer_table_count(t); i++)
    of_prov += memcmp(gn_offer_table_at(t, i)->offer.provider, prov->pk, GN_PK_LEN) == 0;
  assert_int_equal(of_prov, 2);
  /* a lifetime past the bound is refused as malformed */
  o = sample(1, "gpu-long");
  o.expires_s = o.issued_s + GN_OFFER_LIFETIME_MAX_S + 1;
  seal(prov, &o, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), GN_EINVAL);
  gn_offer_table_free(t);

  t = gn_offer_table_new(100);
  for (int i = 0; i < 17; i++) {
    gn_offer p = sample(1, "x");
    snprintf(p.gpu_model, sizeof(p.gpu_model), "gpu-%d", i);
    seal(prov, &p, &e);
    assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), i < 16 ? 1 : GN_ETOOBIG);
  }
  gn_buf_done(&e);
  gn_offer_table_free(t);
}

static void test_offer_table_sqlite_roundtrip(void **state) {
  (void)state;
  char path[] = "/tmp/gn-offers-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  sqlite3 *db;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  gn_offer_table *t = gn_offer_table_new(10), *u = gn_offer_table_new(10);
  gn_buf e = {0};
  gn_offer a = sample(1, "RTX 4090"), b = sample(2, "A100");
  b.expires_s = NOW + 60;
  seal(prov, &a, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  seal(prov, &b, &e);
  assert_int_equal(gn_offer_table_put(t, e.data, e.len, NOW), 1);
  assert_int_equal(gn_offer_table_save(t, db), 0);
  assert_int_equal(gn_offer_table_save(t, db), 0); /* replaces, no duplicates */
  /* corrupt nothing; load later than b's expiry: only a comes back */
  assert_int_equal(gn_offer_table_load(u, db, NOW + 61), 0);
  assert_int_equal(gn_offer_table_count(u), 1);
  assert_string_equal(gn_offer_table_at(u, 0)->offer.gpu_model, "RTX 4090");
  /* a tampered cached row is skipped */
  assert_int_equal(sqlite3_exec(db, "UPDATE offers SET env = X'00'", NULL, NULL, NULL), SQLITE_OK);
  gn_offer_table *v = gn_offer_table_new(10);
  assert_int_equal(gn_offer_table_load(v, db, NOW), 0);
  assert_int_equal(gn_offer_table_count(v), 0);
  gn_buf_done(&e);
  gn_offer_table_free(t);
  gn_offer_table_free(u);
  gn_offer_table_free(v);
  sqlite3_close(db);
  unlink(path);
}

/* Issue 9, first attack: 500 throwaway identities x 10 GPU models of validly
 * signed offers expiring in 30 days, handed to the node by one peer, must not
 * keep a real provider's offer or the node's own out of a 4096-slot table. */
#define ATTACK_IDS 500
#define ATTACK_MODELS 10

static void attack_fill(gn_offer_table *t, int64_t lifetime_s, const uint8_t *relayer) {
  gn_buf e = {0};
  char model[32];
  for (int i = 0; i < ATTACK_IDS; i++) {
    gn_identity *sybil;
    assert_int_equal(gn_identity_generate(&sybil), 0);
    for (int m = 0; m < ATTACK_MODELS; m++) {
      gn_offer o = sample(1, "x");
      memcpy(o.provider, sybil->pk, GN_PK_LEN);
      o.issued_s = NOW;
      o.expires_s = NOW + lifetime_s;
      snprintf(model, sizeof(model), "poison-%d", m);
      snprintf(o.gpu_model, sizeof(o.gpu_model), "%s", model);
      seal(sybil, &o, &e);
      int r = gn_offer_table_put_from(t, e.data, e.len, NOW, relayer);
      if (lifetime_s > GN_OFFER_LIFETIME_MAX_S)
        assert_int_equal(r, GN_EINVAL); /* refused as malformed */
      else
        assert_true(r == 1 || r == GN_ETOOBIG);
    }
    gn_identity_free(sybil);
  }
  gn_buf_done(&e);
}

/* The real provider's and the node's own offer (60 s, as providers send them)
 * go in after the flood and are found. */
static void real_and_own_fit(gn_offer_table *t, const uint8_t *relayer) {
  gn_buf e = {0};
  char id[GN_OFFER_ID_STRLEN];
  gn_offer real = sample(1, "RTX 4090"), own = sample(1, "A100");
  real.issued_s = own.issued_s = NOW;
  real.expires_s = own.expires_s = NOW + 60;
  memcpy(own.provider, other->pk, GN_PK_LEN);
  seal(prov, &real, &e);
  assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, relayer), 1);
  seal(other, &own, &e);
  assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, other->pk), 1);
  gn_offer_id(&real, id);
  assert_non_null(gn_offer_table_find(t, id));
  gn_offer_id(&own, id);
  assert_non_null(gn_offer_table_find(t, id));
  gn_buf_done(&e);
}

static void test_offer_table_sybil_flood(void **state) {
  (void)state;
  uint8_t peer_x[GN_PK_LEN], peer_y[GN_PK_LEN];
  memset(peer_x, 0x58, sizeof(peer_x));
  memset(peer_y, 0x59, sizeof(peer_y));
  /* 30-day offers: every one refused, the table stays empty */
  gn_offer_table *t = gn_offer_table_new(4096);
  gn_offer_table_set_self(t, other->pk);
  attack_fill(t, 30 * 24 * 3600, peer_x);
  assert_int_equal(gn_offer_table_count(t), 0);
  real_and_own_fit(t, peer_y);
  gn_offer_table_free(t);

  /* Offers within the bound, 5,000 for 4,096 slots, all from peer X: the
   * table is full, yet the real offer (from another peer, or from X itself)
   * and the node's own still get in, evicting the flood's. */
  const uint8_t *via[2] = {peer_y, peer_x};
  for (int k = 0; k < 2; k++) {
    t = gn_offer_table_new(4096);
    gn_offer_table_set_self(t, other->pk);
    attack_fill(t, GN_OFFER_LIFETIME_MAX_S, peer_x);
    assert_int_equal(gn_offer_table_count(t), 4096);
    real_and_own_fit(t, via[k]);
    assert_int_equal(gn_offer_table_count(t), 4096);
    /* the own offer is never evicted: a further flood leaves it in place */
    attack_fill(t, GN_OFFER_LIFETIME_MAX_S, peer_x);
    gn_offer own = sample(1, "A100");
    memcpy(own.provider, other->pk, GN_PK_LEN);
    char id[GN_OFFER_ID_STRLEN];
    gn_offer_id(&own, id);
    assert_non_null(gn_offer_table_find(t, id));
    gn_offer_table_free(t);
  }
}

/* The flood planted in the SQLite cache does not come back on restart. */
static void test_offer_table_cache_poison(void **state) {
  (void)state;
  char path[] = "/tmp/gn-offers-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  sqlite3 *db;
  sqlite3_stmt *st;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  gn_offer_table *t = gn_offer_table_new(4);
  assert_int_equal(gn_offer_table_save(t, db), 0); /* the schema */
  gn_buf e = {0};
  char id[GN_OFFER_ID_STRLEN];
  gn_offer good = sample(1, "RTX 4090"), bad = sample(1, "poison");
  bad.issued_s = NOW;
  bad.expires_s = NOW + 30 * 24 * 3600;
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "INSERT INTO offers (id, provider, seq, expires_s, env) VALUES (?, ?, 1, ?, ?)",
                                      -1, &st, NULL),
                   SQLITE_OK);
  const gn_offer *rows[2] = {&bad, &good};
  for (int i = 0; i < 2; i++) {
    seal(prov, rows[i], &e);
    gn_offer_id(rows[i], id);
    sqlite3_reset(st);
    assert_int_equal(sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT), SQLITE_OK);
    assert_int_equal(sqlite3_bind_blob(st, 2, prov->pk, GN_PK_LEN, SQLITE_TRANSIENT), SQLITE_OK);
    assert_int_equal(sqlite3_bind_int64(st, 3, rows[i]->expires_s), SQLITE_OK);
    assert_int_equal(sqlite3_bind_blob(st, 4, e.data, (int)e.len, SQLITE_TRANSIENT), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
  }
  sqlite3_finalize(st);
  assert_int_equal(gn_offer_table_load(t, db, NOW), 0);
  assert_int_equal(gn_offer_table_count(t), 1);
  assert_string_equal(gn_offer_table_at(t, 0)->offer.gpu_model, "RTX 4090");
  gn_buf_done(&e);
  gn_offer_table_free(t);
  sqlite3_close(db);
  unlink(path);
}

/* Issue 9, item 3: standing. The hook grades prov 1 (attested) and `vet` 2;
 * fresh identities are 0. */
static gn_identity *vet;
static int standing_hook(void *ud, const gn_offer *o) {
  (void)ud;
  if (memcmp(o->provider, prov->pk, GN_PK_LEN) == 0)
    return 1;
  return vet && memcmp(o->provider, vet->pk, GN_PK_LEN) == 0 ? 2 : 0;
}

/* prov advertises 16 models (the most one provider may), so that without
 * standing its offers are the flood's first victims (the heaviest provider
 * of the heaviest relayer); 5,000 offers of 500 fresh identities through the
 * same peer then leave all 16 in place, and a provider of higher standing
 * still finds room in the full table. */
static void test_offer_table_standing_survives_sybil_flood(void **state) {
  (void)state;
  uint8_t peer_y[GN_PK_LEN];
  memset(peer_y, 0x59, sizeof(peer_y));
  gn_offer_table *t = gn_offer_table_new(4096);
  gn_offer_table_set_self(t, other->pk);
  gn_offer_table_set_standing(t, standing_hook, NULL);
  gn_buf e = {0};
  char model[32], id[GN_OFFER_ID_STRLEN];
  for (int m = 0; m < 16; m++) {
    snprintf(model, sizeof(model), "RTX 4090 #%d", m);
    gn_offer o = sample(1, model);
    seal(prov, &o, &e);
    assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, peer_y), 1);
  }
  assert_int_equal(gn_offer_table_at(t, 0)->standing, 1);
  attack_fill(t, GN_OFFER_LIFETIME_MAX_S, peer_y);
  assert_int_equal(gn_offer_table_count(t), 4096);
  for (int m = 0; m < 16; m++) {
    snprintf(model, sizeof(model), "RTX 4090 #%d", m);
    gn_offer o = sample(1, model);
    gn_offer_id(&o, id);
    assert_non_null(gn_offer_table_find(t, id));
  }
  assert_int_equal(gn_identity_generate(&vet), 0);
  gn_offer v = sample(1, "H100");
  memcpy(v.provider, vet->pk, GN_PK_LEN);
  seal(vet, &v, &e);
  assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, peer_y), 1);
  gn_offer_id(&v, id);
  assert_non_null(gn_offer_table_find(t, id));
  assert_int_equal(gn_offer_table_find(t, id)->standing, 2);
  assert_int_equal(gn_offer_table_count(t), 4096);
  vet = gn_identity_free(vet);
  gn_buf_done(&e);
  gn_offer_table_free(t);
}

/* A full table of offers of standing 1 refuses a fresh identity's offer,
 * whoever relays it; the same offer gets in once a place is free. */
static void test_offer_table_standing_zero_cannot_evict(void **state) {
  (void)state;
  uint8_t peer_z[GN_PK_LEN];
  memset(peer_z, 0x5a, sizeof(peer_z));
  gn_offer_table *t = gn_offer_table_new(4);
  gn_offer_table_set_standing(t, standing_hook, NULL);
  gn_buf e = {0};
  char model[32];
  for (int m = 0; m < 4; m++) {
    snprintf(model, sizeof(model), "A100 #%d", m);
    gn_offer o = sample(1, model);
    seal(prov, &o, &e);
    assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, NULL), 1);
  }
  gn_identity *fresh;
  assert_int_equal(gn_identity_generate(&fresh), 0);
  gn_offer f = sample(1, "poison");
  memcpy(f.provider, fresh->pk, GN_PK_LEN);
  seal(fresh, &f, &e);
  assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, peer_z), GN_ETOOBIG);
  assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, fresh->pk), GN_ETOOBIG);
  assert_int_equal(gn_offer_table_count(t), 4);
  assert_int_equal(gn_offer_table_remove_provider(t, prov->pk), 4);
  seal(fresh, &f, &e);
  assert_int_equal(gn_offer_table_put_from(t, e.data, e.len, NOW, peer_z), 1);
  gn_identity_free(fresh);
  gn_buf_done(&e);
  gn_offer_table_free(t);
}

/* The table answers whether a withdrawal covers a seq. */
static void test_offer_table_withdrawn_reports_tombstones(void **state) {
  (void)state;
  gn_offer_table *t = gn_offer_table_new(8);
  gn_buf e = {0};
  assert_false(gn_offer_table_withdrawn(t, prov->pk, 1));
  assert_int_equal(gn_offer_withdraw_seal(prov, 5, &e), 0);
  assert_true(gn_offer_table_withdraw(t, e.data, e.len) >= 0);
  assert_true(gn_offer_table_withdrawn(t, prov->pk, 5));
  assert_false(gn_offer_table_withdrawn(t, prov->pk, 6));
  assert_false(gn_offer_table_withdrawn(t, other->pk, 1));
  gn_buf_done(&e);
  gn_offer_table_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_offer_encode_decode_roundtrip),
      cmocka_unit_test(test_offer_decode_rejects_bad_fields),
      cmocka_unit_test(test_offer_confinement_flags),
      cmocka_unit_test(test_offer_id_depends_on_provider_and_model_only),
      cmocka_unit_test(test_offer_table_newer_seq_replaces),
      cmocka_unit_test(test_offer_table_rejects_wrong_signer_and_bad_sig),
      cmocka_unit_test(test_offer_table_expiry),
      cmocka_unit_test(test_offer_table_withdraw_and_tombstone),
      cmocka_unit_test(test_offer_table_is_bounded),
      cmocka_unit_test(test_offer_table_sqlite_roundtrip),
      cmocka_unit_test(test_offer_table_sybil_flood),
      cmocka_unit_test(test_offer_table_cache_poison),
      cmocka_unit_test(test_offer_table_standing_survives_sybil_flood),
      cmocka_unit_test(test_offer_table_standing_zero_cannot_evict),
      cmocka_unit_test(test_offer_table_withdrawn_reports_tombstones),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
