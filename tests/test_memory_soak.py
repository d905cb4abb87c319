"""The memory soak (tests/memsoak.py) at the suite's seeds: globals made,
sent, released and made again over rounds, read by forked, spawned and
attached Dask workers, every reading compared with the driver's.  The
closing figures of the soak are these at ten times the seeds
(``python tests/memsoak.py MODE SEED...``)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = {"fork": (1, 2), "spawn": (3,), "dask": (4, 5)}


def soak(mode, seeds):
    p = subprocess.run([sys.executable, os.path.join(HERE, "memsoak.py"), mode, *map(str, seeds)],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONHASHSEED": "6640", "PYTHONFAULTHANDLER": "1"})
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-4000:]}"
    outs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == len(seeds), p.stdout
    return outs, p.stderr


@pytest.mark.parametrize("mode", sorted(SEEDS))
def test_what_workers_read_while_memory_changes_hands_is_what_the_driver_reads(mode):
    if mode == "dask":
        pytest.importorskip("distributed")
    outs, err = soak(mode, SEEDS[mode])
    for out in outs:
        assert out["mismatches"] == [], out
        assert out["workers_alive"], out           # no worker lost or restarted
        assert out["region_frees"] == 0, out       # no region object died on a worker
        assert out["released"] > 0 and out["made"] > out["released"], out
        assert out["tasks"] >= 40 and out["readings"] >= 100, out   # (a round refused is not a round run)
    assert "free(): invalid pointer" not in err and "Fatal Python error" not in err, err[-4000:]


def test_an_object_built_over_a_freed_one_is_checked_again_for_spawned_workers():
    # A KDTree shipped to spawned workers, freed, and another built over its
    # memory: the check's verdict was remembered by address, so the new tree
    # shipped unchecked and the workers of the next Cluster crashed in it.
    from helpers import scenario
    out = scenario("""
        import scipy.spatial
        region.ensure()
        q = np.random.default_rng(1).random((8, 2))
        def once(seed):
            with clamor.heap():
                t = scipy.spatial.KDTree(np.random.default_rng(seed).random((2000, 2)))
                t.__dict__
            with clamor.Cluster(workers=1, start_method="spawn", progress=False) as cl:   # (one crashes as two did)
                got = cl.parallelize(list(range(4)), 4).map(lambda i: t.query(q, k=3)[1].tolist()).collect()
                lost = cl.stats()["recovery"]["workers_lost"]
            return t, [got == [t.query(q, k=3)[1].tolist()] * 4, lost, id(t)]
        a, first = once(1)
        where = id(a)
        del a
        b, second = once(2)
        c, third = once(3)
        print(json.dumps({"runs": [first, second, third], "reused": second[2] == where or third[2] == where}))
        """, timeout=240)
    for ok, lost, _ in out["runs"]:
        assert ok and lost == 0, out
    assert out["reused"], out      # the setup: a new tree took the freed one's address
