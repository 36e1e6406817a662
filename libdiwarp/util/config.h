/* Engine configuration: built-in defaults overridden by DIWARP_* environment
 * variables. The table of variables is in docs/USAGE.md. */
#ifndef DW_UTIL_CONFIG_H
#define DW_UTIL_CONFIG_H

#include <stdbool.h>
#include <netinet/in.h>
#include <stdint.h>

enum dw_io_backend {
        DW_IO_PLAIN = 0, /* sendmmsg/recvmmsg */
        DW_IO_URING = 1, /* io_uring via liburing */
};

enum dw_rc_transport {
        DW_RC_TCP = 0, /* MPA rev 2 over one TCP connection per QP */
        DW_RC_RD = 1,  /* the reliable-datagram sublayer over the instance UDP socket */
};

#define DW_CONFIG_DEFAULT_ADDR               "" /* every host address */
#define DW_CONFIG_DEFAULT_PORT_BASE          17471
#define DW_CONFIG_DEFAULT_PEER_TIMEOUT_MS    5000
#define DW_CONFIG_DEFAULT_CONNECT_TIMEOUT_MS 10000
#define DW_CONFIG_DEFAULT_FAULT_SEED         1
#define DW_CONFIG_MIN_UDP_MTU                512
#define DW_CONFIG_MAX_UDP_MTU                65507 /* largest IPv4 UDP payload */
#define DW_CONFIG_DEFAULT_UDP_MTU            65507 /* no cap: RD follows the route's MTU */
#define DW_CONFIG_MAX_TIMEOUT_MS             3600000u
/* In-flight caps in messages (libdiwarp/flow/README.md); 0 = no cap
 * at that level. The defaults await the calibration sweep. */
#define DW_CONFIG_DEFAULT_INFLIGHT_QP   0
#define DW_CONFIG_DEFAULT_INFLIGHT_PROC 0
#define DW_CONFIG_DEFAULT_INFLIGHT_HOST 0
#define DW_CONFIG_MAX_INFLIGHT          1000000u
/* Longest DIWARP_INFLIGHT_SHM name (without the leading '/'). */
#define DW_CONFIG_MAX_SHM_NAME         100
#define DW_CONFIG_DEFAULT_CC_TARGET_US 300u
/* Receiver-paced RD Sends (docs/PROTOCOL.md): from this size on, a Send pushes its
 * first chunk and the receiver pulls the rest, chunk by chunk, at most
 * `depth` Reads outstanding. The defaults come from the sweep in
 * docs/PERFORMANCE.md. */
#define DW_CONFIG_DEFAULT_PULL_MIN   (1u << 20)
#define DW_CONFIG_DEFAULT_PULL_CHUNK (128u << 10)
#define DW_CONFIG_DEFAULT_PULL_DEPTH 4u
#define DW_CONFIG_MAX_PULL_DEPTH     8u
#define DW_CONFIG_MIN_PULL_CHUNK     1024u
#define DW_CONFIG_MAX_PULL_CHUNK     (64u << 20)
#define DW_CONFIG_MAX_CC_TARGET_US   1000000u
/* The credit-based mailbox receive ring of RD QPs (libdiwarp/flow/README.md
 * "Credits"). The ring's size is bounded by the
 * header's 16-bit credit field, which carries a cumulative value modulo
 * 2^16: every value a sender can see lies within a ring of its own. */
#define DW_CONFIG_DEFAULT_CREDIT_SLOT   2048u
#define DW_CONFIG_DEFAULT_CREDIT_RING   1024u
#define DW_CONFIG_MAX_CREDIT_RING       32767u
#define DW_CONFIG_DEFAULT_CREDIT_PEERS  16u
#define DW_CONFIG_DEFAULT_CREDIT_CSLOTS 2u

/* Bounded state of the RD transport (docs/SECURITY.md): pseudo-streams per
 * QP and per device, and how long one stays without a datagram before it
 * may be freed. */
#define DW_CONFIG_DEFAULT_RD_MAX_PEERS 4096u
#define DW_CONFIG_DEFAULT_RD_DEV_PEERS 16384u
#define DW_CONFIG_MAX_RD_PEERS         1000000u
#define DW_CONFIG_DEFAULT_RD_IDLE_MS   10000u
#define DW_CONFIG_DEFAULT_WAIT_SPIN_US 50u
#define DW_CONFIG_MAX_WAIT_SPIN_US     10000u
/* A shared device's empty CQ polls that return at once after one that
 * popped a completion (progress/progress.h, dw_progress_poll_may_nap). */
#define DW_CONFIG_DEFAULT_SHARED_NAP_AFTER 4u
#define DW_CONFIG_MAX_SHARED_NAP_AFTER     64u
#define DW_CONFIG_MIN_RD_IDLE_MS           100u

enum dw_credit_setting {
        DW_CREDIT_OFF = 0,
        DW_CREDIT_ON_STATIC = 1,
        DW_CREDIT_ON_DYNAMIC = 2,
};

/* DIWARP_ADDR: one address, or a comma-separated list of up to
 * DW_CONFIG_MAX_RAILS (one per rail: a multirail device). */
#define DW_CONFIG_MAX_RAILS          4
#define DW_CONFIG_ADDR_LEN           (DW_CONFIG_MAX_RAILS * 16)
#define DW_CONFIG_DEFAULT_STRIPE_MIN (256u << 10)

struct dw_config {
        char
            addr[DW_CONFIG_ADDR_LEN]; /* DIWARP_ADDR: dotted IPv4 (a list: rails); "": not pinned */
        uint16_t port_base;           /* DIWARP_PORT_BASE */
        int log_level;                /* DIWARP_LOG, enum dw_log_level */
        bool progress_thread;         /* DIWARP_PROGRESS=thread (the default) or app */
        uint32_t wait_spin_us;        /* DIWARP_WAIT_SPIN_US: completion-channel waits spin first */
        uint32_t shared_nap_after;    /* DIWARP_SHARED_NAP_AFTER: empty polls before a nap */
        enum dw_io_backend io;        /* DIWARP_IO=plain|uring */
        bool rc_crc;                  /* DIWARP_RC_CRC=0|1 */
        uint32_t rc_fpdu;             /* DIWARP_RC_FPDU: 0 (one TCP segment) or bytes */
        bool rd_direct;               /* DIWARP_RD_DIRECT=0|1: continuations placed first */
        bool rd_late_shared; /* DIWARP_RD_LATE_ACKS=device|stream: late ACKs learned together */
        enum dw_rc_transport rc_transport; /* DIWARP_RC_TRANSPORT=tcp|rd */
        uint32_t peer_timeout_ms;          /* DIWARP_PEER_TIMEOUT_MS */
        uint32_t connect_timeout_ms;       /* DIWARP_CONNECT_TIMEOUT_MS */
        char fault_spec[256];              /* DIWARP_FAULT, validated; "" = off */
        uint64_t fault_seed;               /* DIWARP_FAULT_SEED */
        uint32_t udp_mtu;                  /* DIWARP_UDP_MTU: cap on the RD datagram size */
        uint32_t inflight_qp;              /* DIWARP_INFLIGHT_QP: messages; 0 = no cap */
        uint32_t inflight_proc;            /* DIWARP_INFLIGHT_PROC */
        uint32_t inflight_host;            /* DIWARP_INFLIGHT_HOST */
        /* DIWARP_INFLIGHT_SHM as "/name"; "" = the per-user default. */
        char inflight_shm[DW_CONFIG_MAX_SHM_NAME + 2];
        bool cc;               /* DIWARP_CC=on|off: RD congestion control */
        bool cc_pacing;        /* DIWARP_CC_PACING=0|1 */
        uint32_t cc_target_us; /* DIWARP_CC_TARGET_US: queueing delay aimed at */
        bool rd_crc;           /* DIWARP_RD_CRC=0|1: CRC32c on RD datagrams */
        /* DIWARP_AUTH=file:PATH: the key of every datagram's AES-GMAC
         * (16 or 32 bytes); auth_key_len 0: off (the default). */
        uint8_t auth_key[32];
        uint8_t auth_key_len;
        /* DIWARP_AUTH=connection, or file:PATH: RC over RD connections
         * authenticate their datagrams with a key of their own, derived from
         * the connection's tokens (and the file key, when there is one). */
        bool auth_conn;
        uint32_t pull_min;             /* DIWARP_RD_PULL_MIN: bytes; 0 = never pull */
        uint32_t pull_chunk;           /* DIWARP_RD_PULL_CHUNK: bytes per Read */
        uint32_t pull_depth;           /* DIWARP_RD_PULL_DEPTH: Reads outstanding */
        enum dw_credit_setting credit; /* DIWARP_CREDIT=static|dynamic|off */
        uint32_t credit_slot;          /* DIWARP_CREDIT_SLOT: bytes, a power of two */
        uint32_t credit_ring;          /* DIWARP_CREDIT_RING: slots per RD QP */
        uint32_t credit_peers;         /* DIWARP_CREDIT_PEERS: senders sharing a ring */
        uint32_t rd_max_peers;         /* DIWARP_RD_MAX_PEERS: streams per RD-served QP */
        uint32_t rd_dev_peers;         /* DIWARP_RD_DEV_PEERS: streams per device */
        uint32_t rd_idle_ms;           /* DIWARP_RD_IDLE_MS: an idle stream may be freed */
        uint32_t credit_cslots;        /* DIWARP_CREDIT_CSLOTS: credit-region entries per peer */
        uint32_t credit_min_quota;     /* DIWARP_CREDIT_MIN_QUOTA: dynamic floor; 0 = cslots */
        bool credit_rc_park;           /* DIWARP_CREDIT_RC=park|rnr: RC over RD parks too */
        /* DIWARP_LOCAL_COPY=0|1: RC Writes and Reads between two ends in one
         * process as one copy (rc/rc_copy.c); -1 = unset: on in the host daemon,
         * off elsewhere. */
        int8_t local_copy;
        /* DIWARP_STRIPE_MIN: RD messages of at least this many bytes are
         * striped over the rails of a multirail device; 0: never. */
        uint32_t stripe_min;
        /* Holds the text *why points to after a failure (names variable and value),
         * so the reason needs no global buffer and lives as long as the config. */
        char why_buf[384];
};

/* Parses DIWARP_ADDR's form: 1..DW_CONFIG_MAX_RAILS distinct dotted IPv4
 * addresses, none 0.0.0.0, separated by commas. Returns how many, or -EINVAL
 * with *why naming what is wrong. */
int dw_config_parse_addrs(const char *s, struct in_addr *out, const char **why);

/* Fills *cfg with the built-in defaults (never fails). */
void dw_config_defaults(struct dw_config *cfg);

/* Defaults, then every DIWARP_* variable that is set and non-empty. Returns 0,
 * or -EINVAL with *why (if why != NULL) set to a reason naming the variable and
 * its value; *cfg then holds the defaults (never a half-applied environment). */
int dw_config_from_env(struct dw_config *cfg, const char **why);

/* Same, reading variables through getenv_fn (tests inject an environment). */
int dw_config_from_getenv(struct dw_config *cfg,
                          const char *(*getenv_fn)(void *ctx, const char *name), void *ctx,
                          const char **why);

#endif
