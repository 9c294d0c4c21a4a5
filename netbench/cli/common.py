"""What every command shares: error translation, the root check, exit statuses, the target options.

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

from netbench import console
from netbench.cli.groups import options
from netbench.cli.types import Seconds
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
    """For what only root may do on a host (the `node` commands a controller runs over SSH)."""
    if os.geteuid() != 0:
        raise PrivilegeError("this command changes network namespaces and needs root",
                             hint="run it with sudo, or as root")


def require_testbed(use: str) -> None:
    """Put the command where its testbed is before it changes anything (testbed/sandbox.py):
    root's default testbed, or a sandbox of its own; without root, the user's. `use`: "up",
    "uses" (the testbed that is up) or "sweeps" (that one, or one of its own when it is busy).
    May run the command again inside a sandbox (then never returns here)."""
    from netbench.testbed import sandbox

    sandbox.take_testbed(use, sys.argv[1:])


def job_user(flag: str | None):
    """Whom this command's job processes run as (testbed/run_as.py): None for this process's own
    user; a user who could not run them is refused here, before anything starts."""
    from netbench import proc
    from netbench.testbed import run_as

    chosen = run_as.for_this_command(flag)
    if chosen is not None:
        run_as.check_usable(chosen, sys.executable, proc.child_pythonpath())
    return chosen


def hand_over(path: Path, user) -> None:
    """Give a results folder (and everything in it) to the user the jobs ran as: results and
    reports belong to the user who ran sudo, not to root."""
    if user is None or not path.exists():
        return
    for folder, dirs, files in os.walk(path):
        for name in [folder, *(os.path.join(folder, f) for f in files + dirs)]:
            try:
                os.lchown(name, user.uid, user.gid)
            except OSError:
                pass


def sigterm_as_interrupt() -> None:
    """SIGTERM and SIGHUP (a closed terminal or SSH session) take the same path as Ctrl-C:
    reset, then exit."""
    from netbench import interrupts

    interrupts.as_interrupt(signal.SIGTERM, signal.SIGHUP)


_sigterm_as_interrupt = sigterm_as_interrupt  # the name the sweep and run bodies use


def profile_options(func):
    """--latency, --jitter, --bandwidth, --loss: one profile's values (apply)."""
    return options("Network",
        click.option("--latency", metavar="DURATION", help="One-way delay at each node's egress, e.g. 10ms."),
        click.option("--jitter", metavar="DURATION", help="Delay variation (+-), e.g. 1ms."),
        click.option("--bandwidth", metavar="RATE", help="Egress rate limit, e.g. 250mbit."),
        click.option("--loss", metavar="PERCENT", help="Packet loss at egress, e.g. 1%."),
    )(func)


def inventory_options(func):
    """--inventory and --insecure-host-keys: which target a command drives (apply, show,
    reset, doctor); testbed.base.open_target turns them into a Target."""
    return options("Remote hosts",
        click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path), help=INVENTORY_HELP),
        click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP),
    )(func)


def apply_remote_options(func):
    """apply's options that only mean something with --inventory (None when not given)."""
    return options("Remote hosts",
        click.option("--lease", type=Seconds(0, 86400), default=None,
                     help="With --inventory: lease in seconds [default: 60]; the command holds it until Ctrl-C, "
                          "and hosts revert by themselves if it is not renewed. 0: no lease, return at once."),
        click.option("--force", is_flag=True, default=None,
                     help="With --inventory: shape even an interface that carries the SSH connection."),
        click.option("--takeover", is_flag=True, default=None, help=TAKEOVER_HELP),
    )(func)


def check_local_flags(inventory, insecure_host_keys: bool, **remote_only) -> None:
    """Without --inventory, the remote-only flags are refused, naming the flag."""
    if inventory is not None:
        return
    for name, value in remote_only.items():
        if value not in (None, False):
            raise UsageError(f"flag --{name.replace('_', '-')}: only with --inventory")
    if insecure_host_keys:
        raise UsageError("flag --insecure-host-keys: only with --inventory")


def check_congestion(name: str | None, where: str = "flag --congestion-control", dry_run: bool = False) -> None:
    """Before a sweep on this machine: refuse a congestion control the kernel does not have
    (after trying to load its module; a dry run loads nothing and takes a module on disk as
    loadable), naming `where`; nothing is applied."""
    if name and name != "host":  # 'host': nothing is set
        from netbench.testbed.congestion import check_available, check_planned

        (check_planned if dry_run else check_available)(name, where)


def precision_note(job) -> str:
    """" at least, until ±P % (at most S s)" for a job with a precision; "" without."""
    if not job.precision:
        return ""
    return f" at least, until ±{job.precision * 100:g} % (95 %, at most {job.max_seconds:g} s)"
