/* pager.c -- the worker's pager thread: fault requests in, pages fetched,
 * installed, waiters woken.
 *
 * DESIGN.  One C thread per worker process owns a DEALER socket connected
 * to the driver's page server and the read end of a pipe.  The fault handler
 * (fault.c) and clamor_prefetch() mark a page WANTED and write its index to
 * the pipe; they then sleep on the page's state word.  The pager turns the
 * indices into GET requests, keeps up to MAX_INFLIGHT of them in flight
 * (libzmq adds ~150 us per round trip here, so pipelining matters more than
 * a fast handler), writes each reply into the memfd with pwrite(2) (pagein.c;
 * the public view is still closed), opens the public view (pagetable.c) and wakes
 * the sleepers.  It never takes the GIL.
 *
 * Read-ahead (readahead.c) asks for more than the faults did: it queues
 * runs of pages, one of them a marker left HELD on arrival.
 *
 * Replication: the driver may answer with REDIRECT to a peer, and its
 * replies carry hints that send later fetches straight to a peer (peers.c).
 * A peer that fails or stays silent sends the fetch back to the driver.
 *
 * Diffs: a run of pages whose old copies the worker kept (pagetable.c) is
 * asked of the driver with DIFF and the version of each copy, alone in its
 * request (runs are cut where kept copies begin or end) and never of a
 * peer.  A diff reply is applied (pagein.c) to the copies read back from the memfd,
 * and each page rebuilt must sum as the driver's (the copy may hold this
 * worker's own writes, or not be the version it names): else the pages
 * are asked for again whole.  A worker that relocates puts the driver's
 * words back into its copies first (reloc.c), and relocates the rebuilt
 * pages by the list that comes with the diff.  A driver of before diffs answers EPROTO; the
 * pager then asks it again without, and no more diffs of it.
 *
 * Pipe messages are 8-byte words (internal.h): a page index, with
 * CL_REQ_MARKER when the page was HELD, or a range from clamor_prefetch()
 * (prefetch.c).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "wire.h"
#include "zmqdl.h"

#define MAX_INFLIGHT 64
#define PENDING_CAP 8192
#define MSG_STOP CL_THREAD_STOP

enum kind { K_DEMAND, K_AHEAD, K_PREFETCH };

struct req {
    uint64_t first;
    uint32_t count;
    uint8_t kind;
    uint8_t used;
    uint16_t gen;
    int64_t marker; /* page left HELD on arrival, or -1 */
    uint64_t sent_ns;
    uint64_t first_ns; /* when the first request went out (latency) */
    int peer;          /* -1: asked the driver; else the peer it was sent to */
    bool direct;       /* sent to that peer on a hint, not on a redirect */
    bool diff;         /* every page has a kept copy: ask the driver for a diff */
    bool diff_sent;    /* the request on the wire asked for one */
    uint16_t flags;    /* of the request on the wire (DIFF aside), */
    uint32_t status;   /* and its status: to ask again the same way */
};

#define PEER_TIMEOUT_NS 1000000000ull /* a silent peer: ask the driver instead */

struct run {
    uint64_t first;
    uint32_t count;
    uint8_t kind;
    int64_t marker;
};

static struct pager {
    struct cl_thread t; /* thread.c */
    char endpoint[256];
    struct req inflight[MAX_INFLIGHT];
    unsigned ninflight;
    struct run pending[PENDING_CAP];
    unsigned phead, plen;
    bool no_diffs; /* the driver refused a diff request (a server of before diffs) */
} P = {.t = CL_THREAD_INIT};

static uint32_t chunk_pages(void) {
    uint32_t c = (uint32_t)((1u << 20) >> cl_region.page_shift);
    return c ? (c > CL_WIRE_MAX_COUNT ? CL_WIRE_MAX_COUNT : c) : 1;
}

static void pend(uint64_t first, uint32_t count, uint8_t kind, int64_t marker);

/* ---- failing pages --------------------------------------------------------- */

/* A fetch of [first, first+count) failed.  Pages someone waits for become
 * ERROR (the waiter reports it); pages only read ahead go back to ABSENT so a
 * later touch asks again. */
static void fail_run(uint64_t first, uint32_t count, int err, bool demanded) {
    /* read-ahead past the end of what the driver allocated is expected */
    if (demanded) CL_COUNT(fetch_errors, 1);
    for (uint64_t i = first; i < first + count; i++) {
        _Atomic uint32_t *w = &cl_region.pages[i];
        uint32_t exp = CL_PG_WANTED;
        if (!demanded && atomic_compare_exchange_strong(w, &exp, CL_PG_ABSENT)) continue;
        if (CL_PG_STATE(exp) != CL_PG_WANTED) continue;
        /* invalidated meanwhile and nobody waits: it is simply absent */
        if ((exp & CL_PG_STALE) && !(exp & CL_PG_WAITERS) && atomic_compare_exchange_strong(w, &exp, CL_PG_ABSENT))
            continue;
        /* A request of an earlier version (read-ahead a task left behind) for a
         * page that has changed since: the version it named is gone, but the
         * thread waiting now runs a later task, which dropped the page.  Ask
         * again at the version the worker is in now. */
        if (err == ESTALE && (exp & CL_PG_STALE) && atomic_compare_exchange_strong(w, &exp, CL_PG_WANTED | CL_PG_WAITERS)) {
            pend(i, 1, K_DEMAND, -1);
            continue;
        }
        atomic_store(w, CL_PG_MKERR(err));
        cl_futex_wake(w);
    }
}

/* ---- sending ---------------------------------------------------------------- */

static void pend(uint64_t first, uint32_t count, uint8_t kind, int64_t marker) {
    if (P.plen == PENDING_CAP) { /* cannot happen: reading stops before */
        fail_run(first, count, ENOBUFS, true);
        return;
    }
    P.pending[(P.phead + P.plen) % PENDING_CAP] = (struct run){first, count, kind, marker};
    P.plen++;
}

static void pend_ahead(uint64_t first, uint32_t count, int64_t marker) { pend(first, count, K_AHEAD, marker); }

static bool diffs_now(void) { return !P.no_diffs && cl_pt_diffs_on(); }

/* How many of the n pages from `first` agree with the first on having a
 * kept copy (a request asks for a diff of all its pages or of none). */
static uint32_t same_kept(uint64_t first, uint32_t n) {
    bool k0 = cl_pt_kept(first) != 0;
    uint32_t i = 1;
    while (i < n && (cl_pt_kept(first + i) != 0) == k0) i++;
    return i;
}

/* Send q's GET on sock with flags and status: to the driver, with DIFF and
 * the bases frame when q asks for a diff and every page still has its
 * kept copy.  false if libzmq refused it. */
static bool send_get(void *sock, struct req *q, unsigned slot, uint16_t flags, uint32_t status) {
    uint8_t bases[4 * CL_WIRE_MAX_COUNT];
    bool diff = q->diff && sock == P.t.sock && diffs_now();
    for (uint32_t k = 0; diff && k < q->count; k++) {
        uint32_t b = cl_pt_kept(q->first + k);
        if (!b) diff = false; /* dropped meanwhile: the pages whole */
        for (int i = 0; i < 4; i++) bases[4 * k + i] = (uint8_t)(b >> (8 * i));
    }
    struct cl_wire_hdr h = {.type = CL_WIRE_GET,
                            .flags = flags | (cl_option_get(CL_OPT_RELOC) ? CL_WIRE_RELOC : 0) | CL_WIRE_SPARSE |
                                     (diff ? CL_WIRE_DIFF : 0),
                            .status = status, .index = q->first,
                            .count = q->count, .version = atomic_load(&cl_worker_version),
                            .tag = (uint32_t)q->gen << 16 | slot};
    uint8_t buf[CL_WIRE_HDR];
    cl_wire_encode(&h, buf);
    q->flags = flags;
    q->status = status;
    q->diff_sent = diff;
    q->sent_ns = cl_now_ns();
    if (cl_zmq.send(sock, buf, sizeof buf, diff ? CL_ZMQ_SNDMORE : 0) != (int)sizeof buf) return false;
    return !diff || cl_zmq.send(sock, bases, 4 * (size_t)q->count, 0) == (int)(4 * q->count);
}

static int send_one(struct run *r) {
    unsigned slot = 0;
    while (P.inflight[slot].used) slot++;
    struct req *q = &P.inflight[slot];
    q->gen++;
    q->first = r->first;
    q->count = r->count;
    /* kept copies: a diff from the driver, not the pages from a peer */
    q->diff = diffs_now() && cl_pt_kept(r->first) && same_kept(r->first, r->count) == r->count;
    int peer = q->diff ? -1 : cl_hints_peer(r->first, r->count, atomic_load(&cl_worker_version));
    if (!send_get(peer >= 0 ? cl_peer_sock(peer) : P.t.sock, q, slot, peer >= 0 ? CL_WIRE_DIRECT : 0, 0)) {
        fail_run(r->first, r->count, EIO, r->kind != K_AHEAD);
        return -1;
    }
    if (r->kind != K_DEMAND) cl_pagein_prepare(r->first, r->count); /* the faulting thread does its own */
    q->kind = r->kind;
    q->marker = r->marker;
    q->first_ns = q->sent_ns;
    q->peer = peer;
    q->direct = peer >= 0;
    q->used = 1;
    P.ninflight++;
    CL_COUNT(fetch_requests, 1);
    if (peer >= 0) CL_COUNT(peer_direct, 1);
    return 0;
}

static void flush_pending(void) {
    while (P.plen && P.ninflight < MAX_INFLIGHT) {
        struct run *r = &P.pending[P.phead];
        uint32_t c = chunk_pages();
        if (diffs_now()) c = same_kept(r->first, r->count < c ? r->count : c);
        if (r->count > c) { /* split off one chunk */
            struct run head = {r->first, c, r->kind, -1};
            if (r->marker >= (int64_t)r->first && r->marker < (int64_t)(r->first + c)) {
                head.marker = r->marker;
                r->marker = -1; /* the rest must not read further on its own */
            }
            r->first += c;
            r->count -= c;
            send_one(&head);
            continue;
        }
        send_one(r);
        P.phead = (P.phead + 1) % PENDING_CAP;
        P.plen--;
    }
}

static void on_demand(uint64_t idx) {
    if (atomic_load(&cl_region.map_on) && cl_map_run(idx, true, false) == 0) return;
    pend(idx, 1, K_DEMAND, -1);
    cl_readahead_demand(idx, pend_ahead);
}

static void on_marker(uint64_t idx) {
    /* Data is in the fill view already; open it, then read further. */
    cl_pt_install(idx, 1);
    cl_readahead_marker(idx, pend_ahead);
}

static void on_range(uint64_t first, uint32_t count) {
    if (!atomic_load(&cl_region.map_on)) {
        pend(first, count, K_PREFETCH, -1);
        return;
    }
    /* same host: map what can be mapped, fetch the rest */
    uint64_t run = first, end = first + count;
    for (uint64_t i = first; i < end; i++) {
        if (cl_map_run(i, true, false) != 0) continue;
        if (i > run) pend(run, (uint32_t)(i - run), K_PREFETCH, -1);
        run = i + 1;
    }
    if (end > run) pend(run, (uint32_t)(end - run), K_PREFETCH, -1);
}

/* ---- receiving -------------------------------------------------------------- */

static void install_run(struct req *q) {
    uint64_t first = q->first, end = q->first + q->count;
    if (q->marker >= 0) {
        uint64_t m = (uint64_t)q->marker;
        uint32_t exp = CL_PG_WANTED;
        if (atomic_compare_exchange_strong(&cl_region.pages[m], &exp, CL_PG_HELD)) {
            if (m > first) cl_pt_install(first, (uint32_t)(m - first));
            if (m + 1 < end) cl_pt_install(m + 1, (uint32_t)(end - m - 1));
            return;
        }
        /* someone already waits on the marker: open it and read further */
        cl_pt_install(first, q->count);
        cl_readahead_marker_waited(end, pend_ahead);
        return;
    }
    cl_pt_install(first, q->count);
}

static void finish(struct req *q) {
    q->used = 0;
    P.ninflight--;
}

/* The peer did not deliver: ask the driver, which forgets that holder
 * unless the peer only ran another version (`missing` false).  After a hint
 * the driver may still redirect; after a redirect it serves the page. */
static void back_to_driver(struct req *q, unsigned slot, bool missing) {
    uint32_t peer = (uint32_t)q->peer + 1;
    uint16_t flags = (missing ? CL_WIRE_PEERMISS : 0) | (q->direct ? 0 : CL_WIRE_NOREDIRECT);
    q->peer = -1;
    q->direct = false;
    CL_COUNT(peer_fallbacks, 1);
    send_get(P.t.sock, q, slot, flags, missing ? peer : 0);
}

static void follow_redirect(struct req *q, unsigned slot, const struct cl_wire_hdr *h) {
    char ep[256];
    int n = cl_zmq.recv(P.t.sock, ep, sizeof ep - 1, 0);
    if (n > 0 && (h->flags & CL_WIRE_HINTS)) cl_hints_take(P.t.sock, h->version);
    cl_zmq_drain(P.t.sock);
    void *s = NULL;
    if (n > 0 && n < (int)sizeof ep) {
        ep[n] = '\0';
        int k = (int)h->status;
        if (cl_peer_sock(k) && !cl_peer_is(k, ep)) {
            /* the number is a new peer's now: what is still asked of the
             * old one on the socket about to close goes to the driver */
            for (unsigned i = 0; i < MAX_INFLIGHT; i++)
                if (P.inflight[i].used && P.inflight[i].peer == k && &P.inflight[i] != q)
                    back_to_driver(&P.inflight[i], i, false);
        }
        s = cl_peer_connect(P.t.ctx, k, ep);
    }
    if (!s) {
        send_get(P.t.sock, q, slot, CL_WIRE_NOREDIRECT, 0);
        return;
    }
    q->peer = (int)h->status;
    CL_COUNT(redirects, 1);
    send_get(s, q, slot, 0, 0);
}

/* A reply with no pages to write (a redirect, an error, a peer's refusal,
 * anything malformed): the request is sent again, elsewhere or without a
 * diff, or its pages fail.  false if the reply brings q's pages. */
static bool no_pages(void *sock, struct req *q, unsigned slot, const struct cl_wire_hdr *h, int bad, bool from_peer) {
    bool demanded = q->kind != K_AHEAD;
    if (!bad && !from_peer && h->type == CL_WIRE_REDIRECT) {
        follow_redirect(q, slot, h);
        return true;
    }
    if (from_peer && (bad || h->type != CL_WIRE_PAGES)) { /* invalidated, evicted, confused, other version */
        cl_zmq_drain(sock);
        back_to_driver(q, slot, bad || h->type != CL_WIRE_ERROR || h->status != ESTALE);
        return true;
    }
    if (bad || (h->type != CL_WIRE_PAGES && h->type != CL_WIRE_ERROR)) {
        cl_zmq_drain(sock);
        fail_run(q->first, q->count, EPROTO, demanded);
        finish(q);
        return true;
    }
    if (h->type == CL_WIRE_ERROR && q->diff_sent && (h->status == EPROTO || h->status == EBADMSG)) {
        /* a driver of before diffs: the same request without, and no more */
        cl_zmq_drain(sock);
        P.no_diffs = true;
        q->diff = false;
        send_get(P.t.sock, q, slot, q->flags, q->status);
        return true;
    }
    if (h->type == CL_WIRE_ERROR) {
        cl_zmq_drain(sock);
        fail_run(q->first, q->count, h->status ? (int)h->status : EIO, demanded);
        finish(q);
        return true;
    }
    return false;
}

/* q's pages came but could not be written (rc, from cl_pagein_write): a
 * diff on a wrong base is asked for again whole, a peer's bad frame of the
 * driver; else the pages fail. */
static void not_written(struct req *q, unsigned slot, int rc, bool from_peer) {
    if (rc == EILSEQ) { /* a kept copy was not the version it named: the pages whole */
        CL_COUNT(diff_retries, 1);
        cl_pt_unkeep(q->first, q->count, false);
        q->diff = false;
        send_get(P.t.sock, q, slot, q->flags, q->status);
        return;
    }
    if (from_peer && rc == EBADMSG) {
        back_to_driver(q, slot, true);
        return;
    }
    if (q->diff_sent) cl_pt_unkeep(q->first, q->count, true); /* never a base again */
    fail_run(q->first, q->count, rc, q->kind != K_AHEAD);
    finish(q);
}

static void on_reply(void *sock) {
    cl_zmq_msg m;
    cl_zmq.msg_init(&m);
    if (cl_zmq.msg_recv(&m, sock, CL_ZMQ_DONTWAIT) < 0) {
        cl_zmq.msg_close(&m);
        return;
    }
    struct cl_wire_hdr h;
    int bad = cl_wire_decode(cl_zmq.msg_data(&m), cl_zmq.msg_size(&m), &h);
    cl_zmq.msg_close(&m);
    unsigned slot = h.tag & 0xffff;
    struct req *q = slot < MAX_INFLIGHT ? &P.inflight[slot] : NULL;
    bool from_peer = sock != P.t.sock;
    if (!q || !q->used || q->gen != (uint16_t)(h.tag >> 16) ||
        (from_peer ? q->peer < 0 || cl_peer_sock(q->peer) != sock : q->peer >= 0)) { /* late or foreign */
        cl_zmq_drain(sock);
        return;
    }
    if (no_pages(sock, q, slot, &h, bad, from_peer)) return;
    size_t len = (size_t)q->count << cl_region.page_shift;
    int rc = EBADMSG, more = 0;
    size_t sz = sizeof more;
    cl_zmq.getsockopt(sock, CL_ZMQ_RCVMORE, &more, &sz);
    bool relocs = cl_option_get(CL_OPT_RELOC);
    /* a diff only answers a request for one (so only from the driver), and
     * never comes sparse; its relocations are the new pages' */
    bool diff = h.flags & CL_WIRE_DIFF;
    if (h.index == q->first && h.count == q->count && more && relocs == !!(h.flags & CL_WIRE_RELOC) &&
        (!diff || (q->diff_sent && !from_peer && !(h.flags & CL_WIRE_SPARSE)))) {
        cl_pagein_announce(q->first, q->count);
        rc = cl_pagein_write(sock, q->first, q->count, len, relocs, h.flags & CL_WIRE_SPARSE, diff);
    }
    if (rc == 0 && !from_peer && (h.flags & CL_WIRE_HINTS)) cl_hints_take(sock, h.version);
    cl_zmq_drain(sock);
    if (rc) {
        not_written(q, slot, rc, from_peer);
        return;
    }
    uint64_t ns = cl_now_ns() - q->first_ns;
    if (q->kind == K_DEMAND) cl_stats_latency(ns);
    CL_COUNT(pages_fetched, q->count);
    CL_COUNT(bytes_fetched, len);
    if (from_peer) {
        CL_COUNT(pages_from_peers, q->count);
        CL_COUNT(bytes_from_peers, len);
    }
    if (q->kind == K_AHEAD) CL_COUNT(readahead_pages, q->count);
    struct req done = *q;
    finish(q);
    install_run(&done);
}

static void check_timeouts(void) {
    uint64_t now = cl_now_ns(), lim = cl_option_get(CL_OPT_FETCH_TIMEOUT_MS) * 1000000ull;
    for (unsigned i = 0; i < MAX_INFLIGHT; i++) {
        struct req *q = &P.inflight[i];
        if (q->used && q->peer >= 0 && now - q->sent_ns > PEER_TIMEOUT_NS) {
            cl_peer_silent(q->peer); /* no more hinted requests to it until a redirect */
            CL_COUNT(peer_timeouts, 1);
            back_to_driver(q, i, true);
            continue;
        }
        if (q->used && now - q->first_ns > lim) {
            fail_run(q->first, q->count, ETIMEDOUT, q->kind != K_AHEAD);
            finish(q);
        }
    }
}

/* ---- the thread ------------------------------------------------------------- */

static void drain_pipe(void) {
    uint64_t buf[256];
    while (P.plen < PENDING_CAP - 2 * 256) {
        ssize_t n = read(P.t.pipe_r, buf, sizeof buf);
        if (n <= 0) return;
        for (ssize_t i = 0; i < n / 8; i++) {
            uint64_t v = buf[i];
            if (v == MSG_STOP) atomic_store(&P.t.stop, 1);
            else if ((v & CL_REQ_POPULATE) == CL_REQ_POPULATE)
                cl_map_populate(v & CL_REQ_INDEX, (v >> 40) & CL_REQ_MAXRUN);
            else if (v & CL_REQ_RANGE) on_range(v & CL_REQ_INDEX, (uint32_t)((v >> 40) & CL_REQ_MAXRUN));
            else if (v & CL_REQ_MARKER) on_marker(v & ~CL_REQ_MARKER);
            else on_demand(v);
        }
    }
}

static void *pager_main(void *arg) {
    (void)arg;
    while (!atomic_load(&P.t.stop)) {
        cl_zmq_pollitem it[2 + CL_PEERS_MAX] = {{P.t.sock, 0, CL_ZMQ_POLLIN, 0}, {NULL, P.t.pipe_r, CL_ZMQ_POLLIN, 0}};
        int n = 2 + cl_peer_pollitems(it + 2);
        long timeout = P.ninflight ? 100 : 1000;
        if (P.plen >= PENDING_CAP - 2 * 256) it[1].events = 0;
        if (cl_zmq.poll(it, n, timeout) < 0 && cl_zmq.errno_() == CL_ZMQ_ETERM) break;
        if (it[1].revents & CL_ZMQ_POLLIN) drain_pipe();
        for (int j = 0; j < n; j++) {
            if (j == 1 || !(it[j].revents & CL_ZMQ_POLLIN)) continue;
            for (int k = 0; k < 4096; k++) {
                uint32_t ev = 0;
                size_t sz = sizeof ev;
                on_reply(it[j].socket);
                if (cl_zmq.getsockopt(it[j].socket, CL_ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & CL_ZMQ_POLLIN))
                    break;
            }
        }
        flush_pending();
        check_timeouts();
    }
    cl_pagein_free();
    return NULL;
}

int clamor_pager_start(const char *endpoint) {
    int rc;
    if (P.t.running) return cl_err(EBUSY, "the pager is already running (connected to %s)", P.endpoint);
    if (cl_region.role != CLAMOR_ROLE_WORKER)
        return cl_err(ENXIO, "no worker region: call clamor_region_attach() first");
    if (!endpoint || !*endpoint) return cl_err(EINVAL, "no page-server endpoint given");
    if ((rc = cl_zmq_require())) return rc;
    if ((rc = clamor_fault_install()) > 0) return rc;
    cl_option_env(CL_OPT_FETCH_TIMEOUT_MS);
    memset(P.inflight, 0, sizeof P.inflight);
    P.ninflight = P.phead = P.plen = 0;
    cl_readahead_reset();
    snprintf(P.endpoint, sizeof P.endpoint, "%s", endpoint);
    if ((rc = cl_thread_open(&P.t, CL_ZMQ_DEALER))) return rc;
    fcntl(P.t.pipe_w, F_SETPIPE_SZ, 1 << 20);
    if (cl_zmq.connect(P.t.sock, endpoint) != 0) {
        rc = cl_err(EINVAL, "cannot connect the pager to %s: %s", endpoint, cl_zmq.strerror(cl_zmq.errno_()));
        goto err;
    }
    cl_peer_close_all(false);
    const char *mine = clamor_server_endpoint();
    if (*mine) { /* name our page server, so the driver may send peers to it */
        struct cl_wire_hdr h = {.type = CL_WIRE_REGISTER};
        uint8_t buf[CL_WIRE_HDR];
        cl_wire_encode(&h, buf);
        cl_zmq.send(P.t.sock, buf, sizeof buf, CL_ZMQ_SNDMORE);
        cl_zmq.send(P.t.sock, mine, strlen(mine), 0);
    }
    if ((rc = cl_thread_start(&P.t, pager_main, "clamor-pager"))) goto err;
    atomic_store(&cl_fault_wake_fd, P.t.pipe_w);
    return 0;
err:
    cl_thread_close(&P.t);
    return rc;
}

int clamor_pager_stop(void) {
    if (!P.t.running) return 0;
    atomic_store(&cl_fault_wake_fd, -1);
    cl_thread_join(&P.t);
    cl_peer_close_all(false); /* sockets of P.t's context: before it ends */
    cl_thread_close(&P.t);
    /* Anything still wanted will never arrive. */
    for (unsigned i = 0; i < MAX_INFLIGHT; i++)
        if (P.inflight[i].used) fail_run(P.inflight[i].first, P.inflight[i].count, ESHUTDOWN, true);
    for (unsigned i = 0; i < P.plen; i++) {
        struct run *r = &P.pending[(P.phead + i) % PENDING_CAP];
        fail_run(r->first, r->count, ESHUTDOWN, true);
    }
    P.plen = P.ninflight = 0;
    cl_pagein_free(); /* the parent's thread's buffer, copied into this process */
    return 0;
}

int cl_pager_stop_after_fork(void) {
    /* The thread did not survive fork; its libzmq context must not be used
     * (libzmq is not fork-safe), so it is abandoned, not closed. */
    atomic_store(&cl_fault_wake_fd, -1);
    cl_thread_abandon(&P.t);
    cl_peer_close_all(true); /* abandoned with the parent's libzmq state */
    P.plen = P.ninflight = 0;
    cl_pagein_free(); /* the parent's thread's buffer, copied into this process */
    return 0;
}
