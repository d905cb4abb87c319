"""Worker entry point: ``python -m clamor.worker --driver ENDPOINT``.

Connects to the driver's control endpoint (clamor.tasks.TaskServer),
attaches the region (unless this process is a forked worker that has it
already), then runs the functions the driver sends until told to stop or
until the driver is gone (clamor/runtime/_liveness.py tells how it knows), so a
worker never outlives its driver.  A STOP goes ahead of tasks still
queued here.
"""
import argparse
import logging
import math
import os
import pickle
import signal
import stat
import sys
import traceback

import cloudpickle
import zmq

from .. import errors
from ..memory import region
from ._liveness import LinkWatch, beat, heartbeats, pid_alive, pid_namespace, shares_pids, watch_lifeline

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


def _connect(sock, driver):
    try:
        sock.connect(driver)
    except zmq.ZMQError as err:
        kind = errors.ConfigError if err.errno in (zmq.EINVAL, zmq.EPROTONOSUPPORT) else errors.TransportError
        raise kind(f"cannot connect to the driver at {driver!r}: {err}") from err


def serve(driver, base=None, connect_timeout=None):
    """Serve tasks from the driver at ``driver`` until STOP or until the
    driver is gone.  Gives up if the driver does not answer within
    ``connect_timeout`` seconds (default: CLAMOR_CONNECT_TIMEOUT, else 30).
    A bad endpoint or time-out raises ConfigError, a driver that does not
    answer TransportError."""
    connect_timeout = _connect_timeout(connect_timeout)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    watch = beating = token = None
    try:
        _connect(sock, driver)
        sock.send_multipart([b"READY"])
        if not sock.poll(int(connect_timeout * 1000)):
            raise errors.TransportError(f"no answer from the driver at {driver} within {connect_timeout:g} s")
        frames = sock.recv_multipart()
        page_ep, driver_pid = frames[1], int(frames[2])
        driver_ns = frames[3].decode() if len(frames) > 3 else None
        if region.role() != "worker":
            region.connect(page_ep.decode(), base=base)
        region.ensure_handler_first()
        if shares_pids(driver_ns):
            def alive():
                return pid_alive(driver_pid)
        else:
            # The connection tells: a new one, with heartbeats (options
            # apply to new connections; the driver takes the identity that
            # ATTACHED comes from).
            sock.close()
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            heartbeats(sock)
            alive = watch = LinkWatch(sock, connect_timeout)
            _connect(sock, driver)
            token = os.urandom(8)
            beating = beat(ctx, driver, token)
        info = {"pid": os.getpid(), "server": region.server_endpoint(), "base": region.base(),
                "pidns": pid_namespace(), "hb": token}
        sock.send_multipart([b"ATTACHED", pickle.dumps(info)])
        inbox = []
        while True:
            if not inbox and not sock.poll(1000):
                if not alive():
                    log.warning("the driver (pid %d) is gone; exiting", driver_pid)
                    return
                continue
            while sock.poll(0):   # all that waits: a STOP goes ahead of queued tasks
                inbox.append(sock.recv_multipart())
            if any(f[0] == b"STOP" for f in inbox):
                return
            frames = inbox.pop(0)
            if frames[0] != b"TASK":
                continue
            tid, payload = frames[1], frames[2]
            region.ensure_handler_first()
            try:
                fn, args, kwargs = pickle.loads(payload)
                out = [b"ok", cloudpickle.dumps(fn(*args, **kwargs))]
            except Exception as err:  # the driver raises TaskError with this
                out = [b"err", pickle.dumps((f"{type(err).__name__}: {err}", traceback.format_exc()))]
            sock.send_multipart([b"RESULT", tid] + out)
    finally:
        if watch is not None:
            beating.set()
            watch.close()
        sock.close()
        ctx.term()


def _tie_to_local_driver():
    """Spawned by a local driver (TaskServer.spawn): die with it at once,
    like a forked worker.  False if it is gone already."""
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
    ap = argparse.ArgumentParser(prog="python -m clamor.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--driver", required=True, help="the driver's control endpoint, e.g. tcp://127.0.0.1:5555")
    ap.add_argument("--base", type=_address, default=None,
                    help="map the region at this address instead of the driver's (pointer-free data only)")
    ap.add_argument("--connect-timeout", type=float, default=None,
                    help="seconds to wait for the driver (default CLAMOR_CONNECT_TIMEOUT, else 30)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CLAMOR_LOG", "WARNING"))
    if os.environ.pop("CLAMOR_DIE_WITH_PARENT", "") == "1":
        if not _tie_to_local_driver():
            return 0
    else:
        for var in ("CLAMOR_PARENT_PID", "CLAMOR_LIFELINE_FD"):
            os.environ.pop(var, None)
    try:
        serve(args.driver, base=args.base, connect_timeout=args.connect_timeout)
    except errors.ClamorError as err:
        print(f"clamor.worker: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
