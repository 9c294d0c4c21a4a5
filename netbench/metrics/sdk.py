"""What the dashboards build with Grafana's Python SDK (grafana-foundation-sdk): a Prometheus
query on the `${datasource}` variable, and a built object as the JSON object Grafana reads."""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models import prometheus as prometheus_models

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
FORMATS = {f.value: f for f in prometheus_models.PromQueryFormat}  # time_series, table, heatmap


def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False,
          fmt: str = "time_series") -> prometheus.Dataquery:
    """A Prometheus query (range, or instant), written in code mode."""
    built = (prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
             .editor_mode(prometheus_models.QueryEditorMode.CODE).format(FORMATS[fmt]))
    return built.instant() if instant else built.range()


def as_dict(builder) -> dict:
    """A built SDK object as the JSON object Grafana reads (the SDK's own encoder; a panel without
    options of its own gets an empty mapping, as the other panels have, not null)."""
    built = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    if "options" in built and built["options"] is None:
        built["options"] = {}
    return built
