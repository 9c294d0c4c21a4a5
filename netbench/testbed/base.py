"""The one Target protocol: where every command (apply, show, reset, verify, doctor, sweep,
run) acts, for the embedded namespaces (embedded.py) and SSH hosts (hosts.py) alike.

targets.open_target(inventory) is the one place that chooses which.

Commands call plan/apply_plan/show/reset/doctor; sweeps and runs (experiment.runner) call
prepare, then start, per run apply/nodes_for/verify/spawn, and finish whatever happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

EMBEDDED = ""  # the key of the embedded testbed in a Planned's maps (it has one backend for all nodes)


@dataclass(frozen=True)
class Planned:
    """A profile planned for a target: the backend and the changes for each place (a host's
    name, or EMBEDDED for the namespaces on this machine), and why that backend."""

    profile: Any  # model.profile.Profile
    backends: Mapping[str, str]
    changes: Mapping[str, tuple]  # place -> emulation.changes.Change, in order
    reasons: Mapping[str, str] = field(default_factory=dict)
    probed: bool = True  # False: planned from the given backend, without asking any host
    basis: Any = None  # what the changes were planned against (the embedded testbed: its Held and topology)


class Target(Protocol):
    """Where a command acts. Every method raises NetbenchError (with a hint) on bad input or
    a failure, and none prints: the CLI renders what they return."""

    kind: str  # "embedded" or "hosts" (recorded in a sweep's manifest as testbed_kind)
    spawn: Any  # jobs.launch.Spawner: starts one job process on a node
    held_pairs: Any  # model.pairs.PairTopology the last show() read back, or None: no per-pair shaping

    # ---- every command
    def plan(self, profile, backend: str | None, probe: bool = True) -> Planned:
        """Probe the backend and plan `profile`'s changes; changes nothing."""
    def apply_plan(self, planned: Planned, on_change: Callable | None = None, **options: Any) -> None:
        """Make the planned changes, journaled where they are made."""
    def show(self) -> dict[str, Any]:
        """The active emulation, read back (JSON-able: what 'show --json' prints; "pairs" and
        `held_pairs` when it is shaped per destination)."""
    def reset(self, warn: Callable[[str], None], all_namespaces: bool = False) -> dict[str, list[str]]:
        """Undo everything netbench recorded there; place -> what was removed. `all_namespaces`
        (the embedded testbed only): also testbed namespaces no journal of its state folder recorded."""
    def doctor(self, tensorflow: bool) -> Any:
        """What the target can do, by trying it."""

    # ---- sweeps and runs (experiment.runner)
    def prepare(self, config, needed: int):
        """Check everything and probe the backend (a BackendChoice); raise with nothing changed."""
    def start(self): ...  # -> Topology
    def nodes_for(self, job, workers: int) -> tuple: ...  # -> nodes in placement order
    def apply(self, run, seed: int) -> None: ...  # one run's profile
    def verify(self, run, observer) -> dict | None: ...  # measure the point just applied
    def finish(self, note: Callable[[str], None]) -> None: ...  # leave everything as found


def common_profile(shown: dict[str, Any]) -> dict[str, Any]:
    """The one profile every node (or every host) holds, as profile-file keys, from what a
    Target's show() returned: what 'netbench show --output FILE' writes and 'netbench apply
    FILE' takes back. Nodes that hold different profiles (or some none) are refused: a
    profile file holds one profile for every node."""
    from netbench.errors import UsageError
    from netbench.model.profile import profile_from_mapping

    if "hosts" in shown:
        rows = [dict(row, node=host) for host, data in shown["hosts"].items() for row in data["nodes"]]
    else:
        rows = list(shown.get("nodes", []))
    if not rows:
        raise UsageError("flag --output: nothing to write: no testbed is up",
                         hint="start one with 'netbench testbed up', then 'netbench apply ...'")
    held = {row["node"]: row.get("profile") for row in rows}
    if all(profile is None for profile in held.values()):
        raise UsageError("flag --output: nothing to write: no node is shaped", hint="e.g. netbench apply --latency 10ms")
    first = next(iter(held.values()))
    if any(profile != first for profile in held.values()):
        labels = ", ".join(f"{name}: {profile_from_mapping(p, 'read-back').label() if p else 'none'}"
                           for name, p in held.items())
        raise UsageError(f"flag --output: the nodes hold different profiles ({labels}); a profile file holds "
                         "one profile for every node",
                         hint="apply one profile to every node first, or read each node's with 'netbench show --json'")
    return dict(first)
