"""A bare MultiWorkerMirroredStrategy custom loop: the yardstick of bench/harness.py.

What a user writes without netbench: TF_CONFIG from the environment, MWMS (ring all-reduce,
as netbench's worker), the MLP 784-512-512-10, SGD(0.01), one synthetic batch of
--batch-size examples per worker, and ONE compiled step (forward, backward, all-reduce,
update) called once per step. Like netbench's step it returns this worker's own loss (no
extra collective for it). Each step is timed from the call to the loss being on the host;
prints one JSON line on stdout: {"mean_step_s", "steps", "worker", "durations_s"}.

    TF_CONFIG=... python bench/bare_mwms.py --warmup 10 --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker [64]")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # TF's chatter to stderr; stdout is the result
    import numpy as np
    import tensorflow as tf
    import keras

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=120, implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    worker = strategy.cluster_resolver.task_id or 0
    global_batch = args.batch_size * strategy.num_replicas_in_sync

    rng = np.random.default_rng(args.seed * 1_000_003 + worker)
    x = tf.constant(rng.standard_normal((args.batch_size, 784), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, size=(args.batch_size,), dtype=np.int32))

    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(512, activation="relu"),
                                  keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(learning_rate=0.01)
        optimizer.build(model.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def train_step(x, y):
        return strategy.experimental_local_results(strategy.run(replica_step, args=(x, y)))[0]

    durations = []
    for step in range(args.warmup + args.steps):
        t0 = time.monotonic()
        train_step(x, y).numpy()
        if step >= args.warmup:
            durations.append(time.monotonic() - t0)
    out.write(json.dumps({"mean_step_s": sum(durations) / len(durations), "steps": len(durations),
                          "worker": worker, "durations_s": durations}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
