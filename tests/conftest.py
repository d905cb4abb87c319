"""Fixtures; the helpers themselves are in helpers.py."""
import pytest

from helpers import run_py


@pytest.fixture
def py():
    return run_py
