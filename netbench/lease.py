"""The lease a controller holds on a remote host's shaping.

While a profile is applied with a lease, the controller renews it (it touches the lease
file over SSH); a `netbench node lease-watch` process on the host reverts the host's
shaping by itself once the lease has not been renewed for its duration. The lease is the
file's modification time on the host's own clock, so controller and host clocks never
need to agree, and renewing is a `touch`, not a Python start-up.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

LEASE_NAME = "lease.json"
DEFAULT_LEASE_S = 60.0
WATCH_POLL_S = 0.5


@dataclass(frozen=True)
class LeaseState:
    held: bool
    seconds: float = 0.0
    age_s: float = 0.0  # seconds since the last renewal

    @property
    def expired(self) -> bool:
        return self.held and self.age_s > self.seconds

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.seconds - self.age_s) if self.held else 0.0

    def to_json(self) -> dict:
        return {"held": self.held, "seconds": self.seconds, "age_s": round(self.age_s, 3),
                "remaining_s": round(self.remaining_s, 3), "expired": self.expired}


def lease_path(state_dir: Path) -> Path:
    return state_dir / LEASE_NAME


def write(state_dir: Path, seconds: float, holder: str = "") -> Path:
    """Take (or renew) the lease for `seconds`; written atomically."""
    path = lease_path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"seconds": seconds, "holder": holder, "taken": time.time()}))
    os.replace(tmp, path)
    return path


def read(state_dir: Path, now: float | None = None) -> LeaseState:
    path = lease_path(state_dir)
    try:
        mtime = path.stat().st_mtime
        seconds = float(json.loads(path.read_text()).get("seconds", DEFAULT_LEASE_S))
    except (OSError, ValueError, AttributeError):
        return LeaseState(held=False)
    return LeaseState(held=True, seconds=seconds, age_s=(time.time() if now is None else now) - mtime)


def release(state_dir: Path) -> bool:
    try:
        lease_path(state_dir).unlink()
        return True
    except FileNotFoundError:
        return False


def renew_command(path: str, sudo: bool = False) -> str:
    """The shell command a controller runs on the host to renew; fails once the lease is gone
    (the host already reverted), so the controller learns it lost the host."""
    quoted = shlex.quote(path)
    command = f"test -f {quoted} && touch {quoted}"
    return f"sudo -n sh -c {shlex.quote(command)}" if sudo else command


def watch(state_dir: Path, revert: Callable[[], object], poll_s: float = WATCH_POLL_S,
          sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.time) -> str:
    """Wait until the lease expires (then call `revert`) or is released; returns which."""
    while True:
        state = read(state_dir, now())
        if not state.held:
            return "released"
        if state.expired:
            revert()
            release(state_dir)
            return "expired"
        sleep(min(poll_s, max(0.05, state.remaining_s)))
