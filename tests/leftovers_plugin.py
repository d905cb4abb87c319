"""The run leaves nothing behind in /tmp or /dev/shm (a pytest plugin,
registered at the end of conftest.py).

Everything happens in the process that runs the session: the only one
without xdist, the controller with it (whose workers and their children are
its descendants).  A worker does nothing here, so the check holds however
the tests are spread.

/tmp.  The run gets a directory of its own, ``clamor-tests-*`` in the
temporary directory, as TMPDIR for this process and everything it starts
(workers, scenarios, their workers): whatever a test makes through
``tempfile`` lands there, and anything still there at the end was left by
this run and no other.  The exceptions: pytest's own ``tmp_path`` stays
where it was (PYTEST_DEBUG_TEMPROOT), since pytest keeps the last runs'
directories by design; and ``dask-scratch-space``, the directory Dask keeps
for its workers' scratch directories (it never removes it), goes with the
run's directory.  A path written as "/tmp/..." by hand escapes the check.

/dev/shm.  A watcher process (leftovers.py) notes each name that appears
while a process of this run holds it: this process, its descendants, or a
process with the run's mark in its environment.  Names made by another
user of the machine, a test run beside this one included, are not held by
ours and are never blamed on this run; the price is that a name whose
every holder of ours was gone before the watcher's next look (0.2 s)
cannot be told from another user's, and is not checked.

At the end (after xdist's workers are gone) the run waits for its
descendants to exit, then fails (exit status 1, a "leftovers" section in
the summary) if a name it made is still in /dev/shm, if an entry is left
in its directory, or if a process of it still runs.  Names this process
still holds are left to it: multiprocessing unlinks those at its exit.
Then the processes are killed and the names and the directory removed,
so a failed check does not leave them either.
"""
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from clamor.testing import leftovers

HERE = os.path.dirname(os.path.abspath(__file__))
KEPT = {"dask-scratch-space"}
WAIT = float(os.environ.get("PYTEST_LEFTOVERS_WAIT", 30))   # seconds the run's processes get to exit at the end

_state = {}


def _controller(config):
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if not _controller(config) or not os.path.isdir(leftovers.SHM):
        return
    outer = tempfile.gettempdir()
    run = tempfile.mkdtemp(prefix="clamor-tests-", dir=outer)
    mark = uuid.uuid4().hex
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "PYTEST_DEBUG_TEMPROOT", leftovers.RUN_ENV)}
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", outer)
    os.environ["TMPDIR"] = run
    os.environ[leftovers.RUN_ENV] = mark
    tempfile.tempdir = None          # gettempdir() caches: look at TMPDIR again
    watcher = subprocess.Popen([sys.executable, leftovers.__file__, "watch", str(os.getpid()), mark],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watcher.stdout.readline()        # "ready": what /dev/shm held before the run is known (or it died)
    _state.update(run=run, mark=mark, saved=saved, watcher=watcher, report=[])


def _still_running(mark, watcher, timeout):
    """The run's processes (but this one, its resource tracker and the
    watcher) still running after up to ``timeout`` seconds."""
    from multiprocessing import resource_tracker

    mine = {os.getpid(), watcher.pid, getattr(resource_tracker._resource_tracker, "_pid", None)}
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in leftovers.run_pids(os.getpid(), mark) - mine if not _zombie(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().replace(b"\0", b" ").decode(errors="replace")
        return f"{pid}: {argv[:160]}"
    except OSError:
        return f"{pid}: (gone)"


def _kill(pids):
    """SIGKILL ``pids``, wait for them, and remove the names in /dev/shm
    that only they held."""
    held = leftovers.held_shm(pids)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(not _zombie(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftovers.unlink_unheld(held)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_sessionfinish(session):
    yield                            # after xdist has stopped its workers
    if not _state or not _controller(session.config):
        return
    report = _state["report"]
    watcher = _state["watcher"]
    gc.collect()                     # objects of multiprocessing nobody holds unlink their names now
    running = _still_running(_state["mark"], watcher, WAIT)
    if running:
        report.append("processes of the run still running (now killed):\n    "
                      + "\n    ".join(_describe(p) for p in running))
        _kill(running)
    out, _ = watcher.communicate("done\n", timeout=60)
    ours = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    if ours is None:
        report.append(f"the /dev/shm watcher failed (exit {watcher.returncode}): nothing known of /dev/shm")
        ours = []
    held_here = {os.path.basename(p) for p in leftovers.held_shm([os.getpid()])}
    shm = [n for n in ours if n not in held_here and os.path.exists(os.path.join(leftovers.SHM, n))]
    run = _state["run"]
    files = sorted(set(os.listdir(run)) - KEPT)
    if shm:
        report.append(f"{len(shm)} name(s) left in {leftovers.SHM}: {', '.join(sorted(shm))}")
    if files:
        report.append(f"{len(files)} entr(y/ies) left in the temporary directory ({run}): {', '.join(files)}")
    for n in shm:                    # reported; now gone
        try:
            os.unlink(os.path.join(leftovers.SHM, n))
        except FileNotFoundError:
            pass
    shutil.rmtree(run, ignore_errors=True)
    if report and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    if _state.get("report") and _controller(config):
        terminalreporter.write_sep("=", "leftovers", red=True)
        for line in _state["report"]:
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    if not _state or not _controller(config):
        return
    watcher = _state["watcher"]
    if watcher.poll() is None:       # the session never finished (an error in collection, ^C)
        watcher.kill()
        watcher.wait()
        shutil.rmtree(_state["run"], ignore_errors=True)
    for k, v in _state["saved"].items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    tempfile.tempdir = None
    _state.clear()
