/* test_wire.c -- unit tests of the data-plane wire format (csrc/wire.c).
 *
 * Pure: no region, no sockets.  Checks the byte layout documented in wire.h,
 * the round trip of every message type, every decode error, the geometry
 * payload, and that random bytes never crash the decoder and always get one
 * of the documented answers.  Exits non-zero if any check fails.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#include "check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }
static void set32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static bool same_hdr(const struct cl_wire_hdr *a, const struct cl_wire_hdr *b) {
    return a->type == b->type && a->flags == b->flags && a->status == b->status && a->version == b->version &&
           a->index == b->index && a->count == b->count && a->tag == b->tag;
}

/* A valid GET header in buf. */
static void valid_get(uint8_t *buf) {
    struct cl_wire_hdr h = {.type = CL_WIRE_GET, .version = 3, .index = 42, .count = 1, .tag = 0xabcd1234};
    cl_wire_encode(&h, buf);
}

/* ---- layout and round trips ---------------------------------------------- */

static void test_layout(void) {
    struct cl_wire_hdr h = {.type = CL_WIRE_PAGES, .status = 0x11223344, .version = 0x55667788,
                            .index = 0x0102030405060708ull, .count = 0x100, .tag = 0xdeadbeef};
    uint8_t b[CL_WIRE_HDR];
    memset(b, 0xee, sizeof b);
    cl_wire_encode(&h, b);
    CHECK(memcmp(b, "CLMR", 4) == 0);
    CHECK(le32(b) == CL_WIRE_MAGIC);
    CHECK(b[4] == CL_WIRE_VERSION);
    CHECK(b[5] == CL_WIRE_PAGES);
    CHECK(b[6] == 0 && b[7] == 0);
    CHECK(le32(b + 8) == 0x11223344);
    CHECK(le32(b + 12) == 0x55667788);
    CHECK(le64(b + 16) == 0x0102030405060708ull);
    CHECK(b[16] == 0x08 && b[23] == 0x01); /* little-endian on every host */
    CHECK(le32(b + 24) == 0x100);
    CHECK(le32(b + 28) == 0xdeadbeef);
}

static void roundtrip(const struct cl_wire_hdr *in) {
    uint8_t b[CL_WIRE_HDR];
    struct cl_wire_hdr out;
    cl_wire_encode(in, b);
    int rc = cl_wire_decode(b, sizeof b, &out);
    CHECK(rc == 0);
    CHECK(out.proto == CL_WIRE_VERSION);
    CHECK(same_hdr(in, &out));
    if (rc || !same_hdr(in, &out))
        fprintf(stderr, "  round trip of type %u count %u failed (rc %d)\n", in->type, in->count, rc);
}

static void test_roundtrip(void) {
    static const uint32_t counts[] = {1, 2, 17, CL_WIRE_MAX_COUNT - 1, CL_WIRE_MAX_COUNT};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        struct cl_wire_hdr g = {.type = CL_WIRE_GET, .version = (uint32_t)i, .index = (uint64_t)1 << (8 * i),
                                .count = counts[i], .tag = (uint32_t)(i * 0x01010101u)};
        roundtrip(&g);
        struct cl_wire_hdr p = g;
        p.type = CL_WIRE_PAGES;
        roundtrip(&p);
    }
    /* extreme field values */
    struct cl_wire_hdr big = {.type = CL_WIRE_GET, .status = UINT32_MAX, .version = UINT32_MAX,
                              .index = UINT64_MAX, .count = CL_WIRE_MAX_COUNT, .tag = UINT32_MAX};
    roundtrip(&big);
    /* ERROR, HELLO and HELLO_REPLY have no page range: any count is fine */
    struct cl_wire_hdr e = {.type = CL_WIRE_ERROR, .status = ENOENT, .index = 9, .count = 0, .tag = 77};
    roundtrip(&e);
    e.count = CL_WIRE_MAX_COUNT + 1;
    e.status = EAGAIN;
    roundtrip(&e);
    struct cl_wire_hdr hello = {.type = CL_WIRE_HELLO, .tag = 7};
    roundtrip(&hello);
    struct cl_wire_hdr hr = {.type = CL_WIRE_HELLO_REPLY, .tag = 7, .count = 0};
    roundtrip(&hr);
    /* encode ignores a version field in the struct: it always writes its own */
    struct cl_wire_hdr v = {.proto = 99, .type = CL_WIRE_GET, .count = 1};
    uint8_t b[CL_WIRE_HDR];
    cl_wire_encode(&v, b);
    CHECK(b[4] == CL_WIRE_VERSION);
}

/* ---- decode errors -------------------------------------------------------- */

static void test_lengths(void) {
    uint8_t b[CL_WIRE_HDR + 8];
    struct cl_wire_hdr h;
    valid_get(b);
    memset(b + CL_WIRE_HDR, 0, 8);
    CHECK(cl_wire_decode(b, CL_WIRE_HDR, &h) == 0);
    CHECK(cl_wire_decode(NULL, 0, &h) == EBADMSG);
    CHECK(cl_wire_decode(b, 0, &h) == EBADMSG);
    CHECK(cl_wire_decode(b, 1, &h) == EBADMSG);
    CHECK(cl_wire_decode(b, CL_WIRE_HDR - 1, &h) == EBADMSG);
    CHECK(h.tag == 0); /* too short to hold a tag */
    CHECK(cl_wire_decode(b, CL_WIRE_HDR + 1, &h) == EBADMSG);
    CHECK(h.tag == 0xabcd1234); /* long: the tag is read for the error reply */
    CHECK(cl_wire_decode(b, sizeof b, &h) == EBADMSG);
}

static void test_bad_fields(void) {
    uint8_t b[CL_WIRE_HDR];
    struct cl_wire_hdr h;

    for (int i = 0; i < 4; i++) { /* each magic byte */
        valid_get(b);
        b[i] ^= 0x20;
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
        CHECK(h.tag == 0xabcd1234);
    }
    valid_get(b);
    set32(b, 0);
    CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);

    static const uint8_t versions[] = {0, 2, 3, 0x80, 0xff};
    for (size_t i = 0; i < sizeof versions; i++) {
        valid_get(b);
        b[4] = versions[i];
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTONOSUPPORT);
        CHECK(h.tag == 0xabcd1234);
    }

    for (int bit = 2; bit < 16; bit++) { /* every reserved flag bit (0, 1, 3: GET's; 4: replies') */
        if ((1u << bit) & (CL_WIRE_DIRECT | CL_WIRE_HINTS | CL_WIRE_RELOC | CL_WIRE_SPARSE | CL_WIRE_DIFF))
            continue; /* checked in test_replication_flags, test_reloc_flags, test_sparse_layout, test_diff */
        valid_get(b);
        b[6 + bit / 8] |= (uint8_t)(1u << (bit % 8));
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    }
    struct cl_wire_hdr f = {.type = CL_WIRE_HELLO, .flags = 0x8000};
    cl_wire_encode(&f, b);
    CHECK(b[7] == 0x80);
    CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);

    static const uint8_t types[] = {0, 8, 9, 42, 0x80, 0xff};
    for (size_t i = 0; i < sizeof types; i++) {
        valid_get(b);
        b[5] = types[i];
        CHECK(cl_wire_decode(b, sizeof b, &h) == ENOMSG);
        CHECK(h.tag == 0xabcd1234);
    }

    static const uint32_t bad_counts[] = {0, CL_WIRE_MAX_COUNT + 1, 1000, 0x10000, UINT32_MAX};
    static const uint8_t ranged[] = {CL_WIRE_GET, CL_WIRE_PAGES};
    for (size_t t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof bad_counts / sizeof *bad_counts; i++) {
            struct cl_wire_hdr r = {.type = ranged[t], .index = 5, .count = bad_counts[i], .tag = 99};
            cl_wire_encode(&r, b);
            CHECK(cl_wire_decode(b, sizeof b, &h) == ERANGE);
            CHECK(h.tag == 99 && h.index == 5 && h.count == bad_counts[i]);
        }

    /* precedence follows wire.h: length, then magic, version, flags, type */
    valid_get(b);
    b[0] = 'X';
    b[4] = 9;
    CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    valid_get(b);
    b[4] = 9;
    b[6] = 4;
    CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTONOSUPPORT);
    valid_get(b);
    b[6] = 4;
    b[5] = 0;
    CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    valid_get(b);
    b[5] = 0;
    set32(b + 24, 0);
    CHECK(cl_wire_decode(b, sizeof b, &h) == ENOMSG);
}

/* ---- geometry payload ---------------------------------------------------- */

/* RELOC: on GET (send relocations) and PAGES (a relocations frame follows) only */
static void test_reloc_flags(void) {
    uint8_t b[CL_WIRE_HDR];
    struct cl_wire_hdr h;
    struct cl_wire_hdr g = {.type = CL_WIRE_GET, .flags = CL_WIRE_RELOC | CL_WIRE_DIRECT, .index = 7, .count = 1};
    cl_wire_encode(&g, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.flags == (CL_WIRE_RELOC | CL_WIRE_DIRECT));
    struct cl_wire_hdr p = {.type = CL_WIRE_PAGES, .flags = CL_WIRE_RELOC | CL_WIRE_HINTS, .index = 7, .count = 1};
    cl_wire_encode(&p, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.flags == (CL_WIRE_RELOC | CL_WIRE_HINTS));
    static const uint8_t others[] = {CL_WIRE_REDIRECT, CL_WIRE_HELLO, CL_WIRE_HELLO_REPLY, CL_WIRE_ERROR,
                                     CL_WIRE_REGISTER};
    for (size_t i = 0; i < sizeof others; i++) {
        struct cl_wire_hdr o = {.type = others[i], .flags = CL_WIRE_RELOC, .count = 1};
        cl_wire_encode(&o, b);
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    }
}

static void test_replication_flags(void) {
    uint8_t b[CL_WIRE_HDR];
    struct cl_wire_hdr h;
    struct cl_wire_hdr g = {.type = CL_WIRE_GET, .flags = CL_WIRE_NOREDIRECT | CL_WIRE_PEERMISS, .status = 3,
                            .index = 7, .count = 1, .tag = 5};
    cl_wire_encode(&g, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.flags == 3 && h.status == 3);
    struct cl_wire_hdr e = {.type = CL_WIRE_HELLO, .flags = CL_WIRE_NOREDIRECT};
    cl_wire_encode(&e, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO); /* GET's flags only on GET */
    struct cl_wire_hdr r = {.type = CL_WIRE_REDIRECT, .status = 2, .index = 7, .count = 1, .tag = 5};
    cl_wire_encode(&r, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.type == CL_WIRE_REDIRECT && h.status == 2);
    struct cl_wire_hdr reg = {.type = CL_WIRE_REGISTER};
    cl_wire_encode(&reg, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.type == CL_WIRE_REGISTER);

    /* hints: DIRECT on GET only, HINTS on the driver's PAGES and REDIRECT only */
    g.flags = CL_WIRE_DIRECT;
    cl_wire_encode(&g, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.flags == CL_WIRE_DIRECT);
    g.flags = CL_WIRE_HINTS;
    cl_wire_encode(&g, b);
    CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    static const uint8_t replies[] = {CL_WIRE_PAGES, CL_WIRE_REDIRECT};
    for (size_t i = 0; i < 2; i++) {
        struct cl_wire_hdr p = {.type = replies[i], .flags = CL_WIRE_HINTS, .index = 7, .count = 1, .tag = 5};
        cl_wire_encode(&p, b);
        CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.flags == CL_WIRE_HINTS);
        p.flags = CL_WIRE_DIRECT;
        cl_wire_encode(&p, b);
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
        p.flags = CL_WIRE_HINTS | 4; /* 4 stays reserved everywhere */
        cl_wire_encode(&p, b);
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    }
    static const uint8_t others[] = {CL_WIRE_HELLO, CL_WIRE_HELLO_REPLY, CL_WIRE_ERROR, CL_WIRE_REGISTER};
    for (size_t i = 0; i < sizeof others; i++) {
        struct cl_wire_hdr o = {.type = others[i], .flags = CL_WIRE_HINTS, .count = 1};
        cl_wire_encode(&o, b);
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    }
}


/* ---- sparse data ------------------------------------------------------------ */

/* Fill n words: each nonzero with probability density/1000, in runs. */
static void sparse_fill(uint64_t *w, size_t n, unsigned density) {
    memset(w, 0, n * 8);
    for (size_t i = 0; i < n; i++) {
        if (rnd() % 1000 >= density) continue;
        size_t run = 1 + rnd() % 4;
        for (size_t k = 0; k < run && i < n; k++, i++) w[i] = rnd() | 1; /* never zero */
    }
}

static void test_sparse_layout(void) {
    uint64_t w[16] = {0};
    w[3] = 0x1122334455667788ull;
    w[5] = 7; /* one zero word between: one run of three */
    w[15] = 9;
    uint8_t out[256];
    size_t n = 0;
    CHECK(cl_wire_sparse_encode(w, sizeof w, out, sizeof out, &n) == 0);
    CHECK(n == 8 + 24 + 8 + 8);
    CHECK(le32(out) == 3 && le32(out + 4) == 3);
    CHECK(le64(out + 8) == 0x1122334455667788ull && le64(out + 16) == 0 && le64(out + 24) == 7);
    CHECK(le32(out + 32) == 15 && le32(out + 36) == 1 && le64(out + 40) == 9);
    uint64_t back[16];
    memset(back, 0xa5, sizeof back);
    CHECK(cl_wire_sparse_decode(out, n, back, sizeof back) == 0);
    CHECK(memcmp(back, w, sizeof w) == 0);
    /* all zeros: an empty frame, which expands to zeros */
    memset(w, 0, sizeof w);
    CHECK(cl_wire_sparse_encode(w, sizeof w, out, sizeof out, &n) == 0 && n == 0);
    memset(back, 0xa5, sizeof back);
    CHECK(cl_wire_sparse_decode(out, 0, back, sizeof back) == 0 && memcmp(back, w, sizeof w) == 0);
    /* what does not fit is refused, and so is a length that is not whole words */
    for (int i = 0; i < 16; i++) w[i] = (uint64_t)i + 1;
    CHECK(cl_wire_sparse_encode(w, sizeof w, out, 64, &n) == E2BIG);
    CHECK(cl_wire_sparse_encode(w, sizeof w, out, 8 + 128, &n) == 0 && n == 136);
    CHECK(cl_wire_sparse_encode(w, 12, out, sizeof out, &n) == E2BIG);
    CHECK(cl_wire_sparse_decode(out, 0, back, 12) == EBADMSG);
}

/* Differential: random pages of every density, at page sizes from one word
 * to 64 KiB, come back exactly, and the encoding is never longer than the
 * runs it holds. */
static void test_sparse_roundtrip(long iters) {
    size_t max = 65536 / 8;
    uint64_t *w = malloc(max * 8), *back = malloc(max * 8);
    uint8_t *out = malloc(max * 8 * 2 + 64);
    static const unsigned dens[] = {0, 1, 5, 20, 100, 300, 700, 1000};
    for (long it = 0; it < iters; it++) {
        size_t n = 1 + rnd() % (it % 8 == 0 ? max : 64);
        sparse_fill(w, n, dens[rnd() % 8]);
        if (rnd() % 4 == 0) w[0] = 0; /* runs at the edges and not */
        if (rnd() % 4 == 0) w[n - 1] = rnd() | 2;
        size_t len = 0, nonzero = 0;
        for (size_t i = 0; i < n; i++) nonzero += w[i] != 0;
        int rc = cl_wire_sparse_encode(w, n * 8, out, n * 16 + 16, &len);
        CHECK(rc == 0);
        CHECK(len % 8 == 0 && len <= 16 * nonzero);
        memset(back, 0x5a, n * 8);
        CHECK(cl_wire_sparse_decode(out, len, back, n * 8) == 0);
        CHECK(memcmp(back, w, n * 8) == 0);
        /* a cap below the encoding is refused, never truncated */
        if (len) CHECK(cl_wire_sparse_encode(w, n * 8, out, len - 8, &len) == E2BIG);
    }
    free(w);
    free(back);
    free(out);
}

/* Malformed frames: every kind is EBADMSG, and random bytes never write
 * outside the data (a guard word after it stays). */
static void test_sparse_malformed(long iters) {
    uint64_t back[9];
    uint8_t f[64];
    const size_t len = 64; /* eight words; back[8] is the guard */
    struct { uint32_t first, n; size_t extra; } bad[] = {
        {0, 0, 0},  /* a run of no words */
        {8, 1, 8},  /* starts past the data */
        {7, 2, 16}, /* ends past the data */
        {0, 2, 8},  /* truncated: one word of two */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        set32(f, bad[k].first);
        set32(f + 4, bad[k].n);
        memset(f + 8, 1, bad[k].extra);
        back[8] = 0x77;
        CHECK(cl_wire_sparse_decode(f, 8 + bad[k].extra, back, len) == EBADMSG);
        CHECK(back[8] == 0x77);
    }
    /* overlapping and descending runs */
    set32(f, 2), set32(f + 4, 2), memset(f + 8, 1, 16), set32(f + 24, 3), set32(f + 28, 1), memset(f + 32, 2, 8);
    CHECK(cl_wire_sparse_decode(f, 40, back, len) == EBADMSG);
    set32(f + 24, 0);
    CHECK(cl_wire_sparse_decode(f, 40, back, len) == EBADMSG);
    set32(f + 24, 4); /* right after the first run: fine */
    CHECK(cl_wire_sparse_decode(f, 40, back, len) == 0 && back[4] == 0x0202020202020202ull && back[3] != 0);
    /* a partial header */
    CHECK(cl_wire_sparse_decode(f, 4, back, len) == EBADMSG);
    CHECK(cl_wire_sparse_decode(f, 44, back, len) == EBADMSG);
    for (long it = 0; it < iters; it++) {
        size_t fl = rnd() % sizeof f;
        for (size_t i = 0; i < fl; i++) f[i] = (uint8_t)(rnd() % 4 == 0 ? rnd() % 9 : rnd());
        back[8] = 0x77;
        int rc = cl_wire_sparse_decode(f, fl, back, len);
        CHECK(rc == 0 || rc == EBADMSG);
        CHECK(back[8] == 0x77);
    }
}

/* ---- diffs ------------------------------------------------------------------ */

/* DIFF on GET and PAGES only; a diff is a sparse frame XORed into the copy,
 * checked whole before any word changes. */
static void test_diff(long iters) {
    uint8_t b[CL_WIRE_HDR];
    struct cl_wire_hdr h;
    static const uint8_t types[] = {CL_WIRE_GET, CL_WIRE_PAGES};
    for (size_t i = 0; i < 2; i++) {
        struct cl_wire_hdr g = {.type = types[i], .flags = CL_WIRE_DIFF | CL_WIRE_SPARSE, .index = 7, .count = 3};
        cl_wire_encode(&g, b);
        CHECK(b[6] == 0xc0);
        CHECK(cl_wire_decode(b, sizeof b, &h) == 0 && h.flags == (CL_WIRE_DIFF | CL_WIRE_SPARSE));
    }
    static const uint8_t others[] = {CL_WIRE_REDIRECT, CL_WIRE_HELLO, CL_WIRE_HELLO_REPLY, CL_WIRE_ERROR,
                                     CL_WIRE_REGISTER};
    for (size_t i = 0; i < sizeof others; i++) {
        struct cl_wire_hdr o = {.type = others[i], .flags = CL_WIRE_DIFF, .count = 1};
        cl_wire_encode(&o, b);
        CHECK(cl_wire_decode(b, sizeof b, &h) == EPROTO);
    }
    /* differential: old ^ encode(old ^ new) == new, for every density */
    size_t max = 65536 / 8;
    uint64_t *o = malloc(max * 8), *n = malloc(max * 8 + 8), *x = malloc(max * 8);
    uint8_t *f = malloc(max * 16 + 64);
    static const unsigned dens[] = {0, 1, 5, 20, 100, 300, 700, 1000};
    for (long it = 0; it < iters / 4; it++) {
        size_t w = 1 + rnd() % (it % 8 == 0 ? max : 64), len = 0;
        for (size_t i = 0; i < w; i++) o[i] = rnd() % 3 ? rnd() : 0;
        sparse_fill(x, w, dens[rnd() % 8]);
        for (size_t i = 0; i < w; i++) n[i] = o[i] ^ x[i];
        CHECK(cl_wire_sparse_encode(x, w * 8, f, w * 16 + 16, &len) == 0);
        n[w] = 0x77;
        memcpy(x, o, w * 8);
        CHECK(cl_wire_diff_apply(f, len, x, w * 8) == 0);
        CHECK(memcmp(x, n, w * 8) == 0);
    }
    /* malformed: EBADMSG and the copy untouched, for each kind and for noise */
    struct { uint32_t first, n; size_t extra; } bad[] = {{0, 0, 0}, {8, 1, 8}, {7, 2, 16}, {0, 2, 8}};
    uint64_t copy[9], orig[9];
    for (int i = 0; i < 9; i++) orig[i] = rnd();
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        set32(f, 1);
        set32(f + 4, 1);
        memset(f + 8, 0xff, 8); /* a good first run: must not be applied either */
        set32(f + 16, bad[k].first);
        set32(f + 20, bad[k].n);
        memset(f + 24, 1, bad[k].extra);
        memcpy(copy, orig, sizeof copy);
        CHECK(cl_wire_diff_apply(f, 24 + bad[k].extra, copy, 64) == EBADMSG);
        CHECK(memcmp(copy, orig, sizeof copy) == 0);
    }
    set32(f, 3), set32(f + 4, 2), set32(f + 24, 4), set32(f + 28, 1); /* overlapping */
    memcpy(copy, orig, sizeof copy);
    CHECK(cl_wire_diff_apply(f, 40, copy, 64) == EBADMSG && memcmp(copy, orig, sizeof copy) == 0);
    for (long it = 0; it < iters; it++) {
        size_t fl = rnd() % 64;
        for (size_t i = 0; i < fl; i++) f[i] = (uint8_t)(rnd() % 4 == 0 ? rnd() % 9 : rnd());
        memcpy(copy, orig, sizeof copy);
        int rc = cl_wire_diff_apply(f, fl, copy, 64);
        CHECK(rc == 0 || rc == EBADMSG);
        CHECK(copy[8] == orig[8]);
        if (rc) CHECK(memcmp(copy, orig, sizeof copy) == 0);
    }
    free(o);
    free(n);
    free(x);
    free(f);
}

static void test_geo(void) {
    struct cl_wire_geo g = {.base = 0x200000000000ull, .size = (uint64_t)64 << 30, .page_size = 65536,
                            .role = 1, .reserved = 0x5555};
    uint8_t b[40];
    memset(b, 0xee, sizeof b);
    cl_wire_geo_encode(&g, b);
    CHECK(le64(b) == g.base);
    CHECK(le64(b + 8) == g.size);
    CHECK(le64(b + 16) == g.page_size);
    CHECK(le32(b + 24) == 1);
    CHECK(le32(b + 28) == 0); /* reserved: always written as zero */
    CHECK(b[32] == 0xee);     /* exactly 32 bytes written */
    struct cl_wire_geo o;
    memset(&o, 0xff, sizeof o);
    CHECK(cl_wire_geo_decode(b, 32, &o) == 0);
    CHECK(o.base == g.base && o.size == g.size && o.page_size == g.page_size && o.role == g.role);
    CHECK(o.reserved == 0);
    struct cl_wire_geo m = {UINT64_MAX, UINT64_MAX - 1, 1, UINT32_MAX, 0};
    cl_wire_geo_encode(&m, b);
    CHECK(cl_wire_geo_decode(b, 32, &o) == 0);
    CHECK(o.base == UINT64_MAX && o.size == UINT64_MAX - 1 && o.page_size == 1 && o.role == UINT32_MAX);
    CHECK(cl_wire_geo_decode(b, 31, &o) == EBADMSG);
    CHECK(cl_wire_geo_decode(b, 33, &o) == EBADMSG);
    CHECK(cl_wire_geo_decode(NULL, 0, &o) == EBADMSG);
}

/* ---- random bytes ---------------------------------------------------------- */

static bool documented(int rc) {
    return rc == 0 || rc == EBADMSG || rc == EPROTO || rc == EPROTONOSUPPORT || rc == ENOMSG || rc == ERANGE;
}

static void test_random(long iters) {
    long undocumented = 0, noncanonical = 0, accepted = 0, seen[6] = {0};
    for (long it = 0; it < iters; it++) {
        /* Exactly-sized heap buffers, so an over-read would hit the
         * allocator's guard bytes under valgrind or ASan. */
        size_t len;
        switch (rnd() % 4) {
        case 0: len = rnd() % (2 * CL_WIRE_HDR + 1); break;
        default: len = CL_WIRE_HDR; break;
        }
        uint8_t *b = malloc(len ? len : 1);
        if (!b) abort();
        if (len == CL_WIRE_HDR && rnd() % 2) { /* a valid header with a few bytes mutated */
            struct cl_wire_hdr v = {.type = (uint8_t)(1 + rnd() % 5), .status = (uint32_t)rnd(),
                                    .version = (uint32_t)rnd(), .index = rnd(),
                                    .count = (uint32_t)(1 + rnd() % CL_WIRE_MAX_COUNT), .tag = (uint32_t)rnd()};
            cl_wire_encode(&v, b);
            for (int k = (int)(rnd() % 3); k > 0; k--) b[rnd() % len] = (uint8_t)rnd();
        } else {
            for (size_t i = 0; i < len; i++) b[i] = (uint8_t)rnd();
            if (len >= 4 && rnd() % 2) set32(b, CL_WIRE_MAGIC);
            if (len >= 5 && rnd() % 2) b[4] = CL_WIRE_VERSION;
        }
        struct cl_wire_hdr h;
        int rc = cl_wire_decode(b, len, &h);
        if (!documented(rc)) undocumented++;
        seen[rc == 0 ? 0 : rc == EBADMSG ? 1 : rc == EPROTO ? 2 : rc == EPROTONOSUPPORT ? 3 : rc == ENOMSG ? 4 : 5]++;
        if (rc == 0) { /* what decodes re-encodes to the same bytes */
            accepted++;
            uint8_t again[CL_WIRE_HDR];
            cl_wire_encode(&h, again);
            if (len != CL_WIRE_HDR || memcmp(again, b, CL_WIRE_HDR) != 0) noncanonical++;
        }
        struct cl_wire_geo g;
        int grc = cl_wire_geo_decode(b, len, &g);
        if (grc != (len == 32 ? 0 : EBADMSG)) undocumented++;
        free(b);
    }
    CHECK(undocumented == 0);
    CHECK(noncanonical == 0);
    CHECK(accepted > 0);
    for (int i = 0; i < 6; i++) CHECK(seen[i] > 0); /* the loop reached every answer */
    if (undocumented || noncanonical)
        fprintf(stderr, "  random: %ld undocumented codes, %ld non-canonical accepts\n", undocumented,
                noncanonical);
}

int main(void) {
    const char *quick = getenv("CLAMOR_TEST_QUICK");
    long iters = (quick && *quick && *quick != '0') ? 20000 : 300000;
    test_layout();
    test_roundtrip();
    test_lengths();
    test_bad_fields();
    test_replication_flags();
    test_reloc_flags();
    test_geo();
    test_sparse_layout();
    test_sparse_roundtrip(iters / 100);
    test_sparse_malformed(iters);
    test_diff(iters);
    test_random(iters);
    return CHECK_SUMMARY("test_wire");
}
