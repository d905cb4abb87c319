#!/usr/bin/env python3
"""clamor across hosts: rate-limited links between network-namespace hosts.

How to run it, what it compares and what its JSON line holds: bench/README.md,
"hosts.py".
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from _common import (GIB, HOST_ENV, MIB, array_pages, cold_scan, cpu_delta, cpu_s, exact_array, hot_check,
                     hot_counters, hot_round, hot_table, hot_task, human, parse_size, policy_ratios, rotated,
                     same_host_modes, thread_cpu)
from _harness import json_line, med, parser, ratio

POLICIES = ("off", "random", "two-choices")
WORKER_HOSTS = 4                    # hosts 1-4 (2 with --smoke: args.worker_hosts)
SAME_HOST = "fetch"
SAME_HOST_WHY = ("every page a worker reads must cross its socket (CURVE or PLAIN, link or loopback); "
                 "clamor's default on one host (same_host='map') has the loopback worker map the driver's "
                 "pages instead, and nothing would be measured")


# ---- the orchestrator (root namespace): hosts, workers, TCP ------------------------------

def orchestrate(args, argv):
    from clamor.testing import nethosts

    ok, reason = nethosts.available()
    if not ok:
        print(f"hosts: network namespaces are not available here: {reason}", file=sys.stderr)
        return 2
    try:
        nethosts.parse_rate(args.rate)
    except ValueError as e:
        print(f"hosts: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with nethosts.Hosts(1 + args.worker_hosts, rate=args.rate) as hosts:
        print(f"hosts: {len(hosts)} namespace hosts on {hosts.prefix}.0/24, every link {args.rate} both ways; "
              f"driver on host 0 ({hosts[0].addr}), workers on hosts 1-{args.worker_hosts}", flush=True)
        to_drv_r, to_drv_w = os.pipe()
        from_drv_r, from_drv_w = os.pipe()
        cfg = {"addr": hosts[0].addr, "in_fd": to_drv_r, "out_fd": from_drv_w}
        driver = hosts[0].popen([sys.executable, os.path.abspath(__file__), *argv, "--_driver", json.dumps(cfg)],
                                pass_fds=(to_drv_r, from_drv_w), stdin=subprocess.DEVNULL)
        os.close(to_drv_r)
        os.close(from_drv_w)
        reply = os.fdopen(to_drv_w, "w")
        requests = os.fdopen(from_drv_r, "r")
        workers, exits, figures = [], [], None
        try:
            for line in requests:
                msg = json.loads(line)
                op = msg["op"]
                try:
                    if op == "tcp":
                        out = {"bytes_per_s": nethosts.measure_tcp(hosts, msg["src"], msg["dst"],
                                                                   seconds=msg.get("seconds", 1.0))}
                    elif op == "start":
                        env = {**os.environ, "CLAMOR_SECRET": msg["secret"]}
                        for i in msg["hosts"]:
                            argv_w = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m",
                                      "clamor.worker", msg["endpoint"]] + ([] if msg["encrypt"] else ["--no-encrypt"])
                            workers.append(hosts[i].popen(argv_w, env={**env, HOST_ENV: str(i)},
                                                          stdin=subprocess.DEVNULL))
                        out = {"started": len(msg["hosts"])}
                    elif op == "reap":
                        codes = []
                        for p in workers:
                            try:
                                codes.append(p.wait(msg.get("timeout", 20)))
                            except subprocess.TimeoutExpired:
                                nethosts.Host._kill(p)
                                p.wait()
                                codes.append("killed")
                        exits.extend(codes)
                        workers = []
                        out = {"exits": codes}
                    elif op == "done":
                        figures = msg["figures"]
                        out = {}
                    else:
                        out = {"error": f"unknown request {op!r}"}
                except Exception as e:  # noqa: BLE001 - the driver reports it and stops
                    out = {"error": f"{type(e).__name__}: {e}"}
                reply.write(json.dumps(out) + "\n")
                reply.flush()
            rc = driver.wait()
        finally:
            for f in (reply, requests):
                try:
                    f.close()
                except OSError:
                    pass
            if driver.poll() is None:
                nethosts.Host._kill(driver)
                driver.wait()
        if rc != 0 or figures is None:
            print(f"hosts: the driver failed (exit status {rc})", file=sys.stderr)
            return 1
    bad = [c for c in exits if c != 0]
    figures.update(hosts=1 + args.worker_hosts, rate=args.rate, worker_exits_nonzero=bad,
                   elapsed_s=round(time.perf_counter() - t0, 1))
    print(f"hosts: done in {figures['elapsed_s']:.0f} s; {len(exits)} remote workers ran, "
          f"{len(bad)} exited with a non-zero status {bad if bad else ''}", flush=True)
    json_line(figures)
    return 0


class Orchestrator:
    """The driver's end of the pipes to the orchestrator."""

    def __init__(self, in_fd, out_fd):
        self.r = os.fdopen(in_fd, "r")
        self.w = os.fdopen(out_fd, "w")

    def ask(self, **msg):
        self.w.write(json.dumps(msg) + "\n")
        self.w.flush()
        line = self.r.readline()
        if not line:
            raise SystemExit("hosts: the orchestrating process is gone")
        out = json.loads(line)
        if "error" in out:
            raise SystemExit(f"hosts: orchestrator: {msg['op']}: {out['error']}")
        return out


# ---- CPU ----------------------------------------------------------------------------------

def machine_ticks():
    """(busy, softirq, steal, total) jiffies over all CPUs, from /proc/stat:
    busy is user + nice + system + irq + softirq (every process on the
    machine, other users' too, and the kernel's packet work); steal is
    time the hypervisor gave to others."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v + [0] * (8 - len(v))
    return user + nice + system + irq + softirq, softirq, steal, sum(v)


def busy_share(t0, t1):
    """Share of the machine's CPU time that was busy between two machine_ticks()."""
    total = t1[3] - t0[3]
    return round((t1[0] - t0[0]) / total, 3) if total else None


def machine_cpu(t0, t1):
    """CPU seconds between two machine_ticks(): busy (all CPUs), of which
    softirq, and steal."""
    tick = os.sysconf("SC_CLK_TCK")
    return {k: round((t1[i] - t0[i]) / tick, 2) for i, k in enumerate(("busy_s", "softirq_s", "steal_s"))}


# ---- tasks (run on the workers; cloudpickle sends this script's functions by value) ---------

def fault_task(ref, pages):
    """Read-ahead off, every page of the array dropped; read one element of
    each page in ``pages`` (indexes within the array's pages) and time each
    read: one fetch each.  Returns the times (us), the elements' values and
    the pager's own fetch latencies."""
    import clamor
    from clamor import region

    x = ref.get()
    ps = region.page_size()
    first, _ = array_pages(x)
    addr = x.__array_interface__["data"][0]
    old = region.configure()["readahead"]
    region.configure(readahead=0)
    try:
        region.drop_pages(*array_pages(x))
        clamor.reset_stats()
        idx, us, vals = [], [], []
        clock = time.perf_counter_ns
        for p in pages:
            i = max(0, ((first + p) * ps + region.base() - addr) // x.itemsize)
            t = clock()
            v = x[i]
            us.append((clock() - t) / 1e3)
            idx.append(int(i))
            vals.append(float(v))
        st = clamor.stats()
    finally:
        region.configure(readahead=old)
    return {"us": us, "idx": idx, "vals": vals, "faults": st["faults"], "pages_fetched": st["pages_fetched"],
            "fetch_p50_us": st["fetch_p50_us"], "fetch_p99_us": st["fetch_p99_us"]}


def cpu_task():
    """This worker's host index, CPU seconds so far, and by thread."""
    return int(os.environ.get(HOST_ENV, "-1")), (cpu_s(), thread_cpu())


# ---- the driver (host 0) ----------------------------------------------------------------------

class Driver:
    def __init__(self, args, cfg):
        import numpy as np

        import clamor

        self.clamor, self.np = clamor, np
        self.args = args
        self.addr = cfg["addr"]
        self.orch = Orchestrator(cfg["in_fd"], cfg["out_fd"])

    # -- clusters

    def remote_cluster(self, n, encrypt=True, **kw):
        """A cluster of ``n`` remote workers on hosts 1..n, started and joined."""
        cl = self.clamor.Cluster(workers=0, remote=n, listen=f"{self.addr}:*", encrypt=encrypt, progress=False,
                                 start_timeout=60, same_host=SAME_HOST, **kw)
        cl.join_command()                       # opens the control endpoint
        self.orch.ask(op="start", hosts=list(range(1, n + 1)), endpoint=cl.endpoint, secret=cl.secret,
                      encrypt=encrypt)
        cl.start()
        same_host_modes(cl, SAME_HOST, f"hosts: {n} remote worker(s)")
        return cl

    def close_remote(self, cl):
        cl.close()
        out = self.orch.ask(op="reap")
        if any(c != 0 for c in out["exits"]):
            print(f"  (remote workers exited with {out['exits']})", flush=True)

    def tcp(self, src=0, dst=1, seconds=1.0):
        return self.orch.ask(op="tcp", src=src, dst=dst, seconds=seconds)["bytes_per_s"]

    # -- scan + fault on one cluster

    def scan_and_fault(self, cl, label, rng):
        np, a = self.np, self.a
        rows = []
        for _ in range(self.scans):
            m0, c0, th0 = machine_ticks(), cpu_s(), thread_cpu()
            res = cl.run(cold_scan, self.ref)[0]
            c1, th1, m1 = cpu_s(), thread_cpu(), machine_ticks()
            if res["sum"] != self.want:
                raise SystemExit(f"hosts: {label}: the worker's sum {res['sum']!r} is not the driver's {self.want!r}")
            gbps = a.nbytes / res["cold_s"] / 1e9
            row = {"gbps": gbps, "s": res["cold_s"], "worker_cpu_s": res["cpu_s"], "worker_threads": res["cpu"],
                   "driver_cpu_s": c1 - c0, "driver_threads": cpu_delta(th0, th1), "machine_busy": busy_share(m0, m1),
                   "machine_cpu": machine_cpu(m0, m1),
                   "pages_fetched": res["stats"]["pages_fetched"], "readahead": res["readahead"]}
            rows.append(row)
            print(f"  {label:<22} scan  {gbps:6.3f} GB/s ({human(a.nbytes)} in {row['s']:.2f} s, "
                  f"{row['pages_fetched']} pages)  CPU s: worker {res['cpu_s']:.2f}, driver {c1 - c0:.2f}, machine "
                  f"{row['machine_cpu']['busy_s']:.2f} (softirq {row['machine_cpu']['softirq_s']:.2f}, busy "
                  f"{row['machine_busy']:.0%})", flush=True)
        pages = rng.choice(self.npages, size=min(self.nfaults, self.npages), replace=False).tolist()
        res = cl.run(fault_task, self.ref, pages)[0]
        want = (np.asarray(res["idx"]) % 4096).astype(float).tolist()
        if res["vals"] != want:
            raise SystemExit(f"hosts: {label}: a faulted element differs from the driver's value")
        if res["faults"] < len(pages):
            raise SystemExit(f"hosts: {label}: {len(pages)} reads of dropped pages took only {res['faults']} faults")
        us = res["us"]
        print(f"  {label:<22} fault {med(us):7.0f} us median of {len(us)} (p90 {np.percentile(us, 90):.0f}; "
              f"pager's fetch p50 {res['fetch_p50_us']:.0f} us, {res['pages_fetched']} pages)", flush=True)
        return rows, us, res

    def encryption_rounds(self, label, make, close, reps, link=False):
        """``reps`` rounds of (CURVE, PLAIN) clusters, order alternating."""
        rng = self.np.random.default_rng(self.args.seed)
        out = {m: {"scans": [], "faults_us": [], "pager_fetch_p50_us": []} for m in ("curve", "plain")}
        links = []
        for r in range(reps):
            for mode in (("curve", "plain") if r % 2 == 0 else ("plain", "curve")):
                if link:
                    links.append(self.tcp(0, 1))
                    print(f"  link TCP host 0 -> host 1: {links[-1] / 1e6:.1f} MB/s", flush=True)
                t = time.perf_counter()
                cl = make(mode == "curve")
                start_s = time.perf_counter() - t
                try:
                    rows, us, res = self.scan_and_fault(cl, f"{label} {mode} r{r}", rng)
                finally:
                    close(cl)
                out[mode]["scans"] += rows
                out[mode]["faults_us"] += us
                out[mode]["pager_fetch_p50_us"].append(res["fetch_p50_us"])
                out[mode].setdefault("start_s", []).append(round(start_s, 2))
        return out, links

    # -- hot pages

    def hot_policy(self, policy, keys, expect, encrypt=True):
        drv0 = self.clamor.region.stats()
        cl = self.remote_cluster(self.args.worker_hosts, encrypt=encrypt, replication=policy, speculation=False)
        try:
            cpu0 = dict(cl.run(cpu_task))
            m0, c0, th0 = machine_ticks(), cpu_s(), thread_cpu()
            t, wall = time.perf_counter(), time.time()
            out = cl.parallelize(keys, partitions=self.tasks).map_partitions(self.hot_task).collect()
            dt = time.perf_counter() - t
            c1, th1, m1 = cpu_s(), thread_cpu(), machine_ticks()
            cpu1 = dict(cl.run(cpu_task))
            st = cl.stats()
            drv = self.clamor.region.stats()
        finally:
            self.close_remote(cl)
        hot_check(out, expect, f"hosts: hot pages {policy}")
        # the workers' CPU by thread name, summed; what threads that ended
        # (the C lookup threads of the tasks) spent is the rest of the total
        threads = {}
        for h in cpu1:
            for k, v in cpu_delta(cpu0[h][1], cpu1[h][1]).items():
                threads[k] = round(threads.get(k, 0.0) + v, 2)
        threads["ended threads"] = round(sum(cpu1[h][0] - cpu0[h][0] for h in cpu1) - sum(threads.values()), 2)
        hosts_used = sorted({o[6] for o in out})
        row = {
            "time_s": dt, **hot_counters(drv0, drv, st, self.args.worker_hosts, self.table_bytes),
            "peer_fallbacks": sum(o[5] for o in {o[6]: o for o in out}.values()),
            "driver_cpu_s": c1 - c0, "workers_cpu_s": sum(cpu1[h][0] - cpu0[h][0] for h in cpu1),
            "workers_threads": threads, "driver_threads": cpu_delta(th0, th1),
            "machine_busy": busy_share(m0, m1), "machine_cpu": machine_cpu(m0, m1),
            "task_s_max": max(o[3] for o in out),
            # each task's lookups: (host, start, end) in seconds from the stage's start
            "task_spans": sorted((o[6], round(o[7] - wall, 2), round(o[7] - wall + o[3], 2)) for o in out),
            "hosts_used": len(hosts_used),
        }
        print(f"  {policy:>12}{'' if encrypt else ' PLAIN'} {dt:6.2f} s  driver {row['driver_bytes'] / MIB:7.1f} MiB  peers "
              f"{row['peer_bytes'] / MIB:7.1f} MiB  redirects {row['redirects']:5d}  direct "
              f"{row['direct_requests']:5d}  table/worker {row['coverage']:.2f}  CPU s driver "
              f"{row['driver_cpu_s']:.2f} workers {row['workers_cpu_s']:.2f}, machine {row['machine_cpu']['busy_s']:.1f} "
              f"(softirq {row['machine_cpu']['softirq_s']:.1f}, busy {row['machine_busy']:.0%})", flush=True)
        print("               task lookups (host: start-end s): " + "  ".join(f"{h}: {a:.1f}-{b:.1f}"
                                                                       for h, a, b in row["task_spans"]), flush=True)
        print("               CPU s by thread: workers " + ", ".join(f"{k} {v:.2f}" for k, v in threads.items())
              + "; driver " + ", ".join(f"{k} {v:.2f}" for k, v in row["driver_threads"].items()), flush=True)
        return row

    def hot(self, tmp):
        args = self.args
        bits = args.bits
        nkeys = int((1 << bits) * 0.5)
        so, self.hp, self.table, self.table_bytes, build_s = hot_table(self.clamor, tmp, bits, nkeys, "hosts")
        self.tasks, self.lookups = 2 * args.worker_hosts, args.lookups
        self.hot_task = hot_task(so, self.table, 8)
        print(f"hot pages: hash table of {1 << bits} slots ({self.table_bytes / MIB:.0f} MiB, {nkeys} keys) built in "
              f"{build_s:.1f} s; {args.worker_hosts} remote workers, {self.tasks} tasks x {self.lookups} "
              f"Zipf(1.1) lookups on 8 threads; a fresh cluster per policy; {args.hot_reps} round(s)", flush=True)
        rng = self.np.random.default_rng(args.seed)
        keys, expect = hot_round(self.hp, rng, 1.1, nkeys, self.table, self.tasks, self.lookups, "hosts")
        print(" warm-up (untimed):", flush=True)
        warm = self.hot_policy("off", keys, expect)
        modes = ("curve", "plain") if args.hot_plain else ("curve",)
        rows = {m: {p: [] for p in POLICIES} for m in modes}
        for r in range(args.hot_reps):
            keys, expect = hot_round(self.hp, rng, 1.1, nkeys, self.table, self.tasks, self.lookups, "hosts")
            print(f" round {r}:", flush=True)
            for p in rotated(POLICIES, r):
                for m in (modes if r % 2 == 0 else modes[::-1]):
                    rows[m][p].append(self.hot_policy(p, keys, expect, encrypt=m == "curve"))
        skip = ("machine_cpu", "workers_threads", "driver_threads", "task_spans")
        medians = {m: {p: {k: med([x[k] for x in v]) for k in v[0] if k not in skip} | {"runs": len(v)}
                       for p, v in rows[m].items()} for m in modes}
        return medians, rows, warm

    # -- everything

    def run(self):
        np, clamor, args = self.np, self.clamor, self.args
        clamor.region.init()
        a = exact_array(clamor, args.size // 8)
        self.a, self.ref, self.want = a, clamor.ref(a), float(a.sum())
        self.npages = a.nbytes // clamor.region.page_size() - 1     # whole pages inside the array
        self.scans, self.nfaults = args.scans, args.faults
        page = clamor.region.page_size()
        print(f"driver on {self.addr}: {human(a.nbytes)} float64 array, page {human(page)}; {args.reps} round(s) of "
              f"CURVE/PLAIN clusters, {self.scans} cold scans and {self.nfaults} single-page faults each", flush=True)

        print(f"same_host={SAME_HOST!r} on every cluster: {SAME_HOST_WHY}", flush=True)
        print("remote worker on host 1, over the link:", flush=True)
        remote, links = self.encryption_rounds("remote", lambda e: self.remote_cluster(1, encrypt=e,
                                                                                      speculation=False),
                                               self.close_remote, args.reps, link=True)
        link = med(links)
        back = self.tcp(1, 0)
        print(f"  link TCP host 1 -> host 0: {back / 1e6:.1f} MB/s", flush=True)

        with tempfile.TemporaryDirectory(prefix="hosts-bench-") as tmp:
            hot_all, hot_rows, hot_warm = self.hot(tmp)
        hot = hot_all["curve"]

        print("loopback, one host (driver and one spawned worker, no link):", flush=True)

        def loop_cluster(e):
            cl = clamor.Cluster(workers=1, start_method="spawn", encrypt=e, progress=False,
                                speculation=False, same_host=SAME_HOST).start()
            try:
                same_host_modes(cl, SAME_HOST, "hosts: loopback")
            except SystemExit:
                cl.close()
                raise
            return cl

        loop, _ = self.encryption_rounds("loopback", loop_cluster, lambda cl: cl.close(), args.reps)

        # ---- figures
        def summary(d):
            out = {}
            for m in ("curve", "plain"):
                s = d[m]
                out[m] = {"scan_gbps": med([x["gbps"] for x in s["scans"]]),
                          "fault_us": med(s["faults_us"]),
                          "fault_p90_us": float(np.percentile(s["faults_us"], 90)),
                          "faults": len(s["faults_us"]),
                          "pager_fetch_p50_us": med(s["pager_fetch_p50_us"]),
                          "scan_worker_cpu_s_per_gib": med([x["worker_cpu_s"] for x in s["scans"]]) * GIB / a.nbytes,
                          "scan_driver_cpu_s_per_gib": med([x["driver_cpu_s"] for x in s["scans"]]) * GIB / a.nbytes,
                          "scan_machine_busy": med([x["machine_busy"] for x in s["scans"]]),
                          "scan_gbps_all": [round(x["gbps"], 4) for x in s["scans"]],
                          "cluster_start_s": s["start_s"],
                          "scan_worker_threads_last": s["scans"][-1]["worker_threads"],
                          "scan_driver_threads_last": s["scans"][-1]["driver_threads"]}
            out["fault_ratio"] = ratio(out["curve"]["fault_us"], out["plain"]["fault_us"], "fault_ratio (CURVE / PLAIN)")
            out["scan_ratio"] = ratio(out["curve"]["scan_gbps"], out["plain"]["scan_gbps"], "scan_ratio (CURVE / PLAIN)")
            return out

        rs, ls = summary(remote), summary(loop)
        best = min(POLICIES[1:], key=lambda p: hot[p]["time_s"])
        off = hot["off"]
        fig = {
            "bench": "hosts", "link_bytes_per_s": link, "link_bytes_per_s_all": links,
            "link_back_bytes_per_s": back, "scan_gbps": rs["curve"]["scan_gbps"],
            "scan_link_ratio": ratio(rs["curve"]["scan_gbps"], link and link / 1e9, "scan_link_ratio"),
            "scan_plain_link_ratio": ratio(rs["plain"]["scan_gbps"], link and link / 1e9, "scan_plain_link_ratio"),
            "hot_best_policy": best,
            "hot_time_ratio": ratio(hot[best]["time_s"], off["time_s"], "hot_time_ratio"),
            "hot_driver_bytes_ratio": ratio(hot[best]["driver_bytes"], off["driver_bytes"], "hot_driver_bytes_ratio"),
            "hot_ratios": policy_ratios(hot, POLICIES), "hot": hot,
            "hot_plain": hot_all.get("plain"),
            "hot_plain_ratios": policy_ratios(hot_all["plain"], POLICIES, "PLAIN ", cpu=False)
            if "plain" in hot_all else None,
            "curve_fault_ratio": rs["fault_ratio"], "curve_scan_ratio": rs["scan_ratio"],
            "remote": rs,
            "loopback_curve": {"fault_us_curve": ls["curve"]["fault_us"], "fault_us_plain": ls["plain"]["fault_us"],
                               "fault_ratio": ls["fault_ratio"], "scan_gbps_curve": ls["curve"]["scan_gbps"],
                               "scan_gbps_plain": ls["plain"]["scan_gbps"], "scan_ratio": ls["scan_ratio"],
                               "detail": ls},
            "array_bytes": a.nbytes, "page_size": page, "readahead": remote["curve"]["scans"][-1]["readahead"],
            "reps": args.reps, "scans_per_cluster": self.scans, "faults_per_cluster": self.nfaults,
            "hot_reps": args.hot_reps, "hot_table_bytes": self.table_bytes, "hot_lookups_per_task": self.lookups,
            "hot_tasks": self.tasks, "hot_runs": hot_rows, "hot_warmup": hot_warm,
            "quick": args.quick, "smoke": args.smoke, "worker_hosts": args.worker_hosts,
            "same_host": SAME_HOST, "same_host_why": SAME_HOST_WHY, "verified": True,
        }
        L = link / 1e9
        print(f"link: {L:.4f} GB/s (TCP, host 0 -> host 1, median of {len(links)})")
        print(f"scan: CURVE {rs['curve']['scan_gbps']:.4f} GB/s, PLAIN {rs['plain']['scan_gbps']:.4f} GB/s -> "
              f"scan_link_ratio {fig['scan_link_ratio']:.2f} (target >= 0.8), curve_scan_ratio "
              f"{fig['curve_scan_ratio']:.2f} (target >= 0.8)")
        print(f"fault: CURVE {rs['curve']['fault_us']:.0f} us, PLAIN {rs['plain']['fault_us']:.0f} us -> "
              f"curve_fault_ratio {fig['curve_fault_ratio']:.2f} (target <= 1.3)")
        print("hot pages: " + "; ".join(f"{p} {hot[p]['time_s']:.2f} s, driver {hot[p]['driver_bytes'] / MIB:.0f} MiB"
                                        for p in POLICIES)
              + f" -> best {best}: hot_time_ratio {fig['hot_time_ratio']:.2f} (target <= 0.5), "
              f"hot_driver_bytes_ratio {fig['hot_driver_bytes_ratio']:.2f} (target <= 0.35)")
        if fig["hot_plain"]:
            hp = fig["hot_plain"]
            print("hot pages without encryption: " + "; ".join(
                f"{p} {hp[p]['time_s']:.2f} s, driver {hp[p]['driver_bytes'] / MIB:.0f} MiB, CPU s "
                f"{hp[p]['driver_cpu_s'] + hp[p]['workers_cpu_s']:.1f}" for p in POLICIES)
                + " -> time ratio " + ", ".join(f"{p} {v['time_ratio']:.2f}" for p, v in fig["hot_plain_ratios"].items()))
        print(f"loopback: fault CURVE {ls['curve']['fault_us']:.0f} us / PLAIN {ls['plain']['fault_us']:.0f} us = "
              f"{ls['fault_ratio']:.2f}; scan CURVE {ls['curve']['scan_gbps']:.2f} GB/s / PLAIN "
              f"{ls['plain']['scan_gbps']:.2f} GB/s = {ls['scan_ratio']:.2f}", flush=True)
        self.orch.ask(op="done", figures=fig)
        return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = parser(__doc__.splitlines()[0], "smaller sizes, fewer rounds (under 2 minutes)", "2 worker hosts, tiny "
                "sizes, one round (for the tests)")
    ap.add_argument("--rate", default="1gbit", help="every host's link, both ways (tc notation; default 1gbit)")
    ap.add_argument("--size", type=parse_size, default=None, help="scanned array bytes (256M; quick 64M)")
    ap.add_argument("--scans", type=int, default=None, help="cold scans per cluster (3; quick 2)")
    ap.add_argument("--faults", type=int, default=None, help="single-page faults per cluster (1000; quick 300)")
    ap.add_argument("--reps", type=int, default=None, help="rounds of CURVE/PLAIN clusters (3; quick 2)")
    ap.add_argument("--bits", type=int, default=None, help="log2 of the hash table's slots (26; quick 23)")
    ap.add_argument("--lookups", type=int, default=None, help="hot-pages lookups per task (50000; quick 6250)")
    ap.add_argument("--hot-reps", type=int, default=None, help="hot-pages rounds over the policies (3; quick 2)")
    ap.add_argument("--hot-plain", action="store_true",
                    help="also run every hot-pages policy on clusters without encryption (encrypt=False)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--_driver", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    q, sm = args.quick, args.smoke
    args.worker_hosts = 2 if sm else WORKER_HOSTS
    args.size = args.size or (8 * MIB if sm else 64 * MIB if q else 256 * MIB)
    args.scans = args.scans or (1 if sm else 2 if q else 3)
    args.faults = args.faults or (30 if sm else 300 if q else 1000)
    args.reps = args.reps or (1 if sm else 2 if q else 3)
    args.bits = args.bits or (16 if sm else 23 if q else 26)
    args.lookups = args.lookups or (300 if sm else 6250 if q else 50000)
    args.hot_reps = args.hot_reps or (1 if sm else 2 if q else 3)
    if min(args.scans, args.faults, args.reps, args.hot_reps, args.lookups) < 1 or not 8 <= args.bits <= 30 \
            or args.size < 4 * MIB:
        ap.error("sizes and counts must be positive, --bits in 8..30, --size at least 4M")
    if args._driver is None:
        return orchestrate(args, argv)
    cfg = json.loads(args._driver)
    return Driver(args, cfg).run()


if __name__ == "__main__":
    sys.exit(main())
