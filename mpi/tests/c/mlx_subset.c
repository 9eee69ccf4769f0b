/* Uses libboltccl_mpi the way MLX's mpi backend does (mlx/distributed/mpi/mpi.cpp): dlopen,
 * the version check, every function and object resolved by name, float16/bfloat16 as
 * contiguous(2, uint8) with user sums, MPI_IN_PLACE, MPI_ANY_TAG, split communicators freed
 * after MPI_Finalize. Compiled against Open MPI's own mpi.h, so its types and constants
 * (MPI_Status, MPI_IN_PLACE, MPI_ANY_TAG, MPI_UNDEFINED, ...) are Open MPI's.
 *
 * usage: mlx_subset LIBRARY MODE
 *   ok              every call, results checked; exits 0
 *   any_source      MPI_Recv from MPI_ANY_SOURCE (the subset refuses it: fatal)
 *   count_mismatch  rank 1 receives one item more than rank 0 sends (fatal on both)
 *   die             the last rank kills itself between all-reduces
 *   stall           the last rank stops itself (SIGSTOP) between all-reduces
 *   bad_tag         MPI_Send with tag 5 (fatal)
 */
#include <mpi.h>

#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FN(name) static __typeof__(&name) p_##name;
FN(MPI_Get_library_version)
FN(MPI_Init)
FN(MPI_Finalize)
FN(MPI_Comm_rank)
FN(MPI_Comm_size)
FN(MPI_Comm_split)
FN(MPI_Comm_free)
FN(MPI_Allreduce)
FN(MPI_Allgather)
FN(MPI_Send)
FN(MPI_Recv)
FN(MPI_Type_contiguous)
FN(MPI_Type_commit)
FN(MPI_Op_create)

static MPI_Comm world, comm_null;
static MPI_Op op_sum, op_max, op_min;
static MPI_Datatype t_bool, t_i8, t_u8, t_i16, t_u16, t_i32, t_u32, t_i64, t_u64, t_f32, t_f64, t_c64;
static int rank, size;

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "missing symbol %s: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

#define CHECK(cond, ...)                                               \
    do {                                                               \
        if (!(cond)) {                                                 \
            fprintf(stderr, "rank %d: check failed: %s: ", rank, #cond); \
            fprintf(stderr, __VA_ARGS__);                              \
            fprintf(stderr, "\n");                                     \
            exit(3);                                                   \
        }                                                              \
    } while (0)

#define OK(call) CHECK((call) == MPI_SUCCESS, "%s", #call)

/* MLX's user reductions: acc += in, acc = max(acc, in), ... */
static void sum_f16(void *in, void *acc, int *len, MPI_Datatype *t) {
    (void)t;
    for (int i = 0; i < *len; i++) ((_Float16 *)acc)[i] += ((_Float16 *)in)[i];
}

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even (no NaNs here) */
    return (uint16_t)(u >> 16);
}

static void sum_bf16(void *in, void *acc, int *len, MPI_Datatype *t) {
    (void)t;
    for (int i = 0; i < *len; i++) {
        uint16_t *a = (uint16_t *)acc + i;
        *a = f32_to_bf16(bf16_to_f32(*a) + bf16_to_f32(((uint16_t *)in)[i]));
    }
}

/* A function the library cannot recognise: it must fold it in rank order. */
static void prod_f16(void *in, void *acc, int *len, MPI_Datatype *t) {
    (void)t;
    for (int i = 0; i < *len; i++) ((_Float16 *)acc)[i] *= ((_Float16 *)in)[i];
}

static uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ULL;
    return h;
}

/* Every rank holds the same bytes. */
static void same_everywhere(const void *p, size_t n, const char *what) {
    uint64_t mine = fnv(p, n), all[64];
    OK(p_MPI_Allgather(&mine, 1, t_u64, all, 1, t_u64, world));
    for (int r = 0; r < size; r++) CHECK(all[r] == mine, "%s differs between rank %d and rank %d", what, r, rank);
}

static void collectives(void) {
    enum { N = 1000 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)rank + 0.5f * (float)i;
    OK(p_MPI_Allreduce(x, y, N, t_f32, op_sum, world));
    OK(p_MPI_Allreduce(MPI_IN_PLACE, x, N, t_f32, op_sum, world));
    float ranks = (float)(size * (size - 1) / 2);
    for (int i = 0; i < N; i++) {
        float want = ranks + (float)size * 0.5f * (float)i;
        CHECK(y[i] == want && x[i] == want, "float sum [%d] = %g / %g, want %g", i, y[i], x[i], want);
    }

    int32_t m[3] = {rank, -rank, rank * 7 - 3};
    int32_t mx[3], mn[3];
    OK(p_MPI_Allreduce(m, mx, 3, t_i32, op_max, world));
    OK(p_MPI_Allreduce(m, mn, 3, t_i32, op_min, world));
    CHECK(mx[0] == size - 1 && mx[1] == 0 && mn[0] == 0 && mn[1] == -(size - 1), "int32 max/min");

    int64_t big = (int64_t)1 << 40;
    OK(p_MPI_Allreduce(MPI_IN_PLACE, &big, 1, t_i64, op_sum, world));
    CHECK(big == ((int64_t)size << 40), "int64 sum %lld", (long long)big);

    uint8_t w = 200;
    OK(p_MPI_Allreduce(MPI_IN_PLACE, &w, 1, t_u8, op_sum, world));
    CHECK(w == (uint8_t)(200 * size), "uint8 sum wraps: %u", w);

    _Bool any = rank == size - 1, all = rank != 0, anyv, allv;
    OK(p_MPI_Allreduce(&any, &anyv, 1, t_bool, op_sum, world));
    OK(p_MPI_Allreduce(&all, &allv, 1, t_bool, op_min, world));
    CHECK(anyv == 1 && allv == 0, "bool sum is or, min is and");

    double d = 0.1 * rank, ds;
    OK(p_MPI_Allreduce(&d, &ds, 1, t_f64, op_sum, world));
    same_everywhere(&ds, sizeof ds, "double sum");

    float c[2] = {(float)rank, 1.0f};
    OK(p_MPI_Allreduce(MPI_IN_PLACE, c, 1, t_c64, op_sum, world));
    CHECK(c[0] == ranks && c[1] == (float)size, "complex64 sum");

    /* float16 and bfloat16, as MLX makes them. */
    MPI_Datatype t_f16, t_bf16;
    MPI_Op sum16, sumb16, prod16;
    OK(p_MPI_Type_contiguous(2, t_u8, &t_f16));
    OK(p_MPI_Type_commit(&t_f16));
    OK(p_MPI_Type_contiguous(2, t_u8, &t_bf16));
    OK(p_MPI_Type_commit(&t_bf16));
    OK(p_MPI_Op_create(&sum_f16, 1, &sum16));
    OK(p_MPI_Op_create(&sum_bf16, 1, &sumb16));
    OK(p_MPI_Op_create(&prod_f16, 1, &prod16));
    _Float16 h[N];
    uint16_t b[N];
    for (int i = 0; i < N; i++) {
        h[i] = (_Float16)(0.25f * (float)(rank + i % 17));
        b[i] = f32_to_bf16(0.125f * (float)(rank + i % 13));
    }
    OK(p_MPI_Allreduce(MPI_IN_PLACE, h, N, t_f16, sum16, world));
    OK(p_MPI_Allreduce(MPI_IN_PLACE, b, N, t_bf16, sumb16, world));
    for (int i = 0; i < N; i++) {
        float wh = 0.25f * (float)(size * (i % 17)) + 0.25f * ranks;
        float wb = 0.125f * (float)(size * (i % 13)) + 0.125f * ranks;
        CHECK((float)h[i] == wh, "float16 sum [%d] = %g, want %g", i, (float)h[i], wh);
        CHECK(bf16_to_f32(b[i]) == wb, "bfloat16 sum [%d] = %g, want %g", i, bf16_to_f32(b[i]), wb);
    }
    _Float16 p[4] = {(_Float16)(rank + 1), (_Float16)0.5f, (_Float16)-1.0f, (_Float16)1.5f};
    OK(p_MPI_Allreduce(MPI_IN_PLACE, p, 4, t_f16, prod16, world));
    float fact = 1;
    for (int r = 1; r <= size; r++) fact *= (float)r;
    CHECK((float)p[0] == fact, "folded float16 product %g, want %g", (float)p[0], fact);
    same_everywhere(p, sizeof p, "folded float16 product");

    /* all_gather, out of place and in place. */
    int32_t mine[2] = {rank * 10, rank * 10 + 1}, got[128], inplace[128];
    OK(p_MPI_Allgather(mine, 2, t_i32, got, 2, t_i32, world));
    inplace[2 * rank] = mine[0];
    inplace[2 * rank + 1] = mine[1];
    OK(p_MPI_Allgather(MPI_IN_PLACE, 0, NULL, inplace, 2, t_i32, world));
    for (int r = 0; r < size; r++)
        CHECK(got[2 * r] == r * 10 && got[2 * r + 1] == r * 10 + 1 && inplace[2 * r] == r * 10 &&
                  inplace[2 * r + 1] == r * 10 + 1,
              "all_gather block %d", r);

    /* send/recv around the ring, received with MPI_ANY_TAG as MLX does. */
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    int64_t out[5] = {rank, rank, rank, rank, rank}, in[5];
    MPI_Status st;
    if (rank % 2 == 0) {
        OK(p_MPI_Send(out, 5, t_i64, to, 0, world));
        OK(p_MPI_Recv(in, 5, t_i64, from, MPI_ANY_TAG, world, &st));
    } else {
        OK(p_MPI_Recv(in, 5, t_i64, from, MPI_ANY_TAG, world, &st));
        OK(p_MPI_Send(out, 5, t_i64, to, 0, world));
    }
    CHECK(in[4] == from && st.MPI_SOURCE == from && st.MPI_TAG == 0 && st.MPI_ERROR == MPI_SUCCESS, "recv");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s LIBRARY MODE\n", argv[0]);
        return 2;
    }
    const char *mode = argv[2];
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
#define LOAD(name) p_##name = (__typeof__(p_##name))sym(lib, #name);
    LOAD(MPI_Get_library_version)
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int vlen = 0;
    p_MPI_Get_library_version(version, &vlen);
    if (!strstr(version, "Open MPI") || (size_t)vlen != strlen(version)) {
        fprintf(stderr, "MLX would refuse this library: %s\n", version);
        return 2;
    }
    LOAD(MPI_Init)
    LOAD(MPI_Finalize)
    LOAD(MPI_Comm_rank)
    LOAD(MPI_Comm_size)
    LOAD(MPI_Comm_split)
    LOAD(MPI_Comm_free)
    LOAD(MPI_Allreduce)
    LOAD(MPI_Allgather)
    LOAD(MPI_Send)
    LOAD(MPI_Recv)
    LOAD(MPI_Type_contiguous)
    LOAD(MPI_Type_commit)
    LOAD(MPI_Op_create)
    world = sym(lib, "ompi_mpi_comm_world");
    comm_null = sym(lib, "ompi_mpi_comm_null");
    op_sum = sym(lib, "ompi_mpi_op_sum");
    op_max = sym(lib, "ompi_mpi_op_max");
    op_min = sym(lib, "ompi_mpi_op_min");
    t_bool = sym(lib, "ompi_mpi_c_bool");
    t_i8 = sym(lib, "ompi_mpi_int8_t");
    t_u8 = sym(lib, "ompi_mpi_uint8_t");
    t_i16 = sym(lib, "ompi_mpi_int16_t");
    t_u16 = sym(lib, "ompi_mpi_uint16_t");
    t_i32 = sym(lib, "ompi_mpi_int32_t");
    t_u32 = sym(lib, "ompi_mpi_uint32_t");
    t_i64 = sym(lib, "ompi_mpi_int64_t");
    t_u64 = sym(lib, "ompi_mpi_uint64_t");
    t_f32 = sym(lib, "ompi_mpi_float");
    t_f64 = sym(lib, "ompi_mpi_double");
    t_c64 = sym(lib, "ompi_mpi_c_complex");

    OK(p_MPI_Init(NULL, NULL));
    OK(p_MPI_Comm_rank(world, &rank));
    OK(p_MPI_Comm_size(world, &size));
    CHECK(size >= 2 && size <= 64, "size %d", size);

    if (!strcmp(mode, "any_source")) {
        int v;
        p_MPI_Recv(&v, 1, t_i32, MPI_ANY_SOURCE, 0, world, MPI_STATUS_IGNORE);
        return 0; /* not reached: fatal */
    }
    if (!strcmp(mode, "bad_tag")) {
        int v = 0;
        if (rank == 0) p_MPI_Send(&v, 1, t_i32, 1, 5, world);
        if (rank == 1) p_MPI_Recv(&v, 1, t_i32, 0, MPI_ANY_TAG, world, MPI_STATUS_IGNORE);
        return 0;
    }
    if (!strcmp(mode, "count_mismatch")) {
        int v[5] = {0};
        if (rank == 0) p_MPI_Send(v, 4, t_i32, 1, 0, world);
        if (rank == 1) p_MPI_Recv(v, 5, t_i32, 0, MPI_ANY_TAG, world, MPI_STATUS_IGNORE);
        float f = 1;
        p_MPI_Allreduce(MPI_IN_PLACE, &f, 1, t_f32, op_sum, world);
        return 0;
    }
    if (!strcmp(mode, "die") || !strcmp(mode, "stall")) {
        for (int i = 0;; i++) {
            float f = 1;
            if (i == 50 && rank == size - 1) raise(!strcmp(mode, "die") ? SIGKILL : SIGSTOP);
            p_MPI_Allreduce(MPI_IN_PLACE, &f, 1, t_f32, op_sum, world);
            CHECK(f == (float)size, "sum %g", f);
        }
    }

    collectives();

    /* Split as MLX does (key = rank unless given): odd and even ranks, the order reversed. */
    MPI_Comm half, none;
    OK(p_MPI_Comm_split(world, rank % 2, -rank, &half));
    int hr, hs;
    OK(p_MPI_Comm_rank(half, &hr));
    OK(p_MPI_Comm_size(half, &hs));
    CHECK(hs == (size + 1 - rank % 2) / 2, "split size %d", hs);
    CHECK(hr == (hs - 1) - rank / 2, "split rank %d", hr);
    int32_t v = rank, vs;
    OK(p_MPI_Allreduce(&v, &vs, 1, t_i32, op_sum, half));
    int32_t want = 0;
    for (int r = rank % 2; r < size; r += 2) want += r;
    CHECK(vs == want, "sum over the split group %d, want %d", vs, want);
    OK(p_MPI_Comm_split(world, rank == 0 ? MPI_UNDEFINED : 1, 0, &none));
    CHECK((rank == 0) == (none == comm_null), "MPI_UNDEFINED gives MPI_COMM_NULL");
    if (none != comm_null) OK(p_MPI_Comm_free(&none));
    CHECK(none == comm_null, "MPI_Comm_free resets the handle");

    /* MLX's order at exit: the world first, then the split communicators. */
    OK(p_MPI_Finalize());
    OK(p_MPI_Comm_free(&half));
    printf("rank %d: ok\n", rank);
    return 0;
}
