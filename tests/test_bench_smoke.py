"""Every benchmark runs as bench/README.md documents it: ``python
bench/NAME.py --smoke`` from the repository root exits 0, its last line is
its JSON object, every number in it is finite, and the key figures of the
README's table are there: finite for every system that ran, null with a
``<system>_missing`` reason for a peer that did not.

One test per script (pytest-xdist spreads them).  Each runs with a TMPDIR
of its own, which must be empty afterwards; where a mount namespace can be
made (root, ``unshare``), the script also gets a /dev/shm of its own, which
must be empty afterwards too.
"""
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from clamor.testing.nethosts import require_hosts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


DASK = installed("distributed")

# script -> (figures that must be finite, peer figures: {key: the system it needs})
# A peer figure is finite when its system ran, else null with a reason.
KEYS = {
    "fault_micro": (["ratio", "map_vs_local", "remote_fault_us", "zmq_rtt_us"], {}),
    "scan": (["ratio", "map_ratio", "scan_gbps", "tcp_gbps"], {}),
    "pagesize": (["recommended_page_size"], {}),
    "kmeans": (["ratio", "clamor_s", "baseline_s"], {"ratio_vs_spark": "spark", "ratio_vs_dask": "dask"}),
    "tasks": (["tasks_per_s", "stage_latency_ms", "throughput_ratio"], {}),
    "streaming": (["speedup", "first_round_vs_shm", "round_speedup_map"],
                  {"speedup_vs_spark": "spark", "speedup_vs_dask": "dask", "speedup_vs_ray": "ray"}),
    "recovery": (["after_ratio", "normal_iter_s", "after_iter_s"], {}),
    "hotpages": (["driver_bytes_ratio", "time_ratio", "rate_driver_bytes_ratio", "rate_time_ratio"], {}),
    "geo": (["speedup_vs_broadcast"], {"speedup_vs_redis": "redis", "speedup_vs_spark": "spark",
                                       "speedup_vs_dask": "dask", "speedup_vs_ray": "ray"}),
    "malloc_overhead": (["overhead_ratio"], {}),
    "driver_writes": (["mprotect_first_write_us", "mprotect_stage_begin_us_per_page", "mprotect_load_ms"], {}),
    "hosts": (["scan_link_ratio", "hot_time_ratio", "hot_driver_bytes_ratio", "curve_fault_ratio",
               "curve_scan_ratio"], {}),
    "portable": (["portable_time_ratio", "reloc_us_per_page", "reloc_bytes_per_page", "pages_with_relocs"], {}),
    "dask_globals": (["speedup_vs_scatter", "bytes_ratio_vs_scatter", "update_speedup_vs_rescatter"], {}),
    "sparse_lr": ([], {"speedup_vs_spark": "spark", "speedup_vs_dask": "dask", "speedup_vs_ray": "ray"}),
    "objects": (["check_vs_pickle", "first_stage_vs_pickle", "changed_stage_vs_pickle", "objects_per_s_min"], {}),
    "figures": ([], {}),
}

# What a --smoke run leaves out unless --systems names it (bench/_harness.py),
# and what it must run when it is installed here.
SMOKE_LEAVES_OUT = {"spark", "ray"}


def test_every_script_is_listed():
    scripts = sorted(f[:-3] for f in os.listdir(BENCH) if f.endswith(".py") and not f.startswith("_"))
    assert scripts == sorted(KEYS)


def non_finite(x, path="$"):
    """Paths of every float in ``x`` that is NaN or infinite."""
    if isinstance(x, float):
        return [] if math.isfinite(x) else [path]
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in non_finite(v, f"{path}.{k}")]
    if isinstance(x, list):
        return [p for i, v in enumerate(x) for p in non_finite(v, f"{path}[{i}]")]
    return []


def finite_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def private_shm():
    """Whether the script can run in a mount namespace with a /dev/shm of its own."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs smoke /dev/shm"],
        capture_output=True).returncode == 0


PRIVATE_SHM = private_shm()

# in the namespace: a fresh /dev/shm, the script, then what it left there
WRAP = 'mount -t tmpfs -o size=2g clamor-smoke /dev/shm || exit 97; "$@"; rc=$?; ls -A /dev/shm > "$SHM_LEFT"; exit $rc'


@pytest.mark.parametrize("script", sorted(KEYS))
def test_smoke(script, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    left = tmp_path / "shm-left"
    cmd = [sys.executable, os.path.join("bench", f"{script}.py"), "--smoke"]
    if PRIVATE_SHM:
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", WRAP, "sh"] + cmd
    env = {**os.environ, "TMPDIR": str(tmp), "SHM_LEFT": str(left), "PYTHONUNBUFFERED": "1"}
    env.pop("CLAMOR_SERVE_RATE", None)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    if script == "hosts" and proc.returncode == 2 and "network namespaces are not available" in proc.stderr:
        require_hosts()   # skips, or fails under CLAMOR_REQUIRE_NETNS=1 (CI), as every namespace-host test
        pytest.fail(f"hosts.py found no network namespaces where the tests do: {proc.stderr.strip()}")
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}\n{out[-3000:]}\n{proc.stderr[-3000:]}"

    lines = out.strip().splitlines()
    assert lines, f"{script} --smoke printed nothing"
    fig = json.loads(lines[-1])
    assert fig.get("bench") == script
    bad = non_finite(fig)
    assert not bad, f"{script}: not finite: {bad}"

    leftovers = sorted(os.listdir(tmp))
    assert not leftovers, f"{script} --smoke left in its TMPDIR: {leftovers}"
    if PRIVATE_SHM:
        shm = left.read_text().split()
        assert not shm, f"{script} --smoke left in /dev/shm: {shm}"

    if script == "dask_globals" and not DASK:
        assert fig.get("skipped") and fig.get("systems_run") == []
        return
    required, peers = KEYS[script]
    for k in required:
        assert k in fig, f"{script}: no {k!r} in its JSON line"
        assert finite_number(fig[k]), f"{script}: {k} = {fig[k]!r}"
    for k, system in peers.items():
        ran = system in fig.get("systems_run", ())
        if system in SMOKE_LEAVES_OUT:
            assert not ran, f"{script}: {system} ran under --smoke without --systems naming it"
        elif system == "dask":
            assert ran == DASK, f"{script}: dask {'installed but did not run' if DASK else 'ran, not installed'}: " \
                                f"{fig.get('dask_missing')}"
        elif system == "redis":
            assert ran == (shutil.which("redis-server") is not None), fig.get("redis_missing")
        if k in fig or ran:
            assert k in fig, f"{script}: no {k!r} in its JSON line though {system} ran"
            if ran:
                assert finite_number(fig[k]), f"{script}: {k} = {fig[k]!r} though {system} ran"
            else:
                assert fig[k] is None and fig.get(f"{system}_missing"), \
                    f"{script}: {k} = {fig[k]!r} but {system} did not run, and no {system}_missing says why"
    if script == "pagesize":
        assert fig["recommended_page_size"] in [int(s) for s in fig["sizes"]]
    if script == "figures":
        assert fig["records"] > 0 and sum(fig["planned"].values()) > 0
        if installed("matplotlib"):
            assert fig["drawn_bytes"] and all(n > 0 for n in fig["drawn_bytes"].values())
    if script in ("hotpages", "hosts"):
        assert fig["same_host"] == "fetch"


def test_objects_on_namespace_hosts(tmp_path):
    """objects.py's third kind of worker: one on each namespace host,
    relocating what it reads; its answers equal the driver's (or it exits
    1), and the first stage's bytes on the links are counted."""
    require_hosts()
    cmd = [sys.executable, os.path.join("bench", "objects.py"), "--smoke", "--modes", "hosts",
           "--shapes", "dict_int,list_dc"]
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    fig = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fig["answers_equal"] and not fig["failed"] and fig["rate"] == "1gbit"
    assert set(fig["runs"]) == {"hosts"} and set(fig["runs"]["hosts"]) == {"dict_int", "list_dc"}
    for shape, rec in fig["runs"]["hosts"].items():
        assert rec["first_equal"] and rec["changed_equal"], shape
        assert finite_number(rec["first_stage_link_bytes"]) and rec["first_stage_link_bytes"] > 0, shape
        assert fig["pickle_bytes"][shape] > 0
    assert not non_finite(fig)
