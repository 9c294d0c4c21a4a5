"""What a figure or table can show of a design point: a Measure names a run's measured
value (an Observation metric, i.e. a record's or results.csv's column), its words and unit,
and the domain its interval keeps to (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from netbench.report.groups import Group
from netbench.stats import MIN_RUNS, Interval, log_t_interval, share_interval


@dataclass(frozen=True)
class Measure:
    """A measured value per run. `domain` "positive": geometric mean and a log-scale t
    interval (throughput, times); "share": a value in [0, 1] with a logit-scale interval,
    shown times `scale` (100: percent). `companion`: a column drawn dashed beside it, e.g.
    the step time a model predicted beside the measured one. `to_target`: a value a run has only
    once it reached the sweep's target accuracy (time to target): a run with a target and an
    accuracy curve but no value never reached it, and is counted as such, never as zero."""

    column: str
    label: str
    unit: str
    domain: str = "positive"
    scale: float = 1.0
    companion: str | None = None
    companion_label: str = "predicted"
    to_target: bool = False
    # lines keep to the data's range instead of starting at zero (accuracy, as the studies plot
    # it: a few points between algorithms matter and would be a flat band on 0..100 %); bars
    # always stand on zero
    zoom: bool = False

    @property
    def axis_label(self) -> str:
        return f"{self.label} ({self.unit})"

    def values(self, group: Group) -> list[float]:
        """The group's runs' values, in display units (times `scale`)."""
        return [self.scale * v for v in group.metric_values(self.column)]

    def companion_value(self, group: Group) -> float | None:
        """The mean of the companion column over the group's runs (display units), if any has it."""
        if self.companion is None:
            return None
        found = group.metric_values(self.companion)
        return self.scale * sum(found) / len(found) if found else None

    def unreached(self, group: Group) -> int:
        """How many of the group's ok runs had a target and never reached it (0 unless `to_target`)."""
        if not self.to_target:
            return 0
        return sum(1 for o in group.observations if o.status == "ok" and o.curve and o.target_accuracy is not None
                   and o.metric(self.column) is None)

    def interval(self, group: Group, confidence: float, min_n: int = MIN_RUNS) -> Interval | None:
        """Centre and interval over the group's runs in display units; None without values."""
        raw = group.metric_values(self.column)
        if not raw:
            return None
        if self.domain == "share":
            return share_interval(raw, confidence, min_n).scaled(self.scale)
        return log_t_interval(raw, confidence, min_n).scaled(self.scale)

    def centre_words(self) -> str:
        return "mean" if self.domain == "share" else "geometric mean"


THROUGHPUT = Measure("images_per_sec", "throughput", "images/s")
STEP_TIME = Measure("step_time_s", "mean step time", "s", companion="predicted_step_s")
IDLENESS = Measure("idleness", "idleness: share of a step waiting on the network", "%", domain="share", scale=100)
ACCURACY = Measure("test_accuracy", "test accuracy", "%", domain="share", scale=100, zoom=True)
TIME_TO_TARGET = Measure("time_to_target_s", "training time to the target accuracy", "s", to_target=True)
# what write_report draws against each factor, where the folder has it (file name: column's first word);
# TIME_TO_TARGET is drawn on its own, as bars per algorithm at every network point (summary.report_figures)
# a user's command that reports no steps: not throughput (report/link_bytes.py says so)
LINK_BYTES = Measure("link_bytes_per_s", "bytes sent per node", "B/s")
REPORTED: Sequence[tuple[str, Measure]] = (("throughput", THROUGHPUT), ("idleness", IDLENESS),
                                           ("accuracy", ACCURACY), ("steptime", STEP_TIME),
                                           ("linkbytes", LINK_BYTES))
