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

A reader bounds what it takes: the header at MAX_HEADER_BYTES and MAX_HEADER_DEPTH, the arrays at a `FrameCap` (what
the model's shapes allow: the receiver knows them, from its own model or from the first hello),
checked from the header before any array byte is read or allocated, and never past
MAX_FRAME_BYTES; the bytes are read in chunks, so memory grows only as data arrives. A
listener's first frame on a connection must be a hello carrying the run's token (`admit`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

HEADER = struct.Struct("!I")
MAX_HEADER_BYTES = 1 << 20  # a header describes arrays; it is never model-sized
# lists and objects within each other: a frame's own header nests 4 deep ({"arrays":
# [[dtype, [dims]]]}) and its meta carries flat values; "[[[[..." is refused, never recursed into
MAX_HEADER_DEPTH = 8
# the ceiling of any frame's arrays, before the model's shapes are known (worker 0's hello
# carries the initial weights): far above the models this testbed trains
MAX_FRAME_BYTES = 1 << 34
CHUNK_BYTES = 1 << 20  # arrays are read this much at a time
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
START = "start"  # worker -> server (easgd) or worker 0 (gosgd, adpsgd): its warm-up is over; the
# reply comes once every worker's is (the start line: own-pace workers measure their steps together)
BYE = "bye"  # worker -> server or peer: this worker is done
REPLY = "reply"  # the answer to any request that has one
ERROR = "error"  # server -> worker, instead of a reply: why none can come ({"message": ...})

# what the controller gives every role of a run (harness.peers reads them): the run's token, which
# every connection's first frame (a hello) must carry, and the controller's step timeout
TOKEN_ENV = "NETBENCH_EXCHANGE_TOKEN"
TIMEOUT_ENV = "NETBENCH_EXCHANGE_TIMEOUT"
DEFAULT_STEP_TIMEOUT_S = 60.0  # the controller's default --step-timeout
HELLO_S = 10.0  # the longest a listener waits for a connection's hello (Limits.hello_s)


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


@dataclass(frozen=True)
class FrameCap:
    """The most a frame may carry: arrays and their bytes (a model's, or one server's shard of it)."""

    payload_bytes: int
    arrays: int

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray]) -> "FrameCap":
        """What frames about these arrays (a model, a shard) carry at most."""
        return cls(sum(int(np.asarray(a).nbytes) for a in arrays), len(arrays))


@dataclass(frozen=True)
class Limits:
    """How long the exchange waits, from the controller's step timeout, so that a peer that
    vanished is named (by the waiting side) before the controller's own timeout ends the run
    unnamed: a new connection sends its hello's header within `hello_s`; a connection whose
    peer stops acknowledging (a partition) is dropped by the kernel after `liveness_s` (TCP
    keepalive and TCP_USER_TIMEOUT); a parameter server's barrier or
    staleness gate gives up on a worker after `barrier_s`; a worker gives up on a reply after
    `reply_s` (later: the server's message names the culprit first)."""

    step_s: float = DEFAULT_STEP_TIMEOUT_S

    @property
    def liveness_s(self) -> float:
        return max(1.0, 0.5 * self.step_s)

    @property
    def hello_s(self) -> float:
        """How long a listener waits for a new connection's hello header (a role sends it at
        once; a stranger that sends nothing is closed), at most HELLO_S."""
        return min(HELLO_S, self.liveness_s)

    @property
    def barrier_s(self) -> float:
        return max(1.0, 0.7 * self.step_s)

    @property
    def reply_s(self) -> float:
        return max(1.5, 0.85 * self.step_s)


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


def decode(read: Callable[[int], bytes], cap: FrameCap | None = None,
           admit: Callable[[str, dict[str, Any]], None] | None = None) -> Message:
    """The next message from a stream; `read(n)` returns exactly n bytes (b"" at the end of the
    stream before a frame starts, which raises EOFError). `cap` bounds the arrays (never more
    than MAX_FRAME_BYTES), `admit(op, meta)` may refuse the frame (raising ProtocolError): both
    are checked from the header, before any array is read."""
    head = read(HEADER.size)
    if not head:
        raise EOFError("the peer closed the connection")
    if len(head) != HEADER.size:
        raise EOFError("the stream ended inside a frame's length")
    (length,) = HEADER.unpack(head)
    if length > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {length} bytes, more than {MAX_HEADER_BYTES}")
    try:
        header = json.loads(_read_exactly(read, length).decode())
    except RecursionError:  # "[[[[...": the parser's own bound on nesting, never the thread's stack
        raise ProtocolError(f"a header nested deeper than {MAX_HEADER_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"unreadable header ({exc})") from None
    try:
        op, meta, specs = str(header["op"]), dict(header.get("meta") or {}), list(header.get("arrays") or [])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"unreadable header ({exc})") from None
    # only the meta is free-form (_spec takes an array spec's dims as ints, other keys are never
    # read): its depth is checked, not the arrays' specs, one per variable, on every frame
    if 1 + _depth(meta) > MAX_HEADER_DEPTH:
        raise ProtocolError(f"a header nested deeper than {MAX_HEADER_DEPTH} levels")
    shapes = [_spec(spec) for spec in specs]
    _check_cap(op, shapes, cap)
    if admit is not None:
        admit(op, meta)
    arrays = []
    for dtype, shape in shapes:
        data = _read_exactly(read, _nbytes(dtype, shape))
        try:
            arrays.append(np.frombuffer(data, dtype=dtype).reshape(shape))
        except ValueError as exc:
            raise ProtocolError(f"array of shape {list(shape)} is not allowed ({exc})") from None
    return Message(op=op, meta=meta, arrays=tuple(arrays))


def _depth(value: Any, limit: int = MAX_HEADER_DEPTH + 1) -> int:
    """How deep lists and objects nest in a parsed header, counted no further than `limit`."""
    deepest, level = 0, [(value, 0)]
    while level:
        item, depth = level.pop()
        if isinstance(item, (list, dict)):
            depth += 1
            deepest = max(deepest, depth)
            if depth >= limit:
                return deepest
            level.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _spec(spec: Any) -> tuple[np.dtype, tuple[int, ...]]:
    try:
        dtype, shape = np.dtype(str(spec[0])), tuple(int(d) for d in spec[1])
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ProtocolError(f"unreadable array spec {spec!r} ({exc})") from None
    if dtype.name not in DTYPES or any(d < 0 for d in shape) or len(shape) > 32:
        raise ProtocolError(f"array spec {spec!r} is not allowed")
    return dtype, shape


def _nbytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    size = dtype.itemsize  # Python integers: a product of huge dimensions never wraps
    for d in shape:
        size *= d
    return size


def _check_cap(op: str, shapes: list[tuple[np.dtype, tuple[int, ...]]], cap: FrameCap | None) -> None:
    total = sum(_nbytes(dtype, shape) for dtype, shape in shapes)
    limit = min(cap.payload_bytes, MAX_FRAME_BYTES) if cap is not None else MAX_FRAME_BYTES
    if cap is not None and len(shapes) > cap.arrays:
        raise ProtocolError(f"a {op} frame of {len(shapes)} arrays, more than the model's {cap.arrays}")
    if total > limit:
        raise ProtocolError(f"a {op} frame of {total} bytes, more than the {limit} the model's shapes allow")


def _read_exactly(read: Callable[[int], bytes], n: int) -> bytearray:
    """n bytes of a frame, read CHUNK_BYTES at a time (a stream that ends first: EOFError)."""
    out = bytearray()
    while len(out) < n:
        want = min(CHUNK_BYTES, n - len(out))
        part = read(want)
        if len(part) != want:
            raise EOFError(f"the stream ended {n - len(out) - len(part)} bytes into a frame")
        out += part
    return out


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
