/* metrics.c: the process's metrics through the C ABI follow known operations. In a fresh
 * process: 3 puts of 100 bytes, 2 gets that hit and 1 that misses, 1 pin and 1 delete must read
 * back as exactly those counts and bytes from cxlkv_metrics_read, and as the same numbers in the
 * Prometheus text of cxlkv_metrics_text. A short `size` field gets only that many bytes. The
 * counters the participant publishes in its pool slot read the same through a second pool handle
 * (cxlkv_pool_participant_counters, cxlkv_pool_metrics_text). */
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
    CHECK(m.score_topk.ok == 0 && m.device_fallbacks == 0);

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
    size_t tlen = 0;
    CHECK(cxlkv_metrics_text(NULL, 0, &tlen) == CXLKV_ERR_BUFFER_TOO_SMALL);
    char *text = malloc(tlen + 1);
    size_t tlen2 = 0;
    OK(cxlkv_metrics_text(text, tlen + 1, &tlen2));
    CHECK(tlen2 == tlen && strlen(text) == tlen);
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

    OK(cxlkv_participant_detach(me));
    OK(cxlkv_pool_close(pool));
    OK(cxlkv_pool_unlink(spec));
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures != 0;
}
