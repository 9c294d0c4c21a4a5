"""The sweep's live view and final table (rich); implements runner.Observer."""

from __future__ import annotations

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from netbench import console, units


class SweepView:
    """Progress bar over runs, with the current point, step and images/sec beside it."""

    def __init__(self, config, metrics_url: str | None = None) -> None:
        self.config = config
        self.metrics_url = metrics_url
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
            console=console.out, transient=False,
        )
        self.task = None

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

    def run_started(self, run) -> None:
        self.progress.update(self.task, description=f"{run.run_id} {escape(run.profile.name)}", info="applying profile")

    def profile_applied(self, run) -> None:
        self.progress.update(self.task, info="starting workers")

    def step(self, run, event) -> None:
        from netbench.jobs import events as ev
        from netbench.jobs.analysis import images_per_sec
        from netbench.model.job import images_per_step

        event = ev.as_event(event)
        if not isinstance(event, ev.Step) or event.worker != 0:
            return
        duration = event.duration or 1e-9
        phase = "warm-up" if event.phase == ev.PHASE_WARMUP else "measured"
        # a playbook run carries its own job; a step stands for more than one batch under accum
        images = images_per_step(run.job, run.workers)
        self.progress.update(self.task, info=f"step {event.step} ({phase}) "
                             f"{duration * 1000:.0f} ms, {images_per_sec(images, duration):,.0f} img/s")

    def run_finished(self, run, result) -> None:
        self.progress.advance(self.task)
        stats = result.stats or {}
        if result.status == "ok":
            text = f"{stats.get('images_per_sec', 0):,.1f} img/s"
        else:
            text = f"[red]{escape(result.status)}[/]: {escape(result.error)}"
        self.progress.console.print(f"  {run.run_id} {escape(run.profile.name)} (repeat {run.repeat}): {text}")

    def note(self, text: str) -> None:
        self.progress.console.print(f"[dim]{escape(text)}[/]")

    def warn(self, text: str) -> None:
        """Something that did not work out and did not stop the sweep."""
        from rich.markup import escape

        self.progress.console.print(f"[yellow]warning:[/] {escape(text)}")

    def summary(self, results) -> None:
        table = Table(title=f"sweep {self.config.sweep_id}")
        for col, justify in (("run", "left"), ("profile", "left"), ("delay", "right"), ("rate", "right"),
                             ("loss", "right"), ("rep", "right"), ("images/s", "right"), ("± se", "right"),
                             ("step mean", "right"), ("step p90", "right"), ("status", "left")):
            table.add_column(col, justify=justify)
        for result in results:
            p, s = result.profile, result.stats or {}
            table.add_row(result.run_id, escape(p["name"]), units.format_duration_us(p["delay_us"]),
                          units.format_rate_bps(p["rate_bps"]), units.format_ratio(p["loss"]), str(result.repeat),
                          f"{s['images_per_sec']:,.1f}" if s else "-",
                          f"{s['images_per_sec_stderr']:,.1f}" if s else "-",
                          f"{s['mean_s'] * 1000:.1f} ms" if s else "-",
                          f"{s['p90_s'] * 1000:.1f} ms" if s else "-",
                          "ok" if result.status == "ok" else f"[red]{escape(result.status)}[/]")
        console.out.print(table)
        console.info(f"results: {escape(str(self.config.output))}/results.csv, manifest.json, runs/, logs/")
