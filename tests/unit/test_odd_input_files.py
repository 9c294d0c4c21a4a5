"""Odd and hostile input in files: profiles, schedules, traces, topologies, playbooks and a
results folder someone else wrote. Each is refused in one line naming the file and the key (or
the flag), non-zero exit, no traceback, nothing applied, within seconds (the helpers of
test_odd_input_cli)."""

from __future__ import annotations

import pytest

from tests.unit.test_odd_input_cli import _case, _refused

PB = "name: odd\nsteps: 5\nwarmup: 1\n"
FIXED = "fixed: {model: mlp, batch: 32, workers: 2}\n"


def _pb(text: str, *fragments: str, files=None, case_id: str):
    return _case(case_id, ("run", "pb.yaml", "--dry-run", "--output", "{dir}/out"), ["pb.yaml", *fragments],
                 {"pb.yaml": PB + text, **(files or {})})


FILE_CASES = [
    # ---- unit traps in every kind of file, with both readings
    _case("profile-loss-bare", ("profile", "check", "p.yaml"), ["p.yaml", "loss", "0.5%", "50%"],
          {"p.yaml": "name: p\ndelay: 10ms\nloss: 0.5\n"}),
    _case("profile-loss-bare-one", ("profile", "check", "p.yaml"), ["p.yaml", "loss", "1%", "100%"],
          {"p.yaml": "name: p\nloss: 1\n"}),
    _case("profile-rate-mbps", ("profile", "check", "p.yaml"), ["p.yaml", "rate", "100mbit", "800mbit"],
          {"p.yaml": "name: p\nrate: 100mbps\n"}),
    _case("profile-delay-bare", ("profile", "check", "p.yaml"), ["p.yaml", "delay", "10us", "10ms"],
          {"p.yaml": "name: p\ndelay: 10\n"}),
    _case("profile-reorder-bare", ("profile", "check", "p.yaml"), ["p.yaml", "reorder", "0.25%", "25%"],
          {"p.yaml": "name: p\ndelay: 10ms\nreorder: 0.25\n"}),
    _case("apply-profile-rate-gbps", ("apply", "--dry-run", "p.yaml"), ["p.yaml", "rate", "8gbit"],
          {"p.yaml": "name: p\nrate: 1gbps\n"}),
    _case("schedule-step-loss-bare", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "loss", "0.5%", "50%"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\nsteps:\n  - {at: 0s, delay: 5ms}\n  - {at: 1s, loss: 0.5}\n"}),
    _case("schedule-profile-rate-mbps", ("sweep", "--dry-run", "--schedule", "s.yaml"),
          ["s.yaml", "rate", "10mbit", "80mbit"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms, rate: 10mbps}\nsteps:\n  - {at: 0s, delay: 5ms}\n"}),
    _case("schedule-at-bare", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "at"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\nsteps:\n  - {at: 0s, delay: 5ms}\n  - {at: 2, delay: 9ms}\n"}),
    _case("trace-loss-nan", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["t.csv", "row 2", "loss_pct"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\ntrace: t.csv\n",
           "t.csv": "time_s,delay_ms,loss_pct\n0,5,nan\n"}),
    _case("trace-rate-negative", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["t.csv", "row 3", "rate_mbit"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\ntrace: t.csv\n",
           "t.csv": "time_s,rate_mbit\n0,100\n1,-5\n"}),
    _case("trace-loss-over", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["loss"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\ntrace: t.csv\n", "t.csv": "time_s,loss_pct\n0,150\n"}),
    _case("topology-loss-bare", ("sweep", "--dry-run", "--topology", "t.yaml"), ["t.yaml", "loss", "0.1%", "10%"],
          {"t.yaml": "name: t\ngroups: {a: [n1], b: [n2]}\nlinks:\n  a-b: {delay: 25ms, loss: 0.1}\n"}),
    _case("topology-rate-mbps", ("sweep", "--dry-run", "--topology", "t.yaml"), ["t.yaml", "rate", "800mbit"],
          {"t.yaml": "name: t\ngroups: {a: [n1], b: [n2]}\nlinks:\n  a-b: {delay: 25ms, rate: 100MBps}\n"}),
    *[_case(f"scale-{v}", ("sweep", "--dry-run", "--topology", "t.yaml", "--scale", v), ["--scale"],
            {"t.yaml": "name: t\ngroups: {a: [n1], b: [n2]}\nlinks:\n  a-b: {delay: 25ms}\n"})
      for v in ("nan", "1,inf", "-1", "0", "1e9", "two", "1,1")],
    *[_pb(f"topology: t.yaml\nfactors: {{scale: [1, {v}]}}\n{FIXED}", "factors.scale", case_id=f"playbook-scale-{v}",
          files={"t.yaml": "name: t\ngroups: {a: [n1], b: [n2]}\nlinks:\n  a-b: {delay: 25ms}\n"})
      for v in (".nan", ".inf", "-1", "0", "'2'")],
    _pb("factors: {loss: [0%, 0.5]}\n" + FIXED, "factors.loss", "0.5%", "50%", case_id="playbook-loss-bare"),
    _pb("factors: {bandwidth: [100mbps]}\n" + FIXED, "factors.bandwidth", "100mbit", "800mbit",
        case_id="playbook-bandwidth-mbps"),
    _pb("factors: {latency: [1ms]}\nfixed: {model: mlp, workers: 2, loss: 0.01}\n", "fixed.loss", "0.01%", "1%",
        case_id="playbook-fixed-loss-bare"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "precision: 0.02\n", "precision", "0.02%", "2%",
        case_id="playbook-precision-bare"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "max_seconds: 10\n", "max_seconds", case_id="playbook-max-seconds-bare"),
    # ---- the algorithms' settings: NaN, infinity, negative, out of range, in every float key
    *[_pb(f"factors: {{strategy: [easgd]}}\n{FIXED}algorithm: {{elastic_alpha: {v}}}\n", "elastic_alpha",
          case_id=f"playbook-elastic-alpha-{v}") for v in (".nan", ".inf", "-0.5", "0", "1.5", "'0.5'")],
    *[_pb(f"factors: {{strategy: [gosgd]}}\n{FIXED}algorithm: {{gossip_p: {v}}}\n", "gossip_p",
          case_id=f"playbook-gossip-p-{v}") for v in (".nan", "-.inf", "-0.1", "2")],
    *[_pb(f"factors: {{gossip_p: [0.1, {v}]}}\nfixed: {{model: mlp, workers: 2, strategy: gosgd}}\n",
          "factors.gossip_p", case_id=f"playbook-gossip-p-factor-{v}") for v in (".nan", "1.01", "-0.1")],
    *[_pb(f"factors: {{elastic_alpha: [{v}]}}\nfixed: {{model: mlp, workers: 2, strategy: easgd}}\n",
          "factors.elastic_alpha", case_id=f"playbook-elastic-alpha-factor-{v}") for v in (".nan", ".inf", "0")],
    *[_pb(f"factors: {{strategy: [ps-ssp]}}\n{FIXED}algorithm: {{staleness: {v}}}\n", "staleness",
          case_id=f"playbook-staleness-{v}") for v in ("-1", ".nan", "1.5", "1e9")],
    *[_pb(f"factors: {{strategy: [easgd]}}\n{FIXED}algorithm: {{tau: {v}}}\n", "tau",
          case_id=f"playbook-tau-{v}") for v in ("0", "-4", ".inf")],
    *[_pb(f"factors: {{latency: [1ms]}}\n{FIXED}train_steps: 50\ntarget_accuracy: {v}\n", "target_accuracy",
          case_id=f"playbook-target-accuracy-{v}") for v in (".nan", "0", "1.5", "-.inf")],
    _pb("factors: {latency: [1ms]}\n" + FIXED + "precision: .nan\n", "precision", case_id="playbook-precision-nan"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "precision: 200%\n", "precision", case_id="playbook-precision-200"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "precision: -1%\n", "precision", case_id="playbook-precision-neg"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "precision: 0\n", "precision", case_id="playbook-precision-0"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "timeouts: {step: .nan}\n", "timeouts", case_id="playbook-timeout-nan"),
    # ---- keys combined wrongly
    _pb("factors: {strategy: [allreduce]}\n" + FIXED + "algorithm: {staleness: 3}\n", "algorithm.staleness",
        case_id="playbook-staleness-without-ps-ssp"),
    _pb("factors: {strategy: [ps-ssp], staleness: [1, 3]}\n" + FIXED + "algorithm: {staleness: 3}\n", "staleness",
        case_id="playbook-staleness-twice"),
    _pb("factors: {strategy: [allreduce], tau: [1, 4]}\n" + FIXED, "factors.tau", case_id="playbook-tau-without-easgd"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "target_accuracy: 0.5\n", "target_accuracy",
        case_id="playbook-target-without-evaluation"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "images_per_step: 64\n", "images_per_step",
        case_id="playbook-images-without-command"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "command: [python, t.py]\nimages_per_step: 64\nstep_regex: '(('\n",
        "step_regex", case_id="playbook-step-regex-invalid"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "command: ['']\n", "command", case_id="playbook-command-empty"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "command: python t.py\n", "command", case_id="playbook-command-string"),
    _pb("factors: {strategy: [ps-async], framework: [torch]}\n" + FIXED, "framework",
        case_id="playbook-torch-exchange"),
    _pb("factors: {latency: [1ms]}\nfixed: {model: mlp, workers: 2, framework: jax}\n", "framework",
        case_id="playbook-framework-unknown"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "congestion_control: 'bbr; reboot'\n", "congestion_control",
        case_id="playbook-congestion-odd"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "congestion_control: ''\n", "congestion_control",
        case_id="playbook-congestion-empty"),
    _pb("topology: t.yaml\nfactors: {latency: [1ms]}\n" + FIXED, "latency", case_id="playbook-topology-and-latency",
        files={"t.yaml": "name: t\ngroups: {a: [n1], b: [n2]}\nlinks:\n  a-b: {delay: 25ms}\n"}),
    _pb("factors: {latency: [1ms], scale: [1, 2]}\n" + FIXED, "scale", case_id="playbook-scale-without-topology"),
    _pb("factors: {latency: [1ms]}\nfixed: {model: mlp, workers: 2, strategy: single}\n", "workers",
        case_id="playbook-single-with-workers"),
    _pb("factors: {latency: [1ms]}\n" + FIXED + "seconds: 10s\ntrain_steps: 50\n", "seconds",
        case_id="playbook-seconds-and-train-steps"),
    _pb("factors: {latency: []}\n" + FIXED, "factors.latency", case_id="playbook-empty-levels"),
    _pb("factors: {latency: [1ms, 1ms]}\n" + FIXED, "factors.latency", case_id="playbook-repeated-levels"),
    _case("playbook-not-yaml", ("run", "pb.yaml", "--dry-run"), ["pb.yaml"], {"pb.yaml": "name: [unclosed\n"}),
    _case("playbook-binary", ("run", "pb.yaml", "--dry-run"), ["pb.yaml"], {"pb.yaml": b"\xff\xfe\x00\x01garbage"}),
    _case("playbook-a-list", ("run", "pb.yaml", "--dry-run"), ["pb.yaml"], {"pb.yaml": "- a\n- b\n"}),
    # ---- this round's surface (issue 38): node capacity in schedules, topologies and playbooks
    *[_case(f"schedule-node-{i}", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "step 2", *said],
            {"s.yaml": f"name: s\nprofile: {{delay: 5ms}}\nsteps:\n  - {{at: 0s, delay: 5ms}}\n  - {{at: 1s, {step}}}\n"})
      for i, (step, said) in enumerate((("node: n2, cpus: .nan", ["cpus"]), ("node: n2, step_delay: 0.4us", ["0.4us"]),
                                        ("node: n2, step_delay: '.'", ["step_delay"]), ("node: n2x, cpus: 0.5", ["node"]),
                                        ("cpus: 0.5", ["node"]), ("node: n2", ["node"]),
                                        ("node: n2, cpus: 0.5, ramp: 2s, delay: 9ms", ["ramp"])))],
    *[_case(f"topology-compute-{i}", ("sweep", "--dry-run", "--topology", "t.yaml"), ["t.yaml", "compute", *said],
            {"t.yaml": f"name: t\ngroups: {{a: [n1], b: [n2]}}\nlinks:\n  a-b: {{delay: 25ms}}\ncompute: {compute}\n"})
      for i, (compute, said) in enumerate((("{n2: {cpus: .nan}}", ["cpus"]), ("{n2: {step_delay: 2.5us}}", ["2us or 3us"]),
                                           ("{n5: {cpus: 0.5}}", ["n5"]), ("{n2: {gpus: 1}}", ["n2"]), ("[1, 2]", []),
                                           ("{n2: {step_delay: 10}}", ["10ms"])))],
    *[_pb(f"factors: {{{kind}: {levels}}}\n{FIXED}", f"factors.{kind}", case_id=f"playbook-{kind}-{i}")
      for i, (kind, levels) in enumerate((("cpus", "{n2: [.nan]}"), ("cpus", "{n2: [0.5, 0.5]}"), ("cpus", "[0.5]"),
                                          ("step_delay", "{n2: [0.4us]}"), ("step_delay", "{n2: ['.']}"),
                                          ("step_delay", "{n2: []}"), ("cpus", "{2: [0.5]}")))],
    _pb("factors: {latency: [1ms]}\n" + FIXED + "congestion_control: nosuchcc\n", "congestion_control",
        "not available", case_id="playbook-congestion-unknown"),
    # ---- input that scales a dry run's work is bounded, and refused at once past the bound
    *[_case(f"schedule-ramp-{cmd}", (cmd, "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "step 2", "ramp", "10000"],
            {"s.yaml": "name: s\nprofile: {delay: 5ms}\nsteps:\n  - {at: 0s, delay: 5ms}\n"
                       "  - {at: 1s, delay: 6ms, ramp: 100000h}\n"}) for cmd in ("apply", "sweep")],
    _case("schedule-many-ramps", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "over 10000 changes"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\nsteps:\n" + "".join(
              f"  - {{at: {1000 * i}s, delay: {5 + i % 2}ms, ramp: 999s}}\n" for i in range(12))}),
    _case("schedule-many-steps", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "over 10000 changes"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\nsteps:\n" + "".join(
              f"  - {{at: {i}s, delay: {1 + i % 2}ms}}\n" for i in range(10_001))}),
    _case("schedule-period-1us", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "period", "0.01 s"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\nrepeat: true\nperiod: 1us\nsteps:\n  - {at: 0s, delay: 5ms}\n"}),
    _case("schedule-loop-1us", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "period"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\nrepeat: true\nsteps:\n  - {at: 1us, delay: 5ms}\n"}),
    _case("trace-too-long", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["t.csv", "10000 rows"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\ntrace: t.csv\n",
           "t.csv": "time_s,delay_ms\n" + "".join(f"{i},{i % 9}\n" for i in range(10_001))}),
    _case("trace-loop-too-short", ("sweep", "--dry-run", "--schedule", "s.yaml"), ["s.yaml", "period", "0.01 s"],
          {"s.yaml": "name: s\nprofile: {delay: 5ms}\ntrace: t.csv\nrepeat: true\nperiod: 0.001ms\n",
           "t.csv": "time_s,delay_ms\n0,0.0004\n"}),
    _pb("factors: {latency: [" + ",".join(f"{i}ms" for i in range(1, 102)) + "], bandwidth: ["
        + ",".join(f"{i}mbit" for i in range(1, 101)) + "]}\n" + FIXED, "10,000", case_id="playbook-grid-too-large"),
    _pb("factors: {latency: [" + ",".join(f"{i}ms" for i in range(1, 101)) + "]}\nrepeat: 101\n" + FIXED, "10,000",
        case_id="playbook-repeats-too-many"),
]


@pytest.mark.parametrize("argv, fragments, files", FILE_CASES)
def test_odd_file_is_refused_in_one_line(argv, fragments, files, tmp_path, monkeypatch):
    _refused(argv, fragments, files, tmp_path, monkeypatch)


@pytest.mark.parametrize("argv, fragments, files", [case for case in FILE_CASES if "--dry-run" in case.values[0]])
def test_the_run_refuses_the_file_the_dry_run_refuses(argv, fragments, files, tmp_path, monkeypatch):
    _refused(tuple(arg for arg in argv if arg != "--dry-run"), fragments, files, tmp_path, monkeypatch)
