"""Rendering `netbench collective`: one nccl-tests-like table per point and framework (rich;
the library never prints)."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from netbench import console
from netbench.model.collective import format_bytes

_OP_TITLE = {"allreduce": "all-reduce", "broadcast": "broadcast", "allgather": "all-gather"}


def point_table(point) -> Table:
    """size, then per operation time (us), algbw and busbw (Gbit/s), as nccl-tests prints them."""
    facts = point.facts()
    rate = "unshaped" if facts["rate_mbit"] is None else f"{facts['rate_mbit']:g} mbit"
    fit = "" if point.fit is None else (f"; all-reduce fit: alpha {point.fit.alpha_s * 1e3:.3f} ms, "
                                        f"beta {point.fit.beta_s_per_byte * 8e9:.3f} ns/bit "
                                        f"({8 / point.fit.beta_s_per_byte / 1e6:.1f} mbit/s)"
                                        if point.fit.beta_s_per_byte > 0 else
                                        f"; all-reduce fit: alpha {point.fit.alpha_s * 1e3:.3f} ms, beta 0")
    table = Table(title=f"{escape(point.run_id)} {point.framework}: delay {facts['delay_ms']:g} ms, {rate}, "
                        f"loss {facts['loss_pct']:g}%, {point.workers} workers{fit}")
    table.add_column("size", justify="right")
    ops = [op for op, sizes in point.results.items() if sizes]
    for op in ops:
        title = _OP_TITLE.get(op, op)
        table.add_column(f"{title}\ntime (us)", justify="right")
        table.add_column("algbw\n(Gbit/s)", justify="right")
        table.add_column("busbw\n(Gbit/s)", justify="right")
    by_size = {}
    for op in ops:
        for s in point.results[op]:
            by_size.setdefault(s.bytes, {})[op] = s
    for size in sorted(by_size):
        cells = [format_bytes(size)]
        for op in ops:
            s = by_size[size].get(op)
            cells += ["-", "-", "-"] if s is None else [f"{s.time_s * 1e6:.1f}", f"{s.algbw_gbps:.4f}",
                                                         f"{s.busbw_gbps:.4f}"]
        table.add_row(*cells)
    return table


class CollectiveView:
    """The terminal while `netbench collective` runs (quiet: only warnings, for --json)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def started(self, config, backend: str) -> None:
        if not self.quiet:
            console.info(f"collective: {len(config.runs)} point(s), {config.workers} workers, "
                         f"{', '.join(config.frameworks)}, {len(config.settings.sizes)} sizes, backend {backend}")

    def point_started(self, run, framework: str) -> None:
        if not self.quiet:
            console.info(f"[dim]{escape(run.run_id)} {escape(run.profile.label())}: {framework} ...[/]")

    def point_finished(self, run, point) -> None:
        if not self.quiet:
            console.out.print(point_table(point))

    def note(self, text: str) -> None:
        console.warning(text) if self.quiet else console.info(f"[dim]{escape(text)}[/]")


def as_json(data: dict) -> None:
    console.plain(json.dumps(data))


def done(output) -> None:
    console.info(f"results: {escape(str(output))}/collective.csv, points.json, manifest.json, logs/")


def versus_predicted(measured_s: float | None, predicted_s: float | None, tolerance: float = 0.25) -> str:
    """", step 120 ms / predicted 100 ms (1.20 x)" for a run's line, flagged outside `tolerance`."""
    if not measured_s or not predicted_s:
        return ""
    ratio = measured_s / predicted_s
    text = f", step {measured_s * 1e3:.0f} ms / predicted {predicted_s * 1e3:.0f} ms ({ratio:.2f} x)"
    return text if abs(ratio - 1) <= tolerance else f"[yellow]{text} ![/]"
