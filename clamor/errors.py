"""clamor's exception tree.  Everything clamor raises derives from ClamorError.

Where a standard exception fits too, the class derives from it as well
(RegionExhausted is a MemoryError, InvalidSize a ValueError), so code that
catches the standard one keeps working.
"""
import errno as _errno


class ClamorError(Exception):
    """Base of every clamor error.  ``errno`` is the C error code, if any."""

    def __init__(self, message, errno=None):
        super().__init__(message)
        self.errno = errno


class BuildError(ClamorError, ImportError):
    """The compiled core or libzmq could not be loaded."""


class UnsupportedPython(BuildError):
    """The compiled core was built for another Python than the one running,
    or for one whose object layouts clamor does not know: reinstall clamor
    with this interpreter, or use a supported one."""


class ConfigError(ClamorError, ValueError):
    """A bad setting: region geometry, page size, endpoint, environment."""


class RegionError(ClamorError):
    """The global region could not be mapped or is not in the right state."""


class RegionInUse(RegionError):
    """The region's address range is taken, this process has a region
    already, the region is still in use and cannot be closed, or another
    Cluster of this process is open."""


class NoRegion(RegionError):
    """The operation needs a region (or a worker region) and there is none."""


class AllocError(ClamorError):
    """An allocation in the region failed."""


class InvalidSize(AllocError, ValueError):
    """A negative, non-integer or impossibly large size or alignment."""


class InvalidPointer(AllocError, ValueError):
    """free/realloc of an address that is not a live region block."""


class RegionExhausted(AllocError, MemoryError):
    """The region has no room left for the request."""


class NotDriver(AllocError):
    """Only the driver allocates in the region; this process is a worker."""


class PageFetchError(ClamorError, OSError):
    """A page could not be fetched (driver gone, time-out, never allocated)."""


class TransportError(ClamorError):
    """A ZeroMQ endpoint could not be bound or reached."""


class ProtocolError(ClamorError):
    """A peer sent a malformed or unexpected message."""


class TaskError(ClamorError):
    """A function shipped to a worker raised.  ``remote_type`` is the name
    of the exception's class there (``"ZeroDivisionError"``, or a clamor
    error such as ``"NotDriver"``), ``remote_traceback`` its traceback."""

    def __init__(self, message, remote_traceback=""):
        super().__init__(message)
        self.remote_traceback = remote_traceback
        head = message.split(":", 1)[0]
        self.remote_type = head if head.isidentifier() else ""

    def __str__(self):
        base = super().__str__()
        return f"{base}\n\nRemote traceback:\n{self.remote_traceback}" if self.remote_traceback else base


class NotSerializable(ClamorError, TypeError):
    """A task's function, or something it captures, cannot be shipped to the
    workers (a lock, a socket, an open file, the Cluster itself)."""


class TaskTimeout(ClamorError, TimeoutError):
    """A task did not finish within the time-out it was given."""


class NotShareable(ClamorError, ValueError):
    """Something reachable from a shared object is outside the region
    (``clamor.share``): the message names its path and why."""


class ShareWarning(UserWarning):
    """``clamor.share`` could not tell whether everything reachable from an
    object is right on the workers (a word in C memory that may or may not
    be a pointer, or C memory too large to scan)."""


class ByValueWarning(UserWarning):
    """A region object that workers cannot use in place travels by value,
    as a copy in every task that needs it (a broadcast): said once per
    object, with the reason and its pickled size."""


class WorkerLost(ClamorError):
    """A worker process died or stopped answering."""


class WorkerRefused(ClamorError):
    """The driver did not let this worker join: the Cluster expects no more
    workers, or is closed."""


class VersionExpired(WorkerLost):
    """A lost output can only be recomputed through the snapshot of an
    unpersisted collection, and the page version that snapshot was made at
    is no longer kept (``Cluster.unpersisted_versions``)."""


# Default translation of C errno values; callers may override per call.
ERRNO_CLASSES = {
    _errno.EEXIST: RegionInUse,
    _errno.EBUSY: RegionInUse,
    _errno.ENXIO: NoRegion,
    _errno.EINVAL: ConfigError,
    _errno.ENOMEM: RegionExhausted,
    _errno.EPERM: NotDriver,
    _errno.EFAULT: PageFetchError,
    _errno.ENOENT: PageFetchError,
    _errno.ETIMEDOUT: TransportError,
    _errno.ENOTCONN: PageFetchError,
    _errno.EADDRINUSE: TransportError,
    _errno.EPROTO: ProtocolError,
    _errno.EBADMSG: ProtocolError,
    _errno.ENOSYS: BuildError,
}
