"""`netbench submit`: a campaign's missing shards as one Slurm job array.

The campaign folder is opened as a shard would open it (experiment/campaign.py: its record is
written once, here when the submission comes first); the shards to run are those with a run
not yet recorded ok or timeout, less those a job of an earlier submission still has pending
or running (squeue); the batch script is data (cluster/script.py), written to the campaign's
slurm/ folder, then handed to sbatch through the cluster edge (cluster/slurm.py, a fake in
tests). submissions.json keeps every job id, with its shards, for the next submission and for
`netbench status`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from netbench.cluster.script import BatchOptions, batch_script, check
from netbench.cluster.slurm import Cluster
from netbench.errors import UsageError
from netbench.experiment import campaign
from netbench.experiment.jsonfile import read_json, write_json

SUBMISSIONS = "submissions.json"


@dataclass(frozen=True)
class Submission:
    """What a submission did (or, dry, would do)."""

    campaign: Path
    record: dict[str, Any]
    script: str  # the batch script ("" when nothing is left to submit)
    array: tuple[int, ...]  # the shards submitted
    finished: tuple[int, ...]  # shards with every run recorded
    active: dict[int, str]  # shard -> the job id that still has it pending or running
    job_id: str | None = None  # None: a dry run, or nothing to submit
    script_path: Path | None = None


def netbench_command() -> tuple[str, ...]:
    """How a node starts this netbench: this interpreter, the CLI's module."""
    return (sys.executable, "-m", "netbench.cli")


def read_submissions(folder: Path) -> list[dict[str, Any]]:
    path = Path(folder) / campaign.SLURM_DIR / SUBMISSIONS
    if not path.exists():
        return []
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        raise campaign.CampaignError(f"{path}: unreadable: {exc}") from None
    return [s for s in data if isinstance(s, dict)] if isinstance(data, list) else []


def active_shards(cluster: Cluster, submissions: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Shard -> job id, for the array tasks of earlier submissions still pending or running."""
    ids = [str(s["job_id"]) for s in submissions if s.get("job_id")]
    found = cluster.active(ids)
    return {index: job for job, indices in found.items() for index in indices}


def submit(book, playbook_file: Path, folder: Path, shards: int, cluster: Cluster, options: BatchOptions,
           dry_run: bool = False) -> Submission:
    """Submit the campaign's unfinished shards as one array (dry: the script only, nothing written)."""
    folder = Path(folder).absolute()
    try:  # the user's flags, before anything is written
        check(replace(options, shards=shards, array=(0,)))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    opened = campaign.open_campaign(book, folder, shards, write=not dry_run)
    record = opened.record
    left = campaign.unfinished_shards(folder, record) if campaign.is_campaign(folder) else list(range(shards))
    submissions = read_submissions(folder)
    active = active_shards(cluster, submissions) if submissions else {}
    array = tuple(i for i in left if i not in active)
    finished = tuple(i for i in range(shards) if i not in left)
    if not array:
        return Submission(folder, record, "", (), finished, active)
    options = replace(options, name=book.name, playbook=str(Path(playbook_file).absolute()), campaign=str(folder),
                      shards=shards, array=array)
    text = batch_script(options)
    if dry_run:
        return Submission(folder, record, text, array, finished, active)
    slurm_dir = folder / campaign.SLURM_DIR
    made_slurm = not slurm_dir.exists()
    slurm_dir.mkdir(parents=True, exist_ok=True)
    path = slurm_dir / f"submit-{len(submissions) + 1}.sh"
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    try:
        job_id = cluster.submit(path)
    except BaseException:  # nothing half-made: what this submission wrote goes again
        path.unlink(missing_ok=True)
        if made_slurm:
            slurm_dir.rmdir()
        opened.undo()
        raise
    write_json(slurm_dir / SUBMISSIONS, [*submissions, {"job_id": job_id, "shards": list(array),
                                                        "script": path.name, "submitted": time.time()}])
    return Submission(folder, record, text, array, finished, active, job_id=job_id, script_path=path)


def batch_options(partition: str | None, time_limit: str | None, cpus_per_task: int | None,
                  sbatch_args: Sequence[str]) -> BatchOptions:
    """The user's sbatch flags as BatchOptions (the campaign's own fields filled in by submit)."""
    options = BatchOptions(name="", playbook="", campaign="", shards=1, array=(0,), netbench=netbench_command(),
                           partition=partition, time=time_limit, cpus_per_task=cpus_per_task,
                           sbatch_args=tuple(sbatch_args))
    try:
        check(options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return options
