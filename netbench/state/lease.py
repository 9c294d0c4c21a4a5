"""The lease a controller holds on a remote host's shaping.

While a profile is applied with a lease, the controller renews it over SSH; a `netbench
node lease-watch` process on the host reverts the host's shaping by itself once the lease
has not been renewed for its duration.

The lease file records its last renewal on the host's CLOCK_BOOTTIME (seconds since boot,
suspend included): it never jumps when the wall clock is stepped, it means the same to
every process on the host (the watcher, `node apply`, `node show`, the renewal), and
controller and host clocks never need to agree. The boot id beside it makes a lease
from before a reboot count as expired. A renewal is `python -m netbench.state.lease renew`,
which imports nothing beyond the standard library, not the CLI.

Each controller session names itself with a random holder token (`new_holder`): a renewal
by another holder fails (TAKEN), and `node apply` refuses an unexpired lease another holder
has unless told to take it over.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import math
import os
import secrets
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from netbench.state.journal import LOCK_NAME

LEASE_NAME = "lease.json"
DEFAULT_LEASE_S = 60.0
WATCH_POLL_S = 0.5
REVERT_RETRY_S = 5.0  # a failed revert is tried again after this long
RENEW_LOCK_WAIT_S = 2.0  # a renewal waits this long for an apply or revert that holds the lock

# exit statuses of `python -m netbench.state.lease renew`
RENEWED, GONE, TAKEN, BUSY = 0, 3, 4, 75


def boottime() -> float:
    """Seconds since this host booted (CLOCK_BOOTTIME): shared by its processes, never stepped."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def new_holder() -> str:
    """A token naming one controller session: who and where it runs, and a random part."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class LeaseState:
    held: bool
    seconds: float = 0.0
    age_s: float = 0.0  # seconds since the last renewal (infinite for a lease from an earlier boot)
    holder: str = ""
    taken: float = 0.0  # Unix time the holder took it (for people: the wall clock is not trusted for age)

    @property
    def expired(self) -> bool:
        return self.held and self.age_s > self.seconds

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.seconds - self.age_s) if self.held else 0.0

    def to_json(self) -> dict:
        return {"held": self.held, "seconds": self.seconds,
                "age_s": round(self.age_s, 3) if math.isfinite(self.age_s) else None,
                "remaining_s": round(self.remaining_s, 3), "expired": self.expired,
                "holder": self.holder, "taken": self.taken}


def lease_path(state_dir: Path) -> Path:
    return state_dir / LEASE_NAME


def _write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write(state_dir: Path, seconds: float, holder: str = "") -> Path:
    """Take (or renew) the lease for `seconds`; written atomically."""
    path = lease_path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, {"seconds": seconds, "holder": holder, "taken": time.time(),
                         "renewed": boottime(), "boot_id": boot_id()})
    return path


def read(state_dir: Path, now: float | None = None) -> LeaseState:
    """The lease as this host sees it; `now` is a CLOCK_BOOTTIME reading (default: the clock)."""
    try:
        data = json.loads(lease_path(state_dir).read_text())
        seconds, renewed = float(data["seconds"]), float(data["renewed"])
        holder, taken = str(data.get("holder", "")), float(data.get("taken", 0.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return LeaseState(held=False)
    same_boot = data.get("boot_id") == boot_id()
    age = ((boottime() if now is None else now) - renewed) if same_boot else math.inf
    return LeaseState(held=True, seconds=seconds, age_s=age, holder=holder, taken=taken)


def release(state_dir: Path) -> bool:
    try:
        lease_path(state_dir).unlink()
        return True
    except FileNotFoundError:
        return False


def renew(state_dir: Path, holder: str, lock_wait_s: float = RENEW_LOCK_WAIT_S) -> int:
    """Renew the lease if `holder` holds it: RENEWED, GONE (no lease: the host reverted),
    TAKEN (another holder has it) or BUSY (the lock stayed held). Under the host's journal
    lock, so a renewal never races a revert or an apply (it cannot bring back a lease that a
    revert has just removed)."""
    if not state_dir.is_dir():
        return GONE
    with open(state_dir / LOCK_NAME, "a+") as lock:
        deadline = time.monotonic() + lock_wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return BUSY
                time.sleep(0.05)
        path = lease_path(state_dir)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return GONE
        if data.get("holder") != holder:
            return TAKEN
        data.update(renewed=boottime(), boot_id=boot_id())
        _write_atomic(path, data)
        return RENEWED


def renew_command(python: str, state_dir: str, holder: str, sudo: bool = False) -> str:
    """The shell command a controller runs on the host to renew (see `renew` for its exit status)."""
    return ("sudo -n " if sudo else "") + shlex.join([python, "-m", "netbench.state.lease", "renew", state_dir, holder])


def watch(state_dir: Path, revert: Callable[[], bool], poll_s: float = WATCH_POLL_S,
          sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = boottime,
          retry_s: float = REVERT_RETRY_S, on_error: Callable[[Exception], None] | None = None) -> str:
    """Wait until the lease expires, then revert; returns "expired", or "released" once the
    lease is gone. `revert` must look at the lease again under the host's lock and revert (and
    release) only if it is still expired, returning whether it did: an apply may have taken a
    fresh lease since it was read here. A revert that fails is reported and tried again."""
    while True:
        state = read(state_dir, now())
        if not state.held:
            return "released"
        if not state.expired:
            sleep(min(poll_s, max(0.05, state.remaining_s)))
            continue
        try:
            if revert():
                return "expired"
        except Exception as exc:  # noqa: BLE001 - a host left shaped is what the lease exists to prevent
            if on_error is not None:
                on_error(exc)
            sleep(retry_s)


def main(argv: list[str]) -> int:
    """`python -m netbench.state.lease renew STATE_DIR HOLDER`, run by the controller over SSH."""
    if len(argv) != 3 or argv[0] != "renew":
        sys.stderr.write("usage: python -m netbench.state.lease renew STATE_DIR HOLDER\n")
        return 2
    state_dir, holder = Path(argv[1]), argv[2]
    code = renew(state_dir, holder)
    if code == TAKEN:
        sys.stdout.write(f"held by {read(state_dir).holder}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
