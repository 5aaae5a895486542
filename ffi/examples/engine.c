/* engine.c: a small "inference engine" using libcxlkv through its C ABI.
 *
 * Process 1 serves request A (1,024 tokens): it parks per-layer KV chunks of 256 tokens in a
 * shared pool, some with a copying put, some written in place (reserve + commit).
 * Process 2 (this program re-executed, its own attachment) serves request B, which shares A's first 768 tokens:
 * it computes the same key chain, asks the pool for the longest cached prefix, pins those chunks
 * (zero copy) and checks every byte, then parks its own new chunk.
 *
 * Then it asks the near-data device for top-k attention scores over a typed KV sequence: with
 * $CXLKV_NDPD naming the cxlkv-ndpd binary it starts the device on the pool first; the answer
 * must equal the host reference, and the gathered value rows must equal what was stored.
 *
 * Build: cc -I ffi/include ffi/examples/engine.c -L target/debug -lcxlkv -o engine
 * Run:   ./engine            (exit status 0 on success)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cxlkv.h"

#define LAYERS 4
#define CHUNK 256
#define TOKENS_A 1024
#define SHARED 768
#define CHUNK_BYTES (2 * 3 * CHUNK * 64 * 2) /* K and V, 3 KV heads, d = 64, f16 */

static int check(cxlkv_result r, const char *what) {
    if (r == CXLKV_OK) return 1;
    char msg[256];
    cxlkv_last_error_message(msg, sizeof msg);
    fprintf(stderr, "engine: %s failed: code %u: %s\n", what, (unsigned)r, msg);
    return 0;
}
#define CHECK(call) do { if (!check((call), #call)) return 1; } while (0)

/* Deterministic stand-in for the KV a model computes for (layer, chunk) of request A. */
static void fill_kv(uint8_t *buf, uint32_t layer, uint32_t chunk) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (layer * 131 + chunk + 1);
    for (size_t i = 0; i < CHUNK_BYTES; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
}

static void tokens_of(uint32_t *t, size_t n, int request) {
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 7 + 11);
    if (request == 1)
        for (size_t i = SHARED; i < n; i++) t[i] = (uint32_t)(100000 + i);
}

static int chain(uint32_t layer, const uint32_t *tokens, size_t n, cxlkv_key *keys, size_t *n_keys) {
    CHECK(cxlkv_key_chain("engine-demo", "toy-llm", layer, layer, tokens, n, CHUNK, keys, 16, n_keys));
    return 0;
}

static int request_b(const char *spec) {
    cxlkv_pool *pool = NULL;
    cxlkv_participant *me = NULL;
    CHECK(cxlkv_pool_open(spec, &pool));
    CHECK(cxlkv_participant_attach(pool, &me));
    uint32_t id = 0, part = 0;
    CHECK(cxlkv_participant_id(me, &id, &part));

    uint32_t tokens[TOKENS_A];
    tokens_of(tokens, TOKENS_A, 1);
    uint8_t *expect = malloc(CHUNK_BYTES);
    size_t reused = 0;
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
        cxlkv_key keys[16];
        size_t n = 0;
        if (chain(layer, tokens, TOKENS_A, keys, &n)) return 1;
        size_t hit = 0;
        CHECK(cxlkv_pool_lookup_prefix(pool, keys, n, &hit));
        if (hit != SHARED / CHUNK) {
            fprintf(stderr, "engine B: layer %u: cached prefix %zu chunks, expected %d\n", layer, hit, SHARED / CHUNK);
            return 1;
        }
        for (size_t c = 0; c < hit; c++) {
            cxlkv_pinned *pin = NULL;
            const uint8_t *data = NULL;
            size_t len = 0;
            CHECK(cxlkv_participant_pin(me, &keys[c], &pin, &data, &len));
            fill_kv(expect, layer, (uint32_t)c);
            if (len != CHUNK_BYTES || memcmp(data, expect, len) != 0) {
                fprintf(stderr, "engine B: layer %u chunk %zu: pinned bytes differ\n", layer, c);
                return 1;
            }
            CHECK(cxlkv_pinned_release(pin));
            reused++;
        }
        /* A buffer that is too small is refused and told the size it needs. */
        uint8_t small[16];
        size_t need = 0;
        if (cxlkv_participant_get(me, &keys[0], small, sizeof small, &need) != CXLKV_ERR_BUFFER_TOO_SMALL || need != CHUNK_BYTES) {
            fprintf(stderr, "engine B: small-buffer get did not report %d bytes\n", CHUNK_BYTES);
            return 1;
        }
        /* The chunk after the shared prefix is new for B: compute and park it. */
        fill_kv(expect, layer + 100, 3);
        CHECK(cxlkv_participant_put(me, &keys[hit], expect, CHUNK_BYTES));
    }
    printf("engine B (participant %u, partition %u): reused %zu cached chunks (%zu KiB) by pinning, parked %d new ones\n",
           id, part, reused, reused * CHUNK_BYTES / 1024, LAYERS);
    free(expect);
    CHECK(cxlkv_participant_detach(me));
    CHECK(cxlkv_pool_close(pool));
    return 0;
}


/* ---- near-data top-k over a typed KV sequence -------------------------------------------- */

#define NDP_BLOCKS 4
#define NDP_TOKENS 64 /* per block */
#define NDP_DIM 64
#define NDP_GROUP 3
#define NDP_K 16

/* IEEE binary16 bits of a float (round to nearest even; normal range, as used here). */
static uint16_t f16_bits(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000u, exp = (v.u >> 23) & 0xffu, man = v.u & 0x7fffffu;
    if (exp == 0) return (uint16_t)sign;
    int e = (int)exp - 127 + 15;
    if (e <= 0) return (uint16_t)sign; /* flush tiny values to zero */
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    uint32_t r = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

static float sample(uint64_t *x) {
    *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
    return (float)((*x >> 40) % 2001) / 1000.0f - 1.0f; /* [-1, 1] */
}


/* float of IEEE binary16 bits (normal numbers and zero, as produced by f16_bits). */
static float f16_value(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    v.u = e == 0 ? sign : sign | ((e - 15 + 127) << 23) | (man << 13);
    return v.f;
}

#define NDP_TICKETS 3

/* Several device commands in flight at once: three SCORE_TOPK tickets and an ATTEND submitted
 * before any is collected, collected by polling in whatever order they finish; each top-k equals
 * the host reference, the ATTEND partials equal a direct computation in double precision. Then a
 * ticket collected by cxlkv_device_wait, and one left in flight when the device closes. */
static int ndp_async(cxlkv_device *dev, const cxlkv_block_ref *blocks, const uint16_t *k, const uint16_t *v) {
    static float qs[NDP_TICKETS][NDP_GROUP * NDP_DIM];
    uint64_t x = 777;
    for (int t = 0; t < NDP_TICKETS; t++)
        for (int i = 0; i < NDP_GROUP * NDP_DIM; i++) qs[t][i] = sample(&x);
    static uint32_t idx[NDP_TICKETS][NDP_GROUP * NDP_K], ref_idx[NDP_GROUP * NDP_K];
    static float sc[NDP_TICKETS][NDP_GROUP * NDP_K], ref_sc[NDP_GROUP * NDP_K];
    size_t per[NDP_TICKETS], ref_n = 0;
    uint64_t tickets[NDP_TICKETS + 1];
    cxlkv_score_request req[NDP_TICKETS];
    for (int t = 0; t < NDP_TICKETS; t++) {
        cxlkv_score_request r = {.struct_size = sizeof r, .group = NDP_GROUP, .queries = qs[t], .dim = NDP_DIM,
                                 .layer = 5, .blocks = blocks, .nblocks = NDP_BLOCKS, .sequence = 42,
                                 .dtype = CXLKV_DTYPE_F16, .k = NDP_K, .flags = t == 1 ? CXLKV_SCORE_PRUNE : 0};
        req[t] = r;
        CHECK(cxlkv_device_submit_score_topk(dev, &req[t], idx[t], sc[t], NDP_GROUP * NDP_K, NULL, 0, &per[t], &tickets[t]));
    }
    static float out[NDP_GROUP * NDP_DIM], mx[NDP_GROUP], sm[NDP_GROUP];
    cxlkv_attend_request ar = {.struct_size = sizeof ar, .group = NDP_GROUP, .queries = qs[0], .dim = NDP_DIM,
                               .layer = 5, .blocks = blocks, .nblocks = NDP_BLOCKS, .sequence = 42,
                               .dtype = CXLKV_DTYPE_F16, .scale = 0.0f};
    CHECK(cxlkv_device_submit_attend(dev, &ar, out, NDP_GROUP * NDP_DIM, mx, sm, &tickets[NDP_TICKETS]));
    size_t flying = 0;
    CHECK(cxlkv_device_in_flight(dev, &flying));
    if (flying != NDP_TICKETS + 1) {
        fprintf(stderr, "engine: %zu tickets in flight, expected %d\n", flying, NDP_TICKETS + 1);
        return 1;
    }
    int done[NDP_TICKETS + 1] = {0}, left = NDP_TICKETS + 1, on_device = 0, polls = 0;
    while (left > 0) {
        for (int t = 0; t <= NDP_TICKETS; t++) {
            if (done[t]) continue;
            cxlkv_ndp_stats st = CXLKV_STRUCT_INIT(cxlkv_ndp_stats);
            CHECK(cxlkv_device_poll(dev, tickets[t], &done[t], &st));
            polls++;
            if (done[t]) { left--; on_device += (int)st.on_device; }
        }
        if (left > 0) { struct timespec ts = {0, 100 * 1000}; nanosleep(&ts, NULL); }
    }
    int again = -1;
    if (cxlkv_device_poll(dev, tickets[0], &again, NULL) != CXLKV_ERR_INVALID_ARG) {
        fprintf(stderr, "engine: a collected ticket was accepted again\n");
        return 1;
    }
    for (int t = 0; t < NDP_TICKETS; t++) {
        cxlkv_score_request r = req[t];
        r.flags |= CXLKV_SCORE_HOST;
        CHECK(cxlkv_device_score_topk(dev, &r, ref_idx, ref_sc, NDP_GROUP * NDP_K, NULL, 0, &ref_n, NULL));
        if (per[t] != ref_n || memcmp(idx[t], ref_idx, sizeof ref_idx) != 0 || memcmp(sc[t], ref_sc, sizeof ref_sc) != 0) {
            fprintf(stderr, "engine: asynchronous top-k %d differs from the host reference\n", t);
            return 1;
        }
    }
    double scale = 1.0 / sqrt((double)NDP_DIM), worst = 0.0;
    for (int g = 0; g < NDP_GROUP; g++) {
        static double s[NDP_BLOCKS * NDP_TOKENS];
        double m = -INFINITY, sum = 0.0, o[NDP_DIM] = {0};
        for (int t = 0; t < NDP_BLOCKS * NDP_TOKENS; t++) {
            const uint16_t *kr = &k[(size_t)t * NDP_DIM];
            double d = 0.0;
            for (int i = 0; i < NDP_DIM; i++) d += (double)qs[0][g * NDP_DIM + i] * f16_value(kr[i]);
            s[t] = scale * d;
            if (s[t] > m) m = s[t];
        }
        for (int t = 0; t < NDP_BLOCKS * NDP_TOKENS; t++) {
            double w = exp(s[t] - m);
            sum += w;
            for (int i = 0; i < NDP_DIM; i++) o[i] += w * f16_value(v[(size_t)t * NDP_DIM + i]);
        }
        double err = fabs(mx[g] - m) + fabs(sm[g] - sum) / sum;
        for (int i = 0; i < NDP_DIM; i++) err += fabs(out[g * NDP_DIM + i] / sm[g] - o[i] / sum);
        if (err > worst) worst = err;
    }
    if (worst > 1e-3) {
        fprintf(stderr, "engine: ATTEND differs from the direct computation by %g\n", worst);
        return 1;
    }
    /* One more ticket, collected by a blocking wait. */
    int waited = 0;
    CHECK(cxlkv_device_submit_score_topk(dev, &req[2], idx[2], sc[2], NDP_GROUP * NDP_K, NULL, 0, &per[2], &tickets[0]));
    CHECK(cxlkv_device_wait(dev, tickets[0], CXLKV_WAIT_FOREVER, &waited, NULL));
    /* And one left in flight: closing the device drops it (its arrays are never written after). */
    CHECK(cxlkv_device_submit_attend(dev, &ar, out, NDP_GROUP * NDP_DIM, mx, sm, &tickets[1]));
    printf("engine: %d tickets in flight at once (3 top-k, 1 ATTEND), collected by %d polls, %d on the device; "
           "equal to the host reference; ATTEND within %.1e of a direct computation; waited for 1 more (done=%d)\n",
           NDP_TICKETS + 1, polls, on_device, worst, waited);
    return 0;
}

static int ndp_topk(const char *spec, cxlkv_participant *a) {
    /* Park a 256-token sequence of one KV head as 4 typed blocks (what an engine's decode offloads). */
    static uint16_t k[NDP_BLOCKS][NDP_TOKENS * NDP_DIM], v[NDP_BLOCKS][NDP_TOKENS * NDP_DIM];
    cxlkv_block_ref blocks[NDP_BLOCKS];
    uint64_t x = 12345;
    for (int b = 0; b < NDP_BLOCKS; b++) {
        for (int i = 0; i < NDP_TOKENS * NDP_DIM; i++) {
            k[b][i] = f16_bits(sample(&x));
            v[b][i] = f16_bits(sample(&x));
        }
        cxlkv_kv_shape shape = {.struct_size = sizeof shape, .dtype = CXLKV_DTYPE_F16, .layer = 5, .kv_heads = 1,
                                .head_dim = NDP_DIM, .tokens = NDP_TOKENS, .sequence = 42,
                                .token_offset = (uint64_t)b * NDP_TOKENS};
        char name[32];
        snprintf(name, sizeof name, "seq42-block%d", b);
        CHECK(cxlkv_key_from_bytes((const uint8_t *)name, strlen(name), &blocks[b].key));
        blocks[b].token_offset = shape.token_offset;
        CHECK(cxlkv_participant_put_kv(a, &blocks[b].key, &shape, (const uint8_t *)k[b], sizeof k[b],
                                       (const uint8_t *)v[b], sizeof v[b]));
    }
    /* A typed block reads back as it was stored, with its shape. */
    static uint16_t k_back[NDP_TOKENS * NDP_DIM], v_back[NDP_TOKENS * NDP_DIM];
    cxlkv_kv_shape got = CXLKV_STRUCT_INIT(cxlkv_kv_shape);
    size_t kv_len = 0;
    if (cxlkv_participant_get_kv(a, &blocks[1].key, &got, NULL, 0, NULL, 0, &kv_len) != CXLKV_ERR_BUFFER_TOO_SMALL ||
        kv_len != sizeof k_back) {
        fprintf(stderr, "engine: get_kv with no room did not report %zu bytes\n", sizeof k_back);
        return 1;
    }
    CHECK(cxlkv_participant_get_kv(a, &blocks[1].key, &got, (uint8_t *)k_back, sizeof k_back, (uint8_t *)v_back,
                                   sizeof v_back, &kv_len));
    if (memcmp(k_back, k[1], sizeof k_back) != 0 || memcmp(v_back, v[1], sizeof v_back) != 0 ||
        got.struct_size != sizeof got || got.dtype != CXLKV_DTYPE_F16 || got.layer != 5 || got.head_dim != NDP_DIM ||
        got.tokens != NDP_TOKENS || got.sequence != 42 || got.token_offset != NDP_TOKENS) {
        fprintf(stderr, "engine: get_kv returned another block or shape\n");
        return 1;
    }
    printf("engine: get_kv read back %zu + %zu bytes of K and V, shape %u tokens x d %u at offset %llu\n", kv_len,
           kv_len, got.tokens, got.head_dim, (unsigned long long)got.token_offset);
    float q[NDP_GROUP * NDP_DIM];
    for (int i = 0; i < NDP_GROUP * NDP_DIM; i++) q[i] = sample(&x);

    /* Start the device on the pool, as its own process, when we know where it is. */
    pid_t device = -1;
    const char *ndpd = getenv("CXLKV_NDPD");
    if (ndpd && *ndpd) {
        device = fork();
        if (device == 0) {
            execl(ndpd, ndpd, "--pool", spec, (char *)NULL);
            perror("exec cxlkv-ndpd");
            _exit(127);
        }
    }
    cxlkv_device *dev = NULL;
    /* Four staging blocks: up to four commands on the device at once (ndp_async below). */
    cxlkv_device_config dcfg = CXLKV_STRUCT_INIT(cxlkv_device_config);
    dcfg.timeout_ms = 10000; /* generous: the client runs under valgrind on a loaded machine */
    dcfg.staging = NDP_TICKETS + 1;
    CHECK(cxlkv_device_open_with(a, &dcfg, &dev));
    cxlkv_score_request req = {.struct_size = sizeof req, .group = NDP_GROUP, .queries = q, .dim = NDP_DIM,
                               .layer = 5, .blocks = blocks, .nblocks = NDP_BLOCKS, .sequence = 42,
                               .kv_head = 0, .dtype = CXLKV_DTYPE_F16, .k = NDP_K,
                               .flags = CXLKV_SCORE_GATHER_V};
    uint32_t idx[NDP_GROUP * NDP_K], ref_idx[NDP_GROUP * NDP_K];
    float sc[NDP_GROUP * NDP_K], ref_sc[NDP_GROUP * NDP_K];
    static uint16_t vals[NDP_GROUP * NDP_K * NDP_DIM];
    size_t n = 0, ref_n = 0;
    cxlkv_ndp_stats st = CXLKV_STRUCT_INIT(cxlkv_ndp_stats), ref_st = CXLKV_STRUCT_INIT(cxlkv_ndp_stats);
    /* The device needs a moment to come up; until then the client answers on the host. */
    for (int tries = 0; tries < 200; tries++) {
        CHECK(cxlkv_device_score_topk(dev, &req, idx, sc, NDP_GROUP * NDP_K, (uint8_t *)vals, sizeof vals, &n, &st));
        if (st.on_device || device < 0) break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    req.flags = (req.flags | CXLKV_SCORE_HOST) & ~(uint32_t)CXLKV_SCORE_GATHER_V;
    CHECK(cxlkv_device_score_topk(dev, &req, ref_idx, ref_sc, NDP_GROUP * NDP_K, NULL, 0, &ref_n, &ref_st));
    if (n != NDP_K || ref_n != n || memcmp(idx, ref_idx, sizeof idx) != 0 || memcmp(sc, ref_sc, sizeof sc) != 0) {
        fprintf(stderr, "engine: NDP top-k differs from the host reference\n");
        return 1;
    }
    for (size_t i = 0; i < NDP_GROUP * n; i++) { /* gathered rows are the stored V rows of the hits */
        uint32_t t = idx[i];
        if (memcmp(&vals[i * NDP_DIM], &v[t / NDP_TOKENS][(t % NDP_TOKENS) * NDP_DIM], NDP_DIM * 2) != 0) {
            fprintf(stderr, "engine: gathered row of token %u differs\n", t);
            return 1;
        }
    }
    printf("engine: NDP top-%zu of %d queries over %d tokens computed %s: %llu link bytes vs %llu for a host scan; equal to the host reference\n",
           n, NDP_GROUP, NDP_BLOCKS * NDP_TOKENS, st.on_device ? "on the device" : "on the host (no device)",
           (unsigned long long)st.link_bytes, (unsigned long long)ref_st.link_bytes);
    if (ndp_async(dev, blocks, &k[0][0], &v[0][0])) return 1;
    CHECK(cxlkv_device_close(dev));
    if (device > 0) {
        kill(device, SIGTERM);
        waitpid(device, NULL, 0);
    }
    return 0;
}


/* Batches: which chunks are cached (one call), parking several blobs and reading them back (one
 * call each, one result per key); and the pool's mapping, where every pinned payload lies. */
static int pool_extras(cxlkv_pool *pool, cxlkv_participant *a) {
    uint32_t tokens[TOKENS_A];
    tokens_of(tokens, TOKENS_A, 1); /* request B: 3 chunks shared with A, and B parked its 4th */
    cxlkv_key keys[16];
    size_t n = 0;
    if (chain(2, tokens, TOKENS_A, keys, &n)) return 1;
    keys[n++] = (cxlkv_key){0xdead, 0xbeef}; /* never stored */
    uint8_t present[16];
    CHECK(cxlkv_pool_contains_batch(pool, n, keys, present));
    if (n != 5 || !present[0] || !present[1] || !present[2] || !present[3] || present[4]) {
        fprintf(stderr, "engine: contains_batch %d%d%d%d%d, expected 11110\n", present[0], present[1], present[2],
                present[3], present[4]);
        return 1;
    }
    enum { NB = 4 };
    cxlkv_key bk[NB];
    static uint8_t blobs[NB][3000];
    const uint8_t *in[NB];
    size_t in_len[NB];
    for (int i = 0; i < NB; i++) {
        char name[32];
        snprintf(name, sizeof name, "blob-%d", i);
        CHECK(cxlkv_key_from_bytes((const uint8_t *)name, strlen(name), &bk[i]));
        memset(blobs[i], 'a' + i, sizeof blobs[i]);
        in[i] = blobs[i];
        in_len[i] = (size_t)(1000 * i); /* 0, 1000, 2000, 3000 bytes */
    }
    cxlkv_result res[NB + 1];
    CHECK(cxlkv_participant_put_batch(a, NB, bk, in, in_len, res));
    /* Read back, with one buffer too small and one key missing: per-key codes, the first failure. */
    static uint8_t back[NB + 1][3000];
    uint8_t *outb[NB + 1];
    size_t caps[NB + 1], lens[NB + 1];
    cxlkv_key rk[NB + 1];
    for (int i = 0; i < NB; i++) { rk[i] = bk[i]; outb[i] = back[i]; caps[i] = sizeof back[i]; lens[i] = 0; }
    caps[2] = 10;
    rk[NB] = keys[4];
    outb[NB] = back[NB];
    caps[NB] = sizeof back[NB];
    cxlkv_result r = cxlkv_participant_get_batch(a, NB + 1, rk, outb, caps, lens, res);
    if (r != CXLKV_ERR_BUFFER_TOO_SMALL || res[0] != CXLKV_OK || res[1] != CXLKV_OK || res[2] != CXLKV_ERR_BUFFER_TOO_SMALL ||
        res[3] != CXLKV_OK || res[4] != CXLKV_ERR_NOT_FOUND || lens[1] != 1000 || lens[2] != 2000 || lens[3] != 3000 ||
        memcmp(back[3], blobs[3], 3000) != 0 || memcmp(back[1], blobs[1], 1000) != 0) {
        fprintf(stderr, "engine: get_batch returned %u (%u %u %u %u %u)\n", (unsigned)r, (unsigned)res[0],
                (unsigned)res[1], (unsigned)res[2], (unsigned)res[3], (unsigned)res[4]);
        return 1;
    }
    printf("engine: contains_batch found 4 of 5 keys; put_batch parked %d blobs; get_batch read them back "
           "(per-key codes: ok, ok, too small (needs %zu), ok, not found)\n", NB, lens[2]);

    /* An object larger than a block (a whole sequence's KV, say) goes through the same put and
     * get: stored as parts and a manifest, read back whole; a too-small buffer learns its size. */
    size_t obj_len = 4 * 256 * 1024 + 12345;
    uint8_t *obj = malloc(obj_len), *obj_back = malloc(obj_len);
    for (size_t i = 0; i < obj_len; i++) obj[i] = (uint8_t)(i * 31 + i / 4096);
    cxlkv_key ok_key;
    CHECK(cxlkv_key_from_bytes((const uint8_t *)"sequence-7-kv", 13, &ok_key));
    CHECK(cxlkv_participant_put(a, &ok_key, obj, obj_len));
    size_t got_len = 0;
    if (cxlkv_participant_get(a, &ok_key, obj_back, 4096, &got_len) != CXLKV_ERR_BUFFER_TOO_SMALL || got_len != obj_len) {
        fprintf(stderr, "engine: a small get of the object did not report %zu bytes\n", obj_len);
        return 1;
    }
    CHECK(cxlkv_participant_get(a, &ok_key, obj_back, obj_len, &got_len));
    if (got_len != obj_len || memcmp(obj, obj_back, obj_len) != 0) {
        fprintf(stderr, "engine: the multi-block object read back differs\n");
        return 1;
    }
    /* Put-if-absent: the first stores, the second finds it present (in any partition). */
    int stored_first = -1, stored_again = -1;
    cxlkv_key pia;
    CHECK(cxlkv_key_from_bytes((const uint8_t *)"shared-prefix-0", 15, &pia));
    CHECK(cxlkv_participant_put_if_absent(a, &pia, obj, 100000, &stored_first));
    CHECK(cxlkv_participant_put_if_absent(a, &pia, obj + 1, 100000, &stored_again));
    CHECK(cxlkv_participant_get(a, &pia, obj_back, obj_len, &got_len));
    if (stored_first != 1 || stored_again != 0 || got_len != 100000 || memcmp(obj_back, obj, 100000) != 0) {
        fprintf(stderr, "engine: put_if_absent stored %d then %d\n", stored_first, stored_again);
        return 1;
    }
    free(obj);
    free(obj_back);
    printf("engine: a %zu-byte object (%zu blocks of 256 KiB) put and read back whole; put_if_absent stored %d, "
           "then found it present (%d)\n", obj_len, (obj_len + 256 * 1024 - 1) / (256 * 1024), stored_first,
           stored_again);

    void *base = NULL;
    size_t len = 0;
    CHECK(cxlkv_pool_mapping(pool, &base, &len));
    cxlkv_pinned *pin = NULL;
    const uint8_t *data = NULL;
    size_t plen = 0;
    CHECK(cxlkv_participant_pin(a, &bk[3], &pin, &data, &plen));
    int inside = data >= (const uint8_t *)base && data + plen <= (const uint8_t *)base + len;
    CHECK(cxlkv_pinned_release(pin));
    if (!inside) {
        fprintf(stderr, "engine: a pinned payload lies outside the pool's mapping\n");
        return 1;
    }
    /* What a GPU runtime's host registration does first: page-lock the range (docs/C-ABI.md). */
    int locked = mlock(base, len) == 0;
    if (locked) munlock(base, len);
    printf("engine: pool mapping %zu MiB, every pinned payload inside it; mlock of the range %s\n", len >> 20,
           locked ? "succeeded" : "refused (RLIMIT_MEMLOCK)");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--request-b") == 0) return request_b(argv[2]);
    char spec[64];
    snprintf(spec, sizeof spec, "shm:cxlkv-engine-%d", (int)getpid());
    printf("libcxlkv %s (ABI %u), pool %s\n", cxlkv_version(), cxlkv_abi_version(), spec);

    cxlkv_pool_config cfg = cxlkv_pool_config_default();
    cfg.block_size = 256 * 1024;
    cfg.participants = 4;
    cfg.pins_per_participant = 256; /* an engine that pins a whole batch's blocks at once */
    cxlkv_pool *pool = NULL;
    CHECK(cxlkv_pool_create(spec, 64ull << 20, &cfg, &pool));
    cxlkv_pool_info info = CXLKV_STRUCT_INIT(cxlkv_pool_info);
    CHECK(cxlkv_pool_describe(pool, &info));
    printf("pool: %u partitions x %u blocks of %llu KiB, %u pins per participant\n", info.partitions,
           info.blocks_per_partition, (unsigned long long)(info.block_size / 1024), info.pins_per_participant);
    if (info.pins_per_participant != 256) return 1;

    cxlkv_participant *a = NULL;
    CHECK(cxlkv_participant_attach(pool, &a));
    uint32_t tokens[TOKENS_A];
    tokens_of(tokens, TOKENS_A, 0);
    uint8_t *kv = malloc(CHUNK_BYTES);
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
        cxlkv_key keys[16];
        size_t n = 0;
        if (chain(layer, tokens, TOKENS_A, keys, &n)) return 1;
        for (size_t c = 0; c < n; c++) {
            if (c % 2 == 0) {
                fill_kv(kv, layer, (uint32_t)c);
                CHECK(cxlkv_participant_put(a, &keys[c], kv, CHUNK_BYTES));
            } else {
                cxlkv_reservation *r = NULL;
                uint8_t *dst = NULL;
                CHECK(cxlkv_participant_reserve(a, &keys[c], CHUNK_BYTES, &r, &dst));
                fill_kv(dst, layer, (uint32_t)c); /* the model writes its KV straight into the pool */
                CHECK(cxlkv_reservation_commit(r));
            }
        }
    }
    free(kv);
    printf("engine A: parked %d chunks of %d tokens (%d layers), half of them written in place\n",
           LAYERS * TOKENS_A / CHUNK, CHUNK, LAYERS);

    fflush(stdout);
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 1; }
    if (child == 0) {
        /* A second, independent process: re-execute this program for request B. */
        char *args[] = {argv[0], "--request-b", spec, NULL};
        execv(argv[0], args);
        perror("execv");
        _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "engine: request B process failed (status %d)\n", status);
        return 1;
    }

    if (pool_extras(pool, a)) return 1;
    if (ndp_topk(spec, a)) return 1;

    cxlkv_stats st = CXLKV_STRUCT_INIT(cxlkv_stats);
    CHECK(cxlkv_participant_stats(a, &st));
    printf("engine A counters: %llu puts\n", (unsigned long long)st.puts);
    /* This process's metrics: calls, bytes and latency per operation, device fallbacks. */
    cxlkv_metrics m = CXLKV_STRUCT_INIT(cxlkv_metrics);
    CHECK(cxlkv_metrics_read(&m));
    uint64_t puts = m.put.ok + m.put.error;
    printf("engine A metrics: %llu puts (%llu bytes, mean %.1f us), %llu device top-k, "
           "%llu ATTEND (%llu query bytes in, %llu partial bytes out), %llu host fallbacks\n",
           (unsigned long long)puts, (unsigned long long)m.put.bytes_in,
           puts ? m.put.latency_ns / 1e3 / (double)puts : 0.0,
           (unsigned long long)(m.score_topk.ok + m.score_topk.error),
           (unsigned long long)(m.attend.ok + m.attend.error),
           (unsigned long long)m.attend.bytes_in, (unsigned long long)m.attend.bytes_out,
           (unsigned long long)m.device_fallbacks);
    CHECK(cxlkv_participant_detach(a));
    CHECK(cxlkv_pool_close(pool));
    CHECK(cxlkv_pool_unlink(spec));
    printf("engine: OK\n");
    return 0;
}
