/* What the shared-memory ring's layout costs a small message between this machine's cores.
 *
 * Two threads pinned to cores 0 and 1 pass a 48-byte frame (a 40-byte header and 8 bytes),
 * 1,000,000 times, in three layouts:
 *   ring     as boltccl's ring lays it out: the writer publishes a counter (`tail`) on a cache
 *            line of its own, and each frame lands 64 bytes past the last in a 1 MiB area, so
 *            the reader takes two lines per message, the counter's and the frame's;
 *   stamped  the same moving frames, with the counter written last into the frame's own line
 *            (a ring whose records carry their own sequence word): one line per message;
 *   mailbox  one fixed line that carries the bytes and the counter (Open MPI's two-rank fast
 *            box): one line, always the same.
 * and two patterns: ping-pong (one thread sends, the other answers: the time of a round trip)
 * and exchange (both send, then both receive, as a two-rank all_sum or all_to_all does: the
 * time of one exchange). The layouts take turns, three runs each: the machine's states move
 * the figures by more than the layouts do from one minute to the next.
 *
 * What it measures is the layout alone: a fast box built into boltccl on the strength of it
 * carried every small frame and did not change a call's time (docs/benchmarks.md, all_to_all),
 * because there the line's trip overlaps the call's own work.
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

#define ROUNDS 1000000
#define FRAME 48
#define AREA (1u << 20)

enum layout { RING, STAMPED, MAILBOX };
static const char *names[] = {"ring", "stamped", "mailbox"};

/* One direction: what one thread writes and the other reads. */
typedef struct {
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) unsigned char area[AREA];
} Way;

static Way ways[2];
static enum layout layout;
static int exchange;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* Where message n goes, and its counter. */
static unsigned char *slot(Way *w, uint64_t n) {
    return layout == MAILBOX ? w->area : w->area + (n * 64) % AREA;
}

static _Atomic uint64_t *counter(Way *w, uint64_t n) {
    return layout == RING ? &w->tail : (_Atomic uint64_t *)(slot(w, n) + 56);
}

/* The bytes first, then the counter with release: a reader that sees the counter sees them. */
static void put(Way *w, uint64_t n, const unsigned char *frame) {
    memcpy(slot(w, n), frame, FRAME);
    atomic_store_explicit(counter(w, n), n, memory_order_release);
}

static void take(Way *w, uint64_t n, unsigned char *frame) {
    while (atomic_load_explicit(counter(w, n), memory_order_acquire) < n) {
        __builtin_ia32_pause();
    }
    memcpy(frame, slot(w, n), FRAME);
}

static void *peer(void *unused) {
    (void)unused;
    pin(1);
    unsigned char frame[FRAME] = {2};
    for (uint64_t n = 1; n <= ROUNDS; n++) {
        if (exchange) {
            put(&ways[0], n, frame);
            take(&ways[1], n, frame);
        } else {
            take(&ways[1], n, frame);
            put(&ways[0], n, frame);
        }
    }
    return NULL;
}

static double run(void) {
    memset(ways, 0, sizeof ways);
    pthread_t t;
    pthread_create(&t, NULL, peer, NULL);
    unsigned char frame[FRAME] = {1};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (uint64_t n = 1; n <= ROUNDS; n++) {
        put(&ways[1], n, frame);
        take(&ways[0], n, frame);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ROUNDS;
}

int main(void) {
    pin(0);
    for (exchange = 0; exchange < 2; exchange++) {
        double ns[3][3];
        for (int i = 0; i < 3; i++) {
            for (layout = RING; layout <= MAILBOX; layout++) {
                ns[layout][i] = run();
            }
        }
        printf("%s (ns %s, three runs in turn):\n", exchange ? "exchange" : "ping-pong",
               exchange ? "an exchange" : "a round trip");
        for (layout = RING; layout <= MAILBOX; layout++) {
            printf("  %-8s %7.1f %7.1f %7.1f\n", names[layout], ns[layout][0], ns[layout][1], ns[layout][2]);
        }
    }
    return 0;
}
