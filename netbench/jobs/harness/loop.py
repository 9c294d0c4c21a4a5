"""The synchronous training loop (allreduce, allreduce-accum, single), and the pieces
every strategy's loop shares: this worker's data, and how a --seconds window becomes a
step count.

One step is one optimizer update (k local batches with allreduce-accum, else 1). With
``--step fused`` (the default) each measured step is ONE compiled function, as a user's
loop runs it (harness.steps.make_fused_step), so the step time is what users get; its
event carries no computation/communication split. The split is measured afterwards,
outside the measured window: ``--calibration-steps`` split steps (compute k times, then
sync, timed apart; harness.steps.make_split_steps) after the last measured step, each
sent as a ``calibration`` step (first one untimed and unsent: it traces the functions).
``comm`` is the all-reduce plus the (local) update, including any wait for a slower peer.
With ``--step split`` every step is a split step (netbench before the fused step) and there
is no calibration.

TensorFlow is imported only inside functions.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import IO, Any, Callable, Sequence

from netbench import stats
from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets
from netbench.jobs.harness import evaluate
from netbench.jobs.harness import strategy as strategies
from netbench.jobs.harness.emit import arm_startup_watchdog, disarm_startup_watchdog, emit
from netbench.jobs.harness.models import DEFAULT_CLASSES, DEFAULT_INPUT_SHAPES, check_input
from netbench.jobs.harness.step_delay import StepDelay
from netbench.jobs.harness.steps import make_fused_step, make_split_steps

DEFAULT_CALIBRATION_STEPS = 5


def resolve_shape(args: argparse.Namespace) -> tuple[int, ...]:
    """The input shape for synthetic data: --input-shape, or the model's default."""
    return args.input_shape or DEFAULT_INPUT_SHAPES[args.model]


def calibration_steps(args: argparse.Namespace) -> int:
    """How many split steps follow the measured window: --calibration-steps with the fused
    step, none with --step split (every step is split) or --until-stopped (a launch's
    processes are stopped by the controller, never reaching them)."""
    if getattr(args, "step", ev.STEP_FUSED) != ev.STEP_FUSED or getattr(args, "until_stopped", False):
        return 0
    return getattr(args, "calibration_steps", DEFAULT_CALIBRATION_STEPS)


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


def extend_for_precision(args: argparse.Namespace, durations: list[float], started: float,
                         agree: Callable[[int], float], steps: Callable[[int], list[float]]) -> int:
    """With --precision, go on stepping after the minimum window (`durations`, measured since
    `started` on this process's monotonic clock) until the 95 % batch-means interval of the mean
    step time is within the precision, or --max-seconds have passed; returns the steps added.

    Every worker must run the same steps, so at each check each one's own need
    (stats.steps_to_precision) goes through `agree` (a cross-worker mean; the identity with one
    stepping process) and all run ceil(that) more: a worker that still needs steps keeps every
    worker going. Checks are few (each asks for at least a tenth more steps) and lie between
    two timed steps, so no measured step includes one."""
    precision = getattr(args, "precision", None)
    if not precision:
        return 0
    added = 0
    while True:
        need = stats.steps_to_precision(durations, precision, time.monotonic() - started, args.max_seconds)
        more = math.ceil(agree(need) - 1e-9)
        if more <= 0:
            return added
        durations += steps(more)
        added += more


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
    with strategy.scope(), strategies.initial_values_made_locally(strategy):
        model = build_model(keras, args.model, data.input_shape, classes)
        optimizer = keras.optimizers.SGD(learning_rate=args.learning_rate)
        # Create the optimizer's variables (iteration counter, slots) now,
        # under the scope, rather than lazily inside the traced step.
        optimizer.build(model.trainable_variables)
    # the chief's initial values to every worker in one collective, not one per variable
    strategies.broadcast_from_chief(tf, strategy, [*model.variables, *optimizer.variables])
    kind = getattr(args, "step", ev.STEP_FUSED)
    until_stopped = getattr(args, "until_stopped", False)
    calibration = calibration_steps(args)
    # Made on every worker at the same point (the accumulators' creation is collective: one
    # broadcast per variable, round trips at start-up), and only when a split step will run.
    compute = sync = None
    if kind == ev.STEP_SPLIT or calibration:
        compute, sync = make_split_steps(tf, strategy, model, optimizer, global_batch_size, accum_steps)
    fused = make_fused_step(tf, strategy, model, optimizer, global_batch_size, accum_steps)
    stacked = (tf.stack([x for x, _ in batches]), tf.stack([y for _, y in batches])) if accum_steps > 1 else None
    params, model_bytes = model_size(model)
    evaluator = evaluate.for_model(tf, args, model)  # None unless an accuracy run with held-out data
    clock = evaluate.TrainClock()

    event = ev.start_event(task_index, num_workers, os.getpid(), time.monotonic(),
                           tf.__version__, args.model, params, args.batch_size,
                           strategy=args.strategy, role="worker", accum_steps=accum_steps,
                           model_bytes=model_bytes, input_shape=data.input_shape,
                           classes=classes, data=args.data, step=kind)
    disarm_startup_watchdog()
    emit(event, events)
    images = global_batch_size * accum_steps
    micro = 0
    delay = StepDelay()

    def split_update() -> tuple[float, float, float, float]:
        """One split update: (start, end of compute, end, mean loss)."""
        nonlocal micro
        t0 = time.monotonic()
        loss = 0.0
        for _ in range(accum_steps):
            x, y = batches[micro % len(batches)]
            micro += 1
            # .numpy() blocks until the computation finished.
            loss += float(compute(x, y).numpy())
        delay.pause()  # the node's step delay: compute time
        t1 = time.monotonic()
        sync().numpy()  # blocks until the all-reduce and the update finished
        return t0, t1, time.monotonic(), loss / accum_steps

    def fused_update() -> tuple[float, float, float, float]:
        """One fused update: (start, end, loss, when its gradients were ready), all monotonic."""
        nonlocal micro
        t0 = time.monotonic()
        delay.pause()  # the node's step delay: compute time
        called, called_wall = time.monotonic(), time.time()
        if stacked is None:
            x, y = batches[micro % len(batches)]
            loss, ready = fused(x, y)
        else:
            loss, ready = fused(stacked[0], stacked[1], tf.constant(micro % len(batches), tf.int64))
        loss = float(loss.numpy())  # blocks until the update finished
        t1 = time.monotonic()
        micro += accum_steps
        # the step's own clock (tf.timestamp: wall seconds) read when its gradients were ready
        return t0, t1, loss, called + (float(ready.numpy()) - called_wall)

    def timed_step(step: int, phase: str) -> float:
        """Run one update, emit its event (and an evaluation when due), return its duration."""
        duration = _timed_step(step, phase)
        clock.add(duration)
        if evaluator is not None and phase != ev.PHASE_CALIBRATION and not until_stopped \
                and evaluate.due(step + 1, args.warmup + args.steps if args.steps else -1, getattr(args, "eval_every", 0)):
            emit(evaluator(step + 1, clock.seconds), events)
        return duration

    def _timed_step(step: int, phase: str) -> float:
        return timed_update(step, phase, kind, split_update, fused_update, images, events)

    warmup_durations = [timed_step(k, ev.PHASE_WARMUP) for k in range(args.warmup)]

    if until_stopped:
        # continuous mode: measured steps until the controller stops this process (SIGTERM);
        # it slices them into points; no calibration, no done event
        k = args.warmup
        while True:
            timed_step(k, ev.PHASE_MEASURED)
            k += 1

    if args.seconds is not None:
        # All workers must run the same number of steps or the collectives
        # deadlock, so derive it from a value that is identical everywhere.
        reduce_mean = strategies.make_mean_reducer(tf, strategy)
        local_mean = tf.constant(warmup_mean(warmup_durations), dtype=tf.float64)
        cluster_mean = float(reduce_mean(local_mean).numpy())
        measured = measured_steps_from_mean(args.seconds, cluster_mean)
    else:
        measured = args.steps

    started = time.monotonic()
    durations = [timed_step(k, ev.PHASE_MEASURED) for k in range(args.warmup, args.warmup + measured)]
    if getattr(args, "precision", None):
        reduce_mean = strategies.make_mean_reducer(tf, strategy)

        def agree(need: int) -> float:
            return float(reduce_mean(tf.constant(float(need), dtype=tf.float64)).numpy())

        def more_steps(count: int) -> list[float]:
            first = args.warmup + len(durations)
            return [timed_step(k, ev.PHASE_MEASURED) for k in range(first, first + count)]

        measured += extend_for_precision(args, durations, started, agree, more_steps)

    total = args.warmup + measured
    if calibration:
        split_update()  # traces and optimises the split functions: not timed, not sent
        for k in range(total, total + calibration):
            timed_step(k, ev.PHASE_CALIBRATION)
        total += calibration
    if num_workers > 1:
        goodbye = strategies.make_mean_reducer(tf, strategy)
        strategies.farewell(lambda: goodbye(tf.constant(0.0, dtype=tf.float64)).numpy())
    emit(ev.Done(time=time.monotonic(), steps=total), events)
    return total


def timed_update(step: int, phase: str, kind: str, split_update: Any, fused_update: Any, images: int,
                 events: IO[str]) -> float:
    """Run one update and emit its step event; returns its duration in seconds. A split step
    (``--step split``, and every calibration step) reports compute and communication apart;
    a fused one is the update as users run it. Every framework's loop steps through this."""
    if kind == ev.STEP_SPLIT or phase == ev.PHASE_CALIBRATION:
        t0, t1, t2, loss = split_update()
        emit(ev.step_event(step, phase, t0, t2, images, loss, compute=t1 - t0, comm=t2 - t1), events)
        return t2 - t0
    t0, t2, loss, *ready = fused_update()  # a framework that can tell when its gradients were ready says so
    computed = ready[0] - t0 if ready and t0 <= ready[0] <= t2 else None
    emit(ev.step_event(step, phase, t0, t2, images, loss, computed=computed), events)
    return t2 - t0
