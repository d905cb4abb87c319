/* readahead.c -- the pager's read-ahead (pager thread only): streams
 * spotted among the demand faults, their windows, and the pages claimed
 * for them, handed to the caller's queue (pager.c's): a leaf, it calls
 * nothing of the pager.
 *
 * Read-ahead follows the access pattern, as Linux's does (mm/readahead.c):
 * a stream starts small and grows only while it is used.  Three demand
 * faults on consecutive pages (among the last four faults, since a copy
 * routine may touch pages out of order) start a stream with a window of W =
 * RA_START_BYTES: the pager requests the next 2W pages and leaves the first
 * page of the second half closed when it arrives (HELD).  The first touch
 * of that marker page doubles W, up to B = readahead bytes / 2, and asks
 * for W more, the first of them the next marker.  A sequential scan thus
 * reaches B..2B pages in flight after a few markers and rarely waits; a
 * random lookup never starts a stream, and pages that happen to be
 * touched in threes (a record straddling pages) cost one small window whose
 * marker nobody touches.  readahead_streams counts the streams started,
 * readahead_pages the pages they fetched.
 */
#include "internal.h"

static struct {
    uint64_t recent[4], ra_next; /* last demand faults, to spot streams */
    uint64_t ra_win;             /* the stream's window W, in pages */
    unsigned nrecent;
} R;

void cl_readahead_reset(void) {
    R.ra_next = UINT64_MAX - 1;
    R.ra_win = 0;
    for (unsigned k = 0; k < 4; k++) R.recent[k] = UINT64_MAX - 1;
    R.nrecent = 0;
}

static uint64_t half_window(void) {
    return (uint64_t)(cl_option_get(CL_OPT_READAHEAD) / 2) >> cl_region.page_shift;
}

/* A new stream's window: small, so a stream nobody follows costs little. */
#define RA_START_BYTES (256u << 10)

static uint64_t start_window(uint64_t b) {
    uint64_t w = (uint64_t)RA_START_BYTES >> cl_region.page_shift;
    return w < 1 ? 1 : w > b ? b : w;
}

/* The stream's marker was touched: it is being followed, so its window
 * doubles (up to b).  Returns the new window. */
static uint64_t grow_window(uint64_t b) {
    R.ra_win = R.ra_win < 1 ? start_window(b) : 2 * R.ra_win;
    if (R.ra_win > b) R.ra_win = b;
    return R.ra_win;
}

/* Claim the ABSENT pages from ra_next up to `end` and queue them, chunked;
 * page `marker` (if among them) is left HELD on arrival. */
static void read_ahead(uint64_t end, uint64_t marker, cl_readahead_queue queue) {
    if (end > cl_region.npages) end = cl_region.npages;
    while (R.ra_next < end) {
        uint64_t s = R.ra_next;
        while (R.ra_next < end) {
            uint32_t exp = CL_PG_ABSENT;
            if (!atomic_compare_exchange_strong(&cl_region.pages[R.ra_next], &exp, CL_PG_WANTED)) break;
            R.ra_next++;
        }
        if (R.ra_next > s) {
            int64_t m = (marker >= s && marker < R.ra_next) ? (int64_t)marker : -1;
            queue(s, (uint32_t)(R.ra_next - s), m);
        } else {
            R.ra_next++; /* present or in flight already: skip it */
        }
    }
}

void cl_readahead_demand(uint64_t idx, cl_readahead_queue queue) {
    uint64_t b = half_window();
    bool one = false, two = false; /* idx-1 and idx-2 among the recent faults */
    for (unsigned k = 0; k < 4; k++) {
        one |= idx == R.recent[k] + 1;
        two |= idx == R.recent[k] + 2;
    }
    if (b && one && two) { /* sequential */
        if (R.ra_next <= idx || R.ra_next > idx + 1 + 2 * b) { /* a new stream */
            R.ra_next = idx + 1;
            R.ra_win = start_window(b);
            CL_COUNT(readahead_streams, 1);
        }
        /* else the faults caught up with the stream: it keeps its window */
        uint64_t w = R.ra_win < 1 ? start_window(b) : R.ra_win > b ? b : R.ra_win;
        read_ahead(idx + 1 + 2 * w, idx + 1 + w, queue);
    }
    /* a few positions, since a copy routine may touch pages out of order */
    R.recent[R.nrecent++ % 4] = idx;
}

void cl_readahead_marker(uint64_t idx, cl_readahead_queue queue) {
    uint64_t b = half_window();
    R.recent[R.nrecent++ % 4] = idx;
    if (!b) return;
    if (R.ra_next <= idx) R.ra_next = idx + 1;
    read_ahead(R.ra_next + grow_window(b), R.ra_next, queue);
}

void cl_readahead_marker_waited(uint64_t end, cl_readahead_queue queue) {
    uint64_t b = half_window();
    if (!b) return;
    if (R.ra_next < end) R.ra_next = end;
    read_ahead(R.ra_next + grow_window(b), R.ra_next, queue);
}
