"""The controller side of remote mode: plan per host, send plans to each host's own netbench
over SSH, read back, reset, check, renew leases. Hosts are driven in parallel.

Each host shapes its data-plane interface's egress (and ingress, with netem) in its own
network namespace. With the netem backend a host gets the same changes a local node gets;
a host without sch_netem gets the rate through tbf only (its own NFQUEUE delay engine would
sit in the sender's stack, where TCP small queues distort it: see docs/background/backends.md), and a profile
with delay, jitter or loss is refused for it with the reason.
"""

from __future__ import annotations

import json
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

from netbench import __version__
from netbench.emulation import changes as ch
from netbench.emulation.backends import get_backend
from netbench.emulation.wire import plan_to_json
from netbench.errors import BackendUnavailable, NetbenchError, ResetIncomplete, TestbedError
from netbench.remote.inventory import Host, Inventory
from netbench.model.pairs import PairTopology
from netbench.model.profile import Profile
from netbench.remote.agent import HOST_NETNS
from netbench.remote.pairs import check_inventory_nodes, plan_pairs_for_host
from netbench.remote.ssh import HostConnection
from netbench.model.topology import Node, Topology

NODE_TIMEOUT_S = 120.0
T = TypeVar("T")


class RemoteError(NetbenchError):
    """A host refused or failed a command; the message names the host. The exit code is the
    host's (2: bad input, 3: privileges), so remote and local failures exit alike."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 1) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code if exit_code in (1, 2, 3) else 1


def node_command(host: Host, args: Sequence[str]) -> str:
    """The shell command that runs `netbench node ARGS` on `host` with its state dir. The
    login shell expands $SSH_CONNECTION before sudo (whose env_reset drops it) runs, so the
    host knows which interface carries this session."""
    argv = [host.netbench, "node", "--state-dir", host.state_dir]
    return (("sudo -n " if host.sudo else "") + shlex.join(argv) + ' --ssh-connection "$SSH_CONNECTION" '
            + shlex.join(args))


def _error_lines(stderr: str, stdout: str, exit_code: int) -> tuple[str, str | None]:
    """The host's one-line error and its hint, from netbench's `error:`/`hint:` lines."""
    lines = [line.strip() for line in (stderr or stdout).splitlines() if line.strip()]
    message = next((line[len("error:"):].strip() for line in lines if line.startswith("error:")), None)
    hint = next((line[len("hint:"):].strip() for line in lines if line.startswith("hint:")), None)
    if message is None and exit_code == 127:
        message, hint = "netbench is not installed there", "run 'netbench provision --inventory ...'"
    return message or (lines[-1] if lines else f"exit status {exit_code}"), hint


def call_node(conn: HostConnection, host: Host, args: Sequence[str], input: str | None = None,
              timeout: float = NODE_TIMEOUT_S) -> dict[str, Any]:
    """Run `netbench node ARGS --json`-style commands on a host and parse their JSON."""
    result = conn.run(node_command(host, args), input=input, timeout=timeout)
    if not result.ok:
        message, hint = _error_lines(result.stderr, result.stdout, result.exit_code)
        raise RemoteError(f"host {host.name}: {message}", hint=hint, exit_code=result.exit_code)
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise RemoteError(f"host {host.name}: 'netbench node {args[0]}' printed no JSON: "
                          f"{result.stdout.strip()[:120]!r}") from None
    problem = answer_problem(args[0], data)
    if problem:
        raise RemoteError(f"host {host.name}: 'netbench node {args[0]}' answered JSON of the wrong shape: {problem}",
                          hint="is netbench there this controller's version? ('netbench doctor --inventory ...')")
    return data


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _node_row(row: Any) -> bool:
    return (isinstance(row, dict) and isinstance(row.get("node"), str) and _optional_str(row.get("backend"))
            and all(row.get(key) is None or isinstance(row[key], dict) for key in ("profile", "qdisc", "engine")))


def _lease(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("held"), bool) and (
        not value["held"] or (_number(value.get("remaining_s")) and _number(value.get("seconds"))))


# what each `netbench node` answer must hold, for the keys the controller reads:
# (key, required, check, what it must be)
ANSWER_SHAPES: dict[str, tuple[tuple[str, bool, Callable[[Any], bool], str], ...]] = {
    "info": (("interfaces", True, lambda v: isinstance(v, dict) and all(_str_list(a) for a in v.values()),
              "an object of address lists"),
             ("interface_ok", False, lambda v: isinstance(v, bool), "true or false"),
             ("control_path_known", False, lambda v: isinstance(v, bool), "true or false"),
             ("control_interfaces", False, _str_list, "a list of strings"),
             *((key, False, _optional_str, "a string") for key in ("backend", "backend_reason", "netbench",
                                                                   "tensorflow"))),
    "apply": (("applied", False, _str_list, "a list of strings"),),
    "reset": (("removed", True, _str_list, "a list of strings"),
              ("held_by", False, _optional_str, "a string")),
    "show": (("nodes", True, lambda v: isinstance(v, list) and all(_node_row(r) for r in v), "a list of node rows"),
             ("lease", True, _lease, "a lease object"),
             ("watchers", False, lambda v: isinstance(v, list) and all(_number(p) for p in v), "a list of pids")),
}


def answer_problem(command: str, data: Any) -> str | None:
    """What is wrong with the JSON a host answered `netbench node COMMAND` with; None if
    nothing the controller reads is (pure)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key, required, check, what in ANSWER_SHAPES.get(command, ()):
        if key not in data:
            if required:
                return f"no {key!r}"
        elif not check(data[key]):
            return f"{key!r} is not {what}"
    return None


def hosts_topology(inventory: Inventory) -> Topology:
    """The hosts as a topology, for resolving `peers` names to TF addresses."""
    nodes = tuple(Node(name=h.name, netns=HOST_NETNS, ifname=h.interface, address=h.tf_address or "",
                       prefixlen=32, port="") for h in inventory.hosts)
    return Topology(nodes=nodes, subnet="", switch_netns=HOST_NETNS, bridge="")


def plan_for_host(profile: Profile, host: Host, backend: str, topology: Topology) -> list[ch.Change]:
    """Every change that turns `host`'s data-plane interface into `profile` (pure): the
    registered backend that `backend` means on a host (netem: the same per-node plan a
    local testbed node gets, peers by host name resolving to tf_address; userspace: rate only)."""
    node = next(n for n in topology.nodes if n.name == host.name)
    return get_backend(backend, on_host=True).plan(profile, topology, (node,), 0)


def plan_clear_host(host: Host) -> list[ch.Change]:
    return [ch.ClearQdisc(host.name, HOST_NETNS, host.interface),
            ch.ClearIngress(host.name, HOST_NETNS, host.interface, ch.ifb_name(host.interface))]


def host_error(name: str, exc: Exception) -> NetbenchError:
    """`exc`, raised while driving host `name`, as a NetbenchError whose message names it."""
    if isinstance(exc, NetbenchError):
        if f"host {name}" in exc.message:
            return exc
        return RemoteError(f"host {name}: {exc.message}", hint=exc.hint, exit_code=exc.exit_code)
    return RemoteError(f"host {name}: {type(exc).__name__}: {exc}".rstrip(": "))


def in_parallel(conns: Sequence[HostConnection], work: Callable[[HostConnection], T]) -> dict[str, T | Exception]:
    """Run `work` on every host at once; each host's result or the error it raised. Every
    error is caught (one host's failure never stops the others) and names its host."""
    def guarded(conn: HostConnection) -> T | Exception:
        try:
            return work(conn)
        except Exception as exc:  # whatever a host (or its connection) does
            return host_error(conn.name, exc)

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(conns)))) as pool:
        results = list(pool.map(guarded, conns))
    return {conn.name: result for conn, result in zip(conns, results)}


def _raise_first(results: dict[str, Any]) -> None:
    errors = [r for r in results.values() if isinstance(r, Exception)]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more host(s) failed)" if len(errors) > 1 else ""
        raise RemoteError(first.message + more, hint=getattr(first, "hint", None),
                          exit_code=getattr(first, "exit_code", 1)) from None


@dataclass
class RemoteApply:
    """The outcome of applying a profile to every host."""

    backends: dict[str, str]
    plans: dict[str, list[ch.Change]]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def choose_host_backend(requested: str | None, info: dict[str, Any], host: Host) -> str:
    have = info.get("backend")
    if requested in (None, "auto"):
        return have or "userspace"
    if requested == "netem" and have != "netem":
        raise BackendUnavailable(f"host {host.name}: --backend netem: {info.get('backend_reason', 'no netem')}",
                                 hint="load sch_netem on the host, or use --backend userspace (rate only)")
    return requested


def probe_hosts(inventory: Inventory, conns: Sequence[HostConnection]) -> dict[str, dict[str, Any]]:
    """Ask each host what it has (`netbench node info`), in parallel; checks its interface."""
    by_name = {h.name: h for h in inventory.hosts}
    infos = in_parallel(conns, lambda c: call_node(c, by_name[c.name], ["info", "--interface", by_name[c.name].interface]))
    _raise_first(infos)
    for host in inventory.hosts:
        info = infos[host.name]
        if not info.get("interface_ok", True):
            raise RemoteError(f"host {host.name}: no interface {host.interface} there "
                              f"(it has {', '.join(sorted(info.get('interfaces', {})))})",
                              hint=f"fix hosts.{host.name}.interface in {inventory.path}")
    return infos  # type: ignore[return-value]


def plan_network_for_host(network: Profile | PairTopology, host: Host, backend: str,
                          topology: Topology) -> list[ch.Change]:
    """plan_for_host for a profile; for a per-pair topology, `host`'s row (remote/pairs.py)."""
    if isinstance(network, PairTopology):
        return plan_pairs_for_host(network, host, backend, topology)
    return plan_for_host(network, host, backend, topology)


def plan_hosts(inventory: Inventory, infos: dict[str, dict[str, Any]], profile: Profile | PairTopology,
               backend: str | None) -> RemoteApply:
    """Each host's backend and changes for `profile` (or a per-pair topology: each host its
    row, its nodes checked against the inventory first), from what the hosts said they have (pure)."""
    if isinstance(profile, PairTopology):
        check_inventory_nodes(profile, inventory)
    topology = hosts_topology(inventory)
    backends, plans = {}, {}
    for host in inventory.hosts:
        backends[host.name] = choose_host_backend(backend, infos[host.name], host)
        plans[host.name] = plan_network_for_host(profile, host, backends[host.name], topology)
    return RemoteApply(backends=backends, plans=plans)


def plan_inventory(inventory: Inventory, conns: Sequence[HostConnection], profile: Profile | PairTopology,
                   backend: str | None) -> RemoteApply:
    """Ask each host what it can do, then plan its changes (nothing is changed). A topology's
    nodes are checked against the inventory before any host is asked."""
    if isinstance(profile, PairTopology):
        check_inventory_nodes(profile, inventory)
    return plan_hosts(inventory, probe_hosts(inventory, conns), profile, backend)


def apply_inventory(inventory: Inventory, conns: Sequence[HostConnection], planned: RemoteApply,
                    lease_s: float = 0.0, force: bool = False, holder: str | None = None,
                    takeover: bool = False, agents: dict[str, Any] | None = None,
                    on_applied: Callable[[str], None] | None = None) -> RemoteApply:
    """Send each host its plan, with the lease taken for `holder` (the controller session's
    token): through its `node serve` channel where `agents` (channel.open_agents) has a live
    one, else with a `node apply`. If any host fails, it undoes its own changes and the hosts
    that succeeded are reset, so a failed apply leaves every host unshaped, and the first
    apply error is raised (a reset that fails too is named in its hint). `on_applied(host)`
    is called as each host's apply returns (a LeaseKeeper's `hold`: its lease is taken)."""
    by_name = {h.name: h for h in inventory.hosts}

    def one(conn: HostConnection) -> dict[str, Any]:
        agent = (agents or {}).get(conn.name)
        if agent is not None and agent.alive:
            answer = agent.apply(planned.plans[conn.name], lease_s, force, holder, takeover)
        else:
            args = ["apply", "--json", "--lease", f"{lease_s:g}"] + (["--force"] if force else [])
            args += (["--holder", holder] if holder else []) + (["--takeover"] if takeover else [])
            answer = call_node(conn, by_name[conn.name], args, input=plan_to_json(planned.plans[conn.name]))
        if on_applied is not None:
            on_applied(conn.name)
        return answer

    results = in_parallel(conns, one)
    if any(isinstance(r, Exception) for r in results.values()):
        applied = [c for c in conns if not isinstance(results[c.name], Exception)]
        try:
            reset_inventory(inventory, applied)
        except NetbenchError as exc:
            first = next(r for r in results.values() if isinstance(r, Exception))
            first.hint = "; ".join(filter(None, [getattr(first, "hint", None), f"resetting the others: {exc.message}"]))
        _raise_first(results)
    planned.results = results  # type: ignore[assignment]
    return planned


def reset_inventory(inventory: Inventory, conns: Sequence[HostConnection], holder: str | None = None,
                    kept: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Every host resets its own journal, all at once: host -> what it removed. Hosts that
    fail do not stop the others: ResetIncomplete names each (and carries the others' lines).
    With `holder` (a controller resetting what it applied), a host whose lease another holder
    took meanwhile is left alone, recorded in `kept` (host -> the other holder)."""
    by_name = {h.name: h for h in inventory.hosts}
    args = ["reset", "--json", *(["--holder", holder] if holder else [])]
    results = in_parallel(conns, lambda c: call_node(c, by_name[c.name], args))
    for name, r in list(results.items()):
        if isinstance(r, dict) and r.get("held_by"):
            if kept is not None:
                kept[name] = r["held_by"]
            del results[name]
    removed = {name: r["removed"] for name, r in results.items() if not isinstance(r, Exception)}  # type: ignore[index]
    failures = [r.message if isinstance(r, NetbenchError) else f"host {name}: {r}"
                for name, r in results.items() if isinstance(r, Exception)]
    if failures:
        raise ResetIncomplete(removed, failures)
    return removed


def show_inventory(inventory: Inventory, conns: Sequence[HostConnection]) -> dict[str, dict[str, Any]]:
    by_name = {h.name: h for h in inventory.hosts}
    results = in_parallel(conns, lambda c: call_node(c, by_name[c.name], ["show", "--json", "--interface",
                                                                          by_name[c.name].interface]))
    _raise_first(results)
    return results  # type: ignore[return-value]


def check_versions(info: dict[str, Any], tensorflow: str | None) -> list[tuple[str, str, str]]:
    """(check, status, detail) rows comparing a host's versions with the controller's (pure)."""
    rows = [("netbench", "ok" if info.get("netbench") == __version__ else "mismatch",
             f"{info.get('netbench')} (controller {__version__})")]
    if tensorflow is not None or info.get("tensorflow") is not None:
        same = info.get("tensorflow") == tensorflow
        rows.append(("tensorflow", "ok" if same else "mismatch", f"{info.get('tensorflow')} (controller {tensorflow})"))
    return rows


def doctor_host(conn: HostConnection, host: Host, tensorflow: str | None) -> list[tuple[str, str, str]]:
    """Every check for one host, as rows; a failure early on marks the rest as skipped."""
    rows: list[tuple[str, str, str]] = []
    try:
        who = conn.run("id -u", timeout=30)
    except TestbedError as exc:
        return [("reachable", "missing", exc.message)]
    rows.append(("reachable", "ok", "SSH connection and host key verified"))
    if who.stdout.strip() == "0":
        rows.append(("root", "ok", "logged in as root"))
    elif host.sudo and conn.run("sudo -n true", timeout=30).ok:
        rows.append(("root", "ok", "passwordless sudo"))
    else:
        rows.append(("root", "missing", "not root and no passwordless sudo (set sudo: true and allow it)"))
        return rows
    py = conn.run(f"{shlex.quote(host.venv)}/bin/python --version", timeout=30)
    if not py.ok:
        rows.append(("python", "missing", f"no Python in {host.venv} (run 'netbench provision --inventory ...')"))
        return rows
    rows.append(("python", "ok", (py.stdout or py.stderr).strip()))
    try:
        info = call_node(conn, host, ["info", "--interface", host.interface])
    except RemoteError as exc:
        rows.append(("netbench", "missing", exc.message))
        return rows
    rows += check_versions(info, tensorflow)
    rows.append(("interface", "ok" if info.get("interface_ok") else "missing",
                 f"{host.interface}: {', '.join(info['interfaces'].get(host.interface, [])) or 'no address'}"
                 if info.get("interface_ok") else f"no {host.interface} (has {', '.join(sorted(info['interfaces']))})"))
    control = set(info.get("control_interfaces", []))
    if not info.get("control_path_known", False):  # an older netbench there cannot say either
        rows.append(("control path", "unknown", "the host cannot tell which interface carries SSH, so "
                     "'apply' refuses it without --force (is netbench there this controller's version?)"))
    else:
        rows.append(("control path", "missing" if host.interface in control else "ok",
                     f"SSH arrives on {', '.join(sorted(control))}; shaping {host.interface}"))
    backend = info.get("backend")
    rows.append(("backend", "ok" if backend == "netem" else "limited" if backend else "missing",
                 f"{backend}: {info.get('backend_reason')}" + ("" if backend == "netem" else
                                                              " (remote userspace shapes rate only)")))
    return rows


# ---------------------------------------------------------------- opening an inventory

def open_inventory(inventory_path, insecure: bool) -> tuple[Inventory, list[HostConnection]]:
    """The inventory at `inventory_path` and a connection to each host (each connects on first use)."""
    from netbench.remote.inventory import load_inventory
    from netbench.remote.ssh import connect_all

    inventory = load_inventory(inventory_path)
    return inventory, connect_all(inventory, insecure_host_keys=insecure)


def close_all(conns: Sequence[HostConnection]) -> None:
    """Close every connection; a broken one has nothing left to close."""
    for conn in conns:
        try:
            conn.close()
        except Exception:  # closing a broken connection: nothing left to do
            pass
