"""`netbench verify --all-pairs`: every ordered pair measured against the configured matrix.

What is configured is the per-pair topology given with --topology or, without one, what the
nodes hold, read back from the kernel and the delay engines: a per-pair topology when they
shape per destination, else the profile each node holds.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape

from netbench import console
from netbench.cli import render_pairs
from netbench.errors import VerifyFailed


def verify_all_pairs_cmd(topo, topology_file: Path | None, tolerance, count: int, interval: float,
                         seconds: float, as_json: bool) -> None:
    """Measure every ordered pair of `topo` (a discovered testbed) and print the matrix (or
    JSON); VerifyFailed when a pair is out of tolerance. `seconds` > 0: iperf3 per pair."""
    from netbench.experiment import verify, verify_pairs
    from netbench.model.profile import profile_from_mapping
    from netbench.testbed.targets import open_target

    pairs = profiles = None
    if topology_file is not None:
        from netbench.model.pairs_file import load_pair_topology  # topology files, beside PairTopology

        pairs = load_pair_topology(topology_file)
    else:
        with open_target() as target:
            shown = target.show()["nodes"]
            pairs = target.held_pairs
        rows = {row["node"]: row for row in shown}
        if pairs is None:
            profiles = {node.name: profile_from_mapping(rows[node.name]["profile"], "read-back")
                        if rows.get(node.name, {}).get("profile") else None for node in topo.nodes}
    settings = verify.Settings(ping_count=count, ping_interval_s=interval, iperf_seconds=seconds,
                               unshaped_rate=True)
    tolerance = tolerance or verify_pairs.PAIRS_TOLERANCE
    expected = verify_pairs.expected_matrix(topo, pairs, profiles)  # a bad --topology fails before any ping
    n = len(topo.nodes)
    if not as_json:
        console.info(f"measuring {len(expected)} ordered pairs of {n} nodes, configured by "
                     + (f"topology {escape(pairs.name)}" if pairs is not None else "the profiles read back")
                     + f": {count} pings every {interval:g} s, {n - 1} round(s) of {n} pairs at once"
                     + (f"; then iperf3 for {seconds:g} s per pair, one at a time" if seconds else ""))
    on_round = None if as_json else (lambda done, total: console.info(f"  [dim]round {done}/{total} done[/]"))
    record = verify_pairs.verify_all_pairs(topo, pairs, profiles, settings, tolerance=tolerance, on_round=on_round)
    if as_json:
        console.plain(json.dumps(record, indent=2))
    else:
        render_pairs.pairs_matrix(record)
    if not record["ok"]:
        raise VerifyFailed(f"{len(record['failed'])} of {len(expected)} pairs differ from the configured "
                           "matrix beyond tolerance", hint="see the cells marked '!'; a loaded machine inflates RTT")
