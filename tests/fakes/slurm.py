"""An in-memory Slurm (netbench/cluster/slurm.py's Cluster) for pure tests of campaigns:
`submit` records each script and gives job ids from 100 on; `active` answers from `queued`,
job id -> the array tasks a test says are still pending or running."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence


class FakeSlurm:
    def __init__(self, refuse: str | None = None) -> None:
        self.scripts: list[tuple[str, str]] = []  # (job id, the script's text as submitted)
        self.queued: dict[str, set[int]] = {}
        self.asked: list[list[str]] = []  # the job ids each `active` was asked about
        self.refuse = refuse
        self.next_id = 100

    def submit(self, script: Path) -> str:
        from netbench.cluster.slurm import SlurmError

        if self.refuse:
            raise SlurmError(f"sbatch refused {script}: {self.refuse}")
        job = str(self.next_id)
        self.next_id += 1
        self.scripts.append((job, Path(script).read_text(encoding="utf-8")))
        return job

    def active(self, job_ids: Sequence[str]) -> Mapping[str, set[int]]:
        self.asked.append(list(job_ids))
        return {job: set(tasks) for job, tasks in self.queued.items() if job in job_ids and tasks}
