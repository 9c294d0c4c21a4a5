"""One run of an experiment, as sweeps and playbooks both plan it (pure).

A `Run` is resolved once, when its design is expanded: its profile, its job and its
worker count are always filled in, so nothing downstream (runner, testbeds, views,
metrics) falls back to a sweep-wide job. `Settings` is what a playbook varies per run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from netbench import units
from netbench.errors import UsageError
from netbench.model.compute import NONE, Compute
from netbench.model.job import ALGORITHM_KEYS, ALGORITHM_SETTINGS, SERVER_STRATEGIES, JobSpec
from netbench.model.profile import Profile


@dataclass(frozen=True)
class Settings:
    """Everything one run varies: the job and the network, in canonical units.

    batch is per worker; workers counts training processes (for `ps`, besides the
    parameter servers); ps is used by the `ps` strategy only and accum_steps by
    `allreduce-accum` only; staleness (ps-ssp), tau and elastic_alpha (easgd), gossip_p
    (gosgd) and backup_workers (ps-sync) and pipeline (ps-async) by their strategy only, None where the playbook does not set them (the job's
    default, or the playbook's `algorithm:` value). delay_us/jitter_us are one-way microseconds at each node's
    egress, rate_bps bits/s (None: unlimited), loss a ratio.
    """

    strategy: str = "allreduce"
    model: str = "mlp"
    batch: int = 64
    workers: int = 2
    ps: int = 1
    accum_steps: int = 4
    data: str = "synthetic"
    delay_us: int = 0
    rate_bps: int | None = None
    loss: float = 0.0
    jitter_us: int = 0
    schedule: str = ""  # the schedule file the network follows during the run ("": a static profile)
    scale: float = 1.0  # the factor on every delay of the playbook's topology (1: as the file gives them)
    framework: str = "tensorflow"  # what trains: "tensorflow" or "torch" (model/frameworks.py)
    staleness: int | None = None  # ps-ssp: steps a worker may run ahead of the slowest
    tau: int | None = None  # easgd: local steps between elastic exchanges
    elastic_alpha: float | None = None  # easgd: moving rate
    gossip_p: float | None = None  # gosgd: probability of a push after each step
    backup_workers: int | None = None  # ps-sync: gradients a round may go without (the late ones, dropped)
    pipeline: int | None = None  # ps-async: pushes a worker leaves unanswered while it computes
    compute: Compute = NONE  # each node's CPU limit and step delay (factors cpus: and step_delay:)
    ranks_per_node: int = 1  # ranks on each node (model/ranks.py): workers / ranks_per_node nodes
    collective: str = "ring"  # torch's all-reduce: "ring" or "hierarchical"

    def effective(self) -> "Settings":
        """The same settings with the ones this strategy ignores set to their defaults."""
        changes: dict[str, Any] = {}
        if self.strategy not in SERVER_STRATEGIES:
            changes["ps"] = Settings.ps
        if self.strategy != "allreduce-accum":
            changes["accum_steps"] = Settings.accum_steps
        own = ALGORITHM_SETTINGS.get(self.strategy, ())
        changes.update((name, None) for name in ALGORITHM_KEYS if name not in own)
        return replace(self, **changes)

    @property
    def nodes(self) -> int:
        """Testbed nodes the run needs, as the job's placement puts them: one per worker, plus
        the parameter servers and the coordinator for ps."""
        if self.strategy in SERVER_STRATEGIES:  # ps adds its coordinator's node
            return self.workers + self.ps + (1 if self.strategy == "ps" else 0)
        return max(1, self.workers // max(1, self.ranks_per_node))


@dataclass(frozen=True)
class Run:
    """One run: its place in the run order, its network profile, its job and worker count.

    `point` is the design point (in written order) the run repeats; `settings` is the
    playbook design point it came from (None for a sweep from flags). With a `schedule`
    (model.schedule.Schedule), `profile` is the link the run starts on (named after the
    schedule) and `timeline` the changes the runner makes once the measured phase begins.
    With `pairs` (model.pairs.PairTopology, already scaled) the run applies that per-pair
    topology instead of its profile, which is then a null profile named after the point."""

    index: int  # position in the run order; the run id
    profile: Profile
    repeat: int
    job: JobSpec
    workers: int
    point: int = 0
    settings: Settings | None = None
    schedule: Any = None  # model.schedule.Schedule, or None: the profile holds for the whole run
    timeline: tuple = ()  # model.schedule.TimedProfile entries of `schedule`, expanded over its base
    pairs: Any = None  # model.pairs.PairTopology the run applies instead of its profile (None: the profile)
    compute: Compute = NONE  # each node's CPU limit and step delay (model/compute.py; NONE: unlimited)

    @property
    def run_id(self) -> str:
        return f"r{self.index:03d}"


def path_of(run: Run) -> Profile:
    """The profile a run's steps see: its own, or for a per-pair topology its slowest path, as
    a ring all-reduce waits on its slowest hop (the largest delay, jitter and loss and the
    lowest rate of any shaped pair; a conservative bound: every pair counts, not only the
    job's)."""
    if run.pairs is None or not run.pairs.links:
        return run.profile
    links = [link.profile for link in run.pairs.links]
    rates = [p.rate_bps for p in links if p.rate_bps]
    return replace(run.profile, delay_us=max(p.delay_us for p in links), jitter_us=max(p.jitter_us for p in links),
                   loss=max(p.loss for p in links), rate_bps=min(rates) if rates else None)


def computes(run: Run) -> tuple[Compute, ...]:
    """Every node capacity the run holds: its own, then each of its schedule's entries'."""
    from netbench.model.schedule import compute_at

    return (run.compute,) + tuple(compute_at(run.compute, entry) for entry in run.timeline)


def check_step_delays(runs) -> None:
    """Refuse a step delay (a point's, or a schedule step's) under TensorFlow's `ps`: its steps
    run inside TensorFlow's servers, with no loop of netbench's to add the delay in, so it
    would be recorded and never applied."""
    for run in runs:
        delayed = [node for point in computes(run) for node, _ in point.step_delay_s]
        if run.job.strategy == "ps" and run.job.command is None and delayed:
            raise UsageError(f"setting step_delay: strategy ps steps inside TensorFlow's own servers, where netbench "
                             f"cannot add compute time ({delayed[0]})",
                             hint="slow the node with --cpus (cpus:), or use netbench's parameter servers: "
                                  "--strategy ps-sync or ps-async")


def scaled_name(name: str, scale: float) -> str:
    """The name of a topology's point at `scale`: "world", "world-x2", "world-x0.5"."""
    return name if scale == 1 else f"{name}-x{scale:g}"


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


# a design's runs at most: about a day of 10-second runs, and what a dry run plans within seconds
MAX_RUNS = 10_000


def check_size(counts: tuple[int, ...], repeat: int, where: str) -> int:
    """The runs of a design whose points are the products of `counts` (one per group of
    crossed factors), each repeated `repeat` times, counted before any is made; over
    MAX_RUNS: UsageError naming `where` (the flags or the file and key)."""
    total = 0
    for count in counts:
        total += count
        if total * repeat > MAX_RUNS:
            break
    if total * repeat > MAX_RUNS:
        raise UsageError(f"{where}: more than {MAX_RUNS:,} runs ({total * repeat:,} at least)",
                         hint="sweep fewer levels, or split the design into several sweeps")
    return total * repeat
