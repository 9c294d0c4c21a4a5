"""The readme tier's parsing and rewrites (tests/readme_examples.py) and its plan (tests/readme/plan.py)."""

from __future__ import annotations

import pytest

from netbench.cli.app import main
from tests import readme_examples as rx
from tests.conftest import ROOT
from tests.readme import plan

TEXT = """# netbench

## First steps

```sh
netbench testbed up --nodes 3          # a comment
                                       # a comment's second line
netbench exec n1 -- echo a#b

netbench reset
```

```yaml
name: wan      # not a command
```

## Later

Prose that mentions `netbench reset` is no example.

```
run   profile  (output, no language)
```

```sh
netbench show --output held.yaml && netbench apply --topology held.yaml   # a round trip
```
"""


def test_sh_blocks_give_their_command_lines_with_the_block_and_line():
    found = rx.readme_examples(TEXT)
    assert [e.command for e in found] == [
        "netbench testbed up --nodes 3", "netbench exec n1 -- echo a#b", "netbench reset",
        "netbench show --output held.yaml && netbench apply --topology held.yaml"]
    assert [e.source for e in found] == ["README.md:6", "README.md:8", "README.md:10", "README.md:26"]
    assert [e.block for e in found] == ["README.md:5 First steps"] * 3 + ["README.md:25 Later"]


def test_a_command_continued_by_backslashes_is_one_example_at_its_first_line():
    text = "## Run\n```sh\nnetbench sweep --latency 1ms \\\n  --workers 2 \\\n  --dry-run\nnetbench reset\n```\n"
    found = rx.readme_examples(text)
    assert [e.command for e in found] == ["netbench sweep --latency 1ms --workers 2 --dry-run", "netbench reset"]
    assert [e.source for e in found] == ["README.md:3", "README.md:6"]


def test_a_hash_inside_a_word_is_not_a_comment():
    assert rx.strip_comment("netbench exec n1 -- echo a#b  # note") == "netbench exec n1 -- echo a#b"
    assert rx.strip_comment("   # only a comment") == ""


def test_help_examples_are_example_lines_and_indented_command_lines():
    text = ("Apply a profile; then see netbench reset.\n\n    Example: netbench apply x.yaml --loss 1%\n"
            "\b\n    Typical use:\n      netbench reset      # remove it\n      sudo netbench doctor\n")
    found = rx.help_examples("netbench apply", text)
    assert [e.command for e in found] == ["netbench apply x.yaml --loss 1%", "netbench reset", "sudo netbench doctor"]
    assert {e.block for e in found} == {"netbench apply"} and found[0].source == "netbench apply --help"


def test_walk_help_reaches_nested_commands_of_the_real_cli():
    found = {(e.block, e.command) for e in rx.walk_help(main)}
    assert ("netbench testbed up", "netbench testbed up --nodes 3") in found
    assert ("netbench sweep", "netbench sweep --latency 1,10,100ms --repeat 2") in found
    assert ("netbench", "netbench reset") in found  # the group's own "Typical use" block


def test_expand_keeps_optional_parts_and_replaces_placeholders():
    assert rx.expand("netbench verify --all-pairs [--throughput] [--tolerance 0.5ms+2%]", {}) == \
        "netbench verify --all-pairs --throughput --tolerance 0.5ms+2%"
    assert rx.expand("netbench report DIR --output figs", {"DIR": "results/smoke"}) == \
        "netbench report results/smoke --output figs"
    assert rx.expand("netbench report DIRECTORY", {"DIR": "x"}) == "netbench report DIRECTORY"  # whole words only
    assert rx.expand("netbench verify --all-pairs [--throughput] [--json]", {}, left_out={"--throughput"}) == \
        "netbench verify --all-pairs --json"


@pytest.mark.parametrize("shown, runs", [
    ("netbench sweep --latency 1,10,100ms", "netbench sweep --latency 1,10,100ms --steps 3 --warmup 1 --precision off"),
    ("netbench sweep --latency 1ms --steps 50 --warmup 20 --repeat 3",
     "netbench sweep --latency 1ms --steps 3 --warmup 1 --precision off --repeat 1"),
    ("netbench sweep --latency 1ms --seconds 8",
     "netbench sweep --latency 1ms --seconds 1 --warmup 1 --precision off"),
    ("netbench sweep --schedule profiles/schedules/spike.yaml --seconds 8",
     "netbench sweep --schedule profiles/schedules/spike.yaml --seconds 3 --warmup 1 --precision off"),
    ("netbench sweep --schedule=a.yaml --steps=100",
     "netbench sweep --schedule=a.yaml --seconds 3 --warmup 1 --precision off"),
    ("netbench sweep --latency 1ms --precision 2% --max-seconds 60",
     "netbench sweep --latency 1ms --precision 2% --steps 3 --warmup 1 --max-seconds 2"),
    ("netbench sweep --latency 1ms --metrics-port 9464 --metrics-address 0.0.0.0",
     "netbench sweep --latency 1ms --metrics-address 0.0.0.0 --steps 3 --warmup 1 --precision off --metrics-port 0"),
    ("netbench verify --from n2 --to n3 --count 500 --seconds 10 --json",
     "netbench verify --from n2 --to n3 --json --count 10 --seconds 1"),
    ("sudo netbench doctor --no-tensorflow", "netbench doctor --no-tensorflow"),
    ("netbench apply --latency 10ms && netbench verify",
     "netbench apply --latency 10ms && netbench verify --count 10 --seconds 1"),
])
def test_shorten_cuts_every_measurement_short(shown, runs):
    assert rx.shorten(shown) == runs


@pytest.mark.parametrize("unchanged", [
    "netbench sweep --latency 1,10,100ms --repeat 3 --dry-run",  # a dry run measures nothing
    "netbench run playbooks/smoke.yaml",  # a playbook carries its own window
    "netbench exec n1 -- ping -c 3 n2",
    "netbench apply --latency 10ms --loss 1%",
    "make demo",
])
def test_shorten_leaves_what_measures_nothing_alone(unchanged):
    assert rx.shorten(unchanged) == unchanged


def test_training_commands_and_dry_runs():
    assert rx.is_training("netbench sweep --latency 1ms") and rx.is_training("netbench run playbooks/smoke.yaml")
    assert not rx.is_training("netbench sweep --latency 1ms --dry-run")
    assert not rx.is_training("netbench apply --latency 1ms")
    assert rx.dry_run("netbench sweep --latency 1ms") == "netbench sweep --latency 1ms --dry-run"
    assert rx.dry_run("netbench run p.yaml --dry-run") == "netbench run p.yaml --dry-run"


SHOWN = ["run   profile  rate   status", "r000  d1ms     1gbit  ...", "r001  d10ms    ..."]
PRINTED = """sweep x
┏━━━━━━┳━━━━━━━━━┳━━━━━━━┳━━━━━━━━┓
┃ run  ┃ profile ┃  rate ┃ status ┃
┡━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━┩
│ r000 │ d1ms    │ 1gbit │ ok     │
│ r001 │ d10ms   │ 1gbit │ ok     │
└──────┴─────────┴───────┴────────┘"""


def test_shown_output_is_the_plain_block_after_the_words():
    text = "intro\n```sh\nnetbench x\n```\nprints a table such as:\n\n```\nrun  a\nr000  b\n```\n```\nlater\n```\n"
    assert rx.shown_output(text, "prints a table") == ["run  a", "r000  b"]


def test_a_printed_table_matches_the_shown_one_by_columns_and_leading_cells():
    assert rx.table_cells(SHOWN[1]) == ["r000", "d1ms", "1gbit"]
    assert rx.table_problems(SHOWN, PRINTED) == []
    extra_column = PRINTED.replace("┃  rate ┃", "┃  rate ┃ rep ┃")
    assert "the table's columns are" in rx.table_problems(SHOWN, extra_column)[0]
    assert rx.table_problems(SHOWN, PRINTED.replace("d10ms", "d20ms")) == ["no printed row begins ['r001', 'd10ms']"]


# ---------------------------------------------------------------- the tier's plan against what ships

SHIPPED = rx.docs_examples(ROOT) + list(rx.walk_help(main))
COMMANDS = {e.command for e in SHIPPED}


@pytest.mark.parametrize("table", ["NOT_RUNNABLE", "DRY", "OUTPUT", "FILES", "STATUSES", "TABLES", "PREDICT"])
def test_every_entry_of_the_plan_names_a_shipped_example(table):
    stale = [command for command in getattr(plan, table) if command not in COMMANDS]
    assert not stale, f"plan.{table} names examples no longer shipped: {stale}"


def test_every_flag_left_out_is_an_optional_part_of_a_shipped_example():
    for flag in plan.LEFT_OUT:
        assert any(f"[{flag}" in command for command in COMMANDS), flag


def test_every_shown_table_is_found():
    for path, words, leading in plan.TABLES.values():
        shown = [line for line in rx.shown_output((ROOT / path).read_text(), words) if any(c.isalnum() for c in line)]
        assert len(shown) >= 2 and len(rx.table_cells(shown[1])) >= leading


def test_every_prelude_names_a_block():
    titles = {rx.block_title(e.block) for e in SHIPPED}
    for key in plan.PRELUDE:
        assert any(t == key or t.startswith(key + ":") for t in titles), key


def test_what_cannot_run_on_one_machine_is_listed_with_a_reason():
    """SSH inventories, make targets and the host agent cannot run here: each must be listed."""
    unlisted = [e.command for e in SHIPPED
                if ("--inventory" in e.command or e.command.startswith("make ") or " node " in e.command)
                and e.command not in plan.NOT_RUNNABLE]
    assert not unlisted
    assert all(reason.strip() for reason in [*plan.NOT_RUNNABLE.values(), *plan.DRY.values()])


def test_dry_entries_are_training_commands():
    assert all(rx.is_training(command) for command in plan.DRY)


def test_each_kind_of_training_runs_for_real_once():
    """A plain latency sweep, a --schedule sweep, a --topology sweep, a --metrics-port sweep and a
    playbook run: each kind shipped is trained for real by at least one example."""
    real = [command for command in COMMANDS if rx.is_training(command) and command not in plan.NOT_RUNNABLE
            and command not in plan.DRY]
    for flag in ("--latency", "--schedule", "--topology", "--metrics-port"):
        assert any(c.startswith("netbench sweep") and flag in c for c in real), flag
    assert any(c.startswith("netbench run ") for c in real)
    assert "netbench report results/smoke" in COMMANDS


def test_a_users_command_keeps_its_arguments_and_gets_none_of_netbenchs():
    """Flags netbench adds (short windows, --dry-run) go before `--`; the user's command and its
    arguments are left as written."""
    command = "netbench sweep --latency 1,20ms --workers 2 -- python examples/torch_ddp.py --epochs 1"
    assert rx.shorten(command) == ("netbench sweep --latency 1,20ms --workers 2 --steps 3 --warmup 1 "
                                   "--precision off -- python examples/torch_ddp.py --epochs 1")
    assert rx.dry_run(command) == ("netbench sweep --latency 1,20ms --workers 2 --dry-run "
                                   "-- python examples/torch_ddp.py --epochs 1")


# ---------------------------------------------------------------- the docs pages

def test_bash_blocks_are_examples_and_a_prompt_is_dropped():
    text = "# Page\n\n```bash\n$ netbench reset   # a prompt\nnetbench show\n```\n\n```text\n$ netbench no\n```\n"
    found = rx.readme_examples(text, "docs/page.md")
    assert [e.command for e in found] == ["netbench reset", "netbench show"]
    assert found[0].source == "docs/page.md:4" and rx.block_title(found[0].block) == "Page"


def test_block_titles_drop_the_page_and_line_and_keep_help_paths():
    assert rx.block_title("docs/guide/shaping.md:37 Apply it: now") == "Apply it: now"
    assert rx.block_title("README.md:5 Quick start") == "Quick start"
    assert rx.block_title("netbench testbed up") == "netbench testbed up"


def test_pages_are_read_readme_first_then_in_the_navs_order_then_the_rest(tmp_path):
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    for name in ("index.md", "guide/b.md", "guide/a.md", "extra.md"):
        (tmp_path / "docs" / name).write_text("# x\n")
    (tmp_path / "README.md").write_text("# r\n")
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Home: index.md\n  - Guides:\n      - B: guide/b.md\n")
    order = [str(path.relative_to(tmp_path)) for path in rx.doc_files(tmp_path)]
    assert order == ["README.md", "docs/index.md", "docs/guide/b.md", "docs/extra.md", "docs/guide/a.md"]


def test_a_real_runs_table_is_matched_by_its_points_not_its_figures():
    shown = ["┏━━━━━━┳━━━━━━━━━┳━━━━━━━┳━━━━━━━━┓", "┃ run  ┃ profile ┃  rate ┃ status ┃",
             "┡━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━┩", "│ r000 │ d1ms    │ 9gbit │ ok     │"]
    assert rx.table_problems(shown, PRINTED, leading=2) == []
    assert rx.table_problems(shown, PRINTED) == ["no printed row begins ['r000', 'd1ms', '9gbit', 'ok']"]


def test_every_page_is_in_the_nav():
    """mkdocs --strict refuses a page missing from the nav; this names it without a build."""
    import yaml

    nav = set(rx.nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    pages = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert pages - nav == set() and nav - pages == set()


def test_the_readme_is_short_and_its_links_lead_to_files():
    """README.md stays a front page (at most 200 lines; the rest is docs/), and mkdocs does not
    check its links, so this does."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets and not [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    for shown in ("make install", "make demo", "make test", "netbench doctor", "netbench report", "netbench reset"):
        assert shown in text, shown


def test_make_test_and_make_docs_bring_the_docs_extra_and_make_install_does_not():
    """The docs tier builds the site in `make test`: make test, test-fast (a unit test loads the
    site's hooks) and make docs add the docs extra, each of its pins the one constraints.txt holds;
    make install, what a user runs, brings neither the docs toolchain nor the test tools."""
    import configparser
    import re

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    docs = [line.strip() for line in config["options.extras_require"]["docs"].splitlines() if line.strip()]
    pins = {line.split("==")[0].lower().replace("_", "-"): line.strip()
            for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    assert {pin.split("==")[0] for pin in docs} >= {"mkdocs", "mkdocs-material", "mkdocs-click"}
    assert all(pins.get(pin.split("==")[0]) == pin for pin in docs), docs
    makefile = (ROOT / "Makefile").read_text()
    prerequisites = dict(re.findall(r"^([\w$().-]+):[ \t]*(.*)$", makefile, re.M))
    for target, extras in (("test", "test,docs"), ("test-fast", "test,docs"), ("docs", "docs")):
        (stamp,) = prerequisites[target].split()
        assert f"-e '.[{extras}]'" in makefile.split(f"\n{stamp}: $(STAMP)\n")[1].split("\n\n")[0], target
    assert "mkdocs build --strict" in makefile
    install = makefile[makefile.index("$(STAMP): "):makefile.index("\ttouch $(STAMP)")]
    extras = re.findall(r"extras=([\w,]+)", install)
    assert extras and all(set(found.split(",")).isdisjoint({"test", "docs"}) for found in extras), extras


# ---------------------------------------------------------------- templates and output shown

PAGE = '''# Tutorial

## Step one

```sh
netbench doctor   # what this host can do
```

```text title="Output"
┏━━━━━━━━━━━━┳━━━━━━━━┳━━━━━┓
┃ check      ┃ status ┃ ... ┃
┡━━━━━━━━━━━━╇━━━━━━━━╇━━━━━┩
│ privileges │ ok     │ ... │
...
backend: ... (...)
```

```sh title="Template: your own inventory in hosts.yaml"
netbench sweep --inventory hosts.yaml --latency 1ms
```

```text
not an output block: no title
```
'''


def test_a_template_block_is_no_example_and_an_output_block_belongs_to_the_command_before():
    found = rx.readme_examples(PAGE, "docs/t.md")
    assert [e.command for e in found] == ["netbench doctor"]
    assert found[0].output[1] == "┃ check      ┃ status ┃ ... ┃" and found[0].output[-1] == "backend: ... (...)"


def test_an_output_block_after_prose_belongs_to_no_command():
    text = "```sh\nnetbench reset\n```\n\nSome words.\n\n```text title=\"Output\"\nremoved x\n```\n"
    assert rx.readme_examples(text)[0].output == ()


PRINTED_DOCTOR = """netbench doctor
┏━━━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ check            ┃ status  ┃ needed by                       ┃
┡━━━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ privileges       │ ok      │ testbed, apply, sweep           │
│ netem            │ missing │ netem backend                   │
└──────────────────┴─────────┴─────────────────────────────────┘
backend: userspace (netem is missing: the kernel refused a netem qdisc)
r002 d100ms (repeat 0, launch 0, point 1/3): 306.3 img/s, step 418 ms / predicted 419 ms (1.34 x) !
"""


def test_shown_output_is_matched_by_shape_not_by_numbers_or_padding():
    shown = list(rx.readme_examples(PAGE, "docs/t.md")[0].output)
    assert rx.output_problems(shown, PRINTED_DOCTOR) == []
    # numbers may differ, and a printed line may go on past what is shown
    assert rx.output_problems(["r001 d10ms (repeat 1, launch 2, point 3/3): 2,316.1 img/s, step 55 ms"],
                              PRINTED_DOCTOR) == []
    # words may not
    assert rx.output_problems(["backend: netem (...)"], PRINTED_DOCTOR) != []
    assert rx.output_problems(["│ privileges │ missing │ ..."], PRINTED_DOCTOR) != []
    # and the order counts: a line shown after another must be printed after it
    assert rx.output_problems(["backend: ...", "│ privileges │ ..."], PRINTED_DOCTOR) != []
    # a column the command no longer prints is found
    assert rx.output_problems(["┃ check ┃ state ┃ ..."], PRINTED_DOCTOR) != []


def test_a_quoted_pattern_keeps_its_brackets():
    """`--step-regex '... (?P<ms>[\\d.]+) ms'`: a character class, not an optional part."""
    command = "netbench sweep --latency 1ms --step-regex 'took (?P<ms>[\\d.]+) ms' -- python x.py [--flag]"
    assert rx.expand(command, {}) == "netbench sweep --latency 1ms --step-regex 'took (?P<ms>[\\d.]+) ms' -- python x.py --flag"
