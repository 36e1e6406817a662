/* Both ends of an RC stream in this process: see rc_local.h. */
#include "rc/rc_local.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "dw.h"
#include "rc/rc.h"
#include "util/time.h"

#define DW_RC_END_SLOTS 1024

struct dw_rc_end {
        bool used;
        uint64_t local, remote; /* ip << 16 | port */
        struct dw_device *dev;
        struct dw_rc_conn *conn;
        int other; /* slot of the other end, -1 */
        _Atomic uint64_t consumed;
        _Atomic uint64_t term_at;
        _Atomic bool waiting;
};

/* Process state of the device registry (see rc_local.h). */
static struct {
        pthread_mutex_t lock;
        int used;
        struct dw_rc_end end[DW_RC_END_SLOTS];
} ends = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t addr_key(const struct sockaddr_in *a)
{
        return (uint64_t)ntohl(a->sin_addr.s_addr) << 16 | ntohs(a->sin_port);
}

int dw_rc_end_register(struct dw_device *dev, struct dw_rc_conn *conn,
                       const struct sockaddr_in *local, const struct sockaddr_in *remote)
{
        int slot = -1;

        pthread_mutex_lock(&ends.lock);
        for (int i = 0; i < DW_RC_END_SLOTS; i++)
                if (!ends.end[i].used) {
                        slot = i;
                        break;
                }
        if (slot >= 0) {
                struct dw_rc_end *e = &ends.end[slot];
                e->used = true;
                e->local = addr_key(local);
                e->remote = addr_key(remote);
                e->dev = dev;
                e->conn = conn;
                e->other = -1;
                atomic_store(&e->consumed, 0);
                atomic_store(&e->term_at, DW_RC_END_NONE);
                atomic_store(&e->waiting, false);
                ends.used++;
                for (int i = 0; i < DW_RC_END_SLOTS && ends.used > 1; i++) {
                        struct dw_rc_end *o = &ends.end[i];
                        if (i != slot && o->used && o->other < 0 && o->local == e->remote &&
                            o->remote == e->local) {
                                o->other = slot;
                                e->other = i;
                                break;
                        }
                }
        }
        pthread_mutex_unlock(&ends.lock);
        return slot;
}

void dw_rc_end_unregister(int slot)
{
        if (slot < 0 || slot >= DW_RC_END_SLOTS)
                return;
        pthread_mutex_lock(&ends.lock);
        struct dw_rc_end *e = &ends.end[slot];
        if (e->used) {
                if (e->other >= 0)
                        ends.end[e->other].other = -1;
                e->other = -1;
                e->used = false;
                e->conn = NULL;
                e->dev = NULL;
                ends.used--;
        }
        pthread_mutex_unlock(&ends.lock);
}

void dw_rc_end_consumed(int slot, uint64_t bytes)
{
        atomic_store_explicit(&ends.end[slot].consumed, bytes, memory_order_release);
}

void dw_rc_end_terminated(int slot, uint64_t at)
{
        uint64_t none = DW_RC_END_NONE;
        atomic_compare_exchange_strong(&ends.end[slot].term_at, &none, at);
}

bool dw_rc_end_linked(int slot)
{
        /* A racy read is enough: linking happens once, at attach. */
        return __atomic_load_n(&ends.end[slot].other, __ATOMIC_RELAXED) >= 0;
}

bool dw_rc_end_peer_state(int slot, uint64_t *consumed, uint64_t *term_at, bool *waiting)
{
        bool linked = false;

        pthread_mutex_lock(&ends.lock);
        int o = ends.end[slot].other;
        if (o >= 0) {
                linked = true;
                *consumed = atomic_load_explicit(&ends.end[o].consumed, memory_order_acquire);
                *term_at = atomic_load(&ends.end[o].term_at);
                *waiting = atomic_load(&ends.end[o].waiting);
        }
        pthread_mutex_unlock(&ends.lock);
        return linked;
}

/* The other end's device lock is tried again for up to
 * DW_RC_PEER_LOCK_SPIN_NS: its progress thread holds it for a step
 * (microseconds), and a copy that gave up at the first try went on the
 * stream instead (CI runs beside other tests saw copy counts fall short),
 * the WR then waiting for that end to read it. Never blocks, and the
 * registry's lock is not held between tries: the other end may be trying
 * this end's lock the same way, or want the registry while it holds its
 * own. */
#define DW_RC_PEER_LOCK_SPIN_NS 20000u

/* One try (dw_rc_end_lock_peer). *busy: the other end's device was locked. */
static struct dw_rc_conn *lock_peer_once(int slot, struct dw_device *self, bool *locked, bool *busy)
{
        struct dw_rc_conn *peer = NULL;

        *locked = false;
        *busy = false;
        pthread_mutex_lock(&ends.lock);
        int o = ends.end[slot].other;
        if (o >= 0 && !atomic_load(&ends.end[o].waiting)) {
                struct dw_rc_end *e = &ends.end[o];
                if (e->dev == self) {
                        peer = e->conn;
                } else if (pthread_mutex_trylock(&e->dev->lock) == 0) {
                        /* Held from here, the other end cannot unregister. */
                        peer = e->conn;
                        *locked = true;
                } else {
                        *busy = true;
                }
        }
        pthread_mutex_unlock(&ends.lock);
        return peer;
}

struct dw_rc_conn *dw_rc_end_lock_peer(int slot, struct dw_device *self, bool *locked)
{
        bool busy;
        struct dw_rc_conn *peer = lock_peer_once(slot, self, locked, &busy);
        uint64_t until = busy ? dw_now_ns() + DW_RC_PEER_LOCK_SPIN_NS : 0;

        while (busy && dw_now_ns() < until) {
                dw_cpu_relax();
                peer = lock_peer_once(slot, self, locked, &busy);
        }
        return peer;
}

void dw_rc_end_unlock_peer(struct dw_rc_conn *peer, bool locked)
{
        if (peer && locked)
                pthread_mutex_unlock(&peer->qp->dev->lock);
}

void dw_rc_end_set_waiting(int slot, bool on)
{
        atomic_store(&ends.end[slot].waiting, on);
}
