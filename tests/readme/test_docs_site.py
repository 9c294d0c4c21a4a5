"""The documentation site builds, strictly, and covers what the code has.

`mkdocs build --strict` (as `make docs` runs it) fails on any warning: a broken link or anchor,
a page missing from the nav, a nav entry without its page. The built pages are then checked
against the code, so what is added there without docs fails here: every command and every flag
(the CLI reference is generated from the click commands, so it covers a new flag by itself),
every results.csv column (experiment/store.py), every key of every file format netbench reads,
every metric (generated from metrics/catalogue.py) and every variable a rank is given.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from netbench.cli.app import main
from netbench.experiment.store import CSV_COLUMNS
from netbench.metrics.catalogue import CATALOGUE
from netbench.model import algorithm_keys, command_job, pairs_file, playbook, playbook_keys, profile, schedule
from netbench.model.command_job import Place, rank_env
from netbench.model.playbook_values import SETTING_KEYS
from netbench.remote import inventory
from tests.conftest import ROOT

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as `make docs` builds it (strict), into a scratch folder."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # the theme's banner
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert not re.search(r"^(WARNING|ERROR)\b", output, re.M), output
    return out


def page_text(site: Path, page: str) -> str:
    """A built page's text: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", " ", (site / page / "index.html").read_text()))


def commands(command: click.Command, path: str = "netbench"):
    """(path, command) of the CLI and every subcommand, hidden ones too."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name=path.split()[-1])
        for name in command.list_commands(ctx):
            yield from commands(command.get_command(ctx, name), f"{path} {name}")


def test_the_site_builds_strictly(site):
    assert (site / "index.html").is_file() and (site / "reference" / "cli" / "index.html").is_file()


def cli_sections(site: Path, page: str = "reference/cli") -> dict[str, str]:
    """A generated CLI page's text per command ("netbench sweep" -> its section), split at the
    headings mkdocs-click gives each command (id "netbench-sweep")."""
    text = (site / page / "index.html").read_text()
    parts = re.split(r'<h\d id="(netbench[a-z0-9-]*)"', text)
    return {ident: html.unescape(re.sub(r"<[^>]+>", " ", body)) for ident, body in zip(parts[1::2], parts[2::2])}


def test_every_command_and_flag_is_in_the_cli_reference(site):
    """Every command and flag: the CLI reference has every command a user types, and the host
    agent's page (background/host-agent.md) the hidden `netbench node` ones."""
    sections = {**cli_sections(site, "background/host-agent"), **cli_sections(site)}
    missing = []
    for path, command in commands(main):
        section = sections.get(path.replace(" ", "-"))
        if section is None:
            missing.append(path)
            continue
        for param in command.params:
            if isinstance(param, click.Option):
                missing += [f"{path} {flag}" for flag in [*param.opts, *param.secondary_opts]
                            if flag.startswith("--") and not re.search(rf"{re.escape(flag)}(?![\w-])", section)]
    assert not missing, f"not in the CLI reference (docs/reference/cli.md): {missing}"


def test_the_cli_reference_lists_the_commands_in_helps_order_without_the_host_agent(site):
    from netbench.cli.app import SECTIONS

    page = (site / "reference" / "cli" / "index.html").read_text()
    order = [ident[len("netbench-"):] for ident in re.findall(r'<h\d id="(netbench-[a-z]+)"', page)]
    assert [name for name in order if "-" not in name] == [name for names in SECTIONS.values() for name in names]
    assert "netbench-node" not in page and "netbench-node" in (site / "background" / "host-agent" / "index.html").read_text()


FIGURES = ("testbed.png", "launch-timeline.png", "report-throughput.png", "report-steptime.png", "who-waits.png")


def test_the_site_has_its_pictures_and_the_pages_show_them(site):
    """docs/figures.py draws them at every build (docs/hooks.py): from the code and real runs'
    records, never committed; each is shown by a page."""
    shown = {Path(src).name for page in site.rglob("index.html")
             for src in re.findall(r'<img[^>]+src="([^"]+)"', page.read_text())}
    for name in FIGURES:
        assert (site / "img" / name).stat().st_size > 10_000, name
        assert name in shown, f"no page shows {name}"
    assert not list((ROOT / "docs").rglob("*.png")), "pictures are drawn by the build, not committed"


def test_the_cli_reference_shows_a_grouped_commands_options_in_helps_sections(site):
    """As --help does (netbench/cli/groups.py): one table per section, in GROUPS' order, each
    flag in its own section's table; and no default printed as click's sentinel."""
    from netbench.cli.groups import GROUPS, OTHER, GroupedCommand, help_group

    page = (site / "reference" / "cli" / "index.html").read_text()
    assert "Sentinel.UNSET" not in page
    parts = re.split(r'<h\d id="(netbench[a-z0-9-]*)"', page)
    bodies = dict(zip(parts[1::2], parts[2::2]))
    grouped = [(path, command) for path, command in commands(main) if isinstance(command, GroupedCommand)]
    assert {"netbench sweep", "netbench run", "netbench collective"} <= {path for path, _ in grouped}
    for path, command in grouped:
        body = bodies[path.replace(" ", "-")]
        shown = re.findall(r"<em>([A-Za-z ]+):</em>", body)
        assert shown == [group for group in GROUPS if group in shown], (path, shown)
        tables = dict(zip(shown, re.split(r"<em>[A-Za-z ]+:</em>", body)[1:]))
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"<code>{param.opts[0]}</code>" in tables[help_group(param) or OTHER], (path, param.opts[0])


def test_every_results_column_is_described():
    text = (ROOT / "docs" / "reference" / "results.md").read_text()
    assert not [column for column in CSV_COLUMNS if f"`{column}`" not in text]


FILE_KEYS = {
    "profile": (*profile.PROFILE_KEYS, *profile.LOSS_MODEL_KEYS),
    "schedule": (*schedule.SCHEDULE_KEYS, *schedule.TRIGGER_KEYS),
    "topology": pairs_file.TOPOLOGY_KEYS,
    "playbook": (*playbook.TOP_KEYS, *SETTING_KEYS, *algorithm_keys.TOP_KEYS, *command_job.PLAYBOOK_KEYS),
    "inventory": (*inventory.TOP_KEYS, *inventory.HOST_KEYS),
}


@pytest.mark.parametrize("kind", FILE_KEYS)
def test_every_key_of_every_file_format_is_in_the_reference(kind):
    text = (ROOT / "docs" / "reference" / "files.md").read_text()
    section = text.split(f"\n## {kind.capitalize()}\n", 1)[1].split("\n## ", 1)[0]
    assert not [key for key in FILE_KEYS[kind] if f"`{key}`" not in section]


def test_every_old_key_spelling_is_in_the_vocabulary_with_its_key_now():
    text = (ROOT / "docs" / "reference" / "vocabulary.md").read_text()
    section = text.split("\n## Older spellings\n", 1)[1]
    renamed = {**playbook_keys.TOP_RENAMED, **playbook_keys.SETTINGS_RENAMED,
               **{f"timeouts: {{{old}: ...}}": new for old, new in playbook_keys.TIMEOUTS.items()}}
    assert not [old for old, new in renamed.items() if f"| `{old}`" not in section or f"| `{new}` |" not in section]
    assert playbook_keys.UNTIL in section


def test_every_metric_is_in_the_metrics_reference(site):
    text = page_text(site, "reference/metrics")
    assert not [metric.name for metric in CATALOGUE if metric.name not in text]


def test_every_variable_given_to_a_rank_is_documented():
    places = [Place(f"n{i}", f"netbench-n{i}", f"10.0.0.{i}", "eth0") for i in (1, 2)]
    names = {name for name, _ in rank_env(places, 1, 29500, 10)} | {"NETBENCH_CONTROL"}
    text = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert not sorted(name for name in names if f"`{name}`" not in text)
