"""Fixtures; the helpers themselves are in helpers.py."""
import os
import signal

import pytest

from helpers import run_py, userfaultfd_missing

# A suite started in the background (``cmd &``, nohup) inherits SIGINT
# ignored, and so would every driver a test starts: the Ctrl-C scenarios
# would see no KeyboardInterrupt.  A handler of this process's own is reset
# to the default in each child it executes.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def py():
    return run_py


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fetch_path: tests the fetch over a socket itself (read-ahead, the pager's retries, "
                   "replies of a page server); runs with same_host='fetch' only")


@pytest.fixture(autouse=True)
def _environment_kept():
    """No test leaves the process's environment changed for the tests after
    it, whose scenarios inherit it: a library may set a variable for its own
    children (dask.multiprocessing sets PYTHONHASHSEED, which decides
    whether spawned workers can use region dicts in place)."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(params=["map", "fetch"])
def same_host(request, monkeypatch):
    """Run the test with workers on this host mapping the driver's pages
    ("map", the default of a Cluster) and fetching them ("fetch"): every
    Cluster the test makes, in this process or in a scenario's, takes the
    mode from CLAMOR_SAME_HOST.  Suites of the fault path use it for every
    test (``pytestmark = pytest.mark.usefixtures("same_host")``)."""
    monkeypatch.setenv("CLAMOR_SAME_HOST", request.param)
    return request.param


@pytest.fixture(params=["userfaultfd", "mprotect"])
def write_protect(request, monkeypatch):
    """Run the test with the driver's region write-protected by userfaultfd
    (skipped where the process may not use it, with the reason; failed
    instead under CLAMOR_REQUIRE_USERFAULTFD=1, as CI sets) and by mprotect:
    every driver the test starts takes it from CLAMOR_WRITE_PROTECT."""
    if request.param == "userfaultfd" and userfaultfd_missing():
        why = f"userfaultfd is not usable here: {userfaultfd_missing()}"
        if os.environ.get("CLAMOR_REQUIRE_USERFAULTFD") == "1":   # (CI: never passes unnoticed)
            pytest.fail(f"CLAMOR_REQUIRE_USERFAULTFD=1 but {why}", pytrace=False)
        pytest.skip(why)
    monkeypatch.setenv("CLAMOR_WRITE_PROTECT", request.param)
    return request.param


def pytest_collection_modifyitems(config, items):
    """A test of the fetch itself runs in fetch mode only."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("same_host") == "map" and item.get_closest_marker("fetch_path"):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


pytest_plugins = ["leftovers_plugin"]   # nothing is left in /tmp or /dev/shm: tests/leftovers_plugin.py
