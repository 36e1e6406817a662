/* An unmodified-style verbs program whose device is served by the daemon:
 * opens diwarp0, creates a CQ and an RC QP, prints READY, and waits on the
 * context's async fd for IBV_EVENT_DEVICE_FATAL (the daemon is killed by
 * tests/interop/daemon.sh). Then the QP must report ERR and a post must
 * fail. Prints OK and exits 0, or FAIL with the reason and exits 1. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define FAIL(...)                                                                                  \
        do {                                                                                       \
                printf("FAIL: ");                                                                  \
                printf(__VA_ARGS__);                                                               \
                printf("\n");                                                                      \
                return 1;                                                                          \
        } while (0)

int main(void)
{
        setvbuf(stdout, NULL, _IOLBF, 0);
        int n;
        struct ibv_device **list = ibv_get_device_list(&n);
        struct ibv_context *ctx = NULL;
        for (int i = 0; list && i < n && !ctx; i++)
                if (!strcmp(ibv_get_device_name(list[i]), "diwarp0"))
                        ctx = ibv_open_device(list[i]);
        if (!ctx)
                FAIL("no diwarp0");
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
        if (!pd || !cq)
                FAIL("pd/cq");
        struct ibv_qp_init_attr ia = {
            .send_cq = cq,
            .recv_cq = cq,
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = IBV_QPT_RC};
        struct ibv_qp *qp = ibv_create_qp(pd, &ia);
        if (!qp)
                FAIL("qp");
        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
        if (ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
                FAIL("modify to INIT");
        printf("READY\n");
        struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
        if (poll(&p, 1, 20000) != 1)
                FAIL("no async event within 20 s");
        struct ibv_async_event ev;
        if (ibv_get_async_event(ctx, &ev))
                FAIL("ibv_get_async_event: %s", strerror(errno));
        if (ev.event_type != IBV_EVENT_DEVICE_FATAL)
                FAIL("event %d, not IBV_EVENT_DEVICE_FATAL", ev.event_type);
        ibv_ack_async_event(&ev);
        static char buf[64];
        struct ibv_sge sg = {(uintptr_t)buf, 8, 0};
        struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1}, *bad;
        int err = ibv_post_recv(qp, &wr, &bad);
        if (err == 0)
                FAIL("a post succeeded after the device was lost");
        /* Freeing after the loss works as before it. */
        if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
                FAIL("freeing after the loss: %s", strerror(errno));
        ibv_free_device_list(list);
        printf("OK device fatal (post: %s)\n", strerror(err));
        return 0;
}
