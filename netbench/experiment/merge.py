"""A campaign's shards merged into one results folder (CAMPAIGN/merged/), which every reader of
a results folder (the report, calibration, the benchmarks) takes as one design's.

merged/ holds each design run's record and row, from the shard that ran it (each row says
where it ran: host, CPU, cores, kernel, privilege, netbench's version, shard), playbook.json of
the whole design and a manifest naming each shard's session. The shards' extra runs of the
reference point (model/shard.py) are left out of it: they are not the design's; the machine
comparison (report/machines.py) reads them from the shards. merged/ is made anew each time,
beside the old one, then put in its place; the shards' folders are only read.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from netbench.experiment import campaign
from netbench.experiment.jsonfile import read_json, write_json
from netbench.experiment.store import MANIFEST, PLAYBOOK_RECORD, ResultStore, RunResult
from netbench.model.design import COMPLETE_STATUSES


@dataclass(frozen=True)
class Missing:
    """A design run the campaign has no complete record of."""

    run_id: str
    shard: int
    status: str | None  # None: never run; else the status its record gives (failed)
    error: str = ""

    def text(self) -> str:
        return f"{self.run_id} ({'not run' if self.status is None else self.status + (': ' + self.error if self.error else '')})"


@dataclass(frozen=True)
class Merged:
    folder: Path  # CAMPAIGN/merged
    record: Mapping[str, Any]  # campaign.json
    runs: int  # the design's
    missing: tuple[Missing, ...]

    @property
    def complete(self) -> bool:
        return not self.missing

    def missing_text(self, limit: int = 12) -> str:
        """What is missing, by shard: "shard 1: r004 (not run), r007 (failed: ...)"."""
        by_shard: dict[int, list[str]] = {}
        for item in self.missing:
            by_shard.setdefault(item.shard, []).append(item.text())
        parts = []
        for shard, items in sorted(by_shard.items()):
            shown = ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")
            parts.append(f"shard {shard}: {shown}")
        return "; ".join(parts)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = read_json(path)
    except (OSError, ValueError):
        return None  # torn: not done, as resume counts it
    return record if isinstance(record, dict) else None


def merge(folder: Path) -> Merged:
    """Make CAMPAIGN/merged/ from the shards' folders; what the design still lacks is in `missing`."""
    folder = Path(folder)
    record = campaign.require_campaign(folder)
    target = folder / campaign.MERGED_DIR
    building = folder / f".{campaign.MERGED_DIR}.building"
    if building.exists():
        shutil.rmtree(building)
    store = ResultStore(building)
    store.create()
    names = {f.name for f in fields(RunResult)}
    missing = []
    manifests: list[dict[str, Any]] = []
    design = [e for e in record["runs"] if not e.get("reference")]
    for index in range(int(record["shards"])):
        manifest = _read(campaign.shard_dir(folder, index) / MANIFEST)
        if manifest is not None:
            manifests.append({"shard": index, **manifest})
    found_in = {index: ResultStore(campaign.shard_dir(folder, index)).records() for index in range(int(record["shards"]))}
    for entry in design:
        shard = int(entry["shard"])
        found = found_in[shard].get(entry["run_id"])
        if found is None:
            missing.append(Missing(entry["run_id"], shard, None))
            continue
        if found.get("status") not in COMPLETE_STATUSES:
            missing.append(Missing(entry["run_id"], shard, str(found.get("status")), str(found.get("error") or "")[:200]))
        store.add(RunResult(**{k: v for k, v in found.items() if k in names}))
    write_json(building / PLAYBOOK_RECORD, {**record["design"], "campaign": {
        "shards": record["shards"], "by": record.get("by"), "reference_point": record.get("reference_point"),
        "folder": str(folder), "missing": [m.run_id for m in missing]}})
    if manifests:
        first = dict(manifests[0])
        first.pop("shard", None)
        store.write_manifest({**first, "campaign": str(folder), "shards": [
            {k: m.get(k) for k in ("shard", "host", "started", "ended", "backend", "kernel", "netbench", "cpus",
                                   "command_line")} for m in manifests]})
    old = folder / f".{campaign.MERGED_DIR}.old"
    if target.exists():
        target.rename(old)
    building.rename(target)
    if old.exists():
        shutil.rmtree(old)
    return Merged(folder=target, record=record, runs=len(design), missing=tuple(missing))
