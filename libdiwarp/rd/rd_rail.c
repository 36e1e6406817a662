/* RD multirail: which rail each datagram of a stream leaves by, rails found
 * down and answering again, the rail list a datagram carries and its proof
 * (the peer device's challenge echoed), and what a received datagram says
 * of the peer's rails. docs/PROTOCOL.md "Multirail" has the wire format,
 * rd/README.md the decisions.
 *
 * A stream is multirail when both devices have two or more rails
 * (rd_rails, rd_int.h). Rail 0 is the stream's own path; each other rail
 * has its own flow path (congestion window, pacing, last ACK), so a segment
 * of a large message goes by the rail whose window has room (rd_seg_rail),
 * and a resend is charged to the rail that lost it (rd_resend_rail).
 */
#include "rd/rd_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "util/keyhash.h"
#include "util/log.h"

/* ---------------------------------------------------------------- rails up and down */

void rd_rail_down(struct dw_rd_peer *p, unsigned rail, uint64_t now, const char *why)
{
        struct dw_flow_path *f = rd_rail_path(p, rail);
        struct dw_device *dev = p->s->qp->dev;
        f->probe_at = now + RD_RAIL_PROBE_NS;
        if (f->down)
                return;
        f->down = true;
        if (rail < DIWARP_MAX_RAILS)
                dev->rail[rail].downs++;
        char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN];
        struct in_addr la = {rail < (unsigned)dev->nrails ? dev->gids[rail].addr : 0};
        struct in_addr ra = {rd_rail_ip(p, rail)};
        dw_warn("RD QP %#x: rail %u (%s -> %s) down: %s; its segments go by the other rails",
                p->s->qp->qpn, rail, inet_ntop(AF_INET, &la, a, sizeof(a)),
                inet_ntop(AF_INET, &ra, b, sizeof(b)), why);
}

void rd_rail_up(struct dw_rd_peer *p, unsigned rail)
{
        struct dw_flow_path *f = rd_rail_path(p, rail);
        if (!f->down)
                return;
        f->down = false;
        f->retx_since_ack = 0;
        dw_info("RD QP %#x: rail %u answers again", p->s->qp->qpn, rail);
}

/* The kernel refused to send by the slot's rail (no route, interface down). */
void rd_rail_neterr(struct dw_rd_peer *p, unsigned rail, int err, uint64_t now)
{
        if (!rd_rails(p))
                return;
        char why[96];
        snprintf(why, sizeof(why), "the kernel refuses to send by it (%s)", strerror(-err));
        rd_rail_down(p, rail, now, why);
}

/* Whether another rail that is up answers while `rail` does not, so that
 * `rail` (whose datagram psn is being resent) has failed: a receiver that
 * stalls (descheduled) stops answering on every rail at once, and that is
 * no rail's failure. Another rail answers when it had a datagram
 * acknowledged after the last one of `rail`, or when a later PSN of this
 * stream that it carried was acknowledged above psn (SACKed): the receiver
 * took data sent after the one `rail` lost. The second holds when the send
 * window is full behind the lost PSN and nothing new moves on any rail, so
 * that no ACK comes after the last one both rails got in the same step
 * (the rail was then never found down, and the resends of its head PSN ran
 * the QP into its retry limit: netns_multirail_peerdown, once in a CI run).
 * A stalled receiver acknowledges nothing above the lost PSN. */
static bool rd_rail_others_answer(const struct dw_rd_peer *p, unsigned rail, uint32_t psn)
{
        const struct dw_flow_path *f = rd_rail_path(p, rail);
        unsigned n = rd_rails(p);
        for (unsigned r = 0; r < n; r++) {
                const struct dw_flow_path *g = rd_rail_path(p, r);
                if (r != rail && !g->down && g->last_ack > f->last_ack)
                        return true;
        }
        if (!p->rel.ring)
                return false;
        for (uint32_t q = psn + 1; dw_psn_before(q, p->rel.snd_nxt); q++) {
                const struct dw_rel_txent *e = &p->rel.ring[q & p->rel.ring_mask];
                unsigned r = ck_rail(e->cookie);
                if ((e->flags & DW_REL_TXF_SACKED) && r != rail && r < n &&
                    !rd_rail_path(p, r)->down)
                        return true;
        }
        return false;
}

void rd_path_forget(struct dw_rd_peer *p)
{
        uint32_t left = p->cc_inflight;
        if (rd_rails(p) && p->rel.ring) {
                for (uint32_t psn = p->rel.snd_una; dw_psn_before(psn, p->rel.snd_nxt); psn++) {
                        const struct dw_rel_txent *e = &p->rel.ring[psn & p->rel.ring_mask];
                        unsigned r = ck_rail(e->cookie);
                        if (!r || (e->flags & DW_REL_TXF_SACKED))
                                continue;
                        uint32_t b = rd_cc_bytes(p, e->cookie);
                        b = b < left ? b : left;
                        dw_cc_forget(&rd_rail_path(p, r)->cc, b);
                        left -= b;
                }
        }
        dw_cc_forget(&p->path->cc, left);
        p->cc_inflight = 0;
}

/* ---------------------------------------------------------------- which rail */

static bool rd_rail_usable(const struct dw_flow_path *f, uint64_t now)
{
        return !f->down || now >= f->probe_at;
}

/* The rail a segment that is not striped goes by: the stream's own (rail
 * 0) unless it is down, then the first rail up. */
unsigned rd_home_rail(const struct dw_rd_peer *p)
{
        if (!p->path->down)
                return 0;
        unsigned n = rd_rails(p);
        for (unsigned r = 1; r < n; r++)
                if (!rd_rail_path(p, r)->down)
                        return r;
        return 0;
}

/* Whether path f's window lets `bytes` more go now; remembers when pacing will. */
bool rd_cc_room_on(struct dw_rd_dev *d, struct dw_flow_path *f, uint32_t bytes, uint64_t now)
{
        if (dw_cc_can_send(&f->cc, f->pending, bytes, now))
                return true;
        uint64_t t = dw_cc_next_send(&f->cc, now);
        if (t && (!d->pace_wake || t < d->pace_wake))
                d->pace_wake = t;
        return false;
}

/* The rail the next segment of a striped message goes by: the current one
 * while its window has room and its run lasts, else the usable rail with the
 * most room in its window, so each rail pulls segments as fast as it
 * carries them (no fixed share per rail); -1 when no rail has room now. A
 * rail that is down gets one segment per probe interval. */
static int rd_pick_rail(struct dw_rd_qp *s, struct dw_rd_peer *p, unsigned n, uint32_t ccb,
                        uint64_t now)
{
        struct dw_rd_dev *d = rdd(s->qp->dev);
        unsigned cur = s->tx_rail < n ? s->tx_rail : 0;
        struct dw_flow_path *f = rd_rail_path(p, cur);
        if (s->tx_run && s->tx_run < RD_RAIL_RUN && !f->down && rd_cc_room_on(d, f, ccb, now)) {
                s->tx_run++;
                return (int)cur;
        }
        int best = -1;
        int64_t best_room = INT64_MIN;
        for (unsigned k = 1; k <= n; k++) {
                unsigned r = (cur + k) % n;
                f = rd_rail_path(p, r);
                if (!rd_rail_usable(f, now) || !rd_cc_room_on(d, f, ccb, now))
                        continue;
                int64_t room = (int64_t)f->cc.cwnd - f->cc.inflight - f->pending;
                if (room > best_room) {
                        best = (int)r;
                        best_room = room;
                }
        }
        if (best < 0)
                return -1;
        f = rd_rail_path(p, (unsigned)best);
        if (f->down)
                f->probe_at = now + RD_RAIL_PROBE_NS; /* this segment is the probe */
        s->tx_rail = (uint8_t)best;
        s->tx_run = 1;
        return best;
}

/* The rail of a new segment of `len` bytes (message length): striped above
 * DIWARP_STRIPE_MIN, else the home rail; -1: no rail has room. */
int rd_seg_rail(struct dw_rd_qp *s, struct dw_rd_peer *p, uint64_t len, uint32_t ccb, uint64_t now)
{
        unsigned n = rd_rails(p);
        if (!n)
                return 0;
        uint32_t min = s->qp->dev->cfg.stripe_min;
        if (min && len >= min)
                return rd_pick_rail(s, p, n, ccb, now);
        return (int)rd_home_rail(p);
}

/* ---------------------------------------------------------------- on the wire */

/* The multirail extensions of a datagram by rail `rail` to p: our rail list
 * on one to the peer's first address now and then, with its proof (the
 * peer device's challenge echoed as the token; RC over RD: the connection's
 * token, rd_hdr_token, proves it), our first address (the stream's name at
 * the peer) on one to any other. Returns their length. */
size_t rd_hdr_rails(struct dw_rd_peer *p, unsigned rail, struct dw_dgram_hdr *h)
{
        struct dw_device *dev = p->s->qp->dev;
        if (dev->nrails < 2)
                return 0;
        if (rail) {
                h->xflags |= DW_DGRAM_X_RAIL;
                h->origin = dev->addr.s_addr;
                return DW_DGRAM_RAIL_LEN;
        }
        if (!rd_rails_due(p))
                return 0;
        uint64_t now = rdd(dev)->step_now;
        p->path->rails_told_at = now ? now : 1;
        h->xflags |= DW_DGRAM_X_RAILS;
        h->rail_count = (uint8_t)dev->nrails;
        for (int i = 0; i < dev->nrails; i++)
                h->rails[i] = dev->gids[i].addr;
        size_t n = DW_DGRAM_RAILS_LEN(h->rail_count);
        if (!p->s->ctok_tx && p->path->echo) {
                h->xflags2 |= DW_DGRAM_X2_TOKEN;
                h->token = p->path->echo;
                n += DW_DGRAM_TOKEN_LEN;
        }
        return n;
}

/* Every path of p's rails: nothing of the batch is pending any more. */
void rd_pending_clear(struct dw_rd_peer *p)
{
        p->path->pending = 0;
        for (unsigned r = 1; r < p->path->nrails; r++)
                p->path->rail[r]->pending = 0;
}

/* Multirail: a resend counts against the rail that lost it (its window
 * shrinks, and a rail that keeps losing with nothing acknowledged is down);
 * it goes by that rail while it is up, else by the home rail, and rel/ then
 * names it by its new rail so its ACK and window charge follow it. */
uint64_t rd_resend_rail(struct dw_rd_peer *p, uint32_t psn, uint64_t cookie, uint32_t b,
                        uint64_t now)
{
        unsigned rail = ck_rail(cookie);
        struct dw_flow_path *f = rd_rail_path(p, rail);
        dw_cc_lost(&f->cc, DW_CC_LOSS_FAST, now);
        if (++f->retx_since_ack >= RD_RAIL_DOWN_RETX && now - f->last_ack >= RD_RAIL_DOWN_NS &&
            !f->down && rd_rail_others_answer(p, rail, psn))
                rd_rail_down(p, rail, now, "its datagrams go unacknowledged");
        if (!f->down)
                return cookie;
        unsigned to = rd_home_rail(p);
        if (to == rail) {
                /* Every rail is down: try the next one round. */
                unsigned n = rd_rails(p);
                to = (rail + 1) % n;
        }
        struct dw_flow_path *g = rd_rail_path(p, to);
        dw_cc_forget(&f->cc, b);
        dw_cc_sent(&g->cc, b, false, now);
        cookie = ck_on_rail(cookie, to);
        dw_rel_tx_rename(&p->rel, psn, cookie, to);
        return cookie;
}

/* ---------------------------------------------------------------- receive */

/* Multirail: a rail list without its proof. A wrong token is counted; either
 * way the peer device gets our challenge (at most once per
 * RD_RAILS_EVERY_NS), by an ACK to its first address, to echo in its next
 * list. */
static void rd_rails_unproven(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint64_t now)
{
        struct dw_flow_path *f = p->path;
        struct dw_qp *qp = p->s->qp;
        if (h->xflags2 & DW_DGRAM_X2_TOKEN) {
                char pb[64];
                qp->dev->ctr.rx_dropped_rail++;
                qp->ctr.rx_dropped_rail++;
                dw_warn_limited(&qp->dev->log_limit,
                                "RD QP %#x peer %s: rail list with a wrong token (not our "
                                "challenge): refused",
                                qp->qpn, rd_peer_str(p, pb, sizeof(pb)));
        }
        if (f->chal_at && now - f->chal_at < RD_RAILS_EVERY_NS)
                return;
        if (!f->chal && dw_random64(&f->chal) < 0)
                return;
        f->chal_due = true;
        f->chal_at = now ? now : 1;
        rd_send_ack(p);
}

/* Multirail: the peer device's rail list, when this datagram carries it
 * with its proof (the echo of our challenge, or the connection's token that
 * every datagram of an RC-over-RD connection carries), a challenge it gives
 * us, and the rail the datagram came by (our answers go back that way). */
void rd_rx_rails(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint32_t from_ip, uint64_t now)
{
        struct dw_flow_path *f = p->path;
        if (h->xflags2 & DW_DGRAM_X2_CHALLENGE) {
                /* Our next list to that device echoes it, and goes at once. */
                f->echo = h->challenge;
                f->rails_told_at = 0;
        }
        if ((h->xflags & DW_DGRAM_X_RAILS) && !(h->xflags & DW_DGRAM_X_RAIL) &&
            h->rails[0] == p->ip) {
                bool proven = p->s->ctok_rx || (f->chal && h->token == f->chal);
                if (!proven)
                        rd_rails_unproven(p, h, now);
                else if (dw_flow_path_set_rails(&rdd(p->s->qp->dev)->paths, f, h->rail_count,
                                                h->rails, p->udp_mtu + RD_IP_UDP) < 0)
                        dw_warn_limited(
                            &p->s->qp->dev->log_limit,
                            "RD QP %#x: no memory for the peer's rails: it stays on one",
                            p->s->qp->qpn);
        }
        uint8_t rail = 0;
        if (from_ip != p->ip)
                for (unsigned r = 1; r < f->nrails; r++)
                        if (f->rail_ip[r] == from_ip)
                                rail = (uint8_t)r;
        p->reply_rail = rail;
}

void dw_rd_rails_down(struct dw_device *dev, bool down[DIWARP_MAX_RAILS])
{
        memset(down, 0, DIWARP_MAX_RAILS * sizeof(*down));
        struct dw_rd_dev *d = rdd(dev);
        for (uint32_t i = 0; d && d->paths.tab && i <= d->paths.mask; i++)
                for (const struct dw_flow_path *f = d->paths.tab[i]; f; f = f->next)
                        for (unsigned r = 0; r < f->nrails && r < DIWARP_MAX_RAILS; r++)
                                down[r] |= f->rail[r]->down;
}
