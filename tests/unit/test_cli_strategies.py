"""netbench sweep's training-mode flags: placement in --dry-run, one-line errors naming the flag."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from netbench.cli.app import main


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_dry_run_shows_ps_placement():
    result = invoke("sweep", "--dry-run", "--strategy", "ps", "--ps", "1", "--workers", "3", "--latency", "10ms")
    assert result.exit_code == 0, result.output
    assert "strategy ps, 3 workers" in result.output
    assert "placement on 5 nodes" in result.output
    for line in ("worker2 on n3", "ps0 on n4", "coordinator0 on n5"):
        assert line in result.output


def test_dry_run_accum_and_single():
    accum = invoke("sweep", "--dry-run", "--strategy", "allreduce-accum", "--accum-steps", "8")
    assert "(8 batches per all-reduce)" in accum.output and "worker1 on n2" in accum.output
    single = invoke("sweep", "--dry-run", "--strategy", "single", "--model", "resnet18")
    assert "placement on 1 nodes" in single.output and "worker1" not in single.output


@pytest.mark.parametrize("args, flag", [
    (("--strategy", "single", "--workers", "3"), "--workers"),
    (("--input-shape", "32xx"), "--input-shape"),
    (("--model", "vgg16", "--input-shape", "16x16x3"), "--input-shape"),
    (("--model", "cnn", "--input-shape", "784"), "--input-shape"),
    (("--data", "/nonexistent/data.npz"), "--data"),
])
def test_bad_flags_name_themselves(args, flag):
    result = invoke("sweep", "--dry-run", *args)
    assert result.exit_code != 0
    first = result.output.strip().splitlines()[0]
    assert first.startswith("error:") and flag in first, result.output
