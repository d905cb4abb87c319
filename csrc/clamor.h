/* clamor.h -- the public C API of clamor.
 *
 * clamor keeps large global variables in one global region: memory mapped at
 * the same fixed virtual address in every process of a cluster.  The driver
 * process writes the region; worker processes read it, and every page they
 * touch is fetched on demand over ZeroMQ by a SIGSEGV handler and a pager
 * thread.  Pages are named on the wire by their index from the region base,
 * never by address.
 *
 * Contracts:
 *   - "Thread-safe" means any thread may call it concurrently.
 *   - No function in this header is async-signal-safe: never call one from a
 *     signal handler.
 *   - Functions returning int return 0 on success or a positive errno value;
 *     clamor_last_error() then holds a one-line detail for the calling thread.
 *   - Allocation functions follow malloc(3): NULL and errno on failure.
 */
#ifndef CLAMOR_H
#define CLAMOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- region ---------------------------------------------------------- */

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
 * takes the default.  page_size must be a power of two in
 * [CLAMOR_MIN_PAGE_SIZE, CLAMOR_MAX_PAGE_SIZE]; base and size must be
 * multiples of it.  EEXIST if the address range is taken (the detail names
 * the range), EBUSY if this process already has a region, EINVAL for bad
 * geometry.  Not thread-safe against other region calls. */
int clamor_region_init(uintptr_t base, size_t size, size_t page_size);

/* Map the region in this process as a worker: every page not present
 * (PROT_NONE) until a fault fetches it.  Same arguments and errors as
 * clamor_region_init().  The pager must be started before a page is read. */
int clamor_region_attach(uintptr_t base, size_t size, size_t page_size);

/* Unmap the region and forget its state.  Stops the pager and the server
 * first.  Any later access to the old range is an ordinary SIGSEGV. */
int clamor_region_close(void);

/* Geometry and role of this process's region (0 / CLAMOR_ROLE_NONE if none).
 * Thread-safe. */
uintptr_t clamor_region_base(void);
size_t clamor_region_size(void);
size_t clamor_page_size(void);
int clamor_region_role(void);

/* A child forked from a process that has a region becomes a worker: from a
 * pthread_atfork() child handler, the region is replaced (same address) by
 * a fresh private mapping with every page not present, and no thread of the
 * parent survives.  If the parent was serving pages, the same handler then
 * starts the child's page server and its pager (connected to the parent),
 * so the child can touch region memory from its first instruction;
 * clamor_pager_start() afterwards answers EBUSY.
 * clamor_fork_parent_endpoint() is the endpoint of the parent's page server
 * at fork time ("" if none): what a forked worker's pager connects to. */
const char *clamor_fork_parent_endpoint(void);
/* The ports a forked child's page server may bind, the first free one of
 * lo..hi, on the host of the parent's page server (0, 0: any port, the
 * default).  EINVAL unless 0 < lo <= hi <= 65535 or both are 0. */
int clamor_set_fork_ports(unsigned lo, unsigned hi);

/* ---- same host: workers map the driver's pages (samehost.c) ----------- */

/* Driver: children forked from now on map its pages instead of fetching
 * them (on, the default of a Cluster) or fetch them (off). */
int clamor_map_share(int on);
/* Driver: the descriptor of its memfd and the 16-byte cookie a worker
 * checks it against (what clamor_map_attach() takes).  EPERM elsewhere. */
int clamor_map_info(int *fd, uint8_t *cookie);
/* Worker: map the driver's pages from now on, through /proc/PID/fd/FD.
 * 0; EHOSTUNREACH (another host or network namespace), EACCES/EPERM
 * (another user, a container boundary), EBADF (not this cluster's memfd),
 * ENOENT, EINVAL; the detail says which.  The worker then fetches. */
int clamor_map_attach(int pid, int fd, const uint8_t *cookie);
/* Worker: 1 if it maps the driver's pages, else 0. */
int clamor_map_status(void);

/* ---- libzmq ----------------------------------------------------------- */

/* Resolve the libzmq functions clamor uses from the shared library at
 * `path` (normally the copy that pyzmq loaded).  Idempotent.  ENOENT if the
 * library cannot be opened, ENOSYS if a symbol is missing. */
int clamor_zmq_load(const char *path);

/* ---- fault handler ---------------------------------------------------- */

/* Install the SIGSEGV handler (idempotent).  Faults outside the region are
 * passed to the handler that was installed before, in its own calling
 * convention.  clamor_fault_ensure_first() re-installs it in front if
 * another handler (faulthandler.enable(), say) replaced it since, chaining
 * to that one; it returns 0 if clamor was already first, -1 if it had to
 * re-install.  clamor_fault_is_first() is 1 if clamor's handler is the one
 * the kernel will call. */
int clamor_fault_install(void);
int clamor_fault_ensure_first(void);
int clamor_fault_is_first(void);

/* ---- pager (workers) -------------------------------------------------- */

/* Start the pager thread, fetching pages from the page server at
 * `endpoint` (tcp:// or ipc://).  Installs the fault handler.  EBUSY if
 * running; ENXIO if no region is attached. */
int clamor_pager_start(const char *endpoint);
int clamor_pager_stop(void);

/* Make every page of [addr, addr+len) present, fetching the missing ones in
 * one pipelined batch, and wait.  System calls that read into or write from
 * region memory fail with EFAULT on pages not present (the kernel raises no
 * SIGSEGV for them), so call this first.  On the driver, once stages have
 * begun, it opens the pages for writing (logging their versions), since
 * pages are write-protected there.
 * EFAULT if the range is not inside the region; EIO/ETIMEDOUT/ENOENT if a
 * page could not be fetched.  Thread-safe. */
int clamor_prefetch(const void *addr, size_t len);

/* Drop the local copy of pages [first, first+count): their memory is
 * returned and the next access fetches them again.  Worker only. */
int clamor_pages_drop(uint64_t first, uint64_t count);

/* Read-ahead on sequential faults, in bytes (0 disables).  Thread-safe. */
void clamor_set_readahead(size_t bytes);
size_t clamor_readahead(void);
/* A fetch not answered within this time fails the access.  Thread-safe. */
void clamor_set_fetch_timeout_ms(uint32_t ms);
uint32_t clamor_fetch_timeout_ms(void);
/* Upper bound on the memory mappings the region may be split into by page
 * protections (vm.max_map_count is process-wide).  0 restores the default. */
void clamor_set_max_mappings(uint32_t n);
uint32_t clamor_max_mappings(void);
/* Mappings the region is split into now (worker), as tracked by the pager. */
uint32_t clamor_mappings(void);
/* Worker: at most this many bytes of copies kept for diffs (0: none kept,
 * no diffs asked for).  A fetching worker keeps the copy of a page it held
 * when the driver changes it, and asks for the page with the version the
 * copy is; the driver may answer with the words that changed.  Default
 * CLAMOR_DIFF_KEEP, else 1 GiB.  Thread-safe. */
void clamor_set_diff_keep(uint64_t bytes);
uint64_t clamor_diff_keep(void);

/* ---- page server (driver and workers) --------------------------------- */

/* Start the page-server thread bound to `endpoint` ("tcp://127.0.0.1:*" or
 * "ipc:///path"); the endpoint actually bound is copied to `bound`.  The
 * driver serves every allocated page; a worker serves the pages it holds. */
int clamor_server_start(const char *endpoint, char *bound, size_t boundlen);
int clamor_server_stop(void);
/* Endpoint bound by the running server, "" if none. */
const char *clamor_server_endpoint(void);

/* Ask the server at `endpoint` for its region geometry (a worker calls this
 * before clamor_region_attach()). */
int clamor_hello(const char *endpoint, uint64_t *base, uint64_t *size,
                 uint64_t *page_size, int timeout_ms);

/* ---- security (every socket the core opens) --------------------------- */

/* From now on every socket the core opens authenticates its peer, before a
 * frame of the peer's reaches clamor.  CLAMOR_SECURITY_CURVE (encrypted):
 * servers use `server_secret`; clients expect `server_public` and present
 * `client_public`/`client_secret`; a page server admits only clients that
 * present `client_public` (the members' key).  CLAMOR_SECURITY_PLAIN
 * (authenticated, not encrypted): user "clamor", password `token`.
 * CLAMOR_SECURITY_NONE: neither (the default).  Keys are 40-character Z85
 * strings; the arguments a mode does not use may be NULL.  Sockets already
 * open keep what they had: call it before clamor_server_start() and
 * clamor_pager_start().  A forked child keeps its parent's setting. */
#define CLAMOR_SECURITY_NONE 0
#define CLAMOR_SECURITY_CURVE 1
#define CLAMOR_SECURITY_PLAIN 2
int clamor_security(int mode, const char *server_public, const char *server_secret, const char *client_public,
                    const char *client_secret, const char *token);
int clamor_security_mode(void);

/* ---- stages and page versions ----------------------------------------- */

/* Driver: stage `stage` (> every earlier one) is about to be submitted.
 * The first call write-protects the region: from then on the first write
 * to a page in a stage logs the page's previous content as a version, and
 * pages whose bytes changed since the previous stage_begin are listed
 * (clamor_changed_count/copy) so that workers drop their copies.  A page
 * written back to identical bytes is not listed.  Not thread-safe against
 * other stage calls; driver threads may keep writing. */
int clamor_stage_begin(uint32_t stage);
uint64_t clamor_changed_count(void);
/* Driver: how the region is write-protected since the first stage:
 * CLAMOR_WPROT_USERFAULTFD (a system call that writes into a protected page
 * waits while its version is logged, as a user-space write does),
 * CLAMOR_WPROT_MPROTECT (such a system call fails with EFAULT unless the
 * pages were opened first: clamor_prefetch, or a block handed out inside
 * heap()), or CLAMOR_WPROT_NONE (no stage yet, or not the driver).  The
 * environment variable CLAMOR_WRITE_PROTECT, read at the first stage, says
 * which to use: auto (the default: userfaultfd if the process may use it),
 * userfaultfd (else the first stage fails with ENOTSUP), mprotect.  Why
 * this mechanism runs goes to `reason` (cap bytes, may be NULL).
 * Thread-safe. */
#define CLAMOR_WPROT_NONE 0
#define CLAMOR_WPROT_MPROTECT 1
#define CLAMOR_WPROT_USERFAULTFD 2
int clamor_write_protection(char *reason, size_t cap);
/* Driver: pages logged (first writes) since the last clamor_stage_begin();
 * 0 also before the first.  A caller that numbers versions by stages asks
 * it to begin a stage only when something was written. */
uint64_t clamor_dirty_count(void);
/* Driver: copy up to `n` of those pages to `out` (in no order, a page
 * possibly twice); returns how many there are.  A caller that remembers
 * what it read of the region between stages asks which pages were written
 * since, before the next stage begins. */
uint64_t clamor_dirty_copy(uint64_t *out, uint64_t n);
void clamor_changed_copy(uint64_t *out, uint64_t n);
/* Pages of the last clamor_stage_begin() whose bytes did not change but
 * moved to another location of the driver's memfd (logged with a group):
 * workers that map the driver's pages drop them; the others keep theirs. */
uint64_t clamor_moved_count(void);
/* Driver: no worker that maps pages reads, through a mapping, a location
 * of a stage below `stage` (the lowest stage such a worker last ran or
 * runs at).  Versions that only those readers needed are freed by the
 * next clamor_versions_keep(). */
void clamor_versions_map_floor(uint32_t stage);
void clamor_moved_copy(uint64_t *out, uint64_t n);
uint32_t clamor_stage_current(void);
/* Driver: *differs = 1 if a byte of [a, a+len) in the region reads
 * otherwise now than in the version the tasks of `stage` read (the driver
 * wrote it since that stage began), else 0.  0, or EINVAL (not the
 * region's range), EPERM (not the driver), ENOMEM. */
int clamor_version_differs(uintptr_t a, size_t len, uint32_t stage, int *differs);
/* Driver: keep only the versions that the stages in `stages` (n of them,
 * ascending: those a task may still read at) need; the lowest becomes the
 * floor below which a request for a changed page gets ESTALE.  0, or
 * EINVAL if not sorted. */
int clamor_versions_keep(const uint32_t *stages, size_t n);
/* Worker: the driver declared the peer whose page server is `endpoint` lost;
 * hinted requests stop going to it. */
void clamor_peer_gone(const char *endpoint);

/* Worker: the stage of the task about to run; page requests carry it and
 * are answered with the page as that stage sees it.  A stage older than the
 * highest set so far (a lineage re-run) first needs the pages changed in
 * between invalidated; until a newer stage is set again, this worker's page
 * server answers peers' requests of newer stages with EAGAIN.  Task thread,
 * between tasks. */
void clamor_set_stage(uint32_t stage);
/* Worker: drop this worker's copies of the listed pages (changed by the
 * driver); fetches of them in flight are discarded on arrival.  Memory is
 * returned.  Thread-safe. */
int clamor_invalidate(const uint64_t *pages, uint64_t n);

/* ---- relocations (portable region objects) ----------------------------- */

/* A word of a region page that points out of the region, at `target`: the
 * driver's word is `value`; a worker that relocates writes its own address
 * of the target plus (value - the driver's address of it).  Target 0 is
 * null: the word reads 0 there.  `word` counts 8-byte words from the start
 * of the page (clamor/memory/portable.py computes these). */
struct clamor_reloc {
    uint32_t word;
    uint32_t target;
    uint64_t value;
};
/* Driver: the relocations of page `page` as of stage `stage` (until a later
 * call replaces them), sorted by word; n may be 0.  EPERM if not the
 * driver, ERANGE for a page outside the region, EINVAL for a word outside
 * the page.  Thread-safe. */
int clamor_reloc_set(uint32_t stage, uint64_t page, const struct clamor_reloc *r, uint32_t n);
/* Driver: forget the lists no request at stage >= floor can be served. */
void clamor_reloc_prune(uint32_t floor);
/* Forget every list and target (region closed). */
void clamor_reloc_reset(void);
/* Worker: ask for relocations with every page (a worker not forked from the
 * driver), or not.  Pages held before keep what they had. */
void clamor_reloc_enable(int on);
int clamor_reloc_enabled(void);
/* Worker: target `target` (> 0) is at `driver_addr` in the driver and at
 * `local_addr` here.  A page that names a target not bound fails to load
 * (ENOKEY).  Thread-safe. */
int clamor_reloc_bind(uint32_t target, uint64_t driver_addr, uint64_t local_addr);

/* ---- dynamic replication (driver) -------------------------------------- */

/* Redirect requests for pages that workers hold to one of those workers:
 * 0 off, 1 random holder, 2 the less loaded of two random holders.
 * Thread-safe. */
void clamor_set_replication(int policy);
int clamor_replication(void);
/* Forget a peer (by page-server endpoint; ENOENT if unknown), or all. */
int clamor_replication_forget(const char *endpoint);
void clamor_replication_reset(void);

/* ---- statistics -------------------------------------------------------- */

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
    COUNTER(pages_logged)      /* driver: pages copied on their first write in a stage */                       \
    COUNTER(pages_unchanged)   /* driver: of those, identical at the next stage */                              \
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
/* Thread-safe; a snapshot, not atomic as a whole. */
void clamor_stats_get(struct clamor_stats *out);
void clamor_stats_reset(void);

/* ---- allocator (driver only) ------------------------------------------ */

/* Requests up to this size come from size classes; larger ones are spans. */
#define CLAMOR_SMALL_MAX ((size_t)8192)

/* malloc(3) semantics over the region.  Thread-safe.  Allocator bookkeeping
 * lives outside the region, so no page of the region is written except by
 * the caller, and a worker never fetches a page for the allocator's sake.
 * Small sizes come from size classes, sizes above CLAMOR_SMALL_MAX come as
 * page-aligned spans.  NULL with errno: ENOMEM (region exhausted or size too
 * large), ENXIO (no region, call clamor_region_init first), EPERM (this
 * process is a worker: only the driver allocates). */
void *clamor_malloc(size_t size);
void *clamor_calloc(size_t n, size_t size);
void *clamor_realloc(void *ptr, size_t size);
/* `align` a power of two; size need not be a multiple of it (unlike C11). */
void *clamor_aligned_alloc(size_t align, size_t size);
/* The same for a block that will never hold a pointer (array data): its
 * memory is never scanned for pointers out of the region. */
void *clamor_malloc_atomic(size_t size);
void *clamor_calloc_atomic(size_t n, size_t size);
void *clamor_aligned_alloc_atomic(size_t align, size_t size);
/* 1 if the live block that holds ptr is atomic, 0 if not, -1 (and the
 * detail) if ptr is not inside a live block or this is not the driver. */
int clamor_block_atomic(const void *ptr);
/* free(NULL) is a no-op.  Freeing a pointer that clamor did not return, or
 * freeing twice, does not crash: errno is set to EINVAL, the detail is in
 * clamor_last_error(), and the heap is left as it was. */
void clamor_free(void *ptr);
/* Like clamor_free() but returns 0, EINVAL (not a live block) or EPERM (this
 * process is a worker: workers never free region memory) instead of setting
 * errno. */
int clamor_free_checked(void *ptr);
/* Bytes usable at ptr, 0 if ptr is not a live clamor block. */
size_t clamor_usable_size(const void *ptr);
/* The live block that holds ptr (anywhere inside it): its start and usable
 * size.  0, EINVAL (not inside a live block) or EPERM (not the driver). */
int clamor_block_of(const void *ptr, uintptr_t *start, size_t *size);
/* Bytes handed out and not freed, and bytes of region in use by the heap. */
size_t clamor_heap_allocated(void);
size_t clamor_heap_footprint(void);

/* Detail of the calling thread's last failure ("" if none). */
const char *clamor_last_error(void);

/* ---- heap redirection (driver) ---------------------------------------- */

/* Patch the GOT of every loaded shared object (but glibc, the loader and
 * clamor's own module) so that malloc, calloc, realloc, free,
 * posix_memalign, aligned_alloc, memalign, valloc, malloc_usable_size and
 * dlopen go through clamor's wrappers; libraries dlopen'ed later are patched
 * as they load.  Idempotent; thread-safe.  The wrappers behave as glibc's
 * unless the calling thread is inside clamor_heap_enter()/exit(), and always
 * send a region pointer back to the region allocator (never to glibc). */
int clamor_interpose_refresh(void);
unsigned long clamor_interpose_slots(void);
/* Enter/leave a heap block on the calling thread (nestable).  enter: EPERM
 * on a worker, ENXIO without a region. */
int clamor_heap_enter(void);
void clamor_heap_exit(void);
int clamor_heap_active(void);
/* Leave the calling thread's heap block for a while (clamor's own runtime
 * work inside a block): suspend returns the depth to hand to resume. */
int clamor_heap_suspend(void);
void clamor_heap_resume(int depth);
/* Threads inside a heap block right now (not suspended). */
int clamor_heap_threads(void);
/* The serial of the calling thread's open block (0: none), and, on a thread
 * it started, taking it: that thread allocates in the region while the
 * block stays open (0: never). */
uint64_t clamor_heap_block(void);
void clamor_heap_adopt(uint64_t block);

#ifdef __cplusplus
}
#endif
#endif /* CLAMOR_H */
