"""Pure tests of the delay engine's per-destination path: the PairScheduler (a far packet never
holds back a near one, order kept per destination, rate pacing, loss per destination, a change
of table keeps held release times), the engine switching between its two schedulers, the
destination read from the IPv4 header, many verdicts in one send, and the control socket's table."""

from __future__ import annotations

import ipaddress
import json
import sys
import time

import pytest

from netbench.emulation import engine_control as ec
from netbench.emulation import nfqueue as nfq
from netbench.emulation.delay_queue import DelayScheduler, DestParams, EngineParams
from netbench.emulation.engine import DelayEngine, parse_args
from netbench.emulation.pair_queue import MIN_LIMIT_BYTES, PairScheduler, limit_bytes
from tests.unit.test_engine_pure import LITTLE, _packet_msg

NEAR, FAR, OTHER = "10.213.0.2", "10.213.0.3", "10.213.0.9"


def key(address: str) -> int:
    return int(ipaddress.IPv4Address(address))


def table(*pairs: DestParams, delay_us: int = 0, seed: int = 1) -> EngineParams:
    return EngineParams(delay_us, seed=seed, pairs=pairs)


TWO = table(DestParams(NEAR, 2_000), DestParams(FAR, 25_000))


# --- the scheduler ---------------------------------------------------------------------------

def test_a_packet_to_a_far_peer_never_holds_back_one_to_a_near_peer():
    s = PairScheduler(TWO)
    assert s.arrive(1, 0.0, key(FAR), 1500) == pytest.approx(0.025)
    assert s.arrive(2, 0.001, key(NEAR), 1500) == pytest.approx(0.003)
    assert s.next_release_time() == pytest.approx(0.003)
    assert s.due(0.0029) == []
    assert s.due(0.003) == [2]  # the near packet leaves first, the far one still held
    assert len(s) == 1
    assert s.due(0.030) == [1]
    assert (s.released, len(s)) == (2, 0)


def test_release_order_is_kept_within_a_destination_under_jitter():
    s = PairScheduler(table(DestParams(NEAR, 5_000, 4_000), DestParams(FAR, 20_000, 15_000)))
    released = []
    for i in range(2000):
        s.arrive(i, i * 1e-4, key(NEAR if i % 2 else FAR), 100)
        released += s.due(i * 1e-4)
    released += s.due(10.0)
    assert sorted(released) == list(range(2000))
    for parity in (0, 1):
        mine = [i for i in released if i % 2 == parity]
        assert mine == sorted(mine)  # no reordering inside one destination
    assert released != sorted(released)  # but near packets overtake far ones


def test_rate_paces_a_destination_like_a_link_and_leaves_the_others_alone():
    s = PairScheduler(table(DestParams(FAR, 10_000, rate_bps=8_000_000), DestParams(NEAR, 1_000)))
    # 1000 bytes at 8 Mbit/s take 1 ms to send: a burst of five leaves 1 ms apart after the delay
    releases = [s.arrive(i, 0.0, key(FAR), 1000) for i in range(5)]
    assert releases == pytest.approx([0.011, 0.012, 0.013, 0.014, 0.015])
    assert s.arrive(9, 0.0, key(NEAR), 1000) == pytest.approx(0.001)  # not behind the paced ones
    # once the link is idle again a packet waits only its own sending time
    assert s.arrive(10, 1.0, key(FAR), 1000) == pytest.approx(1.011)


def test_a_rate_limited_destination_drops_past_its_queue_limit():
    params = DestParams(FAR, 10_000, rate_bps=8_000_000)
    limit = limit_bytes(params)
    assert limit == max(MIN_LIMIT_BYTES, int(8_000_000 / 8 * (0.010 + 0.05)))
    assert limit_bytes(DestParams(FAR, 10_000)) is None  # no rate: the kernel queue bounds it
    s = PairScheduler(table(params, DestParams(NEAR, 1_000)))
    kept = sum(s.arrive(i, 0.0, key(FAR), 1500) is not None for i in range(200))
    assert kept == limit // 1500
    assert s.overlimits == 200 - kept
    assert s.arrive(500, 0.0, key(NEAR), 1500) is not None  # another destination is not full
    rows = {row["dst"]: row for row in s.table_stats()}
    assert rows[FAR]["overlimits"] == 200 - kept and rows[FAR]["queue_depth"] == kept
    assert rows[NEAR]["overlimits"] == 0


def test_loss_is_per_destination_and_seeded():
    lossy = table(DestParams(FAR, 1_000, loss=1.0), DestParams(NEAR, 1_000, loss=0.0))
    s = PairScheduler(lossy)
    assert [s.arrive(i, 0.0, key(FAR), 100) for i in range(20)] == [None] * 20
    assert all(s.arrive(i, 0.0, key(NEAR), 100) is not None for i in range(20, 40))
    rows = {row["dst"]: row for row in s.table_stats()}
    assert (rows[FAR]["dropped"], rows[NEAR]["dropped"], s.dropped) == (20, 0, 20)

    def drops(seed: int) -> list[bool]:
        half = PairScheduler(table(DestParams(FAR, 0, loss=0.5), seed=seed))
        return [half.arrive(i, 0.0, key(FAR), 100) is None for i in range(200)]

    assert drops(3) == drops(3) and drops(3) != drops(4)
    assert 60 < sum(drops(3)) < 140


def test_destinations_not_in_the_table_pass_at_once_or_get_the_default():
    s = PairScheduler(TWO)
    assert s.arrive(7, 0.5, key(OTHER), 100) == 0.5
    assert s.arrive(8, 0.5, -1, 100) == 0.5  # not IPv4: the default too
    assert s.next_release_time() == float("-inf")
    assert s.due(0.5) == [7, 8]
    assert (s.passed, len(s)) == (2, 0)
    s = PairScheduler(table(DestParams(NEAR, 2_000), delay_us=7_000))
    assert s.arrive(1, 0.0, key(OTHER), 100) == pytest.approx(0.007)


def test_a_new_table_keeps_every_held_release_time_and_the_order_per_destination():
    s = PairScheduler(TWO)
    s.arrive(1, 0.0, key(FAR), 100)  # 25 ms
    s.arrive(2, 0.0, key(NEAR), 100)  # 2 ms
    s.set_params(table(DestParams(NEAR, 30_000), DestParams(FAR, 1_000)))
    assert s.arrive(3, 0.001, key(FAR), 100) == pytest.approx(0.025)  # never before the held far packet
    assert s.arrive(4, 0.001, key(NEAR), 100) == pytest.approx(0.031)
    assert s.due(0.002) == [2]  # held near packet: its old 2 ms
    assert s.due(0.025) == [1, 3]
    assert s.due(0.031) == [4]
    # a destination leaving the table keeps its held packets, then passes unshaped
    s.arrive(5, 1.0, key(FAR), 100)
    s.set_params(table(DestParams(NEAR, 30_000)))
    assert s.arrive(6, 1.0, key(FAR), 100) == pytest.approx(1.001)  # behind the held one, not before
    assert s.due(1.001) == [5, 6]
    assert s.arrive(7, 2.0, key(FAR), 100) == 2.0 and s.due(2.0) == [7]


def test_adopting_a_single_profile_schedulers_packets_keeps_their_times():
    old = DelayScheduler(EngineParams(20_000))
    old.arrive(1, 0.0)
    old.arrive(2, 0.001)
    s = PairScheduler(TWO)
    s.adopt(old)
    assert len(s) == 2
    # nothing that arrives later overtakes what the old scheduler held
    assert s.arrive(3, 0.002, key(NEAR), 100) == pytest.approx(0.021)
    assert s.due(0.020) == [1]
    assert s.due(0.021) == [2, 3]


def test_an_unshaped_destination_does_not_overtake_what_an_adopted_scheduler_holds():
    old = DelayScheduler(EngineParams(20_000))
    old.arrive(1, 0.0)
    s = PairScheduler(TWO)  # OTHER is in no table entry: unshaped
    s.adopt(old)
    assert s.arrive(2, 0.002, key(OTHER), 100) == pytest.approx(0.020)  # held to the old last release
    assert s.due(0.010) == []
    assert s.due(0.020) == [1, 2]
    assert s.arrive(3, 0.030, key(OTHER), 100) == 0.030 and s.due(0.030) == [3]  # then out at once


def test_flush_hands_back_everything_held():
    s = PairScheduler(TWO)
    for i, dst in enumerate((FAR, NEAR, FAR, OTHER)):
        s.arrive(i, 0.0, key(dst), 100)
    assert sorted(s.flush()) == [0, 1, 2, 3]
    assert len(s) == 0 and s.next_release_time() is None


# --- the engine around it ----------------------------------------------------------------------

class FakeQueue:
    """An NFQUEUE socket fed by the test: recv_batch returns what `feed` queued."""

    enobufs = stale_verdicts = gso_packets = 0

    def __init__(self) -> None:
        self.pending: list = []
        self.sent: list = []  # ("batch", max_id) or ("many", ids, verdict)
        self.destinations = False
        self.last_timestamps: list = []
        self.last_destinations: list = []

    def feed(self, packets: list[tuple[int, str]]) -> None:
        self.pending.append(packets)

    def recv_batch(self):
        if not self.pending:
            return None
        packets = self.pending.pop(0)
        self.last_timestamps = []
        self.last_destinations = [key(dst) for _, dst in packets] if self.destinations else []
        return [(packet_id, 100) for packet_id, _ in packets]

    def verdict(self, packet_id, verdict):
        self.sent.append(("one", packet_id, verdict))

    def verdict_batch(self, max_id, verdict):
        self.sent.append(("batch", max_id))

    def verdict_many(self, ids, verdict):
        self.sent.append(("many", list(ids), verdict))


def _engine(params: EngineParams) -> tuple[DelayEngine, FakeQueue]:
    engine = DelayEngine(params, 3)
    engine._queue = queue = FakeQueue()
    queue.destinations = engine._verdicts_per_packet
    return engine, queue


def test_the_engine_with_a_table_sends_one_verdict_per_packet_out_of_id_order():
    engine, queue = _engine(table(DestParams(NEAR, 0), DestParams(FAR, 10**9), DestParams(OTHER, 0, loss=1.0)))
    assert isinstance(engine.scheduler, PairScheduler) and queue.destinations
    queue.feed([(1, FAR), (2, NEAR), (3, OTHER), (4, "10.0.0.1")])
    engine._ingest()
    engine._release(time.monotonic() + 100)
    assert queue.sent == [("many", [3], nfq.NF_DROP), ("many", [4, 2], nfq.NF_ACCEPT)]
    stats = engine.stats()
    assert [row["dst"] for row in stats["pairs"]] == [NEAR, FAR, OTHER]
    assert stats["pairs"][1]["queue_depth"] == 1 and stats["passed"] == 1
    assert stats["params"] == {"delay_us": 0, "jitter_us": 0, "loss": 0.0, "seed": 1}


def test_the_single_profile_engine_keeps_the_batch_verdict_and_writes_no_table():
    engine, queue = _engine(EngineParams(0))
    assert isinstance(engine.scheduler, DelayScheduler) and not queue.destinations
    queue.feed([(1, FAR), (2, NEAR)])
    engine._ingest()
    engine._release(time.monotonic() + 1)
    assert queue.sent == [("batch", 2)]
    assert "pairs" not in engine.stats()


def test_the_engine_switches_to_the_table_and_back_to_the_fast_path_in_place():
    engine, queue = _engine(EngineParams(10**9))
    queue.feed([(1, FAR)])
    engine._ingest()  # held by the single-profile scheduler for 1000 s
    engine.set_params(table(DestParams(NEAR, 0)))
    assert isinstance(engine.scheduler, PairScheduler) and queue.destinations and len(engine.scheduler) == 1
    queue.feed([(2, NEAR)])
    engine._ingest()
    now = time.monotonic()
    engine._release(now + 100)
    # the adopted packet's destination is unknown: nothing new overtakes it, and no batch verdict
    assert queue.sent == [] and len(engine.scheduler) == 2
    engine.set_params(EngineParams(0))  # the table goes: the pair path until everything held is out
    engine._release(now + 100)
    assert isinstance(engine.scheduler, PairScheduler)
    engine._release(now + 2000)
    assert queue.sent == [("many", [1, 2], nfq.NF_ACCEPT)]
    assert isinstance(engine.scheduler, DelayScheduler) and not queue.destinations
    assert engine.stats()["accepted"] == 2 and engine.counters.reconfigurations == 2
    queue.feed([(3, NEAR)])
    engine._ingest()
    engine._release(time.monotonic() + 1)
    assert queue.sent[-1] == ("batch", 3)


# --- the wire: destinations and many verdicts ---------------------------------------------------

def _ipv4(dst: str) -> bytes:
    return bytes([0x45, 0]) + bytes(14) + ipaddress.IPv4Address(dst).packed + b"rest"


@LITTLE
def test_parse_reads_the_ipv4_destination_only_when_asked():
    buf = (_packet_msg(1, _ipv4(FAR), 1500) + _packet_msg(2, b"\x60" + bytes(39), None)  # IPv6
           + _packet_msg(3, _ipv4(NEAR)[:19], None) + _packet_msg(4, None, None))  # too short, META
    batch = nfq.parse_messages(buf, destinations=True)
    assert batch.destinations == [key(FAR), -1, -1, -1]
    assert [p[0] for p in batch.packets] == [1, 2, 3, 4]
    assert nfq.parse_messages(buf).destinations == []
    assert nfq.DEFAULT_COPY_RANGE >= nfq.IPV4_HEADER_BYTES


def test_many_verdicts_are_single_verdict_messages_back_to_back():
    many = nfq.encode_verdicts(5, [7, 0xFFFFFFFE], nfq.NF_ACCEPT)
    one = nfq.encode_verdict(5, 7, nfq.NF_ACCEPT)
    assert many == one + nfq.encode_verdict(5, 0xFFFFFFFE, nfq.NF_ACCEPT)
    assert nfq.encode_verdicts(5, [], nfq.NF_DROP) == b""


# --- parameters: CLI, control socket -------------------------------------------------------------

def test_params_refuse_a_bad_table():
    for bad in ({"dst": "10.0.0.300"}, {"dst": NEAR, "delay_us": -1}, {"dst": NEAR, "loss": 2},
                {"dst": NEAR, "rate_bps": 0}):
        with pytest.raises(ValueError):
            DestParams(**bad)
    with pytest.raises(ValueError, match="given twice"):
        table(DestParams(NEAR), DestParams(NEAR, 5))


def test_a_set_with_pairs_carries_the_table_and_one_without_drops_it():
    msg = {"op": "set", "delay_us": 0, "id": 1, "pairs": [{"dst": FAR, "delay_us": 25_000, "rate_bps": 10**9}]}
    reply, new = ec.handle_request(json.dumps(msg).encode(), EngineParams(5_000, seed=3))
    assert reply["ok"] and new == EngineParams(0, seed=3, pairs=(DestParams(FAR, 25_000, rate_bps=10**9),))
    assert reply["params"]["pairs"] == [{"dst": FAR, "delay_us": 25_000, "jitter_us": 0, "loss": 0.0,
                                         "rate_bps": 10**9}]
    reply, plain = ec.handle_request(b'{"op": "set", "delay_us": 1000}', new)
    assert reply["ok"] and plain.pairs == () and "pairs" not in reply["params"]
    for pairs, words in (([], "non-empty list"), ([{"dst": "nope"}], "IPv4"),
                         ([{"dst": FAR, "colour": 1}], "unknown pair field")):
        reply, none = ec.handle_request(json.dumps({"op": "set", "delay_us": 0, "pairs": pairs}).encode(), new)
        assert none is None and not reply["ok"] and words in reply["error"]


def test_the_engine_command_line_takes_a_pairs_file(tmp_path, capsys):
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps({"pairs": [{"dst": NEAR, "delay_us": 2000}, {"dst": FAR, "delay_us": 25000}]}))
    _, params = parse_args(["--queue-num", "1", "--pairs-file", str(path)])
    assert params == EngineParams(0, pairs=(DestParams(NEAR, 2000), DestParams(FAR, 25000)))
    path.write_text('{"pairs": [{"dst": "10.1.1"}]}')
    with pytest.raises(SystemExit) as info:
        parse_args(["--queue-num", "1", "--pairs-file", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--pairs-file" in err and "IPv4" in err
    with pytest.raises(SystemExit):
        parse_args(["--queue-num", "1"])
    assert "--delay-us" in capsys.readouterr().err


if sys.byteorder != "little":  # pragma: no cover - the packet builders are little-endian
    pytestmark = pytest.mark.skip(reason="hand-built bytes are little-endian")


def test_a_pause_between_the_engines_two_clock_reads_never_releases_a_packet_early(monkeypatch):
    # the kernel stamped the packet at wall 1000.000 (monotonic 50.000); the engine reads its two
    # clocks 1 ms later and is descheduled for 0.7 ms after the first read, whichever it is
    from netbench.emulation import engine as engine_module

    reads: list[str] = []

    def elapsed(kind: str) -> float:
        reads.append(kind)
        return 0.001 + (0.0007 if len(reads) > 1 else 0.0)

    engine, queue = _engine(EngineParams(10_000))
    queue.feed([(1, FAR)])
    original = queue.recv_batch

    def recv_with_stamp():
        got = original()
        queue.last_timestamps = [1000.000] if got else []
        return got
    queue.recv_batch = recv_with_stamp
    monkeypatch.setattr(engine_module.time, "monotonic", lambda: 50.0 + elapsed("monotonic"))
    monkeypatch.setattr(engine_module.time, "time", lambda: 1000.0 + elapsed("wall"))
    engine._ingest()
    release = engine.scheduler.next_release_time()
    assert release >= 50.000 + 0.010 - 1e-9, release  # the 10 ms from the kernel's stamp, or later
