"""Hosts made of Linux network namespaces, for clamor's tests and benchmarks.

``Hosts(n)`` makes ``n`` hosts on one private /24 (``10.77.X.0/24`` by
default)::

    root namespace                          namespace clamor-nh-...-h0
      bridge cnhXbr  10.77.X.254  --- veth cnhXv0 === eth0  10.77.X.1
                                  --- veth cnhXv1 === eth0  10.77.X.2   (namespace ...-h1)
                                  ...

Each host is a network namespace with loopback up and one veth pair: the
namespace's end is ``eth0`` and holds the host's address, the other end is
a port of a bridge in the root namespace.  The bridge holds an address too
(``hosts.root_addr``), so a process in the root namespace, the driver by
default, is a host on the same network.  ``rate`` ("1gbit", "100mbit")
puts a ``tc tbf`` qdisc on both ends of every veth, so a host's link is
limited in both directions; traffic between two namespace hosts passes
both links and gets the lower rate.  The root's own address has no link of
its own: between the root and host i only host i's link counts.

Processes run on a host through ``ip netns exec`` (``hosts[i].popen``,
``hosts[i].run``; ``hosts.root.popen`` for the root namespace); each is
started in a session of its own and tracked.  ``hosts[i].delete()`` kills
the host's processes and removes its namespace and veth: a host that
vanishes mid-job.

Teardown happens on ``__exit__`` (after an exception too), through
``atexit``, and on SIGTERM when the process had the default SIGTERM action
(or a Python handler, which is called after): every process started on a
host is killed and waited for, so is anything else left in a host's
namespace, then the namespaces, veths and bridge go, and the names in
/dev/shm that only the killed processes held (multiprocessing's, whose
resource tracker was killed with them: clamor/testing/leftovers.py).  Teardown runs only in
the process that made the hosts (a forked child inherits the objects, the
``atexit`` hook and the handler, and must not tear its parent's hosts
down), and a second teardown does nothing.  A run killed outright
(SIGKILL) leaves its namespaces behind; they carry the owner's pid and
start time in their names, bridges and veths in their alias, and the next
``Hosts`` (or ``cleanup_stale()``) removes what belongs to a process that
is gone.

``available()`` says whether this machine can do it (root, ``ip netns``, a
namespace, a veth and a bridge can be made); ``require_hosts()`` skips a
pytest test when it cannot, or fails it when ``CLAMOR_REQUIRE_NETNS=1`` (as
CI sets).  ``measure_tcp(hosts, src, dst)`` measures one TCP connection's
throughput between two hosts, with a Python sender and receiver.

The pieces under the hosts sit beside this module, and their public names
are importable from here too: ``_netns.py`` runs ``ip`` and ``tc`` and
handles namespaces and links by name (owners, the machine-wide lock,
``cleanup_stale``, ``available``, ``require_hosts``), ``_rate.py`` reads
rates, makes the tbf qdisc's parameters and measures throughput
(``parse_rate``, ``tbf_args``, ``measure_tcp``).

This module does not import pytest at module level: benchmarks import it
too.
"""
import atexit
import contextlib
import ipaddress
import itertools
import json
import os
import signal
import subprocess
import threading

from clamor.testing import leftovers
from clamor.testing._netns import (ALIAS_PREFIX, IP, LINK_PREFIX, NS_PREFIX, _del_link, _del_netns, _ip, _kill_netns,
                                   _link_exists, _machine_lock, _netns_names, _netns_pids, _owner, _tc, cleanup_stale)
# (the names this module's users import from it)
from clamor.testing._netns import TC, available, require_hosts  # noqa: F401
from clamor.testing._rate import parse_rate, tbf_args
from clamor.testing._rate import BURST_SECONDS, MIN_BURST, TBF_LATENCY, measure_tcp  # noqa: F401

DEFAULT_NET = "10.77"             # default subnets: 10.77.X.0/24, X in 1..253
MAX_HOSTS = 253                   # host i is .i+1, the root .254

_COUNTER = itertools.count()
_LIVE = set()                     # Hosts not yet torn down, in this process
_LIVE_LOCK = threading.RLock()


# --- hosts

class Host:
    """One host: a network namespace (``name``) with one address (``addr``)."""

    def __init__(self, hosts, index, name, addr, veth):
        self.hosts = hosts
        self.index = index
        self.name = name          # namespace; None for the root namespace
        self.addr = addr
        self.veth = veth          # root-side end of the host's veth pair
        self.rate = None
        self.deleted = False
        self._procs = []
        self._lock = threading.RLock()

    def __repr__(self):
        return f"<Host {self.index} {self.name} {self.addr}{' deleted' if self.deleted else ''}>"

    def _wrap(self, argv, shell):
        if isinstance(argv, (str, bytes, os.PathLike)):
            argv = [argv]
        argv = list(argv)
        if shell:
            argv = ["/bin/sh", "-c", *argv]
        return [IP, "netns", "exec", self.name, *argv]

    def popen(self, argv, **kw):
        """subprocess.Popen of ``argv`` on this host (the environment is passed
        through).  The process starts in a session of its own unless
        ``start_new_session=False`` is given; it is killed at teardown."""
        shell = kw.pop("shell", False)
        kw.setdefault("start_new_session", True)
        with self._lock:
            if self.deleted:
                raise RuntimeError(f"{self!r} is deleted")
            if self.hosts.closed:
                raise RuntimeError("the hosts are torn down")
            p = subprocess.Popen(self._wrap(argv, shell), **kw)
            p.own_session = bool(kw["start_new_session"])
            self._procs.append(p)
        return p

    def run(self, argv, input=None, capture_output=False, timeout=None, check=False, **kw):
        """subprocess.run of ``argv`` on this host; on a timeout or an error
        the process (and its session) is killed."""
        if capture_output:
            kw["stdout"] = kw["stderr"] = subprocess.PIPE
        if input is not None:
            kw["stdin"] = subprocess.PIPE
        with self.popen(argv, **kw) as p:
            try:
                out, err = p.communicate(input, timeout=timeout)
            except BaseException:
                self._kill(p)
                p.wait()
                raise
        if check and p.returncode:
            raise subprocess.CalledProcessError(p.returncode, p.args, out, err)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    @property
    def procs(self):
        """The processes started on this host."""
        return list(self._procs)

    def pids(self):
        """Every pid in this host's namespace."""
        return _netns_pids(self.name) if not self.deleted else []

    @staticmethod
    def _kill(p):
        if p.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if p.own_session:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                os.kill(p.pid, signal.SIGKILL)

    def kill_all(self):
        """Kill every process started on this host and anything else in its
        namespace; wait for the ones started here.  The names in /dev/shm
        that only they held go too (see _kill_netns)."""
        with self._lock:
            procs = list(self._procs)
        victims = set()
        for p in procs:
            if p.returncode is None:
                victims.update(leftovers.group_pids(p.pid) if p.own_session else [p.pid])
        held = leftovers.held_shm(victims)
        for p in procs:
            self._kill(p)
        if self.name is not None and self.name in _netns_names():
            _kill_netns(self.name)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        leftovers.unlink_unheld(held)

    def set_rate(self, rate):
        """Limit this host's link to ``rate`` both ways (None: no limit)."""
        if self.name is None:
            raise ValueError("the root has no link of its own: set the rate of a namespace host")
        if rate is None:
            for argv in (["qdisc", "del", "dev", self.veth, "root"],
                         ["-n", self.name, "qdisc", "del", "dev", "eth0", "root"]):
                _tc(*argv, check=False)
        else:
            tbf = tbf_args(rate)
            _tc("qdisc", "replace", "dev", self.veth, "root", *tbf)
            _tc("-n", self.name, "qdisc", "replace", "dev", "eth0", "root", *tbf)
        self.rate = rate

    def delete(self):
        """The host vanishes: its processes are killed, its namespace and
        veth removed."""
        if self.name is None:
            raise ValueError("the root namespace cannot be deleted")
        with self._lock:
            if self.deleted:
                return
            self.deleted = True
        self.kill_all()
        _del_link(self.veth)
        _del_netns(self.name)


class RootHost(Host):
    """The root namespace as a host: its address is on the bridge."""

    def _wrap(self, argv, shell):
        if isinstance(argv, (str, bytes, os.PathLike)):
            argv = [argv]
        argv = list(argv)
        return ["/bin/sh", "-c", *argv] if shell else argv

    def pids(self):
        return [p.pid for p in self._procs if p.poll() is None]


class Hosts:
    """``n`` hosts made of network namespaces on one bridge; see the module's
    docstring.  ``prefix`` is the /24 to use ("10.77.5" or "10.77.5.0/24");
    by default one free 10.77.X.0/24 is chosen.  Use as a context manager,
    or call ``close()``."""

    def __init__(self, n, rate=None, prefix=None):
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be in 1..{MAX_HOSTS}")
        if IP is None:
            raise RuntimeError("no ip command")
        if rate is not None:
            parse_rate(rate)
        self._pid = os.getpid()
        self._state = "open"
        self._state_lock = threading.RLock()
        self._hosts = []
        self._hosts_partial = None
        self.bridge = None
        self.root = None
        k = next(_COUNTER)
        _install_sigterm()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            cleanup_stale()
            with _machine_lock():
                names = set(_netns_names())
                while any(f"{NS_PREFIX}{_owner()}-{k}-h{i}" in names for i in range(n)):
                    k = next(_COUNTER)
                self.counter = k
                self.net = self._choose_net(prefix, k)
                tag = self.net.network_address.packed[2]
                while _link_exists(f"{LINK_PREFIX}{tag}br"):     # a prefix given: its X may be taken
                    tag += 256
                self.prefix = str(self.net.network_address).rsplit(".", 1)[0]
                self.root_addr = f"{self.prefix}.254"
                self.bridge = f"{LINK_PREFIX}{tag}br"
                self._make_bridge()
                self.root = RootHost(self, "root", None, self.root_addr, None)
                for i in range(n):
                    self._hosts.append(self._make_host(i, k, tag))
            if rate is not None:
                for h in self._hosts:
                    h.set_rate(rate)
        except BaseException:
            with contextlib.suppress(Exception):      # the error that stopped us matters more
                self.close()
            raise

    # -- making

    @staticmethod
    def _used_nets():
        used = []
        for fam_args in (("-j", "-4", "addr", "show"), ("-j", "-4", "route", "show", "table", "all")):
            p = _ip(*fam_args, check=False)
            if p.returncode != 0 or not p.stdout.strip():
                continue
            for item in json.loads(p.stdout):
                if "addr_info" in item:
                    for a in item["addr_info"]:
                        if a.get("family") == "inet":
                            used.append(ipaddress.ip_network(f"{a['local']}/32"))
                else:
                    dst = item.get("dst", "")
                    if dst and dst != "default":
                        with contextlib.suppress(ValueError):
                            net = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
                            if net.prefixlen >= 16:    # a wide route does not clash with a /24 inside it
                                used.append(net)
        return used

    def _choose_net(self, prefix, k):
        used = self._used_nets()
        if prefix is not None:
            text = str(prefix).split("/")[0]
            parts = text.split(".")
            net = ipaddress.ip_network(".".join((parts + ["0"] * 4)[:3] + ["0"]) + "/24")
            if any(net.overlaps(u) for u in used):
                raise RuntimeError(f"{net} is in use in the root namespace")
            return net
        start = (os.getpid() * 37 + k * 101) % 253
        for j in range(253):
            x = (start + j) % 253 + 1
            net = ipaddress.ip_network(f"{DEFAULT_NET}.{x}.0/24")
            if not any(net.overlaps(u) for u in used) and not _link_exists(f"{LINK_PREFIX}{x}br"):
                return net
        raise RuntimeError(f"no free {DEFAULT_NET}.X.0/24")

    def _make_bridge(self):
        _ip("link", "add", "name", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _ip("link", "set", "dev", self.bridge, "alias", ALIAS_PREFIX + _owner())
        _ip("addr", "add", f"{self.root_addr}/24", "dev", self.bridge)
        _ip("link", "set", "dev", self.bridge, "up")

    def _make_host(self, i, k, tag):
        name = f"{NS_PREFIX}{_owner()}-{k}-h{i}"
        veth = f"{LINK_PREFIX}{tag}v{i}"
        host = Host(self, i, name, f"{self.prefix}.{i + 1}", veth)
        host.deleted = True               # until it is whole: teardown removes what exists by name
        self._hosts_partial = host
        _ip("netns", "add", name)
        _ip("link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        _ip("link", "set", "dev", veth, "alias", ALIAS_PREFIX + _owner())
        _ip("link", "set", "dev", veth, "master", self.bridge)
        _ip("link", "set", "dev", veth, "up")
        _ip("-n", name, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        _ip("-n", name, "link", "set", "dev", "eth0", "up")
        _ip("-n", name, "link", "set", "dev", "lo", "up")
        host.deleted = False
        self._hosts_partial = None
        return host

    # -- access

    def __len__(self):
        return len(self._hosts)

    def __iter__(self):
        return iter(self._hosts)

    def __getitem__(self, i):
        return self._hosts[i]

    def host(self, which):
        """A host by index, "root", or the Host itself."""
        if isinstance(which, Host):
            return which
        if which == "root":
            return self.root
        return self._hosts[which]

    def set_rate(self, i, rate):
        """Limit host ``i``'s link to ``rate`` both ways (None: no limit)."""
        self.host(i).set_rate(rate)

    @property
    def closed(self):
        return self._state != "open"

    def __repr__(self):
        return f"<Hosts {self.prefix if hasattr(self, 'prefix') else '?'}.0/24 n={len(self._hosts)} {self._state}>"

    # -- teardown

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Tear everything down (a second call does nothing; nor does a call
        from a process other than the one that made the hosts)."""
        with self._state_lock:
            if self._state != "open" or os.getpid() != self._pid:
                return
            self._state = "closing"
        self._teardown()

    def _teardown(self):
        """Kill, then delete.  Every step tolerates what is already gone, so
        the SIGTERM handler may run it again over a teardown it interrupted."""
        if os.getpid() != self._pid or self._state == "closed":
            return
        self._state = "closing"
        errors = []
        hosts = list(self._hosts)
        if self._hosts_partial is not None:
            hosts.append(self._hosts_partial)
        for h in hosts:
            try:
                h.kill_all()
            except Exception as e:  # noqa: BLE001 - go on removing the rest
                errors.append(e)
            h.deleted = True
            for step in (lambda: _del_link(h.veth), lambda: _del_netns(h.name)):
                try:
                    step()
                except Exception as e:  # noqa: BLE001
                    errors.append(e)
        if self.root is not None:
            try:
                self.root.kill_all()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if self.bridge is not None:
            try:
                _del_link(self.bridge)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        left = [h.name for h in hosts if h.name in _netns_names()]
        for name in left:                 # one more try before giving up
            with contextlib.suppress(Exception):
                _del_netns(name)
        left = [h.name for h in hosts if h.name in _netns_names()]
        self._state = "closed"
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if left or errors:
            raise RuntimeError(f"teardown of {self!r}: namespaces left {left}; errors {errors}")


def _teardown_all():
    with _LIVE_LOCK:
        live = [h for h in _LIVE if h._pid == os.getpid()]
    for h in live:
        with contextlib.suppress(Exception):
            h._teardown()


atexit.register(_teardown_all)

_PREV_SIGTERM = None


def _on_sigterm(signum, frame):
    _teardown_all()                       # only this process's own hosts
    if callable(_PREV_SIGTERM):
        _PREV_SIGTERM(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm():
    """Tear down on SIGTERM too, when that is this process's to decide: the
    main thread, and SIGTERM not ignored.  A Python handler already there is
    called after the teardown; the default action is taken again after it."""
    global _PREV_SIGTERM
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return
    if current is not signal.SIG_DFL and not callable(current):
        return                            # SIG_IGN, or a handler not set from Python
    _PREV_SIGTERM = current if callable(current) else None
    signal.signal(signal.SIGTERM, _on_sigterm)

