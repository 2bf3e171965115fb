/* The job network's pure half: WireGuard keys and their text form, interface
 * names, the job subnet and rank addresses, the MTU, endpoint and config
 * validation, and the configuration text for wireguard-go. Everything here
 * treats its input as hostile: configs carry what other providers and the
 * requester sent in signed manifests. */
#include "jobnet_int.h"

#include <arpa/inet.h>
#include <sodium.h>
#include <stdio.h>
#include <unistd.h>

static bool all_zero(const uint8_t *p, size_t n) {
  return sodium_is_zero(p, n) == 1;
}

/* --- keys ----------------------------------------------------------------*/

int gn_jobnet_public_key(const uint8_t private_key[GN_JOBNET_KEY_LEN], uint8_t ret_public[GN_JOBNET_KEY_LEN]) {
  if (!private_key || !ret_public || all_zero(private_key, GN_JOBNET_KEY_LEN))
    return GN_EINVAL;
  if (sodium_init() < 0)
    return GN_EIO;
  /* crypto_scalarmult_base clamps the scalar itself, as WireGuard does. */
  uint8_t pub[GN_JOBNET_KEY_LEN];
  if (crypto_scalarmult_base(pub, private_key) != 0)
    return GN_EINVAL;
  memcpy(ret_public, pub, sizeof pub);
  return 0;
}

int gn_jobnet_keypair(uint8_t ret_private[GN_JOBNET_KEY_LEN], uint8_t ret_public[GN_JOBNET_KEY_LEN]) {
  if (!ret_private || !ret_public)
    return GN_EINVAL;
  if (sodium_init() < 0)
    return GN_EIO;
  uint8_t k[GN_JOBNET_KEY_LEN];
  randombytes_buf(k, sizeof k);
  k[0] &= 248; /* clamped like `wg genkey`, so both tools show the same key */
  k[31] = (uint8_t)((k[31] & 127) | 64);
  int r = gn_jobnet_public_key(k, ret_public);
  if (r == 0)
    memcpy(ret_private, k, sizeof k);
  sodium_memzero(k, sizeof k);
  return r;
}

void gn_jobnet_key_to_base64(const uint8_t key[GN_JOBNET_KEY_LEN], char out[GN_JOBNET_KEY_B64_LEN]) {
  sodium_bin2base64(out, GN_JOBNET_KEY_B64_LEN, key, GN_JOBNET_KEY_LEN, sodium_base64_VARIANT_ORIGINAL);
}

int gn_jobnet_key_from_base64(const char *s, uint8_t ret[GN_JOBNET_KEY_LEN]) {
  if (!s || !ret || strnlen(s, GN_JOBNET_KEY_B64_LEN) != GN_JOBNET_KEY_B64_LEN - 1 || s[43] != '=')
    return GN_EINVAL;
  /* libsodium's decoder refuses characters outside the alphabet, bad
   * padding and non-zero unused bits (a second spelling of the same key). */
  uint8_t k[GN_JOBNET_KEY_LEN];
  size_t n = 0;
  const char *end = NULL;
  if (sodium_base642bin(k, sizeof k, s, 44, NULL, &n, &end, sodium_base64_VARIANT_ORIGINAL) != 0 || n != sizeof k ||
      end != s + 44)
    return GN_EINVAL;
  memcpy(ret, k, sizeof k);
  sodium_memzero(k, sizeof k);
  return 0;
}

/* --- names and addresses -------------------------------------------------*/

static int job_hash(const char *job_id, uint8_t out[8]) {
  if (!job_id)
    return GN_EINVAL;
  size_t n = strnlen(job_id, GN_JOBNET_JOB_ID_MAX + 1);
  if (n == 0)
    return GN_EINVAL;
  if (n > GN_JOBNET_JOB_ID_MAX)
    return GN_ETOOBIG;
  if (sodium_init() < 0)
    return GN_EIO;
  static const uint8_t key[] = "gpunet jobnet ifname v1";
  crypto_generichash(out, 8, (const uint8_t *)job_id, n, key, sizeof key - 1);
  return 0;
}

int gn_jobnet_ifname(const char *job_id, uint32_t rank, char out[GN_JOBNET_IFNAME_MAX]) {
  uint8_t h[8];
  if (!out)
    return GN_EINVAL;
  if (rank > 999)
    return GN_ETOOBIG;
  int r = job_hash(job_id, h);
  if (r < 0)
    return r;
  char name[GN_JOBNET_IFNAME_MAX];
  snprintf(name, sizeof name, "gnj%02x%02x%02x%02xr%u", h[0], h[1], h[2], h[3], (unsigned)rank);
  memcpy(out, name, sizeof name);
  return 0;
}

bool gn_jobnet_ifname_valid(const char *s) {
  if (!s || !(s[0] >= 'a' && s[0] <= 'z'))
    return false;
  size_t i;
  for (i = 0; s[i]; i++) {
    if (i >= GN_JOBNET_IFNAME_MAX - 1)
      return false;
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  }
  return true;
}

int gn_jobnet_subnet_for_job(const char *job_id, struct in_addr *ret_subnet, uint8_t *ret_prefix_len) {
  uint8_t h[8];
  if (!ret_subnet || !ret_prefix_len)
    return GN_EINVAL;
  int r = job_hash(job_id, h);
  if (r < 0)
    return r;
  ret_subnet->s_addr = htonl((10u << 24) | (77u << 16) | ((uint32_t)h[4] << 8));
  *ret_prefix_len = 24;
  return 0;
}

static uint32_t prefix_mask(uint8_t prefix_len) {
  return prefix_len == 0 ? 0 : ~0u << (32 - prefix_len);
}

int gn_jobnet_rank_address(struct in_addr subnet, uint8_t prefix_len, uint32_t rank, struct in_addr *ret) {
  if (!ret || prefix_len < 16 || prefix_len > 30)
    return GN_EINVAL;
  uint32_t net = ntohl(subnet.s_addr), mask = prefix_mask(prefix_len);
  if (net & ~mask)
    return GN_EINVAL;
  uint32_t hosts = ~mask - 1; /* without the network and broadcast addresses */
  if (rank >= hosts)
    return GN_ETOOBIG;
  ret->s_addr = htonl(net + rank + 1);
  return 0;
}

uint32_t gn_jobnet_mtu_for(uint32_t underlay_mtu, bool ipv6) {
  uint32_t over = ipv6 ? GN_JOBNET_OVERHEAD_V6 : GN_JOBNET_OVERHEAD_V4;
  uint32_t m = underlay_mtu > over ? underlay_mtu - over : 0;
  if (m < GN_JOBNET_MTU_MIN)
    m = GN_JOBNET_MTU_MIN;
  if (m > GN_JOBNET_MTU_MAX)
    m = GN_JOBNET_MTU_MAX;
  return m;
}

/* --- endpoints -----------------------------------------------------------*/

static bool in4(uint32_t a, uint32_t net, unsigned bits) {
  return (a & prefix_mask((uint8_t)bits)) == net;
}

/* 0: fine, 1: private, -1: never. */
static int class_v4(uint32_t a) {
  if (in4(a, 0x00000000u, 8) || in4(a, 0x7f000000u, 8) || in4(a, 0xa9fe0000u, 16) || in4(a, 0xe0000000u, 4) ||
      in4(a, 0xf0000000u, 4) || in4(a, 0xc0000000u, 24) || in4(a, 0xc0000200u, 24) || in4(a, 0xc6336400u, 24) ||
      in4(a, 0xcb007100u, 24) || in4(a, 0xc6120000u, 15))
    return -1; /* this network, loopback, link-local, multicast, reserved+broadcast, IETF, TEST-NETs, benchmarking */
  if (in4(a, 0x0a000000u, 8) || in4(a, 0xac100000u, 12) || in4(a, 0xc0a80000u, 16) || in4(a, 0x64400000u, 10))
    return 1;
  return 0;
}

static int class_v6(const uint8_t a[16]) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t zero[15] = {0};
  if (memcmp(a, zero, 15) == 0)
    return -1; /* :: and ::1 */
  if (memcmp(a, mapped, 12) == 0 || memcmp(a, zero, 12) == 0)
    return -1; /* IPv4-mapped and the old IPv4-compatible form: say it in IPv4 */
  if (a[0] == 0xff || (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) ||
      (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0d && a[3] == 0xb8))
    return -1; /* multicast, link-local, documentation */
  if ((a[0] & 0xfe) == 0xfc)
    return 1; /* unique local */
  return 0;
}

int gn_jobnet_endpoint_parse(const char *s, bool allow_private, struct sockaddr_storage *ret, socklen_t *ret_len) {
  if (!s || !ret || !ret_len)
    return GN_EINVAL;
  size_t n = strnlen(s, GN_JOBNET_ENDPOINT_MAX);
  if (n == 0 || n >= GN_JOBNET_ENDPOINT_MAX)
    return GN_EINVAL;
  char host[GN_JOBNET_ENDPOINT_MAX];
  const char *port_s;
  bool v6 = s[0] == '[';
  if (v6) {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return GN_EINVAL;
    size_t hl = (size_t)(close - s - 1);
    memcpy(host, s + 1, hl);
    host[hl] = '\0';
    port_s = close + 2;
  } else {
    const char *colon = strchr(s, ':');
    if (!colon || strchr(colon + 1, ':'))
      return GN_EINVAL;
    size_t hl = (size_t)(colon - s);
    memcpy(host, s, hl);
    host[hl] = '\0';
    port_s = colon + 1;
  }
  /* The port: 1..5 digits, no sign, no leading zero, 1..65535. */
  size_t pl = strlen(port_s);
  if (pl == 0 || pl > 5 || port_s[0] == '0')
    return GN_EINVAL;
  unsigned long port = 0;
  for (size_t i = 0; i < pl; i++) {
    if (port_s[i] < '0' || port_s[i] > '9')
      return GN_EINVAL;
    port = port * 10 + (unsigned long)(port_s[i] - '0');
  }
  if (port == 0 || port > 65535)
    return GN_EINVAL;
  /* inet_pton takes only literal addresses: dotted quads of four decimal
   * parts (glibc refuses leading zeros) and IPv6 text without a scope. */
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  int cls;
  socklen_t len;
  if (v6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    if (strchr(host, '%') || inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
      return GN_EINVAL;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)port);
    cls = class_v6(a->sin6_addr.s6_addr);
    len = sizeof *a;
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
      return GN_EINVAL;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    cls = class_v4(ntohl(a->sin_addr.s_addr));
    len = sizeof *a;
  }
  if (cls < 0 || (cls > 0 && !allow_private))
    return GN_EPERM;
  *ret = ss;
  *ret_len = len;
  return 0;
}

void gn__jobnet_endpoint_text(const struct sockaddr_storage *ss, char out[GN_JOBNET_ENDPOINT_MAX]) {
  char host[INET6_ADDRSTRLEN];
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    snprintf(out, GN_JOBNET_ENDPOINT_MAX, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
  } else {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    snprintf(out, GN_JOBNET_ENDPOINT_MAX, "%s:%u", host, (unsigned)ntohs(a->sin_port));
  }
}

int gn_jobnet_path_mtu(const char *endpoint, bool allow_private, uint32_t *ret_mtu) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (!ret_mtu)
    return GN_EINVAL;
  int r = gn_jobnet_endpoint_parse(endpoint, allow_private, &ss, &len);
  if (r < 0)
    return r;
  int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  int mtu = 0;
  socklen_t ml = sizeof mtu;
  if (connect(fd, (struct sockaddr *)&ss, len) < 0)
    r = -errno;
  else if (getsockopt(fd, ss.ss_family == AF_INET6 ? IPPROTO_IPV6 : IPPROTO_IP,
                      ss.ss_family == AF_INET6 ? IPV6_MTU : IP_MTU, &mtu, &ml) < 0)
    r = -errno;
  else if (mtu <= 0)
    r = GN_EIO;
  close(fd);
  if (r < 0)
    return r;
  *ret_mtu = (uint32_t)mtu;
  return 0;
}

int gn_jobnet_choose_mtu(const gn_jobnet_config *cfg, uint32_t *ret_mtu) {
  if (!cfg || !ret_mtu || cfg->peer_count > GN_JOBNET_MAX_PEERS)
    return GN_EINVAL;
  uint32_t best = 0;
  for (size_t i = 0; i < cfg->peer_count; i++) {
    const char *ep = cfg->peers[i].endpoint;
    if (!ep[0])
      continue;
    uint32_t path;
    int r = gn_jobnet_path_mtu(ep, cfg->allow_private_endpoints, &path);
    if (r < 0)
      return r;
    uint32_t m = gn_jobnet_mtu_for(path, ep[0] == '[');
    if (!best || m < best)
      best = m;
  }
  *ret_mtu = best ? best : GN_JOBNET_MTU_DEFAULT;
  return 0;
}

/* --- configs -------------------------------------------------------------*/

gn_jobnet_config *gn_jobnet_config_new(void) {
  if (sodium_init() < 0)
    return NULL;
  gn_jobnet_config *c = sodium_malloc(sizeof *c);
  if (c)
    memset(c, 0, sizeof *c);
  return c;
}

gn_jobnet_config *gn_jobnet_config_free(gn_jobnet_config *cfg) {
  if (cfg)
    sodium_free(cfg); /* wipes */
  return NULL;
}

static bool private_subnet(uint32_t net, uint8_t prefix_len) {
  return (prefix_len >= 8 && in4(net, 0x0a000000u, 8)) || (prefix_len >= 12 && in4(net, 0xac100000u, 12)) ||
         (prefix_len >= 16 && in4(net, 0xc0a80000u, 16)) || (prefix_len >= 10 && in4(net, 0x64400000u, 10));
}

/* A host address of the subnet: inside it, neither its first nor its last. */
static bool host_of(uint32_t a, uint32_t net, uint32_t mask) {
  return (a & mask) == net && (a & ~mask) != 0 && (a & ~mask) != ~mask;
}

int gn_jobnet_config_validate(const gn_jobnet_config *cfg, char *err, size_t err_cap) {
  if (!cfg)
    return gn__err(err, err_cap, GN_EINVAL, "no job network config");
  if (!gn_jobnet_ifname_valid(cfg->ifname))
    return gn__err(err, err_cap, GN_EINVAL, "job network: bad interface name (1-15 of [a-z0-9_], a letter first)");
  uint8_t own_pub[GN_JOBNET_KEY_LEN];
  if (gn_jobnet_public_key(cfg->private_key, own_pub) < 0)
    return gn__err(err, err_cap, GN_EINVAL, "job network %s: no private key", cfg->ifname);
  if (cfg->backend != GN_JOBNET_AUTO && cfg->backend != GN_JOBNET_KERNEL && cfg->backend != GN_JOBNET_USERSPACE)
    return gn__err(err, err_cap, GN_EINVAL, "job network %s: unknown backend %d", cfg->ifname, (int)cfg->backend);
  if (cfg->prefix_len < 16 || cfg->prefix_len > 30)
    return gn__err(err, err_cap, GN_EINVAL, "job network %s: the subnet prefix /%u is outside /16../30", cfg->ifname,
                   (unsigned)cfg->prefix_len);
  uint32_t mask = prefix_mask(cfg->prefix_len), self = ntohl(cfg->address.s_addr), net = self & mask;
  if (!private_subnet(net, cfg->prefix_len))
    return gn__err(err, err_cap, GN_EINVAL,
                   "job network %s: the job subnet must lie in 10/8, 172.16/12, 192.168/16 or 100.64/10", cfg->ifname);
  if (!host_of(self, net, mask))
    return gn__err(err, err_cap, GN_EINVAL, "job network %s: this rank's address is not a host of its subnet",
                   cfg->ifname);
  if (cfg->mtu && (cfg->mtu < GN_JOBNET_MTU_MIN || cfg->mtu > GN_JOBNET_MTU_MAX))
    return gn__err(err, err_cap, GN_EINVAL, "job network %s: MTU %u is outside %u..%u", cfg->ifname, (unsigned)cfg->mtu,
                   GN_JOBNET_MTU_MIN, GN_JOBNET_MTU_MAX);
  if (cfg->peer_count > GN_JOBNET_MAX_PEERS)
    return gn__err(err, err_cap, GN_ETOOBIG, "job network %s: %zu peers, at most %u", cfg->ifname, cfg->peer_count,
                   GN_JOBNET_MAX_PEERS);
  for (size_t i = 0; i < cfg->peer_count; i++) {
    const gn_jobnet_peer *p = &cfg->peers[i];
    uint32_t a = ntohl(p->address.s_addr);
    if (all_zero(p->public_key, GN_JOBNET_KEY_LEN))
      return gn__err(err, err_cap, GN_EINVAL, "job network %s: peer %zu has no public key", cfg->ifname, i);
    if (sodium_memcmp(p->public_key, own_pub, GN_JOBNET_KEY_LEN) == 0)
      return gn__err(err, err_cap, GN_EINVAL, "job network %s: peer %zu has this rank's own key", cfg->ifname, i);
    if (!host_of(a, net, mask) || a == self)
      return gn__err(err, err_cap, GN_EINVAL,
                     "job network %s: peer %zu's address is not another host of the job subnet", cfg->ifname, i);
    if (p->keepalive_s > GN_JOBNET_KEEPALIVE_MAX_S)
      return gn__err(err, err_cap, GN_EINVAL, "job network %s: peer %zu's keepalive is over %u s", cfg->ifname, i,
                     GN_JOBNET_KEEPALIVE_MAX_S);
    if (memchr(p->endpoint, '\0', sizeof p->endpoint) == NULL)
      return gn__err(err, err_cap, GN_EINVAL, "job network %s: peer %zu's endpoint is not terminated", cfg->ifname, i);
    if (p->endpoint[0]) {
      struct sockaddr_storage ss;
      socklen_t len;
      int r = gn_jobnet_endpoint_parse(p->endpoint, cfg->allow_private_endpoints, &ss, &len);
      if (r < 0)
        return gn__err(err, err_cap, GN_EINVAL,
                       r == GN_EPERM ? "job network %s: peer %zu's endpoint is an address the host must not send to"
                                     : "job network %s: peer %zu's endpoint is not ADDRESS:PORT",
                       cfg->ifname, i);
    }
    for (size_t k = 0; k < i; k++) {
      if (sodium_memcmp(cfg->peers[k].public_key, p->public_key, GN_JOBNET_KEY_LEN) == 0)
        return gn__err(err, err_cap, GN_EINVAL, "job network %s: peers %zu and %zu have the same key", cfg->ifname, k,
                       i);
      if (cfg->peers[k].address.s_addr == p->address.s_addr)
        return gn__err(err, err_cap, GN_EINVAL, "job network %s: peers %zu and %zu have the same address", cfg->ifname,
                       k, i);
    }
  }
  return 0;
}

/* Appends to out[*len..cap); false when it does not fit. */
static bool put(char *out, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool put(char *out, size_t cap, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(out + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (k < 0 || (size_t)k >= cap - *len)
    return false;
  *len += (size_t)k;
  return true;
}

int gn_jobnet_uapi_set_text(const gn_jobnet_config *cfg, char *out, size_t cap, size_t *ret_len) {
  if (!out || !cap || !ret_len)
    return GN_EINVAL;
  int r = gn_jobnet_config_validate(cfg, NULL, 0);
  if (r < 0)
    return r;
  char hex[2 * GN_JOBNET_KEY_LEN + 1];
  size_t len = 0;
  bool ok = put(out, cap, &len, "set=1\n");
  sodium_bin2hex(hex, sizeof hex, cfg->private_key, GN_JOBNET_KEY_LEN);
  ok = ok && put(out, cap, &len, "private_key=%s\n", hex);
  sodium_memzero(hex, sizeof hex);
  ok = ok && put(out, cap, &len, "listen_port=%u\nreplace_peers=true\n", (unsigned)cfg->listen_port);
  for (size_t i = 0; ok && i < cfg->peer_count; i++) {
    const gn_jobnet_peer *p = &cfg->peers[i];
    char addr[INET_ADDRSTRLEN];
    sodium_bin2hex(hex, sizeof hex, p->public_key, GN_JOBNET_KEY_LEN);
    inet_ntop(AF_INET, &p->address, addr, sizeof addr);
    ok = put(out, cap, &len, "public_key=%s\n", hex);
    if (ok && p->endpoint[0]) {
      struct sockaddr_storage ss;
      socklen_t sl;
      char ep[GN_JOBNET_ENDPOINT_MAX];
      gn_jobnet_endpoint_parse(p->endpoint, cfg->allow_private_endpoints, &ss, &sl); /* validated above */
      gn__jobnet_endpoint_text(&ss, ep);
      ok = put(out, cap, &len, "endpoint=%s\n", ep);
    }
    ok = ok && put(out, cap, &len, "persistent_keepalive_interval=%u\nreplace_allowed_ips=true\nallowed_ip=%s/32\n",
                   (unsigned)p->keepalive_s, addr);
  }
  ok = ok && put(out, cap, &len, "\n");
  if (!ok) {
    sodium_memzero(out, cap);
    return GN_ETOOBIG;
  }
  *ret_len = len;
  return 0;
}

int gn__jobnet_wg_conf_text(const gn_jobnet_config *cfg, char *out, size_t cap, size_t *ret_len) {
  int r = gn_jobnet_config_validate(cfg, NULL, 0);
  if (r < 0)
    return r;
  char b64[GN_JOBNET_KEY_B64_LEN];
  size_t len = 0;
  gn_jobnet_key_to_base64(cfg->private_key, b64);
  bool ok = put(out, cap, &len, "[Interface]\nPrivateKey = %s\nListenPort = %u\n", b64, (unsigned)cfg->listen_port);
  sodium_memzero(b64, sizeof b64);
  for (size_t i = 0; ok && i < cfg->peer_count; i++) {
    const gn_jobnet_peer *p = &cfg->peers[i];
    char addr[INET_ADDRSTRLEN];
    gn_jobnet_key_to_base64(p->public_key, b64);
    inet_ntop(AF_INET, &p->address, addr, sizeof addr);
    ok = put(out, cap, &len, "\n[Peer]\nPublicKey = %s\nAllowedIPs = %s/32\n", b64, addr);
    if (ok && p->keepalive_s)
      ok = put(out, cap, &len, "PersistentKeepalive = %u\n", (unsigned)p->keepalive_s);
    if (ok && p->endpoint[0]) {
      struct sockaddr_storage ss;
      socklen_t sl;
      char ep[GN_JOBNET_ENDPOINT_MAX];
      gn_jobnet_endpoint_parse(p->endpoint, cfg->allow_private_endpoints, &ss, &sl);
      gn__jobnet_endpoint_text(&ss, ep);
      ok = put(out, cap, &len, "Endpoint = %s\n", ep);
    }
  }
  if (!ok) {
    sodium_memzero(out, cap);
    return GN_ETOOBIG;
  }
  *ret_len = len;
  return 0;
}
