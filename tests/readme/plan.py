"""How each shipped example runs in the docs tier: the exceptions, each with its reason.

Every example found in the ```sh blocks of README.md and docs/ and in the --help texts
(tests/readme_examples.py) runs for real, in its block's order, unless it is named here. An entry
names a command as shown, so one entry covers that command wherever it is shown. A training command (a sweep or a
playbook run) runs shortened (readme_examples.shorten), or as a dry run where DRY says why (its kind then
runs for real in another example).
tests/unit/test_readme_examples.py fails when an entry here names no shipped example any more.
"""

from __future__ import annotations

SSH = "needs an inventory of SSH hosts (tests/ssh runs these commands against sshd hosts in namespaces)"
AGENT = ("the host's side of the SSH protocol: the controller runs it on a host and feeds it JSON "
         "(tests/ssh and tests/unit/test_node_serve.py cover it)")

SLURM = ("needs a Slurm cluster: tests/slurm starts a one-node one and submits a campaign to it for real, "
         "cancels a task, submits again and reports the merged campaign")

# command (as shown, comment removed) -> why it is not run here
NOT_RUNNABLE = {
    "make demo": "a make target: installs Debian packages and a venv first (it runs `netbench sweep "
                 "--latency 1,10,100ms`, whose kind runs here as the --metrics-port sweep)",
    "make test": "a make target: the suite that runs this tier",
    "make install": "a make target: installs Debian packages and a venv (the suite runs in what it installed)",
    "netbench provision --inventory hosts.yaml": SSH,
    "netbench run playbooks/smoke.yaml --inventory hosts.yaml": SSH,
    "netbench sweep --inventory hosts.yaml --bandwidth 100,1000mbit": SSH,
    "netbench submit playbooks/ps-check.yaml --slurm --shards 2 --partition compute --time 1:00:00": SLURM,
    "netbench submit playbooks/ps-check.yaml --slurm --shards 2": SLURM,
    "scancel 4711_1": SLURM,
    "netbench status results/ps-check": SLURM,
    "netbench report results/ps-check": SLURM,
    "netbench node apply --json --lease 60 < plan.json": AGENT,
    "netbench node info --interface eth1": AGENT,
    "netbench node lease-watch": AGENT,
    "netbench node reset --json": AGENT,
    "netbench node serve < requests.jsonl": AGENT,
    "netbench node show --json --interface eth1": AGENT,
    "netbench node task --role worker0 --env TF_CONFIG={...} -- python -m netbench.jobs.worker": AGENT,
    "netbench sweep --framework torch --device cuda --gpus-per-node 1 --workers 2 --latency 1,20ms":
        "needs GPUs (none here; refused with a hint: tests/unit/test_ranks.py); bench/gpu_check.py runs it on a GPU machine",
    ".venv/bin/pip install -c constraints.txt torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu":
        "downloads PyTorch's CPU build from PyTorch's index (no network here; make install finds it on disk)",
    "NETBENCH_CACHE_DIR=/var/cache/netbench netbench sweep --latency 1,10ms":
        "where the calibration cache lives (tests/unit/test_calibration_cache.py); a plain latency sweep runs in the quick start",
    ".venv/bin/python bench/sweep_efficiency.py results/isolate results/launch":
        "a benchmark over two folders of the 6-point grid (make bench runs it, minutes)",
    ".venv/bin/python bench/sweep_efficiency.py --run --latency 1,10,50ms --bandwidth 100mbit,1gbit":
        "a benchmark that runs the 6-point grid twice (make bench runs it, minutes)",
    ".venv/bin/python bench/least_window.py":
        "a simulation of 7 x 3 x 500 windows (seconds); tests/unit/test_least_window.py runs it short",
    "flock /tmp/netbench-bed.lock .venv/bin/python bench/loss_placement.py":
        "a benchmark of 24 sweeps (10 minutes here); tests/unit/test_loss_placement.py checks its topologies, "
        "plan and table, and per-pair loss trains for real in the Per-pair topologies block",
    "flock /tmp/netbench-bed.lock .venv/bin/python bench/loss_placement.py --congestion-control cubic "
    "--batch-sizes 1024 --placements every,worker": "the same benchmark at batch 1024 (9 sweeps, 4 minutes here)",
    ".venv/bin/python bench/step_noise.py results/repeated --coverage":
        "a study of a folder of repeated points (the 6-point grid 5 times: minutes); "
        "tests/unit/test_run_coverage.py runs it on a folder of its own",
}

EXCHANGE = "the exchange strategies train for real in tests/tf/test_algorithms_tf.py"
COMPUTE = "CPU limits train for real in tests/tf/test_compute_tf.py; a --step-delay sweep runs here for real"
RANKS = "2 nodes x 2 ranks (torch ring and hierarchical, TensorFlow, torchrun.sh) train for real in tests/tf/test_ranks_tf.py"
GRID = "the 6-point grid at 2 % takes minutes: bench/sweep_efficiency.py measures it"
REUSE = "a reused calibration and --recalibrate run for real in tests/tf/test_root_sweep.py's end-to-end sweep"
CONGESTION = "--congestion-control is set and read back for real in tests/root/test_congestion_root.py"
SETTLE = "settles by the link run for real in tests/tf/test_launch_tf.py (each point's settle_reason)"
SAME_LATENCY = "a plain latency sweep: that kind runs for real as README.md's quick start (the tutorial's)"
# training commands run as --dry-run (flags and plan checked, nothing trained) -> why; every other
# training example is trained for real, shortened
DRY = {
    # this round's guides: each kind trains for real in a test of its own (kept dry here for the suite's time)
    "netbench sweep --strategy ps-sync --workers 2 --data fashion-mnist --train-steps 200 --latency 1,50ms": EXCHANGE,
    "netbench sweep --strategy ps-ssp --workers 4 --step-timeout 30 --latency 1ms": EXCHANGE,
    "netbench sweep --strategy ps-async --pipeline 16 --workers 2 --data fashion-mnist --train-steps 200 --latency 1,50ms":
        EXCHANGE,
    "netbench sweep --strategy ps-sync --workers 3 --backup-workers 1 --latency 1ms --data fashion-mnist "
    "--train-steps 300 --eval-every 100": "backup workers train for real in tests/tf/test_backup_workers_tf.py",
    "netbench sweep --latency 1ms --cpus n2=max,0.5,0.2": COMPUTE,
    "netbench sweep --latency 1,10ms --cpus n2=max,0.2 --step-delay n3=0,20ms --workers 3": COMPUTE,
    "netbench sweep --latency 1ms --cpus 0.5": COMPUTE,
    "netbench sweep --latency 1ms --cpus n2=max,0.5,0.2 --step-delay n2=0,40ms": COMPUTE,
    "netbench sweep --topology profiles/topologies/two-regions-slow.yaml --workers 4":
        "a topology sweep trains in the Per-pair topologies block; this one's compute: is checked by its plan",
    "netbench sweep --schedule profiles/schedules/straggler.yaml --latency 1ms --seconds 30 --warmup 5":
        "capacity steps in a schedule run for real in tests/root/test_compute_root.py and tests/unit/test_compute_steps.py",
    "netbench sweep --framework torch --latency 1,20ms --workers 4 --ranks-per-node 2": RANKS,
    "netbench sweep --latency 1,20ms --workers 4 --ranks-per-node 2 -- sh examples/torchrun.sh": RANKS,
    "netbench sweep --framework torch --latency 20ms --bandwidth 100mbit --workers 4 --ranks-per-node 2 "
    "--collective hierarchical --sample-resources 0.1": RANKS,
    "netbench sweep --latency 1,10,50ms --bandwidth 100mbit,1gbit --precision 2%": GRID,
    "netbench sweep --latency 1,10,50ms --bandwidth 100mbit,1gbit --precision 2% --repeat 5 --output results/repeated":
        GRID,
    "netbench sweep --latency 1,10ms --recalibrate": REUSE,
    "netbench run playbooks/smoke.yaml --recalibrate": REUSE,
    "netbench sweep --latency 1,10ms --congestion-control bbr": CONGESTION,
    "netbench sweep --latency 1,10ms --congestion-control host": CONGESTION,
    "netbench run playbooks/smoke.yaml --congestion-control reno --output results/smoke-reno": CONGESTION,
    "netbench sweep --latency 1,10,50ms --bandwidth 100mbit,1gbit --settle-round-trips 4": SETTLE,
    "netbench sweep --latency 1,10,50ms --settle 1.5s --settle-round-trips 0": SETTLE,
    "netbench sweep --latency 1,10,100ms --bandwidth 250,1000mbit --repeat 3":
        "18 runs (3 x 2 points x 3 repeats; 6 in two launches even at --repeat 1); a latency sweep "
        "runs for real in README.md's quick start",
    "netbench sweep --latency 1,10,100ms --repeat 2": SAME_LATENCY,
    "netbench sweep --latency 1,10,100ms --metrics-port 9464 --metrics-address 0.0.0.0":
        "the --metrics-port sweep above runs for real; this one adds only the bind address",
    "netbench sweep --schedule profiles/schedules/spike.yaml --latency 10ms":
        "a --schedule sweep runs for real in the home page's commands at a glance",
    # kinds trained for real by a test of their own in tests/tf (kept dry here for the suite's time)
    "netbench sweep --strategy ps --ps 1 --workers 3 --bandwidth 100,1000mbit":
        "ps sweeps train for real in tests/tf/test_root_strategies.py",
    # docs/validation.md's studies' designs: each kind trains for real in a test of its own
    "netbench sweep --strategy ps --ps 1 --workers 1 --model mlp --batch-size 32 --bandwidth 1gbit "
    "--latency 1,10,100ms": "ps sweeps train for real in tests/tf/test_root_strategies.py",
    "netbench sweep --strategy ps --ps 1 --workers 1 --model mlp --batch-size 32 --latency 1ms "
    "--bandwidth 500mbit,1gbit": "ps sweeps train for real in tests/tf/test_root_strategies.py",
    "netbench sweep --strategy ps-sync --workers 2 --model mlp --batch-size 32 --latency 10,200ms "
    "--step-delay 0,200ms": EXCHANGE,
    "netbench sweep --strategy allreduce --workers 2 --model mlp --batch-size 32 --bandwidth 1gbit":
        "an all-reduce sweep trains for real in README.md's quick start",
    "netbench sweep --strategy allreduce-accum --accum-steps 4 --workers 2 --model mlp --batch-size 32 "
    "--bandwidth 1gbit": "allreduce-accum trains for real in tests/tf/test_root_strategies.py",
    "netbench sweep --strategy ps-ssp --staleness 3 --data fashion-mnist --train-steps 200 --latency 1,50ms":
        "every algorithm trains on Fashion-MNIST for real in tests/tf/test_algorithms_tf.py",
    "netbench run playbooks/algorithms-check.yaml":
        "every algorithm trains on Fashion-MNIST for real in tests/tf/test_algorithms_tf.py (this "
        "playbook trains for minutes)",
    "netbench sweep --latency 1,20ms --workers 2 -- python examples/torch_ddp.py":
        "examples/torch_ddp.py runs for real under this sweep in tests/tf/test_user_jobs_tf.py",
    "netbench sweep --latency 1,20ms --workers 2 -- python examples/keras_fit.py":
        "examples/keras_fit.py runs for real under this sweep in tests/tf/test_user_jobs_tf.py",
    "netbench sweep --latency 1,20ms --workers 2 -- sh examples/torchrun.sh":
        "examples/torchrun.sh runs for real under a sweep in tests/tf/test_user_jobs_tf.py",
    "netbench sweep --latency 1,20ms --workers 2 --images-per-step 64 --step-regex "
    "'step (?P<step>\\d+) took (?P<ms>[\\d.]+) ms' -- python examples/plain_steps.py":
        "examples/plain_steps.py runs for real under --step-regex sweeps in tests/root/test_user_command_root.py",
    "netbench sweep --bandwidth 1gbit,20mbit --workers 2 --warmup 2 --seconds 5 -- python examples/ring_bytes.py":
        "a job that reports no steps (examples/ring_bytes.py) runs for real in tests/root/test_user_command_root.py",
    "netbench sweep --framework torch --model mlp --latency 1,20ms --workers 2":
        "this sweep runs for real in tests/tf/test_torch_tf.py",
    "netbench sweep --framework torch --strategy allreduce-accum --accum-steps 4 --bandwidth 100,1000mbit":
        "torch's strategies run for real in tests/tf/test_torch_tf.py",
    "netbench sweep --framework torch --model cnn --data /usr/share/datasets/fashion-mnist --latency 1,10ms":
        "torch sweeps run for real in tests/tf/test_torch_tf.py",
    "netbench sweep --framework torch --latency 1,20ms --workers 4 --ranks-per-node 2 --collective hierarchical":
        "two nodes of two torch ranks, ring and hierarchical, train for real in tests/tf/test_ranks_tf.py",
    "netbench run playbooks/frameworks.yaml --isolate":
        "18 runs; both frameworks' sweeps run for real in tests/tf/test_torch_tf.py",
}

# examples run with the step model on (the suite turns it off with NETBENCH_PREDICT=0) -> why
PREDICT = {
    "netbench sweep --latency 1,10,100ms --output results/first":
        "the getting-started tutorial shows its predictions, and its report's step-time figure (about 12 s of "
        "calibration, or none where a calibration of this machine is cached)",
}

# placeholder words in examples -> what the tier runs instead (a page's shell blocks hold none:
# tests/unit/test_docs_claims.py; a pattern to fill in is a block titled as a template)
PLACEHOLDERS: dict[str, str] = {}

# optional flags shown in brackets that the tier leaves out -> why (the others are run)
LEFT_OUT: dict[str, str] = {}

# commands run before a block's examples (the state the block's text assumes) -> block
PRELUDE = {
    "Give each pair of nodes its own link": ["netbench testbed up --nodes 8"],  # world.yaml names n1..n8
    "Emulation backends": ["netbench testbed up --nodes 3"],  # verify --from n2 --to n3
    "netbench testbed down": ["netbench testbed up --nodes 2"],
    "netbench testbed show": ["netbench testbed up --nodes 2"],
    "netbench exec": ["netbench testbed up --nodes 2"],
    "netbench apply": ["netbench testbed up --nodes 4"],  # two-regions.yaml names n1..n4
    "netbench show": ["netbench testbed up --nodes 2", "netbench apply --latency 10ms"],
    "netbench verify": ["netbench testbed up --nodes 4"],
}

MEASURED = "a measurement on a shared 2-core machine may fall outside its tolerance: 1 is documented"
# exit statuses other than 0 that an example documents -> command prefix
STATUSES = {"netbench verify": ({0, 1}, MEASURED),
            "netbench apply --latency 10ms --bandwidth 100mbit && netbench verify": ({0, 1}, MEASURED)}

# what an example's output must show, where the README or --help shows it (regular expressions)
OUTPUT = {
    "netbench testbed up --nodes 3": [r"n1", r"n3"],
    "netbench testbed show --json": [r'"name"', r'"netns"', r'"address"'],
    "netbench exec n1 -- ping -c 3 n2": [r"3 packets transmitted, 3 received"],
    "netbench profile check profiles/wan.yaml": [r"ok"],
    "netbench sweep --latency 1,10,100ms --dry-run": [r"d1ms", r"d10ms", r"d100ms"],
    "netbench sweep --latency 1,50ms --precision 2% --dry-run": [r"32 measured steps at least, until ±2 %"],
    "netbench sweep --latency 1,50ms --precision 2% --steps 100 --dry-run": [r"100 measured steps at least"],
    "netbench sweep --latency 1,50ms --precision off --dry-run": [r"\+ 30 measured steps;"],
    "netbench run grid.yaml --dry-run": [r"6 runs = 6 points x 1 repetitions, order as-written, seed 0"],
    "netbench sweep --latency 1,10,100ms --metrics-port 9464": [r"http://127\.0\.0\.1:\d+/metrics"],
    "netbench sweep --bandwidth 100mbit --latency 1ms --precision 2% --congestion-control cubic":
        [r"TCP congestion control on every node: cubic \(asked for this sweep: cubic\)"],
}

# an example whose printed table must be the one a page shows -> (the page, the words just before
# that shown output, how many leading cells of each shown row must begin a printed row): the
# README's demo table is a real run's, so its figures are not compared, only its columns and each
# row's point (run, profile, delay, rate, loss, rep)
TABLES = {"netbench sweep --latency 1,10,100ms --output results/first": ("README.md", "prints a table such as:", 6)}

# files an example says it writes
FILES = {
    "netbench report results/smoke": ["results/smoke/report/report.md", "results/smoke/report/report.html"],
    "netbench report results/smoke --output figs --level 90": ["figs/report.md"],
    "netbench report results/first": ["results/first/report/report.md", "results/first/report/throughput-latency.png",
                                      "results/first/report/steptime-latency.png"],
    "netbench show --output held.yaml && netbench apply --topology held.yaml": ["held.yaml"],
    "netbench sweep --latency 1,10,100ms --bandwidth 100mbit,1gbit --save-playbook grid.yaml --dry-run": ["grid.yaml"],
}
