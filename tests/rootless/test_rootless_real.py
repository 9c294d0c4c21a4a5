"""netbench without root, for real: an ordinary user's testbed, sweep, crash and reset; two
testbeds at once; a sudo run whose jobs are the user's (tests/rootless/conftest.py)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from netbench.testbed import rootless
from netbench.testbed import netns as local
from tests.conftest import netbench_processes, wait_for

SHORT = ("--warmup", "3", "--steps", "8", "--batch-size", "32", "--precision", "off", "--settle", "0.3s",
         "--settle-steps", "2")


def _rows(folder: Path) -> list[dict]:
    with open(folder / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))



def test_a_users_testbed_shapes_and_goes_with_reset(runner):
    runner.run("testbed", "up", "--nodes", "2")
    runner.run("apply", "--latency", "10ms")
    ping = runner.run("exec", "n1", "--", "ping", "-c", "3", "-i", "0.2", "n2").stdout
    rtt = float(ping.split("rtt min/avg/max/mdev = ")[1].split("/")[1])
    assert 19.0 < rtt < 40.0, ping  # 2 x 10 ms one-way, by the user's own delay engines
    shown = json.loads(runner.run("show", "--json").stdout)
    assert {row["backend"] for row in shown["nodes"]} <= {"userspace", "netem"}, shown
    listed = json.loads(runner.run("testbed", "show", "--json").stdout)
    assert [n["name"] for n in listed["nodes"]] == ["n1", "n2"]
    assert runner.processes(), "the keeper and the engines run as the user"
    out = runner.run("reset").stdout
    assert "clean" in out, out
    assert runner.processes() == []
    # a zombie holds its user namespace until its parent reaps it (the keeper's is init)
    wait_for(lambda: runner.user_namespaces() == [], 30, "the user's namespaces going")
    assert not (runner.base() / "testbed.json").exists() and not list((runner.base() / "testbeds").glob("*"))


def test_a_users_latency_sweep_runs_every_point_and_slows_with_latency(runner):
    out = runner.work / "latency"
    runner.run("sweep", "--latency", "1,10,100ms", *SHORT, "--output", str(out), timeout=600)
    rows = {r["delay_ms"]: r for r in _rows(out)}
    assert [rows[d]["status"] for d in ("1.0", "10.0", "100.0")] == ["ok"] * 3
    speed = [float(rows[d]["images_per_sec"]) for d in ("1.0", "10.0", "100.0")]
    assert speed[0] > speed[1] > speed[2], speed
    assert {r["privilege"] for r in rows.values()} == {"rootless"}
    assert os.stat(out / "results.csv").st_uid == runner.user.pw_uid  # the user's own files
    assert runner.processes() == []
    wait_for(lambda: runner.user_namespaces() == [], 30, "the user's namespaces going")
    assert list((runner.base() / "testbeds").iterdir()) == []  # its sandbox's state went with it


def test_kill_9_of_a_users_sweep_leaves_nothing_and_a_root_sweep_beside_it_finishes(runner, clean_machine, tmp_path):
    root_out = tmp_path / "root"
    root_sweep = runner.start("sweep", "--latency", "1,5ms", *SHORT, "--output", str(root_out), as_user=False,
                              env={"NETBENCH_STATE_DIR": str(clean_machine.dir)})
    user_sweep = runner.start("sweep", "--latency", "1,10,100ms", *SHORT, "--steps", "200",
                              "--output", str(runner.work / "killed"))
    try:
        states = runner.base() / "testbeds"
        holder = wait_for(lambda: next((json.loads((s / "testbed.json").read_text())
                                         for s in states.glob("*") if (s / "testbed.json").exists()), None),
                           120, "the user's sandbox")
        deadline = time.monotonic() + 180
        while not any("netbench.jobs.worker" in p for p in runner.processes()):
            if time.monotonic() > deadline or user_sweep.poll() is not None:
                user_sweep.kill()
                pytest.fail(f"the user's workers did not start: {user_sweep.communicate()[0][-3000:]}")
            time.sleep(0.2)
        os.kill(holder["pid"], signal.SIGKILL)
        if holder["pid"] == user_sweep.pid:  # the sweep became the sandbox's holder (exec): reap it,
            user_sweep.wait(30)              # as its zombie's credentials would keep the user namespace
        # its engines and workers die with it (their parent-death signal): the kernel then drops
        # the user's namespaces, qdiscs and rules with them
        wait_for(lambda: runner.processes() == [], 30, "every process of the user ending")
        gone = time.monotonic()
        try:
            wait_for(lambda: runner.user_namespaces() == [], 90, "the user's namespaces going")
        except BaseException:
            print(subprocess.run(["lsns", "-o", "NS,TYPE,USER,PID,PPID,NPROCS,COMMAND"], capture_output=True,
                                 text=True).stdout)
            raise
        print(f"the user's namespaces went {time.monotonic() - gone:.1f} s after their last process")
        out = runner.run("reset").stdout
        assert f"state folder {states / holder['id']}" in out, out
        assert list(states.iterdir()) == []
    except BaseException:
        root_sweep.kill()  # the test's reset must not race a sweep still running
        root_sweep.wait()
        raise
    finally:
        user_sweep.kill()
        user_sweep.wait()
        runner.run("reset", check=False)  # whatever this test left of the user's
    root_out_text = root_sweep.communicate(timeout=600)[0]
    assert root_sweep.returncode == 0, root_out_text[-3000:]
    assert [r["status"] for r in _rows(root_out)] == ["ok", "ok"]
    assert local.list_netbench_netns() == [] and netbench_processes(clean_machine.dir) == []


def test_two_root_sweeps_at_once_get_a_testbed_each_and_both_finish(runner, clean_machine, tmp_path):
    env = {"NETBENCH_STATE_DIR": str(clean_machine.dir)}
    first = runner.start("sweep", "--latency", "1ms", *SHORT, "--output", str(tmp_path / "a"), as_user=False, env=env)
    wait_for(lambda: local.list_netbench_netns(), 120, "the first sweep's testbed")
    second = runner.start("sweep", "--latency", "1ms", *SHORT, "--output", str(tmp_path / "b"), as_user=False, env=env)
    outputs = [proc.communicate(timeout=600)[0] for proc in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [o[-2000:] for o in outputs]
    assert [r["status"] for r in _rows(tmp_path / "a") + _rows(tmp_path / "b")] == ["ok", "ok"]
    manifests = [json.loads((tmp_path / f / "manifest.json").read_text()) for f in ("a", "b")]
    assert manifests[0]["testbed"]["switch"] == manifests[1]["testbed"]["switch"] == "netbench-sw"  # each its own
    assert local.list_netbench_netns() == [] and not list(Path("/run/netbench/testbeds").glob("*"))


def test_with_sudo_a_users_command_runs_as_that_user_and_the_results_are_theirs(runner, clean_machine, tmp_path):
    out = runner.work / "sudo"
    sudo = {"SUDO_UID": str(runner.user.pw_uid), "SUDO_GID": str(runner.user.pw_gid),
            "SUDO_USER": runner.user.pw_name, "NETBENCH_STATE_DIR": str(clean_machine.dir)}
    # a command of the user's that says who runs it (on stderr: its log), then steps (examples/plain_steps.py)
    steps = f"exec python3 {runner.repo / 'examples' / 'plain_steps.py'} --kib 64"
    result = runner.run("sweep", "--latency", "1ms", "--warmup", "2", "--steps", "6", "--images-per-step", "64",
                        "--step-regex", r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms", "--output", str(out), "--",
                        "sh", "-c", f"echo uid=$(id -u) home=$HOME >&2; {steps}", as_user=False, env=sudo, check=False)
    records = " ".join(p.read_text()[:2000] for p in (out / "runs").glob("*.json")) if (out / "runs").exists() else ""
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:], records)
    assert f"job processes run as {runner.user.pw_name}" in result.stdout, result.stdout
    logs = " ".join(p.read_text() for p in (out / "logs").rglob("*.log"))
    assert f"uid={runner.user.pw_uid} home={runner.user.pw_dir}" in logs, logs
    assert "uid=0" not in logs
    owners = {os.stat(p).st_uid for p in [out, *out.rglob("*")]}
    assert owners == {runner.user.pw_uid}, owners


def test_the_doctor_names_what_this_host_withholds_from_a_user(runner):
    shown = json.loads(runner.run("doctor", "--json", "--no-tensorflow").stdout)
    expected = {limit.what for limit in rootless.limits(rootless.read_host())}
    assert {row["what"] for row in shown["rootless"]} == expected
    assert shown["checks"][0] == {**shown["checks"][0], "name": "privileges", "status": "ok"}
    assert "without root" in shown["checks"][0]["detail"]
    assert runner.processes() == [] and list((runner.base() / "testbeds").glob("*")) == []
