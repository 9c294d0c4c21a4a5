"""netbench.jobs.cluster: the TF_CONFIG and argv each worker gets."""

from __future__ import annotations

import ipaddress
import json

import pytest

from netbench.jobs.cluster import JobSpec, plan_allreduce, worker_argv
from netbench.testbed.topology import plan_topology

NODES = plan_topology(4, ipaddress.ip_network("10.213.7.0/24")).nodes


def test_tf_config_per_worker():
    tasks = plan_allreduce(JobSpec(), NODES, workers=3, port=23456)
    assert [t.node for t in tasks] == ["n1", "n2", "n3"]
    expected_cluster = {"worker": ["10.213.7.1:23456", "10.213.7.2:23456", "10.213.7.3:23456"]}
    for index, task in enumerate(tasks):
        config = json.loads(task.tf_config)
        assert config == {"cluster": expected_cluster, "task": {"type": "worker", "index": index}}
        assert (task.role, task.index, task.port) == ("worker", index, 23456)
        assert task.netns == f"netbench-n{index + 1}"
        assert task.address == f"10.213.7.{index + 1}"


def test_each_worker_is_at_its_own_cluster_slot():
    tasks = plan_allreduce(JobSpec(), NODES, workers=4, port=30000)
    for task in tasks:
        config = json.loads(task.tf_config)
        assert config["cluster"]["worker"][config["task"]["index"]] == f"{task.address}:{task.port}"


def test_too_many_workers():
    with pytest.raises(ValueError, match="5 workers need 5 nodes"):
        plan_allreduce(JobSpec(), NODES, workers=5, port=30000)


def test_argv_carries_the_job():
    job = JobSpec(model="cnn", batch_size=32, warmup=5, steps=50, seed=9)
    argv = worker_argv(job, python="/usr/bin/python3")
    assert argv[:3] == ("/usr/bin/python3", "-m", "netbench.jobs.worker")
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {"--model": "cnn", "--batch-size": "32", "--warmup": "5", "--steps": "50", "--seed": "9"}
    tasks = plan_allreduce(job, NODES, workers=2, port=1, python="/usr/bin/python3")
    assert all(t.argv == argv for t in tasks)
