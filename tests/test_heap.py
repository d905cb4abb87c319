"""clamor.heap(): allocations inside the block land in the region."""
import json

from helpers import PRELUDE, shared_library

PRE = PRELUDE + """
import gc
region.init(size=8 << 30)
inr = lambda o: region.contains(id(o))
"""

CLIB = r"""
#include <stdlib.h>
#include <string.h>
void *grab(size_t n) { char *p = malloc(n); if (p) memset(p, 7, n); return p; }
void drop(void *p) { free(p); }
void *grow(void *p, size_t n) { return realloc(p, n); }
"""


def test_python_objects_and_numpy_arrays_land_in_the_region(py):
    p = py(PRE + """
class Point:   # (3.11 materialises __dict__ lazily, on access: check the values)
    def __init__(self, x, y): self.x, self.y = x, y
with clamor.heap():
    l = [float(i) * 1.5 for i in range(1000)]
    d = {str(i): (i, i + 1) for i in range(100)}
    pt = Point(len(l) * 0.5, len(d) * 0.25)   # computed: constants live in code objects
    small = np.arange(3.0)           # numpy's small-buffer cache would reuse old memory
    big = np.ones(1 << 20)
    s = "".join(["x"] * 50)
out = {"list": inr(l), "float": inr(l[7]), "dict": inr(d), "tuple": inr(d["5"]), "obj": inr(pt),
       "attrs": inr(pt.x), "small": clamor.in_region(small), "big": clamor.in_region(big),
       "str": inr(s)}
after = [3, 4]
out["outside_list"] = inr(after)
out["outside_arr"] = clamor.in_region(np.zeros(5))
before = clamor.heap_stats()["allocated"]
del l, d, pt, small, big, s
gc.collect()
out["freed"] = before - clamor.heap_stats()["allocated"]
print(json.dumps(out))
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    inside = ["list", "float", "dict", "tuple", "obj", "attrs", "small", "big", "str"]
    assert all(out[k] for k in inside), out
    assert not out["outside_list"] and not out["outside_arr"], out
    assert out["freed"] >= 8 << 20, out   # freed outside the block, back to the region


def test_the_first_slice_a_block_makes_is_its_own_not_the_one_cpython_cached(py):
    """CPython keeps one freed slice for the next, and a collection leaves
    it: a block's first slice was that one, outside the region (a pandas
    block made inside a Cluster was refused for it, its placement's slice
    not inherited).  So after a suspension inside the block."""
    p = py(PRE + """
x = slice(1, 2, 3); del x                 # cached: made outside any block
with clamor.heap():
    first = slice(4, 5)
    pair = tuple([first])                 # (and no tuple of the runtime's on the free list)
    with clamor.heap.suspended():
        y = slice(7, 8, 9); del y         # cached again, outside the block
    again = slice(5, 6)
    pair2 = tuple([again])
after = slice(8, 9)
print(json.dumps([inr(first), inr(pair), inr(again), inr(pair2), inr(after)]))
""")
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [True, True, True, True, False], p.stdout


def test_c_heap_of_extension_modules_is_interposed(py, tmp_path):
    lib = shared_library(tmp_path, "grab", CLIB)
    p = py(PRE + f"""
import ctypes
clamor.heap.__wrapped__ if hasattr(clamor.heap, "__wrapped__") else None
with clamor.heap():
    g = ctypes.CDLL("{lib}")                # loaded inside the block: patched on dlopen
    g.grab.restype = g.grow.restype = ctypes.c_void_p
    g.grab.argtypes = [ctypes.c_size_t]; g.drop.argtypes = [ctypes.c_void_p]
    g.grow.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    a = g.grab(100)
    b = g.grab(1 << 20)
c = g.grab(100)                             # outside: glibc as before
moved = None
with clamor.heap():
    moved = g.grow(c, 4096)                 # a glibc block grown inside moves into the region
used = clamor.heap_stats()["allocated"]
g.drop(b)                                   # a region block freed outside the block
out = {{"a": region.contains(a), "b": region.contains(b), "c": region.contains(c),
        "moved": region.contains(moved), "kept": ctypes.string_at(moved, 100) == b"\\x07" * 100,
        "freed": used - clamor.heap_stats()["allocated"]}}
print(json.dumps(out))
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["a"] and out["b"] and not out["c"], out
    assert out["moved"] and out["kept"], out
    assert out["freed"] >= 1 << 20, out


def test_scipy_kdtree_built_under_heap_is_queried_in_place_on_workers(py):
    p = py(PRE + """
import scipy.spatial
pts = np.random.default_rng(0).random((200000, 2))
qs = np.random.default_rng(1).random((500, 2))
ref = scipy.spatial.KDTree(pts.copy()).query(qs, k=10)
with clamor.Cluster(workers=2, progress=False) as cl:
    with clamor.heap():                     # built by the driver after the fork
        tree = scipy.spatial.KDTree(pts)
    assert clamor.in_region(tree.maxes)     # (tree.data is pts itself, inherited at fork)
    for _ in range(3):   # several stages: the tree's pages must stay valid across them
        got = cl.parallelize(qs, partitions=4).map_partitions(lambda q: [tree.query(q, k=10)]).collect()
    st = cl.stats()
d = np.concatenate([g[0] for g in got]); i = np.concatenate([g[1] for g in got])
assert np.array_equal(i, ref[1]) and np.allclose(d, ref[0])
print(json.dumps({"bytes": st["bytes_from_driver"], "payload": max(s["payload_bytes"] for s in cl.stage_stats()),
                  "heap": clamor.heap_stats()["allocated"]}))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["payload"] < 10_000, out     # the tree travelled by reference


def test_share_names_what_is_outside_the_region(py):
    p = py(PRE + """
with clamor.Cluster(workers=1, progress=False) as cl:
    late = {"payload": [1.5, "made " + str(os.getpid())]}    # after the fork, outside the region
    with clamor.heap():
        good = {"values": [float(i) for i in range(10)], "arr": np.ones(10)}
        bad = {"ok": [2.5], "late": late}
    clamor.share(good)
    try:
        clamor.share(bad)
        print("NOT REFUSED")
    except clamor.NotShareable as e:
        print("REFUSED", e)
    # a task that captures it gets it by value, as the driver reads it now
    got = cl.range(1).map(lambda i: (len(bad), bad["late"]["payload"][1], bad["ok"][0])).collect()
    print("SHIPPED", json.dumps(got == [(2, "made " + str(os.getpid()), 2.5)]))
    assert cl.range(2).map(lambda i: len(good["values"]) + i).collect() == [10, 11]
""", check=True)
    assert "REFUSED obj['late']" in p.stdout, p.stdout
    assert "SHIPPED true" in p.stdout, p.stdout


def test_heap_on_a_worker_is_refused(py):
    py(PRE + """
with clamor.Cluster(workers=1, progress=False) as cl:
    def f(_):
        try:
            with clamor.heap():
                pass
        except clamor.NotDriver:
            return "refused"
    assert cl.range(1).map(f).collect() == ["refused"]
""", check=True)


def test_a_class_made_after_the_fork_is_not_shareable(py):
    p = py(PRE + """
with clamor.Cluster(workers=1, progress=False) as cl:
    class Late:
        __slots__ = ("x",)
    with clamor.heap():
        obj = [Late()]
    try:
        clamor.share(obj)
        print("NOT REFUSED")
    except clamor.NotShareable as e:
        print("REFUSED", e)
""", check=True)
    assert "REFUSED obj[0]" in p.stdout and "type" in p.stdout, p.stdout


def test_geo_demo_quick_runs_and_matches_single_process(py):
    p = py("""
import sys
from clamor.cli import main
sys.exit(main(["demo", "geo", "--quick", "--queries", "2000"]))
""", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "answers equal to the single-process run: yes" in p.stdout, p.stdout


def test_fork_snapshot_does_not_grow_with_each_cluster():
    import importlib
    share = importlib.import_module("clamor.memory.walk")   # (the walk behind clamor.share)
    share.note_fork()
    first = len(share._inherited)
    for _ in range(3):
        share.note_fork()
    assert len(share._inherited) < first * 1.2, (first, len(share._inherited))


ALIGNLIB = r"""
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
void *mal(size_t a, size_t n) { return memalign(a, n); }
void *rarr(void *p, size_t n, size_t s) { return reallocarray(p, n, s); }
void *grow(void *p, size_t n) { return realloc(p, n); }
void *grab(size_t n) { char *p = malloc(n); if (p) memset(p, 7, n); return p; }
"""


def test_memalign_of_any_alignment_and_reallocarray_inside_the_block(py, tmp_path):
    # glibc's memalign rounds an alignment up to a power of two, and
    # reallocarray grows a block; inside a block both must act on region
    # memory (reallocarray of a region block used to reach glibc: abort).
    lib = shared_library(tmp_path, "al", ALIGNLIB)
    p = py(PRE + f"""
import ctypes
g = ctypes.CDLL("{lib}")
C, S = ctypes.c_void_p, ctypes.c_size_t
g.mal.restype = g.rarr.restype = g.grab.restype = C
g.mal.argtypes = [S, S]; g.rarr.argtypes = [C, S, S]; g.grab.argtypes = [S]
out = {{}}
with clamor.heap():
    for a in (0, 1, 48, 4096):
        m = g.mal(a, 100)
        out[str(a)] = [bool(m) and region.contains(m), (m or 1) % max(8, 1 << max(0, a - 1).bit_length()) == 0]
    b = g.grab(100)
    c = g.rarr(b, 1000, 8)
    out["rarr"] = [region.contains(c), ctypes.string_at(c, 100) == b"\\x07" * 100]
    out["ovf"] = g.rarr(c, 1 << 62, 8)
print(json.dumps(out))
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out.pop("ovf") is None, out
    assert all(v == [True, True] for v in out.values()), out


def test_fork_inside_a_block_gives_a_child_that_allocates_normally(py):
    # The child of fork() is a worker: the forking thread's block must not
    # carry over (every allocation in the child went to the region, which
    # a worker may not allocate in: Fatal Python error at once).
    p = py(PRE + """
region.serve()
with clamor.heap():
    kept = [float(i) for i in range(1000)]
    pid = os.fork()
    if pid == 0:
        x = [str(i) * 10 for i in range(1000)]
        d = {i: i for i in range(1000)}
        y = np.ones(1 << 18)                # (small objects may come off CPython's free lists)
        os._exit(0 if sum(kept) == 499500.0 and not clamor.in_region(y) and len(d) == 1000 else 3)
    _, st = os.waitpid(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(st)}))
""", check=True)
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"status": 0}


def test_a_fork_with_no_page_server_says_why_it_cannot_read_the_region(py):
    # Nothing serves pages to the child: its first touch of a region object
    # must end with clamor's message, not a bare SIGSEGV.
    p = py(PRE + """
with clamor.heap():
    kept = [float(i) for i in range(1000)]
    pid = os.fork()
    if pid == 0:
        s = sum(kept)
        os._exit(0)
    _, st = os.waitpid(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(st)}))
""")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"status": -6}, p.stdout   # abort(), after the message
    assert "no pager is running in this process" in p.stderr and "page server" in p.stderr, p.stderr
