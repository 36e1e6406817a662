/* llp/netif: the host's IPv4 interface addresses in GID-table order. */
#include "llp/netif.h"

#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The interface of the default route: the one with the lowest metric among
 * /proc/net/route's 0.0.0.0/0 entries that are up. Empty when none. */
static void default_route_if(char name[IFNAMSIZ])
{
        name[0] = '\0';
        FILE *f = fopen("/proc/net/route", "re");
        if (!f)
                return;
        char line[256], ifn[IFNAMSIZ];
        unsigned long dst, gw, mask, metric, flags;
        unsigned long best = ULONG_MAX;
        if (!fgets(line, sizeof(line), f)) { /* header */
                fclose(f);
                return;
        }
        while (fgets(line, sizeof(line), f)) {
                unsigned long refcnt, use;
                /* Iface Destination Gateway Flags RefCnt Use Metric Mask ... */
                if (sscanf(line, "%15s %lx %lx %lx %lu %lu %lu %lx", ifn, &dst, &gw, &flags,
                           &refcnt, &use, &metric, &mask) != 8)
                        continue;
                if (dst != 0 || mask != 0 || !(flags & 0x1 /* RTF_UP */))
                        continue;
                if (metric < best) {
                        best = metric;
                        memcpy(name, ifn, IFNAMSIZ);
                }
        }
        fclose(f);
}

/* Rank of an entry: 0 = default route's interface, 1 = other, 2 = loopback
 * (127.0.0.1 itself 3, so it comes last). */
static int rank(const struct diwarp_netif *n, const char *defif)
{
        if (n->addr == htonl(INADDR_LOOPBACK))
                return 3;
        if ((ntohl(n->addr) >> 24) == 127 || n->loopback)
                return 2;
        if (defif[0] && !strcmp(n->ifname, defif))
                return 0;
        return 1;
}

int dw_netif_list(struct diwarp_netif *out, int max)
{
        struct ifaddrs *ifa0 = NULL;
        if (getifaddrs(&ifa0) < 0)
                return -errno;
        char defif[IFNAMSIZ];
        default_route_if(defif);
        struct diwarp_netif all[DIWARP_MAX_GIDS];
        int rk[DIWARP_MAX_GIDS], seq[DIWARP_MAX_GIDS];
        int n = 0;
        for (struct ifaddrs *i = ifa0; i; i = i->ifa_next) {
                if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
                        continue;
                if (n == DIWARP_MAX_GIDS)
                        break;
                struct diwarp_netif *e = &all[n];
                memset(e, 0, sizeof(*e));
                e->addr = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
                snprintf(e->ifname, sizeof(e->ifname), "%s", i->ifa_name);
                e->ifindex = if_nametoindex(i->ifa_name);
                e->loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
                rk[n] = rank(e, defif);
                seq[n] = n;
                n++;
        }
        freeifaddrs(ifa0);
        /* Insertion sort by (rank, ifindex, kernel order): a stable order. */
        for (int a = 1; a < n; a++) {
                struct diwarp_netif e = all[a];
                int r = rk[a], s = seq[a], b = a - 1;
                while (b >= 0 && (rk[b] > r ||
                                  (rk[b] == r && (all[b].ifindex > e.ifindex ||
                                                  (all[b].ifindex == e.ifindex && seq[b] > s))))) {
                        all[b + 1] = all[b];
                        rk[b + 1] = rk[b];
                        seq[b + 1] = seq[b];
                        b--;
                }
                all[b + 1] = e;
                rk[b + 1] = r;
                seq[b + 1] = s;
        }
        for (int k = 0; k < n && k < max; k++)
                out[k] = all[k];
        return n;
}

int dw_netif_find(struct in_addr addr, struct diwarp_netif *out)
{
        struct diwarp_netif all[DIWARP_MAX_GIDS];
        int n = dw_netif_list(all, DIWARP_MAX_GIDS);
        if (n < 0)
                return n;
        for (int k = 0; k < n && k < DIWARP_MAX_GIDS; k++)
                if (all[k].addr == addr.s_addr) {
                        *out = all[k];
                        return 0;
                }
        return -ENOENT;
}
