"""Inventories: the remote hosts netbench drives over SSH, loaded from YAML and validated (pure).

An inventory names hosts. Each host has an SSH target (an address or an ~/.ssh/config
alias), the data-plane interface netbench shapes, the address TensorFlow uses, and the
roles it may take. `defaults` fills keys a host leaves out. User, port and key are
optional: what a host leaves out comes from ~/.ssh/config (fabric reads it) and then
from SSH's own defaults, so an alias alone is a complete host.

Every error names the file and the key, e.g. "inv.yaml: hosts.gpu1.port: must be ...".
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from netbench.errors import UsageError, shown, shown_key
from netbench.yamlfile import read_yaml

ROLES = ("chief", "worker", "ps")
DEFAULT_VENV = "/opt/netbench/venv"
DEFAULT_STATE_DIR = "/run/netbench"
HOST_KEYS = ("ssh", "user", "port", "key", "agent", "sudo", "interface", "tf_address", "roles",
             "venv", "state_dir")
TOP_KEYS = ("hosts", "defaults", "known_hosts", "ssh_config")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # fullmatch: "$" would let "a\n" through
_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")  # fullmatch
HINT = "see the example inventory in playbooks/inventory/example.yaml"


class InventoryError(UsageError):
    """An inventory file that cannot be loaded or fails validation."""


@dataclass(frozen=True)
class Host:
    """One remote host. `ssh` is an address or an ssh-config alias; None fields defer to
    ~/.ssh/config and SSH's defaults. `interface` is the data-plane interface to shape."""

    name: str
    ssh: str
    interface: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    agent: bool = True
    sudo: bool = False
    tf_address: str | None = None
    roles: tuple[str, ...] = ("worker",)
    venv: str = DEFAULT_VENV
    state_dir: str = DEFAULT_STATE_DIR
    defaulted: tuple[str, ...] = ()  # keys filled from `defaults`: ~/.ssh/config beats these for user/port/key

    @property
    def netbench(self) -> str:
        """The netbench command on the host (inside the venv `netbench provision` makes)."""
        return f"{self.venv}/bin/netbench"

    @property
    def lease_path(self) -> str:
        return f"{self.state_dir}/lease.json"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ssh": self.ssh, "user": self.user, "port": self.port, "key": self.key,
                "agent": self.agent, "sudo": self.sudo, "interface": self.interface,
                "tf_address": self.tf_address, "roles": list(self.roles), "venv": self.venv,
                "state_dir": self.state_dir}


@dataclass(frozen=True)
class Inventory:
    path: str
    hosts: tuple[Host, ...]
    known_hosts: tuple[str, ...] = ()  # empty: ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts
    ssh_config: str | None = None  # None: ~/.ssh/config and /etc/ssh/ssh_config

    def host(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)


def _fail(source: str, key: str, message: str, hint: str = HINT) -> InventoryError:
    return InventoryError(f"{source}: {key}: {message}", hint=hint)


def _string(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(source, key, f"must be a non-empty string, got {shown(value)}")
    return value.strip()


def _path(source: str, key: str, value: Any, base: Path) -> str:
    text = str(Path(_string(source, key, value)).expanduser())
    return text if text.startswith("/") else str((base / text).resolve())


def _bool(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(source, key, f"must be true or false, got {shown(value)}")
    return value


def _host_fields(source: str, prefix: str, data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Validate one mapping of host keys (a host, or `defaults`); returns Host keyword args."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{prefix}.{shown_key(key)}"
        if key not in HOST_KEYS:
            raise _fail(source, where, "unknown key", hint=f"host keys are: {', '.join(HOST_KEYS)}")
        if key in ("ssh", "user"):
            text = _string(source, where, value)
            # '-oProxyCommand=...' would be read as an option by any ssh command line it reaches
            if text.startswith("-") or any(c.isspace() or not c.isprintable() for c in text):
                raise _fail(source, where, f"must not begin with '-' nor hold spaces or control characters, "
                                           f"got {shown(text)}")
            out[key] = text
        elif key == "port":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
                raise _fail(source, where, f"must be a port number 1-65535, got {shown(value)}")
            out[key] = value
        elif key == "key":
            out[key] = _path(source, where, value, base)
        elif key in ("agent", "sudo"):
            out[key] = _bool(source, where, value)
        elif key == "interface":
            name = _string(source, where, value)
            if not _IFNAME.fullmatch(name):
                raise _fail(source, where, f"not an interface name: {shown(name)} (at most 15 characters)")
            out[key] = name
        elif key == "tf_address":
            try:
                address = ipaddress.ip_address(_string(source, where, value))
            except ValueError:
                raise _fail(source, where, f"must be an IP address, got {shown(value)}") from None
            if address.version != 4:  # TF_CONFIG is written host:port and peer filters match IPv4 /32s
                raise _fail(source, where, f"IPv6 is not supported, got {address}",
                            hint="give the host's IPv4 address on the data-plane interface")
            out[key] = str(address)
        elif key == "roles":
            roles = [value] if isinstance(value, str) else value
            if not isinstance(roles, list) or not roles or any(r not in ROLES for r in roles):
                raise _fail(source, where, f"must be a list of {', '.join(ROLES)}, got {shown(value)}")
            out[key] = tuple(dict.fromkeys(roles))
        elif key in ("venv", "state_dir"):
            text = _string(source, where, value)
            if not text.startswith("/"):
                raise _fail(source, where, f"must be an absolute path on the host, got {shown(text)}")
            out[key] = text.rstrip("/") or "/"
    return out


def inventory_from_mapping(data: Any, source: str, base: Path | None = None) -> Inventory:
    """Validate a parsed inventory; `base` resolves relative key paths (the file's folder)."""
    base = base or Path.cwd()
    if not isinstance(data, dict):
        raise InventoryError(f"{source}: an inventory must be a mapping with a 'hosts' key", hint=HINT)
    for key in data:
        if key not in TOP_KEYS:
            raise _fail(source, shown_key(key), "unknown key", hint=f"top-level keys are: {', '.join(TOP_KEYS)}")
    defaults_raw = data.get("defaults") or {}
    if not isinstance(defaults_raw, dict):
        raise _fail(source, "defaults", "must be a mapping of host keys")
    if "ssh" in defaults_raw:
        raise _fail(source, "defaults.ssh", "each host needs its own ssh target")
    defaults = _host_fields(source, "defaults", defaults_raw, base)
    hosts_raw = data.get("hosts")
    if not isinstance(hosts_raw, dict) or not hosts_raw:
        raise _fail(source, "hosts", "must map at least one host name to its keys")
    hosts = []
    for name, raw in hosts_raw.items():
        name = str(name)
        if not _NAME.fullmatch(name):
            raise _fail(source, f"hosts.{shown_key(name)}", "a host name is letters, digits, '.', '_' or '-'")
        if not isinstance(raw, dict):
            raise _fail(source, f"hosts.{name}", "must be a mapping of host keys (at least ssh and interface)")
        own = _host_fields(source, f"hosts.{name}", raw, base)
        fields = {**defaults, **own, "defaulted": tuple(sorted(set(defaults) - set(own)))}
        for required in ("ssh", "interface"):
            if required not in fields:
                raise _fail(source, f"hosts.{name}.{required}", "missing (required)")
        hosts.append(Host(name=name, **fields))
    known = data.get("known_hosts")
    if known is None:
        known_hosts: tuple[str, ...] = ()
    else:
        items = [known] if isinstance(known, str) else known
        if not isinstance(items, list) or not items:
            raise _fail(source, "known_hosts", "must be a path or a list of paths")
        known_hosts = tuple(_path(source, "known_hosts", item, base) for item in items)
    ssh_config = data.get("ssh_config")
    if ssh_config is not None:
        ssh_config = _path(source, "ssh_config", ssh_config, base)
    return Inventory(path=source, hosts=tuple(hosts), known_hosts=known_hosts, ssh_config=ssh_config)


def load_inventory(path: str | Path) -> Inventory:
    """Load and validate an inventory file."""
    path = Path(path)
    data = read_yaml(path, "inventory", InventoryError, HINT)
    return inventory_from_mapping(data, str(path), base=path.resolve().parent)
