/* samehost.c -- workers on the driver's host map its pages: the location
 * table, and how a worker gets to the driver's memfd.
 *
 * DESIGN.  The driver's memfd holds more than the region: for each page a
 * home (where the region's view of it starts) and a twin, then a pool of
 * spare locations, then a table.  The table says, per page, where its
 * bytes are now and from which version on (internal.h, cl_loc_*), and
 * where they were before that version, for readers of older versions.  The
 * driver never writes a location a reader may map: the first write to a
 * page in a version moves the driver's view of it to a free location holding
 * a copy (version.c), and the old location becomes the version older
 * versions read.  A worker on the same host maps a page from the location
 * the table gives, MAP_PRIVATE, so its own writes (reference counts) stay
 * its own; pagetable.c does the mapping, under the mapping budget.
 *
 * A forked worker inherits the driver's memfd.  Any other worker opens it
 * through /proc/PID/fd/N, which needs the same host, the same PID
 * namespace and the right to read the driver's descriptors (same user or
 * root), and then proves it opened the right file: the table's header
 * holds a random cookie the driver sent along.  A worker in another
 * network namespace is treated as another host (that is what namespace
 * hosts stand for), and fetches.  Every refusal says why.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

static size_t table_bytes(void) {
    size_t n = (size_t)cl_region.npages;
    size_t b = CL_OS_PAGE + n * 16 + n;
    return (b + CL_OS_PAGE - 1) & ~(CL_OS_PAGE - 1);
}

static uint64_t cl_map_table_offset(void) { return cl_region.nlocs << cl_region.page_shift; }
uint64_t cl_map_file_size(void) { return cl_map_table_offset() + table_bytes(); }

static int map_table(int fd, int prot) {
    void *t = mmap(NULL, table_bytes(), prot, MAP_SHARED | MAP_NORESERVE, fd, (off_t)cl_map_table_offset());
    if (t == MAP_FAILED) return cl_err(errno, "mmap of the location table: %s", strerror(errno));
    cl_region.maphdr = t;
    cl_region.loctab = (_Atomic uint64_t *)((char *)t + CL_OS_PAGE);
    cl_region.locprev = (_Atomic uint64_t *)((char *)t + CL_OS_PAGE + cl_region.npages * 8);
    cl_region.locflags = (_Atomic uint8_t *)((char *)t + CL_OS_PAGE + cl_region.npages * 16);
    return 0;
}

static void unmap_table(void) {
    if (cl_region.maphdr) munmap(cl_region.maphdr, table_bytes());
    cl_region.maphdr = NULL;
    cl_region.loctab = NULL;
    cl_region.locprev = NULL;
    cl_region.locflags = NULL;
}

int cl_map_driver_init(int fd) {
    int rc = map_table(fd, PROT_READ | PROT_WRITE);
    if (rc) return rc;
    struct cl_maphdr *h = cl_region.maphdr;
    if (getrandom(h->cookie, sizeof h->cookie, 0) != (ssize_t)sizeof h->cookie) {
        rc = cl_err(errno, "getrandom for the location table's cookie: %s", strerror(errno));
        unmap_table();
        return rc;
    }
    h->npages = cl_region.npages;
    h->nlocs = cl_region.nlocs;
    h->size = cl_region.size;
    h->base = cl_region.base;
    h->page_shift = cl_region.page_shift;
    atomic_thread_fence(memory_order_release);
    h->magic = CL_MAP_MAGIC;
    return 0;
}

static int worker_side(int fd) {
    size_t n = (size_t)cl_region.npages * 4;
    void *w = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (w == MAP_FAILED) return cl_err(errno, "mmap of the mapped-location array: %s", strerror(errno));
    int rc = map_table(fd, PROT_READ);
    if (rc) {
        munmap(w, n);
        return rc;
    }
    cl_region.wloc = w;
    cl_region.srcfd = fd;
    cl_park_init();
    atomic_store(&cl_region.map_on, true);
    return 0;
}

/* In a child forked from the driver (region.c): the inherited view of the
 * table is writable; map it again read-only and start mapping pages. */
int cl_map_child_init(int driver_fd) {
    unmap_table();
    cl_region.wloc = NULL;
    cl_region.srcfd = -1;
    atomic_store(&cl_region.map_on, false);
    return worker_side(driver_fd);
}

void cl_map_close(void) {
    atomic_store(&cl_region.map_on, false);
    cl_park_close();
    unmap_table();
    if (cl_region.wloc) munmap((void *)cl_region.wloc, (size_t)cl_region.npages * 4);
    cl_region.wloc = NULL;
    if (cl_region.srcfd >= 0) close(cl_region.srcfd);
    cl_region.srcfd = -1;
}

void cl_map_mark_used(uint64_t off, uint64_t len) {
    if (!cl_region.locflags || !len) return;
    for (uint64_t p = off >> cl_region.page_shift; p <= (off + len - 1) >> cl_region.page_shift; p++)
        if (!(atomic_load_explicit(&cl_region.locflags[p], memory_order_relaxed) & CL_LOC_USED))
            atomic_fetch_or(&cl_region.locflags[p], CL_LOC_USED);
}

void cl_map_mark_reloc(uint64_t page) {
    if (cl_region.locflags && page < cl_region.npages) atomic_fetch_or(&cl_region.locflags[page], CL_LOC_RELOC);
}

/* ---- the API ------------------------------------------------------------------ */

int clamor_map_share(int on) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER) return cl_err(EPERM, "only the driver shares its pages");
    cl_region.map_share = on != 0;
    return 0;
}

int clamor_map_info(int *fd, uint8_t *cookie) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER || !cl_region.maphdr)
        return cl_err(EPERM, "only the driver has a location table");
    *fd = cl_region.memfd;
    memcpy(cookie, cl_region.maphdr->cookie, sizeof cl_region.maphdr->cookie);
    return 0;
}

int clamor_map_status(void) { return cl_region.role == CLAMOR_ROLE_WORKER && atomic_load(&cl_region.map_on); }

static int ns_of(const char *path, char *out, size_t cap) {
    ssize_t n = readlink(path, out, cap - 1);
    if (n < 0) return errno;
    out[n] = 0;
    return 0;
}

int clamor_map_attach(int pid, int fd, const uint8_t *cookie) {
    if (cl_region.role != CLAMOR_ROLE_WORKER) return cl_err(EPERM, "only a worker maps the driver's pages");
    if (atomic_load(&cl_region.map_on)) return 0;
    if (pid <= 0 || fd < 0) return cl_err(EINVAL, "no driver process or memfd to map (pid %d, fd %d)", pid, fd);
    char path[64], mine[64], theirs[64];
    snprintf(path, sizeof path, "/proc/%d/ns/net", pid);
    int e = ns_of(path, theirs, sizeof theirs);
    if (e) return cl_err(EHOSTUNREACH, "the driver (pid %d) is not a process this worker can see: %s: %s", pid, path,
                         strerror(e));
    if ((e = ns_of("/proc/self/ns/net", mine, sizeof mine)))
        return cl_err(e, "/proc/self/ns/net: %s", strerror(e));
    if (strcmp(mine, theirs) != 0)
        return cl_err(EHOSTUNREACH, "the driver is in another network namespace (%s, this worker %s): "
                      "treated as another host", theirs, mine);
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0) {
        e = errno;
        return cl_err(e, "cannot open the driver's memfd %s: %s%s", path, strerror(e),
                      e == EACCES || e == EPERM ? " (another user, or a container boundary)" : "");
    }
    struct stat st;
    if (fstat(f, &st) != 0 || (uint64_t)st.st_size < cl_map_file_size()) {
        close(f);
        return cl_err(EBADF, "%s is not the driver's region memfd (size %lld, want %llu)", path,
                      (long long)st.st_size, (unsigned long long)cl_map_file_size());
    }
    int rc = worker_side(f);
    if (rc) {
        close(f);
        return rc;
    }
    const struct cl_maphdr *h = cl_region.maphdr;
    if (h->magic != CL_MAP_MAGIC || memcmp(h->cookie, cookie, sizeof h->cookie) != 0 ||
        h->npages != cl_region.npages || h->page_shift != cl_region.page_shift) {
        cl_map_close();
        return cl_err(EBADF, "%s is not this cluster's region (its cookie or geometry differs)", path);
    }
    return 0;
}
