"""What a run's events say about who trained and where its steps came from (pure).

netbench's own workers are TensorFlow and report through their harness (source "harness").
A user's command (model/command_job.py) reports through netbench.track (source "track": its
start event names the framework it found loaded) or through lines of its output read with
--step-regex (source "regex", with the lines given up as too slow to match:
`step_regex_given_up`); one that does neither is measured in bytes on its nodes'
links (source "bytes": jobs/link_bytes.py), with no images at all. Its images per step are
--images-per-step, or what its track events say (each event carries the whole cluster's images).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from netbench.jobs import events as ev
from netbench.jobs.link_bytes import source_of
from netbench.jobs.user import GIVEN_UP_EVENT
from netbench.model.command_job import SOURCE_REGEX, SOURCE_TRACK
from netbench.model.job import JobSpec

HARNESS = "harness"


def _chief(events: Sequence[ev.Event]) -> list[ev.Event]:
    return [e for e in ev.as_events(events) if e.task_role == "worker" and e.worker == 0]


def origin(events: Sequence[ev.Event], job: JobSpec, link: dict | None = None) -> dict[str, str]:
    """The record's `framework` and `source` (`link`: measured in bytes on the links)."""
    if job.command is None:
        return {"framework": job.framework, "source": HARNESS}
    # a bytes window is only ever over when no track event came (experiment/link_window.py)
    source = source_of(job.command.step_regex, heard_track=link is None)
    if source == SOURCE_REGEX:  # a line given up is no step: the record says how many
        given_up = sum(1 for e in events if isinstance(e, ev.Other) and e.name == GIVEN_UP_EVENT)
        return {"framework": "", "source": source, "step_regex_given_up": given_up}
    if source != SOURCE_TRACK:
        return {"framework": "", "source": source}
    for event in _chief(events):
        if isinstance(event, ev.Start):
            return {"framework": str(dict(event.extra).get("framework", "")), "source": SOURCE_TRACK}
    return {"framework": "", "source": SOURCE_TRACK}


def resolved_job(job: JobSpec, events: Sequence[ev.Event], workers: int) -> JobSpec:
    """A user's command's job with its per-worker batch filled in (so images per step and per
    worker are computed as for the built-in jobs): --images-per-step over the workers, else
    the chief's first step event's images over the workers; other jobs as they are."""
    if job.command is None:
        return job
    total = job.command.images_per_step
    if total is None:
        total = next((e.images for e in _chief(events) if isinstance(e, ev.Step)), 0)
    return replace(job, batch_size=total // max(1, workers))
