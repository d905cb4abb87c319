"""clamor/testing/nethosts.py: hosts made of network namespaces, with rate-limited
links, that the multi-host tests and benchmarks run on.  Real namespaces,
processes and sockets; every test first calls require_hosts()."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from clamor.testing import _netns
from clamor.testing.nethosts import Hosts, available, measure_tcp, require_hosts
from helpers import PRELUDE, ROOT, STDLIB


# An echo server: binds argv[1], prints its port, echoes each connection
# to its end, forever.
ECHO = STDLIB + r"""
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
"""

# A client: sends argv[3] to argv[1]:argv[2], prints what comes back;
# argv[4], if given, is the timeout in seconds.
CLIENT = STDLIB + r"""
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float((sys.argv[4:] or [5])[0]))
c.sendall(sys.argv[3].encode())
c.shutdown(socket.SHUT_WR)
out = b""
while True:
    b = c.recv(65536)
    if not b:
        break
    out += b
print(out.decode())
"""


def py(code, *args):
    return [sys.executable, "-I", "-S", "-c", code, *map(str, args)]


def echo_on(host):
    """Start an echo server on ``host``; returns its port."""
    p = host.popen(py(ECHO, host.addr), stdout=subprocess.PIPE, text=True)
    return int(p.stdout.readline())


def echo_from_root(addr, port, msg, timeout=5.0):
    with socket.create_connection((addr, port), timeout=timeout) as c:
        c.sendall(msg)
        c.shutdown(socket.SHUT_WR)
        out = b""
        while b := c.recv(65536):
            out += b
    return out


def netns_list():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def link_names():
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"] for link in json.loads(out)}


def gone(pid):
    """The process has exited (a zombie waiting for init counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if not gone(p)]


def assert_removed(names, links):
    assert not [n for n in names if n in netns_list()], netns_list()
    assert not set(links) & link_names()


def test_hosts_reach_each_other_and_the_root_over_tcp():
    require_hosts()
    with Hosts(2) as h:
        assert len(h) == 2 and h[0].addr != h[1].addr != h.root_addr
        net = h.root_addr.rsplit(".", 1)[0]
        assert h[0].addr.startswith(net + ".") and h[1].addr.startswith(net + ".")
        assert h[0].name in netns_list() and h[1].name in netns_list()
        # each host sees its own address (and loopback, up), not the other's
        addrs = h[0].run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        assert h[0].addr in addrs and h[1].addr not in addrs and "127.0.0.1" in addrs
        lo = h[0].run(["ip", "-o", "link", "show", "lo"], capture_output=True, text=True, check=True).stdout
        assert "UP" in lo.split(">")[0]

        port0 = echo_on(h[0])
        # host 1 -> host 0
        out = h[1].run(py(CLIENT, h[0].addr, port0, "one to zero"), capture_output=True, text=True,
                       timeout=20, check=True).stdout
        assert out.strip() == "one to zero"
        # root -> host 0
        assert echo_from_root(h[0].addr, port0, b"root to zero" * 1000) == b"root to zero" * 1000
        # host 1 -> root: a server in this process, on the root's address
        srv = socket.create_server((h.root_addr, 0))
        seen = []

        def serve():
            c, peer = srv.accept()
            seen.append(peer[0])
            with c:
                while b := c.recv(65536):
                    c.sendall(b)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        out = h[1].run(py(CLIENT, h.root_addr, srv.getsockname()[1], "one to root"), capture_output=True,
                       text=True, timeout=20, check=True).stdout
        t.join(5)
        srv.close()
        assert out.strip() == "one to root" and seen == [h[1].addr]
        # the environment reaches a host's processes
        env = {**os.environ, "NETHOSTS_PROBE": "xyz"}
        out = h[0].run([sys.executable, "-c", "import os; print(os.environ['NETHOSTS_PROBE'])"], env=env,
                       capture_output=True, text=True, check=True).stdout
        assert out.strip() == "xyz"


def test_rate_limit_holds_both_ways():
    require_hosts()
    want = 100e6 / 8
    with Hosts(2, rate="100mbit") as h:
        got = {(s, d): measure_tcp(h, s, d, seconds=1.0) for s, d in (("root", 0), (0, "root"), (1, 0))}
    for pair, r in got.items():
        assert 0.6 * want <= r <= 1.1 * want, (pair, r * 8 / 1e6, "Mbit/s")


def test_faster_link_is_faster():
    require_hosts()
    with Hosts(2, rate="100mbit") as h:
        h.set_rate(1, "1gbit")
        slow = measure_tcp(h, "root", 0, seconds=1.0)
        fast = measure_tcp(h, 1, "root", seconds=1.0)
    assert fast > 3 * slow, (slow * 8 / 1e6, fast * 8 / 1e6)
    assert fast <= 1.1 * 1e9 / 8, fast * 8 / 1e6


def test_delete_makes_a_host_vanish():
    require_hosts()
    with Hosts(2) as h:
        port0, port1 = echo_on(h[0]), echo_on(h[1])
        assert echo_from_root(h[0].addr, port0, b"hi") == b"hi"
        # a process with a child of its own, and one outside the tracked session
        sh = h[0].popen(["sh", "-c", "sleep 600 & sleep 600"])
        other = h[0].popen(["sleep", "600"], start_new_session=False)
        deadline = time.monotonic() + 5
        while len(h[0].pids()) < 5 and time.monotonic() < deadline:   # echo, sh, 2 sleeps, sleep
            time.sleep(0.02)
        inside = h[0].pids()
        assert sh.pid in inside and other.pid in inside and len(inside) >= 5
        name, veth = h[0].name, h[0].veth

        h[0].delete()

        assert sh.poll() == -signal.SIGKILL and other.poll() == -signal.SIGKILL
        assert not wait_gone(inside)
        assert_removed([name], [veth])
        with pytest.raises(OSError):
            echo_from_root(h[0].addr, port0, b"hi", timeout=1.0)
        with pytest.raises(RuntimeError):
            h[0].popen(["true"])
        h[0].delete()                     # again: nothing to do
        # the other host carries on
        assert echo_from_root(h[1].addr, port1, b"still here") == b"still here"
        r = h[1].run(py(CLIENT, h[0].addr, port0, "x", 1.0), capture_output=True, timeout=20)
        assert r.returncode != 0


def test_teardown_after_an_exception_leaves_nothing():
    require_hosts()
    with pytest.raises(ZeroDivisionError):
        with Hosts(2, rate="100mbit") as h:
            names = [x.name for x in h]
            links = [x.veth for x in h] + [h.bridge]
            procs = [h[0].popen(["sleep", "600"]), h[1].popen(["sh", "-c", "sleep 600 & wait"]),
                     h.root.popen(["sleep", "600"])]
            assert all(n in netns_list() for n in names) and set(links) <= link_names()
            1 / 0
    assert h.closed
    assert all(p.returncode == -signal.SIGKILL for p in procs)
    assert_removed(names, links)
    h.close()                             # a second teardown does nothing
    assert_removed(names, links)
    with pytest.raises(RuntimeError):
        h.root.popen(["true"])


def test_two_hosts_objects_coexist():
    require_hosts()
    with Hosts(1) as a, Hosts(2) as b:
        assert a.root_addr.rsplit(".", 1)[0] != b.root_addr.rsplit(".", 1)[0]
        assert a.bridge != b.bridge and a[0].name != b[0].name and a[0].veth != b[0].veth
        pa, pb = echo_on(a[0]), echo_on(b[1])
        a_names, a_links = [a[0].name], [a[0].veth, a.bridge]
        a.close()
        assert_removed(a_names, a_links)
        assert echo_from_root(b[1].addr, pb, b"b lives") == b"b lives"
        with pytest.raises(OSError):
            echo_from_root(a[0].addr, pa, b"a is gone", timeout=1.0)
    # an explicit prefix, and one in use is refused
    with Hosts(1, prefix="10.77.250") as c:
        assert c.root_addr == "10.77.250.254" and c[0].addr == "10.77.250.1"
        with pytest.raises(RuntimeError, match="in use"):
            Hosts(1, prefix="10.77.250.0/24")


# A driver in a process of its own: makes hosts, starts a process on one,
# reports, then ends as told: by returning (atexit), or waiting for a signal.
# Before that a forked child exits normally: its atexit must not tear its
# parent's hosts down.
DRIVER = PRELUDE + r"""
from clamor.testing import _netns, nethosts
h = nethosts.Hosts(2)
p = h[0].popen(["sleep", "600"])
child = os.fork()
if child == 0:
    sys.exit(0)
os.waitpid(child, 0)
alive = all(x.name in _netns._netns_names() for x in h)
print(json.dumps({"names": [x.name for x in h], "links": [x.veth for x in h] + [h.bridge],
                  "pid": p.pid, "after_fork": alive}), flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
"""


@pytest.mark.parametrize("end", ["exit", "sigterm", "sigkill"])
def test_teardown_when_the_driver_ends(end):
    require_hosts()
    d = subprocess.Popen([sys.executable, "-c", DRIVER, "exit" if end == "exit" else "wait"], stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    try:
        info = json.loads(d.stdout.readline())
        assert info["after_fork"]
        if end == "sigterm":
            d.send_signal(signal.SIGTERM)
            d.wait(30)
        elif end == "sigkill":
            # left behind, until the next start cleans up after the dead owner
            # (the lock keeps a test run beside this one from cleaning first)
            with _netns._machine_lock():
                d.send_signal(signal.SIGKILL)
                d.wait(30)
                assert all(n in netns_list() for n in info["names"]) and not gone(info["pid"])
            with Hosts(1):
                pass
        d.wait(30)
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
        d.stdout.close()
    assert d.returncode == {"exit": 0, "sigterm": -signal.SIGTERM, "sigkill": -signal.SIGKILL}[end]
    assert not wait_gone([info["pid"]])
    assert_removed(info["names"], info["links"])


def test_require_hosts_skips_or_fails_without_namespaces():
    require_hosts()
    assert available() == (True, "")
    code = PRELUDE + textwrap.dedent("""
        import pytest
        from clamor.testing import nethosts
        print(nethosts.available())
        try:
            nethosts.require_hosts()
        except pytest.skip.Exception:
            print("skip")
        except pytest.fail.Exception:
            print("fail")
    """)
    outs = {}
    for flag in ("", "1"):
        env = {**os.environ, "CLAMOR_REQUIRE_NETNS": flag}
        # a new user namespace, in which this process is not root and cannot make network namespaces
        # (a fresh process, by unshare(1): not a fork of this one)
        r = subprocess.run(["unshare", "--user", sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=60, cwd=ROOT)
        assert r.returncode == 0, (r.returncode, r.stderr)
        outs[flag] = r.stdout
    assert outs[""].split()[-1] == "skip" and outs["1"].split()[-1] == "fail"
    assert "need root" in outs[""]
