"""`sweep --topology FILE [--scale LIST]`: a per-pair topology (model/pairs.py) as the sweep's
network, one point per scale level; the flags' checks, the runs, and the testbed size."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from netbench.errors import ProfileError, UsageError

NETWORK_FLAGS = ("--profile", "--latency", "--bandwidth", "--loss", "--jitter", "--schedule")


def parse_scales(text: str) -> tuple[float, ...]:
    """--scale 1,2,4: each a number above 0, none twice; a one-line UsageError otherwise."""
    values: list[float] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise UsageError(f"flag --scale: {part!r} is not a number", hint="e.g. --scale 1,2,4") from None
        if not math.isfinite(value) or value <= 0 or value > 1000:
            raise UsageError(f"flag --scale: {part} is not a number above 0 (at most 1000)",
                             hint="e.g. --scale 0.5,1,2 (2 doubles every delay)")
        if value in values:
            raise UsageError(f"flag --scale: {part} is given twice", hint="use --repeat for repeated runs")
        values.append(value)
    return tuple(values)


def check_flags(topology_file: Path | None, scale: str | None, given: dict[str, Any],
                inventory: Path | None) -> None:
    """--topology is the network: not with the flags that give one (`given`: flag -> value),
    nor (yet) on an inventory's hosts; --scale needs --topology."""
    if topology_file is None:
        if scale is not None:
            raise UsageError("flag --scale: only with --topology (it multiplies every delay of the topology)",
                             hint="e.g. --topology profiles/topologies/world.yaml --scale 1,2")
        return
    clashing = [flag for flag in NETWORK_FLAGS if given.get(flag)]
    if clashing:
        raise UsageError(f"flag --topology: not with {', '.join(clashing)}: the topology gives every pair's link",
                         hint="sweep --scale instead (it multiplies every delay), or drop --topology")
    if inventory is not None:
        raise UsageError("flag --topology: not with --inventory: a sweep over hosts cannot apply a topology yet",
                         hint="drop --inventory to sweep it on the embedded testbed")


def testbed_size(needed: int, pairs: Any) -> int:
    """Nodes the testbed brings up: the job's, or every node the topology names if more."""
    return max(needed, len(pairs.nodes)) if pairs is not None else needed


def check_testbed_nodes(pairs: Any, needed: int) -> None:
    """Every node the topology names must be one the testbed will have (n1, n2, ...)."""
    from netbench.model.pairs import check_nodes
    from netbench.model.topology import MAX_NODES, node_name

    names = [node_name(i) for i in range(min(testbed_size(needed, pairs), MAX_NODES))]
    check_nodes(pairs, names, "the testbed")


def check_compute_placed(pairs: Any, nodes: int) -> None:
    """The topology file's compute: for a node that holds none of the job's processes (a node of
    the topology beyond the job's) is refused, naming the file and key: it would limit nothing."""
    from netbench.model.compute import holds_none_text, unplaced

    found = unplaced(pairs.compute, nodes) if pairs.compute is not None else None
    if found is not None:
        message, hint = holds_none_text(found[1], nodes)
        raise UsageError(f"{pairs.source or pairs.name}: compute.{found[1]}: {message}", hint=hint)


def check_playbook(book: Any, runs: Sequence[Any], inventory: Path | None) -> None:
    """A playbook with `topology:` runs on the embedded testbed, whose nodes the topology names."""
    from netbench.model.job import nodes_needed

    if book.topology is None:
        return
    if inventory is not None:
        raise UsageError(f"{book.source}: topology: not with --inventory: a playbook over hosts cannot apply a "
                         "topology yet", hint="drop --inventory to run it on the embedded testbed")
    check_testbed_nodes(book.topology, max(nodes_needed(r.job, r.workers) for r in runs))


def topology_runs(topology_file: Path, scale: str | None, repeat: int, job: Any, workers: int,
                  first: int) -> tuple[Any, tuple]:
    """(the topology as loaded, the sweep's runs: one point per scale level, each repeated)."""
    from netbench.model.design import topology_design
    from netbench.model.job import nodes_needed
    from netbench.model.pairs_file import load_pair_topology

    scales = parse_scales(scale) if scale is not None else (1.0,)
    pairs = load_pair_topology(topology_file)
    check_testbed_nodes(pairs, nodes_needed(job, workers))
    check_compute_placed(pairs, nodes_needed(job, workers))
    try:
        design = topology_design(pairs, scales, repeat, job, workers)
    except (UsageError, ProfileError) as exc:
        raise UsageError(f"flag --scale: {exc.message}", exc.hint) from None
    return pairs, design.runs(first)


def plan_lines(run: Any, topology: Any, backend: str, seed: int) -> Sequence[str]:
    """A dry run's lines for one run's network: every change (every pair's settings)."""
    from netbench.emulation import backends

    network = run.pairs if run.pairs is not None else run.profile
    return [change.describe() for change in backends.plan_network(network, topology, backend, seed=seed)]
