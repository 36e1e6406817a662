/* bench-probe: what the engine offers, checked rather than assumed.
 *
 *   bench-probe --mode rd        an RD QP can be created (diwarp_qp_create)
 *   bench-probe --mode rc-rd     two RC QPs (on two device instances of this
 *                                process) connect and exchange a message, and
 *                                no TCP connection exists afterwards: run it
 *                                with DIWARP_RC_TRANSPORT=rd to learn whether
 *                                RC really runs over the RD sublayer
 *   bench-probe --mode idle-cpu [--duration-ms MS]
 *                                CPU time of an idle device over MS (run it
 *                                with DIWARP_PROGRESS=thread): idle_cpu_pct
 *
 * Exit status: 0 available, 3 not supported (-EOPNOTSUPP), 4 rc-rd ignored
 * (the RC QPs ran over TCP), 1 an error.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bcommon.h"

enum { M_RD = 0, M_RCRD = 1, M_IDLE = 2 };
static const char *const modes[] = {"rd", "rc-rd", "idle-cpu", NULL};

/* Device, PD, CQ, a 4 KiB registered buffer and one QP of the given type. */
static int open_side(struct bc_ctx *c, const struct bc_opts *o, enum bc_transport t)
{
        int err;
        memset(c, 0, sizeof(*c));
        c->o = *o;
        c->o.transport = t;
        c->oob = -1;
        if ((err = diwarp_device_open(NULL, &c->dev)))
                return bc_fail(c, "device open", err);
        if ((err = diwarp_pd_alloc(c->dev, &c->pd)) ||
            (err = diwarp_cq_create(c->dev, 64, NULL, NULL, &c->cq)))
                return bc_fail(c, "PD/CQ", err);
        c->buf_len = 4096;
        c->buf = mmap(NULL, c->buf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c->buf == MAP_FAILED) {
                c->buf = NULL;
                return bc_fail(c, "buffer", -ENOMEM);
        }
        if ((err = diwarp_mr_reg(c->pd, c->buf, c->buf_len, (uintptr_t)c->buf,
                                 DIWARP_ACCESS_LOCAL_WRITE, &c->mr)))
                return bc_fail(c, "MR", err);
        struct diwarp_mr_info mi;
        diwarp_mr_info(c->mr, &mi);
        c->lkey = mi.lkey;
        c->nqp = 1;
        c->q = calloc(1, sizeof(*c->q));
        if (!c->q)
                return bc_fail(c, "QP table", -ENOMEM);
        struct diwarp_qp_init_attr ia = {
            .send_cq = c->cq,
            .recv_cq = c->cq,
            .qp_type = t == BC_RC   ? DIWARP_QPT_RC
                       : t == BC_RD ? DIWARP_QPT_RD
                                    : DIWARP_QPT_UD,
            .cap = {16, 16, 1, 1, 64},
        };
        if ((err = diwarp_qp_create(c->pd, &ia, &c->q[0].qp)))
                return bc_fail(c, "QP create", err);
        return 0;
}

/* Connected TCP sockets of this process (listeners do not count). */
static int tcp_connections(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        int n = 0;
        while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                int fd = atoi(e->d_name), type = 0;
                socklen_t tl = sizeof(type);
                struct sockaddr_storage ss;
                socklen_t sl = sizeof(ss);
                if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM &&
                    getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
                        n++;
        }
        if (d)
                closedir(d);
        return n;
}

static int probe_rc_rd(const struct bc_opts *o, int *tcp)
{
        struct bc_ctx a, b;
        int rc = 1;
        if (open_side(&a, o, BC_RC) || open_side(&b, o, BC_RC))
                goto out;
        union diwarp_gid ga, gb;
        diwarp_device_gid(a.dev, &ga);
        diwarp_device_gid(b.dev, &gb);
        a.q[0].peer_gid = gb;
        a.q[0].peer_qpn = diwarp_qp_num(b.q[0].qp);
        b.q[0].peer_gid = ga;
        b.q[0].peer_qpn = diwarp_qp_num(a.q[0].qp);
        if (bc_qp_rts(&a, &a.q[0]) || bc_qp_rts(&b, &b.q[0]))
                goto out;
        int err = bc_post_recv(&b, 0, 1, b.buf, 64);
        if (!err)
                err = bc_post_send(&a, 0, 2, a.buf, 8, DIWARP_SEND_SIGNALED);
        if (err) {
                bc_fail(&a, "post", err);
                goto out;
        }
        bool sent = false, got = false;
        uint64_t deadline = bc_now_ns() + 5000000000ull;
        while ((!sent || !got) && bc_now_ns() < deadline) {
                struct diwarp_wc wc;
                int n = diwarp_cq_poll(a.cq, 1, &wc);
                if (n == 1) {
                        if (wc.status != DIWARP_WC_SUCCESS) {
                                fprintf(stderr, "send: %s\n", diwarp_wc_status_str(wc.status));
                                goto out;
                        }
                        sent = true;
                }
                n = diwarp_cq_poll(b.cq, 1, &wc);
                if (n == 1) {
                        if (wc.status != DIWARP_WC_SUCCESS) {
                                fprintf(stderr, "recv: %s\n", diwarp_wc_status_str(wc.status));
                                goto out;
                        }
                        got = true;
                }
                if (n < 0)
                        goto out;
        }
        if (!sent || !got) {
                fprintf(stderr, "no completion within 5 s\n");
                goto out;
        }
        *tcp = tcp_connections();
        rc = *tcp ? 4 : 0;
out:
        if (a.unsupported || b.unsupported)
                rc = BC_EXIT_UNSUPP;
        bc_teardown(&a);
        bc_teardown(&b);
        return rc;
}

static int probe_rd(const struct bc_opts *o)
{
        struct bc_ctx a;
        int rc = open_side(&a, o, BC_RD) ? (a.unsupported ? BC_EXIT_UNSUPP : 1) : 0;
        bc_teardown(&a);
        return rc;
}

static double cpu_s(void)
{
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
               (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int threads(void)
{
        DIR *d = opendir("/proc/self/task");
        struct dirent *e;
        int n = 0;
        while (d && (e = readdir(d)))
                n += e->d_name[0] != '.';
        if (d)
                closedir(d);
        return n;
}

static int probe_idle(const struct bc_opts *o, double *pct, int *nthreads)
{
        struct bc_ctx a;
        int rc = 1;
        /* a UD QP, as an application holds one, then nothing happens */
        if (open_side(&a, o, BC_UD) == 0) {
                *nthreads = threads();
                double c0 = cpu_s();
                uint64_t t0 = bc_now_ns();
                usleep(o->duration_ms * 1000u);
                double secs = (double)(bc_now_ns() - t0) / 1e9;
                *pct = (cpu_s() - c0) / secs * 100;
                rc = 0;
        }
        bc_teardown(&a);
        return rc;
}

int main(int argc, char **argv)
{
        struct bc_opts o;
        bc_parse(argc, argv, &o, "bench-probe", modes);
        int rc, tcp = -1, nthreads = 0;
        double pct = 0;
        switch (o.mode) {
        case M_RD:
                rc = probe_rd(&o);
                break;
        case M_RCRD:
                rc = probe_rc_rd(&o, &tcp);
                break;
        default:
                rc = probe_idle(&o, &pct, &nthreads);
                break;
        }
        const char *st = rc == 0                ? "ok"
                         : rc == BC_EXIT_UNSUPP ? "unsupported"
                         : rc == 4              ? "ignored"
                                                : "fail";
        printf("RESULT mode=%s status=%s", o.mode_name, st);
        if (o.mode == M_RCRD)
                printf(" tcp_connections=%d", tcp);
        if (o.mode == M_IDLE)
                printf(" threads=%d idle_cpu_pct=%.4f", nthreads, pct);
        printf("\n");
        return rc;
}
