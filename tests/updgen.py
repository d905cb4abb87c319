"""The driver of the differential test of updates (test_differential_updates.py).

The test runs this file, followed by a call to ``main``, as the script of a
fresh interpreter, so the classes below are module-level classes of the
driver's ``__main__``: they exist when the workers are forked.

The promise under test: a task computes what the same code computes in one
process, also after the driver changed, between stages, a region object
that was shipped before.  Containers of several shapes (``SHAPES``) are
built under ``clamor.heap()``, half before the Cluster forks its workers
and half after; pools of ordinary objects (``POOL_TYPES``) are made outside
any block before the fork, so that the workers inherit them and the driver
can free some later, leaving their addresses to new objects.  Each round
applies random in-place updates to the containers (``KINDS`` says how the
value an update writes was made; the op is a same-size replacement, an
addition or a removal of a key, a list item, an object array's element, an
attribute or a slot), then for each container:

- ``clamor.share(c)``: approved, or refused with a path from ``obj`` and a
  reason;
- the driver fingerprints ``c`` (one line per path and field, paths by key
  and attribute name, so that a differing line names the update that wrote
  there), and one stage of two tasks has the workers fingerprint it as
  reached three ways: captured by the task's closure (the Cluster's own
  check decides how it travels), through a region list built in a block
  this round (only if share() approved: read in place), and through a
  region list built with the container and shipped every round (its check
  is the Cluster's, remembered from earlier rounds).

In some rounds (``stage_first``) the stage runs before share() is called,
so that nothing but the Cluster's own check stands before the shipping.
Every line must agree; a failed stage (a worker that crashed: the Cluster
is made with ``max_attempts=1``) and a lost worker are failures too.  One
JSON line reports what ran, what share() said, and what differed.
"""
import contextlib
import hashlib
import itertools
import json
import os
import random
import time
import warnings

import numpy as np

import clamor


class Box:
    """Instances with a __dict__: region containers and values."""


class Slots:
    __slots__ = ("s0", "s1", "s2", "s3")


class PoolItem:
    """Instances of the pools (outside any block, before the fork), and
    instances made outside a block later."""

    def __init__(self, v):
        self.v = v


# How the value an update writes was made.
KINDS = {
    "heap": "built inside clamor.heap(), the container changed inside the block too",
    "heap_inst": "an instance (of a class with a __dict__, or with __slots__) built inside clamor.heap(), the "
                 "container changed inside the block",
    "heap_op_outside": "built inside clamor.heap(), the container changed outside any block (a size change "
                       "grows its table there)",
    "fresh": "built outside any block just now",
    "recycled": "built outside any block right after part of a pool was freed (addresses alive at the fork)",
    "pool_alive": "a pool object alive since the fork and never changed",
    "pool_mutated": "a pool object changed after the fork (before it was placed, or where it lies)",
}
HEAP_KINDS = ("heap", "heap_inst")          # what a clean container receives
SHAPES = ("dict_str", "dict_int", "list", "inst", "slots", "objarr", "nested")
POOL_TYPES = ("float", "bigint", "str", "tuple", "list", "dict", "ndarray", "inst")
VALUE_TYPES = POOL_TYPES[:-1]               # the values a container is built with
MUTABLE = ("list", "dict", "ndarray", "inst")
SLOTS = Slots.__slots__


# ---- values ----------------------------------------------------------------------

def make_value(r, vtype, tag):
    """A new object of ``vtype`` (where it lands is the caller's block, or
    none).  Pools use the same constructors, so a value made right after
    pool objects were freed takes their sizes and addresses."""
    if vtype == "float":
        return r.random() * 1000.0 + tag
    if vtype == "bigint":
        return (r.getrandbits(70) | 1 << 69) + tag
    if vtype == "str":
        return "s" + str(tag) + "-" + str(r.getrandbits(30))
    if vtype == "tuple":
        return (tag + 1000, "t" + str(tag))
    if vtype == "list":
        return [tag + 1000, r.random()]
    if vtype == "dict":
        return {"d" + str(tag): tag + 1000}
    if vtype == "ndarray":
        return np.arange(3.0) + tag
    return PoolItem(tag + 1000.5)


def make_instance(r, tag):
    """An instance built in a block: a Box with attribute names made there,
    or a Slots."""
    if r.random() < 0.5:
        o = Slots()
        for s in r.sample(SLOTS, r.randint(1, 4)):
            setattr(o, s, tag + 1000)
        return o
    o = Box()
    for i in range(r.randint(1, 3)):
        setattr(o, "zqb" + str((tag + i) % 5), r.random() + tag)
    return o


def make_pools(r, tags, n):
    """Outside any block, before the fork: n objects of each pool type."""
    return {vt: [make_value(r, vt, next(tags)) for _ in range(n)] for vt in POOL_TYPES}


def mutate_pool_object(r, o):
    """Change a pool object in place with values the workers have (small
    ints, a constant key); returns what was done."""
    if type(o) is list:
        if r.random() < 0.5:
            o.append(r.randint(0, 200))
            return "list.append"
        o[0] = r.randint(0, 200)
        return "list[0]="
    if type(o) is dict:
        if r.random() < 0.5:
            o["p"] = r.randint(0, 200)     # added the first time, replaced after
            return "dict['p']="
        o[next(iter(o))] = r.randint(0, 200)
        return "dict.update"
    if type(o) is np.ndarray:
        o[r.randrange(o.size)] = r.randint(0, 200)
        return "ndarray[i]="
    o.v = r.randint(0, 200)
    return "inst.v="


# ---- containers --------------------------------------------------------------------

def build_container(r, shape, tags):
    """A container of ``shape`` (call inside a block), the region dicts
    and lists inside it that updates may change too (nested), and its
    attribute names (inst)."""
    n = r.randint(3, 6)

    def val():
        return make_value(r, r.choice(VALUE_TYPES), next(tags))
    inner, names = [], []
    if shape == "dict_str":
        c = {"k" + str(i): val() for i in range(n)}
    elif shape == "dict_int":
        c = {1000 + 7 * i: val() for i in range(n)}
    elif shape == "list":
        c = [val() for _ in range(n)]
    elif shape == "inst":
        c = Box()
        for i in range(n):
            names.append("zqa" + str(i))
            setattr(c, names[-1], val())
    elif shape == "slots":
        c = Slots()
        for s in SLOTS[:r.randint(2, 4)]:
            setattr(c, s, val())
    elif shape == "objarr":
        c = np.empty(n, dtype=object)
        for i in range(n):
            c[i] = val()
    else:
        c = {}
        for i in range(2):
            lst = [{"h" + str(j): val() for j in range(2)} for _ in range(2)]
            c["g" + str(i)] = lst
            inner += [lst] + lst
    return c, inner, names


class Container:
    """A region container, what the driver knows of its layout (attribute
    names and set slots are tracked here: asking the object would make its
    instance dict outside the region), and the updates it received."""

    def __init__(self, name, shape, obj, inner, names, held, clean):
        self.name, self.shape, self.obj, self.inner, self.held, self.clean = name, shape, obj, inner, held, clean
        self.attrs = names
        self.slots = [s for s in SLOTS if hasattr(obj, s)] if shape == "slots" else None
        self.updates = []        # dicts: round, kind, op, path, parent, vtype, at_fork, freed_addr
        self.pooled = []         # (pool object, path steps): pool objects placed here

    def holders(self):
        """(path steps, holder) for each place an update can change."""
        out = [((), self.obj)]
        if self.shape == "nested":
            for k, lst in self.obj.items():
                if any(lst is x for x in self.inner) and type(lst) is list:
                    out.append(((("key", k),), lst))
                    for i, d in enumerate(lst):
                        if any(d is x for x in self.inner) and type(d) is dict:
                            out.append(((("key", k), ("idx", i)), d))
        return out


def resolve(obj, steps):
    """What lies at path ``steps`` in ``obj`` now (None if nothing)."""
    try:
        for what, k in steps:
            obj = getattr(obj, k) if what == "attr" else obj[k]
        return obj
    except (LookupError, AttributeError, TypeError):
        return None


def render(steps):
    """A path as the fingerprint writes it: obj['k'][2].attr.flat[3]."""
    out = "obj"
    for what, k in steps:
        out += f"[{k!r}]" if what in ("key", "idx") else f".{k}" if what == "attr" else f".flat[{k}]"
    return out


def plan_op(r, cont, steps, holder, kind, newkey):
    """Choose an op on ``holder``: a replacement (same size) about half of
    the time, else an addition or (for the heap kinds, whose block or none
    decides where a table shrinks) a removal.  Returns the op's name, the
    path steps it writes, and the function that does it with the value
    (None for a removal)."""
    remove_ok = kind in ("heap", "heap_op_outside")
    x = r.random()
    if type(holder) is dict:
        keys = list(holder)
        if keys and (x < 0.5 or not newkey):
            k = r.choice(keys)
            return "dict.replace", steps + (("key", k),), lambda v: holder.__setitem__(k, v)
        if remove_ok and len(keys) > 2 and x > 0.75:
            k = r.choice(keys)
            return "dict.remove", steps + (("key", k),), lambda v: holder.__delitem__(k)
        k = newkey(type(keys[0]) if keys else str)
        return "dict.add", steps + (("key", k),), lambda v: holder.__setitem__(k, v)
    if type(holder) is list:
        if holder and x < 0.5:
            i = r.randrange(len(holder))
            return "list.replace", steps + (("idx", i),), lambda v: holder.__setitem__(i, v)
        if remove_ok and len(holder) > 2 and x > 0.75:
            return "list.pop", steps + (("idx", len(holder) - 1),), lambda v: holder.pop()
        return "list.append", steps + (("idx", len(holder)),), holder.append
    if type(holder) is np.ndarray:
        i = r.randrange(holder.size)
        return "objarr.setitem", steps + (("flat", i),), lambda v: holder.__setitem__(i, v)
    if type(holder) is Slots:
        if remove_ok and len(cont.slots) > 2 and x > 0.75:
            s = r.choice(cont.slots)
            cont.slots.remove(s)
            return "slot.delete", steps + (("attr", s),), lambda v: delattr(holder, s)
        s = r.choice(SLOTS)
        if s not in cont.slots:
            cont.slots.append(s)
        return "slot.set", steps + (("attr", s),), lambda v: setattr(holder, s, v)
    attrs = cont.attrs
    if x < 0.5 or not newkey:
        a = r.choice(attrs)
        return "attr.replace", steps + (("attr", a),), lambda v: setattr(holder, a, v)
    if remove_ok and len(attrs) > 2 and x > 0.75:
        a = r.choice(attrs)
        attrs.remove(a)
        return "attr.delete", steps + (("attr", a),), lambda v: delattr(holder, a)
    a = newkey(str)
    attrs.append(a)
    return "attr.add", steps + (("attr", a),), lambda v: setattr(holder, a, v)


# ---- the fingerprint: runs on the driver and on the workers ----------------------

def _digest(b):
    return f"len={len(b)} sha={hashlib.sha1(b).hexdigest()[:16]}"


def _fp(o, path, out, stack, depth):
    t = type(o)
    out.append(f"{path}\ttype={t.__module__}.{t.__qualname__}")
    if o is None or t is bool:
        out.append(f"{path}\tvalue={o!r}")
        return
    if depth > 6 or len(out) > 3000 or id(o) in stack:   # garbage read on a worker must end
        out.append(f"{path}\tcut={depth}")
        return
    stack.add(id(o))
    try:
        _fields(o, t, path, out, stack, depth)
    except Exception as e:  # a worker that reads garbage can raise anywhere
        out.append(f"{path}\terror={type(e).__name__}: {str(e)[:100]}")
    finally:
        stack.discard(id(o))


def _fields(o, t, path, out, stack, depth):
    if t is int:
        out.append(f"{path}\tvalue={o:#x}")
    elif t is float:
        out.append(f"{path}\tvalue={o.hex()}")
    elif t is str:
        out.append(f"{path}\tvalue=len={len(o)} hash={hash(o)} text={o[:48]!r}")
    elif t in (list, tuple):
        out.append(f"{path}\tlen={len(o)}")
        for i in range(min(len(o), 64)):
            _fp(o[i], f"{path}[{i}]", out, stack, depth + 1)
    elif t is dict:
        out.append(f"{path}\tlen={len(o)}")
        missing = object()
        items = list(itertools.islice(o.items(), 64))
        out.append(f"{path}\tlookup={all(o.get(k, missing) is v for k, v in items)}")
        for k, v in items:
            _fp(v, f"{path}[{k!r}]", out, stack, depth + 1)
    elif t is np.ndarray:
        out.append(f"{path}\tshape={o.shape} dtype={o.dtype.str}")
        if o.dtype.hasobject:
            for i, x in enumerate(o.reshape(-1)[:64]):
                _fp(x, f"{path}.flat[{i}]", out, stack, depth + 1)
        else:
            out.append(f"{path}\tdata={_digest(o.tobytes()[:1 << 16])} head={o.reshape(-1)[:4].tolist()}")
    else:
        slots = getattr(t, "__slots__", ())
        d = getattr(o, "__dict__", None)
        if d is not None:
            # A copy by value of an instance of a __main__ class with
            # __slots__ is an instance of a class cloudpickle rebuilt without
            # slot descriptors: its slots are in a __dict__ (cloudpickle
            # 3.1.3).  They are compared as slots below.
            names = [k for k in itertools.islice(d, 64) if k not in slots]
            if names or not slots:
                out.append(f"{path}\tattrs={names}")
            for k in names:
                _fp(d[k], f"{path}.{k}", out, stack, depth + 1)
        for s in slots:
            if hasattr(o, s):
                _fp(getattr(o, s), f"{path}.{s}", out, stack, depth + 1)
            else:
                out.append(f"{path}\t{s}=<unset>")


def fingerprint(o):
    """One line per path and field: what a reader of ``o`` sees."""
    out = []
    _fp(o, "obj", out, set(), 0)
    return out


def task_of(c, held, fresh):
    """The stage's function: the container as captured, through the list
    built with it, and through this round's list (None: share() refused)."""
    return lambda _: (os.getpid(), fingerprint(c), fingerprint(held[0]),
                      None if fresh is None else fingerprint(fresh[0]))


# ---- the driver ------------------------------------------------------------------

def _alive_ids():
    """The addresses of the objects alive now (and what they refer to), as
    a sorted array (which the collector does not walk at every block): for
    the report only, to say which new values lie where an object the
    workers inherited lay."""
    import gc
    ids = set()
    for o in gc.get_objects():
        ids.add(id(o))
        ids.update(id(x) for x in gc.get_referents(o))
    return np.array(sorted(ids), dtype=np.uint64)


def _among(ids, addr):
    i = int(np.searchsorted(ids, np.uint64(addr)))
    return i < len(ids) and int(ids[i]) == addr


class Driver:
    def __init__(self, seed, kinds, rounds):
        self.r = random.Random(seed)
        self.seed, self.kinds, self.rounds = seed, kinds, rounds
        self.tags = itertools.count(1)
        counts = dict(cases=0, approved=0, refused=0, at_fork_address=0, mismatched=0, failed=0)
        self.rep = {"seed": seed, "rounds": rounds, "defined": list(kinds), "kinds": {k: dict(counts) for k in kinds},
                    "ops": {}, "clean": {"cases": 0, "approved": 0}, "recycled": {"made": 0, "at_freed": 0},
                    "refusals": {}, "errors": [], "mismatches": [], "mismatch_count": 0, "by": {},
                    "failed_stages": [], "compared": 0, "expected_compares": 0, "stages": 0,
                    "stage_first": 0, "workers_lost": 0}
        self.freed = set()         # ids of pool objects freed
        self.placed = set()        # ids of pool objects placed in containers (never freed)
        self.mutated = set()       # ids of pool objects changed after the fork
        self.at_fork = np.zeros(0, np.uint64)
        self.containers = []
        self.keys = {}             # tag: (int key, str key), made in a block (newkey)

    # -- building
    def build(self, phase, clean_names):
        """A container of each shape, in one block, with its held list."""
        with clamor.heap():
            built = [build_container(self.r, shape, self.tags) for shape in SHAPES]
            held = [[c] for c, _, _ in built]
        for shape, (c, inner, names), h in zip(SHAPES, built, held):
            name = f"{shape}.{phase}"
            self.containers.append(Container(name, shape, c, inner, names, h, name in clean_names))

    # -- updates
    def newkey(self, t):
        """A new key or attribute name, made in a block: what an update
        adds is its value, made as its kind says.  In the block of a heap
        kind's update, made there; else taken from keys made in one block
        for the next 128 tags (a block is two full collections: one per key
        was a fifth of a run)."""
        tag = next(self.tags)
        if clamor.heap.active():
            return 100000 + tag if t is int else "zqn" + str(tag)
        if tag not in self.keys:
            with clamor.heap():
                self.keys = {k: (100000 + k, "zqn" + str(k)) for k in range(tag, tag + 128)}
        return self.keys[tag][t is not int]

    def block(self):
        """A heap() block, or none if one is open: an inner block adds two
        full collections and nothing else here."""
        return contextlib.nullcontext() if clamor.heap.active() else clamor.heap()

    def free_some(self, vtype):
        """Free a few pool objects of ``vtype`` that nothing else holds."""
        pool = self.pools[vtype]
        free = [i for i, o in enumerate(pool) if id(o) not in self.placed and id(o) not in self.mutated]
        for i in sorted(self.r.sample(free, min(len(free), self.r.randint(2, 6))), reverse=True):
            self.freed.add(id(pool[i]))
            del pool[i]

    def pick_pool(self, to_mutate):
        """A pool object of a mutable type (to change), or one never changed."""
        choices = [o for vt in (MUTABLE if to_mutate else POOL_TYPES) for o in self.pools[vt]
                   if to_mutate or id(o) not in self.mutated]
        return self.r.choice(choices) if choices else None

    def update(self, cont, rnd, kind):
        """One update of ``kind`` on ``cont``; returns its record."""
        r = self.r
        steps, holder = r.choice(cont.holders())
        rec = {"round": rnd, "kind": kind, "vtype": None, "at_fork": False, "freed_addr": False}
        here = [(o, w) for o, w in cont.pooled if type(o) in (list, dict, np.ndarray, PoolItem)
                and resolve(cont.obj, w) is o]
        if kind == "pool_mutated" and here and r.random() < 0.4:
            obj, where = r.choice(here)              # change one where it lies
            rec.update(op="mutate_placed:" + mutate_pool_object(r, obj), path=render(where),
                       parent=render(where[:-1]), vtype=type(obj).__name__)
            self.mutated.add(id(obj))
            return rec
        newkey = self.newkey
        if kind in HEAP_KINDS:
            with self.block():
                op, where, do = plan_op(r, cont, steps, holder, kind, newkey)
                v = None if op.endswith(("remove", "pop", "delete")) else \
                    make_instance(r, next(self.tags)) if kind == "heap_inst" else \
                    make_value(r, r.choice(VALUE_TYPES), next(self.tags))
                do(v)
                rec["vtype"] = None if v is None else type(v).__name__
        else:
            op, where, do = plan_op(r, cont, steps, holder, kind, newkey)
            v = None
            if op.endswith(("remove", "pop", "delete")):
                pass
            elif kind == "heap_op_outside":
                with clamor.heap():
                    v = make_value(r, r.choice(VALUE_TYPES), next(self.tags))
            elif kind == "fresh":
                v = make_value(r, r.choice(POOL_TYPES), next(self.tags))
            elif kind == "recycled":
                vt = r.choice(POOL_TYPES)
                self.free_some(vt)
                v = make_value(r, vt, next(self.tags))
                self.rep["recycled"]["made"] += 1
                self.rep["recycled"]["at_freed"] += id(v) in self.freed
            else:
                v = self.pick_pool(kind == "pool_mutated")
                if v is None:
                    v = make_value(r, "float", next(self.tags))
                    rec["op_note"] = "pool exhausted: a fresh float"
                else:
                    if kind == "pool_mutated":
                        rec["mutation"] = mutate_pool_object(r, v)
                        self.mutated.add(id(v))
                    self.placed.add(id(v))
                    cont.pooled.append((v, where))
            do(v)
            if v is not None:
                rec["vtype"] = type(v).__name__
                rec["at_fork"] = _among(self.at_fork, id(v))
                rec["freed_addr"] = id(v) in self.freed
        rec.update(op=op, path=render(where), parent=render(where[:-1]))
        return rec

    # -- checking
    def share(self, cont):
        """clamor.share(c): None if it approved, else what it said (the
        refusal is recorded)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", clamor.ShareWarning)
                clamor.share(cont.obj)
            return None
        except clamor.NotShareable as e:
            msg = str(e)
            head = msg.split(" ", 1)
            if not (head[0].startswith("obj") and len(head) == 2 and len(head[1]) > 10):
                self.rep["errors"].append([cont.name, "refusal without a path and a reason", msg[:300]])
            # the reason without the path and addresses: "str" "is outside the region and ..."
            reason = " ".join(w for w in msg.split(" ", 1)[1].split(" ") if "0x" not in w)[:90]
            self.rep["refusals"].setdefault(reason, [0, msg[:220]])[0] += 1
            return msg
        except Exception as e:
            self.rep["errors"].append([cont.name, "share raised " + type(e).__name__, str(e)[:300]])
            return f"share raised {type(e).__name__}"

    def attribute(self, cont, line):
        """The latest update whose path is at or above the line's path, or
        whose container is the line's (a size change)."""
        path = line.split("\t", 1)[0]
        for u in reversed(cont.updates):
            p = u["path"]
            if path == p or (path.startswith(p) and path[len(p)] in "[.") or path == u["parent"]:
                return u
        return None

    def compare(self, cont, rnd, via, pid, drv, wrk, order, refusal):
        self.rep["compared"] += 1
        if drv == wrk:
            return
        diffs = [(a, b) for a, b in zip(drv, wrk) if a != b]
        n = min(len(drv), len(wrk))
        if len(drv) != len(wrk):     # the first line one side has past the other's end
            diffs.append((drv[n] if len(drv) > n else f"(end: {n} lines)",
                          wrk[n] if len(wrk) > n else f"(end: {n} lines)"))
        u = self.attribute(cont, diffs[0][0] if diffs[0][0][0] != "(" else diffs[0][1])
        kind = u["kind"] if u else "unattributed"
        key = f"{kind} | {u['op'] if u else '-'} | {via}"
        self.rep["by"][key] = self.rep["by"].get(key, 0) + 1
        if kind in self.rep["kinds"]:
            self.rep["kinds"][kind]["mismatched"] += 1
        self.rep["mismatch_count"] += 1
        first = [[x[:200], y[:200]] for x, y in diffs[:3]]
        for m in self.rep["mismatches"]:     # the same reading by another way or worker
            if (m["container"], m["round"], m["first"]) == (cont.name, rnd, first):
                m["vias"].append(f"{via} (worker {pid})")
                return
        if len(self.rep["mismatches"]) < 16:
            self.rep["mismatches"].append({
                "container": cont.name, "round": rnd, "vias": [f"{via} (worker {pid})"], "order": order,
                "kind": kind, "share": "approved" if refusal is None else "refused: " + refusal[:160],
                "update": u, "first": first,
                "this_round": [f"{x['kind']} {x['op']} {x['path']}" for x in cont.updates if x["round"] == rnd]})

    def check(self, cl, cont, rnd, order, refusal, fresh):
        """The driver's fingerprint and one stage (then share(), if it did
        not run before: ``order``); compare."""
        self.rep["stage_first"] += order == "stage_first"
        drv_early = fingerprint(cont.obj) if order == "share_first" else None
        lost = cl.stats()["recovery"]["workers_lost"]
        self.rep["stages"] += 1
        err = None
        try:
            res = cl.parallelize(range(2), 2).map(task_of(cont.obj, cont.held, fresh)).collect()
        except Exception as e:
            err, res = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}", []
        gone = cl.stats()["recovery"]["workers_lost"] - lost
        self.rep["workers_lost"] += gone
        if order == "stage_first":
            refusal = self.share(cont)
        ok = refusal is None
        drv = drv_early or fingerprint(cont.obj)
        now = [u for u in cont.updates if u["round"] == rnd]
        for u in now:
            k = self.rep["kinds"][u["kind"]]
            k["cases"] += 1
            k["approved" if ok else "refused"] += 1
            k["at_fork_address"] += u["at_fork"]
            if cont.clean:
                self.rep["clean"]["cases"] += 1
                self.rep["clean"]["approved"] += ok
        if err or gone:
            for kind in {u["kind"] for u in now}:
                self.rep["kinds"][kind]["failed"] += 1
            self.rep["failed_stages"].append({
                "container": cont.name, "round": rnd, "order": order, "error": err or f"{gone} worker(s) lost",
                "approved": ok, "this_round": [f"{u['kind']} {u['op']} {u['path']} ({u['vtype']}"
                                               f"{', at a freed address' if u['freed_addr'] else ''}"
                                               f"{', at an address alive at the fork' if u['at_fork'] else ''})"
                                               for u in now]})
        self.rep["expected_compares"] += 2 * (2 + (fresh is not None))
        for pid, captured, held, inplace in res:
            self.compare(cont, rnd, "captured", pid, drv, captured, order, refusal)
            self.compare(cont, rnd, "held", pid, drv, held, order, refusal)
            if fresh is not None:
                self.compare(cont, rnd, "in place", pid, drv, inplace, order, refusal)

    def round(self, cl, rnd):
        r = self.r
        for cont in self.containers:
            kinds = [k for k in self.kinds if k in HEAP_KINDS] if cont.clean else self.kinds
            # Updates of the heap kinds in a row share one block (each
            # writes only what the block built); any other kind is made
            # and written outside.
            recs, blk = [None] * 3, None
            try:
                for i in range(r.randint(1, 3)):
                    if not kinds:
                        break
                    kind = r.choice(kinds)
                    if kind in HEAP_KINDS and blk is None:
                        blk = clamor.heap()
                        blk.__enter__()
                    elif kind not in HEAP_KINDS and blk is not None:
                        blk, b = None, blk
                        b.__exit__(None, None, None)
                    recs[i] = self.update(cont, rnd, kind)
            finally:
                if blk is not None:
                    blk.__exit__(None, None, None)
            for rec in recs:
                if rec is not None:
                    cont.updates.append(rec)
                    op = f"{rec['kind']} {rec['op']}"
                    self.rep["ops"][op] = self.rep["ops"].get(op, 0) + 1
        # share() before the stage for most containers, after it for the
        # others; the region lists of those it approved, in one block (kept
        # until the round ends: no list's address is reused within it).
        orders = ["stage_first" if r.random() < 0.3 else "share_first" for _ in self.containers]
        refusals = [self.share(c) if o == "share_first" else None for c, o in zip(self.containers, orders)]
        approved = [c for c, o, x in zip(self.containers, orders, refusals) if o == "share_first" and x is None]
        with clamor.heap():
            lists = [[c.obj] for c in approved]
        fresh = {id(c): x for c, x in zip(approved, lists)}
        for cont, order, refusal in zip(self.containers, orders, refusals):
            self.check(cl, cont, rnd, order, refusal, fresh.get(id(cont)))

    def run(self):
        r = self.r
        names = [f"{s}.{p}" for s in SHAPES for p in ("pre", "post")]
        clean = set(r.sample(names, 4)) if any(k not in HEAP_KINDS for k in self.kinds) else set(names)
        self.build("pre", clean)                       # before the fork: the workers map or fetch them
        self.pools = make_pools(r, self.tags, 40)      # outside any block, inherited
        self.at_fork = _alive_ids()
        opts = dict(workers=2, progress=False, max_attempts=1, speculation=False)
        with clamor.Cluster(**opts) as cl:
            cl.parallelize(range(2), 2).map(lambda _: os.getpid()).collect()    # the workers exist
            self.build("post", clean)
            for rnd in range(self.rounds):
                self.round(cl, rnd)
            self.rep["recovery"] = cl.stats()["recovery"]
        self.rep["clean_containers"] = sorted(clean)
        return self.rep


def main(seed, kinds=tuple(KINDS), rounds=8):
    """Run ``rounds`` rounds of updates of ``kinds`` with ``seed``; print the
    report as one JSON line."""
    t0 = time.monotonic()
    rep = Driver(seed, list(kinds), rounds).run()
    ks = rep["kinds"].values()
    rep.update(cases=sum(k["cases"] for k in ks), approved=sum(k["approved"] for k in ks),
               refused=sum(k["refused"] for k in ks), seconds=round(time.monotonic() - t0, 1))
    print(json.dumps(rep, default=repr))
