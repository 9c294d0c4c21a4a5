"""Where a run ran: this machine's facts, the privilege netbench ran with, the shard of a
campaign; each run's record keeps them (`provenance`) and results.csv shows them, so a merged
campaign names the machine of every row.

`machine()` reads the facts once (host name, CPU model, the cores this process may run on,
kernel, privilege, netbench's version); `combine` joins several hosts' (an SSH inventory's);
`cells` turns a record's `provenance` into results.csv's columns (COLUMNS).
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any, Iterable, Mapping

from netbench import __version__
from netbench.emulation import cgroups

# results.csv's columns, in this order (experiment/store.py puts them before the per-node ones)
COLUMNS = ("host", "cpu_model", "cores", "kernel", "privilege", "netbench_version", "shard")


def privilege() -> str:
    """How netbench runs here: "root", or "rootless" (an ordinary user, in a sandbox of its own
    or not: state/places.py says, from the environment a sandbox sets and the uid)."""
    from netbench.state.places import privilege as of

    return of(os.environ, os.geteuid())


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo's first "model name", else platform.processor(); "" unknown)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model Name", "cpu model") and value.strip():
            return " ".join(value.split())
    return platform.processor() or ""


def machine(shard: str = "") -> dict[str, Any]:
    """This machine's facts as a record's `provenance` (`shard`: "I/N", "" outside a campaign)."""
    return {"host": socket.gethostname(), "cpu_model": cpu_model(), "cores": cgroups.cores(),
            "kernel": platform.release(), "privilege": privilege(), "netbench_version": __version__,
            "shard": shard}


def combine(facts: Iterable[Mapping[str, Any]], shard: str = "") -> dict[str, Any]:
    """Several hosts' facts as one `provenance`: a value they share once, else each host's,
    ";"-joined in the order given (an absent one: "")."""
    facts = list(facts)
    out: dict[str, Any] = {}
    for key in COLUMNS:  # the record's `provenance` holds the same names
        if key == "shard":
            continue
        values = [f.get(key, "") for f in facts]
        distinct = list(dict.fromkeys("" if v is None else v for v in values))
        out[key] = distinct[0] if len(distinct) == 1 else ";".join(str(v) for v in values)
    out["shard"] = shard
    return out


def cells(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """A record's `provenance` as results.csv's cells (empty for records before it)."""
    record = record or {}
    return {name: "" if record.get(name) is None else record.get(name) for name in COLUMNS}
