"""The delay engine's control channel: change its parameters in place, without a restart.

The engine binds a unix datagram socket (``--control PATH``, mode 0600). One datagram is one
JSON object; the engine answers to the sender's address with one JSON object:

    {"op": "set", "delay_us": 10000, "jitter_us": 0, "loss": 0.0, "seed": 1, "id": 7}
        -> {"ok": true, "id": 7, "params": {...}}  (the engine's parameters from now on)
    {"op": "ping", "id": 8}  -> {"ok": true, "id": 8, "params": {...}}
    anything else            -> {"ok": false, "id": ..., "error": "one line"}

A ``set`` may leave out jitter_us, loss or seed: they keep their values. A ``set`` may carry
a per-destination table, ``"pairs": [{"dst": "10.213.0.3", "delay_us": 25000, "jitter_us": 0,
"loss": 0.001, "rate_bps": 1000000000}, ...]`` (delay_us/jitter_us/loss are then the default of
destinations not in it; all zero: unshaped); a ``set`` without "pairs" drops the table (one
profile for every destination). New parameters apply to packets arriving after the change;
held packets keep their release time. Every field is bounded (delay_us and jitter_us at most
2**32 - 1, rate_bps 2**63 - 1, seed 2**64 - 1, 4096 pairs): whatever a datagram holds, it gets
a reply and the engine carries on.

:func:`handle_request` is pure (bytes and parameters in, reply and parameters out), for
tests; :class:`ControlSocket` is the engine's side, :func:`request` the controller's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import socket
import tempfile
import time
from typing import Any, Iterator

from netbench.emulation.delay_queue import shown_value, dest_params_from_dict

MAX_DATAGRAM = 65536  # a table of 63 destinations is ~6 KB of JSON
MAX_PAIRS = 4096  # destinations in one table (a testbed has at most 63 others)
SET_FIELDS = ("delay_us", "jitter_us", "loss", "seed", "pairs")
MAX_UNIX_PATH = 100  # sun_path is 108 bytes; longer paths go through /proc/self/fd


class ControlError(ValueError):
    """A control request the engine refuses (its message is the reply's one-line error)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_fields(msg: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(msg) - {"op", "id", *SET_FIELDS})
    if unknown:
        raise ControlError(f"unknown field(s) {', '.join(unknown)[:200]}; a set takes {', '.join(SET_FIELDS)}")
    if "delay_us" not in msg:
        raise ControlError("set needs delay_us")
    fields = {}
    for name in SET_FIELDS:
        if name not in msg:
            continue
        value = msg[name]
        if name == "pairs":
            if not isinstance(value, list) or not 0 < len(value) <= MAX_PAIRS:
                raise ControlError(f"pairs must be a non-empty list of at most {MAX_PAIRS} destinations, "
                                   f"got {shown_value(value)}")
            try:
                value = tuple(dest_params_from_dict(item) for item in value)
            except ValueError as exc:
                raise ControlError(f"pairs: {exc}") from None
        elif name == "loss":
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
                raise ControlError(f"loss must be a number in [0, 1], got {shown_value(value)}")
            if not 0 <= value <= 1:  # compared as is: float() of a 400-digit int would overflow
                raise ControlError(f"loss must be a ratio in [0, 1], got {shown_value(value)}")
            value = float(value)
        elif not _is_int(value):
            raise ControlError(f"{name} must be an integer, got {shown_value(value)}")
        fields[name] = value
    fields.setdefault("pairs", ())  # no table given: one profile for every destination
    return fields


def _request_id(value: Any) -> Any:
    """The id a reply echoes: a short string or an int of at most 64 bits; anything else is
    not echoed (it could not be encoded, or would make the reply too long to send)."""
    if isinstance(value, str) and len(value) <= 100:
        return value
    if _is_int(value) and value.bit_length() <= 64:
        return value
    return None


def handle_request(data: bytes, params: Any) -> tuple[dict[str, Any], Any | None]:
    """Answer one datagram given the engine's current ``params`` (an EngineParams).

    Returns (reply, new params or None when they do not change). Never raises: a bad
    request, whatever it holds (an integer of 5,000 digits, JSON nested 100,000 deep, a
    delay of 10**400 us), gets ``{"ok": false, "error": ...}`` and the engine carries on.
    """
    request_id = None
    try:
        try:
            msg = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: an int over 4,300 digits
            raise ControlError(f"not a JSON object: {str(exc)[:100]}") from None
        if not isinstance(msg, dict):
            raise ControlError(f"not a JSON object: {type(msg).__name__}")
        request_id = _request_id(msg.get("id"))
        op = msg.get("op")
        if op == "ping":
            return {"ok": True, "id": request_id, "params": params.as_dict()}, None
        if op != "set":
            raise ControlError(f"unknown op {shown_value(op)}; known: ping, set")
        try:
            new = dataclasses.replace(params, **_checked_fields(msg))  # EngineParams validates
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        return {"ok": True, "id": request_id, "params": new.as_dict()}, new
    except ControlError as exc:
        return {"ok": False, "id": request_id, "error": str(exc)}, None
    except Exception as exc:  # noqa: BLE001 - no datagram may stop the engine
        return {"ok": False, "id": request_id, "error": f"bad request ({type(exc).__name__})"}, None


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True).encode("utf-8")


@contextlib.contextmanager
def _short_path(path: str) -> Iterator[str]:
    """``path`` itself, or one through /proc/self/fd when it is too long for sun_path."""
    if len(os.fsencode(path)) <= MAX_UNIX_PATH:
        yield path
        return
    head, name = os.path.split(os.path.abspath(path))
    fd = os.open(head, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def _private_dir(near: str) -> str:
    """A new folder only this user may enter (mode 0700, a name no one can guess) in folder
    `near`, or in the temp folder when a socket path in `near` would be too long."""
    private = tempfile.mkdtemp(prefix=".nb-", dir=near)
    if len(os.fsencode(os.path.join(private, "c.sock"))) <= MAX_UNIX_PATH:
        return private
    os.rmdir(private)
    return tempfile.mkdtemp(prefix="netbench-")


def bind_unix(sock: socket.socket, path: str) -> None:
    """Bind ``sock`` at ``path`` with mode 0600, with no window in which it has a wider mode
    and no change of the umask (process-wide: it would reach files other threads create
    meanwhile): bound in a private 0700 folder beside ``path``, made 0600 there, then
    renamed into place (replacing a stale file). A peer finds a socket by its file, so the
    rename keeps it reachable; only a socket others send to is bound this way (a client's
    address, which peers reply to, stays where it was bound: see request_many)."""
    head, _ = os.path.split(os.path.abspath(path))
    private = tempfile.mkdtemp(prefix=".nb-", dir=head)
    try:
        inner = os.path.join(private, "s")
        with _short_path(inner) as short:
            sock.bind(short)
        os.chmod(inner, 0o600)
        os.replace(inner, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(private, "s"))
        os.rmdir(private)


class ControlSocket:
    """The engine's end: a non-blocking datagram socket at ``path``, removed on close."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            bind_unix(self.sock, path)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> tuple[bytes, Any] | None:
        """One pending (datagram, sender address), or None when there is none."""
        try:
            return self.sock.recvfrom(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            return None

    def reply(self, address: Any, reply: dict[str, Any]) -> None:
        """Send ``reply`` to ``address``; a sender without an address or gone is skipped."""
        if not address:
            return
        with contextlib.suppress(OSError, ValueError):  # ValueError: a reply that cannot be encoded
            self.sock.sendto(encode(reply), address)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def request(path: str, message: dict[str, Any], timeout_s: float = 1.0,
            client_dir: str | None = None) -> dict[str, Any]:
    """Send ``message`` to the engine's control socket at ``path`` and return its reply.

    The client socket is bound in a private folder (mode 0700, made for this request) in
    ``client_dir`` (default: next to ``path``; the temp dir when that name would be too long
    for a socket address) so the engine, in any network namespace, can answer; both are
    removed before returning. Raises
    FileNotFoundError / ConnectionRefusedError when nothing listens at ``path``,
    TimeoutError when no reply comes in ``timeout_s``.
    """
    (result,) = request_many([(path, message)], timeout_s, client_dir)
    if isinstance(result, BaseException):
        raise result
    return result


# requests in flight at once on one client socket: the replies queue there, and a unix
# datagram socket queues at most net.unix.max_dgram_qlen (10 by default) datagrams: an engine
# whose reply finds the queue full would lose it (its socket does not block)
MAX_IN_FLIGHT = 8
# client sockets of one request_many: 64 requests in flight, so a testbed's 64 engines are all
# asked at once (with one socket, each engine waited for the controller to read a reply)
MAX_CLIENTS = 8


def spread(count: int, in_flight: int = MAX_IN_FLIGHT, clients: int = MAX_CLIENTS) -> list[list[int]]:
    """Which of `count` requests each client socket sends, in order: as few sockets as let
    them all be in flight at once (at most `clients`), the requests dealt round-robin."""
    sockets = max(1, min(clients, -(-count // in_flight)))
    return [list(range(k, count, sockets)) for k in range(sockets)]


def request_many(messages: list[tuple[str, dict[str, Any]]], timeout_s: float = 1.0,
                 client_dir: str | None = None) -> list[dict[str, Any] | BaseException]:
    """`request` to several engines at once: from up to MAX_CLIENTS client sockets, each with
    up to MAX_IN_FLIGHT requests out (a reply lets its socket's next request go), so up to 64
    engines answer in about one's time. Each result is the reply, or the exception `request`
    would have raised for it; `timeout_s` bounds the wait for each reply."""
    if not messages:
        return []
    first = messages[0][0]
    # a folder only this user may enter, under a name no one can guess: no one else can
    # put a file or a link where the client binds, nor send it replies
    private = _private_dir(client_dir or os.path.dirname(os.path.abspath(first)))
    results: list[dict[str, Any] | BaseException | None] = [None] * len(messages)
    queues = [list(reversed(order)) for order in spread(len(messages))]
    waiting: list[dict[Any, tuple[int, float]]] = [{} for _ in queues]  # per socket: id -> (index, deadline)
    socks: list[socket.socket] = []
    try:
        for k in range(len(queues)):
            socks.append(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
            socks[k].bind(os.path.join(private, f"c{k}.sock"))
        while any(queues) or any(waiting):
            for sock, pending, out in zip(socks, queues, waiting):
                _send_up_to(sock, pending, out, messages, results, timeout_s)
            if not any(waiting):
                continue
            now = time.monotonic()
            for out in waiting:
                for key, (i, deadline) in list(out.items()):
                    if deadline <= now:
                        results[i] = TimeoutError(f"no reply from {messages[i][0]} within {timeout_s:g}s")
                        del out[key]
            left = min((deadline for out in waiting for _, deadline in out.values()), default=now) - now
            if left <= 0:
                continue
            for sock in select.select([s for s, out in zip(socks, waiting) if out], [], [], left)[0]:
                out = waiting[socks.index(sock)]
                reply = json.loads(sock.recv(MAX_DATAGRAM).decode("utf-8"))
                found = out.pop(reply.get("id"), None)
                if found is not None:
                    results[found[0]] = reply
    finally:
        for k, sock in enumerate(socks):
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(private, f"c{k}.sock"))
        os.rmdir(private)
    return results  # type: ignore[return-value]


def _send_up_to(sock: socket.socket, pending: list[int], out: dict[Any, tuple[int, float]],
                messages: list[tuple[str, dict[str, Any]]], results: list, timeout_s: float) -> None:
    """Send `pending`'s next requests (popped from its end) on `sock` until MAX_IN_FLIGHT are
    out; one that finds no engine gets that error as its result."""
    while pending and len(out) < MAX_IN_FLIGHT:
        i = pending.pop()
        path, message = messages[i]
        try:
            with _short_path(path) as short:
                sock.sendto(encode(message), short)
            out[message.get("id")] = (i, time.monotonic() + timeout_s)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            results[i] = exc


def serve_pending(control: ControlSocket, get_params, apply) -> int:
    """Answer every pending datagram on ``control``; ``apply(params)`` is called for each
    accepted set before its reply goes out. Returns how many sets were applied."""
    applied = 0
    while (received := control.receive()) is not None:
        data, address = received
        reply, new = handle_request(data, get_params())
        if new is not None:
            try:
                apply(new)
                applied += 1
            except Exception as exc:  # noqa: BLE001 - refused, the engine keeps its parameters and runs on
                reply = {"ok": False, "id": reply.get("id"), "error": f"cannot apply: {type(exc).__name__}: "
                                                                      f"{str(exc)[:100]}"}
        control.reply(address, reply)
    return applied
