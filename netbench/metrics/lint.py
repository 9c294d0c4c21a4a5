"""Checks on generated dashboards, and the list of queries in them (pure).

`queries()` lists every Prometheus query of a dashboard (panel targets, variables,
annotations); `lint()` returns one message per problem: duplicate ids or uids, a missing
datasource variable or a panel not using it, a panel without a unit, a counter outside
rate()/increase(), a metric the catalogue does not define.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from netbench.metrics.catalogue import metric_for_series

# series Prometheus itself adds to every scrape target
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
COUNTER_FUNCTIONS = {"rate", "increase", "irate"}
DATASOURCE_UID = "${datasource}"
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"label_values\((?P<metric>.+),\s*(?P<label>\w+)\)")  # fullmatch


@dataclass(frozen=True)
class Query:
    kind: str  # panel | variable | annotation
    where: str  # "<dashboard uid> / <panel or variable or annotation name>"
    expr: str


def queries(dashboard: dict) -> list[Query]:
    uid = dashboard.get("uid", "?")
    found = []
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            found.append(Query("panel", f"{uid} / {panel.get('title')} [{target.get('refId')}]", target["expr"]))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            found.append(Query("variable", f"{uid} / ${variable['name']}",
                               query["query"] if isinstance(query, dict) else query))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if not annotation.get("builtIn"):
            found.append(Query("annotation", f"{uid} / {annotation['name']}", annotation["expr"]))
    return found


def label_values(expr: str) -> tuple[str, str] | None:
    """(series selector, label) of a Grafana `label_values(selector, label)` variable query."""
    match = _LABEL_VALUES.fullmatch(expr.strip())
    return (match["metric"], match["label"]) if match else None


def _strip_strings_and_brackets(expr: str) -> str:
    """Blank out label matchers ({...}), range/offset brackets ([...]) and strings, keeping positions."""
    out, depth_curly, depth_square, quote = [], 0, 0, None
    for ch in expr:
        if quote:
            out.append(" ")
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
            out.append(" ")
        elif ch == "{":
            depth_curly += 1
            out.append(" ")
        elif ch == "}":
            depth_curly -= 1
            out.append(" ")
        elif ch == "[":
            depth_square += 1
            out.append(" ")
        elif ch == "]":
            depth_square -= 1
            out.append(" ")
        else:
            out.append(" " if depth_curly or depth_square else ch)
    return "".join(out)


def _modifier_lists(expr: str) -> list[tuple[int, int]]:
    """Spans of `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left (...)` label lists."""
    spans = []
    for match in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(", expr):
        end = expr.find(")", match.end())
        spans.append((match.end(), end))
    return spans


def metric_names(expr: str) -> list[tuple[str, int]]:
    """(name, position) of every metric selector in a PromQL expression (a small scanner, not a parser)."""
    clean = _strip_strings_and_brackets(expr)
    skip = _modifier_lists(clean)
    names = []
    for match in _IDENT.finditer(clean):
        name, start, end = match.group(), match.start(), match.end()
        if any(lo <= start < hi for lo, hi in skip):
            continue
        if start and (clean[start - 1].isdigit() or clean[start - 1] == "."):  # a duration or number: 1m, 1e3
            continue
        rest = clean[end:].lstrip()
        if rest.startswith("(") or re.match(r"(by|without)\b", rest):  # a function or aggregation
            continue
        if name in ("by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                    "unless", "offset", "inf", "nan", "Inf", "NaN"):
            continue
        names.append((name, start))
    return names


def _enclosing_functions(expr: str, position: int) -> list[str]:
    """Names of the function calls whose parentheses enclose `position`."""
    found, depth = [], 0
    for index in range(position - 1, -1, -1):
        ch = expr[index]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth:
                depth -= 1
                continue
            head = re.search(r"([A-Za-z_]\w*)\s*$", expr[:index])
            if head:
                found.append(head.group(1))
    return found


def _is_counter_series(name: str) -> bool:
    metric = metric_for_series(name)
    if metric is None:
        return False
    return metric.type == "counter" or (metric.type == "histogram" and name != metric.name)


def lint_expr(expr: str, where: str, values_used: bool = True) -> list[str]:
    """Problems of one expression; `values_used` False for label_values() selectors (no arithmetic)."""
    problems = []
    clean = _strip_strings_and_brackets(expr)
    for name, position in metric_names(expr):
        if name.startswith("$"):
            continue
        if metric_for_series(name) is None and name not in PROMETHEUS_SERIES:
            problems.append(f"{where}: {name} is not in the metric catalogue")
        elif values_used and _is_counter_series(name) and not COUNTER_FUNCTIONS & set(_enclosing_functions(clean, position)):
            problems.append(f"{where}: counter {name} outside rate() or increase()")
    return problems


def lint(dashboards: list[dict]) -> list[str]:
    problems: list[str] = []
    uids = [d.get("uid") for d in dashboards]
    problems += [f"duplicate dashboard uid {uid}" for uid in sorted({u for u in uids if uids.count(u) > 1})]
    for dashboard in dashboards:
        uid = dashboard.get("uid")
        if not uid:
            problems.append(f"{dashboard.get('title')}: no uid")
        variables = dashboard.get("templating", {}).get("list", [])
        if not any(v.get("type") == "datasource" and v.get("query") == "prometheus"
                   and "${%s}" % v.get("name") == DATASOURCE_UID for v in variables):
            problems.append(f"{uid}: no Prometheus datasource variable named 'datasource'")
        ids = [p.get("id") for p in dashboard.get("panels", [])]
        problems += [f"{uid}: duplicate panel id {i}" for i in sorted({i for i in ids if ids.count(i) > 1})]
        for panel in dashboard.get("panels", []):
            where = f"{uid} / {panel.get('title')}"
            if panel.get("type") == "row":  # a header: no query, unit or datasource of its own
                if panel.get("targets"):
                    problems.append(f"{where}: a row with queries")
                continue
            if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                problems.append(f"{where}: no unit")
            sources = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
            if any((s or {}).get("uid") != DATASOURCE_UID for s in sources):
                problems.append(f"{where}: does not use the datasource variable")
            if not panel.get("targets"):
                problems.append(f"{where}: no query")
        for annotation in dashboard.get("annotations", {}).get("list", []):
            if not annotation.get("builtIn") and annotation.get("datasource", {}).get("uid") != DATASOURCE_UID:
                problems.append(f"{uid} / {annotation.get('name')}: does not use the datasource variable")
        for query in queries(dashboard):
            expr = query.expr
            if query.kind == "variable":
                parsed = label_values(expr)
                if parsed is None:
                    problems.append(f"{query.where}: variable query is not label_values(selector, label)")
                    continue
                problems += lint_expr(parsed[0], query.where, values_used=False)
                continue
            problems += lint_expr(expr, query.where)
    return problems
