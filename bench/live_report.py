"""bench/live_changes.py's tables: one run's changes, or netem's beside an engine's (pure)."""

from __future__ import annotations

import statistics

import transients as tr

STEP_BYTES = 2_678_824  # the mlp's gradients: what a 2-worker all-reduce moves through each link per step

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


def new_point(results: dict, name: str, direction: str) -> dict:
    """The profile keys a change went to."""
    case = results["cases"][name]["case"]
    return case["b"] if direction == "there" else case["a"]


def new_rtt_s(results: dict, name: str, direction: str) -> float:
    """The configured round trip of the path a change went to (both nodes delay their egress)."""
    new = new_point(results, name, direction)
    return 2 * (_seconds(new.get("delay")) + _seconds(new.get("jitter")))


def figures_of(results: dict, name: str, direction: str, change: dict) -> tr.Transient:
    """A change's figures, from its 100 ms bins (recomputed: the record's own bins are the data)."""
    meta = results["meta"]
    width = meta["bin_s"]
    scale = 1e6 / 8 * width  # Mbit/s -> bytes per bin
    b, a = int(round(meta["before_s"] / width)), int(round(meta["after_s"] / width))
    bins = [m * scale for m in change["mbit"]]
    return tr.transient(bins[:b], bins[b:b + a], bins[b + a:], width,
                        window_s=tr.window_for(new_rtt_s(results, name, direction)))


def summary(results: dict) -> dict[tuple[str, str], dict]:
    """(case, direction) -> {"label", "spread": figure -> Spread, "rtt_before", "rtt_after",
    "retransmits" (median per change), "incomplete" (repetitions whose samples had holes)}."""
    meta = results["meta"]
    out = {}
    for (name, direction), changes in changes_of(results).items():
        figures = [figures_of(results, name, direction, c) for c in changes]
        after, before = meta["after_s"], meta["before_s"]
        out[(name, direction)] = {
            "label": _label(results["cases"][name]["case"], direction),
            "spread": tr.summarise(figures),
            "rtt_before": rtt_ms(changes, -before, 0.0),
            "rtt_after": rtt_ms(changes, after, after + before),
            "retransmits": statistics.median(sum(r["retransmits"] for r in c.get("tcp", []) if 0 <= r["t"] < after)
                                             for c in changes),
            "incomplete": sum(not c.get("complete", True) for c in changes),
            "late": engine_late(changes),
        }
    return out


def engine_late(changes: list[dict]) -> dict | None:
    """The engines' release lateness over these changes' flows (the first change of each
    repetition carries its flow's): the median over flows of the mean lateness (ms) and of the
    share of releases over 1 ms and over 10 ms late, the sending node's engine (the busiest);
    None for netem."""
    rows = [max(c["engines"].values(), key=lambda e: e.get("received", 0)) for c in changes if c.get("engines")]
    if not rows:
        return None

    def med(key: str, scale: float = 1.0) -> float | None:
        values = [r[key] * scale for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {"mean_ms": med("lateness_mean_us", 1e-3), "over_1ms": med("late_1ms"), "over_10ms": med("late_10ms")}


def own_dips(engine: dict, figure: str) -> bool:
    """Whether an engine figure that lies outside netem's range is its steady flow's own doing,
    not the change's: for `lowest`, its lowest 100 ms after the change is no lower than its
    lowest in the seconds before it (its median within the range before, at the resolution);
    for `t90_s`, its flow already fell under 90 % in a window before the change in most
    repetitions (short_before), so t90 times the last such dip."""
    spread = engine["spread"]
    if figure == "lowest":
        after, before = spread["lowest"], spread["lowest_before"]
        return after.n > 0 and before.n > 0 and after.median >= before.low * (1 - tr.SLACK["lowest"])
    if figure == "t90_s":
        return spread["short_before"].n > 0 and spread["short_before"].median > 0
    return False


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


BEFORE = ("lowest_before", 1e-6, ".0f", "lowest 100 ms before (Mbit/s)")


def compare_table(netem: dict, engine: dict) -> str:
    """netem's and the engine's figures side by side, per change; "**" marks an engine median
    outside netem's range (transients.beyond), "++" such a lowest 100 ms or time to 90 %, worse
    than netem's, that the engine's flow showed before the change too (own_dips: not the
    change's doing); the last
    columns are the engines' release lateness over the flows."""
    ref, other = summary(netem), summary(engine)
    m, e = netem["meta"], engine["meta"]
    head = (f"netem: {m['backend']} on {m['kernel']}, {m['repeats']} repetitions; engine: {e['backend']} on "
            f"{e['kernel']}, {e['repeats']} repetitions; median (range); ** the engine's median lies outside "
            "netem's range; ++ outside it, but the engine's flow dipped so before the change too (its own dips)")
    cols = ["change"]
    for _, _, _, name in (*COLUMNS[:3], BEFORE):
        cols += [f"{name} netem", "engine"]
    cols += ["steady after (Mbit/s) netem", "engine", "engine late: mean (ms)", "over 1 ms", "over 10 ms"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key, row in ref.items():
        if key not in other:
            continue
        cells = [row["label"]]
        for figure, scale, fmt, _ in (*COLUMNS[:3], BEFORE, COLUMNS[4]):
            a, b = row["spread"][figure], other[key]["spread"][figure]
            mark = "**" if tr.beyond(a, b, figure) else ""
            lower = b.median < a.low if figure == "lowest" else b.median > a.high  # worse than netem
            if mark and lower and own_dips(other[key], figure):
                mark = "++"
            cells += [_spread(a, scale, fmt), f"{mark}{_spread(b, scale, fmt)}{mark}"]
        late = other[key]["late"]
        cells += ["-"] * 3 if late is None else [
            "-" if late[k] is None else format(late[k], fmt) for k, fmt in
            (("mean_ms", ".2f"), ("over_1ms", ".1%"), ("over_10ms", ".1%"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _seconds(text) -> float:
    from netbench import units

    return units.parse_duration_us(text) / 1e6 if text else 0.0


def settle_ends(results: dict, step_bytes: float = STEP_BYTES) -> dict[tuple[str, str], list[float | None]]:
    """(case, direction) -> when a launch's settle (experiment/settling.py, the default Settle)
    would let the first measured step start, s after the change, in each repetition: on the
    steps of a job that moves `step_bytes` a step back to back through the traced flow (no
    compute: the network's transient as a launch's steps would see it)."""
    from netbench.experiment import settling

    settle = settling.Settle()
    meta = results["meta"]
    skip = int(round(meta["before_s"] / meta["bin_s"]))
    out: dict[tuple[str, str], list[float | None]] = {}
    for (name, direction), changes in changes_of(results).items():
        floor = settle.floor_s(new_rtt_s(results, name, direction))
        decide = lambda after, elapsed, durations, floor_s: settling.decide(  # noqa: E731
            settle, after, elapsed, durations, False, floor_s)
        for change in changes:
            rates = [m * 1e6 for m in change["mbit"][skip:]]
            steps = tr.steps_from(rates, step_bytes, meta["bin_s"])
            out.setdefault((name, direction), []).append(tr.settle_end(steps, decide, floor))
    return out
