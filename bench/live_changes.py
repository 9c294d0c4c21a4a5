#!/usr/bin/env python3
"""Live changes under TCP load: the same change on netem and on the userspace engine.

Brings up a 2-node embedded testbed with netbench's own library (``testbed.netns.up``, each
node's congestion control set as a sweep sets it, every change made in place with
``backends.plan_network(..., held=executor.held())``: what `EmbeddedTestbed.apply` does for a
sweep's launch and a schedule), puts one iperf3 flow from n1 to n2 through it, and changes the
link under the flow. Each *case* is a pair of profiles A and B applied to both nodes (one-way
at each egress, as netbench always shapes); one repetition is a fresh flow that holds A for
--warm seconds, changes to B, holds B for --after + --before seconds, changes back to A and
holds it as long: two changes (A -> B, "there", and B -> A, "back"), each seen from --before
seconds before it to --after seconds after, with the --before seconds after that as the new
point's steady rate. A fresh flow per repetition keeps repetitions independent, so their
spread is the backend's own run-to-run spread.

Throughput is n2's interface byte counter (read from /proc/PID/net/dev of the iperf3 server,
every --sample-ms), cut into 100 ms bins on the clock the changes were timed by; the RTT, cwnd
and retransmissions seen by the sender are iperf3's own (``--interval 0.1 --json``), aligned to
the counter by the flow's first bytes. bench/transients.py turns the bins into each change's
time to 90 % of the new steady rate, its lowest 100 ms and the bytes moved in --after seconds.

Usage (root; the testbed lock, as every bench)::

    flock /tmp/netbench-bed.lock .venv/bin/python bench/live_changes.py --backend userspace
    flock /tmp/netbench-bed.lock .venv/bin/python bench/live_changes.py --vm      # netem and the
        # engine in one boot of Debian's stock kernel under qemu (make test-kernel's VM)
    .venv/bin/python bench/live_changes.py --compare netem.json userspace.json

Options: --cases (names, comma-separated; default all), --repeats, --high/--low (the rates),
--json PATH. It refuses to run while another netbench testbed is up, journals everything in a
private state folder and removes it with ``netbench.state.reset.reset`` in ``finally``.
Exit status: 0 done, 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import transients as tr  # noqa: E402 - the pure analysis beside this file
import live_report as rep  # noqa: E402

PORT = 5211
BIN_S = 0.1


def cases(high: str, low: str) -> dict[str, dict]:
    """name -> {"a": profile keys, "b": profile keys, "cc": congestion control}: each change the
    issue names, at rate `high` unless the case is the rate."""
    return {
        "delay-1-10": {"a": {"delay": "1ms", "rate": high}, "b": {"delay": "10ms", "rate": high}, "cc": "cubic"},
        "delay-10-100": {"a": {"delay": "10ms", "rate": high}, "b": {"delay": "100ms", "rate": high}, "cc": "cubic"},
        "rate": {"a": {"delay": "1ms", "rate": high}, "b": {"delay": "1ms", "rate": low}, "cc": "cubic"},
        "loss-0-1": {"a": {"delay": "1ms", "rate": high}, "b": {"delay": "1ms", "rate": high, "loss": "1%"},
                     "cc": "cubic"},
        "jitter-0-2": {"a": {"delay": "10ms", "rate": high}, "b": {"delay": "10ms", "jitter": "2ms", "rate": high},
                       "cc": "cubic"},
        # the case last round saw on the engine (bbr was the host's default the test inherited)
        "delay-1-10-bbr": {"a": {"delay": "1ms", "rate": high}, "b": {"delay": "10ms", "rate": high}, "cc": "bbr"},
    }


class Sampler:
    """n2's received bytes every `period` s, read from /proc/PID/net/dev of a process in n2."""

    def __init__(self, pid: int, ifname: str, period: float) -> None:
        self.path, self.ifname, self.period = f"/proc/{pid}/net/dev", ifname + ":", period
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> int | None:
        try:
            with open(self.path, encoding="ascii") as fh:
                for line in fh:
                    if line.strip().startswith(self.ifname):
                        return int(line.split(":", 1)[1].split()[0])
        except OSError:
            return None
        return None

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            value = self._read()
            if value is not None:
                self.samples.append((time.monotonic(), value))
            due += self.period
            self._stop.wait(max(0.0, due - time.monotonic()))

    def since(self, t: float) -> list[tuple[float, int]]:
        return [s for s in list(self.samples) if s[0] >= t]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def flow_start(samples: list[tuple[float, int]], least: int = 20_000) -> float | None:
    """When a flow's bytes began: the first sample at least `least` bytes above the first."""
    if not samples:
        return None
    first = samples[0][1]
    for t, value in samples:
        if value - first >= least:
            return t
    return None


def iperf_series(report: dict, start: float) -> list[dict]:
    """iperf3's intervals as (time, rtt_ms, cwnd_kb, retransmits), `start` the flow's first bytes."""
    rows = []
    for interval in report.get("intervals", []):
        stream = interval["streams"][0]
        rows.append({"t": start + stream["end"], "rtt_ms": stream.get("rtt", 0) / 1e3,
                     "cwnd_kb": stream.get("snd_cwnd", 0) / 1024, "retransmits": stream.get("retransmits", 0)})
    return rows


class Bed:
    """The testbed, its executor, the iperf3 server and the sampler."""

    def __init__(self, backend: str, journal, args) -> None:
        from netbench.emulation.executor import real_executor
        from netbench.testbed import netns as local

        self.backend, self.journal, self.args = backend, journal, args
        self.topology = local.up(2, journal)
        self.n1, self.n2 = self.topology.nodes
        self.executor = real_executor(journal, hold=True)
        # an engine's start (Python's imports) took over 15 s under qemu without KVM
        self.executor.engines.READY_TIMEOUT_S = args.engine_ready_s
        self.server = subprocess.Popen(["ip", "netns", "exec", self.n2.netns, "iperf3", "-s", "-B", self.n2.address,
                                        "-p", str(PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.sampler = Sampler(self.server.pid, self.n2.ifname, args.sample_ms / 1e3)
        self.cc_entries: list = []

    def congestion(self, name: str) -> None:
        """Every node's congestion control `name`, journaled (as a sweep's --congestion-control)."""
        from netbench.testbed import congestion

        if self.cc_entries:
            congestion.restore(self.journal, self.cc_entries)
        congestion.check_available(name, "case")
        self.cc_entries = congestion.set_on_nodes(self.journal, self.topology.nodes, name)

    def apply(self, keys: dict) -> float:
        """`keys` (profile-file keys) on both nodes, in place; the seconds it took."""
        from netbench.emulation import backends
        from netbench.model.profile import profile_from_mapping

        profile = profile_from_mapping(keys, "live_changes")
        t = time.monotonic()
        self.executor.apply(backends.plan_network(profile, self.topology, self.backend, seed=self.args.seed,
                                                  held=self.executor.held()))
        return time.monotonic() - t

    def engines(self) -> dict:
        """Each engine's counters now (userspace backend), by node."""
        from netbench.emulation import changes as ch

        out = {}
        for position, node in enumerate(self.topology.nodes):
            data = self.executor.engines.read(self.topology.switch_netns, ch.queue_num(position)) or {}
            kernel, late = data.get("kernel") or {}, data.get("lateness_us") or {}
            out[node.name] = {"received": data.get("received", 0), "dropped": data.get("dropped", 0),
                              "queue_dropped": kernel.get("queue_dropped", 0),
                              "user_dropped": kernel.get("user_dropped", 0),
                              "released": late.get("count", 0),
                              "lateness_total_us": late.get("count", 0) * late.get("mean", 0.0),
                              "late_1ms": late.get("over_1ms", 0), "late_10ms": late.get("over_10ms", 0),
                              "lateness_max_us": late.get("max", 0.0)}
        return out

    def close(self) -> None:
        self.sampler.stop()
        if self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        self.executor.close()


def repetition(bed: Bed, case: dict, args) -> list[dict]:
    """One fresh flow through A -> B -> A; each change's record."""
    from netbench import units

    hold = args.after + args.before
    bed.apply(case["a"])
    seconds = int(args.warm + 2 * hold + 2)
    began = time.monotonic()
    client = subprocess.Popen(["ip", "netns", "exec", bed.n1.netns, "iperf3", "-c", bed.n2.address, "-p", str(PORT),
                               "-t", str(seconds), "-i", str(BIN_S), "-J", "-C", case["cc"]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        start = None
        while start is None and time.monotonic() - began < 30:
            time.sleep(0.05)
            start = flow_start(bed.sampler.since(began))
            if client.poll() is not None:
                break
        if start is None:
            raise RuntimeError(f"iperf3 moved no bytes: {client.communicate()[1][-300:]}")
        engines0 = bed.engines() if bed.backend == "userspace" else None
        changes = []
        for k, (label, keys) in enumerate((("there", case["b"]), ("back", case["a"]))):
            at = start + args.warm + k * hold
            time.sleep(max(0.0, at - time.monotonic()))
            t0 = time.monotonic()
            took = bed.apply(keys)
            changes.append({"direction": label, "t0": t0, "apply_s": took})
        time.sleep(max(0.0, changes[-1]["t0"] + hold - time.monotonic()))
        engines1 = bed.engines() if bed.backend == "userspace" else None
        out, err = client.communicate(timeout=seconds + 30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    report = json.loads(out) if out.strip() else {}
    series = iperf_series(report, start)
    samples = bed.sampler.since(began)
    for change in changes:
        t0 = change["t0"]
        before = tr.bins(samples, t0, -args.before, 0.0, BIN_S)
        after = tr.bins(samples, t0, 0.0, args.after, BIN_S)
        steady = tr.bins(samples, t0, args.after, hold, BIN_S)
        change["complete"] = tr.covers(samples, t0, -args.before, hold, gap_s=0.25)
        new = case["b"] if change["direction"] == "there" else case["a"]
        rtt = 2 * sum(units.parse_duration_us(new[k]) / 1e6 for k in ("delay", "jitter") if new.get(k))
        change["figures"] = tr.transient(before, after, steady, BIN_S, window_s=tr.window_for(rtt)).as_dict()
        change["mbit"] = [round(b * 8 / BIN_S / 1e6, 2) for b in before + after + steady]
        change["tcp"] = [dict(row, t=round(row["t"] - t0, 3)) for row in series
                         if -args.before <= row["t"] - t0 <= hold]
        change["t0"] = round(t0 - start, 3)  # seconds into the flow
    if engines0 is not None:
        changes[0]["engines"] = engine_delta(engines0, engines1)
    if report.get("error"):
        changes[0]["iperf3_error"] = report["error"]
    return changes


def engine_delta(first: dict, last: dict) -> dict:
    """Each engine's counters over a repetition: received, dropped (loss), queue_dropped and
    user_dropped (the kernel's: queue full, socket full), its mean release lateness (us), the
    share of its releases over 1 ms and over 10 ms late, and its largest lateness since it
    started (a maximum cannot be taken over an interval)."""
    out = {}
    for node, row in last.items():
        d = {key: row[key] - first.get(node, {}).get(key, 0) for key in row if key != "lateness_max_us"}
        released = d.pop("released")
        total = d.pop("lateness_total_us")
        d["lateness_mean_us"] = round(total / released, 1) if released > 0 else None
        for key in ("late_1ms", "late_10ms"):
            d[key] = round(d[key] / released, 4) if released > 0 else None
        d["lateness_max_us"] = row.get("lateness_max_us")
        out[node] = d
    return out


def run_cases(bed: Bed, names: list[str], args) -> dict:
    table = cases(args.high, args.low)
    results = {}
    for name in names:
        case = table[name]
        bed.congestion(case["cc"])
        reps = []
        for r in range(args.repeats):
            print(f"{name}: repetition {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
            reps.append(repetition(bed, case, args))
        results[name] = {"case": case, "repetitions": reps}
    return results


def wait_for_free_machine(local) -> None:
    for _ in range(60):
        if not local.list_netbench_netns():
            return
        print("a netbench testbed is up: waiting for it to go", file=sys.stderr, flush=True)
        time.sleep(10)
    raise RuntimeError("a netbench testbed stayed up for 10 minutes")


def measure(args) -> dict:
    from netbench.emulation.executor import choose_backend
    from netbench.state.journal import Journal
    from netbench.state.reset import reset
    from netbench.testbed import netns as local

    state = Path(tempfile.mkdtemp(prefix="netbench-live-"))
    os.environ["NETBENCH_STATE_DIR"] = str(state)  # the engines' files, away from /run/netbench
    journal = Journal(state)
    bed = None
    try:
        wait_for_free_machine(local)
        backend = choose_backend(None if args.backend == "auto" else args.backend).name
        bed = Bed(backend, journal, args)
        names = args.cases.split(",") if args.cases else list(cases(args.high, args.low))
        results = run_cases(bed, names, args)
        return {"meta": meta(args, backend), "cases": results}
    finally:
        if bed is not None:
            bed.close()
        if journal.pending():
            reset(journal)
        shutil.rmtree(state, ignore_errors=True)


def meta(args, backend: str) -> dict:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"backend": backend, "kernel": platform.release(), "cpus": os.cpu_count(), "commit": commit,
            "high": args.high, "low": args.low, "repeats": args.repeats, "before_s": args.before,
            "after_s": args.after, "warm_s": args.warm, "sample_ms": args.sample_ms, "bin_s": BIN_S,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "iperf3": subprocess.run(["iperf3", "--version"], capture_output=True, text=True).stdout.split("\n")[0]}


def vm(args) -> int:
    """Both backends in one boot of make test-kernel's VM; the comparison printed here."""
    kernels = sorted(Path("/boot").glob("vmlinuz-*-amd64"))
    if not kernels or shutil.which("vng", path=str(REPO / ".venv" / "bin")) is None:
        print("needs make test-kernel's VM (qemu, linux-image-amd64, virtme-ng): run make test-kernel once",
              file=sys.stderr)
        return 2
    out = Path(args.vm_out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    passed = [f"--{key}={value}" for key, value in (("repeats", args.repeats), ("high", args.high), ("low", args.low),
                                                     ("sample-ms", args.sample_ms), ("cases", args.cases or ""),
                                                     ("engine-ready-s", 120))
              if value != ""]
    me = f"{REPO}/.venv/bin/python {REPO}/bench/live_changes.py {' '.join(passed)}"
    backends = args.vm_backends.split(",")
    script = (f"cd {REPO} && modprobe br_netfilter; "
              + "".join(f"{me} --backend {b} --json {out}/{b}.json > {out}/{b}.log 2>&1; " for b in backends)
              + f"echo done > {out}/rc")
    env = dict(os.environ, PATH=f"{REPO}/.venv/bin:{os.environ.get('PATH', '')}")
    subprocess.run([str(REPO / ".venv" / "bin" / "vng"), "--run", str(kernels[-1]), "--disable-kvm", "--force-9p",
                    "--memory", "2G", "--cpus", "2", "--rwdir", str(out), "--exec", script], env=env, check=False)
    files = [out / f"{b}.json" for b in backends]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        print(f"the VM wrote no {', '.join(missing)}: see {out}/*.log", file=sys.stderr)
        return 2
    loaded = [json.loads(f.read_text()) for f in files]
    print(rep.compare_table(*loaded) if backends == ["netem", "userspace"] else "\n\n".join(map(rep.table, loaded)))
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="auto", choices=("auto", "netem", "userspace"))
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all): "
                        + ", ".join(cases("HIGH", "LOW")))
    parser.add_argument("--repeats", type=int, default=5, help="fresh flows per case (default 5)")
    parser.add_argument("--high", help="the rate of every case, and the rate case's high (1gbit; with --vm 20mbit: "
                        "the engine under qemu without KVM carries about 20 Mbit/s)")
    parser.add_argument("--low", help="the rate case's low rate (100mbit; with --vm 2mbit)")
    parser.add_argument("--warm", type=float, default=5.0, help="seconds on A before the first change (5)")
    parser.add_argument("--before", type=float, default=2.0, help="seconds seen before each change (2)")
    parser.add_argument("--after", type=float, default=10.0, help="seconds judged after each change (10)")
    parser.add_argument("--sample-ms", type=float, help="the counter's sampling period (10 ms; with --vm 20 ms)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-ready-s", type=float, default=15.0, help="how long an engine may take to start "
                        "(15 s; the VM's runs give it 120)")
    parser.add_argument("--json", type=Path, help="write every record here")
    parser.add_argument("--vm", action="store_true", help="netem and the engine in make test-kernel's VM")
    parser.add_argument("--vm-out", default="bench/results/live_changes_vm", help="the VM's results folder")
    parser.add_argument("--vm-backends", default="netem,userspace", help="with --vm: which backends, in order "
                        "(netem,userspace: the comparison)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("NETEM_JSON", "ENGINE_JSON"),
                        help="print two runs side by side; measures nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for key, host, in_vm in (("high", "1gbit", "20mbit"), ("low", "100mbit", "2mbit"), ("sample_ms", 10.0, 20.0)):
        if getattr(args, key) is None:
            setattr(args, key, in_vm if args.vm else host)
    if args.compare:
        print(rep.compare_table(*(json.loads(p.read_text()) for p in args.compare)))
        return 0
    if os.geteuid() != 0:
        print("run as root (namespaces, qdiscs, iptables)", file=sys.stderr)
        return 2
    if args.vm:
        return vm(args)
    if shutil.which("iperf3") is None:
        print("needs iperf3 (apt-get install iperf3)", file=sys.stderr)
        return 2
    results = measure(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(rep.table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
