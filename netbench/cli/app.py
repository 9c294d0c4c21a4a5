"""netbench's command line: the click group and where each command is registered.

Each command lives in a thin module beside this one (parse flags, make one library call,
render with cli/render.py); cli/common.py translates library errors into exit statuses.

    testbed.py     testbed up|down|show, exec
    emulation.py   profile check, apply, show, verify, reset, doctor
    experiment.py  sweep, run
    report.py      report
    node.py        node ... (run on a host by the controller, over SSH)
    provision.py   provision
"""

from __future__ import annotations

import click

from netbench import __version__
from netbench.cli import emulation, experiment, node, provision, report, testbed


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netbench")
def main() -> None:
    """Emulate slow, lossy or distant networks between nodes and measure how
    distributed TensorFlow training throughput responds.

    \b
    Typical use:
      netbench sweep --latency 1,10,100ms     # a latency sweep on the embedded testbed
      netbench reset                          # remove everything netbench made
    """


COMMANDS = (
    emulation.profile,
    testbed.testbed,
    testbed.exec_,
    emulation.apply_,
    emulation.show,
    emulation.verify_cmd,
    emulation.doctor_cmd,
    emulation.reset_cmd,
    experiment.sweep,
    experiment.run_playbook,
    report.report_cmd,
    node.node,
    provision.provision,
)
for command in COMMANDS:
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main()
