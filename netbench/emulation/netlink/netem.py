"""netem's netlink options, complete, in pyroute2's message classes (pure: no I/O).

pyroute2 0.9's netem plugin encodes delay, jitter, loss, duplicate, correlation, reorder,
corrupt and the 32-bit rate, but not the delay distribution table, the loss models
(Gilbert-Elliott), the 64-bit rate or nanosecond delay. `netem_options` below is the full
TCA_OPTIONS layout of the kernel's include/uapi/linux/pkt_sched.h (struct tc_netem_qopt
followed by attributes); `NetemParams` is what netbench asks of one netem qdisc, in
canonical units, and encodes to and decodes from that layout.

Probabilities travel as u32 fractions of 2**32-1 (as tc sends them), so a ratio read back
equals the one sent at that resolution (tests/netem_checks.py compares that way).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink import nla
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from netbench.emulation.netlink import disttable

U32_MAX = 2**32 - 1
PSCHED_SHIFT = 6  # the kernel's psched tick is 64 ns
NETEM_RATE32_MAX_BPS = U32_MAX * 8  # netem's rate field is bytes/s in 32 bits: ~34.36 Gbit/s


def ratio_to_u32(ratio: float) -> int:
    return max(0, min(U32_MAX, int(round(ratio * U32_MAX))))


def u32_to_ratio(value: int) -> float:
    """Rounded to 1e-9 (the u32 step is 2.3e-10), so 1% reads back as 0.01, not 0.0100000000116."""
    return round(value / U32_MAX, 9)


class netem_options(nla):
    """TCA_OPTIONS of a netem qdisc: struct tc_netem_qopt, then TCA_NETEM_* attributes."""

    fields = (("delay", "I"), ("limit", "I"), ("loss", "I"), ("gap", "I"), ("duplicate", "I"), ("jitter", "I"))
    nla_map = (
        (0, "TCA_NETEM_UNSPEC", "none"),
        (1, "TCA_NETEM_CORR", "netem_corr"),
        (2, "TCA_NETEM_DELAY_DIST", "cdata"),  # s16 values, packed by pack_table
        (3, "TCA_NETEM_REORDER", "netem_reorder"),
        (4, "TCA_NETEM_CORRUPT", "netem_corrupt"),
        (5, "TCA_NETEM_LOSS", "netem_loss"),
        (6, "TCA_NETEM_RATE", "netem_rate"),
        (7, "TCA_NETEM_ECN", "uint32"),
        (8, "TCA_NETEM_RATE64", "uint64"),
        (9, "TCA_NETEM_PAD", "hex"),
        (10, "TCA_NETEM_LATENCY64", "int64"),
        (11, "TCA_NETEM_JITTER64", "int64"),
    )

    class netem_corr(nla):
        fields = (("delay_corr", "I"), ("loss_corr", "I"), ("dup_corr", "I"))

    class netem_reorder(nla):
        fields = (("probability", "I"), ("correlation", "I"))

    class netem_corrupt(nla):
        fields = (("probability", "I"), ("correlation", "I"))

    class netem_rate(nla):
        fields = (("rate", "I"), ("packet_overhead", "i"), ("cell_size", "I"), ("cell_overhead", "i"))

    class netem_loss(nla):
        nla_map = ((0, "NETEM_LOSS_UNSPEC", "none"), (1, "NETEM_LOSS_GI", "loss_gi"),
                   (2, "NETEM_LOSS_GE", "loss_ge"))

        class loss_gi(nla):
            fields = (("p13", "I"), ("p31", "I"), ("p32", "I"), ("p14", "I"), ("p23", "I"))

        class loss_ge(nla):
            """Gilbert-Elliott: p good->bad, r bad->good; the kernel drops in the bad state when a
            random u32 exceeds h (so h = 1 - loss in bad) and in the good state below k1 (= loss in good)."""

            fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))


class netem_tcmsg(tcmsg):
    """A tcmsg whose TCA_OPTIONS is always the full netem layout above."""

    # pyroute2 compiles an attribute map once and caches it on the class, behind a flag that
    # subclasses inherit: once tcmsg itself was compiled (any pyroute2 tc call does that),
    # a subclass would reuse tcmsg's map and encode TCA_OPTIONS with pyroute2's own netem
    # class, which drops the distribution table (the kernel then refuses: EINVAL). This
    # class keeps a cache of its own.
    _nlmsg_base__compiled_nla = False
    _nlmsg_base__t_nla_map = None
    _nlmsg_base__r_nla_map = None

    @staticmethod
    def get_options(self, *argv, **kwarg):
        return netem_options


@dataclass(frozen=True)
class NetemParams:
    """One netem qdisc, in canonical units (us, ratios, bits/s, packets)."""

    limit: int = 1000
    delay_us: int = 0
    jitter_us: int = 0
    delay_corr: float = 0.0
    distribution: str = "uniform"
    loss: float = 0.0
    loss_corr: float = 0.0
    ge: tuple[float, float, float, float] | None = None  # p, r, loss in bad, loss in good
    duplicate: float = 0.0
    duplicate_corr: float = 0.0
    corrupt: float = 0.0
    corrupt_corr: float = 0.0
    reorder: float = 0.0
    reorder_corr: float = 0.0
    gap: int = 0
    rate_bps: int | None = None


def pack_table(values: tuple[int, ...]) -> bytes:
    """The table as the kernel reads it: native-endian s16, sent as raw bytes."""
    return struct.pack(f"={len(values)}h", *values)


def options(params: NetemParams) -> dict[str, Any]:
    """The TCA_OPTIONS value for `params`, with every attribute present.

    A live `change` keeps any attribute the request leaves out (the kernel only parses
    what is there), so zeros are sent explicitly and the distribution table always goes
    with it: nothing of an older profile survives. The one exception is the loss model: an
    absent TCA_NETEM_LOSS is what switches the kernel back to random loss.
    """
    delay_ns, jitter_ns = params.delay_us * 1000, params.jitter_us * 1000
    gap = params.gap or (1 if params.reorder else 0)  # tc's rule: reordering implies gap 1
    attrs: list[list[Any]] = [
        ["TCA_NETEM_CORR", {"delay_corr": ratio_to_u32(params.delay_corr), "loss_corr": ratio_to_u32(params.loss_corr),
                            "dup_corr": ratio_to_u32(params.duplicate_corr)}],
        ["TCA_NETEM_DELAY_DIST", pack_table(disttable.table(params.distribution))],
        ["TCA_NETEM_REORDER", {"probability": ratio_to_u32(params.reorder),
                               "correlation": ratio_to_u32(params.reorder_corr)}],
        ["TCA_NETEM_CORRUPT", {"probability": ratio_to_u32(params.corrupt),
                               "correlation": ratio_to_u32(params.corrupt_corr)}],
    ]
    if params.ge is not None:
        p, r, bad_loss, good_loss = params.ge
        attrs.append(["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GE", {
            "p": ratio_to_u32(p), "r": ratio_to_u32(r), "h": U32_MAX - ratio_to_u32(bad_loss),
            "k1": ratio_to_u32(good_loss)}]]}])
    # else no TCA_NETEM_LOSS at all: netem_change() returns to random loss only when the
    # attribute is absent; an empty one keeps whatever loss model the qdisc had (a live change
    # from Gilbert-Elliott to random loss kept Gilbert-Elliott, found by make test-kernel)
    rate_bytes = (params.rate_bps or 0) // 8
    attrs.append(["TCA_NETEM_RATE", {"rate": min(rate_bytes, U32_MAX), "packet_overhead": 0,
                                     "cell_size": 0, "cell_overhead": 0}])
    if rate_bytes > U32_MAX:
        attrs.append(["TCA_NETEM_RATE64", rate_bytes])
    attrs.append(["TCA_NETEM_LATENCY64", delay_ns])
    attrs.append(["TCA_NETEM_JITTER64", jitter_ns])
    return {
        "delay": min(delay_ns >> PSCHED_SHIFT, U32_MAX), "jitter": min(jitter_ns >> PSCHED_SHIFT, U32_MAX),
        "limit": params.limit, "loss": ratio_to_u32(params.loss if params.ge is None else 0.0),
        "gap": gap, "duplicate": ratio_to_u32(params.duplicate), "attrs": attrs,
    }


def decode(opts: Any, distribution: str = "uniform") -> NetemParams:
    """A decoded `netem_options` (from the kernel) -> NetemParams.

    The kernel never reports the distribution table, so the caller says which one it sent.
    """
    def attr(name: str) -> Any:
        return opts.get_attr(name)

    latency64, jitter64 = attr("TCA_NETEM_LATENCY64"), attr("TCA_NETEM_JITTER64")
    delay_ns = latency64 if latency64 is not None else opts["delay"] << PSCHED_SHIFT
    jitter_ns = jitter64 if jitter64 is not None else opts["jitter"] << PSCHED_SHIFT
    corr, reorder, corrupt, rate = (attr("TCA_NETEM_CORR"), attr("TCA_NETEM_REORDER"),
                                    attr("TCA_NETEM_CORRUPT"), attr("TCA_NETEM_RATE"))
    ge = None
    loss_model = attr("TCA_NETEM_LOSS")
    if loss_model is not None:
        gemodel = loss_model.get_attr("NETEM_LOSS_GE")
        if gemodel is not None:
            ge = (u32_to_ratio(gemodel["p"]), u32_to_ratio(gemodel["r"]), u32_to_ratio(U32_MAX - gemodel["h"]),
                  u32_to_ratio(gemodel["k1"]))
    rate_bytes = attr("TCA_NETEM_RATE64") or (rate["rate"] if rate is not None else 0)
    reorder_p = u32_to_ratio(reorder["probability"]) if reorder is not None else 0.0
    return NetemParams(
        limit=opts["limit"], delay_us=delay_ns // 1000, jitter_us=jitter_ns // 1000,
        delay_corr=u32_to_ratio(corr["delay_corr"]) if corr is not None else 0.0, distribution=distribution,
        loss=u32_to_ratio(opts["loss"]), loss_corr=u32_to_ratio(corr["loss_corr"]) if corr is not None else 0.0,
        ge=ge, duplicate=u32_to_ratio(opts["duplicate"]),
        duplicate_corr=u32_to_ratio(corr["dup_corr"]) if corr is not None else 0.0,
        corrupt=u32_to_ratio(corrupt["probability"]) if corrupt is not None else 0.0,
        corrupt_corr=u32_to_ratio(corrupt["correlation"]) if corrupt is not None else 0.0,
        reorder=reorder_p, reorder_corr=u32_to_ratio(reorder["correlation"]) if reorder is not None else 0.0,
        gap=opts["gap"] if reorder_p else 0, rate_bps=rate_bytes * 8 or None,
    )


def reparse(raw_options: Any) -> Any:
    """Re-decode a TCA_OPTIONS nla that pyroute2 parsed with its partial netem class."""
    full = netem_options(raw_options.data, offset=raw_options.offset)
    full.decode()
    return full
