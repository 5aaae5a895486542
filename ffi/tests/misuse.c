/* misuse.c: every libcxlkv entry point called with NULL handles and pointers, zero and oversized
 * lengths, too-small buffers and released handles must return its documented error code, never
 * crash, and leave out-parameters untouched on failure. Exit status 0 when all checks pass. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv.h"

static int failures = 0, checks = 0;

#define EXPECT(call, code)                                                                      \
    do {                                                                                        \
        cxlkv_result r_ = (call);                                                               \
        checks++;                                                                               \
        if (r_ != (code)) {                                                                     \
            char m_[200];                                                                       \
            cxlkv_last_error_message(m_, sizeof m_);                                            \
            fprintf(stderr, "FAIL line %d: %s returned %u, expected %s (%u): %s\n", __LINE__,   \
                    #call, (unsigned)r_, #code, (unsigned)(code), m_);                          \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

#define SENTINEL ((void *)0x5a5a)

int main(void) {
    char spec[64];
    snprintf(spec, sizeof spec, "shm:cxlkv-misuse-%d", (int)getpid());
    cxlkv_key key = {1, 2};
    uint8_t buf[64];
    size_t len = 777;
    uint32_t tokens[4] = {1, 2, 3, 4};
    cxlkv_key keys[4];

    /* Messages: every code has text; NULL buffer asks for the size; truncation is NUL-terminated. */
    for (uint32_t c = 0; c <= 16; c++) {
        char m[8];
        size_t need = cxlkv_result_message(c, NULL, 0);
        checks++;
        if (need < 2 || cxlkv_result_message(c, m, sizeof m) != need || strlen(m) > 7) { failures++; fprintf(stderr, "FAIL message %u\n", c); }
    }
    checks++;
    if (cxlkv_result_message(9999, NULL, 0) < 2) failures++;

    /* The last error belongs to the last call: a failure leaves its message, a success clears it. */
    cxlkv_key named;
    char last[64] = "stale";
    EXPECT(cxlkv_key_from_bytes(NULL, 1, &named), CXLKV_ERR_NULL);
    checks++;
    if (cxlkv_last_error_message(last, sizeof last) < 2 || last[0] == 0) { failures++; fprintf(stderr, "FAIL: no message after a failure\n"); }
    EXPECT(cxlkv_key_from_bytes((const uint8_t *)"k", 1, &named), CXLKV_OK);
    checks++;
    if (cxlkv_last_error_message(last, sizeof last) != 1 || last[0] != 0) { failures++; fprintf(stderr, "FAIL: message after a success: %s\n", last); }
    EXPECT(cxlkv_key_from_bytes(NULL, 1, &named), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_close(NULL), CXLKV_OK);
    checks++;
    if (cxlkv_last_error_message(NULL, 0) != 1) { failures++; fprintf(stderr, "FAIL: message after releasing NULL\n"); }

    /* Pool creation and opening. */
    cxlkv_pool *pool = SENTINEL;
    EXPECT(cxlkv_pool_create(NULL, 1 << 20, NULL, &pool), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_create(spec, 1 << 20, NULL, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_create("bogus-spec", 1 << 20, NULL, &pool), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_pool_create(spec, 0, NULL, &pool), CXLKV_ERR_INVALID_ARG);
    cxlkv_pool_config bad = cxlkv_pool_config_default();
    bad.block_size = 1000;
    EXPECT(cxlkv_pool_create(spec, 16 << 20, &bad, &pool), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_pool_open(spec, &pool), CXLKV_ERR_IO); /* does not exist */
    EXPECT(cxlkv_pool_open("shm:../../etc/passwd", &pool), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (pool != SENTINEL) { failures++; fprintf(stderr, "FAIL: out-param written on failure\n"); }

    /* A file that is not a pool is refused. */
    char notpool[64];
    snprintf(notpool, sizeof notpool, "/dev/shm/cxlkv-notpool-%d", (int)getpid());
    FILE *f = fopen(notpool, "w");
    for (int i = 0; i < 8192; i++) fputc('x', f);
    fclose(f);
    char notspec[80];
    snprintf(notspec, sizeof notspec, "shm:cxlkv-notpool-%d", (int)getpid());
    EXPECT(cxlkv_pool_open(notspec, &pool), CXLKV_ERR_BAD_POOL);
    unlink(notpool);

    cxlkv_pool_config cfg = cxlkv_pool_config_default();
    cfg.block_size = 4096;
    cfg.participants = 1;
    EXPECT(cxlkv_pool_create(spec, 4 << 20, &cfg, &pool), CXLKV_OK);
    EXPECT(cxlkv_pool_create(spec, 4 << 20, &cfg, &pool), CXLKV_ERR_IO); /* exists already */

    /* Pool queries. */
    cxlkv_pool_info info = CXLKV_STRUCT_INIT(cxlkv_pool_info);
    EXPECT(cxlkv_pool_describe(NULL, &info), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_describe(pool, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_describe((cxlkv_pool *)buf, &info), CXLKV_ERR_INVALID_HANDLE); /* not a handle */
    EXPECT(cxlkv_pool_lookup_prefix(NULL, &key, 1, &len), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_lookup_prefix(pool, NULL, 1, &len), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_lookup_prefix(pool, &key, 0, &len), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_pool_lookup_prefix(pool, &key, 1, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_lookup_prefix(pool, &key, SIZE_MAX, &len), CXLKV_ERR_INVALID_ARG);

    /* Keys. */
    size_t nk = 99;
    EXPECT(cxlkv_key_chain(NULL, "m", 0, 0, tokens, 4, 2, keys, 4, &nk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_chain("ns", NULL, 0, 0, tokens, 4, 2, keys, 4, &nk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_chain("ns", "m", 0, 0, NULL, 4, 2, keys, 4, &nk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_chain("ns", "m", 0, 0, tokens, 0, 2, keys, 4, &nk), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_key_chain("ns", "m", 0, 0, tokens, 4, 0, keys, 4, &nk), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_key_chain("ns", "m", 0, 0, tokens, 4, 2, keys, 4, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_chain("ns", "m", 0, 0, tokens, 4, 1, keys, 2, &nk), CXLKV_ERR_BUFFER_TOO_SMALL);
    checks++;
    if (nk != 4) { failures++; fprintf(stderr, "FAIL: needed key count %zu\n", nk); }
    EXPECT(cxlkv_key_chain("ns", "m", 0, 0, tokens, 4, 2, keys, 4, &nk), CXLKV_OK);
    EXPECT(cxlkv_key_chain_salted(NULL, 3, "ns", "m", 0, 0, tokens, 4, 2, keys, 4, &nk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_chain_salted((const uint8_t *)"s", 1, NULL, "m", 0, 0, tokens, 4, 2, keys, 4, &nk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_chain_salted((const uint8_t *)"s", 1, "ns", "m", 0, 0, tokens, 4, 0, keys, 4, &nk), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_key_chain_salted((const uint8_t *)"s", 1, "ns", "m", 0, 0, tokens, 4, 1, keys, 2, &nk), CXLKV_ERR_BUFFER_TOO_SMALL);
    EXPECT(cxlkv_key_chain_salted(NULL, 0, "ns", "m", 0, 0, tokens, 4, 2, keys, 4, &nk), CXLKV_OK); /* empty salt */
    EXPECT(cxlkv_key_from_bytes_salted(NULL, 1, (const uint8_t *)"k", 1, &named), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_from_bytes_salted((const uint8_t *)"s", 1, (const uint8_t *)"k", 1, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_key_from_bytes_salted((const uint8_t *)"s", 1, (const uint8_t *)"k", 1, &named), CXLKV_OK);

    /* Tenants. */
    uint32_t tid = 0;
    EXPECT(cxlkv_pool_tenant_declare(NULL, "t", 0, &tid), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_tenant_declare(pool, NULL, 0, &tid), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_tenant_declare(pool, "t", 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_tenant_declare(pool, "a-name-longer-than-forty-bytes-is-refused!", 0, &tid), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_pool_tenant_set_quota(NULL, "t", 1), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_tenant_set_quota(pool, NULL, 1), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_tenant_set_quota(pool, "undeclared", 1), CXLKV_ERR_INVALID_ARG);
    cxlkv_participant *tenant_p = SENTINEL;
    EXPECT(cxlkv_participant_attach_tenant(NULL, "t", (const uint8_t *)"s", 1, &tenant_p), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_attach_tenant(pool, NULL, (const uint8_t *)"s", 1, &tenant_p), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_attach_tenant(pool, "t", NULL, 1, &tenant_p), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_attach_tenant(pool, "t", (const uint8_t *)"s", 1, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_attach_tenant(pool, "", (const uint8_t *)"s", 1, &tenant_p), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (tenant_p != SENTINEL) failures++;
    EXPECT(cxlkv_participant_tenant(NULL, &tid), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_lookup_prefix(NULL, keys, 1, &nk), CXLKV_ERR_INVALID_HANDLE);

    /* Participants. */
    cxlkv_participant *me = SENTINEL;
    EXPECT(cxlkv_participant_attach(NULL, &me), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_attach(pool, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_attach(pool, &me), CXLKV_OK);
    cxlkv_participant *second = SENTINEL;
    EXPECT(cxlkv_participant_attach(pool, &second), CXLKV_ERR_NO_PARTICIPANT_SLOT);
    checks++;
    if (second != SENTINEL) failures++;
    EXPECT(cxlkv_participant_id(NULL, NULL, NULL), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_id(me, NULL, NULL), CXLKV_OK);
    EXPECT(cxlkv_participant_tenant(me, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_tenant(me, &tid), CXLKV_OK);
    EXPECT(cxlkv_participant_lookup_prefix(me, NULL, 1, &nk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_lookup_prefix(me, keys, 0, &nk), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_participant_lookup_prefix(me, keys, 1, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_lookup_prefix(me, keys, 1, &nk), CXLKV_OK);

    /* put */
    /* Larger than a block is a multi-block object; larger than the partition is too large. */
    enum { BIG_LEN = 8 << 20 };
    uint8_t *big = malloc(BIG_LEN);
    memset(big, 1, BIG_LEN);
    EXPECT(cxlkv_participant_put(NULL, &key, buf, 4), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_put(me, NULL, buf, 4), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put(me, &key, NULL, 4), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put(me, &key, big, BIG_LEN), CXLKV_ERR_PAYLOAD_TOO_LARGE);
    EXPECT(cxlkv_participant_put(me, &key, big, 4097), CXLKV_OK);
    uint8_t two[4097];
    EXPECT(cxlkv_participant_get(me, &key, two, sizeof two, &len), CXLKV_OK);
    checks++;
    if (len != 4097 || memcmp(two, big, 4097) != 0) { failures++; fprintf(stderr, "FAIL: two-block object\n"); }
    EXPECT(cxlkv_participant_put(me, &key, buf, SIZE_MAX), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_participant_put(me, &key, NULL, 0), CXLKV_OK); /* empty payload is valid */
    memset(buf, 7, sizeof buf);
    EXPECT(cxlkv_participant_put(me, &key, buf, 40), CXLKV_OK);

    /* get */
    len = 777;
    EXPECT(cxlkv_participant_get(NULL, &key, buf, sizeof buf, &len), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_get(me, NULL, buf, sizeof buf, &len), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get(me, &key, NULL, 10, &len), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get(me, &key, buf, sizeof buf, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get(me, &key, buf, SIZE_MAX, &len), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (len != 777) { failures++; fprintf(stderr, "FAIL: len written on failure\n"); }
    EXPECT(cxlkv_participant_get(me, &key, NULL, 0, &len), CXLKV_ERR_BUFFER_TOO_SMALL);
    checks++;
    if (len != 40) { failures++; fprintf(stderr, "FAIL: needed size %zu, expected 40\n", len); }
    EXPECT(cxlkv_participant_get(me, &key, buf, 39, &len), CXLKV_ERR_BUFFER_TOO_SMALL);
    EXPECT(cxlkv_participant_get(me, &key, buf, sizeof buf, &len), CXLKV_OK);
    cxlkv_key missing = {9, 9};
    EXPECT(cxlkv_participant_get(me, &missing, buf, sizeof buf, &len), CXLKV_ERR_NOT_FOUND);

    /* pin */
    cxlkv_pinned *pin = SENTINEL;
    const uint8_t *data = SENTINEL;
    EXPECT(cxlkv_participant_pin(NULL, &key, &pin, &data, &len), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_pin(me, NULL, &pin, &data, &len), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_pin(me, &key, NULL, &data, &len), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_pin(me, &key, &pin, NULL, &len), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_pin(me, &key, &pin, &data, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_pin(me, &missing, &pin, &data, &len), CXLKV_ERR_NOT_FOUND);
    checks++;
    if (pin != SENTINEL || data != SENTINEL) failures++;
    EXPECT(cxlkv_participant_pin(me, &key, &pin, &data, &len), CXLKV_OK);
    EXPECT(cxlkv_pinned_release(pin), CXLKV_OK);
    EXPECT(cxlkv_pinned_release(pin), CXLKV_ERR_INVALID_HANDLE); /* double release */
    EXPECT(cxlkv_pinned_release(NULL), CXLKV_OK);

    /* reserve / commit / abort */
    cxlkv_reservation *res = SENTINEL;
    uint8_t *dst = SENTINEL;
    EXPECT(cxlkv_participant_reserve(NULL, &key, 10, &res, &dst), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_reserve(me, NULL, 10, &res, &dst), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_reserve(me, &key, 10, NULL, &dst), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_reserve(me, &key, 10, &res, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_reserve(me, &key, 4097, &res, &dst), CXLKV_ERR_PAYLOAD_TOO_LARGE);
    EXPECT(cxlkv_participant_reserve(me, &key, SIZE_MAX, &res, &dst), CXLKV_ERR_PAYLOAD_TOO_LARGE);
    EXPECT(cxlkv_reservation_commit(NULL), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_reservation_abort(NULL), CXLKV_OK);
    EXPECT(cxlkv_participant_reserve(me, &missing, 8, &res, &dst), CXLKV_OK);
    memcpy(dst, "reserved", 8);
    EXPECT(cxlkv_reservation_commit(res), CXLKV_OK);
    EXPECT(cxlkv_reservation_commit(res), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_reserve(me, &keys[0], 8, &res, &dst), CXLKV_OK);
    EXPECT(cxlkv_reservation_abort(res), CXLKV_OK);
    EXPECT(cxlkv_participant_get(me, &keys[0], buf, sizeof buf, &len), CXLKV_ERR_NOT_FOUND);

    /* delete, stats */
    EXPECT(cxlkv_participant_delete(NULL, &key), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_delete(me, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_delete(me, &key), CXLKV_OK);
    EXPECT(cxlkv_participant_delete(me, &key), CXLKV_ERR_NOT_FOUND);
    cxlkv_stats st = CXLKV_STRUCT_INIT(cxlkv_stats);
    EXPECT(cxlkv_participant_stats(NULL, &st), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_stats(me, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_stats(me, &st), CXLKV_OK);

    /* Structs that carry their size: below the first layout is refused and nothing is written. */
    cxlkv_stats st_bad = CXLKV_STRUCT_INIT(cxlkv_stats);
    st_bad.struct_size = 0;
    st_bad.puts = 12345;
    EXPECT(cxlkv_participant_stats(me, &st_bad), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (st_bad.puts != 12345 || st_bad.struct_size != 0) { failures++; fprintf(stderr, "FAIL: stats written with size 0\n"); }
    cxlkv_pool_info info_bad = CXLKV_STRUCT_INIT(cxlkv_pool_info);
    info_bad.struct_size = 39;
    EXPECT(cxlkv_pool_describe(pool, &info_bad), CXLKV_ERR_INVALID_ARG);
    info_bad.struct_size = 40; /* an older caller: the first layout only */
    info_bad.map_len = 777;
    EXPECT(cxlkv_pool_describe(pool, &info_bad), CXLKV_OK);
    checks++;
    if (info_bad.struct_size != 40 || info_bad.map_len != 777 || info_bad.block_size != 4096) { failures++; fprintf(stderr, "FAIL: old pool_info\n"); }
    cxlkv_pool_config cfg_bad = cxlkv_pool_config_default();
    cfg_bad.struct_size = 19;
    cxlkv_pool *pool_bad = SENTINEL;
    EXPECT(cxlkv_pool_create("shm:cxlkv-misuse-never", 4 << 20, &cfg_bad, &pool_bad), CXLKV_ERR_INVALID_ARG);
    cfg_bad.struct_size = sizeof cfg_bad;
    cfg_bad.block_size = 4096;
    cfg_bad.pins_per_participant = 65537; /* above the largest pin table */
    EXPECT(cxlkv_pool_create("shm:cxlkv-misuse-never", 4 << 20, &cfg_bad, &pool_bad), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (pool_bad != SENTINEL) failures++;

    /* A pool with a pin table of 2: the third pin is refused until one is released. */
    char pinspec[64];
    snprintf(pinspec, sizeof pinspec, "shm:cxlkv-misuse-pins-%d", (int)getpid());
    cxlkv_pool_config pcfg = cxlkv_pool_config_default();
    pcfg.block_size = 4096;
    pcfg.participants = 1;
    pcfg.pins_per_participant = 2;
    cxlkv_pool *ppool = NULL;
    cxlkv_participant *pme = NULL;
    EXPECT(cxlkv_pool_create(pinspec, 4 << 20, &pcfg, &ppool), CXLKV_OK);
    cxlkv_pool_info pinfo = CXLKV_STRUCT_INIT(cxlkv_pool_info);
    EXPECT(cxlkv_pool_describe(ppool, &pinfo), CXLKV_OK);
    checks++;
    if (pinfo.pins_per_participant != 2) { failures++; fprintf(stderr, "FAIL: pin table %u\n", pinfo.pins_per_participant); }
    EXPECT(cxlkv_participant_attach(ppool, &pme), CXLKV_OK);
    cxlkv_pinned *pp[3] = {NULL, NULL, NULL};
    const uint8_t *pd = NULL;
    size_t pl = 0;
    for (uint64_t i = 0; i < 3; i++) {
        cxlkv_key pk = {900 + i, 9};
        EXPECT(cxlkv_participant_put(pme, &pk, buf, 16), CXLKV_OK);
    }
    cxlkv_key pk0 = {900, 9}, pk1 = {901, 9}, pk2 = {902, 9};
    EXPECT(cxlkv_participant_pin(pme, &pk0, &pp[0], &pd, &pl), CXLKV_OK);
    EXPECT(cxlkv_participant_pin(pme, &pk1, &pp[1], &pd, &pl), CXLKV_OK);
    EXPECT(cxlkv_participant_pin(pme, &pk2, &pp[2], &pd, &pl), CXLKV_ERR_PIN_TABLE_FULL);
    EXPECT(cxlkv_pinned_release(pp[0]), CXLKV_OK);
    EXPECT(cxlkv_participant_pin(pme, &pk2, &pp[2], &pd, &pl), CXLKV_OK);
    EXPECT(cxlkv_pinned_release(pp[1]), CXLKV_OK);
    EXPECT(cxlkv_pinned_release(pp[2]), CXLKV_OK);
    EXPECT(cxlkv_participant_detach(pme), CXLKV_OK);
    EXPECT(cxlkv_pool_close(ppool), CXLKV_OK);
    EXPECT(cxlkv_pool_unlink(pinspec), CXLKV_OK);

    /* put_if_absent: NULLs; present keys are not overwritten; too large. */
    int stored = 7;
    cxlkv_key pia = {555, 5};
    EXPECT(cxlkv_participant_put_if_absent(NULL, &pia, buf, 4, &stored), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_put_if_absent(me, NULL, buf, 4, &stored), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_if_absent(me, &pia, NULL, 4, &stored), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_if_absent(me, &pia, buf, 4, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_if_absent(me, &pia, buf, SIZE_MAX, &stored), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (stored != 7) failures++;
    EXPECT(cxlkv_participant_put_if_absent(me, &pia, (const uint8_t *)"first", 5, &stored), CXLKV_OK);
    checks++;
    if (stored != 1) failures++;
    EXPECT(cxlkv_participant_put_if_absent(me, &pia, (const uint8_t *)"other", 5, &stored), CXLKV_OK);
    EXPECT(cxlkv_participant_get(me, &pia, buf, sizeof buf, &len), CXLKV_OK);
    checks++;
    if (stored != 0 || len != 5 || memcmp(buf, "first", 5) != 0) { failures++; fprintf(stderr, "FAIL: put_if_absent overwrote\n"); }

    /* The pool's mapping. */
    void *mbase = SENTINEL;
    size_t mlen = 777;
    EXPECT(cxlkv_pool_mapping(NULL, &mbase, &mlen), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_mapping((cxlkv_pool *)me, &mbase, &mlen), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_mapping(pool, NULL, &mlen), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_mapping(pool, &mbase, NULL), CXLKV_ERR_NULL);
    checks++;
    if (mbase != SENTINEL || mlen != 777) failures++;
    EXPECT(cxlkv_pool_mapping(pool, &mbase, &mlen), CXLKV_OK);
    checks++;
    if (mbase == SENTINEL || mlen != 4 << 20) { failures++; fprintf(stderr, "FAIL: mapping %zu bytes\n", mlen); }

    /* Batches: n = 0 touches nothing; NULL arrays with n > 0; per-key codes and the first failure. */
    cxlkv_key bkeys[3] = {{301, 1}, {302, 1}, {303, 1}};
    const uint8_t *bin[3] = {buf, NULL, big};
    size_t blen[3] = {8, 0, BIG_LEN};
    cxlkv_result bres[3] = {99, 99, 99};
    EXPECT(cxlkv_participant_put_batch(me, 0, NULL, NULL, NULL, NULL), CXLKV_OK);
    EXPECT(cxlkv_participant_put_batch(NULL, 3, bkeys, bin, blen, bres), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_put_batch(me, 3, NULL, bin, blen, bres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_batch(me, 3, bkeys, NULL, blen, bres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_batch(me, 3, bkeys, bin, NULL, bres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_batch(me, 3, bkeys, bin, blen, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_batch(me, SIZE_MAX, bkeys, bin, blen, bres), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (bres[0] != 99) { failures++; fprintf(stderr, "FAIL: results written on a bad batch\n"); }
    EXPECT(cxlkv_participant_put_batch(me, 3, bkeys, bin, blen, bres), CXLKV_ERR_PAYLOAD_TOO_LARGE);
    checks++;
    if (bres[0] != CXLKV_OK || bres[1] != CXLKV_OK || bres[2] != CXLKV_ERR_PAYLOAD_TOO_LARGE) { failures++; fprintf(stderr, "FAIL: put_batch results %u %u %u\n", bres[0], bres[1], bres[2]); }
    bin[1] = NULL;
    blen[1] = 5; /* NULL buffer with a length: that key fails, the others are stored */
    blen[2] = 3;
    EXPECT(cxlkv_participant_put_batch(me, 3, bkeys, bin, blen, bres), CXLKV_ERR_NULL);
    checks++;
    if (bres[0] != CXLKV_OK || bres[1] != CXLKV_ERR_NULL || bres[2] != CXLKV_OK) { failures++; fprintf(stderr, "FAIL: put_batch NULL buffer\n"); }
    uint8_t gb0[8], gb2[2];
    uint8_t *gout[3] = {gb0, NULL, gb2};
    size_t gcap[3] = {sizeof gb0, 0, sizeof gb2}, glen[3] = {0, 0, 0};
    EXPECT(cxlkv_participant_get_batch(me, 0, NULL, NULL, NULL, NULL, NULL), CXLKV_OK);
    EXPECT(cxlkv_participant_get_batch(NULL, 3, bkeys, gout, gcap, glen, bres), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_get_batch(me, 3, NULL, gout, gcap, glen, bres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_batch(me, 3, bkeys, NULL, gcap, glen, bres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_batch(me, 3, bkeys, gout, NULL, glen, bres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_batch(me, 3, bkeys, gout, gcap, NULL, bres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_batch(me, 3, bkeys, gout, gcap, glen, NULL), CXLKV_ERR_NULL);
    /* key 1 holds the empty payload of the first batch (the second failed on it); key 2 holds 3
     * bytes, room for 2: the needed size is stored */
    glen[1] = 55;
    EXPECT(cxlkv_participant_get_batch(me, 3, bkeys, gout, gcap, glen, bres), CXLKV_ERR_BUFFER_TOO_SMALL);
    checks++;
    if (bres[0] != CXLKV_OK || bres[1] != CXLKV_OK || bres[2] != CXLKV_ERR_BUFFER_TOO_SMALL || glen[0] != 8 || glen[1] != 0 || glen[2] != 3) {
        failures++;
        fprintf(stderr, "FAIL: get_batch results %u %u %u lens %zu %zu %zu\n", bres[0], bres[1], bres[2], glen[0], glen[1], glen[2]);
    }
    cxlkv_key absent[2] = {{4243, 4243}, {301, 1}};
    glen[0] = 55;
    EXPECT(cxlkv_participant_get_batch(me, 2, absent, gout, gcap, glen, bres), CXLKV_ERR_NOT_FOUND); /* the first failure */
    checks++;
    if (bres[0] != CXLKV_ERR_NOT_FOUND || bres[1] != CXLKV_ERR_BUFFER_TOO_SMALL || glen[0] != 55 || glen[1] != 8) { failures++; fprintf(stderr, "FAIL: get_batch miss\n"); }
    gout[0] = NULL; /* NULL with a capacity: that key fails */
    EXPECT(cxlkv_participant_get_batch(me, 1, bkeys, gout, gcap, glen, bres), CXLKV_ERR_NULL);
    uint8_t pres[3] = {9, 9, 9};
    EXPECT(cxlkv_pool_contains_batch(pool, 0, NULL, NULL), CXLKV_OK);
    EXPECT(cxlkv_pool_contains_batch(NULL, 3, bkeys, pres), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_contains_batch(pool, 3, NULL, pres), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_contains_batch(pool, 3, bkeys, NULL), CXLKV_ERR_NULL);
    checks++;
    if (pres[0] != 9) failures++;
    EXPECT(cxlkv_pool_contains_batch(pool, 3, bkeys, pres), CXLKV_OK);
    EXPECT(cxlkv_pool_contains_batch(pool, 2, absent, pres), CXLKV_OK);
    checks++;
    if (pres[0] != 0 || pres[1] != 1) { failures++; fprintf(stderr, "FAIL: contains_batch of an absent key\n"); }
    EXPECT(cxlkv_pool_contains_batch(pool, 3, bkeys, pres), CXLKV_OK);
    checks++;
    if (pres[0] != 1 || pres[1] != 1 || pres[2] != 1) { failures++; fprintf(stderr, "FAIL: contains_batch %d %d %d\n", pres[0], pres[1], pres[2]); }

    /* Typed KV blocks and the near-data device (no device runs here: the host path answers). */
    uint16_t kv[2 * 16] = {0};
    cxlkv_kv_shape shape = {.struct_size = sizeof shape, .dtype = CXLKV_DTYPE_F16, .layer = 0, .kv_heads = 1,
                            .head_dim = 16, .tokens = 2, .sequence = 7, .token_offset = 0};
    cxlkv_key kvkey = {77, 77};
    EXPECT(cxlkv_participant_put_kv(NULL, &kvkey, &shape, (uint8_t *)kv, sizeof kv, (uint8_t *)kv, sizeof kv), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_put_kv(me, &kvkey, NULL, (uint8_t *)kv, sizeof kv, (uint8_t *)kv, sizeof kv), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_kv(me, &kvkey, &shape, NULL, sizeof kv, (uint8_t *)kv, sizeof kv), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put_kv(me, &kvkey, &shape, (uint8_t *)kv, 10, (uint8_t *)kv, sizeof kv), CXLKV_ERR_INVALID_ARG);
    shape.dtype = 9;
    EXPECT(cxlkv_participant_put_kv(me, &kvkey, &shape, (uint8_t *)kv, sizeof kv, (uint8_t *)kv, sizeof kv), CXLKV_ERR_INVALID_ARG);
    shape.dtype = CXLKV_DTYPE_F16;
    EXPECT(cxlkv_participant_put_kv(me, &kvkey, &shape, (uint8_t *)kv, sizeof kv, (uint8_t *)kv, sizeof kv), CXLKV_OK);
    cxlkv_device *dev = SENTINEL;
    EXPECT(cxlkv_device_open(NULL, 0, &dev), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_open(me, 0, NULL), CXLKV_ERR_NULL);
    cxlkv_device_config dc = CXLKV_STRUCT_INIT(cxlkv_device_config);
    dc.staging = 17;
    EXPECT(cxlkv_device_open_with(NULL, &dc, &dev), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_open_with(me, &dc, &dev), CXLKV_ERR_INVALID_ARG);
    dc.staging = 3;
    dc.struct_size = 12;
    EXPECT(cxlkv_device_open_with(me, &dc, &dev), CXLKV_ERR_INVALID_ARG);
    dc.struct_size = sizeof dc;
    EXPECT(cxlkv_device_open_with(me, &dc, NULL), CXLKV_ERR_NULL);
    checks++;
    if (dev != SENTINEL) failures++;
    EXPECT(cxlkv_device_open_with(me, &dc, &dev), CXLKV_OK);
    EXPECT(cxlkv_device_close(dev), CXLKV_OK);
    EXPECT(cxlkv_device_open_with(me, NULL, &dev), CXLKV_OK);
    EXPECT(cxlkv_device_close(dev), CXLKV_OK);
    EXPECT(cxlkv_device_open(me, 100, &dev), CXLKV_OK);
    float qv[16] = {1};
    cxlkv_block_ref bref = {kvkey, 0};
    cxlkv_score_request sr = {.struct_size = sizeof sr, .group = 1, .queries = qv, .dim = 16, .layer = 0,
                              .blocks = &bref, .nblocks = 1, .sequence = 7, .kv_head = 0,
                              .dtype = CXLKV_DTYPE_F16, .k = 2, .flags = 0};
    uint32_t hi[4];
    float hs[4];
    size_t per = 99;
    cxlkv_ndp_stats nst = CXLKV_STRUCT_INIT(cxlkv_ndp_stats);
    EXPECT(cxlkv_device_score_topk(NULL, &sr, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_score_topk(dev, NULL, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_score_topk(dev, &sr, NULL, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 4, NULL, 0, NULL, &nst), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 1, NULL, 0, &per, &nst), CXLKV_ERR_BUFFER_TOO_SMALL);
    checks++;
    if (per != 99) failures++;
    sr.k = 0;
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_INVALID_ARG);
    sr.k = 2;
    sr.flags = 0x100;
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_INVALID_ARG);
    sr.flags = CXLKV_SCORE_GATHER_V;
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_BUFFER_TOO_SMALL);
    sr.flags = 0;
    sr.sequence = 8; /* a block of another sequence */
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_INVALID_ARG);
    sr.sequence = 7;
    sr.nblocks = 0;
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_ERR_INVALID_ARG);
    sr.nblocks = 1;
    EXPECT(cxlkv_device_score_topk(dev, &sr, hi, hs, 4, NULL, 0, &per, &nst), CXLKV_OK);
    checks++;
    if (per != 2 || nst.on_device != 0) failures++;
    uint32_t tok = 1;
    uint16_t row[16];
    EXPECT(cxlkv_device_gather(NULL, &bref, 1, 7, 0, 0, CXLKV_DTYPE_F16, 16, &tok, 1, (uint8_t *)row, sizeof row, NULL), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_gather(dev, &bref, 1, 7, 0, 0, CXLKV_DTYPE_F16, 16, &tok, 1, (uint8_t *)row, 4, NULL), CXLKV_ERR_BUFFER_TOO_SMALL);
    EXPECT(cxlkv_device_gather(dev, &bref, 1, 7, 0, 0, CXLKV_DTYPE_F16, 16, NULL, 1, (uint8_t *)row, sizeof row, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_gather(dev, &bref, 1, 7, 0, 0, CXLKV_DTYPE_F16, 16, &tok, 1, (uint8_t *)row, sizeof row, NULL), CXLKV_OK);

    /* get_kv: NULLs, a raw block, a missing key, too little room (needed size stored), sizes. */
    cxlkv_kv_shape gs = CXLKV_STRUCT_INIT(cxlkv_kv_shape);
    uint16_t gk[2 * 16], gv[2 * 16];
    size_t kvl = 777;
    EXPECT(cxlkv_participant_get_kv(NULL, &kvkey, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_get_kv(me, NULL, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_kv(me, &kvkey, NULL, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_kv(me, &kvkey, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_kv(me, &kvkey, &gs, NULL, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_get_kv(me, &missing, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_ERR_INVALID_ARG); /* `missing` holds raw bytes */
    cxlkv_key nokey = {4242, 4242};
    EXPECT(cxlkv_participant_get_kv(me, &nokey, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_ERR_NOT_FOUND);
    gs.struct_size = 8;
    EXPECT(cxlkv_participant_get_kv(me, &kvkey, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_ERR_INVALID_ARG);
    gs.struct_size = sizeof gs;
    checks++;
    if (kvl != 777) { failures++; fprintf(stderr, "FAIL: kv_len written on failure\n"); }
    EXPECT(cxlkv_participant_get_kv(me, &kvkey, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, 10, &kvl), CXLKV_ERR_BUFFER_TOO_SMALL);
    checks++;
    if (kvl != sizeof gk || gs.tokens != 0) { failures++; fprintf(stderr, "FAIL: get_kv needed %zu\n", kvl); }
    EXPECT(cxlkv_participant_get_kv(me, &kvkey, &gs, (uint8_t *)gk, sizeof gk, (uint8_t *)gv, sizeof gv, &kvl), CXLKV_OK);
    checks++;
    if (kvl != sizeof gk || gs.tokens != 2 || gs.head_dim != 16 || gs.sequence != 7) { failures++; fprintf(stderr, "FAIL: get_kv shape\n"); }

    /* Asynchronous commands: NULLs, bad sizes, too-small result arrays, unknown and collected tickets. */
    uint64_t tk = 777;
    int dn = -1;
    uint32_t ai[4];
    float as[4];
    size_t aper = 0;
    EXPECT(cxlkv_device_submit_score_topk(NULL, &sr, ai, as, 4, NULL, 0, &aper, &tk), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_submit_score_topk(dev, NULL, ai, as, 4, NULL, 0, &aper, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, NULL, as, 4, NULL, 0, &aper, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, NULL, 4, NULL, 0, &aper, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 4, NULL, 0, NULL, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 4, NULL, 0, &aper, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 1, NULL, 0, &aper, &tk), CXLKV_ERR_BUFFER_TOO_SMALL);
    sr.flags = CXLKV_SCORE_GATHER_V;
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 4, NULL, 0, &aper, &tk), CXLKV_ERR_BUFFER_TOO_SMALL);
    sr.flags = 0;
    sr.struct_size = 63;
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 4, NULL, 0, &aper, &tk), CXLKV_ERR_INVALID_ARG);
    sr.struct_size = sizeof sr;
    sr.k = 0;
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 4, NULL, 0, &aper, &tk), CXLKV_ERR_INVALID_ARG);
    sr.k = 2;
    checks++;
    if (tk != 777) { failures++; fprintf(stderr, "FAIL: ticket written on failure\n"); }
    float aout[16], amax[1], asum[1];
    cxlkv_attend_request areq = {.struct_size = sizeof areq, .group = 1, .queries = qv, .dim = 16, .layer = 0,
                                 .blocks = &bref, .nblocks = 1, .sequence = 7, .dtype = CXLKV_DTYPE_F16};
    EXPECT(cxlkv_device_submit_attend(NULL, &areq, aout, 16, amax, asum, &tk), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_submit_attend(dev, NULL, aout, 16, amax, asum, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_attend(dev, &areq, NULL, 16, amax, asum, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, NULL, asum, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, amax, NULL, &tk), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, amax, asum, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 15, amax, asum, &tk), CXLKV_ERR_BUFFER_TOO_SMALL);
    areq.struct_size = 4;
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, amax, asum, &tk), CXLKV_ERR_INVALID_ARG);
    areq.struct_size = sizeof areq;
    areq.scale = 1.0f / 0.0f;
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, amax, asum, &tk), CXLKV_ERR_INVALID_ARG);
    areq.scale = 0.0f;
    areq.nblocks = 0;
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, amax, asum, &tk), CXLKV_ERR_INVALID_ARG);
    areq.nblocks = 1;
    checks++;
    if (tk != 777) failures++;
    /* The synchronous ATTEND and the SCORE_TOPK with a selection take the same misuse. */
    cxlkv_ndp_stats ast = CXLKV_STRUCT_INIT(cxlkv_ndp_stats);
    EXPECT(cxlkv_device_attend(NULL, &areq, aout, 16, amax, asum, &ast), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_attend(dev, NULL, aout, 16, amax, asum, &ast), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_attend(dev, &areq, NULL, 16, amax, asum, &ast), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_attend(dev, &areq, aout, 16, NULL, asum, &ast), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_attend(dev, &areq, aout, 16, amax, NULL, &ast), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_attend(dev, &areq, aout, 15, amax, asum, &ast), CXLKV_ERR_BUFFER_TOO_SMALL);
    areq.scale = 1.0f / 0.0f;
    EXPECT(cxlkv_device_attend(dev, &areq, aout, 16, amax, asum, &ast), CXLKV_ERR_INVALID_ARG);
    areq.scale = 0.0f;
    areq.sequence = 8; /* a block of another sequence */
    EXPECT(cxlkv_device_attend(dev, &areq, aout, 16, amax, asum, &ast), CXLKV_ERR_INVALID_ARG);
    areq.sequence = 7;
    EXPECT(cxlkv_device_attend(dev, &areq, aout, 16, amax, asum, NULL), CXLKV_OK);
    cxlkv_select sel = CXLKV_STRUCT_INIT(cxlkv_select);
    uint32_t cnt[1] = {99};
    float lom[1];
    EXPECT(cxlkv_device_score_select(NULL, &sr, &sel, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_score_select(dev, NULL, &sel, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_score_select(dev, &sr, NULL, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, NULL, lom, 1, NULL, 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, cnt, NULL, 1, NULL, 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, cnt, lom, 0, NULL, 0, NULL), CXLKV_ERR_BUFFER_TOO_SMALL);
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 1, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_BUFFER_TOO_SMALL);
    sel.top_p = 1.5f;
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_INVALID_ARG);
    sel.top_p = 0.0f;
    sel.flags = 0x10;
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_INVALID_ARG);
    sel.flags = CXLKV_SELECT_WINDOW;
    sel.window_start = 3;
    sel.window_end = 1; /* reversed */
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_INVALID_ARG);
    sel.flags = 0;
    sel.struct_size = 4;
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_ERR_INVALID_ARG);
    checks++;
    if (cnt[0] != 99) { failures++; fprintf(stderr, "FAIL: counts written on failure\n"); }
    sel.struct_size = sizeof sel;
    sel.sinks = 1;
    EXPECT(cxlkv_device_score_select(dev, &sr, &sel, hi, hs, 4, cnt, lom, 1, NULL, 0, NULL), CXLKV_OK);
    checks++;
    if (cnt[0] != 2 || (hi[0] != 0 && hi[1] != 0)) { failures++; fprintf(stderr, "FAIL: sink 0 not selected\n"); }
    EXPECT(cxlkv_device_poll(NULL, 1, &dn, NULL), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_poll(dev, 0, &dn, NULL), CXLKV_ERR_INVALID_ARG);  /* never issued */
    EXPECT(cxlkv_device_poll(dev, 12345, &dn, NULL), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_device_wait(dev, 12345, 0, &dn, NULL), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_device_wait(NULL, 1, 0, &dn, NULL), CXLKV_ERR_INVALID_HANDLE);
    size_t nfly = 99;
    EXPECT(cxlkv_device_in_flight(NULL, &nfly), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_in_flight(dev, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 4, NULL, 0, &aper, &tk), CXLKV_OK);
    uint64_t tk2 = 0, tk3 = 0;
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, amax, asum, &tk2), CXLKV_OK);
    EXPECT(cxlkv_device_submit_attend(dev, &areq, aout, 16, amax, asum, &tk3), CXLKV_OK); /* left in flight */
    EXPECT(cxlkv_device_in_flight(dev, &nfly), CXLKV_OK);
    checks++;
    if (nfly != 3 || tk == tk2 || tk2 == tk3) { failures++; fprintf(stderr, "FAIL: %zu tickets in flight\n", nfly); }
    EXPECT(cxlkv_device_poll(dev, tk, NULL, NULL), CXLKV_ERR_NULL);
    cxlkv_ndp_stats small_st = CXLKV_STRUCT_INIT(cxlkv_ndp_stats);
    small_st.struct_size = 39;
    EXPECT(cxlkv_device_poll(dev, tk, &dn, &small_st), CXLKV_ERR_INVALID_ARG);
    EXPECT(cxlkv_device_wait(dev, tk, CXLKV_WAIT_FOREVER, &dn, &nst), CXLKV_OK); /* still valid: the bad calls did not collect it */
    checks++;
    if (dn != 1 || aper != 2 || nst.on_device != 0) { failures++; fprintf(stderr, "FAIL: waited ticket done=%d per_list=%zu\n", dn, aper); }
    EXPECT(cxlkv_device_poll(dev, tk, &dn, NULL), CXLKV_ERR_INVALID_ARG); /* collected */
    EXPECT(cxlkv_device_wait(dev, tk, 10, &dn, NULL), CXLKV_ERR_INVALID_ARG);
    /* A command that fails (its block is of another sequence) fails the call that collects it,
     * and the ticket is gone. */
    uint64_t tk4 = 0;
    sr.sequence = 8;
    EXPECT(cxlkv_device_submit_score_topk(dev, &sr, ai, as, 4, NULL, 0, &aper, &tk4), CXLKV_OK);
    sr.sequence = 7;
    EXPECT(cxlkv_device_wait(dev, tk4, CXLKV_WAIT_FOREVER, &dn, NULL), CXLKV_ERR_INVALID_ARG);
    char wm[200];
    cxlkv_last_error_message(wm, sizeof wm);
    checks++;
    if (strstr(wm, "sequence") == NULL && strstr(wm, "layout") == NULL) { failures++; fprintf(stderr, "FAIL: failed ticket message: %s\n", wm); }
    EXPECT(cxlkv_device_poll(dev, tk4, &dn, NULL), CXLKV_ERR_INVALID_ARG); /* gone */
    cxlkv_last_error_message(wm, sizeof wm);
    checks++;
    if (strstr(wm, "unknown or already collected") == NULL) { failures++; fprintf(stderr, "FAIL: message %s\n", wm); }
    EXPECT(cxlkv_device_wait(dev, tk2, 5000, &dn, NULL), CXLKV_OK);
    checks++;
    if (dn != 1 || !(asum[0] >= 1.0f)) { failures++; fprintf(stderr, "FAIL: attend done=%d sum=%f\n", dn, (double)asum[0]); }
    EXPECT(cxlkv_device_close(dev), CXLKV_OK);
    EXPECT(cxlkv_device_close(dev), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_device_close(NULL), CXLKV_OK);

    /* A handle of one type passed as another is refused. */
    EXPECT(cxlkv_participant_put((cxlkv_participant *)pool, &key, buf, 4), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_describe((cxlkv_pool *)me, &info), CXLKV_ERR_INVALID_HANDLE);

    /* A detached participant is detected. */
    EXPECT(cxlkv_participant_detach(me), CXLKV_OK);
    EXPECT(cxlkv_participant_put(me, &key, buf, 4), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_get(me, &key, buf, sizeof buf, &len), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_detach(me), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_detach(NULL), CXLKV_OK);

    /* A read-only participant: all slots... one slot, now free: attach works again. */
    EXPECT(cxlkv_participant_attach(pool, &me), CXLKV_OK);
    EXPECT(cxlkv_participant_get(me, &missing, buf, sizeof buf, &len), CXLKV_OK);
    checks++;
    if (len != 8 || memcmp(buf, "reserved", 8) != 0) failures++;
    EXPECT(cxlkv_participant_detach(me), CXLKV_OK);

    /* The pool's per-participant counters and its metrics text: NULL handles and pointers, a size
     * field below the first layout, a slot that is not the pool's, a NULL buffer with room. */
    cxlkv_participant_counters pc;
    memset(&pc, 0, sizeof pc);
    EXPECT(cxlkv_pool_participant_counters(NULL, 0, &pc), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_participant_counters(pool, 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_participant_counters(pool, 0, &pc), CXLKV_ERR_INVALID_ARG); /* size 0 */
    pc.struct_size = sizeof pc;
    EXPECT(cxlkv_pool_participant_counters(pool, 1u << 30, &pc), CXLKV_ERR_NOT_FOUND);
    size_t plen = 0;
    EXPECT(cxlkv_pool_metrics_text(NULL, NULL, 0, &plen), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_metrics_text(pool, NULL, 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_metrics_text(pool, NULL, 16, &plen), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_metrics_text(pool, NULL, 0, &plen), CXLKV_ERR_BUFFER_TOO_SMALL);
    checks++;
    if (plen < 6) { failures++; fprintf(stderr, "FAIL: pool metrics text length %zu\n", plen); }

    EXPECT(cxlkv_pool_close(pool), CXLKV_OK);
    EXPECT(cxlkv_pool_close(pool), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_pool_close(NULL), CXLKV_OK);
    EXPECT(cxlkv_pool_unlink(NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_pool_unlink(spec), CXLKV_OK);

    /* Metrics: NULL pointers, a size field too small to hold itself, a NULL buffer with room. */
    cxlkv_metrics metrics;
    memset(&metrics, 0, sizeof metrics);
    EXPECT(cxlkv_metrics_read(NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_metrics_read(&metrics), CXLKV_ERR_INVALID_ARG); /* size 0 */
    metrics.struct_size = sizeof metrics;
    EXPECT(cxlkv_metrics_read(&metrics), CXLKV_OK);
    size_t tlen = 0;
    EXPECT(cxlkv_metrics_text(NULL, 0, NULL), CXLKV_ERR_NULL);
    EXPECT(cxlkv_metrics_text(NULL, 16, &tlen), CXLKV_ERR_NULL);
    EXPECT(cxlkv_metrics_text(NULL, 0, &tlen), CXLKV_ERR_BUFFER_TOO_SMALL);
    checks++;
    if (tlen < 6) { failures++; fprintf(stderr, "FAIL: metrics text length %zu\n", tlen); }

    free(big);
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
