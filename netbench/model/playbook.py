"""Playbooks: a whole experiment design in YAML, loaded and validated (pure).

A playbook names factors and their levels (crossed in a full factorial), fixed settings,
repetitions, the run order (randomised with a recorded seed, or as written), the
measurement window and per-run timeouts. Loading normalises every value once (durations
to microseconds, rates to bits/s, losses to ratios) and checks it; errors are one line
naming the file and the key, as profiles do. Expansion is pure and deterministic for a
given seed (netbench.model.design expands a playbook into its runs), so an interrupted
playbook resumes by run id: a run whose record in the results folder says `ok` or
`timeout` is complete and is not run again.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from netbench import units
from netbench.errors import ProfileError, UsageError, shown, shown_key
from netbench.model import algorithm_keys, command_job, compute, congestion, playbook_files, playbook_keys, ranks
from netbench.model.pairs import scaled
from netbench.model.profile import Profile, load_profile, validate
from netbench.model.frameworks import check_framework
from netbench.model.run import Settings, check_size, profile_name, scaled_name
from netbench.model.playbook_files import PlaybookError, fail  # noqa: F401 - PlaybookError: this module's error
from netbench.model.playbook_values import SETTING_KEYS
from netbench.yamlfile import read_yaml

ORDERS = ("random", "as-written")
# the sweep's flags' names (model/playbook_keys.py: the older spellings that still load)
TOP_KEYS = ("name", "description", "factors", "fixed", "extra_runs", "repeat", "order", "seed", "order_seed",
            "warmup", "steps", "seconds", "startup_timeout", "step_timeout", "backend", "profile", "schedule",
            "topology", "precision", "max_seconds", "congestion_control", *algorithm_keys.TOP_KEYS,
            *command_job.PLAYBOOK_KEYS)
BACKENDS = ("auto", "netem", "userspace")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: a name that is one folder


NETWORK_KEYS = ("latency", "bandwidth", "loss", "jitter")  # what a topology gives instead
FIELD_TO_KEY = {**{spec[0]: key for key, spec in SETTING_KEYS.items()}, "schedule": "schedule"}


@dataclass(frozen=True)
class Playbook:
    """A loaded, validated playbook. Factor levels are canonical (Settings field values)."""

    name: str
    source: str
    description: str = ""
    factors: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # (YAML key, levels) in file order
    fixed: Settings = Settings()
    extra_runs: tuple[tuple[tuple[str, Any], ...], ...] = ()  # each: (YAML key, value) pairs
    repetitions: int = 1  # repeat:
    order: str = "random"
    seed: int | None = None  # the sweep's --seed (data, loss and jitter draws); the order's too without order_seed
    order_seed: int | None = None  # the order's seed (runs under order: random, points within launches)
    warmup: int = 10
    steps: int = 30
    steps_written: bool = True  # False: no steps: key (with a precision its least window decides: window_steps)
    seconds: float | None = None
    precision: float | None = 0.03  # a fraction: each run's window goes on until it knows its mean step
    max_seconds: float = 60.0  # to this precision, for at most this long
    startup_timeout_s: float = 240.0
    step_timeout_s: float = 60.0
    backend: str | None = None
    base_profile: Profile = field(default_factory=lambda: Profile(name="base"))
    fixed_keys: tuple[str, ...] = ()  # keys written under fixed:, for error messages
    # schedule: (its path as written, the loaded model.schedule.Schedule), in file order;
    # every design point runs once under each (none: the points' profiles hold for the whole run)
    schedules: tuple[tuple[str, Any], ...] = ()
    # topology: the per-pair topology (model.pairs.PairTopology, unscaled) every run applies,
    # at its `scale`, instead of a profile; topology_ref: its path as written
    topology: Any = None
    # train_steps, eval_every, target_accuracy and the algorithm's settings (model.algorithm_keys)
    job_extra: tuple[tuple[str, Any], ...] = ()
    topology_ref: str = ""
    command: Any = None  # a user's command (model.command_job.UserCommand) every run runs instead
    congestion_control: str | None = None  # every node's TCP congestion control (None: the nodes' own)
    notes: tuple[str, ...] = field(default=(), compare=False)  # one line per old key spelling (playbook_keys)

    def where(self, key: str) -> str:
        """Where a setting's value came from, as the user wrote it: factors.X or fixed.X."""
        if any(k == key for k, _ in self.factors):
            return f"factors.{key}"
        return f"fixed.{key}" if key in self.fixed_keys else key


def _job_extra(data: Mapping[str, Any], source: str, warmup: int) -> tuple[tuple[str, Any], ...]:
    try:
        return algorithm_keys.job_extra(data, warmup)
    except algorithm_keys.BadKey as exc:
        raise fail(source, exc.key, exc.message, exc.hint) from None


def _unknown(source: str, prefix: str, key: Any, known: Iterable[str]) -> PlaybookError:
    known = tuple(known)
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
    return fail(source, f"{prefix}{shown_key(key)}", "unknown key", hint)


def _setting(source: str, where: str, key: str, raw: Any) -> Any:
    _, parse, example = SETTING_KEYS[key]
    try:
        return parse(raw)
    except ValueError as exc:
        raise fail(source, where, str(exc), f"e.g. '{example}'") from None


def _number(source: str, key: str, raw: Any, low: float, high: float, whole: bool = True) -> Any:
    kinds = (int,) if whole else (int, float)
    if isinstance(raw, bool) or not isinstance(raw, kinds) or not low <= raw <= high:
        kind, span = ("a whole number", f"{low}..{high}") if whole else ("a number", f"{low:g}..{high:g}")
        raise fail(source, key, f"must be {kind} in {span}, got {shown(raw)}")
    return raw


def _precision(source: str, raw: Any) -> float | None:
    """`precision: 2%` as a fraction in (0, 0.5) (a bare 0.02 is refused); `off`: None (absent: 3 %, as sweep's)."""
    if raw is None or raw is False or (isinstance(raw, str) and raw.strip().lower() == "off"):
        return None
    try:
        value = units.parse_ratio(raw)
    except ValueError as exc:
        raise fail(source, "precision", str(exc), "e.g. 'precision: 2%'") from None
    if not 0 < value < 0.5:
        raise fail(source, "precision", f"{shown(raw)} is outside (0%, 50%)", "e.g. 'precision: 2%'")
    return value


def _seconds(source: str, key: str, raw: Any) -> float:
    try:
        us = units.parse_duration_us(raw)
    except ValueError as exc:
        raise fail(source, key, str(exc), "e.g. '60s'") from None
    if us < 1_000_000:
        raise fail(source, key, f"{shown(raw)} is under 1s", "e.g. '60s'")
    return us / 1_000_000


def _factors(data: Any, source: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    if data is None:
        return ()
    if not isinstance(data, Mapping):
        raise fail(source, "factors", "must be a mapping of setting to a list of levels",
                   "e.g. 'factors: {latency: [1ms, 10ms]}'")
    out = []
    for key, levels in data.items():
        if key in compute.KINDS:  # per node: {n2: [1, 0.5]} -> a factor "cpus.n2" (model/compute.py)
            out.extend(compute.playbook_factors(key, levels, f"{source}: factors.{key}"))
            continue
        if key not in SETTING_KEYS:
            raise _unknown(source, "factors.", key, SETTING_KEYS)
        if isinstance(levels, (str, bytes)) or not isinstance(levels, (list, tuple)) or not levels:
            raise fail(source, f"factors.{key}", "must be a non-empty list of levels",
                       f"e.g. '{SETTING_KEYS[key][2]}'")
        parsed = tuple(_setting(source, f"factors.{key}", key, level) for level in levels)
        if len(set(parsed)) != len(parsed):
            raise fail(source, f"factors.{key}", f"repeated level in {shown(list(levels))}",
                       "use repeat: for repeated runs")
        out.append((key, parsed))
    return tuple(out)


def _fixed(data: Any, source: str, base: Settings, factor_keys: set[str]) -> Settings:
    if data is None:
        return base
    if not isinstance(data, Mapping):
        raise fail(source, "fixed", "must be a mapping of setting to one value", "e.g. 'fixed: {model: mlp}'")
    changes, nodes = {}, []
    for key, raw in data.items():
        if key in compute.KINDS:  # per node, one value each: {n2: 0.5} -> ("cpus.n2", 0.5)
            nodes += compute.playbook_values(key, raw, f"{source}: fixed.{key}")
            continue
        if key not in SETTING_KEYS:
            raise _unknown(source, "fixed.", key, SETTING_KEYS)
        if key in factor_keys:
            raise fail(source, f"fixed.{key}", "is also a factor", "keep it under factors or fixed, not both")
        if isinstance(raw, (list, tuple)):
            raise fail(source, f"fixed.{key}", "a fixed setting takes one value", f"move {key} to factors to vary it")
        changes[SETTING_KEYS[key][0]] = _setting(source, f"fixed.{key}", key, raw)
    for key, _ in nodes:
        if key in factor_keys:
            raise fail(source, f"fixed.{key}", "is also a factor", "keep it under factors or fixed, not both")
    return replace(base, compute=compute.crossed(base.compute, nodes), **changes)


def _extra_runs(data: Any, source: str) -> tuple[tuple[tuple[str, Any], ...], ...]:
    if data is None:
        return ()
    if not isinstance(data, (list, tuple)):
        raise fail(source, "extra_runs", "must be a list of mappings",
                   "e.g. 'extra_runs: [{strategy: single, workers: 1}]'")
    out = []
    for i, entry in enumerate(data):
        if not isinstance(entry, Mapping) or not entry:
            raise fail(source, f"extra_runs[{i}]", "must be a non-empty mapping of setting to one value",
                       "e.g. '{strategy: single, workers: 1}'")
        pairs = []
        for key, raw in entry.items():
            if key in compute.KINDS:  # per node: {n2: 0.5} -> ("cpus.n2", 0.5), crossed as a factor's level
                pairs += compute.playbook_values(key, raw, f"{source}: extra_runs[{i}].{key}")
                continue
            if key not in SETTING_KEYS:
                raise _unknown(source, f"extra_runs[{i}].", key, SETTING_KEYS)
            pairs.append((key, _setting(source, f"extra_runs[{i}].{key}", key, raw)))
        out.append(tuple(pairs))
    return tuple(out)


def playbook_from_mapping(data: Any, source: str, default_name: str = "playbook",
                          base_dir: Path | None = None) -> Playbook:
    """Build and validate a Playbook from parsed YAML; errors name `source` and the key as
    written. An old key spelling (model/playbook_keys.py) loads as its key now, with a note."""
    return playbook_keys.load(data, source, lambda now: _from_mapping(now, source, default_name, base_dir), fail)


def _from_mapping(data: Any, source: str, default_name: str, base_dir: Path | None) -> Playbook:
    if not isinstance(data, Mapping) or not data:
        raise PlaybookError(f"{source}: a playbook must be a mapping with at least 'factors'",
                            hint="e.g. 'factors: {latency: [1ms, 10ms]}'")
    for key in data:
        if key not in TOP_KEYS:
            raise _unknown(source, "", key, TOP_KEYS)
    name = data.get("name", default_name)
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        # the name becomes a folder (results/<name>): '..' or 'a/b' would land elsewhere
        rule = "must be letters, digits, '.', '_' or '-', starting with a letter or digit, at most 64 characters"
        if "name" in data:
            raise fail(source, "name", f"{rule}; got {shown(name)}", "e.g. 'name: latency-study'")
        raise fail(source, "name", f"the file name {shown(name)} {rule}", "set one, e.g. 'name: latency-study'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail(source, "description", "must be a string")
    for key in ("profile", "schedule"):
        if "topology" in data and key in data:
            raise fail(source, key, "not with topology: the topology gives every pair's link",
                       f"remove {key}:, or topology:")
    base_profile = Profile(name="base")
    if "profile" in data:
        ref = data["profile"]
        if not isinstance(ref, str):
            raise fail(source, "profile", f"must be a path to a profile file, got {shown(ref)}")
        path = Path(ref) if Path(ref).is_absolute() else (base_dir or Path(".")) / ref
        try:
            base_profile = load_profile(path)
        except ProfileError as exc:
            raise fail(source, "profile", exc.message, exc.hint) from None
    schedules = playbook_files.schedules_of(data.get("schedule"), source, base_dir) if "schedule" in data else ()
    topology = playbook_files.topology_of(data, source, base_dir) if "topology" in data else None
    base = Settings(delay_us=base_profile.delay_us, rate_bps=base_profile.rate_bps, loss=base_profile.loss,
                    jitter_us=base_profile.jitter_us)
    factors = _factors(data.get("factors"), source)
    fixed_data = data.get("fixed")
    fixed = _fixed(fixed_data, source, base, {k for k, _ in factors})
    seconds = data.get("seconds")
    if seconds is not None:
        seconds = _seconds(source, "seconds", seconds)
    order = data.get("order", "random")
    if order not in ORDERS:
        raise fail(source, "order", f"unknown order {shown(order)}", f"use one of: {', '.join(ORDERS)}")
    seed, order_seed = data.get("seed"), data.get("order_seed")
    if seed is not None:
        seed = _number(source, "seed", seed, 0, 2**32 - 1)
    if order_seed is not None:  # as the sweep's --order-seed
        order_seed = _number(source, "order_seed", order_seed, 0, 2**31 - 1)
    backend = data.get("backend", "auto")
    if backend not in BACKENDS:
        raise fail(source, "backend", f"unknown backend {shown(backend)}", f"use one of: {', '.join(BACKENDS)}")
    warmup = _number(source, "warmup", data.get("warmup", 10), 0, 100_000)
    if seconds is not None and warmup < 1:
        raise fail(source, "warmup", "a 'seconds' window needs at least 1 warm-up step",
                   "workers agree on the step count from the warm-up step times")
    command = _command(data, source, factors)
    book = Playbook(
        name=name, source=source, description=description, factors=factors, fixed=fixed,
        extra_runs=_extra_runs(data.get("extra_runs"), source),
        repetitions=_number(source, "repeat", data.get("repeat", 1), 1, 1000),
        order=order, seed=seed, order_seed=order_seed, warmup=warmup,
        steps=_number(source, "steps", data.get("steps", 30), 2, 1_000_000), steps_written="steps" in data,
        seconds=seconds,
        precision=_precision(source, data.get("precision", "3%")),
        max_seconds=_seconds(source, "max_seconds", data.get("max_seconds", "60s")),
        startup_timeout_s=_seconds(source, "startup_timeout", data.get("startup_timeout", "240s")),
        step_timeout_s=_seconds(source, "step_timeout", data.get("step_timeout", "60s")),
        backend=None if backend == "auto" else backend, base_profile=base_profile,
        fixed_keys=tuple(fixed_data or ()), schedules=schedules,
        topology=topology, topology_ref=str(data["topology"]).strip() if topology is not None else "",
        job_extra=_job_extra(data, source, warmup),
        command=command, congestion_control=_congestion(source, data.get("congestion_control")),
    )
    _check_topology_keys(book)
    points = design_points(book)
    for point in points:  # every combination must make sense; fail at load, not mid-study
        profile = profile_for(book, point)
        if point.schedule:
            _check_schedule(book, dict(book.schedules)[point.schedule], profile)
        if topology is not None:
            _check_scaled(book, point.scale)
        refused = compute.point_unplaced(point, dict(book.schedules).get(point.schedule), topology)
        if refused:  # a limit on a node that holds none of the point's processes: recorded, not applied
            raise fail(book.source, book.where(refused[0]), *refused[1:])
    _check_algorithm_keys(book, points)
    return book


def _written(book: Playbook) -> list[tuple[str, str]]:
    """(where, key) of every setting the playbook writes under factors, fixed and extra_runs."""
    return [(f"factors.{k}", k) for k, _ in book.factors] + [(f"fixed.{k}", k) for k in book.fixed_keys] + \
        [(f"extra_runs[{i}].{k}", k) for i, entry in enumerate(book.extra_runs) for k, _ in entry]


def _check_algorithm_keys(book: Playbook, points: list[Settings]) -> None:
    """A training algorithm's setting is set in one place and used by some run (algorithm_keys.written_problem)."""
    bad = algorithm_keys.written_problem(_written(book), book.job_extra, points)
    if bad is not None:
        raise fail(book.source, bad.key, bad.message, bad.hint)


def _congestion(source: str, raw: Any) -> str | None:
    """`congestion_control: cubic`: a name the kernel may have (checked against it before the run)."""
    if raw is None:
        return None
    why = congestion.check_name(raw) if isinstance(raw, str) else f"must be a name, got {shown(raw)}"
    if why is not None:
        raise fail(source, "congestion_control", why, "e.g. 'congestion_control: cubic'")
    return raw


def _command(data: Mapping, source: str, factors) -> Any:
    """`command: [python, train.py]` (with images_per_step, step_regex): a user's command."""
    try:
        command = command_job.from_playbook(data)
    except ValueError as exc:
        key, _, message = str(exc).partition(": ")
        raise fail(source, key, message) from None
    job_keys = [k for k, _ in factors if k in ("strategy", "model", "batch_size", "ps", "accum_steps", "data",
                                               *algorithm_keys.ALGORITHM_KEYS)]
    for key in [k for k in ("schedule", "topology") if k in data] + [f"factors.{k}" for k in job_keys]:
        if command is not None:
            raise fail(source, key, "not with command: (a user's command is its own job, on static levels)")
    return command


def _check_topology_keys(book: Playbook) -> None:
    """With topology:, no setting varies the profile; without it, no scale."""
    for where, key in _written(book):
        if book.topology is not None and key in NETWORK_KEYS:
            raise fail(book.source, where, "not with topology: the topology gives every pair's link",
                       "vary scale: instead (it multiplies every delay), or remove topology:")
        if book.topology is None and key == "scale":
            raise fail(book.source, where, "scale multiplies the delays of a topology, and the playbook has none",
                       "add 'topology: ../profiles/topologies/two-regions.yaml', or remove scale")


def _check_scaled(book: Playbook, scale: float) -> None:
    """The topology at `scale` must stay within the profile limits."""
    try:
        scaled(book.topology, scale)
    except UsageError as exc:
        raise fail(book.source, book.where("scale"), exc.message, exc.hint) from None


def _check_schedule(book: Playbook, schedule: Any, base: Profile) -> None:
    """The schedule's timeline over a point's profile must be valid (a ramp, a jitter above the delay)."""
    from netbench.model.schedule import timeline

    try:
        timeline(schedule, base)
    except UsageError as exc:
        raise fail(book.source, "schedule", exc.message, exc.hint) from None


def load_playbook(path: str | Path) -> Playbook:
    """Load and validate one playbook file; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path, "playbook", PlaybookError, "list the shipped ones with 'ls playbooks/'")
    return playbook_from_mapping(data, str(path), default_name=path.stem, base_dir=path.parent)


def _cross(book: Playbook, factors: tuple[tuple[str, tuple[Any, ...]], ...]) -> list[Settings]:
    keys = [k for k, _ in factors]
    out = []
    for combo in itertools.product(*(levels for _, levels in factors)):
        pairs = list(zip(keys, combo))
        out.append(replace(book.fixed, compute=compute.crossed(book.fixed.compute, pairs),
                           **{SETTING_KEYS[k][0] if k in SETTING_KEYS else k: v for k, v in pairs if "." not in k}))
    return out


def _check_point(book: Playbook, settings: Settings, what: str) -> None:
    try:
        check_framework(settings.framework, settings.strategy, settings.model)
        ranks.check_setting(settings)
    except ValueError as exc:
        setting, _, message = str(exc).partition(": ")
        raise fail(book.source, book.where(setting) if what == "factors" else what, message, ranks.HINTS.get(
            setting, "cross framework torch with the strategies and models it runs")) from None
    if settings.strategy == "single" and settings.workers != 1:
        key = book.where("workers") if what == "factors" else what
        raise fail(book.source, key, f"strategy single runs one process, but workers is {settings.workers}",
                   "cross single with workers: 1 only, e.g. 'extra_runs: [{strategy: single, workers: 1}]'")
    if settings.nodes > 64:
        raise fail(book.source, book.where("workers") if what == "factors" else what,
                   f"{settings.nodes} nodes (workers + parameter servers) is over 64")


def design_points(book: Playbook) -> list[Settings]:
    """The distinct design points: the full factorial of the factors, then each extra run
    entry crossed with the factors it does not set. Raises when two points would be the
    same run (a factor the strategy ignores) or a combination is impossible."""
    points: list[Settings] = []
    seen: dict[Settings, Settings] = {}
    groups = [(book.factors, "factors")]
    for i, entry in enumerate(book.extra_runs):
        fixed_here = dict(entry)
        crossed = tuple((k, levels) for k, levels in book.factors if k not in fixed_here)
        groups.append((crossed + tuple((k, (v,)) for k, v in entry), f"extra_runs[{i}]"))
    if book.schedules:  # each schedule crosses every point, as one more factor (innermost)
        groups = [(factors + (("schedule", tuple(path for path, _ in book.schedules)),), what)
                  for factors, what in groups]
    check_size(tuple(math.prod(len(levels) for _, levels in f) for f, _ in groups), book.repetitions, book.source)
    for factors, what in groups:
        for settings in _cross(book, factors):
            _check_point(book, settings, what)
            key = settings.effective()
            if key in seen:
                if what == "factors":
                    ignored = next(FIELD_TO_KEY[f.name] for f in fields(Settings)
                                   if getattr(settings, f.name) != getattr(seen[key], f.name))
                    raise fail(book.source, book.where(ignored),
                               f"strategy {settings.strategy} ignores {ignored}, so its runs would repeat",
                               "vary it only with the strategy that uses it (ps: ps, accum_steps: allreduce-accum, "
                               + ", ".join(f"{k}: {v}" for k, v in algorithm_keys.OWNERS.items())
                               + "), e.g. through extra_runs")
                continue  # an extra run that the factorial already holds
            seen[key] = settings
            points.append(key)
    return points


def profile_for(book: Playbook, settings: Settings) -> Profile:
    if book.topology is not None:  # the topology is the network; the profile only names the point
        return Profile(name=scaled_name(book.topology.name, settings.scale))
    point = replace(book.base_profile, delay_us=settings.delay_us, rate_bps=settings.rate_bps,
                    loss=settings.loss, jitter_us=settings.jitter_us)
    point = replace(point, name=profile_name(point))
    keys = {f: book.where(FIELD_TO_KEY[f]) for f in ("delay_us", "rate_bps", "loss", "jitter_us")}
    try:
        return validate(point, book.source, keys=keys)
    except ProfileError as exc:
        raise PlaybookError(exc.message, exc.hint) from None
