"""The public surface as the README describes it: helpers reached through
``clamor.heap``, system-call wrappers on any buffer, external workers, the C
allocator for C code built apart, and the messages of misuse."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import clamor
from helpers import PRELUDE, shared_library
from clamor import region

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def test_heap_helpers_are_reached_through_clamor_heap():
    assert clamor.heap.suspended is sys.modules["clamor.memory.hooks"].suspended
    assert not clamor.heap.active()
    with clamor.heap():
        assert clamor.heap.active()
        with clamor.heap.suspended():
            assert not clamor.heap.active()
            assert not clamor.in_region(np.ones(100))
        assert clamor.heap.active()


def test_io_wrappers_take_ordinary_buffers_on_the_driver(tmp_path):
    region.ensure()
    f = tmp_path / "data"
    f.write_bytes(bytes(range(256)) * 16)
    buf = bytearray(4096)
    with open(f, "rb", buffering=0) as fh:
        assert clamor.readinto(fh, buf) == 4096
    assert buf == f.read_bytes()
    r, w = os.pipe()
    try:
        assert clamor.write(w, b"abc") == 3
        assert os.read(r, 3) == b"abc"
    finally:
        os.close(r)
        os.close(w)
    out = np.zeros(16, np.uint8)
    assert clamor.fromfile(str(f), out) == 16 and list(out) == list(range(16))


def test_prefetch_outside_the_region_names_the_range_on_the_driver():
    region.ensure()
    with pytest.raises(clamor.PageFetchError, match="not inside the region") as e:
        clamor.prefetch(bytearray(4))
    assert e.value.errno == 14   # EFAULT


def test_cluster_takes_a_worker_started_elsewhere(py):
    p = py(PRELUDE + """
a = clamor.array(np.arange(1000.0))
cl = clamor.Cluster(workers=0, remote=1, progress=False)
cmd = cl.join_command()                 # before start: the control socket is open
proc = subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint],
                        env={**os.environ, "CLAMOR_SECRET": cl.secret})
try:
    with cl:
        pids = cl.worker_pids
        got = cl.run(lambda r: float(r.get().sum()), clamor.ref(a)) + cl.run(lambda: float(a[::2].sum()))
finally:
    cl.close()
    proc.wait(30)
bad = []
for kw in ({"workers": 0}, {"workers": 0, "remote": -1}, {"remote": True}):
    try:
        clamor.Cluster(**kw)
    except clamor.ConfigError as e:
        bad.append(str(e))
print(json.dumps({"pids": pids, "pid": proc.pid, "got": got, "code": proc.returncode, "bad": bad,
                  "cmd": cmd, "endpoint": cl.endpoint}))
""", timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["pids"] == [out["pid"]] and out["got"] == [499500.0, 249500.0] and out["code"] == 0, out
    assert out["cmd"] == "clamor worker " + out["endpoint"], out
    assert len(out["bad"]) == 3, out
    assert "positive int" in out["bad"][0] and "int >= 0" in out["bad"][1] and "int >= 0" in out["bad"][2], out


def test_c_code_built_apart_allocates_in_the_region_through_c_api(py, tmp_path):
    lib = shared_library(tmp_path, "user", r"""
#include <string.h>
#include "clamor.h"
typedef void *(*malloc_fn)(size_t);
typedef void (*free_fn)(void *);
void *make(void *m, size_t n) { char *p = ((malloc_fn)m)(n); if (p) memset(p, 5, n); return p; }
void drop(void *f, void *p) { ((free_fn)f)(p); }
""", include=clamor.get_include())
    assert os.path.exists(os.path.join(clamor.get_include(), "clamor.h"))
    p = py(PRELUDE + f"""
import ctypes
api = clamor.c_api()
u = ctypes.CDLL("{lib}")
u.make.restype = ctypes.c_void_p
u.make.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
u.drop.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
region.init()
before = clamor.heap_stats()["allocated"]
p = u.make(api["clamor_malloc"], 100000)
inside = region.contains(p, 100000) and ctypes.string_at(p, 3) == b"\\x05\\x05\\x05"
grew = clamor.heap_stats()["allocated"] - before
u.drop(api["clamor_free"], p)
print(json.dumps({{"inside": inside, "grew": grew, "back": clamor.heap_stats()["allocated"] - before,
                   "names": sorted(api)}}))
""")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["inside"] and out["grew"] >= 100000 and out["back"] == 0, out
    assert "clamor_aligned_alloc" in out["names"], out


def test_share_takes_a_region_array_and_names_one_it_cannot_follow():
    a = clamor.array(np.arange(10.0))
    assert clamor.share(a) is a       # it travels by reference when shipped itself
    with clamor.heap():
        holder = {"k": None}
    holder["k"] = a                   # a region dict pointing at an array object outside the region
    with pytest.raises(clamor.NotShareable, match=r"obj\['k'\].*data in the region"):
        clamor.share(holder)


def test_misuse_messages():
    with pytest.raises(clamor.ConfigError, match="multiplier must be a number"):
        clamor.Speculation("x")
    err = clamor.TaskError("NotDriver: alloc(16): only the driver allocates", "tb")
    assert err.remote_type == "NotDriver"
    assert clamor.TaskError("no colon here").remote_type == ""
    p = subprocess.run([sys.executable, "-m", "clamor.worker", "--driver", "tcp://127.0.0.1:1", "--base", "zz"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "not an address: 'zz'" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "clamor", "demo", "pages", "--workers", "0"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "clamor demo pages: error" in p.stderr, p.stderr
