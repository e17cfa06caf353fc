"""
The training runs of tests/test_distributed.py and tests/test_distributed_checkpoints.py, one per process:
``python tests/distributed_worker.py SCENARIO OUT_DIR`` with torchrun's environment variables (or none, for the
single-process reference). Each rank writes what the test checks to ``OUT_DIR/rank<r>.pt``.
"""

import os
import pathlib
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch as th
from double_precision import run_in_float64  # tests/ is on sys.path: this script's folder, or added by the test
from helpers import parameters, small_ppg
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppg import PPG, MaskablePPG, PPGCheckpointCallback
from sb3_ppg.common import distributed
from sb3_ppg.common.checkpoints import write_checkpoint
from sb3_ppg.common.cuda import fused_adam
from sb3_ppg.common.reward_normalization import RolloutRewardNormalizer

th.set_num_threads(1)

GLOBAL_ENVS = 4
N_STEPS = 8

# Equality scenarios: one policy minibatch per epoch (and one aux minibatch, or gradients accumulated over the whole
# aux buffer), so that each rank's minibatch is its share of the single process's: equality is then expected.
# aux_batch_rollouts is given in iterations (x n_envs rollouts of the rank)
EQUALITY_CONFIGS: dict[str, dict[str, Any]] = {
    "joint": dict(n_epochs=2, n_aux_epochs=2, aux_batch_rollouts=2, max_grad_norm=0.5, policy_kwargs=dict(net_arch=[16])),
    "value_epochs": dict(
        n_epochs=1,
        n_value_epochs=2,
        n_aux_epochs=2,
        aux_batch_rollouts=1,  # two aux minibatches, accumulated into one step
        n_aux_grad_accum=2,
        separate_aux_optimizer=False,
        # SGD: unlike Adam, its steps scale with the gradient (a sum instead of a mean over the ranks would show)
        learning_rate=0.05,
        policy_kwargs=dict(arch="detach", net_arch=[16], optimizer_class=th.optim.SGD),
    ),
    # Early stopping in both iterations (approx KL 10% above 1.5 * target_kl): every rank must stop at the same epoch
    "target_kl": dict(
        n_epochs=4,
        target_kl=1e-3,
        n_aux_epochs=1,
        aux_batch_rollouts=2,
        learning_rate=0.2,
        policy_kwargs=dict(net_arch=[16], optimizer_class=th.optim.SGD),
    ),
    # MaskablePPG: the synthetic rollouts come with masks (SyntheticRollout), the aux phase's KL is the masked one
    "maskable": dict(n_epochs=2, n_aux_epochs=2, aux_batch_rollouts=2, policy_kwargs=dict(net_arch=[16])),
    # The finite checks on the device (DeviceFiniteCheck, forced on the CPU's fused Adam): every step's flag all-reduced
    "device_check": dict(
        n_epochs=2,
        n_aux_epochs=2,
        aux_batch_rollouts=2,
        max_grad_norm=0.5,
        policy_kwargs=dict(net_arch=[16], optimizer_kwargs=dict(fused=True)),
    ),
}
# The scenarios whose finite checks run on the device (fused_adam.FINITE_CHECK_ON_DEVICE, set for their run only)
DEVICE_CHECK = ("device_check",)


def synthetic_rollout(rng: np.random.Generator, envs: slice) -> tuple[np.ndarray, ...]:
    """
    A rollout of all ``GLOBAL_ENVS`` envs drawn from ``rng`` (the same on every rank), this rank's ``envs`` of it:
    observations, actions, rewards, episode starts, the values after it and its dones.
    """
    observations = rng.normal(size=(N_STEPS, GLOBAL_ENVS, 4)).astype(np.float32)[:, envs]
    actions = rng.integers(0, 2, size=(N_STEPS, GLOBAL_ENVS, 1)).astype(np.float32)[:, envs]
    rewards = rng.normal(size=(N_STEPS, GLOBAL_ENVS)).astype(np.float32)[:, envs]
    starts = (rng.random((N_STEPS, GLOBAL_ENVS)) < 0.2).astype(np.float32)[:, envs]
    last_values = rng.normal(size=GLOBAL_ENVS).astype(np.float32)[envs]
    dones = (rng.random(GLOBAL_ENVS) < 0.2)[envs]
    return observations, actions, rewards, starts, last_values, dones


def synthetic_advantages(rng: np.random.Generator, envs: slice) -> np.ndarray:
    """Advantages of +-1 and one pair of +-7 over all envs (mean 0), drawn from ``rng``: this rank's ``envs`` of them."""
    ones = rng.permutation(np.repeat(np.array([1.0, -1.0], dtype=np.float32), N_STEPS * GLOBAL_ENVS // 2 - 1))
    advantages = np.concatenate([np.array([7.0, -7.0], dtype=np.float32), ones]).reshape(GLOBAL_ENVS, N_STEPS).T
    return advantages[:, envs]


class SyntheticRollout(BaseCallback):
    """
    Replaces each collected rollout by fixed data for ``GLOBAL_ENVS`` envs, of which this rank keeps its share (rank r:
    envs ``r * n_envs ...``), so that the ranks together hold exactly the single process's rollout.

    The advantages are +-1 and +-7 with mean 0 and standard deviation 2 over the whole rollout (not over a rank's
    share: the +-7 are in env 0), so that normalizing them is exact in float32: a single process (numpy's float32
    mean and std) and the ranks (float64 sums over all ranks) give the networks the same numbers. With other values
    the two normalizations differ in the last bit of float32, which Adam can amplify into a step of a learning rate.
    """

    def __init__(self) -> None:
        super().__init__()
        self.iteration = 0

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        n_envs = buffer.n_envs
        envs = slice(distributed.get_rank() * n_envs, (distributed.get_rank() + 1) * n_envs)
        rng = np.random.default_rng(100 + self.iteration)
        self.iteration += 1
        observations, actions, rewards, starts, last_values, dones = synthetic_rollout(rng, envs)
        buffer.observations[:] = observations
        buffer.actions[:] = actions
        buffer.rewards[:] = rewards
        buffer.episode_starts[:] = starts
        masks = {}
        if isinstance(self.model, MaskablePPG):
            # A third of the states allow only the action taken (drawn from a generator of their own: PPG's rollouts
            # stay those of earlier versions)
            mask_rng = np.random.default_rng(200 + self.iteration)
            only_taken = (mask_rng.random((N_STEPS, GLOBAL_ENVS)) < 1 / 3)[:, envs]
            taken = np.eye(2, dtype=np.float32)[actions[..., 0].astype(int)]
            buffer.action_masks[:] = np.where(only_taken[..., None], taken, 1.0)
            masks = dict(action_masks=th.as_tensor(buffer.action_masks.reshape(-1, 2)))
        with th.no_grad():
            values, log_prob, _ = self.model.policy.evaluate_actions(
                th.as_tensor(observations.reshape(-1, 4)), th.as_tensor(actions.reshape(-1)).long(), **masks
            )
        buffer.values[:] = values.reshape(N_STEPS, n_envs).numpy()
        buffer.log_probs[:] = log_prob.reshape(N_STEPS, n_envs).numpy()
        buffer.compute_returns_and_advantage(th.as_tensor(last_values), dones)
        buffer.advantages[:] = synthetic_advantages(rng, envs)


def allow_all(env: Any) -> np.ndarray:
    """Action masks that allow both CartPole actions."""
    return np.ones(2, dtype=bool)


def equality(config_name: str) -> dict[str, Any]:
    """Two iterations (one policy phase each, then an aux phase) on the synthetic rollouts."""
    config = dict(n_steps=N_STEPS, batch_size=None, n_policy_iters=2, **EQUALITY_CONFIGS[config_name])
    n_envs = distributed.local_n_envs(GLOBAL_ENVS)
    config["batch_size"] = N_STEPS * n_envs
    config["aux_batch_rollouts"] *= n_envs
    if config_name == "maskable":
        # The env's masks allow both actions: SyntheticRollout replaces them
        env = make_vec_env(
            "CartPole-v1", n_envs=n_envs, seed=0, wrapper_class=ActionMasker, wrapper_kwargs=dict(action_mask_fn=allow_all)
        )
        model: PPG = MaskablePPG("MlpPolicy", env, seed=0, **config)
    else:
        model = PPG("MlpPolicy", make_vec_env("CartPole-v1", n_envs=n_envs, seed=0), seed=0, **config)
    # In float64: the ranks' gradients are summed in another order than the single process's
    run_in_float64(model)
    initial = parameters(model)
    previous, fused_adam.FINITE_CHECK_ON_DEVICE = (
        fused_adam.FINITE_CHECK_ON_DEVICE,
        (True if config_name in DEVICE_CHECK else None),
    )
    try:
        model.learn(2 * N_STEPS * GLOBAL_ENVS, callback=SyntheticRollout())
    finally:
        fused_adam.FINITE_CHECK_ON_DEVICE = previous
    return dict(
        initial=initial,
        final=parameters(model),
        num_timesteps=model.num_timesteps,
        n_aux_phases=model.n_aux_phases,
        n_updates=model._n_updates,
    )


def nan_loss_on_one_rank() -> dict[str, Any]:
    """
    The "device_check" scenario with rank 1's first auxiliary loss NaN but its gradient finite: only rank 1 sees it,
    yet every rank must skip that step (the flag is all-reduced) and raise at the end of the phase.
    """
    model = PPG(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=distributed.local_n_envs(GLOBAL_ENVS), seed=0),
        seed=0,
        n_steps=N_STEPS,
        batch_size=N_STEPS * distributed.local_n_envs(GLOBAL_ENVS),
        n_policy_iters=2,
        **{**EQUALITY_CONFIGS["device_check"], "aux_batch_rollouts": 2 * distributed.local_n_envs(GLOBAL_ENVS)},
    )
    aux_loss = model._aux_loss
    calls = []

    def nan_valued_loss(batch):
        loss, diagnostics = aux_loss(batch)
        calls.append(1)
        if distributed.get_rank() == 1 and len(calls) == 1:
            loss = loss + float("nan") * loss.detach()
        return loss, diagnostics

    model._aux_loss = nan_valued_loss  # type: ignore[method-assign]
    fused_adam.FINITE_CHECK_ON_DEVICE = True
    try:
        model.learn(2 * N_STEPS * GLOBAL_ENVS, callback=SyntheticRollout())
        error = None
    except FloatingPointError as raised:
        error = str(raised)
    finally:
        fused_adam.FINITE_CHECK_ON_DEVICE = None
    adam = [state[key].clone() for state in model.aux_optimizer.state.values() for key in ("exp_avg", "exp_avg_sq", "step")]
    return dict(error=error, final=parameters(model), adam=adam, n_aux_calls=len(calls))


def end_to_end(out_dir: str) -> dict[str, Any]:
    """CartPole with reward normalization through an aux phase; rank 0 saves the model."""
    n_envs = distributed.local_n_envs(GLOBAL_ENVS)
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=n_envs, seed=0), norm_obs=False, gamma=0.99)
    model = small_ppg(env, batch_size=None, aux_batch_rollouts=2, tensorboard_log=os.path.join(out_dir, "tensorboard"))
    model.learn(4 * 16 * GLOBAL_ENVS, progress_bar=True)
    model.save(os.path.join(out_dir, f"model_rank{distributed.get_rank()}"))  # a no-op on rank 1
    return dict(
        final=parameters(model),
        num_timesteps=model.num_timesteps,
        n_aux_phases=model.n_aux_phases,
        ret_rms=(float(env.ret_rms.mean), float(env.ret_rms.var), float(env.ret_rms.count)),
        episodes=len(model.ep_info_buffer),
        local_rank=int(os.environ["LOCAL_RANK"]),
    )


def mismatch() -> dict[str, Any]:
    """Rank 1 uses another n_epochs: every rank must raise the same ValueError."""
    model = PPG("MlpPolicy", "CartPole-v1", n_steps=16, n_epochs=1 + int(os.environ["RANK"]), n_aux_epochs=0, seed=0)
    try:
        model.learn(64)
    except ValueError as error:
        return dict(error=str(error))
    return dict(error=None)


def env_mismatch() -> dict[str, Any]:
    """Rank 0 trains on CartPole-v1, rank 1 on CartPole-v0 (the same spaces): every rank must raise the same error."""
    env_id = "CartPole-v1" if distributed.get_rank() == 0 else "CartPole-v0"
    model = PPG("MlpPolicy", make_vec_env(env_id, n_envs=2, seed=0), n_steps=16, n_aux_epochs=0, seed=0)
    try:
        model.learn(64)
    except ValueError as error:
        return dict(error=str(error))
    return dict(error=None)


def resync() -> dict[str, Any]:
    """
    A second learn() after rank 1's parameters, Adam state and reward statistics were changed: every rank starts it
    from rank 0's. The learning rate is a lambda (each process has its own function object: compared by value).
    """
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=0), norm_obs=False)
    model = PPG("MlpPolicy", env, n_steps=16, learning_rate=lambda progress: 1e-3 * progress, n_aux_epochs=0, seed=0)
    model.learn(64)
    if distributed.get_rank() == 1:
        with th.no_grad():
            for parameter in model.policy.parameters():
                parameter.add_(1.0)
        for state in model.policy.optimizer.state.values():
            state["exp_avg"].add_(1.0)
        env.ret_rms.var = env.ret_rms.var * 10
    model.learn(64, reset_num_timesteps=False)
    adam = [state[key].clone() for state in model.policy.optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    return dict(final=parameters(model), adam=adam, ret_rms=(float(env.ret_rms.var), float(env.ret_rms.count)))


def dies(how: str, out_dir: str) -> dict[str, Any]:
    """
    After its first iteration, rank 1 dies ("dies") or stops answering ("stuck", after writing its pid to
    ``OUT_DIR/pid1``); rank 0 must stop with an error.
    """

    class Die(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:
            if distributed.get_rank() == 1 and self.model.num_timesteps > 0:
                if how == "dies":
                    os._exit(3)
                with open(os.path.join(out_dir, "pid1.tmp"), "w") as file:
                    file.write(str(os.getpid()))
                os.replace(os.path.join(out_dir, "pid1.tmp"), os.path.join(out_dir, "pid1"))
                time.sleep(600)

    model = PPG("MlpPolicy", "CartPole-v1", n_steps=16, n_aux_epochs=0, seed=0, policy_kwargs=dict(net_arch=[16]))
    start = time.monotonic()
    try:
        model.learn(10**6, callback=Die())
    except distributed.DistributedError as error:
        return dict(error=str(error), seconds=time.monotonic() - start)
    return dict(error=None)


# Checkpoint scenarios: 16 steps per iteration on each rank's 2 envs (64 global steps), an aux phase every 2 iterations
CHECKPOINT_STEPS = 16
CHECKPOINT_ITERATION = CHECKPOINT_STEPS * GLOBAL_ENVS
CHECKPOINT_TOTAL = 5 * CHECKPOINT_ITERATION
CHECKPOINT_CUT = 3 * CHECKPOINT_ITERATION  # one iteration in the aux buffer


def checkpoint_env(seed: int = 0) -> VecNormalize:
    return VecNormalize(make_vec_env("CartPole-v1", n_envs=distributed.local_n_envs(GLOBAL_ENVS), seed=seed), gamma=0.99)


def checkpoint_callback(folder: pathlib.Path, keep_last: int | None = None) -> PPGCheckpointCallback:
    return PPGCheckpointCallback(CHECKPOINT_STEPS, str(folder), name_prefix="ppg", keep_last=keep_last)


def checkpoint_train(out_dir: pathlib.Path) -> dict[str, Any]:
    """
    The uninterrupted run, a checkpoint every iteration (all kept, and the last two in ``pruned/``), after a learn()
    with a checkpoint callback on rank 0 only, which must fail on every rank.
    """
    settings = dict(n_steps=CHECKPOINT_STEPS, n_policy_iters=2, n_aux_epochs=1, aux_batch_rollouts=1, seed=0)
    model = PPG("MlpPolicy", checkpoint_env(), policy_kwargs=dict(net_arch=[16]), **settings)
    try:
        model.learn(
            CHECKPOINT_TOTAL, callback=checkpoint_callback(out_dir / "unused") if distributed.get_rank() == 0 else None
        )
        mismatch = None
    except ValueError as error:
        mismatch = str(error)
    model = PPG("MlpPolicy", checkpoint_env(), policy_kwargs=dict(net_arch=[16]), **settings)
    callbacks = [checkpoint_callback(out_dir / "checkpoints"), checkpoint_callback(out_dir / "pruned", keep_last=2)]
    model.learn(CHECKPOINT_TOTAL, callback=callbacks)
    return dict(final=parameters(model), num_timesteps=model.num_timesteps, n_aux_phases=model.n_aux_phases, mismatch=mismatch)


def checkpoint_resume(out_dir: pathlib.Path) -> dict[str, Any]:
    """
    Resume the run from its checkpoint at ``CHECKPOINT_CUT`` (with envs seeded otherwise: their states come from the
    checkpoint), then write a checkpoint where rank 1 cannot write (the test made its folder a file), load one whose
    rank-1 part the test damaged (by name, then its folder, which falls back to the previous one) and one written by a
    single process.
    """
    model = PPG.load_checkpoint(out_dir / "checkpoints" / f"ppg_{CHECKPOINT_CUT}_steps", env=checkpoint_env(seed=123))
    result: dict[str, Any] = dict(resumed_at=model.num_timesteps, aux_iterations=model.aux_buffer.n_iterations)
    callback = checkpoint_callback(out_dir / "resumed")
    model.learn(CHECKPOINT_TOTAL - model.num_timesteps, reset_num_timesteps=False, callback=callback)
    result.update(final=parameters(model), num_timesteps=model.num_timesteps, n_aux_phases=model.n_aux_phases)
    try:
        write_checkpoint(model, out_dir / "blocked" / "ppg_0_steps", out_dir / "blocked" / "ppg_rollouts")
        result["write_error"] = None
    except RuntimeError as error:
        result["write_error"] = str(error)
    for name, path in (("damaged", f"damaged/ppg_{CHECKPOINT_TOTAL}_steps"), ("single_process", "single_process")):
        start = time.monotonic()
        try:
            PPG.load_checkpoint(out_dir / path, env=checkpoint_env())
            result[name] = None
        except Exception as error:
            result[name] = dict(type=type(error).__name__, message=str(error), seconds=time.monotonic() - start)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        model = PPG.load_checkpoint(out_dir / "damaged", env=checkpoint_env())
    result["damaged_folder"] = dict(num_timesteps=model.num_timesteps, warnings=[str(w.message) for w in warned])
    return result


#: The reward normalizer of the "reward_normalization" scenario (a small clip: some rewards are clipped)
REWARD_NORMALIZER_KWARGS = dict(gamma=0.9, clip_reward=3.0)


def reward_rollout(rank: int, iteration: int) -> tuple[np.ndarray, np.ndarray]:
    """A rank's synthetic rollout of 5 steps x 2 envs: rewards (on another scale per rank) and episode starts."""
    rng = np.random.default_rng(10 * iteration + rank)
    return rng.normal(size=(5, 2)) * (1 + 3 * rank), (rng.random((5, 2)) < 0.3).astype(np.float64)


class StopOnRank1(BaseCallback):
    """Stops ``learn()`` on rank 1 at its ``step``-th step (inside a rollout)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def _on_step(self) -> bool:
        return not (distributed.get_rank() == 1 and self.n_calls == self.step)


def reward_normalization() -> dict[str, Any]:
    """
    The ranks' ``RolloutRewardNormalizer`` over 3 synthetic rollouts, then a 4th that rank 1 stops before its end; then
    a PPG run with ``normalize_reward`` that rank 1 stops inside its third rollout.
    """
    assert distributed.init_if_launched()  # PPG would start the process group; the normalizer alone does not
    rank = distributed.get_rank()
    normalizer = RolloutRewardNormalizer(2, **REWARD_NORMALIZER_KWARGS)
    result: dict[str, Any] = {"normalized": [], "statistics": []}
    for iteration in range(3):
        result["normalized"].append(normalizer.normalize(*reward_rollout(rank, iteration)))
        result["statistics"].append(np.array([normalizer.mean, normalizer.var, normalizer.count]))
    rewards, starts = reward_rollout(rank, 3)
    if rank == 1:
        normalizer.skip_rollout()
    else:
        result["stopped_rewards"], result["raw_stopped_rewards"] = normalizer.normalize(rewards, starts), rewards
    result["statistics_after_stop"] = np.array([normalizer.mean, normalizer.var, normalizer.count])
    model = small_ppg("CartPole-v1", n_envs=2, seed=0, n_steps=N_STEPS, batch_size=N_STEPS, normalize_reward=True)
    if rank == 1:  # learn() starts every rank from rank 0's statistics (as from its parameters)
        model.reward_normalizer.mean, model.reward_normalizer.var = 5.0, 7.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer steps than an auxiliary phase
        model.learn(4 * 2 * 2 * N_STEPS, callback=StopOnRank1(2 * N_STEPS + 3))
    ppg_normalizer = model.reward_normalizer
    result["ppg_statistics"] = np.array([ppg_normalizer.mean, ppg_normalizer.var, ppg_normalizer.count])
    result["ppg_running_return"] = ppg_normalizer.running_return.copy()
    result["ppg_timesteps"] = model.num_timesteps
    return result


def main() -> None:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    if scenario == "end_to_end":
        result = end_to_end(out_dir)
    elif scenario in ("dies", "stuck"):
        result = dies(scenario, out_dir)
    elif scenario == "checkpoint_train":
        result = checkpoint_train(pathlib.Path(out_dir))
    elif scenario == "checkpoint_resume":
        result = checkpoint_resume(pathlib.Path(out_dir))
    elif scenario == "reward_normalization":
        result = reward_normalization()
    elif scenario == "equality":  # and then the mismatch, in the same processes (starting them takes seconds)
        result = {name: equality(name) for name in EQUALITY_CONFIGS}
        result["nan_loss_on_one_rank"] = nan_loss_on_one_rank()
        result["mismatch"] = mismatch()
        result["env_mismatch"] = env_mismatch()
        result["resync"] = resync()
    else:
        raise ValueError(scenario)
    th.save(result, os.path.join(out_dir, f"rank{distributed.get_rank()}.pt"))


if __name__ == "__main__":
    main()
