"""Per-node training process: one per emulated node (``python -m netbench.jobs.worker``).

The controller starts this module inside a network namespace (or on an SSH host) with
``TF_CONFIG`` in its environment. Like pyperf's worker role, the process only trains, times
and reports: it writes one JSON event per line on stdout (netbench.jobs.events: the
contract with the controller) and leaves planning and statistics to the controller. All
other output (TensorFlow / Keras logs, stray prints) goes to stderr.

This module is the command line: options, and which training loop runs (`LOOPS`). What
runs inside the training process lives in netbench.jobs.harness, the only package that
imports TensorFlow (and only inside functions, so importing this module stays cheap):

* ``allreduce``: ``tf.distribute.MultiWorkerMirroredStrategy`` (ring all-reduce over
  gRPC), one all-reduce of the gradients per step (harness.loop); each step is one
  compiled function (``--step fused``, the default) and the computation/communication
  split comes from ``--calibration-steps`` split steps after the measured window
  (``--step split``: every step split, as before);
* ``allreduce-accum``: the same, but each worker accumulates the gradients of
  ``--accum-steps`` local batches before one all-reduce and update;
* ``single``: TF's default strategy in one process: no cluster, no network;
* ``ps``: ``ParameterServerStrategy``; see ``netbench.jobs.harness.ps``;
* ``ps-sync``, ``ps-async``, ``ps-ssp``, ``easgd``, ``gosgd``, ``adpsgd``: TF computes
  gradients, the algorithm's transfers go over netbench's own exchange protocol between the roles' nodes;
  see ``netbench.jobs.harness.exchange_loop``.

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
import json
import math
import sys
from typing import IO, Any, Callable, Sequence

from netbench import stats
from netbench.jobs import events as ev
from netbench.jobs.harness import data as datasets
from netbench.jobs.harness.emit import emit, run_process
from netbench.jobs.harness import exchange_loop, loop, ps
from netbench.jobs.harness.loop import measured_steps_from_mean, resolve_shape, warmup_mean
from netbench.jobs.harness.models import DEFAULT_CLASSES, MODELS, check_input, parse_input_shape
from netbench.model.job import (DEFAULT_ACCUM_STEPS, DEFAULT_GOSSIP_P, DEFAULT_STALENESS, DEFAULT_TAU,
                                EXCHANGE_STRATEGIES, STRATEGIES, window_steps)

PHASE_WARMUP = ev.PHASE_WARMUP
PHASE_MEASURED = ev.PHASE_MEASURED

DEFAULT_STRATEGY = "allreduce"
DEFAULT_MODEL = "mlp"
DEFAULT_BATCH_SIZE = 64
DEFAULT_WARMUP = 10
DEFAULT_STEPS = 30
DEFAULT_SEED = 0
DEFAULT_MAX_SECONDS = 60.0
DEFAULT_LEARNING_RATE = 0.05  # the MLP reaches >= 0.80 on Fashion-MNIST in 1,000 steps of 2 x 64 (0.01: 0.799)
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0
DEFAULT_STARTUP_TIMEOUT_S = 300.0

__all__ = ["MODELS", "PHASE_MEASURED", "PHASE_WARMUP", "build_parser", "done_event", "emit", "error_event",
           "main", "make_tf_config", "measured_steps_from_mean", "parse_args", "resolve_shape", "run",
           "start_event", "step_event", "warmup_mean"]


# ---------------------------------------------------------------------------
# Options
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


def _fraction(text: str) -> float:
    """argparse type: a fraction strictly between 0 and 1 (a precision)."""
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction between 0 and 1, got {text}")
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
                             "--accum-steps batches; ps: asynchronous parameter servers (role from "
                             "TF_CONFIG); single: one process; ps-sync, ps-async, ps-ssp, easgd, gosgd, "
                             "adpsgd: see --staleness, --tau, --gossip-p (default: %(default)s)")
    parser.add_argument("--accum-steps", type=_positive_int, default=DEFAULT_ACCUM_STEPS,
                        help="local batches per all-reduce with allreduce-accum "
                             "(default: %(default)s)")
    parser.add_argument("--step", choices=ev.STEP_KINDS, default=ev.STEP_FUSED,
                        help="fused: each update is one compiled function (forward, backward, "
                             "all-reduce, update), as users run it; split: compute, then sync, "
                             "timed apart in every step (allreduce, allreduce-accum, single; "
                             "default: %(default)s)")
    parser.add_argument("--calibration-steps", type=_non_negative_int, default=loop.DEFAULT_CALIBRATION_STEPS,
                        help="split steps after the measured window of a fused run, sent as "
                             "phase 'calibration' to time computation against communication; "
                             "0 = none (default: %(default)s)")
    parser.add_argument("--until-stopped", action="store_true",
                        help="after warm-up, run measured steps until the process is stopped "
                             "(SIGTERM): the controller slices them into network points; "
                             "--steps/--seconds are ignored, there are no calibration steps "
                             "and no done event")
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
                        help="'synthetic' (in memory), 'fashion-mnist' (Debian's "
                             "dataset-fashion-mnist, local files), an .npz with x_train/y_train "
                             "(x_test/y_test: held out), or a folder of class folders of images "
                             "(default: %(default)s)")
    parser.add_argument("--batch-size", type=_positive_int, default=DEFAULT_BATCH_SIZE,
                        help="PER-WORKER batch size in examples (default: %(default)s)")
    parser.add_argument("--warmup", type=_non_negative_int, default=DEFAULT_WARMUP,
                        help="warm-up steps, timed and flagged (default: %(default)s)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, default=None,
                        help=f"measured steps; with --precision, the least window (default: {DEFAULT_STEPS}; "
                             f"with --precision {stats.LEAST_BATCHES * stats.LEAST_BATCH_STEPS}: 8 batch means of 4 steps)")
    length.add_argument("--train-steps", type=_positive_int, default=None,
                        help="train a fresh model for this many steps in all, warm-up included "
                             "(an accuracy run: evaluates after the last step)")
    length.add_argument("--seconds", type=_positive_float, default=None,
                        help="measured window in seconds; the step count is derived "
                             "identically on all workers from the all-reduced mean "
                             "warm-up step time (needs --warmup >= 1)")
    parser.add_argument("--precision", type=_fraction, default=None,
                        help="after --steps/--seconds, go on until the 95 %% batch-means interval of "
                             "the mean step time is within this fraction of it (all workers agree "
                             "on each extension), or --max-seconds have passed")
    parser.add_argument("--max-seconds", type=_positive_float, default=DEFAULT_MAX_SECONDS,
                        help="with --precision, the longest measured window (default: %(default)s)")
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
    algorithm = parser.add_argument_group("algorithms and accuracy")
    algorithm.add_argument("--staleness", type=_non_negative_int, default=DEFAULT_STALENESS,
                           help="ps-ssp: steps a worker may run ahead of the slowest (default: %(default)s)")
    algorithm.add_argument("--pipeline", type=_non_negative_int, default=0,
                           help="ps-async: pushes a worker leaves unanswered while it computes; 0 waits "
                                "for each push's reply, the ASP of the studies (default: %(default)s)")
    algorithm.add_argument("--tau", type=_positive_int, default=DEFAULT_TAU,
                           help="easgd: local steps between elastic exchanges (default: %(default)s)")
    algorithm.add_argument("--elastic-alpha", type=_positive_float, default=None,
                           help="easgd: moving rate alpha (default: 0.9 / workers, the EASGD "
                                "paper's beta = 0.9)")
    algorithm.add_argument("--gossip-p", type=_non_negative_float, default=DEFAULT_GOSSIP_P,
                           help="gosgd: probability of a push to a random peer after each step "
                                "(default: %(default)s)")
    algorithm.add_argument("--backup-workers", type=_non_negative_int, default=0,
                           help="ps-sync: gradients a round may go without; the parameter servers apply "
                                "each round's first workers - B and drop the late ones (default: %(default)s)")
    algorithm.add_argument("--eval-every", type=_non_negative_int, default=0,
                           help="evaluate held-out accuracy after every K steps and the last, "
                                "outside the timed steps; 0 = after the last only with "
                                "--train-steps (default: %(default)s)")
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
    if args.train_steps is not None:
        if args.train_steps <= args.warmup:
            parser.error(f"--train-steps {args.train_steps} must be more than --warmup {args.warmup}")
        args.steps = args.train_steps - args.warmup
    if args.strategy in EXCHANGE_STRATEGIES and args.seconds is not None:
        parser.error(f"--seconds: strategy {args.strategy} runs a step count (--steps or --train-steps)")
    if args.elastic_alpha is not None and args.elastic_alpha > 1:
        parser.error(f"--elastic-alpha must be at most 1, got {args.elastic_alpha}")
    if args.gossip_p > 1:
        parser.error(f"--gossip-p must be at most 1, got {args.gossip_p}")
    return check_window_and_data(parser, args)


def check_window_and_data(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The checks every framework's worker makes: the measured window (exactly one of steps /
    seconds set afterwards), the data source and the model's input; exits 2 naming the flag."""
    if args.seconds is None:
        if args.steps is None:  # with --precision, the least window its interval needs (model.job.window_steps)
            args.steps = window_steps(None, getattr(args, "precision", None))
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


# ---------------------------------------------------------------------------
# Wire objects of the events (for fakes and tests; the harness emits typed events)
# ---------------------------------------------------------------------------


def start_event(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The JSON object of events.start_event(...)."""
    return ev.to_wire(ev.start_event(*args, **kwargs))


def step_event(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The JSON object of events.step_event(...); raises ValueError on an unknown phase."""
    return ev.to_wire(ev.step_event(*args, **kwargs))


def done_event(time_s: float, steps: int) -> dict[str, Any]:
    """Event sent after the last step; ``steps`` = warm-up + measured steps."""
    return ev.to_wire(ev.Done(time=float(time_s), steps=int(steps)))


def error_event(exc: BaseException) -> dict[str, Any]:
    """Event sent when training fails; the process then exits non-zero."""
    return ev.to_wire(ev.error_event(exc))


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


# strategy -> its training loop (args, event stream) -> steps run
LOOPS: dict[str, Callable[[argparse.Namespace, IO[str]], int]] = {
    "allreduce": loop.run, "allreduce-accum": loop.run, "single": loop.run, "ps": ps.run,
    **{name: exchange_loop.run for name in EXCHANGE_STRATEGIES}}


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Train under args.strategy, emitting events on ``events``; returns the steps run."""
    return LOOPS[args.strategy](args, events)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 error, 2 usage)."""
    return run_process(parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
