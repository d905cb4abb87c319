"""A forked worker inherits the driver's own memory as it is at the fork.
Where that memory holds a region object (a module's global a block set),
the driver keeps the object alive while such workers may live
(``hooks._held_from_outside``), so that the worker never reads another
object the driver later put in its memory."""
from helpers import PRELUDE, run_driver

MODULE_GLOBALS = PRELUDE + """
import gc, weakref
sys.path.insert(0, {path!r})
import heldmod

class Box:
    pass

with clamor.heap():
    heldmod.counter = int("1000001")               # a region int a module's global holds
    heldmod.names["k"] = "v" * 40 + str(len(sys.argv))   # a region str in a module's dict
    heldmod.box = Box()
    heldmod.box.value = 17
inside = [region.contains(id(x), 1) for x in (heldmod.counter, heldmod.names["k"], heldmod.box)]
gone = weakref.ref(heldmod.box)
read = lambda _: [heldmod.counter, heldmod.names["k"][:5], heldmod.box.value]
with clamor.Cluster(workers=1, max_attempts=1, progress=False) as cl:
    first = cl.parallelize(range(1), 1).map(read).collect()
    heldmod.counter, heldmod.names["k"], heldmod.box = 5, "w", None    # the driver drops them
    gc.collect()
    with clamor.heap():                             # and makes many objects of the same sizes
        junk = [int(str(10**7 + i)) for i in range(20000)] + ["x" * 41 for _ in range(5000)] + \\
               [Box() for _ in range(5000)]
    alive_during = gone() is not None
    try:
        second = cl.parallelize(range(1), 1).map(read).collect()
    except Exception as e:
        second = f"{{type(e).__name__}}: {{str(e).splitlines()[0][:200]}}"
    lost = cl.stats()["recovery"]["workers_lost"]
gc.collect()
print(json.dumps({{"inside": inside, "first": first, "second": second, "lost": lost,
                  "alive_during": alive_during, "freed_after": gone() is None}}))
"""


def test_a_region_object_a_module_global_held_at_the_fork_is_not_reused_under_the_workers(tmp_path):
    """On the old code the worker read 10000000 for the counter (one of the
    driver's later ints) and an empty ndarray for the str: another object,
    silently.  Now it reads what it inherited, the driver's own variables
    are its own, and the objects are freed once the Cluster is closed."""
    (tmp_path / "heldmod.py").write_text("counter = 0\nnames = {}\nbox = None\n")
    out = run_driver(MODULE_GLOBALS.format(path=str(tmp_path)), timeout=120)
    assert out["exit"] == 0, out
    assert out["inside"] == [True, True, True], out
    assert out["first"] == [[1000001, "vvvvv", 17]], out
    assert out["second"] == [[1000001, "vvvvv", 17]], out
    assert out["lost"] == 0 and out["alive_during"] and out["freed_after"], out


def test_the_list_of_held_objects_names_region_objects_behind_untracked_containers():
    """What the C pass lists: a region object a module's dict holds, one
    behind a tuple of atoms the collector does not track, and not an object
    outside the region or one only region objects hold."""
    out = run_driver("""
import gc, json, sys, types
import clamor
from clamor import region
from clamor.memory import hooks
mod = types.ModuleType("m")
with clamor.heap():
    direct = "d" * 50 + str(len(sys.argv))
    behind = "b" * 50 + str(len(sys.argv))
    inner = "i" * 50 + str(len(sys.argv))
    outer = [inner]                         # a region list: what it holds is not listed for it
mod.direct = direct
mod.pair = (1, behind)                      # a tuple of atoms, untracked once the collector saw it
mod.outer = outer
plain = "p" * 50 + str(len(sys.argv))
mod.plain = plain
gc.collect()
tracked = gc.is_tracked(mod.pair)
del direct, behind, inner, outer
held = hooks._held_from_outside()
ids = {id(o) for o in held}
print(json.dumps({"tracked": tracked, "direct": id(mod.direct) in ids, "behind": id(mod.pair[1]) in ids,
                  "outer": id(mod.outer) in ids, "inner": id(mod.outer[0]) in ids, "plain": id(plain) in ids,
                  "all_inside": all(region.contains(id(o), 1) for o in held)}))
""", timeout=60)
    assert out["exit"] == 0, out
    assert not out["tracked"], out          # the case the traversal into untracked containers is for
    assert out["direct"] and out["behind"] and out["outer"], out
    assert not out["inner"] and not out["plain"] and out["all_inside"], out


SNAPSHOT = """
import gc, json, random
from clamor._native import ffi, lib
import numpy as np

def reference(roots):
    # every path followed, as the snapshot's rule reads (csrc/pyfinger.c):
    # each root and its referents; below them dict keys, an untracked
    # dict's values and an untracked container's items, 8 levels deep
    out = set()
    def collect(o, depth):
        out.add(id(o))
        if depth >= 8:
            return
        if isinstance(o, dict):
            for k, v in o.items():
                collect(k, depth + 1)
                if not gc.is_tracked(o):
                    collect(v, depth + 1)
        elif not gc.is_tracked(o):
            for r in gc.get_referents(o):
                collect(r, depth + 1)
    for o in roots:
        collect(o, 0)
        for r in gc.get_referents(o):
            collect(r, 0)
    return out

r = random.Random(5)
def chain(n, tag):
    # untracked tuples (atoms only, after a collection), n levels, a str at each
    c = (f"leaf-{tag}",)
    for i in range(n):
        c = (c, f"{tag}-{i}-" + "x" * r.randrange(5))
    return c

graphs = []
for trial in range(30):
    chains = [chain(r.randrange(3, 14), f"t{trial}c{j}") for j in range(4)]
    mids = []
    for c in chains:
        for _ in range(r.randrange(2, 9)):
            c = c[0] if len(c) == 2 else c
        mids.append(c)
    keyed = {f"key-{trial}-{i}": [chains[i % 4]] for i in range(6)}
    roots = [{"a": chains[0], "b": (chains[1], mids[0])}, keyed, [mids[1], chains[2]], mids[2], (chains[3],), mids[3]]
    r.shuffle(roots)
    graphs.append((roots, chains + mids))
for _ in range(16):          # the tuples of atoms are untracked from here, a level a collection
    gc.collect()
results = []
raw = np.empty(1 << 16, dtype=np.uint64)
for roots, tuples in graphs:
    n = lib.clamor_py_snapshot(id(roots), ffi.cast("uint64_t *", raw.ctypes.data), len(raw))
    got = raw[:n].tolist()
    want = reference(roots)
    results.append([n, len(set(got)), len(want), sorted(set(got) ^ want)[:5], sum(not gc.is_tracked(t) for t in tuples)])
print(json.dumps(results))
"""


def test_the_fork_snapshot_lists_each_object_once_and_everything_every_path_reaches():
    """The snapshot of what forked workers inherit follows each object once,
    from the least depth it is reached at (a container reached first deep
    in a chain and later directly must still be followed to its depth
    limit): the same set as following every path, each address once."""
    from helpers import run_json
    results = run_json(SNAPSHOT)
    for n, unique, want, differ, untracked in results:
        assert untracked == 8, "the chains' tuples must be untracked, for the snapshot to follow them"
        assert n == unique, f"the snapshot repeats addresses: {n} for {unique} objects"
        assert not differ and unique == want, (n, unique, want, differ)
    assert max(w for _, _, w, _, _ in results) > 50
