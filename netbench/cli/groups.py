"""--help in sections, and options declared per concern (click only).

Each decorator that declares a concern's options names its help section (`options`), and where
the concern's values travel together it hands the command one frozen dataclass instead of a
parameter per flag (`option_set`: a typed option set, shared by sweep, run and collective).
GroupedCommand writes one section per group in GROUPS' order, the common ones first; usage
errors are click's own, one "Error: ..." line naming the flag, as for any command.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import click

# the help sections, in the order --help shows them (the common ones first)
GROUPS = ("Network", "Nodes and compute", "Job", "Measurement and precision", "Output and metrics",
          "Your own command", "Algorithm and accuracy", "Launch and settle", "Remote hosts", "Other")
OTHER = "Other"  # where --help itself goes, and an option no concern placed


def _params(target) -> list:
    """The parameters click has collected on `target` so far: a command's, or a function's that
    click.command will read (click.option appends each new one at the end)."""
    if isinstance(target, click.Command):
        return target.params
    if not hasattr(target, "__click_params__"):
        target.__click_params__ = []
    return target.__click_params__


def options(group: str, *declarations: Callable) -> Callable:
    """One decorator for `declarations` (click.option/argument decorators, shown in this order),
    each option placed in the help section `group`."""
    if group not in GROUPS:
        raise ValueError(f"help group {group!r} is not one of {GROUPS}")

    def decorate(target):
        for declaration in reversed(declarations):
            target = declaration(target)
            param = _params(target)[-1]
            if isinstance(param, click.Option):
                param.help_group = group
        return target

    return decorate


def option_set(cls: type, name: str, group: str, *declarations: Callable,
               check: Callable | None = None) -> Callable:
    """`options(group, *declarations)`, and the command receives their values as one `cls` (a
    frozen dataclass whose fields are the parameters' names) in its parameter `name`; `check`,
    if given, sees that value first and may refuse it (a click.UsageError, as click's own)."""
    fields = tuple(field.name for field in dataclasses.fields(cls))

    def decorate(command):
        @functools.wraps(command)
        def pack(*args, **kwargs):
            value = cls(**{field: kwargs.pop(field) for field in fields})
            if check is not None:
                check(value)
            kwargs[name] = value
            return command(*args, **kwargs)

        before = len(_params(pack))
        pack = options(group, *declarations)(pack)
        declared = {param.name for param in _params(pack)[before:]}
        if declared != set(fields):  # a flag without its field, or a field without its flag
            raise TypeError(f"{cls.__name__}: fields {sorted(fields)} but flags for {sorted(declared)}")
        return pack

    return decorate


def help_group(param: click.Parameter) -> str | None:
    """The section an option was placed in (None: none; --help itself is in Other)."""
    return getattr(param, "help_group", None)


ENDS_WITH_DASHES = "netbench.ends_with_dashes"  # ctx.meta: the command line's last word was '--'


class GroupedCommand(click.Command):
    """A command whose --help lists its options in sections (GROUPS' order); an option no
    concern placed goes under Other, with --help. Whether its command line ended in '--'
    (nothing after it: click says nothing) is kept in ctx.meta[ENDS_WITH_DASHES]."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ENDS_WITH_DASHES] = bool(args) and args[-1] == "--"
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {group: [] for group in GROUPS}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections[help_group(param) or OTHER].append(record)
        shown = [(group, rows) for group, rows in sections.items() if rows]
        # one column width for every section, so the help texts line up as in one list
        width = min(max(click.formatting.term_len(term) for _, rows in shown for term, _ in rows), 30)
        for group, rows in shown:
            with formatter.section(group):
                first, text = rows[0]
                formatter.write_dl([(first.ljust(width), text), *rows[1:]], col_max=width)
