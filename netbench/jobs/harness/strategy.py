"""Distribution strategies of the synchronous jobs, and the TensorFlow process set-up
shared by every strategy: importing TF quietly with the thread settings, SIGTERM, and where
this process sits in the cluster. TensorFlow is imported only inside functions.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator, MutableMapping, Sequence

# Applied only when the caller's environment does not set it already.
DEFAULT_TF_CPP_MIN_LOG_LEVEL = "2"


def configure_environment(environ: MutableMapping[str, str]) -> None:
    """Quiet TF's C++ logging unless the caller chose a level (before import)."""
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_TF_CPP_MIN_LOG_LEVEL)


def make_strategy(tf: Any, strategy: str, collective_timeout_s: float) -> Any:
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


def make_mean_reducer(tf: Any, strategy: Any) -> Any:
    """Compiled cross-worker mean of one float64 scalar (one collective)."""
    @tf.function
    def reduce_mean(value: Any) -> Any:
        per_replica = strategy.run(lambda v: tf.identity(v), args=(value,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return reduce_mean


FAREWELL_LINGER_MAX_S = 5.0


def farewell(barrier: Callable[[], Any], sleep: Callable[[float], Any] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> float:
    """Leave a collective job without cutting a peer's last transfer; returns the linger.

    A ring all-reduce ends on each worker when it has every chunk, while a peer may still be
    pulling this worker's last chunk (TF's RecvBuf is served by the sender's gRPC server): a
    worker that exits at once resets that peer's connection (seen at 20 Mbit/s, where one
    chunk takes a second). The first barrier returns only once every peer finished its
    earlier collectives; the second, timed, is one small collective's latency, and the process
    lingers four of those (at most FAREWELL_LINGER_MAX_S) while the peers pull its last value.
    """
    barrier()
    start = clock()
    barrier()
    linger = min(FAREWELL_LINGER_MAX_S, 0.1 + 4 * (clock() - start))
    sleep(linger)
    return linger


def cluster_position(strategy: Any) -> tuple[int, int]:
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
    configure_environment(os.environ)
    import tensorflow as tf
    import keras

    if args.threads:
        # Must happen before the strategy initialises the TF context.
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    return tf, keras


@contextlib.contextmanager
def initial_values_made_locally(strategy: Any) -> Iterator[None]:
    """Within it, MultiWorkerMirroredStrategy makes each new variable from this worker's own
    initial value, not from a broadcast of the chief's: TF broadcasts every variable on its own
    (a collective each, round trips at start-up: at 50 ms, most of the model's set-up). Every
    worker seeds its initial values alike, and `broadcast_from_chief` then sends the chief's
    values once, in one packed collective, so all start from the chief's weights as before.
    Without that TF method (another TF, another strategy) it changes nothing."""
    extended = strategy.extended
    parent = type(extended).__mro__[1] if len(type(extended).__mro__) > 1 else None
    own = getattr(type(extended), "_get_variable_creator_initial_value", None)
    local = getattr(parent, "_get_variable_creator_initial_value", None) if parent is not None else None
    if own is None or local is None or own is local:
        yield
        return
    extended._get_variable_creator_initial_value = local.__get__(extended)
    try:
        yield
    finally:
        del extended._get_variable_creator_initial_value


def broadcast_from_chief(tf: Any, strategy: Any, variables: Sequence[Any]) -> int:
    """Give every worker the chief's values of `variables` in ONE collective per float dtype
    (usually one: an all-reduce sum of the chief's values and everyone else's zeros, packed into
    one tensor); returns the number of variables sent. Integer variables (an optimizer's step
    counter) start at the same value everywhere and are left as they are."""
    groups: dict[Any, list[Any]] = {}
    for v in variables:
        dtype = tf.as_dtype(v.dtype)
        if dtype.is_floating:
            groups.setdefault(dtype, []).append(v)
    if not groups or strategy.num_replicas_in_sync <= 1:
        return 0

    @tf.function
    def packed() -> Any:
        def fn() -> Any:
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group, 0)  # the chief's first replica
            return [context.all_reduce(tf.distribute.ReduceOp.SUM,
                                       tf.concat([tf.reshape(v, [-1]) for v in group], axis=0)
                                       * tf.cast(first, dtype))
                    for dtype, group in groups.items()]
        return [strategy.experimental_local_results(t)[0] for t in strategy.run(fn)]

    for group, summed in zip(groups.values(), packed()):
        offset = 0
        for v in group:  # the same values on every local copy: no collective
            size = math.prod(v.shape)
            v.assign(tf.reshape(summed[offset:offset + size], v.shape))
            offset += size
    return sum(len(group) for group in groups.values())

