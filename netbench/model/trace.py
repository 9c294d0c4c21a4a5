"""A schedule's trace file: a CSV of measured link conditions, one step per row.

The header row names the columns: `time_s` (required, seconds from the schedule's start) and
any of `delay_ms`, `rate_mbit`, `loss_pct`. An empty cell leaves that field as it was. Row
numbers in errors are the file's line numbers (the header is row 1), as an editor shows them.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from netbench.errors import UsageError, shown
from netbench.yamlfile import _read_bytes

TRACE_COLUMNS = {"delay_ms": ("delay", "ms"), "rate_mbit": ("rate", "mbit"), "loss_pct": ("loss", "%")}
TIME_COLUMN = "time_s"
MAX_ROWS = 10_000  # a schedule's changes at most (model/schedule.py MAX_ENTRIES)
HINT = "a trace is CSV with a header row: time_s,delay_ms,rate_mbit,loss_pct (any of the last three)"


def _number(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{where}: {column}: {shown(text)} is not a number", hint=HINT) from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{where}: {column}: {shown(text)} must be a finite number, 0 or more", hint=HINT)
    return value


def read_trace(path: Path) -> list[tuple[int, float, dict[str, str]]]:
    """(row number, time in seconds, profile-file keys with their values as text) per data row.

    The values come back with their units ("12.5ms", "100mbit", "1%") so the schedule parses
    and validates them as it does a step's; a bad row is refused naming file, row and column."""
    data = _read_bytes(Path(path), "trace", UsageError, "the trace path is relative to the schedule file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None
    reader = csv.reader(io.StringIO(text))
    try:
        rows = list(reader)
    except csv.Error as exc:  # a field over csv's 128 KiB limit, a NUL byte
        raise UsageError(f"{path}: row {reader.line_num}: not CSV: {shown(str(exc))}", hint=HINT) from None
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise UsageError(f"{path}: row 1: the trace has no header row", hint=HINT)
    header = [cell.strip() for cell in rows[0]]
    for column in header:
        if column != TIME_COLUMN and column not in TRACE_COLUMNS:
            raise UsageError(f"{path}: row 1: {shown(column)}: unknown column", hint=HINT)
    if TIME_COLUMN not in header:
        raise UsageError(f"{path}: row 1: {TIME_COLUMN}: the header has no time_s column", hint=HINT)
    if len(set(header)) != len(header):
        raise UsageError(f"{path}: row 1: a column is named twice", hint=HINT)
    if len(rows) - 1 > MAX_ROWS:
        raise UsageError(f"{path}: over {MAX_ROWS} rows", hint="thin the trace out")
    out = []
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        where = f"{path}: row {number}"
        if len(row) != len(header):
            raise UsageError(f"{where}: has {len(row)} cells, the header {len(header)}", hint=HINT)
        cells = dict(zip(header, (cell.strip() for cell in row)))
        if not cells[TIME_COLUMN]:
            raise UsageError(f"{where}: {TIME_COLUMN}: empty", hint=HINT)
        at_s = _number(cells[TIME_COLUMN], where, TIME_COLUMN)
        fields = {}
        for column, (key, unit) in TRACE_COLUMNS.items():
            if cells.get(column):
                value = _number(cells[column], where, column)
                # a measured delay keeps whole microseconds, as every delay does (units.parse_duration_us)
                fields[key] = f"{round(value * 1000)}us" if key == "delay" else f"{value:.15g}{unit}"
        out.append((number, at_s, fields))
    if not out:
        raise UsageError(f"{path}: the trace has no rows", hint=HINT)
    return out
