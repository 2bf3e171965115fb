/* The node's one table of known peers (include/gpunet/peertab.h): a flat
 * bounded array, scanned linearly (a thousand entries, touched once per
 * session event, per name heard and per second), with one eviction policy
 * and the rule that picks the sessions nobody needs any more. */
#include <gpunet/peertab.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gn_peertab {
  gn_peertab_config cfg;
  size_t n;
  gn_peertab_entry e[]; /* cfg.cap of them */
};

void gn_peertab_config_default(gn_peertab_config *ret_cfg) {
  *ret_cfg = (gn_peertab_config){
      .cap = 1024, .grace_ms = 30000, .release_ms = 5000, .backoff_ms = 2000, .backoff_max_ms = 300000};
}

int gn_peertab_new(const gn_peertab_config *cfg, gn_peertab **ret_pt) {
  gn_peertab_config c;
  if (!ret_pt)
    return GN_EINVAL;
  if (cfg)
    c = *cfg;
  else
    gn_peertab_config_default(&c);
  if (!c.cap || c.cap > GN_PEERTAB_CAP_MAX || !c.grace_ms || !c.release_ms || c.release_ms > c.grace_ms ||
      !c.backoff_ms || c.backoff_max_ms < c.backoff_ms)
    return GN_EINVAL;
  gn_peertab *pt = calloc(1, sizeof(*pt) + c.cap * sizeof(pt->e[0]));
  if (!pt)
    return GN_ENOMEM;
  pt->cfg = c;
  *ret_pt = pt;
  return 0;
}

gn_peertab *gn_peertab_free(gn_peertab *pt) {
  free(pt);
  return NULL;
}

static gn_peertab_entry *find(const gn_peertab *pt, const uint8_t id[GN_PK_LEN]) {
  for (size_t i = 0; i < pt->n; i++)
    if (memcmp(pt->e[i].id, id, GN_PK_LEN) == 0)
      return (gn_peertab_entry *)&pt->e[i];
  return NULL;
}

/* Proven entries are those a session verified or the config named: hearsay
 * never evicts them. */
static bool proven(const gn_peertab_entry *e) {
  return e->verified || e->source == GN_PEER_BOOTSTRAP;
}

/* A place for a new entry: a free one, else the victim of the policy (the
 * least recently seen entry without a session, hearsay before proven ones;
 * proven ones only when the newcomer is proven itself). NULL when none. */
static gn_peertab_entry *place(gn_peertab *pt, bool newcomer_proven) {
  if (pt->n < pt->cfg.cap)
    return &pt->e[pt->n++];
  gn_peertab_entry *v = NULL;
  for (size_t i = 0; i < pt->n; i++) {
    gn_peertab_entry *e = &pt->e[i];
    if (e->up || (proven(e) && !newcomer_proven))
      continue;
    if (!v || proven(v) > proven(e) || (proven(v) == proven(e) && e->last_seen_ms < v->last_seen_ms))
      v = e;
  }
  return v;
}

static bool addr_fits(const char *addr) {
  return addr && strlen(addr) < GN_PEERTAB_ADDR_MAX;
}

int gn_peertab_heard(gn_peertab *pt, const uint8_t id[GN_PK_LEN], const char *addr, gn_peer_source source,
                     uint64_t now_ms) {
  if (!pt || !id || !addr_fits(addr) || (source != GN_PEER_HEARSAY && source != GN_PEER_BOOTSTRAP))
    return GN_EINVAL;
  gn_peertab_entry *e = find(pt, id);
  if (e) {
    if (!e->addr[0])
      snprintf(e->addr, sizeof(e->addr), "%s", addr);
    if (source == GN_PEER_BOOTSTRAP)
      e->source = GN_PEER_BOOTSTRAP;
    if (now_ms > e->last_seen_ms)
      e->last_seen_ms = now_ms;
    return 0;
  }
  if (!(e = place(pt, source == GN_PEER_BOOTSTRAP)))
    return GN_EBUSY;
  memset(e, 0, sizeof(*e));
  memcpy(e->id, id, GN_PK_LEN);
  snprintf(e->addr, sizeof(e->addr), "%s", addr);
  e->source = source;
  e->last_seen_ms = now_ms;
  return 1;
}

int gn_peertab_session_up(gn_peertab *pt, const uint8_t id[GN_PK_LEN], const char *addr, bool inbound,
                          uint64_t now_ms) {
  if (!pt || !id)
    return GN_EINVAL;
  gn_peertab_entry *e = find(pt, id);
  if (!e) {
    if (!(e = place(pt, true)))
      return GN_EBUSY;
    memset(e, 0, sizeof(*e));
    memcpy(e->id, id, GN_PK_LEN);
    e->source = inbound ? GN_PEER_INBOUND : GN_PEER_DIALLED;
  }
  if (addr_fits(addr) && addr[0])
    snprintf(e->addr, sizeof(e->addr), "%s", addr);
  e->verified = e->up = true;
  e->inbound = inbound;
  e->wanted = false;
  e->last_seen_ms = e->up_since_ms = e->unwanted_since_ms = now_ms;
  e->busy_ms = e->released_ms = 0;
  e->failures = 0;
  e->backoff_until_ms = 0;
  return 0;
}

void gn_peertab_session_down(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms) {
  gn_peertab_entry *e = pt && id ? find(pt, id) : NULL;
  if (!e)
    return;
  e->up = e->wanted = false;
  e->last_seen_ms = now_ms;
}

void gn_peertab_set_wanted(gn_peertab *pt, const uint8_t id[GN_PK_LEN], bool wanted, uint64_t now_ms) {
  gn_peertab_entry *e = pt && id ? find(pt, id) : NULL;
  if (!e || !e->up)
    return;
  if (e->wanted && !wanted)
    e->unwanted_since_ms = now_ms;
  if (wanted)
    e->released_ms = 0;
  e->wanted = wanted;
}

void gn_peertab_release(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms) {
  gn_peertab_entry *e = pt && id ? find(pt, id) : NULL;
  if (!e || !e->up)
    return;
  if (e->wanted) {
    e->wanted = false;
    e->unwanted_since_ms = now_ms;
  }
  e->released_ms = now_ms ? now_ms : 1;
}

void gn_peertab_mark_busy(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms) {
  gn_peertab_entry *e = pt && id ? find(pt, id) : NULL;
  if (e && now_ms > e->busy_ms)
    e->busy_ms = now_ms;
}

void gn_peertab_dial_failed(gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms) {
  gn_peertab_entry *e = pt && id ? find(pt, id) : NULL;
  if (!e || e->up)
    return;
  uint64_t ms = pt->cfg.backoff_ms;
  for (uint32_t i = 0; i < e->failures && ms < pt->cfg.backoff_max_ms; i++)
    ms *= 2;
  if (ms > pt->cfg.backoff_max_ms)
    ms = pt->cfg.backoff_max_ms;
  if (e->failures < UINT32_MAX)
    e->failures++;
  e->backoff_until_ms = now_ms + ms;
}

bool gn_peertab_backed_off(const gn_peertab *pt, const uint8_t id[GN_PK_LEN], uint64_t now_ms) {
  const gn_peertab_entry *e = pt && id ? find(pt, id) : NULL;
  return e && now_ms < e->backoff_until_ms;
}

static bool elapsed(uint64_t since, uint64_t now, uint64_t ms) {
  return now >= since && now - since >= ms;
}

size_t gn_peertab_to_close(const gn_peertab *pt, uint64_t now_ms, uint8_t (*ret_ids)[GN_PK_LEN], size_t cap) {
  size_t n = 0;
  uint64_t g = pt->cfg.grace_ms;
  for (size_t i = 0; i < pt->n; i++) {
    const gn_peertab_entry *e = &pt->e[i];
    if (!e->up || e->wanted || (e->busy_ms && !elapsed(e->busy_ms, now_ms, g)))
      continue;
    bool released = e->released_ms && elapsed(e->released_ms, now_ms, pt->cfg.release_ms);
    if (!released && (!elapsed(e->up_since_ms, now_ms, g) || !elapsed(e->unwanted_since_ms, now_ms, g)))
      continue;
    if (n < cap)
      memcpy(ret_ids[n], e->id, GN_PK_LEN);
    n++;
  }
  return n;
}

const gn_peertab_entry *gn_peertab_find(const gn_peertab *pt, const uint8_t id[GN_PK_LEN]) {
  return pt && id ? find(pt, id) : NULL;
}

size_t gn_peertab_count(const gn_peertab *pt) {
  return pt ? pt->n : 0;
}

size_t gn_peertab_up_count(const gn_peertab *pt) {
  size_t n = 0;
  for (size_t i = 0; pt && i < pt->n; i++)
    n += pt->e[i].up;
  return n;
}

const gn_peertab_entry *gn_peertab_at(const gn_peertab *pt, size_t i) {
  return pt && i < pt->n ? &pt->e[i] : NULL;
}
