"""Remote hosts over SSH (fabric), behind a small interface: run a command, put a file.

Host keys are verified against known_hosts by default (paramiko's RejectPolicy: an unknown
or changed key refuses the connection), on the host and on every ProxyJump hop.
`insecure_host_keys=True` accepts any key and is only ever set by an explicit flag. fabric
reads ~/.ssh/config (or the inventory's `ssh_config`), so aliases, HostName, User, Port and
IdentityFile work as with `ssh`.

Tests use tests/remote_fakes.py's FakeHost in place of FabricHost.
"""

from __future__ import annotations

import io
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from netbench.errors import TestbedError
from netbench.remote.inventory import Host, Inventory

CONNECT_TIMEOUT_S = 10.0  # each step of setting up a connection, on every hop: TCP, banner, auth, channel
KEEPALIVE_S = 15.0  # seconds of silence before an SSH keepalive goes out
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class StreamingCommand(Protocol):
    """A command still running on a host: its output as byte streams, its exit status."""

    stdout: IO[bytes]
    stderr: IO[bytes]

    def write(self, data: bytes) -> None: ...  # to the command's stdin
    def close_stdin(self) -> None: ...
    def exit_status(self, timeout: float | None) -> int | None: ...  # None: still running; -1: none came
    def close(self) -> None: ...


class HostConnection(Protocol):
    """What remote mode needs from a host."""

    name: str

    def run(self, command: str, *, input: str | None = None, timeout: float | None = None) -> CommandResult: ...
    def start(self, command: str) -> StreamingCommand: ...
    @property
    def connected(self) -> bool: ...
    def put(self, local: str | Path, remote: str) -> None: ...
    def close(self) -> None: ...


class ChannelCommand:
    """A StreamingCommand over one paramiko session channel."""

    def __init__(self, channel) -> None:
        self.channel = channel
        self.stdout = channel.makefile("rb")
        self.stderr = channel.makefile_stderr("rb")

    def write(self, data: bytes) -> None:
        """Send `data` to the command's stdin."""
        self.channel.sendall(data)

    def close_stdin(self) -> None:
        try:
            self.channel.shutdown_write()
        except (OSError, EOFError):
            pass

    def exit_status(self, timeout: float | None) -> int | None:
        """The command's exit status; None if it is still running after `timeout` seconds;
        -1 if the channel closed without one (connection lost, or ended by a signal)."""
        if not self.channel.status_event.wait(timeout):
            return None
        return self.channel.exit_status

    def close(self) -> None:
        self.channel.close()


def bound_setup(conn) -> None:
    """Bound every step of opening fabric Connection `conn` by CONNECT_TIMEOUT_S: TCP connect,
    the server's banner, authentication, and channel opens on it (paramiko waits an hour for
    a channel by default, and fabric opens a ProxyJump hop's direct-tcpip channel with that
    default; only the last hop got connect_timeout). A smaller ConnectTimeout from ssh_config
    is kept."""
    conn.connect_timeout = min(conn.connect_timeout or CONNECT_TIMEOUT_S, CONNECT_TIMEOUT_S)
    conn.connect_kwargs = {**conn.connect_kwargs, "banner_timeout": CONNECT_TIMEOUT_S,
                           "auth_timeout": CONNECT_TIMEOUT_S, "channel_timeout": CONNECT_TIMEOUT_S}


def ssh_settings(host: Host, ssh_config: dict) -> tuple[str | None, int | None, str | None]:
    """(user, port, key) to give fabric for `host`; None lets ~/.ssh/config decide (pure).

    A value set on the host itself always wins; one from the inventory's `defaults` yields
    to the host's own entry in ssh_config (`ssh_config` is its lookup: user, port, identityfile)."""
    def pick(name: str, value, ssh_key: str):
        return None if name in host.defaulted and ssh_key in ssh_config else value

    return pick("user", host.user, "user"), pick("port", host.port, "port"), pick("key", host.key, "identityfile")


class FabricHost:
    """One SSH connection to an inventory host, opened lazily on the first command."""

    def __init__(self, host: Host, inventory: Inventory, insecure_host_keys: bool = False) -> None:
        from fabric import Config, Connection
        from paramiko import AutoAddPolicy, RejectPolicy

        self.name = host.name
        self.host = host
        config = Config(runtime_ssh_path=inventory.ssh_config) if inventory.ssh_config else Config()
        user, port, key = ssh_settings(host, config.base_ssh_config.lookup(host.ssh))
        connect_kwargs: dict = {"allow_agent": host.agent}
        if key:
            connect_kwargs["key_filename"] = [key]
            connect_kwargs["look_for_keys"] = False
        self.conn = Connection(host.ssh, user=user, port=port, config=config,
                               connect_timeout=CONNECT_TIMEOUT_S, connect_kwargs=connect_kwargs)
        # one connection set-up at a time: a lease renewal's thread and the main thread may
        # both find it closed, and two opens at once would race over one paramiko client
        self._opening = threading.Lock()
        # fabric accepts unknown host keys by default; netbench does not, on the host and on
        # every ProxyJump hop (fabric makes each hop a Connection of its own, with its defaults)
        known = [str(p) for p in (Path(k).expanduser() for k in inventory.known_hosts or DEFAULT_KNOWN_HOSTS)
                 if p.is_file()]
        hop = self.conn
        while isinstance(hop, Connection):
            hop.client.set_missing_host_key_policy(AutoAddPolicy() if insecure_host_keys else RejectPolicy())
            for path in known:
                hop.client.load_system_host_keys(path)
            bound_setup(hop)
            hop = hop.gateway

    @property
    def target(self) -> str:
        return f"{self.conn.user}@{self.conn.host}:{self.conn.port}"

    def _open(self) -> None:
        if self.conn.is_connected:
            return
        with self._opening:
            if not self.conn.is_connected:  # another thread may have opened it meanwhile
                self._open_now()

    def _open_now(self) -> None:
        import paramiko

        try:
            self.conn.open()
        except paramiko.BadHostKeyException as exc:
            raise TestbedError(f"host {self.name} ({self.target}): {self._hop(exc.hostname)}host key differs from "
                               "the one in known_hosts",
                               hint="if the host was reinstalled, update known_hosts (ssh-keygen -R)") from None
        except paramiko.SSHException as exc:
            text = str(exc)
            # a port that accepts but never speaks SSH, or a stuck server or hop ("No existing
            # session": the key exchange was cut off at the connect timeout)
            if "banner" in text or "No existing session" in text:
                raise TestbedError(f"host {self.name} ({self.target}): SSH set-up did not finish within "
                                   f"{CONNECT_TIMEOUT_S:g}s",
                                   hint="is sshd (and every ProxyJump hop) answering on that port?") from None
            if "not found in known_hosts" in text:
                server = text.split("'")[1] if text.count("'") >= 2 else None
                raise TestbedError(f"host {self.name} ({self.target}): {self._hop(server)}host key not in known_hosts",
                                   hint="ssh to it once and check the key, or pass --insecure-host-keys") from None
            raise TestbedError(f"host {self.name} ({self.target}): SSH: {text}",
                               hint="check user, key and agent in the inventory or ~/.ssh/config") from None
        except (socket.timeout, TimeoutError):
            raise TestbedError(f"host {self.name} ({self.target}): no answer within {CONNECT_TIMEOUT_S:g}s",
                               hint="is the host up and the address right?") from None
        except EOFError:  # the peer (or a jump host) closed the connection during set-up
            raise TestbedError(f"host {self.name} ({self.target}): the connection closed during SSH set-up",
                               hint="is it an SSH server, and does it accept this client?") from None
        except OSError as exc:
            raise TestbedError(f"host {self.name} ({self.target}): cannot connect: {exc.strerror or exc}",
                               hint="is sshd running there, and the port right?") from None

    def _bound_session(self) -> None:
        """Bound every channel open on this connection (paramiko waits up to an hour by
        default, which would stall a lease renewal) and send SSH keepalives, so idle control
        connections survive NAT and firewall timeouts through a long sweep."""
        transport = self.conn.transport
        if transport is not None and transport.channel_timeout != CONNECT_TIMEOUT_S:
            transport.channel_timeout = CONNECT_TIMEOUT_S
            transport.set_keepalive(KEEPALIVE_S)

    def _hop(self, server: str | None) -> str:
        """'jump host X: ' when a host-key error names a ProxyJump hop, not the host itself."""
        if not server or server.strip("[]").split("]:")[0] == self.conn.host:
            return ""
        return f"jump host {server}: "

    def run(self, command: str, *, input: str | None = None, timeout: float | None = None) -> CommandResult:
        self._open()
        self._bound_session()
        from invoke.exceptions import CommandTimedOut

        try:
            result = self.conn.run(command, hide=True, warn=True, pty=False, timeout=timeout,
                                   in_stream=io.StringIO(input) if input is not None else False)
        except CommandTimedOut:
            raise TestbedError(f"host {self.name}: {command.split()[0]} did not finish within {timeout:g}s") from None
        except (OSError, EOFError) as exc:
            raise TestbedError(f"host {self.name}: connection lost: {exc}") from None
        return CommandResult(result.exited, result.stdout, result.stderr)

    @property
    def connected(self) -> bool:
        return bool(self.conn.is_connected)

    def start(self, command: str) -> ChannelCommand:
        """Start `command` on its own session channel and return at once (output streams)."""
        self._open()
        self._bound_session()
        import paramiko

        try:
            channel = self.conn.client.get_transport().open_session(timeout=CONNECT_TIMEOUT_S)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
            raise TestbedError(f"host {self.name}: connection lost: {exc or type(exc).__name__}") from None
        return ChannelCommand(channel)

    def put(self, local: str | Path, remote: str) -> None:
        self._open()
        try:
            self.conn.put(str(local), remote)
        except OSError as exc:
            raise TestbedError(f"host {self.name}: cannot copy {local} to {remote}: {exc}") from None

    def close(self) -> None:
        self.conn.close()


def connect_all(inventory: Inventory, insecure_host_keys: bool = False) -> list[FabricHost]:
    """One (not yet opened) connection per inventory host, in inventory order."""
    return [FabricHost(host, inventory, insecure_host_keys) for host in inventory.hosts]
