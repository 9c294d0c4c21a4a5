"""report.md's "Measured and predicted" table: each run's measured step beside the step model's
prediction (results.csv's predicted_step_s, from the sweep's calibrations), flagged outside 25 %,
with what the model leaves out at the point (predicted_omits): a flagged run that names one says why."""

from __future__ import annotations

import csv
from pathlib import Path

TOLERANCE = 0.25


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def predicted_blocks(results_csv: Path, tolerance: float = TOLERANCE) -> list:
    """The table as report blocks; none when no run has a prediction (an older folder, --no-predict)."""
    from netbench.report.document import Heading, Paragraph, Table

    if not results_csv.is_file():
        return []
    with open(results_csv, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if _number(r.get("predicted_step_s")) and _number(r.get("step_time_mean_s"))]
    if not rows:
        return []
    cells, outside, said = [], 0, 0
    for r in rows:
        measured, predicted = float(r["step_time_mean_s"]), float(r["predicted_step_s"])
        ratio = measured / predicted
        flag = "" if abs(ratio - 1) <= tolerance else " !"
        omits = r.get("predicted_omits") or ""
        outside += bool(flag)
        said += bool(flag and omits)
        cells.append((r["run_id"], r["profile"], r["strategy"], r["model"], r["workers"], f"{measured * 1e3:.1f}",
                      f"{predicted * 1e3:.1f}", f"{ratio:.2f}{flag}", omits))
    unexplained = f"; {outside - said} of them with no term named" if outside else ""
    return [Heading("Measured and predicted steps"),
            Paragraph(f"The step model's prediction (docs/guide/collectives.md) from the sweep's calibrations, never from the run's own steps; ! marks a run "
                      f"outside {tolerance:.0%}. \"Not modelled\" names what the model leaves out at the point "
                      "(results.csv's predicted_omits): a run outside that names one says why."),
            Table(("run", "profile", "strategy", "model", "workers", "measured step (ms)", "predicted (ms)",
                   "measured / predicted", "not modelled"), tuple(cells)),
            Paragraph(f"{len(rows) - outside} of {len(rows)} runs within {tolerance:.0%} of the prediction"
                      f"{unexplained}.")]


def predicted_lines(results_csv: Path, tolerance: float = TOLERANCE) -> list[str]:
    """The same as markdown lines."""
    from netbench.report.document import to_markdown

    blocks = predicted_blocks(results_csv, tolerance)
    return to_markdown(blocks).splitlines() if blocks else []
