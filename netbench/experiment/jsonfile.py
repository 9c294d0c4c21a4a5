"""The results folder's JSON files (run records, the manifest, playbook.json): read, and
written atomically, a run record's events one line each."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    """One JSON file of a results folder (a run record, the manifest, playbook.json)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:  # streamed: a long run's record is never one string
        if isinstance(data, dict) and isinstance(data.get("events"), (list, tuple)):
            _write_record(fh, data)
        else:
            json.dump(data, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def _write_record(fh, data: dict) -> None:
    """A run record as json.dump(indent=2, sort_keys=True) lays it out, but each event on one
    line: json.dump with an indent runs Python's encoder a value at a time (about 130 us an
    event, seconds for a long window's record, between two points of a launch), where one
    json.dumps per event runs the C encoder."""
    items = sorted(data.items())
    fh.write("{\n")
    for i, (key, value) in enumerate(items):
        fh.write(f"  {json.dumps(key)}: ")
        if key == "events" and value:
            fh.write("[\n")
            last = len(value) - 1
            for j, event in enumerate(value):
                fh.write("    " + json.dumps(event, sort_keys=True, default=str) + (",\n" if j < last else "\n"))
            fh.write("  ]")
        else:
            fh.write(json.dumps(value, indent=2, sort_keys=True, default=str).replace("\n", "\n  "))
        fh.write(",\n" if i < len(items) - 1 else "\n")
    fh.write("}")
