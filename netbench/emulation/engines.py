"""Delay engine processes (the userspace backend): start, wait until ready, reconfigure in
place, stop, read stats.

Each engine is `python -m netbench.emulation.engine` in a node's namespace; its pid and start
time are journaled before anything waits on it, so a reset finds it after any crash. Each
listens on a control socket, `<state>/engines/<netns>-q<queue>.ctl`, through which a profile
change reaches it without a restart (engine_control.py); a reset removes the whole folder.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from netbench import proc
from netbench.emulation import engine_control
from netbench.errors import EmulationError

ENGINE_RT_PRIORITY = 10


def engine_rt_priority() -> int:
    """The SCHED_FIFO priority an engine asks for: ENGINE_RT_PRIORITY for root; without root, what
    RLIMIT_RTPRIO allows this user (most hosts: none, so normal scheduling; the delay error
    under load is then larger: docs/guide/without-root.md)."""
    from netbench.state import places

    if places.privilege(os.environ, os.geteuid()) == places.ROOT:
        return ENGINE_RT_PRIORITY
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
    except (OSError, ValueError):
        return 0
    return ENGINE_RT_PRIORITY if soft == resource.RLIM_INFINITY else min(ENGINE_RT_PRIORITY, max(0, soft))
_request_ids = itertools.count(1)


class Engines:
    """Delay engine processes, one per node namespace; their state lives in the state dir."""

    READY_TIMEOUT_S = 15.0
    CONTROL_TIMEOUT_S = 1.0

    def __init__(self, state_dir: Path, detach: bool = False) -> None:
        self.dir = state_dir / "engines"
        self.detach = detach  # True: engines outlive this command (netbench apply)

    def _paths(self, netns: str, queue_num: int) -> tuple[Path, Path, Path]:
        stem = f"{netns}-q{queue_num}"
        return self.dir / f"{stem}.json", self.dir / f"{stem}.out", self.dir / f"{stem}.log"

    def control_path(self, netns: str, queue_num: int) -> Path:
        """Where the engine serving `queue_num` in `netns` listens for changes."""
        return self.dir / f"{netns}-q{queue_num}.ctl"

    def start(self, netns: str, queue_num: int, delay_us: int, jitter_us: int, loss: float,
              seed: int, journal, pairs: tuple = ()) -> int:
        """Start the engine; `pairs` (delay_queue.DestParams): its per-destination table, written
        to `<netns>-q<queue>.pairs.json` beside its stats (delay/jitter/loss are then the default)."""
        stats, out, log = self._paths(netns, queue_num)
        ctl = self.control_path(netns, queue_num)
        table = self.dir / f"{netns}-q{queue_num}.pairs.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in (stats, out, table):
            path.unlink(missing_ok=True)
        # a stale `ctl` is replaced by the engine once it holds the queue: a second engine on
        # a queue still served fails before it, and leaves the live engine's socket alone
        argv = [sys.executable, "-m", "netbench.emulation.engine", "--queue-num", str(queue_num),
                "--delay-us", str(delay_us), "--jitter-us", str(jitter_us), "--loss", repr(loss),
                "--seed", str(seed), "--stats-file", str(stats), "--control", str(ctl),
                # SCHED_FIFO: on a busy host the delay error comes from the engine waiting
                # for a CPU, not from its own speed (see bench/engine_ceiling.py)
                "--rt-priority", str(engine_rt_priority())]
        if pairs:
            table.write_text(json.dumps({"pairs": [pair.as_dict() for pair in pairs]}, sort_keys=True))
            argv += ["--pairs-file", str(table)]
        with open(out, "wb") as out_fh, open(log, "ab") as log_fh:
            child = proc.spawn(argv, netns=netns, stdout=out_fh, stderr=log_fh,
                               die_with_parent=not self.detach,
                               env={"PYTHONPATH": proc.child_pythonpath()})
        journal.record("process", pid=child.pid, start=proc.start_time(child.pid), netns=netns,
                       queue=queue_num, role="engine")
        self._wait_ready(child, out, log, netns)
        return child.pid

    def _wait_ready(self, child, out: Path, log: Path, netns: str) -> None:
        deadline = time.monotonic() + self.READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in out.read_text(errors="replace").splitlines():
                try:
                    if json.loads(line).get("event") == "ready":
                        return
                except (json.JSONDecodeError, AttributeError):
                    continue
            if child.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()
                raise EmulationError(f"{netns}: delay engine exited with {child.returncode}: "
                                     f"{tail[-1] if tail else 'no output'}", hint=f"see {log}")
            time.sleep(0.01)
        proc.stop(child)
        raise EmulationError(f"{netns}: delay engine not ready after {self.READY_TIMEOUT_S:g}s", hint=f"see {log}")

    def _entries(self, netns: str, queue_num: int, journal) -> list:
        """The journal's pending process entries of the engine(s) serving `queue_num` in `netns`."""
        return [entry for entry in journal.pending()
                if entry.kind == "process" and entry.data.get("role") == "engine"
                and entry.data.get("netns") == netns and entry.data.get("queue") == queue_num]

    def stop(self, netns: str, queue_num: int, journal) -> bool:
        """Stop the engine serving `queue_num` in `netns` (TERM releases held packets, then KILL)."""
        stopped = False
        for entry in self._entries(netns, queue_num, journal):
            pid, started = entry.data["pid"], entry.data.get("start")
            if proc.is_same_process(pid, started):
                proc.stop_pids([pid], grace=3.0)
                stopped = True
            journal.done(entry)
        self.control_path(netns, queue_num).unlink(missing_ok=True)  # left behind by a KILL
        return stopped

    def lost(self, journal) -> list[str]:
        """One line per engine the journal holds as running whose process is gone (it died or
        was killed: its NFQUEUE rule drops the node's traffic from then on)."""
        return [f"the delay engine on queue {e.data.get('queue')} in {e.data.get('netns')} (pid {e.data['pid']}) "
                f"died; see {self._paths(e.data.get('netns'), e.data.get('queue'))[2]}"
                for e in journal.pending() if e.kind == "process" and e.data.get("role") == "engine"
                and not proc.is_running(e.data["pid"], e.data.get("start"))]

    def reconfigure(self, netns: str, queue_num: int, delay_us: int, jitter_us: int, loss: float,
                    seed: int, journal, pairs: tuple = ()) -> bool:
        """Change the live engine's parameters in place, for packets arriving from now on.

        Held packets keep their release time. True once the engine confirmed (its stats,
        hence `read`, show the new parameters engine.STATS_AFTER_SET_S later: its answer does
        not wait on its stats file); False when no live engine with a
        control socket serves `queue_num` in `netns` (the caller then starts one).
        Raises EmulationError when the engine refuses the change or does not answer.
        """
        (taken,) = self.reconfigure_many([(netns, queue_num, delay_us, jitter_us, loss, seed, pairs)], journal)
        return taken

    def reconfigure_many(self, changes: list[tuple], journal) -> list[bool]:
        """`reconfigure` for several engines at once, (netns, queue_num, delay_us, jitter_us,
        loss, seed[, pairs]) each: every request goes out before any reply is awaited. One False
        per engine that is not live (the caller starts it); EmulationError on the first refusal."""
        results = [False] * len(changes)
        messages: list[tuple[str, dict[str, Any]]] = []
        sent: list[int] = []
        engines: dict[tuple[str, int], list] = {}  # the journal read once for every engine
        for entry in journal.pending():
            if entry.kind == "process" and entry.data.get("role") == "engine":
                engines.setdefault((entry.data.get("netns"), entry.data.get("queue")), []).append(entry)
        for i, (netns, queue_num, delay_us, jitter_us, loss, seed, *rest) in enumerate(changes):
            if any(proc.is_running(e.data["pid"], e.data.get("start")) for e in engines.get((netns, queue_num), [])):
                message = {"op": "set", "delay_us": int(delay_us), "jitter_us": int(jitter_us),
                           "loss": float(loss), "seed": int(seed), "id": next(_request_ids)}
                if rest and rest[0]:
                    message["pairs"] = [pair.as_dict() for pair in rest[0]]
                messages.append((str(self.control_path(netns, queue_num)), message))
                sent.append(i)
        try:
            replies = engine_control.request_many(messages, timeout_s=self.CONTROL_TIMEOUT_S)
        except FileNotFoundError:  # no engines folder: no control socket to ask (engines from before them)
            return results
        except (OSError, ValueError) as exc:  # the client socket, or a reply that is not JSON
            raise EmulationError(f"delay engines did not take the change: {exc}",
                                 hint=f"see the logs in {self.dir}; `netbench reset` stops them") from None
        for i, reply in zip(sent, replies):
            netns, queue_num = changes[i][:2]
            log = self._paths(netns, queue_num)[2]
            if isinstance(reply, (FileNotFoundError, ConnectionRefusedError)):
                continue  # an engine from before control sockets, or one that lost its socket
            if isinstance(reply, BaseException):
                raise EmulationError(f"{netns}: delay engine on queue {queue_num} did not take the change: {reply}",
                                     hint=f"see {log}; `netbench reset` stops it")
            if not reply.get("ok"):
                raise EmulationError(f"{netns}: delay engine on queue {queue_num} refused the change: "
                                     f"{reply.get('error')}", hint=f"see {log}")
            results[i] = True
        return results

    def read(self, netns: str, queue_num: int) -> dict[str, Any] | None:
        """The engine's last stats (params, counters) if its process is alive."""
        stats, out, _ = self._paths(netns, queue_num)
        try:
            data = json.loads(stats.read_text())
        except (OSError, json.JSONDecodeError):
            data = _ready_line(out)  # stats are written ~1/s; right after start, the ready line
            if data is None:
                return None
        pid = data.get("pid")
        data["alive"] = bool(pid) and proc.start_time(int(pid)) is not None
        return data


def _ready_line(path: Path) -> dict[str, Any] | None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("event") == "ready":
            return event
    return None
