"""What a job's step events say beyond step times (pure): who reports, per-worker
throughput, computation versus communication, and the idleness ratio.

Events are the controller's typed events (netbench.jobs.events); each carries ``worker``
(the task's index within its role) and ``role`` ("worker" when a record does not say).
Synchronous strategies: every worker times its own steps and worker 0 is the reference
clock. ps: only the coordinator reports, one event per completed step with the worker that
ran it as ``executor``. A run record's JSON objects are read as events too.

Only ``measured`` steps are measured: warm-up, calibration and any phase a later version
adds are left out of every step time and throughput. The computation/communication split
comes from the measured steps when they carry it (split steps, ps), else from the
calibration steps (split steps run after the measured window of a fused run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, Union

from netbench.jobs import events as ev
from netbench.model.job import COORDINATOR, OWN_PACE_STRATEGIES, WORKER, JobSpec, effective_accum_steps

EventLike = Union[ev.Event, Mapping]


@dataclass(frozen=True)
class PhaseTimes:
    """Means over measured steps (seconds) and the share of step time spent communicating."""

    compute_mean_s: float
    comm_mean_s: float
    idle_ratio: float  # sum(comm + wait) / sum(compute + comm + wait), in [0, 1]
    source: str = ev.PHASE_MEASURED  # the phase of the steps it comes from (measured or calibration)
    wait_mean_s: float | None = None  # barrier or staleness gate, apart from comm (exchange strategies)
    staleness_mean: float | None = None  # updates between a step's read of the weights and its update
    staleness_max: int | None = None


def _measured(events: Iterable[ev.Event]) -> list[ev.Step]:
    return _in_phase(events, ev.PHASE_MEASURED)


def _in_phase(events: Iterable[ev.Event], phase: str) -> list[ev.Step]:
    steps = [e for e in events if isinstance(e, ev.Step) and e.phase == phase]
    return sorted(steps, key=lambda e: e.step)


def reporting_role(job: JobSpec) -> str:
    """The role whose processes stream step events."""
    return COORDINATOR if job.strategy == "ps" else WORKER


def reference_events(events: Sequence[EventLike], job: JobSpec) -> list[ev.Event]:
    """Events of the process whose steps define the run's step times: index 0 of the reporting
    role, or under ps-sync with backup workers the round's worker (round_worker)."""
    role = reporting_role(job)
    typed = ev.as_events(events)
    index = round_worker(typed) if rate_rule(job) == APPLIED else 0
    return [e for e in typed if e.task_role == role and e.worker == index]


def round_worker(events: Sequence[ev.Event]) -> int:
    """Under ps-sync with backup workers, the worker whose measured steps' gradients the rounds
    dropped least (the lowest index among equals): its steps end with the rounds it joins, so
    they time the rounds; a worker whose gradients are dropped as late steps at its own pace."""
    tallies = worker_tallies(events)
    if not tallies:
        return 0
    return min(tallies, key=lambda w: (tallies[w].steps - tallies[w].applied, w))


def measured_durations(events: Sequence[EventLike], job: JobSpec) -> list[float]:
    """The reference process's measured step durations in seconds, in step order."""
    return [e.duration for e in _measured(reference_events(events, job))]


def images_per_sec(images: float, seconds: float) -> float | None:
    """Throughput of `images` over `seconds`; None when no time passed. The one formula
    behind every live and recorded images/sec."""
    return images / seconds if seconds > 0 else None


def per_worker_images_per_sec(events: Sequence[EventLike], job: JobSpec, workers: int) -> tuple[float, ...]:
    """images/sec each worker trained at, over measured steps, in worker order.

    Synchronous: the worker's own batch(es) per step over its mean step time. ps: the
    batches the worker completed over the coordinator's measured window. A worker with
    no measured step is left out.
    """
    typed = ev.as_events(events)
    if job.strategy == "ps":
        steps = _measured(e for e in typed if e.task_role == COORDINATOR)
        window = sum(e.duration for e in steps)
        if window <= 0:
            return ()
        counts = [sum(1 for e in steps if e.executor == w) for w in range(workers)]
        return tuple(count * job.batch_size / window for count in counts if count)
    per_step = job.batch_size * effective_accum_steps(job)
    rates = []
    for index in range(workers):
        mine = [e.duration for e in _measured(e for e in typed if e.task_role == WORKER and e.worker == index)]
        if mine and sum(mine) > 0:
            rates.append(per_step * len(mine) / sum(mine))
    return tuple(rates)


# How a run's images/sec comes from its steps (rate_rule). CHIEF: images_per_step over the
# reference process's mean step (the workers leave each step together; TF's ps: its coordinator
# counts every worker's step). OWN_RATES (job.OWN_PACE_STRATEGIES): each worker's own rate, its
# batch per step x its steps over its own time, summed. APPLIED (ps-sync with backup workers):
# the images of each worker's steps whose gradient a round applied (not dropped as late) over
# its own time, summed. The results, the live metrics and the terminal all use this rule.
CHIEF, OWN_RATES, APPLIED = "chief", "own-rates", "applied"


def rate_rule(job: JobSpec) -> str:
    """CHIEF, OWN_RATES or APPLIED: how `job`'s images/sec comes from its steps (above)."""
    if job.strategy in OWN_PACE_STRATEGIES:
        return OWN_RATES
    if job.strategy == "ps-sync" and job.backup_workers:
        return APPLIED
    return CHIEF


@dataclass(frozen=True)
class Tally:
    """One worker's steps so far: how many, how many a round applied (all but those a ps-sync
    round dropped as late), and their seconds."""

    steps: int = 0
    applied: int = 0
    seconds: float = 0.0

    def add(self, step: ev.Step) -> "Tally":
        dropped = bool(dict(step.extra).get("dropped"))
        return Tally(self.steps + 1, self.applied + (not dropped), self.seconds + step.duration)


def worker_tallies(events: Iterable[ev.Event]) -> dict[int, Tally]:
    """Each worker's Tally of its measured steps, by worker index."""
    out: dict[int, Tally] = {}
    for e in _measured(e for e in events if e.task_role == WORKER):
        out[e.worker or 0] = out.get(e.worker or 0, Tally()).add(e)
    return out


def summed_rate(job: JobSpec, tallies: Mapping[int, Tally], workers: int) -> float | None:
    """The cluster's images/sec from each worker's tally under rate_rule OWN_RATES or APPLIED;
    None under CHIEF, or while a worker has no timed step."""
    rule = rate_rule(job)
    if rule == CHIEF:
        return None
    per_step = job.batch_size * effective_accum_steps(job)
    total = 0.0
    for index in range(workers):
        tally = tallies.get(index)
        if tally is None or tally.seconds <= 0:
            return None
        total += per_step * (tally.steps if rule == OWN_RATES else tally.applied) / tally.seconds
    return total


def cluster_throughput(stats: dict, events: Sequence[EventLike], job: JobSpec, workers: int) -> dict:
    """`stats` (stats.step_stats as a dict, from the reference process's steps) with images/sec
    the cluster's where rate_rule is not CHIEF: summed_rate over every worker's measured steps,
    its standard error scaled alike. The step times stay the reference process's own.
    Unchanged under CHIEF (the workers leave each step together: the sum is W x the chief's),
    or when a worker reported no measured step."""
    total = summed_rate(job, worker_tallies(ev.as_events(events)), workers)
    if total is None or not stats.get("images_per_sec"):
        return stats
    factor = total / stats["images_per_sec"]
    return {**stats, "images_per_sec": total, "images_per_sec_stderr": stats["images_per_sec_stderr"] * factor}


def phase_times(events: Sequence[EventLike], job: JobSpec) -> PhaseTimes | None:
    """Computation and communication per step, over every reporting process: from the
    measured steps when they carry the split, else from the calibration steps.

    None when no step carries a split (older records) or they took no time.
    """
    role = reporting_role(job)
    mine = [e for e in ev.as_events(events) if e.task_role == role]
    for phase in (ev.PHASE_MEASURED, ev.PHASE_CALIBRATION):
        steps = [e for e in _in_phase(mine, phase) if e.compute is not None and e.comm is not None]
        if steps:
            compute = sum(e.compute for e in steps)
            comm = sum(e.comm for e in steps)
            waits = [e.wait for e in steps if e.wait is not None]
            wait = sum(waits)
            if compute + comm + wait <= 0:
                return None
            stale = [e.staleness for e in steps if e.staleness is not None]
            return PhaseTimes(compute_mean_s=compute / len(steps), comm_mean_s=comm / len(steps),
                              idle_ratio=(comm + wait) / (compute + comm + wait), source=phase,
                              wait_mean_s=wait / len(steps) if waits else None,
                              staleness_mean=sum(stale) / len(stale) if stale else None,
                              staleness_max=max(stale) if stale else None)
    return None


def step_kind(events: Sequence[EventLike], job: JobSpec) -> str | None:
    """How the reference process compiled its steps (events.STEP_FUSED or STEP_SPLIT), from
    its start event; None when it does not say (older records, ps)."""
    for event in reference_events(events, job):
        if isinstance(event, ev.Start):
            return event.step
    return None


def model_facts(events: Sequence[EventLike], job: JobSpec) -> dict:
    """params, model_bytes, input_shape and classes from the reference process's start event."""
    for event in reference_events(events, job):
        if isinstance(event, ev.Start):
            return {"params": event.params, "model_bytes": event.model_bytes,
                    "input_shape": "x".join(str(d) for d in event.input_shape),
                    "classes": event.classes}
    return {"params": 0, "model_bytes": 0, "input_shape": "", "classes": 0}
