"""Live metrics for Prometheus: the catalogue, the state a sweep feeds, the collector that
reads it at scrape time, and the HTTP exporter with its file_sd target file."""

from netbench.metrics.catalogue import BY_NAME, CATALOGUE, MetricDef
from netbench.metrics.exporter import MetricsExporter, check_address, serving
from netbench.metrics.state import MetricsObserver, MetricsState

__all__ = ["BY_NAME", "CATALOGUE", "MetricDef", "MetricsExporter", "MetricsObserver", "MetricsState",
           "check_address", "serving"]
