"""Put the machine back: undo every journaled change, then sweep up the testbed's namespaces.

Works after a SIGKILLed controller: the journal was written before each change. Idempotent:
a second reset finds nothing and says so. The sweep takes only the names netbench gives
(netbench-sw, netbench-n1..n64) and scratch namespaces whose maker is gone; it never stops
a process in the host's own namespace, whatever a namespace is called.
"""

from __future__ import annotations

import shutil
from typing import Callable

from pyroute2 import netns as pnetns

from netbench import proc
from netbench.state.journal import Journal
from netbench.state.undo import UndoContext, undo
from netbench.testbed import netns as local


def _ignore(message: str) -> None:
    pass


def undo_entry(entry, existing: set[str], warn: Callable[[str], None] = _ignore) -> str | None:
    """Undo one journal entry through the undo registry (state/undo.py; its namespace must
    still exist in `existing`); a line saying what was removed, or None when there was
    nothing left to remove."""
    return undo(entry.kind, entry.data, UndoContext(frozenset(existing), warn))


def reset(journal: Journal, warn: Callable[[str], None] = _ignore) -> list[str]:
    """Remove everything netbench made; returns one line per thing removed. `warn` gets a
    line for each thing left alone on purpose and each journal line that could not be read."""
    removed: list[str] = []
    existing = set(pnetns.listnetns())
    for entry in reversed(journal.pending()):
        line = undo_entry(entry, existing, warn)
        if line:
            removed.append(line)
        journal.done(entry)
    # anything a crash left before its journal line, or from an older state dir
    for name in local.list_netbench_netns() + local.stale_scratch_netns():
        pids = proc.pids_in_netns(name)
        if local.remove_netns(name):
            removed.append(f"namespace {name}" + (f" and {len(pids)} process(es) in it" if pids else ""))
    for name in local.host_netns_references():
        warn(f"namespace {name} left alone: it is a reference to the host's own network namespace")
    shutil.rmtree(journal.dir / "engines", ignore_errors=True)
    from netbench.metrics.exporter import remove_stale_targets, targets_dir

    removed += remove_stale_targets(targets_dir(journal.dir))  # a killed controller's file_sd target
    for line in journal.compact():
        warn(line)
    return removed
