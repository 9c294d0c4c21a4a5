"""A sweep's ranks per node, collective, device and GPUs: the options and their refusals (click only)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import click

from netbench.cli.groups import option_set
from netbench.errors import UsageError

_FLAGS = {"ranks_per_node": "--ranks-per-node", "collective": "--collective", "device": "--device",
          "gpus_per_node": "--gpus-per-node"}


@dataclass(frozen=True)
class Ranks:
    """--ranks-per-node, --collective, --device, --gpus-per-node: where a job's ranks run."""

    ranks_per_node: int
    collective: str
    device: str
    gpus_per_node: int

    def apply(self, job, workers: int):
        """`job` with these settings, checked against `workers` (with_ranks)."""
        return with_ranks(job, workers, self.ranks_per_node, self.collective, self.device, self.gpus_per_node)


# the command receives them as `ranks`, a Ranks (model/ranks.py)
ranks_options = option_set(
    Ranks, "ranks", "Nodes and compute",
    click.option("--ranks-per-node", default=1, show_default=True, type=click.IntRange(1, 64),
                 help="Ranks on each node; --workers counts ranks (nodes = workers / ranks per node). "
                      "Ranks of one node talk over its loopback, unshaped."),
    click.option("--collective", default="ring", show_default=True, type=click.Choice(["ring", "hierarchical"]),
                 help="--framework torch: ring (DDP's all-reduce over every rank) or hierarchical (reduce "
                      "inside each node, all-reduce between nodes, broadcast inside)."),
    click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
                 help="--framework torch: cpu (gloo) or cuda (NCCL; every rank needs a GPU)."),
    click.option("--gpus-per-node", default=0, show_default=True, type=click.IntRange(0, 64),
                 help="GPUs each node's ranks see (CUDA_VISIBLE_DEVICES; 0: none handed out, or with "
                      "--device cuda one per rank)."),
)


def with_ranks(job, workers: int, ranks_per_node: int, collective: str, device: str, gpus_per_node: int):
    """`job` with its ranks per node, collective, device and GPUs, checked against `workers`;
    a setting that cannot run is a UsageError naming its flag."""
    from netbench.model import ranks

    if device == "cuda" and not gpus_per_node:  # a GPU of its own for every rank: R per node
        gpus_per_node = ranks_per_node
    job = replace(job, ranks_per_node=ranks_per_node, collective=collective, device=device,
                  gpus_per_node=gpus_per_node)
    try:
        ranks.check_ranks(workers, ranks_per_node, job.strategy)
        ranks.check_devices(device, gpus_per_node, ranks_per_node, collective, job.framework)
    except ValueError as exc:
        key, _, message = str(exc).partition(": ")
        hint = (f"e.g. --workers {max(2, workers // ranks_per_node) * ranks_per_node} --ranks-per-node {ranks_per_node}"
                if key == "ranks_per_node" and workers % ranks_per_node else None)
        raise UsageError(f"flag {_FLAGS.get(key, key)}: {message}", hint=hint) from None
    return job


def require_device(device: str) -> None:
    """Refuse --device cuda where torch sees no GPU (before anything is set up)."""
    if device != "cuda":
        return
    try:
        import torch
    except ImportError:
        raise UsageError("flag --device: cuda needs torch, which is not installed here") from None
    if not torch.cuda.is_available():
        raise UsageError("flag --device: cuda, but torch.cuda is not available here (no GPU, or a CPU build of torch)",
                         hint="run --device cpu, or on a machine with GPUs (netbench doctor lists them)")
