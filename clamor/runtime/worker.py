"""The worker core, and a worker that joins a Cluster: ``clamor worker tcp://HOST:PORT``.

The same as ``python -m clamor.worker``; a Cluster with
``start_method="spawn"`` starts its local workers so.

The worker core is what every worker not forked from its driver does to
join, a Cluster's and a Dask worker (clamor/dask/_worker.py) alike: it
says JOIN (``join_body``), attaches the region by the WELCOME
(``attach``), says LEAVE if it will not stay (``leave_body``), and
watches the driver (``driver_check``).  The schema is written once, in
docs/wire.md#joining; the driver's side is clamor/runtime/driver.py.

A Cluster's worker joins at ENDPOINT on a connection of its own, attaches
the region (mapped at the driver's address unless ``--base`` says
otherwise, or the driver's pages mapped where they lie on its host:
clamor/memory/samehost.py), opens its control socket under the WELCOME's
``wid`` and says HELLO: from there on it speaks the same protocol as a
forked worker (clamor/runtime/executor.py, docs/wire.md).

Such a worker has the driver's pages but not the driver's process image,
so a Python object built under ``clamor.heap()`` cannot be used in place
here (its type pointers name the driver's memory): a task that reads one
fails with NotShareable.  Arrays in the region travel by reference and work.

The worker lives as long as the driver: a spawned one dies with it at once
(clamor/runtime/liveness.py), one started by hand exits once the driver's
process is gone (same PID namespace) or its connection is (elsewhere).
"""
import argparse
import gc
import json
import logging
import math
import os
import signal
import socket
import stat
import sys
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from .. import errors
from ..memory import region
from ..memory import images, portable, samehost
from . import security, serialize
from .liveness import adopt_driver_path, beat_interval, pid_alive, pid_namespace, shares_pids, watch_lifeline

log = logging.getLogger("clamor.worker")


def _connect_timeout(value):
    if value is None:
        raw = os.environ.get("CLAMOR_CONNECT_TIMEOUT", "30")
        try:
            value = float(raw)
        except ValueError:
            raise errors.ConfigError(f"CLAMOR_CONNECT_TIMEOUT must be a number of seconds, not {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise errors.ConfigError(f"the connect time-out must be a positive number of seconds, not {value!r}")
    return value


_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                     zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _connect(sock, driver):
    try:
        sock.connect(driver)
    except zmq.ZMQError as err:
        kind = errors.ConfigError if err.errno in (zmq.EINVAL, zmq.EPROTONOSUPPORT) else errors.TransportError
        raise kind(f"cannot connect to the driver at {driver!r}: {err}") from err


def _ask_to_join(ctx, driver, timeout, sec, base=None):
    """The driver's WELCOME, as a dict.  Until ``timeout`` the connection
    is retried (the driver may start after this worker); TransportError if
    it never answers, WorkerRefused if it says no or refuses this worker's
    secret."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sec.client(sock)
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        _connect(sock, driver)
        # (the hash seed and the region's address say whether this worker can
        # relocate the driver's region objects: clamor/memory/portable.py)
        # The JOIN is sent once the socket can take it, within the deadline:
        # a handshake that fails on the mechanism ends the connection for
        # good (libzmq does not reconnect), and a send to a DEALER left with
        # no connection would then block forever.
        pending = [b"JOIN", join_body(base)]
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN | zmq.POLLOUT)
        poller.register(mon, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        failed = 0
        while True:
            left = deadline - time.monotonic()
            ready = dict(poller.poll(max(0, int(left * 1000)))) if left > 0 else {}
            if pending is not None and ready.get(sock, 0) & zmq.POLLOUT:
                try:
                    sock.send_multipart(pending, zmq.NOBLOCK)
                except zmq.Again:       # (the connection went between the poll and the send)
                    continue
                pending = None
                poller.modify(sock, zmq.POLLIN)
                continue
            if ready.get(sock, 0) & zmq.POLLIN:
                frames = sock.recv_multipart()
                _check_images(sock, frames, driver)
                break
            if mon in ready:
                msg = recv_monitor_message(mon)
                if msg["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and \
                        msg["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    # (libzmq does not try again after this one)
                    raise errors.WorkerRefused(
                        f"the driver at {driver} does not speak this worker's security mechanism: "
                        + ("it encrypts (CURVE), and this worker was started with --no-encrypt" if not sec.encrypt
                           else "its cluster was made with encrypt=False: start this worker with --no-encrypt"))
                if msg["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    failed = 0
                elif msg["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    failed = 3     # (the driver's ZAP refused the credentials: libzmq does not try again)
                elif msg["event"] in _HANDSHAKE_FAILED:   # (not connects, retries and closes)
                    failed += 1
                if failed >= 3:    # (one failure may be a driver going down; three are not)
                    raise errors.WorkerRefused(
                        f"the driver at {driver} refused this worker's credentials: its secret differs from "
                        f"the cluster's (set CLAMOR_SECRET, or --secret-file, to the driver's cl.secret)"
                        # (a driver that closes at once on a mechanism mismatch reads, here, as a
                        # failed handshake with no detail: either cause may be the one)
                        + (", or the cluster was made with encrypt=False: start this worker with --no-encrypt"
                           if sec.encrypt else ", or the cluster encrypts and this worker was started with "
                                               "--no-encrypt"))
                continue
            if not ready:
                raise errors.TransportError(f"no answer from the driver at {driver} within {timeout:g} s")
    finally:
        sock.disable_monitor()
        mon.close()
        sock.close()
    try:
        kind, body = frames[0], json.loads(frames[1])
    except (IndexError, ValueError) as err:
        raise errors.ProtocolError(f"the driver at {driver} answered JOIN with a malformed message") from err
    if kind == b"REFUSED":
        raise errors.WorkerRefused(f"the driver at {driver} refused this worker: {body.get('reason')}")
    if kind != b"WELCOME" or not {"wid", "pages", "pid"} <= set(body):
        raise errors.ProtocolError(f"the driver at {driver} answered JOIN with {kind!r}")
    return body


def join_body(base=None):
    """A JOIN's body (docs/wire.md#joining): this process's pid, PID
    namespace and str hash digest, and the region base it was told to use
    (None: the driver's).  (The hash seed and the base say whether it can
    relocate the driver's region objects: clamor/memory/portable.py.)"""
    return json.dumps({"pid": os.getpid(), "pidns": pid_namespace(), "hash": portable.hash_digest(),
                       "base": base}).encode()


def leave_body(reason, wid=None, pages=None):
    """A LEAVE's body: this worker leaves (it will not join after all, or
    it detaches), and why; ``pages``: its page server, which the driver
    forgets."""
    return json.dumps({"wid": wid, "reason": reason, "pages": pages}).encode()


def attach(welcome, sec, serve_endpoint, base=None, fetch_reason=None):
    """The worker core's attaching, after a WELCOME: this process's
    pager and page server (at ``serve_endpoint``) take the cluster's keys,
    every page comes with its relocations, the region is mapped (at
    ``base``, default the driver's) with every page absent, and clamor's
    fault handler goes first.  A worker on the driver's host maps the
    driver's pages where they lie if the WELCOME says how; otherwise it
    fetches them (``fetch_reason``: why).  Returns its page server's
    endpoint."""
    sec.core()   # the pager and this worker's page server: before they open a socket
    portable.enable()   # every page fetched comes with its relocations
    served = region.connect(welcome["pages"], base=base, serve_endpoint=serve_endpoint)
    region.ensure_handler_first()
    if welcome.get("map"):
        if not samehost.attach(welcome["map"]):
            log.info("fetching the driver's pages: %s", samehost.status()["reason"])
    else:
        samehost.decline(fetch_reason)
    return served


def driver_check(welcome):
    """A callable that tells whether the driver that sent ``welcome`` is
    alive, by its pid, where this process can see it (the same PID
    namespace); else None: its connection tells (clamor/runtime/liveness.py)."""
    if not shares_pids(welcome.get("pidns")):
        return None
    pid = int(welcome["pid"])
    return lambda: pid_alive(pid)


def advertised_address(driver):
    """The address of this host that the driver's host reaches it by: the
    local end of the route to the driver (nothing is sent)."""
    host, _, port = driver[len("tcp://"):].rpartition(":") if driver.startswith("tcp://") else ("", "", "")
    host = host.strip("[]")
    if not host or host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, int(port) if port.isdigit() else 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError as err:
        raise errors.ConfigError(f"cannot tell this host's address towards {driver}: {err}; "
                                 f"give one with --advertise") from err


def _check_images(sock, frames, driver):
    """After a WELCOME: refuse to join (LEAVE, then WorkerRefused) if this
    worker's images differ from the driver's (clamor/memory/images.py)."""
    try:
        kind, body = frames[0], json.loads(frames[1])
    except (IndexError, ValueError):
        return                      # (the caller says what is wrong with it)
    if kind != b"WELCOME" or not isinstance(body.get("images"), dict):
        return
    bad = images.mismatches(body["images"])
    if not bad:
        return
    reason = f"{len(bad)} of its images differ from the driver's: " + "; ".join(bad[:5]) + \
        ("; ..." if len(bad) > 5 else "")
    sock.linger = 1000              # closing it waits (up to a second) for the LEAVE to leave
    sock.send_multipart([b"LEAVE", leave_body(reason, wid=body.get("wid"))])
    raise errors.WorkerRefused(f"this worker cannot join the cluster at {driver}: {reason}")


def join(driver, base=None, connect_timeout=None, secret=None, encrypt=True, advertise=None, slots=None,
         page_port=None, block_port=None, ports=None):
    """Join the Cluster whose control endpoint is ``driver`` and run its
    tasks until it stops this worker or is gone.  ``secret``: the
    cluster's (default CLAMOR_SECRET).  ``advertise``: the address peers
    reach this worker by (default: this host's address towards the driver);
    its page and block servers listen there, on ``page_port`` and
    ``block_port`` (default: any; ``ports``, "LO-HI" or (lo, hi) as a
    Cluster's ``worker_ports``: the first free ones of that range).  ``slots``: tasks it holds at once
    (default: the cluster's).  A bad endpoint, time-out or secret raises
    ConfigError, a driver that does not answer TransportError, one that
    says no or refuses the secret WorkerRefused."""
    from .executor import Runtime   # (not at import: ``python -m clamor.worker`` stays light until it joins)

    timeout = _connect_timeout(connect_timeout)
    secret = security.from_environment(secret)
    if secret is None:
        raise errors.ConfigError("no secret: a worker needs its cluster's, in CLAMOR_SECRET or a file named by "
                                 "--secret-file (the driver's is cl.secret)")
    sec = security.Security(secret, encrypt)
    if not driver.startswith(("tcp://", "ipc://")):
        driver = "tcp://" + driver          # a bare HOST:PORT
    host = advertise or advertised_address(driver)
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise errors.ConfigError(f"slots must be a positive int, not {slots!r}")
    if ports is not None and not isinstance(ports, str) or isinstance(ports, str) and "-" in ports:
        from .options import port_range    # (a Cluster's worker_ports, (lo, hi), is taken too)
        lo, hi = port_range(ports, "ports", text=True)
        ports = f"{lo}-{hi}"
    if region.role() is not None:
        raise errors.RegionError("this process has a region already; a worker that joins maps the driver's")
    ctx = zmq.Context()
    try:
        welcome = _ask_to_join(ctx, driver, timeout, sec, base)
        attach(welcome, sec, f"tcp://{host}:{page_port or ports or '*'}", base=base,
               fetch_reason="the cluster was made with same_host='fetch'")
        serialize.objects_in_place(region.base() == welcome.get("base"))
        # What this interpreter made to start goes to the collector's
        # permanent generation: the full collections before a page changes
        # (executor._release_region_objects) then walk the tasks' objects only.
        gc.collect()
        gc.freeze()
        blocks = f"tcp://{host}:{block_port or ports or '*'}"
        alive = driver_check(welcome)
        every = beat_interval(welcome)
        if alive is not None:
            rt = Runtime(driver, welcome["wid"].encode(), sec, blocks=blocks, slots=slots, heartbeat=every)
        else:   # the connection tells (clamor/runtime/liveness.py)
            rt = Runtime(driver, welcome["wid"].encode(), sec, link_grace=timeout, blocks=blocks, slots=slots,
                         heartbeat=every)
            alive = rt.link
        rt.loop(alive)
    finally:
        ctx.term()


def _tie_to_local_driver():
    """Spawned by a local driver: die with it at once, like a forked
    worker.  False if it is gone already."""
    parent = int(os.environ.pop("CLAMOR_PARENT_PID", "0") or 0)
    fd = os.environ.pop("CLAMOR_LIFELINE_FD", "")
    try:
        fd = int(fd) if stat.S_ISFIFO(os.fstat(int(fd)).st_mode) else None
    except (ValueError, OSError):
        fd = None
    if fd is not None:
        os.set_inheritable(fd, False)   # not for this worker's own children
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent:
        watch_lifeline(fd, parent)
        return os.getppid() == parent
    return True


def _address(text):
    """An address for --base: decimal, or hex with 0x."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an address: {text!r} (decimal, or hex such as 0x7f0000000000)")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="clamor worker", description=__doc__.splitlines()[0])
    ap.add_argument("endpoint", nargs="?", help="the Cluster's control endpoint: tcp://HOST:PORT or HOST:PORT")
    ap.add_argument("--driver", default=None, help="the same, as an option")
    ap.add_argument("--advertise", default=None,
                    help="the address peers reach this worker by (default: this host's address towards the driver)")
    ap.add_argument("--slots", type=int, default=None, help="tasks this worker holds at once (default: the cluster's)")
    ap.add_argument("--page-port", type=int, default=None, help="port of this worker's page server (default: any)")
    ap.add_argument("--block-port", type=int, default=None, help="port of this worker's block server (default: any)")
    ap.add_argument("--ports", default=None, metavar="LO-HI",
                    help="page and block servers take the first free ports of this range")
    ap.add_argument("--secret-file", default=None,
                    help="a file holding the cluster's secret (default: CLAMOR_SECRET from the environment)")
    ap.add_argument("--no-encrypt", action="store_true",
                    help="authenticate without encrypting, for a cluster made with encrypt=False")
    ap.add_argument("--base", type=_address, default=None,
                    help="map the region at this address instead of the driver's (pointer-free data only)")
    ap.add_argument("--connect-timeout", type=float, default=None,
                    help="seconds to wait for the driver (default CLAMOR_CONNECT_TIMEOUT, else 30)")
    args = ap.parse_args(argv)
    adopt_driver_path()   # (a worker the Cluster spawned)
    driver = args.driver or args.endpoint
    if not driver or (args.driver and args.endpoint and args.driver != args.endpoint):
        ap.error("give the driver's endpoint once: clamor worker tcp://HOST:PORT (or --driver tcp://HOST:PORT)")
    for name in ("slots", "page_port", "block_port"):
        v = getattr(args, name)
        if v is not None and not (1 <= v <= (65535 if name != "slots" else 4096)):
            ap.error(f"--{name.replace('_', '-')} out of range: {v}")
    if args.ports is not None:
        lo, sep, hi = args.ports.partition("-")
        if not (sep and lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi) <= 65535):
            ap.error(f"--ports takes LO-HI, two ports, not {args.ports!r}")
    logging.basicConfig(level=os.environ.get("CLAMOR_LOG", "WARNING"))
    if os.environ.pop("CLAMOR_DIE_WITH_PARENT", "") == "1":
        if not _tie_to_local_driver():
            return 0
    else:
        for var in ("CLAMOR_PARENT_PID", "CLAMOR_LIFELINE_FD"):
            os.environ.pop(var, None)
    try:
        secret = security.read_secret_file(args.secret_file) if args.secret_file else None
        join(driver, base=args.base, connect_timeout=args.connect_timeout, secret=secret,
             encrypt=not args.no_encrypt, advertise=args.advertise, slots=args.slots, page_port=args.page_port,
             block_port=args.block_port, ports=args.ports)
    except errors.ClamorError as err:
        print(f"clamor worker: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
