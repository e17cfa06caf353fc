"""
Training throughput of PPG on a real Procgen game, against the network's own compute bound and a reference mode.

For one configuration (policy, arch, n_envs, n_steps, N_pi, E_aux, minibatches, device, precision, compile), each
mode runs in a fresh subprocess (so that peak memory is its own) and reports:

- rollout env steps/s (time in ``collect_rollouts``: env + policy forward), policy-phase samples/s, auxiliary-phase
  samples/s (old-policy pass included), end-to-end env steps/s, peak resident memory (and peak device memory on
  CUDA);
- the **env limit**: the ``make_procgen_env`` chain alone (same envs and threads), stepped with random actions
  in the same process after training: the env steps/s that no training on this machine can exceed;
- the **compute bound**: the same network alone, timed on random images at the batch sizes training uses (forward
  at the rollout batch of ``n_envs``; forward + backward + optimizer step at the policy and auxiliary minibatch
  sizes, in the micro-batches training splits them into; forward at the old-policy chunk size), in the same
  precision and memory format. Each rollout forward pass is timed alone, waiting for the device as a rollout step
  does for its actions; the training steps are timed ``--bound-pipeline`` at a time with one wait at the end, queued
  as training queues its minibatches. The bound is the env steps per second that training would reach if it spent
  time only on those network calls; ``end-to-end / bound`` says how close training comes to it, and the report
  sets each phase's time in training against its network calls' (where the time above the bound goes).

Modes: ``optimized`` (the package's defaults plus the options given: ``--precision``, ``--compile``,
``--micro-batch-size``, ``--rollout-buffer``, ...) and ``reference`` (every optimization off: fp32, NCHW convolutions,
no compile, no CUDA graphs, SB3's rollout buffer). The report prints optimized / reference. Results go to ``--json``
and a Markdown table to ``--output`` (machine, date, versions, command; default ``docs/throughput_run.md``, the latest
run, which ``docs/throughput.md`` collects and explains).

Usage, from the repository root with sb3_ppg installed:
``python benchmarks/throughput.py --game starpilot --n-envs 32 --n-steps 128 --arch detach --n-policy-iters 4``
"""

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any

MODES = ("optimized", "reference")
#: The phases whose time the report sets against the compute bound's
PHASES = ("rollout", "policy", "aux")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="PPG training throughput vs the network's compute bound")
    parser.add_argument("--game", default="starpilot", help="Procgen game (easy mode)")
    parser.add_argument("--policy", default="ProcgenCnn", help="PPG policy")
    parser.add_argument("--arch", default="detach", choices=("dual", "detach", "shared"), help="PPG architecture")
    parser.add_argument("--n-envs", type=int, default=32)
    parser.add_argument("--n-steps", type=int, default=128)
    parser.add_argument("--n-minibatches", type=int, default=8, help="Policy-phase minibatches per epoch")
    parser.add_argument("--n-policy-iters", type=int, default=4, help="N_pi")
    parser.add_argument("--n-aux-epochs", type=int, default=2, help="E_aux")
    parser.add_argument("--aux-batch-rollouts", type=int, default=4, help="Whole rollouts per aux minibatch")
    parser.add_argument("--n-cycles", type=int, default=1, help="Timed N_pi cycles (each ends with an aux phase)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", help="Optimized mode's precision: fp32, bf16, or JSON per phase")
    parser.add_argument(
        "--micro-batch-size", type=micro_batch_size, default="auto", help="Optimized mode's micro_batch_size: auto, none or N"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="Optimized mode: torch.compile the features extractors (static shapes; the warm-up is a whole N_pi cycle)",
    )
    parser.add_argument(
        "--aux-buffer-device", default="auto", help="Optimized mode's aux_buffer_device: cpu, pinned, device or auto"
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Optimized mode's cuda_graphs (the rollout's forward pass from CUDA graphs on CUDA)",
    )
    parser.add_argument(
        "--parallel-networks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Optimized mode's parallel_networks (arch dual's two networks on two CUDA streams on CUDA)",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Optimized mode on a CPU with glibc: freed memory kept in the process, as the command line keeps it "
        "(sb3_ppg.cli.host_memory); default: malloc as the Python API leaves it (MALLOC_*_ variables apply)",
    )
    parser.add_argument(
        "--rollout-buffer",
        choices=("ppg", "sb3"),
        default="ppg",
        help="Optimized mode's rollout buffer: PPG's default (PPGRolloutBuffer) or SB3's RolloutBuffer (the reference's)",
    )
    parser.add_argument("--num-threads", type=int, default=None, help="Procgen threads (default: make_procgen_env's)")
    parser.add_argument("--env-limit-steps", type=int, default=200, help="Timed steps of the env limit (0: skip it)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--bound-repeats", type=int, default=3, help="Timed repeats of each network call")
    parser.add_argument(
        "--bound-pipeline",
        type=positive_int,
        default=4,
        help="Training steps of the compute bound timed between two waits for the device (the rollout's forward: 1)",
    )
    parser.add_argument("--modes", default="optimized,reference", help="Comma-separated modes to run")
    parser.add_argument("--json", default=None, help="Write the results as JSON to this file")
    parser.add_argument(
        "--output", default=os.path.join("docs", "throughput_run.md"), help="Markdown file to write (the latest run)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def positive_int(text: str) -> int:
    """A positive integer from the command line."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def micro_batch_size(text: str) -> int | str | None:
    """PPG's ``micro_batch_size`` from the command line: ``auto``, ``none`` or a positive number."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected auto, none or a positive integer, got {text!r}")
    return int(text)


def _precision(text: str) -> str | dict[str, str]:
    """The ``precision`` argument of PPG from the command line (a name, or a JSON dict per phase)."""
    return json.loads(text) if text.strip().startswith("{") else text


def build_model(args: argparse.Namespace, mode: str) -> Any:
    """
    The PPG model of a mode, on a ``make_procgen_env`` env.

    :param args: The benchmark's arguments
    :param mode: ``"optimized"`` or ``"reference"``
    :return: The model
    """
    from stable_baselines3.common.buffers import RolloutBuffer

    from sb3_ppg import PPG

    optimized = mode == "optimized"
    env = make_env(args)
    policy_kwargs: dict[str, Any] = dict(arch=args.arch)
    if args.policy == "ProcgenCnn":
        policy_kwargs["features_extractor_kwargs"] = dict(channels_last=optimized)
    rollout_size = args.n_steps * args.n_envs
    model = PPG(
        args.policy,
        env,
        n_steps=args.n_steps,
        batch_size=rollout_size // args.n_minibatches,
        n_policy_iters=args.n_policy_iters,
        n_aux_epochs=args.n_aux_epochs,
        aux_batch_rollouts=args.aux_batch_rollouts,
        precision=_precision(args.precision) if optimized else "fp32",
        micro_batch_size=args.micro_batch_size if optimized else None,
        aux_buffer_device=args.aux_buffer_device if optimized else "cpu",
        cuda_graphs=optimized and args.cuda_graphs,
        parallel_networks=optimized and args.parallel_networks,
        rollout_buffer_class=None if optimized and args.rollout_buffer == "ppg" else RolloutBuffer,
        policy_kwargs=policy_kwargs,
        device=args.device,
        seed=0,
    )
    if optimized and args.compile:
        compile_extractors(model)
    return model


#: The most graphs torch.compile keeps per compiled function (``--compile``): one per batch size, grad mode and
#: precision that training runs the features extractors at, far fewer than this
COMPILE_RECOMPILE_LIMIT = 64


def recompile_limit_name() -> str:
    """The name of dynamo's per-function recompile limit in this torch (``cache_size_limit`` before it was renamed)."""
    import torch._dynamo.config as dynamo_config

    return "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"


def compile_extractors(model: Any) -> None:
    """
    ``--compile``: each features extractor's forward compiled by ``torch.compile`` with static shapes, one graph per
    batch size (the rollout's, the minibatches', the old-policy chunks'); torch's default would compile a second batch
    size as a dynamic shape, whose kernels are not those of the shapes training runs.
    """
    import torch as th
    import torch._dynamo.config as dynamo_config

    limit_name = recompile_limit_name()
    setattr(dynamo_config, limit_name, max(getattr(dynamo_config, limit_name), COMPILE_RECOMPILE_LIMIT))
    extractors = [getattr(model.policy, name, None) for name in ("pi_features_extractor", "vf_features_extractor")]
    extractors.append(model.policy.features_extractor)
    # Each once: SB3's features_extractor is the policy network's
    for extractor in {id(extractor): extractor for extractor in extractors if extractor is not None}.values():
        extractor.forward = th.compile(extractor.forward, dynamic=False)


def compile_rollout_pass(model: Any) -> None:
    """
    ``--compile``: the rollout's forward pass compiled before training, outside the capture of its CUDA graph (whose
    warm-up refuses host syncs, which compilation may make), as the rollout runs it: without gradient, in evaluation
    mode, at the rollout's precision and batch of ``n_envs``; without sampling (the random generators untouched).
    """
    import numpy as np
    import torch as th
    from stable_baselines3.common.utils import obs_as_tensor

    space = model.observation_space
    observations = np.zeros((model.n_envs, *space.shape), dtype=space.dtype)
    model.policy.set_training_mode(False)
    with th.no_grad():
        model.policy._latent_and_values(obs_as_tensor(observations, model.device))


def compiled_graphs() -> int:
    """How many graphs ``torch.compile`` has compiled in this process so far (its ``unique_graphs`` count)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def warm_up_steps(args: argparse.Namespace, compiling: bool) -> int:
    """
    The untimed env steps before the timing: one policy iteration (allocations, oneDNN primitives, CUDA graphs), or
    when ``compiling`` (``--compile``, optimized mode) a whole N_pi cycle, so that every shape of every phase is
    compiled before the timing starts.
    """
    rollout_size = args.n_steps * args.n_envs
    return rollout_size * (args.n_policy_iters if compiling else 1)


def make_env(args: argparse.Namespace) -> Any:
    """The benchmark's ``make_procgen_env`` chain (easy mode, seed 0)."""
    from sb3_ppg import make_procgen_env

    threads = {} if args.num_threads is None else {"num_threads": args.num_threads}
    return make_procgen_env(args.game, n_envs=args.n_envs, distribution_mode="easy", seed=0, **threads)


def env_limit(args: argparse.Namespace) -> float:
    """
    The env steps per second of the benchmark's env chain alone (random actions, after 10 untimed steps).

    :param args: The benchmark's arguments (``--env-limit-steps`` timed steps)
    :return: env steps/s
    """
    import numpy as np

    env = make_env(args)
    env.reset()
    actions = np.random.default_rng(0).integers(0, env.action_space.n, size=(10 + args.env_limit_steps, args.n_envs))
    for step_actions in actions[:10]:
        env.step(step_actions)
    start = time.perf_counter()
    for step_actions in actions[10:]:
        env.step(step_actions)
    seconds = time.perf_counter() - start
    env.close()
    return args.env_limit_steps * args.n_envs / seconds


class PhaseTimer:
    """Wall-clock seconds spent in some of a model's methods (wrapped on the instance)."""

    def __init__(self, model: Any, names: tuple[str, ...], synchronize: Any) -> None:
        self.seconds = dict.fromkeys(names, 0.0)
        self.calls = dict.fromkeys(names, 0)
        for name in names:
            setattr(model, name, self._timed(name, getattr(model, name), synchronize))

    def _timed(self, name: str, method: Any, synchronize: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            synchronize()
            start = time.perf_counter()
            result = method(*args, **kwargs)
            synchronize()
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return result

        return timed


def time_call(function: Any, repeats: int, synchronize: Any, calls: int = 1) -> float:
    """
    Median seconds per call of ``function()`` after one untimed warm-up call.

    :param repeats: timed repeats
    :param synchronize: Waits for the device
    :param calls: calls per repeat, queued one after the other with a single wait for the device at the end (as
        training queues its minibatches); 1: each call waits for the device (as a rollout step waits for its actions)
    :return: seconds per call
    """
    function()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        synchronize()
        times.append((time.perf_counter() - start) / calls)
    return sorted(times)[len(times) // 2]


def compute_bound(model: Any, args: argparse.Namespace, synchronize: Any) -> dict[str, float]:
    """
    Time the network alone at training's batch sizes and derive the env steps per second that training would reach
    if it only ran those calls.

    :param model: A model built like the trained one (its weights and optimizer are used, then discarded)
    :param args: The benchmark's arguments
    :param synchronize: Waits for the device
    :return: Seconds per call and the bound in env steps per second
    """
    import torch as th

    from sb3_ppg.common.optim import split_observations

    policy = model.policy
    dtypes = model._phase_dtypes
    shape = model.observation_space.shape
    device = model.device

    def images(n: int) -> th.Tensor:
        return th.randint(0, 256, (n, *shape), dtype=th.uint8, device=device)

    rollout_obs = images(args.n_envs)
    batch_size = model.batch_size
    policy_obs = images(batch_size)
    aux_obs = images(args.aux_batch_rollouts * args.n_steps)
    actions = th.randint(0, model.action_space.n, (batch_size,), device=device)
    optimizer = model.policy.optimizer

    # The passes that training runs: micro-batches of the minibatches when the model splits them
    micro_batch_size = model._micro_batch_size

    def parts(batch: th.Tensor) -> list[th.Tensor]:
        return split_observations(batch, micro_batch_size)  # type: ignore[return-value]

    def rollout_forward() -> None:
        policy.compute_dtype = dtypes["rollout"]
        with th.no_grad():
            policy(rollout_obs)

    def policy_step() -> None:
        policy.compute_dtype = dtypes["policy"]
        for observations, part_actions in zip(parts(policy_obs), parts(actions), strict=True):
            values, log_prob, entropy = policy.evaluate_actions(observations, part_actions)
            (values.mean() + log_prob.mean() + entropy.mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def old_policy_forward() -> None:
        policy.compute_dtype = dtypes["aux"]
        with th.inference_mode():
            for observations in parts(aux_obs):
                policy.get_distribution(observations)

    def aux_step() -> None:
        policy.compute_dtype = dtypes["aux"]
        for observations in parts(aux_obs):
            distribution, values, aux_values = policy.forward_aux(observations)
            (distribution.entropy().mean() + values.mean() + aux_values.mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # The rollout waits for each step's actions; training queues its minibatches and old-policy chunks
    pipeline = args.bound_pipeline
    seconds: dict[str, Any] = {
        "rollout_forward_s": time_call(rollout_forward, args.bound_repeats, synchronize),
        "policy_step_s": time_call(policy_step, args.bound_repeats, synchronize, pipeline),
        "old_policy_forward_s": time_call(old_policy_forward, args.bound_repeats, synchronize, pipeline),
        "aux_step_s": time_call(aux_step, args.bound_repeats, synchronize, pipeline),
    }
    rollout_size = args.n_steps * args.n_envs
    n_minibatches = -(-rollout_size // batch_size)
    n_rollouts = args.n_policy_iters * args.n_envs
    n_aux_minibatches = -(-n_rollouts // args.aux_batch_rollouts)
    # Seconds per N_pi cycle of each phase's network calls
    seconds["bound_phase_s"] = {
        "rollout": args.n_policy_iters * args.n_steps * seconds["rollout_forward_s"],
        "policy": args.n_policy_iters * model.n_epochs * n_minibatches * seconds["policy_step_s"],
        "aux": n_aux_minibatches * (seconds["old_policy_forward_s"] + args.n_aux_epochs * seconds["aux_step_s"]),
    }
    cycle_s = sum(seconds["bound_phase_s"].values())
    seconds["bound_env_steps_per_s"] = args.n_policy_iters * rollout_size / cycle_s
    return seconds


def phase_seconds(seconds: dict[str, float], n_cycles: int) -> dict[str, float]:
    """
    Training's seconds per N_pi cycle in each phase, as the compute bound splits them.

    :param seconds: the timed methods' total seconds (``PhaseTimer.seconds``)
    :param n_cycles: the timed N_pi cycles
    :return: rollout, policy and auxiliary seconds (the old-policy pass counts in the auxiliary phase)
    """
    return {
        "rollout": seconds["collect_rollouts"] / n_cycles,
        "policy": seconds["_policy_phase"] / n_cycles,
        "aux": (seconds["_compute_old_distributions"] + seconds["_train_aux_phase"]) / n_cycles,
    }


def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """
    Train one mode for ``n_cycles`` N_pi cycles (after the untimed warm-up of :func:`warm_up_steps`) and measure it,
    with freed memory kept as the command line keeps it where ``--keep-freed-memory`` asks (optimized mode, CPU).

    :param args: The benchmark's arguments
    :param mode: ``"optimized"`` or ``"reference"``
    :return: The measurements
    """
    from sb3_ppg.cli.host_memory import freed_memory_kept

    keep = mode == "optimized" and args.keep_freed_memory and not args.device.startswith("cuda")
    with freed_memory_kept(keep) as kept:
        result = train_and_measure(args, mode)
    result["keep_freed_memory"] = kept
    return result


def train_and_measure(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """The measurements of :func:`run_mode`."""
    import torch as th

    if args.torch_threads > 0:
        th.set_num_threads(args.torch_threads)
    cuda = args.device.startswith("cuda")

    def synchronize() -> None:
        if cuda:
            th.cuda.synchronize()

    rollout_size = args.n_steps * args.n_envs
    model = build_model(args, mode)
    compiling = bool(args.compile and mode == "optimized")
    # Warm-up (one policy iteration, a whole N_pi cycle with --compile), then a fresh N_pi cycle
    start = time.perf_counter()
    if compiling:
        compile_rollout_pass(model)
    model.learn(warm_up_steps(args, compiling))
    synchronize()
    warm_up_s = time.perf_counter() - start
    model.aux_buffer.reset()
    if cuda:
        th.cuda.reset_peak_memory_stats()
    timer = PhaseTimer(
        model, ("collect_rollouts", "_policy_phase", "_compute_old_distributions", "_train_aux_phase"), synchronize
    )
    total = args.n_cycles * args.n_policy_iters * rollout_size
    graphs_before = compiled_graphs()
    start = time.perf_counter()
    model.learn(total, reset_num_timesteps=False)
    synchronize()
    wall_s = time.perf_counter() - start
    # Graphs that torch.compile compiled while training was timed (none with --compile's warm-up)
    graphs_compiled_in_timing = compiled_graphs() - graphs_before
    n_aux_samples = args.n_cycles * args.n_aux_epochs * args.n_policy_iters * rollout_size
    aux_s = timer.seconds["_compute_old_distributions"] + timer.seconds["_train_aux_phase"]
    result: dict[str, Any] = {
        "mode": mode,
        "env_steps": total,
        "wall_s": wall_s,
        "end_to_end_env_steps_per_s": total / wall_s,
        "rollout_env_steps_per_s": total / timer.seconds["collect_rollouts"],
        "policy_phase_samples_per_s": total * model.n_epochs / timer.seconds["_policy_phase"],
        "aux_phase_samples_per_s": n_aux_samples / aux_s,
        "seconds": timer.seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "aux_buffer_mib": model.aux_buffer.nbytes / 2**20,
        "precision": args.precision if mode == "optimized" else "fp32",
        "channels_last": mode == "optimized",
        "compile": compiling,
        "warm_up_s": warm_up_s,
        "graphs_compiled_in_timing": graphs_compiled_in_timing,
        "phase_precision": model.phase_precision,
        "micro_batch_size": model._micro_batch_size,
    }
    if cuda:
        result["peak_device_mib"] = th.cuda.max_memory_allocated() / 2**20
    result.update(compute_bound(model, args, synchronize))
    result["end_to_end_over_bound"] = result["end_to_end_env_steps_per_s"] / result["bound_env_steps_per_s"]
    result["phase_s"] = phase_seconds(timer.seconds, args.n_cycles)
    model.env.close()
    result["aux_buffer_device"] = model.aux_buffer_device
    result["cuda_graphs"] = bool(model.cuda_graphs and cuda)
    graphs = getattr(model.policy, "_rollout_graphs", None)
    # The rollout's forward passes that could not be captured (they ran without graphs; PPG warned)
    result["rollout_graph_failures"] = 0 if graphs is None else len(graphs.failed)
    result["parallel_networks"] = bool(model.parallel_networks and cuda and args.arch == "dual")
    result["rollout_buffer"] = type(model.rollout_buffer).__name__
    if args.env_limit_steps > 0:
        result["env_limit_env_steps_per_s"] = env_limit(args)
    return result


def malloc_variables() -> str:
    """The environment's settings of glibc's malloc (``MALLOC_*_``, ``GLIBC_TUNABLES``), or ``none``."""
    names = sorted(name for name in os.environ if name.startswith("MALLOC_") or name == "GLIBC_TUNABLES")
    return " ".join(f"{name}={os.environ[name]}" for name in names) or "none"


def machine() -> str:
    """One line describing the machine and the versions."""
    import numpy as np
    import stable_baselines3
    import torch as th

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as file:
            cpu = next(line.split(":", 1)[1].strip() for line in file if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", GPU {th.cuda.get_device_name()}" if th.cuda.is_available() else ""
    return (
        f"{cpu}, {os.cpu_count()} cores{gpu}; Python {platform.python_version()}, torch {th.__version__}, "
        f"SB3 {stable_baselines3.__version__}, numpy {np.__version__}"
    )


def precision_text(result: dict[str, Any]) -> str:
    """The precision asked for and, where it differs, what it resolved to per phase (``"auto"``)."""
    resolved = result["phase_precision"]
    if len(set(resolved.values())) == 1:
        actual = next(iter(resolved.values()))
    else:
        actual = ", ".join(f"{phase} {name}" for phase, name in resolved.items())
    return actual if result["precision"] == actual else f"{result['precision']} ({actual})"


def env_limit_text(result: dict[str, Any]) -> str:
    """The env limit of a result, or a dash when it was not measured."""
    limit = result.get("env_limit_env_steps_per_s")
    return "-" if limit is None else f"{limit:.1f}"


def phase_text(training_s: float, bound_s: float) -> str:
    """A phase's training seconds against its network calls' seconds, and their ratio."""
    return f"{training_s:.2f} / {bound_s:.2f} ({training_s / bound_s:.2f}x)"


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, command: str) -> str:
    """The report as Markdown."""
    lines = [
        "# PPG training throughput: the latest run",
        "",
        "Written by `benchmarks/throughput.py`; do not edit by hand.",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {machine()}",
        f"- Command: `{command}`",
        f"- Config: {args.game} (easy), `{args.policy}` arch `{args.arch}`, {args.n_envs} envs x {args.n_steps} steps, "
        f"{args.n_minibatches} policy minibatches, N_pi {args.n_policy_iters}, E_aux {args.n_aux_epochs}, "
        f"{args.aux_batch_rollouts} rollouts per aux minibatch, device {args.device}, {args.n_cycles} timed N_pi "
        f"cycle(s), optimized mode's micro_batch_size: {args.micro_batch_size}, aux_buffer_device: "
        f"{args.aux_buffer_device}, cuda_graphs: {args.cuda_graphs}, "
        f"parallel_networks: {args.parallel_networks}, keep_freed_memory (the command line's): "
        f"{args.keep_freed_memory}, malloc variables: {malloc_variables()}, rollout buffer: "
        f"{args.rollout_buffer}, procgen threads: "
        f"{'make_procgen_env default' if args.num_threads is None else args.num_threads}",
        "",
        "| mode | precision | micro-batch | channels_last | compile | end-to-end env steps/s | rollout env steps/s "
        "| policy samples/s | aux samples/s | compute bound env steps/s | env limit env steps/s | end-to-end / bound "
        "| peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        micro = result["micro_batch_size"] or "whole minibatches"
        lines.append(
            f"| {result['mode']} | {precision_text(result)} | {micro} | {result['channels_last']} | {result['compile']} "
            f"| {result['end_to_end_env_steps_per_s']:.1f} | {result['rollout_env_steps_per_s']:.1f} "
            f"| {result['policy_phase_samples_per_s']:.1f} | {result['aux_phase_samples_per_s']:.1f} "
            f"| {result['bound_env_steps_per_s']:.1f} | {env_limit_text(result)} | {result['end_to_end_over_bound']:.0%} "
            f"| {result['peak_rss_mib']:.0f} |"
        )
    lines += [
        "",
        "Per N_pi cycle, each phase's time in training against its network calls alone (the compute bound's share), "
        "in seconds:",
        "",
        "| mode | rollout | policy phase | auxiliary phase (old-policy pass included) |",
        "|---|---|---|---|",
    ]
    for result in results:
        cells = [phase_text(result["phase_s"][phase], result["bound_phase_s"][phase]) for phase in PHASES]
        lines.append(f"| {result['mode']} | " + " | ".join(cells) + " |")
    by_mode = {result["mode"]: result for result in results}
    if "optimized" in by_mode and "reference" in by_mode:
        speedup = by_mode["optimized"]["end_to_end_env_steps_per_s"] / by_mode["reference"]["end_to_end_env_steps_per_s"]
        lines += ["", f"Optimized / reference end-to-end: **{speedup:.2f}x**."]
    lines += ["", f"Aux buffer: {results[0]['aux_buffer_mib']:.0f} MiB."]
    for result in results:
        warm_up = "a whole N_pi cycle (compilation)" if result["compile"] else "one policy iteration"
        lines.append(f"Untimed warm-up of {result['mode']}: {warm_up}, {result['warm_up_s']:.1f} s.")
        if result["graphs_compiled_in_timing"]:
            lines.append(
                f"{result['mode']}: torch.compile compiled {result['graphs_compiled_in_timing']} graph(s) while "
                "training was timed: the timing includes compilation."
            )
        if result["rollout_graph_failures"]:
            lines.append(
                f"{result['mode']}: {result['rollout_graph_failures']} rollout forward pass(es) could not be captured "
                "in a CUDA graph and ran without (see the warning)."
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """
    Run the benchmark (each mode in a subprocess) and write the reports.

    :param argv: Command-line arguments
    :return: The results of the modes
    """
    args = parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(run_mode(args, args.child)))
        return []
    argv = sys.argv[1:] if argv is None else argv
    results = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"Unknown mode {mode!r}: choose from {MODES}")
        process = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv, "--child", mode], capture_output=True, text=True, check=False
        )
        if process.returncode != 0:
            raise SystemExit(f"The {mode} run failed:\n{process.stderr[-4000:]}")
        line = next(line for line in process.stdout.splitlines() if line.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
        print(json.dumps(results[-1], indent=2))
    command = "python benchmarks/throughput.py " + " ".join(argv)
    report = markdown(results, args, command)
    print(report)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as file:
            file.write(report)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
