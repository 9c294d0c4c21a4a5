"""The controller's side of the hosts' leases: renew every held lease, notice one that is lost,
and say whether a lease held through a run.

A host takes its lease when an apply finishes there (`netbench node apply --lease S`); a
keeper started before the first apply renews each host from then on (`hold`), so a host whose
apply ends early is renewed while the others still apply. A renewal that answers RENEWED
proves the lease was held, and so that the host had not reverted, from the apply up to the
moment it was asked: `confirm(after)` asks every host again at once and names each that
cannot show it still held its lease after `after` (a run's end), so a run whose window
overlapped a lost lease is failed, not recorded with a profile it did not have.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Sequence

from netbench.errors import NetbenchError, UsageError
from netbench.remote.controller import _error_lines
from netbench.remote.inventory import Inventory
from netbench.remote.ssh import HostConnection

RENEW_WORKERS = 16  # renewals in flight at once
RENEW_MIN_S = 0.5  # the least time one renewal is given: an SSH round trip and a Python start on the host


def min_lease_s(hosts: int) -> float:
    """The shortest lease a controller can keep on `hosts` hosts: every third of it, each host
    is renewed, RENEW_WORKERS at a time, each given at least RENEW_MIN_S (pure)."""
    return 3 * math.ceil(max(1, hosts) / RENEW_WORKERS) * RENEW_MIN_S


def check_lease(lease_s: float, hosts: int) -> None:
    if 0 < lease_s < min_lease_s(hosts):
        raise UsageError(f"flag --lease: {lease_s:g} s is too short for {hosts} host(s); "
                         f"at least {min_lease_s(hosts):g} s",
                         hint=f"renewals go out every third of the lease, {RENEW_WORKERS} hosts at a time, "
                              f"each given {RENEW_MIN_S:g} s; --lease 0 holds no lease")


class LeaseKeeper:
    """Renews every held lease every `seconds / 3` until stopped, all hosts at once, each
    within a hard deadline. A host whose lease is gone (it reverted by itself) or was taken
    over by another controller is reported in `lost`; a renewal that fails or does not answer
    in time is recorded in `failures` (host -> why, cleared by its next success), and the
    keeper goes on: the host reverts by itself only if this lasts a whole lease.

    `holding`: the hosts that hold a lease already (default: every one); others are renewed
    once `hold(name)` says their apply took one."""

    def __init__(self, inventory: Inventory, conns: Sequence[HostConnection], seconds: float,
                 holder: str = "", holding: Sequence[str] | None = None) -> None:
        from netbench.state.lease import renew_command

        self.by_name = {h.name: h for h in inventory.hosts}
        self.conns = list(conns)
        self.period = max(0.1, seconds / 3)
        waves = math.ceil(max(1, len(self.conns)) / RENEW_WORKERS)
        self.deadline = self.period / waves  # one renewal's share of a period, channel open included
        hosts = [self.by_name[c.name] for c in self.conns]
        self.commands = {h.name: renew_command(f"{h.venv}/bin/python", h.state_dir, holder, h.sudo) for h in hosts}
        self.lost: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.holding = {c.name for c in self.conns} if holding is None else set(holding)
        self.confirmed: dict[str, float] = {}  # host -> when (time.time()) its last RENEWED renewal was sent
        # renewals run on daemon threads, RENEW_WORKERS at a time: one stalled in SSH set-up
        # never holds up the controller's exit (a pool's threads are joined at exit)
        self._slots = threading.BoundedSemaphore(RENEW_WORKERS)
        self._in_flight: dict[str, threading.Event] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()  # a round now: stop, or confirm()
        self._round = threading.Condition()
        self._rounds = 0
        self._thread = threading.Thread(target=self._loop, name="netbench-lease", daemon=True)

    def hold(self, name: str) -> None:
        """Host `name` took its lease (its apply returned): renew it from now on."""
        self.confirmed[name] = time.time()
        self.holding.add(name)

    def _renew(self, conn: HostConnection) -> None:
        from netbench.state.lease import GONE, TAKEN

        sent = time.time()
        try:
            result = conn.run(self.commands[conn.name], timeout=self.deadline)
        except NetbenchError as exc:
            self.failures[conn.name] = exc.message  # unreachable for now: keep trying
            return
        except Exception as exc:  # noqa: BLE001 - one host's surprise must not stop the others' renewals
            self.failures[conn.name] = f"host {conn.name}: {type(exc).__name__}: {exc}"
            return
        if result.exit_code == GONE:
            self.lost[conn.name] = "its lease had expired and it reverted its shaping"
        elif result.exit_code == TAKEN:
            self.lost[conn.name] = f"another controller took it over ({result.stdout.strip() or 'holder unknown'})"
        elif not result.ok:
            message, _ = _error_lines(result.stderr, result.stdout, result.exit_code)
            self.failures[conn.name] = f"host {conn.name}: renewal failed: {message}"
        else:
            self.confirmed[conn.name] = max(sent, self.confirmed.get(conn.name, 0.0))
            self.failures.pop(conn.name, None)

    def renew_once(self) -> None:
        """One round: renew every held host not lost and not still busy with its last renewal;
        return when all have answered or the period is up."""
        for conn in self.conns:
            if conn.name in self.lost or conn.name in self._in_flight or conn.name not in self.holding:
                continue
            self._in_flight[conn.name] = self._start_renewal(conn)
        end = time.monotonic() + self.period
        while (not all(done.is_set() for done in self._in_flight.values()) and time.monotonic() < end
               and not self._stop.is_set()):
            time.sleep(min(0.02, max(0.0, end - time.monotonic())))
        for name, done in list(self._in_flight.items()):
            if done.is_set():
                del self._in_flight[name]
            else:
                self.failures[name] = f"host {name}: lease renewal: no answer within {self.deadline:g}s"

    def _start_renewal(self, conn: HostConnection) -> threading.Event:
        done = threading.Event()

        def renew() -> None:
            try:
                with self._slots:
                    if not self._stop.is_set():
                        self._renew(conn)
            finally:
                done.set()

        threading.Thread(target=renew, name=f"netbench-renew-{conn.name}", daemon=True).start()
        return done

    def unconfirmed(self, after: float) -> dict[str, str]:
        """Held hosts that cannot show a lease held after `after` (time.time()): host -> why."""
        out = {}
        for name in sorted(self.holding):
            if name in self.lost:
                out[name] = self.lost[name]
            elif self.confirmed.get(name, -math.inf) < after:
                out[name] = self.failures.get(name, f"host {name}: no renewal answered since")
        return out

    def confirm(self, after: float, timeout: float | None = None) -> dict[str, str]:
        """Renew every held host now and wait (at most `timeout`, default two periods) until
        each has shown its lease held after `after`, or is lost; host -> why for each that
        has not (its lease may have run out: it reverted, or may yet). Needs the keeper running."""
        end = time.monotonic() + (2 * self.period if timeout is None else timeout)
        while self.unconfirmed(after) and time.monotonic() < end and self._thread.is_alive():
            if all(name in self.lost for name in self.unconfirmed(after)):
                break
            with self._round:
                seen = self._rounds
                self._wake.set()
                self._round.wait_for(lambda: self._rounds > seen, timeout=max(0.0, end - time.monotonic()))
        return self.unconfirmed(after)

    def settle(self) -> None:
        """Ask every held host once more and wait for each answer, renewals still in flight
        included, within one renewal's deadline: before a controller reverts its hosts, each
        host another controller took over meanwhile is in `lost` (left alone), not only the
        first one whose answer came. Needs the keeper running."""
        self.confirm(after=time.time(), timeout=self.deadline + 1.0)

    def _loop(self) -> None:
        next_round = time.monotonic() + self.period
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_round - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            next_round = time.monotonic() + self.period
            try:
                self.renew_once()
            except Exception as exc:  # noqa: BLE001 - renewing must go on while the controller holds leases
                self.failures["(all)"] = f"lease renewal: {type(exc).__name__}: {exc}"
            with self._round:
                self._rounds += 1
                self._round.notify_all()

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        # the round in progress stops waiting at once; a renewal stalled on a dead host is not
        # waited for (its daemon thread ends with the process)
        self._thread.join(timeout=1.0)
