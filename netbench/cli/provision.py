"""`netbench provision --inventory FILE`: install this controller's netbench on every host."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import click
from rich.markup import escape

from netbench import console
from netbench.cli.common import INSECURE_HELP, handle_errors
from netbench.errors import NetbenchError, UsageError


@click.command("provision", short_help="Install this netbench on the SSH hosts of an inventory.")
@click.option("--inventory", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The SSH hosts to install on (an inventory, YAML).")
@click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP)
@click.option("--wheel", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Install this wheel [default: build one from this netbench's source].")
@click.option("--pip-args", default="", help="Extra arguments for pip on the hosts, e.g. '--no-index --find-links /srv'.")
def provision(inventory: Path, insecure_host_keys: bool, wheel: Path | None, pip_args: str) -> None:
    """Install this controller's netbench on every host: build a wheel, copy it, and install
    it into each host's venv (inventory key 'venv', created if missing).

    \b
    Example: netbench provision --inventory hosts.yaml
    """
    try:
        pip_words = shlex.split(pip_args)
    except ValueError as exc:
        raise click.BadParameter(f"cannot split {pip_args!r}: {exc}", param_hint="'--pip-args'") from None
    handle_errors(_provision)(inventory, insecure_host_keys, wheel, pip_words)


def build_wheel(out_dir: Path) -> Path:
    """A wheel of the netbench this controller runs (its source tree, no dependencies)."""
    source = Path(__file__).resolve().parents[2]
    if not (source / "setup.cfg").exists():
        raise UsageError("this netbench was not installed from a source tree: cannot build a wheel",
                         hint="pass --wheel PATH")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(out_dir), str(source)], capture_output=True, text=True)
    wheels = sorted(out_dir.glob("netbench-*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise NetbenchError(f"building the netbench wheel failed: {detail[-1] if detail else result.returncode}")
    return wheels[-1]


def _provision(inventory_path: Path, insecure: bool, wheel: Path | None, pip_words: list[str]) -> None:
    from netbench.remote import controller as remote

    inv, conns = remote.open_inventory(inventory_path, insecure)
    by_name = {h.name: h for h in inv.hosts}
    q = shlex.quote
    with tempfile.TemporaryDirectory(prefix="netbench-wheel-") as tmp:
        wheel = wheel or build_wheel(Path(tmp))
        constraints = Path(__file__).resolve().parents[2] / "constraints.txt"

        def install(conn) -> str:
            host = by_name[conn.name]
            sudo = "sudo -n " if host.sudo else ""
            stage = private_stage(conn)  # root installs from it: nobody else may swap the wheel
            try:
                staged = f"{stage}/{wheel.name}"
                conn.put(wheel, staged)
                cflag = ""
                if constraints.exists():
                    conn.put(constraints, f"{stage}/constraints.txt")
                    cflag = f" -c {q(stage + '/constraints.txt')}"
                venv = host.venv
                make_venv = f"test -x {q(venv + '/bin/python')} || python3 -m venv {q(venv)}"
                run_checked(conn, f"{sudo}sh -c {q(make_venv)}")
                run_checked(conn, f"{sudo}{q(venv + '/bin/pip')} install -q --disable-pip-version-check{cflag} "
                                  + "".join(f"{q(word)} " for word in pip_words) + q(staged), timeout=600)
                return run_checked(conn, f"{q(venv + '/bin/netbench')} --version").strip()
            finally:
                with contextlib.suppress(NetbenchError):  # best effort: the error that matters is above
                    conn.run(f"rm -rf -- {q(stage)}", timeout=120)

        try:
            results = remote.in_parallel(conns, install)
        finally:
            remote.close_all(conns)
    for name, result in results.items():
        if isinstance(result, Exception):
            console.error(result.message, getattr(result, "hint", None))
        else:
            console.info(f"{name}: [green]installed[/] {escape(str(result))} in {escape(by_name[name].venv)}")
    if any(isinstance(r, Exception) for r in results.values()):
        sys.exit(1)


def private_stage(conn) -> str:
    """A fresh staging folder on the host (mktemp -d), checked to be a directory owned by
    the SSH user with mode 700, so no other local user can change what is installed."""
    from netbench.remote.controller import RemoteError

    stage = run_checked(conn, 'mktemp -d "${TMPDIR:-/tmp}/netbench-provision.XXXXXXXXXX"').strip()
    if not stage.startswith("/") or "\n" in stage:
        raise RemoteError(f"host {conn.name}: mktemp -d printed {stage!r}, not a folder")
    facts = run_checked(conn, f"stat -c '%u %a %F' -- {shlex.quote(stage)} && id -u").split("\n")
    owner, mode, kind = (facts[0].split(" ", 2) + ["", "", ""])[:3]
    me = facts[1].strip() if len(facts) > 1 else "?"
    if (owner, mode, kind) != (me, "700", "directory"):
        raise RemoteError(f"host {conn.name}: staging folder {stage} is not private: {kind or '?'} owned by uid "
                          f"{owner or '?'}, mode {mode or '?'} (expected a directory owned by uid {me}, mode 700)",
                          hint="check the host's TMPDIR and /tmp")
    return stage


def run_checked(conn, command: str, timeout: float = 120.0) -> str:
    from netbench.remote.controller import RemoteError

    result = conn.run(command, timeout=timeout)
    if not result.ok:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise RemoteError(f"host {conn.name}: {command.split()[0]} failed: {lines[-1] if lines else result.exit_code}")
    return result.stdout
