#!/usr/bin/env python3
"""Big Python object graphs: share(), a first stage and a stage after a
one-entry change, against one pickle of the same object.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"objects.py".
"""
import contextlib
import os
import pickle
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("PYTHONHASHSEED") != "0":     # str keys hash alike on spawned workers
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, "PYTHONHASHSEED": "0"})
# spawned workers import the classes by name, as a user's workers import their module
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))

import _harness  # noqa: E402
from _harness import json_line, parser  # noqa: E402
from _records import Plain, Rec  # noqa: E402

SHAPES = ("dict_int", "dict_str", "list_plain", "list_dc")
READS = 64


def build(shape, n):
    """The object of ``shape`` with ``n`` entries, and its object count."""
    if shape == "dict_int":
        return {i: (i, "s" + str(i)) for i in range(n)}, 3 * n + 1
    if shape == "dict_str":
        return {"k" + str(i): "v" + str(i) for i in range(n)}, 2 * n + 1
    cls = Plain if shape == "list_plain" else Rec
    return [cls(i, "n" + str(i), i / 2) for i in range(n)], 4 * n + 1


def keys_of(shape, n):
    step = max(1, n // READS)
    idx = list(range(0, n, step))[:READS]
    return ["k" + str(i) for i in idx] if shape == "dict_str" else idx


def read(shape, obj, keys):
    """What a task returns: the entries at ``keys`` (runs on the workers)."""
    if shape.startswith("dict"):
        return [obj[k] for k in keys]
    return [(r.id, r.name, r.score) for r in (obj[k] for k in keys)]


def change(clamor, shape, obj, n):
    """One entry changed by the driver, in a block; the key it changed."""
    with clamor.heap():
        if shape == "dict_int":
            obj[n // 2] = (-1, "changed" + str(n))
            return n // 2
        if shape == "dict_str":
            obj["k" + str(n // 2)] = "changed" + str(n)
            return "k" + str(n // 2)
        obj[n // 2].score = -float(n)
        return n // 2


def stage(cl, workers, shape, obj, keys):
    t0 = time.perf_counter()
    got = cl.parallelize(range(workers), workers).map(lambda _: read(shape, obj, keys)).collect()
    return time.perf_counter() - t0, got


@contextlib.contextmanager
def cluster(clamor, mode, args):
    """(the Cluster of ``mode``, its links' counters): forked or spawned
    workers on this host (no links), or (hosts) one worker per namespace
    host, started there as docs/hosts.md says (not forked: it relocates),
    links at ``--rate``."""
    if mode != "hosts":
        with clamor.Cluster(workers=args.workers, start_method=mode, progress=None, max_attempts=2) as cl:
            yield cl, _harness.Links(None)
        return
    with _harness.hosts_for(args.workers, args.rate) as hosts, \
            _harness.start("clamor", args.workers, hosts, progress=None, max_attempts=2) as cl:
        yield cl, _harness.Links(hosts)


def run_mode(clamor, mode, objs, args):
    out = {}
    with cluster(clamor, mode, args) as (cl, links):
        cl.run(lambda: None)     # the workers exist
        for shape, (obj, count, n, pickle_s) in objs.items():
            rec = out[shape] = {"entries": n, "objects": count, "pickle_s": pickle_s}
            t0 = time.perf_counter()
            clamor.share(obj, portable=mode != "fork")
            rec["check_s"] = time.perf_counter() - t0
            keys = keys_of(shape, n)
            kept0 = cl.stats()["checks"]
            try:
                wire = links.bytes()
                rec["first_stage_s"], got = stage(cl, args.workers, shape, obj, keys)
                if wire is not None:    # (on hosts: what crossed the links for the first stage, all workers)
                    rec["first_stage_link_bytes"] = links.bytes() - wire
                kept = cl.stats()["checks"]     # (what the first stage's check added)
                visited = kept["objects"] - kept0["objects"]
                rec["bytes_per_object"] = (kept["bytes"] - kept0["bytes"]) / visited if visited > 0 else None
                rec["first_equal"] = got == [read(shape, obj, keys)] * args.workers
                t0 = time.perf_counter()
                k = change(clamor, shape, obj, n)
                rec["change_block_s"] = time.perf_counter() - t0     # (the block itself, apart from the stage)
                keys = keys + [k]
                rec["changed_stage_s"], got = stage(cl, args.workers, shape, obj, keys)
                rec["changed_equal"] = got == [read(shape, obj, keys)] * args.workers
            except clamor.ClamorError as e:
                rec["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            for key in ("check", "first_stage", "changed_stage"):
                if f"{key}_s" in rec:
                    rec[f"{key}_vs_pickle"] = rec[f"{key}_s"] / pickle_s
            rec["objects_per_s"] = count / rec["check_s"]
            print(f"  {mode:5} {shape:10} {n:>10,}: pickle {pickle_s:7.3f} s  share {rec['check_s']:7.3f} s "
                  f"({rec['objects_per_s'] / 1e6:.2f} M objects/s)  first stage "
                  f"{rec.get('first_stage_s', float('nan')):7.3f} s  changed {rec.get('changed_stage_s', float('nan')):7.3f} s"
                  f" (its block {rec.get('change_block_s', float('nan')):.3f} s)"
                  f"  kept {rec.get('bytes_per_object') or float('nan'):.1f} B/object"
                  + (f"  link {rec['first_stage_link_bytes'] / 2**20:.1f} MiB" if "first_stage_link_bytes" in rec else "")
                  + (f"  FAILED {rec['failed']}" if "failed" in rec else "")
                  + ("" if rec.get("first_equal", True) and rec.get("changed_equal", True) else "  answers DIFFER"),
                  flush=True)
    return out


def share_before_cluster(clamor, shape, n, pickle_s):
    """share() of a second object of ``shape``, before any Cluster: nothing
    outside the region is inherited yet (a class's attribute names are
    copied in).  The object is dropped afterwards."""
    with clamor.heap():
        obj, count = build(shape, n)
    t0 = time.perf_counter()
    clamor.share(obj)
    check_s = time.perf_counter() - t0
    print(f"  before any Cluster, {shape:10} {n:>10,}: share {check_s:7.3f} s ({count / check_s / 1e6:.2f} M "
          f"objects/s), {check_s / pickle_s:.2f}x pickle", flush=True)
    return {"check_s": check_s, "check_vs_pickle": check_s / pickle_s, "objects_per_s": count / check_s}


def main():
    ap = parser(__doc__.split("\n")[0], "dicts of 10^6 entries, lists of 10^5", "dicts of 10^4 entries, lists of 10^3")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="fork,spawn",
                    help="kinds of worker, of fork, spawn and hosts (one worker per namespace host)")
    ap.add_argument("--rate", default="1gbit", help="with --modes hosts: each host's link, both ways (tc notation)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="of " + ", ".join(SHAPES))
    args = ap.parse_args()
    modes, shapes = args.modes.split(","), args.shapes.split(",")
    if set(modes) - {"fork", "spawn", "hosts"} or set(shapes) - set(SHAPES) or args.workers < 1:
        ap.error("--modes names fork, spawn and hosts, --shapes the shapes above, --workers is positive")
    dict_n, list_n = (10 ** 4, 10 ** 3) if args.smoke else (10 ** 6, 10 ** 5) if args.quick else (10 ** 7, 10 ** 6)

    import clamor

    objs, pickled = {}, {}
    for shape in shapes:
        n = dict_n if shape.startswith("dict") else list_n
        with clamor.heap():
            obj, count = build(shape, n)
        # A pickle of an instance makes its dict (CPython 3.11+), outside
        # the region, which the object shared would then carry: instances
        # are pickled as a twin built alike outside the region, dicts as
        # they are.
        twin = build(shape, n)[0] if shape.startswith("list") else obj
        t0 = time.perf_counter()
        pickled[shape] = len(pickle.dumps(twin, protocol=pickle.HIGHEST_PROTOCOL))
        objs[shape] = (obj, count, n, time.perf_counter() - t0)
        del twin
    print(f"objects: {', '.join(f'{s} {v[2]:,}' for s, v in objs.items())}; {args.workers} workers; "
          f"region {clamor.heap_stats()['allocated'] / 2**20:.0f} MiB", flush=True)
    before = {shape: share_before_cluster(clamor, shape, n, pickle_s) for shape, (_, _, n, pickle_s) in objs.items()}
    runs = {mode: run_mode(clamor, mode, objs, args) for mode in modes}

    bad = [f"{m} {s}" for m, r in runs.items() for s, x in r.items()
           if not (x.get("first_equal", True) and x.get("changed_equal", True))]
    figures = {"bench": "objects", "workers": args.workers, "runs": runs, "answers_equal": not bad,
               "before_cluster": before, "pickle_bytes": pickled, "rate": args.rate if "hosts" in modes else None}
    worst = max((x["check_vs_pickle"], s) for s, x in before.items())
    figures["check_before_cluster_vs_pickle"], figures["check_before_cluster_vs_pickle_worst"] = worst
    for key in ("check_vs_pickle", "first_stage_vs_pickle", "changed_stage_vs_pickle"):
        vals = [(x[key], f"{m} {s}") for m, r in runs.items() for s, x in r.items() if key in x]
        if vals:
            worst = max(vals)
            figures[key] = worst[0]
            figures[key + "_worst"] = worst[1]
    figures["failed"] = [f"{m} {s}" for m, r in runs.items() for s, x in r.items() if "failed" in x]
    figures["objects_per_s_min"] = min(x["objects_per_s"] for r in runs.values() for x in r.values())
    kept = [x["bytes_per_object"] for r in runs.values() for x in r.values() if x.get("bytes_per_object")]
    figures["bytes_per_object_max"] = max(kept) if kept else None
    json_line(figures)
    if bad:
        print("objects: answers differ: " + ", ".join(bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
