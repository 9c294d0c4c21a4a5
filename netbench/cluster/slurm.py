"""Slurm's commands, called here and nowhere else: sbatch submits a batch script, squeue says
which of a campaign's array tasks are still pending or running. `SlurmCluster` is the real
edge; tests/fakes/slurm.py is its in-memory twin."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from netbench import proc
from netbench.errors import NetbenchError

TIMEOUT_S = 60.0
JOB_ID = re.compile(r"(\d+)(;\S+)?")  # sbatch --parsable: "JOBID" or "JOBID;CLUSTER"


class SlurmError(NetbenchError):
    """Slurm refused or could not be asked (sbatch, squeue)."""


class Cluster(Protocol):
    """What a campaign asks of its cluster manager."""

    def submit(self, script: Path) -> str:
        """Submit a batch script; its job id."""
        ...

    def active(self, job_ids: Sequence[str]) -> Mapping[str, set[int]]:
        """Job id -> the array task indices of that job still pending or running."""
        ...


def _command(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(f"{name} not found: 'netbench submit --slurm' runs where Slurm's commands are "
                         "(a cluster's login node)", hint="install Slurm's client commands, or run on the login node")
    return path


class SlurmCluster:
    """The Slurm a login node reaches (SLURM_CONF and the environment as sbatch finds them)."""

    def submit(self, script: Path) -> str:
        result = proc.run([_command("sbatch"), "--parsable", str(script)], timeout=TIMEOUT_S, check=False)
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            raise SlurmError(f"sbatch refused {script}: {lines[-1] if lines else f'exit status {result.returncode}'}",
                             hint="the script is as 'netbench submit --dry-run' prints it; --sbatch-arg adds options")
        match = JOB_ID.fullmatch(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "")
        if match is None:
            raise SlurmError(f"sbatch printed no job id: {result.stdout.strip()[:200]!r}")
        return match.group(1)

    def active(self, job_ids: Sequence[str]) -> Mapping[str, set[int]]:
        if not job_ids:
            return {}
        # this user's jobs, then ours among them: --jobs with an id Slurm has forgotten (a job ended
        # minutes ago) fails as a whole, and would hide one still running
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
        result = proc.run([_command("squeue"), "--noheader", "--array", "--format=%i %t", f"--user={user}",
                           "--states=PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED"],
                          timeout=TIMEOUT_S, check=False)
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            raise SlurmError(f"squeue failed: {lines[-1] if lines else result.returncode}")
        return {job: tasks for job, tasks in parse_squeue(result.stdout).items() if job in set(job_ids)}


def parse_squeue(text: str) -> dict[str, set[int]]:
    """squeue --array --format='%i %t' lines ("12_3 R", "12_[4-6] PD") as job id -> array indices."""
    out: dict[str, set[int]] = {}
    for line in text.splitlines():
        ident = line.split()[0] if line.split() else ""
        job, _, index = ident.partition("_")
        if not job.isdigit() or not index:
            continue
        out.setdefault(job, set()).update(_indices(index.strip("[]").split("%")[0]))
    return out


def _indices(text: str) -> set[int]:
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found.update(range(int(low), int(high or low) + 1))
    return found
