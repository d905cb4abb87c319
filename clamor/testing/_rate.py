"""Link rates: tc's notation (``parse_rate``), the tbf qdisc that
clamor/testing/nethosts.py puts on a host's link (``tbf_args``), and one
TCP connection's throughput between two hosts (``measure_tcp``), measured
with a Python sender and receiver.
"""
import json
import re
import select
import subprocess
import sys


# tbf: a bucket of 4 ms at the rate (at least 32 KiB: veth passes GSO
# packets up to 64 KiB, which tbf splits when they exceed the bucket) and
# up to 20 ms of queue.  At 1gbit a smaller bucket (64 KiB) holds one TCP
# connection to ~88% of the rate; with 4 ms it gets ~96% of the bits on the
# wire as payload, which is all there is once the headers are counted.
BURST_SECONDS = 0.004
MIN_BURST = 32 * 1024
TBF_LATENCY = "20ms"

_RATE_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
               "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40}


def parse_rate(rate):
    """A rate in tc's notation ("1gbit", "100mbit", "12.5mbps"; a bare
    number is bits per second) as bits per second (int)."""
    if isinstance(rate, (int, float)):
        bits = float(rate)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(rate).lower())
        if not m or m[2] not in _RATE_UNITS:
            raise ValueError(f"not a rate: {rate!r}")
        bits = float(m[1]) * _RATE_UNITS[m[2]]
    if bits < 8000:
        raise ValueError(f"rate {rate!r} below 8 kbit/s")
    return int(bits)


def tbf_args(rate):
    """The tbf parameters this helper uses for ``rate``."""
    bits = parse_rate(rate)
    burst = max(int(bits / 8 * BURST_SECONDS), MIN_BURST)
    return ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", TBF_LATENCY]



# --- throughput

_RECEIVER = r"""
import json, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
buf = bytearray(1 << 20)
total = first = 0
t0 = None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    if t0 is None:
        t0, first = time.monotonic(), k
    total += k
t1 = time.monotonic()
print(json.dumps({"bytes": total, "timed_bytes": total - first, "seconds": (t1 - t0) if t0 else 0.0}), flush=True)
"""

_SENDER = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
data = b"\0" * (4 << 20)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    c.sendall(data)
c.shutdown(socket.SHUT_WR)
c.recv(1)
"""


def measure_tcp(hosts, src, dst, seconds=1.0, timeout=60.0):
    """Throughput in bytes/s of one TCP connection from host ``src`` to host
    ``dst`` (an index, "root" or a Host), sending for ``seconds``.  Measured
    at the receiver, from its first byte to the end of the stream; TCP
    payload only, so a link limited to R bit/s gives about 0.96 R/8."""
    s, d = hosts.host(src), hosts.host(dst)
    if s is d:
        raise ValueError("src and dst are the same host")
    py = [sys.executable, "-I", "-S", "-c"]
    recv = d.popen(py + [_RECEIVER, d.addr], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   stdin=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([recv.stdout], [], [], timeout)
        line = recv.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            raise RuntimeError(f"receiver on {d!r} did not start: {line!r} {recv.stderr.read() if recv.poll() is not None else ''}")
        s.run(py + [_SENDER, d.addr, line.strip(), str(seconds)], check=True, timeout=seconds + timeout,
              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        out, err = recv.communicate(timeout=timeout)
        if recv.returncode != 0:
            raise RuntimeError(f"receiver on {d!r} failed: {err}")
        res = json.loads(out.strip().splitlines()[-1])
    finally:
        d._kill(recv)
        recv.wait()
        for f in (recv.stdout, recv.stderr):
            f.close()
    if res["seconds"] <= 0:
        raise RuntimeError(f"nothing measured: {res}")
    return res["timed_bytes"] / res["seconds"]
