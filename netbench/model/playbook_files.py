"""A playbook's error, and the files a playbook names (a topology, schedules), each loaded
relative to the playbook and checked, its errors naming the playbook and the key (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from netbench.errors import ProfileError, UsageError, shown


class PlaybookError(UsageError):
    """A playbook that cannot be loaded, fails validation, or does not match its results."""


def fail(source: str, key: str, message: str, hint: str | None = None) -> PlaybookError:
    error = PlaybookError(f"{source}: {key}: {message}", hint=hint)
    error.key, error.detail = key, message
    return error


def topology_of(data: Mapping, source: str, base_dir: Path | None) -> Any:
    """`topology: path` (relative to the playbook): the per-pair topology every run applies."""
    from netbench.model.pairs_file import load_pair_topology

    ref = data["topology"]
    if not isinstance(ref, str) or not ref.strip():
        raise fail(source, "topology", f"must be a path to a topology file, got {shown(ref)}",
                   "e.g. 'topology: ../profiles/topologies/two-regions.yaml'")
    path = Path(ref) if Path(ref).is_absolute() else (base_dir or Path(".")) / ref.strip()
    try:
        return load_pair_topology(path)
    except ProfileError as exc:
        raise fail(source, "topology", exc.message, exc.hint) from None


def schedules_of(raw: Any, source: str, base_dir: Path | None) -> tuple[tuple[str, Any], ...]:
    """`schedule: path` or a list of paths (relative to the playbook), each loaded and checked."""
    from netbench.model.schedule import load_schedule

    paths = raw if isinstance(raw, (list, tuple)) else [raw]
    if not paths:
        raise fail(source, "schedule", "must be a path to a schedule file or a non-empty list of them",
                   "e.g. 'schedule: ../profiles/schedules/spike.yaml'")
    out: list[tuple[str, Any]] = []
    names: set[str] = set()
    for i, ref in enumerate(paths):
        key = "schedule" if not isinstance(raw, (list, tuple)) else f"schedule[{i}]"
        if not isinstance(ref, str) or not ref.strip():
            raise fail(source, key, f"must be a path to a schedule file, got {shown(ref)}",
                       "e.g. 'schedule: ../profiles/schedules/spike.yaml'")
        path = Path(ref) if Path(ref).is_absolute() else (base_dir or Path(".")) / ref
        try:
            schedule = load_schedule(path)
        except UsageError as exc:
            raise fail(source, key, exc.message, exc.hint) from None
        if schedule.name in names:
            raise fail(source, key, f"two schedules are named {shown(schedule.name)}; a schedule names its runs",
                       "give one of them another 'name:'")
        names.add(schedule.name)
        out.append((ref.strip(), schedule))  # as written: a results folder resumes from any directory
    return tuple(out)
