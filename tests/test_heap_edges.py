"""The edges of a heap() block: what CPython's free lists hand the block and
the code after it, what the block's collections write, and what memory
structures built and dropped in blocks give back (clamor/memory/heap.py,
hooks.drain_free_lists, hooks.collect_at_entry, csrc/pyfreelist.c,
csrc/pyrehome.c)."""
import json

from helpers import PRELUDE, run_driver

KINDS = PRELUDE + """
import gc
from clamor.memory import hooks
region.ensure()
inr = lambda o: region.contains(id(o), 1)

def made(n=40):
    # objects of every kind a free list keeps: floats, tuples of 1..19
    # items, lists, dicts with a str key (their key tables too), slices
    out = []
    for i in range(n):
        x = float(i) + 0.5
        out += [x, [x], {"k" + str(i % 3): x}, slice(i, None)]
        out += [tuple([x] * k) for k in range(1, 20)]
    return out

import ctypes
keys_of = lambda d: ctypes.c_void_p.from_address(id(d) + 32).value   # PyDictObject.ma_keys, 3.11-3.13
items_of = lambda l: ctypes.c_void_p.from_address(id(l) + 24).value  # PyListObject.ob_item
"""

# 10^5 region instances of a plain class, and the driver's count of pages
# logged as written (the setup of the tests of what a block and a stage write)
INSTANCES = PRELUDE + """
import gc
region.ensure()

class P:
    def __init__(self, i):
        self.i, self.s = i, "n" + str(i)

with clamor.heap():
    objs = [P(i) for i in range(100_000)]
pages = lambda: clamor.memory.region.stats()["pages_logged"]
"""


def test_a_block_makes_region_objects_whatever_the_free_lists_held_and_hands_none_out():
    out = run_driver(KINDS + """
for _ in range(3):
    junk = [made(150) for _ in range(20)]   # outside: onto every free list when dropped
    del junk
    with clamor.heap():
        inside = made()
        dead = made(150)     # region objects that die inside: onto the free lists
        del dead
    after = made()
    outside_bad = sorted({type(o).__name__ for o in after if inr(o)} |
                         {"keys" for o in after if type(o) is dict and region.contains(keys_of(o), 1)})
    inside_bad = sorted({type(o).__name__ for o in inside if not inr(o)} |
                        {"keys" for o in inside if type(o) is dict and not region.contains(keys_of(o), 1)})
    print(json.dumps({"inside_not_region": inside_bad, "after_in_region": outside_bad}))
""")
    assert out["exit"] == 0, out
    assert out["inside_not_region"] == [], out     # the block's objects are region ones
    assert out["after_in_region"] == [], out       # and none of its dead ones is handed out after it


def test_a_block_with_workers_running_writes_only_what_it_changes():
    # A full collection writes the collector's words of every tracked
    # object, and gc.get_objects() a reference count: with workers running,
    # each page holding a region instance was logged as a write at every
    # block (3,305 pages a block for a million instances).
    out = run_driver(INSTANCES + """
res = []
with clamor.Cluster(workers=2, progress=None) as cl:
    clamor.share(objs)
    first = cl.parallelize(range(2), 2).map(lambda k: objs[50_000 + k].i).collect()
    for r in range(4):
        before = pages()
        with clamor.heap():
            objs[r].i = -r - 1
        res.append(pages() - before)
        got = cl.parallelize(range(4), 2).map(lambda k: objs[k].i).collect()
    span = (id(objs[-1]) - id(objs[0])) // clamor.memory.region.page_size()
print(json.dumps({"logged": res, "span_pages": span, "first": first, "got": got}))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["first"] == [50_000, 50_001], out
    assert out["got"] == [-1, -2, -3, -4], out      # the workers read each change
    assert out["span_pages"] > 80, out                  # (the setup: the instances span many pages)
    # the first block may collect whole (the region grew since); the rest
    # write their change and the block's own few objects
    assert max(out["logged"][1:]) < 20, out


def test_structures_built_and_dropped_in_blocks_give_their_region_memory_back():
    # Cycles dropped outside a block are garbage only a full collection
    # frees: the entry of a block collects whole once the region has grown
    # by a quarter since the last such collection.
    out = run_driver(PRELUDE + """
import gc
region.ensure()
class Node:
    def __init__(self, up, i):
        self.up, self.i, self.kids = up, i, []
sizes = []
for r in range(40):
    with clamor.heap():
        root = Node(None, r)
        for i in range(3000):
            root.kids.append(Node(root, i))     # a cycle through every child
    one = clamor.heap_stats()["allocated"] if r == 0 else one
    del root
    sizes.append(clamor.heap_stats()["allocated"])
print(json.dumps({"one": one, "most": max(sizes), "last": sizes[-1]}))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["one"] > 300_000, out                  # (the setup: a structure of some size)
    assert out["most"] < 4 * out["one"], out           # 40 built, at most a few kept at once


def test_the_rehome_pass_reads_the_collectors_lists():
    out = run_driver(PRELUDE + """
import gc
from clamor.memory import hooks
from clamor._native import ffi, lib
heads = hooks._gc_heads()
gc.disable()
objs = gc.get_objects()
addrs = np.sort(np.fromiter(map(id, objs), dtype=np.uint64, count=len(objs)))
found = lib.clamor_py_gc_count(ffi.cast("const uint64_t *", heads.ctypes.data), len(heads),
                               ffi.cast("const uint64_t *", addrs.ctypes.data), len(addrs)) if heads is not None else -1
gc.enable()
# a module's dict and a list made outside, grown inside a block, get their
# tables back outside
import ctypes, types
m, l = types.ModuleType("grown"), []
with clamor.heap():
    for i in range(5000):
        setattr(m, "a" + str(i), i)
        l.append(i)
tables = [ctypes.c_void_p.from_address(id(m.__dict__) + 32).value, ctypes.c_void_p.from_address(id(l) + 24).value]
print(json.dumps({"heads": heads is not None, "found": found, "objects": len(objs),
                  "tables_inside": [region.contains(t, 1) for t in tables], "kept": [m.a4999, l[-1]]}))
""")
    assert out["exit"] == 0, out
    assert out["heads"], out                 # CPython 3.11-3.13 lay the lists out as csrc/pyrehome.c reads them
    assert out["found"] == out["objects"], out
    assert out["tables_inside"] == [False, False] and out["kept"] == [4999, 4999], out


def test_share_leaves_no_region_object_on_the_free_lists():
    # share() gives instances' dicts keys of their own and copies attribute
    # names in, in blocks of its own (csrc/pyownkeys.c): the dicts it
    # replaced, and what it put on the lists for those blocks, were left
    # there, and the runtime's next tuples (a stage's closure) were region
    # ones, sent by value.
    out = run_driver(KINDS + """
class Plain:
    def __init__(self, i):
        self.i, self.name = i, "n" + str(i)
with clamor.heap():
    objs = [Plain(i) for i in range(2000)]
clamor.share(objs)
after = made(150)
print(json.dumps({"after_in_region": sorted({type(o).__name__ for o in after if inr(o)} |
                                            {"keys" for o in after if type(o) is dict and
                                             region.contains(keys_of(o), 1)}),
                  "converted": clamor.memory.walk._owns_keys(vars(objs[0]))}))
""")
    assert out["exit"] == 0, out
    assert out["converted"], out          # (the setup: share() converted the instances' dicts)
    assert out["after_in_region"] == [], out


def test_a_stage_after_region_objects_died_outside_a_block_writes_only_what_changed():
    # Region memory freed outside a block (a block's temporary, dropped
    # after it) made the next action collect whole: the collector's words
    # of every region object written, each page of the global logged.
    out = run_driver(INSTANCES + """
res, got = [], []
with clamor.Cluster(workers=2, progress=None) as cl:
    clamor.share(objs)
    cl.parallelize(range(2), 2).map(lambda k: objs[k].i).collect()
    for r in range(4):
        with clamor.heap():
            objs[r].i = -r - 1
            tmp = ["t" + str(r)] * 1000     # a region list that dies outside the block
        del tmp
        before = pages()
        got.append(cl.parallelize(range(4), 2).map(lambda k: objs[k].i).collect())
        res.append(pages() - before)
    span = (id(objs[-1]) - id(objs[0])) // clamor.memory.region.page_size()
print(json.dumps({"logged": res, "span_pages": span, "got": got}))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["got"] == [[-1, 1, 2, 3], [-1, -2, 2, 3], [-1, -2, -3, 3], [-1, -2, -3, -4]], out
    assert out["span_pages"] > 80, out                  # (the setup: the instances span many pages)
    assert max(out["logged"]) < 20, out


def test_region_cycles_freed_by_the_collector_in_an_action_leave_its_answers_right():
    # Cycles of region objects dropped outside a block are freed by
    # CPython's own collections, whenever they run: here at nearly every
    # allocation, in the middle of each action, so that the runtime's own
    # tuples and dicts may be made of region objects just freed.  Each
    # answer must be the one computed in this process.
    out = run_driver(PRELUDE + """
import gc
region.ensure()

class Node:
    def __init__(self, up, i):
        self.up, self.i, self.kids = up, i, []

with clamor.heap():
    table = {i: (i, "v" + str(i), float(i) / 3) for i in range(20_000)}
bad = []
with clamor.Cluster(workers=2, progress=None) as cl:
    for r in range(6):
        with clamor.heap():
            root = Node(None, r)
            for i in range(500):
                root.kids.append(Node(root, (i, str(i), [i])))  # a cycle through every child
            table[r] = (-r, "changed" + str(r), float(-r))
        del root                                   # garbage only a full collection frees
        gc.set_threshold(1, 1, 1)
        try:
            keys = list(range(0, 20_000, 997)) + [r]
            got = cl.parallelize(keys, 3).map(lambda k: (k, table[k])).collect()
        finally:
            gc.set_threshold(700, 10, 10)
        want = [(k, table[k]) for k in keys]
        if got != want:
            bad.append([r, got[:3], want[:3]])
print(json.dumps({"bad": bad}))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["bad"] == [], out
