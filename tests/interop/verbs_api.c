/* A plain ibverbs program (linked against libibverbs only) run under
 * `diwarp run`: checks the provider's verbs one by one, including the errno
 * each misuse must get, and a UD loopback message through a completion
 * channel. Exit 0 = all checks passed; each failure prints its line.
 */
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { MSG = 256, GRH = 40, QKEY = 0x11111111 };

int main(void)
{
        int n = 0;
        struct ibv_device **list = ibv_get_device_list(&n);
        REQUIRE(list && n >= 1);
        REQUIRE(!strcmp(ibv_get_device_name(list[0]), "diwarp0"));
        CHECK(list[0]->transport_type == IBV_TRANSPORT_IWARP);
        CHECK(list[0]->node_type == IBV_NODE_RNIC);
        CHECK(ibv_get_device_guid(list[0]) != 0);
        struct ibv_context *ctx = ibv_open_device(list[0]);
        REQUIRE(ctx);

        /* Port: the extended op through the inline wrapper ... */
        struct ibv_port_attr pa;
        CHECK(ibv_query_port(ctx, 1, &pa) == 0);
        CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET);
        CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL);
        /* ... and the exported legacy entry, which must not write past the
         * old (compat) struct. */
        unsigned char raw[sizeof(struct ibv_port_attr)];
        memset(raw, 0xab, sizeof(raw));
        CHECK((ibv_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)raw) == 0);
        CHECK(raw[offsetof(struct ibv_port_attr, port_cap_flags2)] == 0xab);
        CHECK(((struct ibv_port_attr *)raw)->state == IBV_PORT_ACTIVE);

        struct ibv_device_attr da;
        CHECK(ibv_query_device(ctx, &da) == 0);
        CHECK(da.phys_port_cnt == 1 && da.max_qp > 0 && da.vendor_id == 0x444957);
        struct ibv_device_attr_ex dax;
        CHECK(ibv_query_device_ex(ctx, NULL, &dax) == 0);
        CHECK(dax.orig_attr.max_qp_wr == da.max_qp_wr);

        /* The GID table: one IPv4-mapped entry per address of the device
         * (the host's, 127.0.0.1 last, unless DIWARP_ADDR pins one). */
        CHECK(ibv_query_port(ctx, 1, &pa) == 0);
        int ngid = pa.gid_tbl_len;
        REQUIRE(ngid >= 1 && ngid <= 16);
        union ibv_gid gid, last;
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        CHECK(ibv_query_gid(ctx, 1, ngid - 1, &last) == 0 && !memcmp(last.raw, mapped, 12));
        if (!getenv("DIWARP_ADDR"))
                CHECK(last.raw[12] == 127 && last.raw[15] == 1); /* 127.0.0.1 last */
        CHECK(ibv_query_gid(ctx, 1, ngid, &last) == -1 && errno == EINVAL);
        CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
        CHECK(!memcmp(gid.raw, mapped, 12));
        struct ibv_gid_entry ge;
        CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0 && !memcmp(ge.gid.raw, mapped, 12));
        __be16 pkey;
        CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == htons(0xffff));
        CHECK(ibv_get_pkey_index(ctx, 1, htons(0xffff)) == 0);
        CHECK(ibv_get_pkey_index(ctx, 1, htons(0x7fff)) == -1);
        /* The whole GID table (libibverbs' own code would read diwarp's
         * context as a kernel device's). */
        struct ibv_gid_entry table[16];
        CHECK(ibv_query_gid_table(ctx, table, 16, 0) == ngid);
        CHECK(!memcmp(table[0].gid.raw, gid.raw, 16) && table[0].port_num == 1 &&
              table[0].gid_index == 0 && table[0].gid_type == IBV_GID_TYPE_ROCE_V2);
        CHECK(table[ngid - 1].gid_index == (uint32_t)ngid - 1);
        for (int i = 0; i < ngid; i++) {
                union ibv_gid g;
                CHECK(ibv_query_gid(ctx, 1, i, &g) == 0 && !memcmp(table[i].gid.raw, g.raw, 16));
        }
        CHECK(ibv_query_gid_table(ctx, table, 0, 0) == -EINVAL);
        if (ngid > 1) /* the table does not fit */
                CHECK(ibv_query_gid_table(ctx, table, (size_t)ngid - 1, 0) == -EINVAL);
        CHECK(ibv_import_pd(ctx, 1) == NULL && errno == EOPNOTSUPP);

        /* Async fd: a real descriptor; non-blocking and empty -> EAGAIN. */
        int fl = fcntl(ctx->async_fd, F_GETFL);
        CHECK(fl >= 0);
        CHECK(fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
        struct ibv_async_event ev;
        CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN);

        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        REQUIRE(pd && pd->context == ctx);
        char *buf = calloc(1, 2 * (MSG + GRH));
        REQUIRE(buf);
        struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * (MSG + GRH), IBV_ACCESS_LOCAL_WRITE);
        REQUIRE(mr && mr->lkey && mr->addr == buf);
        errno = 0;
        CHECK(ibv_dealloc_pd(pd) == EBUSY); /* the MR still uses it */
        CHECK(ibv_reg_mr(pd, buf, 64, 1 << 30) == NULL && errno == EINVAL);
        struct ibv_mr *iova_mr = ibv_reg_mr_iova(pd, buf, 64, 0x1000, IBV_ACCESS_LOCAL_WRITE);
        CHECK(iova_mr && ibv_dereg_mr(iova_mr) == 0);

        /* Re-registration: in place, the keys stay. The MR moves to another
         * PD and back, gains remote write, and moves to a second buffer that
         * the UD loopback below then uses. */
        uint32_t lkey = mr->lkey, rkey = mr->rkey;
        struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
        REQUIRE(pd2);
        CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0 && mr->pd == pd2);
        CHECK(ibv_dealloc_pd(pd2) == EBUSY);
        CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0 && mr->pd == pd);
        CHECK(ibv_dealloc_pd(pd2) == 0);
        CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT);
        CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
                           IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_INPUT); /* no local write */
        CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0);
        char *buf2 = calloc(1, 2 * (MSG + GRH));
        REQUIRE(buf2);
        CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, 2 * (MSG + GRH), 0) ==
              0);
        CHECK(mr->addr == buf2 && mr->length == 2 * (MSG + GRH));
        CHECK(mr->lkey == lkey && mr->rkey == rkey);

        struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
        REQUIRE(ch && ch->fd >= 0 && fcntl(ch->fd, F_GETFD) >= 0);
        int cq_ctx_tag;
        struct ibv_cq *cq = ibv_create_cq(ctx, 16, &cq_ctx_tag, ch, 0);
        REQUIRE(cq && cq->cqe >= 16 && cq->channel == ch);
        CHECK(ibv_create_cq(ctx, 16, NULL, ch, 5) == NULL && errno == EINVAL);
        CHECK(ibv_resize_cq(cq, 64) == 0 && cq->cqe == 64);
        CHECK(ibv_resize_cq(cq, 0) == EINVAL);

        /* No GRH on an Ethernet port: refused, as on RoCE, whatever the LID
         * (only librdmacm's rsocket service may name this device by LID 0). */
        struct ibv_ah_attr aa = {.port_num = 1, .dlid = 5};
        CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL);
        aa.dlid = 0;
        CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL);

        struct ibv_qp_init_attr qia = {
            .send_cq = cq,
            .recv_cq = cq,
            .cap = {.max_send_wr = 4,
                    .max_recv_wr = 4,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = 64},
            .qp_type = IBV_QPT_RAW_PACKET,
        };
        CHECK(ibv_create_qp(pd, &qia) == NULL && errno == EOPNOTSUPP);
        qia.qp_type = IBV_QPT_UD;
        struct ibv_qp *qp = ibv_create_qp(pd, &qia);
        REQUIRE(qp);
        CHECK(qp->qp_num > 1 && qp->state == IBV_QPS_RESET && qp->context == ctx);
        /* An RNIC's new QP is Idle, reported as INIT; libibverbs' field says RESET. */
        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qi;
        CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_INIT);
        CHECK(ibv_query_qp_data_in_order(qp, IBV_WR_SEND, 0) == 0); /* datagrams: any order */
        struct ibv_ece ece;
        CHECK(ibv_query_ece(qp, &ece) == EOPNOTSUPP);
        CHECK(qia.cap.max_inline_data >= 64 && qia.cap.max_send_wr >= 4);
        CHECK(ibv_qp_to_qp_ex(qp) == NULL);
        CHECK(ibv_destroy_cq(cq) == EBUSY); /* the QP still uses it */

        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = QKEY};
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) ==
              0);
        a.qp_state = IBV_QPS_RTS; /* INIT -> RTS skips RTR: invalid */
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == EINVAL);
        a.qp_state = IBV_QPS_RTR;
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = 0;
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
        CHECK(qp->state == IBV_QPS_RTS);
        CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RTS);
        CHECK(qa.qkey == QKEY && qi.qp_type == IBV_QPT_UD && qi.send_cq == cq);

        /* RTS -> SQD (drained at once: nothing under way) -> RTS; SQE cannot be asked for. */
        a.qp_state = IBV_QPS_SQE;
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
        a.qp_state = IBV_QPS_SQD;
        a.en_sqd_async_notify = 1;
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
        CHECK(qp->state == IBV_QPS_SQD);
        CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_SQD);
        CHECK(qa.sq_draining == 0);
        struct pollfd apfd = {.fd = ctx->async_fd, .events = POLLIN};
        CHECK(poll(&apfd, 1, 2000) == 1);
        struct ibv_async_event aev;
        CHECK(ibv_get_async_event(ctx, &aev) == 0 && aev.event_type == IBV_EVENT_SQ_DRAINED &&
              aev.element.qp == qp);
        ibv_ack_async_event(&aev);
        a.qp_state = IBV_QPS_INIT;
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
        a.qp_state = IBV_QPS_RTS;
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
        CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RTS);

        /* UD loopback to ourselves through the completion channel. */
        aa.is_global = 1;
        aa.grh.dgid = gid;
        CHECK(ibv_query_gid(ctx, 1, 0, &aa.grh.dgid) == 0);
        struct ibv_ah *ah = ibv_create_ah(pd, &aa);
        REQUIRE(ah);
        char *rbuf = buf2, *sbuf = buf2 + MSG + GRH; /* the re-registered translation */
        for (int i = 0; i < MSG; i++)
                sbuf[i] = (char)(i * 7 + 1);
        struct ibv_sge rsge = {(uintptr_t)rbuf, MSG + GRH, mr->lkey};
        struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rsge, .num_sge = 1}, *rbad = NULL;
        CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0);
        CHECK(ibv_req_notify_cq(cq, 0) == 0);
        struct ibv_sge ssge = {(uintptr_t)sbuf, MSG, mr->lkey};
        struct ibv_send_wr swr = {.wr_id = 2,
                                  .sg_list = &ssge,
                                  .num_sge = 1,
                                  .opcode = IBV_WR_SEND,
                                  .send_flags = IBV_SEND_SIGNALED},
                           *sbad = NULL;
        swr.wr.ud.remote_qpn = qp->qp_num;
        swr.wr.ud.remote_qkey = QKEY;
        swr.wr.ud.ah = NULL; /* misuse first: no AH */
        CHECK(ibv_post_send(qp, &swr, &sbad) == EINVAL && sbad == &swr);
        swr.wr.ud.ah = ah;
        CHECK(ibv_post_send(qp, &swr, &sbad) == 0);

        int got_send = 0, got_recv = 0;
        for (int round = 0; round < 50 && !(got_send && got_recv); round++) {
                struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
                if (poll(&pfd, 1, 100) == 1) {
                        struct ibv_cq *ecq = NULL;
                        void *ectx = NULL;
                        CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0);
                        CHECK(ecq == cq && ectx == &cq_ctx_tag);
                        ibv_ack_cq_events(ecq, 1);
                        CHECK(ibv_req_notify_cq(cq, 0) == 0);
                }
                struct ibv_wc wc[4];
                int k = ibv_poll_cq(cq, 4, wc);
                CHECK(k >= 0);
                for (int i = 0; i < k; i++) {
                        CHECK(wc[i].status == IBV_WC_SUCCESS);
                        if (wc[i].wr_id == 2) {
                                CHECK(wc[i].opcode == IBV_WC_SEND);
                                got_send = 1;
                        } else if (wc[i].wr_id == 1) {
                                CHECK(wc[i].opcode == IBV_WC_RECV);
                                CHECK(wc[i].byte_len == MSG + GRH);
                                CHECK(wc[i].wc_flags & IBV_WC_GRH);
                                CHECK(wc[i].src_qp == qp->qp_num);
                                CHECK(!memcmp(rbuf + GRH, sbuf, MSG));
                                struct ibv_ah *rah =
                                    ibv_create_ah_from_wc(pd, &wc[i], (struct ibv_grh *)rbuf, 1);
                                CHECK(rah != NULL);
                                if (rah)
                                        CHECK(ibv_destroy_ah(rah) == 0);
                                got_recv = 1;
                        }
                }
        }
        CHECK(got_send && got_recv);
        CHECK(cq->comp_events_completed >= 1);

        CHECK(ibv_destroy_ah(ah) == 0);
        CHECK(ibv_destroy_qp(qp) == 0);
        CHECK(ibv_destroy_comp_channel(ch) == EBUSY); /* the CQ still uses it */
        CHECK(ibv_destroy_cq(cq) == 0);
        CHECK(ibv_destroy_comp_channel(ch) == 0);
        CHECK(ibv_dereg_mr(mr) == 0);
        CHECK(ibv_dealloc_pd(pd) == 0);
        CHECK(ibv_close_device(ctx) == 0);
        ibv_free_device_list(list);
        free(buf);
        free(buf2);
        if (failures) {
                fprintf(stderr, "%d check(s) failed\n", failures);
                return 1;
        }
        printf("ok\n");
        return 0;
}
