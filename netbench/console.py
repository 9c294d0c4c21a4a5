"""The one place that writes to the terminal (rich)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

# piped output (make, CI logs) would default to 80 columns and squash the result tables
_WIDTH = None if sys.stdout.isatty() else 160
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def error(message: str, hint: str | None = None) -> None:
    """One line naming what is wrong; the hint on a second line when there is one."""
    err.print(f"[bold red]error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")


def warning(message: str) -> None:
    """Something the user should know that did not stop the command (stderr)."""
    err.print(f"[bold yellow]warning:[/] {escape(message)}")


def note(message: str) -> None:
    """Something that works but will change, e.g. an old key's spelling (stderr)."""
    err.print(f"[yellow]note:[/] {escape(message)}")


def info(message: str) -> None:
    out.print(message)


def plain(text: str) -> None:
    """Unstyled output for machine-readable text (JSON)."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
