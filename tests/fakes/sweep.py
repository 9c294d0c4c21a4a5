"""A synthetic testbed (runner.Testbed) for driving whole sweeps without root or TensorFlow.

Each task is a stand-in process whose stdout yields the events a real worker streams
(netbench.jobs.worker's start, step and done events), made one line at a time as the
controller reads them, so the stand-ins themselves hold no memory. Profiles are applied
through a real Executor on the in-memory adapters of tests/fakes/netlink.py, journaled in a real
Journal, as the embedded testbed does. bench/sweep_memory.py uses it too.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from typing import Iterator

from netbench.emulation import backends, changes as ch
from netbench.emulation.executor import BackendChoice, Executor
from netbench.jobs import worker
from netbench.model.job import Task, nodes_needed
from netbench.state.journal import Journal
from netbench.model.topology import plan_topology
from tests.fakes.netlink import make_fakes

STEP_S = 0.01  # every synthetic step "takes" this long


class SyntheticStdout:
    """A worker's stdout: start, `warmup` + `steps` step events, done; generated as read."""

    def __init__(self, task: Task, warmup: int, steps: int, batch_size: int, workers: int,
                 hold=None, stop_after: int | None = None) -> None:
        self._lines = self._generate(task, warmup, steps, batch_size, workers, hold, stop_after)

    @staticmethod
    def _generate(task: Task, warmup: int, steps: int, batch_size: int, workers: int,
                  hold=None, stop_after: int | None = None) -> Iterator[bytes]:
        """hold(task, k), if given, is called before step k is made (a test paces the steps);
        with stop_after the output ends after that many steps, with no done event."""
        def line(event: dict) -> bytes:
            return (json.dumps(event) + "\n").encode()

        yield line(worker.start_event(task.index, workers, 1000 + task.index, 0.0, "synthetic", "mlp", 669_706,
                                      batch_size, role=task.role, model_bytes=2_678_824, input_shape=(784,)))
        for k in range(warmup + steps):
            if stop_after is not None and k >= stop_after:
                return
            if hold is not None:
                hold(task, k)
            start = k * STEP_S
            phase = worker.PHASE_WARMUP if k < warmup else worker.PHASE_MEASURED
            yield line(worker.step_event(k, phase, start, start + STEP_S, batch_size * workers, 0.5,
                                         compute=STEP_S / 2, comm=STEP_S / 2))
        yield line(worker.done_event((warmup + steps) * STEP_S, warmup + steps))

    def readline(self) -> bytes:
        return next(self._lines, b"")


class ContinuousStdout:
    """A worker started with --until-stopped: start, `warmup` warm-up steps, then measured
    steps until stopped, each made `pace` s after the last on the real clock (so the
    controller's clock sees steps of that length); with stop_after the stream ends after that
    many steps (the process died). hold(task, k) is called before step k, as for SyntheticStdout."""

    def __init__(self, task: Task, warmup: int, batch_size: int, workers: int, pace: float = STEP_S,
                 hold=None, stop_after: int | None = None, pid: int | None = None, serves: bool = False) -> None:
        """serves: a server's stdout (a parameter server): its start event, then nothing until stopped."""
        self.task, self.warmup, self.batch_size, self.workers, self.serves = task, warmup, batch_size, workers, serves
        self.pace, self.hold, self.stop_after = pace, hold, stop_after
        self.pid = pid if pid is not None else 1000 + task.index
        self.stopped = threading.Event()
        self.k = -1  # -1: the start event is next

    def readline(self) -> bytes:
        if self.stopped.is_set() or (self.stop_after is not None and self.k >= self.stop_after):
            return b""
        if self.k < 0:
            self.k = 0
            return (json.dumps(worker.start_event(
                self.task.index, self.workers, self.pid, time.monotonic(), "synthetic", "mlp", 669_706,
                self.batch_size, role=self.task.role, model_bytes=2_678_824, input_shape=(784,))) + "\n").encode()
        if self.serves:
            self.stopped.wait()
            return b""
        k = self.k
        if self.hold is not None:
            self.hold(self.task, k)
        start = time.monotonic()
        if self.stopped.wait(self.pace):
            return b""
        self.k += 1
        phase = worker.PHASE_WARMUP if k < self.warmup else worker.PHASE_MEASURED
        return (json.dumps(worker.step_event(k, phase, start, time.monotonic(), self.batch_size * self.workers,
                                             0.5)) + "\n").encode()


class ContinuousProcess:
    """A TaskProcess that steps until stopped (exit code -15 then, as SIGTERM gives)."""

    def __init__(self, stdout: ContinuousStdout, code: int = -15) -> None:
        self.stdout = stdout
        self.code = code
        self.stopped = False

    def wait(self) -> int:
        return self.code

    def stop(self, grace: float) -> None:
        self.stopped = True
        self.stdout.stopped.set()

    def failure(self, code: int) -> str | None:
        return None


class SyntheticProcess:
    """A TaskProcess that has already run: its stdout is all there is to read."""

    def __init__(self, stdout: SyntheticStdout, code: int = 0) -> None:
        self.stdout = stdout
        self.stopped = False
        self.code = code

    def wait(self) -> int:
        return self.code

    def stop(self, grace: float) -> None:
        self.stopped = True

    def failure(self, code: int) -> str | None:
        return None


class SyntheticTestbed:
    """runner.Testbed: the embedded testbed's topology and journaled changes on fake
    adapters, and stand-in workers that report `job.warmup` + `job.steps` steps."""

    kind = "synthetic"

    def __init__(self, journal: Journal, backend: str = "userspace", hold=None,
                 chief_stops_after: int | None = None, pace: float = STEP_S, paces: dict | None = None) -> None:
        """hold(task, k): called by each stand-in before its step k (tests pace the steps with it);
        chief_stops_after: the chief (worker 0) stops after that many steps and exits with 1
        (in every launch). A task started with --until-stopped steps every `pace` s until
        stopped (`paces`: worker index -> its own pace, for workers that step at their own pace).
        `applied` lists every profile applied, in order (`applied_pairs` each one's per-pair
        topology, or None; `applied_at` when on the monotonic clock); `spawned` every task started."""
        self.journal, self.backend = journal, backend
        self.hold, self.chief_stops_after, self.pace, self.paces = hold, chief_stops_after, pace, paces or {}
        self.applied_at: list[float] = []
        self.applied: list = []
        self.applied_pairs: list = []  # each apply's run.pairs (None for a run without a topology)
        self.spawned: list = []
        qdiscs, iptables, engines, self._calls = make_fakes()
        self.fakes = (qdiscs, iptables, engines)
        self.executor = Executor(journal=journal, qdiscs=qdiscs, iptables=iptables, engines=engines)
        self.topology = None
        self.config = None
        self.finished = False

    def prepare(self, config, needed: int) -> BackendChoice:
        self.config = config
        self.topology = plan_topology(needed, ipaddress.ip_network("10.213.0.0/24"))
        return BackendChoice(self.backend, "synthetic testbed")

    def start(self):
        return self.topology

    def nodes_for(self, job, workers: int):
        return self.topology.nodes[:nodes_needed(job, workers)]

    def apply(self, run, seed: int) -> None:
        network = run.pairs or run.profile  # as the embedded testbed applies it
        self.executor.apply(backends.plan_network(network, self.topology, self.backend, seed=seed))
        self.applied.append(run.profile)
        self.applied_at.append(time.monotonic())
        self.applied_pairs.append(run.pairs)
        for fake in self.fakes:  # the fakes log every call for tests; a long sweep needs none of it
            fake.calls.clear()
        self._calls.clear()
        self.job, self.workers = run.job or self.config.job, run.workers or self.config.workers

    def verify(self, run, observer):
        return None

    def spawn(self, task: Task, log, env: dict):
        chief = task.index == 0 and task.role == "worker"
        stop_after = self.chief_stops_after if chief else None
        self.spawned.append(task)
        if "--until-stopped" in task.argv:
            pid = 1000 + len(self.spawned)  # a fresh pid per started process
            pace = self.paces.get(task.index, self.pace) if task.role == "worker" else self.pace
            return ContinuousProcess(ContinuousStdout(task, self.job.warmup, self.job.batch_size, self.workers,
                                                      pace, self.hold, stop_after, pid=pid, serves=task.serves),
                                     code=1 if stop_after is not None else -15)
        return SyntheticProcess(SyntheticStdout(task, self.job.warmup, self.job.steps, self.job.batch_size,
                                                self.workers, self.hold, stop_after),
                                code=1 if stop_after is not None else 0)

    def finish(self, note) -> None:
        self.executor.apply(ch.plan_clear(self.topology))
        self.finished = True
