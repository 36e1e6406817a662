/* An MPI program that checks the data it moves (each rank first prints
 * "rank R of N on HOST"): point-to-point messages from
 * 1 B to 64 MiB (both directions, each byte a function of sender, size and
 * offset), MPI_Bcast, MPI_Reduce, MPI_Allreduce and MPI_Alltoall. Any
 * mismatch is printed with the rank, the operation, the size and the first
 * bad offset, and the program exits 1 through MPI_Abort. Rank 0 prints one
 * "ok" line per operation and, at the end, "mpi_check: all ok (N ranks)".
 * Synchronous sends (MPI_Ssend) run both ways between rank 0 and the last
 * rank unless the second argument is "nossend".
 *   mpirun -np N mpi_check [MAX_BYTES [nossend]]   (default and largest: 64 MiB) */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEFAULT (64u << 20)

static int rank, nranks;

static void die(const char *op, size_t size, size_t off, unsigned got, unsigned want)
{
        fprintf(stderr, "mpi_check: rank %d: %s of %zu bytes: byte %zu is 0x%02x, want 0x%02x\n",
                rank, op, size, off, got, want);
        MPI_Abort(MPI_COMM_WORLD, 1);
        exit(1);
}

/* The byte at OFF of a message of SIZE bytes sent by rank SRC. */
static uint8_t pattern(int src, size_t size, size_t off)
{
        uint32_t x = (uint32_t)off * 2654435761u + (uint32_t)size * 40503u + (uint32_t)src * 97u;
        return (uint8_t)(x ^ (x >> 13) ^ (x >> 24));
}

static void fill(uint8_t *buf, int src, size_t size)
{
        for (size_t i = 0; i < size; i++)
                buf[i] = pattern(src, size, i);
}

static void verify(const char *op, const uint8_t *buf, int src, size_t size)
{
        for (size_t i = 0; i < size; i++)
                if (buf[i] != pattern(src, size, i))
                        die(op, size, i, buf[i], pattern(src, size, i));
}

static void ok(const char *what, size_t size)
{
        if (rank == 0)
                printf("ok %s %zu\n", what, size);
}

/* Rank 0 and the last rank exchange messages of SIZE bytes, each way; the
 * receive buffer is poisoned first so stale data cannot pass. */
static void p2p(uint8_t *sbuf, uint8_t *rbuf, size_t size)
{
        int peer = rank == 0 ? nranks - 1 : 0;
        int active = rank == 0 || rank == nranks - 1;
        MPI_Status st;

        if (active) {
                fill(sbuf, rank, size);
                memset(rbuf, 0xa5, size);
                MPI_Sendrecv(sbuf, (int)size, MPI_BYTE, peer, 7, rbuf, (int)size, MPI_BYTE, peer, 7,
                             MPI_COMM_WORLD, &st);
                int count;
                MPI_Get_count(&st, MPI_BYTE, &count);
                if ((size_t)count != size) {
                        fprintf(stderr, "mpi_check: rank %d: received %d bytes, want %zu\n", rank,
                                count, size);
                        MPI_Abort(MPI_COMM_WORLD, 1);
                }
                verify("sendrecv", rbuf, peer, size);
                /* One way with blocking Send/Recv too (eager and rendezvous). */
                if (rank == 0) {
                        MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 8, MPI_COMM_WORLD);
                } else {
                        memset(rbuf, 0x5a, size);
                        MPI_Recv(rbuf, (int)size, MPI_BYTE, 0, 8, MPI_COMM_WORLD, &st);
                        verify("send/recv", rbuf, 0, size);
                }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        ok("p2p", size);
}

/* MPI_Ssend completes only once the receiver has matched it: rank 0 to the
 * last rank, then back. */
static void ssend(uint8_t *sbuf, uint8_t *rbuf, size_t size)
{
        int last = nranks - 1;
        MPI_Status st;

        for (int dir = 0; dir < 2; dir++) {
                int from = dir == 0 ? 0 : last, to = dir == 0 ? last : 0;
                if (rank == from) {
                        fill(sbuf, rank, size);
                        MPI_Ssend(sbuf, (int)size, MPI_BYTE, to, 9, MPI_COMM_WORLD);
                } else if (rank == to) {
                        memset(rbuf, 0x69, size);
                        MPI_Recv(rbuf, (int)size, MPI_BYTE, from, 9, MPI_COMM_WORLD, &st);
                        verify("ssend", rbuf, from, size);
                }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        ok("ssend", size);
}

static void bcast(uint8_t *buf, size_t size)
{
        int root = nranks - 1;
        if (rank == root)
                fill(buf, root, size);
        else
                memset(buf, 0x3c, size);
        MPI_Bcast(buf, (int)size, MPI_BYTE, root, MPI_COMM_WORLD);
        verify("bcast", buf, root, size);
        ok("bcast", size);
}

/* Element i of rank r is r * 1000003 + i: the sum over ranks is known. */
static void reduce(size_t n)
{
        int64_t *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
        if (!in || !out) {
                fprintf(stderr, "mpi_check: rank %d: out of memory\n", rank);
                MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (size_t i = 0; i < n; i++)
                in[i] = (int64_t)rank * 1000003 + (int64_t)i;
        int64_t rsum = (int64_t)nranks * (nranks - 1) / 2 * 1000003;
        for (int all = 0; all < 2; all++) {
                for (size_t i = 0; i < n; i++)
                        out[i] = -1;
                if (all)
                        MPI_Allreduce(in, out, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
                else
                        MPI_Reduce(in, out, (int)n, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
                if (all || rank == 0)
                        for (size_t i = 0; i < n; i++) {
                                int64_t want = rsum + (int64_t)nranks * (int64_t)i;
                                if (out[i] != want) {
                                        fprintf(stderr,
                                                "mpi_check: rank %d: %s of %zu int64: element "
                                                "%zu is %lld, want %lld\n",
                                                rank, all ? "allreduce" : "reduce", n, i,
                                                (long long)out[i], (long long)want);
                                        MPI_Abort(MPI_COMM_WORLD, 1);
                                }
                        }
                ok(all ? "allreduce" : "reduce", n * sizeof *in);
        }
        free(in);
        free(out);
}

/* Block j of rank r's send buffer goes to rank j; it is filled with the
 * pattern of sender r and a size that names the destination. */
static void alltoall(size_t block)
{
        uint8_t *s = malloc(block * nranks), *r = malloc(block * nranks);
        if (!s || !r) {
                fprintf(stderr, "mpi_check: rank %d: out of memory\n", rank);
                MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int j = 0; j < nranks; j++)
                for (size_t i = 0; i < block; i++)
                        s[j * block + i] = pattern(rank, block + (size_t)j, i);
        memset(r, 0x77, block * nranks);
        MPI_Alltoall(s, (int)block, MPI_BYTE, r, (int)block, MPI_BYTE, MPI_COMM_WORLD);
        for (int j = 0; j < nranks; j++)
                for (size_t i = 0; i < block; i++) {
                        uint8_t want = pattern(j, block + (size_t)rank, i);
                        if (r[j * block + i] != want)
                                die("alltoall", block, j * block + i, r[j * block + i], want);
                }
        free(s);
        free(r);
        ok("alltoall", block);
}

int main(int argc, char **argv)
{
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &nranks);
        char host[MPI_MAX_PROCESSOR_NAME];
        int hlen;
        MPI_Get_processor_name(host, &hlen);
        printf("rank %d of %d on %s\n", rank, nranks, host);
        fflush(stdout);
        size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : MAX_DEFAULT;
        int with_ssend = !(argc > 2 && strcmp(argv[2], "nossend") == 0);
        if (max == 0 || max > MAX_DEFAULT)
                max = MAX_DEFAULT;
        uint8_t *sbuf = malloc(max), *rbuf = malloc(max);
        if (!sbuf || !rbuf) {
                fprintf(stderr, "mpi_check: rank %d: cannot allocate 2 x %zu bytes\n", rank, max);
                MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* Sizes around the eager/rendezvous switch points, odd sizes, up to
         * MAX. */
        static const size_t sizes[] = {1,     7,     64,     1000,    4096,   8191,
                                       16384, 65537, 262144, 1 << 20, 4 << 20};
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes && sizes[k] <= max; k++)
                p2p(sbuf, rbuf, sizes[k]);
        p2p(sbuf, rbuf, max);
        if (with_ssend)
                for (size_t b = 1; b <= max; b *= 256)
                        ssend(sbuf, rbuf, b);
        for (size_t b = 1; b <= max && b <= (8u << 20); b *= 64)
                bcast(rbuf, b);
        reduce(1);
        reduce(100000);
        alltoall(1);
        alltoall(100000);
        free(sbuf);
        free(rbuf);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
                printf("mpi_check: all ok (%d ranks)\n", nranks);
        MPI_Finalize();
        return 0;
}
