/* Drives the daemon's request handlers (daemon/requests.c, server.c) with
 * sequences of actions: clients connecting (as the owner or another uid),
 * requests with handles, payloads and descriptors, scribbles on the rings
 * the daemon shares, hang-ups at any moment (a slow CONNECT included), and
 * server turns. One server without a thread (dd_server_init, driven here by
 * dd_server_turn) serves everything, so each input is one deterministic
 * sequence but for the connect threads' timing. After each input every
 * client hangs up and the server must free it all: nothing crashes, leaks or
 * is used after it was freed (ASan).
 *
 * Input: actions until the bytes run out (at most MAX_ACTIONS); a missing
 * byte reads as 0.
 *   k%8 == 0  NEW      [u]            a client connects; uid not ours if u%8 == 7
 *   k%8 1..4  REQ      [c][op][h][f][n][n bytes]
 *                                     client c%clients sends op (1 + op %
 *                                     (DW_IPC_OP_END - 1)) with handle h%8;
 *                                     f bit 3: the payload is a well-formed
 *                                     template for op filled from the n bytes;
 *                                     else the n bytes are the payload as is.
 *                                     f bit 0: SEG_ADD carries a memfd (bit 1:
 *                                     sealed); f bits 4-7 nonzero: the length is
 *                                     off by (f >> 4) - 8 bytes
 *   k%8 == 5  SCRIBBLE [c][o][v0..v3] writes v at byte 4 * (o % 64) of the
 *                                     last ring region client c was given
 *   k%8 == 6  HANGUP   [c]            client c closes its socket
 *   k%8 == 7  TURNS    [n]            n % 8 + 1 server turns
 * Requests that wait for a peer are pointed at a local listener that never
 * answers, with a timeout of a few milliseconds; LISTEN binds port 0. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/daemon.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

_Static_assert(sizeof(((struct dw_ipc_req *)0)->u) >= 256, "a raw payload fits the request");

#define MAX_CLIENTS 4
#define MAX_ACTIONS 96
#define SEG_MAX     (64u * 1024)
#define SEG_BASE    0x10000000ull

static struct dd_daemon D = {.lock = PTHREAD_MUTEX_INITIALIZER};
static struct dd_server *S;
static uint16_t silent_port;

struct dd_daemon *dd_daemon(void)
{
        return &D;
}

struct fclient {
        int fd; /* our end; -1: hung up */
        void *map;
        size_t map_len;
};

static struct fclient C[MAX_CLIENTS];
static int nclients;

struct cursor {
        const uint8_t *p;
        size_t n;
};

static uint8_t next(struct cursor *c)
{
        if (!c->n)
                return 0;
        c->n--;
        return *c->p++;
}

static void setup(void)
{
        diwarpdv_engine_only();
        /* The server drives its devices (diwarpdv_external_progress). */
        setenv("DIWARP_PROGRESS", "app", 1);
        signal(SIGPIPE, SIG_IGN);
        D.uid = (uint32_t)geteuid();
        D.max_devs = 16;
        D.client_devs = 4;
        D.nservers = 1;
        D.spin_ns = 0;
        S = &D.servers[0];
        if (dd_server_init(S, 0) < 0)
                abort();
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof(a);
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(s, 64) < 0 ||
            getsockname(s, (struct sockaddr *)&a, &al) < 0)
                abort();
        silent_port = ntohs(a.sin_port);
}

/* Reads every answer waiting for client i; keeps the last region it got. */
static void drain(int i)
{
        struct fclient *f = &C[i];
        if (f->fd < 0)
                return;
        for (;;) {
                struct dw_ipc_rsp rsp;
                int fds[DW_IPC_MAX_FDS], n = DW_IPC_MAX_FDS;
                ssize_t k = dw_ipc_recv(f->fd, &rsp, sizeof(rsp), fds, &n);
                if (k <= 0)
                        return;
                uint64_t len = 0;
                if (k >= (ssize_t)offsetof(struct dw_ipc_rsp, u) && rsp.status == 0 && n == 1) {
                        unsigned int op = rsp.h.op & ~DW_IPC_RSP;
                        if (op == DW_IPC_QP_CREATE)
                                len = rsp.u.qp.map_len;
                        else if (op == DW_IPC_CQ_CREATE)
                                len = rsp.u.cq.map_len;
                        else if (op == DW_IPC_SRQ_CREATE)
                                len = rsp.u.srq.map_len;
                }
                if (len && len <= (1u << 24)) {
                        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
                        if (m != MAP_FAILED) {
                                if (f->map)
                                        munmap(f->map, f->map_len);
                                f->map = m;
                                f->map_len = len;
                        }
                }
                for (int j = 0; j < n; j++)
                        close(fds[j]);
        }
}

static void turns(int n, int timeout_ms)
{
        for (int t = 0; t < n; t++) {
                dd_server_turn(S, timeout_ms);
                for (int i = 0; i < nclients; i++)
                        drain(i);
        }
}

static void hangup(int i)
{
        struct fclient *f = &C[i];
        if (f->fd >= 0)
                close(f->fd);
        f->fd = -1;
        if (f->map)
                munmap(f->map, f->map_len);
        f->map = NULL;
}

static void new_client(struct cursor *in)
{
        uint8_t u = next(in);
        if (nclients == MAX_CLIENTS)
                return;
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sp) < 0)
                return;
        C[nclients++] = (struct fclient){.fd = sp[0]};
        dd_server_hand(S, sp[1], 1000 + nclients, u % 8 == 7 ? D.uid + 1 : D.uid);
        turns(1, 0);
}

static uint32_t arg(const uint8_t *b, int i)
{
        return b[i];
}

/* A well-formed payload for op from the bytes b (4 used). */
static void templ(struct dw_ipc_req *r, unsigned int op, const uint8_t *b)
{
        memset(&r->u, 0, sizeof(r->u));
        switch (op) {
        case DW_IPC_OPEN:
                r->u.open.version = DW_IPC_VERSION;
                r->u.open.pid = 1;
                if (b[0] & 1)
                        strcpy(r->u.open.addr, "127.0.0.1");
                r->u.open.port_base = (uint16_t)(b[0] & 2 ? 0 : 21000 + 16 * (b[1] % 8));
                break;
        case DW_IPC_SEG_ADD:
                r->u.seg.base = SEG_BASE + 4096ull * (b[0] % 16);
                r->u.seg.len = 4096ull * (1 + b[1] % 4);
                r->u.seg.id = 1 + b[2] % 8;
                r->u.seg.nreplace = b[3] % 3;
                for (uint32_t k = 0; k < r->u.seg.nreplace; k++)
                        r->u.seg.replace[k] = 1 + (b[k] >> 4) % 8;
                break;
        case DW_IPC_MR_REG:
                r->u.mr.pd = 1 + arg(b, 0) % 8;
                r->u.mr.seg = 1 + arg(b, 1) % 8;
                r->u.mr.addr = SEG_BASE + 4096ull * (b[2] % 16);
                r->u.mr.len = 4096ull * (b[3] % 3);
                r->u.mr.iova = r->u.mr.addr;
                r->u.mr.access =
                    DIWARP_ACCESS_LOCAL_WRITE | (b[3] & 0x80 ? DIWARP_ACCESS_REMOTE_WRITE : 0);
                break;
        case DW_IPC_CQ_CREATE:
                r->u.cq.cqe = 1 + b[0] % 16;
                r->u.cq.channel = b[1] % 4;
                break;
        case DW_IPC_QP_CREATE: {
                static const uint32_t types[] = {DIWARP_QPT_RC, DIWARP_QPT_UD, DIWARP_QPT_RD,
                                                 DIWARP_QPT_UC};
                r->u.qp.pd = 1 + b[0] % 8;
                r->u.qp.send_cq = 1 + b[1] % 8;
                r->u.qp.recv_cq = 1 + (b[1] >> 4) % 8;
                r->u.qp.srq = b[2] % 4 == 3 ? 1 + (b[2] >> 4) % 8 : 0;
                r->u.qp.type = types[b[3] % 4];
                r->u.qp.cap = (struct diwarp_qp_cap){4, 4, 1, 1, b[3] & 0x80 ? 64 : 0};
                break;
        }
        case DW_IPC_QP_MODIFY:
                r->u.qpm.attr.qp_state = (enum diwarp_qp_state)(b[0] % 7);
                r->u.qpm.attr.qkey = 7;
                r->u.qpm.mask = DIWARP_QP_STATE | (b[1] & 1 ? DIWARP_QP_QKEY : 0);
                break;
        case DW_IPC_SRQ_CREATE:
                r->u.srq.pd = 1 + b[0] % 8;
                r->u.srq.attr = (struct diwarp_srq_attr){1 + b[1] % 8, 1, 0};
                break;
        case DW_IPC_SRQ_MODIFY:
                r->u.srqm.attr.srq_limit = b[0] % 4;
                r->u.srqm.mask = 1 << (b[1] % 2);
                break;
        case DW_IPC_AH_CREATE:
                r->u.ah.pd = 1 + b[0] % 8;
                r->u.ah.dgid.raw[10] = r->u.ah.dgid.raw[11] = 0xff;
                r->u.ah.dgid.raw[12] = 127;
                r->u.ah.dgid.raw[15] = 1;
                break;
        case DW_IPC_RD_PATH:
                r->u.path.ah = b[0] % 4;
                r->u.path.remote_qpn = b[1];
                break;
        case DW_IPC_LISTEN:
                r->u.listen.backlog = 4;
                break;
        case DW_IPC_ACCEPT:
        case DW_IPC_REJECT:
        case DW_IPC_CONNECT:
                r->u.conn.listener = 1 + b[0] % 8;
                r->u.conn.qp = 1 + b[1] % 8;
                r->u.conn.request_id = b[2];
                r->u.conn.pd_len = b[3] % 8;
                break;
        default:
                break;
        }
}

static void request(struct cursor *in)
{
        uint8_t ci = next(in), opb = next(in), hb = next(in), f = next(in), n = next(in);
        uint8_t raw[256] = {0};
        for (int i = 0; i < n; i++)
                raw[i] = next(in);
        if (!nclients)
                return;
        struct fclient *fc = &C[ci % nclients];
        if (fc->fd < 0)
                return;
        unsigned int op = 1 + opb % (DW_IPC_OP_END - 1);
        struct dw_ipc_req r;
        memset(&r, 0, sizeof(r));
        if (f & 8)
                templ(&r, op, raw);
        else
                memcpy(&r.u, raw, n); /* n <= 255 < sizeof(r.u) */
        /* What would reach beyond this host or wait long is kept local and
         * short; a listener binds an ephemeral port. */
        if (op == DW_IPC_CONNECT || op == DW_IPC_ACCEPT || op == DW_IPC_REJECT) {
                memset(&r.u.conn.dgid, 0, sizeof(r.u.conn.dgid));
                r.u.conn.dgid.raw[10] = r.u.conn.dgid.raw[11] = 0xff;
                r.u.conn.dgid.raw[12] = 127;
                r.u.conn.dgid.raw[15] = 1;
                r.u.conn.port = silent_port;
                r.u.conn.timeout_ms = 1 + (int32_t)(raw[4] % 20);
                r.u.conn.has_sgid = 0;
        }
        if (op == DW_IPC_LISTEN)
                r.u.listen.port = 0;
        if (op == DW_IPC_OPEN && r.u.open.port_base && r.u.open.port_base < 20000)
                r.u.open.port_base = (uint16_t)(20000 + r.u.open.port_base % 8192);
        r.h.magic = DW_IPC_MAGIC;
        r.h.op = (uint16_t)op;
        r.h.seq = 1;
        r.h.handle = hb % 8;
        size_t len = dw_ipc_req_size(op);
        if (f >> 4) {
                long d = (long)(f >> 4) - 8;
                if ((long)len + d > 0 && (long)len + d <= (long)sizeof(r))
                        len = (size_t)((long)len + d);
        }
        r.h.len = (uint16_t)len;
        int fd = -1;
        if (op == DW_IPC_SEG_ADD && (f & 1)) {
                fd = memfd_create("fuzz-seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
                uint64_t sz = r.u.seg.len && r.u.seg.len <= SEG_MAX ? r.u.seg.len : 4096;
                if (fd >= 0 && ftruncate(fd, (off_t)sz) == 0 && (f & 2))
                        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
        }
        dw_ipc_send(fc->fd, &r, len, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, true);
        if (fd >= 0)
                close(fd);
        turns(2, 0);
}

static void scribble(struct cursor *in)
{
        uint8_t ci = next(in), o = next(in);
        uint32_t v = 0;
        for (int i = 0; i < 4; i++)
                v |= (uint32_t)next(in) << (8 * i);
        if (!nclients)
                return;
        struct fclient *fc = &C[ci % nclients];
        if (!fc->map || fc->map_len < 256)
                return;
        __atomic_store_n((uint32_t *)((uint8_t *)fc->map + 4 * (o % 64)), v, __ATOMIC_RELEASE);
        turns(1, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static int ready;
        if (!ready) {
                setup();
                ready = 1;
        }
        struct cursor in = {data, size};
        nclients = 0;
        for (int a = 0; a < MAX_ACTIONS && in.n; a++) {
                uint8_t k = next(&in);
                switch (k % 8) {
                case 0:
                        new_client(&in);
                        break;
                case 5:
                        scribble(&in);
                        break;
                case 6: {
                        uint8_t ci = next(&in);
                        if (nclients)
                                hangup(ci % nclients);
                        turns(1, 0);
                        break;
                }
                case 7:
                        turns(next(&in) % 8 + 1, 1);
                        break;
                default:
                        request(&in);
                        break;
                }
        }
        /* Everyone hangs up: the server frees every client once its slow
         * requests ended (their timeouts are milliseconds). */
        for (int i = 0; i < nclients; i++)
                hangup(i);
        uint64_t end = diwarpdv_now_ns() + 5000000000ull;
        while (S->clients || S->nhand) {
                if (diwarpdv_now_ns() > end)
                        abort(); /* a client the daemon never let go */
                turns(1, 1);
        }
        if (S->devs)
                abort(); /* a device left open without clients */
        atomic_store(&D.stop, false);
        return 0;
}
