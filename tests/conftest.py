"""Shared fixtures.  Fault scenarios run in subprocesses, so that a crash (or
a deliberate fatal error) fails one test and not the suite."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, env=None, timeout=120, check=False):
    """Run ``code`` in a fresh interpreter; returns the CompletedProcess.
    Output is captured as text."""
    full_env = {**os.environ, "PYTHONFAULTHANDLER": "", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"scenario failed with {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


@pytest.fixture
def py():
    return run_py
