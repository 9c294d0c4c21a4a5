"""What netbench holds on a testbed right now, from its journal alone (pure).

A change to a live link is planned against this: what is held and still wanted is changed in
place (a tbf or netem `change`, a delay engine reconfigured through its control channel, an
NFQUEUE rule left alone); only what is held and no longer wanted is removed. Nothing has to
be read from the kernel to plan, so a change costs what it changes.

The journal is the record of what netbench made; a state it cannot describe exactly (an
NFQUEUE rule journaled before rules named their port) gives `exact=False`, and the planner
falls back to clearing and re-creating, as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True)
class Held:
    """netbench's own state, by place.

    roots: (netns, device) -> the kind of netbench's root qdisc there ("tbf", "netem", "htb",
        or "" when the journal did not say).
    ingress: (netns, device) pairs whose ingress netbench redirects to an ifb.
    engines: (namespace, NFQUEUE number) of the delay engines netbench started.
    rules: namespace -> the bridge ports netbench's NFQUEUE rules match there.
    exact: False when some entry cannot be placed (plan from scratch then).
    """

    roots: dict[tuple[str, str], str] = field(default_factory=dict)
    ingress: frozenset[tuple[str, str]] = frozenset()
    engines: frozenset[tuple[str, int]] = frozenset()
    rules: dict[str, frozenset[str]] = field(default_factory=dict)
    exact: bool = True

    def has_rule(self, netns: str, port: str) -> bool:
        return port in self.rules.get(netns, frozenset())


NOTHING = Held()


def held_from_entries(entries: Iterable) -> Held:
    """A Held from the journal's pending entries (state.journal.Entry: kind and data)."""
    roots: dict[tuple[str, str], str] = {}
    ingress: set[tuple[str, str]] = set()
    engines: set[tuple[str, int]] = set()
    rules: dict[str, set[str]] = {}
    exact = True
    for entry in entries:
        data = entry.data
        if entry.kind == "qdisc":
            roots[(data.get("netns"), data.get("ifname"))] = data.get("qdisc_kind", "")
        elif entry.kind == "ingress":
            ingress.add((data.get("netns"), data.get("dev")))
        elif entry.kind == "process" and data.get("role") == "engine":
            engines.add((data.get("netns"), data.get("queue")))
        elif entry.kind == "iptables":
            if data.get("port"):
                rules.setdefault(data.get("netns"), set()).add(data["port"])
            else:
                exact = False
    return Held(roots=roots, ingress=frozenset(ingress), engines=frozenset(engines),
                rules={netns: frozenset(ports) for netns, ports in rules.items()}, exact=exact)
