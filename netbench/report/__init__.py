"""Reports: a results folder -> tables, PNG figures, report.md and a self-contained report.html.

load.py reads the folder (through experiment/store.py) into one Observation per run, with
every measured value by name (throughput, step time, idleness, results.csv's numeric columns);
groups.py groups runs by every factor but the repetition; measures.py says what a figure or
table can show of a group (a Measure: column, words, unit, domain) and its interval; the
statistics themselves live in netbench.stats. A point's centre is the geometric mean of its
runs with a log-scale t interval over repetitions (95 % by default), which cannot go below
zero; shares (idleness, accuracy) get a logit-scale one inside 0..1; under MIN_RUNS (3) runs
there is no interval and the runs are shown instead. A repetition is a launch (one start of
the job's processes), the unit of replication. figures.py draws any Measure against any factor
(lines and markers on a numeric axis, grouped bars for a categorical factor) with
matplotlib's constrained layout at fixed sizes (PANEL_PX per panel), so they can be checked;
curves.py draws what is not a statistic of a point but a run's own series: accuracy runs'
curves (against step or wall time, a panel per network point, a line per algorithm), as a
frozen CurveFigure built purely and drawn at the edge in the same style; accuracy.py is the
algorithms' table and which algorithm and network point won. summary.py builds the report as
blocks (document.py) and writes them as markdown and HTML.
The library writes files and returns data; the CLI prints the tables (netbench/cli/render.py).
"""

from netbench.report.curves import CURVE_X, Curve, CurveFigure, curve_figure, curve_spec, draw_curve_figure
from netbench.report.figures import AXIS_LABELS, DPI, PANEL_PX, Point, axis_scale, build_efficiency_figure, \
    build_figure, build_metric_figure, efficiency_figure, idleness_figure, is_numeric, metric_figure, points_for, \
    save_figure, throughput_figure, value_scale
from netbench.report.groups import BEST_IS_LOW, NETWORK, REFERENCE_STRATEGY, Efficiency, Group, Ratio, \
    baseline_slice, group_observations, idleness_values, networked, scaling_efficiency, series_label, slowdown, \
    speedups, varying
from netbench.report.load import FACTORS, Observation, ReportError, load_observations, observation_from_record
from netbench.report.measures import ACCURACY, IDLENESS, REPORTED, STEP_TIME, THROUGHPUT, TIME_TO_TARGET, Measure
from netbench.report.summary import Written, markdown_summary, percent, report_figures, summary_blocks, write_report

__all__ = [
    "ACCURACY", "AXIS_LABELS", "BEST_IS_LOW", "CURVE_X", "Curve", "CurveFigure", "curve_figure", "curve_spec",
    "draw_curve_figure", "DPI", "FACTORS", "IDLENESS", "NETWORK", "PANEL_PX", "REFERENCE_STRATEGY",
    "REPORTED", "STEP_TIME", "THROUGHPUT", "TIME_TO_TARGET",
    "Efficiency", "Group", "Measure", "Observation", "Point", "Ratio", "ReportError", "Written",
    "axis_scale", "baseline_slice", "build_efficiency_figure", "build_figure", "build_metric_figure",
    "efficiency_figure", "group_observations", "idleness_figure", "idleness_values", "is_numeric",
    "load_observations", "markdown_summary", "metric_figure", "networked", "observation_from_record", "percent",
    "points_for", "report_figures", "save_figure", "scaling_efficiency", "series_label", "slowdown", "speedups",
    "summary_blocks", "throughput_figure", "value_scale", "varying", "write_report",
]
