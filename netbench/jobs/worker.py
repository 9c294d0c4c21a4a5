"""Per-node training harness: one process per emulated node.

The controller starts this module (``python -m netbench.jobs.worker``) inside a
network namespace with ``TF_CONFIG`` in its environment.  Like pyperf's worker
role, the worker only trains, times and reports: it writes one JSON event per
line on stdout and leaves planning and statistics to the controller.  All other
output (TensorFlow / Keras logs, stray prints) goes to stderr.

Training uses ``tf.distribute.MultiWorkerMirroredStrategy`` (ring all-reduce
over gRPC) with a custom loop: Keras 3 ``model.fit`` fails under MWMS on TF
2.21, so the Keras model only provides the layers and the step is a
``tf.GradientTape`` + ``optimizer.apply_gradients`` inside ``strategy.run``.
The Keras 3 optimizer all-reduces (sums) the gradients itself in replica
context, with the strategy's default communication options (ring, timeout).

Events (key names are a contract with the controller; times are
``time.monotonic()`` seconds, which is CLOCK_MONOTONIC and therefore comparable
between processes on one Linux host)::

    {"event": "start", "task_index", "num_workers", "pid", "time",
     "tf_version", "model", "params", "batch_size", "global_batch_size"}
    {"event": "step", "step", "phase": "warmup"|"measured", "start", "end",
     "duration", "images", "loss"}
    {"event": "done", "time", "steps"}
    {"event": "error", "type", "message"}

TensorFlow is imported only inside functions that need it, so the controller
can import the pure helpers below cheaply.

Failure handling (TF 2.21 behaviour measured on loopback):

* a peer that exits or is SIGKILLed: the survivors' collectives fail at once
  (UnavailableError) -> error event, exit 1;
* a peer that hangs (e.g. SIGSTOP): the coordination service's heartbeat or
  the collective timeout (--collective-timeout) aborts the step -> error event;
* a peer that never starts: strategy creation blocks forever in C++ holding
  the GIL, so --startup-timeout uses faulthandler's C watchdog (traceback on
  stderr, exit 1, no JSON event);
* in multi-worker mode TF catches SIGTERM (preemption notifier), so SIGTERM
  is ignored until the strategy exists; afterwards the default action is
  restored.  Controllers should escalate to SIGKILL.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import signal
import sys
import threading
import time
from typing import IO, Any, Mapping, MutableMapping, Sequence

MODELS = ("mlp", "cnn")
# Per-example input shape of each synthetic model.
INPUT_SHAPES: Mapping[str, tuple[int, ...]] = {"mlp": (784,), "cnn": (32, 32, 3)}
NUM_CLASSES = 10

PHASE_WARMUP = "warmup"
PHASE_MEASURED = "measured"

DEFAULT_MODEL = "mlp"
DEFAULT_BATCH_SIZE = 64
DEFAULT_WARMUP = 10
DEFAULT_STEPS = 30
DEFAULT_SEED = 0
DEFAULT_LEARNING_RATE = 0.01
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0
DEFAULT_STARTUP_TIMEOUT_S = 300.0

# Applied only when the caller's environment does not set it already.
DEFAULT_TF_CPP_MIN_LOG_LEVEL = "2"


# ---------------------------------------------------------------------------
# Pure helpers (no TensorFlow)
# ---------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the worker's command-line parser."""
    parser = argparse.ArgumentParser(
        prog="python -m netbench.jobs.worker",
        description=(
            "Train a synthetic model with MultiWorkerMirroredStrategy and "
            "report per-step timings as JSON lines on stdout."
        ),
    )
    parser.add_argument("--model", choices=MODELS, default=DEFAULT_MODEL,
                        help="mlp: 784-512-512-10 (~670k params); "
                             "cnn: small conv net on 32x32x3 (default: %(default)s)")
    parser.add_argument("--batch-size", type=_positive_int, default=DEFAULT_BATCH_SIZE,
                        help="PER-WORKER batch size in examples (default: %(default)s)")
    parser.add_argument("--warmup", type=_non_negative_int, default=DEFAULT_WARMUP,
                        help="warm-up steps, timed and flagged (default: %(default)s)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, default=None,
                        help=f"measured steps (default: {DEFAULT_STEPS})")
    length.add_argument("--seconds", type=_positive_float, default=None,
                        help="measured window in seconds; the step count is derived "
                             "identically on all workers from the all-reduced mean "
                             "warm-up step time (needs --warmup >= 1)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="seed for weights and synthetic data (default: %(default)s)")
    parser.add_argument("--learning-rate", type=_positive_float,
                        default=DEFAULT_LEARNING_RATE,
                        help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--collective-timeout", type=_non_negative_float,
                        default=DEFAULT_COLLECTIVE_TIMEOUT_S,
                        help="timeout of each collective op in seconds, 0 disables "
                             "(default: %(default)s)")
    parser.add_argument("--startup-timeout", type=_non_negative_float,
                        default=DEFAULT_STARTUP_TIMEOUT_S,
                        help="give up (error event, exit 1) if the cluster and model "
                             "are not up after this many seconds, 0 disables "
                             "(default: %(default)s)")
    parser.add_argument("--threads", type=_non_negative_int, default=0,
                        help="TF intra-op and inter-op thread count, 0 = TF default "
                             "(default: %(default)s)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate worker options; exits with status 2 on bad input.

    After parsing exactly one of ``steps`` / ``seconds`` is set.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seconds is None:
        if args.steps is None:
            args.steps = DEFAULT_STEPS
    elif args.warmup < 1:
        # The step count for --seconds comes from the warm-up mean.
        parser.error("--seconds needs --warmup >= 1")
    return args


def warmup_mean(durations: Sequence[float]) -> float:
    """Mean warm-up step duration in seconds used to size a --seconds window.

    The first step includes tf.function tracing and graph optimisation (often
    seconds), so it is dropped when there is more than one warm-up step.
    """
    if not durations:
        raise ValueError("need at least one warm-up duration")
    kept = durations[1:] if len(durations) > 1 else durations
    return sum(kept) / len(kept)


def measured_steps_from_mean(seconds: float, mean_step_s: float) -> int:
    """Number of measured steps filling ``seconds`` at ``mean_step_s`` per step.

    Returns ``max(1, ceil(seconds / mean_step_s))``.  Every worker must call
    this with the same (all-reduced) mean so that all run the same number of
    steps; otherwise the collectives of the longer runner deadlock.
    """
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"seconds must be finite and > 0, got {seconds!r}")
    if not math.isfinite(mean_step_s) or mean_step_s <= 0:
        raise ValueError(f"mean step time must be finite and > 0, got {mean_step_s!r}")
    return max(1, math.ceil(seconds / mean_step_s))


def make_tf_config(addresses: Sequence[str], index: int) -> str:
    """TF_CONFIG JSON for worker ``index`` of a cluster of ``addresses``.

    ``addresses`` are "host:port" strings, one per worker; worker 0 is the
    chief and the coordination-service leader.
    """
    if not addresses:
        raise ValueError("need at least one worker address")
    if not 0 <= index < len(addresses):
        raise ValueError(f"index {index} out of range for {len(addresses)} workers")
    return json.dumps({
        "cluster": {"worker": list(addresses)},
        "task": {"type": "worker", "index": index},
    })


def _finite_or_none(value: float) -> float | None:
    """JSON has no NaN/Infinity; a diverged loss is reported as null."""
    value = float(value)
    return value if math.isfinite(value) else None


def start_event(task_index: int, num_workers: int, pid: int, time_s: float,
                tf_version: str, model: str, params: int,
                batch_size: int) -> dict[str, Any]:
    """Event sent once the strategy and model exist, before the first step.

    ``time_s`` is time.monotonic() seconds, ``batch_size`` the per-worker batch.
    """
    return {
        "event": "start",
        "task_index": int(task_index),
        "num_workers": int(num_workers),
        "pid": int(pid),
        "time": float(time_s),
        "tf_version": str(tf_version),
        "model": str(model),
        "params": int(params),
        "batch_size": int(batch_size),
        "global_batch_size": int(batch_size) * int(num_workers),
    }


def step_event(step: int, phase: str, start: float, end: float, images: int,
               loss: float) -> dict[str, Any]:
    """Event for one training step.

    ``step`` counts from 0 over warm-up + measured steps; ``start``/``end`` are
    time.monotonic() seconds; ``images`` is the global batch size (examples
    processed by the whole cluster in this step).
    """
    if phase not in (PHASE_WARMUP, PHASE_MEASURED):
        raise ValueError(f"phase must be {PHASE_WARMUP!r} or {PHASE_MEASURED!r}, got {phase!r}")
    return {
        "event": "step",
        "step": int(step),
        "phase": phase,
        "start": float(start),
        "end": float(end),
        "duration": float(end) - float(start),
        "images": int(images),
        "loss": _finite_or_none(loss),
    }


def done_event(time_s: float, steps: int) -> dict[str, Any]:
    """Event sent after the last step; ``steps`` = warm-up + measured steps."""
    return {"event": "done", "time": float(time_s), "steps": int(steps)}


def error_event(exc: BaseException) -> dict[str, Any]:
    """Event sent when training fails; the process then exits non-zero."""
    return {"event": "error", "type": type(exc).__name__, "message": str(exc)}


def emit(event: Mapping[str, Any], stream: IO[str]) -> None:
    """Write one event as a JSON line and flush, so the controller sees it now."""
    stream.write(json.dumps(event, allow_nan=False) + "\n")
    stream.flush()


def arm_startup_watchdog(timeout_s: float, stream: IO[str] | None = None) -> None:
    """Exit the process with status 1 if not disarmed within ``timeout_s`` s.

    While the strategy connects to its peers, TF blocks in C++ with no timeout
    when a peer never shows up, HOLDING THE GIL (so a Python thread or signal
    handler cannot run), and in multi-worker mode it swallows SIGTERM.
    faulthandler's watchdog is a C thread that needs no GIL: it dumps all
    Python tracebacks to ``stream`` (default stderr) and calls _exit(1).
    No JSON error event can be written on this path.  0 disables.
    """
    if timeout_s > 0:
        faulthandler.dump_traceback_later(
            timeout_s, exit=True, file=stream if stream is not None else sys.stderr)


def disarm_startup_watchdog() -> None:
    """Cancel arm_startup_watchdog (no-op when not armed)."""
    faulthandler.cancel_dump_traceback_later()


# ---------------------------------------------------------------------------
# TensorFlow part
# ---------------------------------------------------------------------------


def _configure_environment(environ: MutableMapping[str, str]) -> None:
    """Quiet TF's C++ logging unless the caller chose a level (before import)."""
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_TF_CPP_MIN_LOG_LEVEL)


def _make_strategy(tf: Any, collective_timeout_s: float) -> Any:
    """MultiWorkerMirroredStrategy with ring all-reduce and a collective timeout.

    Without TF_CONFIG (or with one worker) this is a local single-worker
    strategy, so the same code path runs in quick tests.
    """
    options = tf.distribute.experimental.CommunicationOptions(
        # 0 disables the timeout; None means "no option" to TF.
        timeout_seconds=collective_timeout_s or None,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _build_model(keras: Any, name: str) -> Any:
    """Build the named Keras model (weights seeded by keras.utils.set_random_seed)."""
    layers = keras.layers
    if name == "mlp":
        # 784*512+512 + 512*512+512 + 512*10+10 = 669,706 parameters.
        return keras.Sequential([
            keras.Input(shape=INPUT_SHAPES["mlp"]),
            layers.Dense(512, activation="relu"),
            layers.Dense(512, activation="relu"),
            layers.Dense(NUM_CLASSES),
        ], name="mlp")
    if name == "cnn":
        return keras.Sequential([
            keras.Input(shape=INPUT_SHAPES["cnn"]),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(NUM_CLASSES),
        ], name="cnn")
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def _synthetic_batch(tf: Any, model: str, batch_size: int, seed: int) -> tuple[Any, Any]:
    """One in-memory batch (inputs float32, integer labels), reused every step.

    Made once so no input-pipeline cost lands in the step timing.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, *INPUT_SHAPES[model]), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=(batch_size,), dtype=np.int32)
    return tf.constant(x), tf.constant(y)


def _make_train_step(tf: Any, strategy: Any, model: Any, optimizer: Any,
                     global_batch_size: int) -> Any:
    """Compiled step: forward, backward, gradient all-reduce, SGD update.

    Returns this worker's mean loss over its local batch.  It is deliberately
    NOT all-reduced: an extra scalar collective per step would add a latency-
    bound round trip to every measured step under network emulation.
    """
    def replica_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=logits)
            # Scaled by the GLOBAL batch: the optimizer sums gradients over
            # replicas, which then yields the mean gradient of the global batch.
            loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        # Keras 3's optimizer all-reduces (SUM) the gradients in replica context.
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        per_replica = strategy.run(replica_fn, args=(x, y))
        # One replica per worker on CPU: the first local result is ours.
        return strategy.experimental_local_results(per_replica)[0]

    return train_step


def _make_mean_reducer(tf: Any, strategy: Any) -> Any:
    """Compiled cross-worker mean of one float64 scalar (one collective)."""
    @tf.function
    def reduce_mean(value: Any) -> Any:
        per_replica = strategy.run(lambda v: tf.identity(v), args=(value,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return reduce_mean


def _cluster_position(strategy: Any) -> tuple[int, int]:
    """(task_index, num_workers) of this process as the strategy sees them."""
    resolver = strategy.cluster_resolver
    task_index = resolver.task_id if resolver is not None and resolver.task_id is not None else 0
    local_replicas = max(1, len(strategy.extended.worker_devices))
    num_workers = max(1, strategy.num_replicas_in_sync // local_replicas)
    return int(task_index), int(num_workers)


def _restore_default_sigterm() -> None:
    """Let SIGTERM terminate the process again.

    In multi-worker mode TF's preemption notifier catches SIGTERM (it only
    records it), so the controller's SIGTERM would be ignored.  We do no
    preemption checkpointing, so restore the default action.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Build strategy and model, train, and emit events on ``events``.

    The startup watchdog (--startup-timeout) covers everything up to the start
    event; after it, every collective has --collective-timeout.
    Returns the total number of steps run (warm-up + measured).
    """
    arm_startup_watchdog(args.startup_timeout)
    _configure_environment(os.environ)
    import tensorflow as tf
    import keras

    if args.threads:
        # Must happen before the strategy initialises the TF context.
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    # The strategy must be created before any other TF op runs.
    strategy = _make_strategy(tf, args.collective_timeout)
    _restore_default_sigterm()
    task_index, num_workers = _cluster_position(strategy)
    global_batch_size = args.batch_size * strategy.num_replicas_in_sync

    # Same seed on every worker: identical initial weights.
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = _build_model(keras, args.model)
        optimizer = keras.optimizers.SGD(learning_rate=args.learning_rate)
        # Create the optimizer's variables (iteration counter, slots) now,
        # under the scope, rather than lazily inside the traced step.
        optimizer.build(model.trainable_variables)
    # Different data per worker (as with a sharded data set), reproducible.
    x, y = _synthetic_batch(tf, args.model, args.batch_size,
                            seed=args.seed * 1_000_003 + task_index)
    train_step = _make_train_step(tf, strategy, model, optimizer, global_batch_size)

    event = start_event(task_index, num_workers, os.getpid(), time.monotonic(),
                        tf.__version__, args.model, model.count_params(),
                        args.batch_size)
    disarm_startup_watchdog()
    emit(event, events)

    def timed_step(step: int, phase: str) -> float:
        """Run one step, emit its event, return its duration in seconds."""
        t0 = time.monotonic()
        # .numpy() blocks until the whole step (incl. the update) finished.
        loss = float(train_step(x, y).numpy())
        t1 = time.monotonic()
        emit(step_event(step, phase, t0, t1, global_batch_size, loss), events)
        return t1 - t0

    warmup_durations = [timed_step(k, PHASE_WARMUP) for k in range(args.warmup)]

    if args.seconds is not None:
        # All workers must run the same number of steps or the collectives
        # deadlock, so derive it from a value that is identical everywhere.
        reduce_mean = _make_mean_reducer(tf, strategy)
        local_mean = tf.constant(warmup_mean(warmup_durations), dtype=tf.float64)
        cluster_mean = float(reduce_mean(local_mean).numpy())
        measured = measured_steps_from_mean(args.seconds, cluster_mean)
    else:
        measured = args.steps

    for k in range(args.warmup, args.warmup + measured):
        timed_step(k, PHASE_MEASURED)

    total = args.warmup + measured
    emit(done_event(time.monotonic(), total), events)
    return total


def _take_stdout_for_events() -> IO[str]:
    """Reserve the real stdout for events; send everything else to stderr.

    Duplicates fd 1 for the event stream, then points fd 1 and sys.stdout at
    stderr, so C++ or Python output from TF/Keras can never corrupt the JSON
    stream.
    """
    sys.stdout.flush()
    events = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return events


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 error, 2 usage)."""
    args = parse_args(argv)
    events = _take_stdout_for_events()
    try:
        run(args, events)
    except Exception as exc:  # report any failure to the controller, then fail
        disarm_startup_watchdog()
        try:
            emit(error_event(exc), events)
        finally:
            sys.stderr.flush()
            # A worker whose peer died can block in gRPC/coordination teardown
            # during normal interpreter exit; the event is flushed, so leave now.
            os._exit(1)
    events.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
