/* misuse.c: every libcxlkv entry point called with NULL handles and pointers, zero and oversized
 * lengths, too-small buffers and released handles must return its documented error code, never
 * crash, and leave out-parameters untouched on failure. Exit status 0 when all checks pass. */
#include <stdint.h>
#include <stdio.h>
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

    /* put */
    uint8_t big[4097];
    memset(big, 1, sizeof big);
    EXPECT(cxlkv_participant_put(NULL, &key, buf, 4), CXLKV_ERR_INVALID_HANDLE);
    EXPECT(cxlkv_participant_put(me, NULL, buf, 4), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put(me, &key, NULL, 4), CXLKV_ERR_NULL);
    EXPECT(cxlkv_participant_put(me, &key, big, sizeof big), CXLKV_ERR_PAYLOAD_TOO_LARGE);
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

    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
