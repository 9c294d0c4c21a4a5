"""An in-memory HostConnection (netbench/testbed/remote.py) for pure tests of remote mode.

A FakeHost records every command and answers from `responses`: a list of
(substring, CommandResult or callable(command, input) -> CommandResult) pairs, first match
wins; anything unmatched answers exit 127 ("command not found"), as a shell would.
"""

from __future__ import annotations

import json
from typing import Callable

from netbench.testbed.remote import CommandResult

Responder = CommandResult | Callable[[str, str | None], CommandResult]


def ok_json(data) -> CommandResult:
    return CommandResult(0, json.dumps(data), "")


def failed(message: str, exit_code: int = 1) -> CommandResult:
    return CommandResult(exit_code, "", f"error: {message}\nhint: something to do\n")


class FakeHost:
    def __init__(self, name: str, responses: list[tuple[str, Responder]] | None = None) -> None:
        self.name = name
        self.responses = list(responses or [])
        self.commands: list[tuple[str, str | None]] = []
        self.puts: list[tuple[str, str]] = []
        self.closed = False

    def run(self, command: str, *, input: str | None = None, timeout: float | None = None) -> CommandResult:
        self.commands.append((command, input))
        for needle, answer in self.responses:
            if needle in command:
                return answer(command, input) if callable(answer) else answer
        return CommandResult(127, "", f"sh: 1: {command.split()[0]}: not found")

    def put(self, local, remote: str) -> None:
        self.puts.append((str(local), remote))

    def close(self) -> None:
        self.closed = True

    def ran(self, needle: str) -> list[tuple[str, str | None]]:
        return [(c, i) for c, i in self.commands if needle in c]
