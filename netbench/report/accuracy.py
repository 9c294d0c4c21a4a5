"""The algorithms' section of report.md: per algorithm and network point, throughput, idleness,
waiting, staleness, test accuracy and time to the target accuracy, with t intervals over
repetitions, and which algorithm and network won on time and on accuracy (papers 003, 004).

Reads the run records (runs/<id>.json, through the store); runs without an evaluation (no
accuracy run) are left out, so a folder without any gives no section.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from netbench.experiment.store import ResultStore, read_json
from netbench.stats import Interval, t_interval


@dataclass(frozen=True)
class AlgorithmPoint:
    """One algorithm at one network point (its repetitions together)."""

    strategy: str
    workers: int
    latency_ms: float
    runs: int
    ok: int
    images_per_sec: Interval | None
    idleness: float | None  # mean over runs of (comm + wait) / step
    wait_s: float | None
    staleness: float | None
    accuracy: Interval | None  # final held-out accuracy
    time_to_target: Interval | None  # over the runs that reached it
    reached: int  # runs that reached the target
    spread: float | None  # mean final spread between workers' accuracies


def _key(record: Mapping[str, Any]) -> tuple[str, int, float]:
    profile = record.get("profile") or {}
    return str(record.get("strategy")), int(record.get("workers", 0)), profile.get("delay_us", 0) / 1000


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _interval(values: Sequence[float | None], confidence: float) -> Interval | None:
    kept = [v for v in values if v is not None]
    return t_interval(kept, confidence) if kept else None


def algorithm_points(records: Sequence[Mapping[str, Any]], confidence: float = 0.99) -> list[AlgorithmPoint]:
    """The accuracy runs grouped by (strategy, workers, one-way latency), in that order."""
    groups: dict[tuple[str, int, float], list[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("accuracy_curve"):
            groups.setdefault(_key(record), []).append(record)
    points = []
    for (strategy, workers, latency), runs in sorted(groups.items()):
        ok = [r for r in runs if r.get("status") == "ok"]
        points.append(AlgorithmPoint(
            strategy=strategy, workers=workers, latency_ms=latency, runs=len(runs), ok=len(ok),
            images_per_sec=_interval([(r.get("stats") or {}).get("images_per_sec") for r in ok], confidence),
            idleness=_mean([r.get("idle_ratio") for r in ok]), wait_s=_mean([r.get("wait_time_mean_s") for r in ok]),
            staleness=_mean([r.get("staleness_mean") for r in ok]),
            accuracy=_interval([r.get("test_accuracy") for r in ok], confidence),
            time_to_target=_interval([r.get("time_to_target_s") for r in ok], confidence),
            reached=sum(1 for r in ok if r.get("steps_to_target") is not None),
            spread=_mean([(r.get("accuracy_curve") or [{}])[-1].get("spread") for r in ok])))
    return points


def _text(i: Interval | None, digits: int) -> str:
    if i is None:
        return "-"
    if i.low is None:
        return f"{i.mean:,.{digits}f}"
    return f"{i.mean:,.{digits}f} ({i.low:,.{digits}f} .. {i.high:,.{digits}f})"


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def winners(points: Sequence[AlgorithmPoint]) -> list[str]:
    """Which algorithm and network point won on time (throughput; time to target) and on accuracy."""
    lines = []
    fast = [p for p in points if p.images_per_sec is not None]
    if fast:
        best = max(fast, key=lambda p: p.images_per_sec.mean)
        lines.append(f"- On throughput: {best.strategy}, {best.workers} workers, {best.latency_ms:g} ms "
                     f"({best.images_per_sec.mean:,.0f} images/s).")
    timed = [p for p in points if p.time_to_target is not None]
    if timed:
        best = min(timed, key=lambda p: p.time_to_target.mean)
        lines.append(f"- On time to the target accuracy: {best.strategy}, {best.workers} workers, "
                     f"{best.latency_ms:g} ms ({best.time_to_target.mean:.2f} s of training).")
    scored = [p for p in points if p.accuracy is not None]
    if scored:
        best = max(scored, key=lambda p: p.accuracy.mean)
        lines.append(f"- On accuracy: {best.strategy}, {best.workers} workers, {best.latency_ms:g} ms "
                     f"(test accuracy {best.accuracy.mean:.3f}).")
        for latency in sorted({p.latency_ms for p in scored}):
            here = [p for p in scored if p.latency_ms == latency]
            top = max(here, key=lambda p: p.accuracy.mean)
            quick = max((p for p in here if p.images_per_sec is not None), key=lambda p: p.images_per_sec.mean,
                        default=None)
            lines.append(f"- At {latency:g} ms: most accurate {top.strategy} ({top.accuracy.mean:.3f})"
                         + (f", fastest {quick.strategy} ({quick.images_per_sec.mean:,.0f} images/s)" if quick else "")
                         + ".")
    return lines


def accuracy_markdown(points: Sequence[AlgorithmPoint], confidence: float) -> str:
    """The report.md section ('' without accuracy runs)."""
    if not points:
        return ""
    lines = ["", "## Algorithms: throughput, idleness and accuracy", "",
             f"Per algorithm and network point; intervals are {confidence:.0%} t intervals over repetitions. "
             "Idleness: (communication + waiting) / step; waiting: held by a barrier or staleness gate; "
             "staleness: updates applied between a step's read of the weights and its update; time to "
             "target: seconds of training (evaluations excluded) until the held-out accuracy first reached "
             "the target, over the runs that reached it; spread: the largest minus the smallest worker's "
             "final accuracy (decentralised algorithms).", "",
             "| algorithm | workers | latency ms | ok/runs | images/s | idleness | wait ms | staleness "
             "| test accuracy | reached | time to target s | spread |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.strategy} | {p.workers} | {p.latency_ms:g} | {p.ok}/{p.runs} | "
                     f"{_text(p.images_per_sec, 0)} | {_opt(p.idleness, '.0%')} | "
                     f"{_opt(None if p.wait_s is None else p.wait_s * 1000, '.1f')} | {_opt(p.staleness, '.2f')} | "
                     f"{_text(p.accuracy, 3)} | {p.reached}/{p.ok} | {_text(p.time_to_target, 2)} | "
                     f"{_opt(p.spread, '.3f')} |")
    return "\n".join(lines + ["", "Which won:", "", *winners(points)]) + "\n"


def accuracy_section(results_dir: Path, confidence: float = 0.99) -> str:
    """The section for a results folder ('' when it holds no accuracy run)."""
    store = ResultStore(Path(results_dir))
    records = [read_json(path) for path in store.record_paths()]
    return accuracy_markdown(algorithm_points([r for r in records if isinstance(r, dict)], confidence), confidence)
