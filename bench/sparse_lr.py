#!/usr/bin/env python3
"""Sparse logistic regression: clamor against Spark, Dask and Ray broadcasting the weights.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"sparse_lr.py".
"""
import os
import sys
import tempfile
import time

import _harness
from _common import chunks, one_blas_thread
from _harness import json_line, parser

one_blas_thread()  # before numpy loads OpenBLAS
import numpy as np  # noqa: E402

FIELDS = 39
SYSTEMS = ("clamor", "spark", "dask", "ray")
MIB = 1 << 20


# ---- the data ----------------------------------------------------------------------------

def mix64(x):
    """splitmix64's finalizer, vectorised (uint64 in, uint64 out)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def true_weight(j, seed):
    """The hidden weight of entries j: uniform in (-0.5, 0.5), from a hash."""
    h = mix64(np.asarray(j, dtype=np.uint64) ^ np.uint64((seed * 0x9E3779B97F4A7C15 + 7) & ((1 << 64) - 1)))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) - 0.5


def zipf_values(rng, a, vocab, size):
    """``size`` values in [0, vocab), value r with p ~ (r + 1)^-a."""
    out = np.empty(size, dtype=np.int64)
    got = 0
    while got < size:
        z = rng.zipf(a, (size - got) * 11 // 10 + 16)
        z = z[z <= vocab][:size - got]
        out[got:got + z.size] = z - 1
        got += z.size
    return out


def make_data(n, bits, zipf, vocab, seed, layout="hashed"):
    """(idx (n, 39) int64 weight indices, y (n,) float64 labels, the
    vocabularies).  ``layout`` "hashed": a value's index is a hash of its
    field and value; "ranked": each field has a range of its own, its values
    in frequency order (dictionary-encoded ids, most frequent first)."""
    rng = np.random.default_rng(seed)
    vocabs = np.geomspace(16, vocab, FIELDS).astype(np.int64)
    if layout == "ranked" and vocabs.sum() > (1 << bits):
        raise SystemExit(f"sparse_lr: --layout ranked needs 2^bits >= the vocabularies' sum, {vocabs.sum()}")
    bases = np.concatenate([[0], np.cumsum(vocabs)[:-1]])
    idx = np.empty((n, FIELDS), dtype=np.int64)
    mask = np.uint64((1 << bits) - 1)
    salt = np.uint64(seed & 0xFFFFFF)
    for f in range(FIELDS):
        v = zipf_values(rng, zipf, int(vocabs[f]), n).astype(np.uint64)
        if layout == "ranked":
            idx[:, f] = bases[f] + v.astype(np.int64)
            continue
        key = (np.uint64(f + 1) << np.uint64(40)) ^ (salt << np.uint64(48)) ^ v
        idx[:, f] = (mix64(key) & mask).astype(np.int64)
    margin = np.zeros(n)
    for f in range(FIELDS):
        margin += true_weight(idx[:, f], seed)
    y = (margin + rng.standard_normal(n) > 0).astype(np.float64)
    return idx, y, vocabs


def cut(idx, y, parts):
    """The partitions: [(u, inv, y_p)], contiguous chunks of the points."""
    out = []
    for ix, yp in zip(chunks(idx, parts), chunks(y, parts)):
        u, inv = np.unique(ix, return_inverse=True)
        out.append((u.astype(np.int64), inv.reshape(-1).astype(np.int32), np.ascontiguousarray(yp)))
    return out


def save_parts(d, parts, meta):
    for i, part in enumerate(parts):
        for name, a in zip("uiy", part):
            np.save(os.path.join(d, f"{name}{i}.npy"), a)
    _harness.write_json(os.path.join(d, "meta.json"), meta)


def load_part(d, i):
    """Partition i from the data directory (what every system's loader runs)."""
    return tuple(np.load(os.path.join(d, f"{name}{i}.npy")) for name in "uiy")


# ---- the kernel (every system runs this) -------------------------------------------------------

def part_grad(w, u, inv, y):
    """One partition's (gradient values over u, loss sum) at weights w:
    reads only w[u]."""
    wu = w[u]
    m = wu[inv].reshape(-1, FIELDS).sum(axis=1)
    p = 1.0 / (1.0 + np.exp(-m))
    g = np.bincount(inv, weights=np.repeat(p - y, FIELDS), minlength=u.size)
    loss = float(np.sum(np.logaddexp(0.0, m) - y * m))
    return g, loss


def grad_of(w, part):
    """part_grad over a partition given as one (u, inv, y) tuple."""
    return part_grad(w, *part)


def warm_part(u, inv, y, probe):
    """The untimed warm-up task: reads its whole partition and a small
    published array."""
    return int(u[-1]) + int(inv.max()) + float(y.sum()) + float(probe[0])


class Combiner:
    """Sums the partitions' sparse gradients per index, in partition order."""

    def __init__(self, us):
        self.U = np.unique(np.concatenate(us))
        self.pos = [np.searchsorted(self.U, u) for u in us]

    def __call__(self, results):
        G = np.zeros(self.U.size)
        loss = 0.0
        for pos, (g, lp) in zip(self.pos, results):
            G[pos] += g
            loss += lp
        return G, loss


def train(w, comb, iters, step, publish, grads, retire, log=None):
    """``iters`` iterations; per iteration publish(w) -> h, grads(h) -> the
    partitions' results in order, the update, retire(h).  (times, losses)."""
    times, losses = [], []
    for it in range(iters):
        t = time.perf_counter()
        h = publish(w)
        t1 = time.perf_counter()
        res = grads(h)
        t2 = time.perf_counter()
        G, loss = comb(res)
        w[comb.U] -= step * G
        retire(h)
        t3 = time.perf_counter()
        times.append(t3 - t)
        PHASES.append((t1 - t, t2 - t1, t3 - t2))
        losses.append(loss)
        if log:
            log(it, times[-1], loss)
    return times, losses


PHASES = []   # (publish s, tasks s, combine + update + retire s) of each iteration train() ran


def initial_weights(meta):
    """The weights every system starts from: zeros, or with ``--init warm``
    a model trained before (a warm start): every entry nonzero, small, from
    a hash of its index, so that every page is dense and an iteration
    changes a few of its words."""
    n = 1 << meta["bits"]
    if meta.get("init", "zeros") == "zeros":
        return np.zeros(n)
    w = np.empty(n)
    step = 1 << 22
    for i in range(0, n, step):   # (in slices: the hash makes temporaries)
        w[i:i + step] = 0.01 * (true_weight(np.arange(i, min(n, i + step)), meta["seed"] + 1) + 0.5 + 1e-3)
    return w


def changed_bytes(w0U, Gs, step):
    """Bytes of the weights each update changed: the updates replayed on the
    entries of U (no other entry changes), as the driver computes them."""
    cur, out = w0U.copy(), []
    for G in Gs:
        new = cur - step * G
        out.append(int(np.count_nonzero(new != cur)) * 8)
        cur = new
    return out


def reference(parts, meta):
    """The single-process numpy run: (times, losses, final w[U])."""
    comb = Combiner([p[0] for p in parts])
    w = initial_weights(meta)
    times, losses = train(w, comb, meta["iters"], meta["lr"] / meta["points"], lambda w: w,
                          lambda w: [part_grad(w, *p) for p in parts], lambda h: None)
    return times, losses, w[comb.U].copy()


# ---- the systems (each in a subprocess: --run SYSTEM) ----------------------------------------

def _log(name):
    def log(it, t, loss):
        a, b, c = PHASES[-1]
        print(f"  {name:>6} iteration {it}: {t:8.3f} s (publish {a:.3f}, tasks {b:.3f}, update {c:.3f})  "
              f"loss {loss:.10g}", flush=True)
    return log


def started(system, meta, hosts):
    """``system`` with W workers through the harness (one per host of ``hosts``)."""
    return _harness.start(system, meta["workers"], hosts, executor_mb=meta["spark_executor_mb"],
                          driver_memory=meta["spark_driver_memory"], app="sparse_lr", progress=False)


def run_clamor(d, meta, hosts):
    import clamor

    P, iters = meta["partitions"], meta["iters"]
    w = clamor.zeros(1 << meta["bits"])
    if meta.get("init", "zeros") != "zeros":
        w[:] = initial_weights(meta)
    us = []
    rparts = []
    for i in range(P):
        u, inv, y = load_part(d, i)
        us.append(u)
        rparts.append((clamor.array(u), clamor.array(inv), clamor.array(y)))
        del inv
    comb0 = Combiner(us)
    w0U = w[comb0.U].copy()
    Gs = []

    def comb(res):   # the updates, for the bytes they change (counted after the run)
        G, loss = comb0(res)
        Gs.append(G)
        return G, loss
    comb.U = comb0.U
    probe = clamor.zeros(8)
    extra = {}
    with started("clamor", meta, hosts) as cl:
        idx = cl.range(P, partitions=P)
        idx.map(lambda p: warm_part(*rparts[p], probe)).collect()   # untimed: every worker, its partition
        n_warm = len(cl.stage_stats())
        links = _harness.Links(hosts)

        def grads(_):
            return idx.map(lambda p: part_grad(w, *rparts[p])).collect()

        times, losses = train(w, comb, iters, meta["lr"] / meta["points"], lambda w: None, grads,
                              lambda h: None, _log("clamor"))
        stages = cl.stage_stats()[n_warm:]
        st = cl.stats()
        extra["link_bytes"] = links.bytes()
        for k in ("bytes_from_driver", "bytes_from_peers", "bytes_mapped", "faults", "wire_bytes", "wire_bytes_diff"):
            extra[f"per_iter_{k}"] = [int(s.get(k, 0) or 0) for s in stages]
            extra[k] = sum(extra[f"per_iter_{k}"])
        extra["per_iter_changed_bytes"] = changed_bytes(w0U, Gs, meta["lr"] / meta["points"])
        extra["task_max_s"] = [round(s["task_s"]["max"], 4) for s in stages if "task_s" in s]
        extra["same_host"] = st.get("same_host", {}).get("mode") if isinstance(st.get("same_host"), dict) else None
        from clamor import region
        extra["page_size"] = region.page_size()
        cs = clamor.stats()
        extra["driver_pages_logged"] = cs.get("pages_logged")
        extra["driver_pages_logged_ahead"] = cs.get("pages_logged_ahead")
        extra["driver_version_bytes"] = cs.get("version_bytes")
        extra["driver_diff_pages_served"] = cs.get("diff_pages_served")
        extra["driver_diff_pages_reused"] = cs.get("diff_pages_reused")
        extra["bytes"] = extra["link_bytes"] if hosts is not None else extra["wire_bytes"]
    return times, losses, w[comb0.U].copy(), extra


def run_peer(system, d, meta, hosts):
    """The weights re-sent every iteration the peer's users' way
    (``_harness.shared``), the partitions loaded on the workers first."""
    P, W, iters = meta["partitions"], meta["workers"], meta["iters"]
    us = [np.load(os.path.join(d, f"u{i}.npy")) for i in range(P)]
    comb = Combiner(us)
    w = initial_weights(meta)
    with started(system, meta, hosts) as h:
        publish, tasks, retire = _harness.shared(system, h)
        if system == "spark":
            rdd = h.parallelize(range(P), P).map(lambda i: load_part(d, i)).cache()
            bc = h.broadcast(np.zeros(8))
            rdd.map(lambda p: warm_part(*p, bc.value)).collect()   # untimed: loads and caches the partitions
            bc.destroy()
        elif system == "dask":
            parts = h.map(load_part, [d] * P, range(P), pure=False)
            probe = h.scatter(np.zeros(8), broadcast=True)
            h.gather([h.submit(lambda p, q: warm_part(*p, q), f, probe, pure=False) for f in parts])
            del probe
        else:
            warm_task = h.remote(lambda p, q: warm_part(*p, q))
            parts = [h.put(load_part(d, i)) for i in range(P)]
            pids = _harness.ray_wait_workers(h, W)
            probe = h.put(np.zeros(1 << 17))   # 1 MiB: in the object store, not inlined
            h.get([warm_task.remote(r, probe) for r in parts])
            del probe
        line, extra = _harness.peer_facts(system, h, pids if system == "ray" else ())
        if system == "dask":
            extra["partition_holders"] = len({tuple(v) for v in h.who_has(parts).values()})
            line += f", partitions on {extra['partition_holders']} of them"
        print(f"  {line}", flush=True)

        def grads(wh):   # Spark's partitions: the cached RDD's
            if system == "spark":
                return rdd.mapPartitions(lambda it: [part_grad(wh.value, *p) for p in it]).collect()
            return tasks(grad_of, wh, parts)

        links = _harness.Links(hosts)
        times, losses = train(w, comb, iters, meta["lr"] / meta["points"], publish, grads, retire, _log(system))
        extra["link_bytes"] = links.bytes()
    extra["bytes"] = extra["link_bytes"] if hosts is not None else w.nbytes * W * iters
    return times, losses, w[comb.U].copy(), extra


def child(system, d, out):
    """``--run SYSTEM``: one system over the data in ``d``; its figures to
    ``out`` (its weights beside, .w.npy) or the reason it could not run."""
    meta = _harness.read_json(os.path.join(d, "meta.json"))

    def run():
        with _harness.hosts_for(meta["workers"], meta["rate"]) as hosts:
            times, losses, wU, extra = run_clamor(d, meta, hosts) if system == "clamor" else \
                run_peer(system, d, meta, hosts)
        np.save(out + ".w.npy", wU)
        return {"times": times, "losses": losses, "extra": extra, "phases": PHASES[-len(times):]}

    return _harness.child_result(system, out, run)


# ---- the driver ----------------------------------------------------------------------------

def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.maximum(np.abs(b), np.max(np.abs(b)) * 1e-6 + 1e-300)
    return float(np.max(np.abs(a - b) / scale)) if a.size else 0.0


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], "2^24 weights, 200k points", "2^18 weights, 5k points, 3 iterations, 2 "
                "workers, one host; Spark and Ray left out unless named (seconds; the tests run it)")
    ap.add_argument("--bits", type=int, help="log2 of the weight count (default 27; quick 24)")
    ap.add_argument("--points", type=int, help="points (default 1M; quick 200k)")
    ap.add_argument("--workers", type=int, default=None, help="worker processes of every system (default 4)")
    ap.add_argument("--partitions", type=int, help="partitions (default: workers)")
    ap.add_argument("--iters", type=int, default=None, help="iterations (10; smoke 3)")
    ap.add_argument("--lr", type=float, default=0.5, help="step on the mean gradient")
    ap.add_argument("--zipf", type=float, default=1.3, help="Zipf exponent of each field's values")
    ap.add_argument("--vocab", type=float, default=4e6, help="largest field's vocabulary (smallest 16)")
    ap.add_argument("--init", choices=("zeros", "warm"), default="zeros",
                    help="zeros: start from zero weights (default); warm: from a model trained before, every "
                         "weight nonzero (dense pages, a few words of each changed per iteration)")
    ap.add_argument("--layout", choices=("hashed", "ranked"), default="hashed",
                    help="hashed: (field, value) hashed into the vector (default); ranked: per-field ranges, "
                         "values in frequency order")
    ap.add_argument("--netns", action="store_true", help="namespace hosts even with --quick")
    ap.add_argument("--local", action="store_true", help="one host even for the full run")
    ap.add_argument("--rate", default="1gbit", help="every namespace host's link, both ways (tc notation)")
    ap.add_argument("--seed", type=int, default=1)
    _harness.child_args(ap, SYSTEMS, "the weights", default=SYSTEMS, note="; clamor always runs")
    args = ap.parse_args(argv)
    if args.run:
        return child(args.run, args.data, args.out)

    _harness.subreaper()
    sm = args.smoke
    bits = args.bits or (18 if sm else 24 if args.quick else 27)
    n = args.points or (5_000 if sm else 200_000 if args.quick else 1_000_000)
    args.iters = args.iters or (3 if sm else 10)
    args.workers = W = args.workers or (2 if sm else 4)
    P = args.partitions or W
    systems, smoke_left_out = _harness.pick_systems(ap, args, SYSTEMS, SYSTEMS)
    systems = ["clamor"] + [s for s in systems if s != "clamor"]
    wbytes = 8 << bits
    netns = (args.netns or not (args.quick or sm)) and not args.local
    if netns:
        from clamor.testing import nethosts
        ok, why = nethosts.available()
        if not ok:
            raise SystemExit(f"sparse_lr: namespace hosts cannot be made here ({why}); --local runs on one host")
    mb, dm = _harness.spark_memory(args, wbytes)
    meta = {"netns": netns, "rate": args.rate if netns else None, "bits": bits, "points": n, "workers": W,
            "partitions": P, "iters": args.iters, "lr": args.lr, "layout": args.layout, "zipf": args.zipf,
            "vocab": args.vocab, "seed": args.seed, "init": args.init, "spark_executor_mb": mb,
            "spark_driver_memory": dm}
    t_all = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="sparse_lr-", ignore_cleanup_errors=True) as d:
            t = time.perf_counter()
            idx, y, vocabs = make_data(n, bits, args.zipf, args.vocab, args.seed, args.layout)
            parts = cut(idx, y, P)
            distinct = np.unique(idx)
            page = 64 << 10
            pages_total = max(1, wbytes // page)
            pages_touched = np.unique(distinct * 8 // page).size
            del idx
            save_parts(d, parts, meta)
            gen_s = time.perf_counter() - t
            per_part = [p[0].size for p in parts]
            print(f"sparse_lr: {n} points x {FIELDS} fields, 2^{bits} weights ({wbytes / MIB:.0f} MiB float64), "
                  f"{W} workers, {P} partitions, {args.iters} iterations; {args.layout} layout, Zipf {args.zipf}, "
                  f"vocabularies "
                  f"{vocabs[0]}..{vocabs[-1]}; {distinct.size} distinct weights touched "
                  f"({distinct.size / (1 << bits):.2%} of them; a partition {min(per_part)}..{max(per_part)}), "
                  f"on {pages_touched} of {pages_total} 64 KiB pages ({pages_touched / pages_total:.1%}); "
                  f"positive labels {y.mean():.1%}; generated in {gen_s:.1f} s", flush=True)

            t = time.perf_counter()
            ref_times, ref_losses, ref_w = reference(parts, meta)
            ref_s = time.perf_counter() - t
            del parts
            print(f"single-process numpy: {np.mean(ref_times):.3f} s an iteration; losses "
                  f"{ref_losses[0]:.6g} -> {ref_losses[-1]:.10g}", flush=True)
            if not ref_losses[-1] < ref_losses[0]:
                raise SystemExit("sparse_lr: the loss did not go down; choose another --lr")

            def check(s, r):
                if "times" not in r:
                    if s == "clamor":
                        raise SystemExit(f"sparse_lr: clamor failed: {_harness.why_not(r)}\n{r.get('traceback', '')}")
                    return
                le = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref_losses))
                we = rel_err(r["w"], ref_w)
                r["loss_rel_err"], r["w_rel_err"] = le, we
                print(f"  {s}: {np.mean(r['times']):.3f} s an iteration (median {np.median(r['times']):.3f}); "
                      f"loss {r['losses'][-1]:.10g}, relative error {le:.2g} (losses), {we:.2g} (weights); "
                      f"{r['wall_s']:.0f} s with start-up and loading", flush=True)
                if len(r["losses"]) != len(ref_losses) or le > 1e-9 or we > 1e-9:
                    raise SystemExit(f"sparse_lr: {s}'s answer differs from the single-process run "
                                     f"(losses {le:.3g}, weights {we:.3g} relative): the comparison is void")

            results = _harness.run_systems(systems, [sys.executable, os.path.abspath(__file__), "--data", d], d,
                                           args.timeout, load=lambda s, r, out: r.update(w=np.load(out + ".w.npy")),
                                           check=check)
    finally:
        left = _harness.reap_descendants()
        if left:
            print(f"killed processes left behind: {left}", flush=True)

    c = results["clamor"]
    c_iter = float(np.mean(c["times"]))
    out = {"bench": "sparse_lr"}
    for s in SYSTEMS:
        r = results.get(s)
        ok = r is not None and "times" in r
        if s != "clamor":
            out[f"speedup_vs_{s}"] = round(float(np.mean(r["times"])) / c_iter, 2) if ok else None
        out[f"{s}_iter_s"] = round(float(np.mean(r["times"])), 4) if ok else None
        out[f"{s}_iter_median_s"] = round(float(np.median(r["times"])), 4) if ok else None
        out[f"{s}_bytes"] = int(r["extra"]["bytes"]) if ok else None
        if ok:
            out[f"{s}_times_s"] = [round(t, 4) for t in r["times"]]
            ph = np.mean(np.asarray(r["phases"]), axis=0)
            out[f"{s}_phases_s"] = {"publish": round(float(ph[0]), 4), "tasks": round(float(ph[1]), 4),
                                    "update": round(float(ph[2]), 4)}
        else:
            out[f"{s}_missing"] = _harness.missing(s, r, smoke_left_out)
    ce = c["extra"]
    out.update({
        "systems_run": [s for s in SYSTEMS if s in results and "times" in results[s]], "smoke": sm,
        "clamor_bytes_mapped": ce.get("bytes_mapped"),
        "clamor_bytes_from_peers": ce.get("bytes_from_peers"), "clamor_faults": ce.get("faults"),
        "clamor_task_max_s": ce.get("task_max_s"), "clamor_same_host": ce.get("same_host"),
        "clamor_driver_pages_logged_ahead": ce.get("driver_pages_logged_ahead"),
        "clamor_driver_diff_pages_served": ce.get("driver_diff_pages_served"),
        "clamor_driver_diff_pages_reused": ce.get("driver_diff_pages_reused"),
        "single_iter_s": round(float(np.mean(ref_times)), 4), "loss": ref_losses[-1],
        "first_loss": ref_losses[0],
        "max_loss_rel_err": max(r["loss_rel_err"] for r in results.values() if "times" in r),
        "max_w_rel_err": max(r["w_rel_err"] for r in results.values() if "times" in r),
        "weights": 1 << bits, "weights_bytes": wbytes, "points": n, "fields": FIELDS,
        "distinct_weights": int(distinct.size),
        "pages_touched_frac": round(pages_touched / pages_total, 4), "workers": W, "partitions": P,
        "iters": args.iters, "hosts": W if netns else 1, "rate": args.rate if netns else None,
        "time_unit": "s per iteration", "clamor_wire_bytes": ce.get("wire_bytes"),
        # an iteration's fetches carry the previous iteration's update: wire bytes of iterations 1.. against
        # the bytes of the weights updates 0.. changed, per worker (each worker fetches every page it reads)
        "clamor_wire_bytes_per_iter": ce.get("per_iter_wire_bytes"),
        "clamor_wire_bytes_diff_per_iter": ce.get("per_iter_wire_bytes_diff"),
        "changed_bytes_per_iter": ce.get("per_iter_changed_bytes"),
        "clamor_wire_per_changed_per_worker": (
            round(sum(ce["per_iter_wire_bytes"][1:]) / W / max(1, sum(ce["per_iter_changed_bytes"][:-1])), 3)
            if ce.get("per_iter_wire_bytes") and len(ce["per_iter_wire_bytes"]) > 1 else None),
        "init": args.init,
        "link_bytes": {s: r["extra"].get("link_bytes") for s, r in results.items() if "times" in r} if netns else None,
        "layout": args.layout, "zipf": args.zipf, "vocab": int(args.vocab),
        "spark_executor_mb": meta["spark_executor_mb"],
        "spark_driver_memory": meta["spark_driver_memory"],
        "versions": {s: results[s]["extra"].get("version") for s in results if "times" in results[s]},
        "gen_s": round(gen_s, 1), "reference_s": round(ref_s, 1),
        "wall_s": {s: round(r["wall_s"], 1) for s, r in results.items()},
        "total_s": round(time.perf_counter() - t_all, 1), "verified": True,
    })
    json_line(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
