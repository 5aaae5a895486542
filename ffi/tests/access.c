/* access.c: the permissions of the file a pool creates, from cxlkv_pool_config's mode, owner,
 * group and access_flags (docs/SECURITY.md, "Pool permissions"), checked with stat(): the default
 * is 0600; an explicit mode is applied as given, whatever the umask; an older caller's 24-byte
 * config (before the fields existed) gets the default; a bad mode or flag is refused and leaves
 * no file. Exit status 0 when all checks pass. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
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

/* Creates a 4 MiB pool at `path` with `cfg`, returns the result; closes it on success. */
static cxlkv_result create(const char *path, const cxlkv_pool_config *cfg) {
    char spec[300];
    snprintf(spec, sizeof spec, "file:%s", path);
    cxlkv_pool *pool = NULL;
    cxlkv_result r = cxlkv_pool_create(spec, 4 << 20, cfg, &pool);
    if (r == CXLKV_OK) cxlkv_pool_close(pool);
    return r;
}

/* The permission bits of `path`, or -1 if it does not exist. */
static int mode_of(const char *path, struct stat *st) {
    if (stat(path, st) != 0) return -1;
    return (int)(st->st_mode & 07777);
}

int main(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/cxlkv-access-%d.pool", (int)getpid());
    struct stat st;
    cxlkv_pool_config cfg = cxlkv_pool_config_default();
    cfg.block_size = 4096;
    cfg.participants = 2;

    /* The default: owner only. */
    CHECK(create(path, &cfg) == CXLKV_OK, "create with the default config");
    CHECK(mode_of(path, &st) == 0600, "default mode is %o, not 0600", mode_of(path, &st));
    CHECK(st.st_uid == geteuid() && st.st_gid == getegid(), "default owner %u:%u", st.st_uid, st.st_gid);
    unlink(path);

    /* An explicit mode, under a umask that would strip its group bits. */
    mode_t old_umask = umask(077);
    cfg.mode = 0640;
    CHECK(create(path, &cfg) == CXLKV_OK, "create with mode 0640");
    CHECK(mode_of(path, &st) == 0640, "mode is %o, not 0640", mode_of(path, &st));
    unlink(path);
    cfg.mode = 0660;
    cfg.group = (uint32_t)getegid();
    cfg.access_flags = CXLKV_ACCESS_GROUP;
    CHECK(create(path, &cfg) == CXLKV_OK, "create with mode 0660 and our own group");
    CHECK(mode_of(path, &st) == 0660 && st.st_gid == getegid(), "mode %o gid %u", mode_of(path, &st), st.st_gid);
    unlink(path);
    umask(old_umask);

    /* An older caller's config (24 bytes: no mode, owner, group or flags), with garbage past it
     * that the library must not read: the default mode. */
    uint8_t old[sizeof(cxlkv_pool_config)];
    memset(old, 0xff, sizeof old);
    cxlkv_pool_config small = cxlkv_pool_config_default();
    small.struct_size = 24;
    small.block_size = 4096;
    small.participants = 2;
    memcpy(old, &small, 24);
    CHECK(create(path, (const cxlkv_pool_config *)(const void *)old) == CXLKV_OK, "create with a 24-byte config");
    CHECK(mode_of(path, &st) == 0600, "24-byte config: mode %o, not 0600", mode_of(path, &st));
    unlink(path);

    /* Refused: set-id and sticky bits, unknown flags; no file is left behind. */
    cfg = cxlkv_pool_config_default();
    cfg.block_size = 4096;
    cfg.participants = 2;
    cfg.mode = 04600;
    CHECK(create(path, &cfg) == CXLKV_ERR_INVALID_ARG, "mode 04600 accepted");
    CHECK(mode_of(path, &st) == -1 && errno == ENOENT, "mode 04600 left a file");
    cfg.mode = 0600;
    cfg.access_flags = 4;
    CHECK(create(path, &cfg) == CXLKV_ERR_INVALID_ARG, "access_flags 4 accepted");
    CHECK(mode_of(path, &st) == -1, "access_flags 4 left a file");
    /* Giving the file to another user takes root: refused for an ordinary user, file removed. */
    if (geteuid() != 0) {
        cfg.access_flags = CXLKV_ACCESS_OWNER;
        cfg.owner = 0;
        CHECK(create(path, &cfg) != CXLKV_OK, "an ordinary user gave a pool to root");
        CHECK(mode_of(path, &st) == -1, "a refused owner left a file");
    }
    unlink(path);

    printf("access: %d passed, %d failed\n", checks - failures, failures);
    return failures == 0 ? 0 : 1;
}
