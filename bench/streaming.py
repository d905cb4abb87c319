"""Streaming updates: clamor's page invalidation against re-broadcast (Fig. 9).

The driver builds an open-addressing hash table in the region: one int64
array of (key, value) slots, placed by a multiplicative (Fibonacci) hash
with linear probing, half full.  Each round, every one of ``--workers``
workers looks up ``--lookups`` keys drawn Zipf(``--zipf``) over the key set
(plus the key updated last), vectorised with numpy, and returns a checksum.
Between rounds the driver updates one hot key in place: it writes that
key's value slot and nothing else.

Both systems run the same rounds, interleaved, in one run:

  clamor     a ``clamor.Cluster``: the table travels by reference, workers
             fault in the pages they read and keep them across rounds; the
             page the driver wrote is invalidated on the workers (the list
             travels with the next round's tasks) and fetched again.
  broadcast  ``--workers`` plain processes (spawned before the region
             exists), each on a socketpair: every round the driver ships
             the whole table to every worker, all at once, two ways:
             "pickle"    pickle.dumps(table) once, the bytes to each worker,
                         which unpickles them (Spark's re-broadcast);
             "zero-copy" the region's own buffer straight into a bytearray
                         each worker keeps across rounds (pickle protocol 5,
                         out of band): the cheapest whole-table broadcast.

Every round all three answers are checked against the driver's own sums
over its key -> value arrays (which do not use the table), and all must see
the updated key's new value.  Per round the script prints the times and the
table bytes moved: clamor's ``bytes_from_driver`` (+ peers) from
``cl.stage_stats()``, and the pickled bytes x workers for the broadcast.

    python bench/streaming.py            # 2^25 slots = 512 MiB, 10 rounds
    python bench/streaming.py --quick    # 2^23 slots = 128 MiB, 6 rounds

The last line printed is the JSON line.  ``clamor_round_s`` and
``broadcast_round_s`` (pickle) are medians over the rounds after the first,
``speedup`` their ratio; ``*_late_*`` are medians over the second half of the
rounds.  Zipf lookups keep reaching pages no worker has read yet for several
rounds, so clamor's rounds get cheaper as its workers' caches fill; the
late figures are nearer its steady state (one page refetched a round).
"""
import argparse
import os
import pickle
import socket
import statistics
import sys
import time

import numpy as np

from _common import Spawned, json_line, zipf_ranks

FIB = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: Fibonacci hashing
EMPTY = 0                            # keys are >= 1


# ---- the hash table (pure numpy; runs in the driver and in both kinds of worker) ----

def slot_hash(keys, bits):
    """Home slot of each key: the top ``bits`` bits of key * FIB (mod 2^64)."""
    return ((keys.astype(np.uint64) * FIB) >> np.uint64(64 - bits)).astype(np.int64)


def build(table, keys, vals, bits):
    """Insert every (key, value) into ``table`` (slots x 2, all EMPTY) by
    linear probing, vectorised: each pass, keys whose probe slot is free
    scatter into it; one of each clash wins (the last write) and the rest
    move on one slot.  Returns the slot of each key."""
    mask = (1 << bits) - 1
    tk = table[:, 0]
    slot_of = np.empty(len(keys), dtype=np.int64)
    pending = np.arange(len(keys), dtype=np.int64)
    pos = slot_hash(keys, bits)
    while pending.size:
        free = tk[pos] == EMPTY
        cand, cpos = pending[free], pos[free]
        tk[cpos] = keys[cand]
        won = tk[cpos] == keys[cand]
        wk, wpos = cand[won], cpos[won]
        table[wpos, 1] = vals[wk]
        slot_of[wk] = wpos
        placed = np.zeros(len(pending), dtype=bool)
        placed[np.flatnonzero(free)[won]] = True
        pending, pos = pending[~placed], (pos[~placed] + 1) & mask
    return slot_of


def lookup(table, q, bits):
    """Values of keys ``q`` (0 for a key that is absent)."""
    mask = (1 << bits) - 1
    out = np.zeros(len(q), dtype=np.int64)
    idx = np.arange(len(q), dtype=np.int64)
    pos = slot_hash(q, bits)
    while idx.size:
        k = table[pos, 0]
        hit = k == q[idx]
        out[idx[hit]] = table[pos[hit], 1]
        go = ~hit & (k != EMPTY)
        idx, pos = idx[go], (pos[go] + 1) & mask
    return out


def answer(table, q, bits):
    """What a worker sends back for its share ``q``: (checksum, keys found,
    value of its last key, which is the key updated last)."""
    v = lookup(table, q, bits)
    return int(v.sum()), int(np.count_nonzero(v)), int(v[-1])


# ---- broadcast workers ----------------------------------------------------------------

def broadcast_worker(conn):
    """Each round: (mode, pickle metadata, nbytes, queries, bits), then the
    table's bytes; reply answer().  Mode "pickle" gets pickle.dumps(table)
    and unpickles it into new memory; mode "zero-copy" receives the raw
    buffer straight into one bytearray kept across rounds (pickle protocol
    5, out of band), the best a re-broadcast can do."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))   # the same socketpair, for recv_into
    table = buf = None
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                return
            mode, meta, nbytes, q, bits = msg
            if mode == "pickle":
                table = None                              # drop last round's copy first
                blob = conn.recv_bytes()
                table = pickle.loads(blob)
                del blob
            else:
                if buf is None or len(buf) != nbytes:
                    table = buf = None
                    buf = bytearray(nbytes)
                view, got = memoryview(buf), 0
                while got < nbytes:
                    k = sock.recv_into(view[got:])
                    if not k:
                        return
                    got += k
                table = pickle.loads(meta, buffers=[view])
            conn.send(answer(table, q, bits))
    except (EOFError, OSError, KeyboardInterrupt):   # the driver is gone
        return
    finally:
        sock.close()


class Broadcast(Spawned):
    """``n`` spawned processes that get the whole table every round, over a
    socketpair each (multiprocessing.Pipe), all sends at once."""

    MODES = ("pickle", "zero-copy")

    def __init__(self, n):
        self.socks = []   # the same socketpairs, for sendall of the raw buffer
        super().__init__(n, broadcast_worker)
        try:
            for a in self.conns:
                self.socks.append(socket.socket(fileno=os.dup(a.fileno())))
        except BaseException:
            self.close()
            raise

    def round(self, mode, table, shares, bits):
        """Ship the table to every worker and run one share on each;
        returns (answers, table bytes sent)."""
        if mode == "pickle":
            blob = pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL)

            def one(i):
                self.conns[i].send((mode, None, len(blob), shares[i], bits))
                self.conns[i].send_bytes(blob)
                return self.conns[i].recv()
            size = len(blob)
        else:
            bufs = []
            meta = pickle.dumps(table, protocol=5, buffer_callback=bufs.append)
            (raw,) = [b.raw() for b in bufs]            # the region's own bytes, no copy

            def one(i):
                self.conns[i].send((mode, meta, raw.nbytes, shares[i], bits))
                self.socks[i].sendall(raw)
                return self.conns[i].recv()
            size = len(meta) + raw.nbytes
        answers = self.map(one)
        return answers, size * len(self.conns)

    def close(self):
        super().close()
        for s in self.socks:
            s.close()


# ---- the driver -----------------------------------------------------------------------

def mib(n):
    return f"{n / (1 << 20):9.2f} MiB"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2^23 slots (128 MiB), 6 rounds")
    ap.add_argument("--bits", type=int, help="log2 of the slot count (16 bytes a slot; default 25)")
    ap.add_argument("--rounds", type=int, help="rounds (default 10, --quick 6)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lookups", type=int, default=20000, help="lookups per worker per round")
    ap.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the lookups")
    ap.add_argument("--load", type=float, default=0.5, help="fraction of slots holding a key")
    ap.add_argument("--hot", type=int, default=1000, help="the updated key is one of the hottest HOT")
    ap.add_argument("--page-size", type=int, help="clamor page size in bytes (default: the region's)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    bits = args.bits or (23 if args.quick else 25)
    rounds = args.rounds or (6 if args.quick else 10)
    W = args.workers
    if rounds < 2 or W < 1 or not 0 < args.load < 1:
        ap.error("need --rounds >= 2, --workers >= 1 and 0 < --load < 1")

    # Spawn the broadcast side first, before this process has a region.
    with Broadcast(W) as bc:
        import clamor

        rng = np.random.default_rng(args.seed)
        slots = 1 << bits
        n = int(slots * args.load)
        t0 = time.perf_counter()
        keys = np.sort(rng.integers(1, 1 << 62, size=n, dtype=np.int64))
        keys = keys[np.append(True, keys[1:] != keys[:-1])]   # distinct (np.unique is far slower here)
        rng.shuffle(keys)                     # rank i (0 = hottest) is keys[i]
        n = len(keys)
        vals = rng.integers(1, 1 << 40, size=n, dtype=np.int64)
        table = clamor.zeros((slots, 2), dtype=np.int64)
        slot_of = build(table, keys, vals, bits)
        build_s = time.perf_counter() - t0
        assert np.array_equal(lookup(table, keys[:1000], bits), vals[:1000])
        print(f"streaming: hash table of {slots} slots ({mib(table.nbytes).strip()}, {n} keys) built in "
              f"{build_s:.1f}s; {W} workers x {args.lookups} lookups Zipf({args.zipf}) a round, "
              f"one hot key updated between rounds", flush=True)

        modes = Broadcast.MODES
        rows = []
        with clamor.Cluster(workers=W, page_size=args.page_size, progress=False) as cl:
            psize = clamor.region.page_size()
            print(f"clamor page size {psize} bytes; table = {table.nbytes // psize} pages; broadcast over a "
                  f"socketpair per worker: 'pickle' = pickle.dumps/loads of the table, 'zero-copy' = its raw "
                  f"buffer into a kept bytearray", flush=True)
            print(f"{'round':>5} | {'clamor s':>9} {'bytes':>13} {'faults':>6} {'changed':>7} {'inval':>5} "
                  f"{'task s':>7} | {'pickle s':>9} {'zero-copy s':>11} {'bytes':>13} | {'speedup':>7} "
                  f"{'vs 0-copy':>9}", flush=True)

            def task(part):
                st = clamor.stats()
                return [(answer(table, part, bits), os.getpid(), st["pages_invalidated"])]

            updated = None      # index of the key updated before this round
            inval_seen = {}     # worker pid -> pages_invalidated so far
            for r in range(rounds):
                logged = cl.stats()["driver"]
                if r:
                    # the driver writes one value slot in place, seen by both
                    updated = int(rng.integers(0, min(args.hot, n)))
                    vals[updated] = int(rng.integers(1, 1 << 40))
                    table[slot_of[updated], 1] = vals[updated]
                last = updated if updated is not None else 0
                # each share ends with the key updated last; the driver's own
                # answer comes from its key -> value arrays, not the table
                picks = [np.append(zipf_ranks(rng, args.zipf, n, args.lookups), last) for _ in range(W)]
                shares = [keys[i] for i in picks]
                expect = [(int(vals[i].sum()), len(i), int(vals[last])) for i in picks]

                t = time.perf_counter()
                out = cl.parallelize(np.concatenate(shares), partitions=W).map_partitions(task).collect()
                row = {"clamor_s": time.perf_counter() - t}
                st = cl.stage_stats()[-1]
                after = cl.stats()["driver"]
                got = [a for a, _, _ in out]
                inval = 0
                for _, pid, n_inv in out:   # counters are cumulative per worker
                    inval += n_inv - inval_seen.get(pid, n_inv if r == 0 else 0)
                    inval_seen[pid] = n_inv

                answers = {"clamor": got}
                for mode in modes:
                    t = time.perf_counter()
                    answers[mode], sent = bc.round(mode, table, shares, bits)
                    row[mode + "_s"] = time.perf_counter() - t
                    row[mode + "_bytes"] = sent
                for who, ans in answers.items():
                    if ans != expect:
                        raise SystemExit(f"streaming: round {r}: {who} disagrees with the driver\n"
                                         f"  driver {expect}\n  {who} {ans}")
                row.update(clamor_bytes=st["bytes_from_driver"] + st["bytes_from_peers"], faults=st["faults"],
                           changed=(after["pages_logged"] - logged["pages_logged"])
                           - (after["pages_unchanged"] - logged["pages_unchanged"]),
                           invalidated=inval, task_s=st["task_s"]["max"])
                rows.append(row)
                print(f"{r:>5} | {row['clamor_s']:>9.4f} {mib(row['clamor_bytes'])} {row['faults']:>6} "
                      f"{row['changed']:>7} {inval:>5} {row['task_s']:>7.4f} | {row['pickle_s']:>9.4f} "
                      f"{row['zero-copy_s']:>11.4f} {mib(row['pickle_bytes'])} | "
                      f"{row['pickle_s'] / row['clamor_s']:>6.1f}x {row['zero-copy_s'] / row['clamor_s']:>8.1f}x",
                      flush=True)
            tot = cl.stats()

    def med(k, first=1):
        return statistics.median(r[k] for r in rows[first:])

    cl_med, bc_med, zc_med = med("clamor_s"), med("pickle_s"), med("zero-copy_s")
    # The Zipf tail keeps reaching pages no worker has read yet for several
    # rounds; the second half of the rounds is closer to the steady state.
    half = rounds // 2
    cl_late, bc_late, zc_late = med("clamor_s", half), med("pickle_s", half), med("zero-copy_s", half)
    print(f"median over rounds 1..{rounds - 1}: clamor {cl_med:.4f}s, broadcast {bc_med:.4f}s (pickle), "
          f"{zc_med:.4f}s (zero-copy); speedup {bc_med / cl_med:.1f}x, {zc_med / cl_med:.1f}x against the "
          f"zero-copy broadcast", flush=True)
    print(f"median over rounds {half}..{rounds - 1}: clamor {cl_late:.4f}s, broadcast {bc_late:.4f}s (pickle), "
          f"{zc_late:.4f}s (zero-copy); speedup {bc_late / cl_late:.1f}x, {zc_late / cl_late:.1f}x", flush=True)
    print(f"clamor moved {mib(sum(r['clamor_bytes'] for r in rows)).strip()} in {rounds} rounds, the broadcast "
          f"{mib(sum(r['pickle_bytes'] for r in rows)).strip()}; every checksum and every updated key agreed "
          f"with the driver", flush=True)

    def col(k):
        return [r[k] for r in rows]

    json_line({
        "bench": "streaming", "clamor_round_s": cl_med, "broadcast_round_s": bc_med, "speedup": bc_med / cl_med,
        "broadcast_zero_copy_round_s": zc_med, "speedup_vs_zero_copy": zc_med / cl_med,
        "late_rounds_from": half, "clamor_late_round_s": cl_late, "broadcast_late_round_s": bc_late,
        "broadcast_zero_copy_late_round_s": zc_late, "speedup_late": bc_late / cl_late,
        "speedup_late_vs_zero_copy": zc_late / cl_late,
        "table_bytes": int(table.nbytes), "slots": slots, "keys": n, "rounds": rounds, "workers": W,
        "lookups_per_worker": args.lookups, "zipf_a": args.zipf, "page_size": psize, "build_s": build_s,
        "clamor_round_s_list": col("clamor_s"), "broadcast_round_s_list": col("pickle_s"),
        "broadcast_zero_copy_round_s_list": col("zero-copy_s"),
        "clamor_bytes_per_round": col("clamor_bytes"), "broadcast_bytes_per_round": col("pickle_bytes"),
        "clamor_faults_per_round": col("faults"), "pages_changed_per_round": col("changed"),
        "pages_invalidated_per_round": col("invalidated"), "clamor_task_s_per_round": col("task_s"),
        "clamor_bytes_total": tot["bytes_from_driver"] + tot["bytes_from_peers"], "verified": True,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
