"""The embedded testbed as the runner sees it: namespaces on this machine (see local.py).

`EmbeddedTestbed` is the runner's Testbed for the local case: it probes the backend, uses
the testbed that is up (or brings one up and takes it down again), applies each run's
profile through the executor into the journal, and starts tasks in the node namespaces.
"""

from __future__ import annotations

from typing import Callable

from netbench.emulation import backends, changes as ch
from netbench.emulation.executor import BackendChoice, choose_backend, real_executor
from netbench.errors import TestbedError
from netbench.jobs.launch import LocalSpawner
from netbench.state.journal import Journal, Lock
from netbench.testbed import netns as local
from netbench.model.topology import Node, Topology


class EmbeddedTestbed:
    """Network namespaces on this machine, under the journal's lock for the whole sweep."""

    kind = "embedded"

    def __init__(self, journal: Journal, backend: str | None = None) -> None:
        self.journal = journal
        self.requested = backend
        self.lock = Lock(journal.dir)
        self.topology: Topology | None = None
        self.brought_up = False
        self.needed = 0
        self.executor = None
        self.spawn = LocalSpawner(journal)

    def prepare(self, config, needed: int) -> BackendChoice:
        """Take the lock, probe the backend and check the testbed that is up; changes nothing."""
        self.lock.__enter__()
        try:
            backend = choose_backend(self.requested)
            self.topology = local.discover()
            if self.topology is not None and len(self.topology.nodes) < needed:
                raise TestbedError(f"the testbed that is up has {len(self.topology.nodes)} nodes; "
                                   f"the runs need {needed} (strategy {config.job.strategy}, "
                                   f"{config.workers} workers)",
                                   hint="take it down with 'netbench testbed down' or use fewer --workers")
        except BaseException:
            self.lock.__exit__(None, None, None)
            raise
        self.backend = backend
        self.needed = needed
        return backend

    def start(self) -> Topology:
        if self.topology is None:
            self.topology = local.up(self.needed, self.journal)
            self.brought_up = True
        self.executor = real_executor(self.journal)
        return self.topology

    def nodes_for(self, job, workers: int) -> tuple[Node, ...]:
        """Nodes in placement order: n1, n2, ..."""
        return self.topology.nodes

    def apply(self, run, seed: int) -> None:
        self.executor.apply(backends.plan_apply(run.profile, self.topology, self.backend.name, seed=seed))

    def verify(self, run, observer):
        from netbench.experiment.verify import verify_point

        return verify_point(run, self.topology, observer)

    def finish(self, note: Callable[[str], None]) -> None:
        """Clear the shaping (or take down the testbed this sweep brought up); release the lock."""
        try:
            if self.executor is not None and self.topology is not None and not self.brought_up:
                self.executor.apply(ch.plan_clear(self.topology))
            if self.brought_up:
                local.down(self.journal)
                note("took down the testbed this sweep brought up")
            self.journal.compact()
        finally:
            self.lock.__exit__(None, None, None)
