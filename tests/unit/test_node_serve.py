"""`netbench node serve` (remote/serve.py): one JSON request per line in, one reply per line
out, against the fake adapters and a journal in tmp_path (the kernel left out)."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time

import pytest
from click.testing import CliRunner
from tests.fakes.netlink import FakeEngines, FakeIptables, FakeQdiscs

from netbench.emulation import changes as ch
from netbench.emulation import wire
from netbench.emulation.executor import Executor
from netbench.errors import EmulationError
from netbench.remote import agent
from netbench.remote.agent import HOST_NETNS
from netbench.remote.serve import parse_request, serve
from netbench.state import lease
from netbench.state.journal import Journal

BAD_RATE = 666_000  # the fake kernel refuses a tbf of this rate


def tbf(rate_bps: int) -> list[ch.Change]:
    return [ch.ClearIngress("a", HOST_NETNS, "eth1", "nbifb-eth1"), ch.ClearQdisc("a", HOST_NETNS, "eth1"),
            ch.SetTbf("a", HOST_NETNS, "eth1", rate_bps, 15140, 62500)]


def apply_line(plan: list[ch.Change], request_id: int = 1, **fields) -> str:
    return json.dumps({"op": "apply", "id": request_id, "plan": json.loads(wire.plan_to_json(plan)), **fields})


class Host:
    """A host for serve(): the fake kernel, its executors (made once, closed at the end)."""

    def __init__(self, tmp_path, monkeypatch) -> None:
        self.journal = Journal(tmp_path)
        self.qdiscs = FakeQdiscs(before=self._refuse)
        self.executors: list[Executor] = []
        self.closed = 0
        monkeypatch.setattr(agent, "attach_own_netns", lambda j: "nbhost-test-none")
        monkeypatch.setattr(agent, "_ensure_watcher", lambda j: 4242)
        monkeypatch.setattr(agent, "control_interfaces", lambda environ: {"eth0"})  # SSH arrives on eth0

    @staticmethod
    def _refuse(adapter, method, kwargs) -> None:
        if kwargs.get("rate_bps") == BAD_RATE:
            raise EmulationError("netlink: Invalid argument (tbf burst)")

    def make_executor(self, journal: Journal) -> Executor:
        host = self

        class Closing(Executor):
            def close(self) -> None:
                host.closed += 1

        executor = Closing(journal=journal, qdiscs=self.qdiscs, iptables=FakeIptables(), engines=FakeEngines())
        self.executors.append(executor)
        return executor

    def serve(self, *lines: str) -> list[dict]:
        out = io.StringIO()
        answered = serve(self.journal, io.StringIO("".join(line + "\n" for line in lines)), out,
                         environ={}, make_executor=self.make_executor)
        replies = [json.loads(line) for line in out.getvalue().splitlines()]
        assert answered == len(replies)
        return replies


@pytest.fixture
def host(tmp_path, monkeypatch):
    return Host(tmp_path, monkeypatch)


def test_changes_are_made_in_place_by_one_executor_with_the_lease(host):
    replies = host.serve('{"op": "ping", "id": 7}', apply_line(tbf(10_000_000), 8, lease_s=30, holder="c1"),
                         apply_line(tbf(20_000_000), 9, lease_s=30, holder="c1"), '{"op": "bye", "id": 10}')
    assert [r["id"] for r in replies] == [7, 8, 9, 10] and all(r["ok"] for r in replies)
    assert replies[0]["ops"] == ["apply", "ping", "bye"] and replies[0]["pid"] == os.getpid()
    # the first change sets the tbf; the second changes it in place (no clears: nothing else is held)
    # planned against the journal: nothing held, so the clears are dropped; then the tbf changes in place
    assert replies[1]["applied"] == [tbf(10_000_000)[2].describe()]
    assert replies[2]["applied"] == [tbf(20_000_000)[2].describe()]
    assert replies[2]["watcher_pid"] == 4242 and replies[2]["lease_s"] == 30
    assert host.qdiscs.state[("nbhost-test-none", "eth1")]["rate_bps"] == 20_000_000
    assert len(host.executors) == 1 and host.closed == 1  # made once, closed when the loop ended
    assert lease.read(host.journal.dir).holder == "c1"
    assert [e.kind for e in host.journal.pending()] == ["qdisc"]  # one entry, kept across changes


def test_a_bad_request_is_answered_with_an_error_and_the_loop_goes_on(host):
    replies = host.serve("not json", '["op"]', '{"op": "dance", "id": 3}', '{"op": "apply", "id": 4, "plan": 5}',
                         apply_line(tbf(10_000_000), 5, lease_s=-1),
                         '{"op": "apply", "id": 6, "plan": {"version": 99, "changes": []}}',
                         '{"op": "ping", "id": 7}')
    assert [r["ok"] for r in replies] == [False] * 6 + [True]
    assert replies[0]["error"].startswith("request: not JSON") and replies[0]["id"] is None
    assert replies[1]["error"] == "request: expected a JSON object"
    assert "unknown op 'dance'" in replies[2]["error"] and replies[2]["id"] == 3 and replies[2]["hint"]
    assert "'plan' must be an object" in replies[3]["error"]
    assert "lease_s must be a number of seconds" in replies[4]["error"]
    assert "plan: version 99" in replies[5]["error"] and "provision" in replies[5]["hint"]
    assert all(r["exit_code"] == 2 for r in replies[:6])  # bad input, as 'node apply' exits
    assert host.qdiscs.calls == [] and host.journal.pending() == []


def test_the_control_path_guard_and_another_holders_lease_are_refused(host):
    lease.write(host.journal.dir, 60, holder="them")
    shaping_ssh = [ch.SetTbf("a", HOST_NETNS, "eth0", 10_000_000, 15140, 62500)]
    replies = host.serve(apply_line(shaping_ssh, 1), apply_line(tbf(10_000_000), 2, holder="me"),
                         apply_line(tbf(10_000_000), 3, holder="me", takeover=True))
    assert not replies[0]["ok"] and "carries this SSH control connection" in replies[0]["error"]
    assert not replies[1]["ok"] and "lease held by them" in replies[1]["error"] and "--takeover" in replies[1]["hint"]
    assert replies[2]["ok"] and not lease.read(host.journal.dir).held  # taken over; lease_s 0 releases it


def test_a_change_that_fails_is_undone_and_reported_and_the_next_one_is_made(host):
    replies = host.serve(apply_line(tbf(BAD_RATE), 1, lease_s=30, holder="c1"), '{"op": "ping", "id": 2}',
                         apply_line(tbf(10_000_000), 3, lease_s=30, holder="c1"))
    assert not replies[0]["ok"] and "tbf burst" in replies[0]["error"] and replies[0]["exit_code"] == 1
    assert replies[1]["ok"] and replies[2]["ok"]
    assert len(host.executors) == 1  # the failure did not end the loop or its executor
    assert [e.kind for e in host.journal.pending()] == ["qdisc"]  # the failed change's entry was undone


def test_the_loop_ends_at_bye_and_at_eof(host):
    assert [r["op"] for r in host.serve('{"op": "bye"}', '{"op": "ping"}')] == ["bye"]  # nothing after bye
    assert host.serve() == [] and host.closed == 2  # EOF at once: still closed


def test_a_hangup_while_waiting_ends_the_loop(host):
    read, write = os.pipe()
    stdin, out = os.fdopen(read, "r"), io.StringIO()
    answered = threading.Event()

    class Stdout(io.StringIO):
        def flush(self) -> None:
            answered.set()

    out = Stdout()

    def controller() -> None:
        os.write(write, b'{"op": "ping", "id": 1}\n')
        answered.wait(10)
        os.kill(os.getpid(), signal.SIGHUP)  # stdin stays open: only the hangup ends the loop
        os.write(write, b'{"op": "ping", "id": 2}\n')  # not read: the loop has ended
        time.sleep(0.5)
        os.close(write)  # (never left hanging, should the hangup not arrive)

    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGHUP])
    thread = threading.Thread(target=controller)
    thread.start()
    try:
        assert serve(host.journal, stdin, out, environ={}, make_executor=host.make_executor) == 1
    finally:
        thread.join()
        stdin.close()
    assert json.loads(out.getvalue())["ok"] and host.closed == 1
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGHUP))


def test_a_hangup_during_a_change_lets_it_finish_then_ends_the_loop(host):
    class Stdout(io.StringIO):
        def write(self, text: str) -> int:
            os.kill(os.getpid(), signal.SIGHUP)  # arrives while the reply is being written
            return super().write(text)

    out = Stdout()
    stdin = io.StringIO(apply_line(tbf(10_000_000), 1) + "\n" + '{"op": "ping", "id": 2}\n')
    assert serve(host.journal, stdin, out, environ={}, make_executor=host.make_executor) == 1
    assert json.loads(out.getvalue())["ok"] and host.closed == 1


def test_parse_request_knows_its_ops():
    assert parse_request('{"op": "ping"}') == {"op": "ping"}
    with pytest.raises(Exception, match="unknown op None"):
        parse_request("{}")


def test_node_serve_needs_root_and_answers_over_the_command_line(monkeypatch, tmp_path):
    from netbench.cli import common
    from netbench.cli.app import main
    from netbench.remote import serve as serve_mod

    seen = {}
    monkeypatch.setattr(common, "require_root", lambda: None)
    monkeypatch.setattr(serve_mod, "serve", lambda journal, stdin, stdout, environ: seen.update(
        environ=environ, state=str(journal.dir)) or stdout.write('{"ok": true}\n'))
    result = CliRunner().invoke(main, ["node", "--state-dir", str(tmp_path), "--ssh-connection", "1.2.3.4 5 6.7.8.9 22",
                                       "serve"], input="")
    assert result.exit_code == 0, result.output
    assert seen == {"environ": {"SSH_CONNECTION": "1.2.3.4 5 6.7.8.9 22"}, "state": str(tmp_path)}
