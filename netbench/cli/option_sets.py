"""The option sets sweep, run and collective share: each concern's flags declared once, in its
help section, and handed to the command as one frozen dataclass (cli/groups.py's option_set).

A new flag of a shared concern is its option and its field, here, side by side; every command
that takes the concern has it, in the same section of --help and of the CLI reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from netbench import units
from netbench.cli.common import INSECURE_HELP, TAKEOVER_HELP
from netbench.cli.groups import option_set, options
from netbench.cli.types import FiniteFloatRange, Seconds
from netbench.errors import UsageError

# about the run-to-run spread of a point on a shared 2-core machine (sd 1.6-3.8 % of images/s
# over 3 runs): a window known more finely than runs differ is no more repeatable, and 30 steps at
# 1 ms (about 1 s) were often wider than that (3.4-6 %); docs/validation.md has the figures
DEFAULT_PRECISION = "3%"


# ---------------------------------------------------------------- Network: the points' levels


MAX_WAIT_S = 86400.0  # --settle and --metrics-wait at most: a day, as the other durations

@dataclass(frozen=True)
class Levels:
    """--latency, --bandwidth, --loss, --jitter (comma lists as given), or --topology with --scale:
    the points of a sweep or of a collective benchmark."""

    latency: str | None
    bandwidth: str | None
    loss: str | None
    jitter: str | None
    topology_file: Path | None
    scale: str | None

    @property
    def swept(self) -> bool:
        """Whether any level flag was given."""
        return bool(self.latency or self.bandwidth or self.loss or self.jitter)

    def given(self) -> dict:
        """flag -> value of the level flags (sweep_topology.check_flags' `given`)."""
        return {"--latency": self.latency, "--bandwidth": self.bandwidth, "--loss": self.loss,
                "--jitter": self.jitter}

    def sweep_levels(self):
        """The levels parsed (model/design.SweepLevels); a bad one is a UsageError naming its flag."""
        from netbench.model.design import SweepLevels
        from netbench.model.profile import parse_levels

        def parsed(text, flag, parse):
            return tuple(parse_levels(text, flag, parse)) if text else ()

        return SweepLevels(delay_us=parsed(self.latency, "--latency", units.parse_duration_us),
                           rate_bps=parsed(self.bandwidth, "--bandwidth", units.parse_rate_bps),
                           loss=parsed(self.loss, "--loss", units.parse_ratio),
                           jitter_us=parsed(self.jitter, "--jitter", units.parse_duration_us))


levels_options = option_set(
    Levels, "levels", "Network",
    click.option("--latency", metavar="LIST", help="One-way delays to sweep, e.g. 1,10,100ms."),
    click.option("--bandwidth", metavar="LIST", help="Rates to sweep, e.g. 250,500,1000mbit."),
    click.option("--loss", metavar="LIST", help="Losses to sweep, e.g. 0,1,10%."),
    click.option("--jitter", metavar="LIST", help="Jitters to sweep, e.g. 0,1ms."),
    click.option("--topology", "topology_file", type=click.Path(dir_okay=False, path_type=Path),
                 help="A per-pair topology (profiles/topologies/) as the network instead of the level flags, "
                      "one point per --scale level."),
    click.option("--scale", metavar="LIST", help="With --topology: factors on every delay, e.g. 1,2,4 [default: 1]."),
)


def _congestion_name(ctx, param, value: str | None) -> str | None:
    from netbench.model.congestion import check_name

    why = None if value is None else check_name(value)
    if why is not None:
        raise click.BadParameter(f"{why}; e.g. --congestion-control cubic")
    return value


# --congestion-control NAME (sweep and run): every node's TCP congestion control for the sweep
run_as_option = options("Nodes and compute", click.option(
    "--run-as", "run_as", metavar="USER",
    help="Run every job process (the workers, your command and what it starts) as USER; netbench keeps root "
         "for the network [default: with sudo, the user who ran it; 'root' keeps them root]. Without root, "
         "everything runs as you."))


congestion_option = options("Network", click.option(
    "--congestion-control", "congestion_control", metavar="NAME", callback=_congestion_name,
    help="Set every node's TCP congestion control (e.g. cubic, reno, bbr) for the sweep and put the previous "
         "one back after it; 'host' keeps the host's default, as namespaces inherit it [default: cubic on the "
         "embedded nodes; the hosts' own with --inventory]. Another name: embedded testbed only."))


# ---------------------------------------------------------------- Measurement and precision


@dataclass(frozen=True)
class Probes:
    """What is measured beside each run's steps: the link (--verify), each process's resources
    (--sample-resources), the predicted step (--predict, --recalibrate)."""

    verify_points: bool
    sample_resources: float | None
    predict: bool
    recalibrate: bool


probes_options = option_set(
    Probes, "probes", "Measurement and precision",
    click.option("--verify", "verify_points", is_flag=True,
                 help="Before each run, measure the link (ping, iperf3 if a rate is set) and record it beside "
                      "the profile."),
    click.option("--sample-resources", metavar="DURATION", type=Seconds(0.1, 3600),
                 help="Every process samples its CPU, memory and its node's network bytes this often; "
                      "summaries per process go into each run's record."),
    click.option("--predict/--no-predict", default=True, show_default=True, envvar="NETBENCH_PREDICT",
                 show_envvar=True,
                 help="Calibrate (a short all-reduce and a compute run, before the first point) and record "
                      "each run's predicted step beside the measured one (results.csv predicted_step_s)."),
    click.option("--recalibrate", is_flag=True,
                 help="Measure the calibrations again even where this machine's cache holds one with the same "
                      "key (cached ones are reused for 24 h on the same kernel; docs/background/fixed-costs.md)."),
)


@dataclass(frozen=True)
class Precision:
    """--precision (as given, or NETBENCH_PRECISION) and --max-seconds: a point's window goes on
    until its mean step time is known this well."""

    precision_text: str
    max_seconds: float

    def settings(self, where: str = "flag --precision") -> dict:
        """JobSpec's precision (a fraction, None: off) and max_seconds."""
        return precision_settings(self.precision_text, self.max_seconds, where)


precision_options = option_set(
    Precision, "precision", "Measurement and precision",
    click.option("--precision", "precision_text", default=DEFAULT_PRECISION, show_default=True,
                 metavar="PERCENT", envvar="NETBENCH_PRECISION", show_envvar=True,
                 help="Measure each point past its least window (--steps/--seconds as given, else 32 "
                      "steps: 8 batch means of 4) until the 95% interval of its mean step time (batch "
                      "means) is within this of the mean, e.g. 2%; off: exactly --steps (30)/--seconds. "
                      "results.csv records step_time_ci_pct either way. --dry-run's "
                      "estimate assumes a step-time CV of 0.10 (docs/guide/sweeps.md, Precision)."),
    click.option("--max-seconds", default=60.0, show_default=True, type=Seconds(0.1, 86400),
                 help="With --precision, the longest measured window of a point, in seconds."),
)


def precision_settings(text: str, max_seconds: float, where: str = "flag --precision") -> dict:
    """JobSpec's precision (a fraction, None: off) and max_seconds from the flags' text."""
    if text.strip().lower() in ("off", "none"):
        return {"precision": None, "max_seconds": max_seconds}
    try:
        precision = units.parse_ratio(text)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", hint="e.g. --precision 2%") from None
    if precision == 0:  # a window known exactly never ends
        raise UsageError(f"{where}: {text} would never be reached", hint="e.g. --precision 2%, or off")
    if not 0 < precision < 0.5:
        raise UsageError(f"{where}: {text} is outside (0%, 50%)", hint="e.g. --precision 2%")
    return {"precision": precision, "max_seconds": max_seconds}


# ---------------------------------------------------------------- Output and metrics


@dataclass(frozen=True)
class Metrics:
    """--metrics-port, --metrics-address, --metrics-wait: live Prometheus metrics."""

    metrics_port: int | None
    metrics_address: str | None
    metrics_wait: str

    def wait_s(self) -> float:
        """--metrics-wait in seconds, once the three flags are checked (a one-line UsageError)."""
        try:
            wait_s = units.parse_duration_us(self.metrics_wait) / 1e6
        except ValueError as exc:
            raise UsageError(f"flag --metrics-wait: {exc}", hint="e.g. --metrics-wait 15s") from None
        if wait_s > MAX_WAIT_S:
            raise UsageError(f"flag --metrics-wait: {self.metrics_wait!r} is over {MAX_WAIT_S:g}s (a day)",
                             hint="e.g. --metrics-wait 15s")
        if wait_s and self.metrics_port is None:
            raise UsageError("flag --metrics-wait needs --metrics-port",
                             hint="e.g. --metrics-port 9464 --metrics-wait 15s")
        if self.metrics_address is not None:
            from netbench.metrics import check_address

            if self.metrics_port is None:
                raise UsageError("flag --metrics-address needs --metrics-port", hint="e.g. --metrics-port 9464")
            check_address(self.metrics_address)
        return wait_s


metrics_options = option_set(
    Metrics, "metrics", "Output and metrics",
    click.option("--metrics-port", type=click.IntRange(0, 65535),
                 help="Serve live Prometheus metrics on this port (0: any free port)."),
    click.option("--metrics-address", metavar="IP", help="Address to serve metrics on [default: 127.0.0.1]."),
    click.option("--metrics-wait", "metrics_wait", default="0s", show_default=True, metavar="DURATION",
                 help="With --metrics-port: before the first run, wait up to this long for a first scrape, so a "
                      "Prometheus that discovers the target file late (file_sd: a few seconds) sees every point."),
)


# ---------------------------------------------------------------- Launch and settle


@dataclass(frozen=True)
class Launch:
    """--isolate/--launch, --order, --settle-steps, --settle-round-trips, --settle: how points
    share the job's processes."""

    isolate: bool
    launch_order: str
    settle_steps: int
    settle_round_trips: float
    settle_text: str

    def settings(self) -> dict:
        """SweepConfig's isolate, order and settle (a bad --settle is a UsageError naming it)."""
        from netbench.experiment.settling import Settle

        try:
            seconds = units.parse_duration_us(self.settle_text) / 1e6
        except ValueError as exc:
            raise UsageError(f"flag --settle: {exc}", hint="e.g. --settle 1.5s") from None
        if seconds > MAX_WAIT_S:
            raise UsageError(f"flag --settle: {self.settle_text!r} is over {MAX_WAIT_S:g}s (a day)",
                             hint="e.g. --settle 1.5s")
        return {"isolate": self.isolate, "order": self.launch_order,
                "settle": Settle(steps=self.settle_steps, seconds=seconds, round_trips=self.settle_round_trips)}


launch_options = option_set(
    Launch, "launch", "Launch and settle",
    click.option("--isolate/--launch", default=False, show_default=True,
                 help="--launch: start the job's processes once per job configuration and repetition and move "
                      "them through the points, each applied in place. --isolate: start them anew for every "
                      "point (with warm-up each time)."),
    click.option("--order", "launch_order", type=click.Choice(["descending", "random"]), default="descending",
                 show_default=True,
                 help="The points' order in launches. descending: each change only lowers rate, delay or jitter "
                      "or raises loss, so TCP's congestion state never carries into a wider path (a grid takes a "
                      "few launches per job configuration). random: one launch per job configuration, shuffled "
                      "(TCP carries its state over; see docs/background/launches.md)."),
    click.option("--settle-steps", default=3, show_default=True, type=click.IntRange(0, 100000),
                 help="In a shared launch, drop at least this many steps after a point's change."),
    click.option("--settle-round-trips", "settle_round_trips", default=8.0, show_default=True,
                 type=FiniteFloatRange(0, 10000),
                 help="The settle's time floor in round trips of the point's path, at most --settle; "
                      "0: always --settle."),
    click.option("--settle", "settle_text", default="1.5s", show_default=True, metavar="DURATION",
                 help="In a shared launch, measure a point no sooner than this after its change, or than "
                      "--settle-round-trips round trips of its path where that is shorter (and not before the "
                      "step time is steady again)."),
)


# ---------------------------------------------------------------- Remote hosts


@dataclass(frozen=True)
class Hosts:
    """--inventory, --insecure-host-keys, --takeover: run on SSH hosts instead of the local testbed."""

    inventory: Path | None
    insecure_host_keys: bool
    takeover: bool

    def refuse_without_inventory(self) -> None:
        """On the local testbed, the flags that only mean something for hosts are refused."""
        if self.inventory is None and self.insecure_host_keys:
            raise UsageError("flag --insecure-host-keys: only with --inventory")
        if self.inventory is None and self.takeover:
            raise UsageError("flag --takeover: only with --inventory")


hosts_options = option_set(
    Hosts, "hosts", "Remote hosts",
    click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path),
                 help="Run on the SSH hosts of this inventory (YAML) instead of the local testbed."),
    click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP),
    click.option("--takeover", is_flag=True, help=TAKEOVER_HELP),
)
