"""Reading a results folder into observations: one per run record (runs/<id>.json).

The folder is read through netbench.experiment.store, its one owner; a playbook's
playbook.json supplies the settings a record does not carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from netbench.errors import UsageError
from netbench.experiment.store import ResultsError, ResultStore, read_json

# factors a run can differ in, in the order tables show them
FACTORS = ("strategy", "model", "batch", "workers", "ps", "accum_steps", "data",
           "latency_ms", "bandwidth_mbit", "loss_pct", "jitter_ms", "topology", "scale")


class ReportError(UsageError):
    """A results folder that cannot be reported on."""


@dataclass(frozen=True)
class Observation:
    """One run: its factor levels, repetition, status and throughput (images/s, or None)."""

    run_id: str
    factors: tuple[tuple[str, Any], ...]
    repeat: int
    status: str
    images_per_sec: float | None
    idleness: float | None = None
    within_pct: float | None = None  # the run's own 95 % batch-means half-width, % of its mean step time

    def get(self, name: str) -> Any:
        return dict(self.factors)[name]


def _record_factors(record: Mapping[str, Any], planned: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    profile = record.get("profile") or {}
    planned = planned or {}
    rate = profile.get("rate_bps")
    topology = record.get("topology") or {}

    def pick(name: str, default: Any) -> Any:
        return planned.get(name, record.get(name, default))

    strategy = record.get("strategy", "allreduce")
    values = {
        "strategy": strategy, "model": record.get("model", "?"),
        "batch": int(record.get("batch_size", planned.get("batch", 0))), "workers": int(record.get("workers", 1)),
        "ps": int(pick("ps", 0)) if strategy == "ps" else None,
        "accum_steps": int(pick("accum_steps", 0)) if strategy == "allreduce-accum" else None,
        "data": pick("data", "synthetic"),
        "latency_ms": profile.get("delay_us", 0) / 1000, "bandwidth_mbit": None if rate is None else rate / 1e6,
        "loss_pct": round(profile.get("loss", 0) * 100, 6), "jitter_ms": profile.get("jitter_us", 0) / 1000,
        # a run with a per-pair topology: its profile is null, the topology and its scale are the network
        "topology": topology.get("name") if topology else None,
        "scale": float(topology.get("scale", 1.0)) if topology else None,
    }
    return tuple((name, values[name]) for name in FACTORS)

def observation_from_record(record: Mapping[str, Any], planned: Mapping[str, Any] | None = None) -> Observation:
    """An Observation from one runs/<id>.json record (and its playbook entry, if any)."""
    stats = record.get("stats") or {}
    ips = stats.get("images_per_sec") if record.get("status") == "ok" else None
    idle = record.get("idle_ratio")  # share of a step spent waiting on the network, where the strategy tells
    return Observation(run_id=str(record["run_id"]), factors=_record_factors(record, planned),
                       repeat=int(record.get("repeat", 0)), status=str(record.get("status", "?")),
                       images_per_sec=None if ips is None else float(ips),
                       idleness=None if idle is None else float(idle),
                       within_pct=_float_or_none(record.get("step_time_ci_pct")))


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def load_observations(results_dir: Path) -> list[Observation]:
    """Every run record of a sweep's or playbook's results folder, in run id order."""
    store = ResultStore(Path(results_dir))
    paths = store.record_paths()
    if not paths:
        raise ReportError(f"{results_dir}: no run records (runs/*.json)",
                          hint="give the folder a sweep or 'netbench run' wrote, e.g. results/smoke")
    planned: dict[str, Any] = {}
    try:
        book = store.read_playbook()
        if book is not None:
            planned = {r["run_id"]: r for r in book.get("runs", [])}
    except ResultsError as exc:
        raise ReportError(exc.message) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{store.playbook_path}: unreadable: {exc}") from None
    out = []
    for path in paths:
        try:
            record = read_json(path)
            out.append(observation_from_record(record, planned.get(record.get("run_id"))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"{path}: not a run record: {exc}") from None
    return out
