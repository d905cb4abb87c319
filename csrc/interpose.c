/* interpose.c -- route the C heap of extension modules into the region.
 *
 * DESIGN.  Inside `with clamor.heap():` every allocation the current thread
 * makes must land in the region, including those of C and C++ extension
 * modules that call malloc directly (scipy's cKDTree nodes come from
 * operator new, which is malloc in libstdc++).  Instead of LD_PRELOAD, which
 * would need a relaunch, clamor patches the global offset table (GOT) of
 * every loaded shared object at run time: the slots for malloc, calloc,
 * realloc, free, posix_memalign, aligned_alloc, memalign, valloc,
 * malloc_usable_size and dlopen point at the wrappers below.  The dlopen
 * wrapper patches libraries loaded later, so a module imported inside the
 * block is covered too.
 *
 * A wrapper checks one thread-local counter: zero means the original glibc
 * functions (__libc_malloc and friends), so outside the block malloc does
 * what it did, at the cost of that check.  Memory is routed by its address,
 * not by the block: free() of a region pointer always goes to clamor_free
 * (never to glibc), wherever and whenever it happens; on a worker it is a
 * no-op, since workers never free region memory.
 *
 * Function pointers to these stored in a library's data (an allocator
 * table) are patched too.
 *
 * Not patched: glibc and the dynamic loader themselves (their internal
 * calls do not go through a GOT), and clamor's own module, whose allocator
 * keeps its bookkeeping in the ordinary heap.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <elf.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

__thread int cl_heap_depth __attribute__((tls_model("initial-exec")));

/* Threads a block starts (a library's worker pool inside fit()) allocate in
 * the region while that block is open: each outermost block has a serial,
 * listed in open_blocks while it runs; a thread that adopted one (at its
 * start) is inside it while it is listed, and outside once it closes, even
 * if the thread lives on. */
#define OPEN_MAX 64
static _Atomic uint64_t open_blocks[OPEN_MAX];
static _Atomic uint64_t block_serials;
static __thread uint64_t my_block;   /* the serial of this thread's outermost block */
__thread uint64_t cl_heap_adopted __attribute__((tls_model("initial-exec")));

int cl_adopted_open(void) {
    uint64_t b = cl_heap_adopted;
    for (int i = 0; i < OPEN_MAX; i++)
        if (atomic_load_explicit(&open_blocks[i], memory_order_acquire) == b) return 1;
    return 0;
}

static void block_open(void) {
    my_block = atomic_fetch_add(&block_serials, 1) + 1;
    for (int i = 0; i < OPEN_MAX; i++) {
        uint64_t free_slot = 0;
        if (atomic_compare_exchange_strong(&open_blocks[i], &free_slot, my_block)) return;
    }
    my_block = 0;   /* more than OPEN_MAX threads in blocks: threads this one starts stay outside */
}

static void block_close(void) {
    for (int i = 0; my_block && i < OPEN_MAX; i++) {
        uint64_t mine = my_block;
        if (atomic_compare_exchange_strong(&open_blocks[i], &mine, 0)) break;
    }
    my_block = 0;
}

uint64_t clamor_heap_block(void) { return CL_IN_HEAP() ? my_block : 0; }

void clamor_heap_adopt(uint64_t block) { cl_heap_adopted = block; }

static inline bool in_region(const void *p) { return cl_in_region((uintptr_t)p); }

/* ---- wrappers ---------------------------------------------------------------- */

static void *w_malloc(size_t n) {
    return CL_IN_HEAP() ? clamor_malloc(n ? n : 1) : __libc_malloc(n);
}

static void *w_calloc(size_t n, size_t sz) {
    return CL_IN_HEAP() ? clamor_calloc(n, sz) : __libc_calloc(n, sz);
}

static void w_free(void *p) {
    if (!p) return;
    if (in_region(p)) {
        if (cl_region.role == CLAMOR_ROLE_DRIVER) clamor_free(p);
        else CL_COUNT(region_frees, 1); /* a worker never frees region memory */
        return;
    }
    __libc_free(p);
}

static void *w_realloc(void *p, size_t n) {
    if (p && in_region(p)) {
        if (cl_region.role == CLAMOR_ROLE_DRIVER) return clamor_realloc(p, n);
        /* worker: a private copy; the region block stays (its old size is
         * the driver's to know: copy what can be read of n bytes) */
        void *q = __libc_malloc(n);
        if (q) memcpy(q, p, cl_prefetch_readable(p, n));
        return q;
    }
    if (CL_IN_HEAP()) { /* move the block into the region */
        void *q = clamor_malloc(n ? n : 1);
        if (q && p) {
            size_t old = malloc_usable_size(p);
            memcpy(q, p, old < n ? old : n);
            __libc_free(p);
        }
        return q;
    }
    return __libc_realloc(p, n);
}

static int w_posix_memalign(void **out, size_t align, size_t n) {
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = CL_IN_HEAP() ? clamor_aligned_alloc(align, n ? n : 1) : __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

static void *w_aligned_alloc(size_t align, size_t n) {
    return CL_IN_HEAP() ? clamor_aligned_alloc(align, n ? n : 1) : __libc_memalign(align, n);
}

static void *w_valloc(size_t n) { return w_aligned_alloc((size_t)sysconf(_SC_PAGESIZE), n); }

/* memalign takes any alignment, as glibc's does: the next power of two, at
 * least a pointer's size. */
static void *w_memalign(size_t align, size_t n) {
    size_t a = sizeof(void *);
    while (a < align && a < ((size_t)1 << (sizeof(size_t) * 8 - 2))) a <<= 1;
    return w_aligned_alloc(a, n);
}

static void *w_reallocarray(void *p, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return w_realloc(p, total);
}

static size_t w_usable_size(void *p) {
    if (p && in_region(p)) return clamor_usable_size(p);
    return malloc_usable_size(p);
}

static void *(*real_dlopen)(const char *, int);
static void *w_dlopen(const char *file, int mode) {
    void *h = real_dlopen(file, mode);
    if (h) clamor_interpose_refresh(); /* patch what it brought in */
    return h;
}

static const struct {
    const char *name;
    void *fn;
} table[] = {
    {"malloc", (void *)w_malloc},
    {"calloc", (void *)w_calloc},
    {"realloc", (void *)w_realloc},
    {"free", (void *)w_free},
    {"posix_memalign", (void *)w_posix_memalign},
    {"aligned_alloc", (void *)w_aligned_alloc},
    {"memalign", (void *)w_memalign},
    {"reallocarray", (void *)w_reallocarray},
    {"valloc", (void *)w_valloc},
    {"malloc_usable_size", (void *)w_usable_size},
    {"dlopen", (void *)w_dlopen},
};
#define NTABLE (sizeof table / sizeof table[0])

/* ---- GOT patching -------------------------------------------------------------- */

static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t self_base; /* load address of the module holding this code */
static unsigned long patched_slots;

static bool skip_object(const struct dl_phdr_info *info) {
    const char *n = info->dlpi_name;
    if (info->dlpi_addr == self_base) return true;
    if (!n) return false;
    const char *b = strrchr(n, '/');
    b = b ? b + 1 : n;
    return !strncmp(b, "libc.so", 7) || !strncmp(b, "ld-linux", 8) || !strncmp(b, "linux-vdso", 10) ||
           !strncmp(b, "libc-", 5);
}

static void patch_slot(uintptr_t slot, void *fn, const struct dl_phdr_info *info) {
    void **p = (void **)slot;
    if (*p == fn) return;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t page = slot & ~(uintptr_t)(pg - 1);
    /* RELRO pages are read-only after relocation: open, write, close. */
    bool relro = false, writable = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (slot < lo || slot >= lo + ph->p_memsz) continue;
        if (ph->p_type == PT_GNU_RELRO) relro = true;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) writable = true;
    }
    /* a word in a read-only segment (text relocations) is left alone */
    if (!relro && !writable) return;
    if (relro && mprotect((void *)page, (size_t)pg, PROT_READ | PROT_WRITE)) return;
    __atomic_store_n(p, fn, __ATOMIC_RELEASE);
    if (relro) mprotect((void *)page, (size_t)pg, PROT_READ);
    patched_slots++;
}

static void patch_relocs(const struct dl_phdr_info *info, const ElfW(Rela) *rel, size_t n, const ElfW(Sym) *symtab,
                         const char *strtab) {
    for (size_t i = 0; i < n; i++) {
        unsigned type = ELF64_R_TYPE(rel[i].r_info);
        /* JUMP_SLOT and GLOB_DAT: calls and address loads through the GOT.
         * R_X86_64_64 with no addend: a function pointer stored in data,
         * such as a default allocator table {malloc, free} (cffi keeps
         * `free` so): left alone, a block from the patched malloc would
         * reach glibc's free through it. */
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT && !(type == R_X86_64_64 && rel[i].r_addend == 0))
            continue;
        const char *name = strtab + symtab[ELF64_R_SYM(rel[i].r_info)].st_name;
        for (size_t k = 0; k < NTABLE; k++)
            if (!strcmp(name, table[k].name)) {
                patch_slot(info->dlpi_addr + rel[i].r_offset, table[k].fn, info);
                break;
            }
    }
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    (void)arg;
    if (skip_object(info)) return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmpsz = 0, relasz = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)d->d_un.d_ptr; break;
        case DT_STRTAB: strtab = (const char *)d->d_un.d_ptr; break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)d->d_un.d_ptr; break;
        case DT_PLTRELSZ: jmpsz = d->d_un.d_val; break;
        case DT_RELA: rela = (const ElfW(Rela) *)d->d_un.d_ptr; break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        }
    }
    if (!symtab || !strtab) return 0;
    if (jmprel) patch_relocs(info, jmprel, jmpsz / sizeof(ElfW(Rela)), symtab, strtab);
    if (rela) patch_relocs(info, rela, relasz / sizeof(ElfW(Rela)), symtab, strtab);
    return 0;
}

int clamor_interpose_refresh(void) {
    pthread_mutex_lock(&patch_lock);
    if (!self_base) {
        Dl_info di;
        if (dladdr((void *)clamor_interpose_refresh, &di)) self_base = (uintptr_t)di.dli_fbase;
        real_dlopen = (void *(*)(const char *, int))dlsym(RTLD_DEFAULT, "dlopen");
    }
    dl_iterate_phdr(patch_object, NULL);
    pthread_mutex_unlock(&patch_lock);
    return 0;
}

unsigned long clamor_interpose_slots(void) { return patched_slots; }

static _Atomic int heap_threads; /* threads inside a heap block (not suspended) */

int clamor_heap_enter(void) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER)
        return cl_err(cl_region.role ? EPERM : ENXIO, "clamor.heap() needs the driver's region");
    if (cl_heap_depth++ == 0) {
        atomic_fetch_add(&heap_threads, 1);
        block_open();
    }
    return 0;
}

void clamor_heap_exit(void) {
    if (cl_heap_depth > 0 && --cl_heap_depth == 0) {
        atomic_fetch_sub(&heap_threads, 1);
        block_close();
    }
}

int clamor_heap_active(void) { return cl_heap_depth; }

int clamor_heap_suspend(void) {
    int d = cl_heap_depth;
    if (d) {
        cl_heap_depth = 0;
        atomic_fetch_sub(&heap_threads, 1);
    }
    return d;
}

void clamor_heap_resume(int depth) {
    if (depth <= 0 || cl_heap_depth) return;
    cl_heap_depth = depth;
    atomic_fetch_add(&heap_threads, 1);
}

int clamor_heap_threads(void) { return atomic_load(&heap_threads); }

/* In a child of fork(): it is a worker now, which never allocates in the
 * region, so the block the forking thread was in does not carry over (and
 * the other threads are gone). */
void cl_heap_reset_after_fork(void) {
    cl_heap_depth = 0;
    cl_heap_adopted = my_block = 0;
    atomic_store(&heap_threads, 0);
    for (int i = 0; i < OPEN_MAX; i++) atomic_store(&open_blocks[i], 0);
}
