/* rdma_create_qp_ex with send_ops_flags under `diwarp run`: an RC
 * connection through the rdma_cm calls (synchronous ids, loopback), each
 * side's QP made by rdma_create_qp_ex with the wr_* API, a Send and an RDMA
 * Write posted with ibv_wr_* and checked at the other side; ops the QP type
 * cannot carry refused with EOPNOTSUPP. Exit 0 = all checks passed.
 */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

enum { LEN = 256 };

static struct ibv_qp_init_attr_ex qp_attr(struct ibv_pd *pd, uint64_t ops)
{
        struct ibv_qp_init_attr_ex a = {
            .cap = {.max_send_wr = 8,
                    .max_recv_wr = 8,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = 64},
            .qp_type = IBV_QPT_RC,
            .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            .pd = pd,
            .send_ops_flags = ops,
        };
        return a;
}

/* One completion from the id's send or receive CQ within 5 s. */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc)
{
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
                int n = ibv_poll_cq(cq, 1, wc);
                if (n)
                        return n;
                clock_gettime(CLOCK_MONOTONIC, &t);
        } while (t.tv_sec - t0.tv_sec < 5);
        return 0;
}

struct server {
        struct rdma_cm_id *listen, *id;
        struct ibv_pd *pd;
        struct ibv_mr *mr;
        char buf[2 * LEN];
        int ok;
};

static void *serve(void *arg)
{
        struct server *s = arg;
        if (rdma_get_request(s->listen, &s->id))
                return NULL;
        struct ibv_pd *pd = s->pd = ibv_alloc_pd(s->id->verbs);
        if (!pd)
                return NULL;
        s->mr = ibv_reg_mr(pd, s->buf, sizeof(s->buf),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        struct ibv_qp_init_attr_ex a = qp_attr(pd, IBV_QP_EX_WITH_SEND);
        if (!s->mr || rdma_create_qp_ex(s->id, &a))
                return NULL;
        if (rdma_post_recv(s->id, (void *)1, s->buf, LEN, s->mr))
                return NULL;
        if (rdma_accept(s->id, NULL))
                return NULL;
        s->ok = 1;
        return NULL;
}

int main(void)
{
        struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP}, *res;
        char port[16];
        snprintf(port, sizeof(port), "%d", 20000 + (int)(getpid() % 20000));
        REQUIRE(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0);
        struct server s;
        memset(&s, 0, sizeof(s));
        REQUIRE(rdma_create_ep(&s.listen, res, NULL, NULL) == 0);
        rdma_freeaddrinfo(res);
        REQUIRE(rdma_listen(s.listen, 1) == 0);
        pthread_t th;
        REQUIRE(pthread_create(&th, NULL, serve, &s) == 0);

        hints.ai_flags = 0;
        REQUIRE(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0);
        struct rdma_cm_id *id;
        REQUIRE(rdma_create_ep(&id, res, NULL, NULL) == 0);
        rdma_freeaddrinfo(res);
        struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
        REQUIRE(pd);
        /* Ops an RC QP cannot carry here: refused, no QP left behind. */
        struct ibv_qp_init_attr_ex a =
            qp_attr(pd, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE);
        errno = 0;
        CHECK(rdma_create_qp_ex(id, &a) == -1 && errno == EOPNOTSUPP && id->qp == NULL);
        a = qp_attr(pd, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE);
        REQUIRE(rdma_create_qp_ex(id, &a) == 0 && id->qp);
        struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(id->qp);
        REQUIRE(qpx);
        REQUIRE(rdma_connect(id, NULL) == 0);
        pthread_join(th, NULL);
        REQUIRE(s.ok);

        char *buf = calloc(1, LEN);
        REQUIRE(buf);
        for (int i = 0; i < LEN; i++)
                buf[i] = (char)(i * 3 + 1);
        struct ibv_mr *mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
        REQUIRE(mr);
        ibv_wr_start(qpx);
        qpx->wr_id = 7;
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_write(qpx, s.mr->rkey, (uintptr_t)(s.buf + LEN));
        ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, LEN);
        qpx->wr_id = 8;
        ibv_wr_send(qpx);
        ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, 100);
        CHECK(ibv_wr_complete(qpx) == 0);
        struct ibv_wc wc;
        CHECK(poll1(id->send_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7);
        CHECK(poll1(id->send_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 8);
        /* The Send arrives after the Write (one stream, in order). */
        CHECK(poll1(s.id->recv_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 &&
              wc.byte_len == 100);
        CHECK(!memcmp(s.buf, buf, 100) && !memcmp(s.buf + LEN, buf, LEN));

        rdma_disconnect(id);
        CHECK(ibv_dereg_mr(mr) == 0);
        rdma_destroy_qp(id);
        CHECK(ibv_dealloc_pd(pd) == 0);
        rdma_destroy_ep(id);
        rdma_disconnect(s.id);
        CHECK(ibv_dereg_mr(s.mr) == 0);
        rdma_destroy_qp(s.id);
        CHECK(ibv_dealloc_pd(s.pd) == 0);
        rdma_destroy_ep(s.id);
        rdma_destroy_ep(s.listen);
        free(buf);
        if (failures) {
                fprintf(stderr, "%d check(s) failed\n", failures);
                return 1;
        }
        printf("ok\n");
        return 0;
}
