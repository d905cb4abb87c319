"""Same-host workers map the driver's pages instead of fetching them.

The driver's memfd holds every page's bytes at a location a reader may
map, and a table of where each page is from which stage on
(csrc/samehost.c, csrc/version.c).  A worker forked from a driver that
shares (``share(True)``, a Cluster's default) maps from its first fault.
Any other worker asks with ``attach()``, given what ``info()`` says on
the driver; a worker it cannot serve (another host or network namespace,
another user, a container boundary) fetches, and ``status()`` says why.
"""
import errno
import os

from .. import errors
from .._native import error, ffi, lib

MODES = ("map", "fetch")

# This process's answer, as the worker's HELLO reports it.
_reason = "not asked to map the driver's pages"


def share(on):
    """Driver: workers forked from now on map (True) or fetch (False)."""
    rc = lib.clamor_map_share(1 if on else 0)
    if rc:
        raise error(rc, "same-host mapping", {errno.EPERM: errors.RegionError})


def info():
    """Driver: what a worker needs to map its pages: {"pid", "fd", "cookie"}."""
    fd = ffi.new("int *")
    cookie = ffi.new("uint8_t[16]")
    rc = lib.clamor_map_info(fd, cookie)
    if rc:
        raise error(rc, "same-host mapping", {errno.EPERM: errors.RegionError})
    return {"pid": os.getpid(), "fd": int(fd[0]), "cookie": bytes(ffi.buffer(cookie, 16)).hex()}


def attach(offer):
    """Worker: map the driver's pages as ``offer`` (the driver's ``info()``)
    says.  True if this worker maps them from now on; False if it fetches,
    with the reason in ``status()``."""
    global _reason
    try:
        pid, fd, cookie = int(offer["pid"]), int(offer["fd"]), bytes.fromhex(offer["cookie"])
        if len(cookie) != 16:
            raise ValueError("cookie of the wrong size")
    except (KeyError, TypeError, ValueError) as err:
        _reason = f"the driver's offer to map its pages was malformed ({err})"
        return False
    rc = lib.clamor_map_attach(pid, fd, ffi.from_buffer(cookie))
    if rc:
        _reason = error(rc).args[0]
        return False
    _reason = ""
    return True


def decline(reason):
    """Worker: record why it fetches (the driver asked it to)."""
    global _reason
    _reason = reason


def status():
    """Worker: {"mode": "map" | "fetch", "reason": why it fetches, or ""}."""
    if lib.clamor_map_status():
        return {"mode": "map", "reason": ""}
    return {"mode": "fetch", "reason": _reason}


def map_floor(stage):
    """Driver: no worker that maps pages still reads, through a mapping, a
    location of a stage below ``stage``: versions only such readers needed
    may go at the next ``versions_keep``."""
    lib.clamor_versions_map_floor(int(stage))


def moved():
    """Driver: the pages of the last stage begun that kept their bytes but
    moved in the driver's memfd; workers that map must drop them."""
    import numpy as np

    n = int(lib.clamor_moved_count())
    out = np.empty(n, dtype=np.uint64)
    if n:
        lib.clamor_moved_copy(ffi.cast("uint64_t *", out.ctypes.data), n)
    return out
