"""
Record the original PPG code's run (openai/phasic-policy-gradient) end to end on a real Procgen game, in float64, for
the trajectory fixture (issue 28): its env (``envs.get_venv``: ``ProcgenGym3Env`` + ``ExtractDictObWrapper``), its
``Roller``, its ``RewardNormalizer`` (per-rollout statistics), GAE, three policy iterations, one auxiliary phase and one
more iteration, as ``train.py``'s ``train_fn`` runs them (the paper's settings: hard mode, arch ``dual``).

Usage (the checkout is not part of this repository; see docs/fidelity.md):

    python benchmarks/fidelity/record_reference_trajectory.py /path/to/phasic-policy-gradient [--output tests/data/fidelity]

The reference runs unmodified, with ``record_reference.py``'s stand-ins (float64 ``torch`` where it casts to float32, a
single-process ``mpi4py``, its functions wrapped from outside to record what they compute), and:

- procgen's level seed ``rand_seed=RAND_SEED`` passed to ``get_venv`` (``train.py`` passes none: random levels);
- ``torch.distributions.Categorical.sample``: the inverse-CDF sample of the next row of recorded uniform numbers
  (``fixtures.inverse_cdf_sample``), so that the replay draws its actions from the same numbers;
- the initial weights: after the reference's own initialization, every weight is replaced by
  ``fixtures.seeded_normed_weight`` with the row norm the reference gave it (its biases are zero);
- the raw rewards enter ``RewardNormalizer`` as float64 (procgen's float32 rewards are small integers: exact), so that
  its discounted returns are not rounded to float32.

Recorded (``orig_trajectory.npz``; the reference's layout, (env, step)): per iteration ``it{i}/``: frame checksums of the
observations (``ob_crc``) and of the observation after the rollout (``finalob_crc``), actions, firsts, behaviour
log-probs, values, the bootstrap ``vpredfinal`` with ``finalfirst``, raw and normalized rewards, raw advantages, value
targets, normalized advantages, the env-row permutations of its epochs, the reward normalizer's running return and
statistics after the rollout, fingerprints of the parameters after its policy phase (``it{i}/params``); pi_old, the
auxiliary permutations; ``policy/``, ``aux/``, ``final/`` parameter fingerprints.
"""

import argparse
import os
import sys
import tempfile
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "mpi_stub"))

import torch as th  # noqa: E402
from fixtures import (  # noqa: E402
    fingerprint,
    frame_checksums,
    git_commit,
    inverse_cdf_sample,
    save_case,
    seeded_normed_weight,
)
from record_reference import Recorder, import_reference  # noqa: E402

GAME = "starpilot"
# train.py's settings (the paper's) but for the size: 2 envs x 16 steps, N_pi = 3, 2 aux epochs of 2-rollout minibatches
SETTINGS = dict(
    env_name=GAME,
    distribution_mode="hard",
    arch="dual",
    num_envs=2,
    nstep=16,
    n_pi=3,
    nminibatch=8,
    aux_mbsize=2,
    n_aux_epochs=2,
    chans=(16, 32, 32),
    outsize=256,
    lr=5e-4,
    aux_lr=5e-4,
    gamma=0.999,
    lam=0.95,
    clip_param=0.2,
    kl_penalty=0.0,
    n_epoch_pi=1,
    n_epoch_vf=1,
    beta_clone=1.0,
    vf_true_weight=1.0,
)
#: procgen's level seed: with it, an episode ends within the recorded steps
RAND_SEED = 45
WEIGHT_SEED = 28
UNIFORM_SEED = 28
SEED = 1
PARAMETER_PREFIXES = ("policy", "aux", "final")


class TrajectoryRecorder(Recorder):
    """``record_reference.Recorder`` with the trajectory's extra records and stand-ins."""

    def __init__(self, ref: dict[str, Any], model: th.nn.Module, n_pi: int, uniforms: np.ndarray) -> None:
        super().__init__(ref, model, n_pi)
        self.uniforms = uniforms
        self.n_samples = 0
        self.n_advantages = 0
        self.normalizer_states: list[dict[str, np.ndarray]] = []
        self.final_observations: list[np.ndarray] = []

    def sample(self, probs: th.Tensor) -> th.Tensor:
        """The original code samples (env, 1) actions from (env, 1, n) probabilities."""
        uniforms = th.from_numpy(self.uniforms[self.n_samples])
        self.n_samples += 1
        return inverse_cdf_sample(probs.reshape(len(uniforms), -1), uniforms).reshape(probs.shape[:-1])

    def install(self, n_aux_epochs: int) -> None:
        super().install(n_aux_epochs)
        ppo = self.ref["ppo"]
        recorder = self
        recording_normalizer = ppo.RewardNormalizer

        class Float64RewardNormalizer(recording_normalizer):
            def __call__(self, reward, first):
                normalized = super().__call__(reward.double(), first)
                rms = self.ret_rms
                recorder.normalizer_states.append(
                    dict(
                        running_return=self.ret.detach().cpu().double().numpy().copy(),
                        statistics=np.array([float(rms.mean), float(rms.var), float(rms.count)]),
                    )
                )
                return normalized

        self.patch(ppo, "RewardNormalizer", Float64RewardNormalizer)
        recording_compute_advantage = ppo.compute_advantage

        def compute_advantage(model, seg, *args, **kwargs):
            # The parameters now are those after the previous iteration's policy phase (after the aux phase for the
            # iteration that follows it: recorded as "aux")
            if 0 < self.n_advantages < self.n_pi:
                self.arrays.update(parameter_fingerprints(f"it{self.n_advantages - 1}/params", model))
            self.n_advantages += 1
            self.final_observations.append(frame_checksums(seg["finalob"].detach().cpu().numpy()))
            return recording_compute_advantage(model, seg, *args, **kwargs)

        self.patch(ppo, "compute_advantage", compute_advantage)

        def sample(distribution: th.distributions.Categorical, sample_shape: Any = ()) -> th.Tensor:
            assert tuple(sample_shape) == ()
            return self.sample(distribution.probs)

        self.patch(th.distributions.Categorical, "sample", sample)

    def finish(self, n_epoch_pi: int, n_epoch_vf: int) -> dict[str, np.ndarray]:
        arrays = super().finish(n_epoch_pi, n_epoch_vf)
        for index, (state, final) in enumerate(zip(self.normalizer_states, self.final_observations, strict=True)):
            arrays[f"it{index}/ob_crc"] = frame_checksums(arrays.pop(f"it{index}/ob"))
            arrays[f"it{index}/finalob_crc"] = final
            arrays[f"it{index}/reward_running_return"] = state["running_return"]
            arrays[f"it{index}/reward_statistics"] = state["statistics"]
        for key in [key for key in arrays if key.split("/")[0] in PARAMETER_PREFIXES]:
            prefix, name = key.split("/", 1)
            arrays[f"{prefix}/params/{name}"] = fingerprint(name, arrays.pop(key))
        arrays.update(parameter_fingerprints("init/params", self.model))
        for key in [key for key in arrays if key.startswith("init/") and not key.startswith("init/params/")]:
            del arrays[key]
        return arrays


def parameter_fingerprints(prefix: str, model: th.nn.Module) -> dict[str, np.ndarray]:
    return {f"{prefix}/{name}": fingerprint(name, p.detach().cpu().numpy()) for name, p in model.named_parameters()}


def seed_weights(model: th.nn.Module) -> dict[str, float]:
    """Replace the reference's initial weights by seeded ones with its row norms (its biases are zero)."""
    scales = {}
    with th.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                assert not param.any(), name
                continue
            norms = param.reshape(param.shape[0], -1).norm(dim=1)
            assert th.allclose(norms, norms[0], rtol=1e-12), name
            scales[name] = float(norms[0])
            param.copy_(th.from_numpy(seeded_normed_weight(name, tuple(param.shape), float(norms[0]), WEIGHT_SEED)))
    return scales


def record(ref: dict[str, Any], rand_seed: int = RAND_SEED) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run the reference as ``train.py``'s ``train_fn`` with ``SETTINGS``; return its arrays and settings."""
    s = SETTINGS
    th.manual_seed(SEED)
    np.random.seed(SEED)
    venv = ref["envs"].get_venv(
        num_envs=s["num_envs"], env_name=s["env_name"], distribution_mode=s["distribution_mode"], rand_seed=rand_seed
    )

    def enc_fn(obtype):
        return ref["impala_cnn"].ImpalaEncoder(obtype.shape, outsize=s["outsize"], chans=s["chans"])

    model = ref["ppg"].PhasicValueModel(venv.ob_space, venv.ac_space, enc_fn, arch=s["arch"])
    assert all(p.dtype == th.float64 for p in model.parameters())
    scales = seed_weights(model)
    n_samples = (s["n_pi"] + 1) * s["nstep"]
    uniforms = np.random.default_rng(UNIFORM_SEED).random((n_samples, s["num_envs"]))
    recorder = TrajectoryRecorder(ref, model, s["n_pi"], uniforms)
    recorder.install(s["n_aux_epochs"])
    log_dir = tempfile.mkdtemp(prefix="ppg-trajectory-")
    os.environ["RCALL_LOGDIR"] = log_dir
    ref["logger"].configure(dir=log_dir, format_strs=["csv"])
    try:
        ref["ppg"].learn(
            venv=venv,
            model=model,
            interacts_total=(s["n_pi"] + 1) * s["num_envs"] * s["nstep"],
            ppo_hps=dict(
                lr=s["lr"],
                γ=s["gamma"],
                λ=s["lam"],
                nminibatch=s["nminibatch"],
                n_epoch_vf=s["n_epoch_vf"],
                n_epoch_pi=s["n_epoch_pi"],
                clip_param=s["clip_param"],
                kl_penalty=s["kl_penalty"],
                nstep=s["nstep"],
                log_save_opts={"save_mode": "none"},
                verbose=False,
            ),
            aux_lr=s["aux_lr"],
            aux_mbsize=s["aux_mbsize"],
            n_aux_epochs=s["n_aux_epochs"],
            n_pi=s["n_pi"],
            name2coef={"pol_distance": s["beta_clone"], "vf_true": s["vf_true_weight"]},
        )
    finally:
        recorder.restore()
        ref["logger"].get_current().close()
    arrays = recorder.finish(s["n_epoch_pi"], s["n_epoch_vf"])
    assert recorder.n_samples == n_samples, (recorder.n_samples, n_samples)
    arrays["uniforms"] = uniforms
    n_ends = int(sum(arrays[f"it{i}/first"][:, 1:].sum() for i in range(len(recorder.iterations))))
    n_ends += int(sum(arrays[f"it{i}/finalfirst"].sum() for i in range(len(recorder.iterations))))
    pairs = [[env, seg] for env in range(s["num_envs"]) for seg in range(s["n_pi"])]
    metadata = dict(
        reference="openai/phasic-policy-gradient",
        case="orig_trajectory",
        settings={key: list(value) if isinstance(value, tuple) else value for key, value in s.items()},
        vfcoef=0.5,
        entcoef=0.01,
        rand_seed=rand_seed,
        weight_seed=WEIGHT_SEED,
        weight_scales=scales,
        seed=SEED,
        aux_pairs_env_iteration=pairs,
        n_iterations=len(recorder.iterations),
        n_episode_ends=n_ends,
        layout=(
            "it{i}/* are (env, step) arrays; *_crc: CRC-32 of each (H, W, C) uint8 frame; pi_perms: one permutation of "
            "the env rows per epoch, split into nminibatch chunks with torch.chunk; it{i}/params/<name>: "
            "fixtures.fingerprint of each parameter after iteration i's policy phase (i < n_pi - 1; 'policy' after the "
            "last one), aux/params after the aux phase, final/params after the iteration that follows; aux_perms: per "
            "aux epoch, a permutation of aux_pairs_env_iteration split into chunks of aux_mbsize; old_logits: "
            "(iteration, env, step, action); uniforms: (sample, env); reward_statistics: RewardNormalizer's ret_rms "
            "[mean, var, count] after the rollout"
        ),
    )
    return arrays, metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", help="path of a checkout of openai/phasic-policy-gradient")
    parser.add_argument("--output", default=os.path.join(HERE, "..", "..", "tests", "data", "fidelity"))
    parser.add_argument("--rand-seed", type=int, default=RAND_SEED, help="procgen's level seed")
    args = parser.parse_args()
    th.set_default_dtype(th.float64)
    th.set_num_threads(1)
    ref = import_reference(os.path.abspath(args.checkout))
    arrays, metadata = record(ref, args.rand_seed)
    metadata["reference_commit"] = git_commit(args.checkout)
    path = save_case(args.output, "orig_trajectory", arrays, metadata)
    ends = metadata["n_episode_ends"]
    print(f"orig_trajectory: {len(arrays)} arrays, {ends} episode ends, {os.path.getsize(path) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
