"""``clamor demo geo --start-method``: the demo's workers forked (the
default) or spawned as fresh interpreters that use the tree in place."""
import argparse

from clamor.demo import geo


def test_the_demo_forks_its_workers_unless_told_to_spawn():
    p = argparse.ArgumentParser()
    geo.add_arguments(p)
    assert p.parse_args([]).start_method == "fork"
    assert p.parse_args(["--start-method", "spawn"]).start_method == "spawn"


def test_geo_demo_on_spawned_workers_matches_single_process(py):
    p = py("""
import sys
from clamor.cli import main
sys.exit(main(["demo", "geo", "--start-method", "spawn", "--dataset", "15000", "--queries", "2000"]))
""", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("cluster: 2 workers spawned"), p.stdout
    assert "answers equal to the single-process run: yes" in p.stdout, p.stdout
