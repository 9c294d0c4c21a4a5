"""Put the machine back: undo every journaled change, then sweep up anything prefixed netbench.

Works after a SIGKILLed controller: the journal was written before each change. Idempotent:
a second reset finds nothing and says so.
"""

from __future__ import annotations

import shutil

from pyroute2 import netns as pnetns

from netbench import proc
from netbench.emulation.adapters import Iptables, NetlinkQdiscs
from netbench.journal import Journal
from netbench.testbed import local


def undo_entry(entry, existing: set[str]) -> str | None:
    """Undo one journal entry (its namespace must still exist in `existing`); a line saying
    what was removed, or None when there was nothing left to remove."""
    data = entry.data
    if entry.kind == "process":
        if proc.is_same_process(data["pid"], data.get("start")):
            proc.stop_pids([data["pid"]], grace=3.0)
            where = f" in {data['netns']}" if data.get("netns") else ""  # None: a host's own task
            return f"process {data['pid']} ({data.get('role', '?')}{where})"
    elif entry.kind == "iptables" and data.get("netns") in existing:
        if Iptables().clear(data["netns"]):
            return f"iptables chain {data.get('chain')} in {data['netns']}"
    elif entry.kind == "qdisc" and data.get("netns") in existing:
        if NetlinkQdiscs().clear(data["netns"], data["ifname"]):
            return f"qdisc {data.get('handle')} on {data['netns']}/{data['ifname']}"
    elif entry.kind == "ingress" and data.get("netns") in existing:
        if NetlinkQdiscs().clear_ingress(data["netns"], data["dev"], data["ifb"]):
            return f"ingress redirect {data['dev']} -> {data['ifb']} in {data['netns']}"
    elif entry.kind == "netns":
        if local.remove_netns(data["name"]):
            return f"namespace {data['name']}"
    return None


def reset(journal: Journal) -> list[str]:
    """Remove everything netbench made; returns one line per thing removed."""
    removed: list[str] = []
    existing = set(pnetns.listnetns())
    for entry in reversed(journal.pending()):
        line = undo_entry(entry, existing)
        if line:
            removed.append(line)
        journal.done(entry)
    # anything a crash left before its journal line, or from an older state dir
    for name in local.list_netbench_netns():
        pids = proc.pids_in_netns(name)
        if local.remove_netns(name):
            removed.append(f"namespace {name}" + (f" and {len(pids)} process(es) in it" if pids else ""))
    shutil.rmtree(journal.dir / "engines", ignore_errors=True)
    from netbench.metrics.exporter import remove_stale_targets, targets_dir

    removed += remove_stale_targets(targets_dir(journal.dir))  # a killed controller's file_sd target
    journal.compact()
    return removed
