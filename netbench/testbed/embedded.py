"""The embedded testbed: network namespaces on this machine (netns.py), as a Target (base.py).

For commands it plans a profile for the testbed that is up, applies it through the executor
into the journal, reads it back, resets and checks this machine. For sweeps it probes the
backend, uses the testbed that is up (or brings one up and takes it down again), applies each
run's profile and starts tasks in the node namespaces.
"""

from __future__ import annotations

from typing import Callable

from netbench.emulation import backends, changes as ch
from netbench.emulation.executor import BackendChoice, choose_backend, real_executor
from netbench.emulation.held import held_from_entries
from netbench.errors import ResetIncomplete, TestbedError, UsageError
from netbench.testbed.base import EMBEDDED, Planned
from netbench.state.journal import Journal, Lock
from netbench.testbed import netns as local
from netbench.model.topology import Node, Topology
from netbench.model.pairs import PairTopology, check_nodes


class EmbeddedTestbed:
    """Network namespaces on this machine (a base.Target), under the journal's lock for each
    command's changes and for the whole of a sweep."""

    kind = "embedded"

    def __init__(self, journal: Journal, backend: str | None = None, adapters: tuple | None = None,
                 discover: Callable[[], Topology | None] | None = None,
                 probe: Callable[[], tuple[bool, str]] | None = None) -> None:
        """adapters: (qdiscs, iptables, engines) for the commands [default: the kernel's];
        discover, probe: find the testbed that is up, probe for netem [default: this machine's].
        Tests pass fakes for all three."""
        self.adapters = adapters
        self._discover = discover
        self._probe = probe
        self.journal = journal
        self.requested = backend
        self.lock = Lock(journal.dir)
        self.topology: Topology | None = None
        self.brought_up = False
        self.needed = 0
        self.executor = None
        self._commands = None  # the executor of apply_plan (commands), made on first use
        self.held_pairs: PairTopology | None = None  # what show() read back, when nodes shape per pair
        self._spawn = None  # jobs.launch.LocalSpawner, made on first use (a sweep's; `apply` needs none)
        self.congestion: str | None = None  # the sweep's --congestion-control (None: the nodes' own)
        self.congestion_default: str | None = None  # set: self.congestion is the embedded default, not asked for
        self.congestion_withheld: str | None = None  # why a sandbox without root keeps the host's default
        self._congestion_set: list = []  # its journal entries, put back by finish()
        self.capacity = None  # testbed/compute.py NodeCapacity: the sweep's CPU limits and step delays

    @property
    def spawn(self):
        """How a sweep starts a process in a node (jobs.launch.LocalSpawner), imported on first
        use: `netbench apply` and the other quick commands never start one."""
        if self._spawn is None:
            from netbench.jobs.launch import LocalSpawner

            self._spawn = LocalSpawner(self.journal)
        return self._spawn

    # ---------------------------------------------------------------- commands

    def plan(self, profile, backend: str | None, probe: bool = True) -> Planned:
        """The changes `profile` (a Profile, or a PairTopology: a profile per ordered pair of
        nodes) makes on the testbed that is up, with the backend chosen for it."""
        if self._discover is not None:
            topology = self._discover()
        else:  # read back through the sockets the change will use
            topology = local.discover(self._command_executor().qdiscs.socket)
        if topology is None:
            raise TestbedError("no testbed is up", hint="start one with 'netbench testbed up'")
        requested = None if backend == "auto" else backend
        choice = choose_backend(requested, self._probe) if self._probe else choose_backend(requested)
        if isinstance(profile, PairTopology):
            check_nodes(profile, [node.name for node in topology.nodes], "the testbed")
        held = held_from_entries(self.journal.pending())
        return Planned(profile=profile, backends={EMBEDDED: choice.name}, reasons={EMBEDDED: choice.reason},
                       changes={EMBEDDED: tuple(backends.plan_network(profile, topology, choice.name, held=held))},
                       basis=(held, topology))

    def apply_plan(self, planned: Planned, on_change: Callable | None = None, **options) -> None:
        """Make the changes under the journal's lock, in place where the link is live; delay
        engines outlive this process. If what netbench holds changed since the plan was made
        (another command in between), the same profile is planned again under the lock."""
        from netbench.emulation.executor import Executor

        if self.adapters is None:
            executor = self._command_executor()
            executor.on_change = on_change
        else:
            qdiscs, iptables, engines = self.adapters
            executor = Executor(journal=self.journal, qdiscs=qdiscs, iptables=iptables, engines=engines,
                                on_change=on_change)
        with Lock(self.journal.dir):
            changes = list(planned.changes[EMBEDDED])
            if planned.basis is not None:
                held, topology = planned.basis
                now = executor.held()
                if now != held:
                    changes = backends.plan_network(planned.profile, topology, planned.backends[EMBEDDED], held=now)
            executor.apply(changes)

    def _command_executor(self):
        """One executor for every command-line change this process makes (a schedule makes many):
        its netlink sockets stay open between them."""
        if self._commands is None:
            self._commands = real_executor(self.journal, detach_engines=True, hold=True)
        return self._commands

    def show(self) -> dict:
        """{"nodes": one row per node: backend, profile, qdisc, engine} ({"nodes": []}: no testbed),
        and "pairs" (PairTopology.to_json) when the nodes shape per destination: the topology
        they hold, also kept as `held_pairs` (None otherwise), as HostsTestbed.show does."""
        from netbench.emulation.engines import Engines
        from netbench.emulation.iptables import Iptables
        from netbench.emulation.netlink.qdisc import NetlinkQdiscs
        from netbench.emulation.executor import read_emulation, recorded_distributions
        from netbench.emulation.readback import pairs_from_rows

        self.held_pairs = None
        topology = (self._discover or local.discover)()
        if topology is None:
            return {"nodes": []}
        qdiscs, iptables, engines = self.adapters or (NetlinkQdiscs(), Iptables(), Engines(self.journal.dir))
        rows = read_emulation(topology, qdiscs, iptables, engines, recorded_distributions(self.journal))
        self.held_pairs = pairs_from_rows(rows, topology)
        return {"nodes": rows} if self.held_pairs is None else {"nodes": rows, "pairs": self.held_pairs.to_json()}

    def reset(self, warn: Callable[[str], None], all_namespaces: bool = False) -> dict[str, list[str]]:
        """Undo every journal entry, under the lock (never while a command is making changes);
        `all_namespaces`: also the testbed namespaces the journal did not record."""
        from netbench.state.reset import reset

        if self._commands is not None:  # its sockets would keep the removed namespaces alive
            self._commands.close()
        with Lock(self.journal.dir):
            try:
                return {EMBEDDED: reset(self.journal, warn=warn, all_namespaces=all_namespaces)}
            except ResetIncomplete as exc:
                exc.removed = {EMBEDDED: exc.removed}
                raise

    def doctor(self, tensorflow: bool):
        """This machine's checks (experiment.doctor.Report)."""
        from netbench.experiment import doctor

        return doctor.run_doctor(tensorflow=tensorflow)

    # ---------------------------------------------------------------- sweeps and runs

    def prepare(self, config, needed: int) -> BackendChoice:
        """Take the lock, probe the backend and check the testbed that is up; changes nothing."""
        self.lock.__enter__()
        try:
            self.spawn.run_as = getattr(config, "run_as", None)  # the user job processes run as
            self._choose_congestion(getattr(config, "congestion_control", None))
            backend = choose_backend(self.requested)
            from netbench.testbed.compute import NodeCapacity

            self.capacity = NodeCapacity(self.journal)
            self.capacity.prepare(config.runs)
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

    def _choose_congestion(self, requested: str | None) -> None:
        """The nodes' congestion control for the sweep: the one asked for (checked against the
        kernel), none with 'host', else the embedded default (cubic) where the kernel has it."""
        from netbench.model import congestion as cc
        from netbench.testbed import congestion

        if requested and requested != cc.HOST:
            congestion.check_available(requested, "congestion control")
        elif requested is None:
            try:  # loads tcp_cubic where it is a module; a kernel without it keeps the nodes' own
                congestion.check_available(cc.EMBEDDED_DEFAULT, "congestion control")
            except UsageError:
                pass
        if congestion.rootless():  # only the host's allowed list: the default where it is in it
            allowed = congestion.allowed()  # a sysctl read and the holds folder's: once
            self.congestion, default = cc.rootless_choice(requested, allowed)
            if requested is None and not default:
                self.congestion_withheld = cc.withheld_note(allowed)
        else:
            self.congestion, default = cc.embedded_choice(requested, congestion.available())
        self.congestion_default = self.congestion if default else None

    def start(self) -> Topology:
        if self.topology is None:
            self.topology = local.up(self.needed, self.journal)
            self.brought_up = True
        self.executor = real_executor(self.journal, hold=True)
        if self.congestion:
            from netbench.testbed import congestion

            self._congestion_set = congestion.set_on_nodes(self.journal, self.topology.nodes, self.congestion)
        if self.capacity is not None:
            self.capacity.start(self.topology.nodes, self.spawn)
        return self.topology

    def unshaped_links(self) -> bool:
        """Clear the shaping netbench holds on the nodes' links (what a `netbench apply` left
        before the sweep), so the calibrations measure unshaped links; True when there was any.
        The sweep's first point applies its own profile, and its end clears the links, anyway."""
        held = self.executor.held()
        if not (held.roots or held.ingress or held.engines or held.rules or not held.exact):
            return False
        self.executor.apply(ch.plan_clear(self.topology))
        return True

    def congestion_control(self) -> dict[str, str]:
        """Each node's TCP congestion control (the results depend on it: cubic and bbr carry
        different state across a launch's changes)."""
        return {node.name: local.congestion_control(node.netns) for node in self.topology.nodes}

    def nodes_for(self, job, workers: int) -> tuple[Node, ...]:
        """Nodes in placement order: n1, n2, ..."""
        return self.topology.nodes

    def link_counters(self, nodes) -> dict[str, tuple[int, int]]:
        """node -> (rx_bytes, tx_bytes) of each named node's interface, read in its namespace
        (a user's command that reports no steps is measured by them: experiment/link_window.py)."""
        by_name = {node.name: node for node in self.topology.nodes}
        return {name: local.link_counters(by_name[name].netns, by_name[name].ifname) for name in nodes}

    def apply(self, run, seed: int) -> None:
        """One run's network (its per-pair topology if it has one, else its profile), changed in
        place from the last (the sweep holds the lock)."""
        network = run.pairs or run.profile
        self.executor.apply(backends.plan_network(network, self.topology, self.backend.name, seed=seed,
                                                  held=self.executor.held()))
        if self.capacity is not None:
            self.capacity.apply(run.compute)

    def schedule_thread(self):
        """Entered on a run's schedule thread for its life: that thread's own netlink sockets,
        held across its changes (pyroute2's belong to the thread that made them)."""
        from contextlib import nullcontext

        holding = getattr(self.executor.qdiscs, "holding", None) if self.executor is not None else None
        return holding() if holding is not None else nullcontext()

    def emulation_lost(self) -> str | None:
        """What of the applied emulation died since it was applied (a delay engine), or None;
        the runner fails a run that ends with any."""
        lost = self.executor.lost() if self.executor is not None else []
        return "; ".join(lost) or None

    def verify(self, run, observer):
        if run.pairs is not None:
            from netbench.experiment.verify_pairs import verify_pairs_point

            return verify_pairs_point(run, self.topology, observer)
        from netbench.experiment.verify import verify_point  # a sweep's --verify only: not on apply's path

        return verify_point(run, self.topology, observer)

    def finish(self, note: Callable[[str], None]) -> None:
        """Put the nodes' congestion control back, clear the shaping (or take down the testbed this
        sweep brought up); release the lock."""
        try:
            if self.capacity is not None:
                for problem in self.capacity.finish(self.spawn):
                    note(f"{problem} (left for 'netbench reset')")
            if self._congestion_set:
                from netbench.testbed import congestion

                entries, self._congestion_set = self._congestion_set, []
                try:
                    congestion.restore(self.journal, entries)
                except TestbedError as exc:  # journaled still: the rest goes on, reset tries again
                    note(f"{exc.message} ({exc.hint})")
            if self.executor is not None and self.topology is not None and not self.brought_up:
                self.executor.apply(ch.plan_clear(self.topology))
            if self.executor is not None:
                self.executor.close()  # a socket would keep a removed namespace alive
            if self.brought_up:
                local.down(self.journal)
                note("took down the testbed this run brought up")
            self.journal.compact()
        finally:
            if self.executor is not None:
                self.executor.close()
            self.lock.__exit__(None, None, None)
