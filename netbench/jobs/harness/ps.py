"""The ps strategy: asynchronous parameter-server training with a coordinator.

Every process runs ``python -m netbench.jobs.worker --strategy ps``; its role comes
from TF_CONFIG. Workers and parameter servers (task types "worker" and "ps") start a
``tf.distribute.Server``, send a start event and serve until they are stopped. The
coordinator (task type "chief") creates a ``ParameterServerStrategy`` (variables on the
parameter servers) and a ``ClusterCoordinator``, which dispatches each training step to
whichever worker is free. Workers do not wait for each other: this is TF 2's
asynchronous parameter-server training.

Only the coordinator streams step events, one per completed step, in the order the
steps were scheduled. Its view of time: a step's ``start`` is the previous event's
``end`` (or the start of the phase) and its ``end`` is when the coordinator had the
step's result, so ``duration`` is the time between completions and ``images / mean
duration`` is the cluster's throughput (completed images over time). Inside each step the
worker stamps the clock (tf.timestamp, the host's wall clock, shared by every namespace)
after reading the variables from the parameter servers, after computing the gradients
and after pushing the update; ``compute`` is the gradient computation and ``comm`` the
variable reads plus the update, both on the worker that ran the step (``executor``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import time
from typing import IO, Any

from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets
from netbench.jobs.harness import loop
from netbench.jobs.harness.emit import arm_startup_watchdog, disarm_startup_watchdog, emit
from netbench.jobs.harness.models import DEFAULT_CLASSES
from netbench.jobs.harness.strategy import import_tf, restore_default_sigterm

# Steps dispatched but not yet fetched, per worker: enough to keep each worker busy
# while the coordinator waits on the oldest one.
IN_FLIGHT_PER_WORKER = 2


UNTIL_STOPPED_CHUNK = 64  # steps scheduled at a time with --until-stopped


def task_of(tf_config: str) -> tuple[str, int, dict[str, list[str]]]:
    """(task type, index, cluster) from a TF_CONFIG JSON string."""
    try:
        config = json.loads(tf_config)
        task = config["task"]
        return str(task["type"]), int(task["index"]), dict(config["cluster"])
    except (ValueError, KeyError, TypeError):
        raise ValueError("strategy ps needs TF_CONFIG with a cluster and a task") from None


def wait_for_ports(addresses: list[str], timeout_s: float) -> None:
    """Block until a TCP connection to every "host:port" succeeds (servers are up)."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    for address in addresses:
        host, port = address.rsplit(":", 1)
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    break
            except OSError:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"no server at {address} after {timeout_s:g}s") from None
                time.sleep(0.2)


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Run this process's ps role; returns the steps run (0 for a server)."""
    task_type, index, cluster = task_of(os.environ.get("TF_CONFIG", ""))
    if task_type == "chief":
        return _coordinate(args, events, cluster)
    if task_type in ("worker", "ps"):
        _serve(args, events, task_type, index, cluster)
        return 0
    raise ValueError(f"strategy ps has no role for TF_CONFIG task type {task_type!r}")


def _serve(args: argparse.Namespace, events: IO[str], task_type: str, index: int,
           cluster: dict[str, list[str]]) -> None:
    tf, _ = import_tf(args)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=task_type,
                                  task_index=index, protocol="grpc", start=True)
    emit(ev.start_event(index, len(cluster.get("worker", [])), os.getpid(), time.monotonic(),
                        tf.__version__, args.model, 0, args.batch_size, strategy="ps",
                        role=task_type, input_shape=(), data=args.data), events)
    server.join()  # until the controller stops this process


def _coordinate(args: argparse.Namespace, events: IO[str], cluster: dict[str, list[str]]) -> int:
    from netbench.jobs.harness.models import build_model, model_size

    arm_startup_watchdog(args.startup_timeout)
    tf, keras = import_tf(args)
    # The servers were started beside us; connect only once they listen.
    wait_for_ports(cluster.get("worker", []) + cluster.get("ps", []), args.startup_timeout)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    restore_default_sigterm()
    num_workers = len(cluster["worker"])

    if args.data == datasets.SYNTHETIC:
        data = None
        shape, classes = loop.resolve_shape(args), args.classes or DEFAULT_CLASSES
    else:
        data = datasets.load(tf, args.data, args.input_shape)
        loop.check_data_fits(data, args)
        shape, classes = data.input_shape, args.classes or max(data.classes, 2)

    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = build_model(keras, args.model, shape, classes)
        optimizer = keras.optimizers.SGD(learning_rate=args.learning_rate)
        optimizer.build(model.trainable_variables)
    params, model_bytes = model_size(model)
    iterator = iter(coordinator.create_per_worker_dataset(
        _dataset_fn(tf, strategy, args, data, shape, classes)))
    train_step = _make_step(tf, strategy, model, optimizer, args.batch_size)

    emit(ev.start_event(0, num_workers, os.getpid(), time.monotonic(), tf.__version__, args.model,
                        params, args.batch_size, strategy="ps", role="coordinator",
                        model_bytes=model_bytes, input_shape=shape, classes=classes,
                        data=args.data), events)
    disarm_startup_watchdog()
    # tf.timestamp() on the workers is wall-clock time; events carry monotonic time.
    wall_to_mono = time.monotonic() - time.time()
    window = IN_FLIGHT_PER_WORKER * num_workers

    def run_phase(first: int, count: int, phase: str) -> list[float]:
        """Schedule `count` steps, keep `window` in flight, emit each in order."""
        pending: collections.deque = collections.deque()
        durations = []
        previous_end = time.monotonic()
        step = first
        while step < first + count or pending:
            while step < first + count and len(pending) < window:
                pending.append((step, coordinator.schedule(train_step, args=(iterator,))))
                step += 1
            number, remote = pending.popleft()
            loss, executor, stamps = remote.fetch()
            end = time.monotonic()
            t0, t1, t2, t3 = (float(t) + wall_to_mono for t in stamps)
            emit(ev.step_event(number, phase, previous_end, end, args.batch_size, float(loss),
                               compute=t2 - t1, comm=(t1 - t0) + (t3 - t2),
                               executor=int(executor)), events)
            durations.append(end - previous_end)
            previous_end = end
        return durations

    warmup = run_phase(0, args.warmup, ev.PHASE_WARMUP) if args.warmup else []
    if getattr(args, "until_stopped", False):  # until the controller stops this process
        first = args.warmup
        while True:
            run_phase(first, UNTIL_STOPPED_CHUNK, ev.PHASE_MEASURED)
            first += UNTIL_STOPPED_CHUNK
    if args.seconds is not None:
        measured = loop.measured_steps_from_mean(args.seconds, loop.warmup_mean(warmup))
    else:
        measured = args.steps
    started = time.monotonic()
    durations = run_phase(args.warmup, measured, ev.PHASE_MEASURED)

    def more_steps(count: int) -> list[float]:  # the coordinator alone steps: nothing to agree on
        return run_phase(args.warmup + len(durations), count, ev.PHASE_MEASURED)

    measured += loop.extend_for_precision(args, durations, started, float, more_steps)
    total = args.warmup + measured
    emit(ev.Done(time=time.monotonic(), steps=total), events)
    return total


def _dataset_fn(tf: Any, strategy: Any, args: argparse.Namespace, data: datasets.Dataset | None,
                shape: tuple[int, ...], classes: int) -> Any:
    """A per-worker dataset function: the dataset is built on each worker.

    Synthetic data is one batch drawn once on the worker and cached. A local dataset is
    embedded whole and shuffled on each worker with its own (unseeded) order, so workers
    see the examples in different orders, as asynchronous workers would.
    """
    batch = args.batch_size

    def synthetic(_: Any) -> Any:
        seed = tf.stack([tf.constant(args.seed, tf.int64), tf.random.uniform((), maxval=2**31, dtype=tf.int64)])
        x = tf.random.stateless_normal((batch, *shape), seed=seed)
        y = tf.random.stateless_uniform((batch,), seed=seed + 1, maxval=classes, dtype=tf.int32)
        return x, y

    def per_worker(_: Any) -> Any:
        if data is None:
            return tf.data.Dataset.range(1).map(synthetic).cache().repeat()
        examples = tf.data.Dataset.from_tensor_slices((data.x, data.y))
        return examples.repeat().shuffle(min(len(data.x), 10_000)).batch(batch, drop_remainder=True)

    return lambda: strategy.distribute_datasets_from_function(per_worker)


def _make_step(tf: Any, strategy: Any, model: Any, optimizer: Any, batch_size: int) -> Any:
    """The step the coordinator schedules: returns (loss, worker index, 4 time stamps).

    The variables are first copied from the parameter servers (t0 -> t1), the gradients
    computed on the copies with Keras 3's stateless_call (t1 -> t2), then applied to the
    variables on the parameter servers (t2 -> t3).
    """
    trainable = model.trainable_variables
    non_trainable = model.non_trainable_variables

    def replica_fn(x: Any, y: Any) -> Any:
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            local = [tf.identity(v) for v in trainable]
            local_state = [tf.identity(v) for v in non_trainable]
        with tf.control_dependencies(local + local_state):
            t1 = tf.timestamp()
        with tf.control_dependencies([t1]):
            with tf.GradientTape() as tape:
                tape.watch(local)
                logits, new_state = model.stateless_call(local, local_state, x, training=True)
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                loss = tf.reduce_mean(per_example)
            grads = tape.gradient(loss, local)
        with tf.control_dependencies(grads + list(new_state)):
            t2 = tf.timestamp()
        with tf.control_dependencies([t2]):
            optimizer.apply_gradients(zip(grads, trainable))
            for variable, value in zip(non_trainable, new_state):
                variable.assign(value)
        with tf.control_dependencies([tf.identity(optimizer.iterations.value)]):
            t3 = tf.timestamp()
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return loss, worker, tf.stack([t0, t1, t2, t3])

    @tf.function
    def train_step(iterator: Any) -> Any:
        x, y = next(iterator)
        return strategy.run(replica_fn, args=(x, y))

    return train_step
