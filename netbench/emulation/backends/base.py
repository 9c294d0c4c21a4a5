"""What an emulation backend is: plan, refusals, read-back and probe, in one record.

A backend module (netem.py, userspace.py, rateonly.py) builds one Backend and the
registry in __init__.py holds them by name; every place that used to branch on a backend
name (the executor's choice, `show`'s read-back, doctor, the remote controller) asks the
registry instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from netbench.emulation.changes import Change
from netbench.model.profile import Profile
from netbench.model.topology import Node, Topology

Tree = "dict[str, Any] | None"


@dataclass(frozen=True)
class Backend:
    """One way to emulate a profile.

    plan: (profile, topology, nodes, seed) -> the changes that shape `nodes` (after the
        common prelude that stops engines and clears rules); it calls `refuse` first.
    refuse: (profile, where) -> raise BackendUnavailable for what it cannot emulate
        (`where`: "" on the local testbed, else the host's name).
    holds: read-back, (egress tree, ingress tree, NFQUEUE rules) -> whether what the
        kernel holds is this backend's; None for a backend whose state reads as another's.
    probe: () -> (available, reason), or None when it needs no probe to be chosen.
    needs: the doctor checks that must pass for it to work.
    on_hosts: the registered backend this name means on an SSH host.
    choosable: offered to --backend and playbooks.
    fallback_note: said when auto falls back to it.
    plan_pairs: (pairs: model.pairs.PairTopology, topology, nodes, seed, held) -> the changes that shape each of
        `nodes`' egress per destination as `pairs` says (model/pairs.py); None for a
        backend that cannot shape per destination.
    """

    name: str
    plan: Callable[[Profile, Topology, Sequence[Node], int], list[Change]]
    refuse: Callable[[Profile, str], None]
    holds: Callable[[Any, Any, list[str]], bool] | None
    probe: Callable[[], tuple[bool, str]] | None
    needs: tuple[str, ...]
    on_hosts: str
    choosable: bool = True
    unavailable_hint: str = ""
    fallback_note: str = ""
    plan_pairs: Callable[..., list[Change]] | None = None
