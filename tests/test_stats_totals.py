"""cl.stats() and cl.stage_stats() add up: every fault and every byte a
worker fetched counts once, in the stage whose report carried it, including
what a losing speculative copy or a failed task fetched.  Each scenario runs
a driver in a subprocess with two forked workers and prints one JSON line.
The workers fetch (same_host="fetch"): the per-peer counters these check
against count fetched bytes; what workers map is checked in
test_samehost.py."""
import json

import pytest

from helpers import PRELUDE

PRE = PRELUDE + """
def counters():
    st = region.stats()
    return {"faults": st["faults"], "bytes": st["bytes_fetched"]}

def settle(cl):
    # A copy that outlives its stage reports later, and the driver reads the
    # report during a later action.  A worker runs its tasks one at a time,
    # so once a task of a later stage has run on each worker every earlier
    # copy has reported (first loop: a worker busy with a straggler has no
    # free slot and gets no task until it reports); then both report once
    # more, after all fetching ended, so that what they served is up to date
    # (second loop).  Returns the workers' own counters, as the last task on
    # each read them.
    def pids_and_counters():
        return dict(cl.range(2, partitions=2).map(lambda i: (os.getpid(), counters())).collect())
    seen, own, deadline = set(), {}, time.monotonic() + 20
    while len(seen) < 2 and time.monotonic() < deadline:
        seen |= set(pids_and_counters())
        time.sleep(0.05)
    while len(own) < 2 and time.monotonic() < deadline:
        own = pids_and_counters()
        time.sleep(0.05)
    return list(own.values())

def figures(cl, own):
    st, ss = cl.stats(), cl.stage_stats()
    rep = st["replication"]
    return {"total_bytes": st["bytes_from_driver"] + st["bytes_from_peers"], "total_faults": st["faults"],
            "stage_bytes": sum(s["bytes_from_driver"] + s["bytes_from_peers"] for s in ss),
            "stage_faults": sum(s["faults"] for s in ss),
            "first_stage_bytes": ss[0]["bytes_from_driver"] + ss[0]["bytes_from_peers"],
            "first_stage_faults": ss[0]["faults"],
            "served": rep["bytes_served_by_driver"] + sum(rep["bytes_served_by_peer"].values()),
            "own_bytes": sum(o["bytes"] for o in own), "own_faults": sum(o["faults"] for o in own),
            "own_workers": len(own), "stages": st["stages"], "recovery": st["recovery"],
            "page": region.page_size(), "readahead": clamor.configure()["readahead"]}
"""


def check_adds_up(out):
    assert out["own_workers"] == 2, out
    # the totals are the sum over the stages, and they are what the workers
    # counted themselves and what the driver and the peers served
    assert out["total_bytes"] == out["stage_bytes"] == out["own_bytes"] == out["served"], out
    assert out["total_faults"] == out["stage_faults"] == out["own_faults"], out


@pytest.mark.usefixtures("same_host")
@pytest.mark.fetch_path
def test_two_workers_reading_a_whole_table_count_twice_the_table(py):
    """Each worker reads every page of a 64 MiB table, in random order with
    read-ahead off (one fault per page).  16 partitions: each worker's first
    task fetches the table, its later ones find it there, so the first is
    slow, and speculation (on by default) often gives it a second copy on
    the other worker that wins; the first copy ran on and fetched the whole
    table, and the old per-task figures of the losing copy were dropped
    (6 runs in 8 reported half the traffic)."""
    p = py(PRE + """
table = clamor.zeros(1 << 23)                                # 64 MiB, 1024 pages of 64 KiB
per = region.page_size() // 8
npg = table.size // per
def touch(i):
    clamor.configure(readahead=0)
    order = np.random.default_rng(i).permutation(npg)
    return float(sum(table[int(k) * per] for k in order))
with clamor.Cluster(workers=2, progress=False) as cl:
    assert cl.range(16, partitions=16).map(touch).collect() == [0.0] * 16
    out = figures(cl, settle(cl))
out["nbytes"] = table.nbytes
print(json.dumps(out))
""", check=True, timeout=120)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    check_adds_up(out)
    # Both read every page: twice the table.  Slack: the table need not start
    # on a page boundary, so it may span one page more, per worker.
    assert 2 * out["nbytes"] <= out["total_bytes"] <= 2 * (out["nbytes"] + out["page"]), out
    assert 2 * out["nbytes"] <= out["first_stage_bytes"], out            # and in the stage that read it
    npages = out["nbytes"] // out["page"]
    assert 2 * npages <= out["first_stage_faults"] <= 2 * (npages + 1), out


@pytest.mark.usefixtures("same_host")
@pytest.mark.fetch_path
def test_a_losing_speculative_copy_counts_what_it_fetched(py, tmp_path):
    """Partition 0's first copy reads the table, then straggles; its second
    copy, on the worker that read the table for partition 1, wins at once.
    The first copy's whole table counts, in that stage, once it reports."""
    marker = tmp_path / "first"
    p = py(PRE + f"""
table = clamor.zeros(1 << 23)                                # 64 MiB
def read(i):
    s = float(table.sum())
    if i != 0:
        return s, "other"
    try:
        fd = os.open({str(marker)!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return s, "second copy"
    os.close(fd)
    time.sleep(1.5)
    return s, "first copy"
spec = clamor.Speculation(multiplier=1.5, quantile=0.5, min_runtime=0.2)
with clamor.Cluster(workers=2, progress=False, speculation=spec) as cl:
    got = cl.range(2, partitions=2).map(read).collect()
    out = figures(cl, settle(cl))
out["got"] = got
out["nbytes"] = table.nbytes
print(json.dumps(out))
""", check=True, timeout=120)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # the scenario happened: a second copy of partition 0 won
    assert out["got"] == [[0.0, "second copy"], [0.0, "other"]], out
    assert out["recovery"]["speculative_copies"] >= 1, out     # (settle's tasks queued behind it may get some too)
    check_adds_up(out)
    # Each worker read the whole table once (the winning copy found it on its
    # worker already).  Slack: read-ahead past the table's end, up to twice
    # the read-ahead size per worker, and a partial page at each end.
    slack = 2 * (2 * out["readahead"] + 2 * out["page"])
    assert 2 * out["nbytes"] <= out["first_stage_bytes"] <= out["total_bytes"] <= 2 * out["nbytes"] + slack, out


@pytest.mark.usefixtures("same_host")
@pytest.mark.fetch_path
def test_a_failed_task_counts_what_it_fetched(py):
    """A task that reads a table and then raises: its fetches count in its
    stage, with the report of the failure."""
    p = py(PRE + """
table = clamor.zeros(1 << 21)                                # 16 MiB
def read_then_fail(i):
    clamor.configure(readahead=0)
    float(table.sum())
    raise ValueError("after reading")
with clamor.Cluster(workers=1, progress=False) as cl:
    try:
        cl.range(1, partitions=1).map(read_then_fail).collect()
        raise AssertionError("no TaskError")
    except clamor.TaskError as err:
        assert "after reading" in str(err)
    st, ss = cl.stats(), cl.stage_stats()
out = {"total_bytes": st["bytes_from_driver"] + st["bytes_from_peers"], "faults": st["faults"],
       "stage_bytes": ss[-1]["bytes_from_driver"] + ss[-1]["bytes_from_peers"], "stage_faults": ss[-1]["faults"],
       "nbytes": table.nbytes, "page": region.page_size()}
print(json.dumps(out))
""", check=True, timeout=120)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    npages = out["nbytes"] // out["page"]
    assert out["nbytes"] <= out["stage_bytes"] == out["total_bytes"] <= out["nbytes"] + out["page"], out
    assert npages <= out["stage_faults"] == out["faults"] <= npages + 1, out


def test_the_counters_frame_is_twelve_integers_and_a_bad_one_is_refused():
    import pytest
    from clamor.errors import ProtocolError
    from clamor.runtime import serialize
    c = {k: (i + 1) * 10**12 for i, k in enumerate(serialize.COUNTERS)}
    frame = serialize.pack_counters(c)
    assert len(frame) == 96 and serialize.unpack_counters(frame) == c
    for bad in (frame[:-1], frame + b"\0", b"", "x"):
        with pytest.raises(ProtocolError):
            serialize.unpack_counters(bad)
