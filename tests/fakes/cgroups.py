"""An in-memory Cgroups (emulation/cgroups.py): groups, their quotas and processes, no kernel."""

from __future__ import annotations

from pathlib import Path

from netbench.errors import TestbedError
from netbench.model.compute import Quota


class FakeCgroups:
    version = 2

    def __init__(self, root: str = "/fake/cgroup") -> None:
        self.root = Path(root)
        self.groups: dict[str, dict] = {}  # name -> {"quota": Quota | None, "pids": [...]}
        self.calls: list[tuple] = []

    def path(self, name: str) -> Path:
        return self.root / "netbench.slice" / name

    def create(self, name: str) -> Path:
        self.calls.append(("create", name))
        self.groups.setdefault(name, {"quota": None, "pids": []})
        return self.path(name)

    def set_quota(self, name: str, quota: Quota) -> None:
        if name not in self.groups:
            raise TestbedError(f"no cgroup {name}")
        self.calls.append(("quota", name, quota.cpu_max()))
        self.groups[name]["quota"] = quota

    def add(self, name: str, pid: int) -> None:
        self.groups[name]["pids"].append(pid)

    def remove(self, name: str) -> bool:
        self.calls.append(("remove", name))
        return self.groups.pop(name, None) is not None

    def throttled(self, name: str) -> dict[str, int]:
        return {"nr_periods": 0, "nr_throttled": 0, "throttled_us": 0}
