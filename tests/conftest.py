"""Shared fixtures. The folder is the tier: unit/ (pure, no root, no TensorFlow), root/ (real
namespaces), tf/ (real TensorFlow processes), kernel/ (netem on a real netem kernel, under
`make test-kernel`), ssh/ (real sshd hosts in namespaces), slurm/ (a campaign through a real
one-node Slurm cluster started by the test), readme/ (the docs tier: the shell
examples of README.md, docs/ and --help, run as written with short windows, and the site's
build); fakes/ holds the shared fakes. Markers follow from the folder (set below), so
`-m "not root and not tf"` still selects the unit tier. Every root test resets what it made,
also on failure."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NETBENCH = [sys.executable, "-m", "netbench.cli"]  # the CLI, run as a separate process

# The suite's sweeps measure exactly their --steps and skip the step model's calibrations
# unless a test asks for them (--precision P, --predict: tests/tf/test_precision_tf.py and
# test_root_sweep.py's end-to-end sweep do): a window that grows to its precision (up to 60 s)
# and ~6-10 s of calibration in every sweep would make the suite several times longer, and
# most tests count steps. A user's environment may set the same variables (sweep --help).
os.environ.setdefault("NETBENCH_PRECISION", "off")
os.environ.setdefault("NETBENCH_PREDICT", "0")


TIER_MARKS = {"root": ("root",), "tf": ("tf",), "kernel": ("root", "netem"), "ssh": ("root",),
              "readme": ("root", "tf"), "rootless": ("root", "tf"), "slurm": ("root", "tf", "slurm")}


def pytest_collection_modifyitems(config, items):
    """Mark each test by its folder; a unit test marked root or tf is in the wrong folder."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        tier = parts[0] if len(parts) > 1 else ""
        for mark in TIER_MARKS.get(tier, ()):
            item.add_marker(mark)
        if tier == "unit" and {m.name for m in item.iter_markers()} & {"root", "tf", "netem"}:
            raise pytest.UsageError(f"{item.nodeid}: a unit test marked root/tf/netem belongs in another tier folder")


@pytest.fixture(autouse=True)
def _never_reexec(monkeypatch):
    """No test's own process is ever replaced by a netbench run inside a sandbox, nor starts a
    keeper (testbed/sandbox.py): a command under test that would is a failure. Tests of those
    paths fake them; the rootless tier runs netbench as a process of its own."""
    from netbench.testbed import sandbox

    def refuse(*args, **kwargs):
        raise AssertionError("a test's own process would have entered a sandbox (sandbox._exec)")

    monkeypatch.setattr(sandbox, "_exec", refuse)
    monkeypatch.setattr(sandbox, "start_keeper", refuse)


def _netbench_netns() -> list[str]:
    from netbench.testbed import netns as local

    return local.list_netbench_netns()


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    """A private NETBENCH_STATE_DIR (journal, lock, engine stats) for one test."""
    path = tmp_path / "state"
    path.mkdir()
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(path))
    return path


_LEFT_BEFORE: list[str] = []  # namespaces that outstayed one test's wait: another's, not this suite's


@pytest.fixture
def clean_machine(state_dir):
    """For root tests: wait until no netbench namespace exists, then reset after the test.

    Namespaces another run left (a killed sweep's, before `netbench reset`) are waited for once
    (180 s); while the same ones stay, each later test fails at once rather than waiting again.

    The teardown runs netbench's own reset on this test's journal and then checks that no
    netbench namespace is left, so a leak fails the test that caused it.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root (creates network namespaces)")
    from netbench.state.journal import Journal
    from netbench.state.reset import reset

    global _LEFT_BEFORE
    if _LEFT_BEFORE and _netbench_netns() == _LEFT_BEFORE:
        pytest.fail(f"netbench namespaces from before this test are still there: {_LEFT_BEFORE} "
                    "(not this suite's: 'netbench reset --all-namespaces' removes them)")
    deadline = time.monotonic() + 180
    while _netbench_netns():
        if time.monotonic() > deadline:
            _LEFT_BEFORE = _netbench_netns()  # the next tests fail at once, not after 180 s each
            pytest.fail(f"netbench namespaces already exist and stayed 180 s: {_LEFT_BEFORE} "
                        "(another run's, or a killed one's: 'netbench reset --all-namespaces' removes them)")
        time.sleep(2)
    _LEFT_BEFORE = []
    journal = Journal(state_dir)
    yield journal
    reset(journal)
    left = _netbench_netns()
    assert not left, f"namespaces left behind: {left}"


def netbench_processes(state: Path | None = None) -> list[tuple[int, str]]:
    """(pid, cmdline) of every engine or worker process started under this test's state dir.

    Processes inherit NETBENCH_STATE_DIR from the controller, which tells this test's
    processes apart from any other netbench run on the machine.
    """
    state = state or Path(os.environ["NETBENCH_STATE_DIR"])
    marker = f"NETBENCH_STATE_DIR={state}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "netbench.emulation.engine" not in cmd and "netbench.jobs.worker" not in cmd:
                continue
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        found.append((int(entry.name), cmd))
    return found


def wait_for(predicate, seconds: float, what: str):
    """`predicate()`'s first true value, asked every 0.2 s; the test fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"{what} did not happen within {seconds:g}s")


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all held open until all are chosen)."""
    import socket

    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cli_ok(*args: str):
    """The CLI run as a separate process; the test fails with its output unless it exits 0."""
    import subprocess

    result = subprocess.run([*NETBENCH, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def engine_pids() -> set[int]:
    """The delay engines started under this test's state dir."""
    return {pid for pid, cmd in netbench_processes() if "netbench.emulation.engine" in cmd}
