"""Rate only, through a tbf qdisc: what "userspace" means on an SSH host without netem
(a host has no switch namespace for NFQUEUE delay engines). Hosts report and are shown
as "userspace"; this backend is not offered to --backend."""

from __future__ import annotations

from typing import Sequence

from netbench.emulation import changes as ch
from netbench.emulation.backends.base import Backend
from netbench.errors import BackendUnavailable
from netbench.model.profile import Profile
from netbench.model.topology import Node, Topology


def refuse(profile: Profile, where: str = "") -> None:
    unsupported = [name for name, value in (("delay", profile.delay_us), ("jitter", profile.jitter_us),
                                            ("loss", profile.loss)) if value]
    unsupported += profile.netem_only_fields()
    if unsupported:
        raise BackendUnavailable(f"host {where}: without netem a remote host shapes rate only; "
                                 f"profile {profile.name} sets {', '.join(dict.fromkeys(unsupported))}",
                                 hint="load sch_netem on the host ('netbench doctor --inventory' says what it has)")


def plan(profile: Profile, topology: Topology, nodes: Sequence[Node], seed: int = 0) -> list[ch.Change]:
    changes: list[ch.Change] = []
    for node in nodes:
        refuse(profile, node.name)
        changes += [ch.ClearIngress(node.name, node.netns, node.ifname, ch.ifb_name(node.ifname)),
                    ch.ClearQdisc(node.name, node.netns, node.ifname)]
        if profile.rate_bps:
            changes.append(ch.SetTbf(node.name, node.netns, node.ifname, profile.rate_bps,
                                     ch.tbf_burst_bytes(profile.rate_bps), ch.tbf_limit_bytes(profile.rate_bps)))
    return changes


BACKEND = Backend(name="rateonly", plan=plan, refuse=refuse, holds=None, probe=None, needs=("tbf",),
                  on_hosts="rateonly", choosable=False)
