"""The calibrations' cache: one file per calibration, keyed by everything it measured.

A sweep's calibrations (experiment/predict.py: the all-reduce, the exchange protocol, each
job's compute) cost seconds each and measure the machine, not the sweep's points. Each one is
kept as `<cache>/<id>.json`, where the id is a digest of its `Key`: what it measured (the
kind; the framework, model, batch, input and data; the device (cpu or cuda) and GPUs per node;
the processes and nodes; the sizes), where (the testbed kind, the backend, the nodes' TCP
congestion control, and the links it measured on: "unshaped") and on what (`Host`: the machine
id, kernel release, cpu count, its GPUs and driver as nvidia-smi names them, python and netbench
versions, the frameworks' versions). A later sweep whose calibration has the same key reuses
the file, unless it is older than MAX_AGE_S (24 h), was measured on another kernel, or the
sweep asked `--recalibrate`.

Only a calibration made on unshaped links is kept: the predictions add each point's delay and
rate to what it measured, so one made on links that were still shaped (a `netbench apply` before
the sweep) would count them twice, for a day. The embedded testbed clears netbench's shaping
before calibrating (runner.calibration_links); where a target cannot say what its links hold
(the hosts), nothing is cached.

The cache folder: NETBENCH_CACHE_DIR, else `calibrations/` under NETBENCH_STATE_DIR when that
is set (tests, private runs), else `netbench/calibrations` under XDG_CACHE_HOME or ~/.cache.
This module owns the file format; the decisions (`Key`, `calibration_id`, `refusal`) are pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from netbench import __version__, units

SCHEMA = 1
MAX_AGE_S = 24 * 3600.0  # a calibration older than this is measured again (load and versions drift)
CACHE_ENV = "NETBENCH_CACHE_DIR"
KINDS = ("compute", "allreduce", "exchange", "base")
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


@dataclass(frozen=True)
class Host:
    """The machine a calibration ran on, and the facts that change what it measures."""

    machine_id: str
    kernel: str
    cpus: int
    python: str
    netbench: str
    frameworks: tuple[tuple[str, str], ...] = ()  # (name, version) of tensorflow / torch, where installed
    gpus: tuple[str, ...] = ()  # nvidia-smi's GPUs ("0: NVIDIA H100 80GB HBM3, 81559 MiB") and "driver X"


@dataclass(frozen=True)
class Key:
    """Everything one calibration measured: its kind, what it ran (`measured`, sorted name/value
    pairs), where (`place`: testbed kind, backend, congestion control) and on which host."""

    kind: str
    measured: tuple[tuple[str, Any], ...]
    place: tuple[tuple[str, Any], ...]
    host: Host

    def to_json(self) -> dict[str, Any]:
        host = asdict(self.host)
        host["frameworks"] = dict(self.host.frameworks)
        host["gpus"] = list(self.host.gpus)  # as its JSON reads back
        return {"kind": self.kind, "measured": dict(self.measured), "place": dict(self.place), "host": host}


def make_key(kind: str, measured: Mapping[str, Any], place: Mapping[str, Any], host: Host) -> Key:
    if kind not in KINDS:
        raise ValueError(f"unknown calibration kind {kind!r}")
    return Key(kind, tuple(sorted(measured.items())), tuple(sorted(place.items())), host)


def calibration_id(key: Key | Mapping[str, Any]) -> str:
    """A short stable name for `key` (12 hex digits of the SHA-256 of its canonical JSON), the
    kind first: "allreduce-3f2a9c0b1d4e"."""
    doc = key.to_json() if isinstance(key, Key) else dict(key)
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()
    return f"{doc['kind']}-{digest[:12]}"


@dataclass(frozen=True)
class Entry:
    """One stored calibration: its key, when it was measured (Unix time), the value the
    predictions use and the facts the manifest shows."""

    id: str
    key: dict[str, Any]
    measured_at: float
    value: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def refusal(entry: Entry, key: Key, now: float, max_age_s: float = MAX_AGE_S) -> str | None:
    """Why `entry` may not stand for a calibration of `key` at `now`, or None when it may (pure)."""
    if entry.schema != SCHEMA:
        return f"written by another netbench (cache schema {entry.schema})"
    wanted = key.to_json()
    kernel = (entry.key.get("host") or {}).get("kernel")
    if kernel != key.host.kernel:
        return f"measured on kernel {kernel}, this one is {key.host.kernel}"
    if entry.key != wanted or entry.id != calibration_id(key):
        return "measured something else"
    age = now - entry.measured_at
    if age < 0:
        return "its time is in the future (the clock moved back)"
    if age > max_age_s:
        return f"{age / 3600:.1f} h old, over the {max_age_s / 3600:g} h limit"
    return None


def age_text(seconds: float) -> str:
    """"42 s", "12 min", "3.5 h" (a reused calibration's age, for the terminal)."""
    return units.format_wall_seconds(seconds, digits=0)


def entry_from_json(doc: Mapping[str, Any]) -> Entry:
    """An Entry from a cache file's JSON; ValueError when it is not one."""
    try:
        return Entry(id=str(doc["id"]), key=dict(doc["key"]), measured_at=float(doc["measured_at"]),
                     value=dict(doc["value"]), facts=dict(doc.get("facts") or {}), schema=int(doc.get("schema", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a calibration: {exc}") from None


# the edge: the host's facts and the cache folder


def _machine_id() -> str:
    for path in MACHINE_ID_FILES:
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text:
            return text
    return "host:" + platform.node()  # no machine id: the hostname stands for it


def _framework_versions() -> tuple[tuple[str, str], ...]:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("tensorflow-cpu", "tensorflow", "torch"):
        try:
            found.append((name, version(name)))
        except PackageNotFoundError:
            continue
    return tuple(found)


def host_facts(gpus: Callable[[], tuple[str, ...]] | None = None) -> Host:
    """This machine's identity and the facts that change what a calibration measures (`gpus`:
    its GPU identity, nvidia-smi's by default)."""
    if gpus is None:
        from netbench.experiment.gpus import smi_identity as gpus
    return Host(machine_id=_machine_id(), kernel=platform.release(), cpus=os.cpu_count() or 0,
                python=platform.python_version(), netbench=__version__, frameworks=_framework_versions(),
                gpus=tuple(gpus()))


def default_folder(env: Mapping[str, str] | None = None) -> Path:
    """NETBENCH_CACHE_DIR; else NETBENCH_STATE_DIR/calibrations (not a sandbox's: it is gone with
    it, testbed/sandbox.py); else XDG_CACHE_HOME (or ~/.cache)/netbench/calibrations."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    if env.get("NETBENCH_STATE_DIR") and not env.get("NETBENCH_SANDBOX"):
        return Path(env["NETBENCH_STATE_DIR"]) / "calibrations"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "netbench" / "calibrations"


class CalibrationCache:
    """The cache folder: `lookup` a key's entry (or why none may be reused), `store` a new one.
    Neither ever fails a sweep: an unreadable file is a miss, a folder that cannot be written
    keeps nothing (`store` says why in the entry's facts)."""

    def __init__(self, folder: Path | None = None, clock: Callable[[], float] = time.time,
                 max_age_s: float = MAX_AGE_S) -> None:
        self.folder = Path(folder) if folder is not None else default_folder()
        self.clock = clock
        self.max_age_s = max_age_s

    def path(self, key: Key) -> Path:
        return self.folder / f"{calibration_id(key)}.json"

    def lookup(self, key: Key) -> tuple[Entry | None, str]:
        """(the entry to reuse, "") or (None, why not: "none cached", too old, another kernel ...)."""
        path = self.path(key)
        try:
            entry = entry_from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None, "none cached"
        except (OSError, ValueError) as exc:
            return None, f"{path.name} unreadable ({exc})"
        why = refusal(entry, key, self.clock(), self.max_age_s)
        return (None, why) if why else (entry, "")

    def store(self, key: Key, value: dict[str, Any], facts: dict[str, Any]) -> tuple[Entry, str | None]:
        """Keep a calibration just measured: (its entry, None) or (its entry, why it was not kept)."""
        entry = Entry(id=calibration_id(key), key=key.to_json(), measured_at=self.clock(), value=value, facts=facts)
        path = self.path(key)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(entry.to_json(), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            return entry, f"not kept in {self.folder}: {exc.strerror or exc}"
        return entry, None
