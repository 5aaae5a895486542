/* tenants.c: tenants inside one pool through the C ABI (format 3.2; docs/C-ABI.md, "Tenants").
 * Tenant bob neither reads, pins nor finds tenant alice's blocks (with his own salted chain for
 * her tokens, or with her keys), alice reads them all; salted keys depend on the salt; bob's puts
 * past his quota evict his own, and with all of his pinned are refused (CXLKV_ERR_FULL). Exit
 * status 0 when all checks pass. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv.h"

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                  \
    do {                                                  \
        checks++;                                         \
        if (!(cond)) {                                    \
            fprintf(stderr, "FAIL line %d: ", __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                 \
            fprintf(stderr, "\n");                        \
            failures++;                                   \
        }                                                 \
    } while (0)

#define N_TOKENS 64
#define CHUNK 16
#define N_KEYS (N_TOKENS / CHUNK)

static const uint8_t ALICE_SALT[] = "alice's secret";
static const uint8_t BOB_SALT[] = "bob's secret";

static void chain(const uint8_t *salt, size_t salt_len, cxlkv_key *keys) {
    uint32_t tokens[N_TOKENS];
    for (uint32_t i = 0; i < N_TOKENS; i++) tokens[i] = i * 3 + 1;
    size_t n = 0;
    cxlkv_result r = cxlkv_key_chain_salted(salt, salt_len, "engine", "model", 0, 31, tokens,
                                            N_TOKENS, CHUNK, keys, N_KEYS, &n);
    CHECK(r == CXLKV_OK && n == N_KEYS, "salted chain: %d, %zu keys", (int)r, n);
}

int main(void) {
    char spec[64];
    snprintf(spec, sizeof spec, "shm:cxlkv-ctenants-%d", (int)getpid());
    cxlkv_pool_config cfg = cxlkv_pool_config_default();
    cfg.block_size = 4096;
    cfg.participants = 4;
    cxlkv_pool *pool = NULL;
    CHECK(cxlkv_pool_create(spec, 8 << 20, &cfg, &pool) == CXLKV_OK, "create");
    if (!pool) return 1;
    uint32_t alice_id = 0, bob_id = 0;
    CHECK(cxlkv_pool_tenant_declare(pool, "alice", 0, &alice_id) == CXLKV_OK && alice_id == 1,
          "declare alice: id %u", alice_id);
    CHECK(cxlkv_pool_tenant_declare(pool, "bob", 3, &bob_id) == CXLKV_OK && bob_id == 2,
          "declare bob: id %u", bob_id);
    CHECK(cxlkv_pool_tenant_declare(pool, "", 0, &bob_id) == CXLKV_ERR_INVALID_ARG, "empty name");
    CHECK(cxlkv_pool_tenant_set_quota(pool, "carol", 1) == CXLKV_ERR_INVALID_ARG,
          "quota of an undeclared tenant");

    /* Salted keys: the salt decides them; the unsalted key differs. */
    cxlkv_key a1, a2, b1, plain;
    CHECK(cxlkv_key_from_bytes_salted(ALICE_SALT, sizeof ALICE_SALT, (const uint8_t *)"x", 1, &a1) == CXLKV_OK, "salted key");
    cxlkv_key_from_bytes_salted(ALICE_SALT, sizeof ALICE_SALT, (const uint8_t *)"x", 1, &a2);
    cxlkv_key_from_bytes_salted(BOB_SALT, sizeof BOB_SALT, (const uint8_t *)"x", 1, &b1);
    cxlkv_key_from_bytes((const uint8_t *)"x", 1, &plain);
    CHECK(memcmp(&a1, &a2, sizeof a1) == 0, "same salt, same key");
    CHECK(memcmp(&a1, &b1, sizeof a1) != 0 && memcmp(&a1, &plain, sizeof a1) != 0,
          "another salt or none: another key");

    cxlkv_participant *alice = NULL, *bob = NULL;
    CHECK(cxlkv_participant_attach_tenant(pool, "alice", ALICE_SALT, sizeof ALICE_SALT, &alice) == CXLKV_OK, "attach alice");
    CHECK(cxlkv_participant_attach_tenant(pool, "bob", BOB_SALT, sizeof BOB_SALT, &bob) == CXLKV_OK, "attach bob");
    if (!alice || !bob) return 1;
    uint32_t t = 0;
    CHECK(cxlkv_participant_tenant(bob, &t) == CXLKV_OK && t == 2, "bob's tenant id %u", t);
    cxlkv_participant *bad = NULL;
    CHECK(cxlkv_participant_attach_tenant(pool, NULL, BOB_SALT, 1, &bad) == CXLKV_ERR_NULL, "NULL name");

    cxlkv_key akeys[N_KEYS], bkeys[N_KEYS];
    chain(ALICE_SALT, sizeof ALICE_SALT, akeys);
    chain(BOB_SALT, sizeof BOB_SALT, bkeys);
    uint8_t payload[1000], buf[1000];
    for (int i = 0; i < N_KEYS; i++) {
        memset(payload, 'a' + i, sizeof payload);
        CHECK(cxlkv_participant_put(alice, &akeys[i], payload, sizeof payload) == CXLKV_OK, "alice put %d", i);
    }
    size_t found = 99, len = 0;
    CHECK(cxlkv_participant_lookup_prefix(alice, akeys, N_KEYS, &found) == CXLKV_OK && found == N_KEYS,
          "alice finds her prefix: %zu", found);
    CHECK(cxlkv_participant_lookup_prefix(bob, akeys, N_KEYS, &found) == CXLKV_OK && found == 0,
          "bob finds none of alice's keys: %zu", found);
    CHECK(cxlkv_participant_lookup_prefix(bob, bkeys, N_KEYS, &found) == CXLKV_OK && found == 0,
          "bob's chain for the same tokens: %zu", found);
    CHECK(cxlkv_pool_lookup_prefix(pool, akeys, N_KEYS, &found) == CXLKV_OK && found == 0,
          "a tenant-less pool handle finds none: %zu", found);
    for (int i = 0; i < N_KEYS; i++) {
        CHECK(cxlkv_participant_get(bob, &akeys[i], buf, sizeof buf, &len) == CXLKV_ERR_NOT_FOUND, "bob reads alice's %d", i);
        cxlkv_pinned *pin = NULL;
        const uint8_t *data = NULL;
        CHECK(cxlkv_participant_pin(bob, &akeys[i], &pin, &data, &len) == CXLKV_ERR_NOT_FOUND, "bob pins alice's %d", i);
        CHECK(cxlkv_participant_get(alice, &akeys[i], buf, sizeof buf, &len) == CXLKV_OK && len == sizeof buf && buf[0] == 'a' + i && buf[999] == 'a' + i,
              "alice reads her block %d", i);
    }

    /* Bob's quota is 3 blocks: 8 puts evict his own; with his 3 pinned, the next is refused. */
    cxlkv_key k;
    for (int i = 0; i < 8; i++) {
        cxlkv_key_from_bytes_salted(BOB_SALT, sizeof BOB_SALT, (const uint8_t *)&i, sizeof i, &k);
        CHECK(cxlkv_participant_put(bob, &k, payload, 100) == CXLKV_OK, "bob put %d", i);
    }
    cxlkv_stats st = {.struct_size = sizeof st};
    CHECK(cxlkv_participant_stats(bob, &st) == CXLKV_OK && st.evictions == 5, "bob evicted %llu of his own", (unsigned long long)st.evictions);
    cxlkv_pinned *pins[3] = {0};
    for (int i = 5; i < 8; i++) {
        const uint8_t *data = NULL;
        cxlkv_key_from_bytes_salted(BOB_SALT, sizeof BOB_SALT, (const uint8_t *)&i, sizeof i, &k);
        CHECK(cxlkv_participant_pin(bob, &k, &pins[i - 5], &data, &len) == CXLKV_OK, "bob pins his %d", i);
    }
    int i = 100;
    cxlkv_key_from_bytes_salted(BOB_SALT, sizeof BOB_SALT, (const uint8_t *)&i, sizeof i, &k);
    CHECK(cxlkv_participant_put(bob, &k, payload, 100) == CXLKV_ERR_FULL, "bob over quota, all pinned");
    char msg[256];
    cxlkv_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "quota of 3 blocks") != NULL, "message: %s", msg);
    for (int j = 0; j < 3; j++) cxlkv_pinned_release(pins[j]);
    CHECK(cxlkv_participant_put(bob, &k, payload, 100) == CXLKV_OK, "bob puts again once unpinned");
    for (int j = 0; j < N_KEYS; j++) {
        CHECK(cxlkv_participant_get(alice, &akeys[j], buf, sizeof buf, &len) == CXLKV_OK && buf[0] == 'a' + j,
              "alice's block %d survived bob's puts", j);
    }

    cxlkv_participant_detach(alice);
    cxlkv_participant_detach(bob);
    cxlkv_pool_close(pool);
    cxlkv_pool_unlink(spec);
    printf("tenants: %d checks, %d passed, %d failed\n", checks, checks - failures, failures);
    return failures != 0;
}
