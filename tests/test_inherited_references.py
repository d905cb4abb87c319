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
