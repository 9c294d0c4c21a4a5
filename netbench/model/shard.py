"""A design's runs shared among the shards of a campaign (pure).

A campaign runs one design as N shards at once, each on a machine of its own (a Slurm array
task, `netbench run --shard I/N`). The share is a pure function of the design's runs, so every
shard computes the same one:

- **by repetitions** (the default, whenever the design has at least as many repetitions as
  there are shards): repetition r goes to shard r mod N. A machine is then a block: it
  measures every point of its repetitions, so no point is confounded with a machine, and the
  design's random order is kept within each shard (its runs in run order).
- **by points** (fewer repetitions than shards): the runs are shared by their estimated time
  (the longest first, each to the shard with the least so far; ties to the lower shard and the
  earlier run), so shards end at about the same time; each shard whose share lacks the
  design's reference point also measures it once (an extra run, numbered after the design's),
  so machines can be compared on one point.

The reference point is the design's first point (every factor at its first level as written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from netbench.model.run import Run

REPETITIONS, POINTS = "repetitions", "points"
REFERENCE_POINT = 0
SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class Shard:
    """Shard `index` (0-based, as Slurm's SLURM_ARRAY_TASK_ID of --array=0-(N-1)) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """"I/N" (0 <= I < N) as a Shard; ValueError saying what it takes."""
    match = SHARD.fullmatch(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not I/N (e.g. 0/4: the first of 4 shards)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise ValueError(f"{text!r}: I must be 0 to N-1 (shards are numbered from 0, as Slurm's array tasks)")
    return Shard(index, count)


@dataclass(frozen=True)
class Split:
    """Which runs each shard measures: `shards[i]` the run indices of shard i, in run order,
    an extra reference run (an index after the design's runs) last; `by` says how."""

    count: int
    by: str
    shards: tuple[tuple[int, ...], ...]
    reference_point: int = REFERENCE_POINT
    design_runs: int = 0  # indices from here on are extra reference runs

    def shard_of(self, index: int) -> int:
        return next(i for i, share in enumerate(self.shards) if index in share)

    def is_extra(self, index: int) -> bool:
        return index >= self.design_runs


def check_count(count: int, runs: int) -> None:
    """A shard count the design can fill: 1 to its number of runs (ValueError otherwise)."""
    if count < 1:
        raise ValueError(f"{count} shards: give at least 1")
    if count > runs:
        raise ValueError(f"{count} shards for a design of {runs} runs: give at most {runs}")


def split(runs: Sequence[Run], count: int, repetitions: int, seconds: Mapping[int, float] | None = None,
          reference_point: int = REFERENCE_POINT) -> Split:
    """The runs of a design (in run order, indices 0..len-1) shared among `count` shards.

    `repetitions`: the design's; `seconds`: each run's estimated time by run index (by points
    only; absent: 1 each)."""
    check_count(count, len(runs))
    if repetitions >= count:
        shares = tuple(tuple(r.index for r in runs if r.repeat % count == i) for i in range(count))
        return Split(count=count, by=REPETITIONS, shards=shares, reference_point=reference_point,
                     design_runs=len(runs))
    seconds = seconds or {}
    loads = [0.0] * count
    members: list[list[int]] = [[] for _ in range(count)]
    for run in sorted(runs, key=lambda r: (-seconds.get(r.index, 1.0), r.index)):
        shard = min(range(count), key=lambda i: (loads[i], i))
        loads[shard] += seconds.get(run.index, 1.0)
        members[shard].append(run.index)
    point_of = {r.index: r.point for r in runs}
    shares, extra = [], len(runs)
    for share in members:
        share.sort()
        if not any(point_of[i] == reference_point for i in share):
            share.append(extra)
            extra += 1
        shares.append(tuple(share))
    return Split(count=count, by=POINTS, shards=tuple(shares), reference_point=reference_point,
                 design_runs=len(runs))


def shard_runs(runs: Sequence[Run], plan: Split, shard: int) -> tuple[Run, ...]:
    """Shard `shard`'s runs: the design's it measures, in run order, then its extra reference
    run (the reference point's first repetition, renumbered after the design's runs, its
    repetition after the design's too)."""
    by_index = {r.index: r for r in runs}
    out = []
    for index in plan.shards[shard]:
        if not plan.is_extra(index):
            out.append(by_index[index])
            continue
        base = next(r for r in runs if r.point == plan.reference_point)
        repetitions = max(r.repeat for r in runs) + 1
        out.append(replace(base, index=index, repeat=repetitions + shard))
    return tuple(out)
