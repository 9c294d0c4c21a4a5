"""Pure tier: SIGTERM and SIGHUP stop a sweep like Ctrl-C, and a second signal during the
clean-up does not cut it short (the runner's testbed.finish, run_job's process stops)."""

from __future__ import annotations

import ipaddress
import json
import signal

import pytest

from netbench.cli.common import sigterm_as_interrupt as _sigterm_as_interrupt
from netbench.emulation.executor import BackendChoice
from netbench.model.job import JobSpec, Task
from netbench.jobs.launch import Timeouts, run_job
from netbench.model.run import Run
from netbench.model.profile import Profile
from netbench.experiment.runner import SweepConfig, run_sweep
from netbench.model.topology import plan_topology


@pytest.fixture
def cli_handlers():
    """The handlers the command line installs for a sweep; the test's own come back after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def unhandled(signum, frame):  # what the command line leaves alone fails the test, not pytest
        raise AssertionError(f"{signal.Signals(signum).name} reached no handler of netbench's")

    signal.signal(signal.SIGHUP, unhandled)
    _sigterm_as_interrupt()
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_raise_keyboard_interrupt(cli_handlers, signum):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signum)


class SignalledTestbed:
    """A testbed whose first apply is interrupted by `signum`, and whose clean-up receives it
    again half-way through: `finished` says how far the clean-up got."""

    kind = "fake"

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.finished: list[str] = []
        self.spawn = None

    def prepare(self, config, needed):
        return BackendChoice("userspace", "fake")

    def start(self):
        return plan_topology(2, ipaddress.ip_network("10.213.0.0/24"))

    def nodes_for(self, job, workers):
        raise AssertionError("never reached")

    def apply(self, run, seed):
        signal.raise_signal(self.signum)

    def verify(self, run, observer):
        return None

    def finish(self, note):
        self.finished.append("qdiscs cleared")
        signal.raise_signal(self.signum)  # the user presses Ctrl-C again / kill is sent twice
        self.finished.append("namespaces removed")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_second_signal_does_not_cut_the_sweeps_clean_up_short(cli_handlers, tmp_path, signum):
    testbed = SignalledTestbed(signum)
    config = SweepConfig(sweep_id="s", runs=(Run(index=0, profile=Profile(name="a"), repeat=1, job=JobSpec(), workers=2),),
                         job=JobSpec(), workers=2, output=tmp_path / "out")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, testbed=testbed)
    assert testbed.finished == ["qdiscs cleared", "namespaces removed"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["ended"]
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # the handlers are back


def test_a_signal_during_a_clean_up_that_ends_a_normal_sweep_still_stops_it_afterwards(cli_handlers, tmp_path):
    testbed = SignalledTestbed(signal.SIGTERM)
    testbed.apply = lambda run, seed: None
    config = SweepConfig(sweep_id="s", runs=(), job=JobSpec(), workers=2, output=tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, testbed=testbed)
    assert testbed.finished == ["qdiscs cleared", "namespaces removed"]


class StubbornProcess:
    """A TaskProcess whose stop is interrupted by a signal (a second Ctrl-C while the job's
    processes are being stopped)."""

    def __init__(self, stopped: list[int], index: int, signum: int) -> None:
        self.stopped, self.index, self.signum = stopped, index, signum
        read, write = __import__("os").pipe()
        self.stdout = open(read, "rb")
        self._write = open(write, "wb")

    def wait(self) -> int:
        return 0

    def failure(self, code):
        return None

    def stop(self, grace: float) -> None:
        signal.raise_signal(self.signum)
        self.stopped.append(self.index)
        self._write.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_does_not_leave_a_jobs_processes_running(cli_handlers, tmp_path, signum):
    stopped: list[int] = []
    tasks = [Task(role="worker", index=i, node=f"n{i + 1}", netns=None, address="x", port=1, argv=(),
                  tf_config="") for i in range(3)]

    def spawn(task, log, env):
        if task.index == 2:
            signal.raise_signal(signum)  # the first signal: while the job's processes start
        return StubbornProcess(stopped, task.index, signum)

    with pytest.raises(KeyboardInterrupt):
        run_job(tasks, tmp_path / "logs", spawn, Timeouts(startup_s=60, step_s=60))
    # each started process is stopped, though each stop is interrupted; the one whose start the
    # first signal came during too (the signal is taken once it is known, never in between)
    assert stopped == [0, 1, 2]
