"""Several ranks per node: every place that names a rank's node maps it through
model/ranks.py's node-major placement (rank r on node r // R): the straggler's name in the
results, the live `node` label, and the step model's per-rank CPU and step-delay terms."""

from __future__ import annotations

import ipaddress
from types import SimpleNamespace

from netbench.experiment import predict
from netbench.experiment.runner import make_result, worker_nodes
from netbench.jobs import events as ev
from netbench.jobs.launch import JobOutcome
from netbench.metrics.state import MetricsObserver, MetricsState
from netbench.model import compute as cm
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.model.run import Run
from netbench.model.topology import plan_topology

TOPOLOGY = plan_topology(2, ipaddress.ip_network("10.213.0.0/24"))  # n1, n2
FOUR_ON_TWO = JobSpec(strategy="allreduce", batch_size=8, ranks_per_node=2)


def test_rank_nodes_is_the_node_major_placement_plan_job_uses():
    from netbench.model.ranks import rank_node, rank_nodes, rank_places

    assert rank_nodes(("n1", "n2"), 4, 2) == ("n1", "n1", "n2", "n2")
    assert rank_nodes(("n1", "n2", "n3"), 3, 1) == ("n1", "n2", "n3")
    assert rank_nodes(("n1",), 4, 2) == ("n1", "n1")  # ranks past the nodes given are left out
    assert [rank_node(p.rank, 2) for p in rank_places(6, 2)] == [p.node for p in rank_places(6, 2)]


def run_of(job: JobSpec, workers: int, compute=cm.NONE) -> Run:
    return Run(index=0, profile=Profile(name="lan"), repeat=0, job=job, workers=workers, compute=compute)


def test_the_straggler_of_four_ranks_on_two_nodes_is_named_by_its_node():
    """Ranks 2 and 3 (node n2) compute longest: the others wait for n2, not for "worker2"."""
    testbed = SimpleNamespace(nodes_for=lambda job, workers: TOPOLOGY.nodes)
    run = run_of(FOUR_ON_TWO, 4)
    assert worker_nodes(testbed, run) == ("n1", "n1", "n2", "n2")
    events = []
    for k in range(6):
        for rank, compute in enumerate((0.05, 0.06, 0.2, 0.19)):
            events.append(ev.Step(step=k, phase="measured", duration=0.25, compute=compute, comm=0.25 - compute,
                                  worker=rank))
    result = make_result(run, "tbf", JobOutcome("ok", tuple(events)), 0.0, 1.0, nodes=worker_nodes(testbed, run))
    record = result.stragglers
    assert (record["straggler"], record["straggler_node"]) == (2, "n2")
    assert [r["node"] for r in record["ranks"]] == ["n1", "n1", "n2", "n2"]
    assert result.csv_row()["straggler"] == "n2"


def test_the_live_node_label_follows_the_ranks_placement():
    state = MetricsState(clock=lambda: 1000.0)
    observer = MetricsObserver(state)
    run = run_of(FOUR_ON_TWO, 4)
    config = SimpleNamespace(sweep_id="s", runs=(run,), workers=4, job=FOUR_ON_TWO)
    observer.sweep_started(config, SimpleNamespace(name="tbf"), TOPOLOGY)
    observer.run_started(run)
    assert state.snapshot().rank_nodes == {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}
    from netbench.metrics.collector import NetbenchCollector

    for rank in range(4):
        observer.step(run, ev.Step(step=0, phase="measured", duration=0.1, compute=0.05, worker=rank))
    labels = {(s.labels["rank"], s.labels["node"]) for family in NetbenchCollector(state, None).collect()
              if family.name == "netbench_rank_step_seconds" for s in family.samples}
    assert labels == {("0", "n1"), ("1", "n1"), ("2", "n2"), ("3", "n2")}


def test_the_prediction_puts_each_rank_on_its_node_sharing_the_nodes_quota():
    """--cpus n2=0.5 with 4 ranks on 2 nodes: ranks 2 and 3 share n2's half core (each kept a
    core busy unlimited: 4x slower); --step-delay n1=40ms delays ranks 0 and 1."""
    limited = run_of(FOUR_ON_TWO, 4, cm.NONE.set("n2", cpus=0.5).set("n1", step_delay_s=0.04))
    terms = predict._node_terms(limited, 4)
    assert terms["node_slowdown"] == (1.0, 1.0, 4.0, 4.0)
    assert terms["node_delay_s"] == (0.04, 0.04, 0.0, 0.0)
    one_each = run_of(JobSpec(strategy="allreduce"), 2, cm.NONE.set("n2", cpus=0.5))
    assert predict._node_terms(one_each, 2)["node_slowdown"] == (1.0, 2.0)  # one rank a node: as before
    assert cm.worker_terms(cm.NONE.set("n2", cpus=0.5), 4, ranks_per_node=2) == ((1.0, 1.0, 4.0, 4.0),
                                                                                 (0.0, 0.0, 0.0, 0.0))
