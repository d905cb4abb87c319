"""A collection cached, read by a shuffle, then unpersisted: a re-run that
recomputes through it must read the globals as the cache held them.  The
end-to-end scenarios run a driver in its own interpreter and kill real
workers; the lineage rules are tested without processes."""
import pytest

from helpers import scenario

from clamor import errors
from clamor.runtime.collection import Range
from clamor.errors import VersionExpired
from clamor.runtime.lineage import Lineage

SETUP = """
g = clamor.zeros(1 << 14, "i8")
g[0] = 1

def kill_holder(cl, sid):
    victim = next(w for w in cl._lineage.shuffles[sid] if w is not None)
    os.kill(cl._pid_of[victim], signal.SIGKILL)
    time.sleep(0.7)                      # noticed by the next action at the latest
"""


def _want(base):
    return sorted([k, sum(base + i for i in range(40) if i % 3 == k)] for k in range(3))


def test_a_shuffle_on_an_unpersisted_cache_recomputes_a_lost_output_at_the_cache_version():
    out = scenario(SETUP + """
with clamor.Cluster(workers=3, progress=False, speculation=False) as cl:
    base = cl.range(40, partitions=4).map(lambda i: (i % 3, int(g[0]) + i)).cache()
    n = base.count()                      # the snapshot: g[0] == 1
    g[0] = 100
    s = base.reduce_by_key(lambda a, b: a + b)
    first = sorted(s.collect())
    base.unpersist()
    kill_holder(cl, s.shuffle_ids[0])
    again = sorted(s.collect())
    kill_holder(cl, s.shuffle_ids[0])
    down = sorted(s.map(lambda kv: [kv[0], kv[1] + int(g[0])]).collect())
    fresh = sorted(base.collect())        # no longer cached: computed now, at g[0] == 100
    rec = cl.stats()["recovery"]
    restored = len(cl._lineage.restored)  # the restored copies went with their action
    del s
    import gc; gc.collect()
    cl.range(4).count()
    snaps = len(cl._lineage.snapshots)    # nothing can re-run through the snapshot now
print(json.dumps({"n": n, "first": first, "again": again, "down": down, "fresh": fresh[:3], "rec": rec,
                  "restored": restored, "snaps": snaps}))
""")
    assert out["rec"]["workers_lost"] == 2 and out["rec"]["recovery_jobs"] >= 2, out   # the scenario happened
    assert out["n"] == 40
    assert out["first"] == _want(1), out
    assert out["again"] == _want(1), out
    assert out["down"] == [[k, v + 100] for k, v in _want(1)], out
    assert out["fresh"] == [[0, 100], [0, 103], [0, 106]], out
    assert out["restored"] == 0 and out["snaps"] == 0, out


def test_a_cache_made_from_an_unpersisted_cache_is_rebuilt_from_its_snapshot():
    out = scenario(SETUP + """
with clamor.Cluster(workers=3, progress=False, speculation=False) as cl:
    base = cl.range(40, partitions=4).map(lambda i: int(g[0]) + i).cache()
    base.count()                          # g[0] == 1
    g[0] = 100
    top = base.map(lambda x: x + 1000 * int(g[0])).cache()
    first = top.collect()                 # base's snapshot plus 1000 * 100
    base.unpersist()
    g[0] = 5
    holders = {w for (cid, p), w in cl._lineage.cache.items() if cid == top.id}
    os.kill(cl._pid_of[sorted(holders)[0]], signal.SIGKILL)
    time.sleep(0.7)
    again = top.collect()
    rec = cl.stats()["recovery"]
print(json.dumps({"first": first, "again": again, "rec": rec}))
""")
    want = [1 + i + 100000 for i in range(40)]
    assert out["rec"]["recovery_jobs"] >= 1, out
    assert out["first"] == want and out["again"] == want, out


def test_past_the_bound_a_lost_output_fails_with_a_typed_error_not_a_wrong_result():
    out = scenario(SETUP + """
with clamor.Cluster(workers=3, progress=False, speculation=False) as cl:
    cl.unpersisted_versions = 0           # keep no version for unpersisted collections
    base = cl.range(40, partitions=4).map(lambda i: (i % 3, int(g[0]) + i)).cache()
    base.count()
    g[0] = 100
    s = base.reduce_by_key(lambda a, b: a + b)
    first = sorted(s.collect())
    base.unpersist()
    cl.range(4).count()                   # a stage: the version is dropped
    kill_holder(cl, s.shuffle_ids[0])
    again = attempt(lambda: sorted(s.collect()))
    after = cl.range(6, partitions=2).sum()    # the cluster stays usable
print(json.dumps({"first": first, "again": again, "after": after}))
""")
    assert out["first"] == _want(1), out
    assert out["again"][0] == "VersionExpired" and out["again"][2], out
    assert "unpersisted" in out["again"][1], out
    assert out["after"] == 15


# ---- lineage rules, without processes -------------------------------------------------

def _graph():
    base = Range(None, 0, 40, 1, 4).map(lambda i: (i % 3, i)).cache()
    s = base.reduce_by_key(lambda a, b: a + b)
    return base, s


def _made(lin, base, version, wids=(b"w0", b"w1", b"w0", b"w1")):
    for p, w in enumerate(wids):
        lin.cached(base.id, p, w, version)


def test_unpersist_keeps_the_versions_for_reruns_older_than_it():
    lin = Lineage()
    base, s = _graph()
    _made(lin, base, 1)
    lin.shuffle_started(s.shuffle_ids[0], 4, 2)
    base.cached = False
    lin.unpersist(base.id, until=4)
    assert lin.versions() == {1, 2}
    assert lin.cache == {} and lin.cache_made == {}
    # the shuffle's map re-run, at 2, restores base's partitions at 1 first
    shuffled, lost, (rs, rc) = lin.needs(base, [1, 3], version=2)
    assert lost == {1: {base: [1, 3]}} and rc == set()
    assert lin.restore_ids(2) == {base.id} and lin.restore_ids(1) == {base.id}
    # a job at the unpersist's stage or later computes base afresh
    assert lin.needs(base, [1, 3], version=4)[1] == {} and lin.restore_ids(4) == set()
    # as does a re-run older than the snapshot
    assert lin.needs(base, [1], version=0)[1] == {}
    # the restore job computes them, not reads them
    assert lin.needs(base, [1, 3], recompute=True, version=1)[1] == {}


def test_restored_copies_are_read_lost_with_their_worker_and_dropped():
    lin = Lineage()
    base, s = _graph()
    _made(lin, base, 1)
    lin.shuffle_started(s.shuffle_ids[0], 4, 2)
    lin.unpersist(base.id, until=4)
    assert lin.restored_copy(base.id, 1, 1, b"w2")
    assert not lin.restored_copy(base.id, 3, 2, b"w2")     # made on the way at another version
    assert lin.restored_locs(2) == {(base.id, 1): (b"w2", 1)}
    assert lin.restored_locs(4) == {}
    shuffled, lost, (rs, rc) = lin.needs(base, [1, 3], version=2)
    assert lost == {1: {base: [3]}} and rc == {(base.id, 1, 1)}
    assert lin.lose_worker(b"w2") == (set(), {(base.id, 1, 1)})
    assert lin.needs(base, [1], version=2)[1] == {1: {base: [1]}}
    lin.restored_copy(base.id, 1, 1, b"w0")
    lin.lose_block(b"w0", ("cache", base.id, 1, 1))
    assert lin.restored_locs(2) == {}
    lin.restored_copy(base.id, 1, 1, b"w0")
    assert lin.drop_restored() == [("cache", base.id, 1, 1)] and lin.restored_locs(2) == {}


def test_a_snapshot_nobody_can_rerun_through_is_dropped():
    lin = Lineage()
    base, s = _graph()
    _made(lin, base, 1)
    lin.shuffle_started(s.shuffle_ids[0], 4, 2)
    lin.unpersist(base.id, until=4)
    lin.shuffle_started(77, 4, 5)          # a later shuffle: it never read the cache
    lin.prune()
    assert lin.versions() == {1, 2, 5}
    lin.forget("shuffle", s.shuffle_ids[0])
    lin.prune()
    assert lin.versions() == {5} and lin.snapshots == {}
    assert lin.needs(base, [0], version=2)[1] == {}   # (no such re-run can come now)


def test_snapshots_kept_alive_only_by_other_snapshots_chain_and_end():
    # an iterative chain: each cache computed from the previous, which is
    # then unpersisted; the newest live record holds the whole chain
    lin = Lineage()
    cs = [Range(None, 0, 8, 1, 2).cache()]
    for _ in range(3):
        cs.append(cs[-1].map(lambda x: x).cache())
    for i, c in enumerate(cs):
        _made(lin, c, 2 * i + 1, (b"w0", b"w1"))
        if i:
            lin.unpersist(cs[i - 1].id, until=2 * i + 2)
    lin.prune()
    assert lin.versions() == {1, 3, 5, 7}
    lin.forget("cache", cs[-1].id)         # the last one is dropped
    lin.prune()
    assert lin.versions() == set()


def test_past_the_bound_the_oldest_snapshot_versions_expire():
    lin = Lineage()
    cs = [Range(None, 0, 8, 1, 2).cache()]
    for _ in range(3):
        cs.append(cs[-1].map(lambda x: x).cache())
    for i, c in enumerate(cs):
        _made(lin, c, 2 * i + 1, (b"w0", b"w1"))
        if i:
            lin.unpersist(cs[i - 1].id, until=2 * i + 2)
    lin.prune(limit=2)
    assert lin.versions() == {3, 5, 7}         # 7: a live cache; 3 and 5 the newest snapshots
    lin.prune(limit=8)
    assert lin.versions() == {3, 5, 7}         # expired for good
    lin.lose_worker(b"w0")
    # the newest cache's lost partition is rebuilt at 7 from cs[2]'s snapshot,
    # itself from cs[1]'s at 3 ...
    assert lin.needs(cs[3], [0], version=7)[1] == {7: {cs[3]: [0]}}
    assert lin.needs(cs[3], [0], recompute=True, version=7)[1] == {5: {cs[2]: [0]}}
    assert lin.needs(cs[2], [0], recompute=True, version=5)[1] == {3: {cs[1]: [0]}}
    # ... whose own input, cs[0] at 1, is gone: a typed error, not a wrong result
    with pytest.raises(VersionExpired) as err:
        lin.needs(cs[1], [0], recompute=True, version=3)
    assert isinstance(err.value, errors.WorkerLost) and "unpersisted" in str(err.value)


def test_a_collection_cached_again_keeps_both_generations_apart():
    lin = Lineage()
    base, s = _graph()
    _made(lin, base, 1)
    lin.shuffle_started(s.shuffle_ids[0], 4, 2)
    lin.unpersist(base.id, until=4)
    base.cached = True
    _made(lin, base, 6, (b"w2", b"w2", b"w2", b"w2"))   # cached again, after an update
    assert lin.needs(base, [0], version=6)[2][1] == {(base.id, 0)}
    assert lin.needs(base, [0], version=2)[1] == {1: {base: [0]}}
    lin.restored_copy(base.id, 0, 1, b"w2")
    assert lin.needs(base, [0], version=2)[2][1] == {(base.id, 0, 1)}
    # the live copy and the restored one are told apart by their version
    lin.lose_block(b"w2", ("cache", base.id, 0, 1))
    assert (base.id, 0) in lin.cache and lin.restored_locs(2) == {}
    lin.forget("cache", base.id)            # garbage-collected: everything goes
    lin.prune()
    assert lin.versions() == {2} and lin.restored == {}
