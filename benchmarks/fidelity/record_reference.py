"""
Record what the original PPG code (openai/phasic-policy-gradient) computes, in float64, for the fidelity fixtures.

Usage (the checkout is not part of this repository; bring it with ``git clone`` of the original repository):

    python benchmarks/fidelity/record_reference.py /path/to/phasic-policy-gradient [--output tests/data/fidelity]

For each case (``CASES``: arch ``dual`` / ``detach``, the clipped objective and the KL penalty ("ppgkl"), and
E_V != E_pi) the script runs the reference's own ``ppg.learn`` (with ``ppo.learn`` inside it) on a tiny gym3 env
(``fidelity_env.FidelityEnv``) for ``n_pi`` policy iterations, one auxiliary phase and one more policy iteration,
and records, from outside, by wrapping the reference's functions:

- ``init/*``, ``policy/*``, ``aux/*``, ``final/*``: the parameters (by the reference's names) at the start, after
  the policy phase (``ppo.learn`` returned), after the auxiliary phase and after the extra iteration;
- ``it{i}/*``: each rollout as the reference computed it: observations ``ob`` (E, T, H, W, C) uint8, actions ``ac``,
  ``first`` flags, behaviour log-probs ``logp``, values ``vpred``, the bootstrap ``vpredfinal`` with ``finalfirst``,
  raw and normalized rewards (``reward_raw``, ``reward``), raw advantages ``adv_raw``, value targets ``vtarg``,
  normalized advantages ``adv``, and the env-row permutations of its epochs (``vf_perms`` for separate value epochs,
  ``pi_perms``);
- ``old_logits``: pi_old, the distribution the auxiliary phase clones (normalized logits), (n_pi, E, T, A);
- ``aux_perms``: the permutations of the (env, iteration) rollouts of each auxiliary epoch.

How the float64 run works: ``torch.set_default_dtype(torch.float64)`` builds the networks in float64, and the
reference modules that cast to float32 (observations in ``impala_cnn``, GAE buffers in ``ppo``, minibatches in
``minibatch_optimize``, statistics in ``reward_normalizer``) get a ``torch`` whose ``float32`` is ``float64``
(``fixtures.Float64Torch``). ``mpi4py`` is the single-process stand-in in ``mpi_stub/``; ``RCALL_LOGDIR`` is set.
The reference's files are not modified.
"""

import argparse
import itertools
import os
import shutil
import sys
import tempfile
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "mpi_stub"))

import torch as th  # noqa: E402
from fixtures import Float64Torch, git_commit, save_case, state_arrays  # noqa: E402

# Small settings shared by every case: E envs x T steps, N_pi iterations, 2 env rows per policy minibatch,
# 2 rollouts per auxiliary minibatch (4 minibatches per auxiliary epoch), 2 auxiliary epochs, tiny IMPALA.
SETTINGS = dict(
    num_envs=4,
    nstep=16,
    n_pi=2,
    nminibatch=2,
    aux_mbsize=2,
    n_aux_epochs=2,
    chans=(2, 4, 4),
    outsize=16,
    image_size=8,
    lr=5e-4,
    aux_lr=5e-4,
    gamma=0.999,
    lam=0.95,
    beta_clone=1.0,
    vf_true_weight=1.0,
)

# name: (arch, clip_param, kl_penalty, n_epoch_pi, n_epoch_vf, seed)
CASES = {
    "orig_dual_clip": ("dual", 0.2, 0.0, 1, 1, 1),
    "orig_dual_kl": ("dual", 0.0, 1.0, 1, 1, 2),
    "orig_detach_clip": ("detach", 0.2, 0.0, 1, 1, 3),
    "orig_detach_kl": ("detach", 0.0, 1.0, 1, 1, 4),
    "orig_dual_clip_epi2_ev3": ("dual", 0.2, 0.0, 2, 3, 5),
}


def import_reference(checkout: str) -> dict[str, Any]:
    """Import the reference's modules from its checkout and give the float32-casting ones a float64 ``torch``."""
    sys.path.insert(0, checkout)
    os.environ.setdefault("RCALL_NUM_GPU", "0")
    from phasic_policy_gradient import (
        envs,
        impala_cnn,
        logger,
        minibatch_optimize,
        ppg,
        ppo,
        reward_normalizer,
    )
    from phasic_policy_gradient import torch_util as tu

    tu.register_distributions_for_tree_util()
    return dict(
        envs=envs,
        impala_cnn=impala_cnn,
        logger=logger,
        minibatch_optimize=minibatch_optimize,
        ppg=ppg,
        ppo=ppo,
        reward_normalizer=reward_normalizer,
        tu=tu,
    )


class Recorder:
    """Wraps the reference's functions for one run and collects what they compute."""

    def __init__(self, ref: dict[str, Any], model: th.nn.Module, n_pi: int) -> None:
        self.ref = ref
        self.model = model
        self.n_pi = n_pi
        self.arrays: dict[str, np.ndarray] = state_arrays("init", model)
        self.policy_perms: list[np.ndarray] = []
        self.aux_perms: list[np.ndarray] = []
        self.iterations: list[dict[str, np.ndarray]] = []
        self.perm_starts: list[int] = []
        self.n_learn_calls = 0
        self.n_aux_epochs_done = 0
        self.last_gae: dict[str, np.ndarray] = {}
        self.last_raw_reward: np.ndarray | None = None
        self.originals: list[tuple[Any, str, Any]] = []

    def patch(self, module: Any, name: str, value: Any) -> None:
        self.originals.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def restore(self) -> None:
        for module, name, value in reversed(self.originals):
            setattr(module, name, value)

    def install(self, n_aux_epochs: int) -> None:
        ref = self.ref
        ppo, ppg = ref["ppo"], ref["ppg"]
        # float64 everywhere the reference casts to float32; permutations recorded
        self.patch(ref["impala_cnn"], "th", Float64Torch())
        self.patch(ppo, "th", Float64Torch())
        self.patch(ref["reward_normalizer"], "th", Float64Torch())
        self.patch(ref["minibatch_optimize"], "th", Float64Torch(randperm_log=self.policy_perms))
        self.patch(ppg, "th", Float64Torch(randperm_log=self.aux_perms))

        recorder = self
        base_normalizer = ppo.RewardNormalizer

        class RecordingRewardNormalizer(base_normalizer):
            def __call__(self, reward, first):
                recorder.last_raw_reward = reward.detach().cpu().double().numpy().copy()
                return super().__call__(reward, first)

        self.patch(ppo, "RewardNormalizer", RecordingRewardNormalizer)

        compute_gae = ppo.compute_gae

        def recording_compute_gae(**kwargs):
            adv, vtarg = compute_gae(**kwargs)
            self.last_gae = dict(
                vpredfinal=kwargs["vpred"][:, -1].detach().cpu().numpy().copy(),
                finalfirst=kwargs["first"][:, -1].detach().cpu().numpy().astype(bool),
                adv_raw=adv.detach().cpu().numpy().copy(),
            )
            return adv, vtarg

        self.patch(ppo, "compute_gae", recording_compute_gae)

        compute_advantage = ppo.compute_advantage

        def recording_compute_advantage(model, seg, *args, **kwargs):
            compute_advantage(model, seg, *args, **kwargs)
            self.perm_starts.append(len(self.policy_perms))
            record = {key: seg[key].detach().cpu().numpy().copy() for key in ("ob", "ac", "logp", "vpred", "vtarg", "adv")}
            record["first"] = seg["first"].detach().cpu().numpy().astype(bool)
            record["reward"] = seg["reward"].detach().cpu().double().numpy().copy()
            record["reward_raw"] = self.last_raw_reward
            record.update(self.last_gae)
            self.iterations.append(record)

        self.patch(ppo, "compute_advantage", recording_compute_advantage)

        learn = ppo.learn

        def recording_learn(**kwargs):
            state = learn(**kwargs)
            self.n_learn_calls += 1
            prefix = "policy" if self.n_learn_calls == 1 else "final"
            self.arrays.update(state_arrays(prefix, self.model))
            return state

        self.patch(ppo, "learn", recording_learn)

        presleep = ppg.compute_presleep_outputs

        def recording_presleep(*, model, segs, mbsize, **kwargs):
            presleep(model=model, segs=segs, mbsize=mbsize, **kwargs)
            self.arrays["old_logits"] = np.stack([seg["oldpd"].logits.detach().cpu().numpy() for seg in segs])

        self.patch(ppg, "compute_presleep_outputs", recording_presleep)

        aux_train = ppg.aux_train

        def recording_aux_train(**kwargs):
            aux_train(**kwargs)
            self.n_aux_epochs_done += 1
            if self.n_aux_epochs_done == n_aux_epochs:
                self.arrays.update(state_arrays("aux", self.model))

        self.patch(ppg, "aux_train", recording_aux_train)

    def finish(self, n_epoch_pi: int, n_epoch_vf: int) -> dict[str, np.ndarray]:
        """Assemble the arrays of the run: per-iteration records with their minibatch permutations."""
        self.perm_starts.append(len(self.policy_perms))
        n_vf = n_epoch_vf if n_epoch_vf != n_epoch_pi else 0
        for index, record in enumerate(self.iterations):
            perms = self.policy_perms[self.perm_starts[index] : self.perm_starts[index + 1]]
            assert len(perms) == n_vf + n_epoch_pi, (len(perms), n_vf, n_epoch_pi)
            if n_vf:
                record["vf_perms"] = np.stack(perms[:n_vf])
            record["pi_perms"] = np.stack(perms[n_vf:])
            for key, value in record.items():
                self.arrays[f"it{index}/{key}"] = value
        self.arrays["aux_perms"] = np.stack(self.aux_perms)
        return self.arrays


def record_case(ref: dict[str, Any], name: str, arch: str, clip: float, kl: float, e_pi: int, e_vf: int, seed: int):
    """Run one case of the reference and return its arrays and settings."""
    import gym3
    from fidelity_env import FidelityEnv

    s = SETTINGS
    th.manual_seed(seed)
    np.random.seed(seed)
    # The reference's get_venv with FidelityEnv in place of ProcgenGym3Env
    venv = gym3.ExtractDictObWrapper(FidelityEnv(num=s["num_envs"], image_size=s["image_size"], seed=seed), "rgb")

    def enc_fn(obtype):
        return ref["impala_cnn"].ImpalaEncoder(obtype.shape, outsize=s["outsize"], chans=s["chans"])

    model = ref["ppg"].PhasicValueModel(venv.ob_space, venv.ac_space, enc_fn, arch=arch)
    assert all(p.dtype == th.float64 for p in model.parameters())
    recorder = Recorder(ref, model, s["n_pi"])
    recorder.install(s["n_aux_epochs"])
    log_dir = tempfile.mkdtemp(prefix=f"ppg-{name}-")
    os.environ["RCALL_LOGDIR"] = log_dir
    ref["logger"].configure(dir=log_dir, format_strs=["csv"])
    try:
        # As train.py's train_fn, with the small settings; n_pi iterations, one aux phase, one more iteration
        ref["ppg"].learn(
            venv=venv,
            model=model,
            interacts_total=(s["n_pi"] + 1) * s["num_envs"] * s["nstep"],
            ppo_hps=dict(
                lr=s["lr"],
                γ=s["gamma"],
                λ=s["lam"],
                nminibatch=s["nminibatch"],
                n_epoch_vf=e_vf,
                n_epoch_pi=e_pi,
                clip_param=clip,
                kl_penalty=kl,
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
        shutil.rmtree(log_dir, ignore_errors=True)
    arrays = recorder.finish(e_pi, e_vf)
    assert recorder.n_learn_calls == 2 and recorder.n_aux_epochs_done == s["n_aux_epochs"]
    # The aux minibatches index (env, iteration) pairs in this order (ppg.make_minibatches)
    pairs = np.array(list(itertools.product(range(s["num_envs"]), range(s["n_pi"]))))
    metadata = dict(
        reference="openai/phasic-policy-gradient",
        case=name,
        arch=arch,
        clip_param=clip,
        kl_penalty=kl,
        n_epoch_pi=e_pi,
        n_epoch_vf=e_vf,
        seed=seed,
        vfcoef=0.5,
        entcoef=0.01,
        settings={key: list(value) if isinstance(value, tuple) else value for key, value in s.items()},
        aux_pairs_env_iteration=pairs.tolist(),
        n_iterations=len(recorder.iterations),
        layout=(
            "it{i}/* are (env, step) arrays (ob: env, step, H, W, C); pi_perms / vf_perms: one permutation of the env "
            "rows per epoch, split into nminibatch chunks with torch.chunk; aux_perms: per aux epoch, a permutation of "
            "aux_pairs_env_iteration split into chunks of aux_mbsize; old_logits: (iteration, env, step, action)"
        ),
    )
    return arrays, metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", help="path of a checkout of openai/phasic-policy-gradient")
    parser.add_argument("--output", default=os.path.join(HERE, "..", "..", "tests", "data", "fidelity"))
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    th.set_default_dtype(th.float64)
    th.set_num_threads(1)
    ref = import_reference(os.path.abspath(args.checkout))
    commit = git_commit(args.checkout)
    for name in args.cases:
        arrays, metadata = record_case(ref, name, *CASES[name])
        metadata["reference_commit"] = commit
        path = save_case(args.output, name, arrays, metadata)
        print(f"{name}: {len(arrays)} arrays, {os.path.getsize(path) / 1024:.0f} KiB -> {path}")


if __name__ == "__main__":
    main()
