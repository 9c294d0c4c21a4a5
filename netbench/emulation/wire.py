"""Change plans as JSON, so a controller can send a plan to a host's `netbench node apply`.

A change is {"type": <class name>, <field>: <value>, ...}; ShapeDevice's netem options are
a nested object, and so is each of ShapePairs' classes (its netem leaf nested in it). Decoding accepts only change classes from changes.py and only their
fields, so a host never runs something it does not know.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from netbench.emulation import changes as ch
from netbench.emulation.netlink.netem import NetemParams
from netbench.errors import UsageError

WIRE_VERSION = 1


def _change_classes() -> dict[str, type[ch.Change]]:
    found: dict[str, type[ch.Change]] = {}
    pending = list(ch.Change.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls.__module__ == ch.__name__:
            found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples the frozen dataclasses hold."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def change_to_json(change: ch.Change) -> dict[str, Any]:
    return {"type": type(change).__name__, **_plain(change)}


def change_from_json(data: Any) -> ch.Change:
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise UsageError(f"plan: a change must be an object with a 'type', got {str(data)[:80]!r}")
    classes = _change_classes()
    cls = classes.get(data["type"])
    if cls is None:
        raise UsageError(f"plan: unknown change type {data['type']!r}",
                         hint="the host's netbench differs from the controller's: run 'netbench provision'")
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(data) - names - {"type"}
    if extra:
        raise UsageError(f"plan: {data['type']}: unknown field(s) {', '.join(sorted(extra))}",
                         hint="the host's netbench differs from the controller's: run 'netbench provision'")
    kwargs = {k: _tuples(v) for k, v in data.items() if k != "type"}
    if cls is ch.ShapeDevice and isinstance(kwargs.get("netem"), dict):
        kwargs["netem"] = _nested(NetemParams, kwargs["netem"], "plan: ShapeDevice.netem")
    if cls is ch.ShapePairs and isinstance(kwargs.get("classes"), tuple):
        kwargs["classes"] = tuple(_pair_class(item, f"plan: ShapePairs.classes[{i}]")
                                  for i, item in enumerate(kwargs["classes"]))
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise UsageError(f"plan: {data['type']}: {exc}") from None


def _nested(cls: type, data: dict, where: str) -> Any:
    """A nested dataclass (NetemParams, PairClass) from its JSON object; only its own fields."""
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise UsageError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}",
                         hint="the host's netbench differs from the controller's: run 'netbench provision'")
    try:
        return cls(**{k: _tuples(v) for k, v in data.items()})
    except TypeError as exc:
        raise UsageError(f"{where}: {exc}") from None


def netem_from_json(data: Any, where: str) -> NetemParams:
    """NetemParams from its JSON object (change_to_json's, or a host's read-back of a
    per-destination tree); a one-line UsageError naming `where` otherwise."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: must be an object, got {str(data)[:80]!r}")
    return _nested(NetemParams, data, where)


def _pair_class(data: Any, where: str) -> ch.PairClass:
    """One destination of a ShapePairs: {peer, netem: {...}, rate_bps}."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: must be an object, got {str(data)[:80]!r}")
    item = dict(data)
    item["netem"] = netem_from_json(item.get("netem"), f"{where}.netem")
    return _nested(ch.PairClass, item, where)


def plan_to_json(plan: list[ch.Change]) -> str:
    return json.dumps({"version": WIRE_VERSION, "changes": [change_to_json(c) for c in plan]})


def plan_from_json(text: str) -> list[ch.Change]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"plan: not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict) or not isinstance(data.get("changes"), list):
        raise UsageError("plan: expected an object {\"version\": 1, \"changes\": [...]}")
    if data.get("version") != WIRE_VERSION:
        raise UsageError(f"plan: version {data.get('version')!r}, this netbench reads version {WIRE_VERSION}",
                         hint="run 'netbench provision' so host and controller run the same netbench")
    return [change_from_json(item) for item in data["changes"]]
