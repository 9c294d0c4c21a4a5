"""An in-memory HostConnection (netbench/testbed/remote.py) for pure tests of remote mode.

A FakeHost records every command and answers from `responses`: a list of
(substring, CommandResult or callable(command, input) -> CommandResult) pairs, first match
wins; anything unmatched answers exit 127 ("command not found"), as a shell would.
"""

from __future__ import annotations

import io
import json
import os
import threading
from typing import Callable

from netbench.remote.ssh import CommandResult

Responder = CommandResult | Callable[[str, str | None], CommandResult]


def ok_json(data) -> CommandResult:
    return CommandResult(0, json.dumps(data), "")


def failed(message: str, exit_code: int = 1) -> CommandResult:
    return CommandResult(exit_code, "", f"error: {message}\nhint: something to do\n")


class FakeStream:
    """A StreamingCommand: stdout lines through a real pipe (so readers block as on a channel).

    `running=True`: the command runs until the controller closes its stdin (then it exits
    with `code`) or `end()` is called; otherwise it has written everything and exited."""

    def __init__(self, lines: list[str] | tuple[str, ...] = (), stderr: str = "", code: int = 0,
                 running: bool = False) -> None:
        read, write = os.pipe()
        self.stdout = os.fdopen(read, "rb")
        self._write = os.fdopen(write, "wb")
        self.stderr = io.BytesIO(stderr.encode())
        self.code = code
        self.stdin_closed = False
        self.closed = False
        self.input: list[str] = []
        self._done = threading.Event()
        self.emit(*lines)
        if not running:
            self.end(code)

    def write(self, data: bytes) -> None:
        """What the controller sends to the command's stdin (kept in `input`)."""
        self.input.append(data.decode())

    def emit(self, *lines: str) -> None:
        self._write.write("".join(line + "\n" for line in lines).encode())
        self._write.flush()

    def end(self, code: int) -> None:
        self.code = code
        if not self._write.closed:
            self._write.close()
        self._done.set()

    def close_stdin(self) -> None:
        self.stdin_closed = True
        self.end(self.code)

    def exit_status(self, timeout: float | None) -> int | None:
        return self.code if self._done.wait(timeout) else None

    def close(self) -> None:
        self.closed = True


class FakeServe(FakeStream):
    """A `netbench node serve` channel: each request line written to it goes to `handler`
    (request -> reply object, or None: no answer, as a host that hangs), whose reply comes
    back as one line with the request's id. `requests` holds every request, in order; bye
    and a closed stdin end it (exit 0)."""

    def __init__(self, handler: Callable[[dict], dict | None]) -> None:
        super().__init__(running=True)
        self.handler = handler
        self.requests: list[dict] = []

    def write(self, data: bytes) -> None:
        if self._write.closed:
            raise OSError("channel closed")
        super().write(data)
        for line in data.decode().splitlines():
            request = json.loads(line)
            self.requests.append(request)
            reply = self.handler(request)
            if reply is not None:
                self.emit(json.dumps({**reply, "id": request.get("id")}))
            if request.get("op") == "bye":
                self.end(0)

    def close(self) -> None:
        super().close()
        self.end(self.code)  # the channel's reader sees EOF, as on a closed SSH channel

    def ops(self) -> list[str]:
        return [request["op"] for request in self.requests]


def serve_handler(apply: Callable[[dict], dict] | None = None) -> Callable[[dict], dict | None]:
    """A handler for FakeServe: ping and bye answered as `node serve` does, apply by `apply`
    (default: applied, nothing to say)."""
    def handle(request: dict) -> dict | None:
        if request["op"] == "ping":
            return {"ok": True, "op": "ping", "pid": 4321, "ops": ["apply", "ping", "bye"]}
        if request["op"] == "bye":
            return {"ok": True, "op": "bye"}
        return {"ok": True, "op": "apply", **(apply(request) if apply else {"applied": []})}
    return handle


def task_stream(pid: int, *lines: str, **kwargs) -> FakeStream:
    """What `netbench node task` sends: its pid line, then the process's lines."""
    return FakeStream([f"netbench-task pid={pid}", *lines], **kwargs)


class FakeHost:
    def __init__(self, name: str, responses: list[tuple[str, Responder]] | None = None,
                 streams: list[tuple[str, Callable[[str], FakeStream]]] | None = None) -> None:
        self.name = name
        self.responses = list(responses or [])
        self.streams = list(streams or [])  # (substring, command -> FakeStream), first match wins
        self.started: list[tuple[str, FakeStream]] = []
        self.commands: list[tuple[str, str | None]] = []
        self.puts: list[tuple[str, str]] = []
        self.closed = False
        self.connected = True

    def run(self, command: str, *, input: str | None = None, timeout: float | None = None) -> CommandResult:
        self.commands.append((command, input))
        for needle, answer in self.responses:
            if needle in command:
                return answer(command, input) if callable(answer) else answer
        return CommandResult(127, "", f"sh: 1: {command.split()[0]}: not found")

    def start(self, command: str) -> FakeStream:
        for needle, make in self.streams:
            if needle in command:
                stream = make(command)
                self.started.append((command, stream))
                return stream
        stream = FakeStream(stderr=f"sh: 1: {command.split()[0]}: not found\n", code=127)
        self.started.append((command, stream))
        return stream

    def put(self, local, remote: str) -> None:
        self.puts.append((str(local), remote))

    def close(self) -> None:
        self.closed = True

    def ran(self, needle: str) -> list[tuple[str, str | None]]:
        return [(c, i) for c, i in self.commands if needle in c]
