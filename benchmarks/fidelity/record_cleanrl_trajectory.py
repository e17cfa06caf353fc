"""
Record CleanRL's ``ppg_procgen.py`` run end to end on a real Procgen game, in float64, for the trajectory fixture
(issue 28): the env stack, the rollouts, the reward normalization, GAE, three policy iterations and one auxiliary phase.

Usage (the checkout is not part of this repository; CleanRL's script needs gym 0.23.1, see docs/fidelity.md):

    python benchmarks/fidelity/record_cleanrl_trajectory.py /path/to/cleanrl [--output tests/data/fidelity]

``ppg_procgen.py`` runs as ``__main__``, unmodified, with its own env stack (``procgen.ProcgenEnv``, gym 0.23.1's
``TransformObservation``, ``RecordEpisodeStatistics``, ``NormalizeReward(gamma)``, ``TransformReward(clip 10)``) and the
stand-ins of ``record_cleanrl.py`` (float64 ``torch``, a recording Adam, ``tyro``, ``SummaryWriter``), plus:

- ``procgen.ProcgenEnv``: procgen's own, with ``rand_seed=RAND_SEED`` added (CleanRL passes none, so its levels are
  random) and its rewards and episode ends recorded as they leave procgen;
- ``Categorical``: torch's, whose ``sample()`` takes the next row of recorded uniform numbers and returns the inverse-CDF
  sample (``fixtures.inverse_cdf_sample``): the replay draws its actions from the same numbers;
- the initial weights: after CleanRL's own initialization, every weight is replaced by ``fixtures.seeded_normed_weight``
  with the row norm CleanRL gave it (its biases are zero), so that the replay builds them without a 4 MB fixture.

Recorded (``cleanrl_trajectory.npz``; CleanRL's layout, (step, env)): per iteration ``it{i}/``: frame checksums of the
observations and of the observation after the rollout, actions, behaviour log-probs, raw and normalized rewards, dones,
values, the bootstrap value ``next_value`` with ``next_done``, advantages, returns, the normalized advantages, the
shuffled indices of each epoch, the reward normalizer's running return and statistics at the end of the rollout, and
fingerprints of the parameters after the iteration's policy phase (``fixtures.fingerprint``); pi_old, the auxiliary
returns and permutations, the parameters after the auxiliary phase.
"""

import argparse
import dataclasses
import os
import sys
import types
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from fixtures import (  # noqa: E402
    fingerprint,
    frame_checksums,
    git_commit,
    inverse_cdf_sample,
    save_case,
    seeded_normed_weight,
)
from record_cleanrl import SCRIPT, CleanRLRecorder, make_stand_ins, run_script  # noqa: E402

GAME = "starpilot"
# 2 envs x 16 steps, 4 policy minibatches of 8, N_pi = 3 (one phase), 2 aux epochs of 2-rollout minibatches
SETTINGS = dict(
    seed=1,
    cuda=False,
    env_id=GAME,
    num_envs=2,
    num_steps=16,
    num_minibatches=4,
    n_iteration=3,
    e_auxiliary=2,
    num_aux_rollouts=2,
    total_timesteps=2 * 16 * 3,
)
#: procgen's level seed: with it, one of the two games ends an episode within the 48 recorded steps
RAND_SEED = 9
WEIGHT_SEED = 28
UNIFORM_SEED = 28

ROLLOUT_VARIABLES = ("actions", "logprobs", "rewards", "dones", "values", "advantages", "returns")


class TrajectoryRecorder(CleanRLRecorder):
    """What the run records; the recording optimizer, the env and the sampling call it."""

    def __init__(self, source: str, uniforms: np.ndarray) -> None:
        super().__init__(source)
        self.uniforms = uniforms
        self.n_samples = 0
        self.raw_dones: list[np.ndarray] = []
        self.weight_scales: dict[str, float] = {}
        self.procgen_kwargs: dict[str, Any] = {}

    def parameters(self, prefix: str) -> None:
        for name, param in self.script_globals["agent"].named_parameters():
            self.arrays[f"{prefix}/{name}"] = fingerprint(name, param.detach().cpu().numpy())

    def on_init(self) -> None:
        """Replace CleanRL's initial weights by seeded ones with its row norms (its biases are zero)."""
        with torch.no_grad():
            for name, param in self.script_globals["agent"].named_parameters():
                if name.endswith(".bias"):
                    assert not param.any(), name
                    continue
                norms = param.reshape(param.shape[0], -1).norm(dim=1)
                assert torch.allclose(norms, norms[0], rtol=1e-12), name
                self.weight_scales[name] = float(norms[0])
                param.copy_(torch.from_numpy(seeded_normed_weight(name, tuple(param.shape), float(norms[0]), WEIGHT_SEED)))

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        uniforms = torch.from_numpy(self.uniforms[self.n_samples])
        self.n_samples += 1
        return inverse_cdf_sample(probs, uniforms)

    def before_step(self, line: int) -> None:
        g = self.script_globals
        if line == self.policy_step_line:
            self.n_policy_steps += 1
            if g["update"] != self.last_update:
                if self.iteration >= 0:
                    self.parameters(f"it{self.iteration}/params")
                self.last_update = g["update"]
                self.iteration += 1
                self.record_rollout(f"it{self.iteration}")
            key = (self.iteration, g["epoch"])
            if key not in self.epochs_seen:
                self.epochs_seen.add(key)
                name = f"it{self.iteration}/b_inds"
                inds = g["b_inds"].copy()[None]
                self.arrays[name] = inds if name not in self.arrays else np.concatenate([self.arrays[name], inds])
        elif line == self.aux_step_line:
            if self.n_aux_steps == 0:
                self.parameters(f"it{self.iteration}/params")
                self.arrays["old_logits"] = g["aux_pi"].detach().cpu().numpy().copy()
                self.arrays["aux_returns"] = g["aux_returns"].detach().cpu().numpy().copy()
            self.n_aux_steps += 1
            if g["auxiliary_update"] not in self.aux_epochs_seen:
                self.aux_epochs_seen.add(g["auxiliary_update"])
                inds = g["aux_inds"].copy()[None]
                previous = self.arrays.get("aux_inds")
                self.arrays["aux_inds"] = inds if previous is None else np.concatenate([previous, inds])
        else:
            raise RuntimeError(f"optimizer.step() called from line {line}")

    def record_rollout(self, prefix: str) -> None:
        g = self.script_globals
        for name in ROLLOUT_VARIABLES:
            self.arrays[f"{prefix}/{name}"] = g[name].detach().cpu().numpy().copy()
        self.arrays[f"{prefix}/obs_crc"] = frame_checksums(g["obs"].detach().cpu().numpy().astype(np.uint8))
        self.arrays[f"{prefix}/next_obs_crc"] = frame_checksums(g["next_obs"].detach().cpu().numpy().astype(np.uint8))
        self.arrays[f"{prefix}/b_advantages"] = g["b_advantages"].detach().cpu().numpy().copy()
        self.arrays[f"{prefix}/next_value"] = g["next_value"].detach().cpu().numpy().reshape(-1).copy()
        self.arrays[f"{prefix}/next_done"] = g["next_done"].detach().cpu().numpy().copy()
        steps = g["args"].num_steps
        first = self.iteration * steps
        self.arrays[f"{prefix}/rewards_raw"] = np.stack(self.raw_rewards[first : first + steps])
        self.arrays[f"{prefix}/dones_raw"] = np.stack(self.raw_dones[first : first + steps])
        # gym 0.23.1's NormalizeReward: TransformReward(clip) wraps it
        normalizer = g["envs"].env
        assert type(normalizer).__name__ == "NormalizeReward", type(normalizer)
        rms = normalizer.return_rms
        self.arrays[f"{prefix}/reward_running_return"] = np.asarray(normalizer.returns, dtype=np.float64).copy()
        self.arrays[f"{prefix}/reward_statistics"] = np.array([rms.mean, rms.var, rms.count], dtype=np.float64)


def make_trajectory_stand_ins(recorder: TrajectoryRecorder) -> dict[str, Any]:
    """``record_cleanrl``'s stand-ins with procgen's real env (seeded, recorded) and the inverse-CDF ``Categorical``."""
    import procgen
    from torch.distributions.categorical import Categorical

    stand_ins = make_stand_ins(recorder, dict(SETTINGS))

    def procgen_env(num_envs: int, env_name: str, **kwargs: Any) -> Any:
        recorder.procgen_kwargs = dict(kwargs)
        venv = procgen.ProcgenEnv(num_envs=num_envs, env_name=env_name, rand_seed=RAND_SEED, **kwargs)
        step_wait = venv.step_wait

        def recording_step_wait() -> Any:
            observations, rewards, dones, infos = step_wait()
            recorder.raw_rewards.append(np.asarray(rewards, dtype=np.float64).copy())
            recorder.raw_dones.append(np.asarray(dones, dtype=bool).copy())
            return observations, rewards, dones, infos

        venv.step_wait = recording_step_wait
        return venv

    class UniformCategorical(Categorical):
        def sample(self, sample_shape: Any = ()) -> torch.Tensor:
            assert tuple(sample_shape) == ()
            return recorder.sample(self.probs)

    stand_ins["procgen"] = types.SimpleNamespace(ProcgenEnv=procgen_env)
    stand_ins["torch.distributions.categorical"] = types.SimpleNamespace(Categorical=UniformCategorical)
    return stand_ins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", help="path of a checkout of vwxyzjn/cleanrl")
    parser.add_argument("--output", default=os.path.join(HERE, "..", "..", "tests", "data", "fidelity"))
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    path = os.path.join(args.checkout, SCRIPT)
    n_samples = SETTINGS["n_iteration"] * SETTINGS["num_steps"]
    uniforms = np.random.default_rng(UNIFORM_SEED).random((n_samples, SETTINGS["num_envs"]))
    with open(path) as file:
        recorder = TrajectoryRecorder(file.read(), uniforms)
    script_globals = run_script(path, recorder, make_trajectory_stand_ins(recorder))
    agent = script_globals["agent"]
    assert all(p.dtype == torch.float64 for p in agent.parameters())
    assert recorder.n_samples == n_samples, (recorder.n_samples, n_samples)
    recorder.parameters("aux/params")
    recorder.arrays["uniforms"] = uniforms
    n_dones = int(sum(dones.sum() for dones in recorder.raw_dones))
    metadata = dict(
        reference="vwxyzjn/cleanrl cleanrl/ppg_procgen.py",
        reference_commit=git_commit(args.checkout),
        case="cleanrl_trajectory",
        args=dataclasses.asdict(script_globals["args"]),
        procgen_kwargs=recorder.procgen_kwargs,
        rand_seed=RAND_SEED,
        weight_seed=WEIGHT_SEED,
        weight_scales=recorder.weight_scales,
        n_iterations=recorder.iteration + 1,
        n_policy_steps=recorder.n_policy_steps,
        n_aux_steps=recorder.n_aux_steps,
        n_episode_ends=n_dones,
        layout=(
            "it{i}/* are CleanRL's (step, env) buffers; *_crc: CRC-32 of each (H, W, C) uint8 frame; b_advantages, "
            "b_inds flat (index step * num_envs + env), b_inds one row per epoch; it{i}/params/<name>: "
            "fixtures.fingerprint of each parameter after iteration i's policy phase, aux/params/<name> after the aux "
            "phase; uniforms: (sample, env), one row per rollout step; aux_inds: one row per aux epoch (column k = env "
            "k % num_envs of iteration k // num_envs); old_logits, aux_returns: (step, column); reward_statistics: "
            "NormalizeReward's return_rms [mean, var, count] at the end of the rollout"
        ),
    )
    out = save_case(args.output, "cleanrl_trajectory", recorder.arrays, metadata)
    print(f"cleanrl_trajectory: {len(recorder.arrays)} arrays, {n_dones} episode ends, {os.path.getsize(out) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
