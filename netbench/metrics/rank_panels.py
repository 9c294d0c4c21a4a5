"""The training dashboard's "Who waits for whom" panels, built typed with Grafana's own Python
SDK (grafana-foundation-sdk: builders for panels and Prometheus queries) and handed to
`metrics.dashboards` as the plain dicts its layout places.

Per rank of the run in progress (metrics/ranks.py; the definitions of jobs/stragglers.py):
its mean step time, its time outside computation (communicating and waiting for the others),
and the share of steps it finished last (synchronous strategies).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, common, prometheus, timeseries
from grafana_foundation_sdk.models import common as common_models

from netbench.metrics.sdk import DATASOURCE, as_dict, query

SEL = 'instance=~"$instance"'
RANK_LEGEND = "rank {{rank}} ({{node}})"

ROW = "Who waits for whom"
ROW_HELP = ("Each rank of the run in progress: its mean measured step, the part of it outside its computation "
            "(communicating and waiting for the others), and how often it finished last (its computation ended "
            "last, so the others waited for it).")


def _query(expr: str, instant: bool = False) -> prometheus.Dataquery:
    return query(expr, RANK_LEGEND, instant=instant)


def step_panel() -> dict:
    return as_dict(timeseries.Panel().title("Step time per rank").unit("s").datasource(DATASOURCE)
                   .description("Mean measured step time of each rank of the run in progress.")
                   .with_target(_query(f"netbench_rank_step_seconds{{{SEL}}}")))


def waiting_panel() -> dict:
    return as_dict(timeseries.Panel().title("Outside computation per rank").unit("s").datasource(DATASOURCE)
                   .description("Mean time per measured step each rank spent communicating and waiting for the "
                                "others (its step less its computation; steps that carry the split).")
                   .with_target(_query(f"netbench_rank_waiting_seconds{{{SEL}}}")))


def last_panel() -> dict:
    reduce = common.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields("")
    return as_dict(bargauge.Panel().title("Finished last (share of steps)").unit("percentunit").min(0).max(1)
                   .datasource(DATASOURCE).orientation(common_models.VizOrientation.HORIZONTAL)
                   .display_mode(common_models.BarGaugeDisplayMode.BASIC).reduce_options(reduce)
                   .description("Share of the run's steps each rank finished last in: the others waited for it "
                                "(synchronous strategies).")
                   .with_target(_query(f"netbench_rank_last_ratio{{{SEL}}}", instant=True)))


def panels() -> list[tuple[dict, int]]:
    """The row's panels, each with its width on the 24-column grid."""
    return [(step_panel(), 8), (waiting_panel(), 8), (last_panel(), 8)]
