/* server.c -- the page server: the driver's, and every worker's for peers.
 *
 * DESIGN.  One C thread owns a ROUTER socket bound to the endpoint.  A
 * request is [identity][32-byte header] (wire.h).  The driver answers GET
 * with the bytes of its region for every page the allocator has handed out
 * and ENOENT for the rest; a worker answers with the pages it holds and
 * EAGAIN for the others (the requester then asks the driver).  Whatever
 * arrives, malformed, short, oversized (up to libzmq's ZMQ_MAXMSGSIZE) or of
 * an unknown type, gets an ERROR reply and the loop goes on: one bad peer
 * never stops the server.  Replies to a peer that went away are dropped by
 * the ROUTER (not mandatory), so a dead peer never stalls it either.
 *
 * The driver's PAGES and REDIRECT replies to a registered worker carry a
 * frame of holder hints (directory.c), so that worker's later fetches can
 * go straight to a peer.  A worker serves such a DIRECT request only in
 * the request's own version: its pages are then that version's.
 *
 * The driver answers with each page as the requester's version sees it
 * (version.c).  A worker copies a page out of its fill view and checks that the
 * page was present before and after the copy, so a page dropped meanwhile is
 * never served half-old.  A worker re-running a task of an older version
 * (lineage recovery) holds old versions: until it moves on, it refuses
 * requests of newer versions, and a change of version during a copy voids it.
 *
 * Diffs.  A worker that kept its copy of a page the driver changed asks
 * with DIFF and the version each copy is (wire.h).  The driver
 * reads both versions, XORs them (summing the new one as it goes), and
 * sends the sparse form of the XOR with the sums when that is shorter than
 * the pages: for a few weights rewritten on a page, about twice their
 * bytes instead of the page.  The relocations frame, for a worker that
 * relocates, is the new pages' as always (the diff is of the driver's
 * words).  A version it no longer has (ESTALE), or a
 * diff no shorter, and the reply is the pages as usual.  Such a request is
 * never redirected (a peer would send the whole page), and a worker's page
 * server answers it with its pages, ignoring the bases.
 *
 * Rate limit (for benchmarks): CLAMOR_SERVE_RATE=<bytes per second>, read
 * when the server starts, makes page replies leave no faster than a link of
 * that rate, so a loopback run can show a network bottleneck
 * (bench/hotpages.py).  A token bucket with 10 ms of burst: the server
 * thread sleeps off any debt before it replies, as a saturated link would
 * queue.  Unset or 0: no limit.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "diffs.h"
#include "internal.h"
#include "wire.h"
#include "zmqdl.h"

static struct server {
    struct cl_thread t; /* thread.c */
    void *zap;          /* its ZAP handler (security.c), NULL when security is off */
    char endpoint[256];
    void *scratch; /* the server thread's: sparse replies are encoded here */
    size_t scratch_len;
} S = {.t = CL_THREAD_INIT};

static void buffers_free(void) {
    free(S.scratch);
    S.scratch = NULL;
    S.scratch_len = 0;
    cl_diffs_free();
}

const char *clamor_server_endpoint(void) { return S.t.running ? S.endpoint : ""; }

/* Only the server thread touches RL once the server runs. */
static struct { double rate, burst, tokens; uint64_t last_ns; } RL;

static void rate_init(void) {
    cl_option_env(CL_OPT_SERVE_RATE);
    RL.rate = (double)cl_option_get(CL_OPT_SERVE_RATE);
    RL.burst = RL.tokens = RL.rate / 100;
    RL.last_ns = cl_now_ns();
}

static void rate_take(size_t bytes) {
    if (RL.rate <= 0) return;
    uint64_t now = cl_now_ns();
    RL.tokens += (double)(now - RL.last_ns) * 1e-9 * RL.rate;
    if (RL.tokens > RL.burst) RL.tokens = RL.burst;
    RL.last_ns = now;
    RL.tokens -= (double)bytes;
    if (RL.tokens < 0) { /* the debt refills while we sleep; the next call counts it */
        double s = -RL.tokens / RL.rate;
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
}

static void reply_hdr(cl_zmq_msg *id, struct cl_wire_hdr *h, const void *body, size_t blen) {
    uint8_t buf[CL_WIRE_HDR];
    cl_wire_encode(h, buf);
    cl_zmq.send(S.t.sock, cl_zmq.msg_data(id), cl_zmq.msg_size(id), CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT);
    cl_zmq.send(S.t.sock, buf, sizeof buf, CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT);
    cl_zmq.send(S.t.sock, body, blen, CL_ZMQ_DONTWAIT);
}

static void reply_err(cl_zmq_msg *id, uint32_t tag, const struct cl_wire_hdr *req, int err, const char *why) {
    struct cl_wire_hdr h = {.type = CL_WIRE_ERROR, .status = (uint32_t)err, .tag = tag};
    if (req) {
        h.index = req->index;
        h.count = req->count;
        h.version = req->version;
    }
    reply_hdr(id, &h, why, strlen(why));
}

/* The hints frame for a driver reply to peer `self` (server thread only). */
static uint8_t hint_buf[8 + CL_WIRE_MAX_HINTS];

static size_t hints_for(int self, const struct cl_wire_hdr *rq) {
    return cl_region.role == CLAMOR_ROLE_DRIVER ? cl_dir_hints(self, rq->version, hint_buf, sizeof hint_buf) : 0;
}

/* Pages this worker holds in its own memory.  Pages it maps from the
 * driver's (same host) are not served: peers get them from the driver,
 * from the same memory. */
static bool pages_held(uint64_t first, uint32_t count) {
    for (uint64_t i = first; i < first + count; i++)
        if (CL_PG_STATE(atomic_load(&cl_region.pages[i])) != CL_PG_PRESENT ||
            (cl_region.wloc && atomic_load(&cl_region.wloc[i])))
            return false;
    return true;
}

/* Worker: true if this worker is re-running an older version than `version`
 * (its copies may be older versions than the requester may see).  *view
 * gets the version-change count read before the version. */
static bool rewound_for(uint32_t version, uint64_t *view) {
    *view = atomic_load(&cl_worker_view);
    uint32_t cur = atomic_load(&cl_worker_version);
    return cur < atomic_load(&cl_worker_version_top) && version > cur;
}

/* Replace *body (len bytes of pages) by its sparse form (wire.h) if that
 * is at most half as long; *sent is then its length.  A reply that does not
 * shrink is sent as it is, having cost one scan of the zero words. */
static bool sparsen(cl_zmq_msg *body, size_t len, size_t *sent) {
    if (!cl_grow(&S.scratch, &S.scratch_len, len / 2)) return false; /* kept for the next reply */
    size_t n = 0;
    cl_zmq_msg sized;
    if (cl_wire_sparse_encode(cl_zmq.msg_data(body), len, S.scratch, len / 2, &n) != 0 ||
        cl_zmq.msg_init_size(&sized, n) != 0)
        return false;
    if (n) memcpy(cl_zmq.msg_data(&sized), S.scratch, n);
    cl_zmq.msg_close(body);
    *body = sized; /* as zmq_msg_move does */
    *sent = n;
    return true;
}

/* Driver: send the requester to a worker that holds the pages, if one does
 * (not a request that may not be redirected, nor one with copies to diff
 * against).  True if it did.  *self gets the requester's peer number. */
static bool redirect(cl_zmq_msg *id, const struct cl_wire_hdr *rq, const uint32_t *bases, int *self) {
    *self = cl_dir_peer_of(cl_zmq.msg_data(id), cl_zmq.msg_size(id));
    if (rq->flags & CL_WIRE_PEERMISS) cl_dir_miss(rq->index, rq->count, (int)rq->status - 1);
    const char *ep;
    /* (a requester with copies gets a diff here rather than the pages from a peer) */
    int peer = (rq->flags & CL_WIRE_NOREDIRECT) || bases ? -1
                                                         : cl_dir_choose(rq->index, rq->count, rq->version, *self, &ep);
    if (peer < 0) return false;
    /* a worker holds it: send the requester there */
    size_t hl = hints_for(*self, rq);
    struct cl_wire_hdr h = {.type = CL_WIRE_REDIRECT, .flags = hl ? CL_WIRE_HINTS : 0,
                            .status = (uint32_t)peer, .index = rq->index, .count = rq->count,
                            .version = rq->version, .tag = rq->tag};
    uint8_t buf[CL_WIRE_HDR];
    cl_wire_encode(&h, buf);
    cl_zmq.send(S.t.sock, cl_zmq.msg_data(id), cl_zmq.msg_size(id), CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT);
    cl_zmq.send(S.t.sock, buf, sizeof buf, CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT);
    cl_zmq.send(S.t.sock, ep, strlen(ep), hl ? CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT : CL_ZMQ_DONTWAIT);
    if (hl) {
        rate_take(hl);
        cl_zmq.send(S.t.sock, hint_buf, hl, CL_ZMQ_DONTWAIT);
        CL_COUNT(hint_bytes, hl);
    }
    CL_COUNT(redirects, 1);
    return true;
}

/* Driver: *body gets the len bytes of pages at off, each as the requester's
 * version sees it (the driver may be writing the current page: version.c
 * logs it first).  False once it has replied with why not instead. */
static bool driver_copy(cl_zmq_msg *id, const struct cl_wire_hdr *rq, size_t off, size_t len, cl_zmq_msg *body) {
    if (!cl_alloc_range_used(off, len)) {
        reply_err(id, rq->tag, rq, ENOENT, "page never allocated");
        return false;
    }
    if (cl_zmq.msg_init_size(body, len) != 0) {
        reply_err(id, rq->tag, rq, ENOMEM, "out of memory");
        return false;
    }
    for (uint32_t k = 0; k < rq->count; k++) {
        int rc = cl_version_read(rq->index + k, rq->version,
                                 (char *)cl_zmq.msg_data(body) + ((size_t)k << cl_region.page_shift));
        if (rc) {
            cl_zmq.msg_close(body);
            reply_err(id, rq->tag, rq, rc, "that version was collected");
            return false;
        }
    }
    return true;
}

/* Worker: *body gets a copy of the len bytes of pages at off that it holds,
 * with the driver's words, or for a request with CL_WIRE_RELOC its own
 * words and their relocation lists (*rbuf, *rlen; *rerr if there are none).
 * False once it has replied with why not instead (EAGAIN: the requester
 * asks the driver). */
static bool worker_copy(cl_zmq_msg *id, const struct cl_wire_hdr *rq, size_t off, size_t len, cl_zmq_msg *body,
                        void **rbuf, size_t *rlen, int *rerr) {
    uint64_t view = 0;
    if (!pages_held(rq->index, rq->count)) {
        reply_err(id, rq->tag, rq, EAGAIN, "page not held by this peer");
        return false;
    }
    if (rewound_for(rq->version, &view)) {
        reply_err(id, rq->tag, rq, EAGAIN, "peer is re-running an older version");
        return false;
    }
    if ((rq->flags & CL_WIRE_RELOC) && (!cl_option_get(CL_OPT_RELOC) || !cl_reloc_held(rq->index, rq->count))) {
        reply_err(id, rq->tag, rq, EAGAIN, "peer holds the page without its relocations");
        return false;
    }
    const char *src = cl_region.fill + off;
    /* A worker's page may be dropped (and its memory punched) while a
     * send is in flight: copy, then check it was held throughout. */
    if (cl_zmq.msg_init_size(body, len) != 0) {
        reply_err(id, rq->tag, rq, ENOMEM, "out of memory");
        return false;
    }
    uint64_t drops = atomic_load(&cl_pt_drops);
    if ((drops & 1) || !pages_held(rq->index, rq->count)) { /* odd: a drop is under way */
        cl_zmq.msg_close(body);
        reply_err(id, rq->tag, rq, EAGAIN, "page dropped while serving it");
        return false;
    }
    memcpy(cl_zmq.msg_data(body), src, len);
    /* A page a task wrote here (an attribute set, a count of references
     * still held) holds this worker's own words: not for a peer, which
     * gets the driver's instead. */
    size_t ps = (size_t)1 << cl_region.page_shift;
    for (uint32_t k = 0; k < rq->count; k++) {
        uint64_t want = cl_region.sums ? atomic_load_explicit(&cl_region.sums[rq->index + k], memory_order_acquire) : 0;
        if (!want || cl_page_sum((char *)cl_zmq.msg_data(body) + k * ps, ps) != want) {
            cl_zmq.msg_close(body);
            CL_COUNT(peer_written, 1);
            reply_err(id, rq->tag, rq, EAGAIN, "page written on this worker");
            return false;
        }
    }
    /* This worker's copy is relocated for its own address space: the
     * driver's words go back for a peer that does not relocate, and a
     * peer that does gets the lists (read before the check below, which
     * voids the copy if the pages were fetched again meanwhile). */
    if (rq->flags & CL_WIRE_RELOC) {
        *rlen = cl_reloc_frame(rq->index, rq->count, rq->version, cl_zmq.msg_data(body), rbuf, rerr);
    } else if (cl_option_get(CL_OPT_RELOC)) {
        cl_reloc_restore(rq->index, rq->count, cl_zmq.msg_data(body));
    }
    atomic_thread_fence(memory_order_acquire);
    /* A change of version during the copy may have swapped in an older
     * version (a lineage re-run), and a drop may have punched a page
     * (zeros) that was fetched again before the check: refuse rather
     * than risk mixing. */
    if (!pages_held(rq->index, rq->count) || atomic_load(&cl_worker_view) != view ||
        atomic_load(&cl_pt_drops) != drops) {
        free(*rbuf);
        *rbuf = NULL;
        cl_zmq.msg_close(body);
        reply_err(id, rq->tag, rq, EAGAIN, "page dropped while serving it");
        return false;
    }
    return true;
}

/* Driver: a request with bases answered from diffs kept: *body the diff,
 * *rbuf its relocations frame if asked for (pages without lists only);
 * the diff's bytes, or 0 (and nothing made) to make the reply anew. */
static size_t driver_kept(const struct cl_wire_hdr *rq, const uint32_t *bases, size_t off, size_t len, cl_zmq_msg *body,
                          void **rbuf, size_t *rlen) {
    size_t kept = 0;
    int rerr = 0;
    if (!cl_alloc_range_used(off, len) || !cl_diff_kept(rq, bases, len, body, &kept)) return 0;
    if (rq->flags & CL_WIRE_RELOC) { /* (pages with relocation lists need their bytes) */
        *rlen = cl_reloc_frame(rq->index, rq->count, rq->version, NULL, rbuf, &rerr);
        if (!*rbuf) {
            cl_zmq.msg_close(body);
            *rlen = 0;
            return 0;
        }
    }
    return kept;
}

/* The PAGES reply: *body (len bytes of pages, sent as a diff or sparse when
 * that is shorter; or, when `kept` is not 0, already a diff of that many
 * bytes from diffs kept), the relocation lists rbuf (rlen bytes; freed
 * here) if any, and the hints for peer `self`; counted as served unless
 * the send fails. */
static void reply_pages(cl_zmq_msg *id, const struct cl_wire_hdr *rq, const uint32_t *bases, int self,
                        cl_zmq_msg *body, size_t len, void *rbuf, size_t rlen, size_t kept) {
    /* Mostly-zero pages travel as their nonzero words, when that halves
     * them (the relocation lists were checked against these bytes). */
    size_t sent = kept ? kept : len;
    bool diff = kept || (bases && cl_region.role == CLAMOR_ROLE_DRIVER && cl_diff_make(body, len, rq, bases, &sent));
    bool sparse = !diff && (rq->flags & CL_WIRE_SPARSE) && sparsen(body, len, &sent);
    size_t hl = hints_for(self, rq);
    rate_take(sent + rlen + hl); /* relocations and hints travel on the same link */
    struct cl_wire_hdr h = {.type = CL_WIRE_PAGES,
                            .flags = (hl ? CL_WIRE_HINTS : 0) | (rbuf ? CL_WIRE_RELOC : 0) | (sparse ? CL_WIRE_SPARSE : 0) |
                                     (diff ? CL_WIRE_DIFF : 0),
                            .index = rq->index,
                            .count = rq->count, .version = rq->version, .tag = rq->tag};
    uint8_t buf[CL_WIRE_HDR];
    cl_wire_encode(&h, buf);
    /* Counted before the send: once the requester has the page, whoever it
     * tells (a task result reaching the driver) sees it counted. */
    CL_COUNT(requests_served, 1);
    CL_COUNT(pages_served, rq->count);
    CL_COUNT(bytes_served, len);
    CL_COUNT(wire_bytes_served, sent);
    if (diff) CL_COUNT(diff_pages_served, rq->count);
    if (kept) CL_COUNT(diff_pages_reused, rq->count);
    cl_zmq.send(S.t.sock, cl_zmq.msg_data(id), cl_zmq.msg_size(id), CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT);
    cl_zmq.send(S.t.sock, buf, sizeof buf, CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT);
    int more = (hl || rbuf) ? CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT : CL_ZMQ_DONTWAIT;
    if (cl_zmq.msg_send(body, S.t.sock, more) < 0) {
        free(rbuf);
        cl_zmq.msg_close(body); /* dropped (the peer went away): not served after all */
        CL_COUNT(requests_served, -(uint64_t)1);
        CL_COUNT(pages_served, -(uint64_t)rq->count);
        CL_COUNT(bytes_served, -(uint64_t)len);
        CL_COUNT(wire_bytes_served, -(uint64_t)sent);
        if (diff) CL_COUNT(diff_pages_served, -(uint64_t)rq->count);
        if (kept) CL_COUNT(diff_pages_reused, -(uint64_t)rq->count);
        return;
    }
    if (rbuf) {
        cl_zmq.send(S.t.sock, rbuf, rlen, hl ? CL_ZMQ_SNDMORE | CL_ZMQ_DONTWAIT : CL_ZMQ_DONTWAIT);
        free(rbuf);
    }
    if (hl && cl_zmq.send(S.t.sock, hint_buf, hl, CL_ZMQ_DONTWAIT) >= 0) CL_COUNT(hint_bytes, hl);
    if (cl_region.role == CLAMOR_ROLE_DRIVER) cl_dir_served(rq->index, rq->count, rq->version, self);
}

static void serve_get(cl_zmq_msg *id, const struct cl_wire_hdr *rq, const uint32_t *bases) {
    if (rq->index >= cl_region.npages || rq->count > cl_region.npages - rq->index) {
        reply_err(id, rq->tag, rq, ERANGE, "pages outside the region");
        return;
    }
    int self = -1;
    if (cl_region.role == CLAMOR_ROLE_DRIVER && redirect(id, rq, bases, &self)) return;
    /* A hinted request skipped the driver, so the driver's check of versions
     * (changed_at) did not happen: serve only in the version it names. */
    if (cl_region.role != CLAMOR_ROLE_DRIVER && (rq->flags & CL_WIRE_DIRECT) &&
        rq->version != atomic_load(&cl_worker_version)) {
        reply_err(id, rq->tag, rq, ESTALE, "direct request for a version this peer is not in");
        return;
    }
    size_t off = (size_t)rq->index << cl_region.page_shift, len = (size_t)rq->count << cl_region.page_shift;
    cl_zmq_msg body;
    void *rbuf = NULL; /* the relocations frame, for a request with CL_WIRE_RELOC */
    size_t rlen = 0;
    int rerr = 0;
    /* the bytes of a diff made of diffs kept, without reading the pages */
    size_t kept = cl_region.role == CLAMOR_ROLE_DRIVER && bases ? driver_kept(rq, bases, off, len, &body, &rbuf, &rlen) : 0;
    if (kept) {
        /* (the reply is ready) */
    } else if (cl_region.role == CLAMOR_ROLE_DRIVER) {
        if (!driver_copy(id, rq, off, len, &body)) return;
        if (rq->flags & CL_WIRE_RELOC)
            rlen = cl_reloc_frame(rq->index, rq->count, rq->version, cl_zmq.msg_data(&body), &rbuf, &rerr);
    } else if (!worker_copy(id, rq, off, len, &body, &rbuf, &rlen, &rerr)) {
        return;
    }
    if ((rq->flags & CL_WIRE_RELOC) && !rbuf) {
        cl_zmq.msg_close(&body);
        reply_err(id, rq->tag, rq, rerr ? rerr : ENOMEM, "cannot list the pages' relocations");
        return;
    }
    reply_pages(id, rq, bases, self, &body, len, rbuf, rlen, kept);
}

/* [hdr][endpoint] from a worker: its page server's endpoint, for the
 * directory (no reply). */
static void serve_register(cl_zmq_msg *id) {
    cl_zmq_msg ep;
    cl_zmq.msg_init(&ep);
    if (cl_zmq.msg_recv(&ep, S.t.sock, 0) >= 0) {
        bool more = cl_zmq.msg_more(&ep);
        if (more) cl_zmq_drain(S.t.sock);
        if (more || cl_region.role != CLAMOR_ROLE_DRIVER ||
            cl_dir_register(cl_zmq.msg_data(id), cl_zmq.msg_size(id), cl_zmq.msg_data(&ep), cl_zmq.msg_size(&ep)) != 0)
            CL_COUNT(bad_requests, 1);
    }
    cl_zmq.msg_close(&ep);
}

/* A GET with DIFF: [hdr][bases], count u32 versions, none 0.  Reads the
 * bases frame into bases: 0, EBADMSG if it is malformed, or -1 if no frame
 * could be read.  *extra says whether more frames follow it. */
static int read_bases(const struct cl_wire_hdr *h, uint32_t *bases, bool *extra) {
    cl_zmq_msg b;
    cl_zmq.msg_init(&b);
    if (cl_zmq.msg_recv(&b, S.t.sock, 0) < 0) {
        cl_zmq.msg_close(&b);
        return -1;
    }
    *extra = cl_zmq.msg_more(&b);
    const uint8_t *p = cl_zmq.msg_data(&b);
    int bad = 0;
    if (cl_zmq.msg_size(&b) != (size_t)h->count * 4) bad = EBADMSG;
    for (uint32_t k = 0; !bad && k < h->count; k++) {
        bases[k] = (uint32_t)p[4 * k] | (uint32_t)p[4 * k + 1] << 8 | (uint32_t)p[4 * k + 2] << 16 |
                   (uint32_t)p[4 * k + 3] << 24;
        if (!bases[k]) bad = EBADMSG;
    }
    cl_zmq.msg_close(&b);
    return bad;
}

static void serve_one(void) {
    cl_zmq_msg id, m;
    cl_zmq.msg_init(&id);
    if (cl_zmq.msg_recv(&id, S.t.sock, CL_ZMQ_DONTWAIT) < 0) {
        cl_zmq.msg_close(&id);
        return;
    }
    if (!cl_zmq.msg_more(&id)) { /* identity alone: nothing to answer */
        cl_zmq.msg_close(&id);
        return;
    }
    cl_zmq.msg_init(&m);
    if (cl_zmq.msg_recv(&m, S.t.sock, 0) < 0) {
        cl_zmq.msg_close(&m);
        cl_zmq.msg_close(&id);
        return;
    }
    bool extra = cl_zmq.msg_more(&m);
    struct cl_wire_hdr h;
    int bad = cl_wire_decode(cl_zmq.msg_data(&m), cl_zmq.msg_size(&m), &h);
    cl_zmq.msg_close(&m);
    if (!bad && h.type == CL_WIRE_REGISTER && extra) {
        serve_register(&id);
        cl_zmq.msg_close(&id);
        return;
    }
    uint32_t bases[CL_WIRE_MAX_COUNT];
    const char *why = extra ? "unexpected extra frames" : "malformed header";
    bool diff = !bad && h.type == CL_WIRE_GET && (h.flags & CL_WIRE_DIFF);
    if (diff && !extra) {
        bad = EBADMSG;
        why = "a diff request without its bases";
    } else if (diff) {
        bad = read_bases(&h, bases, &extra);
        if (bad < 0) {
            cl_zmq.msg_close(&id);
            return;
        }
        why = extra ? "unexpected extra frames" : "malformed bases frame";
    }
    if (extra) {
        cl_zmq_drain(S.t.sock);
        if (!bad) bad = EBADMSG;
    }
    if (bad) {
        CL_COUNT(bad_requests, 1);
        reply_err(&id, h.tag, NULL, bad, why);
    } else if (h.type == CL_WIRE_GET) {
        serve_get(&id, &h, diff ? bases : NULL);
    } else if (h.type == CL_WIRE_HELLO) {
        struct cl_wire_geo g = {cl_region.base, cl_region.size, cl_region.page_size, (uint32_t)cl_region.role, 0};
        uint8_t geo[32];
        cl_wire_geo_encode(&g, geo);
        struct cl_wire_hdr r = {.type = CL_WIRE_HELLO_REPLY, .tag = h.tag};
        reply_hdr(&id, &r, geo, sizeof geo);
    } else {
        CL_COUNT(bad_requests, 1);
        reply_err(&id, h.tag, &h, ENOMSG, "not a request type");
    }
    cl_zmq.msg_close(&id);
}

static void *server_main(void *arg) {
    (void)arg;
    while (!atomic_load(&S.t.stop)) {
        cl_zmq_pollitem it[3] = {{S.t.sock, 0, CL_ZMQ_POLLIN, 0}, {NULL, S.t.pipe_r, CL_ZMQ_POLLIN, 0},
                                 {S.zap, 0, CL_ZMQ_POLLIN, 0}};
        if (cl_zmq.poll(it, S.zap ? 3 : 2, 1000) < 0 && cl_zmq.errno_() == CL_ZMQ_ETERM) break;
        if (it[2].revents & CL_ZMQ_POLLIN) cl_zap_serve(S.zap);
        if (it[0].revents & CL_ZMQ_POLLIN) {
            for (int k = 0; k < 1024; k++) {
                uint32_t ev = 0;
                size_t sz = sizeof ev;
                serve_one();
                if (cl_zmq.getsockopt(S.t.sock, CL_ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & CL_ZMQ_POLLIN)) break;
            }
        }
    }
    buffers_free();
    return NULL;
}

int clamor_server_start(const char *endpoint, char *bound, size_t boundlen) {
    int rc;
    if (S.t.running) return cl_err(EBUSY, "the page server is already running at %s", S.endpoint);
    if (cl_region.role == CLAMOR_ROLE_NONE) return cl_err(ENXIO, "no region: map or attach one first");
    if (!endpoint || !*endpoint) endpoint = "tcp://127.0.0.1:*";
    if ((rc = cl_zmq_require())) return rc;
    if ((rc = cl_thread_open(&S.t, CL_ZMQ_ROUTER))) return rc;
    /* the handler first: a peer that connects before it would be refused */
    if (clamor_security_mode() != CLAMOR_SECURITY_NONE && !(S.zap = cl_zap_open(S.t.ctx))) {
        rc = EPROTO;
        goto err;
    }
    int64_t maxmsg = CL_WIRE_MAX_REQUEST;
    int hwm = 100000;
    cl_zmq.setsockopt(S.t.sock, CL_ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    cl_zmq.setsockopt(S.t.sock, CL_ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (cl_zmq.bind(S.t.sock, endpoint) != 0) {
        int e = cl_zmq.errno_();
        rc = cl_err(e == EADDRINUSE ? EADDRINUSE : EINVAL, "cannot bind the page server to %s: %s", endpoint,
                    cl_zmq.strerror(e));
        goto err;
    }
    size_t sz = sizeof S.endpoint;
    if (cl_zmq.getsockopt(S.t.sock, CL_ZMQ_LAST_ENDPOINT, S.endpoint, &sz) != 0)
        snprintf(S.endpoint, sizeof S.endpoint, "%s", endpoint);
    rate_init();
    if ((rc = cl_thread_start(&S.t, server_main, "clamor-server"))) goto err;
    if (bound && boundlen) snprintf(bound, boundlen, "%s", S.endpoint);
    return 0;
err:
    if (S.zap) cl_zmq.close(S.zap);
    S.zap = NULL;
    cl_thread_close(&S.t);
    return rc;
}

int clamor_server_stop(void) {
    if (!S.t.running) return 0;
    cl_thread_join(&S.t);
    if (S.zap) cl_zmq.close(S.zap);   /* before the context ends: zmq_ctx_term waits for it */
    S.zap = NULL;
    cl_thread_close(&S.t);
    S.endpoint[0] = '\0';
    return 0;
}

int cl_server_stop_after_fork(void) {
    S.zap = NULL;   /* the parent's: abandoned with its context */
    cl_thread_abandon(&S.t);
    S.endpoint[0] = '\0';
    buffers_free(); /* the parent's thread's buffers, copied into this process */
    return 0;
}
