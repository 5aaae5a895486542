/* race.c: a handle released on one thread while another thread is inside a call on it.
 *
 * Each round opens a handle (a participant, a pool or a device client), starts a thread that calls
 * the library on it in a loop until a call returns CXLKV_ERR_INVALID_HANDLE, waits until that
 * thread has completed one call, then releases the handle from this thread. The library must never
 * touch the released object under the calling thread (valgrind reports any such read or write: run
 * under it by tests/c_programs.rs), and every call must return CXLKV_OK or, once the release is
 * done, CXLKV_ERR_INVALID_HANDLE.
 *
 * A call that found the handle live, was started before the release returned and returned after it
 * "spans" the release: on a library that frees at release, the object was freed under it. Rounds
 * repeat until each kind of handle has had SPANS such calls (or a time limit passes, which fails),
 * so a pass shows the race was run, not just the code.
 *
 * Then two threads release the same pin, and commit and abort the same reservation, at once:
 * exactly one release succeeds and the other returns CXLKV_ERR_INVALID_HANDLE. Exit status 0 when
 * all checks pass. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cxlkv.h"

enum { SPANS = 20, MAX_ROUNDS = 2000, MAX_SECONDS = 60 };

enum kind { PARTICIPANT, POOL, DEVICE };
static const char *const kind_name[] = {"participant", "pool", "device"};

/* The key every reader fetches and the KV block the device reader scores. */
static const cxlkv_key blob_key = {11, 11};
static const cxlkv_key kv_key = {77, 77};

struct round {
    enum kind kind;
    void *handle;
    atomic_int calls;      /* calls that returned CXLKV_OK */
    atomic_int releasing;  /* set before the release is called */
    atomic_int released;   /* set once the release returned */
    int spans;             /* successful calls started before the release returned, ended after */
    atomic_int unexpected; /* calls that returned another code (the reader then stops) */
    cxlkv_result code;     /* the first such code */
};

/* One call of the library on the round's handle. */
static cxlkv_result call(struct round *r, unsigned i) {
    switch (r->kind) {
    case PARTICIPANT: {
        if (i % 2) {
            cxlkv_stats st = CXLKV_STRUCT_INIT(cxlkv_stats);
            return cxlkv_participant_stats(r->handle, &st);
        }
        uint8_t buf[64];
        size_t len = 0;
        return cxlkv_participant_get(r->handle, &blob_key, buf, sizeof buf, &len);
    }
    case POOL: {
        cxlkv_pool_info info = CXLKV_STRUCT_INIT(cxlkv_pool_info);
        return cxlkv_pool_describe(r->handle, &info);
    }
    case DEVICE: {
        if (i % 2) {
            size_t n = 0;
            return cxlkv_device_in_flight(r->handle, &n);
        }
        float q[16] = {1};
        cxlkv_block_ref b = {kv_key, 0};
        cxlkv_score_request sr = {.struct_size = sizeof sr, .group = 1, .queries = q, .dim = 16,
                                  .blocks = &b, .nblocks = 1, .sequence = 7,
                                  .dtype = CXLKV_DTYPE_F16, .k = 2};
        uint32_t idx[2];
        float sc[2];
        size_t per = 0;
        return cxlkv_device_score_topk(r->handle, &sr, idx, sc, 2, NULL, 0, &per, NULL);
    }
    }
    return CXLKV_ERR_INVALID_ARG;
}

static void *reader(void *arg) {
    struct round *r = arg;
    for (unsigned i = 0;; i++) {
        int before = atomic_load(&r->released);
        cxlkv_result c = call(r, i);
        if (c == CXLKV_OK) {
            if (!before && atomic_load(&r->released)) r->spans++;
            atomic_fetch_add(&r->calls, 1);
        } else if (c == CXLKV_ERR_INVALID_HANDLE && atomic_load(&r->releasing)) {
            return NULL;
        } else {
            if (atomic_fetch_add(&r->unexpected, 1) == 0) r->code = c;
            return NULL;
        }
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int failures = 0;

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "FAIL line %d: ", __LINE__);                                        \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fputc('\n', stderr);                                                                \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

#define OK(call) CHECK((call) == CXLKV_OK, "%s", #call)

/* Races one kind of handle until it has had SPANS spanning calls; returns the rounds run. */
static int race(enum kind kind, const char *spec, cxlkv_participant *me) {
    int rounds = 0, spans = 0;
    double t0 = now();
    while (spans < SPANS && rounds < MAX_ROUNDS && now() - t0 < MAX_SECONDS) {
        struct round r = {.kind = kind};
        switch (kind) {
        case PARTICIPANT: {
            cxlkv_pool *pool = NULL;
            OK(cxlkv_pool_open(spec, &pool));
            OK(cxlkv_participant_attach(pool, (cxlkv_participant **)&r.handle));
            OK(cxlkv_pool_close(pool));
            break;
        }
        case POOL:
            OK(cxlkv_pool_open(spec, (cxlkv_pool **)&r.handle));
            break;
        case DEVICE:
            OK(cxlkv_device_open(me, 100, (cxlkv_device **)&r.handle));
            break;
        }
        if (failures) return rounds;
        pthread_t t;
        CHECK(pthread_create(&t, NULL, reader, &r) == 0, "pthread_create");
        /* Let the reader finish one call, then release while it is (most likely) inside the next. */
        while (atomic_load(&r.calls) == 0 && atomic_load(&r.unexpected) == 0) sched_yield();
        cxlkv_result c = CXLKV_OK;
        atomic_store(&r.releasing, 1);
        switch (kind) {
        case PARTICIPANT: c = cxlkv_participant_detach(r.handle); break;
        case POOL: c = cxlkv_pool_close(r.handle); break;
        case DEVICE: c = cxlkv_device_close(r.handle); break;
        }
        atomic_store(&r.released, 1);
        pthread_join(t, NULL);
        CHECK(c == CXLKV_OK, "releasing a %s handle returned %u", kind_name[kind], (unsigned)c);
        CHECK(atomic_load(&r.unexpected) == 0, "%d calls on a %s handle returned %u", atomic_load(&r.unexpected),
              kind_name[kind], (unsigned)r.code);
        spans += r.spans;
        rounds++;
        if (failures) break;
    }
    printf("%s: %d rounds, %d calls spanned the release\n", kind_name[kind], rounds, spans);
    CHECK(spans >= SPANS, "%s: only %d of %d spanning calls in %d rounds", kind_name[kind], spans,
          SPANS, rounds);
    return rounds;
}

/* Two threads release one handle at the same moment. */
struct double_release {
    void *handle;
    int reservation; /* 0: a pin, both threads release it; 1: a reservation, committed and aborted */
    atomic_int ready;
    cxlkv_result code[2];
};

static void release_once(struct double_release *d, int me) {
    atomic_fetch_add(&d->ready, 1);
    while (atomic_load(&d->ready) < 2) sched_yield();
    if (!d->reservation) d->code[me] = cxlkv_pinned_release(d->handle);
    else if (me == 0) d->code[me] = cxlkv_reservation_commit(d->handle);
    else d->code[me] = cxlkv_reservation_abort(d->handle);
}

static void *second_releaser(void *arg) {
    release_once(arg, 1);
    return NULL;
}

enum { DOUBLE_ROUNDS = 200 };

/* Exactly one of two simultaneous releases succeeds, for pins and for reservations. */
static void race_double_releases(cxlkv_participant *me) {
    for (int reservation = 0; reservation < 2; reservation++) {
        int first = 0;
        for (int i = 0; i < DOUBLE_ROUNDS && !failures; i++) {
            struct double_release d = {.reservation = reservation};
            const uint8_t *data = NULL;
            size_t len = 0;
            if (reservation) {
                uint8_t *w = NULL;
                cxlkv_key k = {500, (uint64_t)i};
                OK(cxlkv_participant_reserve(me, &k, 8, (cxlkv_reservation **)&d.handle, &w));
                if (w) memcpy(w, "reserved", 8);
            } else {
                OK(cxlkv_participant_pin(me, &blob_key, (cxlkv_pinned **)&d.handle, &data, &len));
            }
            if (failures) return;
            pthread_t t;
            CHECK(pthread_create(&t, NULL, second_releaser, &d) == 0, "pthread_create");
            release_once(&d, 0);
            pthread_join(t, NULL);
            int ok = (d.code[0] == CXLKV_OK) + (d.code[1] == CXLKV_OK);
            int refused = (d.code[0] == CXLKV_ERR_INVALID_HANDLE) + (d.code[1] == CXLKV_ERR_INVALID_HANDLE);
            CHECK(ok == 1 && refused == 1, "%s released twice at once: %u and %u",
                  reservation ? "reservation" : "pin", (unsigned)d.code[0], (unsigned)d.code[1]);
            first += d.code[0] == CXLKV_OK;
        }
        printf("%s: %d double releases, the first thread won %d\n",
               reservation ? "reservation" : "pin", DOUBLE_ROUNDS, first);
    }
}

/* With an argument (participant, pool, device or double) only that part runs. */
int main(int argc, char **argv) {
    char spec[64];
    snprintf(spec, sizeof spec, "shm:cxlkv-race-%d", (int)getpid());
    cxlkv_pool *pool = NULL;
    cxlkv_participant *me = NULL;
    OK(cxlkv_pool_create(spec, 16 << 20, NULL, &pool));
    OK(cxlkv_participant_attach(pool, &me));
    OK(cxlkv_participant_put(me, &blob_key, (const uint8_t *)"a block to read", 15));
    uint16_t kv[2 * 16] = {0};
    cxlkv_kv_shape shape = {.struct_size = sizeof shape, .dtype = CXLKV_DTYPE_F16, .kv_heads = 1,
                            .head_dim = 16, .tokens = 2, .sequence = 7};
    OK(cxlkv_participant_put_kv(me, &kv_key, &shape, (uint8_t *)kv, sizeof kv, (uint8_t *)kv,
                                sizeof kv));
    if (!failures) {
        for (enum kind k = PARTICIPANT; k <= DEVICE; k++)
            if (argc < 2 || strcmp(argv[1], kind_name[k]) == 0) race(k, spec, me);
        if (argc < 2 || strcmp(argv[1], "double") == 0) race_double_releases(me);
    }
    OK(cxlkv_participant_detach(me));
    OK(cxlkv_pool_close(pool));
    OK(cxlkv_pool_unlink(spec));
    printf("race: %d failed\n", failures);
    return failures ? 1 : 0;
}
