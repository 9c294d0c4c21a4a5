"""What every command shares: error translation, the root check, exit statuses, options.

Errors from the library (NetbenchError) become a one-line message and an exit status here,
and nowhere else.
"""

from __future__ import annotations

import enum
import functools
import os
import signal
import sys
from pathlib import Path

import click

from netbench import console, units
from netbench.cli.types import FiniteFloatRange, Seconds
from netbench.errors import PrivilegeError, NetbenchError, UsageError

BACKEND_CHOICES = ("auto", "netem", "userspace")

INVENTORY_HELP = "Drive the SSH hosts of this inventory (YAML) instead of the local testbed."
INSECURE_HELP = "Accept any SSH host key (default: verify against known_hosts)."
TAKEOVER_HELP = ("With --inventory: apply even to hosts whose unexpired lease another controller holds "
                 "(one that is gone, or one you mean to stop).")


class ExitStatus(enum.IntEnum):
    """netbench's exit statuses (errors.NetbenchError.exit_code carries 1 to 3)."""

    OK = 0
    ERROR = 1  # a failure, a verify out of tolerance, no backend (doctor)
    USAGE = 2  # bad input: flags, files, profiles
    PRIVILEGE = 3  # needs root
    INTERRUPTED = 130  # Ctrl-C, SIGTERM, SIGHUP


def handle_errors(func):
    """Translate library errors into a message and exit code; Ctrl-C exits 130."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except NetbenchError as exc:
            console.error(exc.message, exc.hint)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.error("interrupted")
            sys.exit(int(ExitStatus.INTERRUPTED))

    return wrapper


def fail_if_any_failed(results) -> None:
    """After a sweep or playbook: exit 1 when any run failed (its record says why); a timeout
    is a result, not a failure."""
    from netbench.model.design import COMPLETE_STATUSES

    failed = [result.run_id for result in results if result.status not in COMPLETE_STATUSES]
    if failed:
        shown = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        raise NetbenchError(f"{len(failed)} of {len(results)} run(s) failed: {shown}",
                            hint="each run's record (runs/<run>.json) and logs/ say why")


def require_root() -> None:
    if os.geteuid() != 0:
        raise PrivilegeError("this command changes network namespaces and needs root",
                             hint="run it with sudo, or as root")


def sigterm_as_interrupt() -> None:
    """SIGTERM and SIGHUP (a closed terminal or SSH session) take the same path as Ctrl-C:
    reset, then exit."""
    from netbench import interrupts

    interrupts.as_interrupt(signal.SIGTERM, signal.SIGHUP)


_sigterm_as_interrupt = sigterm_as_interrupt  # the name the sweep and run bodies use


def _options(func, options):
    for option in reversed(options):
        func = option(func)
    return func


def profile_options(func):
    """--latency, --jitter, --bandwidth, --loss: one profile's values (apply)."""
    return _options(func, [
        click.option("--latency", metavar="DURATION", help="One-way delay at each node's egress, e.g. 10ms."),
        click.option("--jitter", metavar="DURATION", help="Delay variation (+-), e.g. 1ms."),
        click.option("--bandwidth", metavar="RATE", help="Egress rate limit, e.g. 250mbit."),
        click.option("--loss", metavar="PERCENT", help="Packet loss at egress, e.g. 1%."),
    ])


def inventory_options(func):
    """--inventory and --insecure-host-keys: which target a command drives (apply, show,
    reset, doctor); testbed.base.open_target turns them into a Target."""
    return _options(func, [
        click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path), help=INVENTORY_HELP),
        click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP),
    ])


def apply_remote_options(func):
    """apply's options that only mean something with --inventory (None when not given)."""
    return _options(func, [
        click.option("--lease", type=Seconds(0, 86400), default=None,
                     help="With --inventory: lease in seconds [default: 60]; the command holds it until Ctrl-C, "
                          "and hosts revert by themselves if it is not renewed. 0: no lease, return at once."),
        click.option("--force", is_flag=True, default=None,
                     help="With --inventory: shape even an interface that carries the SSH connection."),
        click.option("--takeover", is_flag=True, default=None, help=TAKEOVER_HELP),
    ])


def check_local_flags(inventory, insecure_host_keys: bool, **remote_only) -> None:
    """Without --inventory, the remote-only flags are refused, naming the flag."""
    if inventory is not None:
        return
    for name, value in remote_only.items():
        if value not in (None, False):
            raise UsageError(f"flag --{name.replace('_', '-')}: only with --inventory")
    if insecure_host_keys:
        raise UsageError("flag --insecure-host-keys: only with --inventory")


def hosts_options(func):
    """--inventory, --insecure-host-keys and --takeover for sweep and run (their own bodies use them)."""
    return _options(func, [
        click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path),
                     help="Run on the SSH hosts of this inventory (YAML) instead of the local testbed."),
        click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP),
        click.option("--takeover", is_flag=True, help=TAKEOVER_HELP),
    ])


def metrics_options(command):
    """--metrics-port, --metrics-address, --metrics-wait (sweep and run)."""
    command = click.option("--metrics-wait", "metrics_wait", default="0s", show_default=True, metavar="DURATION",
                           help="With --metrics-port: before the first run, wait up to this long for a first scrape, "
                                "so a Prometheus that discovers the target file late (file_sd: a few seconds) sees "
                                "every point.")(command)
    command = click.option("--metrics-address", metavar="IP",
                           help="Address to serve metrics on [default: 127.0.0.1].")(command)
    return click.option("--metrics-port", type=click.IntRange(0, 65535),
                        help="Serve live Prometheus metrics on this port (0: any free port).")(command)


def check_metrics_flags(metrics_port, metrics_address, metrics_wait: str = "0s") -> float:
    """The flags' errors in one line; returns --metrics-wait in seconds."""
    try:
        wait_s = units.parse_duration_us(metrics_wait) / 1e6
    except ValueError as exc:
        raise UsageError(f"flag --metrics-wait: {exc}", hint="e.g. --metrics-wait 15s") from None
    if wait_s and metrics_port is None:
        raise UsageError("flag --metrics-wait needs --metrics-port", hint="e.g. --metrics-port 9464 --metrics-wait 15s")
    if metrics_address is not None:
        from netbench.metrics import check_address

        if metrics_port is None:
            raise UsageError("flag --metrics-address needs --metrics-port", hint="e.g. --metrics-port 9464")
        check_address(metrics_address)
    return wait_s


def launch_options(command):
    """--isolate/--launch, --order, --settle-steps, --settle: how points share the job's processes."""
    command = click.option("--settle", "settle_text", default="1.5s", show_default=True, metavar="DURATION",
                           help="In a shared launch, measure a point no sooner than this after its change, or "
                                "than --settle-round-trips round trips of its path where that is shorter (and not "
                                "before the step time is steady again).")(command)
    command = click.option("--settle-round-trips", "settle_round_trips", default=8.0, show_default=True,
                           type=FiniteFloatRange(0, 10000),
                           help="The settle's time floor in round trips of the point's path, at most --settle; "
                                "0: always --settle.")(command)
    command = click.option("--settle-steps", default=3, show_default=True, type=click.IntRange(0, 100000),
                           help="In a shared launch, drop at least this many steps after a point's change.")(command)
    command = click.option("--order", "launch_order", type=click.Choice(["descending", "random"]),
                           default="descending", show_default=True,
                           help="The points' order in launches. descending: each change only lowers rate, "
                                "delay or jitter or raises loss, so TCP's congestion state never carries into "
                                "a wider path (a grid takes a few launches per job configuration). random: one "
                                "launch per job configuration, shuffled (TCP carries its state over; see "
                                "docs/background/launches.md).")(command)
    return click.option("--isolate/--launch", default=False, show_default=True,
                        help="--launch: start the job's processes once per job configuration and repetition "
                             "and move them through the points, each applied in place. --isolate: start them "
                             "anew for every point (with warm-up each time).")(command)


def launch_settings(isolate: bool, settle_text: str, settle_steps: int, order: str,
                    round_trips: float | None = None) -> dict:
    """SweepConfig's isolate, order and settle from the flags (`round_trips` None: the default)."""
    from netbench.experiment.settling import ROUND_TRIPS, Settle

    try:
        seconds = units.parse_duration_us(settle_text) / 1e6
    except ValueError as exc:
        raise UsageError(f"flag --settle: {exc}", hint="e.g. --settle 1.5s") from None
    return {"isolate": isolate, "order": order, "settle": Settle(
        steps=settle_steps, seconds=seconds, round_trips=ROUND_TRIPS if round_trips is None else round_trips)}


# about the run-to-run spread of a point on a shared 2-core machine (sd 1.6-3.8 % of images/s
# over 3 runs): a window known more finely than runs differ is no more repeatable, and 30 steps at
# 1 ms (about 1 s) were often wider than that (3.4-6 %); docs/validation.md has the figures
DEFAULT_PRECISION = "3%"


def precision_options(command):
    """--precision, --max-seconds: a point's window goes on until its mean step time is known."""
    command = click.option("--max-seconds", default=60.0, show_default=True, type=Seconds(0.1, 86400),
                           help="With --precision, the longest measured window of a point, in seconds.")(command)
    return click.option("--precision", "precision_text", default=DEFAULT_PRECISION, show_default=True,
                        metavar="PERCENT", envvar="NETBENCH_PRECISION", show_envvar=True,
                        help="Measure each point past its least window (--steps/--seconds as given, else 32 "
                             "steps: 8 batch means of 4) until the 95% interval of its mean step time (batch "
                             "means) is within this of the mean, e.g. 2%; off: exactly --steps (30)/--seconds. "
                             "results.csv records step_time_ci_pct either way. --dry-run's "
                             "estimate assumes a step-time CV of 0.10 (docs/guide/sweeps.md, Precision).")(command)


def sample_resources_option(command):
    """--sample-resources SECONDS (sweep and run)."""
    return click.option("--sample-resources", metavar="DURATION", type=Seconds(0.1, 3600),
                        help="Every process samples its CPU, memory and its node's network bytes this often; "
                             "summaries per process go into each run's record.")(command)


def predict_option(command):
    """--predict/--no-predict: calibrate and record each run's predicted step (sweep and run)."""
    return click.option("--predict/--no-predict", default=True, show_default=True, envvar="NETBENCH_PREDICT",
                        show_envvar=True,
                        help="Calibrate (a short all-reduce and a compute run, before the first point) and record "
                             "each run's predicted step beside the measured one (results.csv predicted_step_s).")(command)


def recalibrate_option(command):
    """--recalibrate (sweep and run): measure every calibration again instead of reusing a cached one."""
    return click.option("--recalibrate", is_flag=True,
                        help="Measure the calibrations again even where this machine's cache holds one with the same "
                             "key (cached ones are reused for 24 h on the same kernel; docs/background/fixed-costs.md)."
                        )(command)


def _congestion_name(ctx, param, value: str | None) -> str | None:
    from netbench.model.congestion import check_name

    why = None if value is None else check_name(value)
    if why is not None:
        raise click.BadParameter(f"{why}; e.g. --congestion-control cubic")
    return value


def congestion_option(command):
    """--congestion-control NAME (sweep and run): every node's TCP congestion control for the sweep."""
    return click.option("--congestion-control", "congestion_control", metavar="NAME", callback=_congestion_name,
                        help="Set every node's TCP congestion control (e.g. cubic, reno, bbr) for the sweep and "
                             "put the previous one back after it; 'host' keeps the host's default, as namespaces "
                             "inherit it [default: cubic on the embedded nodes; the hosts' own with --inventory]. "
                             "Another name: embedded testbed only.")(command)


def check_congestion(name: str | None, where: str = "flag --congestion-control") -> None:
    """Before a sweep on this machine: refuse a congestion control the kernel does not have
    (after trying to load its module), naming `where`; nothing is applied."""
    if name and name != "host":  # 'host': nothing is set
        from netbench.testbed.congestion import check_available

        check_available(name, where)


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


def precision_note(job) -> str:
    """" at least, until ±P % (at most S s)" for a job with a precision; "" without."""
    if not job.precision:
        return ""
    return f" at least, until ±{job.precision * 100:g} % (95 %, at most {job.max_seconds:g} s)"
