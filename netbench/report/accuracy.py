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
from netbench.report.load import ALGORITHM_SHORT, FACTORS, OWN_SETTINGS, algorithm_text, record_factors
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
    # each run's value of images_per_sec, test_accuracy and time_to_target_s, shown where there is
    # no interval (fewer than MIN_RUNS runs)
    run_values: tuple[tuple[str, tuple[float, ...]], ...] = ()
    # the other factors that set points apart where the folder varies them (bandwidth, loss,
    # model, ...), in words: '' where only algorithm, workers and latency vary
    setting: str = ""

    def values(self, name: str) -> tuple[float, ...]:
        return dict(self.run_values).get(name, ())


SHOWN = ("strategy", "workers", "latency_ms")  # the table's own columns; any other factor that varies: `setting`
WORDS = {"bandwidth_mbit": "bandwidth {} Mbit/s", "loss_pct": "loss {} %", "jitter_ms": "jitter {} ms",
         "scale": "scale {}", "accum_steps": "accum {}", "ps": "{} ps"}


def _order(factors: tuple[tuple[str, Any], ...]) -> tuple:
    return tuple((v is None, not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v))
                 for _, v in factors)


def _setting(factors: tuple[tuple[str, Any], ...], names: Sequence[str]) -> str:
    levels = dict(factors)

    def one(name: str) -> str:
        value = levels[name]
        if name == "bandwidth_mbit" and value is None:
            return "bandwidth unlimited"
        value = f"{value:g}" if isinstance(value, float) else value
        return WORDS.get(name, name + " {}").format(value)

    return ", ".join(one(n) for n in names if levels[n] is not None or n == "bandwidth_mbit")


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
    """The accuracy runs grouped by design point (every factor but the repetition, as the report's
    groups), in factor order: algorithm, ..., workers, latency, ...; factors other than those
    three that vary are the points' `setting`."""
    groups: dict[tuple[tuple[str, Any], ...], list[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("accuracy_curve"):
            groups.setdefault(record_factors(record), []).append(record)
    # a strategy's own setting (ps, accum_steps) is None for the others: only its own levels count;
    # an algorithm's (staleness, ...) is part of the algorithm's name, 'ps-ssp (s=3)', not a setting
    own = {name for name, _ in ALGORITHM_SHORT}
    others = [n for n in FACTORS if n not in SHOWN and n not in own
              and len({dict(k)[n] for k in groups} - ({None} if n in OWN_SETTINGS else set())) > 1]
    points = []
    for factors, runs in sorted(groups.items(), key=lambda item: _order(item[0])):
        strategy, workers, latency = (dict(factors)[n] for n in SHOWN)
        strategy += f" ({algorithm_text(dict(factors))})" if algorithm_text(dict(factors)) else ""
        ok = [r for r in runs if r.get("status") == "ok"]
        found = {"images_per_sec": [(r.get("stats") or {}).get("images_per_sec") for r in ok],
                 **{name: [r.get(name) for r in ok] for name in ("test_accuracy", "time_to_target_s")}}
        points.append(AlgorithmPoint(
            strategy=strategy, workers=workers, latency_ms=latency, runs=len(runs), ok=len(ok),
            images_per_sec=_interval([(r.get("stats") or {}).get("images_per_sec") for r in ok], confidence),
            idleness=_mean([r.get("idle_ratio") for r in ok]), wait_s=_mean([r.get("wait_time_mean_s") for r in ok]),
            staleness=_mean([r.get("staleness_mean") for r in ok]),
            accuracy=_interval([r.get("test_accuracy") for r in ok], confidence, share=True),
            time_to_target=_interval([r.get("time_to_target_s") for r in ok], confidence),
            reached=sum(1 for r in ok if r.get("steps_to_target") is not None),
            spread=_mean([(r.get("accuracy_curve") or [{}])[-1].get("spread") for r in ok]),
            setting=_setting(factors, others),
            run_values=tuple((name, tuple(float(v) for v in values if v is not None))
                             for name, values in found.items())))
    return points


def _text(i: Interval | None, digits: int, runs: Sequence[float] = (), scale: float = 1.0) -> str:
    """A centre with its interval in brackets; without one (fewer than MIN_RUNS runs) the runs."""
    if i is None:
        return "-"
    i = i.scaled(scale)
    if i.low is None:
        shown = f" (runs: {', '.join(f'{scale * v:,.{digits}f}' for v in runs)})" if len(runs) > 1 else ""
        return f"{i.mean:,.{digits}f}{shown}"
    return f"{i.mean:,.{digits}f} ({i.low:,.{digits}f} .. {i.high:,.{digits}f})"


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _where(p: AlgorithmPoint) -> str:
    return f"{p.strategy}, {p.workers} workers, {p.latency_ms:g} ms" + (f", {p.setting}" if p.setting else "")


def _runner_up(ranked: Sequence[AlgorithmPoint], text) -> str:
    """Every point whose number reads the same as the winner's ('tied with'), then the next one."""
    tied = [p for p in ranked[1:] if text(p) == text(ranked[0])]
    rest = ranked[1 + len(tied):]
    out = f"; tied with {'; '.join(_where(p) for p in tied)}" if tied else ""
    return out + (f"; next: {_where(rest[0])} ({text(rest[0])})" if rest else "")


def _time_lines(points: Sequence[AlgorithmPoint], target: float | None) -> list[str]:
    if target is None and not any(p.reached for p in points):
        return ["- On time to a target accuracy: no target was set (--target-accuracy), so time is "
                "judged by throughput alone."]
    aim = "the target accuracy" if target is None else f"the target accuracy {100 * target:g} %"
    # a point every one of whose runs reached the target ranks before one where only some did
    ranked = sorted((p for p in points if p.time_to_target is not None),
                    key=lambda p: (p.reached < p.ok, p.time_to_target.mean))
    if not ranked:
        return [f"- On time to {aim}: no run reached it."]

    def text(p: AlgorithmPoint) -> str:
        return (f"{_text(p.time_to_target, 2, p.values('time_to_target_s'))} s of training, "
                f"{p.reached}/{p.ok} runs reached it")

    return [f"- On time to {aim}: {_where(ranked[0])} ({text(ranked[0])}){_runner_up(ranked, text)}."]


def winners(points: Sequence[AlgorithmPoint], target: float | None = None) -> list[str]:
    """Which algorithm and network point won on time (to the target accuracy; throughput) and on
    accuracy (final test accuracy), each with its number and the runner-up's; `target`: the
    sweep's target accuracy (None: none set, and said so)."""
    if not points:
        return []
    lines = _time_lines(points, target)
    fast = sorted((p for p in points if p.images_per_sec is not None), key=lambda p: -p.images_per_sec.mean)
    if fast:
        def ips(p: AlgorithmPoint) -> str:
            return f"{_text(p.images_per_sec, 0, p.values('images_per_sec'))} images/s"

        lines.append(f"- On throughput: {_where(fast[0])} ({ips(fast[0])}){_runner_up(fast, ips)}.")
    scored = sorted((p for p in points if p.accuracy is not None), key=lambda p: -p.accuracy.mean)
    if scored:
        def acc(p: AlgorithmPoint) -> str:
            return f"test accuracy {_text(p.accuracy, 1, p.values('test_accuracy'), 100)} %"

        lines.append(f"- On accuracy: {_where(scored[0])} ({acc(scored[0])}){_runner_up(scored, acc)}.")
        for latency, setting in dict.fromkeys((p.latency_ms, p.setting) for p in sorted(
                scored, key=lambda p: p.latency_ms)):
            here = [p for p in scored if (p.latency_ms, p.setting) == (latency, setting)]
            quick = max((p for p in here if p.images_per_sec is not None), key=lambda p: p.images_per_sec.mean,
                        default=None)
            lines.append(f"- At {latency:g} ms{', ' + setting if setting else ''}: most accurate {here[0].strategy} ({100 * here[0].accuracy.mean:.1f} %)"
                         + (f", fastest {quick.strategy} ({quick.images_per_sec.mean:,.0f} images/s)" if quick else "")
                         + ".")
    return lines


def winner_blocks(points: Sequence[AlgorithmPoint], target: float | None = None) -> list:
    """report.md's 'Which won' section (none without accuracy runs)."""
    from netbench.report.document import Bullets, Heading, Paragraph

    if not points:
        return []
    return [Heading("Which won"),
            Paragraph("Centres are geometric means (accuracy: means) over a point's repetitions, with their "
                      f"intervals in brackets (none under {MIN_RUNS} runs); time to target counts training time "
                      "only, over the runs that reached it."),
            Bullets(tuple(line.removeprefix("- ") for line in winners(points, target)))]


def accuracy_blocks_of(points: Sequence[AlgorithmPoint], confidence: float) -> list:
    """The algorithms' table as blocks (none without accuracy runs)."""
    from netbench.report.document import Heading, Paragraph, Table

    if not points:
        return []
    setting = any(p.setting for p in points)  # a column for the other factors, where any varies
    rows = tuple((p.strategy, str(p.workers), f"{p.latency_ms:g}", *((p.setting,) if setting else ()),
                  f"{p.ok}/{p.runs}",
                  _text(p.images_per_sec, 0, p.values("images_per_sec")),
                  _opt(p.idleness, ".0%"), _opt(None if p.wait_s is None else p.wait_s * 1000, ".1f"),
                  _opt(p.staleness, ".2f"), _text(p.accuracy, 1, p.values("test_accuracy"), 100),
                  f"{p.reached}/{p.ok}", _text(p.time_to_target, 2, p.values("time_to_target_s")),
                  _opt(p.spread, ".3f")) for p in points)
    return [Heading("Algorithms: throughput, idleness and accuracy"),
            Paragraph(f"Per algorithm and network point: images/s and time to target are geometric means with a "
                      f"{confidence:.0%} log-scale t interval over repetitions, test accuracy a mean with an interval "
                      f"inside 0..100 %; with fewer than {MIN_RUNS} runs there is no interval. Idleness: "
                      "(communication + waiting) / step; waiting: held by a barrier or staleness gate; staleness: "
                      "updates applied between a step's read of the weights and its update; time to target: seconds "
                      "of training (evaluations excluded) until the held-out accuracy first reached the target, over "
                      "the runs that reached it; spread: the largest minus the smallest worker's final accuracy "
                      "(decentralised algorithms)."),
            Table(("algorithm", "workers", "latency ms", *(("other factors",) if setting else ()), "ok/runs", "images/s", "idleness", "wait ms", "staleness",
                   "test accuracy %", "reached", "time to target s", "spread"), rows)]


def accuracy_markdown(points: Sequence[AlgorithmPoint], confidence: float, target: float | None = None) -> str:
    """The table and which won as markdown ('' without accuracy runs)."""
    from netbench.report.document import to_markdown

    blocks = accuracy_blocks_of(points, confidence) + winner_blocks(points, target)
    return to_markdown(blocks) if blocks else ""


def read_points(results_dir: Path, confidence: float = 0.95) -> tuple[list[AlgorithmPoint], float | None]:
    """A results folder's accuracy runs as AlgorithmPoints, and the target accuracy: the one
    every run record holds (schema 10), else the manifest's job's (None: none; a folder
    several sweeps appended to: the last one's)."""
    store = ResultStore(Path(results_dir))
    records = [read_json(path) for path in store.record_paths()]
    own = {r["target_accuracy"] for r in records if isinstance(r, dict) and "target_accuracy" in r}
    target = own.pop() if len(own) == 1 else ((store.read_manifest() or {}).get("job") or {}).get("target_accuracy")
    return algorithm_points([r for r in records if isinstance(r, dict)], confidence), target
