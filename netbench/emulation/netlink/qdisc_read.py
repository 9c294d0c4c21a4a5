"""Decoding what the kernel holds: netbench's qdisc trees as pyroute2 reads them -> plain
dicts in canonical units (pure over the messages; NetlinkQdiscs.read does the dumps)."""

from __future__ import annotations

import ipaddress
import struct
from typing import Any

from netbench.emulation.changes import HANDLE_MAJOR, HTB_UNLIMITED_BPS
from netbench.emulation.netlink import netem, pairtree


def _handle(major: int, minor: int = 0) -> int:
    return (major << 16) | minor


def _stats(qdisc: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    stats = qdisc.get_attr("TCA_STATS2")
    basic = stats.get_attr("TCA_STATS_BASIC") if stats else None
    queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
    if basic:
        out["bytes"], out["packets"] = basic["bytes"], basic["packets"]
    if queue:
        out["drops"], out["backlog"], out["overlimits"] = queue["drops"], queue["backlog"], queue["overlimits"]
    return out


def decode_qdisc(qdisc: Any, distribution: str = "uniform") -> dict[str, Any]:
    """A pyroute2 tcmsg (tbf or netem) -> {"kind", "rate_bps", "netem", counters...} in canonical units."""
    kind = qdisc.get_attr("TCA_KIND")
    options = qdisc.get_attr("TCA_OPTIONS")
    out: dict[str, Any] = {"kind": kind, **_stats(qdisc)}
    if kind == "tbf" and options:
        parms = options.get_attr("TCA_TBF_PARMS")
        if parms:
            rate64 = options.get_attr("TCA_TBF_RATE64")
            out["rate_bps"] = (rate64 or parms["rate"]) * 8
            out["limit_bytes"] = parms["limit"]
    elif kind == "netem" and options:
        params = netem.decode(netem.reparse(options), distribution)
        out["netem"] = params
        out["rate_bps"] = params.rate_bps
    return out


def _u32_peer(tfilter: Any) -> tuple[int, str] | None:
    """(class minor, "cidr|dst" or "cidr|src") of a netbench u32 peer filter, else None.

    The selector is read from its raw bytes (struct tc_u32_sel: 16 bytes, then 16-byte
    keys of be32 mask, be32 value, int offset, int offmask): pyroute2 0.9.7 decodes the
    keys 4 bytes out of place.
    """
    options = tfilter.get_attr("TCA_OPTIONS")
    if not options:
        return None
    classid = options.get_attr("TCA_U32_CLASSID")
    sel = next((attr for attr in options["attrs"] if attr[0] == "TCA_U32_SEL"), None)
    if classid is None or sel is None:
        return None
    raw_nla = sel[1]
    raw = bytes(raw_nla.data[raw_nla.offset + 4: raw_nla.offset + raw_nla.length])
    if len(raw) < 32 or raw[2] < 1:
        return None
    mask, value = struct.unpack(">II", raw[16:24])
    (offset,) = struct.unpack("=i", raw[24:28])
    network = ipaddress.IPv4Network((value & mask, bin(mask).count("1")))
    return classid & 0xFFFF, f"{network}|{'dst' if offset == 16 else 'src'}"


def decode_tree(root: Any, qdiscs: list[Any], classes: list[Any], filters: list[Any],
                distribution: str = "uniform") -> dict[str, Any]:
    """netbench's tree as the kernel holds it: {"kind", "netem", "rate_bps", "peers", "match",
    "pairs", counters}.

    For an htb tree the rate is the htb class rate (None when it is the "unlimited"
    sentinel), netem is the first class's netem child, and peers come from the u32 filters.
    A per-destination tree (changes.ShapePairs) has no one profile: netem and rate_bps are
    None, peers (), and "pairs" lists every destination, in class order, as
    {"peer": "a.b.c.d/32", "netem": NetemParams, "rate_bps": int | None, "classid": "4e42:1",
    and its netem leaf's "bytes", "packets", "drops", "backlog"} (pairtree.decode_pairs);
    every other tree has "pairs": None. `distribution` is used for every destination (the
    kernel does not report it; the journal records one per device).
    """
    out = decode_qdisc(root, distribution)
    out["pairs"] = None
    if out["kind"] != "htb":
        out.update(peers=(), match="dst")
        return out
    pairs = pairtree.decode_pairs(qdiscs, classes, filters, lambda q: decode_qdisc(q, distribution), HTB_UNLIMITED_BPS)
    if pairs is not None:
        out.update(netem=None, rate_bps=None, peers=(), match="dst", pairs=pairs)
        return out
    rate_bps = None
    for tclass in classes:
        if tclass["handle"] == _handle(HANDLE_MAJOR, 1):
            parms = tclass.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
            rate64 = tclass.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_RATE64")
            rate_bps = (rate64 or parms["rate"]) * 8
    out["rate_bps"] = None if rate_bps in (None, HTB_UNLIMITED_BPS) else rate_bps
    child = next((q for q in qdiscs if q["parent"] == _handle(HANDLE_MAJOR, 1)), None)
    if child is not None:
        decoded = decode_qdisc(child, distribution)
        out["netem"] = decoded.get("netem")
        for key in ("bytes", "packets", "drops", "backlog", "overlimits"):
            if key in decoded:
                out[f"netem_{key}"] = decoded[key]
    peers = sorted(p for p in (_u32_peer(f) for f in filters) if p is not None)
    out["peers"] = tuple(p[1].split("|")[0] for p in peers)
    out["match"] = peers[0][1].split("|")[1] if peers else "dst"
    return out
