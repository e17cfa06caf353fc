"""The benchmark scripts run, and compute what their reports say."""

import json
import os
import pathlib
import sys
import time
from unittest import mock

import numpy as np
import pytest
import torch as th
import yaml
from benchmark_scripts import load_script  # tests/ is on sys.path

# Some runs here end before their first auxiliary phase on purpose: the warning that learn() then trains as plain PPO
# is meant
pytestmark = [
    pytest.mark.slow,  # each test runs a benchmark script in a new interpreter
    pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO"),
]


def test_env_throughput_paired_ratio():
    env_throughput = load_script("env_throughput")

    def make():
        return (lambda action: None), (lambda: None)

    raw, chain = env_throughput.Runner("raw", make, 10), env_throughput.Runner("chain", make, 10)
    # Round 2 is slow for both (load on the machine): paired ratios are 0.5, 0.5 and 1.0
    raw.wall_s = [1.0, 4.0, 1.0]
    chain.wall_s = [2.0, 8.0, 1.0]
    np.testing.assert_allclose(chain.block_sps(n_envs=4), [20.0, 5.0, 40.0])
    assert env_throughput.paired_ratio(chain, raw, n_envs=4) == pytest.approx(0.5)
    assert env_throughput.paired_ratio(raw, raw, n_envs=4) == pytest.approx(1.0)
    low, high = env_throughput.paired_ratio_interval(chain, raw, n_envs=4)
    assert 0.5 <= low <= 0.5 <= high <= 1.0
    # Identical ratios every round: a zero-width interval
    assert env_throughput.paired_ratio_interval(raw, raw, n_envs=4) == pytest.approx((1.0, 1.0))


def test_env_throughput_runs(tmp_path):
    env_throughput = load_script("env_throughput")
    output = tmp_path / "throughput.md"
    ratio = env_throughput.main(
        ["--n-envs", "4", "--steps", "4", "--repeats", "2", "--warmup-steps", "2", "--output", str(output)]
    )
    # Two rounds of four envs on a loaded machine can give any positive ratio (one was 23.6): only its form is checked
    assert 0.0 < ratio and np.isfinite(ratio)
    report = output.read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| Configuration")]
    assert len(rows) == 4
    raw_name = "ProcgenGym3Env" if sys.version_info < (3, 13) else "procgen_gym.ProcgenVecEnv"  # the Procgen package
    assert rows[0].startswith(f"| raw `{raw_name}`") and "| 100.0% | 100.0% |" in rows[0]
    assert rows[1].startswith("| `ProcgenVecEnv` alone")
    assert "chain: `make_procgen_env` (channel-first `ProcgenVecEnv` + SB3's `VecMonitor` + `VecNormalize`" in rows[2]
    assert f"| {ratio:.1%} |" in rows[2]
    assert rows[3].startswith('| `make_vec_env("procgen/starpilot-v0", n_envs=4)`')
    assert "`ProcgenVecEnv` alone keeps **" in report
    assert f"the `make_procgen_env` chain keeps **{ratio:.1%}** (" in report
    assert "Command: `python benchmarks/env_throughput.py --n-envs 4" in report


def test_throughput_runs(tmp_path):
    """benchmarks/throughput.py in a tiny configuration: both modes, the compute bound and the report."""
    throughput = load_script("throughput")
    output, json_path = tmp_path / "throughput.md", tmp_path / "throughput.json"
    args = ["--n-envs", "2", "--n-steps", "8", "--n-minibatches", "2", "--n-policy-iters", "2", "--n-aux-epochs", "1"]
    args += ["--aux-batch-rollouts", "2", "--bound-repeats", "1", "--torch-threads", "1", "--micro-batch-size", "3"]
    args += ["--aux-buffer-device", "auto", "--num-threads", "1", "--env-limit-steps", "3"]
    results = throughput.main([*args, "--output", str(output), "--json", str(json_path)])
    # Both modes report the env chain's own rate at their threads
    assert [result["aux_buffer_device"] for result in results] == ["auto", "cpu"]
    assert all(result["env_limit_env_steps_per_s"] > 0 for result in results)
    assert [result["mode"] for result in results] == ["optimized", "reference"]
    # Minibatches of 8 (policy) and 16 (aux) samples run in micro-batches of 3 in the optimized mode only
    assert [result["micro_batch_size"] for result in results] == [3, None]
    assert [result["rollout_buffer"] for result in results] == ["PPGRolloutBuffer", "RolloutBuffer"]
    for result in results:
        assert result["env_steps"] == 2 * 2 * 8
        for key in ("end_to_end_env_steps_per_s", "rollout_env_steps_per_s", "bound_env_steps_per_s", "peak_rss_mib"):
            assert result[key] > 0
        assert 0 < result["end_to_end_over_bound"] < 10
        # The bound is the sum of its phases' network calls; training's phases are timed per N_pi cycle
        assert result["bound_env_steps_per_s"] == pytest.approx(2 * 2 * 8 / sum(result["bound_phase_s"].values()))
        assert list(result["phase_s"]) == list(result["bound_phase_s"]) == ["rollout", "policy", "aux"]
        assert sum(result["phase_s"].values()) == pytest.approx(sum(result["seconds"].values()))
        assert result["bound_phase_s"]["rollout"] == pytest.approx(2 * 8 * result["rollout_forward_s"])
        assert result["bound_phase_s"]["policy"] == pytest.approx(2 * 2 * result["policy_step_s"])
    assert results[0]["channels_last"] and not results[1]["channels_last"]
    report = output.read_text()
    for result in results:
        phases = [throughput.phase_text(result["phase_s"][name], result["bound_phase_s"][name]) for name in throughput.PHASES]
        assert f"| {result['mode']} | " + " | ".join(phases) + " |" in report
    assert throughput.phase_text(5.27, 2.36) == "5.27 / 2.36 (2.23x)"
    assert "| optimized | fp32 | 3 | True | False |" in report
    assert "| reference | fp32 | whole minibatches | False | False |" in report
    assert results[0]["phase_precision"] == dict(rollout="fp32", policy="fp32", aux="fp32")
    # "auto" and per-phase precisions show what they resolved to
    resolved = dict(precision="auto", phase_precision=dict(rollout="fp32", policy="bf16", aux="bf16"))
    assert throughput.precision_text(resolved) == "auto (rollout fp32, policy bf16, aux bf16)"
    assert throughput.precision_text(dict(precision="auto", phase_precision=dict(rollout="fp32", policy="fp32"))) == (
        "auto (fp32)"
    )
    assert "Optimized / reference end-to-end:" in report
    assert json.loads(json_path.read_text())[0]["mode"] == "optimized"
    assert "optimized mode's micro_batch_size: 3, aux_buffer_device: auto, cuda_graphs: True" in report
    assert "parallel_networks: True, keep_freed_memory (the command line's): False, malloc variables: " in report
    assert "rollout buffer: ppg, procgen threads: 1" in report
    # Warm-up of one policy iteration without --compile; no rollout graphs on a CPU, so none failed
    assert all(result["warm_up_s"] > 0 and result["rollout_graph_failures"] == 0 for result in results)
    assert "Untimed warm-up of optimized: one policy iteration" in report and "could not be captured" not in report
    assert [result["graphs_compiled_in_timing"] for result in results] == [0, 0] and "timing includes" not in report
    results[0].update(graphs_compiled_in_timing=3, rollout_graph_failures=1)  # the report says when either happened
    report = throughput.markdown(results, throughput.parse_args(args), "python benchmarks/throughput.py")
    assert "optimized: torch.compile compiled 3 graph(s) while training was timed" in report
    assert "optimized: 1 rollout forward pass(es) could not be captured in a CUDA graph" in report
    # Freed memory is kept only with --keep-freed-memory (as the command line keeps it), in the optimized mode
    assert [result["keep_freed_memory"] for result in results] == [False, False]  # the Python API's default
    assert throughput.parse_args(["--keep-freed-memory"]).keep_freed_memory
    assert throughput.parse_args(["--rollout-buffer", "sb3"]).rollout_buffer == "sb3"
    assert not throughput.parse_args(["--no-parallel-networks"]).parallel_networks
    assert f"| {results[0]['env_limit_env_steps_per_s']:.1f} |" in report
    for text, expected in (("auto", "auto"), ("none", None), ("64", 64)):
        assert throughput.parse_args([f"--micro-batch-size={text}"]).micro_batch_size == expected
    with pytest.raises(SystemExit):
        throughput.parse_args(["--micro-batch-size", "0"])


def test_throughput_compile_static_shapes_and_cycle_warm_up():
    """--compile: the features extractors compiled with static shapes under a raised recompile limit, and a warm-up of
    a whole N_pi cycle, so that the aux phase's shapes compile before the timing (issue 27's --compile run timed them)."""
    import torch as th
    import torch._dynamo.config as dynamo_config

    throughput = load_script("throughput")
    args = ["--n-envs", "2", "--n-steps", "8", "--n-minibatches", "2", "--n-policy-iters", "2", "--n-aux-epochs", "1"]
    args += ["--aux-batch-rollouts", "2", "--bound-repeats", "1", "--torch-threads", "1", "--num-threads", "1"]
    args += ["--env-limit-steps", "0", "--arch", "dual", "--compile"]
    parsed = throughput.parse_args(args)
    assert throughput.warm_up_steps(parsed, compiling=True) == 2 * 2 * 8
    assert throughput.warm_up_steps(parsed, compiling=False) == 2 * 8  # without --compile, or in the reference mode
    compiled: list[dict] = []

    def fake_compile(function, **kwargs):  # records the options; runs the eager function
        compiled.append(kwargs)
        return function

    limit_name = throughput.recompile_limit_name()
    saved_limit = getattr(dynamo_config, limit_name)
    aux_phases: list[int] = []
    original_init = throughput.PhaseTimer.__init__

    def timer_init(self, model, *rest):  # the aux phases run before the timing starts
        aux_phases.append(model._n_aux_phases)
        original_init(self, model, *rest)

    rollout_passes: list[tuple] = []
    original_compile_rollout_pass = throughput.compile_rollout_pass

    def compile_rollout_pass(model):  # the rollout's pass compiled before training, without touching the generators
        rng_state = th.get_rng_state()
        with mock.patch.object(model.policy, "_latent_and_values", wraps=model.policy._latent_and_values) as latent:
            original_compile_rollout_pass(model)
        observations = latent.call_args.args[0]
        rollout_passes.append((tuple(observations.shape), model.policy.training, model._n_aux_phases))
        assert th.equal(th.get_rng_state(), rng_state)

    try:
        with (
            mock.patch.object(th, "compile", fake_compile),
            mock.patch.object(throughput.PhaseTimer, "__init__", timer_init),
            mock.patch.object(throughput, "compile_rollout_pass", compile_rollout_pass),
        ):
            result = throughput.run_mode(parsed, "optimized")
        assert getattr(dynamo_config, limit_name) >= throughput.COMPILE_RECOMPILE_LIMIT
    finally:
        setattr(dynamo_config, limit_name, saved_limit)
    assert compiled == [dict(dynamic=False)] * 2  # the policy's and the value network's extractors
    assert aux_phases == [1] and result["compile"] and result["warm_up_s"] > 0
    assert rollout_passes == [((2, 3, 64, 64), False, 0)]  # before the warm-up, at the rollout's batch, eval mode
    assert result["graphs_compiled_in_timing"] == 0
    # A graph compiled while training is timed is counted, and the report says so
    from torch._dynamo.utils import counters

    before = throughput.compiled_graphs()
    counters["stats"]["unique_graphs"] += 2
    try:
        assert throughput.compiled_graphs() - before == 2
    finally:
        counters["stats"]["unique_graphs"] -= 2


def test_throughput_time_call_queues_training_steps():
    """The compute bound times a rollout forward pass per wait for the device, training steps several per wait."""
    throughput = load_script("throughput")
    events = []
    clock = iter(range(100))

    def function():
        events.append("call")

    def synchronize():
        events.append("wait")

    with mock.patch.object(throughput.time, "perf_counter", lambda: float(next(clock))):
        # One warm-up call, then 3 repeats of 4 calls and one wait; each repeat takes 1 s of the fake clock
        assert throughput.time_call(function, 3, synchronize, calls=4) == pytest.approx(0.25)
    assert events == ["call", "wait"] + (["call"] * 4 + ["wait"]) * 3
    events.clear()
    assert throughput.time_call(function, 2, synchronize) > 0
    assert events == ["call", "wait"] * 3
    assert throughput.parse_args([]).bound_pipeline == 4
    for text in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            throughput.parse_args(["--bound-pipeline", text])
    seconds = dict(collect_rollouts=6.0, _policy_phase=2.0, _compute_old_distributions=0.5, _train_aux_phase=11.5)
    assert throughput.phase_seconds(seconds, 2) == dict(rollout=3.0, policy=1.0, aux=6.0)


def test_rollout_host_time_runs(tmp_path, capsys):
    """benchmarks/rollout_host_time.py in a tiny configuration: the two buffers timed, the report and the JSON."""
    rollout_host_time = load_script("rollout_host_time")
    json_path = tmp_path / "host.json"
    args = ["--n-envs", "2", "--n-steps", "8", "--n-minibatches", "2", "--rounds", "2", "--num-threads", "1"]
    results = rollout_host_time.main([*args, "--json", str(json_path)])
    assert list(results) == ["PPGRolloutBuffer", "SB3 RolloutBuffer"]
    for medians in results.values():
        assert all(medians[key] > 0 for key in ("rollout_s", "buffer_writes_s", "minibatches_s", "aux_add_s"))
        assert medians["buffer_writes_s"] < medians["rollout_s"]
        assert medians["buffer_writes_us_per_step"] == pytest.approx(1e6 * medians["buffer_writes_s"] / 8)
        assert medians["total_s"] == pytest.approx(medians["rollout_s"] + medians["minibatches_s"] + medians["aux_add_s"])
        assert medians["rollout_ms_per_step"] == pytest.approx(1000 * medians["rollout_s"] / 8)
    report = capsys.readouterr().out
    assert "starpilot x 2 envs x 8 steps, 2 minibatches, device cpu, medians of 2 rounds" in report
    assert f"| PPGRolloutBuffer | {results['PPGRolloutBuffer']['rollout_ms_per_step']:.3f} |" in report
    assert json.loads(json_path.read_text())["results"] == results
    # The stand-in features extractor does no work: zeros for every observation
    extractor = rollout_host_time.ZeroFeatures(rollout_host_time.spaces.Box(0, 255, (3, 8, 8), np.uint8), 5)
    assert th.equal(extractor(th.ones(4, 3, 8, 8)), th.zeros(4, 5))
    # Each part timed; the buffer's timers removed afterwards, PPG's add() (its two parts) timed once
    model = rollout_host_time.make_model(rollout_host_time.parse_args(args), None)
    model._setup_learn(10**9, callback=None)
    model._callback = model._init_callback(None)
    timings = rollout_host_time.time_one_rollout(model)
    assert all(timings[key] > 0 for key in ("rollout_s", "minibatches_s", "aux_add_s")) and model.aux_buffer.pos == 2
    assert 0 < timings["buffer_writes_s"] < timings["rollout_s"]
    assert not {"reset", "add", "add_before_step", "add_after_step"} & set(vars(model.rollout_buffer))
    model.env.close()


def test_rollout_host_time_counts_nested_buffer_calls_once():
    """add() calling its two parts counts once: from its start to its end."""
    rollout_host_time = load_script("rollout_host_time")

    class Buffer:
        def reset(self):
            pass

        def add(self):
            self.add_before_step()
            self.add_after_step()

        def add_before_step(self):
            pass

        def add_after_step(self):
            pass

    clock = iter(range(100))
    buffer = Buffer()
    with mock.patch.object(rollout_host_time.time, "perf_counter", lambda: float(next(clock))):
        with rollout_host_time.timed_buffer_writes(buffer) as seconds:
            buffer.add()  # the clock read as add() starts (0), as its parts start (1, 2) and as it ends (3)
            assert seconds == [3.0]
            buffer.add_before_step()  # 4, 5
            assert seconds == [4.0]
    assert not vars(buffer)


def test_gpu_checks_script(tmp_path):
    """benchmarks/gpu_checks.sh parses, names tests and options that exist, runs no step that STEPS leaves out, none
    that already passed or would outrun DEADLINE_S, and bundles its logs into $OUT."""
    import re
    import subprocess
    import tarfile
    from pathlib import Path

    script = Path(__file__).parent.parent / "benchmarks" / "gpu_checks.sh"
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    for test_file in re.findall(r"tests/test_\w+\.py", text):
        assert (script.parent.parent / test_file).is_file(), test_file
    config = re.search(r"config=\((.*?)\)", text, re.DOTALL).group(1).split()
    args = load_script("throughput").parse_args([*config, "--rollout-buffer", "sb3", "--parallel-networks"])
    assert (args.device, args.arch, args.n_envs, args.precision, args.rollout_buffer) == ("cuda", "dual", 64, "bf16", "sb3")
    steps = re.findall(r"^throughput (\w+) (\d+)(.*)$", text, re.MULTILINE)
    assert "compile" in [name for name, _, _ in steps] and len(steps) >= 8
    for _, _, extra in steps:  # every throughput step's options exist
        load_script("throughput").parse_args([*config, *extra.split()])
    for script_name in ("rollout_host_time", "profile_phases", "vs_cleanrl"):  # the other benchmarks' options exist
        options = re.search(rf"benchmarks/{script_name}\.py (.*?)\n", text.replace("\\\n", " ")).group(1).split()
        options = [option.replace('"$logs', str(tmp_path)).replace('"$cleanrl_script', "x.py") for option in options]
        options = [option.strip('"') for option in options]
        load_script(script_name).parse_args(options)

    def run_script(logs: str, **env: str) -> None:
        run = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**os.environ, "LOGS": logs, **env}, check=False)
        assert run.returncode == 0

    run_script("logs", OUT=str(tmp_path / "out"), STEPS="none")
    assert (tmp_path / "logs" / "machine.txt").is_file() and not (tmp_path / "logs" / "summary.txt").exists()
    with tarfile.open(tmp_path / "out" / "gpu_checks.tgz") as bundle:  # the logs as one file in $OUT
        assert "./machine.txt" in bundle.getnames()
    assert os.listdir(tmp_path / "out") == ["gpu_checks.tgz"]
    # Without CleanRL's script the comparison is left out, and the summary says why
    run_script("logs2", STEPS="vs_cleanrl", CLEANRL_SCRIPT="missing.py")
    assert (tmp_path / "logs2" / "summary.txt").read_text() == "vs_cleanrl: no CleanRL script at missing.py (see above)\n"
    # A step that passed in an earlier call is not run again; one that would outrun the deadline is left out
    summary = tmp_path / "logs3" / "summary.txt"
    summary.parent.mkdir()
    summary.write_text("rollout_host_time: rc=0 in 23 s (limit 60 s)\n")
    run_script("logs3", STEPS="rollout_host_time cuda_tests", DEADLINE_S="100")
    lines = [line for line in summary.read_text().splitlines() if "pytest is not installed" not in line]
    assert lines[0] == "rollout_host_time: rc=0 in 23 s (limit 60 s)" and len(lines) == 2
    assert re.fullmatch(r"cuda_tests: left out \(\d+ s to the deadline, limit 150 s\)", lines[1])
    assert not (tmp_path / "logs3" / "rollout_host_time.log").exists()
    # Issue 27's "done when" from the results that exist, whatever steps ran
    (tmp_path / "logs4").mkdir()
    for name, rate in (("defaults", 6276.4), ("detach", 10012.0), ("detach_compile", 10512.3)):
        results = [{"mode": "optimized", "end_to_end_env_steps_per_s": rate}]
        (tmp_path / "logs4" / f"throughput_{name}.json").write_text(json.dumps(results))
    (tmp_path / "logs4" / "vs_cleanrl.json").write_text(json.dumps({"ratio": 2.054, "cycle_ratio": 3.001}))
    run_script("logs4", STEPS="none")
    assert (tmp_path / "logs4" / "summary.txt").read_text().splitlines() == [
        "issue 27: dual bf16, 64 envs: 6,276 env steps/s end to end (target >= 10,000: not met)",
        "issue 27: detach bf16, 64 envs: 10,012 env steps/s end to end (target >= 10,000: met)",
        "issue 27: detach bf16, 64 envs, with --compile (not the eager updates): 10,512 env steps/s end to end "
        "(target >= 10,000: met)",
        "issue 27: sb3-ppg / CleanRL 2.05x whole process, last cycle 3.00x (target >= 3x: not met)",
    ]


def test_procgen_learning_resumes_in_chunks(tmp_path):
    """benchmarks/procgen_learning.py: a chunk limit stops each invocation after one rollout; the next resumes it."""
    learning = load_script("procgen_learning")
    args = ["--algos", "ppg,ppg-bf16", "--seeds", "0", "--total-timesteps", "128", "--n-envs", "2", "--n-steps", "32"]
    args += ["--n-policy-iters", "2", "--n-aux-epochs", "1", "--channels", "2,2,2", "--chunk-minutes", "0"]
    args += ["--folder", str(tmp_path / "runs"), "--output", str(tmp_path / "parity.md")]
    assert not learning.main(args)
    curve = learning.read_curve(str(tmp_path / "runs" / "starpilot_ppg_seed0" / "curve.csv"))
    assert curve[:, 0].tolist() == [64]
    assert learning.main(args)
    curve = learning.read_curve(str(tmp_path / "runs" / "starpilot_ppg_seed0" / "curve.csv"))
    assert curve[:, 0].tolist() == [64, 128]
    report = (tmp_path / "parity.md").read_text()
    assert "| PPG | 1 |" in report and "| PPG-BF16 | 1 |" in report and "bfloat16 autocast" in report
    assert (tmp_path / "parity_starpilot.png").stat().st_size > 0
    # ppg-bf16 is the same PPG in the precision "auto" gives a CNN on an AMX or AVX512-BF16 CPU: bf16 in every phase
    ppg, bf16 = (learning.hyperparameters(learning.parse_args(args), algo) for algo in ("ppg", "ppg-bf16"))
    assert bf16.pop("precision") == dict(rollout="bf16", policy="bf16", aux="bf16") and ppg.pop("precision") == "fp32"
    assert ppg == bf16
    # The same run twice would be averaged as two seeds (issue 29): refused before anything trains
    with pytest.raises(SystemExit, match=r"--algos ppg and --seeds 0,1,0 name a run twice"):
        learning.main(["--algos", "ppg", "--seeds", "0,1,0", *args[4:]])
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["starpilot_ppg-bf16_seed0", "starpilot_ppg_seed0"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_memory_runs(tmp_path, capsys):
    memory = load_script("memory")
    args = ["--n-envs", "2", "--n-steps", "8", "--n-policy-iters", "2", "--aux-seconds", "60"]
    args += ["--json", str(tmp_path / "m.json"), "--precision", '{"policy": "bf16", "aux": "bf16"}']
    result = memory.main(args)
    stages = result["stages"]
    names = ["start", "model built", "one policy iteration", "auxiliary buffer full but one rollout"]
    assert list(stages) == [*names, "last policy iteration", "old-policy pass", "auxiliary phase"]
    # The last policy phase ran beside the other N_pi - 1 rollouts, as in training
    assert stages["last policy iteration"]["buffered_iterations_in_policy_phase"] == 1
    assert stages["auxiliary phase"]["finished"]
    # The peak only grows, and is the largest resident size seen
    peaks = [stage["peak_mib"] for stage in stages.values()]
    assert peaks == sorted(peaks) and result["peak_mib"] == peaks[-1] >= max(s["rss_mib"] for s in stages.values())
    # 2 envs x 8 steps x 2 iterations of 3x64x64 uint8 frames, plus the small per-step arrays
    assert 2 * 8 * 2 * 3 * 64 * 64 <= result["aux_buffer_mib"] * 2**20 < 1.1 * 2 * 8 * 2 * 3 * 64 * 64
    assert json.loads((tmp_path / "m.json").read_text())["peak_mib"] == result["peak_mib"]
    output = capsys.readouterr().out
    assert "Auxiliary buffer:" in output and 'precision {"policy": "bf16", "aux": "bf16"}' in output


def test_freed_memory_runs_each_variant(tmp_path, capsys):
    """benchmarks/freed_memory.py in a fresh process: the three variants, their page faults, the report; bad arguments."""
    import resource
    import subprocess

    from benchmark_scripts import BENCHMARKS
    from helpers import environment_with_glibc_defaults

    from sb3_ppg.cli import host_memory

    env = environment_with_glibc_defaults()
    command = [sys.executable, os.path.join(BENCHMARKS, "freed_memory.py"), "--calls", "3", "--threads", "1"]
    run = subprocess.run([*command, "--json", str(tmp_path / "r.json")], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "r.json").read_text())
    assert list(results) == ["default", "kept", "preallocated"]
    assert all(result["ms"] > 0 and result["mib"] == 64 for result in results.values())
    pages = 64 * 2**20 // resource.getpagesize()
    # An output allocated once maps no page in the timed calls
    assert results["preallocated"]["faults_per_call"] < pages / 100
    if host_memory.glibc() is not None:
        assert results["kept"]["kept"] and not results["default"]["kept"]
        # glibc's defaults map each 64 MiB output anew (unless every mapping gets huge pages); kept, its pages are reused
        if results["default"]["faults_per_call"] >= pages:
            assert results["kept"]["faults_per_call"] < results["default"]["faults_per_call"] / 2, results
    assert "ReLU of a 256x16x64x64 fp32 tensor (64 MiB), median of 3 calls" in run.stdout
    assert "| kept |" in run.stdout and "kept / default: " in run.stdout
    freed_memory = load_script("freed_memory")
    with pytest.raises(SystemExit):
        freed_memory.parse_args(["--calls", "0"])
    assert "--calls must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        freed_memory.parse_args(["--shape", "256,x"])
    assert "--shape must be comma-separated integers" in capsys.readouterr().err


def test_maskable_runs_and_reports():
    """benchmarks/maskable.py: one tiny run per algorithm kind, evaluated within the budget, and the report's table."""
    maskable = load_script("maskable")
    env_name = "Discrete(70), 55 invalid"
    results = [maskable.run(env_name, algorithm, 0, 512, 256, 1) for algorithm in ("MaskablePPG", "PPG, no masks")]
    for result in results:
        assert result["timesteps"] == [256, 512] and len(result["returns"]) == 2
    assert results[0]["invalid_action_rate"] == 0 and results[1]["invalid_action_rate"] > 0.5
    report = maskable.report(results, "python benchmarks/maskable.py")
    assert "| algorithm | 256 steps | 512 steps | time (s) | invalid actions |" in report
    assert "| MaskablePPG | " in report and "| 0.0% |" in report


def test_maskable_taxi_and_plot(tmp_path):
    """
    benchmarks/maskable.py on Taxi: 8 envs whose masks are the env's own (a move into a wall, a pickup away from the
    passenger, a drop-off away from the destination are invalid), evaluated in env steps; the curves' image; the
    tables' columns.
    """
    maskable = load_script("maskable")
    taxi = "Taxi-v4 (gymnasium), its action masks"
    env = maskable.make_masked_taxi()
    env.reset(seed=0)
    taxi_env = env.unwrapped
    for _ in range(50):
        masks = env.action_masks()
        assert masks.dtype == bool and masks.shape == (6,)
        row, column, passenger, destination = taxi_env.decode(taxi_env.s)
        assert masks[4] == (passenger < 4 and taxi_env.locs[passenger] == (row, column))  # pickup
        assert masks[5] == (passenger == 4 and taxi_env.locs[destination] == (row, column))  # drop-off
        env.step(int(np.flatnonzero(masks)[0]))
    result = maskable.run(taxi, "MaskablePPG", 0, 2048, 1024, 1)
    assert result["timesteps"] == [1024, 2048] and result["invalid_action_rate"] == 0
    unmasked = maskable.run(taxi, "PPG, no masks", 0, 1024, 1024, 1)
    assert unmasked["invalid_action_rate"] > 0.1
    maskable.plot([result, unmasked], str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert maskable.table_columns(20) == [3, 7, 11, 15, 19] and maskable.table_columns(4) == [0, 1, 2, 3]
    # the ablation (not run by default): an auxiliary phase that trains only the policy network
    ablation = "MaskablePPG, aux phase without value net"
    assert ablation not in maskable.DEFAULT_ALGORITHMS
    assert maskable.ALGORITHMS[ablation][2](maskable.ENVS[taxi]) == {**maskable.TAXI_PPG_SETTINGS, "vf_true_coef": 0.0}


STAND_IN_CLEANRL = """
import json, os, sys, time
time.sleep(0.2)
with open(os.environ["STAND_IN_OUT"], "a") as file:
    file.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "time": time.time()}) + "\\n")
for rate in os.environ["STAND_IN_SPS"].split(","):  # CleanRL prints its rate so far after each policy phase
    print("aux epoch 1")
    print("SPS:", rate)
"""


def test_vs_cleanrl_runs_both_whole_processes(tmp_path, monkeypatch, capsys, order="sb3-ppg,cleanrl"):
    """
    benchmarks/vs_cleanrl.py with a stand-in for CleanRL's script: its options, both orders, the ratio of the whole
    processes and that of the last cycle.
    """
    vs_cleanrl = load_script("vs_cleanrl")
    script, out = tmp_path / "ppg_procgen.py", tmp_path / "calls.jsonl"
    script.write_text(STAND_IN_CLEANRL)
    monkeypatch.setenv("STAND_IN_OUT", str(out))
    # 16 env steps per update, 4 updates: 0.1, 0.2, 0.6, 1.6 s since the start; the cycles end at updates 2 and 4
    monkeypatch.setenv("STAND_IN_SPS", "160,160,80,40")
    args = ["--cleanrl-script", str(script), "--n-envs", "2", "--n-steps", "8", "--n-policy-iters", "2"]
    args += ["--n-aux-epochs", "1", "--aux-batch-rollouts", "1", "--device", "cpu", "--order", order, "--n-cycles", "2"]
    started = time.time()
    results = vs_cleanrl.main([*args, "--json", str(tmp_path / "results.json")])
    assert results["env_steps"] == 2 * 2 * 2 * 8 and results["order"] == order.split(",")
    (call,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert call["argv"] == [
        *("--env-id", "starpilot", "--total-timesteps", "64", "--num-envs", "2", "--num-steps", "8"),
        *("--n-iteration", "2", "--e-auxiliary", "1", "--num-aux-rollouts", "1", "--no-cuda"),
    ]
    # CleanRL's script runs in a scratch folder (its runs/ logs do not land in the repository)
    assert call["cwd"] != str(tmp_path) and not (tmp_path / "runs").exists()
    # Whole processes, in the order asked for: the stand-in's time is at least its sleep; sb3-ppg trains before it
    # or after it
    assert results["cleanrl"]["seconds"] >= 0.2
    cleanrl_started = call["time"] - 0.2 - started
    sb3_first = order.startswith("sb3")
    assert (cleanrl_started >= results["sb3-ppg"]["seconds"]) == sb3_first
    for name in ("cleanrl", "sb3-ppg"):
        assert results[name]["env_steps_per_s"] == pytest.approx(64 / results[name]["seconds"])
    assert results["ratio"] == pytest.approx(results["cleanrl"]["seconds"] / results["sb3-ppg"]["seconds"])
    # The last cycle: CleanRL's from 0.2 s to 1.6 s; sb3-ppg's between its two auxiliary phases' starts, within its run
    assert results["cleanrl"]["cycle_seconds"] == pytest.approx(1.4)
    assert results["cleanrl"]["cycle_ends"] == pytest.approx([0.2, 1.6]) and len(results["sb3-ppg"]["cycle_ends"]) == 2
    assert results["cleanrl"]["cycle_env_steps_per_s"] == pytest.approx(32 / 1.4)
    assert 0 < results["sb3-ppg"]["cycle_seconds"] < results["sb3-ppg"]["seconds"]
    assert results["sb3-ppg"]["cycle_env_steps_per_s"] == pytest.approx(32 / results["sb3-ppg"]["cycle_seconds"])
    assert results["cycle_ratio"] == pytest.approx(1.4 / results["sb3-ppg"]["cycle_seconds"])
    assert json.loads((tmp_path / "results.json").read_text())["ratio"] == pytest.approx(results["ratio"])
    report = capsys.readouterr().out
    assert f"  sb3-ppg / CleanRL: {results['ratio']:.2f}x" in report
    assert f"  CleanRL ppg_procgen.py: 1.40 s, {32 / 1.4:,.0f} env steps/s" in report
    assert report.rstrip().endswith(f"sb3-ppg / CleanRL: {results['cycle_ratio']:.2f}x")
    with pytest.raises(SystemExit):
        vs_cleanrl.parse_args(["--cleanrl-script", "x.py", "--order", "cleanrl,cleanrl"])


def test_vs_cleanrl_runs_in_the_order_asked_for(monkeypatch, capsys):
    vs_cleanrl = load_script("vs_cleanrl")
    ran = []
    monkeypatch.setattr(vs_cleanrl, "run_timed", lambda command: (ran.append(command) or 2.0 * len(ran), ""))
    results = vs_cleanrl.main(["--cleanrl-script", "ppg_procgen.py", "--order", "cleanrl,sb3-ppg", "--device", "cuda"])
    assert ran[0][1].endswith("ppg_procgen.py") and ran[0][-1] == "--cuda"
    assert ran[1][1].endswith("vs_cleanrl.py") and ran[1][-1] == "--sb3-child"
    # CleanRL took 2 s, sb3-ppg 4 s for the same 64 x 256 x 8 steps; one cycle: no cycle rates
    assert results["env_steps"] == 64 * 256 * 8 and results["ratio"] == pytest.approx(0.5)
    assert results["cycle_ratio"] is None and results["sb3-ppg"]["cycle_seconds"] is None
    assert "--n-cycles 1, cycle ends found: CleanRL ppg_procgen.py 0, sb3-ppg (detach, fp32) 0)" in capsys.readouterr().out


def test_vs_cleanrl_reads_the_cycles_ends():
    """CleanRL's SPS lines (rates so far, after each policy phase) and sb3-ppg's marks give the ends of whole cycles."""
    vs_cleanrl = load_script("vs_cleanrl")
    options = ["--cleanrl-script", "x.py", "--n-envs", "4", "--n-steps", "10", "--n-policy-iters", "3", "--n-cycles", "2"]
    args = vs_cleanrl.parse_args(options)
    # 40 env steps per update; updates 3 and 6 end the cycles (a 7th update's line belongs to no whole cycle)
    output = (
        "SPS: 400\naux epoch 1\nSPS: 200\nSPS: 120\nglobal_step=80, episodic_return=1\nSPS: 80\nSPS: 100\nSPS: 60\nSPS: 70\n"
    )
    assert vs_cleanrl.cleanrl_cycle_ends(output, args) == pytest.approx([1.0, 4.0])
    assert vs_cleanrl.last_cycle([1.0, 4.0], args) == pytest.approx({"cycle_seconds": 3.0, "cycle_env_steps_per_s": 40.0})
    # A cycle end missing (a rate that reads 0) or one too many: no cycle rate, rather than one over two cycles
    assert vs_cleanrl.cleanrl_cycle_ends(output.replace("SPS: 120", "SPS: 0"), args) == pytest.approx([4.0])
    for ends in ([4.0], [1.0, 4.0, 9.0]):
        assert vs_cleanrl.last_cycle(ends, args) == {"cycle_seconds": None, "cycle_env_steps_per_s": None}
    one_cycle = vs_cleanrl.parse_args(options[:-2])
    assert vs_cleanrl.last_cycle([1.0], one_cycle) == {"cycle_seconds": None, "cycle_env_steps_per_s": None}
    marks = f"Using cpu device\n{vs_cleanrl.CYCLE_MARK} 2.5 s\n---\n{vs_cleanrl.CYCLE_MARK} 7.25 s\n"
    assert vs_cleanrl.sb3_cycle_ends(marks) == [2.5, 7.25]


def test_recurrent_runs_and_reports():
    """benchmarks/recurrent.py: one tiny timed run per algorithm at the zoo's settings, with the aux phase, and its table."""
    recurrent = load_script("recurrent")
    ppg = recurrent.timed_run("RecurrentPPG", 0, 2048, 0, n_policy_iters=2, aux_batch_rollouts=8)
    ppo = recurrent.timed_run("RecurrentPPO", 0, 256, 0)
    assert ppg["aux_phases"] == 4 and ppg["steps_per_second"] == 2048 / ppg["seconds"]
    assert "aux_phases" not in ppo
    report = recurrent.report([ppg, ppo], "python benchmarks/recurrent.py")
    assert "| 1 | RecurrentPPG |" in report and "| 2 | RecurrentPPO |" in report
    ratio = ppg["steps_per_second"] / ppo["steps_per_second"]
    assert f"RecurrentPPG / RecurrentPPO: {ratio:.2f}x" in report


def test_recurrent_learning_runs_and_reports():
    """benchmarks/recurrent.py --learn: a tiny learning run per algorithm, the mean return of its training episodes."""
    recurrent = load_script("recurrent")
    runs = [recurrent.learning_run(algorithm, 0, 512, n_policy_iters=2) for algorithm in ("RecurrentPPG", "RecurrentPPO")]
    for run in runs:
        assert run["episodes"] > 0 and run["mean_return"] >= 1  # a CartPole step earns 1
    report = recurrent.learning_report(runs, "python benchmarks/recurrent.py --learn 0")
    seconds = runs[0]["seconds"]
    assert (
        f"| RecurrentPPG (stored) | 0 | 512 | {runs[0]['mean_return']:.1f} | {seconds:.0f} | {512 / seconds:,.0f} |" in report
    )
    assert f"- RecurrentPPO: {runs[1]['mean_return']:.1f} +- 0.0 over 1 seed(s)" in report


@pytest.mark.parametrize("env_id", ["PendulumNoVel-v1", "MountainCarContinuousNoVel-v0"])
def test_recurrent_zoo_settings(env_id):
    """Both algorithms get the zoo's settings of the task; RecurrentPPG its whole-rollout batches and aux phase."""
    recurrent = load_script("recurrent")
    ppo, ppg = (recurrent.make_model(algorithm, 0, env_id) for algorithm in ("RecurrentPPO", "RecurrentPPG"))
    zoo = recurrent.ZOO[env_id]
    for model in (ppo, ppg):
        assert model.n_envs == zoo["n_envs"] and model.use_sde
        assert (
            model.gamma == zoo["shared"]["gamma"]
            and model.policy.lstm_actor.hidden_size == zoo["policy_kwargs"]["lstm_hidden_size"]
        )
        # The velocity is masked: the observation's last entry (Pendulum's angular velocity, MountainCar's speed) is 0
        model.env.reset()
        assert np.all(model.env.get_original_obs()[:, -1] == 0.0) and np.any(model.env.get_original_obs()[:, 0] != 0.0)
    # RecurrentPPO: the zoo's 1024-step rollouts; RecurrentPPG: rollouts of RecurrentPPO's batch_size, one per
    # minibatch (as many updates per env step), an auxiliary phase every 4 x 1024 steps per env as before
    assert ppo.n_steps == 1024 and ppo.batch_size == zoo["recurrent_ppo"]["batch_size"]
    assert ppg.n_steps == ppg.batch_size == ppo.batch_size and ppg.n_epochs == ppo.n_epochs
    assert ppg.n_policy_iters * ppg.n_steps == 4 * 1024 and ppg.aux_start_states == "stored"
    # The packaged hyperparameters are the benchmark's
    packaged = yaml.safe_load(
        (pathlib.Path(__file__).parents[1] / "sb3_ppg" / "cli" / "hyperparams" / "recurrent_ppg.yml").read_text()
    )[env_id]
    for name in ("n_steps", "batch_size", "n_policy_iters", "aux_batch_rollouts"):
        assert packaged[name] == zoo["recurrent_ppg"][name], name
    assert recurrent.make_model("RecurrentPPG", 0, env_id, n_policy_iters=2).n_policy_iters == 2


def test_recurrent_learning_one_algorithm(tmp_path, capsys):
    """--algorithms RecurrentPPG --aux-start-states recomputed: learning runs of RecurrentPPG alone, saved run by run."""
    recurrent = load_script("recurrent")
    output = tmp_path / "learning.json"
    args = ["--learn", "0", "1", "--learn-timesteps", "512", "--n-policy-iters", "2", "--algorithms", "RecurrentPPG"]
    recurrent.main([*args, "--aux-start-states", "recomputed", "--out", str(output), "--plot", str(tmp_path / "a.png")])
    saved = json.loads(output.read_text())
    assert [(run["algorithm"], run["seed"]) for run in saved["runs"]] == [("RecurrentPPG", 0), ("RecurrentPPG", 1)]
    assert all(run["aux_start_states"] == "recomputed" and run["episodes"] > 0 for run in saved["runs"])
    assert "--algorithms RecurrentPPG" in saved["command"] and "--aux-start-states recomputed" in saved["command"]
    printed = capsys.readouterr().out
    assert "RecurrentPPO" not in printed
    returns = [run["mean_return"] for run in saved["runs"]]
    assert f"- RecurrentPPG (recomputed): {np.mean(returns):.1f} +- {np.std(returns):.1f} over 2 seed(s)" in printed
    assert (tmp_path / "a.png").stat().st_size > 0
    # The curve holds every training episode: its last 100 are those of the mean return
    for run in saved["runs"]:
        steps = [step for step, _ in run["curve"]]
        assert len(steps) >= run["episodes"] and steps == sorted(steps) and 0 < steps[0] and steps[-1] <= 512
        assert np.mean([episode_return for _, episode_return in run["curve"][-100:]]) == pytest.approx(run["mean_return"])
    # --report: the same table from the saved runs, without training; and their plot
    recurrent.main(["--report", str(output), "--plot", str(tmp_path / "b.png")])
    assert (
        f"- RecurrentPPG (recomputed): {np.mean(returns):.1f} +- {np.std(returns):.1f} over 2 seed(s)"
        in capsys.readouterr().out
    )
    assert (tmp_path / "b.png").stat().st_size > 0
    # Runs of two tasks: each summary is of one task
    other = dict(saved["runs"][0], env="PendulumNoVel-v1", mean_return=-500.0)
    report = recurrent.learning_report([*saved["runs"], other], "python benchmarks/recurrent.py --report")
    assert f"- RecurrentPPG (recomputed) on CartPoleNoVel-v1: {np.mean(returns):.1f} +- {np.std(returns):.1f} over 2" in report
    assert "- RecurrentPPG (recomputed) on PendulumNoVel-v1: -500.0 +- 0.0 over 1 seed(s)" in report
