"""Hypothesis strategies for profiles, shared by the YAML and netem round-trip tests."""

from __future__ import annotations

from hypothesis import strategies as st

from netbench import units
from netbench.model.profile import DISTRIBUTIONS, MAX_DELAY_US, MAX_JITTER_US, Profile

exact_durations = st.one_of(st.integers(0, 999_999), st.integers(0, MAX_DELAY_US // 10).map(lambda k: k * 10))
exact_rates = st.builds(lambda m, e: m * 10**e, st.integers(8, 999_999), st.integers(3, 5)).filter(
    lambda bps: bps <= 100 * 10**9)
parsed_ratios = st.integers(0, 100_000).map(lambda n: units.parse_ratio(f"{n / 1000:g}%"))
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_. ", min_size=1, max_size=20).filter(
    lambda s: s.strip() == s and s)


@st.composite
def valid_profiles(draw, netem: bool = True, durations=exact_durations, rates=exact_rates,
                   peers=("n1", "n2", "192.0.2.0/24")):
    """Valid profiles; with netem=False only the fields every backend emulates."""
    delay = draw(durations)
    jitter = draw(durations.filter(lambda j: j <= min(delay, MAX_JITTER_US)))
    fields = dict(name=draw(names), description=draw(st.sampled_from(["", "a link", "yes", "10ms"])),
                  delay_us=delay, jitter_us=jitter, rate_bps=draw(st.one_of(st.none(), rates)))
    if not netem:
        return Profile(loss=draw(parsed_ratios), **fields)
    if draw(st.booleans()):
        fields.update(loss_model="gilbert-elliott", ge_p=draw(parsed_ratios.filter(bool)), ge_r=draw(parsed_ratios),
                      ge_bad_loss=draw(parsed_ratios), ge_good_loss=draw(parsed_ratios))
    else:
        fields["loss"] = draw(parsed_ratios)
        fields["loss_correlation"] = draw(parsed_ratios) if fields["loss"] else 0.0
    if jitter:
        fields["jitter_correlation"] = draw(parsed_ratios)
    fields["distribution"] = draw(st.sampled_from(DISTRIBUTIONS))
    for key in ("duplicate", "corrupt"):
        fields[key] = draw(parsed_ratios)
        fields[f"{key}_correlation"] = draw(parsed_ratios) if fields[key] else 0.0
    if delay:
        fields["reorder"] = draw(parsed_ratios)
        if fields["reorder"]:
            fields["reorder_correlation"] = draw(parsed_ratios)
            fields["reorder_gap"] = draw(st.integers(0, 100))
    fields["limit_packets"] = draw(st.one_of(st.none(), st.integers(1, 1_000_000)))
    fields["direction"] = draw(st.sampled_from(["egress", "ingress", "both"]))
    # the kernel refuses a duplicating netem beside other netems: one peer at most then
    fields["peers"] = tuple(draw(st.lists(st.sampled_from(peers), unique=True, max_size=1 if fields["duplicate"] else 3)))
    return Profile(**fields)
