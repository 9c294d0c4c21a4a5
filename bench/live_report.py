"""bench/live_changes.py's tables: one run's changes, or netem's beside an engine's (pure)."""

from __future__ import annotations

import statistics

import transients as tr

DIRECTIONS = ("there", "back")


def _label(case: dict, direction: str) -> str:
    a, b = case["a"], case["b"]
    src, dst = (a, b) if direction == "there" else (b, a)
    keys = [k for k in ("delay", "rate", "loss", "jitter") if src.get(k) != dst.get(k)]
    text = ", ".join(f"{k} {src.get(k, 0)} -> {dst.get(k, 0)}" for k in keys)
    return text + ("" if case.get("cc", "cubic") == "cubic" else f" ({case['cc']})")


def changes_of(results: dict) -> dict[tuple[str, str], list[dict]]:
    """(case, direction) -> every repetition's record of that change."""
    out: dict[tuple[str, str], list[dict]] = {}
    for name, data in results["cases"].items():
        for rep in data["repetitions"]:
            for change in rep:
                out.setdefault((name, change["direction"]), []).append(change)
    return out


def rtt_ms(changes: list[dict], start: float, end: float) -> float:
    """The median of the sender's RTT samples between `start` and `end` s of each change."""
    values = [row["rtt_ms"] for c in changes for row in c.get("tcp", []) if start <= row["t"] < end]
    return statistics.median(values) if values else float("nan")


def summary(results: dict) -> dict[tuple[str, str], dict]:
    """(case, direction) -> {"label", "spread": figure -> Spread, "rtt_before", "rtt_after",
    "retransmits" (median per change), "incomplete" (repetitions whose samples had holes)}."""
    meta = results["meta"]
    out = {}
    for (name, direction), changes in changes_of(results).items():
        figures = [tr.Transient(**c["figures"]) for c in changes]
        after, before = meta["after_s"], meta["before_s"]
        out[(name, direction)] = {
            "label": _label(results["cases"][name]["case"], direction),
            "spread": tr.summarise(figures),
            "rtt_before": rtt_ms(changes, -before, 0.0),
            "rtt_after": rtt_ms(changes, after, after + before),
            "retransmits": statistics.median(sum(r["retransmits"] for r in c.get("tcp", []) if 0 <= r["t"] < after)
                                             for c in changes),
            "incomplete": sum(not c.get("complete", True) for c in changes),
        }
    return out


def _spread(s: tr.Spread, scale: float, fmt: str) -> str:
    if s.n == 0:
        return "-"
    if s.n == 1 or s.low == s.high:
        return format(s.median * scale, fmt)
    return f"{s.median * scale:{fmt}} ({s.low * scale:{fmt}}-{s.high * scale:{fmt}})"


COLUMNS = (("t90_s", 1.0, ".1f", "to 90 % (s)"), ("lowest", 1e-6, ".0f", "lowest 100 ms (Mbit/s)"),
           ("bytes_after", 1e-6, ".0f", "MB in 10 s"), ("steady_before", 1e-6, ".0f", "before (Mbit/s)"),
           ("steady_after", 1e-6, ".0f", "steady after (Mbit/s)"))


def table(results: dict) -> str:
    """One run: a markdown row per change, each figure's median (range) over repetitions."""
    meta = results["meta"]
    head = (f"{meta['backend']} on {meta['kernel']} ({meta['cpus']} CPUs), {meta['repeats']} repetitions, "
            f"commit {meta['commit']}; median (range)")
    cols = ["change", *(c[3] for c in COLUMNS), "RTT before -> after (ms)", "retransmits"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key, row in summary(results).items():
        cells = [row["label"], *(_spread(row["spread"][f], s, fmt) for f, s, fmt, _ in COLUMNS),
                 f"{row['rtt_before']:.1f} -> {row['rtt_after']:.1f}", f"{row['retransmits']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare_table(netem: dict, engine: dict) -> str:
    """netem's and the engine's figures side by side, per change; "**" marks an engine median
    outside netem's range (transients.beyond)."""
    ref, other = summary(netem), summary(engine)
    m, e = netem["meta"], engine["meta"]
    head = (f"netem: {m['backend']} on {m['kernel']}, {m['repeats']} repetitions; engine: {e['backend']} on "
            f"{e['kernel']}, {e['repeats']} repetitions; median (range); ** the engine's median lies outside "
            "netem's range")
    cols = ["change"]
    for _, _, _, name in COLUMNS[:3]:
        cols += [f"{name} netem", "engine"]
    cols += ["steady after (Mbit/s) netem", "engine"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key, row in ref.items():
        if key not in other:
            continue
        cells = [row["label"]]
        for figure, scale, fmt, _ in (*COLUMNS[:3], COLUMNS[4]):
            a, b = row["spread"][figure], other[key]["spread"][figure]
            mark = "**" if tr.beyond(a, b, figure) else ""
            cells += [_spread(a, scale, fmt), f"{mark}{_spread(b, scale, fmt)}{mark}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
