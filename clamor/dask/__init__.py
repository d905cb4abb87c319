"""clamor's globals on Dask: region arrays read in place by Dask's workers.

    from dask.distributed import Client, LocalCluster
    import clamor, clamor.dask

    client = Client(LocalCluster(n_workers=4))
    clamor.dask.attach(client)
    table = clamor.zeros(1 << 27)
    futures = client.map(lambda i: table[i * 1000], range(1000))   # table travels by reference

``attach`` installs a worker plugin (workers that join later attach too)
and a scheduler plugin.  Each worker maps the region and fetches the pages
its tasks touch, from the driver or from a peer.  A task reads the globals
as they were when it was submitted; the driver may write meanwhile.  See
docs/dask.md.  Needs the ``dask`` extra: ``pip install 'clamor[dask]'``.
"""
import ipaddress
import logging
import os
import threading

try:
    import distributed
except ImportError as err:  # pragma: no cover - the extra is not installed
    raise ImportError("clamor.dask needs Dask's distributed scheduler: pip install 'clamor[dask]'") from err

from .. import errors
from ..runtime import security
from ..runtime.liveness import pid_namespace
from ..runtime.cluster import any_open
from ..runtime.driver import add_region_user, check_replication
from ..runtime.worker import advertised_address
from . import _driver, _scheduler, _worker
from ._pickling import GlobalArray, GlobalObject

__all__ = ["attach", "detach", "attached", "secret", "ref", "stats", "GlobalArray", "GlobalObject"]

log = logging.getLogger("clamor.dask")

_lock = threading.Lock()
_current = {}    # "client", "driver": the one attachment of this process


def _busy():
    if _current:
        return ("this process's region is attached to a Dask client (clamor.dask.attach): detach it before "
                "starting a Cluster")
    return None


def _local(address):
    """Whether a Dask address is only reachable from this host."""
    if address.startswith(("inproc://", "ipc://")):
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def attach(client, secret=None, encrypt=True, host=None, replication="two-choices", connect_timeout=30.0):
    """Serve this process's region to every worker of ``client``, present
    and future, and send region arrays to its tasks by reference.

    ``secret``: the one the pages are authenticated with (default
    CLAMOR_SECRET, else a new one).  Workers get it with the plugin only
    over a Dask connection that is encrypted (``tls://``) or stays on this
    host; others read CLAMOR_SECRET from their environment.  ``encrypt``:
    CURVE (default) or authentication only.  ``host``: the address workers
    reach this process by (default: this host's address towards the
    scheduler).  ``replication``: how the driver spreads requests for hot
    pages over the workers that hold them, as a Cluster's ("off",
    "random", "two-choices").  Raises ConfigError for a client that is not connected, a
    second attach, or a worker that cannot attach (its error names why)."""
    if not isinstance(client, distributed.Client):
        raise errors.ConfigError(f"attach takes a dask.distributed.Client, not {type(client).__name__}")
    if client.status != "running":
        raise errors.ConfigError(f"the Dask client is {client.status}, not running")
    if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)) or connect_timeout <= 0:
        raise errors.ConfigError(f"connect_timeout is a positive number of seconds, not {connect_timeout!r}")
    check_replication(replication)
    with _lock:
        if _current:
            raise errors.ConfigError("this process is attached to a Dask client already: detach it first")
        if any_open():
            raise errors.RegionInUse("a clamor Cluster of this process is open: close it before attaching Dask")
        sched = client.scheduler.address
        secret = security.from_environment(secret) or security.new_secret()
        host = host or advertised_address(sched if sched.startswith("tcp://") else "tcp://127.0.0.1:1")
        driver = _driver.Driver(client, secret, encrypt, host, replication)
        driver.start()
        try:
            carried = secret if (sched.startswith("tls://") or _local(sched)) else None
            client.register_plugin(_scheduler.VersionPlugin(), name=_scheduler.NAME)
            client.register_plugin(_worker.RegionPlugin(driver.endpoint, carried, encrypt, os.getpid(),
                                                        pid_namespace(), connect_timeout), name=_worker.NAME)
        except BaseException:
            _unregister(client)
            driver.stop()
            raise
        _current.update(client=client, driver=driver, secret=secret)
    log.info("clamor attached to the Dask scheduler at %s (control %s, pages %s)", sched, driver.endpoint,
             driver.pages)


def _unregister(client):
    for kind, name in (("worker", _worker.NAME), ("scheduler", _scheduler.NAME)):
        try:
            getattr(client, f"unregister_{kind}_plugin")(name)
        except Exception as err:  # not registered, or the client is going away
            log.debug("unregistering the %s plugin: %s", kind, err)


def detach(client=None):
    """Undo attach: every worker unmaps the region and stops clamor's
    threads (after its running tasks end), and this process stops serving
    pages.  Region arrays stay in the driver."""
    with _lock:
        if not _current or (client is not None and client is not _current["client"]):
            raise errors.ConfigError("this process is not attached to that Dask client")
        client, driver = _current["client"], _current["driver"]
        _current.clear()
    driver.unpark()
    if client.status == "running":
        _unregister(client)
    driver.stop()


def _detach_closed(driver):
    """The keeper found the client closed: detach without it (workers learn
    it from the control endpoint, which answers BYE for a while)."""
    with _lock:
        if _current.get("driver") is not driver:
            return
        _current.clear()
    driver.stop(grace=15.0)


def ref(obj):
    """A reference to ``obj``, a Python object built under clamor.heap(),
    for Dask's tasks: it travels as an offset and a version, and
    ``.get()`` in a task returns the object itself, used in place on the
    worker (its pages relocated against the worker's own address space as
    they arrive).  Region arrays need no ref: they travel by reference as
    they are.  NotShareable, naming the path, if the workers cannot use
    ``obj`` in place (clamor.share(obj, portable=True) says the same);
    ConfigError if this process is not attached."""
    import numpy as np
    driver = _current.get("driver")
    if driver is None:
        raise errors.ConfigError("clamor.dask.ref needs an attached client: call clamor.dask.attach(client) first")
    if isinstance(obj, np.ndarray):
        raise TypeError("a region array travels by reference as it is: pass the array itself, not a ref")
    offset, version = driver.ship(obj)     # (walks it now: a refusal comes here, not inside Dask)
    return GlobalObject(offset, version, obj)


def attached():
    """The client this process is attached to, or None."""
    return _current.get("client")


def secret(client=None):
    """The secret of the attachment: what CLAMOR_SECRET must hold on workers
    the driver cannot hand it to (see attach)."""
    if not _current or (client is not None and client is not _current["client"]):
        raise errors.ConfigError("this process is not attached to that Dask client")
    return _current["secret"]


def stats():
    """The driver's figures: the region's counters (clamor.stats()), the
    newest ``version`` and ``versions_kept``, where it listens
    (``control``, ``pages``), and ``by_value``: the region objects passed
    to Dask as they are, which travelled by value, and their bytes."""
    from ..memory import byvalue, region
    if not _current:
        raise errors.ConfigError("this process is not attached to a Dask client")
    out = region.stats()
    out["versions_kept"] = _current["driver"].versions_kept
    out["version"] = _current["driver"].version
    out["control"], out["pages"] = _current["driver"].endpoint, _current["driver"].pages
    out["by_value"] = byvalue.counts()
    return out


add_region_user(_busy)
