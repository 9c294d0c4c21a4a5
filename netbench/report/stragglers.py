"""The report's "Who waits for whom" section: per run, each rank's step time and the rank the
others waited for (the run records' ``stragglers``: jobs/stragglers.py's definitions).

One row per ok run that has the record: its point, the straggler and its share of steps,
the share of their step the others waited, the spread of the ranks' own rates, each rank's
mean step time (and, with backup workers, the gradients dropped per rank). Runs from before
the record (schema < 12) or with a single rank have no row; no rows, no section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from netbench.experiment.store import ResultStore, read_json
from netbench.report.document import Block, Heading, Paragraph, Table

EXPLAINED = ("A synchronous step waits for the rank whose computation ended last: it *finished last*, and the "
             "others waited from the end of their own computation until then (from each rank's step time less "
             "its computation, so ranks on different clocks compare). *Last in* is the share of steps the "
             "straggler finished last, *others waited* the share of the other ranks' step time spent waiting "
             "for it. Where workers run at their own pace (ps-async, ps-ssp, easgd, gosgd, adpsgd, TF's ps, "
             "ps-sync with backup workers) the straggler is the rank with the lowest images/s and *rate spread* "
             "the fastest rank's images/s over the slowest's.")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _ranks_text(ranks: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for r in ranks:
        text = f"{r.get('node') or r['rank']} {1000 * r['step_mean_s']:.1f} ms"
        if r.get("dropped") is not None:
            text += f" ({r['dropped']} dropped)"
        parts.append(text)
    return ", ".join(parts)


def straggler_row(record: Mapping[str, Any]) -> tuple[str, ...] | None:
    """A run record's row, or None (not ok, or no attribution)."""
    found = record.get("stragglers")
    if record.get("status") != "ok" or not found:
        return None
    spread = found.get("rate_spread")
    return (record["run_id"], str(record.get("strategy", "")), str((record.get("profile") or {}).get("name", "")),
            found.get("straggler_node") or "-", _pct(found.get("straggler_share")), _pct(found.get("wait_share")),
            "-" if spread is None else f"{spread:.2f}x", _ranks_text(found.get("ranks", ())))


def straggler_blocks(results_dir: Path) -> list[Block]:
    """The section, from the folder's run records (none without a row)."""
    rows = [row for row in (straggler_row(read_json(p)) for p in ResultStore(results_dir).record_paths()) if row]
    if not rows:
        return []
    return [Heading("Who waits for whom"), Paragraph(EXPLAINED),
            Table(("run", "strategy", "profile", "straggler", "last in", "others waited", "rate spread",
                   "mean step per rank"), tuple(sorted(rows)))]
