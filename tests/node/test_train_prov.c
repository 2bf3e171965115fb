/* The provider's side of training jobs (node/train_prov.c, issue 8): the
 * manifest's net and output sections (encoding, hostile input), a real
 * gpunetd's refusals of training manifests it must not run (training off, a
 * port outside its range or busy, inconsistent ranks, a bad endpoint), and,
 * as root with runc, wireguard-go and the test registry, a rank that runs:
 * its job reaches a peer rank (a WireGuard interface this test brings up in
 * a namespace of its own, joined to the provider's host by a veth) over the
 * job network and nothing else, sees the rendezvous variables, writes
 * /output, and leaves nothing behind. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/jobnet.h>
#include <gpunet/node.h>
#include <gpunet/offer.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include "jobmsg.h"
#include "node/helpers.h"
#include "sandbox/helpers.h"

typedef tn_msg msg;

/* --- the manifest's training sections (pure) --------------------------------*/

static void fill_manifest(gn_jobman *m, uint32_t world, uint32_t rank) {
  memset(m, 0, sizeof *m);
  snprintf(m->job_id, sizeof m->job_id, "j-0123456789ab");
  snprintf(m->lease_id, sizeof m->lease_id, "l-0123456789ab");
  snprintf(m->image, sizeof m->image, "127.0.0.1:5000/bb@sha256:%064d", 0);
  m->argc = 1;
  m->argv[0] = strdup("true");
  m->memory_mib = 64;
  m->pids = 16;
  m->issued_s = 1000;
  m->expires_s = 1100;
  m->output = true;
  m->has_net = true;
  gn_jobman_net *t = &m->net;
  snprintf(t->group, sizeof t->group, "j-00aa11bb22cc");
  t->world = world;
  t->rank = rank;
  t->local_rank = 0;
  t->local_world = 1;
  memset(t->private_key, 0x42, sizeof t->private_key);
  t->listen_port = 51821;
  t->master_port = 29500;
  t->subnet_host = 7;
  for (uint32_t r = 0, k = 0; r < world; r++) {
    if (r == rank)
      continue;
    memset(t->peers[k].public_key, (int)(r + 1), sizeof t->peers[k].public_key);
    snprintf(t->peers[k].endpoint, sizeof t->peers[k].endpoint, "203.0.113.%u:51820", r + 1);
    t->peers[k].rank = r;
    k++;
  }
  t->npeers = world - 1;
}

static void encode(const gn_jobman *m, gn_buf *ret) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  assert_int_equal(gn__jobman_encode(m, &w), 0);
  assert_int_equal(gn_wire_writer_take(&w, ret), 0);
  gn_wire_writer_done(&w);
}

static void test_manifest_net_round_trip(void **state) {
  (void)state;
  gn_jobman m, d;
  gn_buf b = {0};
  fill_manifest(&m, 64, 5); /* the largest world: 63 peers */
  encode(&m, &b);
  assert_int_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  assert_true(d.output);
  assert_true(d.has_net);
  assert_string_equal(d.net.group, "j-00aa11bb22cc");
  assert_int_equal(d.net.world, 64);
  assert_int_equal(d.net.rank, 5);
  assert_int_equal(d.net.npeers, 63);
  assert_int_equal(d.net.listen_port, 51821);
  assert_int_equal(d.net.master_port, 29500);
  assert_int_equal(d.net.subnet_host, 7);
  assert_memory_equal(d.net.private_key, m.net.private_key, 32);
  for (uint32_t i = 0; i < 63; i++) {
    assert_int_equal(d.net.peers[i].rank, m.net.peers[i].rank);
    assert_string_equal(d.net.peers[i].endpoint, m.net.peers[i].endpoint);
    assert_memory_equal(d.net.peers[i].public_key, m.net.peers[i].public_key, 32);
  }
  gn__jobman_done(&d);
  /* done wipes the private key */
  assert_true(sodium_is_zero(d.net.private_key, sizeof d.net.private_key));
  gn_buf_done(&b);
  /* An ordinary job's manifest has neither key: byte for byte as before. */
  m.output = m.has_net = false;
  encode(&m, &b);
  assert_int_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  assert_false(d.output);
  assert_false(d.has_net);
  assert_null(memmem(b.data, b.len, "\xa3net", 4));
  assert_null(memmem(b.data, b.len, "output", 6));
  assert_int_equal(b.data[0], 0x80 | 12); /* fixmap of the 12 keys */
  gn__jobman_done(&d);
  gn_buf_done(&b);
  gn__jobman_done(&m);
}

/* A manifest whose net section is replaced by what put() writes. */
typedef void (*net_writer)(gn_wire_writer *w);

static gn_buf manifest_with_key(const char *key, bool output, net_writer put) {
  gn_jobman m;
  fill_manifest(&m, 1, 0);
  m.has_net = false;
  m.output = false;
  gn_wire_writer w;
  gn_buf b = {0};
  gn_wire_writer_init(&w);
  /* 12 ordinary keys, output if asked, and key */
  gn_wire_put_map(&w, 13 + (output ? 1 : 0));
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, m.job_id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, m.lease_id);
  gn_wire_put_str(&w, "image");
  gn_wire_put_str(&w, m.image);
  gn_wire_put_str(&w, "cmd");
  gn_wire_put_array(&w, 1);
  gn_wire_put_str(&w, "true");
  gn_wire_put_str(&w, "env");
  gn_wire_put_array(&w, 0);
  gn_wire_put_str(&w, "memory_mib");
  gn_wire_put_u64(&w, 64);
  gn_wire_put_str(&w, "pids");
  gn_wire_put_u64(&w, 16);
  gn_wire_put_str(&w, "network");
  gn_wire_put_bool(&w, false);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, m.nonce, sizeof m.nonce);
  gn_wire_put_str(&w, "issued_s");
  gn_wire_put_i64(&w, 1);
  gn_wire_put_str(&w, "expires_s");
  gn_wire_put_i64(&w, 2);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  if (output) {
    gn_wire_put_str(&w, "output");
    gn_wire_put_bool(&w, true);
  }
  gn_wire_put_str(&w, key);
  put(&w);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  gn__jobman_done(&m);
  return b;
}

static gn_buf manifest_with(net_writer put) {
  return manifest_with_key("net", false, put);
}

/* The hostile variants of net: each one thing wrong. */
static int variant;
static uint8_t key32[32] = {1};

static void put_peer(gn_wire_writer *w, const char *endpoint, uint64_t rank, size_t keylen) {
  gn_wire_put_map(w, 3);
  gn_wire_put_str(w, "key");
  gn_wire_put_bin(w, key32, keylen);
  gn_wire_put_str(w, "endpoint");
  gn_wire_put_str(w, endpoint);
  gn_wire_put_str(w, "rank");
  gn_wire_put_u64(w, rank);
}

static void put_net(gn_wire_writer *w) {
  uint64_t world = 3, rank = 0, lrank = 0, lworld = 1, port = 51820, mport = 29500, subnet = 9;
  const char *group = "j-00aa11bb22cc";
  size_t keylen = 32, npeers = 2;
  switch (variant) {
  case 1:
    rank = 3;
    break; /* rank >= world */
  case 2:
    world = 0;
    break; /* no world */
  case 3:
    world = 65;
    break; /* over 64 */
  case 4:
    port = 0;
    break; /* no port */
  case 5:
    port = 65536;
    break; /* not a port */
  case 6:
    mport = 0;
    break; /* no master port */
  case 7:
    subnet = 256;
    break; /* not a /24 host byte */
  case 8:
    keylen = 31;
    break; /* short key */
  case 9:
    group = "../../etc";
    break; /* not an id */
  case 10:
    lrank = 1;
    break; /* local rank >= local world */
  case 11:
    lworld = 4;
    break; /* local world > world */
  case 12:
    npeers = 3;
    break; /* a peer with this rank's own rank */
  case 13:
    npeers = 4;
    break; /* a duplicate peer rank */
  case 14:
    npeers = 64;
    break; /* over 63 peers */
  case 15:
    world = 1ull << 33;
    break; /* over 32 bits */
  default:
    break;
  }
  if (variant == 16) { /* net not a map */
    gn_wire_put_array(w, 0);
    return;
  }
  gn_wire_put_map(w, 10);
  gn_wire_put_str(w, "group");
  gn_wire_put_str(w, group);
  gn_wire_put_str(w, "rank");
  gn_wire_put_u64(w, rank);
  gn_wire_put_str(w, "world");
  gn_wire_put_u64(w, world);
  gn_wire_put_str(w, "local_rank");
  gn_wire_put_u64(w, lrank);
  gn_wire_put_str(w, "local_world");
  gn_wire_put_u64(w, lworld);
  gn_wire_put_str(w, "key");
  gn_wire_put_bin(w, key32, keylen);
  gn_wire_put_str(w, "port");
  gn_wire_put_u64(w, port);
  gn_wire_put_str(w, "master_port");
  gn_wire_put_u64(w, mport);
  gn_wire_put_str(w, "subnet");
  gn_wire_put_u64(w, subnet);
  gn_wire_put_str(w, "peers");
  gn_wire_put_array(w, (uint32_t)npeers);
  for (size_t i = 0; i < npeers; i++) {
    uint64_t r = i + 1;
    if (variant == 12 && i == 2)
      r = rank;
    if (variant == 13 && i >= 2)
      r = 1;
    if (variant == 14)
      r = i % 3;
    if (variant == 17 && i == 1) { /* an endpoint of 64 bytes: over the bound */
      char ep[80];
      memset(ep, '1', 64);
      ep[64] = 0;
      put_peer(w, ep, r, 32);
      continue;
    }
    put_peer(w, "203.0.113.5:51820", r, 32);
  }
}

static void test_manifest_net_hostile(void **state) {
  (void)state;
  gn_jobman d;
  variant = 0; /* the baseline decodes */
  gn_buf b = manifest_with(put_net);
  assert_int_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  assert_true(d.has_net);
  assert_int_equal(d.net.npeers, 2);
  gn__jobman_done(&d);
  gn_buf_done(&b);
  for (variant = 1; variant <= 17; variant++) {
    b = manifest_with(put_net);
    memset(&d, 0x5a, sizeof d);
    int r = gn__jobman_decode(b.data, b.len, &d);
    if (r == 0)
      fail_msg("hostile net variant %d decoded", variant);
    gn_buf_done(&b);
  }
  /* Every truncation of a good one is refused, none crashes. */
  variant = 0;
  b = manifest_with(put_net);
  for (size_t k = 0; k < b.len; k++)
    if (gn__jobman_decode(b.data, k, &d) == 0)
      fail_msg("a manifest cut to %zu of %zu bytes decoded", k, b.len);
  /* "output" that is not a bool is refused. */
  gn_buf_done(&b);
  gn_jobman m;
  fill_manifest(&m, 2, 0);
  m.has_net = false;
  m.output = true;
  encode(&m, &b);
  uint8_t *p = memmem(b.data, b.len, "output\xc3", 7);
  assert_non_null(p);
  p[6] = 0x01; /* a positive fixint instead of true */
  assert_int_not_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  gn_buf_done(&b);
  gn__jobman_done(&m);
}

/* The manifest's seed (a restarted rank's /output tar) round-trips; the
 * encoder and the decoder refuse a seed without output, of 0 bytes, over
 * GN_JOB_SEED_MAX, with a hash not of 32 bytes or not a map. */
static void test_manifest_seed(void **state) {
  (void)state;
  gn_jobman m, d;
  gn_buf b = {0};
  fill_manifest(&m, 2, 1);
  m.has_seed = true;
  memset(m.seed_sha256, 0xab, sizeof m.seed_sha256);
  m.seed_size = GN_JOB_SEED_MAX;
  encode(&m, &b);
  assert_int_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  assert_true(d.has_seed);
  assert_true(d.output);
  assert_int_equal(d.seed_size, GN_JOB_SEED_MAX);
  assert_memory_equal(d.seed_sha256, m.seed_sha256, 32);
  gn__jobman_done(&d);
  /* over the bound in the bytes (4 GiB + 1): refused */
  uint8_t *p = memmem(b.data, b.len, "size\xcf", 5);
  assert_non_null(p);
  p[5 + 7] = 1;
  assert_int_not_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  gn_buf_done(&b);
  /* every truncation refused */
  encode(&m, &b);
  for (size_t k = 0; k < b.len; k++)
    if (gn__jobman_decode(b.data, k, &d) == 0)
      fail_msg("a seeded manifest cut to %zu of %zu bytes decoded", k, b.len);
  /* no seed: no key */
  gn_buf_done(&b);
  m.has_seed = false;
  encode(&m, &b);
  assert_null(memmem(b.data, b.len, "seed", 4));
  assert_int_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  assert_false(d.has_seed);
  gn__jobman_done(&d);
  gn_buf_done(&b);
  /* the encoder refuses what the decoder would, writing nothing */
  m.has_seed = true;
  struct {
    bool output;
    uint64_t size;
  } bad[] = {{false, 100}, {true, 0}, {true, GN_JOB_SEED_MAX + 1}, {true, UINT64_MAX}};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    m.output = bad[i].output;
    m.seed_size = bad[i].size;
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    assert_int_not_equal(gn__jobman_encode(&m, &w), 0);
    assert_int_equal(gn_wire_writer_take(&w, &b), 0);
    assert_int_equal(b.len, 0);
    gn_wire_writer_done(&w);
    gn_buf_done(&b);
  }
  gn__jobman_done(&m);
}

/* Hand-written seed maps for the decoder (in manifest_with()'s "net" slot,
 * renamed): each one thing wrong. */
static void put_seed(gn_wire_writer *w) {
  uint8_t h[40];
  memset(h, 7, sizeof h);
  size_t hlen = 32;
  uint64_t size = 1000;
  if (variant == 8) { /* not a map */
    gn_wire_put_bin(w, h, 32);
    return;
  }
  if (variant == 1)
    hlen = 31;
  if (variant == 2)
    hlen = 33;
  if (variant == 3)
    size = 0;
  if (variant == 4)
    size = GN_JOB_SEED_MAX + 1;
  gn_wire_put_map(w, variant == 5 ? 1 : 2);
  gn_wire_put_str(w, "sha256");
  if (variant == 6)
    gn_wire_put_str(w, "0707070707070707070707070707070707070707070707070707070707070707");
  else
    gn_wire_put_bin(w, h, hlen);
  if (variant != 5) {
    gn_wire_put_str(w, "size");
    if (variant == 7)
      gn_wire_put_i64(w, -1);
    else
      gn_wire_put_u64(w, size);
  }
}

static void test_manifest_seed_hostile(void **state) {
  (void)state;
  gn_jobman d;
  variant = 0; /* the baseline decodes */
  gn_buf b = manifest_with_key("seed", true, put_seed);
  assert_int_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  assert_true(d.has_seed);
  assert_int_equal(d.seed_size, 1000);
  gn__jobman_done(&d);
  gn_buf_done(&b);
  /* a good seed without output=true */
  b = manifest_with_key("seed", false, put_seed);
  assert_int_not_equal(gn__jobman_decode(b.data, b.len, &d), 0);
  gn_buf_done(&b);
  for (variant = 1; variant <= 8; variant++) {
    b = manifest_with_key("seed", true, put_seed);
    if (gn__jobman_decode(b.data, b.len, &d) == 0)
      fail_msg("hostile seed variant %d decoded", variant);
    gn_buf_done(&b);
  }
  variant = 0;
}

static gn_buf seed_body(uint32_t type, int v) {
  gn_wire_writer w;
  gn_buf b = {0};
  static uint8_t data[GN_JOB_OUTPUT_CHUNK + 1];
  memset(data, 'x', sizeof data);
  gn_wire_writer_init(&w);
  if (type == GN_MSG_JOB_SEED_GET) {
    if (v == 0)
      gn__joboutput_get_encode(&w, "j-0123456789ab", "l-0123456789ab", 65536);
    else if (v == 1) { /* no lease */
      gn_wire_put_map(&w, 2);
      gn_wire_put_str(&w, "job_id");
      gn_wire_put_str(&w, "j-0123456789ab");
      gn_wire_put_str(&w, "offset");
      gn_wire_put_u64(&w, 0);
    } else /* a job id that is not one */
      gn__joboutput_get_encode(&w, "../x", "l-0123456789ab", 0);
  } else {
    if (v == 0)
      gn__joboutput_encode(&w, "j-0123456789ab", 32768, data, 100, true, 32868, NULL);
    else if (v == 1) { /* a chunk over GN_JOB_OUTPUT_CHUNK */
      gn_wire_put_map(&w, 5);
      gn_wire_put_str(&w, "job_id");
      gn_wire_put_str(&w, "j-0123456789ab");
      gn_wire_put_str(&w, "offset");
      gn_wire_put_u64(&w, 0);
      gn_wire_put_str(&w, "data");
      gn_wire_put_bin(&w, data, sizeof data);
      gn_wire_put_str(&w, "eof");
      gn_wire_put_bool(&w, true);
      gn_wire_put_str(&w, "size");
      gn_wire_put_u64(&w, sizeof data);
    } else /* offset + data past 2^64 */
      gn__joboutput_encode(&w, "j-0123456789ab", UINT64_MAX - 10, data, 100, false, 0, NULL);
  }
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  return b;
}

/* JOB_SEED_GET is JOB_OUTPUT_GET's shape, JOB_SEED JOB_OUTPUT's. */
static void test_seed_messages(void **state) {
  (void)state;
  gn_jobmsg m;
  gn_buf b = seed_body(GN_MSG_JOB_SEED_GET, 0);
  assert_int_equal(gn__jobmsg_decode(GN_MSG_JOB_SEED_GET, b.data, b.len, &m), 0);
  assert_string_equal(m.job_id, "j-0123456789ab");
  assert_string_equal(m.lease_id, "l-0123456789ab");
  assert_int_equal(m.offset, 65536);
  gn__jobmsg_done(&m);
  /* the same bytes decode as JOB_OUTPUT_GET */
  assert_int_equal(gn__jobmsg_decode(GN_MSG_JOB_OUTPUT_GET, b.data, b.len, &m), 0);
  gn__jobmsg_done(&m);
  gn_buf_done(&b);
  b = seed_body(GN_MSG_JOB_SEED, 0);
  assert_int_equal(gn__jobmsg_decode(GN_MSG_JOB_SEED, b.data, b.len, &m), 0);
  assert_string_equal(m.job_id, "j-0123456789ab");
  assert_int_equal(m.offset, 32768);
  assert_int_equal(m.data_len, 100);
  assert_true(m.eof);
  assert_int_equal(m.size, 32868);
  assert_string_equal(m.reason, "");
  gn__jobmsg_done(&m);
  for (size_t k = 0; k < b.len; k++)
    if (gn__jobmsg_decode(GN_MSG_JOB_SEED, b.data, k, &m) == 0)
      fail_msg("a JOB_SEED cut to %zu of %zu bytes decoded", k, b.len);
  gn_buf_done(&b);
  for (int v = 1; v <= 2; v++) {
    b = seed_body(GN_MSG_JOB_SEED_GET, v);
    if (gn__jobmsg_decode(GN_MSG_JOB_SEED_GET, b.data, b.len, &m) == 0)
      fail_msg("hostile JOB_SEED_GET %d decoded", v);
    gn_buf_done(&b);
    b = seed_body(GN_MSG_JOB_SEED, v);
    if (gn__jobmsg_decode(GN_MSG_JOB_SEED, b.data, b.len, &m) == 0)
      fail_msg("hostile JOB_SEED %d decoded", v);
    gn_buf_done(&b);
  }
  /* a refusal: no data, eof, the reason */
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__joboutput_encode(&w, "j-0123456789ab", 0, NULL, 0, true, 0, "no seed kept for this job");
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn__jobmsg_decode(GN_MSG_JOB_SEED, b.data, b.len, &m), 0);
  assert_true(m.eof);
  assert_int_equal(m.data_len, 0);
  assert_string_equal(m.reason, "no seed kept for this job");
  gn__jobmsg_done(&m);
  gn_buf_done(&b);
}

/* Config: training (-1 auto by default) and jobnet_ports, as flags. */
static void test_config_training_keys(void **state) {
  (void)state;
  gn_config c;
  char err[256];
  gn_config_defaults(&c);
  assert_int_equal(c.training, -1);
  assert_int_equal(c.jobnet_port_lo, 51820);
  assert_int_equal(c.jobnet_port_hi, 51899);
  char *ok[] = {"gpunetd", "--no-training", "--jobnet-ports", "40000-40009", NULL};
  assert_int_equal(gn_config_parse_args(&c, 4, ok, err, sizeof err), 0);
  assert_int_equal(c.training, 0);
  assert_int_equal(c.jobnet_port_lo, 40000);
  assert_int_equal(c.jobnet_port_hi, 40009);
  char *on[] = {"gpunetd", "--training", "--jobnet-ports", "7-7", NULL};
  assert_int_equal(gn_config_parse_args(&c, 4, on, err, sizeof err), 0);
  assert_int_equal(c.training, 1);
  assert_int_equal(c.jobnet_port_lo, 7);
  static const char *const bad[] = {"100-50", "0-10", "1-65536", "abc", "10-", "-10", "10", "10-20x", "10--20", ""};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    char *argv[] = {"gpunetd", "--jobnet-ports", (char *)bad[i], NULL};
    gn_config_defaults(&c);
    err[0] = 0;
    if (gn_config_parse_args(&c, 3, argv, err, sizeof err) == 0)
      fail_msg("--jobnet-ports '%s' taken", bad[i]);
    assert_non_null(strstr(err, "jobnet_ports"));
    assert_int_equal(c.jobnet_port_lo, 51820); /* unchanged */
  }
  gn_config_done(&c);
}

static void offer_base(gn_offer *o) {
  memset(o, 0, sizeof *o);
  o->seq = 1;
  o->issued_s = 1000;
  o->expires_s = 1060;
  snprintf(o->addr, sizeof o->addr, "192.0.2.1:7946");
  snprintf(o->gpu_model, sizeof o->gpu_model, "NVIDIA GeForce RTX 4090");
  o->gpus_free = o->gpus_total = 1;
  snprintf(o->currency, sizeof o->currency, "EUR");
  o->max_hours = 24;
}

/* Offers: training and jobnet_ports travel (signed) only when training;
 * a malformed range makes the offer malformed. */
static void test_offer_training_attributes(void **state) {
  (void)state;
  gn_offer o, d;
  gn_buf b = {0};
  offer_base(&o);
  assert_int_equal(gn_offer_encode(&o, &b), 0);
  assert_null(memmem(b.data, b.len, "training", 8));
  assert_int_equal(gn_offer_decode(b.data, b.len, &d), 0);
  assert_false(d.training);
  gn_buf_done(&b);
  o.training = true;
  o.jobnet_port_lo = 51820;
  o.jobnet_port_hi = 51899;
  assert_int_equal(gn_offer_encode(&o, &b), 0);
  assert_int_equal(gn_offer_decode(b.data, b.len, &d), 0);
  assert_true(d.training);
  assert_int_equal(d.jobnet_port_lo, 51820);
  assert_int_equal(d.jobnet_port_hi, 51899);
  /* hi below lo, in the encoded bytes: refused */
  uint8_t *p = memmem(b.data, b.len, "jobnet_ports", 12);
  assert_non_null(p);
  p += 12; /* fixarray of 2: 0x92, cd hi lo, cd hi lo */
  assert_int_equal(p[0], 0x92);
  p[2] ^= p[5], p[5] ^= p[2], p[2] ^= p[5];
  p[3] ^= p[6], p[6] ^= p[3], p[3] ^= p[6];
  assert_int_not_equal(gn_offer_decode(b.data, b.len, &d), 0);
  gn_buf_done(&b);
  /* an encoder refuses what a decoder would */
  o.jobnet_port_lo = 0;
  assert_int_not_equal(gn_offer_encode(&o, &b), 0);
  o.jobnet_port_lo = 60000;
  o.jobnet_port_hi = 50000;
  assert_int_not_equal(gn_offer_encode(&o, &b), 0);
  gn_buf_done(&b);
}

/* --- a real provider --------------------------------------------------------*/

typedef struct world {
  char dir[PATH_MAX];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *req_id;
  gn_transport *req_tp;
  int up;
  tn_inbox in;
  const char *extra[16];
  uint16_t port_lo, port_hi;
  tn_link link;
} world;

static world W;

/* gpunetd on W.dir (log appended to W.dir/gpunetd.log) with this world's
 * ports and extra flags. */
static pid_t spawn_daemon(const char *const *extra) {
  char ports[32];
  snprintf(ports, sizeof ports, "%u-%u", W.port_lo, W.port_hi);
  const char *args[48] = {"--data-dir",     W.dir,     "--listen", W.addr,        "--provide", "--simulate-gpu",
                          "RTX 4090",       "--price", "0.40",     "--max-hours", "2",         "--allow-no-userns",
                          "--jobnet-ports", ports};
  size_t n = 14;
  for (size_t i = 0; extra && extra[i]; i++) {
    assert_true(n + 1 < GN_ARRAY_SIZE(args));
    args[n++] = extra[i];
  }
  args[n] = NULL;
  return tn_daemon_spawnv(W.dir, "a", NULL, args);
}

static void start_world(const char *const *extra) {
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-trainprov-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  /* A port range of this test's own, so tests side by side do not meet. */
  W.port_lo = (uint16_t)(42000 + (getpid() % 2000) * 8);
  W.port_hi = (uint16_t)(W.port_lo + 7);
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = spawn_daemon(extra);
  uv_loop_init(&W.loop);
  W.link = (tn_link){&W.up, &W.in, NULL};
  tn_peer_new(&W.loop, &W.link, &W.req_id, &W.req_tp);
  tn_dial(&W.loop, W.req_tp, W.addr, &W.up, W.dir);
}

static void end_world(void) {
  gn_transport *tps[] = {W.req_tp};
  tn_world_end(&W.loop, tps, 1, W.daemon, &W.in, W.dir);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
}

static void msg_str(const msg *m, const char *key, char *out, size_t cap) {
  tn_msg_str(m, key, out, cap);
}

/* Waits for job's status in state (any when NULL); its reason to
 * ret_reason (256) and state to ret_state (32). */
static bool wait_status(const char *job, const char *state, uint64_t timeout_ms, char *ret_state, char *ret_reason) {
  return tn_wait_job_status(&W.loop, &W.in, job, state, timeout_ms, ret_state, ret_reason);
}

static void rent(gn_agreement *ret) {
  gn_lease_terms t;
  tn_lease_terms(&t, W.prov_id, W.req_id, 1, true);
  tn_rent(&W.loop, &W.in, W.req_tp, W.req_id, W.prov_id, &t, ret, NULL);
}

/* Signs and sends m (job id, nonce and times made fresh here); waits for
 * the first answer: its state and reason. */
static void send_manifest(gn_jobman *m, const char *lease_id, char *ret_job, char *ret_state, char *ret_reason) {
  tn_job_id(m->job_id, sizeof m->job_id);
  snprintf(m->lease_id, sizeof m->lease_id, "%s", lease_id);
  randombytes_buf(m->nonce, sizeof m->nonce);
  m->issued_s = gn_unix_s();
  m->expires_s = gn_unix_s() + 120;
  gn_buf body = {0};
  encode(m, &body);
  tn_send(W.req_tp, W.req_id, GN_MSG_JOB_MANIFEST, &body, W.prov_id->pk);
  gn_buf_done(&body);
  snprintf(ret_job, 32, "%s", m->job_id);
  if (!wait_status(m->job_id, NULL, 5000, ret_state, ret_reason))
    fail_msg("no answer to job %s", m->job_id);
}

static json_t *api_get(const char *path) {
  return tn_api_get(W.dir, path);
}

/* A one-rank-of-two manifest on this world's ports, with a real key pair. */
static void net_manifest(gn_jobman *m, const char *image, uint16_t port, const char *peer_endpoint,
                         const uint8_t peer_pub[32], uint8_t ret_pub[32]) {
  fill_manifest(m, 2, 0);
  snprintf(m->image, sizeof m->image, "%s", image);
  m->output = false;
  uint8_t pub[32];
  assert_int_equal(gn_jobnet_keypair(m->net.private_key, pub), 0);
  if (ret_pub)
    memcpy(ret_pub, pub, 32);
  tn_job_id(m->net.group, sizeof m->net.group);
  m->net.listen_port = port;
  if (peer_pub)
    memcpy(m->net.peers[0].public_key, peer_pub, 32);
  else
    assert_int_equal(gn_jobnet_keypair((uint8_t[32]){0}, m->net.peers[0].public_key), 0);
  snprintf(m->net.peers[0].endpoint, sizeof m->net.peers[0].endpoint, "%s", peer_endpoint);
  m->net.peers[0].rank = 1;
}

static void expect_rejected(gn_jobman *m, const char *lease, const char *part) {
  char job[32], st[32], reason[256];
  send_manifest(m, lease, job, st, reason);
  if (strcmp(st, "rejected") != 0 || !strstr(reason, part))
    fail_msg("job %s: %s '%s', expected rejected with '%s'", job, st, reason, part);
}

static void test_provider_refuses_training_it_must_not_run(void **state) {
  (void)state;
  start_world((const char *const[]){"--no-training", NULL});
  json_t *st = api_get("/v1/status");
  json_t *tr = json_object_get(st, "training");
  assert_non_null(tr);
  assert_false(json_boolean_value(json_object_get(tr, "enabled")));
  json_decref(st);
  gn_agreement a;
  rent(&a);
  gn_jobman m;
  net_manifest(&m, "127.0.0.1:9/bb@sha256:0000000000000000000000000000000000000000000000000000000000000000", W.port_lo,
               "203.0.113.9:51820", NULL, NULL);
  expect_rejected(&m, a.terms.lease_id, "does not take training jobs");
  gn__jobman_done(&m);
  end_world();
}

static void test_provider_refuses_bad_training_manifests(void **state) {
  (void)state;
  start_world((const char *const[]){"--training", NULL});
  json_t *st = api_get("/v1/status");
  json_t *tr = json_object_get(st, "training");
  assert_true(json_boolean_value(json_object_get(tr, "enabled")));
  char ports[32];
  snprintf(ports, sizeof ports, "%u-%u", W.port_lo, W.port_hi);
  assert_string_equal(json_string_value(json_object_get(tr, "jobnet_ports")), ports);
  json_decref(st);
  gn_agreement a;
  rent(&a);
  const char *img = "127.0.0.1:9/bb@sha256:0000000000000000000000000000000000000000000000000000000000000000";
  gn_jobman m;
  /* a port below and above the range */
  net_manifest(&m, img, (uint16_t)(W.port_lo - 1), "203.0.113.9:51820", NULL, NULL);
  expect_rejected(&m, a.terms.lease_id, "outside this provider's range");
  gn__jobman_done(&m);
  net_manifest(&m, img, (uint16_t)(W.port_hi + 1), "203.0.113.9:51820", NULL, NULL);
  expect_rejected(&m, a.terms.lease_id, "outside this provider's range");
  gn__jobman_done(&m);
  /* a port something else holds */
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(W.port_lo + 3))};
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  net_manifest(&m, img, (uint16_t)(W.port_lo + 3), "203.0.113.9:51820", NULL, NULL);
  expect_rejected(&m, a.terms.lease_id, "is busy");
  gn__jobman_done(&m);
  close(fd);
  /* world 3 but one peer: not a full mesh */
  net_manifest(&m, img, W.port_lo, "203.0.113.9:51820", NULL, NULL);
  m.net.world = 3;
  expect_rejected(&m, a.terms.lease_id, "lists 1 peers, not 2");
  gn__jobman_done(&m);
  /* endpoints the provider's socket must never be sent at */
  static const char *const bad_ep[] = {"127.0.0.1:51820", "224.0.0.1:51820", "169.254.1.1:51820", "host:51820",
                                       "203.0.113.9:0"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad_ep); i++) {
    net_manifest(&m, img, W.port_lo, bad_ep[i], NULL, NULL);
    expect_rejected(&m, a.terms.lease_id, "bad job network");
    gn__jobman_done(&m);
  }
  /* the peer with this rank's own key */
  uint8_t pub[32];
  net_manifest(&m, img, W.port_lo, "203.0.113.9:51820", NULL, pub);
  memcpy(m.net.peers[0].public_key, pub, 32);
  expect_rejected(&m, a.terms.lease_id, "bad job network");
  gn__jobman_done(&m);
  /* Nothing of any of them was made. */
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/run/netns", W.dir);
  assert_true(!th_exists(path) || th_count_entries(path) == 0);
  end_world();
}

/* --- a rank that runs -------------------------------------------------------*/

static th_registry reg;
static const char *run_skip;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool have_exec(const char *name) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
  return system(cmd) == 0;
}

static int setup_run(void **state) {
  (void)state;
  run_skip = NULL;
  if (geteuid() != 0)
    run_skip = "needs root (network namespaces, the provider's jobs under real runc)";
  else if (!have_exec("wireguard-go") || !have_exec("ip") || access("/dev/net/tun", R_OK | W_OK) != 0)
    run_skip = "needs wireguard-go, ip (iproute2) and /dev/net/tun";
  else if (!have_exec("runc") && !have_exec("crun"))
    run_skip = "needs runc or crun";
  else if (th_registry_start(&reg) < 0)
    run_skip = "cannot start the test registry (scripts/registry: docker-registry, umoci)";
  return 0;
}

static int teardown_run(void **state) {
  (void)state;
  th_registry_stop(&reg);
  return 0;
}

/* Runs fn in network namespace path on this thread, then comes back. */
static void in_netns(const char *path, void (*fn)(void *), void *ud) {
  int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  int other = open(path, O_RDONLY | O_CLOEXEC);
  assert_true(self >= 0 && other >= 0);
  assert_int_equal(setns(other, CLONE_NEWNET), 0);
  fn(ud);
  assert_int_equal(setns(self, CLONE_NEWNET), 0);
  close(self);
  close(other);
}

typedef struct peer_up {
  gn_jobnet_config *cfg;
  const char *job_ns;
  gn_jobnet *net;
  int rc;
  char err[512];
} peer_up;

static void do_peer_up(void *ud) {
  peer_up *p = ud;
  p->rc = gn_jobnet_up(p->cfg, p->job_ns, &p->net, p->err, sizeof p->err);
}

static char *read_all(const char *path) {
  return th_read_file(path, NULL);
}

/* Fetches job's /output snapshot from the provider: JOB_OUTPUT_GET from
 * offset 0 until eof; the tar into ret. false (reason in ret_reason, 256)
 * when refused. */
static bool fetch_output(const char *job, const char *lease, gn_buf *ret, char *ret_reason, uint64_t timeout_ms) {
  uint64_t offset = 0;
  for (int i = 0; i < 100000; i++) {
    tn_send_chunk_get(W.req_tp, W.req_id, GN_MSG_JOB_OUTPUT_GET, job, lease, offset, W.prov_id->pk);
    msg m;
    if (!tn_wait_msg(&W.loop, &W.in, GN_MSG_JOB_OUTPUT, NULL, NULL, timeout_ms, &m)) {
      snprintf(ret_reason, 256, "no answer");
      return false;
    }
    gn_envelope e;
    gn_jobmsg o;
    assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &e), 0);
    assert_int_equal(gn__jobmsg_decode(GN_MSG_JOB_OUTPUT, e.body, e.body_len, &o), 0);
    assert_string_equal(o.job_id, job);
    assert_int_equal(o.offset, offset);
    assert_true(o.data_len <= GN_JOB_OUTPUT_CHUNK);
    bool done = o.eof;
    if (o.reason[0]) {
      snprintf(ret_reason, 256, "%s", o.reason);
      gn__jobmsg_done(&o);
      gn_buf_done(&m.raw);
      return false;
    }
    gn_buf_append(ret, o.data, o.data_len);
    offset += o.data_len;
    if (done)
      assert_int_equal(o.size, offset);
    gn__jobmsg_done(&o);
    gn_buf_done(&m.raw);
    if (done)
      return true;
  }
  fail_msg("no end to job %s's output", job);
  return false;
}

/* The tar's entries: "name=content;" for files, "name/;" for directories. */
static void tar_list(const gn_buf *tar, char *out, size_t cap) {
  struct archive *a = archive_read_new();
  archive_read_support_format_tar(a);
  assert_int_equal(archive_read_open_memory(a, tar->data, tar->len), ARCHIVE_OK);
  struct archive_entry *ae;
  out[0] = 0;
  while (archive_read_next_header(a, &ae) == ARCHIVE_OK) {
    size_t k = strlen(out);
    if (archive_entry_filetype(ae) == AE_IFDIR) {
      snprintf(out + k, cap - k, "%s/;", archive_entry_pathname(ae));
      continue;
    }
    char data[256] = "";
    la_ssize_t n = archive_read_data(a, data, sizeof data - 1);
    data[n > 0 ? n : 0] = 0;
    snprintf(out + k, cap - k, "%s=%s;", archive_entry_pathname(ae), data);
  }
  archive_read_free(a);
}

/* What the run test made, for its teardown when it fails half way. */
static struct {
  char host_ns[64], peer_ns[64], veth[16];
  gn_jobnet *peer_net;
  pid_t srv;
  bool world;
  gn_transport *tp2; /* a second node's connection (the seed test) */
  gn_identity *id2;
} R;

static int teardown_rank(void **state) {
  (void)state;
  if (R.srv > 0) {
    kill(R.srv, SIGKILL);
    waitpid(R.srv, NULL, 0);
  }
  if (R.tp2)
    gn_transport_close(R.tp2, NULL, NULL); /* end_world runs the loop until it is gone */
  if (R.world)
    end_world();
  R.id2 = gn_identity_free(R.id2);
  R.peer_net = gn_jobnet_down(R.peer_net);
  if (R.host_ns[0])
    sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null; ip link del %sa 2>/dev/null; true", R.host_ns,
       R.peer_ns, R.veth);
  memset(&R, 0, sizeof R);
  return 0;
}

static void test_rank_reaches_its_peer_and_nothing_else(void **state) {
  (void)state;
  if (run_skip) {
    print_message("skipped: %s\n", run_skip);
    skip();
  }
  int id = getpid() % 100000;
  char host_ns[64], peer_ns[64], host_path[128], peer_path[128], veth[16];
  snprintf(host_ns, sizeof host_ns, "gntp%dh", id); /* the peer rank's provider host */
  snprintf(peer_ns, sizeof peer_ns, "gntp%dj", id); /* the peer rank's job */
  snprintf(host_path, sizeof host_path, "/run/netns/%s", host_ns);
  snprintf(peer_path, sizeof peer_path, "/run/netns/%s", peer_ns);
  snprintf(veth, sizeof veth, "gtp%d", id);
  int net_b = 100 + id % 100; /* 192.168.B.0/24 joins this host and the peer's */
  sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null; ip link del %sa 2>/dev/null", host_ns, peer_ns, veth);
  snprintf(R.host_ns, sizeof R.host_ns, "%s", host_ns);
  snprintf(R.peer_ns, sizeof R.peer_ns, "%s", peer_ns);
  snprintf(R.veth, sizeof R.veth, "%s", veth);
  assert_int_equal(sh("ip netns add %s && ip netns add %s", host_ns, peer_ns), 0);
  assert_int_equal(sh("ip link add %sa type veth peer name %sb && ip link set %sb netns %s && "
                      "ip address add 192.168.%d.1/24 dev %sa && ip link set %sa up && "
                      "ip -n %s address add 192.168.%d.2/24 dev %sb && ip -n %s link set %sb up && "
                      "ip -n %s link set lo up && ip -n %s link set lo up",
                      veth, veth, veth, host_ns, net_b, veth, veth, host_ns, net_b, veth, host_ns, veth, host_ns,
                      peer_ns),
                   0);
  /* A TCP server on this host's side of the veth: the job must not reach it. */
  int host_srv = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in hs = {.sin_family = AF_INET, .sin_port = 0};
  char host_ip[32];
  snprintf(host_ip, sizeof host_ip, "192.168.%d.1", net_b);
  inet_pton(AF_INET, host_ip, &hs.sin_addr);
  socklen_t hl = sizeof hs;
  assert_int_equal(bind(host_srv, (struct sockaddr *)&hs, sizeof hs), 0);
  assert_int_equal(listen(host_srv, 4), 0);
  assert_int_equal(getsockname(host_srv, (struct sockaddr *)&hs, &hl), 0);
  int host_port = ntohs(hs.sin_port);

  start_world((const char *const[]){"--training", "--registry-allow", "127.0.0.1", NULL});
  R.world = true;
  gn_agreement a;
  rent(&a);
  char image[256];
  snprintf(image, sizeof image, "%s/bb@%s", reg.host, reg.digest);
  /* The peer rank (rank 1), up in its own host's namespace. */
  uint16_t rank0_port = (uint16_t)(W.port_lo + 1), peer_port = (uint16_t)(W.port_lo + 2);
  gn_jobman m;
  uint8_t rank0_pub[32];
  char ep[64];
  snprintf(ep, sizeof ep, "192.168.%d.2:%u", net_b, peer_port);
  net_manifest(&m, image, rank0_port, ep, NULL, rank0_pub);
  m.output = true;
  gn_jobnet_config *pc = gn_jobnet_config_new();
  uint8_t peer_pub[32];
  assert_int_equal(gn_jobnet_keypair(pc->private_key, peer_pub), 0);
  memcpy(m.net.peers[0].public_key, peer_pub, 32);
  struct in_addr subnet = {.s_addr = htonl(10u << 24 | 77u << 16 | m.net.subnet_host << 8)};
  assert_int_equal(gn_jobnet_ifname(m.net.group, 1, pc->ifname), 0);
  assert_int_equal(gn_jobnet_rank_address(subnet, 24, 1, &pc->address), 0);
  pc->prefix_len = 24;
  pc->listen_port = peer_port;
  pc->allow_private_endpoints = true;
  pc->backend = GN_JOBNET_USERSPACE;
  pc->peer_count = 1;
  memcpy(pc->peers[0].public_key, rank0_pub, 32);
  snprintf(pc->peers[0].endpoint, sizeof pc->peers[0].endpoint, "192.168.%d.1:%u", net_b, rank0_port);
  assert_int_equal(gn_jobnet_rank_address(subnet, 24, 0, &pc->peers[0].address), 0);
  peer_up pu = {.cfg = pc, .job_ns = peer_path};
  in_netns(host_path, do_peer_up, &pu);
  R.peer_net = pu.net;
  if (pu.rc < 0)
    fail_msg("the peer rank's job network: %s (%s)", gn_strerror(pu.rc), pu.err);
  char peer_ip[32];
  inet_ntop(AF_INET, &pc->address, peer_ip, sizeof peer_ip);
  /* The peer rank's job: a TCP server on its job address that answers. */
  char srv_out[PATH_MAX + 32];
  snprintf(srv_out, sizeof srv_out, "%s/peer-got", W.dir);
  /* It writes the line it reads to srv_out and then answers "ack", so the
   * job's PEER_OK means the greeting arrived: a job that only sent it could
   * end, and its namespace go, before a segment lost on the busy userspace
   * WireGuard path was sent again (CI saw PEER_OK with nothing received). */
  char srv_sh[PATH_MAX + 96];
  snprintf(srv_sh, sizeof srv_sh, "read l; echo \"$l\" > '%s'; echo ack", srv_out);
  pid_t srv = fork();
  if (srv == 0) {
    int fd = open(peer_path, O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0)
      _exit(99);
    execlp("busybox", "busybox", "nc", "-l", "-p", "7000", "-e", "sh", "-c", srv_sh, (char *)NULL);
    _exit(127);
  }
  R.srv = srv;
  /* Rank 0's job: talks to its peer, tries this host, prints its env and
   * interfaces, writes /output. */
  char script[1024];
  snprintf(script, sizeof script,
           "echo hello-from-rank0 | nc -w 5 %s 7000 | grep -q ack && echo PEER_OK; "
           "nc -w 2 %s %d </dev/null && echo HOST_REACHED || echo HOST_BLOCKED; "
           "env | grep -E '^(MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GLOO_SOCKET_IFNAME|"
           "NCCL_SOCKET_IFNAME)=' | sort; ls /sys/class/net 2>&1; cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
           "echo out > /output/result && mkdir /output/d && echo y > /output/d/y && "
           "ln -s /etc/shadow /output/evil && ln -s / /output/root && echo OUTPUT_OK",
           peer_ip, host_ip, host_port);
  free(m.argv[0]); /* the command, not the key: gn__jobman_done would wipe it */
  m.argc = 3;
  m.argv[0] = strdup("sh");
  m.argv[1] = strdup("-c");
  m.argv[2] = strdup(script);
  m.envc = 1;
  m.env[0] = strdup("RANK=99"); /* the provider's value wins */
  char job[32], st[32], reason[256];
  send_manifest(&m, a.terms.lease_id, job, st, reason);
  if (strcmp(st, "pulling") != 0)
    fail_msg("job %s: %s (%s)", job, st, reason);
  bool ended = wait_status(job, "exited", 60000, st, reason) || wait_status(job, "failed", 100, st, reason);
  char logp[PATH_MAX + 64];
  snprintf(logp, sizeof logp, "%s/run/jobs/%s.log", W.dir, job);
  char *log = read_all(logp);
  print_message("  job log:\n%s\n", log ? log : "(none)");
  if (!ended)
    fail_msg("job %s did not end (see %s/gpunetd.log)", job, W.dir);
  if (strcmp(st, "exited") != 0)
    fail_msg("job %s %s: %s", job, st, reason);
  assert_non_null(log);
  char want[128], ifname[16];
  assert_int_equal(gn_jobnet_ifname(job, 0, ifname), 0); /* named after the job, not the group */
  assert_non_null(strstr(log, "PEER_OK"));
  assert_non_null(strstr(log, "HOST_BLOCKED"));
  assert_null(strstr(log, "HOST_REACHED"));
  snprintf(want, sizeof want, "MASTER_ADDR=10.77.%u.1\n", m.net.subnet_host);
  assert_non_null(strstr(log, want));
  assert_non_null(strstr(log, "MASTER_PORT=29500\n"));
  assert_non_null(strstr(log, "\nRANK=0\n"));
  assert_non_null(strstr(log, "WORLD_SIZE=2\n"));
  assert_non_null(strstr(log, "LOCAL_RANK=0\n"));
  assert_non_null(strstr(log, "LOCAL_WORLD_SIZE=1\n"));
  snprintf(want, sizeof want, "GLOO_SOCKET_IFNAME=%s\n", ifname);
  assert_non_null(strstr(log, want));
  snprintf(want, sizeof want, "NCCL_SOCKET_IFNAME=%s\n", ifname);
  assert_non_null(strstr(log, want));
  assert_null(strstr(log, "RANK=99"));
  /* /proc/net/dev in the job: lo and the job interface, nothing else */
  snprintf(want, sizeof want, "%s\n", ifname);
  assert_non_null(strstr(log, want));
  assert_null(strstr(log, "eth"));
  assert_null(strstr(log, veth));
  assert_non_null(strstr(log, "OUTPUT_OK"));
  free(log);
  /* the peer's server got the greeting */
  waitpid(srv, NULL, 0);
  R.srv = 0;
  char *got = read_all(srv_out);
  assert_non_null(got);
  assert_non_null(strstr(got, "hello-from-rank0"));
  free(got);
  /* /output is kept, owned by the job's mapped root when it has one */
  char outp[PATH_MAX + 64];
  snprintf(outp, sizeof outp, "%s/output/%s/result", W.dir, job);
  char *res = read_all(outp);
  assert_non_null(res);
  assert_string_equal(res, "out\n");
  free(res);
  /* The lease holder fetches /output as a tar, 32 KiB at a time: the files
   * and directories, no link (neither the file one nor the one to /). */
  gn_buf tar = {0};
  char why[256] = "", list[1024];
  if (!fetch_output(job, a.terms.lease_id, &tar, why, 10000))
    fail_msg("output of %s refused: %s", job, why);
  tar_list(&tar, list, sizeof list);
  print_message("  /output: %s (%zu bytes of tar)\n", list, tar.len);
  assert_non_null(strstr(list, "result=out\n;"));
  assert_true(strstr(list, "d/;") || strstr(list, "d//;")); /* a directory, with pax's slash */
  assert_non_null(strstr(list, "d/y=y\n;"));
  assert_null(strstr(list, "evil"));
  assert_null(strstr(list, "root"));
  gn_buf_done(&tar);
  /* A job this provider does not run: no answer at all. */
  tar = (gn_buf){0};
  assert_false(fetch_output("j-000000000000", a.terms.lease_id, &tar, why, 1000));
  assert_string_equal(why, "no answer");
  gn_buf_done(&tar);
  /* Nothing left: no namespace file, no record, no interface on the host,
   * no wireguard-go socket. */
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/run/netns", W.dir);
  bool clean = false;
  for (int i = 0; i < 100 && !clean; i++) {
    clean = th_count_entries(p) == 0;
    if (!clean)
      tn_run_until_flag(&W.loop, &(int){0}, 50);
  }
  assert_true(clean);
  snprintf(p, sizeof p, "/var/run/wireguard/%s.sock", ifname);
  assert_false(th_exists(p));
  assert_int_equal(if_nametoindex(ifname), 0);
  json_t *s = api_get("/v1/status");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "training"), "ranks")), 0);
  json_decref(s);

  gn__jobman_done(&m);
  gn_jobnet_config_free(pc);
  close(host_srv); /* the rest: teardown_rank */
}

/* Where a running rank's job network lives. */
typedef struct rank_net {
  char record[PATH_MAX + 64]; /* run/netns/JOB.wg: its interface and wireguard-go's pid */
  char ns[PATH_MAX + 64];     /* the job's network namespace */
  char sock[128];             /* wireguard-go's socket */
  char cmdline[64];           /* /proc/PID/cmdline of wireguard-go */
} rank_net;

/* Rents a GPU and runs `sleep 600` on it as a rank listening on port (the
 * peer dials in: nothing is sent), until it reports running; where its job
 * network lives to ret (its socket is there). */
static void start_sleeping_rank(uint16_t port, rank_net *ret) {
  gn_agreement a;
  rent(&a);
  char image[256];
  snprintf(image, sizeof image, "%s/bb@%s", reg.host, reg.digest);
  gn_jobman m;
  net_manifest(&m, image, port, "", NULL, NULL);
  free(m.argv[0]);
  m.argc = 2;
  m.argv[0] = strdup("sleep");
  m.argv[1] = strdup("600");
  char job[32], st[32], reason[256];
  send_manifest(&m, a.terms.lease_id, job, st, reason);
  gn__jobman_done(&m);
  if (strcmp(st, "pulling") != 0)
    fail_msg("job %s: %s (%s)", job, st, reason);
  if (!wait_status(job, "running", 60000, st, reason))
    fail_msg("job %s never ran: %s (%s; see %s/gpunetd.log)", job, st, reason, W.dir);
  char ifname[32] = "";
  snprintf(ret->record, sizeof ret->record, "%s/run/netns/%s.wg", W.dir, job);
  snprintf(ret->ns, sizeof ret->ns, "%s/run/netns/%s", W.dir, job);
  char *text = th_read_file(ret->record, NULL);
  int wg = 0;
  assert_non_null(text);
  assert_int_equal(sscanf(text, "%31s %d", ifname, &wg), 2);
  free(text);
  assert_true(wg > 0);
  snprintf(ret->sock, sizeof ret->sock, "/var/run/wireguard/%s.sock", ifname);
  snprintf(ret->cmdline, sizeof ret->cmdline, "/proc/%d/cmdline", wg);
  assert_true(th_exists(ret->sock));
}

/* gpunetd killed while a rank runs leaves its job network behind (the
 * wireguard-go child, its socket, the namespace); the next start removes
 * all of it. */
static void test_restart_after_crash_removes_the_job_network(void **state) {
  (void)state;
  if (run_skip) {
    print_message("skipped: %s\n", run_skip);
    skip();
  }
  const char *const extra[] = {"--training", "--registry-allow", "127.0.0.1", NULL};
  start_world(extra);
  R.world = true;
  rank_net n;
  start_sleeping_rank((uint16_t)(W.port_lo + 4), &n);
  assert_true(th_exists(n.ns));
  kill(W.daemon, SIGKILL);
  waitpid(W.daemon, NULL, 0);
  W.daemon = 0;
  char *cl = th_read_file(n.cmdline, NULL);
  assert_non_null(cl);
  assert_non_null(strstr(cl, "wireguard-go")); /* the crash left it running */
  free(cl);
  W.daemon = spawn_daemon(extra);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; i++) {
    cl = th_read_file(n.cmdline, NULL); /* a reaped or zombie process has none */
    gone = !th_exists(n.record) && !th_exists(n.ns) && !th_exists(n.sock) && (!cl || !strstr(cl, "wireguard-go"));
    free(cl);
    if (!gone)
      usleep(100000);
  }
  if (!gone)
    fail_msg("after the restart: record %d, namespace %d, socket %d, wireguard-go %d", th_exists(n.record),
             th_exists(n.ns), th_exists(n.sock), th_exists(n.cmdline));
}

/* A crash while a rank's network came up: the record names the interface
 * with no pid yet ("IFNAME 0", written before wireguard-go starts) and its
 * wireguard-go runs on. The next start removes its socket, which stops it
 * (wireguard-go watches the file), and the record. */
static void test_restart_finds_wireguard_go_left_without_pid(void **state) {
  (void)state;
  if (run_skip) {
    print_message("skipped: %s\n", run_skip);
    skip();
  }
  const char *const extra[] = {"--training", "--registry-allow", "127.0.0.1", NULL};
  start_world(extra);
  R.world = true;
  kill(W.daemon, SIGKILL);
  waitpid(W.daemon, NULL, 0);
  W.daemon = 0;
  char ifname[16], sock[128], dir[PATH_MAX + 16], record[PATH_MAX + 64];
  snprintf(ifname, sizeof ifname, "gnjt%06dr0", (int)(getpid() % 1000000));
  snprintf(sock, sizeof sock, "/var/run/wireguard/%s.sock", ifname);
  snprintf(dir, sizeof dir, "%s/run/netns", W.dir);
  snprintf(record, sizeof record, "%s/j-crashedrank.wg", dir);
  sh("mkdir -p %s && echo '%s 0' > %s", dir, ifname, record);
  /* In a namespace of its own, as if already moved into the job's: the
   * host has no such interface to delete. */
  char ns[32];
  snprintf(ns, sizeof ns, "gntw%d", (int)(getpid() % 1000000));
  assert_int_equal(sh("ip netns add %s", ns), 0);
  pid_t wg = fork();
  if (wg == 0) {
    setenv("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1", 1);
    execlp("ip", "ip", "netns", "exec", ns, "wireguard-go", "-f", ifname, (char *)NULL);
    _exit(127);
  }
  assert_true(wg > 0);
  for (int i = 0; i < 100 && !th_exists(sock); i++)
    usleep(50000);
  if (!th_exists(sock)) {
    kill(wg, SIGKILL);
    waitpid(wg, NULL, 0);
    sh("ip netns del %s", ns);
    fail_msg("wireguard-go -f %s made no socket", ifname);
  }
  W.daemon = spawn_daemon(extra);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; i++) {
    gone = waitpid(wg, NULL, WNOHANG) == wg; /* ours to reap once the daemon stopped it */
    if (!gone)
      usleep(100000);
  }
  if (!gone) {
    kill(wg, SIGKILL);
    waitpid(wg, NULL, 0);
    sh("ip netns del %s; rm -f %s", ns, sock);
    fail_msg("the restarted daemon left wireguard-go -f %s running (see %s/gpunetd.log)", ifname, W.dir);
  }
  sh("ip netns del %s", ns);
  for (int i = 0; i < 50 && (th_exists(record) || th_exists(sock)); i++)
    usleep(100000);
  if (th_exists(record) || th_exists(sock))
    fail_msg("after the restart: record %d, socket %d", th_exists(record), th_exists(sock));
}

/* A rank running when gpunetd is told to stop (SIGTERM): its lease ends,
 * the job is stopped, and its job network and namespace are gone by the
 * time the daemon has exited. */
static void test_shutdown_takes_the_job_network_down(void **state) {
  (void)state;
  if (run_skip) {
    print_message("skipped: %s\n", run_skip);
    skip();
  }
  start_world((const char *const[]){"--training", "--registry-allow", "127.0.0.1", NULL});
  R.world = true;
  rank_net n;
  start_sleeping_rank((uint16_t)(W.port_lo + 5), &n);
  tn_daemon_stop(W.daemon); /* SIGTERM, and waits for it to exit */
  W.daemon = 0;
  char *cl = th_read_file(n.cmdline, NULL);
  bool wg_alive = cl && strstr(cl, "wireguard-go");
  free(cl);
  if (th_exists(n.record) || th_exists(n.ns) || th_exists(n.sock) || wg_alive) {
    sh("tail -n 40 %s/gpunetd.log >&2", W.dir);
    fail_msg("after the shutdown: record %d, namespace %d, socket %d, wireguard-go %d", th_exists(n.record),
             th_exists(n.ns), th_exists(n.sock), wg_alive);
  }
}

/* --- the seed: a restarted rank's /output ------------------------------------*/

typedef struct tar_ent {
  const char *name;
  char type;        /* 'f' file, 'd' directory, 'l' symlink, 'h' hardlink, 'p' fifo, 'c' device */
  const char *data; /* a file's content, or the link's target */
  size_t len;       /* a file's bytes when data is NULL (a pattern) */
  mode_t perm;
} tar_ent;

/* A pax tar of the entries, as a requester keeps one (any name, any type:
 * the test's own writer checks nothing). */
static void tar_make(const tar_ent *e, size_t n, gn_buf *ret) {
  size_t cap = 4u << 20, used = 0;
  uint8_t *buf = malloc(cap);
  assert_non_null(buf);
  struct archive *a = archive_write_new();
  bool sparse = false;
  for (size_t i = 0; i < n; i++)
    sparse = sparse || e[i].type == 's';
  /* pax (not restricted) for a sparse file's map */
  assert_int_equal(sparse ? archive_write_set_format_pax(a) : archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  assert_int_equal(archive_write_open_memory(a, buf, cap, &used), ARCHIVE_OK);
  for (size_t i = 0; i < n; i++) {
    struct archive_entry *ae = archive_entry_new();
    archive_entry_set_pathname(ae, e[i].name);
    archive_entry_set_perm(ae, e[i].perm ? e[i].perm : 0644);
    size_t len = e[i].type == 'f' ? (e[i].data ? strlen(e[i].data) : e[i].len) : 0;
    switch (e[i].type) {
    case 'd':
      archive_entry_set_filetype(ae, AE_IFDIR);
      break;
    case 'l':
      archive_entry_set_filetype(ae, AE_IFLNK);
      archive_entry_set_symlink(ae, e[i].data);
      break;
    case 'h':
      archive_entry_set_filetype(ae, AE_IFREG);
      archive_entry_set_hardlink(ae, e[i].data);
      break;
    case 'p':
      archive_entry_set_filetype(ae, AE_IFIFO);
      break;
    case 'c':
      archive_entry_set_filetype(ae, AE_IFCHR);
      archive_entry_set_rdevmajor(ae, 1);
      archive_entry_set_rdevminor(ae, 3);
      break;
    case 's':
      archive_entry_set_filetype(ae, AE_IFREG);
      archive_entry_set_size(ae, (la_int64_t)e[i].len);
      archive_entry_sparse_add_entry(ae, (la_int64_t)e[i].len - 1, 1);
      break;
    default:
      archive_entry_set_filetype(ae, AE_IFREG);
      archive_entry_set_size(ae, (la_int64_t)len);
    }
    assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
    archive_entry_free(ae);
    if (e[i].type == 's')
      assert_int_equal(archive_write_data(a, "x", 1), 1);
    if (e[i].type == 'f' && len) {
      uint8_t *d = malloc(len);
      assert_non_null(d);
      for (size_t k = 0; k < len; k++)
        d[k] = e[i].data ? (uint8_t)e[i].data[k] : (uint8_t)('a' + k % 26);
      assert_int_equal(archive_write_data(a, d, len), (la_ssize_t)len);
      free(d);
    }
  }
  assert_int_equal(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  *ret = (gn_buf){0};
  gn_buf_append(ret, buf, used);
  free(buf);
}

/* An output-only job (no net) that starts from a seed of size bytes with
 * hash sha (of tar when NULL). */
static void seed_manifest(gn_jobman *m, const char *image, const char *script, const gn_buf *tar, uint64_t size,
                          const uint8_t *sha) {
  fill_manifest(m, 1, 0);
  m->has_net = false;
  m->output = true;
  snprintf(m->image, sizeof m->image, "%s", image);
  free(m->argv[0]);
  m->argc = 3;
  m->argv[0] = strdup("sh");
  m->argv[1] = strdup("-c");
  m->argv[2] = strdup(script);
  m->has_seed = true;
  m->seed_size = size ? size : tar->len;
  if (sha)
    memcpy(m->seed_sha256, sha, 32);
  else
    crypto_hash_sha256(m->seed_sha256, tar->data, tar->len);
}

enum { SERVE_OK, SERVE_SILENT, SERVE_BAD_OFFSET, SERVE_REFUSE, SERVE_NO_SIZE, SERVE_STOP };

static void send_body(gn_transport *tp, const gn_identity *id, uint32_t type, gn_wire_writer *w) {
  gn_buf body = {0}, env = {0};
  assert_int_equal(gn_wire_writer_take(w, &body), 0);
  assert_int_equal(gn_envelope_seal(id, type, body.data, body.len, &env), 0);
  assert_int_equal(gn_transport_send(tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&body);
  gn_buf_done(&env);
}

static void send_seed_chunk(gn_transport *tp, const gn_identity *id, const char *job, uint64_t offset,
                            const uint8_t *data, size_t len, bool eof, uint64_t size, const char *reason) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__joboutput_encode(&w, job, offset, data, len, eof, size, reason);
  send_body(tp, id, GN_MSG_JOB_SEED, &w);
  gn_wire_writer_done(&w);
}

/* Plays the lease holder for job's seed: answers its JOB_SEED_GETs from
 * tar (misbehaving as mode says) until the job's first status after
 * "pulling", which it returns (state 32, reason 256). Checks each ask: for
 * this job and lease, at the offset that follows the last answer, one at a
 * time. The asks to ret_gets. */
static bool serve_seed(const char *job, const char *lease, const gn_buf *tar, int mode, uint64_t timeout_ms,
                       char *ret_state, char *ret_reason, int *ret_gets) {
  uint64_t end = gn_mono_ms() + timeout_ms, next = 0;
  int gets = 0;
  for (;;) {
    for (size_t i = 0; i < W.in.n; i++) {
      msg *m = &W.in.m[i];
      char id[64], st[32];
      msg_str(m, "job_id", id, sizeof id);
      if (m->type == GN_MSG_JOB_STATUS && strcmp(id, job) == 0) {
        msg_str(m, "state", st, sizeof st);
        if (strcmp(st, "pulling") == 0)
          continue;
        snprintf(ret_state, 32, "%s", st);
        msg_str(m, "reason", ret_reason, 256);
        msg taken;
        tn_inbox_remove(&W.in, i, &taken);
        gn_buf_done(&taken.raw);
        if (ret_gets)
          *ret_gets = gets;
        return true;
      }
      if (m->type != GN_MSG_JOB_SEED_GET)
        continue;
      msg taken;
      tn_inbox_remove(&W.in, i, &taken);
      gn_envelope e;
      gn_jobmsg g;
      assert_memory_equal(taken.peer, W.prov_id->pk, GN_PK_LEN);
      assert_int_equal(gn_envelope_open(taken.raw.data, taken.raw.len, &e), 0);
      assert_int_equal(gn__jobmsg_decode(GN_MSG_JOB_SEED_GET, e.body, e.body_len, &g), 0);
      assert_string_equal(g.job_id, job);
      assert_string_equal(g.lease_id, lease);
      assert_int_equal(g.offset, next);
      /* one chunk in flight: no other ask of this job waits */
      for (size_t k = 0; k < W.in.n; k++) {
        char other[64];
        msg_str(&W.in.m[k], "job_id", other, sizeof other);
        if (W.in.m[k].type == GN_MSG_JOB_SEED_GET && strcmp(other, job) == 0)
          fail_msg("job %s: a second JOB_SEED_GET before the first was answered", job);
      }
      gets++;
      uint64_t off = g.offset;
      gn__jobmsg_done(&g);
      gn_buf_done(&taken.raw);
      size_t len = off < tar->len ? tar->len - off : 0;
      len = len > GN_JOB_OUTPUT_CHUNK ? GN_JOB_OUTPUT_CHUNK : len;
      bool eof = off + len >= tar->len;
      switch (mode) {
      case SERVE_SILENT:
        break;
      case SERVE_STOP: { /* the lease holder stops the job instead */
        gn_wire_writer w;
        gn_wire_writer_init(&w);
        gn_wire_put_map(&w, 2);
        gn_wire_put_str(&w, "job_id");
        gn_wire_put_str(&w, job);
        gn_wire_put_str(&w, "lease_id");
        gn_wire_put_str(&w, lease);
        send_body(W.req_tp, W.req_id, GN_MSG_JOB_STOP, &w);
        gn_wire_writer_done(&w);
        break;
      }
      case SERVE_REFUSE:
        send_seed_chunk(W.req_tp, W.req_id, job, off, NULL, 0, true, 0, "no seed kept for this job");
        break;
      case SERVE_BAD_OFFSET: /* the second chunk one byte on */
        send_seed_chunk(W.req_tp, W.req_id, job, off ? off + 1 : off, tar->data + off, len, eof, tar->len, NULL);
        break;
      default:
        send_seed_chunk(W.req_tp, W.req_id, job, off, tar->data + off, len, eof, mode == SERVE_NO_SIZE ? 0 : tar->len,
                        NULL);
      }
      next = off + len;
      i = (size_t)-1; /* the inbox changed: from its start */
    }
    if (gn_mono_ms() >= end)
      return false;
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  }
}

static void seed_tar_path(const char *job, char *out, size_t cap) {
  snprintf(out, cap, "%s/seed/%s.tar", W.dir, job);
}

/* A job with a seed: sent, served as mode says; ends in state (failed
 * with a reason holding part), never running, its seed's tar gone. */
static void expect_seed_ends(gn_jobman *m, const char *lease, const gn_buf *tar, int mode, const char *state,
                             const char *part) {
  char job[32], st[32], reason[256], path[PATH_MAX + 64];
  send_manifest(m, lease, job, st, reason);
  if (strcmp(st, "pulling") != 0)
    fail_msg("job %s: %s (%s)", job, st, reason);
  if (!serve_seed(job, lease, tar, mode, 30000, st, reason, NULL))
    fail_msg("job %s: no end (see %s/gpunetd.log)", job, W.dir);
  if (strcmp(st, state) != 0 || !strstr(reason, part))
    fail_msg("job %s: %s '%s', expected %s with '%s'", job, st, reason, state, part);
  print_message("  %s: %s\n", st, reason);
  seed_tar_path(job, path, sizeof path);
  bool gone = false;
  for (int i = 0; i < 100 && !(gone = !th_exists(path)); i++)
    tn_run_until_flag(&W.loop, &(int){0}, 20);
  if (!gone)
    fail_msg("job %s: its seed %s is still there", job, path);
  /* nothing ran: the job's log is empty or absent */
  snprintf(path, sizeof path, "%s/run/jobs/%s.log", W.dir, job);
  size_t len = 0;
  char *log = th_read_file(path, &len);
  if (log && len)
    fail_msg("job %s ran: %s", job, log);
  free(log);
}

static void expect_seed_fails(gn_jobman *m, const char *lease, const gn_buf *tar, int mode, const char *part) {
  expect_seed_ends(m, lease, tar, mode, "failed", part);
}

static int on_up2_flag;
static tn_link link2 = {&on_up2_flag, NULL, NULL}; /* its inbox: W.in */

/* A rank restarted from its checkpoint: the seed the lease holder keeps is
 * fetched 32 KiB at a time, one ask in flight, and unpacked into /output
 * before the container starts (the job reads it and writes on it); a
 * JOB_SEED from another node, or for another job, changes nothing. Then
 * each way a lease holder can fail it: a hash not the manifest's, more
 * bytes than the manifest's, a chunk at another offset, a refusal, silence
 * (GN_SEED_WAIT_MS), a small tar that unpacks past the output budget, a
 * seed over the output budget (refused at once); and
 * a job stopped while it waits for its seed stops. */
static void test_seed_restores_output(void **state) {
  (void)state;
  if (run_skip) {
    print_message("skipped: %s\n", run_skip);
    skip();
  }
  setenv("GN_SEED_WAIT_MS", "3000", 1);
  start_world((const char *const[]){"--registry-allow", "127.0.0.1", "--store-max", "64M", NULL});
  unsetenv("GN_SEED_WAIT_MS");
  R.world = true;
  gn_agreement a;
  rent(&a);
  char image[256];
  snprintf(image, sizeof image, "%s/bb@%s", reg.host, reg.digest);
  const tar_ent ents[] = {
      {"ckpt", 'd', NULL, 0, 0755},
      {"ckpt/step", 'f', "1234\n", 0, 0644},
      {"run.sh", 'f', "#!/bin/sh\n", 0, 04755}, /* setuid: it comes out 0755 */
      {"deep/er/big", 'f', NULL, 100000, 0600}, /* parents made; four chunks in all */
  };
  gn_buf tar;
  tar_make(ents, GN_ARRAY_SIZE(ents), &tar);
  gn_jobman m;
  seed_manifest(&m, image,
                "cat /output/ckpt/step; stat -c 'mode %a %s %n' /output/run.sh /output/deep/er/big; "
                "echo 5678 > /output/ckpt/step && echo WRITE_OK",
                &tar, 0, NULL);
  char job[32], st[32], reason[256];
  send_manifest(&m, a.terms.lease_id, job, st, reason);
  if (strcmp(st, "pulling") != 0)
    fail_msg("job %s: %s (%s)", job, st, reason);
  /* Another node, and the lease holder for another job: both ignored. */
  link2.in = &W.in;
  tn_peer_new(&W.loop, &link2, &R.id2, &R.tp2);
  gn_identity *other = R.id2;
  gn_transport *tp2 = R.tp2;
  on_up2_flag = 0;
  tn_dial(&W.loop, tp2, W.addr, &on_up2_flag, W.dir);
  static const uint8_t junk[] = "not the seed";
  send_seed_chunk(tp2, other, job, 0, junk, sizeof junk, true, tar.len, NULL);
  send_seed_chunk(W.req_tp, W.req_id, "j-000000000000", 0, junk, sizeof junk, true, sizeof junk, NULL);
  /* a second: the pull and the preparation are done, the job waits */
  tn_run_until_flag(&W.loop, &(int){0}, 1000);
  int gets = 0;
  if (!serve_seed(job, a.terms.lease_id, &tar, SERVE_OK, 60000, st, reason, &gets))
    fail_msg("job %s: no status after its seed (see %s/gpunetd.log)", job, W.dir);
  if (strcmp(st, "running") != 0)
    fail_msg("job %s: %s (%s)", job, st, reason);
  assert_int_equal(gets, (int)((tar.len + GN_JOB_OUTPUT_CHUNK - 1) / GN_JOB_OUTPUT_CHUNK));
  assert_true(gets >= 4);
  bool ended = wait_status(job, "exited", 60000, st, reason) || wait_status(job, "failed", 100, st, reason);
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/run/jobs/%s.log", W.dir, job);
  char *log = read_all(path);
  print_message("  job log:\n%s\n", log ? log : "(none)");
  if (!ended || strcmp(st, "exited") != 0)
    fail_msg("job %s: %s (%s)", job, ended ? st : "did not end", reason);
  assert_non_null(log);
  assert_non_null(strstr(log, "1234\n"));
  assert_non_null(strstr(log, "mode 755 10 /output/run.sh"));
  assert_non_null(strstr(log, "mode 644 100000 /output/deep/er/big"));
  assert_non_null(strstr(log, "WRITE_OK"));
  free(log);
  /* on the host: what the job wrote over the seed, the tar gone */
  snprintf(path, sizeof path, "%s/output/%s/ckpt/step", W.dir, job);
  log = read_all(path);
  assert_non_null(log);
  assert_string_equal(log, "5678\n");
  free(log);
  seed_tar_path(job, path, sizeof path);
  assert_false(th_exists(path));
  gn__jobman_done(&m);
  gn_transport_close(tp2, NULL, NULL);
  R.tp2 = NULL;

  const char *script = "echo RAN";
  /* a hash not the manifest's */
  uint8_t sha[32];
  crypto_hash_sha256(sha, tar.data, tar.len);
  sha[0] ^= 1;
  seed_manifest(&m, image, script, &tar, 0, sha);
  expect_seed_fails(&m, a.terms.lease_id, &tar, SERVE_OK, "sha256 is not the manifest's");
  gn__jobman_done(&m);
  /* more bytes than the manifest says (the answers name no size) */
  seed_manifest(&m, image, script, &tar, tar.len - 512, NULL);
  expect_seed_fails(&m, a.terms.lease_id, &tar, SERVE_NO_SIZE, "more bytes than the manifest's");
  gn__jobman_done(&m);
  /* ... and answers that name another size than the manifest's */
  seed_manifest(&m, image, script, &tar, tar.len - 512, NULL);
  expect_seed_fails(&m, a.terms.lease_id, &tar, SERVE_OK, "the manifest says");
  gn__jobman_done(&m);
  /* a chunk at another offset than asked */
  seed_manifest(&m, image, script, &tar, 0, NULL);
  expect_seed_fails(&m, a.terms.lease_id, &tar, SERVE_BAD_OFFSET, "not 32768");
  gn__jobman_done(&m);
  /* a refusal */
  seed_manifest(&m, image, script, &tar, 0, NULL);
  expect_seed_fails(&m, a.terms.lease_id, &tar, SERVE_REFUSE, "no seed kept for this job");
  gn__jobman_done(&m);
  /* silence: failed after GN_SEED_WAIT_MS */
  uint64_t t0 = gn_mono_ms();
  seed_manifest(&m, image, script, &tar, 0, NULL);
  expect_seed_fails(&m, a.terms.lease_id, &tar, SERVE_SILENT, "sent no part of the seed for 3.0 s");
  assert_true(gn_mono_ms() - t0 >= 2900);
  gn__jobman_done(&m);
  /* stopped while it waits for its seed: stopped, nothing ran */
  seed_manifest(&m, image, script, &tar, 0, NULL);
  expect_seed_ends(&m, a.terms.lease_id, &tar, SERVE_STOP, "stopped", "");
  gn__jobman_done(&m);
  /* a tar of a few KiB that unpacks to 80 MiB (a sparse file): over the
   * output budget, refused before the file is made */
  const tar_ent holes[] = {{"ckpt", 'd', NULL, 0, 0755}, {"ckpt/holes", 's', NULL, 80u << 20, 0644}};
  gn_buf bomb;
  tar_make(holes, GN_ARRAY_SIZE(holes), &bomb);
  assert_true(bomb.len < 65536);
  seed_manifest(&m, image, script, &bomb, 0, NULL);
  expect_seed_fails(&m, a.terms.lease_id, &bomb, SERVE_OK, "unpacks to more than the provider's /output budget");
  snprintf(path, sizeof path, "%s/output/%s/ckpt/holes", W.dir, m.job_id);
  assert_false(th_exists(path));
  gn__jobman_done(&m);
  gn_buf_done(&bomb);
  /* over the output budget (64 MiB here): refused before anything of it
   * exists */
  seed_manifest(&m, image, script, &tar, 65ull << 20, NULL);
  send_manifest(&m, a.terms.lease_id, job, st, reason);
  if (strcmp(st, "rejected") != 0 || !strstr(reason, "larger than this provider's /output budget"))
    fail_msg("job %s: %s '%s'", job, st, reason);
  seed_tar_path(job, path, sizeof path);
  assert_false(th_exists(path));
  snprintf(path, sizeof path, "%s/output/%s", W.dir, job);
  assert_false(th_exists(path));
  gn__jobman_done(&m);
  gn_buf_done(&tar);
}

/* A seed's entries: only regular files and directories, at paths inside
 * /output. Each hostile tar fails its job before the container starts and
 * writes nothing outside /output. */
static void test_seed_hostile_entries(void **state) {
  (void)state;
  if (run_skip) {
    print_message("skipped: %s\n", run_skip);
    skip();
  }
  start_world((const char *const[]){"--registry-allow", "127.0.0.1", NULL});
  R.world = true;
  gn_agreement a;
  rent(&a);
  char image[256], abs_evil[PATH_MAX + 32], out_evil[PATH_MAX + 32];
  snprintf(image, sizeof image, "%s/bb@%s", reg.host, reg.digest);
  snprintf(abs_evil, sizeof abs_evil, "%s/evil-abs", W.dir);
  snprintf(out_evil, sizeof out_evil, "%s/output/evil", W.dir);
  struct {
    tar_ent e;
    const char *part;
  } cases[] = {
      {{"../evil", 'f', "x", 0, 0644}, "is not a path inside /output"},
      {{abs_evil, 'f', "x", 0, 0644}, "is not a path inside /output"},
      {{"a/../../evil", 'f', "x", 0, 0644}, "is not a path inside /output"},
      {{"lnk", 'l', "/etc", 0, 0777}, "is a link"},
      {{"hl", 'h', "ckpt/step", 0, 0644}, "is a link"},
      {{"fifo", 'p', NULL, 0, 0644}, "is a link, device, fifo"},
      {{"null", 'c', NULL, 0, 0666}, "is a link, device, fifo"},
      {{"ckpt/step", 'f', "again", 0, 0644}, "cannot make the file"}, /* a second time */
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    tar_ent ents[] = {{"ckpt", 'd', NULL, 0, 0755}, {"ckpt/step", 'f', "1\n", 0, 0644}, cases[i].e};
    gn_buf tar;
    tar_make(ents, GN_ARRAY_SIZE(ents), &tar);
    gn_jobman m;
    seed_manifest(&m, image, "echo RAN", &tar, 0, NULL);
    print_message("  entry '%s' (%c)\n", cases[i].e.name, cases[i].e.type);
    expect_seed_fails(&m, a.terms.lease_id, &tar, SERVE_OK, cases[i].part);
    gn__jobman_done(&m);
    gn_buf_done(&tar);
    assert_false(th_exists(abs_evil));
    assert_false(th_exists(out_evil));
  }
  /* not a tar at all */
  gn_buf junk = {0};
  uint8_t bytes[3000];
  randombytes_buf(bytes, sizeof bytes);
  gn_buf_append(&junk, bytes, sizeof bytes);
  gn_jobman m;
  seed_manifest(&m, image, "echo RAN", &junk, 0, NULL);
  expect_seed_fails(&m, a.terms.lease_id, &junk, SERVE_OK, "not a tar");
  gn__jobman_done(&m);
  gn_buf_done(&junk);
}

int main(void) {
  const struct CMUnitTest pure[] = {
      cmocka_unit_test(test_manifest_net_round_trip),
      cmocka_unit_test(test_manifest_net_hostile),
      cmocka_unit_test(test_manifest_seed),
      cmocka_unit_test(test_manifest_seed_hostile),
      cmocka_unit_test(test_seed_messages),
      cmocka_unit_test(test_config_training_keys),
      cmocka_unit_test(test_offer_training_attributes),
  };
  const struct CMUnitTest daemon[] = {
      cmocka_unit_test(test_provider_refuses_training_it_must_not_run),
      cmocka_unit_test(test_provider_refuses_bad_training_manifests),
  };
  const struct CMUnitTest run[] = {
      cmocka_unit_test_teardown(test_rank_reaches_its_peer_and_nothing_else, teardown_rank),
      cmocka_unit_test_teardown(test_restart_after_crash_removes_the_job_network, teardown_rank),
      cmocka_unit_test_teardown(test_restart_finds_wireguard_go_left_without_pid, teardown_rank),
      cmocka_unit_test_teardown(test_shutdown_takes_the_job_network_down, teardown_rank),
      cmocka_unit_test_teardown(test_seed_restores_output, teardown_rank),
      cmocka_unit_test_teardown(test_seed_hostile_entries, teardown_rank),
  };
  int fails = cmocka_run_group_tests_name("train_manifest", pure, NULL, NULL);
  fails += cmocka_run_group_tests_name("train_policy", daemon, NULL, NULL);
  fails += cmocka_run_group_tests_name("train_run", run, setup_run, teardown_run);
  return fails;
}
