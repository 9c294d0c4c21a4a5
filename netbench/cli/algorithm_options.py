"""The sweep's flags of the training algorithms and of accuracy runs, as one typed option set:
the command receives them as ``algorithm``, an Algorithm (JobSpec fields of the same names)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import click
from click.core import ParameterSource

from netbench.cli.groups import option_set
from netbench.cli.types import FiniteFloatRange
from netbench.errors import UsageError

# the exchange strategies (model.job.EXCHANGE_STRATEGIES; the CLI keeps its literal, as for --order)
ALGORITHMS = ("ps-sync", "ps-async", "ps-ssp", "easgd", "gosgd", "adpsgd")
ALGORITHMS_HELP = ("ps-sync (BSP, --backup-workers), ps-async (ASP over the same protocol; --pipeline), ps-ssp (--staleness), "
                   "easgd (--tau, --elastic-alpha): parameter servers (--ps) "
                   "without a coordinator; gosgd (--gossip-p), adpsgd: workers and their peers only.")
@dataclass(frozen=True)
class Algorithm:
    """The training algorithms' settings and an accuracy run's: JobSpec fields of the same names."""

    staleness: int
    tau: int
    elastic_alpha: float | None
    gossip_p: float
    backup_workers: int
    pipeline: int
    train_steps: int | None
    eval_every: int
    target_accuracy: float | None

    def job_fields(self) -> dict:
        """JobSpec's fields (keyword arguments) these settings set."""
        return asdict(self)


def _refuse(algorithm: Algorithm) -> None:
    ctx = click.get_current_context(silent=True)
    _refuse_unused(ctx.params.get("strategy") if ctx is not None else None, algorithm.job_fields())


# --staleness, --tau, --elastic-alpha, --gossip-p, --backup-workers, --pipeline, --train-steps,
# --eval-every, --target-accuracy: the command receives them as `algorithm`, an Algorithm
algorithm_options = option_set(
    Algorithm, "algorithm", "Algorithm and accuracy",
    click.option("--staleness", default=3, show_default=True, type=click.IntRange(0, 10000),
                 help="ps-ssp: steps a worker may run ahead of the slowest (pushes it leaves unanswered while it computes on the weights it has)."),
    click.option("--tau", default=4, show_default=True, type=click.IntRange(1, 100000),
                 help="easgd: local steps between elastic exchanges with the centre variable."),
    click.option("--elastic-alpha", type=FiniteFloatRange(1e-6, 1.0),
                 help="easgd: moving rate [default: 0.9 / workers, the EASGD paper's beta = 0.9]."),
    click.option("--gossip-p", default=0.1, show_default=True, type=FiniteFloatRange(0.0, 1.0),
                 help="gosgd: probability of a push to a random peer after each step."),
    click.option("--backup-workers", default=0, show_default=True, type=click.IntRange(0, 63),
                 help="ps-sync: each round applies the first workers - B gradients and drops the late ones "
                      "(Chen et al. 2016's backup workers); fewer than the workers."),
    click.option("--pipeline", default=0, show_default=True, type=click.IntRange(0, 10000),
                 help="ps-async: pushes a worker leaves unanswered while it computes; 0 waits for each "
                      "push's reply (the ASP of the studies), e.g. 16 pipelines them (hides the round trip)."),
    click.option("--train-steps", type=click.IntRange(2, 10000000),
                 help="An accuracy run: each point trains a fresh model for this many steps in all "
                      "(warm-up included), in a launch of its own, and reports its test accuracy."),
    click.option("--eval-every", default=0, show_default=True, type=click.IntRange(0, 10000000),
                 help="Evaluate held-out accuracy every K steps (outside the timed steps); 0: after "
                      "the last step only (with --train-steps)."),
    click.option("--target-accuracy", type=FiniteFloatRange(0.01, 1.0),
                 help="Record the steps and training time until this held-out accuracy was first reached."),
    check=_refuse,
)
_FIELDS = tuple(field.name for field in fields(Algorithm))


def _refuse_unused(strategy: str | None, values: dict) -> None:
    """A setting given on the command line that the strategy does not use is refused, naming its
    flag: `--strategy allreduce --staleness 5` would otherwise measure allreduce and record nothing
    of the 5. --target-accuracy needs an evaluation (--train-steps or --eval-every)."""
    from netbench.model.job import ALGORITHM_SETTINGS

    ctx = click.get_current_context(silent=True)
    if ctx is None or strategy is None:
        return
    given = {name for name in _FIELDS
             if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    for name in _FIELDS:
        users = [owner for owner, keys in ALGORITHM_SETTINGS.items() if name in keys]
        if name in given and users and strategy not in users:
            raise click.UsageError(f"flag --{name.replace('_', '-')}: strategy {strategy} does not use it "
                                   f"(only {', '.join(users)} does)")
    if "target_accuracy" in given and not values.get("train_steps") and not values.get("eval_every"):
        raise click.UsageError("flag --target-accuracy: nothing evaluates the accuracy without --train-steps "
                               "or --eval-every")


def finish_job(job, workers: int):
    # accuracy runs (train_steps) train a fresh model each, so a launch of their own (runner.split_runs)
    """The sweep's JobSpec once its algorithm and accuracy settings are checked (one out of range
    is named by its flag); with --train-steps its measured steps are the steps after warm-up."""
    from netbench.model.job import check_algorithm

    try:
        check_algorithm(job, workers)
    except ValueError as exc:
        key, _, rest = str(exc).partition(": ")
        raise UsageError(f"flag --{key.replace('_', '-')}: {rest}") from None
    return replace(job, steps=job.train_steps - job.warmup) if job.train_steps else job
