"""The driver's page versions, as the runtime sees them (csrc/version.c):
a version begins at each stage, the pages written since the last one and
those whose bytes changed, how the region is write-protected to see the
writes, and which versions are kept; a worker's side is the version its
task reads (``set_version``).  region.py dropping a worker's copies
(``invalidate``) and mapping the region are not here.
"""
import errno

from .. import errors
from .._native import check, ffi, lib


def version_begin(version):
    """Driver: page version ``version`` begins (clamor_version_begin): the
    tasks submitted next read the region as it is now.  Returns the indices
    of the pages whose bytes changed since the previous version (a uint64
    ndarray): workers must drop their copies before running its tasks."""
    import numpy as np

    from . import hidden

    check(hidden.version_begin(int(version)), f"beginning version {version}",
          {errno.EINVAL: errors.ConfigError, errno.EPERM: errors.RegionError})
    n = int(lib.clamor_changed_count())
    out = np.empty(n, dtype=np.uint64)
    if n:
        lib.clamor_changed_copy(ffi.cast("uint64_t *", out.ctypes.data), n)
    return out


_WPROT = {0: None, 1: "mprotect", 2: "userfaultfd"}


def write_protection():
    """Driver: how the region is write-protected for page versions since
    the first stage, as ``{"mechanism", "reason"}``.  ``"userfaultfd"``:
    system calls may write into region memory (``read``, ``recv_into``,
    ``np.load`` ...), and their writes are versioned like any other.
    ``"mprotect"``: such a call gets EFAULT on a page not opened first
    (blocks handed out inside ``heap()`` are; ``clamor.readinto`` and
    ``clamor.prefetch`` open others).  ``None`` before the first stage, or
    in a worker.  ``CLAMOR_WRITE_PROTECT`` (auto, userfaultfd, mprotect),
    read at the first stage, chooses."""
    buf = ffi.new("char[]", 512)
    mode = int(lib.clamor_write_protection(buf, 512))
    return {"mechanism": _WPROT.get(mode), "reason": ffi.string(buf).decode(errors="replace")}


def dirty_count():
    """Driver: pages first written since the last stage began (0 before
    the first stage)."""
    return int(lib.clamor_dirty_count())


def dirty_pages():
    """Driver: the indices of the pages first written since the last stage
    began (a sorted uint64 ndarray; empty before the first stage).  Their
    bytes may read as they did: the next ``version_begin`` tells."""
    import numpy as np

    n = int(lib.clamor_dirty_count())
    while True:
        out = np.empty(n + 64, dtype=np.uint64)
        total = int(lib.clamor_dirty_copy(ffi.cast("uint64_t *", out.ctypes.data), out.size))
        if total <= out.size:
            return np.unique(out[:total])
        n = total


def version_current():
    """Driver: the last page version begun (0 before the first)."""
    return int(lib.clamor_version_current())


def differs_since(addr, nbytes, stage):
    """Driver: do the ``nbytes`` at ``addr`` (in the region) read otherwise
    now than in the version the tasks of ``stage`` read?  Only the pages
    written since that stage began are compared."""
    out = ffi.new("int *")
    check(lib.clamor_version_differs(addr, nbytes, stage, out), "comparing region bytes with a stage's version")
    return bool(out[0])


def versions_keep(stages):
    """Driver: keep only the page versions that tasks reading at ``stages``
    (ascending stage numbers) need."""
    arr = ffi.new("uint32_t[]", [int(x) for x in stages] or [0])
    check(lib.clamor_versions_keep(arr, len(stages)))


def log_ahead():
    """Driver: log now the pages that changed at the last ``version_begin``
    and at one of the few versions before (the ones the driver rewrites at
    every version), as their first writes would, in runs: its writes to them
    then take no fault.  Call after ``versions_keep``, which frees the
    locations they move to.  Returns how many pages it logged (0 with
    ``CLAMOR_LOG_AHEAD=0``)."""
    return int(lib.clamor_versions_log_ahead())


def set_version(version):
    """Worker: the page version the task about to run reads (page requests
    carry it)."""
    lib.clamor_set_version(int(version))
