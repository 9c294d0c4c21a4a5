"""A playbook's keys as the sweep's flags name them, and the older spellings that still load (pure).

A playbook's key is its sweep flag's name with underscores: `--batch-size` is `batch_size`,
`--repeat` is `repeat`, `--step-timeout` and `--startup-timeout` are `step_timeout` and
`startup_timeout`, `--order-seed` is `order_seed`. The spellings before them (`batch`,
`repetitions`, `timeouts: {step, startup}`) load until the next release: `current` rewrites
them in place, so they give the same playbook (and the same design digest), with one note per
old key for the command to print. Both spellings of one setting in one place is an error.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from netbench.errors import UsageError

UNTIL = "the next release"
TOP_RENAMED = {"repetitions": "repeat"}  # old top-level key -> its key now
TIMEOUTS = {"startup": "startup_timeout", "step": "step_timeout"}  # timeouts: {startup, step} -> top-level keys
SETTINGS_RENAMED = {"batch": "batch_size"}  # under factors, fixed and each extra_runs entry
SETTING_PLACES = ("factors", "fixed")
OLD_KEYS = (*TOP_RENAMED, "timeouts", *SETTINGS_RENAMED)


class BadKey(ValueError):
    """An old spelling that cannot be read: `key` names where (the loader adds the file)."""

    def __init__(self, key: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message, self.hint = key, message, hint


@dataclass(frozen=True)
class Current:
    """A playbook mapping with today's keys, in the file's order."""

    data: dict[str, Any]
    notes: tuple[str, ...] = ()  # one line per old key: the file, the old key, the new one
    written: dict[str, str] = field(default_factory=dict)  # a renamed key's place now -> as the file wrote it


def note(source: str, old: str, new: str) -> str:
    return f"{source}: '{old}' is now '{new}'; the old name works until {UNTIL}"


def _both(where: str, old: str, new: str) -> BadKey:
    return BadKey(where, f"both '{old}' and '{new}' are given ('{old}' is its old name)", f"keep '{new}' only")


def current(data: Any, source: str) -> Current:
    """`data` with every old spelling rewritten to its key now (raises BadKey); anything else,
    a mapping or not, as it was (the loader checks it)."""
    if not isinstance(data, Mapping):
        return Current(data=data)
    notes: dict[str, str] = {}  # old key -> its note, once each, in the file's order
    written: dict[str, str] = {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in TOP_RENAMED:
            new = TOP_RENAMED[key]
            if new in data:
                raise _both(new, key, new)
            out[new], written[new] = value, key
            notes.setdefault(key, note(source, key, new))
        elif key == "timeouts":
            for sub, raw in _timeouts(value).items():
                new = TIMEOUTS[sub]
                if new in data:
                    raise _both(new, f"timeouts.{sub}", new)
                out[new], written[new] = raw, f"timeouts.{sub}"
                notes.setdefault(f"timeouts.{sub}", note(source, f"timeouts.{sub}", new))
        elif key in SETTING_PLACES and isinstance(value, Mapping):
            out[key] = _settings(value, key, notes, written, source)
        elif key == "extra_runs" and isinstance(value, (list, tuple)):
            out[key] = [_settings(entry, f"extra_runs[{i}]", notes, written, source) if isinstance(entry, Mapping)
                        else entry for i, entry in enumerate(value)]
        else:
            out[key] = value
    return Current(data=out, notes=tuple(notes.values()), written=written)


def load(data: Any, source: str, build: Callable[[Any], Any], fail: Callable[..., UsageError]) -> Any:
    """`build(current(data))` with its notes; an error `fail` made (its `key`, `detail`) about a
    renamed key names the key as the file wrote it."""
    try:
        now = current(data, source)
    except BadKey as exc:
        raise fail(source, exc.key, exc.message, exc.hint) from None
    try:
        book = build(now.data)
    except UsageError as exc:
        if getattr(exc, "key", None) not in now.written:
            raise
        raise fail(source, now.written[exc.key], exc.detail, exc.hint) from None
    return replace(book, notes=now.notes)


def _timeouts(value: Any) -> dict[str, Any]:
    """`timeouts: {startup: 240s, step: 60s}` (empty: none)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadKey("timeouts", "must be a mapping", "write 'startup_timeout: 240s' and 'step_timeout: 60s' instead")
    for key in value:
        if key not in TIMEOUTS:
            close = difflib.get_close_matches(str(key), TIMEOUTS, n=1)
            raise BadKey(f"timeouts.{key}", "unknown key",
                         f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(TIMEOUTS)}")
    return dict(value)


def _settings(entry: Mapping, where: str, notes: dict[str, str], written: dict[str, str],
              source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in entry.items():
        new = SETTINGS_RENAMED.get(key) if isinstance(key, str) else None
        if new is None:
            out[key] = value
            continue
        if new in entry:
            raise _both(where, key, new)
        out[new], written[f"{where}.{new}"] = value, f"{where}.{key}"
        notes.setdefault(key, note(source, key, new))
    return out
