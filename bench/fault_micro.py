"""Build and run the C fault microbenchmark (bench/fault_micro.c).

How to run it, what it compares and what its JSON line holds: bench/README.md,
"fault_micro.py".
"""
import glob
import os
import subprocess
import sys

from _common import ROOT, c_compiler
from _harness import last_json_line, parser

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")
SOURCE = os.path.join(HERE, "fault_micro.c")


def libzmq_path():
    """CLAMOR_LIBZMQ, else the libzmq that clamor loads (clamor/_native.py
    finds the copy pyzmq ships: the one lookup in Python)."""
    if os.environ.get("CLAMOR_LIBZMQ"):
        return os.environ["CLAMOR_LIBZMQ"]
    try:
        from clamor._native import LIBZMQ_PATH
    except ImportError as err:
        raise SystemExit(f"fault_micro: cannot import clamor to find libzmq ({err}); "
                         "pip install -e . or set CLAMOR_LIBZMQ=/path/to/libzmq.so") from err
    return LIBZMQ_PATH


def build(build_dir):
    """Compile fault_micro unless the binary is newer than every source."""
    os.makedirs(build_dir, exist_ok=True)
    exe = os.path.join(build_dir, "fault_micro")
    sources = [SOURCE] + sorted(glob.glob(os.path.join(CSRC, "*.c")))
    deps = sources + glob.glob(os.path.join(CSRC, "*.h"))
    if os.path.exists(exe) and os.path.getmtime(exe) >= max(map(os.path.getmtime, deps)):
        return exe
    cc = c_compiler("fault_micro")
    tmp = exe + ".tmp%d" % os.getpid()
    cmd = [cc, "-std=gnu11", "-O2", "-pthread", "-I" + CSRC, *sources, "-o", tmp, "-ldl", "-lm"]
    subprocess.run(cmd, check=True)
    os.replace(tmp, exe)  # atomic: concurrent runs never see a half-written binary
    return exe


def main(argv=None):
    ap = parser(__doc__.split("\n\n")[0], "300 faults on a 64 MiB buffer", "50 faults on a 16 MiB buffer")
    ap.add_argument("-n", type=int, help="number of faults (and of round trips)")
    ap.add_argument("--mib", type=int, help="buffer size in MiB")
    ap.add_argument("--build-dir", default=os.path.join(HERE, "out"), help="where to compile (default bench/out)")
    args = ap.parse_args(argv)

    exe = build(args.build_dir)
    cmd = [exe, "--libzmq", libzmq_path()]
    if args.quick:
        cmd.append("--quick")
    if args.smoke:
        cmd.append("--smoke")
    if args.n:
        cmd += ["-n", str(args.n)]
    if args.mib:
        cmd += ["--mib", str(args.mib)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=900)
    sys.stdout.write(proc.stdout)
    sys.stdout.flush()
    if proc.returncode != 0:
        print(f"fault_micro: the benchmark failed (exit {proc.returncode})", file=sys.stderr)
        return proc.returncode or 1
    try:
        last_json_line(proc.stdout)
    except (IndexError, ValueError):
        print("fault_micro: the benchmark printed no JSON line", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
