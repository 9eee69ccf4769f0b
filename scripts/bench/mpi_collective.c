/* Open MPI's MPI_Alltoall (or MPI_Allreduce, a sum) of float32, timed with the peers'
 * protocol (shared/bench/peers, common.py): per size a warm-up, rank 0's estimate broadcast
 * so every rank runs the same number of timed iterations, each iteration timed on its own,
 * the per-rank median, the slowest rank's median reported; then a check of every element.
 * Written in C (not mpi4py) so that nothing but MPI stands between the timer and the call.
 * Buffers of 4 MiB or more are advised onto huge pages, as numpy's arrays (and
 * `boltccl bench --pages huge`) are.
 *
 *   mpicc -O2 -o mpi_collective mpi_collective.c
 *   mpirun -np N mpi_collective RESULTS.jsonl LABEL BUDGET_S SIZE[,SIZE...] [all_to_all|all_sum]
 * SIZE: bytes per rank (the whole send buffer; for all_to_all SIZE/N to each rank). One JSON
 * line per size, its "op" the operation (all_to_all when not named). */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float value(int rank, size_t i) { return (float)((rank * 131 + i * 7) % 1021); }

/* The operation measured: all_to_all (m elements to each rank) or all_sum (of count). */
static int all_sum;

static void call(float *s, float *r, size_t count, size_t m) {
    if (all_sum) {
        MPI_Allreduce(s, r, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
        MPI_Alltoall(s, (int)m, MPI_FLOAT, r, (int)m, MPI_FLOAT, MPI_COMM_WORLD);
    }
}

/* Element i of rank `rank`'s result, from every rank's input value(q, j). Small integers:
 * every sum is exact, whatever the order. */
static float expected(int rank, int n, size_t i, size_t m) {
    if (!all_sum) return value((int)(i / m), rank * m + i % m);
    float sum = 0;
    for (int q = 0; q < n; q++) sum += value(q, i);
    return sum;
}

static float *alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 2 << 20, bytes ? bytes : 4)) return NULL;
    if (bytes >= (4u << 20)) madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 5) {
        if (rank == 0) fprintf(stderr, "usage: mpi_collective RESULTS.jsonl LABEL BUDGET_S SIZE[,SIZE...] [all_to_all|all_sum]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    all_sum = argc > 5 && strcmp(argv[5], "all_sum") == 0;
    if (argc > 5 && !all_sum && strcmp(argv[5], "all_to_all") != 0) {
        if (rank == 0) fprintf(stderr, "unknown operation %s: all_to_all or all_sum\n", argv[5]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *out = argv[1], *label = argv[2];
    double budget = atof(argv[3]);
    char *sizes = strdup(argv[4]);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int vlen;
    MPI_Get_library_version(version, &vlen);
    char *comma = strchr(version, ',');
    if (comma) *comma = 0;
    int all_ok = 1;
    for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
        size_t bytes = strtoull(tok, NULL, 10), count = bytes / 4, m = count / n;
        if (count == 0 || (!all_sum && (m == 0 || count % n))) {
            if (rank == 0) fprintf(stderr, "size %zu does not split into %d float32 parts\n", bytes, n);
            continue;
        }
        float *s = alloc(bytes), *r = alloc(bytes);
        int warm = bytes <= 65536 ? 50 : bytes <= (1 << 20) ? 10 : 3;
        double t0 = now_us();
        for (int i = 0; i < warm; i++) call(s, r, count, m);
        double est = (now_us() - t0) / warm / 1e6;
        MPI_Bcast(&est, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        long iters = (long)(budget / (est > 1e-9 ? est : 1e-9));
        iters = iters < 10 ? 10 : iters > 10000 ? 10000 : iters;
        double *lat = malloc(iters * sizeof(double));
        for (long i = 0; i < iters; i++) {
            double a = now_us();
            call(s, r, count, m);
            lat[i] = now_us() - a;
        }
        qsort(lat, iters, sizeof(double), cmp);
        double med = iters % 2 ? lat[iters / 2] : (lat[iters / 2 - 1] + lat[iters / 2]) / 2, worst;
        MPI_Allreduce(&med, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        /* The check: for all_to_all, block q of the result is block `rank` of rank q's input. */
        for (size_t i = 0; i < count; i++) s[i] = value(rank, i), r[i] = -1;
        call(s, r, count, m);
        int ok = 1, all;
        for (size_t i = 0; i < count && ok; i++) ok = r[i] == expected(rank, n, i, m);
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        all_ok &= all;
        if (rank == 0) {
            FILE *f = fopen(out, "a");
            fprintf(f,
                    "{\"peer\": \"%s\", \"op\": \"%s\", \"n\": %d, \"bytes\": %zu, \"iters\": %ld, "
                    "\"median_us\": %.3f, \"correct\": %s, \"version\": \"%s\"}\n",
                    label, all_sum ? "all_sum" : "all_to_all", n, bytes, iters, worst, all ? "true" : "false", version);
            fclose(f);
            printf("[%s n=%d] %10zu B: median %11.1f us  iters %5ld  correct=%d\n", label, n, bytes, worst, iters, all);
            fflush(stdout);
        }
        free(lat);
        free(s);
        free(r);
    }
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
