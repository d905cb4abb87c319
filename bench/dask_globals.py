#!/usr/bin/env python3
"""clamor's globals on Dask: k-NN queries over an index read in place (clamor.dask) against scatter.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"dask_globals.py".
"""
import os
import sys
import time

import numpy as np
import scipy.spatial  # before any clamor.heap() block: a first import inside one puts it in the region

HERE = os.path.dirname(os.path.abspath(__file__))

from _common import MIB, array_pages, chunks, human, parse_size
import _harness
from _harness import json_line, med, parser

GRID = 1024          # cells a side
CELL_KM = 4.0        # a cell's side
CITIES = 10000
HASH_SEED = "6640"   # the seed Dask's nanny starts its workers with


# ---- the task (runs on the Dask workers; cloudpickle sends it by value) -------------------

def knn_task(q, pts, ids, offsets, grid, cell, k):
    """The ``k`` nearest places of each query in ``q`` (m, 2): (record ids
    (m, k) int64, distances (m, k) float64), nearest first.  Reads only the
    cells around the queries."""
    import numpy as np
    from scipy.spatial import cKDTree

    m = len(q)
    out_id = np.empty((m, k), np.int64)
    out_d = np.empty((m, k), np.float64)
    todo = np.arange(m)
    margin = 1
    while todo.size:
        qq = q[todo]
        cx = np.minimum((qq[:, 0] // cell).astype(np.int64), grid - 1)
        cy = np.minimum((qq[:, 1] // cell).astype(np.int64), grid - 1)
        x0, x1 = max(int(cx.min()) - margin, 0), min(int(cx.max()) + margin, grid - 1)
        y0, y1 = max(int(cy.min()) - margin, 0), min(int(cy.max()) + margin, grid - 1)
        rows = np.arange(y0, y1 + 1) * grid
        starts, ends = offsets[rows + x0], offsets[rows + x1 + 1]
        cand = np.concatenate([pts[s:e] for s, e in zip(starts, ends)])
        cids = np.concatenate([ids[s:e] for s, e in zip(starts, ends)])
        whole = x0 == 0 and y0 == 0 and x1 == grid - 1 and y1 == grid - 1
        if len(cand) < k and not whole:
            margin *= 2
            continue
        d, j = cKDTree(cand).query(qq, k=k)
        d, j = d.reshape(len(qq), k), j.reshape(len(qq), k)
        # distance from each query to the rectangle's edge (no edge where the grid ends)
        inf = np.inf
        g = np.minimum.reduce([
            qq[:, 0] - x0 * cell if x0 > 0 else np.full(len(qq), inf),
            (x1 + 1) * cell - qq[:, 0] if x1 < grid - 1 else np.full(len(qq), inf),
            qq[:, 1] - y0 * cell if y0 > 0 else np.full(len(qq), inf),
            (y1 + 1) * cell - qq[:, 1] if y1 < grid - 1 else np.full(len(qq), inf)])
        ok = (d[:, -1] <= g) | whole
        done = todo[ok]
        out_id[done] = cids[j[ok]]
        out_d[done] = d[ok]
        todo = todo[~ok]
        margin *= 2
    return out_id, out_d


def kdtree_task(q, k, geo=None, tree=None, records=None):
    """The paper's geo query over a KDTree of every place: for each query in
    ``q`` (m, 2), its ``k`` nearest places (record ids (m, k) int64 and
    distances (m, k), nearest first, from ``records``), then those ``k``
    sorted by rating (highest first; ties by position): the top-rated one's
    record id (m,) and distance (m,).  clamor: ``geo`` is a clamor.dask.ref
    of the region's (tree, records), used in place; scatter: ``tree`` and
    ``records`` are the worker's copies."""
    import numpy as np

    if geo is not None:
        tree, records = geo.get()
    d, j = tree.query(q, k=k)
    d, j = d.reshape(len(q), k), j.reshape(len(q), k)
    rec = records[j]                       # (m, k) records, a copy
    del tree, records                      # no reference to a region object outlives the task
    rid, rating = rec["id"], rec["rating"]
    top = np.lexsort((j, -rating))[:, 0]   # along each row: rating descending, then position
    rows = np.arange(len(q))
    return rid, d, rid[rows, top], d[rows, top]


def warm():
    """Untimed, on every worker: the task's imports."""
    import numpy  # noqa: F401
    import scipy.spatial  # noqa: F401


def set_readahead(nbytes):
    from clamor import region
    region.configure(readahead=nbytes)


def worker_info():
    import clamor
    from clamor import region
    return {"role": region.role(), "page_size": region.page_size(), "readahead": region.configure()["readahead"],
            "pid": os.getpid(), "clamor": clamor.__file__}


def drop_global(ranges):
    """Drop this worker's pages of the global ((first, count) page ranges) and zero its counters."""
    import clamor
    from clamor import region
    for first, count in ranges:
        region.drop_pages(first, count)
    clamor.reset_stats()


def worker_stats():
    import clamor
    return clamor.stats()


# ---- the data -------------------------------------------------------------------------------

def build(n, seed):
    """The index as region arrays, and the largest city's centre."""
    import clamor

    rng = np.random.default_rng(seed)
    side = GRID * CELL_KM
    w = 1.0 / np.arange(1, CITIES + 1) ** 0.7
    w /= w.sum()
    centres = rng.uniform(0.1 * side, 0.9 * side, size=(CITIES, 2))
    sigma = rng.uniform(5.0, 25.0, size=CITIES)
    sigma[0] = 25.0
    n_city = int(n * 0.7)
    which = rng.choice(CITIES, size=n_city, p=w)
    xy = np.empty((n, 2))
    xy[:n_city] = centres[which] + rng.standard_normal((n_city, 2)) * sigma[which, None]
    xy[n_city:] = rng.uniform(0.0, side, size=(n - n_city, 2))
    np.clip(xy, 0.0, np.nextafter(side, 0.0), out=xy)
    del which
    key = np.minimum((xy[:, 1] // CELL_KM).astype(np.int64), GRID - 1) * GRID \
        + np.minimum((xy[:, 0] // CELL_KM).astype(np.int64), GRID - 1)
    order = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=GRID * GRID)
    del key
    pts = clamor.empty((n, 2), np.float64)
    step = 1 << 22
    for s in range(0, n, step):
        pts[s:s + step] = xy[order[s:s + step]]
    del xy
    ids = clamor.empty(n, np.int64)
    ids[:] = order
    del order
    offsets = clamor.empty(GRID * GRID + 1, np.int64)
    offsets[0] = 0
    np.cumsum(counts, out=offsets[1:])
    return pts, ids, offsets, centres[0]


RECORD = np.dtype([("id", "<i8"), ("rating", "<f8")])


def build_kdtree(pts, ids, seed):
    """The paper's version of the global: a scipy KDTree over a copy of
    ``pts`` and ``records``, one (record id, rating) per place in pts's
    order, both made under clamor.heap() and held by one region tuple
    ``geo`` = (tree, records): Python objects, arrays and the tree's C++
    nodes all in the region.  Must run before the Dask client exists (its
    threads refill CPython's free lists, which a heap() block may draw
    from).  Also the baseline's ordinary copies (out of the region: the
    tree unpickled from the region's, so the same tree) and the tree's
    pickled size.  Returns (geo, plain_tree, plain_records, pickled_bytes)."""
    import pickle

    import clamor
    from clamor import region

    rating = np.random.default_rng(seed + 1).random(len(ids))
    region.ensure()
    with clamor.heap():
        # the tree gets its own copy of the places: pts's ndarray object was
        # made outside the block (only its bytes are in the region), and
        # ref() refuses an object that points out of the region, as a view
        # of pts would
        tree = scipy.spatial.KDTree(np.array(pts))
        # CPython 3.11+ makes an instance's __dict__ on first request: make
        # it here, in the region, or ref() finds the tree pointing outside
        tree.__dict__  # noqa: B018
        # (a structured dtype is an object of its own: made here too)
        records = np.empty(len(ids), np.dtype(RECORD.descr))
        geo = (tree, records)
    records["id"] = ids                    # (writing the bytes needs no block)
    records["rating"] = rating
    del rating
    plain_tree = pickle.loads(pickle.dumps(tree, protocol=5))
    plain_records = np.array(records)
    for x in (plain_tree.data, plain_tree.indices, plain_records):
        if region.contains(x.ctypes.data):
            raise SystemExit("dask_globals: the baseline's KDTree copy is in the region")
    bufs = []
    stream = pickle.dumps(plain_tree, protocol=5, buffer_callback=lambda b: bufs.append(b.raw().nbytes) and False)
    return geo, plain_tree, plain_records, len(stream) + sum(bufs)


def disc_queries(rng, centre, radius, n):
    r = radius * np.sqrt(rng.uniform(size=n))
    t = rng.uniform(0, 2 * np.pi, size=n)
    q = np.empty((n, 2))
    q[:, 0] = centre[0] + r * np.cos(t)
    q[:, 1] = centre[1] + r * np.sin(t)
    return q


def batches(q, parts):
    """Queries sorted by cell (row-major), cut into ``parts`` batches; and
    the permutation, to put answers back in the queries' order."""
    key = np.minimum((q[:, 1] // CELL_KM).astype(np.int64), GRID - 1) * GRID \
        + np.minimum((q[:, 0] // CELL_KM).astype(np.int64), GRID - 1)
    order = np.argsort(key, kind="stable")
    return [np.ascontiguousarray(q[o]) for o in chunks(order, parts)], order


def assemble(results, order):
    """The tasks' answers (each a tuple of arrays, a row a query) in query order."""
    out = []
    for part in zip(*results):
        c = np.concatenate(part)
        out.append(np.empty_like(c))
        out[-1][order] = c
    return tuple(out)


def same_answers(a, b, what, n=2):
    """Stops unless the first ``n`` answer arrays of ``a`` and ``b`` are
    equal, naming the queries where they differ."""
    bad = np.flatnonzero(np.logical_or.reduce([(x != y).reshape(len(x), -1).any(axis=1)
                                                for x, y in zip(a[:n], b[:n])]))
    if bad.size:
        raise SystemExit(f"dask_globals: {what} disagree on {bad.size} queries (first {bad[:5]})")


def brute(pts, ids, q, k):
    """The k nearest of one query over every place (the independent check)."""
    d = np.hypot(pts[:, 0] - q[0], pts[:, 1] - q[1])
    j = np.argpartition(d, k)[:k]
    j = j[np.argsort(d[j], kind="stable")]
    return ids[j], d[j]


def near_disc_range(offsets, centre, radius):
    """Index ranges in pts of the rows of cells around the query disc."""
    lo = np.maximum(((centre - radius) // CELL_KM).astype(int) - 1, 0)
    hi = np.minimum(((centre + radius) // CELL_KM).astype(int) + 1, GRID - 1)
    rows = np.arange(lo[1], hi[1] + 1) * GRID
    return [(int(offsets[r + lo[0]]), int(offsets[r + hi[0] + 1])) for r in rows]


# ---- hosts ----------------------------------------------------------------------------------

def side_figures(rows, scatter_bytes, netns):
    """The figures of part 1 or 1b (under "kdtree_"): the medians of each
    side's cold rounds, clamor's against scatter's; bytes on the links with
    ``netns``, else as counted."""
    c, s = rows["clamor"], rows["scatter"]
    cs, ss, cb, cl, sl = med(c, "s"), med(s, "s"), med(c, "bytes_fetched"), med(c, "link_in"), med(s, "link_in")
    counted = scatter_bytes / cb if cb else None
    link = sl / cl if netns and cl else None
    return {"speedup_vs_scatter": ss / cs, "bytes_ratio_vs_scatter": link if link is not None else counted,
            "bytes_ratio_source": "link" if link is not None else "counters",
            "bytes_ratio_counters": counted, "bytes_ratio_link": link,
            "clamor_s": cs, "scatter_s": ss, "scatter_transfer_s": med(s, "scatter_s"),
            "clamor_s_all": [round(x["s"], 3) for x in c], "scatter_s_all": [round(x["s"], 3) for x in s],
            "clamor_bytes": cb, "clamor_bytes_from_peers": med(c, "bytes_from_peers"),
            "clamor_readahead_pages": med(c, "readahead_pages"), "clamor_bytes_per_worker": c[-1]["per_worker_bytes"],
            "scatter_bytes": scatter_bytes,
            "clamor_link_bytes": cl if netns else None, "scatter_link_bytes": sl if netns else None}


# ---- the run --------------------------------------------------------------------------------

class Sides:
    """Both sides of every part on one Dask client: clamor's tasks read the
    global (pts, ids, offsets) in place, the baseline's get it scattered;
    ``links`` counts the bytes into the workers."""

    def __init__(self, client, links, pts, ids, offsets, k):
        self.client, self.links = client, links
        self.pts, self.ids, self.offsets = pts, ids, offsets
        self.grid_kw = {"grid": GRID, "cell": CELL_KM, "k": k}

    def run_clamor(self, qb):
        futs = self.client.map(knn_task, qb, pts=self.pts, ids=self.ids, offsets=self.offsets, pure=False,
                               **self.grid_kw)
        return self.client.gather(futs)

    def run_scatter(self, qb, data=None, only_pts=False):
        client = self.client
        t0 = time.perf_counter()
        if only_pts:
            fp = client.scatter(self.pts, broadcast=True)
            fi, fo = data[1], data[2]
        else:
            fp, fi, fo = client.scatter([self.pts, self.ids, self.offsets], broadcast=True)
        sc = time.perf_counter() - t0
        futs = client.map(knn_task, qb, pts=fp, ids=fi, offsets=fo, pure=False, **self.grid_kw)
        return client.gather(futs), sc, (fp, fi, fo)

    def clamor_bytes(self):
        st = self.client.run(worker_stats).values()
        return {**{k: sum(s[k] for s in st) for k in ("bytes_fetched", "bytes_from_peers", "pages_fetched",
                                                       "readahead_pages", "pages_invalidated", "faults")},
                "per_worker_bytes": sorted(s["bytes_fetched"] for s in st)}

    def release(self, futs):
        keys = [f.key for f in futs]
        for f in futs:
            f.release()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(self.client.who_has(keys).get(k) for k in keys):
            time.sleep(0.05)

    def timed(self, fn):
        """fn()'s result, its seconds, and the link bytes into and out of the workers meanwhile."""
        l0 = self.links.read()
        t0 = time.perf_counter()
        res = fn()
        dt = time.perf_counter() - t0
        l1 = self.links.read()
        return res, dt, l1[0] - l0[0], l1[1] - l0[1]

    def cold_rounds(self, reps, pages, run, qorder, what=""):
        """``reps`` cold rounds of each side, order alternating, the
        global's ``pages`` dropped first: ``run(side)`` -> (the tasks'
        results, the seconds of its ref or scatter or None, what to
        release after it); {side: rows}, {side: its answers}."""
        rows, answers = {"clamor": [], "scatter": []}, {}
        for r in range(reps):
            for side in (("clamor", "scatter") if r % 2 == 0 else ("scatter", "clamor")):
                self.client.run(drop_global, pages)
                (res, step_s, held), dt, link_in, link_out = self.timed(lambda: run(side))
                row = {"s": dt, "link_in": link_in, "link_out": link_out}
                if side == "clamor":
                    row.update(self.clamor_bytes(), **({} if step_s is None else {"ref_s": step_s}))
                    extra = ("" if step_s is None else f"ref {step_s:.2f} s, ") + (
                        f"fetched {row['bytes_fetched'] / MIB:.1f} MiB ({row['bytes_from_peers'] / MIB:.1f} from "
                        f"peers, {row['readahead_pages']} pages read ahead), ")
                else:
                    row["scatter_s"] = step_s
                    self.release(list(held))
                    held = None
                    extra = f"scatter {step_s:.2f} s, "
                got = assemble(res, qorder)
                if side in answers and not all(np.array_equal(x, y) for x, y in zip(answers[side], got)):
                    raise SystemExit(f"dask_globals: {what}{side}'s answers differ between rounds")
                answers[side] = got
                rows[side].append(row)
                print(f"  round {r} {side:>8}: {dt:7.2f} s  ({extra}link bytes into the workers "
                      f"{row['link_in'] / MIB:.1f} MiB)", flush=True)
        return rows, answers


def grid_part(args, sides, rng, centre, ranges):
    """Part 1: the k-NN queries, cold, each side; the two sides' answers
    checked equal, a few by brute force.  Returns (rows, answers, the
    query batches, their order)."""
    queries = disc_queries(rng, centre, args.radius_km, args.queries)
    qb, qorder = batches(queries, args.tasks)
    print(f"part 1: {args.queries} queries ({args.k} nearest) in {args.tasks} tasks, {args.reps} cold round(s) "
          f"each side, order alternating", flush=True)

    def grid_side(side):
        if side == "clamor":
            return sides.run_clamor(qb), None, None
        return sides.run_scatter(qb)

    rows, answers = sides.cold_rounds(args.reps, ranges, grid_side, qorder)
    a = answers["clamor"]
    same_answers(a, answers["scatter"], "clamor and scatter")
    for i in rng.choice(args.queries, size=min(args.brute, args.queries), replace=False):
        bi, bd = brute(sides.pts, sides.ids, queries[i], args.k)
        if not (np.array_equal(np.sort(bi), np.sort(a[0][i])) and np.allclose(bd, a[1][i], rtol=1e-12, atol=0)):
            raise SystemExit(f"dask_globals: query {i}: the tasks' answer is not the brute-force one")
    print(f"  answers: clamor == scatter for all {args.queries} queries; {args.brute} checked by brute force",
          flush=True)
    return rows, answers, qb, qorder


def kdtree_part(args, sides, kd, qb, qorder, grid_answers):
    """Part 1b, the paper's version: the same queries on a KDTree over every
    place, and the records; ``kd`` holds the region's (tree, records), the
    baseline's copy of each, and the pages to drop.  Before the updates,
    which move places in pts: the tree holds their places as they were.
    Returns (rows, answers)."""
    import clamor.dask

    geo, plain_tree, plain_records, all_pages = kd
    client = sides.client
    print(f"part 1b: the same {args.queries} queries on a KDTree of all {args.points} places + records "
          f"(top-rated of the {args.k} nearest), {args.kdtree_reps} cold round(s) each side: clamor.dask.ref "
          f"against scattering an ordinary copy (broadcast=True)", flush=True)

    def kdtree_side(side):
        if side == "clamor":
            # one ref to the region's (tree, records): the walk is counted in the round.  (Not
            # records as a region array beside a ref: see the README.)
            t0 = time.perf_counter()
            gref = clamor.dask.ref(geo)
            ref_s = time.perf_counter() - t0
            res = client.gather(client.map(kdtree_task, qb, geo=gref, pure=False, k=args.k))
            return res, ref_s, None
        t0 = time.perf_counter()
        ft, fr = held = client.scatter([plain_tree, plain_records], broadcast=True)
        sc = time.perf_counter() - t0
        return client.gather(client.map(kdtree_task, qb, tree=ft, records=fr, pure=False, k=args.k)), sc, held

    krows, kanswers = sides.cold_rounds(args.kdtree_reps, all_pages, kdtree_side, qorder, "KDTree ")
    a = kanswers["clamor"]
    same_answers(a, kanswers["scatter"], "KDTree: clamor and scatter", 4)
    same_answers(a, grid_answers["clamor"], "KDTree and grid index")   # the k nearest are part 1's
    pos = np.argsort(plain_records["id"])   # record id -> position
    rat = plain_records["rating"][pos[a[0]]]
    best = np.take_along_axis(a[0], np.argmax(rat, axis=1)[:, None], axis=1)[:, 0]
    if not np.array_equal(best, a[2]):
        raise SystemExit("dask_globals: KDTree: a top-rated answer is wrong")
    print(f"  answers: clamor == scatter for all {args.queries} queries ({args.k} nearest and top-rated), == part "
          f"1's; mean distance to the top-rated place {a[3].mean():.2f} km", flush=True)
    return krows, kanswers


def update_part(args, sides, rng, centre, ranges, qb):
    """Part 2: streaming updates: the driver moves places near the query
    disc, then the same queries on each side, clamor's workers holding
    their pages, the baseline re-scattering pts.  Returns {side: rows}."""
    client, pts, ids, offsets = sides.client, sides.pts, sides.ids, sides.offsets
    near = near_disc_range(offsets, centre, args.radius_km)
    spans = np.array([e - s for s, e in near])
    print(f"part 2: {args.update_rounds} round(s): the driver moves {args.updates} of the "
          f"{spans.sum()} places near the query disc within their cells, then {args.update_queries} queries in "
          f"{2 * args.workers} tasks; against re-scattering pts "
          f"({human(pts.nbytes) if pts.nbytes % 1024 == 0 else pts.nbytes}) and the same queries", flush=True)
    # the baseline's ids and offsets stay scattered through the rounds; clamor's workers hold their pages
    client.run(drop_global, ranges)
    base_fp, base_fi, base_fo = client.scatter([pts, ids, offsets], broadcast=True)
    sides.run_clamor(qb)                                   # both sides warm before the first update
    client.run(drop_global, [])
    urows = {"clamor": [], "rescatter": []}
    for r in range(args.update_rounds):
        pick = rng.choice(spans.sum(), size=args.updates, replace=False)
        cum = np.concatenate([[0], np.cumsum(spans)])
        row_of = np.searchsorted(cum, pick, side="right") - 1
        idx = np.array([near[w][0] + p - cum[w] for w, p in zip(row_of, pick)], np.int64)
        cells = np.floor(pts[idx] / CELL_KM)
        new = (cells + rng.uniform(0.0, 1.0, size=(len(idx), 2))) * CELL_KM
        uq = disc_queries(rng, centre, args.radius_km, args.update_queries)
        ub, uorder = batches(uq, 2 * args.workers)

        def write_then_look():   # clamor: write, then the lookups
            pts[idx] = new
            return sides.run_clamor(ub)

        client.run(drop_global, [])
        res_c, dt_c, link_c, _ = sides.timed(write_then_look)
        cb = sides.clamor_bytes()
        # baseline: re-scatter the updated pts, the same lookups
        sides.release([base_fp])
        (res_s, sc, (base_fp, _, _)), dt_s, link_s, _ = sides.timed(
            lambda: sides.run_scatter(ub, (None, base_fi, base_fo), only_pts=True))
        got_c, got_s = assemble(res_c, uorder), assemble(res_s, uorder)
        same_answers(got_c, got_s, f"update round {r}: clamor and re-scatter")
        seen = set(ids[idx].tolist()) & set(got_c[0].ravel().tolist())
        urows["clamor"].append({"s": dt_c, "link_in": link_c, **cb})
        urows["rescatter"].append({"s": dt_s, "scatter_s": sc, "bytes": pts.nbytes * args.workers,
                                   "link_in": link_s})
        print(f"  round {r}: clamor {dt_c:6.3f} s (fetched {cb['bytes_fetched'] / MIB:.1f} MiB, "
              f"{cb['pages_invalidated']} pages invalidated), re-scatter {dt_s:6.2f} s (scatter {sc:.2f} s); "
              f"{len(seen)} moved places among the answers; answers equal", flush=True)
    sides.release([base_fp, base_fi, base_fo])
    return urows


def parse(argv):
    """The arguments, their defaults filled in."""
    ap = parser(__doc__.splitlines()[0], "small sizes, one host (under a minute)", "200k places, 2 workers, one "
                "round of each part, one host (seconds; the tests run it); without dask.distributed, a note and a "
                "JSON line")
    ap.add_argument("--local", action="store_true", help="one host (LocalCluster) even for the full run")
    ap.add_argument("--netns", action="store_true", help="namespace hosts even with --quick")
    ap.add_argument("--workers", type=int, default=None, help="Dask workers (4; smoke 2)")
    ap.add_argument("--rate", default="1gbit", help="every worker host's link, both ways (tc notation)")
    ap.add_argument("--points", type=float, default=None, help="places (40e6; quick 2e6)")
    ap.add_argument("--queries", type=int, default=None, help="k-NN queries (100000; quick 20000)")
    ap.add_argument("--tasks", type=int, default=None, help="query batches (8 per worker)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--radius-km", type=float, default=100.0)
    ap.add_argument("--reps", type=int, default=None, help="cold rounds of each side (2; quick 3)")
    ap.add_argument("--updates", type=int, default=300, help="places moved per update round")
    ap.add_argument("--update-queries", type=int, default=None, help="queries per update round (20000; quick 5000)")
    ap.add_argument("--update-rounds", type=int, default=None, help="update rounds (3; quick 2)")
    ap.add_argument("--readahead", type=parse_size, default=None,
                    help="the workers' read-ahead in bytes, 0 off (default: clamor's, 4M)")
    ap.add_argument("--brute", type=int, default=None, help="queries checked by brute force (5; smoke 2)")
    ap.add_argument("--kdtree-reps", type=int, default=None,
                    help="cold rounds of each side of the KDTree part (as --reps; 0 skips it)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sm = args.smoke
    q = args.quick or sm        # a smoke run is a small quick run: one host unless --netns
    args.workers = args.workers or (2 if sm else 4)
    args.brute = args.brute or (2 if sm else 5)
    args.points = int(args.points or (2e5 if sm else 2e6 if q else 40e6))
    args.queries = args.queries or (2000 if sm else 20000 if q else 100000)
    args.tasks = args.tasks or 8 * args.workers
    args.reps = args.reps or (1 if sm else 3 if q else 2)
    args.kdtree_reps = args.reps if args.kdtree_reps is None else args.kdtree_reps
    args.update_queries = args.update_queries or (500 if sm else 5000 if q else 20000)
    args.update_rounds = args.update_rounds or (1 if sm else 2 if q else 3)
    if min(args.workers, args.points, args.queries, args.tasks, args.reps, args.update_queries,
           args.update_rounds, args.k) < 1 or args.points < args.k:
        ap.error("counts must be positive")
    return args


def connect(args, stack, netns, why_local):
    """Dask's workers on namespace hosts (``netns``) or on this one, clamor
    attached to them, every exit on ``stack``: (client, the links, hosts,
    seconds to attach, read-ahead)."""
    import clamor.dask
    from clamor import region
    from clamor.runtime import security

    t = time.perf_counter()
    if netns:
        os.environ["CLAMOR_SECRET"] = security.new_secret()   # the workers' too: they inherit it
        hosts = stack.enter_context(_harness.hosts_for(args.workers, args.rate))
        root, links, nhosts = hosts.root_addr, _harness.Links(hosts), args.workers
        client = stack.enter_context(_harness.start(
            "dask", args.workers, hosts, dask_config=_harness.DASK_AMM_OFF,
            dask_options={"nanny": False, "dashboard": False, "death_timeout": 60}))
        print(f"hosts: {args.workers} namespace hosts on {hosts.prefix}.0/24, links {args.rate} both ways; "
              f"scheduler and driver in the root namespace ({root}); Dask up in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    else:
        print(f"one host ({why_local}): LocalCluster of {args.workers} processes on loopback", flush=True)
        client = stack.enter_context(_harness.start("dask", args.workers, dask_config=_harness.DASK_AMM_OFF,
                                                    dask_options={"dashboard_address": None}))
        root, links, nhosts = None, _harness.Links(None), 1
    t = time.perf_counter()
    clamor.dask.attach(client, host=root)
    stack.callback(lambda: clamor.dask.attached() and clamor.dask.detach(client))
    attach_s = time.perf_counter() - t
    if args.readahead is not None:
        client.run(set_readahead, args.readahead)
    info = client.run(worker_info)
    if any(v["role"] != "worker" for v in info.values()) or len(info) != args.workers:
        raise SystemExit(f"dask_globals: the workers are not all attached: {info}")
    client.run(warm)
    readahead = next(iter(info.values()))["readahead"]
    print(f"attached in {attach_s:.2f} s; {len(info)} workers, page {human(region.page_size())}, read-ahead "
          f"{human(readahead) if readahead else 0}", flush=True)
    return client, links, nhosts, attach_s, readahead


def build_kd(args, pts, ids):
    """The KDTree part's data, before the Dask client (see build_kdtree):
    (the region's (tree, records), the baseline's tree and records, their
    pickled bytes, the region bytes they took, seconds to build)."""
    import clamor

    h0 = clamor.heap_stats()["allocated"]
    t = time.perf_counter()
    geo, plain_tree, plain_records, kd_pickled = build_kdtree(pts, ids, args.seed)
    kd_build_s = time.perf_counter() - t
    kd_region_bytes = clamor.heap_stats()["allocated"] - h0
    print(f"KDTree over the same places + records ({RECORD.itemsize} B each) built under clamor.heap() in "
          f"{kd_build_s:.1f} s: {kd_region_bytes / MIB:.0f} MiB more in the region; "
          f"the baseline's copy pickles to {kd_pickled / MIB:.0f} MiB, + records {plain_records.nbytes / MIB:.0f} "
          f"MiB", flush=True)
    return geo, plain_tree, plain_records, kd_pickled, kd_region_bytes, kd_build_s


def say(name, p, extra=""):
    print(f"{name}: clamor {p['clamor_s']:.2f} s{extra}, scatter {p['scatter_s']:.2f} s (transfer "
          f"{p['scatter_transfer_s']:.2f} s) -> speedup_vs_scatter {p['speedup_vs_scatter']:.2f}; bytes: clamor "
          f"{p['clamor_bytes'] / MIB:.1f} MiB, scatter {p['scatter_bytes'] / MIB:.0f} MiB -> ratio "
          f"{p['bytes_ratio_counters']:.1f}" + (f", on the links {p['clamor_link_bytes'] / MIB:.1f} / "
                                               f"{p['scatter_link_bytes'] / MIB:.0f} MiB -> "
                                               f"{p['bytes_ratio_link']:.1f}" if p["bytes_ratio_link"] else ""),
          flush=True)


def report(args, m):
    """The summary lines and the JSON line, from ``m``, what main measured."""
    netns, urows, kd = m["netns"], m["urows"], m["kd"]
    part1 = side_figures(m["rows"], m["gbytes"] * args.workers, netns)
    uc, us = med(urows["clamor"], "s"), med(urows["rescatter"], "s")
    fig = {
        "bench": "dask_globals", **part1, "update_speedup_vs_rescatter": us / uc,
        "update_clamor_round_s": uc, "update_rescatter_round_s": us,
        "update_rescatter_transfer_s": med(urows["rescatter"], "scatter_s"),
        "update_clamor_round_s_all": [round(x["s"], 4) for x in urows["clamor"]],
        "update_rescatter_round_s_all": [round(x["s"], 3) for x in urows["rescatter"]],
        "update_clamor_bytes": med(urows["clamor"], "bytes_fetched"),
        "update_pages_invalidated": med(urows["clamor"], "pages_invalidated"),
        "update_rescatter_bytes": m["pts_bytes"] * args.workers,
        "update_clamor_link_bytes": med(urows["clamor"], "link_in") if netns else None,
        "update_rescatter_link_bytes": med(urows["rescatter"], "link_in") if netns else None,
        "attach_s": m["attach_s"], "build_s": m["build_s"],
        "global_bytes": m["gbytes"], "pts_bytes": m["pts_bytes"], "places": args.points, "queries": args.queries,
        "tasks": args.tasks, "k": args.k, "radius_km": args.radius_km, "reps": args.reps,
        "updates": args.updates, "update_queries": args.update_queries, "update_rounds": args.update_rounds,
        "workers": args.workers, "hosts": m["nhosts"], "rate": args.rate if netns else None,
        "page_size": m["ps"], "readahead": m["readahead"], "quick": m["quick"], "smoke": args.smoke,
        "systems_run": ["clamor", "scatter"], "answers_ok": True,
    }
    # the KDTree part (the paper's version): null when skipped (--kdtree-reps 0)
    kd_names = ("ref_s", "clamor_faults", "pickled_bytes", "records_bytes", "region_bytes", "build_s",
                "mean_top_km")
    part1b, kd_figures = dict.fromkeys(part1), dict.fromkeys(kd_names)
    if args.kdtree_reps:
        _, _, plain_records, kd_pickled, kd_region_bytes, kd_build_s = kd
        krows = m["krows"]["clamor"]
        part1b = side_figures(m["krows"], (kd_pickled + plain_records.nbytes) * args.workers, netns)
        kd_figures = dict(zip(kd_names, (med(krows, "ref_s"), med(krows, "faults"), kd_pickled,
                                         plain_records.nbytes, kd_region_bytes, kd_build_s,
                                         float(m["kanswers"]["clamor"][3].mean()))))
    fig.update({f"kdtree_{k}": v for k, v in {**part1b, **kd_figures}.items()})
    fig["kdtree_reps"] = args.kdtree_reps
    fig["elapsed_s"] = round(time.perf_counter() - m["t_start"], 1)
    say("k-NN", part1, "")
    print("  (targets: speedup_vs_scatter > 2, bytes_ratio_vs_scatter >= 10)")
    print(f"updates: clamor round {uc * 1e3:.0f} ms, re-scatter round {us:.2f} s -> update_speedup_vs_rescatter "
          f"{fig['update_speedup_vs_rescatter']:.1f} (target >= 20)", flush=True)
    if args.kdtree_reps:
        say("KDTree", part1b, f" (ref {fig['kdtree_ref_s']:.2f} s)")
    json_line(fig)
    return 0


def main(argv=None):
    if argv is None and os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        # the region's KDTree holds str-keyed dicts: they hash with the
        # process's seed, which must be the workers' (Dask's nanny gives its
        # workers 6640; the namespace hosts' workers inherit this environment)
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    args = parse(argv)
    q = args.quick or args.smoke        # a smoke run is a small quick run: one host unless --netns
    if args.smoke:
        try:
            _harness._distributed()
        except _harness.PeerMissing as err:
            why = str(err)
            print(f"smoke: dask_globals skipped: {why}", flush=True)
            json_line({"bench": "dask_globals", "smoke": True, "systems_run": [], "skipped": why})
            return 0

    import contextlib

    import clamor
    import clamor.dask
    from clamor import region

    netns = not (args.local or (q and not args.netns))
    why_local = "--quick" if q and not args.netns else "--local" if args.local else None
    if netns:
        from clamor.testing import nethosts
        ok, reason = nethosts.available()
        if not ok:
            netns, why_local = False, f"no network namespaces here ({reason})"
    t_start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    t = time.perf_counter()
    pts, ids, offsets, centre = build(args.points, args.seed)
    build_s = time.perf_counter() - t
    gbytes = pts.nbytes + ids.nbytes + offsets.nbytes
    ps = region.page_size()
    print(f"global: {args.points} places, pts {human(pts.nbytes) if pts.nbytes % 1024 == 0 else pts.nbytes} + ids "
          f"+ offsets = {gbytes / MIB:.0f} MiB in the region, built in {build_s:.1f} s; queries within "
          f"{args.radius_km:g} km of ({centre[0]:.0f}, {centre[1]:.0f}) km", flush=True)
    ranges = [array_pages(x) for x in (pts, ids, offsets)]
    kd = build_kd(args, pts, ids) if args.kdtree_reps else None   # before the Dask client (see build_kdtree)
    all_pages = [(0, region.size() // ps)]
    krows, kanswers = {"clamor": [], "scatter": []}, {}
    with contextlib.ExitStack() as stack:
        client, links, nhosts, attach_s, readahead = connect(args, stack, netns, why_local)
        sides = Sides(client, links, pts, ids, offsets, args.k)
        rows, answers, qb, qorder = grid_part(args, sides, rng, centre, ranges)
        if args.kdtree_reps:
            krows, kanswers = kdtree_part(args, sides, kd[:3] + (all_pages,), qb, qorder, answers)
        urows = update_part(args, sides, rng, centre, ranges, qb)
        clamor.dask.detach(client)
    return report(args, {"netns": netns, "rows": rows, "urows": urows, "krows": krows, "kanswers": kanswers,
                         "kd": kd, "gbytes": gbytes, "pts_bytes": pts.nbytes, "attach_s": attach_s,
                         "build_s": build_s, "nhosts": nhosts, "ps": ps, "readahead": readahead, "quick": q,
                         "t_start": t_start})


if __name__ == "__main__":
    sys.exit(main())
