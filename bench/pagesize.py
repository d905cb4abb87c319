#!/usr/bin/env python3
"""Which page size: sparse random reads against sequential scans.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"pagesize.py".
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _common import GIB, KIB, MIB, array_pages, die_with_parent, ensure_built, exact_array, human, parse_size
from _harness import json_line, last_json_line, parser

SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 2 * MIB, 4 * MIB]
TIE = 0.10
W_RANDOM, W_SCAN, W_NOAHEAD = 0.5, 0.25, 0.25


# ---- on the worker -----------------------------------------------------------

def _drop_all(x):
    from clamor import region

    region.drop_pages(*array_pages(x))


def random_task(ref, idx):
    import time

    import clamor

    x = ref.get()
    _drop_all(x)
    clamor.reset_stats()
    s = 0.0
    t = time.perf_counter()
    for i in idx:
        s += x[i]
    dt = time.perf_counter() - t
    return {"sum": float(s), "s": dt, "stats": clamor.stats()}


def scan_task(ref, nbytes, readahead=None):
    import time

    import clamor
    from clamor import region

    if readahead is not None:
        region.configure(readahead=readahead)
    x = ref.get()
    _drop_all(x)
    clamor.reset_stats()
    n = nbytes // x.itemsize
    t = time.perf_counter()
    s = float(x[:n].sum())
    dt = time.perf_counter() - t
    return {"sum": s, "s": dt, "stats": clamor.stats()}


# ---- one page size, in its own driver process ------------------------------------------

def run_one(page_size, array_bytes, scan_bytes, noahead_bytes, accesses, seed):
    """Returns a dict of figures for one page size (runs in a subprocess)."""
    import numpy as np

    import clamor
    from clamor import region

    region.init(page_size=page_size)
    n = array_bytes // 8
    a = exact_array(clamor, n)
    idx = np.random.default_rng(seed).integers(0, n, accesses).tolist()
    want_random = 0.0
    for i in idx:
        want_random += a[i]
    want_scan = float(a[:scan_bytes // 8].sum())
    want_noahead = float(a[:noahead_bytes // 8].sum())
    ref = clamor.ref(a)
    with clamor.Cluster(workers=1, start_method="spawn", progress=False, speculation=False) as cl:
        r = cl.run(random_task, ref, idx)[0]
        s = cl.run(scan_task, ref, scan_bytes)[0]
        z = cl.run(scan_task, ref, noahead_bytes, 0)[0]
    if r["sum"] != float(want_random) or s["sum"] != want_scan or z["sum"] != want_noahead:
        raise SystemExit(f"pagesize: wrong result at page {page_size}: random {r['sum']} vs {want_random}, "
                         f"scan {s['sum']} vs {want_scan}, no read-ahead {z['sum']} vs {want_noahead}")
    rs, ss = r["stats"], s["stats"]
    return {
        "page_size": page_size, "random_us": r["s"] / accesses * 1e6,
        "random_bytes": rs["bytes_fetched"], "amplification": rs["bytes_fetched"] / (accesses * 8),
        "random_faults": rs["faults"], "random_fetch_p50_us": rs["fetch_p50_us"],
        "scan_gbps": scan_bytes / s["s"] / 1e9, "scan_fetched": ss["bytes_fetched"],
        "scan_faults": ss["faults"], "scan_requests": ss["fetch_requests"],
        "scan_errors": ss["fetch_errors"], "noahead_gbps": noahead_bytes / z["s"] / 1e9,
        "noahead_faults": z["stats"]["faults"],
    }


def child(args):
    die_with_parent()
    ensure_built(False)
    out = run_one(args.page, args.array, args.scan, args.noahead, args.accesses, args.seed)
    print(json.dumps(out), flush=True)     # to the parent only: bench/results gets the parent's figures
    return 0


# ---- the parent ----------------------------------------------------------------------------

def measure(page, array, scan, noahead, accesses, seed):
    cmd = [sys.executable, os.path.abspath(__file__), "--_one", "--page", str(page), "--array", str(array),
           "--scan", str(scan), "--scan-noahead", str(noahead), "--accesses", str(accesses), "--seed", str(seed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"pagesize: the run for page size {page} failed (exit {proc.returncode})")
    return last_json_line(out)


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], "512 MiB array, 256 MiB scan, 32 MiB without read-ahead, 500 accesses, 1 "
                "round", "sizes 64K and 1M only, 32 MiB array, 16 MiB scan, 8 MiB without read-ahead, 50 accesses, 1 "
                "round (seconds; the tests run it)", build=True)
    ap.add_argument("--sizes", default=None, help="comma-separated page sizes (default 4K..4M)")
    ap.add_argument("--array", type=parse_size, default=None, help="array bytes (default 2G, quick 512M)")
    ap.add_argument("--scan", type=parse_size, default=None, help="bytes scanned (default 1G, quick 256M)")
    ap.add_argument("--scan-noahead", dest="noahead", type=parse_size, default=None,
                    help="bytes scanned with read-ahead off (default 128M, quick 32M)")
    ap.add_argument("--accesses", type=int, default=None, help="random reads K (default 2000, quick 500)")
    ap.add_argument("--reps", type=int, default=None, help="rounds over all sizes (default 2, quick 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--_one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--page", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._one:
        return child(args)

    sm = args.smoke
    sizes = [parse_size(s) for s in (args.sizes or ("64K,1M" if sm else "")).split(",") if s] or SIZES
    array = args.array or (32 * MIB if sm else 512 * MIB if args.quick else 2 * GIB)
    scan = min(args.scan or (16 * MIB if sm else 256 * MIB if args.quick else GIB), array)
    noahead = min(args.noahead or (8 * MIB if sm else 32 * MIB if args.quick else 128 * MIB), array)
    accesses = args.accesses or (50 if sm else 500 if args.quick else 2000)
    reps = args.reps or (1 if sm or args.quick else 2)
    ensure_built(not args.no_build)
    print(f"pagesize: {human(array)} array, {accesses} random 8-byte reads (one per "
          f"{array // accesses // KIB} KiB of array), {human(scan)} scan, {human(noahead)} scan without "
          f"read-ahead, {reps} round(s), sizes "
          f"{', '.join(human(p) for p in sizes)}", flush=True)
    runs = {p: [] for p in sizes}
    t0 = time.monotonic()
    for r in range(reps):
        order = sizes if r % 2 == 0 else sizes[::-1]
        for p in order:
            res = measure(p, array, scan, noahead, accesses, args.seed + r)
            runs[p].append(res)
            print(f"  round {r} page {human(p):>7}: random {res['random_us']:8.0f} us/access "
                  f"(x{res['amplification']:.0f} bytes), scan {res['scan_gbps']:.2f} GB/s, "
                  f"no read-ahead {res['noahead_gbps']:.3f} GB/s", flush=True)

    rows = []
    for p in sizes:
        rs = runs[p]
        m = {k: statistics.median(x[k] for x in rs) for k in ("random_us", "amplification", "random_fetch_p50_us",
                                                              "scan_gbps", "noahead_gbps")}
        rows.append({"page_size": p, **m, "random_mb": statistics.median(x["random_bytes"] for x in rs) / 1e6,
                     "scan_mb": statistics.median(x["scan_fetched"] for x in rs) / 1e6,
                     "scan_faults": rs[-1]["scan_faults"], "scan_requests": rs[-1]["scan_requests"]})
    best_r = min(rows, key=lambda x: x["random_us"])
    best_s = max(rows, key=lambda x: x["scan_gbps"])
    best_z = max(rows, key=lambda x: x["noahead_gbps"])
    for x in rows:
        x["score"] = ((x["random_us"] / best_r["random_us"]) ** W_RANDOM
                      * (best_s["scan_gbps"] / x["scan_gbps"]) ** W_SCAN
                      * (best_z["noahead_gbps"] / x["noahead_gbps"]) ** W_NOAHEAD)
    rec = min(rows, key=lambda x: x["score"])
    close = [x["page_size"] for x in rows if x["score"] <= rec["score"] * (1 + TIE)]

    print(f"\n{'page':>8} {'random us':>10} {'bytes/useful':>12} {'MB moved':>9} {'fetch p50':>10} "
          f"{'scan GB/s':>10} {'MB moved':>9} {'faults':>7} {'reqs':>6} {'no-RA GB/s':>10} {'score':>6}")
    for x in rows:
        mark = "  <- recommended" if x is rec else ""
        print(f"{human(x['page_size']):>8} {x['random_us']:>10.0f} {x['amplification']:>12.0f} "
              f"{x['random_mb']:>9.1f} {x['random_fetch_p50_us']:>8.0f}us {x['scan_gbps']:>10.2f} {x['scan_mb']:>9.0f} "
              f"{x['scan_faults']:>7} {x['scan_requests']:>6} {x['noahead_gbps']:>10.3f} {x['score']:>6.2f}{mark}")
    print(f"best random: {human(best_r['page_size'])}; best scan: {human(best_s['page_size'])}; best scan "
          f"without read-ahead: {human(best_z['page_size'])}; "
          f"recommended: {human(rec['page_size'])}; within {TIE:.0%} of its score: "
          f"{', '.join(human(p) for p in close)} ({time.monotonic() - t0:.0f} s)")
    out = {
        "bench": "pagesize", "best_random_page": best_r["page_size"],
        "best_scan_page": best_s["page_size"], "best_noahead_page": best_z["page_size"],
        "recommended_page_size": rec["page_size"], "close": close, "array_bytes": array,
        "scan_bytes": scan, "noahead_bytes": noahead, "accesses": accesses, "reps": reps,
        "rule": "lowest (random slowdown)^0.5 * (scan slowdown)^0.25 * (no-read-ahead scan slowdown)^0.25; "
                "close: within 10% of it",
        "sizes": {str(x["page_size"]): {"random_us": round(x["random_us"], 1),
                                        "amplification": round(x["amplification"], 1),
                                        "scan_gbps": round(x["scan_gbps"], 3),
                                        "scan_mb_moved": round(x["scan_mb"], 1),
                                        "noahead_gbps": round(x["noahead_gbps"], 3),
                                        "score": round(x["score"], 3)} for x in rows},
    }
    json_line(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
