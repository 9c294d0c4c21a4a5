"""The controller's `node serve` channels (remote/channel.py) over fake channels, and once
against the real serve loop (remote/serve.py) through pipes."""

from __future__ import annotations

import json
import os
import threading

import pytest
from tests.fakes.remote import FakeHost, FakeServe, FakeStream, ok_json, serve_handler

from netbench.emulation import changes as ch
from netbench.errors import TestbedError
from netbench.remote import controller as remote
from netbench.remote.agent import HOST_NETNS
from netbench.remote.channel import AgentChannel, close_agents, open_agent, open_agents
from netbench.remote.inventory import inventory_from_mapping

INV = inventory_from_mapping({
    "defaults": {"interface": "eth1", "venv": "/opt/nb"},
    "hosts": {"a": {"ssh": "10.0.0.1"}, "b": {"ssh": "10.0.0.2"}}}, "inv.yaml")
PLAN = [ch.SetTbf("a", HOST_NETNS, "eth1", 10_000_000, 15140, 62500)]


def serving_host(name: str, handler=None) -> FakeHost:
    return FakeHost(name, [(" reset ", ok_json({"removed": ["qdisc"]}))],
                    streams=[(" serve", lambda command: FakeServe(handler or serve_handler()))])


def test_open_agents_pings_each_host_and_skips_one_without_serve():
    old_netbench = FakeHost("b", streams=[(" serve", lambda command: FakeStream(
        stderr="Error: No such command 'serve'.\n", code=2))])
    agents = open_agents(INV, [serving_host("a"), old_netbench])
    assert list(agents) == ["a"] and agents["a"].pid == 4321
    assert agents["a"].stream.ops() == ["ping"]
    close_agents(agents)
    assert agents["a"].stream.ops() == ["ping", "bye"] and not agents["a"].alive


def test_a_host_whose_serve_answers_nonsense_gets_no_channel():
    host = serving_host("a", lambda request: {"ok": False, "error": "request: unknown op 'ping'"})
    assert open_agent(host, INV.hosts[0]) is None


def test_a_request_without_an_answer_in_time_closes_the_channel():
    stream = FakeServe(lambda request: None)  # the host hangs
    agent = AgentChannel("a", stream)
    with pytest.raises(TestbedError, match=r"host a: netbench node serve: no answer to apply within 0\.05s"):
        agent.request("apply", timeout=0.05, plan={})
    assert not agent.alive and stream.closed
    with pytest.raises(TestbedError, match="host a: its netbench node serve channel is closed"):
        agent.request("ping")
    agent.close()  # nothing left to close: no error


def test_a_late_reply_to_an_older_request_is_not_taken_for_the_next_ones():
    stream = FakeServe(serve_handler())
    agent = AgentChannel("a", stream)
    stream.emit(json.dumps({"ok": False, "id": 0, "error": "late"}))  # a reply given up on earlier
    assert agent.request("ping")["ok"] is True and agent.alive


def test_a_reply_that_is_not_json_or_an_ended_agent_is_an_error_naming_the_host():
    stream = FakeServe(lambda request: None)
    agent = AgentChannel("a", stream)
    stream.emit("Traceback (most recent call last):")
    with pytest.raises(TestbedError, match="host a: netbench node serve answered 'Traceback"):
        agent.request("ping")
    ended = AgentChannel("b", FakeStream(stderr="Error: No such command 'serve'.\n", code=2))
    with pytest.raises(TestbedError, match="host b: netbench node serve ended before answering ping: "
                                           "Error: No such command 'serve'."):
        ended.request("ping")


def test_a_change_that_fails_on_one_host_resets_the_others_and_names_it():
    def refuse(request):
        if request["op"] == "apply":
            return {"ok": False, "error": "netlink: Invalid argument (tbf burst)", "hint": "look at dmesg",
                    "exit_code": 1}
        return serve_handler()(request)

    a, b = serving_host("a"), serving_host("b", refuse)
    conns = [a, b]
    agents = open_agents(INV, conns)
    planned = remote.RemoteApply(backends={"a": "userspace", "b": "userspace"}, plans={"a": PLAN, "b": PLAN})
    with pytest.raises(remote.RemoteError, match=r"host b: netlink: Invalid argument \(tbf burst\)") as info:
        remote.apply_inventory(INV, conns, planned, lease_s=30, holder="c1", agents=agents)
    assert info.value.hint == "look at dmesg"
    assert a.ran(" reset ") and not b.ran(" reset ")  # b undid its own change
    assert agents["b"].alive  # an error reply leaves the channel usable
    close_agents(agents)


def test_a_wrong_shaped_apply_answer_is_refused():
    agents = open_agents(INV, [serving_host("a", lambda r: serve_handler()(r) if r["op"] != "apply" else
                                            {"ok": True, "applied": "everything"})])
    with pytest.raises(remote.RemoteError, match="answered apply with JSON of the wrong shape: 'applied'"):
        agents["a"].apply(PLAN, 0, False, None, False)


class PipeStream:
    """A channel to a real serve() loop running in a thread, through two pipes."""

    def __init__(self, journal, make_executor) -> None:
        from netbench.remote.serve import serve

        to_host, self._to_host = os.pipe()
        from_host_r, from_host_w = os.pipe()
        self.stdout = os.fdopen(from_host_r, "rb")
        self._stdin = os.fdopen(self._to_host, "wb")
        host_in, host_out = os.fdopen(to_host, "r"), os.fdopen(from_host_w, "w")

        def run() -> None:
            try:
                self.answered = serve(journal, host_in, host_out, environ={}, make_executor=make_executor)
            finally:
                host_out.close()
                host_in.close()

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def write(self, data: bytes) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def close_stdin(self) -> None:
        if not self._stdin.closed:
            self._stdin.close()

    def exit_status(self, timeout):
        self.thread.join(timeout)
        return None if self.thread.is_alive() else 0

    def close(self) -> None:
        self.close_stdin()
        self.thread.join(10)


def test_the_controllers_channel_and_the_hosts_serve_loop_understand_each_other(tmp_path, monkeypatch):
    from tests.fakes.netlink import FakeEngines, FakeIptables, FakeQdiscs

    from netbench.emulation.executor import Executor
    from netbench.remote import agent as host_agent
    from netbench.state import lease
    from netbench.state.journal import Journal

    monkeypatch.setattr(host_agent, "attach_own_netns", lambda j: "nbhost-test-none")
    monkeypatch.setattr(host_agent, "_ensure_watcher", lambda j: 4242)
    monkeypatch.setattr(host_agent, "control_interfaces", lambda environ: {"eth0"})
    qdiscs = FakeQdiscs()
    journal = Journal(tmp_path)
    stream = PipeStream(journal, lambda j: Executor(journal=j, qdiscs=qdiscs, iptables=FakeIptables(),
                                                    engines=FakeEngines()))
    agent = AgentChannel("a", stream)
    assert agent.request("ping")["ops"] == ["apply", "ping", "bye"]
    reply = agent.apply(PLAN, 30, False, "c1", False)
    assert reply["applied"] == [PLAN[0].describe()] and reply["watcher_pid"] == 4242
    assert qdiscs.state[("nbhost-test-none", "eth1")]["rate_bps"] == 10_000_000
    assert lease.read(tmp_path).holder == "c1"
    with pytest.raises(remote.RemoteError, match="host a: plan shapes eth0, which carries this SSH") as info:
        agent.apply([ch.SetTbf("a", HOST_NETNS, "eth0", 1_000_000, 15140, 62500)], 30, False, "c1", False)
    assert info.value.exit_code == 2 and "--force" in info.value.hint
    agent.close()
    assert not stream.thread.is_alive() and stream.answered == 4  # ping, two applies, bye
