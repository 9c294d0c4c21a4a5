"""The rootless tier: netbench run by an ordinary user the test creates (and removes), with
Debian's own /usr/bin/python3 (this machine's other Pythons live under /root, which such a user
cannot read) and this checkout's packages, reached through a bind mount of the checkout in a
mount namespace of the test's own, wherever the checkout lies. Root-run netbench beside it uses
the same Python, so a job dropped to the user (sudo's SUDO_UID) can run it too."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"


def _site_packages() -> Path:
    """This venv's site-packages, as a path under the checkout."""
    return Path(sysconfig.get_paths()["purelib"])


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """An ordinary user of the host, made for these tests, with a home of their own; every
    process of theirs is stopped and the user removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root (creates a user)")
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"{SYSTEM_PYTHON} is not installed")
    minor = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True).stdout.strip()
    if minor != str(tuple(sys.version_info[:2])):
        pytest.skip(f"{SYSTEM_PYTHON} is Python {minor}, the venv's packages are for {sys.version_info[:2]}")
    name = f"nbrl{os.getpid() % 100000}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        deadline = time.monotonic() + 10
        while subprocess.run(["pgrep", "-u", name], capture_output=True).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        subprocess.run(["userdel", "--remove", name], capture_output=True)


class Runner:
    """Runs netbench (`python3 -m netbench.cli ARGS`) as the test's user or as root, both with
    /usr/bin/python3 and the checkout bind-mounted at `repo` (readable by anyone)."""

    def __init__(self, user: pwd.struct_passwd, top: Path) -> None:
        self.user, self.top = user, top
        self.repo = top / "repo"
        self.work = top / "work"  # the user's working folder: results go under it
        relative = _site_packages().relative_to(ROOT)
        self.pythonpath = f"{self.repo}:{self.repo / relative}"

    def argv(self, args, as_user: bool, env: dict | None = None) -> list[str]:
        variables = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": self.pythonpath,
                     "NETBENCH_PRECISION": "off", "NETBENCH_PREDICT": "0", "LANG": "C.UTF-8",
                     "HOME": self.user.pw_dir if as_user else "/root", **(env or {})}
        drop = ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}", "--init-groups"] \
            if as_user else []
        inner = " ".join(["mount", "--bind", str(ROOT), str(self.repo), "&&", "cd", str(self.work), "&&", "exec",
                          *drop, "env", "-i", *[f"{k}={v}" for k, v in variables.items()], SYSTEM_PYTHON, "-m",
                          "netbench.cli", *[_quote(a) for a in args]])
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner]

    def run(self, *args, as_user: bool = True, env: dict | None = None, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(self.argv(args, as_user, env), capture_output=True, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, (args, result.stdout[-3000:], result.stderr[-3000:])
        return result

    def start(self, *args, as_user: bool = True, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(self.argv(args, as_user, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def processes(self) -> list[str]:
        """The user's processes still running (zombies are not)."""
        out = subprocess.run(["ps", "-u", str(self.user.pw_uid), "-o", "pid=,stat=,args="], capture_output=True,
                             text=True).stdout
        return [line for line in out.splitlines() if line.split()[1][0] != "Z"]

    def user_namespaces(self) -> list[str]:
        out = subprocess.run(["lsns", "-t", "user", "-n", "-o", "NS,USER"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if line.split()[-1] == self.user.pw_name]

    def base(self) -> Path:
        return Path(self.user.pw_dir) / ".cache" / "netbench"


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(str(arg))


@pytest.fixture
def runner(user):
    """A Runner for one test, in a folder of its own under /tmp that the user can reach (pytest's
    own are closed to other users), removed afterwards."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="netbench-rootless-"))
    try:
        os.chmod(top, 0o755)
        (top / "repo").mkdir()
        (top / "work").mkdir()
        shutil.chown(top / "work", user.pw_uid, user.pw_gid)
        yield Runner(user, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)
