"""Run records and the results folder: results.csv, runs/<id>.json, manifest.json.

Each row is written (and flushed) as soon as its run ends, so an interrupted sweep keeps
every completed run.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from netbench import __version__

SCHEMA_VERSION = 1

CSV_COLUMNS = (
    "run_id", "profile", "delay_ms", "jitter_ms", "rate_mbit", "loss_pct", "backend", "strategy",
    "model", "batch_size", "global_batch_size", "workers", "repeat", "images_per_sec",
    "images_per_sec_stderr", "step_time_mean_s", "step_time_median_s", "step_time_p90_s",
    "step_time_stderr_s", "step_time_jitter_s", "warmup_steps", "steps", "status", "error",
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
    schema_version: int = SCHEMA_VERSION

    def csv_row(self) -> dict[str, Any]:
        p = self.profile
        s = self.stats or {}
        rate = p.get("rate_bps")

        def num(key: str, digits: int = 6):
            return "" if key not in s else round(s[key], digits)

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
            "steps": s.get("steps", 0), "status": self.status, "error": self.error,
        }


class ResultStore:
    """The results folder of one sweep."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.csv_path = directory / "results.csv"
        self.runs_dir = directory / "runs"
        self.logs_dir = directory / "logs"

    def create(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if not self.csv_path.exists():
            with open(self.csv_path, "w", newline="", encoding="utf-8") as fh:
                csv.DictWriter(fh, fieldnames=CSV_COLUMNS).writeheader()

    def add(self, result: RunResult) -> None:
        with open(self.csv_path, "a", newline="", encoding="utf-8") as fh:
            csv.DictWriter(fh, fieldnames=CSV_COLUMNS).writerow(result.csv_row())
            fh.flush()
            os.fsync(fh.fileno())
        write_json(self.runs_dir / f"{result.run_id}.json", asdict(result))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json(self.dir / "manifest.json", manifest)

    def read_rows(self) -> list[dict[str, str]]:
        with open(self.csv_path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def environment_facts() -> dict[str, Any]:
    """Versions and host facts a result needs to be reproduced."""
    facts: dict[str, Any] = {
        "netbench": __version__, "python": platform.python_version(),
        "kernel": platform.release(), "machine": platform.machine(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "executable": sys.executable,
    }
    try:
        from importlib.metadata import version

        facts["tensorflow"] = version("tensorflow-cpu")
    except Exception:  # noqa: BLE001 - any metadata failure just means unknown
        try:
            from importlib.metadata import version

            facts["tensorflow"] = version("tensorflow")
        except Exception:  # noqa: BLE001
            facts["tensorflow"] = None
    try:
        from importlib.metadata import version

        facts["pyroute2"] = version("pyroute2")
    except Exception:  # noqa: BLE001
        facts["pyroute2"] = None
    return facts
