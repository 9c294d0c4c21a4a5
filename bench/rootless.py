"""Without root against root: the same sweep, side by side, alternating.

For ``--rounds`` rounds, runs ``netbench sweep --latency 1,10,100ms`` (short windows unless
``--full``) as root on its default testbed and as an ordinary user the script makes (and
removes), in a sandbox of the user's own, one after the other, the order alternating each round.
Both use Debian's /usr/bin/python3 with this checkout's packages (the user cannot read a Python
under /root), the userspace backend on this kernel, and the same congestion control: the
default (cubic where the host allows it, which a root sweep widens the allowed list for; a user
cannot, and keeps the host's default otherwise: said in the output), or ``--congestion-control``.
Reports images/sec per point: each mode's mean over rounds and rootless/root per round.

    flock /tmp/netbench-bed.lock .venv/bin/python bench/rootless.py [--rounds 2] [--congestion-control bbr]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "/usr/bin/python3"
LEVELS = ("1.0", "10.0", "100.0")


def sweep_argv(out: Path, full: bool, congestion: str | None) -> list[str]:
    argv = ["sweep", "--latency", "1,10,100ms", "--output", str(out), "--order-seed", "7"]
    if not full:
        argv += ["--warmup", "5", "--steps", "30", "--precision", "off", "--no-predict"]
    if congestion:
        argv += ["--congestion-control", congestion]
    return argv


def run(top: Path, user: pwd.struct_passwd | None, args: list[str]) -> tuple[float, str]:
    """netbench ARGS as `user` (None: root) in a mount namespace where the checkout is readable."""
    relative = Path(sysconfig.get_paths()["purelib"]).relative_to(ROOT)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": f"{top / 'repo'}:{top / 'repo' / relative}",
           "HOME": user.pw_dir if user else "/root", "LANG": "C.UTF-8"}
    drop = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"] if user else []
    import shlex

    inner = " ".join(["mount", "--bind", str(ROOT), str(top / "repo"), "&&", "cd", str(top / "work"), "&&", "exec",
                      *drop, "env", "-i", *[f"{k}={v}" for k, v in env.items()], PYTHON, "-m", "netbench.cli",
                      *map(shlex.quote, args)])
    began = time.monotonic()
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{'rootless' if user else 'root'} sweep failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return time.monotonic() - began, result.stdout


def speeds(folder: Path) -> dict[str, float]:
    with open(folder / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert all(r["status"] == "ok" for r in rows), rows
    return {r["delay_ms"]: float(r["images_per_sec"]) for r in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="the demo's own windows (precision 3 %%, predictions)")
    parser.add_argument("--congestion-control")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: it makes a user, and sweeps as root beside it")
    name = f"nbbench{os.getpid() % 100000}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
    top = Path(tempfile.mkdtemp(prefix="netbench-rootless-bench-"))
    table: dict[str, list] = {"root": [], "rootless": []}
    lines: dict[str, str] = {}
    try:
        user = pwd.getpwnam(name)
        os.chmod(top, 0o755)
        (top / "repo").mkdir()
        (top / "work").mkdir()
        shutil.chown(top / "work", user.pw_uid, user.pw_gid)
        for round_ in range(args.rounds):
            order = ("root", "rootless") if round_ % 2 == 0 else ("rootless", "root")
            for mode in order:
                out = top / "work" / f"{mode}-{round_}"
                seconds, stdout = run(top, user if mode == "rootless" else None,
                                      sweep_argv(out, args.full, args.congestion_control))
                lines[mode] = next((ln for ln in stdout.splitlines() if ln.startswith("TCP congestion")), "")
                table[mode].append(speeds(out))
                print(f"round {round_} {mode}: {seconds:.0f} s, images/sec "
                      + ", ".join(f"{d} ms {table[mode][-1][d]:,.0f}" for d in LEVELS), flush=True)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        time.sleep(1)
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)
    print()
    for mode, line in lines.items():
        print(f"{mode}: {line}")
    print(f"{'one-way delay':>14} {'root img/s':>11} {'rootless':>9} {'rootless/root per round':>26}")
    summary = {}
    for level in LEVELS:
        root = [r[level] for r in table["root"]]
        rootless = [r[level] for r in table["rootless"]]
        ratios = [b / a for a, b in zip(root, rootless)]
        summary[level] = {"root": root, "rootless": rootless, "ratios": ratios}
        print(f"{level:>11} ms {statistics.mean(root):>11,.0f} {statistics.mean(rootless):>9,.0f} "
              f"{'  '.join(f'{r:.3f}' for r in ratios):>26}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
