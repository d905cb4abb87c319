"""Pages whose bytes did not change but moved in the driver's memfd (the
driver read a global between stages: reference counts went up and down
again, and under userfaultfd the page stays at its copy).  A worker that
maps the driver's pages drops its mappings of them; one that fetched and
relocated its own copy (a spawned worker's instances and atoms) keeps it
(CLAMOR_INVAL_MOVED, csrc/pagetable.c).  Every stage reads what the driver
reads, on forked and spawned workers alike."""
import pytest

from helpers import PRELUDE, run_driver


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_global_the_driver_only_read_is_not_fetched_again_and_a_change_is_seen(start):
    out = run_driver(PRELUDE + f"""
sys.path.insert(0, "tests")
from keyed_records import Point
region.ensure()
with clamor.heap():
    pts = [Point(i, i * 0.5, "p" + str(i)) for i in range(20_000)]
keys = list(range(0, 20_000, 97))
rd = lambda: [(pts[k].x, pts[k].y, pts[k].label) for k in keys]
res = {{}}
with clamor.Cluster(workers=1, start_method={start!r}, progress=None) as cl:
    res["first"] = cl.run(rd) == [rd()]          # (the driver reads every entry the task read)
    res["dirty"] = region.dirty_count()
    res["second"] = cl.run(rd) == [rd()]
    res["second_faults"] = cl.stats()["stages_detail"][-1]["faults"]
    with clamor.heap():
        pts[97].y = "changed"
        pts[19_982].label = "changed too"
    got = cl.run(rd)
    res["third"] = got == [rd()] and got[0][1][1] == "changed"
    res["lost"] = cl.stats()["recovery"]["workers_lost"]
print(json.dumps(res))
""", timeout=240, env={"fork": {}, "spawn": {"PYTHONHASHSEED": "0"}}[start])
    assert out["exit"] == 0, out
    assert out["dirty"] > 0, out                  # (the setup: the driver's reads wrote pages)
    assert out["first"] and out["second"] and out["third"], out
    if start == "spawn":
        # nothing changed, and each page it holds is a copy of its own: none
        # fetched again (a forked worker maps the driver's pages, and maps
        # those that moved anew)
        assert out["second_faults"] == 0, out
    assert out["lost"] == 0, out
