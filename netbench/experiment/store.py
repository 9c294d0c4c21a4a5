"""Run records and the one owner of the results folder, writing and reading it.

A results folder holds results.csv (one row per run), runs/<id>.json (each run's whole
record, step events included), logs/<id>/ (each process's output), manifest.json (the
sweep: command line, backend, versions) and, for a playbook, playbook.json (its runs and
sessions) beside playbook.yaml (the file as run). Nothing else in netbench names these
paths: the runner, playbook resume, report and metrics all come through here. Each run's
record, then its row, is written (and flushed) as soon as the run ends, so an interrupted
sweep keeps every completed run; a record left without its row gets it when the folder is
opened again, so a resume never runs a recorded point twice nor adds a second row for it.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from netbench import __version__, provenance
from netbench.errors import UsageError
from netbench.jobs.resources import Usage, totals
from netbench.jobs.stragglers import COLUMNS as STRAGGLER_COLUMNS
from netbench.jobs.stragglers import csv_cells as straggler_cells
from netbench.experiment import node_columns
from netbench.experiment.jsonfile import read_json, write_json  # noqa: F401 - the folder's JSON files
from netbench.jobs.link_check import COLUMNS as RANK_COLUMNS, csv_cells as rank_cells
from netbench.model.job import ALGORITHM_KEYS

# 2: strategy settings (ps, accum_steps), data, model size, computation/communication split,
#    measured link beside the configured one (sweep --verify)
# 3: per-process resource use (--sample-resources) and its csv columns
# 4: a run's schedule (its landed changes and lateness) and the csv's schedule column
# 5: a run's per-pair topology (its `topology` record) and the csv's topology and scale columns
# 6: a window's precision: step_time_ci_pct and precision_reached (record and csv)
# 7: the model's predicted step (experiment/predict.py) and the csv's predicted_step_s column
# 8: the training algorithm's waiting and staleness, and accuracy (a run's accuracy_curve and the
#    csv's test_accuracy, steps_to_target, time_to_target_s, wait_time_mean_s, staleness_mean)
# 9: who trained and where the steps came from: `framework` and `source` (harness, track, regex)
# 10: a user's command that reports no steps, measured in bytes on its nodes' links: source
#     "bytes", the record's `link_bytes` (window, each node's bytes) and the csv's link_bytes_per_s;
#     each record also keeps its own target_accuracy
# 11: the algorithm settings the run's strategy used (its record's `algorithm`, e.g. {"staleness": 3})
#     and the csv's staleness, tau, elastic_alpha and gossip_p columns (empty where unused)
# 12: the calibrations a run's prediction used (`calibration_id`, experiment/calibration_cache.py),
#     the nodes' TCP congestion control (`congestion_control`), why a point settled when it did
#     (`settle_reason`); who waits for whom: the record's `stragglers` (jobs/stragglers.py) and its
#     csv columns (COLUMNS there); ps-sync's backup_workers (an algorithm column)
#     and ps-async's pipeline (its record's `algorithm`, e.g. {"pipeline": 0}) and the csv's pipeline column
#     each node's compute capacity (its record's `compute`: cpus and step_delay_s per node) and a
#     csv column per limited node: cpus_<node>, step_delay_s_<node> ("all": every node), after the rest
# 13: ranks per node: the record's `ranks`, its csv columns (jobs/link_check.py COLUMNS)
# 14: where the run ran: the record's `provenance` and its csv columns (netbench/provenance.py)
SCHEMA_VERSION = 15  # 15: what the step model leaves out at the point: the record's and the csv's predicted_omits

RESULTS_CSV = "results.csv"
RUNS_DIR = "runs"
LOGS_DIR = "logs"
MANIFEST = "manifest.json"
PLAYBOOK_RECORD = "playbook.json"
PLAYBOOK_COPY = "playbook.yaml"

CSV_COLUMNS = (
    "run_id", "profile", "delay_ms", "jitter_ms", "rate_mbit", "loss_pct", "backend", "strategy",
    "model", "batch_size", "global_batch_size", "workers", "repeat", "images_per_sec",
    "images_per_sec_stderr", "step_time_mean_s", "step_time_median_s", "step_time_p90_s",
    "step_time_stderr_s", "step_time_jitter_s", "warmup_steps", "steps",
    "ps", "accum_steps", "data", "input_shape", "classes", "params", "model_bytes",
    "worker_images_per_sec", "compute_time_mean_s", "comm_time_mean_s", "idle_ratio",
    "verify_rtt_configured_ms", "verify_rtt_measured_ms", "verify_loss_configured_pct", "verify_loss_measured_pct",
    "verify_rate_measured_mbit", "verify_ok", "cpu_util_mean", "rss_peak_bytes", "net_tx_bytes", "net_rx_bytes",
    "status", "error", "schedule", "step", "split_from",
    "launch", "settle_s", "settle_steps", "settle_reason", "topology", "scale",
    "step_time_ci_pct", "precision_reached", "predicted_step_s", "predicted_omits",
    # the training algorithm and its accuracy (issue 21)
    "wait_time_mean_s", "staleness_mean", "test_accuracy", "steps_to_target", "time_to_target_s",
    "framework", "source",
    # a user's command that reports no steps: bytes each node sent per second (issue 22)
    "link_bytes_per_s",
    # the calibrations the run's prediction used, and its nodes' TCP congestion control
    "calibration_id", "congestion_control",
    # who waits for whom: the straggler, its share of steps, the others' waiting (jobs/stragglers.py)
    *STRAGGLER_COLUMNS,
    # ranks per node and the all-reduce's shape; each node's link bytes per step beside the collective's
    *RANK_COLUMNS,
    # where the run ran: host, CPU model, cores, kernel, privilege, netbench version, a campaign's shard
    *provenance.COLUMNS,
    # the training algorithm's own settings, as the run used them (last: tests/unit/test_algorithm_factors.py)
    *ALGORITHM_KEYS,
)


@dataclass(frozen=True)
class RunResult:
    """One run: the configured point, what was measured, and how it ended."""

    run_id: str
    profile: dict[str, Any]
    backend: str
    strategy: str
    model: str
    batch_size: int
    workers: int
    repeat: int
    warmup_steps: int
    status: str
    error: str = ""
    stats: dict[str, Any] | None = None
    per_worker_images_per_sec: tuple[float, ...] = ()
    events: tuple[dict, ...] = ()
    started: float = 0.0
    ended: float = 0.0
    ps: int = 0  # parameter servers (strategy ps)
    accum_steps: int = 1  # batches per all-reduce on each worker
    data: str = "synthetic"
    input_shape: str = ""  # e.g. "32x32x3"
    classes: int = 0
    params: int = 0  # weights in the model, trainable or not
    model_bytes: int = 0  # bytes of those weights
    compute_time_mean_s: float | None = None  # local computation per measured step
    comm_time_mean_s: float | None = None  # communication (incl. waiting on peers) per measured step
    idle_ratio: float | None = None  # share of step time spent communicating
    verify: dict[str, Any] | None = None  # sweep --verify: netbench.experiment.verify's record for this point
    # --sample-resources: per process (role, index, cpu_util, rss_peak_bytes, rx/tx_bytes, ...)
    resources: tuple[dict[str, Any], ...] = ()
    # a run under a schedule: name, source, every landed change and the lateness summary
    # (netbench.experiment.schedule.RunDriver.record); None when its profile held throughout
    schedule: dict[str, Any] | None = None
    # the measured step: "fused" (one compiled function, as users run it) or "split" (compute
    # and sync apart); where compute/comm/idle come from: "measured" steps or "calibration" ones
    step: str | None = None
    split_from: str | None = None
    # the launch (one start of the job's processes, numbered in the sweep) that measured the
    # point; None: launched on its own (--isolate). settle_s/settle_steps: from the network
    # change to the first measured step, in seconds and in the chief's dropped steps
    launch: int | None = None
    settle_s: float | None = None
    settle_steps: int | None = None
    settle_reason: str | None = None  # why it settled then, and the time floor (experiment/settling.py)
    # the per-pair topology the run applied instead of its profile (model.pairs.PairTopology.to_json,
    # scaled: its links are the delays applied, its scale the factor); None: the profile
    topology: dict[str, Any] | None = None
    # the 95 % batch-means interval of the mean step time, its half-width in % of the mean (None:
    # too few steps), and whether it came within the job's precision (None: no precision asked)
    step_time_ci_pct: float | None = None
    precision_reached: bool | None = None
    # the step model's prediction from the sweep's calibrations (model/step_model.py), never from
    # this run's own steps; None where the model does not apply
    predicted_step_s: float | None = None
    # what the model leaves out at this point ("; "-joined, model/step_model.py omitted: loss,
    # jitter, a CPU quota's busy core), so a point far from its prediction says why; None: nothing
    predicted_omits: str | None = None
    # the algorithm's waiting (barrier, staleness gate) per measured step and the staleness of
    # its updates (exchange strategies); held-out accuracy: the curve (step, wall_s, train_s,
    # accuracy, spread: netbench.jobs.accuracy), the last value, and when the target was reached
    wait_time_mean_s: float | None = None
    staleness_mean: float | None = None
    accuracy_curve: tuple[dict[str, Any], ...] = ()
    test_accuracy: float | None = None
    steps_to_target: int | None = None
    time_to_target_s: float | None = None
    target_accuracy: float | None = None  # the run's own target (record only: sweeps appended
    # to one folder may set different ones; the manifest keeps the last sweep's)
    # the framework that trained ("tensorflow" for netbench's own workers; a user's command:
    # what netbench.track found loaded, "" unknown) and where steps came from: "harness"
    # (netbench's workers), "track" (netbench.track), "regex" (--step-regex on rank 0's output)
    # or "bytes" (neither: measured in bytes on the links, below)
    framework: str = "tensorflow"  # netbench's own workers: the job's framework (tensorflow or torch)
    source: str = "harness"
    step_regex_given_up: int | None = None  # source "regex": lines whose match took too long (no step)
    # source "bytes" (a user's command that reports no steps; jobs/link_bytes.py): the window
    # (warm-up, start and length in seconds), each node's bytes received and sent and per second,
    # and their mean: link_bytes_per_s, bytes each node sent per second. No images/sec.
    link_bytes: dict[str, Any] | None = None
    link_bytes_per_s: float | None = None
    # the settings of the strategy's own algorithm as the run used them (model.job.algorithm_settings:
    # ps-ssp's staleness, easgd's tau and elastic_alpha, gosgd's gossip_p); None: a strategy with none
    algorithm: dict[str, Any] | None = None
    calibration_id: str | None = None  # the prediction's calibrations' ids, "+"-joined; None: no prediction
    congestion_control: str | None = None  # the nodes' TCP congestion control as read back ("a;b": nodes differ)
    # each rank's step times and who the others waited for (jobs.stragglers.Attribution.to_record);
    # None: fewer than two reporting ranks
    stragglers: dict[str, Any] | None = None
    # each node's compute capacity as the run started (model.compute.Compute.to_record: cpus and
    # step_delay_s per node, "*": every node); None: every node unlimited
    compute: dict[str, Any] | None = None
    ranks: dict[str, Any] | None = None  # ranks per node, collective, link bytes per step (jobs/link_check.py)
    # where it ran (netbench.provenance.machine: host, cpu_model, cores, kernel, privilege,
    # netbench_version, shard "I/N" of a campaign); None: a record from before schema 14
    provenance: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def csv_row(self) -> dict[str, Any]:
        p = self.profile
        s = self.stats or {}
        rate = p.get("rate_bps")

        def num(key: str, digits: int = 6):
            return "" if key not in s else round(s[key], digits)

        def opt(value: float | None, digits: int = 6):
            return "" if value is None else round(value, digits)

        return {
            "run_id": self.run_id, "profile": p.get("name", ""),
            "delay_ms": p.get("delay_us", 0) / 1000, "jitter_ms": p.get("jitter_us", 0) / 1000,
            "rate_mbit": "" if rate is None else rate / 1e6, "loss_pct": round(p.get("loss", 0) * 100, 6),
            "backend": self.backend, "strategy": self.strategy, "model": self.model,
            "batch_size": self.batch_size, "global_batch_size": self.batch_size * self.workers,
            "workers": self.workers, "repeat": self.repeat,
            "images_per_sec": num("images_per_sec", 3), "images_per_sec_stderr": num("images_per_sec_stderr", 3),
            "step_time_mean_s": num("mean_s"), "step_time_median_s": num("median_s"),
            "step_time_p90_s": num("p90_s"), "step_time_stderr_s": num("stderr_s"),
            "step_time_jitter_s": num("jitter_s"), "warmup_steps": self.warmup_steps,
            "steps": s.get("steps", 0),
            "ps": self.ps, "accum_steps": self.accum_steps, "data": self.data, "input_shape": self.input_shape,
            "classes": self.classes, "params": self.params, "model_bytes": self.model_bytes,
            "worker_images_per_sec": ";".join(f"{v:.3f}" for v in self.per_worker_images_per_sec),
            "compute_time_mean_s": opt(self.compute_time_mean_s), "comm_time_mean_s": opt(self.comm_time_mean_s),
            "idle_ratio": opt(self.idle_ratio, 4),
            **self._verify_cells(), **self._resource_cells(),
            "status": self.status, "error": self.error,
            "schedule": (self.schedule or {}).get("name", ""),
            "step": self.step or "", "split_from": self.split_from or "",
            "launch": "" if self.launch is None else self.launch, "settle_s": opt(self.settle_s, 4),
            "settle_steps": "" if self.settle_steps is None else self.settle_steps,
            "settle_reason": self.settle_reason or "",
            "topology": (self.topology or {}).get("name", ""),
            "scale": "" if self.topology is None else f"{self.topology.get('scale', 1):g}",
            "step_time_ci_pct": opt(self.step_time_ci_pct, 3),
            "precision_reached": "" if self.precision_reached is None else str(self.precision_reached).lower(),
            "predicted_step_s": opt(self.predicted_step_s), "predicted_omits": self.predicted_omits or "",
            "wait_time_mean_s": opt(self.wait_time_mean_s), "staleness_mean": opt(self.staleness_mean, 4),
            "test_accuracy": opt(self.test_accuracy, 4),
            "steps_to_target": "" if self.steps_to_target is None else self.steps_to_target,
            "time_to_target_s": opt(self.time_to_target_s, 4),
            "framework": self.framework, "source": self.source,
            "link_bytes_per_s": opt(self.link_bytes_per_s, 1),
            "calibration_id": self.calibration_id or "", "congestion_control": self.congestion_control or "",
            **straggler_cells(self.stragglers), **rank_cells(self.ranks), **provenance.cells(self.provenance),
            **{name: (self.algorithm or {}).get(name, "") for name in ALGORITHM_KEYS},
            **node_columns.cells(self.compute),
        }

    def _resource_cells(self) -> dict[str, Any]:
        """Mean CPU use over processes, the largest process, bytes over all nodes (empty
        without --sample-resources)."""
        cells = totals([Usage(**{k: v for k, v in r.items() if k != "key"}) for r in self.resources])
        return {k: "" if v is None else (round(v, 4) if isinstance(v, float) else v) for k, v in cells.items()}

    def _verify_cells(self) -> dict[str, Any]:
        """Configured beside measured for the point (empty without --verify)."""
        checks = {c["metric"]: c for c in (self.verify or {}).get("checks", ())}

        def cell(metric: str, key: str, scale: float, digits: int):
            value = checks.get(metric, {}).get(key)
            return "" if value is None else round(value * scale, digits)

        return {"verify_rtt_configured_ms": cell("rtt", "configured", 1, 3),
                "verify_rtt_measured_ms": cell("rtt", "measured", 1, 3),
                "verify_loss_configured_pct": cell("loss", "configured", 100, 4),
                "verify_loss_measured_pct": cell("loss", "measured", 100, 4),
                "verify_rate_measured_mbit": cell("rate", "measured", 1e-6, 3),
                "verify_ok": "" if self.verify is None else ("error" if "error" in self.verify
                                                             else str(self.verify.get("ok")).lower())}


class ResultsError(UsageError):
    """A results folder this netbench cannot add to."""


class ResultStore:
    """The results folder of one sweep."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory = Path(directory)
        self.csv_path = directory / RESULTS_CSV
        self.runs_dir = directory / RUNS_DIR
        self.logs_dir = directory / LOGS_DIR
        self.playbook_path = directory / PLAYBOOK_RECORD
        self._rows: set[str] | None = None
        self.columns: tuple[str, ...] = CSV_COLUMNS  # the header: CSV_COLUMNS and the per-node columns so far

    def create(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if not self.csv_path.exists():
            with open(self.csv_path, "w", newline="", encoding="utf-8") as fh:
                csv.DictWriter(fh, fieldnames=CSV_COLUMNS).writeheader()
        with open(self.csv_path, newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
        self.columns = node_columns.header(CSV_COLUMNS, header)
        if tuple(header) != self.columns:
            if not set(header) <= set(self.columns):
                unknown = ", ".join(sorted(set(header) - set(self.columns)))
                raise ResultsError(f"{self.csv_path}: columns this netbench does not write ({unknown})",
                                   hint="give another folder with --output")
            # written by an older netbench (fewer columns): rewrite it with today's, keeping every row
            self._rewrite_rows(drop=set(), extra=[])
        self._add_missing_rows()

    def add(self, result: RunResult) -> None:
        """The run's record, then its row. Resume counts a run done by its record, so a crash
        between the two leaves a record whose row `create` adds back, never a run done twice;
        a row already there for this run (an older netbench wrote the row first) is replaced."""
        # the same JSON as asdict(result), without asdict's deep copy of every step event
        write_json(self.runs_dir / f"{result.run_id}.json", {f.name: getattr(result, f.name) for f in fields(result)})
        row = result.csv_row()
        if result.run_id in self._row_ids() or not set(row) <= set(self.columns):
            self.columns = node_columns.header(CSV_COLUMNS, set(self.columns) | set(row))  # a node limited for the first time
            self._rewrite_rows(drop={result.run_id}, extra=[row])
        else:
            self._append_rows([row])
        self._row_ids().add(result.run_id)

    def _row_ids(self) -> set[str]:
        """The run ids results.csv holds a row for (read once, then kept up to date)."""
        if self._rows is None:
            self._rows = {row.get("run_id") or "" for row in self.read_rows()}
        return self._rows

    def _append_rows(self, rows: list[dict[str, Any]]) -> None:
        with open(self.csv_path, "a", newline="", encoding="utf-8") as fh:
            csv.DictWriter(fh, fieldnames=self.columns, restval="").writerows(rows)
            fh.flush()
            os.fsync(fh.fileno())

    def _rewrite_rows(self, drop: set[str], extra: list[dict[str, Any]]) -> None:
        """results.csv again (atomically), without the rows of `drop`, with `extra` at the end."""
        rows = [row for row in self.read_rows() if row.get("run_id") not in drop] + extra
        tmp = self.csv_path.with_name(self.csv_path.name + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.csv_path)

    def _add_missing_rows(self) -> None:
        """A row for each run record that has none (a crash between the two)."""
        have = self._row_ids()
        names = {f.name for f in fields(RunResult)}
        missing = []
        for path in self.record_paths():
            if path.stem in have:  # the usual case, not read: a record holds every step event
                continue
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                result = RunResult(**{k: v for k, v in record.items() if k in names})
            except (OSError, ValueError, TypeError, AttributeError):
                continue  # a record this netbench cannot read: its run is not counted done either
            if result.run_id not in have:
                missing.append(result)
        if missing:
            rows = [r.csv_row() for r in missing]
            if not set().union(*rows) <= set(self.columns):
                self.columns = node_columns.header(CSV_COLUMNS, set(self.columns).union(*rows))
                self._rewrite_rows(drop=set(), extra=rows)
            else:
                self._append_rows(rows)
            have.update(r.run_id for r in missing)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json(self.dir / MANIFEST, manifest)

    def read_manifest(self) -> dict[str, Any] | None:
        """manifest.json (the last sweep that wrote into the folder); None when there is none."""
        path = self.dir / MANIFEST
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsError(f"{path}: unreadable: {exc}") from None

    def read_rows(self) -> list[dict[str, str]]:
        with open(self.csv_path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))

    def log_dir(self, name: str) -> Path:
        """A new folder for the process logs of a run or a launch: logs/<name>/, or, when the
        folder already holds that one (a playbook's run repeated on resume), logs/<name>.<n>/
        with n = 2, 3, ...: one attempt's logs are never mixed with, or explained by, another's."""
        path, attempt = self.logs_dir / name, 1
        while path.exists():
            attempt += 1
            path = self.logs_dir / f"{name}.{attempt}"
        return path

    def next_launch(self) -> int:
        """The number a new launch takes: after every launch whose logs the folder holds
        (logs/launch<NNN>/ of an earlier session: --append, a resumed playbook)."""
        numbers = [int(p.name[len("launch"):].split(".")[0]) for p in self.logs_dir.glob("launch*")
                   if p.name[len("launch"):].split(".")[0].isdigit()] if self.logs_dir.is_dir() else []
        return max(numbers, default=-1) + 1

    def record_paths(self) -> list[Path]:
        """Every run record (runs/<id>.json), in run id order; none for a folder without runs/."""
        return sorted(self.runs_dir.glob("*.json")) if self.runs_dir.is_dir() else []

    def records(self) -> dict[str, dict[str, Any]]:
        """run id -> every run record with a status; a torn or unreadable one counts as not done
        (the run is repeated, and a campaign's merge and status say it is missing)."""
        out: dict[str, dict[str, Any]] = {}
        for path in self.record_paths():
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(record, dict) and isinstance(record.get("status"), str):
                out[str(record.get("run_id", path.stem))] = record
        return out

    def statuses(self) -> dict[str, str]:
        """run id -> status of every run record (`records`)."""
        return {run_id: record["status"] for run_id, record in self.records().items()}

    def read_playbook(self) -> dict[str, Any] | None:
        """The playbook record (playbook.json) of a playbook's folder; None when there is none."""
        if not self.playbook_path.exists():
            return None
        try:
            return json.loads(self.playbook_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsError(f"{self.playbook_path}: unreadable: {exc}",
                               hint="give another folder with --output") from None

    def write_playbook(self, record: dict[str, Any], source_text: str | None = None) -> None:
        """Keep a playbook's record (playbook.json) and, when given, the playbook as run (playbook.yaml)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json(self.playbook_path, record)
        if source_text is not None:
            (self.dir / PLAYBOOK_COPY).write_text(source_text, encoding="utf-8")


def recorded_statuses(results_dir: Path) -> dict[str, str]:
    """run id -> status of every run record in a results folder (runs/<id>.json)."""
    return ResultStore(Path(results_dir)).statuses()


def first_run_index(directory: Path, append: bool) -> int:
    """The index a sweep's first run takes in `directory`: 0 for a new or empty folder.

    A folder that holds anything is refused (a second sweep would overwrite runs/r000.json
    and mix its rows into results.csv) unless `append`; then the runs are numbered after
    every run already recorded there (runs/, logs/, results.csv), so none is overwritten."""
    directory = Path(directory)
    if not directory.is_dir() or not any(directory.iterdir()):
        return 0
    if not append:
        raise ResultsError(f"{directory}: already holds results (or other files)",
                           hint="give a new folder with --output, or --append to add this sweep's runs to it")
    store = ResultStore(directory)
    ids = [p.stem for p in store.runs_dir.glob("*.json")] + [p.name for p in store.logs_dir.glob("*")]
    if store.csv_path.is_file():
        ids += [row.get("run_id") or "" for row in store.read_rows()]
    numbers = [int(i[1:]) for i in ids if len(i) > 1 and i[0] == "r" and i[1:].isdigit()]
    return max(numbers, default=-1) + 1


def environment_facts() -> dict[str, Any]:
    """Versions and host facts a result needs to be reproduced (a package not installed: None)."""
    facts: dict[str, Any] = {
        "netbench": __version__, "python": platform.python_version(), "host": platform.node(),
        "kernel": platform.release(), "machine": platform.machine(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "executable": sys.executable,
    }
    for key, packages in (("tensorflow", ("tensorflow-cpu", "tensorflow")), ("pyroute2", ("pyroute2",)),
                          ("torch", ("torch",))):
        facts[key] = next((v for v in map(_package_version, packages) if v is not None), None)
    return facts


def _package_version(name: str) -> str | None:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:  # noqa: BLE001 - any metadata failure just means unknown
        return None
