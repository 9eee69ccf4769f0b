/* What a one-line mailbox would save over a ring for small frames, on this machine's cores.
 *
 * Two threads pinned to cores 0 and 1 pass a 48-byte frame back and forth, 2,000,000 round
 * trips, two ways: "ring", the counter on a cache line of its own and the bytes on another (as
 * boltccl's shared-memory ring publishes its tail), so the reader takes two lines; "mailbox",
 * the counter in the line that carries the bytes (as Open MPI's two-rank fast box does), so it
 * takes one. Prints the time of a round trip (two one-way messages) for each.
 *
 *   cc -O2 -pthread -o /tmp/line_pingpong scripts/bench/line_pingpong.c && /tmp/line_pingpong
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define ROUNDS 2000000
#define FRAME 48

typedef struct {
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) char data[64];
} Ring;

typedef struct {
    _Alignas(64) char data[56];
    _Atomic uint64_t seq;
} Mailbox;

static Ring rings[2];
static Mailbox boxes[2];
static int use_mailbox;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* The bytes first, then the counter with release: a reader that sees the counter sees them. */
static void put(int to, uint64_t n, const char *frame) {
    if (use_mailbox) {
        memcpy(boxes[to].data, frame, FRAME);
        atomic_store_explicit(&boxes[to].seq, n, memory_order_release);
    } else {
        memcpy(rings[to].data, frame, FRAME);
        atomic_store_explicit(&rings[to].tail, n, memory_order_release);
    }
}

static void take(int me, uint64_t n, char *frame) {
    if (use_mailbox) {
        while (atomic_load_explicit(&boxes[me].seq, memory_order_acquire) != n) {
        }
        memcpy(frame, boxes[me].data, FRAME);
    } else {
        while (atomic_load_explicit(&rings[me].tail, memory_order_acquire) != n) {
        }
        memcpy(frame, rings[me].data, FRAME);
    }
}

static void *echo(void *unused) {
    (void)unused;
    pin(1);
    char frame[FRAME];
    for (uint64_t n = 1; n <= ROUNDS; n++) {
        take(1, n, frame);
        put(0, n, frame);
    }
    return NULL;
}

int main(void) {
    for (use_mailbox = 0; use_mailbox < 2; use_mailbox++) {
        memset(rings, 0, sizeof rings);
        memset(boxes, 0, sizeof boxes);
        pthread_t t;
        pthread_create(&t, NULL, echo, NULL);
        pin(0);
        char frame[FRAME] = {1};
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (uint64_t n = 1; n <= ROUNDS; n++) {
            put(1, n, frame);
            take(0, n, frame);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        pthread_join(t, NULL);
        double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ROUNDS;
        printf("%-8s %6.1f ns a round trip\n", use_mailbox ? "mailbox" : "ring", ns);
    }
    return 0;
}
