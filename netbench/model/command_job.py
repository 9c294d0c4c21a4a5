"""A user's own training command: what each rank gets (pure).

``netbench sweep ... -- COMMAND [ARGS...]`` (or a playbook's ``command:``) runs COMMAND once
per node, rank i on node n(i+1). `UserCommand` is what the user asked for; `rank_env` is the
environment every rank starts with: netbench's own variables and those the frameworks read,
so an unmodified script starts (PyTorch ``env://``, torchrun's ``PET_*`` options, TensorFlow's
``TF_CONFIG``, JAX's coordinator, gloo's interface); `hosts_text` is the /etc/hosts a node's
processes see, so each node's hostname resolves to its own address (gloo and torchrun
advertise the address their hostname resolves to: a namespace otherwise keeps the host's
name, which resolves to loopback).

Ports: one launch draws one base port; PyTorch's MASTER_PORT is the base, TensorFlow's
cluster listens on base + 1 and JAX's coordinator on base + 2. Each node is a namespace of
its own (or a host given to the sweep), holding nothing but the job, so they are free there.

Where steps come from (`source`): ``regex`` when the user gave ``--step-regex`` (rank 0's
output lines; the other ranks only serve), else ``track`` (every rank's `netbench.track`
events on its stdout), or, when no rank says it imported netbench.track, ``bytes``: no steps,
the bytes on each node's link over a window of seconds (jobs/link_bytes.py).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from netbench.model.ranks import PORT_BLOCK, visible_devices

COMMAND = "command"  # the strategy name a user's command runs under
SOURCE_TRACK, SOURCE_REGEX, SOURCE_BYTES = "track", "regex", "bytes"
TF_PORT_OFFSET, JAX_PORT_OFFSET = 1, 2


@dataclass(frozen=True)
class UserCommand:
    """The user's command line, and how its steps are read.

    images_per_step: images the whole cluster trains on per step (None: from the track
    events, which say each rank's). step_regex: read rank 0's output lines instead of
    track events (named groups ``step``, and ``seconds`` or ``ms``)."""

    argv: tuple[str, ...]
    images_per_step: int | None = None
    step_regex: str = ""

    @property
    def source(self) -> str:
        """The source the command asks for: regex with a step regex, else track (a job that
        then reports nothing is measured in bytes: decided while it runs, jobs/link_bytes.py)."""
        return SOURCE_REGEX if self.step_regex else SOURCE_TRACK


@dataclass(frozen=True)
class Place:
    """Where one rank runs: its node's name, hostname, address and interface, the node's index
    and the rank's place on it (model/ranks.py), and the node's host identity for NCCL ("": the
    machine's own; set on the embedded testbed, where every node shares one machine)."""

    node: str
    hostname: str
    address: str
    ifname: str
    node_index: int = -1  # -1: the rank's own index (one rank per node)
    local_rank: int = 0
    local_world: int = 1
    host_id: str = ""


# launchers that start a node's ranks themselves (torchrun reads PET_NPROC_PER_NODE): with
# several ranks per node such a command starts once per node, not once per rank
RANK_LAUNCHERS = ("torchrun", "torch.distributed.run", "torchrun.sh")


MAX_STEP_REGEX = 1000  # characters: a step line's pattern, never a program


def check_command(command: UserCommand) -> None:
    """Raise ValueError naming the setting when the command cannot run as asked."""
    if not command.argv or not command.argv[0].strip():
        raise ValueError("command: empty; give it after '--', e.g. -- python train.py")
    nul = next((i for i, arg in enumerate(command.argv) if "\0" in arg), None)
    if nul is not None:  # exec refuses it, on every rank, after the network was shaped
        raise ValueError(f"command: word {nul + 1} holds a NUL byte, which no program can be given")
    if len(command.step_regex) > MAX_STEP_REGEX:
        raise ValueError(f"step-regex: {len(command.step_regex)} characters, over {MAX_STEP_REGEX}")
    if command.images_per_step is not None and command.images_per_step < 1:
        raise ValueError(f"images-per-step: must be at least 1, got {command.images_per_step}")
    if command.step_regex:
        try:
            pattern = re.compile(command.step_regex)
        except re.error as exc:
            raise ValueError(f"step-regex: {exc}") from None
        if "seconds" in pattern.groupindex and "ms" in pattern.groupindex:
            raise ValueError("step-regex: name one time group, 'seconds' or 'ms', not both")
        if command.images_per_step is None:
            raise ValueError("step-regex: needs images-per-step (a line says nothing of images)")


PLAYBOOK_KEYS = ("command", "images_per_step", "step_regex")  # a playbook's top-level keys for it


def from_playbook(data) -> UserCommand | None:
    """A playbook's ``command:`` (a list of strings), ``images_per_step:`` and ``step_regex:``
    (None without a command); ValueError "key: message" for a bad one."""
    if "command" not in data:
        extra = next((key for key in PLAYBOOK_KEYS[1:] if key in data), None)
        if extra:
            raise ValueError(f"{extra}: only with a command:")
        return None
    argv = data["command"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, (str, int, float)) for a in argv):
        raise ValueError("command: must be a list of strings, e.g. [python, train.py]")
    images = data.get("images_per_step")
    if images is not None and (not isinstance(images, int) or isinstance(images, bool)):
        raise ValueError(f"images_per_step: must be a whole number, got {images!r}")
    regex = data.get("step_regex") or ""
    if not isinstance(regex, str):
        raise ValueError("step_regex: must be a string")
    command = UserCommand(argv=tuple(str(a) for a in argv), images_per_step=images, step_regex=regex)
    try:
        check_command(command)
    except ValueError as exc:  # check_command names the flags' spelling: the keys are written with _
        key, _, rest = str(exc).partition(": ")
        raise ValueError(f"{key.replace('-', '_')}: {rest}") from None
    return command


def starts_ranks_itself(argv: Sequence[str]) -> bool:
    """Whether the command is a launcher that starts its node's ranks itself: torchrun,
    ``python -m torch.distributed.run``, or a script named torchrun.sh (examples/torchrun.sh)."""
    names = {a.rsplit("/", 1)[-1] for a in argv[:4]}
    return any(name in names for name in RANK_LAUNCHERS)


def rank_env(places: Sequence[Place], rank: int, port: int, warmup: int,
             gpus: int = 0) -> tuple[tuple[str, str], ...]:
    """The environment rank `rank` of a job on `places` (one a rank, node-major) starts with,
    sorted by name; `port` 0: drawn for each launch, shown as <port> (a dry run). `gpus`: the
    GPUs each node's ranks see (CUDA_VISIBLE_DEVICES; 0: none handed out)."""
    here, master = places[rank], places[0]
    world = len(places)
    node = here.node_index if here.node_index >= 0 else rank
    nodes = len({p.node for p in places})
    addresses = [p.address for p in places]

    def at(offset: int, local: int = 0) -> str:
        block = PORT_BLOCK * local
        if port:
            return str(port + block + offset)
        return "<port>" if not block + offset else f"<port+{block + offset}>"

    tf_config = {"cluster": {"worker": [f"{p.address}:{at(TF_PORT_OFFSET, p.local_rank)}" for p in places]},
                 "task": {"type": "worker", "index": rank}}
    env = {
        "NETBENCH_RANK": str(rank), "NETBENCH_WORLD_SIZE": str(world), "NETBENCH_NODE": here.node,
        "NETBENCH_ADDRESS": here.address, "NETBENCH_PEERS": ",".join(addresses),
        "NETBENCH_WARMUP": str(warmup),
        "MASTER_ADDR": master.address, "MASTER_PORT": at(0), "RANK": str(rank), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(here.local_rank), "LOCAL_WORLD_SIZE": str(here.local_world),
        "GROUP_RANK": str(node), "NODE_RANK": str(node),
        # torchrun reads every option from PET_<OPTION> (torch/distributed/argparse_util.py)
        "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(here.local_world), "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": master.address, "PET_MASTER_PORT": at(0), "PET_LOCAL_ADDR": here.address,
        "PET_RDZV_BACKEND": "static", "PET_MAX_RESTARTS": "0",
        "TF_CONFIG": json.dumps(tf_config),
        "JAX_COORDINATOR_ADDRESS": f"{master.address}:{at(JAX_PORT_OFFSET)}",
        "JAX_NUM_PROCESSES": str(world), "JAX_PROCESS_ID": str(rank),
        # NCCL over the node's shaped interface only: no InfiniBand/RoCE (it bypasses the kernel,
        # where the shaping is), and, where every node shares one machine, a host identity per
        # node so NCCL uses shared memory and peer-to-peer copies only between ranks of one node
        "NCCL_IB_DISABLE": "1",
    }
    if here.ifname:
        env["GLOO_SOCKET_IFNAME"] = here.ifname
        env["NCCL_SOCKET_IFNAME"] = here.ifname
    if here.host_id:
        env["NCCL_HOSTID"] = f"netbench-{here.host_id}"
    if gpus:  # nodes sharing one machine share its GPUs: each node its own of them
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(node, here.local_world, gpus, shared_machine=bool(here.host_id))
    return tuple(sorted(env.items()))


def hosts_text(places: Sequence[Place]) -> str:
    """/etc/hosts for a node of the job: loopback, then every node's hostname and address."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{p.address}\t{p.hostname}" for p in places if p.hostname]
    return "\n".join(dict.fromkeys(lines)) + "\n"  # a node of several ranks: once


BYTES_WINDOW_S = 10.0  # a job measured in bytes: its window without --seconds (jobs/link_bytes.WINDOW_S)


def describe_source(command: UserCommand, warmup: int, seconds: float | None) -> str:
    """A dry run's line: where the command's steps come from, and what a job that reports
    none is measured by."""
    if command.step_regex:
        return (f"steps: rank 0's output lines that match {command.step_regex!r}, "
                f"{command.images_per_step} images each")
    return (f"steps: netbench.track's events on every rank; a job that never imports it is measured in bytes "
            f"on each node's link instead ({warmup} s warm-up after its first bytes, then a "
            f"{seconds or BYTES_WINDOW_S:g} s window; no images/s)")


def describe_rank(argv: Sequence[str], env: Sequence[tuple[str, str]]) -> list[str]:
    """A dry run's lines for one rank: its command, then its environment, one variable a line."""
    return [f"  $ {shlex.join(argv)}"] + [f"    {name}={value}" for name, value in env]
