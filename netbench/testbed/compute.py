"""A sweep's compute capacity per node on the embedded testbed: CPU limits and step delays.

`prepare` checks every run's limits against the cores a node may use and finds this machine's
cgroups (before anything is made); `start` makes a group per limited node (journaled first:
emulation/cgroups.py) and a step-delay file per node, and tells the spawner to start each
node's processes in its group with its file (jobs/launch.py LocalSpawner); `apply` sets one
point's limits (a schedule's changes too); `finish` removes the groups and files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from netbench.emulation import cgroups as cg
from netbench.jobs.harness import step_delay
from netbench.model import compute as cm
from netbench.model.run import computes
from netbench.state.journal import STEP_DELAY_DIR

DELAY_DIR = STEP_DELAY_DIR  # under the state dir: one file per node, the seconds its ranks add (reset removes it)


def sweep_computes(runs: Sequence) -> tuple[cm.Compute, ...]:
    """Every node capacity any run holds (its own, and its schedule's)."""
    return tuple(c for run in runs for c in computes(run))


def refuse_without_root() -> None:
    """CPU limits need groups this user may make: without root, a cgroup v2 subtree delegated to
    them; this netbench makes none there yet, so a limit is refused in one line, before anything
    is made (docs/guide/without-root.md)."""
    import os

    from netbench.errors import UsageError
    from netbench.state import places
    from netbench.testbed import rootless

    if places.privilege(os.environ, os.geteuid()) != places.ROOTLESS:
        return
    raise UsageError(f"flag --cpus: {rootless.cpus_withheld(cg.cpu_on_v1(), cg.delegated_v2() is not None)}",
                     hint=rootless.CPUS_FIX)


class NodeCapacity:
    """The per-node limits of one sweep (nothing at all when no run limits a node)."""

    def __init__(self, journal, detect: Callable[[], cg.Cgroups] = cg.detect,
                 cores: Callable[[], int] = cg.cores) -> None:
        self.journal, self._detect, self._cores = journal, detect, cores
        self.cpu_nodes: set[str] = set()  # nodes (or cm.ALL) some run limits
        self.delays = False  # some run gives a node a step delay
        self.groups: cg.NodeGroups | None = None
        self.group_of: dict[str, str] = {}  # node -> its group's name
        self.delay_file: dict[str, Path] = {}  # node -> its step-delay file
        self.applied: cm.Compute | None = None

    def prepare(self, runs: Sequence) -> None:
        held = sweep_computes(runs)
        self.cpu_nodes = {node for c in held for node, _ in c.cpus}
        self.delays = any(c.step_delay_s for c in held)
        if self.cpu_nodes:
            refuse_without_root()
            cores = self._cores()
            for c in held:
                cm.check_cores(c, cores, "flag --cpus")
            self.groups = cg.NodeGroups(self.journal, self._detect())

    def start(self, nodes: Sequence, spawner) -> None:
        """Groups and delay files for `nodes` (topology Nodes); the spawner's maps set."""
        for node in nodes:
            if self.groups is not None and (node.name in self.cpu_nodes or cm.ALL in self.cpu_nodes):
                name = cg.group_name(node.netns)
                spawner.cgroups[node.name] = str(self.groups.create(name))
                self.group_of[node.name] = name
            if self.delays:
                folder = Path(self.journal.dir) / DELAY_DIR
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / node.netns
                step_delay.write(str(path), 0.0)
                self.delay_file[node.name] = path
                spawner.node_env[node.name] = {step_delay.ENV_FILE: str(path)}
        self.apply(cm.NONE)  # unlimited until a point says otherwise (the model's calibrations run so)

    def apply(self, compute: cm.Compute) -> None:
        """One point's limits on every node that has a group or a file (unnamed: unlimited)."""
        if compute == self.applied:
            return
        for node, name in self.group_of.items():
            self.groups.limit(name, compute.cpus_of(node))
        for node, path in self.delay_file.items():
            step_delay.write(str(path), compute.delay_of(node))
        self.applied = compute

    def throttled(self) -> dict[str, dict[str, int]]:
        """node -> its group's cpu.stat counts (nr_periods, nr_throttled, throttled_us)."""
        return {node: self.groups.cgroups.throttled(name) for node, name in self.group_of.items()}

    def finish(self, spawner) -> list[str]:
        """Remove the groups and files; what could not be removed (left journaled for reset)."""
        problems = self.groups.remove_all() if self.groups is not None else []
        for path in self.delay_file.values():
            try:
                path.unlink()
            except OSError:
                pass
        if self.delay_file:
            try:
                (Path(self.journal.dir) / DELAY_DIR).rmdir()  # another sweep's files keep it
            except OSError:
                pass
        self.group_of.clear()
        self.delay_file.clear()
        spawner.cgroups.clear()
        spawner.node_env.clear()
        self.applied = None
        return problems
