"""What clamor.heap()'s malloc interposition costs outside the block.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"malloc_overhead.py".
"""
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _harness import json_line, parser

SRC = r"""
#include <stdlib.h>
#include <stdint.h>
uint64_t churn(uint64_t n, uint64_t size) {
    uint64_t acc = 0;
    void *keep[64] = {0};
    for (uint64_t i = 0; i < n; i++) {
        unsigned k = (unsigned)(i * 2654435761u) & 63;
        free(keep[k]);
        keep[k] = malloc(size + (i & 31) * 8);
        acc += (uintptr_t)keep[k] & 0xff;
    }
    for (int k = 0; k < 64; k++) free(keep[k]);
    return acc;
}
"""


def main():
    ap = parser(__doc__.splitlines()[0] if __doc__ else None, "200,000 pairs x 5 runs", "20,000 pairs x 3 runs (the "
                "tests run it)")
    args = ap.parse_args()
    n = 20_000 if args.smoke else 200_000 if args.quick else 2_000_000
    reps = 3 if args.smoke else 5 if args.quick else 9
    with tempfile.TemporaryDirectory(prefix="malloc-overhead-") as d:
        run(d, n, reps)


def run(d, n, reps):
    with open(os.path.join(d, "churn.c"), "w") as f:
        f.write(SRC)
    so = os.path.join(d, "libchurn.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, os.path.join(d, "churn.c")], check=True)
    lib = ctypes.CDLL(so)
    lib.churn.restype = ctypes.c_uint64
    lib.churn.argtypes = [ctypes.c_uint64, ctypes.c_uint64]

    import clamor
    from clamor import region
    from clamor._native import lib as core

    region.init(size=16 << 30)

    def timed():
        t = time.perf_counter()
        lib.churn(n, 64)
        return (time.perf_counter() - t) / n * 1e9

    before, after, inside = [], [], []
    timed()  # warm up
    for r in range(reps):
        before.append(timed())
    core.clamor_interpose_refresh()  # what clamor.heap() does first
    slots = int(core.clamor_interpose_slots())
    for r in range(reps):
        after.append(timed())
        with clamor.heap():
            inside.append(timed())
    b, a, i = statistics.median(before), statistics.median(after), statistics.median(inside)
    print(f"malloc+free through a library's GOT, {n} pairs x {reps} runs (ns per pair, medians)")
    print(f"  glibc, not patched            {b:8.1f}")
    print(f"  patched, outside heap()       {a:8.1f}   ratio {a / b:.3f}")
    print(f"  patched, inside heap()        {i:8.1f}   (region allocator)")
    json_line({"bench": "malloc_overhead", "pairs": n, "reps": reps, "glibc_ns": round(b, 2),
               "outside_heap_ns": round(a, 2), "inside_heap_ns": round(i, 2),
               "overhead_ratio": round(a / b, 4), "patched_slots": slots})


if __name__ == "__main__":
    sys.exit(main())
