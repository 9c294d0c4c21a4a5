#!/usr/bin/env python3
"""How long does changing the emulation take? netbench beside the ``tc`` CLI.

Four measurements, in one run:

1. rate on every link of a ``--nodes``-node embedded testbed (default 64), as whole commands:
   ``netbench apply --bandwidth 100mbit`` (200mbit on alternate rounds), the wall time of the
   process, beside ``--nodes`` separate processes run one after another,
   ``ip netns exec netbench-nK tc qdisc replace dev eth0 root handle 4e42: tbf rate 100mbit
   burst 32kbit latency 50ms`` (the ``tc`` CLI peer), on the same testbed;
2. latency + rate on every link: ``netbench apply --latency 10ms --bandwidth 100mbit`` (20ms on
   alternate rounds); there is no ``tc`` peer (this kernel has no netem);
3. a change on 8 links through the library, in this process, as ``netbench apply`` makes it
   (``backends.plan_apply(..., held=executor.held())`` + ``real_executor(..., hold=True).apply``
   under the journal's lock, as a sweep's or a schedule's long-lived executor does): the plan and
   the apply are timed, in milliseconds; rate 100/200mbit and latency 10/20ms + 100mbit.
4. a schedule on the same 8 links, as ``netbench apply --schedule`` runs it: a change of delay
   and rate every 100 ms; each change's distance from its time (landed - scheduled) and the time
   it took to make.
5. the ramp on all ``--nodes`` links (``RAMP``: base 5 ms / 500 mbit, then 25 ms / 100 mbit over
   4 s, a change every 100 ms), as ``netbench apply --schedule`` runs it, from an unshaped link:
   each change's lateness, the changes merged into a later one, and how long the 4 s timeline
   took. ``--ramp-only`` makes just this one (a minute). Like ``apply --schedule`` it runs the
   schedule at SCHED_FIFO (``--no-realtime``: at normal priority) and rehearses a change before
   the clock starts. Figures (2 shared CPUs, 2026-11-26, 3 runs each, side by side; lateness
   p99 of 40 changes): before the batched netlink and engine changes (bff18e5) +115, +125,
   +150 ms with 10-12 of 40 changes merged, each change ~125-145 ms; after +1.1, +3.1, +1.4 ms
   (normal priority +3.0, +6.4, +3.3 ms), none merged, each change ~17-20 ms. bench/README.md
   has the table.

Beside them, ``apply``'s own start-up: a process that imports what ``netbench apply`` imports
(``APPLY_IMPORTS``) beside a bare interpreter (``python -c pass``), alternated, so the rows say
how much of a whole command is the interpreter and the imports. The package's bytecode is
compiled first (``compileall``, as installing a wheel does): an environment with
PYTHONDONTWRITEBYTECODE set (this project's machines) never writes ``__pycache__``, and then
every command compiles netbench's modules again (about 0.12 s of ``apply``'s start-up,
measured side by side under load, 2026-11-28).

Every timed sample is a real change: the state before it is the same tool's shaping with the
other value (set, untimed, just before). The measurements of 1 and 2 run in rounds, in a
rotating order, so the machine's noise falls on all of them alike; between tools the shaping is
cleared (``tc qdisc del dev eth0 root`` for the tc-made qdiscs, which netbench refuses to replace;
``netbench apply`` of a profile with no shaping for netbench's), untimed.

Usage (root)::

    .venv/bin/python bench/apply_speed.py [--nodes 64] [--repeat 5] [--quick] [--json PATH]

It brings up its own testbed with ``netbench testbed up`` and refuses to run if a netbench
testbed is already up (someone else's); ``netbench reset`` removes everything in ``finally``.
Exit status: 0 done, 2 could not run, 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
NETBENCH = REPO / ".venv" / "bin" / "netbench"
LIB_NODES = 8
RATES = ("100mbit", "200mbit")
DELAYS = ("10ms", "20ms")
TC_HANDLE = "4e42:"
SCHEDULE_GAP_S = 0.1
RAMP = ("name: ramp\nprofile: {delay: 5ms, rate: 500mbit}\n"
        "steps:\n  - {at: 0s, delay: 25ms, rate: 100mbit, ramp: 4s}\n")


# what `netbench apply --bandwidth ...` imports before it changes anything (cli/app.py loads the
# command's module; the embedded target plans and applies)
APPLY_IMPORTS = "import netbench.cli.app, netbench.cli.emulation, netbench.testbed.targets, netbench.testbed.embedded"


def compile_bytecode() -> str:
    """Write the package's bytecode once, as a wheel install does; what was done, for the record."""
    import compileall

    ok = compileall.compile_dir(str(REPO / "netbench"), quiet=1)
    return "compiled (compileall)" if ok else "compileall reported errors"


def startup_samples(rounds: int, say: Callable[[str], None]) -> dict[str, list[float]]:
    """Seconds of a process importing apply's modules and of a bare interpreter, alternated."""
    samples: dict[str, list[float]] = {"apply_imports": [], "bare_interpreter": []}
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for i in range(rounds):
        order = [("apply_imports", APPLY_IMPORTS), ("bare_interpreter", "pass")]
        for name, code in order[i % 2:] + order[:i % 2]:
            samples[name].append(timed(lambda: subprocess.run([sys.executable, "-c", code], env=env, check=True)))
    say(f"  start-up: imports {statistics.median(samples['apply_imports']):.3f} s, "
        f"bare interpreter {statistics.median(samples['bare_interpreter']):.3f} s (medians of {rounds})")
    return samples


def run(argv: list[str]) -> None:
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")


def timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def netbench(*args: str) -> list[str]:
    """The CLI: the installed one, else this checkout's code through the running interpreter."""
    if NETBENCH.exists():
        return [str(NETBENCH), *args]
    os.environ["PYTHONPATH"] = str(REPO)
    return [sys.executable, "-m", "netbench.cli", *args]


def testbed_nodes() -> list[dict]:
    out = subprocess.run(netbench("testbed", "show", "--json"), capture_output=True, text=True, check=True).stdout
    return json.loads(out)["nodes"]


class Testbed:
    """The testbed's nodes and who shapes them now (None, "netbench" or "tc")."""

    def __init__(self, nodes: list[dict], none_profile: Path) -> None:
        self.nodes = nodes
        self.none_profile = none_profile
        self.owner: str | None = None

    def tc_argv(self, node: dict, verb: str, rate: str | None = None) -> list[str]:
        argv = ["ip", "netns", "exec", node["netns"], "tc", "qdisc", verb, "dev", node["ifname"], "root"]
        if rate is not None:
            argv += ["handle", TC_HANDLE, "tbf", "rate", rate, "burst", "32kbit", "latency", "50ms"]
        return argv

    def take(self, owner: str | None) -> None:
        """Clear the other tool's shaping (untimed); None: clear whichever shapes now."""
        if self.owner == "tc" and owner != "tc":
            for node in self.nodes:
                run(self.tc_argv(node, "del"))
        elif self.owner == "netbench" and owner != "netbench":
            run(netbench("apply", str(self.none_profile)))
        self.owner = owner

    def tc_all(self, rate: str) -> None:
        for node in self.nodes:
            run(self.tc_argv(node, "replace", rate))


def other(values: tuple[str, str], value: str) -> str:
    return values[1] if value == values[0] else values[0]


def whole_commands(bed: Testbed, repeat: int, say: Callable[[str], None]) -> dict[str, list[float]]:
    """Measurements 1 and 2: seconds per whole change, `repeat` rounds in rotating order."""
    samples: dict[str, list[float]] = {"netbench_rate": [], "tc_rate": [], "netbench_latency_rate": []}

    def netbench_rate(i: int) -> float:
        rate = RATES[i % 2]
        bed.take("netbench")
        run(netbench("apply", "--bandwidth", other(RATES, rate)))
        return timed(lambda: run(netbench("apply", "--bandwidth", rate)))

    def tc_rate(i: int) -> float:
        rate = RATES[i % 2]
        bed.take("tc")
        bed.tc_all(other(RATES, rate))
        return timed(lambda: bed.tc_all(rate))

    def netbench_latency_rate(i: int) -> float:
        delay = DELAYS[i % 2]
        bed.take("netbench")
        run(netbench("apply", "--latency", other(DELAYS, delay), "--bandwidth", "100mbit"))
        return timed(lambda: run(netbench("apply", "--latency", delay, "--bandwidth", "100mbit")))

    order = [("netbench_rate", netbench_rate), ("tc_rate", tc_rate), ("netbench_latency_rate", netbench_latency_rate)]
    for i in range(repeat):
        shift = i % len(order)
        for name, measure in order[shift:] + order[:shift]:
            seconds = measure(i)
            samples[name].append(seconds)
            say(f"  round {i + 1}/{repeat}: {name} {seconds:.3f} s")
    bed.take(None)  # leave nothing shaped
    return samples


def library_changes(repeat: int, say: Callable[[str], None]) -> tuple[dict[str, list[float]], str]:
    """Measurement 3: the executor's apply of a change on the testbed that is up, in ms."""
    sys.path.insert(0, str(REPO))
    from netbench.emulation import backends
    from netbench.emulation.executor import choose_backend, real_executor
    from netbench.model.profile import profile_from_flags
    from netbench.state.journal import Journal, Lock
    from netbench.testbed import netns as local

    journal = Journal()
    topology = local.discover()
    if topology is None or len(topology.nodes) != LIB_NODES:
        raise RuntimeError(f"expected a testbed of {LIB_NODES} nodes")
    choice = choose_backend(None)
    executor = real_executor(journal, detach_engines=True, hold=True)
    variants = {
        "library_rate": lambda i: profile_from_flags(None, latency=None, jitter=None, bandwidth=RATES[i % 2], loss=None),
        "library_latency_rate": lambda i: profile_from_flags(None, latency=DELAYS[i % 2], jitter=None,
                                                             bandwidth="100mbit", loss=None),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for name, make in variants.items():
        for i in range(-1, repeat):  # i == -1: the untimed first state, so every timed apply is a change
            profile = make(i)
            with Lock(journal.dir):
                # planned against what the journal holds, as netbench apply does: in place
                seconds = timed(lambda: executor.apply(backends.plan_apply(profile, topology, choice.name,
                                                                           held=executor.held())))
            if i >= 0:
                samples[name].append(seconds * 1000)
        say(f"  {name}: {len(samples[name])} changes, median {statistics.median(samples[name]):.1f} ms")
    return samples, choice.name


def schedule_lateness(steps: int, say: Callable[[str], None]) -> dict[str, list[float]]:
    """Measurement 4: a schedule on the testbed that is up, as `netbench apply --schedule` runs
    it (the embedded target, PlanCache, run_schedule): every SCHEDULE_GAP_S a change of delay
    (10/20 ms) and rate (100/200 mbit) on every link; each change's distance from its time, in
    ms (landed - scheduled; negative: early)."""
    sys.path.insert(0, str(REPO))
    from netbench.experiment.schedule import PlanCache, run_schedule
    from netbench.model.profile import Profile
    from netbench.model.schedule import TimedProfile
    from netbench.state.journal import Journal
    from netbench.testbed.embedded import EmbeddedTestbed

    target = EmbeddedTestbed(Journal())
    plans = PlanCache(target, "auto")
    timeline = tuple(TimedProfile(at_s=i * SCHEDULE_GAP_S, at_step=None, step=i + 1, changes=(),
                                  profile=Profile(name=f"s{i}", delay_us=(10_000, 20_000)[i % 2],
                                                  rate_bps=(100_000_000, 200_000_000)[i % 2]))
                     for i in range(steps + 1))
    for entry in timeline:
        plans.plan(entry.profile)  # every profile planned before the clock starts, as apply --schedule does
    landed = run_schedule(timeline, plans.apply)
    values = [item.lateness_s * 1000 for item in landed[1:]]  # the first only sets the state before
    say(f"  schedule: {len(values)} changes, median {statistics.median(values):+.2f} ms from their time, "
        f"furthest {max(abs(v) for v in values):.2f} ms")
    return {"schedule_lateness": values, "schedule_apply": [(i.landed_s - i.started_s) * 1000 for i in landed[1:]]}


def ramp_schedule(folder: Path, say: Callable[[str], None], realtime: bool = True) -> dict[str, list[float]]:
    """Measurement 5: RAMP on the testbed that is up, as `netbench apply --schedule` runs it
    (the embedded target, every profile planned first, run_schedule), from an unshaped link.
    Lateness of each change in ms (the base's, before time 0 where the code does that, is left
    out); how many were merged; the timeline's length (the last change's landing) in s."""
    import inspect

    sys.path.insert(0, str(REPO))
    from netbench.experiment.schedule import PlanCache, link_before, run_schedule
    from netbench.model.schedule import load_schedule, timeline
    from netbench.state.journal import Journal
    from netbench.testbed.embedded import EmbeddedTestbed

    path = folder / "ramp.yaml"
    path.write_text(RAMP)
    schedule = load_schedule(path)
    target = EmbeddedTestbed(Journal())
    before = link_before(target.show())
    entries = timeline(schedule, before)
    plans = PlanCache(target, "auto")
    for profile in [entry.profile for entry in entries] + [before, schedule.profile]:
        plans.plan(profile)
    supported = inspect.signature(run_schedule).parameters  # the bench also runs against older code
    options = {"base": schedule.profile} if "base" in supported else {}
    if "rehearse" in supported:
        options["rehearse"] = True  # as apply --schedule does
    import contextlib

    from netbench import proc

    priority = getattr(sys.modules["netbench.experiment.schedule"], "SCHEDULE_RT_PRIORITY", None)
    with proc.realtime(priority) if priority and realtime else contextlib.nullcontext():  # as apply --schedule does
        landed = run_schedule(entries, plans.apply, **options)
    timed_changes = [item for item in landed if item.landed_s > 0]  # the base before time 0 is not a change
    values = [item.lateness_s * 1000 for item in timed_changes]
    merged = sum(len(getattr(item, "merged", ())) for item in landed)
    span = max(item.landed_s for item in landed)
    p99 = sorted(values)[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
    say(f"  ramp: {len(entries)} changes due, {len(timed_changes)} made, {merged} merged into a later one; "
        f"lateness first {values[0]:+.1f} ms, mean {statistics.fmean(values):+.1f} ms, p99 {p99:+.1f} ms, "
        f"max {max(values):+.1f} ms; the {entries[-1].at_s:g} s timeline took {span:.2f} s")
    return {"ramp_lateness": values, "ramp_apply": [(i.landed_s - i.started_s) * 1000 for i in timed_changes],
            "ramp_span": [span * 1000], "ramp_merged": [float(merged)]}


def on_sigterm(main_pid: int) -> None:
    """SIGTERM as Ctrl-C in this process; a child the library forked (and that inherited this
    handler) just exits, as it would without it."""
    if os.getpid() != main_pid:
        os._exit(128 + signal.SIGTERM)
    raise KeyboardInterrupt


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64, help="nodes of the whole-command testbed (1-64) [64]")
    parser.add_argument("--repeat", type=int, default=None, help="rounds of the whole commands [5; --quick 2]")
    parser.add_argument("--lib-repeat", type=int, default=None, help="library changes per variant [20; --quick 6]")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--json", metavar="PATH", help="also write every sample as JSON ('-': stdout)")
    parser.add_argument("--ramp-only", action="store_true", help="only measurement 5, the ramp on --nodes links")
    parser.add_argument("--no-realtime", action="store_true",
                        help="run the ramp's schedule at normal priority (apply --schedule uses SCHED_FIFO)")
    args = parser.parse_args(argv)
    repeat = args.repeat or (2 if args.quick else 5)
    lib_repeat = args.lib_repeat or (6 if args.quick else 20)
    schedule_steps = 20 if args.quick else 100
    if not 1 <= args.nodes <= 64 or repeat < 1 or lib_repeat < 1:
        print("error: --nodes must be 1-64, --repeat and --lib-repeat at least 1", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("error: run as root (namespaces, qdiscs, iptables): sudo .venv/bin/python bench/apply_speed.py",
              file=sys.stderr)
        return 2
    if testbed_nodes():
        print("error: a netbench testbed is already up (someone else's?); not touching it "
              "('netbench testbed down' if it is yours)", file=sys.stderr)
        return 2

    say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json == "-" else \
        (lambda line: print(line, flush=True))
    main_pid = os.getpid()
    signal.signal(signal.SIGTERM, lambda *_: on_sigterm(main_pid))
    started = time.monotonic()
    record: dict = {"date": datetime.date.today().isoformat(), "host": platform.node(),
                    "kernel": platform.release(), "cpus": os.cpu_count(), "nodes": args.nodes,
                    "lib_nodes": LIB_NODES, "repeat": repeat, "lib_repeat": lib_repeat}
    with tempfile.TemporaryDirectory(prefix="nb-apply-speed-") as tmp:
        none_profile = Path(tmp) / "none.yaml"
        none_profile.write_text("name: none\n")
        try:
            say(f"testbed up --nodes {args.nodes}")
            run(netbench("testbed", "up", "--nodes", str(args.nodes)))
            if args.ramp_only:
                say(f"the ramp on {args.nodes} links")
                ramp = ramp_schedule(Path(tmp), say, realtime=not args.no_realtime)
                stats = {k: summary(v) for k, v in ramp.items()}
                record.update(samples=ramp, summary=stats, runtime_s=round(time.monotonic() - started, 1))
                if args.json == "-":
                    print(json.dumps(record, indent=2))
                elif args.json:
                    Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
                return 0
            record["bytecode"] = compile_bytecode()
            startup = startup_samples(4 * repeat, say)
            bed = Testbed(testbed_nodes(), none_profile)
            say(f"whole commands on {args.nodes} links, {repeat} rounds")
            whole = whole_commands(bed, repeat, say)
            run(netbench("apply", str(none_profile)))  # the ramp starts from an unshaped link
            say(f"the ramp on {args.nodes} links")
            whole_ramp = ramp_schedule(Path(tmp), say, realtime=not args.no_realtime)
            run(netbench("testbed", "down"))
            say(f"testbed up --nodes {LIB_NODES}")
            run(netbench("testbed", "up", "--nodes", str(LIB_NODES)))
            say(f"library changes on {LIB_NODES} links, {lib_repeat} each")
            lib, backend = library_changes(lib_repeat, say)
            say(f"a schedule on {LIB_NODES} links, {schedule_steps} changes {SCHEDULE_GAP_S * 1000:.0f} ms apart")
            lib.update(schedule_lateness(schedule_steps, say))
            lib.update(whole_ramp)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            if os.getpid() == main_pid:  # never in a child the library forked (a delay engine)
                subprocess.run(netbench("reset"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record["backend"] = backend
    record["runtime_s"] = round(time.monotonic() - started, 1)
    whole.update(startup)
    record["samples"] = {**{f"{k}_s": v for k, v in whole.items()}, **{f"{k}_ms": v for k, v in lib.items()}}
    stats = {k: summary(v) for k, v in {**whole, **lib}.items()}
    record["summary"] = stats
    tc = stats["tc_rate"]["median"]
    record["ratio_netbench_over_tc"] = {"rate": stats["netbench_rate"]["median"] / tc,
                                        "latency_rate_vs_tc_rate": stats["netbench_latency_rate"]["median"] / tc}

    n = args.nodes
    rows = [
        (f"rate, {n} links: netbench apply --bandwidth 100/200mbit", "netbench_rate", "s",
         f"{record['ratio_netbench_over_tc']['rate']:.1f}x"),
        (f"rate, {n} links: {n} x ip netns exec .. tc qdisc replace .. tbf", "tc_rate", "s", "1.0x"),
        ("start-up: python -c 'import (what netbench apply imports)'", "apply_imports", "s",
         f"{stats['apply_imports']['median'] / tc:.1f}x"),
        ("start-up: python -c pass (the interpreter alone)", "bare_interpreter", "s",
         f"{stats['bare_interpreter']['median'] / tc:.1f}x"),
        (f"latency+rate, {n} links: netbench apply --latency 10/20ms --bandwidth 100mbit",
         "netbench_latency_rate", "s", "- (no netem)"),
        (f"rate, {LIB_NODES} links: library executor.apply, 100/200mbit", "library_rate", "ms", ""),
        (f"latency+rate, {LIB_NODES} links: library executor.apply, 10/20ms", "library_latency_rate", "ms", ""),
        (f"schedule on {LIB_NODES} links: each change's time to make (latency+rate)", "schedule_apply", "ms", ""),
        (f"schedule on {LIB_NODES} links: landed - scheduled (negative: early)", "schedule_lateness", "ms", ""),
        (f"ramp on {n} links (4 s, every 100 ms): landed - scheduled", "ramp_lateness", "ms", ""),
        (f"ramp on {n} links: each change's time to make", "ramp_apply", "ms", ""),
        (f"ramp on {n} links: the 4 s timeline took", "ramp_span", "ms", ""),
    ]
    out = sys.stderr if args.json == "-" else sys.stdout
    width = max(len(r[0]) for r in rows)
    print(f"\nbackend {backend}; {os.cpu_count()} CPUs; {repeat} rounds, {lib_repeat} library changes; "
          f"{record['runtime_s']:.0f} s", file=out)
    print(f"{'measurement':<{width}}  {'median':>9}  {'min':>9}  {'max':>9}  netbench/tc", file=out)
    for label, key, unit, ratio in rows:
        cells = [f"{stats[key][k]:.3f} s" if unit == "s" else f"{stats[key][k]:.1f} ms" for k in ("median", "min", "max")]
        print(f"{label:<{width}}  " + "  ".join(f"{c:>9}" for c in cells) + f"  {ratio}", file=out)
    if args.json == "-":
        print(json.dumps(record, indent=2))
    elif args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
