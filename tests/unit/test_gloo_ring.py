"""model/gloo_ring.py: Gloo's ring all-reduce replayed segment by segment."""

from __future__ import annotations

import pytest

from netbench.model import gloo_ring as g

MLP = 2_678_824  # the mlp's gradients, one DDP bucket
RATE_100MBIT = 8 / 100e6  # seconds per byte


def _links(ranks=4, per=2, one_way=0.02, wire=0.0, local=0.0):
    return g.Links(ranks=ranks, ranks_per_node=per, one_way_s=one_way, wire_s_per_byte=wire, local_s_per_byte=local)


def test_segments_follow_gloos_rule_at_most_1_mib_at_least_two_per_rank_a_multiple_of_the_ranks():
    assert g.segments(MLP, 4) == (8, 334_856.0)  # 3 by size, raised to 2 x 4
    assert g.segments(MLP, 2) == (4, 669_708.0)
    assert g.segments(45_000_000, 4) == (44, 1_022_728.0)  # 43 by size, rounded up to a multiple of 4
    count, size = g.segments(100, 4)
    assert count == 8 and size == 16.0  # 13 bytes rounded up to whole float32 elements


def test_two_ranks_on_two_nodes_pay_two_round_trips_and_the_bytes_at_the_rate():
    # 4 segments, two each phase, both in flight at once: the note's way there, the bytes, the way back
    got = g.allreduce_s(MLP, _links(ranks=2, per=1, wire=RATE_100MBIT))
    assert got == pytest.approx(4 * 0.02 + MLP * RATE_100MBIT, rel=1e-4)


def test_a_latency_bound_ring_waits_one_round_trip_per_two_segments():
    # 2 nodes x 2 ranks: 6 segments a phase, pairs of 2 in flight: 3 round trips a phase
    assert g.allreduce_s(MLP, _links()) == pytest.approx(6 * 0.04)
    # a flat ring of 4 nodes gives the same: every rank waits on its own hop's round trip
    assert g.allreduce_s(MLP, _links(per=1)) == pytest.approx(6 * 0.04)
    # one node: no delay at all, only the loopback's bytes
    assert g.allreduce_s(MLP, _links(per=4, local=1e-9)) < 0.01


def test_under_a_rate_limit_the_round_trips_overlap_the_transfers():
    rate_bound = 2 * 3 / 4 * MLP * RATE_100MBIT  # each crossing link carries 1.5 x the buffer
    latency_bound = 6 * 0.04
    got = g.allreduce_s(MLP, _links(wire=RATE_100MBIT))
    assert max(rate_bound, latency_bound) < got < 0.9 * (rate_bound + latency_bound)
    # with almost no delay the link is never idle: the bytes at the rate
    assert g.allreduce_s(MLP, _links(one_way=1e-5, wire=RATE_100MBIT)) == pytest.approx(rate_bound, rel=0.01)


def test_a_receive_note_queues_behind_the_data_on_its_nodes_egress():
    # node 1's egress carries rank 2's segments and rank 3's notes to rank 0: a note waits for the
    # segment ahead of it, so the ring takes longer than with the notes on a path of their own
    queued = g.allreduce_s(MLP, _links(wire=RATE_100MBIT))
    free = g._Replay(_links(wire=RATE_100MBIT), 6, g.segments(MLP, 4)[1])
    free._transfer = _notes_bypass(free)
    assert free.run() < queued


def _notes_bypass(replay):
    inner = replay._transfer

    def transfer(t, src, dst, nbytes):
        if nbytes == g.NOTE_BYTES and replay.links.node(src) != replay.links.node(dst):
            return t + replay.links.one_way_s
        return inner(t, src, dst, nbytes)
    return transfer


def test_a_ring_of_more_ranks_waits_for_more_pairs_of_segments_and_an_empty_one_for_none():
    flat = g.allreduce_s(MLP, _links(ranks=2, per=1))  # 2 segments a phase: one pair, one round trip
    assert flat == pytest.approx(2 * 0.04)
    # 8 ranks on 2 nodes: 14 segments a phase, 7 pairs, each waiting for a crossing hop
    assert g.allreduce_s(MLP, _links(ranks=8, per=4)) == pytest.approx(14 * 0.04)
    assert g.allreduce_s(0, _links()) == 0.0 and g.allreduce_s(MLP, _links(ranks=1, per=1)) == 0.0
