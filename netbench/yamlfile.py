"""Read one YAML file for a loader, with errors that name the file (and line).

Every YAML file netbench reads (profiles, playbooks, inventories) comes through
`read_yaml`, which only takes what a hand-written file needs: a regular file of at most
1 MiB, nested at most 32 levels, without anchors and aliases (`&a` / `*a`, which let a
few lines expand into billions of values), and without a key written twice in one mapping.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from netbench.errors import UsageError, shown

MAX_BYTES = 1 << 20  # 1 MiB: a hand-written design is a few kB
MAX_DEPTH = 32  # levels of nesting (mappings and lists)
MAX_INT_DIGITS = 64  # Python refuses int() of over 4300 digits with a bare ValueError


class _Refused(yaml.MarkedYAMLError):
    """YAML that parses but that netbench does not take; carries its own hint."""

    def __init__(self, problem: str, mark, hint: str) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.hint = hint


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader without aliases, deep nesting, repeated keys or giant integers."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise _Refused("anchors and aliases (*name) are not supported", self.peek_event().start_mark,
                           "write the value out where it is used")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark,
                               "netbench files are a few levels of mappings and lists")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first
                except TypeError:
                    continue  # an unhashable key: SafeLoader says so below
                if seen:
                    raise _Refused(f"key {shown(key)} appears twice (first at line {first[key]})",
                                   key_node.start_mark, "keep one of them")
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise _Refused(f"a number of {digits} digits is too long", node.start_mark, "write a usable number")
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _read_bytes(path: Path, what: str, error: type[UsageError], missing_hint: str | None) -> bytes:
    """At most MAX_BYTES of a regular file; FIFOs and devices are refused before any read
    (O_NONBLOCK: opening a FIFO without a writer must not wait)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file", hint=missing_hint) from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise error(f"{path}: {kind}: a {what} must be a regular file", hint=f"give the path of a {what} file")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(MAX_BYTES + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read: {exc}") from None
    if len(data) > MAX_BYTES:
        raise error(f"{path}: over the 1 MiB limit for a {what} file", hint="a hand-written file is a few kB")
    return data


def read_yaml(path: Path, what: str, error: type[UsageError], missing_hint: str | None = None) -> Any:
    """The parsed document of `path`; `error` (one line naming the file) if it is missing,
    unreadable, not a regular file, over 1 MiB, or not YAML netbench takes (see the module
    docstring). `what` names the kind of file in the message ("profile")."""
    data = _read_bytes(Path(path), what, error, missing_hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: cannot read: {exc}") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader, restricted further
    except _Refused as exc:
        raise error(f"{path}: line {exc.problem_mark.line + 1}: {exc.problem}", hint=exc.hint) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise error(f"{path}: broken YAML{where}: {problem}", hint="check indentation and 'key: value' syntax") from None
    except RecursionError:  # a backstop: MAX_DEPTH stops nesting long before the stack is deep
        raise error(f"{path}: nested too deeply", hint="netbench files are a few levels of mappings and lists") \
            from None


def dump_yaml(data: Any) -> str:
    """`data` (plain mappings, lists, strings and numbers) as block YAML, in its key order, that
    `read_yaml` reads back to the same values."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
