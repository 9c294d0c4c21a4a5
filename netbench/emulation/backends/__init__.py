"""Emulation backends as registered plugins, chosen in one place.

BACKENDS maps a name to its Backend (base.py): netem (kernel qdiscs), userspace (tbf +
NFQUEUE delay engines) and rateonly (tbf alone: "userspace" on an SSH host). A new
backend is a module here that builds a Backend, added to BACKENDS; `choose_backend`,
`plan_apply`, read-back (`backend_held`), doctor and the remote controller find it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from netbench.emulation import changes as ch
from netbench.emulation.backends import netem, rateonly, userspace
from netbench.emulation.backends.base import Backend
from netbench.emulation.held import Held
from netbench.errors import BackendUnavailable, UsageError
from netbench.model.pairs import PairTopology
from netbench.model.profile import Profile
from netbench.model.topology import Topology

# in order of preference: `auto` takes the first whose probe passes (or that needs none)
BACKENDS: dict[str, Backend] = {b.name: b for b in (netem.BACKEND, userspace.BACKEND, rateonly.BACKEND)}
# the backends that plan against what is held (a change in place); others clear and re-create
IN_PLACE = ("netem", "userspace")
CHOOSABLE: tuple[str, ...] = tuple(name for name, b in BACKENDS.items() if b.choosable)


def get_backend(name: str, on_host: bool = False) -> Backend:
    """The registered backend `name` (on an SSH host: the one that name means there)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}")
    backend = BACKENDS[name]
    return BACKENDS[backend.on_hosts] if on_host else backend


def plan_apply(profile: Profile, topology: Topology, backend: str, seed: int = 0,
               held: Held | None = None) -> list[ch.Change]:
    """Everything to turn every node's link into `profile`.

    Without `held` (or with a `held` that is not exact): replacing what was there: stop the
    engines and clear the rules of either backend, then the backend's own plan. With `held`
    (what the journal says netbench holds, emulation/held.py): in place, so a live link is
    never unshaped; only what is held and no longer wanted is removed."""
    chosen = get_backend(backend)
    return _with_prelude(chosen, topology, held, lambda h: chosen.plan(profile, topology, topology.nodes, seed, *h))


def plan_pairs_apply(pairs: PairTopology, topology: Topology, backend: str, seed: int = 0,
                     held: Held | None = None) -> list[ch.Change]:
    """Everything to shape every node's egress per destination as `pairs` says (the same
    prelude and in-place rules as plan_apply)."""
    chosen = get_backend(backend)
    if chosen.plan_pairs is None:
        raise BackendUnavailable(f"the {chosen.name} backend cannot shape per destination (a topology)",
                                 hint=f"use one of: {', '.join(n for n, b in BACKENDS.items() if b.plan_pairs)}")
    plan_pairs = chosen.plan_pairs
    return _with_prelude(chosen, topology, held, lambda h: plan_pairs(pairs, topology, topology.nodes, seed, *h))


def plan_network(network: Profile | PairTopology, topology: Topology, backend: str, seed: int = 0,
                 held: Held | None = None) -> list[ch.Change]:
    """plan_apply for a profile (every node's link alike), plan_pairs_apply for a per-pair
    topology (model/pairs.py)."""
    if isinstance(network, PairTopology):
        return plan_pairs_apply(network, topology, backend, seed, held)
    return plan_apply(network, topology, backend, seed, held)


def _with_prelude(chosen: Backend, topology: Topology, held: Held | None,
                  plan: Callable[[tuple], list[ch.Change]]) -> list[ch.Change]:
    switch = topology.switch_netns
    if held is not None and held.exact and chosen.name in IN_PLACE:
        changes: list[ch.Change] = []
        if chosen.name != "userspace":  # the other backend's engines and rules go
            for i, node in enumerate(topology.nodes):
                if held.has_rule(switch, node.port):
                    changes.append(ch.DeleteNfqueueRule(node.name, switch, node.port, ch.queue_num(i)))
            changes += [ch.StopEngine(node.name, switch, ch.queue_num(i)) for i, node in enumerate(topology.nodes)
                        if (switch, ch.queue_num(i)) in held.engines]
        return changes + plan((held,))
    changes = [ch.ClearRules("switch", switch)]
    changes += [ch.StopEngine(node.name, switch, ch.queue_num(i)) for i, node in enumerate(topology.nodes)]
    return changes + plan(())


def backend_held(egress: Any, ingress: Any, rules: list[str]) -> str | None:
    """Read-back: the backend whose state a node's trees and rules are, or None."""
    return next((b.name for b in BACKENDS.values() if b.holds is not None and b.holds(egress, ingress, rules)), None)


@dataclass(frozen=True)
class BackendChoice:
    name: str
    reason: str


def choose_backend(requested: str | None, probe: Callable[[], tuple[bool, str]] | None = None) -> BackendChoice:
    """netem where the kernel has it, else userspace; `requested` overrides after a check.
    `probe` replaces the probing backend's own (tests)."""
    if requested not in (None, "auto", *CHOOSABLE):
        raise UsageError(f"flag --backend: unknown backend {requested!r}",
                         hint=f"use one of: auto, {', '.join(CHOOSABLE)}")
    if requested not in (None, "auto"):
        backend = BACKENDS[requested]
        if backend.probe is None:
            return BackendChoice(backend.name, "requested with --backend")
        ok, why = (probe or backend.probe)()
        if not ok:
            raise BackendUnavailable(f"--backend {backend.name}: {why}", hint=backend.unavailable_hint)
        return BackendChoice(backend.name, "requested with --backend")
    reasons: list[str] = []
    for name in CHOOSABLE:
        backend = BACKENDS[name]
        if backend.probe is None:
            return BackendChoice(name, "; ".join(reasons + ([backend.fallback_note] if backend.fallback_note else [])))
        ok, why = (probe or backend.probe)()
        if ok:
            return BackendChoice(name, why)
        reasons.append(why)
    raise BackendUnavailable("no emulation backend is available")  # pragma: no cover - userspace needs no probe
