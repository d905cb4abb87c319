"""Process checks shared by the tests that kill or stop processes."""
import time

import psutil


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
