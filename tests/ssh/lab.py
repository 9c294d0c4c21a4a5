"""Real SSH hosts for tests: Debian's openssh-server `sshd` inside network namespaces.

`ssh_lab()` builds, under a unique `nbssh-<id>` prefix:
- a switch namespace with two bridges: the control network (SSH) and the data network
  (what netbench shapes);
- a controller namespace on the control network only, where the tests run the CLI;
- N host namespaces, each with `ctl0` (control) and `data0` (data), running sshd on ctl0
  with a generated host key, root login by a generated user key, and sftp.

The controller trusts the hosts through a generated known_hosts; an ssh_config gives
host 1 an alias, so aliases are exercised too. The hosts share this filesystem, so the
netbench they run is this checkout's .venv. Everything is removed on exit, also when a
test fails, and `leftovers()` says what would have been left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
SSHD = "/usr/sbin/sshd"
CONTROL_NET = "10.251.0"
DATA_NET = "10.252.0"


def sh(*argv: str, netns: str | None = None, check: bool = True, timeout: float = 30,
       input: str | None = None) -> subprocess.CompletedProcess:
    full = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    result = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@dataclass
class LabHost:
    name: str
    netns: str
    control_address: str
    data_address: str
    state_dir: Path
    sshd: subprocess.Popen | None = None

    def root_qdisc(self, ifname: str = "data0") -> dict | None:
        """The root qdisc on `ifname`, read with tc (independently of netbench)."""
        import json

        out = sh("tc", "-j", "qdisc", "show", "dev", ifname, netns=self.netns).stdout
        for qdisc in json.loads(out or "[]"):
            if qdisc.get("root"):
                return qdisc
        return None


@dataclass
class Lab:
    prefix: str
    dir: Path
    switch: str
    controller: str
    hosts: list[LabHost] = field(default_factory=list)
    inventory: Path | None = None

    def netbench(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        """Run the netbench CLI as the controller (inside the controller namespace)."""
        result = sh(str(VENV / "bin" / "python"), "-m", "netbench.cli", *args, netns=self.controller,
                    check=False, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"netbench {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def spawn_netbench(self, *args: str) -> subprocess.Popen:
        """Start the CLI as the controller in the background (to kill it later)."""
        return subprocess.Popen(["ip", "netns", "exec", self.controller, str(VENV / "bin" / "python"), "-m",
                                 "netbench.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

    def write_inventory(self, **overrides) -> Path:
        data = {
            "known_hosts": str(self.dir / "known_hosts"),
            "ssh_config": str(self.dir / "ssh_config"),
            "defaults": {"interface": "data0", "venv": str(VENV), "agent": False},
            "hosts": {},
        }
        for i, host in enumerate(self.hosts):
            entry = {"tf_address": host.data_address, "state_dir": str(host.state_dir),
                     "roles": ["chief", "worker"] if i == 0 else ["worker"]}
            if i == 0:
                entry["ssh"] = host.name  # an ssh_config alias: HostName, User, IdentityFile from there
            else:
                entry.update(ssh=host.control_address, user="root", port=22, key=str(self.dir / "id_ed25519"))
            data["hosts"][host.name] = entry
        for key, value in overrides.items():
            data[key] = value
        path = self.dir / "inventory.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        self.inventory = path
        return path

    def leftovers(self) -> list[str]:
        left = [name for name in _netns_list() if name.startswith(self.prefix)]
        left += [f"sshd {h.name}" for h in self.hosts if h.sshd is not None and h.sshd.poll() is None]
        left += [f"process {pid} {cmd}" for pid, cmd in _processes_mentioning(str(self.dir))]
        return left


def _netns_list() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()]


def _processes_mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append((int(entry.name), cmd.strip()))
    return found


def _keygen(path: Path) -> str:
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "netbench-test", "-f", str(path))
    return (path.with_suffix(".pub") if path.suffix else Path(f"{path}.pub")).read_text().strip()


def _sshd_config(lab_dir: Path, host: LabHost) -> Path:
    path = lab_dir / f"sshd_{host.name}.conf"
    path.write_text("\n".join([
        "Port 22", f"ListenAddress {host.control_address}",
        f"HostKey {lab_dir / f'host_{host.name}'}", f"PidFile {lab_dir / f'sshd_{host.name}.pid'}",
        f"AuthorizedKeysFile {lab_dir / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM no", "StrictModes no", "Subsystem sftp internal-sftp", "LogLevel ERROR", ""]))
    return path


def _wait_listening(host: LabHost, log: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.sshd.poll() is not None:
            raise RuntimeError(f"sshd on {host.name} exited: {log.read_text()[-500:]}")
        if f"{host.control_address}:22" in sh("ss", "-ltn", netns=host.netns, check=False).stdout:
            return
        time.sleep(0.1)
    raise RuntimeError(f"sshd on {host.name} not listening after {timeout:g}s")


def _build(lab: Lab, count: int) -> None:
    for ns in (lab.switch, lab.controller, *(h.netns for h in lab.hosts)):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "set", "lo", "up", netns=ns)
    for bridge in ("brctl", "brdata"):
        sh("ip", "link", "add", bridge, "type", "bridge", netns=lab.switch)
        sh("ip", "link", "set", bridge, "up", netns=lab.switch)

    def wire(ns: str, ifname: str, port: str, bridge: str, address: str) -> None:
        sh("ip", "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", ns, netns=lab.switch)
        sh("ip", "link", "set", port, "master", bridge, "up", netns=lab.switch)
        sh("ip", "addr", "add", f"{address}/24", "dev", ifname, netns=ns)
        sh("ip", "link", "set", ifname, "up", netns=ns)

    wire(lab.controller, "ctl0", "pc", "brctl", f"{CONTROL_NET}.1")
    for i, host in enumerate(lab.hosts):
        wire(host.netns, "ctl0", f"pc{i + 1}", "brctl", host.control_address)
        wire(host.netns, "data0", f"pd{i + 1}", "brdata", host.data_address)
    user_pub = _keygen(lab.dir / "id_ed25519")
    (lab.dir / "authorized_keys").write_text(user_pub + "\n")
    known, config = [], []
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    for host in lab.hosts:
        host_pub = _keygen(lab.dir / f"host_{host.name}")
        known.append(f"{host.control_address} {' '.join(host_pub.split()[:2])}")
        config += [f"Host {host.name}", f"  HostName {host.control_address}", "  User root",
                   f"  IdentityFile {lab.dir / 'id_ed25519'}", ""]
        host.state_dir.mkdir(parents=True)
        conf = _sshd_config(lab.dir, host)
        log = lab.dir / f"sshd_{host.name}.log"
        host.sshd = subprocess.Popen(["ip", "netns", "exec", host.netns, SSHD, "-D", "-f", str(conf), "-E", str(log)],
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        _wait_listening(host, log)
    (lab.dir / "known_hosts").write_text("\n".join(known) + "\n")
    (lab.dir / "ssh_config").write_text("\n".join(config))


def _teardown(lab: Lab) -> None:
    for host in lab.hosts:
        # the host's own reset, as a controller-less host would run it
        if host.netns in _netns_list():
            sh(str(VENV / "bin" / "python"), "-m", "netbench.cli", "node", "--state-dir", str(host.state_dir),
               "reset", "--json", netns=host.netns, check=False, timeout=60)
        if host.sshd is not None and host.sshd.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host.sshd.pid, signal.SIGTERM)
            try:
                host.sshd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(host.sshd.pid, signal.SIGKILL)
                host.sshd.wait(timeout=5)
    # sshd's per-session children and anything started from the lab's folders
    for pid, _ in _processes_mentioning(str(lab.dir)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for host in lab.hosts:
        if host.netns in _netns_list():
            inode = os.stat(f"/run/netns/{host.netns}").st_ino
            sh("ip", "netns", "delete", f"nbhost-{inode}", check=False)
    for ns in reversed([lab.switch, lab.controller, *(h.netns for h in lab.hosts)]):
        sh("ip", "netns", "delete", ns, check=False)


@contextlib.contextmanager
def ssh_lab(base: Path, count: int = 2):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise RuntimeError("the SSH lab needs root and iproute2")
    if not Path(SSHD).exists():
        raise RuntimeError(f"{SSHD} is missing: apt-get install openssh-server (make install does)")
    prefix = f"nbssh-{uuid.uuid4().hex[:6]}-"
    lab = Lab(prefix=prefix, dir=base, switch=prefix + "sw", controller=prefix + "c")
    lab.hosts = [LabHost(name=f"h{i + 1}", netns=f"{prefix}h{i + 1}", control_address=f"{CONTROL_NET}.{11 + i}",
                         data_address=f"{DATA_NET}.{11 + i}", state_dir=base / f"h{i + 1}-state")
                 for i in range(count)]
    try:
        _build(lab, count)
        lab.write_inventory()
        yield lab
    finally:
        _teardown(lab)



def root_lab(tmp_path_factory, prefix: str, count: int = 2):
    """Body of a module-scoped `lab` fixture: a lab of `count` hosts for root, a skip
    otherwise, and nothing left behind (namespaces, sshd, host state) once the module's
    tests are done."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root (creates network namespaces and runs sshd)")
    with ssh_lab(tmp_path_factory.mktemp(prefix), count) as built:
        yield built
    assert not built.leftovers(), built.leftovers()
