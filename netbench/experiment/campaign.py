"""A campaign folder: one design run as N shards at once, each shard a results folder of its own.

    CAMPAIGN/campaign.json    the design (its runs, seed, digest), the shard count, how the runs
                              are shared (model/shard.py) and each run's shard and estimated time
    CAMPAIGN/shard-I/         shard I's results folder (results.csv, runs/, logs/, playbook.json),
                              written by `netbench run PLAYBOOK --shard I/N --output CAMPAIGN`
    CAMPAIGN/slurm/           batch scripts, submissions.json and Slurm's output per array task
    CAMPAIGN/merged/          every design run's record and row, made by `netbench report`

campaign.json is written once, by whichever shard (or `netbench submit`) comes first, atomically
and never replaced: every shard then reads the same share of the design from it, and a drawn
seed is the campaign's, whichever shard drew it. This module owns the folder's layout; the
shards' own folders belong to experiment/store.py.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from netbench.errors import UsageError
from netbench.experiment.jsonfile import read_json
from netbench.model.run import Run
from netbench.model.shard import POINTS, Shard, Split, shard_runs, split

RECORD = "campaign.json"
FORMAT = 1
SLURM_DIR = "slurm"
MERGED_DIR = "merged"
RUNNING = ".running"  # a shard folder's lock file while a session runs it


class CampaignError(UsageError):
    """A campaign folder that does not match what is asked of it."""


def shard_dir(campaign: Path, index: int) -> Path:
    return Path(campaign) / f"shard-{index}"


def is_campaign(folder: Path) -> bool:
    return (Path(folder) / RECORD).is_file()


def read_campaign(folder: Path) -> dict[str, Any] | None:
    """campaign.json of a campaign folder; None where there is none."""
    path = Path(folder) / RECORD
    if not path.exists():
        return None
    try:
        record = read_json(path)
    except (OSError, ValueError) as exc:
        raise CampaignError(f"{path}: unreadable: {exc}") from None
    if not isinstance(record, dict) or not isinstance(record.get("runs"), list) or "shards" not in record:
        raise CampaignError(f"{path}: not a campaign record (no runs or shards)")
    return record


def require_campaign(folder: Path) -> dict[str, Any]:
    record = read_campaign(folder)
    if record is None:
        hint = ("a playbook's results folder: 'netbench report' it" if (Path(folder) / "playbook.json").exists()
                else "give the folder 'netbench submit' or 'netbench run --shard' wrote")
        raise CampaignError(f"{folder}: not a campaign folder (no {RECORD})", hint=hint)
    return record


def split_of(record: Mapping[str, Any]) -> Split:
    """The share recorded in campaign.json (the recorded one wins over a recomputed one)."""
    count = int(record["shards"])
    shares: list[list[int]] = [[] for _ in range(count)]
    design_runs = 0
    for entry in record["runs"]:
        shares[int(entry["shard"])].append(int(entry["index"]))
        design_runs += not entry.get("reference")
    return Split(count=count, by=str(record.get("by")), shards=tuple(tuple(s) for s in shares),
                 reference_point=int(record.get("reference_point", 0)), design_runs=design_runs)


def plan(book, seed: int, runs: Sequence[Run], count: int, created: float | None = None) -> dict[str, Any]:
    """campaign.json for `runs` (the design, in run order) shared among `count` shards, with
    each run's estimated seconds (experiment/estimate.py: a run of its own to share points by;
    its shard's launches for the time left)."""
    from netbench.experiment.estimate import Costs, estimate_design
    from netbench.experiment.launch import Settle
    from netbench.model import design

    costs, settle = Costs(), Settle()
    alone = {r.index: estimate_design([r], True, settle, costs, book.step_timeout_s).wall_s for r in runs}
    share = split(runs, count, book.repetitions, alone)
    entries = []
    for index in range(count):
        mine = shard_runs(runs, share, index)
        seconds = {}
        alone_by_id = {r.run_id: alone[r.index] if r.index in alone else alone[runs_at(runs, r.point)] for r in mine}
        for launch in estimate_design(mine, False, settle, costs, book.step_timeout_s).launches:
            total = sum(alone_by_id[run_id] for run_id in launch.runs) or 1.0  # a launch's time by its runs' own
            seconds.update((run_id, launch.wall_s * alone_by_id[run_id] / total) for run_id in launch.runs)
        entries += [{"run_id": r.run_id, "index": r.index, "point": r.point, "repeat": r.repeat, "shard": index,
                     "reference": share.is_extra(r.index), "estimate_s": round(seconds.get(r.run_id, 0.0), 1)}
                    for r in mine]
    source = Path(book.source)
    return {"format": FORMAT, "name": book.name, "source": book.source, "seed": seed, "shards": count,
            "playbook": str(source.absolute()) if source.is_file() else book.source,
            "by": share.by, "reference_point": share.reference_point, "digest": design.design_digest(book, runs),
            "design": design.plan_record(book, seed, runs), "runs": sorted(entries, key=lambda e: e["index"]),
            "created": time.time() if created is None else created}


def runs_at(runs: Sequence[Run], point: int) -> int:
    """The index of the first run of `point` (an extra reference run costs what it repeats)."""
    return next(r.index for r in runs if r.point == point)


def create_once(folder: Path, record: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """campaign.json written unless one is there already: (the one that is, whether this call
    wrote it). Another shard's, written first, wins. Atomic: written beside it, then linked
    into place."""
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORD
    tmp = folder / f".{RECORD}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    try:
        os.link(tmp, path)
        wrote = True
    except FileExistsError:
        wrote = False
    finally:
        tmp.unlink(missing_ok=True)
    return read_campaign(folder) or {}, wrote


@dataclass(frozen=True)
class Opened:
    """A campaign opened for a design: its record, seed and runs, and what opening it made."""

    record: dict[str, Any]
    seed: int
    runs: tuple[Run, ...]
    made: tuple[Path, ...] = ()  # campaign.json and the folders made for it, deepest first

    def undo(self) -> None:
        """Remove what opening made (a shard refused before its first run, a submission sbatch
        refused): nothing half-made is left; a folder something else was put in stays."""
        for path in self.made:
            try:
                path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)
            except OSError:
                pass


def check_matches(folder: Path, record: Mapping[str, Any], digest: str, count: int, source: str) -> None:
    """Refuse a campaign folder that holds another design or another shard count."""
    if record.get("digest") != digest:
        raise CampaignError(f"{folder}: a campaign of another design than {source} (its playbook or seed changed "
                            "since the campaign began)",
                            hint="give another folder with --output, or restore the playbook as it was")
    if int(record.get("shards", 0)) != count:
        raise CampaignError(f"{folder}: a campaign of {record.get('shards')} shards, not {count}",
                            hint=f"run its shards as I/{record.get('shards')}, or give another folder with --output")


def open_campaign(book, folder: Path, count: int, write: bool = True, sample_resources_s: float = 0.0) -> Opened:
    """campaign.json, the seed and the design's runs of `book` run as `count` shards into
    `folder`: the record there (checked against the design), else a new one, written unless
    `write` is False (a dry run); a seed the playbook does not set is the campaign's, drawn once."""
    import random

    from netbench.model import design
    from netbench.model.shard import check_count

    refuse_plain(folder)
    record = read_campaign(folder)
    seed = book.seed if book.seed is not None else (record or {}).get("seed")
    seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
    runs = design.expand(book, seed, sample_resources_s=sample_resources_s)
    try:
        check_count(count, len(runs))
    except ValueError as exc:
        raise CampaignError(f"{book.source}: {exc}", hint="fewer shards, or a design with more runs") from None
    made: tuple[Path, ...] = ()
    if record is None:
        missing = [p for p in (Path(folder), *Path(folder).parents) if not p.exists()]
        record = plan(book, seed, runs, count)
        if write:
            record, wrote = create_once(folder, record)  # another shard's, where it came first
            made = (Path(folder) / RECORD, *missing) if wrote else ()
    if record.get("seed") != seed:
        if book.seed is not None:
            raise CampaignError(f"{folder}: a campaign of seed {record.get('seed')}; {book.source} sets seed "
                                f"{book.seed}", hint="give another folder with --output, or restore the playbook as it was")
        seed = int(record["seed"])  # drawn by the shard (or submit) that came first
        runs = design.expand(book, seed, sample_resources_s=sample_resources_s)
    check_matches(folder, record, design.design_digest(book, runs), count, book.source)
    return Opened(record=record, seed=seed, runs=tuple(runs), made=made)


def statuses(folder: Path, record: Mapping[str, Any]) -> dict[str, str]:
    """run id -> status of every run the campaign's shards have recorded (each in its own shard's folder)."""
    from netbench.experiment.store import ResultStore

    out: dict[str, str] = {}
    for index in range(int(record["shards"])):
        found = ResultStore(shard_dir(folder, index)).statuses()
        out.update((e["run_id"], found[e["run_id"]]) for e in record["runs"]
                   if e["shard"] == index and e["run_id"] in found)
    return out


def unfinished_shards(folder: Path, record: Mapping[str, Any]) -> list[int]:
    """The shards with a run not yet recorded ok or timeout."""
    from netbench.model.design import COMPLETE_STATUSES

    done = statuses(folder, record)
    return sorted({int(e["shard"]) for e in record["runs"] if done.get(e["run_id"]) not in COMPLETE_STATUSES})


def refuse_plain(folder: Path) -> None:
    """A shard never writes into a plain playbook's results folder."""
    if (Path(folder) / "playbook.json").exists() and not is_campaign(folder):
        raise CampaignError(f"{folder}: the results folder of a playbook run on one machine, not a campaign",
                            hint="give a new folder with --output for the campaign")


def refuse_campaign(folder: Path) -> None:
    """A playbook run on one machine never writes into a campaign folder."""
    if is_campaign(folder):
        raise CampaignError(f"{folder}: a campaign folder: its shards run with --shard I/N",
                            hint="netbench run PLAYBOOK --shard I/N --output FOLDER, or 'netbench submit'")


@dataclass(frozen=True)
class ShardPlan:
    """What one shard runs: its runs (design ones in run order, its reference run last)."""

    shard: Shard
    folder: Path
    runs: tuple[Run, ...]
    by: str
    record: Mapping[str, Any]
    opened: Opened | None = None  # how the campaign was opened: undo() if the shard is refused before it runs

    @property
    def extra(self) -> tuple[str, ...]:
        """Its extra reference runs' ids (measured to compare machines, not part of the design)."""
        return tuple(e["run_id"] for e in self.record["runs"] if e.get("reference") and e["shard"] == self.shard.index)


def shard_plan(folder: Path, shard: Shard, runs: Sequence[Run], record: Mapping[str, Any],
               opened: Opened | None = None) -> ShardPlan:
    return ShardPlan(shard=shard, folder=shard_dir(folder, shard.index),
                     runs=shard_runs(runs, split_of(record), shard.index), by=str(record.get("by")), record=record,
                     opened=opened)


def describe_split(record: Mapping[str, Any]) -> str:
    """One line: how the campaign's runs are shared."""
    design = sum(1 for e in record["runs"] if not e.get("reference"))
    count = int(record["shards"])
    if record.get("by") == POINTS:
        extra = sum(1 for e in record["runs"] if e.get("reference"))
        return (f"{design} runs in {count} shards, shared by points (the design has fewer repetitions than "
                f"shards) by estimated time; {extra} extra run(s) of the reference point "
                f"(point {record.get('reference_point', 0)}) so every shard measures it")
    return f"{design} runs in {count} shards by repetitions: each shard measures every point (a block)"


class ShardLock:
    """A shard folder held by one session at a time (an flock on shard-I/.running, which NFS
    clients share): a second session of the same shard, or a resubmitted task that starts
    while the first still runs, is refused instead of measuring the same runs twice."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / RUNNING
        self.fd: int | None = None

    def __enter__(self) -> "ShardLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise CampaignError(f"{self.path.parent}: this shard is being run already ({holder or 'another session'})",
                                    hint="wait for it, or stop it (scancel) and run the shard again") from None
            raise CampaignError(f"{self.path}: cannot lock: {exc.strerror}") from None
        import socket

        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # the lock goes with the descriptor; the empty file stays (another may hold it)
            self.fd = None
