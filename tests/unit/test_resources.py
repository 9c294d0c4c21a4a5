"""Resource sampling (--sample-resources): /proc parsing, the sampler, summaries, the
results columns, and one real worker process that samples itself."""

from __future__ import annotations

import csv
import json
import threading

import pytest

from netbench.errors import UsageError
from netbench.jobs import resources
from netbench.model.job import JobSpec, worker_argv
from netbench.jobs.resources import Sample, Sampler, Usage, summarise, totals
from netbench.experiment.store import CSV_COLUMNS, ResultStore, RunResult

STAT = ("4242 (python3 -m net) S 1 4242 4242 0 -1 4194560 52086 0 0 0 "
        "1234 567 0 0 20 0 31 0 99999 3179667456 123456 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0")
STATUS = "Name:\tpython3\nVmPeak:\t 3105144 kB\nVmRSS:\t  482616 kB\nThreads:\t31\n"
NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  900000    5000    0    0    0     0          0         0   900000    5000    0    0    0     0       0          0
  eth0: 1500000    1000    0    0    0     0          0         0  2500000    1200    0    0    0     0       0          0
 data0:   20000      10    0    0    0     0          0         0    30000      12    0    0    0     0       0          0
"""


def test_proc_parsing_by_hand():
    # fields 14 and 15 are utime 1234 and stime 567 ticks; the command name holds spaces
    assert resources.cpu_seconds(STAT, 100) == pytest.approx(18.01)
    assert resources.rss_bytes(STATUS) == 482616 * 1024
    assert resources.interface_bytes(NET_DEV) == (1_520_000, 2_530_000)  # lo left out
    with pytest.raises(ValueError):
        resources.rss_bytes("Name:\tx\n")


def test_read_sample_from_a_proc_folder(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "stat").write_text(STAT)
    (tmp_path / "status").write_text(STATUS)
    (tmp_path / "net" / "dev").write_text(NET_DEV)
    sample = resources.read_sample(tmp_path, clock=lambda: 12.5, ticks_per_s=100)
    assert sample == Sample(time=12.5, cpu_s=pytest.approx(18.01), rss_bytes=482616 * 1024,
                            rx_bytes=1_520_000, tx_bytes=2_530_000)
    assert sample.to_event().kind == "resources"
    assert sample.to_event().rss_bytes == 482616 * 1024


def test_read_sample_of_this_process_is_real():
    before = resources.read_sample()
    sum(i * i for i in range(2_000_000))  # burn some CPU
    after = resources.read_sample()
    assert after.cpu_s > before.cpu_s and after.time > before.time
    assert after.rss_bytes > 10 * 1024 * 1024  # a Python with pytest loaded


def test_sampler_samples_at_start_periodically_and_once_more_on_stop():
    emitted, ticks = [], iter(range(1000))
    seen_three = threading.Event()

    def read() -> Sample:
        t = next(ticks)
        return Sample(time=float(t), cpu_s=t / 2, rss_bytes=100 + t, rx_bytes=10 * t, tx_bytes=20 * t)

    def emit(event: dict) -> None:
        emitted.append(event)
        if len(emitted) >= 3:
            seen_three.set()

    sampler = Sampler(0.01, emit, read).start()
    assert seen_three.wait(5)
    sampler.stop()
    count = len(emitted)
    sampler.stop()  # twice is harmless: no second final sample
    assert len(emitted) == count and count >= 4
    assert [e.time for e in emitted] == sorted(e.time for e in emitted)


def test_sampler_without_proc_reports_nothing():
    def broken() -> Sample:
        raise FileNotFoundError("/proc/self/net/dev")

    emitted: list[dict] = []
    sampler = Sampler(10, emitted.append, broken).start()
    sampler.stop()
    assert emitted == []


def event(role, index, t, cpu, rss, rx, tx):
    return {"event": "resources", "role": role, "worker": index, "time": t, "cpu_s": cpu, "rss_bytes": rss,
            "rx_bytes": rx, "tx_bytes": tx}


def test_summarise_per_process_and_totals():
    events = [event("worker", 1, 10.0, 5.0, 300, 1000, 2000), {"event": "step", "worker": 0},
              event("worker", 0, 10.0, 2.0, 200, 0, 0), event("worker", 0, 14.0, 8.0, 250, 4000, 9000),
              event("worker", 0, 12.0, 4.0, 260, 2000, 4000), event("worker", 1, 14.0, 7.0, 280, 3000, 5000),
              event("ps", 0, 11.0, 1.0, 900, 0, 0)]
    w0, w1, ps0 = summarise(events)[1], summarise(events)[2], summarise(events)[0]
    assert (ps0.key, ps0.samples, ps0.cpu_util) == ("ps0", 1, None)  # one sample: no window
    assert w0 == Usage(role="worker", index=0, samples=3, window_s=4.0, cpu_util=1.5, rss_peak_bytes=260,
                       rx_bytes=4000, tx_bytes=9000)
    assert (w1.cpu_util, w1.rx_bytes, w1.tx_bytes) == (0.5, 2000, 3000)
    assert totals(summarise(events)) == {"cpu_util_mean": 1.0, "rss_peak_bytes": 900, "net_tx_bytes": 12000,
                                         "net_rx_bytes": 6000}
    assert totals(()) == {"cpu_util_mean": None, "rss_peak_bytes": None, "net_tx_bytes": None,
                          "net_rx_bytes": None}


def test_worker_argv_asks_for_sampling_only_when_set():
    assert "--sample-resources" not in worker_argv(JobSpec())
    argv = worker_argv(JobSpec(sample_resources_s=0.5))
    assert argv[argv.index("--sample-resources") + 1] == "0.5"


def result(**kw) -> RunResult:
    base = dict(run_id="r000", profile={"name": "p", "delay_us": 0}, backend="userspace", strategy="allreduce",
                model="mlp", batch_size=32, workers=2, repeat=0, warmup_steps=1, status="ok")
    return RunResult(**{**base, **kw})


def test_results_row_carries_resource_totals(tmp_path):
    usage = summarise([event("worker", 0, 0.0, 0.0, 500, 0, 0), event("worker", 0, 2.0, 1.0, 700, 10, 30)])
    store = ResultStore(tmp_path)
    store.create()
    store.add(result(resources=tuple({"key": u.key, **u.__dict__} for u in usage)))
    store.add(result(run_id="r001"))
    with_sampling, without = store.read_rows()
    assert (with_sampling["cpu_util_mean"], with_sampling["rss_peak_bytes"], with_sampling["net_tx_bytes"]) == \
        ("0.5", "700", "30")
    assert without["cpu_util_mean"] == "" and without["net_rx_bytes"] == ""
    assert json.loads((tmp_path / "runs" / "r000.json").read_text())["resources"][0]["key"] == "worker0"


def test_an_older_results_csv_gains_the_new_columns_and_keeps_its_rows(tmp_path):
    old = [c for c in CSV_COLUMNS if c not in ("cpu_util_mean", "rss_peak_bytes", "net_tx_bytes", "net_rx_bytes")]
    with open(tmp_path / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=old)
        writer.writeheader()
        writer.writerow({c: "" for c in old} | {"run_id": "r000", "images_per_sec": "123.4", "status": "ok"})
    store = ResultStore(tmp_path)
    store.create()
    store.add(result(run_id="r001"))
    rows = store.read_rows()
    assert [r["run_id"] for r in rows] == ["r000", "r001"] and rows[0]["images_per_sec"] == "123.4"
    assert list(rows[0]) == list(CSV_COLUMNS)


def test_a_results_csv_from_elsewhere_is_refused(tmp_path):
    (tmp_path / "results.csv").write_text("when,what\n1,2\n")
    with pytest.raises(UsageError, match="results.csv: columns this netbench does not write"):
        ResultStore(tmp_path).create()
    assert (tmp_path / "results.csv").read_text() == "when,what\n1,2\n"
