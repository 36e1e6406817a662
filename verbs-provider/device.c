/* Device discovery, contexts and the query verbs.
 *
 * ibv_get_device_list returns [diwarp0, real devices...]; ibv_open_device on
 * diwarp0 opens a diwarp device instance (its own UDP socket and TCP
 * listener) behind a struct verbs_context, so the inline verbs of verbs.h
 * (ibv_query_port, ibv_query_device_ex, ibv_post_send, ibv_poll_cq...) reach
 * our ops. Everything about other devices goes to the real libibverbs.
 */
#define _GNU_SOURCE
#include "provider.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define DWV_VENDOR_ID      0x444957 /* "DIW": not a hardware vendor's OUI */
#define DWV_VENDOR_PART_ID 1
#define DWV_BOARD_ID       "DIWARP_SOFT_RNIC"
#define DWV_NAME           "diwarp0"
#define DWV_SYSFS_IBDEV    "/sys/class/infiniband/" DWV_NAME
#define DWV_SYSFS_UVERBS   "/sys/class/infiniband_verbs/uverbs_" DWV_NAME

/* ---- real libibverbs ---------------------------------------------------- */

void *dwv_real(const char *name, const char *version)
{
        /* A handle to libibverbs itself: lookups through it never find our
         * interposers, whatever the load order. We link libibverbs
         * (--no-as-needed), so NOLOAD finds it already mapped. */
        static void *handle;
        void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
        if (!h) {
                h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
                if (!h)
                        h = dlopen("libibverbs.so.1", RTLD_NOW);
                if (!h) {
                        diwarpdv_warn("verbs: cannot load libibverbs.so.1: %s", dlerror());
                        return NULL;
                }
                __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
        }
        void *f = dlvsym(h, name, version);
        if (!f)
                diwarpdv_warn("verbs: real %s@%s not found", name, version);
        return f;
}

DWV_REAL(struct ibv_device **, ibv_get_device_list, "IBVERBS_1.1", (int *))
DWV_REAL(void, ibv_free_device_list, "IBVERBS_1.1", (struct ibv_device **))
DWV_REAL(const char *, ibv_get_device_name, "IBVERBS_1.1", (struct ibv_device *))
DWV_REAL(__be64, ibv_get_device_guid, "IBVERBS_1.1", (struct ibv_device *))
DWV_REAL(struct ibv_context *, ibv_open_device, "IBVERBS_1.1", (struct ibv_device *))
DWV_REAL(int, ibv_close_device, "IBVERBS_1.1", (struct ibv_context *))
DWV_REAL(int, ibv_query_device, "IBVERBS_1.1", (struct ibv_context *, struct ibv_device_attr *))
DWV_REAL(int, ibv_query_port, "IBVERBS_1.1", (struct ibv_context *, uint8_t, void *))
DWV_REAL(int, ibv_query_gid, "IBVERBS_1.1", (struct ibv_context *, uint8_t, int, union ibv_gid *))
DWV_REAL(ssize_t, _ibv_query_gid_table, "IBVERBS_1.11",
         (struct ibv_context *, struct ibv_gid_entry *, size_t, uint32_t, size_t))
DWV_REAL(int, ibv_get_pkey_index, "IBVERBS_1.5", (struct ibv_context *, uint8_t, __be16))
DWV_REAL(int, _ibv_query_gid_ex, "IBVERBS_1.11",
         (struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *, uint32_t, size_t))
DWV_REAL(int, ibv_query_gid_type, "IBVERBS_PRIVATE_34",
         (struct ibv_context *, uint8_t, unsigned int, int *))
DWV_REAL(int, ibv_query_pkey, "IBVERBS_1.1", (struct ibv_context *, uint8_t, int, __be16 *))
DWV_REAL(int, ibv_read_sysfs_file, "IBVERBS_1.0", (const char *, const char *, char *, size_t))
DWV_REAL(int, ibv_get_async_event, "IBVERBS_1.1", (struct ibv_context *, struct ibv_async_event *))
DWV_REAL(void, ibv_ack_async_event, "IBVERBS_1.1", (struct ibv_async_event *))
DWV_REAL(int, ibv_fork_init, "IBVERBS_1.1", (void))
DWV_REAL(int, ibv_is_fork_initialized, "IBVERBS_1.13", (void))
DWV_REAL(const char *, ibv_wc_status_str, "IBVERBS_1.1", (enum ibv_wc_status))

/* ---- the device --------------------------------------------------------- */

/* A stand-in for rdma-core's verbs_device_ops: only the leading name is ever
 * read by code that compares ops pointers or prints the driver name. */
static const struct {
        const char *name;
        void *rest[31];
} dwv_dummy_ops = {.name = "diwarp"};

static struct dwv_verbs_device dwv_dev;
static uint32_t dwv_addr_be;       /* GID 0's IPv4 (network order) */
static char dwv_ifname[16] = "lo"; /* its interface: the device's netdev */
static pthread_once_t dwv_dev_once = PTHREAD_ONCE_INIT;
static bool dwv_as_ib; /* reports InfiniBand transport (DIWARP_TRANSPORT) */

/* Open MPI's ofi MTL is in this process: its component's shared object
 * (mca_mtl_ofi.so) is loaded, or the component is linked into libmpi. */
static int dwv_is_mtl_ofi(struct dl_phdr_info *info, size_t size, void *data)
{
        (void)size;
        (void)data;
        const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
        base = base ? base + 1 : info->dlpi_name;
        return base && !strncmp(base, "mca_mtl_ofi.", 12);
}

static bool dwv_ompi_mtl_ofi_present(void)
{
        return dl_iterate_phdr(dwv_is_mtl_ofi, NULL) ||
               dlsym(RTLD_DEFAULT, "mca_mtl_ofi_component");
}

/* DIWARP_TRANSPORT: what the device says it is. "iwarp" is the truth and,
 * with one exception, the default. "ib" reports an InfiniBand-transport
 * device on an Ethernet link, as RoCE devices do, for libraries that switch
 * features off for iWARP. The exception: libfabric's verbs provider offers
 * no remote CQ data on iWARP (although RFC 7306 and diwarp carry immediate
 * data), and Open MPI's ofi MTL without CQ data posts the receive of a
 * synchronous send's acknowledgement from the wrong address, so MPI_Ssend
 * to any rank but 0 (and a barrier of 3 ranks) never completes. In a
 * process where that MTL is loaded (Open MPI selects it, then libfabric
 * opens the device), the default is therefore "ib", said in one info line;
 * "iwarp" set explicitly keeps iWARP there, with a warning naming what will
 * hang. The wire, the rdma_cm emulation and every verb stay the same. */
static void dwv_transport_init(void)
{
        const char *t = getenv("DIWARP_TRANSPORT");
        bool forced = t && *t && strcasecmp(t, "auto");
        if (forced && !strcasecmp(t, "ib")) {
                dwv_as_ib = true;
                return;
        }
        if (forced && strcasecmp(t, "iwarp")) {
                diwarpdv_warn("verbs: DIWARP_TRANSPORT=%s: not iwarp, ib or auto; taken as auto",
                              t);
                forced = false;
        }
        if (!dwv_ompi_mtl_ofi_present())
                return;
        if (forced) {
                diwarpdv_warn(
                    "verbs: DIWARP_TRANSPORT=iwarp under Open MPI's ofi MTL: libfabric offers "
                    "no CQ data on iWARP and MPI_Ssend to ranks other than 0 will hang; "
                    "use --transport ib (or leave it unset)");
                return;
        }
        dwv_as_ib = true;
        diwarpdv_info(
            "verbs: Open MPI's ofi MTL: diwarp0 reports InfiniBand transport on Ethernet so "
            "that libfabric gives it remote CQ data (--transport iwarp to keep iWARP)");
}

static void dwv_device_init(void)
{
        /* What a device opened now takes as GID 0 (libdiwarp's rule): the
         * pinned address, else the host's first address. */
        const char *a = getenv("DIWARP_ADDR");
        struct in_addr ip;
        struct diwarp_netif nif[DIWARP_MAX_GIDS];
        int n = diwarp_host_netifs(nif, DIWARP_MAX_GIDS);
        if (a && *a && inet_pton(AF_INET, a, &ip) == 1) {
                for (int i = 0; i < n; i++)
                        if (nif[i].addr == ip.s_addr)
                                snprintf(dwv_ifname, sizeof(dwv_ifname), "%s", nif[i].ifname);
        } else if (n > 0) {
                ip.s_addr = nif[0].addr;
                snprintf(dwv_ifname, sizeof(dwv_ifname), "%s", nif[0].ifname);
        } else {
                ip.s_addr = htonl(INADDR_LOOPBACK);
        }
        dwv_addr_be = ip.s_addr;

        /* The engine applies DIWARP_LOG when a device opens; the report's
         * line comes earlier. */
        diwarpdv_log_from_env();
        dwv_transport_init();
        struct ibv_device *d = &dwv_dev.device;
        d->node_type = dwv_as_ib ? IBV_NODE_CA : IBV_NODE_RNIC;
        d->transport_type = dwv_as_ib ? IBV_TRANSPORT_IB : IBV_TRANSPORT_IWARP;
        snprintf(d->name, sizeof(d->name), "%s", DWV_NAME);
        snprintf(d->dev_name, sizeof(d->dev_name), "uverbs_%s", DWV_NAME);
        snprintf(d->dev_path, sizeof(d->dev_path), "%s", DWV_SYSFS_UVERBS);
        snprintf(d->ibdev_path, sizeof(d->ibdev_path), "%s", DWV_SYSFS_IBDEV);
        dwv_dev.ops = &dwv_dummy_ops;
        dwv_dev.refcount = 1; /* never reaches 0: the device is static */
        dwv_dev.list_next = dwv_dev.list_prev = &dwv_dev.list_next;
}

bool dwv_device_reports_ib(void)
{
        dwv_device();
        return dwv_as_ib;
}

struct dwv_verbs_device *dwv_device(void)
{
        pthread_once(&dwv_dev_once, dwv_device_init);
        return &dwv_dev;
}

uint64_t dwv_device_guid_be(void)
{
        dwv_device();
        /* 02:44:57:00 (locally administered, "DW") then the IPv4 address:
         * stable across opens and processes, distinct per address. */
        uint8_t b[8] = {0x02, 0x44, 0x57, 0x00};
        memcpy(b + 4, &dwv_addr_be, 4);
        uint64_t g;
        memcpy(&g, b, 8);
        return g;
}

/* Device lists we returned, so ibv_free_device_list knows ours without
 * reading outside an allocation. */
struct dwv_list {
        struct dwv_list *next;
        struct ibv_device **real;
        struct ibv_device *devs[];
};
static struct dwv_list *dwv_lists;
static pthread_mutex_t dwv_lists_lock = PTHREAD_MUTEX_INITIALIZER;
DWV_SYMVER(dwv_ibv_get_device_list, ibv_get_device_list, "IBVERBS_1.1");
struct ibv_device **dwv_ibv_get_device_list(int *num)
{
        int nreal = 0;
        struct ibv_device **real = NULL;
        int saved = errno;
        if (real_ibv_get_device_list())
                real = real_ibv_get_device_list()(&nreal);
        if (!real)
                nreal = 0; /* no kernel RDMA here (ENOSYS): diwarp0 alone */
        errno = saved;
        struct dwv_list *l = calloc(1, sizeof(*l) + (size_t)(nreal + 2) * sizeof(l->devs[0]));
        if (!l) {
                if (real)
                        real_ibv_free_device_list()(real);
                errno = ENOMEM;
                return NULL;
        }
        l->real = real;
        l->devs[0] = &dwv_device()->device;
        for (int i = 0; i < nreal; i++)
                l->devs[1 + i] = real[i];
        pthread_mutex_lock(&dwv_lists_lock);
        l->next = dwv_lists;
        dwv_lists = l;
        pthread_mutex_unlock(&dwv_lists_lock);
        if (num)
                *num = nreal + 1;
        return l->devs;
}

DWV_SYMVER(dwv_ibv_free_device_list, ibv_free_device_list, "IBVERBS_1.1");
void dwv_ibv_free_device_list(struct ibv_device **list)
{
        struct dwv_list *l = NULL;
        pthread_mutex_lock(&dwv_lists_lock);
        for (struct dwv_list **p = &dwv_lists; *p; p = &(*p)->next) {
                if ((*p)->devs == list) {
                        l = *p;
                        *p = l->next;
                        break;
                }
        }
        pthread_mutex_unlock(&dwv_lists_lock);
        if (!l) {
                if (list && real_ibv_free_device_list())
                        real_ibv_free_device_list()(list);
                return;
        }
        if (l->real)
                real_ibv_free_device_list()(l->real);
        free(l);
}

DWV_SYMVER(dwv_ibv_get_device_name, ibv_get_device_name, "IBVERBS_1.1");
const char *dwv_ibv_get_device_name(struct ibv_device *d)
{
        if (dwv_dev_is_ours(d))
                return d->name;
        return real_ibv_get_device_name()(d);
}

DWV_SYMVER(dwv_ibv_get_device_guid, ibv_get_device_guid, "IBVERBS_1.1");
__be64 dwv_ibv_get_device_guid(struct ibv_device *d)
{
        if (dwv_dev_is_ours(d))
                return dwv_device_guid_be();
        return real_ibv_get_device_guid()(d);
}

/* ---- sysfs -------------------------------------------------------------- */

const char *dwv_device_ifname(void)
{
        dwv_device();
        return dwv_ifname;
}

/* The few sysfs attributes tools read for a device (ibv_devinfo: board_id);
 * the sysfs tree (sysfs.c) holds the same values. */
int dwv_sysfs_value(const char *file, char *buf, size_t size)
{
        char tmp[128];
        uint64_t g = be64toh(dwv_device_guid_be());
        if (!strcmp(file, "board_id"))
                snprintf(tmp, sizeof(tmp), "%s", DWV_BOARD_ID);
        else if (!strcmp(file, "node_type"))
                snprintf(tmp, sizeof(tmp), "%s",
                         dwv_device()->device.node_type == IBV_NODE_CA ? "1: CA" : "4: RNIC");
        else if (!strcmp(file, "fw_ver"))
                snprintf(tmp, sizeof(tmp), "%d.%d.%d", DIWARP_VERSION_MAJOR, DIWARP_VERSION_MINOR,
                         DIWARP_VERSION_PATCH);
        else if (!strcmp(file, "hca_type"))
                snprintf(tmp, sizeof(tmp), "diwarp");
        else if (!strcmp(file, "hw_rev"))
                snprintf(tmp, sizeof(tmp), "1");
        else if (!strcmp(file, "node_desc"))
                snprintf(tmp, sizeof(tmp), "diwarp software iWARP RNIC");
        else if (!strcmp(file, "node_guid") || !strcmp(file, "sys_image_guid"))
                snprintf(tmp, sizeof(tmp), "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
                         (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff,
                         (unsigned)g & 0xffff);
        else if (!strcmp(file, "ibdev"))
                snprintf(tmp, sizeof(tmp), "%s", DWV_NAME);
        else
                return -1;
        /* As the real function: the bytes read, a trailing newline dropped. */
        size_t n = strlen(tmp);
        if (size == 0)
                return 0;
        if (n >= size)
                n = size - 1;
        memcpy(buf, tmp, n);
        buf[n] = '\0';
        return (int)n;
}

DWV_SYMVER(dwv_ibv_read_sysfs_file, ibv_read_sysfs_file, "IBVERBS_1.0");
int dwv_ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
        dwv_device();
        if (dir && file &&
            (!strcmp(dir, dwv_dev.device.ibdev_path) || !strcmp(dir, dwv_dev.device.dev_path))) {
                int n = dwv_sysfs_value(file, buf, size);
                if (n < 0)
                        errno = ENOENT;
                return n;
        }
        return real_ibv_read_sysfs_file()(dir, file, buf, size);
}

/* ---- open / close ------------------------------------------------------- */

uint32_t dwv_next_handle(struct dwv_context *c)
{
        return __atomic_add_fetch(&c->next_handle, 1, __ATOMIC_RELAXED);
}

void dwv_link_add(struct dwv_context *c, struct dwv_obj_link *head, struct dwv_obj_link *l)
{
        pthread_mutex_lock(&c->objs_lock);
        l->next = head->next;
        l->prev = head;
        head->next->prev = l;
        head->next = l;
        pthread_mutex_unlock(&c->objs_lock);
}

void dwv_link_del(struct dwv_context *c, struct dwv_obj_link *l)
{
        pthread_mutex_lock(&c->objs_lock);
        l->prev->next = l->next;
        l->next->prev = l->prev;
        l->next = l->prev = l;
        pthread_mutex_unlock(&c->objs_lock);
}

DWV_SYMVER(dwv_ibv_open_device, ibv_open_device, "IBVERBS_1.1");
struct ibv_context *dwv_ibv_open_device(struct ibv_device *d)
{
        if (!dwv_dev_is_ours(d))
                return real_ibv_open_device()(d);

        dwv_sysfs_clean_stale();
        struct dwv_context *c = calloc(1, sizeof(*c));
        if (!c) {
                errno = ENOMEM;
                return NULL;
        }
        int err = diwarp_device_open(NULL, &c->dev);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_open_device(%s): %s", d->name, strerror(-err));
                free(c);
                errno = -err;
                return NULL;
        }
        /* An RDMA target is passive: ib_write_lat waits by polling memory and
         * the ib_read_* server calls nothing while it is read, yet their
         * streams must be accepted and served. So the progress thread runs
         * unless DIWARP_PROGRESS=app asks otherwise (then the program must
         * call into the device to make progress). */
        const char *pm = getenv("DIWARP_PROGRESS");
        if (!pm || strcmp(pm, "app") != 0) {
                err = diwarp_progress_thread_start(c->dev);
                if (err < 0) {
                        diwarpdv_warn("verbs: ibv_open_device(%s): progress thread: %s", d->name,
                                      strerror(-err));
                        diwarp_device_close(c->dev);
                        free(c);
                        errno = -err;
                        return NULL;
                }
        }
        struct verbs_context *v = &c->vctx;
        struct ibv_context *ctx = &v->context;
        v->sz = sizeof(*v);
        v->query_port = dwv_query_port_ex;
        v->query_device_ex = dwv_query_device_ex;
        v->create_qp_ex = dwv_create_qp_ex;
        v->create_cq_ex = dwv_create_cq_ex;
        v->query_rt_values = dwv_query_rt_values;
        ctx->device = d;
        ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
        ctx->num_comp_vectors = 1;
        ctx->async_fd = diwarp_async_fd(c->dev);
        /* No kernel command channel: a private eventfd, so code that polls or
         * fcntl()s cmd_fd sees a valid, idle descriptor. */
        ctx->cmd_fd = eventfd(0, EFD_CLOEXEC);
        ctx->ops.poll_cq = dwv_poll_cq;
        ctx->ops.req_notify_cq = dwv_req_notify_cq;
        ctx->ops.post_send = dwv_post_send;
        ctx->ops.post_recv = dwv_post_recv;
        ctx->ops.post_srq_recv = dwv_post_srq_recv;
        ctx->ops.alloc_mw = dwv_alloc_mw;
        ctx->ops.dealloc_mw = dwv_dealloc_mw;
        ctx->ops.bind_mw = dwv_bind_mw;
        pthread_mutex_init(&ctx->mutex, NULL);
        pthread_mutex_init(&c->objs_lock, NULL);
        c->qps.next = c->qps.prev = &c->qps;
        c->cqs.next = c->cqs.prev = &c->cqs;
        c->srqs.next = c->srqs.prev = &c->srqs;
        c->pds.next = c->pds.prev = &c->pds;
        c->mrs.next = c->mrs.prev = &c->mrs;
        c->mws.next = c->mws.prev = &c->mws;
        c->ahs.next = c->ahs.prev = &c->ahs;
        c->channels.next = c->channels.prev = &c->channels;
        return ctx;
}

DWV_SYMVER(dwv_ibv_close_device, ibv_close_device, "IBVERBS_1.1");
int dwv_ibv_close_device(struct ibv_context *ctx)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_close_device()(ctx);
        struct dwv_context *c = dwv_ctx(ctx);
        if (c->keep_open)
                return 0; /* rdma_cm's (see provider.h) */
        /* Closing a hardware device's file releases every object still open
         * (and ibv_close_device succeeds); so here. */
        int left = dwv_release_all(c);
        if (left)
                diwarpdv_info("verbs: ibv_close_device: released %d object%s the program had not "
                              "destroyed",
                              left, left == 1 ? "" : "s");
        int err = diwarp_device_close(c->dev);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_close_device: %s", strerror(-err));
                return dwv_errno(err);
        }
        if (ctx->cmd_fd >= 0)
                close(ctx->cmd_fd);
        pthread_mutex_destroy(&ctx->mutex);
        pthread_mutex_destroy(&c->objs_lock);
        free(c);
        return 0;
}

/* ---- queries ------------------------------------------------------------ */

static int dwv_fill_device_attr(struct dwv_context *c, struct ibv_device_attr *a)
{
        struct diwarp_device_attr d;
        int err = diwarp_device_query(c->dev, &d);
        if (err < 0)
                return -err;
        memset(a, 0, sizeof(*a));
        snprintf(a->fw_ver, sizeof(a->fw_ver), "%s", d.fw_ver);
        a->node_guid = dwv_device_guid_be();
        a->sys_image_guid = a->node_guid;
        a->max_mr_size = d.max_mr_size;
        a->page_size_cap = ~(uint64_t)0xfff; /* registration is bookkeeping: any 4K multiple */
        a->vendor_id = d.vendor_id ? d.vendor_id : DWV_VENDOR_ID;
        a->vendor_part_id = d.vendor_part_id ? d.vendor_part_id : DWV_VENDOR_PART_ID;
        a->hw_ver = d.hw_ver;
        a->max_qp = d.max_qp;
        a->max_qp_wr = d.max_qp_wr;
        /* Memory windows: type 1 and type 2B (bound to a QP and its PD).
         * Nothing else (no fast-register, no QP resize): claim nothing we lack. */
        a->device_cap_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
        a->max_sge = d.max_sge;
        a->max_sge_rd = d.max_sge;
        a->max_cq = d.max_cq;
        a->max_cqe = d.max_cqe;
        a->max_mr = d.max_mr;
        a->max_mw = d.max_mw;
        a->max_pd = d.max_pd;
        a->max_qp_rd_atom = d.max_qp_rd_atom;
        a->max_res_rd_atom = d.max_res_rd_atom;
        a->max_qp_init_rd_atom = d.max_qp_init_rd_atom;
        a->atomic_cap = d.atomics ? IBV_ATOMIC_HCA : IBV_ATOMIC_NONE;
        a->max_ah = d.max_ah;
        a->max_srq = d.max_srq;
        a->max_srq_wr = d.max_srq_wr;
        a->max_srq_sge = d.max_srq_sge;
        a->max_pkeys = 1;
        a->local_ca_ack_delay = 0;
        a->phys_port_cnt = 1;
        return 0;
}

DWV_SYMVER(dwv_ibv_query_device, ibv_query_device, "IBVERBS_1.1");
int dwv_ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_query_device()(ctx, attr);
        if (!attr)
                return EINVAL;
        return dwv_fill_device_attr(dwv_ctx(ctx), attr);
}

int dwv_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
                        struct ibv_device_attr_ex *attr, size_t attr_size)
{
        if (!attr || attr_size < sizeof(attr->orig_attr))
                return EINVAL;
        if (in && in->comp_mask)
                return EINVAL;
        struct ibv_device_attr_ex ex;
        memset(&ex, 0, sizeof(ex));
        int err = dwv_fill_device_attr(dwv_ctx(ctx), &ex.orig_attr);
        if (err)
                return err;
        ex.phys_port_cnt_ex = 1;
        /* Completion timestamps (ibv_create_cq_ex): nanoseconds, 64 bits. */
        ex.hca_core_clock = DWV_HCA_CORE_CLOCK_KHZ;
        ex.completion_timestamp_mask = UINT64_MAX;
        /* The caller's struct may be older (shorter) or newer (longer) than ours. */
        size_t n = attr_size < sizeof(ex) ? attr_size : sizeof(ex);
        memcpy(attr, &ex, n);
        if (attr_size > n)
                memset((char *)attr + n, 0, attr_size - n);
        return 0;
}

static void dwv_fill_port_attr(struct ibv_context *ctx, struct ibv_port_attr *p)
{
        memset(p, 0, sizeof(*p));
        p->state = IBV_PORT_ACTIVE;
        p->max_mtu = IBV_MTU_4096;
        p->active_mtu = IBV_MTU_4096;
        int n = diwarp_device_gid_table(dwv_ctx(ctx)->dev, NULL, 0);
        p->gid_tbl_len = n > 0 ? n : 1;
        p->port_cap_flags = IBV_PORT_CM_SUP;
        p->max_msg_sz = 0x80000000u; /* RC messages up to 2 GiB */
        p->pkey_tbl_len = 1;
        p->max_vl_num = 1;
        p->active_width = 1;  /* 1X */
        p->active_speed = 32; /* EDR, 25 Gb/s: a software stack's order of magnitude */
        p->phys_state = 5;    /* LinkUp */
        p->link_layer = IBV_LINK_LAYER_ETHERNET;
}

int dwv_query_port_ex(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
                      size_t attr_len)
{
        if (!attr)
                return EINVAL;
        if (port != 1) {
                diwarpdv_warn("verbs: query_port: no port %u (diwarp0 has port 1)", port);
                return EINVAL;
        }
        struct ibv_port_attr p;
        dwv_fill_port_attr(ctx, &p);
        size_t n = attr_len < sizeof(p) ? attr_len : sizeof(p);
        memcpy(attr, &p, n);
        if (attr_len > n)
                memset((char *)attr + n, 0, attr_len - n);
        return 0;
}

DWV_SYMVER(dwv_ibv_query_port, ibv_query_port, "IBVERBS_1.1");
int dwv_ibv_query_port(struct ibv_context *ctx, uint8_t port, void *attr)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_query_port()(ctx, port, attr);
        return dwv_query_port_ex(ctx, port, attr, offsetof(struct ibv_port_attr, port_cap_flags2));
}

/* GID index i of port 1: the IPv4-mapped address i of the device's table;
 * *ifindex its interface. */
static int dwv_gid(struct ibv_context *ctx, uint32_t port, uint32_t index, union ibv_gid *gid,
                   uint32_t *ifindex)
{
        struct diwarp_netif t[DIWARP_MAX_GIDS];
        if (port != 1)
                return EINVAL;
        int n = diwarp_device_gid_table(dwv_ctx(ctx)->dev, t, DIWARP_MAX_GIDS);
        if (n < 0)
                return -n;
        if (index >= (uint32_t)n || index >= DIWARP_MAX_GIDS)
                return EINVAL;
        memset(gid, 0, sizeof(*gid));
        gid->raw[10] = gid->raw[11] = 0xff;
        memcpy(&gid->raw[12], &t[index].addr, 4);
        if (ifindex)
                *ifindex = t[index].ifindex;
        return 0;
}

DWV_SYMVER(dwv_ibv_query_gid, ibv_query_gid, "IBVERBS_1.1");
int dwv_ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_query_gid()(ctx, port, index, gid);
        if (!gid || index < 0) {
                errno = EINVAL;
                return -1;
        }
        int err = dwv_gid(ctx, port, (uint32_t)index, gid, NULL);
        if (err) {
                errno = err;
                return -1; /* as the real ibv_query_gid */
        }
        return 0;
}

DWV_SYMVER(dwv_ibv_query_gid_ex, _ibv_query_gid_ex, "IBVERBS_1.11");
int dwv_ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                         struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
        if (!dwv_ctx_is_ours(ctx))
                return real__ibv_query_gid_ex()(ctx, port, index, entry, flags, entry_size);
        if (!entry || flags || entry_size < sizeof(union ibv_gid))
                return EINVAL;
        struct ibv_gid_entry e;
        memset(&e, 0, sizeof(e));
        uint32_t ifindex = 0;
        int err = dwv_gid(ctx, port, index, &e.gid, &ifindex);
        if (err)
                return err;
        e.ndev_ifindex = ifindex;
        e.gid_index = index;
        e.port_num = port;
        /* The GID is an IPv4-mapped address, the format of RoCE v2 GIDs
         * (tools then print it as an address). */
        e.gid_type = IBV_GID_TYPE_ROCE_V2;
        size_t n = entry_size < sizeof(e) ? entry_size : sizeof(e);
        memcpy(entry, &e, n);
        return 0;
}

/* The whole table (port 1's GIDs, one per address of the device). Returns
 * the count, or a negative errno (as the real _ibv_query_gid_table:
 * EINVAL when max_entries is too small). */
DWV_SYMVER(dwv_ibv_query_gid_table, _ibv_query_gid_table, "IBVERBS_1.11");
ssize_t dwv_ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
                                size_t max_entries, uint32_t flags, size_t entry_size)
{
        if (!dwv_ctx_is_ours(ctx))
                return real__ibv_query_gid_table()(ctx, entries, max_entries, flags, entry_size);
        if (!entries || !max_entries || flags ||
            entry_size < offsetof(struct ibv_gid_entry, ndev_ifindex))
                return -EINVAL;
        int n = diwarp_device_gid_table(dwv_ctx(ctx)->dev, NULL, 0);
        if (n < 0)
                return n;
        if ((size_t)n > max_entries)
                return -EINVAL;
        for (int i = 0; i < n; i++) {
                int err = dwv_ibv_query_gid_ex(
                    ctx, 1, (uint32_t)i,
                    (struct ibv_gid_entry *)((char *)entries + (size_t)i * entry_size), 0,
                    entry_size);
                if (err)
                        return -err;
        }
        return n;
}

DWV_SYMVER(dwv_ibv_get_pkey_index, ibv_get_pkey_index, "IBVERBS_1.5");
int dwv_ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_get_pkey_index()(ctx, port, pkey);
        /* One partition, the default full-membership one, at index 0. */
        if (port != 1 || be16toh(pkey) != 0xffff) {
                errno = EINVAL;
                return -1;
        }
        return 0;
}

/* Private rdma-core entry (ibv_devinfo -v imports it); type is the sysfs
 * enum: 0 = "IB/RoCE v1", 1 = "RoCE v2". */
DWV_SYMVER(dwv_ibv_query_gid_type, ibv_query_gid_type, "IBVERBS_PRIVATE_34");
int dwv_ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_query_gid_type()(ctx, port, index, type);
        int n = diwarp_device_gid_table(dwv_ctx(ctx)->dev, NULL, 0);
        if (!type || port != 1 || n < 0 || index >= (unsigned)n) {
                errno = EINVAL;
                return -1;
        }
        *type = 1; /* RoCE v2: an IP-address GID, as _ibv_query_gid_ex says */
        return 0;
}

DWV_SYMVER(dwv_ibv_query_pkey, ibv_query_pkey, "IBVERBS_1.1");
int dwv_ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_query_pkey()(ctx, port, index, pkey);
        if (!pkey || port != 1 || index != 0) {
                errno = EINVAL;
                return -1;
        }
        *pkey = htobe16(0xffff); /* the default full-membership partition */
        return 0;
}

/* ---- async events ------------------------------------------------------- */

static void *dwv_find(struct dwv_context *c, struct dwv_obj_link *head, size_t link_off,
                      size_t d_off, const void *d)
{
        void *found = NULL;
        pthread_mutex_lock(&c->objs_lock);
        for (struct dwv_obj_link *l = head->next; l != head; l = l->next) {
                char *obj = (char *)l - link_off;
                if (*(void **)(obj + d_off) == d) {
                        found = obj;
                        break;
                }
        }
        pthread_mutex_unlock(&c->objs_lock);
        return found;
}

DWV_SYMVER(dwv_ibv_get_async_event, ibv_get_async_event, "IBVERBS_1.1");
int dwv_ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_get_async_event()(ctx, event);
        if (!event) {
                errno = EINVAL;
                return -1;
        }
        struct dwv_context *c = dwv_ctx(ctx);
        for (;;) {
                struct diwarp_async_event ev;
                int err = diwarp_get_async_event(c->dev, &ev);
                if (err < 0) {
                        errno = -err;
                        return -1;
                }
                memset(event, 0, sizeof(*event));
                event->event_type = (enum ibv_event_type)ev.event_type;
                void *obj = NULL;
                switch (ev.event_type) {
                case DIWARP_EVENT_CQ_ERR:
                        obj = dwv_find(c, &c->cqs, offsetof(struct dwv_cq, link),
                                       offsetof(struct dwv_cq, d), ev.element.cq);
                        event->element.cq = obj;
                        break;
                case DIWARP_EVENT_SRQ_ERR:
                case DIWARP_EVENT_SRQ_LIMIT_REACHED:
                        obj = dwv_find(c, &c->srqs, offsetof(struct dwv_srq, link),
                                       offsetof(struct dwv_srq, d), ev.element.srq);
                        event->element.srq = obj;
                        break;
                case DIWARP_EVENT_DEVICE_FATAL:
                case DIWARP_EVENT_PORT_ACTIVE:
                        event->element.port_num = 1;
                        return 0;
                default:
                        obj = dwv_find(c, &c->qps, offsetof(struct dwv_qp, link),
                                       offsetof(struct dwv_qp, d), ev.element.qp);
                        event->element.qp = obj;
                        break;
                }
                if (obj)
                        return 0;
                /* The object is gone already (destroyed before the event was
                 * read): nothing to report for it. */
                diwarpdv_dbg("verbs: dropping async event %d for a destroyed object",
                             ev.event_type);
        }
}

DWV_SYMVER(dwv_ibv_ack_async_event, ibv_ack_async_event, "IBVERBS_1.1");
void dwv_ibv_ack_async_event(struct ibv_async_event *event)
{
        if (!event)
                return;
        pthread_mutex_t *m = NULL;
        pthread_cond_t *cv = NULL;
        uint32_t *counter = NULL;
        switch (event->event_type) {
        case IBV_EVENT_CQ_ERR:
                if (!event->element.cq || !dwv_ctx_is_ours(event->element.cq->context))
                        break;
                m = &event->element.cq->mutex;
                cv = &event->element.cq->cond;
                counter = &event->element.cq->async_events_completed;
                break;
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_COMM_EST:
        case IBV_EVENT_SQ_DRAINED:
        case IBV_EVENT_PATH_MIG:
        case IBV_EVENT_PATH_MIG_ERR:
        case IBV_EVENT_QP_LAST_WQE_REACHED:
                if (!event->element.qp || !dwv_ctx_is_ours(event->element.qp->context))
                        break;
                m = &event->element.qp->mutex;
                cv = &event->element.qp->cond;
                counter = &event->element.qp->events_completed;
                break;
        case IBV_EVENT_SRQ_ERR:
        case IBV_EVENT_SRQ_LIMIT_REACHED:
                if (!event->element.srq || !dwv_ctx_is_ours(event->element.srq->context))
                        break;
                m = &event->element.srq->mutex;
                cv = &event->element.srq->cond;
                counter = &event->element.srq->events_completed;
                break;
        default:
                /* Port and device events carry no object: nothing to count. */
                return;
        }
        if (!counter) {
                real_ibv_ack_async_event()(event);
                return;
        }
        pthread_mutex_lock(m);
        ++*counter;
        pthread_cond_signal(cv);
        pthread_mutex_unlock(m);
}

DWV_SYMVER(dwv_ibv_fork_init, ibv_fork_init, "IBVERBS_1.1");
int dwv_ibv_fork_init(void)
{
        /* Registration does not pin pages, so fork is always safe for our
         * device; the real call still prepares real devices. */
        return real_ibv_fork_init() ? real_ibv_fork_init()() : 0;
}

DWV_SYMVER(dwv_ibv_is_fork_initialized, ibv_is_fork_initialized, "IBVERBS_1.13");
int dwv_ibv_is_fork_initialized(void)
{
        return real_ibv_is_fork_initialized() ? real_ibv_is_fork_initialized()() : 0;
}

DWV_SYMVER(dwv_ibv_wc_status_str, ibv_wc_status_str, "IBVERBS_1.1");
const char *dwv_ibv_wc_status_str(enum ibv_wc_status s)
{
        if (real_ibv_wc_status_str())
                return real_ibv_wc_status_str()(s);
        return diwarp_wc_status_str((enum diwarp_wc_status)s);
}
