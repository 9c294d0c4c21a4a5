"""`netbench node serve`: a host's agent for the length of a schedule, over one SSH channel.

`netbench node apply` starts a Python process per change (imports, a netlink socket per
namespace, the control-path lookup): seconds on a small host. `node serve` pays that once:
it reads one JSON request per line on stdin and writes one JSON reply per line on stdout
until stdin closes (the controller is done, or gone) or a hangup arrives.

Requests (`id` is optional and echoed back, so a controller can match replies):

    {"op": "ping", "id": 1}
    {"op": "apply", "id": 2, "plan": {"version": 1, "changes": [...]}, "lease_s": 60,
     "force": false, "holder": "...", "takeover": false}
    {"op": "bye", "id": 3}

`apply` is `netbench node apply`'s payload and semantics (agent.apply_plan: the control-path
guard, the lease and its watcher, the journal lock per change, in-place planning against the
journal, a failed change undone), made with one executor whose netlink sockets stay open.
Replies are {"ok": true, "id": ..., ...} or {"ok": false, "id": ..., "error": ..., "hint": ...};
an error never ends the loop. The lease watcher reverts the host when the lease runs out,
whether or not this process is still there.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import IO, Any, Callable

from netbench import __version__
from netbench.errors import NetbenchError, UsageError
from netbench.state.journal import Journal

OPS = ("apply", "ping", "bye")
MAX_LINE = 16 * 1024 * 1024  # one request: a plan is a few KiB


class _Hangup(Exception):
    """SIGHUP while waiting for the next request: the controller's session is gone."""


def parse_request(line: str) -> dict[str, Any]:
    """One request line as an object with a known `op` (pure); UsageError otherwise."""
    return check_request(decode_request(line))


def decode_request(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"request: not JSON: {exc.msg} at column {exc.colno}",
                         hint="send one JSON object per line") from None


def check_request(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UsageError("request: expected a JSON object", hint="send one JSON object per line")
    op = data.get("op")
    if op not in OPS:
        raise UsageError(f"request: unknown op {op!r} (this netbench serves {', '.join(OPS)})",
                         hint="the host's netbench differs from the controller's: run 'netbench provision'")
    return data


def _flag(data: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = data.get(key, default)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 86400
        if not ok:
            raise UsageError(f"request: apply: {key} must be a number of seconds from 0 to 86400, got {value!r}")
        return float(value)
    if value is not None and not isinstance(value, kind):
        raise UsageError(f"request: apply: {key} must be {kind.__name__}, got {value!r}")
    return value


def apply_request(data: dict[str, Any], journal: Journal, executor: Any,
                  environ: dict[str, str] | None) -> dict[str, Any]:
    """An `apply` request made on this host (agent.apply_plan with `executor`)."""
    from netbench.emulation.wire import plan_from_json
    from netbench.remote.agent import apply_plan

    if not isinstance(data.get("plan"), dict):
        raise UsageError("request: apply: 'plan' must be an object {\"version\": 1, \"changes\": [...]}")
    plan = plan_from_json(json.dumps(data["plan"]))
    return apply_plan(plan, journal, lease_s=_flag(data, "lease_s", float, 0.0),
                      force=bool(_flag(data, "force", bool, False)), holder=_flag(data, "holder", str, None),
                      takeover=bool(_flag(data, "takeover", bool, False)), environ=environ, executor=executor)


def error_reply(exc: BaseException) -> dict[str, Any]:
    """An error as a reply (pure): its message, hint and the exit code `node apply` would have."""
    if isinstance(exc, NetbenchError):
        return {"ok": False, "error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}".rstrip(": "), "hint": None, "exit_code": 1}


def answer(line: str, journal: Journal, executor: Any, environ: dict[str, str] | None) -> dict[str, Any]:
    """The reply to one request line; never raises (but for KeyboardInterrupt and friends)."""
    request_id = None
    try:
        data = decode_request(line)
        request_id = data.get("id") if isinstance(data, dict) else None
        check_request(data)
        if data["op"] == "ping":
            reply = {"ok": True, "op": "ping", "netbench": __version__, "pid": os.getpid(), "ops": list(OPS)}
        elif data["op"] == "bye":
            reply = {"ok": True, "op": "bye"}
        else:
            reply = {"ok": True, "op": "apply", **apply_request(data, journal, executor, environ)}
    except Exception as exc:  # noqa: BLE001 - every failure is a reply; the loop goes on
        reply = error_reply(exc)
    reply["id"] = request_id
    return reply


def serve(journal: Journal, stdin: IO[str], stdout: IO[str], *, environ: dict[str, str] | None = None,
          make_executor: Callable[[Journal], Any] | None = None) -> int:
    """Answer requests from `stdin` on `stdout` until EOF, `bye`, or a hangup (SIGHUP, when
    this runs in the main thread: taken at once while waiting, after the change in hand while
    applying). The executor (default: the kernel's, sockets held, engines detached) is made
    once and closed at the end. Returns how many requests were answered."""
    from netbench.emulation.executor import real_executor

    executor = (make_executor or (lambda j: real_executor(j, detach_engines=True, hold=True)))(journal)
    state = {"busy": False, "hangup": False}

    def on_hangup(signum, frame) -> None:
        state["hangup"] = True
        if not state["busy"]:
            raise _Hangup()

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGHUP, on_hangup)
    answered = 0
    try:
        while not state["hangup"]:
            line = stdin.readline(MAX_LINE)
            if not line:
                break  # EOF: the controller closed the channel, or is gone
            if not line.strip():
                continue
            state["busy"] = True
            try:
                reply = answer(line, journal, executor, environ)
                stdout.write(json.dumps(reply, default=str) + "\n")
                stdout.flush()
            finally:
                state["busy"] = False
            answered += 1
            if reply.get("op") == "bye":
                break
    except (_Hangup, BrokenPipeError, OSError, ValueError):
        pass  # the session is gone (a closed stdout raises ValueError): nothing left to tell
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)
        executor.close()
    return answered
