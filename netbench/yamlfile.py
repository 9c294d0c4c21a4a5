"""Read one YAML file for a loader, with errors that name the file (and line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from netbench.errors import UsageError


def read_yaml(path: Path, what: str, error: type[UsageError], missing_hint: str | None = None) -> Any:
    """The parsed document of `path`; `error` (one line naming the file) if it is missing,
    unreadable or not YAML. `what` names the kind of file in the message ("profile")."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file", hint=missing_hint) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise error(f"{path}: broken YAML{where}: {problem}", hint="check indentation and 'key: value' syntax") from None
