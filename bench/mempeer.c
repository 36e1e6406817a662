/* bench-mempeer: memory per peer, UD/RD vs RC: how the stack's own state
 * grows with the number of peers one process talks to.
 *
 *   server (the peers): bench-mempeer [--port P]
 *   client (measured):  bench-mempeer [--transport ud|rc|rd] --qps N HOST
 *
 * The measured process talks to N peers: RC, one QP per peer (N connections);
 * UD/RD, one QP and one address handle per peer. The peers are N QPs of the
 * server process. Every peer exchanges one 8-byte message with the measured
 * process (so connection state and any per-peer reliability state exist).
 * Queue depths are fixed (16 send, 16 receive WRs per QP) and there are no
 * per-peer application buffers: what grows with N is the stack's own state.
 *
 * Measured before creating any QP and after the exchange:
 *   rss: VmRSS of the process;
 *   sockbuf: kernel socket buffer memory of its sockets (SO_MEMINFO: receive
 *            queue + write queue + forward allocation + option memory + backlog,
 *            the figure `ss -m` prints), side channel excluded;
 *   sockobj: the kernel objects behind each socket (slab object sizes from
 *            /proc/slabinfo: TCP or UDP sock, socket inode, file, dentry),
 *            0 when /proc/slabinfo is not readable.
 *   RESULT ... per_peer_b = (drss + dsockbuf + dsockobj) / N
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <linux/sock_diag.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bcommon.h"

#define QDEPTH 16
#define SLOT   128

enum { T_RECV = 1, T_SEND = 2 };

static struct bc_ctx c;

struct mem {
        uint64_t rss, sockbuf, sockobj, sockets, tcp, udp;
};

static uint64_t slab_objsize(const char *name)
{
        FILE *f = fopen("/proc/slabinfo", "r");
        char line[512];
        uint64_t sz = 0;
        if (!f)
                return 0;
        size_t n = strlen(name);
        while (fgets(line, sizeof(line), f)) {
                if (!strncmp(line, name, n) && line[n] == ' ') {
                        unsigned long active, num, objsize;
                        if (sscanf(line + n, "%lu %lu %lu", &active, &num, &objsize) == 3)
                                sz = objsize;
                        break;
                }
        }
        fclose(f);
        return sz;
}

static void measure(struct mem *m)
{
        memset(m, 0, sizeof(*m));
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        while (f && fgets(line, sizeof(line), f))
                if (!strncmp(line, "VmRSS:", 6))
                        m->rss = strtoull(line + 6, NULL, 10) * 1024;
        if (f)
                fclose(f);
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        while (d && (e = readdir(d))) {
                int fd = atoi(e->d_name);
                if (e->d_name[0] == '.' || fd == c.oob || fd == dirfd(d))
                        continue;
                char path[64], target[64];
                snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
                ssize_t l = readlink(path, target, sizeof(target) - 1);
                if (l <= 0)
                        continue;
                target[l] = 0;
                if (strncmp(target, "socket:", 7))
                        continue;
                uint32_t mi[SK_MEMINFO_VARS];
                socklen_t len = sizeof(mi);
                int type = 0;
                socklen_t tl = sizeof(type);
                if (getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mi, &len) == 0)
                        m->sockbuf += (uint64_t)mi[SK_MEMINFO_RMEM_ALLOC] +
                                      mi[SK_MEMINFO_WMEM_QUEUED] + mi[SK_MEMINFO_FWD_ALLOC] +
                                      mi[SK_MEMINFO_OPTMEM] + mi[SK_MEMINFO_BACKLOG];
                getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl);
                m->sockets++;
                if (type == SOCK_STREAM)
                        m->tcp++;
                else if (type == SOCK_DGRAM)
                        m->udp++;
        }
        if (d)
                closedir(d);
        uint64_t common =
            slab_objsize("sock_inode_cache") + slab_objsize("filp") + slab_objsize("dentry");
        uint64_t tcp = slab_objsize("TCP"), udp = slab_objsize("UDP");
        if (tcp && udp)
                m->sockobj = m->tcp * (tcp + common) + m->udp * (udp + common) +
                             (m->sockets - m->tcp - m->udp) * common;
}

static int wait_recv(uint32_t *qi)
{
        struct diwarp_wc wc;
        for (;;) {
                int r = bc_poll(&c, &wc, 1);
                if (r <= 0) {
                        fprintf(stderr, "%s: timeout waiting for a message\n",
                                c.server ? "server" : "client");
                        return -1;
                }
                if (wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "completion: %s\n", diwarp_wc_status_str(wc.status));
                        return -1;
                }
                if (BC_WR_TYPE(wc.wr_id) == T_RECV) {
                        *qi = BC_WR_QP(wc.wr_id);
                        return 0;
                }
        }
}

static int send_to(struct bc_qp *q, struct diwarp_ah *ah, uint32_t qpn, uint32_t qi)
{
        struct diwarp_sge sge = {(uintptr_t)c.buf, 8, c.lkey};
        struct diwarp_send_wr wr = {.wr_id = BC_WR(T_SEND, qi, 0),
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED},
                              *bad;
        if (c.o.transport != BC_RC) {
                wr.wr.ud.ah = ah;
                wr.wr.ud.remote_qpn = qpn;
                wr.wr.ud.remote_qkey = BC_QKEY;
        }
        return diwarp_post_send(q->qp, &wr, &bad);
}

static int post_recv(uint32_t qpi, uint32_t tag)
{
        return bc_post_recv(&c, qpi, BC_WR(T_RECV, tag, 0), c.buf + SLOT, SLOT);
}

static bool run(struct mem *m0, struct mem *m1)
{
        int err;
        const uint32_t n = c.o.qps;
        bool rc = c.o.transport == BC_RC;
        struct diwarp_open_opts oo = {.addr = c.o.addr};
        if ((err = diwarp_device_open(&oo, &c.dev)))
                return bc_fail(&c, "device open", err) && false;
        if ((err = diwarp_pd_alloc(c.dev, &c.pd)) ||
            (err = diwarp_cq_create(c.dev, 256, NULL, NULL, &c.cq)))
                return bc_fail(&c, "PD/CQ", err) && false;
        c.buf_len = 2 * SLOT;
        c.buf = calloc(1, c.buf_len);
        if (!c.buf || (err = diwarp_mr_reg(c.pd, c.buf, c.buf_len, (uintptr_t)c.buf,
                                           DIWARP_ACCESS_LOCAL_WRITE, &c.mr)))
                return bc_fail(&c, "MR", err ? err : -ENOMEM) && false;
        struct diwarp_mr_info mi;
        diwarp_mr_info(c.mr, &mi);
        c.lkey = mi.lkey;
        if (!c.server)
                measure(m0);
        /* the measured side: N QPs (RC) or 1 QP (UD/RD); the server: N QPs */
        uint32_t nq = c.server || rc ? n : 1;
        c.nqp = nq;
        c.q = calloc(nq, sizeof(*c.q));
        uint32_t *qpns = calloc(n, sizeof(uint32_t)), *peer = calloc(n, sizeof(uint32_t));
        struct diwarp_ah **ahs = calloc(n, sizeof(*ahs));
        bool ok = false;
        if (!c.q || !qpns || !peer || !ahs)
                goto out;
        enum diwarp_qp_type type = rc                       ? DIWARP_QPT_RC
                                   : c.o.transport == BC_RD ? DIWARP_QPT_RD
                                                            : DIWARP_QPT_UD;
        for (uint32_t i = 0; i < nq; i++) {
                struct diwarp_qp_init_attr ia = {
                    .send_cq = c.cq,
                    .recv_cq = c.cq,
                    .qp_type = type,
                    .cap = {QDEPTH, QDEPTH, 1, 1, 64},
                };
                if ((err = diwarp_qp_create(c.pd, &ia, &c.q[i].qp))) {
                        bc_fail(&c, "QP create", err);
                        goto out;
                }
                qpns[i] = htonl(diwarp_qp_num(c.q[i].qp));
        }
        union diwarp_gid gid, pgid;
        diwarp_device_gid(c.dev, &gid);
        uint32_t cnt = htonl(nq), pcnt;
        if (bc_write_all(c.oob, gid.raw, 16) || bc_write_all(c.oob, &cnt, 4) ||
            bc_write_all(c.oob, qpns, nq * 4) || bc_read_all(c.oob, pgid.raw, 16) ||
            bc_read_all(c.oob, &pcnt, 4) || ntohl(pcnt) > n ||
            bc_read_all(c.oob, peer, ntohl(pcnt) * 4)) {
                fprintf(stderr, "side channel exchange failed\n");
                goto out;
        }
        pcnt = ntohl(pcnt);
        for (uint32_t i = 0; i < nq; i++) {
                c.q[i].peer_gid = pgid;
                c.q[i].peer_qpn = ntohl(peer[pcnt == 1 ? 0 : i]);
                if (bc_qp_rts(&c, &c.q[i]))
                        goto out;
        }
        if (!rc && !c.server) {
                /* one address handle per peer, as an application keeps them */
                for (uint32_t i = 0; i < n; i++)
                        if ((err = diwarp_ah_create(c.pd, &pgid, &ahs[i]))) {
                                bc_fail(&c, "AH create", err);
                                goto out;
                        }
        }
        /* a receive on every QP that may be the target of a message */
        for (uint32_t i = 0; i < nq; i++)
                if (post_recv(i, i))
                        goto out;
        if (bc_sync(&c))
                goto out;
        for (uint32_t i = 0; i < n; i++) {
                uint32_t qi;
                if (c.server) {
                        if (wait_recv(&qi) || post_recv(qi, qi) ||
                            send_to(&c.q[qi], c.q[qi].ah, c.q[qi].peer_qpn, qi))
                                goto out;
                } else {
                        uint32_t lq = rc ? i : 0;
                        if (send_to(&c.q[lq], rc ? NULL : ahs[i], ntohl(peer[i]), lq) ||
                            wait_recv(&qi) || post_recv(qi, qi))
                                goto out;
                }
        }
        if (bc_sync(&c))
                goto out;
        /* let the last acknowledgements settle before looking */
        usleep(100000);
        if (!c.server)
                measure(m1);
        ok = bc_sync(&c) == 0;
out:
        for (uint32_t i = 0; i < n; i++)
                if (ahs && ahs[i])
                        diwarp_ah_destroy(ahs[i]);
        free(ahs);
        free(qpns);
        free(peer);
        return ok;
}

int main(int argc, char **argv)
{
        struct bc_opts o;
        bc_parse(argc, argv, &o, "bench-mempeer", NULL);
        struct mem m0 = {0}, m1 = {0};
        bool ok = bc_oob_open(&c, &o) == 0;
        if (ok)
                ok = bc_finish(&c, run(&m0, &m1));
        o = c.o;
        const char *st = c.unsupported ? "unsupported" : ok ? "ok" : "fail";
        /* bc_teardown frees with munmap: this buffer came from calloc */
        free(c.buf);
        c.buf = NULL;
        bc_teardown(&c);
        if (!ok)
                m0 = m1 = (struct mem){0};
        int64_t drss = (int64_t)(m1.rss - m0.rss), dbuf = (int64_t)(m1.sockbuf - m0.sockbuf);
        int64_t dobj = (int64_t)(m1.sockobj - m0.sockobj);
        double n = o.qps ? (double)o.qps : 1;
        printf("RESULT transport=%s peers=%u status=%s rss_b=%llu rss0_b=%llu sockets=%llu "
               "sockets0=%llu tcp_sockets=%llu udp_sockets=%llu sockbuf_b=%llu sockobj_b=%llu "
               "rss_per_peer_b=%.1f "
               "kern_per_peer_b=%.1f per_peer_b=%.1f\n",
               bc_transport_name(o.transport), o.qps, st, (unsigned long long)m1.rss,
               (unsigned long long)m0.rss, (unsigned long long)m1.sockets,
               (unsigned long long)m0.sockets, (unsigned long long)m1.tcp,
               (unsigned long long)m1.udp, (unsigned long long)m1.sockbuf,
               (unsigned long long)m1.sockobj, (double)drss / n, (double)(dbuf + dobj) / n,
               (double)(drss + dbuf + dobj) / n);
        return c.unsupported ? BC_EXIT_UNSUPP : ok ? 0 : 1;
}
