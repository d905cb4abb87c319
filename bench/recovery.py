#!/usr/bin/env python3
"""k-means iterations with a worker killed in iteration 4 (paper Fig. 11, 12).

How to run it, what it compares and what its JSON line holds: bench/README.md,
"recovery.py".
"""
import os
import signal
import statistics
import sys
import threading
import time
from functools import reduce

from _common import MIB, add, chunks, ensure_built, make_points, one_blas_thread, partial_sums, update
from _harness import json_line, parser

one_blas_thread()  # before numpy loads OpenBLAS
import numpy as np  # noqa: E402


def serial_trajectory(x, init, parts, iters):
    """The centroids after each iteration, computed in the driver with the
    cluster's chunks and combination order."""
    c, out = init, []
    for _ in range(iters):
        c = update(c, *reduce(add, (partial_sums(part, c) for part in chunks(x, parts))))
        out.append(c)
    return out


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], "2M points instead of 8M", "256K points, 6 iterations (seconds; the tests "
                "run it)", build=True)
    ap.add_argument("--points", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None, help="iterations (10; smoke 6)")
    ap.add_argument("--fail-at", type=int, default=4, help="iteration (from 1) in which a worker is killed")
    ap.add_argument("--kill-after", type=float, default=0.5,
                    help="when to kill, as a fraction of the normal iteration time")
    ap.add_argument("--workers", type=int, default=None, help="default: cores")
    ap.add_argument("--partitions", type=int, default=None, help="tasks per iteration (default: workers)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-verify", action="store_true", help="skip the serial check of the centroids")
    args = ap.parse_args(argv)
    args.iters = args.iters or (6 if args.smoke else 10)
    if not 2 < args.fail_at < args.iters:
        ap.error("--fail-at must leave at least two iterations before it and one after it")

    n = args.points or ((1 << 18) if args.smoke else (2 << 20) if args.quick else (8 << 20))
    w = args.workers or os.cpu_count() or 1
    parts = args.partitions or w
    clamor = ensure_built(not args.no_build)
    from clamor import region

    x, init = make_points(n, 10, 10, args.seed)
    region.init()
    pts = clamor.array(x)
    print(f"recovery: k-means on {n} points ({x.nbytes / MIB:.0f} MiB), {args.iters} iterations, {w} workers, "
          f"{parts} partitions; a worker is killed in iteration {args.fail_at}", flush=True)

    cl = clamor.Cluster(workers=w, progress=False).start()
    times, rows, centroids, killed = [], [], [], []
    try:
        data = cl.parallelize(pts, partitions=parts)
        c = init
        before = cl.stats()
        for it in range(1, args.iters + 1):
            timer = None
            if it == args.fail_at:
                normal = statistics.median(times[1:])
                victim = cl.worker_pids[0]

                def kill(victim=victim):
                    os.kill(victim, signal.SIGKILL)
                    killed.append(victim)
                timer = threading.Timer(args.kill_after * normal, kill)
            t = time.perf_counter()
            if timer:
                timer.start()
            sums, counts = data.map_partitions(lambda xs, c=c: [partial_sums(xs, c)]).reduce(add)
            c = update(c, sums, counts)
            times.append(time.perf_counter() - t)
            if timer:
                timer.join()
            centroids.append(c)
            now = cl.stats()
            rec = now["recovery"]
            row = {"iter": it, "s": times[-1], "workers": len(cl._workers),
                   "rerun": rec["tasks_rerun"] - before["recovery"]["tasks_rerun"],
                   "faults": now["faults"] - before["faults"],
                   "driver_mib": (now["bytes_from_driver"] - before["bytes_from_driver"]) / MIB,
                   "peer_mib": (now["bytes_from_peers"] - before["bytes_from_peers"]) / MIB}
            rows.append(row)
            before = now
            print(f"iter {it:>3} {times[-1]:>8.3f} s  workers {row['workers']}  re-run {row['rerun']:>2}  "
                  f"faults {row['faults']:>6}  from driver {row['driver_mib']:>7.1f} MiB  "
                  f"from peers {row['peer_mib']:>7.1f} MiB" + ("   <- worker killed" if it == args.fail_at else ""),
                  flush=True)
        recovery = cl.stats()["recovery"]
    finally:
        cl.close()

    verified = None
    if not args.no_verify:
        ref = serial_trajectory(x, init, parts, args.iters)
        verified = all(np.array_equal(a, b) for a, b in zip(ref, centroids))
        if not verified:
            raise SystemExit("recovery: the centroids differ from the serial run")

    f = args.fail_at - 1
    normal = statistics.median(times[1:f])
    after = statistics.median(times[f + 1:])
    print(f"normal {normal:.3f} s (median of iterations 2..{f}), failure {times[f]:.3f} s, "
          f"after {after:.3f} s (median of {args.fail_at + 1}..{args.iters}) -> after/normal {after / normal:.2f} "
          f"(target <= 1.3); workers lost {recovery['workers_lost']}, replaced {recovery['workers_replaced']}, "
          f"tasks re-run {recovery['tasks_rerun']}")
    out = {
        "bench": "recovery", "normal_iter_s": round(normal, 4),
        "failure_iter_s": round(times[f], 4), "after_iter_s": round(after, 4),
        "after_ratio": round(after / normal, 3), "failure_ratio": round(times[f] / normal, 3),
        "iter_s": [round(v, 4) for v in times], "workers_live": [r["workers"] for r in rows],
        "faults": [r["faults"] for r in rows],
        "driver_mib": [round(r["driver_mib"], 1) for r in rows],
        "peer_mib": [round(r["peer_mib"], 1) for r in rows], "killed": len(killed), "points": n,
        "workers": w, "partitions": parts, "fail_at": args.fail_at, "hosts": 1, "rate": None,
        **{k: recovery[k] for k in ("workers_lost", "workers_replaced", "tasks_rerun", "recovery_jobs",
                                    "speculative_copies")},
        "verified": verified,
    }
    json_line(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
