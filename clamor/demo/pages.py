"""``clamor demo pages``: random lookups into a large region array, read by
workers one page at a time, against the driver's own sums."""
import time


def demo(args):
    import numpy as np

    import clamor
    from clamor.runtime.tasks import TaskServer

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
