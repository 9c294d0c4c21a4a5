"""Roles, ports and TF_CONFIG for each process of a job (pure)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from netbench.testbed.topology import Node


@dataclass(frozen=True)
class JobSpec:
    """What to train: model, per-worker batch, warm-up and measured steps."""

    strategy: str = "allreduce"
    model: str = "mlp"
    batch_size: int = 64  # per worker
    warmup: int = 10
    steps: int = 30
    seconds: float | None = None  # a measured window in seconds instead of `steps`
    seed: int = 0


@dataclass(frozen=True)
class Task:
    """One TensorFlow process: its role, node and the exact argv/env it gets."""

    role: str
    index: int
    node: str
    netns: str
    address: str
    port: int
    argv: tuple[str, ...]
    tf_config: str


def worker_argv(job: JobSpec, python: str = sys.executable) -> tuple[str, ...]:
    window = ("--seconds", f"{job.seconds:g}") if job.seconds else ("--steps", str(job.steps))
    return (python, "-m", "netbench.jobs.worker", "--model", job.model,
            "--batch-size", str(job.batch_size), "--warmup", str(job.warmup),
            *window, "--seed", str(job.seed))


def plan_allreduce(job: JobSpec, nodes: tuple[Node, ...], workers: int, port: int,
                   python: str = sys.executable) -> list[Task]:
    """One MultiWorkerMirroredStrategy worker per node on the first `workers` nodes."""
    if workers > len(nodes):
        raise ValueError(f"{workers} workers need {workers} nodes, the testbed has {len(nodes)}")
    chosen = nodes[:workers]
    cluster = {"worker": [f"{node.address}:{port}" for node in chosen]}
    argv = worker_argv(job, python)
    return [
        Task(role="worker", index=i, node=node.name, netns=node.netns, address=node.address, port=port,
             argv=argv, tf_config=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
        for i, node in enumerate(chosen)
    ]
