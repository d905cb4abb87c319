"""The C side, driven from pytest: the ctest suite and a fault_micro smoke run.

The ctest suite (tests/c/test_*.c) is configured and built with CMake in a
temporary directory.  The benchmark smoke run checks that bench/fault_micro.py
builds, runs and ends with a well-formed JSON line; it asserts nothing about
timing (tests are not benchmarks).
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The test extras install cmake into the environment (its PyPI wheel), so
# look beside this interpreter first, then on PATH.
CMAKE = shutil.which("cmake", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
CTEST = shutil.which("ctest") or (CMAKE and os.path.join(os.path.dirname(CMAKE), "ctest"))


def _run(cmd, timeout, **kw):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    return proc.stdout


@pytest.mark.skipif(CMAKE is None, reason="the cmake executable is not on PATH (apt-get install cmake)")
def test_ctest_suite(tmp_path):
    build = tmp_path / "build"
    # CMakeLists.txt finds pyzmq's libzmq through this interpreter
    _run([CMAKE, "-S", ROOT, "-B", str(build), f"-DPython3_EXECUTABLE={sys.executable}"], timeout=300)
    _run([CMAKE, "--build", str(build), "-j2"], timeout=900)
    out = _run([CTEST, "--test-dir", str(build), "--output-on-failure", "-j2"], timeout=1200)
    names = {os.path.basename(p)[:-2] for p in glob.glob(os.path.join(ROOT, "tests", "c", "test_*.c"))}
    for name in ("test_wire", "test_pagetable"):
        assert name in names
    for name in names:  # every C test file became a ctest test, and it ran
        assert name in out, f"{name} was not run by ctest:\n{out}"
    assert "100% tests passed" in out, out


def test_fault_micro_smoke(tmp_path):
    script = os.path.join(ROOT, "bench", "fault_micro.py")
    out = _run([sys.executable, script, "--smoke", "--build-dir", str(tmp_path)], timeout=600)
    last = out.strip().splitlines()[-1]
    figures = json.loads(last)
    for key in ("remote_fault_us", "zmq_rtt_us", "ratio", "local_fault_us"):
        assert key in figures, f"{key} missing from {last}"
        assert isinstance(figures[key], (int, float)) and figures[key] > 0, f"{key} = {figures[key]!r}"
    assert figures["ratio"] == pytest.approx(figures["remote_fault_us"] / figures["zmq_rtt_us"], rel=0.01)
    assert figures["faults"] >= figures["n"]
    assert figures["pages_fetched"] >= figures["n"]
