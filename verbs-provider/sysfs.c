/* The device's sysfs directory, /sys/class/infiniband/diwarp0, for programs
 * that look there (rdma-core's tests find a device's netdev in
 * device/net/<ifname>; scripts read node_guid, ports/1/gids/N...).
 *
 * No kernel module: the first time a program names a path under that
 * directory, a small tree is written into a private directory of this
 * process (${XDG_RUNTIME_DIR:-/tmp}/diwarp-sysfs-<pid>-XXXXXX, removed at
 * exit; the trees of processes killed before their exit go at the next
 * device open or tree, see clean_stale), and the path calls below are
 * redirected there. device/net/<ifname>
 * is a symlink to the interface's /sys/class/net entry (the interface of
 * GID 0). Each interposed call compares its path with the prefix and
 * otherwise calls libc's function untouched. Paths relative to a directory
 * fd (openat, fstatat...) are redirected only when absolute: a directory
 * opened through us is inside the tree already.
 *
 * Interposed (the glibc x86_64 version each has): open, open64, openat,
 * openat64, __open_2, __open64_2, __openat_2, __openat64_2, fopen, fopen64,
 * opendir, stat, stat64, lstat, lstat64, fstatat, fstatat64, __xstat,
 * __xstat64, __lxstat, __lxstat64, __fxstatat, __fxstatat64, statx, access,
 * faccessat, readlink, readlinkat, getxattr, lgetxattr, listxattr,
 * llistxattr (ls -l asks for SELinux labels and ACLs).
 */
#undef _FORTIFY_SOURCE
#define _GNU_SOURCE
#include "provider.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define DWV_SYSFS_DIR "/sys/class/infiniband/diwarp0"

static char dwv_root[256]; /* the tree's diwarp0 directory, "" before it exists */
static size_t dwv_root_len;
static pid_t dwv_root_pid;
static pthread_once_t dwv_tree_once = PTHREAD_ONCE_INIT;

static void *real_fn(const char *name)
{
        return dlsym(RTLD_NEXT, name);
}

#define REAL(type, name, args)                                                                     \
        static type(*real_##name(void)) args                                                       \
        {                                                                                          \
                static type(*fn) args;                                                             \
                type(*f) args = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);                            \
                if (!f) {                                                                          \
                        f = (type(*) args)real_fn(#name);                                          \
                        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);                                \
                }                                                                                  \
                return f;                                                                          \
        }

REAL(int, open, (const char *, int, ...))
REAL(int, open64, (const char *, int, ...))
REAL(int, openat, (int, const char *, int, ...))
REAL(int, openat64, (int, const char *, int, ...))
REAL(int, __open_2, (const char *, int))
REAL(int, __open64_2, (const char *, int))
REAL(int, __openat_2, (int, const char *, int))
REAL(int, __openat64_2, (int, const char *, int))
REAL(FILE *, fopen, (const char *, const char *))
REAL(FILE *, fopen64, (const char *, const char *))
REAL(DIR *, opendir, (const char *))
REAL(int, stat, (const char *, struct stat *))
REAL(int, stat64, (const char *, struct stat64 *))
REAL(int, lstat, (const char *, struct stat *))
REAL(int, lstat64, (const char *, struct stat64 *))
REAL(int, fstatat, (int, const char *, struct stat *, int))
REAL(int, fstatat64, (int, const char *, struct stat64 *, int))
REAL(int, __xstat, (int, const char *, struct stat *))
REAL(int, __xstat64, (int, const char *, struct stat64 *))
REAL(int, __lxstat, (int, const char *, struct stat *))
REAL(int, __lxstat64, (int, const char *, struct stat64 *))
REAL(int, __fxstatat, (int, int, const char *, struct stat *, int))
REAL(int, __fxstatat64, (int, int, const char *, struct stat64 *, int))
REAL(int, statx, (int, const char *, int, unsigned int, struct statx *))
REAL(int, access, (const char *, int))
REAL(int, faccessat, (int, const char *, int, int))
REAL(ssize_t, readlink, (const char *, char *, size_t))
REAL(ssize_t, readlinkat, (int, const char *, char *, size_t))
REAL(ssize_t, getxattr, (const char *, const char *, void *, size_t))
REAL(ssize_t, lgetxattr, (const char *, const char *, void *, size_t))
REAL(ssize_t, listxattr, (const char *, char *, size_t))
REAL(ssize_t, llistxattr, (const char *, char *, size_t))

/* ---- the tree ----------------------------------------------------------- */

static int put_file(const char *dir, const char *name, const char *value)
{
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", dir, name);
        int fd = real_open()(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
        if (fd < 0)
                return -1;
        size_t n = strlen(value);
        ssize_t w = write(fd, value, n);
        w += write(fd, "\n", 1);
        close(fd);
        return w == (ssize_t)n + 1 ? 0 : -1;
}

static int put_dir(char *p, size_t cap, const char *base, const char *sub)
{
        snprintf(p, cap, "%s/%s", base, sub);
        return mkdir(p, 0755) < 0 ? -1 : 0;
}

/* Removes what directory dfd holds (the fd is consumed), never following a
 * symlink: each entry is looked at with AT_SYMLINK_NOFOLLOW and a
 * subdirectory opened with O_NOFOLLOW relative to its parent, so a link is
 * unlinked, never entered, and nothing outside the tree can be reached
 * through a path swapped under us. depth bounds the recursion. */
static void rm_contents(int dfd, int depth)
{
        DIR *d = fdopendir(dfd);
        if (!d) {
                close(dfd);
                return;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                        continue;
                struct stat st;
                if (real_fstatat()(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (!S_ISDIR(st.st_mode)) {
                        unlinkat(dirfd(d), e->d_name, 0);
                        continue;
                }
                int sub = real_openat()(dirfd(d), e->d_name,
                                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sub >= 0 && depth > 0)
                        rm_contents(sub, depth - 1);
                else if (sub >= 0)
                        close(sub);
                unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
        }
        closedir(d);
}

/* Removes directory name of parent pfd with its contents when it is a
 * directory (not a symlink to one) owned by uid. 0 or -errno. */
static int rm_tree_at(int pfd, const char *name, uid_t uid)
{
        int fd = real_openat()(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0 || st.st_uid != uid) {
                close(fd);
                return -EPERM;
        }
        rm_contents(fd, 8);
        return unlinkat(pfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

static char dwv_top[240]; /* the private directory holding diwarp0/ */
/* Held open with an exclusive flock for the process's life: a tree whose
 * lock can be taken belongs to no running process (clean_stale). */
static int dwv_top_fd = -1;

static void tree_remove(void)
{
        if (!dwv_top[0] || getpid() != dwv_root_pid)
                return;
        char *slash = strrchr(dwv_top, '/');
        *slash = 0;
        int pfd = real_open()(slash == dwv_top ? "/" : dwv_top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        *slash = '/';
        if (pfd >= 0) {
                rm_tree_at(pfd, slash + 1, geteuid());
                close(pfd);
        }
        if (dwv_top_fd >= 0)
                close(dwv_top_fd);
        dwv_top_fd = -1;
}

/* Where the private trees go: $XDG_RUNTIME_DIR when it is a writable
 * directory, else /tmp. */
static const char *tree_base(void)
{
        const char *base = getenv("XDG_RUNTIME_DIR");
        struct stat st;
        if (!base || !*base || real_stat()(base, &st) < 0 || !S_ISDIR(st.st_mode) ||
            real_access()(base, W_OK) < 0)
                base = "/tmp";
        return base;
}

/* The PID in a tree's name "diwarp-sysfs-<pid>-XXXXXX", or 0. */
static pid_t tree_pid(const char *name)
{
        static const char pre[] = "diwarp-sysfs-";
        if (strncmp(name, pre, sizeof(pre) - 1))
                return 0;
        const char *p = name + sizeof(pre) - 1;
        long pid = 0;
        for (; *p >= '0' && *p <= '9' && pid < (1l << 30); p++)
                pid = pid * 10 + (*p - '0');
        if (*p != '-' || strlen(p + 1) != 6)
                return 0;
        return (pid_t)pid;
}

/* Trees of processes killed before their exit handler ran (an MPI abort):
 * removed when they are this user's, their PID runs no process here, and
 * no process holds their lock (a live owner in another PID namespace
 * sharing the directory still does). Neither a tree of a live process nor
 * anything a symlink points to is ever touched. */
static void clean_stale(void)
{
        const char *base = tree_base();
        int bfd = real_open()(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = bfd >= 0 ? fdopendir(bfd) : NULL;
        if (!d) {
                if (bfd >= 0)
                        close(bfd);
                return;
        }
        uid_t uid = geteuid();
        pid_t me = getpid();
        int removed = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
                pid_t pid = tree_pid(e->d_name);
                if (pid <= 0 || pid == me || kill(pid, 0) == 0 || errno != ESRCH)
                        continue;
                struct stat st;
                if (real_fstatat()(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                    !S_ISDIR(st.st_mode) || st.st_uid != uid)
                        continue;
                int fd = real_openat()(dirfd(d), e->d_name,
                                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        continue;
                bool free_tree = flock(fd, LOCK_EX | LOCK_NB) == 0;
                if (free_tree && rm_tree_at(dirfd(d), e->d_name, uid) == 0)
                        removed++;
                close(fd);
        }
        closedir(d);
        if (removed)
                diwarpdv_info("verbs: removed %d sysfs tree%s of processes that are gone from %s",
                              removed, removed == 1 ? "" : "s", base);
}

static pthread_once_t dwv_clean_once = PTHREAD_ONCE_INIT;

void dwv_sysfs_clean_stale(void)
{
        pthread_once(&dwv_clean_once, clean_stale);
}

static int tree_fill(const char *root)
{
        static const char *const attrs[] = {"node_type", "node_guid", "sys_image_guid",
                                            "fw_ver",    "hca_type",  "hw_rev",
                                            "board_id",  "node_desc"};
        char v[128], p[512], q[512];
        for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++)
                if (dwv_sysfs_value(attrs[i], v, sizeof(v)) < 0 || put_file(root, attrs[i], v) < 0)
                        return -1;
        const char *ifn = dwv_device_ifname();
        if (put_dir(p, sizeof(p), root, "device") < 0 ||
            put_dir(p, sizeof(p), root, "device/net") < 0)
                return -1;
        snprintf(p, sizeof(p), "%s/device/net/%s", root, ifn);
        snprintf(q, sizeof(q), "/sys/class/net/%s", ifn);
        if (symlink(q, p) < 0)
                return -1;
        if (put_dir(p, sizeof(p), root, "ports") < 0 ||
            put_dir(p, sizeof(p), root, "ports/1") < 0 ||
            put_dir(q, sizeof(q), root, "ports/1/gids") < 0 ||
            put_dir(q, sizeof(q), root, "ports/1/gid_attrs") < 0 ||
            put_dir(q, sizeof(q), root, "ports/1/gid_attrs/types") < 0 ||
            put_dir(q, sizeof(q), root, "ports/1/gid_attrs/ndevs") < 0)
                return -1;
        snprintf(p, sizeof(p), "%s/ports/1", root);
        if (put_file(p, "state", "4: ACTIVE") < 0 || put_file(p, "phys_state", "5: LinkUp") < 0 ||
            put_file(p, "link_layer", "Ethernet") < 0)
                return -1;
        /* The GIDs a device opened now has (libdiwarp's rule, DIWARP_ADDR). */
        struct diwarp_netif t[DIWARP_MAX_GIDS];
        int n = diwarp_host_netifs(t, DIWARP_MAX_GIDS);
        const char *pin = getenv("DIWARP_ADDR");
        struct in_addr a;
        if (pin && *pin && inet_pton(AF_INET, pin, &a) == 1) {
                int k = 0;
                for (int i = 0; i < n; i++)
                        if (t[i].addr == a.s_addr)
                                k = i;
                if (n <= 0 || t[k].addr != a.s_addr) {
                        memset(&t[0], 0, sizeof(t[0]));
                        t[0].addr = a.s_addr;
                } else {
                        t[0] = t[k];
                }
                n = 1;
        } else if (n <= 0) {
                memset(&t[0], 0, sizeof(t[0]));
                t[0].addr = htonl(INADDR_LOOPBACK);
                snprintf(t[0].ifname, sizeof(t[0].ifname), "lo");
                n = 1;
        }
        for (int i = 0; i < n; i++) {
                const uint8_t *b = (const uint8_t *)&t[i].addr;
                char name[16];
                snprintf(name, sizeof(name), "%d", i);
                snprintf(v, sizeof(v), "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", b[0],
                         b[1], b[2], b[3]);
                snprintf(p, sizeof(p), "%s/ports/1/gids", root);
                if (put_file(p, name, v) < 0)
                        return -1;
                snprintf(p, sizeof(p), "%s/ports/1/gid_attrs/types", root);
                if (put_file(p, name, "RoCE v2") < 0)
                        return -1;
                snprintf(p, sizeof(p), "%s/ports/1/gid_attrs/ndevs", root);
                if (put_file(p, name, t[i].ifname) < 0)
                        return -1;
        }
        return 0;
}

static void tree_make(void)
{
        dwv_sysfs_clean_stale();
        const char *base = tree_base();
        char top[240], root[256];
        int n = snprintf(top, sizeof(top), "%s/diwarp-sysfs-%d-XXXXXX", base, (int)getpid());
        if (n < 0 || (size_t)n >= sizeof(top) || !mkdtemp(top)) {
                diwarpdv_warn("verbs: cannot create the sysfs tree of diwarp0 under %s: %s", base,
                              strerror(errno));
                return;
        }
        snprintf(dwv_top, sizeof(dwv_top), "%s", top);
        dwv_root_pid = getpid();
        dwv_top_fd = real_open()(top, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dwv_top_fd >= 0)
                flock(dwv_top_fd, LOCK_EX | LOCK_NB);
        atexit(tree_remove);
        snprintf(root, sizeof(root), "%s/diwarp0", top);
        if (mkdir(root, 0755) < 0 || tree_fill(root) < 0) {
                diwarpdv_warn("verbs: cannot write the sysfs tree of diwarp0 in %s: %s", top,
                              strerror(errno));
                return;
        }
        snprintf(dwv_root, sizeof(dwv_root), "%s", root);
        dwv_root_len = strlen(dwv_root);
}

/* path itself, or its place in the tree when it names DWV_SYSFS_DIR or
 * something under it. */
static const char *redirect(const char *path, char *buf, size_t cap)
{
        static const size_t plen = sizeof(DWV_SYSFS_DIR) - 1;
        if (!path || path[0] != '/' || path[1] != 's' || strncmp(path, DWV_SYSFS_DIR, plen) != 0 ||
            (path[plen] != '\0' && path[plen] != '/'))
                return path;
        pthread_once(&dwv_tree_once, tree_make);
        if (!dwv_root[0])
                return path;
        int n = snprintf(buf, cap, "%s%s", dwv_root, path + plen);
        return n > 0 && (size_t)n < cap ? buf : path;
}

#define REDIRECT(p)                                                                                \
        char rbuf_[512];                                                                           \
        const char *rp_ = redirect((p), rbuf_, sizeof(rbuf_))

static mode_t open_mode(int flags, va_list ap)
{
        return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

/* ---- the interposers ---------------------------------------------------- */

int dwv_open(const char *path, int flags, ...);
DWV_SYMVER(dwv_open, open, "GLIBC_2.2.5");
int dwv_open(const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t m = open_mode(flags, ap);
        va_end(ap);
        REDIRECT(path);
        return real_open()(rp_, flags, m);
}

int dwv_open64(const char *path, int flags, ...);
DWV_SYMVER(dwv_open64, open64, "GLIBC_2.2.5");
int dwv_open64(const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t m = open_mode(flags, ap);
        va_end(ap);
        REDIRECT(path);
        return real_open64()(rp_, flags, m);
}

int dwv_openat(int dfd, const char *path, int flags, ...);
DWV_SYMVER(dwv_openat, openat, "GLIBC_2.4");
int dwv_openat(int dfd, const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t m = open_mode(flags, ap);
        va_end(ap);
        REDIRECT(path);
        return real_openat()(dfd, rp_, flags, m);
}

int dwv_openat64(int dfd, const char *path, int flags, ...);
DWV_SYMVER(dwv_openat64, openat64, "GLIBC_2.4");
int dwv_openat64(int dfd, const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t m = open_mode(flags, ap);
        va_end(ap);
        REDIRECT(path);
        return real_openat64()(dfd, rp_, flags, m);
}

DWV_SYMVER(dwv___open_2, __open_2, "GLIBC_2.7");
int dwv___open_2(const char *path, int flags)
{
        REDIRECT(path);
        return real___open_2()(rp_, flags);
}

DWV_SYMVER(dwv___open64_2, __open64_2, "GLIBC_2.7");
int dwv___open64_2(const char *path, int flags)
{
        REDIRECT(path);
        return real___open64_2()(rp_, flags);
}

DWV_SYMVER(dwv___openat_2, __openat_2, "GLIBC_2.7");
int dwv___openat_2(int dfd, const char *path, int flags)
{
        REDIRECT(path);
        return real___openat_2()(dfd, rp_, flags);
}

DWV_SYMVER(dwv___openat64_2, __openat64_2, "GLIBC_2.7");
int dwv___openat64_2(int dfd, const char *path, int flags)
{
        REDIRECT(path);
        return real___openat64_2()(dfd, rp_, flags);
}

DWV_SYMVER(dwv_fopen, fopen, "GLIBC_2.2.5");
FILE *dwv_fopen(const char *path, const char *mode)
{
        REDIRECT(path);
        return real_fopen()(rp_, mode);
}

DWV_SYMVER(dwv_fopen64, fopen64, "GLIBC_2.2.5");
FILE *dwv_fopen64(const char *path, const char *mode)
{
        REDIRECT(path);
        return real_fopen64()(rp_, mode);
}

DWV_SYMVER(dwv_opendir, opendir, "GLIBC_2.2.5");
DIR *dwv_opendir(const char *path)
{
        REDIRECT(path);
        return real_opendir()(rp_);
}

DWV_SYMVER(dwv_stat, stat, "GLIBC_2.33");
int dwv_stat(const char *path, struct stat *st)
{
        REDIRECT(path);
        return real_stat()(rp_, st);
}

DWV_SYMVER(dwv_stat64, stat64, "GLIBC_2.33");
int dwv_stat64(const char *path, struct stat64 *st)
{
        REDIRECT(path);
        return real_stat64()(rp_, st);
}

DWV_SYMVER(dwv_lstat, lstat, "GLIBC_2.33");
int dwv_lstat(const char *path, struct stat *st)
{
        REDIRECT(path);
        return real_lstat()(rp_, st);
}

DWV_SYMVER(dwv_lstat64, lstat64, "GLIBC_2.33");
int dwv_lstat64(const char *path, struct stat64 *st)
{
        REDIRECT(path);
        return real_lstat64()(rp_, st);
}

DWV_SYMVER(dwv_fstatat, fstatat, "GLIBC_2.33");
int dwv_fstatat(int dfd, const char *path, struct stat *st, int flags)
{
        REDIRECT(path);
        return real_fstatat()(dfd, rp_, st, flags);
}

DWV_SYMVER(dwv_fstatat64, fstatat64, "GLIBC_2.33");
int dwv_fstatat64(int dfd, const char *path, struct stat64 *st, int flags)
{
        REDIRECT(path);
        return real_fstatat64()(dfd, rp_, st, flags);
}

DWV_SYMVER(dwv___xstat, __xstat, "GLIBC_2.2.5");
int dwv___xstat(int ver, const char *path, struct stat *st)
{
        REDIRECT(path);
        return real___xstat()(ver, rp_, st);
}

DWV_SYMVER(dwv___xstat64, __xstat64, "GLIBC_2.2.5");
int dwv___xstat64(int ver, const char *path, struct stat64 *st)
{
        REDIRECT(path);
        return real___xstat64()(ver, rp_, st);
}

DWV_SYMVER(dwv___lxstat, __lxstat, "GLIBC_2.2.5");
int dwv___lxstat(int ver, const char *path, struct stat *st)
{
        REDIRECT(path);
        return real___lxstat()(ver, rp_, st);
}

DWV_SYMVER(dwv___lxstat64, __lxstat64, "GLIBC_2.2.5");
int dwv___lxstat64(int ver, const char *path, struct stat64 *st)
{
        REDIRECT(path);
        return real___lxstat64()(ver, rp_, st);
}

DWV_SYMVER(dwv___fxstatat, __fxstatat, "GLIBC_2.4");
int dwv___fxstatat(int ver, int dfd, const char *path, struct stat *st, int flags)
{
        REDIRECT(path);
        return real___fxstatat()(ver, dfd, rp_, st, flags);
}

DWV_SYMVER(dwv___fxstatat64, __fxstatat64, "GLIBC_2.4");
int dwv___fxstatat64(int ver, int dfd, const char *path, struct stat64 *st, int flags)
{
        REDIRECT(path);
        return real___fxstatat64()(ver, dfd, rp_, st, flags);
}

DWV_SYMVER(dwv_statx, statx, "GLIBC_2.28");
int dwv_statx(int dfd, const char *path, int flags, unsigned int mask, struct statx *stx)
{
        REDIRECT(path);
        return real_statx()(dfd, rp_, flags, mask, stx);
}

DWV_SYMVER(dwv_access, access, "GLIBC_2.2.5");
int dwv_access(const char *path, int mode)
{
        REDIRECT(path);
        return real_access()(rp_, mode);
}

DWV_SYMVER(dwv_faccessat, faccessat, "GLIBC_2.4");
int dwv_faccessat(int dfd, const char *path, int mode, int flags)
{
        REDIRECT(path);
        return real_faccessat()(dfd, rp_, mode, flags);
}

DWV_SYMVER(dwv_readlink, readlink, "GLIBC_2.2.5");
ssize_t dwv_readlink(const char *path, char *buf, size_t size)
{
        REDIRECT(path);
        return real_readlink()(rp_, buf, size);
}

DWV_SYMVER(dwv_readlinkat, readlinkat, "GLIBC_2.4");
ssize_t dwv_readlinkat(int dfd, const char *path, char *buf, size_t size)
{
        REDIRECT(path);
        return real_readlinkat()(dfd, rp_, buf, size);
}

DWV_SYMVER(dwv_getxattr, getxattr, "GLIBC_2.3");
ssize_t dwv_getxattr(const char *path, const char *name, void *value, size_t size)
{
        REDIRECT(path);
        return real_getxattr()(rp_, name, value, size);
}

DWV_SYMVER(dwv_lgetxattr, lgetxattr, "GLIBC_2.3");
ssize_t dwv_lgetxattr(const char *path, const char *name, void *value, size_t size)
{
        REDIRECT(path);
        return real_lgetxattr()(rp_, name, value, size);
}

DWV_SYMVER(dwv_listxattr, listxattr, "GLIBC_2.3");
ssize_t dwv_listxattr(const char *path, char *list, size_t size)
{
        REDIRECT(path);
        return real_listxattr()(rp_, list, size);
}

DWV_SYMVER(dwv_llistxattr, llistxattr, "GLIBC_2.3");
ssize_t dwv_llistxattr(const char *path, char *list, size_t size)
{
        REDIRECT(path);
        return real_llistxattr()(rp_, list, size);
}
