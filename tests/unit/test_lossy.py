"""Lossy points under a precision: the estimate counts them at their cap, and the dry run and
the sweep's first lines say why beforehand."""

from __future__ import annotations

from dataclasses import replace

from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.experiment import lossy
from netbench.experiment.estimate import Costs, estimate_design
from netbench.experiment.launch import Settle
from netbench.model.job import JobSpec
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import Profile
from netbench.model.run import Run

COSTS = Costs(s_per_sample={"mlp": 0.001}, step_overhead_s={}, startup_s={"mlp": 4.0}, cluster_round_trips=0,
              sync_overhead_s=0.0, point_overhead_s=0.5, stop_s=1.0, cores=64, model_bytes={"mlp": 1_000_000},
              step_cv=0.01)  # so steady a clean point reaches 2 % in its least window


def run(index: int, loss: float, precision: float | None = 0.02, **job) -> Run:
    spec = JobSpec(model="mlp", warmup=2, steps=30, precision=precision, max_seconds=20.0, **job)
    return Run(index=index, profile=Profile(name=f"p{index}", delay_us=1000, loss=loss), repeat=0, job=spec, workers=2)


def test_a_point_with_loss_and_a_precision_is_expected_at_its_cap():
    assert lossy.expected_at_cap(run(0, 0.01))
    assert not lossy.expected_at_cap(run(0, 0.0))
    assert not lossy.expected_at_cap(run(0, 0.01, precision=None))  # exact --steps: no cap to run to
    assert not lossy.expected_at_cap(run(0, 0.01, train_steps=100))  # an accuracy run trains its steps
    pairs = PairTopology(name="t", nodes=("n1", "n2"),
                         links=(PairLink("n1", "n2", Profile(name="a", loss=0.02)),))
    assert lossy.expected_at_cap(replace(run(0, 0.0), pairs=pairs)) and lossy.loss_of(replace(run(0, 0.0), pairs=pairs)) == 0.02


def test_the_estimate_puts_lossy_points_at_the_cap_and_says_why():
    clean, lossy_run = run(0, 0.0), run(1, 0.01)
    alone = estimate_design([clean], True, Settle(), COSTS)
    both = estimate_design([clean, lossy_run], True, Settle(), COSTS)
    assert alone.capped == 0 and both.capped == 1
    assert both.launches[1].measured_s == 20.0 and alone.launches[0].measured_s < 5.0
    line = lossy.note([clean, lossy_run])
    assert line.startswith("1 point(s) with loss (1 %) will likely measure until --max-seconds (20 s each)")
    assert "retransmission timeouts" in line
    assert lossy.note([clean]) is None


def test_the_dry_run_says_lossy_points_will_run_to_the_cap(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(cli.main, ["sweep", "--dry-run", "--latency", "1ms", "--loss", "0,1%",
                                        "--precision", "2%"])
    assert out.exit_code == 0, out.output
    assert "1 point(s) with loss (1 %) will likely measure until --max-seconds" in " ".join(out.output.split())
    clean = CliRunner().invoke(cli.main, ["sweep", "--dry-run", "--latency", "1ms", "--precision", "2%"])
    assert "will likely measure until" not in clean.output
