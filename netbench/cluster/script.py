"""A campaign's Slurm batch script, as data (pure): a job array with one task per shard to
run, each task `netbench run PLAYBOOK --shard $SLURM_ARRAY_TASK_ID/N --output CAMPAIGN` on a
node of its own (`--exclusive`: timings need a whole machine), or on `--cpus-per-task` cores
when asked. `netbench submit --dry-run` prints exactly what `netbench submit` hands sbatch.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Sequence

TIME = re.compile(r"(\d+)(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
OWN = ("--array", "-a", "--output", "-o", "--job-name", "-J")  # what the script sets itself
OUTPUT_NAME = "shard-%a.job-%A.out"  # Slurm's output per array task, in the campaign's slurm/ folder
OUTPUT = re.compile(r"shard-(\d+)\.job-(\d+)\.out")


@dataclass(frozen=True)
class BatchOptions:
    """What the script is made of: the campaign (absolute paths), the shards to run, the
    command that starts netbench on a node, and the user's sbatch options."""

    name: str  # the playbook's name: the job's name is netbench-<name>
    playbook: str  # absolute path of the playbook file
    campaign: str  # absolute path of the campaign folder
    shards: int  # N
    array: tuple[int, ...]  # the shards this submission runs
    netbench: tuple[str, ...]  # how a node starts netbench, e.g. (python, "-m", "netbench.cli")
    partition: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None  # None: a whole node (--exclusive)
    sbatch_args: tuple[str, ...] = ()


def check(options: BatchOptions) -> None:
    """ValueError naming the flag of anything sbatch would refuse or misread."""
    if options.time is not None and not TIME.fullmatch(options.time):
        raise ValueError(f"--time {options.time!r}: Slurm takes minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    if options.partition is not None and not PARTITION.fullmatch(options.partition):
        raise ValueError(f"--partition {options.partition!r}: a partition name (letters, digits, _ . -), "
                         "or several separated by commas")
    if options.cpus_per_task is not None and options.cpus_per_task < 1:
        raise ValueError(f"--cpus-per-task {options.cpus_per_task}: at least 1")
    for arg in options.sbatch_args:
        if not arg.startswith("-") or any(c in arg for c in "\n\r"):
            raise ValueError(f"--sbatch-arg {arg!r}: one sbatch option on one line, e.g. --sbatch-arg=--mem=8G")
        if re.split(r"[=\s]", arg)[0] in OWN or any(arg.startswith(f) and len(f) == 2 and len(arg) > 2 for f in OWN):
            raise ValueError(f"--sbatch-arg {arg!r}: netbench sets the array, the output and the job's name itself")
    if not options.array or any(not 0 <= i < options.shards for i in options.array):
        raise ValueError(f"shards {list(options.array)}: each must be 0 to {options.shards - 1}")


def array_text(indices: Sequence[int]) -> str:
    """Slurm's --array for `indices`: runs of consecutive ones as ranges ("0-2,5")."""
    indices = sorted(set(indices))
    parts, start = [], None
    for i, index in enumerate(indices):
        if start is None:
            start = index
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            parts.append(str(start) if start == index else f"{start}-{index}")
            start = None
    return ",".join(parts)


def batch_script(options: BatchOptions) -> str:
    """The batch script's text (check() first)."""
    check(options)
    q = shlex.quote
    directives = [f"--job-name={q('netbench-' + options.name)}", f"--array={array_text(options.array)}",
                  "--nodes=1", "--ntasks=1",
                  "--exclusive" if options.cpus_per_task is None else f"--cpus-per-task={options.cpus_per_task}",
                  f"--output={q(options.campaign.rstrip('/') + '/slurm/' + OUTPUT_NAME)}"]
    if options.partition:
        directives.append(f"--partition={options.partition}")
    if options.time:
        directives.append(f"--time={options.time}")
    directives += [q(arg) for arg in options.sbatch_args]
    where = "a node of its own" if options.cpus_per_task is None else f"{options.cpus_per_task} cores of a node"
    command = [*map(q, options.netbench), "run", q(options.playbook),
               "--shard", f'"$SLURM_ARRAY_TASK_ID/{options.shards}"', "--output", q(options.campaign)]
    return "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "#",
        f"# netbench campaign {options.name}: array task I runs shard I of {options.shards} on {where}.",
        "# A shard resumes: the runs it has recorded are not run again. Written by 'netbench submit'",
        "# ('netbench submit --dry-run' prints it); 'netbench status' reads the campaign's progress.",
        "set -eu",
        "exec " + " ".join(command),
        "",
    ])
