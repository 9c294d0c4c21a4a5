"""A CPU limit or step delay on a node that holds none of the job's processes would be applied
nowhere but recorded (results.csv's cpus_<node>, the point's name): refused in one line naming
the flag, the playbook file and key, or the schedule file and step, before anything is applied
(the sweep's checks run before its dry run returns, and a dry run applies nothing)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from netbench.cli import app
from netbench.errors import UsageError
from netbench.model import compute as cm
from netbench.model.playbook import playbook_from_mapping

TOPOLOGY = """name: four
groups: {eu: [n1, n2], us: [n3, n4]}
links: {eu-us: {delay: 40ms}}
compute:
  n4: {cpus: 0.5}
"""
SCHEDULE = """name: late
steps:
  - {at: 1s, delay: 5ms}
  - {at: 2s, node: n3, cpus: 0.25}
"""


def sweep(tmp_path, monkeypatch, *args: str):
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(app.main, ["sweep", *args, "--dry-run"])


def error_line(result) -> str:
    assert result.exit_code == 2, result.output
    return result.output.strip().splitlines()[0]


@pytest.mark.parametrize("args, flag, node, span", [
    (["--latency", "1ms", "--cpus", "n3=0.5"], "--cpus", "n3", "n1-n2"),  # 2 workers on n1, n2
    (["--latency", "1ms", "--workers", "4", "--ranks-per-node", "2", "--cpus", "n3=0.5"], "--cpus", "n3", "n1-n2"),
    (["--latency", "1ms", "--workers", "4", "--ranks-per-node", "2", "--step-delay", "n4=0,40ms"], "--step-delay",
     "n4", "n1-n2"),
    (["--latency", "1ms", "--strategy", "single", "--workers", "1", "--cpus", "n2=0.5"], "--cpus", "n2", "n1"),
])
def test_a_flags_limit_on_a_node_without_a_process_is_refused_naming_the_flag(tmp_path, monkeypatch, args, flag,
                                                                               node, span):
    line = error_line(sweep(tmp_path, monkeypatch, *args))
    assert f"flag {flag}: {node} holds none of the job's processes (they run on {span})" in line, line
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())  # nothing made


def test_a_limit_on_a_server_s_node_or_on_every_node_is_kept(tmp_path, monkeypatch):
    for args in (["--strategy", "ps-sync", "--cpus", "n3=0.5"],  # n3 holds the parameter server
                 ["--workers", "4", "--ranks-per-node", "2", "--cpus", "0.5"]):  # every node: n1 and n2
        result = sweep(tmp_path, monkeypatch, "--latency", "1ms", *args)
        assert result.exit_code == 0, result.output


def test_a_schedule_step_and_a_topology_file_name_their_file_and_place(tmp_path, monkeypatch):
    (tmp_path / "late.yaml").write_text(SCHEDULE)
    (tmp_path / "four.yaml").write_text(TOPOLOGY)
    line = error_line(sweep(tmp_path, monkeypatch, "--latency", "1ms", "--schedule", "late.yaml"))
    assert line.startswith("error: flag --schedule: late.yaml: step 2: node: n3 holds none of the job's processes "
                           "(they run on n1-n2)"), line
    line = error_line(sweep(tmp_path, monkeypatch, "--topology", "four.yaml", "--workers", "2"))
    assert "four.yaml: compute.n4: n4 holds none of the job's processes (they run on n1-n2)" in line, line
    assert sweep(tmp_path, monkeypatch, "--topology", "four.yaml", "--workers", "4").exit_code == 0


def test_apply_refuses_a_schedule_that_limits_a_node(tmp_path, monkeypatch):
    """`netbench apply --schedule` starts no process: a step's cpus would change nothing."""
    (tmp_path / "late.yaml").write_text(SCHEDULE)
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    line = error_line(CliRunner().invoke(app.main, ["apply", "--schedule", "late.yaml", "--dry-run"]))
    assert "late.yaml: step 2: node: a node's cpus and step_delay slow a sweep's processes, and 'netbench apply' " \
           "starts none" in line, line


def test_a_playbook_names_its_factor_its_schedule_step_or_its_topology(tmp_path):
    with pytest.raises(UsageError, match=r"^pb.yaml: factors.cpus.n3: n3 holds none of the job's processes "
                                         r"\(they run on n1-n2\)"):
        playbook_from_mapping({"factors": {"workers": [3, 2], "cpus": {"n3": [0.5]}}}, "pb.yaml")
    with pytest.raises(UsageError, match=r"^pb.yaml: factors.step_delay.n3: n3 holds none"):
        playbook_from_mapping({"factors": {"step_delay": {"n3": ["40ms"]}},
                               "fixed": {"workers": 4, "ranks_per_node": 2}}, "pb.yaml")
    (tmp_path / "late.yaml").write_text(SCHEDULE)
    with pytest.raises(UsageError, match=r"^pb.yaml: schedule: .*late.yaml: step 2: node: n3 holds none"):
        playbook_from_mapping({"schedule": "late.yaml"}, "pb.yaml", base_dir=tmp_path)
    (tmp_path / "four.yaml").write_text(TOPOLOGY)
    with pytest.raises(UsageError, match=r"^pb.yaml: topology: .*four.yaml: compute.n4: n4 holds none"):
        playbook_from_mapping({"topology": "four.yaml", "fixed": {"workers": 2}}, "pb.yaml", base_dir=tmp_path)
    # a point whose processes are on every node it limits loads
    playbook_from_mapping({"factors": {"workers": [3], "cpus": {"n3": [0.5]}}}, "pb.yaml")
    playbook_from_mapping({"schedule": "late.yaml", "fixed": {"workers": 3}}, "pb.yaml", base_dir=tmp_path)


def test_the_rule_itself():
    assert [cm.holds_none(n, 2) for n in ("n1", "n2", "n3", cm.ALL)] == [False, False, True, False]
    assert cm.unplaced(cm.NONE.set("n2", cpus=0.5).set("n5", step_delay_s=0.01), 4) == ("step_delay", "n5")
    assert cm.unplaced(cm.NONE.set("n2", cpus=0.5), 2) is None


def test_a_step_delay_under_tensorflows_ps_is_refused_where_it_would_be_ignored(tmp_path, monkeypatch):
    # TensorFlow's parameter-server training steps inside its own servers, which run no loop of
    # netbench's: the delay would be recorded and never added (a sweep with n1=700ms measured
    # the same images/s as without it); a CPU limit there is a cgroup and is kept
    line = error_line(sweep(tmp_path, monkeypatch, "--strategy", "ps", "--ps", "1", "--workers", "1",
                            "--latency", "1ms", "--step-delay", "n1=0,700ms"))
    assert line == ("error: setting step_delay: strategy ps steps inside TensorFlow's own servers, where netbench "
                    "cannot add compute time (n1)"), line
    result = sweep(tmp_path, monkeypatch, "--strategy", "ps", "--ps", "1", "--workers", "1", "--latency", "1ms",
                   "--cpus", "n1=0.5")
    assert result.exit_code == 0, result.output
    book = tmp_path / "ps.yaml"
    book.write_text("name: ps-delay\nfactors: {latency: [1ms]}\nfixed: {strategy: ps, ps: 1, workers: 1, "
                    "step_delay: {n1: 20ms}}\nsteps: 3\n")
    result = CliRunner().invoke(app.main, ["run", str(book), "--dry-run"])
    assert result.exit_code == 2 and "setting step_delay: strategy ps" in result.output, result.output
