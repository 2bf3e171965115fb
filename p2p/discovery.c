/* Discovery as an I/O-free state machine: peers exchange PEERS lists when a
 * session comes up (rationed, since each entry may cost a dial); offers are
 * pushed to a few random neighbours (push gossip, with the offer table's
 * sequence numbers as the dedupe that stops it) and repaired by anti-entropy:
 * summary digests of bucket hashes, detail digests of the differing buckets,
 * and wants naming only the offers a node lacks (docs/overlay/gossip.md). */
#include <gpunet/discovery.h>

#include <sodium.h>
#include <stdio.h>

#define ADDR_LEN 64
#define MAX_BOOTSTRAPS 16
#define DIAL_MEMORY 256 /* addresses dialled from PEERS recently */
#define RUMORS 512      /* recent offers and withdrawals, with who has them */
#define RUMOR_PEERS 16
#define WANTED 1024 /* offers we asked for recently */
#define ID_BYTES 6  /* an offer id's 12 hex digits */
#define SALT_LEN crypto_shorthash_KEYBYTES
#define TOKEN 1000 /* milli-tokens per dial */
#define DIAL_BURST (GN_DISCOVERY_DIALS_PER_MIN * TOKEN)
/* Signed withdrawals kept to repair peers that missed them (anti-entropy:
 * a detail digest listing an offer one of them covers is answered with it):
 * at most this many, each for as long as an offer it covers may live. */
#define WITHDRAWALS 256
#define WITHDRAWAL_MAX 256 /* bytes of one envelope (a real one is about 150) */
#define WITHDRAWAL_KEEP_S GN_OFFER_LIFETIME_MAX_S
/* How far ahead an offer's expiry may lie for the table to take it (its
 * issue at most an hour ahead, plus its lifetime): entries beyond are junk. */
#define EXPIRY_AHEAD_MAX_S (3600 + GN_OFFER_LIFETIME_MAX_S)

typedef struct up_peer {
  uint8_t pk[GN_PK_LEN];
  char addr[ADDR_LEN];
  bool neighbour;
  bool peers_seen; /* a PEERS was accepted, at peers_at_s */
  int64_t peers_at_s;
  bool summary_sent; /* we sent it a summary, at summary_at_s */
  int64_t summary_at_s;
  /* Anti-entropy budget for the period starting at win_s. */
  int64_t win_s;
  uint32_t digests_in, wants_in;
  size_t bytes_out;
  /* We asked it for a detail digest: that many are taken until then. */
  int64_t detail_until_s;
  uint32_t details_left;
} up_peer;

typedef struct dialled {
  char addr[ADDR_LEN];
  int64_t at_s;
} dialled;

typedef struct bootstrap {
  char addr[ADDR_LEN];
  int64_t last_s;
  bool tried;
  bool reached; /* a session to it was up once */
} bootstrap;

/* An offer (provider, id, seq) or withdrawal (provider, seq) we took, and the
 * peers that sent it to us or that we sent it to, so a push never goes back
 * to one that has it. */
typedef struct rumor {
  uint64_t key;
  bool used;
  uint8_t n;
  uint64_t peers[RUMOR_PEERS]; /* the first 8 bytes of each peer's key */
} rumor;

typedef struct wanted {
  uint64_t key;
  int64_t at_s;
} wanted;

/* A provider's signed withdrawal of its offers up to seq, kept until
 * until_s. One per provider: the highest seq seen. */
typedef struct withdrawal {
  uint8_t provider[GN_PK_LEN];
  uint64_t seq;
  int64_t until_s;
  bool dropped;  /* it dropped an offer here (or it is our own): kept before the others */
  uint32_t mark; /* the detail digest that last sent it, so one sends it once */
  uint16_t len;
  uint8_t raw[WITHDRAWAL_MAX];
} withdrawal;

/* One of our entries, for lookups by (provider, id) in a sorted copy. */
typedef struct own_key {
  uint8_t provider[GN_PK_LEN];
  uint8_t id[ID_BYTES];
  uint64_t seq;
  size_t idx;
} own_key;

struct gn_discovery {
  const gn_identity *self;
  gn_discovery_io io;
  gn_discovery_connect_peer_fn connect_peer;
  gn_discovery_heard_fn heard; /* PEERS entries go there instead of being dialled */
  gn_offer_table *table;
  gn_discovery_config cfg;
  char self_addr[ADDR_LEN];
  up_peer up[GN_DISCOVERY_MAX_UP];
  size_t nup;
  dialled dial[DIAL_MEMORY];
  size_t ndial, dial_next;
  int64_t dial_tokens_m, dial_refill_s;
  bool dial_started;
  bootstrap boot[MAX_BOOTSTRAPS];
  size_t nboot;
  uint64_t rng;
  size_t fanout;
  bool neighbours_only;
  uint8_t hkey[SALT_LEN]; /* keys the rumor and want memories */
  rumor rumors[RUMORS];
  size_t rumor_next;
  wanted want[WANTED];
  size_t want_next;
  withdrawal wd[WITHDRAWALS];
  size_t nwd;
  uint32_t wd_mark;
  int64_t next_digest_s;
  bool digest_started;
  /* The budget that peers beyond GN_DISCOVERY_MAX_UP share (its pk is set
   * to the sender's for the message being handled). */
  up_peer stranger;
  int64_t win_s; /* the period of the totals below */
  uint32_t digests_in;
  size_t bytes_out;
};

/* --- basics ---------------------------------------------------------------*/

static uint64_t rnd(gn_discovery *d) {
  /* xorshift64*: fast, and replayable from one seed */
  d->rng ^= d->rng >> 12;
  d->rng ^= d->rng << 25;
  d->rng ^= d->rng >> 27;
  return d->rng * 0x2545F4914F6CDD1DULL;
}

void gn_discovery_seed(gn_discovery *d, uint64_t seed) {
  if (!d)
    return;
  d->rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < sizeof(d->hkey); i++)
    d->hkey[i] = (uint8_t)rnd(d);
}

int gn_discovery_new(const gn_identity *self, const gn_discovery_io *io, gn_offer_table *table, gn_discovery **ret_d) {
  if (!self || !io || !io->send || !io->connect || !table || !ret_d)
    return GN_EINVAL;
  gn_discovery *d = calloc(1, sizeof(*d));
  if (!d)
    return GN_ENOMEM;
  d->self = self;
  d->io = *io;
  d->table = table;
  d->fanout = GN_DISCOVERY_FANOUT;
  gn_discovery_config_default(&d->cfg);
  uint64_t seed;
  randombytes_buf(&seed, sizeof(seed));
  gn_discovery_seed(d, seed);
  gn_offer_table_set_self(table, self->pk); /* our offers are never evicted */
  *ret_d = d;
  return 0;
}

gn_discovery *gn_discovery_free(gn_discovery *d) {
  free(d);
  return NULL;
}

void gn_discovery_config_default(gn_discovery_config *ret_c) {
  *ret_c = (gn_discovery_config){
      .peer_digests = GN_DISCOVERY_PEER_DIGESTS,
      .peer_wants = GN_DISCOVERY_PEER_WANTS,
      .digests_per_period = GN_DISCOVERY_DIGESTS_PER_PERIOD,
      .peer_sync_bytes = GN_DISCOVERY_PEER_SYNC_BYTES,
      .sync_bytes = GN_DISCOVERY_SYNC_BYTES,
  };
}

int gn_discovery_set_config(gn_discovery *d, const gn_discovery_config *c) {
  if (!d || !c || !c->peer_digests || !c->peer_wants || !c->digests_per_period || !c->peer_sync_bytes ||
      !c->sync_bytes || c->peer_digests > c->digests_per_period || c->peer_sync_bytes > c->sync_bytes)
    return GN_EINVAL;
  d->cfg = *c;
  return 0;
}

void gn_discovery_set_fanout(gn_discovery *d, size_t fanout) {
  if (d)
    d->fanout = fanout ? fanout : GN_DISCOVERY_FANOUT;
}

void gn_discovery_neighbours_only(gn_discovery *d, bool only) {
  if (d)
    d->neighbours_only = only;
}

void gn_discovery_set_connect_peer(gn_discovery *d, gn_discovery_connect_peer_fn fn) {
  if (d)
    d->connect_peer = fn;
}

void gn_discovery_set_heard(gn_discovery *d, gn_discovery_heard_fn fn) {
  if (d)
    d->heard = fn;
}

int gn_discovery_set_self_addr(gn_discovery *d, const char *addr) {
  if (!addr || strlen(addr) >= ADDR_LEN)
    return GN_EINVAL;
  snprintf(d->self_addr, sizeof(d->self_addr), "%s", addr);
  return 0;
}

int gn_discovery_add_bootstrap(gn_discovery *d, const char *addr) {
  if (!addr || !*addr || strlen(addr) >= ADDR_LEN)
    return GN_EINVAL;
  for (size_t i = 0; i < d->nboot; i++)
    if (strcmp(d->boot[i].addr, addr) == 0)
      return 0;
  if (d->nboot == MAX_BOOTSTRAPS)
    return GN_ETOOBIG;
  memset(&d->boot[d->nboot], 0, sizeof(d->boot[0]));
  snprintf(d->boot[d->nboot].addr, ADDR_LEN, "%s", addr);
  d->nboot++;
  return 0;
}

size_t gn_discovery_up_count(const gn_discovery *d) {
  return d->nup;
}

static up_peer *find_up(gn_discovery *d, const uint8_t pk[GN_PK_LEN]) {
  for (size_t i = 0; i < d->nup; i++)
    if (memcmp(d->up[i].pk, pk, GN_PK_LEN) == 0)
      return &d->up[i];
  return NULL;
}

int gn_discovery_set_neighbour(gn_discovery *d, const uint8_t peer[GN_PK_LEN], bool neighbour) {
  up_peer *p = d && peer ? find_up(d, peer) : NULL;
  if (!p)
    return GN_ENOTFOUND;
  p->neighbour = neighbour;
  return 0;
}

static bool is_neighbour(const gn_discovery *d, const up_peer *p) {
  return !d->neighbours_only || p->neighbour;
}

static bool addr_is_up(const gn_discovery *d, const char *addr) {
  for (size_t i = 0; i < d->nup; i++)
    if (strcmp(d->up[i].addr, addr) == 0)
      return true;
  return false;
}

static uint64_t tag_of(const uint8_t pk[GN_PK_LEN]) {
  uint64_t v;
  memcpy(&v, pk, sizeof(v));
  return v;
}

static void put_be64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

static uint64_t siphash(const uint8_t key[SALT_LEN], const uint8_t *in, size_t len) {
  uint8_t h[crypto_shorthash_BYTES];
  uint64_t v = 0;
  crypto_shorthash(h, in, len, key);
  for (int i = 7; i >= 0; i--) /* little-endian, whatever the host's order: the hashes go on the wire */
    v = v << 8 | h[i];
  return v;
}

/* An offer's (provider, id, seq), or with type OFFER_WITHDRAW a withdrawal's
 * (provider, seq), hashed under key. */
static uint64_t item_hash(const uint8_t key[SALT_LEN], uint32_t type, const uint8_t provider[GN_PK_LEN],
                          const uint8_t id[ID_BYTES], uint64_t seq) {
  uint8_t in[1 + GN_PK_LEN + ID_BYTES + 8] = {(uint8_t)type};
  memcpy(in + 1, provider, GN_PK_LEN);
  if (id)
    memcpy(in + 1 + GN_PK_LEN, id, ID_BYTES);
  put_be64(in + 1 + GN_PK_LEN + ID_BYTES, seq);
  return siphash(key, in, sizeof(in));
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* "o-" + 12 hex digits to its 6 bytes. */
static void id_bytes(const char id[GN_OFFER_ID_STRLEN], uint8_t ret[ID_BYTES]) {
  for (int i = 0; i < ID_BYTES; i++) {
    int hi = hexval(id[2 + 2 * i]), lo = hexval(id[3 + 2 * i]);
    ret[i] = (uint8_t)((hi < 0 ? 0 : hi) << 4 | (lo < 0 ? 0 : lo));
  }
}

/* --- the anti-entropy budgets ----------------------------------------------*/

static void budget_window(gn_discovery *d, up_peer *p, int64_t now_s) {
  if (now_s - p->win_s >= GN_DISCOVERY_DIGEST_S || now_s < p->win_s) {
    p->win_s = now_s;
    p->digests_in = p->wants_in = 0;
    p->bytes_out = 0;
  }
  if (now_s - d->win_s >= GN_DISCOVERY_DIGEST_S || now_s < d->win_s) {
    d->win_s = now_s;
    d->digests_in = 0;
    d->bytes_out = 0;
  }
}

/* Sends env to p if both p's and the total budget allow: 0, or GN_EBUSY. */
static int send_budgeted(gn_discovery *d, up_peer *p, const uint8_t *env, size_t len) {
  if (p->bytes_out + len > d->cfg.peer_sync_bytes || d->bytes_out + len > d->cfg.sync_bytes)
    return GN_EBUSY;
  p->bytes_out += len;
  d->bytes_out += len;
  uint8_t pk[GN_PK_LEN];
  memcpy(pk, p->pk, GN_PK_LEN); /* p may move if the send reports the peer down */
  d->io.send(d->io.ud, pk, env, len);
  return 0;
}

/* --- push gossip ----------------------------------------------------------*/

static rumor *rumor_find(gn_discovery *d, uint64_t key) {
  for (size_t i = 0; i < RUMORS; i++)
    if (d->rumors[i].used && d->rumors[i].key == key)
      return &d->rumors[i];
  return NULL;
}

static rumor *rumor_new(gn_discovery *d, uint64_t key) {
  rumor *r = &d->rumors[d->rumor_next];
  d->rumor_next = (d->rumor_next + 1) % RUMORS;
  memset(r, 0, sizeof(*r));
  r->used = true;
  r->key = key;
  return r;
}

static bool rumor_has(const rumor *r, const uint8_t pk[GN_PK_LEN]) {
  uint64_t t = tag_of(pk);
  for (size_t i = 0; i < r->n; i++)
    if (r->peers[i] == t)
      return true;
  return false;
}

static void rumor_mark(rumor *r, const uint8_t pk[GN_PK_LEN]) {
  if (r->n < RUMOR_PEERS && !rumor_has(r, pk))
    r->peers[r->n++] = tag_of(pk);
}

/* Pushes raw to up to fanout random neighbours not known to have it. Send
 * failures are the transport's business (it closes the session and we hear
 * peer_down). */
static void gossip(gn_discovery *d, rumor *r, const uint8_t *raw, size_t len, size_t fanout) {
  /* Copy the candidates: a send may synchronously report a peer down. */
  uint8_t cand[GN_DISCOVERY_MAX_UP][GN_PK_LEN];
  size_t n = 0;
  for (size_t i = 0; i < d->nup; i++)
    if (is_neighbour(d, &d->up[i]) && !rumor_has(r, d->up[i].pk))
      memcpy(cand[n++], d->up[i].pk, GN_PK_LEN);
  for (size_t k = 0; k < n && k < fanout; k++) {
    size_t j = k + (size_t)(rnd(d) % (n - k)); /* a partial Fisher-Yates shuffle */
    uint8_t tmp[GN_PK_LEN];
    memcpy(tmp, cand[j], GN_PK_LEN);
    memcpy(cand[j], cand[k], GN_PK_LEN);
    memcpy(cand[k], tmp, GN_PK_LEN);
    rumor_mark(r, cand[k]);
    d->io.send(d->io.ud, cand[k], raw, len);
  }
}

static bool wanted_take(gn_discovery *d, uint64_t key, int64_t now_s, bool remove) {
  for (size_t i = 0; i < WANTED; i++)
    if (d->want[i].key == key && d->want[i].at_s && now_s - d->want[i].at_s < GN_DISCOVERY_WANT_RETRY_S) {
      if (remove)
        d->want[i].at_s = 0;
      return true;
    }
  return false;
}

static void wanted_put(gn_discovery *d, uint64_t key, int64_t now_s) {
  d->want[d->want_next].key = key;
  d->want[d->want_next].at_s = now_s ? now_s : 1;
  d->want_next = (d->want_next + 1) % WANTED;
}

static int on_offer(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                    size_t raw_len, int64_t now_s) {
  /* The table re-verifies the issuer's signature: a relayed offer is only
   * as good as its issuer's key, whoever handed it to us. */
  int r = gn_offer_table_put_from(d->table, raw, raw_len, now_s, peer);
  if (r < 0)
    return r;
  gn_offer *o = malloc(sizeof(*o)); /* 3 KiB: not on the stack of a callback */
  if (!o)
    return 0; /* stored; it only travels no further */
  if (gn_offer_decode(env->body, env->body_len, o) == 0) {
    char id[GN_OFFER_ID_STRLEN];
    uint8_t idb[ID_BYTES];
    gn_offer_id(o, id);
    id_bytes(id, idb);
    uint64_t key = item_hash(d->hkey, GN_MSG_OFFER, o->provider, idb, o->seq);
    rumor *ru = rumor_find(d, key);
    if (r == 1 && !ru) {
      /* One we asked for is old news elsewhere: it stops here. */
      if (!wanted_take(d, key, now_s, true)) {
        ru = rumor_new(d, key);
        rumor_mark(ru, peer);
        gossip(d, ru, raw, raw_len, d->fanout);
      }
    } else if (ru) {
      rumor_mark(ru, peer);
    }
  }
  free(o);
  return 0;
}

/* The {provider, seq} of a withdrawal's body. */
static int withdraw_parse(const gn_envelope *env, uint8_t provider[GN_PK_LEN], uint64_t *ret_seq) {
  gn_wire_doc doc;
  int r = gn_wire_decode(env->body, env->body_len, &doc);
  if (r < 0)
    return r;
  r = gn_wire_get_bin_exact(doc.root, "provider", provider, GN_PK_LEN);
  if (r == 0)
    r = gn_wire_get_u64(doc.root, "seq", ret_seq);
  gn_wire_doc_done(&doc);
  return r;
}

/* {provider, seq} of a withdrawal the table took, as its rumor key. */
static uint64_t withdraw_key(gn_discovery *d, const gn_envelope *env) {
  uint8_t provider[GN_PK_LEN];
  uint64_t seq = 0;
  if (withdraw_parse(env, provider, &seq) < 0)
    return 0;
  return item_hash(d->hkey, GN_MSG_OFFER_WITHDRAW, provider, NULL, seq);
}

/* Where a new withdrawal goes when all places are taken: an expired one,
 * else the one expiring first among those that dropped nothing here, else
 * (only for one that dropped something itself) the one expiring first. */
static withdrawal *withdrawal_victim(gn_discovery *d, bool dropped, int64_t now_s) {
  withdrawal *v = NULL;
  for (size_t i = 0; i < d->nwd; i++) {
    withdrawal *w = &d->wd[i];
    if (w->until_s <= now_s)
      return w;
    if ((!w->dropped || dropped) &&
        (!v || (v->dropped && !w->dropped) || (v->dropped == w->dropped && w->until_s < v->until_s)))
      v = w;
  }
  return v;
}

/* Keeps a withdrawal the table took (so it verified: signed by its
 * provider), to hand to peers that missed it. One per provider, the highest
 * seq; an older one changes nothing. When all places are taken, an expired
 * one makes room, else the one expiring first among those that dropped
 * nothing here; one that dropped nothing itself never pushes out one that
 * did (a flood of withdrawals from fresh identities, which cost nothing,
 * cannot push out those that repair real offers). */
static void withdrawal_keep(gn_discovery *d, const gn_envelope *env, const uint8_t *raw, size_t len, bool dropped,
                            int64_t now_s) {
  uint8_t provider[GN_PK_LEN];
  uint64_t seq;
  if (len > WITHDRAWAL_MAX || withdraw_parse(env, provider, &seq) < 0)
    return;
  withdrawal *w = NULL;
  for (size_t i = 0; i < d->nwd && !w; i++)
    if (memcmp(d->wd[i].provider, provider, GN_PK_LEN) == 0)
      w = &d->wd[i];
  if (w && seq <= w->seq) {
    w->dropped = w->dropped || (dropped && seq == w->seq);
    return;
  }
  if (!w && d->nwd < WITHDRAWALS)
    w = &d->wd[d->nwd++];
  if (!w)
    w = withdrawal_victim(d, dropped, now_s);
  if (!w)
    return;
  memcpy(w->provider, provider, GN_PK_LEN);
  w->seq = seq;
  w->until_s = now_s + WITHDRAWAL_KEEP_S;
  w->dropped = dropped;
  w->mark = 0;
  w->len = (uint16_t)len;
  memcpy(w->raw, raw, len);
}

/* The withdrawal we keep that covers provider's offer seq, or NULL. */
static withdrawal *withdrawal_covering(gn_discovery *d, const uint8_t provider[GN_PK_LEN], uint64_t seq,
                                       int64_t now_s) {
  for (size_t i = 0; i < d->nwd; i++)
    if (memcmp(d->wd[i].provider, provider, GN_PK_LEN) == 0)
      return seq <= d->wd[i].seq && d->wd[i].until_s > now_s ? &d->wd[i] : NULL;
  return NULL;
}

/* A withdrawal cannot be repaired by digests (they list live offers only),
 * and it is rare and small: it goes to every neighbour not seen with it. */
static void gossip_withdraw(gn_discovery *d, const uint8_t *peer, const gn_envelope *env, const uint8_t *raw,
                            size_t len, bool taken) {
  uint64_t key = withdraw_key(d, env);
  rumor *ru = rumor_find(d, key);
  if (ru && peer)
    rumor_mark(ru, peer);
  if (!taken || ru)
    return;
  ru = rumor_new(d, key);
  if (peer)
    rumor_mark(ru, peer);
  gossip(d, ru, raw, len, GN_DISCOVERY_MAX_UP);
}

/* --- digests --------------------------------------------------------------*/

static uint32_t buckets_for(size_t n) {
  uint32_t b = 1;
  while (b < GN_DISCOVERY_BUCKETS_MAX && (size_t)b * 4 < n)
    b *= 2;
  return b;
}

static uint32_t bucket_of(const uint8_t salt[SALT_LEN], const uint8_t provider[GN_PK_LEN], uint32_t b) {
  return (uint32_t)(siphash(salt, provider, GN_PK_LEN) & (b - 1));
}

static uint64_t entry_hash(const uint8_t salt[SALT_LEN], const gn_offer_entry *e) {
  uint8_t idb[ID_BYTES];
  id_bytes(e->id, idb);
  return item_hash(salt, GN_MSG_OFFER, e->offer.provider, idb, e->offer.seq);
}

/* The bucket hashes of the table under (salt, b): each the XOR of its
 * entries' hashes, 0 when empty. */
static void bucket_hashes(gn_discovery *d, const uint8_t salt[SALT_LEN], uint32_t b, uint64_t *ret_h) {
  memset(ret_h, 0, b * sizeof(*ret_h));
  size_t n = gn_offer_table_count(d->table);
  for (size_t i = 0; i < n; i++) {
    const gn_offer_entry *e = gn_offer_table_at(d->table, i);
    ret_h[bucket_of(salt, e->offer.provider, b)] ^= entry_hash(salt, e);
  }
}

static int seal_body(gn_discovery *d, uint32_t type, gn_wire_writer *w, gn_buf *ret_env) {
  gn_buf body = {0};
  int r = gn_wire_writer_take(w, &body);
  if (r == 0)
    r = gn_envelope_seal(d->self, type, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

/* OFFER_DIGEST {salt, b, h}: the summary. */
static int send_summary(gn_discovery *d, const uint8_t peer[GN_PK_LEN], int64_t now_s) {
  up_peer *p = find_up(d, peer);
  if (p) {
    p->summary_sent = true;
    p->summary_at_s = now_s;
  }
  gn_offer_table_expire(d->table, now_s);
  uint8_t salt[SALT_LEN];
  for (size_t i = 0; i < SALT_LEN; i++)
    salt[i] = (uint8_t)rnd(d);
  uint32_t b = buckets_for(gn_offer_table_count(d->table));
  uint64_t h[GN_DISCOVERY_BUCKETS_MAX];
  uint8_t hb[GN_DISCOVERY_BUCKETS_MAX * 8];
  bucket_hashes(d, salt, b, h);
  for (uint32_t i = 0; i < b; i++)
    put_be64(hb + 8 * i, h[i]);
  gn_wire_writer w;
  gn_buf env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "salt");
  gn_wire_put_bin(&w, salt, SALT_LEN);
  gn_wire_put_str(&w, "b");
  gn_wire_put_u64(&w, b);
  gn_wire_put_str(&w, "h");
  gn_wire_put_bin(&w, hb, 8 * (size_t)b);
  int r = seal_body(d, GN_MSG_OFFER_DIGEST, &w, &env);
  gn_wire_writer_done(&w);
  if (r == 0)
    d->io.send(d->io.ud, peer, env.data, env.len);
  gn_buf_done(&env);
  return r;
}

/* {salt: bin 16, b: power of two <= GN_DISCOVERY_BUCKETS_MAX}. */
static int get_salt_b(const msgpack_object *m, uint8_t salt[SALT_LEN], uint32_t *ret_b) {
  uint32_t b;
  int r;
  if ((r = gn_wire_get_bin_exact(m, "salt", salt, SALT_LEN)) < 0 || (r = gn_wire_get_u32(m, "b", &b)) < 0)
    return r;
  if (b == 0 || b > GN_DISCOVERY_BUCKETS_MAX || (b & (b - 1)) != 0)
    return GN_EINVAL;
  *ret_b = b;
  return 0;
}

/* The summary from p: we ask for the entries of the buckets that differ
 * from ours and in which p holds something. Where we hold something p's
 * hashes do not show, p may lack it: unless we sent p a summary this period,
 * we send one back, so that one summary syncs both ways. */
static int on_summary(gn_discovery *d, up_peer *p, const msgpack_object *m, int64_t now_s) {
  uint8_t salt[SALT_LEN];
  uint32_t b;
  const uint8_t *hb;
  size_t hlen;
  int r;
  if ((r = get_salt_b(m, salt, &b)) < 0 || (r = gn_wire_get_bin_ref(m, "h", 8 * (size_t)b, &hb, &hlen)) < 0)
    return r;
  if (hlen != 8 * (size_t)b)
    return GN_EINVAL;
  p->digests_in++;
  d->digests_in++;
  gn_offer_table_expire(d->table, now_s);
  uint64_t mine[GN_DISCOVERY_BUCKETS_MAX];
  bucket_hashes(d, salt, b, mine);
  uint32_t differ[GN_DISCOVERY_BUCKETS_MAX], n = 0;
  bool they_lack = false;
  static const uint8_t zero[8];
  for (uint32_t i = 0; i < b; i++) {
    uint8_t own[8];
    put_be64(own, mine[i]);
    if (memcmp(own, hb + 8 * i, 8) == 0)
      continue;
    if (memcmp(hb + 8 * i, zero, 8) != 0)
      differ[n++] = i;
    if (mine[i])
      they_lack = true;
  }
  if (they_lack && (!p->summary_sent || now_s - p->summary_at_s >= GN_DISCOVERY_DIGEST_S || now_s < p->summary_at_s)) {
    uint8_t pk[GN_PK_LEN];
    memcpy(pk, p->pk, GN_PK_LEN);
    if ((r = send_summary(d, pk, now_s)) < 0)
      return r;
    p = find_up(d, pk);
    if (!p)
      return 0; /* the send reported it down */
  }
  if (n == 0)
    return 0;
  gn_wire_writer w;
  gn_buf env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "salt");
  gn_wire_put_bin(&w, salt, SALT_LEN);
  gn_wire_put_str(&w, "b");
  gn_wire_put_u64(&w, b);
  gn_wire_put_str(&w, "buckets");
  gn_wire_put_array(&w, n);
  for (uint32_t i = 0; i < n; i++)
    gn_wire_put_u64(&w, differ[i]);
  r = seal_body(d, GN_MSG_OFFER_WANT, &w, &env);
  gn_wire_writer_done(&w);
  if (r == 0) {
    p->detail_until_s = now_s + 2 * GN_DISCOVERY_DIGEST_S;
    p->details_left = GN_DISCOVERY_DETAILS_PER_ASK;
    uint8_t pk[GN_PK_LEN];
    memcpy(pk, p->pk, GN_PK_LEN);
    d->io.send(d->io.ud, pk, env.data, env.len);
  }
  gn_buf_done(&env);
  return r;
}

/* One entry of a detail digest: [provider bin 32, id bin 6, seq, expires_s]. */
typedef struct detail_entry {
  uint8_t provider[GN_PK_LEN];
  uint8_t id[ID_BYTES];
  uint64_t seq;
  int64_t expires_s;
} detail_entry;

static int get_detail_entry(const msgpack_object *o, detail_entry *ret) {
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4)
    return GN_EINVAL;
  const msgpack_object *a = o->via.array.ptr;
  if (a[0].type != MSGPACK_OBJECT_BIN || a[0].via.bin.size != GN_PK_LEN || a[1].type != MSGPACK_OBJECT_BIN ||
      a[1].via.bin.size != ID_BYTES || a[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return GN_EINVAL;
  if (a[3].type == MSGPACK_OBJECT_POSITIVE_INTEGER && a[3].via.u64 <= INT64_MAX)
    ret->expires_s = (int64_t)a[3].via.u64;
  else if (a[3].type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
    ret->expires_s = a[3].via.i64;
  else
    return GN_EINVAL;
  memcpy(ret->provider, a[0].via.bin.ptr, GN_PK_LEN);
  memcpy(ret->id, a[1].via.bin.ptr, ID_BYTES);
  ret->seq = a[2].via.u64;
  return 0;
}

static int cmp_own(const void *x, const void *y) {
  const own_key *a = x, *b = y;
  int c = memcmp(a->provider, b->provider, GN_PK_LEN);
  return c ? c : memcmp(a->id, b->id, ID_BYTES);
}

/* A sorted copy of the table's keys (free it), or NULL when empty or out of
 * memory. Sorting once costs O(n log n) where a lookup per entry of a
 * message would cost O(n) each. */
static own_key *own_index(gn_discovery *d, size_t *ret_n) {
  size_t n = gn_offer_table_count(d->table);
  *ret_n = 0;
  own_key *k = n ? malloc(n * sizeof(*k)) : NULL;
  if (!k)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    const gn_offer_entry *e = gn_offer_table_at(d->table, i);
    memcpy(k[i].provider, e->offer.provider, GN_PK_LEN);
    id_bytes(e->id, k[i].id);
    k[i].seq = e->offer.seq;
    k[i].idx = i;
  }
  qsort(k, n, sizeof(*k), cmp_own);
  *ret_n = n;
  return k;
}

static const own_key *own_find(const own_key *k, size_t n, const uint8_t provider[GN_PK_LEN],
                               const uint8_t id[ID_BYTES]) {
  own_key probe;
  memcpy(probe.provider, provider, GN_PK_LEN);
  memcpy(probe.id, id, ID_BYTES);
  return n ? bsearch(&probe, k, n, sizeof(*k), cmp_own) : NULL;
}

/* A detail digest from p, which we asked for: we want what we lack or hold
 * older, and push what we hold newer. */
static int on_detail(gn_discovery *d, up_peer *p, const msgpack_object *m, int64_t now_s) {
  const msgpack_object_array *arr;
  int r;
  if ((r = gn_wire_get_array(m, "e", GN_DISCOVERY_DIGEST_ENTRIES, &arr)) < 0)
    return r;
  detail_entry *ents = arr->size ? malloc(arr->size * sizeof(*ents)) : NULL;
  if (arr->size && !ents)
    return GN_ENOMEM;
  for (uint32_t i = 0; i < arr->size; i++)
    if ((r = get_detail_entry(&arr->ptr[i], &ents[i])) < 0) {
      free(ents);
      return r;
    }
  if (now_s > p->detail_until_s || p->details_left == 0) {
    free(ents);
    return GN_ESTATE; /* nobody asked for it */
  }
  p->details_left--;
  p->digests_in++;
  d->digests_in++;
  gn_offer_table_expire(d->table, now_s);
  size_t nk;
  own_key *k = own_index(d, &nk);
  uint32_t nwant = 0;
  uint32_t *want = arr->size ? malloc(arr->size * sizeof(*want)) : NULL;
  size_t *push = arr->size ? malloc(arr->size * sizeof(*push)) : NULL;
  uint32_t npush = 0;
  /* Withdrawals p missed: those we keep that cover an offer it lists. */
  withdrawal **repair = arr->size ? malloc(arr->size * sizeof(*repair)) : NULL;
  uint32_t nrepair = 0;
  if (arr->size && (!want || !push || !repair)) {
    r = GN_ENOMEM;
    goto out;
  }
  if (++d->wd_mark == 0)
    d->wd_mark = 1;
  for (uint32_t i = 0; i < arr->size; i++) {
    const detail_entry *x = &ents[i];
    if (x->expires_s <= now_s + 1 || x->expires_s > now_s + EXPIRY_AHEAD_MAX_S)
      continue;
    withdrawal *wd = withdrawal_covering(d, x->provider, x->seq, now_s);
    if (wd) {
      if (wd->mark != d->wd_mark)
        repair[nrepair++] = wd;
      wd->mark = d->wd_mark;
      continue;
    }
    if (memcmp(x->provider, d->self->pk, GN_PK_LEN) == 0)
      continue;
    const own_key *o = own_find(k, nk, x->provider, x->id);
    if (o && o->seq > x->seq) {
      push[npush++] = o->idx;
      continue;
    }
    if ((o && o->seq == x->seq) || gn_offer_table_withdrawn(d->table, x->provider, x->seq))
      continue;
    uint64_t key = item_hash(d->hkey, GN_MSG_OFFER, x->provider, x->id, x->seq);
    if (wanted_take(d, key, now_s, false))
      continue;
    want[nwant++] = i;
  }
  if (nwant) {
    gn_wire_writer w;
    gn_buf env = {0};
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 1);
    gn_wire_put_str(&w, "offers");
    gn_wire_put_array(&w, nwant);
    for (uint32_t i = 0; i < nwant; i++) {
      gn_wire_put_array(&w, 2);
      gn_wire_put_bin(&w, ents[want[i]].provider, GN_PK_LEN);
      gn_wire_put_bin(&w, ents[want[i]].id, ID_BYTES);
    }
    r = seal_body(d, GN_MSG_OFFER_WANT, &w, &env);
    gn_wire_writer_done(&w);
    if (r == 0) {
      for (uint32_t i = 0; i < nwant; i++)
        wanted_put(d, item_hash(d->hkey, GN_MSG_OFFER, ents[want[i]].provider, ents[want[i]].id, ents[want[i]].seq),
                   now_s);
      uint8_t pk[GN_PK_LEN];
      memcpy(pk, p->pk, GN_PK_LEN);
      d->io.send(d->io.ud, pk, env.data, env.len);
    }
    gn_buf_done(&env);
  }
  /* Newer than the peer's: it would get them from us by its own digest
   * later; sending them now costs the same bytes, sooner. Copied first, as
   * sends may change the table. */
  for (uint32_t i = 0; i < npush && r == 0; i++) {
    const gn_offer_entry *e = gn_offer_table_at(d->table, push[i]);
    gn_buf copy = {0};
    if (e && gn_buf_append(&copy, e->raw, e->raw_len) == 0 && send_budgeted(d, p, copy.data, copy.len) < 0)
      npush = 0;
    gn_buf_done(&copy);
  }
  /* p lists offers a withdrawal we keep covers: it missed the withdrawal,
   * which it gets now (it verifies the provider's signature as for any). */
  for (uint32_t i = 0; i < nrepair && r == 0; i++) {
    uint8_t copy[WITHDRAWAL_MAX];
    size_t len = repair[i]->len;
    memcpy(copy, repair[i]->raw, len);
    if (send_budgeted(d, p, copy, len) < 0)
      break;
  }
out:
  free(repair);
  free(k);
  free(want);
  free(push);
  free(ents);
  return r;
}

/* The entries of our table in the buckets p asked for, as detail digests of
 * at most GN_DISCOVERY_DIGEST_ENTRIES each, within p's budget. */
static int on_want_buckets(gn_discovery *d, up_peer *p, const msgpack_object *m, int64_t now_s) {
  uint8_t salt[SALT_LEN];
  uint32_t b;
  const msgpack_object_array *arr;
  int r;
  if ((r = get_salt_b(m, salt, &b)) < 0 || (r = gn_wire_get_array(m, "buckets", b, &arr)) < 0)
    return r;
  uint8_t asked[GN_DISCOVERY_BUCKETS_MAX] = {0};
  for (uint32_t i = 0; i < arr->size; i++) {
    const msgpack_object *o = &arr->ptr[i];
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= b ||
        (i && o->via.u64 <= arr->ptr[i - 1].via.u64)) /* strictly increasing */
      return GN_EINVAL;
    asked[o->via.u64] = 1;
  }
  p->wants_in++;
  gn_offer_table_expire(d->table, now_s);
  size_t n = gn_offer_table_count(d->table);
  size_t *sel = n ? malloc(n * sizeof(*sel)) : NULL;
  size_t nsel = 0;
  if (n && !sel)
    return GN_ENOMEM;
  for (size_t i = 0; i < n; i++)
    if (asked[bucket_of(salt, gn_offer_table_at(d->table, i)->offer.provider, b)])
      sel[nsel++] = i;
  /* Sealed first, sent after: sends may change the table. */
  gn_buf msgs[8];
  size_t nmsg = 0;
  for (size_t at = 0; at < nsel && nmsg < GN_ARRAY_SIZE(msgs) && r == 0;) {
    size_t cnt = nsel - at < GN_DISCOVERY_DIGEST_ENTRIES ? nsel - at : GN_DISCOVERY_DIGEST_ENTRIES;
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn_wire_put_map(&w, 1);
    gn_wire_put_str(&w, "e");
    gn_wire_put_array(&w, (uint32_t)cnt);
    for (size_t k = 0; k < cnt; k++) {
      const gn_offer_entry *e = gn_offer_table_at(d->table, sel[at + k]);
      uint8_t idb[ID_BYTES];
      id_bytes(e->id, idb);
      gn_wire_put_array(&w, 4);
      gn_wire_put_bin(&w, e->offer.provider, GN_PK_LEN);
      gn_wire_put_bin(&w, idb, ID_BYTES);
      gn_wire_put_u64(&w, e->offer.seq);
      gn_wire_put_i64(&w, e->offer.expires_s);
    }
    msgs[nmsg] = (gn_buf){0};
    r = seal_body(d, GN_MSG_OFFER_DIGEST, &w, &msgs[nmsg]);
    gn_wire_writer_done(&w);
    if (r == 0)
      nmsg++;
    at += cnt;
  }
  free(sel);
  bool stop = false;
  for (size_t i = 0; i < nmsg; i++) {
    if (!stop && send_budgeted(d, p, msgs[i].data, msgs[i].len) < 0)
      stop = true;
    gn_buf_done(&msgs[i]);
  }
  return r;
}

/* The offers p names, sent as their issuers' envelopes within p's budget. */
static int on_want_offers(gn_discovery *d, up_peer *p, const msgpack_object *m, int64_t now_s) {
  const msgpack_object_array *arr;
  int r;
  if ((r = gn_wire_get_array(m, "offers", GN_DISCOVERY_WANT_ENTRIES, &arr)) < 0)
    return r;
  for (uint32_t i = 0; i < arr->size; i++) {
    const msgpack_object *o = &arr->ptr[i];
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 || o->via.array.ptr[0].type != MSGPACK_OBJECT_BIN ||
        o->via.array.ptr[0].via.bin.size != GN_PK_LEN || o->via.array.ptr[1].type != MSGPACK_OBJECT_BIN ||
        o->via.array.ptr[1].via.bin.size != ID_BYTES)
      return GN_EINVAL;
  }
  p->wants_in++;
  gn_offer_table_expire(d->table, now_s);
  size_t nk;
  own_key *k = own_index(d, &nk);
  /* Copies first: sends may change the table. */
  gn_buf *out = arr->size ? calloc(arr->size, sizeof(*out)) : NULL;
  size_t nout = 0;
  for (uint32_t i = 0; out && i < arr->size; i++) {
    const msgpack_object *a = arr->ptr[i].via.array.ptr;
    const own_key *x = own_find(k, nk, (const uint8_t *)a[0].via.bin.ptr, (const uint8_t *)a[1].via.bin.ptr);
    const gn_offer_entry *e = x ? gn_offer_table_at(d->table, x->idx) : NULL;
    if (e && gn_buf_append(&out[nout], e->raw, e->raw_len) == 0)
      nout++;
  }
  free(k);
  bool stop = false;
  for (size_t i = 0; i < nout; i++) {
    if (!stop && send_budgeted(d, p, out[i].data, out[i].len) < 0)
      stop = true;
    gn_buf_done(&out[i]);
  }
  free(out);
  return arr->size && !out ? GN_ENOMEM : 0;
}

/* OFFER_DIGEST and OFFER_WANT: signed by the peer at the other end of the
 * session, from a peer we track, within its budget; then exactly one form. */
static int on_sync(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, int64_t now_s) {
  if (memcmp(env->signer, peer, GN_PK_LEN) != 0)
    return GN_EPERM;
  up_peer *p = find_up(d, peer);
  if (!p) { /* not tracked: served within one budget that all such share */
    p = &d->stranger;
    memcpy(p->pk, peer, GN_PK_LEN);
  }
  budget_window(d, p, now_s);
  bool digest = env->type == GN_MSG_OFFER_DIGEST;
  if (digest && (p->digests_in >= d->cfg.peer_digests || d->digests_in >= d->cfg.digests_per_period))
    return GN_EBUSY;
  if (!digest && p->wants_in >= d->cfg.peer_wants)
    return GN_EBUSY;
  gn_wire_doc doc;
  int r = gn_wire_decode(env->body, env->body_len, &doc);
  if (r < 0)
    return r;
  const msgpack_object *m = doc.root;
  if (m->type != MSGPACK_OBJECT_MAP) {
    r = GN_EINVAL;
  } else if (digest) {
    bool h = gn_wire_get(m, "h") != NULL, e = gn_wire_get(m, "e") != NULL;
    r = h == e ? GN_EINVAL : h ? on_summary(d, p, m, now_s) : on_detail(d, p, m, now_s);
  } else {
    bool bk = gn_wire_get(m, "buckets") != NULL, of = gn_wire_get(m, "offers") != NULL;
    r = bk == of ? GN_EINVAL : bk ? on_want_buckets(d, p, m, now_s) : on_want_offers(d, p, m, now_s);
  }
  gn_wire_doc_done(&doc);
  return r;
}

/* --- PEERS ----------------------------------------------------------------*/

/* {peers: [{id, addr}]}: up peers with a listen address, minus the
 * recipient, at most GN_DISCOVERY_MAX_PEERS_MSG. */
static int peers_message(gn_discovery *d, const uint8_t to[GN_PK_LEN], gn_buf *ret_env) {
  size_t idx[GN_DISCOVERY_MAX_UP], n = 0;
  for (size_t i = 0; i < d->nup && n < GN_DISCOVERY_MAX_PEERS_MSG; i++)
    if (d->up[i].addr[0] && memcmp(d->up[i].pk, to, GN_PK_LEN) != 0)
      idx[n++] = i;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "peers");
  gn_wire_put_array(&w, (uint32_t)n);
  for (size_t k = 0; k < n; k++) {
    gn_wire_put_map(&w, 2);
    gn_wire_put_str(&w, "id");
    gn_wire_put_bin(&w, d->up[idx[k]].pk, GN_PK_LEN);
    gn_wire_put_str(&w, "addr");
    gn_wire_put_str(&w, d->up[idx[k]].addr);
  }
  int r = seal_body(d, GN_MSG_PEERS, &w, ret_env);
  gn_wire_writer_done(&w);
  return r;
}

int gn_discovery_peer_up(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const char *addr, int64_t now_s) {
  if (!d || !peer)
    return GN_EINVAL;
  up_peer *p = find_up(d, peer);
  if (!p && d->nup < GN_DISCOVERY_MAX_UP) {
    p = &d->up[d->nup++];
    memset(p, 0, sizeof(*p));
    p->win_s = now_s;
  }
  if (p) {
    memcpy(p->pk, peer, GN_PK_LEN);
    snprintf(p->addr, sizeof(p->addr), "%s", addr && strlen(addr) < ADDR_LEN ? addr : "");
  }
  for (size_t i = 0; addr && i < d->nboot; i++)
    if (strcmp(d->boot[i].addr, addr) == 0)
      d->boot[i].reached = true;
  gn_buf env = {0};
  int r = peers_message(d, peer, &env);
  if (r == 0)
    d->io.send(d->io.ud, peer, env.data, env.len);
  gn_buf_done(&env);
  /* What we hold, summarised: the peer asks for what it lacks. */
  int r2 = send_summary(d, peer, now_s);
  return r < 0 ? r : r2;
}

void gn_discovery_peer_down(gn_discovery *d, const uint8_t peer[GN_PK_LEN], int64_t now_s) {
  (void)now_s;
  up_peer *p = find_up(d, peer);
  if (p) {
    *p = d->up[d->nup - 1];
    d->nup--;
  }
  /* Its own offers only: relayed ones stay, their issuers may still be up.
   * With partial views a session closes when the views no longer want it,
   * not only when its peer is gone: the membership drops a dead or departed
   * member's offers then (node/overlay.c). */
  if (!d->neighbours_only)
    gn_offer_table_remove_provider(d->table, peer);
}

static bool recently_dialled(gn_discovery *d, const char *addr, int64_t now_s) {
  for (size_t i = 0; i < d->ndial; i++)
    if (strcmp(d->dial[i].addr, addr) == 0 && now_s - d->dial[i].at_s < GN_DISCOVERY_REDIAL_AFTER_S)
      return true;
  return false;
}

static void remember_dial(gn_discovery *d, const char *addr, int64_t now_s) {
  for (size_t i = 0; i < d->ndial; i++)
    if (strcmp(d->dial[i].addr, addr) == 0) {
      d->dial[i].at_s = now_s;
      return;
    }
  dialled *x = &d->dial[d->dial_next];
  d->dial_next = (d->dial_next + 1) % DIAL_MEMORY;
  if (d->ndial < DIAL_MEMORY)
    d->ndial++;
  snprintf(x->addr, sizeof(x->addr), "%s", addr);
  x->at_s = now_s;
}

/* The token bucket of dials from hearsay: refilled at
 * GN_DISCOVERY_DIALS_PER_MIN a minute, holding at most that many. */
static bool dial_token(gn_discovery *d, int64_t now_s) {
  if (!d->dial_started) {
    d->dial_started = true;
    d->dial_tokens_m = DIAL_BURST;
    d->dial_refill_s = now_s;
  }
  if (now_s > d->dial_refill_s) {
    int64_t add = (now_s - d->dial_refill_s) * GN_DISCOVERY_DIALS_PER_MIN * TOKEN / 60;
    d->dial_tokens_m = d->dial_tokens_m + add > DIAL_BURST ? DIAL_BURST : d->dial_tokens_m + add;
    d->dial_refill_s = now_s;
  }
  if (d->dial_tokens_m < TOKEN)
    return false;
  d->dial_tokens_m -= TOKEN;
  return true;
}

static int on_peers(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, int64_t now_s) {
  gn_wire_doc doc;
  const msgpack_object_array *arr;
  /* PEERS is about the sender's own neighbourhood; nobody relays it. */
  if (memcmp(env->signer, peer, GN_PK_LEN) != 0)
    return GN_EPERM;
  /* One accepted per peer and period, from peers we track only: each entry
   * may cost a dial. */
  up_peer *p = find_up(d, peer);
  if (!p || (p->peers_seen && now_s - p->peers_at_s < GN_DISCOVERY_PEERS_EVERY_S && now_s >= p->peers_at_s))
    return GN_EBUSY;
  int r = gn_wire_decode(env->body, env->body_len, &doc);
  if (r < 0)
    return r;
  if ((r = gn_wire_get_array(doc.root, "peers", GN_DISCOVERY_MAX_PEERS_MSG, &arr)) < 0)
    goto out;
  /* Validate every entry before acting on any. */
  for (uint32_t i = 0; i < arr->size; i++) {
    uint8_t id[GN_PK_LEN];
    char addr[ADDR_LEN];
    if ((r = gn_wire_get_bin_exact(&arr->ptr[i], "id", id, GN_PK_LEN)) < 0 ||
        (r = gn_wire_get_str(&arr->ptr[i], "addr", addr, sizeof(addr))) < 0)
      goto out;
  }
  p->peers_seen = true;
  p->peers_at_s = now_s;
  if (d->heard) {
    /* Names only: the peer table and the views decide whom to dial. */
    for (uint32_t i = 0; i < arr->size; i++) {
      uint8_t id[GN_PK_LEN];
      char addr[ADDR_LEN];
      gn_wire_get_bin_exact(&arr->ptr[i], "id", id, GN_PK_LEN);
      gn_wire_get_str(&arr->ptr[i], "addr", addr, sizeof(addr));
      if (addr[0] && memcmp(id, d->self->pk, GN_PK_LEN) != 0 && strcmp(addr, d->self_addr) != 0 && !find_up(d, id))
        d->heard(d->io.ud, id, addr);
    }
    r = 0;
    goto out;
  }
  size_t started = 0;
  for (uint32_t i = 0; i < arr->size && started < GN_DISCOVERY_PEERS_DIALS && d->nup < GN_DISCOVERY_MAX_UP; i++) {
    uint8_t id[GN_PK_LEN];
    char addr[ADDR_LEN];
    gn_wire_get_bin_exact(&arr->ptr[i], "id", id, GN_PK_LEN);
    gn_wire_get_str(&arr->ptr[i], "addr", addr, sizeof(addr));
    if (!addr[0] || memcmp(id, d->self->pk, GN_PK_LEN) == 0 || strcmp(addr, d->self_addr) == 0 || find_up(d, id) ||
        addr_is_up(d, addr) || recently_dialled(d, addr, now_s))
      continue;
    if (!dial_token(d, now_s))
      break;
    remember_dial(d, addr, now_s);
    /* The entry names a key with the address: hold the dial to it. */
    if (d->connect_peer)
      d->connect_peer(d->io.ud, addr, id);
    else
      d->io.connect(d->io.ud, addr);
    started++;
  }
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

/* --- messages, publication, time ------------------------------------------*/

int gn_discovery_on_message(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                            size_t raw_len, int64_t now_s) {
  int r;
  if (!d || !peer || !env || !raw)
    return GN_EINVAL;
  switch (env->type) {
  case GN_MSG_PEERS:
    return on_peers(d, peer, env, now_s);
  case GN_MSG_OFFER:
    return on_offer(d, peer, env, raw, raw_len, now_s);
  case GN_MSG_OFFER_WITHDRAW:
    if ((r = gn_offer_table_withdraw(d->table, raw, raw_len)) < 0)
      return r;
    withdrawal_keep(d, env, raw, raw_len, r > 0, now_s);
    gossip_withdraw(d, peer, env, raw, raw_len, r > 0);
    return 0;
  case GN_MSG_OFFER_DIGEST:
  case GN_MSG_OFFER_WANT:
    return on_sync(d, peer, env, now_s);
  default:
    return GN_ENOTFOUND;
  }
}

int gn_discovery_publish(gn_discovery *d, const uint8_t *raw_env, size_t len, int64_t now_s) {
  gn_envelope env;
  int r;
  if (!d || !raw_env)
    return GN_EINVAL;
  if ((r = gn_envelope_open(raw_env, len, &env)) < 0)
    return r;
  if (memcmp(env.signer, d->self->pk, GN_PK_LEN) != 0)
    return GN_EPERM;
  if (env.type == GN_MSG_OFFER) {
    if ((r = gn_offer_table_put_from(d->table, raw_env, len, now_s, d->self->pk)) < 0)
      return r;
    if (r > 0) {
      gn_offer o;
      char id[GN_OFFER_ID_STRLEN];
      uint8_t idb[ID_BYTES];
      if (gn_offer_decode(env.body, env.body_len, &o) == 0) {
        gn_offer_id(&o, id);
        id_bytes(id, idb);
        gossip(d, rumor_new(d, item_hash(d->hkey, GN_MSG_OFFER, o.provider, idb, o.seq)), raw_env, len, d->fanout);
      }
    }
    return 0;
  }
  if (env.type != GN_MSG_OFFER_WITHDRAW)
    return GN_EINVAL;
  if ((r = gn_offer_table_withdraw(d->table, raw_env, len)) < 0)
    return r;
  withdrawal_keep(d, &env, raw_env, len, true, now_s);
  /* A withdrawal goes out even if we held nothing: peers may still. */
  gossip_withdraw(d, NULL, &env, raw_env, len, true);
  return 0;
}

void gn_discovery_tick(gn_discovery *d, int64_t now_s) {
  if (!d)
    return;
  gn_offer_table_expire(d->table, now_s);
  for (size_t i = 0; i < d->nboot; i++) {
    bootstrap *b = &d->boot[i];
    if (addr_is_up(d, b->addr))
      b->reached = true;
    if (addr_is_up(d, b->addr) || strcmp(b->addr, d->self_addr) == 0 || (b->reached && d->neighbours_only))
      continue;
    if (b->tried && now_s - b->last_s < GN_DISCOVERY_BOOTSTRAP_RETRY_S)
      continue;
    b->tried = true;
    b->last_s = now_s;
    d->io.connect(d->io.ud, b->addr);
  }
  if (!d->digest_started || now_s >= d->next_digest_s || now_s < d->next_digest_s - GN_DISCOVERY_DIGEST_S) {
    /* The first at a random point of the period, so that nodes started
     * together do not send theirs in step. */
    bool first = !d->digest_started;
    d->digest_started = true;
    d->next_digest_s = now_s + (first ? 1 + (int64_t)(rnd(d) % GN_DISCOVERY_DIGEST_S) : GN_DISCOVERY_DIGEST_S);
    if (first)
      return;
    size_t cand[GN_DISCOVERY_MAX_UP], n = 0;
    for (size_t i = 0; i < d->nup; i++)
      if (is_neighbour(d, &d->up[i]))
        cand[n++] = i;
    if (n) {
      uint8_t pk[GN_PK_LEN];
      memcpy(pk, d->up[cand[rnd(d) % n]].pk, GN_PK_LEN);
      send_summary(d, pk, now_s);
    }
  }
}
