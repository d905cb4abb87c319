"""clamor: large global variables in a fixed-address region, read by workers
one page at a time over ZeroMQ (Clamor, SoCC 2021).

    import clamor
    a = clamor.zeros(1 << 20)              # numpy array in the region
    addr = clamor.alloc(4096); clamor.free(addr)
"""
from . import errors
from ._native import ffi as _ffi, lib as _lib  # noqa: F401  (loads the core)
from .errors import (AllocError, BuildError, ClamorError, ConfigError, InvalidPointer, InvalidSize, NoRegion,
                     NotDriver, NotSerializable, NotShareable, PageFetchError, ProtocolError, RegionError,
                     RegionExhausted, RegionInUse, ShareWarning, ByValueWarning, TaskError, TaskTimeout, TransportError,
                     VersionExpired, WorkerLost, WorkerRefused)
# the memory layer: the region, allocation, heap(), share(), references, I/O
from .memory import region
from .memory.alloc import alloc, array, asarray, c_api, calloc, empty, free, full, get_include, heap_stats, in_region, \
    realloc, usable_size, view, zeros
from .memory.heap import heap
from .memory.io import fromfile, readinto, recv_into, write
from .memory.refs import ArrayRef, Ref, ref
from .memory.region import configure, connect, prefetch, reset_stats, stats
from .memory.share import share
# the runtime: clusters, collections, stages
from .runtime.cluster import Cluster
from .runtime.collection import DataCollection
from .runtime.scheduler import Speculation
from .runtime.options import NetworkOptions, RecoveryOptions, WorkerOptions

__version__ = "0.1.0"

__all__ = [
    "Cluster", "WorkerOptions", "NetworkOptions", "RecoveryOptions", "Speculation", "DataCollection", "heap", "share", "region", "NotShareable", "ShareWarning", "ByValueWarning", "alloc", "calloc", "realloc", "free", "usable_size", "heap_stats",
    "empty", "zeros", "full", "array", "asarray", "view", "in_region", "c_api", "get_include",
    "Ref", "ArrayRef", "ref", "prefetch", "configure", "connect", "stats", "reset_stats",
    "readinto", "recv_into", "write", "fromfile", "errors",
    "ClamorError", "BuildError", "ConfigError", "RegionError", "RegionInUse", "NoRegion", "AllocError",
    "InvalidSize", "InvalidPointer", "RegionExhausted", "NotDriver", "PageFetchError", "TransportError",
    "ProtocolError", "TaskError", "WorkerLost", "WorkerRefused", "VersionExpired", "NotSerializable", "TaskTimeout",
]
