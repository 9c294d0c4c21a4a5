"""A user's command that reports no steps, measured in bytes on its nodes' links: counters to
rates, the window (activity, warm-up, window), the decision of the source, the meter the
launch polls, and a whole sweep on the synthetic testbed with silent ranks."""

from __future__ import annotations

import csv
import json
import threading
from dataclasses import replace

import pytest

from netbench.experiment.launch import Settle
from netbench.experiment.store import SCHEMA_VERSION
from netbench.experiment.link_window import LinkMeter, meter_for
from netbench.experiment.runner import SweepConfig, run_sweep
from netbench.jobs import events as ev
from netbench.jobs.link_bytes import ACTIVE_BYTES, BytesWindow, LinkSample, link_rates, mean_sent_per_s, \
    reports_steps, source_of
from netbench.model import design
from netbench.model.command_job import UserCommand
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.state.journal import Journal
from tests.fakes.sweep import SyntheticTestbed


def sample(t: float, **nodes: tuple[int, int]) -> LinkSample:
    return LinkSample.of(t, nodes)


def test_counters_become_each_nodes_bytes_and_rates_over_the_samples_interval():
    rates = link_rates(sample(10.0, n1=(100, 1_000), n2=(50, 0)), sample(12.0, n2=(2_050, 3_000), n1=(4_100, 1_000)))
    by_node = {r.node: r for r in rates}
    assert (by_node["n1"].rx_bytes, by_node["n1"].tx_bytes) == (4_000, 0)
    assert (by_node["n1"].rx_bytes_per_s, by_node["n2"].rx_bytes_per_s, by_node["n2"].tx_bytes_per_s) == (2000, 1000, 1500)
    assert mean_sent_per_s(rates) == 750.0 and mean_sent_per_s([]) is None


@pytest.mark.parametrize("start, end, match", [
    (sample(1.0, n1=(10, 10)), sample(1.0, n1=(20, 20)), "not after"),
    (sample(1.0, n1=(10, 10)), sample(2.0, n1=(5, 20)), "went back"),
    (sample(1.0, n1=(10, 10)), sample(2.0, n2=(20, 20)), "node n2 was not read"),
])
def test_counters_that_cannot_give_a_rate_are_refused(start, end, match):
    with pytest.raises(ValueError, match=match):
        link_rates(start, end)


def test_the_window_waits_for_bytes_then_its_warm_up_then_measures_for_its_seconds():
    window = BytesWindow(warmup_s=2.0, window_s=3.0, active_bytes=1_000, sample_s=0.5)
    assert window.wait(0.0) == 0.0  # the first sample at once
    window.add(sample(0.0, n1=(0, 0), n2=(0, 0)))
    window.add(sample(0.5, n1=(300, 200), n2=(200, 299)))  # 999 bytes: link chatter, not the job
    assert window.active_at is None and window.wait(0.6) == pytest.approx(0.4)
    window.add(sample(1.0, n1=(1_000, 1_000), n2=(1_000, 1_000)))
    assert window.active_at == 1.0 and window.start is None
    window.add(sample(2.5, n1=(2_000, 2_000), n2=(2_000, 2_000)))  # still in its warm-up
    assert window.start is None and window.wait(2.7) == pytest.approx(0.3)  # next: the warm-up's end
    window.add(sample(3.0, n1=(3_000, 3_000), n2=(3_000, 3_000)))
    assert window.start is not None and window.start.time == 3.0 and not window.done
    window.add(sample(5.5, n1=(8_000, 13_000), n2=(13_000, 8_000)))
    assert not window.done and window.wait(5.8) == pytest.approx(0.2)  # next: the window's end (6.0)
    window.add(sample(6.0, n1=(9_000, 15_000), n2=(15_000, 9_000)))
    assert window.done
    window.add(sample(7.0, n1=(99_000, 99_000), n2=(99_000, 99_000)))  # after its end: ignored
    link = window.result(started_wall=1_000.0)
    assert (link["source"], link["warmup_s"], link["active_after_s"], link["window_start_s"], link["window_s"]) == \
        ("bytes", 2.0, 1.0, 3.0, 3.0)
    assert (link["window_start_wall"], link["window_end_wall"]) == (1_003.0, 1_006.0)
    nodes = {n["node"]: n for n in link["nodes"]}
    assert nodes["n1"]["tx_bytes"] == 12_000 and nodes["n1"]["tx_bytes_per_s"] == 4_000
    assert nodes["n2"]["tx_bytes_per_s"] == 2_000 and link["sent_bytes_per_s_mean"] == 3_000


def test_the_window_without_seconds_is_the_default_and_a_deadline_follows_its_phase():
    window = BytesWindow(warmup_s=1.0)
    assert window.window_s == 10.0 and window.deadline(60.0) is None
    window.add(sample(5.0, n1=(0, 0)))
    assert window.deadline(60.0) == 65.0  # the start-up timeout, from the launch's first sample
    window.add(sample(6.0, n1=(ACTIVE_BYTES, 0)))
    assert window.deadline(60.0) > 6.0 + 1.0 + 10.0  # then the warm-up and window, with slack


def test_where_a_commands_steps_come_from():
    assert source_of(r"step (?P<step>\d+)", heard_track=False) == "regex"
    assert source_of("", heard_track=True) == "track"
    assert source_of("", heard_track=False) == "bytes"
    loaded = ev.parse_line(json.dumps({"event": "track-loaded", "task_index": 1, "pid": 7}))
    checked = ev.parse_line(json.dumps({"event": "stop-checked", "step": 0}))
    resources = ev.parse_line(json.dumps({"event": "resources", "time": 1.0, "cpu_s": 0.1, "rss_bytes": 1,
                                          "rx_bytes": 0, "tx_bytes": 0}))
    assert reports_steps(loaded) and reports_steps(checked) and not reports_steps(resources)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_meter_ends_the_point_when_its_window_is_over():
    clock, sent = Clock(), {"n": 0}

    def read():
        sent["n"] = int(clock.now * 1_000_000)  # 1 MB/s from each node
        return {"n1": (sent["n"], sent["n"]), "n2": (sent["n"], sent["n"])}

    told = []
    meter = LinkMeter(read, BytesWindow(warmup_s=1.0, window_s=2.0), clock=clock, wall=lambda: 500.0, note=told.append)
    ended = None
    while ended is None:
        ended = meter.poll(startup_s=30.0)
        clock.now += max(meter.wait(), 0.01)
        assert clock.now < 10
    assert ended == ("ok", "") and meter.armed
    assert told == ["no step events, bytes on the links: measuring them (1 s warm-up, then 2 s; a job that imports "
                    "netbench.track reports steps instead)"]  # once, when the bytes began
    assert meter.link["sent_bytes_per_s_mean"] == pytest.approx(1e6)
    assert meter.window_wall()[1] - meter.window_wall()[0] == pytest.approx(2.0)


def test_a_track_event_disarms_the_meter_and_silence_times_out():
    clock = Clock()
    meter = LinkMeter(lambda: {"n1": (0, 0)}, BytesWindow(warmup_s=1.0), clock=clock)
    assert meter.poll(startup_s=5.0) is None
    meter.heard(ev.parse_line(b'{"event": "track-loaded", "task_index": 0, "pid": 1}'))
    assert not meter.armed
    quiet = LinkMeter(lambda: {"n1": (0, 0)}, BytesWindow(warmup_s=1.0), clock=clock)
    quiet.poll(startup_s=5.0)
    clock.now = 6.0
    status, error = quiet.poll(startup_s=5.0)
    assert status == "timeout" and "no step events" in error and "5s" in error


def test_a_meter_that_cannot_read_the_links_waits_for_steps_and_says_why():
    def broken():
        raise OSError("no such interface")

    meter = LinkMeter(broken, BytesWindow(warmup_s=1.0), clock=Clock())
    assert meter.poll(startup_s=5.0) is None and not meter.armed
    assert meter.note == "; its links' bytes could not be read either: no such interface"


def test_a_meter_only_for_a_command_without_a_step_regex_on_a_target_that_reads_its_links():
    class Reads:
        def link_counters(self, nodes):
            return {n: (0, 0) for n in nodes}

    command = JobSpec(strategy="command", model="command", warmup=2, seconds=3.0, command=UserCommand(("sh",)))
    assert meter_for(command, Reads(), ["n1", "n2", "n1"]).read() == {"n1": (0, 0), "n2": (0, 0)}
    assert meter_for(command, object(), ["n1"]) is None  # a target that cannot read them
    assert meter_for(replace(command, command=UserCommand(("sh",), 8, "x")), Reads(), ["n1"]) is None
    assert meter_for(JobSpec(), Reads(), ["n1"]) is None  # netbench's own job


# ---------------------------------------------------------------- a whole sweep, synthetic


class Silent:
    """A rank that prints nothing until it is stopped."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.stdout = self

    def readline(self) -> bytes:
        self.stopped.wait(30)
        return b""

    def wait(self) -> int:
        return -15

    def stop(self, grace: float) -> None:
        self.stopped.set()

    def failure(self, code: int) -> str | None:
        return None


class LinksTestbed(SyntheticTestbed):
    """Silent ranks; each node's link carries 1/8 of the applied rate in bytes/s, each way."""

    def __init__(self, journal) -> None:
        super().__init__(journal)
        self.ranks: list[Silent] = []
        self.rate_bytes = 0.0
        self.since = 0.0
        self.counted = 0.0

    def apply(self, run, seed: int) -> None:
        super().apply(run, seed)
        self.rate_bytes = (run.profile.rate_bps or 8e9) / 8

    def spawn(self, task, log, env):
        self.spawned.append(task)
        self.ranks.append(Silent())
        return self.ranks[-1]

    def link_counters(self, nodes):
        import time

        now = time.monotonic()
        self.counted += (now - self.since) * self.rate_bytes if self.since else 0.0
        self.since = now
        return {node: (int(self.counted), int(self.counted)) for node in nodes}


def test_a_command_that_reports_nothing_is_measured_in_bytes_point_by_point(tmp_path):
    job = JobSpec(strategy="command", model="command", batch_size=0, warmup=0, seconds=0.6,
                  command=UserCommand(argv=("python", "quiet.py")))
    runs = design.plan_sweep(Profile(name="base"), design.SweepLevels(rate_bps=(100_000_000, 10_000_000)), 1, job, 2)
    config = SweepConfig(sweep_id="s", runs=tuple(runs), job=job, workers=2, output=tmp_path / "out",
                         settle=Settle(steps=2, seconds=0.0), order_seed=3)
    testbed = LinksTestbed(Journal(tmp_path / "state"))
    results = run_sweep(config, testbed=testbed)
    assert [(r.status, r.source, r.stats) for r in results] == [("ok", "bytes", None)] * 2, results
    assert sorted(r.launch for r in results) == [0, 1] and all(rank.stopped.is_set() for rank in testbed.ranks)
    by_rate = {r.profile["rate_bps"]: r.link_bytes_per_s for r in results}
    assert by_rate[100_000_000] == pytest.approx(12.5e6, rel=0.2) and by_rate[10_000_000] == pytest.approx(1.25e6, rel=0.2)
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv", newline="")))
    assert {(r["source"], r["status"], r["images_per_sec"], r["steps"]) for r in rows} == {("bytes", "ok", "", "0")}
    assert all(float(r["link_bytes_per_s"]) > 0 for r in rows)
    record = json.loads((tmp_path / "out" / "runs" / f"{results[0].run_id}.json").read_text())
    assert record["schema_version"] == SCHEMA_VERSION and [n["node"] for n in record["link_bytes"]["nodes"]] == ["n1", "n2"]
    assert record["link_bytes"]["window_s"] >= 0.6
    # the report and the tables say these are bytes, not steps, and never show images/s for them
    from rich.console import Console

    from netbench.cli import render_bytes, render_report
    from netbench.report.load import load_observations
    from netbench.report.summary import write_report

    written = write_report(tmp_path / "out", tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Measured in bytes, not steps" in text and "bytes/s sent per node" in text
    assert (tmp_path / "report" / "linkbytes-bandwidth.png") in written.files
    console = Console(width=200, record=True)
    console.print(render_report.runs_table(load_observations(tmp_path / "out")))
    table = console.export_text()
    assert table.count("ok (bytes)") == 2 and "bytes/s sent per node (no steps)" in table
    line = render_bytes.finished_text(results[0])
    assert "measured in bytes, not steps" in line and "img/s" not in line.replace("no images/s", "")
    assert render_bytes.summary_note(results).startswith("measured in bytes, not steps")
    assert render_bytes.status_cell(results[0]) == "ok (bytes)" and render_bytes.summary_note([]) == ""


NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  999999     10    0    0    0     0          0         0   999999      10    0    0    0     0       0          0
  eth1:    1200      7    0    0    0     0          0         0     3400       9    0    0    0     0       0          0
"""


def test_hosts_read_their_interfaces_counters_over_ssh_and_a_missing_interface_names_the_host():
    from netbench.jobs.link_bytes import interface_counters
    from netbench.remote.inventory import inventory_from_mapping
    from netbench.remote.ssh import CommandResult
    from netbench.testbed.hosts import HostsTestbed
    from tests.fakes.remote import FakeHost

    assert interface_counters(NET_DEV, "eth1") == (1200, 3400) and interface_counters(NET_DEV, "eth") is None
    inventory = inventory_from_mapping({"hosts": {"a": {"ssh": "10.0.0.1", "interface": "eth1"},
                                                  "b": {"ssh": "10.0.0.2", "interface": "ens5"}}}, "hosts.yaml")
    a = FakeHost("a", [("cat /proc/net/dev", CommandResult(0, NET_DEV, ""))])
    b = FakeHost("b", [("cat /proc/net/dev", CommandResult(0, NET_DEV, ""))])
    testbed = HostsTestbed(inventory, [a, b])
    assert testbed.link_counters(["a"]) == {"a": (1200, 3400)} and a.ran("cat /proc/net/dev")
    with pytest.raises(Exception, match="host b: cannot read its interface's counters: no interface ens5"):
        testbed.link_counters(["a", "b"])


def test_links_that_cannot_be_read_leave_a_silent_job_to_time_out_saying_why(tmp_path):
    from netbench.errors import TestbedError
    from netbench.jobs.launch import Timeouts

    class Unreadable(LinksTestbed):
        def link_counters(self, nodes):
            raise TestbedError("node n1: no interface eth0")

    job = JobSpec(strategy="command", model="command", batch_size=0, warmup=0, command=UserCommand(argv=("q",)))
    runs = design.plan_sweep(Profile(name="base"), design.SweepLevels(rate_bps=(10_000_000,)), 1, job, 2)
    config = SweepConfig(sweep_id="s", runs=tuple(runs), job=job, workers=2, output=tmp_path / "out",
                         timeouts=Timeouts(startup_s=0.5))
    [result] = run_sweep(config, testbed=Unreadable(Journal(tmp_path / "state")))
    assert (result.status, result.source, result.link_bytes) == ("timeout", "track", None)
    assert result.error == "no first step within 0.5s; its links' bytes could not be read either: " \
                           "node n1: no interface eth0"
