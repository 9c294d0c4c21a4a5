"""The exchange strategies' pure parts: the wire frames, the parameter server's barrier and
staleness gate, the elastic, gossip and averaging arithmetic, placement, and the accuracy
summary of a run's evaluations."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random

import numpy as np
import pytest

from netbench.jobs import accuracy, algorithms, exchange
from netbench.jobs import events as ev
from netbench.model import job as job_module
from netbench.model.job import JobSpec, check_job, describe_algorithm, nodes_needed, plan_job, worker_argv
from netbench.model.topology import Node


TOKEN = "a-runs-token"  # the run's exchange token (the controller gives every role a fresh one)


def roundtrip(message: exchange.Message) -> exchange.Message:
    return exchange.decode(io.BytesIO(exchange.encode(message)).read)


def test_a_frame_carries_op_meta_and_arrays_exactly():
    arrays = (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([7], dtype=np.int64), np.zeros((0,), np.float32))
    back = roundtrip(exchange.Message(exchange.PUSH, {"worker": 1, "version": 5}, arrays))
    assert back.op == exchange.PUSH and back.meta == {"worker": 1, "version": 5}
    assert [a.dtype for a in back.arrays] == [a.dtype for a in arrays]
    for got, sent in zip(back.arrays, arrays):
        np.testing.assert_array_equal(got, sent)
    assert back.payload_bytes == 12 * 4 + 8


def test_frames_follow_each_other_on_one_stream_and_the_end_is_eof():
    stream = io.BytesIO(exchange.encode(exchange.Message(exchange.HELLO)) + exchange.encode(exchange.Message(exchange.BYE)))
    assert [exchange.decode(stream.read).op for _ in range(2)] == [exchange.HELLO, exchange.BYE]
    with pytest.raises(EOFError):
        exchange.decode(stream.read)


@pytest.mark.parametrize("tamper", [
    lambda f: f[:4] + b"{not json" + f[4 + len(b"{not json"):],
    lambda f: (2**31).to_bytes(4, "big") + f[4:],
])
def test_an_unreadable_frame_is_a_protocol_error(tamper):
    frame = tamper(exchange.encode(exchange.Message(exchange.PULL, {"worker": 0})))
    with pytest.raises(exchange.ProtocolError):
        exchange.decode(io.BytesIO(frame).read)


def test_a_frame_never_unpickles_objects():
    header = json.dumps({"op": "push", "arrays": [["object", [1]]]}).encode()
    with pytest.raises(exchange.ProtocolError):
        exchange.decode(io.BytesIO(len(header).to_bytes(4, "big") + header + b"x" * 8).read)
    with pytest.raises(exchange.ProtocolError):
        exchange.encode(exchange.Message("push", {}, (np.array(["a"], dtype=object),)))


def test_a_stream_cut_inside_a_frame_is_not_a_clean_end():
    frame = exchange.encode(exchange.Message(exchange.PUSH, {}, (np.ones(100, np.float32),)))
    data = io.BytesIO(frame[:-10])
    read = exchange.exact_reader(data.readinto)
    with pytest.raises(EOFError, match="into a frame"):
        exchange.decode(read)


def test_variables_shard_round_robin_over_servers_and_join_back():
    arrays = [np.full(2, i, np.float32) for i in range(5)]
    shards = exchange.split_by_shard(arrays, 2)
    assert [[int(a[0]) for a in s] for s in shards] == [[0, 2, 4], [1, 3]]
    assert [int(a[0]) for a in exchange.join_shards(shards, 5)] == [0, 1, 2, 3, 4]


def state(mode: str, workers: int = 2, staleness: int = 1) -> algorithms.ServerState:
    s = algorithms.ServerState(mode=mode, workers=workers, learning_rate=0.5, staleness=staleness, alpha=0.25)
    s.initialise([np.zeros(2, np.float32)])
    return s


def test_bsp_applies_a_rounds_gradients_once_together_and_holds_reads_until_then():
    s = state(algorithms.SYNC)
    assert s.push(0, 0, [np.array([2.0, 0.0], np.float32)]) == 0
    assert not s.may_read(0) and s.version == 0  # the barrier: worker 1 has not pushed
    assert s.push(1, 0, [np.array([0.0, 4.0], np.float32)]) == 0
    assert s.may_read(0) and s.may_read(1) and s.version == 1
    np.testing.assert_allclose(s.weights[0], [-0.5, -1.0])  # lr x the mean gradient


@pytest.mark.parametrize("mode", [algorithms.ASYNC, algorithms.SSP])
def test_asp_and_ssp_warm_up_in_lockstep_so_the_measured_steps_start_together(mode):
    """A worker that starts late (its TensorFlow import on a busy machine) must not find the
    other's measured steps over: in the warm-up (2 pushes) a reply waits for every worker's push
    of that step; after it ps-async answers at once and ps-ssp keeps its gate of S."""
    s = algorithms.ServerState(mode=mode, workers=2, learning_rate=0.5, staleness=3, warmup=2)
    s.initialise([np.zeros(2, np.float32)])
    s.push(0, 0, [np.ones(2, np.float32)])
    assert not s.may_read(0) and s.holding(0) == [1]  # worker 1 has not pushed its first step
    s.push(1, 0, [np.ones(2, np.float32)])
    assert s.may_read(0) and s.may_read(1)
    s.push(0, 2, [np.ones(2, np.float32)])
    assert not s.may_read(0) and s.holding(0) == [1]  # the last warm-up step waits too
    s.push(1, 2, [np.ones(2, np.float32)])
    for _ in range(3):  # measured: worker 0 goes on alone (ps-ssp: up to S = 3 ahead)
        s.push(0, s.version, [np.ones(2, np.float32)])
        assert s.may_read(0) and s.holding(0) == []
    s.push(0, s.version, [np.ones(2, np.float32)])
    assert s.may_read(0) == (mode == algorithms.ASYNC)
    s.leave(1)  # a worker that is done holds nobody back, in the warm-up either
    late = algorithms.ServerState(mode=mode, workers=2, warmup=2)
    late.initialise([np.zeros(2, np.float32)])
    late.push(0, 0, [np.ones(2, np.float32)])
    late.leave(1)
    assert late.may_read(0)


def test_a_servers_hello_is_answered_once_every_worker_said_hello_or_names_the_missing_one():
    """Every worker starts its first step together: the hello of worker 0 (with the weights) is
    answered only once worker 1's came; a worker that never comes is named after first_s."""
    import threading

    from netbench.jobs.harness import param_server
    from netbench.jobs.harness.peers import Channel, Listener, RemoteError

    for first_s, third in ((None, False), (0.5, True)):
        s = algorithms.ServerState(mode=algorithms.ASYNC, workers=3 if third else 2)
        listener = Listener("127.0.0.1", 0, param_server.make_handler(s, threading.Condition(), first_s=first_s),
                            TOKEN)
        address = f"127.0.0.1:{listener.sock.getsockname()[1]}"
        try:
            first, second = Channel.connect(address, 5), Channel.connect(address, 5)
            first.send(exchange.Message(exchange.HELLO, {"worker": 0, "token": TOKEN}, (np.zeros(3, np.float32),)))
            if not third:
                first.sock.settimeout(0.3)
                with pytest.raises(OSError):  # worker 1 has not said hello
                    first.receive()
                first.sock.settimeout(None)
            second.send(exchange.Message(exchange.HELLO, {"worker": 1, "token": TOKEN}))
            if third:  # worker 2 never comes: both hellos are answered with an error naming it
                for channel in (first, second):
                    with pytest.raises(RemoteError, match=r"no hello from worker 2 within 0.5s"):
                        channel.receive()
            else:
                assert first.receive().meta["version"] == 0
                np.testing.assert_array_equal(second.receive().arrays[0], np.zeros(3))
        finally:
            listener.close()


def test_gossip_workers_end_their_warm_ups_together_at_worker_0s_start_line():
    """gosgd, adpsgd: after its warm-up a worker waits at worker 0's start line until every
    worker's warm-up is over, even before worker 0 listens at all (a late start: TensorFlow
    still importing); worker 0 waits too; a worker that never comes is named."""
    import threading

    from netbench.jobs.harness.exchange_loop import _Worker
    from netbench.jobs.harness.peers import Listener, RemoteError
    from tests.conftest import free_ports

    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    for timeout, both in ((10, True), (0.5, False)):
        workers = [_Worker(argparse.Namespace(strategy="adpsgd", staleness=0, seed=0, startup_timeout=timeout),
                           io.StringIO(), i, cluster, token=TOKEN) for i in range(2)]
        listeners = [Listener("127.0.0.1", ports[1], workers[1]._peer_handler, TOKEN)]
        if not both:
            listeners.append(Listener("127.0.0.1", ports[0], workers[0]._peer_handler, TOKEN))
        try:
            for w in workers:
                w.weights = [np.zeros(3, np.float32)]
            outcome: dict = {}

            def line(w):
                try:
                    w._start_line()
                    outcome[w.index] = "started"
                except (RemoteError, TimeoutError) as exc:
                    outcome[w.index] = str(exc)

            second = threading.Thread(target=line, args=(workers[1],))
            second.start()
            second.join(0.3 if both else 5)
            if both:
                assert second.is_alive()  # worker 0 does not even listen yet
                listeners.append(Listener("127.0.0.1", ports[0], workers[0]._peer_handler, TOKEN))
                second.join(0.3)
                assert second.is_alive()  # worker 0 listens, but is still warming up
                line(workers[0])
                second.join(5)
                assert outcome == {0: "started", 1: "started"}
            else:  # worker 0 never ends its warm-up (its listener answers): worker 1 hears why
                assert "did not end its warm-up within 0.5s" in outcome[1] and "worker 0" in outcome[1]
        finally:
            for w in workers:
                for channel in w.peers.values():
                    channel.close()
            for listener in listeners:
                listener.close()


def test_easgds_server_answers_a_start_once_every_worker_is_at_the_line():
    import threading

    from netbench.jobs.harness import param_server

    s = algorithms.ServerState(mode=algorithms.ELASTIC_MODE, workers=2, warmup=2)
    handle = param_server.make_handler(s, threading.Condition(), first_s=5.0)
    s.initialise([np.zeros(2, np.float32)])
    replies: dict = {}
    first = threading.Thread(target=lambda: replies.update(w0=handle(exchange.Message(exchange.START, {"worker": 0}))))
    first.start()
    first.join(0.3)
    assert first.is_alive() and s.short_of_line() == [1]
    replies["w1"] = handle(exchange.Message(exchange.START, {"worker": 1}))
    first.join(5)
    assert {k: r.op for k, r in replies.items()} == {"w0": exchange.REPLY, "w1": exchange.REPLY}
    alone = param_server.make_handler(algorithms.ServerState(mode=algorithms.ELASTIC_MODE, workers=2), threading.Condition(),
                                      first_s=0.3)
    refused = alone(exchange.Message(exchange.START, {"worker": 0}))
    assert refused.op == exchange.ERROR and "worker 1 did not end its warm-up within 0.3s" in refused.meta["message"]


def test_a_finished_worker_no_longer_holds_back_the_round():
    s = state(algorithms.SYNC)
    s.push(0, 0, [np.ones(2, np.float32)])
    s.leave(1)
    assert s.version == 1 and s.may_read(0)


def test_ssp_applies_each_push_and_gates_a_worker_more_than_s_ahead():
    s = state(algorithms.SSP, staleness=1)
    assert s.push(0, 0, [np.ones(2, np.float32)]) == 0
    assert s.may_read(0)  # one ahead of worker 1: within the bound
    assert s.push(0, 1, [np.ones(2, np.float32)]) == 0
    assert not s.may_read(0)  # two ahead: waits for the slowest
    assert s.push(1, 0, [np.ones(2, np.float32)]) == 2  # computed on version 0, two updates ago
    assert s.may_read(0)
    np.testing.assert_allclose(s.weights[0], [-1.5, -1.5])


def test_asp_applies_each_push_and_answers_at_once_however_far_ahead():
    s = state(algorithms.ASYNC, staleness=1)
    for version in range(5):  # worker 0 runs 5 pushes ahead of worker 1: nothing gates it
        assert s.push(0, version, [np.ones(2, np.float32)]) == 0
        assert s.may_read(0)
    assert s.push(1, 0, [np.ones(2, np.float32)]) == 5  # computed on version 0, five updates ago
    np.testing.assert_allclose(s.weights[0], [-3.0, -3.0])
    assert algorithms.SERVER_MODES["ps-async"] == algorithms.ASYNC
    # ps-async is the studies' ASP (each push's reply awaited) unless pipelined explicitly
    assert algorithms.pipeline_depth("ps-async", 3) == 0 == algorithms.DEFAULT_PIPELINE == job_module.DEFAULT_PIPELINE
    assert algorithms.pipeline_depth("ps-async", 3, pipeline=16) == 16
    assert job_module.pipeline_window(JobSpec(strategy="ps-async")) == 0
    assert job_module.pipeline_window(JobSpec(strategy="ps-async", pipeline=16)) == 16
    assert job_module.pipeline_window(JobSpec(strategy="ps-ssp", staleness=5)) == 5
    assert job_module.pipeline_window(JobSpec(strategy="ps-sync", staleness=5)) == 0


def test_the_staleness_gate_itself():
    assert algorithms.ssp_may_proceed(5, [5, 2], 3)
    assert not algorithms.ssp_may_proceed(6, [6, 2], 3)
    assert algorithms.ssp_may_proceed(9, [], 0)


def test_easgd_moves_centre_and_replica_towards_each_other_by_alpha():
    s = state(algorithms.ELASTIC_MODE)
    diff = s.elastic([np.array([4.0, -8.0], np.float32)])
    np.testing.assert_allclose(diff[0], [1.0, -2.0])
    np.testing.assert_allclose(s.weights[0], [1.0, -2.0])
    assert algorithms.default_elastic_alpha(4) == pytest.approx(0.225)


def test_gossip_keeps_the_weights_summing_to_one_and_merges_by_weight():
    kept, sent = algorithms.gossip_split(0.5)
    assert kept == sent == 0.25
    merged, weight = algorithms.gossip_merge([np.array([0.0])], 0.5, [np.array([3.0])], sent)
    assert weight == 0.75 and merged[0][0] == pytest.approx(1.0)
    assert kept + weight == pytest.approx(1.0)


def test_adpsgd_averages_and_peers_are_never_oneself():
    assert algorithms.average([np.array([1.0])], [np.array([3.0])])[0][0] == 2.0
    rng = random.Random(0)
    drawn = {algorithms.choose_peer(rng, 1, 4) for _ in range(200)}
    assert drawn == {0, 2, 3}
    with pytest.raises(ValueError):
        algorithms.choose_peer(rng, 0, 1)


def test_expected_transfers_per_step():
    assert algorithms.model_transfers_per_step("gosgd", 2, gossip_p=0.1) == pytest.approx(0.1)
    assert algorithms.model_transfers_per_step("easgd", 2, tau=4) == 0.25
    assert algorithms.model_transfers_per_step("adpsgd", 4) == 2.0
    assert algorithms.model_transfers_per_step("allreduce", 4) == 1.5


NODES = tuple(Node(name=f"n{i}", netns=f"nb-n{i}", ifname="eth0", address=f"10.0.0.{i}", prefixlen=24, port=f"p{i}")
              for i in range(1, 8))


@pytest.mark.parametrize("strategy,roles", [
    ("ps-sync", ["worker0", "worker1", "ps0", "ps1"]),
    ("easgd", ["worker0", "worker1", "ps0", "ps1"]),
    ("gosgd", ["worker0", "worker1"]),
    ("ps", ["worker0", "worker1", "ps0", "ps1", "coordinator0"]),
])
def test_placement_puts_servers_on_nodes_of_their_own_and_no_coordinator(strategy, roles):
    job = JobSpec(strategy=strategy, ps=2)
    tasks = plan_job(job, NODES, 2, port=4000)
    assert [f"{t.role}{t.index}" for t in tasks] == roles
    assert len({t.node for t in tasks}) == len(tasks) == nodes_needed(job, 2)
    assert [t.serves for t in tasks] == [t.role != "coordinator" if strategy == "ps" else t.role == "ps" for t in tasks]
    cluster = json.loads(tasks[0].tf_config)["cluster"]
    assert cluster["worker"] == ["10.0.0.1:4000", "10.0.0.2:4000"]


def test_the_algorithms_settings_reach_the_worker_and_bad_ones_are_named():
    argv = worker_argv(JobSpec(strategy="ps-ssp", staleness=5, train_steps=100, eval_every=20))
    assert argv[argv.index("--staleness") + 1] == "5" and argv[argv.index("--train-steps") + 1] == "100"
    assert "--steps" not in argv and argv[argv.index("--eval-every") + 1] == "20"
    assert "--gossip-p" in worker_argv(JobSpec(strategy="gosgd"))
    for job, workers, key in [(JobSpec(strategy="gosgd"), 1, "workers"), (JobSpec(tau=0), 2, "tau"),
                              (JobSpec(train_steps=5, warmup=10), 2, "train_steps"),
                              (JobSpec(strategy="ps-sync", seconds=5.0), 2, "seconds"),
                              (JobSpec(target_accuracy=1.5), 2, "target_accuracy")]:
        with pytest.raises(ValueError, match=f"^{key}:"):
            check_job(job, workers)
    assert any("staleness 3" in line for line in describe_algorithm(JobSpec(strategy="ps-ssp"), 2))


def evals(worker: int, points: list[tuple[int, float]]) -> list[ev.Event]:
    return [ev.received(ev.eval_event(step, 100.0 + step, step / 10, acc, 0.5, 10_000), worker, "worker", 0.0)
            for step, acc in points]


def test_the_accuracy_curve_follows_worker_0_with_the_spread_over_workers():
    start = ev.received(ev.step_event(0, ev.PHASE_WARMUP, 99.0, 99.5, 64, 2.0), 0, "worker", 0.0)
    events = [start, *evals(0, [(50, 0.6), (100, 0.8)]), *evals(1, [(50, 0.5), (100, 0.7)])]
    summary = accuracy.summarise(events, JobSpec(strategy="gosgd", target_accuracy=0.75))
    assert [(p.step, p.accuracy) for p in summary.curve] == [(50, 0.6), (100, 0.8)]
    assert summary.curve[0].wall_s == pytest.approx(51.0) and summary.curve[0].spread == pytest.approx(0.1)
    assert (summary.test_accuracy, summary.steps_to_target, summary.time_to_target_s) == (0.8, 100, 10.0)
    never = accuracy.summarise(events, JobSpec(strategy="gosgd", target_accuracy=0.9))
    assert never.steps_to_target is None and never.time_to_target_s is None
    assert accuracy.summarise([start], JobSpec()).test_accuracy is None


def test_easgd_s_curve_follows_the_centre_variable_with_the_spread_of_the_replicas():
    import dataclasses

    start = ev.received(ev.step_event(0, ev.PHASE_WARMUP, 99.0, 99.5, 64, 2.0), 0, "worker", 0.0)
    centre = [ev.received(dataclasses.replace(ev.eval_event(step, 101.0 + step, step / 10, acc, 0.4, 10_000),
                                              of=ev.EVAL_OF_CENTRE), 0, "worker", 0.0)
              for step, acc in [(50, 0.65), (100, 0.85)]]
    events = [start, *evals(0, [(50, 0.6), (100, 0.8)]), *evals(1, [(50, 0.5), (100, 0.7)]), *centre]
    summary = accuracy.summarise(events, JobSpec(strategy="easgd", target_accuracy=0.82))
    assert [(p.step, p.accuracy) for p in summary.curve] == [(50, 0.65), (100, 0.85)]
    assert [p.spread for p in summary.curve] == [pytest.approx(0.1), pytest.approx(0.1)]  # replicas only
    assert (summary.test_accuracy, summary.steps_to_target) == (0.85, 100)
    wire = ev.to_wire(centre[0])
    assert wire["of"] == "centre" and ev.from_record(wire).of == ev.EVAL_OF_CENTRE
    assert "of" not in ev.to_wire(evals(0, [(1, 0.1)])[0])


def test_step_and_eval_events_round_trip_and_old_steps_stay_as_they_were():
    step = ev.step_event(3, ev.PHASE_MEASURED, 1.0, 2.0, 64, 0.5, compute=0.2, comm=0.3, wait=0.5, staleness=2)
    assert ev.from_record(ev.to_wire(step)) == step
    old = ev.step_event(3, ev.PHASE_MEASURED, 1.0, 2.0, 64, 0.5)
    assert "wait" not in ev.to_wire(old) and "staleness" not in ev.to_wire(old)
    scored = ev.eval_event(100, 5.0, 4.0, 0.81, float("nan"), 10_000)
    assert scored.loss is None and ev.parse_line(json.dumps(ev.to_wire(scored))) == scored


def hellos(first, second) -> None:
    """Workers 0 (with the weights) and 1 say hello; a server answers both once both came.
    Each channel keeps its reply as `.last`."""
    first.send(exchange.Message(exchange.HELLO, {"worker": 0, "token": TOKEN}, (np.zeros(3, np.float32),)))
    second.send(exchange.Message(exchange.HELLO, {"worker": 1, "token": TOKEN}))
    first.last, second.last = first.receive(), second.receive()


def test_a_parameter_server_holds_a_bsp_reply_until_the_round_is_complete():
    """The server's handler over real loopback sockets: worker 0's push waits for worker 1's."""
    import threading

    from netbench.jobs.harness import param_server
    from netbench.jobs.harness.peers import Channel, Listener

    s = algorithms.ServerState(mode=algorithms.SYNC, workers=2, learning_rate=1.0)
    listener = Listener("127.0.0.1", 0, param_server.make_handler(s, threading.Condition()), TOKEN)
    address = f"127.0.0.1:{listener.sock.getsockname()[1]}"
    try:
        first, second = Channel.connect(address, 5), Channel.connect(address, 5)
        hellos(first, second)
        hello = second.last
        np.testing.assert_array_equal(hello.arrays[0], np.zeros(3))
        first.send(exchange.Message(exchange.PUSH, {"worker": 0, "version": 0}, (np.ones(3, np.float32),)))
        first.sock.settimeout(0.3)
        with pytest.raises(OSError):  # held by the barrier
            first.receive()
        first.sock.settimeout(None)
        reply = second.request(exchange.Message(exchange.PUSH, {"worker": 1, "version": 0},
                                                (np.full(3, 3, np.float32),)))
        held = first.receive()
        for got in (reply, held):
            np.testing.assert_allclose(got.arrays[0], [-2.0, -2.0, -2.0])
            assert got.meta["version"] == 1 and got.meta["staleness"] == 0
        assert held.meta["wait_s"] > reply.meta["wait_s"]
        assert listener.errors == []
    finally:
        listener.close()


def test_a_train_steps_playbooks_plan_says_the_steps_its_runs_measure(tmp_path):
    """train_steps: 60 with warmup: 2 measures 58 steps a run; the dry run said 32 (the default window)."""
    import subprocess
    import sys

    from netbench.model.design import book_steps
    from netbench.model.playbook import playbook_from_mapping

    data = {"name": "acc", "factors": {"strategy": ["ps-async"]}, "fixed": {"workers": 2}, "warmup": 2,
            "train_steps": 60}
    assert book_steps(playbook_from_mapping(data, "acc.yaml")) == 58
    no_train = {k: v for k, v in data.items() if k != "train_steps"}
    assert book_steps(playbook_from_mapping({**no_train, "steps": 40}, "acc.yaml")) == 40
    book = tmp_path / "acc.yaml"
    book.write_text(json.dumps(data))
    shown = subprocess.run([sys.executable, "-m", "netbench.cli", "run", str(book), "--dry-run"],
                           capture_output=True, text=True, timeout=120)
    assert "2 warm-up + 58 measured steps per run" in shown.stdout + shown.stderr, shown.stdout + shown.stderr


def test_playbook_keys_of_the_algorithms_become_job_fields():
    from netbench.model import algorithm_keys

    extra = algorithm_keys.job_extra({"train_steps": 200, "eval_every": 50, "target_accuracy": 0.7,
                                      "algorithm": {"staleness": 2, "gossip_p": 0.2}}, warmup=10)
    fields = algorithm_keys.job_fields(extra, warmup=10, steps=30)
    assert fields == {"train_steps": 200, "eval_every": 50, "target_accuracy": 0.7, "staleness": 2,
                      "gossip_p": 0.2, "steps": 190}
    JobSpec(**fields)  # every key is a JobSpec field
    for data, key in [({"train_steps": 10}, "train_steps"), ({"algorithm": {"tau": 0}}, "algorithm.tau"),
                      ({"algorithm": {"rho": 1}}, "algorithm.rho"), ({"target_accuracy": 2}, "target_accuracy")]:
        with pytest.raises(algorithm_keys.BadKey) as caught:
            algorithm_keys.job_extra(data, warmup=10)
        assert caught.value.key == key


def test_the_reports_algorithm_table_groups_repetitions_and_names_the_winners():
    from netbench.report.accuracy import accuracy_markdown, algorithm_points

    def record(strategy, delay_ms, ips, acc, reached):
        return {"strategy": strategy, "workers": 2, "profile": {"delay_us": delay_ms * 1000}, "status": "ok",
                "stats": {"images_per_sec": ips}, "idle_ratio": 0.5, "wait_time_mean_s": 0.01,
                "staleness_mean": 1.0, "test_accuracy": acc, "steps_to_target": 100 if reached else None,
                "time_to_target_s": 3.0 if reached else None,
                "accuracy_curve": [{"step": 200, "accuracy": acc, "spread": 0.02}]}

    records = [record("ps-sync", 50, 300.0, 0.80, True), record("ps-sync", 50, 320.0, 0.82, True),
               record("ps-sync", 50, 310.0, 0.81, True),
               record("ps", 50, 900.0, 0.70, False), {"strategy": "allreduce", "accuracy_curve": []}]
    points = algorithm_points(records)
    assert [(p.strategy, p.runs, p.reached) for p in points] == [("ps", 1, 0), ("ps-sync", 3, 3)]
    sync = points[1]
    assert sync.images_per_sec.mean == pytest.approx(310.0, rel=1e-3) and sync.images_per_sec.low is not None
    assert sync.accuracy.mean == pytest.approx(0.81) and sync.time_to_target.mean == pytest.approx(3.0)
    text = accuracy_markdown(points, 0.99)
    assert "| ps-sync | 2 | 50 | 3/3 | 310 (" in text and "other factors" not in text
    assert "On throughput: ps, 2 workers, 50 ms" in text and "On accuracy: ps-sync" in text
    assert accuracy_markdown([], 0.99) == ""


def test_the_workers_options_of_the_algorithms():
    from netbench.jobs import worker

    args = worker.parse_args(["--strategy", "ps-ssp", "--train-steps", "50", "--warmup", "5", "--staleness", "0"])
    assert (args.steps, args.train_steps, args.staleness, args.tau, args.gossip_p) == (45, 50, 0, 4, 0.1)
    assert worker.LOOPS["gosgd"] is worker.LOOPS["ps-sync"]
    for bad in (["--train-steps", "5", "--warmup", "5"], ["--strategy", "easgd", "--seconds", "3"],
                ["--gossip-p", "1.5"], ["--elastic-alpha", "2"], ["--steps", "3", "--train-steps", "9"]):
        with pytest.raises(SystemExit):
            worker.parse_args(bad)


def test_the_sweeps_dry_run_shows_the_algorithm_and_its_placement_and_names_bad_flags():
    from click.testing import CliRunner

    from netbench.cli.app import main

    def invoke(*args):
        return CliRunner().invoke(main, ["sweep", "--dry-run", *args], catch_exceptions=False)

    shown = invoke("--strategy", "easgd", "--ps", "2", "--data", "fashion-mnist", "--train-steps", "200",
                   "--latency", "1,50ms")
    assert shown.exit_code == 0, shown.output
    for text in ("placement on 4 nodes", "ps1 on n4", "tau 4, alpha 0.45 (0.9 / workers)",
                 "190 measured steps", "fresh model for 200 steps", "--isolate"):
        assert text in shown.output, text
    assert "coordinator" not in shown.output
    for args, flag in [(("--strategy", "gosgd", "--workers", "1"), "--workers"),
                       (("--train-steps", "5"), "--train-steps"),
                       (("--strategy", "ps-sync", "--seconds", "5"), "--seconds")]:
        result = invoke(*args)
        first = result.output.strip().splitlines()[0]
        assert result.exit_code != 0 and first.startswith("error:") and flag in first, result.output


def test_the_estimate_models_each_algorithms_exchange():
    from netbench.experiment.estimate import exchange_s

    model_s, rtt = 0.02, 0.1
    assert exchange_s(JobSpec(strategy="ps-sync"), 2, model_s, rtt) == pytest.approx(0.24)
    assert exchange_s(JobSpec(strategy="easgd", tau=4), 2, model_s, rtt) == pytest.approx(0.06)
    assert exchange_s(JobSpec(strategy="gosgd", gossip_p=0.1), 2, model_s, rtt) == pytest.approx(0.002)
    # the parameter server's link carries every worker's models
    assert exchange_s(JobSpec(strategy="ps-ssp"), 16, model_s, 0.0) == pytest.approx(0.64)


@contextlib.contextmanager
def pushing_worker(strategy: str, staleness: int, pipeline: int = 0):
    """A parameter server of `strategy` on loopback, worker 0 of two connected to it with its
    reply reader started, and worker 1's channel (said hello): (server state, worker 0, worker
    1's channel). The server's listener must have seen no error by the end."""
    import threading

    from netbench.jobs.harness import param_server
    from netbench.jobs.harness.exchange_loop import _Worker
    from netbench.jobs.harness.peers import Channel, Listener

    s = algorithms.ServerState(mode=algorithms.SERVER_MODES[strategy], workers=2, learning_rate=0.5,
                               staleness=algorithms.server_gate(strategy, staleness))
    listener = Listener("127.0.0.1", 0, param_server.make_handler(s, threading.Condition()), TOKEN)
    address = f"127.0.0.1:{listener.sock.getsockname()[1]}"
    try:
        args = argparse.Namespace(strategy=strategy, staleness=staleness, pipeline=pipeline, seed=0,
                                  startup_timeout=5)
        worker = _Worker(args, io.StringIO(), 0, {"worker": ["a:1", "b:1"], "ps": [address]}, token=TOKEN)
        worker.weights = [np.zeros(3, np.float32)]
        other = Channel.connect(address, 5)
        other.send(exchange.Message(exchange.HELLO, {"worker": 1, "token": TOKEN}))  # the start waits for both
        worker._hello()
        worker._read_replies()
        other.receive()
        yield s, worker, other
        assert listener.errors == []
    finally:
        listener.close()


@pytest.mark.parametrize("pipeline", [0, 16])
def test_an_asp_worker_never_waits_for_a_worker_that_does_not_push(pipeline):
    """ps-async: worker 0 pushes many steps while worker 1 never pushes; every push is answered
    at once (no gate), the staleness each update had comes back. The studies' ASP (pipeline 0)
    takes its own push's reply every step; a pipelined worker leaves up to its window unanswered."""
    import threading

    with pushing_worker("ps-async", 0, pipeline) as (s, worker, _):
        grads = [np.ones(3, np.float32)]
        pushes = 48
        results: list = []
        done = threading.Thread(target=lambda: [results.append(worker._push(0.0, grads)) for _ in range(pushes)])
        done.start()
        done.join(10)
        assert not done.is_alive()  # worker 1 never pushed, and nothing waited for it
        assert worker.unanswered <= pipeline
        if pipeline == 0:  # one push in flight: every step took its own reply, fresh weights each time
            assert [r[2] for r in results] == [0] * pushes and worker.version == pushes
        worker._goodbye()
        assert s.version == pushes and s.clocks == {0: pushes}
        np.testing.assert_allclose(s.weights[0], [-0.5 * pushes] * 3)  # every push applied once
        assert worker.weights[0][0] < 0  # the worker computes on the weights the replies brought


def test_an_ssp_worker_keeps_s_pushes_in_flight_and_blocks_only_beyond_them():
    """ps-ssp hides round trips: worker 0 (S = 2) pushes twice without waiting; its third push
    waits for the answer to its first, which the server gives once worker 1 has pushed too."""
    import threading

    assert (algorithms.pipeline_depth("ps-ssp", 2), algorithms.pipeline_depth("ps-sync", 2)) == (2, 0)
    assert (algorithms.server_gate("ps-ssp", 2), algorithms.server_gate("ps-sync", 2)) == (0, 2)
    with pushing_worker("ps-ssp", 2) as (s, worker, other):
        grads = [np.ones(3, np.float32)]
        for _ in range(2):  # within the pipeline: nothing is waited for (the server holds both answers)
            comm, wait, staleness = worker._push(0.0, grads)
            assert staleness is None and worker.unanswered in (1, 2)
        third: dict = {}
        thread = threading.Thread(target=lambda: third.update(out=worker._push(0.0, grads)))
        thread.start()
        thread.join(0.3)
        assert thread.is_alive()  # its first push is unanswered until worker 1 pushes once
        other.request(exchange.Message(exchange.PUSH, {"worker": 1, "version": 0}, (np.ones(3, np.float32),)))
        thread.join(5)
        _, wait, staleness = third["out"]
        assert worker.unanswered == 2 and staleness == 0 and wait > 0.2  # held by the gate
        np.testing.assert_allclose(worker.weights[0], [-1.0] * 3)  # answered after both workers pushed once


# ---------------------------------------------------------------- backup workers (ps-sync)


def backup_state(workers: int = 3, backup: int = 1) -> algorithms.ServerState:
    s = algorithms.ServerState(mode=algorithms.SYNC, workers=workers, learning_rate=1.0, backup=backup)
    s.initialise([np.zeros(2, np.float32)])
    return s


def test_a_round_with_backup_workers_closes_on_its_first_n_minus_b_gradients():
    s = backup_state(workers=3, backup=1)
    assert s.round_size() == 2
    s.push(0, 0, [np.array([2.0, 0.0], np.float32)])
    assert not s.may_read(0) and s.version == 0  # one of the two it needs
    s.push(1, 0, [np.array([0.0, 4.0], np.float32)])
    assert s.version == 1 and s.may_read(0) and s.may_read(1)
    np.testing.assert_allclose(s.weights[0], [-1.0, -2.0])  # the mean of the two applied, not of three
    assert s.dropped == {}


def test_a_late_gradient_is_dropped_counted_and_answered_at_once_with_the_new_weights():
    s = backup_state(workers=3, backup=1)
    s.push(0, 0, [np.ones(2, np.float32)])
    s.push(1, 0, [np.ones(2, np.float32)])
    before = [w.copy() for w in s.weights]
    s.push(2, 0, [np.full(2, 100.0, np.float32)])  # computed on version 0: its round closed without it
    assert s.dropped == {2: 1} and s.may_read(2) and s.version == 1
    np.testing.assert_array_equal(s.weights[0], before[0])  # never applied
    # its next gradient, on the weights it was answered with, joins the open round
    s.push(2, 1, [np.full(2, 2.0, np.float32)])
    assert not s.may_read(2)
    s.push(0, 1, [np.zeros(2, np.float32)])
    assert s.version == 2 and s.may_read(2) and s.may_read(0) and s.dropped == {2: 1}
    # worker 1 pushes on version 1, after round 2 closed: dropped
    s.push(1, 1, [np.ones(2, np.float32)])
    assert s.dropped == {2: 1, 1: 1} and s.may_read(1)


def test_workers_that_leave_shrink_a_round_to_at_least_one_gradient():
    s = backup_state(workers=3, backup=2)
    assert s.round_size() == 1
    s.push(1, 0, [np.ones(2, np.float32)])
    assert s.version == 1 and s.may_read(1)
    s.leave(0)
    s.leave(1)
    assert s.round_size() == 1
    s.push(2, 1, [np.ones(2, np.float32)])
    assert s.version == 2 and s.may_read(2)


def test_with_backup_workers_the_warm_up_waits_for_every_worker_and_the_steady_state_does_not():
    # a slow node's start-up (its import, its first tracing step) must not make it a backup before
    # it trains: its warm-up's rounds wait for it, as plain BSP; afterwards the first two close a round
    s = algorithms.ServerState(mode=algorithms.SYNC, workers=3, learning_rate=1.0, backup=1, warmup=2)
    s.initialise([np.zeros(2, np.float32)])
    for version in range(2):
        s.push(0, version, [np.ones(2, np.float32)])
        s.push(1, version, [np.ones(2, np.float32)])
        assert s.version == version and not s.may_read(0)  # worker 2 still warming up: the round waits
        s.push(2, version, [np.ones(2, np.float32)])
        assert s.version == version + 1 and s.dropped == {}
    assert s.round_size() == 2
    s.push(0, 2, [np.ones(2, np.float32)])
    s.push(1, 2, [np.ones(2, np.float32)])
    assert s.version == 3 and s.may_read(0)
    s.push(2, 2, [np.ones(2, np.float32)])  # the slow one, after its round closed: dropped
    assert s.dropped == {2: 1}


def test_without_backup_workers_the_barrier_waits_for_every_worker_as_before():
    s = backup_state(workers=3, backup=0)
    s.push(0, 0, [np.ones(2, np.float32)])
    s.push(1, 0, [np.ones(2, np.float32)])
    assert s.version == 0 and not s.may_read(0)
    s.push(2, 0, [np.ones(2, np.float32)])
    assert s.version == 1 and s.dropped == {}


def test_backup_workers_reach_the_worker_and_as_many_as_the_workers_are_refused():
    argv = worker_argv(JobSpec(strategy="ps-sync", backup_workers=1))
    assert argv[argv.index("--backup-workers") + 1] == "1"
    assert "--backup-workers" not in worker_argv(JobSpec(strategy="ps-sync"))
    assert "--backup-workers" not in worker_argv(JobSpec(strategy="ps-ssp", backup_workers=1))
    check_job(JobSpec(strategy="ps-sync", backup_workers=2), 3)
    with pytest.raises(ValueError, match="^backup_workers: must be fewer than the 3 workers"):
        check_job(JobSpec(strategy="ps-sync", backup_workers=3), 3)
    # a round applies the first N - B gradients: images per step count those
    assert job_module.images_per_step(JobSpec(strategy="ps-sync", batch_size=10, backup_workers=1), 3) == 20
    assert any("1 backup worker(s)" in line
               for line in describe_algorithm(JobSpec(strategy="ps-sync", backup_workers=1), 3))


def test_the_sweep_refuses_as_many_backup_workers_as_workers_in_one_line():
    from click.testing import CliRunner

    from netbench.cli.app import main

    result = CliRunner().invoke(main, ["sweep", "--dry-run", "--strategy", "ps-sync", "--workers", "3",
                                       "--backup-workers", "3"], catch_exceptions=False)
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and lines[0].startswith("error:") and "--backup-workers" in lines[0], result.output
    shown = CliRunner().invoke(main, ["sweep", "--dry-run", "--strategy", "ps-sync", "--workers", "3",
                                      "--backup-workers", "1"], catch_exceptions=False)
    assert shown.exit_code == 0 and "first 2 gradients" in shown.output, shown.output


def test_a_parameter_server_with_a_backup_worker_answers_a_late_push_as_dropped():
    """The server's handler over loopback: with 2 workers and 1 backup, each push closes its round;
    a push on the old version is answered at once, marked dropped."""
    import threading

    from netbench.jobs.harness import param_server
    from netbench.jobs.harness.peers import Channel, Listener

    s = algorithms.ServerState(mode=algorithms.SYNC, workers=2, learning_rate=1.0, backup=1)
    listener = Listener("127.0.0.1", 0, param_server.make_handler(s, threading.Condition()), TOKEN)
    address = f"127.0.0.1:{listener.sock.getsockname()[1]}"
    try:
        first, second = Channel.connect(address, 5), Channel.connect(address, 5)
        hellos(first, second)
        applied = first.request(exchange.Message(exchange.PUSH, {"worker": 0, "version": 0},
                                                 (np.ones(3, np.float32),)))
        late = second.request(exchange.Message(exchange.PUSH, {"worker": 1, "version": 0},
                                               (np.full(3, 3, np.float32),)))
        assert (applied.meta["dropped"], late.meta["dropped"]) == (False, True)
        for got in (applied, late):
            np.testing.assert_allclose(got.arrays[0], [-1.0, -1.0, -1.0])
            assert got.meta["version"] == 1
        assert s.dropped == {1: 1} and listener.errors == []
    finally:
        listener.close()
