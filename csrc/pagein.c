/* pagein.c -- the bytes of a page reply into the worker's memfd (pager
 * thread only): full, sparse or a diff of the kept copies, relocated, then
 * written with pwrite(2) while the public view stays closed; and the
 * waiters of arriving pages woken early.
 *
 * pager.c receives the reply's header and decides what it answers; this
 * file takes its page frame (and relocations frame) and leaves the pages
 * in the memfd for pager.c to open (install_run).  A diff (wire.h) is
 * applied to the kept copies, read back from the memfd, and each page
 * rebuilt must sum as the driver's (the copy may hold this worker's own
 * writes, or not be the version it names): else EILSEQ, and pager.c asks
 * for the pages whole.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "wire.h"
#include "zmqdl.h"

/* Sparse replies and diffs are expanded here: the pager thread's own. */
static void *scratch;
static size_t scratch_len;

void cl_pagein_free(void) {
    free(scratch);
    scratch = NULL;
    scratch_len = 0;
}

/* Give the destination its memory while the request is on the wire:
 * fallocate(2) allocates the memfd pages without zeroing or mapping them,
 * so the pwrite of the reply only copies (cl_pagein_write).  Failure only
 * loses the head start. */
void cl_pagein_prepare(uint64_t first, uint32_t count) {
    off_t off = (off_t)((size_t)first << cl_region.page_shift), len = (off_t)((size_t)count << cl_region.page_shift);
    fallocate(cl_region.memfd, FALLOC_FL_KEEP_SIZE, off, len);
}

static bool grow_scratch(size_t len) {
    if (scratch_len >= len) return true;
    void *b = realloc(scratch, len);
    if (!b) return false;
    scratch = b;
    scratch_len = len;
    return true;
}

/* The kept copies of [first, first+count) read back from the memfd into
 * the scratch buffer, the diff `d` (the pages' sums, then the words that
 * changed) applied, and each page's sum checked into sums[]: 0, EBADMSG
 * or EILSEQ. */
static int apply_diff(uint64_t first, uint32_t count, size_t len, bool relocs, const char *d, size_t got,
                      uint64_t *sums) {
    size_t head = (size_t)count * 8, ps = (size_t)1 << cl_region.page_shift;
    off_t off = (off_t)((size_t)first << cl_region.page_shift);
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(cl_region.memfd, (char *)scratch + done, len - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { /* (past the memfd's end cannot be: read as zeros, the sums decide) */
            memset((char *)scratch + done, 0, len - done);
            break;
        }
        done += (size_t)r;
    }
    if (relocs) cl_reloc_restore(first, count, scratch); /* the driver's words, as the diff has them */
    if (cl_wire_diff_apply(d + head, got - head, scratch, len) != 0) return EBADMSG;
    for (uint32_t k = 0; k < count; k++) {
        uint64_t want = 0;
        for (int i = 0; i < 8; i++) want |= (uint64_t)(uint8_t)d[k * 8 + i] << (8 * i);
        sums[k] = cl_page_sum((char *)scratch + k * ps, ps);
        if (sums[k] != want) return EILSEQ;
    }
    CL_COUNT(diff_pages, count);
    CL_COUNT(diff_wire_bytes, got);
    return 0;
}

/* The relocations frame (the next one on sock): the words of the pages at
 * p are rewritten before anyone sees them (*moved: some were).  0, EBADMSG
 * or cl_reloc_apply's error. */
static int take_relocs(void *sock, uint64_t first, uint32_t count, char *p, size_t len, bool *moved) {
    int more = 0;
    size_t sz = sizeof more;
    cl_zmq_msg r;
    cl_zmq.msg_init(&r);
    if (cl_zmq.getsockopt(sock, CL_ZMQ_RCVMORE, &more, &sz) != 0 || !more || cl_zmq.msg_recv(&r, sock, 0) < 0) {
        cl_zmq.msg_close(&r);
        return EBADMSG;
    }
    size_t rl = cl_zmq.msg_size(&r);
    int rc = cl_reloc_apply(first, count, p, len, cl_zmq.msg_data(&r), rl);
    cl_zmq.msg_close(&r);
    if (rc) return rc;
    CL_COUNT(reloc_bytes, rl);
    CL_COUNT(reloc_words, (rl - 4) / sizeof(struct clamor_reloc));
    if (rl > 4) CL_COUNT(reloc_pages, count);
    *moved = rl > 4;
    return 0;
}

/* The len bytes at p written into the memfd at the pages' offset, and the
 * pages' sums kept (`sums`: those a diff checked, or NULL to sum them).
 * 0 or pwrite's errno (EIO for a write of nothing). */
static int store(uint64_t first, uint32_t count, const char *p, size_t len, const uint64_t *sums) {
    size_t ps = (size_t)1 << cl_region.page_shift;
    off_t off = (off_t)((size_t)first << cl_region.page_shift);
    size_t done = 0;
    int rc = 0;
    while (done < len) {
        ssize_t w = pwrite(cl_region.memfd, p + done, len - done, off + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            rc = w < 0 ? errno : EIO;
            break;
        }
        done += (size_t)w;
    }
    if (!rc && cl_region.sums) {   /* what a peer may be served of them: these bytes (server.c) */
        for (uint32_t k = 0; k < count; k++)
            atomic_store_explicit(&cl_region.sums[first + k], sums ? sums[k] : cl_page_sum(p + k * ps, ps),
                                  memory_order_release);
    }
    if (!rc) cl_pt_unkeep(first, count, false); /* the copies are the pages now */
    return rc;
}

/* pwrite(2), not a copy through the fill view: a write through a mapping
 * takes a page fault and a page-table update per 4 KiB page, and on this
 * VM those cost more than the copy (a 64 KiB page: ~14 us by pwrite into
 * allocated pages, ~45 us by memcpy through the fill view).  The public
 * view stays closed until pager.c's install_run opens it, so no thread
 * sees a half-written page. */
int cl_pagein_write(void *sock, uint64_t first, uint32_t count, size_t len, bool relocs, bool sparse, bool diff) {
    cl_zmq_msg m;
    cl_zmq.msg_init(&m);
    int rc = EBADMSG;
    size_t head = (size_t)count * 8;
    uint64_t sums[CL_WIRE_MAX_COUNT];
    if (cl_zmq.msg_recv(&m, sock, 0) >= 0 &&
        (diff     ? cl_zmq.msg_size(&m) >= head && cl_zmq.msg_size(&m) < len
         : sparse ? cl_zmq.msg_size(&m) <= len / 2
                  : cl_zmq.msg_size(&m) == len)) {
        char *p = cl_zmq.msg_data(&m);
        size_t got = cl_zmq.msg_size(&m);
        CL_COUNT(wire_bytes_fetched, got);
        if ((sparse || diff) && !grow_scratch(len)) {
            cl_zmq.msg_close(&m);
            return ENOMEM;
        }
        if (diff) { /* the kept copies, then the words that changed */
            if ((rc = apply_diff(first, count, len, relocs, p, got, sums))) {
                cl_zmq.msg_close(&m);
                return rc;
            }
            p = scratch;
        } else if (sparse) { /* expanded into the pager's buffer, then as if it came whole */
            if (cl_wire_sparse_decode(p, cl_zmq.msg_size(&m), scratch, len) != 0) {
                cl_zmq.msg_close(&m);
                return EBADMSG;
            }
            p = scratch;
        }
        bool moved = false;
        if (relocs && (rc = take_relocs(sock, first, count, p, len, &moved))) {
            cl_zmq.msg_close(&m);
            return rc;
        }
        /* (a diff's sums are of these bytes unless relocation rewrote some) */
        rc = store(first, count, p, len, diff && !moved ? sums : NULL);
    }
    cl_zmq.msg_close(&m);
    return rc;
}

/* Waking the waiters of arriving pages now overlaps their wake-up (9-14 us
 * here) with the pwrite and the mprotect instead of following them; they
 * spin until the pages open (fault.c).  Measured in one process,
 * alternating pages: ~8 us less per fault. */
void cl_pagein_announce(uint64_t first, uint32_t count) {
    for (uint64_t i = first; i < first + count; i++) {
        _Atomic uint32_t *w = &cl_region.pages[i];
        uint32_t s = atomic_load(w);
        for (;;) {
            if (CL_PG_STATE(s) != CL_PG_WANTED || !(s & CL_PG_WAITERS) || (s & (CL_PG_ARRIVING | CL_PG_STALE)))
                break;
            if (atomic_compare_exchange_weak(w, &s, s | CL_PG_ARRIVING)) {
                cl_futex_wake(w);
                break;
            }
        }
    }
}
