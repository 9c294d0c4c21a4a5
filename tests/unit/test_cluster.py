"""netbench.model.job: placement of roles on nodes, TF_CONFIG, ports and argv (pure)."""

from __future__ import annotations

import ipaddress
import json

import pytest

from netbench.model.job import (JobSpec, check_job, describe_plan, images_per_step, nodes_needed, plan_job,
                                   worker_argv)
from netbench.model.topology import plan_topology

NODES = plan_topology(8, ipaddress.ip_network("10.213.7.0/24")).nodes


def flags(argv) -> dict[str, str]:
    return dict(zip(argv[3::2], argv[4::2]))


def test_allreduce_tf_config_per_worker():
    tasks = plan_job(JobSpec(), NODES, workers=3, port=23456)
    assert [t.node for t in tasks] == ["n1", "n2", "n3"]
    expected_cluster = {"worker": ["10.213.7.1:23456", "10.213.7.2:23456", "10.213.7.3:23456"]}
    for index, task in enumerate(tasks):
        config = json.loads(task.tf_config)
        assert config == {"cluster": expected_cluster, "task": {"type": "worker", "index": index}}
        assert (task.role, task.index, task.port, task.serves) == ("worker", index, 23456, False)
        assert task.netns == f"netbench-n{index + 1}"
        assert task.address == f"10.213.7.{index + 1}"


@pytest.mark.parametrize("strategy", ["allreduce", "allreduce-accum", "ps"])
def test_each_task_is_at_its_own_cluster_slot(strategy):
    tasks = plan_job(JobSpec(strategy=strategy, ps=2), NODES, workers=3, port=30000)
    for task in tasks:
        config = json.loads(task.tf_config)
        kind, index = config["task"]["type"], config["task"]["index"]
        assert config["cluster"][kind][index] == f"{task.address}:{task.port}"
    # one process per node: no two tasks share an address
    assert len({t.address for t in tasks}) == len(tasks)


def test_ps_placement_workers_then_ps_then_coordinator():
    job = JobSpec(strategy="ps", ps=1)
    tasks = plan_job(job, NODES, workers=3, port=41000)
    assert [(t.role, t.index, t.node) for t in tasks] == [
        ("worker", 0, "n1"), ("worker", 1, "n2"), ("worker", 2, "n3"), ("ps", 0, "n4"), ("coordinator", 0, "n5")]
    assert [t.serves for t in tasks] == [True, True, True, True, False]
    config = json.loads(tasks[-1].tf_config)
    assert config["task"] == {"type": "chief", "index": 0}
    assert config["cluster"] == {"worker": ["10.213.7.1:41000", "10.213.7.2:41000", "10.213.7.3:41000"],
                                 "ps": ["10.213.7.4:41000"], "chief": ["10.213.7.5:41000"]}
    assert json.loads(tasks[3].tf_config)["task"] == {"type": "ps", "index": 0}
    assert nodes_needed(job, 3) == 5 == len(tasks)
    assert all(flags(t.argv)["--strategy"] == "ps" for t in tasks)


def test_ps_with_two_parameter_servers_needs_more_nodes():
    job = JobSpec(strategy="ps", ps=2)
    assert nodes_needed(job, 2) == 5
    tasks = plan_job(job, NODES, workers=2, port=1)
    assert [t.role for t in tasks] == ["worker", "worker", "ps", "ps", "coordinator"]


def test_single_is_one_process_without_cluster():
    job = JobSpec(strategy="single")
    tasks = plan_job(job, NODES, workers=1, port=5)
    assert len(tasks) == 1 and nodes_needed(job, 1) == 1
    assert (tasks[0].role, tasks[0].node, tasks[0].tf_config) == ("worker", "n1", "")
    with pytest.raises(ValueError, match="single runs one process"):
        plan_job(job, NODES, workers=2, port=5)


@pytest.mark.parametrize("job, workers, needed", [
    (JobSpec(), 8, 8), (JobSpec(strategy="allreduce-accum"), 4, 4),
    (JobSpec(strategy="ps", ps=1), 7, 9), (JobSpec(strategy="ps", ps=3), 3, 7),
])
def test_not_enough_nodes(job, workers, needed):
    assert nodes_needed(job, workers) == needed
    if needed > len(NODES):
        with pytest.raises(ValueError, match=f"needs {needed} nodes, the testbed has 8"):
            plan_job(job, NODES, workers=workers, port=30000)
    else:
        assert len(plan_job(job, NODES, workers=workers, port=30000)) == needed


@pytest.mark.parametrize("job, workers, message", [
    (JobSpec(strategy="ring"), 2, "strategy: unknown 'ring'"),
    (JobSpec(), 0, "workers: must be at least 1"),
    (JobSpec(strategy="allreduce-accum", accum_steps=0), 2, "accum_steps: must be at least 1"),
    (JobSpec(strategy="ps", ps=0), 2, "ps: strategy ps needs at least 1"),
])
def test_check_job_names_the_setting(job, workers, message):
    with pytest.raises(ValueError, match=message):
        check_job(job, workers)


def test_argv_carries_the_job():
    job = JobSpec(model="cnn", batch_size=32, warmup=5, steps=50, seed=9)
    argv = worker_argv(job, python="/usr/bin/python3")
    assert argv[:3] == ("/usr/bin/python3", "-m", "netbench.jobs.worker")
    assert flags(argv) == {"--strategy": "allreduce", "--model": "cnn", "--batch-size": "32", "--warmup": "5",
                           "--steps": "50", "--seed": "9"}
    tasks = plan_job(job, NODES, workers=2, port=1, python="/usr/bin/python3")
    assert all(t.argv == argv for t in tasks)


def test_argv_carries_accumulation_data_shape_and_classes():
    job = JobSpec(strategy="allreduce-accum", accum_steps=8, data="/data/cifar.npz", input_shape=(32, 32, 3),
                  classes=100, seconds=2.5)
    got = flags(worker_argv(job, python="py"))
    assert got["--strategy"] == "allreduce-accum" and got["--accum-steps"] == "8"
    assert got["--data"] == "/data/cifar.npz" and got["--input-shape"] == "32x32x3" and got["--classes"] == "100"
    assert got["--seconds"] == "2.5" and "--steps" not in got
    # accum steps mean nothing to the other strategies, so they are not passed
    assert "--accum-steps" not in flags(worker_argv(JobSpec(accum_steps=8), python="py"))


def test_argv_is_accepted_by_the_worker_parser():
    from netbench.jobs import worker

    for job in (JobSpec(strategy="allreduce-accum", accum_steps=3, input_shape=(28, 28, 1), classes=5, model="cnn"),
                JobSpec(strategy="ps", seconds=3.0), JobSpec(strategy="single", model="resnet18")):
        args = worker.parse_args(list(worker_argv(job)[3:]))
        assert args.strategy == job.strategy and args.model == job.model


@pytest.mark.parametrize("job, workers, images", [
    (JobSpec(batch_size=32), 3, 96),
    (JobSpec(strategy="allreduce-accum", batch_size=32, accum_steps=4), 3, 384),
    (JobSpec(strategy="ps", batch_size=32), 3, 32),
    (JobSpec(strategy="single", batch_size=32), 1, 32),
])
def test_images_per_step(job, workers, images):
    assert images_per_step(job, workers) == images


def test_describe_plan_shows_every_role_and_node():
    lines = describe_plan(plan_job(JobSpec(strategy="ps"), NODES, workers=2, port=0))
    assert lines == ["worker0 on n1 (10.213.7.1:<port>), serves", "worker1 on n2 (10.213.7.2:<port>), serves",
                     "ps0 on n3 (10.213.7.3:<port>), serves", "coordinator0 on n4 (10.213.7.4:<port>), reports steps"]
