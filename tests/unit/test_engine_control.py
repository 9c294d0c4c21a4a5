"""The delay engine's control channel without root: the scheduler's in-place change, request
parsing and validation, the socket on both ends, the engine's handling of a request, and
Engines.reconfigure / stop / reset against an in-process stand-in for an engine."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
from pyroute2 import netns as pnetns

from netbench import proc
from netbench.emulation import engine_control as ec
from netbench.emulation.engine import DelayEngine, DelayScheduler, EngineParams
from netbench.emulation.engines import Engines
from netbench.errors import EmulationError
from netbench.state.journal import Journal
from netbench.state.reset import reset

P20 = EngineParams(delay_us=20_000, seed=1)
P10 = EngineParams(delay_us=10_000, seed=1)


# --- DelayScheduler.set_params -------------------------------------------------------------

def test_set_params_keeps_held_release_times_and_delays_new_arrivals():
    sched = DelayScheduler(P20)
    assert sched.arrive(1, 0.000) == pytest.approx(0.020)
    assert sched.arrive(2, 0.001) == pytest.approx(0.021)
    sched.set_params(EngineParams(delay_us=50_000, seed=1))
    assert sched.next_release_time() == pytest.approx(0.020)  # held: unchanged
    assert sched.arrive(3, 0.002) == pytest.approx(0.052)  # new arrival: new delay
    assert sched.due(0.021) == 2  # the held two leave on their old schedule
    assert sched.due(0.0519) is None and sched.due(0.0521) == 3


def test_set_params_shorter_delay_never_releases_before_a_held_packet():
    sched = DelayScheduler(P20)
    sched.arrive(1, 0.000)  # release 0.020
    sched.set_params(P10)
    assert sched.arrive(2, 0.001) == pytest.approx(0.020)  # 0.011 would overtake packet 1
    assert sched.arrive(3, 0.015) == pytest.approx(0.025)  # past the held one: plain new delay
    assert sched.due(0.0199) is None
    assert sched.due(0.020) == 2


def test_set_params_reseeds_and_changes_loss():
    fresh = DelayScheduler(EngineParams(delay_us=0, loss=0.5, seed=9))
    changed = DelayScheduler(EngineParams(delay_us=0, seed=3))
    changed.arrive(0, 0.0)
    changed.set_params(EngineParams(delay_us=0, loss=0.5, seed=9))
    pattern = [[s.arrive(i, 0.0) is None for i in range(1, 200)] for s in (fresh, changed)]
    assert pattern[0] == pattern[1] and any(pattern[0]) and not all(pattern[0])
    assert changed.params.seed == 9


# --- handle_request ------------------------------------------------------------------------

def _handle(obj, params=P20):
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return ec.handle_request(data, params)


def test_set_applies_and_replies_with_the_new_params():
    reply, new = _handle({"op": "set", "delay_us": 10_000, "jitter_us": 500, "loss": 0.25, "seed": 4, "id": "a"})
    assert new == EngineParams(10_000, 500, 0.25, 4)
    assert reply == {"ok": True, "id": "a", "params": {"delay_us": 10_000, "jitter_us": 500, "loss": 0.25,
                                                        "seed": 4}}


def test_set_keeps_fields_left_out():
    current = EngineParams(20_000, 300, 0.1, 7)
    _, new = _handle({"op": "set", "delay_us": 5}, current)
    assert new == EngineParams(5, 300, 0.1, 7)


def test_ping_changes_nothing():
    reply, new = _handle({"op": "ping", "id": 3})
    assert new is None and reply["ok"] is True and reply["id"] == 3 and reply["params"]["delay_us"] == 20_000


@pytest.mark.parametrize("data, words", [
    (b"{not json", "not a JSON object"),
    (b"\xff\xfe", "not a JSON object"),
    (b"[1, 2]", "not a JSON object"),
    ({"op": "reboot", "id": 1}, "unknown op 'reboot'"),
    ({"id": 1}, "unknown op None"),
    ({"op": "set", "delay_us": -1, "id": 1}, "delay_us must be an int >= 0"),
    ({"op": "set", "delay_us": 10, "jitter_us": -2, "id": 1}, "jitter_us must be an int >= 0"),
    ({"op": "set", "delay_us": 10, "loss": 1.5, "id": 1}, "loss must be a ratio in [0, 1]"),
    ({"op": "set", "delay_us": 10, "loss": "0.1", "id": 1}, "loss must be a number"),
    ({"op": "set", "delay_us": 1.5, "id": 1}, "delay_us must be an integer"),
    ({"op": "set", "delay_us": True, "id": 1}, "delay_us must be an integer"),
    ({"op": "set", "delay_us": 10, "seed": "x", "id": 1}, "seed must be an integer"),
    ({"op": "set", "jitter_us": 10, "id": 1}, "set needs delay_us"),
    ({"op": "set", "delay_us": 10, "rate": 5, "id": 1}, "unknown field(s) rate"),
])
def test_bad_requests_get_a_one_line_error(data, words):
    reply, new = _handle(data)
    assert new is None
    assert reply["ok"] is False and words in reply["error"] and "\n" not in reply["error"]
    assert reply["id"] == (1 if isinstance(data, dict) and "id" in data else None)


def test_nan_loss_is_refused():
    reply, new = ec.handle_request(b'{"op": "set", "delay_us": 1, "loss": NaN}', P20)
    assert new is None and "loss must be a number" in reply["error"]


# --- the socket, both ends -----------------------------------------------------------------

class Server:
    """A ControlSocket answered by a thread, standing in for an engine's loop."""

    def __init__(self, path: Path, params: EngineParams = P20) -> None:
        self.params = params
        self.sock = ec.ControlSocket(str(path))
        self._stop_r, self._stop_w = socket.socketpair()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _apply(self, new: EngineParams) -> None:
        self.params = new

    def _run(self) -> None:
        import select

        while True:
            ready, _, _ = select.select([self.sock.fileno(), self._stop_r], [], [])
            if self._stop_r in ready:
                return
            ec.serve_pending(self.sock, lambda: self.params, self._apply)

    def close(self) -> None:
        self._stop_w.send(b"x")
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def server(tmp_path):
    servers: list[Server] = []

    def make(path: Path, params: EngineParams = P20) -> Server:
        servers.append(Server(path, params))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_socket_is_private_replaces_a_stale_file_and_is_removed_on_close(tmp_path):
    path = tmp_path / "e.ctl"
    path.write_text("stale")
    sock = ec.ControlSocket(str(path))
    try:
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    finally:
        sock.close()
    assert not path.exists()


def test_request_roundtrip_and_client_socket_removed(tmp_path, server):
    srv = server(tmp_path / "e.ctl")
    reply = ec.request(str(tmp_path / "e.ctl"), {"op": "set", "delay_us": 7, "id": 5})
    assert reply == {"ok": True, "id": 5, "params": {"delay_us": 7, "jitter_us": 0, "loss": 0.0, "seed": 1}}
    assert srv.params.delay_us == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.ctl"]


def test_request_many_gets_every_reply_from_more_engines_than_a_socket_queue_holds(tmp_path, server):
    """64 engines asked at once: a unix datagram socket queues at most max_dgram_qlen (10)
    replies, and an engine's reply to a full queue is lost (its socket does not block); sent
    all at once, most of 64 replies were lost and the change timed out."""
    servers = [server(tmp_path / f"e{i}.ctl") for i in range(64)]
    messages = [(str(s.sock.path), {"op": "set", "delay_us": 10_000 + i, "jitter_us": 0, "loss": 0.0, "seed": i,
                                    "id": i}) for i, s in enumerate(servers)]
    replies = ec.request_many(messages, timeout_s=5.0)
    assert [r["ok"] for r in replies] == [True] * 64
    assert [s.params.delay_us for s in servers] == [10_000 + i for i in range(64)]
    missing = ec.request_many([(str(tmp_path / "nobody.ctl"), {"op": "ping", "id": "x"})])
    assert isinstance(missing[0], FileNotFoundError)


def test_request_over_a_path_too_long_for_a_socket_address(tmp_path, server):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "netbench-sw-q12.ctl"
    assert len(str(path)) > 108
    server(path)
    assert ec.request(str(path), {"op": "ping", "id": 1})["ok"] is True
    assert [p.name for p in deep.iterdir()] == ["netbench-sw-q12.ctl"]


def test_request_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        ec.request(str(tmp_path / "none.ctl"), {"op": "ping"})
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    mute.bind(str(tmp_path / "mute.ctl"))
    try:
        with pytest.raises(TimeoutError):
            ec.request(str(tmp_path / "mute.ctl"), {"op": "ping"}, timeout_s=0.05)
    finally:
        mute.close()
    with pytest.raises(ConnectionRefusedError):  # the file of a killed engine
        ec.request(str(tmp_path / "mute.ctl"), {"op": "ping"})


# --- the engine's handling -----------------------------------------------------------------

class QuietQueue:
    """An NFQUEUE socket with nothing pending."""

    enobufs = stale_verdicts = gso_packets = 0

    def recv_batch(self):
        return None


def _engine(tmp_path) -> DelayEngine:
    engine = DelayEngine(P20, 3, stats_file=str(tmp_path / "stats.json"), control_path=str(tmp_path / "e.ctl"))
    engine._queue = QuietQueue()
    engine._control = ec.ControlSocket(engine.control_path)
    return engine


def _ask(engine: DelayEngine, tmp_path: Path, payload: bytes) -> dict:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    client.bind(str(tmp_path / "client.sock"))
    client.settimeout(5)
    try:
        client.sendto(payload, engine.control_path)
        engine._serve_control()
        return json.loads(client.recv(4096))
    finally:
        client.close()
        os.unlink(tmp_path / "client.sock")


def test_engine_applies_a_set_answers_first_and_writes_stats_soon_after(tmp_path):
    """A schedule changes 64 engines at once: the reply does not wait on the stats file (the
    loop writes it STATS_AFTER_SET_S later, before its usual interval)."""
    from netbench.emulation import engine as engine_module

    engine = _engine(tmp_path)
    try:
        engine.scheduler.arrive(1, 0.0)
        before = time.monotonic()
        reply = _ask(engine, tmp_path, b'{"op": "set", "delay_us": 10000, "seed": 2, "id": 9}')
        assert reply["ok"] is True and reply["id"] == 9
        assert engine.params == engine.scheduler.params == EngineParams(10_000, seed=2)
        assert engine.scheduler.next_release_time() == pytest.approx(0.020)  # the held packet
        assert not (tmp_path / "stats.json").exists()  # not written before the reply
        due = engine.stats_due
        assert before + engine_module.STATS_AFTER_SET_S <= due <= time.monotonic() + engine_module.STATS_AFTER_SET_S
        assert engine.stats_at(due + 1.0) == due and engine.stats_at(due - 0.5) == due - 0.5
        _ask(engine, tmp_path, b'{"op": "set", "delay_us": 10000, "seed": 2, "id": 10}')
        assert engine.stats_due == due  # a second change does not put the write off
        engine.write_stats(final=False)  # as the loop does at stats_at()
        stats = json.loads((tmp_path / "stats.json").read_text())
        assert stats["params"]["delay_us"] == 10_000 and stats["reconfigurations"] == 2
        assert stats["control"] == str(tmp_path / "e.ctl")
    finally:
        engine._control.close()


def test_engine_refuses_a_bad_set_and_keeps_going(tmp_path):
    engine = _engine(tmp_path)
    try:
        for bad in (b"garbage", b'{"op": "set", "delay_us": -5}', b'{"op": "set", "delay_us": 1, "loss": 2}'):
            reply = _ask(engine, tmp_path, bad)
            assert reply["ok"] is False and reply["error"]
        assert engine.params == P20 and engine.counters.reconfigurations == 0
        assert _ask(engine, tmp_path, b'{"op": "ping"}')["ok"] is True
        assert engine.stats()["reconfigurations"] == 0
    finally:
        engine._control.close()


# --- Engines -------------------------------------------------------------------------------

@pytest.fixture
def journal(tmp_path, monkeypatch):
    monkeypatch.setattr(pnetns, "listnetns", lambda *args, **kwargs: [])
    return Journal(tmp_path / "state")


def _record_self(journal: Journal, netns: str = "ns1", queue: int = 3) -> None:
    """This test process stands in for the live engine (a thread answers its socket)."""
    journal.record("process", pid=os.getpid(), start=proc.start_time(os.getpid()), netns=netns,
                   queue=queue, role="engine")


def test_reconfigure_without_a_live_engine_is_false(journal):
    engines = Engines(journal.dir)
    assert engines.reconfigure("ns1", 3, 1000, 0, 0.0, 1, journal) is False
    journal.record("process", pid=2**22 + 7, start=1, netns="ns1", queue=3, role="engine")  # gone
    assert engines.reconfigure("ns1", 3, 1000, 0, 0.0, 1, journal) is False
    _record_self(journal)  # alive, but no control socket (an older engine)
    assert engines.reconfigure("ns1", 3, 1000, 0, 0.0, 1, journal) is False


def test_reconfigure_sends_the_change(journal, server):
    engines = Engines(journal.dir)
    engines.dir.mkdir(parents=True)
    srv = server(engines.control_path("ns1", 3))
    _record_self(journal)
    assert engines.reconfigure("ns1", 3, 10_000, 200, 0.01, 5, journal) is True
    assert srv.params == EngineParams(10_000, 200, 0.01, 5)
    assert engines.reconfigure("ns1", 4, 10_000, 0, 0.0, 5, journal) is False  # another queue


def test_reconfigure_refused_or_unanswered_raises(journal, server):
    engines = Engines(journal.dir)
    engines.dir.mkdir(parents=True)
    server(engines.control_path("ns1", 3))
    _record_self(journal)
    with pytest.raises(EmulationError, match="refused the change: loss must be") as info:
        engines.reconfigure("ns1", 3, 10_000, 0, 3.0, 5, journal)
    assert info.value.hint
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    mute.bind(str(engines.control_path("ns1", 4)))
    _record_self(journal, queue=4)
    engines.CONTROL_TIMEOUT_S = 0.05
    try:
        with pytest.raises(EmulationError, match="did not take the change"):
            engines.reconfigure("ns1", 4, 10_000, 0, 0.0, 5, journal)
    finally:
        mute.close()


def test_stop_removes_a_killed_engines_control_file(journal):
    engines = Engines(journal.dir)
    engines.dir.mkdir(parents=True)
    ctl = engines.control_path("ns1", 3)
    ctl.write_text("")
    journal.record("process", pid=2**22 + 7, start=1, netns="ns1", queue=3, role="engine")
    assert engines.stop("ns1", 3, journal) is False
    assert not ctl.exists() and journal.pending() == []


def test_reset_removes_stale_control_files(journal):
    engines = Engines(journal.dir)
    engines.dir.mkdir(parents=True)
    for name in ("netbench-sw-q1.ctl", ".client-1-0.sock"):
        (engines.dir / name).write_text("")
    reset(journal)
    assert not engines.dir.exists()


# --- hostile datagrams: refused in one line, the engine carries on -------------------------

HUGE = "9" * 5000  # over Python's 4,300-digit limit for int(str): json.loads raises ValueError


@pytest.mark.parametrize("data", [
    b'{"op": "set", "delay_us": ' + HUGE.encode() + b'}',
    b'{"op": "ping", "id": ' + HUGE.encode() + b'}',
    b'{"op": "set", "delay_us": 1' + b"0" * 400 + b'}',  # 10**400 us
    b'{"op": "set", "delay_us": 4294967296}',  # past 2**32 - 1 us
    b'{"op": "set", "delay_us": 1, "jitter_us": 1' + b"0" * 400 + b'}',
    b'{"op": "set", "delay_us": 1, "seed": 1' + b"0" * 400 + b'}',
    b'{"op": "set", "delay_us": 1, "loss": 1' + b"0" * 400 + b'}',
    b'{"op": "set", "delay_us": 1, "loss": 1e400}',
    b'{"op": "set", "delay_us": 1, "pairs": [{"dst": "10.0.0.2", "delay_us": 1' + b"0" * 400 + b'}]}',
    b'{"op": "set", "delay_us": 1, "pairs": [{"dst": "10.0.0.2", "rate_bps": 1' + b"0" * 400 + b'}]}',
    b'{"op": "set", "delay_us": 1, "pairs": [{"dst": "10.0.0.2", "loss": 1' + b"0" * 400 + b'}]}',
    b'{"op": "set", "delay_us": 1, "pairs": [{"dst": "' + b"1" * 60000 + b'"}]}',
    b'{"op": "set", "delay_us": 1, "pairs": [{"dst": ["x"]}]}',
    b'{"op": ' + b"[" * 100000 + b"]" * 100000 + b'}',
    b"[" * 100000 + b"]" * 100000,
    b'{"op": "' + b"x" * 60000 + b'"}',
])
def test_a_hostile_datagram_gets_a_short_refusal_and_changes_nothing(data):
    reply, new = ec.handle_request(data, P20)
    assert new is None and reply["ok"] is False
    assert len(reply["error"]) < 300 and "\n" not in reply["error"]
    assert json.loads(ec.encode(reply)) == reply  # the reply can be sent


def test_an_id_that_cannot_be_echoed_is_dropped_from_the_reply():
    reply, new = ec.handle_request(b'{"op": "set", "delay_us": 5, "id": 1' + b"0" * 400 + b'}', P20)
    assert reply["ok"] is True and reply["id"] is None and new == EngineParams(5, seed=1)
    assert ec.handle_request(b'{"op": "ping", "id": "' + b"a" * 5000 + b'"}', P20)[0]["id"] is None


def test_the_engine_takes_whatever_a_profile_may_ask():
    from netbench.emulation.delay_queue import DestParams
    from netbench.model import profile

    EngineParams(profile.MAX_DELAY_US, profile.MAX_JITTER_US, 1.0, 2**32 - 1)
    DestParams("10.0.0.2", profile.MAX_DELAY_US, profile.MAX_JITTER_US, 1, profile.MAX_RATE_BPS)


def test_a_set_the_engine_cannot_apply_is_refused_and_the_next_request_answered(tmp_path):
    """Whatever applying a change raises, the engine answers with an error and keeps serving."""
    control = ec.ControlSocket(str(tmp_path / "ctl.sock"))
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    client.bind(str(tmp_path / "client.sock"))
    client.settimeout(5)
    params = [P20]

    def apply(new):
        if new.delay_us == 666:
            raise OverflowError("int too large to convert to float")
        params[0] = new

    try:
        for delay in (666, 7):
            client.sendto(json.dumps({"op": "set", "delay_us": delay, "id": delay}).encode(), control.path)
        import select

        select.select([control], [], [], 5)
        assert ec.serve_pending(control, lambda: params[0], apply) == 1
        first, second = (json.loads(client.recv(65536)) for _ in range(2))
        assert first == {"ok": False, "id": 666, "error": "cannot apply: OverflowError: int too large to convert to float"}
        assert second["ok"] is True and params[0].delay_us == 7
    finally:
        client.close()
        control.close()


# --- where sockets are bound: private folders, the umask left alone -------------------------

def test_binding_never_touches_the_process_umask(tmp_path, monkeypatch, server):
    """The umask is process-wide: changed for a moment, it would reach every file another
    thread (a log, a record) creates meanwhile."""
    calls = []
    monkeypatch.setattr(os, "umask", lambda *a: calls.append(a) or 0o022)
    path = tmp_path / "e.ctl"
    path.write_text("stale")
    server(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_ISSOCK(path.stat().st_mode)
    assert ec.request(str(path), {"op": "ping", "id": 1})["ok"] is True
    assert calls == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.ctl"]  # no private folder left


def test_the_client_socket_of_a_long_path_is_in_a_private_folder_not_a_predictable_tmp_name(tmp_path, monkeypatch):
    """A path too long for a socket address sent the client to /tmp under a name anyone
    could guess (and take first): it now binds in a new 0700 folder of its own."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(ec.tempfile, "tempdir", str(temp))
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "netbench-sw-q12.ctl"
    control = ec.ControlSocket(str(path))
    seen = []

    def engine():
        import select

        select.select([control], [], [], 5)
        data, address = control.receive()
        seen.append((address, stat.S_IMODE(os.stat(os.path.dirname(address)).st_mode)))
        control.reply(address, ec.handle_request(data, P20)[0])

    thread = threading.Thread(target=engine, daemon=True)
    thread.start()
    try:
        assert ec.request(str(path), {"op": "ping", "id": 1})["ok"] is True
    finally:
        thread.join(timeout=5)
        control.close()
    (address, mode), = seen
    folder = Path(address).parent
    assert folder.parent == temp and folder.name.startswith("netbench-") and mode == 0o700
    assert f"{os.getpid()}" not in folder.name  # not a name another user could work out
    assert list(temp.iterdir()) == []  # the folder and the socket are gone
