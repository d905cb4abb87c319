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
