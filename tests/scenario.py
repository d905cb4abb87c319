"""Run a driver script in its own interpreter; some scenarios used to crash
it.  The script prints one JSON line of what it saw, its last line."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = """
import json, os, signal, socket, threading, time
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


def scenario(body, timeout=120):
    code = PRELUDE + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])
