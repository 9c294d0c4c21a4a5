"""The exchange strategies' base step: the job's own unshaped step, to which a point's terms are added."""

from __future__ import annotations

import dataclasses

import pytest

from netbench.experiment import base_calibration as bc
from netbench.experiment import predict
from netbench.model import step_model
from netbench.model.job import JobSpec

MODEL = 2_678_824


def _inputs(**changes) -> step_model.StepInputs:
    x = step_model.StepInputs(strategy="ps-sync", workers=2, model_bytes=MODEL, compute_s=0.002, delay_s=0.001,
                              rate_bps=None, overhead_s=0.0015, beta_s_per_byte=2e-9, exchange_alpha_s=0.0001,
                              exchange_beta_s_per_byte=2.4e-10, window_bytes=4 << 20)
    return dataclasses.replace(x, **changes)


def test_a_base_step_replaces_the_parts_unshaped_step_and_keeps_what_the_point_adds():
    parts = step_model.predict(_inputs())
    unshaped = step_model.predict(_inputs(delay_s=0.0))
    based = step_model.predict(_inputs(base_step_s=0.0112))
    # measured here: ps-sync's mlp step on unshaped links 11.2 ms where the parts sum to ~3.5 ms
    assert unshaped.step_s < 0.005
    assert based.step_s == pytest.approx(0.0112 + parts.step_s - unshaped.step_s)
    assert based.comm_s == parts.comm_s and based.floor_s == parts.floor_s
    # on the unshaped point itself the prediction is the base step
    assert step_model.predict(_inputs(delay_s=0.0, base_step_s=0.0112)).step_s == pytest.approx(0.0112)
    # a node's CPU limit adds what the model says it adds, on top of the base
    slow = step_model.predict(_inputs(base_step_s=0.0112, node_slowdown=(1.0, 5.0), node_delay_s=(0.0, 0.0)))
    limited = step_model.predict(_inputs(node_slowdown=(1.0, 5.0), node_delay_s=(0.0, 0.0)))
    assert slow.step_s == pytest.approx(0.0112 + limited.step_s - unshaped.step_s)


def test_a_base_step_is_ignored_where_the_strategy_is_not_an_exchange_one():
    ring = _inputs(strategy="allreduce")
    assert step_model.predict(dataclasses.replace(ring, base_step_s=1.0)) == step_model.predict(ring)


def test_only_the_exchange_strategies_built_in_jobs_are_calibrated_and_their_settings_key_them():
    assert bc.wanted(JobSpec(strategy="ps-async"), 2) and bc.wanted(JobSpec(strategy="gosgd"), 3)
    assert not bc.wanted(JobSpec(strategy="allreduce"), 2) and not bc.wanted(JobSpec(strategy="ps-sync"), 1)
    sync = JobSpec(strategy="ps-sync", model="mlp")
    backup = dataclasses.replace(sync, backup_workers=1)
    keys = {bc.key(j, 3, predict.job_key(j, 3)) for j in (sync, backup, dataclasses.replace(sync, ps=2))}
    assert len(keys) == 3  # each setting its own base step
    assert bc.measured(backup, 3)["settings"] == ["--backup-workers", "1"]
    # the calibration's own window: short, fixed, no accuracy run, no precision
    run = bc.calibration_job(dataclasses.replace(sync, train_steps=300, eval_every=100, precision=0.02, seconds=5.0))
    assert (run.warmup, run.steps, run.seconds, run.precision, run.train_steps, run.eval_every) == \
        (bc.BASE_WARMUP, bc.BASE_STEPS, None, None, None, 0)
    # a different window of the sweep does not change what is measured (the cache finds it again)
    assert bc.measured(dataclasses.replace(sync, steps=200, warmup=20), 2) == bc.measured(sync, 2)


def test_a_predictor_with_a_base_step_predicts_from_it():
    from netbench.model import collective as maths
    from netbench.model.profile import Profile
    from netbench.model.run import Run

    job = JobSpec(strategy="ps-sync", model="mlp")
    run = Run(index=0, profile=Profile(name="p", delay_us=1_000), repeat=0, job=job, workers=2)
    parts = predict.Predictor(collective={2: maths.AlphaBeta(0.0015, 2e-9)},
                              compute={predict.job_key(job, 2): predict.Compute(0.002, MODEL)})
    based = dataclasses.replace(parts, base={bc.key(job, 2, predict.job_key(job, 2)): 0.0112})
    assert based.inputs(run).base_step_s == 0.0112 and parts.inputs(run).base_step_s is None
    flat = dataclasses.replace(run, profile=Profile(name="q"))
    assert based.predict(run).step_s == pytest.approx(0.0112 + parts.predict(run).step_s - parts.predict(flat).step_s)
    assert based.predict(flat).step_s == pytest.approx(0.0112)


def test_the_buckets_torch_reported_replace_the_models_estimate():
    from netbench.model import collective as maths
    from netbench.model.profile import Profile
    from netbench.model.run import Run

    start = {"event": "start", "framework": "torch", "ddp_bucket_bytes": "2544040"}
    assert predict.reported_buckets([{"event": "step"}, start]) == 1
    assert predict.reported_buckets([{**start, "ddp_bucket_bytes": "1048576,26214400,300"}]) == 3
    assert predict.reported_buckets([{"event": "start", "framework": "tensorflow"}]) is None
    job = JobSpec(strategy="allreduce", model="mlp", framework="torch")
    run = Run(index=0, profile=Profile(name="p", delay_us=20_000, rate_bps=100_000_000), repeat=0, job=job, workers=2)
    p = predict.Predictor(collective={predict.collective_key(2, 1, "torch"): maths.AlphaBeta(0.0015, 2e-9)},
                          compute={predict.job_key(job, 2): predict.Compute(0.002, MODEL)})
    assert p.inputs(run).buckets == 2  # the estimate from the size: a 1 MiB first bucket, then one more
    one, three = p.predict(run, buckets=1), p.predict(run, buckets=3)
    # DDP's own all-reduce runs two buckets at once on gloo's two threads: their round trips
    # overlap; a third waits for a thread, one ring's round trips more (2 ranks: 2 of 40 ms)
    assert p.predict(run).step_s == pytest.approx(one.step_s, rel=1e-4)
    assert three.step_s - one.step_s == pytest.approx(2 * 2 * 0.020, rel=1e-3)


def test_the_hierarchical_hook_waits_for_each_buckets_leaders_ring_in_turn():
    # measured on 2 x 2 ranks at 20 ms and 100 Mbit/s: the leaders' rings of the mlp's two
    # buckets (1,071,144 and 1,607,680 bytes) took 169-170 and 214-217 ms, one after the other
    x = step_model.StepInputs(strategy="allreduce", workers=4, model_bytes=MODEL, compute_s=0.0, delay_s=0.02,
                              rate_bps=100_000_000, overhead_s=0.0, beta_s_per_byte=0.0, ranks_per_node=2,
                              collective="hierarchical", framework="torch", buckets=2)
    assert step_model.allreduce_s(x) == pytest.approx(0.1696 + 0.2145, abs=0.002)
    flat = dataclasses.replace(x, collective="ring")
    assert step_model.allreduce_s(flat) < step_model.allreduce_s(dataclasses.replace(flat, buckets=4))


def test_tensorflows_ring_pays_a_round_trip_per_crossing_transfer_and_torchs_is_gloos_replayed():
    # 2 nodes x 2 ranks: TensorFlow's 6 transfers, 3 of them over a node's link; Gloo's 2 x 3
    # pairs of segments in flight, each pair waiting for a round trip over a node's link
    assert step_model.ring_crossings(4, 2) == 3 and step_model.ring_crossings(4, 1) == 0
    x = step_model.StepInputs(strategy="allreduce", workers=4, model_bytes=MODEL, compute_s=0.002, delay_s=0.02,
                              rate_bps=None, overhead_s=0.0, beta_s_per_byte=0.0, ranks_per_node=2)
    tf, torch = step_model.allreduce_s(x), step_model.allreduce_s(dataclasses.replace(x, framework="torch"))
    assert (tf, torch) == (pytest.approx(3 * 0.04), pytest.approx(6 * 0.04))
