"""Command line: ``clamor demo`` and ``clamor worker --driver ENDPOINT``."""
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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="clamor", description="clamor: global variables paged in over ZeroMQ")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run a demo job")
    d.add_argument("--workers", type=int, default=2)
    d.add_argument("--mib", type=int, default=1024, help="size of the global array")
    d.add_argument("--lookups", type=int, default=4000)
    w = sub.add_parser("worker", help="run a worker: clamor worker --driver tcp://HOST:PORT")
    w.add_argument("--driver", required=True)
    w.add_argument("--base", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        if args.workers < 1 or args.mib < 1 or args.lookups < args.workers:
            ap.error("--workers, --mib and --lookups must be positive (lookups >= workers)")
        return _demo(args)
    from clamor import worker

    return worker.main(["--driver", args.driver] + (["--base", args.base] if args.base else []))


if __name__ == "__main__":
    sys.exit(main())
