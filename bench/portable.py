#!/usr/bin/env python3
"""Portable region objects: geo k-NN on spawned workers against forked ones.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"portable.py".
"""
import statistics
import sys
import time

from _common import human, parse_size
from _harness import json_line, med, parser
from clamor.demo import geo

MODES = ("fork", "spawn")


def reloc_stats():
    """A worker's relocation and fetch counters (runs on the worker; a
    function of this script, so a spawned worker gets it by value)."""
    import clamor

    st = clamor.memory.region.stats()
    return {k: st[k] for k in ("pages_fetched", "faults", "reloc_pages", "reloc_words", "reloc_bytes")}


def imports():
    """What a task of this workload imports (runs on the worker): a spawned
    worker does it on its first task, a forked one has it already."""
    import scipy.spatial  # noqa: F401

    import clamor.demo.geo  # noqa: F401


def run_mode(clamor, mode, args, tree, meta, queries, ref):
    """One cluster of ``mode``: the imports, a cold stage, then
    ``args.reps`` warm ones.  Returns the figures of this cluster."""
    from clamor.memory import portable

    cost = portable.driver().cost
    t0 = time.perf_counter()
    with clamor.Cluster(workers=args.workers, start_method=mode, progress=None) as cl:
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cl.run(imports)
        imports_s = time.perf_counter() - t0
        stages = []
        for _ in range(args.reps + 1):
            before = dict(cost)
            t0 = time.perf_counter()
            parts = cl.parallelize(queries, partitions=args.partitions) \
                .map_partitions(lambda part: geo.answer_part(tree, meta, part)).collect()
            s = time.perf_counter() - t0
            st = cl.stage_stats()[-1]
            walks = cost["walks"] - before["walks"]
            stages.append({
                "s": s, "bad": geo.check_equal(ref, geo.concat(parts)), "faults": st["faults"],
                "bytes": st["bytes_from_driver"] + st["bytes_from_peers"], "stage_s": st["duration_s"],
                "walks": walks, "walk_s": cost["seconds"] - before["seconds"],
                "walked_pages": cost["walked_pages"] - before["walked_pages"],
            })
        workers = cl.run(reloc_stats)
        lists = {"pages": cost["pages"], "entries": cost["entries"]}   # (the lists go with the cluster)
    return {"start_s": start_s, "imports_s": imports_s, "cold": stages[0], "warm": stages[1:],
            "bad": sum(x["bad"] for x in stages), "workers": workers, "lists": lists}


def main():
    ap = parser(__doc__.split("\n")[0], "cities15000, 5,000 queries", "cities15000, 1,000 queries, 2 warm stages "
                "(seconds; the tests run it)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dataset", type=int, default=500, choices=geo.DATASETS)
    ap.add_argument("--scale", type=int, default=1, help="copies of every place (jittered)")
    ap.add_argument("--queries", type=int, default=50_000)
    ap.add_argument("--region", default="paris", choices=sorted(geo.REGIONS))
    ap.add_argument("--radius-km", type=float, default=100.0)
    ap.add_argument("--partitions", type=int, default=None, help="default: 4 per worker")
    ap.add_argument("--reps", type=int, default=5, help="warm stages per cluster (median)")
    ap.add_argument("--rounds", type=int, default=1, help="pairs of clusters, the order swapped each round")
    ap.add_argument("--page-size", type=parse_size, default=None, help="region page size, e.g. 64K "
                    "(default: clamor's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick or args.smoke:
        args.dataset, args.scale, args.queries = 15000, 1, min(args.queries, 1_000 if args.smoke else 5_000)
    if args.smoke:
        args.reps = min(args.reps, 2)
    args.partitions = args.partitions or 4 * args.workers
    if min(args.workers, args.scale, args.queries, args.reps, args.rounds) < 1:
        ap.error("--workers, --scale, --queries, --reps and --rounds must be positive")

    import clamor

    t_all = time.perf_counter()
    clamor.region.init(page_size=args.page_size)   # (the clusters find it mapped, with this page size)
    t0 = time.perf_counter()
    meta, tree = geo.build(clamor, args.dataset, args.scale, args.seed)
    n = len(meta)
    region_bytes = clamor.heap_stats()["allocated"]
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    clamor.share(tree, portable=True)
    check_s = time.perf_counter() - t0
    queries = geo.make_queries(args.queries, args.region, args.radius_km, seed=args.seed + 1)
    page = clamor.region.page_size()
    print(f"portable: {n:,} places ({args.scale} x cities{args.dataset}), region {region_bytes / 2**20:.1f} MiB "
          f"(records {meta.nbytes / 2**20:.1f} MiB, k-d tree {(region_bytes - meta.nbytes) / 2**20:.1f} MiB), "
          f"built in {build_s:.1f} s, share(portable=True) {check_s:.2f} s; {args.queries:,} queries within "
          f"{args.radius_km:g} km of {args.region}, {args.partitions} partitions; {args.workers} workers per "
          f"cluster; page size {human(page)}", flush=True)

    # the reference: one process, a plain scipy tree outside the region
    ref_tree = geo.build_tree(meta)
    t0 = time.perf_counter()
    ref = geo.answer(ref_tree, meta, queries)
    single_s = time.perf_counter() - t0
    del ref_tree

    runs = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            out = run_mode(clamor, mode, args, tree, meta, queries, ref)
            runs[mode].append(out)
            c, w = out["cold"], out["warm"]
            print(f"  round {r} {mode:5}: start {out['start_s']:5.2f} s  imports {out['imports_s']:5.2f} s  "
                  f"cold {c['s']:7.3f} s ({c['faults']:,} faults, {c['bytes'] / 2**20:.1f} MiB, walk "
                  f"{c['walk_s']:.3f} s)  warm " + " ".join(f"{x['s']:.3f}" for x in w)
                  + f" s ({sum(x['faults'] for x in w)} faults, {sum(x['walks'] for x in w)} walks "
                    f"{sum(x['walk_s'] for x in w):.3f} s)  answers "
                  + ("equal" if not out["bad"] else f"{out['bad']} DIFFER"), flush=True)

    def stages(mode, which=("cold", "warm")):
        return [x for o in runs[mode] for k in which for x in ([o[k]] if k == "cold" else o[k])]

    def total(mode, key, which=("cold", "warm")):
        return sum(x[key] for x in stages(mode, which))

    def wsum(mode, key):
        return sum(w[key] for o in runs[mode] for w in o["workers"])

    cold = {m: med(stages(m, ("cold",)), "s") for m in MODES}
    warm = {m: med(stages(m, ("warm",)), "s") for m in MODES}
    warm_stage = {m: med(stages(m, ("warm",)), "stage_s") for m in MODES}
    start = {m: statistics.median(o["start_s"] for o in runs[m]) for m in MODES}
    imps = {m: statistics.median(o["imports_s"] for o in runs[m]) for m in MODES}
    bad = {m: sum(o["bad"] for o in runs[m]) for m in MODES}
    fetched = wsum("spawn", "pages_fetched")
    walked = total("spawn", "walked_pages")
    walk_s = total("spawn", "walk_s")
    cost = runs["spawn"][-1]["lists"]
    # reloc_us_per_page: the driver's time to compute one page's relocation
    # list, i.e. its walks (every object the stage ships, read for words
    # that point out of the region, and the lists made of them) over the
    # region pages those walks read, summed over every walk of the spawned
    # clusters (a walk runs when a stage ships a new object or the driver
    # changed a page a list covers).
    reloc_us = 1e6 * walk_s / max(1, walked)
    reloc_bytes = wsum("spawn", "reloc_bytes") / max(1, fetched)
    with_relocs = wsum("spawn", "reloc_pages") / max(1, fetched)

    print()
    print(f"{'':16} {'start':>7} {'imports':>7} {'cold':>9} {'warm':>9} {'per query':>10} {'walks':>6} {'walk s':>7} "
          f"{'faults warm':>11} {'pages':>7} {'reloc pages':>11} {'reloc bytes':>11}")
    print(f"{'single process':16} {'-':>7} {'-':>7} {'-':>9} {single_s:8.3f}s {1e6 * single_s / args.queries:8.2f}us")
    for m in MODES:
        print(f"{m + ' (' + str(args.workers) + ')':16} {start[m]:6.2f}s {imps[m]:6.2f}s {cold[m]:8.3f}s "
              f"{warm[m]:8.3f}s {1e6 * warm[m] / args.queries:8.2f}us {total(m, 'walks'):6} "
              f"{total(m, 'walk_s'):7.3f} {total(m, 'faults', ('warm',)):11} {wsum(m, 'pages_fetched'):7} "
              f"{wsum(m, 'reloc_pages'):11} {wsum(m, 'reloc_bytes'):11}")
    print(f"spawn / fork: warm {warm['spawn'] / warm['fork']:.2f}x, cold {cold['spawn'] / cold['fork']:.2f}x; "
          f"relocations: {reloc_us:.0f} us per page walked ({walked} pages, {walk_s:.3f} s), "
          f"{reloc_bytes:.1f} bytes per page fetched, {with_relocs:.1%} of pages fetched had a list "
          f"(lists on {cost['pages']} pages, {cost['entries']} entries); answers "
          + ("equal" if not any(bad.values()) else f"DIFFER {bad}")
          + f"   [{time.perf_counter() - t_all:.0f} s in all]")
    ok = not any(bad.values())
    json_line({
        "bench": "portable", "hosts": 1, "workers": args.workers, "places": n, "queries": args.queries,
        "partitions": args.partitions, "reps": args.reps, "rounds": args.rounds, "page_size": page,
        "region_bytes": region_bytes, "build_s": round(build_s, 3), "share_check_s": round(check_s, 4),
        "single_s": round(single_s, 4),
        "fork_start_s": round(start["fork"], 3), "spawn_start_s": round(start["spawn"], 3),
        "fork_imports_s": round(imps["fork"], 3), "spawn_imports_s": round(imps["spawn"], 3),
        "fork_cold_s": round(cold["fork"], 4), "spawn_cold_s": round(cold["spawn"], 4),
        "fork_warm_s": round(warm["fork"], 4), "spawn_warm_s": round(warm["spawn"], 4),
        "fork_warm_s_all": [round(x["s"], 4) for o in runs["fork"] for x in o["warm"]],
        "spawn_warm_s_all": [round(x["s"], 4) for o in runs["spawn"] for x in o["warm"]],
        "fork_warm_stage_s": round(warm_stage["fork"], 4), "spawn_warm_stage_s": round(warm_stage["spawn"], 4),
        "fork_warm_faults": total("fork", "faults", ("warm",)),
        "spawn_warm_faults": total("spawn", "faults", ("warm",)),
        "spawn_cold_walk_s": round(total("spawn", "walk_s", ("cold",)), 4),
        "spawn_warm_walks": total("spawn", "walks", ("warm",)),
        "spawn_warm_walk_s": round(total("spawn", "walk_s", ("warm",)), 4),
        "fork_pages_fetched": wsum("fork", "pages_fetched"), "spawn_pages_fetched": fetched,
        "fork_reloc_pages": wsum("fork", "reloc_pages"),
        "reloc_pages": wsum("spawn", "reloc_pages"), "reloc_words": wsum("spawn", "reloc_words"),
        "reloc_bytes": wsum("spawn", "reloc_bytes"),
        "reloc_walks": total("spawn", "walks"), "reloc_walk_s": round(walk_s, 4), "reloc_walked_pages": walked,
        "reloc_lists": cost["pages"], "reloc_entries": cost["entries"],
        "answers_ok": ok,
        "portable_time_ratio": round(warm["spawn"] / warm["fork"], 3),
        "portable_cold_ratio": round(cold["spawn"] / cold["fork"], 3),
        "reloc_us_per_page": round(reloc_us, 1),
        "reloc_bytes_per_page": round(reloc_bytes, 2),
        "pages_with_relocs": round(with_relocs, 4),
    })
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
