/* Replays a libFuzzer corpus without libFuzzer: every file under the given
 * directories (or the files themselves) is passed once to the target. Used by
 * the test suite so the committed corpus runs under gcc + ASan/UBSan on every
 * build, not only when someone runs the fuzzers. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path, unsigned *count)
{
        FILE *f = fopen(path, "rb");
        if (!f) {
                fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
                return -1;
        }
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        for (;;) {
                if (len == cap) {
                        cap = cap ? cap * 2 : 4096;
                        uint8_t *grown = realloc(buf, cap);
                        if (!grown) {
                                free(buf);
                                fclose(f);
                                return -1;
                        }
                        buf = grown;
                }
                size_t n = fread(buf + len, 1, cap - len, f);
                if (n == 0)
                        break;
                len += n;
        }
        fclose(f);
        /* Copy into an exact-size allocation so ASan catches any read past the input. */
        uint8_t *exact = malloc(len ? len : 1);
        if (!exact) {
                free(buf);
                return -1;
        }
        if (len)
                memcpy(exact, buf, len);
        free(buf);
        LLVMFuzzerTestOneInput(exact, len);
        free(exact);
        (*count)++;
        return 0;
}

static int replay_path(const char *path, unsigned *count)
{
        struct stat st;
        if (stat(path, &st) != 0) {
                fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
                return -1;
        }
        if (!S_ISDIR(st.st_mode))
                return replay_file(path, count);
        DIR *d = opendir(path);
        if (!d) {
                fprintf(stderr, "replay: cannot open directory %s: %s\n", path, strerror(errno));
                return -1;
        }
        int rc = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
                if (e->d_name[0] == '.')
                        continue;
                char child[4096];
                snprintf(child, sizeof(child), "%s/%s", path, e->d_name);
                if (replay_path(child, count) != 0)
                        rc = -1;
        }
        closedir(d);
        return rc;
}

int main(int argc, char **argv)
{
        if (argc < 2) {
                fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
                return 2;
        }
        unsigned count = 0;
        int rc = 0;
        for (int i = 1; i < argc; i++)
                if (replay_path(argv[i], &count) != 0)
                        rc = 1;
        printf("replayed %u inputs\n", count);
        if (count == 0) {
                fprintf(stderr, "replay: no corpus inputs found\n");
                return 1;
        }
        return rc;
}
