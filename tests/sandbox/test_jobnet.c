/* Tests of the job network (sandbox/jobnet*.c): keys against wg(8)'s
 * output, names, addresses, MTU and the validators with hostile input; then,
 * as root with wireguard-go, a real job network between two "provider
 * hosts" (network namespaces joined by a veth pair), each with a "job"
 * namespace for one rank, beside a second job on the same hosts: ranks reach
 * each other and nothing else, and down leaves nothing behind. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/jobnet.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- keys ----------------------------------------------------------------*/

/* Made once with wireguard-tools 1.0.20210914 (Debian 12) on 2026-12-03:
 * `wg genkey` for the first, and `wg pubkey` of each private key. The second
 * private key is the bytes 00..1f, unclamped: wg clamps when it derives. */
static const struct {
  const char *priv, *pub;
} key_vectors[] = {
    {"aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2Q=", "rGWdbLkTZuIf3nwrfeKBsSwTx8puE6CDQm4szWAcbj0="},
    {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", "j0DFrbaPJWJK5bIU6nZ6bslNgp09e14a0bpvPiE4KF8="},
};

static void test_public_key_matches_wg_vectors(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof key_vectors / sizeof key_vectors[0]; i++) {
    uint8_t priv[32], pub[32];
    char b64[GN_JOBNET_KEY_B64_LEN];
    assert_int_equal(gn_jobnet_key_from_base64(key_vectors[i].priv, priv), 0);
    assert_int_equal(gn_jobnet_public_key(priv, pub), 0);
    gn_jobnet_key_to_base64(pub, b64);
    assert_string_equal(b64, key_vectors[i].pub);
    gn_jobnet_key_to_base64(priv, b64);
    assert_string_equal(b64, key_vectors[i].priv);
  }
}

static bool have_exec(const char *name) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
  return system(cmd) == 0;
}

/* Fresh key pairs: clamped like `wg genkey`, distinct, and (where wg is
 * installed) the public key is what `wg pubkey` derives. */
static void test_keypair_matches_wg_pubkey(void **state) {
  (void)state;
  bool wg = have_exec("wg");
  uint8_t last[32] = {0};
  for (int i = 0; i < 4; i++) {
    uint8_t priv[32], pub[32];
    char pb[GN_JOBNET_KEY_B64_LEN], qb[GN_JOBNET_KEY_B64_LEN];
    assert_int_equal(gn_jobnet_keypair(priv, pub), 0);
    assert_int_equal(priv[0] & 7, 0);
    assert_int_equal(priv[31] & 0xc0, 0x40);
    assert_memory_not_equal(pub, last, 32);
    memcpy(last, pub, 32);
    if (!wg)
      continue;
    gn_jobnet_key_to_base64(priv, pb);
    gn_jobnet_key_to_base64(pub, qb);
    char tmp[] = "/tmp/gn-jobnet-key-XXXXXX", cmd[128], out[64] = {0};
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, pb, 44), 44);
    close(fd);
    snprintf(cmd, sizeof cmd, "wg pubkey < %s", tmp);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, sizeof out, f));
    pclose(f);
    unlink(tmp);
    out[strcspn(out, "\n")] = '\0';
    assert_string_equal(out, qb);
  }
  if (!wg)
    printf("note: wg (wireguard-tools) not installed: fresh keys checked against the fixed vectors only\n");
}

static void test_key_from_base64_rejects_hostile(void **state) {
  (void)state;
  static const char *bad[] = {
      "",
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2Q",    /* no padding */
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2Q==",  /* 45 */
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2R=",   /* unused bits set: a second spelling */
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko-PaxBvU2Q=",   /* URL-safe alphabet */
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2Q=\n", /* trailing newline */
      " aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2Q=",  /* leading space */
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9k\no+PaxBvU2Q=", /* newline inside, same length */
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2==",   /* two pads: 31 bytes */
      "aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2Q=aAa7YmpDcNLewRAorprT8ytr0U24Ufw9ko+PaxBvU2Q=",
  };
  uint8_t k[32], before[32];
  memset(k, 0xa5, sizeof k);
  memcpy(before, k, sizeof k);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(gn_jobnet_key_from_base64(bad[i], k), GN_EINVAL);
    assert_memory_equal(k, before, 32); /* a rejected key changes nothing */
  }
  assert_int_equal(gn_jobnet_key_from_base64(NULL, k), GN_EINVAL);
  uint8_t zero[32] = {0}, pub[32];
  assert_int_equal(gn_jobnet_public_key(zero, pub), GN_EINVAL);
}

/* --- names, addresses, MTU -----------------------------------------------*/

static void test_ifname_is_unique_per_job_and_rank(void **state) {
  (void)state;
  char a[GN_JOBNET_IFNAME_MAX], b[GN_JOBNET_IFNAME_MAX], c[GN_JOBNET_IFNAME_MAX], d[GN_JOBNET_IFNAME_MAX];
  assert_int_equal(gn_jobnet_ifname("job-1", 0, a), 0);
  assert_int_equal(gn_jobnet_ifname("job-1", 0, b), 0);
  assert_string_equal(a, b);
  assert_int_equal(gn_jobnet_ifname("job-1", 1, c), 0);
  assert_int_equal(gn_jobnet_ifname("job-2", 0, d), 0);
  assert_string_not_equal(a, c);
  assert_string_not_equal(a, d);
  assert_int_equal(gn_jobnet_ifname("job-1", 999, c), 0);
  assert_int_equal(strlen(c), 15);
  assert_true(gn_jobnet_ifname_valid(a) && gn_jobnet_ifname_valid(c));
  assert_int_equal(strncmp(a, "gnj", 3), 0);
  /* Hostile job ids are only hashed. */
  assert_int_equal(gn_jobnet_ifname("../../etc/passwd\n-f", 3, d), 0);
  assert_true(gn_jobnet_ifname_valid(d));
  assert_int_equal(gn_jobnet_ifname("job-1", 1000, c), GN_ETOOBIG);
  assert_int_equal(gn_jobnet_ifname("", 0, c), GN_EINVAL);
  assert_int_equal(gn_jobnet_ifname(NULL, 0, c), GN_EINVAL);
  char big[GN_JOBNET_JOB_ID_MAX + 2];
  memset(big, 'j', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  assert_int_equal(gn_jobnet_ifname(big, 0, c), GN_ETOOBIG);
  static const char *bad[] = {"",     "-h",     "-f",        "wg/0", "..",  ".wg",
                              "wg.0", "wg 0",   "wg0\n",     "Wg0",  "0wg", "abcdefghijklmnop",
                              "wg0%", "wg\x7f", "wg\xc3\xa9"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_false(gn_jobnet_ifname_valid(bad[i]));
  assert_false(gn_jobnet_ifname_valid(NULL));
  assert_true(gn_jobnet_ifname_valid("abcdefghijklmno"));
  assert_true(gn_jobnet_ifname_valid("wg_0"));
}

static uint32_t ip4(const char *s) {
  struct in_addr a;
  assert_int_equal(inet_pton(AF_INET, s, &a), 1);
  return a.s_addr;
}

static void test_rank_addresses(void **state) {
  (void)state;
  struct in_addr net = {.s_addr = ip4("10.77.5.0")}, a;
  uint8_t plen;
  assert_int_equal(gn_jobnet_rank_address(net, 24, 0, &a), 0);
  assert_int_equal(a.s_addr, ip4("10.77.5.1"));
  assert_int_equal(gn_jobnet_rank_address(net, 24, 253, &a), 0);
  assert_int_equal(a.s_addr, ip4("10.77.5.254"));
  assert_int_equal(gn_jobnet_rank_address(net, 24, 254, &a), GN_ETOOBIG); /* .255: broadcast */
  assert_int_equal(gn_jobnet_rank_address(net, 30, 1, &a), 0);
  assert_int_equal(gn_jobnet_rank_address(net, 30, 2, &a), GN_ETOOBIG);
  assert_int_equal(gn_jobnet_rank_address(net, 31, 0, &a), GN_EINVAL);
  assert_int_equal(gn_jobnet_rank_address(net, 15, 0, &a), GN_EINVAL);
  struct in_addr unaligned = {.s_addr = ip4("10.77.5.1")};
  assert_int_equal(gn_jobnet_rank_address(unaligned, 24, 0, &a), GN_EINVAL);
  struct in_addr wide = {.s_addr = ip4("10.77.0.0")};
  assert_int_equal(gn_jobnet_rank_address(wide, 16, 300, &a), 0);
  assert_int_equal(a.s_addr, ip4("10.77.1.45"));
  /* The job subnet: in 10.77.0.0/16, the same for the same job. */
  struct in_addr s1, s2;
  assert_int_equal(gn_jobnet_subnet_for_job("job-1", &s1, &plen), 0);
  assert_int_equal(plen, 24);
  assert_int_equal(ntohl(s1.s_addr) & 0xffff00ffu, 0x0a4d0000u);
  assert_int_equal(gn_jobnet_subnet_for_job("job-1", &s2, &plen), 0);
  assert_int_equal(s1.s_addr, s2.s_addr);
  assert_int_equal(gn_jobnet_subnet_for_job("", &s2, &plen), GN_EINVAL);
}

static void test_mtu_for_underlay(void **state) {
  (void)state;
  assert_int_equal(gn_jobnet_mtu_for(1500, false), 1440);
  assert_int_equal(gn_jobnet_mtu_for(1500, true), 1420);
  assert_int_equal(gn_jobnet_mtu_for(1400, false), 1340);
  assert_int_equal(gn_jobnet_mtu_for(1492, true), 1412); /* PPPoE */
  assert_int_equal(gn_jobnet_mtu_for(1340, false), 1280);
  assert_int_equal(gn_jobnet_mtu_for(1300, true), 1280); /* clamped */
  assert_int_equal(gn_jobnet_mtu_for(0, false), 1280);
  assert_int_equal(gn_jobnet_mtu_for(9000, false), 8940);
  assert_int_equal(gn_jobnet_mtu_for(70000, false), 65535);
}

static void test_endpoint_parse_hostile(void **state) {
  (void)state;
  static const struct {
    const char *s;
    int want;         /* without allow_private */
    int want_private; /* with it */
  } cases[] = {
      {"1.2.3.4:51820", 0, 0},
      {"[2606:4700::1111]:51820", 0, 0},
      {"8.8.8.8:1", 0, 0},
      {"8.8.8.8:65535", 0, 0},
      {"10.0.0.1:51820", GN_EPERM, 0},
      {"192.168.1.1:51820", GN_EPERM, 0},
      {"172.16.0.1:51820", GN_EPERM, 0},
      {"100.64.0.1:51820", GN_EPERM, 0},
      {"[fd00::1]:51820", GN_EPERM, 0},
      {"127.0.0.1:51820", GN_EPERM, GN_EPERM},
      {"0.0.0.0:51820", GN_EPERM, GN_EPERM},
      {"169.254.169.254:80", GN_EPERM, GN_EPERM}, /* cloud metadata */
      {"224.0.0.1:51820", GN_EPERM, GN_EPERM},
      {"255.255.255.255:51820", GN_EPERM, GN_EPERM},
      {"240.0.0.1:51820", GN_EPERM, GN_EPERM},
      {"[::1]:51820", GN_EPERM, GN_EPERM},
      {"[::]:51820", GN_EPERM, GN_EPERM},
      {"[fe80::1]:51820", GN_EPERM, GN_EPERM},
      {"[ff02::1]:51820", GN_EPERM, GN_EPERM},
      {"[::ffff:127.0.0.1]:51820", GN_EPERM, GN_EPERM},
      {"[::ffff:8.8.8.8]:51820", GN_EPERM, GN_EPERM},
      {"1.2.3.4", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:", GN_EINVAL, GN_EINVAL},
      {":51820", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:0", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:65536", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:051820", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:0080", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:+80", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4: 80", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:80 ", GN_EINVAL, GN_EINVAL},
      {"01.2.3.4:80", GN_EINVAL, GN_EINVAL},
      {"1.2.3:80", GN_EINVAL, GN_EINVAL},
      {"0x01020304:80", GN_EINVAL, GN_EINVAL},
      {"example.com:80", GN_EINVAL, GN_EINVAL},
      {"1.2.3.4:80\nallowed_ip=0.0.0.0/0", GN_EINVAL, GN_EINVAL}, /* a line injected into the socket */
      {"1.2.3.4:80:81", GN_EINVAL, GN_EINVAL},
      {"2606:4700::1111:51820", GN_EINVAL, GN_EINVAL},
      {"[2606:4700::1111]51820", GN_EINVAL, GN_EINVAL},
      {"[fe80::1%eth0]:51820", GN_EINVAL, GN_EINVAL},
      {"[2606:4700::1111]:", GN_EINVAL, GN_EINVAL},
      {"", GN_EINVAL, GN_EINVAL},
      {"[1111:2222:3333:4444:5555:6666:7777:8888]:65535xxxxxxxxxxxxxxxx", GN_EINVAL, GN_EINVAL}, /* too long */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct sockaddr_storage ss;
    socklen_t len = 0;
    int r = gn_jobnet_endpoint_parse(cases[i].s, false, &ss, &len);
    if (r != cases[i].want)
      fail_msg("%s: %d, want %d", cases[i].s, r, cases[i].want);
    r = gn_jobnet_endpoint_parse(cases[i].s, true, &ss, &len);
    if (r != cases[i].want_private)
      fail_msg("%s (private allowed): %d, want %d", cases[i].s, r, cases[i].want_private);
  }
  struct sockaddr_storage ss;
  socklen_t len;
  assert_int_equal(gn_jobnet_endpoint_parse("[2606:4700::1111]:443", false, &ss, &len), 0);
  assert_int_equal(ss.ss_family, AF_INET6);
  assert_int_equal(ntohs(((struct sockaddr_in6 *)&ss)->sin6_port), 443);
}

/* A valid two-peer config for rank 0 of a job in 10.77.9.0/24. */
static gn_jobnet_config *valid_config(void) {
  gn_jobnet_config *c = gn_jobnet_config_new();
  assert_non_null(c);
  uint8_t pub[32];
  snprintf(c->ifname, sizeof c->ifname, "gnjtest0");
  assert_int_equal(gn_jobnet_key_from_base64(key_vectors[0].priv, c->private_key), 0);
  c->listen_port = 51820;
  c->address.s_addr = ip4("10.77.9.1");
  c->prefix_len = 24;
  c->mtu = 1420;
  c->peer_count = 2;
  assert_int_equal(gn_jobnet_key_from_base64(key_vectors[1].pub, c->peers[0].public_key), 0);
  snprintf(c->peers[0].endpoint, sizeof c->peers[0].endpoint, "1.2.3.4:51820");
  c->peers[0].address.s_addr = ip4("10.77.9.2");
  c->peers[0].keepalive_s = 25;
  assert_int_equal(gn_jobnet_keypair((uint8_t[32]){0}, pub), 0);
  memcpy(c->peers[1].public_key, pub, 32);
  snprintf(c->peers[1].endpoint, sizeof c->peers[1].endpoint, "[2606:4700::1111]:51821");
  c->peers[1].address.s_addr = ip4("10.77.9.3");
  return c;
}

typedef void (*mutate_fn)(gn_jobnet_config *c);
static void m_ifname(gn_jobnet_config *c) {
  snprintf(c->ifname, sizeof c->ifname, "-h");
}
static void m_no_key(gn_jobnet_config *c) {
  memset(c->private_key, 0, 32);
}
static void m_own_key(gn_jobnet_config *c) {
  gn_jobnet_public_key(c->private_key, c->peers[1].public_key);
}
static void m_dup_key(gn_jobnet_config *c) {
  memcpy(c->peers[1].public_key, c->peers[0].public_key, 32);
}
static void m_zero_peer_key(gn_jobnet_config *c) {
  memset(c->peers[1].public_key, 0, 32);
}
static void m_dup_addr(gn_jobnet_config *c) {
  c->peers[1].address = c->peers[0].address;
}
static void m_own_addr(gn_jobnet_config *c) {
  c->peers[1].address = c->address;
}
static void m_peer_outside(gn_jobnet_config *c) {
  c->peers[1].address.s_addr = ip4("10.77.10.3");
}
static void m_peer_broadcast(gn_jobnet_config *c) {
  c->peers[1].address.s_addr = ip4("10.77.9.255");
}
static void m_peer_network(gn_jobnet_config *c) {
  c->peers[1].address.s_addr = ip4("10.77.9.0");
}
static void m_self_broadcast(gn_jobnet_config *c) {
  c->address.s_addr = ip4("10.77.9.255");
}
static void m_public_subnet(gn_jobnet_config *c) {
  c->address.s_addr = ip4("8.8.8.1");
  c->peers[0].address.s_addr = ip4("8.8.8.2");
  c->peers[1].address.s_addr = ip4("8.8.8.3");
}
static void m_prefix_wide(gn_jobnet_config *c) {
  c->prefix_len = 8;
}
static void m_prefix_narrow(gn_jobnet_config *c) {
  c->prefix_len = 31;
}
static void m_mtu_low(gn_jobnet_config *c) {
  c->mtu = 1000;
}
static void m_mtu_high(gn_jobnet_config *c) {
  c->mtu = 70000;
}
static void m_keepalive(gn_jobnet_config *c) {
  c->peers[0].keepalive_s = GN_JOBNET_KEEPALIVE_MAX_S + 1;
}
static void m_endpoint_inject(gn_jobnet_config *c) {
  snprintf(c->peers[0].endpoint, sizeof c->peers[0].endpoint, "1.2.3.4:51820\nallowed_ip=0.0.0.0/0");
}
static void m_endpoint_loopback(gn_jobnet_config *c) {
  snprintf(c->peers[0].endpoint, sizeof c->peers[0].endpoint, "127.0.0.1:22");
}
static void m_endpoint_lan(gn_jobnet_config *c) {
  snprintf(c->peers[0].endpoint, sizeof c->peers[0].endpoint, "192.168.1.1:53");
}
static void m_endpoint_unterminated(gn_jobnet_config *c) {
  memset(c->peers[0].endpoint, '1', sizeof c->peers[0].endpoint);
}
static void m_too_many(gn_jobnet_config *c) {
  c->peer_count = GN_JOBNET_MAX_PEERS + 1;
}
static void m_backend(gn_jobnet_config *c) {
  c->backend = (gn_jobnet_backend)7;
}

static void test_config_validate_rejects_hostile(void **state) {
  (void)state;
  static const struct {
    const char *name;
    mutate_fn fn;
    int want;
  } cases[] = {
      {"ifname", m_ifname, GN_EINVAL},
      {"no private key", m_no_key, GN_EINVAL},
      {"peer with our key", m_own_key, GN_EINVAL},
      {"two peers, one key", m_dup_key, GN_EINVAL},
      {"zero peer key", m_zero_peer_key, GN_EINVAL},
      {"two peers, one address", m_dup_addr, GN_EINVAL},
      {"peer with our address", m_own_addr, GN_EINVAL},
      {"peer outside the subnet", m_peer_outside, GN_EINVAL},
      {"peer at broadcast", m_peer_broadcast, GN_EINVAL},
      {"peer at network", m_peer_network, GN_EINVAL},
      {"self at broadcast", m_self_broadcast, GN_EINVAL},
      {"public subnet", m_public_subnet, GN_EINVAL},
      {"prefix /8", m_prefix_wide, GN_EINVAL},
      {"prefix /31", m_prefix_narrow, GN_EINVAL},
      {"mtu 1000", m_mtu_low, GN_EINVAL},
      {"mtu 70000", m_mtu_high, GN_EINVAL},
      {"keepalive", m_keepalive, GN_EINVAL},
      {"endpoint with a line", m_endpoint_inject, GN_EINVAL},
      {"endpoint loopback", m_endpoint_loopback, GN_EINVAL},
      {"endpoint on the LAN", m_endpoint_lan, GN_EINVAL},
      {"endpoint unterminated", m_endpoint_unterminated, GN_EINVAL},
      {"65 peers", m_too_many, GN_ETOOBIG},
      {"backend", m_backend, GN_EINVAL},
  };
  char err[256];
  gn_jobnet_config *c = valid_config();
  assert_int_equal(gn_jobnet_config_validate(c, err, sizeof err), 0);
  gn_jobnet_config_free(c);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    c = valid_config();
    cases[i].fn(c);
    err[0] = '\0';
    int r = gn_jobnet_config_validate(c, err, sizeof err);
    if (r != cases[i].want)
      fail_msg("%s: %d, want %d (%s)", cases[i].name, r, cases[i].want, err);
    assert_true(strlen(err) > 10);
    assert_null(strchr(err, '\n'));
    /* Nothing can be built from it either. */
    char text[4096];
    size_t len = 0;
    assert_int_equal(gn_jobnet_uapi_set_text(c, text, sizeof text, &len), cases[i].want);
    gn_jobnet_config_free(c);
  }
  assert_int_equal(gn_jobnet_config_validate(NULL, err, sizeof err), GN_EINVAL);
  /* The LAN endpoint is fine where the provider allows private endpoints. */
  c = valid_config();
  m_endpoint_lan(c);
  c->allow_private_endpoints = true;
  assert_int_equal(gn_jobnet_config_validate(c, err, sizeof err), 0);
  gn_jobnet_config_free(c);
}

/* 64 peers (world size 65) is the most; each gets its line set. */
static void test_config_max_peers(void **state) {
  (void)state;
  gn_jobnet_config *c = valid_config();
  c->prefix_len = 24;
  c->peer_count = GN_JOBNET_MAX_PEERS;
  for (size_t i = 0; i < GN_JOBNET_MAX_PEERS; i++) {
    uint8_t priv[32];
    assert_int_equal(gn_jobnet_keypair(priv, c->peers[i].public_key), 0);
    snprintf(c->peers[i].endpoint, sizeof c->peers[i].endpoint, "1.2.3.%zu:51820", i + 1);
    c->peers[i].address.s_addr = htonl(0x0a4d0900u + 2 + (uint32_t)i);
    c->peers[i].keepalive_s = 0;
  }
  char err[256];
  assert_int_equal(gn_jobnet_config_validate(c, err, sizeof err), 0);
  size_t cap = 64 * 1024, len = 0;
  char *text = malloc(cap);
  assert_non_null(text);
  assert_int_equal(gn_jobnet_uapi_set_text(c, text, cap, &len), 0);
  size_t peers = 0;
  for (const char *p = text; (p = strstr(p, "\npublic_key=")); p++)
    peers++;
  assert_int_equal(peers, GN_JOBNET_MAX_PEERS);
  assert_int_equal(gn_jobnet_uapi_set_text(c, text, 512, &len), GN_ETOOBIG); /* too small a buffer: nothing */
  free(text);
  gn_jobnet_config_free(c);
}

static void test_uapi_text_is_exact(void **state) {
  (void)state;
  gn_jobnet_config *c = valid_config();
  c->peer_count = 1;
  snprintf(c->peers[0].endpoint, sizeof c->peers[0].endpoint, "[2606:4700:0:0::1111]:51820");
  char text[2048], priv_hex[65], pub_hex[65];
  size_t len = 0;
  assert_int_equal(gn_jobnet_uapi_set_text(c, text, sizeof text, &len), 0);
  sodium_bin2hex(priv_hex, sizeof priv_hex, c->private_key, 32);
  sodium_bin2hex(pub_hex, sizeof pub_hex, c->peers[0].public_key, 32);
  char want[2048];
  snprintf(want, sizeof want,
           "set=1\nprivate_key=%s\nlisten_port=51820\nreplace_peers=true\npublic_key=%s\n"
           "endpoint=[2606:4700::1111]:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\n"
           "allowed_ip=10.77.9.2/32\n\n",
           priv_hex, pub_hex);
  assert_string_equal(text, want);
  assert_int_equal(len, strlen(want));
  gn_jobnet_config_free(c);
}

/* --- a real job network ---------------------------------------------------*/

/* Two provider hosts (hA, hB) joined by veth pairs: a (192.168.77.0/24, MTU
 * 1500) and b (192.168.78.0/24, MTU 1400). Job 1: rank 0 in jA (made from
 * hA), rank 1 in jB (from hB). Job 2, the other job: ranks in kA and kB over
 * underlay b. */
enum { NS_HA, NS_HB, NS_JA, NS_JB, NS_KA, NS_KB, NS_X, NS_Y, NS_COUNT };
static const char *ns_suffix[NS_COUNT] = {"hA", "hB", "jA", "jB", "kA", "kB", "x", "y"};

static struct {
  const char *skip;
  int root_fd;
  char ns[NS_COUNT][32];
  char nspath[NS_COUNT][64];
  gn_jobnet_config *cfg[4]; /* job 1 rank 0, 1; job 2 rank 0, 1 */
  gn_jobnet *net[4];
  pid_t wg_pid[4];
  char sock[4][128];
  char addr[4][INET_ADDRSTRLEN];
  pid_t servers[8];
  int nservers;
} g;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int st = system(cmd);
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : 255;
  if (code)
    printf("# (status %d) %s\n", code, cmd);
  return code;
}

static int enter_ns(int idx) {
  int fd = open(g.nspath[idx], O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  int r = setns(fd, CLONE_NEWNET);
  close(fd);
  return r;
}

static void leave_ns(void) {
  assert_int_equal(setns(g.root_fd, CLONE_NEWNET), 0);
}

/* Runs fn in a child inside namespace idx; its exit status, or -1. */
static int in_ns(int idx, int (*fn)(void *), void *arg, int timeout_ms) {
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    alarm((unsigned)(timeout_ms / 1000 + 2));
    if (enter_ns(idx) < 0)
      _exit(99);
    _exit(fn(arg));
  }
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct tcp_try_args {
  const char *src; /* bind to this source address first; NULL: any */
  const char *dst;
  int port;
  int timeout_ms;
} tcp_try_args;

/* 0: connected and got "pong" back; 1: timed out; 2: refused/unreachable. */
static int tcp_try_fn(void *arg) {
  tcp_try_args *a = arg;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
  if (fd < 0)
    return 3;
  if (a->src) {
    struct sockaddr_in src = {.sin_family = AF_INET};
    inet_pton(AF_INET, a->src, &src.sin_addr);
    if (bind(fd, (struct sockaddr *)&src, sizeof src) < 0)
      return 4;
  }
  inet_pton(AF_INET, a->dst, &sa.sin_addr);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS)
    return 2;
  struct pollfd pf = {.fd = fd, .events = POLLOUT};
  if (poll(&pf, 1, a->timeout_ms) <= 0)
    return 1;
  int soerr = 0;
  socklen_t sl = sizeof soerr;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
  if (soerr)
    return soerr == ETIMEDOUT ? 1 : 2;
  if (write(fd, "ping", 4) != 4)
    return 2;
  pf.events = POLLIN;
  char buf[8] = {0};
  if (poll(&pf, 1, a->timeout_ms) <= 0)
    return 1;
  if (read(fd, buf, 4) != 4 || memcmp(buf, "pong", 4) != 0)
    return 2;
  close(fd);
  return 0;
}

static int tcp_try(int ns, const char *src, const char *dst, int port, int timeout_ms) {
  tcp_try_args a = {.src = src, .dst = dst, .port = port, .timeout_ms = timeout_ms};
  return in_ns(ns, tcp_try_fn, &a, timeout_ms * 2);
}

/* A "pong" server on addr:port in namespace idx, until killed (at most 5
 * minutes). */
static void start_server(int idx, const char *addr, int port) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(300);
    close(p[0]);
    if (enter_ns(idx) < 0)
      _exit(99);
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 16) < 0)
      _exit(98);
    if (write(p[1], "r", 1) != 1)
      _exit(97);
    close(p[1]);
    for (;;) {
      int c = accept(fd, NULL, NULL);
      if (c < 0)
        continue;
      char buf[4];
      struct pollfd pf = {.fd = c, .events = POLLIN};
      if (poll(&pf, 1, 3000) > 0 && read(c, buf, 4) == 4)
        (void)!write(c, "pong", 4);
      close(c);
    }
  }
  close(p[1]);
  char r = 0;
  assert_int_equal(read(p[0], &r, 1), 1);
  close(p[0]);
  g.servers[g.nservers++] = pid;
}

typedef struct ifq {
  const char *ifname;
  int mtu;
} ifq;

static int mtu_fn(void *arg) {
  ifq *q = arg;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", q->ifname);
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0 || ioctl(fd, SIOCGIFMTU, &ifr) < 0)
    return 1;
  /* exit statuses are 8 bits: say it in steps of 10 over 1200 */
  return (ifr.ifr_mtu - 1200) / 10;
}

static int iface_exists_fn(void *arg) {
  return if_nametoindex((const char *)arg) != 0 ? 0 : 1;
}

/* Output of a shell command, first cap-1 bytes. */
static void capture(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void capture(char *out, size_t cap, const char *fmt, ...) {
  char cmd[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  FILE *f = popen(cmd, "r");
  size_t n = f ? fread(out, 1, cap - 1, f) : 0;
  out[n] = '\0';
  if (f)
    pclose(f);
}

/* A wireguard-go process for ifname anywhere on the host. */
static bool wg_go_running(const char *ifname) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  bool found = false;
  while (d && !found && (e = readdir(d))) {
    char path[300], buf[512];
    if (e->d_name[0] < '0' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
      continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
      continue;
    buf[n] = '\0';
    /* argv: PATH/wireguard-go -f IFNAME */
    if (strstr(buf, "wireguard-go")) {
      for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
        if (strcmp(buf + i, ifname) == 0)
          found = true;
    }
  }
  if (d)
    closedir(d);
  return found;
}

static void fill_config(int k, const char *job, uint32_t rank, struct in_addr subnet, uint8_t plen, uint16_t port) {
  gn_jobnet_config *c = gn_jobnet_config_new();
  assert_non_null(c);
  uint8_t pub[32];
  assert_int_equal(gn_jobnet_ifname(job, rank, c->ifname), 0);
  assert_int_equal(gn_jobnet_keypair(c->private_key, pub), 0);
  assert_int_equal(gn_jobnet_rank_address(subnet, plen, rank, &c->address), 0);
  c->prefix_len = plen;
  c->listen_port = port;
  c->allow_private_endpoints = true; /* the test underlay is 192.168.77/78 */
  c->backend = GN_JOBNET_USERSPACE;
  inet_ntop(AF_INET, &c->address, g.addr[k], sizeof g.addr[k]);
  g.cfg[k] = c;
}

/* Makes peer p of config k the rank of config o. */
static void add_peer(int k, int o, const char *endpoint) {
  gn_jobnet_config *c = g.cfg[k];
  gn_jobnet_peer *p = &c->peers[c->peer_count++];
  assert_int_equal(gn_jobnet_public_key(g.cfg[o]->private_key, p->public_key), 0);
  snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint ? endpoint : "");
  p->address = g.cfg[o]->address;
  p->keepalive_s = 0;
}

static void teardown_all(void) {
  for (int i = 0; i < 4; i++)
    g.net[i] = gn_jobnet_down(g.net[i]);
  for (int i = 0; i < g.nservers; i++) {
    kill(g.servers[i], SIGKILL);
    waitpid(g.servers[i], NULL, 0);
  }
  g.nservers = 0;
  for (int i = 0; i < NS_COUNT; i++)
    if (g.ns[i][0])
      sh("ip netns del %s 2>/dev/null; true", g.ns[i]);
  for (int i = 0; i < 4; i++)
    g.cfg[i] = gn_jobnet_config_free(g.cfg[i]);
}

static int net_setup(void **state) {
  (void)state;
  memset(&g, 0, sizeof g);
  g.root_fd = -1;
  if (geteuid() != 0)
    g.skip = "needs root (network namespaces, TUN devices)";
  else if (!have_exec("wireguard-go"))
    g.skip = "needs wireguard-go (Debian package wireguard-go)";
  else if (!have_exec("ip"))
    g.skip = "needs ip (Debian package iproute2)";
  else if (access("/dev/net/tun", R_OK | W_OK) != 0)
    g.skip = "needs /dev/net/tun";
  if (g.skip)
    return 0;
  g.root_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  assert_true(g.root_fd >= 0);
  int id = (int)getpid();
  for (int i = 0; i < NS_COUNT; i++) {
    snprintf(g.ns[i], sizeof g.ns[i], "gnjb%d%s", id, ns_suffix[i]);
    snprintf(g.nspath[i], sizeof g.nspath[i], "/run/netns/%s", g.ns[i]);
    if (sh("ip netns add %s", g.ns[i]) != 0) {
      g.ns[i][0] = '\0';
      g.skip = "cannot create network namespaces (ip netns add failed)";
      teardown_all();
      return 0;
    }
  }
  const char *ha = g.ns[NS_HA], *hb = g.ns[NS_HB];
  if (sh("ip link add gjb%da type veth peer name gjb%db", id, id) ||
      sh("ip link set gjb%da netns %s && ip link set gjb%db netns %s", id, ha, id, hb) ||
      sh("ip link add gjb%dc type veth peer name gjb%dd", id, id) ||
      sh("ip link set gjb%dc netns %s && ip link set gjb%dd netns %s", id, ha, id, hb) ||
      sh("ip -n %s link set lo up && ip -n %s link set lo up", ha, hb) ||
      sh("ip -n %s address add 192.168.77.1/24 dev gjb%da && ip -n %s link set gjb%da up", ha, id, ha, id) ||
      sh("ip -n %s address add 192.168.77.2/24 dev gjb%db && ip -n %s link set gjb%db up", hb, id, hb, id) ||
      sh("ip -n %s link set gjb%dc mtu 1400 && ip -n %s link set gjb%dd mtu 1400", ha, id, hb, id) ||
      sh("ip -n %s address add 192.168.78.1/24 dev gjb%dc && ip -n %s link set gjb%dc up", ha, id, ha, id) ||
      sh("ip -n %s address add 192.168.78.2/24 dev gjb%dd && ip -n %s link set gjb%dd up", hb, id, hb, id)) {
    teardown_all();
    fail_msg("could not build the test network");
  }
  /* Job 1: rank 0 lets the system pick its port and has rank 1's endpoint;
   * rank 1 has a fixed port and waits for rank 0 (no endpoint). */
  char job1[64], job2[64], ep[64];
  struct in_addr s1, s2 = {.s_addr = ip4("10.78.5.0")};
  uint8_t plen;
  snprintf(job1, sizeof job1, "test-jobnet-%d-1", id);
  snprintf(job2, sizeof job2, "test-jobnet-%d-2", id);
  assert_int_equal(gn_jobnet_subnet_for_job(job1, &s1, &plen), 0);
  uint16_t port1 = (uint16_t)(40000 + id % 10000), port2 = (uint16_t)(port1 + 10000), port3 = (uint16_t)(port1 + 20000);
  fill_config(0, job1, 0, s1, plen, 0);
  fill_config(1, job1, 1, s1, plen, port1);
  snprintf(ep, sizeof ep, "192.168.77.2:%u", port1);
  add_peer(0, 1, ep);
  add_peer(1, 0, NULL);
  /* Job 2 (other keys, other subnet) over underlay b, both with endpoints. */
  fill_config(2, job2, 0, s2, 24, port2);
  fill_config(3, job2, 1, s2, 24, port3);
  snprintf(ep, sizeof ep, "192.168.78.2:%u", port3);
  add_peer(2, 3, ep);
  snprintf(ep, sizeof ep, "192.168.78.1:%u", port2);
  add_peer(3, 2, ep);

  static const int host_of[4] = {NS_HA, NS_HB, NS_HA, NS_HB}, job_of[4] = {NS_JA, NS_JB, NS_KA, NS_KB};
  for (int k = 0; k < 4; k++) {
    char err[512] = "";
    assert_int_equal(enter_ns(host_of[k]), 0);
    int r = gn_jobnet_up(g.cfg[k], g.nspath[job_of[k]], &g.net[k], err, sizeof err);
    leave_ns();
    if (r != 0) {
      teardown_all();
      fail_msg("gn_jobnet_up %d: %s", k, err);
    }
    g.wg_pid[k] = gn_jobnet_pid(g.net[k]);
    snprintf(g.sock[k], sizeof g.sock[k], "/var/run/wireguard/%s.sock", g.cfg[k]->ifname);
  }
  start_server(NS_JB, g.addr[1], 7001);
  start_server(NS_JA, g.addr[0], 7005);
  start_server(NS_HA, "192.168.77.1", 7002);
  start_server(NS_HB, "192.168.77.2", 7003);
  start_server(NS_KB, g.addr[3], 7004);
  return 0;
}

static int net_teardown(void **state) {
  (void)state;
  if (!g.skip)
    teardown_all();
  if (g.root_fd >= 0)
    close(g.root_fd);
  return 0;
}

#define SKIP_UNLESS_NET()                                                                                              \
  do {                                                                                                                 \
    if (g.skip) {                                                                                                      \
      printf("skipped: job network tests: %s\n", g.skip);                                                              \
      skip();                                                                                                          \
    }                                                                                                                  \
  } while (0)

static void test_ranks_reach_each_other(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  assert_int_equal(gn_jobnet_backend_of(g.net[0]), GN_JOBNET_USERSPACE);
  assert_int_equal(tcp_try(NS_JA, NULL, g.addr[1], 7001, 5000), 0);
  assert_int_equal(tcp_try(NS_JB, NULL, g.addr[0], 7005, 5000), 0);
  /* Job 2 works too: the "other job" below is a live network. */
  assert_int_equal(tcp_try(NS_KA, NULL, g.addr[3], 7004, 5000), 0);
}

/* The UDP socket stays in the host's namespace: wireguard-go runs there,
 * bound to the configured port (rank 0: the one the system picked). */
static void test_socket_stays_in_host_namespace(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  struct stat a, b;
  char path[64];
  assert_int_equal(gn_jobnet_listen_port(g.net[1]), g.cfg[1]->listen_port);
  assert_int_not_equal(gn_jobnet_listen_port(g.net[0]), 0);
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)g.wg_pid[k]);
    assert_int_equal(stat(path, &a), 0);
    assert_int_equal(stat(g.nspath[k == 0 ? NS_HA : NS_HB], &b), 0);
    assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
    char out[4096], want[16];
    capture(out, sizeof out, "cat /proc/%d/net/udp /proc/%d/net/udp6", (int)g.wg_pid[k], (int)g.wg_pid[k]);
    snprintf(want, sizeof want, ":%04X ", (unsigned)gn_jobnet_listen_port(g.net[k]));
    assert_non_null(strstr(out, want));
  }
  /* The socket file is root's alone. */
  assert_int_equal(stat(g.sock[0], &a), 0);
  assert_int_equal(a.st_mode & 077, 0);
  assert_int_equal(a.st_uid, 0);
}

/* Inside the job's namespace: lo and the interface, one route (the job
 * subnet's), no IPv6 on the interface. */
static void test_job_namespace_holds_only_the_subnet(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  char out[4096], want[128];
  capture(out, sizeof out, "ip -n %s -o link show | awk -F': ' '{print $2}' | sort", g.ns[NS_JA]);
  snprintf(want, sizeof want, "%s\nlo\n", g.cfg[0]->ifname);
  assert_string_equal(out, want);
  /* (sed: iproute2 versions differ in a trailing space) */
  capture(out, sizeof out, "ip -n %s -4 route show | sed 's/ *$//'", g.ns[NS_JA]);
  struct in_addr net = {.s_addr = g.cfg[0]->address.s_addr & htonl(0xffffff00u)};
  char nets[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &net, nets, sizeof nets);
  snprintf(want, sizeof want, "%s/24 dev %s proto kernel scope link src %s\n", nets, g.cfg[0]->ifname, g.addr[0]);
  assert_string_equal(out, want);
  capture(out, sizeof out, "ip -n %s -6 address show dev %s", g.ns[NS_JA], g.cfg[0]->ifname);
  assert_null(strstr(out, "inet6"));
}

/* Nothing but the peer: not the job's own host, not the other host, not
 * the other job, even when the job adds routes and addresses itself (as one
 * with CAP_NET_ADMIN in its namespace could). */
static void test_job_reaches_nothing_else(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  /* The targets are real: each answers from where it should. */
  assert_int_equal(tcp_try(NS_HB, NULL, "192.168.77.1", 7002, 3000), 0);
  assert_int_equal(tcp_try(NS_HA, NULL, "192.168.77.2", 7003, 3000), 0);
  assert_int_equal(tcp_try(NS_KA, NULL, g.addr[3], 7004, 3000), 0);
  static const struct {
    const char *addr_fmt;
    int port;
  } targets[] = {{"192.168.77.1", 7002}, {"192.168.77.2", 7003}, {NULL, 7004}, {"192.168.78.1", 7002}};
  for (int hostile = 0; hostile < 2; hostile++) {
    if (hostile) {
      assert_int_equal(sh("ip -n %s route add default dev %s", g.ns[NS_JA], g.cfg[0]->ifname), 0);
      assert_int_equal(sh("ip -n %s route add 10.78.5.0/24 dev %s", g.ns[NS_JA], g.cfg[0]->ifname), 0);
    }
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
      const char *dst = targets[i].addr_fmt ? targets[i].addr_fmt : g.addr[3];
      int r = tcp_try(NS_JA, NULL, dst, targets[i].port, 1500);
      if (r == 0)
        fail_msg("the job reached %s:%d%s", dst, targets[i].port, hostile ? " with its own routes" : "");
      /* Without routes: unreachable at once; with them: WireGuard drops. */
      assert_int_equal(r, hostile ? 1 : 2);
    }
  }
  /* The peer still answers through the added default route. */
  assert_int_equal(tcp_try(NS_JA, NULL, g.addr[1], 7001, 3000), 0);
  assert_int_equal(sh("ip -n %s route del default dev %s", g.ns[NS_JA], g.cfg[0]->ifname), 0);
  assert_int_equal(sh("ip -n %s route del 10.78.5.0/24 dev %s", g.ns[NS_JA], g.cfg[0]->ifname), 0);
}

/* A rank cannot use another address: the receiving side's allowed IPs for
 * it are its own /32. */
static void test_rank_cannot_spoof_an_address(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  char spoof[INET_ADDRSTRLEN];
  struct in_addr a = {.s_addr = htonl(ntohl(g.cfg[0]->address.s_addr) + 8)};
  inet_ntop(AF_INET, &a, spoof, sizeof spoof);
  assert_int_equal(sh("ip -n %s address add %s/32 dev %s", g.ns[NS_JA], spoof, g.cfg[0]->ifname), 0);
  assert_int_equal(tcp_try(NS_JA, spoof, g.addr[1], 7001, 1500), 1);
  assert_int_equal(tcp_try(NS_JA, g.addr[0], g.addr[1], 7001, 3000), 0);
  assert_int_equal(sh("ip -n %s address del %s/32 dev %s", g.ns[NS_JA], spoof, g.cfg[0]->ifname), 0);
}

static void test_mtu_is_chosen_for_the_path(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  /* Rank 0 of job 1: a 1500 veth to its peer: 1440. Rank 1: no endpoint,
   * WireGuard's default 1420. Job 2: a 1400 veth: 1340. */
  static const int want[4] = {1440, 1420, 1340, 1340}, ns[4] = {NS_JA, NS_JB, NS_KA, NS_KB};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(gn_jobnet_mtu(g.net[k]), want[k]);
    ifq q = {.ifname = g.cfg[k]->ifname};
    assert_int_equal(in_ns(ns[k], mtu_fn, &q, 2000), (want[k] - 1200) / 10);
  }
  uint32_t m = 0;
  assert_int_equal(enter_ns(NS_HA), 0);
  int r = gn_jobnet_choose_mtu(g.cfg[2], &m);
  leave_ns();
  assert_int_equal(r, 0);
  assert_int_equal(m, 1340);
}

/* Bad namespaces and a name in use fail before anything starts; a failure
 * after wireguard-go started (the job's namespace already has an interface
 * of that name) stops it and removes its socket. */
static void test_failed_up_leaves_nothing(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  char err[512];
  gn_jobnet *j = NULL;
  gn_jobnet_config *c = gn_jobnet_config_new();
  assert_non_null(c);
  memcpy(c, g.cfg[0], sizeof *c);
  assert_int_equal(enter_ns(NS_HA), 0);
  /* The name is rank 0's, live: its socket is in use. */
  assert_int_equal(gn_jobnet_up(c, g.nspath[NS_X], &j, err, sizeof err), GN_EEXIST);
  snprintf(c->ifname, sizeof c->ifname, "gnjx%d", (int)getpid() % 100000);
  assert_int_equal(gn_jobnet_up(c, "/proc/self/ns/net", &j, err, sizeof err), GN_EINVAL);
  assert_non_null(strstr(err, "host's own"));
  assert_int_equal(gn_jobnet_up(c, "/proc/self/ns/uts", &j, err, sizeof err), GN_EINVAL);
  assert_int_equal(gn_jobnet_up(c, "run/netns/x", &j, err, sizeof err), GN_EINVAL);
  assert_int_equal(gn_jobnet_up(c, "/nonexistent/ns", &j, err, sizeof err), -ENOENT);
  leave_ns();
  assert_int_equal(sh("ip -n %s link add %s type veth peer name gnjbpeer", g.ns[NS_X], c->ifname), 0);
  assert_int_equal(enter_ns(NS_HA), 0);
  int r = gn_jobnet_up(c, g.nspath[NS_X], &j, err, sizeof err);
  bool host_has = if_nametoindex(c->ifname) != 0;
  leave_ns();
  assert_int_equal(r, GN_EIO);
  assert_non_null(strstr(err, "moving"));
  assert_null(j);
  assert_false(host_has);
  char sock[128];
  snprintf(sock, sizeof sock, "/var/run/wireguard/%s.sock", c->ifname);
  assert_int_not_equal(access(sock, F_OK), 0);
  assert_false(wg_go_running(c->ifname));
  /* The kernel backend asked for where there is none: refused, nothing left. */
  bool kernel = sh("ip link add gnjbprobe%d type wireguard 2>/dev/null", (int)getpid() % 10000) == 0;
  if (kernel)
    sh("ip link del gnjbprobe%d", (int)getpid() % 10000);
  if (!kernel) {
    c->backend = GN_JOBNET_KERNEL;
    assert_int_equal(enter_ns(NS_HA), 0);
    r = gn_jobnet_up(c, g.nspath[NS_Y], &j, err, sizeof err);
    host_has = if_nametoindex(c->ifname) != 0;
    leave_ns();
    assert_true(r == GN_EIO || r == GN_EUNSUPPORTED);
    assert_false(host_has);
    assert_false(wg_go_running(c->ifname));
  }
  gn_jobnet_config_free(c);
}

static void test_down_removes_everything(void **state) {
  (void)state;
  SKIP_UNLESS_NET();
  static const int ns[4] = {NS_JA, NS_JB, NS_KA, NS_KB};
  for (int k = 0; k < 4; k++) {
    assert_true(g.wg_pid[k] > 0);
    assert_true(wg_go_running(g.cfg[k]->ifname));
    assert_int_equal(access(g.sock[k], F_OK), 0);
    assert_int_equal(in_ns(ns[k], iface_exists_fn, g.cfg[k]->ifname, 2000), 0);
    g.net[k] = gn_jobnet_down(g.net[k]);
    assert_null(g.net[k]);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)g.wg_pid[k]);
    assert_false(wg_go_running(g.cfg[k]->ifname));
    assert_int_not_equal(access(g.sock[k], F_OK), 0);
    assert_int_equal(in_ns(ns[k], iface_exists_fn, g.cfg[k]->ifname, 2000), 1);
  }
  /* And the job lost its network. */
  assert_int_equal(tcp_try(NS_JA, NULL, g.addr[1], 7001, 1000), 2);
  assert_null(gn_jobnet_down(NULL));
}

int main(void) {
  const struct CMUnitTest pure[] = {
      cmocka_unit_test(test_public_key_matches_wg_vectors),
      cmocka_unit_test(test_keypair_matches_wg_pubkey),
      cmocka_unit_test(test_key_from_base64_rejects_hostile),
      cmocka_unit_test(test_ifname_is_unique_per_job_and_rank),
      cmocka_unit_test(test_rank_addresses),
      cmocka_unit_test(test_mtu_for_underlay),
      cmocka_unit_test(test_endpoint_parse_hostile),
      cmocka_unit_test(test_config_validate_rejects_hostile),
      cmocka_unit_test(test_config_max_peers),
      cmocka_unit_test(test_uapi_text_is_exact),
  };
  const struct CMUnitTest net[] = {
      cmocka_unit_test(test_ranks_reach_each_other),
      cmocka_unit_test(test_socket_stays_in_host_namespace),
      cmocka_unit_test(test_job_namespace_holds_only_the_subnet),
      cmocka_unit_test(test_job_reaches_nothing_else),
      cmocka_unit_test(test_rank_cannot_spoof_an_address),
      cmocka_unit_test(test_mtu_is_chosen_for_the_path),
      cmocka_unit_test(test_failed_up_leaves_nothing),
      cmocka_unit_test(test_down_removes_everything),
  };
  int fails = cmocka_run_group_tests_name("jobnet", pure, NULL, NULL);
  fails += cmocka_run_group_tests_name("jobnet_netns", net, net_setup, net_teardown);
  return fails;
}
