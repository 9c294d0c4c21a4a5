"""Distribution strategies of the synchronous jobs, and the TensorFlow process set-up
shared by every strategy: importing TF quietly with the thread settings, SIGTERM, and where
this process sits in the cluster. TensorFlow is imported only inside functions.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any, MutableMapping

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
