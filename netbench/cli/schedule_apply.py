"""apply --schedule: a schedule's timeline run in the foreground, on the local testbed or over an
inventory's hosts (the apply command in cli/emulation.py chooses)."""

from __future__ import annotations

from pathlib import Path

from netbench import console
from netbench.cli import common, render
from netbench.errors import UsageError
from netbench.testbed.targets import open_target


def apply_schedule(path: Path, backend: str, dry_run: bool) -> None:
    """Run a schedule on the local testbed in the foreground; Ctrl-C or SIGTERM put the link
    back as it was before (read with show()), then exit 130."""
    from netbench import interrupts
    from netbench import proc
    from netbench.experiment.schedule import SCHEDULE_RT_PRIORITY, PlanCache, lateness, link_before, run_schedule
    from netbench.model.schedule import timeline

    schedule = _load_timed_schedule(path)
    common.require_testbed("uses")
    with open_target() as target:
        before = link_before(target.show())
        entries = timeline(schedule, before)
        plans = PlanCache(target, backend)
        if not _plan_schedule(path, schedule, entries, before, plans, dry_run):
            return
        common.sigterm_as_interrupt()
        landed = []
        shown = lambda item: (landed.append(item), render.schedule_change(item))  # noqa: E731
        try:
            with proc.realtime(SCHEDULE_RT_PRIORITY):
                run_schedule(entries, plans.apply, repeat=schedule.repeat, period_s=schedule.period_s,
                             base=schedule.profile, on_change=shown, rehearse=True)
        except KeyboardInterrupt:
            with interrupts.held_off():
                plans.apply(before)
            render.schedule_summary(lateness(landed), restored=before)
            raise
    render.schedule_summary(lateness(landed))


def _plan_schedule(path: Path, schedule, entries, before, plans, dry_run: bool) -> bool:
    """Plan every profile of the timeline and the one to restore (every refusal, a backend's or
    a key's, comes before any change), print the timeline; False under --dry-run."""
    for profile in [entry.profile for entry in entries] + [before] + [p for p in [schedule.profile] if p]:
        plans.plan(profile)
    chosen = plans.plan(entries[0].profile).backends
    render.schedule_timeline(schedule, entries, before, ", ".join(sorted(set(chosen.values()))), dry_run)
    return not dry_run


def _load_timed_schedule(path: Path):
    """The schedule at `path`; one of training steps, or with a node's cpus or step_delay (they
    slow a sweep's processes, and apply starts none: it would change nothing), is refused, dry
    run or not, before anything is read or changed (only a sweep sees the chief's steps)."""
    from netbench.model.schedule import load_schedule

    schedule = load_schedule(path)
    if schedule.by_step:
        raise UsageError(f"{path}: at_step: a schedule of training steps runs within a sweep, which sees "
                         "the chief's steps", hint="use at: times for 'netbench apply --schedule'")
    capacity = next((step for step in schedule.steps if step.compute), None)
    if capacity is not None:
        raise UsageError(f"{capacity.where}: node: a node's cpus and step_delay slow a sweep's processes, and "
                         "'netbench apply' starts none", hint=f"run it in a sweep: netbench sweep --schedule {path}")
    return schedule


def apply_schedule_to_hosts(path: Path, backend: str, dry_run: bool, inventory, insecure_host_keys, lease,
                             force, takeover) -> None:
    """Run a schedule on the controller, each change sent to every host through its agent over
    connections kept open; Ctrl-C or SIGTERM put every host back as it was before (then exit
    130). While it runs, the changes hold a lease that is renewed; at the end the last step
    stays (the lease released), as on the local testbed, until 'netbench reset --inventory'."""
    import contextlib
    import statistics

    from netbench import interrupts
    from netbench.experiment.schedule import lateness, run_schedule
    from netbench.model.schedule import timeline
    from netbench.remote import keeper as leases
    from netbench.remote.schedule import HostsPlanCache, hosts_link_before
    from netbench.state.lease import DEFAULT_LEASE_S, new_holder

    schedule = _load_timed_schedule(path)
    lease_s = DEFAULT_LEASE_S if lease is None else lease
    with open_target(inventory, insecure_host_keys, takeover=bool(takeover)) as target, contextlib.ExitStack() as stack:
        leases.check_lease(lease_s, len(target.inventory.hosts))
        before = hosts_link_before(target.show())
        entries = timeline(schedule, before)
        plans = HostsPlanCache(target, backend, lease_s=lease_s, force=bool(force), holder=new_holder())
        if not _plan_schedule(path, schedule, entries, before, plans, dry_run):
            console.info("[yellow]dry run[/]: no host was changed")
            return
        common.sigterm_as_interrupt()
        stack.enter_context(plans).open()  # one `node serve` per host for the schedule, closed at the end
        landed = []
        keeper = leases.LeaseKeeper(target.inventory, target.conns, lease_s, plans.holder) if lease_s > 0 else None
        if keeper is not None:
            plans.lost = lambda: dict(keeper.lost)
        try:
            with keeper if keeper is not None else contextlib.nullcontext():
                run_schedule(entries, plans.apply, repeat=schedule.repeat, period_s=schedule.period_s,
                             base=schedule.profile,
                             on_change=lambda item: (landed.append(item), render.schedule_change(item)))
        except KeyboardInterrupt:
            with interrupts.held_off():
                plans.apply(before, lease_s=0)
            render.schedule_summary(lateness(landed), restored=before)
            raise
        trips = plans.round_trips_s[:len(landed)]
        if keeper is not None and landed:
            plans.apply(landed[-1].profile, lease_s=0)  # unchanged in place; the lease released, the step stays
        hosts = len(target.conns)
    render.schedule_summary(lateness(landed))
    if trips:
        console.info(f"each change: one SSH round trip to {hosts} host(s) in parallel, "
                     f"mean {statistics.fmean(trips) * 1000:.1f} ms, max {max(trips) * 1000:.1f} ms")
    console.info("the last step stays; remove it with 'netbench reset --inventory ...'")
