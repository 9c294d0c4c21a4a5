"""The controller's end of `netbench node serve` (serve.py): one SSH session channel per host,
kept open for a schedule, one JSON line per request and per reply.

`open_agents` starts `node serve` on every host at once and pings it; a host whose netbench
has no `serve` (an older one: the command fails before any reply) gets no channel, and the
caller falls back to a `netbench node apply` per change there. Each request waits for its
reply with a deadline; a channel that misses one, or whose host is gone, is closed and left
out from then on, so a late reply is never read as the answer to a later request.
"""

from __future__ import annotations

import collections
import json
import queue
import time
import threading
from typing import Any, Sequence

from netbench.emulation import changes as ch
from netbench.emulation.wire import plan_to_json
from netbench.errors import TestbedError
from netbench.remote.inventory import Host, Inventory
from netbench.remote.ssh import HostConnection

START_TIMEOUT_S = 30.0  # `node serve` starting (a Python start, over SSH) and answering its first ping
REQUEST_TIMEOUT_S = 30.0  # one change on a host: milliseconds, unless the host is in trouble
BYE_TIMEOUT_S = 3.0


class AgentChannel:
    """One host's `netbench node serve`, over `stream` (ssh.ChannelCommand or a fake: stdout
    lines, write() to its stdin). Requests go one at a time (a lock); `alive` is False once
    the channel was closed or broke."""

    def __init__(self, name: str, stream: Any) -> None:
        self.name = name
        self.stream = stream
        self.alive = True
        self.pid: int | None = None
        self._next_id = 0
        self._lock = threading.Lock()
        self._lines: queue.Queue = queue.Queue()
        self.stderr: collections.deque[str] = collections.deque(maxlen=20)  # its last lines there
        threading.Thread(target=self._read, name=f"netbench-agent-{name}", daemon=True).start()
        self._stderr_thread = threading.Thread(target=self._read_stderr, name=f"netbench-agent-{name}-err",
                                               daemon=True)
        self._stderr_thread.start()

    def _read(self) -> None:
        try:
            for line in iter(self.stream.stdout.readline, b""):
                self._lines.put(line)
        except (OSError, ValueError, EOFError):
            pass
        self._lines.put(None)  # EOF: the agent ended (or never started)

    def _read_stderr(self) -> None:
        # drained, so an agent's warnings can never fill the channel's window and stall it
        try:
            for line in iter(self.stream.stderr.readline, b""):
                self.stderr.append(line.decode("utf-8", "replace").strip())
        except (OSError, ValueError, EOFError, AttributeError):
            pass

    def request(self, op: str, timeout: float = REQUEST_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply (an {"ok": ...} object); TestbedError naming
        the host if the channel is gone, the reply does not come within `timeout` seconds, or
        is not JSON (the channel is then closed)."""
        with self._lock:
            if not self.alive:
                raise TestbedError(f"host {self.name}: its netbench node serve channel is closed")
            self._next_id += 1
            request_id = self._next_id
            try:
                self.stream.write((json.dumps({"op": op, "id": request_id, **fields}) + "\n").encode())
            except (OSError, EOFError, ValueError) as exc:
                self._broken()
                raise TestbedError(f"host {self.name}: connection lost: {exc or type(exc).__name__}") from None
            deadline = time.monotonic() + timeout
            while True:
                try:
                    line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    self._broken()
                    raise TestbedError(f"host {self.name}: netbench node serve: no answer to {op} within {timeout:g}s",
                                       hint="the host or its connection stalled; with a lease it reverts by itself "
                                            "when the lease runs out") from None
                if line is None:
                    self._broken()
                    self._stderr_thread.join(1.0)  # its last words, if it had any
                    said = next((line for line in reversed(self.stderr) if line), "")
                    raise TestbedError(f"host {self.name}: netbench node serve ended before answering {op}"
                                       + (f": {said}" if said else ""))
                try:
                    reply = json.loads(line)
                except json.JSONDecodeError:
                    self._broken()
                    raise TestbedError(f"host {self.name}: netbench node serve answered "
                                       f"{line.decode('utf-8', 'replace').strip()[:120]!r}, not JSON") from None
                if isinstance(reply, dict) and reply.get("id") == request_id:
                    return reply
                # an older request's reply (it was given up on): not this one's

    def apply(self, plan: list[ch.Change], lease_s: float, force: bool, holder: str | None,
              takeover: bool) -> dict[str, Any]:
        """One change on this host: `node apply`'s answer, or a RemoteError with the host's
        own error, hint and exit code (its change already undone there)."""
        from netbench.remote.controller import RemoteError, answer_problem

        reply = self.request("apply", plan=json.loads(plan_to_json(plan)), lease_s=lease_s, force=force,
                             holder=holder, takeover=takeover)
        if not reply.get("ok"):
            code = reply.get("exit_code")
            raise RemoteError(f"host {self.name}: {reply.get('error') or 'apply failed'}", hint=reply.get("hint"),
                              exit_code=code if isinstance(code, int) else 1)
        problem = answer_problem("apply", reply)
        if problem:
            raise RemoteError(f"host {self.name}: 'netbench node serve' answered apply with JSON of the wrong "
                              f"shape: {problem}", hint="is netbench there this controller's version?")
        return reply

    def _broken(self) -> None:
        self.alive = False
        try:
            self.stream.close()
        except Exception:  # noqa: BLE001 - closing a broken channel: nothing left to do
            pass

    def close(self, timeout: float = BYE_TIMEOUT_S) -> None:
        """Say bye, close its stdin (EOF ends the loop too), wait a little, close the channel."""
        if not self.alive:
            return
        try:
            self.request("bye", timeout=timeout)
        except TestbedError:
            pass
        try:
            self.stream.close_stdin()
            self.stream.exit_status(timeout)
        except Exception:  # noqa: BLE001 - the agent is gone either way
            pass
        self._broken()


def open_agent(conn: HostConnection, host: Host, timeout: float = START_TIMEOUT_S) -> AgentChannel | None:
    """Start `netbench node serve` on `host` and ping it; None when the host cannot serve
    (an older netbench, a missing one, no root): the caller uses `node apply` there."""
    from netbench.remote.controller import node_command

    stream = conn.start(node_command(host, ["serve"]))
    agent = AgentChannel(host.name, stream)
    try:
        reply = agent.request("ping", timeout=timeout)
    except TestbedError:
        agent._broken()
        return None
    if not reply.get("ok") or "apply" not in reply.get("ops", []):
        agent.close()
        return None
    agent.pid = reply.get("pid") if isinstance(reply.get("pid"), int) else None
    return agent


def open_agents(inventory: Inventory, conns: Sequence[HostConnection],
                timeout: float = START_TIMEOUT_S) -> dict[str, AgentChannel]:
    """A serving channel per host that can have one (in parallel); host name -> channel."""
    from netbench.remote.controller import in_parallel

    by_name = {h.name: h for h in inventory.hosts}
    results = in_parallel(conns, lambda c: open_agent(c, by_name[c.name], timeout))
    return {name: agent for name, agent in results.items() if isinstance(agent, AgentChannel)}


def close_agents(agents: dict[str, AgentChannel]) -> None:
    """Close every channel, all at once."""
    threads = [threading.Thread(target=agent.close, daemon=True) for agent in agents.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BYE_TIMEOUT_S * 2 + 1)
