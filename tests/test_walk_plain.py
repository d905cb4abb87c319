"""share()'s walk of plain data in C (csrc/pywalk.c) against the walk in
Python, its reference (clamor/memory/walk.py): the verdict, and for the
Cluster's check the bytes the verdict rests on.

The C walk may only say yes where the Python walk says yes with nothing to
add: approved, no object brought into the region, no dict given keys of its
own, no warning.  Where it cannot tell, it says no and the Python walk
decides.  Random graphs of dicts, lists, tuples, sets, strs, bytes, ints and
floats, each built in a block or with parts made outside it: ints and strs
made outside, tables grown outside a block, the static empty dict keys,
singletons, a set with a weak reference, an instance's split dict, an
instance, an array, shared and repeated objects, and more objects than the
limit.  Both walks run on each; the Python walk runs second, since it may
write (bringing objects in).
"""
from helpers import run_driver

DIFFERENTIAL = """
import json, random, sys, warnings, weakref
import numpy as np
import clamor
from clamor.memory import walk, _pyshare
from clamor._native import ffi, lib

class Inst:
    pass

def c_walk(o, limit):
    spans = _pyshare.AddressMap().images()
    v = ffi.new("long *")
    return lib.clamor_py_walk_plain(id(o), limit, ffi.new("uintptr_t[]", [x for r in spans for x in r]),
                                    len(spans), v, 0), v[0]

def python_walk(o, limit):
    walk.plain_in_c[0] = False
    before = (walk.brought[0], walk.conversions[0])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            clamor.share(o, limit=limit)
        verdict = "approved"
    except clamor.NotShareable as e:
        verdict = "refused"
    finally:
        walk.plain_in_c[0] = True
    return verdict, (walk.brought[0], walk.conversions[0]) != before, len(caught)

def union(pairs):
    out = []
    for lo, n in sorted((int(a), int(b)) for a, b in pairs if int(b)):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], lo + n)
        else:
            out.append([lo, lo + n])
    return out

def same_reads(o, limit):
    # the bytes the Cluster's check rests on: the C walk's extents against
    # the Python walk's (walk.pointer_extents of every object)
    mine = walk.Reads()
    if not walk._walk_plain(o, limit, mine):
        return "C deferred"
    walk.plain_in_c[0] = False
    try:
        theirs = walk.Reads()
        walk._walk(o, limit, None, theirs)
    finally:
        walk.plain_in_c[0] = True
    return union(mine.plain) == union((lo, n) for lo, n, *_ in theirs.extents) and not theirs.inherited

def leaf(r, outside):
    k = r.randrange(9)
    if k == 0:
        return r.choice([None, True, False, Ellipsis, 0, 7, -3, 256, "", "a", "\\xe9"])
    v = [lambda: r.randrange(10**3, 10**12), lambda: r.random() * 1e6, lambda: "s" + str(r.random()),
         lambda: ("é" + str(r.randrange(10**6))), lambda: str(r.randrange(10**6)).encode() * 3,
         lambda: complex(r.random(), 1.5), lambda: r.randrange(300, 10**6), lambda: "k" * r.randrange(2, 40)][k - 1]
    return r.choice(OUTSIDE) if outside else v()

def build(r, depth, odd):
    k = r.randrange(6) if depth < 3 else 6
    if k == 6:
        return leaf(r, odd and r.random() < 0.1)
    n = r.randrange(0, 8)
    items = [build(r, depth + 1, odd) for _ in range(n)]
    if k == 0:
        return items
    if k == 1:
        return tuple(items)
    if k == 2 or k == 3:
        return {(i if r.random() < 0.5 else "key" + str(i)): x for i, x in enumerate(items)}
    def hashable(x):
        try:
            hash(x)
            return True
        except TypeError:
            return False
    hashable = [x for x in items if hashable(x)]
    return set(hashable) if k == 4 else frozenset(hashable)

def perturb(r, g, shared):
    # a change of the kinds that make the Python walk refuse, bring in or warn
    k = r.randrange(10)
    box = g if isinstance(g, list) else None
    if box is None:
        return g, "none"
    if k == 0:
        with clamor.heap.suspended():
            box.extend([str(r.random()) for _ in range(40)])   # the item array grows outside the block
        return g, "list grown outside"
    if k == 1:
        with clamor.heap.suspended():
            box.append(10**9 + r.randrange(1000))               # an int made outside the block
        return g, "int outside"
    if k == 2:
        with clamor.heap():
            box.append({})                                      # the interpreter's static empty keys
            box.append(())                                      # the static empty tuple
        return g, "empty dict"
    if k == 3:
        with clamor.heap():
            s = {1.5, 2.5}
        shared.append(weakref.ref(s))                            # a weak reference made outside the block
        box.append(s)
        return g, "weakly referenced set"
    if k == 4:
        with clamor.heap():
            i = Inst()
            i.a, i.b = 1.25, "x" + str(r.random())
            box.append(i.__dict__)                              # a split dict
        return g, "split dict"
    if k == 5:
        with clamor.heap():
            box.append(Inst())
        return g, "instance"
    if k == 6:
        with clamor.heap():
            box.append(np.arange(3.0))
        return g, "array"
    if k == 7 and box:
        box.append(box[0])                                      # the same object twice
        box.append(box)                                         # and a cycle
        return g, "shared and cycle"
    if k == 8:
        with clamor.heap():
            d = {"k" + str(j): j * 0.5 for j in range(3)}
        with clamor.heap.suspended():
            for j in range(30):
                d["g" + str(j)] = None                           # the keys table grows outside the block
        box.append(d)
        return g, "dict grown outside"
    return g, "none"

r = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
OUTSIDE = [r.randrange(10**3, 10**12) for _ in range(50)] + ["o" + str(r.random()) for _ in range(50)] + \
          [r.random() * 1e6 for _ in range(50)]      # made outside any block
shared = []
counts = {"c_yes": 0, "c_no": 0, "bad": [], "kinds_c_no": {}, "kinds_c_yes": {}, "limit_checked": 0, "reads_compared": 0}
for case in range(int({cases!r})):
    with clamor.heap():
        g = [build(r, 0, odd=case % 3 == 0) for _ in range(r.randrange(1, 5))]
    g, kind = perturb(r, g, shared)
    limit = 10**6 if case % 17 else max(1, r.randrange(1, 30))
    counts["limit_checked"] += limit < 10**6
    c, visited = c_walk(g, limit)
    verdict, wrote, warned = python_walk(g, limit)
    if c == 1:
        counts["c_yes"] += 1
        counts["kinds_c_yes"][kind] = counts["kinds_c_yes"].get(kind, 0) + 1
        if verdict != "approved" or wrote or warned:
            counts["bad"].append([case, kind, verdict, wrote, warned])
    else:
        counts["c_no"] += 1
        counts["kinds_c_no"][kind] = counts["kinds_c_no"].get(kind, 0) + 1
    if c == 1:
        counts["reads_compared"] += 1
        same = same_reads(g, limit)
        if same is not True:
            counts["bad"].append([case, kind, "reads differ", same])
    if c == 1 and case % 11 == 0:       # and the C walk's answer stands once Python walked too
        c2, _ = c_walk(g, limit)
        if c2 != 1:
            counts["bad"].append([case, kind, "C changed its mind"])
print(json.dumps(counts))
"""


def test_the_c_walk_approves_only_what_the_python_walk_approves_untouched():
    out = run_driver(DIFFERENTIAL.replace("{cases!r}", "300"), timeout=300)
    assert out["exit"] == 0, out
    assert not out["bad"], out
    assert out["c_yes"] >= 60 and out["c_no"] >= 60, out      # both answers are exercised
    assert out["reads_compared"] == out["c_yes"], out
    # each kind of change that needs the Python walk made the C walk defer
    for kind in ("list grown outside", "int outside", "weakly referenced set", "split dict", "instance", "array",
                 "dict grown outside"):
        assert out["kinds_c_no"].get(kind, 0) >= 3, (kind, out)
    assert out["limit_checked"] >= 10, out
    assert out["kinds_c_yes"].get("empty dict", 0) >= 3, out      # the static empty keys and tuple: accepted


def test_share_of_plain_data_goes_through_the_c_walk_and_is_read_right():
    """A big dict of plain data: share() takes the C walk (it approves
    without the Python walk's per-object cost), and forked workers read it
    as the driver does."""
    out = run_driver("""
import json, time
import clamor
from clamor.memory import walk
n = 200_000
with clamor.heap():
    d = {i: (i, "s" + str(i)) for i in range(n)}
    s = {"k" + str(i): ["v" + str(i), i * 0.5] for i in range(n)}
calls = []
orig = walk._walk_once
walk._walk_once = lambda *a, **k: calls.append(1) or orig(*a, **k)
with clamor.Cluster(workers=2, progress=False) as cl:
    clamor.share(d)
    clamor.share(s)
    python_walks = len(calls)
    got = cl.parallelize(range(2), 2).map(lambda i: [d[7 + i], d[n - 1], s["k123"], len(s)]).collect()
print(json.dumps({"python_walks": python_walks, "got": got}))
""", timeout=180)
    assert out["exit"] == 0, out
    assert out["python_walks"] == 0, out
    assert out["got"] == [[[7, "s7"], [199_999, "s199999"], ["v123", 61.5], 200_000],
                          [[8, "s8"], [199_999, "s199999"], ["v123", 61.5], 200_000]], out
