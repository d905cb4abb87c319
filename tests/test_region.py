"""Region geometry and configuration, functions run on workers over it, and the cffi
declarations.

A process holds at most one region for its life, so everything that maps,
closes or re-maps a region runs in a fresh interpreter (``run_json``).
"""
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import clamor
from helpers import PRELUDE, clean_env, run_json

ROOT = Path(__file__).resolve().parent.parent


# What scripts here add to helpers.PRELUDE: geo() -> [role, base, size, page size].
GEO = """
def geo():
    return [region.role(), region.base(), region.size(), region.page_size()]
"""


def script(body):
    return PRELUDE + GEO + textwrap.dedent(body)


# A worker pointed at a control endpoint where nobody listens gives up after
# --connect-timeout.  Start it with the module so that the wait overlaps the
# other tests; test_worker_without_driver collects it.
@pytest.fixture(scope="module", autouse=True)
def orphan_worker():
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", "tcp://127.0.0.1:1",
                          "--connect-timeout", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=clean_env({"CLAMOR_SECRET": "a secret of the right length"}))
    yield p, t0
    if p.poll() is None:
        p.kill()
        p.communicate()


# ---- geometry ----------------------------------------------------------------

def test_geometry_from_environment():
    out = run_json(script("""
        before = geo()
        p = clamor.alloc(1000)          # maps the region lazily, from the environment
        print(json.dumps({"before": before, "after": geo(), "p": p}))
        """), env={"CLAMOR_BASE": "0x310000000000", "CLAMOR_REGION_SIZE": "1G", "CLAMOR_PAGE_SIZE": "16K"})
    assert out["before"] == [None, 0, 0, 0]
    assert out["after"] == ["driver", 0x310000000000, 1 << 30, 16 << 10]
    assert 0x310000000000 <= out["p"] < 0x310000000000 + (1 << 30)


def test_geometry_defaults():
    out = run_json(script("""
        region.init()
        print(json.dumps(geo()))
        """))
    assert out == ["driver", 0x200000000000, 64 << 30, 64 << 10]


def test_arguments_override_environment_and_size_spellings():
    out = run_json(script("""
        res = {}
        region.init(base=0x320000000000, size=256 << 20, page_size=4096)
        res["args"] = geo()
        region.close()
        res["closed"] = geo()
        sizes = {}
        for s in ["64M", "64MiB", "64MB", "0x4000000", "67108864", "65536K", "65536k", "1G", "0x40000000"]:
            os.environ["CLAMOR_REGION_SIZE"] = s
            region.init()
            sizes[s] = region.size()
            region.close()
        res["sizes"] = sizes
        pages = {}
        for s in ["4K", "4096", "0x1000", "4M", "1M", "64KiB"]:
            os.environ["CLAMOR_PAGE_SIZE"] = s
            region.init(size=1 << 30)
            pages[s] = region.page_size()
            region.close()
        res["pages"] = pages
        print(json.dumps(res))
        """), env={"CLAMOR_BASE": "0x330000000000", "CLAMOR_REGION_SIZE": "2G", "CLAMOR_PAGE_SIZE": "64K"})
    assert out["args"] == ["driver", 0x320000000000, 256 << 20, 4096]
    assert out["closed"] == [None, 0, 0, 0]
    m = 64 << 20
    assert out["sizes"] == {"64M": m, "64MiB": m, "64MB": m, "0x4000000": m, "67108864": m, "65536K": m,
                            "65536k": m, "1G": 1 << 30, "0x40000000": 1 << 30}
    assert out["pages"] == {"4K": 4096, "4096": 4096, "0x1000": 4096, "4M": 4 << 20, "1M": 1 << 20,
                            "64KiB": 64 << 10}


def test_bad_geometry_is_config_error():
    out = run_json(script("""
        res = {}
        for ps in [3000, 8 << 20, 6 << 10, 2048, 1 << 30, 4095]:
            res[f"page {ps}"] = attempt(region.init, size=1 << 30, page_size=ps)
        for ps in ["3000", "8M", "6K"]:
            os.environ["CLAMOR_PAGE_SIZE"] = ps
            res[f"env page {ps}"] = attempt(region.init, size=1 << 30)
        del os.environ["CLAMOR_PAGE_SIZE"]
        res["base unaligned"] = attempt(region.init, base=0x200000001000)
        res["base unaligned 4K"] = attempt(region.init, base=0x200000000800, page_size=4096)
        res["size unaligned"] = attempt(region.init, size=100_000)
        res["beyond user space"] = attempt(region.init, base=0x7fff00000000, size=1 << 40)
        res["negative base"] = attempt(region.init, base=-4096)
        res["str size"] = attempt(region.init, size="1G")
        res["bool page"] = attempt(region.init, page_size=True)
        res["float base"] = attempt(region.init, base=1.5)
        res["role after all that"] = region.role()
        region.init(size=1 << 30)   # the process is fine and can still map one
        res["good"] = geo()
        print(json.dumps(res))
        """))
    good = out.pop("good")
    assert out.pop("role after all that") is None
    assert good == ["driver", 0x200000000000, 1 << 30, 64 << 10]
    for what, r in out.items():
        assert r[0] == "ConfigError" and r[2], (what, r)
    for ps in [3000, 8 << 20, 6 << 10, 2048, 1 << 30, 4095]:
        msg = out[f"page {ps}"][1]
        assert "page size" in msg and str(ps) in msg, msg
    for ps, n in [("3000", 3000), ("8M", 8 << 20), ("6K", 6 << 10)]:
        assert str(n) in out[f"env page {ps}"][1]
    assert "0x200000001000" in out["base unaligned"][1]
    assert "100000" in out["size unaligned"][1]


@pytest.mark.parametrize("var", ["CLAMOR_BASE", "CLAMOR_REGION_SIZE", "CLAMOR_PAGE_SIZE"])
def test_garbage_environment_names_the_variable(var):
    out = run_json(script(f"""
        res = {{}}
        for val in ["banana", "12Q", "64 M", "0x", "1e9", "64MX"]:
            os.environ[{var!r}] = val
            res[val] = [attempt(region.init), attempt(clamor.alloc, 64)]
        os.environ[{var!r}] = "-5"
        res["negative"] = attempt(region.init)
        os.environ[{var!r}] = ""
        res["empty means default"] = attempt(region.init)
        res["geo"] = geo()
        print(json.dumps(res))
        """))
    assert out.pop("empty means default") == ["ok", None]
    role, base, size, psize = out.pop("geo")
    assert (role, base, size, psize) == ("driver", 0x200000000000, 64 << 30, 64 << 10)
    neg = out.pop("negative")
    assert neg[0] == "ConfigError", neg
    for val, (init, alloc) in out.items():
        for r in (init, alloc):
            assert r[0] == "ConfigError" and r[2], (val, r)
            assert var in r[1] and val in r[1], (val, r)


# ---- the range is taken ---------------------------------------------------------

def test_address_taken_is_region_in_use():
    out = run_json(script("""
        import ctypes, mmap
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        MAP_FIXED_NOREPLACE = 0x100000
        want = 0x330000000000 + (5 << 20)   # a page in the middle of the region to be
        got = libc.mmap(want, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                        -1, 0)
        res = {"squatter": got == want}
        res["init"] = attempt(region.init, base=0x330000000000, size=1 << 30)
        os.environ["CLAMOR_BASE"] = "0x330000000000"
        res["env"] = attempt(region.init, size=1 << 30)
        res["attach"] = attempt(region.attach, base=0x330000000000, size=1 << 30)
        res["role"] = region.role()
        res["squatter intact"] = ctypes.string_at(want, 16) == bytes(16)
        region.init(base=0x340000000000, size=1 << 30)   # another base works
        res["moved"] = geo()
        a = clamor.zeros(10)
        res["usable"] = clamor.in_region(a) and float(a.sum()) == 0.0
        res["twice"] = attempt(region.init, base=0x350000000000, size=1 << 30)
        res["twice default"] = attempt(region.init)
        res["attach after init"] = attempt(region.attach)
        res["still"] = geo()
        print(json.dumps(res))
        """))
    assert out["squatter"]
    for what in ("init", "env", "attach"):
        kind, msg, typed = out[what]
        assert kind == "RegionInUse" and typed, out[what]
        assert "0x330000000000" in msg, msg
        assert "CLAMOR_BASE" in msg, msg       # says how to choose another
    assert out["role"] is None and out["squatter intact"]
    assert out["moved"] == ["driver", 0x340000000000, 1 << 30, 64 << 10]
    assert out["usable"]
    for what in ("twice", "twice default", "attach after init"):
        kind, msg, typed = out[what]
        assert kind == "RegionInUse" and typed, out[what]
        assert "already has a region" in msg and "0x340000000000" in msg, msg
    assert out["still"] == out["moved"]


def test_close_then_init_again():
    out = run_json(script("""
        import gc
        import numpy as np
        res = {}
        region.init(size=1 << 30)
        a = clamor.array(np.arange(1000.0))
        old = a.ctypes.data
        res["first"] = [geo(), clamor.heap_stats()["allocated"] > 0]
        res["refused"] = attempt(region.close)   # `a` still lives in it
        res["after refusal"] = [geo(), bool(a.sum() == 499500.0)]
        region.close(force=True)
        res["closed"] = [geo(), clamor.heap_stats()]
        res["close twice"] = attempt(region.close)
        region.init(base=0x360000000000, size=2 << 30, page_size=4096)
        res["second"] = geo()
        res["heap fresh"] = clamor.heap_stats()["allocated"]
        region.close()
        region.init(size=1 << 30)                # the first geometry again
        b = clamor.full(1000, 7.0)
        res["same address"] = b.ctypes.data == old
        del a                                    # an array of the closed region is collected ...
        gc.collect()
        c = clamor.full(1000, 9.0)               # ... and must not have freed b's block
        res["b intact"] = b.tolist() == [7.0] * 1000 and not np.shares_memory(b, c)
        res["b live"] = clamor.usable_size(b.ctypes.data) >= 8000
        print(json.dumps(res))
        """))
    assert out["first"] == [["driver", 0x200000000000, 1 << 30, 64 << 10], True]
    assert out["refused"][0] == "RegionInUse" and "still allocated" in out["refused"][1]
    assert out["after refusal"] == [["driver", 0x200000000000, 1 << 30, 64 << 10], True]
    assert out["closed"] == [[None, 0, 0, 0], {"allocated": 0, "footprint": 0}]
    assert out["close twice"] == ["ok", None]
    assert out["second"] == ["driver", 0x360000000000, 2 << 30, 4096]
    assert out["heap fresh"] == 0
    assert out["same address"]
    assert out["b intact"] and out["b live"]


# ---- configure / stats ------------------------------------------------------------

def test_configure_validation_and_round_trip():
    out = run_json(script("""
        res = {"defaults": clamor.configure()}
        res["bad"] = {
            "readahead -1": attempt(clamor.configure, readahead=-1),
            "fetch_timeout 0": attempt(clamor.configure, fetch_timeout=0),
            "fetch_timeout -2": attempt(clamor.configure, fetch_timeout=-2.0),
            "max_mappings -1": attempt(clamor.configure, max_mappings=-1),
            "diff_keep -1": attempt(clamor.configure, diff_keep=-1),
        }
        res["after bad"] = clamor.configure()
        res["set"] = clamor.configure(readahead=1 << 20, fetch_timeout=2.5, max_mappings=1000)
        res["get"] = clamor.configure()
        res["partial"] = clamor.configure(readahead=0)
        res["restore"] = clamor.configure(max_mappings=0)
        res["ms"] = clamor.configure(fetch_timeout=0.0001)["fetch_timeout"]
        res["diff_keep"] = clamor.configure(diff_keep=0)["diff_keep"]
        print(json.dumps(res))
        """))
    d = out["defaults"]
    # the defaults of docs/configuration.md (run_json's environment has no CLAMOR_*)
    with open("/proc/sys/vm/max_map_count") as f:
        half = int(f.read()) // 2
    assert d == {"readahead": 4 << 20, "fetch_timeout": 30.0, "max_mappings": half if half > 1024 else 512,
                 "diff_keep": 1 << 30}, d
    assert isinstance(d["readahead"], int) and isinstance(d["fetch_timeout"], float)
    assert isinstance(d["max_mappings"], int)
    for what, r in out["bad"].items():
        assert r[0] == "ConfigError" and r[2], (what, r)
    assert "readahead" in out["bad"]["readahead -1"][1]
    assert out["after bad"] == d  # a refused call changes nothing
    assert out["set"] == out["get"] == {"readahead": 1 << 20, "fetch_timeout": 2.5, "max_mappings": 1000,
                                        "diff_keep": 1 << 30}
    assert out["partial"] == {"readahead": 0, "fetch_timeout": 2.5, "max_mappings": 1000, "diff_keep": 1 << 30}
    assert out["restore"]["max_mappings"] == d["max_mappings"]
    assert out["ms"] == 0.001  # rounded up to the 1 ms resolution, never 0
    assert out["diff_keep"] == 0


STAT_INTS = ("faults", "pages_fetched", "bytes_fetched", "readahead_pages", "readahead_streams",
             "fetch_requests", "fetch_errors",
             "pages_served", "bytes_served", "requests_served", "bad_requests", "evictions", "pages_dropped",
             "pages_invalidated", "pages_logged", "pages_unchanged", "pages_parked", "pages_unparked", "pages_logged_ahead", "versions", "version_bytes",
             "pages_from_peers", "bytes_from_peers", "redirects", "peer_fallbacks", "peer_direct", "hint_bytes", "peer_timeouts",
             "peers_admitted", "peers_refused", "reloc_pages", "reloc_words", "reloc_bytes", "pages_mapped", "pages_compacted",
             "wire_bytes_fetched", "wire_bytes_served", "region_frees", "peer_written", "pages_kept", "diff_pages",
             "diff_wire_bytes", "diff_retries", "diff_pages_served", "diff_pages_reused", "kept_bytes", "latency_count", "mappings")
STAT_FLOATS = ("fetch_p50_us", "fetch_p99_us", "fetch_max_us")


def check_stats(st):
    assert set(st) == set(STAT_INTS) | set(STAT_FLOATS)
    for k in STAT_INTS:   # uint64 counters: one taken below zero would wrap to near 2**64
        assert type(st[k]) is int and st[k] < 1 << 63, (k, st[k])
    for k in STAT_FLOATS:
        assert type(st[k]) is float and st[k] >= 0, (k, st[k])
    assert st["fetch_p50_us"] <= st["fetch_p99_us"], st
    if st["latency_count"] == 0:
        assert st["fetch_p50_us"] == st["fetch_p99_us"] == st["fetch_max_us"] == 0.0, st


def test_stats_keys_and_types():
    check_stats(clamor.stats())


# ---- functions on workers ----------------------------------------------------------

def test_cluster_run_task_error_and_recovery():
    out = run_json(script("""
        import numpy as np

        def read(r):
            import clamor
            x = r.get()
            return float(x.sum()), clamor.stats()

        def where():
            import os
            from clamor import region
            return [os.getpid(), region.role(), region.base()]

        def explode_here(n):
            return {"a": 1}["b" * n]

        a = clamor.array(np.arange(1 << 18, dtype="f8"))
        res = {}
        with clamor.Cluster(workers=1, start_method="spawn", progress=False) as cl:
            res["workers"] = [cl.worker_pids, os.getpid(), cl.run(where), region.base()]
            [(res["sum"], res["worker stats"])] = cl.run(read, clamor.ref(a))
            res["driver stats"] = clamor.stats()
            try:
                cl.run(explode_here, 3)
                res["error"] = None
            except clamor.TaskError as e:
                res["error"] = [str(e), e.remote_traceback, isinstance(e, clamor.ClamorError), e.remote_type]
            res["after"] = cl.run(lambda x, y=0: x * 2 + y, 20, y=2)
            res["map"] = cl.parallelize(range(5), 3).map(lambda x: x * x).collect()
            try:
                cl.run(lambda: 1 / 0)
            except clamor.TaskError as e:
                res["zero"] = str(e)
            res["after again"] = cl.run(read, clamor.ref(a))[0][0]
        print(json.dumps(res))
        """))
    pids, driver_pid, where, base = out["workers"]
    assert len(pids) == 1 and pids[0] != driver_pid
    assert where == [[pids[0], "worker", base]]
    total = float(sum(range(1 << 18)))
    assert out["sum"] == total and out["after again"] == total
    ws, ds = out["worker stats"], out["driver stats"]
    check_stats(ws)
    check_stats(ds)
    assert ws["faults"] > 0 and ws["pages_fetched"] + ws["pages_mapped"] >= (1 << 21) // (64 << 10)
    assert ws["bytes_fetched"] == ws["pages_fetched"] * (64 << 10)
    assert ws["mappings"] >= 1 and ws["fetch_errors"] == 0
    assert ds["pages_served"] >= ws["pages_fetched"] and ds["faults"] == 0
    msg, tb, typed, kind = out["error"]
    assert typed and kind == "KeyError"
    assert msg.startswith("KeyError: 'bbb'")
    assert "Remote traceback" in msg and tb in msg
    assert "Traceback (most recent call last)" in tb and "explode_here" in tb and "KeyError" in tb
    assert out["after"] == [42]
    assert out["map"] == [0, 1, 4, 9, 16]
    assert "ZeroDivisionError" in out["zero"]


def test_connect_to_nobody_is_transport_error():
    out = run_json(script("""
        import time
        t = time.monotonic()
        r = attempt(clamor.connect, "tcp://127.0.0.1:1", timeout=0.5)
        print(json.dumps([r, time.monotonic() - t, geo()]))
        """))
    (kind, msg, typed), took, g = out
    assert kind == "TransportError" and typed, out
    assert "tcp://127.0.0.1:1" in msg
    assert took < 5
    assert g == [None, 0, 0, 0]


def test_worker_without_driver(orphan_worker):
    """Collects the worker the module started: nobody answers at its driver
    endpoint, so it must exit non-zero, saying so, after its 3 s wait."""
    p, t0 = orphan_worker
    _, err = p.communicate(timeout=max(1.0, 45 - (time.monotonic() - t0)))
    took = time.monotonic() - t0
    assert p.returncode not in (0, None)
    assert "no answer from the driver at tcp://127.0.0.1:1 within 3 s" in err, err
    assert "Traceback" not in err, err  # a message, not a crash
    # it waited its 3 s; one that never gave up fails the communicate
    # above, at 45 s (no tighter bound: its start-up alone took 21 s on a
    # loaded machine)
    assert took >= 3


# ---- the cffi declarations ------------------------------------------------------------

def _prototypes(text):
    """{name: normalised prototype} of the clamor_* functions declared in C text."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)
    out = {}
    for m in re.finditer(r"([A-Za-z_][\w \t\*]*?\b(clamor_\w+)\s*\(([^;{)]*)\))\s*;", text):
        out[m.group(2)] = re.sub(r"\s+", " ", re.sub(r"\s*([*(),])\s*", r"\1", m.group(1))).strip()
    return out


def test_cdefs_match_the_headers():
    cdefs = _prototypes((ROOT / "clamor" / "_cdefs.h").read_text())
    public = _prototypes((ROOT / "csrc" / "clamor.h").read_text())
    binding = _prototypes((ROOT / "csrc" / "binding.h").read_text())
    internal = _prototypes((ROOT / "csrc" / "internal.h").read_text())
    assert len(cdefs) >= 40, sorted(cdefs)  # the regex found them
    header = {**public, **binding, **internal}
    assert not set(public) & set(binding) and not set(public) & set(internal) and not set(binding) & set(internal), \
        "declared in two headers"
    missing = sorted(set(cdefs) - set(header))
    assert not missing, f"declared in _cdefs.h but in none of csrc/clamor.h, binding.h, internal.h: {missing}"
    differ = {n: (cdefs[n], header[n]) for n in cdefs if cdefs[n] != header[n]}
    assert not differ, differ
    # every function of the contract and of the binding's header reaches
    # Python; the hooks only the Python extension has are internal, and
    # reach Python too
    assert sorted(set(header) - set(cdefs)) == []
    assert not [n for n in public if n.startswith("clamor_py_")]
    assert binding and not [n for n in binding if n.startswith("clamor_py_")]
    assert internal and all(n.startswith("clamor_py_") for n in internal), sorted(internal)
    from clamor._native import lib
    for name in cdefs:
        assert callable(getattr(lib, name)), name


def test_a_clean_exit_with_faulthandler_on_and_region_objects_still_referenced():
    """faulthandler (enabled at start-up) puts back, late in finalization,
    the SIGSEGV action it found: clamor's handler must not be gone while
    the interpreter still releases region objects on pages the driver keeps
    write-protected for versions.  The type cache holds the last reference
    to a str built in the region; it is released after faulthandler's
    finalization, and that write to a protected page used to kill a clean
    run with SIGSEGV."""
    out = run_json(script("""
        region.init()
        with clamor.heap():
            name = "".join(["no_such", "_attribute_", str(12345)])    # a new str, in the region
        assert region.contains(id(name))
        getattr(int, name, None)          # the type cache keeps the name
        del name
        region.version_begin(region.version_current() + 1)     # pages write-protected: writes are versioned
        print(json.dumps({"ok": True}))
        """), env={"PYTHONFAULTHANDLER": "1"})
    assert out == {"ok": True}


def test_dirty_pages_lists_the_pages_first_written_since_the_stage_began():
    """region.dirty_pages(): none before the first stage, the pages written
    since the last stage began (each once, sorted), none again after the
    next begin; a page written back to the same bytes is listed too (the
    begin is what compares)."""
    out = run_json(script("""
        region.init()
        a = clamor.zeros(8 * region.page_size() // 8, dtype=np.int64)      # 8 pages
        first = (a.__array_interface__["data"][0] - region.base()) // region.page_size()
        per = region.page_size() // 8
        before = region.dirty_pages().tolist()
        a[:] = 1
        region.version_begin(region.version_current() + 1)
        empty = region.dirty_pages().tolist()
        a[5 * per] = 2; a[2 * per + 3] = 1; a[5 * per + 1] = 7
        written = (region.dirty_pages() - first).tolist()
        changed = (region.version_begin(region.version_current() + 1) - first).tolist()
        after = region.dirty_pages().tolist()
        print(json.dumps({"before": before, "empty": empty, "written": written, "changed": changed,
                          "after": after}))
        """))
    assert out == {"before": [], "empty": [], "written": [2, 5], "changed": [5], "after": []}, out


def test_every_function_of_the_contract_has_its_contract():
    """csrc/clamor.h is a contract: the comment each function follows (with
    only declarations and #defines between) says which threads may call it
    and whether it is async-signal-safe."""
    text = (ROOT / "csrc" / "clamor.h").read_text()
    names = _prototypes(text)
    assert len(names) >= 40, sorted(names)
    bare = []
    for name in names:
        before = text[:re.search(r"^[A-Za-z_][\w \t*]*\b%s\s*\([^;{)]*\)\s*;" % name, text, re.M).start()]
        end = before.rfind("*/")
        comment = before[before.rfind("/*", 0, end):end]
        if "/*" in before[end:] or "Thread:" not in comment or "Signal:" not in comment:
            bare.append(name)
    assert not bare, f"functions of csrc/clamor.h without Thread: and Signal: in their comment: {bare}"
