"""Command line: ``clamor demo [geo|pages]`` and ``clamor worker --driver ENDPOINT``.

``clamor demo`` with no name runs ``geo`` (clamor/geo.py): k-d tree queries
over real places, against a single-process run.  ``pages`` is the first
demo: random lookups into a 1 GiB array.
"""
import argparse
import sys
import time


def _demo(args):
    import numpy as np

    import clamor
    from clamor.tasks import TaskServer

    n = (args.mib << 20) // 8
    print(f"driver: building a {args.mib} MiB array in the region ...", flush=True)
    table = clamor.empty((n,), np.float64)
    table[:] = np.arange(n, dtype=np.float64)
    table *= 0.5
    rng = np.random.default_rng(1)
    queries = [rng.integers(0, n, args.lookups // args.workers) for _ in range(args.workers)]
    expect = [float(table[q].sum()) for q in queries]

    def lookup(ref, idx):
        x = ref.get()
        s = float(x[idx].sum())
        return s, clamor.stats()

    with TaskServer() as ts:
        ts.fork(args.workers)
        t0 = time.perf_counter()
        out = ts.gather([(w, lookup, (clamor.ref(table), queries[w]), {}) for w in range(args.workers)])
        dt = time.perf_counter() - t0
    ok = all(got == want for (got, _), want in zip(out, expect))
    moved = sum(st["bytes_fetched"] for _, st in out)
    faults = sum(st["faults"] for _, st in out)
    print(f"{args.workers} workers made {args.lookups} random lookups into {args.mib} MiB in {dt:.2f} s")
    print(f"faults: {faults}, bytes moved: {moved / 2**20:.1f} MiB "
          f"({100 * moved / (table.nbytes * args.workers):.1f}% of broadcasting the array to every worker)")
    print("result matches the driver's:", "yes" if ok else "NO")
    return 0 if ok else 1


DEMOS = ("geo", "pages")


def _geo(args, ap):
    from clamor import geo

    geo.quick(args)
    if args.workers < 1 or args.queries < 1 or args.scale < 1 or args.radius_km <= 0 or \
            (args.partitions is not None and args.partitions < 1):
        ap.error("--workers, --queries, --scale, --radius-km and --partitions must be positive")
    return geo.demo(args)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # "clamor demo" and "clamor demo --quick" mean the geo demo
    if argv[:1] == ["demo"] and (len(argv) == 1 or argv[1] not in DEMOS + ("-h", "--help")):
        argv.insert(1, "geo")
    ap = argparse.ArgumentParser(prog="clamor", description="clamor: global variables paged in over ZeroMQ")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run a demo job (default: geo)")
    demos = d.add_subparsers(dest="demo", required=True)
    g = demos.add_parser("geo", help="k-d tree geo queries over real places (the default demo)")
    if argv[:1] == ["demo"]:  # clamor.geo imports scipy: not for "clamor worker"
        from clamor.geo import add_arguments

        add_arguments(g)
    pg = demos.add_parser("pages", help="random lookups into a 1 GiB region array")
    pg.add_argument("--workers", type=int, default=2)
    pg.add_argument("--mib", type=int, default=1024, help="size of the global array")
    pg.add_argument("--lookups", type=int, default=4000)
    w = sub.add_parser("worker", help="run a worker: clamor worker --driver tcp://HOST:PORT")
    w.add_argument("--driver", required=True)
    w.add_argument("--base", default=None)
    w.add_argument("--connect-timeout", default=None,
                   help="seconds to wait for the driver (default CLAMOR_CONNECT_TIMEOUT, else 30)")
    args = ap.parse_args(argv)
    if args.cmd == "demo" and args.demo == "geo":
        return _geo(args, g)
    if args.cmd == "demo":
        if args.workers < 1 or args.mib < 1 or args.lookups < args.workers:
            pg.error("--workers, --mib and --lookups must be positive (lookups >= workers)")
        return _demo(args)
    from clamor import worker

    argv = ["--driver", args.driver]
    for flag, value in (("--base", args.base), ("--connect-timeout", args.connect_timeout)):
        if value is not None:
            argv += [flag, value]
    return worker.main(argv)


if __name__ == "__main__":
    sys.exit(main())
