"""The training process's side of the event stream: one JSON event per stdout line.

Stdout is reserved for events (`take_stdout_for_events`); each event is written whole and
flushed at once, so the controller sees it now. The resource sampler (``--sample-resources``)
writes from its own thread, so writes are serialised, and it sends its last sample before
the done event. Also here: the startup watchdog, the one way out of a cluster that never
forms (TF blocks in C++ holding the GIL).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
from typing import IO, Any, Mapping

from netbench.jobs import events as ev
from netbench.jobs import resources

_LOCK = threading.Lock()
_SAMPLER: resources.Sampler | None = None  # set by start_sampler under --sample-resources


def emit(event: ev.Event | Mapping[str, Any], stream: IO[str]) -> None:
    """Write one event (typed, or its wire object) as a JSON line and flush. The resource
    sampler (if any) sends its last sample before the done event."""
    wire = ev.to_wire(event) if isinstance(event, ev.Event) else dict(event)
    if wire.get("event") == ev.Done.kind and _SAMPLER is not None:
        _SAMPLER.stop()
    line = json.dumps(wire, allow_nan=False) + "\n"
    with _LOCK:  # the sampler's thread emits too
        stream.write(line)
        stream.flush()


def start_sampler(interval_s: float, stream: IO[str]) -> resources.Sampler:
    """Sample this process's resources every `interval_s` onto `stream` until the done event."""
    global _SAMPLER
    _SAMPLER = resources.Sampler(interval_s, lambda e: emit(e, stream)).start()
    return _SAMPLER


def take_stdout_for_events() -> IO[str]:
    """Reserve the real stdout for events; send everything else to stderr.

    Duplicates fd 1 for the event stream, then points fd 1 and sys.stdout at stderr, so
    C++ or Python output from TF/Keras can never corrupt the JSON stream.
    """
    sys.stdout.flush()
    stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def tf_config_workers(default: tuple[str, ...] = ()) -> tuple[list[str], int]:
    """(worker addresses, this task's index) from TF_CONFIG; `default` workers without it."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    return config.get("cluster", {}).get("worker", list(default)), int(config.get("task", {}).get("index", 0))


def time_calls(call: Any, warmup: int, reps: int) -> list[float]:
    """Seconds of each of `reps` calls of `call`, after `warmup` untimed ones (a benchmark's)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def emit_timings(body: Mapping[str, Any], times: list[float], step: int, stream: IO[str]) -> None:
    """A benchmark's timings of one size: its event (`body` and the times), then a step event
    of their total, which the controller counts as progress (and against its step timeout)."""
    now = time.time()
    emit({**body, "times": times}, stream)
    emit(ev.Step(step=step, phase=str(body["event"]), start=now - sum(times), end=now, duration=sum(times), images=0),
         stream)


def bench_main(parser: Any, run: Any, argv: list[str] | None) -> int:
    """A benchmark process's main (collective_bench, exchange_bench): events on the real
    stdout, then `run(args, stream)`, which returns the step events it sent, then the done
    event and status 0; a failure is an error event (the controller reads the cause from it)
    and status 1."""
    args = parser.parse_args(argv)
    stream = take_stdout_for_events()
    try:
        sent = run(args, stream)
        emit(ev.Done(time=time.time(), steps=sent), stream)
        return 0
    except Exception as exc:  # the controller reads the cause from the event
        emit(ev.Error(type=type(exc).__name__, message=str(exc)[:2000]), stream)
        return 1


def arm_startup_watchdog(timeout_s: float, stream: IO[str] | None = None) -> None:
    """Exit the process with status 1 if not disarmed within ``timeout_s`` s.

    While the strategy connects to its peers, TF blocks in C++ with no timeout when a peer
    never shows up, HOLDING THE GIL (so a Python thread or signal handler cannot run), and
    in multi-worker mode it swallows SIGTERM. faulthandler's watchdog is a C thread that
    needs no GIL: it dumps all Python tracebacks to ``stream`` (default stderr) and calls
    _exit(1). No JSON error event can be written on this path. 0 disables.
    """
    if timeout_s > 0:
        faulthandler.dump_traceback_later(
            timeout_s, exit=True, file=stream if stream is not None else sys.stderr)


def disarm_startup_watchdog() -> None:
    """Cancel arm_startup_watchdog (no-op when not armed)."""
    faulthandler.cancel_dump_traceback_later()


def run_process(args: Any, run: Any) -> int:
    """A training process's main: events on the real stdout, the resource sampler if asked,
    then `run(args, events)`; any failure is reported as an error event and the process
    leaves at once with status 1 (a worker whose peer died can block in gRPC's or gloo's
    teardown during a normal interpreter exit; the event is flushed by then)."""
    events = take_stdout_for_events()
    if args.sample_resources > 0:
        start_sampler(args.sample_resources, events)
    try:
        run(args, events)
    except Exception as exc:  # report any failure to the controller, then fail
        disarm_startup_watchdog()
        try:
            emit(ev.error_event(exc), events)
        finally:
            sys.stderr.flush()
            os._exit(1)
    events.flush()
    return 0
