"""What the documentation says is kept true: checks over README.md and docs/ against the code
(no site build and no root: the docs tier, tests/readme/, builds the site and runs the examples).

Every flag a page names is a flag of the command it is shown with (or of some netbench command);
every NETBENCH_ variable a page names is one the code reads or gives, and every one it reads or
gives is in the environment reference; every results.csv column a page names is written; every
key a YAML block shows is a key of its file format; a default a page quotes in the form
"`--flag` (VALUE)" is the flag's default; shell blocks hold no placeholders (a block that shows a
pattern is titled as a template); command lines fit a page 1,280 px wide; the tutorial and the
how-to guides keep paragraphs short and leave module paths, commit hashes and single runs to
background and validation; the words concepts.md builds on are defined there first.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import click
import pytest
import yaml

from netbench.cli.app import main
from netbench.experiment.store import CSV_COLUMNS
from netbench.model import algorithm_keys, command_job, pairs_file, playbook, playbook_keys, profile, schedule
from netbench.model.playbook_values import SETTING_KEYS
from netbench.remote import inventory
from tests import readme_examples as rx
from tests.conftest import ROOT

PAGES = rx.doc_files(ROOT)


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def nav_section(title: str) -> list[Path]:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    section = next(entry[title] for entry in nav if isinstance(entry, dict) and title in entry)
    return [ROOT / "docs" / page for page in rx.nav_pages(section)]


TUTORIAL = ROOT / "docs" / "getting-started.md"
GUIDES = nav_section("How-to guides") if "How-to guides" in (ROOT / "mkdocs.yml").read_text() else nav_section("Guides")
TAUGHT = [TUTORIAL, *GUIDES]  # the pages a reader follows step by step


def outside_fences(text: str) -> str:
    """The text without its fenced blocks (their lines left empty, so line numbers hold)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            out.append("")
        else:
            out.append("" if inside else line)
    return "\n".join(out)


def fenced(text: str, languages: tuple[str, ...]) -> list[tuple[int, str, list[str]]]:
    """(line of the opening fence, its whole opening line, the block's lines) of each fenced
    block in one of `languages`."""
    found, current = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if current is None and line.startswith("```"):
            current = (number, line, [])
        elif current is not None and line.strip() == "```":
            if rx.FENCE.match(current[1]).group(1) in languages:
                found.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    return found


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", outside_fences(text))


# ---------------------------------------------------------------- flags

def walk(command: click.Command, path: tuple[str, ...] = ("netbench",)):
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for sub in command.list_commands(ctx):
            yield from walk(command.get_command(ctx, sub), (*path, sub))


COMMANDS = dict(walk(main))


def flags_of(command: click.Command) -> set[str]:
    found = {"--help", "-h"}
    for param in command.params:  # not get_params: it would cache a help option made for a bare context
        if isinstance(param, click.Option):
            found |= {*param.opts, *param.secondary_opts}
    return found


ALL_FLAGS = set().union(*(flags_of(command) for command in COMMANDS.values())) | {"--version"}
# flags a page names that are another program's, or a netbench process's own (not a command's)
FOREIGN = {
    "--physdev-in": "iptables' physdev match (the userspace backend's rule)",
    "--until-stopped": "the training worker's own option (python -m netbench.jobs.worker)",
    "--exclusive": "sbatch's: a whole node per task (the campaign's batch script)",
    "--mem": "sbatch's: memory per node (an --sbatch-arg example)",
    "--array": "sbatch's: a job array (the campaign's batch script)",
}


def command_lines(text: str) -> list[str]:
    """Every netbench command line a page shows: its shell examples and its `netbench ...` spans."""
    lines = [example.command for example in rx.readme_examples(text)]
    lines += [span for span in code_spans(text) if span.startswith(("netbench ", "sudo netbench "))]
    for _, opening, block in fenced(text, rx.SHELL_FENCES):
        if rx.is_template(rx.fence_title(opening)):
            lines += [rx.strip_comment(line) for line in block]
    return lines


def resolve(words: list[str]) -> tuple[str, ...]:
    path = ("netbench",)
    for word in words[1:]:
        if (*path, word) not in COMMANDS:
            break
        path = (*path, word)
    return path


def test_every_flag_a_page_shows_with_a_command_is_that_commands():
    wrong = []
    for page in PAGES:
        for line in command_lines(page.read_text()):
            for part in line.split("&&"):
                words = part.replace("[", " ").replace("]", " ").split()
                words = words[:words.index("--")] if "--" in words else words
                words = words[1:] if words[:1] == ["sudo"] else words
                if words[:1] != ["netbench"]:
                    continue
                path = resolve(words)
                known = flags_of(COMMANDS[path])
                wrong += [f"{name(page)}: {' '.join(path)} {word}" for word in words
                          if word.startswith("-") and word.split("=")[0] not in known]
    assert not wrong, f"flags no such command has: {wrong}"


def test_every_flag_a_page_names_is_netbenchs_or_a_named_programs():
    unknown = []
    for page in PAGES:
        for span in code_spans(page.read_text()):
            first = (span.split() or [""])[0]
            if not first.startswith("-") and first not in ("netbench", "sudo"):
                continue  # another program's command line: its flags are its own
            unknown += [f"{name(page)}: {flag}" for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span)
                        if flag not in ALL_FLAGS and flag not in FOREIGN]
    assert not unknown, f"flags netbench does not have (tests/unit/test_docs_claims.py FOREIGN lists others'): {unknown}"


# ---------------------------------------------------------------- defaults

QUOTED_DEFAULT = re.compile(r"`(--[a-z][\w-]*)(?: [A-Z]+)?`[^`().;]{0,30}?\((?:default:? )?([^()`]{1,16}?)"
                            r"(?: by default)?\)")


def default_of(flag: str) -> list:
    """The defaults of `flag` on every command that has it, each converted by its type."""
    found = []
    for command in COMMANDS.values():
        for param in command.params:  # not get_params: it would cache a help option made for a bare context
            if isinstance(param, click.Option) and flag in param.opts \
                    and isinstance(param.default, (int, float, str)):  # none: click's sentinel
                found.append((param, param.default))
    return found


def converted(param: click.Option, text: str):
    try:
        value = param.type.convert(text.replace(" ", ""), param, None)
    except (click.BadParameter, ValueError, TypeError):
        return None
    return value


def test_every_default_a_page_quotes_is_the_flags_default():
    """ "`--settle` (1.5s)", "`--max-seconds` (60 s by default)": the value in parentheses after a
    flag, where it reads as that flag's type, is the flag's default on a command that has it."""
    wrong, checked = [], 0
    for page in PAGES:
        for flag, value in QUOTED_DEFAULT.findall(page.read_text()):
            candidates = default_of(flag)
            readings = [(converted(param, value), converted(param, str(default))) for param, default in candidates]
            readings = [(read, default) for read, default in readings if read is not None]
            if not readings:
                continue  # not a value of the flag's type: words in parentheses
            checked += 1
            if not any(read == default or (isinstance(read, float) and read == pytest.approx(default))
                       for read, default in readings):
                wrong.append(f"{name(page)}: {flag} ({value}); the code's default: "
                             f"{sorted({str(default) for _, default in readings})}")
    assert checked >= 10
    assert not wrong, wrong


# ---------------------------------------------------------------- variables

def code_variables() -> set[str]:
    """Every NETBENCH_ variable the code reads or gives (a quoted name in netbench/)."""
    found = set()
    for path in (ROOT / "netbench").rglob("*.py"):
        found |= set(re.findall(r"[\"'](NETBENCH_[A-Z_]+)[\"']", path.read_text()))
    return found


def test_every_variable_a_page_names_exists():
    known = code_variables() | {"NETBENCH_REQUIRE_NETEM"}  # the kernel tier's switch (Makefile's test-kernel)
    unknown = [f"{name(page)}: {variable}" for page in PAGES
               for variable in re.findall(r"\bNETBENCH_[A-Z_]*[A-Z]\b", page.read_text()) if variable not in known]
    assert not unknown, unknown


def test_every_variable_netbench_reads_or_gives_is_in_the_environment_reference():
    text = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert not sorted(variable for variable in code_variables() if f"`{variable}`" not in text)


# ---------------------------------------------------------------- columns and keys

# "results.csv's `x`", "results.csv gets `a`, `b` and `c`", "`results.csv` gains `d`": the names after the verb
COLUMN_PHRASES = re.compile(r"results\.csv`?(?:'s)?(?: (?:gets|has|adds|gains|keeps|columns?:?|says))? "
                            r"((?:`\w+`(?: \([^)]*\))?(?:, and |, | and | or )?)+)")
PER_NODE = re.compile(r"(cpus|step_delay_s)_\w+")


def test_every_results_column_a_page_names_is_written():
    unknown = []
    for page in PAGES:
        text = outside_fences(page.read_text())
        for names in COLUMN_PHRASES.findall(" ".join(text.split())):
            unknown += [f"{name(page)}: {column}" for column in re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", names))
                        if column not in CSV_COLUMNS and not PER_NODE.fullmatch(column)]
    assert not unknown, unknown


SETTINGS = {*SETTING_KEYS, "cpus", "step_delay"}
FORMATS = {
    "playbook": ({*playbook.TOP_KEYS, *playbook_keys.TOP_RENAMED}, {"factors", "fixed", "extra_runs"}),
    "schedule": ({*schedule.SCHEDULE_KEYS}, {"steps"}),
    "topology": ({*pairs_file.TOPOLOGY_KEYS}, {"groups", "links", "matrix"}),
    "inventory": ({*inventory.TOP_KEYS}, {"hosts"}),
}
PROFILE_KEYS = {*profile.PROFILE_KEYS}


def kind_of(data: dict) -> str:
    for kind, (_, marks) in FORMATS.items():
        if set(data) & marks:
            return kind
    if set(data) & {*algorithm_keys.TOP_KEYS, *command_job.PLAYBOOK_KEYS, "train_steps"}:
        return "playbook"
    return "profile"


def key_problems(data: dict) -> list[str]:
    kind = kind_of(data)
    top = FORMATS[kind][0] if kind in FORMATS else PROFILE_KEYS
    problems = [f"{kind} key {key!r}" for key in data if key not in top]
    if kind == "playbook":
        for part in ("factors", "fixed"):
            problems += [f"setting {key!r}" for key in (data.get(part) or {}) if key not in SETTINGS]
        for run in data.get("extra_runs") or []:
            problems += [f"setting {key!r}" for key in run if key not in SETTINGS]
        problems += [f"algorithm key {key!r}" for key in (data.get("algorithm") or {})
                     if key not in SETTING_KEYS]
    if kind == "schedule":
        for step in data.get("steps") or []:
            problems += [f"step key {key!r}" for key in step
                         if key not in {*PROFILE_KEYS, *schedule.TRIGGER_KEYS, "node", "cpus", "step_delay"}]
    if kind == "inventory":
        for host in (data.get("hosts") or {}).values():
            problems += [f"host key {key!r}" for key in host if key not in inventory.HOST_KEYS]
    return problems


def test_every_key_a_yaml_block_shows_is_a_key_of_its_file_format():
    wrong = []
    for page in PAGES:
        for line, _, block in fenced(page.read_text(), ("yaml",)):
            data = yaml.safe_load("\n".join(block))
            if isinstance(data, dict) and "apiVersion" not in data:  # a Kubernetes manifest is not netbench's
                wrong += [f"{name(page)}:{line}: {problem}" for problem in key_problems(data)]
    assert not wrong, wrong


def test_the_playbooks_example_names_every_setting_key():
    """playbooks.md's example lists the setting keys beside its factor ("# also: ..."): all of them."""
    text = (ROOT / "docs" / "guide" / "playbooks.md").read_text()
    block = next(b for _, _, b in fenced(text, ("yaml",)) if any("also:" in line for line in b))
    named = set(re.findall(r"[a-z_]+", " ".join(line.split("also:", 1)[-1] for line in block if "#" in line
                                                  and ("also:" in line or line.lstrip().startswith("#")))))
    shown = set((yaml.safe_load("\n".join(block)).get("factors") or {}))
    assert SETTINGS - named - shown == set()


# ---------------------------------------------------------------- shell blocks

PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]+$")  # DIR, FILE, RESULTS_DIR: a word to fill in
FILE_ARGUMENT = re.compile(r"^[\w./-]+\.(?:ya?ml|py|sh|csv|json|npz)$")


def written_by(command: str) -> set[str]:
    """The files a command line writes (--save-playbook FILE, show --output FILE, a redirection)."""
    words = command.replace("&&", " ").split()
    return {words[i + 1] for i, word in enumerate(words[:-1]) if word in ("--save-playbook", "--output", ">")}


def test_shell_blocks_hold_no_placeholders_unless_titled_as_templates():
    """A command to run names real things: no WORD to fill in, no [optional] part, no file that
    neither ships nor is written by an earlier command of its page. A pattern is a template."""
    wrong = []
    for page in [*PAGES]:
        written: set[str] = set()
        for example in rx.readme_examples(page.read_text(), name(page)):
            command = example.command
            written |= written_by(command)
            unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", command)  # a pattern's brackets are its own
            words = [word.strip("'\"") for word in unquoted.split()]
            after = words[:words.index("--")] if "--" in words and words[0] != "netbench" else words
            wrong += [f"{example.source}: {word}" for word in after
                      if PLACEHOLDER.match(word.split("=")[-1]) and "=" not in word]
            wrong += [f"{example.source}: [{part}]" for part in re.findall(r"\[([^\]]*)\]", unquoted)]
            wrong += [f"{example.source}: {word} does not exist" for word in words
                      if FILE_ARGUMENT.match(word) and word not in written and not (ROOT / word).exists()]
    assert not wrong, wrong


WIDTH = 78  # characters of a code block a page shows whole at 1,280 px (material's theme; the copy button)
WRAPPED = ("text", "console")  # what a command prints wraps at the page's edge (docs/stylesheets/extra.css)


def test_command_lines_fit_the_page():
    """Every line of a code block (commands, YAML, code) fits the code box of a page in a browser
    1,280 px wide, and so does every line of the tutorial's output blocks: none scrolls
    sideways. Output elsewhere wraps instead (measured in chromium: 80 characters show whole,
    the copy button covers the last two of the first line)."""
    wide = []
    for page in PAGES:
        if page == ROOT / "README.md":
            continue
        text = page.read_text()
        for line, opening, block in fenced(text, tuple({m.group(1) for m in map(rx.FENCE.match, text.splitlines())
                                                          if m})):
            language = rx.FENCE.match(opening).group(1)
            if language in WRAPPED and page != TUTORIAL:
                continue
            wide += [f"{name(page)}:{line + i + 1}: {len(row)} characters" for i, row in enumerate(block)
                     if len(row) > WIDTH]
    assert not wide, wide


# ---------------------------------------------------------------- the pages that teach

def paragraphs(text: str) -> list[tuple[int, int]]:
    """(first line, words) of each paragraph or list item outside fences, tables and headings."""
    found, words, start = [], 0, 0
    for number, line in enumerate(outside_fences(text).splitlines() + [""], start=1):
        stripped = line.strip()
        item = stripped.startswith(("- ", "* ")) or re.match(r"\d+\. ", stripped)
        if not stripped or stripped.startswith(("#", "|", "!!!", "![")) or item:
            if words:
                found.append((start, words))
            words, start = 0, number
            if not item:
                continue
        words += len(stripped.split())
    return found


MAX_WORDS = 150


@pytest.mark.parametrize("page", TAUGHT, ids=name)
def test_no_paragraph_of_the_tutorial_or_a_guide_runs_over_150_words(page):
    long = [(line, words) for line, words in paragraphs(page.read_text()) if words > MAX_WORDS]
    assert not long, f"{name(page)}: paragraphs (line, words) over {MAX_WORDS} words: {long}"


MODULE = re.compile(r"(?<![/\w])netbench/[\w/.]+|\b(?:model|jobs|experiment|emulation|report|metrics|cli|state|testbed|remote)"
                    r"/\w+\.py\b|\bstats\.[a-z_]+\(?|\btests/\w")
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
SINGLE_RUN = re.compile(r"measured here|one run\b|2-core|this project's|shared machine|side by side", re.I)


@pytest.mark.parametrize("page", TAUGHT, ids=name)
def test_the_tutorial_and_guides_leave_modules_commits_and_single_runs_to_background(page):
    text = outside_fences(page.read_text())
    found = [f"module {m}" for m in MODULE.findall(text)] + [f"commit {m}" for m in COMMIT.findall(text)]
    if page != TUTORIAL:  # the tutorial shows one real run's output, and says so
        found += [f"a single run: {m!r}" for m in SINGLE_RUN.findall(text)]
    assert not found, f"{name(page)}: {found} (background/ and validation.md hold these)"


POINTERS = re.compile(r"\b(?:see|below|above|in)\b,? ['\"‘“]([A-Z][^'\"’”]{2,40})['\"’”]")


def test_a_page_points_at_a_section_with_a_link():
    """"(see 'Reports')" names a section that may not exist; a Markdown link is checked by the
    site's strict build (anchors included)."""
    found = [f"{name(page)}: {m}" for page in PAGES for m in POINTERS.findall(outside_fences(page.read_text()))]
    assert not found, found


# ---------------------------------------------------------------- concepts

TERMS = ("factor", "level", "design point", "network point", "job configuration", "backend", "state folder",
         "chief")


def test_concepts_defines_each_word_before_it_uses_it():
    """Each term is defined in concepts.md (a bold "**Term.**" or "**Term**" lead), and nowhere
    on the page is it used before that definition; concepts links the vocabulary reference."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    body = outside_fences(text)
    early = []
    for term in TERMS:
        lead = re.search(rf"\*\*[^*]*\b{re.escape(term)}s?\b[^*]*\*\*", body, re.I)
        assert lead, f"concepts.md does not define {term!r}"
        first = re.search(rf"(?<![\w-]){re.escape(term)}s?(?![\w-])", body, re.I)
        if first.start() < lead.start():
            early.append(f"{term!r} used at line {body[:first.start()].count(chr(10)) + 1} before its definition")
    assert not early, early
    assert "reference/vocabulary.md" in text


# ---------------------------------------------------------------- what pages say of values and runs

def test_byte_rate_spellings_are_only_ever_said_to_be_refused():
    """`kbps`, `mbps`: tc reads them as bytes per second, most people as bits; netbench refuses
    them (units.py), so a page may name them only to say so."""
    wrong = [f"{name(page)}: {' '.join(part.split())[:160]}" for page in PAGES
             for part in re.split(r"\n\s*\n", page.read_text())  # paragraphs and blocks, comments included
             if re.search(r"(?<![\w-])[kmg]bps\b", part, re.I) and not re.search(r"refus", part, re.I)]
    assert not wrong, wrong


def test_the_readmes_demo_table_is_the_run_the_figures_are_drawn_from():
    """README.md's table, the tutorial's output and the pictures come from one real run
    (docs/data/demo.tar.xz): the README shows its numbers, not another run's."""
    import csv
    import io
    import tarfile

    with tarfile.open(ROOT / "docs" / "data" / "demo.tar.xz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/results.csv"))
        rows = {row["run_id"]: row for row in csv.DictReader(io.TextIOWrapper(tar.extractfile(member)))}
    shown = rx.shown_output((ROOT / "README.md").read_text(), "prints a table such as:")
    cells = [rx.table_cells(line) for line in shown if line.startswith("│")]
    assert sorted(row[0] for row in cells) == sorted(rows)
    for cell in cells:
        run = rows[cell[0]]
        assert cell[6] == f"{float(run['images_per_sec']):,.1f}", cell
        assert cell[8] == f"{float(run['step_time_mean_s']) * 1000:.1f} ms", cell
    tutorial = TUTORIAL.read_text()
    assert all(f"{float(run['images_per_sec']):,.1f}" in tutorial for run in rows.values())


def report_headings() -> set[str]:
    found = set()
    for path in (ROOT / "netbench" / "report").glob("*.py"):
        found |= set(re.findall(r'Heading\(f?"([^"{]+)', path.read_text()))
    return found


def test_every_report_section_a_page_names_exists():
    """'the section "Who waits for whom"', '("Measured and predicted steps")': report.md's
    headings, as netbench/report writes them."""
    named = [(page, m) for page in PAGES for m in re.findall(r'(?:section|tables them \() "([^"]+)"',
                                                              " ".join(page.read_text().split()))]
    headings = report_headings()
    assert named and headings
    assert not [f"{name(page)}: {m}" for page, m in named if m not in headings]
