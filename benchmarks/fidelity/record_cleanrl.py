"""
Record what CleanRL's ``ppg_procgen.py`` computes, in float64, for the fidelity fixtures.

Usage (the checkout is not part of this repository; bring it with ``git clone`` of CleanRL). CleanRL's script needs
gym 0.23.1 (its pinned version: gym 0.26 changed the wrappers' API), so run it with an environment that has it:

    python benchmarks/fidelity/record_cleanrl.py /path/to/cleanrl [--output tests/data/fidelity]

``ppg_procgen.py`` is a script (its training loop is its ``__main__`` block), so it runs here as a script, unmodified,
with ``__name__ == "__main__"``, and with these stand-ins for what it imports (given through the ``__import__`` of
its globals; nothing else in the process changes):

- ``torch``: torch, with ``float32`` read as ``float64`` (the script casts the auxiliary buffer's observations and
  returns to float32; ``torch.set_default_dtype(torch.float64)`` makes everything else float64), ``optim.Adam``
  recording (below) and ``rand`` giving a uint8 tensor (only ``flatten_unflatten_test`` calls it, for a 600M-element
  tensor whose reshapes it checks: 4.8 GB in float64);
- ``procgen.ProcgenEnv``: ``gym3.ToBaselinesVecEnv(FidelityEnv(...))``, as ``procgen.ProcgenEnv`` is
  ``ToBaselinesVecEnv(ProcgenGym3Env(...))`` (tiny frames, dense rewards, short episodes: see ``fidelity_env.py``);
- ``tyro.cli(Args)``: ``Args`` with the small settings of ``SETTINGS``;
- ``torch.utils.tensorboard.SummaryWriter``: writes nothing.

The recording Adam is the script's one optimizer; at each ``optimizer.step()`` it reads the script's own variables:
at the first step of each policy iteration the rollout (``obs``, ``actions``, ``logprobs``, ``rewards``,
``dones``, ``values``, ``next_value``, ``next_done``, ``advantages``, ``returns``, ``b_advantages``), at the first
step of each epoch the shuffled indices (``b_inds``, ``aux_inds``), at the first auxiliary step the parameters after
the policy phase and pi_old (``aux_pi``). Arrays keep CleanRL's layout: (step, env, ...); flat indices are
``step * num_envs + env``; auxiliary rollout ``k`` is column ``k`` = env ``k % num_envs`` of iteration
``k // num_envs``.
"""

import argparse
import builtins
import contextlib
import dataclasses
import io
import os
import sys
import types
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from fixtures import Float64Torch, git_commit, save_case, state_arrays  # noqa: E402

SCRIPT = os.path.join("cleanrl", "ppg_procgen.py")

# Small settings: 4 envs x 16 steps, 4 policy minibatches, N_pi = 2 (one phase), 2 aux epochs of 2-rollout minibatches
SETTINGS = dict(
    seed=1,
    cuda=False,
    num_envs=4,
    num_steps=16,
    num_minibatches=4,
    n_iteration=2,
    e_auxiliary=2,
    num_aux_rollouts=2,
    total_timesteps=4 * 16 * 2,
)
IMAGE_SIZE = 8

ROLLOUT_VARIABLES = ("obs", "actions", "logprobs", "rewards", "dones", "values", "advantages", "returns")


class CleanRLRecorder:
    """What the run records; the recording optimizer calls it at every step."""

    def __init__(self, source: str) -> None:
        step_lines = [number for number, line in enumerate(source.splitlines(), 1) if "optimizer.step()" in line]
        if len(step_lines) != 2:
            raise RuntimeError(f"expected 2 optimizer.step() calls in {SCRIPT} (policy, aux), found lines {step_lines}")
        self.policy_step_line, self.aux_step_line = step_lines
        self.arrays: dict[str, np.ndarray] = {}
        self.iteration = -1
        self.last_update: Any = None
        self.epochs_seen: set[tuple[int, int]] = set()
        self.aux_epochs_seen: set[int] = set()
        self.n_policy_steps = 0
        self.n_aux_steps = 0
        self.raw_rewards: list[np.ndarray] = []
        self.script_globals: dict[str, Any] = {}

    def on_init(self) -> None:
        self.arrays.update(state_arrays("init", self.script_globals["agent"]))

    def before_step(self, line: int) -> None:
        g = self.script_globals
        if line == self.policy_step_line:
            self.n_policy_steps += 1
            if g["update"] != self.last_update:
                self.last_update = g["update"]
                self.iteration += 1
                prefix = f"it{self.iteration}"
                for name in ROLLOUT_VARIABLES:
                    value = g[name].detach().cpu().numpy()
                    self.arrays[f"{prefix}/{name}"] = value.astype(np.uint8) if name == "obs" else value.copy()
                self.arrays[f"{prefix}/b_advantages"] = g["b_advantages"].detach().cpu().numpy().copy()
                self.arrays[f"{prefix}/next_value"] = g["next_value"].detach().cpu().numpy().reshape(-1).copy()
                self.arrays[f"{prefix}/next_done"] = g["next_done"].detach().cpu().numpy().copy()
                steps = g["args"].num_steps
                first = self.iteration * steps
                self.arrays[f"{prefix}/rewards_raw"] = np.stack(self.raw_rewards[first : first + steps])
            key = (self.iteration, g["epoch"])
            if key not in self.epochs_seen:
                self.epochs_seen.add(key)
                name = f"it{self.iteration}/b_inds"
                inds = g["b_inds"].copy()[None]
                self.arrays[name] = inds if name not in self.arrays else np.concatenate([self.arrays[name], inds])
        elif line == self.aux_step_line:
            if self.n_aux_steps == 0:
                self.arrays.update(state_arrays("policy", g["agent"]))
                self.arrays["old_logits"] = g["aux_pi"].detach().cpu().numpy().copy()
                self.arrays["aux_returns"] = g["aux_returns"].detach().cpu().numpy().copy()
            self.n_aux_steps += 1
            if g["auxiliary_update"] not in self.aux_epochs_seen:
                self.aux_epochs_seen.add(g["auxiliary_update"])
                inds = g["aux_inds"].copy()[None]
                previous = self.arrays.get("aux_inds")
                self.arrays["aux_inds"] = inds if previous is None else np.concatenate([previous, inds])
        else:
            raise RuntimeError(
                f"optimizer.step() called from line {line}, expected {self.policy_step_line} or {self.aux_step_line}"
            )


def make_stand_ins(recorder: CleanRLRecorder, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """
    The modules the script imports that are replaced (see the module docstring).

    :param settings: the script's ``Args`` (default ``SETTINGS``)
    """
    import gym3
    from fidelity_env import FidelityEnv

    class RecordingAdam(torch.optim.Adam):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            recorder.on_init()

        def step(self, closure: Any = None) -> Any:
            # The script's line that called step() (torch's optimizer hooks wrap step() in frames of their own)
            frame = sys._getframe(1)
            while frame.f_globals is not recorder.script_globals:
                frame = frame.f_back
            recorder.before_step(frame.f_lineno)
            return super().step(closure)

    class RecordingEnv(FidelityEnv):
        def act(self, ac: Any) -> None:
            super().act(ac)
            recorder.raw_rewards.append(self.reward.astype(np.float64))

    def procgen_env(num_envs: int, env_name: str, **kwargs: Any) -> gym3.ToBaselinesVecEnv:
        return gym3.ToBaselinesVecEnv(RecordingEnv(num=num_envs, image_size=IMAGE_SIZE, seed=SETTINGS["seed"]))

    def rand(*shape: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.uint8)

    class SummaryWriter:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def add_text(self, *args: Any, **kwargs: Any) -> None:
            pass

        def add_scalar(self, *args: Any, **kwargs: Any) -> None:
            pass

        def close(self) -> None:
            pass

    def cli(args_class: type) -> Any:
        return args_class(**(SETTINGS if settings is None else settings))

    return {
        "torch": Float64Torch(optim=types.SimpleNamespace(Adam=RecordingAdam), rand=rand),
        "procgen": types.SimpleNamespace(ProcgenEnv=procgen_env),
        "tyro": types.SimpleNamespace(cli=cli),
        "torch.utils.tensorboard": types.SimpleNamespace(SummaryWriter=SummaryWriter),
    }


def run_script(path: str, recorder: CleanRLRecorder, stand_ins: dict[str, Any] | None = None) -> dict[str, Any]:
    """
    Run ``ppg_procgen.py`` as ``__main__`` with the stand-ins; return its globals at the end.

    :param stand_ins: the replaced modules by name (default ``make_stand_ins(recorder)``)
    """
    with open(path) as file:
        source = file.read()
    if stand_ins is None:
        stand_ins = make_stand_ins(recorder)

    def script_import(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if name in stand_ins and name != "torch":
            return stand_ins[name]
        module = builtins.__import__(name, globals_, locals_, fromlist, level)
        if name == "torch" or (name.startswith("torch.") and not fromlist):
            return stand_ins["torch"]
        return module

    script_builtins = dict(vars(builtins), __import__=script_import)
    script_globals: dict[str, Any] = {"__name__": "__main__", "__file__": path, "__builtins__": script_builtins}
    recorder.script_globals = script_globals
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, path, "exec"), script_globals)
    return script_globals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", help="path of a checkout of vwxyzjn/cleanrl")
    parser.add_argument("--output", default=os.path.join(HERE, "..", "..", "tests", "data", "fidelity"))
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    path = os.path.join(args.checkout, SCRIPT)
    with open(path) as file:
        recorder = CleanRLRecorder(file.read())
    script_globals = run_script(path, recorder)
    agent = script_globals["agent"]
    assert all(p.dtype == torch.float64 for p in agent.parameters())
    recorder.arrays.update(state_arrays("aux", agent))
    cleanrl_args = dataclasses.asdict(script_globals["args"])
    metadata = dict(
        reference="vwxyzjn/cleanrl cleanrl/ppg_procgen.py",
        reference_commit=git_commit(args.checkout),
        case="cleanrl",
        args=cleanrl_args,
        image_size=IMAGE_SIZE,
        n_iterations=recorder.iteration + 1,
        n_policy_steps=recorder.n_policy_steps,
        n_aux_steps=recorder.n_aux_steps,
        layout=(
            "it{i}/* are CleanRL's (step, env) buffers (obs: step, env, H, W, C); b_advantages and b_inds are flat "
            "(index step * num_envs + env), b_inds one row per epoch, minibatches its consecutive slices of "
            "minibatch_size; aux_inds: one row per aux epoch (column k = env k % num_envs of iteration "
            "k // num_envs), minibatches consecutive slices of num_aux_rollouts; old_logits, aux_returns: (step, column)"
        ),
    )
    out = save_case(args.output, "cleanrl", recorder.arrays, metadata)
    print(f"cleanrl: {len(recorder.arrays)} arrays, {os.path.getsize(out) / 1024:.0f} KiB -> {out}")


if __name__ == "__main__":
    main()
