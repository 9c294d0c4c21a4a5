"""Typed step events (pure): what a training process reports, shared by the harness that
writes them and the controller that reads them.

A training process writes one JSON object per line on stdout (``to_wire``); the controller
parses each line once where it arrives (``parse_line``), adds who sent it and when it came
(``worker``: the task's index within its role, ``role``, ``recv``: monotonic seconds), and
hands typed events to everything downstream. Run records keep the events as JSON objects
(``to_record``), key for key as they were before the events were typed; ``from_record``
reads them back.

Schema version 1 is the format without a version key (every worker so far writes it); a
line that names another version (``"v": 2``), or that is not an event at all, parses into
an `Error` that says so, never an exception. Times are ``time.monotonic()`` seconds
(CLOCK_MONOTONIC: comparable between processes on one Linux host), durations seconds.

Additions that stay version 1 (a version-1 reader keeps what it does not know): a step's
``phase`` is ``warmup``, ``measured`` or ``calibration`` (split steps run after the
measured window to time computation against communication; see harness.loop), and readers
count ONLY ``measured`` steps as measured, whatever other phase they meet; a start event
may carry ``step`` ("fused" or "split": how the synchronous loop's steps were compiled;
absent from older records, whose steps were split, and from ps). A step may carry ``wait``
(seconds held by a barrier or a staleness gate, apart from ``comm``) and ``staleness`` (updates
applied between the read of the weights and this step's update): both absent when unknown; a
fused step may carry ``computed`` (seconds from its start until its gradients were ready, timed
inside the compiled step: which rank finished last, not a split). An
``eval`` event (held-out accuracy after ``step`` steps, measured outside the timed steps) is a
kind a version-1 reader that does not know it keeps as it came.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

SCHEMA_VERSION = 1
VERSION_KEY = "v"  # absent: version 1

PHASE_WARMUP = "warmup"
PHASE_MEASURED = "measured"
PHASE_CALIBRATION = "calibration"  # after the measured window, never measured
EVAL_OF_CENTRE = "centre"  # an Eval of EASGD's centre variable, not of the sender's replica
# set by the controller (never by a worker) on the steps of a launch dropped while a network
# change settles; like any phase but measured, never measured
PHASE_SETTLE = "settle"
PHASES = (PHASE_WARMUP, PHASE_MEASURED, PHASE_CALIBRATION)

STEP_FUSED = "fused"  # one compiled function per update (forward, backward, all-reduce, update)
STEP_SPLIT = "split"  # compute, then sync: two compiled functions with a host round trip
STEP_KINDS = (STEP_FUSED, STEP_SPLIT)

# Error.type of the errors the parser makes (the others come from the training process)
MALFORMED = "MalformedEvent"
UNSUPPORTED_VERSION = "UnsupportedEventVersion"

_ORIGIN = ("worker", "role", "recv")  # what the controller adds, in the order it adds them


@dataclass(frozen=True, kw_only=True)
class Event:
    """What every event carries once the controller has it (None on the harness side)."""

    kind: ClassVar[str] = ""
    worker: int | None = None  # the task's index within its role
    role: str | None = None  # the task's role; "worker" when a record does not say
    recv: float | None = None  # monotonic s when the controller read the line
    extra: tuple[tuple[str, Any], ...] = ()  # keys this version does not know, kept for the record

    @property
    def task_role(self) -> str:
        return self.role or "worker"

    def body(self) -> dict[str, Any]:
        """The kind's own keys, in the order the harness writes them."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Start(Event):
    """Sent once the strategy and model exist, before the first step. ``batch_size`` is the
    per-worker batch, ``accum_steps`` the local batches per update, ``model_bytes`` the size
    of all weights in bytes; ps servers send it too, with ``params`` 0."""

    kind: ClassVar[str] = "start"
    task_index: int = 0
    num_workers: int = 1
    pid: int = 0
    time: float = 0.0  # monotonic s
    tf_version: str = ""
    model: str = ""
    params: int = 0  # weights, trainable or not
    batch_size: int = 0  # per worker, examples
    global_batch_size: int = 0  # batch_size x num_workers
    strategy: str = "allreduce"
    accum_steps: int = 1  # local batches per update
    model_bytes: int = 0
    input_shape: tuple[int, ...] = ()  # per example
    classes: int = 0
    data: str = "synthetic"  # or the dataset's path
    step: str | None = None  # STEP_FUSED or STEP_SPLIT; None: not said (older records, ps)

    def body(self) -> dict[str, Any]:
        tail: dict[str, Any] = {} if self.step is None else {"step": self.step}
        return {"strategy": self.strategy, "role": self.task_role, "accum_steps": self.accum_steps,
                "model_bytes": self.model_bytes, "input_shape": list(self.input_shape),
                "classes": self.classes, "data": self.data, "event": self.kind,
                "task_index": self.task_index, "num_workers": self.num_workers, "pid": self.pid,
                "time": self.time, "tf_version": self.tf_version, "model": self.model,
                "params": self.params, "batch_size": self.batch_size,
                "global_batch_size": self.global_batch_size, **tail}


@dataclass(frozen=True, kw_only=True)
class Step(Event):
    """One training step. ``step`` counts from 0 over warm-up + measured steps; ``images``
    is what the whole cluster trained on; ``compute`` and ``comm`` split the step into local
    computation and communication (None when unknown: a fused step cannot be split, the
    calibration steps after the measured window are); ``executor`` is the worker that ran
    a ps step (None otherwise); ``loss`` is None when it was not finite."""

    kind: ClassVar[str] = "step"
    step: int = 0
    phase: str = PHASE_MEASURED
    start: float = 0.0
    end: float = 0.0
    duration: float = 0.0
    images: int = 0
    loss: float | None = None
    compute: float | None = None
    comm: float | None = None
    executor: int | None = None
    wait: float | None = None  # held by a barrier or staleness gate (exchange strategies)
    staleness: int | None = None  # updates between the read of the weights and this update
    # a fused step's computation, from its start to when its gradients were ready (timed inside
    # the compiled step): who finished last, never a compute/comm split (the collective may overlap)
    computed: float | None = None

    @property
    def computation(self) -> float | None:
        """The step's computation in seconds, split or fused: `compute`, else `computed`."""
        return self.compute if self.compute is not None else self.computed

    @property
    def measured(self) -> bool:
        return self.phase == PHASE_MEASURED

    @property
    def calibration(self) -> bool:
        return self.phase == PHASE_CALIBRATION

    def body(self) -> dict[str, Any]:
        head: dict[str, Any] = {"compute": self.compute, "comm": self.comm}
        if self.executor is not None:
            head["executor"] = self.executor
        if self.wait is not None:
            head["wait"] = self.wait
        if self.staleness is not None:
            head["staleness"] = self.staleness
        if self.computed is not None:
            head["computed"] = self.computed
        return {**head, "event": self.kind, "step": self.step, "phase": self.phase, "start": self.start,
                "end": self.end, "duration": self.duration, "images": self.images, "loss": self.loss}


@dataclass(frozen=True, kw_only=True)
class Done(Event):
    """Sent after the last step; ``steps`` = the step events sent (warm-up + measured +
    calibration)."""

    kind: ClassVar[str] = "done"
    time: float = 0.0
    steps: int = 0

    def body(self) -> dict[str, Any]:
        return {"event": self.kind, "time": self.time, "steps": self.steps}


@dataclass(frozen=True, kw_only=True)
class Error(Event):
    """Training failed (the process then exits non-zero), or a line could not be read
    (``type`` MALFORMED or UNSUPPORTED_VERSION, ``message`` naming the line)."""

    kind: ClassVar[str] = "error"
    type: str = "Error"
    message: str = ""

    @property
    def unreadable(self) -> bool:
        """The parser made this error: the line was not an event this version reads."""
        return self.type in (MALFORMED, UNSUPPORTED_VERSION)

    def body(self) -> dict[str, Any]:
        return {"event": self.kind, "type": self.type, "message": self.message}


@dataclass(frozen=True, kw_only=True)
class Resources(Event):
    """A resource sample of the process (see netbench.jobs.resources): CPU seconds so far,
    resident bytes, and bytes its namespace's interfaces received and sent so far."""

    kind: ClassVar[str] = "resources"
    time: float = 0.0
    cpu_s: float = 0.0
    rss_bytes: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0

    def body(self) -> dict[str, Any]:
        return {"event": self.kind, "time": self.time, "cpu_s": self.cpu_s, "rss_bytes": self.rss_bytes,
                "rx_bytes": self.rx_bytes, "tx_bytes": self.tx_bytes}


@dataclass(frozen=True, kw_only=True)
class Eval(Event):
    """Held-out accuracy of the sender's model after ``step`` training steps, measured outside
    the timed steps: ``time`` (monotonic s), ``train_s`` (seconds in training steps so far,
    evaluations left out), ``accuracy`` in [0, 1], mean ``loss``, and the ``examples`` scored.
    ``of`` names another model than the sender's own: ``centre`` (EASGD's centre variable, read
    from the parameter servers outside the timed steps)."""

    kind: ClassVar[str] = "eval"
    step: int = 0
    time: float = 0.0
    train_s: float = 0.0
    accuracy: float = 0.0
    loss: float | None = None
    examples: int = 0
    of: str | None = None

    def body(self) -> dict[str, Any]:
        body = {"event": self.kind, "step": self.step, "time": self.time, "train_s": self.train_s,
                "accuracy": self.accuracy, "loss": self.loss, "examples": self.examples}
        if self.of is not None:
            body["of"] = self.of
        return body


@dataclass(frozen=True, kw_only=True)
class Other(Event):
    """An event kind this version does not know: kept as it came, for the record."""

    name: str = ""
    fields_: tuple[tuple[str, Any], ...] = ()

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.name

    def body(self) -> dict[str, Any]:
        return dict(self.fields_)


KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in (Start, Step, Done, Error, Resources, Eval)}


def _finite_or_none(value: Any) -> float | None:
    """JSON has no NaN/Infinity: a diverged loss is reported as None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


# how each kind's known keys are read from JSON (the body's keys, less "event" and "role")
_READ: dict[str, dict[str, Any]] = {
    "start": {"task_index": int, "num_workers": int, "pid": int, "time": float, "tf_version": str,
              "model": str, "params": int, "batch_size": int, "global_batch_size": int,
              "strategy": str, "accum_steps": int, "model_bytes": int,
              "input_shape": lambda v: tuple(int(d) for d in v), "classes": int, "data": str,
              "step": lambda v: None if v is None else str(v)},
    "step": {"step": int, "phase": str, "start": float, "end": float, "duration": float, "images": int,
             "loss": _finite_or_none, "compute": _optional_float, "comm": _optional_float,
             "executor": lambda v: None if v is None else int(v), "wait": _optional_float,
             "staleness": lambda v: None if v is None else int(v), "computed": _optional_float},
    "done": {"time": float, "steps": int},
    "error": {"type": str, "message": str},
    "resources": {"time": float, "cpu_s": float, "rss_bytes": int, "rx_bytes": int, "tx_bytes": int},
    "eval": {"step": int, "time": float, "train_s": float, "accuracy": float, "loss": _finite_or_none,
             "examples": int, "of": lambda v: None if v is None else str(v)},
}


def _malformed(what: str, text: Any) -> Error:
    shown = text if isinstance(text, str) else json.dumps(text, default=str)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return Error(type=MALFORMED, message=f"{what}: {shown}")


def from_record(data: Mapping[str, Any]) -> Event:
    """The typed event of one JSON object (a wire line's or a run record's); never raises:
    an object that is not a readable event becomes an `Error` naming it."""
    if not isinstance(data, Mapping):
        return _malformed("not a JSON object", data)
    version = data.get(VERSION_KEY, SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        return Error(type=UNSUPPORTED_VERSION,
                     message=f"event schema version {version!r}, this netbench reads {SCHEMA_VERSION}: "
                             f"{json.dumps(dict(data), default=str)[:200]}")
    name = data.get("event")
    if not isinstance(name, str):
        return _malformed("no event kind", dict(data))
    try:
        worker = data.get("worker")
        origin = {"worker": None if worker is None else int(worker),
                  "role": None if data.get("role") is None else str(data["role"]),
                  "recv": _optional_float(data.get("recv"))}
        cls = KINDS.get(name)
        if cls is None:
            body = tuple((k, v) for k, v in data.items() if k not in _ORIGIN)
            return Other(name=name, fields_=body, **origin)
        readers = _READ[name]
        known = {key: read(data[key]) for key, read in readers.items() if key in data}
        extra = tuple((k, v) for k, v in data.items()
                      if k not in readers and k not in _ORIGIN and k not in ("event", VERSION_KEY))
        return cls(**known, extra=extra, **origin)
    except (TypeError, ValueError) as exc:
        return _malformed(f"unreadable {name} event ({exc})", dict(data))


def parse_line(line: str | bytes) -> Event | None:
    """The event on one stdout line; None for a line that is not meant as one (it does not
    start with "{": stray output), an `Error` for a line that is but cannot be read."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return _malformed("not JSON", line)
    return from_record(data)


def to_wire(event: Event) -> dict[str, Any]:
    """The JSON object the harness writes for an event (no controller annotations)."""
    return {**event.body(), **dict(event.extra)}


def to_record(event: Event) -> dict[str, Any]:
    """The JSON object a run record keeps: the wire object, then worker, role and recv as the
    controller adds them (a start event's own "role" keeps its place)."""
    out = to_wire(event)
    for key in _ORIGIN:
        value = getattr(event, key)
        if value is not None:
            out[key] = value
    return out


def received(event: Event, worker: int, role: str, recv: float) -> Event:
    """The event as the controller keeps it: who sent it and when it arrived."""
    return evolve(event, worker=worker, role=role, recv=recv)


def evolve(event: Event, **changes: Any) -> Event:
    """dataclasses.replace for events, without re-running __init__: the controller tags every
    step of every process (its sender, its phase in a point), 0.5 us against replace's 3 us.
    Only for fields whose values the caller knows are valid (events check nothing on init)."""
    new = object.__new__(type(event))
    new.__dict__.update(event.__dict__)
    new.__dict__.update(changes)
    return new


def as_event(value: Event | Mapping[str, Any]) -> Event:
    """A typed event from a typed event or a record's JSON object (older callers, tests)."""
    return value if isinstance(value, Event) else from_record(value)


def as_record(value: Event | Mapping[str, Any]) -> dict[str, Any]:
    """A run record's JSON object of a typed event (a JSON object is taken as it is)."""
    return to_record(value) if isinstance(value, Event) else dict(value)


def as_events(values: Sequence[Event | Mapping[str, Any]]) -> list[Event]:
    return [as_event(v) for v in values]


def start_event(task_index: int, num_workers: int, pid: int, time_s: float, tf_version: str,
                model: str, params: int, batch_size: int, *, strategy: str = "allreduce",
                role: str = "worker", accum_steps: int = 1, model_bytes: int = 0,
                input_shape: Sequence[int] = (), classes: int = 10, data: str = "synthetic",
                step: str | None = None) -> Start:
    """A Start with ``global_batch_size`` = batch_size x num_workers."""
    return Start(task_index=int(task_index), num_workers=int(num_workers), pid=int(pid), time=float(time_s),
                 tf_version=str(tf_version), model=str(model), params=int(params), batch_size=int(batch_size),
                 global_batch_size=int(batch_size) * int(num_workers), strategy=str(strategy), role=str(role),
                 accum_steps=int(accum_steps), model_bytes=int(model_bytes),
                 input_shape=tuple(int(d) for d in input_shape), classes=int(classes), data=str(data),
                 step=None if step is None else str(step))


def step_event(step: int, phase: str, start: float, end: float, images: int, loss: float,
               compute: float | None = None, comm: float | None = None,
               executor: int | None = None, wait: float | None = None,
               staleness: int | None = None, computed: float | None = None) -> Step:
    """A Step with ``duration`` = end - start; raises ValueError on an unknown phase."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    return Step(step=int(step), phase=phase, start=float(start), end=float(end),
                duration=float(end) - float(start), images=int(images), loss=_finite_or_none(loss),
                compute=_optional_float(compute), comm=_optional_float(comm),
                executor=None if executor is None else int(executor),
                wait=_optional_float(wait), staleness=None if staleness is None else int(staleness),
                computed=_optional_float(computed))


def eval_event(step: int, time_s: float, train_s: float, accuracy: float, loss: float | None,
               examples: int) -> Eval:
    """An Eval; a loss that is not finite is reported as None."""
    return Eval(step=int(step), time=float(time_s), train_s=float(train_s), accuracy=float(accuracy),
                loss=_finite_or_none(loss), examples=int(examples))


def error_event(exc: BaseException) -> Error:
    return Error(type=type(exc).__name__, message=str(exc))

