#!/usr/bin/env python3
"""Geo queries: clamor against broadcast, Redis GEO, Spark, Dask and Ray (paper, section 7).

How to run it, what it compares and what its JSON line holds: bench/README.md,
"geo.py".
"""
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

import _harness
from _common import Spawned, chunks, die_with_parent, parse_size
from _harness import json_line, parser
from clamor.demo import geo

PEERS = ("spark", "dask", "ray")
WARM_RECORDS = 256   # records of the peers' warm-up tree
WARM_QUERIES = 8     # queries of each warm-up partition
SYSTEMS = ("clamor", "broadcast", "redis") + PEERS

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
        self.proc = self.log = None
        try:
            self._start(exe)
        except BaseException:
            self.close()
            raise

    def _start(self, exe):
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
                    raise SystemExit("redis-server did not start; see its log above") from None
                time.sleep(0.05)
        self.version = Resp(self.port).call("INFO", "server").decode().split("redis_version:")[1].split()[0]

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
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


# ---- the peers: Spark, Dask and Ray, each in a subprocess (--run SYSTEM) ------------------

def config(args, pickled_bytes):
    """What ``start`` and the subprocesses need, from geo.py's arguments;
    Spark's memory sized for a broadcast of ``pickled_bytes``."""
    mb, dm = _harness.spark_memory(args, pickled_bytes)
    return {"workers": args.workers, "partitions": 4 * args.workers, "page_size": args.page_size,
            "netns": args.netns, "rate": args.rate if args.netns else None,
            "spark_executor_mb": mb, "spark_driver_memory": dm}


def hosts_of(cfg):
    """The namespace hosts for ``cfg`` (``--netns``), or None: a context manager."""
    return _harness.hosts_for(cfg["workers"], cfg["rate"] if cfg.get("netns") else None)


def start(system, cfg, hosts=None):
    """``system`` with ``cfg["workers"]`` workers (one per host of ``hosts``), through the harness."""
    return _harness.start(system, cfg["workers"], hosts, executor_mb=cfg["spark_executor_mb"],
                          driver_memory=cfg["spark_driver_memory"], app="geo",
                          spark_conf={"spark.ui.showConsoleProgress": "false"},   # no progress bars in the output
                          page_size=cfg.get("page_size"), progress=None)


# ---- the job: (answers per partition, broadcast s, total s) --------------------------------

def answer_pair(data, q):
    return geo.answer(data[0], data[1], q)


def job(system, h, tree, records, parts):
    """(tree, records) broadcast the system's way (``_harness.shared``), then
    one task a partition.  Dask scatters the pair as two futures (its
    ``scatter`` splits a list or tuple) and cancels the tasks' too."""
    t0 = time.perf_counter()
    if system == "dask":
        tf, rf = h.scatter([tree, records], broadcast=True)
        t1 = time.perf_counter()
        futs = [h.submit(geo.answer, tf, rf, q, pure=False) for q in parts]
        out = h.gather(futs)
        t2 = time.perf_counter()
        h.cancel(futs + [tf, rf])
        return out, t1 - t0, t2 - t0
    publish, tasks, retire = _harness.shared(system, h)
    g = publish((tree, records))
    t1 = time.perf_counter()
    out = tasks(answer_pair, g, parts)
    t2 = time.perf_counter()
    retire(g)
    return out, t1 - t0, t2 - t0


def run_peer(system, h, cfg, tree, records, queries, hosts=None):
    """Warm-up, then the timed job: (answers, figures)."""
    parts = chunks(queries, cfg["partitions"])   # as Cluster.parallelize cuts them
    # Ray starts its workers lazily: have W of them before the warm-up
    pids = _harness.ray_wait_workers(h, cfg["workers"]) if system == "ray" else ()
    small = np.ascontiguousarray(records[:WARM_RECORDS])
    t0 = time.perf_counter()
    job(system, h, geo.build_tree(small), small, [q[:WARM_QUERIES] for q in parts])
    warm_s = time.perf_counter() - t0
    line, figures = _harness.peer_facts(system, h, pids)
    print(f"  {system}: {line}; warm-up {warm_s:.2f} s", flush=True)
    links = _harness.Links(hosts)
    out, bcast_s, total_s = job(system, h, tree, records, parts)
    figures.update(s=total_s, broadcast_s=bcast_s, warm_s=warm_s, link_bytes=links.bytes())
    return geo.concat(out), figures


# ---- one system per subprocess -----------------------------------------------------------------

def write_data(d, blob, queries, cfg):
    """The subprocesses' inputs in directory ``d``."""
    with open(os.path.join(d, "data.pkl"), "wb") as f:
        f.write(blob)
    np.save(os.path.join(d, "queries.npy"), queries)
    _harness.write_json(os.path.join(d, "config.json"), cfg)


def child(system, d, out):
    """``geo.py --run SYSTEM``: one peer over the data in ``d``; its figures
    to ``out``, its answers beside it."""

    def run():
        cfg = _harness.read_json(os.path.join(d, "config.json"))
        with hosts_of(cfg) as hosts, start(system, cfg, hosts) as h:   # workers before the data, as in geo.py
            with open(os.path.join(d, "data.pkl"), "rb") as f:
                tree, records = pickle.load(f)
            queries = np.load(os.path.join(d, "queries.npy"))
            (ranked, top_km), figures = run_peer(system, h, cfg, tree, records, queries, hosts)
        np.savez(os.path.join(d, f"answers-{system}.npz"), ranked=ranked, top_km=top_km)
        return figures

    return _harness.child_result(system, out, run)


def load_answers(system, res, out):
    with np.load(os.path.join(os.path.dirname(out), f"answers-{system}.npz")) as z:
        res["answers"] = (z["ranked"], z["top_km"])



# ---- main ------------------------------------------------------------------------------

def local_systems(args, systems, d, clamor):
    """clamor, broadcast and Redis, in this process (see the module); the
    peers' inputs written to ``d``.  Returns the figures."""
    w = args.workers
    r = {}
    redis = bcast = rclients = None
    try:
        # Every worker of every system exists before the data does.
        if "redis" in systems:
            redis = RedisServer()
            rclients = Spawned(w, redis_worker, redis.port)
            for c in rclients.conns:
                c.recv()
        if "broadcast" in systems:
            bcast = Spawned(w, broadcast_worker)
        if args.readahead is not None:
            clamor.configure(readahead=args.readahead)  # the forked workers inherit it
        cfg = config(args, 0)
        P = cfg["partitions"]
        with hosts_of(cfg) as hosts, start("clamor", cfg, hosts) as cl:
            t0 = time.perf_counter()
            meta, tree = geo.build(clamor, args.dataset, args.scale, args.seed)
            n = len(meta)
            region_bytes = clamor.heap_stats()["allocated"]
            build_s = time.perf_counter() - t0
            queries = geo.make_queries(args.queries, args.region, args.radius_km, seed=args.seed + 1)
            print(f"geo: {n:,} places ({args.scale} x cities{args.dataset}), region {mib(region_bytes).strip()} "
                  f"(records {mib(meta.nbytes).strip()}, k-d tree {mib(region_bytes - meta.nbytes).strip()}), "
                  f"built in {build_s:.1f} s; {args.queries:,} queries within {args.radius_km:g} km of "
                  f"{args.region}, {P} partitions; {w} workers each way; clamor page size "
                  f"{clamor.region.page_size() >> 10} KiB", flush=True)
            r.update(n=n, region_bytes=region_bytes, page_size=clamor.region.page_size(),
                     readahead=clamor.configure()["readahead"])

            # single process: the reference answers, from a plain scipy tree
            ref_tree = geo.build_tree(meta)
            t0 = time.perf_counter()
            r["ref"] = geo.answer(ref_tree, meta, queries)
            r["single_s"] = time.perf_counter() - t0
            del ref_tree

            # (a) clamor, cold (no worker holds a page), then warm
            clamor_part(r, cl, hosts, queries, tree, meta, P)

            # (b) broadcast: pickle once, send to every worker at once.  The
            # same pickle is what the peers broadcast (they read it from a file).
            t0 = time.perf_counter()
            blob = pickle.dumps((tree, meta), protocol=pickle.HIGHEST_PROTOCOL)
            r["pickle_s"] = time.perf_counter() - t0
            r["pickled_bytes"] = len(blob)
            if bcast is not None:
                broadcast_part(r, bcast, queries, blob, t0)
                bcast = None
            if any(s in systems for s in PEERS):
                write_data(d, blob, queries, config(args, len(blob)))
            del blob

            # (c) Redis GEO
            if redis is not None:
                redis_part(r, redis, rclients, meta, queries[:args.redis_queries])
    finally:
        for p in (bcast, rclients, redis):
            if p is not None:
                p.close()
    return r


def clamor_part(r, cl, hosts, queries, tree, meta, partitions):
    """clamor's queries, cold (no worker holds a page), then warm, on ``cl``;
    the figures into ``r``."""
    links = _harness.Links(hosts)

    def answer_parts():
        return cl.parallelize(queries, partitions=partitions) \
            .map_partitions(lambda part: geo.answer_part(tree, meta, part)).collect()

    t0 = time.perf_counter()
    parts = answer_parts()
    r["clamor_s"] = time.perf_counter() - t0
    r["got_clamor"] = geo.concat(parts)
    st = r["st"] = cl.stage_stats()[-1]
    r["clamor_bytes"] = st["bytes_from_driver"] + st["bytes_from_peers"] + st["payload_bytes"]
    r["clamor_link_bytes"] = links.bytes()
    t0 = time.perf_counter()
    warm = geo.concat(answer_parts())
    r["warm_s"] = time.perf_counter() - t0
    st = cl.stage_stats()[-1]
    r["warm_bytes"] = st["bytes_from_driver"] + st["bytes_from_peers"]
    r["bad_clamor"] = geo.check_equal(r["ref"], r["got_clamor"]) + geo.check_equal(r["ref"], warm)


def broadcast_part(r, bcast, queries, blob, t0):
    """The broadcast: ``blob``, pickled since ``t0``, sent to every worker
    at once with its share of the queries; the figures into ``r``, and
    its workers closed."""
    w = len(bcast.conns)
    sl = chunks(queries, w)

    def ship(i):
        bcast.conns[i].send(sl[i])
        bcast.conns[i].send_bytes(blob)
        return bcast.conns[i].recv()
    out = bcast.map(ship)
    r["bcast_s"] = time.perf_counter() - t0
    r["bcast_bytes"] = len(blob) * w
    r["got_bcast"] = geo.concat([o[0] for o in out])
    r["unpickle_s"] = max(o[1] for o in out)
    r["bad_bcast"] = geo.check_equal(r["ref"], r["got_bcast"])
    bcast.close()


def redis_part(r, redis, rclients, meta, rq):
    """Redis GEO: the places loaded, then ``rq`` queries split among its
    clients; the figures into ``r``."""
    w = len(rclients.conns)
    t0 = time.perf_counter()
    r["redis_mem"] = redis_load(redis.port, meta)
    r["load_s"] = time.perf_counter() - t0
    radius = r["radius"] = redis_radius(redis.port, rq[:min(len(rq), 500)])
    rs = chunks(rq, w)
    t0 = time.perf_counter()
    out = rclients.map(lambda i: (rclients.conns[i].send((rs[i], radius)), rclients.conns[i].recv())[1])
    r["redis_s"] = time.perf_counter() - t0
    r["got_redis"] = geo.concat(out)
    r["retries"] = sum(o[2] for o in out)
    c = Resp(redis.port)
    r["redis_stats"] = c.call("INFO", "commandstats").decode()
    c.close()
    r["redis_version"] = redis.version
    r["ref_r"] = ref_r = (r["ref"][0][:len(rq)], r["ref"][1][:len(rq)])
    r["redis_cmp"] = compare_redis(ref_r, r["got_redis"], meta, rq)


def table_row(label, s, per_query_s, moved, answers=""):
    """One system's line of the table: seconds end to end and a query, bytes moved, its answers."""
    print(f"{label:22} {s:10.2f}s {1e6 * per_query_s:8.2f}us {moved:>15}" + (f"   {answers}" if answers else ""))


def redis_lines(r, cl_q):
    """Redis's lines of the table, and (its queries, seconds a query end to
    end and at the server alone, wrong answers, top-rated that differ, the
    largest distance error)."""
    rq = len(r["got_redis"][0])
    redis_q = r["redis_s"] / rq
    stats, retries = r["redis_stats"], r["retries"]
    same, ties, wrong, topdiff, err = r["redis_cmp"]

    def usec(cmd):
        part = stats.split(f"cmdstat_{cmd}:")
        return float(part[1].split("usec_per_call=")[1].split(",")[0]) if len(part) > 1 else 0.0

    # Redis's own time per query, by its INFO commandstats (no client, no
    # network): GEOSEARCH calls (retries too) and 10 HGETs per query
    server_q = 1e-6 * (usec("geosearch") * (rq + retries) + usec("hget") * geo.K * rq) / rq
    table_row("redis GEOSEARCH", r["redis_s"], redis_q, "-", f"{same:,} same, {ties} ties at the 10th place, "
              f"{wrong} wrong, {topdiff} top-rated differ; distance error <= {1000 * err:.2f} m")
    print(f"redis {r['redis_version']}: {rq:,} queries, radius {r['radius']:.2f} km "
          f"({retries} retried at 2x); server time GEOSEARCH {usec('geosearch'):.1f}us, "
          f"HGET {usec('hget'):.2f}us per call; "
          f"loaded in {r['load_s']:.1f}s, {mib(r['redis_mem']).strip()}; server time alone "
          f"{1e6 * server_q:.1f}us per query = {server_q / cl_q:.1f}x clamor's")
    return rq, redis_q, server_q, wrong, topdiff, err


def main():
    ap = parser(__doc__.split("\n")[0], "cities5000, 200,000 queries, 4,000 to Redis", "cities15000, 5,000 queries, "
                "500 to Redis, 2 workers; Spark and Ray left out unless named, Redis when redis-server is missing "
                "(seconds; the tests run it)")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (or clients) of every system (4)")
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
    ap.add_argument("--netns", action="store_true",
                    help="clamor and the peers with one worker per namespace host (the broadcast and Redis "
                         "baselines stay on one host and are left out unless named in --systems)")
    ap.add_argument("--rate", default="1gbit", help="with --netns: every host's link, both ways (tc notation)")
    ap.add_argument("--seed", type=int, default=0)
    _harness.child_args(ap, PEERS, "the pickled tree and records", default=SYSTEMS,
                        note="; with --netns clamor,spark,dask,ray; clamor always runs")
    args = ap.parse_args()
    if args.run:
        return child(args.run, args.data, args.out)
    if args.quick:
        args.dataset, args.scale = 5000, 1
        args.queries, args.redis_queries = min(args.queries, 200_000), min(args.redis_queries, 4_000)
    if args.smoke:
        args.dataset, args.scale = 15000, 1
        args.queries, args.redis_queries = min(args.queries, 5_000), min(args.redis_queries, 500)
    args.workers = w = args.workers or (2 if args.smoke else 4)
    args.redis_queries = min(args.redis_queries, args.queries)
    if w < 1 or args.scale < 1 or args.redis_queries < 1:
        ap.error("--workers, --scale, --queries and --redis-queries must be positive")
    systems, args.smoke_left_out = _harness.pick_systems(
        ap, args, SYSTEMS, [s for s in SYSTEMS if not args.netns or s not in ("broadcast", "redis")])
    systems = ["clamor"] + [s for s in systems if s != "clamor"]
    if args.smoke:
        if "redis" in systems and args.systems is None and shutil.which("redis-server") is None:
            args.smoke_left_out["redis"] = "left out under --smoke: redis-server is not installed"
            print("smoke: redis " + args.smoke_left_out["redis"], flush=True)
            systems.remove("redis")

    import clamor

    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="clamor-geo-", ignore_cleanup_errors=True) as d:
        r = local_systems(args, systems, d, clamor)
        # The peers, each in a subprocess of its own, one after another, once
        # clamor's workers and the baselines' processes are gone.
        peers = _harness.run_systems([s for s in PEERS if s in systems],
                                     [sys.executable, os.path.abspath(__file__), "--data", d], d, args.timeout,
                                     load=load_answers, preexec=False)
    for p in peers.values():
        if "answers" in p:
            p["bad"] = geo.check_equal(r["got_clamor"], p["answers"])
    return report(args, systems, r, peers, time.perf_counter() - t_all)


def report(args, systems, r, peers, total_s):
    """The table and the JSON line; the exit status."""
    w, nq = args.workers, args.queries
    ref, got_clamor, st = r["ref"], r["got_clamor"], r["st"]
    clamor_s, bad_clamor = r["clamor_s"], r["bad_clamor"]
    cl_q = clamor_s / nq
    # seconds for the whole batch, bytes, why not run: by system
    batch = {"clamor": clamor_s, "broadcast": r.get("bcast_s")}
    hosts = w if args.netns else 1
    # on namespace hosts: what crossed the links, for every system
    nbytes = {"clamor": r["clamor_link_bytes"] if args.netns else r["clamor_bytes"],
              "broadcast": r.get("bcast_bytes"), "redis": None}
    missing = {s: args.smoke_left_out.get(s, "not requested (--systems)") for s in SYSTEMS if s not in systems}
    bad = {"clamor": bad_clamor, "broadcast": r.get("bad_bcast", 0)}

    def eq(n):
        return "equal" if not n else f"{n} DIFFER"

    print()
    print(f"{'':22} {'end to end':>11} {'per query':>10} {'bytes moved':>15}   answers")
    table_row("single process", r["single_s"], r["single_s"] / nq, "-", "(reference)")
    table_row("clamor (cold)", clamor_s, cl_q, mib(r["clamor_bytes"]),
              f"{eq(bad_clamor)}  ({st['faults']:,} faults)")
    table_row("clamor (warm rerun)", r["warm_s"], r["warm_s"] / nq, mib(r["warm_bytes"]))
    if "bcast_s" in r:
        table_row("broadcast (pickle)", r["bcast_s"], r["bcast_s"] / nq, mib(r["bcast_bytes"]),
                  f"{eq(r['bad_bcast'])}  (pickle {r['pickle_s']:.2f}s, unpickle <= {r['unpickle_s']:.2f}s)")
    for s, p in peers.items():
        if "answers" not in p:
            missing[s] = p.get("missing") or p.get("error") or "no result"
            continue
        bad[s] = p["bad"]
        # Ray's workers read the one copy in their host's shared object store
        batch[s] = p["s"]
        nbytes[s] = p["link_bytes"] if args.netns else r["pickled_bytes"] * (hosts if s == "ray" else w)
        if p["bad"]:
            missing[s] = f"answers differ from clamor's on {p['bad']} queries: the comparison is void"
        table_row(s + " (broadcast)", p["s"], p["s"] / nq, mib(nbytes[s]),
                  f"{eq(p['bad'])} with clamor  (broadcast call {p['broadcast_s']:.2f}s, "
                  f"warm-up {p['warm_s']:.1f}s, {p['wall_s']:.0f}s with start-up)")
    redis_q = server_q = rq = None
    wrong, topdiff, err = 0, 0, 0.0
    if "redis_s" in r:
        rq, redis_q, server_q, wrong, topdiff, err = redis_lines(r, cl_q)
        batch["redis"] = redis_q * nq   # its time per query over the whole batch
    print(f"average distance to the top-rated place: clamor {got_clamor[1].mean():.4f} km, reference "
          f"{ref[1].mean():.4f} km" + (f"; redis {r['got_redis'][1].mean():.4f} km vs reference "
                                       f"{r['ref_r'][1].mean():.4f} km on its {rq:,} queries" if "redis_s" in r else ""))
    print(f"pickled (tree, records): {mib(r['pickled_bytes']).strip()} (pickled in {r['pickle_s']:.2f} s); "
          "end to end / clamor's: " + ", ".join(f"{s} {t / clamor_s:.2f}x" for s, t in batch.items()
                                                 if t is not None and s != "clamor")
          + f"   [{total_s:.0f} s in all]")
    ok = bool(not any(bad.values()) and not wrong and not topdiff and err <= 0.01)
    json_line(figures(args, systems, r, peers, batch, nbytes, missing, bad, ok, redis_q, server_q))
    return 0 if ok else 1


def figures(args, systems, r, peers, batch, nbytes, missing, bad, ok, redis_q, server_q):
    """The JSON line's figures: ``batch`` and ``nbytes`` by system, why a
    system is ``missing``, answers that were ``bad``; Redis's seconds a
    query, end to end and its server's alone."""
    w, nq, clamor_s = args.workers, args.queries, r["clamor_s"]

    def speedup(s, nd=3):
        return round(batch[s] / clamor_s, nd) if batch.get(s) is not None and not bad.get(s) else None

    out = {
        "bench": "geo", "workers": w, "places": r["n"], "queries": nq, "partitions": 4 * w,
        "redis_queries": len(r["got_redis"][0]) if "redis_s" in r else None,
        "region_bytes": r["region_bytes"], "pickled_bytes": r["pickled_bytes"], "page_size": r["page_size"],
        "readahead": r["readahead"],
        "clamor_s": round(clamor_s, 4), "clamor_warm_s": round(r["warm_s"], 4),
        "broadcast_s": round(r["bcast_s"], 4) if "bcast_s" in r else None,
        "single_s": round(r["single_s"], 4),
        "redis_s": round(r["redis_s"], 4) if "redis_s" in r else None,
        "clamor_us_per_query": round(1e6 * clamor_s / nq, 3),
        "redis_us_per_query": round(1e6 * redis_q, 3) if "redis_s" in r else None,
        "clamor_bytes": r["clamor_bytes"], "broadcast_bytes": r.get("bcast_bytes"),
        "clamor_faults": r["st"]["faults"],
        "redis_server_us_per_query": round(1e6 * server_q, 3) if "redis_s" in r else None,
        "redis_radius_km": round(r["radius"], 3) if "redis_s" in r else None, "answers_ok": ok,
        "bytes_ratio": round(r["bcast_bytes"] / r["clamor_bytes"], 2) if "bcast_s" in r else None,
        "speedup_vs_broadcast": speedup("broadcast"), "speedup_vs_redis": speedup("redis", 2),
        "speedup_vs_spark": speedup("spark", 2), "speedup_vs_dask": speedup("dask", 2),
        "speedup_vs_ray": speedup("ray", 2), "time_unit": f"s per batch of {nq:,} queries",
        "hosts": w if args.netns else 1, "rate": args.rate if args.netns else None, "systems": systems,
        "smoke": args.smoke,
        "systems_run": ["clamor"] + [s for s in SYSTEMS if s != "clamor" and batch.get(s) is not None],
        "clamor_link_bytes": r.get("clamor_link_bytes"),
    }
    for s in SYSTEMS:
        out[f"{s}_iter_s"] = round(batch[s], 4) if batch.get(s) is not None else None
        out[f"{s}_bytes"] = nbytes.get(s)
    for s, p in peers.items():
        for k in ("broadcast_s", "warm_s", "wall_s"):
            out[f"{s}_{k}"] = round(p[k], 3) if k in p else None
        out[f"{s}_version"] = p.get("version")
    for s, why in missing.items():
        out[f"{s}_missing"] = why
    return out


if __name__ == "__main__":
    sys.exit(main())
