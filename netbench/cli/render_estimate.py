"""Rendering a design's estimated wall time, as a dry run prints it (experiment.estimate;
the library never prints)."""

from __future__ import annotations

from rich.markup import escape

from netbench import console


def _duration(seconds: float) -> str:
    """3.2 s, 14 min, 5.3 h: a wall time read at a glance."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_lines(current, other, costs, precision: bool = False) -> list[str]:
    """A dry run's estimate: the mode asked for, then the other one, one line each; then
    what the figures assume (experiment.estimate.Estimate; `precision`: some run has one)."""
    from netbench.experiment.estimate import assumptions

    lines = []
    for estimate, note in ((current, "this run"), (other, "other mode")):
        mode = "--isolate" if estimate.isolate else "--launch"
        timeouts = f", {estimate.timeouts} point(s) modelled as step timeouts" if estimate.timeouts else ""
        if estimate.capped:
            timeouts += f", {estimate.capped} point(s) expected to stop at --max-seconds short of their precision"
        lines.append(f"estimated wall time {mode} ({note}): {_duration(estimate.wall_s)} for {estimate.runs} runs in "
                     f"{len(estimate.launches)} launch(es), {estimate.process_starts} process starts: "
                     f"start-up {_duration(estimate.startup_s)}, settle {_duration(estimate.settle_s)}, "
                     f"measured {_duration(estimate.measured_s)} ({estimate.measured_share:.0%}), "
                     f"other {_duration(estimate.other_s)}{timeouts}")
    lines.append("  assumes: " + assumptions(costs, precision))
    return lines


def design_estimate(runs, isolate: bool, settle, step_timeout_s: float | None = None, costs=None,
                    order: str = "descending") -> None:
    """Print the estimate of `runs` in both modes (a sweep's or playbook's --dry-run)."""
    from netbench.experiment.estimate import Costs, estimate_design, step_s, window_s

    costs = costs or Costs()
    both = {mode: estimate_design(runs, mode, settle, costs, step_timeout_s, order) for mode in (isolate, not isolate)}
    jobs = {run.job for run in runs if run.job is not None and run.job.precision and not run.job.train_steps}
    for line in estimate_lines(both[isolate], both[not isolate], costs, precision=bool(jobs)):
        console.plain(escape(line))
    from netbench.experiment.lossy import note

    lossy = note(runs)
    if lossy:
        console.plain(escape("  " + lossy))
    if jobs:  # the modelled window is an expectation; the cap bounds it whatever the noise
        longest = max(job.max_seconds for job in jobs)
        most = sum(max(window_s(run.job, step_s(run, costs), costs)[0],
                       run.job.max_seconds if run.job in jobs else 0.0) for run in runs)
        console.plain(escape(f"  with --precision a point's window may go on past its steps, to at most {longest:g} s "
                             f"or its steps' own length (at most {_duration(most)} of windows for these runs at "
                             f"the modelled steps)"))
