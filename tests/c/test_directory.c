/* test_directory.c -- the driver's page directory (csrc/directory.c): peer
 * numbers, holders, redirect choice, and the reuse of a lost peer's number.
 *
 * In one process, no network: the test registers peers and records holders
 * the way the page-server thread does, and checks what cl_dir_choose
 * answers.  Exits non-zero if any check fails.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "internal.h"

#include "check.h"

#define BASE ((uintptr_t)0x320000000000ULL)

static int reg(const char *id, const char *ep) { return cl_dir_register(id, strlen(id), ep, strlen(ep)); }

static int choose(uint64_t page, const char **ep) { return cl_dir_choose(page, 1, 1, -1, ep); }

int main(void) {
    CHECK(clamor_region_init(BASE, (size_t)16 << 20, 4096) == 0);
    clamor_set_replication(1); /* random */
    CHECK(clamor_version_begin(1) == 0);

    char id[32], ep[64];
    for (int i = 0; i < 64; i++) {
        snprintf(id, sizeof id, "w%d", i);
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", 20000 + i);
        CHECK(reg(id, ep) == 0);
        CHECK(cl_dir_peer_of(id, strlen(id)) == i);
    }
    CHECK(reg("w64", "tcp://127.0.0.1:20064") == ENOSPC); /* 64 numbers, all taken */
    CHECK(reg("w5", "tcp://127.0.0.1:20005") == 0);       /* registering again keeps the number */
    CHECK(cl_dir_peer_of("w5", 2) == 5);

    const char *got = NULL;
    CHECK(choose(10, &got) == -1); /* no holder yet */
    cl_dir_served(10, 1, 1, 3);
    CHECK(choose(10, &got) == 3 && got && strcmp(got, "tcp://127.0.0.1:20003") == 0);

    /* w3 is lost; a request of it the server was answering meanwhile records
     * it as a holder after it was forgotten */
    CHECK(clamor_replication_forget("tcp://127.0.0.1:20003") == 0);
    CHECK(choose(10, &got) == -1);
    CHECK(cl_dir_peer_of("w3", 2) == -1);
    cl_dir_served(11, 1, 1, 3);

    /* a replacement takes the free number; the late bit must not name it */
    CHECK(reg("w64", "tcp://127.0.0.1:20064") == 0);
    CHECK(cl_dir_peer_of("w64", 3) == 3);
    CHECK(choose(11, &got) == -1);
    cl_dir_served(12, 1, 1, 3);
    CHECK(choose(12, &got) == 3 && got && strcmp(got, "tcp://127.0.0.1:20064") == 0);
    CHECK(reg("w65", "tcp://127.0.0.1:20065") == ENOSPC); /* none free again */

    /* losing many in turn never runs out */
    for (int i = 0; i < 200; i++) {
        int slot = i % 64;
        char old[64];
        snprintf(old, sizeof old, "tcp://127.0.0.1:%d", slot == 3 ? 20064 : 20000 + slot);
        if (i >= 64) snprintf(old, sizeof old, "tcp://10.0.0.1:%d", i - 64);
        CHECK(clamor_replication_forget(old) == 0);
        snprintf(id, sizeof id, "r%d", i);
        snprintf(ep, sizeof ep, "tcp://10.0.0.1:%d", i);
        CHECK(reg(id, ep) == 0);
        CHECK(cl_dir_peer_of(id, strlen(id)) == slot);
    }
    clamor_replication_reset();
    CHECK(clamor_region_close() == 0);
    return CHECK_SUMMARY("test_directory");
}
