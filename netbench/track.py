"""Tell netbench where your training job's steps begin and end (standard library only).

    from netbench import track

    for batch in data:
        with track.step(images=len(batch)):   # this process's images in the step
            loss = train_step(batch)           # synchronise inside (e.g. loss.item())
        if track.stop_requested():             # netbench has measured what it needs
            break

or, with Keras (Keras 3 or tf_keras): ``model.fit(..., callbacks=[track.keras_callback(images_per_batch=64)])``.

Under ``netbench sweep ... -- COMMAND`` every rank writes one JSON line per step on its
standard output (the step events netbench's own workers write: netbench.jobs.events), each
line on a line of its own whatever the job prints around it. Outside netbench (no
NETBENCH_RANK in the environment) nothing is written and stop_requested() is always False,
so the same script runs as it did.

On import every rank says that it reports through this module (a ``track-loaded`` event):
a job that imports neither this module nor gives --step-regex is measured in bytes on its
nodes' links instead.

Steps are numbered from 0 on each rank; the first NETBENCH_WARMUP are warm-up. When netbench
wants the job to end it writes a step count into the file named by NETBENCH_CONTROL (on a
host, a file of the rank's own there), far enough ahead of the last step it heard that no
rank has reached it yet: stop_requested() turns true on every rank once that
many steps are done, so the ranks of a collective job stop after the same step. A job that
never asks is stopped (its whole process group) once its window is measured.

A node netbench slows with --step-delay adds that long to each of its ranks' steps, inside
step() and the Keras callback's batch (NETBENCH_STEP_DELAY_S, and NETBENCH_STEP_DELAY_FILE
when a schedule changes it mid-run).

This module imports nothing outside the standard library: no framework, not the rest of
netbench; it only looks into sys.modules to say which framework ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["step", "computed", "stop_requested", "keras_callback", "active"]

_FRAMEWORKS = ("torch", "tf_keras", "keras", "tensorflow", "jax")


class _State:
    def __init__(self, environ) -> None:
        # RANK and WORLD_SIZE first: a launcher netbench starts once per node (torchrun) gives each
        # of its processes its own; netbench's ranks get the same values under both names
        self.rank = int(environ.get("RANK") or environ.get("NETBENCH_RANK", "0") or 0)
        self.world = int(environ.get("WORLD_SIZE") or environ.get("NETBENCH_WORLD_SIZE", "1") or 1)
        self.warmup = int(environ.get("NETBENCH_WARMUP", "0") or 0)
        self.control = environ.get("NETBENCH_CONTROL", "")
        self.active = "NETBENCH_RANK" in environ
        self.steps = 0  # steps completed on this rank
        self.started = False
        self.checked = False
        self.stop_at: int | None = None
        self._seen: tuple[int, int] | None = None  # the control file's (mtime_ns, size) last read
        self.computed_at: float | None = None  # computed(): when this step's computation ended
        # the node's step delay (as netbench.jobs.harness.step_delay, which this module cannot import)
        self.delay_s = _delay_seconds(environ.get("NETBENCH_STEP_DELAY_S"))
        self.delay_file = environ.get("NETBENCH_STEP_DELAY_FILE", "")
        self._delay_seen: tuple[int, int] | None = None


def _delay_seconds(text) -> float:
    try:
        value = float((text or "").strip() or 0)
    except ValueError:
        return 0.0
    return value if 0 < value < 3600 else 0.0


def _pause() -> None:
    """Sleep this node's step delay, inside the step (compute time a slower node would take);
    the delay file is read again only when it changed (a schedule or the next point)."""
    if _state.delay_file:
        try:
            st = os.stat(_state.delay_file)
            seen = (st.st_ino, st.st_mtime_ns)
            if seen != _state._delay_seen:
                with open(_state.delay_file, encoding="ascii") as fh:
                    _state.delay_s = _delay_seconds(fh.read())
                _state._delay_seen = seen
        except OSError:
            pass
    if _state.delay_s > 0:
        time.sleep(_state.delay_s)


_state = _State(os.environ)


def active() -> bool:
    """Whether this process runs under netbench (its steps are reported)."""
    return _state.active


def _write(event: dict) -> None:
    # one os.write per event, with a newline before it: a line is never split by the job's
    # own output (a progress bar ends without a newline), and is atomic on a pipe (< 4 KiB)
    try:
        os.write(1, ("\n" + json.dumps(event) + "\n").encode())
    except OSError:
        pass  # stdout closed: the job goes on unmeasured rather than failing


def _framework() -> str:
    for name in _FRAMEWORKS:
        module = sys.modules.get(name)
        if module is not None:
            return f"{name} {getattr(module, '__version__', '')}".strip()
    return ""


def _start() -> None:
    _state.started = True
    _write({"event": "start", "task_index": _state.rank, "num_workers": _state.world, "pid": os.getpid(),
            "time": time.monotonic(), "strategy": "command", "model": "", "framework": _framework(),
            "source": "track"})


def _loaded() -> None:
    """Say at import that this rank reports its steps through this module, so netbench waits
    for them rather than measuring the job in bytes on its links (netbench.jobs.link_bytes)."""
    if _state.active:
        _write({"event": "track-loaded", "task_index": _state.rank, "pid": os.getpid()})


_loaded()


def computed() -> None:
    """Mark the end of this rank's computation in the step under way (before its collective):
    the step then reports its computation and communication apart, and netbench can tell which
    rank finished last, the one the others waited for."""
    _state.computed_at = time.monotonic()


def record(start: float, end: float, images: int = 0) -> None:
    """Report one step that ran from `start` to `end` (time.monotonic() seconds) on this rank,
    training `images` images here; step() and the Keras callback call this. With computed()
    called inside the step, its computation (start to then) and communication (then to end)."""
    marked, _state.computed_at = _state.computed_at, None
    if not _state.active:
        _state.steps += 1
        return
    if not _state.started:
        _start()
    number = _state.steps
    _state.steps += 1
    # "rank": a launcher netbench starts once per node (torchrun) writes several ranks' steps on
    # one stdout; the controller reads each step's rank from it
    split = marked is not None and start <= marked <= end
    _write({"compute": marked - start if split else None, "comm": end - marked if split else None,
            "event": "step", "step": number,
            "phase": "warmup" if number < _state.warmup else "measured", "start": start, "end": end,
            "duration": end - start, "images": images * _state.world, "loss": None, "rank": _state.rank})


@contextmanager
def step(images: int = 0) -> Iterator[None]:
    """Time one training step of this rank (`images`: the images this rank trains on in it).
    The job must synchronise inside it (a collective, or reading the loss), or the step ends
    before its work does."""
    start = time.monotonic()
    _pause()
    yield
    record(start, time.monotonic(), images)


def _read_control() -> None:
    try:
        st = os.stat(_state.control)
    except OSError:
        return
    if _state._seen == (st.st_mtime_ns, st.st_size):
        return
    _state._seen = (st.st_mtime_ns, st.st_size)
    try:
        with open(_state.control) as fh:
            text = fh.read().strip()
        _state.stop_at = int(text) if text else None
    except (OSError, ValueError):
        pass


def stop_requested() -> bool:
    """True once netbench wants the job to end: on every rank after the same step. Ask after
    each step; a job that asks serves many network points from one start."""
    if not _state.active:
        return False
    if not _state.checked:
        _state.checked = True
        _write({"event": "stop-checked", "step": _state.steps})
    if _state.control:
        _read_control()
    return _state.stop_at is not None and _state.steps >= _state.stop_at


def _keras_base():
    """The Callback class of the Keras the job uses: tf_keras when it is loaded (model.fit
    under MultiWorkerMirroredStrategy needs it), else Keras 3."""
    if "tf_keras" in sys.modules:
        return sys.modules["tf_keras"].callbacks.Callback
    import keras  # the job's own Keras; imported only when a callback is asked for

    return keras.callbacks.Callback


def keras_callback(images_per_batch: int):
    """A Keras callback (Keras 3 or tf_keras) that reports each training batch as a step and
    stops model.fit when netbench asks (`images_per_batch`: this worker's batch size)."""

    class NetbenchSteps(_keras_base()):
        def __init__(self) -> None:
            super().__init__()
            self._began = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self._began = time.monotonic()
            _pause()

        def on_train_batch_end(self, batch, logs=None):
            record(self._began, time.monotonic(), images_per_batch)
            if stop_requested():
                self.model.stop_training = True

    return NetbenchSteps()
