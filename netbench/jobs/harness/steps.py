"""The compiled functions of one synchronous optimizer update, two ways.

fused (the default; what ``model.fit`` or a plain custom loop runs): ONE compiled function
per update. allreduce: forward, backward, the all-reduce of the gradients and the update.
allreduce-accum: the k micro-batches of the update inside that same function (a
``tf.while_loop`` summing the local gradients in loop-carried tensors: no network, no host
round trip between micro-batches), then one all-reduce and the update, as a user's
``train_step`` that takes k micro-batches would be written.

split (``--step split``): ``compute`` (forward and backward on a local batch, gradients
added to per-worker accumulators) runs k times, then ``sync`` (all-reduce of the
accumulated gradients, update, accumulators zeroed): two compiled functions with a host
round trip between them, so that computation and communication can be timed apart. The
worker runs split steps for the calibration after a fused run's measured window.

The loss is deliberately NOT all-reduced in either: an extra scalar collective per step
would add a latency-bound round trip to every step under network emulation. The loss is
scaled by the global batch times k, so the summed gradient is the mean over every image of
the update. Keras 3's optimizer all-reduces (SUM) the gradients in replica context. (Keras 3
``model.fit`` fails under MWMS on TF 2.21, hence the custom loop.)

TensorFlow is passed in; nothing here imports it.
"""

from __future__ import annotations

from typing import Any


def _loss_and_grads(tf: Any, model: Any, x: Any, y: Any, scale: int) -> tuple[Any, list[Any]]:
    """This worker's mean loss on (x, y) and the gradients of its share of the global loss."""
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=scale)
    return tf.reduce_mean(per_example), tape.gradient(loss, model.trainable_variables)


def make_fused_step(tf: Any, strategy: Any, model: Any, optimizer: Any,
                    global_batch_size: int, accum_steps: int) -> Any:
    """One compiled function per update: ``step(xs, ys, first)`` trains on the local
    batches ``first, first + 1, ..., first + k - 1`` (modulo their count) of the stacked
    batches ``xs`` [batches, batch, ...] and ``ys`` [batches, batch], all-reduces and
    applies; returns this worker's mean loss and the wall clock when its gradients were ready
    (`_ready`: which rank finished its computation last). k = 1: ``step(x, y)`` on one batch."""
    scale = global_batch_size * accum_steps
    variables = model.trainable_variables

    if accum_steps == 1:
        def one(x: Any, y: Any) -> Any:
            loss, grads = _loss_and_grads(tf, model, x, y, scale)
            ready = _ready(tf, grads)
            optimizer.apply_gradients(zip(grads, variables))
            return loss, ready

        @tf.function
        def step(x: Any, y: Any) -> Any:
            # One replica per worker on CPU: the first local result is ours.
            loss, ready = strategy.run(one, args=(x, y))
            return strategy.experimental_local_results(loss)[0], strategy.experimental_local_results(ready)[0]

        return step

    def accumulate(xs: Any, ys: Any, first: Any) -> Any:
        count = tf.shape(xs, out_type=tf.int64)[0]

        def micro(j: Any, loss: Any, grads: list[Any]) -> tuple[Any, Any, list[Any]]:
            index = (first + j) % count
            more, new = _loss_and_grads(tf, model, tf.gather(xs, index), tf.gather(ys, index), scale)
            return j + 1, loss + more, [g + n for g, n in zip(grads, new)]

        start = [tf.zeros(v.shape, dtype=v.dtype) for v in variables]
        _, loss, grads = tf.while_loop(lambda j, *_: j < accum_steps, micro,
                                       (tf.constant(0, tf.int64), tf.constant(0.0), start))
        ready = _ready(tf, grads)
        optimizer.apply_gradients(zip(grads, variables))
        return loss / accum_steps, ready

    @tf.function
    def step(xs: Any, ys: Any, first: Any) -> Any:
        loss, ready = strategy.run(accumulate, args=(xs, ys, first))
        return strategy.experimental_local_results(loss)[0], strategy.experimental_local_results(ready)[0]

    return step


def _ready(tf: Any, grads: list[Any]) -> Any:
    """The wall clock (tf.timestamp, seconds) once every gradient is computed: the end of the
    update's computation, read inside the compiled step (the all-reduce needs the gradients
    too, so nothing waits for this read)."""
    with tf.control_dependencies([g for g in grads if g is not None]):
        return tf.timestamp()


def make_split_steps(tf: Any, strategy: Any, model: Any, optimizer: Any,
                     global_batch_size: int, accum_steps: int) -> tuple[Any, Any]:
    """Compiled (compute, sync) functions of one update, timed apart.

    compute(x, y): forward and backward on the local batch; gradients added to per-worker
    accumulators (ON_READ variables: a replica-local copy each, so no network); returns
    this worker's mean loss. sync(): the optimizer all-reduces (sums) the accumulated
    gradients across workers, applies them, and the accumulators are zeroed; returns the
    optimizer's iteration count. The accumulators are made here, under the strategy's
    scope (every worker must call this at the same point).
    """
    with strategy.scope():
        accumulators = [
            tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM)
            for v in model.trainable_variables]
    scale = global_batch_size * accum_steps

    def compute_fn(x: Any, y: Any) -> Any:
        loss, grads = _loss_and_grads(tf, model, x, y, scale)
        for accumulator, grad in zip(accumulators, grads):
            accumulator.assign_add(grad)
        return loss

    def sync_fn() -> Any:
        grads = [tf.identity(accumulator) for accumulator in accumulators]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        for accumulator in accumulators:
            accumulator.assign(tf.zeros_like(accumulator))
        return tf.identity(optimizer.iterations)

    @tf.function
    def compute(x: Any, y: Any) -> Any:
        per_replica = strategy.run(compute_fn, args=(x, y))
        return strategy.experimental_local_results(per_replica)[0]

    @tf.function
    def sync() -> Any:
        return strategy.experimental_local_results(strategy.run(sync_fn))[0]

    return compute, sync
