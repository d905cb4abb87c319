/* wire.h -- clamor's data-plane wire format, version 1.  The one place it is
 * written down.
 *
 * Every message is a ZeroMQ multipart message whose first frame is a 32-byte
 * header, little-endian:
 *
 *   off size field    meaning
 *     0    4 magic    "CLMR"
 *     4    1 proto    CL_WIRE_VERSION, the protocol's version; a server
 *                     answers others with an ERROR
 *     5    1 type     enum cl_wire_type
 *     6    2 flags    GET: CL_WIRE_NOREDIRECT (answer with the page,
 *                     not a REDIRECT), CL_WIRE_PEERMISS (the peer named
 *                     in status, minus one, did not have it),
 *                     CL_WIRE_DIRECT (sent to a peer on a hint, without
 *                     asking the driver: served only by a peer that runs
 *                     the request's version), CL_WIRE_RELOC (send
 *                     the pages' relocations), CL_WIRE_SPARSE (the
 *                     requester takes sparse data), CL_WIRE_DIFF (a bases
 *                     frame follows: the requester holds old copies);
 *                     PAGES and REDIRECT:
 *                     CL_WIRE_HINTS (a hints frame follows); PAGES:
 *                     CL_WIRE_RELOC (a relocations frame follows the
 *                     data), CL_WIRE_SPARSE (the data frame is sparse,
 *                     below), CL_WIRE_DIFF (the data frame is a diff
 *                     against the requester's copies, below); other bits
 *                     and other types: reserved, zero
 *     8    4 status   replies: 0 or an errno value (ERROR)
 *    12    4 version  the page version the requester may see (a version
 *                     numbers the state of the region tasks read)
 *    16    8 index    first page, counted from the region base (never an
 *                     address: processes may map the region elsewhere)
 *    24    4 count    pages, 1..CL_WIRE_MAX_COUNT
 *    28    4 tag      chosen by the requester, echoed in the reply
 *
 * Requests (DEALER -> ROUTER; the ROUTER's identity frame is not shown):
 *   GET    [hdr]            ask for pages [index, index+count)
 *   GET    [hdr][bases], with CL_WIRE_DIFF: the same, from a requester that
 *                           holds a copy of each page: bases = count u32,
 *                           the version each copy is (>= 1).
 *                           The driver may answer with a diff; a worker's
 *                           page server ignores the bases, and no server
 *                           redirects such a request.  A version 1 server
 *                           of before diffs answers EPROTO: ask again
 *                           without.
 *   HELLO  [hdr]            ask for the region geometry
 *   REGISTER [hdr][endpoint] a worker's pager names its own page server
 *                           (driver only; no reply)
 * Replies:
 *   PAGES  [hdr][data]      data = count pages, count << page_shift bytes
 *   PAGES  [hdr][sparse], with CL_WIRE_SPARSE, for a GET with it: the same
 *                           count << page_shift bytes as runs of 8-byte
 *                           words, every word outside a run zero.  A run is
 *                           u32 first word (from the start of the data),
 *                           u32 n >= 1, then the n words as they are in
 *                           memory; runs ascend and do not overlap, and
 *                           the frame holds whole runs only (an empty frame:
 *                           all zeros).  A server sends it only when it
 *                           halves the bytes (mostly-zero pages); it may be
 *                           followed by relocs and hints as data is.
 *   PAGES  [hdr][diff], with CL_WIRE_DIFF, for a GET with it: count u64
 *                           sums (cl_page_sum) of the pages as the
 *                           request's version reads them, then runs as in a
 *                           sparse frame of those pages XOR the requester's
 *                           copies (the words that changed).  Sent only
 *                           when shorter than the pages, never sparse;
 *                           relocs (the new pages') may follow.  The
 *                           requester applies it to its copies (the
 *                           driver's words) and checks the sums; a page
 *                           that does not sum right is asked for again
 *                           without DIFF.
 *   PAGES  [hdr][data][relocs], with CL_WIRE_RELOC, for a GET with it:
 *                           relocs = u32 n, then n struct clamor_reloc
 *                           (clamor.h; 16 bytes, word counted from the
 *                           start of data), sorted by word.  A hints
 *                           frame, if any, comes after it.  A worker that
 *                           cannot send them answers EAGAIN.
 *   PAGES  [hdr][data][hints], REDIRECT [hdr][endpoint][hints], with
 *                           CL_WIRE_HINTS: from the driver to a registered
 *                           worker, for a request of the current version.
 *                           hints = u64 first page, then one byte a page
 *                           (at most CL_WIRE_MAX_HINTS): 0 = no hint, k+1 =
 *                           peer k held that page at that version.  Only a
 *                           guess; a peer refuses what it cannot serve.
 *   ERROR  [hdr][text]      status = errno (ENOENT: page never allocated,
 *                           EAGAIN: page not held by this peer, ESTALE: a
 *                           DIRECT request for a version the peer is not in,
 *                           ERANGE: out
 *                           of the region, EPROTO/EBADMSG/ENOMSG: malformed);
 *                           text = a one-line reason, may be empty
 *   HELLO_REPLY [hdr][geo]  geo = struct cl_wire_geo
 *   REDIRECT [hdr][endpoint] ask the peer at endpoint (status = its number);
 *                           if it fails, ask again with NOREDIRECT|PEERMISS
 * A request with any other frame count, size or field value gets an ERROR
 * reply; messages over CL_WIRE_MAX_REQUEST bytes are refused by libzmq
 * (ZMQ_MAXMSGSIZE), which closes that connection.
 */
#ifndef CLAMOR_WIRE_H
#define CLAMOR_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define CL_WIRE_MAGIC 0x524d4c43u /* "CLMR" little-endian */
#define CL_WIRE_VERSION 1
#define CL_WIRE_HDR 32
#define CL_WIRE_MAX_COUNT 256
#define CL_WIRE_MAX_REQUEST 4096
#define CL_WIRE_MAX_HINTS 4096

enum cl_wire_type {
    CL_WIRE_GET = 1,
    CL_WIRE_PAGES = 2,
    CL_WIRE_ERROR = 3,
    CL_WIRE_HELLO = 4,
    CL_WIRE_HELLO_REPLY = 5,
    CL_WIRE_REGISTER = 6,
    CL_WIRE_REDIRECT = 7,
};

#define CL_WIRE_NOREDIRECT 1u
#define CL_WIRE_PEERMISS 2u
/* (4 stays reserved: version 1 servers refused it) */
#define CL_WIRE_DIRECT 8u
#define CL_WIRE_HINTS 16u
#define CL_WIRE_RELOC 32u
#define CL_WIRE_SPARSE 64u
#define CL_WIRE_DIFF 128u

struct cl_wire_hdr {
    uint8_t proto;
    uint8_t type;
    uint16_t flags;
    uint32_t status;
    uint32_t version;
    uint64_t index;
    uint32_t count;
    uint32_t tag;
};

struct cl_wire_geo { /* little-endian on the wire, 32 bytes */
    uint64_t base;
    uint64_t size;
    uint64_t page_size;
    uint32_t role;
    uint32_t reserved;
};

/* Fill out[CL_WIRE_HDR] from h (magic and version set here). */
void cl_wire_encode(const struct cl_wire_hdr *h, uint8_t *out);

/* Parse a header frame.  0, or: EBADMSG (wrong length), EPROTO (bad magic or
 * reserved bits), EPROTONOSUPPORT (version), ENOMSG (unknown type), ERANGE
 * (count out of 1..CL_WIRE_MAX_COUNT for GET/PAGES).  On error, out holds
 * whatever could be read (tag, for the error reply). */
int cl_wire_decode(const void *buf, size_t len, struct cl_wire_hdr *out);

void cl_wire_geo_encode(const struct cl_wire_geo *g, uint8_t *out);
int cl_wire_geo_decode(const void *buf, size_t len, struct cl_wire_geo *out);

/* The sparse form of len bytes at data (len a multiple of 8) into out, at
 * most cap bytes: 0 and *outlen set, or E2BIG when it would not fit (send
 * the data as it is).  Zero gaps of one word stay inside a run (a run's
 * header costs a word). */
int cl_wire_sparse_encode(const void *data, size_t len, void *out, size_t cap, size_t *outlen);

/* Expand a sparse frame of inlen bytes into len bytes at data: 0, or
 * EBADMSG (a truncated run, a run of no words, runs out of order or
 * overlapping, a run past len) with data's contents unspecified. */
int cl_wire_sparse_decode(const void *in, size_t inlen, void *data, size_t len);

/* XOR the runs of a sparse frame of inlen bytes into the len bytes at data
 * (a diff: the words that changed).  0, or EBADMSG as
 * cl_wire_sparse_decode (checked before any byte is changed, so data is
 * untouched on error). */
int cl_wire_diff_apply(const void *in, size_t inlen, void *data, size_t len);

#endif /* CLAMOR_WIRE_H */
