"""bench/sweep_efficiency.py's fixed costs: calibration, start-ups, settles, least windows,
precision extensions and the windows that ran to the cap, from synthetic records."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sweep_efficiency.py"


def bench():
    spec = importlib.util.spec_from_file_location("sweep_efficiency", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(run_id, launch, started, ended, first_step, steps, step_s, reached=True, settle=None, status="ok"):
    events = [{"event": "step", "phase": "measured", "role": "worker", "worker": 0,
               "start": first_step + i * step_s, "end": first_step + (i + 1) * step_s} for i in range(steps)]
    events += [{"event": "step", "phase": "measured", "role": "worker", "worker": 1, "start": 0.0, "end": 999.0}]
    return {"run_id": run_id, "launch": launch, "started": started, "ended": ended, "events": events,
            "strategy": "allreduce", "status": status, "precision_reached": reached, "settle_s": settle}


def test_the_fixed_costs_split_a_folders_wall_time():
    manifest = {"job": {"steps": 30}, "calibration": {"seconds": 7.5, "collective": {"2": {"reused": False}},
                                                     "compute": {"mlp": {"reused": True}}}}
    records = [  # a launch of two points: the first pays the start-up, the second a settle
        record("r000", 0, 1000.0, 1016.0, 50.0, 100, 0.1),  # 10 s window: 3 s least, 7 s extension; 6 s before it
        record("r001", 0, 1016.0, 1080.0, 70.0, 600, 0.1, reached=False, settle=1.5),  # 60 s at the cap
        record("r002", None, 1080.0, 1090.0, 200.0, 30, 0.1),  # a point of its own: 7 s start-up, 3 s least
    ]
    costs = bench().fixed_costs(records, manifest)
    assert costs == {"calibration_s": 7.5, "calibrations_reused": 1, "startup_s": 13.0, "settle_s": 1.5,
                     "least_window_s": 9.0, "extension_s": 64.0, "cap_s": 60.0}


def test_a_folder_without_calibration_or_steps_costs_what_it_took():
    costs = bench().fixed_costs([record("r000", None, 0.0, 5.0, 0.0, 0, 0.1, status="failed")], {})
    assert costs["startup_s"] == 5.0 and costs["calibration_s"] == 0.0 and costs["least_window_s"] == 0.0
