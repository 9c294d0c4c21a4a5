"""What a run's evaluations say (pure): the accuracy curve, the final test accuracy, and when a
target accuracy was first reached.

The reference is the reporting role's index 0 (netbench.jobs.analysis.reporting_role: worker 0,
or the ps coordinator), whose model the curve follows; under easgd it is the centre variable
that worker 0 reads from the servers and scores (``of: centre``), the model the EASGD paper
reports, while the spread stays that of the workers' replicas. Every worker of the exchange and
all-reduce strategies evaluates its own model at the same step counts; the ``spread`` of a
point is the largest minus the smallest of their accuracies (0 when every worker holds the
same model; None when only one process evaluated): the divergence between replicas that
decentralised training shows. Times: ``wall_s`` from the start of the reference's first step
to the evaluation (evaluations included), ``train_s`` the seconds spent in training steps
(evaluations left out): time-to-accuracy is in training time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from netbench.jobs import events as ev
from netbench.jobs.analysis import EventLike, reporting_role
from netbench.model.job import JobSpec


@dataclass(frozen=True)
class CurvePoint:
    step: int  # training steps done by the reference when it evaluated
    wall_s: float
    train_s: float
    accuracy: float
    spread: float | None = None

    def to_record(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AccuracySummary:
    curve: tuple[CurvePoint, ...]
    test_accuracy: float | None  # the last evaluation's
    steps_to_target: int | None
    time_to_target_s: float | None  # training seconds to the first evaluation at or above the target


def curve(events: Sequence[EventLike], job: JobSpec) -> tuple[CurvePoint, ...]:
    """The reference's evaluations in step order, with the spread over every evaluator."""
    role = reporting_role(job)
    typed = [e for e in ev.as_events(events) if e.task_role == role]
    scored = [e for e in typed if isinstance(e, ev.Eval)]
    evals = [e for e in scored if e.of is None]  # each worker's own model
    centre = [e for e in scored if e.of == ev.EVAL_OF_CENTRE]
    mine = sorted(centre or (e for e in evals if e.worker in (0, None)), key=lambda e: e.step)
    if not mine:
        return ()
    steps = sorted((e for e in typed if isinstance(e, ev.Step) and e.worker in (0, None)), key=lambda e: e.step)
    origin = steps[0].start if steps else mine[0].time - mine[0].train_s
    evaluators = {e.worker for e in evals}
    points = []
    for e in mine:
        same = [o.accuracy for o in evals if o.step == e.step]
        spread = max(same) - min(same) if len(evaluators) > 1 and len(same) > 1 else None
        points.append(CurvePoint(step=e.step, wall_s=e.time - origin, train_s=e.train_s,
                                 accuracy=e.accuracy, spread=spread))
    return tuple(points)


def first_reaching(points: Sequence[CurvePoint], target: float | None) -> CurvePoint | None:
    """The first point at or above `target` (None: no target, or never reached)."""
    if target is None:
        return None
    return next((p for p in points if p.accuracy >= target), None)


def summarise(events: Sequence[EventLike], job: JobSpec) -> AccuracySummary:
    points = curve(events, job)
    hit = first_reaching(points, job.target_accuracy)
    return AccuracySummary(curve=points, test_accuracy=points[-1].accuracy if points else None,
                           steps_to_target=hit.step if hit else None,
                           time_to_target_s=hit.train_s if hit else None)
