/* Per-device table of paths: see path.h. */
#include "flow/path.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PATH_HASH_MIN 16u

static uint32_t path_hash(uint32_t ip, uint16_t port)
{
        uint64_t k = ((uint64_t)ip << 16 | port) * 0x9e3779b97f4a7c15ull;
        return (uint32_t)(k >> 32);
}

void dw_flow_paths_init(struct dw_flow_paths *t, const struct dw_cc_params *params)
{
        memset(t, 0, sizeof(*t));
        t->params = *params;
}

void dw_flow_paths_fini(struct dw_flow_paths *t)
{
        for (uint32_t i = 0; t->tab && i <= t->mask; i++) {
                struct dw_flow_path *p = t->tab[i], *nx;
                for (; p; p = nx) {
                        nx = p->next;
                        free(p);
                }
        }
        free(t->tab);
        t->tab = NULL;
        t->mask = 0;
        t->n = 0;
}

static int paths_grow(struct dw_flow_paths *t)
{
        uint32_t n = t->tab ? (t->mask + 1) * 4 : PATH_HASH_MIN;
        struct dw_flow_path **nt = calloc(n, sizeof(*nt));
        if (!nt)
                return -1;
        for (uint32_t i = 0; t->tab && i <= t->mask; i++) {
                struct dw_flow_path *p = t->tab[i], *nx;
                for (; p; p = nx) {
                        nx = p->next;
                        uint32_t b = path_hash(p->ip, p->port) & (n - 1);
                        p->next = nt[b];
                        nt[b] = p;
                }
        }
        free(t->tab);
        t->tab = nt;
        t->mask = n - 1;
        return 0;
}

struct dw_flow_path *dw_flow_path_find(const struct dw_flow_paths *t, uint32_t ip, uint16_t port)
{
        if (!t->tab)
                return NULL;
        struct dw_flow_path *p = t->tab[path_hash(ip, port) & t->mask];
        while (p && (p->ip != ip || p->port != port))
                p = p->next;
        return p;
}

struct dw_flow_path *dw_flow_path_get(struct dw_flow_paths *t, uint32_t ip, uint16_t port,
                                      uint32_t seg)
{
        struct dw_flow_path *p = dw_flow_path_find(t, ip, port);
        if (p) {
                p->refs++;
                return p;
        }
        if ((!t->tab || t->n >= (t->mask + 1) * 2) && paths_grow(t) < 0)
                return NULL;
        p = calloc(1, sizeof(*p));
        if (!p)
                return NULL;
        p->ip = ip;
        p->port = port;
        p->refs = 1;
        dw_cc_init(&p->cc, &t->params, seg);
        uint32_t b = path_hash(ip, port) & t->mask;
        p->next = t->tab[b];
        t->tab[b] = p;
        t->n++;
        return p;
}

static void stats_add(struct dw_cc_stats *to, const struct dw_cc_stats *s)
{
        to->md_delay += s->md_delay;
        to->md_loss += s->md_loss;
        to->rto += s->rto;
        to->cwnd_waits += s->cwnd_waits;
        to->pace_waits += s->pace_waits;
        to->drain_waits += s->drain_waits;
}

void dw_flow_paths_stats(const struct dw_flow_paths *t, struct dw_cc_stats *out)
{
        *out = t->retired;
        for (uint32_t i = 0; t->tab && i <= t->mask; i++)
                for (const struct dw_flow_path *p = t->tab[i]; p; p = p->next)
                        stats_add(out, &p->cc.stats);
}

static void rails_drop(struct dw_flow_paths *t, struct dw_flow_path *canon)
{
        for (unsigned i = 1; i < canon->nrails; i++)
                dw_flow_path_put(t, canon->rail[i]);
        memset(canon->rail, 0, sizeof(canon->rail));
        canon->nrails = 0;
}

int dw_flow_path_set_rails(struct dw_flow_paths *t, struct dw_flow_path *canon, unsigned n,
                           const uint32_t *ip, uint32_t seg)
{
        if (n > DW_FLOW_MAX_RAILS)
                n = DW_FLOW_MAX_RAILS;
        if (canon->nrails == n && memcmp(canon->rail_ip, ip, n * sizeof(*ip)) == 0)
                return 0;
        rails_drop(t, canon);
        if (n < 2)
                return 0;
        canon->rail[0] = canon;
        for (unsigned i = 1; i < n; i++) {
                struct dw_flow_path *r = dw_flow_path_get(t, ip[i], canon->port, seg);
                if (!r) {
                        canon->nrails = (uint8_t)i;
                        rails_drop(t, canon);
                        return -ENOMEM;
                }
                canon->rail[i] = r;
        }
        memcpy(canon->rail_ip, ip, n * sizeof(*ip));
        canon->nrails = (uint8_t)n;
        return 0;
}

void dw_flow_path_put(struct dw_flow_paths *t, struct dw_flow_path *p)
{
        if (!p || --p->refs)
                return;
        rails_drop(t, p);
        stats_add(&t->retired, &p->cc.stats);
        struct dw_flow_path **pp = &t->tab[path_hash(p->ip, p->port) & t->mask];
        while (*pp && *pp != p)
                pp = &(*pp)->next;
        if (*pp)
                *pp = p->next;
        t->n--;
        free(p);
}
