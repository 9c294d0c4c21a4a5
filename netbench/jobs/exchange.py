"""The wire protocol of the exchange strategies (pure): how model-sized arrays travel between
a worker and a parameter server or a peer over a plain TCP stream.

Used by ``ps-sync``, ``ps-async``, ``ps-ssp``, ``easgd``, ``gosgd`` and ``adpsgd``
(netbench.jobs.algorithms holds their arithmetic; netbench.jobs.harness.peers the socket
edge). TensorFlow computes the gradients; every model-sized transfer is one message on a
socket between the two roles' node addresses, so it crosses exactly the shaped links
between them.

A message is a frame::

    u32 header length (big-endian) | header (UTF-8 JSON) | array bytes, back to back

The header is ``{"op": ..., "meta": {...}, "arrays": [[dtype, [dims...]], ...]}``; the bytes of
each array follow in order, C-contiguous. No pickle: a peer can only send numbers and JSON.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

HEADER = struct.Struct("!I")
MAX_HEADER_BYTES = 1 << 20  # a header describes arrays; it is never model-sized
# the dtypes a frame may carry (what models and their gradients are made of)
DTYPES = ("float32", "float64", "float16", "int32", "int64")

# operations
HELLO = "hello"  # worker -> server: who it is; worker 0 sends the initial weights with it
PUSH = "push"  # worker -> ps: gradients of one step (ps-sync, ps-async, ps-ssp)
PULL = "pull"  # worker -> ps: the weights (after the barrier or the staleness gate)
ELASTIC = "elastic"  # worker -> ps: its replica; the reply is the elastic difference (easgd)
GOSSIP = "gossip"  # worker -> peer: a weighted model, no reply (gosgd)
AVERAGE = "average"  # worker -> peer: its model; the reply is the peer's (adpsgd)
CENTRE = "centre"  # worker -> ps: its shard of the centre variable (easgd's evaluation, untimed)
BYE = "bye"  # worker -> server or peer: this worker is done
REPLY = "reply"  # the answer to any request that has one


class ProtocolError(ValueError):
    """A frame that is not one this protocol reads (the message says what is wrong)."""


@dataclass(frozen=True)
class Message:
    """One frame: an operation, small JSON metadata, and arrays."""

    op: str
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: tuple[np.ndarray, ...] = ()

    @property
    def payload_bytes(self) -> int:
        """Bytes of the arrays (what a model-sized transfer costs on the wire, less framing)."""
        return sum(int(a.nbytes) for a in self.arrays)


def encode(message: Message) -> bytes:
    """The frame of `message` (see the module docstring)."""
    arrays = [np.ascontiguousarray(a) for a in message.arrays]
    for array in arrays:
        if array.dtype.name not in DTYPES:
            raise ProtocolError(f"dtype {array.dtype.name} cannot travel; use one of {', '.join(DTYPES)}")
    header = json.dumps({"op": message.op, "meta": message.meta,
                         "arrays": [[a.dtype.name, list(a.shape)] for a in arrays]},
                        separators=(",", ":"), allow_nan=False).encode()
    return b"".join([HEADER.pack(len(header)), header, *(a.tobytes() for a in arrays)])


def decode(read: Callable[[int], bytes]) -> Message:
    """The next message from a stream; `read(n)` returns exactly n bytes (b"" at the end of the
    stream before a frame starts, which raises EOFError)."""
    head = read(HEADER.size)
    if not head:
        raise EOFError("the peer closed the connection")
    (length,) = HEADER.unpack(head)
    if length > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {length} bytes, more than {MAX_HEADER_BYTES}")
    try:
        header = json.loads(read(length).decode())
        op, meta, specs = str(header["op"]), dict(header.get("meta") or {}), header.get("arrays") or []
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"unreadable header ({exc})") from None
    arrays = []
    for spec in specs:
        try:
            dtype, shape = np.dtype(str(spec[0])), tuple(int(d) for d in spec[1])
        except (TypeError, ValueError, IndexError) as exc:
            raise ProtocolError(f"unreadable array spec {spec!r} ({exc})") from None
        if dtype.name not in DTYPES or any(d < 0 for d in shape):
            raise ProtocolError(f"array spec {spec!r} is not allowed")
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        arrays.append(np.frombuffer(read(size), dtype=dtype).reshape(shape).copy())
    return Message(op=op, meta=meta, arrays=tuple(arrays))


def exact_reader(recv_into: Callable[[memoryview], int]) -> Callable[[int], bytes]:
    """A `read(n)` for `decode` over a socket-like `recv_into` (b"" only at a clean end of
    stream before the first byte; a stream cut inside a frame raises EOFError)."""

    def read(n: int) -> bytes:
        buffer = bytearray(n)
        view = memoryview(buffer)
        got = 0
        while got < n:
            count = recv_into(view[got:])
            if count == 0:
                if got == 0:
                    return b""
                raise EOFError(f"the stream ended {n - got} bytes into a frame")
            got += count
        return bytes(buffer)

    return read


def shard_of(index: int, servers: int) -> int:
    """The parameter server that holds variable `index` (round robin over the variables)."""
    return index % servers


def split_by_shard(arrays: Sequence[np.ndarray], servers: int) -> list[list[np.ndarray]]:
    """Each server's share of a list of variables, in variable order."""
    out: list[list[np.ndarray]] = [[] for _ in range(servers)]
    for i, array in enumerate(arrays):
        out[shard_of(i, servers)].append(array)
    return out


def join_shards(shards: Sequence[Sequence[np.ndarray]], count: int) -> list[np.ndarray]:
    """The inverse of split_by_shard: `count` variables back in order."""
    cursors = [0] * len(shards)
    out = []
    for i in range(count):
        s = shard_of(i, len(shards))
        out.append(shards[s][cursors[s]])
        cursors[s] += 1
    return out
