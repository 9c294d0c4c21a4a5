"""A sweep's TCP congestion control on the embedded nodes: checked, set in every node's
namespace, journaled, and put back (model/congestion.py holds the pure decisions).

Each change is a journal entry of kind `sysctl` (key, the previous value, the namespace or
None for the host's own), recorded before it is made: the sweep's end puts them back, and so
does `netbench reset` after a crash (state/undo.py). The host's allowed list is host-wide:
a name added to it is held machine-wide (state/holds.py), so two sweeps that widen it at
once keep it until the last of them is done. A testbed that `netbench testbed up`
brought up outlives the sweep; its nodes get their previous congestion control back.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from netbench import proc
from netbench.errors import NetbenchError, TestbedError, UsageError
from netbench.model import congestion as cc
from netbench.state.holds import Holds
from netbench.state.journal import Entry, Journal
from netbench.testbed import netns as local

pnetns = proc.pyroute2_netns()  # pyroute2's, in this testbed's folder of namespaces


def _ignore(message: str) -> None:
    pass


def available() -> list[str]:
    """The algorithms this kernel has (tcp_available_congestion_control, host-wide)."""
    return local.read_sysctl(cc.AVAILABLE_KEY).split()


def loadable(name: str, modules: Path | None = None) -> bool:
    """Whether this kernel's module folder holds tcp_NAME (modprobe would load it; `name` has
    passed cc.check_name). Reads modules.dep: no root, nothing loaded."""
    folder = modules or Path("/lib/modules") / os.uname().release
    try:
        listed = (folder / "modules.dep").read_text(errors="replace")
    except OSError:
        return False
    return re.search(rf"(^|/)tcp_{re.escape(name)}\.ko(\.[a-z]+)?:", listed, re.MULTILINE) is not None


def check_planned(name: str, where: str, modules: Path | None = None) -> None:
    """A dry run's check of `name` (no root, nothing loaded or set): refused unless the kernel
    lists it (tcp_available_congestion_control, readable by anyone) or holds its module."""
    why = cc.check_name(name)
    if why is None and name not in available() and not loadable(name, modules):
        why = cc.refusal(name, available())
    if why is not None:
        raise UsageError(f"{where}: {why}", hint="choose an available one, or leave it out to keep the nodes' own")


def check_available(name: str, where: str) -> None:
    """Refuse `name` (UsageError naming `where`, e.g. "flag --congestion-control") unless this
    kernel has it, loading its module (tcp_NAME) first if it is missing; changes nothing else."""
    why = cc.check_name(name)
    if why is None and name not in available():
        try:  # a stock kernel builds most algorithms as modules; this one may have none
            proc.run(["modprobe", "-q", f"tcp_{name}"], check=False, timeout=10)
        except NetbenchError:
            pass
    why = why or cc.refusal(name, available())
    if why is not None:
        raise UsageError(f"{where}: {why}", hint="choose an available one, or leave it out to keep the nodes' own")
    if rootless():
        why = cc.rootless_refusal(name, allowed())
        if why is not None:
            raise UsageError(f"{where}: {why}",
                             hint=f"as root: sysctl -w {cc.ALLOWED_KEY}='{' '.join([*allowed(), name])}'; or run "
                                  "netbench as root; or leave it out")


def allowed(holds: Holds | None = None) -> list[str]:
    """The algorithms the host itself lets a namespace not made by root choose: its allowed list
    less the names a root netbench added to it for a sweep of its own (held in state/holds.py),
    which go when that sweep ends: a testbed without root never counts on them."""
    holds = holds or Holds()
    return [name for name in local.read_sysctl(cc.ALLOWED_KEY).split()
            if not holds.held(cc.allowed_setting(name))]


def rootless() -> bool:
    """Whether this testbed is held without root (in a user namespace of a user's own)."""
    import os

    from netbench.state import places

    return places.privilege(os.environ, os.geteuid()) == places.ROOTLESS


def _set(journal: Journal, key: str, value: str, name: str | None, previous: str, **extra: str) -> Entry:
    entry = journal.record("sysctl", key=key, value=value, previous=previous, netns=name, **extra)
    try:
        local.write_sysctl(key, value, name)
    except BaseException:
        journal.done(entry)  # nothing was changed
        raise
    return entry


def hold_allowed(journal: Journal, name: str, holds: Holds | None = None) -> Entry | None:
    """Let the namespaces choose `name`: the host's allowed list widened by it, journaled, and
    held machine-wide (state/holds.py) so that another netbench that widened it too keeps it
    until the last of them is done. None: the host's own list has it (no netbench put it there)."""
    holds = holds or Holds()
    setting = cc.allowed_setting(name)
    with holds.locked(setting):
        allowed = local.read_sysctl(cc.ALLOWED_KEY).split()
        wider = cc.widened(allowed, name)
        if wider is None and not holds.held(setting):
            return None
        hold = holds.new_id()
        # `added`: its undo takes out only this name, and only when no other netbench holds it
        entry = journal.record("sysctl", key=cc.ALLOWED_KEY, value=wider or " ".join(allowed),
                               previous=" ".join(allowed), netns=None, added=name, hold=hold)
        holds.add(setting, hold)
        if wider is not None:
            try:
                local.write_sysctl(cc.ALLOWED_KEY, wider, None)
            except BaseException:
                holds.remove(setting, hold)
                journal.done(entry)  # nothing was changed
                raise
        return entry


def set_on_nodes(journal: Journal, nodes, name: str, holds: Holds | None = None) -> list[Entry]:
    """Make `name` every node's default congestion control (widening the host's allowed list
    first when a namespace may not choose it: `hold_allowed`); each change journaled before it
    is made and read back. On any failure what was set is put back before the error goes on."""
    entries: list[Entry] = []
    try:
        # without root the host's own list has it (checked before): nothing to widen, nothing held
        widened = None if rootless() else hold_allowed(journal, name, holds)
        if widened is not None:
            entries.append(widened)
        for node in nodes:
            previous = local.read_sysctl(cc.DEFAULT_KEY, node.netns)
            if not previous:
                raise TestbedError(f"node {node.name}: cannot read {cc.DEFAULT_KEY}")
            if previous != name:
                entries.append(_set(journal, cc.DEFAULT_KEY, name, node.netns, previous))
            now = local.read_sysctl(cc.DEFAULT_KEY, node.netns)
            if now != name:
                raise TestbedError(f"node {node.name}: {cc.DEFAULT_KEY} reads {now or 'nothing'} after setting {name}")
    except BaseException:
        restore(journal, entries)
        raise
    return entries


def restore(journal: Journal, entries: list[Entry], warn: Callable[[str], None] = _ignore) -> list[str]:
    """Put back what `entries` changed, newest first, through the undo registry (as reset
    does); one line per value put back. A failure is raised once the rest were tried."""
    from netbench.state.reset import undo_each

    failures: list[str] = []
    done = undo_each(journal, list(reversed(entries)), set(pnetns.listnetns()), warn, failures)
    if failures:
        raise TestbedError("could not put the congestion control back: " + "; ".join(failures),
                           hint="'netbench reset' tries again")
    return done
