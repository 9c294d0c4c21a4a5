"""Sweep planning: levels of each factor -> the ordered list of runs (pure)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Sequence

from netbench import units
from netbench.model.profile import Profile, validate


@dataclass(frozen=True)
class SweepLevels:
    """Levels per factor in canonical units; an empty tuple keeps the base profile's value."""

    delay_us: tuple[int, ...] = ()
    rate_bps: tuple[int, ...] = ()
    loss: tuple[float, ...] = ()
    jitter_us: tuple[int, ...] = ()


@dataclass(frozen=True)
class RunPlan:
    index: int
    profile: Profile
    repeat: int
    job: Any = None  # a JobSpec for this run only (playbooks); None: the sweep's job
    workers: int | None = None  # nodes/processes for this run only; None: the sweep's workers

    @property
    def run_id(self) -> str:
        return f"r{self.index:03d}"


def _levels(values: Sequence, base_value) -> tuple:
    return tuple(values) if values else (base_value,)


def profile_name(profile: Profile) -> str:
    """A name for a swept point: "d10ms-r250mbit-l1%" style, stable and readable."""
    parts = [f"d{units.format_duration_us(profile.delay_us)}"]
    if profile.jitter_us:
        parts.append(f"j{units.format_duration_us(profile.jitter_us)}")
    if profile.rate_bps:
        parts.append(f"r{units.format_rate_bps(profile.rate_bps)}")
    if profile.loss:
        parts.append(f"l{units.format_ratio(profile.loss)}")
    return "-".join(parts)


def plan_sweep(base: Profile, levels: SweepLevels, repeat: int = 1) -> list[RunPlan]:
    """The cartesian product of the levels over `base`, each point repeated `repeat` times.

    Order: delay outermost, then rate, loss, jitter; repetitions of a point are adjacent.
    """
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    grid = itertools.product(_levels(levels.delay_us, base.delay_us), _levels(levels.rate_bps, base.rate_bps),
                             _levels(levels.loss, base.loss), _levels(levels.jitter_us, base.jitter_us))
    runs: list[RunPlan] = []
    for delay, rate, loss, jitter in grid:
        point = replace(base, delay_us=delay, rate_bps=rate, loss=loss, jitter_us=jitter)
        swept = bool(levels.delay_us or levels.rate_bps or levels.loss or levels.jitter_us)
        if swept:
            point = replace(point, name=profile_name(point))
        point = validate(point, "sweep")
        for rep in range(repeat):
            runs.append(RunPlan(index=len(runs), profile=point, repeat=rep))
    return runs
