"""How a sweep's runs are grouped into launches, and the order each launch runs its points
(pure): the chains in which every change only narrows the path (`descending_chains`), and
`plan_launches` / `describe_launches` over them. experiment/launch.py runs the plans; its
docstring says why launches only narrow the path."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from netbench.model.job import JobSpec
from netbench.model.run import Run

ORDERS = ("descending", "random")


def follows(before: Any, after: Any) -> bool:
    """Whether profile `after` may follow profile `before` in a launch: the change only
    narrows the path (no rate, delay or jitter rises, no loss falls; no rate is unlimited)."""
    unlimited = float("inf")
    return ((after.rate_bps or unlimited) <= (before.rate_bps or unlimited) and after.delay_us <= before.delay_us
            and after.jitter_us <= before.jitter_us and after.loss >= before.loss)


def _scale(run: Run) -> float | None:
    """The scale of a run's per-pair topology (None: the run applies its profile)."""
    return None if run.pairs is None else run.pairs.scale


def run_follows(before: Run, after: Run) -> bool:
    """`follows` for runs: their profiles, and for runs with a per-pair topology (whose
    profiles are null) the topology's scale: a larger scale is a longer path (every delay
    times the scale), so a later point has the same or a lower scale. A run with a topology
    never follows one without, nor the other way."""
    if (before.pairs is None) != (after.pairs is None):
        return False
    if before.pairs is not None and (before.pairs.name != after.pairs.name or _scale(after) > _scale(before)):
        return False
    return follows(before.profile, after.profile)


# a chain's head runs the launch's warm-up (and start-up) on its path: heads are compared by the
# time this much data takes there (a round trip, and its bytes at the rate): of the order of a
# small model's gradients (the mlp's are 2.7 MB)
HEAD_BYTES = 1_000_000


def head_cost_s(run: Run) -> float:
    """How slow a launch's first point is, for choosing between chain covers: a round trip
    and HEAD_BYTES at its rate (unlimited: none)."""
    p = run.profile
    return 2 * (p.delay_us + p.jitter_us) / 1e6 + (8 * HEAD_BYTES / p.rate_bps if p.rate_bps else 0.0)


def descending_chains(runs: list[Run]) -> list[list[Run]]:
    """`runs` cut into chains in which each run `run_follows` the one before (pure): first-fit
    over the runs sorted widest first, each run joining the first chain it may follow, else
    starting one. Two sorts are tried, rate first (then delay) and delay first (then rate),
    each then by jitter, loss and a topology's scale, largest first (stable: equal points keep
    their order); the cover with fewer chains wins, then the one whose chains start on the
    faster paths (head_cost_s: each launch warms up on its first point, 10 steps by default, so
    a grid of 1-50 ms by 100 Mbit/s-1 Gbit/s starts its second launch on 10 ms / 1 Gbit/s rather
    than 50 ms / 100 Mbit/s), then rate first."""
    unlimited = float("inf")

    def rest(r: Run) -> tuple:
        return -r.profile.jitter_us, r.profile.loss, -(_scale(r) or 0.0)

    covers = [_first_fit(sorted(runs, key=lambda r: (-(r.profile.rate_bps or unlimited), -r.profile.delay_us,
                                                     *rest(r)))),
              _first_fit(sorted(runs, key=lambda r: (-r.profile.delay_us, -(r.profile.rate_bps or unlimited),
                                                     *rest(r))))]
    return min(covers, key=lambda chains: (len(chains), sum(head_cost_s(c[0]) for c in chains)))


def _first_fit(ordered: list[Run]) -> list[list[Run]]:
    chains: list[list[Run]] = []
    for run in ordered:
        chain = next((c for c in chains if run_follows(c[-1], run)), None)
        if chain is None:
            chains.append([run])
        else:
            chain.append(run)
    return chains


@dataclass(frozen=True)
class LaunchPlan:
    """The runs one launch serves, in the order it runs them (shuffled with `seed`)."""

    group: int  # the launch's place in the sweep's plan
    runs: tuple[Run, ...]
    seed: int
    order: str = "descending"


def group_key(run: Run) -> tuple[JobSpec, int, int]:
    """What runs must share to be served by one launch: the job, its worker count, the repetition."""
    return run.job, run.workers, run.repeat


def plan_launches(runs: tuple[Run, ...] | list[Run], seed: int, order: str = "descending") -> tuple[LaunchPlan, ...]:
    """The runs grouped by job configuration and repetition (in order of each group's first
    run), each group's runs shuffled with random.Random(seed * 1_000_003 + group), so one seed
    gives every group its own order, the same on every machine. "random": one launch per
    group in that order; "descending": the group's descending_chains, a launch each."""
    if order not in ORDERS:
        raise ValueError(f"unknown launch order {order!r}")
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(group_key(run), []).append(run)
    plans = []
    for number, members in enumerate(groups.values()):
        order_seed = seed * 1_000_003 + number
        shuffled = list(members)
        random.Random(order_seed).shuffle(shuffled)
        chains = descending_chains(shuffled) if order == "descending" else [shuffled]
        plans += [LaunchPlan(group=number, runs=tuple(chain), seed=order_seed, order=order) for chain in chains]
    return tuple(plans)


def describe_launches(runs, seed: int | None, isolate: bool = False, order: str = "descending") -> list[str]:
    """Lines for a dry run: each launch and its points in the order they will run (with seed
    None and order random, as grouped: the order is drawn when the sweep starts)."""
    if isolate:
        return ["--isolate: the job's processes start anew for every point"]
    plans = plan_launches(list(runs), 0 if seed is None else seed, order)
    note = f"order seed {seed}" if seed is not None else "order drawn at the start; --order-seed fixes it"
    how = ("each change only lowering rate, delay or jitter or raising loss; equal points in a random order"
           if order == "descending" else "in a random order")
    lines = [f"{len(plans)} launch(es), points {how} ({note}); "
             f"schedules and --verify launch each point on its own:"]
    for number, plan in enumerate(plans):
        shown = plan.runs if seed is not None or order == "descending" else sorted(plan.runs, key=lambda r: r.index)
        runs_text = " ".join(r.run_id for r in shown)
        lines.append(f"  launch {number} (job configuration {plan.group}): {runs_text}")
    return lines
