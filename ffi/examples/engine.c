/* engine.c: a small "inference engine" using libcxlkv through its C ABI.
 *
 * Process 1 serves request A (1,024 tokens): it parks per-layer KV chunks of 256 tokens in a
 * shared pool, some with a copying put, some written in place (reserve + commit).
 * Process 2 (this program re-executed, its own attachment) serves request B, which shares A's first 768 tokens:
 * it computes the same key chain, asks the pool for the longest cached prefix, pins those chunks
 * (zero copy) and checks every byte, then parks its own new chunk.
 *
 * Build: cc -I ffi/include ffi/examples/engine.c -L target/debug -lcxlkv -o engine
 * Run:   ./engine            (exit status 0 on success)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--request-b") == 0) return request_b(argv[2]);
    char spec[64];
    snprintf(spec, sizeof spec, "shm:cxlkv-engine-%d", (int)getpid());
    printf("libcxlkv %s (ABI %u), pool %s\n", cxlkv_version(), cxlkv_abi_version(), spec);

    cxlkv_pool_config cfg = cxlkv_pool_config_default();
    cfg.block_size = 256 * 1024;
    cfg.participants = 4;
    cxlkv_pool *pool = NULL;
    CHECK(cxlkv_pool_create(spec, 64ull << 20, &cfg, &pool));
    cxlkv_pool_info info;
    CHECK(cxlkv_pool_describe(pool, &info));
    printf("pool: %u partitions x %u blocks of %llu KiB\n", info.partitions, info.blocks_per_partition,
           (unsigned long long)(info.block_size / 1024));

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

    cxlkv_stats st;
    CHECK(cxlkv_participant_stats(a, &st));
    printf("engine A counters: %llu puts\n", (unsigned long long)st.puts);
    CHECK(cxlkv_participant_detach(a));
    CHECK(cxlkv_pool_close(pool));
    CHECK(cxlkv_pool_unlink(spec));
    printf("engine: OK\n");
    return 0;
}
