/* Each device of a process published for `diwarp stat`, the way the kernel's
 * devices are for `rdma statistic`: a small shared-memory object per device,
 * /dev/shm/diwarp-stat-<euid>-<pid>-<instance>, created by the process
 * (O_EXCL, mode 0600: only its user and root can read it), written only by
 * it, removed when the device closes. The owner refreshes it from the
 * progress engine at most every DW_STAT_PERIOD_NS (on a step that already
 * reads the coarse clock: nothing on the per-message path) and at open;
 * counters, QP states and rails are what they were then.
 *
 * Readers (tools/diwarpctl.c) map it read-only and copy it under its
 * sequence count (odd while the owner writes). An object whose PID runs no
 * process (a killed program) is skipped and, when it is the reader's own
 * user's, removed.
 */
#ifndef DIWARP_QP_STAT_SHM_H
#define DIWARP_QP_STAT_SHM_H

#include <stdatomic.h>
#include <stdint.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#define DW_STAT_MAGIC     0x54535744u /* "DWST" */
#define DW_STAT_VERSION   1u
#define DW_STAT_MAX_QP    64u
#define DW_STAT_PREFIX    "diwarp-stat-"
#define DW_STAT_PERIOD_NS (250ull * 1000 * 1000)

struct dw_stat_dev {
        uint32_t magic, version, size;
        int32_t pid;
        _Atomic uint32_t seq; /* odd while the owner writes */
        uint32_t instance, port;
        uint32_t ngid, nrails;
        uint32_t nqp;                       /* QPs of the device */
        uint32_t nqp_shown;                 /* in qp[] (the first DW_STAT_MAX_QP by QPN) */
        uint32_t progress_thread;           /* the device's progress thread runs */
        uint32_t gid_addr[DIWARP_MAX_GIDS]; /* IPv4, network order */
        char comm[16];                      /* the program's name */
        uint64_t updated_ns;                /* CLOCK_MONOTONIC of the last refresh */
        struct diwarp_counters ctr;         /* as diwarp_device_counters */
        struct diwarp_rail_stats rails[DIWARP_MAX_RAILS];
        struct diwarpdv_qp_stat qp[DW_STAT_MAX_QP];
};

struct dw_device;

/* Owner side. open: creates and fills the object (a failure only logs at
 * info level: the device works without it). publish: refreshes it, device
 * lock held. close: unmaps and removes it. */
void dw_stat_shm_open(struct dw_device *dev);
void dw_stat_shm_publish(struct dw_device *dev);
void dw_stat_shm_close(struct dw_device *dev);

/* Reader side: calls cb with a consistent copy of every live process's
 * device this user may read, oldest PID first is not promised. Objects of
 * dead PIDs are skipped (removed when ours). Returns how many were
 * reported, or -errno when /dev/shm cannot be read. */
int dw_stat_shm_scan(void (*cb)(const struct dw_stat_dev *d, void *ctx), void *ctx);

#endif
