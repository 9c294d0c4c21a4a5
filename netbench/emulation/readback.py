"""What the kernel holds -> the profile it amounts to (pure).

`netbench show` and the round-trip tests use this: a profile applied and read back must
come out equal at the kernel's resolution (ratios as u32 fractions, rates in bytes/s).
"""

from __future__ import annotations

from typing import Any

from netbench.emulation.netlink.netem import NetemParams
from netbench.model.profile import Profile


def profile_from_netem(params: NetemParams | None, rate_bps: int | None, direction: str = "egress",
                       peers: tuple[str, ...] = (), name: str = "active") -> Profile:
    """A netem qdisc's parameters (plus an htb rate, if any) in profile terms; None (an htb
    class whose netem leaf is missing, as a change cut short leaves it): the rate alone."""
    if params is None:
        return Profile(name=name, rate_bps=rate_bps, direction=direction, peers=peers)
    ge = params.ge
    return Profile(
        name=name, delay_us=params.delay_us, jitter_us=params.jitter_us, loss=params.loss if ge is None else 0.0,
        rate_bps=rate_bps, jitter_correlation=params.delay_corr if params.jitter_us else 0.0,
        distribution=params.distribution, loss_correlation=params.loss_corr if ge is None else 0.0,
        loss_model="random" if ge is None else "gilbert-elliott",
        ge_p=ge[0] if ge else 0.0, ge_r=ge[1] if ge else 1.0, ge_bad_loss=ge[2] if ge else 1.0,
        ge_good_loss=ge[3] if ge else 0.0, duplicate=params.duplicate, duplicate_correlation=params.duplicate_corr,
        corrupt=params.corrupt, corrupt_correlation=params.corrupt_corr, reorder=params.reorder,
        reorder_correlation=params.reorder_corr, reorder_gap=params.gap if params.reorder else 0,
        limit_packets=params.limit, direction=direction, peers=peers)


def profile_from_state(egress: dict[str, Any] | None, ingress: dict[str, Any] | None,
                       engine: dict[str, Any] | None = None) -> Profile | None:
    """One node's trees (decoded by the qdisc adapter) and delay engine -> a Profile, or None.

    netem trees: the egress tree's netem (or the ingress one when only ingress is shaped);
    direction from which of the two exist. userspace: the engine's delay/jitter/loss and
    the tbf rate.
    """
    trees = [t for t in (egress, ingress) if t and t.get("netem") is not None]
    if trees:
        tree = trees[0]
        direction = "both" if len(trees) == 2 else ("egress" if tree is egress else "ingress")
        return profile_from_netem(tree["netem"], tree.get("rate_bps"), direction, tuple(tree.get("peers", ())))
    rate = egress.get("rate_bps") if egress and egress.get("kind") == "tbf" else None
    params = (engine or {}).get("params") or {}
    if rate is None and not params:
        return None
    return Profile(name="active", delay_us=int(params.get("delay_us", 0)), jitter_us=int(params.get("jitter_us", 0)),
                   loss=float(params.get("loss", 0.0)), rate_bps=rate)


def pairs_from_rows(rows: list[dict[str, Any]], topology: Any, name: str = "active") -> Any:
    """`read_emulation`'s rows -> the PairTopology the nodes hold, or None when no node shapes
    per destination: netem trees list their destinations (qdisc "pairs"), userspace engines
    their table (engine "pairs"); destinations are named by the testbed's addresses."""
    from netbench.model.pairs import PairLink, PairTopology

    by_address = {node.address: node.name for node in topology.nodes}
    links: list[PairLink] = []
    shaped = False
    for row in rows:
        tree, engine = row.get("qdisc") or {}, row.get("engine") or {}
        for entry in tree.get("pairs") or ():
            shaped = True
            dst = by_address.get(str(entry["peer"]).split("/")[0])
            profile = profile_from_netem(entry["netem"], entry.get("rate_bps"), name=f"{row['node']}-{dst}")
            if dst is not None and not profile.is_null:  # a link is never null (PairLink)
                links.append(PairLink(row["node"], dst, profile))
        for entry in engine.get("pairs") or ():
            shaped = True
            dst = by_address.get(str(entry["dst"]))
            profile = Profile(name=f"{row['node']}-{dst}", delay_us=int(entry.get("delay_us", 0)),
                              jitter_us=int(entry.get("jitter_us", 0)), loss=float(entry.get("loss", 0.0)),
                              rate_bps=entry.get("rate_bps"))
            if dst is not None and not profile.is_null:
                links.append(PairLink(row["node"], dst, profile))
    if not shaped:
        return None
    return PairTopology(name=name, nodes=tuple(node.name for node in topology.nodes), links=tuple(links))
