#!/usr/bin/env python3
"""Empty-task throughput and stage latency of a Cluster, against a Pool.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"tasks.py".
"""
import multiprocessing
import statistics
import sys
import time

from _common import ensure_built
from _harness import json_line, parser


def noop(x):
    return None


def empty(part):
    return []


def cl_stage(cl, n):
    """One stage of ``n`` empty tasks on the Cluster."""
    assert cl.range(n, partitions=n).map_partitions(empty).count() == 0


def pool_stage(pool, n):
    """The Pool's stage: ``n`` empty tasks, one a chunk."""
    pool.map(noop, range(n), chunksize=1)


def timed(stage, h, n, stages=1):
    """Seconds of ``stages`` stages of ``n`` tasks each."""
    t = time.perf_counter()
    for _ in range(stages):
        stage(h, n)
    return time.perf_counter() - t


def latency(stage, h, n, reps):
    """The median of ``reps`` one-stage times."""
    return statistics.median(timed(stage, h, n) for _ in range(reps))


# ---- driver ------------------------------------------------------------------------

def profile_stage(cl, n, top=25):
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    cl_stage(cl, n)
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    print(f"--- driver profile, one stage of {n} empty tasks (by own time) ---", file=sys.stderr)
    print(buf.getvalue(), file=sys.stderr)


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], "fewer repetitions (same sizes)", "200 tasks, 10 small stages, 5 latency "
                "stages, 1 round (seconds; the tests run it)", build=True)
    ap.add_argument("--tasks", type=int, default=None, help="tasks in the throughput stage (default 2000)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--stages", type=int, default=None, help="small stages (default 200, quick 100)")
    ap.add_argument("--small", type=int, default=None, help="tasks per small stage (default 2 * workers)")
    ap.add_argument("--lat-reps", type=int, default=None, help="stages per latency median (default 50)")
    ap.add_argument("--reps", type=int, default=None, help="rounds of everything (default 5, quick 3)")
    ap.add_argument("--profile", action="store_true", help="cProfile the driver during one N-task stage")
    args = ap.parse_args(argv)

    sm = args.smoke
    args.tasks = args.tasks or (200 if sm else 2000)
    args.lat_reps = args.lat_reps or (5 if sm else 50)
    w, n = args.workers, args.tasks
    stages = args.stages or (10 if sm else 100 if args.quick else 200)
    per = args.small or 2 * w
    reps = args.reps or (1 if sm else 3 if args.quick else 5)
    clamor = ensure_built(not args.no_build)

    # the Pool forks before the region exists: a process forked from a driver attaches to its region
    pool = multiprocessing.get_context("fork").Pool(w)
    pool.map(noop, range(w), chunksize=1)
    t = time.perf_counter()
    cl = clamor.Cluster(workers=w, progress=False).start()
    start_s = time.perf_counter() - t
    print(f"tasks: {w} workers, {n}-task stage, {stages} stages of {per} tasks, latency over {args.lat_reps} "
          f"stages, {reps} rounds; cluster start {start_s:.3f} s", flush=True)

    r = {k: [] for k in ("cl_n", "pool_n", "cl_small", "pool_small", "cl_lat1", "cl_latw", "pool_lat1",
                         "pool_latw")}
    task_med = []
    try:
        for _ in range(3):  # warm both: first stages pay imports, first sends, page-ins
            timed(cl_stage, cl, w)
            timed(pool_stage, pool, w)
        timed(cl_stage, cl, min(n, 200))
        for i in range(reps):
            r["cl_n"].append(timed(cl_stage, cl, n))
            task_med.append(cl.stage_stats()[-1]["task_s"]["median"])
            r["pool_n"].append(timed(pool_stage, pool, n))
            r["cl_small"].append(timed(cl_stage, cl, per, stages))
            r["pool_small"].append(timed(pool_stage, pool, per, stages))
            r["cl_lat1"].append(latency(cl_stage, cl, 1, args.lat_reps))
            r["pool_lat1"].append(latency(pool_stage, pool, 1, args.lat_reps))
            r["cl_latw"].append(latency(cl_stage, cl, w, args.lat_reps))
            r["pool_latw"].append(latency(pool_stage, pool, w, args.lat_reps))
            print(f"round {i}: {n} tasks clamor {n / r['cl_n'][-1]:8.0f}/s pool {n / r['pool_n'][-1]:8.0f}/s | "
                  f"small stages clamor {stages * per / r['cl_small'][-1]:7.0f}/s pool "
                  f"{stages * per / r['pool_small'][-1]:7.0f}/s | latency 1 task {r['cl_lat1'][-1] * 1e3:.2f} "
                  f"ms pool {r['pool_lat1'][-1] * 1e3:.2f} ms | {w} tasks {r['cl_latw'][-1] * 1e3:.2f} ms pool "
                  f"{r['pool_latw'][-1] * 1e3:.2f} ms", flush=True)
        if args.profile:
            profile_stage(cl, n)
        stats = cl.stats()
    finally:
        cl.close()
        pool.close()
        pool.join()

    med = {k: statistics.median(v) for k, v in r.items()}
    tps, pool_tps = n / med["cl_n"], n / med["pool_n"]
    small_tps, pool_small_tps = stages * per / med["cl_small"], stages * per / med["pool_small"]
    print(f"{'median':<28}{'clamor':>12}{'pool':>12}{'ratio':>8}")
    rows = [(f"{n}-task stage, tasks/s", tps, pool_tps),
            (f"{per}-task stages, tasks/s", small_tps, pool_small_tps),
            (f"{per}-task stage, ms", med["cl_small"] / stages * 1e3, med["pool_small"] / stages * 1e3),
            ("1-task stage, ms", med["cl_lat1"] * 1e3, med["pool_lat1"] * 1e3),
            (f"{w}-task stage, ms", med["cl_latw"] * 1e3, med["pool_latw"] * 1e3)]
    for name, a, b in rows:
        print(f"{name:<28}{a:>12.2f}{b:>12.2f}{a / b:>8.2f}")
    print(f"clamor: median task run time on the worker {statistics.median(task_med) * 1e6:.0f} us; "
          f"driver+transport per task {med['cl_n'] / n * 1e6:.0f} us wall")
    out = {
        "bench": "tasks", "tasks_per_s": round(tps, 1),
        "stage_latency_ms": round(med["cl_lat1"] * 1e3, 3),
        "stage_latency_w_ms": round(med["cl_latw"] * 1e3, 3),
        "pool_tasks_per_s": round(pool_tps, 1), "throughput_ratio": round(tps / pool_tps, 3),
        "small_stage_tasks_per_s": round(small_tps, 1),
        "pool_small_stage_tasks_per_s": round(pool_small_tps, 1),
        "small_stage_ms": round(med["cl_small"] / stages * 1e3, 3),
        "pool_small_stage_ms": round(med["pool_small"] / stages * 1e3, 3),
        "pool_latency_ms": round(med["pool_lat1"] * 1e3, 3),
        "pool_latency_w_ms": round(med["pool_latw"] * 1e3, 3),
        "task_run_us": round(statistics.median(task_med) * 1e6, 1), "tasks": n, "workers": w,
        "small_stages": stages, "small_stage_tasks": per, "lat_reps": args.lat_reps, "reps": reps,
        "cluster_start_s": round(start_s, 4),
        "tasks_per_s_all": [round(n / v, 1) for v in r["cl_n"]],
        "pool_tasks_per_s_all": [round(n / v, 1) for v in r["pool_n"]],
        "stages_run": stats["stages"],
    }
    json_line(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
