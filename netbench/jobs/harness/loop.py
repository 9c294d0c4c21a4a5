"""The synchronous training loop (allreduce, allreduce-accum, single), and the pieces
every strategy's loop shares: this worker's data, and how a --seconds window becomes a
step count.

One step is one optimizer update, run as two compiled functions so that their times can
be told apart: ``compute`` (forward and backward on a local batch, gradients added to
per-worker accumulators; no network) runs k times (k = accum steps, else 1), then
``sync`` (the Keras 3 optimizer all-reduces (sums) the accumulated gradients in replica
context, applies them, and the accumulators are zeroed). The step event carries both
times; ``comm`` is the all-reduce plus the (local) update, including any wait for a
slower peer. (Keras 3 ``model.fit`` fails under MWMS on TF 2.21, hence the custom loop.)

TensorFlow is imported only inside functions.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import IO, Any, Sequence

from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets
from netbench.jobs.harness import strategy as strategies
from netbench.jobs.harness.emit import arm_startup_watchdog, disarm_startup_watchdog, emit
from netbench.jobs.harness.models import DEFAULT_CLASSES, DEFAULT_INPUT_SHAPES, check_input


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


def make_sync_steps(tf: Any, strategy: Any, model: Any, optimizer: Any,
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


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Synchronous strategies: build strategy and model, train, and emit events on ``events``.

    The startup watchdog (--startup-timeout) covers everything up to the start
    event; after it, every collective has --collective-timeout.
    Returns the total number of steps run (warm-up + measured).
    """
    arm_startup_watchdog(args.startup_timeout)
    tf, keras = strategies.import_tf(args)
    from netbench.jobs.harness.models import build_model, model_size

    # The strategy must be created before any other TF op runs.
    strategy = strategies.make_strategy(tf, args.strategy, args.collective_timeout)
    strategies.restore_default_sigterm()
    task_index, num_workers = (0, 1) if args.strategy == "single" else strategies.cluster_position(strategy)
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
    compute, sync = make_sync_steps(tf, strategy, model, optimizer, global_batch_size, accum_steps)
    params, model_bytes = model_size(model)

    event = ev.start_event(task_index, num_workers, os.getpid(), time.monotonic(),
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
        emit(ev.step_event(step, phase, t0, t2, images, loss / accum_steps,
                        compute=t1 - t0, comm=t2 - t1), events)
        return t2 - t0

    warmup_durations = [timed_step(k, ev.PHASE_WARMUP) for k in range(args.warmup)]

    if args.seconds is not None:
        # All workers must run the same number of steps or the collectives
        # deadlock, so derive it from a value that is identical everywhere.
        reduce_mean = strategies.make_mean_reducer(tf, strategy)
        local_mean = tf.constant(warmup_mean(warmup_durations), dtype=tf.float64)
        cluster_mean = float(reduce_mean(local_mean).numpy())
        measured = measured_steps_from_mean(args.seconds, cluster_mean)
    else:
        measured = args.steps

    for k in range(args.warmup, args.warmup + measured):
        timed_step(k, ev.PHASE_MEASURED)

    total = args.warmup + measured
    emit(ev.Done(time=time.monotonic(), steps=total), events)
    return total
