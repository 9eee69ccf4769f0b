/* boltccl C example and conformance check.
 *
 *   cc -std=c99 allsum.c $(pkg-config --cflags --libs boltccl) -o allsum
 *   python3 -m boltccl.launch -n 4 -- ./allsum            # checks every call, prints "ok"
 *   python3 -m boltccl.launch -n 4 -- ./allsum --digest   # every rank prints result digests
 *
 * The digest mode reduces the same deterministic float32 and bfloat16 inputs as
 * examples/digest.rs (Rust) and python/tests/workers/digest.py, so the three can be
 * compared bit for bit, on every rank, with a reference python/tests/test_bitwise.py
 * computes itself.
 */
#include <boltccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(call)                                                                       \
    do {                                                                                  \
        boltccl_result r_ = (call);                                                       \
        if (r_ != BOLTCCL_RESULT_OK) {                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s (%u): %s\n", __FILE__, __LINE__, #call, \
                    boltccl_result_str(r_), (unsigned)r_, boltccl_last_error());          \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define EXPECT(cond, ...)                                            \
    do {                                                             \
        if (!(cond)) {                                               \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                            \
            fprintf(stderr, "\n");                                   \
            failures++;                                              \
        }                                                            \
    } while (0)

/* Deterministic inputs shared with the Rust and Python digest programs. */
static uint32_t mix(uint32_t i, uint32_t rank) { return i * 2654435761u + (rank + 1u) * 40503u; }
static float f32_input(uint32_t i, uint32_t rank) {
    uint32_t h = mix(i, rank);
    return (float)((int32_t)(h >> 8) - 8388608) / 1024.0f;
}
static uint16_t bf16_input(uint32_t i, uint32_t rank) {
    uint32_t h = mix(i, rank);
    return (uint16_t)((((h >> 16) & 0x07FFu) + 0x3C00u) | ((h & 1u) << 15));
}
static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int digest(boltccl_group *g) {
    static const size_t sizes[] = {1000, 262147};
    int rank = boltccl_rank(g);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *f = (float *)malloc(n * sizeof(float));
        uint16_t *b = (uint16_t *)malloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) {
            f[i] = f32_input((uint32_t)i, (uint32_t)rank);
            b[i] = bf16_input((uint32_t)i, (uint32_t)rank);
        }
        CHECK(boltccl_all_sum(g, f, f, n, BOLTCCL_FLOAT32));
        CHECK(boltccl_all_sum(g, b, b, n, BOLTCCL_BFLOAT16));
        printf("digest rank %d float32 %zu %016llx\n", rank, n, (unsigned long long)fnv1a(f, n * sizeof(float)));
        printf("digest rank %d bfloat16 %zu %016llx\n", rank, n, (unsigned long long)fnv1a(b, n * sizeof(uint16_t)));
        free(f);
        free(b);
    }
    return 0;
}

static void argument_errors(boltccl_group *g) {
    float a[4] = {0}, b[8] = {0};
    boltccl_group *out = (boltccl_group *)0x1;

    EXPECT(boltccl_init(NULL, NULL) == BOLTCCL_RESULT_NULL_PARAMETER, "init(NULL, NULL)");
    EXPECT(strstr(boltccl_last_error(), "out") != NULL, "last error names the argument: %s", boltccl_last_error());
    EXPECT(boltccl_barrier(NULL) == BOLTCCL_RESULT_NULL_PARAMETER, "barrier(NULL)");
    EXPECT(boltccl_rank(NULL) == -1 && boltccl_size(NULL) == -1, "rank/size of NULL");
    EXPECT(boltccl_all_sum(g, a, a, 4, 99) == BOLTCCL_RESULT_INVALID_PARAMETER, "unknown dtype");
    EXPECT(strstr(boltccl_last_error(), "dtype 99") != NULL, "%s", boltccl_last_error());
    EXPECT(boltccl_all_sum(g, NULL, a, 4, BOLTCCL_FLOAT32) == BOLTCCL_RESULT_NULL_PARAMETER, "NULL in");
    EXPECT(boltccl_all_sum(g, b, b + 1, 4, BOLTCCL_FLOAT32) == BOLTCCL_RESULT_INVALID_PARAMETER, "overlap");
    EXPECT(boltccl_broadcast(g, a, 4, BOLTCCL_FLOAT32, 99) == BOLTCCL_RESULT_INVALID_ARGUMENT, "root 99");
    EXPECT(strstr(boltccl_last_error(), "out of range") != NULL, "%s", boltccl_last_error());
    EXPECT(boltccl_broadcast(g, a, 4, BOLTCCL_FLOAT32, -1) == BOLTCCL_RESULT_INVALID_PARAMETER, "root -1");
    EXPECT(boltccl_send(g, a, 4, boltccl_rank(g)) == BOLTCCL_RESULT_INVALID_ARGUMENT, "send to self");
    EXPECT(boltccl_split(g, 0, 0, NULL) == BOLTCCL_RESULT_NULL_PARAMETER, "split out NULL");
    EXPECT(out == (boltccl_group *)0x1, "out untouched on failure");
    EXPECT(strcmp(boltccl_result_str(BOLTCCL_RESULT_TIMEOUT), "timed out") == 0, "result_str");
    EXPECT(strcmp(boltccl_result_str(123456), "unknown result code") == 0, "result_str unknown");
    /* The group is still usable after argument errors. */
    CHECK(boltccl_barrier(g));
    EXPECT(boltccl_last_error()[0] == '\0', "last error cleared by a successful call");
}

static void collectives(boltccl_group *g) {
    int rank = boltccl_rank(g), size = boltccl_size(g);
    enum { N = 1000 };
    float *x = (float *)malloc(N * sizeof(float)), *y = (float *)malloc(N * sizeof(float));
    float *all = (float *)malloc((size_t)size * N * sizeof(float));
    int64_t iv[N];
    size_t i;
    int r;

    for (i = 0; i < N; i++) x[i] = (float)(rank + 1) * (float)i;
    CHECK(boltccl_all_sum(g, x, y, N, BOLTCCL_FLOAT32));
    CHECK(boltccl_all_sum(g, x, x, N, BOLTCCL_FLOAT32));
    for (i = 0; i < N; i++) {
        float want = (float)(size * (size + 1) / 2) * (float)i;
        if (x[i] != want || y[i] != want) {
            EXPECT(0, "all_sum[%zu] = %g / %g, want %g", i, x[i], y[i], want);
            break;
        }
    }
    for (i = 0; i < N; i++) iv[i] = (int64_t)rank * 1000 - (int64_t)i;
    CHECK(boltccl_all_max(g, iv, iv, N, BOLTCCL_INT64));
    EXPECT(iv[7] == (int64_t)(size - 1) * 1000 - 7, "all_max = %lld", (long long)iv[7]);
    for (i = 0; i < N; i++) iv[i] = (int64_t)rank * 1000 - (int64_t)i;
    CHECK(boltccl_all_min(g, iv, iv, N, BOLTCCL_INT64));
    EXPECT(iv[7] == -7, "all_min = %lld", (long long)iv[7]);

    for (i = 0; i < N; i++) x[i] = (float)(rank * N + (int)i);
    CHECK(boltccl_all_gather(g, x, all, N, BOLTCCL_FLOAT32));
    for (i = 0; i < (size_t)size * N; i++) {
        if (all[i] != (float)i) {
            EXPECT(0, "all_gather[%zu] = %g", i, all[i]);
            break;
        }
    }
    for (i = 0; i < (size_t)size * N; i++) all[i] = (float)i;
    CHECK(boltccl_reduce_scatter(g, all, y, N, BOLTCCL_FLOAT32));
    EXPECT(y[5] == (float)size * (float)(rank * N + 5), "reduce_scatter = %g", y[5]);

    for (i = 0; i < N; i++) x[i] = rank == size - 1 ? (float)i : -1.0f;
    CHECK(boltccl_broadcast(g, x, N, BOLTCCL_FLOAT32, size - 1));
    EXPECT(x[N - 1] == (float)(N - 1), "broadcast = %g", x[N - 1]);

    /* All-to-all: part q of this rank's `all` goes to rank q. */
    for (i = 0; i < (size_t)size * N; i++) all[i] = (float)(rank * 100000) + (float)i;
    {
        float *out = (float *)malloc((size_t)size * N * sizeof(float));
        size_t *send = (size_t *)malloc((size_t)size * sizeof(size_t));
        size_t *recv = (size_t *)malloc((size_t)size * sizeof(size_t));
        CHECK(boltccl_all_to_all(g, all, out, N, BOLTCCL_FLOAT32));
        for (r = 0; r < size; r++) {
            float want = (float)(r * 100000) + (float)((size_t)rank * N + 3);
            EXPECT(out[(size_t)r * N + 3] == want, "all_to_all from %d = %g, want %g", r, out[(size_t)r * N + 3], want);
        }
        /* Per-peer counts: rank q sends q + 1 elements to everyone, and nothing to itself. */
        size_t got_total = 0, at = 0;
        for (r = 0; r < size; r++) {
            send[r] = r == rank ? 0 : (size_t)rank + 1;
            recv[r] = r == rank ? 0 : (size_t)r + 1;
            got_total += recv[r];
        }
        CHECK(boltccl_all_to_all_v(g, all, send, out, recv, BOLTCCL_FLOAT32));
        for (r = 0; r < size; r++) {
            if (r == rank) continue;
            /* Rank r's part for this rank starts after its parts for the ranks before. */
            size_t off = (size_t)(r + 1) * (size_t)(rank - (r < rank ? 1 : 0));
            EXPECT(out[at] == (float)(r * 100000) + (float)off, "all_to_all_v from %d = %g", r, out[at]);
            at += recv[r];
        }
        EXPECT(at == got_total, "all_to_all_v layout");
        /* A receive count that does not match what the peer sends is refused at once when the
         * counts do not add up to the buffer: the group stays usable. */
        EXPECT(boltccl_all_to_all_v(g, all, NULL, out, recv, BOLTCCL_FLOAT32) == BOLTCCL_RESULT_NULL_PARAMETER,
               "all_to_all_v NULL counts");
        free(out);
        free(send);
        free(recv);
    }
    /* Gather to, scatter from and reduce to the last rank. */
    for (i = 0; i < N; i++) x[i] = (float)(rank * N + (int)i);
    CHECK(boltccl_gather(g, x, rank == size - 1 ? all : NULL, N, BOLTCCL_FLOAT32, size - 1));
    if (rank == size - 1) EXPECT(all[(size_t)size * N - 1] == (float)((size_t)size * N - 1), "gather");
    for (i = 0; i < (size_t)size * N; i++) all[i] = (float)i;
    CHECK(boltccl_scatter(g, rank == size - 1 ? all : NULL, y, N, BOLTCCL_FLOAT32, size - 1));
    EXPECT(y[5] == (float)(rank * N + 5), "scatter = %g", y[5]);
    for (i = 0; i < N; i++) x[i] = (float)(rank + 1);
    CHECK(boltccl_reduce(g, x, x, N, BOLTCCL_FLOAT32, BOLTCCL_SUM, size - 1));
    EXPECT(x[0] == (rank == size - 1 ? (float)(size * (size + 1) / 2) : (float)(rank + 1)), "reduce = %g", x[0]);
    EXPECT(boltccl_reduce(g, x, x, N, BOLTCCL_FLOAT32, 7, 0) == BOLTCCL_RESULT_INVALID_PARAMETER, "reduce op 7");

    /* Ring: send to the right, receive from the left (even ranks send first). */
    {
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        char msg[32], got[32];
        memset(msg, 0, sizeof msg);
        memset(got, 0, sizeof got);
        snprintf(msg, sizeof msg, "hello from %d", rank);
        if (rank % 2 == 0) {
            CHECK(boltccl_send(g, msg, sizeof msg, right));
            CHECK(boltccl_recv(g, got, sizeof got, left));
        } else {
            CHECK(boltccl_recv(g, got, sizeof got, left));
            CHECK(boltccl_send(g, msg, sizeof msg, right));
        }
        snprintf(msg, sizeof msg, "hello from %d", left);
        EXPECT(strcmp(got, msg) == 0, "recv got '%s'", got);
    }

    /* Split into even and odd ranks, reversed by key; rank 0 opts out of any group. */
    {
        boltccl_group *sub = NULL;
        int color = rank == 0 ? -1 : rank % 2;
        CHECK(boltccl_split(g, color, -(int64_t)rank, &sub));
        if (rank == 0) {
            EXPECT(sub == NULL, "opted-out rank gets NULL");
        } else {
            int want = 0;
            for (r = 1; r < size; r++) want += (r % 2 == rank % 2);
            EXPECT(sub != NULL && boltccl_size(sub) == want, "sub size %d want %d", boltccl_size(sub), want);
            float one = 1.0f;
            CHECK(boltccl_all_sum(sub, &one, &one, 1, BOLTCCL_FLOAT32));
            EXPECT(one == (float)want, "sub all_sum = %g", one);
            boltccl_group_free(sub);
        }
    }
    free(x);
    free(y);
    free(all);
}

/* Non-blocking calls: started in order, finished by boltccl_wait / boltccl_test. */
static void nonblocking(boltccl_group *g) {
    int rank = boltccl_rank(g), size = boltccl_size(g);
    enum { M = 1 << 18 };
    float *big = (float *)malloc(M * sizeof(float));
    float *parts = (float *)malloc((size_t)size * sizeof(float));
    float mine = (float)rank, root_val = rank == 0 ? 42.0f : 0.0f;
    boltccl_request *sum = NULL, *gather = NULL, *bcast = NULL, *bad = (boltccl_request *)0x1;
    size_t i;
    int done = 0;

    for (i = 0; i < M; i++) big[i] = 1.0f;
    CHECK(boltccl_all_sum_async(g, big, big, M, BOLTCCL_FLOAT32, &sum));
    CHECK(boltccl_all_gather_async(g, &mine, parts, 1, BOLTCCL_FLOAT32, &gather));
    CHECK(boltccl_broadcast_async(g, &root_val, 1, BOLTCCL_FLOAT32, 0, &bcast));
    /* Argument errors come back at once and leave the request pointer alone. */
    EXPECT(boltccl_all_sum_async(g, big, big, M, 99, &bad) == BOLTCCL_RESULT_INVALID_PARAMETER, "async dtype");
    EXPECT(bad == (boltccl_request *)0x1, "request untouched on failure");
    /* A blocking call waits for the three started before it. */
    CHECK(boltccl_barrier(g));
    CHECK(boltccl_test(sum, &done));
    EXPECT(done == 1, "all_sum done after the barrier that followed it");
    CHECK(boltccl_wait(sum));
    CHECK(boltccl_wait(gather));
    CHECK(boltccl_wait(bcast));
    EXPECT(big[0] == (float)size && big[M - 1] == (float)size, "async all_sum = %g", big[0]);
    for (i = 0; i < (size_t)size; i++) EXPECT(parts[i] == (float)i, "async all_gather[%zu] = %g", i, parts[i]);
    EXPECT(root_val == 42.0f, "async broadcast = %g", root_val);
    boltccl_request_free(sum);
    boltccl_request_free(gather);
    boltccl_request_free(bcast);
    boltccl_request_free(NULL);
    {
        /* Each new call started and waited on its own: every part reaches its rank. */
        float red = 1.0f, one = (float)rank, *none = NULL;
        boltccl_request *a2a = NULL, *ga = NULL, *sc = NULL, *re = NULL, *a2av = NULL;
        float *to_all = (float *)malloc((size_t)size * sizeof(float)), *from_all = (float *)malloc((size_t)size * sizeof(float));
        size_t *ones = (size_t *)malloc((size_t)size * sizeof(size_t));
        for (i = 0; i < (size_t)size; i++) { to_all[i] = (float)(rank * 10 + (int)i); ones[i] = 1; }
        CHECK(boltccl_all_to_all_async(g, to_all, from_all, 1, BOLTCCL_FLOAT32, &a2a));
        CHECK(boltccl_wait(a2a));
        for (i = 0; i < (size_t)size; i++) EXPECT(from_all[i] == (float)((int)i * 10 + rank), "async all_to_all[%zu]", i);
        CHECK(boltccl_all_to_all_v_async(g, to_all, ones, from_all, ones, BOLTCCL_FLOAT32, &a2av));
        CHECK(boltccl_gather_async(g, &one, rank == 0 ? parts : none, 1, BOLTCCL_FLOAT32, 0, &ga));
        CHECK(boltccl_scatter_async(g, rank == 0 ? to_all : none, &one, 1, BOLTCCL_FLOAT32, 0, &sc));
        CHECK(boltccl_reduce_async(g, &red, &red, 1, BOLTCCL_FLOAT32, BOLTCCL_MAX, 0, &re));
        CHECK(boltccl_wait(a2av));
        CHECK(boltccl_wait(ga));
        CHECK(boltccl_wait(sc));
        CHECK(boltccl_wait(re));
        EXPECT(one == (float)rank, "async scatter = %g", one);
        if (rank == 0) for (i = 0; i < (size_t)size; i++) EXPECT(parts[i] == (float)i, "async gather[%zu]", i);
        EXPECT(red == 1.0f, "async reduce = %g", red);
        boltccl_request_free(a2a);
        boltccl_request_free(a2av);
        boltccl_request_free(ga);
        boltccl_request_free(sc);
        boltccl_request_free(re);
        free(to_all);
        free(from_all);
        free(ones);
    }
    free(big);
    free(parts);
}

int main(int argc, char **argv) {
    boltccl_group *g = NULL;
    CHECK(boltccl_init(NULL, &g));
    if (argc > 1 && strcmp(argv[1], "--digest") == 0) {
        digest(g);
    } else {
        argument_errors(g);
        collectives(g);
        nonblocking(g);
    }
    CHECK(boltccl_barrier(g));
    if (failures == 0 && argc <= 1) printf("rank %d of %d: ok (boltccl %s)\n", boltccl_rank(g), boltccl_size(g), boltccl_version());
    boltccl_group_free(g);
    return failures == 0 ? 0 : 1;
}
