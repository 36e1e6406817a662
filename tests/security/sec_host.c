/* tests/security: another user on the host, outside the daemon (README.md).
 * One case per run: sec_host CASE. Needs root (it plays two other uids);
 * skipped otherwise. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#include "sec_common.h"

#define VICTIM_UID 65533
#define VICTIM_GID 65533

static char pool[64], own[64];

static void at_exit(void)
{
        if (pool[0])
                shm_unlink(pool);
        if (own[0])
                shm_unlink(own);
}

/* The victim opens a device with a host in-flight cap on the pool name;
 * returns the open's result, its log line in err. */
static int victim_open(const char *name, char *err, size_t len)
{
        int pfd[2];
        CHECK(pipe(pfd) == 0, "pipe");
        fflush(stdout);
        pid_t p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0) {
                close(pfd[0]);
                dup2(pfd[1], 2);
                sec_become(VICTIM_UID, VICTIM_GID);
                unsetenv("DIWARP_PROGRESS");
                setenv("DIWARP_INFLIGHT_HOST", "64", 1);
                setenv("DIWARP_INFLIGHT_SHM", name, 1);
                struct diwarp_device *dev;
                int rc = diwarp_device_open(NULL, &dev);
                if (rc == 0)
                        diwarp_device_close(dev);
                _exit(rc == 0 ? 0 : -rc);
        }
        close(pfd[1]);
        ssize_t n = 0, k;
        while ((size_t)n < len - 1 && (k = read(pfd[0], err + n, len - 1 - (size_t)n)) > 0)
                n += k;
        err[n > 0 ? n : 0] = 0;
        close(pfd[0]);
        int st;
        CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st), "the victim crashed");
        return -WEXITSTATUS(st);
}

/* Item 10: another user pre-creates the victim's pool file (0600, then
 * 0666): the victim's device open is refused with a message naming the
 * file, its owner and the way out; with a name of its own it works. */
static int case_inflight_foreign(void)
{
        if (geteuid() != 0) {
                printf("SKIP: needs root to play two other uids\n");
                return SKIP;
        }
        snprintf(pool, sizeof(pool), "/dwsec-inflight-%d", (int)getpid());
        snprintf(own, sizeof(own), "/dwsec-inflight-own-%d", (int)getpid());
        shm_unlink(pool);
        shm_unlink(own);
        static const mode_t modes[] = {0600, 0666};
        for (int m = 0; m < 2; m++) {
                fflush(stdout);
                pid_t p = fork();
                CHECK(p >= 0, "fork");
                if (p == 0) {
                        sec_become(OTHER_UID, OTHER_GID);
                        int fd = shm_open(pool, O_RDWR | O_CREAT | O_EXCL, 0600);
                        _exit(fd >= 0 && fchmod(fd, modes[m]) == 0 &&
                                      ftruncate(fd, DW_IPC_MAX_MSG) == 0
                                  ? 0
                                  : 1);
                }
                int st;
                CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                      "the other user could not create the pool file");
                char err[2048];
                int rc = victim_open(pool, err, sizeof(err));
                CHECK(rc == -EPERM, "mode %03o: the victim's open: %d, want -EPERM (%s)", modes[m],
                      rc, err);
                char want[128];
                snprintf(want, sizeof(want),
                         "/dev/shm%s belongs to uid %u (mode %03o), not to uid %u", pool, OTHER_UID,
                         modes[m], VICTIM_UID);
                CHECK(
                    strstr(err, want) && strstr(err, "DIWARP_INFLIGHT_SHM"),
                    "mode %03o: the refusal does not name the file, its owner and the way out: %s",
                    modes[m], err);
                /* The file is left as it was: not taken over, not rewritten. */
                struct stat sb;
                char path[96];
                snprintf(path, sizeof(path), "/dev/shm%s", pool);
                CHECK(stat(path, &sb) == 0 && sb.st_uid == OTHER_UID &&
                          sb.st_size == DW_IPC_MAX_MSG,
                      "the other user's file was changed");
                shm_unlink(pool);
        }
        /* Beside it, the victim's own pool works, traffic included. */
        char err[2048];
        int rc = victim_open(own, err, sizeof(err));
        CHECK(rc == 0, "a pool of the victim's own: %d (%s)", rc, err);
        char host[64], shm[96];
        snprintf(host, sizeof(host), "DIWARP_INFLIGHT_HOST=64");
        snprintf(shm, sizeof(shm), "DIWARP_INFLIGHT_SHM=%s", own);
        sec_legit_run(VICTIM_UID, VICTIM_GID, (const char *const[]){host, shm, NULL});
        printf("OK inflight_foreign: another user's pool file refused by name; our own works\n");
        return 0;
}

int main(int argc, char **argv)
{
        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGPIPE, SIG_IGN);
        atexit(at_exit);
        const char *m = argc > 1 ? argv[1] : "";
        if (!strcmp(m, "inflight_foreign"))
                return case_inflight_foreign();
        fprintf(stderr, "usage: sec_host inflight_foreign\n");
        return 2;
}
