"""Pure tests of the delay engine's scheduler, CLI validation and the NFQUEUE wire format."""

from __future__ import annotations

import errno
import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from netbench.emulation import nfqueue as nfq
from netbench.emulation.engine import (
    DelayScheduler,
    EngineParams,
    parse_args,
    write_json_atomic,
)

LITTLE = pytest.mark.skipif(sys.byteorder != "little", reason="hand-built bytes are little-endian")


# --- EngineParams ------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"delay_us": -1},
    {"delay_us": 1.5},
    {"delay_us": 10, "jitter_us": -3},
    {"delay_us": 10, "loss": 1.01},
    {"delay_us": 10, "loss": -0.1},
    {"delay_us": 10, "loss": float("nan")},
])
def test_params_rejects_invalid(kwargs):
    with pytest.raises(ValueError):
        EngineParams(**kwargs)


def test_params_frozen():
    p = EngineParams(10)
    with pytest.raises(AttributeError):
        p.delay_us = 5  # type: ignore[misc]


# --- scheduler ---------------------------------------------------------------

def test_release_is_arrival_plus_delay():
    s = DelayScheduler(EngineParams(delay_us=20_000))
    assert s.arrive(1, 100.0) == pytest.approx(100.020, abs=1e-12)
    assert s.arrive(2, 100.5) == pytest.approx(100.520, abs=1e-12)
    assert s.next_release_time() == pytest.approx(100.020)
    assert len(s) == 2


def test_due_semantics():
    s = DelayScheduler(EngineParams(delay_us=1_000))
    assert s.due(1e9) is None  # nothing held
    assert s.next_release_time() is None
    for i, t in enumerate([0.0, 0.0005, 0.002], start=11):
        s.arrive(i, t)
    assert s.due(0.0009) is None  # before the first release
    assert s.due(0.001) == 11  # release time <= now is due
    assert s.next_release_time() == pytest.approx(0.0015)
    assert s.due(0.0029) == 12
    assert s.due(0.0029) is None  # already popped
    assert s.due(10.0) == 13
    assert len(s) == 0
    assert s.released == 3


def test_due_returns_highest_of_many():
    s = DelayScheduler(EngineParams(delay_us=0))
    for i in range(5, 105):
        s.arrive(i, i * 1e-3)
    assert s.due(0.05) == 50
    assert s.released == 46
    assert s.due(1.0) == 104


def test_lateness_recorded_per_packet():
    s = DelayScheduler(EngineParams(delay_us=1_000))
    s.arrive(1, 0.0)
    s.arrive(2, 0.001)
    s.due(0.0025)  # 1.5 ms and 0.5 ms late
    d = s.lateness.as_dict_us()
    assert d["count"] == 2
    assert d["max"] == pytest.approx(1500, abs=0.2)
    assert d["mean"] == pytest.approx(1000, abs=0.2)
    assert (d["over_1ms"], d["over_10ms"]) == (1, 0)
    s.arrive(3, 0.003)
    s.due(0.0145)  # 10.5 ms late
    d = s.lateness.as_dict_us()
    assert (d["count"], d["over_1ms"], d["over_10ms"]) == (3, 2, 1)


def test_flush_returns_last_id_and_empties():
    s = DelayScheduler(EngineParams(delay_us=10**9))
    assert s.flush() is None
    for i in (3, 4, 9):
        s.arrive(i, 0.0)
    assert s.flush() == 9
    assert len(s) == 0 and s.released == 3 and s.next_release_time() is None


def _arrivals(n: int, gap_s: float) -> list[tuple[int, float]]:
    return [(i + 1, i * gap_s) for i in range(n)]


def test_jitter_never_reorders_and_stays_in_bounds():
    delay, jitter = 10_000, 8_000
    s = DelayScheduler(EngineParams(delay_us=delay, jitter_us=jitter, seed=7))
    prev = -math.inf
    for pid, t in _arrivals(20_000, 50e-6):  # packets closer than the jitter
        rel = s.arrive(pid, t)
        assert rel >= prev  # no reordering
        assert t + (delay - jitter) / 1e6 - 1e-12 <= rel <= t + (delay + jitter) / 1e6 + 1e-12
        prev = rel


def test_jitter_spreads_over_whole_range():
    delay, jitter = 10_000, 2_000
    s = DelayScheduler(EngineParams(delay_us=delay, jitter_us=jitter, seed=3))
    # Arrivals far apart (> 2*jitter) so the no-reorder clamp never applies.
    extra = [s.arrive(pid, t) - t for pid, t in _arrivals(5_000, 0.01)]
    assert min(extra) < (delay - 0.9 * jitter) / 1e6
    assert max(extra) > (delay + 0.9 * jitter) / 1e6
    assert sum(extra) / len(extra) == pytest.approx(delay / 1e6, abs=60e-6)


def test_jitter_clamped_at_zero_total_delay():
    s = DelayScheduler(EngineParams(delay_us=100, jitter_us=5_000, seed=1))
    for pid, t in _arrivals(2_000, 0.1):
        assert s.arrive(pid, t) >= t


def test_loss_rate_within_binomial_bound():
    n, p = 100_000, 0.3
    s = DelayScheduler(EngineParams(delay_us=0, loss=p, seed=42))
    dropped = sum(s.arrive(pid, t) is None for pid, t in _arrivals(n, 1e-6))
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(dropped - n * p) < 5 * sigma
    assert s.dropped == dropped
    assert len(s) == n - dropped


@pytest.mark.parametrize("loss,expected", [(0.0, 0), (1.0, 1000)])
def test_loss_extremes(loss, expected):
    s = DelayScheduler(EngineParams(delay_us=0, loss=loss))
    assert sum(s.arrive(pid, t) is None for pid, t in _arrivals(1000, 1e-3)) == expected


def test_loss_is_seeded():
    def pattern(seed):
        s = DelayScheduler(EngineParams(delay_us=0, loss=0.5, seed=seed))
        return [s.arrive(pid, t) is None for pid, t in _arrivals(200, 1e-3)]

    assert pattern(5) == pattern(5)
    assert pattern(5) != pattern(6)


def test_dropped_packets_are_never_due():
    s = DelayScheduler(EngineParams(delay_us=0, loss=1.0))
    s.arrive(1, 0.0)
    assert s.due(1.0) is None and s.next_release_time() is None


# --- stats file and CLI ------------------------------------------------------

def test_write_json_atomic(tmp_path):
    path = tmp_path / "stats.json"
    write_json_atomic(str(path), {"a": 1})
    write_json_atomic(str(path), {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"]


def test_parse_args_ok(tmp_path):
    args, params = parse_args(["--queue-num", "7", "--delay-us", "1500", "--jitter-us", "100",
                               "--loss", "0.25", "--seed", "9", "--stats-file",
                               str(tmp_path / "s.json"), "--maxlen", "10"])
    assert params == EngineParams(1500, 100, 0.25, 9)
    assert (args.queue_num, args.maxlen) == (7, 10)


@pytest.mark.parametrize("argv", [
    ["--delay-us", "10"],
    ["--queue-num", "70000", "--delay-us", "10"],
    ["--queue-num", "1", "--delay-us", "-5"],
    ["--queue-num", "1", "--delay-us", "5", "--loss", "1.5"],
    ["--queue-num", "1", "--delay-us", "5", "--loss", "nan"],
    ["--queue-num", "1", "--delay-us", "5", "--maxlen", "0"],
    ["--queue-num", "1", "--delay-us", "x"],
    ["--queue-num", "1", "--delay-us", "5", "--stats-file", "/nonexistent-dir/s.json"],
])
def test_parse_args_rejects_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err


def test_cli_bad_args_exit_2():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run([sys.executable, "-m", "netbench.emulation.engine", "--queue-num", "1",
                          "--delay-us", "5", "--loss", "2"], capture_output=True, text=True,
                         timeout=30, env=env)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.strip().count("\n") == 0 and "--loss" in res.stderr


# --- nfqueue encoding --------------------------------------------------------

def _nlhdr(length: int, mtype: int, flags: int, seq: int = 0) -> bytes:
    """Little-endian nlmsghdr, hand-built (pid 0)."""
    return (length.to_bytes(4, "little") + mtype.to_bytes(2, "little")
            + flags.to_bytes(2, "little") + seq.to_bytes(4, "little") + bytes(4))


@LITTLE
def test_encode_verdict_single():
    got = nfq.encode_verdict(queue_num=3, packet_id=0x01020304, verdict=nfq.NF_ACCEPT, seq=9)
    expected = (_nlhdr(32, 0x0301, 0x1, 9)
                + b"\x00\x00\x00\x03"  # nfgenmsg: AF_UNSPEC, V0, res_id=3 big-endian
                + b"\x0c\x00\x02\x00"  # nlattr len 12, NFQA_VERDICT_HDR
                + b"\x00\x00\x00\x01"  # verdict NF_ACCEPT, big-endian
                + b"\x01\x02\x03\x04")  # id, big-endian
    assert got == expected


@LITTLE
def test_encode_verdict_batch_drop():
    got = nfq.encode_verdict(queue_num=0x0102, packet_id=77, verdict=nfq.NF_DROP, batch=True)
    expected = (_nlhdr(32, 0x0303, 0x1) + b"\x00\x00\x01\x02" + b"\x0c\x00\x02\x00"
                + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x4d")
    assert got == expected


@LITTLE
def test_encode_config_bind_and_unbind():
    bind = nfq.encode_config_cmd(5, nfq.NFQNL_CFG_CMD_BIND, seq=1)
    assert bind == (_nlhdr(28, 0x0302, 0x5, 1) + b"\x00\x00\x00\x05"
                    + b"\x08\x00\x01\x00" + b"\x01\x00\x00\x00")
    pf = nfq.encode_config_cmd(5, nfq.NFQNL_CFG_CMD_PF_BIND, pf=socket.AF_INET, seq=2)
    assert pf[-4:] == b"\x03\x00\x00\x02"  # command 3, pad, pf=AF_INET big-endian
    unbind = nfq.encode_config_cmd(5, nfq.NFQNL_CFG_CMD_UNBIND)
    assert unbind[-4:] == b"\x02\x00\x00\x00"


@LITTLE
def test_encode_config_params_is_packed_and_padded():
    got = nfq.encode_config_params(1, nfq.NFQNL_COPY_PACKET, 64, seq=4)
    expected = (_nlhdr(32, 0x0302, 0x5, 4) + b"\x00\x00\x00\x01"
                + b"\x09\x00\x02\x00"  # len 9 = 4 + 5 (packed struct)
                + b"\x00\x00\x00\x40" + b"\x02"  # copy_range be32, copy_mode u8
                + b"\x00\x00\x00")  # pad to 4
    assert got == expected


@LITTLE
def test_encode_config_maxlen_and_flags():
    maxlen = nfq.encode_config_maxlen(1, 65536)
    assert maxlen[20:] == b"\x08\x00\x03\x00" + b"\x00\x01\x00\x00"
    flags = nfq.encode_config_flags(1, nfq.NFQA_CFG_F_GSO, nfq.NFQA_CFG_F_GSO)
    assert flags[20:] == (b"\x08\x00\x04\x00" + b"\x00\x00\x00\x04"  # mask
                          + b"\x08\x00\x05\x00" + b"\x00\x00\x00\x04")  # flags
    assert int.from_bytes(flags[:4], "little") == len(flags) == 36


# --- nfqueue parsing ---------------------------------------------------------

def _attr(atype: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return (length.to_bytes(2, "little") + atype.to_bytes(2, "little") + payload
            + bytes((-length) % 4))


def _packet_msg(packet_id: int, payload: bytes | None, cap_len: int | None,
                skb_info: int | None = None, queue: int = 0) -> bytes:
    body = b"\x02\x00" + queue.to_bytes(2, "big")  # AF_INET, V0, res_id
    # packet_hdr: id be32, hw_protocol be16 (IPv4), hook u8 (POSTROUTING=4)
    body += _attr(1, packet_id.to_bytes(4, "big") + b"\x08\x00" + b"\x04")
    body += _attr(6, (3).to_bytes(4, "big"))  # NFQA_IFINDEX_OUTDEV, ignored
    if skb_info is not None:
        body += _attr(14, skb_info.to_bytes(4, "big"))
    if payload is not None:
        body += _attr(10, payload)
    if cap_len is not None:
        body += _attr(13, cap_len.to_bytes(4, "big"))
    return _nlhdr(16 + len(body), 0x0300, 0) + body


def _error_msg(err: int, orig_type: int, orig_seq: int) -> bytes:
    payload = (-err).to_bytes(4, "little", signed=True) + _nlhdr(32, orig_type, 1, orig_seq)
    return _nlhdr(16 + len(payload), 2, 0, orig_seq) + payload


@LITTLE
def test_parse_packets_lengths_and_gso():
    buf = (_packet_msg(1, b"x" * 64, 1500)  # truncated copy: CAP_LEN is the length
           + _packet_msg(2, b"y" * 41, None)  # whole packet copied
           + _packet_msg(0xFFFFFFFE, None, None, skb_info=nfq.NFQA_SKB_GSO))  # META mode
    batch = nfq.parse_messages(buf)
    assert batch.packets == [(1, 1500), (2, 41), (0xFFFFFFFE, -1)]
    assert batch.errors == [] and batch.gso_packets == 1


@LITTLE
def test_parse_errors_and_acks():
    buf = (_error_msg(0, 0x0302, 5) + _packet_msg(9, b"z" * 8, 100)
           + _error_msg(errno.ENOENT, 0x0303, 0))
    batch = nfq.parse_messages(bytearray(buf + bytes(64)), len(buf))
    assert batch.packets == [(9, 100)]
    assert batch.errors == [nfq.NetlinkError(seq=5, errno=0, msg_type=0x0302),
                            nfq.NetlinkError(seq=0, errno=errno.ENOENT, msg_type=0x0303)]


@LITTLE
def test_parse_rejects_truncated():
    msg = _packet_msg(1, b"x" * 64, 1500)
    with pytest.raises(ValueError):
        nfq.parse_messages(msg[:-8])
    bad_attr = bytearray(msg)
    bad_attr[20:22] = (200).to_bytes(2, "little")  # attribute longer than message
    with pytest.raises(ValueError):
        nfq.parse_messages(bytes(bad_attr))


@LITTLE
def test_parse_packet_without_header_attr_is_error():
    body = b"\x02\x00\x00\x00" + _attr(13, (5).to_bytes(4, "big"))
    with pytest.raises(ValueError):
        nfq.parse_messages(_nlhdr(16 + len(body), 0x0300, 0) + body)


@LITTLE
def test_roundtrip_encoded_messages_parse_as_non_packets():
    buf = nfq.encode_verdict(1, 5, nfq.NF_ACCEPT) + nfq.encode_config_cmd(1, 1)
    assert nfq.parse_messages(buf).packets == []


def test_parse_proc_queue():
    text = ("    0   1234     5 2    64     7     8     4242  1\n"
            "    3   5678     0 2    64     0     0       10  1\n")
    got = nfq.parse_proc_queue(text, 3)
    assert got == {"queue_num": 3, "peer_portid": 5678, "queue_total": 0, "copy_mode": 2,
                   "copy_range": 64, "queue_dropped": 0, "user_dropped": 0, "id_sequence": 10}
    assert nfq.parse_proc_queue(text, 0)["user_dropped"] == 8
    assert nfq.parse_proc_queue(text, 9) is None


def test_constants_match_kernel_header():
    assert (nfq.NFQNL_MSG_PACKET, nfq.NFQNL_MSG_VERDICT, nfq.NFQNL_MSG_CONFIG,
            nfq.NFQNL_MSG_VERDICT_BATCH) == (0x300, 0x301, 0x302, 0x303)
    assert (nfq.NFQA_PACKET_HDR, nfq.NFQA_VERDICT_HDR, nfq.NFQA_PAYLOAD, nfq.NFQA_CAP_LEN,
            nfq.NFQA_SKB_INFO) == (1, 2, 10, 13, 14)
    assert (nfq.NFQA_CFG_CMD, nfq.NFQA_CFG_PARAMS, nfq.NFQA_CFG_QUEUE_MAXLEN,
            nfq.NFQA_CFG_MASK, nfq.NFQA_CFG_FLAGS) == (1, 2, 3, 4, 5)
    assert nfq.NFQA_CFG_F_GSO == 4 and nfq.NFQNL_COPY_PACKET == 2


def test_socket_rejects_bad_queue_num():
    with pytest.raises(ValueError):
        nfq.NfqueueSocket(queue_num=70000)
