"""The global region: mapping it, serving it, attaching to it.

The driver maps the region read-write (``init``) and serves its pages
(``serve``).  A worker maps the same address range with every page absent
(``attach``); its pager fetches each page on first touch.  A process forked
from one that has a region becomes a worker by itself: the C core replaces
the region in the child, and the hook below restarts the pager (to the
parent's page server) and the child's own page server.
"""
import atexit
import errno
import gc
import numbers
import os
import threading

from .. import errors
from .._native import check, ffi, lib
from . import hooks
from .hooks import outside
# (the driver's page versions, called as region's by the runtime)
from .pageversions import (differs_since, dirty_count, dirty_pages, log_ahead, set_version, version_begin,  # noqa: F401
                           version_current, versions_keep, write_protection)

DRIVER, WORKER = lib.CLAMOR_ROLE_DRIVER, lib.CLAMOR_ROLE_WORKER
_lock = threading.RLock()
# Bumped by close(): an array of a closed region must not free, when it is
# collected later, whatever block a new region has at the same address.
_generation = 0


_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1


def _geometry_ints(base, size, page_size):
    vals = []
    for name, v in (("base", base), ("size", size), ("page_size", page_size)):
        if v is None:
            v = 0
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise errors.ConfigError(f"region {name} must be a non-negative int, not {v!r}")
        if v > _U64:
            raise errors.ConfigError(f"region {name} {v:#x} does not fit in an address")
        vals.append(v)
    return vals


def _show(v):
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _number(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise errors.ConfigError(f"{name} must be a number, not {_show(v)}")
    if v != v or v in (float("inf"), float("-inf")):
        raise errors.ConfigError(f"{name} must be finite, not {v!r}")
    return v


def _millis(seconds, name):
    """Positive finite seconds as whole milliseconds for the C core (< 2**31)."""
    seconds = _number(seconds, name)
    if seconds <= 0:
        raise errors.ConfigError(f"{name} must be > 0 seconds, not {seconds!r}")
    ms = max(1, int(seconds * 1000))
    if ms > (1 << 31) - 1:
        raise errors.ConfigError(f"{name} of {seconds!r} s is too long (at most {((1 << 31) - 1) // 1000} s)")
    return ms


def init(base=None, size=None, page_size=None):
    """Map the region in this process as its driver.

    ``base``, ``size`` and ``page_size`` default to CLAMOR_BASE,
    CLAMOR_REGION_SIZE and CLAMOR_PAGE_SIZE from the environment, else
    0x200000000000, 64 GiB and 64 KiB.  The mapping reserves address space
    only; memory is used as pages are written.
    """
    b, s, p = _geometry_ints(base, size, page_size)
    with _lock:
        check(lib.clamor_region_init(b, s, p), "mapping the region")


def attach(base=None, size=None, page_size=None):
    """Map the region in this process as a worker (every page absent)."""
    b, s, p = _geometry_ints(base, size, page_size)
    with _lock:
        check(lib.clamor_region_attach(b, s, p), "attaching the region")
    # Region objects die here only through clamor's allocator wrappers: a
    # worker that never ran a heap() block (spawned, a Dask worker) would
    # otherwise hand a region address to pymalloc or glibc, which abort
    # ("free(): invalid pointer") or take the driver's bytes as free memory.
    hooks.install()
    _keep_dead_off_free_lists()


def sweep_dead():
    """Worker, after a task: the small key tables its region dicts dropped
    as they grew go off CPython's free list (csrc/pydeadfree.c)."""
    lib.clamor_py_worker_sweep()


def _keep_dead_off_free_lists():
    """Worker: a region object that dies here stays off CPython's free
    lists, whose next object would be made in its memory (csrc/pydeadfree.c)."""
    if lib.clamor_py_worker_deallocs() < 0:
        raise errors.ClamorError("could not wrap the deallocs of the types with free lists")


def ensure():
    """Map the region with its defaults as driver if this process has none."""
    with _lock:
        if lib.clamor_region_role() == lib.CLAMOR_ROLE_NONE:
            init()


_close_guards = []


def add_close_guard(guard):
    """Register ``guard()``: called before the region closes, it returns a
    reason to refuse (a string) or None.  The runtime registers one that
    refuses while a Cluster is open; the region knows nothing of it."""
    if guard not in _close_guards:
        _close_guards.append(guard)


def close(force=False):
    """Stop the pager and the page server and unmap the region.

    Refused (RegionInUse) while a thread is inside ``clamor.heap()``, while
    a Cluster of this process is open, and, on the driver, while region
    memory is still allocated (region arrays, ``alloc`` blocks, objects
    built in ``heap()`` blocks): unmapping would leave them pointing at
    nothing, and the next touch would kill the process.  ``force=True``
    skips the last check; the caller then promises never to touch what is
    left (a region array of the closed region is never freed into a later
    one).
    """
    global _generation
    with _lock:
        if lib.clamor_region_role() == lib.CLAMOR_ROLE_NONE:
            return
        inside = int(lib.clamor_heap_threads())
        if inside:
            raise errors.RegionInUse(f"{inside} thread(s) are inside clamor.heap(): leave the block(s) first",
                                     errno.EBUSY)
        for guard in list(_close_guards):
            why = guard()
            if why:
                raise errors.RegionInUse(why)
        # Region arrays nobody references any more free their blocks, and
        # CPython's free lists let go of region objects they keep for reuse.
        gc.collect()
        if lib.clamor_region_role() == WORKER:
            # Every page goes, as before a change of version: region objects
            # leave the collector's lists (their links would be in memory
            # unmapped, or, once a region is mapped here again, the next
            # driver's), and this process's objects that hold one are kept
            # for good (released later, they would count down whatever
            # lies there then).  A Dask worker that detached died at its
            # next collection.
            untrack_region_objects(first=0, count=size() // page_size())
        if not force and lib.clamor_region_role() == DRIVER:
            left = int(lib.clamor_heap_allocated())
            if left:
                raise errors.RegionInUse(
                    f"{left} bytes of the region are still allocated (region arrays, alloc() blocks or objects "
                    "built in clamor.heap()); drop or free them first, or close(force=True) if nothing will "
                    "touch them again", errno.EBUSY)
        check(lib.clamor_region_close(), "closing the region")
        _generation += 1


def generation():
    """Number of times this process closed its region."""
    return _generation


def role():
    """'driver', 'worker' or None."""
    r = lib.clamor_region_role()
    return {DRIVER: "driver", WORKER: "worker"}.get(r)


def base():
    return int(lib.clamor_region_base())


def size():
    return int(lib.clamor_region_size())


def page_size():
    return int(lib.clamor_page_size())


def contains(addr, nbytes=1):
    """True if [addr, addr+nbytes) lies inside this process's region."""
    b, s = base(), size()
    return bool(s) and b <= addr and addr + max(nbytes, 1) <= b + s


@outside
def port_range(endpoint):
    """(host, lo, hi) of "tcp://HOST:LO-HI", else None."""
    if endpoint.startswith("tcp://"):
        host, _, ports = endpoint[6:].rpartition(":")
        lo, sep, hi = ports.partition("-")
        if host and sep and lo.isdigit() and hi.isdigit():
            return host, int(lo), int(hi)
    return None


def serve(endpoint="tcp://127.0.0.1:*"):
    """Start this process's page server; returns the endpoint it bound.
    "tcp://HOST:LO-HI" binds the first free port of that range."""
    if not isinstance(endpoint, str):
        raise errors.ConfigError(f"endpoint must be a string, not {endpoint!r}")
    rng = port_range(endpoint)
    if rng is not None:
        host, lo, hi = rng
        if not 0 < lo <= hi <= 65535:
            raise errors.ConfigError(f"{endpoint}: a port range is 1 <= LO <= HI <= 65535")
        for port in range(lo, hi + 1):
            try:
                return serve(f"tcp://{host}:{port}")
            except errors.TransportError as err:
                if err.errno != errno.EADDRINUSE:
                    raise
        raise errors.TransportError(f"no free port in {lo}-{hi} on {host} for the page server", errno.EADDRINUSE)
    _check_port(endpoint)
    out = ffi.new("char[]", 256)
    with _lock:
        check(lib.clamor_server_start(endpoint.encode(), out, 256), "starting the page server",
              {errno.EINVAL: errors.TransportError})
    return ffi.string(out).decode()


def set_fork_ports(lo=0, hi=0):
    """The ports a forked worker's page server may bind (the first free one
    of lo..hi, on its driver's host); 0, 0: any."""
    check(lib.clamor_set_fork_ports(lo, hi), "setting the forked workers' ports")


def _check_port(endpoint):
    """libzmq takes a TCP port modulo 65536 (70000 binds 4464): refuse one
    out of range rather than serve somewhere the caller did not ask."""
    if endpoint.startswith("tcp://") and ":" in endpoint[6:]:
        port = endpoint.rsplit(":", 1)[1]
        if port != "*" and not (port.isdigit() and int(port) <= 65535):
            raise errors.TransportError(f"{endpoint}: the port must be 0-65535 or *, not {port!r}")


def server_endpoint():
    return ffi.string(lib.clamor_server_endpoint()).decode()


SECURITY_MODES = {"none": 0, "curve": 1, "plain": 2}


def secure(mode, server_public=None, server_secret=None, client_public=None, client_secret=None, token=None):
    """Security for every socket the core opens from now on: "curve"
    (encrypted, Z85 keys), "plain" (``token``, not encrypted) or "none".
    Sockets already open keep theirs: call before serve() and connect()."""
    if mode not in SECURITY_MODES:
        raise errors.ConfigError(f"security mode must be one of {sorted(SECURITY_MODES)}, not {mode!r}")

    def arg(v):
        return ffi.NULL if v is None else (v if isinstance(v, bytes) else str(v).encode())
    with _lock:
        check(lib.clamor_security(SECURITY_MODES[mode], arg(server_public), arg(server_secret), arg(client_public),
                                  arg(client_secret), arg(token)), "setting the sockets' security")


def security():
    """The core's security mode now: "none", "curve" or "plain"."""
    mode = lib.clamor_security_mode()
    return next(k for k, v in SECURITY_MODES.items() if v == mode)


@outside
def stop_serving():
    with _lock:
        check(lib.clamor_server_stop())


def hello(endpoint, timeout=10.0):
    """Geometry (base, size, page_size) of the region served at ``endpoint``."""
    if not isinstance(endpoint, str):
        raise errors.ConfigError(f"endpoint must be a string, not {endpoint!r}")
    ms = _millis(timeout, "timeout")
    b, s, p = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    check(lib.clamor_hello(endpoint.encode(), b, s, p, ms), f"asking {endpoint} for the region",
          {errno.EINVAL: errors.TransportError})
    return int(b[0]), int(s[0]), int(p[0])


@outside
def start_pager(endpoint):
    with _lock:
        check(lib.clamor_pager_start(endpoint.encode()), "starting the pager",
              {errno.EINVAL: errors.TransportError})


@outside
def stop_pager():
    with _lock:
        check(lib.clamor_pager_stop())


@outside
def connect(endpoint, base=None, serve_endpoint="tcp://127.0.0.1:*", timeout=10.0):
    """Attach this process to the driver whose page server is ``endpoint``.

    Maps the region with the driver's geometry (at ``base`` if given: fine for
    pointer-free data such as numpy arrays shipped by reference), starts the
    pager and this worker's own page server.  Returns the latter's endpoint.
    """
    if serve_endpoint is not None and not isinstance(serve_endpoint, str):
        raise errors.ConfigError(f"serve_endpoint must be a string or None, not {serve_endpoint!r}")
    b, s, p = hello(endpoint, timeout)
    attach(b if base is None else base, s, p)
    try:
        mine = serve(serve_endpoint) if serve_endpoint else ""   # first: the pager names it to the driver
        start_pager(endpoint)
    except BaseException:
        close()  # not half attached: connect() again can succeed
        raise
    return mine


def ensure_handler_first():
    """Put clamor's SIGSEGV handler back in front (e.g. after a later
    ``faulthandler.enable()``), chaining to whatever replaced it.  Returns
    True if it had to."""
    rc = lib.clamor_fault_ensure_first()
    check(rc if rc > 0 else 0, "installing the fault handler")
    return rc < 0


def handler_is_first():
    return bool(lib.clamor_fault_is_first())


def prefetch(obj, nbytes=None):
    """Make the pages under ``obj`` ready for a system call.

    ``obj`` is an address (with ``nbytes``) or any object exporting a buffer
    (a region ndarray, memoryview).  The kernel answers EFAULT, not SIGSEGV,
    when a system call reads or writes a page that is not present, so call
    this before handing region memory to read(), recv_into(), write() and the
    like (``clamor.io`` wraps the usual ones).  On a worker it fetches the
    absent pages; on the driver, once stages have begun, it opens the pages
    for writing (between stages the driver's region is write-protected, to
    version what it writes, and a system call writing there gets EFAULT
    too).  Raises PageFetchError (errno EFAULT) for memory outside the
    region, PageFetchError for a page that cannot be fetched, InvalidSize
    and InvalidPointer for a bad address range.
    """
    addr, n = _span(obj, nbytes)
    if n == 0:
        return
    check(lib.clamor_prefetch(ffi.cast("void *", addr), n), "prefetching region pages",
          {errno.EFAULT: errors.PageFetchError, errno.ETIMEDOUT: errors.PageFetchError})


def _span(obj, nbytes=None):
    """(address, length) of an address and ``nbytes``, or of a buffer (the
    whole span its strides reach)."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        addr, n = obj, 0 if nbytes is None else nbytes
    else:
        mv = memoryview(obj)
        if mv.nbytes == 0:
            return 0, 0
        if mv.c_contiguous:
            addr, n = int(ffi.cast("uintptr_t", ffi.from_buffer(mv.cast("B")))), mv.nbytes
        else:  # cover the whole span the strides reach
            import numpy as np

            a = np.asarray(obj)
            lo, hi = np.lib.array_utils.byte_bounds(a) if hasattr(np.lib, "array_utils") else np.byte_bounds(a)
            addr, n = lo, hi - lo
        if nbytes is not None:
            n = nbytes
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 1 << 63:
        raise errors.InvalidSize(f"prefetch size must be an int from 0 to 2**63-1, not {n!r}")
    if not 0 <= addr <= _U64 - n:
        raise errors.InvalidPointer(f"{addr:#x} + {n} is not an address range")
    return addr, n


def drop_pages(first, count):
    """Drop this worker's copy of pages [first, first+count).

    A page fetched again has the driver's reference counts: garbage cycles
    that still hold region objects are collected first, so that they are
    released against this worker's counts (as before a change of version).
    A live reference this worker keeps across the drop is the caller's to
    avoid."""
    if role() == "worker":
        gc.collect()
        untrack_region_objects(first=first, count=count)
    check(lib.clamor_pages_drop(first, count), "dropping pages")


def untrack_region_objects(pages=None, first=0, count=0):
    """Worker, before pages change: region objects this process's collector
    tracks leave its lists, whose links in those pages would be the
    driver's once they are fetched again; this process's objects that hold
    a region object on one of ``pages`` or [first, first+count) (the pages
    about to be dropped) are
    kept for good, out of the lists (csrc/pyheld.c says why).  Returns how
    many were kept."""
    import numpy as np

    arr = np.unique(np.asarray([] if pages is None else pages, dtype=np.uint64))
    kept = ffi.new("long *")
    objs = gc.get_objects()
    try:
        if lib.clamor_py_untrack_region(id(objs), ffi.cast("const uint64_t *", arr.ctypes.data), arr.size, first,
                                        count, kept) < 0:
            raise errors.ClamorError("could not take region objects out of the collector's lists")
    finally:
        del objs
    return int(kept[0])


def configure(readahead=None, fetch_timeout=None, max_mappings=None, diff_keep=None):
    """Set read-ahead (bytes, 0 disables), the fetch time-out (seconds), the
    bound on mappings the region may be split into (0: half of
    vm.max_map_count) and the bytes of old page copies a fetching worker
    keeps to be sent diffs against (0: none, no diffs)."""
    if readahead is not None:
        if _number(readahead, "readahead") < 0 or readahead > 1 << 48:
            raise errors.ConfigError(f"readahead must be 0 to 2**48 bytes, not {readahead!r}")
    if fetch_timeout is not None:
        ms = _millis(fetch_timeout, "fetch_timeout")
    if max_mappings is not None:
        if _number(max_mappings, "max_mappings") < 0 or max_mappings > _U32:
            raise errors.ConfigError(f"max_mappings must be 0 to {_U32}, not {max_mappings!r}")
    if diff_keep is not None:
        if _number(diff_keep, "diff_keep") < 0 or diff_keep > 1 << 62:
            raise errors.ConfigError(f"diff_keep must be 0 to 2**62 bytes, not {diff_keep!r}")
    # set only once every value is known to be good
    if readahead is not None:
        lib.clamor_set_readahead(int(readahead))
    if fetch_timeout is not None:
        lib.clamor_set_fetch_timeout_ms(ms)
    if max_mappings is not None:
        lib.clamor_set_max_mappings(int(max_mappings))
    if diff_keep is not None:
        lib.clamor_set_diff_keep(int(diff_keep))
    return {
        "readahead": int(lib.clamor_readahead()),
        "fetch_timeout": lib.clamor_fetch_timeout_ms() / 1000.0,
        "max_mappings": int(lib.clamor_max_mappings()),
        "diff_keep": int(lib.clamor_diff_keep()),
    }


def invalidate(pages, version=None):
    """Worker: drop the local copies of ``pages`` (page indices; one with
    CLAMOR_INVAL_MOVED set only where this worker maps the driver's copy).
    With ``version``: read that page version from then on, in the same
    step (no page mapped or fetched in between reads a dropped page as the
    version left had it)."""
    import numpy as np

    if version is not None and not (isinstance(version, numbers.Integral) and 0 <= version <= _U32):
        raise errors.ConfigError(f"a page version is 0 to {_U32}, not {version!r}")
    arr = np.ascontiguousarray(pages, dtype=np.uint64)
    if arr.size:
        # (a page flagged moved may be kept: its objects are taken out of
        # the collector's lists all the same, as before any drop)
        untrack_region_objects(arr & np.uint64(int(lib.CLAMOR_INVAL_MOVED) - 1))
    ptr = ffi.cast("uint64_t *", arr.ctypes.data)
    rc = lib.clamor_invalidate(ptr, arr.size) if version is None else lib.clamor_change_version(int(version), ptr,
                                                                                                  arr.size)
    check(rc, "invalidating pages", {errno.EINVAL: errors.ConfigError, errno.EPERM: errors.RegionError})


def set_replication(policy):
    """Driver: 0 off, 1 random holder, 2 two choices (see clamor.Cluster)."""
    lib.clamor_set_replication(int(policy))


def forget_peer(endpoint):
    """Driver: a worker is gone; never send a request to its page server."""
    lib.clamor_replication_forget(endpoint.encode())


def peer_gone(endpoint):
    """Worker: the peer whose page server is ``endpoint`` is lost."""
    lib.clamor_peer_gone(endpoint.encode())


def reset_peers():
    """Driver: forget every worker's page server and the pages they held."""
    lib.clamor_replication_reset()


def mappings():
    """Mappings the worker's region is split into now."""
    return int(lib.clamor_mappings())


_STAT_FIELDS = ("faults", "pages_fetched", "bytes_fetched", "readahead_pages", "readahead_streams",
                "fetch_requests", "fetch_errors", "pages_served", "bytes_served", "requests_served", "bad_requests",
                "evictions", "pages_dropped", "pages_invalidated", "pages_logged", "pages_unchanged",
                "pages_parked", "pages_unparked", "pages_logged_ahead",
                "versions", "version_bytes", "pages_from_peers", "bytes_from_peers", "redirects",
                "peer_fallbacks", "peer_direct", "hint_bytes", "peer_timeouts", "peers_admitted",
                "peers_refused", "reloc_pages", "reloc_words", "reloc_bytes", "pages_mapped", "pages_compacted",
                "wire_bytes_fetched", "wire_bytes_served", "region_frees", "peer_written", "pages_kept", "diff_pages",
                "diff_wire_bytes", "diff_retries", "diff_pages_served", "diff_pages_reused", "kept_bytes", "latency_count")


def stats():
    """Counters of this process: faults, pages and bytes fetched and served,
    and fetch latency percentiles (microseconds)."""
    st = ffi.new("struct clamor_stats *")
    lib.clamor_stats_get(st)
    out = {k: int(getattr(st, k)) for k in _STAT_FIELDS}
    out["fetch_p50_us"] = float(st.latency_p50_us)
    out["fetch_p99_us"] = float(st.latency_p99_us)
    out["fetch_max_us"] = float(st.latency_max_us)
    out["mappings"] = mappings() if role() == "worker" else 0
    return out


def reset_stats():
    """Zero this process's counters (``stats()``)."""
    lib.clamor_stats_reset()


def _after_fork_child():
    # The C core already replaced the region and restarted this worker's page
    # server and pager (its pthread_atfork child handler, csrc/region.c):
    # threads do not survive fork.  Should that have failed, try once more
    # (either call fails with EBUSY if it is running).
    if lib.clamor_region_role() != WORKER:
        return
    try:
        _keep_dead_off_free_lists()
    except Exception:  # pragma: no cover - never raise inside a fork hook
        pass
    parent = ffi.string(lib.clamor_fork_parent_endpoint()).decode()
    if not parent:
        return
    try:
        out = ffi.new("char[]", 256)
        host = parent[6:].rsplit(":", 1)[0] if parent.startswith("tcp://") else "127.0.0.1"
        lib.clamor_server_start(f"tcp://{host}:*".encode(), out, 256)   # as csrc/region.c does
        lib.clamor_pager_start(parent.encode())
    except Exception:  # pragma: no cover - never raise inside a fork hook
        pass


os.register_at_fork(after_in_child=_after_fork_child)


def _at_exit():
    # faulthandler, enabled before clamor installed its handler (python -X
    # faulthandler, PYTHONFAULTHANDLER), puts back at finalization the SIGSEGV
    # action it found then: clamor's handler is gone while the interpreter
    # still releases objects, some of them on region pages the driver keeps
    # write-protected for versions (the type cache's names, for one), and the
    # first such write killed the process after a clean run.  Disabled here,
    # before finalization, faulthandler restores nothing later; clamor's
    # handler goes back in front.
    if lib.clamor_region_role() == lib.CLAMOR_ROLE_NONE:
        return
    import faulthandler
    if faulthandler.is_enabled():
        faulthandler.disable()
        try:
            ensure_handler_first()
        except errors.ClamorError:  # pragma: no cover - nothing else to do at exit
            pass


atexit.register(_at_exit)
