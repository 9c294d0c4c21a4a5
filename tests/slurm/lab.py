"""A real one-node Slurm cluster for tests: Debian's slurm-wlm and munge, started here.

`slurm_lab(user)` makes a folder of its own (nbslurm-*, under /tmp) holding everything the
cluster needs: a munge key made for the test, munged's socket, pid, log and seed files, a
slurm.conf (slurmctld and one slurmd on this machine, on free ports, state and spool in the
folder), and a work folder the submitting user owns. It starts munged, slurmctld and slurmd
itself, waits for the node to be idle, and on the way out, also after a failure, cancels
every job, waits for their steps to end, stops the three daemons by their pids and removes
the folder; `leftovers()` says what would have been left (a daemon or job step still
running, a file of munge's or Slurm's outside the folder).

The packages are installed with apt-get where they are missing (`ensure_installed`); the
install itself is the only thing the tier leaves behind, as `make install` leaves its own.

`user`: who submits the campaign. "root" runs sbatch and netbench as root; USER (the default)
is an ordinary user the lab creates (useradd) and removes, who runs netbench from a venv of
Debian's /usr/bin/python3 (the checkout's own venv points into /root, which such a user cannot
read) whose .pth puts this checkout and its venv's packages on the path; where the checkout
itself is closed to the user (a clone under /root), the lab binds it at a folder of its own,
readable, and unmounts it after.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from tests.conftest import free_ports

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel", "sinfo")
# places Debian's packages use by default: the lab must make nothing there
DEFAULT_PLACES = (Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge"), Path("/var/log/slurm"),
                  Path("/var/spool/slurmd"), Path("/var/spool/slurmctld"), Path("/var/lib/slurm"),
                  Path("/run/slurm"), Path("/etc/slurm"))
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
USER = "user"  # slurm_lab's user: an ordinary one it makes
SYSTEM_PYTHON = "/usr/bin/python3"


def sh(argv: Sequence[str], check: bool = True, timeout: float = 60, env: dict | None = None,
       user: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A command run to its end (as `user`, by setpriv, when not root), its output captured."""
    full = list(argv)
    if user not in (None, "root"):
        entry = pwd.getpwnam(user)
        full = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *full]
    result = subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}")
    return result


def ensure_installed() -> float:
    """Install slurm-wlm and munge where a binary is missing; the seconds that took (0: there)."""
    if all(shutil.which(b) for b in BINARIES):
        return 0.0
    started = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    if sh(install, check=False, timeout=600, env=env).returncode != 0:  # a stale package list
        sh(["apt-get", "update", "-qq"], timeout=300, env=env)
        sh(install, timeout=600, env=env)
    return time.monotonic() - started


@dataclass
class SlurmLab:
    dir: Path
    user: str
    conf: Path = field(init=False)
    work: Path = field(init=False)
    pids: dict[str, int] = field(default_factory=dict)
    python: str = sys.executable  # the interpreter the submitting user runs netbench with
    steps_seen: set[int] = field(default_factory=set)  # slurmstepd pids seen while jobs ran
    made_user: bool = False
    uid: int = -1  # the user's, once made
    mounts: list[Path] = field(default_factory=list)  # the checkout bound readable, when it was not

    def __post_init__(self) -> None:
        self.conf = self.dir / "slurm.conf"
        self.work = self.dir / "work"

    @property
    def socket(self) -> Path:
        return self.dir / "munge" / "munge.socket.2"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment the submitting user runs Slurm's commands and netbench in."""
        keep = {k: v for k, v in os.environ.items() if k.startswith(("NETBENCH_", "LANG", "LC_"))}
        return {**keep, "PATH": f"{Path(self.python).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                "HOME": str(self.work), "SLURM_CONF": str(self.conf), **extra}

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 120, **extra: str):
        """`argv` as the submitting user, in the work folder's environment."""
        return sh(argv, check=check, timeout=timeout, env=self.env(**extra), user=self.user, cwd=self.work)

    def netbench(self, *args: str, check: bool = True, timeout: float = 300, **extra: str):
        return self.run([self.python, "-m", "netbench.cli", *args], check=check, timeout=timeout, **extra)

    def jobs(self) -> list[str]:
        """The job ids squeue lists (pending or running, array tasks one by one)."""
        out = sh(["squeue", "--noheader", "--array", "--format=%i"], env=self.env(), check=False).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def watch_steps(self) -> None:
        """Remember the job steps running now (their slurmstepd), to check they end."""
        self.steps_seen |= set(daemon_pids("slurmstepd"))

    def leftovers(self) -> list[str]:
        found = [f"{name} (pid {pid}) still running" for name, pid in self.pids.items() if alive(pid)]
        found += [f"slurmstepd (pid {pid}) still running" for pid in self.steps_seen if alive(pid)]
        if self.dir.exists():
            found.append(f"{self.dir} still there")
        mounted = Path("/proc/self/mountinfo").read_text()
        found += [f"{path} still mounted" for path in self.mounts if f" {path} " in mounted]
        if self.made_user:
            found += [f"a process of {self.user} (pid {pid}) still running" for pid in user_pids(self.uid)]
            try:
                pwd.getpwnam(self.user)
                found.append(f"user {self.user} still there")
            except KeyError:
                pass
        return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def user_pids(uid: int) -> list[int]:
    """The live processes whose real uid is `uid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
            if uids and int(uids[0]) == uid and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def daemon_pids(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def places_snapshot() -> dict[Path, set[str]]:
    """What Debian's default munge and Slurm places hold now (absent: None)."""
    return {p: set(os.listdir(p)) if p.is_dir() else None for p in DEFAULT_PLACES}


def _config(lab: SlurmLab, ports: list[int]) -> str:
    d = lab.dir
    return "\n".join([
        "ClusterName=netbenchtest", "SlurmctldHost=localhost", f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}",
        "SlurmUser=root", "AuthType=auth/munge", f"AuthInfo=socket={lab.socket}", "CredType=cred/munge",
        f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
        f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill", "MpiDefault=none", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "KillWait=30", "SchedulerParameters=sched_interval=2",
        f"NodeName=localhost CPUs={os.cpu_count()} State=UNKNOWN",
        "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP", ""])


def _pid_file(path: Path, timeout: float = 15) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.1)
    raise RuntimeError(f"{path} did not appear")


def system_python_fits() -> str | None:
    """Why Debian's python3 cannot run this checkout's packages (None: it can)."""
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is not installed"
    minor = sh([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"]).stdout.strip()
    if minor != str(tuple(sys.version_info[:2])):
        return f"{SYSTEM_PYTHON} is Python {minor}, the venv's packages are for {sys.version_info[:2]}"
    return None


def _make_user(lab: SlurmLab) -> None:
    """An ordinary user for the lab, and a venv of Debian's python3 that sees this checkout and
    its venv's packages (through the checkout bound at a readable folder where it is closed)."""
    lab.user = f"nbslurm{os.getpid() % 100000}"
    sh(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--home-dir", str(lab.work),
        lab.user])
    lab.made_user = True
    entry = pwd.getpwnam(lab.user)
    lab.uid = entry.pw_uid
    os.chown(lab.work, entry.pw_uid, entry.pw_gid)
    repo = ROOT
    if sh(["test", "-r", str(ROOT / "netbench" / "__init__.py")], check=False, user=lab.user).returncode != 0:
        repo = lab.dir / "repo"
        repo.mkdir()
        sh(["mount", "--bind", str(ROOT), str(repo)])
        lab.mounts.append(repo)
    packages = repo / Path(sh([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                          .stdout.strip()).relative_to(ROOT)
    venv = lab.dir / "venv"
    sh([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)])
    inner = sh([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    # the checkout first (its editable install may name a path the user cannot read), then its packages
    Path(inner.stdout.strip(), "netbench-checkout.pth").write_text(
        f"import sys, site; sys.path.insert(0, {str(repo)!r}); site.addsitedir({str(packages)!r})\n")
    lab.python = str(venv / "bin" / "python")


def _stop(pid: int, grace: float = 15) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def _teardown(lab: SlurmLab) -> None:
    if "slurmctld" in lab.pids and alive(lab.pids["slurmctld"]):
        ids = sorted({job.split("_")[0] for job in lab.jobs()})
        if ids:
            sh(["scancel", *ids], env=lab.env(), check=False)
        deadline = time.monotonic() + 90  # KillWait (30 s) and a shard's own clean-up
        while (lab.jobs() or any(alive(p) for p in lab.steps_seen)) and time.monotonic() < deadline:
            lab.watch_steps()
            time.sleep(0.5)
    for name in ("slurmd", "slurmctld", "munged"):
        if name in lab.pids:
            _stop(lab.pids[name])
    if lab.made_user:
        for pid in user_pids(lab.uid):  # a process of the user's that outlived its job: the lab's own user
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while user_pids(lab.uid) and time.monotonic() < deadline:
            time.sleep(0.1)
        sh(["userdel", lab.user], check=False)
    for path in reversed(lab.mounts):
        sh(["umount", str(path)], check=False)
    if not any(f" {path} " in Path("/proc/self/mountinfo").read_text() for path in lab.mounts):
        shutil.rmtree(lab.dir, ignore_errors=True)  # never through a mount still bound to the checkout


@contextlib.contextmanager
def slurm_lab(user: str = USER) -> Iterator[SlurmLab]:
    """munged, slurmctld and one slurmd on this machine, in a folder of their own (see above)."""
    lab = SlurmLab(dir=Path(tempfile.mkdtemp(prefix="nbslurm-")), user=user)
    try:
        lab.dir.chmod(0o755)
        for name in ("munge", "state", "spool", "work"):
            (lab.dir / name).mkdir()
        (lab.dir / "munge").chmod(0o755)
        (lab.dir / "work").chmod(0o755)
        if user == USER:
            _make_user(lab)
        elif user != "root":
            raise ValueError(f"slurm_lab: user {user!r}: 'root' or tests.slurm.lab.USER")
        key = lab.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        sh(["munged", f"--key-file={key}", f"--socket={lab.socket}", f"--pid-file={lab.dir / 'munged.pid'}",
            f"--log-file={lab.dir / 'munged.log'}", f"--seed-file={lab.dir / 'munged.seed'}"])
        lab.pids["munged"] = _pid_file(lab.dir / "munged.pid")
        lab.conf.write_text(_config(lab, free_ports(2)))
        sh(["slurmctld", "-f", str(lab.conf)])
        lab.pids["slurmctld"] = _pid_file(lab.dir / "slurmctld.pid")
        sh(["slurmd", "-f", str(lab.conf), "-N", "localhost"])
        lab.pids["slurmd"] = _pid_file(lab.dir / "slurmd.pid")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = sh(["sinfo", "--noheader", "--format=%t"], env=lab.env(), check=False).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the Slurm node never became idle (sinfo: {state!r}); "
                               f"{(lab.dir / 'slurmd.log').read_text()[-2000:] if (lab.dir / 'slurmd.log').exists() else ''}")
        yield lab
    finally:
        _teardown(lab)


JOB = re.compile(r"submitted job (\d+)")


def job_id(output: str) -> str:
    match = JOB.search(output)
    if match is None:
        raise AssertionError(f"no job id in: {output}")
    return match.group(1)
