"""Who waits for whom (pure): each rank's step times, and the rank the others waited on.

A rank is a worker (its task index within the role "worker"; a user's command: its rank). For
every run, each rank's measured steps give its step time, computation, communication and
waiting (the barrier's or the gate's, where the strategy reports it), and its own images/sec.

**Synchronous strategies** (allreduce, allreduce-accum, ps-sync without backup workers, a
user's command): every rank leaves a step together (the all-reduce ends, or the parameter
server answers the round) and the step waits for the rank whose computation ended last. That
rank *finished last* in the step: the others sat in the step's communication until it
arrived. Steps are aligned by step number across the ranks; within a step, each rank's
*tail* is the time from the end of its computation to the end of its step (``duration -
compute``: communication plus waiting). Since the ranks leave together, the rank with the
shortest tail is the one whose computation ended last, and each other rank waited its tail
minus that shortest one for it. Tails are differences within one process's clock, so ranks
on hosts with unrelated clocks compare as well as ranks on one host. A step needs a
computation time on every rank: measured steps that carry the split (split steps, the
exchange strategies, a user's job that calls ``track.computed()``) or the end of a fused step's
computation (``computed``: netbench's TensorFlow worker times it inside the compiled step),
else the calibration steps after a fused run's window; without either no rank is named.

* ``straggler``: the rank that finished last in the most aligned steps;
* ``straggler_share``: the share of aligned steps it finished last in;
* ``wait_share``: of the other ranks' step time (summed over the aligned steps), the share they
  spent waiting for the rank that finished last.

**Strategies whose workers run at their own pace** (ps-async = ASP, ps-ssp = SSP, gosgd and
adpsgd = gossip, easgd, TF's ps, ps-sync with backup workers): steps are not aligned; each
rank's own images/sec is what differs. The straggler is the rank with the lowest rate (named
only when the rates differ by more than ``OWN_PACE_MARGIN``), ``straggler_share`` is empty and
``rate_spread`` is the fastest rank's rate over the slowest's. ``wait_share`` is the share of
their step time the other ranks spent in the waiting the strategy reports (SSP's gate;
ps-async's transport window), empty where none is reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from netbench.jobs import events as ev
from netbench.model.job import COORDINATOR, WORKER, JobSpec, effective_accum_steps

SYNC, OWN_PACE = "sync", "own-pace"
# strategies whose ranks leave every step together (a user's command is assumed to be one)
SYNC_STRATEGIES = ("allreduce", "allreduce-accum", "ps-sync", "command")
OWN_PACE_MARGIN = 1.25  # the slowest rank of an own-pace run is named when the fastest is 25 % faster
# (rates of equal workers differ by a few % from run to run: 7 % was seen between two equal ps-async workers)
# results.csv's columns (csv_cells)
COLUMNS = ("straggler", "straggler_share", "wait_share", "worker_rate_spread", "dropped_gradients")


@dataclass(frozen=True)
class Rank:
    """One rank over the measured steps: means in seconds, its own images/sec; ``last_share``
    (share of aligned steps it finished last in) and ``waited_mean_s`` (per aligned step, the
    time it waited for the rank that finished last: 0 where it was that rank) for synchronous
    runs; ``dropped`` the gradients the parameter servers dropped as late (backup workers)."""

    rank: int
    node: str
    steps: int
    step_mean_s: float
    compute_mean_s: float | None = None
    comm_mean_s: float | None = None
    wait_mean_s: float | None = None
    images_per_sec: float | None = None
    last_share: float | None = None
    waited_mean_s: float | None = None
    dropped: int | None = None


@dataclass(frozen=True)
class Attribution:
    """A run's per-rank times and its straggler (see the module docstring for the definitions)."""

    mode: str  # SYNC or OWN_PACE
    ranks: tuple[Rank, ...]
    straggler: int | None = None  # a rank
    straggler_share: float | None = None
    wait_share: float | None = None
    rate_spread: float | None = None
    aligned_steps: int = 0  # synchronous: steps every rank reported with a computation time
    source: str = ev.PHASE_MEASURED  # the phase of the steps the attribution comes from

    def rank_of(self, rank: int | None) -> Rank | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    @property
    def straggler_node(self) -> str:
        found = self.rank_of(self.straggler)
        return found.node if found else ""

    def to_record(self) -> dict:
        return {**asdict(self), "ranks": [asdict(r) for r in self.ranks], "straggler_node": self.straggler_node}


def mode_of(job: JobSpec, backup_workers: int = 0) -> str:
    """SYNC for the strategies whose ranks leave each step together, OWN_PACE otherwise."""
    if job.strategy == "ps-sync" and backup_workers:
        return OWN_PACE
    return SYNC if job.strategy in SYNC_STRATEGIES or getattr(job, "command", None) is not None else OWN_PACE


def _steps(events: Sequence[ev.Event], phase: str) -> dict[int, list[ev.Step]]:
    """Each worker rank's steps of `phase`, in step order."""
    ranks: dict[int, list[ev.Step]] = {}
    for e in events:
        if isinstance(e, ev.Step) and e.task_role == WORKER and e.phase == phase:
            ranks.setdefault(e.worker or 0, []).append(e)
    return {r: sorted(s, key=lambda e: e.step) for r, s in sorted(ranks.items())}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _dropped(steps: list[ev.Step]) -> int | None:
    flags = [dict(s.extra).get("dropped") for s in steps]
    return sum(1 for f in flags if f) if any(f is not None for f in flags) else None


def _rank(rank: int, node: str, steps: list[ev.Step], images_per_step: int) -> Rank:
    total = sum(s.duration for s in steps)
    return Rank(rank=rank, node=node, steps=len(steps), step_mean_s=total / len(steps) if steps else 0.0,
                compute_mean_s=_mean([s.compute for s in steps if s.compute is not None]),
                comm_mean_s=_mean([s.comm for s in steps if s.comm is not None]),
                wait_mean_s=_mean([s.wait for s in steps if s.wait is not None]),
                images_per_sec=images_per_step * len(steps) / total if total > 0 else None,
                dropped=_dropped(steps))


def align(ranks: Mapping[int, list[ev.Step]]) -> list[dict[int, ev.Step]]:
    """The steps every rank reported with a computation time, as {rank: step} by step number."""
    by_number: dict[int, dict[int, ev.Step]] = {}
    for rank, steps in ranks.items():
        for s in steps:
            if s.computation is not None:
                by_number.setdefault(s.step, {})[rank] = s
    return [by_number[n] for n in sorted(by_number) if len(by_number[n]) == len(ranks)]


def last_in(step: Mapping[int, ev.Step]) -> tuple[int | None, dict[int, float]]:
    """The rank that finished last in one aligned step (the shortest tail: its computation
    ended last) and how long each rank waited for it (its tail minus that one's; 0 for it).
    Ranks tied for the shortest tail: nobody finished last in the step (None) and nobody waited."""
    tails = {r: max(0.0, s.duration - (s.computation or 0.0)) for r, s in step.items()}
    shortest = min(tails.values())
    lasts = [r for r, t in tails.items() if t == shortest]
    if len(lasts) > 1:
        return None, {r: 0.0 for r in tails}
    return lasts[0], {r: tails[r] - shortest for r in tails}


def _named(nodes: Sequence[str], rank: int) -> str:
    return nodes[rank] if rank < len(nodes) else f"worker{rank}"


def attribute(events: Sequence[ev.Event | Mapping], job: JobSpec, nodes: Sequence[str] = (),
              backup_workers: int = 0) -> Attribution | None:
    """The run's per-rank times and straggler; None with fewer than two reporting ranks (a
    single worker, TF's ps without executors). `nodes`: the workers' nodes in rank order."""
    typed = ev.as_events(events)
    per_step = job.batch_size * effective_accum_steps(job)
    if job.strategy == "ps":
        return _ps(typed, job, nodes)
    measured = _steps(typed, ev.PHASE_MEASURED)
    if len(measured) < 2:
        return None
    mode = mode_of(job, backup_workers)
    if mode == OWN_PACE:
        ranks = tuple(_rank(r, _named(nodes, r), s, per_step) for r, s in measured.items())
        return _own_pace(ranks)
    source, aligned = ev.PHASE_MEASURED, align(measured)
    if not aligned:
        calibration = _steps(typed, ev.PHASE_CALIBRATION)
        source, aligned = ev.PHASE_CALIBRATION, align(calibration) if len(calibration) == len(measured) else []
    lasts = {r: 0 for r in measured}
    waited = {r: 0.0 for r in measured}
    others_wait = others_time = 0.0
    for step in aligned:
        last, waits = last_in(step)
        if last is not None:
            lasts[last] += 1
        for r, w in waits.items():
            waited[r] += w
            if r != last:
                others_wait += w
                others_time += step[r].duration
    count = len(aligned)
    ranks = tuple(_rank(r, _named(nodes, r), s, per_step) for r, s in measured.items())
    if count:
        ranks = tuple(_with(rank, last_share=lasts[rank.rank] / count, waited_mean_s=waited[rank.rank] / count)
                      for rank in ranks)
        straggler = max(lasts, key=lambda r: (lasts[r], -r))
        if not lasts[straggler]:  # every step a tie: nobody made the others wait
            return Attribution(mode=SYNC, ranks=ranks, wait_share=0.0, rate_spread=_spread(ranks),
                               aligned_steps=count, source=source)
        return Attribution(mode=SYNC, ranks=ranks, straggler=straggler, straggler_share=lasts[straggler] / count,
                           wait_share=others_wait / others_time if others_time > 0 else None,
                           rate_spread=_spread(ranks), aligned_steps=count, source=source)
    return Attribution(mode=SYNC, ranks=ranks, rate_spread=_spread(ranks))


def _with(rank: Rank, **changes) -> Rank:
    return Rank(**{**asdict(rank), **changes})


def _spread(ranks: Sequence[Rank]) -> float | None:
    rates = [r.images_per_sec for r in ranks if r.images_per_sec]
    return max(rates) / min(rates) if len(rates) >= 2 else None


def _own_pace(ranks: tuple[Rank, ...]) -> Attribution:
    spread = _spread(ranks)
    rated = [r for r in ranks if r.images_per_sec]
    slowest = min(rated, key=lambda r: (r.images_per_sec, r.rank)) if rated else None
    straggler = slowest.rank if slowest is not None and spread is not None and spread > OWN_PACE_MARGIN else None
    others = [r for r in ranks if r.rank != straggler and r.wait_mean_s is not None]
    time = sum(r.step_mean_s * r.steps for r in others)
    wait = sum((r.wait_mean_s or 0.0) * r.steps for r in others)
    return Attribution(mode=OWN_PACE, ranks=ranks, straggler=straggler, rate_spread=spread,
                       wait_share=wait / time if others and time > 0 else None)


def _ps(typed: list[ev.Event], job: JobSpec, nodes: Sequence[str]) -> Attribution | None:
    """TF's ps: only the coordinator reports, each step naming the worker that ran it; a
    worker's rate is its batches over the coordinator's measured window."""
    steps = [e for e in typed if isinstance(e, ev.Step) and e.task_role == COORDINATOR and e.measured]
    window = sum(s.duration for s in steps)
    executors = sorted({s.executor for s in steps if s.executor is not None})
    if len(executors) < 2 or window <= 0:
        return None
    ranks = []
    for w in executors:
        mine = [s for s in steps if s.executor == w]
        ranks.append(Rank(rank=w, node=_named(nodes, w), steps=len(mine),
                          step_mean_s=sum(s.duration for s in mine) / len(mine),
                          images_per_sec=len(mine) * job.batch_size / window))
    return _own_pace(tuple(ranks))


def csv_cells(record: Mapping | None) -> dict[str, object]:
    """results.csv's straggler columns from a run record's ``stragglers`` (empty without)."""
    if not record:
        return {name: "" for name in COLUMNS}
    dropped = [r.get("dropped") for r in record.get("ranks", ())]

    def rounded(value, digits: int = 4):
        return "" if value is None else round(value, digits)

    return {"straggler": record.get("straggler_node") or "",
            "straggler_share": rounded(record.get("straggler_share")),
            "wait_share": rounded(record.get("wait_share")),
            "worker_rate_spread": rounded(record.get("rate_spread")),
            "dropped_gradients": sum(d for d in dropped if d) if any(d is not None for d in dropped) else ""}


def sentence(record: Mapping | None) -> str | None:
    """The terminal's line: "n2 was the last to finish in 96 % of steps; the others waited 44 %
    of their step" (synchronous), "n2 trained at the lowest rate: 12.0 images/s against 30.5
    (2.5x)" (own pace); None when no rank is named."""
    if not record or record.get("straggler") is None:
        return None
    who = record.get("straggler_node") or f"worker{record['straggler']}"
    if record.get("mode") == SYNC:
        line = f"{who} was the last to finish in {100 * record['straggler_share']:.0f} % of steps"
        if record.get("wait_share") is not None:
            line += f"; the others waited {100 * record['wait_share']:.0f} % of their step"
        return line
    rates = [r["images_per_sec"] for r in record.get("ranks", ()) if r.get("images_per_sec")]
    mine = next(r["images_per_sec"] for r in record["ranks"] if r["rank"] == record["straggler"])
    return (f"{who} trained at the lowest rate: {mine:.1f} images/s against {max(rates):.1f} "
            f"({record['rate_spread']:.1f}x)")
