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
from netbench.emulation.iptables import Iptables
from netbench.emulation.netlink.qdisc import NetlinkQdiscs
from netbench.state.journal import Journal
from netbench.testbed import netns as local


def _ignore(message: str) -> None:
    pass


def undo_entry(entry, existing: set[str], warn: Callable[[str], None] = _ignore) -> str | None:
    """Undo one journal entry (its namespace must still exist in `existing`); a line saying
    what was removed, or None when there was nothing left to remove."""
    data = entry.data
    if entry.kind == "process":
        if data.get("start") is None:
            if proc.start_time(data["pid"]) is not None:
                warn(f"process {data['pid']} ({data.get('role', '?')}) left running: its start time was not "
                     "recorded, so it cannot be told from a process that reused the pid")
        elif proc.is_same_process(data["pid"], data.get("start")):
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
