"""SSH connection set-up is bounded on every hop, opens of one host never race, and lease
renewals never hold up the controller's exit. Fakes and loopback listeners only: a TCP port
on 127.0.0.1 that accepts (the kernel completes the handshake) and never sends a banner."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from netbench.errors import TestbedError
from netbench.remote import keeper as leases
from netbench.remote import ssh as ssh_mod
from netbench.remote.inventory import Host, Inventory, inventory_from_mapping
from netbench.remote.ssh import CommandResult, FabricHost
from tests.fakes.remote import FakeHost

BOUND_S = 0.5


@pytest.fixture
def mute_port():
    """A port on 127.0.0.1 that accepts connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()


@pytest.fixture
def short_bound(monkeypatch):
    monkeypatch.setattr(ssh_mod, "CONNECT_TIMEOUT_S", BOUND_S)


def _open_within(host: FabricHost, seconds: float) -> TestbedError:
    """host._open() in a thread: the error it raised, failing the test if it ran past `seconds`."""
    errors: list[BaseException] = []

    def open_it():
        try:
            host._open()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=open_it, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"SSH set-up still waiting after {seconds}s"
    assert time.monotonic() - started < seconds
    (error,) = errors
    assert isinstance(error, TestbedError), repr(error)
    return error


def test_a_host_that_never_sends_a_banner_fails_within_the_bound(tmp_path, mute_port, short_bound):
    """paramiko waits 15 s for a banner by default."""
    inv = Inventory(path=str(tmp_path / "inv.yaml"), hosts=(), ssh_config=str(tmp_path / "none"))
    (tmp_path / "none").write_text("")
    host = FabricHost(Host(name="a", ssh="127.0.0.1", port=mute_port, interface="eth1", agent=False), inv)
    error = _open_within(host, 8 * BOUND_S)
    assert "host a" in error.message and "SSH set-up did not finish within 0.5s" in error.message


def test_a_jump_host_that_never_sends_a_banner_fails_within_the_bound(tmp_path, mute_port, short_bound):
    """A ProxyJump hop got neither connect_timeout nor the banner, auth or channel bounds."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host target\n  HostName 127.0.0.2\n  Port 22\n  ProxyJump jump\n"
                      f"Host jump\n  HostName 127.0.0.1\n  Port {mute_port}\n")
    inv = Inventory(path=str(tmp_path / "inv.yaml"), hosts=(), ssh_config=str(config))
    host = FabricHost(Host(name="a", ssh="target", interface="eth1", agent=False), inv)
    assert host.conn.gateway is not None
    error = _open_within(host, 8 * BOUND_S)
    assert "host a" in error.message and "did not finish within 0.5s" in error.message


def test_every_hop_bounds_connect_banner_auth_and_channel_set_up(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host target\n  ProxyJump mid\nHost mid\n  ProxyJump outer\nHost outer\n  ConnectTimeout 2\n")
    inv = Inventory(path=str(tmp_path / "inv.yaml"), hosts=(), ssh_config=str(config))
    host = FabricHost(Host(name="a", ssh="target", interface="eth1"), inv)
    hops = []
    hop = host.conn
    while hop is not None and not isinstance(hop, str):
        hops.append(hop)
        hop = hop.gateway
    assert [h.host for h in hops] == ["target", "mid", "outer"]
    for hop in hops:
        assert {k: hop.connect_kwargs.get(k) for k in ("banner_timeout", "auth_timeout", "channel_timeout")} == \
            {"banner_timeout": ssh_mod.CONNECT_TIMEOUT_S, "auth_timeout": ssh_mod.CONNECT_TIMEOUT_S,
             "channel_timeout": ssh_mod.CONNECT_TIMEOUT_S}, hop.host
    bound = ssh_mod.CONNECT_TIMEOUT_S
    assert [h.connect_timeout for h in hops] == [bound, bound, 2]  # a smaller ConnectTimeout is kept


def test_concurrent_reconnects_to_one_host_open_it_once(tmp_path):
    """A renewal's thread and the main thread both find the connection closed."""
    opened = []
    inside = threading.Event()

    class SlowConn:
        is_connected = False

        def open(self):
            opened.append(threading.current_thread().name)
            inside.set()
            time.sleep(0.3)
            SlowConn.is_connected = True

    (tmp_path / "none").write_text("")
    inv = Inventory(path=str(tmp_path / "inv.yaml"), hosts=(), ssh_config=str(tmp_path / "none"))
    host = FabricHost(Host(name="a", ssh="127.0.0.1", interface="eth1"), inv)
    host.conn = SlowConn()
    threads = [threading.Thread(target=host._open) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(opened) == 1, opened


_STALLED_KEEPER = """
import threading, time
from netbench.remote import keeper as leases
from netbench.remote.inventory import inventory_from_mapping
from netbench.remote.ssh import CommandResult
from tests.fakes.remote import FakeHost

started = threading.Event()

def stall(command, input):
    started.set()
    time.sleep(120)
    return CommandResult(0, "", "")

inv = inventory_from_mapping({"defaults": {"interface": "eth1"}, "hosts": {"a": {"ssh": "a"}}}, "inv.yaml")
with leases.LeaseKeeper(inv, [FakeHost("a", [("netbench.state.lease renew", stall)])], seconds=3, holder="me"):
    assert started.wait(10)
    began = time.monotonic()
print(f"exit took {time.monotonic() - began:.1f}s")
"""


def test_a_renewal_stalled_on_a_dead_host_never_holds_up_exit():
    """The keeper's exit returns at once, and the interpreter then ends: a ThreadPoolExecutor's
    workers (daemon or not) are joined at exit, so a renewal stuck in SSH set-up kept the
    controller alive after Ctrl-C."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    try:
        result = subprocess.run([sys.executable, "-c", _STALLED_KEEPER], capture_output=True, text=True,
                                timeout=30, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the controller did not exit while a renewal was stalled")
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout.split()[-1].rstrip("s")) < 2.0
    assert time.monotonic() - began < 25


def test_renewals_still_go_at_most_renew_workers_at_a_time(monkeypatch):
    monkeypatch.setattr(leases, "RENEW_WORKERS", 2)
    busy, peak, lock = [0], [0], threading.Lock()

    def slow(command, input):
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        time.sleep(0.1)
        with lock:
            busy[0] -= 1
        return CommandResult(0, "", "")

    names = [f"h{i}" for i in range(5)]
    inv = inventory_from_mapping({"defaults": {"interface": "eth1"}, "hosts": {n: {"ssh": n} for n in names}}, "i.yaml")
    hosts = [FakeHost(n, [("netbench.state.lease renew", slow)]) for n in names]
    keeper = leases.LeaseKeeper(inv, hosts, seconds=6, holder="me")
    keeper.renew_once()
    assert all(len(h.commands) == 1 for h in hosts) and not keeper.failures and peak[0] == 2
