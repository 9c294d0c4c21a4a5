"""A schedule on SSH hosts: the timeline runs on the controller (experiment/schedule.py), and
each change goes to every host at once through its agent, over the connections the command
opened, kept open for the whole schedule.

At the start (`open`) each host gets one `netbench node serve` on its own SSH channel, kept
open until `close`: a change is then one JSON line to every host (in parallel) and one reply
back from each, made in place against the host's own journal (emulation/in_place.py) by a
process that imported everything and opened its netlink sockets once. A host whose netbench
has no `node serve` (an older one) gets a `netbench node apply` per change instead.

While a schedule runs, every change takes the lease for this controller and a LeaseKeeper
renews it, so a controller that dies mid-schedule leaves each host reverting by itself.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from netbench.experiment.schedule import PlanCache, link_before
from netbench.model.profile import Profile
from netbench.testbed.base import Planned


def hosts_link_before(shown: dict[str, Any]) -> Profile:
    """The one profile every host holds now (from HostsTestbed.show()), which a schedule starts
    from and puts back on Ctrl-C; an unshaped link is Profile(name="none")."""
    rows = [dict(row, node=host) for host, data in shown.get("hosts", {}).items() for row in data["nodes"]]
    return link_before({"nodes": rows})


class HostsPlanCache(PlanCache):
    """PlanCache on a HostsTestbed: the hosts are asked what they have once (`netbench node
    info`, unless `probe` is False and a backend is given), each distinct profile is planned
    once, and `apply` sends every host its cached plan in parallel with the lease for `holder`.

    `open()` starts a `node serve` channel per host (`agents`), used by every apply until
    `close()` (also as a context manager); without it each apply is a `node apply` per host.
    `round_trips_s` holds how long each apply took (its SSH round trips, in parallel);
    `lost` (a callable, e.g. a LeaseKeeper's) names hosts whose lease is gone: no change then."""

    def __init__(self, target: Any, backend: str, *, probe: bool = True, lease_s: float = 0.0,
                 force: bool = False, holder: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(target, backend)
        self.probe = probe
        self.lease_s = lease_s
        self.force = force
        self.holder = holder
        self.clock = clock
        self.infos: dict[str, dict[str, Any]] | None = None
        self.round_trips_s: list[float] = []
        self.lost: Callable[[], dict[str, str]] = dict
        self.agents: dict[str, Any] = {}

    def open(self) -> dict[str, Any]:
        """One `netbench node serve` channel per host that has it, all started at once; the
        hosts without one are named in the answer's `fallback` (host -> 'node apply')."""
        from netbench.remote.channel import open_agents

        if not self.agents:
            self.agents = open_agents(self.target.inventory, self.target.conns)
        return {"serving": sorted(self.agents),
                "fallback": {c.name: "node apply" for c in self.target.conns if c.name not in self.agents}}

    def close(self) -> None:
        """Close every channel (each agent says bye and exits)."""
        from netbench.remote.channel import close_agents

        agents, self.agents = self.agents, {}
        close_agents(agents)

    def __enter__(self) -> "HostsPlanCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def plan(self, profile: Profile) -> Planned:
        from netbench.remote import controller as remote

        if profile in self.plans:
            return self.plans[profile]
        requested = None if self.backend in (None, "auto") else self.backend
        if not self.probe and requested is not None:
            planned = self.target.plan(profile, requested, probe=False)
        else:
            if self.infos is None:
                self.infos = remote.probe_hosts(self.target.inventory, self.target.conns)
            hosts = remote.plan_hosts(self.target.inventory, self.infos, profile, requested)
            planned = Planned(profile=profile, backends=hosts.backends,
                              changes={name: tuple(changes) for name, changes in hosts.plans.items()})
        self.plans[profile] = planned
        return planned

    def apply(self, profile: Profile, lease_s: float | None = None) -> None:
        """Every host gets `profile`'s plan (with the lease, or `lease_s`: 0 releases it)."""
        from netbench.remote import controller as remote
        from netbench.remote.controller import RemoteError

        lost = self.lost()
        if lost:
            names = "; ".join(f"host {name}: {why}" for name, why in lost.items())
            raise RemoteError(f"lost the lease on {names}", hint="renewals did not reach the host in time")
        planned = self.plan(profile)
        began = self.clock()
        remote.apply_inventory(self.target.inventory, self.target.conns,
                               remote.RemoteApply(backends=dict(planned.backends),
                                                  plans={k: list(v) for k, v in planned.changes.items()}),
                               lease_s=self.lease_s if lease_s is None else lease_s, force=self.force,
                               holder=self.holder, takeover=self.target.takeover, agents=self.agents)
        self.round_trips_s.append(self.clock() - began)
