/* Paths: the congestion-control unit of a device, one per peer device
 * address (IPv4 + UDP port). Every pseudo-stream to that address shares it,
 * since they share the network path and the peer's socket buffer. A
 * per-device hash table of reference-counted entries; the caller (rd/)
 * holds a reference per pseudo-stream and the device lock. */
#ifndef DW_FLOW_PATH_H
#define DW_FLOW_PATH_H

#include <stdint.h>

#include "flow/cc.h"

#define DW_FLOW_MAX_RAILS 4

struct dw_flow_path {
        struct dw_flow_path *next; /* hash chain */
        uint32_t ip;               /* network order */
        uint16_t port;             /* network order */
        uint32_t refs;
        /* Bytes of the transmit batch being built for this path, not yet
         * handed to the socket (dw_cc_can_send counts them as in flight). */
        uint32_t pending;
        struct dw_cc cc;
        /* Multirail, on the path to a peer device's first address: the
         * device's rails as its rail list gave them (nrails 0: none known),
         * rail[i] the path to rail i (rail[0] is this path), and when our own
         * list last went to that device. */
        uint8_t nrails;
        uint32_t rail_ip[DW_FLOW_MAX_RAILS];
        struct dw_flow_path *rail[DW_FLOW_MAX_RAILS];
        uint64_t rails_told_at;
        /* Proof of a rail list (docs/PROTOCOL.md "Multirail"): chal, the
         * random value we gave that device, which its lists must echo (0:
         * none drawn yet), and when we last sent it; echo, the one it gave
         * us, which our lists to it carry (0: none yet). */
        uint64_t chal, chal_at, echo;
        bool chal_due; /* chal goes on our next control datagram to it */
        /* On each rail's path: down (its sends failed or went unanswered)
         * until a probe sent after probe_at is acknowledged; the last time
         * one of its datagrams was acknowledged, and the resends of its
         * datagrams since. */
        bool down;
        uint64_t probe_at;
        uint64_t last_ack;
        uint32_t retx_since_ack;
};

struct dw_flow_paths {
        struct dw_flow_path **tab;
        uint32_t mask; /* buckets - 1; 0 with no table */
        uint32_t n;
        struct dw_cc_params params;
        struct dw_cc_stats retired; /* the counts of paths already freed */
};

void dw_flow_paths_init(struct dw_flow_paths *t, const struct dw_cc_params *params);
void dw_flow_paths_fini(struct dw_flow_paths *t);
/* The path to ip:port if there is one (no reference taken), else NULL. */
struct dw_flow_path *dw_flow_path_find(const struct dw_flow_paths *t, uint32_t ip, uint16_t port);
/* The path to ip:port, created on first use with a window sized for
 * datagrams of `seg` bytes; one more reference. NULL when out of memory. */
struct dw_flow_path *dw_flow_path_get(struct dw_flow_paths *t, uint32_t ip, uint16_t port,
                                      uint32_t seg);
/* The rails of the peer device whose first address `canon` leads to: n
 * addresses, ip[0] == canon->ip, all at canon->port. The paths to the
 * others are taken (one reference each, given back when canon goes); an
 * earlier list is replaced. 0, or -ENOMEM (the list is then forgotten). */
int dw_flow_path_set_rails(struct dw_flow_paths *t, struct dw_flow_path *canon, unsigned n,
                           const uint32_t *ip, uint32_t seg);
/* Drops a reference; the last one frees the path (and its rails' references). */
void dw_flow_path_put(struct dw_flow_paths *t, struct dw_flow_path *p);
/* The counts of every path the table has had, live or freed. */
void dw_flow_paths_stats(const struct dw_flow_paths *t, struct dw_cc_stats *out);

#endif
