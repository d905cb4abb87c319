/* options.c -- the tunables, the worker's version and the clock: a leaf.
 *
 * DESIGN.  Every setting another file reads lives here, in one table: its
 * default, the environment variable that may set it, and its value as a
 * relaxed atomic.  A module reads a setting with cl_option_get() and never
 * calls the module that happens to use it most, so that no two files of the
 * core call each other for a number.  This file calls nothing of the core
 * but cl_err(): whatever includes internal.h may use it.
 *
 * Each environment variable is read at the moment docs/configuration.md
 * names for it: the file that owns the moment calls cl_option_env() (the
 * pager when it starts, the page server when it starts, a worker's page
 * table when it is made).  An option marked ONCE takes its variable only
 * until the first read or set; the others take it at every such moment,
 * over a value set before.
 *
 * cl_option_get(), the worker's version and cl_now_ns() are atomic loads and
 * clock_gettime(2): async-signal-safe, so the fault handler uses them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#define ONCE 1u /* the environment counts only until the option is first read or set */

static struct option {
    const char *env; /* NULL: no environment variable */
    uint64_t dflt, min;
    unsigned flags;
    _Atomic uint64_t value;
    _Atomic int touched; /* ONCE: read or set already */
} options[CL_OPT_COUNT] = {
#define OPT(name, env, dflt, min, flags) [name] = {env, dflt, min, flags, dflt, 0}
    OPT(CL_OPT_READAHEAD, NULL, (uint64_t)4 << 20, 0, 0),
    OPT(CL_OPT_FETCH_TIMEOUT_MS, "CLAMOR_FETCH_TIMEOUT_MS", 30000, 1, 0),
    OPT(CL_OPT_MAX_MAPPINGS, NULL, 0, 0, 0), /* 0: half of vm.max_map_count */
    OPT(CL_OPT_DIFF_KEEP, "CLAMOR_DIFF_KEEP", (uint64_t)1 << 30, 0, ONCE),
    OPT(CL_OPT_SERVE_RATE, "CLAMOR_SERVE_RATE", 0, 0, 0),
    OPT(CL_OPT_RELOC, NULL, 0, 0, 0),
    OPT(CL_OPT_PARK, "CLAMOR_PARK", 1, 0, 0),
    OPT(CL_OPT_LOG_AHEAD, "CLAMOR_LOG_AHEAD", 1, 0, 0),
#undef OPT
};

uint64_t cl_option_get(enum cl_option o) { return atomic_load_explicit(&options[o].value, memory_order_relaxed); }

void cl_option_set(enum cl_option o, uint64_t v) {
    struct option *t = &options[o];
    atomic_store(&t->touched, 1);
    atomic_store(&t->value, v < t->min ? t->min : v);
}

/* The variable's value, or false if it is unset or not a value of o's. */
static bool parse_env(enum cl_option o, uint64_t *out) {
    const char *v = getenv(options[o].env);
    if (!v || !*v) return false;
    char *end = NULL;
    switch (o) {
    case CL_OPT_FETCH_TIMEOUT_MS: { /* as atoi(3): a positive number of milliseconds */
        long ms = strtol(v, NULL, 10);
        if (ms <= 0 || (unsigned long)ms > UINT32_MAX) return false;
        *out = (uint64_t)ms;
        return true;
    }
    case CL_OPT_SERVE_RATE: { /* bytes per second, a float ("200e6"); up to the next byte */
        double r = strtod(v, NULL);
        if (!(r > 0)) return false;
        *out = r >= 1.8e19 ? UINT64_MAX : (uint64_t)r + ((double)(uint64_t)r < r);
        return true;
    }
    default: { /* a plain number, the whole string */
        unsigned long long n = strtoull(v, &end, 10);
        if (!end || *end) return false;
        *out = (uint64_t)n;
        return true;
    }
    }
}

void cl_option_env(enum cl_option o) {
    struct option *t = &options[o];
    if (!t->env) return;
    if (t->flags & ONCE) {
        if (atomic_exchange(&t->touched, 1)) return;
    }
    uint64_t v;
    if (parse_env(o, &v)) atomic_store(&t->value, v < t->min ? t->min : v);
    else if (o == CL_OPT_SERVE_RATE) atomic_store(&t->value, 0); /* unset: no limit, whatever ran before */
}

/* ---- the public tunables (clamor.h) ------------------------------------- */

void clamor_set_readahead(size_t bytes) { cl_option_set(CL_OPT_READAHEAD, bytes); }
size_t clamor_readahead(void) { return (size_t)cl_option_get(CL_OPT_READAHEAD); }
void clamor_set_fetch_timeout_ms(uint32_t ms) { cl_option_set(CL_OPT_FETCH_TIMEOUT_MS, ms); }
uint32_t clamor_fetch_timeout_ms(void) { return (uint32_t)cl_option_get(CL_OPT_FETCH_TIMEOUT_MS); }

/* The largest value kept is UINT64_MAX - 1, as it always was (UINT64_MAX
 * once meant "not read yet"). */
void clamor_set_diff_keep(uint64_t bytes) { cl_option_set(CL_OPT_DIFF_KEEP, bytes == UINT64_MAX ? bytes - 1 : bytes); }
uint64_t clamor_diff_keep(void) {
    cl_option_env(CL_OPT_DIFF_KEEP);
    return cl_option_get(CL_OPT_DIFF_KEEP);
}

/* The default: half of vm.max_map_count, leaving the other half for the
 * interpreter, libraries, thread stacks and the rest of the process.  Read
 * once, when the first page table is made (cl_pt_init): never from the
 * fault handler, which consults the budget. */
static _Atomic uint32_t default_budget;

void clamor_set_max_mappings(uint32_t n) { cl_option_set(CL_OPT_MAX_MAPPINGS, n); }
uint32_t clamor_max_mappings(void) {
    uint32_t n = (uint32_t)cl_option_get(CL_OPT_MAX_MAPPINGS);
    if (n) return n;
    if ((n = atomic_load_explicit(&default_budget, memory_order_relaxed))) return n;
    long sys = 65530;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%ld", &sys) != 1) sys = 65530;
        fclose(f);
    }
    n = (uint32_t)(sys / 2 > 1024 ? sys / 2 : 512);
    atomic_store(&default_budget, n);
    return n;
}

void clamor_reloc_enable(int on) { cl_option_set(CL_OPT_RELOC, on ? 1 : 0); }
int clamor_reloc_enabled(void) { return (int)cl_option_get(CL_OPT_RELOC); }

/* ---- the worker's version ------------------------------------------------- */

_Atomic uint32_t cl_worker_version, cl_worker_version_top;
_Atomic uint64_t cl_worker_view;

void clamor_set_version(uint32_t version) {
    if (atomic_load(&cl_worker_version) == version) return;
    /* The version first, then the view counter: a server that reads the
     * new count also reads the new version (server.c, serve_get). */
    atomic_store(&cl_worker_version, version);
    if (version > atomic_load(&cl_worker_version_top)) atomic_store(&cl_worker_version_top, version);
    atomic_fetch_add(&cl_worker_view, 1);
}

/* ---- the clock ------------------------------------------------------------ */

uint64_t cl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
