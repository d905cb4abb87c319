"""Streaming updates: clamor's page invalidation against Spark re-broadcast,
Dask re-scatter, Ray re-put and a pickled re-broadcast (Fig. 9), and
clamor's same-host mapping against shared memory and Ray.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"streaming.py".
"""
import os
import pickle
import socket
import statistics
import sys
import time

import numpy as np

import _harness
from _common import Spawned, die_with_parent, same_host_modes, zipf_ranks
from _harness import json_line, med, parser

FIB = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: Fibonacci hashing
EMPTY = 0                            # keys are >= 1


# ---- the hash table (pure numpy; runs in the driver and in both kinds of worker) ----

def slot_hash(keys, bits):
    """Home slot of each key: the top ``bits`` bits of key * FIB (mod 2^64)."""
    return ((keys.astype(np.uint64) * FIB) >> np.uint64(64 - bits)).astype(np.int64)


def build(table, keys, vals, bits):
    """Insert every (key, value) into ``table`` (slots x 2, all EMPTY) by
    linear probing, vectorised: each pass, keys whose probe slot is free
    scatter into it; one of each clash wins (the last write) and the rest
    move on one slot.  Returns the slot of each key."""
    mask = (1 << bits) - 1
    tk = table[:, 0]
    slot_of = np.empty(len(keys), dtype=np.int64)
    pending = np.arange(len(keys), dtype=np.int64)
    pos = slot_hash(keys, bits)
    while pending.size:
        free = tk[pos] == EMPTY
        cand, cpos = pending[free], pos[free]
        tk[cpos] = keys[cand]
        won = tk[cpos] == keys[cand]
        wk, wpos = cand[won], cpos[won]
        table[wpos, 1] = vals[wk]
        slot_of[wk] = wpos
        placed = np.zeros(len(pending), dtype=bool)
        placed[np.flatnonzero(free)[won]] = True
        pending, pos = pending[~placed], (pos[~placed] + 1) & mask
    return slot_of


def lookup(table, q, bits):
    """Values of keys ``q`` (0 for a key that is absent)."""
    mask = (1 << bits) - 1
    out = np.zeros(len(q), dtype=np.int64)
    idx = np.arange(len(q), dtype=np.int64)
    pos = slot_hash(q, bits)
    while idx.size:
        k = table[pos, 0]
        hit = k == q[idx]
        out[idx[hit]] = table[pos[hit], 1]
        go = ~hit & (k != EMPTY)
        idx, pos = idx[go], (pos[go] + 1) & mask
    return out


def proc_id():
    """This process, told apart from every other on the machine: a worker
    on a namespace host has a PID namespace of its own, where its pid may
    be another host's worker's too."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}:{os.getpid()}"


def answer(table, q, bits):
    """What a worker sends back for its share ``q``: (checksum, keys found,
    value of its last key, which is the key updated last)."""
    v = lookup(table, q, bits)
    return int(v.sum()), int(np.count_nonzero(v)), int(v[-1])


def peer_task(table, q, bits, pause=0.0):
    """What a Spark, Dask or Ray worker runs: (answer() over the table its
    system hands it, the worker's pid)."""
    if pause:
        time.sleep(pause)   # warm-up: keep every worker busy at once
    return answer(table, q, bits), proc_id()


class Workload:
    """The table's keys and values and the rounds, drawn from ``seed`` (the
    same in every process that draws them).  ``keys[i]`` is rank i (0 the
    hottest); ``plan[r]`` = (the key updated before round r, its new value,
    each worker's ranks, which end with the key updated last).
    ``build(table)`` fills a zeroed (slots, 2) int64 table, ``begin(r)``
    makes round r's update, ``restore()`` puts table and values back as
    built."""

    def __init__(self, bits, load, rounds, workers, lookups, zipf, hot, seed):
        rng = np.random.default_rng(seed)
        self.bits, self.rounds, self.workers = bits, rounds, workers
        self.slots = 1 << bits
        keys = np.sort(rng.integers(1, 1 << 62, size=int(self.slots * load), dtype=np.int64))
        keys = keys[np.append(True, keys[1:] != keys[:-1])]   # distinct (np.unique is far slower here)
        rng.shuffle(keys)
        self.keys = keys
        self.n = n = len(keys)
        self.vals = rng.integers(1, 1 << 40, size=n, dtype=np.int64)
        self.vals0 = self.vals.copy()
        self.plan = []
        for r in range(rounds):
            upd = newv = None
            if r:
                upd = int(rng.integers(0, min(hot, n)))
                newv = int(rng.integers(1, 1 << 40))
            last = upd if upd is not None else 0
            self.plan.append((upd, newv, [np.append(zipf_ranks(rng, zipf, n, lookups), last)
                                          for _ in range(workers)]))
        self.updated = np.array(sorted({u for u, _, _ in self.plan if u is not None}), dtype=np.int64)
        self.table = self.slot_of = None

    def build(self, table):
        self.table = table
        self.slot_of = build(table, self.keys, self.vals, self.bits)
        return table

    def begin(self, r):
        """Round r's update, in place; its shares, and the driver's own
        answers from its key -> value arrays (not the table)."""
        upd, newv, picks = self.plan[r]
        if upd is not None:
            self.vals[upd] = newv
            self.table[self.slot_of[upd], 1] = newv
        return [self.keys[i] for i in picks], [(int(self.vals[i].sum()), len(i), int(self.vals[i[-1]]))
                                               for i in picks]

    def restore(self):
        """The table and the values as built."""
        u = self.updated
        self.vals[u] = self.vals0[u]
        self.table[self.slot_of[u], 1] = self.vals0[u]


# ---- broadcast workers ----------------------------------------------------------------

def broadcast_worker(conn):
    """Each round: (mode, pickle metadata, nbytes, queries, bits), then the
    table's bytes; reply answer().  Mode "pickle" gets pickle.dumps(table)
    and unpickles it into new memory; mode "zero-copy" receives the raw
    buffer straight into one bytearray kept across rounds (pickle protocol
    5, out of band), the best a re-broadcast can do."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))   # the same socketpair, for recv_into
    table = buf = None
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                return
            mode, meta, nbytes, q, bits = msg
            if mode == "pickle":
                table = None                              # drop last round's copy first
                blob = conn.recv_bytes()
                table = pickle.loads(blob)
                del blob
            else:
                if buf is None or len(buf) != nbytes:
                    table = buf = None
                    buf = bytearray(nbytes)
                view, got = memoryview(buf), 0
                while got < nbytes:
                    k = sock.recv_into(view[got:])
                    if not k:
                        return
                    got += k
                table = pickle.loads(meta, buffers=[view])
            conn.send(answer(table, q, bits))
    except (EOFError, OSError, KeyboardInterrupt):   # the driver is gone
        return
    finally:
        sock.close()


class Broadcast(Spawned):
    """``n`` spawned processes that get the whole table every round, over a
    socketpair each (multiprocessing.Pipe), all sends at once."""

    MODES = ("pickle", "zero-copy")

    def __init__(self, n):
        self.socks = []   # the same socketpairs, for sendall of the raw buffer
        super().__init__(n, broadcast_worker)
        try:
            for a in self.conns:
                self.socks.append(socket.socket(fileno=os.dup(a.fileno())))
        except BaseException:
            self.close()
            raise

    def round(self, mode, table, shares, bits):
        """Ship the table to every worker and run one share on each;
        returns (answers, table bytes sent)."""
        if mode == "pickle":
            blob = pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL)

            def one(i):
                self.conns[i].send((mode, None, len(blob), shares[i], bits))
                self.conns[i].send_bytes(blob)
                return self.conns[i].recv()
            size = len(blob)
        else:
            bufs = []
            meta = pickle.dumps(table, protocol=5, buffer_callback=bufs.append)
            (raw,) = [b.raw() for b in bufs]            # the region's own bytes, no copy

            def one(i):
                self.conns[i].send((mode, meta, raw.nbytes, shares[i], bits))
                self.socks[i].sendall(raw)
                return self.conns[i].recv()
            size = len(meta) + raw.nbytes
        answers = self.map(one)
        return answers, size * len(self.conns)

    def close(self):
        super().close()
        for s in self.socks:
            s.close()


# ---- the shared-memory baseline ----------------------------------------------------------

TINY_BITS = 16   # the warm-up table: 2^16 slots = 1 MiB, not the region's


def tiny_table(seed=0):
    """(table, keys) of a small hash table in plain memory, for warm-up tasks."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(1, 1 << 62, size=1 << (TINY_BITS - 1), dtype=np.int64))
    table = np.zeros((1 << TINY_BITS, 2), dtype=np.int64)
    build(table, keys, keys, TINY_BITS)
    return table, keys[:1000]


def shm_worker(conn):
    """Each round: (block name, shape, queries, bits): attach the
    SharedMemory block by name, look the queries up in place (no copy),
    reply answer(), then detach (after the reply: the time counts attaching
    and the lookups)."""
    from multiprocessing import shared_memory

    try:
        while True:
            msg = conn.recv()
            if msg is None:
                return
            name, shape, q, bits = msg
            shm = shared_memory.SharedMemory(name=name)
            try:
                table = np.ndarray(shape, dtype=np.int64, buffer=shm.buf)
                conn.send(answer(table, q, bits))
            finally:
                table = None
                shm.close()
    except (EOFError, OSError, KeyboardInterrupt):   # the driver is gone
        return


class ShmWorkers(Spawned):
    """``n`` spawned processes that read a table in a SharedMemory block."""

    def __init__(self, n):
        super().__init__(n, shm_worker)

    def round(self, name, shape, shares, bits):
        """Each process attaches block ``name`` and runs one share; the answers."""
        def one(i):
            self.conns[i].send((name, shape, shares[i], bits))
            return self.conns[i].recv()
        return self.map(one)


# ---- the peers: Spark, Dask and Ray, each in a subprocess (--run SYSTEM) ------------------

PEERS = ("spark", "dask", "ray")


class WrongAnswer(RuntimeError):
    """A peer's answers differ from the driver's: the comparison is void."""


def start(system, workers, hosts=None, **conf):
    """``system`` through the harness with ``workers`` workers (one per host
    of ``hosts``): clamor's ``conf`` its Cluster's keywords, Spark's
    executor_mb and driver_memory; no progress bars (display only)."""
    return _harness.start(system, workers, hosts, app="streaming", spark_conf={"spark.ui.showConsoleProgress": "false"},
                          progress=False, **conf)


# ---- the rounds ----------------------------------------------------------------------------

def run_rounds(wl, name, publish, lookups, retire):
    """Every round of ``wl``: its update, then publish(table) -> h,
    lookups(h, shares) -> [(answer, pid)] in share order, retire(h).
    Returns {"times", "phases" (publish, lookups, release), "answers",
    "workers_used"} per round and "worker_processes_seen" over them all."""
    out = {"times": [], "phases": [], "answers": [], "workers_used": []}
    seen = set()
    for r in range(wl.rounds):
        shares, expect = wl.begin(r)
        t0 = time.perf_counter()
        h = publish(wl.table)
        t1 = time.perf_counter()
        res = lookups(h, shares)
        t2 = time.perf_counter()
        retire(h)
        h = None   # Ray frees an object when its last reference goes
        t3 = time.perf_counter()
        got = [tuple(a) for a, _ in res]
        if got != expect:
            raise WrongAnswer(f"{name}, round {r}: answers {got}, the driver's {expect}")
        used = len({pid for _, pid in res})
        seen |= {pid for _, pid in res}
        out["times"].append(t3 - t0)
        out["phases"].append((t1 - t0, t2 - t1, t3 - t2))
        out["answers"].append(got)
        out["workers_used"].append(used)
        print(f"  {name:>5} round {r}: {t3 - t0:8.4f} s (publish {t1 - t0:.4f}, lookups {t2 - t1:.4f}, "
              f"release {t3 - t2:.4f}); {used} worker processes", flush=True)
    out["worker_processes_seen"] = len(seen)   # more than W: a system started new ones between rounds
    return out


def run_peer(system, wl, conf, hosts=None):
    """``system``'s rounds over ``wl``, the table re-sent every round its
    users' way (``_harness.shared``), after a warm-up task on every worker."""
    W = wl.workers
    tiny, tkeys = tiny_table()
    with start(system, W, hosts, **conf) as h:
        publish, tasks, retire = _harness.shared(system, h)
        pids = _harness.ray_wait_workers(h, W) if system == "ray" else ()
        t = publish(tiny)   # Ray: 1 MiB, in the object store, not inlined
        got = tasks(peer_task, t, [tkeys] * W, TINY_BITS, 0.3)
        if [tuple(a) for a, _ in got] != [answer(tiny, tkeys, TINY_BITS)] * W:
            raise WrongAnswer(f"{system}: the warm-up answers are wrong")
        retire(t)
        del t
        line, facts = _harness.peer_facts(system, h, pids)
        print(f"  {line}; {len({pid for _, pid in got})} ran the warm-up", flush=True)
        links = _harness.Links(hosts)
        out = run_rounds(wl, system, publish, lambda t, shares: tasks(peer_task, t, shares, wl.bits), retire)
        out.update(facts, link_bytes=links.bytes())
    # one host: the pickled table to each Spark executor or Dask worker, a lower bound, and one
    # copy into Ray's object store, read in place by its workers; namespace hosts: what crossed the links
    copies = 1 if system == "ray" else W
    out["bytes"] = out["link_bytes"] if hosts is not None else wl.table.nbytes * copies * wl.rounds
    return out


def peer_child(system, wl, conf, out, rate=None):
    """``--run SYSTEM``: ``system`` over ``wl`` (its table built, in plain
    memory); its figures to ``out``, or why it has none ("wrong": answers
    that differ from the driver's)."""
    def run():
        with _harness.hosts_for(wl.workers, rate) as hosts:
            return run_peer(system, wl, conf, hosts)

    return _harness.child_result(system, out, run, {WrongAnswer: "wrong"})


def run_peers(systems, cmd, timeout):
    """Each of ``systems`` in a subprocess ``cmd + ["--run", system, "--out",
    file]``, one after another; {system: its result}."""
    def loaded(s, r, out):
        r["answers"] = [[tuple(a) for a in rnd] for rnd in r["answers"]]

    def checked(s, r):
        if r.get("wrong"):
            raise SystemExit(f"streaming: {r['wrong']}: the comparison is void")
        if "times" in r:
            rest = r["times"][1:]
            print(f"  {s}: {sum(rest) / len(rest):.4f} s a round after the first (first {r['times'][0]:.4f} s); "
                  f"{r['wall_s']:.0f} s with start-up", flush=True)

    return _harness.run_systems(systems, cmd, None, timeout, load=loaded, check=checked,
                                heading=": the table re-sent every round")


# ---- the Ray baseline ------------------------------------------------------------------

def ray_helper(conn, workers):
    """Ray's driver, a plain spawned process (Ray's threads and processes
    stay out of the region's driver): says whether ``import ray`` works
    (its version, or None), then replies ("ok", RayRounds's answer) or
    ("error", text) to each (method, *args)."""
    die_with_parent()
    _harness.subreaper()
    try:
        import ray
    except ImportError:
        ray = None
    rounds = RayRounds(ray, workers)
    try:
        conn.send(ray.__version__ if ray else None)
        while (msg := conn.recv()) is not None:
            try:
                conn.send(("ok", getattr(rounds, msg[0])(*msg[1:])))
            except Exception as err:   # Ray is there but failed: the driver stops and says why
                import traceback

                conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    except (EOFError, OSError, KeyboardInterrupt):   # the driver is gone
        return
    finally:
        rounds.stop()
        _harness.reap_descendants()


class RayRounds:
    """The cold first rounds on Ray, in ray_helper's process."""

    def __init__(self, ray, workers):
        self.ray, self.workers, self.session = ray, workers, None

    def start(self, name, shape, shares, bits):
        """Ray (``start``), a warm-up task on each worker through the object
        store, and a private copy of the table from the SharedMemory block
        ``name``; none of it timed: returns its seconds."""
        import contextlib
        from multiprocessing import shared_memory

        ray, t = self.ray, time.perf_counter()
        self.shares, self.bits = shares, bits
        self.session = contextlib.ExitStack()
        self.session.enter_context(start("ray", self.workers))
        # this script is __mp_main__ here, which Ray's workers cannot import: send its functions by value
        ray.cloudpickle.register_pickle_by_value(sys.modules[peer_task.__module__])
        self.look = ray.remote(peer_task)
        tiny, tkeys = tiny_table()
        ref = ray.put(tiny)   # 1 MiB: in the object store, not inlined
        ray.get([self.look.remote(ref, tkeys, TINY_BITS, 0.3) for _ in range(self.workers)])
        del ref
        shm = shared_memory.SharedMemory(name=name)
        self.table = np.ndarray(shape, dtype=np.int64, buffer=shm.buf).copy()
        shm.close()
        return time.perf_counter() - t

    def round(self):
        """ray.put of the table and one task per share: (answers, the put's
        seconds, the round's seconds, worker processes that ran the tasks)."""
        t = time.perf_counter()
        ref = self.ray.put(self.table)
        put_s = time.perf_counter() - t
        out = self.ray.get([self.look.remote(ref, q, self.bits) for q in self.shares])
        took = time.perf_counter() - t
        del ref
        return [a for a, _ in out], put_s, took, len({pid for _, pid in out})

    def stop(self):
        if self.session is not None:
            self.session.close()   # ray.shutdown()
            self.session = None
        return True


class RayHelper(Spawned):
    """One spawned process that drives Ray with ``workers`` CPUs (or says
    that Ray is not installed: ``version`` None)."""

    def __init__(self, workers, enabled=True):
        self.version = None
        if not enabled:
            self.procs, self.conns, self.pool = [], [], None
            return
        super().__init__(1, ray_helper, workers)
        self.version = self.conns[0].recv()

    def call(self, *msg):
        self.conns[0].send(msg)
        status, out = self.conns[0].recv()
        if status != "ok":
            raise SystemExit(f"streaming: Ray failed:\n{out}")
        return out

    def close(self):
        if self.pool is not None:
            super().close()


# ---- the driver -----------------------------------------------------------------------

def mib(n):
    return f"{n / (1 << 20):9.2f} MiB"


def lookup_pages(table, keys, slot_of, bits, psize):
    """Page indices (address // psize) that looking ``keys`` up reads: the
    page of each key's home slot and of the slot that holds it (a probe
    chain is far shorter than a page, so nothing lies between)."""
    at = table.ctypes.data
    home = (at + slot_hash(keys, bits) * table.strides[0]) // psize
    return np.union1d(home, (at + slot_of * table.strides[0]) // psize)


def fetch_ratio(fetched, pids, pages, psize):
    """Bytes fetched / bytes of the pages the lookups touched, each worker
    process counted once per page (the union of its shares' pages)."""
    per = {}
    for pid, pg in zip(pids, pages):
        per[pid] = np.union1d(per.get(pid, pg[:0]), pg)
    touched = sum(len(v) for v in per.values()) * psize
    return fetched / touched if touched else None, touched


def check(where, table, bits, answers, expect, shares):
    """Every system's answers ({who: answers}) against the driver's
    ``expect`` and against the same lookups run here, single-process."""
    for who, ans in {"single process": [answer(table, q, bits) for q in shares], **answers}.items():
        if [tuple(a) for a in ans] != [tuple(a) for a in expect]:
            raise SystemExit(f"streaming: {where}: {who} disagrees with the driver\n  driver {expect}\n  {who} {ans}")


def fetched_bytes(st):
    """The table bytes a stage's workers fetched, from the driver and from peers."""
    return st["bytes_from_driver"] + st["bytes_from_peers"]


def clamor_round(cl, table, bits, shares):
    """One stage of lookups, a task a share: (seconds, answers, pids,
    invalidation counters, its stage stats)."""
    def task(part):
        import clamor

        st = clamor.stats()
        return [(answer(table, part, bits), proc_id(), st["pages_invalidated"])]

    t = time.perf_counter()
    out = cl.parallelize(np.concatenate(shares), partitions=len(shares)).map_partitions(task).collect()
    took = time.perf_counter() - t
    return took, [a for a, _, _ in out], [p for _, p, _ in out], [v for _, _, v in out], cl.stage_stats()[-1]


def tiny_stage(cl, workers, tiny, tkeys, pause=0.0):
    """After ``pause`` s, a task a worker over the tiny table in plain
    memory, reading no region page: the warm-up, or (after a pause) what
    lets read-ahead still on the wire land and be counted.  Its bytes
    from the driver and peers; stops on a wrong answer."""
    time.sleep(pause)
    want = answer(tiny, tkeys, TINY_BITS)
    got = cl.parallelize(list(range(workers)), partitions=workers).map_partitions(
        lambda part: [answer(tiny, tkeys, TINY_BITS)]).collect()
    if got != [want] * workers:
        raise SystemExit("streaming: the warm-up answer is wrong")
    return fetched_bytes(cl.stage_stats()[-1])


def system_figures(figures, common, peers, left_out=None):
    """Every system's figures in bench/figures.py's shape into ``figures``:
    ``common`` {system: (seconds per round, bytes moved)} and each peer that
    ran, with clamor's speedup over it; a peer that did not: null, and why."""
    ran = {who: p for who, p in peers.items() if "times" in p}
    cl_med = statistics.median(common["clamor"][0][1:])
    for who, (times, nbytes) in {**common, **{who: (p["times"], p["bytes"]) for who, p in ran.items()}}.items():
        figures.update({f"{who}_iter_s": statistics.median(times[1:]), f"{who}_times_s": times,
                        f"{who}_bytes": int(nbytes)})
    for who in PEERS:
        figures[f"speedup_vs_{who}"] = figures[f"{who}_iter_s"] / cl_med if who in ran else None
        if who not in ran:
            figures.update({f"{who}_iter_s": None, f"{who}_bytes": None,
                            f"{who}_missing": _harness.missing(who, peers.get(who), left_out)})
    figures.update(peer_versions={who: p.get("version") for who, p in ran.items()},
                   peer_wall_s={who: p["wall_s"] for who, p in peers.items()})


def on_hosts(args, wl, peers, spark_conf):
    """``--netns``: clamor's rounds with one remote worker per namespace
    host (they fetch: no worker shares the driver's host), against the
    peers' rounds on hosts of their own; every answer checked against the
    driver's values and the peers'.  Bytes: what crossed the links."""
    import clamor

    W, rounds = wl.workers, wl.rounds
    tiny, tiny_keys = tiny_table()
    with _harness.hosts_for(W, args.rate) as hosts, \
            start("clamor", W, hosts, page_size=args.page_size) as cl:
        table = wl.build(clamor.zeros((wl.slots, 2), dtype=np.int64))
        bits = wl.bits
        tiny_stage(cl, W, tiny, tiny_keys)
        psize = clamor.region.page_size()
        pages0 = [lookup_pages(table, wl.keys[i], wl.slot_of[i], bits, psize) for i in wl.plan[0][2]]
        print(f"streaming on {W} namespace hosts, links {args.rate}: {mib(table.nbytes).strip()} table, "
              f"{wl.n} keys; clamor's workers fetch", flush=True)
        links = _harness.Links(hosts)
        times, moved, wire = [], [], []
        ran = {who: p for who, p in peers.items() if "times" in p}
        for r in range(rounds):
            shares, expect = wl.begin(r)
            copies = cl.stats()["recovery"]["speculative_copies"]
            took, got, pids, _, st = clamor_round(cl, table, bits, shares)
            times.append(took)
            moved.append(fetched_bytes(st))
            wire.append(st["wire_bytes"])
            if r == 0:   # untimed: round 0's late read-ahead, then its bytes against the pages it touched
                ratio0, touched0 = fetch_ratio(moved[-1] + tiny_stage(cl, W, tiny, tiny_keys, 0.3), pids, pages0,
                                               psize)
                # (a speculative copy of a slow task reads its share's pages on another worker too)
                copies0 = cl.stats()["recovery"]["speculative_copies"] - copies
            check(f"round {r}", table, bits, {"clamor": got, **{w: p["answers"][r] for w, p in ran.items()}},
                  expect, shares)
            print(f"{r:>5} | clamor {times[-1]:.4f}s {mib(moved[-1])} | "
                  + " ".join(f"{who} {p['times'][r]:.4f}s" for who, p in ran.items()), flush=True)
        link = links.bytes()
    cl_med = statistics.median(times[1:])
    figures = {"bench": "streaming", "clamor_round_s": cl_med}
    system_figures(figures, {"clamor": (times, link)}, peers)
    print(f"round 0: clamor fetched {ratio0:.3f}x the bytes of the pages its lookups touched "
          f"({mib(touched0).strip()}); {copies0} speculative copies of its tasks ran", flush=True)
    figures.update({"time_unit": "s per round", "hosts": W, "rate": args.rate,
                    "round0_fetch_ratio": ratio0, "round0_touched_bytes": touched0,
                    "round0_speculative_copies": copies0,
                    "clamor_bytes_per_round": moved, "clamor_wire_bytes_per_round": wire,
                    "spark_executor_mb": spark_conf["executor_mb"], "spark_driver_memory": spark_conf["driver_memory"],
                    "table_bytes": int(table.nbytes), "keys": wl.n, "rounds": rounds, "workers": W,
                    "lookups_per_worker": args.lookups, "zipf_a": args.zipf, "verified": True})
    for who in ran:
        print(f"{who}: median over rounds 1..{rounds - 1} {figures[who + '_iter_s']:.4f}s, "
              f"{figures['speedup_vs_' + who]:.1f}x clamor's ({cl_med:.4f}s)", flush=True)
    json_line(figures, "streaming-netns" + ("-quick" if args.quick else ""))
    return 0


def versus_broadcast(args, wl, table, peers, bc):
    """Part 1: clamor (map mode) against the broadcast, round by round,
    every answer checked against the peers' too.  Returns (the rows,
    clamor's stats after them, map mode's workers, the page size)."""
    import clamor

    bits, W = wl.bits, wl.workers
    rows = []
    with start("clamor", W, page_size=args.page_size, same_host="map") as cl:
        psize = clamor.region.page_size()
        map_modes = same_host_modes(cl, "map", "streaming", W)
        print(f"clamor page size {psize} bytes; table = {table.nbytes // psize} pages; clamor workers map the "
              f"driver's pages (same_host='map'); broadcast over a socketpair per worker: 'pickle' = "
              f"pickle.dumps/loads of the table, 'zero-copy' = its raw buffer into a kept bytearray", flush=True)
        print(f"{'round':>5} | {'clamor s':>9} {'bytes':>13} {'mapped':>13} {'faults':>6} {'changed':>7} "
              f"{'inval':>5} {'task s':>7} | {'pickle s':>9} {'zero-copy s':>11} {'bytes':>13} | {'speedup':>7} "
              f"{'vs 0-copy':>9}", flush=True)
        inval_seen = {}     # worker pid -> pages_invalidated so far
        for r in range(wl.rounds):
            logged = cl.stats()["driver"]
            shares, expect = wl.begin(r)
            took, got, pids, invs, st = clamor_round(cl, table, bits, shares)
            row = {"clamor_s": took}
            after = cl.stats()["driver"]
            inval = 0
            for pid, n_inv in zip(pids, invs):   # counters are cumulative per worker
                inval += n_inv - inval_seen.get(pid, n_inv if r == 0 else 0)
                inval_seen[pid] = n_inv
            answers = {"clamor": got}
            answers.update({who: p["answers"][r] for who, p in peers.items() if "times" in p})
            for mode in Broadcast.MODES:
                t = time.perf_counter()
                answers[mode], sent = bc.round(mode, table, shares, bits)
                row[mode + "_s"] = time.perf_counter() - t
                row[mode + "_bytes"] = sent
            check(f"round {r}", table, bits, answers, expect, shares)
            row.update(clamor_bytes=fetched_bytes(st), mapped=st["bytes_mapped"], faults=st["faults"],
                       changed=(after["pages_logged"] - logged["pages_logged"])
                       - (after["pages_unchanged"] - logged["pages_unchanged"]),
                       invalidated=inval, task_s=st["task_s"]["max"])
            rows.append(row)
            print(f"{r:>5} | {row['clamor_s']:>9.4f} {mib(row['clamor_bytes'])} {mib(row['mapped'])} "
                  f"{row['faults']:>6} {row['changed']:>7} {inval:>5} {row['task_s']:>7.4f} | "
                  f"{row['pickle_s']:>9.4f} {row['zero-copy_s']:>11.4f} {mib(row['pickle_bytes'])} | "
                  f"{row['pickle_s'] / row['clamor_s']:>6.1f}x {row['zero-copy_s'] / row['clamor_s']:>8.1f}x",
                  flush=True)
        tot = cl.stats()
    ran = [who for who in PEERS if "times" in peers.get(who, {})]
    print("seconds per round, side by side (every answer checked equal to clamor's): clamor, the pickled "
          "broadcast, " + (", ".join(ran) if ran else "no peers"), flush=True)
    for r, row in enumerate(rows):
        print(f"{r:>5} | {row['clamor_s']:>9.4f} {row['pickle_s']:>9.4f} | "
              + " ".join(f"{who} {peers[who]['times'][r]:.4f}" for who in ran), flush=True)
    return rows, tot, map_modes, psize


def mode_passes(args, wl, table, map_modes):
    """Part 2: the same rounds, map mode against fetch mode, with nothing
    between rounds.  Returns ({mode: per pass, per round: seconds, bytes
    moved and mapped, faults}, {mode: its workers, as they reported it})."""
    passes = {"map": [], "fetch": []}
    seen = {"map": map_modes}
    print(f"the same rounds without the broadcast, {args.passes} passes a mode, alternating, the table put back "
          f"as built before each: seconds per round, table bytes fetched / mapped", flush=True)
    for k in range(args.passes):
        for who in ("map", "fetch") if k % 2 == 0 else ("fetch", "map"):
            wl.restore()
            rs = []
            with start("clamor", wl.workers, page_size=args.page_size, same_host=who) as cl:
                seen[who] = same_host_modes(cl, who, "streaming", wl.workers)
                for r in range(wl.rounds):
                    shares, expect = wl.begin(r)
                    took, got, _, _, st = clamor_round(cl, table, wl.bits, shares)
                    check(f"{who}-mode pass {k} round {r}", table, wl.bits, {f"clamor ({who})": got}, expect,
                          shares)
                    rs.append({"s": took, "bytes": fetched_bytes(st), "mapped": st["bytes_mapped"],
                               "faults": st["faults"], "task_s": st["task_s"]["max"]})
            passes[who].append(rs)
            fetched, mapped = (mib(sum(x[c] for x in rs)).strip() for c in ("bytes", "mapped"))
            print(f"  {who:<5} pass {k}: " + " ".join(f"{x['s']:.4f}" for x in rs) + f"  | {fetched} / {mapped}",
                  flush=True)
    return passes, seen


def warm_shm(shw, tiny, tiny_keys, workers):
    """The shm workers' warm-up: a small table in a block of its own."""
    from multiprocessing import shared_memory

    tiny_shm = shared_memory.SharedMemory(create=True, size=tiny.nbytes)
    try:
        np.ndarray(tiny.shape, dtype=tiny.dtype, buffer=tiny_shm.buf)[:] = tiny
        if shw.round(tiny_shm.name, tiny.shape, [tiny_keys] * workers, TINY_BITS) != [answer(tiny, tiny_keys,
                                                                                             TINY_BITS)] * workers:
            raise SystemExit("streaming: the shm workers' warm-up answer is wrong")
    finally:
        tiny_shm.close()
        tiny_shm.unlink()


def cold_clamor(args, wl, table, who, shares0, touched, psize, tiny):
    """One cold first round of clamor in ``who`` mode, a fresh cluster
    warmed on the small table ``tiny`` (table, keys): (seconds, answers,
    its detail)."""
    W = wl.workers
    tiny, tiny_keys = tiny
    with start("clamor", W, page_size=args.page_size, same_host=who) as cl:
        same_host_modes(cl, who, "streaming", W)
        tiny_stage(cl, W, tiny, tiny_keys)
        took, got, pids, _, st = clamor_round(cl, table, wl.bits, shares0)
        late = tiny_stage(cl, W, tiny, tiny_keys, 0.3)   # untimed: the late read-ahead
    ratio, touched0 = fetch_ratio(fetched_bytes(st) + late, pids, touched, psize)
    return took, got, {"bytes": fetched_bytes(st), "late_bytes": late, "touched_bytes": touched0,
                       "fetch_ratio": ratio if who == "fetch" else None, "mapped": st["bytes_mapped"],
                       "faults": st["faults"], "task_s": st["task_s"]["max"], "workers_used": len(set(pids))}


def cold_first(args, wl, table, psize, shw, rh):
    """Part 3: cold first rounds of round 0's lookups: map, fetch, shared
    memory and Ray, in rotating order.  Returns ({system: seconds},
    details, each worker's page coverage, all workers' coverage)."""
    from multiprocessing import shared_memory

    bits = wl.bits
    wl.restore()
    shares0, expect0 = wl.begin(0)
    # pages of the table holding the keys each worker looks up in round 0
    npages = table.nbytes // psize
    touched = [lookup_pages(table, wl.keys[i], wl.slot_of[i], bits, psize) for i in wl.plan[0][2]]
    coverage = [len(t) / npages for t in touched]
    coverage_all = len(np.unique(np.concatenate(touched))) / npages
    first = {"map": [], "fetch": [], "shm": [], "ray": []}
    first_detail = {"map": [], "fetch": [], "ray_put_s": [], "ray_workers_used": []}
    shm = shared_memory.SharedMemory(create=True, size=table.nbytes)
    try:
        np.ndarray(table.shape, dtype=table.dtype, buffer=shm.buf)[:] = table
        tiny = tiny_table()
        warm_shm(shw, *tiny, wl.workers)
        systems = ["map", "fetch", "shm"]
        if rh.version:
            ray_start_s = rh.call("start", shm.name, table.shape, shares0, bits)
            systems.append("ray")
            print(f"Ray {rh.version} started with {wl.workers} CPUs, its workers warm, in {ray_start_s:.1f}s",
                  flush=True)
        print(f"cold first rounds (round 0's lookups, {args.first_reps} each, rotating order): they read "
              f"{100 * statistics.mean(coverage):.0f}% of the table's pages a worker "
              f"({100 * coverage_all:.0f}% all together)", flush=True)
        for k in range(args.first_reps):
            line = []
            for who in systems[k % len(systems):] + systems[:k % len(systems)]:
                if who in ("map", "fetch"):
                    took, got, detail = cold_clamor(args, wl, table, who, shares0, touched, psize, tiny)
                    first_detail[who].append(detail)
                elif who == "shm":
                    t = time.perf_counter()
                    got = shw.round(shm.name, table.shape, shares0, bits)
                    took = time.perf_counter() - t
                else:
                    got, put_s, took, used = rh.call("round")
                    first_detail["ray_put_s"].append(put_s)
                    first_detail["ray_workers_used"].append(used)
                check(f"cold first round {k}, {who}", table, bits, {who: got}, expect0, shares0)
                first[who].append(took)
                line.append(f"{who} {took:.4f}s" + (f" (put {put_s:.4f}s)" if who == "ray" else ""))
            print(f"  rep {k}: " + ", ".join(line), flush=True)
        if rh.version:
            rh.call("stop")
    finally:
        shm.close()
        shm.unlink()
    wl.restore()
    return first, first_detail, coverage, coverage_all


def report(args, wl, table, peers, smoke_left_out, m):
    """The summary lines and the JSON line of a one-host run, from ``m``,
    what main measured."""
    rows, passes, first, rounds = m["rows"], m["passes"], m["first"], wl.rounds
    cl_med, bc_med, zc_med = (med(rows[1:], k) for k in ("clamor_s", "pickle_s", "zero-copy_s"))
    # The Zipf tail keeps reaching pages no worker has read yet for several
    # rounds; the second half of the rounds is closer to the steady state.
    half = rounds // 2
    cl_late, bc_late, zc_late = (med(rows[half:], k) for k in ("clamor_s", "pickle_s", "zero-copy_s"))

    def pmed(who, first):   # median over every pass's rounds first..
        return statistics.median(x["s"] for rs in passes[who] for x in rs[first:])

    fe_med, fe_late, mp_med, mp_late = pmed("fetch", 1), pmed("fetch", half), pmed("map", 1), pmed("map", half)
    fm = {who: statistics.median(v) for who, v in first.items() if v}
    ratio0 = statistics.median(d["fetch_ratio"] for d in m["first_detail"]["fetch"])
    figures = {
        "bench": "streaming", "clamor_round_s": cl_med, "broadcast_round_s": bc_med, "speedup": bc_med / cl_med,
        "broadcast_zero_copy_round_s": zc_med, "speedup_vs_zero_copy": zc_med / cl_med,
        "late_rounds_from": half, "clamor_late_round_s": cl_late, "broadcast_late_round_s": bc_late,
        "broadcast_zero_copy_late_round_s": zc_late, "speedup_late": bc_late / cl_late,
        "speedup_late_vs_zero_copy": zc_late / cl_late,
        "first_round_vs_shm": fm["map"] / fm["shm"],
    }
    system_figures(figures, {"clamor": (col(rows, "clamor_s"), sum(col(rows, "clamor_bytes"))),
                             "broadcast": (col(rows, "pickle_s"), sum(col(rows, "pickle_bytes"))),
                             "broadcast_zero_copy": (col(rows, "zero-copy_s"), sum(col(rows, "zero-copy_bytes")))},
                   peers, smoke_left_out)
    print(f"median over rounds 1..{rounds - 1}: clamor {cl_med:.4f}s, broadcast {bc_med:.4f}s (pickle), "
          f"{zc_med:.4f}s (zero-copy); speedup {bc_med / cl_med:.1f}x, {zc_med / cl_med:.1f}x against the "
          f"zero-copy broadcast", flush=True)
    print(f"median over rounds {half}..{rounds - 1}: clamor {cl_late:.4f}s, broadcast {bc_late:.4f}s (pickle), "
          f"{zc_late:.4f}s (zero-copy); speedup {bc_late / cl_late:.1f}x, {zc_late / cl_late:.1f}x", flush=True)
    print(f"clamor moved {mib(sum(col(rows, 'clamor_bytes'))).strip()} and mapped "
          f"{mib(sum(col(rows, 'mapped'))).strip()} in {rounds} rounds, the broadcast "
          f"{mib(sum(col(rows, 'pickle_bytes'))).strip()}", flush=True)
    print(f"rounds 1..{rounds - 1} of every pass, median: fetch mode {fe_med:.4f}s, map mode {mp_med:.4f}s: "
          f"fetch/map = {fe_med / mp_med:.2f} ({fe_late / mp_late:.2f} over rounds {half}..)", flush=True)
    print(f"cold first round in fetch mode: fetched {ratio0:.3f}x the bytes of the pages its lookups touched "
          f"(median of {args.first_reps}; read-ahead that landed after the round counted)", flush=True)
    print(f"cold first round, medians of {args.first_reps}: map {fm['map']:.4f}s, fetch {fm['fetch']:.4f}s, "
          f"shared memory {fm['shm']:.4f}s: map/shm = {fm['map'] / fm['shm']:.2f}; "
          + (f"Ray {fm['ray']:.4f}s (ray.put {statistics.median(m['first_detail']['ray_put_s']):.4f}s): "
             f"map/Ray = {fm['map'] / fm['ray']:.2f}" if "ray" in fm else m["ray_note"]), flush=True)
    ran = {who: p for who, p in peers.items() if "times" in p}
    for who in ran:
        print(f"{who}: median over rounds 1..{rounds - 1} {figures[who + '_iter_s']:.4f}s, "
              f"{figures[who + '_iter_s'] / cl_med:.1f}x clamor's", flush=True)
    print("every checksum and every updated key agreed with the driver's values and with single-process lookups"
          + (", and every peer's with clamor's" if ran else ""), flush=True)
    mode_figures = {"round_speedup_map": fe_med / mp_med, "round_speedup_map_late": fe_late / mp_late,
                    "map_round_s": mp_med, "fetch_round_s": fe_med, "map_late_round_s": mp_late,
                    "fetch_late_round_s": fe_late, "first_round_s": fm,
                    "first_round_s_list": {who: v for who, v in first.items() if v},
                    "first_round_speedup_map": fm["fetch"] / fm["map"], "round0_fetch_ratio": ratio0}
    json_line(more_figures(args, wl, table, figures, mode_figures, ran, m))
    return 0


def col(rs, k):
    return [r[k] for r in rs]


def more_figures(args, wl, table, figures, mode_figures, ran, m):
    """The rest of the one-host run's figures, after ``figures`` and
    ``mode_figures``: the peers', and every measure as measured."""
    rows, passes, first_detail, fm = m["rows"], m["passes"], m["first_detail"], mode_figures["first_round_s"]
    for who, p in ran.items():
        ph = [float(x) for x in np.mean(np.asarray(p["phases"][1:]), axis=0)]
        figures.update({f"{who}_round_s": figures[f"{who}_iter_s"],
                        f"{who}_phases_s": dict(zip(("publish", "lookups", "release"), ph)),
                        f"{who}_workers_per_round": p["workers_used"],
                        f"{who}_worker_processes_seen": p["worker_processes_seen"]})
    figures.update({"time_unit": "s per round", "hosts": 1, "rate": None,
                    "systems_run": ["clamor", "broadcast", "shm"] + sorted(ran)
                    + (["ray"] if "ray" in fm and "ray" not in ran else []),
                    "smoke": args.smoke, "spark_executor_mb": m["spark_conf"]["executor_mb"],
                    "spark_driver_memory": m["spark_conf"]["driver_memory"]})
    if "ray" in fm:
        figures["first_round_vs_ray"] = fm["map"] / fm["ray"]
    figures.update(mode_figures)
    figures.update({
        "first_round_detail": {"map": first_detail["map"], "fetch": first_detail["fetch"]},
        "ray_put_s_list": first_detail["ray_put_s"], "ray_workers_used": first_detail["ray_workers_used"],
        "ray_version": m["ray_version"],
        "first_round_reps": args.first_reps, "first_round_page_coverage": m["coverage"],
        "first_round_page_coverage_all": m["coverage_all"],
        "same_host": {who: sorted(modes.values()) for who, modes in m["seen"].items()},
        "table_bytes": int(table.nbytes), "slots": wl.slots, "keys": wl.n, "rounds": wl.rounds,
        "workers": wl.workers, "lookups_per_worker": args.lookups, "zipf_a": args.zipf, "page_size": m["psize"],
        "build_s": m["build_s"], "clamor_round_s_list": col(rows, "clamor_s"),
        "broadcast_round_s_list": col(rows, "pickle_s"),
        "broadcast_zero_copy_round_s_list": col(rows, "zero-copy_s"),
        "clamor_bytes_per_round": col(rows, "clamor_bytes"), "clamor_mapped_bytes_per_round": col(rows, "mapped"),
        "broadcast_bytes_per_round": col(rows, "pickle_bytes"),
        "clamor_faults_per_round": col(rows, "faults"), "pages_changed_per_round": col(rows, "changed"),
        "pages_invalidated_per_round": col(rows, "invalidated"), "clamor_task_s_per_round": col(rows, "task_s"),
        "passes": args.passes,
    })
    for name, k in (("round_s", "s"), ("bytes_per_round", "bytes"), ("mapped_per_round", "mapped"),
                    ("faults_per_round", "faults")):
        figures[f"pass_{name}"] = {who: [col(rs, k) for rs in v] for who, v in passes.items()}
    figures.update({"clamor_bytes_total": fetched_bytes(m["tot"]),
                    "clamor_mapped_bytes_total": m["tot"]["bytes_mapped"], "verified": True})
    return figures


def parse(argv):
    """The arguments, their defaults filled in; (args, the peers to run,
    what a smoke run leaves out)."""
    ap = parser(__doc__.split("\n\n")[0], "2^23 slots (128 MiB), 6 rounds, 3 cold first rounds", "2^16 slots (1 "
                "MiB), 3 rounds, 1 pass, 1 cold first round, 2,000 lookups; Spark and Ray left out unless named "
                "(seconds; the tests run it)")
    ap.add_argument("--bits", type=int, help="log2 of the slot count (16 bytes a slot; default 25)")
    ap.add_argument("--rounds", type=int, help="rounds (default 10, --quick 6)")
    ap.add_argument("--first-reps", type=int, help="cold first rounds on each system (default 5, --quick 3)")
    ap.add_argument("--passes", type=int, default=None, help="passes of the rounds in each same_host mode (2)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lookups", type=int, default=None, help="lookups per worker per round (20000)")
    ap.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the lookups")
    ap.add_argument("--load", type=float, default=0.5, help="fraction of slots holding a key")
    ap.add_argument("--hot", type=int, default=1000, help="the updated key is one of the hottest HOT")
    ap.add_argument("--page-size", type=int, help="clamor page size in bytes (default: the region's)")
    ap.add_argument("--netns", action="store_true",
                    help="the peers and clamor with one worker per namespace host (only the rounds: no "
                         "broadcast baseline, no same-host parts)")
    ap.add_argument("--rate", default="1gbit", help="with --netns: every host's link, both ways (tc notation)")
    ap.add_argument("--no-ray", action="store_true", help="leave Ray out (the peer and the cold first rounds)")
    ap.add_argument("--seed", type=int, default=1)
    _harness.child_args(ap, PEERS, "the table", default=PEERS, note="; clamor always runs; '' for none")
    args = ap.parse_args(argv)
    sm = args.smoke
    args.bits = args.bits or (16 if sm else 23 if args.quick else 25)
    args.rounds = args.rounds or (3 if sm else 6 if args.quick else 10)
    args.first_reps = args.first_reps or (1 if sm else 3 if args.quick else 5)
    args.passes = args.passes or (1 if sm else 2)
    args.lookups = args.lookups or (2000 if sm else 20000)
    if args.rounds < 2 or args.workers < 1 or args.first_reps < 1 or args.passes < 1 or not 0 < args.load < 1:
        ap.error("need --rounds >= 2, --workers >= 1, --first-reps >= 1, --passes >= 1 and 0 < --load < 1")
    systems, smoke_left_out = _harness.pick_systems(ap, args, ("clamor",) + PEERS, PEERS)
    return args, [x for x in systems if x != "clamor" and not (args.no_ray and x == "ray")], smoke_left_out


def main(argv=None):
    args, systems, smoke_left_out = parse(argv)
    W = args.workers
    spark_conf = dict(zip(("executor_mb", "driver_memory"), _harness.spark_memory(args, 16 << args.bits)))

    def workload():
        return Workload(args.bits, args.load, args.rounds, W, args.lookups, args.zipf, args.hot, args.seed)

    if args.run:   # one peer, in a process of its own that has no region
        wl = workload()
        wl.build(np.zeros((wl.slots, 2), dtype=np.int64))
        return peer_child(args.run, wl, spark_conf, args.out, args.rate if args.netns else None)

    # The peers first, each in a subprocess of its own, while this process
    # has neither a region nor other children.
    child_args = [os.path.abspath(__file__), "--bits", str(args.bits), "--rounds", str(args.rounds),
                  "--workers", str(W), "--lookups", str(args.lookups), "--zipf", repr(args.zipf),
                  "--load", repr(args.load), "--hot", str(args.hot), "--seed", str(args.seed),
                  "--spark-executor-mb", str(spark_conf["executor_mb"]),
                  "--spark-driver-memory", spark_conf["driver_memory"]]
    if args.netns:
        child_args += ["--netns", "--rate", args.rate]
    peers = run_peers(systems, [sys.executable] + child_args, args.timeout)
    if args.netns:
        return on_hosts(args, workload(), peers, spark_conf)

    # Spawn the plain processes next, before this process has a region.
    with Broadcast(W) as bc, ShmWorkers(W) as shw, RayHelper(W, enabled="ray" in systems) as rh:
        import clamor

        t0 = time.perf_counter()
        wl = workload()
        table = wl.build(clamor.zeros((wl.slots, 2), dtype=np.int64))
        build_s = time.perf_counter() - t0
        assert np.array_equal(lookup(table, wl.keys[:1000], args.bits), wl.vals[:1000])
        ray_note = (f"Ray {rh.version}" if rh.version else
                    "Ray left out" if "ray" not in systems else "ray not installed")
        print(f"streaming: hash table of {wl.slots} slots ({mib(table.nbytes).strip()}, {wl.n} keys) built in "
              f"{build_s:.1f}s; {W} workers x {args.lookups} lookups Zipf({args.zipf}) a round, "
              f"one hot key updated between rounds; {ray_note}", flush=True)
        rows, tot, map_modes, psize = versus_broadcast(args, wl, table, peers, bc)
        passes, seen = mode_passes(args, wl, table, map_modes)
        first, first_detail, coverage, coverage_all = cold_first(args, wl, table, psize, shw, rh)
    measured = {"rows": rows, "tot": tot, "psize": psize, "passes": passes, "seen": seen, "first": first,
                "first_detail": first_detail, "coverage": coverage, "coverage_all": coverage_all,
                "build_s": build_s, "ray_note": ray_note, "ray_version": rh.version, "spark_conf": spark_conf}
    return report(args, wl, table, peers, smoke_left_out, measured)


if __name__ == "__main__":
    sys.exit(main())
