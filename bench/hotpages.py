"""Dynamic replication on Zipf hash-table lookups (the paper's Fig. 3).

How to run it, what it compares and what its JSON line holds: bench/README.md,
"hotpages.py".
"""
import os
import resource
import sys
import tempfile
import time

import numpy as np

from _common import (cpu_s, hot_check, hot_counters, hot_round, hot_table, hot_task, policy_ratios, rotated,
                     same_host_modes)
from _harness import json_line, med, parser, ratio

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = ("off", "random", "two-choices")
RATE_ENV = "CLAMOR_SERVE_RATE"
# Replication shares pages that workers *fetch*; mapped pages never reach
# the driver's page server, so every cluster here fetches (see the docstring).
SAME_HOST = "fetch"
SAME_HOST_WHY = ("workers fetch every page from the driver or a peer, as on separate hosts; mapping the "
                 "driver's pages (clamor's default on one host) would leave no driver bytes to compare")


def run_policy(clamor, policy, args, task, keys, tasks, expect, table_bytes):
    """One stage of ``tasks`` tasks on a fresh cluster; returns a row."""
    drv0 = clamor.region.stats()
    kids0 = cpu_s(resource.RUSAGE_CHILDREN)
    with clamor.Cluster(workers=args.workers, replication=policy, progress=False, same_host=SAME_HOST) as cl:
        same_host_modes(cl, SAME_HOST, f"hotpages: {policy}")
        me0 = cpu_s()
        t = time.perf_counter()
        out = cl.parallelize(keys, partitions=tasks).map_partitions(task).collect()
        dt = time.perf_counter() - t
        me = cpu_s()
        st = cl.stats()
        drv = clamor.region.stats()
    kids = cpu_s(resource.RUSAGE_CHILDREN)   # the workers, reaped by close()
    hot_check(out, expect, f"hotpages: {policy}")
    rep = st["replication"]
    last = {o[2]: o for o in out}.values()   # each worker's last task: its counters
    return {"time_s": dt, **hot_counters(drv0, drv, st, args.workers, table_bytes),
            "peer_bytes_by_worker": sorted(rep["bytes_served_by_peer"].values(), reverse=True),
            "redirect_hit_rate": rep["redirect_hit_rate"], "peer_fallbacks": sum(o[5] for o in last),
            "evictions": sum(o[4] for o in last), "task_s_max": st["stages_detail"][-1]["task_s"]["max"],
            # CPU seconds, user + system: the driver during the stage, the
            # workers over their whole life (start-up is the same for every policy)
            "driver_cpu_s": me - me0, "workers_cpu_s": kids - kids0,
            "workers_used": len({o[2] for o in out})}


def mib(n):
    return n / (1 << 20)


def show(policy, r):
    print(f"  {policy:>12} {r['time_s']:8.2f} s  driver {mib(r['driver_bytes']):9.1f} MiB  "
          f"peers {mib(r['peer_bytes']):9.1f} MiB (received {mib(r['bytes_from_peers']):8.1f})  "
          f"redirects {r['redirects']:6d}  direct {r['direct_requests']:6d}  hints {mib(r['hint_bytes']):5.1f} MiB  hit {r['redirect_hit_rate']:5.3f}  table/worker {r['coverage']:4.2f}  "
          f"cpu s driver {r['driver_cpu_s']:5.2f} workers {r['workers_cpu_s']:5.2f}  "
          f"per worker served {[round(mib(b)) for b in r['peer_bytes_by_worker']]} MiB", flush=True)


def medians(rows):
    keys = ("time_s", "driver_bytes", "peer_bytes", "bytes_from_peers", "bytes_from_driver", "redirects",
            "direct_requests", "hint_bytes",
            "redirect_hit_rate", "peer_fallbacks", "evictions", "task_s_max", "coverage", "driver_cpu_s",
            "workers_cpu_s")
    return {k: med(rows, k) for k in keys} | {"runs": len(rows)}


def main(argv=None):
    ap = parser(__doc__.split("\n\n")[0], "128 MiB table, 8x fewer lookups", "4 MiB table, 2 workers, 500 lookups a "
                "task, one round, the rate-limited part at 200 MB/s (seconds; the tests run it)")
    ap.add_argument("--bits", type=int, help="log2 of the slot count, 16 bytes a slot (26; quick 23)")
    ap.add_argument("--load", type=float, default=0.5, help="fraction of slots holding a key")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lookups", type=int, help="lookups per task (50000; quick 6250)")
    ap.add_argument("--threads", type=int, default=8, help="C threads doing a task's lookups (fetches in flight)")
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the key ranks (> 1)")
    ap.add_argument("--reps", type=int, help="interleaved rounds over the policies (3)")
    ap.add_argument("--rate", type=float, default=100e6, help="bytes/s per page server in the bottleneck "
                    "part (0 skips it)")
    ap.add_argument("--rate-lookups", type=int, help="lookups per task under the rate limit")
    ap.add_argument("--page-size", type=int, help="region page size in bytes (default clamor's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed off stage before the rounds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.workers = 2 if args.workers == 4 else args.workers
        args.threads = 2 if args.threads == 8 else args.threads
        args.rate = 200e6 if args.rate == 100e6 else args.rate
    bits = args.bits or (18 if args.smoke else 23 if args.quick else 26)
    reps = args.reps or (1 if args.smoke else 3)
    lookups = args.lookups or (500 if args.smoke else 6250 if args.quick else 50000)
    rate_lookups = args.rate_lookups or lookups
    W, tasks = args.workers, 2 * args.workers
    if W < 2 or reps < 1 or not 0 < args.load < 1 or args.zipf <= 1:
        ap.error("need --workers >= 2, --reps >= 1, 0 < --load < 1 and --zipf > 1")
    if os.environ.get(RATE_ENV):
        ap.error(f"{RATE_ENV} is set in the environment; the script sets it itself for the rate-limited part")

    import clamor

    with tempfile.TemporaryDirectory(prefix="hotpages-") as tmp:
        clamor.region.init(page_size=args.page_size)
        psize = clamor.region.page_size()
        nkeys = int((1 << bits) * args.load)
        so_path, hp, addr, table_bytes, build_s = hot_table(clamor, tmp, bits, nkeys, "hotpages")
        print(f"hotpages: hash table of {1 << bits} slots ({mib(table_bytes):.0f} MiB, {nkeys} keys, "
              f"{table_bytes // psize} pages of {psize // 1024} KiB) built by C through clamor_malloc in "
              f"{build_s:.1f}s at {addr:#x}", flush=True)
        print(f"{W} workers, {tasks} tasks a stage x {lookups} Zipf({args.zipf}) lookups; a fresh cluster per "
              f"policy (workers start with no pages); {reps} round(s), policies interleaved", flush=True)
        print(f"same_host={SAME_HOST!r}: {SAME_HOST_WHY}", flush=True)
        task = hot_task(so_path, addr, args.threads)
        rng = np.random.default_rng(args.seed)

        warmup = None
        if not args.no_warmup:
            keys, expect = hot_round(hp, rng, args.zipf, nkeys, addr, tasks, lookups, "hotpages")
            print("warm-up (untimed, not in the figures):", flush=True)
            warmup = run_policy(clamor, "off", args, task, keys, tasks, expect, table_bytes)
            show("off", warmup)
        rows = {p: [] for p in POLICIES}
        for r in range(reps):
            keys, expect = hot_round(hp, rng, args.zipf, nkeys, addr, tasks, lookups, "hotpages")
            print(f"round {r}:", flush=True)
            for p in rotated(POLICIES, r):
                rows[p].append(run_policy(clamor, p, args, task, keys, tasks, expect, table_bytes))
                show(p, rows[p][-1])
        med = {p: medians(rows[p]) for p in POLICIES}
        best = min(POLICIES[1:], key=lambda p: med[p]["time_s"])
        off = med["off"]
        out = {"bench": "hotpages", "best_policy": best,
               "driver_bytes_ratio": ratio(med[best]["driver_bytes"], off["driver_bytes"], "driver_bytes_ratio"),
               "time_ratio": ratio(med[best]["time_s"], off["time_s"], "time_ratio"),
               "ratios": policy_ratios(med, POLICIES)}
        print("medians: " + "; ".join(f"{p} {med[p]['time_s']:.2f}s, driver {mib(med[p]['driver_bytes']):.0f} MiB, "
                                       f"peers {mib(med[p]['peer_bytes']):.0f} MiB" for p in POLICIES), flush=True)
        for p in POLICIES[1:]:
            print(f"{p}: driver bytes {out['ratios'][p]['driver_bytes_ratio']:.2f}x of off, "
                  f"time {out['ratios'][p]['time_ratio']:.2f}x, CPU (driver + workers) "
                  f"{out['ratios'][p]['cpu_ratio']:.2f}x", flush=True)
        print(f"best policy {best}: driver bytes {out['driver_bytes_ratio']:.2f}x of off (target <= 0.5), "
              f"time {out['time_ratio']:.2f}x of off (target <= 1.0)", flush=True)

        rate, rrows = {}, {}
        if args.rate > 0:
            # Every page server reads the variable when it starts: workers'
            # start in each new cluster, the driver's is restarted here.
            clamor.region.stop_serving()
            os.environ[RATE_ENV] = str(int(args.rate))
            try:
                print(f"rate-limited: {RATE_ENV}={int(args.rate)} (a token bucket in csrc/server.c: each page "
                      f"server, the driver's and every worker's, sends at most {args.rate / 1e6:.0f} MB/s); "
                      f"off against {best}, {rate_lookups} lookups a task", flush=True)
                rrows = {p: [] for p in ("off", best)}
                for r in range(reps):
                    keys, expect = hot_round(hp, rng, args.zipf, nkeys, addr, tasks, rate_lookups, "hotpages")
                    print(f"round {r}:", flush=True)
                    for p in rotated(("off", best), r):
                        rrows[p].append(run_policy(clamor, p, args, task, keys, tasks, expect, table_bytes))
                        show(p, rrows[p][-1])
            finally:
                del os.environ[RATE_ENV]
                clamor.region.stop_serving()    # the next cluster restarts it without the limit
            rate = {p: medians(v) for p, v in rrows.items()}
            out.update(rate_driver_bytes_ratio=ratio(rate[best]["driver_bytes"], rate["off"]["driver_bytes"],
                                                     "rate_driver_bytes_ratio"),
                       rate_time_ratio=ratio(rate[best]["time_s"], rate["off"]["time_s"], "rate_time_ratio"))
            print(f"under {args.rate / 1e6:.0f} MB/s per page server, {best}: driver bytes "
                  f"{out['rate_driver_bytes_ratio']:.2f}x of off, time {out['rate_time_ratio']:.2f}x of off "
                  f"({rate[best]['time_s']:.2f}s against {rate['off']['time_s']:.2f}s)", flush=True)

    out.update(policies=med, rate_limited=rate, rate_bytes_per_s=args.rate if args.rate > 0 else None,
               rate_mechanism=f"{RATE_ENV} token bucket in csrc/server.c" if args.rate > 0 else None,
               workers=W, tasks=tasks, lookups_per_task=lookups, rate_lookups_per_task=rate_lookups,
               zipf_a=args.zipf, slots=1 << bits, keys=nkeys, table_bytes=table_bytes, page_size=psize,
               build_s=build_s, reps=reps, threads=args.threads, runs=rows, rate_runs=rrows, warmup=warmup,
               same_host=SAME_HOST, same_host_why=SAME_HOST_WHY, smoke=args.smoke, quick=args.quick, verified=True)
    json_line(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
