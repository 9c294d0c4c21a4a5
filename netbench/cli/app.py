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

# command name -> "module:attribute" (in netbench.cli), in the order --help lists them; a
# command's module is imported only when that command runs (or --help lists them all), so
# a quick command such as `netbench apply` does not load the sweep's or the report's code
COMMANDS = {
    "profile": "emulation:profile",
    "testbed": "testbed:testbed",
    "exec": "testbed:exec_",
    "apply": "emulation:apply_",
    "show": "emulation:show",
    "verify": "emulation:verify_cmd",
    "doctor": "emulation:doctor_cmd",
    "reset": "emulation:reset_cmd",
    "sweep": "experiment:sweep",
    "run": "playbook:run_playbook",
    "submit": "campaign:submit",
    "status": "campaign:status",
    "collective": "collective:collective",
    "report": "report:report_cmd",
    "node": "node:node",
    "provision": "provision:provision",
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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netbench")
def main() -> None:
    """Emulate slow, lossy or distant networks between nodes and measure how
    distributed TensorFlow training throughput responds.

    \b
    Typical use:
      netbench sweep --latency 1,10,100ms     # a latency sweep on the embedded testbed
      netbench reset                          # remove everything netbench recorded
    """


if __name__ == "__main__":  # pragma: no cover
    main()
