"""Faults outside the region go to the handler installed before clamor's,
in its own calling convention; clamor's handler is put back in front before
a task runs."""
import signal

from helpers import PRELUDE

NULL_DEREF = "import ctypes; ctypes.string_at(0)"


def test_null_deref_with_faulthandler_enabled_first_prints_traceback(py):
    p = py("""
import faulthandler, sys
faulthandler.enable()
import clamor
from clamor import region
region.init(); region.ensure_handler_first()
assert region.handler_is_first()
def crash():
    """ + NULL_DEREF + """
crash()
""")
    assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stderr)
    assert "Fatal Python error: Segmentation fault" in p.stderr, p.stderr
    assert 'in crash' in p.stderr, p.stderr


def test_null_deref_without_faulthandler_dies_by_default_action(py):
    p = py("""
import clamor
from clamor import region
region.init(); region.ensure_handler_first()
""" + NULL_DEREF)
    assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stderr)
    assert "Fatal Python error" not in p.stderr


def test_faulthandler_enabled_after_clamor_is_chained_and_clamor_stays_first(py):
    p = py(PRELUDE + """
import faulthandler
a = clamor.array(np.arange(1 << 20, dtype=np.float64))
with clamor.Cluster(workers=1, progress=False) as cl:
    def enable_faulthandler():
        faulthandler.enable()           # replaces clamor's handler
        return region.handler_is_first()
    assert cl.run(enable_faulthandler) == [False]
    # the next task starts with clamor in front again, and region faults work
    def read(r):
        return region.handler_is_first(), float(r.get()[123456])
    assert cl.run(read, clamor.ref(a)) == [(True, 123456.0)]
    def crash():
        import ctypes; ctypes.string_at(0)
    try:
        cl.run(crash)
    except clamor.WorkerLost:
        print("LOST")
""")
    assert "LOST" in p.stdout, p.stdout + p.stderr
    # the worker's NULL dereference went through clamor to faulthandler
    assert "Fatal Python error: Segmentation fault" in p.stderr, p.stderr
    assert "in crash" in p.stderr, p.stderr


def test_kill_with_sigsegv_still_kills(py):
    p = py("""
import os, signal, clamor
from clamor import region
region.init(); region.ensure_handler_first()
os.kill(os.getpid(), signal.SIGSEGV)
import time; time.sleep(5)
print("survived")
""", timeout=30)
    assert p.returncode == -signal.SIGSEGV and "survived" not in p.stdout
