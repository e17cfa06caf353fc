"""
Data-parallel training's hooks that ``PPG`` calls when :func:`sb3_ppg.common.distributed.is_active`: the start of
``learn()``, the callback wrappers and the rollout-end merges (see docs/scaling_out.md).
"""

import inspect
import re
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import stable_baselines3
import torch as th
import torch.distributed as dist
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ConvertCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize

from sb3_ppg.common.callbacks import rollout_boundary_callbacks
from sb3_ppg.common.distributed import (
    RunningStats,
    all_gather_object,
    broadcast_object,
    broadcast_tensors,
    get_rank,
    get_world_size,
    merge_running_stats,
)
from sb3_ppg.common.progress_bar import PPGProgressBarCallback


def _running_stats(vec_normalize: VecNormalize) -> dict[str, RunningMeanStd]:
    """The running statistics a VecNormalize updates: the returns' and the normalized observations'."""
    stats: dict[str, RunningMeanStd] = {}
    if vec_normalize.norm_reward:
        stats["ret_rms"] = vec_normalize.ret_rms
    if vec_normalize.norm_obs:
        if isinstance(vec_normalize.obs_rms, dict):
            stats.update({f"obs_rms/{key}": rms for key, rms in vec_normalize.obs_rms.items()})
        else:
            stats["obs_rms"] = vec_normalize.obs_rms
    return stats


def _read_stats(vec_normalize: VecNormalize | None) -> dict[str, RunningStats]:
    if vec_normalize is None:
        return {}
    return {
        name: (np.array(rms.mean, dtype=np.float64), np.array(rms.var, dtype=np.float64), float(rms.count))
        for name, rms in _running_stats(vec_normalize).items()
    }


def _write_stats(vec_normalize: VecNormalize | None, values: dict[str, RunningStats]) -> None:
    if vec_normalize is None:
        return
    for name, rms in _running_stats(vec_normalize).items():
        mean, var, count = values[name]
        rms.mean, rms.var, rms.count = np.array(mean, dtype=np.float64), np.array(var, dtype=np.float64), count


# Constructor arguments that may differ between ranks
_PER_RANK_ARGUMENTS = {"self", "policy", "env", "seed", "verbose", "tensorboard_log", "device", "_init_setup_model"}


def _stable_repr(value: Any) -> str:
    """A representation that is the same in every process for equal settings (schedules by their values)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {_stable_repr(item)}" for key, item in sorted(value.items(), key=str)) + "}"
    if callable(value) and not isinstance(value, type):
        try:
            return "schedule" + repr([float(value(progress)) for progress in (1.0, 0.75, 0.5, 0.25, 0.0)])
        except Exception:
            return getattr(value, "__qualname__", type(value).__qualname__)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def constructor_arguments(algorithm: type[OnPolicyAlgorithm]) -> list[str]:
    """
    The named arguments of an algorithm's constructor and of the constructors it passes its ``**kwargs`` to
    (``RecurrentPPG``'s, then ``PPG``'s), down to the first one of Stable-Baselines3.
    """
    names: list[str] = []
    for cls in algorithm.__mro__:
        init = vars(cls).get("__init__")
        if init is None:
            continue
        if cls.__module__.startswith("stable_baselines3") and names:
            break  # an SB3 base class: the algorithm's own constructor names what it passes on
        parameters = list(inspect.signature(init).parameters.values())
        names.extend(p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in names)
        if all(p.kind != p.VAR_KEYWORD for p in parameters):
            break
    return names


def fingerprint(
    model: OnPolicyAlgorithm,
    optimizers: list[th.optim.Optimizer],
    aux_buffer_rollouts: int | None,
    total_timesteps: int,
    reset_num_timesteps: bool,
    callback: MaybeCallback = None,
) -> dict[str, str]:
    """
    What must be equal on every rank for the ranks to run identical updates and the same collectives.

    :param aux_buffer_rollouts: the rollouts in the auxiliary buffer (None: it has none)
    :return: a description of each setting, by name
    """
    hyperparameters = [name for name in constructor_arguments(type(model)) if name not in _PER_RANK_ARGUMENTS]
    values: dict[str, Any] = {name: getattr(model, name) for name in hyperparameters if hasattr(model, name)}
    values.update(
        algorithm=type(model).__qualname__,
        policy_class=model.policy_class.__qualname__,
        observation_space=model.observation_space,
        action_space=model.action_space,
        env_ids=env_ids(model.env) if model.env is not None else None,
        n_envs=model.n_envs,
        batch_size=model.batch_size,
        parameters=[(name, tuple(tensor.shape), str(tensor.dtype)) for name, tensor in model.policy.state_dict().items()],
        optimizers=[_optimizer_layout(optimizer) for optimizer in optimizers],
        aux_buffer_rollouts=aux_buffer_rollouts,
        vec_normalize=_vec_normalize_settings(model.get_vec_normalize_env()),
        total_timesteps=total_timesteps,
        boundary_callbacks=_boundary_callbacks(callback),
        start_timesteps=0 if reset_num_timesteps else model.num_timesteps,
        device_type=model.device.type,
        versions=(stable_baselines3.__version__, th.__version__),
    )
    return {name: _stable_repr(value) for name, value in values.items()}


def env_ids(venv: VecEnv) -> list[str]:
    """The ids of a VecEnv's envs (``spec.id``, a native Procgen env's game, else the class), compared across ranks."""
    base = venv.unwrapped  # the innermost VecEnv, under every VecEnvWrapper
    get_env_settings = getattr(base, "get_env_settings", None)
    if callable(get_env_settings):
        return [f"procgen/{get_env_settings().get('env_name')}"] * base.num_envs
    if isinstance(base, DummyVecEnv):
        specs = [env.spec for env in base.envs]
        classes = [type(env.unwrapped).__qualname__ for env in base.envs]
    else:
        try:
            specs = base.get_attr("spec")
        except Exception:  # a VecEnv of another kind
            return [type(base).__qualname__] * base.num_envs
        classes = [type(base).__qualname__] * base.num_envs
    return [spec.id if spec is not None else name for spec, name in zip(specs, classes, strict=True)]


def _boundary_callbacks(callback: MaybeCallback) -> list[tuple[Any, ...]]:
    """The callbacks told of rollout boundaries (``PPGCheckpointCallback``), with their settings."""
    found = []
    for item in callback if isinstance(callback, list) else [callback]:
        for child in rollout_boundary_callbacks(item if isinstance(item, BaseCallback) else None):
            settings = (getattr(child, name, None) for name in ("save_freq", "save_path", "name_prefix"))
            found.append((type(child).__qualname__, *settings))
    return found


def _vec_normalize_settings(vec_normalize: VecNormalize | None) -> Any:
    if vec_normalize is None:
        return None
    settings: dict[str, Any] = {
        name: getattr(vec_normalize, name)
        for name in ("norm_obs", "norm_reward", "training", "gamma", "clip_obs", "clip_reward")
    }
    settings["stats"] = {name: (np.shape(rms.mean),) for name, rms in _running_stats(vec_normalize).items()}
    return settings


def _optimizer_state_tensors(optimizer: th.optim.Optimizer) -> list[th.Tensor]:
    tensors = []
    for index in sorted(optimizer.state_dict()["state"]):
        state = optimizer.state_dict()["state"][index]
        tensors.extend(state[key] for key in sorted(state) if isinstance(state[key], th.Tensor))
    return tensors


def _optimizer_layout(optimizer: th.optim.Optimizer) -> Any:
    return type(optimizer).__qualname__, [(tuple(t.shape), str(t.dtype)) for t in _optimizer_state_tensors(optimizer)]


def check_consistency(fingerprint_of_rank: dict[str, str]) -> None:
    """
    Gather every rank's :func:`fingerprint` and raise the same ``ValueError`` on every rank when they differ.

    :param fingerprint_of_rank: this rank's fingerprint
    """
    fingerprints = all_gather_object(fingerprint_of_rank)
    reference = fingerprints[0]
    differences = []
    for rank, other in enumerate(fingerprints[1:], start=1):
        for name in sorted(set(reference) | set(other)):
            if reference.get(name) != other.get(name):
                differences.append(f"  {name}: rank 0 has {reference.get(name)}, rank {rank} has {other.get(name)}")
    if differences:
        raise ValueError(
            "Data-parallel PPG: the ranks disagree on settings that must be the same on every rank (every rank needs "
            "the same hyperparameters, envs, spaces, number of envs, learn() arguments, checkpoint callbacks and model "
            "state):\n" + "\n".join(differences)
        )


def broadcast_training_state(model: OnPolicyAlgorithm, optimizers: list[th.optim.Optimizer]) -> dict[str, RunningStats]:
    """
    Give every rank rank 0's parameters, optimizer states, VecNormalize statistics (returned) and ``normalize_reward``
    statistics (not the running returns: those of each rank's own envs).
    """
    tensors = list(model.policy.state_dict().values())
    for optimizer in optimizers:
        tensors.extend(_optimizer_state_tensors(optimizer))
    broadcast_tensors(tensors)
    vec_normalize = model.get_vec_normalize_env()
    stats = broadcast_object(_read_stats(vec_normalize))
    _write_stats(vec_normalize, stats)
    reward_normalizer = getattr(model, "reward_normalizer", None)
    if reward_normalizer is not None:
        statistics = (reward_normalizer.mean, reward_normalizer.var, reward_normalizer.count)
        reward_normalizer.mean, reward_normalizer.var, reward_normalizer.count = broadcast_object(statistics)
    return stats


def prepare_learn(
    model: OnPolicyAlgorithm, optimizers: list[th.optim.Optimizer], fingerprint_of_rank: dict[str, str]
) -> dict[str, RunningStats]:
    """
    At the start of ``learn()``: check that the ranks agree, give them rank 0's state, silence every rank's logger but 0's.

    :return: the VecNormalize statistics every rank starts from
    """
    check_consistency(fingerprint_of_rank)
    if dist.get_backend() == "nccl" and model.device.type != "cuda":
        raise ValueError("Data-parallel PPG with the NCCL backend needs the model on a GPU (device='auto' or 'cuda').")
    stats = broadcast_training_state(model, optimizers)
    if get_rank() != 0:
        model.set_logger(Logger(folder=None, output_formats=[]))
    return stats


class GlobalTimestepsCallback(BaseCallback):
    """Counts every rank's env steps in ``num_timesteps``: SB3 adds this rank's, this adds the other ranks'."""

    def _on_step(self) -> bool:
        self.model.num_timesteps += (get_world_size() - 1) * self.training_env.num_envs
        return True


class GlobalProgressBarCallback(PPGProgressBarCallback):
    """PPG's progress bar on rank 0, advanced by the env steps of all ranks (as :class:`PPGProgressBarCallback`)."""


def wrap_callback(callback: MaybeCallback, progress_bar: bool) -> CallbackList:
    """The callbacks of a data-parallel ``learn()``: the global step counter first, the progress bar on rank 0 only."""
    callbacks: list[BaseCallback] = [GlobalTimestepsCallback()]
    if isinstance(callback, list):
        callbacks.extend(callback)
    elif isinstance(callback, BaseCallback):
        callbacks.append(callback)
    elif callback is not None:
        callbacks.append(ConvertCallback(callback))
    if progress_bar and get_rank() == 0:
        callbacks.append(GlobalProgressBarCallback())
    return CallbackList(callbacks)


def collect_rollouts(
    model: OnPolicyAlgorithm, collect: Callable[[], bool], stats_base: dict[str, RunningStats]
) -> tuple[bool, dict[str, RunningStats]]:
    """
    Run ``collect`` (SB3's rollout collection on this rank), then :func:`finish_rollout`.

    :return: whether every rank collected a full rollout, and the merged VecNormalize statistics
    """
    start = model.num_timesteps
    episodes, successes = model.ep_info_buffer, model.ep_success_buffer
    model.ep_info_buffer, model.ep_success_buffer = deque(maxlen=episodes.maxlen), deque(maxlen=successes.maxlen)
    try:
        complete = collect()
    finally:
        new_episodes, new_successes = list(model.ep_info_buffer), list(model.ep_success_buffer)
        model.ep_info_buffer, model.ep_success_buffer = episodes, successes
    reward_normalizer = getattr(model, "reward_normalizer", None)
    if not complete and reward_normalizer is not None:
        # Stopped before the rollout's end, where the other ranks reduce their reward statistics: take part
        reward_normalizer.skip_rollout()
    return finish_rollout(model, complete, start, new_episodes, new_successes, stats_base)


def finish_rollout(
    model: OnPolicyAlgorithm,
    complete: bool,
    start_timesteps: int,
    new_episodes: list[Any],
    new_successes: list[Any],
    stats_base: dict[str, RunningStats],
) -> tuple[bool, dict[str, RunningStats]]:
    """
    Share the rollout's outcome: the total ``num_timesteps``, every rank's new episodes, the merged VecNormalize
    statistics, and a stop on every rank when one stopped.

    :return: whether every rank collected a full rollout, and the merged VecNormalize statistics
    """
    vec_normalize = model.get_vec_normalize_env()
    world_size = get_world_size()
    payload = dict(
        complete=complete,
        # GlobalTimestepsCallback counted world_size * n_envs per step of this rank
        steps=(model.num_timesteps - start_timesteps) // world_size,
        episodes=new_episodes,
        successes=new_successes,
        stats=_read_stats(vec_normalize),
    )
    gathered = all_gather_object(payload)
    model.num_timesteps = start_timesteps + sum(item["steps"] for item in gathered)
    for item in gathered:
        model.ep_info_buffer.extend(item["episodes"])
        model.ep_success_buffer.extend(item["successes"])
    merged = {name: merge_running_stats(base, [item["stats"][name] for item in gathered]) for name, base in stats_base.items()}
    _write_stats(vec_normalize, merged)
    return all(item["complete"] for item in gathered), merged
