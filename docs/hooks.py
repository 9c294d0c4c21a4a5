"""MkDocs hooks: the metrics reference is generated from netbench/metrics/catalogue.py, so a
metric added there is documented without a second list (tests/readme/test_docs_site.py checks
the built page has every metric); the CLI reference lists the commands in `netbench --help`'s
order and splits their options tables into --help's sections; and the pictures under img/ are
drawn from the code and real runs' records by docs/figures.py at every build."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent

from markdown.extensions import Extension
from markdown.preprocessors import Preprocessor

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


# ------------------------------------------------------------------ the CLI reference's order
# mkdocs-click lists a group's subcommands sorted by name; the reference lists them as `netbench
# --help` does instead (cli/app.py's SECTIONS: the order a user meets them), one mkdocs-click
# block per command, and leaves out the hidden `netbench node` (background/host-agent.md has it)

CLI_MARKER = "<!-- netbench:cli-commands -->"


def cli_blocks() -> str:
    """`netbench --help` as it prints, then one mkdocs-click block per command in its order."""
    import click
    from click.testing import CliRunner

    from netbench.cli.app import SECTIONS, main

    ctx = click.Context(main, info_name="netbench")
    usage = CliRunner().invoke(main, ["--help"], prog_name="netbench", terminal_width=80).output
    parts = ["## netbench {#netbench}", "", "```text", "$ netbench --help", *usage.rstrip().splitlines(), "```", ""]
    for section, names in SECTIONS.items():
        parts += [f"## {section}", ""]
        for name in names:
            command = main.get_command(ctx, name)
            module = command.callback.__module__
            attribute = next(attr for attr, value in vars(sys.modules[module]).items() if value is command)
            parts += ["::: mkdocs-click", f"    :module: {module}", f"    :command: {attribute}",
                      f"    :prog_name: netbench {name}", "    :depth: 2", "    :style: table",
                      "    :show_hidden: true", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs' signature)
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, metrics_table())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_blocks())
    return markdown


# ------------------------------------------------------------------ the pictures

def on_files(files, config):
    """Every picture docs/figures.py draws, as img/<name> of the site (none is committed)."""
    from mkdocs.structure.files import File

    sys.path.insert(0, str(DOCS))
    try:
        import figures
    finally:
        sys.path.remove(str(DOCS))
    with tempfile.TemporaryDirectory() as scratch:
        for path in figures.build(Path(scratch)):
            files.append(File.generated(config, f"img/{path.name}", content=path.read_bytes()))
    return files


# ------------------------------------------------------------------ the CLI reference's sections
# mkdocs-click gives each command one table of options; a command whose --help shows its options
# in sections (netbench/cli/groups.py) gets one table per section here, with the section's name,
# so the reference reads as --help does: a Markdown preprocessor run right after mkdocs-click's
# (priority 141), which on_config adds to the site's Markdown extensions.

TITLE = re.compile(r"^#+ (netbench(?: [\w-]+)*) \{")
ROW = re.compile(r"^\| `(-[\w-]*)`")


def _command(path: str):
    import click

    from netbench.cli.app import main

    command, ctx = main, click.Context(main, info_name="netbench")
    for name in path.split()[1:]:
        command = command.get_command(ctx, name) if isinstance(command, click.Group) else None
        if command is None:
            return None
        ctx = click.Context(command, info_name=name, parent=ctx)
    return command


def _group_of(command, flag: str) -> str:
    import click

    from netbench.cli.groups import OTHER, help_group

    ctx = click.Context(command)
    for param in command.get_params(ctx):
        if flag in (*param.opts, *param.secondary_opts):
            return help_group(param) or OTHER
    return OTHER


# click 8.3 marks an option without a default with a sentinel, which mkdocs-click 0.9 prints
UNSET = "| `Sentinel.UNSET` |"


def grouped_tables(lines: list[str]) -> list[str]:
    """`lines` with each grouped command's options table split into one table per section (and
    no default shown as a sentinel's name)."""
    from netbench.cli.groups import GROUPS, GroupedCommand

    lines = [line[: -len(UNSET)] + "| - |" if line.endswith(UNSET) else line for line in lines]
    out: list[str] = []
    command, index = None, 0
    while index < len(lines):
        line = lines[index]
        title = TITLE.match(line)
        if title:
            command = _command(title.group(1))
        if line.strip() == "**Options:**" and isinstance(command, GroupedCommand):
            header, rule = lines[index + 2], lines[index + 3]
            end = index + 4
            sections: dict[str, list[str]] = {}
            while end < len(lines) and ROW.match(lines[end]):
                sections.setdefault(_group_of(command, ROW.match(lines[end]).group(1)), []).append(lines[end])
                end += 1
            out.append(line)
            for group in (group for group in GROUPS if group in sections):  # --help's order
                out += ["", f"*{group}:*", "", header, rule, *sections[group]]
            index = end
            continue
        out.append(line)
        index += 1
    return out


class _GroupedTables(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return grouped_tables(lines)


class _GroupedTablesExtension(Extension):
    def extendMarkdown(self, md) -> None:  # noqa: N802 (Markdown's name)
        md.preprocessors.register(_GroupedTables(md), "netbench_cli_sections", 140)


def on_config(config):
    config.markdown_extensions.append(_GroupedTablesExtension())
    return config
