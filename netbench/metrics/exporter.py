"""Serve /metrics over HTTP from the controller, and announce it to Prometheus (file_sd).

The registry is netbench's own (never prometheus_client's global one), holding one custom
collector. While serving, a file_sd target file `<state dir>/targets/netbench-<pid>-<start>.json`
says where to scrape; it is written atomically (a temp name the `*.json` glob ignores, then
rename) and removed when serving stops. Its name says which controller wrote it (pid and
start time), so one a killed controller left is removed by `netbench reset` and by the next
controller that serves. A controller that may not write there (not root) serves without
one and says so in `warnings`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import time
from pathlib import Path
from typing import Iterator

from prometheus_client import CollectorRegistry, start_http_server

from netbench import proc
from netbench.errors import UsageError
from netbench.state.journal import state_dir as default_state_dir
from netbench.metrics.collector import NetbenchCollector
from netbench.metrics.network import NetworkReader
from netbench.metrics.state import MetricsObserver, MetricsState, ObserverTee

DEFAULT_ADDRESS = "127.0.0.1"
FINAL_SEND_S = 0.2  # after the final collection, for its response to reach the scraper
FINAL_SCRAPE_S = 3.0  # longest wait for a scraper to see the finished sweep (scrape interval 1-2 s)
JOB = "netbench"


def check_address(address: str) -> str:
    """An IP address to bind to, or a UsageError naming the flag."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise UsageError(f"flag --metrics-address: {address!r} is not an IP address",
                         hint="e.g. --metrics-address 127.0.0.1 (the default) or 0.0.0.0 for every interface") from None


def targets_dir(state: Path | None = None) -> Path:
    """Where target files go; the shipped prometheus.yml watches <this>/*.json. A sandbox's
    (testbed/sandbox.py) go beside its user's others, in the base folder, where Prometheus
    looks, not in its own state folder, which goes with it."""
    import os

    from netbench.state import places

    if state is None and os.environ.get(places.SANDBOX_ENV):
        return places.base_dir(os.environ, proc.owner_uid()) / "targets"
    return (state or default_state_dir()) / "targets"


# netbench-<pid>-<start ticks>.json; netbench-<pid>.json from older versions
TARGET_NAME = re.compile(r"netbench-(?P<pid>\d+)(?:-(?P<start>\d+))?\.json")


def target_name(pid: int) -> str:
    """The target file name of controller `pid` (with its start time: a pid can be reused)."""
    return f"netbench-{pid}-{proc.start_time(pid) or 0}.json"


def remove_stale_targets(directory: Path) -> list[str]:
    """Remove the target files in `directory` whose controller is gone; one line per file."""
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError:
        return []
    removed = []
    for name in names:
        match = TARGET_NAME.fullmatch(name)
        if match is None:
            continue
        start = match["start"]
        if proc.is_same_process(int(match["pid"]), int(start) if start and start != "0" else None):
            continue
        try:
            (directory / name).unlink()
        except FileNotFoundError:
            continue
        except OSError:
            continue  # not ours to remove (another user's folder): reset as root does it
        removed.append(f"metrics target file {directory / name} (controller {match['pid']} is gone)")
    return removed


def target_entry(host: str, port: int, labels: dict[str, str]) -> list[dict]:
    """One file_sd target group."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return [{"targets": [target], "labels": dict(labels)}]


def write_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")  # does not match the *.json glob Prometheus watches
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class MetricsExporter:
    """The HTTP endpoint, its registry, the state it reads and the target file."""

    def __init__(self, port: int, address: str = DEFAULT_ADDRESS, state: MetricsState | None = None,
                 network: NetworkReader | None = None, state_path: Path | None = None) -> None:
        self.requested_port = port
        self.address = check_address(address)
        self.state = state or MetricsState()
        self.network = network or NetworkReader(state_path or default_state_dir())
        self.registry = CollectorRegistry(auto_describe=True)
        self.collector = NetbenchCollector(self.state, self.network)
        self.registry.register(self.collector)
        self.target_file: Path | None = targets_dir(state_path) / target_name(os.getpid())
        self.warnings: list[str] = []  # what did not work out but did not stop serving
        self._httpd = None
        self._thread = None
        self.observer = MetricsObserver(self.state, on_topology=self._set_topology)

    def _set_topology(self, topology) -> None:
        self.network.topology = topology

    @property
    def port(self) -> int:
        return self._httpd.server_port if self._httpd else self.requested_port

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        try:
            self._httpd, self._thread = start_http_server(self.requested_port, self.address, self.registry)
        except OSError as exc:
            raise UsageError(f"flag --metrics-port: cannot serve metrics on {self.address}:{self.requested_port}: "
                             f"{exc.strerror or exc}", hint="choose a free port, or 0 for any free port") from None
        scrape_host = "127.0.0.1" if self.address in ("0.0.0.0", "::") else self.address
        try:
            self.target_file.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_targets(self.target_file.parent)
            write_atomic(self.target_file, target_entry(scrape_host, self.port, {"job": JOB}))
        except OSError as exc:
            # the metrics are served all the same: only Prometheus's discovery of them is lost
            folder, self.target_file = self.target_file.parent, None
            self.warnings.append(f"no Prometheus file_sd target file: cannot write in {folder}: "
                                 f"{exc.strerror or exc}; scrape {self.url} directly, or set "
                                 f"NETBENCH_STATE_DIR to a folder you may write (prometheus.yml watches "
                                 f"its targets/*.json)")

    def wait_for_scrape(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until something has scraped this exporter; True if it has."""
        deadline = time.monotonic() + timeout_s
        while not self.collector.scrapes and time.monotonic() < deadline:
            time.sleep(0.05)
        return bool(self.collector.scrapes)

    def stop(self, final_scrape_s: float = 0.0) -> None:
        """Stop serving. With `final_scrape_s`, first wait that long at most for one more scrape,
        if anything has scraped at all, so the final state (last result, 'finished') is recorded."""
        if final_scrape_s > 0 and self._httpd is not None and self.collector.scrapes:
            # a scrape begun after this point, whole: one begun earlier may hold the state from
            # before the sweep's last changes, and a response cut by the shutdown is no scrape
            seen, deadline = self.collector.scrapes, time.monotonic() + final_scrape_s
            while self.collector.completed <= seen and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(FINAL_SEND_S)
        if self.target_file is not None:
            self.target_file.unlink(missing_ok=True)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def observe(self, *others):
        """An observer that feeds the metrics and passes every call on to `others`."""
        return ObserverTee(*others, self.observer)


@contextlib.contextmanager
def serving(port: int | None, address: str = DEFAULT_ADDRESS) -> Iterator[MetricsExporter | None]:
    """Serve metrics for the duration of the block; yields None when `port` is None."""
    if port is None:
        yield None
        return
    exporter = MetricsExporter(port, address)
    exporter.start()
    try:
        yield exporter
    except BaseException:
        exporter.stop()
        raise
    exporter.stop(final_scrape_s=FINAL_SCRAPE_S)
