"""A sweep over an inventory of real sshd hosts (tests/ssh/lab.py): TensorFlow workers start on
the hosts over SSH, step events come back over the channels, the hosts' data-plane links are
shaped with tbf (this kernel has no netem), and every host is put back afterwards, also when
a host's worker dies or its SSH connection drops mid-run."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import ROOT
from tests.ssh.lab import root_lab, sh

pytestmark = [pytest.mark.root, pytest.mark.tf]

QUICK = ("--warmup", "2", "--steps", "5", "--precision", "off", "--batch-size", "32", "--startup-timeout", "120")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from root_lab(tmp_path_factory, "nbsweep")


def _in_netns(netns: str, needle: str, unless: str = " node ") -> list[int]:
    """Pids of processes inside namespace `netns` whose command line contains `needle`
    (and not `unless`: by default, not the `netbench node task` relaying a worker)."""
    inode = os.stat(f"/run/netns/{netns}").st_ino
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "net").st_ino != inode:
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd and not (unless and unless in cmd):
            found.append(int(entry.name))
    return found


def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _assert_hosts_clean(lab) -> None:
    """No shaping, no journal entry and no job process left on any host."""
    for host in lab.hosts:
        qdisc = host.root_qdisc("data0")
        assert not (qdisc and qdisc.get("handle") == "4e42:"), f"{host.name} still shaped: {qdisc}"
        journal = host.state_dir / "journal.jsonl"
        assert not journal.exists() or not journal.read_text().strip(), journal.read_text()
        deadline = time.monotonic() + 10
        while _in_netns(host.netns, "netbench.jobs.worker") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _in_netns(host.netns, "netbench.jobs.worker"), f"a worker is left on {host.name}"


def _wait_for_worker(lab, host, settle: float) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = _in_netns(host.netns, "netbench.jobs.worker")
        if pids:
            time.sleep(settle)  # past TF's import and the cluster's start: mid-run
            return pids[0]
        time.sleep(0.2)
    raise AssertionError(f"no worker started on {host.name}")


def test_a_two_host_sweep_over_ssh_records_results_like_a_local_sweep(lab, tmp_path):
    inventory = str(lab.write_inventory())
    out = tmp_path / "results"
    result = lab.netbench("sweep", "--inventory", inventory, "--bandwidth", "1gbit,20mbit", *QUICK,
                          "--output", str(out), timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    assert [r["rate_mbit"] for r in rows] == ["1000.0", "20.0"] and all(r["steps"] == "5" for r in rows)
    assert all(r["backend"] == "userspace" for r in rows)
    fast, slow = (float(r["images_per_sec"]) for r in rows)
    assert slow < fast / 2, (fast, slow)  # an all-reduce of 670k parameters through 20 Mbit/s
    record = json.loads((out / "runs" / "r000.json").read_text())
    workers = {(e["role"], e["worker"]) for e in record["events"] if e["event"] == "step"}
    assert workers == {("worker", 0), ("worker", 1)}  # both hosts streamed their steps back
    phases = [e["phase"] for e in record["events"] if e["event"] == "step" and e["worker"] == 0]
    assert phases.count("warmup") == 2 and phases.count("measured") == 5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["testbed_kind"] == "hosts" and manifest["ended"]
    assert [n["address"] for n in manifest["testbed"]["nodes"]] == [h.data_address for h in lab.hosts]
    for host in lab.hosts:  # each host's congestion control, as sysctl run on the host says
        cc = sh("sysctl", "-n", "net.ipv4.tcp_congestion_control", netns=host.netns).stdout.strip()
        assert manifest["tcp_congestion_control"][host.name] == cc != "", manifest["tcp_congestion_control"]
    assert sorted(p.name for p in (out / "logs" / "r000").iterdir()) == ["h1-worker0.log", "h2-worker1.log"]
    _assert_hosts_clean(lab)


def test_a_users_command_runs_on_every_host_and_its_lines_are_its_steps(lab, tmp_path):
    """A job that knows nothing of netbench (examples/plain_steps.py) as rank i on host i+1 over
    SSH, read by --step-regex from rank 0's output; each rank saw its host's own address."""
    job = tmp_path / "job.sh"
    job.write_text('echo "rank $RANK of $WORLD_SIZE at $NETBENCH_ADDRESS master $MASTER_ADDR" >&2\n'
                   f'exec {sys.executable} {ROOT}/examples/plain_steps.py --kib 64\n')
    out = tmp_path / "results"
    result = lab.netbench("sweep", "--inventory", str(lab.write_inventory()), "--bandwidth", "1gbit",
                          "--workers", "2", "--warmup", "2", "--steps", "5", "--images-per-step", "64",
                          "--step-regex", r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms", "--precision", "off",
                          "--output", str(out), "--", "sh", str(job), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = _rows(out)
    assert row["status"] == "ok" and row["source"] == "regex" and row["steps"] == "5", row
    assert float(row["images_per_sec"]) > 0
    said = sorted(line for log in out.glob("logs/*/*.log") for line in log.read_text().splitlines()
                  if line.startswith("rank "))
    master = lab.hosts[0].data_address
    assert said == [f"rank {i} of 2 at {h.data_address} master {master}" for i, h in enumerate(lab.hosts)], said
    _assert_hosts_clean(lab)


def test_a_users_command_that_reports_no_steps_is_measured_in_bytes_on_the_hosts(lab, tmp_path):
    """The hosts' link counters (read over SSH in the namespace their jobs run in) measure a
    job that reports no steps: bytes/s within the 20 Mbit/s the hosts' links are shaped to."""
    out = tmp_path / "results"
    result = lab.netbench("sweep", "--inventory", str(lab.write_inventory()), "--bandwidth", "20mbit",
                          "--workers", "2", "--warmup", "1", "--seconds", "2", "--output", str(out), "--",
                          sys.executable, f"{ROOT}/examples/ring_bytes.py", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = _rows(out)
    assert (row["status"], row["source"], row["images_per_sec"]) == ("ok", "bytes", ""), row
    assert 0.5e6 < float(row["link_bytes_per_s"]) <= 20e6 / 8 * 1.1, row
    _assert_hosts_clean(lab)


def test_collectives_time_the_hosts_shaped_links(lab, tmp_path):
    """`netbench collective --inventory`: the benchmark's processes on the hosts, their links
    shaped to 20 Mbit/s, a 1 MiB all-reduce timed at about what that rate allows."""
    out = tmp_path / "collective"
    result = lab.netbench("collective", "--inventory", str(lab.write_inventory()), "--bandwidth", "20mbit",
                          "--ops", "allreduce", "--framework", "tensorflow", "--sizes", "8,1MiB", "--warmup", "1",
                          "--repeat", "2", "--output", str(out), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(out / "collective.csv", newline="") as fh:
        rows = {int(r["bytes"]): r for r in csv.DictReader(fh)}
    assert set(rows) == {8, 1 << 20} and {r["rate_mbit"] for r in rows.values()} == {"20.0"}, rows
    # a 2-worker ring all-reduce sends each worker's 1 MiB once: 0.42 s at 20 Mbit/s
    assert 0.35 < float(rows[1 << 20]["time_s"]) < 5.0, rows[1 << 20]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["testbed_kind"] == "hosts" and manifest["ended"]
    _assert_hosts_clean(lab)


@contextlib.contextmanager
def _endless_sweep(lab, out: Path):
    """A 1gbit sweep over the lab that trains until something stops it; yields the child and
    a dict that gets its stdout/stderr; never leaves it running."""
    child = lab.spawn_netbench("sweep", "--inventory", str(lab.write_inventory()), "--bandwidth", "1gbit",
                               "--warmup", "2", "--steps", "100000", "--batch-size", "32", "--output", str(out))
    output: dict[str, str] = {}
    try:
        yield child, output
        output["stdout"], output["stderr"] = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_a_worker_killed_on_a_host_fails_the_run_naming_the_host(lab, tmp_path):
    out = tmp_path / "results"
    with _endless_sweep(lab, out) as (child, output):
        os.kill(_wait_for_worker(lab, lab.hosts[1], settle=12), signal.SIGKILL)
    assert child.returncode == 1, output["stdout"][-2000:] + output["stderr"][-2000:]  # a run failed
    (row,) = _rows(out)
    assert row["status"] == "failed" and row["error"].startswith("h2 worker1 exited with 137"), row
    _assert_hosts_clean(lab)


def test_a_host_whose_ssh_connection_drops_fails_the_run_and_is_reset(lab, tmp_path):
    out = tmp_path / "results"
    with _endless_sweep(lab, out) as (child, output):
        worker = _wait_for_worker(lab, lab.hosts[1], settle=12)
        sessions = _in_netns(lab.hosts[1].netns, "sshd: ", unless="[listener]")
        assert sessions
        for pid in sessions:  # the controller's SSH sessions to h2 (sshd's listener stays up)
            os.kill(pid, signal.SIGKILL)
    assert child.returncode == 1, output["stdout"][-2000:] + output["stderr"][-2000:]  # a run failed
    (row,) = _rows(out)
    assert row["status"] == "failed" and row["error"] == "host h2: SSH connection lost while worker1 ran there", row
    assert not os.path.exists(f"/proc/{worker}")  # h2 stopped its worker when the channel went away
    _assert_hosts_clean(lab)


def test_a_killed_sweep_controller_then_reset_leaves_every_host_clean(lab, tmp_path):
    inventory = str(lab.write_inventory())
    child = lab.spawn_netbench("sweep", "--inventory", inventory, "--bandwidth", "1gbit",
                               "--warmup", "2", "--steps", "100000", "--batch-size", "32",
                               "--output", str(tmp_path / "results"))
    try:
        _wait_for_worker(lab, lab.hosts[1], settle=2)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert all(h.root_qdisc("data0").get("handle") == "4e42:" for h in lab.hosts)  # the lease still holds
    result = lab.netbench("reset", "--inventory", inventory, check=True)
    assert "h1: removed lease" in result.stdout and "h2: removed qdisc 4e42:" in result.stdout
    _assert_hosts_clean(lab)
