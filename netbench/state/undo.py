"""The undo registry: journal entry kind -> the function that undoes it.

One registry serves the local reset (state/reset.py) and a host's reset (remote/agent.py):
a new kind of change is journaled under a new kind and gets its undo here, nowhere else.
Each undo takes the entry's data and an UndoContext and returns a line saying what it
removed, or None when there was nothing left to remove. An entry of a kind no undo is
registered for is left alone with a warning (a newer netbench's journal, or a bug).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

from netbench import proc
from netbench.emulation.iptables import Iptables
from netbench.emulation.netlink.qdisc import NetlinkQdiscs
from netbench.state.holds import Holds
from netbench.testbed import netns as local


def _ignore(message: str) -> None:
    pass


@dataclass(frozen=True)
class UndoContext:
    """What an undo may look at: the namespaces that still exist, and where warnings go."""

    existing: frozenset[str] = field(default_factory=frozenset)
    warn: Callable[[str], None] = _ignore


UndoFn = Callable[[dict[str, Any], UndoContext], "str | None"]


def _undo_process(data: dict[str, Any], ctx: UndoContext) -> str | None:
    if data.get("start") is None:
        if proc.start_time(data["pid"]) is not None:
            ctx.warn(f"process {data['pid']} ({data.get('role', '?')}) left running: its start time was not "
                     "recorded, so it cannot be told from a process that reused the pid")
    elif proc.is_same_process(data["pid"], data.get("start")):
        proc.stop_pids([data["pid"]], grace=3.0)
        where = f" in {data['netns']}" if data.get("netns") else ""  # None: a host's own task
        return f"process {data['pid']} ({data.get('role', '?')}{where})"
    return None


def _undo_iptables(data: dict[str, Any], ctx: UndoContext) -> str | None:
    if data.get("netns") in ctx.existing and Iptables().clear(data["netns"]):
        return f"iptables chain {data.get('chain')} in {data['netns']}"
    return None


def _undo_qdisc(data: dict[str, Any], ctx: UndoContext) -> str | None:
    if data.get("netns") in ctx.existing and NetlinkQdiscs().clear(data["netns"], data["ifname"]):
        return f"qdisc {data.get('handle')} on {data['netns']}/{data['ifname']}"
    return None


def _undo_ingress(data: dict[str, Any], ctx: UndoContext) -> str | None:
    if data.get("netns") in ctx.existing and NetlinkQdiscs().clear_ingress(data["netns"], data["dev"], data["ifb"]):
        return f"ingress redirect {data['dev']} -> {data['ifb']} in {data['netns']}"
    return None


def _undo_netns(data: dict[str, Any], ctx: UndoContext) -> str | None:
    if local.remove_netns(data["name"]):
        return f"namespace {data['name']}"
    return None


def _undo_attach(data: dict[str, Any], ctx: UndoContext) -> str | None:
    """A host's own namespace attached under /run/netns: drop the reference only.
    (`ip netns delete` of an attached name unmounts it; nothing is killed.)"""
    name = data["name"]
    if proc.netns_inode(name) is None:
        return None
    proc.run(["ip", "netns", "delete", name], check=False)
    return f"namespace reference {name}"


def _undo_sysctl(data: dict[str, Any], ctx: UndoContext) -> str | None:
    """A sysctl netbench set (a node's congestion control, the host's allowed list): its
    previous value back, where its namespace still exists (None: the host's own)."""
    where = data.get("netns")
    if where is not None and where not in ctx.existing:
        return None
    if data.get("added"):  # a list netbench widened by one name: only that name comes out
        return _narrow(data, ctx)
    now = local.read_sysctl(data["key"], where)
    if now == data["previous"]:
        return None
    local.write_sysctl(data["key"], data["previous"], where)
    return f"{data['key']} change " + (f"in {where}" if where else "on the host") + f" (back to {data['previous']!r})"


def _narrow(data: dict[str, Any], ctx: UndoContext, holds: Holds | None = None) -> str | None:
    """A host-wide list widened by one name: that name taken out, once no other running
    netbench holds it (state/holds.py; an entry without a hold, from an older netbench: at once)."""
    from netbench.model.congestion import narrowed

    holds = holds or Holds()
    setting, hold = f"{data['key']}+{data['added']}", data.get("hold")
    with holds.locked(setting) if hold else nullcontext():
        if hold:
            holds.remove(setting, hold)
            others = holds.others_live(setting)
            if others:
                ctx.warn(f"{data['key']}: {data['added']!r} left in: {others} other netbench(s) still use it")
                return None
            holds.clear(setting)
        back = narrowed(local.read_sysctl(data["key"], None).split(), data["added"])
        if back is None:
            return None
        local.write_sysctl(data["key"], back, None)
    return f"{data['key']} change on the host (back to {back!r}: {data['added']!r} taken out)"


def _undo_cgroup(data: dict[str, Any], ctx: UndoContext) -> str | None:
    """A node's CPU-limit group (emulation/cgroups.py): removed, with its parent when that is
    empty; only a group under netbench's own parent (a journal names nothing else)."""
    from pathlib import Path

    from netbench.emulation.cgroups import PARENTS, remove_group

    path = Path(data["path"])
    if path.parent.name not in PARENTS:
        ctx.warn(f"cgroup {path} left alone: not under a parent of netbench's ({', '.join(PARENTS)})")
        return None
    if remove_group(path, Path(data["root"])):
        return f"cgroup {path}"
    return None


def _undo_cgroup_control(data: dict[str, Any], ctx: UndoContext) -> str | None:
    """The cpu controller netbench turned on in a v2 root's subtree_control: off again once no
    other running netbench holds it (emulation/cgroups.py)."""
    from netbench.emulation.cgroups import release_cpu_controller

    return release_cpu_controller(data, ctx.warn)


UNDO: dict[str, UndoFn] = {
    "process": _undo_process,
    "iptables": _undo_iptables,
    "qdisc": _undo_qdisc,
    "ingress": _undo_ingress,
    "netns": _undo_netns,
    "attach": _undo_attach,
    "sysctl": _undo_sysctl,
    "cgroup": _undo_cgroup,
    "cgroup-control": _undo_cgroup_control,
}


def undo(kind: str, data: dict[str, Any], ctx: UndoContext,
         registry: dict[str, UndoFn] | None = None) -> str | None:
    """Undo one journaled change through the registry; an unknown kind is warned about."""
    fn = (UNDO if registry is None else registry).get(kind)
    if fn is None:
        ctx.warn(f"journal entry of unknown kind {kind!r} left alone: this netbench cannot undo it "
                 f"({', '.join(sorted(UNDO if registry is None else registry))} are known)")
        return None
    return fn(data, ctx)
