"""Command line: ``clamor demo [geo|pages]`` and ``clamor worker tcp://HOST:PORT``.

``clamor demo`` with no name runs ``geo`` (clamor/demo/geo.py): k-d tree
queries over real places, against a single-process run.  ``pages``
(clamor/demo/pages.py) is the first demo: random lookups into a 1 GiB
array.
"""
import argparse
import sys


DEMOS = ("geo", "pages")


def _geo(args, ap):
    from clamor.demo import geo

    geo.quick(args)
    if args.workers < 1 or args.queries < 1 or args.scale < 1 or args.radius_km <= 0 or \
            (args.partitions is not None and args.partitions < 1):
        ap.error("--workers, --queries, --scale, --radius-km and --partitions must be positive")
    return geo.demo(args)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:   # its own parser: clamor/runtime/worker.py
        from clamor.runtime import worker

        return worker.main(argv[1:])
    # "clamor demo" and "clamor demo --quick" mean the geo demo
    if argv[:1] == ["demo"] and (len(argv) == 1 or argv[1] not in DEMOS + ("-h", "--help")):
        argv.insert(1, "geo")
    ap = argparse.ArgumentParser(prog="clamor", description="clamor: global variables paged in over ZeroMQ")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run a demo job (default: geo)")
    demos = d.add_subparsers(dest="demo", required=True)
    g = demos.add_parser("geo", help="k-d tree geo queries over real places (the default demo)")
    if argv[:1] == ["demo"]:  # clamor.geo imports scipy: not for "clamor worker"
        from clamor.demo.geo import add_arguments

        add_arguments(g)
    pg = demos.add_parser("pages", help="random lookups into a 1 GiB region array")
    pg.add_argument("--workers", type=int, default=2)
    pg.add_argument("--mib", type=int, default=1024, help="size of the global array")
    pg.add_argument("--lookups", type=int, default=4000)
    sub.add_parser("worker", add_help=False, help="run a worker: clamor worker tcp://HOST:PORT (--help for more)")
    args = ap.parse_args(argv)
    if args.cmd == "demo" and args.demo == "geo":
        return _geo(args, g)
    if args.cmd == "demo":
        if args.workers < 1 or args.mib < 1 or args.lookups < args.workers:
            pg.error("--workers, --mib and --lookups must be positive (lookups >= workers)")
        from clamor.demo import pages

        return pages.demo(args)
    return 0   # (not reached: "worker" is handled above, and a subcommand is required)


if __name__ == "__main__":
    sys.exit(main())
