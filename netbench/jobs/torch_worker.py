"""Per-node PyTorch training process (``python -m netbench.jobs.torch_worker``): the torch twin
of netbench.jobs.worker, for jobs run with ``--framework torch``.

It takes the TensorFlow worker's options (the controller builds one command line for both,
model.job.worker_argv) and writes the same JSON step events on stdout; the loop is
netbench.jobs.torch_harness.loop (DistributedDataParallel over gloo). Strategies:
``allreduce`` (DDP, one bucketed all-reduce per step, overlapped with backward),
``allreduce-accum`` (k micro-batches under ``no_sync``, then one all-reduce) and ``single``
(one process, no process group); models mlp, cnn and resnet18 (the TensorFlow ones'
parameter counts). Ranks and the rendezvous come from TF_CONFIG (see
torch_harness.rendezvous). Importing this module imports no torch.

Failure handling: a peer that exits makes gloo's collectives fail at once (error event,
exit 1); a hung peer hits gloo's timeout (--collective-timeout); a rendezvous that never
completes hits the startup watchdog (--startup-timeout: traceback on stderr, exit 1).
SIGTERM ends the process (torch does not catch it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Sequence

from netbench.jobs import worker
from netbench.jobs.harness.emit import run_process
from netbench.model.frameworks import TORCH, TORCH_MODELS, TORCH_STRATEGIES, check_framework

PROG = "python -m netbench.jobs.torch_worker"


def build_parser() -> argparse.ArgumentParser:
    """The TensorFlow worker's options, under this module's name."""
    parser = worker.build_parser()
    parser.prog = PROG
    parser.add_argument("--collective", choices=("ring", "hierarchical"), default="ring",
                        help="ring: DDP's all-reduce over every rank; hierarchical: reduce inside each node, "
                             "all-reduce between the nodes' first ranks, broadcast inside (several ranks per node)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: gloo; cuda: NCCL, each rank on GPU LOCAL_RANK of those it sees")
    parser.description = ("Train a model with PyTorch DistributedDataParallel over gloo and report per-step "
                          f"timings as JSON lines on stdout (strategies {', '.join(TORCH_STRATEGIES)}; "
                          f"models {', '.join(TORCH_MODELS)}).")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate; exits with status 2 naming the flag on bad input (as the TF worker)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_framework(TORCH, args.strategy, args.model)
    except ValueError as exc:
        flag = str(exc).split(":", 1)[0]
        parser.error(f"--{flag}: {str(exc).split(': ', 1)[1]}")
    return worker.check_window_and_data(parser, args)


def run(args: argparse.Namespace, events: IO[str]) -> int:
    """Train (imports torch), emitting events on ``events``; returns the steps run."""
    from netbench.jobs.torch_harness import loop

    return loop.run(args, events)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 error, 2 usage)."""
    return run_process(parse_args(argv), run)


def exit_without_finalizing(code: int) -> None:
    """End the process once its output is out, without Python's finalization: gloo's worker
    thread lets go of the last all-reduce after the step returned, which needs the GIL, and a
    Python before 3.14 that is finalizing by then aborts (SIGABRT; pytorch/pytorch#117762).
    examples/torch_ddp.py ends the same way."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalizing(main())
