"""The exchange strategies' step model and the exchange calibration's fit and fallback (pure)."""

from __future__ import annotations

import pytest

from netbench.experiment import exchange_calibration, predict
from netbench.jobs import events as ev
from netbench.model import collective as maths
from netbench.model import exchange_model, step_model
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.model.run import Run

MODEL = 2_678_824  # the mlp's bytes
MIB = 2**20


def _inputs(**kw) -> step_model.StepInputs:
    base = dict(strategy="ps-sync", workers=2, model_bytes=MODEL, compute_s=0.002, delay_s=0.050, rate_bps=None,
                overhead_s=0.0018, beta_s_per_byte=2.3e-9, exchange_alpha_s=0.0002,
                exchange_beta_s_per_byte=1.5e-9, window_bytes=4 * MIB)
    return step_model.StepInputs(**{**base, **kw})


# ---------------------------------------------------------------- the window from the kernel's limits

def test_the_window_is_the_smaller_of_the_send_buffer_and_the_advertised_receive_buffer():
    limits = {"tcp_rmem": [4096, 131072, 32 * MIB], "tcp_wmem": [4096, 16384, 4 * MIB], "tcp_adv_win_scale": 1}
    assert exchange_model.window_from_limits(limits) == 4 * MIB  # this machine: the send buffer binds
    # the receive buffer less what tcp_adv_win_scale keeps back (the kernel's tcp_win_from_space)
    assert exchange_model.window_from_limits({**limits, "tcp_rmem": [1, 1, 6 * MIB]}) == 3 * MIB
    assert exchange_model.window_from_limits({"tcp_rmem": [1, 1, 4 * MIB], "tcp_adv_win_scale": 2}) \
        == 4 * MIB - MIB
    assert exchange_model.window_from_limits({"tcp_rmem": [1, 1, 6 * MIB], "tcp_adv_win_scale": -1}) == 3 * MIB
    assert exchange_model.window_from_limits({}) is None
    assert exchange_model.window_from_limits({"tcp_wmem": [1, 2]}) is None  # not a [min, default, max]


# ---------------------------------------------------------------- the strategies' terms

def test_a_request_reply_is_a_round_trip_plus_each_direction_at_its_slowest_per_byte_term():
    x = _inputs()
    window = 0.100 / (4 * MIB)  # 100 ms RTT over a 4 MiB window: 40 MiB/s per connection
    # the push (one connection) and the server's replies to both workers (its egress carries two)
    up = max(MODEL * 1.5e-9, MODEL * window)
    down = max(2 * MODEL * 1.5e-9, MODEL * window)
    assert exchange_model.push_pull_s(x) == pytest.approx(0.0002 + 0.100 + up + down)
    assert up == pytest.approx(MODEL * window)  # at 50 ms one-way the window binds: 0.64 round trips each way
    near = _inputs(delay_s=0.001)
    # at 1 ms the protocol's own cost per byte does
    assert exchange_model.push_pull_s(near) == pytest.approx(0.0002 + 0.002 + 3 * MODEL * 1.5e-9)
    thin = _inputs(delay_s=0.001, rate_bps=100e6)
    wire = 8 * exchange_model.WIRE_OVERHEAD / 100e6
    # a thin link: the server's egress sends the weights to both workers at the rate
    assert exchange_model.push_pull_s(thin) == pytest.approx(0.0002 + 0.002 + 3 * MODEL * wire)


def test_each_strategy_moves_what_it_sends_per_step():
    x = _inputs()
    per_byte = 0.100 / (4 * MIB)
    ps_sync = step_model.predict(x)
    assert ps_sync.comm_s == pytest.approx(exchange_model.push_pull_s(x))
    assert ps_sync.step_s == pytest.approx(0.002 + ps_sync.comm_s)
    # easgd: the same exchange with the centre every tau steps
    easgd = step_model.predict(_inputs(strategy="easgd", params={"period": 4}))
    assert easgd.comm_s == pytest.approx(exchange_model.push_pull_s(x) / 4)
    # adpsgd: a model each way, each node's egress also answering its peer
    adpsgd = step_model.predict(_inputs(strategy="adpsgd"))
    assert adpsgd.comm_s == pytest.approx(0.0002 + 0.100 + 2 * max(2 * MODEL * 1.5e-9, MODEL * per_byte))
    # gosgd: with p 0.1 a push nobody answers: its bytes at the connection's pace, no round trip
    gosgd = step_model.predict(_inputs(strategy="gosgd", params={"p": 0.1}))
    assert gosgd.comm_s == pytest.approx(0.1 * MODEL * per_byte)
    assert gosgd.comm_s < 0.1 * 0.100  # less than a tenth of a round trip


def test_a_pipelined_worker_is_capped_by_a_window_per_round_trip():
    asp = _inputs(strategy="ps-async", params={"window": 16})
    p = step_model.predict(asp)
    # 16 pushes in flight hide the round trips; each connection still carries a model each way
    # per step at no more than 4 MiB per 100 ms
    assert p.step_s == pytest.approx(MODEL * 0.100 / (4 * MIB))
    assert p.step_s == pytest.approx(exchange_model.pipelined_s(asp))
    assert p.floor_s == pytest.approx(0.002 + MODEL * 0.100 / (4 * MIB))
    # no window known (an older folder), or a short round trip: the computing and the worker's
    # own bytes (its push and the weights back at the protocol's beta) bind
    assert step_model.predict(_inputs(strategy="ps-async", params={"window": 16}, window_bytes=None)).step_s \
        == pytest.approx(0.002 + 2 * MODEL * 1.5e-9)
    near = step_model.predict(_inputs(strategy="ps-async", params={"window": 16}, delay_s=0.001))
    assert near.step_s == pytest.approx(0.002 + exchange_model.worker_bytes_s(asp)) and near.step_s < p.step_s / 4
    # ps-ssp, S = 3: its round trip shared by 4 steps (0.57 RTT) is shorter than a model per
    # window (0.64 RTT): the window binds it too; with no slack (S = 0) it is ps-sync
    ssp = step_model.predict(_inputs(strategy="ps-ssp", params={"window": 3}))
    assert (0.002 + exchange_model.push_pull_s(asp)) / 4 < ssp.step_s == pytest.approx(p.step_s)
    gated = step_model.predict(_inputs(strategy="ps-ssp", params={"window": 0}))
    assert gated.step_s == pytest.approx(step_model.predict(_inputs()).step_s)


def test_without_the_exchange_calibration_the_all_reduce_terms_stand_in():
    old = _inputs(exchange_alpha_s=None, exchange_beta_s_per_byte=None, window_bytes=None, delay_s=0.001)
    assert exchange_model.protocol_terms(old) == (0.0018, pytest.approx(2.3e-9))  # n = 2: one link carries all
    four = _inputs(exchange_alpha_s=None, exchange_beta_s_per_byte=None, workers=4)
    assert exchange_model.protocol_terms(four)[1] == pytest.approx(2.3e-9 * 4 / 6)
    assert step_model.predict(old).step_s == pytest.approx(0.002 + 0.0018 + 0.002 + 3 * MODEL * 2.3e-9)


# ---------------------------------------------------------------- the calibration

def _events(alpha: float, beta: float, sizes=exchange_calibration.EXCHANGE_SIZES, limits=None):
    out = [ev.from_record({"event": "start", "worker": 1, "role": "worker"})]
    for size in sizes:
        t = alpha + beta * 2 * size
        out.append(ev.from_record({"event": "exchange", "bytes": size, "times": [t * 1.5, t, t], "worker": 1}))
    for i, limit in enumerate(limits or ()):
        out.append(ev.from_record({"event": "tcp_limits", "worker": i, **limit}))
    return out


def test_the_calibration_fits_alpha_and_beta_per_byte_moved_and_takes_the_smallest_window():
    limits = [{"tcp_rmem": [1, 1, 32 * MIB], "tcp_wmem": [1, 1, 4 * MIB], "tcp_adv_win_scale": 1},
              {"tcp_rmem": [1, 1, 6 * MIB], "tcp_wmem": [1, 1, 4 * MIB], "tcp_adv_win_scale": 1}]
    result, facts = exchange_calibration.summarise(_events(0.0003, 1.4e-9, limits=limits))
    assert result.alpha_s == pytest.approx(0.0003, rel=1e-6)  # the medians, not the slow first repetition
    assert result.beta_s_per_byte == pytest.approx(1.4e-9, rel=1e-6)
    assert result.window_bytes == 3 * MIB
    assert [s["bytes"] for s in facts["sizes"]] == list(exchange_calibration.EXCHANGE_SIZES)
    assert facts["tcp_limits"] == limits[0] and facts["window_bytes"] == 3 * MIB
    unknown, _ = exchange_calibration.summarise(_events(0.0003, 1.4e-9))
    assert unknown.window_bytes is None
    with pytest.raises(ValueError, match="no size"):
        exchange_calibration.summarise(_events(0.0003, 1.4e-9, sizes=(), limits=limits))
    argv = exchange_calibration.bench_argv(python="py")
    assert argv[:3] == ("py", "-m", "netbench.jobs.exchange_bench") and "65536,262144,1048576,4194304" in argv


class _BrokenTestbed:
    def nodes_for(self, job, workers):
        raise RuntimeError("no second worker node")


def test_a_failed_calibration_is_recorded_and_the_strategies_fall_back(tmp_path):
    record, notes = {"errors": []}, []
    assert predict._calibrate_exchange(_BrokenTestbed(), tmp_path, 20000, record, notes.append) is None
    assert record["errors"] == ["RuntimeError: no second worker node"] and "exchange" not in record
    assert "all-reduce's terms" in notes[0]
    job = JobSpec(strategy="ps-sync", model="mlp")
    run = Run(index=0, profile=Profile(name="p", delay_us=50_000), repeat=0, job=job, workers=2)
    compute = {predict.job_key(job, 2): predict.Compute(0.002, MODEL)}
    fallback = predict.Predictor(collective={2: maths.AlphaBeta(0.0018, 2.3e-9)}, compute=compute)
    assert fallback.inputs(run).exchange_beta_s_per_byte is None and fallback.predict(run).step_s > 0
    calibrated = predict.Predictor(collective={2: maths.AlphaBeta(0.0018, 2.3e-9)}, compute=compute,
                                   exchange=exchange_calibration.Exchange(0.0002, 1.5e-9, 4 * MIB))
    x = calibrated.inputs(run)
    assert (x.exchange_alpha_s, x.exchange_beta_s_per_byte, x.window_bytes) == (0.0002, 1.5e-9, 4 * MIB)
    assert calibrated.predict(run).step_s == pytest.approx(step_model.predict(_inputs()).step_s)
