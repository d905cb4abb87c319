/* wire.c -- encode and decode the data-plane header (see wire.h).  No I/O,
 * so it is unit-tested on its own (tests/c/test_wire.c). */
#include <errno.h>
#include <string.h>

#include "wire.h"

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void cl_wire_encode(const struct cl_wire_hdr *h, uint8_t *o) {
    put32(o, CL_WIRE_MAGIC);
    o[4] = CL_WIRE_VERSION;
    o[5] = h->type;
    o[6] = (uint8_t)h->flags;
    o[7] = (uint8_t)(h->flags >> 8);
    put32(o + 8, h->status);
    put32(o + 12, h->version);
    put64(o + 16, h->index);
    put32(o + 24, h->count);
    put32(o + 28, h->tag);
}

int cl_wire_decode(const void *buf, size_t len, struct cl_wire_hdr *h) {
    const uint8_t *p = buf;
    memset(h, 0, sizeof *h);
    if (len >= CL_WIRE_HDR) h->tag = get32(p + 28);
    if (len != CL_WIRE_HDR) return EBADMSG;
    if (get32(p) != CL_WIRE_MAGIC) return EPROTO;
    h->proto = p[4];
    h->type = p[5];
    h->flags = (uint16_t)(p[6] | p[7] << 8);
    h->status = get32(p + 8);
    h->version = get32(p + 12);
    h->index = get64(p + 16);
    h->count = get32(p + 24);
    if (h->proto != CL_WIRE_VERSION) return EPROTONOSUPPORT;
    uint16_t allowed = h->type == CL_WIRE_GET ? CL_WIRE_NOREDIRECT | CL_WIRE_PEERMISS | CL_WIRE_DIRECT | CL_WIRE_RELOC |
                                                    CL_WIRE_SPARSE | CL_WIRE_DIFF
                       : h->type == CL_WIRE_PAGES ? CL_WIRE_HINTS | CL_WIRE_RELOC | CL_WIRE_SPARSE | CL_WIRE_DIFF
                       : h->type == CL_WIRE_REDIRECT ? CL_WIRE_HINTS
                       : 0;
    if (h->flags & ~allowed) return EPROTO;
    switch (h->type) {
    case CL_WIRE_GET:
    case CL_WIRE_PAGES:
    case CL_WIRE_REDIRECT:
        if (h->count == 0 || h->count > CL_WIRE_MAX_COUNT) return ERANGE;
        return 0;
    case CL_WIRE_ERROR:
    case CL_WIRE_HELLO:
    case CL_WIRE_HELLO_REPLY:
    case CL_WIRE_REGISTER:
        return 0;
    default:
        return ENOMSG;
    }
}

void cl_wire_geo_encode(const struct cl_wire_geo *g, uint8_t *o) {
    put64(o, g->base);
    put64(o + 8, g->size);
    put64(o + 16, g->page_size);
    put32(o + 24, g->role);
    put32(o + 28, 0);
}

int cl_wire_geo_decode(const void *buf, size_t len, struct cl_wire_geo *g) {
    const uint8_t *p = buf;
    if (len != 32) return EBADMSG;
    g->base = get64(p);
    g->size = get64(p + 8);
    g->page_size = get64(p + 16);
    g->role = get32(p + 24);
    g->reserved = get32(p + 28);
    return 0;
}

/* ---- sparse data ------------------------------------------------------------ */

/* First nonzero word at or after i (n if none); eight words at a time
 * where it can. */
static size_t skip_zeros(const uint64_t *w, size_t i, size_t n) {
    while (i < n && (i & 7)) {
        if (w[i]) return i;
        i++;
    }
    while (i + 8 <= n && !(w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7])) i += 8;
    while (i < n && !w[i]) i++;
    return i;
}

int cl_wire_sparse_encode(const void *data, size_t len, void *out, size_t cap, size_t *outlen) {
    const uint64_t *w = data;
    uint8_t *o = out;
    size_t n = len / 8, used = 0;
    if (len % 8 || n > UINT32_MAX) return E2BIG;
    for (size_t i = skip_zeros(w, 0, n); i < n; i = skip_zeros(w, i, n)) {
        size_t e = i + 1;
        for (;;) { /* to the end of the nonzero words, through one-word gaps */
            while (e < n && w[e]) e++;
            if (e + 1 < n && w[e + 1]) {
                e += 2;
                continue;
            }
            break;
        }
        size_t need = 8 + (e - i) * 8;
        if (need > cap - used) return E2BIG;
        put32(o + used, (uint32_t)i);
        put32(o + used + 4, (uint32_t)(e - i));
        memcpy(o + used + 8, w + i, (e - i) * 8);
        used += need;
        i = e;
    }
    *outlen = used;
    return 0;
}

int cl_wire_sparse_decode(const void *in, size_t inlen, void *data, size_t len) {
    const uint8_t *p = in;
    uint8_t *d = data;
    size_t n = len / 8, end = 0, o = 0;
    if (len % 8) return EBADMSG;
    memset(d, 0, len);
    while (o < inlen) {
        if (inlen - o < 8) return EBADMSG;
        uint64_t first = get32(p + o), k = get32(p + o + 4);
        if (k == 0 || first < end || first > n || k > n - first || k > (inlen - o - 8) / 8) return EBADMSG;
        memcpy(d + first * 8, p + o + 8, k * 8);
        o += 8 + k * 8;
        end = first + k;
    }
    return 0;
}

/* The runs of a sparse frame are well formed for len bytes: ascending, not
 * overlapping, each of at least one word and inside len, the frame whole. */
static int runs_valid(const uint8_t *p, size_t inlen, size_t len) {
    size_t n = len / 8, end = 0, o = 0;
    if (len % 8) return EBADMSG;
    while (o < inlen) {
        if (inlen - o < 8) return EBADMSG;
        uint64_t first = get32(p + o), k = get32(p + o + 4);
        if (k == 0 || first < end || first > n || k > n - first || k > (inlen - o - 8) / 8) return EBADMSG;
        o += 8 + k * 8;
        end = first + k;
    }
    return 0;
}

int cl_wire_diff_apply(const void *in, size_t inlen, void *data, size_t len) {
    const uint8_t *p = in;
    uint8_t *d = data;
    int rc = runs_valid(p, inlen, len);
    if (rc) return rc;
    for (size_t o = 0; o < inlen;) {
        size_t first = get32(p + o), k = get32(p + o + 4);
        for (size_t j = 0; j < k; j++) {
            uint64_t x, y;
            memcpy(&x, d + (first + j) * 8, 8);
            memcpy(&y, p + o + 8 + j * 8, 8);
            x ^= y;
            memcpy(d + (first + j) * 8, &x, 8);
        }
        o += 8 + k * 8;
    }
    return 0;
}
