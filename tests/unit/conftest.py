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


@pytest.fixture(autouse=True)
def _no_testbed_of_others(monkeypatch):
    """Whether /run/netns holds a testbed this state folder did not make (testbed/sandbox.py
    sends a root sweep to a sandbox of its own then) is this machine's state, never a unit
    test's: none is, here. test_rootless.py tests the real check."""
    from netbench.testbed import sandbox

    monkeypatch.setattr(sandbox, "_others_up", lambda state: False)


@pytest.fixture
def sleeper():
    """A process of the test's own that sleeps (killed after the test if still running)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()
