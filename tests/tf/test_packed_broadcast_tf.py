"""The workers' start-up takes the chief's initial weights in one packed collective
(harness.strategy.initial_values_made_locally + broadcast_from_chief), as TF's broadcast of
each variable gave them (tier tf: two real TensorFlow processes on loopback)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from netbench.jobs import worker
from tests.tf.test_worker_tf import _free_ports
from tests.unit.test_worker import _env

pytestmark = pytest.mark.tf

# each worker seeds its initial values differently: only a broadcast makes them the chief's
SCRIPT = """
import json, sys
from netbench.jobs.harness import strategy as strategies
from netbench.jobs.harness.models import build_model
import argparse
tf, keras = strategies.import_tf(argparse.Namespace(threads=0))
mwms = strategies.make_strategy(tf, "allreduce", 60)
task, _ = strategies.cluster_position(mwms)
keras.utils.set_random_seed(100 + task)
with mwms.scope(), strategies.initial_values_made_locally(mwms):
    model = build_model(keras, "mlp", (784,), 10)
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
    optimizer.build(model.trainable_variables)
own = float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.variables))
sent = strategies.broadcast_from_chief(tf, mwms, [*model.variables, *optimizer.variables])
after = float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.variables))
print(json.dumps({"task": task, "own": own, "after": after, "sent": sent}))
"""


def test_every_worker_starts_from_the_chiefs_weights_after_one_packed_collective(tmp_path):
    addrs = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs = []
    try:
        for i in range(2):
            with open(tmp_path / f"w{i}.err", "w") as err:
                procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=err,
                                              env=_env(worker.make_tf_config(addrs, i)), text=True))
        deadline = time.monotonic() + 240
        outs = [json.loads(p.communicate(timeout=max(1, deadline - time.monotonic()))[0].splitlines()[-1])
                for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    chief, other = sorted(outs, key=lambda o: o["task"])
    assert chief["own"] != other["own"]  # seeded apart: without the broadcast they would differ
    assert chief["after"] == chief["own"] and other["after"] == pytest.approx(chief["own"], rel=1e-9)
    assert chief["sent"] == other["sent"] >= 6  # the MLP's kernels and biases (and the optimizer's floats)
