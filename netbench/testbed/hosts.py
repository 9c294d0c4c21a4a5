"""SSH hosts as a Target (base.py): every command and a sweep over an inventory.

For commands, `HostsTestbed` plans a profile per host (asking each what it has), sends each
host its plan, reads back, resets and checks the hosts, all in parallel over SSH.

For sweeps it gives the runner the inventory's hosts as nodes:

- prepare: place every run's job on hosts (pure: enough hosts, roles, a tf_address for
  each), ask each host what it has (`netbench node info`), and plan every run's profile
  for every host, so bad input fails before anything is applied;
- apply: send each host its plan (`netbench node apply --json --lease S`) into the host's
  own journal; the lease is renewed by a LeaseKeeper while the sweep runs;
- spawn: start a task with `netbench node task` over its own SSH channel (RemoteTask): the
  host journals the process, relays its step events on stdout, and stops it (TERM to its
  process group, then KILL) when the channel's stdin closes or the connection drops;
- finish: `netbench node reset` on every host (shaping, lease, watcher, left processes).

A host that drops out (its SSH connection closes) ends the run as `failed`, naming the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from netbench.emulation.executor import BackendChoice
from netbench.errors import NetbenchError, ResetIncomplete, UsageError
from netbench.remote.inventory import Host, Inventory
from netbench.model.job import COORDINATOR, PS, JobSpec, Task, nodes_needed, placement
from netbench.jobs.launch import TaskLost, Timeouts
from netbench.state.lease import DEFAULT_LEASE_S
from netbench.remote.ssh import HostConnection
from netbench.model.pairs import PairTopology
from netbench.model.topology import Node, Topology
from netbench.testbed.base import Planned
from netbench.testbed.host_task import RemoteTask, task_pid  # noqa: F401 - re-exported

STOP_GRACE_S = 3.0  # TERM, then KILL this much later (on the host)


# ---------------------------------------------------------------- placement (pure)

def _inventory_roles(role: str, index: int, strategy: str) -> tuple[str, ...]:
    """Inventory roles (chief, worker, ps) that may take a job process, preferred first."""
    if role == PS:
        return ("ps",)
    if role == COORDINATOR:
        return ("chief",)
    if index == 0 and strategy != "ps":  # the all-reduce chief
        return ("chief", "worker")
    return ("worker", "chief")


def place_hosts(inventory: Inventory, job: JobSpec, workers: int) -> tuple[Host, ...]:
    """The hosts for the job's processes, in placement order (cluster.placement): each host
    takes one process its `roles` allow; every chosen host needs a tf_address."""
    slots = placement(job, workers)
    needed = nodes_needed(job, workers)
    if needed > len(inventory.hosts):
        raise UsageError(f"{inventory.path}: hosts: strategy {job.strategy} with {workers} workers"
                         + (f" and {job.ps} ps" if job.strategy == "ps" else "")
                         + f" needs {needed} hosts, the inventory has {len(inventory.hosts)}",
                         hint="add hosts to the inventory, or use fewer --workers")
    free = list(inventory.hosts)
    chosen: dict[int, Host] = {}
    # the scarcest roles first (coordinator, parameter servers), so workers do not take their hosts
    order = sorted(range(len(slots)), key=lambda i: {COORDINATOR: 0, PS: 1}.get(slots[i][0], 2))
    for position in order:
        role, index = slots[position]
        allowed = _inventory_roles(role, index, job.strategy)
        candidates = [(allowed.index(wanted), len(h.roles) if role in (COORDINATOR, PS) else 0, i, h)
                      for i, h in enumerate(free) for wanted in allowed if wanted in h.roles]
        # a preferred role first; for the scarce roles the most specialised host; then inventory order
        host = min(candidates, key=lambda c: c[:3])[3] if candidates else None
        if host is None:
            raise UsageError(f"{inventory.path}: hosts: no host left that may take {role}{index} "
                             f"(it needs roles: {' or '.join(allowed)})",
                             hint="give more hosts that role in their 'roles' list")
        free.remove(host)
        chosen[position] = host
    hosts = tuple(chosen[i] for i in range(len(slots)))
    for host in hosts:
        if not host.tf_address:
            raise UsageError(f"{inventory.path}: hosts.{host.name}.tf_address: missing; a host that runs "
                             "a job process needs the address TensorFlow uses there",
                             hint="set tf_address to the host's address on the data-plane interface")
    return hosts


def host_node(host: Host) -> Node:
    from netbench.remote.agent import HOST_NETNS

    return Node(name=host.name, netns=HOST_NETNS, ifname=host.interface, address=host.tf_address or "",
                prefixlen=32, port="")


def task_command(host: Host, task: Task, env: dict[str, str], grace: float = STOP_GRACE_S) -> str:
    """The shell command that runs `task` on `host` through `netbench node task` (pure).

    The task's argv[0] (the controller's Python) becomes the Python of the host's venv; a
    user's command (a task with its own environment) runs as written: it must exist there."""
    from netbench.remote.controller import node_command

    argv = list(task.argv) if task.command else [f"{host.venv}/bin/python", *task.argv[1:]]
    variables = {**dict(task.env), **({"TF_CONFIG": task.tf_config} if task.tf_config else {}), **env}
    options = ["--role", f"{task.role}{task.index}", "--grace", f"{grace:g}"]
    for name, value in variables.items():
        options += ["--env", f"{name}={value}"]
    return node_command(host, ["task", *options, "--", *argv])


# ---------------------------------------------------------------- the testbed

@dataclass
class _Applied:
    backends: dict[str, str]
    plans: dict[str, dict[str, list]]  # run id -> host -> changes


@dataclass(frozen=True)
class HostsReport:
    """doctor over an inventory: (check, status, detail) rows per host; ready when every
    host's checks are ok or limited."""

    path: str
    rows: dict[str, list[tuple[str, str, str]]]
    ready: bool


def controller_tensorflow() -> str | None:
    """The TensorFlow version this controller has installed (None: none)."""
    from importlib import metadata

    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


class HostsTestbed:
    """The inventory's hosts (a base.Target): commands drive them; a sweep runs on them."""

    kind = "hosts"

    def __init__(self, inventory: Inventory, conns: Sequence[HostConnection], backend: str | None = None,
                 lease_s: float = DEFAULT_LEASE_S, takeover: bool = False,
                 startup_s: float = Timeouts().startup_s) -> None:
        from netbench.state.lease import new_holder

        self.inventory = inventory
        self.startup_s = startup_s  # for a task's first line (its pid); prepare() takes the sweep's
        self.conns = list(conns)
        self.by_name = {h.name: h for h in inventory.hosts}
        self.conn_by_name = {c.name: c for c in self.conns}
        self.requested = backend
        self.lease_s = lease_s
        self.holder = new_holder()  # this sweep's lease token on every host
        self.takeover = takeover
        self.planned: _Applied | None = None
        self.keeper = None
        self.applied = False
        self.held_pairs: PairTopology | None = None  # what show() read back, when hosts shape per pair
        self.infos: dict[str, dict] = {}  # each host's `netbench node info`, once prepare() asked

    # ---------------------------------------------------------------- commands

    def plan(self, profile, backend: str | None, probe: bool = True) -> Planned:
        """Each host's backend (asked with 'netbench node info') and changes for `profile` (a
        Profile, or a PairTopology: each host shapes its egress toward the other hosts'
        tf_addresses as its row says; its nodes are the inventory's host names, checked
        before any host is asked). probe=False with a backend given plans without contacting
        any host."""
        from netbench.remote import controller as remote
        from netbench.remote.pairs import check_inventory_nodes

        requested = None if backend in (None, "auto") else backend
        if isinstance(profile, PairTopology):
            check_inventory_nodes(profile, self.inventory)
        if not probe and requested is not None:
            topology = remote.hosts_topology(self.inventory)
            return Planned(profile=profile, backends={h.name: requested for h in self.inventory.hosts},
                           changes={h.name: tuple(remote.plan_network_for_host(profile, h, requested, topology))
                                    for h in self.inventory.hosts}, probed=False)
        planned = remote.plan_inventory(self.inventory, self.conns, profile, requested)
        return Planned(profile=profile, backends=planned.backends,
                       changes={name: tuple(changes) for name, changes in planned.plans.items()})

    def apply_plan(self, planned: Planned, on_change: Callable | None = None, lease_s: float = 0.0,
                   force: bool = False, holder: str | None = None) -> None:
        """Send each host its plan with the lease taken for `holder`; a failure on any host
        leaves every host unshaped (remote.apply_inventory)."""
        from netbench.remote import controller as remote

        remote.apply_inventory(self.inventory, self.conns,
                               remote.RemoteApply(backends=dict(planned.backends),
                                                  plans={k: list(v) for k, v in planned.changes.items()}),
                               lease_s=lease_s, force=force, holder=holder, takeover=self.takeover)

    def show(self) -> dict:
        """{"hosts": host -> its 'netbench node show' answer (nodes, lease, watchers, pending)},
        and "pairs" (PairTopology.to_json) when hosts shape per destination: the topology they
        hold, also kept as `held_pairs` (None otherwise)."""
        from netbench.remote import controller as remote
        from netbench.remote.pairs import hosts_pairs

        shown = {"hosts": remote.show_inventory(self.inventory, self.conns)}
        self.held_pairs = hosts_pairs(shown["hosts"], remote.hosts_topology(self.inventory))
        return shown if self.held_pairs is None else {**shown, "pairs": self.held_pairs.to_json()}

    def reset(self, warn: Callable[[str], None], all_namespaces: bool = False) -> dict[str, list[str]]:
        """Each host's journal undone (host -> what it removed), then this controller's own
        leftovers (a killed sweep's metrics target file) under base.EMBEDDED. A host never
        removes namespaces: `all_namespaces` is refused."""
        from netbench.metrics.exporter import remove_stale_targets, targets_dir
        from netbench.remote import controller as remote
        from netbench.testbed.base import EMBEDDED

        if all_namespaces:
            raise UsageError("flag --all-namespaces: only without --inventory",
                             hint="a host never removes namespaces; it undoes its own journal")
        try:
            removed = remote.reset_inventory(self.inventory, self.conns)
        except ResetIncomplete as exc:  # the controller's own leftovers still go
            exc.removed = {**exc.removed, EMBEDDED: list(remove_stale_targets(targets_dir()))}
            raise
        return {**removed, EMBEDDED: list(remove_stale_targets(targets_dir()))}

    def doctor(self, tensorflow: bool) -> HostsReport:
        """Every check on every host, in parallel; a host that fails early is 'missing'."""
        from netbench.remote import controller as remote

        version = controller_tensorflow() if tensorflow else None
        results = remote.in_parallel(self.conns, lambda c: remote.doctor_host(c, self.by_name[c.name], version))
        rows = {name: (r if not isinstance(r, Exception) else [("reachable", "missing", r.message)])
                for name, r in results.items()}
        if not tensorflow:
            rows = {name: [row for row in r if row[0] != "tensorflow"] for name, r in rows.items()}
        ready = all(all(status in ("ok", "limited") for _, status, _ in r) for r in rows.values())
        return HostsReport(path=self.inventory.path, rows=rows, ready=ready)

    # ---------------------------------------------------------------- sweeps and runs

    def prepare(self, config, needed: int) -> BackendChoice:
        """Place every run, probe every host and plan every run's profile; changes nothing."""
        from netbench.remote import controller as remote

        refuse_schedules(config)
        runs = config.runs
        self.startup_s = config.timeouts.startup_s
        for run in runs:
            place_hosts(self.inventory, run.job, run.workers)
        infos = remote.probe_hosts(self.inventory, self.conns)
        self.infos = infos
        backends: dict[str, str] = {}
        plans: dict[str, dict[str, list]] = {}
        for run in runs:
            planned = remote.plan_hosts(self.inventory, infos, run.profile, self.requested)
            backends = planned.backends
            plans[run.run_id] = planned.plans
        names = sorted(set(backends.values())) or ["userspace"]
        self.planned = _Applied(backends, plans)
        reason = "; ".join(f"{name}: {backends.get(name, '?')} ({infos[name].get('backend_reason', '?')})"
                           for name in self.by_name)
        if "userspace" in names:
            reason += "; a host without netem shapes rate only (tbf)"
        return BackendChoice(name="/".join(names), reason=f"remote hosts: {reason}")

    def start(self) -> Topology:
        nodes = tuple(host_node(h) for h in self.inventory.hosts)
        return Topology(nodes=nodes, subnet=f"hosts of {self.inventory.path}", switch_netns="", bridge="")

    def provenance(self, shard: str = "") -> dict:
        """Where the runs ran: the hosts' facts as their `netbench node info` gave them, joined
        (netbench.provenance.combine), in the inventory's order."""
        from netbench import provenance

        return provenance.combine([self.infos.get(name, {}) for name in self.by_name], shard)

    def congestion_control(self) -> dict[str, str]:
        """Each host's TCP congestion control, as its `netbench node info` said ("" if it did not)."""
        return {name: str(info.get("tcp_congestion_control", "")) for name, info in self.infos.items()}

    def nodes_for(self, job: JobSpec, workers: int) -> tuple[Node, ...]:
        return tuple(host_node(h) for h in place_hosts(self.inventory, job, workers))

    def apply(self, run, seed: int) -> None:
        from netbench.remote import controller as remote

        if self.keeper is not None and self.keeper.lost:
            lost = "; ".join(f"host {name}: {why}" for name, why in self.keeper.lost.items())
            raise remote.RemoteError(f"lost the lease on {lost}", hint="renewals did not reach the host in time")
        planned = remote.RemoteApply(backends=self.planned.backends, plans=self.planned.plans[run.run_id])
        if self.keeper is None and self.lease_s > 0:
            from netbench.remote.keeper import LeaseKeeper

            # renewing from before the first change: a host whose apply returns first (its
            # lease taken) is renewed while the others still apply, however long they take
            self.keeper = LeaseKeeper(self.inventory, self.conns, self.lease_s, self.holder, holding=()).__enter__()
        self.applied = True
        try:
            remote.apply_inventory(self.inventory, self.conns, planned, lease_s=self.lease_s, holder=self.holder,
                                   takeover=self.takeover, on_applied=self.keeper.hold if self.keeper else None)
        except NetbenchError:
            if self.keeper is not None:  # a failed apply leaves every host reset: no lease is held
                self.keeper.holding.clear()
                self.keeper.lost.clear()
            raise

    def lease_lost(self, ended: float) -> str | None:
        """Why a run that ended at `ended` (time.time()) may not have had its profile: a host
        lost its lease (it reverted by itself) or cannot show it held the lease after the run
        (each host is asked again now); None when every host held it throughout."""
        if self.keeper is None:
            return None
        missing = self.keeper.confirm(after=ended)
        if not missing:
            return None
        return "lease not held through the run: " + "; ".join(
            why if why.startswith(f"host {name}") else f"host {name}: {why}" for name, why in missing.items())

    def spawn(self, task: Task, log: Path, env: dict) -> RemoteTask:
        host, conn = self.by_name[task.node], self.conn_by_name[task.node]
        try:
            stream = conn.start(task_command(host, task, env))
        except NetbenchError as exc:
            raise TaskLost(f"host {host.name}: cannot start {task.role}{task.index}: {exc.message}") from None
        return RemoteTask(conn, host, task, log, stream, self.startup_s)

    def link_counters(self, nodes) -> dict[str, tuple[int, int]]:
        """host -> (rx_bytes, tx_bytes) of each named host's data-plane interface, from its
        /proc/net/dev (the namespace the host's commands run in, as its jobs do) over the hosts'
        SSH connections, in parallel (experiment/link_window.py)."""
        from netbench.jobs.link_bytes import interface_counters
        from netbench.remote import controller as remote

        def read(conn) -> tuple[int, int]:
            interface = self.by_name[conn.name].interface
            result = conn.run("cat /proc/net/dev", timeout=10.0)
            counters = interface_counters(result.stdout, interface) if result.ok else None
            if counters is None:
                why = (result.stderr.strip()[:120] if not result.ok else f"no interface {interface} in /proc/net/dev")
                raise remote.RemoteError(f"host {conn.name}: cannot read its interface's counters: {why}")
            return counters

        results = remote.in_parallel([self.conn_by_name[name] for name in nodes], read)
        failed = next((r for r in results.values() if isinstance(r, NetbenchError)), None)
        if failed is not None:
            raise failed
        return dict(results)

    def verify(self, run, observer) -> dict | None:
        return None  # refused at the command line: verify measures between local namespaces

    def finish(self, note: Callable[[str], None]) -> None:
        """Stop renewing and reset every host (its shaping, lease, watcher and processes). A
        host that cannot be reached now reverts by itself when its lease runs out."""
        from netbench.remote import controller as remote

        if self.keeper is not None:
            settle = getattr(self.keeper, "settle", None)
            if self.applied and settle is not None:
                try:  # every host answers before any is reset: one taken over meanwhile is left alone
                    settle()
                except KeyboardInterrupt:
                    pass
            self.keeper.__exit__(None, None, None)
        if not self.applied:
            return
        lost = self.keeper.lost if self.keeper is not None else {}  # reverted, or another controller's now
        conns = [c for c in self.conns if c.name not in lost]
        # --holder: a host taken over between the keeper's last answer and now is left alone
        # (reset_inventory reads each answer's held_by into `kept`)
        kept: dict[str, str] = {}
        try:
            removed, failures = remote.reset_inventory(self.inventory, conns, self.holder, kept), []
        except ResetIncomplete as exc:
            removed, failures = exc.removed, exc.failures
        for name, holder in kept.items():
            note(f"host {name}: another controller took it over ({holder}); left alone")
        for line in failures:
            note(f"could not reset {line}; it reverts by itself when its {self.lease_s:g} s lease runs out, "
                 f"or run 'netbench reset --inventory {self.inventory.path}'")
        for name, lines in removed.items():
            if lines:
                note(f"host {name}: removed {', '.join(lines)}")


# ---------------------------------------------------------------- sweeps and playbooks over hosts

def refuse_schedules(config) -> None:
    """Schedules change the link during a run, and a congestion control is set, on the embedded testbed only."""
    if getattr(config, "congestion_control", None) not in (None, "host"):  # 'host': the hosts' own, as always
        raise UsageError("--congestion-control is embedded-only for now (a playbook's congestion_control: too)",
                         hint="drop --inventory, or set net.ipv4.tcp_congestion_control on the hosts yourself")
    limited = next((r for r in config.runs if getattr(r, "compute", None) is not None and r.compute.limited), None)
    if limited is not None:  # (a host's agent starts a task in a CPU limit; the controller cannot ask it yet)
        raise UsageError(f"run {limited.run_id}: --cpus and --step-delay are embedded-only for now",
                         hint="drop --inventory, or limit a host's task with 'netbench node task --cpus'")
    scheduled = next((run for run in config.runs if getattr(run, "schedule", None) is not None), None)
    if scheduled is not None:
        raise UsageError(f"schedule {scheduled.schedule.name}: not with --inventory: a schedule changes the link "
                         "during a run on the embedded testbed only", hint="drop --inventory, or the schedule")


def check_on_hosts(config, inventory_path: Path) -> Inventory:
    """Load the inventory and place every run on its hosts (no connection); bad input raises."""
    from netbench.remote.inventory import load_inventory

    if config.verify:
        raise UsageError("flag --verify: not with --inventory (it measures between local namespaces)",
                         hint="measure the hosts' links with ping and iperf3 on the hosts themselves")
    refuse_schedules(config)
    inventory = load_inventory(inventory_path)
    for run in config.runs:
        place_hosts(inventory, run.job, run.workers)
    return inventory
