/* In-process tests of the core: device, objects, the QP state machine, the
 * posting rules, flushing, and UD traffic between QPs of one process (two
 * devices on loopback, so every byte crosses a real UDP socket). */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#define QKEY 0x11111111u

static struct diwarp_device *dev_a, *dev_b;

static void open_devs(void)
{
        cr_assert_eq(diwarp_device_open(NULL, &dev_a), 0);
        cr_assert_eq(diwarp_device_open(NULL, &dev_b), 0);
}

static void close_devs(void)
{
        if (dev_a)
                cr_expect_eq(diwarp_device_close(dev_a), 0);
        if (dev_b)
                cr_expect_eq(diwarp_device_close(dev_b), 0);
        dev_a = dev_b = NULL;
}

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t *buf;
        size_t len;
        uint32_t lkey;
};

static void side_init(struct side *s, struct diwarp_device *dev, enum diwarp_qp_type type,
                      size_t len, uint32_t max_wr)
{
        memset(s, 0, sizeof(*s));
        s->dev = dev;
        cr_assert_eq(diwarp_pd_alloc(dev, &s->pd), 0);
        cr_assert_eq(diwarp_cq_create(dev, 256, NULL, NULL, &s->cq), 0);
        struct diwarp_qp_init_attr ia = {.send_cq = s->cq,
                                         .recv_cq = s->cq,
                                         .qp_type = type,
                                         .cap = {.max_send_wr = max_wr,
                                                 .max_recv_wr = max_wr,
                                                 .max_send_sge = 4,
                                                 .max_recv_sge = 4,
                                                 .max_inline_data = 64}};
        cr_assert_eq(diwarp_qp_create(s->pd, &ia, &s->qp), 0);
        s->len = len;
        s->buf = calloc(1, len);
        cr_assert_not_null(s->buf);
        cr_assert_eq(
            diwarp_mr_reg(s->pd, s->buf, len, (uintptr_t)s->buf, DIWARP_ACCESS_LOCAL_WRITE, &s->mr),
            0);
        struct diwarp_mr_info mi;
        diwarp_mr_info(s->mr, &mi);
        s->lkey = mi.lkey;
}

static void side_fini(struct side *s)
{
        cr_expect_eq(diwarp_qp_destroy(s->qp), 0);
        cr_expect_eq(diwarp_mr_dereg(s->mr), 0);
        cr_expect_eq(diwarp_cq_destroy(s->cq), 0);
        cr_expect_eq(diwarp_pd_dealloc(s->pd), 0);
        free(s->buf);
}

static int to_state(struct diwarp_qp *qp, enum diwarp_qp_state st, int extra_mask)
{
        struct diwarp_qp_attr a = {.qp_state = st, .qkey = QKEY, .port_num = 1};
        return diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | extra_mask);
}

static void ud_rts(struct diwarp_qp *qp)
{
        cr_assert_eq(
            to_state(qp, DIWARP_QPS_INIT, DIWARP_QP_QKEY | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT),
            0);
        cr_assert_eq(to_state(qp, DIWARP_QPS_RTR, 0), 0);
        cr_assert_eq(to_state(qp, DIWARP_QPS_RTS, DIWARP_QP_SQ_PSN), 0);
}

/* Polls until n completions arrived or 5 s passed. */
static int poll_n(struct diwarp_cq *cq, int n, struct diwarp_wc *wc)
{
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int got = 0;
        while (got < n) {
                int r = diwarp_cq_poll(cq, n - got, wc + got);
                cr_assert_geq(r, 0);
                got += r;
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (t.tv_sec - t0.tv_sec > 5)
                        break;
        }
        return got;
}

/* Keeps both devices progressing for ms milliseconds. */
static void spin(int ms)
{
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
                diwarp_progress(dev_a, 64);
                diwarp_progress(dev_b, 64);
                clock_gettime(CLOCK_MONOTONIC, &t);
        } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

TestSuite(device, .init = open_devs, .fini = close_devs, .timeout = 30);

Test(device, open_query_port_gid)
{
        struct diwarp_device_attr a;
        uint16_t pa, pb, ia, ib;
        union diwarp_gid g;
        cr_assert_eq(diwarp_device_query(dev_a, &a), 0);
        cr_expect_geq(a.max_msg_size_ud, 65000u);
        cr_expect_eq(a.max_sge, 8);
        cr_assert_eq(diwarp_device_port(dev_a, &pa, &ia), 0);
        cr_assert_eq(diwarp_device_port(dev_b, &pb, &ib), 0);
        cr_expect_neq(pa, pb, "two instances must not share a port");
        cr_expect_eq(pb - pa, ib - ia);
        cr_assert_eq(diwarp_device_gid(dev_a, &g), 0);
        /* Not pinned: the host's addresses, GID 0 the first of them (the
         * default route's), 127.0.0.1 the last. */
        struct diwarp_netif host[DIWARP_MAX_GIDS], t[DIWARP_MAX_GIDS];
        int nh = diwarp_host_netifs(host, DIWARP_MAX_GIDS);
        int n = diwarp_device_gid_table(dev_a, t, DIWARP_MAX_GIDS);
        cr_assert_geq(n, 1);
        cr_expect_eq(n, nh > 0 ? nh : 1);
        uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        memcpy(want + 12, &t[0].addr, 4);
        cr_expect_arr_eq(g.raw, want, 16);
        for (int i = 0; i < nh && i < n; i++)
                cr_expect_eq(t[i].addr, host[i].addr, "GID %d", i);
        cr_expect_eq(t[n - 1].addr, htonl(INADDR_LOOPBACK), "127.0.0.1 is last");
        for (int i = 0; i + 1 < n; i++)
                cr_expect(!t[i].loopback || t[i + 1].loopback, "loopback entries come last");
        cr_expect_eq(diwarp_device_gid_table(dev_a, NULL, 0), n);
        cr_expect_eq(diwarp_device_gid_table(dev_a, NULL, -1), -EINVAL);
}

Test(device, pinned_address_is_the_only_gid)
{
        struct diwarp_open_opts o = {.addr = "127.0.0.1"};
        struct diwarp_device *d;
        struct diwarp_netif t[DIWARP_MAX_GIDS];
        cr_assert_eq(diwarp_device_open(&o, &d), 0);
        cr_expect_eq(diwarp_device_gid_table(d, t, DIWARP_MAX_GIDS), 1);
        cr_expect_eq(t[0].addr, htonl(INADDR_LOOPBACK));
        cr_expect_str_eq(t[0].ifname, "lo");
        cr_assert_eq(diwarp_device_close(d), 0);
        /* An address of no interface here (TEST-NET-3): the open fails. */
        o.addr = "203.0.113.254";
        int nh = diwarp_host_netifs(t, DIWARP_MAX_GIDS);
        bool ours = false;
        for (int i = 0; i < nh; i++)
                ours |= t[i].addr == htonl(0xcb0071fe);
        if (!ours)
                cr_expect_eq(diwarp_device_open(&o, &d), -EADDRNOTAVAIL);
}

/* A program that reached its peer over 127.0.0.1 gets the loopback GID (its
 * index and its GID), as rdma_cm's route resolution would choose it; an
 * address outside the table is -ENOENT, a socket without one GID 0. */
Test(device, gid_of_the_side_channel_address)
{
        struct diwarp_netif t[DIWARP_MAX_GIDS];
        int n = diwarp_device_gid_table(dev_a, t, DIWARP_MAX_GIDS);
        cr_assert_geq(n, 1);
        union diwarp_gid g, g0;
        cr_assert_eq(diwarp_device_gid(dev_a, &g0), 0);
        cr_expect_eq(diwarp_device_gid_find(dev_a, htonl(INADDR_LOOPBACK), &g), n - 1);
        uint8_t lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
        cr_expect_arr_eq(g.raw, lo, 16);
        cr_expect_eq(diwarp_device_gid_find(dev_a, htonl(0xcb0071fe), &g), -ENOENT);
        cr_expect_eq(diwarp_device_gid_find(dev_a, htonl(INADDR_LOOPBACK), NULL), -EINVAL);

        /* a TCP connection over 127.0.0.1, as the examples' side channel */
        int l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(sa);
        cr_assert(l >= 0 && c >= 0);
        cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
        cr_assert_eq(listen(l, 1), 0);
        cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &len), 0);
        cr_assert_eq(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
        memset(&g, 0, sizeof(g));
        cr_expect_eq(diwarp_device_gid_of_socket(dev_a, c, &g), n - 1);
        cr_expect_arr_eq(g.raw, lo, 16);
        close(c);
        close(l);
        /* not a socket: GID 0 */
        cr_expect_eq(diwarp_device_gid_of_socket(dev_a, -1, &g), 0);
        cr_expect_arr_eq(g.raw, g0.raw, 16);
}

Test(device, qpn_carries_instance_never_0_or_1)
{
        struct side s;
        uint16_t inst;
        side_init(&s, dev_a, DIWARP_QPT_UD, 64, 4);
        diwarp_device_port(dev_a, NULL, &inst);
        uint32_t qpn = diwarp_qp_num(s.qp);
        cr_expect_eq(qpn >> 12, inst);
        cr_expect_gt(qpn & 0xfff, 1u);
        cr_expect_eq(diwarp_qp_state(s.qp), DIWARP_QPS_RESET);
        side_fini(&s);
}

Test(device, close_busy_and_pd_busy)
{
        struct diwarp_pd *pd;
        struct diwarp_mr *mr;
        static uint8_t b[64];
        cr_assert_eq(diwarp_pd_alloc(dev_a, &pd), 0);
        cr_assert_eq(diwarp_mr_reg(pd, b, sizeof(b), (uintptr_t)b, 0, &mr), 0);
        cr_expect_eq(diwarp_pd_dealloc(pd), -EBUSY);
        cr_expect_eq(diwarp_device_close(dev_a), -EBUSY);
        cr_expect_eq(diwarp_mr_dereg(mr), 0);
        cr_expect_eq(diwarp_pd_dealloc(pd), 0);
}

Test(device, state_machine)
{
        struct side s;
        side_init(&s, dev_a, DIWARP_QPT_UD, 64, 4);
        struct diwarp_qp *qp = s.qp;
        cr_expect_eq(to_state(qp, DIWARP_QPS_RTR, 0), -EINVAL, "RESET->RTR is invalid");
        cr_expect_eq(to_state(qp, DIWARP_QPS_RTS, 0), -EINVAL);
        cr_expect_eq(to_state(qp, DIWARP_QPS_INIT, 0), -EINVAL, "UD INIT needs QKEY");
        cr_expect_eq(diwarp_qp_state(qp), DIWARP_QPS_RESET);
        cr_expect_eq(to_state(qp, DIWARP_QPS_INIT, DIWARP_QP_QKEY), 0);
        cr_expect_eq(to_state(qp, DIWARP_QPS_INIT, 0), 0, "INIT->INIT is allowed");
        cr_expect_eq(to_state(qp, DIWARP_QPS_RTS, 0), -EINVAL, "INIT->RTS is invalid");
        cr_expect_eq(to_state(qp, DIWARP_QPS_RTR, 0), 0);
        cr_expect_eq(to_state(qp, DIWARP_QPS_RTS, 0), -EINVAL, "UD RTS needs SQ_PSN");
        cr_expect_eq(to_state(qp, DIWARP_QPS_RTS, DIWARP_QP_SQ_PSN), 0);
        cr_expect_eq(to_state(qp, DIWARP_QPS_INIT, 0), -EINVAL, "RTS->INIT is invalid");
        struct diwarp_qp_attr cur = {.cur_qp_state = DIWARP_QPS_INIT, .qp_state = DIWARP_QPS_ERR};
        cr_expect_eq(diwarp_qp_modify(qp, &cur, DIWARP_QP_STATE | DIWARP_QP_CUR_STATE), -EINVAL,
                     "wrong CUR_STATE");
        cr_expect_eq(to_state(qp, DIWARP_QPS_ERR, 0), 0);
        cr_expect_eq(to_state(qp, DIWARP_QPS_RTS, 0), -EINVAL, "ERR->RTS is invalid");
        cr_expect_eq(to_state(qp, DIWARP_QPS_RESET, 0), 0);
        struct diwarp_qp_attr qa;
        struct diwarp_qp_init_attr qi;
        cr_assert_eq(diwarp_qp_query(qp, &qa, &qi), 0);
        cr_expect_eq(qa.qp_state, DIWARP_QPS_RESET);
        cr_expect_eq(qi.qp_type, DIWARP_QPT_UD);
        cr_expect_eq(qi.cap.max_send_wr, 4u);
        /* RC: any state to ERR and back to RESET; AV without DEST_QPN refused. */
        struct side r;
        side_init(&r, dev_a, DIWARP_QPT_RC, 64, 4);
        cr_expect_eq(to_state(r.qp, DIWARP_QPS_INIT, DIWARP_QP_ACCESS_FLAGS), 0);
        struct diwarp_qp_attr av = {.qp_state = DIWARP_QPS_RTR};
        diwarp_device_gid(dev_a, &av.dgid);
        cr_expect_eq(diwarp_qp_modify(r.qp, &av, DIWARP_QP_STATE | DIWARP_QP_AV), -EINVAL);
        cr_expect_eq(to_state(r.qp, DIWARP_QPS_ERR, 0), 0);
        cr_expect_eq(to_state(r.qp, DIWARP_QPS_RESET, 0), 0);
        side_fini(&r);
        side_fini(&s);
}

Test(device, post_checks)
{
        struct side s;
        struct diwarp_ah *ah;
        union diwarp_gid g;
        side_init(&s, dev_a, DIWARP_QPT_UD, 256, 2);
        diwarp_device_gid(dev_a, &g);
        cr_assert_eq(diwarp_ah_create(s.pd, &g, &ah), 0);
        struct diwarp_sge sge = {(uintptr_t)s.buf, 8, s.lkey};
        struct diwarp_send_wr wr = {
            .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = DIWARP_WR_SEND};
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = diwarp_qp_num(s.qp);
        wr.wr.ud.remote_qkey = QKEY;
        struct diwarp_send_wr *bad = NULL;
        struct diwarp_recv_wr rwr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *rbad = NULL;

        cr_expect_eq(diwarp_post_recv(s.qp, &rwr, &rbad), -EINVAL, "recv in RESET");
        cr_expect_eq(rbad, &rwr);
        cr_expect_eq(to_state(s.qp, DIWARP_QPS_INIT, DIWARP_QP_QKEY), 0);
        cr_expect_eq(diwarp_post_send(s.qp, &wr, &bad), -EINVAL, "send in INIT");
        cr_expect_eq(bad, &wr);
        cr_expect_eq(to_state(s.qp, DIWARP_QPS_RTR, 0), 0);
        cr_expect_eq(to_state(s.qp, DIWARP_QPS_RTS, DIWARP_QP_SQ_PSN), 0);
        wr.num_sge = 5;
        cr_expect_eq(diwarp_post_send(s.qp, &wr, &bad), -EINVAL, "num_sge > max_send_sge");
        wr.num_sge = -1;
        cr_expect_eq(diwarp_post_send(s.qp, &wr, &bad), -EINVAL, "negative num_sge");
        wr.num_sge = 1;
        wr.opcode = DIWARP_WR_RDMA_WRITE;
        cr_expect_eq(diwarp_post_send(s.qp, &wr, &bad), -EINVAL, "RDMA Write on UD");
        wr.opcode = DIWARP_WR_SEND;
        wr.wr.ud.ah = NULL;
        cr_expect_eq(diwarp_post_send(s.qp, &wr, &bad), -EINVAL, "UD send without AH");
        wr.wr.ud.ah = ah;
        rwr.num_sge = 9;
        cr_expect_eq(diwarp_post_recv(s.qp, &rwr, &rbad), -EINVAL, "recv num_sge");
        rwr.num_sge = 1;
        cr_expect_eq(diwarp_post_recv(s.qp, &rwr, &rbad), 0);
        cr_expect_eq(diwarp_post_recv(s.qp, &rwr, &rbad), 0);
        cr_expect_eq(diwarp_post_recv(s.qp, &rwr, &rbad), -ENOMEM, "RQ full");
        /* Moving to ERR flushes both posted receives. */
        cr_expect_eq(to_state(s.qp, DIWARP_QPS_ERR, 0), 0);
        struct diwarp_wc wc[4];
        cr_assert_eq(poll_n(s.cq, 2, wc), 2);
        for (int i = 0; i < 2; i++) {
                cr_expect_eq(wc[i].status, DIWARP_WC_WR_FLUSH_ERR);
                cr_expect_eq(wc[i].opcode, DIWARP_WC_RECV);
                cr_expect_eq(wc[i].wr_id, 2u);
        }
        /* Posting in ERR is accepted and flushed at once. */
        cr_expect_eq(diwarp_post_send(s.qp, &wr, &bad), 0);
        cr_assert_eq(poll_n(s.cq, 1, wc), 1);
        cr_expect_eq(wc[0].status, DIWARP_WC_WR_FLUSH_ERR);
        cr_expect_eq(wc[0].wr_id, 1u);
        cr_expect_eq(diwarp_ah_destroy(ah), 0);
        side_fini(&s);
}

/* diwarp_post_send_all posts a list whole or not at all: a WR that does not
 * fit in the send queue, or one that is invalid, leaves the queue untouched
 * (no completion for the WRs before it), where diwarp_post_send would have
 * posted those. */
Test(device, post_send_all_or_none)
{
        struct side s;
        struct diwarp_ah *ah;
        union diwarp_gid g;
        side_init(&s, dev_a, DIWARP_QPT_UD, 256, 2);
        diwarp_device_gid(dev_a, &g);
        cr_assert_eq(diwarp_ah_create(s.pd, &g, &ah), 0);
        struct diwarp_sge sge = {(uintptr_t)s.buf, 8, s.lkey};
        struct diwarp_send_wr w[3];
        for (int i = 0; i < 3; i++) {
                w[i] = (struct diwarp_send_wr){.wr_id = 10 + i,
                                               .next = i < 2 ? &w[i + 1] : NULL,
                                               .sg_list = &sge,
                                               .num_sge = 1,
                                               .opcode = DIWARP_WR_SEND,
                                               .send_flags = DIWARP_SEND_SIGNALED};
                w[i].wr.ud.ah = ah;
                w[i].wr.ud.remote_qpn = diwarp_qp_num(s.qp);
                w[i].wr.ud.remote_qkey = QKEY;
        }
        struct diwarp_send_wr *bad = NULL;
        struct diwarp_wc wc[4];

        cr_expect_eq(diwarp_post_send_all(s.qp, w, &bad), -EINVAL, "send in RESET");
        cr_expect_eq(bad, &w[0]);
        ud_rts(s.qp);
        /* Three WRs, room for two. */
        cr_expect_eq(diwarp_post_send_all(s.qp, w, &bad), -ENOMEM);
        cr_expect_eq(bad, &w[2], "the first WR that does not fit");
        /* The second is invalid. */
        w[1].num_sge = 5;
        cr_expect_eq(diwarp_post_send_all(s.qp, w, &bad), -EINVAL);
        cr_expect_eq(bad, &w[1]);
        w[1].num_sge = 1;
        spin(50);
        cr_expect_eq(diwarp_cq_poll(s.cq, 4, wc), 0, "a refused batch posted nothing");
        /* Two fit: both go, in order. */
        w[1].next = NULL;
        cr_expect_eq(diwarp_post_send_all(s.qp, w, &bad), 0);
        cr_assert_eq(poll_n(s.cq, 2, wc), 2);
        for (int i = 0; i < 2; i++) {
                cr_expect_eq(wc[i].status, DIWARP_WC_SUCCESS);
                cr_expect_eq(wc[i].wr_id, 10u + i);
        }
        /* Beside it, diwarp_post_send posts what fits and stops there. */
        w[1].next = &w[2];
        cr_expect_eq(diwarp_post_send(s.qp, w, &bad), -ENOMEM);
        cr_expect_eq(bad, &w[2]);
        cr_assert_eq(poll_n(s.cq, 2, wc), 2);
        cr_expect_eq(wc[0].wr_id, 10u);
        cr_expect_eq(wc[1].wr_id, 11u);
        cr_expect_eq(diwarp_ah_destroy(ah), 0);
        side_fini(&s);
}

/* One UD message of len bytes from a to b; checks every byte and the GRH. */
static void ud_one(struct side *a, struct side *b, struct diwarp_ah *ah, size_t len, bool imm)
{
        struct diwarp_wc wc;
        for (size_t i = 0; i < len; i++)
                a->buf[i] = (uint8_t)(i * 7 + len);
        memset(b->buf, 0xee, b->len);
        struct diwarp_sge rs = {(uintptr_t)b->buf, (uint32_t)(len + 40), b->lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 100 + len, .sg_list = &rs, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        cr_assert_eq(diwarp_post_recv(b->qp, &rwr, &rbad), 0);
        struct diwarp_sge ss = {(uintptr_t)a->buf, (uint32_t)len, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = len,
                                    .sg_list = &ss,
                                    .num_sge = len ? 1 : 0,
                                    .opcode = imm ? DIWARP_WR_SEND_WITH_IMM : DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .imm_data = 0xdeadbeef};
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = diwarp_qp_num(b->qp);
        wr.wr.ud.remote_qkey = QKEY;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(a->qp, &wr, &bad), 0);
        cr_assert_eq(poll_n(a->cq, 1, &wc), 1);
        cr_expect_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_expect_eq(wc.opcode, DIWARP_WC_SEND);
        cr_expect_eq(wc.wr_id, len);
        cr_assert_eq(poll_n(b->cq, 1, &wc), 1, "no receive completion for %zu bytes", len);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS, "status %d for %zu bytes", wc.status, len);
        cr_expect_eq(wc.opcode, DIWARP_WC_RECV);
        cr_expect_eq(wc.byte_len, len + 40);
        cr_expect_eq(wc.src_qp, diwarp_qp_num(a->qp));
        cr_expect_eq(wc.qp_num, diwarp_qp_num(b->qp));
        cr_expect(wc.wc_flags & DIWARP_WC_GRH);
        if (imm) {
                cr_expect(wc.wc_flags & DIWARP_WC_WITH_IMM);
                cr_expect_eq(wc.imm_data, 0xdeadbeef);
        } else {
                cr_expect_not(wc.wc_flags & DIWARP_WC_WITH_IMM);
        }
        union diwarp_gid g;
        diwarp_device_gid(a->dev, &g);
        cr_expect_arr_eq(b->buf + 8, g.raw, 16, "GRH source GID");
        for (size_t i = 0; i < len; i++)
                if (b->buf[40 + i] != (uint8_t)(i * 7 + len))
                        cr_assert_fail("byte %zu of %zu differs", i, len);
        cr_expect_eq(b->buf[40 + len], 0xee, "wrote past the message");
}

#define BIG (65536 + 128)

Test(device, ud_sizes_and_imm)
{
        struct side a, b;
        struct diwarp_ah *ah;
        union diwarp_gid g;
        struct diwarp_device_attr da;
        side_init(&a, dev_a, DIWARP_QPT_UD, BIG, 8);
        side_init(&b, dev_b, DIWARP_QPT_UD, BIG, 8);
        ud_rts(a.qp);
        ud_rts(b.qp);
        diwarp_device_gid(dev_b, &g);
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah), 0);
        diwarp_device_query(dev_a, &da);
        size_t sizes[] = {0, 1, 4095, 4096, da.max_msg_size_ud};
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
                ud_one(&a, &b, ah, sizes[i], false);
                ud_one(&a, &b, ah, sizes[i], true);
        }
        diwarp_ah_destroy(ah);
        side_fini(&a);
        side_fini(&b);
}

Test(device, ud_drops_qkey_norecv_and_short_buffer)
{
        struct side a, b;
        struct diwarp_ah *ah;
        union diwarp_gid g;
        struct diwarp_wc wc;
        struct diwarp_counters c0, c1;
        side_init(&a, dev_a, DIWARP_QPT_UD, 4096, 8);
        side_init(&b, dev_b, DIWARP_QPT_UD, 4096, 8);
        ud_rts(a.qp);
        ud_rts(b.qp);
        diwarp_device_gid(dev_b, &g);
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah), 0);
        struct diwarp_sge ss = {(uintptr_t)a.buf, 100, a.lkey};
        struct diwarp_send_wr wr = {
            .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = DIWARP_WR_SEND};
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = diwarp_qp_num(b.qp);
        wr.wr.ud.remote_qkey = QKEY + 1;
        struct diwarp_send_wr *bad;
        struct diwarp_sge rs = {(uintptr_t)b.buf, 4096, b.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 7, .sg_list = &rs, .num_sge = 1};
        struct diwarp_recv_wr *rbad;

        /* wrong qkey: dropped and counted, the receive stays posted */
        diwarp_device_counters(dev_b, &c0);
        cr_assert_eq(diwarp_post_recv(b.qp, &rwr, &rbad), 0);
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        spin(100);
        cr_expect_eq(diwarp_cq_poll(b.cq, 1, &wc), 0, "a wrong-qkey message was delivered");
        diwarp_device_counters(dev_b, &c1);
        cr_expect_eq(c1.rx_dropped_qkey, c0.rx_dropped_qkey + 1);

        /* right qkey: delivered into the receive that is still there */
        wr.wr.ud.remote_qkey = QKEY;
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        cr_assert_eq(poll_n(b.cq, 1, &wc), 1);
        cr_expect_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_expect_eq(wc.wr_id, 7u);

        /* no receive posted: dropped and counted */
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        spin(100);
        diwarp_device_counters(dev_b, &c1);
        cr_expect_eq(c1.rx_dropped_no_recv, c0.rx_dropped_no_recv + 1);

        /* unknown QPN: dropped and counted */
        wr.wr.ud.remote_qpn = diwarp_qp_num(b.qp) + 1;
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        spin(100);
        diwarp_device_counters(dev_b, &c1);
        cr_expect_eq(c1.rx_dropped_no_qp, c0.rx_dropped_no_qp + 1);

        /* receive buffer too small for GRH + payload: LOC_LEN_ERR */
        wr.wr.ud.remote_qpn = diwarp_qp_num(b.qp);
        rs.length = 100; /* needs 140 */
        cr_assert_eq(diwarp_post_recv(b.qp, &rwr, &rbad), 0);
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        cr_assert_eq(poll_n(b.cq, 1, &wc), 1);
        cr_expect_eq(wc.status, DIWARP_WC_LOC_LEN_ERR);

        /* a receive with a bad lkey: LOC_PROT_ERR, QP to ERR */
        rs.length = 4096;
        rs.lkey = b.lkey ^ 0x80;
        cr_assert_eq(diwarp_post_recv(b.qp, &rwr, &rbad), 0);
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        cr_assert_eq(poll_n(b.cq, 1, &wc), 1);
        cr_expect_eq(wc.status, DIWARP_WC_LOC_PROT_ERR);
        cr_expect_eq(diwarp_qp_state(b.qp), DIWARP_QPS_ERR);

        /* a send with a bad lkey: LOC_PROT_ERR on the sender */
        ss.lkey = a.lkey ^ 0x80;
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        cr_assert_eq(poll_n(a.cq, 1, &wc), 1);
        cr_expect_eq(wc.status, DIWARP_WC_LOC_PROT_ERR);

        diwarp_ah_destroy(ah);
        side_fini(&a);
        side_fini(&b);
}

Test(device, ud_srq_and_inline_and_sges)
{
        struct side a, b;
        struct diwarp_ah *ah;
        union diwarp_gid g;
        struct diwarp_wc wc;
        side_init(&a, dev_a, DIWARP_QPT_UD, 4096, 8);
        memset(&b, 0, sizeof(b));
        b.dev = dev_b;
        cr_assert_eq(diwarp_pd_alloc(dev_b, &b.pd), 0);
        cr_assert_eq(diwarp_cq_create(dev_b, 64, NULL, NULL, &b.cq), 0);
        struct diwarp_srq *srq;
        struct diwarp_srq_attr sa = {.max_wr = 4, .max_sge = 2};
        cr_assert_eq(diwarp_srq_create(b.pd, &sa, NULL, &srq), 0);
        struct diwarp_qp_init_attr ia = {.send_cq = b.cq,
                                         .recv_cq = b.cq,
                                         .srq = srq,
                                         .qp_type = DIWARP_QPT_UD,
                                         .cap = {.max_send_wr = 4, .max_send_sge = 1}};
        cr_assert_eq(diwarp_qp_create(b.pd, &ia, &b.qp), 0);
        b.len = 4096;
        b.buf = calloc(1, b.len);
        cr_assert_eq(
            diwarp_mr_reg(b.pd, b.buf, b.len, (uintptr_t)b.buf, DIWARP_ACCESS_LOCAL_WRITE, &b.mr),
            0);
        struct diwarp_mr_info mi;
        diwarp_mr_info(b.mr, &mi);
        b.lkey = mi.lkey;
        ud_rts(a.qp);
        ud_rts(b.qp);
        cr_expect_eq(diwarp_srq_destroy(srq), -EBUSY);
        diwarp_device_gid(dev_b, &g);
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah), 0);

        /* receive split over two SGEs: GRH in the first, payload across both */
        struct diwarp_sge rs[2] = {{(uintptr_t)b.buf, 50, b.lkey},
                                   {(uintptr_t)b.buf + 1000, 100, b.lkey}};
        struct diwarp_recv_wr rwr = {.wr_id = 9, .sg_list = rs, .num_sge = 2};
        struct diwarp_recv_wr *rbad;
        struct diwarp_recv_wr *none = NULL;
        cr_expect_eq(diwarp_post_recv(b.qp, &rwr, &none), -EINVAL, "QP with SRQ");
        cr_assert_eq(diwarp_post_srq_recv(srq, &rwr, &rbad), 0);
        /* inline send from two gathered pieces */
        memcpy(a.buf, "0123456789", 10);
        memcpy(a.buf + 100, "abcdefghij", 10);
        struct diwarp_sge ss[2] = {{(uintptr_t)a.buf, 10, 0}, {(uintptr_t)a.buf + 100, 10, 0}};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = ss,
                                    .num_sge = 2,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_INLINE | DIWARP_SEND_SIGNALED};
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = diwarp_qp_num(b.qp);
        wr.wr.ud.remote_qkey = QKEY;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        memset(a.buf, 0, 200); /* inline: the buffer is reusable at once */
        cr_assert_eq(poll_n(b.cq, 1, &wc), 1);
        cr_expect_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_expect_eq(wc.byte_len, 60u);
        cr_expect_eq(wc.wr_id, 9u);
        cr_expect_arr_eq(b.buf + 40, "0123456789", 10);
        cr_expect_arr_eq(b.buf + 1000, "abcdefghij", 10);
        cr_assert_eq(poll_n(a.cq, 1, &wc), 1);

        diwarp_ah_destroy(ah);
        cr_expect_eq(diwarp_qp_destroy(b.qp), 0);
        cr_expect_eq(diwarp_srq_destroy(srq), 0);
        b.qp = NULL;
        diwarp_mr_dereg(b.mr);
        diwarp_cq_destroy(b.cq);
        diwarp_pd_dealloc(b.pd);
        free(b.buf);
        side_fini(&a);
}

Test(device, channel_event_with_progress_thread)
{
        struct side a, b;
        struct diwarp_ah *ah;
        union diwarp_gid g;
        struct diwarp_wc wc;
        struct diwarp_comp_channel *ch;
        side_init(&a, dev_a, DIWARP_QPT_UD, 4096, 8);
        memset(&b, 0, sizeof(b));
        cr_assert_eq(diwarp_comp_channel_create(dev_b, &ch), 0);
        side_init(&b, dev_b, DIWARP_QPT_UD, 4096, 8);
        /* replace b's CQ with one bound to the channel */
        cr_assert_eq(diwarp_qp_destroy(b.qp), 0);
        cr_assert_eq(diwarp_cq_destroy(b.cq), 0);
        int ctx_val = 42;
        cr_assert_eq(diwarp_cq_create(dev_b, 16, &ctx_val, ch, &b.cq), 0);
        struct diwarp_qp_init_attr ia = {
            .send_cq = b.cq,
            .recv_cq = b.cq,
            .qp_type = DIWARP_QPT_UD,
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
        cr_assert_eq(diwarp_qp_create(b.pd, &ia, &b.qp), 0);
        ud_rts(a.qp);
        ud_rts(b.qp);
        diwarp_device_gid(dev_b, &g);
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah), 0);
        struct diwarp_sge rs = {(uintptr_t)b.buf, 4096, b.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 5, .sg_list = &rs, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        cr_assert_eq(diwarp_post_recv(b.qp, &rwr, &rbad), 0);
        cr_assert_eq(diwarp_cq_req_notify(b.cq, false), 0);
        struct diwarp_sge ss = {(uintptr_t)a.buf, 10, a.lkey};
        struct diwarp_send_wr wr = {
            .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = DIWARP_WR_SEND};
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = diwarp_qp_num(b.qp);
        wr.wr.ud.remote_qkey = QKEY;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);
        /* Nobody polls dev_b: only its progress thread can deliver this. */
        struct pollfd pfd = {.fd = diwarp_comp_channel_fd(ch), .events = POLLIN};
        cr_assert_eq(poll(&pfd, 1, 5000), 1, "no channel event within 5 s");
        struct diwarp_cq *ecq;
        void *ectx;
        cr_assert_eq(diwarp_comp_channel_get_event(ch, &ecq, &ectx), 0);
        cr_expect_eq(ecq, b.cq);
        cr_expect_eq(ectx, &ctx_val);
        diwarp_cq_ack_events(ecq, 1);
        cr_assert_eq(diwarp_cq_poll(b.cq, 1, &wc), 1);
        cr_expect_eq(wc.wr_id, 5u);
        diwarp_ah_destroy(ah);
        side_fini(&a);
        side_fini(&b);
        cr_expect_eq(diwarp_comp_channel_destroy(ch), 0);
}
