/* The RC receive path (rc/rc_rx.c) fed an arbitrary byte stream as what the peer
 * sends on an established stream (MPA negotiated, FPDU mode).
 *
 * Set up once: a device, a PD, three MRs inside one arena with guard bytes
 * around each (R1: 128 KiB, remote write + read + atomic; R2: remote read
 * only; R3: local write only: receive buffers and the sinks of our Read and
 * Atomic), one CQ. Per input: an RC QP (RTS, or RTR when bit 1 of the first byte is
 * set) with three receive WQEs, an RDMA Read and an Atomic Fetch-Add posted;
 * the stream is one end of a socketpair handed to the engine as rc/cm.c hands it
 * an accepted connection (dw_rc_handover), CRC on when bit 0 of the first byte
 * is set. With bit 2 set too, the target first writes the right CRC into
 * every whole FPDU of the input (a mutated input rarely keeps a valid CRC,
 * and the paths behind the CRC check would go unexplored with CRC on). The
 * rest of the input is written into the other end, in pieces of the size
 * bits 3-5 of the first byte choose (all at once, or 1..4096 bytes per
 * progress step: headers, payloads and trailers split across reads), and
 * the device is progressed until it has read everything and is idle.
 *
 * Checks after each input:
 *  - no byte outside R1, the posted receive buffers and the two sinks
 *    changed (guards, R2, the unposted parts of R3);
 *  - the engine read the whole input, or the QP is in ERR and a Terminate
 *    went out (or the input carried one);
 *  - every FPDU the engine sent back is framed right and carries RDMAP
 *    version 1, and every completion is sane.
 *
 * STags: random in the engine (mem/ draws them 16 per getrandom call, taken
 * in order); here getrandom gives STag k + 1 << 8 | KEY_BYTE as word k
 * while the MRs are registered, so the committed corpus can name them. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rc/mpa_conn.h"
#include "dw.h"
#include "rc/rc.h"
#include "wire/crc32c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fixed layout the corpus is written for (tests/fuzz/gen_rc_rx_corpus.py). */
#define R1_LEN    (128u << 10) /* room for Writes of several full FPDUs */
#define REGION    4096u        /* R2, R3 */
#define GUARD     256u
#define NREG      3
#define R1_IOVA   0x100000u
#define R2_IOVA   0x200000u
#define R3_IOVA   0x300000u
#define KEY_BYTE  0x5a
#define READ_SINK 2048u /* R3 offset of our Read's sink, READ_LEN bytes */
#define READ_LEN  256u
#define ATOM_SINK 2304u /* R3 offset of our Atomic's 8-byte result */
#define STEP_MAX  20000 /* > twice the pieces of the longest input taken */

static bool fixed_random;

ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
        if (fixed_random) {
                uint8_t *b = buf;
                for (size_t k = 0; k < len / 4; k++) {
                        uint32_t w = (uint32_t)(k + 1) << 8 | KEY_BYTE;
                        memcpy(b + 4 * k, &w, 4);
                }
                memset(b + len / 4 * 4, KEY_BYTE, len % 4);
                return (ssize_t)len;
        }
        return syscall(SYS_getrandom, buf, len, flags);
}

static struct {
        bool ready;
        bool verbose;
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_mr *mr[NREG];
        uint32_t stag[NREG];
        uint8_t *arena;
        uint8_t *reg[NREG];
        uint8_t *pattern; /* what the arena holds before each input */
        bool *may_change; /* per arena byte */
        /* The unwritable spans, compared with memcmp (a per-byte loop would
         * dominate the run time under coverage instrumentation). */
        size_t fixed_off[16], fixed_len[16];
        int nfixed;
} S;

static size_t arena_len(void)
{
        return GUARD + R1_LEN + GUARD + (NREG - 1) * (REGION + GUARD);
}

static void mark(uint8_t *base, size_t off, size_t len)
{
        memset(S.may_change + (base - S.arena) + off, 1, len);
}

static void setup(void)
{
        /* Quiet by default (every malformed input logs a warn line); a crash
         * is reproduced with DIWARP_LOG=debug. */
        setenv("DIWARP_LOG", "error", 0);
        S.verbose = getenv("DIWARP_FUZZ_VERBOSE") != NULL;
        if (diwarp_device_open(NULL, &S.dev) < 0 || diwarp_pd_alloc(S.dev, &S.pd) < 0 ||
            diwarp_cq_create(S.dev, 256, NULL, NULL, &S.cq) < 0)
                abort();
        size_t n = arena_len();
        S.arena = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
        S.pattern = malloc(n);
        S.may_change = calloc(n, 1);
        if (!S.arena || !S.pattern || !S.may_change)
                abort();
        for (size_t i = 0; i < n; i++)
                S.pattern[i] = (uint8_t)(i * 131 + 7);
        static const uint64_t iova[NREG] = {R1_IOVA, R2_IOVA, R3_IOVA};
        static const int access[NREG] = {DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                             DIWARP_ACCESS_REMOTE_READ |
                                             DIWARP_ACCESS_REMOTE_ATOMIC,
                                         DIWARP_ACCESS_REMOTE_READ, DIWARP_ACCESS_LOCAL_WRITE};
        fixed_random = true;
        for (int i = 0; i < NREG; i++) {
                size_t len = i == 0 ? R1_LEN : REGION;
                S.reg[i] =
                    i == 0 ? S.arena + GUARD : S.reg[i - 1] + (i == 1 ? R1_LEN : REGION) + GUARD;
                if (diwarp_mr_reg(S.pd, S.reg[i], len, iova[i], access[i], &S.mr[i]) < 0)
                        abort();
                struct diwarp_mr_info mi;
                diwarp_mr_info(S.mr[i], &mi);
                S.stag[i] = mi.rkey;
                /* The corpus names the STags as (i + 1) << 8 | KEY_BYTE. */
                if (S.stag[i] != ((uint32_t)(i + 1) << 8 | KEY_BYTE)) {
                        fprintf(stderr, "fuzz_rc_rx: MR %d has STag %#x, corpus expects %#x\n", i,
                                S.stag[i], (unsigned)((i + 1) << 8 | KEY_BYTE));
                        abort();
                }
        }
        fixed_random = false;
        mark(S.reg[0], 0, R1_LEN);
        mark(S.reg[2], 0, 256);     /* receive 0 */
        mark(S.reg[2], 512, 128);   /* receive 1, first SGE */
        mark(S.reg[2], 768, 128);   /* receive 1, second SGE */
        mark(S.reg[2], 1024, 1024); /* receive 2 */
        mark(S.reg[2], READ_SINK, READ_LEN);
        mark(S.reg[2], ATOM_SINK, 8);
        for (size_t i = 0; i < n;) {
                size_t j = i;
                while (j < n && S.may_change[j] == S.may_change[i])
                        j++;
                if (!S.may_change[i]) {
                        if (S.nfixed == 16)
                                abort();
                        S.fixed_off[S.nfixed] = i;
                        S.fixed_len[S.nfixed++] = j - i;
                }
                i = j;
        }
        S.ready = true;
}

static void post_work(struct diwarp_qp *qp)
{
        uint32_t lk = S.stag[2];
        uint64_t b = R3_IOVA; /* SGEs name local memory by iova too */
        struct diwarp_sge r0 = {b, 256, lk};
        struct diwarp_sge r1[2] = {{b + 512, 128, lk}, {b + 768, 128, lk}};
        struct diwarp_sge r2 = {b + 1024, 1024, lk};
        struct diwarp_recv_wr rw[3] = {
            {.wr_id = 0x100, .sg_list = &r0, .num_sge = 1, .next = &rw[1]},
            {.wr_id = 0x101, .sg_list = r1, .num_sge = 2, .next = &rw[2]},
            {.wr_id = 0x102, .sg_list = &r2, .num_sge = 1}};
        struct diwarp_recv_wr *rbad;
        if (diwarp_post_recv(qp, rw, &rbad) < 0)
                abort();

        /* Read R1 of the peer (the same layout: the peer is us) into R3. */
        struct diwarp_sge rs = {b + READ_SINK, READ_LEN, lk};
        struct diwarp_sge as = {b + ATOM_SINK, 8, lk};
        struct diwarp_send_wr sw[2] = {{.wr_id = 0x200,
                                        .sg_list = &rs,
                                        .num_sge = 1,
                                        .opcode = DIWARP_WR_RDMA_READ,
                                        .send_flags = DIWARP_SEND_SIGNALED,
                                        .next = &sw[1]},
                                       {.wr_id = 0x201,
                                        .sg_list = &as,
                                        .num_sge = 1,
                                        .opcode = DIWARP_WR_ATOMIC_FETCH_AND_ADD,
                                        .send_flags = DIWARP_SEND_SIGNALED}};
        sw[0].wr.rdma.remote_addr = R1_IOVA;
        sw[0].wr.rdma.rkey = S.stag[0];
        sw[1].wr.atomic.remote_addr = R1_IOVA + 64;
        sw[1].wr.atomic.rkey = S.stag[0];
        sw[1].wr.atomic.compare_add = 1;
        struct diwarp_send_wr *sbad;
        if (diwarp_post_send(qp, sw, &sbad) < 0)
                abort();
}

static struct diwarp_qp *make_qp(bool rtr)
{
        struct diwarp_qp_init_attr ia = {
            .send_cq = S.cq,
            .recv_cq = S.cq,
            .qp_type = DIWARP_QPT_RC,
            .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2}};
        struct diwarp_qp *qp;
        if (diwarp_qp_create(S.pd, &ia, &qp) < 0)
                abort();
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .qp_access_flags = DIWARP_ACCESS_REMOTE_WRITE |
                                                      DIWARP_ACCESS_REMOTE_READ |
                                                      DIWARP_ACCESS_REMOTE_ATOMIC};
        if (diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | DIWARP_QP_ACCESS_FLAGS) < 0)
                abort();
        a.qp_state = DIWARP_QPS_RTR;
        a.max_dest_rd_atomic = 4;
        if (diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | DIWARP_QP_MAX_DEST_RD_ATOMIC) < 0)
                abort();
        if (!rtr) {
                a.qp_state = DIWARP_QPS_RTS;
                a.max_rd_atomic = 4;
                if (diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | DIWARP_QP_MAX_QP_RD_ATOMIC) < 0)
                        abort();
        }
        return qp;
}

/* What the engine sends back, parsed FPDU by FPDU as it streams out. */
struct outbound {
        uint8_t hdr[4]; /* ULPDU_Length + DDP control + RDMAP control */
        unsigned have;  /* bytes of hdr gathered */
        size_t skip;    /* bytes of the current FPDU still to pass */
        bool terminate;
};

static void outbound_feed(struct outbound *o, const uint8_t *p, size_t n)
{
        while (n) {
                if (o->skip) {
                        size_t k = o->skip < n ? o->skip : n;
                        o->skip -= k;
                        p += k;
                        n -= k;
                        continue;
                }
                o->hdr[o->have++] = *p++;
                n--;
                if (o->have < sizeof(o->hdr))
                        continue;
                size_t ulpdu = (size_t)o->hdr[0] << 8 | o->hdr[1];
                if (ulpdu < DW_DDP_TAGGED_HDR_LEN ||
                    (o->hdr[2] & DW_DDP_CTRL_DV) != DW_DDP_VERSION ||
                    (o->hdr[3] >> 6) != DW_RDMAP_VERSION) {
                        fprintf(stderr, "fuzz_rc_rx: malformed outbound FPDU\n");
                        abort();
                }
                if ((o->hdr[3] & DW_RDMAP_CTRL_OPCODE) == DW_RDMAP_TERMINATE)
                        o->terminate = true;
                o->skip = dw_mpa_fpdu_len(ulpdu, true) - sizeof(o->hdr);
                o->have = 0;
        }
}

static void drain_peer(int fd, struct outbound *o)
{
        uint8_t buf[16384];
        for (;;) {
                ssize_t r = read(fd, buf, sizeof(buf));
                if (r <= 0)
                        return;
                outbound_feed(o, buf, (size_t)r);
        }
}

/* Rewrites the CRC of every whole FPDU of p (framing as the receiver sees
 * it: ULPDU_Length, ULPDU, pad, CRC); stops at the first partial one. */
static void fix_crcs(uint8_t *p, size_t n)
{
        size_t off = 0;
        while (n - off >= DW_MPA_HDR_LEN) {
                size_t ulpdu = (size_t)p[off] << 8 | p[off + 1];
                size_t total = dw_mpa_fpdu_len(ulpdu, true);
                if (total > n - off)
                        return;
                uint32_t c = dw_crc32c(p + off, total - DW_MPA_CRC_LEN);
                uint8_t *t = p + off + total - DW_MPA_CRC_LEN;
                t[0] = (uint8_t)c;
                t[1] = (uint8_t)(c >> 8);
                t[2] = (uint8_t)(c >> 16);
                t[3] = (uint8_t)(c >> 24);
                off += total;
        }
}

static void check_wc(const struct diwarp_wc *wc)
{
        if (S.verbose)
                fprintf(stderr, "wc wr_id %#llx status %d opcode %d len %u\n",
                        (unsigned long long)wc->wr_id, wc->status, wc->opcode, wc->byte_len);
        if (wc->status == DIWARP_WC_SUCCESS) {
                static const uint32_t rlen[3] = {256, 256, 1024};
                if (wc->wr_id >= 0x100 && wc->wr_id <= 0x102 &&
                    wc->byte_len > rlen[wc->wr_id - 0x100])
                        abort();
                if (wc->wr_id == 0x200 && wc->byte_len != READ_LEN)
                        abort();
        }
        if (wc->wr_id != 0x200 && wc->wr_id != 0x201 && (wc->wr_id < 0x100 || wc->wr_id > 0x102))
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (!S.ready)
                setup();
        if (size < 1)
                return 0;
        static const size_t piece[8] = {SIZE_MAX, 1, 3, 16, 61, 256, 1024, 4096};
        bool crc = data[0] & 1, rtr = data[0] & 2;
        size_t chunk = piece[(data[0] >> 3) & 7];
        if ((size - 1) / chunk > STEP_MAX / 2)
                return 0;
        memcpy(S.arena, S.pattern, arena_len());
        struct diwarp_qp *qp = make_qp(rtr);
        post_work(qp);

        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
                abort();
        struct dw_qp *q = dw_qp_of(qp);
        struct dw_device *dev = q->dev;
        struct dw_mpa_conn mc;
        memset(&mc, 0, sizeof(mc));
        mc.crc = crc;
        mc.initiator = true;
        mc.ird = mc.ord = 4;
        mc.peer_ird = mc.peer_ord = 4;
        struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(1)};
        peer.sin_addr.s_addr = htonl(0x7f000001);
        pthread_mutex_lock(&dev->lock);
        int r = dw_rc_handover(q, &(struct dw_rc_stream){.fd = sv[0], .mc = &mc, .peer = &peer},
                               DW_RC_SETUP_ATTACH);
        pthread_mutex_unlock(&dev->lock);
        if (r < 0)
                abort();

        struct outbound o = {0};
        const uint8_t *p = data + 1;
        size_t left = size - 1;
        uint8_t *fixed = NULL;
        if (crc && (data[0] & 4) && left) {
                fixed = malloc(left);
                if (!fixed)
                        abort();
                memcpy(fixed, p, left);
                fix_crcs(fixed, left);
                p = fixed;
        }
        int idle = 0, step;
        for (step = 0; step < STEP_MAX && idle < 3; step++) {
                if (left) {
                        ssize_t w = write(sv[1], p, left < chunk ? left : chunk);
                        if (w > 0) {
                                p += w;
                                left -= (size_t)w;
                        }
                }
                int work = diwarp_progress(S.dev, 64);
                drain_peer(sv[1], &o);
                int unread = 0;
                if (q->rc->fd >= 0 && ioctl(q->rc->fd, FIONREAD, &unread) < 0)
                        abort();
                /* In ERR the engine stops reading on purpose. */
                bool done = diwarp_qp_state(qp) == DIWARP_QPS_ERR || (!left && unread == 0);
                idle = (work == 0 && done) ? idle + 1 : 0;
        }
        enum diwarp_qp_state st = diwarp_qp_state(qp);
        struct diwarp_counters ctr;
        diwarp_qp_counters(qp, &ctr);
        if (S.verbose)
                fprintf(stderr,
                        "state %d after %d steps, %zu bytes unwritten, term out %d in %llu\n", st,
                        step, left, o.terminate, (unsigned long long)ctr.terminates_received);
        if (st == DIWARP_QPS_ERR) {
                if (!o.terminate && ctr.terminates_received == 0) {
                        fprintf(stderr, "fuzz_rc_rx: QP in ERR without a Terminate\n");
                        abort();
                }
        } else if (left || idle < 3) {
                fprintf(stderr, "fuzz_rc_rx: engine stopped reading the stream (state %d)\n", st);
                abort();
        }

        diwarp_qp_destroy(qp);
        close(sv[1]);
        free(fixed);
        struct diwarp_wc wc[16];
        int n;
        while ((n = diwarp_cq_poll(S.cq, 16, wc)) > 0)
                for (int i = 0; i < n; i++)
                        check_wc(&wc[i]);

        for (int k = 0; k < S.nfixed; k++)
                if (memcmp(S.arena + S.fixed_off[k], S.pattern + S.fixed_off[k], S.fixed_len[k])) {
                        fprintf(stderr, "fuzz_rc_rx: unwritable arena bytes %zu..%zu changed\n",
                                S.fixed_off[k], S.fixed_off[k] + S.fixed_len[k] - 1);
                        abort();
                }
        /* A Send with Invalidate may have invalidated an MR: back to valid
         * so every input starts alike. */
        for (int i = 0; i < NREG; i++)
                dw_mr_lookup(&dev->mrs, S.stag[i])->valid = true;
        return 0;
}
