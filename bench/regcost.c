/* bench-regcost: memory registration and deregistration cost, warm and cold
 * pages, one process.
 *
 *   bench-regcost [--reps R] [--cpu C] SIZE...     (SIZE in bytes, k/m suffixes)
 *
 * For each size: warm pages (one mmap, touched, registered and deregistered
 * R times) and cold pages (a fresh untouched mmap per repetition). Prints one
 * line per size with the medians over the repetitions:
 *   RESULT size=S reps=R status=ok reg_us=.. dereg_us=.. regdereg_us=..
 *          cold_reg_us=.. cold_dereg_us=..
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <diwarp/diwarp.h>

static uint64_t now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return (x > y) - (x < y);
}

static double median(double *v, unsigned n)
{
        qsort(v, n, sizeof(*v), cmp_d);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t parse_size(const char *s)
{
        char *end;
        uint64_t v = strtoull(s, &end, 0);
        if (*end == 'k' || *end == 'K')
                v <<= 10, end++;
        else if (*end == 'm' || *end == 'M')
                v <<= 20, end++;
        return *end ? 0 : v;
}

static const int access_all =
    DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;

/* One reg + dereg of [p, p+len): times in microseconds, or -1 on error. */
static int one(struct diwarp_pd *pd, void *p, size_t len, double *reg, double *dereg)
{
        struct diwarp_mr *mr;
        uint64_t t0 = now_ns();
        int e = diwarp_mr_reg(pd, p, len, (uintptr_t)p, access_all, &mr);
        uint64_t t1 = now_ns();
        if (e) {
                fprintf(stderr, "register %zu bytes: %s\n", len, strerror(-e));
                return -1;
        }
        e = diwarp_mr_dereg(mr);
        uint64_t t2 = now_ns();
        if (e) {
                fprintf(stderr, "deregister %zu bytes: %s\n", len, strerror(-e));
                return -1;
        }
        *reg = (double)(t1 - t0) / 1e3;
        *dereg = (double)(t2 - t1) / 1e3;
        return 0;
}

int main(int argc, char **argv)
{
        unsigned reps = 21;
        int cpu = -1, first = 1;
        while (first < argc && argv[first][0] == '-') {
                if (!strcmp(argv[first], "--reps") && first + 1 < argc)
                        reps = (unsigned)atoi(argv[first + 1]);
                else if (!strcmp(argv[first], "--cpu") && first + 1 < argc)
                        cpu = atoi(argv[first + 1]);
                else
                        goto usage;
                first += 2;
        }
        if (first >= argc || reps == 0)
                goto usage;
        if (cpu >= 0) {
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(cpu, &set);
                if (sched_setaffinity(0, sizeof(set), &set))
                        perror("sched_setaffinity");
        }
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        int e = diwarp_device_open(NULL, &dev);
        if (e || (e = diwarp_pd_alloc(dev, &pd))) {
                fprintf(stderr, "device: %s\n", strerror(-e));
                printf("RESULT status=fail\n");
                return 1;
        }
        double *r = calloc(reps, sizeof(double)), *d = calloc(reps, sizeof(double));
        double *cr = calloc(reps, sizeof(double)), *cd = calloc(reps, sizeof(double));
        double *rd = calloc(reps, sizeof(double));
        int rc = 0;
        for (int a = first; a < argc && rc == 0; a++) {
                uint64_t len = parse_size(argv[a]);
                if (!len) {
                        fprintf(stderr, "bad size %s\n", argv[a]);
                        rc = 2;
                        break;
                }
                void *p =
                    mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p == MAP_FAILED) {
                        perror("mmap");
                        rc = 1;
                        break;
                }
                memset(p, 1, len);
                for (unsigned i = 0; i < reps && rc == 0; i++) {
                        if (one(pd, p, len, &r[i], &d[i]))
                                rc = 1;
                        rd[i] = r[i] + d[i];
                }
                munmap(p, len);
                for (unsigned i = 0; i < reps && rc == 0; i++) {
                        void *q = mmap(NULL, len, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                        if (q == MAP_FAILED) {
                                perror("mmap");
                                rc = 1;
                                break;
                        }
                        if (one(pd, q, len, &cr[i], &cd[i]))
                                rc = 1;
                        munmap(q, len);
                }
                if (rc)
                        break;
                printf("RESULT size=%llu reps=%u status=ok reg_us=%.3f dereg_us=%.3f "
                       "regdereg_us=%.3f cold_reg_us=%.3f cold_dereg_us=%.3f\n",
                       (unsigned long long)len, reps, median(r, reps), median(d, reps),
                       median(rd, reps), median(cr, reps), median(cd, reps));
                fflush(stdout);
        }
        if (rc)
                printf("RESULT status=fail\n");
        diwarp_pd_dealloc(pd);
        diwarp_device_close(dev);
        free(r), free(d), free(cr), free(cd), free(rd);
        return rc;
usage:
        fprintf(stderr, "usage: bench-regcost [--reps R] [--cpu C] SIZE...\n");
        return 2;
}
