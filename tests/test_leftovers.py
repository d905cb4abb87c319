"""The check that a run leaves nothing behind (tests/leftovers_plugin.py)
and the clean-up after killed processes it relies on (clamor/testing/leftovers.py).

The plugin is tried on small sessions of its own, run by pytest in a
subprocess: one whose tests leave a multiprocessing semaphore, a temporary
directory and a process must fail and name each (with xdist, where the
tests run in the workers and the check in the controller), and one whose
tests clean up must pass.  Either way nothing is left afterwards.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from clamor.testing import leftovers

HERE = os.path.dirname(os.path.abspath(__file__))

# A process holding a multiprocessing semaphore made in a spawn context
# (named, as Dask's nannies make theirs), in a session of its own with the
# resource tracker it started: it prints the path, then waits to be killed.
HOLDER = """
import multiprocessing, sys, time
lock = multiprocessing.get_context("spawn").Lock()
print("/dev/shm/sem" + lock._semlock.name.replace("/", "."), flush=True)
if sys.argv[1:] == ["exit"]:
    sys.exit(0)
time.sleep(600)
"""


def start_holder(*args):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    return p, p.stdout.readline().strip()


def kill_session(p):
    os.killpg(p.pid, signal.SIGKILL)     # the holder and its resource tracker
    p.wait()
    p.stdout.close()
    deadline = time.monotonic() + 10
    while leftovers.group_pids(p.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_semaphore_left_by_a_killed_session_is_removed_once_nobody_holds_it():
    p, path = start_holder()
    other = "/dev/shm/clamor-test-leftovers-%d" % os.getpid()      # not multiprocessing's: never touched
    try:
        assert path.startswith("/dev/shm/sem.mp-") and os.path.exists(path), path
        victims = leftovers.group_pids(p.pid)
        assert p.pid in victims and len(victims) >= 2, victims        # and its tracker
        held = leftovers.held_shm(victims)
        assert path in held, held
        assert leftovers.unlink_unheld(held) == [] and os.path.exists(path)   # still held: kept
        kill_session(p)
        assert os.path.exists(path)          # what the tracker would have removed, had it lived
        open(other, "w").close()
        assert leftovers.unlink_unheld(held | {other}) == [path]
        assert not os.path.exists(path) and os.path.exists(other)
    finally:
        if p.poll() is None:
            kill_session(p)
        for q in (path, other):
            if q and os.path.exists(q):
                os.unlink(q)


# A session of its own for the plugin: conftest.py registers it as
# tests/conftest.py does, and each test does what its name says.
INNER_CONFTEST = f"""
import sys
sys.path.insert(0, {HERE!r})
pytest_plugins = ["leftovers_plugin"]
"""

INNER_TESTS = f"""
import json, os, shutil, signal, subprocess, sys, tempfile, time

HOLDER = {HOLDER!r}
NOTES = os.environ["NOTES"]
NOTED = os.environ["PYTEST_LEFTOVERS_NOTED"]

def note(what, value):
    with open(os.path.join(NOTES, what), "w") as f:
        f.write(str(value))

def holder(*args):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    return p, p.stdout.readline().strip()

def test_leaves_a_semaphore():
    p, path = holder()
    note("sem", path)
    deadline = time.monotonic() + 120    # until the watcher has seen who holds it
    while time.monotonic() < deadline:
        if os.path.exists(NOTED) and os.path.basename(path) in open(NOTED).read().split():
            break
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)     # its resource tracker too: the name stays
    p.wait()

def test_leaves_a_directory():
    note("dir", tempfile.mkdtemp(prefix="leftover-"))

def test_leaves_a_process():
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)
    note("pid", p.pid)

def test_cleans_up():
    p, path = holder("exit")             # exits normally: multiprocessing unlinks the name
    p.wait()
    note("clean_sem", path)
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "x"), "w").close()
"""


def inner_run(tmp_path, *args):
    (tmp_path / "conftest.py").write_text(INNER_CONFTEST)
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    env = {**os.environ, "NOTES": str(notes), "PYTEST_LEFTOVERS_WAIT": "2",
           leftovers.NOTED_ENV: str(tmp_path / "noted")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                        str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), *args, str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    return p, {f.name: f.read_text() for f in notes.iterdir()}


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_run_that_leaves_things_fails_and_names_them(tmp_path, xdist):
    p, notes = inner_run(tmp_path, "-k", "leaves", *xdist)
    out = p.stdout
    try:
        assert p.returncode == 1, out + p.stderr
        assert "3 passed" in out and " leftovers " in out, out
        section = out.split(" leftovers ", 1)[1]
        assert os.path.basename(notes["sem"]) in section, out
        assert os.path.basename(notes["dir"]) in section, out
        assert f"{notes['pid']}: sleep 600" in section, out
        # reported, then removed
        assert not os.path.exists(notes["sem"]) and not os.path.exists(notes["dir"])
        assert gone(int(notes["pid"]))
        assert not os.path.exists(os.path.dirname(notes["dir"]))       # the run's directory
    finally:
        if "pid" in notes and not gone(int(notes["pid"])):
            os.kill(int(notes["pid"]), signal.SIGKILL)
        if "sem" in notes and os.path.exists(notes["sem"]):
            os.unlink(notes["sem"])


def test_a_run_that_cleans_up_passes(tmp_path):
    p, notes = inner_run(tmp_path, "-k", "cleans_up", "-n", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 passed" in p.stdout and "leftovers" not in p.stdout, p.stdout
    assert notes["clean_sem"].startswith("/dev/shm/sem.mp-") and not os.path.exists(notes["clean_sem"])
