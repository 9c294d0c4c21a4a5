#!/usr/bin/env python3
"""What the controller spends per step: CPU seconds per 1000 steps of a sweep, by observer.

A sweep's controller reads every process's step events (a reader thread per process parses
each line), slices the chief's into a point's window, tells the observers (the live view, the
metrics exporter) and finally writes the run's record. On a 2-core machine all of it competes
with the workers for the cores, so at 1 ms it can slow the step it measures. This bench runs
that same path (runner.run_sweep, experiment/launch.py, jobs/live.py) on the synthetic
testbed of tests/fakes/sweep.py with workers that are lines made in advance (so no worker's
CPU is counted), as fast as the controller takes them, and reports its process CPU time
(user + system, every thread, resource.getrusage) per 1000 steps of the chief, for:

* quiet: no observer (the runner's own work: parsing, windows, the record);
* view: the live terminal view (cli/render.py SweepView, drawing to a terminal-like sink);
* view+metrics: the view and the Prometheus exporter's observer, as ``--metrics-port`` runs.

CPU time is robust to other people's load on the machine (wall time is not). No root, no
TensorFlow. Usage::

    .venv/bin/python bench/controller_cost.py [--steps 20000] [--workers 2] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import statistics
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from netbench.jobs import worker  # noqa: E402
from tests.fakes.sweep import ContinuousProcess, SyntheticTestbed  # noqa: E402


class Lines:
    """A worker's stdout of lines made in advance; then it blocks until stopped."""

    def __init__(self, lines: list[bytes]) -> None:
        self._lines = iter(lines)
        self.stopped = threading.Event()

    def readline(self) -> bytes:
        line = next(self._lines, None)
        if line is not None:
            return line
        self.stopped.wait()
        return b""


def made_lines(index: int, workers: int, steps: int, step_s: float = 0.001) -> list[bytes]:
    """What a worker started with --until-stopped writes: start, then measured steps."""
    out = [(json.dumps(worker.start_event(index, workers, 1000 + index, 0.0, "synthetic", "mlp", 669_706, 64,
                                          model_bytes=2_678_824, input_shape=(784,))) + "\n").encode()]
    for k in range(steps):
        out.append((json.dumps(worker.step_event(k, worker.PHASE_MEASURED, k * step_s, (k + 1) * step_s,
                                                 64 * workers, 0.5)) + "\n").encode())
    return out


class MadeTestbed(SyntheticTestbed):
    """The synthetic testbed whose workers are lines made in advance."""

    def __init__(self, journal, lines: dict[int, list[bytes]]) -> None:
        super().__init__(journal)
        self.lines = lines

    def spawn(self, task, log, env):
        self.spawned.append(task)
        return ContinuousProcess(Lines(self.lines[task.index]))


def one_sweep(observer_kind: str, steps: int, workers: int, lines) -> float:
    """Controller CPU seconds for one point of `steps` measured steps."""
    from netbench.experiment.launch import Settle
    from netbench.experiment.runner import SweepConfig, run_sweep
    from netbench.model import design
    from netbench.model.job import JobSpec
    from netbench.model.profile import Profile
    from netbench.state.journal import Journal

    job = JobSpec(warmup=0, steps=steps)
    runs = design.plan_sweep(Profile(name="base"), design.SweepLevels(delay_us=(1000,)), 1, job, workers)
    with tempfile.TemporaryDirectory() as tmp:
        config = SweepConfig(sweep_id="cost", runs=tuple(runs), job=job, workers=workers, output=Path(tmp) / "out",
                             settle=Settle(steps=0, seconds=0.0))
        observer, closing = make_observer(observer_kind, config)
        testbed = MadeTestbed(Journal(Path(tmp) / "state"), lines)
        before = resource.getrusage(resource.RUSAGE_SELF)
        try:
            run_sweep(config, observer, testbed=testbed)
        finally:
            closing()
        after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def make_observer(kind: str, config):
    if kind == "quiet":
        return None, lambda: None
    from rich.console import Console

    from netbench import console
    from netbench.cli.render import SweepView

    # a terminal-like sink: the view draws as it would on a terminal, to nowhere
    console.out = Console(file=io.StringIO(), force_terminal=True, width=160)
    view = SweepView(config)
    view.__enter__()
    observer = view
    if kind == "view+metrics":
        from netbench.metrics.state import MetricsObserver, MetricsState, ObserverTee

        observer = ObserverTee(MetricsObserver(MetricsState()), view)
    return observer, lambda: view.__exit__(None, None, None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20000, help="the chief's measured steps per sweep [20000]")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="sweeps per observer, alternating [3]")
    parser.add_argument("--observers", default="quiet,view,view+metrics")
    parser.add_argument("--profile", action="store_true", help="also cProfile one view+metrics sweep (top 25)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    # one more step than the window for every worker: the drain waits for the others' last one
    lines = {i: made_lines(i, args.workers, args.steps + 1) for i in range(args.workers)}
    kinds = args.observers.split(",")
    cost: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeat):
        for kind in kinds:
            cost[kind].append(one_sweep(kind, args.steps, args.workers, lines))
    print(f"controller CPU per 1000 chief steps ({args.workers} workers' events each, {args.steps} steps a sweep, "
          f"median of {args.repeat}; min-max):")
    figures = {}
    for kind in kinds:
        per = [1000 * c / args.steps for c in cost[kind]]
        figures[kind] = {"median_s": statistics.median(per), "runs_s": per}
        print(f"  {kind:14} {statistics.median(per) * 1000:7.1f} ms   ({min(per) * 1000:.1f}-{max(per) * 1000:.1f}); "
              f"{statistics.median(per) * 1e6 / 1000 / args.workers:.1f} us per event")
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        one_sweep(kinds[-1], args.steps, args.workers, lines)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
