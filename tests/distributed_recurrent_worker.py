"""
The RecurrentPPG training runs of tests/test_distributed_recurrent.py, one per process:
``python tests/distributed_recurrent_worker.py SCENARIO OUT_DIR`` with torchrun's environment variables (or none, for
the single-process reference). Each rank writes what the test checks to ``OUT_DIR/rank<r>.pt``.
"""

import os
import pathlib
import sys
from typing import Any

import numpy as np
import torch as th
from distributed_worker import GLOBAL_ENVS, N_STEPS, synthetic_advantages, synthetic_rollout  # the same synthetic data
from double_precision import run_in_float64  # tests/ is on sys.path: this script's folder, or added by the test
from helpers import parameters
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPGCheckpointCallback, RecurrentPPG
from sb3_ppg.common import distributed
from sb3_ppg.common.recurrent.buffers import unstack_states

th.set_num_threads(1)

LSTM = dict(lstm_hidden_size=8, net_arch=[16])

# Equality scenarios: one policy minibatch of whole env sequences per epoch (the rank's envs, the single process's
# four) and one aux minibatch per optimizer step, so that each rank's minibatch is its share of the single process's.
# aux_batch_rollouts is given in iterations (x n_envs rollouts of the rank)
EQUALITY_CONFIGS: dict[str, dict[str, Any]] = {
    "stored": dict(
        aux_start_states="stored",
        n_epochs=2,
        n_aux_epochs=2,
        aux_batch_rollouts=2,
        max_grad_norm=0.5,
        policy_kwargs=LSTM,
    ),
    "recomputed": dict(
        aux_start_states="recomputed",
        n_epochs=1,
        n_value_epochs=2,
        n_aux_epochs=2,
        aux_batch_rollouts=1,  # two aux minibatches, accumulated into one step
        n_aux_grad_accum=2,
        separate_aux_optimizer=False,
        # SGD: its steps scale with the gradient (a sum instead of a mean over the ranks would show)
        learning_rate=0.05,
        policy_kwargs=dict(LSTM, optimizer_class=th.optim.SGD),
    ),
    # Early stopping in both iterations (5 of 8 epochs run): every rank must stop at the same epoch (the ranks' mean approx KL)
    "target_kl": dict(
        n_epochs=4,
        target_kl=1e-3,
        n_aux_epochs=1,
        aux_batch_rollouts=2,
        learning_rate=0.5,
        policy_kwargs=dict(LSTM, optimizer_class=th.optim.SGD),
    ),
    # One network with one LSTM (shared_lstm), the value head detached from it in the policy phase
    "shared_lstm": dict(
        aux_start_states="recomputed",
        n_epochs=2,
        n_aux_epochs=1,
        aux_batch_rollouts=2,
        policy_kwargs=dict(LSTM, shared_lstm=True),
    ),
}


class SyntheticSequences(BaseCallback):
    """
    Replaces each collected rollout by fixed sequences of ``GLOBAL_ENVS`` envs (observations, actions, rewards, episode
    starts inside them and the LSTM states at their start), of which this rank keeps its share (rank r: envs
    ``r * n_envs ...``), so that the ranks together hold exactly the single process's rollout. The values and
    log-probabilities are the current networks', over each env's sequence from its start states.

    The advantages are +-1 and +-7 with mean 0 and standard deviation 2 over the whole rollout, so that normalizing
    them is exact in float32 on one process and over the ranks (as in distributed_worker.SyntheticRollout).
    """

    def __init__(self) -> None:
        super().__init__()
        self.iteration = 0

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        model: RecurrentPPG = self.model  # type: ignore[assignment]
        buffer = model.rollout_buffer
        n_envs = buffer.n_envs
        envs = slice(distributed.get_rank() * n_envs, (distributed.get_rank() + 1) * n_envs)
        rng = np.random.default_rng(300 + self.iteration)
        self.iteration += 1
        observations, actions, rewards, starts, last_values, dones = synthetic_rollout(rng, envs)
        state_shape = (4, model.policy.n_lstm_layers, GLOBAL_ENVS, model.policy.lstm_hidden_size)
        start_states = (0.5 * rng.normal(size=state_shape)).astype(np.float32)[:, :, envs]
        buffer.observations[:] = observations
        buffer.actions[:] = actions
        buffer.rewards[:] = rewards
        buffer.episode_starts[:] = starts
        buffer.lstm_start_states = start_states.astype(buffer.lstm_start_states.dtype)
        with th.no_grad():  # env-major sequences, as the policy phase's minibatches
            values, log_prob, _ = model.policy.evaluate_actions(
                th.as_tensor(observations.transpose(1, 0, 2).reshape(-1, 4)),
                th.as_tensor(actions.transpose(1, 0, 2).reshape(-1)).long(),
                unstack_states(th.as_tensor(buffer.lstm_start_states)),
                th.as_tensor(starts.T.copy()),
            )
        buffer.values[:] = values.reshape(n_envs, N_STEPS).T.numpy()
        buffer.log_probs[:] = log_prob.reshape(n_envs, N_STEPS).T.numpy()
        buffer.compute_returns_and_advantage(th.as_tensor(last_values), dones)
        buffer.advantages[:] = synthetic_advantages(rng, envs)


def equality(config_name: str) -> dict[str, Any]:
    """Two iterations (one policy phase each, then an aux phase) on the synthetic sequences, in float64."""
    config = dict(n_steps=N_STEPS, n_policy_iters=2, **EQUALITY_CONFIGS[config_name])
    n_envs = distributed.local_n_envs(GLOBAL_ENVS)
    config["batch_size"] = N_STEPS * n_envs
    config["aux_batch_rollouts"] *= n_envs
    model = RecurrentPPG("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=n_envs, seed=0), seed=0, **config)
    # In float64: the ranks' gradients are summed in another order than the single process's. The aux buffer keeps
    # its start states in float32 for float32 networks: here in float64, which the LSTMs take
    run_in_float64(model)
    assert model.aux_buffer is not None
    model.aux_buffer.lstm_start_states = model.aux_buffer.lstm_start_states.to(th.float64)
    initial = parameters(model)
    model.learn(2 * N_STEPS * GLOBAL_ENVS, callback=SyntheticSequences())
    assert model.aux_buffer is not None
    return dict(
        initial=initial,
        final=parameters(model),
        num_timesteps=model.num_timesteps,
        n_aux_phases=model.n_aux_phases,
        n_updates=model._n_updates,
        # Each stored rollout's start states (recomputed ones with aux_start_states="recomputed"), by iteration
        aux_start_states=model.aux_buffer.lstm_start_states.cpu()
        .numpy()
        .reshape(2, n_envs, *model.aux_buffer.lstm_start_states.shape[1:]),
    )


# Checkpoint scenarios: 16 steps per iteration on each rank's 2 envs (64 global steps), an aux phase every 2 iterations
CHECKPOINT_STEPS = 16
CHECKPOINT_ITERATION = CHECKPOINT_STEPS * GLOBAL_ENVS
CHECKPOINT_TOTAL = 5 * CHECKPOINT_ITERATION
CHECKPOINT_CUT = 3 * CHECKPOINT_ITERATION  # one iteration in the aux buffer
CHECKPOINT_SETTINGS = dict(
    n_steps=CHECKPOINT_STEPS,
    batch_size=CHECKPOINT_STEPS,
    n_policy_iters=2,
    n_aux_epochs=1,
    aux_batch_rollouts=1,
    aux_start_states="recomputed",
    policy_kwargs=LSTM,
)


def checkpoint_callback(folder: pathlib.Path) -> PPGCheckpointCallback:
    return PPGCheckpointCallback(CHECKPOINT_STEPS, str(folder), name_prefix="rppg")


def lstm_states(model: RecurrentPPG) -> list[th.Tensor]:
    assert model._last_lstm_states is not None
    return [state.clone() for pair in model._last_lstm_states for state in pair]


def checkpoint_train(out_dir: pathlib.Path) -> dict[str, Any]:
    """The uninterrupted run on CartPole, a checkpoint every iteration."""
    env = make_vec_env("CartPole-v1", n_envs=distributed.local_n_envs(GLOBAL_ENVS), seed=0)
    model = RecurrentPPG("MlpLstmPolicy", env, seed=0, **CHECKPOINT_SETTINGS)
    model.learn(CHECKPOINT_TOTAL, callback=checkpoint_callback(out_dir / "checkpoints"))
    return dict(
        final=parameters(model),
        lstm_states=lstm_states(model),
        num_timesteps=model.num_timesteps,
        n_aux_phases=model.n_aux_phases,
    )


def checkpoint_resume(out_dir: pathlib.Path) -> dict[str, Any]:
    """Resume the run from its checkpoint at ``CHECKPOINT_CUT`` (envs seeded otherwise: their states are restored)."""
    env = make_vec_env("CartPole-v1", n_envs=distributed.local_n_envs(GLOBAL_ENVS), seed=123)
    model = RecurrentPPG.load_checkpoint(out_dir / "checkpoints" / f"rppg_{CHECKPOINT_CUT}_steps", env=env)
    result: dict[str, Any] = dict(resumed_at=model.num_timesteps, resumed_lstm_states=lstm_states(model))
    model.learn(CHECKPOINT_TOTAL - model.num_timesteps, reset_num_timesteps=False)
    result.update(
        final=parameters(model),
        lstm_states=lstm_states(model),
        num_timesteps=model.num_timesteps,
        n_aux_phases=model.n_aux_phases,
    )
    return result


def main() -> None:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    if scenario == "train":  # the equality scenarios, then the checkpointed run (starting processes takes seconds)
        result = {name: equality(name) for name in EQUALITY_CONFIGS}
        result["checkpoint_train"] = checkpoint_train(pathlib.Path(out_dir))
    elif scenario == "checkpoint_resume":
        result = checkpoint_resume(pathlib.Path(out_dir))
    else:
        raise ValueError(scenario)
    th.save(result, os.path.join(out_dir, f"rank{distributed.get_rank()}.pt"))


if __name__ == "__main__":
    main()
