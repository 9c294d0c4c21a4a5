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

from netbench import proc
from netbench.errors import ResetIncomplete
from netbench.state.journal import STEP_DELAY_DIR, Journal
from netbench.state.undo import UndoContext, undo
from netbench.testbed import netns as local

pnetns = proc.pyroute2_netns()  # pyroute2's, in this testbed's folder of namespaces


def _ignore(message: str) -> None:
    pass


def undo_entry(entry, existing: set[str], warn: Callable[[str], None] = _ignore) -> str | None:
    """Undo one journal entry through the undo registry (state/undo.py; its namespace must
    still exist in `existing`); a line saying what was removed, or None when there was
    nothing left to remove."""
    return undo(entry.kind, entry.data, UndoContext(frozenset(existing), warn))


def _why(exc: Exception) -> str:
    return str(getattr(exc, "message", "") or exc) or type(exc).__name__


def _what(entry) -> str:
    """A journal entry in a few words, for a failure line."""
    data = entry.data
    where = data.get("netns") or data.get("name") or ""
    detail = data.get("pid") or data.get("ifname") or data.get("chain") or data.get("dev") or data.get("key") or ""
    return " ".join(str(part) for part in (entry.kind, detail, f"in {where}" if where and detail else where) if part)


def undo_each(journal: Journal, entries, existing: set[str], warn: Callable[[str], None],
              failures: list[str]) -> list[str]:
    """Undo `entries` in order, each marked done once undone; one that fails is added to
    `failures` (and stays journaled, for the next reset) and the rest still go."""
    removed: list[str] = []
    for entry in entries:
        try:
            line = undo_entry(entry, existing, warn)
        except Exception as exc:  # noqa: BLE001 - whatever one undo raises, the others still run
            failures.append(f"{_what(entry)}: {_why(exc)}")
            continue
        if line:
            removed.append(line)
        journal.done(entry)
    return removed


def _guarded(failures: list[str], what: str, fn, *args) -> list[str]:
    try:
        return list(fn(*args))
    except Exception as exc:  # noqa: BLE001 - reported, and the reset goes on
        failures.append(f"{what}: {_why(exc)}")
        return []


def _remove_netns(name: str) -> list[str]:
    pids = proc.pids_in_netns(name)
    if local.remove_netns(name):
        return [f"namespace {name}" + (f" and {len(pids)} process(es) in it" if pids else "")]
    return []


def reset(journal: Journal, warn: Callable[[str], None] = _ignore, all_namespaces: bool = False) -> list[str]:
    """Remove everything `journal` recorded; returns one line per thing removed. `warn` gets a
    line for each thing left alone on purpose and each journal line that could not be read.
    `all_namespaces`: also every testbed namespace the journal did not record (and every
    process in it), whichever state folder made it. Something that cannot be removed does
    not stop the rest: ResetIncomplete at the end names each failure (and carries `removed`)."""
    failures: list[str] = []
    existing = set(pnetns.listnetns())
    removed = undo_each(journal, list(reversed(journal.pending())), existing, warn, failures)
    for name in local.stale_scratch_netns():  # a doctor's or probe's, its maker gone: no one's testbed
        removed += _guarded(failures, f"namespace {name}", _remove_netns, name)
    for name in local.list_netbench_netns():  # not in this journal: another state folder's testbed?
        if all_namespaces:
            removed += _guarded(failures, f"namespace {name}", _remove_netns, name)
        else:
            warn(f"namespace {name} left alone: this state folder's journal ({journal.dir}) did not record "
                 "it (another state folder's testbed, perhaps in use); 'netbench reset --all-namespaces' "
                 "removes it and every process in it")
    for name in local.host_netns_references():
        warn(f"namespace {name} left alone: it is a reference to the host's own network namespace")
    shutil.rmtree(journal.dir / "engines", ignore_errors=True)
    shutil.rmtree(journal.dir / STEP_DELAY_DIR, ignore_errors=True)  # a killed sweep's step-delay files
    from netbench.metrics.exporter import remove_stale_targets, targets_dir

    # a killed controller's file_sd target
    removed += _guarded(failures, "metrics target files", remove_stale_targets, targets_dir(journal.dir))
    for line in journal.compact():
        warn(line)
    if failures:
        raise ResetIncomplete(removed, failures)
    return removed
