/* RC 64-byte Send ping-pong under stress, multi-process: a client and a
 * server process (fork), NQP RC QPs between them over TCP, each QP with one
 * message in flight at a time, all QPs at once, both processes sharing the
 * machine's cores. Every message carries (QP index, message number) and is
 * echoed back; every wait has a deadline, so a lost wake-up (a message that
 * sits in a socket or in the receive staging buffer while its receiver
 * sleeps or polls elsewhere) fails loudly with the QP, the message number
 * and how long it has waited, instead of hanging.
 *
 *   rc_pingpong_stress busy      both sides busy-poll their CQ
 *   rc_pingpong_stress channel   both sides sleep on a completion channel
 *                                (arm, poll, poll(2) on the channel fd): the
 *                                progress thread serves the sockets
 *   rc_pingpong_stress mixed     client busy-polls, server sleeps on its
 *                                channel (the progress thread serves it)
 *   rc_pingpong_stress hybrid    both busy-poll with DIWARP_PROGRESS=thread:
 *                                the thread parks while the application
 *                                reads and must not keep data from it
 *
 * Each mode runs ROUNDS round trips per QP or until BUDGET_MS, whichever
 * comes first (a loaded machine does fewer), and needs at least MIN_ROUNDS
 * per QP. Exit status: 0 pass, 1 fail. An alarm ends a hung run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#include "two_proc.h"

#define NQP        4
#define MSG        64
#define NRECV      4
#define ROUNDS     5000  /* per QP */
#define MIN_ROUNDS 500   /* per QP, even on a loaded machine */
#define BUDGET_MS  12000 /* client's sending time */
/* Longest wait for one message. A lost wake-up waits until something else
 * stirs the stream (TCP keepalive after 1 s idle with the default peer
 * timeout, or forever); a machine that stalls both processes at once (seen:
 * ~1 s while a packet capture wrote to disk) delays both sides together.
 * 5 s passes the second and catches a stall like the 6.4 s one seen once. */
#define STALL_MS 5000

struct info {
        union diwarp_gid gid;
        uint32_t qpn[NQP];
};

/* The payload: QP index and message number, the rest derived from them. */
struct msg {
        uint32_t qp, n;
        uint8_t fill[MSG - 8];
};

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_comp_channel *ch; /* channel mode */
        struct diwarp_cq *cq;
        struct diwarp_qp *qp[NQP];
        struct diwarp_mr *mr;
        /* per QP: NRECV receive slots, then one send slot */
        struct msg buf[NQP][NRECV + 1];
        uint32_t lkey;
        bool channel;
        const char *role;
        uint64_t max_wait_us; /* the longest wait for one message */
        uint32_t max_wait_qp, max_wait_n;
};

static struct side S;

static void make_msg(struct msg *m, uint32_t qp, uint32_t n)
{
        m->qp = qp;
        m->n = n;
        for (size_t i = 0; i < sizeof(m->fill); i++)
                m->fill[i] = (uint8_t)(qp * 31 + n * 7 + i);
}

static void check_msg(const struct msg *m, uint32_t qp, uint32_t n)
{
        struct msg want;
        make_msg(&want, qp, n);
        if (memcmp(m, &want, sizeof(want)) != 0)
                die("%s: QP %u (%#x): message %u: got (QP %u, message %u) or damaged bytes", S.role,
                    qp, diwarp_qp_num(S.qp[qp]), n, m->qp, m->n);
}

static void post_recv(uint32_t q, uint32_t slot)
{
        struct diwarp_sge sge = {(uintptr_t)&S.buf[q][slot], MSG, S.lkey};
        struct diwarp_recv_wr wr = {
            .wr_id = (uint64_t)q << 32 | slot, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        CHECK(diwarp_post_recv(S.qp[q], &wr, &bad));
}

static void post_send(uint32_t q, uint32_t n)
{
        struct msg *m = &S.buf[q][NRECV];
        make_msg(m, q, n);
        struct diwarp_sge sge = {(uintptr_t)m, MSG, S.lkey};
        struct diwarp_send_wr wr = {.wr_id = (uint64_t)q << 32 | 0xffffffffu,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(S.qp[q], &wr, &bad));
}

static void side_open(struct info *me, bool channel, const char *role)
{
        memset(&S, 0, sizeof(S));
        S.channel = channel;
        S.role = role;
        CHECK(diwarp_device_open(NULL, &S.dev));
        CHECK(diwarp_pd_alloc(S.dev, &S.pd));
        if (channel)
                CHECK(diwarp_comp_channel_create(S.dev, &S.ch));
        CHECK(diwarp_cq_create(S.dev, 4 * NQP * (NRECV + 2), NULL, S.ch, &S.cq));
        CHECK(diwarp_mr_reg(S.pd, S.buf, sizeof(S.buf), (uintptr_t)S.buf, DIWARP_ACCESS_LOCAL_WRITE,
                            &S.mr));
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(S.mr, &mi));
        S.lkey = mi.lkey;
        memset(me, 0, sizeof(*me));
        CHECK(diwarp_device_gid(S.dev, &me->gid));
        for (uint32_t q = 0; q < NQP; q++) {
                struct diwarp_qp_init_attr ia = {.send_cq = S.cq,
                                                 .recv_cq = S.cq,
                                                 .qp_type = DIWARP_QPT_RC,
                                                 .cap = {.max_send_wr = 4,
                                                         .max_recv_wr = NRECV,
                                                         .max_send_sge = 1,
                                                         .max_recv_sge = 1}};
                CHECK(diwarp_qp_create(S.pd, &ia, &S.qp[q]));
                me->qpn[q] = diwarp_qp_num(S.qp[q]);
                struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT};
                CHECK(diwarp_qp_modify(S.qp[q], &a, DIWARP_QP_STATE));
                for (uint32_t s = 0; s < NRECV; s++)
                        post_recv(q, s);
        }
}

static void side_connect(const struct info *peer)
{
        for (uint32_t q = 0; q < NQP; q++) {
                struct diwarp_qp_attr a = {
                    .qp_state = DIWARP_QPS_RTR, .dgid = peer->gid, .dest_qp_num = peer->qpn[q]};
                CHECK(diwarp_qp_modify(S.qp[q], &a,
                                       DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN));
                a.qp_state = DIWARP_QPS_RTS;
                CHECK(diwarp_qp_modify(S.qp[q], &a, DIWARP_QP_STATE));
        }
}

static void side_close(void)
{
        for (uint32_t q = 0; q < NQP; q++)
                diwarp_qp_destroy(S.qp[q]);
        diwarp_mr_dereg(S.mr);
        diwarp_cq_destroy(S.cq);
        if (S.ch)
                diwarp_comp_channel_destroy(S.ch);
        diwarp_pd_dealloc(S.pd);
        diwarp_device_close(S.dev);
}

/* Next completion, by deadline (microseconds, CLOCK_MONOTONIC): busy-polled,
 * or (channel) armed, polled once more, then slept for on the channel fd. 0
 * when the deadline passed. */
static int next_wc(struct diwarp_wc *wc, uint64_t deadline)
{
        for (;;) {
                int n = diwarp_cq_poll(S.cq, 1, wc);
                if (n < 0)
                        die("%s: cq_poll: %s", S.role, strerror(-n));
                if (n == 1) {
                        if (wc->status != DIWARP_WC_SUCCESS)
                                die("%s: QP %llu: completion %s", S.role,
                                    (unsigned long long)(wc->wr_id >> 32),
                                    diwarp_wc_status_str(wc->status));
                        return 1;
                }
                uint64_t t = now_us();
                if (t >= deadline)
                        return 0;
                if (!S.channel)
                        continue;
                CHECK(diwarp_cq_req_notify(S.cq, false));
                n = diwarp_cq_poll(S.cq, 1, wc);
                if (n < 0)
                        die("%s: cq_poll: %s", S.role, strerror(-n));
                if (n == 1) {
                        if (wc->status != DIWARP_WC_SUCCESS)
                                die("%s: completion %s", S.role, diwarp_wc_status_str(wc->status));
                        return 1;
                }
                struct pollfd p = {.fd = diwarp_comp_channel_fd(S.ch), .events = POLLIN};
                int ms = (int)((deadline - t + 999) / 1000);
                int r = poll(&p, 1, ms);
                if (r < 0 && errno != EINTR)
                        die("%s: poll: %s", S.role, strerror(errno));
                if (r == 1) {
                        struct diwarp_cq *cq;
                        void *ctx;
                        CHECK(diwarp_comp_channel_get_event(S.ch, &cq, &ctx));
                        diwarp_cq_ack_events(cq, 1);
                }
        }
}

#define STOP 0xffffffffu /* message number that ends a QP's exchange */

/* Both roles. Per QP: the number of the next message expected and when the
 * wait for it began. The client sends message n+1 on a QP when the echo of
 * n arrives, and STOP after its last one; the server echoes each message
 * until STOP. Returns the round trips (client) or messages echoed (server),
 * all QPs together, once every send has completed. */
static uint64_t run(bool client)
{
        uint32_t expect[NQP] = {0};
        uint64_t since[NQP];
        bool done[NQP] = {false};
        uint32_t ndone = 0;
        uint64_t start = now_us(), last_any = start;
        uint64_t stop_at = start + (uint64_t)BUDGET_MS * 1000;
        uint64_t sends_out = 0;

        for (uint32_t q = 0; q < NQP; q++) {
                since[q] = start;
                if (client) {
                        post_send(q, 0);
                        sends_out++;
                }
        }
        while (ndone < NQP || sends_out) {
                /* The oldest wait sets the deadline. */
                uint64_t oldest = UINT64_MAX;
                uint32_t oq = NQP;
                for (uint32_t q = 0; q < NQP; q++)
                        if (!done[q] && since[q] < oldest) {
                                oldest = since[q];
                                oq = q;
                        }
                if (oq == NQP)
                        oldest = last_any; /* only send completions left */
                struct diwarp_wc wc;
                if (!next_wc(&wc, oldest + (uint64_t)STALL_MS * 1000)) {
                        uint64_t t = now_us();
                        if (oq == NQP)
                                die("%s: %llu send completions missing after %llu ms", S.role,
                                    (unsigned long long)sends_out,
                                    (unsigned long long)(t - oldest) / 1000);
                        die("%s: QP %u (%#x): message %u did not arrive: waited %llu ms (last "
                            "message on any QP %llu ms ago, %u QPs done, %llu sends "
                            "outstanding)",
                            S.role, oq, diwarp_qp_num(S.qp[oq]), expect[oq],
                            (unsigned long long)(t - oldest) / 1000,
                            (unsigned long long)(t - last_any) / 1000, ndone,
                            (unsigned long long)sends_out);
                }
                uint32_t q = (uint32_t)(wc.wr_id >> 32), slot = (uint32_t)wc.wr_id;
                if (q >= NQP || (wc.opcode != DIWARP_WC_SEND && slot >= NRECV))
                        die("%s: completion with wr_id %#llx", S.role,
                            (unsigned long long)wc.wr_id);
                if (wc.opcode == DIWARP_WC_SEND) {
                        sends_out--;
                        continue;
                }
                if (wc.byte_len != MSG || done[q])
                        die("%s: QP %u: message %u: %u bytes%s", S.role, q, expect[q], wc.byte_len,
                            done[q] ? " after STOP" : "");
                const struct msg *m = &S.buf[q][slot];
                last_any = now_us();
                if (last_any - since[q] > S.max_wait_us) {
                        S.max_wait_us = last_any - since[q];
                        S.max_wait_qp = q;
                        S.max_wait_n = expect[q];
                }
                since[q] = last_any;
                if (!client && m->n == STOP) {
                        check_msg(m, q, STOP);
                        done[q] = true;
                        ndone++;
                        continue;
                }
                check_msg(m, q, expect[q]);
                uint32_t n = expect[q]++;
                post_recv(q, slot);
                if (!client) {
                        post_send(q, n); /* the echo */
                } else if (n + 1 < ROUNDS && last_any < stop_at) {
                        post_send(q, n + 1);
                } else {
                        post_send(q, STOP);
                        done[q] = true;
                        ndone++;
                }
                sends_out++;
        }
        uint64_t total = 0;
        for (uint32_t q = 0; q < NQP; q++)
                total += expect[q];
        return total;
}

int main(int argc, char **argv)
{
        who = "rc_pingpong_stress";
        const char *mode = argc > 1 ? argv[1] : "busy";
        bool client_ch, server_ch;
        if (!strcmp(mode, "busy"))
                client_ch = server_ch = false;
        else if (!strcmp(mode, "channel"))
                client_ch = server_ch = true;
        else if (!strcmp(mode, "mixed")) {
                client_ch = false;
                server_ch = true;
        } else if (!strcmp(mode, "hybrid")) {
                client_ch = server_ch = false;
                setenv("DIWARP_PROGRESS", "thread", 1); /* read at device open */
        } else {
                fprintf(stderr, "usage: %s busy|channel|mixed|hybrid\n", argv[0]);
                return 2;
        }
        int c2s[2], s2c[2];
        if (pipe(c2s) || pipe(s2c))
                die("pipe: %s", strerror(errno));
        struct info me, peer;
        pid_t pid = fork();
        if (pid < 0)
                die("fork: %s", strerror(errno));
        if (pid == 0) {
                who = "rc_pingpong_stress server";
                alarm(90); /* not inherited across fork */
                side_open(&me, server_ch, "server");
                xwrite(s2c[1], &me, sizeof(me));
                xread(c2s[0], &peer, sizeof(peer));
                side_connect(&peer);
                uint64_t echoed = run(false);
                xwrite(s2c[1], &echoed, sizeof(echoed));
                fprintf(stderr, "%s: longest wait %.1f ms (QP %u, message %u)\n", who,
                        (double)S.max_wait_us / 1000, S.max_wait_qp, S.max_wait_n);
                char bye;
                xread(c2s[0], &bye, 1); /* the client has read everything */
                side_close();
                _exit(0);
        }
        child_pid = pid;
        alarm(90);
        who = "rc_pingpong_stress client";
        side_open(&me, client_ch, "client");
        xread(s2c[0], &peer, sizeof(peer));
        xwrite(c2s[1], &me, sizeof(me));
        side_connect(&peer);
        uint64_t t0 = now_us();
        uint64_t rounds = run(true);
        uint64_t us = now_us() - t0;
        uint64_t echoed;
        xread(s2c[0], &echoed, sizeof(echoed));
        if (echoed != rounds)
                die("server echoed %llu messages, client counted %llu round trips",
                    (unsigned long long)echoed, (unsigned long long)rounds);
        if (rounds < (uint64_t)MIN_ROUNDS * NQP)
                die("only %llu round trips in %llu ms (at least %u per QP wanted)",
                    (unsigned long long)rounds, (unsigned long long)us / 1000, MIN_ROUNDS);
        xwrite(c2s[1], "x", 1);
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
                die("server process failed (status %#x)", st);
        child_pid = 0;
        side_close();
        printf("%s: PASS: mode %s, %d QPs, %llu round trips of %d bytes in %llu ms (%.1f us "
               "each, all QPs at once); longest wait %.1f ms (QP %u, message %u)\n",
               who, mode, NQP, (unsigned long long)rounds, MSG, (unsigned long long)us / 1000,
               (double)us * NQP / (double)rounds, (double)S.max_wait_us / 1000, S.max_wait_qp,
               S.max_wait_n);
        return 0;
}
