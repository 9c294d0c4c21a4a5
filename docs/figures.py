"""The documentation's pictures, drawn by the docs build from netbench's own code and real runs.

`mkdocs build` (`make docs`) calls `build(out)` through docs/hooks.py, so each picture is drawn
again from the code as it is, in a few seconds, and none is committed or drawn by hand:

- testbed.png: the embedded testbed as `model.topology.plan_topology` names and addresses it,
  with what the netem and userspace backends' own plans put where (nothing is created);
- launch-timeline.png: one launch of a real sweep, step by step, from its run records
  (docs/data/demo.tar.xz: the results folder of `netbench sweep --latency 1,10,100ms`, its
  logs left out);
- report-throughput.png and report-steptime.png: `netbench report`'s own figures of that folder;
- who-waits.png: each rank's steps split into computing, communicating and waiting, from the
  run record of a real sweep with a slow node (docs/data/who-waits.tar.xz).

`python docs/figures.py OUT` draws them into OUT.

Each archive in docs/data/ holds one results folder as the sweep wrote it (results.csv,
manifest.json, runs/), without logs/ and report/; its manifest.json says the command, the
versions and the machine. To replace one with a new run (README.md's table and the tutorial's
output show the demo's numbers: tests/unit/test_docs_claims.py holds them to it): run the
command, remove logs/ and report/, and `tar -C PARENT -cJf docs/data/NAME.tar.xz FOLDER`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
DEMO = DATA / "demo.tar.xz"  # `netbench sweep --latency 1,10,100ms`, a real run (logs/ left out)
WHO_WAITS = DATA / "who-waits.tar.xz"  # a real sweep whose node n2 computes more slowly
SHOWN_STEPS = 40  # the timeline shows at most this many measured steps of a window
DPI = 100
# the colours of a step's phases and parts, here and in every picture of the docs
PHASE_COLOURS = {"start-up": "#d9d9d9", "warmup": "#9e9e9e", "settle": "#f28e2b", "measured": "#4e79a7"}
PART_COLOURS = {"compute": "#4e79a7", "comm": "#f28e2b", "wait": "#e15759"}
SHAPER_COLOUR = "#e15759"


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------- the testbed

def testbed_plan(delay: str = "10ms", rate: str = "100mbit"):
    """(topology, {backend: changes}) for two nodes shaped with `delay` and `rate`: what
    `netbench testbed up --nodes 2` names and `netbench apply` plans, nothing created."""
    from netbench import units
    from netbench.emulation.backends import BACKENDS
    from netbench.model.profile import Profile
    from netbench.model.topology import choose_subnet, plan_topology

    topology = plan_topology(2, choose_subnet([]))
    profile = Profile(name="wan", delay_us=units.parse_duration_us(delay), rate_bps=units.parse_rate_bps(rate))
    return topology, {name: BACKENDS[name].plan(profile, topology, topology.nodes, 0) for name in ("netem", "userspace")}


def shapers(changes, topology) -> dict[str, dict[str, str]]:
    """Where each backend's plan shapes a node's traffic: node -> {"egress": what sits on the
    node's own interface, "switch": what sits at its port in the switch namespace}."""
    from netbench import units
    from netbench.emulation import changes as ch

    found: dict[str, dict[str, str]] = {node.name: {} for node in topology.nodes}
    for change in changes:
        where = found[change.node]
        if isinstance(change, ch.ShapeDevice):
            netem = change.netem
            parts = [f"delay {units.format_duration_us(netem.delay_us)}"]
            if netem.rate_bps:
                parts.append(f"rate {units.format_rate_bps(netem.rate_bps)}")
            where["egress"] = f"netem on {change.dev}: " + ", ".join(parts)
        elif isinstance(change, ch.SetTbf):
            where["egress"] = f"tbf on {change.ifname}: rate {units.format_rate_bps(change.rate_bps)}"
        elif isinstance(change, ch.AddNfqueueRule):
            where["switch"] = f"NFQUEUE {change.queue_num} on {change.port}" + where.get("switch", "")
        elif isinstance(change, ch.StartEngine):
            where["switch"] = where.get("switch", "") + \
                f"\n\u2192 delay engine: {units.format_duration_us(change.delay_us)}"
    return found


def _box(ax, x0, y0, x1, y1, label, *, colour="#f4f4f4", edge="#555555", size=9, weight="normal", top=True):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=colour, edgecolor=edge, linewidth=1.2))
    if label:
        ax.text((x0 + x1) / 2, y1 - 0.12 if top else (y0 + y1) / 2, label, ha="center", va="top" if top else "center",
                fontsize=size, weight=weight)


def _draw_backend(ax, title: str, topology, where: dict[str, dict[str, str]], delay: str) -> None:
    left, right = topology.nodes
    ax.set_xlim(0, 10)
    ax.set_ylim(-1.4, 6.1)
    ax.axis("off")
    ax.set_title(title, fontsize=10.5, loc="left")
    _box(ax, 3.4, 0.2, 6.6, 4.3, f"{topology.switch_netns} (switch namespace)", size=9)
    ax.plot([4.0, 6.0], [2.1, 2.1], color="#333333", linewidth=5, solid_capstyle="round")
    ax.text(5.0, 1.85, f"bridge {topology.bridge}", ha="center", va="top", fontsize=8.5)
    badge = dict(boxstyle="round,pad=0.25", facecolor=SHAPER_COLOUR, edgecolor="none")
    for node, (x0, x1), port_x, side in ((left, (0.1, 2.8), 3.4, -1), (right, (7.2, 9.9), 6.6, 1)):
        _box(ax, x0, 1.0, x1, 3.3, f"{node.netns}\n(node {node.name})", size=9)
        eth_x = x1 if side < 0 else x0
        ax.text((x0 + x1) / 2, 1.95, f"{node.ifname} {node.address}", ha="center", fontsize=8.5)
        ax.plot([eth_x, port_x], [2.1, 2.1], color="#333333", linewidth=1.6)  # the veth pair
        ax.plot([port_x, 4.0 if side < 0 else 6.0], [2.1, 2.1], color="#333333", linewidth=1.6)  # port to bridge
        ax.text((eth_x + port_x) / 2, 2.2, "veth", ha="center", va="bottom", fontsize=8)
        ax.text(port_x - 0.1 * side, 2.2, node.port, ha="right" if side > 0 else "left", va="bottom", fontsize=8)
        shaped = where[node.name]
        if "egress" in shaped:
            ax.text((x0 + x1) / 2, 1.15, shaped["egress"].replace(": ", ":\n"), ha="center", va="bottom",
                    fontsize=8, color="white", bbox=badge)
        if "switch" in shaped:
            ax.text(5.0, 3.75 if side < 0 else 0.45, shaped["switch"].strip(), ha="center",
                    va="top" if side < 0 else "bottom", fontsize=7.5, color="white", bbox=badge)
    style = dict(arrowstyle="-|>", color="#333333", linewidth=1.3, mutation_scale=12)
    ax.annotate("", xy=(8.55, 3.45), xytext=(1.45, 3.45), arrowprops=dict(connectionstyle="arc3,rad=-0.3", **style))
    ax.annotate("", xy=(1.45, 0.85), xytext=(8.55, 0.85), arrowprops=dict(connectionstyle="arc3,rad=-0.3", **style))
    ax.text(5.0, 5.55, f"{left.name} \u2192 {right.name}: {delay} at {left.name}'s egress", ha="center",
            va="bottom", fontsize=8.5)
    ax.text(5.0, -1.05, f"{right.name} \u2192 {left.name}: {delay} at {right.name}'s egress", ha="center",
            va="top", fontsize=8.5)


def draw_testbed(path: Path, delay: str = "10ms", rate: str = "100mbit") -> Path:
    """The embedded testbed of two nodes, shaped by each backend as its plan says."""
    from netbench import units

    plt = pyplot()
    topology, plans = testbed_plan(delay, rate)
    fig, axes = plt.subplots(2, 1, figsize=(8.6, 8.4), dpi=DPI, layout="constrained")
    titles = {"netem": "netem backend (a kernel with sch_netem): all of it at each node's egress",
              "userspace": "userspace backend (no sch_netem): rate at the egress, delay in the switch"}
    for ax, (name, changes) in zip(axes, plans.items()):
        _draw_backend(ax, titles[name], topology, shapers(changes, topology), delay)
    one_way = units.parse_duration_us(delay) / 1000
    fig.suptitle(f"netbench apply --latency {delay} --bandwidth {rate}: round trip = 2 x {one_way:g} ms "
                 f"= {2 * one_way:g} ms", fontsize=11)
    return save(fig, path)


# ---------------------------------------------------------------- a launch's timeline

@contextlib.contextmanager
def results_folder(archive: Path):
    """A results folder kept as a .tar.xz (one folder inside), unpacked into a scratch folder."""
    with tempfile.TemporaryDirectory() as scratch, tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
        (folder,) = Path(scratch).iterdir()
        yield folder


def load_runs(archive: Path) -> list[dict]:
    with results_folder(archive) as folder:
        return [json.loads(path.read_text()) for path in sorted((folder / "runs").glob("*.json"))]


def launch_steps(records: list[dict]) -> tuple[float, list[dict]]:
    """One launch from its run records (the points in the order run): the seconds from the first
    point applied to the chief's first step (start-up), and per point its name and the chief's
    steps in order, each (phase, seconds), with the seconds from the change to the first
    measured step (the record's settle_s: for the first point, start-up and warm-up too)."""
    runs = sorted(records, key=lambda r: r["started"])
    points = []
    startup = 0.0
    for run in runs:
        chief = [e for e in run["events"] if e.get("event") == "step" and e.get("worker", 0) == 0]
        measured = next(e for e in chief if e["phase"] == "measured")
        if run is runs[0]:
            startup = min(e["start"] for e in chief) - (measured["start"] - run["settle_s"])
        points.append({"name": run["profile"]["name"], "settle_s": run["settle_s"],
                       "steps": [(e["phase"], e["duration"]) for e in chief]})
    return startup, points


def shown_steps(steps: list[tuple[str, float]], most: int = SHOWN_STEPS) -> tuple[list[tuple[str, float]], int]:
    """A point's steps as the timeline shows them: every warm-up and settle step and the first
    `most` measured ones; and how many measured steps are left out."""
    kept, measured = [], 0
    for phase, seconds in steps:
        measured += phase == "measured"
        if phase != "measured" or measured <= most:
            kept.append((phase, seconds))
    return kept, max(0, measured - most)


def draw_timeline(path: Path, folder: Path = DEMO) -> Path:
    """One launch of the demo sweep, the chief's steps in order: start-up, warm-up, and at
    each point the change, the settle steps it dropped and the measured window."""
    plt = pyplot()
    startup, points = launch_steps(load_runs(folder))
    fig, ax = plt.subplots(figsize=(8.6, 4.6), dpi=DPI, layout="constrained")
    labels = {"warmup": "warm-up step (not measured)", "settle": "settle step after a change (dropped)",
              "measured": "measured step (the window)"}
    at, shown = 0, set()
    top = max(seconds for point in points for _, seconds in point["steps"]) * 1000 * 4
    for point in points:
        steps, hidden = shown_steps(point["steps"])
        window = [seconds for phase, seconds in point["steps"] if phase == "measured"]
        ax.axvline(at - 0.5, color="#333333", linewidth=1, linestyle="--")
        ax.text(at + 0.5, top, f"{point['name']} applied", fontsize=8.5, va="top", ha="left")
        for phase in ("warmup", "settle", "measured"):
            xs = [at + i for i, (p, _) in enumerate(steps) if p == phase]
            ys = [seconds * 1000 for p, seconds in steps if p == phase]
            if xs:
                ax.scatter(xs, ys, s=12, color=PHASE_COLOURS[phase], zorder=3,
                           label=None if phase in shown else labels[phase])
                shown.add(phase)
        first = at + next(i for i, (p, _) in enumerate(steps) if p == "measured")
        ax.axvspan(first - 0.5, at + len(steps) - 0.5, color=PHASE_COLOURS["measured"], alpha=0.08)
        more = f" ({hidden:,} more\nnot shown)" if hidden else ""
        ax.text(first, top / 2.6, f"window: {len(window):,} steps,\n{sum(window):.1f} s{more}", fontsize=8,
                va="top", ha="left")
        at += len(steps)
    ax.set_yscale("log")
    ax.set_ylim(top=top * 1.3)
    lead = max(6.0, at * 0.07)  # the start-up, before the first step: drawn as a band, not to scale
    ax.axvspan(-lead - 0.5, -0.5, facecolor=PHASE_COLOURS["start-up"], hatch="//", edgecolor="white")
    ax.text(-lead / 2 - 0.5, top / 2.6, f"start-up\n{startup:.1f} s", fontsize=8, va="top", ha="center")
    ax.set_xlim(-lead - 0.5, at)
    ax.set_ylabel("the chief's step (ms, log scale)")
    ax.set_xlabel("the chief's steps in the launch, in order (the start-up before them not to scale)")
    ax.grid(True, which="major", axis="y", color="#e0e0e0")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3, fontsize=8.5, frameon=False)
    fig.suptitle("one launch of netbench sweep --latency 1,10,100ms: the chief's steps (worker 0)",
                 fontsize=11)
    return save(fig, path)


# ---------------------------------------------------------------- the report's figures

def draw_report(out: Path, folder: Path = DEMO) -> list[Path]:
    """`netbench report`'s own throughput and step-time figures of the demo sweep."""
    from netbench.report import write_report

    with results_folder(folder) as results, tempfile.TemporaryDirectory() as scratch:
        write_report(results, Path(scratch))
        written = []
        for name, shown in (("throughput-latency.png", "report-throughput.png"),
                            ("steptime-latency.png", "report-steptime.png")):
            written.append(Path(shutil.copyfile(Path(scratch) / name, out / shown)))
    return written


# ---------------------------------------------------------------- who waits for whom

def rank_steps(record: dict, count: int = 6) -> list[dict]:
    """`count` consecutive measured steps that every rank reported, each rank's part of each:
    [{"step", "ranks": {node: (start, compute, comm, wait, end)}}], times in ms since the
    first step shown began (each rank's own clock: one machine here)."""
    nodes = {rank["rank"]: rank["node"] for rank in record["stragglers"]["ranks"]}
    by_step: dict[int, dict[str, dict]] = {}
    for event in record["events"]:
        if event.get("event") == "step" and event.get("phase") == "measured" and event.get("compute") is not None:
            by_step.setdefault(event["step"], {})[nodes[event["worker"]]] = event
    whole = [step for step in sorted(by_step) if len(by_step[step]) == len(nodes)]
    chosen = whole[len(whole) // 2:][:count]
    zero = min(event["start"] for event in by_step[chosen[0]].values())
    out = []
    for step in chosen:
        ranks = {}
        for node, event in sorted(by_step[step].items()):
            wait = event.get("wait") or 0.0
            comm = event["end"] - event["start"] - event["compute"] - wait
            ranks[node] = tuple(v * 1000 for v in (event["start"] - zero, event["compute"], comm, wait,
                                                    event["end"] - zero))
        out.append({"step": step, "ranks": ranks})
    return out


def draw_who_waits(path: Path, folder: Path = WHO_WAITS) -> Path:
    """A slow node's steps beside the others': each rank's compute, communication and waiting
    in a few consecutive steps, and the run's attribution as the record keeps it."""
    plt = pyplot()
    record = next(r for r in load_runs(folder) if r["stragglers"].get("straggler_node"))
    steps = rank_steps(record)
    nodes = sorted({node for step in steps for node in step["ranks"]}, reverse=True)
    fig, ax = plt.subplots(figsize=(8.6, 3.6), dpi=DPI, layout="constrained")
    for step in steps:
        for row, node in enumerate(nodes):
            start, compute, comm, wait, _ = step["ranks"][node]
            left = start
            for part, width in (("compute", compute), ("comm", comm), ("wait", wait)):
                if width > 0:
                    ax.barh(row, width, left=left, height=0.6, color=PART_COLOURS[part], edgecolor="white",
                            linewidth=0.6)
                    left += width
    ax.set_yticks(range(len(nodes)), [f"rank on {node}" for node in nodes])
    ax.set_xlabel(f"ms since step {steps[0]['step']} began (measured steps {steps[0]['step']}-{steps[-1]['step']})")
    att = record["stragglers"]
    delay = record.get("compute") or {}
    slow = ", ".join(f"{node}: +{seconds * 1000:g} ms of computing a step" for node, seconds in
                     sorted((delay.get("step_delay_s") or {}).items()))
    ax.set_title(f"{record['strategy']}, {record['workers']} workers, {record['profile']['name']}"
                 + (f" ({slow})" if slow else "") + "\n"
                 + f"{att['straggler_node']} finished last in {att['straggler_share']:.0%} of steps; "
                 f"the others waited {att['wait_share']:.0%} of their step", fontsize=10, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=PART_COLOURS[p]) for p in PART_COLOURS]
    ax.legend(handles, ["computing", "communicating", "waiting (as the strategy reports it)"], loc="upper center",
              bbox_to_anchor=(0.5, -0.32), ncols=3, fontsize=8.5, frameon=False)
    return save(fig, path)


# ---------------------------------------------------------------- all of them

def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def build(out: Path) -> list[Path]:
    """Every picture of the docs, drawn into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    return [draw_testbed(out / "testbed.png"), draw_timeline(out / "launch-timeline.png"),
            *draw_report(out), draw_who_waits(out / "who-waits.png")]


if __name__ == "__main__":
    for written in build(Path(sys.argv[1] if len(sys.argv) > 1 else "site/img")):
        print(written)
