"""Points with packet loss under a precision: expected to run to the window's cap (pure).

Under random loss a TCP sender that loses the last segments of a burst (or a retransmission)
waits for a retransmission timeout: at least 200 ms on Linux (TCP_RTO_MIN), doubling on each
repeat. A step that meets one is hundreds of milliseconds longer than one that does not, so a
lossy point's step times are heavy-tailed and its batch means keep their spread: the 95 %
interval narrows far more slowly than at a clean point and rarely reaches a tight precision
before --max-seconds. The interval it stops at is honest (the record says precision_reached
false); the dry run's estimate and the sweep's first lines say it beforehand.
"""

from __future__ import annotations

WHY = ("TCP's retransmission timeouts (200 ms or more each) make a lossy point's step times vary, so its "
       "interval narrows slowly")


def loss_of(run) -> float:
    """The largest loss a run's steps see: its profile's, or its per-pair topology's worst pair's."""
    pairs = getattr(run, "pairs", None)
    if pairs is not None and pairs.links:
        return max(link.profile.loss for link in pairs.links)
    return run.profile.loss


def expected_at_cap(run) -> bool:
    """A run with a precision, no fixed training length, and loss on its path: it will likely
    measure until its job's max_seconds."""
    job = run.job
    return bool(job is not None and job.precision and not job.train_steps and loss_of(run) > 0)


def note(runs) -> str | None:
    """One line for a dry run or a sweep's start about its lossy points; None without any."""
    lossy = [r for r in runs if expected_at_cap(r)]
    if not lossy:
        return None
    cap = max(r.job.max_seconds for r in lossy)
    losses = sorted({loss_of(r) for r in lossy})
    shown = ", ".join(f"{loss * 100:g} %" for loss in losses)
    return (f"{len(lossy)} point(s) with loss ({shown}) will likely measure until --max-seconds ({cap:g} s each) "
            f"short of their precision: {WHY}; a looser --precision or a shorter --max-seconds bounds them")
