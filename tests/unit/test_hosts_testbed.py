"""Sweeps over an inventory without SSH: placement on hosts, the task command, remote tasks
streaming step events, hosts that drop out, and whole sweeps through the runner against
FakeHost (tests/fakes/remote.py)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import signal
import sys
import threading
import time

import pytest
from click.testing import CliRunner
from tests.fakes.remote import FakeHost, FakeStream, failed, ok_json, task_stream

from netbench.cli.app import main
from netbench.errors import BackendUnavailable, UsageError
from netbench.remote.inventory import inventory_from_mapping
from netbench.model.job import JobSpec, plan_job
from netbench.jobs.events import to_record
from netbench.jobs.launch import Timeouts, run_job
from netbench.state.journal import Journal
from netbench.model.run import Run
from netbench.model.profile import Profile
from netbench.remote.agent import run_task
from netbench.experiment.runner import SweepConfig, run_sweep
from netbench.testbed.hosts import HostsTestbed, host_node, place_hosts, task_command

INV = inventory_from_mapping({
    "defaults": {"interface": "eth1", "venv": "/opt/nb"},
    "hosts": {"a": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1", "roles": ["chief", "worker"]},
              "b": {"ssh": "10.0.0.2", "tf_address": "10.9.0.2", "sudo": True}}}, "inv.yaml")
STEP = '{{"event": "step", "step": {k}, "phase": "{phase}", "duration": 0.01}}'


def steps(warmup: int = 1, measured: int = 3) -> list[str]:
    lines = ['{"event": "start"}']
    lines += [STEP.format(k=k, phase="warmup" if k < warmup else "measured") for k in range(warmup + measured)]
    return lines + ['{"event": "done", "steps": %d}' % measured]


def info(backend: str = "userspace") -> dict:
    return {"backend": backend, "backend_reason": "probe", "interface_ok": True, "interfaces": {"eth1": []},
            "tcp_congestion_control": "cubic"}


def fake_hosts(streams: dict[str, object] | None = None) -> list[FakeHost]:
    """Hosts a and b answering info/apply/reset/lease renewal; `streams` maps a host to its
    task stream factory (default: a worker that reports steps and finishes)."""
    hosts = []
    for name in ("a", "b"):
        host = FakeHost(name, [(" info ", ok_json(info())), (" apply ", ok_json({"applied": []})),
                               (" reset ", ok_json({"removed": ["qdisc 4e42: on nbhost-1/eth1"]})),
                               ("netbench.state.lease renew", ok_json({}))])
        make = (streams or {}).get(name) or (lambda command, n=len(hosts): task_stream(100 + n, *steps()))
        host.streams = [(" task ", make)]
        hosts.append(host)
    return hosts


# ---------------------------------------------------------------- placement and commands (pure)

def test_allreduce_places_the_chief_on_a_chief_host_then_workers():
    assert [h.name for h in place_hosts(INV, JobSpec(), 2)] == ["a", "b"]
    assert [h.name for h in place_hosts(INV, JobSpec(strategy="single"), 1)] == ["a"]


def test_ps_places_parameter_servers_and_the_coordinator_on_hosts_with_those_roles():
    inv = inventory_from_mapping({"defaults": {"interface": "eth1"}, "hosts": {
        "w1": {"ssh": "w1", "tf_address": "10.9.0.1", "roles": ["worker", "chief"]},
        "w2": {"ssh": "w2", "tf_address": "10.9.0.2"},
        "p": {"ssh": "p", "tf_address": "10.9.0.3", "roles": ["ps"]},
        "c": {"ssh": "c", "tf_address": "10.9.0.4", "roles": ["chief"]}}}, "big.yaml")
    placed = place_hosts(inv, JobSpec(strategy="ps", ps=1), 2)
    assert [h.name for h in placed] == ["w1", "w2", "p", "c"]  # placement order: workers, ps, coordinator
    tasks = plan_job(JobSpec(strategy="ps", ps=1), tuple(host_node(h) for h in placed), 2, port=2222)
    cluster = json.loads(tasks[0].tf_config)["cluster"]
    assert cluster == {"worker": ["10.9.0.1:2222", "10.9.0.2:2222"], "ps": ["10.9.0.3:2222"], "chief": ["10.9.0.4:2222"]}


@pytest.mark.parametrize("job, workers, message", [
    (JobSpec(), 3, "inv.yaml: hosts: strategy allreduce with 3 workers needs 3 hosts, the inventory has 2"),
    (JobSpec(strategy="ps", ps=1), 1, "inv.yaml: hosts: no host left that may take ps0 (it needs roles: ps)"),
])
def test_a_job_the_inventory_cannot_hold_is_refused_naming_the_file(job, workers, message):
    inv = inventory_from_mapping({"defaults": {"interface": "eth1"}, "hosts": {
        name: {"ssh": name, "tf_address": f"10.9.0.{i + 1}", "roles": ["chief", "worker"]}
        for i, name in enumerate("abc")}}, "inv.yaml") if job.strategy == "ps" else INV
    with pytest.raises(UsageError) as info_:
        place_hosts(inv, job, workers)
    assert info_.value.message == message and info_.value.exit_code == 2


def test_a_host_without_tf_address_is_refused_naming_the_key():
    inv = inventory_from_mapping({"defaults": {"interface": "eth1"}, "hosts": {
        "a": {"ssh": "a", "tf_address": "10.9.0.1"}, "b": {"ssh": "b"}}}, "inv.yaml")
    with pytest.raises(UsageError, match=r"^inv.yaml: hosts.b.tf_address: missing"):
        place_hosts(inv, JobSpec(), 2)
    assert [h.name for h in place_hosts(inv, JobSpec(strategy="single"), 1)] == ["a"]  # b runs nothing


def test_task_command_runs_node_task_with_the_hosts_python_and_tf_config():
    (task_a, task_b) = plan_job(JobSpec(steps=5), tuple(host_node(h) for h in INV.hosts), 2, port=3333)
    command = task_command(INV.host("b"), task_b, {"X": "1"})
    argv = shlex.split(command)
    assert argv[:6] == ["sudo", "-n", "/opt/nb/bin/netbench", "node", "--state-dir", "/run/netbench"]
    assert argv[6:12] == ["--ssh-connection", "$SSH_CONNECTION", "task", "--role", "worker1", "--grace"]
    env = dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "--env")
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    assert env["X"] == "1"
    assert (env["RANK"], env["LOCAL_RANK"], env["NCCL_IB_DISABLE"]) == ("1", "0", "1")  # the rank's variables
    assert "NCCL_HOSTID" not in env  # a host of its own: NCCL's own host identity
    assert argv[argv.index("--") + 1:][:3] == ["/opt/nb/bin/python", "-m", "netbench.jobs.worker"]


# ---------------------------------------------------------------- remote tasks through run_job

def _run(hosts, tmp_path, timeouts=Timeouts(startup_s=20, step_s=10)):
    bed = HostsTestbed(INV, hosts)
    tasks = plan_job(JobSpec(), tuple(host_node(h) for h in INV.hosts), 2, port=3333)
    return run_job(tasks, tmp_path / "logs", bed.spawn, timeouts)


def test_step_events_stream_back_from_every_host(tmp_path):
    hosts = fake_hosts()
    outcome = _run(hosts, tmp_path)
    assert outcome.status == "ok", outcome.error
    assert {(e.role, e.worker) for e in outcome.events} == {("worker", 0), ("worker", 1)}
    assert not any("netbench-task" in json.dumps(to_record(e)) for e in outcome.events)  # the pid line is not an event
    assert all(stream.closed for host in hosts for _, stream in host.started)


def test_a_host_whose_connection_drops_fails_the_run_naming_it_and_the_others_are_stopped(tmp_path):
    dropped = {}

    def lost(command):
        stream = task_stream(201, '{"event": "start"}', code=-1, running=True)
        dropped["stream"] = stream
        return stream

    hosts = fake_hosts({"a": lambda c: task_stream(101, '{"event": "start"}', running=True, code=143), "b": lost})

    def drop() -> None:
        hosts[1].connected = False
        dropped["stream"].end(-1)  # paramiko: the channel closes with no exit status

    threading.Timer(0.3, drop).start()
    outcome = _run(hosts, tmp_path)
    assert outcome.status == "failed"
    assert outcome.error == "host b: SSH connection lost while worker1 ran there"
    (_, a_stream), = hosts[0].started
    assert a_stream.stdin_closed and a_stream.closed  # a's worker was stopped through its channel


def test_a_remote_process_that_dies_fails_the_run_with_its_log(tmp_path):
    hosts = fake_hosts({"a": lambda c: task_stream(101, '{"event": "start"}', running=True, code=143),
                        "b": lambda c: task_stream(201, '{"event": "start"}', stderr="Killed\n", code=137)})
    outcome = _run(hosts, tmp_path)
    assert outcome.status == "failed" and outcome.error == "b worker1 exited with 137: Killed"
    assert (tmp_path / "logs" / "b-worker1.log").read_text() == "Killed\n"


def test_a_task_that_cannot_start_on_a_host_fails_the_run(tmp_path):
    hosts = fake_hosts({"b": lambda c: FakeStream(code=127)})
    outcome = _run(hosts, tmp_path)
    assert outcome.status == "failed"
    assert outcome.error.startswith("host b: cannot start worker1: netbench is not installed there")
    (_, a_stream), = hosts[0].started
    assert a_stream.closed


# ---------------------------------------------------------------- the host side: netbench node task

def test_node_task_relays_lines_journals_the_process_and_stops_it_when_stdin_closes(tmp_path):
    journal = Journal(tmp_path / "state")
    read, write = os.pipe()
    out = io.BytesIO()
    code = "import json, os, time; print(json.dumps({'event': 'start', 'x': os.environ['X']}), flush=True); time.sleep(60)"
    result = {}
    thread = threading.Thread(target=lambda: result.update(code=run_task(
        journal, [sys.executable, "-c", code], {"X": "1"}, "worker0", grace=1.0,
        stdin=os.fdopen(read, "rb"), stdout=out)))
    thread.start()
    deadline = time.monotonic() + 20
    while b'"start"' not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    first, event = out.getvalue().splitlines()[:2]
    pid = int(first.split(b"pid=")[1])
    assert json.loads(event) == {"event": "start", "x": "1"}
    (entry,) = journal.pending()
    assert (entry.kind, entry.data["pid"], entry.data["role"]) == ("process", pid, "worker0")
    os.close(write)  # the controller closes the channel's stdin
    thread.join(timeout=15)
    assert result["code"] == 128 + signal.SIGTERM
    assert journal.pending() == []
    assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped


# ---------------------------------------------------------------- whole sweeps through the runner

def _config(tmp_path, *profiles: Profile) -> SweepConfig:
    job = JobSpec(warmup=1, steps=3)
    runs = tuple(Run(index=i, profile=p, repeat=1, job=job, workers=2) for i, p in enumerate(profiles))
    return SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out")


def test_a_sweep_over_hosts_applies_each_point_records_results_and_resets_every_host(tmp_path):
    hosts = fake_hosts()
    config = _config(tmp_path, Profile(name="r100", rate_bps=10**8), Profile(name="r20", rate_bps=2 * 10**7))
    testbed = HostsTestbed(INV, hosts)
    results = run_sweep(config, testbed=testbed)
    assert [r.status for r in results] == ["ok", "ok"] and results[0].backend == "userspace"
    assert results[0].stats["steps"] == 3 and results[0].stats["images_per_sec"] > 0
    for host in hosts:
        applies = host.ran(" apply ")  # one holder token for the whole sweep
        assert len(applies) == 2 and all(c.endswith(f"--lease 60 --holder {testbed.holder}") for c, _ in applies)
        assert '"rate_bps": 20000000' in applies[1][1]
        assert re.search(r"reset --json --holder \S+$", host.commands[-1][0])  # the last thing done on every host
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        assert [row["status"] for row in csv.DictReader(fh)] == ["ok", "ok"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["testbed_kind"] == "hosts" and manifest["ended"]
    assert [n["name"] for n in manifest["testbed"]["nodes"]] == ["a", "b"]
    assert manifest["tcp_congestion_control"] == {"a": "cubic", "b": "cubic"}  # as each host's node info said
    assert (tmp_path / "out" / "runs" / "r000.json").exists()


def test_a_host_that_drops_out_fails_that_run_and_the_sweep_still_resets(tmp_path):
    calls = {"n": 0}

    def b_stream(command):
        calls["n"] += 1
        if calls["n"] == 1:
            return task_stream(201, '{"event": "start"}', stderr="Traceback\nRuntimeError: boom\n", code=1)
        return task_stream(202, *steps())

    hosts = fake_hosts({"a": lambda c: task_stream(101, *steps()), "b": b_stream})
    config = _config(tmp_path, Profile(name="r100", rate_bps=10**8), Profile(name="r20", rate_bps=2 * 10**7))
    results = run_sweep(config, testbed=HostsTestbed(INV, hosts))
    assert results[0].status == "failed" and results[0].error == "b worker1 exited with 1: RuntimeError: boom"
    assert results[1].status == "ok"
    assert all(re.search(r"reset --json --holder \S+$", h.commands[-1][0]) for h in hosts)


def test_a_profile_a_host_cannot_shape_is_refused_before_anything_is_applied(tmp_path):
    hosts = fake_hosts()
    config = _config(tmp_path, Profile(name="r100", rate_bps=10**8), Profile(name="d10", delay_us=10_000))
    with pytest.raises(BackendUnavailable, match="host a: without netem a remote host shapes rate only"):
        run_sweep(config, testbed=HostsTestbed(INV, hosts))
    assert not any(h.ran(" apply ") or h.ran(" reset ") or h.started for h in hosts)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the command line

def _inventory_file(tmp_path, **hosts) -> str:
    import yaml

    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"interface": "eth1"}, "hosts": hosts}))
    return str(path)


def test_sweep_over_an_inventory_with_too_few_hosts_is_a_one_line_error(tmp_path):
    inv = _inventory_file(tmp_path, a={"ssh": "192.0.2.1", "tf_address": "10.9.0.1"})
    result = CliRunner().invoke(main, ["sweep", "--inventory", inv, "--bandwidth", "100mbit",
                                       "--output", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert f"{inv}: hosts: strategy allreduce with 2 workers needs 2 hosts, the inventory has 1" in result.output
    assert not (tmp_path / "out").exists()


def test_sweep_over_an_inventory_refuses_verify_and_a_missing_tf_address(tmp_path):
    inv = _inventory_file(tmp_path, a={"ssh": "192.0.2.1", "tf_address": "10.9.0.1"}, b={"ssh": "192.0.2.2"})
    result = CliRunner().invoke(main, ["sweep", "--inventory", inv, "--bandwidth", "100mbit", "--verify"])
    assert result.exit_code == 2 and "flag --verify: not with --inventory" in result.output
    result = CliRunner().invoke(main, ["sweep", "--inventory", inv, "--bandwidth", "100mbit"])
    assert result.exit_code == 2 and f"{inv}: hosts.b.tf_address: missing" in result.output
    result = CliRunner().invoke(main, ["sweep", "--insecure-host-keys", "--bandwidth", "100mbit", "--dry-run"])
    assert result.exit_code == 2 and "flag --insecure-host-keys: only with --inventory" in result.output


def test_sweep_dry_run_over_an_inventory_contacts_no_host(tmp_path):
    # 192.0.2.0/24 is TEST-NET-1: a connection attempt would hang or fail, not print a plan
    inv = _inventory_file(tmp_path, a={"ssh": "192.0.2.1", "tf_address": "10.9.0.1"},
                          b={"ssh": "192.0.2.2", "tf_address": "10.9.0.2"})
    result = CliRunner().invoke(main, ["sweep", "--inventory", inv, "--bandwidth", "100,20mbit", "--dry-run",
                                       "--backend", "userspace"])
    assert result.exit_code == 0, result.output
    assert "worker0 on a (10.9.0.1:<port>), reports steps" in result.output
    assert "worker1 on b (10.9.0.2:<port>)" in result.output
    assert result.output.count("b: tc qdisc replace dev eth1 root handle 4e42: tbf") == 2


def test_apply_dry_run_with_a_backend_contacts_no_host(tmp_path):
    inv = _inventory_file(tmp_path, a={"ssh": "192.0.2.1", "tf_address": "10.9.0.1"})
    result = CliRunner().invoke(main, ["apply", "--inventory", inv, "--bandwidth", "100mbit", "--dry-run",
                                       "--backend", "userspace"])
    assert result.exit_code == 0, result.output
    assert "a: tc qdisc replace dev eth1 root handle 4e42: tbf rate 100mbit" in result.output
    assert "no host was changed" in result.output


def test_a_host_reset_stops_a_task_process_its_journal_records(tmp_path):
    """After a controller crash, `netbench node reset` (or an expired lease) stops the job
    processes `node task` journaled, as it removes the shaping."""
    from netbench import proc
    from netbench.remote.agent import reset_host

    journal = Journal(tmp_path / "state")
    child = proc.spawn([sys.executable, "-c", "import time; time.sleep(60)"], die_with_parent=False)
    journal.record("process", pid=child.pid, start=proc.start_time(child.pid), netns=None, role="worker1")
    try:
        removed = reset_host(journal)
        assert removed == [f"process {child.pid} (worker1)"]
        child.wait(timeout=5)  # (already reaped by the reset)
        assert not os.path.exists(f"/proc/{child.pid}") and journal.pending() == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_peer_that_dies_is_named_rather_than_the_survivor_reporting_a_collective_error(tmp_path):
    """The chief's collective fails because worker1's process died: the cause named is the
    dead process, though the chief's error event came first."""
    error = '{"event": "error", "type": "UnavailableError", "message": "Collective ops is aborted"}'

    def chief(command):
        stream = task_stream(101, '{"event": "start"}', error, running=True, code=1)
        threading.Timer(0.2, lambda: stream.end(1)).start()
        return stream

    def dying(command):
        stream = task_stream(201, '{"event": "start"}', stderr="Killed\n", running=True, code=137)
        threading.Timer(0.6, lambda: stream.end(137)).start()
        return stream

    outcome = _run(fake_hosts({"a": chief, "b": dying}), tmp_path)
    assert outcome.status == "failed" and outcome.error == "b worker1 exited with 137: Killed"
    # alone, an error event still fails the run with that error
    outcome = _run(fake_hosts({"a": chief, "b": lambda c: task_stream(201, '{"event": "start"}', running=True)}),
                   tmp_path)
    assert outcome.error == "a worker0: UnavailableError: Collective ops is aborted"


def test_a_playbook_over_too_small_an_inventory_is_refused_before_its_folder_is_written(tmp_path):
    from pathlib import Path

    inv = _inventory_file(tmp_path, a={"ssh": "192.0.2.1", "tf_address": "10.9.0.1"})
    smoke = Path(__file__).resolve().parents[2] / "playbooks" / "smoke.yaml"
    result = CliRunner().invoke(main, ["run", str(smoke), "--inventory", inv, "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"{inv}: hosts: strategy allreduce with 2 workers needs 2 hosts, the inventory has 1" in result.output
    assert not (tmp_path / "out").exists()


def test_finish_leaves_alone_a_host_whose_lease_another_controller_took_over():
    from types import SimpleNamespace

    hosts = fake_hosts()
    testbed = HostsTestbed(INV, hosts)
    testbed.applied = True
    testbed.keeper = SimpleNamespace(lost={"a": "another controller took it over (held by x@y:1:ab)"},
                                     __exit__=lambda *exc: None)
    notes = []
    testbed.finish(notes.append)
    assert not hosts[0].ran(" reset ") and hosts[1].ran(" reset ")


def test_finish_notes_each_hosts_reset_once_held_removed_or_failed():
    """finish goes through reset_inventory (one reading of each host's held_by): a host another
    controller took over is left alone, one that fails is named with what to do, the rest say what
    they removed."""
    hosts = fake_hosts()
    hosts[0].responses[2] = (" reset ", ok_json({"removed": [], "held_by": "held by x@y:1:ab"}))
    testbed = HostsTestbed(INV, hosts)
    testbed.applied = True
    notes = []
    testbed.finish(notes.append)
    assert notes == ["host a: another controller took it over (held by x@y:1:ab); left alone",
                     "host b: removed qdisc 4e42: on nbhost-1/eth1"]
    hosts[1].responses[2] = (" reset ", failed("cannot delete qdisc"))
    notes.clear()
    testbed.finish(notes.append)
    assert notes[0] == "host a: another controller took it over (held by x@y:1:ab); left alone"
    assert notes[1].startswith("could not reset host b: cannot delete qdisc; it reverts by itself when its ")
    assert "netbench reset --inventory" in notes[1] and len(notes) == 2


def test_a_host_that_accepts_the_task_channel_then_hangs_does_not_hang_the_run(tmp_path):
    hung = []

    def silent(command):
        stream = FakeStream(running=True)  # the channel is open; the pid line never comes
        hung.append(stream)
        return stream

    hosts = fake_hosts({"b": silent})
    bed = HostsTestbed(INV, hosts, startup_s=0.2)
    tasks = plan_job(JobSpec(), tuple(host_node(h) for h in INV.hosts), 2, port=3333)
    result = {}
    thread = threading.Thread(target=lambda: result.update(outcome=run_job(tasks, tmp_path / "logs", bed.spawn,
                                                                           Timeouts(startup_s=0.2, step_s=10))),
                              daemon=True)
    thread.start()
    thread.join(timeout=60)  # (only a guard: without a limit on the pid line this never returns)
    for stream in hung:
        stream.end(-1)
    assert not thread.is_alive(), "the run hung on a host that never sent its pid line"
    outcome = result["outcome"]
    assert outcome.status == "failed" and outcome.error == "host b: cannot start worker1: no answer within 0.2s"
    assert hung[0].closed and all(stream.closed for _, stream in hosts[0].started)


@pytest.mark.parametrize("first", ["netbench-task pid=1", "netbench-task pid=0", "netbench-task pid=-5",
                                   "netbench-task pid=12x", "netbench-task pid="])
def test_a_task_pid_that_is_not_a_process_id_above_1_is_refused_and_never_killed(tmp_path, first):
    hosts = fake_hosts({"b": lambda c: FakeStream([first], running=True)})
    outcome = _run(hosts, tmp_path)
    assert outcome.status == "failed"
    assert outcome.error == f"host b: cannot start worker1: it sent {first!r}, not 'netbench-task pid=N' with N > 1"
    assert not hosts[1].ran("kill")


# ---------------------------------------------------------------- leases through a sweep

def _timed(log: list, answer):
    """A responder recording when each command came, answering `answer` (or its result)."""
    def respond(command, input):
        log.append(time.monotonic())
        return answer(command, input) if callable(answer) else answer
    return respond


def test_a_fast_hosts_lease_is_renewed_while_a_slow_host_still_applies(tmp_path):
    """A host's apply may take longer than another host's lease: the keeper starts only after
    every apply returned, so the host that finished first reverted itself meanwhile."""
    from netbench.remote.ssh import CommandResult

    a_renewals: list[float] = []
    b_applied: list[float] = []

    def slow_apply(command, input):
        time.sleep(2.0)  # longer than the 1.2 s lease
        b_applied.append(time.monotonic())
        return ok_json({"applied": []})

    hosts = fake_hosts()
    hosts[0].responses.insert(0, ("netbench.state.lease renew", _timed(a_renewals, CommandResult(0, "", ""))))
    b_renewals: list[float] = []
    hosts[1].responses.insert(0, (" apply ", slow_apply))
    hosts[1].responses.insert(0, ("netbench.state.lease renew", _timed(b_renewals, CommandResult(0, "", ""))))
    results = run_sweep(_config(tmp_path, Profile(name="r100", rate_bps=10**8)),
                        testbed=HostsTestbed(INV, hosts, lease_s=1.2))
    assert [r.status for r in results] == ["ok"]
    assert a_renewals and a_renewals[0] < b_applied[0], "host a was not renewed while host b applied"
    assert not [t for t in b_renewals if t < b_applied[0]]  # b holds no lease before its apply returns


def test_a_run_during_which_a_host_lost_its_lease_is_failed(tmp_path):
    """The host reverted itself: the run did not have its profile, whatever it measured."""
    from netbench.remote.ssh import CommandResult
    from netbench.state.lease import GONE

    hosts = fake_hosts()
    hosts[0].responses.insert(0, ("netbench.state.lease renew", CommandResult(GONE, "", "")))
    results = run_sweep(_config(tmp_path, Profile(name="r100", rate_bps=10**8)),
                        testbed=HostsTestbed(INV, hosts, lease_s=30))
    assert results[0].status == "failed"
    assert results[0].error == ("lease not held through the run: host a: its lease had expired and it "
                                "reverted its shaping")
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        assert [row["status"] for row in csv.DictReader(fh)] == ["failed"]
    assert not hosts[0].ran(" reset ") and hosts[1].ran(" reset ")  # a is left alone: it reverted itself


def test_a_run_is_ok_only_once_every_host_renewed_after_it(tmp_path):
    """A lease is shown held through a run by a renewal sent after the run's end: each host
    is asked at once, not at the keeper's next round (10 s later with a 30 s lease)."""
    from netbench.remote.ssh import CommandResult

    hosts = fake_hosts()
    sent: dict[str, list[float]] = {"a": [], "b": []}
    for host in hosts:
        host.responses.insert(0, ("netbench.state.lease renew",
                                  lambda command, input, n=host.name: sent[n].append(time.time())
                                  or CommandResult(0, "", "")))
    began = time.monotonic()
    results = run_sweep(_config(tmp_path, Profile(name="r100", rate_bps=10**8)),
                        testbed=HostsTestbed(INV, hosts, lease_s=30))
    assert [r.status for r in results] == ["ok"] and time.monotonic() - began < 8
    assert all(any(t >= results[0].ended for t in sent[name]) for name in sent), sent
