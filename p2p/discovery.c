/* Discovery as an I/O-free state machine: peers exchange PEERS lists when a
 * session comes up, and offers and withdrawals are flooded, with the offer
 * table's sequence numbers as the dedupe that stops the flood. */
#include <gpunet/discovery.h>

#include <stdio.h>

#define ADDR_LEN 64
#define MAX_BOOTSTRAPS 16
#define DIAL_MEMORY 256   /* addresses we dialled recently */
#define REDIAL_AFTER_S 60 /* before dialling an address learnt from PEERS again */

typedef struct up_peer {
  uint8_t pk[GN_PK_LEN];
  char addr[ADDR_LEN];
} up_peer;

typedef struct dialled {
  char addr[ADDR_LEN];
  int64_t at_s;
} dialled;

typedef struct bootstrap {
  char addr[ADDR_LEN];
  int64_t last_s;
  bool tried;
} bootstrap;

struct gn_discovery {
  const gn_identity *self;
  gn_discovery_io io;
  gn_discovery_connect_peer_fn connect_peer;
  gn_offer_table *table;
  char self_addr[ADDR_LEN];
  up_peer up[GN_DISCOVERY_MAX_UP];
  size_t nup;
  dialled dial[DIAL_MEMORY];
  size_t ndial, dial_next;
  bootstrap boot[MAX_BOOTSTRAPS];
  size_t nboot;
};

int gn_discovery_new(const gn_identity *self, const gn_discovery_io *io, gn_offer_table *table, gn_discovery **ret_d) {
  if (!self || !io || !io->send || !io->connect || !table || !ret_d)
    return GN_EINVAL;
  gn_discovery *d = calloc(1, sizeof(*d));
  if (!d)
    return GN_ENOMEM;
  d->self = self;
  d->io = *io;
  d->table = table;
  gn_offer_table_set_self(table, self->pk); /* our offers are never evicted */
  *ret_d = d;
  return 0;
}

gn_discovery *gn_discovery_free(gn_discovery *d) {
  free(d);
  return NULL;
}

void gn_discovery_set_connect_peer(gn_discovery *d, gn_discovery_connect_peer_fn fn) {
  if (d)
    d->connect_peer = fn;
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

static bool addr_is_up(const gn_discovery *d, const char *addr) {
  for (size_t i = 0; i < d->nup; i++)
    if (strcmp(d->up[i].addr, addr) == 0)
      return true;
  return false;
}

/* Sends raw to every up peer but `except` (may be NULL). Send failures are
 * the transport's business (it closes the session and we hear peer_down). */
static void flood(gn_discovery *d, const uint8_t *except, const uint8_t *raw, size_t len) {
  /* Copy the list: a send may synchronously report a peer down. */
  up_peer peers[GN_DISCOVERY_MAX_UP];
  size_t n = d->nup;
  memcpy(peers, d->up, n * sizeof(peers[0]));
  for (size_t i = 0; i < n; i++)
    if (!except || memcmp(peers[i].pk, except, GN_PK_LEN) != 0)
      d->io.send(d->io.ud, peers[i].pk, raw, len);
}

/* {peers: [{id, addr}]}: up peers with a listen address, minus the
 * recipient, at most GN_DISCOVERY_MAX_PEERS_MSG. */
static int peers_message(gn_discovery *d, const uint8_t to[GN_PK_LEN], gn_buf *ret_env) {
  size_t idx[GN_DISCOVERY_MAX_UP], n = 0;
  for (size_t i = 0; i < d->nup && n < GN_DISCOVERY_MAX_PEERS_MSG; i++)
    if (d->up[i].addr[0] && memcmp(d->up[i].pk, to, GN_PK_LEN) != 0)
      idx[n++] = i;
  gn_wire_writer w;
  gn_buf body = {0};
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
  int r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(d->self, GN_MSG_PEERS, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

int gn_discovery_peer_up(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const char *addr, int64_t now_s) {
  (void)now_s;
  if (!peer)
    return GN_EINVAL;
  up_peer *p = find_up(d, peer);
  if (!p && d->nup < GN_DISCOVERY_MAX_UP)
    p = &d->up[d->nup++];
  if (p) {
    memcpy(p->pk, peer, GN_PK_LEN);
    snprintf(p->addr, sizeof(p->addr), "%s", addr && strlen(addr) < ADDR_LEN ? addr : "");
  }
  gn_buf env = {0};
  int r = peers_message(d, peer, &env);
  if (r == 0)
    d->io.send(d->io.ud, peer, env.data, env.len);
  gn_buf_done(&env);
  /* Copy the offers first: the table may change under a synchronous send. */
  size_t n = gn_offer_table_count(d->table);
  for (size_t i = 0; i < n; i++) {
    const gn_offer_entry *e = gn_offer_table_at(d->table, i);
    if (!e)
      break;
    gn_buf copy = {0};
    if (gn_buf_append(&copy, e->raw, e->raw_len) == 0)
      d->io.send(d->io.ud, peer, copy.data, copy.len);
    gn_buf_done(&copy);
  }
  return r;
}

void gn_discovery_peer_down(gn_discovery *d, const uint8_t peer[GN_PK_LEN], int64_t now_s) {
  (void)now_s;
  up_peer *p = find_up(d, peer);
  if (p) {
    *p = d->up[d->nup - 1];
    d->nup--;
  }
  /* Its own offers only: relayed ones stay, their issuers may still be up. */
  gn_offer_table_remove_provider(d->table, peer);
}

static bool recently_dialled(gn_discovery *d, const char *addr, int64_t now_s) {
  for (size_t i = 0; i < d->ndial; i++)
    if (strcmp(d->dial[i].addr, addr) == 0 && now_s - d->dial[i].at_s < REDIAL_AFTER_S)
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

static int on_peers(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, int64_t now_s) {
  gn_wire_doc doc;
  const msgpack_object_array *arr;
  /* PEERS is about the sender's own neighbourhood; nobody relays it. */
  if (memcmp(env->signer, peer, GN_PK_LEN) != 0)
    return GN_EPERM;
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
  size_t started = 0;
  for (uint32_t i = 0; i < arr->size && started < GN_DISCOVERY_FANOUT && d->nup < GN_DISCOVERY_MAX_UP; i++) {
    uint8_t id[GN_PK_LEN];
    char addr[ADDR_LEN];
    gn_wire_get_bin_exact(&arr->ptr[i], "id", id, GN_PK_LEN);
    gn_wire_get_str(&arr->ptr[i], "addr", addr, sizeof(addr));
    if (!addr[0] || memcmp(id, d->self->pk, GN_PK_LEN) == 0 || strcmp(addr, d->self_addr) == 0 || find_up(d, id) ||
        addr_is_up(d, addr) || recently_dialled(d, addr, now_s))
      continue;
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

int gn_discovery_on_message(gn_discovery *d, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                            size_t raw_len, int64_t now_s) {
  int r;
  if (!d || !peer || !env || !raw)
    return GN_EINVAL;
  switch (env->type) {
  case GN_MSG_PEERS:
    return on_peers(d, peer, env, now_s);
  case GN_MSG_OFFER:
    /* The table re-verifies the issuer's signature: a relayed offer is only
     * as good as its issuer's key, whoever handed it to us. */
    if ((r = gn_offer_table_put_from(d->table, raw, raw_len, now_s, peer)) < 0)
      return r;
    if (r == 1)
      flood(d, peer, raw, raw_len);
    return 0;
  case GN_MSG_OFFER_WITHDRAW:
    if ((r = gn_offer_table_withdraw(d->table, raw, raw_len)) < 0)
      return r;
    if (r > 0)
      flood(d, peer, raw, raw_len);
    return 0;
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
  if (env.type == GN_MSG_OFFER)
    r = gn_offer_table_put_from(d->table, raw_env, len, now_s, d->self->pk);
  else if (env.type == GN_MSG_OFFER_WITHDRAW)
    r = gn_offer_table_withdraw(d->table, raw_env, len);
  else
    return GN_EINVAL;
  if (r < 0)
    return r;
  /* A withdrawal goes out even if we held nothing: peers may still. */
  if (r > 0 || env.type == GN_MSG_OFFER_WITHDRAW)
    flood(d, NULL, raw_env, len);
  return 0;
}

void gn_discovery_tick(gn_discovery *d, int64_t now_s) {
  if (!d)
    return;
  gn_offer_table_expire(d->table, now_s);
  for (size_t i = 0; i < d->nboot; i++) {
    bootstrap *b = &d->boot[i];
    if (addr_is_up(d, b->addr) || strcmp(b->addr, d->self_addr) == 0)
      continue;
    if (b->tried && now_s - b->last_s < GN_DISCOVERY_BOOTSTRAP_RETRY_S)
      continue;
    b->tried = true;
    b->last_s = now_s;
    d->io.connect(d->io.ud, b->addr);
  }
}
