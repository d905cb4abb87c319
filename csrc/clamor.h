/* clamor.h -- the C contract of clamor's core.
 *
 * clamor keeps large global variables in one global region: memory mapped at
 * the same fixed virtual address in every process of a cluster.  The driver
 * process writes the region; worker processes read it, and every page they
 * touch is fetched on demand over ZeroMQ by a SIGSEGV handler and a pager
 * thread.  Pages are named on the wire by their index from the region base,
 * never by address.
 *
 * This header is what a C program may call: the region, the fault handler,
 * page I/O (the pager, the page server, prefetch, tunables, security), the
 * allocator, heap redirection and statistics.  The machinery that clamor's
 * Python runtime drives on top (page versions, invalidation, relocations,
 * replication, same-host mapping) is declared in csrc/binding.h, which is
 * not installed and may change with any release.
 *
 * THE CONTRACT.  Every function below says:
 *   - what it returns.  A function returning int returns 0 on success or a
 *     positive errno value, and clamor_last_error() then holds a one-line
 *     detail for the calling thread; allocation functions follow malloc(3)
 *     (NULL and errno).  Bad arguments never crash the process.
 *   - Thread: which threads may call it.  "any" means any thread, also
 *     concurrently with itself and with the other functions marked "any";
 *     "one at a time" means not concurrently with the calls it names.
 *   - Signal: whether it is async-signal-safe (signal-safety(7)).  Only a
 *     function marked "safe" may be called from a signal handler, and so
 *     from a SIGSEGV handler of the program's own that clamor's handler
 *     chains to (faults outside the region, clamor_fault_install()).  None
 *     may be called from inside clamor's own fault handling: clamor calls
 *     back into no program code while it handles a fault.
 *
 * A worker's region memory is readable only once the pager runs; touching a
 * page is then a (possibly remote) page fetch that the calling thread waits
 * for.  System calls that read or write region memory see a page not yet
 * fetched as EFAULT rather than a fault: call clamor_prefetch() first.
 */
#ifndef CLAMOR_H
#define CLAMOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the region --------------------------------------------------------- */

/* Default base and size of the global region.  The base lies far above the
 * heap and executable of a PIE process (0x55.., 0x56..) and far below the
 * top-down mmap area (0x7f..), so it is free in a fresh process. */
#define CLAMOR_DEFAULT_BASE ((uintptr_t)0x200000000000ULL)
#define CLAMOR_DEFAULT_SIZE ((size_t)64 << 30)
#define CLAMOR_DEFAULT_PAGE_SIZE ((size_t)64 << 10)
#define CLAMOR_MIN_PAGE_SIZE ((size_t)4 << 10)
#define CLAMOR_MAX_PAGE_SIZE ((size_t)4 << 20)

enum clamor_role { CLAMOR_ROLE_NONE = 0, CLAMOR_ROLE_DRIVER = 1, CLAMOR_ROLE_WORKER = 2 };

/* Map the region in this process as its driver (the only writer): `size`
 * bytes at `base`, readable and writable, backed by a memfd, MAP_NORESERVE,
 * so pages cost memory only once written.  0 for base, size or page_size
 * takes the default (CLAMOR_BASE, CLAMOR_REGION_SIZE, CLAMOR_PAGE_SIZE in
 * the environment, else the CLAMOR_DEFAULT_* above).  page_size must be a power
 * of two in [CLAMOR_MIN_PAGE_SIZE, CLAMOR_MAX_PAGE_SIZE]; base and size
 * must be multiples of it.
 * Returns 0; EEXIST if the address range is taken (the detail names the
 * range), EBUSY if this process already has a region, EINVAL for bad
 * geometry, or the errno of memfd_create(2)/mmap(2).
 * Thread: one at a time with the other region calls (init, attach, close).
 * Signal: no. */
int clamor_region_init(uintptr_t base, size_t size, size_t page_size);

/* Map the region in this process as a worker: every page not present until
 * a fault fetches it (clamor_pager_start()).  Same arguments and errors as
 * clamor_region_init().
 * A child forked from a process that has a region becomes a worker by
 * itself: from a pthread_atfork() child handler the region is replaced
 * (same address) by a fresh mapping with every page not present, no thread
 * of the parent survives, and if the parent served pages the child starts
 * its own page server and its pager (connected to the parent), so it may
 * touch region memory from its first instruction.
 * Thread: one at a time with the other region calls.  Signal: no. */
int clamor_region_attach(uintptr_t base, size_t size, size_t page_size);

/* Unmap the region and forget its state, stopping the pager and the page
 * server first.  Any later access to the old range is an ordinary SIGSEGV.
 * Returns 0 (also with no region); EBUSY if a thread is inside a heap block
 * (clamor_heap_enter()): its next allocation would land in unmapped memory.
 * Thread: one at a time with the other region calls, and with no other
 * thread touching region memory.  Signal: no. */
int clamor_region_close(void);

/* Geometry and role of this process's region: 0 (CLAMOR_ROLE_NONE) when it
 * has none.  A signal handler may use them to tell a region address from
 * another.
 * Thread: any.  Signal: safe. */
uintptr_t clamor_region_base(void);
size_t clamor_region_size(void);
size_t clamor_page_size(void);
int clamor_region_role(void);

/* ---- the fault handler ---------------------------------------------------- */

/* Install clamor's SIGSEGV handler in front (idempotent; the pager and the
 * first version of a driver install it themselves).  Faults outside the
 * region, and signals sent with kill(2), are passed to the handler that was
 * installed before, in its own calling convention (SA_SIGINFO or not);
 * SIG_DFL and SIG_IGN let the fault kill the process as it would have
 * without clamor.  Returns 0, or the errno of sigaction(2).
 * Thread: any.  Signal: no. */
int clamor_fault_install(void);
/* Re-install clamor's handler in front if another (CPython's
 * faulthandler.enable(), say) replaced it since, chaining to that one.
 * Returns 0 if clamor's was first already, -1 if it had to re-install, or
 * the errno of sigaction(2).
 * Thread: any.  Signal: no. */
int clamor_fault_ensure_first(void);
/* 1 if clamor's handler is the one the kernel calls for SIGSEGV, else 0.
 * Thread: any.  Signal: safe (sigaction(2) only). */
int clamor_fault_is_first(void);

/* ---- page I/O: the pager (workers) ----------------------------------------- */

/* Start the pager thread, fetching pages from the page server at
 * `endpoint` (tcp:// or ipc://), and install the fault handler.  libzmq is
 * loaded on first need (CLAMOR_LIBZMQ, else libzmq.so.5).
 * Returns 0; EBUSY if the pager runs already (in a forked child it starts
 * by itself: EBUSY is then success); ENXIO if this process is not a
 * worker; EINVAL for no or a bad endpoint; ENOENT/ENOSYS if libzmq cannot
 * be loaded.  Reads CLAMOR_FETCH_TIMEOUT_MS.
 * Thread: one at a time with clamor_pager_stop().  Signal: no. */
int clamor_pager_start(const char *endpoint);
/* Stop the pager thread (0 if it did not run).  Fetches in flight fail with
 * ESHUTDOWN: a thread waiting in a fault on one of them aborts the process.
 * Returns 0.  Thread: one at a time with clamor_pager_start().  Signal: no. */
int clamor_pager_stop(void);

/* Make every page of [addr, addr+len) present, fetching the missing ones in
 * one pipelined batch, and wait.  System calls that read into or write from
 * region memory fail with EFAULT on pages not present (the kernel raises no
 * SIGSEGV for them), so call this first.  On the driver, once page versions
 * are kept, it opens the pages for writing (logging their versions), since
 * pages are write-protected there.
 * Returns 0; EFAULT if the range is not inside the region; ENXIO without a
 * region; ENOTCONN if no pager runs; EIO, ETIMEDOUT or ENOENT (a page the
 * driver never allocated) if a page could not be fetched.
 * Thread: any.  Signal: no. */
int clamor_prefetch(const void *addr, size_t len);

/* Drop the local copy of pages [first, first+count): their memory is
 * returned and the next access fetches them again.
 * Returns 0; EPERM if this process is not a worker; EINVAL for pages
 * outside the region.  Thread: any.  Signal: no. */
int clamor_pages_drop(uint64_t first, uint64_t count);

/* ---- page I/O: tunables ---------------------------------------------------- */

/* Read-ahead on sequential faults, in bytes (0 disables; default 4 MiB).
 * Thread: any.  Signal: the getter is safe. */
void clamor_set_readahead(size_t bytes);
size_t clamor_readahead(void);
/* A fetch not answered within this time fails the access (default 30 s,
 * CLAMOR_FETCH_TIMEOUT_MS when the pager starts; 0 is taken as 1).
 * Thread: any.  Signal: the getter is safe. */
void clamor_set_fetch_timeout_ms(uint32_t ms);
uint32_t clamor_fetch_timeout_ms(void);
/* Upper bound on the memory mappings a worker's region may be split into by
 * page protections (vm.max_map_count is process-wide; the default is half
 * of it).  0 restores the default.  clamor_mappings() is how many there are
 * now.  Thread: any.  Signal: no (the first clamor_max_mappings() reads
 * /proc). */
void clamor_set_max_mappings(uint32_t n);
uint32_t clamor_max_mappings(void);
uint32_t clamor_mappings(void);

/* ---- page I/O: the page server (driver and workers) ------------------------ */

/* Start the page-server thread bound to `endpoint` ("tcp://127.0.0.1:*",
 * the default for NULL or "", or "ipc:///path"); the endpoint actually
 * bound is copied to `bound` (boundlen bytes; may be NULL).  The driver
 * serves every allocated page; a worker serves the pages it holds.
 * Returns 0; EBUSY if it runs already; ENXIO without a region;
 * EADDRINUSE or EINVAL if it cannot bind; EPROTO if security is on and its
 * handler cannot start; ENOENT/ENOSYS if libzmq cannot be loaded.  Reads
 * CLAMOR_SERVE_RATE.
 * Thread: one at a time with clamor_server_stop().  Signal: no. */
int clamor_server_start(const char *endpoint, char *bound, size_t boundlen);
/* Stop the page server (0 if it did not run).  Returns 0.
 * Thread: one at a time with clamor_server_start().  Signal: no. */
int clamor_server_stop(void);
/* The endpoint bound by the running server, "" if none; valid until the
 * server stops.  Thread: any.  Signal: no. */
const char *clamor_server_endpoint(void);

/* Ask the page server at `endpoint` for its region geometry, waiting up to
 * timeout_ms (a worker calls this before clamor_region_attach()).
 * Returns 0; EINVAL for a bad endpoint; ETIMEDOUT if no answer came;
 * EPROTO for an answer that is not one; ENOENT/ENOSYS if libzmq cannot be
 * loaded.  Thread: any.  Signal: no. */
int clamor_hello(const char *endpoint, uint64_t *base, uint64_t *size,
                 uint64_t *page_size, int timeout_ms);

/* ---- page I/O: security (every socket the core opens) ---------------------- */

/* From now on every socket the core opens authenticates its peer, before a
 * frame of the peer's reaches clamor.  CLAMOR_SECURITY_CURVE (encrypted):
 * servers use `server_secret`; clients expect `server_public` and present
 * `client_public`/`client_secret`; a page server admits only clients that
 * present `client_public` (the members' key).  CLAMOR_SECURITY_PLAIN
 * (authenticated, not encrypted): user "clamor", password `token`.
 * CLAMOR_SECURITY_NONE: neither (the default).  Keys are 40-character Z85
 * strings; the arguments a mode does not use may be NULL.  Sockets already
 * open keep what they had: call it before clamor_server_start() and
 * clamor_pager_start().  A forked child keeps its parent's setting.
 * Returns 0; EINVAL for a bad key, token or mode (the mode in force stays).
 * clamor_security_mode() is the mode in force.
 * Thread: one at a time with itself, and before the sockets it is for
 * open.  Signal: no. */
#define CLAMOR_SECURITY_NONE 0
#define CLAMOR_SECURITY_CURVE 1
#define CLAMOR_SECURITY_PLAIN 2
int clamor_security(int mode, const char *server_public, const char *server_secret, const char *client_public,
                    const char *client_secret, const char *token);
int clamor_security_mode(void);

/* ---- statistics ---------------------------------------------------------- */

/* The fields of struct clamor_stats, in order, written out once.  COUNTER(name)
 * is a uint64_t counter the core bumps as it works (clamor_stats_reset()
 * zeroes it); VALUE(type, name) is worked out when the snapshot is taken.
 * Expand it with two macros of your own to walk the fields.  cffi has no
 * preprocessor, so clamor/_cdefs.h repeats the struct expanded;
 * tests/test_stats_fields.py checks that the two agree. */
#define CLAMOR_STATS(COUNTER, VALUE)                                                                            \
    COUNTER(faults)            /* SIGSEGV faults taken inside the region */                                     \
    COUNTER(pages_fetched)     /* pages installed from the network */                                           \
    COUNTER(bytes_fetched)                                                                                      \
    COUNTER(readahead_pages)   /* of pages_fetched, those fetched ahead */                                      \
    COUNTER(readahead_streams) /* worker: read-ahead streams started (three faults on consecutive pages) */     \
    COUNTER(fetch_requests)    /* requests sent by the pager */                                                 \
    COUNTER(fetch_errors)                                                                                       \
    COUNTER(pages_served)      /* by this process's page server */                                              \
    COUNTER(bytes_served)                                                                                       \
    COUNTER(requests_served)                                                                                    \
    COUNTER(bad_requests)      /* malformed messages answered with an error */                                  \
    COUNTER(evictions)         /* pages closed to bound the mapping count */                                    \
    COUNTER(pages_dropped)     /* pages dropped on request */                                                   \
    COUNTER(pages_invalidated) /* worker: copies dropped because the driver changed them */                     \
    COUNTER(pages_logged)      /* driver: pages copied on their first write in a version */                     \
    COUNTER(pages_unchanged)   /* driver: of those, identical at the next version */                            \
    COUNTER(pages_parked)      /* worker: mapped pages dropped with their page tables kept (park.c) */          \
    COUNTER(pages_unparked)    /* worker: pages mapped again with page tables kept */                            \
    COUNTER(pages_logged_ahead) /* driver: of those, logged as their version began (rewritten at every version) */ \
    VALUE(uint64_t, versions)  /* driver: page versions held */                                                 \
    VALUE(uint64_t, version_bytes)                                                                              \
    COUNTER(pages_from_peers)  /* worker: pages fetched from a peer (redirect or hint) */                       \
    COUNTER(bytes_from_peers)                                                                                   \
    COUNTER(redirects)         /* driver: requests sent to a peer; worker: redirects followed */                \
    COUNTER(peer_fallbacks)    /* worker: redirects and hinted requests that ended at the driver after all */   \
    COUNTER(peer_direct)       /* worker: requests sent straight to a peer on a hint */                         \
    COUNTER(hint_bytes)        /* driver: bytes of holder hints sent with replies */                            \
    COUNTER(peer_timeouts)     /* worker: peers silent for a second on a request (then the driver was asked) */ \
    COUNTER(peers_admitted)    /* page server: peers that proved they are members (security on) */             \
    COUNTER(peers_refused)     /* page server: peers refused by its ZAP handler */                              \
    COUNTER(reloc_pages)       /* worker: pages fetched with relocations */                                     \
    COUNTER(reloc_words)       /* worker: words relocated */                                                    \
    COUNTER(reloc_bytes)       /* worker: bytes of relocation lists received */                                 \
    COUNTER(pages_mapped)      /* worker: pages mapped from the driver's memory (same host), not fetched */     \
    COUNTER(pages_compacted)   /* driver: pages moved back home to bound its mappings */                        \
    COUNTER(wire_bytes_fetched) /* worker: page data bytes as received (sparse replies are smaller) */         \
    COUNTER(wire_bytes_served) /* page server: page data bytes as sent (of bytes_served) */                     \
    COUNTER(region_frees)      /* worker: region memory freed here, ignored (0 unless a count went wrong) */    \
    COUNTER(peer_written)      /* page server: requests refused, a page written here (the peer asks the driver) */ \
    COUNTER(pages_kept)        /* worker: invalidated copies kept as the base of a diff */                      \
    COUNTER(diff_pages)        /* worker: pages fetched as a diff against a kept copy */                          \
    COUNTER(diff_wire_bytes)   /* worker: of wire_bytes_fetched, those of diffs */                                \
    COUNTER(diff_retries)      /* worker: diffs that did not sum right (a copy written here): fetched whole */    \
    COUNTER(diff_pages_served) /* page server: pages sent as a diff */                                            \
    COUNTER(diff_pages_reused) /* driver: of those, diffs kept from an earlier request (diffs.c) */                \
    VALUE(uint64_t, kept_bytes) /* worker: bytes of kept copies now */                                            \
    VALUE(uint64_t, latency_count) /* fetch latencies recorded */                                               \
    VALUE(double, latency_p50_us)                                                                               \
    VALUE(double, latency_p99_us)                                                                               \
    VALUE(double, latency_max_us)

#define CLAMOR_STATS_COUNTER_FIELD_(name) uint64_t name;
#define CLAMOR_STATS_VALUE_FIELD_(type, name) type name;
struct clamor_stats {
    CLAMOR_STATS(CLAMOR_STATS_COUNTER_FIELD_, CLAMOR_STATS_VALUE_FIELD_)
};
#undef CLAMOR_STATS_COUNTER_FIELD_
#undef CLAMOR_STATS_VALUE_FIELD_
/* A snapshot of the counters and values, not atomic as a whole; reset
 * zeroes the counters and the latency histogram.
 * Thread: any.  Signal: no. */
void clamor_stats_get(struct clamor_stats *out);
void clamor_stats_reset(void);

/* ---- the allocator (driver) ----------------------------------------------- */

/* Requests up to this size come from size classes; larger ones are spans. */
#define CLAMOR_SMALL_MAX ((size_t)8192)

/* malloc(3) semantics over the region.  Allocator bookkeeping lives outside
 * the region, so no page of the region is written except by the caller, and
 * a worker never fetches a page for the allocator's sake.  Small sizes come
 * from size classes, sizes above CLAMOR_SMALL_MAX come as page-aligned
 * spans.  NULL with errno: ENOMEM (region exhausted or size too large),
 * ENXIO (no region: call clamor_region_init() first), EPERM (this process
 * is a worker: only the driver allocates).
 * Thread: any (one lock).  Signal: no. */
void *clamor_malloc(size_t size);
void *clamor_calloc(size_t n, size_t size);
void *clamor_realloc(void *ptr, size_t size);
/* `align` a power of two; size need not be a multiple of it (unlike C11).
 * Thread: any.  Signal: no. */
void *clamor_aligned_alloc(size_t align, size_t size);
/* The same for a block that will never hold a pointer (array data): its
 * memory is never scanned for pointers out of the region.
 * Thread: any.  Signal: no. */
void *clamor_malloc_atomic(size_t size);
void *clamor_calloc_atomic(size_t n, size_t size);
void *clamor_aligned_alloc_atomic(size_t align, size_t size);
/* 1 if the live block that holds ptr is atomic, 0 if not, -1 (and the
 * detail) if ptr is not inside a live block or this is not the driver.
 * Thread: any.  Signal: no. */
int clamor_block_atomic(const void *ptr);
/* free(NULL) is a no-op.  Freeing a pointer that clamor did not return, or
 * freeing twice, does not crash: errno is set to EINVAL, the detail is in
 * clamor_last_error(), and the heap is left as it was.  On a worker it sets
 * errno to EPERM and does nothing: workers never free region memory.
 * Thread: any.  Signal: no. */
void clamor_free(void *ptr);
/* Like clamor_free() but returns 0, EINVAL (not a live block) or EPERM
 * (this process is a worker) instead of setting errno.
 * Thread: any.  Signal: no. */
int clamor_free_checked(void *ptr);
/* Bytes usable at ptr, 0 if ptr is not a live clamor block.
 * Thread: any.  Signal: no. */
size_t clamor_usable_size(const void *ptr);
/* The live block that holds ptr (anywhere inside it): its start and usable
 * size.  Returns 0; EINVAL (not inside a live block) or EPERM (not the
 * driver).  Thread: any.  Signal: no. */
int clamor_block_of(const void *ptr, uintptr_t *start, size_t *size);
/* Bytes handed out and not freed, and bytes of region in use by the heap.
 * Thread: any.  Signal: safe (atomic loads). */
size_t clamor_heap_allocated(void);
size_t clamor_heap_footprint(void);

/* Detail of the calling thread's last failure ("" if none): a thread-local
 * buffer, valid until the thread's next failing call.
 * Thread: any (each its own).  Signal: safe. */
const char *clamor_last_error(void);

/* ---- heap redirection (driver) -------------------------------------------- */

/* Patch the GOT of every loaded shared object (but glibc, the loader and
 * clamor's own module) so that malloc, calloc, realloc, free,
 * posix_memalign, aligned_alloc, memalign, valloc, malloc_usable_size and
 * dlopen go through clamor's wrappers; libraries dlopen'ed later are patched
 * as they load.  The wrappers behave as glibc's unless the calling thread
 * is inside a heap block (clamor_heap_enter()), and always send a region
 * pointer back to the region allocator (never to glibc).  Idempotent.
 * Returns 0.  Thread: any.  Signal: no. */
int clamor_interpose_refresh(void);
/* Enter/leave a heap block on the calling thread (nestable): inside one,
 * the thread's allocations through the patched functions come from the
 * region.  enter returns 0; EPERM on a worker, ENXIO without a region.
 * exit outside a block does nothing.  clamor_heap_active() is the calling
 * thread's depth (0: outside every block).
 * Thread: the calling thread's own blocks.  Signal: active is safe. */
int clamor_heap_enter(void);
void clamor_heap_exit(void);
int clamor_heap_active(void);
/* Leave the calling thread's heap block for a while (the program's own
 * work inside a block): suspend returns the depth to hand to resume.
 * Thread: the calling thread's own blocks.  Signal: no. */
int clamor_heap_suspend(void);
void clamor_heap_resume(int depth);
/* Threads inside a heap block right now (not suspended).
 * Thread: any.  Signal: safe. */
int clamor_heap_threads(void);
/* The serial of the calling thread's open block (0: none); and, on a thread
 * that thread started, adopting it: that thread allocates in the region
 * while the block stays open (0: never).
 * Thread: block is the caller's; adopt on the started thread.  Signal: no. */
uint64_t clamor_heap_block(void);
void clamor_heap_adopt(uint64_t block);

#ifdef __cplusplus
}
#endif
#endif /* CLAMOR_H */
