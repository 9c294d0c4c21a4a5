"""Reading a results folder into observations: one per run record (runs/<id>.json).

The folder is read through netbench.experiment.store, its one owner; a playbook's
playbook.json supplies the settings a record does not carry. Measured values beyond
throughput (step time, idleness, and whatever numeric columns results.csv holds for a run:
test_accuracy, time_to_target_s, predicted_step_s, ...) become the observation's `metrics`;
a column a folder lacks is simply absent, and nothing is drawn for it. An accuracy run keeps
its curve (the record's accuracy_curve) and its target accuracy (the record's own; records
before schema 10: the manifest's job's, the last one's in a folder several sweeps were
appended to), so a run that never reached the target can be told from one that set none.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from netbench.errors import UsageError
from netbench.experiment.store import MANIFEST, SCHEMA_VERSION, ResultsError, ResultStore, read_json
from netbench.jobs.accuracy import CurvePoint
from netbench.model.job import ALGORITHM_KEYS, ALGORITHM_SETTINGS

# factors a run can differ in, in the order tables show them
FACTORS = ("strategy", "model", "batch", "workers", "ps", "accum_steps", "data", "framework",
           "latency_ms", "bandwidth_mbit", "loss_pct", "jitter_ms", "topology", "scale", *ALGORITHM_KEYS)
# a strategy's own settings, None for every other strategy: along strategy they are part of its
# level, and a None among their levels is no level of theirs
OWN_SETTINGS = ("ps", "accum_steps", *ALGORITHM_KEYS)
ALGORITHM_SHORT = (("staleness", "s"), ("tau", "tau"), ("elastic_alpha", "alpha"), ("gossip_p", "p"),
                   ("backup_workers", "b"), ("pipeline", "pipeline"))


def algorithm_text(levels: Mapping[str, Any]) -> str:
    """A strategy's algorithm settings in brief: 's=3', 'tau=4, alpha=0.45' ('' where it has none)."""
    return ", ".join(f"{short}={levels[name]:g}" for name, short in ALGORITHM_SHORT if levels.get(name) is not None)


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
    # every measured value of an ok run by name: images_per_sec, step_time_s (mean step, s),
    # idleness (0..1), and results.csv's numeric columns for the run (test_accuracy, ...)
    metrics: tuple[tuple[str, float], ...] = ()
    within_pct: float | None = None  # the run's own 95 % batch-means half-width, % of its mean step time
    # an accuracy run's held-out evaluations in step order (netbench.jobs.accuracy: step, wall_s,
    # train_s, accuracy 0..1, spread) and the target accuracy its sweep set (None: none set)
    curve: tuple[CurvePoint, ...] = ()
    target_accuracy: float | None = None
    # whether its window came within the precision asked (False: --max-seconds ended it first;
    # None: no precision asked, or a record from before precisions)
    precision_reached: bool | None = None

    def get(self, name: str) -> Any:
        return dict(self.factors)[name]

    def metric(self, name: str) -> float | None:
        """The run's value of `name`, or None where it has none (a failed run, an absent column)."""
        return dict(self.metrics).get(name)


def record_factors(record: Mapping[str, Any], planned: Mapping[str, Any] | None = None,
                   row: Mapping[str, Any] | None = None) -> tuple[tuple[str, Any], ...]:
    """A run record's level of every factor (FACTORS order): what its design point is."""
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
        "data": pick("data", "synthetic"), "framework": pick("framework", None) or (row or {}).get("framework") or None,
        "latency_ms": profile.get("delay_us", 0) / 1000, "bandwidth_mbit": None if rate is None else rate / 1e6,
        "loss_pct": round(profile.get("loss", 0) * 100, 6), "jitter_ms": profile.get("jitter_us", 0) / 1000,
        # a run with a per-pair topology: its profile is null, the topology and its scale are the network
        "topology": topology.get("name") if topology else None,
        "scale": float(topology.get("scale", 1.0)) if topology else None,
        # the algorithm's settings as the run used them (schema 11), else as its playbook set them
        **{name: _setting_level((record.get("algorithm") or {}).get(name, planned.get(name)))
           if name in ALGORITHM_SETTINGS.get(strategy, ()) else None for name in ALGORITHM_KEYS},
    }
    return tuple((name, values[name]) for name in FACTORS)


def _setting_level(value: Any) -> int | float | None:
    """An algorithm setting's level: a whole number as an int (staleness 3, not 3.0)."""
    number = _number(value)
    return int(number) if number is not None and number.is_integer() and not isinstance(value, float) else number


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def curve_from_record(points: Any) -> tuple[CurvePoint, ...]:
    """A record's accuracy_curve as CurvePoints (KeyError, TypeError, ValueError: not one)."""
    return tuple(CurvePoint(step=int(p["step"]), wall_s=float(p["wall_s"]), train_s=float(p["train_s"]),
                            accuracy=float(p["accuracy"]), spread=_number(p.get("spread")))
                 for p in points or ())


def observation_from_record(record: Mapping[str, Any], planned: Mapping[str, Any] | None = None,
                            row: Mapping[str, Any] | None = None, target: float | None = None) -> Observation:
    """An Observation from one runs/<id>.json record (and its playbook entry and results.csv
    row, if any; the record wins where both hold a value); `target`: the sweep's target
    accuracy (manifest.json's job), kept for a run with an accuracy curve whose record does
    not hold its own (records before schema 10)."""
    stats = record.get("stats") or {}
    ok = record.get("status") == "ok"
    ips = stats.get("images_per_sec") if ok else None
    idle = record.get("idle_ratio")  # share of a step spent waiting on the network, where the strategy tells
    metrics: dict[str, float] = {}
    curve = curve_from_record(record.get("accuracy_curve"))
    if ok:
        for source in (row or {}, record, {"step_time_s": stats.get("mean_s"), "images_per_sec": ips,
                                            "idleness": idle}):
            metrics.update((str(k), v) for k, v in ((k, _number(v)) for k, v in source.items()) if v is not None)
    return Observation(run_id=str(record["run_id"]), factors=record_factors(record, planned, row),
                       repeat=int(record.get("repeat", 0)), status=str(record.get("status", "?")),
                       images_per_sec=None if ips is None else float(ips),
                       idleness=None if idle is None else float(idle), metrics=tuple(sorted(metrics.items())),
                       within_pct=_number(record.get("step_time_ci_pct")), curve=curve,
                       target_accuracy=_number(record.get("target_accuracy",
                                                          (planned or {}).get("target_accuracy", target)))
                       if curve else None,
                       precision_reached=reached if isinstance(reached := record.get("precision_reached"), bool) else None)


def _json_object(path: Path, data: Any, what: str) -> Any:
    """`data` read from `path`, refused (ReportError naming the file) unless a JSON object or absent."""
    if data is not None and not isinstance(data, Mapping):
        raise ReportError(f"{path}: not {what}: a JSON {type(data).__name__}, not an object")
    return data


def _record(path: Path) -> Mapping[str, Any]:
    """One run record, refused naming its file when it is not one this netbench reads."""
    record = _json_object(path, read_json(path), "a run record")
    if record is None or "run_id" not in record:
        raise ReportError(f"{path}: not a run record: no run_id")
    schema = record.get("schema_version", SCHEMA_VERSION)
    if isinstance(schema, bool) or not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise ReportError(f"{path}: schema_version {schema!r}: this netbench reads records up to {SCHEMA_VERSION}",
                          hint="report it with the netbench that wrote it, or a newer one")
    return record


def load_observations(results_dir: Path) -> list[Observation]:
    """Every run record of a sweep's or playbook's results folder, in run id order."""
    store = ResultStore(Path(results_dir))
    paths = store.record_paths()
    if not paths:
        raise ReportError(f"{results_dir}: no run records (runs/*.json)",
                          hint="give the folder a sweep or 'netbench run' wrote, e.g. results/smoke")
    planned: dict[str, Any] = {}
    try:
        book = _json_object(store.playbook_path, store.read_playbook(), "a playbook record")
        if book is not None:
            planned = {r["run_id"]: r for r in book.get("runs", [])}
    except ResultsError as exc:
        raise ReportError(exc.message) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"{store.playbook_path}: unreadable: {exc}") from None
    try:
        manifest = _json_object(store.dir / MANIFEST, store.read_manifest(), "a manifest")
        job = (manifest or {}).get("job") or {}
        target = _number(job.get("target_accuracy") if isinstance(job, Mapping) else None)
    except ResultsError as exc:
        raise ReportError(exc.message) from None
    rows: dict[str, dict[str, str]] = {}
    if store.csv_path.exists() and not store.csv_path.is_file():
        raise ReportError(f"{store.csv_path}: not a file")
    if store.csv_path.is_file():  # optional: the records alone make a report
        try:
            rows = {row.get("run_id", ""): row for row in store.read_rows()}
        except (OSError, ValueError, csv.Error) as exc:
            raise ReportError(f"{store.csv_path}: unreadable: {exc}") from None
    out = []
    for path in paths:
        try:
            record = _record(path)
            run_id = record.get("run_id")
            out.append(observation_from_record(record, planned.get(run_id), rows.get(str(run_id)), target))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReportError(f"{path}: not a run record: {exc}") from None
    return out
