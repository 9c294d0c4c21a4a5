"""Held-out accuracy, measured outside the timed steps (``--eval-every``, ``--train-steps``).

After every K-th step (K = --eval-every) and after the last one, a worker evaluates the model
it holds on the data's held-out split (Fashion-MNIST's 10,000 test images; an .npz's
x_test/y_test), read from this node's local files, and sends an ``eval`` event: the steps done,
when (monotonic s), ``train_s`` (seconds spent in training steps so far: the time the
evaluations took is left out), accuracy and mean loss. Without a held-out split there is no
evaluation. TensorFlow is passed in.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets

EVAL_BATCH = 2000


def due(done: int, total: int, every: int | None) -> bool:
    """Whether to evaluate after `done` of `total` steps: every `every`-th step, and the last."""
    return done == total or bool(every) and done % int(every) == 0


class TrainClock:
    """Seconds spent in training steps (warm-up included), evaluations left out."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        self.seconds += seconds


def wanted(args: argparse.Namespace) -> bool:
    """Whether this run evaluates: asked (--eval-every) or an accuracy run (--train-steps)."""
    return bool(getattr(args, "eval_every", 0) or getattr(args, "train_steps", None))


def _held_out(args: argparse.Namespace) -> datasets.Dataset | None:
    if not wanted(args) or args.data == datasets.SYNTHETIC:
        return None
    return datasets.load_test(args.data, args.input_shape)


def for_run(tf: Any, args: argparse.Namespace, model: Any) -> Callable[..., ev.Eval] | None:
    """evaluate(weights, state, step, train_s) -> Eval at given weights (stateless), or None
    when this run does not evaluate."""
    test = _held_out(args)
    if test is None:
        return None

    @tf.function
    def logits_of(weights: list[Any], state: list[Any], x: Any) -> Any:
        return model.stateless_call(weights, state, x, training=False)[0]

    def evaluate(weights: list[np.ndarray], state: list[Any], step: int, train_s: float) -> ev.Eval:
        constants = [tf.constant(w) for w in weights]
        return _score(tf, lambda x: logits_of(constants, state, x), test, step, train_s)

    return evaluate


def for_model(tf: Any, args: argparse.Namespace, model: Any) -> Callable[[int, float], ev.Eval] | None:
    """evaluate(step, train_s) -> Eval of a Keras model's own variables, or None."""
    test = _held_out(args)
    if test is None:
        return None

    @tf.function
    def logits_of(x: Any) -> Any:
        return model(x, training=False)

    return lambda step, train_s: _score(tf, logits_of, test, step, train_s)


def _score(tf: Any, logits_of: Callable[[Any], Any], test: datasets.Dataset, step: int, train_s: float) -> ev.Eval:
    correct, loss = 0, 0.0
    for first in range(0, len(test.x), EVAL_BATCH):
        x, y = test.x[first:first + EVAL_BATCH], test.y[first:first + EVAL_BATCH]
        logits = logits_of(tf.constant(x))
        loss += float(tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)))
        correct += int(np.sum(np.argmax(logits.numpy(), axis=1) == y))
    n = len(test.x)
    return ev.eval_event(step, time.monotonic(), train_s, correct / n, loss / n, n)
