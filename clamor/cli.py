"""Command line: ``clamor demo [geo|pages]`` and ``clamor worker --driver ENDPOINT``.

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
    w = sub.add_parser("worker", help="run a worker: clamor worker --driver tcp://HOST:PORT")
    w.add_argument("--driver", required=True)
    w.add_argument("--base", default=None)
    w.add_argument("--connect-timeout", default=None,
                   help="seconds to wait for the driver (default CLAMOR_CONNECT_TIMEOUT, else 30)")
    w.add_argument("--secret-file", default=None,
                   help="a file holding the cluster's secret (default: CLAMOR_SECRET from the environment)")
    w.add_argument("--no-encrypt", action="store_true", help="for a cluster made with encrypt=False")
    args = ap.parse_args(argv)
    if args.cmd == "demo" and args.demo == "geo":
        return _geo(args, g)
    if args.cmd == "demo":
        if args.workers < 1 or args.mib < 1 or args.lookups < args.workers:
            pg.error("--workers, --mib and --lookups must be positive (lookups >= workers)")
        from clamor.demo import pages

        return pages.demo(args)
    from clamor import worker

    argv = ["--driver", args.driver]
    for flag, value in (("--base", args.base), ("--connect-timeout", args.connect_timeout),
                        ("--secret-file", args.secret_file)):
        if value is not None:
            argv += [flag, value]
    if args.no_encrypt:
        argv.append("--no-encrypt")
    return worker.main(argv)


if __name__ == "__main__":
    sys.exit(main())
