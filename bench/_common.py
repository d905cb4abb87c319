"""What the benchmarks share: sizes, the build, helper processes, random
keys, region arrays and pages, the cold scan, the k-means kernel, the
hot-pages table (its C library, build and task) and CPU time.  Starting the systems, the child protocol
and the JSON line are the harness's (_harness.py).

A benchmark imports this module, _harness and clamor, never another
benchmark.  A script run as ``python bench/NAME.py`` finds this module
beside it, and so do its workers: forked ones inherit the driver's
modules, spawned ones its ``sys.path``.  numpy is imported inside the
functions that use it: kmeans.py and recovery.py fix the BLAS thread count
before numpy loads (``one_blas_thread``).
"""
import ctypes
import multiprocessing as mp
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10
HOST_ENV = "CLAMOR_BENCH_HOST"        # a worker process's host index (on namespace hosts every pid is 1)


# ---- sizes -------------------------------------------------------------------------

def parse_size(s):
    """'64K', '4M', '1G', '1.5M', '64KiB', '4096', '0' -> bytes (K, M, G are
    powers of 1024).  For argparse's ``type=``: a default of None stays None."""
    s = str(s).strip().upper().rstrip("B").rstrip("I")
    mult = {"K": KIB, "M": MIB, "G": GIB}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def human(n):
    """4096 -> '4 KiB'; a size that is no whole number of KiB stays in bytes."""
    for unit, m in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


# ---- the build ---------------------------------------------------------------------

def _stale():
    import glob

    so = glob.glob(os.path.join(ROOT, "clamor", "_clamor*.so"))
    if not so:
        return True
    built = min(os.path.getmtime(p) for p in so)
    srcs = glob.glob(os.path.join(ROOT, "csrc", "*.[ch]")) + [os.path.join(ROOT, "clamor", f)
                                                               for f in ("_cdefs.h", "_build.py")]
    return any(os.path.getmtime(p) > built for p in srcs if os.path.exists(p))


def ensure_built(allowed=True):
    """Build the C core (pip install -e) if it is missing or older than its
    sources, then import clamor and return it.  ``allowed=False`` (a
    script's ``--no-build``) never builds."""
    def build():
        print("bench: building clamor (pip install -e) ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", ROOT], check=True)

    if allowed and os.path.exists(os.path.join(ROOT, "setup.py")) and _stale():
        build()
    try:
        import clamor
    except ImportError:  # not installed in this interpreter (workers need it importable too)
        if not allowed:
            raise
        build()
        import importlib

        importlib.invalidate_caches()
        import clamor
    return clamor


def c_compiler(who):
    """$CC, else cc, else gcc; exits naming ``who`` when there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit(f"{who}: no C compiler (cc) found")
    return cc


# ---- helper processes ----------------------------------------------------------------

def ratio(num, den, what):
    """num / den; a zero or missing figure stops the script, naming ``what``."""
    if not den or num is None:
        raise SystemExit(f"{_script()}: cannot compute {what}: {num!r} / {den!r} (nothing measured to compare with)")
    return num / den


def _script():
    return os.path.splitext(os.path.basename(sys.argv[0]))[0]


def die_with_parent(sig=signal.SIGTERM):
    """Have the kernel send ``sig`` to this process when its parent dies
    (prctl PR_SET_PDEATHSIG), so a killed benchmark leaves nothing behind.
    Call it first thing in a child, or pass it (with ``functools.partial``
    for another signal) as a ``preexec_fn``."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - Linux only
        pass


class Spawned:
    """``n`` processes started by spawn, each running ``target(conn, *args)``
    on its end of a ``multiprocessing.Pipe`` (a socketpair), and a thread a
    process to talk to all of them at once.  Spawn, never fork: a process
    forked from a region's driver attaches to the region as a worker (the C
    core's fork hook), and these must stay plain processes.  ``close``
    sends each one None, which a target takes as its cue to return."""

    def __init__(self, n, target, *args):
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        self.pool = ThreadPoolExecutor(n)
        try:
            for _ in range(n):
                a, b = ctx.Pipe()
                p = ctx.Process(target=target, args=(b,) + args, daemon=True)
                p.start()
                b.close()
                self.procs.append(p)
                self.conns.append(a)
        except BaseException:
            self.close()
            raise

    def map(self, fn):
        """``fn(i)`` for every process i, on the threads; the results in order."""
        return list(self.pool.map(fn, range(len(self.conns))))

    def close(self):
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()
        self.pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def one_blas_thread():
    """One BLAS thread per process, W processes on W cores, as MPI ranks
    would be, unless the environment says otherwise.  Must run before
    numpy loads OpenBLAS."""
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(v, "1")


# ---- region arrays -----------------------------------------------------------------------

def exact_array(clamor, n):
    """A region float64 array of ``n`` values i % 4096: every partial sum is exact."""
    import numpy as np

    a = clamor.empty(n, np.float64)
    step = 1 << 22
    for i in range(0, n, step):
        a[i:i + step] = np.arange(i, min(n, i + step), dtype=np.int64) % 4096
    return a


def array_pages(x):
    """(first page, page count) of the region pages under the array ``x``."""
    from clamor import region

    ps, base = region.page_size(), region.base()
    addr = x.__array_interface__["data"][0]
    first = (addr - base) // ps
    return int(first), int((addr + x.nbytes - 1 - base) // ps - first + 1)


def same_host_modes(cl, want, who, workers=None):
    """{worker: its same_host mode}; stops unless every one is ``want``
    (and, given ``workers``, there are that many)."""
    modes = cl.stats()["same_host"]["workers"]
    bad = {w: m for w, m in modes.items() if m.get("mode") != want}
    if bad or (workers is not None and len(modes) != workers):
        raise SystemExit(f"{who}: {len(modes)} workers, these not in same_host={want!r} mode: {bad}")
    return {w: m["mode"] for w, m in modes.items()}


def cold_scan(ref, readahead=None, warm=False):
    """The scan (scan.py, hosts.py; run on a worker): drop the array's pages,
    sum it cold, timed, optionally sum it warm.  CPU seconds of the cold sum:
    ``cpu_s`` the process's, ``cpu`` by thread."""
    import clamor
    from clamor import region

    if readahead is not None:
        region.configure(readahead=readahead)
    x = ref.get()
    region.drop_pages(*array_pages(x))  # cold: nothing present
    clamor.reset_stats()
    th0, c0 = thread_cpu(), cpu_s()
    t = time.perf_counter()
    s = float(x.sum())
    cold = time.perf_counter() - t
    c1, th1 = cpu_s(), thread_cpu()
    out = {"sum": s, "cold_s": cold, "stats": clamor.stats(), "readahead": region.configure()["readahead"],
           "page_size": region.page_size(), "cpu_s": c1 - c0, "cpu": cpu_delta(th0, th1)}
    if warm:
        t = time.perf_counter()
        s2 = float(x.sum())
        out.update(warm_s=time.perf_counter() - t, warm_sum=s2)
    return out


# ---- partitions and random keys -------------------------------------------------------

def bounds(n, parts):
    """Where ``parts`` near-equal contiguous chunks of ``n`` items start,
    and ``n`` last: how ``Cluster.parallelize`` cuts a sequence."""
    return [(n * i) // parts for i in range(parts + 1)]


def chunks(x, parts):
    """``x`` cut into ``parts`` near-equal contiguous chunks, as ``bounds`` cuts it."""
    b = bounds(len(x), parts)
    return [x[b[i]:b[i + 1]] for i in range(parts)]


def zipf_ranks(rng, a, n, size):
    """``size`` ranks in [0, n), rank r drawn with p ~ (r + 1)^-a (int64)."""
    import numpy as np

    out = np.empty(0, dtype=np.int64)
    while out.size < size:
        z = rng.zipf(a, size * 2)
        out = np.concatenate([out, z[z <= n] - 1])
    return out[:size]


# ---- the k-means kernel (kmeans.py, recovery.py) -----------------------------------------

BLOCK = 1 << 16  # rows per distance block: 64K x k doubles stays in L2-ish sizes


def partial_sums(x, c):
    """(per-cluster sums (k, d), counts (k,)) of the points ``x`` (n, d)
    assigned to their nearest centroid in ``c`` (k, d)."""
    import numpy as np

    k, d = c.shape
    sums = np.zeros((k, d))
    counts = np.zeros(k, np.int64)
    cc = np.einsum("ij,ij->i", c, c)
    ct = np.ascontiguousarray(c.T)
    for s in range(0, len(x), BLOCK):
        xb = x[s:s + BLOCK]
        dist = xb @ ct            # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 does not change argmin
        dist *= -2.0
        dist += cc
        lab = dist.argmin(axis=1)
        counts += np.bincount(lab, minlength=k)
        for j in range(d):
            sums[:, j] += np.bincount(lab, weights=xb[:, j], minlength=k)
    return sums, counts


def add(a, b):
    return a[0] + b[0], a[1] + b[1]


def update(c, sums, counts):
    """New centroids; a cluster with no points keeps its centroid."""
    out = c.copy()
    nz = counts > 0
    out[nz] = sums[nz] / counts[nz, None]
    return out


def make_points(n, k, d, seed, out=None):
    """n points around k random centres (unit Gaussian noise), made in
    chunks so the temporaries stay small; and k of them as initial centroids."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, size=(k, d))
    x = np.empty((n, d)) if out is None else out
    step = 1 << 20
    for s in range(0, n, step):
        m = min(step, n - s)
        x[s:s + m] = centres[rng.integers(0, k, size=m)] + rng.standard_normal((m, d))
    init = x[np.sort(rng.choice(n, size=k, replace=False))].copy()
    return x, init


# ---- the hot-pages table (bench/hotpages.c) ---------------------------------------

HOTPAGES_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hotpages.c")


def compile_hotpages(build_dir, who="hotpages"):
    """hotpages.c -> build_dir/hotpages.so; returns the path."""
    out = os.path.join(build_dir, "hotpages.so")
    subprocess.run([c_compiler(who), "-std=gnu11", "-O2", "-shared", "-fPIC", "-pthread", HOTPAGES_C, "-o", out],
                   check=True)
    return out


def load_hotpages(path):
    """The hot-pages library at ``path``, its functions typed."""
    lib = ctypes.CDLL(path)
    u64, p64 = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
    lib.hp_build.restype = ctypes.c_size_t
    lib.hp_build.argtypes = [ctypes.c_void_p, ctypes.c_uint, u64]
    lib.hp_lookup.restype = u64
    lib.hp_lookup.argtypes = [ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, p64]
    lib.hp_lookup_mt.restype = u64
    lib.hp_lookup_mt.argtypes = [ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, p64]
    lib.hp_expect.restype = u64
    lib.hp_expect.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.hp_keys.restype = None
    lib.hp_keys.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return lib


def hot_lookup(lib, addr, keys, threads=1):
    """(checksum, keys found) of ``keys`` (uint64 array) in the table at
    ``addr``, on ``threads`` C threads."""
    import numpy as np

    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    found = ctypes.c_uint64()
    s = lib.hp_lookup_mt(addr, keys.ctypes.data, keys.size, threads, ctypes.byref(found))
    return int(s), int(found.value)


def hot_table(clamor, tmp, bits, nkeys, who):
    """hotpages.c compiled into ``tmp`` and a table of 2^bits slots holding
    ``nkeys`` keys built by C in the region through clamor_malloc: (.so path,
    the library, the table's address, its bytes, seconds to build it)."""
    from clamor._native import ffi
    from clamor._native import lib as clib

    so_path = compile_hotpages(tmp, who)
    lib = load_hotpages(so_path)
    alloc = int(ffi.cast("uintptr_t", ffi.addressof(clib, "clamor_malloc")))
    t = time.perf_counter()
    addr = lib.hp_build(alloc, bits, nkeys)
    build_s = time.perf_counter() - t
    if not addr:
        raise SystemExit(f"{who}: building the table failed: {ffi.string(clib.clamor_last_error()).decode()}")
    if not clamor.region.contains(addr, 16 << bits):
        raise SystemExit(f"{who}: the table is not in the region")
    return so_path, lib, addr, 64 + (16 << bits), build_s


def hot_task(so_path, addr, threads):
    """The task of a stage over the table at ``addr``: its keys looked up on
    ``threads`` C threads; [(checksum, found, pid, seconds, evictions, peer
    fallbacks, host index (HOST_ENV), wall-clock start)]."""
    def task(keys):
        from clamor import region

        lib = load_hotpages(so_path)     # dlopen again in the worker: the loader's handle, cheap
        t, t0 = time.perf_counter(), time.time()     # one wall clock for every namespace host: one kernel
        s, found = hot_lookup(lib, addr, keys, threads)
        dt = time.perf_counter() - t
        st = region.stats()
        return [(s, found, os.getpid(), dt, st["evictions"], st["peer_fallbacks"],
                 int(os.environ.get(HOST_ENV, "-1")), t0)]
    return task


def rotated(seq, r):
    """seq starting at its (r mod len)-th item: round r's order."""
    k = r % len(seq)
    return tuple(seq[k:]) + tuple(seq[:k])


def hot_round(lib, rng, a, nkeys, addr, tasks, lookups, who):
    """One stage's keys, ``tasks * lookups`` whose ranks are Zipf(a) over
    [0, nkeys), and the driver's own (checksum, found) of each task's part
    (cut as parallelize() cuts), checked against the keys' values."""
    import numpy as np

    keys = np.ascontiguousarray(zipf_ranks(rng, a, nkeys, tasks * lookups).astype(np.uint64))
    lib.hp_keys(keys.ctypes.data, keys.size, keys.ctypes.data)
    expect = []
    for part in chunks(keys, tasks):
        s, found = hot_lookup(lib, addr, part)
        if s != lib.hp_expect(part.ctypes.data, part.size) or found != part.size:
            raise SystemExit(f"{who}: the driver's own lookups do not match the values of the keys")
        expect.append((s, found))
    return keys, expect


def hot_check(out, expect, who):
    """Stops unless the tasks' (checksum, found) in ``out`` are the driver's ``expect``."""
    got = [(s, f) for s, f, *_ in out]
    if got != expect:
        bad = [i for i, (g, e) in enumerate(zip(got, expect)) if g != e]
        raise SystemExit(f"{who}: tasks {bad} disagree with the driver's own lookups: "
                         f"{[got[i] for i in bad]} != {[expect[i] for i in bad]}")


def hot_counters(drv0, drv, st, workers, table_bytes):
    """A hot-pages stage's bytes and requests: the driver's region stats
    before and after it (``drv0``, ``drv``) and the Cluster's ``st``."""
    rep = st["replication"]
    return {"driver_bytes": drv["bytes_served"] - drv0["bytes_served"],
            "peer_bytes": sum(rep["bytes_served_by_peer"].values()),
            "bytes_from_driver": st["bytes_from_driver"], "bytes_from_peers": st["bytes_from_peers"],
            "redirects": drv["redirects"] - drv0["redirects"],
            # holder hints the driver sent with its replies (not in driver_bytes: pages only)
            "hint_bytes": drv["hint_bytes"] - drv0["hint_bytes"], "direct_requests": rep["direct_requests"],
            # share of the table each worker fetched, on average
            "coverage": (st["bytes_from_driver"] + st["bytes_from_peers"]) / workers / table_bytes}


def policy_ratios(med, policies, what="", cpu=True):
    """Each policy but the first (off) against it: time, driver bytes and
    (with ``cpu``) driver + workers CPU seconds, from ``med`` {policy: medians}."""

    off = med[policies[0]]
    out = {}
    for p in policies[1:]:
        m = med[p]
        out[p] = {"time_ratio": ratio(m["time_s"], off["time_s"], f"{what}{p} time_ratio"),
                  "driver_bytes_ratio": ratio(m["driver_bytes"], off["driver_bytes"], f"{what}{p} driver_bytes_ratio")}
        if cpu:
            out[p]["cpu_ratio"] = ratio(m["driver_cpu_s"] + m["workers_cpu_s"],
                                        off["driver_cpu_s"] + off["workers_cpu_s"], f"{what}{p} cpu_ratio")
    return out


# ---- CPU time ------------------------------------------------------------------------

def thread_cpu():
    """{thread name: CPU seconds} of this process, from /proc/self/task
    (threads of the same name are summed: clamor-pager, clamor-server,
    ZMQbg/IO/0, python for the interpreter's own)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                s = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def cpu_s(who=resource.RUSAGE_SELF):
    """CPU seconds, user + system, of this process (or its reaped children) so far."""
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def cpu_delta(before, after):
    """What each thread of ``after`` spent since ``before`` (thread_cpu())."""
    return {k: round(v - before.get(k, 0.0), 3) for k, v in sorted(after.items()) if v - before.get(k, 0.0) > 0}
