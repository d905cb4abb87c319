/* Declarations cffi compiles against, in three parts: csrc/clamor.h (the
 * C contract), csrc/binding.h (what only the binding calls) and
 * csrc/internal.h (the Python extension's own hooks, clamor_py_*)
 * (declarations only; cffi cannot read the real headers' preprocessor
 * lines).  tests/test_region.py checks that every function here is declared
 * the same way in one of the three, and
 * tests/test_stats_fields.py that struct clamor_stats is the CLAMOR_STATS
 * list of csrc/clamor.h, expanded. */
#define CLAMOR_DEFAULT_PAGE_SIZE ...
#define CLAMOR_MIN_PAGE_SIZE ...
#define CLAMOR_MAX_PAGE_SIZE ...
#define CLAMOR_SMALL_MAX ...
#define CLAMOR_ROLE_NONE ...
#define CLAMOR_ROLE_DRIVER ...
#define CLAMOR_ROLE_WORKER ...

int clamor_region_init(uintptr_t base, size_t size, size_t page_size);
int clamor_region_attach(uintptr_t base, size_t size, size_t page_size);
int clamor_region_close(void);
uintptr_t clamor_region_base(void);
size_t clamor_region_size(void);
size_t clamor_page_size(void);
int clamor_region_role(void);

int clamor_fault_install(void);
int clamor_fault_ensure_first(void);
int clamor_fault_is_first(void);

int clamor_pager_start(const char *endpoint);
int clamor_pager_stop(void);
int clamor_prefetch(const void *addr, size_t len);
int clamor_pages_drop(uint64_t first, uint64_t count);
void clamor_set_readahead(size_t bytes);
size_t clamor_readahead(void);
void clamor_set_fetch_timeout_ms(uint32_t ms);
uint32_t clamor_fetch_timeout_ms(void);
void clamor_set_max_mappings(uint32_t n);
uint32_t clamor_max_mappings(void);
uint32_t clamor_mappings(void);

int clamor_server_start(const char *endpoint, char *bound, size_t boundlen);
int clamor_server_stop(void);
const char *clamor_server_endpoint(void);
int clamor_security(int mode, const char *server_public, const char *server_secret, const char *client_public,
                    const char *client_secret, const char *token);
int clamor_security_mode(void);
int clamor_hello(const char *endpoint, uint64_t *base, uint64_t *size,
                 uint64_t *page_size, int timeout_ms);

/* CLAMOR_STATS of csrc/clamor.h, expanded: same fields, same order. */
struct clamor_stats {
    uint64_t faults;
    uint64_t pages_fetched;
    uint64_t bytes_fetched;
    uint64_t readahead_pages;
    uint64_t readahead_streams;
    uint64_t fetch_requests;
    uint64_t fetch_errors;
    uint64_t pages_served;
    uint64_t bytes_served;
    uint64_t requests_served;
    uint64_t bad_requests;
    uint64_t evictions;
    uint64_t pages_dropped;
    uint64_t pages_invalidated;
    uint64_t pages_logged;
    uint64_t pages_unchanged;
    uint64_t pages_parked;
    uint64_t pages_unparked;
    uint64_t pages_logged_ahead;
    uint64_t versions;
    uint64_t version_bytes;
    uint64_t pages_from_peers; /* worker: pages fetched from a peer (redirect or hint) */
    uint64_t bytes_from_peers;
    uint64_t redirects;       /* driver: requests sent to a peer; worker: redirects followed */
    uint64_t peer_fallbacks;  /* worker: redirects and hinted requests that ended at the driver after all */
    uint64_t peer_direct;
    uint64_t hint_bytes;
    uint64_t peer_timeouts;   /* worker: peers silent for a second on a request (then the driver was asked) */
    uint64_t peers_admitted;
    uint64_t peers_refused;
    uint64_t reloc_pages;
    uint64_t reloc_words;
    uint64_t reloc_bytes;
    uint64_t pages_mapped;
    uint64_t pages_compacted;
    uint64_t wire_bytes_fetched;
    uint64_t wire_bytes_served;
    uint64_t region_frees;
    uint64_t peer_written;
    uint64_t pages_kept;
    uint64_t diff_pages;
    uint64_t diff_wire_bytes;
    uint64_t diff_retries;
    uint64_t diff_pages_served;
    uint64_t diff_pages_reused;
    uint64_t kept_bytes;
    uint64_t latency_count;
    double latency_p50_us;
    double latency_p99_us;
    double latency_max_us;
};
void clamor_stats_get(struct clamor_stats *out);
void clamor_stats_reset(void);

void *clamor_malloc(size_t size);
void *clamor_malloc_atomic(size_t size);
void *clamor_calloc_atomic(size_t n, size_t size);
void *clamor_aligned_alloc_atomic(size_t align, size_t size);
int clamor_block_atomic(const void *ptr);
void *clamor_calloc(size_t n, size_t size);
void *clamor_realloc(void *ptr, size_t size);
void *clamor_aligned_alloc(size_t align, size_t size);
void clamor_free(void *ptr);
int clamor_free_checked(void *ptr);
size_t clamor_usable_size(const void *ptr);
int clamor_block_of(const void *ptr, uintptr_t *start, size_t *size);
size_t clamor_heap_allocated(void);
size_t clamor_heap_footprint(void);

const char *clamor_last_error(void);

int clamor_interpose_refresh(void);
int clamor_heap_enter(void);
void clamor_heap_exit(void);
int clamor_heap_active(void);
int clamor_heap_suspend(void);
void clamor_heap_resume(int depth);
int clamor_heap_threads(void);
uint64_t clamor_heap_block(void);
void clamor_heap_adopt(uint64_t block);

/* csrc/binding.h: what only the binding calls */
const char *clamor_fork_parent_endpoint(void);
int clamor_set_fork_ports(unsigned lo, unsigned hi);
int clamor_map_share(int on);
int clamor_map_info(int *fd, uint8_t *cookie);
int clamor_map_attach(int pid, int fd, const uint8_t *cookie);
int clamor_map_status(void);
int clamor_zmq_load(const char *path);
void clamor_set_diff_keep(uint64_t bytes);
uint64_t clamor_diff_keep(void);
struct clamor_reloc { uint32_t word; uint32_t target; uint64_t value; };
int clamor_reloc_set(uint32_t version, uint64_t page, const struct clamor_reloc *r, uint32_t n);
int clamor_reloc_set_words(uint32_t version, const uint64_t *pages, size_t npages, const uint64_t *addrs,
                           const uint32_t *tids, size_t n, uint8_t *changed, uint32_t *counts);
int clamor_reloc_list(uint64_t page, uint32_t version, struct clamor_reloc *out, uint32_t max, uint32_t *n);
void clamor_reloc_prune(uint32_t floor);
size_t clamor_reloc_nbytes(void);
void clamor_reloc_reset(void);
void clamor_reloc_enable(int on);
int clamor_reloc_enabled(void);
int clamor_reloc_bind(uint32_t target, uint64_t driver_addr, uint64_t local_addr);
int clamor_version_begin(uint32_t version);
uint64_t clamor_changed_count(void);
#define CLAMOR_INVAL_MOVED ...
#define CLAMOR_WPROT_NONE ...
#define CLAMOR_WPROT_MPROTECT ...
#define CLAMOR_WPROT_USERFAULTFD ...
int clamor_write_protection(char *reason, size_t cap);
uint64_t clamor_dirty_count(void);
uint64_t clamor_dirty_copy(uint64_t *out, uint64_t n);
void clamor_changed_copy(uint64_t *out, uint64_t n);
uint64_t clamor_moved_count(void);
void clamor_versions_map_floor(uint32_t version);
void clamor_moved_copy(uint64_t *out, uint64_t n);
uint32_t clamor_version_current(void);
int clamor_version_differs(uintptr_t a, size_t len, uint32_t version, int *differs);
int clamor_versions_keep(const uint32_t *versions, size_t n);
uint64_t clamor_versions_log_ahead(void);
void clamor_peer_gone(const char *endpoint);
void clamor_set_version(uint32_t version);
int clamor_invalidate(const uint64_t *pages, uint64_t n);
int clamor_change_version(uint32_t version, const uint64_t *pages, uint64_t n);
void clamor_set_replication(int policy);
int clamor_replication(void);
/* Forget a peer (by page-server endpoint; ENOENT if unknown), or all. */
int clamor_replication_forget(const char *endpoint);
void clamor_replication_reset(void);
unsigned long clamor_interpose_slots(void);
/* csrc/internal.h: the Python extension only (pyheap.c, pyshare.c) */
int clamor_py_heap_install(void);
int clamor_py_numpy_enter(void);
int clamor_py_numpy_exit(void);
int clamor_py_numpy_suspend(void);
int clamor_py_numpy_dims_flush(int inside);
unsigned long clamor_py_region_dropped(void);
long clamor_py_freelists_flush(void);
int clamor_py_worker_deallocs(void);
long clamor_py_worker_kept(void);
long clamor_py_worker_sweep(void);
long clamor_py_freelists_drain(uintptr_t out);
int clamor_py_freelists_release(uintptr_t list);
long clamor_py_ufunc_caches_out(uintptr_t ufuncs, int layout, long *unread);
long clamor_py_ext_freelists_flush(const uint64_t *types, size_t ntypes, long *failed);
long clamor_py_rehome(uintptr_t objs);
long clamor_py_rehome_tracked(const uint64_t *heads, size_t n);
int clamor_py_gc_heads(uint64_t *heads);
long clamor_py_gc_count(const uint64_t *heads, size_t n, const uint64_t *sorted, size_t nsorted);
long clamor_py_held_from_outside(uintptr_t objs, uintptr_t out);
int clamor_py_walk_plain(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                         uintptr_t extents_out, uintptr_t outside_out);
long clamor_py_own_keys(uintptr_t root, long limit, int frozen);
int clamor_py_freeze_keys(uintptr_t type, uint64_t seq);
void clamor_py_frozen_accept(uint64_t seq);
int clamor_py_frozen_instance(uintptr_t obj);
int clamor_py_frozen_keys(uintptr_t keys);
int clamor_py_frozen_split(uintptr_t obj);
int clamor_py_instance_replace(uintptr_t obj, uintptr_t old, uintptr_t new_value);
int clamor_py_portable_keys(uintptr_t obj);
uintptr_t clamor_py_frozen_names(uintptr_t type, uintptr_t out);
long clamor_py_keys_prefix(uintptr_t type, uintptr_t names);
uintptr_t clamor_py_keys_freeze_at(uintptr_t type, uintptr_t names);
int clamor_py_keyed_instance(uintptr_t obj);
int clamor_py_keys_relayout(uintptr_t type, uintptr_t twin, uintptr_t objects);
long clamor_py_rekey(uintptr_t root, long limit, const uint64_t *keys, size_t nkeys);
int clamor_py_walk_tagged(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                          uintptr_t extents_out, uintptr_t tags_out, uintptr_t outside_out, const int32_t *dirty,
                          size_t ndirty, int recheck, int *shared);
struct clamor_walkout { uint64_t *ext; uint8_t *strict; int32_t *tags; size_t n; uint64_t *nulls; int32_t *null_tags; size_t nnulls; uint64_t *keyed; size_t nkeyed; };
int clamor_py_walk_portable(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                            uintptr_t outside_out, int *seeded, int tagging, const int32_t *dirty, size_t ndirty,
                            int recheck, int *shared, struct clamor_walkout *out);
int clamor_py_root_slots(uintptr_t root, uint64_t *first, uint64_t *stride, int64_t *count);
void clamor_py_digest_runs(const uint64_t *ranges, const uint64_t *starts, const uint64_t *which, size_t n,
                           uint64_t *out);
long clamor_py_table_in(uintptr_t obj);
long clamor_py_weakref_copy(uintptr_t ref, uintptr_t out);
int clamor_py_hides(uintptr_t obj);
int clamor_py_version_begin_hiding(uint32_t version, const uint64_t *objs, const uint64_t *types, int8_t *state,
                                 size_t n);
long clamor_py_untrack_region(uintptr_t objs, const uint64_t *pages, size_t npages, uint64_t first, uint64_t count,
                              long *kept);
long clamor_py_fingerprints(const uint64_t *objs, uint64_t *out, size_t n);
long clamor_py_snapshot(uintptr_t list, uint64_t *out, size_t cap);
int clamor_py_snapshot_has(uint64_t addr, const uint64_t *ids, size_t n);
int clamor_py_inherited(uintptr_t obj, const uint64_t *ids, const uint64_t *fps, size_t n);
void clamor_py_gate_close(void);
void clamor_py_gate_open(void);
int clamor_py_gate_blocks(void);
#define CLAMOR_GATE_MAX_SOCKETS 16
int clamor_py_gate_poll(const uintptr_t *sockets, int n, long timeout_ms, short *revents, const int *abort_);
void clamor_py_gate_release(void);
void clamor_py_gate_wake(void);
void clamor_py_gate_enlist(void);
void clamor_py_gate_discharge(void);
void clamor_py_gate_park(const int *abort_, unsigned long knocked);
unsigned long clamor_py_gate_generation(void);
int clamor_py_gate_settle(int mine, long timeout_ms);
int clamor_py_knock(unsigned long thread_id, const int *abort_, unsigned long knocked);
uintptr_t clamor_py_numpy_handler(void);
enum clamor_field {
    CLAMOR_FIELD_DATA = 1, CLAMOR_FIELD_DIMS, CLAMOR_FIELD_STRIDES, CLAMOR_FIELD_ITEMS, CLAMOR_FIELD_KEYS,
    CLAMOR_FIELD_VALUES, CLAMOR_FIELD_TABLE, CLAMOR_FIELD_BUFFER, CLAMOR_FIELD_UTF8, CLAMOR_FIELD_WSTR,
    CLAMOR_FIELD_SUBARRAY, CLAMOR_FIELD_CMETA
};
int clamor_py_fields(uintptr_t obj, uintptr_t *out, int max);
int clamor_py_instance_items(uintptr_t obj, uintptr_t out);
struct clamor_image { uintptr_t base, lo, hi; char name[4096]; };
size_t clamor_py_images(struct clamor_image *out, size_t max);
size_t clamor_py_array_cache_offset(void);
#define CLAMOR_NO_TARGET 0xffffffff
size_t clamor_py_match(uintptr_t lo, size_t len, const uintptr_t *tlo, const uintptr_t *thi, const uint32_t *tid,
                       size_t nt, const uintptr_t *priv, size_t npriv, uintptr_t *at, uint32_t *id, size_t max,
                       size_t *done);
int clamor_py_sort_words(const uint64_t *addrs, size_t n, uint32_t *order);
struct clamor_relist {
    uint64_t *addrs; uint32_t *tids; int32_t *tags; size_t n;
    uint64_t *bad; size_t nbad;
    uint64_t *pages; uint64_t *ends; size_t npages; uint32_t *targets; size_t ntargets;
};
int clamor_py_reloc_words(const uint64_t *ext, const uint8_t *strict, const int32_t *tags, size_t n,
                          const uint64_t *nulls, const int32_t *null_tags, size_t nnulls, const uintptr_t *tlo,
                          const uintptr_t *thi, const uint32_t *tid, size_t nt, const uintptr_t *priv, size_t npriv,
                          int want_pages, struct clamor_relist *out);
int clamor_py_reloc_splice(const uint64_t *a, const uint32_t *t, const int32_t *g, size_t n, const int32_t *drop,
                           size_t ndrop, const uint64_t *na, const uint32_t *nt, const int32_t *ng, size_t m,
                           struct clamor_relist *out);
struct clamor_pagesort { uint64_t *ranges; int32_t *tags; size_t n; uint64_t *pages; uint64_t *starts; size_t npages; };
int clamor_py_sort_by_page(const uint64_t *ranges, const int32_t *tags, const uint8_t *skip, size_t n,
                           struct clamor_pagesort *out);
void clamor_py_pagesort_free(struct clamor_pagesort *s);
void clamor_py_relist_free(struct clamor_relist *l);
void clamor_py_buffer_free(void *p);
int clamor_py_match_all(const uint64_t *ext, const uint8_t *strict, size_t n, const uintptr_t *tlo,
                        const uintptr_t *thi, const uint32_t *tid, size_t nt, const uintptr_t *priv, size_t npriv,
                        uintptr_t at_out, uintptr_t id_out, uintptr_t which_out);
size_t clamor_py_body_size(uintptr_t obj);
size_t clamor_py_scan(uintptr_t lo, size_t len, const uintptr_t *priv, size_t npriv, uintptr_t *inner,
                      size_t *ninner, size_t maxinner, uintptr_t *outer, size_t *nouter, size_t maxouter);
/* csrc/internal.h: the CPython the module was built for (pyversion.c) */
unsigned long clamor_py_built_for(void);
unsigned long clamor_py_known_minors(void);
/* csrc/internal.h: types made by a class statement told from an extension's (pyshare.c) */
int clamor_py_classes_init(void);
int clamor_py_is_class(uintptr_t type);
