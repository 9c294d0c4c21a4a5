"""Roles, placement on testbed nodes, ports and TF_CONFIG for each process of a job (pure).

A job is planned before anything starts, and the plan is what runs: `plan_job` returns one
`Task` per process with its node, address, port, argv and TF_CONFIG, and `describe_plan`
prints it (``netbench sweep --dry-run``).

Placement, one process per node so every byte between roles crosses shaped links:

* ``single``: one worker on n1, no TF_CONFIG (no cluster, no network);
* ``allreduce`` and ``allreduce-accum``: W workers on n1..nW; worker 0 is the chief;
* ``ps``: W workers on n1..nW, P parameter servers on the next P nodes, and the
  coordinator (TF's "chief" task) on the node after them: W + P + 1 nodes. Workers and
  parameter servers run plain TF servers; the coordinator dispatches every step and is
  the process that streams step events.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from netbench.model.topology import Node

STRATEGIES = ("allreduce", "allreduce-accum", "ps", "single")
DEFAULT_ACCUM_STEPS = 4

# Role names; TF_CONFIG calls the coordinator "chief".
WORKER, PS, COORDINATOR = "worker", "ps", "coordinator"
_TF_TASK_TYPE = {WORKER: "worker", PS: "ps", COORDINATOR: "chief"}


@dataclass(frozen=True)
class JobSpec:
    """What to train and how: strategy, model, data, per-worker batch, warm-up and measured steps."""

    strategy: str = "allreduce"
    model: str = "mlp"
    batch_size: int = 64  # per worker
    warmup: int = 10
    steps: int = 30  # optimizer updates; with allreduce-accum each spans accum_steps batches
    seconds: float | None = None  # a measured window in seconds instead of `steps`
    # the measured window goes on past `steps`/`seconds` until the 95 % batch-means interval of
    # the mean step time is within this fraction of it, or for at most `max_seconds`; None: off
    precision: float | None = None
    max_seconds: float = 60.0
    seed: int = 0
    accum_steps: int = DEFAULT_ACCUM_STEPS  # used by allreduce-accum only
    ps: int = 1  # parameter servers, used by ps only
    data: str = "synthetic"  # or a path to an .npz or a folder of class folders
    input_shape: tuple[int, ...] | None = None  # None: the model's default, or the data's
    classes: int | None = None  # None: 10, or the data's
    sample_resources_s: float = 0.0  # every process samples its CPU, memory and bytes this often; 0: off


@dataclass(frozen=True)
class Task:
    """One TensorFlow process: its role, node and the exact argv/env it gets.

    `serves` marks a process that only serves (ps strategy workers and parameter servers):
    it reports once it is up and runs until the job stops it.
    """

    role: str
    index: int
    node: str
    netns: str
    address: str
    port: int
    argv: tuple[str, ...]
    tf_config: str
    serves: bool = False


def check_job(job: JobSpec, workers: int) -> None:
    """Raise ValueError naming the setting when the job cannot run as asked."""
    if job.strategy not in STRATEGIES:
        raise ValueError(f"strategy: unknown {job.strategy!r}; choose from {', '.join(STRATEGIES)}")
    if workers < 1:
        raise ValueError(f"workers: must be at least 1, got {workers}")
    if job.strategy == "single" and workers != 1:
        raise ValueError(f"workers: strategy single runs one process, got {workers} workers")
    if job.accum_steps < 1:
        raise ValueError(f"accum_steps: must be at least 1, got {job.accum_steps}")
    if job.strategy == "ps" and job.ps < 1:
        raise ValueError(f"ps: strategy ps needs at least 1 parameter server, got {job.ps}")


def nodes_needed(job: JobSpec, workers: int) -> int:
    """Testbed nodes the job's plan places processes on."""
    if job.strategy == "single":
        return 1
    if job.strategy == "ps":
        return workers + job.ps + 1
    return workers


def effective_accum_steps(job: JobSpec) -> int:
    """Batches per optimizer update on each worker: accum_steps for allreduce-accum, else 1."""
    return job.accum_steps if job.strategy == "allreduce-accum" else 1


def images_per_step(job: JobSpec, workers: int) -> int:
    """Images one step event stands for.

    Synchronous strategies: every worker's batches in one update (x accum_steps for
    allreduce-accum). ps: one worker's batch, since each step runs on one worker.
    """
    if job.strategy == "ps":
        return job.batch_size
    if job.strategy == "single":
        return job.batch_size
    return job.batch_size * workers * effective_accum_steps(job)


def worker_argv(job: JobSpec, python: str = sys.executable) -> tuple[str, ...]:
    """The harness command line every process of the job gets (roles come from TF_CONFIG)."""
    window = ("--seconds", f"{job.seconds:g}") if job.seconds else ("--steps", str(job.steps))
    argv = [python, "-m", "netbench.jobs.worker", "--strategy", job.strategy, "--model", job.model,
            "--batch-size", str(job.batch_size), "--warmup", str(job.warmup), *window, "--seed", str(job.seed)]
    if job.strategy == "allreduce-accum":
        argv += ["--accum-steps", str(job.accum_steps)]
    if job.data != "synthetic":
        argv += ["--data", job.data]
    if job.input_shape:
        argv += ["--input-shape", "x".join(str(d) for d in job.input_shape)]
    if job.classes:
        argv += ["--classes", str(job.classes)]
    if job.precision:
        argv += ["--precision", f"{job.precision:g}", "--max-seconds", f"{job.max_seconds:g}"]
    if job.sample_resources_s:
        argv += ["--sample-resources", f"{job.sample_resources_s:g}"]
    return tuple(argv)


def placement(job: JobSpec, workers: int) -> list[tuple[str, int]]:
    """(role, index) for node 1, 2, ... in order."""
    check_job(job, workers)
    if job.strategy == "single":
        return [(WORKER, 0)]
    roles = [(WORKER, i) for i in range(workers)]
    if job.strategy == "ps":
        roles += [(PS, i) for i in range(job.ps)] + [(COORDINATOR, 0)]
    return roles


def plan_job(job: JobSpec, nodes: tuple[Node, ...], workers: int, port: int,
             python: str = sys.executable) -> list[Task]:
    """Place every process of `job` on `nodes` (see the module docstring); servers first."""
    roles = placement(job, workers)
    if len(roles) > len(nodes):
        raise ValueError(f"strategy {job.strategy} with {workers} workers"
                         + (f" and {job.ps} ps" if job.strategy == "ps" else "")
                         + f" needs {len(roles)} nodes, the testbed has {len(nodes)}")
    placed = list(zip(roles, nodes))
    cluster: dict[str, list[str]] = {}
    for (role, _), node in placed:
        cluster.setdefault(_TF_TASK_TYPE[role], []).append(f"{node.address}:{port}")
    argv = worker_argv(job, python)
    tasks = []
    for (role, index), node in placed:
        if job.strategy == "single":
            tf_config = ""
        else:
            tf_config = json.dumps({"cluster": cluster, "task": {"type": _TF_TASK_TYPE[role], "index": index}})
        tasks.append(Task(role=role, index=index, node=node.name, netns=node.netns, address=node.address,
                          port=port, argv=argv, tf_config=tf_config,
                          serves=job.strategy == "ps" and role != COORDINATOR))
    return tasks


def describe_plan(tasks: list[Task]) -> list[str]:
    """One line per process: role, node, address:port, and whether it serves or reports steps."""
    lines = []
    for task in tasks:
        what = "serves" if task.serves else "reports steps"
        port = task.port or "<port>"  # 0: chosen fresh for each run
        lines.append(f"{task.role}{task.index} on {task.node} ({task.address}:{port}), {what}")
    return lines
