/* diwarpdv: diwarp-specific extensions of the native API (as efadv/mlx5dv
 * extend ibverbs). Include after <diwarp/diwarp.h>.
 *
 * ---- Reliable-datagram (RD) queue pairs ----------------------------------
 *
 * An RD QP is connectionless like UD and reliable like RC: every work request
 * names its destination, and the engine keeps one pseudo-stream per (local
 * QP, remote QP) with sequence numbers, ACK/SACK, retransmission and
 * in-order completion (docs/PROTOCOL.md, "RD over UDP"). All RD QPs of a
 * device share the device's one UDP socket, whatever the number of peers.
 *
 *   create:  diwarpdv_create_qp(pd, &init_attr, &qp)   (= diwarp_qp_create with
 *            init_attr.qp_type = DIWARP_QPT_RD). init_attr.srq may name an
 *            SRQ shared with other QPs (RD, RC, UD) of the device: a Send
 *            from any peer takes its receive WR from it (empty: RNR, the
 *            sender retries), SRQ_LIMIT_REACHED fires as on RC.
 *   states:  RESET -> INIT (DIWARP_QP_QKEY required, DIWARP_QP_ACCESS_FLAGS
 *            optional: the remote rights the QP grants; without it none, as
 *            in ibverbs) -> RTR -> RTS, as UD.
 *   post:    opcodes SEND, SEND_WITH_IMM, SEND_WITH_INV, RDMA_WRITE,
 *            RDMA_WRITE_WITH_IMM, RDMA_READ, ATOMIC_FETCH_AND_ADD,
 *            ATOMIC_CMP_AND_SWP, LOCAL_INV, BIND_MW (a type 2 window, then
 *            served by this QP for every peer; diwarp_mw_bind for type 1;
 *            both through diwarp_post_send only). Addressing is UD-like:
 *            wr.wr.ud.ah (from diwarp_ah_create), wr.wr.ud.remote_qpn and
 *            wr.wr.ud.remote_qkey (high bit set: use the QP's own qkey), posted
 *            with diwarp_post_send. RDMA and atomic WRs need the remote buffer
 *            too, and wr.wr is a union: post them with diwarpdv_post_send_rd,
 *            which takes the destination (ah, remote QPN, qkey) beside the WR
 *            chain and reads wr.wr.rdma / wr.wr.atomic exactly as on RC. It
 *            accepts every opcode but BIND_MW (for Sends the destination
 *            argument wins over wr.wr.ud).
 *   sizes:   messages up to 2 GiB; they are cut into segments that fit the
 *            route's MTU to the peer (at most DIWARP_UDP_MTU; 64 KiB datagrams
 *            over loopback, 1472 bytes over Ethernet) and placed directly by
 *            offset. diwarpdv_query_rd_path tells the size a stream uses.
 *   receive: wc.src_qp is the sender's QPN; no GRH is written (unlike UD).
 *   errors:  a protection violation at the target fails that WR with
 *            DIWARP_WC_REM_ACCESS_ERR (the target answers that peer only and
 *            keeps serving others); a peer that stops answering fails the
 *            oldest WR to it with DIWARP_WC_RETRY_EXC_ERR within
 *            DIWARP_PEER_TIMEOUT_MS, the QP moves to ERR and the rest flush.
 *            A Send that finds no receive posted is parked in the QP's
 *            mailbox ring (its sender held credits for it) and delivered
 *            when one is posted (DIWARP_CREDIT=off: retried with RNR NAKs
 *            until one is, as long as the peer answers).
 *
 * ---- RC carried by RD -----------------------------------------------------
 *
 * With DIWARP_RC_TRANSPORT=rd, RC (and UC) QPs use the same sublayer with one
 * pseudo-stream: ibv_modify_qp to RTR with ah_attr (dgid) + dest_qp_num (and
 * rq_psn; sq_psn at RTS) sets it up, no TCP connection is made. Connection
 * setup through rdma_cm / diwarp_connect is not available in that mode.
 */
#ifndef DIWARP_DIWARPDV_H
#define DIWARP_DIWARPDV_H

#include <stdbool.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a reliable-datagram QP (attr->qp_type is set to DIWARP_QPT_RD). */
int diwarpdv_create_qp(struct diwarp_pd *pd, struct diwarp_qp_init_attr *attr,
                       struct diwarp_qp **out);

/* Destination of RD work requests posted with diwarpdv_post_send_rd. */
struct diwarpdv_rd_dest {
        struct diwarp_ah *ah;
        uint32_t remote_qpn;
        uint32_t remote_qkey; /* high bit set: the QP's own qkey */
};

/* Posts a chain of WRs on an RD QP, all to dest; wr.wr is read as on RC
 * (rdma / atomic). Same return and *bad_wr rules as diwarp_post_send. */
int diwarpdv_post_send_rd(struct diwarp_qp *qp, struct diwarp_send_wr *wr,
                          const struct diwarpdv_rd_dest *dest, struct diwarp_send_wr **bad_wr);

/* Datagram sizes of one pseudo-stream (diwarpdv_query_rd_path). */
struct diwarpdv_rd_path {
        /* Largest UDP payload (headers included) the stream sends: the route's
         * MTU when the stream started, less 28 bytes of IPv4 + UDP headers,
         * capped by DIWARP_UDP_MTU. Fixed for the stream's life. */
        uint32_t max_dgram;
        uint32_t seg_payload;  /* message bytes per segment */
        uint32_t dev_max_sent; /* largest RD datagram the device has sent so far */
        /* Congestion control of the path to the peer's device (shared by
         * every stream to that address; docs/USAGE.md, DIWARP_CC). Bytes
         * count datagrams with their IPv4 and UDP headers. */
        uint32_t cwnd;              /* window, bytes */
        uint32_t inflight;          /* bytes sent and not yet acknowledged */
        uint32_t min_rtt_ns;        /* the path's minimum RTT (windowed); 0 before a sample */
        uint32_t srtt_ns;           /* smoothed RTT; 0 before a sample */
        uint64_t pacing_bps;        /* pacing rate, bits per second; 0 = not paced */
        uint64_t cc_decrease_delay; /* window decreases: queueing delay over the target */
        uint64_t cc_decrease_loss;  /* window decreases: loss */
        uint64_t cc_rto;            /* window collapses after a retransmission timeout */
        uint64_t cc_window_waits;   /* sends held by a full window */
        uint64_t cc_pacing_waits;   /* sends held by pacing */
        /* This stream's reliability events. */
        uint32_t tail_probes;
        uint32_t rto_expiries;
        uint32_t fast_retransmits;
        uint32_t retransmits;
};

/* ---- Application mailbox (the credit-based receive ring, in the spirit of
 * FI_MULTI_RECV and mlx5's striding RQ) -------------------------------------
 *
 * diwarpdv_mbox_open turns an RD QP (RESET or INIT, no receive WR posted, no
 * SRQ; DIWARP_CREDIT not off) into a mailbox: it takes no receive WRs
 * (diwarp_post_recv fails with -EINVAL), and every Send to it lands in the
 * QP's ring, out->slots slots of out->slot_size bytes (DIWARP_CREDIT_RING,
 * DIWARP_CREDIT_SLOT; the product a multiple of the page size) shared by its
 * senders under the credit protocol. A message takes consecutive slots and is
 * contiguous in memory even across the end of the ring (the ring is mapped
 * twice in a row). Its receive completion carries wr_id = the message's
 * address (a uint8_t * inside [out->ring, out->ring + 2 * out->len)),
 * byte_len, src_qp and Immediate Data, in order per sender. A Send with
 * Invalidate invalidates its STag as it completes: DIWARP_WC_WITH_INV and
 * invalidated_rkey (DIWARP_WC_REM_INV_REQ_ERR if the STag can no longer be
 * invalidated; the message is still to be released). The application
 * reads it in place, then gives its slots back with diwarpdv_mbox_release:
 * slots return to the senders as credits in ring order, so a message never
 * released holds back the slots behind it.
 *
 * A message must fit one datagram of the path and out->max_msg bytes (the
 * quota): a longer Send is refused (the sender's WR fails with
 * DIWARP_WC_REM_INV_REQ_ERR). RDMA Write with Immediate needs a receive WR and
 * is not taken. A reset of the QP unmaps the ring: open it again after. */
struct diwarpdv_mbox {
        void *ring;         /* the ring, mapped twice: ring + i and ring + len + i are one byte */
        size_t len;         /* slots * slot_size */
        uint32_t slot_size; /* bytes */
        uint32_t slots;
        uint32_t max_msg; /* largest Send it takes (and one datagram of the path) */
};
int diwarpdv_mbox_open(struct diwarp_qp *qp, struct diwarpdv_mbox *out);
/* Gives back the slots of a message the mailbox handed out (its wr_id);
 * -EINVAL if msg is not one, or was released already. */
int diwarpdv_mbox_release(struct diwarp_qp *qp, const void *msg);

/* The path of qp's pseudo-stream to dest (RC over RD: dest NULL, the QP's one
 * peer). -ENOENT when that stream does not exist yet (nothing was sent to or
 * received from it), -EINVAL on bad arguments. */
int diwarpdv_query_rd_path(struct diwarp_qp *qp, const struct diwarpdv_rd_dest *dest,
                           struct diwarpdv_rd_path *out);

/* ---- A QP as `diwarp stat` lists it ---------------------------------------
 *
 * One QP's line: who owns it, what it is, its peer and its traffic. The host
 * daemon answers `diwarp stat` with these for its clients' QPs, and every
 * process publishes them for its own devices (docs/USAGE.md, "diwarp stat");
 * both fill them through diwarpdv_qp_stat. */
struct diwarpdv_qp_stat {
        int32_t pid;               /* the process that owns the QP */
        uint32_t qpn, type, state; /* enum diwarp_qp_type, enum diwarp_qp_state */
        uint32_t peer_qpn;         /* RC/UC: the connected QP; 0 unknown */
        union diwarp_gid peer;     /* its GID; zero for UD and RD (a peer per WR) */
        uint64_t tx_packets, tx_bytes, rx_packets, rx_bytes, retransmits, rnr_naks;
};
/* Fills out for qp now; pid is the calling process. -EINVAL on bad arguments. */
int diwarpdv_qp_stat(struct diwarp_qp *qp, struct diwarpdv_qp_stat *out);

/* ---- The library's log and clock ------------------------------------------
 *
 * diwarp writes what it has to say to stderr, one line each, "diwarp:
 * <level>: <message>", with one write(2) (lines of several threads never
 * mix; a message over 1 KiB is cut), for the levels up to the threshold
 * DIWARP_LOG sets (error, warn: the default, info, debug; docs/USAGE.md). A
 * program built on the library (its daemon, its verbs provider) writes its
 * own lines through these calls, so that one setting governs them all. Any
 * thread. */
enum diwarpdv_log_level {
        DIWARPDV_LOG_ERROR = 0,
        DIWARPDV_LOG_WARN = 1,
        DIWARPDV_LOG_INFO = 2,
        DIWARPDV_LOG_DEBUG = 3,
};
/* Whether lines at level are written now. */
bool diwarpdv_log_enabled(int level);
/* Writes one line at level if lines at level are written (a level out of
 * range counts as the nearest one). */
void diwarpdv_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sets the threshold from DIWARP_LOG now (a device's opening does too):
 * 0, or -EINVAL for a value it does not know (the threshold unchanged). */
int diwarpdv_log_from_env(void);

/* A rate limit for lines that others can cause as often as they like (a
 * peer's datagrams, a client's requests): the first DIWARPDV_LOG_LIMIT_BURST
 * lines of each DIWARPDV_LOG_LIMIT_PERIOD_S seconds go out; the rest are
 * counted, and the first line let through in a later period is preceded by
 * one saying how many were suppressed. One limiter per kind of line, zeroed
 * to start; the caller serializes the calls on one limiter. */
#define DIWARPDV_LOG_LIMIT_BURST    10u
#define DIWARPDV_LOG_LIMIT_PERIOD_S 5u
struct diwarpdv_log_limit {
        uint64_t period_start;     /* ns (diwarpdv_now_ns); 0: no line yet */
        uint32_t passed;           /* lines let through in this period */
        uint32_t suppressed;       /* lines held back since the last report */
        uint64_t total_suppressed; /* lines held back in all */
};
/* Whether the next line may go out now (it is counted either way); writes
 * the report of suppressed lines first, at level, when one is due. */
bool diwarpdv_log_limit_pass(struct diwarpdv_log_limit *l, int level);

/* Formats only lines that are written. */
#define diwarpdv_log_at(level, ...)                                                                \
        do {                                                                                       \
                if (diwarpdv_log_enabled(level))                                                   \
                        diwarpdv_log(level, __VA_ARGS__);                                          \
        } while (0)
#define diwarpdv_err(...)  diwarpdv_log_at(DIWARPDV_LOG_ERROR, __VA_ARGS__)
#define diwarpdv_warn(...) diwarpdv_log_at(DIWARPDV_LOG_WARN, __VA_ARGS__)
#define diwarpdv_info(...) diwarpdv_log_at(DIWARPDV_LOG_INFO, __VA_ARGS__)
#define diwarpdv_dbg(...)  diwarpdv_log_at(DIWARPDV_LOG_DEBUG, __VA_ARGS__)
/* diwarpdv_warn through a limiter; nothing is formatted for a line held back. */
#define diwarpdv_warn_limited(limit, ...)                                                          \
        do {                                                                                       \
                if (diwarpdv_log_enabled(DIWARPDV_LOG_WARN) &&                                     \
                    diwarpdv_log_limit_pass((limit), DIWARPDV_LOG_WARN))                           \
                        diwarpdv_log(DIWARPDV_LOG_WARN, __VA_ARGS__);                              \
        } while (0)

/* CLOCK_MONOTONIC in nanoseconds: the clock of the library's timers and of
 * completion timestamps (diwarp_wc.ts_ns). vDSO: no system call. */
uint64_t diwarpdv_now_ns(void);

/* ---- Where the engine runs ------------------------------------------------
 *
 * A process's calls of the API run the engine in the process, or, with
 * DIWARP_PROGRESS=daemon, go to the host daemon (diwarpd), which runs it for
 * its clients; the choice is made once, at the process's first call.
 * diwarpdv_engine_only makes it now, for the engine, whatever the environment
 * says: for a program that runs the engine for others (diwarpd itself) and
 * must never become a client of a daemon. Call it before any other call of
 * the API; any thread. 0 when the process runs the engine (again: calling it
 * twice is harmless), -EBUSY when an earlier call made the process a daemon
 * client already (then it stays one). */
int diwarpdv_engine_only(void);

/* ---- Driving a device from the caller's own loop -------------------------
 *
 * A program that sleeps in an epoll set of its own (diwarpd's servers) can
 * drive a device itself instead of a progress thread and without a thread
 * per device:
 *
 *   fd = diwarpdv_external_progress(dev);   once, before anything starts the
 *        device's progress thread: the device's epoll set (its UDP socket,
 *        RC streams, listeners, wake-ups), to watch for EPOLLIN from the
 *        caller's set. From then on the device never gets a progress thread:
 *        diwarp_progress_thread_start and diwarp_comp_channel_create answer
 *        -EBUSY. The fd is the device's; do not close it.
 *   before each sleep: diwarpdv_external_timeout(dev, &ns) bounds it by the
 *        device's earliest timer (retransmissions, delayed ACKs, pacing:
 *        ns from now, 0 = due; -1 = no timer).
 *   when fd is ready or the time has come: diwarpdv_external_run(dev) handles
 *        the set's ready events and the due timers (one step, no waiting).
 *
 * Each call takes the device lock, so other threads may use the device's
 * objects meanwhile (diwarp_post_send, diwarp_cq_poll ...); drive a device
 * from one loop. Errors: -EINVAL for a NULL device, and from _timeout and
 * _run for a device diwarpdv_external_progress did not take;
 * diwarpdv_external_progress: -EBUSY when the device's progress thread runs
 * (DIWARP_PROGRESS=thread, a completion channel, diwarp_progress_thread_start);
 * all three -EOPNOTSUPP in a daemon client's process (DIWARP_PROGRESS=daemon:
 * the daemon drives its devices). */
int diwarpdv_external_progress(struct diwarp_device *dev);
int diwarpdv_external_timeout(struct diwarp_device *dev, int64_t *ns);
/* Returns the number of the set's events handled (>= 0). */
int diwarpdv_external_run(struct diwarp_device *dev);

/* Asks the kernel for the shortest time slice (100 us) for the calling
 * thread, so that its wake-ups preempt a busy-polling thread on its core at
 * once (EEVDF's slices, Linux >= 6.12): for a thread that polls and then
 * sleeps on a host with more busy threads than cores (the progress thread
 * asks for it too). 0 when the kernel took the request (a kernel without
 * slices may take it and ignore it), -EOPNOTSUPP when it has no such request
 * or the thread's policy is not SCHED_OTHER; harmless either way. */
int diwarpdv_short_time_slice(void);

/* How long the calling thread has waited for a core so far, in ns: the
 * kernel's run-queue delay (/proc/thread-self/schedstat), which grows only
 * while the thread was runnable and another ran in its place. A thread
 * that compares it over a window with the window's length sees whether it
 * shares its core with busy threads (the progress thread watches an
 * application's poller this way; the daemon's servers stop spinning
 * while theirs grows). -errno when the kernel does not say. */
int64_t diwarpdv_thread_run_delay_ns(void);

/* How the engine and the daemon judge that delay: over a window of at least
 * DIWARPDV_CORE_WINDOW_NS, a thread whose run-queue delay grew by
 * 1/DIWARPDV_CORE_WAIT_SHARE of the window or more (12.5 %) waits for its
 * core. Shorter windows mislead on a VM, whose vCPU stalls of 0.1-0.2 ms
 * look like waits. */
#define DIWARPDV_CORE_WINDOW_NS  10000000ull
#define DIWARPDV_CORE_WAIT_SHARE 8u
static inline bool diwarpdv_waited_for_core(uint64_t waited_ns, uint64_t window_ns)
{
        return waited_ns * DIWARPDV_CORE_WAIT_SHARE >= window_ns;
}

#ifdef __cplusplus
}
#endif

#endif
