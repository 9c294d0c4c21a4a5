"""Playbooks: a whole experiment design in YAML -> the ordered list of runs (pure).

A playbook names factors and their levels (crossed in a full factorial), fixed settings,
repetitions, the run order (randomised with a recorded seed, or as written), the
measurement window and per-run timeouts. Loading normalises every value once (durations
to microseconds, rates to bits/s, losses to ratios) and checks it; errors are one line
naming the file and the key, as profiles do. Expansion is pure and deterministic for a
given seed, so an interrupted playbook resumes by run id: a run whose record in the
results folder says `ok` or `timeout` is complete and is not run again.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import random
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping


from netbench import units
from netbench.errors import ProfileError, UsageError, shown, shown_key
from netbench.model.design import profile_name
from netbench.model.profile import Profile, load_profile, validate
from netbench.yamlfile import read_yaml

STRATEGIES = ("allreduce", "allreduce-accum", "ps", "single")
# the models of issue 4; which of them this build's worker can train is checked before a run
MODELS = ("mlp", "cnn", "mobilenetv2", "resnet50", "efficientnetb0", "vgg16", "resnet18")
ORDERS = ("random", "as-written")
COMPLETE_STATUSES = ("ok", "timeout")  # a timeout is a result (a cross on the figure), not a crash
TOP_KEYS = ("name", "description", "factors", "fixed", "extra_runs", "repetitions", "order", "seed",
            "warmup", "steps", "seconds", "timeouts", "backend", "profile")
TIMEOUT_KEYS = ("startup", "step")
BACKENDS = ("auto", "netem", "userspace")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: a name that is one folder


class PlaybookError(UsageError):
    """A playbook that cannot be loaded, fails validation, or does not match its results."""


@dataclass(frozen=True)
class Settings:
    """Everything one run varies: the job and the network, in canonical units.

    batch is per worker; workers counts training processes (for `ps`, besides the
    parameter servers); ps is used by the `ps` strategy only and accum_steps by
    `allreduce-accum` only. delay_us/jitter_us are one-way microseconds at each node's
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

    def effective(self) -> "Settings":
        """The same settings with the ones this strategy ignores set to their defaults."""
        changes: dict[str, Any] = {}
        if self.strategy != "ps":
            changes["ps"] = Settings.ps
        if self.strategy != "allreduce-accum":
            changes["accum_steps"] = Settings.accum_steps
        return replace(self, **changes)

    @property
    def nodes(self) -> int:
        """Testbed nodes the run needs, as the job's placement puts them: one per worker, plus
        the parameter servers and the coordinator for ps."""
        return self.workers + self.ps + 1 if self.strategy == "ps" else self.workers


def _duration(raw: Any) -> int:
    return units.parse_duration_us(raw)


def _rate(raw: Any) -> int | None:
    if raw is None or (isinstance(raw, str) and raw.strip().lower() == "unlimited"):
        return None
    return units.parse_rate_bps(raw)


def _whole(low: int, high: int) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"must be a whole number, got {shown(raw)}")
        if not low <= raw <= high:
            raise ValueError(f"{raw} is outside {low}..{high}")
        return raw
    return parse


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if raw not in allowed:
            close = difflib.get_close_matches(str(raw), allowed, n=1)
            extra = f" (did you mean {shown(close[0])}?)" if close else ""
            raise ValueError(f"unknown value {shown(raw)}{extra}; use one of: {', '.join(allowed)}")
        return raw
    return parse


def _data(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"must be 'synthetic' or a path to a dataset, got {shown(raw)}")
    return raw.strip()


# setting key in YAML -> (Settings field, parser, example)
SETTING_KEYS: dict[str, tuple[str, Callable[[Any], Any], str]] = {
    "latency": ("delay_us", _duration, "latency: [1ms, 10ms, 100ms]"),
    "bandwidth": ("rate_bps", _rate, "bandwidth: [250mbit, 1gbit]"),
    "loss": ("loss", units.parse_ratio, "loss: [0%, 1%, 10%]"),
    "jitter": ("jitter_us", _duration, "jitter: [0ms, 1ms]"),
    "strategy": ("strategy", _choice(STRATEGIES), "strategy: [allreduce, allreduce-accum]"),
    "model": ("model", _choice(MODELS), "model: [mlp, mobilenetv2]"),
    "batch": ("batch", _whole(1, 65536), "batch: [32, 64, 100]"),
    "workers": ("workers", _whole(1, 64), "workers: [1, 2, 3]"),
    "ps": ("ps", _whole(1, 16), "ps: [1, 2]"),
    "accum_steps": ("accum_steps", _whole(1, 10000), "accum_steps: [4]"),
    "data": ("data", _data, "data: synthetic"),
}
FIELD_TO_KEY = {spec[0]: key for key, spec in SETTING_KEYS.items()}


@dataclass(frozen=True)
class Playbook:
    """A loaded, validated playbook. Factor levels are canonical (Settings field values)."""

    name: str
    source: str
    description: str = ""
    factors: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # (YAML key, levels) in file order
    fixed: Settings = Settings()
    extra_runs: tuple[tuple[tuple[str, Any], ...], ...] = ()  # each: (YAML key, value) pairs
    repetitions: int = 1
    order: str = "random"
    seed: int | None = None
    warmup: int = 10
    steps: int = 30
    seconds: float | None = None
    startup_timeout_s: float = 240.0
    step_timeout_s: float = 60.0
    backend: str | None = None
    base_profile: Profile = field(default_factory=lambda: Profile(name="base"))
    fixed_keys: tuple[str, ...] = ()  # keys written under fixed:, for error messages

    def where(self, key: str) -> str:
        """Where a setting's value came from, as the user wrote it: factors.X or fixed.X."""
        if any(k == key for k, _ in self.factors):
            return f"factors.{key}"
        return f"fixed.{key}" if key in self.fixed_keys else key


@dataclass(frozen=True)
class PlannedRun:
    """One run of a playbook: its place in the run order, its design point and repetition."""

    index: int  # position in the run order
    point: int  # design point, in written (factorial) order
    repeat: int
    settings: Settings
    profile: Profile

    @property
    def run_id(self) -> str:
        return f"r{self.index:03d}"


def _fail(source: str, key: str, message: str, hint: str | None = None) -> PlaybookError:
    return PlaybookError(f"{source}: {key}: {message}", hint=hint)


def _unknown(source: str, prefix: str, key: Any, known: Iterable[str]) -> PlaybookError:
    known = tuple(known)
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
    return _fail(source, f"{prefix}{shown_key(key)}", "unknown key", hint)


def _setting(source: str, where: str, key: str, raw: Any) -> Any:
    _, parse, example = SETTING_KEYS[key]
    try:
        return parse(raw)
    except ValueError as exc:
        raise _fail(source, where, str(exc), f"e.g. '{example}'") from None


def _number(source: str, key: str, raw: Any, low: float, high: float, whole: bool = True) -> Any:
    kinds = (int,) if whole else (int, float)
    if isinstance(raw, bool) or not isinstance(raw, kinds) or not low <= raw <= high:
        kind = "a whole number" if whole else "a number"
        raise _fail(source, key, f"must be {kind} in {low:g}..{high:g}, got {shown(raw)}")
    return raw


def _seconds(source: str, key: str, raw: Any) -> float:
    try:
        us = units.parse_duration_us(raw)
    except ValueError as exc:
        raise _fail(source, key, str(exc), "e.g. '60s'") from None
    if us < 1_000_000:
        raise _fail(source, key, f"{shown(raw)} is under 1s", "e.g. '60s'")
    return us / 1_000_000


def _factors(data: Any, source: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    if data is None:
        return ()
    if not isinstance(data, Mapping):
        raise _fail(source, "factors", "must be a mapping of setting to a list of levels",
                    "e.g. 'factors: {latency: [1ms, 10ms]}'")
    out = []
    for key, levels in data.items():
        if key not in SETTING_KEYS:
            raise _unknown(source, "factors.", key, SETTING_KEYS)
        if isinstance(levels, (str, bytes)) or not isinstance(levels, (list, tuple)) or not levels:
            raise _fail(source, f"factors.{key}", "must be a non-empty list of levels",
                        f"e.g. '{SETTING_KEYS[key][2]}'")
        parsed = tuple(_setting(source, f"factors.{key}", key, level) for level in levels)
        if len(set(parsed)) != len(parsed):
            raise _fail(source, f"factors.{key}", f"repeated level in {shown(list(levels))}",
                        "use repetitions: for repeated runs")
        out.append((key, parsed))
    return tuple(out)


def _fixed(data: Any, source: str, base: Settings, factor_keys: set[str]) -> Settings:
    if data is None:
        return base
    if not isinstance(data, Mapping):
        raise _fail(source, "fixed", "must be a mapping of setting to one value", "e.g. 'fixed: {model: mlp}'")
    changes = {}
    for key, raw in data.items():
        if key not in SETTING_KEYS:
            raise _unknown(source, "fixed.", key, SETTING_KEYS)
        if key in factor_keys:
            raise _fail(source, f"fixed.{key}", "is also a factor", "keep it under factors or fixed, not both")
        if isinstance(raw, (list, tuple)):
            raise _fail(source, f"fixed.{key}", "a fixed setting takes one value", f"move {key} to factors to vary it")
        changes[SETTING_KEYS[key][0]] = _setting(source, f"fixed.{key}", key, raw)
    return replace(base, **changes)


def _extra_runs(data: Any, source: str) -> tuple[tuple[tuple[str, Any], ...], ...]:
    if data is None:
        return ()
    if not isinstance(data, (list, tuple)):
        raise _fail(source, "extra_runs", "must be a list of mappings",
                    "e.g. 'extra_runs: [{strategy: single, workers: 1}]'")
    out = []
    for i, entry in enumerate(data):
        if not isinstance(entry, Mapping) or not entry:
            raise _fail(source, f"extra_runs[{i}]", "must be a non-empty mapping of setting to one value",
                        "e.g. '{strategy: single, workers: 1}'")
        pairs = []
        for key, raw in entry.items():
            if key not in SETTING_KEYS:
                raise _unknown(source, f"extra_runs[{i}].", key, SETTING_KEYS)
            pairs.append((key, _setting(source, f"extra_runs[{i}].{key}", key, raw)))
        out.append(tuple(pairs))
    return tuple(out)


def playbook_from_mapping(data: Any, source: str, default_name: str = "playbook",
                          base_dir: Path | None = None) -> Playbook:
    """Build and validate a Playbook from parsed YAML; errors name `source` and the key."""
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
            raise _fail(source, "name", f"{rule}; got {shown(name)}", "e.g. 'name: latency-study'")
        raise _fail(source, "name", f"the file name {shown(name)} {rule}", "set one, e.g. 'name: latency-study'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(source, "description", "must be a string")
    base_profile = Profile(name="base")
    if "profile" in data:
        ref = data["profile"]
        if not isinstance(ref, str):
            raise _fail(source, "profile", f"must be a path to a profile file, got {shown(ref)}")
        path = Path(ref) if Path(ref).is_absolute() else (base_dir or Path(".")) / ref
        try:
            base_profile = load_profile(path)
        except ProfileError as exc:
            raise _fail(source, "profile", exc.message, exc.hint) from None
    base = Settings(delay_us=base_profile.delay_us, rate_bps=base_profile.rate_bps, loss=base_profile.loss,
                    jitter_us=base_profile.jitter_us)
    factors = _factors(data.get("factors"), source)
    fixed_data = data.get("fixed")
    fixed = _fixed(fixed_data, source, base, {k for k, _ in factors})
    seconds = data.get("seconds")
    if seconds is not None:
        seconds = _seconds(source, "seconds", seconds)
    timeouts = data.get("timeouts", {}) or {}
    if not isinstance(timeouts, Mapping):
        raise _fail(source, "timeouts", "must be a mapping", "e.g. 'timeouts: {startup: 240s, step: 60s}'")
    for key in timeouts:
        if key not in TIMEOUT_KEYS:
            raise _unknown(source, "timeouts.", key, TIMEOUT_KEYS)
    order = data.get("order", "random")
    if order not in ORDERS:
        raise _fail(source, "order", f"unknown order {shown(order)}", f"use one of: {', '.join(ORDERS)}")
    seed = data.get("seed")
    if seed is not None:
        seed = _number(source, "seed", seed, 0, 2**32 - 1)
    backend = data.get("backend", "auto")
    if backend not in BACKENDS:
        raise _fail(source, "backend", f"unknown backend {shown(backend)}", f"use one of: {', '.join(BACKENDS)}")
    warmup = _number(source, "warmup", data.get("warmup", 10), 0, 100_000)
    if seconds is not None and warmup < 1:
        raise _fail(source, "warmup", "a 'seconds' window needs at least 1 warm-up step",
                    "workers agree on the step count from the warm-up step times")
    book = Playbook(
        name=name, source=source, description=description, factors=factors, fixed=fixed,
        extra_runs=_extra_runs(data.get("extra_runs"), source),
        repetitions=_number(source, "repetitions", data.get("repetitions", 1), 1, 1000),
        order=order, seed=seed, warmup=warmup,
        steps=_number(source, "steps", data.get("steps", 30), 2, 1_000_000), seconds=seconds,
        startup_timeout_s=_seconds(source, "timeouts.startup", timeouts.get("startup", "240s")),
        step_timeout_s=_seconds(source, "timeouts.step", timeouts.get("step", "60s")),
        backend=None if backend == "auto" else backend, base_profile=base_profile,
        fixed_keys=tuple(fixed_data or ()),
    )
    for point in design_points(book):  # every combination must make sense; fail at load, not mid-study
        _profile_for(book, point)
    return book


def load_playbook(path: str | Path) -> Playbook:
    """Load and validate one playbook file; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path, "playbook", PlaybookError, "list the shipped ones with 'ls playbooks/'")
    return playbook_from_mapping(data, str(path), default_name=path.stem, base_dir=path.parent)


def _cross(book: Playbook, factors: tuple[tuple[str, tuple[Any, ...]], ...]) -> list[Settings]:
    keys = [k for k, _ in factors]
    out = []
    for combo in itertools.product(*(levels for _, levels in factors)):
        out.append(replace(book.fixed, **{SETTING_KEYS[k][0]: v for k, v in zip(keys, combo)}))
    return out


def _check_point(book: Playbook, settings: Settings, what: str) -> None:
    if settings.strategy == "single" and settings.workers != 1:
        key = book.where("workers") if what == "factors" else what
        raise _fail(book.source, key, f"strategy single runs one process, but workers is {settings.workers}",
                    "cross single with workers: 1 only, e.g. 'extra_runs: [{strategy: single, workers: 1}]'")
    if settings.nodes > 64:
        raise _fail(book.source, book.where("workers") if what == "factors" else what,
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
    for factors, what in groups:
        for settings in _cross(book, factors):
            _check_point(book, settings, what)
            key = settings.effective()
            if key in seen:
                if what == "factors":
                    ignored = next(FIELD_TO_KEY[f.name] for f in fields(Settings)
                                   if getattr(settings, f.name) != getattr(seen[key], f.name))
                    raise _fail(book.source, book.where(ignored),
                                f"strategy {settings.strategy} ignores {ignored}, so its runs would repeat",
                                "vary it only with the strategy that uses it (ps: ps, accum_steps: "
                                "allreduce-accum), e.g. through extra_runs")
                continue  # an extra run that the factorial already holds
            seen[key] = settings
            points.append(key)
    return points


def _profile_for(book: Playbook, settings: Settings) -> Profile:
    point = replace(book.base_profile, delay_us=settings.delay_us, rate_bps=settings.rate_bps,
                    loss=settings.loss, jitter_us=settings.jitter_us)
    point = replace(point, name=profile_name(point))
    keys = {f: book.where(FIELD_TO_KEY[f]) for f in ("delay_us", "rate_bps", "loss", "jitter_us")}
    try:
        return validate(point, book.source, keys=keys)
    except ProfileError as exc:
        raise PlaybookError(exc.message, exc.hint) from None


def expand(book: Playbook, seed: int) -> list[PlannedRun]:
    """Every run of the playbook, in run order.

    Design points in written order (factors crossed, first factor outermost), each
    repeated `repetitions` times; with order: random the whole list is shuffled with
    random.Random(seed), so the same seed gives the same order on every machine.
    """
    points = design_points(book)
    runs = [(p, rep) for p in range(len(points)) for rep in range(book.repetitions)]
    if book.order == "random":
        random.Random(seed).shuffle(runs)
    profiles = [_profile_for(book, s) for s in points]
    return [PlannedRun(index=i, point=p, repeat=rep, settings=points[p], profile=profiles[p])
            for i, (p, rep) in enumerate(runs)]


def design_digest(book: Playbook, runs: list[PlannedRun]) -> str:
    """A fingerprint of what was measured: run ids, settings, repetitions and the window.

    A results folder only resumes a playbook whose digest is the same, so a playbook
    edited between sessions never mixes two designs in one folder."""
    doc = {"window": [book.warmup, book.steps, book.seconds], "base_profile": book.base_profile.to_record(),
           "runs": [[r.run_id, r.point, r.repeat, asdict(r.settings)] for r in runs]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pending(runs: list[PlannedRun], statuses: Mapping[str, str]) -> list[PlannedRun]:
    """The runs still to do: those without a record whose status is ok or timeout."""
    return [r for r in runs if statuses.get(r.run_id) not in COMPLETE_STATUSES]


def recorded_statuses(results_dir: Path) -> dict[str, str]:
    """run id -> status of every run record in a results folder (runs/<id>.json)."""
    out: dict[str, str] = {}
    runs_dir = Path(results_dir) / "runs"
    if not runs_dir.is_dir():
        return out
    for path in sorted(runs_dir.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # a torn record counts as not done; the run is repeated
        if isinstance(record, dict) and isinstance(record.get("status"), str):
            out[str(record.get("run_id", path.stem))] = record["status"]
    return out


def plan_record(book: Playbook, seed: int, runs: list[PlannedRun]) -> dict[str, Any]:
    """What a results folder keeps about its playbook (playbook.json)."""
    return {"name": book.name, "source": book.source, "description": book.description, "seed": seed,
            "order": book.order, "repetitions": book.repetitions, "digest": design_digest(book, runs),
            "factors": [k for k, _ in book.factors],
            "runs": [{"run_id": r.run_id, "point": r.point, "repeat": r.repeat, "profile": r.profile.name,
                      **asdict(r.settings)} for r in runs]}


def check_resume(book: Playbook, runs: list[PlannedRun], recorded: Mapping[str, Any] | None,
                 results_dir: Path, has_runs: bool) -> None:
    """Refuse to resume into a folder that holds another design's results."""
    if recorded is None:
        if has_runs:
            raise PlaybookError(f"{results_dir}: holds run records but no playbook.json, so they are not "
                                f"from playbook {book.name}", hint="give another folder with --output")
        return
    if recorded.get("digest") != design_digest(book, runs):
        raise PlaybookError(f"{results_dir}: holds results of a different design than {book.source} "
                            f"(the playbook or its seed changed since)",
                            hint="give another folder with --output, or restore the playbook as it was")


# Settings field -> JobSpec field, for the settings that reach the training job
_JOB_FIELDS = {"strategy": "strategy", "model": "model", "batch": "batch_size", "ps": "ps",
               "accum_steps": "accum_steps", "data": "data"}


def job_fields(book: Playbook, settings: Settings, available: Iterable[str]) -> dict[str, Any]:
    """The JobSpec keyword arguments for a run, given the fields this build's JobSpec has.

    A setting the run depends on that JobSpec cannot carry yet (e.g. ps before the
    parameter-server strategy exists) is an error naming the playbook key, never dropped.
    """
    available = set(available)
    used = settings.effective()
    out: dict[str, Any] = {}
    for name, job_field in _JOB_FIELDS.items():
        value = getattr(used, name)
        if job_field in available:
            out[job_field] = value
            continue
        needed = (name == "ps" and settings.strategy == "ps") or \
            (name == "accum_steps" and settings.strategy == "allreduce-accum") or \
            (name == "data" and value != Settings.data)
        if needed:
            raise _fail(book.source, book.where(name), f"this netbench cannot run it yet: its job has no "
                        f"'{job_field}' field", "run a playbook without it, or update netbench")
    out.update(warmup=book.warmup, steps=book.steps, seconds=book.seconds)
    return out


def check_supported(book: Playbook, runs: list[PlannedRun], strategies: Iterable[str],
                    models: Iterable[str]) -> None:
    """Fail before the first run when a run needs a strategy or model this build lacks."""
    strategies, models = set(strategies), set(models)
    for run in runs:
        if run.settings.strategy not in strategies:
            raise _fail(book.source, book.where("strategy"), f"strategy {run.settings.strategy} is not available "
                        f"in this netbench (available: {', '.join(sorted(strategies))})")
        if run.settings.model not in models:
            raise _fail(book.source, book.where("model"), f"model {run.settings.model} is not available in this "
                        f"netbench (available: {', '.join(sorted(models))})")


def describe_settings(settings: Settings) -> dict[str, str]:
    """Settings as people write them, for tables: {'latency': '10ms', 'batch': '32', ...}."""
    s = settings
    out = {"strategy": s.strategy, "model": s.model, "batch": str(s.batch), "workers": str(s.workers),
           "ps": str(s.ps) if s.strategy == "ps" else "-",
           "accum_steps": str(s.accum_steps) if s.strategy == "allreduce-accum" else "-", "data": s.data,
           "latency": units.format_duration_us(s.delay_us), "bandwidth": units.format_rate_bps(s.rate_bps),
           "loss": units.format_ratio(s.loss), "jitter": units.format_duration_us(s.jitter_us)}
    return out


def fields_of(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))
