"""Without root on a stock kernel: once root has loaded sch_netem (the netem_kernel fixture's
probe did), a user's sandbox shapes with netem. The user is `nobody`, who needs no passwd
entry of the test's own (the VM's /etc is the host's, read-only), with a runtime folder the test
makes; the job is examples/plain_steps.py (no TensorFlow: it would take minutes to import under
software emulation)."""

from __future__ import annotations

import csv
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"


def test_a_users_sweep_on_a_netem_kernel_shapes_with_netem(netem_kernel):
    if not Path(PYTHON).exists():
        pytest.skip(f"{PYTHON} is not installed")
    assert Path("/sys/module/sch_netem").exists()  # loaded by root; a user could not load it
    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="netbench-rootless-k-"))
    try:
        os.chmod(top, 0o755)
        for name in ("repo", "work", "run"):
            (top / name).mkdir()
        for name in ("work", "run"):
            shutil.chown(top / name, nobody.pw_uid, nobody.pw_gid)
        relative = Path(sysconfig.get_paths()["purelib"]).relative_to(ROOT)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": f"{top / 'repo'}:{top / 'repo' / relative}",
               "HOME": str(top / "work"), "XDG_RUNTIME_DIR": str(top / "run"), "NETBENCH_PRECISION": "off",
               "NETBENCH_PREDICT": "0"}
        sweep = ["sweep", "--latency", "10ms", "--workers", "2", "--warmup", "2", "--steps", "6",
                 "--images-per-step", "64", "--step-regex", r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms",
                 "--output", str(top / "work" / "out"), "--", PYTHON, str(top / "repo" / "examples" / "plain_steps.py"),
                 "--kib", "64"]
        inner = " ".join(["mount", "--bind", str(ROOT), str(top / "repo"), "&&", "cd", str(top / "work"), "&&",
                          "exec", "setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                          "env", "-i", *[f"{k}={v}" for k, v in env.items()], PYTHON, "-m", "netbench.cli",
                          *[_quote(a) for a in sweep]])
        result = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner],
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        with open(top / "work" / "out" / "results.csv", newline="") as fh:
            (row,) = list(csv.DictReader(fh))
        assert (row["status"], row["backend"], row["privilege"]) == ("ok", "netem", "rootless"), row
        assert float(row["step_time_mean_s"]) > 0.02  # a round trip of 2 x 10 ms every step
        assert not list((top / "run" / "netbench" / "testbeds").glob("*"))
    finally:
        subprocess.run(["pkill", "-KILL", "-u", "nobody", "-f", "netbench"], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(str(arg))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
