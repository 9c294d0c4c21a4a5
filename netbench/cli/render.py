"""All of the CLI's rendering (rich): tables for the testbed, the emulation read back, verify's
checks, doctor over hosts, apply's plan, the sweep's live view and final table (SweepView
implements runner.Observer; a point measured in bytes: render_bytes.py); the report's tables
are render_report.py's. Recorded and user text is escaped, so a
profile, a host or a results folder cannot inject markup."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text

import time

from netbench import console, units


REFRESH_S = 0.1  # the live view's step line changes at most this often
INTERVAL_S = 1.0  # and works out the window's interval at most this often


class SweepView:
    """Progress bar over runs, with the current point, step and images/sec beside it."""

    def __init__(self, config, metrics_url: str | None = None) -> None:
        self.config = config
        self.metrics_url = metrics_url
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
            console=console.out, transient=False,
        )
        self.task = None
        self._stepping: str | None = None  # the run whose steps are coming in
        self._places: dict[str, str] = {}  # run id -> "launch L, point p/N" (launch_point)
        self._fresh: bool | None = None  # the point's processes start with it (None: not told)
        self._window: list[float] = []  # the stepping run's measured step times (s), for its interval
        self._latest: dict = {}  # each worker's latest step (an analysis.Tally of one) where the rate is summed
        self._shown: tuple = (0.0, None)  # when the step line last changed (monotonic), for which (run, phase)
        self._interval: tuple[float, str] = (0.0, "")  # when the interval was last worked out, and its text

    def __enter__(self) -> "SweepView":
        self.progress.start()
        self.task = self.progress.add_task("starting", total=len(self.config.runs), info="")
        if self.metrics_url:
            self.progress.console.print(f"metrics: [bold]{escape(self.metrics_url)}[/] (Prometheus, live)")
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def sweep_started(self, config, backend, topology) -> None:
        self.progress.console.print(f"sweep [bold]{escape(config.sweep_id)}[/]: {len(config.runs)} runs on "
                                    f"{len(topology.nodes)} nodes ({topology.subnet}), backend "
                                    f"[bold]{backend.name}[/] ({escape(backend.reason)}); "
                                    f"results -> {escape(str(config.output))}")
        if getattr(config, "output", None) is not None and hasattr(config, "run_as"):
            from netbench.testbed import sandbox

            self.progress.console.print(escape(sandbox.describe_here(config.run_as)))

    def run_started(self, run) -> None:
        self.progress.update(self.task, description=f"{run.run_id} {escape(run.profile.name)}", info="applying profile")

    def launch_point(self, run, launch, position: int, points: int) -> None:
        self._fresh = launch is None or position == 1
        if launch is None:  # a launch of its own: the point is the launch
            return
        self._places[run.run_id] = place = f"launch {launch}, point {position}/{points}"
        self.progress.update(self.task, description=f"{run.run_id} {escape(run.profile.name)} ({place})")

    def window(self, run, start_wall: float, end_wall: float) -> None:
        pass  # the point's line says how it measured when it finishes

    def profile_applied(self, run) -> None:
        if self._stepping != run.run_id:  # a schedule's change mid-run keeps the step info
            # in a shared launch the workers run on: the first steps after the change settle
            fresh = self._fresh if self._fresh is not None else self._stepping is None
            self.progress.update(self.task, info="starting workers" if fresh else "settling after the change")

    def step(self, run, event) -> None:
        # called for every step of every process: the line changes at most every REFRESH_S (it
        # is drawn 10 times a second anyway) unless the run or phase changes, and the interval
        # at most every INTERVAL_S, so the controller's per-step work stays small beside a 1 ms
        # step on 2 shared cores
        from netbench.jobs import events as ev
        from netbench.jobs.analysis import CHIEF, Tally, rate_rule

        event = ev.as_event(event)
        if not isinstance(event, ev.Step):
            return
        if self._stepping != run.run_id:
            self._stepping, self._window, self._interval, self._latest = run.run_id, [], (0.0, ""), {}
        summed = run.job.command is None and rate_rule(run.job) != CHIEF
        if summed and event.task_role == "worker":  # own pace: every worker's latest step counts
            self._latest[event.worker or 0] = Tally().add(event)
        if event.worker != 0:
            return
        if event.phase == ev.PHASE_MEASURED:
            self._window.append(event.duration)
        now = time.monotonic()
        if now - self._shown[0] < REFRESH_S and self._shown[1] == (run.run_id, event.phase):
            return
        self._shown = (now, (run.run_id, event.phase))
        duration = event.duration or 1e-9
        phase = {ev.PHASE_WARMUP: "warm-up", ev.PHASE_SETTLE: "settling"}.get(event.phase, event.phase)
        rate = self._rate(run, event, duration, summed)
        self.progress.update(self.task, info=f"step {event.step} ({phase}) {duration * 1000:.0f} ms"
                             + ("" if rate is None else f", {rate:,.0f} img/s") + self._precision(run, now))

    def _rate(self, run, event, duration: float, summed: bool) -> float | None:
        """The step line's images/sec: the chief's step's images over its duration where the
        workers leave each step together; the sum of every worker's own latest rate under the
        own-pace strategies and ps-sync with backup workers (jobs/analysis.py rate_rule, as the
        results and metrics), None until each worker has stepped."""
        from netbench.jobs.analysis import images_per_sec, summed_rate
        from netbench.model.job import images_per_step

        if summed:
            return summed_rate(run.job, self._latest, run.workers)
        # a playbook run carries its own job; a step stands for more than one batch under accum
        images = images_per_step(run.job, run.workers) if run.job.command is None else event.images
        return images_per_sec(images, duration)

    def _precision(self, run, now: float) -> str:
        """", ±h% of P (n steps)": the 95 % interval of the window's mean step so far, narrowing."""
        from netbench import stats

        if len(self._window) < 2 * stats.MIN_BATCHES:
            return ""
        if now - self._interval[0] >= INTERVAL_S:
            width = stats.relative_half_width(stats.batch_means_interval(self._window))
            target = f" of {run.job.precision * 100:g}%" if run.job.precision else ""
            text = "" if width is None else f", ±{width * 100:.1f}%{target} ({len(self._window)} steps)"
            self._interval = (now, text)
        return self._interval[1]

    def run_finished(self, run, result) -> None:
        self.progress.advance(self.task)
        stats = result.stats or {}
        from netbench.cli import render_bytes
        from netbench.cli.render_collective import versus_predicted

        if result.status == "ok" and render_bytes.is_bytes(result):
            text = render_bytes.finished_text(result)
        elif result.status == "ok":
            text = f"{stats.get('images_per_sec', 0):,.1f} img/s" + versus_predicted(stats.get("mean_s"),
                                                                                    result.predicted_step_s)
        else:
            text = f"[red]{escape(result.status)}[/]: {escape(result.error)}"
        place = self._places.pop(run.run_id, None) or (None if result.launch is None else f"launch {result.launch}")
        launch = "" if place is None else f", {place}"
        self.progress.console.print(f"  {run.run_id} {escape(run.profile.name)} (repeat {run.repeat}{launch}): {text}")
        waited = straggler_line(result)
        if waited:
            self.progress.console.print(f"    {escape(waited)}")

    def note(self, text: str) -> None:
        self.progress.console.print(f"[dim]{escape(text)}[/]")

    def warn(self, text: str) -> None:
        """Something that did not work out and did not stop the sweep."""
        from rich.markup import escape

        self.progress.console.print(f"[yellow]warning:[/] {escape(text)}")

    def summary(self, results) -> None:
        from netbench.cli import render_bytes

        table = Table(title=f"sweep {self.config.sweep_id}")
        for col, justify in (("run", "left"), ("profile", "left"), ("delay", "right"), ("rate", "right"),
                             ("loss", "right"), ("rep", "right"), ("images/s", "right"), ("± se", "right"),
                             ("step mean", "right"), ("± 95%", "right"), ("step p90", "right"), ("status", "left")):
            table.add_column(col, justify=justify)
        for result in results:
            p, s = result.profile, result.stats or {}
            table.add_row(result.run_id, escape(p["name"]), units.format_duration_us(p["delay_us"]),
                          units.format_rate_bps(p["rate_bps"]), units.format_ratio(p["loss"]), str(result.repeat),
                          f"{s['images_per_sec']:,.1f}" if s else "-",
                          f"{s['images_per_sec_stderr']:,.1f}" if s else "-",
                          f"{s['mean_s'] * 1000:.1f} ms" if s else "-",
                          "-" if result.step_time_ci_pct is None else f"{result.step_time_ci_pct:.1f}%"
                          + ("" if result.precision_reached in (None, True) else " [yellow](cap hit: not reached)[/]"),
                          f"{s['p90_s'] * 1000:.1f} ms" if s else "-",
                          render_bytes.status_cell(result))
        console.out.print(table)
        for line in (capped_line(results, self.config.job), run_to_run_line(results),
                     render_bytes.summary_note(results)):
            if line:
                console.info(line)
        console.info(f"results: {escape(str(self.config.output))}/results.csv, manifest.json, runs/, logs/")


def straggler_line(result) -> str | None:
    """Who the others waited for, after a run: "n2 was the last to finish in 96 % of steps; the
    others waited 44 % of their step" (jobs/stragglers.py); with backup workers, the gradients
    dropped per worker; None when nobody is named and nothing was dropped."""
    from netbench.jobs.stragglers import sentence

    record = getattr(result, "stragglers", None)
    if result.status != "ok" or not record:
        return None
    line = sentence(record)
    ranks = record.get("ranks", ())
    drops = [f"{r['node']} {r['dropped']}" for r in ranks if r.get("dropped") is not None]
    if drops:
        line = (line + "; " if line else "") + "gradients dropped as late: " + ", ".join(drops)
    return line


def capped_line(results, job) -> str:
    """"N of M runs stopped at --max-seconds short of ±P %: r000 (±2.3 %), ..." for the ok runs
    whose window the cap ended before its precision; "" when none did."""
    capped = [r for r in results if r.status == "ok" and r.precision_reached is False]
    if not capped:
        return ""
    asked = [r for r in results if r.status == "ok" and r.precision_reached is not None]
    target = f" short of ±{job.precision * 100:g} %" if getattr(job, "precision", None) else " short of the precision"
    cap = f" ({job.max_seconds:g} s)" if getattr(job, "max_seconds", None) else ""
    runs = ", ".join(f"{r.run_id} (±{r.step_time_ci_pct:.1f} %)" if r.step_time_ci_pct is not None else r.run_id
                     for r in capped)
    return (f"[yellow]precision not reached[/]: {len(capped)} of {len(asked)} runs stopped at --max-seconds{cap}"
            f"{target}: {escape(runs)}")


def run_to_run_line(results) -> str:
    """"run to run: <point> sd X % (within-run ±Y %), ..." for the points with 2 or more ok runs
    (what varies between repetitions against each run's own interval); "" when none has."""
    from netbench.report.groups import spread_pct

    by_point: dict[str, list] = {}
    for result in results:
        if result.status == "ok" and result.stats:
            by_point.setdefault(result.profile["name"], []).append(result)
    cells = []
    for name, runs in by_point.items():
        sd = spread_pct([r.stats["images_per_sec"] for r in runs])
        widths = [r.step_time_ci_pct for r in runs if r.step_time_ci_pct is not None]
        if sd is not None:
            within = f" (within-run ±{sum(widths) / len(widths):.1f} %)" if widths else ""
            cells.append(f"{escape(name)} sd {sd:.1f} %{within}")
    return "run to run: " + ", ".join(cells) if cells else ""


# ---------------------------------------------------------------- testbed

def topology_table(topo) -> None:
    table = Table(title=f"testbed on {topo.subnet}")
    for col in ("node", "namespace", "interface", "address"):
        table.add_column(col)
    for node in topo.nodes:
        table.add_row(node.name, node.netns, node.ifname, f"{node.address}/{node.prefixlen}")
    console.out.print(table)


def testbeds_table(rows: list[dict]) -> None:
    """The other testbeds on this machine (testbed/sandbox.py's listing): whose, what holds
    them, and whether they are in use."""
    table = Table(title="other testbeds on this machine")
    for col in ("testbed", "owner", "privilege", "held by", "state"):
        table.add_column(col)
    for row in rows:
        held = f"{row['kind']} pid {row['pid']}" + ("" if row["alive"] else " (gone: 'netbench reset' removes it)")
        table.add_row(escape(row["id"]), escape(row["owner"]), row["privilege"], escape(held), escape(row["state"]))
    console.out.print(table)


# ---------------------------------------------------------------- apply

def planned(target_kind: str, planned, inventory_hosts=(), dry_run: bool = False) -> None:
    """What apply is about to do: the profile and backend (embedded) or each host's backend,
    and with dry_run every change."""
    from netbench.testbed.base import EMBEDDED

    profile = planned.profile
    if target_kind == "embedded":
        what = (f"topology [bold]{escape(profile.name)}[/] ({len(profile.links)} shaped pair(s)"
                + (f", delays x{profile.scale:g}" if profile.scale != 1 else "") + ")"
                if hasattr(profile, "links") else f"profile [bold]{escape(profile.name)}[/] ({escape(profile.label())})")
        console.info(f"{what}, backend [bold]{planned.backends[EMBEDDED]}[/]: {escape(planned.reasons[EMBEDDED])}")
        if dry_run:
            console.info("[yellow]dry run[/]: these changes would be made:")
            for change in planned.changes[EMBEDDED]:
                console.plain("  " + change.describe())
        return
    for host in inventory_hosts:
        console.info(f"host [bold]{host.name}[/] ({host.interface}): backend {escape(str(planned.backends[host.name]))}")
        if dry_run:
            for change in planned.changes[host.name]:
                console.plain("  " + change.describe())


# ---------------------------------------------------------------- apply --schedule

def schedule_timeline(schedule, entries, before, backend: str, dry_run: bool) -> None:
    """The schedule's timeline: when, the keys that change, the profile then in force."""
    start = "its base profile" if schedule.profile is not None else f"the link as it is ({before.label()})"
    loop = f", repeating every {schedule.cycle:g}{' steps' if schedule.by_step else 's'}" if schedule.repeat else ""
    console.info(f"schedule [bold]{escape(schedule.name)}[/]: {len(entries)} change(s) from {escape(start)}, "
                 f"backend [bold]{escape(backend)}[/]{loop}")
    if not dry_run:
        return
    console.info("[yellow]dry run[/]: these changes would be made (nothing was changed):")
    width = max(len(entry.when) for entry in entries)
    for entry in entries:
        changed = ", ".join(f"{key} {value}" for key, value in entry.changes) or "no change"
        console.plain(f"  {entry.when:>{width}}  step {entry.step}: {changed} -> {entry.profile.name} "
                      f"({entry.profile.label()})")


def schedule_plan_line(schedule, entries) -> str:
    """A sweep's or playbook's dry run: a schedule's timeline length and duration (plain text)."""
    unit = " steps" if schedule.by_step else "s"
    last = entries[-1].at_step if schedule.by_step else entries[-1].at_s
    loop = f", repeating every {schedule.cycle:g}{unit} until the run ends" if schedule.repeat else ""
    return (f"schedule {schedule.name} ({schedule.source}): {len(entries)} change(s) over {last:g}{unit} "
            f"from the first measured step{loop}")


def schedule_change(landed) -> None:
    """One change as it landed: when, the profile, how late."""
    when = f"step {landed.at_step}" if landed.at_step is not None else f"{landed.scheduled_s:8.3f}s"
    loop = f" (loop {landed.cycle + 1})" if landed.cycle else ""
    merged = f", {len(landed.merged)} earlier change(s) merged into it" if getattr(landed, "merged", ()) else ""
    console.info(f"  {when}  {escape(landed.profile.name)} ({escape(landed.profile.label())}){loop}  "
                 f"[dim]landed {landed.lateness_s * 1000:+.1f} ms from its time{merged}[/]")


def schedule_summary(summary, restored=None) -> None:
    """The closing line: how many changes, their lateness; and what was put back."""
    if restored is not None:
        console.info(f"restored the link as it was: {escape(restored.name)} ({escape(restored.label())})")
    if summary is None:
        console.info("schedule: no change landed")
        return
    console.info(f"schedule: {summary.changes} change(s), lateness mean {summary.mean_s * 1000:.1f} ms, "
                 f"p99 {summary.p99_s * 1000:.1f} ms, max {summary.max_s * 1000:.1f} ms "
                 f"(furthest from its time: {summary.worst_s * 1000:.1f} ms)")


# ---------------------------------------------------------------- show

def show_cells(row: dict) -> list[str]:
    """One node's row: the profile its links amount to, then the other netem keys."""
    profile, qdisc, engine = row.get("profile") or {}, row.get("qdisc") or {}, row.get("engine") or {}
    if engine:  # every cell is markup: what the kernel or a host reported is escaped
        engine_text = ("running" if engine.get("alive") else "[red]dead[/]") + \
            escape(f" pid {engine.get('pid')}, {engine.get('received', 0)} pkts, {engine.get('dropped', 0)} dropped")
    else:
        engine_text = "-"
    shown = ("name", "delay", "jitter", "loss", "rate")
    other = ", ".join(f"{key} {', '.join(value) if isinstance(value, list) else value}"
                      for key, value in profile.items() if key not in shown) or "-"
    loss = profile.get("loss", "-")
    if isinstance(loss, dict):
        loss = f"{loss.get('model')} p {loss.get('p')} r {loss.get('r')}"
    cells = [row["node"], row.get("backend") or "none", profile.get("delay", "-"), profile.get("jitter", "-"),
             loss, profile.get("rate", "unlimited" if profile else "-"), other]
    return [escape(str(cell)) for cell in cells] + [engine_text, escape(str(qdisc.get("drops", "-")))]


def emulation_table(rows: list[dict]) -> None:
    table = Table(title="active emulation")
    for col in ("node", "backend", "delay", "jitter", "loss", "rate", "other", "engine", "qdisc drops"):
        table.add_column(col)
    for row in rows:
        table.add_row(*show_cells(row))
    console.out.print(table)


def hosts_emulation_table(shown: dict) -> None:
    table = Table(title="active emulation on each host's data-plane interface")
    for col in ("host", "backend", "delay", "jitter", "loss", "rate", "other", "engine", "qdisc drops", "lease"):
        table.add_column(col)
    for name, data in shown.items():
        lease = data["lease"]
        lease_text = f"{lease['remaining_s']:.0f}/{lease['seconds']:g} s" if lease["held"] else "-"
        for row in data["nodes"]:
            table.add_row(name, *show_cells(row)[1:], lease_text)
    console.out.print(table)


# ---------------------------------------------------------------- verify

def checks_table(checks: list[dict]) -> None:
    def value(metric: str, number) -> str:
        if number is None:
            return "-"
        return {"rtt": f"{number:.3f} ms", "loss": units.format_ratio(number),
                "rate": units.format_rate_bps(int(number))}[metric]

    table = Table(title="configured vs measured")
    for col in ("metric", "configured", "measured", "error", "ok", "rule"):
        table.add_column(col)
    for c in checks:
        if c["error"] is None:
            error = "-"
        elif c["metric"] == "rate":
            error = f"{c['error']:+.1%}"
        elif c["metric"] == "rtt":
            error = f"{c['error']:+.3f} ms"
        else:
            error = f"{c['error']:+.4f}"
        ok = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[c["ok"]]
        table.add_row(c["metric"], value(c["metric"], c["configured"]), value(c["metric"], c["measured"]), error, ok,
                      c["rule"])
    console.out.print(table)


# ---------------------------------------------------------------- doctor and reset

def hosts_doctor(report, as_json: bool) -> None:
    """doctor over an inventory (testbed.hosts.HostsReport)."""
    import json

    if as_json:
        console.plain(json.dumps({"ready": report.ready, "hosts": {n: [{"check": c, "status": s, "detail": d}
                                                                        for c, s, d in r]
                                                                    for n, r in report.rows.items()}}, indent=2))
        return
    table = Table(title=f"hosts of {escape(report.path)}")
    for col in ("host", "check", "status", "detail"):
        table.add_column(col)
    colour = {"ok": "green", "limited": "yellow"}
    for name, r in report.rows.items():
        for check, status, detail in r:
            table.add_row(name, escape(str(check)), f"[{colour.get(status, 'red')}]{escape(str(status))}[/]",
                          escape(str(detail)))
    console.out.print(table)


def removed(target_kind: str, removed: dict[str, list[str]], complete: bool = True) -> None:
    """What reset removed: on this machine, or per host then this controller's leftovers.
    `complete` False: some of it could not be removed (the error that follows says what)."""
    from netbench.testbed.base import EMBEDDED

    if target_kind == "embedded":
        lines = removed.get(EMBEDDED, [])
        for line in lines:
            console.info(f"removed {escape(line)}")
        if complete:
            console.info("[green]clean[/]: nothing netbench made is left" if lines
                         else "nothing to remove: the machine is clean")
        return
    for name, lines in removed.items():
        if name == EMBEDDED:
            continue
        for line in lines:
            console.info(f"{name}: removed {escape(str(line))}")
        if not lines:
            console.info(f"{name}: nothing to remove")
    for line in removed.get(EMBEDDED, ()):
        console.info(f"removed {line}")


_DOCTOR_STYLES = {"ok": "green", "missing": "red", "skipped": "dim"}


def rootless_limits(rows: list[dict]) -> None:
    """doctor's section for a user without root: what this host withholds, and the fix."""
    if not rows:
        console.info("[green]without root[/]: nothing on this host is withheld from you")
        return
    table = Table(title="without root, this host withholds")
    for column in ("setting", "what it means", "fix"):
        table.add_column(column)
    for row in rows:
        table.add_row(Text(row["what"]), Text(row["says"], style="red" if row["blocks"] else ""), Text(row["fix"]))
    console.out.print(table)


def doctor_table(report) -> Table:
    """doctor's report (experiment.doctor.Report) as a table; plain Text cells, since fixes hold brackets such as '.[tf]'."""
    table = Table(title="netbench doctor", caption=f"backend: {report.backend} ({report.backend_reason})")
    for column in ("check", "status", "needed by", "detail", "fix"):
        table.add_column(column)
    for check in report.checks:
        table.add_row(Text(check.name), Text(check.status, style=_DOCTOR_STYLES[check.status]),
                      Text(", ".join(check.needed_by) or "-"), Text(check.detail), Text(check.fix or "-"))
    return table


