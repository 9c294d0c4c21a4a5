"""How the terminal shows a point measured in bytes on its links (a user's command that
reports no steps: jobs/link_bytes.py): bytes per second, never as images/sec."""

from __future__ import annotations

from typing import Sequence

from netbench.jobs.link_bytes import SOURCE_BYTES

STATUS = "ok (bytes)"  # the tables' status cell of such a point
LINK_COLUMN = "link_bytes_per_s"  # results.csv's column: the mean bytes each node sent per second


def is_bytes(result) -> bool:
    return getattr(result, "source", "") == SOURCE_BYTES


def bytes_rate(bytes_per_s: float | None) -> str:
    """"2.41 MB/s (19.3 Mbit/s)"; "-" for none."""
    if bytes_per_s is None:
        return "-"
    return f"{bytes_per_s / 1e6:,.2f} MB/s ({bytes_per_s * 8 / 1e6:,.1f} Mbit/s)"


def finished_text(result) -> str:
    """The point's line when it ends: what each node sent per second, said to be bytes."""
    window = (result.link_bytes or {}).get("window_s")
    over = f" over {window:g} s" if window else ""
    return (f"[cyan]measured in bytes, not steps[/]: each node sent {bytes_rate(result.link_bytes_per_s)} on its "
            f"link{over} (no images/s: the job reports no steps)")


def summary_note(results: Sequence) -> str:
    """A line under the sweep's table when some point was measured in bytes ("" when none was)."""
    shown = [f"{r.run_id} {bytes_rate(r.link_bytes_per_s)}" for r in results if is_bytes(r) and r.status == "ok"]
    if not shown:
        return ""
    return ("measured in bytes, not steps (the job reports no steps: no images/s; mean bytes each node sent "
            "per second on its link, results.csv link_bytes_per_s): " + ", ".join(shown))


def status_cell(result) -> str:
    """The sweep table's status: "ok (bytes)" for a point measured in bytes."""
    from rich.markup import escape

    if result.status != "ok":
        return f"[red]{escape(result.status)}[/]"
    return STATUS if is_bytes(result) else "ok"
