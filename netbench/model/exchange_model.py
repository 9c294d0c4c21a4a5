"""The exchange strategies' communication per step (pure): ps-sync, ps-async, ps-ssp, easgd,
gosgd and adpsgd, whose model-sized messages are netbench's own frames on plain TCP
connections (netbench.jobs.exchange), not TensorFlow's collectives.

Terms, all measured or configured, none fitted to a run's steps:

* the protocol's alpha and beta: a request-reply of N bytes each way on unshaped links, timed
  at a few sizes before the sweep's first point (experiment/predict.py's exchange
  calibration) and fitted to alpha + beta x 2N: a request's fixed cost and the seconds per
  byte moved (framing, copies, the kernel); without that calibration (older folders) the
  all-reduce's intercept and its per-link slope stand in, as they did before;
* the round trip: 2 x the configured one-way delay (every node delays its egress);
* the configured rate's seconds per byte through a node's egress (0 when unshaped);
* TCP's window: the most a connection has in flight, so at most `window` bytes per round trip
  (the bandwidth-delay argument: a connection's throughput <= window / RTT). The window is
  the kernel's ceiling in the nodes' namespace, read at the calibration: the send buffer's
  maximum (tcp_wmem's third value: unacknowledged bytes stay in it) or the receive buffer's
  maximum less the share tcp_adv_win_scale keeps back, whichever is smaller. Assumed: the
  buffers reach that ceiling (Linux auto-tunes them) and the congestion window does not bind
  below it (no loss on these links; BBR or CUBIC open it past the window within a few steps).

A message of b bytes on one connection, from its first byte sent to its last received, takes
half a round trip plus b x max(beta, rate's seconds per byte x what shares the egress,
RTT / window): at a large bandwidth-delay product the last term binds, and a model-sized
message then spends b / window round trips beyond its propagation (the "window opening" of
estimate.py's exchange_s: 2.7 MB at 100 ms RTT against a 4 MiB ceiling, 0.64 round trips
each way). Per strategy (its `comm` seconds per step):

* ps-sync, ps-async, ps-ssp: a push of the gradient (the worker's egress sends its 1/P to each
  of P servers) and a reply with the weights (each server's egress sends its 1/P to every
  worker): request_reply; ps-ssp (S) and a pipelined ps-async (its pipeline) keep several in flight
  (step_model.PIPELINED; one, ps-async's default, is a request-reply each step):
  their round trips hide behind the computing, but a step is never shorter than the computing
  plus the worker's own per-byte work (worker_bytes_s: the CPU does both) nor than the busier
  direction's bytes at a window per round trip (pipelined_s);
* easgd: the same exchange with the centre every `period` steps;
* adpsgd: its model to one peer and the peer's model back every step, both nodes' egress
  carrying two models (each also answers the other);
* gosgd: with probability p a one-way push of the model, never answered: the worker waits
  only until the kernel has taken the bytes, which drain at the connection's pace (its send
  buffer holds about what is in flight), so b x the per-byte term and no round trip.
"""

from __future__ import annotations

from typing import Any, Mapping

from netbench.model.job import EXCHANGE_STRATEGIES

# bytes on the wire per payload byte: a 1448-byte TCP segment (timestamps on) rides a 1514-byte
# Ethernet frame, and the rate limits whole frames
WIRE_OVERHEAD = 1514 / 1448

STRATEGIES = EXCHANGE_STRATEGIES


def window_from_limits(limits: Mapping[str, Any]) -> int | None:
    """The most one connection keeps in flight, from a namespace's sysctls (the exchange
    benchmark's tcp_limits event): min(tcp_wmem max, tcp_rmem max less tcp_adv_win_scale's
    share, as the kernel's tcp_win_from_space computes it); None when neither is known."""
    candidates = []
    wmem, rmem = limits.get("tcp_wmem"), limits.get("tcp_rmem")
    if isinstance(wmem, (list, tuple)) and len(wmem) == 3 and wmem[2] > 0:
        candidates.append(int(wmem[2]))
    if isinstance(rmem, (list, tuple)) and len(rmem) == 3 and rmem[2] > 0:
        space, scale = int(rmem[2]), int(limits.get("tcp_adv_win_scale", 1))
        candidates.append(space >> -scale if scale <= 0 else space - (space >> scale))
    return min(candidates) if candidates else None


def wire_s_per_byte(x) -> float:
    """Seconds per payload byte on one node's shaped egress (0: unshaped)."""
    return 8.0 * WIRE_OVERHEAD / x.rate_bps if x.rate_bps else 0.0


def protocol_terms(x) -> tuple[float, float]:
    """(alpha, beta per byte moved) of the exchange protocol: the calibration's, or without
    one the all-reduce's intercept and per-link slope (2(n-1)/n of its bytes cross a link)."""
    n = max(2, x.workers)
    alpha = x.exchange_alpha_s if x.exchange_alpha_s is not None else x.overhead_s
    beta = x.exchange_beta_s_per_byte
    if beta is None:
        beta = x.beta_s_per_byte * n / (2 * (n - 1))
    return alpha, beta


def rtt_s(x) -> float:
    return 2 * x.delay_s


def window_s_per_byte(x) -> float:
    """A connection's seconds per byte under its window: RTT / window (0 without a window)."""
    return rtt_s(x) / x.window_bytes if x.window_bytes else 0.0


def one_way_s(x, per_connection: float, connections: float = 1.0) -> float:
    """Seconds beyond propagation for `per_connection` bytes on each of `connections`
    connections leaving one node at once: the node's CPU and egress carry all of them, each
    connection no more than a window per round trip."""
    _, beta = protocol_terms(x)
    total = per_connection * connections
    return max(total * beta, total * wire_s_per_byte(x), per_connection * window_s_per_byte(x))


def request_reply_s(x, up: float, down: float, up_connections: float = 1.0, down_connections: float = 1.0) -> float:
    """A request of `up` bytes per connection and its reply of `down`: the protocol's fixed
    cost, a round trip, and both directions' bytes."""
    alpha, _ = protocol_terms(x)
    return alpha + rtt_s(x) + one_way_s(x, up, up_connections) + one_way_s(x, down, down_connections)


def _shard(x) -> float:
    return x.model_bytes / max(1, x.ps)


def push_pull_s(x) -> float:
    """ps-sync's exchange (ps-async's and ps-ssp's one exchange, easgd's with the centre): the
    worker sends 1/P to each of P servers, each server sends 1/P back to every worker."""
    return request_reply_s(x, _shard(x), _shard(x), up_connections=max(1, x.ps), down_connections=x.workers)


def pipelined_s(x) -> float:
    """The least step of a worker with exchanges in flight: the busier direction's bytes per
    step (its pushes out, the servers' replies back: each its own stream)."""
    shard = _shard(x)
    return max(one_way_s(x, shard, max(1, x.ps)), one_way_s(x, shard, x.workers))


def worker_bytes_s(x) -> float:
    """The worker's own share of its exchange's per-byte cost: its push out and the weights
    back, at the protocol's beta. Its interpreter frames and reads them (numpy copies, the
    kernel's) besides computing: with exchanges in flight the round trips hide behind the
    computing, these seconds do not (the step model's premise that computing and
    communicating do not overlap, for the CPU's part of communicating)."""
    _, beta = protocol_terms(x)
    return 2 * x.model_bytes * beta


def pipelined_floor_s(x) -> float:
    """Its physical bound: the busier egress at the configured rate, each connection at
    window / RTT."""
    shard = _shard(x)
    busiest = max(x.model_bytes, shard * x.workers)
    return max(busiest * wire_s_per_byte(x), shard * window_s_per_byte(x))


def _period(x, name: str, default: float) -> float:
    return max(1.0, float(x.params.get(name, default)))


def easgd_s(x) -> float:
    return push_pull_s(x) / _period(x, "period", 4)


def adpsgd_s(x) -> float:
    """Its model out and the peer's back, each node's egress also answering the peer."""
    return request_reply_s(x, x.model_bytes, x.model_bytes, up_connections=2, down_connections=2)


def gosgd_s(x) -> float:
    """With probability p, a push of the model that nobody answers."""
    return float(x.params.get("p", 1.0)) * one_way_s(x, x.model_bytes)


PATTERNS = {"ps-sync": push_pull_s, "ps-ssp": push_pull_s, "ps-async": push_pull_s,
            "easgd": easgd_s, "gosgd": gosgd_s, "adpsgd": adpsgd_s}
