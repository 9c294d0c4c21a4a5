"""Rendering per-pair emulation: the matrix `show` reads back and the one `verify
--all-pairs` measures (rich; the library never prints)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from netbench import console


def _rate_short(bps: float) -> str:
    """A rate to three significant figures in tc's units: 2.39gbit, 95.3mbit, 512kbit."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g}{unit}"
    return f"{bps:.0f}bit"


def held_pairs_matrix(pairs) -> None:
    """`show` for nodes shaped per destination: the one-way profile of every ordered pair
    (row: from, column: to), "-" where a pair is not shaped."""
    table = Table(title=f"per-pair emulation: one-way, from (row) to (column); {len(pairs.links)} shaped pair(s)")
    table.add_column("from \\ to")
    for name in pairs.nodes:
        table.add_column(escape(name), justify="right")
    for src in pairs.nodes:
        cells = []
        for dst in pairs.nodes:
            profile = pairs.link(src, dst)
            cells.append("[dim]-[/]" if profile is None else escape(profile.label()))
        table.add_row(escape(src), *cells)
    console.out.print(table)


def pairs_matrix(record: dict) -> None:
    """verify --all-pairs (verify_pairs.matrix_record): the RTT matrix, each cell "measured /
    configured (error)" in ms, out-of-tolerance cells marked; throughput beside it when
    measured; then every check that failed, and the verdict."""
    names = record["nodes"]
    cells = {(src, dst): cell for src, row in record["matrix"].items() for dst, cell in row.items()}

    def check(cell: dict, metric: str) -> dict:
        return next(c for c in cell["checks"] if c["metric"] == metric)

    def rtt_text(cell: dict) -> str:
        rtt = check(cell, "rtt")
        if rtt["measured"] is None:
            text = f"no reply / {rtt['configured']:.2f}"
        else:
            text = f"{rtt['measured']:.2f} / {rtt['configured']:.2f} ({rtt['error']:+.2f})"
        return text if cell["ok"] else f"[bold red]{text} ![/]"

    def rate_text(cell: dict) -> str:
        rate = check(cell, "rate")
        if rate["measured"] is None:
            return "-"
        got = _rate_short(rate["measured"])
        if rate["configured"] is None:
            return got
        text = f"{got} / {_rate_short(rate['configured'])}" + (
            "" if rate["error"] is None else f" ({rate['error']:+.1%})")
        return f"[bold red]{text} ![/]" if rate["ok"] is False else text

    def matrix(title: str, text) -> Table:
        table = Table(title=title)
        table.add_column("from \\ to")
        for name in names:
            table.add_column(escape(name), justify="right")
        for src in names:
            table.add_row(escape(src), *[text(cells[(src, dst)]) if (src, dst) in cells else "[dim]-[/]"
                                         for dst in names])
        return table

    console.out.print(matrix(f"RTT in ms, measured / configured (error); tolerance {record['tolerance']['rule']}; "
                             "! out of tolerance", rtt_text))
    if any(check(cell, "rate")["measured"] is not None for cell in cells.values()):
        console.out.print(matrix("throughput src -> dst as whole frames, measured / configured (error)", rate_text))
    for (src, dst), cell in cells.items():
        for c in cell["checks"]:
            if c["ok"] is False:
                console.info(f"[red]{escape(src)} -> {escape(dst)}[/] {c['metric']}: {escape(c['rule'])}")
    if record["ok"]:
        console.info(f"[green]all {len(cells)} pairs within tolerance[/]")
    else:
        console.info(f"[red]{len(record['failed'])} of {len(cells)} pairs out of tolerance[/]: "
                     f"{escape(', '.join(record['failed']))}")
