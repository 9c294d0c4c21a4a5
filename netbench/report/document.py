"""A report as data (headings, paragraphs, tables, figures) and its two renderings:
markdown (report.md, figures linked beside it) and one self-contained HTML page
(report.html, figures embedded as base64 PNG, no server or network needed). Pure but for
reading the PNGs the HTML embeds."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str  # may hold **bold**


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]  # each may hold **bold**


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Figure:
    path: Path


Block = Union[Heading, Paragraph, Bullets, Table, Figure]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(blocks: Sequence[Block]) -> str:
    lines: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            lines += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Paragraph):
            lines += [b.text, ""]
        elif isinstance(b, Bullets):
            lines += [f"- {item}" for item in b.items] + [""]
        elif isinstance(b, Table):
            lines += ["| " + " | ".join(map(_cell, b.header)) + " |", "|" + "---|" * len(b.header)]
            lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in b.rows] + [""]
        else:
            lines += [f"![{b.path.stem}]({b.path.name})", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _inline(text: str) -> str:
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(text))


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:90%}"
         "th,td{border:1px solid #bbb;padding:3px 8px;text-align:left}th{background:#eee}"
         "img{max-width:100%;display:block;margin:1em 0}")


def to_html(blocks: Sequence[Block], title: str) -> str:
    """One HTML page; each Figure's PNG is read and embedded."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            out.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in b.items) + "</ul>")
        elif isinstance(b, Table):
            out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b.header) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in b.rows]
            out.append("</table>")
        else:
            data = base64.b64encode(Path(b.path).read_bytes()).decode("ascii")
            out.append(f'<img alt="{html.escape(b.path.stem)}" src="data:image/png;base64,{data}">')
    out.append("</body></html>")
    return "\n".join(out) + "\n"
