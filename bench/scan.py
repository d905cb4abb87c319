#!/usr/bin/env python3
"""Sequential scan of a region array from a worker, against loopback TCP.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"scan.py".
"""
import argparse
import mmap
import os
import socket
import statistics
import subprocess
import sys
import time

from _common import (GIB, MIB, cold_scan, cpu_delta, die_with_parent, ensure_built, exact_array, human,
                     parse_size, same_host_modes, thread_cpu)
from _harness import json_line, parser


# ---- loopback TCP baseline ------------------------------------------------------

def _tcp_sender(port, total, msg, mode):
    """Child process: connect, then stream or answer requests."""
    die_with_parent()
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(os.urandom(msg))
    view = memoryview(buf)
    req = bytearray(8)
    n = total // msg
    if mode in ("stream", "fresh"):
        s.recv_into(req, 1)  # "go"
        for _ in range(n):
            s.sendall(view)
    else:
        for _ in range(n):
            got = 0
            while got < 8:
                k = s.recv_into(memoryview(req)[got:])
                if not k:
                    return
                got += k
            s.sendall(view)
    s.recv_into(req, 1)  # wait for the receiver to finish before closing
    s.close()


def _recv_exact(s, view):
    got, n = 0, len(view)
    while got < n:
        k = s.recv_into(view[got:])
        if not k:
            raise ConnectionError("the TCP sender went away")
        got += k


def tcp_rate(total, msg, mode):
    """GB/s of ``total`` bytes moved from a child process to this one.

    ``stream``: one direction, received into one reused ``msg``-byte buffer.
    ``reqrep``: an 8-byte request, then one ``msg``-byte reply, one in flight.
    ``fresh``: streamed into consecutive slices of a new ``total``-byte memfd
    mapping, so every byte lands in a page never touched before, as in the
    worker's fill view (what a fetch-on-touch scan pays for new memory).
    """
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_tcp-sender", str(port), str(total),
                              str(msg), mode])
    try:
        lsock.settimeout(30)
        s, _ = lsock.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        n = total // msg
        if mode == "fresh":
            fd = os.memfd_create("scan-bench-fresh", os.MFD_CLOEXEC)
            os.ftruncate(fd, n * msg)
            big = mmap.mmap(fd, n * msg)
            os.close(fd)
            view = memoryview(big)
        else:
            view = memoryview(bytearray(msg))
        t0 = time.perf_counter()
        if mode == "stream":
            s.sendall(b"g")
            for _ in range(n):
                _recv_exact(s, view)
        elif mode == "fresh":
            s.sendall(b"g")
            for i in range(n):
                _recv_exact(s, view[i * msg:(i + 1) * msg])
        else:
            req = b"GET-NEXT"
            for _ in range(n):
                s.sendall(req)
                _recv_exact(s, view)
        dt = time.perf_counter() - t0
        s.sendall(b"x")
        s.close()
        child.wait(30)
        if mode == "fresh":
            view.release()
            big.close()
        return n * msg / dt / 1e9
    finally:
        lsock.close()
        if child.poll() is None:
            child.kill()
            child.wait()


# ---- map mode: the worker maps the driver's pages (same host) ---------------------------

def map_rounds(clamor, ref, want, size, reps, mode):
    """The same cold scan by a worker that maps the driver's pages instead of
    fetching them (``same_host="map"``), each round next to this process
    summing the same array in its own memory: ``map_ratio`` is the worker's
    rate over that one."""
    import numpy as np

    x = ref.get()
    # The floor under any scan of memory mapped anew: the same bytes in a
    # memfd of this process's, mapped fresh each round and summed cold (every
    # 4 KiB pays its page-table entry, as a worker's mapping does).
    fd = os.memfd_create("scan-bench-cold", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size) as m:
        m[:] = memoryview(x).cast("B")
    cl = clamor.Cluster(workers=1, start_method=mode, progress=False, speculation=False, same_host="map")
    out = []
    try:
        cl.start()
        same_host_modes(cl, "map", "scan")
        print(f"{'round':>5} {'local sum':>9} {'cold mmap':>9} {'map scan':>8} {'ratio':>6} {'faults':>7} "
              f"{'mapped':>7}   (GB/s)")
        for r in range(reps):
            t = time.perf_counter()
            local = float(x.sum())
            local_gbps = size / (time.perf_counter() - t) / 1e9
            with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
                arr = np.frombuffer(m, dtype=np.float64)
                t = time.perf_counter()
                cold = float(arr.sum())
                cold_gbps = size / (time.perf_counter() - t) / 1e9
                del arr
            res = cl.run(cold_scan, ref)[0]
            if res["sum"] != want or local != want or cold != want:
                raise SystemExit(f"scan: wrong sum in map mode: worker {res['sum']!r}, driver {local!r}, want {want!r}")
            st = res["stats"]
            if st["pages_fetched"]:
                raise SystemExit(f"scan: {st['pages_fetched']} pages fetched in map mode")
            g = size / res["cold_s"] / 1e9
            out.append({"map": g, "local": local_gbps, "cold": cold_gbps, "faults": st["faults"],
                        "pages_mapped": st["pages_mapped"]})
            print(f"{r:>5} {local_gbps:>9.2f} {cold_gbps:>9.2f} {g:>8.2f} {g / local_gbps:>6.2f} {st['faults']:>7} "
                  f"{st['pages_mapped']:>7}", flush=True)
    finally:
        cl.close()
        os.close(fd)
    print(f"median: map-mode scan {statistics.median(m['map'] for m in out):.2f} GB/s, "
          f"{statistics.median(m['map'] / m['local'] for m in out):.2f} of this process's own sum (target >= 0.8)")
    return out


# ---- driver -------------------------------------------------------------------------

def main(argv=None):
    ap = parser(__doc__.splitlines()[0], "256 MiB instead of 1 GiB, 2 rounds", "16 MiB, 1 round (seconds; the tests "
                "run it)", build=True)
    ap.add_argument("--size", type=parse_size, default=None, help="array bytes (default 1G, quick 256M)")
    ap.add_argument("--readahead", type=parse_size, default=None,
                    help="read-ahead bytes on the worker, 0 disables (default: clamor's setting)")
    ap.add_argument("--page-size", type=parse_size, default=None, help="region page size (default: clamor's)")
    ap.add_argument("--mode", choices=("spawn", "fork"), default="spawn", help="how the worker is started")
    ap.add_argument("--reps", type=int, default=None, help="rounds of (TCP, scan) (default 3, quick 2)")
    ap.add_argument("--tcp-msg", type=parse_size, default=MIB, help="TCP message size (default 1M)")
    ap.add_argument("--tcp-total", type=parse_size, default=None, help="TCP bytes per round (default: --size)")
    ap.add_argument("--_tcp-sender", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._tcp_sender:
        port, total, msg, mode = args._tcp_sender
        _tcp_sender(int(port), int(total), int(msg), mode)
        return 0

    size = args.size or (16 * MIB if args.smoke else 256 * MIB if args.quick else GIB)
    reps = args.reps or (1 if args.smoke else 2 if args.quick else 3)
    tcp_total = args.tcp_total or size
    clamor = ensure_built(not args.no_build)
    from clamor import region

    region.init(page_size=args.page_size)
    page_size = region.page_size()
    t = time.perf_counter()
    a = exact_array(clamor, size // 8)
    fill_s = time.perf_counter() - t
    t = time.perf_counter()
    want = float(a.sum())
    local_s = time.perf_counter() - t
    ref = clamor.ref(a)
    print(f"scan: {human(size)} float64 array, page {human(page_size)}, worker by {args.mode}, "
          f"{reps} rounds; filled in {fill_s:.2f} s; driver sum {size / local_s / 1e9:.2f} GB/s (local memory)")

    # run's calls are pinned (no speculative copy); off all the same, so that
    # nothing but the scan runs while it is timed
    cl = clamor.Cluster(workers=1, start_method=args.mode, progress=False, speculation=False, same_host="fetch")
    rounds = []
    try:
        cl.start()
        print(f"{'round':>5} {'tcp stream':>10} {'tcp req/rep':>11} {'tcp fresh':>9} {'scan cold':>9} "
              f"{'scan warm':>9} {'ratio':>6} {'faults':>7} {'pages':>7} {'ahead':>7} {'reqs':>6} {'errs':>5} "
              f"{'p50 us':>7}   (GB/s)")
        for r in range(reps):
            tcp = tcp_rate(tcp_total, args.tcp_msg, "stream")
            rr = tcp_rate(tcp_total, args.tcp_msg, "reqrep")
            fresh = tcp_rate(tcp_total, args.tcp_msg, "fresh")
            dcpu0 = thread_cpu()
            res = cl.run(cold_scan, ref, args.readahead, True)[0]
            dcpu = cpu_delta(dcpu0, thread_cpu())  # includes the worker's warm sum: the driver idles then
            ok = res["sum"] == want and res["warm_sum"] == want
            if not ok:
                raise SystemExit(f"scan: wrong sum on the worker: {res['sum']!r} (warm {res['warm_sum']!r}), "
                                 f"driver {want!r}")
            st = res["stats"]
            cold, warm = size / res["cold_s"] / 1e9, size / res["warm_s"] / 1e9
            rounds.append({"tcp": tcp, "reqrep": rr, "fresh": fresh, "cold": cold, "warm": warm, "res": res,
                           "driver_cpu": dcpu})
            print(f"{r:>5} {tcp:>10.2f} {rr:>11.2f} {fresh:>9.2f} {cold:>9.2f} {warm:>9.2f} {cold / tcp:>6.2f} "
                  f"{st['faults']:>7} {st['pages_fetched']:>7} {st['readahead_pages']:>7} "
                  f"{st['fetch_requests']:>6} {st['fetch_errors']:>5} {st['fetch_p50_us']:>7.0f}", flush=True)
    finally:
        cl.close()

    maps = map_rounds(clamor, ref, want, size, reps, args.mode)

    med = lambda k: statistics.median(x[k] for x in rounds)  # noqa: E731
    scan_gbps, tcp_gbps = med("cold"), med("tcp")
    last = rounds[-1]["res"]
    st = last["stats"]
    fresh_gbps = med("fresh")
    per_gib = lambda d: {k: round(v * GIB / size, 3) for k, v in d.items()}  # noqa: E731
    wcpu, dcpu = per_gib(last["cpu"]), per_gib(rounds[-1]["driver_cpu"])
    print("CPU seconds per GiB scanned (last round): worker " + ", ".join(f"{k} {v:.2f}" for k, v in wcpu.items())
          + "; driver " + ", ".join(f"{k} {v:.2f}" for k, v in dcpu.items()))
    print(f"median: scan {scan_gbps:.2f} GB/s vs loopback TCP stream {tcp_gbps:.2f} GB/s -> ratio "
          f"{scan_gbps / tcp_gbps:.2f} (target >= 0.5); vs TCP into fresh memfd pages {fresh_gbps:.2f} GB/s -> "
          f"{scan_gbps / fresh_gbps:.2f}; read-ahead {human(last['readahead'])}, page {human(page_size)}")
    out = {
        "bench": "scan", "scan_gbps": round(scan_gbps, 3), "tcp_gbps": round(tcp_gbps, 3),
        "ratio": round(scan_gbps / tcp_gbps, 3), "tcp_mode": "stream", "tcp_msg": args.tcp_msg,
        "tcp_reqrep_gbps": round(med("reqrep"), 3), "tcp_fresh_gbps": round(fresh_gbps, 3),
        "ratio_fresh": round(scan_gbps / fresh_gbps, 3), "warm_gbps": round(med("warm"), 3),
        "driver_sum_gbps": round(size / local_s / 1e9, 3), "page_size": page_size,
        "readahead": last["readahead"], "bytes": size,
        **{k: st[k] for k in ("faults", "pages_fetched", "bytes_fetched", "readahead_pages", "fetch_requests",
                              "fetch_errors", "fetch_p50_us", "fetch_p99_us")},
        "mode": args.mode, "reps": reps, "scan_gbps_all": [round(x["cold"], 3) for x in rounds],
        "tcp_gbps_all": [round(x["tcp"], 3) for x in rounds], "worker_cpu_s_per_gib": wcpu,
        "driver_cpu_s_per_gib": dcpu,
        "map_scan_gbps": round(statistics.median(m["map"] for m in maps), 3),
        "map_local_gbps": round(statistics.median(m["local"] for m in maps), 3),
        "map_ratio": round(statistics.median(m["map"] / m["local"] for m in maps), 3),
        "cold_mmap_gbps": round(statistics.median(m["cold"] for m in maps), 3),
        "cold_mmap_ratio": round(statistics.median(m["cold"] / m["local"] for m in maps), 3),
        "map_scan_gbps_all": [round(m["map"], 3) for m in maps], "map_faults": maps[-1]["faults"],
        "map_pages_mapped": maps[-1]["pages_mapped"], "verified": True,
    }
    json_line(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
