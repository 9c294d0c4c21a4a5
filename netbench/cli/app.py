"""netbench's command line: the click group and where each command is registered.

Each command lives in a thin module beside this one (parse flags, make one library call,
render with cli/render.py); cli/common.py translates library errors into exit statuses.

    testbed.py     testbed up|down|show, exec
    emulation.py   profile check, apply, show, verify, reset, doctor
    experiment.py  sweep; playbook.py: run
    campaign.py    submit, status (a design's shards on a cluster)
    report.py      report
    node.py        node ... (run on a host by the controller, over SSH)
    provision.py   provision
"""

from __future__ import annotations

import importlib

import click

from netbench import __version__

# --help's sections, in the order a user meets the commands: the first four are a whole first
# experiment (what this host can do, a sweep, its report, the network put back); then designs,
# shaping by hand, and other machines. Each command's one-line summary is its `short_help`, which
# fits --help's 80 columns whole (tests/unit/test_cli.py)
SECTIONS = {
    "Start here": ("doctor", "sweep", "report", "reset"),
    "Experiments": ("run", "submit", "status", "collective"),
    "Shaping by hand": ("testbed", "exec", "profile", "apply", "show", "verify"),
    "Remote hosts": ("provision",),
}

# command name -> "module:attribute" (in netbench.cli), in --help's order; a command's module is
# imported only when that command runs (or --help lists them all), so a quick command such as
# `netbench apply` does not load the sweep's or the report's code. `node` is what the controller
# runs on a host over SSH (hidden: --help leaves it out)
COMMANDS = {
    "doctor": "emulation:doctor_cmd",
    "sweep": "experiment:sweep",
    "report": "report:report_cmd",
    "reset": "emulation:reset_cmd",
    "run": "playbook:run_playbook",
    "submit": "campaign:submit",
    "status": "campaign:status",
    "collective": "collective:collective",
    "testbed": "testbed:testbed",
    "exec": "testbed:exec_",
    "profile": "emulation:profile",
    "apply": "emulation:apply_",
    "show": "emulation:show",
    "verify": "emulation:verify_cmd",
    "provision": "provision:provision",
    "node": "node:node",
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attribute = target.split(":")
        return getattr(importlib.import_module(f"netbench.cli.{module}"), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in SECTIONS' sections and order, each with its whole summary."""
        listed = {name: self.get_command(ctx, name) for name in self.list_commands(ctx)}
        shown = {name: command for name, command in listed.items() if command is not None and not command.hidden}
        if not shown:
            return
        width = max(len(name) for name in shown)
        limit = formatter.width - 6 - width
        for section, names in SECTIONS.items():  # one column for the names of every section
            rows = [(name.ljust(width), shown[name].get_short_help_str(limit)) for name in names if name in shown]
            if rows:
                with formatter.section(section):
                    formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netbench")
def main() -> None:
    """Emulate slow, lossy or distant networks between nodes and measure how
    distributed training throughput responds: TensorFlow, PyTorch or your own command.

    \b
    A first experiment, in the order of the commands below:
      netbench doctor                    # what this host can do
      netbench sweep --latency 1,10,100ms --output results/first
      netbench report results/first      # tables and figures
      netbench reset                     # remove what netbench made
    """


if __name__ == "__main__":  # pragma: no cover
    main()
