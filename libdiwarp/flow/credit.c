/* Credit-based mailbox receive ring: see credit.h and README.md (which names
 * the thesis it follows). */
#include "flow/credit.h"

#include "util/why.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX
/* c->slot[] of a message whose sender started over (dw_credit_peer_reset):
 * its slots leave the ring in order but credit nobody. */
#define ORPHAN UINT32_MAX

uint32_t dw_credit_threshold(uint32_t quota, uint32_t credit_slots)
{
        if (credit_slots == UINT32_MAX)
                return 0;
        return quota / (credit_slots + 1) + 1;
}

void dw_credit_cfg_default(struct dw_credit_cfg *cfg, enum dw_credit_mode mode, uint32_t npeers,
                           uint32_t ring_slots)
{
        memset(cfg, 0, sizeof(*cfg));
        cfg->mode = mode;
        cfg->npeers = npeers;
        cfg->ring_slots = ring_slots;
        cfg->slot_size = 2048;
        cfg->credit_slots = 2; /* the thesis's "best trade-off" */
}

static inline uint32_t floor_of(const struct dw_credit *c)
{
        return c->cfg.min_quota ? c->cfg.min_quota : c->cfg.credit_slots;
}

static inline uint32_t static_thr(const struct dw_credit *c, const struct dw_credit_peer *p)
{
        return c->cfg.threshold ? c->cfg.threshold
                                : dw_credit_threshold(p->intended, c->cfg.credit_slots);
}

/* Dynamic: credits a sender must hold to send its largest message. */
static inline uint32_t need_of(const struct dw_credit *c)
{
        return c->cfg.msg_slots ? c->cfg.msg_slots : 1;
}

/* Thesis current_credits: granted and neither retrieved nor given back. */
static inline uint32_t current(const struct dw_credit_peer *p)
{
        return p->rx_granted - p->rx_retired - p->rx_skip;
}

/* The part of the floor the peer does not hold now: kept for it, never lent. */
static inline uint32_t reserve(const struct dw_credit *c, const struct dw_credit_peer *p)
{
        uint32_t cur = current(p), s = floor_of(c);

        return cur < s ? s - cur : 0;
}

static inline bool newer(uint32_t a, uint32_t b)
{
        return (int32_t)(a - b) > 0;
}

/* ---- activity lists (dynamic) ------------------------------------------------ */

static void list_unlink(struct dw_credit *c, uint32_t s)
{
        struct dw_credit_dyn *d = &c->dyn[s];
        uint8_t l = d->list;

        if (d->prev != NONE)
                c->dyn[d->prev].next = d->next;
        else
                c->lhead[l] = d->next;
        if (d->next != NONE)
                c->dyn[d->next].prev = d->prev;
        else
                c->ltail[l] = d->prev;
        c->llen[l]--;
        d->prev = d->next = NONE;
}

static void list_push(struct dw_credit *c, uint8_t l, uint32_t s, bool at_head)
{
        struct dw_credit_dyn *d = &c->dyn[s];

        d->list = l;
        if (at_head) {
                d->prev = NONE;
                d->next = c->lhead[l];
                if (c->lhead[l] != NONE)
                        c->dyn[c->lhead[l]].prev = s;
                else
                        c->ltail[l] = s;
                c->lhead[l] = s;
        } else {
                d->next = NONE;
                d->prev = c->ltail[l];
                if (c->ltail[l] != NONE)
                        c->dyn[c->ltail[l]].next = s;
                else
                        c->lhead[l] = s;
                c->ltail[l] = s;
        }
        c->llen[l]++;
}

static enum dw_credit_act act_of(const struct dw_credit *c, uint32_t s)
{
        for (int r = 0; r < 4; r++)
                if (c->role[r] == c->dyn[s].list)
                        return (enum dw_credit_act)r;
        return DW_CREDIT_NULL; /* not reached */
}

static void move_head(struct dw_credit *c, enum dw_credit_act r, uint32_t s)
{
        list_unlink(c, s);
        list_push(c, c->role[r], s, true);
}

/* ---- control queue ------------------------------------------------------------ */

static void enqueue(struct dw_credit *c, uint32_t s)
{
        struct dw_credit_peer *p = &c->peer[s];

        if (p->flags & DW_CREDIT_F_QUEUED)
                return;
        p->flags |= DW_CREDIT_F_QUEUED;
        p->q_next = NONE;
        if (c->q_tail != NONE)
                c->peer[c->q_tail].q_next = s;
        else
                c->q_head = s;
        c->q_tail = s;
}

/* ---- init ---------------------------------------------------------------------- */

/* The configuration's rules: 0, or -EINVAL with the reason in why. */
static int cfg_check(const struct dw_credit_cfg *cfg, char *why, size_t whylen)
{
        uint32_t n = cfg->npeers, ring = cfg->ring_slots, cs = cfg->credit_slots;

        if (cfg->mode != DW_CREDIT_STATIC && cfg->mode != DW_CREDIT_DYNAMIC)
                return dw_why(why, whylen, -EINVAL,
                              "credit ring: mode %d is neither static nor dynamic", (int)cfg->mode);
        if (n == 0 || n > DW_CREDIT_MAX_PEERS)
                return dw_why(why, whylen, -EINVAL, "credit ring: %u peers (1..%u)", n,
                              DW_CREDIT_MAX_PEERS);
        if (ring == 0 || ring > DW_CREDIT_MAX_SLOTS)
                return dw_why(why, whylen, -EINVAL, "credit ring: %u slots (1..%u)", ring,
                              DW_CREDIT_MAX_SLOTS);
        if (cfg->slot_size < DW_CREDIT_MIN_SLOT_SIZE || cfg->slot_size > DW_CREDIT_MAX_SLOT_SIZE ||
            (cfg->slot_size & (cfg->slot_size - 1)))
                return dw_why(why, whylen, -EINVAL,
                              "credit ring: slot size %u is not a power of two in [%u, %u]",
                              cfg->slot_size, DW_CREDIT_MIN_SLOT_SIZE, DW_CREDIT_MAX_SLOT_SIZE);
        if (cs == 0 || cs > DW_CREDIT_MAX_CSLOTS)
                return dw_why(why, whylen, -EINVAL, "credit ring: %u credit slots per peer (1..%u)",
                              cs, DW_CREDIT_MAX_CSLOTS);
        uint32_t quota = ring / n;
        if (quota == 0)
                return dw_why(why, whylen, -EINVAL,
                              "credit ring: %u slots cannot give each of %u peers one slot", ring,
                              n);
        if (cfg->mode == DW_CREDIT_STATIC) {
                if (cfg->threshold > quota)
                        return dw_why(why, whylen, -EINVAL,
                                      "credit ring: threshold %u above the quota of %u slots per "
                                      "peer can never be reached (deadlock)",
                                      cfg->threshold, quota);
                if (cfg->min_quota || cfg->max_quota || cfg->msg_slots)
                        return dw_why(why, whylen, -EINVAL,
                                      "credit ring: minimum and maximum quota and message slots "
                                      "apply to the dynamic protocol only");
        } else {
                uint32_t s = cfg->min_quota ? cfg->min_quota : cs;
                if (cfg->threshold)
                        return dw_why(why, whylen, -EINVAL,
                                      "credit ring: the dynamic protocol computes its thresholds");
                if (s > quota)
                        return dw_why(why, whylen, -EINVAL,
                                      "credit ring: %u slots cannot give each of %u peers its "
                                      "minimum quota of %u",
                                      ring, n, s);
                if (cfg->msg_slots > s)
                        return dw_why(why, whylen, -EINVAL,
                                      "credit ring: messages of %u slots above the floor of %u "
                                      "could stall a sender for ever",
                                      cfg->msg_slots, s);
                if (cfg->max_quota && cfg->max_quota < quota + (ring % n != 0))
                        return dw_why(why, whylen, -EINVAL,
                                      "credit ring: maximum quota %u below the even share of %u",
                                      cfg->max_quota, quota + (ring % n != 0));
        }
        return 0;
}

/* Every peer's starting state: the credits each end holds in the other's
 * ring, the intended quotas, and (dynamic) the activity lists and FIFOs. */
static void peers_init(struct dw_credit *c)
{
        const struct dw_credit_cfg *cfg = &c->cfg;
        uint32_t n = cfg->npeers, ring = cfg->ring_slots, cs = cfg->credit_slots;
        uint32_t quota = ring / n;
        uint32_t start = cfg->mode == DW_CREDIT_STATIC ? quota : floor_of(c);
        uint32_t tx0 = cfg->init_credits ? cfg->init_credits : start;
        for (uint32_t i = 0; i < n; i++) {
                struct dw_credit_peer *p = &c->peer[i];
                p->tx_limit = tx0;
                p->rx_granted = start;
                p->intended = quota;
                p->q_next = NONE;
                if (cfg->mode == DW_CREDIT_DYNAMIC) {
                        c->dyn[i].prev = c->dyn[i].next = NONE;
                        /* The leftover of the even split goes to the first
                         * peers: the intended quotas add up to the ring. */
                        if (i < ring % n)
                                p->intended++;
                        for (uint32_t k = 0; k <= cs; k++)
                                c->fifo[(size_t)i * (cs + 1) + k] = 1;
                        list_push(c, c->role[DW_CREDIT_LOW], i, false);
                }
        }
}

int dw_credit_init(struct dw_credit *c, const struct dw_credit_cfg *cfg, char *why, size_t whylen)
{
        uint32_t n = cfg->npeers, ring = cfg->ring_slots, cs = cfg->credit_slots;

        memset(c, 0, sizeof(*c));
        int err = cfg_check(cfg, why, whylen);
        if (err < 0)
                return err;
        c->cfg = *cfg;
        c->peer = calloc(n, sizeof(*c->peer));
        c->slot = calloc(ring, sizeof(*c->slot));
        c->slot_len = calloc(ring, sizeof(*c->slot_len));
        c->slot_done = calloc(ring, 1);
        if (cfg->mode == DW_CREDIT_DYNAMIC) {
                c->fifo = calloc((size_t)n * (cs + 1), sizeof(*c->fifo));
                c->dyn = calloc(n, sizeof(*c->dyn));
        }
        if (!c->peer || !c->slot || !c->slot_len || !c->slot_done ||
            (cfg->mode == DW_CREDIT_DYNAMIC && (!c->fifo || !c->dyn))) {
                dw_credit_fini(c);
                if (why && whylen)
                        snprintf(why, whylen, "credit ring: no memory for %u peers, %u slots", n,
                                 ring);
                return -ENOMEM;
        }
        c->q_head = c->q_tail = NONE;
        for (int l = 0; l < 4; l++) {
                c->lhead[l] = c->ltail[l] = NONE;
                c->role[l] = (uint8_t)l;
        }
        peers_init(c);
        if (cfg->mode == DW_CREDIT_DYNAMIC)
                c->available = ring - n * floor_of(c);
        return 0;
}

void dw_credit_fini(struct dw_credit *c)
{
        free(c->peer);
        free(c->fifo);
        free(c->dyn);
        free(c->slot);
        free(c->slot_len);
        free(c->slot_done);
        c->peer = NULL;
        c->fifo = c->slot = c->slot_len = NULL;
        c->slot_done = NULL;
}

int dw_credit_peer_reset(struct dw_credit *c, uint32_t peer)
{
        const struct dw_credit_cfg *cfg = &c->cfg;
        if (peer >= cfg->npeers)
                return -EINVAL;
        if (cfg->mode != DW_CREDIT_STATIC)
                return -EOPNOTSUPP;
        /* Its messages still in the ring (parked, or released behind an
         * earlier one) stay until they leave in order; the credits they
         * took belong to the counters that end here. */
        for (uint32_t at = c->tail; at != c->head;) {
                uint32_t t = at % cfg->ring_slots;
                if (c->slot[t] == peer + 1)
                        c->slot[t] = ORPHAN;
                at += c->slot_len[t];
        }
        struct dw_credit_peer *p = &c->peer[peer];
        uint32_t start = cfg->ring_slots / cfg->npeers;
        uint8_t queued = p->flags & DW_CREDIT_F_QUEUED;
        uint32_t q_next = p->q_next;
        *p = (struct dw_credit_peer){
            .tx_limit = cfg->init_credits ? cfg->init_credits : start,
            .rx_granted = start,
            .intended = start,
            .q_next = q_next,
            .flags = queued, /* stays linked: a credit message then says the new limit */
        };
        return 0;
}

uint32_t dw_credit_slots_for(const struct dw_credit *c, uint64_t bytes)
{
        uint64_t n = (bytes + c->cfg.slot_size - 1) / c->cfg.slot_size;

        return n ? (n > UINT32_MAX ? UINT32_MAX : (uint32_t)n) : 1;
}

size_t dw_credit_peer_bytes(const struct dw_credit *c)
{
        size_t b = sizeof(struct dw_credit_peer);

        if (c->cfg.mode == DW_CREDIT_DYNAMIC)
                b += sizeof(struct dw_credit_dyn) + (c->cfg.credit_slots + 1) * sizeof(uint32_t);
        return b;
}

/* ---- receiver role: returns --------------------------------------------------- */

/* Grants amt more credits to s (dynamic): from its own floor reserve first,
 * then from the available slots. The caller checked amt <= available + reserve. */
static void give_dyn(struct dw_credit *c, uint32_t s, uint32_t amt)
{
        struct dw_credit_peer *p = &c->peer[s];
        uint32_t r0 = reserve(c, p), r1;

        if (!amt)
                return;
        p->rx_granted += amt;
        r1 = reserve(c, p);
        c->available -= amt - (r0 - r1);
        p->flags |= DW_CREDIT_F_CHANGED;
}

static inline uint32_t *fifo_of(struct dw_credit *c, uint32_t s)
{
        return &c->fifo[(size_t)s * (c->cfg.credit_slots + 1)];
}

static void steal(struct dw_credit *c, uint32_t s, uint32_t v)
{
        struct dw_credit_peer *ps = &c->peer[s], *pv = &c->peer[v];
        uint32_t fl = floor_of(c), cs = c->cfg.credit_slots;
        uint32_t diff =
            ps->intended > pv->intended ? ps->intended - pv->intended : pv->intended - ps->intended;
        uint32_t cred = diff / 2 > cs + 1 ? diff / 2 : cs + 1; /* Eq. 6.1 */

        if (cred > pv->intended - fl)
                cred = pv->intended - fl;
        if (c->cfg.max_quota) {
                uint32_t room =
                    ps->intended < c->cfg.max_quota ? c->cfg.max_quota - ps->intended : 0;
                if (cred > room)
                        cred = room;
        }
        if (cred) {
                pv->intended -= cred;
                ps->intended += cred;
                c->stats.steals++;
        }
        if (pv->intended == fl) {
                /* The victim has nothing more to give: park it in NULL, and
                 * ask back what it holds above its quota. */
                if (current(pv) > pv->intended && !(pv->flags & DW_CREDIT_F_BLOCKED)) {
                        pv->flags |= DW_CREDIT_F_BLOCKED | DW_CREDIT_F_REQ;
                        enqueue(c, v);
                }
                move_head(c, DW_CREDIT_NULL, v);
        } else {
                move_head(c, DW_CREDIT_MEDIUM, v);
        }
}

static void monitor(struct dw_credit *c, uint32_t s)
{
        enum dw_credit_act a = act_of(c, s);

        if (a == DW_CREDIT_LOW) {
                move_head(c, DW_CREDIT_MEDIUM, s);
                return;
        }
        if (a == DW_CREDIT_MEDIUM) {
                move_head(c, DW_CREDIT_HIGH, s);
                return;
        }
        /* HIGH, or NULL coming back to activity: take from the least active. */
        if (c->llen[c->role[DW_CREDIT_LOW]] == 0) {
                uint8_t t = c->role[DW_CREDIT_LOW];
                c->role[DW_CREDIT_LOW] = c->role[DW_CREDIT_MEDIUM];
                c->role[DW_CREDIT_MEDIUM] = c->role[DW_CREDIT_HIGH];
                c->role[DW_CREDIT_HIGH] = t;
        }
        move_head(c, DW_CREDIT_HIGH, s);
        if (c->llen[c->role[DW_CREDIT_LOW]])
                steal(c, s, c->ltail[c->role[DW_CREDIT_LOW]]);
}

/* A threshold of s was reached (dynamic). pb_way: at send time, the value
 * rides on the packet being built; otherwise a stand-alone message is owed.
 * The FIFO of credit_slots + 1 thresholds is a full circular buffer whose
 * head index is dyn[s].events: popping the head and pushing the new threshold
 * write the same entry, then the head moves on. */
static void threshold_event(struct dw_credit *c, uint32_t s, bool pb_way)
{
        struct dw_credit_peer *p = &c->peer[s];
        uint32_t cs = c->cfg.credit_slots, amt;

        uint32_t need = need_of(c), cur = current(p);
        if (p->flags & DW_CREDIT_F_BLOCKED) {
                /* Blocked flow: keep it at its floor until the response; the
                 * FIFO is left alone. */
                amt = cur >= floor_of(c) ? 0 : cur + 1 < need ? need - cur : 1;
        } else {
                struct dw_credit_dyn *d = &c->dyn[s];
                uint32_t *f = fifo_of(c, s);
                uint32_t h = d->events, nh = (h + 1) % (cs + 1);
                if (nh == 0)
                        monitor(c, s); /* every (cs + 1)-th event: a monitoring point */
                uint32_t t = dw_credit_threshold(p->intended, cs);
                uint32_t room = c->available + reserve(c, p);
                f[h] = t;
                d->events = (uint8_t)nh;
                if (d->piggybacked <= t) {
                        amt = t - d->piggybacked; /* deficit: what piggybacks left */
                        if (amt > room)
                                amt = room;
                } else {
                        amt = 0; /* excess: the next threshold is later by it */
                        f[nh] += d->piggybacked - t;
                }
                if (cur + amt < need)
                        amt = need - cur; /* never leave a sender short of a
                                             message (room >= floor >= need) */
        }
        give_dyn(c, s, amt);
        p->retrieved = 0;
        c->dyn[s].piggybacked = 0;
        if (!pb_way && amt) {
                p->flags |= DW_CREDIT_F_DUE;
                enqueue(c, s);
        }
}

static void check_crossing(struct dw_credit *c, uint32_t s)
{
        const struct dw_credit_peer *p = &c->peer[s];
        const struct dw_credit_dyn *d = &c->dyn[s];

        if (p->retrieved + d->piggybacked >= fifo_of(c, s)[d->events] || current(p) < need_of(c))
                threshold_event(c, s, false);
}

/* n slots of s were retrieved (freed in ring order). They count one by one,
 * as n one-slot packets would in the thesis: a threshold crossed in the
 * middle of a message returns its own amount, and the rest counts on. */
static void retire(struct dw_credit *c, uint32_t s, uint32_t n)
{
        struct dw_credit_peer *p = &c->peer[s];

        if (c->cfg.mode == DW_CREDIT_STATIC) {
                uint32_t thr = static_thr(c, p), k;
                p->rx_retired += n;
                p->retrieved += n;
                k = p->retrieved / thr;
                if (k) {
                        p->rx_granted += k * thr;
                        p->retrieved -= k * thr;
                        p->flags |= DW_CREDIT_F_CHANGED | DW_CREDIT_F_DUE;
                        enqueue(c, s);
                }
                return;
        }
        for (uint32_t i = 0; i < n; i++) {
                uint32_t r0 = reserve(c, p);
                p->rx_retired++;
                c->available += 1 - (reserve(c, p) - r0);
                p->retrieved++;
                check_crossing(c, s);
        }
}

/* ---- receiver role: the ring ------------------------------------------------------ */

int dw_credit_rx_arrive(struct dw_credit *c, uint32_t peer, uint32_t nslots, uint32_t *pos)
{
        uint32_t ring = c->cfg.ring_slots;

        if (peer >= c->cfg.npeers || nslots == 0 || nslots > ring)
                return -EINVAL;
        struct dw_credit_peer *p = &c->peer[peer];
        uint32_t left = p->rx_granted - p->rx_arrived - p->rx_skip;
        if (left > ring || left < nslots) {
                c->stats.refused++;
                return -EPROTO;
        }
        if (c->head - c->tail + nslots > ring) {
                c->stats.refused++;
                return -EPROTO; /* only a broken peer gets here (left bounds it) */
        }
        uint32_t at = c->head % ring;
        c->slot[at] = peer + 1;
        c->slot_len[at] = nslots;
        c->slot_done[at] = 0;
        c->head += nslots;
        p->rx_arrived += nslots;
        c->stats.arrivals++;
        c->stats.slots_in += nslots;
        if (pos)
                *pos = at;
        return 0;
}

int dw_credit_rx_pass(struct dw_credit *c, uint32_t peer, uint32_t nslots)
{
        if (peer >= c->cfg.npeers || nslots == 0 || nslots > c->cfg.ring_slots)
                return -EINVAL;
        struct dw_credit_peer *p = &c->peer[peer];
        uint32_t left = p->rx_granted - p->rx_arrived - p->rx_skip;
        if (left > c->cfg.ring_slots || left < nslots) {
                c->stats.refused++;
                return -EPROTO;
        }
        p->rx_arrived += nslots;
        c->stats.arrivals++;
        c->stats.slots_in += nslots;
        retire(c, peer, nslots);
        return 0;
}

int dw_credit_rx_consumed(struct dw_credit *c, uint32_t peer, uint32_t nslots)
{
        /* An empty ring: taking a slot and freeing it would retire it at
         * once, exactly what a pass does. */
        if (c->head == c->tail)
                return dw_credit_rx_pass(c, peer, nslots);
        uint32_t pos;
        if (dw_credit_rx_arrive(c, peer, nslots, &pos) == 0)
                return dw_credit_rx_release(c, pos, nslots);
        return dw_credit_rx_pass(c, peer, nslots);
}

int dw_credit_rx_release(struct dw_credit *c, uint32_t pos, uint32_t nslots)
{
        uint32_t ring = c->cfg.ring_slots;

        if (pos >= ring || !c->slot[pos])
                return -EINVAL;
        if (c->slot_done[pos])
                return -EALREADY;
        if (c->slot_len[pos] != nslots)
                return -EINVAL;
        c->slot_done[pos] = 1;
        while (c->tail != c->head) {
                uint32_t t = c->tail % ring;
                if (!c->slot[t] || !c->slot_done[t])
                        break;
                uint32_t owner = c->slot[t], n = c->slot_len[t];
                c->slot[t] = 0;
                c->slot_done[t] = 0;
                c->tail += n;
                if (owner != ORPHAN)
                        retire(c, owner - 1, n);
        }
        return 0;
}

int dw_credit_on_response(struct dw_credit *c, uint32_t peer, uint32_t skip_total)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        if (c->cfg.mode != DW_CREDIT_DYNAMIC)
                return -EPROTO;
        struct dw_credit_peer *p = &c->peer[peer];
        uint32_t d = skip_total - p->rx_skip;
        if (!(p->flags & DW_CREDIT_F_BLOCKED))
                return -EPROTO; /* no request of ours is waiting for it */
        if ((int32_t)d < 0)
                return -EPROTO; /* a give-back cannot shrink */
        if (d > p->rx_granted - p->rx_arrived - p->rx_skip)
                return -EPROTO;
        uint32_t r0 = reserve(c, p);
        p->rx_skip = skip_total;
        c->available += d - (reserve(c, p) - r0);
        p->flags &= (uint8_t)~DW_CREDIT_F_BLOCKED;
        if (d || current(p) < need_of(c))
                check_crossing(c, peer);
        return 0;
}

int dw_credit_piggyback(struct dw_credit *c, uint32_t peer, uint32_t *limit)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        struct dw_credit_peer *p = &c->peer[peer];
        if (p->retrieved) {
                if (c->cfg.mode == DW_CREDIT_STATIC) {
                        /* Everything retrieved rides now (thesis Sec. 5.4). */
                        c->stats.early_slots += p->retrieved;
                        p->rx_granted += p->retrieved;
                        p->retrieved = 0;
                        p->flags |= DW_CREDIT_F_CHANGED;
                } else if (!(p->flags & DW_CREDIT_F_BLOCKED)) {
                        struct dw_credit_dyn *d = &c->dyn[peer];
                        if (p->retrieved + d->piggybacked >= fifo_of(c, peer)[d->events]) {
                                threshold_event(c, peer, true); /* the piggyback way */
                        } else if (p->retrieved <= c->available + reserve(c, p)) {
                                c->stats.early_slots += p->retrieved;
                                give_dyn(c, peer, p->retrieved);
                                d->piggybacked += p->retrieved;
                                p->retrieved = 0;
                        }
                }
        }
        p->flags &= (uint8_t)~DW_CREDIT_F_DUE; /* the value rides on this packet */
        *limit = p->rx_granted;
        if (!(p->flags & DW_CREDIT_F_CHANGED))
                return 0;
        p->flags &= (uint8_t)~DW_CREDIT_F_CHANGED;
        c->stats.piggybacks++;
        return 1;
}

int dw_credit_flush(struct dw_credit *c, uint32_t peer)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        struct dw_credit_peer *p = &c->peer[peer];
        if (c->cfg.mode != DW_CREDIT_STATIC || !p->retrieved)
                return 0;
        p->rx_granted += p->retrieved;
        p->retrieved = 0;
        p->flags |= DW_CREDIT_F_CHANGED;
        return 1;
}

uint32_t dw_credit_limit(const struct dw_credit *c, uint32_t peer)
{
        return peer < c->cfg.npeers ? c->peer[peer].rx_granted : 0;
}

/* ---- sender role ------------------------------------------------------------------ */

static inline uint32_t tx_credits(const struct dw_credit_peer *p)
{
        return p->tx_limit - p->tx_used;
}

uint32_t dw_credit_tx_avail(const struct dw_credit *c, uint32_t peer)
{
        if (peer >= c->cfg.npeers)
                return 0;
        const struct dw_credit_peer *p = &c->peer[peer];
        uint32_t k = tx_credits(p);
        uint32_t held =
            c->cfg.ctl_free ? 0 : !!(p->flags & DW_CREDIT_F_REQ) + !!(p->flags & DW_CREDIT_F_RESP);
        return k > held ? k - held : 0;
}

uint32_t dw_credit_tx_take(struct dw_credit *c, uint32_t peer, uint32_t want)
{
        uint32_t k = dw_credit_tx_avail(c, peer);

        if (k < want) {
                c->stats.tx_stalls++;
                want = k;
        }
        if (want)
                c->peer[peer].tx_used += want;
        return want;
}

void dw_credit_tx_untake(struct dw_credit *c, uint32_t peer, uint32_t n)
{
        if (peer < c->cfg.npeers)
                c->peer[peer].tx_used -= n;
}

uint32_t dw_credit_widen16(const struct dw_credit *c, uint32_t peer, uint16_t wire)
{
        uint32_t ref = peer < c->cfg.npeers ? c->peer[peer].tx_limit : 0;
        return ref + (uint32_t)(int32_t)(int16_t)(uint16_t)(wire - (uint16_t)ref);
}

static int check_limit(const struct dw_credit_peer *p, uint32_t limit)
{
        if (newer(limit, p->tx_limit) && limit - p->tx_used > DW_CREDIT_MAX_SLOTS)
                return -EPROTO;
        return 0;
}

static int apply_limit(struct dw_credit *c, uint32_t peer, uint32_t limit)
{
        struct dw_credit_peer *p = &c->peer[peer];

        if (!newer(limit, p->tx_limit))
                return 0;
        p->tx_limit = limit;
        if (p->flags & (DW_CREDIT_F_REQ | DW_CREDIT_F_RESP))
                enqueue(c, peer);
        return 1;
}

int dw_credit_tx_update(struct dw_credit *c, uint32_t peer, uint32_t limit)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        int rc = check_limit(&c->peer[peer], limit);
        return rc ? rc : apply_limit(c, peer, limit);
}

int dw_credit_cr_arrive(struct dw_credit *c, uint32_t peer, uint32_t limit)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        struct dw_credit_peer *p = &c->peer[peer];
        int rc = check_limit(p, limit);
        if (rc)
                return rc;
        if (!p->cr_used || newer(limit, p->cr_value))
                p->cr_value = limit;
        if (p->cr_used < c->cfg.credit_slots) {
                p->cr_used++;
                return 0;
        }
        c->stats.cr_merged++;
        return 1;
}

int dw_credit_cr_consume(struct dw_credit *c, uint32_t peer)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        struct dw_credit_peer *p = &c->peer[peer];
        if (!p->cr_used)
                return -ENOENT;
        /* The newest value covers the older ones: reading one reads all. */
        p->cr_used = 0;
        return apply_limit(c, peer, p->cr_value);
}

int dw_credit_on_request(struct dw_credit *c, uint32_t peer)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        if (c->cfg.mode != DW_CREDIT_DYNAMIC)
                return -EPROTO;
        struct dw_credit_peer *p = &c->peer[peer];
        uint32_t k = tx_credits(p), fl = floor_of(c);
        uint32_t give = k > fl ? k - fl : 0;
        p->tx_used += give;
        p->tx_skip += give;
        p->flags |= DW_CREDIT_F_RESP;
        enqueue(c, peer);
        return 0;
}

int dw_credit_next_ctl(struct dw_credit *c, struct dw_credit_ctl *out)
{
        while (c->q_head != NONE) {
                uint32_t s = c->q_head;
                struct dw_credit_peer *p = &c->peer[s];
                c->q_head = p->q_next;
                if (c->q_head == NONE)
                        c->q_tail = NONE;
                p->flags &= (uint8_t)~DW_CREDIT_F_QUEUED;
                out->peer = s;
                bool can = c->cfg.ctl_free || tx_credits(p);
                if ((p->flags & (DW_CREDIT_F_REQ | DW_CREDIT_F_RESP)) && can) {
                        if (!c->cfg.ctl_free)
                                p->tx_used++; /* it takes a slot of the peer's ring */
                        if (p->flags & DW_CREDIT_F_REQ) {
                                p->flags &= (uint8_t)~DW_CREDIT_F_REQ;
                                out->type = DW_CREDIT_CTL_REQUEST;
                                out->value = 0;
                                c->stats.requests++;
                        } else {
                                p->flags &= (uint8_t)~DW_CREDIT_F_RESP;
                                out->type = DW_CREDIT_CTL_RESPONSE;
                                out->value = p->tx_skip;
                                c->stats.responses++;
                        }
                } else if (p->flags & DW_CREDIT_F_DUE) {
                        p->flags &= (uint8_t) ~(DW_CREDIT_F_DUE | DW_CREDIT_F_CHANGED);
                        out->type = DW_CREDIT_CTL_CREDIT;
                        out->value = p->rx_granted;
                        c->stats.credit_msgs++;
                } else {
                        continue; /* waits for credits: queued again when they come */
                }
                if (p->flags & DW_CREDIT_F_DUE ||
                    ((p->flags & (DW_CREDIT_F_REQ | DW_CREDIT_F_RESP)) &&
                     (c->cfg.ctl_free || tx_credits(p))))
                        enqueue(c, s);
                return 1;
        }
        return 0;
}

int dw_credit_view(const struct dw_credit *c, uint32_t peer, struct dw_credit_view *v)
{
        if (peer >= c->cfg.npeers)
                return -EINVAL;
        const struct dw_credit_peer *p = &c->peer[peer];
        memset(v, 0, sizeof(*v));
        v->tx_credits = tx_credits(p);
        v->rx_current = current(p);
        v->rx_inring = p->rx_arrived - p->rx_retired;
        v->rx_retrieved = p->retrieved;
        v->intended = p->intended;
        v->cr_used = p->cr_used;
        v->blocked = p->flags & DW_CREDIT_F_BLOCKED;
        if (c->cfg.mode == DW_CREDIT_STATIC) {
                v->threshold = static_thr(c, p);
                v->act = DW_CREDIT_LOW;
        } else {
                v->threshold =
                    c->fifo[(size_t)peer * (c->cfg.credit_slots + 1) + c->dyn[peer].events];
                v->act = act_of(c, peer);
        }
        return 0;
}
