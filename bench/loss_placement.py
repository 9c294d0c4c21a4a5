"""Cheng et al.'s loss finding beside netbench's: where the loss sits, the congestion control, the step.

Cheng et al. ("a networking perspective") shaped their cluster with `tc`: 1 parameter server
and 1 worker, MLP on MNIST, batch 32, 1 ms, 1 Gbit/s, and saw about 10 % fewer images/s at 1 %
loss. netbench shapes every node's egress. This runs the study's design (``--strategy ps``:
TensorFlow's parameter-server training, whose coordinator is a third node) with 1 % loss put:

* ``none``: nowhere (the baseline each ratio is taken against);
* ``every``: on every node's egress, as `netbench sweep --loss 1%` puts it;
* ``worker``: on the worker's egress only (a topology: the worker's packets to the server and
  the coordinator lose 1 %, nothing else does);
* ``server``: on the parameter server's egress only;

under each ``--congestion-control`` and ``--batch-sizes``, in ``--repeat`` rounds that alternate
the placements (a sweep of one run each, its order rotated every round, so the machine's drift
falls on all of them), and prints images/s (median of the rounds, range) and each placement's
ratio to its baseline.

    flock /tmp/netbench-bed.lock .venv/bin/python bench/loss_placement.py \\
        [--congestion-control cubic,bbr] [--batch-sizes 32] [--repeat 3] [--out DIR]
    .venv/bin/python bench/loss_placement.py --table DIR    # the table again, from DIR

Exit status: 0 done, 1 a sweep failed (its log is named).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NETBENCH = [str(Path(sys.executable).with_name("netbench"))]
# --strategy ps with 1 worker and 1 server: the worker on n1, the server on n2, the coordinator
# on n3 (the dry run's placement)
NODES = {"worker": "n1", "server": "n2", "coordinator": "n3"}
LINK = {"delay": "1ms", "rate": "1gbit"}
PLACEMENTS = ("none", "every", "worker", "server")


def topology(placement: str, loss: str) -> str:
    """A matrix topology: every pair at LINK, the egress of the nodes `placement` names also
    losing `loss` (none, every node, or the worker's or the server's alone)."""
    nodes = list(NODES.values())
    lossy = {"none": (), "every": nodes}.get(placement, (NODES.get(placement),))
    base = ", ".join(f"{k}: {v}" for k, v in LINK.items())
    rows = []
    for src in nodes:
        cells = ", ".join(f"{dst}: {{{base}{', loss: ' + loss if src in lossy else ''}}}"
                          for dst in nodes if dst != src)
        rows.append(f"  {src}: {{{cells}}}")
    return f"name: loss-{placement}\nnodes: [{', '.join(nodes)}]\nmatrix:\n" + "\n".join(rows) + "\n"


def common(args: argparse.Namespace, cc: str, batch: int) -> list[str]:
    return ["--strategy", "ps", "--ps", "1", "--workers", "1", "--model", "mlp", "--batch-size", str(batch),
            "--warmup", str(args.warmup), "--seconds", args.seconds, "--precision", "off", "--no-predict",
            "--congestion-control", cc]


def sweeps(args: argparse.Namespace, out: Path) -> list[tuple[str, list[str]]]:
    """(folder, argv) for every sweep: round by round, per congestion control and batch, the
    four placements in an order rotated by one each round."""
    for who in PLACEMENTS:
        (out / f"loss-{who}.yaml").write_text(topology(who, args.loss))
    chosen = chosen_placements(args)
    plan = []
    for k in range(args.repeat):
        order = chosen[k % len(chosen):] + chosen[:k % len(chosen)]
        for cc in args.congestion_control.split(","):
            for batch in (int(b) for b in args.batch_sizes.split(",")):
                for who in order:
                    plan.append((f"{who}-{cc}-b{batch}/r{k}",
                                 ["--topology", str(out / f"loss-{who}.yaml")] + common(args, cc, batch)))
    return plan


def chosen_placements(args: argparse.Namespace) -> tuple[str, ...]:
    names = set(args.placements.split(",")) | {"none"}
    unknown = names - set(PLACEMENTS)
    if unknown:
        raise SystemExit(f"--placements: unknown {', '.join(sorted(unknown))} (choose from {', '.join(PLACEMENTS)})")
    return tuple(p for p in PLACEMENTS if p in names)


def rates(folder: Path) -> list[float]:
    """images/sec of every finished run in the rounds under `folder` (r0/, r1/, ...)."""
    out = []
    for path in sorted(folder.glob("r*/results.csv")):
        with open(path, newline="") as fh:
            out += [float(row["images_per_sec"]) for row in csv.DictReader(fh)
                    if row.get("status") == "ok" and row.get("images_per_sec")]
    return out


def table(out: Path, args: argparse.Namespace) -> str:
    lines = ["| congestion control | batch | 0 % loss | 1 % on every egress | ratio | 1 % on the worker's "
             "egress | ratio | 1 % on the server's egress | ratio |", "|---|---:|---|---|---:|---|---:|---|---:|"]
    for cc in args.congestion_control.split(","):
        for batch in args.batch_sizes.split(","):
            tag = f"{cc}-b{batch}"
            lossy = {who: rates(out / f"{who}-{tag}") for who in PLACEMENTS}
            base = lossy["none"]
            cells = [cc, batch, spread(base)]
            for who in PLACEMENTS[1:]:
                cells += [spread(lossy[who]), ratio(lossy[who], base)]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def ratio(values: list[float], base: list[float]) -> str:
    return f"{statistics.median(values) / statistics.median(base):.2f}" if values and base else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--congestion-control", default="cubic,bbr")
    parser.add_argument("--batch-sizes", default="32")
    parser.add_argument("--loss", default="1%")
    parser.add_argument("--placements", default=",".join(PLACEMENTS),
                        help="which of none, every, worker, server (none, the baseline, always runs)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seconds", default="15s")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "loss_placement")
    parser.add_argument("--table", type=Path, metavar="DIR", help="print the table of an earlier run's DIR")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table, args))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, sweep in sweeps(args, args.out):
        folder = args.out / name
        started = time.monotonic()
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f"{folder.name}.log", "w") as log:
            rc = subprocess.call(NETBENCH + ["sweep", *sweep, "--output", str(folder)], stdout=log,
                                 stderr=subprocess.STDOUT, cwd=ROOT)
        print(f"{name}: rc {rc} in {time.monotonic() - started:.0f} s", flush=True)
        if rc != 0:
            print(f"sweep {name} failed: see {folder.parent / (folder.name + '.log')}", file=sys.stderr)
            return 1
    print(table(args.out, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
