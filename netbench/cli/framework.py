"""A sweep's --framework: the option, and its refusals naming the flag (click only)."""

from __future__ import annotations

import click

from netbench.errors import UsageError

framework_option = click.option(
    "--framework", default="tensorflow", show_default=True, type=click.Choice(["tensorflow", "torch"]),
    help="tensorflow: tf.distribute (MultiWorkerMirroredStrategy); torch: PyTorch DistributedDataParallel "
         "over gloo (strategies allreduce, allreduce-accum, single; models mlp, cnn, resnet18).")


def check_framework(framework: str, strategy: str, model: str) -> None:
    """Refuse a strategy or model the framework lacks, naming the flag."""
    from netbench.model import frameworks

    try:
        frameworks.check_framework(framework, strategy, model)
    except ValueError as exc:
        setting, _, message = str(exc).partition(": ")
        raise UsageError(f"flag --{setting}: {message.replace('framework torch', '--framework torch')}",
                         hint="drop --framework torch, or choose one it runs") from None


def require_framework(framework: str) -> None:
    """Refuse --framework torch where torch is not installed (before anything is set up)."""
    import importlib.util

    if framework == "torch" and importlib.util.find_spec("torch") is None:
        raise UsageError("flag --framework: torch is not installed here",
                         hint="pip install torch==2.13.0+cpu (PyTorch's CPU build: a wheel on disk, or PyTorch's "
                              "CPU package index; make install adds it where its wheel is on disk)")
