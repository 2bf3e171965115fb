/* Offers: the provider's signed advertisement, its msgpack body, and the
 * bounded in-memory table of offers a node has heard, with its SQLite cache. */
#include <gpunet/nat.h>
#include <gpunet/offer.h>

#include <sodium.h>
#include <stdio.h>

#define OFFER_KEYS 13
#define PER_PROVIDER_MAX 16 /* distinct GPU models one provider may advertise */
#define FUTURE_SKEW_S 3600  /* an offer issued further ahead is clock nonsense */
#define MAX_LIFETIME_S GN_OFFER_LIFETIME_MAX_S
#define STANDING_MAX 100

/* --- body codec -----------------------------------------------------------*/

int gn_offer_encode(const gn_offer *o, gn_buf *ret) {
  if (!o || !ret)
    return GN_EINVAL;
  if (strnlen(o->addr, sizeof(o->addr)) == sizeof(o->addr) ||
      strnlen(o->gpu_model, sizeof(o->gpu_model)) == sizeof(o->gpu_model) ||
      strnlen(o->currency, sizeof(o->currency)) == sizeof(o->currency))
    return GN_EINVAL;
  if (o->attest_len > GN_OFFER_ATTEST_MAX)
    return GN_ETOOBIG;
  if (o->training && (o->jobnet_port_lo == 0 || o->jobnet_port_lo > o->jobnet_port_hi))
    return GN_EINVAL;
  bool relay = o->relay_addr[0] != '\0';
  if (relay && (strnlen(o->relay_addr, sizeof(o->relay_addr)) == sizeof(o->relay_addr) ||
                !gn_nat_addr_valid(o->relay_addr) || memcmp(o->relay_id, o->provider, GN_PK_LEN) == 0))
    return GN_EINVAL;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, OFFER_KEYS + (o->attest_len ? 1 : 0) + (o->no_userns ? 1 : 0) + (o->unenforced_limits ? 1 : 0) +
                          (o->training ? 2 : 0) + (relay ? 2 : 0));
  gn_wire_put_str(&w, "provider");
  gn_wire_put_bin(&w, o->provider, GN_PK_LEN);
  gn_wire_put_str(&w, "seq");
  gn_wire_put_u64(&w, o->seq);
  gn_wire_put_str(&w, "issued_s");
  gn_wire_put_i64(&w, o->issued_s);
  gn_wire_put_str(&w, "expires_s");
  gn_wire_put_i64(&w, o->expires_s);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, o->addr);
  gn_wire_put_str(&w, "gpu_model");
  gn_wire_put_str(&w, o->gpu_model);
  gn_wire_put_str(&w, "vram_mib");
  gn_wire_put_u64(&w, o->vram_mib);
  gn_wire_put_str(&w, "gpus_free");
  gn_wire_put_u64(&w, o->gpus_free);
  gn_wire_put_str(&w, "gpus_total");
  gn_wire_put_u64(&w, o->gpus_total);
  gn_wire_put_str(&w, "price_uper_hour");
  gn_wire_put_u64(&w, o->price_uper_hour);
  gn_wire_put_str(&w, "currency");
  gn_wire_put_str(&w, o->currency);
  gn_wire_put_str(&w, "max_hours");
  gn_wire_put_u64(&w, o->max_hours);
  gn_wire_put_str(&w, "simulated");
  gn_wire_put_bool(&w, o->simulated);
  if (o->attest_len) {
    gn_wire_put_str(&w, "attest");
    gn_wire_put_bin(&w, o->attest, o->attest_len);
  }
  /* Written only when true: an offer of a fully confining provider is
   * byte for byte what providers sent before these keys existed. */
  if (o->no_userns) {
    gn_wire_put_str(&w, "no_userns");
    gn_wire_put_bool(&w, true);
  }
  if (o->unenforced_limits) {
    gn_wire_put_str(&w, "unenforced_limits");
    gn_wire_put_bool(&w, true);
  }
  if (o->training) {
    gn_wire_put_str(&w, "training");
    gn_wire_put_bool(&w, true);
    gn_wire_put_str(&w, "jobnet_ports");
    gn_wire_put_array(&w, 2);
    gn_wire_put_u64(&w, o->jobnet_port_lo);
    gn_wire_put_u64(&w, o->jobnet_port_hi);
  }
  if (relay) {
    gn_wire_put_str(&w, "relay_id");
    gn_wire_put_bin(&w, o->relay_id, GN_PK_LEN);
    gn_wire_put_str(&w, "relay_addr");
    gn_wire_put_str(&w, o->relay_addr);
  }
  int r = gn_wire_writer_take(&w, ret);
  gn_wire_writer_done(&w);
  return r;
}

int gn_offer_decode(const uint8_t *body, size_t len, gn_offer *ret) {
  gn_wire_doc doc;
  gn_offer o;
  int r;
  if (!body || !ret)
    return GN_EINVAL;
  if ((r = gn_wire_decode(body, len, &doc)) < 0)
    return r;
  memset(&o, 0, sizeof(o));
  const msgpack_object *m = doc.root;
  if ((r = gn_wire_get_bin_exact(m, "provider", o.provider, GN_PK_LEN)) < 0 ||
      (r = gn_wire_get_u64(m, "seq", &o.seq)) < 0 || (r = gn_wire_get_i64(m, "issued_s", &o.issued_s)) < 0 ||
      (r = gn_wire_get_i64(m, "expires_s", &o.expires_s)) < 0 ||
      (r = gn_wire_get_str(m, "addr", o.addr, sizeof(o.addr))) < 0 ||
      (r = gn_wire_get_str(m, "gpu_model", o.gpu_model, sizeof(o.gpu_model))) < 0 ||
      (r = gn_wire_get_u32(m, "vram_mib", &o.vram_mib)) < 0 ||
      (r = gn_wire_get_u32(m, "gpus_free", &o.gpus_free)) < 0 ||
      (r = gn_wire_get_u32(m, "gpus_total", &o.gpus_total)) < 0 ||
      (r = gn_wire_get_u64(m, "price_uper_hour", &o.price_uper_hour)) < 0 ||
      (r = gn_wire_get_str(m, "currency", o.currency, sizeof(o.currency))) < 0 ||
      (r = gn_wire_get_u32(m, "max_hours", &o.max_hours)) < 0 ||
      (r = gn_wire_get_bool(m, "simulated", &o.simulated)) < 0)
    goto out;
  if (gn_wire_get(m, "attest")) {
    const uint8_t *p;
    size_t n;
    if ((r = gn_wire_get_bin_ref(m, "attest", GN_OFFER_ATTEST_MAX, &p, &n)) < 0)
      goto out;
    memcpy(o.attest, p, n);
    o.attest_len = (uint32_t)n;
  }
  /* Optional, but a boolean when present: anything else is a malformed offer,
   * not one that quietly reads as confined. */
  if ((gn_wire_get(m, "no_userns") && (r = gn_wire_get_bool(m, "no_userns", &o.no_userns)) < 0) ||
      (gn_wire_get(m, "unenforced_limits") && (r = gn_wire_get_bool(m, "unenforced_limits", &o.unenforced_limits)) < 0))
    goto out;
  if (gn_wire_get(m, "training") && (r = gn_wire_get_bool(m, "training", &o.training)) < 0)
    goto out;
  if (o.training) { /* then its port range, [lo, hi] */
    const msgpack_object_array *a;
    if ((r = gn_wire_get_array(m, "jobnet_ports", 2, &a)) < 0)
      goto out;
    if (a->size != 2 || a->ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        a->ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a->ptr[0].via.u64 == 0 ||
        a->ptr[0].via.u64 > a->ptr[1].via.u64 || a->ptr[1].via.u64 > 65535) {
      r = GN_EINVAL;
      goto out;
    }
    o.jobnet_port_lo = (uint16_t)a->ptr[0].via.u64;
    o.jobnet_port_hi = (uint16_t)a->ptr[1].via.u64;
  }
  /* A relay: both keys or neither, a numeric address, not the provider. */
  if (gn_wire_get(m, "relay_id") || gn_wire_get(m, "relay_addr")) {
    if ((r = gn_wire_get_bin_exact(m, "relay_id", o.relay_id, GN_PK_LEN)) < 0 ||
        (r = gn_wire_get_str(m, "relay_addr", o.relay_addr, sizeof(o.relay_addr))) < 0)
      goto out;
    if (!gn_nat_addr_valid(o.relay_addr) || memcmp(o.relay_id, o.provider, GN_PK_LEN) == 0) {
      r = GN_EINVAL;
      goto out;
    }
  }
  /* Consistency a provider cannot get wrong honestly. */
  if (!o.gpu_model[0] || !o.currency[0] || o.gpus_free > o.gpus_total || o.expires_s <= o.issued_s || o.issued_s < 0) {
    r = GN_EINVAL;
    goto out;
  }
  *ret = o;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

void gn_offer_id(const gn_offer *o, char ret_id[GN_OFFER_ID_STRLEN]) {
  uint8_t h[32];
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, sizeof(h));
  crypto_generichash_update(&st, o->provider, GN_PK_LEN);
  crypto_generichash_update(&st, (const uint8_t *)o->gpu_model, strnlen(o->gpu_model, sizeof(o->gpu_model)));
  crypto_generichash_final(&st, h, sizeof(h));
  static const char hex[] = "0123456789abcdef";
  memset(ret_id, 0, GN_OFFER_ID_STRLEN);
  ret_id[0] = 'o';
  ret_id[1] = '-';
  for (int i = 0; i < 6; i++) {
    ret_id[2 + 2 * i] = hex[h[i] >> 4];
    ret_id[3 + 2 * i] = hex[h[i] & 15];
  }
}

int gn_offer_seal(const gn_identity *id, const gn_offer *o, gn_buf *ret_env) {
  gn_buf body = {0};
  if (!id || !o || !ret_env)
    return GN_EINVAL;
  gn_offer c = *o;
  memcpy(c.provider, id->pk, GN_PK_LEN);
  int r = gn_offer_encode(&c, &body);
  if (r == 0)
    r = gn_envelope_seal(id, GN_MSG_OFFER, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

int gn_offer_withdraw_seal(const gn_identity *id, uint64_t seq, gn_buf *ret_env) {
  gn_buf body = {0};
  gn_wire_writer w;
  if (!id || !ret_env)
    return GN_EINVAL;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "provider");
  gn_wire_put_bin(&w, id->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "seq");
  gn_wire_put_u64(&w, seq);
  int r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(id, GN_MSG_OFFER_WITHDRAW, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

/* --- table ----------------------------------------------------------------*/

/* What a withdrawal left behind: without it, a copy of the withdrawn offer
 * still travelling the overlay would put it straight back. */
typedef struct tombstone {
  uint8_t provider[GN_PK_LEN];
  uint64_t seq;
} tombstone;

/* A count by key (relayer or provider) when choosing an eviction victim:
 * open addressing, keyed by a per-table SipHash key so that chosen keys
 * cannot pile into one chain. */
typedef struct count_slot {
  const uint8_t *key; /* NULL: free */
  size_t n;
  size_t best; /* the entry expiring first among those counted */
} count_slot;

struct gn_offer_table {
  gn_offer_entry *e;
  size_t n, max;
  tombstone *tomb;
  size_t ntomb, tomb_next; /* a ring: the oldest is overwritten */
  uint8_t self[GN_PK_LEN];
  bool has_self;
  count_slot *slots; /* nslots (a power of two >= 2 max) */
  size_t nslots;
  uint8_t hkey[crypto_shorthash_KEYBYTES];
  gn_offer_standing_fn standing;
  void *standing_ud;
  size_t per_provider_max; /* PER_PROVIDER_MAX unless set */
};

gn_offer_table *gn_offer_table_new(size_t max_entries) {
  if (max_entries == 0)
    return NULL;
  gn_offer_table *t = calloc(1, sizeof(*t));
  if (!t)
    return NULL;
  t->e = calloc(max_entries, sizeof(*t->e));
  t->tomb = calloc(max_entries, sizeof(*t->tomb));
  for (t->nslots = 16; t->nslots < 2 * max_entries; t->nslots *= 2)
    ;
  t->slots = calloc(t->nslots, sizeof(*t->slots));
  if (!t->e || !t->tomb || !t->slots)
    return gn_offer_table_free(t);
  randombytes_buf(t->hkey, sizeof(t->hkey));
  t->max = max_entries;
  t->per_provider_max = PER_PROVIDER_MAX;
  return t;
}

gn_offer_table *gn_offer_table_free(gn_offer_table *t) {
  if (!t)
    return NULL;
  for (size_t i = 0; i < t->n; i++)
    free(t->e[i].raw);
  free(t->e);
  free(t->tomb);
  free(t->slots);
  free(t);
  return NULL;
}

void gn_offer_table_set_max_per_provider(gn_offer_table *t, size_t max) {
  if (t)
    t->per_provider_max = max ? max : PER_PROVIDER_MAX;
}

void gn_offer_table_set_self(gn_offer_table *t, const uint8_t self[GN_PK_LEN]) {
  if (!t || !self)
    return;
  memcpy(t->self, self, GN_PK_LEN);
  t->has_self = true;
}

void gn_offer_table_set_standing(gn_offer_table *t, gn_offer_standing_fn fn, void *ud) {
  if (!t)
    return;
  t->standing = fn;
  t->standing_ud = ud;
}

static int standing_of(const gn_offer_table *t, const gn_offer *o) {
  if (!t->standing)
    return 0;
  int s = t->standing(t->standing_ud, o);
  return s < 0 ? 0 : s > STANDING_MAX ? STANDING_MAX : s;
}

static bool is_own(const gn_offer_table *t, const uint8_t provider[GN_PK_LEN]) {
  return t->has_self && memcmp(provider, t->self, GN_PK_LEN) == 0;
}

static count_slot *slot_of(gn_offer_table *t, const uint8_t key[GN_PK_LEN]) {
  uint8_t h[crypto_shorthash_BYTES];
  uint64_t v;
  crypto_shorthash(h, key, GN_PK_LEN, t->hkey);
  memcpy(&v, h, sizeof(v));
  size_t i = (size_t)v & (t->nslots - 1);
  /* at most max + 1 distinct keys in 2 max slots: a free one is found */
  while (t->slots[i].key && memcmp(t->slots[i].key, key, GN_PK_LEN) != 0)
    i = (i + 1) & (t->nslots - 1);
  t->slots[i].key = key;
  return &t->slots[i];
}

/* The slot counting the most; ties go to prefer's, if any. */
static const count_slot *heaviest(const gn_offer_table *t, const uint8_t *prefer) {
  const count_slot *best = NULL;
  for (size_t i = 0; i < t->nslots; i++) {
    const count_slot *s = &t->slots[i];
    if (!s->key || s->n == 0)
      continue;
    if (!best || s->n > best->n || (s->n == best->n && prefer && memcmp(s->key, prefer, GN_PK_LEN) == 0))
      best = s;
  }
  return best;
}

/* The full table's victim for newcomer o (standing s) from relayer, or t->n
 * when o is refused. Only entries of the lowest standing held are
 * candidates: a newcomer of lower standing is refused, one of higher standing
 * always takes a place. Among the candidates, the relayer holding the most
 * gives one up, from its provider holding the most, the one expiring first;
 * a relayed newcomer of the candidates' standing only takes its place if its
 * own relayer (or, within the same relayer, its provider) would then hold no
 * more than the victim's. Own offers are never chosen, and an own newcomer is
 * never refused while anything else is held. */
static size_t pick_victim(gn_offer_table *t, const gn_offer *o, int s, const uint8_t relayer[GN_PK_LEN]) {
  int low = STANDING_MAX + 1;
  for (size_t i = 0; i < t->n; i++)
    if (!is_own(t, t->e[i].offer.provider) && t->e[i].standing < low)
      low = t->e[i].standing;
  if (low > STANDING_MAX)
    return t->n; /* nothing but our own */
  bool own = is_own(t, o->provider);
  if (!own && s < low)
    return t->n;
  bool privileged = own || s > low; /* takes a place without the fairness test */
  memset(t->slots, 0, t->nslots * sizeof(*t->slots));
  count_slot *last = NULL; /* runs of one key are common: skip the hash */
  for (size_t i = 0; i < t->n; i++) {
    if (is_own(t, t->e[i].offer.provider) || t->e[i].standing != low)
      continue;
    if (!last || memcmp(last->key, t->e[i].relayer, GN_PK_LEN) != 0)
      last = slot_of(t, t->e[i].relayer);
    last->n++;
  }
  const count_slot *r = heaviest(t, privileged ? NULL : relayer);
  const uint8_t *rkey = r->key;
  size_t rn = r->n, new_rn = privileged ? 0 : slot_of(t, relayer)->n;
  bool same_relayer = !privileged && memcmp(rkey, relayer, GN_PK_LEN) == 0;
  memset(t->slots, 0, t->nslots * sizeof(*t->slots));
  last = NULL;
  for (size_t i = 0; i < t->n; i++) {
    const gn_offer_entry *x = &t->e[i];
    if (is_own(t, x->offer.provider) || x->standing != low || memcmp(x->relayer, rkey, GN_PK_LEN) != 0)
      continue;
    count_slot *c = last && memcmp(last->key, x->offer.provider, GN_PK_LEN) == 0 ? last : slot_of(t, x->offer.provider);
    last = c;
    if (c->n++ == 0 || x->offer.expires_s < t->e[c->best].offer.expires_s)
      c->best = i;
  }
  const count_slot *p = heaviest(t, same_relayer ? o->provider : NULL);
  size_t pn = p->n, new_pn = same_relayer ? slot_of(t, o->provider)->n : 0;
  if (!privileged) {
    if (!same_relayer && new_rn + 1 > rn - 1)
      return t->n;
    if (same_relayer && new_pn + 1 > pn - 1)
      return t->n;
  }
  return p->best;
}

static void entry_remove(gn_offer_table *t, size_t i) {
  free(t->e[i].raw);
  t->e[i] = t->e[t->n - 1];
  memset(&t->e[t->n - 1], 0, sizeof(t->e[0]));
  t->n--;
}

static const tombstone *tomb_find(const gn_offer_table *t, const uint8_t provider[GN_PK_LEN]) {
  for (size_t i = 0; i < t->ntomb; i++)
    if (memcmp(t->tomb[i].provider, provider, GN_PK_LEN) == 0)
      return &t->tomb[i];
  return NULL;
}

static void tomb_put(gn_offer_table *t, const uint8_t provider[GN_PK_LEN], uint64_t seq) {
  tombstone *x = (tombstone *)tomb_find(t, provider);
  if (x) {
    if (seq > x->seq)
      x->seq = seq;
    return;
  }
  x = &t->tomb[t->tomb_next];
  t->tomb_next = (t->tomb_next + 1) % t->max;
  if (t->ntomb < t->max)
    t->ntomb++;
  memcpy(x->provider, provider, GN_PK_LEN);
  x->seq = seq;
}

int gn_offer_table_put(gn_offer_table *t, const uint8_t *env, size_t len, int64_t now_s) {
  return gn_offer_table_put_from(t, env, len, now_s, NULL);
}

int gn_offer_table_put_from(gn_offer_table *t, const uint8_t *env, size_t len, int64_t now_s,
                            const uint8_t relayer[GN_PK_LEN]) {
  static const uint8_t unknown[GN_PK_LEN];
  gn_envelope e;
  gn_offer o;
  char id[GN_OFFER_ID_STRLEN];
  int r;
  if (!t || !env)
    return GN_EINVAL;
  if (!relayer)
    relayer = unknown;
  if ((r = gn_envelope_open(env, len, &e)) < 0)
    return r;
  if (e.type != GN_MSG_OFFER)
    return GN_EPROTO;
  if ((r = gn_offer_decode(e.body, e.body_len, &o)) < 0)
    return r;
  /* Only the provider may speak for its offer, however it travelled. */
  if (memcmp(o.provider, e.signer, GN_PK_LEN) != 0)
    return GN_EPERM;
  if (o.expires_s <= now_s)
    return GN_EEXPIRED;
  /* A long life is no merit: offers are refreshed, and one living longer
   * than the bound is malformed, not preferred. */
  if (o.issued_s > now_s + FUTURE_SKEW_S || o.expires_s > o.issued_s + MAX_LIFETIME_S)
    return GN_EINVAL;
  const tombstone *tb = tomb_find(t, o.provider);
  if (tb && o.seq <= tb->seq)
    return 0;
  gn_offer_id(&o, id);
  size_t at = t->n, mine = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (strcmp(t->e[i].id, id) == 0)
      at = i;
    if (memcmp(t->e[i].offer.provider, o.provider, GN_PK_LEN) == 0)
      mine++;
  }
  if (at < t->n && t->e[at].offer.seq >= o.seq)
    return 0;
  int standing = standing_of(t, &o);
  if (at == t->n) {
    if (mine >= t->per_provider_max)
      return GN_ETOOBIG;
    if (t->n == t->max) {
      size_t victim = pick_victim(t, &o, standing, relayer);
      if (victim == t->n)
        return GN_ETOOBIG;
      entry_remove(t, victim);
      at = t->n;
    }
  }
  uint8_t *raw = malloc(len);
  if (!raw)
    return GN_ENOMEM;
  memcpy(raw, env, len);
  if (at == t->n)
    t->n++;
  else
    free(t->e[at].raw);
  gn_offer_entry *x = &t->e[at];
  x->offer = o;
  memcpy(x->id, id, sizeof(x->id));
  x->raw = raw;
  x->raw_len = len;
  memcpy(x->relayer, relayer, GN_PK_LEN);
  x->standing = standing;
  return 1;
}

int gn_offer_table_withdraw(gn_offer_table *t, const uint8_t *env, size_t len) {
  gn_envelope e;
  gn_wire_doc doc;
  uint8_t provider[GN_PK_LEN];
  uint64_t seq;
  int r;
  if (!t || !env)
    return GN_EINVAL;
  if ((r = gn_envelope_open(env, len, &e)) < 0)
    return r;
  if (e.type != GN_MSG_OFFER_WITHDRAW)
    return GN_EPROTO;
  if ((r = gn_wire_decode(e.body, e.body_len, &doc)) < 0)
    return r;
  r = gn_wire_get_bin_exact(doc.root, "provider", provider, GN_PK_LEN);
  if (r == 0)
    r = gn_wire_get_u64(doc.root, "seq", &seq);
  gn_wire_doc_done(&doc);
  if (r < 0)
    return r;
  if (memcmp(provider, e.signer, GN_PK_LEN) != 0)
    return GN_EPERM;
  int dropped = 0;
  for (size_t i = 0; i < t->n;) {
    if (memcmp(t->e[i].offer.provider, provider, GN_PK_LEN) == 0 && t->e[i].offer.seq <= seq) {
      entry_remove(t, i);
      dropped++;
    } else {
      i++;
    }
  }
  tomb_put(t, provider, seq);
  return dropped;
}

bool gn_offer_table_withdrawn(const gn_offer_table *t, const uint8_t provider[GN_PK_LEN], uint64_t seq) {
  const tombstone *tb = t && provider ? tomb_find(t, provider) : NULL;
  return tb && seq <= tb->seq;
}

size_t gn_offer_table_remove_provider(gn_offer_table *t, const uint8_t provider[GN_PK_LEN]) {
  size_t dropped = 0;
  for (size_t i = 0; t && i < t->n;) {
    if (memcmp(t->e[i].offer.provider, provider, GN_PK_LEN) == 0) {
      entry_remove(t, i);
      dropped++;
    } else {
      i++;
    }
  }
  return dropped;
}

size_t gn_offer_table_expire(gn_offer_table *t, int64_t now_s) {
  size_t dropped = 0;
  for (size_t i = 0; t && i < t->n;) {
    if (t->e[i].offer.expires_s <= now_s) {
      entry_remove(t, i);
      dropped++;
    } else {
      i++;
    }
  }
  return dropped;
}

size_t gn_offer_table_count(const gn_offer_table *t) {
  return t ? t->n : 0;
}

const gn_offer_entry *gn_offer_table_at(const gn_offer_table *t, size_t index) {
  return t && index < t->n ? &t->e[index] : NULL;
}

const gn_offer_entry *gn_offer_table_find(const gn_offer_table *t, const char *id) {
  if (!gn_id_valid(id)) /* ids come from users and peers: outside the grammar names nothing */
    return NULL;
  for (size_t i = 0; t && i < t->n; i++)
    if (strcmp(t->e[i].id, id) == 0)
      return &t->e[i];
  return NULL;
}

/* --- SQLite cache ---------------------------------------------------------*/

#define OFFERS_SCHEMA                                                                                                  \
  "CREATE TABLE IF NOT EXISTS offers (id TEXT PRIMARY KEY, provider BLOB NOT NULL, seq INTEGER NOT NULL, "             \
  "expires_s INTEGER NOT NULL, env BLOB NOT NULL)"

int gn_offer_table_save(const gn_offer_table *t, sqlite3 *db) {
  sqlite3_stmt *st = NULL;
  int r = GN_EDB;
  if (!t || !db)
    return GN_EINVAL;
  if (sqlite3_exec(db, OFFERS_SCHEMA, NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
    return GN_EDB;
  if (sqlite3_exec(db, "DELETE FROM offers", NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "INSERT INTO offers (id, provider, seq, expires_s, env) VALUES (?, ?, ?, ?, ?)", -1, &st,
                         NULL) != SQLITE_OK)
    goto out;
  for (size_t i = 0; i < t->n; i++) {
    const gn_offer_entry *x = &t->e[i];
    sqlite3_reset(st);
    /* SQLite integers are signed; the bit pattern round-trips. */
    if (sqlite3_bind_text(st, 1, x->id, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_blob(st, 2, x->offer.provider, GN_PK_LEN, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int64(st, 3, (sqlite3_int64)x->offer.seq) != SQLITE_OK ||
        sqlite3_bind_int64(st, 4, x->offer.expires_s) != SQLITE_OK ||
        sqlite3_bind_blob(st, 5, x->raw, (int)x->raw_len, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_DONE)
      goto out;
  }
  r = 0;
out:
  sqlite3_finalize(st);
  if (sqlite3_exec(db, r == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL) != SQLITE_OK && r == 0) {
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    r = GN_EDB;
  }
  return r;
}

int gn_offer_table_load(gn_offer_table *t, sqlite3 *db, int64_t now_s) {
  sqlite3_stmt *st = NULL;
  int r = GN_EDB, s;
  if (!t || !db)
    return GN_EINVAL;
  if (sqlite3_exec(db, OFFERS_SCHEMA, NULL, NULL, NULL) != SQLITE_OK)
    return GN_EDB;
  if (sqlite3_prepare_v2(db, "SELECT env FROM offers", -1, &st, NULL) != SQLITE_OK)
    return GN_EDB;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
    const void *p = sqlite3_column_blob(st, 0);
    int n = sqlite3_column_bytes(st, 0);
    /* The cache is not trusted more than the network: each envelope is
     * verified again, and bad or expired ones are skipped. */
    if (p && n > 0)
      (void)gn_offer_table_put(t, p, (size_t)n, now_s);
  }
  if (s == SQLITE_DONE)
    r = 0;
  sqlite3_finalize(st);
  return r;
}
