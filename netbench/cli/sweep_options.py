"""The sweep's own option sets (cli/option_sets.py has those it shares with run and collective):
the nodes' compute, the job it trains, and each run's window. Each is declared once, in its help
section, and handed to `sweep` as one frozen dataclass (cli/groups.py's option_set)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import click

from netbench.cli.algorithm_options import ALGORITHMS, ALGORITHMS_HELP
from netbench.cli.framework import framework_option
from netbench.cli.groups import option_set
from netbench.cli.types import Seconds
from netbench.errors import UsageError

MODELS = ("mlp", "cnn", "resnet18", "mobilenetv2", "resnet50", "efficientnetb0", "vgg16")


@dataclass(frozen=True)
class Compute:
    """--cpus and --step-delay (each repeatable, [NODE=]LIST as given): the nodes' capacity levels."""

    cpus_flags: tuple[str, ...]
    step_delay_flags: tuple[str, ...]

    @property
    def given(self) -> bool:
        return bool(self.cpus_flags or self.step_delay_flags)

    def points(self, inventory) -> tuple:
        """--cpus and --step-delay crossed (model/compute.py); a limit above this machine's cores is
        refused for the embedded testbed (a host's agent checks its own)."""
        from netbench.model import compute

        from netbench.model.run import check_size

        factors = compute.parse_flag(self.cpus_flags, "cpus", "--cpus") + \
            compute.parse_flag(self.step_delay_flags, "step_delay", "--step-delay")
        check_size((math.prod(len(f.levels) for f in factors),), 1, "flags --cpus and --step-delay")
        points = compute.compute_points(factors)
        if inventory is None and self.cpus_flags:
            from netbench.emulation.cgroups import cores

            for point in points:
                compute.check_cores(point, cores(), "flag --cpus")
        return points

    def check_placed(self, nodes: int) -> None:
        """A level for a node outside n1..n<nodes> (the nodes the job's processes are on) is refused."""
        from netbench.model import compute

        for flag, values, kind in (("--cpus", self.cpus_flags, "cpus"), ("--step-delay", self.step_delay_flags,
                                                                         "step_delay")):
            for factor in compute.parse_flag(values, kind, flag):
                if compute.holds_none(factor.node, nodes):
                    message, hint = compute.holds_none_text(factor.node, nodes)
                    raise UsageError(f"flag {flag}: {message}", hint=hint)

    def refuse_with_topology(self) -> None:
        """A topology file gives the nodes' capacity itself (its compute:)."""
        if self.given:
            raise UsageError(f"flag {'--cpus' if self.cpus_flags else '--step-delay'}: not with --topology",
                             hint="give the nodes' capacity in the topology file: compute: {n2: {cpus: 0.5}}")


compute_options = option_set(
    Compute, "compute", "Nodes and compute",
    click.option("--cpus", "cpus_flags", multiple=True, metavar="[NODE=]LIST",
                 help="CPU limits to sweep for a node, in CPUs as docker --cpus (max: none), e.g. n2=1,0.5,0.25; "
                      "without NODE, every node. Repeatable, one node each; crossed with the other factors."),
    click.option("--step-delay", "step_delay_flags", multiple=True, metavar="[NODE=]LIST",
                 help="Compute time added to each step of a node's ranks, e.g. n2=0,40ms. Repeatable."),
)


@dataclass(frozen=True)
class Training:
    """What the sweep's job trains, and how: strategy, framework, model, data and batches."""

    strategy: str
    framework: str
    model: str
    data: str
    input_shape: str | None
    classes: int | None
    batch_size: int
    accum_steps: int
    ps_count: int


training_options = option_set(
    Training, "training", "Job",
    click.option("--strategy", default="allreduce", show_default=True,
                 type=click.Choice(["allreduce", "allreduce-accum", "ps", "single", *ALGORITHMS]),
                 help="allreduce: all-reduce every step; allreduce-accum: every --accum-steps batches; "
                      "ps: parameter servers and a coordinator (asynchronous); single: one process, no network; "
                      f"{ALGORITHMS_HELP}"),
    framework_option,
    click.option("--model", default="mlp", show_default=True, type=click.Choice(MODELS),
                 help="Model to train (Keras applications with random weights; nothing is downloaded)."),
    click.option("--data", default="synthetic", show_default=True, metavar="SOURCE",
                 help="synthetic (in memory), an .npz with x_train/y_train, or a folder of class folders of images."),
    click.option("--input-shape", metavar="SHAPE",
                 help="Per-example input shape, e.g. 32x32x3 [default: the model's or the data's]."),
    click.option("--classes", type=click.IntRange(2, 100000), help="Output classes [default: 10, or the data's]."),
    click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1, 65536),
                 help="Per-worker batch size."),
    click.option("--accum-steps", default=4, show_default=True, type=click.IntRange(1, 10000),
                 help="Local batches per all-reduce with --strategy allreduce-accum."),
    click.option("--ps", "ps_count", default=1, show_default=True, type=click.IntRange(1, 16),
                 help="Parameter servers with --strategy ps (each on its own node, plus one for the coordinator)."),
)


@dataclass(frozen=True)
class Window:
    """Each run's window (--warmup, --steps or --seconds), its repetitions and its timeouts."""

    warmup: int
    steps: int | None
    seconds: float | None
    repeat: int
    step_timeout: float
    startup_timeout: float

    def check(self) -> None:
        if self.seconds and self.warmup < 1:
            raise UsageError("flag --seconds needs --warmup of at least 1: workers agree on the step count "
                             "from the warm-up step times", hint="e.g. --seconds 30 --warmup 10")

    def timeouts(self):
        from netbench.jobs.launch import Timeouts

        return Timeouts(startup_s=self.startup_timeout, step_s=self.step_timeout)


window_options = option_set(
    Window, "window", "Measurement and precision",
    click.option("--warmup", default=10, show_default=True, type=click.IntRange(0, 100000),
                 help="Warm-up steps, excluded from statistics (seconds for a COMMAND that reports no steps)."),
    click.option("--steps", type=click.IntRange(2, 1000000),
                 help="Measured steps per run; with --precision the least window, past which it goes on until the "
                      "precision [default: 30; with --precision 32: 8 batch means of 4 steps, docs/guide/sweeps.md]."),
    click.option("--seconds", type=Seconds(0.1, 86400),
                 help="Measured window in seconds instead of --steps (all workers agree on the step count after "
                      "warm-up); a COMMAND that reports no steps: its window of bytes [default: 10]."),
    click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 1000),
                 help="Repetitions of each point."),
    click.option("--step-timeout", default=60.0, show_default=True, type=Seconds(1, 86400),
                 help="Seconds a step may take before the run ends as 'timeout'."),
    click.option("--startup-timeout", default=240.0, show_default=True, type=Seconds(1, 86400),
                 help="Seconds until the first step."),
)
