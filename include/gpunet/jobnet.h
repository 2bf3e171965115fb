/* The job network of a training job (issue 8, item 4): one WireGuard
 * interface per rank that lives inside the job's network namespace while its
 * UDP socket stays in the provider's (the caller's) namespace, so the job
 * reaches its peer ranks and nothing else. Kernel WireGuard (ip + wg) where
 * the kernel has it, Debian's wireguard-go through its configuration socket
 * otherwise. Part of the sandbox module: depends on no other module. */
#ifndef GPUNET_JOBNET_H
#define GPUNET_JOBNET_H

#include <gpunet/base.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define GN_JOBNET_KEY_LEN 32
#define GN_JOBNET_KEY_B64_LEN 45  /* 44 characters of base64 and the NUL */
#define GN_JOBNET_IFNAME_MAX 16   /* IFNAMSIZ: 15 characters and the NUL */
#define GN_JOBNET_ENDPOINT_MAX 56 /* "[v6 address]:port" and the NUL */
#define GN_JOBNET_MAX_PEERS 64    /* peer ranks of one rank: world size <= 65 */
#define GN_JOBNET_JOB_ID_MAX 256  /* bytes of a job id given to the naming helpers */
#define GN_JOBNET_KEEPALIVE_MAX_S 3600
#define GN_JOBNET_MTU_MIN 1280 /* IPv6's minimum; below it the job could not speak IPv6 at all */
#define GN_JOBNET_MTU_MAX 65535
#define GN_JOBNET_MTU_DEFAULT 1420 /* WireGuard's own default: a 1500 underlay over IPv6 */
#define GN_JOBNET_OVERHEAD_V4 60   /* outer IPv4 20 + UDP 8 + WireGuard data header 16 + tag 16 */
#define GN_JOBNET_OVERHEAD_V6 80   /* outer IPv6 40 + the same 40 */

typedef enum gn_jobnet_backend {
  GN_JOBNET_AUTO = 0,      /* kernel WireGuard when `ip link add type wireguard` works, else wireguard-go */
  GN_JOBNET_KERNEL = 1,    /* ip + wg; untested here: this project's machines have no wireguard module */
  GN_JOBNET_USERSPACE = 2, /* wireguard-go, configured through /var/run/wireguard/IFNAME.sock */
} gn_jobnet_backend;

typedef struct gn_jobnet_peer {
  uint8_t public_key[GN_JOBNET_KEY_LEN];
  /* "1.2.3.4:51820" or "[2001:db8::1]:51820", literal addresses only (no
   * names: nothing is resolved). "" when the peer dials in first. */
  char endpoint[GN_JOBNET_ENDPOINT_MAX];
  /* The peer's job-network address: its only allowed IP, as a /32, so no
   * rank can send with another rank's address. */
  struct in_addr address;
  uint16_t keepalive_s; /* persistent keepalive; 0: off */
} gn_jobnet_peer;

/* One rank's side of the job network. Holds the rank's private key: make it
 * with gn_jobnet_config_new (guarded sodium memory) and free it with
 * gn_jobnet_config_free, which wipes it. */
typedef struct gn_jobnet_config {
  char ifname[GN_JOBNET_IFNAME_MAX]; /* unique on the host: gn_jobnet_ifname */
  uint8_t private_key[GN_JOBNET_KEY_LEN];
  uint16_t listen_port;   /* host-side UDP port; 0: the system picks one (gn_jobnet_listen_port) */
  struct in_addr address; /* this rank's address in the job subnet */
  uint8_t prefix_len;     /* the job subnet's, 16..30; the subnet lies in 10/8, 172.16/12, 192.168/16 or 100.64/10 */
  uint32_t mtu;           /* GN_JOBNET_MTU_MIN..GN_JOBNET_MTU_MAX, or 0: gn_jobnet_choose_mtu at gn_jobnet_up */
  bool allow_private_endpoints; /* peers' endpoints may be RFC 1918/4193/6598 addresses (LAN clusters, tests) */
  gn_jobnet_backend backend;
  size_t peer_count; /* <= GN_JOBNET_MAX_PEERS */
  gn_jobnet_peer peers[GN_JOBNET_MAX_PEERS];
} gn_jobnet_config;

typedef struct gn_jobnet gn_jobnet;

/* --- keys ----------------------------------------------------------------*/

/* A fresh X25519 key pair for one rank of one job (the private key clamped as
 * `wg genkey` does). Keep ret_private in guarded memory (the config). */
int gn_jobnet_keypair(uint8_t ret_private[GN_JOBNET_KEY_LEN], uint8_t ret_public[GN_JOBNET_KEY_LEN]);
/* The public key of a private key (what `wg pubkey` prints, in binary).
 * GN_EINVAL for an all-zero key. */
int gn_jobnet_public_key(const uint8_t private_key[GN_JOBNET_KEY_LEN], uint8_t ret_public[GN_JOBNET_KEY_LEN]);
/* WireGuard's text form: standard base64 with padding, 44 characters. */
void gn_jobnet_key_to_base64(const uint8_t key[GN_JOBNET_KEY_LEN], char out[GN_JOBNET_KEY_B64_LEN]);
/* Strict inverse: exactly 44 characters of the standard alphabet ending in
 * one '=', canonical (unused bits zero), nothing around. GN_EINVAL otherwise. */
int gn_jobnet_key_from_base64(const char *s, uint8_t ret[GN_JOBNET_KEY_LEN]);

/* --- names, addresses, MTU (pure) ----------------------------------------*/

/* The interface name of a job's rank on a host: "gnj" + 8 hex digits of a
 * hash of the job id + "r" + the rank in decimal (at most 15 characters;
 * rank < 1000). wireguard-go's configuration socket is named after it and is
 * shared by every namespace, so it must be unique per host, not per namespace.
 * job_id: 1..GN_JOBNET_JOB_ID_MAX bytes, any content. */
int gn_jobnet_ifname(const char *job_id, uint32_t rank, char out[GN_JOBNET_IFNAME_MAX]);
/* 1..15 characters of [a-z0-9_], starting with a letter: never an option
 * ("-h" is an interface name to wireguard-go), a path or a dot file. */
bool gn_jobnet_ifname_valid(const char *s);
/* The job's subnet: 10.77.H.0/24 with H from a hash of the job id. Jobs never
 * share a namespace, so a clash would be harmless; it keeps addresses of
 * different jobs apart in logs. */
int gn_jobnet_subnet_for_job(const char *job_id, struct in_addr *ret_subnet, uint8_t *ret_prefix_len);
/* Rank r's address: subnet + r + 1. GN_EINVAL for an unaligned subnet or a
 * prefix outside 16..30, GN_ETOOBIG when the rank does not fit (the last
 * address is the broadcast address). */
int gn_jobnet_rank_address(struct in_addr subnet, uint8_t prefix_len, uint32_t rank, struct in_addr *ret);
/* The job-network MTU over an underlay of underlay_mtu bytes: minus
 * WireGuard's overhead (60 over IPv4, 80 over IPv6), clamped to
 * GN_JOBNET_MTU_MIN..GN_JOBNET_MTU_MAX. */
uint32_t gn_jobnet_mtu_for(uint32_t underlay_mtu, bool ipv6);
/* Parses an endpoint (see gn_jobnet_peer.endpoint): a literal IPv4 address or
 * bracketed IPv6 address without scope, ':' and a port 1..65535 without
 * leading zeros. Refuses addresses a job must never make the provider's host
 * send to: unspecified, loopback, link-local, multicast, broadcast, reserved,
 * IPv4-mapped; and private ones (RFC 1918, 6598, 4193) unless allow_private. */
int gn_jobnet_endpoint_parse(const char *s, bool allow_private, struct sockaddr_storage *ret, socklen_t *ret_len);
/* The path MTU the caller's network namespace knows towards an endpoint
 * (IP_MTU of a connected UDP socket; connecting sends nothing). */
int gn_jobnet_path_mtu(const char *endpoint, bool allow_private, uint32_t *ret_mtu);
/* The job-network MTU for a config: the smallest gn_jobnet_mtu_for over the
 * paths to its peers' endpoints; GN_JOBNET_MTU_DEFAULT when none has one. */
int gn_jobnet_choose_mtu(const gn_jobnet_config *cfg, uint32_t *ret_mtu);

/* --- configs -------------------------------------------------------------*/

/* A zeroed config in guarded memory (sodium_malloc); NULL when out of memory. */
gn_jobnet_config *gn_jobnet_config_new(void);
/* Wipes and frees; accepts NULL, returns NULL. */
gn_jobnet_config *gn_jobnet_config_free(gn_jobnet_config *cfg);
/* Checks everything gn_jobnet_up would use: names, keys (none zero, none
 * repeated, no peer with this rank's own key), subnet, addresses (each peer's
 * distinct, in the subnet, not this rank's), endpoints, keepalives, MTU,
 * counts. GN_EINVAL or GN_ETOOBIG with a message in err. */
int gn_jobnet_config_validate(const gn_jobnet_config *cfg, char *err, size_t err_cap);
/* The set=1 request of wireguard-go's configuration protocol for a valid
 * config (validated here), built only from parsed binary values so no input
 * can add a line. It holds the private key: the caller wipes out
 * (sodium_memzero) after use. GN_ETOOBIG when cap is too small. */
int gn_jobnet_uapi_set_text(const gn_jobnet_config *cfg, char *out, size_t cap, size_t *ret_len);

/* --- the interface -------------------------------------------------------*/

/* Brings one rank's job network up: creates the WireGuard interface in the
 * caller's network namespace (so its UDP socket stays there: the host's),
 * configures it (the private key only through wireguard-go's socket or wg's
 * standard input, never on a command line), sets its MTU, moves it into the
 * network namespace at netns_path (/proc/PID/ns/net, /run/netns/NAME; it
 * must not be the caller's own), and there gives it the rank's address and
 * brings it up. The only route it adds is the job subnet's. Every step has a
 * time limit; on any failure everything started is stopped and removed and
 * *ret is not written. "The host's namespace" is the calling thread's: the
 * caller must be root there (CAP_NET_ADMIN, CAP_SYS_ADMIN for setns). It
 * blocks (each step at most 5 s, about 20 s in all at worst; about 50 ms here):
 * call it off the event loop (uv_queue_work). Bring it up before the job's
 * process starts, so nothing of the job's can hold the name first. Errors: GN_EINVAL (config, netns), GN_EEXIST (the
 * interface or its socket already exists), GN_EUNSUPPORTED (no ip, no
 * wireguard-go for the backend asked), GN_ETIMEDOUT, GN_EIO (a step failed:
 * err says which and what it printed). */
int gn_jobnet_up(const gn_jobnet_config *cfg, const char *netns_path, gn_jobnet **ret, char *err, size_t err_cap);
/* Takes the job network down: stops wireguard-go (TERM, then KILL after 2 s)
 * and reaps it, removes its socket, deletes the interface wherever it is.
 * Accepts NULL, returns NULL. */
gn_jobnet *gn_jobnet_down(gn_jobnet *j);

const char *gn_jobnet_ifname_of(const gn_jobnet *j);
gn_jobnet_backend gn_jobnet_backend_of(const gn_jobnet *j); /* what AUTO became */
uint16_t gn_jobnet_listen_port(const gn_jobnet *j);         /* the host-side UDP port */
uint32_t gn_jobnet_mtu(const gn_jobnet *j);                 /* the interface's MTU */
pid_t gn_jobnet_pid(const gn_jobnet *j);                    /* wireguard-go's pid, 0 for the kernel */

#endif
