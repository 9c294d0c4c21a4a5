"""Reports: a results folder -> tables, PNG figures and a markdown summary.

load.py reads the folder (through experiment/store.py) into one Observation per run;
groups.py groups runs by every factor but the repetition, and a group's throughput is the
mean over its repetitions with a confidence interval from Student's t distribution (99 % by
default; the statistics themselves live in netbench.stats). A repetition is a launch (one
start of the job's processes measuring every point of a job configuration in turn), so the
intervals are over launches, the unit of replication. A group of one run has no
interval; its single observation is still drawn as a dot. Timed-out runs have no
throughput: they are counted and marked with a cross on the figures. figures.py draws with
matplotlib's Agg backend at fixed sizes (PANEL_PX per panel), so they can be checked;
summary.py writes report.md. The library writes files and returns data; the CLI prints
the tables (netbench/cli/render.py).
"""

from netbench.report.figures import AXIS_LABELS, DPI, PANEL_PX, axis_scale, efficiency_figure, idleness_figure, \
    throughput_figure, value_scale
from netbench.report.groups import BEST_IS_LOW, NETWORK, REFERENCE_STRATEGY, Efficiency, Group, Ratio, \
    baseline_slice, group_observations, idleness_values, networked, scaling_efficiency, series_label, slowdown, \
    speedups, varying
from netbench.report.load import FACTORS, Observation, ReportError, load_observations, observation_from_record
from netbench.report.summary import Written, markdown_summary, percent, write_report

__all__ = [
    "AXIS_LABELS", "BEST_IS_LOW", "DPI", "FACTORS", "NETWORK", "PANEL_PX", "REFERENCE_STRATEGY",
    "Efficiency", "Group", "Observation", "Ratio", "ReportError", "Written",
    "axis_scale", "baseline_slice", "efficiency_figure", "group_observations", "idleness_figure", "idleness_values",
    "load_observations", "markdown_summary", "networked", "observation_from_record", "percent", "scaling_efficiency",
    "series_label", "slowdown", "speedups", "throughput_figure", "value_scale", "varying", "write_report",
]
