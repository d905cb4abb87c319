"""The PyData objects of tests/dask_pydata_check.py through clamor.dask.ref
on a real Dask LocalCluster: each read in a task, before and after the
driver used it (a library may make attributes lazily then), must equal the
driver's answer; refused, failed or different, the case says how."""
import json

import pytest

pytest.importorskip("distributed")
pytest.importorskip("sklearn")
pytest.importorskip("pandas")
pytest.importorskip("networkx")

from dask_pydata_check import DRIVER, OBJECTS  # noqa: E402
from helpers import scenario  # noqa: E402


def test_library_objects_are_used_in_place_by_dask_workers():
    cases = scenario(DRIVER, timeout=600, env={"PYTHONHASHSEED": "6640"})
    bad = {n: cases.get(n) for n in OBJECTS
           if (cases.get(n) or {}).get("built") != "ok" or cases[n].get("used") != "ok"}
    assert not bad, json.dumps(bad)[:4000]
