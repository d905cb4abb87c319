"""Pages whose bytes did not change but moved in the driver's memfd (the
driver read a global between stages: reference counts went up and down
again, and under userfaultfd the page stays at its copy).  A worker that
maps the driver's pages drops its mappings of them; one that fetched and
relocated its own copy (a spawned worker's instances and atoms) keeps it
(CLAMOR_INVAL_MOVED, csrc/pagetable.c).  Every stage reads what the driver
reads, on forked and spawned workers alike."""
import sys

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
dropped = lambda: clamor.stats()["pages_invalidated"]     # (the worker's, after the drops before its task)
from clamor.runtime import versions
begin, began = versions.VersionKeeper.begin, []

def counted(self, relocated=None, always=False):
    sid = begin(self, relocated, always)
    began.append((len(self.changes.get(sid, ())), len((self.moves or {{}}).get(sid, ()))))
    return sid

versions.VersionKeeper.begin = counted     # (what each version changed and moved, observed)
res = {{}}
with clamor.Cluster(workers=1, start_method={start!r}, progress=None) as cl:
    got = cl.run(lambda: (rd(), dropped()))[0]
    res["first"] = got[0] == rd()                # (the driver reads every entry the task read)
    res["dirty"] = region.dirty_count()
    again = cl.run(lambda: (rd(), dropped()))[0]
    res["second"] = again[0] == rd()
    res["second_dropped"] = again[1] - got[1]
    res["second_changed"], res["second_moved"] = began[-1]
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
    assert out["lost"] == 0, out
    if start == "spawn":
        # each page it holds is a copy of its own: it drops the pages whose
        # bytes changed (none before 3.13; on 3.13 the driver's reads of its
        # instances' own dicts change one) and none of those that only moved
        # (a forked worker maps the driver's pages, and maps those that
        # moved anew)
        if not out["second_moved"]:     # (mprotect: the driver's pages go back home, and nothing moves)
            pytest.skip(f"no page moved: {out}")
        assert out["second_dropped"] == out["second_changed"], out
        if sys.version_info < (3, 13):
            assert out["second_changed"] == 0 and out["second_faults"] == 0, out
