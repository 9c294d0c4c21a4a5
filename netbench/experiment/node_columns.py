"""results.csv's columns per limited node: cpus_<node> and step_delay_s_<node> (pure).

A sweep that limits n2 gets cpus_n2 (and step_delay_s_n2 where it delays its steps); "all"
stands for a limit on every node. They follow the fixed columns, sorted, and appear in a
folder's header once a run needs them (the store rewrites it then).
"""

from __future__ import annotations

from typing import Any, Iterable

PREFIXES = ("cpus_", "step_delay_s_")


def _tag(node: str) -> str:
    return "all" if node == "*" else node


def is_node_column(name: str) -> bool:
    return name.startswith(PREFIXES)


def header(fixed: tuple[str, ...], extra: Iterable[str]) -> tuple[str, ...]:
    """`fixed`, then the per-node columns among `extra`, sorted."""
    return fixed + tuple(sorted({c for c in extra if is_node_column(c)}))


def cells(record: dict[str, Any] | None) -> dict[str, Any]:
    """A run record's `compute` (model.compute.Compute.to_record) as its row's cells."""
    record = record or {}
    out = {f"cpus_{_tag(n)}": v for n, v in (record.get("cpus") or {}).items()}
    out.update((f"step_delay_s_{_tag(n)}", v) for n, v in (record.get("step_delay_s") or {}).items())
    return out
