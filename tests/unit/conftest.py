"""The unit tier's own fixtures (tests/conftest.py has the shared ones)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def _holds_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("holds")


@pytest.fixture(autouse=True)
def _private_holds(_holds_folder, monkeypatch):
    """Machine-wide holds (state/holds.py) in a folder of the tier's own: a fake's host setting
    never shares /run/netbench-holds with a real sweep on this machine."""
    monkeypatch.setenv("NETBENCH_HOLDS_DIR", str(_holds_folder))
