"""`netbench status CAMPAIGN`: a campaign's progress from its folder alone, also while its
shards run: each shard's runs done, failed and left, its state, the failures with their
reasons, and the time left (each run's estimate in campaign.json, scaled by the pace of the
runs done so far).

A shard is running while a session holds its folder's lock (campaign.ShardLock: an flock,
released by the kernel when the process ends, however it ends), done when every run of its
share is recorded ok or timeout, stopped when it has begun and is neither, not started when
nothing of it is there. A shard that stopped before recording why (a refusal, a cancelled
job) says so in its Slurm output: its last error line is shown.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from netbench.cluster.script import OUTPUT, OUTPUT_NAME
from netbench.experiment import campaign
from netbench.experiment.store import MANIFEST, ResultStore
from netbench.model.design import COMPLETE_STATUSES

NOT_STARTED, RUNNING, STOPPED, DONE = "not started", "running", "stopped", "done"


@dataclass(frozen=True)
class RunState:
    """One run of the campaign as its shard's folder has it."""

    run_id: str
    shard: int
    estimate_s: float
    status: str | None = None  # None: no record yet
    error: str = ""
    took_s: float | None = None  # its record's ended - started


@dataclass(frozen=True)
class ShardProgress:
    index: int
    state: str
    host: str
    runs: int
    done: int
    failed: tuple[tuple[str, str], ...]  # (run id, reason) of runs recorded as failed, not yet run again ok
    left: int
    left_s: float
    last_error: str = ""  # the last error line of its newest Slurm output, for a shard not running
    job: str = ""  # the last submission's array task that holds it ("12_1"; "" never submitted)
    began: bool = False  # a task of that submission has written its output (Slurm started it)

    @property
    def queued(self) -> bool:
        """Submitted and not begun as far as the folder knows (pending in Slurm, or never started)."""
        return self.state == NOT_STARTED and bool(self.job) and not self.began


@dataclass(frozen=True)
class Progress:
    campaign: Path
    record: Mapping[str, Any]
    shards: tuple[ShardProgress, ...]
    pace: float | None  # measured / estimated time of the runs done (None: none done yet)

    @property
    def runs(self) -> int:
        return sum(s.runs for s in self.shards)

    @property
    def done(self) -> int:
        return sum(s.done for s in self.shards)

    @property
    def left(self) -> int:
        return sum(s.left for s in self.shards)

    @property
    def left_at_once_s(self) -> float:
        """The time left when every unfinished shard runs at once: the longest one's."""
        return max((s.left_s for s in self.shards), default=0.0)

    @property
    def left_in_turn_s(self) -> float:
        """The time left when the shards run one after another (one node)."""
        return sum(s.left_s for s in self.shards)


def pace(states: Sequence[RunState]) -> float | None:
    """How much longer the runs done took than estimated (their sums' ratio; None: none done)."""
    done = [s for s in states if s.status in COMPLETE_STATUSES and s.took_s is not None and s.estimate_s > 0]
    estimated = sum(s.estimate_s for s in done)
    return sum(s.took_s for s in done) / estimated if done and estimated > 0 else None


def shard_progress(index: int, states: Sequence[RunState], state: str, host: str, factor: float | None,
                   last_error: str = "", job: str = "", began: bool = False) -> ShardProgress:
    """One shard's figures from its runs' states (pure)."""
    mine = [s for s in states if s.shard == index]
    done = [s for s in mine if s.status in COMPLETE_STATUSES]
    left = [s for s in mine if s.status not in COMPLETE_STATUSES]
    failed = tuple((s.run_id, s.error or s.status or "") for s in left if s.status is not None)
    if not left and state != RUNNING:
        state = DONE
    left_s = sum(s.estimate_s for s in left) * (factor if factor is not None else 1.0)
    return ShardProgress(index=index, state=state, host=host, runs=len(mine), done=len(done), failed=failed,
                         left=len(left), left_s=left_s, last_error="" if state in (RUNNING, DONE) else last_error,
                         job=job, began=began)


def progress(folder: Path) -> Progress:
    """The campaign's progress, read from its folder (campaign.json, each shard's folder, slurm/)."""
    folder = Path(folder)
    record = campaign.require_campaign(folder)
    records = {}
    for index in range(int(record["shards"])):
        records.update({(index, run_id): found for run_id, found in
                        ResultStore(campaign.shard_dir(folder, index)).records().items()})
    states = []
    for entry in record["runs"]:
        found = records.get((int(entry["shard"]), entry["run_id"]), {})
        took = found.get("ended", 0) - found.get("started", 0) if found.get("ended") and found.get("started") else None
        states.append(RunState(run_id=entry["run_id"], shard=int(entry["shard"]),
                               estimate_s=float(entry.get("estimate_s") or 0.0), status=found.get("status"),
                               error=str(found.get("error") or ""), took_s=took))
    factor = pace(states)
    jobs = submitted(folder)
    shards = []
    for index in range(int(record["shards"])):
        where = campaign.shard_dir(folder, index)
        job = jobs.get(index, "")
        began = bool(job) and (folder / campaign.SLURM_DIR / OUTPUT_NAME.replace("%a", str(index)).replace(
            "%A", job)).exists()
        shards.append(shard_progress(index, states, _state(where), _host(where), factor,
                                     last_error(folder / campaign.SLURM_DIR, index), f"{job}_{index}" if job else "",
                                     began))
    return Progress(campaign=folder, record=record, shards=tuple(shards), pace=factor)


def submitted(folder: Path) -> dict[int, str]:
    """Shard -> the job id of the last submission that holds it (slurm/submissions.json)."""
    from netbench.experiment.submit import read_submissions

    out: dict[int, str] = {}
    for entry in read_submissions(folder):
        for shard in entry.get("shards") or ():
            out[int(shard)] = str(entry.get("job_id"))
    return out


def _state(folder: Path) -> str:
    """running (a session holds its lock), stopped (begun: a manifest or records), not started."""
    lock = folder / campaign.RUNNING
    if lock.exists():
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return RUNNING
            finally:
                os.close(fd)
    begun = (folder / MANIFEST).exists() or any(ResultStore(folder).record_paths())
    return STOPPED if begun else NOT_STARTED


def _host(folder: Path) -> str:
    """The host of the shard's latest session (its manifest)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(manifest.get("host") or "") if isinstance(manifest, dict) else ""


def last_error(slurm_dir: Path, index: int) -> str:
    """Why shard `index`'s newest Slurm output (slurm/shard-I.job-J.out) ended: Slurm's own
    line on the job (`slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT ...`), else its last
    error line ("" without either)."""
    outputs = []
    for path in slurm_dir.glob("shard-*.job-*.out") if slurm_dir.is_dir() else ():
        match = OUTPUT.fullmatch(path.name)
        if match and int(match.group(1)) == index:
            outputs.append((int(match.group(2)), path))
    if not outputs:
        return ""
    path = max(outputs)[1]
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    # Slurm's own word on the job (cancelled, out of time, out of memory) is the cause; else netbench's last error
    slurm = [line.strip() for line in lines if "***" in line and "slurmstepd" in line]
    errors = slurm or [line.strip() for line in lines if "error" in line.lower()]
    return f"{slurm_dir.name}/{path.name}: {errors[-1][:300]}" if errors else ""
