#!/usr/bin/env python3
"""k-means on a clamor Cluster against a multiprocessing + numpy lower bound, Spark and Dask.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"kmeans.py".
"""
import multiprocessing
import os
from functools import reduce
import statistics
import sys
import tempfile
import time

import _harness
from _common import (MIB, add, array_pages, bounds, chunks, ensure_built, make_points, one_blas_thread, parse_size,
                     partial_sums, update)
from _harness import json_line, med, parser

one_blas_thread()  # before numpy loads OpenBLAS
import numpy as np  # noqa: E402


PEERS = ("spark", "dask")
HERE = os.path.dirname(os.path.abspath(__file__))


# ---- baseline: multiprocessing Pool over copy-on-write points --------------------

_POINTS = None  # set before the Pool forks; its processes read it copy-on-write
_BOUNDS = None


def _pool_task(arg):
    i, c = arg
    return partial_sums(_POINTS[_BOUNDS[i]:_BOUNDS[i + 1]], c)


def baseline_step(pool, parts, c):
    """One iteration: per-chunk partials in the pool, combined in chunk order."""
    return update(c, *reduce(add, pool.map(_pool_task, [(i, c) for i in range(parts)], chunksize=1)))


# ---- clamor ----------------------------------------------------------------------

def _drop_task(first, count):
    import os as _os

    from clamor import region
    region.drop_pages(first, count)
    return _os.getpid()


def drop_worker_pages(cl, pts, workers):
    """Make the next round cold: every worker drops its copy of the points
    (``cl.run``: one call pinned to each worker).  Whether every worker did."""
    pids = cl.run(_drop_task, *array_pages(pts))
    return len(pids) == workers and sorted(pids) == sorted(cl.worker_pids)


def clamor_step(data, c):
    """One iteration: one stage of map_partitions + reduce on the cluster."""
    sums, counts = data.map_partitions(lambda x: [partial_sums(x, c)]).reduce(add)
    return update(c, sums, counts)


def run_round(pool, cl, pts, parts, init, iters):
    """``iters`` iterations of both, interleaved (which goes first alternates),
    so a busy moment of this shared machine slows both alike."""
    data = cl.parallelize(pts, partitions=parts)
    cb = cc = init
    tb, tc, stages = [], [], []
    busy = cl.stats()["task_seconds"]
    for i in range(iters):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            t = time.perf_counter()
            if side == 0:
                cb = baseline_step(pool, parts, cb)
                tb.append(time.perf_counter() - t)
            else:
                cc = clamor_step(data, cc)
                tc.append(time.perf_counter() - t)
                st = dict(cl.stage_stats()[-1])
                now = cl.stats()["task_seconds"]
                # the busiest worker's share, at best: what the stage cannot go below
                st["busy_s"] = max(st["task_s"]["max"], (now - busy) / cl.nworkers)
                busy = now
                stages.append(st)
    return cb, tb, cc, tc, stages


# ---- driver ----------------------------------------------------------------------

def summary(times):
    later = times[1:] or times
    return {"total_s": sum(times), "first_s": times[0], "later_median_s": statistics.median(later)}


def peer_figures(s, r, cc, clamor_s, iters, left_out):
    """A peer's keys for the JSON line from its result ``r`` (None: not
    requested); exits when its centroids differ from clamor's ``cc``."""
    keys = ("s", "iter_s", "times_s", "first_s", "later_median_s", "bytes", "task_max_s", "task_cpu_max_s")
    out = {f"{s}_{key}": None for key in keys}
    out[f"ratio_vs_{s}"] = None
    if r is None or "rounds" not in r:
        out[f"{s}_missing"] = _harness.missing(s, r, left_out)
        return out
    if not np.allclose(r["centroids"], cc, rtol=1e-9, atol=1e-9):
        raise SystemExit(f"kmeans: {s}'s centroids differ from clamor's: the comparison is void\n"
                         f"{r['centroids']}\n{cc}")
    sums = [summary(x["times"]) for x in r["rounds"]]
    last = r["rounds"][-1]
    total = med(sums, "total_s")
    out.update({f"{s}_s": round(total, 4), f"{s}_iter_s": round(total / iters, 4),
                f"{s}_times_s": [round(v, 4) for v in last["times"]],
                f"{s}_first_s": round(med(sums, "first_s"), 4),
                f"{s}_later_median_s": round(med(sums, "later_median_s"), 4),
                f"{s}_bytes": r["extra"].get("bytes"),
                f"{s}_task_max_s": [round(v[1], 4) for v in last["slow"]],
                f"{s}_task_cpu_max_s": [round(v[2], 4) for v in last["slow"]],
                f"ratio_vs_{s}": round(clamor_s / total, 3),
                f"{s}_same_bits": bool(np.array_equal(r["centroids"], cc)),
                f"{s}_version": r["extra"].get("version"), f"{s}_wall_s": round(r["wall_s"], 1)})
    if s == "spark":
        out["spark_read_max_s"] = [round(v[0], 4) for v in last["slow"]]
        out["spark_cached_bytes"] = r["extra"].get("cached_bytes")
    if s == "dask":
        out["dask_block_holders"] = r["extra"].get("block_holders")
        out["dask_block_copies"] = r["extra"].get("block_copies")
    return out


# ---- the peers: Spark and Dask, each in a subprocess (--run SYSTEM) ----------------------

def save_blocks(d, x, init, meta):
    """The points as ``meta["partitions"]`` contiguous blocks, the initial
    centroids and the run's parameters, in directory ``d``."""
    for i, block in enumerate(chunks(x, meta["partitions"])):
        np.save(os.path.join(d, f"block{i}.npy"), block)
    np.save(os.path.join(d, "init.npy"), init)
    _harness.write_json(os.path.join(d, "meta.json"), meta)


def load_block(d, i):
    """Block i of the points (what the peers' workers run to load them)."""
    return np.load(os.path.join(d, f"block{i}.npy"))


# ---- the iterations ------------------------------------------------------------------------

def timed_partials(block, c, read_s=0.0):
    """A task's answer: (partial sums and counts of ``block`` at centroids
    ``c``, (seconds the task waited for its block, kernel seconds, the
    kernel's CPU seconds, pid)).  Kernel seconds well above its CPU seconds
    are time the task's thread waited for a core or the GIL."""
    t, cpu = time.perf_counter(), time.thread_time()
    out = partial_sums(block, c)
    return out, (read_s, time.perf_counter() - t, time.thread_time() - cpu, os.getpid())


def lloyd(step, init, iters, name):
    """``iters`` iterations from ``init``; ``step(c)`` returns the
    partitions' timed_partials in partition order.  Returns (centroids,
    seconds per iteration, per iteration the longest read, kernel and
    kernel CPU seconds of its tasks)."""
    c, times, slow = init, [], []
    for it in range(iters):
        t = time.perf_counter()
        res = step(c)
        c = update(c, *reduce(add, (r[0] for r in res)))
        times.append(time.perf_counter() - t)
        read, kernel, cpu = (max(r[1][j] for r in res) for j in range(3))
        slow.append((read, kernel, cpu))
        print(f"  {name:>5} iteration {it}: {times[-1]:7.3f} s (longest read {read:.3f} s, kernel {kernel:.3f} s, "
              f"kernel CPU {cpu:.3f} s; {len({r[1][3] for r in res})} worker processes)", flush=True)
    return c, times, slow


def _rounds(step, init, meta, name, between=None):
    """``meta["reps"]`` rounds of lloyd, each from the initial centroids;
    ``between()`` (if given) is called after each round and its value kept."""
    rounds = []
    for _ in range(meta["reps"]):
        c, times, slow = lloyd(step, init, meta["iters"], name)
        rounds.append({"times": times, "slow": slow, "after": between() if between else None})
    return c, rounds


# ---- Spark ------------------------------------------------------------------------------------

def _block_facts(block):
    """The untimed warm-up's answer: the worker's pid, BLAS threads,
    interpreter and numpy, and the block's rows."""
    return os.getpid(), os.environ.get("OPENBLAS_NUM_THREADS"), sys.executable, np.__version__, len(block)


def _say_facts(facts):
    return (f"Python worker processes {sorted({f[0] for f in facts})}, BLAS threads {sorted({str(f[1]) for f in facts})}, "
            f"{sorted({f[2] for f in facts})} with numpy {sorted({f[3] for f in facts})}")


def run_spark(d, meta, init):
    P, W = meta["partitions"], meta["workers"]
    with _harness.start("spark", W, executor_mb=meta["spark_executor_mb"], app="kmeans") as sc:
        sc.addPyFile(os.path.join(HERE, "_common.py"))   # what the tasks import, shipped the documented way
        rdd = sc.parallelize(range(P), P).map(lambda i: load_block(d, i)).cache()
        facts = rdd.map(_block_facts).collect()   # untimed: loads and caches the blocks, starts the Python workers
        info = [r for r in sc._jsc.sc().getRDDStorageInfo() if r.id() == rdd.id()]
        cached = info[0].numCachedPartitions() if info else 0
        if cached != P:
            raise RuntimeError(f"Spark cached {cached} of {P} blocks (it would reload the rest every iteration): "
                               f"raise --spark-executor-mb")
        mem = int(info[0].memSize())
        execs = _harness.executor_pids(sc)
        print(f"  spark: {sc.version}, master {sc.master}, {len(execs)} executor JVMs; {_say_facts(facts)}; "
              f"{P} blocks cached ({mem / (1 << 20):.0f} MiB in the executors' memory)", flush=True)

        def step(c):
            def task(it):
                t = time.perf_counter()
                blocks = list(it)   # the cached block: the executor JVM writes it to this Python worker, unpickled here
                read = time.perf_counter() - t
                return [timed_partials(b, c, read) for b in blocks]
            return rdd.mapPartitions(task).collect()

        c, rounds = _rounds(step, init, meta, "spark")
        extra = {"version": sc.version, "master": sc.master, "executor_processes": len(execs),
                 "python_workers": len({f[0] for f in facts}), "cached_bytes": mem,
                 # every iteration reads every cached block through the JVM -> Python socket
                 "bytes": mem * meta["iters"]}
    return c, rounds, extra


# ---- Dask --------------------------------------------------------------------------------------

def _incoming(client):
    """Bytes the workers have received from one another so far (their transfer logs)."""
    got = client.run(lambda dask_worker: sum(e["total"] for e in dask_worker.transfer_incoming_log))
    return int(sum(got.values()))


def run_dask(d, meta, init):
    P, W = meta["partitions"], meta["workers"]
    with _harness.start("dask", W) as client:
        import distributed

        parts = client.map(load_block, [d] * P, range(P), pure=False)
        facts = client.gather([client.submit(_block_facts, f, pure=False) for f in parts])   # untimed
        holders = {w for v in client.who_has(parts).values() for w in v}
        print(f"  dask: {distributed.__version__}, {len(client.scheduler_info()['workers'])} workers, "
              f"blocks on {len(holders)} of them; {_say_facts(facts)}", flush=True)

        def step(c):
            return client.gather([client.submit(timed_partials, f, c, pure=False) for f in parts])

        before = [_incoming(client)]

        def moved():
            now = _incoming(client)
            out, before[0] = now - before[0], now
            return out

        c, rounds = _rounds(step, init, meta, "dask", moved)
        copies = sum(len(v) for v in client.who_has(parts).values())
        if copies > P or any(r["after"] for r in rounds):
            # Once more than 2 x threads tasks of one group are alive (this
            # loop's, released but not yet forgotten), the scheduler takes
            # them for root-ish and places them without regard to their block.
            print(f"  dask: the workers copied blocks between them ({[r['after'] for r in rounds]} bytes a round; "
                  f"{copies} copies of {P} blocks at the end): tasks placed as root-ish, away from their block",
                  flush=True)
        extra = {"version": distributed.__version__, "block_holders": len(holders), "block_copies": copies,
                 "python_workers": len({f[0] for f in facts}), "bytes": rounds[-1]["after"]}
    return c, rounds, extra


RUNNERS = {"spark": run_spark, "dask": run_dask}


# ---- the subprocess and the driver's side of it -------------------------------------------------

def peer_child(system, d, out):
    """``kmeans.py --run SYSTEM``: run one peer over the blocks in ``d``;
    write its figures to ``out`` (JSON) and its centroids beside it, or the
    reason it could not run."""

    def run():
        meta = _harness.read_json(os.path.join(d, "meta.json"))
        c, rounds, extra = RUNNERS[system](d, meta, np.load(os.path.join(d, "init.npy")))
        np.save(out + ".c.npy", c)
        return {"rounds": rounds, "extra": extra}

    return _harness.child_result(system, out, run)


def run_peers(systems, x, init, meta, timeout):
    """Each of ``systems`` over the points ``x`` from ``init``, in a
    subprocess of its own (``--run SYSTEM``); {system: result dict}, with
    ``rounds``, ``extra`` and ``centroids`` when the peer ran."""
    with tempfile.TemporaryDirectory(prefix="kmeans-", ignore_cleanup_errors=True) as d:
        save_blocks(d, x, init, meta)
        return _harness.run_systems(systems, [sys.executable, os.path.abspath(__file__), "--data", d], d, timeout,
                                    load=lambda s, r, out: r.update(centroids=np.load(out + ".c.npy")))


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], "1M points instead of 8M", "64K points, 3 iterations, a peer that cannot "
                "run skipped with its reason (seconds; the tests run it)", build=True)
    ap.add_argument("--points", type=int, default=None, help="number of points (default 8M, quick 1M)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--iters", type=int, default=None, help="Lloyd iterations (10; smoke 3)")
    ap.add_argument("--workers", type=int, default=None, help="processes on each side (default: cores)")
    ap.add_argument("--partitions", type=int, default=None, help="tasks per iteration (default: workers)")
    ap.add_argument("--reps", type=int, default=1, help="rounds of (baseline, clamor); medians are reported")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--page-size", type=int, default=None, help="region page size in bytes (default: clamor's)")
    ap.add_argument("--readahead", type=parse_size, default=None,
                    help="workers' read-ahead bytes, e.g. 2M; 0 disables (default: clamor's setting)")
    ap.add_argument("--spark-executor-mb", type=int, default=None,
                    help="heap of each Spark executor JVM, MiB (default: 3 x a block + 1024, at least 2048)")
    _harness.child_args(ap, PEERS, timeout=1800, default=("clamor", "baseline") + PEERS,
                        note="; clamor and the baseline always run; --smoke leaves Spark out unless named")
    args = ap.parse_args(argv)
    if args.run:   # a peer's subprocess: no clamor here
        return peer_child(args.run, args.data, args.out)

    asked, smoke_left_out = _harness.pick_systems(ap, args, ("clamor", "baseline") + PEERS,
                                                  ("clamor", "baseline") + PEERS)
    peers = [s for s in PEERS if s in asked]

    global _POINTS, _BOUNDS
    n = args.points or ((1 << 16) if args.smoke else (1 << 20) if args.quick else (8 << 20))
    args.iters = args.iters or (3 if args.smoke else 10)
    w = args.workers or os.cpu_count() or 1
    parts = args.partitions or w
    k, d, iters = args.k, args.d, args.iters
    clamor = ensure_built(not args.no_build)
    from clamor import region

    t = time.perf_counter()
    x, init = make_points(n, k, d, args.seed)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    serial_counts = partial_sums(x, init)[1]
    serial_s = time.perf_counter() - t
    print(f"kmeans: {n} points, k={k}, d={d} ({x.nbytes / MIB:.0f} MiB float64), {iters} iterations, "
          f"{w} workers, {parts} partitions, {args.reps} round(s); generated in {gen_s:.2f} s; "
          f"one iteration serially in the driver {serial_s:.3f} s", flush=True)

    # The peers first, each in a subprocess, while this process is no
    # clamor driver yet (a process forked from a driver attaches to its region).
    block_mib = x.nbytes / parts / MIB
    meta = {"partitions": parts, "workers": w, "iters": iters, "reps": args.reps,
            "spark_executor_mb": args.spark_executor_mb or max(2048, int(3 * block_mib) + 1024)}
    _harness.subreaper()
    peer_res = run_peers(peers, x, init, meta, args.timeout) if peers else {}

    # The Pool forks before the region exists, so its processes are plain
    # numpy processes (a process forked after region.init attaches to the
    # region as a worker: the C core's fork hook).
    _POINTS, _BOUNDS = x, bounds(n, parts)
    pool = multiprocessing.get_context("fork").Pool(w)
    pool.map(int, range(w), chunksize=1)  # every pool process is up

    region.init(page_size=args.page_size)
    if args.readahead is not None:  # set before the fork: the workers inherit it
        region.configure(readahead=args.readahead)
    readahead = region.configure()["readahead"]
    t = time.perf_counter()
    pts = clamor.array(x)
    copy_s = time.perf_counter() - t
    t = time.perf_counter()
    cl = clamor.Cluster(workers=w, progress=False).start()
    start_s = time.perf_counter() - t
    print(f"region copy {copy_s:.2f} s, cluster start {start_s:.3f} s, page {region.page_size() // 1024} KiB, "
          f"read-ahead {readahead // 1024} KiB",
          flush=True)

    if serial_counts.sum() != n:
        raise SystemExit("kmeans: the serial kernel lost points")
    rounds = []
    try:
        for r in range(args.reps):
            cold_ok = True if r == 0 else drop_worker_pages(cl, pts, w)
            cb, tb, cc, tc, stages = run_round(pool, cl, pts, parts, init, iters)
            if not np.allclose(cb, cc, rtol=1e-9, atol=1e-9):
                raise SystemExit(f"kmeans: centroids differ after {iters} iterations:\n{cb}\n{cc}")
            rounds.append({"baseline": tb, "clamor": tc, "stages": stages, "cold": cold_ok,
                           "same_bits": bool(np.array_equal(cb, cc))})
            print(f"round {r}: {'iter':>4} {'baseline s':>10} {'clamor s':>9} {'ratio':>6} "
                  f"{'task max s':>10} {'overhead ms':>11} {'faults':>7} {'MiB fetched':>11}")
            for i, (a, b, st) in enumerate(zip(tb, tc, stages)):
                print(f"{'':9}{i:>4} {a:>10.3f} {b:>9.3f} {b / a:>6.2f} {st['task_s']['max']:>10.3f} "
                      f"{(b - st['busy_s']) * 1e3:>11.1f} {st['faults']:>7} "
                      f"{st['bytes_from_driver'] / MIB:>11.1f}")
            print(f"{'':9}total {sum(tb):>9.3f} {sum(tc):>9.3f} {sum(tc) / sum(tb):>6.2f}"
                  + ("" if cold_ok else "   (warning: some worker may have kept its pages)"), flush=True)
        cluster_stats = cl.stats()
    finally:
        cl.close()
        pool.close()
        pool.join()
        left = _harness.reap_descendants()
        if left:
            print(f"killed processes left behind: {left}", flush=True)

    bs = [summary(r["baseline"]) for r in rounds]
    cs = [summary(r["clamor"]) for r in rounds]
    clamor_s, baseline_s = med(cs, "total_s"), med(bs, "total_s")
    last = rounds[-1]
    fetched = sum(st["bytes_from_driver"] for st in rounds[0]["stages"])
    peer_out = {}
    for s in PEERS:
        peer_out.update(peer_figures(s, peer_res.get(s), cc, clamor_s, iters, smoke_left_out))
    print(f"median over {len(rounds)} round(s): clamor {clamor_s:.3f} s vs multiprocessing {baseline_s:.3f} s -> "
          f"ratio {clamor_s / baseline_s:.2f} (target <= 1.5); first iteration {med(cs, 'first_s'):.3f} s vs "
          f"{med(bs, 'first_s'):.3f} s, later (median) {med(cs, 'later_median_s'):.3f} s vs "
          f"{med(bs, 'later_median_s'):.3f} s; clamor workers fetched {fetched / MIB:.0f} MiB in round 0")
    for s in PEERS:
        if peer_out.get(f"{s}_s") is not None:
            print(f"{s}: {peer_out[f'{s}_s']:.3f} s (first iteration {peer_out[f'{s}_first_s']:.3f} s, later "
                  f"(median) {peer_out[f'{s}_later_median_s']:.3f} s) -> clamor / {s} "
                  f"{peer_out[f'ratio_vs_{s}']:.2f}" + (" (target <= 1.0)" if s == "spark" else ""), flush=True)
    out = {
        "bench": "kmeans",
        "systems_run": ["clamor", "baseline"] + [s for s in PEERS if peer_out.get(f"{s}_s") is not None],
        "smoke": args.smoke, "clamor_s": round(clamor_s, 4), "baseline_s": round(baseline_s, 4),
        "ratio": round(clamor_s / baseline_s, 3), "ratio_vs_spark": peer_out.pop("ratio_vs_spark"),
        "ratio_vs_dask": peer_out.pop("ratio_vs_dask"), "time_unit": "s per iteration", "hosts": 1,
        "rate": None, "points": n, "k": k, "d": d, "iters": iters, "workers": w,
        "partitions": parts, "reps": len(rounds), "clamor_iter_s": round(clamor_s / iters, 4),
        "baseline_iter_s": round(baseline_s / iters, 4),
        "clamor_times_s": [round(v, 4) for v in last["clamor"]],
        "baseline_times_s": [round(v, 4) for v in last["baseline"]],
        "clamor_bytes": sum(st["bytes_from_driver"] + st["bytes_from_peers"] for st in last["stages"]),
        "clamor_bytes_mapped": sum(st.get("bytes_mapped", 0) for st in last["stages"]),
        "baseline_bytes": 0, "clamor_first_s": round(med(cs, "first_s"), 4),
        "clamor_later_median_s": round(med(cs, "later_median_s"), 4),
        "baseline_first_s": round(med(bs, "first_s"), 4),
        "baseline_later_median_s": round(med(bs, "later_median_s"), 4),
        "first_ratio": round(med(cs, "first_s") / med(bs, "first_s"), 3),
        "later_ratio": round(med(cs, "later_median_s") / med(bs, "later_median_s"), 3),
        "clamor_task_max_s": [round(st["task_s"]["max"], 4) for st in last["stages"]],
        "clamor_faults": [st["faults"] for st in last["stages"]],
        "clamor_overhead_ms": [round((t - st["busy_s"]) * 1e3, 2) for t, st in zip(last["clamor"], last["stages"])],
        "bytes_fetched": fetched, "cold_rounds": all(r["cold"] for r in rounds),
        "serial_iter_s": round(serial_s, 4), "gen_s": round(gen_s, 3),
        "region_copy_s": round(copy_s, 3), "cluster_start_s": round(start_s, 4),
        "page_size": region.page_size(), "readahead": readahead,
        "total_faults": cluster_stats["faults"], "verified": True,
        "same_bits": all(r["same_bits"] for r in rounds),
        "spark_executor_mb": meta["spark_executor_mb"],
    }
    out.update(peer_out)
    json_line(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
