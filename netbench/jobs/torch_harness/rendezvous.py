"""Where a torch job's process sits in its job and how it meets its peers (no torch here).

The controller plans a torch job as it plans a TensorFlow one (model.job.plan_job): every
process gets ``TF_CONFIG``, a cluster of "address:port" workers and its own index. A torch
worker turns that into PyTorch's ``env://`` rendezvous: ``RANK`` = its index, ``WORLD_SIZE``
= the workers, ``MASTER_ADDR``/``MASTER_PORT`` = rank 0's node address and port (rank 0
serves the TCPStore there), ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` from the workers that
share its address (several ranks per node, model/ranks.py; 0 and 1 with one a node). ``GLOO_SOCKET_IFNAME`` pins gloo to the interface that holds the node's address:
without it gloo advertises whatever the hostname resolves to (in a namespace: the host's
address or loopback), and the gradients would not cross the shaped link.

A process started with ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` already set (by hand, or a
user's launcher) keeps them; one with neither is a job of one on loopback.
"""

from __future__ import annotations

import fcntl
import json
import socket
import struct
from dataclasses import dataclass
from typing import Mapping

_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address
ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


@dataclass(frozen=True)
class Rendezvous:
    """One process's place: its rank of `world`, rank 0's address and port, its own address."""

    rank: int
    world: int
    master_addr: str
    master_port: int
    address: str = ""  # this process's node address ("" unknown)
    local_rank: int = 0  # its place among the ranks of its node (model/ranks.py)
    local_world: int = 1


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"TF_CONFIG: worker address {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def from_tf_config(text: str) -> Rendezvous | None:
    """The rendezvous a TF_CONFIG worker cluster describes; None for an empty TF_CONFIG.
    Raises ValueError naming what is wrong with one that is not a worker cluster."""
    if not text.strip():
        return None
    try:
        config = json.loads(text)
        workers = list(config["cluster"]["worker"])
        task = config["task"]
        kind, index = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"TF_CONFIG: not a worker cluster ({type(exc).__name__}: {exc})") from None
    if kind != "worker" or not workers or not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG: task {kind} {index} is not one of {len(workers)} workers")
    master_addr, master_port = _split(workers[0])
    hosts = [_split(w)[0] for w in workers]
    here = hosts[index]  # ranks of one node share its address (their ports differ)
    return Rendezvous(rank=index, world=len(workers), master_addr=master_addr, master_port=master_port,
                      address=here, local_rank=hosts[:index].count(here), local_world=hosts.count(here))


def from_environment(environ: Mapping[str, str]) -> Rendezvous | None:
    """The rendezvous of a process started with RANK, WORLD_SIZE and MASTER_ADDR (MASTER_PORT
    default 29500, as torch's); None when any of the three is missing."""
    if not all(environ.get(key) for key in ENV_KEYS):
        return None
    try:
        return Rendezvous(rank=int(environ["RANK"]), world=int(environ["WORLD_SIZE"]),
                          master_addr=environ["MASTER_ADDR"], master_port=int(environ.get("MASTER_PORT", "29500")),
                          address=environ.get("NETBENCH_ADDRESS", ""),
                          local_rank=int(environ.get("LOCAL_RANK", "0")),
                          local_world=int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError as exc:
        raise ValueError(f"RANK, WORLD_SIZE, MASTER_PORT, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers "
                         f"({exc})") from None


def torch_env(where: Rendezvous, ifname: str | None) -> dict[str, str]:
    """The environment torch's env:// rendezvous and gloo read for `where`."""
    env = {"MASTER_ADDR": where.master_addr, "MASTER_PORT": str(where.master_port), "RANK": str(where.rank),
           "WORLD_SIZE": str(where.world), "LOCAL_RANK": str(where.local_rank),
           "LOCAL_WORLD_SIZE": str(where.local_world)}
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
    return env


def interface_of(address: str) -> str | None:
    """The name of this namespace's interface that holds IPv4 `address` (None: none does)."""
    if not address:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None
