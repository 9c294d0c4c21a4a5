"""What "apply then read back gives the same profile" means, shared by the pure and kernel tests.

Equal at the kernel's resolution: ratios as the u32 netem stores, rates in bytes/s, the
limit as planned (the profile's, or sized from the bandwidth-delay product), peers as the
CIDRs they resolve to. Names and descriptions are not the kernel's business.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from netbench.emulation import changes as ch
from netbench.emulation.netlink.netem import ratio_to_u32
from netbench.model.profile import Profile
from netbench.model.topology import Topology

RATIO_FIELDS = ("loss", "jitter_correlation", "loss_correlation", "ge_p", "ge_r", "ge_bad_loss", "ge_good_loss",
                "duplicate", "duplicate_correlation", "corrupt", "corrupt_correlation", "reorder",
                "reorder_correlation")


def kernel_view(profile: Profile, topology: Topology | None = None, node_index: int = 0) -> dict[str, Any]:
    """`profile` as the kernel can hold it, for the node at `node_index`."""
    p = profile
    if not p.jitter_us:
        p = dataclasses.replace(p, jitter_correlation=0.0)
    if p.reorder and not p.reorder_gap:
        p = dataclasses.replace(p, reorder_gap=1)  # netem's rule, as tc applies it
    limit = p.limit_packets or ch.netem_limit_packets(p.delay_us, p.jitter_us, p.rate_bps)
    peers = p.peers
    if topology is not None and peers:
        peers = ch.resolve_peers(p, topology, topology.nodes[node_index])
    out = dataclasses.asdict(dataclasses.replace(p, name="", description="", limit_packets=limit, peers=tuple(peers)))
    for field in RATIO_FIELDS:
        out[field] = ratio_to_u32(out[field])
    out["rate_bps"] = None if p.rate_bps is None else p.rate_bps // 8
    return out
