"""A Cluster's settings, in three groups, each checked in one place.

    clamor.Cluster(workers=4)                                   # the usual
    clamor.Cluster(workers=WorkerOptions(4, slots=4),
                   network=NetworkOptions(listen="10.0.0.1:7000", worker_ports=(7100, 7199)),
                   recovery=RecoveryOptions(max_attempts=2))

Every setting keeps its name as a keyword of Cluster too (``slots=4``,
``listen=...``, ``max_attempts=2``), and the names that a worker started
by hand shares with its cluster are the same on ``clamor worker``
(``--slots``, ``--no-encrypt``; ``worker_ports=(lo, hi)`` is a worker's
``--ports LO-HI``, and ``join(ports=(lo, hi))`` takes it as it is) and on
``clamor.dask.attach`` (``secret``, ``encrypt``, ``replication``).  Bad
settings raise ConfigError.
"""
import dataclasses
import math
import numbers
import os

from .. import errors
from ..memory import samehost
from .driver import check_replication
from .scheduler import Speculation

START_METHODS = ("fork", "spawn")


def _positive_int(name, v, hint=""):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise errors.ConfigError(f"{name} must be a positive int{hint}, not {v!r}")


def port_range(value, name="worker_ports", text=False):
    """(lo, hi) of a range of ports given as (lo, hi), or with ``text`` as
    "LO-HI" too (a worker's --ports); None for None.  ConfigError otherwise."""
    if value is None:
        return None
    if text and isinstance(value, str):
        lo, sep, hi = value.partition("-")
        if sep and lo.isdigit() and hi.isdigit():
            value = (int(lo), int(hi))
    ok = (isinstance(value, tuple) and len(value) == 2
          and all(isinstance(p, int) and not isinstance(p, bool) for p in value)
          and 0 < value[0] <= value[1] <= 65535)
    if not ok:
        raise errors.ConfigError(f"{name} must be a (lo, hi) tuple of ports, not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """Who the workers are: ``workers`` local ones (default: one per CPU,
    none with ``remote``), started with ``start_method`` ("fork" or
    "spawn"); ``remote`` more started by hand; ``slots`` tasks each holds
    at once; ``same_host``: "map" (workers on this host map the driver's
    pages) or "fetch" (default CLAMOR_SAME_HOST, else "map")."""
    workers: int = None
    remote: int = 0
    start_method: str = "fork"
    slots: int = 2
    same_host: str = None

    def checked(self):
        """These settings with their defaults filled in; ConfigError if one is bad."""
        same_host = self.same_host
        if same_host is None:
            same_host = os.environ.get("CLAMOR_SAME_HOST") or "map"
        if same_host not in samehost.MODES:
            raise errors.ConfigError(f"same_host must be one of {samehost.MODES} (or CLAMOR_SAME_HOST), "
                                     f"not {same_host!r}")
        remote, workers = self.remote, self.workers
        if isinstance(remote, bool) or not isinstance(remote, int) or remote < 0:
            raise errors.ConfigError(f"remote must be an int >= 0, not {remote!r}")
        if workers is None:
            workers = 0 if remote else os.cpu_count() or 1
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0 or workers + remote < 1:
            raise errors.ConfigError(f"workers must be a positive int (or 0 with remote workers), not {workers!r}")
        if self.start_method not in START_METHODS:
            raise errors.ConfigError(f"start_method must be one of {START_METHODS}, not {self.start_method!r}")
        _positive_int("slots", self.slots)
        return dataclasses.replace(self, workers=workers, same_host=same_host)


@dataclasses.dataclass(frozen=True)
class NetworkOptions:
    """Where the cluster listens and who may talk to it: ``listen``
    ("HOST:PORT", default loopback, any port), ``pages_port`` (the page
    server's, default any), ``worker_ports`` ((lo, hi): where
    workers' servers listen, a worker's --ports LO-HI), ``secret`` (default CLAMOR_SECRET, else a new
    one), ``encrypt`` (CURVE, or authentication only), ``replication``
    ("two-choices", "random" or "off": peers serving hot pages)."""
    listen: str = None
    pages_port: int = None
    worker_ports: tuple = None
    secret: str = None
    encrypt: bool = True
    replication: str = "two-choices"

    def checked(self):
        check_replication(self.replication)
        p = self.pages_port
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 65535):
            raise errors.ConfigError(f"pages_port must be a port number (0 for any), not {p!r}")
        return dataclasses.replace(self, worker_ports=port_range(self.worker_ports))

    @property
    def ports(self):
        """``worker_ports`` as a worker's --ports takes it: "LO-HI", or "*"."""
        return "*" if self.worker_ports is None else f"{self.worker_ports[0]}-{self.worker_ports[1]}"


@dataclasses.dataclass(frozen=True)
class RecoveryOptions:
    """What a failure does: with ``recover`` a lost worker's work is
    recomputed from lineage; ``replace_workers`` starts a new local worker
    for each one lost; ``max_attempts`` bounds how often one partition may
    be lost, and how many attempts a stage may take; ``speculation``: True,
    False or a clamor.Speculation; a worker silent ``heartbeat_timeout``
    seconds is lost; workers have ``start_timeout`` seconds to start."""
    recover: bool = True
    replace_workers: bool = True
    max_attempts: int = 4
    speculation: object = True
    heartbeat_timeout: float = 10.0
    start_timeout: float = 60.0

    def checked(self):
        for name in ("heartbeat_timeout", "start_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
                raise errors.ConfigError(f"{name} must be a positive number of seconds, not {v!r}")
        spec = self.speculation
        if spec is True:
            spec = Speculation()
        elif spec is False or spec is None:
            spec = None
        elif not isinstance(spec, Speculation):
            raise errors.ConfigError(f"speculation must be True, False or a clamor.Speculation, not {spec!r}")
        _positive_int("max_attempts", self.max_attempts)
        return dataclasses.replace(self, recover=bool(self.recover), replace_workers=bool(self.replace_workers),
                                   speculation=spec, heartbeat_timeout=float(self.heartbeat_timeout),
                                   start_timeout=float(self.start_timeout))


_GROUPS = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (WorkerOptions, NetworkOptions, RecoveryOptions)}


def grouped(workers, network, recovery, settings):
    """The three groups, checked: ``workers`` (a count or a WorkerOptions),
    ``network`` and ``recovery`` (options or None), and ``settings``, the
    same settings by their names (a keyword given twice is a TypeError)."""
    out = []
    given = {WorkerOptions: workers if isinstance(workers, WorkerOptions) else None,
             NetworkOptions: network, RecoveryOptions: recovery}
    for cls, names in _GROUPS.items():
        mine = {k: settings.pop(k) for k in list(settings) if k in names}
        base = given[cls]
        if cls is WorkerOptions and base is None:
            base = WorkerOptions(workers)
        if base is None:
            base = cls()
        elif not isinstance(base, cls):
            raise errors.ConfigError(f"expected a clamor.{cls.__name__}, not {base!r}")
        elif mine and given[cls] is not None:
            raise TypeError(f"{', '.join(sorted(mine))} given both alone and in a {cls.__name__}")
        out.append(dataclasses.replace(base, **mine))
    if settings:
        raise TypeError(f"Cluster() got an unexpected keyword argument {sorted(settings)[0]!r}")
    # (checked in the order the settings were always checked: the workers', then recovery's, then the network's)
    w, r = out[0].checked(), out[2].checked()
    return w, out[1].checked(), r
