/* diwarpd's internals: the daemon, its servers, their clients and the
 * objects each client holds (see daemon/README.md). */
#ifndef DIWARP_DAEMON_DAEMON_H
#define DIWARP_DAEMON_DAEMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#include "ipc/ipc.h"

#define DD_MAX_SERVERS 64
#define DD_QPN_SLOTS   4096

enum dd_kind {
        DD_FREE = 0,
        DD_PD,
        DD_SEG,
        DD_MR,
        DD_CHAN,
        DD_CQ,
        DD_QP,
        DD_SRQ,
        DD_AH,
        DD_LISTENER
};

struct dd_client;

/* What an epoll event of a server names. */
enum dd_watch_kind { DD_W_DOORBELL = 1, DD_W_CLIENT, DD_W_DEV_PROGRESS, DD_W_DEV_ASYNC };
struct dd_watch {
        enum dd_watch_kind kind;
        void *p;
};

struct dd_obj {
        enum dd_kind kind;
        uint32_t h;
        struct dd_client *c;
        int refs; /* objects that name this one (CQs a channel, MRs a segment...) */
        union {
                struct diwarp_pd *pd;
                struct {
                        uint64_t base, len;
                        uint32_t id; /* the client's name */
                        uint8_t *map;
                } seg;
                struct {
                        struct diwarp_mr *mr;
                        struct dd_obj *seg, *pd;
                        uint64_t addr, len, iova;
                        int access;
                } mr;
                struct {
                        int fd; /* our end of the channel's socket pair */
                } chan;
                struct {
                        struct diwarp_cq *cq;
                        struct dd_obj *chan;
                        void *map;
                        size_t map_len;
                        struct dw_ipc_ring *ring;
                        uint32_t entries, esize, prod, armed;
                        bool overflow_told;
                } cq;
                struct {
                        struct diwarp_qp *qp;
                        struct dd_obj *pd, *scq, *rcq, *srq;
                        void *map;
                        size_t map_len;
                        struct dw_ipc_ring *sq, *rq;
                        uint32_t sq_entries, sq_esize, rq_entries, rq_esize;
                        uint32_t sq_cons, rq_cons, qpn, type;
                        struct diwarp_qp_cap cap;
                } qp;
                struct {
                        struct diwarp_srq *srq;
                        struct dd_obj *pd;
                        void *map;
                        size_t map_len;
                        struct dw_ipc_ring *ring;
                        uint32_t entries, esize, cons, max_sge, max_wr;
                } srq;
                struct {
                        struct diwarp_ah *ah;
                        struct dd_obj *pd;
                } ah;
                struct diwarp_listener *lis;
        } u;
};

/* One engine device instance of a server, shared by its clients that asked
 * for the same address and port base. */
struct dd_dev {
        char addr[16];
        uint16_t port_base;
        struct diwarp_device *dev;
        int prog_fd; /* the engine's epoll set (diwarpdv_external_progress) */
        int users;   /* clients that opened it: closed when the last one is freed */
        struct dd_obj *by_qpn[DD_QPN_SLOTS];
        struct dd_watch w_prog, w_async;
        struct dd_dev *next;
};

struct dd_server;

struct dd_client {
        int sock;         /* requests */
        int ev_sock;      /* our end of the async event socket */
        int32_t pid;      /* the peer's (SO_PEERCRED) */
        uint32_t uid;     /* the peer's (SO_PEERCRED) */
        bool owner;       /* uid is the daemon's: STAT, STAT_QPS and SHUTDOWN allowed */
        bool opened;      /* OPEN done */
        bool broken;      /* a ring was corrupted, or it left while busy: dropped when idle */
        bool paused;      /* its socket is out of the epoll set while a slow request runs */
        _Atomic int busy; /* slow requests (connect, accept, reject) running in their threads */
        struct dd_server *srv;
        struct dd_dev *dd;
        struct dd_obj **objs; /* by handle; [0] unused */
        uint32_t nobjs;
        /* The objects the server walks on every turn. */
        struct dd_obj **active;
        uint32_t nactive, active_cap;
        uint64_t posted_send, posted_recv, completions;
        /* Its warnings, rate-limited (dd_client_log_ok). */
        struct diwarpdv_log_limit log_limit;
        struct dd_watch w;
        struct dd_client *next;
};

struct dd_server {
        int id;
        pthread_t th;
        int epfd;
        int doorbell; /* eventfd: clients write it while the server sleeps */
        int page_fd;
        struct dw_ipc_server_page *page;
        pthread_mutex_t hand_lock;
        struct dd_hand {
                int fd;
                int32_t pid;
                uint32_t uid;
        } hand[64]; /* connections handed over by the acceptor */
        int nhand;
        struct dd_client *clients;
        int nclients;
        struct dd_dev *devs;
        struct dd_watch w_door;
        _Atomic uint64_t wakeups;
        _Atomic bool stop;
};

struct dd_daemon {
        pthread_mutex_t lock; /* the client lists, for diwarp stat */
        struct dd_server servers[DD_MAX_SERVERS];
        int nservers;
        uint64_t spin_ns;
        _Atomic bool stop;
        _Atomic uint64_t requests, rejected;
        _Atomic int ndevs;           /* engine devices open, every server's */
        struct diwarp_counters gone; /* of the devices closed since start (under lock) */
        int max_devs;                /* DIWARPD_MAX_DEVICES / --max-devices */
        int client_devs;             /* DIWARPD_CLIENT_DEVICES / --client-devices: per client pid */
        uint32_t uid;                /* ours: the one uid served, besides group */
        bool has_group;              /* DIWARPD_GROUP / --group: its members are served too */
        uint32_t group;
};

struct dd_daemon *dd_daemon(void);

/* `--nice auto` (priority.c): the acceptor's governor of the daemon's nice. */
#define DD_GOV_CLIENTS 256
#define DD_GOV_TICK_NS 250000000ull
struct dd_gov_pid {
        int32_t pid;
        uint64_t ticks; /* its utime + stime at the last sample */
        uint64_t born;  /* its start time: a pid reused names another process */
};
struct dd_gov {
        bool on;              /* sampling (auto mode, and a boost not refused) */
        int base, boost, now; /* nices: started with, boosted, current */
        int over, under;      /* samples in a row above / below the thresholds */
        long hz;              /* clock ticks a second */
        uint64_t last_ns;     /* the last sample (0: none yet) */
        uint64_t busy_ticks;  /* the host's user + nice + system then */
        uint64_t self_ticks;  /* the daemon's own utime + stime then */
        int nclients;
        struct dd_gov_pid client[DD_GOV_CLIENTS];
};
/* Every thread of the daemon to nice (on Linux a nice is a thread's own),
 * and its session's autogroup when it leads one. 0 or -errno. */
int dd_nice_apply(int nice);
void dd_gov_init(struct dd_gov *g, int base, int boost);
/* A client process handed to a server: its CPU time is the daemon's own. */
void dd_gov_client(struct dd_gov *g, int32_t pid);
/* Samples when DD_GOV_TICK_NS passed since the last sample, and changes the
 * nice of every thread of the daemon when the samples call for it. */
void dd_gov_tick(struct dd_gov *g, uint64_t now_ns);

int dd_server_start(struct dd_server *s, int id);
/* What dd_server_start does but the thread: a server driven by its
 * caller's dd_server_turn calls instead (the daemon's fuzz target). */
int dd_server_init(struct dd_server *s, int id);
/* One turn of a server without a thread: serves the rings, waits up to
 * timeout_ms for events and handles them. Returns the work and events. */
int dd_server_turn(struct dd_server *s, int timeout_ms);
/* Hands a new connection of peer pid and uid to s (it serves it from now
 * on). */
void dd_server_hand(struct dd_server *s, int fd, int32_t pid, uint32_t uid);
void dd_server_stop(struct dd_server *s);
/* A new engine device of s: its epoll set and async fd join s's set. */
void dd_server_watch_dev(struct dd_server *s, struct dd_dev *d);
/* Its last client is gone: out of s's set and list, closed, freed. */
void dd_server_dev_close(struct dd_server *s, struct dd_dev *d);

/* Runs one request of c (requests.c). The response is sent; -1 when the
 * client must be dropped. */
int dd_request(struct dd_client *c, void *msg, size_t len, int *fds, int nfds);
/* After a slow request's thread finished: clients it paused read again. */
void dd_server_resume(struct dd_server *s);
/* Stops and starts reading c's socket (EPOLLIN). */
void dd_client_pause(struct dd_client *c, bool pause);
/* Whether a warning about c may be logged now: the library's rate limit
 * (diwarpdv_log_limit_pass), one limiter per client. */
bool dd_client_log_ok(struct dd_client *c);
/* Frees everything c holds. */
void dd_client_free(struct dd_client *c);
/* Moves WRs and completions of c (server.c). Returns the work done. */
int dd_client_serve(struct dd_client *c);
/* A CQ's ring takes one completion (error completions made here). */
void dd_cq_push(struct dd_obj *cq, const struct diwarp_wc *wc);
void dd_client_active_add(struct dd_client *c, struct dd_obj *o);
void dd_client_active_del(struct dd_client *c, struct dd_obj *o);

#endif
