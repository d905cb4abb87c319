"""Workers import what the driver imports (clamor/runtime/code.py).

A driver script in a directory of its own imports a helper module and a
small package that sit next to it; its tasks call both, build instances
of the helper's class, and, after the driver edits and reloads the
helper, call the new code.  Forked workers inherit the modules, spawned
ones start with the driver's sys.path and working directory, and workers
on namespace hosts (started in "/", with nothing of the script's
directory on their path) get the modules' source with the stages.  Every
answer is the one the driver computes itself.  A worker without an
installed package the driver imported is refused at joining, naming it.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import PRELUDE
from clamor.testing.nethosts import require_hosts

HERE = os.path.dirname(os.path.abspath(__file__))

HELPER = """
SCALE = 3

def f(x):
    return x * SCALE

class Rec:
    def __init__(self, v):
        self.v = v
"""

EDITED = """
SCALE = 5

def f(x):
    return x * SCALE + 1

class Rec:
    def __init__(self, v):
        self.v = -v
"""

DRIVER = """
import importlib
sys.path.insert(0, {tests!r})
import helper, pkg

mode = sys.argv[1]
res = {{}}
procs = []
if mode == "hosts":
    from clamor.testing.nethosts import Hosts
    hosts = Hosts(2)
    cl = clamor.Cluster(workers=0, remote=2, listen=f"{{hosts.root_addr}}:*", progress=False, start_timeout=60)
    cl.join_command()
    env = {{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}}
    env["CLAMOR_SECRET"] = cl.secret
    procs = [h.popen([sys.executable, "-m", "clamor.worker", cl.endpoint], env=env, cwd="/",
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for h in hosts]
else:
    cl = clamor.Cluster(workers=2, start_method=mode, progress=False, start_timeout=60)
cl.start()

def where():
    return [os.getcwd(), sys.path[:2], helper.__name__ in sys.modules]

def stage(fn):
    return cl.parallelize(list(range(8)), 8).map(fn).collect()

want = lambda fn: [fn(x) for x in range(8)]
first = lambda x: (pkg.g(helper.f(x)), pkg.sub.h(x), helper.Rec(x).v, type(helper.Rec(x)).__module__)
res["where"] = cl.run(where)
res["driver_where"] = where()
res["first"] = [stage(first), want(first)]
with open(helper.__file__, "w") as fh:
    fh.write({edited!r})
importlib.reload(helper)
import later                                   # imported by the driver only now
second = lambda x: (helper.f(x), helper.Rec(x).v, later.k(x))
res["second"] = [stage(second), want(second)]
from clamor.runtime import code as _code
res["shipped"] = _code.user_modules()
cl.close()
res["exits"] = [p.wait(30) for p in procs]
if mode == "hosts":
    hosts.close()
print(json.dumps(res))
"""


def script_dir(tmp_path):
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import sub\nfrom .sub import g\n")
    (tmp_path / "pkg" / "sub.py").write_text("def g(x):\n    return x + 100\n\ndef h(x):\n    return -x\n")
    (tmp_path / "later.py").write_text("def k(x):\n    return x ** 2\n")
    (tmp_path / "drive.py").write_text(PRELUDE + DRIVER.format(tests=HERE, edited=EDITED))
    return tmp_path


def drive(tmp_path, mode, env=None, timeout=240):
    d = script_dir(tmp_path)
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update(env or {})
    p = subprocess.run([sys.executable, "drive.py", mode], cwd=d, capture_output=True, text=True, timeout=timeout,
                       env=full)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-6000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def check(out):
    got, want = out["first"]
    assert got == want, out
    assert want[3] == [109, -3, 3, "helper"]        # (the driver's own answer, as written above)
    got, want = out["second"]
    assert got == want, out
    assert want[3] == [16, -3, 9]                  # the edited helper and the later module
    assert {"helper", "pkg", "pkg.sub", "later"} <= set(out["shipped"]), out["shipped"]


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_local_workers_import_the_scripts_own_modules_and_follow_an_edit(tmp_path, mode):
    out = drive(tmp_path, mode)
    check(out)
    if mode == "spawn":
        # the driver's working directory and sys.path, as multiprocessing gives its children
        assert out["driver_where"][0] == str(tmp_path) and str(tmp_path) in out["driver_where"][1]
        assert all(w == out["driver_where"] for w in out["where"]), out


def test_workers_on_other_hosts_get_the_scripts_own_modules_with_the_stages(tmp_path):
    require_hosts()
    out = drive(tmp_path, "hosts")
    check(out)
    for cwd, path, _ in out["where"]:
        assert cwd == "/" and str(tmp_path) not in path, out["where"]   # nothing of the script's directory
    assert out["exits"] == [0, 0]


def test_a_worker_without_an_installed_package_the_driver_imported_is_refused_naming_it(tmp_path):
    # an installed distribution (dist-info on the driver's path only), not
    # the user's own code: it is not shipped, and the worker has no copy
    site = tmp_path / "site"
    (site / "fakedist_pkg").mkdir(parents=True)
    (site / "fakedist_pkg" / "__init__.py").write_text("VALUE = 7\n")
    info = site / "fakedist_pkg-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist-pkg\nVersion: 1.2\n")
    (info / "top_level.txt").write_text("fakedist_pkg\n")
    (info / "RECORD").write_text("fakedist_pkg/__init__.py,,\n")
    code = textwrap.dedent(f"""
        import json, os, subprocess, sys, threading
        sys.path.insert(0, {str(site)!r})
        import clamor, fakedist_pkg
        from clamor.runtime import code
        cl = clamor.Cluster(workers=0, remote=1, progress=False, start_timeout=8)
        cl.join_command()
        env = {{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}}
        env["CLAMOR_SECRET"] = cl.secret
        w = subprocess.Popen([sys.executable, "-m", "clamor.worker", cl.endpoint, "--connect-timeout", "20"],
                             env=env, cwd="/", stderr=subprocess.PIPE, text=True)
        try:
            cl.start()
            started = True
        except clamor.ClamorError as err:
            started = type(err).__name__
        res = {{"rc": w.wait(60), "says": w.stderr.read().strip().splitlines(), "started": started,
                "shipped": code.user_modules()}}
        cl.close()
        print(json.dumps(res))
        """)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["rc"] != 0 and out["started"] == "WorkerLost", out
    says = " ".join(out["says"])
    assert "fakedist_pkg" in says and "fakedist-pkg 1.2" in says and "cannot import" in says, says
    assert "fakedist_pkg" not in out["shipped"]
