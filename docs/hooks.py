"""MkDocs hook: the metrics reference is generated from netbench/metrics/catalogue.py, so a
metric added there is documented without a second list (tests/readme/test_docs_site.py checks
the built page has every metric)."""

from __future__ import annotations

MARKER = "<!-- netbench:metrics-catalogue -->"


def metrics_table() -> str:
    from netbench.metrics.catalogue import CATALOGUE

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    parts: list[str] = []
    group = None
    for metric in CATALOGUE:
        if metric.group != group:
            group = metric.group
            parts += ["", f"## {group or 'other'}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        labels = ", ".join(f"`{label}`" for label in metric.labels) or "-"
        parts.append(f"| `{metric.name}` | {metric.type} | {labels} | {cell(metric.help)} |")
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs' signature)
    if MARKER in markdown:
        return markdown.replace(MARKER, metrics_table())
    return markdown
