"""Worker entry point: ``python -m clamor.worker --driver ENDPOINT``.

Connects to the driver's control endpoint, attaches the region (unless this
process is a forked worker that has it already), then runs the functions the
driver sends until told to stop or until the driver process is gone, so a
worker never outlives its driver.
"""
import argparse
import logging
import os
import pickle
import sys
import traceback

import cloudpickle
import psutil
import zmq

from . import region

log = logging.getLogger("clamor.worker")


def _driver_alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def serve(driver, base=None, connect_timeout=None):
    """Serve tasks from the driver at ``driver`` until STOP.  Gives up if the
    driver does not answer within ``connect_timeout`` seconds (default:
    CLAMOR_CONNECT_TIMEOUT, else 30)."""
    if connect_timeout is None:
        connect_timeout = float(os.environ.get("CLAMOR_CONNECT_TIMEOUT", "30"))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(driver)
    try:
        sock.send_multipart([b"READY"])
        if not sock.poll(int(connect_timeout * 1000)):
            raise SystemExit(f"clamor.worker: no answer from the driver at {driver} within {connect_timeout:g} s")
        kind, page_ep, dpid = sock.recv_multipart()
        driver_pid = int(dpid)
        if region.role() != "worker":
            region.connect(page_ep.decode(), base=base)
        region.ensure_handler_first()
        info = {"pid": os.getpid(), "server": region.server_endpoint(), "base": region.base()}
        sock.send_multipart([b"ATTACHED", pickle.dumps(info)])
        while True:
            if not sock.poll(1000):
                if not _driver_alive(driver_pid):
                    log.warning("driver %d is gone; exiting", driver_pid)
                    return
                continue
            frames = sock.recv_multipart()
            if frames[0] == b"STOP":
                return
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
        sock.close()
        ctx.term()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m clamor.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--driver", required=True, help="the driver's control endpoint, e.g. tcp://127.0.0.1:5555")
    ap.add_argument("--base", type=lambda s: int(s, 0), default=None,
                    help="map the region at this address instead of the driver's (pointer-free data only)")
    ap.add_argument("--connect-timeout", type=float, default=None,
                    help="seconds to wait for the driver (default CLAMOR_CONNECT_TIMEOUT, else 30)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CLAMOR_LOG", "WARNING"))
    if os.environ.get("CLAMOR_DIE_WITH_PARENT") == "1":
        # started by a local driver (TaskServer.spawn): die with it at once,
        # not at the next fetch time-out
        from .executor import _die_with_parent
        parent = int(os.environ.get("CLAMOR_PARENT_PID", "0"))
        _die_with_parent()
        if parent and os.getppid() != parent:
            return 0
    serve(args.driver, base=args.base, connect_timeout=args.connect_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
