/* binding.h -- the entry points only clamor's Python binding calls.
 *
 * Not installed and not a contract: these drive the machinery that the
 * runtime (clamor/runtime, clamor/dask) builds on the core of clamor.h, and
 * change with it.  Page versions and what follows from them (invalidation,
 * kept copies and diffs, relocations of portable objects), replication
 * between workers, workers on the driver's host mapping its pages, and the
 * plumbing of a forked worker and of libzmq.  cffi reads them through
 * clamor/_cdefs.h; C code of the core includes them through internal.h.
 *
 * The conventions are clamor.h's: an int is 0 or a positive errno value
 * with a detail in clamor_last_error().  None of these functions is
 * async-signal-safe.
 */
#ifndef CLAMOR_BINDING_H
#define CLAMOR_BINDING_H

#include <stddef.h>
#include <stdint.h>

#include "clamor.h"

/* ---- a forked worker -------------------------------------------------------- */

/* A child forked from a process that has a region becomes a worker
 * (clamor_region_attach() in clamor.h).  clamor_fork_parent_endpoint() is the endpoint of the parent's page server
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
 * `path` (the copy that pyzmq loaded; NULL or "": CLAMOR_LIBZMQ, else
 * libzmq.so.5), before anything starts a socket.  Idempotent.  ENOENT if the
 * library cannot be opened, ENOSYS if a symbol is missing. */
int clamor_zmq_load(const char *path);

/* ---- kept copies (workers) ---------------------------------------------- */

/* Worker: at most this many bytes of copies kept for diffs (0: none kept,
 * no diffs asked for).  A fetching worker keeps the copy of a page it held
 * when the driver changes it, and asks for the page with the version the
 * copy is; the driver may answer with the words that changed.  Default
 * CLAMOR_DIFF_KEEP, else 1 GiB.  Thread-safe. */
void clamor_set_diff_keep(uint64_t bytes);
uint64_t clamor_diff_keep(void);

/* ---- page versions ------------------------------------------------------ */

/* A version numbers a state of the region that tasks read: the runtime
 * begins version v before it submits tasks that read the region as it is
 * then, and a worker sets the version of the task it runs.  Versions only
 * grow.  (The runtime calls its logical units of work stages; a stage's
 * tasks may read at one version or another.) */

/* Driver: version `version` (> every earlier one) begins now.  The first
 * call write-protects the region: from then on the first write to a page
 * logs the page's previous content as a version, and pages whose bytes
 * changed since the previous clamor_version_begin() are listed
 * (clamor_changed_count/copy) so that workers drop their copies.  A page
 * written back to identical bytes is not listed.  One at a time with the
 * other version calls; driver threads may keep writing. */
int clamor_version_begin(uint32_t version);
uint64_t clamor_changed_count(void);
/* Driver: how the region is write-protected since the first version:
 * CLAMOR_WPROT_USERFAULTFD (a system call that writes into a protected page
 * waits while its version is logged, as a user-space write does),
 * CLAMOR_WPROT_MPROTECT (such a system call fails with EFAULT unless the
 * pages were opened first: clamor_prefetch, or a block handed out inside
 * heap()), or CLAMOR_WPROT_NONE (no version yet, or not the driver).  The
 * environment variable CLAMOR_WRITE_PROTECT, read at the first version,
 * says which to use: auto (the default: userfaultfd if the process may use
 * it), userfaultfd (else the first version fails with ENOTSUP), mprotect.
 * Why this mechanism runs goes to `reason` (cap bytes, may be NULL).
 * Thread-safe. */
#define CLAMOR_WPROT_NONE 0
#define CLAMOR_WPROT_MPROTECT 1
#define CLAMOR_WPROT_USERFAULTFD 2
int clamor_write_protection(char *reason, size_t cap);
/* Driver: pages logged (first writes) since the last clamor_version_begin();
 * 0 also before the first.  A caller asks it to begin a version only when
 * something was written. */
uint64_t clamor_dirty_count(void);
/* Driver: copy up to `n` of those pages to `out` (in no order, a page
 * possibly twice); returns how many there are.  A caller that remembers
 * what it read of the region between versions asks which pages were
 * written since, before the next version begins. */
uint64_t clamor_dirty_copy(uint64_t *out, uint64_t n);
void clamor_changed_copy(uint64_t *out, uint64_t n);
/* Pages of the last clamor_version_begin() whose bytes did not change but
 * moved to another location of the driver's memfd (logged with a group):
 * workers that map the driver's pages drop them; the others keep theirs. */
uint64_t clamor_moved_count(void);
/* Driver: no worker that maps pages reads, through a mapping, a location
 * of a version below `version` (the lowest version such a worker last ran
 * or runs at).  Versions that only those readers needed are freed by the
 * next clamor_versions_keep(). */
void clamor_versions_map_floor(uint32_t version);
void clamor_moved_copy(uint64_t *out, uint64_t n);
/* Driver: the last version begun (0 before the first). */
uint32_t clamor_version_current(void);
/* Driver: *differs = 1 if a byte of [a, a+len) in the region reads
 * otherwise now than in version `version` (the driver wrote it since that
 * version began), else 0.  0, or EINVAL (not the region's range), EPERM
 * (not the driver), ENOMEM. */
int clamor_version_differs(uintptr_t a, size_t len, uint32_t version, int *differs);
/* Driver: keep only what the versions in `versions` (n of them, ascending:
 * those a task may still read at) need; the lowest becomes the floor below
 * which a request for a changed page gets ESTALE.  0, or EINVAL if not
 * sorted. */
int clamor_versions_keep(const uint32_t *versions, size_t n);
/* Driver: log now, as first writes in this version would, the pages that
 * changed at the last clamor_version_begin() and at one of the few
 * versions before (pages the driver rewrites at every version), so that
 * its writes to them take no fault; called after clamor_versions_keep(),
 * once per version (later calls do nothing).  Returns the pages logged.
 * CLAMOR_LOG_AHEAD=0 (read at the first version) turns it off. */
uint64_t clamor_versions_log_ahead(void);
/* Worker: the driver declared the peer whose page server is `endpoint` lost;
 * hinted requests stop going to it. */
void clamor_peer_gone(const char *endpoint);

/* Worker: the version the task about to run reads; page requests carry it
 * and are answered with the page as that version has it.  A version older
 * than the highest set so far (a lineage re-run) first needs the pages
 * changed in between invalidated; until a newer version is set again, this
 * worker's page server answers peers' requests of newer versions with
 * EAGAIN.  Task thread, between tasks. */
void clamor_set_version(uint32_t version);
/* Worker: drop this worker's copies of the listed pages (changed by the
 * driver); fetches of them in flight are discarded on arrival.  Memory is
 * returned.  A page index with CLAMOR_INVAL_MOVED set names a page whose
 * bytes did not change but moved in the driver's memfd: it is dropped only
 * where this worker maps the driver's copy (a copy of its own, fetched and
 * perhaps relocated, still holds the same bytes).  Thread-safe. */
#define CLAMOR_INVAL_MOVED ((uint64_t)1 << 63)
int clamor_invalidate(const uint64_t *pages, uint64_t n);
/* Worker: clamor_set_version(version) and clamor_invalidate(pages, n) in
 * one step: no page mapped or fetched meanwhile reads a dropped page as
 * the version left had it.  Task thread, between tasks. */
int clamor_change_version(uint32_t version, const uint64_t *pages, uint64_t n);

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
/* Driver: the relocations of page `page` as of version `version` (until a
 * later call replaces them), sorted by word; n may be 0.  EPERM if not the
 * driver, ERANGE for a page outside the region, EINVAL for a word outside
 * the page.  Thread-safe. */
int clamor_reloc_set(uint32_t version, uint64_t page, const struct clamor_reloc *r, uint32_t n);
/* Driver: the lists of pages[0..npages) (ascending) from the words
 * addrs[0..n) (ascending, aligned, each once; words of other pages are
 * skipped) naming targets tids[], each word's value read now: a page's
 * list is set at `version` (as clamor_reloc_set) only where it differs
 * from the page's newest list (none: no word).  changed[k]: 1 if page k's
 * list was set; counts[k]: its words.  0, or EPERM, EINVAL, ENOMEM. */
int clamor_reloc_set_words(uint32_t version, const uint64_t *pages, size_t npages, const uint64_t *addrs,
                           const uint32_t *tids, size_t n, uint8_t *changed, uint32_t *counts);
/* The list of `page` a request at `version` gets (the newest from that
 * version or before, else the oldest) into out[0..max): *n its entries (0:
 * none).  0, or ERANGE (more than max: *n says how many). */
int clamor_reloc_list(uint64_t page, uint32_t version, struct clamor_reloc *out, uint32_t max, uint32_t *n);
/* Driver: forget the lists no request at version >= floor can be served. */
void clamor_reloc_prune(uint32_t floor);
/* Driver: the bytes the lists held keep (every version not pruned, and
 * the tables that find them).  Thread-safe. */
size_t clamor_reloc_nbytes(void);
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

/* ---- diagnostics ------------------------------------------------------------ */

/* GOT slots clamor_interpose_refresh() has patched so far. */
unsigned long clamor_interpose_slots(void);

#endif /* CLAMOR_BINDING_H */
