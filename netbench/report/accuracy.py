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
from netbench.stats import MIN_RUNS, Interval, log_t_interval, share_interval


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


def _interval(values: Sequence[float | None], confidence: float, share: bool = False) -> Interval | None:
    """Positive values: geometric mean with a log-scale t interval; shares: an interval inside
    0..1; no bounds under MIN_RUNS runs (stats.log_t_interval, stats.share_interval)."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    return share_interval(kept, confidence) if share else log_t_interval([max(v, 1e-12) for v in kept], confidence)


def algorithm_points(records: Sequence[Mapping[str, Any]], confidence: float = 0.95) -> list[AlgorithmPoint]:
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
            accuracy=_interval([r.get("test_accuracy") for r in ok], confidence, share=True),
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


def accuracy_blocks_of(points: Sequence[AlgorithmPoint], confidence: float) -> list:
    """The report's section as blocks (none without accuracy runs)."""
    from netbench.report.document import Heading, Paragraph, Table

    if not points:
        return []
    rows = tuple((p.strategy, str(p.workers), f"{p.latency_ms:g}", f"{p.ok}/{p.runs}", _text(p.images_per_sec, 0),
                  _opt(p.idleness, ".0%"), _opt(None if p.wait_s is None else p.wait_s * 1000, ".1f"),
                  _opt(p.staleness, ".2f"), _text(p.accuracy, 3), f"{p.reached}/{p.ok}", _text(p.time_to_target, 2),
                  _opt(p.spread, ".3f")) for p in points)
    return [Heading("Algorithms: throughput, idleness and accuracy"),
            Paragraph(f"Per algorithm and network point: images/s and time to target are geometric means with a "
                      f"{confidence:.0%} log-scale t interval over repetitions, test accuracy a mean with an interval "
                      f"inside 0..1; with fewer than {MIN_RUNS} runs there is no interval. Idleness: (communication + "
                      "waiting) / step; waiting: held by a barrier or staleness gate; staleness: updates applied "
                      "between a step's read of the weights and its update; time to target: seconds of training "
                      "(evaluations excluded) until the held-out accuracy first reached the target, over the runs "
                      "that reached it; spread: the largest minus the smallest worker's final accuracy "
                      "(decentralised algorithms)."),
            Table(("algorithm", "workers", "latency ms", "ok/runs", "images/s", "idleness", "wait ms", "staleness",
                   "test accuracy", "reached", "time to target s", "spread"), rows),
            Paragraph("Which won:\n\n" + "\n".join(winners(points)))]


def accuracy_markdown(points: Sequence[AlgorithmPoint], confidence: float) -> str:
    """The report.md section ('' without accuracy runs)."""
    from netbench.report.document import to_markdown

    blocks = accuracy_blocks_of(points, confidence)
    return to_markdown(blocks) if blocks else ""


def accuracy_blocks(results_dir: Path, confidence: float = 0.95) -> list:
    """The section for a results folder (none when it holds no accuracy run)."""
    store = ResultStore(Path(results_dir))
    records = [read_json(path) for path in store.record_paths()]
    points = algorithm_points([r for r in records if isinstance(r, dict)], confidence)
    return accuracy_blocks_of(points, confidence)
