/* A device published for `diwarp stat`: see stat_shm.h. */
#define _GNU_SOURCE
#include "qp/stat_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dw.h"
#include "util/log.h"
#include "util/time.h"

/* ---- owner ---------------------------------------------------------------- */

static void refresh(struct dw_device *dev, struct dw_stat_dev *s)
{
        uint32_t seq = atomic_load_explicit(&s->seq, memory_order_relaxed);
        atomic_store_explicit(&s->seq, seq + 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_release);
        s->ngid = (uint32_t)dev->ngid;
        for (int i = 0; i < dev->ngid && i < DIWARP_MAX_GIDS; i++)
                s->gid_addr[i] = dev->gids[i].addr;
        s->progress_thread = dev->prog.started;
        dw_device_counters_locked(dev, &s->ctr);
        int nr = dw_device_rails_locked(dev, s->rails, DIWARP_MAX_RAILS);
        s->nrails = nr < 0 ? 0 : (uint32_t)nr;
        uint32_t shown = 0, seen = 0;
        /* Up to the last QP, not the whole table: a polling step runs this
         * every DW_PROGRESS_HOUSEKEEPING_NS with the device lock held, and a
         * walk of all DW_MAX_QP slots held it for about 40 000 instructions
         * (callgrind) where a program with one QP needs a few hundred. */
        for (uint32_t i = 0; i < DW_MAX_QP && seen < (uint32_t)dev->nqp && shown < DW_STAT_MAX_QP;
             i++)
                if (dev->qps[i]) {
                        seen++;
                        dw_qp_stat_locked(dev->qps[i], &s->qp[shown++]);
                }
        s->nqp = (uint32_t)dev->nqp;
        s->nqp_shown = shown;
        s->updated_ns = dw_now_ns();
        atomic_thread_fence(memory_order_release);
        atomic_store_explicit(&s->seq, seq + 2, memory_order_relaxed);
}

void dw_stat_shm_publish(struct dw_device *dev)
{
        if (dev->stat)
                refresh(dev, dev->stat);
}

void dw_stat_shm_open(struct dw_device *dev)
{
        snprintf(dev->stat_name, sizeof(dev->stat_name), "/" DW_STAT_PREFIX "%u-%d-%u",
                 (unsigned)geteuid(), (int)getpid(), (unsigned)dev->instance);
        int fd = shm_open(dev->stat_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST) {
                /* Left by a killed process whose PID we now have: ours to replace
                 * (shm_unlink fails on another user's object in sticky /dev/shm). */
                if (shm_unlink(dev->stat_name) == 0)
                        fd = shm_open(dev->stat_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        }
        if (fd < 0) {
                dw_info("device port %u: not published for diwarp stat: shm_open(%s): %s",
                        dev->port, dev->stat_name, strerror(errno));
                dev->stat_name[0] = 0;
                return;
        }
        struct dw_stat_dev *s = MAP_FAILED;
        if (ftruncate(fd, sizeof(*s)) == 0)
                s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int err = errno;
        close(fd);
        if (s == MAP_FAILED) {
                dw_info("device port %u: not published for diwarp stat: %s: %s", dev->port,
                        dev->stat_name, strerror(err));
                shm_unlink(dev->stat_name);
                dev->stat_name[0] = 0;
                return;
        }
        s->magic = DW_STAT_MAGIC;
        s->version = DW_STAT_VERSION;
        s->size = sizeof(*s);
        s->pid = (int32_t)getpid();
        s->instance = dev->instance;
        s->port = dev->port;
        char comm[32] = "";
        int cfd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
        if (cfd >= 0) {
                ssize_t n = read(cfd, comm, sizeof(comm) - 1);
                close(cfd);
                comm[n > 0 ? n : 0] = 0;
                comm[strcspn(comm, "\n")] = 0;
        }
        snprintf(s->comm, sizeof(s->comm), "%s", comm);
        refresh(dev, s);
        dev->stat = s;
        dev->prog.housekeeping = dw_stat_shm_publish;
}

void dw_stat_shm_close(struct dw_device *dev)
{
        dev->prog.housekeeping = NULL;
        if (dev->stat)
                munmap(dev->stat, sizeof(*dev->stat));
        dev->stat = NULL;
        if (dev->stat_name[0])
                shm_unlink(dev->stat_name);
        dev->stat_name[0] = 0;
}

/* ---- readers -------------------------------------------------------------- */

/* uid and pid from "diwarp-stat-<uid>-<pid>-<instance>"; false if the name
 * is not one. */
static bool parse_name(const char *name, unsigned *uid, int *pid)
{
        unsigned inst;
        int n = 0;
        if (strncmp(name, DW_STAT_PREFIX, sizeof(DW_STAT_PREFIX) - 1))
                return false;
        name += sizeof(DW_STAT_PREFIX) - 1;
        if (name[0] < '0' || name[0] > '9' ||
            sscanf(name, "%u-%d-%u%n", uid, pid, &inst, &n) != 3 || name[n] != 0)
                return false;
        return *pid > 0;
}

/* A consistent copy of the owner's object, or false (torn too often, or not
 * one of ours). */
static bool copy_snapshot(const struct dw_stat_dev *m, struct dw_stat_dev *out)
{
        for (int tries = 0; tries < 100; tries++) {
                uint32_t a = atomic_load_explicit(&m->seq, memory_order_acquire);
                if (a & 1) {
                        usleep(100);
                        continue;
                }
                memcpy(out, (const void *)m, sizeof(*out));
                atomic_thread_fence(memory_order_acquire);
                if (atomic_load_explicit(&m->seq, memory_order_relaxed) == a)
                        return out->magic == DW_STAT_MAGIC && out->version == DW_STAT_VERSION &&
                               out->size == sizeof(*out);
        }
        return false;
}

int dw_stat_shm_scan(void (*cb)(const struct dw_stat_dev *d, void *ctx), void *ctx)
{
        int dfd = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
        if (!dir) {
                int err = -errno;
                if (dfd >= 0)
                        close(dfd);
                return err;
        }
        struct dw_stat_dev *snap = malloc(sizeof(*snap));
        if (!snap) {
                closedir(dir);
                return -ENOMEM;
        }
        uid_t me = geteuid();
        int found = 0;
        struct dirent *e;
        while ((e = readdir(dir))) {
                unsigned uid;
                int pid;
                if (!parse_name(e->d_name, &uid, &pid))
                        continue;
                if (kill(pid, 0) < 0 && errno == ESRCH) {
                        /* Its process is gone (killed before closing its
                         * devices): stale. Ours (or root's to clean) go. */
                        if (uid == me || me == 0)
                                unlinkat(dirfd(dir), e->d_name, 0);
                        continue;
                }
                int fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        continue; /* another user's (mode 0600) */
                struct stat st;
                void *m = MAP_FAILED;
                if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid &&
                    !(st.st_mode & 077) && st.st_size == (off_t)sizeof(*snap))
                        m = mmap(NULL, sizeof(*snap), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (m == MAP_FAILED)
                        continue;
                bool ok = copy_snapshot(m, snap) && snap->pid == pid;
                munmap(m, sizeof(*snap));
                if (!ok)
                        continue;
                cb(snap, ctx);
                found++;
        }
        closedir(dir);
        free(snap);
        return found;
}
