"""Several ranks per node: placement, each rank's environment, refusals and the collectives'
inter-node bytes (model/ranks.py, model/job.py, model/command_job.py; pure)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from netbench.cli.app import main
from netbench.jobs import events as ev
from netbench.jobs import resources
from netbench.jobs.torch_harness import collectives, rendezvous
from netbench.model import ranks, topology
from netbench.model.command_job import UserCommand
from netbench.model.job import JobSpec, check_job, command_spec, nodes_needed, plan_job, worker_argv
from netbench.remote.inventory import inventory_from_mapping
from netbench.testbed.hosts import host_node, place_hosts

NODES = topology.plan_topology(3, topology.choose_subnet([])).nodes
TORCH = JobSpec(framework="torch", ranks_per_node=2)


def _env(task) -> dict[str, str]:
    return dict(task.env)


def test_ranks_go_node_major_with_a_port_block_each_on_their_node():
    tasks = plan_job(TORCH, NODES, 4, port=20000)
    assert nodes_needed(TORCH, 4) == 2
    assert [(t.index, t.node, t.local_rank, t.port) for t in tasks] == [
        (0, "n1", 0, 20000), (1, "n1", 1, 20003), (2, "n2", 0, 20000), (3, "n2", 1, 20003)]
    cluster = json.loads(tasks[3].tf_config)["cluster"]["worker"]
    a, b = NODES[0].address, NODES[1].address
    assert cluster == [f"{a}:20000", f"{a}:20003", f"{b}:20000", f"{b}:20003"]  # R tasks per node
    assert json.loads(tasks[3].tf_config)["task"] == {"type": "worker", "index": 3}


def test_every_built_in_rank_gets_its_local_and_node_variables_and_ncclss():
    tasks = plan_job(TORCH, NODES, 4, port=20000)
    env = _env(tasks[3])
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("3", "4", "1", "2")
    assert (env["GROUP_RANK"], env["NODE_RANK"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("1", "1", "2", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (NODES[0].address, "20000")
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == NODES[1].ifname
    assert env["NCCL_IB_DISABLE"] == "1"
    # one host identity per node: the ranks of n2 share one, n1's differ from it
    assert env["NCCL_HOSTID"] == _env(tasks[2])["NCCL_HOSTID"] != _env(tasks[0])["NCCL_HOSTID"]
    assert "TF_CONFIG" not in env  # it travels as Task.tf_config, one value
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_a_user_command_rank_sees_the_same_variables_and_a_tf_config_of_r_tasks_per_node():
    job = command_spec(JobSpec(ranks_per_node=2, gpus_per_node=2), UserCommand(argv=("python", "train.py")), 4)
    tasks = plan_job(job, NODES, 4, port=30000)
    assert [(t.index, t.node, t.command) for t in tasks] == [(0, "n1", True), (1, "n1", True), (2, "n2", True),
                                                             (3, "n2", True)]
    env = _env(tasks[1])
    assert (env["LOCAL_RANK"], env["NODE_RANK"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("1", "0", "2", "2")
    workers = json.loads(env["TF_CONFIG"])["cluster"]["worker"]
    assert [w.rsplit(":", 1)[1] for w in workers] == ["30001", "30004", "30001", "30004"]
    # the embedded testbed shares one machine's GPUs: each node its own two
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and _env(tasks[2])["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == NODES[0].ifname


def test_torchrun_starts_once_per_node_and_starts_the_node_s_ranks_itself():
    for argv in (("torchrun", "train.py"), ("sh", "examples/torchrun.sh"), ("python", "-m", "torch.distributed.run")):
        job = command_spec(JobSpec(ranks_per_node=2), UserCommand(argv=argv), 4)
        tasks = plan_job(job, NODES, 4, port=30000)
        assert [(t.index, t.node) for t in tasks] == [(0, "n1"), (2, "n2")], argv
        env = _env(tasks[1])
        assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["PET_NODE_RANK"]) == ("2", "2", "1")
    plain = plan_job(command_spec(JobSpec(ranks_per_node=2), UserCommand(argv=("python", "t.py")), 4), NODES, 4, 1)
    assert len(plain) == 4


def test_hosts_of_their_own_get_gpus_from_zero_and_no_host_identity():
    inv = inventory_from_mapping({"defaults": {"interface": "eth1", "venv": "/opt/nb"},
                                  "hosts": {"a": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1"},
                                            "b": {"ssh": "10.0.0.2", "tf_address": "10.9.0.2"}}}, "inv.yaml")
    job = JobSpec(framework="torch", ranks_per_node=2, gpus_per_node=2)
    hosts = place_hosts(inv, job, 4)
    assert [h.name for h in hosts] == ["a", "b"]  # one host per node of ranks
    tasks = plan_job(job, tuple(host_node(h) for h in hosts), 4, port=20000)
    assert [t.node for t in tasks] == ["a", "a", "b", "b"]
    env = _env(tasks[3])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and "NCCL_HOSTID" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "eth1"


@pytest.mark.parametrize("job, workers, message", [
    (JobSpec(ranks_per_node=2), 3, "ranks_per_node: 3 workers do not fill nodes of 2 ranks"),
    (JobSpec(strategy="ps-sync", ranks_per_node=2), 4, "ranks_per_node: strategy ps-sync runs one process per node"),
    (JobSpec(collective="hierarchical", ranks_per_node=2), 4, "collective: hierarchical runs the torch workload"),
    (JobSpec(framework="torch", collective="hierarchical"), 4, "collective: hierarchical needs ranks_per_node"),
    (JobSpec(device="cuda"), 2, "device: cuda runs the torch workload"),
    (JobSpec(framework="torch", device="cuda", ranks_per_node=2, gpus_per_node=1), 4, "gpus_per_node: 1 GPUs for 2"),
])
def test_refusals_name_the_setting(job, workers, message):
    with pytest.raises(ValueError, match=message):
        check_job(job, workers)


def test_the_sweep_refuses_a_remainder_in_one_line_with_a_hint():
    result = CliRunner().invoke(main, ["sweep", "--workers", "3", "--ranks-per-node", "2", "--dry-run"])
    assert result.exit_code == 2
    assert "flag --ranks-per-node: 3 workers do not fill nodes of 2 ranks" in result.output
    assert "--workers 4 --ranks-per-node 2" in result.output and "Traceback" not in result.output


def test_a_dry_run_prints_the_placement():
    result = CliRunner().invoke(main, ["sweep", "--framework", "torch", "--workers", "4", "--ranks-per-node", "2",
                                       "--collective", "hierarchical", "--latency", "1ms", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "worker1 on n1" in result.output and "local rank 1" in result.output and "worker2 on n2" in result.output
    assert "ranks: 4, 2 per node on 2 nodes" in result.output and "collective: hierarchical" in result.output


def test_the_torch_workers_argv_carries_the_collective_and_device():
    argv = worker_argv(JobSpec(framework="torch", collective="hierarchical", device="cuda", ranks_per_node=2))
    assert argv[argv.index("--collective") + 1] == "hierarchical" and argv[argv.index("--device") + 1] == "cuda"
    assert "--collective" not in worker_argv(JobSpec(framework="torch"))


def test_a_torch_rank_finds_its_local_rank_in_tf_config_and_in_the_environment():
    cluster = ["10.0.0.1:1", "10.0.0.1:4", "10.0.0.2:1", "10.0.0.2:4"]
    where = rendezvous.from_tf_config(json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker",
                                                                                           "index": 3}}))
    assert (where.rank, where.local_rank, where.local_world, where.address) == (3, 1, 2, "10.0.0.2")
    env = rendezvous.torch_env(where, "eth0")
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "2")
    given = rendezvous.from_environment({"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "LOCAL_RANK": "0",
                                         "LOCAL_WORLD_SIZE": "2", "NETBENCH_ADDRESS": "10.0.0.2"})
    assert (given.local_rank, given.local_world, given.address) == (0, 2, "10.0.0.2")


def test_node_groups_are_node_major_and_refuse_a_remainder():
    assert collectives.node_groups(4, 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError):
        collectives.node_groups(5, 2)


def test_expected_inter_node_bytes_of_the_ring_and_the_hierarchy():
    size = 1_000_000
    # 2 nodes x 2 ranks: the ring sends 2 (4 - 1) / 4 = 1.5 x the buffer per node, the leaders' ring 1 x
    assert ranks.internode_bytes("ring", 2, 2, size) == pytest.approx(1.5 * size)
    assert ranks.internode_bytes("hierarchical", 2, 2, size) == pytest.approx(1.0 * size)
    assert ranks.internode_bytes("hierarchical", 2, 2, size) / ranks.internode_bytes("ring", 2, 2, size) == \
        pytest.approx(2 / 3)
    # one rank per node: both are the plain ring; one node: nothing crosses a link
    assert ranks.internode_bytes("ring", 4, 1, size) == ranks.internode_bytes("hierarchical", 4, 1, size)
    assert ranks.internode_bytes("ring", 1, 4, size) == 0.0
    assert ranks.internode_bytes("ring", 4, 8, size) == pytest.approx(2 * 31 / 32 * size)
    assert ranks.bytes_agree(1.05 * size, size) and not ranks.bytes_agree(1.2 * size, size)


def test_a_node_s_bytes_are_counted_once_though_each_of_its_ranks_reads_them():
    def sample(worker, t, tx):
        return ev.Resources(time=t, cpu_s=t, rss_bytes=1, rx_bytes=tx, tx_bytes=tx, worker=worker, role="worker")

    events = [sample(w, t, 1000 * t) for w in range(4) for t in (0, 1)]
    assert resources.totals(resources.summarise(events, ranks_per_node=2))["net_tx_bytes"] == 2000
    assert resources.totals(resources.summarise(events))["net_tx_bytes"] == 4000


def test_a_node_s_link_bytes_per_step_come_from_its_first_rank_s_window():
    from netbench.jobs import link_check

    def step(worker, k):
        return ev.Step(step=k, phase=ev.PHASE_MEASURED, start=10.0 + k, end=11.0 + k, duration=1.0, worker=worker,
                       role="worker")

    def sample(worker, t, tx):
        return ev.Resources(time=t, cpu_s=t, rss_bytes=1, rx_bytes=tx // 2, tx_bytes=tx, worker=worker, role="worker")

    # node 0 (worker 0) sends 1000 bytes a second over 10 one-second steps; worker 1 (same node) is not read
    events = [step(w, k) for w in range(4) for k in range(10)]
    events += [sample(w, t, int(1000 * t)) for w in (0, 1) for t in (9.0, 10.5, 19.5, 21.0)]
    events += [sample(2, t, int(3000 * t)) for t in (10.5, 19.5)]
    found = link_check.node_bytes(events, ranks_per_node=2)
    assert [(n.node, round(n.tx_per_step), round(n.rx_per_step), n.steps) for n in found] == [
        (0, 1000, 500, 9.0), (1, 3000, 1500, 9.0)]
    expected = link_check.expected_per_step("ring", 2, 2, 2000.0)  # 1.5 x 2000
    assert expected == 3000.0
    assert link_check.compare(found, expected) == ["node 0: 1,000 bytes sent per step, expected 3,000"]


def test_the_step_model_prices_loopback_hops_at_the_measured_cost_and_links_at_the_configured():
    from netbench.model import step_model

    base = dict(strategy="allreduce", workers=4, model_bytes=2_000_000, compute_s=0.01, delay_s=0.02,
                rate_bps=100e6, overhead_s=0.001, beta_s_per_byte=1e-9)
    flat = step_model.StepInputs(**base)  # 4 nodes of 1: every hop a link
    ring = step_model.StepInputs(**base, ranks_per_node=2)
    hier = step_model.StepInputs(**base, ranks_per_node=2, collective="hierarchical")
    wire = step_model._wire(ring)  # seconds per payload byte at 100 mbit, headers included
    assert wire == pytest.approx(8 / 100e6, rel=0.06)
    # 2 nodes x 2 ranks, ring: 6 transfers, half of them crossing a link (a 40 ms round trip each)
    assert step_model.allreduce_s(ring) == pytest.approx(0.001 + 3 * 0.04 + 1.5 * 2_000_000 * wire)
    assert step_model.allreduce_s(flat) == pytest.approx(0.001 + 6 * 0.04 + 1.5 * 2_000_000 * wire)
    # hierarchical: the leaders' ring (2 round trips, 1x the bytes), reduce and broadcast inside
    assert step_model.allreduce_s(hier) == pytest.approx(3 * 0.001 + 2 * 0.04 + (1e-9 + wire) * 2_000_000)
    assert step_model.predict(hier).step_s < step_model.predict(ring).step_s < step_model.predict(flat).step_s
    assert step_model.predict(hier).floor_s == pytest.approx(0.01 + 2_000_000 * wire)


def test_calibrations_are_keyed_by_the_placement():
    from netbench.experiment import predict

    assert predict.collective_key(4) == 4 and predict.collective_key(4, 2) == "4x2"
    assert predict.job_key(TORCH, 4).endswith("/w4r2") and predict.job_key(JobSpec(), 4).endswith("/w4")
    nodes = NODES[:2]
    tasks = predict._compute_tasks(TORCH, nodes, 4, port=20000)
    assert [t.node for t in tasks] == ["n1", "n1", "n2", "n2"]  # the CPU shared as the run shares it


def test_a_playbook_crosses_the_collective_on_nodes_of_two_ranks(tmp_path):
    from netbench.model.design import expand
    from netbench.model.playbook import PlaybookError, load_playbook

    book = tmp_path / "ranks.yaml"
    book.write_text("factors:\n  collective: [ring, hierarchical]\nfixed:\n  framework: torch\n  workers: 4\n"
                    "  ranks_per_node: 2\n  latency: 20ms\n")
    runs = expand(load_playbook(book), seed=1)
    assert sorted((r.job.collective, r.job.ranks_per_node, r.workers, r.settings.nodes) for r in runs) == [
        ("hierarchical", 2, 4, 2), ("ring", 2, 4, 2)]
    bad = tmp_path / "bad.yaml"
    bad.write_text("factors:\n  workers: [3]\nfixed:\n  ranks_per_node: 2\n")
    with pytest.raises(PlaybookError, match="fixed.ranks_per_node: 3 workers do not fill nodes of 2 ranks"):
        expand(load_playbook(bad), seed=1)


def test_a_launcher_s_children_are_read_as_the_ranks_they_say():
    from netbench.jobs.launch import sender

    job = command_spec(JobSpec(ranks_per_node=2), UserCommand(argv=("torchrun", "t.py")), 4)
    node2 = plan_job(job, NODES, 4, port=30000)[1]  # once per node: rank 2's task starts ranks 2 and 3
    step = ev.Step(step=0, start=0.0, end=1.0, duration=1.0, extra=(("rank", 3),))
    assert sender(step, node2) == 3
    assert sender(ev.start_event(3, 4, 1, 0.0, "", "command", 0, 8), node2) == 3
    assert sender(ev.Step(step=0, start=0.0, end=1.0, duration=1.0), node2) == 2  # says none: the task's
    builtin = plan_job(TORCH, NODES, 4, port=30000)[2]
    assert sender(step, builtin) == 2  # netbench's own workers are their tasks


def test_cuda_hands_every_rank_a_gpu_of_its_own_unless_told_otherwise():
    from netbench.cli.ranks import with_ranks

    job = with_ranks(JobSpec(framework="torch"), 4, 2, "ring", "cuda", 0)
    assert job.gpus_per_node == 2
    env = [dict(t.env)["CUDA_VISIBLE_DEVICES"] for t in plan_job(job, NODES, 4, port=20000)]
    assert env == ["0,1", "0,1", "2,3", "2,3"]


def test_the_sweep_refuses_cuda_where_torch_has_none():
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = CliRunner().invoke(main, ["sweep", "--framework", "torch", "--device", "cuda", "--latency", "1ms"])
    assert result.exit_code == 2 and "flag --device: cuda, but torch.cuda is not available here" in result.output
    assert "Traceback" not in result.output


def test_torch_s_ddp_all_reduces_its_buckets_tensorflow_one_pack():
    from netbench.model.frameworks import allreduce_buckets

    assert allreduce_buckets("tensorflow", 100 * 2**20) == 1
    assert allreduce_buckets("torch", 2_678_824) == 2  # the mlp: a 1 MiB bucket, then the rest
    assert allreduce_buckets("torch", 2**20) == 1 and allreduce_buckets("torch", 2**20 + 25 * 2**20 + 1) == 3
