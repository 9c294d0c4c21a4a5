"""Per-node training harness: one process per emulated node.

The controller starts this module (``python -m netbench.jobs.worker``) inside a
network namespace with ``TF_CONFIG`` in its environment.  Like pyperf's worker
role, the worker only trains, times and reports: it writes one JSON event per
line on stdout and leaves planning and statistics to the controller.  All other
output (TensorFlow / Keras logs, stray prints) goes to stderr.

Strategies (``--strategy``):

* ``allreduce``: ``tf.distribute.MultiWorkerMirroredStrategy`` (ring all-reduce
  over gRPC), one all-reduce of the gradients per step;
* ``allreduce-accum``: the same, but each worker accumulates the gradients of
  ``--accum-steps`` local batches before one all-reduce and update;
* ``single``: TF's default strategy in one process: no cluster, no network;
* ``ps``: ``ParameterServerStrategy``; see ``netbench.jobs.harness.ps``.

The synchronous strategies share one custom loop (Keras 3 ``model.fit`` fails
under MWMS on TF 2.21).  One step is one optimizer update, run as two compiled
functions so that their times can be told apart: ``compute`` (forward and
backward on a local batch, gradients added to per-worker accumulators; no
network) runs k times (k = accum steps, else 1), then ``sync`` (the Keras 3
optimizer all-reduces (sums) the accumulated gradients in replica context,
applies them, and the accumulators are zeroed).  The step event carries both
times; ``comm`` is the all-reduce plus the (local) update, including any wait
for a slower peer.

Events (key names are a contract with the controller; times are
``time.monotonic()`` seconds, which is CLOCK_MONOTONIC and therefore comparable
between processes on one Linux host)::

    {"event": "start", "task_index", "num_workers", "pid", "time",
     "tf_version", "model", "params", "batch_size", "global_batch_size",
     "strategy", "role", "accum_steps", "model_bytes", "input_shape",
     "classes", "data"}
    {"event": "step", "step", "phase": "warmup"|"measured", "start", "end",
     "duration", "images", "loss", "compute", "comm"}
    {"event": "done", "time", "steps"}
    {"event": "error", "type", "message"}

``images`` is what the whole cluster trained on in the step (global batch x
accum steps).  The ps coordinator adds ``executor`` (the worker that ran the
step) to its step events; ps servers send only a start event.

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

from netbench.jobs.harness import data as datasets
from netbench.jobs import resources
from netbench.model.job import DEFAULT_ACCUM_STEPS, STRATEGIES
from netbench.jobs.harness.models import DEFAULT_CLASSES, DEFAULT_INPUT_SHAPES, MODELS, check_input, parse_input_shape

PHASE_WARMUP = "warmup"
PHASE_MEASURED = "measured"

DEFAULT_STRATEGY = "allreduce"
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


def _shape(text: str) -> tuple[int, ...]:
    """argparse type: an input shape such as 32x32x3."""
    try:
        return parse_input_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at_least_two(text: str) -> int:
    """argparse type: an integer >= 2 (a class count)."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the worker's command-line parser."""
    parser = argparse.ArgumentParser(
        prog="python -m netbench.jobs.worker",
        description=(
            "Train a model under one distribution strategy and report "
            "per-step timings as JSON lines on stdout."
        ),
    )
    parser.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY,
                        help="allreduce: all-reduce every step; allreduce-accum: every "
                             "--accum-steps batches; ps: parameter servers (role from "
                             "TF_CONFIG); single: one process (default: %(default)s)")
    parser.add_argument("--accum-steps", type=_positive_int, default=DEFAULT_ACCUM_STEPS,
                        help="local batches per all-reduce with allreduce-accum "
                             "(default: %(default)s)")
    parser.add_argument("--model", choices=MODELS, default=DEFAULT_MODEL,
                        help="mlp: 784-512-512-10 (~670k params); cnn: small conv net; "
                             "resnet18; keras.applications mobilenetv2, resnet50, "
                             "efficientnetb0, vgg16 with random weights (default: %(default)s)")
    parser.add_argument("--input-shape", type=_shape, default=None,
                        help="per-example input shape, e.g. 32x32x3 (default: the model's, "
                             "or the data's)")
    parser.add_argument("--classes", type=_at_least_two, default=None,
                        help=f"output classes (default: {DEFAULT_CLASSES}, or the data's)")
    parser.add_argument("--data", default=datasets.SYNTHETIC,
                        help="'synthetic' (in memory), an .npz with x_train/y_train, or a "
                             "folder of class folders of images (default: %(default)s)")
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
    parser.add_argument("--sample-resources", type=_non_negative_float, default=0.0, metavar="SECONDS",
                        help="emit CPU, memory and network byte samples of this process every "
                             "SECONDS, 0 = off (default: %(default)s)")
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
    try:
        datasets.check_source(args.data)
    except datasets.DataError as exc:
        parser.error(f"--data: {exc}")
    if args.data == datasets.SYNTHETIC:
        try:
            check_input(args.model, resolve_shape(args), args.classes or DEFAULT_CLASSES)
        except ValueError as exc:
            parser.error(f"--input-shape: {exc}")
    return args


def resolve_shape(args: argparse.Namespace) -> tuple[int, ...]:
    """The input shape for synthetic data: --input-shape, or the model's default."""
    return args.input_shape or DEFAULT_INPUT_SHAPES[args.model]


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
                batch_size: int, *, strategy: str = DEFAULT_STRATEGY, role: str = "worker",
                accum_steps: int = 1, model_bytes: int = 0,
                input_shape: Sequence[int] = (), classes: int = DEFAULT_CLASSES,
                data: str = datasets.SYNTHETIC) -> dict[str, Any]:
    """Event sent once the strategy and model exist, before the first step.

    ``time_s`` is time.monotonic() seconds, ``batch_size`` the per-worker batch,
    ``accum_steps`` the local batches per update, ``model_bytes`` the size of all
    weights in bytes.  ps servers send it too, with ``params`` 0.
    """
    return {
        "strategy": str(strategy),
        "role": str(role),
        "accum_steps": int(accum_steps),
        "model_bytes": int(model_bytes),
        "input_shape": [int(d) for d in input_shape],
        "classes": int(classes),
        "data": str(data),
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
               loss: float, compute: float | None = None, comm: float | None = None,
               executor: int | None = None) -> dict[str, Any]:
    """Event for one training step.

    ``step`` counts from 0 over warm-up + measured steps; ``start``/``end`` are
    time.monotonic() seconds; ``images`` is the number of examples the step
    trained on (cluster-wide).  ``compute`` and ``comm`` split the step, in
    seconds, into local computation and communication (null when unknown);
    ``executor`` is the worker that ran it (ps only).
    """
    if phase not in (PHASE_WARMUP, PHASE_MEASURED):
        raise ValueError(f"phase must be {PHASE_WARMUP!r} or {PHASE_MEASURED!r}, got {phase!r}")
    extra: dict[str, Any] = {
        "compute": None if compute is None else float(compute),
        "comm": None if comm is None else float(comm),
    }
    if executor is not None:
        extra["executor"] = int(executor)
    return {
        **extra,
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


_EMIT_LOCK = threading.Lock()
_SAMPLER: resources.Sampler | None = None  # set by main() under --sample-resources


def emit(event: Mapping[str, Any], stream: IO[str]) -> None:
    """Write one event as a JSON line and flush, so the controller sees it now. The
    resource sampler (if any) sends its last sample before the done event."""
    if event.get("event") == "done" and _SAMPLER is not None:
        _SAMPLER.stop()
    line = json.dumps(event, allow_nan=False) + "\n"
    with _EMIT_LOCK:  # the sampler's thread emits too
        stream.write(line)
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


def _make_strategy(tf: Any, strategy: str, collective_timeout_s: float) -> Any:
    """The tf.distribute strategy of a synchronous job.

    single: TF's default strategy (no gRPC server, no cluster).  allreduce and
    allreduce-accum: MultiWorkerMirroredStrategy with ring all-reduce and a
    collective timeout; without TF_CONFIG it is a local single-worker strategy,
    so the same code path runs in quick tests.
    """
    if strategy == "single":
        return tf.distribute.get_strategy()
    options = tf.distribute.experimental.CommunicationOptions(
        # 0 disables the timeout; None means "no option" to TF.
        timeout_seconds=collective_timeout_s or None,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def load_training_data(tf: Any, args: argparse.Namespace, task_index: int,
                       num_workers: int) -> datasets.Dataset:
    """This worker's examples: one synthetic batch, or its shard of the local dataset.

    Raises datasets.DataError when the data does not fit --input-shape / --classes.
    """
    if args.data == datasets.SYNTHETIC:
        # Different data per worker (as with a sharded data set), reproducible.
        return datasets.synthetic(resolve_shape(args), args.classes or DEFAULT_CLASSES,
                                  args.batch_size, seed=args.seed * 1_000_003 + task_index)
    loaded = datasets.load(tf, args.data, args.input_shape)
    check_data_fits(loaded, args)
    return datasets.shard(loaded, task_index, num_workers)


def check_data_fits(loaded: datasets.Dataset, args: argparse.Namespace) -> None:
    """Raise datasets.DataError when the data disagrees with --input-shape, --classes or the model."""
    if args.input_shape and loaded.input_shape != tuple(args.input_shape):
        raise datasets.DataError(f"{args.data}: examples have shape {loaded.input_shape}, "
                                 f"--input-shape asks for {tuple(args.input_shape)}")
    if args.classes and loaded.classes > args.classes:
        raise datasets.DataError(f"{args.data}: labels go up to {loaded.classes - 1}, "
                                 f"more than --classes {args.classes} allows")
    try:
        check_input(args.model, loaded.input_shape, max(loaded.classes, 2))
    except ValueError as exc:
        raise datasets.DataError(f"{args.data}: {exc}") from None


def _make_sync_steps(tf: Any, strategy: Any, model: Any, optimizer: Any,
                     global_batch_size: int, accum_steps: int) -> tuple[Any, Any]:
    """Compiled (compute, sync) functions of one synchronous optimizer update.

    compute(x, y): forward and backward on the local batch; gradients added to
    per-worker accumulators (ON_READ variables: a replica-local copy each, so
    no network); returns this worker's mean loss.  The loss is deliberately NOT
    all-reduced: an extra scalar collective per step would add a latency-bound
    round trip to every measured step under network emulation.

    sync(): the optimizer all-reduces (sums) the accumulated gradients across
    workers, applies them, and the accumulators are zeroed; returns the
    optimizer's iteration count.  The loss is scaled by the global batch times
    accum_steps, so the summed gradient is the mean over every image used.
    """
    with strategy.scope():
        accumulators = [
            tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM)
            for v in model.trainable_variables]
    scale = global_batch_size * accum_steps

    def compute_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=scale)
        grads = tape.gradient(loss, model.trainable_variables)
        for accumulator, grad in zip(accumulators, grads):
            accumulator.assign_add(grad)
        return tf.reduce_mean(per_example)

    def sync_fn() -> Any:
        grads = [tf.identity(accumulator) for accumulator in accumulators]
        # Keras 3's optimizer all-reduces (SUM) the gradients in replica context.
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        for accumulator in accumulators:
            accumulator.assign(tf.zeros_like(accumulator))
        return tf.identity(optimizer.iterations)

    @tf.function
    def compute(x: Any, y: Any) -> Any:
        per_replica = strategy.run(compute_fn, args=(x, y))
        # One replica per worker on CPU: the first local result is ours.
        return strategy.experimental_local_results(per_replica)[0]

    @tf.function
    def sync() -> Any:
        return strategy.experimental_local_results(strategy.run(sync_fn))[0]

    return compute, sync


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


def restore_default_sigterm() -> None:
    """Let SIGTERM terminate the process again.

    In multi-worker mode TF's preemption notifier catches SIGTERM (it only
    records it), so the controller's SIGTERM would be ignored.  We do no
    preemption checkpointing, so restore the default action.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def import_tf(args: argparse.Namespace) -> tuple[Any, Any]:
    """Import TensorFlow and Keras, with the thread settings of --threads."""
    _configure_environment(os.environ)
    import tensorflow as tf
    import keras

    if args.threads:
        # Must happen before the strategy initialises the TF context.
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    return tf, keras


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Build strategy and model, train, and emit events on ``events``.

    The startup watchdog (--startup-timeout) covers everything up to the start
    event; after it, every collective has --collective-timeout.
    Returns the total number of steps run (warm-up + measured).
    """
    if args.strategy == "ps":
        from netbench.jobs.harness import ps

        return ps.run(args, events)
    arm_startup_watchdog(args.startup_timeout)
    tf, keras = import_tf(args)
    from netbench.jobs.harness.models import build_model, model_size

    # The strategy must be created before any other TF op runs.
    strategy = _make_strategy(tf, args.strategy, args.collective_timeout)
    restore_default_sigterm()
    task_index, num_workers = (0, 1) if args.strategy == "single" else _cluster_position(strategy)
    global_batch_size = args.batch_size * strategy.num_replicas_in_sync
    accum_steps = args.accum_steps if args.strategy == "allreduce-accum" else 1

    data = load_training_data(tf, args, task_index, num_workers)
    classes = args.classes or max(data.classes, 2)
    batches = [(tf.constant(x), tf.constant(y))
               for x, y in datasets.batches(data, args.batch_size)]

    # Same seed on every worker: identical initial weights.
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = build_model(keras, args.model, data.input_shape, classes)
        optimizer = keras.optimizers.SGD(learning_rate=args.learning_rate)
        # Create the optimizer's variables (iteration counter, slots) now,
        # under the scope, rather than lazily inside the traced step.
        optimizer.build(model.trainable_variables)
    compute, sync = _make_sync_steps(tf, strategy, model, optimizer, global_batch_size, accum_steps)
    params, model_bytes = model_size(model)

    event = start_event(task_index, num_workers, os.getpid(), time.monotonic(),
                        tf.__version__, args.model, params, args.batch_size,
                        strategy=args.strategy, role="worker", accum_steps=accum_steps,
                        model_bytes=model_bytes, input_shape=data.input_shape,
                        classes=classes, data=args.data)
    disarm_startup_watchdog()
    emit(event, events)
    images = global_batch_size * accum_steps
    micro = 0

    def timed_step(step: int, phase: str) -> float:
        """Run one update, emit its event, return its duration in seconds."""
        nonlocal micro
        t0 = time.monotonic()
        loss = 0.0
        for _ in range(accum_steps):
            x, y = batches[micro % len(batches)]
            micro += 1
            # .numpy() blocks until the computation finished.
            loss += float(compute(x, y).numpy())
        t1 = time.monotonic()
        sync().numpy()  # blocks until the all-reduce and the update finished
        t2 = time.monotonic()
        emit(step_event(step, phase, t0, t2, images, loss / accum_steps,
                        compute=t1 - t0, comm=t2 - t1), events)
        return t2 - t0

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
    global _SAMPLER
    args = parse_args(argv)
    events = _take_stdout_for_events()
    if args.sample_resources > 0:
        _SAMPLER = resources.Sampler(args.sample_resources, lambda e: emit(e, events)).start()
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
