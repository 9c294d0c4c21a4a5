"""The command examples netbench ships, found by parsing, and the rewrites that make them short.

Pure functions over text (no processes), so tests/unit can test them; tests/readme/ (the docs
tier) runs what they find. An *example* is one command line of a ```sh (or ```bash) block in
README.md or in a page of docs/ (a leading `$ ` prompt is dropped), or one line of a click
command's --help text that begins with `Example:` (or, in an indented block, with
`netbench `). Comments (` # ...`) and comment-only continuation lines are dropped. The files
are read README.md first, then docs/ in mkdocs.yml's nav order, then any page the nav does not
list (sorted), so a block may use what an earlier page's block wrote.

A shell block titled as a template (```sh title="Template: ..."`) shows a pattern to fill in
(a file of your own, a placeholder) and is no example. A ```text block titled as output
(```text title="Output"`), right after a shell block, is what that block's last command
prints: the docs tier compares its shape with what the command printed (`output_problems`).

The rewrites (`shorten`) only shorten a measurement; they never change what is measured:

- `netbench sweep` (not a dry run): the measured window becomes `--steps 3 --warmup 1`; a sweep
  with a `--seconds` window gets `--seconds 1 --warmup 1`; a sweep with `--schedule` gets
  `--seconds 3 --warmup 1`, so a schedule's change two seconds in still lands inside the run
  (spike.yaml changes at 2 s: a change from the schedule's own thread is what broke once);
  `--precision off` (the default, 3 %, grows a window until its mean step time is known, for
  up to 60 s), or, where the example names a `--precision`, that precision within
  `--max-seconds 2`; `--repeat N` becomes `--repeat 1`; `--metrics-port N` becomes `--metrics-port 0` (any free
  port: a fixed one may be taken on a shared machine). Flags are added before a user's
  command's `--`, never to the command.
- `netbench collective`: `--repeat 1 --warmup 1 --sizes 8-64KiB` (the default sizes reach 64 MiB,
  seconds per message at 100 Mbit/s).
- `netbench verify`: `--count 10` pings and `--seconds 1` of iperf3 (the defaults are 100 or
  50 per pair, and 3 s or 2 s).
- `sudo netbench ...`: `netbench ...` (the tier runs as root; sudo would drop the environment
  that selects this checkout).
- `[--flag VALUE]`, an optional part shown in brackets: kept, without the brackets (the
  fullest form is the one run), unless the caller leaves that flag out (`expand`'s `left_out`,
  each with its reason); a placeholder word (e.g. `DIR`) is replaced as the caller says.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

FENCE = re.compile(r"^```(\S*)(.*)$")  # the language, then attributes (title="...")
TITLE = re.compile(r'title="([^"]*)"')
SHELL_FENCES = ("sh", "bash", "shell")
PROMPT = "$ "
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")
COMMENT = re.compile(r"(^|\s)#.*$")
BRACKETS = re.compile(r"\[([^\[\]]*)\]")


@dataclass(frozen=True)
class Example:
    """One shipped command line: where it is shown, the block it belongs to, the command, and
    the output shown right after it (an output block: the docs tier checks its shape)."""

    source: str  # "README.md:38", "docs/guide/shaping.md:12", or "netbench sweep --help"
    block: str  # examples of one block run in order, in one testbed: "README.md:37 Quick start"
    command: str  # as shown, without its comment
    output: tuple[str, ...] = ()


def fence_title(line: str) -> str | None:
    """The title of a fence's opening line (```sh title="Template: ..."), else None."""
    fence = FENCE.match(line)
    title = TITLE.search(fence.group(2)) if fence else None
    return title.group(1) if title else None


def is_template(title: str | None) -> bool:
    return bool(title) and title.lower().startswith("template")


def is_output(title: str | None) -> bool:
    return bool(title) and title.lower().startswith("output")


def strip_comment(line: str) -> str:
    """The line without a trailing shell comment (a `#` at the start or after a space)."""
    return COMMENT.sub("", line).strip()


def readme_examples(text: str, name: str = "README.md") -> list[Example]:
    """Every command line of the ```sh and ```bash blocks in `text` (templates left out), in
    order, each with its block; a block's last command carries the output block after it."""
    found: list[Example] = []
    heading, block = "", None
    pending, first = "", 0  # a command continued by a trailing backslash, and its first line
    lines = text.splitlines()
    last_shell_end, output, output_start = None, None, 0  # an output block right after a shell block
    for number, line in enumerate(lines, start=1):
        if output is not None:
            if line.strip() == "```":
                if found and found[-1].source.startswith(f"{name}:") and last_shell_end == output_start:
                    found[-1] = Example(found[-1].source, found[-1].block, found[-1].command, tuple(output))
                output = None
            else:
                output.append(line)
            continue
        if pending:  # a continuation line: joined to its command as the shell would
            line = pending + " " + line.strip()
            number, pending = first, ""
        fence = FENCE.match(line)
        if fence:
            if block is not None:
                if block:
                    last_shell_end = number
                block = None
            elif fence.group(1) in SHELL_FENCES and not is_template(fence_title(line)):
                block = f"{name}:{number} {heading}".strip()
            elif fence.group(1) == "text" and is_output(fence_title(line)):
                output, output_start = [], _previous_fence_end(lines, number)
            else:
                block = ""  # another language's block, or a template: inside it, but not ours
            continue
        if block is None:
            title = HEADING.match(line)
            if title:
                heading = title.group(1)
            continue
        if line.lstrip().startswith(PROMPT):
            line = line.lstrip()[len(PROMPT):]
        if block and line.rstrip().endswith("\\"):
            pending, first = line.rstrip()[:-1].rstrip(), number
            continue
        command = strip_comment(line)
        if block and command:
            found.append(Example(f"{name}:{number}", block, command))
    return found


def _previous_fence_end(lines: list[str], number: int) -> int | None:
    """The line number of the closing fence just before line `number` (only blank lines between)."""
    at = number - 1
    while at >= 1 and not lines[at - 1].strip():
        at -= 1
    return at if at >= 1 and lines[at - 1].strip() == "```" else None


def block_title(block: str) -> str:
    """A shown block's heading ("docs/guide/shaping.md:37 Apply it" -> "Apply it"); a --help
    block ("netbench sweep") is its own title."""
    where, _, title = block.partition(" ")
    return title if re.fullmatch(r"\S+\.md:\d+", where) else block


def nav_pages(nav) -> list[str]:
    """The page paths of an mkdocs nav (a list of {title: path or nested list}), in order."""
    found: list[str] = []
    for entry in nav or []:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            if isinstance(value, str) and value.endswith(".md"):
                found.append(value)
            elif isinstance(value, list):
                found += nav_pages(value)
    return found


def doc_files(root) -> list:
    """README.md, then every page of docs/: the nav's order first, then the others, sorted."""
    import yaml

    docs = root / "docs"
    config = yaml.safe_load((root / "mkdocs.yml").read_text()) if (root / "mkdocs.yml").is_file() else {}
    ordered = [docs / page for page in nav_pages((config or {}).get("nav")) if (docs / page).is_file()]
    rest = sorted(path for path in docs.rglob("*.md") if path not in ordered)
    return [root / "README.md", *ordered, *rest]


def docs_examples(root) -> list[Example]:
    """Every shell example of README.md and docs/ (doc_files' order), each named by its path."""
    return [example for path in doc_files(root)
            for example in readme_examples(path.read_text(encoding="utf-8"), str(path.relative_to(root)))]


def help_examples(path: str, help_text: str) -> list[Example]:
    """The example lines of one command's --help text (`path`: "netbench sweep")."""
    found = []
    for line in (help_text or "").splitlines():
        text = line.strip()
        if text.startswith("Example:"):
            text = text[len("Example:"):].strip()
        elif not (line.startswith((" ", "\t")) and text.startswith(("netbench ", "sudo netbench "))):
            continue
        command = strip_comment(text)
        if command:
            found.append(Example(f"{path} --help", path, command))
    return found


def walk_help(command, path: str = "netbench") -> Iterator[Example]:
    """The examples of a click command and of every subcommand, in --help's order."""
    import click

    yield from help_examples(path, command.help or "")
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name=path.split()[-1])
        for name in command.list_commands(ctx):
            yield from walk_help(command.get_command(ctx, name), f"{path} {name}")


def expand(command: str, placeholders: Mapping[str, str], left_out: Iterable[str] = ()) -> str:
    """Optional `[...]` parts kept without brackets, except those whose first word is in
    `left_out` (dropped); placeholder words replaced. Quoted text is left as written (a
    `--step-regex` pattern's `[\\d.]` is no optional part)."""
    left_out = set(left_out)

    def part(match: re.Match) -> str:
        inner = match.group(1)
        return "" if inner.split()[:1] and inner.split()[0] in left_out else inner

    pieces = re.split(r"('[^']*'|\"[^\"]*\")", command)
    for index in range(0, len(pieces), 2):  # the unquoted pieces
        while BRACKETS.search(pieces[index]):
            pieces[index] = BRACKETS.sub(part, pieces[index])
        words = re.split(r"(\s+)", pieces[index])
        pieces[index] = re.sub(r"\s+", " ", "".join(placeholders.get(word, word) for word in words))
    return "".join(pieces).strip()


def _drop(words: list[str], flag: str) -> list[str]:
    """`words` without `flag` and its value (`--flag VALUE` or `--flag=VALUE`)."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word == flag:
            skip = True
        elif not word.startswith(flag + "="):
            out.append(word)
    return out


def _set(words: list[str], flag: str, value: str) -> list[str]:
    """`words` with `flag` and its value moved to the end, holding `value`."""
    return [*_drop(words, flag), flag, value]


def _has(words: list[str], flag: str) -> bool:
    return flag in words or any(word.startswith(flag + "=") for word in words)


def _shorten_one(words: list[str]) -> list[str]:
    if "--" in words:  # a user's command follows: netbench's flags go before it, the command is left as written
        at = words.index("--")
        return _shorten_one(words[:at]) + words[at:]
    if words[:2] == ["sudo", "netbench"]:
        words = words[1:]
    if words[:1] != ["netbench"] or "--dry-run" in words:
        return words
    if words[1:2] == ["sweep"]:
        had_seconds, schedule = _has(words, "--seconds"), _has(words, "--schedule")
        for flag in ("--steps", "--seconds", "--warmup"):
            words = _drop(words, flag)
        if schedule:
            words += ["--seconds", "3"]
        elif had_seconds:
            words += ["--seconds", "1"]
        else:
            words += ["--steps", "3"]
        words += ["--warmup", "1"]
        if _has(words, "--precision"):
            words = _set(words, "--max-seconds", "2")
        else:
            words += ["--precision", "off"]
        if "--repeat" in words:
            words = _set(words, "--repeat", "1")
        if "--metrics-port" in words:
            words = _set(words, "--metrics-port", "0")
    elif words[1:2] == ["collective"]:  # one repetition after one warm-up, messages up to 64 KiB
        words = _set(_set(_set(words, "--repeat", "1"), "--warmup", "1"), "--sizes", "8-64KiB")
    elif words[1:2] == ["verify"]:
        words = _set(_set(words, "--count", "10"), "--seconds", "1")
    return words


def shorten(command: str) -> str:
    """The command with every measurement in it cut short (see the module's docstring);
    each `&&`-joined part is rewritten on its own."""
    parts = []
    for part in (part.strip() for part in command.split("&&")):
        words = shlex.split(part)
        shorter = _shorten_one(words)
        parts.append(part if shorter == words else shlex.join(shorter))
    return " && ".join(parts)


def dry_run(command: str) -> str:
    """The command as a dry run: plans, prints, changes nothing."""
    words = command.split()
    if "--dry-run" in words:
        return command
    if "--" in words:  # before a user's command, which gets its arguments as written
        head, _, tail = command.partition(" -- ")
        return f"{head} --dry-run -- {tail}"
    return f"{command} --dry-run"


def is_training(command: str) -> bool:
    """A sweep or playbook run that would start training processes (not a dry run)."""
    words = shlex.split(command)
    return words[:1] == ["netbench"] and words[1:2] in (["sweep"], ["run"]) and "--dry-run" not in words


def shown_output(text: str, after: str) -> list[str]:
    """The lines of the first plain ``` block (no language) after the line containing `after`:
    output the README shows."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    opening = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == "```")
    return lines[opening + 1:closing]


def table_cells(line: str) -> list[str]:
    """The cells of one row of a table: printed by rich (split at its rules) or shown in the
    README (split at runs of two or more spaces); a shown `...` ends the row."""
    if any(rule in line for rule in "┃│|"):
        cells = re.split(r"[┃│|]", line)
    else:
        cells = re.split(r"\s{2,}", line)
    cells = [cell.strip() for cell in cells if cell.strip()]
    return cells[:cells.index("...")] if "..." in cells else cells


def table_problems(shown: list[str], output: str, leading: int | None = None) -> list[str]:
    """How a printed table differs from the one shown: its header must be the shown header,
    and each shown row must begin a printed row with the same cells (its first `leading` cells,
    where the rest are a real run's figures, which another run does not repeat). A shown
    table's rule lines (rich's box drawing) are not rows."""
    shown = [line for line in shown if re.search(r"\w", line)]
    printed = [table_cells(line) for line in output.splitlines() if table_cells(line)]
    header = table_cells(shown[0])
    problems = []
    if header not in printed:
        found = next((row for row in printed if row[:1] == header[:1] and header[-1] in row), None)
        problems.append(f"the table's columns are {found}, the README shows {header}")
    for line in shown[1:]:
        cells = table_cells(line)[:leading]
        if not any(row[:len(cells)] == cells for row in printed):
            problems.append(f"no printed row begins {cells}")
    return problems


def blocks(examples: Iterable[Example]) -> dict[str, list[Example]]:
    """Examples grouped by block, blocks and examples in the order shown."""
    grouped: dict[str, list[Example]] = {}
    for example in examples:
        grouped.setdefault(example.block, []).append(example)
    return grouped


# ---------------------------------------------------------------- output shown after a command

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
RULE = re.compile(r"^[\s┏┓┗┛┡┩└┘┳┻╇┴┬━─═│┃╍]*$")  # a table's rule line: drawn, not read
ELIDED = "..."


def normalized(line: str) -> str:
    """A line's shape: every number one token, runs of spaces one space."""
    return " ".join(NUMBER.sub("N", line).split())


def _row_matches(shown: list[str], printed: list[str]) -> bool:
    """A shown table row (its cells, `...` for the rest) begins a printed row, numbers aside."""
    cells = shown[:shown.index(ELIDED)] if ELIDED in shown else shown
    return len(printed) >= len(cells) and all(normalized(a) == normalized(b) for a, b in zip(cells, printed))


def _line_matches(shown: str, printed: str) -> bool:
    """A shown line (`...` for any text) begins a printed line, numbers aside."""
    parts = [re.escape(normalized(part)) for part in shown.split(ELIDED)]
    return re.match(r".*?".join(parts), normalized(printed)) is not None


def output_problems(shown: Iterable[str], output: str) -> list[str]:
    """How a command's output differs in shape from the output a page shows after it: each
    shown line, in order, must begin a printed line (numbers may differ; `...` stands for any
    text, a line of only `...` for any lines); a shown table row (cells between │ or ┃) must
    begin a printed row, cell by cell; a table's rule lines are drawing, not compared."""
    printed = [line for line in output.splitlines() if line.strip()]
    at, problems = 0, []
    for line in shown:
        if not line.strip() or line.strip() == ELIDED or RULE.match(line):
            continue
        is_row = any(bar in line for bar in "│┃")
        cells = table_cells(line) if is_row else None
        for index in range(at, len(printed)):
            if (_row_matches(cells, table_cells(printed[index])) if is_row else _line_matches(line, printed[index])):
                at = index + 1
                break
        else:
            problems.append(f"no printed line (after the last one matched) has the shape of: {line.strip()}")
    return problems
