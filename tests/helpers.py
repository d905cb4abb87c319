"""What the tests share: running a driver in a fresh interpreter, waiting
for processes to go, compiling a C library.

Fault scenarios run in subprocesses, so that a crash (or a deliberate fatal
error) fails one test and not the suite.  ``run_py`` gives the completed
process; ``run_json`` and ``scenario`` the JSON of the script's last line.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


KEPT = ("CLAMOR_SAME_HOST", "CLAMOR_WRITE_PROTECT")   # set for a test by the same_host and write_protect fixtures


def clean_env(extra=None):
    """This environment without clamor's settings (CLAMOR_*), plus ``extra``;
    CLAMOR_SAME_HOST and CLAMOR_WRITE_PROTECT stay, since fixtures set them
    for the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAMOR_") or k in KEPT}
    env.update(extra or {})
    return env


def run_py(code, env=None, timeout=120, check=False, args=()):
    """Run ``code`` in a fresh interpreter, with ``args`` in its sys.argv;
    returns the CompletedProcess, its output captured as text.  faulthandler
    is off unless ``env`` sets it."""
    full_env = {**os.environ, "PYTHONFAULTHANDLER": "", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"scenario failed with {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-6000:]}")
    return proc


def run_script(code, env=None, timeout=120, args=()):
    """``run_py`` that must exit 0: returns the JSON of the script's last
    stdout line and its stderr."""
    p = run_py(code, env=env, timeout=timeout, check=True, args=args)
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def run_json(code, env=None, timeout=60):
    """Run ``code`` in a fresh interpreter without CLAMOR_* settings; it
    must exit 0.  Returns the parsed JSON of its last stdout line."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, env=clean_env(env), cwd=ROOT)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


# PRELUDE's first part, the standard library alone: the one variant, for a
# script that must not load clamor or numpy (a program run with -I -S on a
# namespace host; one that sets up what clamor must find in place when it
# loads, such as a fault handler of its own).
STDLIB = """
import json, os, signal, socket, subprocess, sys, threading, time
"""

# What every driver script starts with (scenario prepends it; a test that
# runs a script another way puts it first itself): the modules scripts use,
# clamor and its region, and attempt(f) -> ["ok", value] or [exception
# class, message, is a ClamorError].  A file's own imports or sys.path
# entries (``sys.path.insert(0, "tests")``: scripts run from the
# repository's root) follow it in the script.
PRELUDE = STDLIB + """
import numpy as np
import clamor
from clamor import region

def attempt(f, *a, **k):
    try:
        r = f(*a, **k)
        return ["ok", r if isinstance(r, (int, float, str, list, type(None))) else type(r).__name__]
    except BaseException as e:
        return [type(e).__name__, str(e)[:300], isinstance(e, clamor.ClamorError)]
"""


def flag_waiter(directory, step=0.005):
    """Script text (at column 0) for a handshake through files in
    ``directory``: ``say(name)`` creates the file ``name``, and
    ``wait_for(name)`` waits up to 60 s for it (a driver thread and a
    task, or two processes, taking turns)."""
    return f"""
flags = {str(directory)!r}
def wait_for(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(flags, name)):
        assert time.monotonic() < deadline, "no " + name
        time.sleep({step})
def say(name):
    open(os.path.join(flags, name), "w").close()
"""


def scenario(body, timeout=120, env=None):
    """Run a driver script (after PRELUDE, faulthandler on) in its own
    interpreter, with ``env`` added to the environment (a None value takes
    the variable out); it must exit 0 and print one JSON line last,
    returned."""
    code = PRELUDE + textwrap.dedent(body)
    full = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={k: v for k, v in full.items() if v is not None})
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


_uffd_missing = None


def userfaultfd_missing():
    """Why a driver here cannot write-protect its region with userfaultfd
    ("" if it can); asked once, of a fresh interpreter."""
    global _uffd_missing
    if _uffd_missing is None:
        p = run_py("""
            from clamor import region
            region.ensure(); region.version_begin(1)
            wp = region.write_protection()
            print("" if wp["mechanism"] == "userfaultfd" else wp["reason"] or "none")
        """, env={"CLAMOR_WRITE_PROTECT": "auto"}, check=True)
        _uffd_missing = p.stdout.strip()
    return _uffd_missing


def gone(pid):
    """The process has exited (reaped, or a zombie nobody reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids, timeout, step=0.02):
    """True once every one of ``pids`` is gone, False after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(step)
    return all(gone(p) for p in pids)


def shared_library(tmp_path, name, source, include=None):
    """Compile C ``source`` into tmp_path/lib<name>.so (with ``include`` on
    the header path); returns its path."""
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    lib = tmp_path / f"lib{name}.so"
    cmd = ["cc", "-shared", "-fPIC", "-O1"] + (["-I", str(include)] if include else []) + ["-o", str(lib), str(src)]
    subprocess.run(cmd, check=True)
    return lib


def shadow_numpy(tmp_path):
    """Driver lines (indented as scenario bodies are) that set ``core``, the
    portable name of numpy's core module, and ``shadow``, a directory with
    another ELF file (another build-id) at that name, to put first on a
    worker's path; and ``buf``, what the clamor logger says."""
    return f"""
        import io, logging, shutil, threading, numpy
        from clamor.memory import images
        buf = io.StringIO()
        logging.getLogger("clamor").addHandler(logging.StreamHandler(buf))
        core = [n for n in images.loaded() if n.startswith("rel:numpy/") and "_multiarray_umath" in n][0][4:]
        shadow = "{tmp_path}/shadow"
        os.makedirs(os.path.dirname(os.path.join(shadow, core)))
        shutil.copy(sys.executable, os.path.join(shadow, core))   # an ELF file with another build-id
"""


def run_driver(code, timeout=150, env=None):
    """Run ``code`` in a fresh interpreter (faulthandler on, as scenario.py
    does); returns its last stdout line as JSON, with its exit status under
    "exit" and the fatal lines of its stderr (workers share it) under
    "fatal".  A driver that printed its line and then died still reports."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})})
    lines = p.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\n" \
                                                f"stderr:\n{p.stderr[-5000:]}"
    out = json.loads(lines[-1])
    out["exit"] = p.returncode
    out["fatal"] = sorted({ln for ln in p.stderr.splitlines() if "fatal" in ln.lower()})[:20]
    return out


# For driver scripts that compare the byte ranges two walks read: the
# union of (start, length) pairs as sorted, merged [start, end) lists.
UNION = """
def union(pairs):
    out = []
    for lo, n in sorted((int(a), int(b)) for a, b in pairs if int(b)):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], lo + n)
        else:
            out.append([lo, lo + n])
    return out
"""
