/* `--nice auto`: the daemon's priority follows the load that is not its own.
 *
 * The daemon is its host's progress engine, as the kernel's softirqs are
 * TCP's. Beside CPU-bound programs that are not its clients it needs a
 * higher priority (its servers otherwise wait for their core, and every
 * client's ACKs and timers with them); beside its own busy-polling clients
 * the same priority costs them (it preempts them at every wake-up). So in
 * auto mode the acceptor samples, every DD_GOV_TICK_NS, the host's CPU time
 * (/proc/stat: user, nice and system; interrupts and steal are nobody's
 * program) against the daemon's own and its clients' (/proc/PID/stat), and
 * raises the daemon to its boost nice while the rest, the unrelated load,
 * holds at least DD_GOV_ON_CORES for DD_GOV_ON_TICKS samples in a row; it
 * goes back to the nice it started with once that load stayed below
 * DD_GOV_OFF_CORES for DD_GOV_OFF_TICKS samples. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <diwarp/diwarpdv.h>

#include "daemon/daemon.h"

#define DD_GOV_ON_CORES  0.5
#define DD_GOV_ON_TICKS  2
#define DD_GOV_OFF_CORES 0.25
#define DD_GOV_OFF_TICKS 8

/* user + nice + system of the "cpu" line, in clock ticks; 0 when unread. */
static uint64_t host_busy_ticks(void)
{
        FILE *f = fopen("/proc/stat", "re");
        if (!f)
                return 0;
        unsigned long long user = 0, nice = 0, sys = 0;
        int n = fscanf(f, "cpu %llu %llu %llu", &user, &nice, &sys);
        fclose(f);
        return n == 3 ? user + nice + sys : 0;
}

/* utime + stime of a process (all its threads), in clock ticks, and when it
 * started (*start, to tell a reused pid); -1 when it is gone. The command
 * name in field 2 may hold spaces and parentheses: the fields after it
 * start past its last ')'. */
static int64_t proc_ticks(int32_t pid, uint64_t *start)
{
        char path[40], buf[1024];
        if (pid)
                snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        else
                snprintf(path, sizeof(path), "/proc/self/stat");
        FILE *f = fopen(path, "re");
        if (!f)
                return -1;
        size_t got = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[got] = 0;
        char *p = strrchr(buf, ')');
        unsigned long long ut, st, born;
        /* state ppid pgrp session tty tpgid flags minflt cminflt majflt
         * cmajflt utime stime cutime cstime priority nice num_threads
         * itrealvalue starttime */
        if (!p || sscanf(p + 1,
                         " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d "
                         "%*d %*d %llu",
                         &ut, &st, &born) != 3)
                return -1;
        *start = born;
        return (int64_t)(ut + st);
}

/* With the kernel's autogroups on (Debian's default), the tasks of a session
 * share the cores as one group against every other session, whatever their
 * nices: a daemon that leads its own session (`diwarp daemon start` runs it
 * under setsid) then competes through its group's nice, which
 * /proc/self/autogroup sets. A daemon in somebody else's session leaves that
 * session's group alone. */
static int set_autogroup(int nice)
{
        if (getsid(0) != getpid())
                return 0;
        FILE *f = fopen("/proc/self/autogroup", "we");
        if (!f)
                return 0; /* no autogroups in this kernel */
        /* A refusal is the thread's (EACCES without CAP_SYS_NICE). */
        int r = fprintf(f, "%d", nice);
        return fclose(f) != 0 || r < 0 ? -errno : 0;
}

int dd_nice_apply(int nice)
{
        DIR *d = opendir("/proc/self/task");
        if (!d)
                return -errno;
        int err = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
                int tid = atoi(e->d_name);
                if (tid > 0 && setpriority(PRIO_PROCESS, (id_t)tid, nice) < 0 && !err)
                        err = -errno;
        }
        closedir(d);
        int ag = set_autogroup(nice);
        return err ? err : ag;
}

void dd_gov_init(struct dd_gov *g, int base, int boost)
{
        memset(g, 0, sizeof(*g));
        g->on = true;
        g->base = g->now = base;
        g->boost = boost;
        g->hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
}

void dd_gov_client(struct dd_gov *g, int32_t pid)
{
        if (!g->on)
                return;
        for (int i = 0; i < g->nclients; i++)
                if (g->client[i].pid == pid)
                        return;
        if (g->nclients == DD_GOV_CLIENTS)
                return; /* beyond: their time counts as unrelated (a boost errs safe) */
        uint64_t born = 0;
        int64_t t = proc_ticks(pid, &born);
        if (t < 0)
                return;
        g->client[g->nclients++] = (struct dd_gov_pid){pid, (uint64_t)t, born};
}

/* The own processes' ticks since the last sample: the daemon's and its
 * clients' (one that is gone, or whose pid now names another process,
 * leaves the list). */
static uint64_t own_ticks_since(struct dd_gov *g)
{
        uint64_t sum = 0, born;
        int64_t self = proc_ticks(0, &born);
        if (self >= 0) {
                sum += (uint64_t)self - g->self_ticks;
                g->self_ticks = (uint64_t)self;
        }
        for (int i = 0; i < g->nclients;) {
                int64_t t = proc_ticks(g->client[i].pid, &born);
                if (t < 0 || born != g->client[i].born) {
                        g->client[i] = g->client[--g->nclients];
                        continue;
                }
                if ((uint64_t)t >= g->client[i].ticks)
                        sum += (uint64_t)t - g->client[i].ticks;
                g->client[i].ticks = (uint64_t)t;
                i++;
        }
        return sum;
}

/* The nice the samples call for, with hysteresis. */
static int gov_decide(struct dd_gov *g, double unrelated)
{
        if (g->now != g->boost) {
                g->over = unrelated >= DD_GOV_ON_CORES ? g->over + 1 : 0;
                return g->over >= DD_GOV_ON_TICKS ? g->boost : g->now;
        }
        g->under = unrelated < DD_GOV_OFF_CORES ? g->under + 1 : 0;
        return g->under >= DD_GOV_OFF_TICKS ? g->base : g->now;
}

void dd_gov_tick(struct dd_gov *g, uint64_t now_ns)
{
        if (!g->on || now_ns - g->last_ns < DD_GOV_TICK_NS)
                return;
        uint64_t busy = host_busy_ticks();
        if (!busy)
                return; /* unreadable: no sample */
        uint64_t own = own_ticks_since(g);
        bool first = g->last_ns == 0;
        double secs = (double)(now_ns - g->last_ns) / 1e9;
        uint64_t host = busy - g->busy_ticks;
        g->busy_ticks = busy;
        g->last_ns = now_ns;
        if (first)
                return;
        double unrelated = ((double)host - (double)own) / (double)g->hz / secs;
        int want = gov_decide(g, unrelated);
        if (want == g->now)
                return;
        int err = dd_nice_apply(want);
        if (err < 0) {
                diwarpdv_warn("diwarpd: nice auto: cannot take %d (unrelated load %.1f cores): "
                              "%s; stays at %d",
                              want, unrelated, strerror(-err), g->now);
                /* Not allowed now, not later: stop sampling. */
                dd_nice_apply(g->now);
                g->on = false;
                return;
        }
        diwarpdv_info("diwarpd: nice auto: %d -> %d (load not the daemon's or its clients': "
                      "%.1f cores)",
                      g->now, want, unrelated);
        g->now = want;
        g->over = g->under = 0;
}
