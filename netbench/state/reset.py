"""Put the machine back: undo every journaled change, then remove scratch namespaces whose
maker is gone.

Works after a SIGKILLed controller: the journal was written before each change. Idempotent:
a second reset finds nothing and says so. A testbed namespace (netbench-sw, netbench-n1..n64)
that this journal did not record (another state folder's testbed, perhaps live: removing a
namespace stops every process in it) is left alone with a warning, unless `all_namespaces`
asks for every one. Nothing stops a process in the host's own namespace, whatever a
namespace is called.
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


def _remove_netns(name: str) -> list[str]:
    pids = proc.pids_in_netns(name)
    if local.remove_netns(name):
        return [f"namespace {name}" + (f" and {len(pids)} process(es) in it" if pids else "")]
    return []


def reset(journal: Journal, warn: Callable[[str], None] = _ignore, all_namespaces: bool = False) -> list[str]:
    """Remove everything `journal` recorded; returns one line per thing removed. `warn` gets a
    line for each thing left alone on purpose and each journal line that could not be read.
    `all_namespaces`: also every testbed namespace the journal did not record (and every
    process in it), whichever state folder made it."""
    removed: list[str] = []
    existing = set(pnetns.listnetns())
    for entry in reversed(journal.pending()):
        line = undo_entry(entry, existing, warn)
        if line:
            removed.append(line)
        journal.done(entry)
    for name in local.stale_scratch_netns():  # a doctor's or probe's, its maker gone: no one's testbed
        removed += _remove_netns(name)
    for name in local.list_netbench_netns():  # not in this journal: another state folder's testbed?
        if all_namespaces:
            removed += _remove_netns(name)
        else:
            warn(f"namespace {name} left alone: this state folder's journal ({journal.dir}) did not record "
                 "it (another state folder's testbed, perhaps in use); 'netbench reset --all-namespaces' "
                 "removes it and every process in it")
    for name in local.host_netns_references():
        warn(f"namespace {name} left alone: it is a reference to the host's own network namespace")
    shutil.rmtree(journal.dir / "engines", ignore_errors=True)
    from netbench.metrics.exporter import remove_stale_targets, targets_dir

    removed += remove_stale_targets(targets_dir(journal.dir))  # a killed controller's file_sd target
    for line in journal.compact():
        warn(line)
    return removed
