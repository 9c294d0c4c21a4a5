"""The live per-rank view of the run in progress (pure): each rank's mean step time, its time
outside computation, and, for synchronous strategies, the share of steps it finished last.

The same definitions as the run's record (netbench.jobs.stragglers): a step's *tail* on a
rank is its duration less its computation (communication plus waiting); of the ranks that
reported a step number, the one with the shortest tail finished last (its computation ended
last) and the others waited for it. Only measured steps that carry a computation time (a
split, or a fused step's end of computation) count towards the tails; step numbers still waiting for a rank are kept until every rank has
reported them (at most ``PENDING`` of them, the oldest dropped first).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from netbench.jobs import events as ev

PENDING = 256  # step numbers held while a rank has not reported them yet


@dataclass
class RankTimes:
    """Running sums of one run's measured steps per rank. `workers`: the run's ranks; `aligned`:
    whether its ranks leave each step together (jobs.stragglers.SYNC), so steps are compared."""

    workers: int
    aligned: bool
    steps: dict[int, int] = field(default_factory=dict)
    duration: dict[int, float] = field(default_factory=dict)
    tail: dict[int, float] = field(default_factory=dict)
    tail_steps: dict[int, int] = field(default_factory=dict)
    lasts: dict[int, int] = field(default_factory=dict)
    compared: int = 0  # step numbers every rank reported
    _pending: dict[int, dict[int, float]] = field(default_factory=dict)

    def add(self, rank: int, step: ev.Step) -> None:
        """One measured step of a worker rank."""
        self.steps[rank] = self.steps.get(rank, 0) + 1
        self.duration[rank] = self.duration.get(rank, 0.0) + step.duration
        if step.computation is None:
            return
        tail = max(0.0, step.duration - step.computation)
        self.tail[rank] = self.tail.get(rank, 0.0) + tail
        self.tail_steps[rank] = self.tail_steps.get(rank, 0) + 1
        if not self.aligned or self.workers < 2:
            return
        tails = self._pending.setdefault(step.step, {})
        tails[rank] = tail
        if len(tails) == self.workers:
            del self._pending[step.step]
            self.compared += 1
            shortest = min(tails.values())
            lasts = [r for r, t in tails.items() if t == shortest]
            if len(lasts) == 1:
                self.lasts[lasts[0]] = self.lasts.get(lasts[0], 0) + 1
        while len(self._pending) > PENDING:
            del self._pending[min(self._pending)]

    def view(self) -> dict[int, tuple[float, float | None, float | None]]:
        """rank -> (mean step time s, mean time outside computation s or None, share of the
        compared steps it finished last or None)."""
        out = {}
        for rank, count in sorted(self.steps.items()):
            tails = self.tail_steps.get(rank, 0)
            out[rank] = (self.duration[rank] / count, self.tail[rank] / tails if tails else None,
                         self.lasts.get(rank, 0) / self.compared if self.compared else None)
        return out
