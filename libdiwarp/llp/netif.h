/* llp/netif: the host's (network namespace's) IPv4 interface addresses, in
 * the order a device's GID table lists them. Knows getifaddrs and the
 * kernel's routing table, nothing about devices. */
#ifndef DIWARP_LLP_NETIF_H
#define DIWARP_LLP_NETIF_H

#include <diwarp/diwarp.h>
#include <netinet/in.h>

/* Fills out[0..max) with the IPv4 addresses of the interfaces that are up:
 * those of the interface of the default route first (the lowest metric wins
 * when there are several), then the other non-loopback interfaces by
 * interface index, then loopback ones (127.0.0.1 last). Addresses of one
 * interface keep the order the kernel lists them. Returns how many there
 * are (at most DIWARP_MAX_GIDS; only the first max are written), 0 when no
 * interface is up, or -errno when the addresses cannot be read. */
int dw_netif_list(struct diwarp_netif *out, int max);

/* The interface that holds addr (name and index into *out). -ENOENT when no
 * interface of this host has it. */
int dw_netif_find(struct in_addr addr, struct diwarp_netif *out);

#endif
