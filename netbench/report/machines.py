"""A campaign's machines: where each shard ran and how its machine compares with the others at
the points they both measured (the machine effect), for the report of a campaign.

Each shard runs on one machine, so a shard is a block: by repetitions (the default) it measures
every point of its repetitions, and its effect is the geometric mean, over the points, of its
throughput there over the point's geometric mean on every machine, with a log-t interval over
the points; by points (fewer repetitions than shards) the machines share only the reference
point, measured by every shard, and its ratio there is the effect (no interval: one point).
An effect whose interval excludes 1x says the machines differ; the repetitions' spread, and so
every interval of the report, includes that difference, since each repetition ran whole on one
machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from netbench import provenance
from netbench.report.document import Block, Heading, Paragraph, Table
from netbench.report.load import Observation, ReportError, load_observations
from netbench.stats import MIN_RUNS, Interval, geometric_mean, log_t_interval


@dataclass(frozen=True)
class Machine:
    """One shard's machine: its facts, its runs, and its effect over the points it shares."""

    shard: int
    facts: Mapping[str, str]  # provenance.COLUMNS but shard: a value, or its runs' ";"-joined
    runs: int
    ratios: tuple[float, ...]  # per shared point: its throughput there / the point's over every machine
    effect: Interval | None  # the ratios' geometric mean and log-t interval (None: no shared point)


def machine_effects(by_shard: Mapping[int, Sequence[Observation]], facts: Mapping[int, Mapping[str, str]],
                    confidence: float = 0.95) -> list[Machine]:
    """Each shard's Machine (pure): points are observations' factors; a point counts for a shard
    when it and another shard both have a throughput there."""
    values: dict[tuple, dict[int, list[float]]] = {}
    for shard, observations in by_shard.items():
        for obs in observations:
            if obs.images_per_sec is not None and obs.images_per_sec > 0:
                values.setdefault(obs.factors, {}).setdefault(shard, []).append(obs.images_per_sec)
    shared = {point: found for point, found in values.items() if len(found) > 1}
    out = []
    for shard in sorted(by_shard):
        ratios = tuple(geometric_mean(found[shard]) / geometric_mean([v for vs in found.values() for v in vs])
                       for found in shared.values() if shard in found)
        effect = log_t_interval(list(ratios), confidence, min_n=MIN_RUNS) if ratios else None
        out.append(Machine(shard=shard, facts=facts.get(shard, {}), runs=len(by_shard[shard]), ratios=ratios,
                           effect=effect))
    return out


def shard_facts(rows: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """A shard's machine from its results.csv rows: each provenance column's value ("a;b" if its runs differ)."""
    out = {}
    for column in (*provenance.COLUMNS, "congestion_control"):  # the nodes' TCP too: it moves throughput as much
        if column == "shard":
            continue
        seen = [v for v in dict.fromkeys(str(row.get(column) or "") for row in rows) if v]
        out[column] = ";".join(seen)
    return out


def effect_text(machine: Machine) -> tuple[str, str]:
    """The effect and its interval as the table shows them."""
    if machine.effect is None:
        return "-", "no point shared with another machine"
    if machine.effect.low is None:
        return f"{machine.effect.mean:.3f}x", ("one point (the reference)" if len(machine.ratios) == 1
                                               else f"none (points < {MIN_RUNS})")
    return f"{machine.effect.mean:.3f}x", f"{machine.effect.low:.3f}x .. {machine.effect.high:.3f}x"


def machine_blocks(folder: Path, record: Mapping[str, Any], confidence: float = 0.95) -> list[Block]:
    """The report's "Machines" section of a campaign: every shard's machine and its effect."""
    from netbench.experiment import campaign
    from netbench.experiment.store import ResultStore

    by_shard: dict[int, list[Observation]] = {}
    facts: dict[int, dict[str, str]] = {}
    for index in range(int(record["shards"])):
        where = campaign.shard_dir(folder, index)
        store = ResultStore(where)
        if not store.record_paths():
            continue
        try:
            by_shard[index] = load_observations(where)
        except ReportError:
            continue
        facts[index] = shard_facts(store.read_rows() if store.csv_path.is_file() else [])
    machines = machine_effects(by_shard, facts, confidence)
    if not machines:
        return []
    level = f"{confidence:.0%} interval"
    if record.get("by") == "points":
        how = ("The design has fewer repetitions than shards, so its points were shared among the machines by "
               "their estimated time: two points measured on different machines differ by their machines too. "
               f"Every machine measured the reference point (point {record.get('reference_point', 0)}); its "
               "throughput there over every machine's is its effect. The reference point's extra runs are not "
               "part of the design's figures.")
    else:
        how = ("Each shard measured whole repetitions on one machine (a block): every interval of this report is "
               "over repetitions, so it includes the machines' differences. A machine's effect: the geometric mean, "
               "over the points, of its throughput there over the point's on every machine, with a "
               f"{level} over the points; an interval that excludes 1x says that machine differs.")
    rows = tuple((str(m.shard), m.facts.get("host", "") or "-", m.facts.get("cpu_model", "") or "-",
                  m.facts.get("cores", "") or "-", m.facts.get("kernel", "") or "-",
                  m.facts.get("privilege", "") or "-", m.facts.get("congestion_control", "") or "-", str(m.runs),
                  str(len(m.ratios)), *effect_text(m))
                 for m in machines)
    blocks = [Heading("Machines"), Paragraph(how),
              Table(("shard", "host", "CPU", "cores", "kernel", "privilege", "TCP", "runs", "points shared",
                     "machine effect", level), rows)]
    tcp = sorted({m.facts.get("congestion_control", "") for m in machines} - {""})
    if len(tcp) > 1:
        blocks.append(Paragraph(f"The shards' nodes used different TCP congestion controls ({', '.join(tcp)}): a "
                                "machine's effect here is its congestion control's too. A shard without root keeps "
                                "the host's default where the host does not allow netbench's (cubic); see the guide "
                                "Run without root."))
    return blocks
