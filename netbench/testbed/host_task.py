"""A job process on an SSH host, seen from the controller (a TaskProcess: jobs/launch.py).

`netbench node task` (remote/agent.py `run_task`) runs the process on the host over an SSH
channel of its own: the host journals it, relays its stdout line by line, and stops its
process group when the channel's stdin closes. `RemoteTask` is the controller's end: the
stdout stream, the exit status, stderr copied into the controller's log for it, the stop,
and a user's command's stop request carried to the host (`request_stop`: a line on the
channel's stdin, which the host writes into the rank's own control file).
"""

from __future__ import annotations

import queue
import re
import threading
from pathlib import Path

from netbench.errors import NetbenchError
from netbench.jobs.launch import TaskLost, Timeouts, copy_to_log, log_tail
from netbench.model.job import Task
from netbench.remote.inventory import Host
from netbench.remote.ssh import HostConnection, StreamingCommand

STOP_DELIVERY_S = 1.0  # what a stop request may take to reach a host's ranks (SSH, the host's write)


def task_pid(first: bytes) -> int | None:
    """The pid in `node task`'s first line ("netbench-task pid=N"); None unless N > 1 (pure):
    the controller may kill that process group, and 0, 1 or -1 there would mean far more."""
    from netbench.remote.agent import TASK_MARK

    match = re.fullmatch(rb"%s pid=([0-9]{1,10})\s*" % TASK_MARK.encode(), first)
    pid = int(match.group(1)) if match else None
    return pid if pid is not None and pid > 1 else None


def _first_line(stream: StreamingCommand, timeout: float) -> bytes | None:
    """The stream's first line, or None if none came within `timeout` seconds."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.stdout.readline()), name="netbench-task-pid",
                     daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


class RemoteTask:
    """A job process on a host (TaskProcess): stdout streamed over its SSH channel, stderr
    copied into the controller's log file for it."""

    def __init__(self, conn: HostConnection, host: Host, task: Task, log: Path, stream: StreamingCommand,
                 startup_s: float = Timeouts().startup_s) -> None:
        from netbench.remote.agent import TASK_MARK

        self.conn, self.host, self.task, self.stream = conn, host, task, stream
        self.stdout = stream.stdout
        self.pid: int | None = None
        self._log_thread = threading.Thread(target=self._copy_stderr, args=(log,), daemon=True)
        self._log_thread.start()
        first = _first_line(stream, startup_s)  # a host that accepts the channel, then hangs
        if first is None:
            stream.close()
            raise TaskLost(f"host {host.name}: cannot start {self.name}: no answer within {startup_s:g}s")
        if first.startswith(TASK_MARK.encode()) and task_pid(first) is None:
            stream.close()
            shown = first.decode("utf-8", "replace").strip()[:80]
            raise TaskLost(f"host {host.name}: cannot start {self.name}: it sent {shown!r}, "
                           f"not '{TASK_MARK} pid=N' with N > 1")
        if not first.startswith(TASK_MARK.encode()):
            code = stream.exit_status(5.0)
            self._log_thread.join(timeout=5.0)
            detail = log_tail(log) or (f"exit status {code}" if code not in (None, -1) else "no answer")
            if code == 127 and not log_tail(log):
                detail = "netbench is not installed there (run 'netbench provision --inventory ...')"
            if not conn.connected:
                detail = "SSH connection lost"
            stream.close()
            raise TaskLost(f"host {host.name}: cannot start {self.name}: {detail}")
        self.pid = task_pid(first)

    stop_delivery_s = STOP_DELIVERY_S  # jobs/user.py: a stop request's margin covers it

    def request_stop(self, at: int) -> None:
        """Carry a user's command's stop request (stop_requested() true after `at` steps) to
        the host: `node task` writes it into the rank's own control file there."""
        from netbench.remote.task_setup import STOP_LINE

        try:
            self.stream.write(f"{STOP_LINE} {at}\n".encode())
        except (OSError, EOFError):
            pass  # the channel is gone: the stop that follows ends the rank

    def exited(self, timeout: float) -> int | None:
        """`node task`'s exit status within `timeout` s (None: still running)."""
        return self.stream.exit_status(timeout)

    @property
    def name(self) -> str:
        return f"{self.task.role}{self.task.index}"

    def _copy_stderr(self, log: Path) -> None:
        copy_to_log(self.stream.stderr, log)  # rotated at its cap, like a local task's

    def wait(self) -> int:
        code = self.stream.exit_status(None)
        self._log_thread.join(timeout=2.0)  # its last stderr lines are the cause a failed run shows
        return -1 if code is None else code

    def failure(self, code: int) -> str | None:
        if code == -1 and not self.conn.connected:
            return f"host {self.host.name}: SSH connection lost while {self.name} ran there"
        return None

    def stop(self, grace: float) -> None:
        """Close the channel's stdin (the host stops the process group: TERM, `grace` s, KILL);
        if the host does not answer in time, KILL the group over a fresh command."""
        if self.stream.exit_status(0) is None:
            self.stream.close_stdin()
            if self.stream.exit_status(grace + 8.0) is None and self.pid is not None and self.pid > 1:
                sudo = "sudo -n " if self.host.sudo else ""
                try:
                    self.conn.run(f"{sudo}kill -KILL -- -{self.pid}", timeout=10)
                except NetbenchError:
                    pass  # unreachable: the host's journal and lease still stop it
                self.stream.exit_status(5.0)
        self.stream.close()
        self._log_thread.join(timeout=2.0)
