/* Both ends of an RC stream in this process (rc/rc_local.c).
 *
 * iWARP completes a Send or RDMA Write at the requester once the LLP has
 * taken it (RFC 5040 §5.4: completion does not mean placement). Programs
 * written for InfiniBand read the responder's memory, or expect the
 * responder's verdict (Remote Access / Operation Error), as soon as the
 * requester's completion arrives. Where diwarp sees both ends, because they
 * are in one process (a loopback stream between two QPs of the program), it
 * gives that stronger order: before a signaled Send or Write completes, the
 * responder has consumed the stream through it, or has terminated the stream
 * before it (the WR then waits for the Terminate and completes with its
 * error). Between processes nothing changes.
 *
 * Every stream registers its end (local and remote address) in a table that
 * belongs to the device registry (the process state) before either end can
 * send on it (dw_rc_register_end, rc.h); the two ends of one stream find
 * each other there. A responder publishes how many
 * stream bytes it has consumed and where it terminated; the requester reads
 * them. The table has its own mutex, taken with or without a device lock
 * held; nothing waits for a device lock while holding it (only trylock).
 */
#ifndef DIWARP_RC_RC_LOCAL_H
#define DIWARP_RC_RC_LOCAL_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

struct dw_device;
struct dw_rc_conn;

#define DW_RC_END_NONE UINT64_MAX

/* Registers the end of conn (on dev) with these addresses; links it with the
 * other end when that is registered. The slot, or -1 (table full: the
 * stream keeps plain iWARP completion order). */
int dw_rc_end_register(struct dw_device *dev, struct dw_rc_conn *conn,
                       const struct sockaddr_in *local, const struct sockaddr_in *remote);
/* The stream is gone: unlinks both ends. */
void dw_rc_end_unregister(int slot);

/* Responder side: stream bytes consumed so far; the offset where this end
 * stopped consuming because it terminated the stream. */
void dw_rc_end_consumed(int slot, uint64_t bytes);
void dw_rc_end_terminated(int slot, uint64_t at);

/* Requester side: whether the other end is registered in this process. */
bool dw_rc_end_linked(int slot);
/* What the other end has published: consumed bytes, terminate offset
 * (DW_RC_END_NONE), whether it is itself waiting for this end (then neither
 * drives nor waits for the other). False when it is not (or no longer) linked. */
bool dw_rc_end_peer_state(int slot, uint64_t *consumed, uint64_t *term_at, bool *waiting);

/* The other end's conn, with its device's lock taken (tried for a few
 * microseconds, never waited for), when it is on another device; on the
 * same device (lock already held by the caller) the conn without locking.
 * NULL when unlinked, or its device stayed busy.
 * *locked says whether dw_rc_end_unlock_peer must release it. An other end
 * that is itself waiting (dw_rc_end_set_waiting) gives NULL. */
struct dw_rc_conn *dw_rc_end_lock_peer(int slot, struct dw_device *self, bool *locked);
void dw_rc_end_unlock_peer(struct dw_rc_conn *peer, bool locked);
/* This end waits for the other; while set, the other does not drive it. */
void dw_rc_end_set_waiting(int slot, bool on);

#endif
