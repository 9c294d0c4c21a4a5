"""A user's command that knows nothing of netbench, on real namespaces (root): its steps read
from its output lines, its node's own hostname, a job that reports no steps measured in bytes
on its links, and what `netbench reset` finds after the controller is killed with SIGKILL."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netbench.testbed import netns as local
from tests.conftest import NETBENCH, ROOT, cli_ok

pytestmark = pytest.mark.root

REGEX = r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms"


def processes_running(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_a_plain_job_is_read_by_its_lines_on_nodes_named_after_themselves(clean_machine, tmp_path):
    job = tmp_path / "job.sh"
    job.write_text('echo "node $(hostname) $NETBENCH_ADDRESS $(getent hosts $(hostname))" >&2\n'
                   f'exec {sys.executable} {ROOT}/examples/plain_steps.py --kib 64\n')
    host_name = socket.gethostname()
    out = tmp_path / "out"
    result = subprocess.run([*NETBENCH, "sweep", "--latency", "1,20ms", "--workers", "2", "--warmup", "2",
                             "--steps", "6", "--images-per-step", "64", "--step-regex", REGEX,
                             "--output", str(out), "--", "sh", str(job)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "results.csv", newline="")))
    assert all(r["status"] == "ok" and r["source"] == "regex" and r["steps"] == "6" for r in rows), rows
    speed = {r["delay_ms"]: float(r["images_per_sec"]) for r in rows}
    assert speed["20.0"] < speed["1.0"], speed
    said = [line for log in sorted(out.glob("logs/*/n*-worker*.log")) for line in log.read_text().splitlines()
            if line.startswith("node ")]
    assert len(said) == 4, said  # two launches (the job never asks to stop) of two ranks
    for line in said:
        _, name, address, resolved, resolved_name = line.split()
        assert name.startswith("netbench-n") and resolved == address and resolved_name == name
    ranks = json.loads(next(out.glob("logs/*/ranks.json")).read_text())
    assert ranks[0]["ended"] == "stopped"  # its peer may end by itself once rank 0 is gone
    assert socket.gethostname() == host_name and processes_running(str(job)) == []
    assert local.list_netbench_netns() == []


def test_a_job_that_reports_no_steps_is_measured_in_bytes_on_its_links(clean_machine, tmp_path):
    out, job = tmp_path / "out", f"{ROOT}/examples/ring_bytes.py"
    result = subprocess.run([*NETBENCH, "sweep", "--bandwidth", "1gbit,20mbit", "--workers", "2", "--warmup", "1",
                             "--seconds", "2", "--output", str(out), "--", "python", job],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "measured in bytes, not steps" in result.stdout  # the terminal says what it measured
    rows = list(csv.DictReader(open(out / "results.csv", newline="")))
    assert [(r["status"], r["source"], r["images_per_sec"], r["step_time_mean_s"]) for r in rows] == \
        [("ok", "bytes", "", "")] * 2, rows
    sent = {r["rate_mbit"]: float(r["link_bytes_per_s"]) for r in rows}
    print("link_bytes_per_s by rate_mbit:", sent)  # the figures of the report (pytest -s)
    assert 0 < sent["20.0"] < sent["1000.0"], sent
    assert sent["20.0"] <= 20e6 / 8 * 1.1  # no more than the shaped rate allows
    record = json.loads((out / "runs" / f"{rows[0]['run_id']}.json").read_text())
    assert [n["node"] for n in record["link_bytes"]["nodes"]] == ["n1", "n2"] and record["link_bytes"]["window_s"] >= 2
    assert all(n["tx_bytes"] > 0 and n["rx_bytes"] > 0 for n in record["link_bytes"]["nodes"])
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("logs/launch*/ranks.json"))]
    assert len(ranks) == 2 and all(r["ended"] == "stopped" for launch in ranks for r in launch), ranks  # stopped, each point
    assert processes_running(job) == [] and local.list_netbench_netns() == []


def test_a_users_command_runs_across_a_per_pair_topology(clean_machine, tmp_path):
    """--topology with a COMMAND: ranks on n1 and n2 of two-regions (2 ms one-way), then every
    delay x4; the job's own step (one exchange with rank 0) grows with the pair's delay."""
    out = tmp_path / "out"
    result = subprocess.run([*NETBENCH, "sweep", "--topology", f"{ROOT}/profiles/topologies/two-regions.yaml",
                             "--scale", "1,4", "--workers", "2", "--warmup", "2", "--steps", "6",
                             "--images-per-step", "64", "--step-regex", REGEX, "--output", str(out), "--",
                             sys.executable, f"{ROOT}/examples/plain_steps.py", "--kib", "16"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "results.csv", newline="")))
    assert [(r["status"], r["source"]) for r in rows] == [("ok", "regex")] * 2, rows
    steps = sorted((json.loads((out / "runs" / f"{r['run_id']}.json").read_text()) for r in rows),
                   key=lambda s: s["topology"]["scale"])
    assert [s["topology"]["scale"] for s in steps] == [1.0, 4.0]
    near, far = (s["stats"]["mean_s"] for s in steps)
    assert near > 0.004 and far > near + 0.010, (near, far)  # a round trip of 4 ms, then of 16 ms
    assert local.list_netbench_netns() == []


def test_reset_after_the_controller_is_killed_ends_what_the_job_started(clean_machine, tmp_path):
    job = tmp_path / "launcher.sh"  # a launcher whose child outlives it, as torchrun's workers would
    job.write_text(f"{sys.executable} {ROOT}/examples/plain_steps.py --kib 16 &\nwait\n")
    controller = subprocess.Popen([*NETBENCH, "sweep", "--latency", "1ms", "--workers", "2", "--steps", "100000",
                                   "--images-per-step", "8", "--step-regex", REGEX, "--output", str(tmp_path / "out"),
                                   "--", "sh", str(job)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(processes_running(f"{ROOT}/examples/plain_steps.py --kib 16")) < 2:
            assert time.monotonic() < deadline, "the job's ranks never started"
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
    time.sleep(0.5)
    assert processes_running(f"{ROOT}/examples/plain_steps.py --kib 16")  # the launcher's children outlive it
    result = cli_ok("reset")
    assert "namespace netbench-n1" in result.stdout + result.stderr
    assert processes_running(f"{ROOT}/examples/plain_steps.py --kib 16") == []
    assert local.list_netbench_netns() == []



LOCKSTEP = """
import os, socket, sys, time
from netbench import track

rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server(("", port))
    peer = server.accept()[0]
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            peer = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    with track.step(images=8):  # a 1 ms step, then an exchange both ranks must make: a collective
        time.sleep(0.001)
        peer.sendall(b"x")
        if peer.recv(1) != b"x":
            print("peer gone in the middle of a step", file=sys.stderr, flush=True)
            sys.exit(3)
    if rank == 1:
        time.sleep(0.0008)  # its own work between steps: it asks later in each step than rank 0
    if track.stop_requested():
        break
print(f"stopped after {track._state.steps} steps", file=sys.stderr, flush=True)
"""

# train.sh: note which background sleeps of an earlier launch still run, then start its own
# (as a tensorboard would) and run the job; the script exits with the job
TRAIN = """launch=$(basename "$(dirname "$NETBENCH_CONTROL")")
for f in {dir}/bg-*; do
  case "$f" in *"$launch"*|*"*") continue;; esac
  state=$(cut -d' ' -f3 "/proc/$(cat "$f")/stat" 2>/dev/null)  # a zombie (Z) waits for its reaper: gone
  [ -n "$state" ] && [ "$state" != Z ] && echo "$f alive ($state) at the start of $launch" >> {dir}/orphans
done
sleep {marker} &
echo $! > {dir}/bg-$launch-$NETBENCH_RANK
python {dir}/job.py
"""


def test_a_millisecond_step_job_stops_on_every_rank_after_the_same_step_leaving_nothing_behind(clean_machine,
                                                                                            tmp_path):
    """Two ranks in lockstep at 1 ms steps that ask track.stop_requested() (rank 1 asks 0.8 ms
    later in each step), each started by a train.sh that starts a process in the background
    and exits with the job; a launch per point (--isolate). Every rank must stop after the
    same step by itself (none gone while its peer waits in the exchange), and what train.sh
    left in the background must be gone before the next launch starts."""
    marker = f"{297 + os.getpid() % 1000 / 1000:.3f}"  # this test's own sleep
    (tmp_path / "job.py").write_text(LOCKSTEP)
    (tmp_path / "train.sh").write_text(TRAIN.format(dir=tmp_path, marker=marker))
    out = tmp_path / "out"
    result = subprocess.run([*NETBENCH, "sweep", "--bandwidth", "1gbit,500mbit", "--workers", "2", "--warmup", "5",
                             "--steps", "300", "--isolate", "--output", str(out), "--", "sh",
                             str(tmp_path / "train.sh")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "results.csv", newline="")))
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    assert not (tmp_path / "orphans").exists(), (tmp_path / "orphans").read_text()
    launches = sorted(out.glob("logs/launch*"))
    assert len(launches) == 2
    for launch in launches:
        ranks = json.loads((launch / "ranks.json").read_text())
        said = [line for log in sorted(launch.glob("n*-worker*.log")) for line in log.read_text().splitlines()
                if line.startswith(("stopped after", "peer gone"))]
        assert [r["ended"] for r in ranks] == ["exited 0", "exited 0"], (launch.name, ranks, said)
        assert len(said) == 2 and said[0] == said[1] and said[0].startswith("stopped after"), (launch.name, said)
    assert processes_running(f"sleep {marker}") == []
    assert local.list_netbench_netns() == []
