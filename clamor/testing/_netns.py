"""Network namespaces and links by name, through iproute2: running ``ip``
and ``tc``, the owner a name carries (a pid and its start time), the
machine-wide lock, killing what is in a namespace, removing what a dead
owner left (``cleanup_stale``), and whether this machine can make them at
all (``available``, ``require_hosts``).  clamor/testing/nethosts.py builds
its hosts from these; nothing here knows a host.
"""
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from clamor.testing import leftovers

NS_PREFIX = "clamor-nh-"          # namespaces: clamor-nh-PID-START-K-hI
LINK_PREFIX = "cnh"               # root-side links: cnhXbr (bridge), cnhXvI (veths), cnhPIDp* (probe)
ALIAS_PREFIX = "clamor-nethosts owner="

_NS_RE = re.compile(re.escape(NS_PREFIX) + r"(\d+)-(\d+)-")
_LINK_RE = re.compile(re.escape(LINK_PREFIX) + r"\d+(br|v\d+|p|pb)$")


def _tool(name):
    for path in (shutil.which(name), f"/usr/sbin/{name}", f"/sbin/{name}", f"/usr/bin/{name}"):
        if path and os.access(path, os.X_OK):
            return path
    return None


IP = _tool("ip")
TC = _tool("tc")


def _cmd(argv, check=True):
    """Run one ip/tc command; returns the CompletedProcess (text).  With
    ``check``, a failure raises RuntimeError carrying the command's stderr."""
    p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def _ip(*args, check=True):
    return _cmd([IP, *args], check=check)


def _tc(*args, check=True):
    return _cmd([TC, *args], check=check)


# --- owners: a pid and its start time, so a reused pid is not taken for the owner

def _start_time(pid):
    """The process's start time in clock ticks since boot, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _owner_alive(pid, start):
    return _start_time(pid) == start


_OWNER = None


def _owner():
    """'PID-START' of this process (looked up again after a fork)."""
    global _OWNER
    if _OWNER is None or _OWNER[0] != os.getpid():
        pid = os.getpid()
        _OWNER = (pid, f"{pid}-{_start_time(pid)}")
    return _OWNER[1]


@contextlib.contextmanager
def _machine_lock():
    """Serialise cleanup, subnet choice and creation between processes."""
    for d in ("/run", "/tmp"):
        try:
            fd = os.open(os.path.join(d, "clamor-nethosts.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            break
        except OSError:
            continue
    else:
        raise RuntimeError("no place for the lock file (/run, /tmp)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _netns_names():
    p = _ip("netns", "list", check=False)
    if p.returncode != 0:
        return []
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _netns_pids(name):
    p = _ip("netns", "pids", name, check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()] if p.returncode == 0 else []


def _kill_netns(name, timeout=10.0):
    """SIGKILL everything in namespace ``name`` until nothing is left there;
    then remove the names in /dev/shm that only those processes held
    (clamor/testing/leftovers.py: the resource trackers that would have are killed
    too)."""
    deadline = time.monotonic() + timeout
    held = set()
    while True:
        pids = [p for p in _netns_pids(name) if p != os.getpid()]
        if not pids:
            leftovers.unlink_unheld(held)
            return
        held |= leftovers.held_shm(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {name} do not die")
        time.sleep(0.02)


def _links():
    p = _ip("-j", "link", "show", check=False)
    if p.returncode != 0 or not p.stdout.strip():
        return []
    return json.loads(p.stdout)


def _link_exists(name):
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def _del_link(name):
    p = _ip("link", "del", "dev", name, check=False)
    if p.returncode != 0 and _link_exists(name):
        raise RuntimeError(f"ip link del {name}: {p.stderr.strip()}")


def _del_netns(name):
    _kill_netns(name)
    p = _ip("netns", "del", name, check=False)
    if p.returncode != 0 and name in _netns_names():
        raise RuntimeError(f"ip netns del {name}: {p.stderr.strip()}")


def cleanup_stale():
    """Remove the namespaces, bridges and veths of this helper whose owner
    process is gone (a run killed outright).  Returns what it removed."""
    removed = []
    with _machine_lock():
        for name in _netns_names():
            m = _NS_RE.match(name)
            if m and not _owner_alive(int(m[1]), int(m[2])):
                _del_netns(name)
                removed.append(name)
        for link in _links():
            name = link.get("ifname", "")
            if not _LINK_RE.match(name):
                continue
            alias = link.get("ifalias", "")
            m = re.fullmatch(re.escape(ALIAS_PREFIX) + r"(\d+)-(\d+)", alias)
            # links are named and given their alias under the lock: one
            # without an alias was left half made
            if not m or not _owner_alive(int(m[1]), int(m[2])):
                _del_link(name)
                removed.append(name)
    return removed



# --- availability

_AVAILABLE = None


def available():
    """(True, "") when this process can make hosts: root, a working
    ``ip netns``, and the kernel lets it make a namespace, a veth pair into
    it and a bridge; otherwise (False, the reason).  Cached."""
    global _AVAILABLE
    if _AVAILABLE is not None and _AVAILABLE[0] == os.getpid():
        return _AVAILABLE[1]
    result = _probe()
    _AVAILABLE = (os.getpid(), result)
    return result


def _probe():
    if sys.platform != "linux":
        return False, f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if IP is None:
        return False, "no ip command (iproute2)"
    p = _ip("netns", "list", check=False)
    if p.returncode != 0:
        return False, f"ip netns list fails: {p.stderr.strip()}"
    ns = f"{NS_PREFIX}{_owner()}-probe"
    veth = f"{LINK_PREFIX}{os.getpid()}p"
    bridge = f"{LINK_PREFIX}{os.getpid()}pb"
    try:
        with _machine_lock():
            try:
                _ip("netns", "add", ns)
                _ip("link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", "dev", veth, "alias", ALIAS_PREFIX + _owner())
                _ip("link", "add", "name", bridge, "type", "bridge")
                _ip("link", "set", "dev", bridge, "alias", ALIAS_PREFIX + _owner())
            finally:
                for name in (veth, bridge):
                    with contextlib.suppress(Exception):
                        _del_link(name)
                with contextlib.suppress(Exception):
                    _del_netns(ns)
    except Exception as e:  # noqa: BLE001
        return False, f"cannot make a namespace, veth and bridge: {e}"
    return True, ""


def require_hosts():
    """For a pytest test: skip it when hosts cannot be made here, or fail it
    when CLAMOR_REQUIRE_NETNS=1 (CI), so that it never passes unnoticed
    without running."""
    ok, reason = available()
    if ok:
        return
    import pytest
    if os.environ.get("CLAMOR_REQUIRE_NETNS") == "1":
        pytest.fail(f"CLAMOR_REQUIRE_NETNS=1 but network namespaces are not available: {reason}",
                    pytrace=False)
    pytest.skip(f"network namespaces not available: {reason}")
