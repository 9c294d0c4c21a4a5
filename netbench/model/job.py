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
* ``ps-sync``, ``ps-async``, ``ps-ssp`` and ``easgd``: W workers on n1..nW and P parameter servers on the
  next P nodes (W + P nodes; no coordinator: the workers talk to the servers themselves and
  each streams its own steps); the servers serve until the job stops them;
* ``gosgd`` and ``adpsgd``: W workers on n1..nW, each talking to its peers directly.

Every process of the exchange strategies (netbench.jobs.exchange) listens on its node's
address at the job's port; the cluster reaches them through TF_CONFIG's layout.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

from netbench.model import command_job, ranks
from netbench.model.command_job import COMMAND, UserCommand
from netbench.model.frameworks import DEFAULT_FRAMEWORK, check_framework, worker_module
from netbench.model.topology import Node

STRATEGIES = ("allreduce", "allreduce-accum", "ps", "single", "ps-sync", "ps-async", "ps-ssp", "easgd", "gosgd",
              "adpsgd")
# strategies whose parameter servers are processes of their own (job.ps of them)
SERVER_STRATEGIES = ("ps", "ps-sync", "ps-async", "ps-ssp", "easgd")
# workers and servers over netbench's own exchange protocol (netbench.jobs.exchange)
EXCHANGE_STRATEGIES = ("ps-sync", "ps-async", "ps-ssp", "easgd", "gosgd", "adpsgd")
# the exchange strategies whose workers step at their own pace (none waits for the others' steps;
# ps-ssp's gate only bounds how far ahead): the cluster trains at the sum of the workers' own rates
OWN_PACE_STRATEGIES = ("ps-async", "ps-ssp", "easgd", "gosgd", "adpsgd")
# ps-async: pushes a worker leaves unanswered while it computes its next step; 0 (the default) is
# the ASP of the studies (each push's reply awaited, no other worker's); more pipelines them
DEFAULT_PIPELINE = 0
DEFAULT_ACCUM_STEPS = 4
DEFAULT_STALENESS = 3  # ps-ssp: steps a worker may run ahead of the slowest
DEFAULT_TAU = 4  # easgd: local steps between elastic exchanges
DEFAULT_GOSSIP_P = 0.1  # gosgd: probability of a push after each step
DEFAULT_STEPS = 30  # a measured window's steps when none are given and no precision decides them
# the strategy -> the JobSpec fields of its own algorithm settings (the other strategies ignore them)
ALGORITHM_SETTINGS = {"ps-ssp": ("staleness",), "easgd": ("tau", "elastic_alpha"), "gosgd": ("gossip_p",),
                      "ps-sync": ("backup_workers",), "ps-async": ("pipeline",)}
# every such field, in that order: staleness, tau, elastic_alpha, gossip_p, backup_workers, pipeline (playbook keys,
# csv columns, factors)
ALGORITHM_KEYS = tuple(name for names in ALGORITHM_SETTINGS.values() for name in names)

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
    steps: int = DEFAULT_STEPS  # optimizer updates; with allreduce-accum each spans accum_steps batches
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
    # the algorithms' own settings (used by the strategy named)
    staleness: int = DEFAULT_STALENESS  # ps-ssp
    tau: int = DEFAULT_TAU  # easgd
    elastic_alpha: float | None = None  # easgd; None: 0.9 / workers (Zhang et al. 2015: beta = 0.9)
    gossip_p: float = DEFAULT_GOSSIP_P  # gosgd
    backup_workers: int = 0  # ps-sync: each round applies the first workers - backup_workers gradients
    pipeline: int = DEFAULT_PIPELINE  # ps-async
    # accuracy: train_steps (warm-up included) from a fresh model, a launch of its own; eval_every
    # K: held-out accuracy every K steps (0: after the last only); target_accuracy: when first reached
    train_steps: int | None = None
    eval_every: int = 0
    target_accuracy: float | None = None
    command: UserCommand | None = None  # a user's own command (strategy "command"; model/command_job.py)
    framework: str = DEFAULT_FRAMEWORK  # "tensorflow" or "torch" (model/frameworks.py)
    # several ranks per node (model/ranks.py): workers counts ranks, workers / ranks_per_node nodes
    ranks_per_node: int = 1
    collective: str = "ring"  # torch: "ring" (DDP's flat all-reduce) or "hierarchical"
    device: str = "cpu"  # torch: "cpu" (gloo) or "cuda" (NCCL)
    gpus_per_node: int = 0  # GPUs each node's ranks see (CUDA_VISIBLE_DEVICES); 0: none handed out


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
    env: tuple[tuple[str, str], ...] = ()  # the rank's environment (command_job.rank_env); () for servers
    hosts: str = ""  # a user's command: the /etc/hosts its node's processes see ("": the host's own)
    command: bool = False  # a user's command (its argv as written), not netbench's worker
    local_rank: int = 0  # its place on its node (model/ranks.py)


def window_steps(steps: int | None, precision: float | None, seconds: float | None = None) -> int:
    """The steps of a measured window: `steps` where they were given (with a precision, the least
    window); not given (None), with a precision and no `seconds`, the least window the interval
    needs (stats.least_steps: 8 batch means of 4 steps), else DEFAULT_STEPS."""
    from netbench import stats

    if steps is not None:
        return steps
    return stats.least_steps(precision) if precision and not seconds else DEFAULT_STEPS


def command_spec(job: JobSpec, command: UserCommand, workers: int) -> JobSpec:
    """`job` (its warm-up, window and seed) running a user's command on `workers` nodes."""
    return replace(job, strategy=COMMAND, model=COMMAND, command=command,
                   batch_size=(command.images_per_step or 0) // workers, ps=1, accum_steps=1)


def check_job(job: JobSpec, workers: int) -> None:
    """Raise ValueError naming the setting when the job cannot run as asked."""
    if job.command is not None:
        command_job.check_command(job.command)
    elif job.strategy not in STRATEGIES:
        raise ValueError(f"strategy: unknown {job.strategy!r}; choose from {', '.join(STRATEGIES)}")
    if workers < 1:
        raise ValueError(f"workers: must be at least 1, got {workers}")
    if job.strategy == "single" and workers != 1:
        raise ValueError(f"workers: strategy single runs one process, got {workers} workers")
    if job.accum_steps < 1:
        raise ValueError(f"accum_steps: must be at least 1, got {job.accum_steps}")
    if job.strategy in SERVER_STRATEGIES and job.ps < 1:
        raise ValueError(f"ps: strategy {job.strategy} needs at least 1 parameter server, got {job.ps}")
    check_algorithm(job, workers)
    check_framework(job.framework, job.strategy, job.model)
    ranks.check_ranks(workers, job.ranks_per_node, job.strategy)
    ranks.check_devices(job.device, job.gpus_per_node, job.ranks_per_node, job.collective, job.framework)


def check_algorithm(job: JobSpec, workers: int) -> None:
    """Raise ValueError naming the setting when an algorithm's or accuracy setting is out of range."""
    if job.strategy in ("gosgd", "adpsgd") and workers < 2:
        raise ValueError(f"workers: strategy {job.strategy} exchanges with peers, needs at least 2, got {workers}")
    if job.staleness < 0:
        raise ValueError(f"staleness: must be at least 0, got {job.staleness}")
    if job.tau < 1:
        raise ValueError(f"tau: must be at least 1, got {job.tau}")
    if job.elastic_alpha is not None and not 0 < job.elastic_alpha <= 1:
        raise ValueError(f"elastic_alpha: must be in (0, 1], got {job.elastic_alpha}")
    if not 0 <= job.gossip_p <= 1:
        raise ValueError(f"gossip_p: must be in [0, 1], got {job.gossip_p}")
    if job.backup_workers < 0:
        raise ValueError(f"backup_workers: must be at least 0, got {job.backup_workers}")
    if job.strategy == "ps-sync" and job.backup_workers >= workers:
        raise ValueError(f"backup_workers: must be fewer than the {workers} workers (a round applies at least "
                         f"one gradient), got {job.backup_workers}")
    if not 0 <= job.pipeline <= 10_000:
        raise ValueError(f"pipeline: must be in [0, 10000], got {job.pipeline}")
    if job.train_steps is not None and job.train_steps <= job.warmup:
        raise ValueError(f"train_steps: must be more than the {job.warmup} warm-up steps, got {job.train_steps}")
    if job.eval_every < 0:
        raise ValueError(f"eval_every: must be at least 0, got {job.eval_every}")
    if job.target_accuracy is not None and not 0 < job.target_accuracy <= 1:
        raise ValueError(f"target_accuracy: must be in (0, 1], got {job.target_accuracy}")
    if job.train_steps is not None and job.seconds:
        raise ValueError("seconds: not with train_steps (an accuracy run trains a step count)")
    if job.strategy in EXCHANGE_STRATEGIES and job.seconds:
        raise ValueError(f"seconds: strategy {job.strategy} runs a step count (steps or train_steps)")


def nodes_needed(job: JobSpec, workers: int) -> int:
    """Testbed nodes the job's plan places processes on."""
    if job.strategy == "single":
        return 1
    if job.strategy == "ps":
        return workers + job.ps + 1
    if job.strategy in SERVER_STRATEGIES:
        return workers + job.ps
    return ranks.nodes_for_ranks(workers, job.ranks_per_node)


def effective_accum_steps(job: JobSpec) -> int:
    """Batches per optimizer update on each worker: accum_steps for allreduce-accum, else 1."""
    return job.accum_steps if job.strategy == "allreduce-accum" else 1


def algorithm_settings(job: JobSpec, workers: int) -> dict[str, int | float]:
    """The algorithm settings the job's strategy uses, as it runs them: {'staleness': 3} for
    ps-ssp, {'tau': 4, 'elastic_alpha': 0.45} for easgd (alpha resolved: 0.9 / workers when
    unset), {'gossip_p': 0.1} for gosgd; {} for the strategies that have none."""
    used: dict[str, int | float] = {name: getattr(job, name) for name in ALGORITHM_SETTINGS.get(job.strategy, ())}
    if "elastic_alpha" in used and used["elastic_alpha"] is None:
        used["elastic_alpha"] = round(0.9 / max(1, workers), 6)  # jobs.algorithms.default_elastic_alpha
    return used


def pipeline_window(job: JobSpec) -> int:
    """Pushes a worker may leave unanswered while it computes: ps-ssp's staleness, ps-async's
    pipeline (0 unless set), 0 for every other strategy (jobs.algorithms.pipeline_depth, which
    the worker itself uses)."""
    if job.strategy == "ps-async":
        return max(0, job.pipeline)
    return max(0, job.staleness) if job.strategy == "ps-ssp" else 0


def images_per_step(job: JobSpec, workers: int) -> int:
    """Images one step event stands for.

    Synchronous strategies: every worker's batches in one update (x accum_steps for
    allreduce-accum). ps: one worker's batch, since each step runs on one worker. The
    exchange strategies: every worker's batch (ps-sync with backup workers: the workers -
    backup_workers batches a round applies, the late ones are dropped), since each worker steps
    at the reference worker's pace (exactly under ps-sync; about, within the gate or between exchanges, for the
    others: per_worker_images_per_sec has each worker's own).
    """
    if job.strategy == "ps":
        return job.batch_size
    if job.strategy == "ps-sync" and job.backup_workers:
        return job.batch_size * (workers - job.backup_workers)  # the gradients a round applies
    if job.strategy == "single":
        return job.batch_size
    return job.batch_size * workers * effective_accum_steps(job)


def images_per_worker_step(job: JobSpec) -> int:
    """Images one process's step event trained on: its batch (k batches under allreduce-accum;
    ps: the coordinator's step is one worker's batch), whether or not a round applied its
    gradient (ps-sync's backup workers: a late one is trained, then dropped)."""
    return job.batch_size * effective_accum_steps(job)


def worker_argv(job: JobSpec, python: str = sys.executable) -> tuple[str, ...]:
    """The harness command line every process of the job gets (roles come from TF_CONFIG; a
    torch job's ranks and rendezvous too, see netbench.jobs.torch_harness.rendezvous)."""
    window = ("--seconds", f"{job.seconds:g}") if job.seconds else ("--steps", str(job.steps))
    if job.train_steps:
        window = ("--train-steps", str(job.train_steps))
    argv = [python, "-m", worker_module(job.framework), "--strategy", job.strategy, "--model", job.model,
            "--batch-size", str(job.batch_size), "--warmup", str(job.warmup), *window, "--seed", str(job.seed)]
    if job.strategy == "allreduce-accum":
        argv += ["--accum-steps", str(job.accum_steps)]
    if job.data != "synthetic":
        argv += ["--data", job.data]
    if job.input_shape:
        argv += ["--input-shape", "x".join(str(d) for d in job.input_shape)]
    if job.classes:
        argv += ["--classes", str(job.classes)]
    if job.precision and not job.train_steps:  # an accuracy run trains its train_steps, no more
        argv += ["--precision", f"{job.precision:g}", "--max-seconds", f"{job.max_seconds:g}"]
    if job.sample_resources_s:
        argv += ["--sample-resources", f"{job.sample_resources_s:g}"]
    if job.collective != "ring":
        argv += ["--collective", job.collective]
    if job.device != "cpu":
        argv += ["--device", job.device]
    argv += algorithm_argv(job)
    return tuple(argv)


def algorithm_argv(job: JobSpec) -> list[str]:
    """The worker flags of the strategy's own settings and of the accuracy measurement."""
    argv: list[str] = []
    if job.strategy == "ps-ssp":
        argv += ["--staleness", str(job.staleness)]
    if job.strategy == "ps-async" and job.pipeline:
        argv += ["--pipeline", str(job.pipeline)]
    if job.strategy == "easgd":
        argv += ["--tau", str(job.tau)]
        if job.elastic_alpha is not None:
            argv += ["--elastic-alpha", f"{job.elastic_alpha:g}"]
    if job.strategy == "gosgd":
        argv += ["--gossip-p", f"{job.gossip_p:g}"]
    if job.strategy == "ps-sync" and job.backup_workers:
        argv += ["--backup-workers", str(job.backup_workers)]
    if job.eval_every:
        argv += ["--eval-every", str(job.eval_every)]
    return argv


def placement(job: JobSpec, workers: int) -> list[tuple[str, int]]:
    """(role, index) for node 1, 2, ... in order; with several ranks per node, (worker, node
    index) for each node of ranks (plan_job puts ranks_per_node ranks there)."""
    check_job(job, workers)
    if job.strategy == "single" and job.command is None:
        return [(WORKER, 0)]
    roles = [(WORKER, i) for i in range(ranks.nodes_for_ranks(workers, job.ranks_per_node))]
    if job.strategy in SERVER_STRATEGIES:
        roles += [(PS, i) for i in range(job.ps)]
    if job.strategy == "ps":
        roles += [(COORDINATOR, 0)]
    return roles


def plan_job(job: JobSpec, nodes: tuple[Node, ...], workers: int, port: int,
             python: str = sys.executable) -> list[Task]:
    """Place every process of `job` on `nodes` (see the module docstring); servers first.
    Workers' ranks go node-major, `job.ranks_per_node` to a node (model/ranks.py), each with
    its environment (command_job.rank_env) and its own port block on its node."""
    roles = placement(job, workers)
    if len(roles) > len(nodes):
        raise ValueError(f"strategy {job.strategy} with {workers} workers"
                         + (f" and {job.ps} ps" if job.strategy in SERVER_STRATEGIES else "")
                         + f" needs {len(roles)} nodes, the testbed has {len(nodes)}")
    worker_nodes = [node for (role, _), node in zip(roles, nodes) if role == WORKER]
    if job.command is not None:
        return _plan_command(job, job.command, worker_nodes, workers, port)
    per = job.ranks_per_node
    # (role, index, node, port, local rank): ranks first, node-major, then servers and coordinator
    placed = [(WORKER, p.rank, worker_nodes[p.node], ranks.rank_port(port, p.local_rank), p.local_rank)
              for p in ranks.rank_places(len(worker_nodes) * per, per)]
    placed += [(role, index, node, port, 0) for (role, index), node in zip(roles, nodes) if role != WORKER]
    cluster: dict[str, list[str]] = {}
    for role, _, node, at, _ in placed:
        cluster.setdefault(_TF_TASK_TYPE[role], []).append(f"{node.address}:{at}")
    argv = worker_argv(job, python)
    places = _places(worker_nodes, per, shared=_shared_machine(worker_nodes))
    tasks = []
    for role, index, node, at, local in placed:
        if job.strategy == "single":
            tf_config = ""
        else:
            tf_config = json.dumps({"cluster": cluster, "task": {"type": _TF_TASK_TYPE[role], "index": index}})
        env = ()
        if role == WORKER and job.strategy != "single":
            env = _builtin_env(command_job.rank_env(places, index, port, job.warmup, gpus=job.gpus_per_node))
        tasks.append(Task(role=role, index=index, node=node.name, netns=node.netns, address=node.address,
                          port=at, argv=argv, tf_config=tf_config,
                          serves=(job.strategy == "ps" and role != COORDINATOR) or role == PS,
                          env=env, local_rank=local))
    return tasks


# a built-in worker's rank variables: the frameworks' own (TF_CONFIG travels as Task.tf_config)
def _builtin_env(env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple((name, value) for name, value in env if name != "TF_CONFIG")


def _shared_machine(nodes: list[Node]) -> bool:
    """Whether the nodes share one machine (the embedded testbed's namespaces) rather than
    being hosts of their own (remote.agent.HOST_NETNS, "@host")."""
    return any(node.netns and not node.netns.startswith("@") for node in nodes)


def _places(nodes: list[Node], per: int, shared: bool) -> list[command_job.Place]:
    """Every rank's place, node-major: `per` ranks on each node."""
    return [command_job.Place(node.name, node.netns, node.address, node.ifname, node_index=n, local_rank=local,
                              local_world=per, host_id=node.name if shared else "")
            for n, node in enumerate(nodes) for local in range(per)]


def describe_algorithm(job: JobSpec, workers: int) -> list[str]:
    """The algorithm's settings and what crosses the network, and the accuracy run, for --dry-run."""
    lines = ranks.describe_ranks(workers, job.ranks_per_node, job.collective, job.device, job.gpus_per_node)
    if job.strategy == "ps-sync":
        lines.append("algorithm: BSP; each step every worker pushes its gradient to the parameter servers and "
                     "pulls the weights once the round's gradients are applied together"
                     + (f"; with {job.backup_workers} backup worker(s) a round applies the first "
                        f"{workers - job.backup_workers} gradients and answers the late ones with the new weights "
                        "(dropped)" if job.backup_workers else ""))
    elif job.strategy == "ps-async":
        if job.pipeline:
            lines.append(f"algorithm: ASP, pipelined {job.pipeline}; each push is applied and answered at once; a "
                         "worker pushes its gradient and goes on with the freshest weights it has received, never "
                         f"waiting for the other workers, with up to {job.pipeline} of its own pushes unanswered")
        else:
            lines.append("algorithm: ASP; each push is applied and answered at once; a worker waits for its own "
                         "push's reply (the weights) every step, never for the other workers")
    elif job.strategy == "ps-ssp":
        lines.append(f"algorithm: SSP, staleness {job.staleness}; each step a worker pushes its gradient and goes on "
                     f"with the weights it last received, waiting only with more than {job.staleness} pushes "
                     f"unanswered (at most {job.staleness} steps ahead of the slowest)")
    elif job.strategy == "easgd":
        alpha = f"{job.elastic_alpha:g}" if job.elastic_alpha is not None else f"{0.9 / workers:g} (0.9 / workers)"
        lines.append(f"algorithm: asynchronous EASGD, tau {job.tau}, alpha {alpha}; every {job.tau} local steps "
                     "a worker exchanges its replica with the centre variable on the parameter servers")
    elif job.strategy == "gosgd":
        lines.append(f"algorithm: GoSGD, p {job.gossip_p:g}; after each step a worker pushes its weighted model "
                     "to one random peer with that probability")
    elif job.strategy == "adpsgd":
        lines.append("algorithm: AD-PSGD; each step a worker averages its model with one random peer's")
    if job.train_steps:
        target = f", target {job.target_accuracy:g}" if job.target_accuracy else ""
        every = f" every {job.eval_every} steps and" if job.eval_every else ""
        lines.append(f"accuracy: each point trains a fresh model for {job.train_steps} steps ({job.warmup} warm-up) "
                     f"in a launch of its own, evaluated on held-out data{every} after the last{target}")
    elif job.eval_every:
        lines.append(f"accuracy: held-out evaluation every {job.eval_every} steps")
    return lines


def _plan_command(job: JobSpec, command: UserCommand, nodes: list[Node], workers: int, port: int) -> list[Task]:
    """A user's command: once per rank, rank i on node i // ranks_per_node; a torchrun-like
    command (command_job.starts_ranks_itself) once per node, torchrun starting the node's ranks.
    With --step-regex only rank 0's output is read (the other ranks serve)."""
    per = job.ranks_per_node
    places = _places(nodes, per, shared=_shared_machine(nodes))
    hosts = command_job.hosts_text(places)
    once_per_node = per > 1 and command_job.starts_ranks_itself(command.argv)
    chosen = [p for p in places if p.local_rank == 0] if once_per_node else places
    by_name = {node.name: node for node in nodes}
    tasks = []
    for place in chosen:
        rank = place.node_index * per + place.local_rank
        node = by_name[place.node]
        tasks.append(Task(role=WORKER, index=rank, node=node.name, netns=node.netns, address=node.address,
                          port=ranks.rank_port(port, place.local_rank), argv=command.argv, tf_config="",
                          serves=bool(command.step_regex) and rank > 0,
                          env=command_job.rank_env(places, rank, port, job.warmup, gpus=job.gpus_per_node),
                          hosts=hosts, command=True, local_rank=place.local_rank))
    return tasks


def describe_plan(tasks: list[Task]) -> list[str]:
    """One line per process: role, node, address:port, and whether it serves or reports steps
    (a user's command: its command line and environment under each)."""
    lines = []
    for task in tasks:
        if task.command:
            lines.append(f"rank {task.index} on {task.node} ({task.address}), "
                         + ("output ignored" if task.serves else "reports steps"))
            lines += command_job.describe_rank(task.argv, task.env)
            continue
        what = "serves" if task.serves else "reports steps"
        port = task.port or ("<port>" if not task.local_rank else f"<port+{ranks.PORT_BLOCK * task.local_rank}>")
        local = f", local rank {task.local_rank}" if any(t.local_rank for t in tasks) else ""
        lines.append(f"{task.role}{task.index} on {task.node} ({task.address}:{port}{local}), {what}")
    return lines
