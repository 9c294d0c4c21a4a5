"""Compute capacity per node: CPU limits and step delays (pure).

A node's `cpus` is a CPU quota in CPUs as Docker's `--cpus` means it (0.5: half of one core's
time, however many cores its processes use); None is unlimited. A node's `step_delay_s` is
compute time the built-in workloads and `netbench.track` add to each step of that node's
ranks (a straggler independent of CPU shares, as a slower accelerator would be).

`Compute` is one run's capacity per node; "*" stands for every node. `ComputeFactor` is one
swept factor (`--cpus n2=1,0.5,0.25`: node n2's cpus at three levels); `compute_points`
crosses the factors, first outermost. The CPU quota's cgroup plan (`quota_plan`: quota and
period in microseconds) is here too, so both cgroup versions and the fake write the same.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from netbench import units
from netbench.errors import UsageError, shown

ALL = "*"  # the node key of a level given without a node: every node
KINDS = ("cpus", "step_delay")
UNLIMITED = ("max", "none", "unlimited")  # a cpus level that lifts the limit
MIN_CPUS = 0.01
MAX_STEP_DELAY_S = 60.0
# The quota's period, in microseconds. The kernel's default is 100 ms: a node at 0.25 CPU then
# runs 25 ms and stalls 75 ms, so a 20 ms step is either unslowed or stretched by a 75 ms stall
# (measured on this machine kind: bench/cpu_quota_period.py). A 10 ms period spreads the same
# share in 2.5 ms slices, so every step of a few ms or more sees the average rate; shorter
# periods cost more scheduler work and the kernel's quota floor (1 ms) raises the lowest share.
PERIOD_US = 10_000
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller cfs quota (v1 and v2 alike)
MAX_PERIOD_US = 1_000_000
_NODE_RE = re.compile(r"n[1-9][0-9]*")


@dataclass(frozen=True)
class Compute:
    """One run's capacity per node: ((node, cpus), ...) and ((node, step delay s), ...), each
    sorted by node; a node absent is unlimited with no delay; ALL ("*") applies to every node
    not named."""

    cpus: tuple[tuple[str, float], ...] = ()
    step_delay_s: tuple[tuple[str, float], ...] = ()

    def cpus_of(self, node: str) -> float | None:
        values = dict(self.cpus)
        return values.get(node, values.get(ALL))

    def delay_of(self, node: str) -> float:
        values = dict(self.step_delay_s)
        return values.get(node, values.get(ALL, 0.0))

    @property
    def limited(self) -> bool:
        return bool(self.cpus or self.step_delay_s)

    def nodes(self) -> tuple[str, ...]:
        """The nodes it names (ALL included), sorted."""
        return tuple(sorted({n for n, _ in self.cpus} | {n for n, _ in self.step_delay_s}, key=node_order))

    def set(self, node: str, cpus: Any = "keep", step_delay_s: Any = "keep") -> "Compute":
        """The same with `node`'s cpus (None: unlimited) and/or step delay changed."""
        out = self
        if cpus != "keep":
            rest = tuple((n, v) for n, v in out.cpus if n != node)
            out = replace(out, cpus=_sorted(rest + (((node, cpus),) if cpus is not None else ())))
        if step_delay_s != "keep":
            rest = tuple((n, v) for n, v in out.step_delay_s if n != node)
            out = replace(out, step_delay_s=_sorted(rest + (((node, step_delay_s),) if step_delay_s else ())))
        return out

    def label(self) -> str:
        """"n2 0.5 CPU, n3 +40ms/step"; "" when unlimited."""
        parts = [f"{_who(n)} {v:g} CPU" for n, v in self.cpus]
        parts += [f"{_who(n)} +{units.format_duration_us(round(v * 1e6))}/step" for n, v in self.step_delay_s]
        return ", ".join(parts)

    def suffix(self) -> str:
        """A point name's part: "n2c0.5-n3s40ms"; "" when unlimited."""
        parts = [f"{_tag(n)}c{v:g}" for n, v in self.cpus]
        parts += [f"{_tag(n)}s{units.format_duration_us(round(v * 1e6))}" for n, v in self.step_delay_s]
        return "-".join(parts)

    def columns(self) -> dict[str, Any]:
        """results.csv's columns of the nodes it limits: cpus_<node> and step_delay_s_<node>
        (the node "all" for ALL)."""
        out: dict[str, Any] = {f"cpus_{_tag(n)}": v for n, v in self.cpus}
        out.update((f"step_delay_s_{_tag(n)}", v) for n, v in self.step_delay_s)
        return out

    def to_record(self) -> dict[str, Any]:
        return {"cpus": dict(self.cpus), "step_delay_s": dict(self.step_delay_s)}


NONE = Compute()


def _sorted(items) -> tuple:
    return tuple(sorted(items, key=lambda item: node_order(item[0])))


def node_order(node: str) -> tuple:
    return (0, 0) if node == ALL else (1, int(node[1:])) if _NODE_RE.fullmatch(node) else (2, node)


def _who(node: str) -> str:
    return "every node" if node == ALL else node


def _tag(node: str) -> str:
    return "all" if node == ALL else node


@dataclass(frozen=True)
class ComputeFactor:
    """One swept factor: `kind` (cpus or step_delay) of `node` at `levels` (cpus: CPUs or None
    for unlimited; step_delay: seconds)."""

    kind: str
    node: str
    levels: tuple


def compute_points(factors: Sequence[ComputeFactor], base: Compute = NONE) -> tuple[Compute, ...]:
    """The factors crossed over `base`, first outermost; (base,) without factors."""
    if not factors:
        return (base,)
    out = []
    for combo in itertools.product(*(f.levels for f in factors)):
        point = base
        for factor, value in zip(factors, combo):
            point = point.set(factor.node, **{"cpus" if factor.kind == "cpus" else "step_delay_s": value})
        out.append(point)
    return tuple(out)


# ---------------------------------------------------------------- parsing

def parse_cpus(raw: Any, where: str) -> float | None:
    """A cpus value: a positive number of CPUs ("0.5", 2), or max/none/unlimited (None)."""
    if isinstance(raw, str) and raw.strip().lower() in UNLIMITED:
        return None
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: {shown(raw)} is not a number of CPUs",
                         hint="e.g. 0.5 (half a core), 2, or max (unlimited)") from None
    if not math.isfinite(value) or value < MIN_CPUS:
        raise UsageError(f"{where}: {shown(raw)} CPUs: a limit must be at least {MIN_CPUS:g}",
                         hint="e.g. 0.5 (half a core), or max (unlimited)")
    return value


def parse_step_delay(raw: Any, where: str) -> float:
    """A step delay: a duration ("40ms"; 0 for none) -> seconds."""
    try:
        value = units.parse_duration_us(raw) / 1e6
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", hint="e.g. 40ms") from None
    if value > MAX_STEP_DELAY_S:
        raise UsageError(f"{where}: {shown(raw)} is over {MAX_STEP_DELAY_S:g} s a step", hint="e.g. 40ms")
    return value


def check_node(node: Any, where: str) -> str:
    if not isinstance(node, str) or not _NODE_RE.fullmatch(node):
        raise UsageError(f"{where}: {shown(node)} is not a node name", hint="nodes are n1, n2, ... e.g. n2=0.5")
    return node


def parse_flag(values: Sequence[str], kind: str, flag: str) -> tuple[ComputeFactor, ...]:
    """`--cpus n2=1,0.5,0.25` (repeatable; "0.5" without a node: every node) or
    `--step-delay n2=40ms` -> one factor per flag given."""
    factors, seen = [], set()
    for text in values:
        node, _, levels_text = text.rpartition("=")
        node = node.strip() or ALL
        if node != ALL:
            check_node(node, f"flag {flag}")
        if node in seen:
            raise UsageError(f"flag {flag}: node {_who(node)} given twice", hint=f"list its levels once, e.g. "
                             f"{flag} n2=1,0.5")
        seen.add(node)
        items = [item.strip() for item in levels_text.split(",")]
        if not levels_text.strip() or any(not item for item in items):
            raise UsageError(f"flag {flag}: empty level in {shown(text)}", hint=f"e.g. {flag} n2=" +
                             ("1,0.5,0.25" if kind == "cpus" else "0,40ms"))
        if kind == "step_delay":  # a unit on the last level applies to bare numbers before it
            unit = re.fullmatch(r"[0-9]*\.?[0-9]+\s*([a-z]+)", items[-1])
            items = [i + unit.group(1) if unit and re.fullmatch(r"[0-9]*\.?[0-9]+", i) and float(i) else i
                     for i in items]
            levels = tuple(parse_step_delay(i, f"flag {flag}") for i in items)
        else:
            levels = tuple(parse_cpus(i, f"flag {flag}") for i in items)
        if len(set(levels)) != len(levels):
            raise UsageError(f"flag {flag}: repeated level in {shown(text)}", hint="use --repeat for repetitions")
        factors.append(ComputeFactor(kind, node, levels))
    return tuple(factors)


def from_mapping(data: Any, where: str) -> Compute:
    """A topology file's `compute: {n2: {cpus: 0.5, step_delay: 40ms}}` -> Compute."""
    if not isinstance(data, Mapping):
        raise UsageError(f"{where}: must map nodes to their capacity", hint="e.g. compute: {n2: {cpus: 0.5}}")
    out = NONE
    for node, spec in data.items():
        check_node(node, f"{where}: {node}")
        if not isinstance(spec, Mapping) or not spec or set(spec) - {"cpus", "step_delay"}:
            raise UsageError(f"{where}: {node}: takes cpus and step_delay",
                             hint="e.g. compute: {n2: {cpus: 0.5, step_delay: 40ms}}")
        if "cpus" in spec:
            out = out.set(node, cpus=parse_cpus(spec["cpus"], f"{where}: {node}: cpus"))
        if "step_delay" in spec:
            out = out.set(node, step_delay_s=parse_step_delay(spec["step_delay"], f"{where}: {node}: step_delay"))
    return out


def playbook_factors(kind: str, data: Any, where: str) -> list[tuple[str, tuple]]:
    """A playbook's `cpus: {n2: [1, 0.5, 0.25]}` (or step_delay) -> [("cpus.n2", levels)], one factor
    per node."""
    if not isinstance(data, Mapping) or not data:
        raise UsageError(f"{where}: must map nodes to their levels", hint=f"e.g. '{kind}: {{n2: " +
                         ("[1, 0.5, 0.25]}'" if kind == "cpus" else "[0ms, 40ms]}'"))
    out = []
    for node, levels in data.items():
        check_node(node, f"{where}.{node}")
        if isinstance(levels, (str, bytes)) or not isinstance(levels, (list, tuple)) or not levels:
            raise UsageError(f"{where}.{node}: must be a non-empty list of levels", hint="e.g. [1, 0.5, 0.25]")
        parse = parse_cpus if kind == "cpus" else parse_step_delay
        parsed = tuple(parse(level, f"{where}.{node}") for level in levels)
        if len(set(parsed)) != len(parsed):
            raise UsageError(f"{where}.{node}: repeated level", hint="use repeat: for repeated runs")
        out.append((f"{kind}.{node}", parsed))
    return out


def playbook_values(kind: str, data: Any, where: str) -> list[tuple[str, Any]]:
    """A playbook's `fixed:` or `extra_runs` `cpus: {n2: 0.5}` (or step_delay) -> [("cpus.n2", 0.5)],
    one value per node (crossed() sets them)."""
    example = "{n2: 0.5}" if kind == "cpus" else "{n2: 40ms}"
    if not isinstance(data, Mapping) or not data:
        raise UsageError(f"{where}: must map nodes to one level each", hint=f"e.g. '{kind}: {example}'")
    out = []
    for node, level in data.items():
        check_node(node, f"{where}.{node}")
        if isinstance(level, (list, tuple)):
            raise UsageError(f"{where}.{node}: takes one level", hint=f"move {kind} to factors to vary it")
        parse = parse_cpus if kind == "cpus" else parse_step_delay
        out.append((f"{kind}.{node}", parse(level, f"{where}.{node}")))
    return out


def crossed(base: Compute, pairs) -> Compute:
    """`base` with a combination's per-node factors ("cpus.n2", level) set; other keys ignored."""
    out = base
    for key, value in pairs:
        kind, dot, node = key.partition(".")
        if dot and kind in KINDS:
            out = out.set(node, **{"cpus" if kind == "cpus" else "step_delay_s": value})
    return out


def check_cores(compute: Compute, cores: float, where: str) -> None:
    """A limit above the cores a node's processes may use is refused: it would limit nothing."""
    for node, cpus in compute.cpus:
        if cpus > cores:
            raise UsageError(f"{where}: {_who(node)} at {cpus:g} CPUs: this machine gives a node {cores:g}",
                             hint=f"give at most {cores:g}, or max for no limit")


def holds_none(node: str, nodes: int) -> bool:
    """Whether `node` is outside n1..n<nodes>, the nodes a run's processes are on (placement puts
    them first; ALL is never outside)."""
    return node != ALL and bool(_NODE_RE.fullmatch(node)) and int(node[1:]) > nodes


def holds_none_text(node: str, nodes: int) -> tuple[str, str]:
    """(message, hint) refusing a limit on `node` that holds none of a run's processes: applied
    nowhere, it would still be recorded (results.csv's cpus_<node>, the point's name)."""
    span = "n1" if nodes <= 1 else f"n1-n{nodes}"
    return (f"{node} holds none of the job's processes (they run on {span}): its limit would apply to nothing",
            f"limit a node of {span}, or run more workers")


def unplaced(compute: Compute, nodes: int) -> tuple[str, str] | None:
    """The first (kind, node) `compute` limits outside n1..n<nodes> (kind: "cpus" or
    "step_delay", as flags and playbooks name it), or None."""
    for kind, items in (("cpus", compute.cpus), ("step_delay", compute.step_delay_s)):
        for node, _ in items:
            if holds_none(node, nodes):
                return kind, node
    return None


def point_unplaced(settings: Any, schedule: Any = None, topology: Any = None) -> tuple[str, str, str] | None:
    """(key, message, hint) of the first limit a playbook point (model.run.Settings) sets on a
    node that holds none of its processes: in its factors (key "cpus.n3", "step_delay.n3"), its
    schedule's steps (key "schedule"; the message names the file and step) or its topology's
    compute: (key "topology"); None when every one is on a node of the point's."""
    nodes = settings.nodes
    found = unplaced(settings.compute, nodes)
    if found is not None:
        return (f"{found[0]}.{found[1]}", *holds_none_text(found[1], nodes))
    for step in (schedule.steps if schedule is not None else ()):
        for node, _, _ in step.compute:
            if holds_none(node, nodes):
                message, hint = holds_none_text(node, nodes)
                return "schedule", f"{step.where}: node: {message}", hint
    found = unplaced(topology.compute, nodes) if topology is not None and topology.compute is not None else None
    if found is not None:
        message, hint = holds_none_text(found[1], nodes)
        return "topology", f"{topology.source or topology.name}: compute.{found[1]}: {message}", hint
    return None


# ---------------------------------------------------------------- the model's view

MAX_SLOWDOWN = 1 / MIN_CPUS


def slowdown(cpus: float | None, busy_cpus: float = 1.0) -> float:
    """How much longer a node's compute takes at `cpus` than unlimited, where it kept
    `busy_cpus` busy unlimited (the compute calibration runs one process per worker node at once:
    about one core each on a machine of as many cores as workers). A quota at or above what it
    used does not slow it; below, its CPU time is spread over busy_cpus / cpus as long."""
    if cpus is None or cpus >= busy_cpus:
        return 1.0
    return min(MAX_SLOWDOWN, busy_cpus / cpus)


def worker_terms(compute: Compute, workers: int, busy_cpus: float = 1.0,
                 ranks_per_node: int = 1) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(each rank's slowdown, each rank's step delay), in rank order: rank r on the node the job's
    placement puts it (model/ranks.py: node-major, `ranks_per_node` a node, n1 first). A node's
    ranks share its quota, each keeping `busy_cpus` busy unlimited, so the node kept
    ranks_per_node x busy_cpus busy; ((), ()) when no rank's node is limited."""
    from netbench.model.ranks import rank_node

    per = max(1, ranks_per_node)
    nodes = [f"n{rank_node(r, per) + 1}" for r in range(workers)]
    slow = tuple(slowdown(compute.cpus_of(n), busy_cpus * per) for n in nodes)
    delay = tuple(compute.delay_of(n) for n in nodes)
    if all(s == 1.0 for s in slow) and not any(delay):
        return (), ()
    return slow, delay


# ---------------------------------------------------------------- the cgroup plan

@dataclass(frozen=True)
class Quota:
    """A cfs quota: `quota_us` of CPU time per `period_us` (quota None: unlimited)."""

    quota_us: int | None
    period_us: int

    def cpu_max(self) -> str:
        """cgroup v2's cpu.max: "QUOTA PERIOD" or "max PERIOD"."""
        return f"{'max' if self.quota_us is None else self.quota_us} {self.period_us}"


def quota_plan(cpus: float | None, period_us: int = PERIOD_US) -> Quota:
    """The quota for `cpus` CPUs at `period_us`; a share whose quota would fall under the
    kernel's 1 ms floor gets a longer period (0.05 CPU: 20 ms)."""
    if cpus is None:
        return Quota(None, period_us)
    if cpus * period_us < MIN_QUOTA_US:
        period_us = min(MAX_PERIOD_US, math.ceil(MIN_QUOTA_US / cpus))
    return Quota(max(MIN_QUOTA_US, round(cpus * period_us)), period_us)
