"""``clamor demo pages``: random lookups into a large region array, read by
workers one page at a time, against the driver's own sums."""
import time


def demo(args):
    import numpy as np

    import clamor

    n = (args.mib << 20) // 8
    print(f"driver: building a {args.mib} MiB array in the region ...", flush=True)
    table = clamor.empty((n,), np.float64)
    table[:] = np.arange(n, dtype=np.float64)
    table *= 0.5
    rng = np.random.default_rng(1)
    queries = [rng.integers(0, n, args.lookups // args.workers) for _ in range(args.workers)]
    expect = [float(table[q].sum()) for q in queries]

    # speculation off: every lookup runs once, so the counts below are what
    # the lookups themselves moved
    with clamor.Cluster(workers=args.workers, progress=False, speculation=False) as cl:
        t0 = time.perf_counter()
        # one partition of queries per worker; the closure ships the table's
        # address, and each worker faults in the pages its lookups touch
        out = cl.parallelize(queries, partitions=args.workers).map(lambda q: float(table[q].sum())).collect()
        dt = time.perf_counter() - t0
        st = cl.stats()
    ok = out == expect
    moved = st["bytes_from_driver"] + st["bytes_from_peers"]
    print(f"{args.workers} workers made {args.lookups} random lookups into {args.mib} MiB in {dt:.2f} s")
    print(f"faults: {st['faults']}, bytes moved: {moved / 2**20:.1f} MiB "
          f"({100 * moved / (table.nbytes * args.workers):.1f}% of broadcasting the array to every worker)")
    print("result matches the driver's:", "yes" if ok else "NO")
    return 0 if ok else 1
