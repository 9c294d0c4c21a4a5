"""Schedules: a link that changes over time (or over training steps).

A schedule is YAML: `steps`, each with `at` (a duration from the start) or `at_step` (the
chief's training step) and any profile keys, which change those fields and leave the others
as they were; `ramp` moves numeric fields linearly from the previous values over that long
(a duration, or a number of training steps), in changes every RAMP_STEP_S. `profile` is the
base the first step starts from (without it, the link as it is); `repeat: true` loops, with
`period` (default: the last step's time plus its ramp). `trace: file.csv` (relative to the
schedule) gives the steps as rows instead (model/trace.py).

A step may also change a node's capacity: `{at: 10s, node: n2, cpus: 0.25}` (a CPU limit;
`cpus: max` lifts it) or `step_delay: 40ms`, on the same clock as the link's changes
(model/compute.py; each entry carries the changes so far, `compute_at` applies them).

A schedule is time-triggered or step-triggered, never both: `at` and `at_step` are
different clocks, and an order between them would only be known at run time.

`timeline(schedule, base)` expands it into the profiles in force from each moment on, ramps
included; it is pure, so a sweep point can hold a schedule and expand it for each run.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from netbench import units
from netbench.errors import ProfileError, UsageError, shown, shown_key
from netbench.model.profile import PROFILE_KEYS, Profile, profile_from_mapping, validate
from netbench.model.trace import read_trace
from netbench.yamlfile import read_yaml

RAMP_STEP_S = 0.1  # a ramp over time changes the link every 100 ms (a change takes a few ms)
MAX_STEP_RAMP_POINTS = 100  # a ramp over training steps changes the link at most this often
# a timeline longer than this is a mistake (a 17-minute ramp at 100 ms), and expanding one
# costs ~0.1 ms a change: the bound keeps every dry run within seconds
MAX_ENTRIES = 10_000
MIN_CYCLE_S = 0.01  # a repeating schedule's loop, at least: a change takes a few ms (a 1 us loop spun the CPU)
RATIO_DIGITS = 6  # ramped ratios are rounded to 0.0001 %; durations to 1 us, rates to 1 bit/s
SCHEDULE_KEYS = ("name", "description", "profile", "steps", "trace", "repeat", "period")
TRIGGER_KEYS = ("at", "at_step", "ramp")
COMPUTE_KEYS = ("node", "cpus", "step_delay")  # a node's capacity from that step on (model/compute.py)
# profile-file key -> Profile field, for the fields a ramp can move
RAMPABLE = {"delay": "delay_us", "jitter": "jitter_us", "rate": "rate_bps", "loss": "loss", "limit": "limit_packets",
            "reorder_gap": "reorder_gap", **{key: key for key in (
                "jitter_correlation", "loss_correlation", "duplicate", "duplicate_correlation", "corrupt",
                "corrupt_correlation", "reorder", "reorder_correlation")}}
_ALONE_INVALID = {"jitter": units.parse_duration_us, **{key: units.parse_ratio for key in (
    "jitter_correlation", "loss_correlation", "duplicate_correlation", "corrupt_correlation", "reorder",
    "reorder_correlation")}}  # keys a profile refuses without another one: parsed on their own at load
HINT = "see docs/guide/schedules.md; a step is e.g. {at: 2s, delay: 30ms}"


@dataclass(frozen=True)
class ScheduleStep:
    """One step: when (at_s or at_step), the profile keys it sets as written, and its ramp
    (seconds, or training steps in a step-triggered schedule; 0: at once). `where` names it
    in errors: "spike.yaml: step 2" or "trace.csv: row 5"."""

    index: int  # 1-based step number, or the trace file's row number
    where: str
    fields: tuple[tuple[str, Any], ...]
    at_s: float | None = None
    at_step: int | None = None
    ramp: float = 0.0
    compute: tuple[tuple[str, str, Any], ...] = ()  # (node, "cpus" or "step_delay_s", value) it sets

    @property
    def at(self) -> float:
        return self.at_s if self.at_s is not None else float(self.at_step)


@dataclass(frozen=True)
class Schedule:
    name: str
    source: str  # the schedule file, as errors name it
    steps: tuple[ScheduleStep, ...]
    profile: Profile | None = None  # the base; None: the link as it is
    repeat: bool = False
    period: float | None = None  # as written (seconds or training steps); None: the last step's end
    description: str = ""

    @property
    def by_step(self) -> bool:
        """True when the steps are tied to training steps (at_step), not time."""
        return self.steps[0].at_step is not None

    @property
    def cycle(self) -> float:
        """The loop period: seconds, or training steps in a step-triggered schedule."""
        if self.period is not None:
            return self.period
        last = self.steps[-1]
        return last.at + last.ramp

    @property
    def period_s(self) -> float | None:
        return None if self.by_step else self.cycle


@dataclass(frozen=True)
class TimedProfile:
    """The full profile in force from at_s seconds (or training step at_step) on; `step` is the
    schedule step (or trace row) it comes from; `changes` the profile keys it changes, with
    their new values as text."""

    at_s: float | None
    at_step: int | None
    profile: Profile
    step: int
    changes: tuple[tuple[str, str], ...] = ()
    # every node capacity change from the schedule's start up to this entry, in order:
    # (node, "cpus" or "step_delay_s", value); applied over the run's own (compute_at)
    compute: tuple[tuple[str, str, Any], ...] = ()

    @property
    def when(self) -> str:
        return when_text(self.at_s, self.at_step)


def when_text(at_s: float | None, at_step: int | None) -> str:
    return f"step {at_step}" if at_s is None else f"{round(at_s, 6):g}s"


# ---------------------------------------------------------------- loading

def _fail(where: str, key: str, message: str, hint: str = HINT) -> UsageError:
    return UsageError(f"{where}: {key}: {message}", hint=hint)


def _duration_s(raw: Any, where: str, key: str) -> float:
    try:
        return units.parse_duration_us(raw) / 1e6
    except ValueError as exc:
        raise _fail(where, key, str(exc), hint=f"write a duration, e.g. '{key}: 2s'") from None


def _whole(raw: Any, where: str, key: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise _fail(where, key, f"must be a whole number of training steps, 0 or more, got {shown(raw)}",
                    hint=f"e.g. '{key}: 500'")
    return raw


def _check_fields(fields: Mapping[str, Any], where: str) -> None:
    """Each key is a profile key whose value parses; combinations are checked by timeline()."""
    for key, value in fields.items():
        if key not in PROFILE_KEYS:
            close = difflib.get_close_matches(str(key), PROFILE_KEYS + TRIGGER_KEYS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else "a step takes at or at_step, ramp, and profile keys"
            raise _fail(where, shown_key(key), "unknown key", hint=hint)
        if key in _ALONE_INVALID:
            try:
                _ALONE_INVALID[key](value)
            except ValueError as exc:
                raise ProfileError(f"{where}: {key}: {exc}", hint=f"e.g. '{key}: 5ms'" if key == "jitter"
                                   else f"e.g. '{key}: 25%'") from None
        elif key == "reorder_gap":
            _whole(value, where, key)
        else:
            profile_from_mapping({key: value}, where)


def _step(raw: Any, index: int, where: str, by_step: bool | None) -> ScheduleStep:
    if not isinstance(raw, Mapping):
        raise UsageError(f"{where}: a step must be a mapping, got {shown(raw)}", hint=HINT)
    if "at" in raw and "at_step" in raw:
        raise _fail(where, "at_step", "a step has either at or at_step, not both")
    if "at" not in raw and "at_step" not in raw:
        raise _fail(where, "at", "missing: every step says when", hint="e.g. {at: 2s, delay: 30ms} or "
                    "{at_step: 500, delay: 50ms}")
    key = "at_step" if "at_step" in raw else "at"
    if by_step is not None and by_step != (key == "at_step"):
        raise _fail(where, key, "a schedule uses either at (time) or at_step (training steps), not both",
                    hint="split it into two schedules")
    fields = {k: v for k, v in raw.items() if k not in TRIGGER_KEYS and k not in COMPUTE_KEYS}
    compute = _compute_fields(raw, where)
    if not fields and not compute:
        raise UsageError(f"{where}: the step changes nothing", hint="add a profile key, e.g. delay: 30ms")
    if compute and "ramp" in raw:
        raise _fail(where, "ramp", "a node's cpus or step_delay changes at once, not in a ramp",
                    hint="put the ramp in a step of its own")
    _check_fields(fields, where)
    ramp: float = 0.0
    if "ramp" in raw:
        ramp = _whole(raw["ramp"], where, "ramp") if key == "at_step" else _duration_s(raw["ramp"], where, "ramp")
        if ramp:
            for name, value in fields.items():
                if name not in RAMPABLE or (name == "loss" and isinstance(value, Mapping)):
                    raise _fail(where, name, "a ramp moves numeric fields only",
                                hint="put this change in a step of its own, without ramp")
    if key == "at":
        return ScheduleStep(index, where, tuple(fields.items()), at_s=_duration_s(raw["at"], where, "at"), ramp=ramp,
                            compute=compute)
    return ScheduleStep(index, where, tuple(fields.items()), at_step=_whole(raw["at_step"], where, "at_step"),
                        ramp=ramp, compute=compute)


def _compute_fields(raw: Mapping[str, Any], where: str) -> tuple[tuple[str, str, Any], ...]:
    """A step's node capacity: {node: n2, cpus: 0.25, step_delay: 40ms} -> ((n2, cpus, 0.25),
    (n2, step_delay_s, 0.04)); node without cpus or step_delay, or either without node, is refused."""
    from netbench.model import compute

    if not any(k in raw for k in COMPUTE_KEYS):
        return ()
    if "node" not in raw:
        raise _fail(where, "node", "missing: cpus and step_delay say which node", hint="e.g. {at: 10s, node: n2, "
                    "cpus: 0.25}")
    node = compute.check_node(raw["node"], f"{where}: node")
    out = []
    if "cpus" in raw:
        out.append((node, "cpus", compute.parse_cpus(raw["cpus"], f"{where}: cpus")))
    if "step_delay" in raw:
        out.append((node, "step_delay_s", compute.parse_step_delay(raw["step_delay"], f"{where}: step_delay")))
    if not out:
        raise _fail(where, "node", "a node's step says its cpus or step_delay", hint="e.g. {at: 10s, node: n2, "
                    "cpus: 0.25}; cpus: max puts it back")
    return tuple(out)


def _check_order(steps: list[ScheduleStep], key: str) -> None:
    for before, step in zip(steps, steps[1:]):
        if step.at <= before.at:
            raise _fail(step.where, key, f"{when_text(step.at_s, step.at_step)} is not after the step before "
                        f"({when_text(before.at_s, before.at_step)})", hint="list the steps in time order")
        if step.at < before.at + before.ramp:
            end = before.at + before.ramp
            raise _fail(step.where, key, "starts during the ramp before it, which ends at "
                        + (when_text(end, None) if before.at_step is None else when_text(None, int(end))),
                        hint="start the step after the ramp ends, or shorten the ramp")


def schedule_from_mapping(data: Any, source: str, default_name: str = "schedule") -> Schedule:
    """Build and check a Schedule from parsed YAML; `source` is the file errors name. A trace
    is read relative to the file's folder."""
    if not isinstance(data, Mapping):
        raise UsageError(f"{source}: a schedule must be a mapping with steps, got {shown(data)}", hint=HINT)
    for key in data:
        if key not in SCHEDULE_KEYS:
            close = difflib.get_close_matches(str(key), SCHEDULE_KEYS, n=1)
            raise _fail(source, shown_key(key), "unknown key", hint=f"did you mean '{close[0]}'?" if close
                        else f"known keys: {', '.join(SCHEDULE_KEYS)}")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise _fail(source, "name", "must be a non-empty string", hint="e.g. 'name: spike'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(source, "description", "must be a string")
    base = None if data.get("profile") is None else profile_from_mapping(data["profile"], f"{source}: profile",
                                                                         default_name=name.strip())
    if ("steps" in data) == ("trace" in data):
        raise _fail(source, "steps", "give either steps or a trace file", hint="e.g. steps: [{at: 0s, delay: 5ms}] "
                    "or trace: link.csv")
    if "trace" in data:
        if not isinstance(data["trace"], str) or not data["trace"].strip():
            raise _fail(source, "trace", "must be the path of a CSV file", hint="e.g. trace: link.csv")
        path = Path(source).parent / data["trace"]
        rows = read_trace(path)
        steps = []
        for number, at_s, fields in rows:
            where = f"{path}: row {number}"
            _check_fields(fields, where)
            steps.append(ScheduleStep(number, where, tuple(fields.items()), at_s=at_s))
    else:
        raw_steps = data["steps"]
        if not isinstance(raw_steps, list) or not raw_steps:
            raise _fail(source, "steps", "must be a non-empty list", hint=HINT)
        steps = []
        for index, raw in enumerate(raw_steps, start=1):
            steps.append(_step(raw, index, f"{source}: step {index}", steps[0].at_step is not None if steps else None))
    _check_order(steps, "time_s" if "trace" in data else "at_step" if steps[0].at_step is not None else "at")
    repeat = data.get("repeat", False)
    if not isinstance(repeat, bool):
        raise _fail(source, "repeat", f"must be true or false, got {shown(repeat)}")
    period = None
    if "period" in data:
        if not repeat:
            raise _fail(source, "period", "only with repeat: true", hint="add 'repeat: true', or remove period")
        by_step = steps[0].at_step is not None
        period = _whole(data["period"], source, "period") if by_step else _duration_s(data["period"], source, "period")
        end = steps[-1].at + steps[-1].ramp
        if period < end:
            raise _fail(source, "period", f"{period:g} is shorter than the schedule ({end:g})",
                        hint="make the period at least the last step's time plus its ramp")
    schedule = Schedule(name=name.strip(), source=source, steps=tuple(steps), profile=base, repeat=repeat,
                        period=period, description=description)
    if repeat and schedule.cycle <= 0:
        raise _fail(source, "period", "a repeating schedule needs a period above 0", hint="e.g. 'period: 10s'")
    if repeat and not schedule.by_step and schedule.cycle < MIN_CYCLE_S:
        raise _fail(source, "period", f"a loop of {schedule.cycle:g} s: a repeating schedule's loop takes at least "
                    f"{MIN_CYCLE_S:g} s (a change takes a few ms)", hint="e.g. 'period: 10s'")
    if base is not None:
        timeline(schedule, base)  # every combination is known now: check it at load
    return schedule


def load_schedule(path: str | Path) -> Schedule:
    """Load and check one schedule file; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path, "schedule", UsageError, "the shipped examples are in profiles/schedules/")
    return schedule_from_mapping(data, str(path), default_name=path.stem)


# ---------------------------------------------------------------- the timeline

def _overlay(current: Profile, fields: tuple[tuple[str, Any], ...], where: str) -> Profile:
    """`current` with the step's keys set, parsed and validated as a profile file's; errors
    name the step and key."""
    merged = current.to_yaml_dict()
    merged.update(fields)
    return profile_from_mapping(merged, where)


def _text(mapping: Mapping[str, Any], key: str) -> str:
    if key not in mapping:
        return "unlimited" if key in ("rate", "limit") else "default"
    value = mapping[key]
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _changes(before: Profile, after: Profile) -> tuple[tuple[str, str], ...]:
    old, new = before.to_yaml_dict(), after.to_yaml_dict()
    keys = [k for k in PROFILE_KEYS if k not in ("name", "description") and (k in old or k in new)]
    return tuple((k, _text(new, k)) for k in keys if old.get(k) != new.get(k))


def _ramp_point(start: Profile, end: Profile, ramped: list[str], fraction: float, where: str) -> Profile:
    values = {}
    for key in ramped:
        field = RAMPABLE[key]
        a, b = getattr(start, field), getattr(end, field)
        if a is None or b is None:
            if a == b:
                continue
            what = {"rate": "unlimited", "limit": "the default queue limit"}[key]
            raise _fail(where, key, f"cannot ramp {'from' if a is None else 'to'} {what}",
                        hint=f"set {key} in an earlier step or the base profile, or change it without ramp")
        value = a + (b - a) * fraction
        values[field] = round(value, RATIO_DIGITS) if isinstance(a, float) else round(value)
    return validate(replace(end, **values), where)


def _same(a: Profile, b: Profile) -> bool:
    return replace(a, name="", description="") == replace(b, name="", description="")


_EXPANDED: dict = {}  # (schedule, starting profile) -> its timeline: a design asks once per point
_EXPANDED_KEPT = 8


def timeline(schedule: Schedule, base: Profile | None = None) -> tuple[TimedProfile, ...]:
    """The profiles in force from each moment on (see `expand`); the same schedule over the
    same starting profile is expanded once (a playbook's points share a schedule's)."""
    key = (schedule, schedule.profile or base)
    try:
        found = _EXPANDED.get(key)
    except TypeError:  # a step's value YAML gave as a list or mapping: not hashable, not kept
        return expand(schedule, base)
    if found is None:
        found = expand(schedule, base)
        if len(_EXPANDED) >= _EXPANDED_KEPT:
            _EXPANDED.pop(next(iter(_EXPANDED)))
        _EXPANDED[key] = found
    return found


def expand(schedule: Schedule, base: Profile | None = None) -> tuple[TimedProfile, ...]:
    """The profiles in force from each moment on, in order, ramps expanded; one cycle of a
    repeating schedule (the runner adds `schedule.cycle` per loop). The first step starts from
    the schedule's own profile, else `base` (the link as it is; None: an unshaped link).

    Each profile is named "<schedule>@<when>" unless its step sets a name. A combination a
    profile refuses (jitter above the delay, a rate ramp from unlimited) raises UsageError
    naming the file, the step (or trace row) and the key."""
    current = schedule.profile or base or Profile(name="none")
    planned = 0  # the changes the steps make, counted before any is expanded
    for step in schedule.steps:
        planned += ramp_points(step) if step.ramp else 1
        if planned > MAX_ENTRIES:
            raise _fail(step.where, "ramp" if step.ramp else "at", f"the schedule expands to over {MAX_ENTRIES} "
                        "changes", hint="shorten the ramps, or thin the steps out")
    out: list[TimedProfile] = []
    compute: tuple = ()
    for step in schedule.steps:
        compute += step.compute
        fields = dict(step.fields)

        def named(profile: Profile, at: float) -> Profile:
            label = fields["name"] if "name" in fields else f"{schedule.name}@{_when(step, at)}"
            return replace(profile, name=str(label).strip())

        end = named(_overlay(current, step.fields, step.where), step.at)
        points: list[tuple[float, Profile]] = []
        if step.ramp:
            count = ramp_points(step)
            for k in range(1, count + 1):
                at = step.at + step.ramp * k / count
                at = round(at) if step.at_step is not None else at
                profile = end if k == count else named(_ramp_point(current, end, list(fields), k / count, step.where), at)
                if points and _same(points[-1][1], profile) or not points and _same(current, profile) and k < count:
                    continue
                points.append((at, named(profile, at) if k == count else profile))
        else:
            points.append((step.at, end))
        previous = current
        for at, profile in points:
            out.append(TimedProfile(at_s=None if step.at_step is not None else at,
                                    at_step=int(at) if step.at_step is not None else None,
                                    profile=profile, step=step.index, compute=compute,
                                    changes=_changes(previous, profile) + _compute_text(step.compute)))
            previous = profile
            if len(out) > MAX_ENTRIES:
                raise _fail(step.where, "ramp", f"the schedule expands to over {MAX_ENTRIES} changes",
                            hint="shorten the ramps")
        current = end
    return tuple(out)


def ramp_points(step: ScheduleStep) -> int:
    """The changes a step's ramp makes (one per RAMP_STEP_S, or at most MAX_STEP_RAMP_POINTS
    over training steps); over MAX_ENTRIES: UsageError naming the step, before any is made."""
    if step.at_step is not None:
        return min(int(step.ramp), MAX_STEP_RAMP_POINTS)
    count = max(1, math.ceil(step.ramp / RAMP_STEP_S - 1e-9))
    if count > MAX_ENTRIES:
        raise _fail(step.where, "ramp", f"{units.format_wall_seconds(step.ramp)} is {count} changes at one per "
                    f"{RAMP_STEP_S:g} s, "
                    f"more than a schedule's {MAX_ENTRIES}", hint=f"shorten the ramp to at most "
                    f"{MAX_ENTRIES * RAMP_STEP_S:g}s, or ramp in steps of their own")
    return count


def _compute_text(changes: tuple[tuple[str, str, Any], ...]) -> tuple[tuple[str, str], ...]:
    def text(kind: str, value: Any) -> str:
        if kind == "cpus":
            return "max" if value is None else f"{value:g}"
        return units.format_duration_us(round(value * 1e6))

    return tuple((f"{node} {'cpus' if kind == 'cpus' else 'step_delay'}", text(kind, value))
                 for node, kind, value in changes)


def check_placed(schedule: Schedule, nodes: int) -> None:
    """A step's cpus or step_delay for a node outside n1..n<nodes> (the nodes the run's processes
    are on) is refused, naming the file and the step: it would change nothing."""
    from netbench.model.compute import holds_none, holds_none_text

    for step in schedule.steps:
        for node, _, _ in step.compute:
            if holds_none(node, nodes):
                raise _fail(step.where, "node", *holds_none_text(node, nodes))


def compute_at(start: Any, entry: TimedProfile | None) -> Any:
    """The node capacity in force at `entry` (a model.compute.Compute): `start`, the run's own,
    with every schedule change up to it applied (pure)."""
    out = start
    for node, kind, value in (entry.compute if entry is not None else ()):
        out = out.set(node, **{kind: value})
    return out


def due(entries: tuple[TimedProfile, ...] | list[TimedProfile], index: int, now: float, offset: float = 0.0) -> int:
    """Which entry to make when entry `index` is about to be made at `now` (seconds from the
    schedule's start plus the time a change takes, or the training step; `offset`: the loop's
    start): the last of `index`, `index` + 1, ... that is already due by then. Those before it
    are merged into it (pure): the link goes straight to the state it should have now, so a
    change that cannot land on time never stretches the timeline behind it."""
    def at(entry: TimedProfile) -> float:
        return (entry.at_s if entry.at_s is not None else float(entry.at_step)) + offset

    last = index
    while last + 1 < len(entries) and at(entries[last + 1]) <= now:
        last += 1
    return last


def _when(step: ScheduleStep, at: float) -> str:
    return f"step{int(at)}" if step.at_step is not None else when_text(at, None)
