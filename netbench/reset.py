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


def reset(journal: Journal) -> list[str]:
    """Remove everything netbench made; returns one line per thing removed."""
    removed: list[str] = []
    existing = set(pnetns.listnetns())
    for entry in reversed(journal.pending()):
        data = entry.data
        if entry.kind == "process":
            if proc.is_same_process(data["pid"], data.get("start")):
                proc.stop_pids([data["pid"]], grace=3.0)
                removed.append(f"process {data['pid']} ({data.get('role', '?')} in {data.get('netns')})")
        elif entry.kind == "iptables" and data.get("netns") in existing:
            if Iptables().clear(data["netns"]):
                removed.append(f"iptables chain {data.get('chain')} in {data['netns']}")
        elif entry.kind == "qdisc" and data.get("netns") in existing:
            if NetlinkQdiscs().clear(data["netns"], data["ifname"]):
                removed.append(f"qdisc {data.get('handle')} on {data['netns']}/{data['ifname']}")
        elif entry.kind == "ingress" and data.get("netns") in existing:
            if NetlinkQdiscs().clear_ingress(data["netns"], data["dev"], data["ifb"]):
                removed.append(f"ingress redirect {data['dev']} -> {data['ifb']} in {data['netns']}")
        elif entry.kind == "netns":
            if local.remove_netns(data["name"]):
                removed.append(f"namespace {data['name']}")
        journal.done(entry)
    # anything a crash left before its journal line, or from an older state dir
    for name in local.list_netbench_netns():
        pids = proc.pids_in_netns(name)
        if local.remove_netns(name):
            removed.append(f"namespace {name}" + (f" and {len(pids)} process(es) in it" if pids else ""))
    shutil.rmtree(journal.dir / "engines", ignore_errors=True)
    journal.compact()
    return removed
