/* fault_micro.c -- what one remote page fault costs, next to what it is made of.
 *
 * Four figures, measured in the same run on 64 KiB pages over loopback:
 *
 *   remote_fault_us  a worker (forked from the driver, so it is a worker by
 *                    itself) touches a page that is not present: SIGSEGV,
 *                    hand-over to the pager thread, GET to the driver's page
 *                    server, 64 KiB reply, install, wake.  Read-ahead off,
 *                    one page at a time, random pages.
 *   zmq_rtt_us       the floor under it: a 32-byte request and a 32-byte
 *                    header + 64 KiB reply between two processes, DEALER to
 *                    ROUTER, through the same dlopen'ed libzmq, no clamor.
 *   local_fault_us   SIGSEGV + mprotect round trip on a page that is already
 *                    local (a private page closed with mprotect; the handler
 *                    opens it and the access is retried).
 *   map_fault_us     same host, map mode: a second worker, forked after the
 *                    driver called clamor_map_share(1) and clamor_version_begin(1),
 *                    at version 1, touches a driver page it does not have:
 *                    SIGSEGV, the handler mmaps the driver's memfd over the
 *                    page's aligned 4 MiB window (64 pages, one mmap, no
 *                    copy, no pager), and the retried access takes the
 *                    kernel's minor fault on the driver's page-cache page.
 *                    Each touch is the first page of a different 4 MiB
 *                    window, windows in random order (never 1..16 windows
 *                    forward from the touch before: the handler takes a
 *                    step of 1 or 8 windows for a scan and has the pager
 *                    map the windows ahead), so every touch is a mapping
 *                    fault.  A buffer of n + 20 windows: 280 MiB smoke,
 *                    1.25 GiB quick, 7.9 GiB full, of address space; only
 *                    the touched pages are written.
 *
 * ratio = remote_fault_us / zmq_rtt_us (medians): how much the fault path adds
 * on top of the network round trip it cannot avoid.  map_vs_local =
 * map_fault_us / local_fault_us (medians; target <= 3): what mapping a
 * driver page costs over the cheapest fault there is.  The last line of
 * output is one JSON object with every figure.  Run it through
 * bench/fault_micro.py, which builds it and finds pyzmq's libzmq.
 *
 * usage: fault_micro [--quick | --smoke] [-n N] [--mib M] [--libzmq PATH]
 *        (libzmq path also from CLAMOR_LIBZMQ; --mib sizes the remote-fault
 *        buffer; the map buffer follows from N)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clamor.h"
#include "binding.h" /* what only the runtime calls: versions, same-host mapping, a forked worker, libzmq */
#include "internal.h" /* cl_security_socket: a socket as the core makes them */
#include "wire.h"
#include "zmqdl.h"

#define PAGE ((size_t)64 << 10)
#define MAP_WINDOW ((size_t)4 << 20) /* pagetable.c maps aligned windows of this size */
#define STREAM_STEP 16 /* map touches never step forward 1..16 windows (fault.c reads 1 and 8 as a scan) */
#define WARMUP 20
#define CHILD_TIMEOUT_MS 180000

struct summary {
    int ok;
    long n;
    double mean, p50, p99, max;
    double pager_p50, pager_p99; /* worker only: the pager's send->reply latency */
    unsigned long faults, fetched, mapped, errors;
    char why[200];
};

static pid_t children[4];
static int nchildren;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static uint64_t rng = 0x853c49e6748fea9bull;
static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void summarize(double *v, long n, struct summary *s) {
    double sum = 0;
    for (long i = 0; i < n; i++) sum += v[i];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s->n = n;
    s->mean = sum / (double)n;
    s->p50 = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    long k = (long)ceil(0.99 * (double)n) - 1;
    s->p99 = v[k < 0 ? 0 : k];
    s->max = v[n - 1];
    s->ok = 1;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fault_micro: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    for (int i = 0; i < nchildren; i++)
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
        }
    exit(1);
}

/* A child that dies with its parent, and reports one summary on a pipe. */
static pid_t spawn(int *rfd, void (*body)(int wfd, void *arg), void *arg) {
    int p[2];
    if (pipe(p) != 0) die("pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        body(p[1], arg);
        _exit(0);
    }
    close(p[1]);
    children[nchildren++] = pid;
    *rfd = p[0];
    return pid;
}

static void report(int wfd, struct summary *s) {
    if (write(wfd, s, sizeof *s) != (ssize_t)sizeof *s) _exit(3);
}

static void child_fail(int wfd, const char *what) {
    struct summary s = {0};
    snprintf(s.why, sizeof s.why, "%s (%s)", what, clamor_last_error());
    report(wfd, &s);
    _exit(2);
}

/* Wait for a child's summary (the caller may serve requests meanwhile). */
static void reap(pid_t pid, int rfd, struct summary *s, const char *what) {
    struct pollfd pf = {rfd, POLLIN, 0};
    int r = poll(&pf, 1, CHILD_TIMEOUT_MS);
    ssize_t got = r > 0 ? read(rfd, s, sizeof *s) : -1;
    close(rfd);
    if (got != (ssize_t)sizeof *s) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        die("%s: the child sent no result (%s)", what, r == 0 ? "timed out" : "died");
    }
    int st;
    waitpid(pid, &st, 0);
    for (int i = 0; i < nchildren; i++)
        if (children[i] == pid) children[i] = 0;
    if (!s->ok) die("%s failed: %s", what, s->why);
}

/* ---- local fault: SIGSEGV + mprotect, page already here ------------------- */

static char *local_page;

static void local_handler(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    char *a = si->si_addr;
    if (a >= local_page && a < local_page + PAGE) {
        mprotect(local_page, PAGE, PROT_READ | PROT_WRITE);
        return;
    }
    signal(SIGSEGV, SIG_DFL); /* a real crash: die by it */
}

static void measure_local(long n, struct summary *s) {
    local_page = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (local_page == MAP_FAILED) die("mmap: %s", strerror(errno));
    memset(local_page, 7, PAGE);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = local_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old);
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) die("out of memory");
    for (long i = -WARMUP; i < n; i++) {
        mprotect(local_page, PAGE, PROT_NONE); /* re-arm, not timed */
        double t0 = now_us();
        (void)*(volatile char *)(local_page + (size_t)(rnd() % PAGE));
        double t1 = now_us();
        if (i >= 0) v[i] = t1 - t0;
    }
    sigaction(SIGSEGV, &old, NULL);
    summarize(v, n, s);
    free(v);
    munmap(local_page, PAGE);
}

/* ---- raw libzmq round trip --------------------------------------------------- */

struct rtt_arg {
    const char *endpoint;
    long n;
};

static void rtt_client(int wfd, void *argp) {
    struct rtt_arg *a = argp;
    alarm(CHILD_TIMEOUT_MS / 1000);
    void *ctx = cl_zmq.ctx_new(), *s = ctx ? cl_security_socket(ctx, CL_ZMQ_DEALER) : NULL;
    if (!s || cl_zmq.connect(s, a->endpoint) != 0) child_fail(wfd, "rtt: cannot connect");
    char *buf = malloc(PAGE);
    double *v = malloc(sizeof(double) * (size_t)a->n);
    if (!buf || !v) child_fail(wfd, "rtt: out of memory");
    uint8_t hdr[CL_WIRE_HDR], rh[CL_WIRE_HDR];
    for (long i = -WARMUP; i < a->n; i++) {
        struct cl_wire_hdr h = {.type = CL_WIRE_GET, .index = rnd() % 4096, .count = 1, .tag = (uint32_t)i};
        cl_wire_encode(&h, hdr);
        double t0 = now_us();
        if (cl_zmq.send(s, hdr, sizeof hdr, 0) != (int)sizeof hdr) child_fail(wfd, "rtt: send");
        if (cl_zmq.recv(s, rh, sizeof rh, 0) != (int)sizeof rh) child_fail(wfd, "rtt: recv header");
        if (cl_zmq.recv(s, buf, PAGE, 0) != (int)PAGE) child_fail(wfd, "rtt: recv payload");
        double t1 = now_us();
        if (i >= 0) v[i] = t1 - t0;
    }
    struct summary sum = {0};
    summarize(v, a->n, &sum);
    report(wfd, &sum);
    cl_zmq.close(s);
    cl_zmq.ctx_term(ctx);
}

static void measure_rtt(long n, struct summary *s) {
    void *ctx = cl_zmq.ctx_new(), *r = ctx ? cl_security_socket(ctx, CL_ZMQ_ROUTER) : NULL;
    if (!r || cl_zmq.bind(r, "tcp://127.0.0.1:*") != 0) die("rtt: cannot bind a ROUTER");
    char ep[256];
    size_t sz = sizeof ep;
    cl_zmq.getsockopt(r, CL_ZMQ_LAST_ENDPOINT, ep, &sz);
    char *payload = malloc(PAGE);
    if (!payload) die("out of memory");
    memset(payload, 0x3c, PAGE);
    struct rtt_arg a = {ep, n};
    int rfd;
    pid_t pid = spawn(&rfd, rtt_client, &a);
    /* Serve like the page server: [id][hdr] in, [id][hdr][64 KiB] out. */
    double deadline = now_us() + CHILD_TIMEOUT_MS * 1e3;
    for (;;) {
        cl_zmq_pollitem it[2] = {{r, 0, CL_ZMQ_POLLIN, 0}, {NULL, rfd, CL_ZMQ_POLLIN, 0}};
        cl_zmq.poll(it, 2, 200);
        if (it[0].revents & CL_ZMQ_POLLIN) {
            uint8_t id[256], hdr[64];
            int idn = cl_zmq.recv(r, id, sizeof id, 0);
            int hn = cl_zmq.recv(r, hdr, sizeof hdr, 0);
            if (idn <= 0 || hn != CL_WIRE_HDR) continue;
            struct cl_wire_hdr h;
            cl_wire_decode(hdr, (size_t)hn, &h);
            h.type = CL_WIRE_PAGES;
            cl_wire_encode(&h, hdr);
            cl_zmq.send(r, id, (size_t)idn, CL_ZMQ_SNDMORE);
            cl_zmq.send(r, hdr, CL_WIRE_HDR, CL_ZMQ_SNDMORE);
            cl_zmq.send(r, payload, PAGE, 0);
            continue;
        }
        if (it[1].revents) break; /* result (or EOF: the child died) */
        if (now_us() > deadline) break;
    }
    reap(pid, rfd, s, "zmq round trip");
    cl_zmq.close(r);
    cl_zmq.ctx_term(ctx);
    free(payload);
}

/* ---- remote fault: a forked worker touches pages the driver serves ---------- */

struct fault_arg {
    const uint64_t *buf;
    size_t pages;
    long n;
};

static uint64_t pattern(size_t word) { return word * 0x9e3779b97f4a7c15ull + 1; }

static void worker(int wfd, void *argp) {
    struct fault_arg *a = argp;
    alarm(CHILD_TIMEOUT_MS / 1000);
    /* fork made this process a worker, with every page absent */
    if (clamor_region_role() != CLAMOR_ROLE_WORKER) child_fail(wfd, "the forked child is not a worker");
    clamor_set_readahead(0);
    /* fork started the pager (and this worker's page server) already */
    int rc = clamor_pager_start(clamor_fork_parent_endpoint());
    if (rc != 0 && rc != EBUSY) child_fail(wfd, "clamor_pager_start");
    size_t *order = malloc(sizeof(size_t) * a->pages);
    double *v = malloc(sizeof(double) * (size_t)a->n);
    if (!order || !v) child_fail(wfd, "out of memory");
    for (size_t i = 0; i < a->pages; i++) order[i] = i;
    for (size_t i = a->pages - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = (size_t)(rnd() % (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    long bad = 0;
    const size_t wpp = PAGE / sizeof(uint64_t);
    for (long i = -WARMUP; i < a->n; i++) {
        size_t pg = order[i + WARMUP], w = pg * wpp + (size_t)(rnd() % wpp);
        double t0 = now_us();
        uint64_t x = ((volatile const uint64_t *)a->buf)[w];
        double t1 = now_us();
        if (x != pattern(w)) bad++;
        if (i >= 0) v[i] = t1 - t0;
    }
    if (bad) child_fail(wfd, "a fetched page had the wrong bytes");
    struct clamor_stats st;
    clamor_stats_get(&st);
    struct summary sum = {0};
    summarize(v, a->n, &sum);
    sum.pager_p50 = st.latency_p50_us;
    sum.pager_p99 = st.latency_p99_us;
    sum.faults = st.faults;
    sum.fetched = st.pages_fetched;
    sum.errors = st.fetch_errors;
    report(wfd, &sum);
    clamor_pager_stop();
}

/* ---- map fault: a worker on the driver's host maps the driver's pages ------ */

/* The map buffer has `windows` aligned 4 MiB windows; the driver wrote the
 * first page of each (pattern by word index in the buffer), and the worker
 * touches that page, once per window, windows in random order. */
struct map_arg {
    const uint64_t *buf;
    size_t windows;
    long n;
};

static void map_worker(int wfd, void *argp) {
    struct map_arg *a = argp;
    alarm(CHILD_TIMEOUT_MS / 1000);
    if (clamor_region_role() != CLAMOR_ROLE_WORKER) child_fail(wfd, "the forked child is not a worker");
    if (!clamor_map_status()) child_fail(wfd, "the child forked after clamor_map_share(1) does not map");
    clamor_set_readahead(0);
    int rc = clamor_pager_start(clamor_fork_parent_endpoint());
    if (rc != 0 && rc != EBUSY) child_fail(wfd, "clamor_pager_start");
    clamor_set_version(1); /* version 0 faults are fetched, not mapped */
    size_t *order = malloc(sizeof(size_t) * a->windows);
    double *v = malloc(sizeof(double) * (size_t)a->n);
    if (!order || !v) child_fail(wfd, "out of memory");
    for (size_t i = 0; i < a->windows; i++) order[i] = i;
    for (size_t i = a->windows - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = (size_t)(rnd() % (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    /* No touch a short step forward from the one before: the fault handler
     * takes a fault 1 or 8 windows after the previous one for a scan, and
     * has the pager map and fill the next windows, so touches there would
     * not fault and a touch that waits for the pager would take
     * milliseconds.  Greedy: at each position, the first window further on
     * that is no step of 1..STREAM_STEP (the last few may find none: the
     * counts at the end show it). */
    for (size_t i = 1; i < a->windows; i++) {
        for (size_t j = i; j < a->windows; j++) {
            if (order[j] > order[i - 1] && order[j] - order[i - 1] <= STREAM_STEP) continue;
            size_t t = order[i];
            order[i] = order[j];
            order[j] = t;
            break;
        }
    }
    long bad = 0;
    const size_t wpp = PAGE / sizeof(uint64_t), wpw = MAP_WINDOW / sizeof(uint64_t);
    for (long i = -WARMUP; i < a->n; i++) {
        size_t w = order[i + WARMUP] * wpw + (size_t)(rnd() % wpp);
        double t0 = now_us();
        uint64_t x = ((volatile const uint64_t *)a->buf)[w];
        double t1 = now_us();
        if (x != pattern(w)) bad++;
        if (i >= 0) v[i] = t1 - t0;
    }
    if (bad) child_fail(wfd, "a mapped page had the wrong bytes");
    struct clamor_stats st;
    clamor_stats_get(&st);
    struct summary sum = {0};
    summarize(v, a->n, &sum);
    sum.faults = st.faults;
    sum.fetched = st.pages_fetched;
    sum.mapped = st.pages_mapped;
    sum.errors = st.fetch_errors;
    report(wfd, &sum);
    clamor_pager_stop();
}

/* ---- main -------------------------------------------------------------------- */

int main(int argc, char **argv) {
    long n = 2000, mib = 256;
    const char *libzmq = NULL, *mode = "full"; /* NULL: clamor_zmq_load reads CLAMOR_LIBZMQ */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) n = 300, mib = 64, mode = "quick";
        else if (!strcmp(argv[i], "--smoke")) n = 50, mib = 16, mode = "smoke";
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--libzmq") && i + 1 < argc) libzmq = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick|--smoke] [-n N] [--mib M] [--libzmq PATH]\n", argv[0]);
            return 2;
        }
    }
    size_t bytes = (size_t)mib << 20, pages = bytes / PAGE;
    if (n < 1 || (size_t)n + WARMUP > pages) die("-n %ld needs more than %zu pages: raise --mib", n, pages);
    /* map mode: one window per touch, so that every touch maps */
    size_t windows = (size_t)n + WARMUP, map_bytes = windows * MAP_WINDOW;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (clamor_zmq_load(libzmq) != 0) die("%s", clamor_last_error());

    struct summary local, rtt, fault, map;
    measure_local(n < 1000 ? 1000 : n, &local);

    /* the driver: a region of 64 KiB pages, two buffers, a page server */
    size_t region = (((bytes + map_bytes + MAP_WINDOW) >> 30) + 1) << 30;
    if (clamor_region_init(0, region, PAGE) != 0) die("clamor_region_init: %s", clamor_last_error());
    uint64_t *buf = clamor_aligned_alloc(PAGE, bytes);
    if (!buf) die("clamor_aligned_alloc(%zu): %s", bytes, clamor_last_error());
    for (size_t w = 0; w < bytes / sizeof(uint64_t); w++) buf[w] = pattern(w);
    /* aligned to the window (the region base is): window k is pages k*64.. */
    uint64_t *mbuf = clamor_aligned_alloc(MAP_WINDOW, map_bytes);
    if (!mbuf) die("clamor_aligned_alloc(%zu): %s", map_bytes, clamor_last_error());
    if (((uintptr_t)mbuf - clamor_region_base()) % MAP_WINDOW) die("the map buffer is not window-aligned");
    const size_t wpp = PAGE / sizeof(uint64_t), wpw = MAP_WINDOW / sizeof(uint64_t);
    for (size_t k = 0; k < windows; k++) /* only the page each touch reads */
        for (size_t w = k * wpw; w < k * wpw + wpp; w++) mbuf[w] = pattern(w);
    char ep[256];
    if (clamor_server_start("tcp://127.0.0.1:*", ep, sizeof ep) != 0)
        die("clamor_server_start: %s", clamor_last_error());

    measure_rtt(n, &rtt);

    struct fault_arg fa = {buf, pages, n};
    int rfd;
    pid_t pid = spawn(&rfd, worker, &fa);
    reap(pid, rfd, &fault, "remote faults");
    struct clamor_stats st;
    clamor_stats_get(&st);
    unsigned long served = (unsigned long)st.requests_served;

    /* Same host: children forked from now on map the driver's pages, at the
     * version the driver begins (as a Cluster does before a stage's tasks). */
    if (clamor_map_share(1) != 0) die("clamor_map_share: %s", clamor_last_error());
    if (clamor_version_begin(1) != 0) die("clamor_version_begin: %s", clamor_last_error());
    struct map_arg ma = {mbuf, windows, n};
    pid = spawn(&rfd, map_worker, &ma);
    reap(pid, rfd, &map, "map faults");
    clamor_stats_get(&st);
    unsigned long map_served = (unsigned long)st.requests_served - served;
    clamor_server_stop();
    clamor_region_close();
    if (fault.errors) die("the worker saw %lu fetch errors", fault.errors);
    if (map.errors) die("the mapping worker saw %lu fetch errors", map.errors);

    double ratio = fault.p50 / rtt.p50, map_vs_local = map.p50 / local.p50;
    printf("fault_micro (%s): 64 KiB pages, %ld samples each, read-ahead off, tcp loopback\n", mode, n);
    printf("  %-40s %9s %9s %9s %9s\n", "microseconds", "mean", "median", "p99", "max");
    printf("  %-40s %9.1f %9.1f %9.1f %9.1f\n", "remote fault (clamor worker, 64 KiB)", fault.mean, fault.p50,
           fault.p99, fault.max);
    printf("  %-40s %9.1f %9.1f %9.1f %9.1f\n", "libzmq DEALER/ROUTER round trip, 64 KiB", rtt.mean, rtt.p50,
           rtt.p99, rtt.max);
    printf("  %-40s %9.1f %9.1f %9.1f %9.1f\n", "local fault (SIGSEGV + mprotect)", local.mean, local.p50,
           local.p99, local.max);
    printf("  %-40s %9.1f %9.1f %9.1f %9.1f\n", "map fault (same host, 4 MiB window)", map.mean, map.p50, map.p99,
           map.max);
    printf("  %-40s %9s %9.1f %9.1f\n", "pager send->reply (inside the fault)", "", fault.pager_p50,
           fault.pager_p99);
    printf("  remote fault / zmq round trip (medians): %.2f (target <= 1.5)\n", ratio);
    printf("  map fault / local fault (medians): %.2f (target <= 3)\n", map_vs_local);
    printf("  worker: %lu faults, %lu pages fetched; driver served %lu requests\n", fault.faults, fault.fetched,
           served);
    printf("  mapping worker: %lu faults, %lu pages mapped (%.1f a fault), %lu fetched; driver served %lu requests\n",
           map.faults, map.mapped, map.faults ? (double)map.mapped / (double)map.faults : 0.0, map.fetched,
           map_served);
    if (map.fetched || map.faults != windows || map.mapped != (unsigned long)windows * (MAP_WINDOW / PAGE))
        printf("  note: expected %zu faults, %zu pages mapped, none fetched: not every touch mapped one window\n",
               windows, windows * (MAP_WINDOW / PAGE));
    printf("{\"bench\": \"fault_micro\", \"mode\": \"%s\", \"n\": %ld, \"page_size\": %zu, "
           "\"remote_fault_us\": %.2f, \"zmq_rtt_us\": %.2f, \"ratio\": %.3f, \"local_fault_us\": %.2f, "
           "\"remote_fault_mean_us\": %.2f, \"remote_fault_p99_us\": %.2f, "
           "\"zmq_rtt_mean_us\": %.2f, \"zmq_rtt_p99_us\": %.2f, "
           "\"local_fault_mean_us\": %.2f, \"local_fault_p99_us\": %.2f, "
           "\"pager_fetch_p50_us\": %.2f, \"pager_fetch_p99_us\": %.2f, \"faults\": %lu, \"pages_fetched\": %lu, "
           "\"map_fault_us\": %.2f, \"map_fault_mean_us\": %.2f, \"map_fault_p99_us\": %.2f, "
           "\"map_vs_local\": %.3f, \"map_faults\": %lu, \"map_pages_mapped\": %lu, \"map_pages_fetched\": %lu, "
           "\"map_window_bytes\": %zu, \"map_buffer_bytes\": %zu}\n",
           mode, n, PAGE, fault.p50, rtt.p50, ratio, local.p50, fault.mean, fault.p99, rtt.mean, rtt.p99,
           local.mean, local.p99, fault.pager_p50, fault.pager_p99, fault.faults, fault.fetched, map.p50, map.mean,
           map.p99, map_vs_local, map.faults, map.mapped, map.fetched, MAP_WINDOW, map_bytes);
    return 0;
}
