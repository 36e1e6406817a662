/* tests/security: what the attack tests share. Each test starts a private
 * diwarpd (DIWARPD, set by meson) on a socket in a directory of its own,
 * attacks it on the raw protocol (ipc/ipc.h), then checks that the daemon
 * is alive, printed no sanitizer report, and still serves a legitimate
 * client (a UD message to itself through the daemon, in a child process in
 * client mode).
 *
 * A failed check prints FAIL with the line and the reason and exits 1; a
 * case that cannot run here (not root, for the cases that need a second
 * uid) exits 77, which meson counts as skipped. */
#ifndef DW_TESTS_SECURITY_COMMON_H
#define DW_TESTS_SECURITY_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "ipc/ipc.h"

#define CHECK(cond, ...)                                                                           \
        do {                                                                                       \
                if (!(cond)) {                                                                     \
                        printf("FAIL line %d: ", __LINE__);                                        \
                        printf(__VA_ARGS__);                                                       \
                        printf("\n");                                                              \
                        sec_on_fail();                                                             \
                        exit(1);                                                                   \
                }                                                                                  \
        } while (0)

#define SKIP 77

/* Prints the tail of the last started daemon's log (a failed CHECK). */
void sec_on_fail(void);

/* The uid and gid the cases that need another user run as. */
#define OTHER_UID 65534
#define OTHER_GID 65534

struct sec_daemon {
        pid_t pid;
        char dir[256];  /* private, removed at exit */
        char sock[300]; /* dir/diwarpd.sock unless told otherwise */
        char log[300];  /* its stdout and stderr */
};

/* A fresh directory (mode 0700) for this run; its paths in d. */
void sec_dir(struct sec_daemon *d);
/* Starts diwarpd on d->sock with extra arguments (NULL-terminated), as uid
 * (-1: ours). Waits until it answers; CHECK-fails if it does not. */
void sec_daemon_start(struct sec_daemon *d, uid_t uid, gid_t gid, const char *const *extra);
/* It still runs (unless stopped by sec_daemon_stop), and its log holds no
 * sanitizer report. */
void sec_daemon_check(struct sec_daemon *d, const char *when);
/* SIGTERM, then its exit status (-1 if it had to be killed). */
int sec_daemon_stop(struct sec_daemon *d);
/* Whether its log holds s. */
bool sec_log_has(const struct sec_daemon *d, const char *s);
/* Removes the directory and everything in it. */
void sec_cleanup(struct sec_daemon *d);

/* A legitimate client beside the attack: a child in client mode opens a
 * device through the daemon at sock and sends a UD message to itself.
 * Returns when it passed; CHECK-fails otherwise. */
void sec_legit_traffic(const char *sock);
/* The same as uid/gid (-1: ours), trusting a daemon of uid daemon_uid
 * (DIWARP_DAEMON_UID; NULL: unset). */
void sec_legit_traffic_as(const char *sock, uid_t uid, gid_t gid, const char *daemon_uid);
/* The same UD message as uid/gid (-1: ours) with env ("NAME=VALUE", NULL
 * ended) set: in the process itself unless env says DIWARP_PROGRESS=daemon. */
void sec_legit_run(uid_t uid, gid_t gid, const char *const *env);

/* ---- the raw protocol ------------------------------------------------------ */

struct sec_conn {
        int s;
        uint32_t seq;
};

/* Connects to sock; -errno when it cannot. */
int sec_connect(const char *sock, struct sec_conn *c);
/* Sends op with handle and r's payload; returns the answer's status, or
 * -ECONNRESET when the daemon hung up or did not answer within 5 s. fds_out
 * (room *nout) receives the answer's descriptors; NULL closes them. */
int sec_req(struct sec_conn *c, unsigned int op, uint32_t handle, struct dw_ipc_req *r,
            const int *fds, int nfds, struct dw_ipc_rsp *rsp, int *fds_out, int *nout);
/* Sends a request without waiting for its answer. */
void sec_send(struct sec_conn *c, unsigned int op, uint32_t handle, struct dw_ipc_req *r,
              const int *fds, int nfds);
/* OPEN on c (port base 0, the daemon's address unless addr): its status. */
int sec_open(struct sec_conn *c, const char *addr, uint16_t port_base);
/* A sealed memfd of len bytes. */
int sec_memfd(size_t len);

/* Drops to uid/gid (a child that plays another user). */
void sec_become(uid_t uid, gid_t gid);

#endif
