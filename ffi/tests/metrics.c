/* metrics.c: the process's metrics through the C ABI follow known operations. In a fresh
 * process: 3 puts of 100 bytes, 2 gets that hit and 1 that misses, 1 pin and 1 delete must read
 * back as exactly those counts and bytes from cxlkv_metrics_read, and as the same numbers in the
 * Prometheus text of cxlkv_metrics_text. A short `size` field gets only that many bytes. The
 * counters the participant publishes in its pool slot read the same through a second pool handle
 * (cxlkv_pool_participant_counters, cxlkv_pool_metrics_text). Device commands (no device runs, so
 * the host answers each): SCORE_TOPK called and through tickets, ATTEND through tickets, each
 * counted once under its own op, a failed one as an error; a caller sized before `attend` was
 * appended gets the first layout only. Last, the metrics scenario every front end runs with the
 * same expected numbers (runtime/tests/front_end_metrics.rs has the Rust one,
 * python/tests/test_metrics_front_ends.py the Python one), a failed put included. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv.h"

static int failures = 0, checks = 0;

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        checks++;                                                                               \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #cond);                             \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

#define OK(call) CHECK((call) == CXLKV_OK)

static int contains(const char *text, const char *line) {
    if (strstr(text, line) == NULL) {
        fprintf(stderr, "missing %s in:\n%s\n", line, text);
        return 0;
    }
    return 1;
}

/* This process's metrics text: asks for its length, then reads it (the caller frees it). */
static char *metrics_text(void) {
    size_t len = 0, len2 = 0;
    CHECK(cxlkv_metrics_text(NULL, 0, &len) == CXLKV_ERR_BUFFER_TOO_SMALL);
    char *text = malloc(len + 1);
    OK(cxlkv_metrics_text(text, len + 1, &len2));
    CHECK(len2 == len && strlen(text) == len);
    return text;
}

/* The figures of one op between two reads. */
static void expect_delta(const char *op, const cxlkv_op_metrics *b, const cxlkv_op_metrics *a,
                         uint64_t ok, uint64_t miss, uint64_t error, uint64_t in, uint64_t out) {
    checks++;
    if (a->ok - b->ok != ok || a->miss - b->miss != miss || a->error - b->error != error ||
        a->bytes_in - b->bytes_in != in || a->bytes_out - b->bytes_out != out) {
        fprintf(stderr,
                "FAIL %s: ok %llu miss %llu error %llu in %llu out %llu, want %llu %llu %llu %llu %llu\n",
                op, (unsigned long long)(a->ok - b->ok), (unsigned long long)(a->miss - b->miss),
                (unsigned long long)(a->error - b->error),
                (unsigned long long)(a->bytes_in - b->bytes_in),
                (unsigned long long)(a->bytes_out - b->bytes_out), (unsigned long long)ok,
                (unsigned long long)miss, (unsigned long long)error, (unsigned long long)in,
                (unsigned long long)out);
        failures++;
    }
}

/* The front-end scenario (runtime/tests/front_end_metrics.rs states it): on a fresh pool of 8 MiB,
 * blocks of 4096 bytes, 2 participants: 3 puts of 100 bytes, a put larger than the pool (fails: an
 * error and no bytes, as through Python and Rust), a put-if-absent of a present key (0 bytes), 2
 * gets that hit, 1 miss, 1 into a 10-byte buffer (fails), a pin, a delete and a delete of an
 * absent key (a miss). */
static void front_end_scenario(void) {
    char spec[64];
    snprintf(spec, sizeof spec, "shm:cxlkv-metrics-fe-%d", (int)getpid());
    cxlkv_pool_config cfg = cxlkv_pool_config_default();
    cfg.block_size = 4096;
    cfg.participants = 2;
    cxlkv_pool *pool = NULL;
    cxlkv_participant *me = NULL;
    OK(cxlkv_pool_create(spec, 8 << 20, &cfg, &pool));
    OK(cxlkv_participant_attach(pool, &me));
    cxlkv_metrics b = CXLKV_STRUCT_INIT(cxlkv_metrics), a = CXLKV_STRUCT_INIT(cxlkv_metrics);
    OK(cxlkv_metrics_read(&b));

    uint8_t payload[100], buf[256], tiny[10];
    for (uint64_t i = 0; i < 3; i++) {
        cxlkv_key k = {i, 7};
        memset(payload, (int)i, sizeof payload);
        OK(cxlkv_participant_put(me, &k, payload, sizeof payload));
    }
    size_t huge_len = (8u << 20) + 1;
    uint8_t *huge = calloc(huge_len, 1);
    cxlkv_key k0 = {0, 7}, k1 = {1, 7}, k2 = {2, 7}, k9 = {9, 7}, none = {99, 99};
    CHECK(cxlkv_participant_put(me, &k9, huge, huge_len) == CXLKV_ERR_PAYLOAD_TOO_LARGE);
    free(huge);
    int stored = -1;
    OK(cxlkv_participant_put_if_absent(me, &k1, payload, sizeof payload, &stored));
    CHECK(stored == 0);
    size_t len = 0;
    OK(cxlkv_participant_get(me, &k0, buf, sizeof buf, &len));
    OK(cxlkv_participant_get(me, &k1, buf, sizeof buf, &len));
    CHECK(cxlkv_participant_get(me, &none, buf, sizeof buf, &len) == CXLKV_ERR_NOT_FOUND);
    CHECK(cxlkv_participant_get(me, &k2, tiny, sizeof tiny, &len) == CXLKV_ERR_BUFFER_TOO_SMALL);
    cxlkv_pinned *pin = NULL;
    const uint8_t *data = NULL;
    OK(cxlkv_participant_pin(me, &k2, &pin, &data, &len));
    OK(cxlkv_pinned_release(pin));
    OK(cxlkv_participant_delete(me, &k0));
    CHECK(cxlkv_participant_delete(me, &none) == CXLKV_ERR_NOT_FOUND);

    OK(cxlkv_metrics_read(&a));
    expect_delta("put", &b.put, &a.put, 4, 0, 1, 300, 0);
    expect_delta("get", &b.get, &a.get, 2, 1, 1, 0, 200);
    expect_delta("pin", &b.pin, &a.pin, 1, 0, 0, 0, 100);
    expect_delta("delete", &b.del, &a.del, 1, 1, 0, 0, 0);
    OK(cxlkv_participant_detach(me));
    OK(cxlkv_pool_close(pool));
    OK(cxlkv_pool_unlink(spec));
}

int main(void) {
    char spec[64];
    snprintf(spec, sizeof spec, "shm:cxlkv-metrics-%d", (int)getpid());
    cxlkv_pool_config cfg = cxlkv_pool_config_default();
    cfg.block_size = 4096;
    cfg.participants = 2;
    cxlkv_pool *pool = NULL;
    cxlkv_participant *me = NULL;
    OK(cxlkv_pool_create(spec, 8 << 20, &cfg, &pool));
    OK(cxlkv_participant_attach(pool, &me));

    cxlkv_metrics m = CXLKV_STRUCT_INIT(cxlkv_metrics);
    OK(cxlkv_metrics_read(&m));
    CHECK(m.struct_size == sizeof m);
    CHECK(m.put.ok == 0 && m.get.ok == 0 && m.get.miss == 0);

    uint8_t payload[100], buf[256];
    size_t len = 0;
    for (uint64_t i = 0; i < 3; i++) {
        cxlkv_key k = {i, 7};
        memset(payload, (int)i, sizeof payload);
        OK(cxlkv_participant_put(me, &k, payload, sizeof payload));
    }
    cxlkv_key k0 = {0, 7}, k1 = {1, 7}, k2 = {2, 7}, none = {9, 9};
    OK(cxlkv_participant_get(me, &k0, buf, sizeof buf, &len));
    OK(cxlkv_participant_get(me, &k1, buf, sizeof buf, &len));
    CHECK(cxlkv_participant_get(me, &none, buf, sizeof buf, &len) == CXLKV_ERR_NOT_FOUND);
    cxlkv_pinned *pin = NULL;
    const uint8_t *data = NULL;
    OK(cxlkv_participant_pin(me, &k2, &pin, &data, &len));
    OK(cxlkv_pinned_release(pin));
    OK(cxlkv_participant_delete(me, &k0));

    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    OK(cxlkv_metrics_read(&m));
    CHECK(m.put.ok == 3 && m.put.error == 0 && m.put.bytes_in == 300);
    CHECK(m.get.ok == 2 && m.get.miss == 1 && m.get.bytes_out == 200);
    CHECK(m.pin.ok == 1 && m.pin.bytes_out == 100);
    CHECK(m.del.ok == 1);
    CHECK(m.put.latency_ns > 0 && m.get.latency_ns > 0);
    CHECK(m.score_topk.ok == 0 && m.attend.ok == 0 && m.device_fallbacks == 0);

    /* A caller that knows only the size field and the put figures gets exactly those. */
    uint8_t small[8 + sizeof(cxlkv_op_metrics) + 8];
    memset(small, 0xee, sizeof small);
    uint32_t want = 8 + sizeof(cxlkv_op_metrics);
    memcpy(small, &want, 4);
    OK(cxlkv_metrics_read((cxlkv_metrics *)small));
    uint32_t got;
    memcpy(&got, small, 4);
    CHECK(got == want);
    cxlkv_op_metrics put;
    memcpy(&put, small + 8, sizeof put);
    CHECK(put.ok == 3 && put.bytes_in == 300);
    CHECK(small[want] == 0xee); /* nothing past `struct_size` */

    /* The text: ask for the length, then read it. */
    char *text = metrics_text();
    size_t tlen = 0, tlen2 = 0;
    CHECK(contains(text, "# TYPE cxlkv_ops counter"));
    CHECK(contains(text, "cxlkv_ops_total{op=\"put\",result=\"ok\"} 3\n"));
    CHECK(contains(text, "cxlkv_ops_total{op=\"get\",result=\"miss\"} 1\n"));
    CHECK(contains(text, "cxlkv_op_in_bytes_total{op=\"put\"} 300\n"));
    CHECK(contains(text, "cxlkv_op_out_bytes_total{op=\"get\"} 200\n"));
    CHECK(contains(text, "# TYPE cxlkv_op_latency_seconds histogram"));
    CHECK(contains(text, "cxlkv_op_latency_seconds_count{op=\"get\"} 3\n"));
    CHECK(contains(text, "# EOF"));
    free(text);

    /* The participant's slot counters, through a second handle on the pool. */
    cxlkv_pool *other = NULL;
    OK(cxlkv_pool_open(spec, &other));
    uint32_t id = 0;
    OK(cxlkv_participant_id(me, &id, NULL));
    cxlkv_participant_counters pc;
    memset(&pc, 0, sizeof pc);
    pc.struct_size = sizeof pc;
    OK(cxlkv_pool_participant_counters(other, id, &pc));
    CHECK(pc.struct_size == sizeof pc);
    CHECK(pc.puts == 3 && pc.bytes_in == 300 && pc.hits == 2 && pc.misses == 1);
    CHECK(pc.bytes_out == 200 && pc.pins == 1 && pc.deletes == 1 && pc.fallbacks == 0);
    CHECK(pc.pin_full == 0);
    memset(&pc, 0, sizeof pc);
    pc.struct_size = sizeof pc;
    CHECK(cxlkv_pool_participant_counters(other, id + 1, &pc) == CXLKV_ERR_NOT_FOUND);
    tlen = 0;
    CHECK(cxlkv_pool_metrics_text(other, NULL, 0, &tlen) == CXLKV_ERR_BUFFER_TOO_SMALL);
    text = malloc(tlen + 1);
    OK(cxlkv_pool_metrics_text(other, text, tlen + 1, &tlen2));
    char line[160];
    snprintf(line, sizeof line, "cxlkv_pool_participant_bytes_in_total{participant=\"%u\",pid=\"%d\"} 300\n",
             id, (int)getpid());
    CHECK(contains(text, line));
    snprintf(line, sizeof line, "cxlkv_pool_participant_bytes_out_total{participant=\"%u\",pid=\"%d\"} 200\n",
             id, (int)getpid());
    CHECK(contains(text, line));
    CHECK(contains(text, "cxlkv_ops_total{op=\"put\",result=\"ok\"} 3\n"));
    free(text);
    OK(cxlkv_pool_close(other));

    /* Device commands on one typed block (sequence 5, 4 tokens, 2 query heads of dim 16, f32). */
    enum { DIM = 16, TOK = 4, G = 2 };
    float kv[TOK * DIM], q[G * DIM];
    for (int i = 0; i < TOK * DIM; i++) kv[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < G * DIM; i++) q[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
    cxlkv_kv_shape shape = {.struct_size = sizeof shape, .dtype = CXLKV_DTYPE_F32, .layer = 0,
                            .kv_heads = 1, .head_dim = DIM, .tokens = TOK, .sequence = 5};
    cxlkv_key kvkey = {50, 50};
    OK(cxlkv_participant_put_kv(me, &kvkey, &shape, (uint8_t *)kv, sizeof kv, (uint8_t *)kv, sizeof kv));
    cxlkv_device *dev = NULL;
    OK(cxlkv_device_open(me, 0, &dev));
    cxlkv_block_ref bref = {kvkey, 0};
    cxlkv_score_request sr = {.struct_size = sizeof sr, .group = 1, .queries = q, .dim = DIM,
                              .blocks = &bref, .nblocks = 1, .sequence = 5,
                              .dtype = CXLKV_DTYPE_F32, .k = 2};
    uint32_t idx[2];
    float sc[2];
    size_t per = 0;
    uint64_t tk = 0;
    int done = 0;
    /* SCORE_TOPK: one call, one ticket, one ticket that fails (a block of another sequence). */
    OK(cxlkv_device_score_topk(dev, &sr, idx, sc, 2, NULL, 0, &per, NULL));
    OK(cxlkv_device_submit_score_topk(dev, &sr, idx, sc, 2, NULL, 0, &per, &tk));
    OK(cxlkv_device_wait(dev, tk, CXLKV_WAIT_FOREVER, &done, NULL));
    CHECK(done == 1 && per == 2);
    sr.sequence = 6;
    OK(cxlkv_device_submit_score_topk(dev, &sr, idx, sc, 2, NULL, 0, &per, &tk));
    CHECK(cxlkv_device_wait(dev, tk, CXLKV_WAIT_FOREVER, &done, NULL) == CXLKV_ERR_INVALID_ARG);
    /* ATTEND: one ticket polled until done, one waited, one that fails. */
    float out[G * DIM], mx[G], sm[G];
    cxlkv_attend_request ar = {.struct_size = sizeof ar, .group = G, .queries = q, .dim = DIM,
                               .blocks = &bref, .nblocks = 1, .sequence = 5,
                               .dtype = CXLKV_DTYPE_F32};
    OK(cxlkv_device_submit_attend(dev, &ar, out, G * DIM, mx, sm, &tk));
    done = 0;
    for (int i = 0; i < 100000 && !done; i++) OK(cxlkv_device_poll(dev, tk, &done, NULL));
    CHECK(done == 1 && sm[0] >= 1.0f && sm[1] >= 1.0f);
    OK(cxlkv_device_submit_attend(dev, &ar, out, G * DIM, mx, sm, &tk));
    OK(cxlkv_device_wait(dev, tk, CXLKV_WAIT_FOREVER, &done, NULL));
    CHECK(done == 1);
    ar.sequence = 6;
    OK(cxlkv_device_submit_attend(dev, &ar, out, G * DIM, mx, sm, &tk));
    CHECK(cxlkv_device_wait(dev, tk, CXLKV_WAIT_FOREVER, &done, NULL) == CXLKV_ERR_INVALID_ARG);
    /* Refused before a ticket is filed (bad arguments): not a command, not counted. */
    ar.sequence = 5;
    ar.nblocks = 0;
    CHECK(cxlkv_device_submit_attend(dev, &ar, out, G * DIM, mx, sm, &tk) == CXLKV_ERR_INVALID_ARG);
    OK(cxlkv_device_close(dev));

    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    OK(cxlkv_metrics_read(&m));
    CHECK(m.score_topk.ok == 2 && m.score_topk.error == 1);
    CHECK(m.score_topk.bytes_in == 2 * 4 * DIM && m.score_topk.bytes_out == 2 * 2 * 8);
    CHECK(m.attend.ok == 2 && m.attend.error == 1 && m.attend.miss == 0);
    CHECK(m.attend.bytes_in == 2 * 4 * G * DIM);
    CHECK(m.attend.bytes_out == 2 * 4 * G * (DIM + 2)); /* out, max and sum per query */
    CHECK(m.attend.latency_ns > 0);
    CHECK(m.device_fallbacks == 4); /* every command that succeeded, on the host */
    CHECK(m.host_link_bytes > 0 && m.device_link_bytes == 0);

    /* A caller built before `attend` was appended (320 bytes) gets exactly its layout. */
    uint8_t older[sizeof(cxlkv_metrics)];
    memset(older, 0xee, sizeof older);
    uint32_t first = (uint32_t)offsetof(cxlkv_metrics, attend);
    CHECK(first == 320);
    memcpy(older, &first, 4);
    OK(cxlkv_metrics_read((cxlkv_metrics *)older));
    memcpy(&got, older, 4);
    CHECK(got == first);
    cxlkv_op_metrics topk_old;
    memcpy(&topk_old, older + offsetof(cxlkv_metrics, score_topk), sizeof topk_old);
    CHECK(topk_old.ok == 2 && topk_old.error == 1);
    CHECK(older[first] == 0xee && older[sizeof older - 1] == 0xee);

    text = metrics_text();
    CHECK(contains(text, "cxlkv_ops_total{op=\"attend\",result=\"ok\"} 2\n"));
    CHECK(contains(text, "cxlkv_ops_total{op=\"attend\",result=\"error\"} 1\n"));
    CHECK(contains(text, "cxlkv_op_in_bytes_total{op=\"attend\"} 256\n"));
    CHECK(contains(text, "cxlkv_op_out_bytes_total{op=\"attend\"} 288\n"));
    CHECK(contains(text, "cxlkv_op_latency_seconds_count{op=\"attend\"} 3\n"));
    CHECK(contains(text, "cxlkv_ops_total{op=\"score_topk\",result=\"ok\"} 2\n"));
    CHECK(contains(text, "cxlkv_ops_total{op=\"score_topk\",result=\"error\"} 1\n"));
    free(text);

    /* Parity on purpose: the synchronous ATTEND answers what a ticket answers, and a SCORE_TOPK
     * with a selection (token 0 forced) answers the same on the device path and the host's;
     * each call counts once under its op. */
    OK(cxlkv_device_open(me, 0, &dev));
    cxlkv_metrics pb = CXLKV_STRUCT_INIT(cxlkv_metrics), pa = CXLKV_STRUCT_INIT(cxlkv_metrics);
    OK(cxlkv_metrics_read(&pb));
    float out2[G * DIM], mx2[G], sm2[G];
    ar.nblocks = 1;
    OK(cxlkv_device_submit_attend(dev, &ar, out, G * DIM, mx, sm, &tk));
    OK(cxlkv_device_wait(dev, tk, CXLKV_WAIT_FOREVER, &done, NULL));
    OK(cxlkv_device_attend(dev, &ar, out2, G * DIM, mx2, sm2, NULL));
    CHECK(memcmp(out, out2, sizeof out) == 0 && memcmp(mx, mx2, sizeof mx) == 0);
    CHECK(memcmp(sm, sm2, sizeof sm) == 0);
    cxlkv_select sel = CXLKV_STRUCT_INIT(cxlkv_select);
    sel.sinks = 1;
    sr.sequence = 5;
    uint32_t cnt[1], cnt2[1], idx2[2];
    float lom[1], lom2[1], sc2[2];
    OK(cxlkv_device_score_select(dev, &sr, &sel, idx, sc, 2, cnt, lom, 1, NULL, 0, NULL));
    sr.flags = CXLKV_SCORE_HOST;
    OK(cxlkv_device_score_select(dev, &sr, &sel, idx2, sc2, 2, cnt2, lom2, 1, NULL, 0, NULL));
    sr.flags = 0;
    CHECK(cnt[0] == 2 && cnt2[0] == 2 && (idx[0] == 0 || idx[1] == 0));
    CHECK(memcmp(idx, idx2, sizeof idx) == 0 && memcmp(sc, sc2, sizeof sc) == 0);
    CHECK(lom[0] == lom2[0] && lom[0] >= 0.0f && lom[0] < 1.0f);
    OK(cxlkv_metrics_read(&pa));
    expect_delta("attend", &pb.attend, &pa.attend, 2, 0, 0, 2 * 4 * G * DIM, 2 * 4 * G * (DIM + 2));
    expect_delta("score_topk", &pb.score_topk, &pa.score_topk, 2, 0, 0, 2 * 4 * DIM, 2 * 2 * 8);
    OK(cxlkv_device_close(dev));

    OK(cxlkv_participant_detach(me));
    OK(cxlkv_pool_close(pool));
    OK(cxlkv_pool_unlink(spec));
    front_end_scenario();
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
