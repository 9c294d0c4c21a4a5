"""Root tier: the NFQUEUE delay engine on two real namespaces joined by a veth pair.

Namespace A holds ``iptables -t mangle -A POSTROUTING -o veth-a -j NFQUEUE`` and the
engine; pings go A -> B, so only the echo requests are queued (replies enter A on
ingress) and the RTT rises by exactly one engine delay.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (creates network namespaces)"),
]

REPO = Path(__file__).resolve().parents[2]
ADDR_A, ADDR_B = "10.254.91.1", "10.254.91.2"
QUEUE = 4
_counter = itertools.count()


@dataclass(frozen=True)
class Pair:
    """Two namespaces joined by veth-a (in a) <-> veth-b (in b)."""

    a: str
    b: str


def _in_ns(name: str):
    from pyroute2 import netns

    return lambda: netns.setns(name, flags=0)


def _run_in(ns: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, preexec_fn=_in_ns(ns), capture_output=True, text=True,
                          timeout=timeout)


def _addr_up(ipr, ifname: str, address: str) -> None:
    idx = ipr.link_lookup(ifname=ifname)[0]
    ipr.addr("add", index=idx, address=address, prefixlen=24)
    ipr.link("set", index=idx, state="up")
    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


def _remove_ns(names: list[str]) -> None:
    from pyroute2 import netns

    existing = netns.listnetns()
    for name in names:
        if name in existing:
            netns.remove(name)


@pytest.fixture
def pair():
    from pyroute2 import NetNS, netns

    base = f"nbtest-eng-{os.getpid()}-{next(_counter)}"
    names = [f"{base}a", f"{base}b"]
    try:
        for name in names:
            netns.create(name)
        with NetNS(names[0], flags=0) as ns:
            ns.link("add", ifname="veth-a", kind="veth",
                    peer={"ifname": "veth-b", "net_ns_fd": names[1]})
            _addr_up(ns, "veth-a", ADDR_A)
        with NetNS(names[1], flags=0) as ns:
            _addr_up(ns, "veth-b", ADDR_B)
        rule = ["iptables", "-t", "mangle", "-A", "POSTROUTING", "-o", "veth-a",
                "-j", "NFQUEUE", "--queue-num", str(QUEUE)]
        res = _run_in(names[0], rule)
        assert res.returncode == 0, res.stderr
        yield Pair(*names)
    finally:
        _remove_ns(names)


class Engine:
    """An engine process inside a namespace; always killed by the fixture."""

    def __init__(self, ns: str, stats: Path, *args: str) -> None:
        argv = [sys.executable, "-m", "netbench.emulation.engine", "--queue-num", str(QUEUE),
                "--stats-file", str(stats), *args]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.stats_path = stats
        self.proc = subprocess.Popen(argv, preexec_fn=_in_ns(ns), env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.ready = self._wait_ready(timeout=15)

    def _wait_ready(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise AssertionError(f"engine not ready: {self.proc.stderr.read()}")
        return json.loads(line)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)

    def stats(self) -> dict:
        return json.loads(self.stats_path.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def start_engine(pair, tmp_path):
    engines: list[Engine] = []

    def start(*args: str) -> Engine:
        engine = Engine(pair.a, tmp_path / f"stats-{len(engines)}.json", *args)
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.kill()


def _ping(ns: str, count: int, interval: float, wait_s: int = 2) -> tuple[float | None, int, int]:
    """(avg rtt ms or None, transmitted, received) of a quiet ping A -> B."""
    out = _run_in(ns, ["ping", "-c", str(count), "-i", str(interval), "-W", str(wait_s),
                       "-q", ADDR_B]).stdout
    sent, recv = map(int, re.search(r"(\d+) packets transmitted, (\d+) received", out).groups())
    avg = re.search(r"= [\d.]+/([\d.]+)/", out)
    return (float(avg.group(1)) if avg else None), sent, recv


def _wait_held(engine: Engine, depth: int, timeout: float = 5.0) -> None:
    """Wait until the engine's stats file (rewritten ~1/s) shows ``depth`` held packets."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if engine.stats()["queue_depth"] == depth:
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"engine never held {depth} packet(s)")


def test_ready_line(start_engine):
    engine = start_engine("--delay-us", "1000")
    assert engine.ready["event"] == "ready"
    assert engine.ready["pid"] == engine.proc.pid
    assert engine.ready["queue_num"] == QUEUE
    assert engine.ready["params"] == {"delay_us": 1000, "jitter_us": 0, "loss": 0.0, "seed": 0}
    assert engine.terminate() == 0


def test_without_engine_queued_packets_are_dropped(pair):
    # The rule has no --queue-bypass: with nobody bound, the kernel drops.
    _, sent, recv = _ping(pair.a, 2, 0.1, wait_s=1)
    assert (sent, recv) == (2, 0)


def test_delay_raises_rtt(pair, start_engine):
    engine = start_engine("--delay-us", "20000")
    avg, sent, recv = _ping(pair.a, 20, 0.05)
    assert sent == recv == 20
    assert 19.5 <= avg <= 25.0, avg
    assert engine.terminate() == 0
    stats = engine.stats()
    assert stats["final"] is True
    assert stats["received"] == stats["accepted"] == 20
    assert stats["dropped"] == 0 and stats["queue_depth"] == 0
    assert stats["lateness_us"]["count"] == 20
    assert stats["kernel"]["queue_total"] == 0


def test_loss_drops_packets(pair, start_engine):
    engine = start_engine("--delay-us", "1000", "--loss", "0.3", "--seed", "11")
    _, sent, recv = _ping(pair.a, 40, 0.02, wait_s=1)
    lost = sent - recv
    assert 0.1 * sent <= lost <= 0.55 * sent, (sent, recv)
    assert engine.terminate() == 0
    stats = engine.stats()
    # only echo requests pass A's egress, so every engine drop is exactly one lost ping
    assert stats["dropped"] == lost
    assert stats["received"] == sent and stats["accepted"] == recv


def test_jitter_keeps_order_and_mean(pair, start_engine):
    engine = start_engine("--delay-us", "10000", "--jitter-us", "4000", "--seed", "2")
    avg, sent, recv = _ping(pair.a, 30, 0.03)
    assert sent == recv
    assert 8.0 <= avg <= 14.0, avg
    assert engine.terminate() == 0


def test_sigterm_releases_held_packets(pair, start_engine):
    engine = start_engine("--delay-us", "5000000")  # 5 s: the ping would wait
    ping = subprocess.Popen(["ping", "-c", "1", "-W", "10", ADDR_B], preexec_fn=_in_ns(pair.a),
                            stdout=subprocess.PIPE, text=True)
    try:
        _wait_held(engine, 1)  # the echo request is now held by the engine
        t0 = time.monotonic()
        assert engine.terminate() == 0
        out, _ = ping.communicate(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        if ping.poll() is None:
            ping.kill()
    assert ping.returncode == 0, out
    assert elapsed < 2.0
    rtt = float(re.search(r"time=([\d.]+) ms", out).group(1))
    assert 300 < rtt < 3000
    stats = engine.stats()
    assert stats["final"] is True and stats["accepted"] == 1 and stats["max_queue_depth"] == 1


def test_second_engine_on_same_queue_fails(pair, start_engine):
    start_engine("--delay-us", "1000")
    with pytest.raises(AssertionError, match="already bound"):
        start_engine("--delay-us", "1000")


def test_engine_exit_without_traffic_unbinds(pair, start_engine):
    first = start_engine("--delay-us", "1000")
    assert first.terminate() == 0
    second = start_engine("--delay-us", "1000")  # queue is free again
    assert second.terminate() == 0


# --- in-place changes through the control socket (Engines, as netbench runs them) -------------

@pytest.fixture
def managed(pair, tmp_path):
    """Engines and a journal in a scratch state dir; every engine left is stopped."""
    from netbench.emulation.engines import Engines
    from netbench.state.journal import Journal

    journal = Journal(tmp_path / "state")
    engines = Engines(journal.dir)
    yield engines, journal
    from netbench.state.reset import undo_entry

    for entry in reversed(journal.pending()):
        undo_entry(entry, {pair.a, pair.b})
        journal.done(entry)


def _ping_lines(ns: str, count: int, interval: float) -> subprocess.Popen:
    return subprocess.Popen(["ping", "-D", "-c", str(count), "-i", str(interval), "-W", "2", ADDR_B],
                            preexec_fn=_in_ns(ns), stdout=subprocess.PIPE, text=True)


def _sent_and_rtt(out: str) -> list[tuple[float, float]]:
    """(send time as epoch seconds, rtt ms) of each reply in `ping -D` output."""
    rows = []
    for stamp, rtt in re.findall(r"^\[([\d.]+)\].*icmp_seq=\d+ .*time=([\d.]+) ms", out, re.M):
        rows.append((float(stamp) - float(rtt) / 1000, float(rtt)))
    return rows


def _stats_after_change(engines, netns: str, reconfigurations: int) -> dict:
    """The engine's stats once they count `reconfigurations` (written STATS_AFTER_SET_S after
    its answer); the last read if they never do within a second."""
    deadline = time.monotonic() + 1.0
    while ((stats := engines.read(netns, QUEUE) or {}).get("reconfigurations", 0) < reconfigurations
           and time.monotonic() < deadline):
        time.sleep(0.01)
    return stats


def test_reconfigure_changes_a_live_engine_without_a_restart(pair, managed):
    engines, journal = managed
    pid = engines.start(pair.a, QUEUE, 20_000, 0, 0.0, 1, journal)
    ctl = engines.control_path(pair.a, QUEUE)
    assert ctl.is_socket()
    avg, sent, recv = _ping(pair.a, 5, 0.05)
    assert sent == recv == 5 and avg >= 20.0
    assert engines.reconfigure(pair.a, QUEUE, 5_000, 1_000, 0.0, 7, journal) is True
    stats = _stats_after_change(engines, pair.a, 1)  # written by the engine just after it answered
    assert stats["pid"] == pid and stats["alive"] is True
    assert stats["params"] == {"delay_us": 5_000, "jitter_us": 1_000, "loss": 0.0, "seed": 7}
    assert stats["reconfigurations"] == 1 and stats["received"] == 5
    with pytest.raises(Exception, match="refused the change: loss must be"):
        engines.reconfigure(pair.a, QUEUE, 5_000, 0, 1.5, 7, journal)
    assert engines.read(pair.a, QUEUE)["params"]["delay_us"] == 5_000  # still running, unchanged
    avg, sent, recv = _ping(pair.a, 5, 0.05)
    assert sent == recv == 5 and 4.0 <= avg < 20.0
    assert engines.stop(pair.a, QUEUE, journal) is True
    assert not ctl.exists()
    assert engines.reconfigure(pair.a, QUEUE, 5_000, 0, 0.0, 7, journal) is False


def test_a_killed_engines_control_socket_is_removed(pair, managed):
    from netbench import proc

    engines, journal = managed
    pid = engines.start(pair.a, QUEUE, 1_000, 0, 0.0, 1, journal)
    ctl = engines.control_path(pair.a, QUEUE)
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        if proc.start_time(pid) is None:
            break
        time.sleep(0.01)
    assert ctl.exists()  # a KILL leaves it behind
    assert engines.reconfigure(pair.a, QUEUE, 2_000, 0, 0.0, 1, journal) is False
    engines.stop(pair.a, QUEUE, journal)
    assert not ctl.exists()


def test_reset_after_a_killed_controller_stops_the_engine_and_its_socket(pair, managed):
    from netbench import proc
    from netbench.state.reset import undo_entry

    engines, journal = managed
    pid = engines.start(pair.a, QUEUE, 1_000, 0, 0.0, 1, journal)
    started = proc.start_time(pid)
    assert engines.reconfigure(pair.a, QUEUE, 2_000, 0, 0.0, 1, journal) is True
    # the controller is gone; what reset does with the journal:
    lines = [undo_entry(entry, {pair.a, pair.b}) for entry in reversed(journal.pending())]
    assert any(line and str(pid) in line for line in lines)
    assert not proc.is_same_process(pid, started)
    assert not engines.control_path(pair.a, QUEUE).exists()  # the engine removed it on TERM


def test_delay_changes_under_ping_never_release_early_nor_lose(pair, managed):
    """20 ms -> 10 ms -> 20 ms while pinging every 10 ms. Only echo requests are delayed (one
    engine delay per RTT): a packet sent before a change keeps the delay it arrived under,
    none is faster than the delay in force when it was sent, none is lost."""
    engines, journal = managed
    engines.start(pair.a, QUEUE, 20_000, 0, 0.0, 1, journal)
    count = 150
    ping = _ping_lines(pair.a, count, 0.01)
    try:
        time.sleep(0.4)
        to_10 = time.time()
        assert engines.reconfigure(pair.a, QUEUE, 10_000, 0, 0.0, 1, journal) is True
        to_10_done = time.time()
        time.sleep(0.4)
        to_20 = time.time()
        assert engines.reconfigure(pair.a, QUEUE, 20_000, 0, 0.0, 1, journal) is True
        to_20_done = time.time()
        out, _ = ping.communicate(timeout=30)
    finally:
        if ping.poll() is None:
            ping.kill()
            ping.wait()
    rows = _sent_and_rtt(out)
    assert len(rows) == count, out[-500:]  # none lost
    assert min(rtt for _, rtt in rows) >= 10.0
    slow = [(sent, rtt) for sent, rtt in rows if sent < to_10 or sent > to_20_done]
    fast = [(sent, rtt) for sent, rtt in rows if to_10_done < sent < to_20]
    assert len(slow) > 40 and len(fast) > 20
    assert all(rtt >= 20.0 for _, rtt in slow), slow
    assert sorted(rtt for _, rtt in fast)[len(fast) // 2] < 20.0  # the change took effect
    assert _stats_after_change(engines, pair.a, 2)["reconfigurations"] == 2


def test_a_second_start_on_a_served_queue_leaves_the_live_engines_socket(pair, managed):
    from netbench.errors import EmulationError

    engines, journal = managed
    pid = engines.start(pair.a, QUEUE, 1_000, 0, 0.0, 1, journal)
    with pytest.raises(EmulationError, match="already bound"):
        engines.start(pair.a, QUEUE, 2_000, 0, 0.0, 1, journal)
    assert engines.reconfigure(pair.a, QUEUE, 3_000, 0, 0.0, 1, journal) is True
    assert _stats_after_change(engines, pair.a, 1)["pid"] == pid
