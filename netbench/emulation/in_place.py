"""A plan made in place against what netbench holds (pure): what an SSH host does with the
plan its controller sent, which was planned without the host's journal.

The controller plans a host as if from scratch (it cannot see the host's journal); the host
knows what it holds (held.py, from its own journal) and drops from the plan what would unshape
a live link for nothing: a clear of a qdisc or ingress redirect netbench does not hold there,
and a clear of a root that a tbf or netem set on the same device replaces anyway (the kernel
changes a qdisc of the same handle and kind in place; the adapters replace one of another
kind). What is left changes the link without a moment unshaped.
"""

from __future__ import annotations

from netbench.emulation import changes as ch
from netbench.emulation.held import Held


def _root_place(change: ch.Change) -> tuple[str, str] | None:
    """(netns, device) whose root qdisc `change` sets, or None."""
    if isinstance(change, ch.SetTbf):
        return (change.netns, change.ifname)
    if isinstance(change, ch.ShapeDevice):
        return (change.netns, change.dev)
    return None


def in_place(plan: list[ch.Change], held: Held) -> list[ch.Change]:
    """`plan` without the clears that are not needed: a ClearQdisc or ClearIngress of a device
    netbench does not hold, and a ClearQdisc followed (later in the plan) by a SetTbf or
    ShapeDevice on the same (netns, device). A `held` that is not exact keeps `plan` as it is."""
    if not held.exact:
        return list(plan)
    out: list[ch.Change] = []
    for i, change in enumerate(plan):
        if isinstance(change, ch.ClearQdisc):
            place = (change.netns, change.ifname)
            if place not in held.roots or any(_root_place(later) == place for later in plan[i + 1:]):
                continue
        elif isinstance(change, ch.ClearIngress) and (change.netns, change.dev) not in held.ingress:
            continue
        out.append(change)
    return out
