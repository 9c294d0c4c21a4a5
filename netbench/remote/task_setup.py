"""What a `netbench node task` gets on its host beside the process itself: a user's command's
control file (where the controller's stop request is written) and, with `--cpus`, the cgroup the
task starts in (emulation/cgroups.py, journaled before it is made)."""

from __future__ import annotations

import os

from netbench.state.journal import Journal

STOP_LINE = "stop-at"  # a line on `node task`'s stdin: "stop-at N", a user's command's stop request
CONTROL_VARIABLE = "NETBENCH_CONTROL"  # netbench.track reads the stop request from the file it names


def control_file():
    """A user's command's control file on this host, in a folder of its own (removed when
    the task ends); it does not exist until the controller asks the command to stop."""
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix="netbench-control-")) / "control"


def take_request(line: bytes, control) -> None:
    """One line from the controller on `node task`'s stdin: "stop-at N" writes N into the
    command's control file (atomically: the rank never reads half of it); others are ignored."""
    words = line.decode("ascii", "replace").split()
    if control is None or len(words) != 2 or words[0] != STOP_LINE or not words[1].isdigit():
        return
    tmp = control.with_name(control.name + ".tmp")
    tmp.write_text(f"{int(words[1])}\n")
    os.replace(tmp, control)


def task_group(journal: Journal, role: str, cpus: float | None, cgroups=None):
    """(NodeGroups, the group's name) a task with a CPU limit starts in, journaled before it is
    made and limited to `cpus` (emulation/cgroups.py: this host's v2 or v1); (None, None) without."""
    if cpus is None:
        return None, None
    from netbench.emulation import cgroups as cg
    from netbench.model.compute import NONE, check_cores

    check_cores(NONE.set("host", cpus=cpus), cg.cores(), "flag --cpus")
    groups = cg.NodeGroups(journal, cgroups or cg.detect())
    name = f"netbench-task-{role}-{os.getpid()}"
    groups.create(name)
    groups.limit(name, cpus)
    return groups, name
