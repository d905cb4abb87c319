"""The driver core: what every driver of this process's region does, a
Cluster (clamor/runtime/cluster.py) and clamor.dask's alike.

- joining: the JOIN a worker sends, the WELCOME it gets, the LEAVE it
  may send (``read_join``, ``welcome``, ``read_leave``; one schema,
  docs/wire.md#joining);
- who may drive the region now (``add_region_user``, ``refuse_if_in_use``):
  one driver at a time, since page versions and the page directory belong
  to the process's region;
- the replication policy of the page server (``REPLICATION``);
- version keeping (clamor/runtime/versions.py) and liveness
  (clamor/runtime/liveness.py) have modules of their own.
"""
import json
import os

from .. import errors
from ..memory import images, portable, region
from .liveness import pid_namespace

# Redirect a page request to a worker that holds the page (paper section 4.2):
# never, to a random holder, or to the less loaded of two random holders.
REPLICATION = {"off": 0, "random": 1, "two-choices": 2}

# Users of the process's region (a Cluster, clamor.dask) register a callable
# that returns why another driver cannot start now, or None.
_region_users = []


def add_region_user(why_not):
    """Register ``why_not()``: why the region is taken (a str), or None."""
    _region_users.append(why_not)


def refuse_if_in_use(skip=None):
    """RegionInUse, saying why, if a registered user holds the region
    (``skip``: the caller's own callable, asked separately)."""
    for why_not in _region_users:
        if why_not is skip:
            continue
        why = why_not()
        if why:
            raise errors.RegionInUse(why)


def check_replication(policy):
    """ConfigError unless ``policy`` is one of REPLICATION's."""
    if policy not in REPLICATION:
        raise errors.ConfigError(f"replication must be one of {sorted(REPLICATION)}, not {policy!r}")


def set_replication(policy):
    """The page server redirects requests for hot pages by ``policy``."""
    region.set_replication(REPLICATION[policy])


# -- joining (docs/wire.md#joining) --------------------------------------------------------
def read_join(frame):
    """The body of a JOIN: {"pid", "pidns", "hash", "base"}.  ValueError,
    TypeError or KeyError if it is malformed."""
    body = json.loads(frame)
    return {"pid": int(body["pid"]), "pidns": body.get("pidns"), "hash": body.get("hash"), "base": body.get("base")}


def heartbeat_interval(timeout):
    """Seconds between a worker's heartbeats for a driver that loses a
    worker silent ``timeout`` seconds: a quarter of it, at most 1 s (a
    driver with a time-out under 1 s lost idle workers that beat once a
    second)."""
    return min(1.0, max(0.01, float(timeout) / 4))


def welcome(pages, wid=None, version=None, same_host=None, heartbeat=None):
    """The WELCOME that answers a JOIN, as bytes: where this driver serves
    its pages (``pages``), who it is (pid, PID namespace, str hash digest,
    images, region base), the worker's id ``wid`` (None where the
    connection names it), the ``version`` its first tasks read at (None:
    each task names its own) and ``same_host`` (what a worker on this host
    needs to map the driver's pages, or None) and ``heartbeat``, the seconds
    between the worker's heartbeats (None: 1 s)."""
    return json.dumps({"wid": wid, "pages": pages, "pid": os.getpid(), "pidns": pid_namespace(),
                       "hash": portable.hash_digest(), "images": images.loaded(), "base": region.base(),
                       "map": same_host, "version": version, "heartbeat": heartbeat}).encode()


def read_leave(frame):
    """The body of a LEAVE: {"wid", "reason", "pages"}.  ValueError,
    TypeError or KeyError if it is malformed."""
    body = json.loads(frame)
    if not isinstance(body, dict):
        raise TypeError("a LEAVE is a JSON object")
    wid, pages = body.get("wid"), body.get("pages")
    if wid is not None and not isinstance(wid, str) or pages is not None and not isinstance(pages, str):
        raise TypeError("a LEAVE's wid and pages are strings or null")
    return {"wid": wid, "reason": str(body.get("reason"))[:2000], "pages": pages}
