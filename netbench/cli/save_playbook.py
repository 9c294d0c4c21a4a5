"""`netbench sweep ... --save-playbook FILE`: the sweep's playbook written, loaded back and its runs
checked against the sweep's before it is kept (model/playbook_save.py maps the flags)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource

from netbench import console
from netbench.errors import UsageError

# the sweep's flags that are flags of `netbench run` too (or only of the sweep), not playbook keys:
# how a design is run, not what it measures
RUN_FLAGS = {"output": "--output", "append": "--append", "verify_points": "--verify",
             "sample_resources": "--sample-resources", "predict": "--predict", "recalibrate": "--recalibrate",
             "metrics_port": "--metrics-port", "metrics_address": "--metrics-address",
             "metrics_wait": "--metrics-wait", "isolate": "--isolate/--launch", "launch_order": "--order",
             "settle_text": "--settle", "settle_steps": "--settle-steps",
             "settle_round_trips": "--settle-round-trips", "inventory": "--inventory",
             "insecure_host_keys": "--insecure-host-keys", "takeover": "--takeover"}

save_option = click.option(
    "--save-playbook", "save_playbook", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
    help="Write the playbook (YAML) that reproduces this sweep, key by key, checked to give the same runs; "
         "with --dry-run write it and print the plan only, else write it and run the sweep. "
         "docs/guide/playbooks.md, From a sweep to a playbook.")


def save(path: Path, config, levels, params: dict) -> None:
    """Write the playbook of the sweep `config` (its flags: `params`, click's) to `path`, after
    checking that it loads and expands to the sweep's runs; refuse one it cannot express."""
    from netbench.model import compute, design, playbook, playbook_save
    from netbench.yamlfile import dump_yaml

    if path.suffix not in (".yaml", ".yml"):
        raise UsageError(f"flag --save-playbook: {path} is not a .yaml file", hint="e.g. --save-playbook grid.yaml")
    if not path.parent.is_dir():
        raise UsageError(f"flag --save-playbook: no folder {path.parent} to write {path.name} in",
                         hint=f"create it first: mkdir -p {path.parent}")
    name = path.stem if playbook.SAFE_NAME.fullmatch(path.stem) else "sweep"
    factors = compute.parse_flag(params.get("cpus_flags") or (), "cpus", "--cpus") + \
        compute.parse_flag(params.get("step_delay_flags") or (), "step_delay", "--step-delay")
    schedules = tuple(Path(p.strip()) for value in params.get("schedule_files") or () for p in value.split(","))
    scales = ()
    if params.get("scale"):
        from netbench.cli.sweep_topology import parse_scales

        scales = tuple(parse_scales(params["scale"]))
    spec = playbook_save.SweepSpec(
        job=config.job, workers=config.workers, repeat=params["repeat"], delay_us=levels.delay_us,
        rate_bps=levels.rate_bps, loss=levels.loss, jitter_us=levels.jitter_us, compute=factors,
        profile=params.get("profile_file"), schedules=schedules, topology=params.get("topology_file"),
        scales=scales, seed=config.seed, backend=config.backend, startup_timeout_s=config.timeouts.startup_s,
        step_timeout_s=config.timeouts.step_s, congestion_control=config.congestion_control,
        order_seed=config.order_seed)
    try:
        mapping = playbook_save.playbook_mapping(spec, path.parent, name)
    except playbook_save.SaveRefused as exc:
        raise UsageError(f"{exc} (--save-playbook)", exc.hint) from None
    try:  # loaded as `netbench run` will load it, from the playbook's folder
        book = playbook.playbook_from_mapping(mapping, str(path), base_dir=path.parent)
        runs = design.expand(book, book.seed, sample_resources_s=config.job.sample_resources_s)
    except UsageError as exc:
        raise UsageError(f"flag --save-playbook: the playbook would not load ({exc.message})", exc.hint) from None
    first = config.runs[0].index if config.runs else 0
    book_runs = [replace(r, index=r.index + first) for r in runs]
    unswept = not (levels.delay_us or levels.rate_bps or levels.loss or levels.jitter_us)
    why = playbook_save.first_difference(config.runs, book_runs, unswept=unswept)
    if why is not None:
        raise UsageError(f"flag --save-playbook: the playbook would not reproduce this sweep: {why}")
    path.write_text(dump_yaml(mapping), encoding="utf-8")
    ctx = click.get_current_context(silent=True)
    kept = [flag for key, flag in RUN_FLAGS.items()
            if ctx is not None and key in ctx.params and ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE]
    runs_text = f"{len(runs)} run{'' if len(runs) == 1 else 's'}"
    console.info(f"saved playbook {path} ({runs_text}); run it with: netbench run {path}"
                 + (f" (with {', '.join(kept)} again: flags of the run, not playbook keys)" if kept else ""))
