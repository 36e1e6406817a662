/* diwarpctl: talks to the host daemon diwarpd for the `diwarp` command:
 * `diwarp stat`, `diwarp daemon status` and `diwarp daemon stop`. `stat`
 * also lists every process of the host that drives its own devices, from
 * what each publishes in /dev/shm (libdiwarp/qp/stat_shm.h). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diwarp/diwarp.h>

#include "client/client.h"
#include "ipc/ipc.h"
#include "qp/stat_shm.h"
#include "util/time.h"

static const struct {
        const char *name;
        size_t off;
} counter_names[] = {
    {"tx_packets", offsetof(struct diwarp_counters, tx_packets)},
    {"tx_bytes", offsetof(struct diwarp_counters, tx_bytes)},
    {"rx_packets", offsetof(struct diwarp_counters, rx_packets)},
    {"rx_bytes", offsetof(struct diwarp_counters, rx_bytes)},
    {"retransmits", offsetof(struct diwarp_counters, retransmits)},
    {"crc_errors", offsetof(struct diwarp_counters, crc_errors)},
    {"rx_dropped_malformed", offsetof(struct diwarp_counters, rx_dropped_malformed)},
    {"rx_dropped_no_qp", offsetof(struct diwarp_counters, rx_dropped_no_qp)},
    {"rx_dropped_qkey", offsetof(struct diwarp_counters, rx_dropped_qkey)},
    {"rx_dropped_no_recv", offsetof(struct diwarp_counters, rx_dropped_no_recv)},
    {"rx_dropped_duplicate", offsetof(struct diwarp_counters, rx_dropped_duplicate)},
    {"rx_dropped_protection", offsetof(struct diwarp_counters, rx_dropped_protection)},
    {"rnr_naks", offsetof(struct diwarp_counters, rnr_naks)},
    {"credit_stalls", offsetof(struct diwarp_counters, credit_stalls)},
    {"tx_backpressure", offsetof(struct diwarp_counters, tx_backpressure)},
    {"fault_dropped", offsetof(struct diwarp_counters, fault_dropped)},
    {"fault_duplicated", offsetof(struct diwarp_counters, fault_duplicated)},
    {"fault_reordered", offsetof(struct diwarp_counters, fault_reordered)},
    {"fault_corrupted", offsetof(struct diwarp_counters, fault_corrupted)},
    {"fault_delayed", offsetof(struct diwarp_counters, fault_delayed)},
    {"terminates_sent", offsetof(struct diwarp_counters, terminates_sent)},
    {"terminates_received", offsetof(struct diwarp_counters, terminates_received)},
    {"rx_placed_direct", offsetof(struct diwarp_counters, rx_placed_direct)},
    {"inflight_waits", offsetof(struct diwarp_counters, inflight_waits)},
    {"cc_decrease_delay", offsetof(struct diwarp_counters, cc_decrease_delay)},
    {"cc_decrease_loss", offsetof(struct diwarp_counters, cc_decrease_loss)},
    {"cc_rto", offsetof(struct diwarp_counters, cc_rto)},
    {"cc_window_waits", offsetof(struct diwarp_counters, cc_window_waits)},
    {"cc_pacing_waits", offsetof(struct diwarp_counters, cc_pacing_waits)},
    {"pulls", offsetof(struct diwarp_counters, pulls)},
    {"pull_bytes", offsetof(struct diwarp_counters, pull_bytes)},
    {"fault_slowrx_waits", offsetof(struct diwarp_counters, fault_slowrx_waits)},
    {"rx_dropped_nocrc", offsetof(struct diwarp_counters, rx_dropped_nocrc)},
    {"rx_dropped_nak", offsetof(struct diwarp_counters, rx_dropped_nak)},
    {"rx_dropped_msn", offsetof(struct diwarp_counters, rx_dropped_msn)},
    {"mbox_parked", offsetof(struct diwarp_counters, mbox_parked)},
    {"credit_msgs", offsetof(struct diwarp_counters, credit_msgs)},
    {"credit_probes", offsetof(struct diwarp_counters, credit_probes)},
    {"local_copies", offsetof(struct diwarp_counters, local_copies)},
    {"local_copy_bytes", offsetof(struct diwarp_counters, local_copy_bytes)},
    {"progress_takeovers", offsetof(struct diwarp_counters, progress_takeovers)},
    {"progress_park_wakes", offsetof(struct diwarp_counters, progress_park_wakes)},
    {"progress_nap_drives", offsetof(struct diwarp_counters, progress_nap_drives)},
    {"progress_timer_wakes", offsetof(struct diwarp_counters, progress_timer_wakes)},
    {"rx_dropped_token", offsetof(struct diwarp_counters, rx_dropped_token)},
    {"rx_dropped_rail", offsetof(struct diwarp_counters, rx_dropped_rail)},
    {"rx_dropped_peers", offsetof(struct diwarp_counters, rx_dropped_peers)},
    {"rd_peers_reclaimed", offsetof(struct diwarp_counters, rd_peers_reclaimed)},
    {"rx_dropped_auth", offsetof(struct diwarp_counters, rx_dropped_auth)},
};

static const char *qp_type_str(uint32_t t)
{
        switch (t) {
        case DIWARP_QPT_RC:
                return "RC";
        case DIWARP_QPT_UC:
                return "UC";
        case DIWARP_QPT_UD:
                return "UD";
        case DIWARP_QPT_RD:
                return "RD";
        default:
                return "?";
        }
}

static const char *qp_state_str(uint32_t s)
{
        static const char *const n[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
        return s < sizeof(n) / sizeof(n[0]) ? n[s] : "?";
}

/* As `rdma statistic` prints a link: name value pairs on one line (counters
 * at zero left out unless all). */
static void print_counters(const struct diwarp_counters *ctr, bool all)
{
        for (size_t i = 0; i < sizeof(counter_names) / sizeof(counter_names[0]); i++) {
                uint64_t v;
                memcpy(&v, (const char *)ctr + counter_names[i].off, sizeof(v));
                if (v || all)
                        printf(" %s %llu", counter_names[i].name, (unsigned long long)v);
        }
        printf("\n");
}

static void print_qp(const struct diwarpdv_qp_stat *x)
{
        char peer[64] = "-";
        const uint8_t *g = x->peer.raw;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        /* A QPN of 0 is unknown, not QP 0: an rdma_cm (iWARP) connection
         * learns its peer's address but no QPN (MPA carries none). */
        char qpn[16] = "-";
        if (x->peer_qpn)
                snprintf(qpn, sizeof(qpn), "0x%06x", x->peer_qpn);
        if (!memcmp(g, v4, 12) && (g[12] | g[13] | g[14] | g[15]))
                snprintf(peer, sizeof(peer), "%u.%u.%u.%u/%s", g[12], g[13], g[14], g[15], qpn);
        printf("qp 0x%06x pid %d type %s state %s peer %s tx_packets %llu tx_bytes %llu "
               "rx_packets %llu rx_bytes %llu retransmits %llu rnr_naks %llu\n",
               x->qpn, x->pid, qp_type_str(x->type), qp_state_str(x->state), peer,
               (unsigned long long)x->tx_packets, (unsigned long long)x->tx_bytes,
               (unsigned long long)x->rx_packets, (unsigned long long)x->rx_bytes,
               (unsigned long long)x->retransmits, (unsigned long long)x->rnr_naks);
}

static int daemon_stat(bool all)
{
        struct dw_ipc_stat_rsp *st = calloc(1, sizeof(*st));
        if (!st)
                return 1;
        int err = dwc_daemon_stat(st);
        if (err < 0) {
                fprintf(stderr, "diwarp stat: no daemon answers: %s\n", strerror(-err));
                free(st);
                return 3;
        }
        printf("daemon pid %d: %u client%s, %u server%s, %llu wake-ups, %llu requests "
               "(%llu rejected)\n",
               st->daemon_pid, st->nclients, st->nclients == 1 ? "" : "s", st->nservers,
               st->nservers == 1 ? "" : "s", (unsigned long long)st->wakeups,
               (unsigned long long)st->requests, (unsigned long long)st->rejected);
        printf("link diwarp0/1");
        print_counters(&st->dev, all);
        uint32_t shown = st->nclients < DW_IPC_STAT_MAX ? st->nclients : DW_IPC_STAT_MAX;
        for (uint32_t i = 0; i < shown; i++) {
                const struct dw_ipc_stat_client *c = &st->c[i];
                printf("client pid %d server %u qps %u cqs %u mrs %u mr_bytes %llu pds %u "
                       "posted_send %llu posted_recv %llu completions %llu\n",
                       c->pid, c->server, c->nqp, c->ncq, c->nmr, (unsigned long long)c->mr_bytes,
                       c->npd, (unsigned long long)c->posted_send,
                       (unsigned long long)c->posted_recv, (unsigned long long)c->completions);
        }
        free(st);
        struct dw_ipc_stat_qps_rsp *q = calloc(1, sizeof(*q));
        if (!q)
                return 1;
        for (uint32_t first = 0;; first += q->n) {
                memset(q, 0, sizeof(*q));
                if (dwc_daemon_stat_qps(first, q) < 0 || q->n == 0)
                        break;
                for (uint32_t i = 0; i < q->n; i++)
                        print_qp(&q->q[i]);
                if (first + q->n >= q->total)
                        break;
        }
        free(q);
        return 0;
}

/* One device of a process that drives its own (published in /dev/shm,
 * libdiwarp/qp/stat_shm.h): a process line, its link counters, its rails
 * when several, its QPs. */
static void print_process(const struct dw_stat_dev *d, void *ctx)
{
        bool all = *(const bool *)ctx;
        char addrs[DIWARP_MAX_GIDS * 16 + 1] = "";
        size_t o = 0;
        for (uint32_t i = 0; i < d->ngid && i < DIWARP_MAX_GIDS && o < sizeof(addrs); i++) {
                const uint8_t *b = (const uint8_t *)&d->gid_addr[i];
                o += (size_t)snprintf(addrs + o, sizeof(addrs) - o, "%s%u.%u.%u.%u", i ? "," : "",
                                      b[0], b[1], b[2], b[3]);
        }
        double age = (double)(dw_now_ns() - d->updated_ns) / 1e9;
        char comm[sizeof(d->comm) + 1];
        snprintf(comm, sizeof(comm), "%.*s", (int)sizeof(d->comm), d->comm);
        printf("process pid %d comm %s instance %u port %u progress %s gids %s qps %u "
               "updated_s_ago %.1f\n",
               d->pid, comm[0] ? comm : "?", d->instance, d->port,
               d->progress_thread ? "thread" : "app", addrs[0] ? addrs : "-", d->nqp, age);
        printf("link diwarp0/1 pid %d", d->pid);
        print_counters(&d->ctr, all);
        for (uint32_t i = 0; d->nrails > 1 && i < d->nrails && i < DIWARP_MAX_RAILS; i++) {
                const struct diwarp_rail_stats *r = &d->rails[i];
                const uint8_t *b = (const uint8_t *)&r->addr;
                printf("rail pid %d index %u addr %u.%u.%u.%u tx_bytes %llu tx_packets %llu "
                       "retransmits %llu downs %llu state %s\n",
                       d->pid, i, b[0], b[1], b[2], b[3], (unsigned long long)r->tx_bytes,
                       (unsigned long long)r->tx_packets, (unsigned long long)r->retransmits,
                       (unsigned long long)r->downs, r->up ? "up" : "down");
        }
        for (uint32_t i = 0; i < d->nqp_shown && i < DW_STAT_MAX_QP; i++)
                print_qp(&d->qp[i]);
        if (d->nqp > d->nqp_shown)
                printf("qp pid %d: %u more not shown\n", d->pid, d->nqp - d->nqp_shown);
}

/* The daemon and its clients (when a daemon answers), then every process on
 * the host that drives its own devices. Exit 3 when no daemon answers (the
 * processes are listed all the same). */
static int stat_cmd(bool all)
{
        int rc = daemon_stat(all);
        fflush(stdout);
        int n = dw_stat_shm_scan(print_process, &all);
        if (n < 0)
                fprintf(stderr, "diwarp stat: /dev/shm: %s\n", strerror(-n));
        return rc;
}

int main(int argc, char **argv)
{
        const char *cmd = argc > 1 ? argv[1] : "";
        if (!strcmp(cmd, "stat"))
                return stat_cmd(argc > 2 && !strcmp(argv[2], "--all"));
        if (!strcmp(cmd, "status")) {
                struct dw_ipc_stat_rsp *st = calloc(1, sizeof(*st));
                int err = st ? dwc_daemon_stat(st) : -ENOMEM;
                if (err == 0)
                        printf("diwarpd running: pid %d, %u client%s\n", st->daemon_pid,
                               st->nclients, st->nclients == 1 ? "" : "s");
                else
                        printf("diwarpd not running (%s)\n", strerror(-err));
                free(st);
                return err == 0 ? 0 : 3;
        }
        if (!strcmp(cmd, "stop")) {
                int err = dwc_daemon_shutdown();
                if (err < 0) {
                        fprintf(stderr, "diwarp daemon stop: %s\n", strerror(-err));
                        return 3;
                }
                return 0;
        }
        fprintf(stderr, "usage: diwarpctl stat [--all] | status | stop\n");
        return 2;
}
