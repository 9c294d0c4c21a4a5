"""A real worker samples its own resources (tier tf)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netbench.jobs.resources import summarise


@pytest.mark.tf
def test_a_real_worker_samples_itself_before_it_is_done(tmp_path):
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.run([sys.executable, "-m", "netbench.jobs.worker", "--strategy", "single", "--warmup", "1",
                               "--steps", "3", "--batch-size", "16", "--sample-resources", "0.2"],
                              stdout=subprocess.PIPE, stderr=err, text=True, timeout=180,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, Path(tmp_path / "err").read_text()[-2000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "done" and kinds[-2] == "resources"  # the last sample precedes done
    samples = [e for e in events if e["event"] == "resources"]
    assert len(samples) >= 2
    (usage,) = summarise(samples)
    assert usage.cpu_util is not None and usage.cpu_util > 0.05  # TensorFlow was busy
    assert usage.rss_peak_bytes > 100 * 1024 * 1024  # TensorFlow is loaded
