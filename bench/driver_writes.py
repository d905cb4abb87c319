"""The driver's writes between stages under each write protection.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"driver_writes.py".
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _harness import json_line, parser

CHILD = r"""
import errno, json, os, pickle, sys, time
import numpy as np
import clamor
from clamor import region

pages, reps, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
region.init(size=8 << 30)
ps = region.page_size()
a = clamor.zeros(pages * ps // 8)
a[:] = 1.0
stage = 1
region.version_begin(stage)
first, begin, same = [], [], []
for r in range(reps + 1):
    t = time.perf_counter()
    a[:: ps // 8] += 1.0                    # one write per page: every page faults once
    first.append((time.perf_counter() - t) / pages * 1e6)
    stage += 1
    t = time.perf_counter()
    region.version_begin(stage)               # the written pages are protected again
    begin.append((time.perf_counter() - t) / pages * 1e6)
    region.versions_keep([stage])           # no task reads older stages: their locations are reused
    if r == 0:                              # the first round copies into fresh memory (twins): a warm-up
        first.pop(), begin.pop()
for r in range(reps):
    a[:: ps // 8] += 0.0                    # written, same bytes
    stage += 1
    t = time.perf_counter()
    region.version_begin(stage)               # found unchanged
    same.append((time.perf_counter() - t) / pages * 1e6)
    region.versions_keep([stage])
buf = clamor.zeros(1 << 17)                 # 1 MiB, made before the stage below
stage += 1
region.version_begin(stage)
with open(os.path.join(d, "raw"), "rb", buffering=0) as f:
    try:
        f.readinto(buf)
        syscall = "ok" if buf[-1] == 7.0 else "wrong bytes"
    except OSError as e:
        syscall = errno.errorcode.get(e.errno, str(e.errno))
loads = []
for r in range(reps):
    stage += 1
    region.version_begin(stage)
    t = time.perf_counter()
    with clamor.heap():
        x = np.load(os.path.join(d, "a.npy"))
        y = pickle.load(open(os.path.join(d, "p.pkl"), "rb"))
    loads.append((time.perf_counter() - t) * 1e3)
    assert float(x[-1]) == x.size - 1 and len(y) == 100000
    del x, y
wp = region.write_protection()
print(json.dumps({"mechanism": wp["mechanism"], "reason": wp["reason"], "first_write_us": first,
                  "stage_begin_us_per_page": begin,
                  "unchanged_begin_us_per_page": same, "readinto": syscall, "load_ms": loads}))
"""


def child(mode, pages, reps, d):
    env = {**os.environ, "CLAMOR_WRITE_PROTECT": mode}
    p = subprocess.run([sys.executable, "-c", CHILD, str(pages), str(reps), d], env=env, capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{mode}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = parser(__doc__.splitlines()[0], "1024 pages x 3 reps", "64 pages x 2 reps (the tests run it)")
    ap.add_argument("--pages", type=int, default=None, help="pages written per round (default 4096: 256 MiB)")
    ap.add_argument("--reps", type=int, default=None, help="rounds per mechanism (default 5)")
    args = ap.parse_args()
    pages = args.pages or (64 if args.smoke else 1024 if args.quick else 4096)
    reps = args.reps or (2 if args.smoke else 3 if args.quick else 5)
    import numpy as np
    import pickle

    with tempfile.TemporaryDirectory(prefix="driver-writes-") as d:
        np.save(os.path.join(d, "a.npy"), np.arange(1 << 20, dtype=np.float64))
        with open(os.path.join(d, "p.pkl"), "wb") as f:
            pickle.dump(list(range(100000)), f)
        with open(os.path.join(d, "raw"), "wb") as f:
            f.write(np.full(1 << 17, 7.0).tobytes())
        # alternate, so that both see the same load on this shared machine
        runs = {"userfaultfd": [], "mprotect": []}
        for _ in range(2 if not args.smoke else 1):
            for mode in ("mprotect", "auto"):
                out = child(mode, pages, reps, d)
                runs["userfaultfd" if out["mechanism"] == "userfaultfd" else "mprotect"].append(out)
    med = {}
    for mech, outs in runs.items():
        if outs:
            med[mech] = {k: round(statistics.median(v for o in outs for v in o[k]), 2)
                         for k in ("first_write_us", "stage_begin_us_per_page", "unchanged_begin_us_per_page", "load_ms")}
            med[mech]["readinto"] = outs[-1]["readinto"]
    print(f"{pages} pages of 64 KiB per round, {reps} rounds; medians")
    print(f"{'':14}{'first write':>12}{'begin, changed':>16}{'begin, unchanged':>18}{'heap() loads':>14}  readinto")
    print(f"{'':14}{'us/page':>12}{'us/page':>16}{'us/page':>18}{'ms':>14}")
    for mech, m in med.items():
        print(f"{mech:14}{m['first_write_us']:12.1f}{m['stage_begin_us_per_page']:16.2f}"
              f"{m['unchanged_begin_us_per_page']:18.2f}{m['load_ms']:14.1f}  {m['readinto']}")
    uffd = med.get("userfaultfd")
    if not uffd:
        reason = runs["mprotect"][-1]["reason"]
        print(f"userfaultfd did not run here: {reason}")
    mp = med["mprotect"]
    keys = ("first_write_us", "stage_begin_us_per_page", "unchanged_begin_us_per_page", "load_ms", "readinto")
    json_line({"bench": "driver_writes", "pages": pages, "reps": reps, **{f"mprotect_{k}": mp[k] for k in keys},
               **{f"userfaultfd_{k}": uffd[k] if uffd else None for k in keys},
               "first_write_ratio": round(uffd["first_write_us"] / mp["first_write_us"], 3) if uffd else None,
               "userfaultfd_missing": None if uffd else runs["mprotect"][-1]["reason"]})


if __name__ == "__main__":
    sys.exit(main())
